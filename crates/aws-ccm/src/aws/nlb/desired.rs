//! NLB, pure half: the desired state from a Service spec (annotations,
//! cloud.conf and the environment the sync found). [`super::plan`] takes
//! what AWS reports to it.

use std::collections::{BTreeMap, BTreeSet};

use super::plan::listener_attributes_record;
use super::{
    ATTR_ACCESS_LOGS, ATTR_ACCESS_LOGS_BUCKET, ATTR_ACCESS_LOGS_PREFIX, ATTR_CROSS_ZONE,
    ATTR_DELETION_PROTECTION, Alpn, Desired, HealthCheck, HealthTimeout, Listener,
    ListenerAttributes, SubnetMapping, TargetGroup, ip_protocols, mtu_rule, port_rule,
    target_group_name,
};
use crate::aws::annotations::{self, BackendProtocol, HealthCheckPort, LoadBalancerSpec};
use crate::aws::applied::Applied;
use crate::aws::elb::{Environment, GroupRef, OwnedGroup, load_balancer_name};
use crate::aws::security_groups::Rule;
use crate::aws::tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode, NlbSecurityGroupMode};

/// Upstream's `buildNLBHealthCheckConfiguration` (the timeout, which upstream
/// never sends, is `desired`'s, behind cloud.conf `NLBListenerSettings`).
pub(crate) fn health_check(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> HealthCheck {
    let mut hc = match spec.local_health_check_node_port {
        Some(port) => HealthCheck {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: Some("/healthz".into()),
            interval: 10,
            healthy: 2,
            unhealthy: 2,
            timeout: None,
        },
        None => HealthCheck {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: Some("/".into()),
            interval: 30,
            healthy: 3,
            unhealthy: 3,
            timeout: None,
        },
    };
    let o = &spec.health_check;
    if let Some(p) = &o.protocol {
        hc.protocol = p.clone();
    }
    if hc.protocol == "TCP" {
        hc.path = None;
    } else if let Some(p) = &o.path {
        hc.path = Some(p.clone());
    }
    match o.port {
        Some(HealthCheckPort::Port(p)) => hc.port = p.to_string(),
        Some(HealthCheckPort::TrafficPort) => hc.port = "traffic-port".into(),
        None => {}
    }
    if cloud.health_probe_mode == HealthProbeMode::Shared
        && spec.local_health_check_node_port.is_none()
    {
        hc.protocol = "HTTP".into();
        hc.port = cloud.shared_health_probe_port.to_string();
        hc.path = Some(cloud.shared_health_probe_path.clone());
    }
    hc.interval = o.interval.unwrap_or(hc.interval);
    hc.healthy = o.healthy_threshold.unwrap_or(hc.healthy);
    hc.unhealthy = o.unhealthy_threshold.unwrap_or(hc.unhealthy);
    hc
}

/// The health-check timeout this CCM manages: only with cloud.conf
/// `NLBListenerSettings = true` (the Go CCM parses the annotation for an
/// NLB but never sends it). AWS takes a timeout up to the interval; a
/// larger one is not sent and the timeout is left as it is (the reading
/// warns of it: `LoadBalancerSpec::read_with`).
fn health_timeout(
    spec: &LoadBalancerSpec,
    cloud: &CloudConfig,
    interval: i32,
) -> Option<HealthTimeout> {
    if !cloud.nlb_listener_settings {
        return None;
    }
    match spec.health_check.timeout {
        Some(t) if t > interval => None,
        want => Some(HealthTimeout { want }),
    }
}

/// Whether the Service's NLB has a TLS listener.
pub(crate) fn has_tls_listener(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> bool {
    listeners_of(spec, cloud)
        .iter()
        .any(|l| l.protocol == "TLS")
}

/// The Service's NLB listeners as [`desired`] makes them (none where it
/// cannot).
pub(crate) fn listeners_of(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> Vec<Listener> {
    listeners(spec, "", "", &health_check(spec, cloud)).map_or_else(|_| Vec::new(), |(l, _)| l)
}

/// The ALPN policy this CCM manages on the TLS listeners: only with
/// cloud.conf `NLBListenerSettings = true` (the Go CCM does not read the
/// annotation). A policy AWS would refuse (not one of its names, or no TLS
/// listener to take it) is not sent and the listeners' policy is left as
/// it is (the reading warns of it: `LoadBalancerSpec::read_with`).
fn alpn(spec: &LoadBalancerSpec, cloud: &CloudConfig, listeners: &[Listener]) -> Option<Alpn> {
    if !cloud.nlb_listener_settings {
        return None;
    }
    let tls = listeners.iter().any(|l| l.protocol == "TLS");
    match &spec.alpn_policy {
        Some(p) if !tls || !super::ALPN_POLICIES.contains(&p.as_str()) => None,
        want => Some(Alpn { want: want.clone() }),
    }
}

/// Why AWS would refuse one `listener-attributes.<PROTO>-<port>`
/// annotation: what the reading says, the fix, and the port of the NLB's
/// listener it is for (whose attributes are then left as they are).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListenerAttributesRefused {
    pub(crate) reading: String,
    pub(crate) fix: String,
    port: Option<i32>,
}

/// One `listener-attributes.<PROTO>-<port>` annotation as AWS would take
/// it: the listener's port and attributes, or why AWS would refuse it.
type ListenerAttributeSetting = Result<(i32, BTreeMap<String, String>), ListenerAttributesRefused>;

/// Each `listener-attributes.<PROTO>-<port>` annotation (by its key's
/// suffix) as AWS would take it. AWS takes `tcp.idle_timeout.seconds` (60
/// to 6000) on an NLB's TCP listeners only, and this CCM records what it
/// applied in one tag value (256 characters).
pub(crate) fn listener_attribute_settings(
    spec: &LoadBalancerSpec,
    listeners: &[Listener],
) -> Vec<(String, ListenerAttributeSetting)> {
    let mut record_len = 0;
    let mut out = Vec::new();
    for (suffix, value) in &spec.listener_attributes {
        let refused = |port, reading: String, fix: &str| ListenerAttributesRefused {
            reading,
            fix: fix.to_string(),
            port,
        };
        let named = suffix
            .rsplit_once('-')
            .and_then(|(proto, port)| Some((proto, port.parse::<i32>().ok()?)));
        let Some((proto, port)) = named else {
            let reading = format!("`{suffix}` names no listener: not sent");
            let fix = "name the listener as <protocol>-<port>, e.g. ...listener-attributes.TCP-80";
            out.push((suffix.clone(), Err(refused(None, reading, fix))));
            continue;
        };
        let Some(listener) =
            (listeners.iter()).find(|l| l.port == port && l.protocol.eq_ignore_ascii_case(proto))
        else {
            let reading = format!("the NLB has no {proto} listener on port {port}: not sent");
            let fix = "name a listener of the Service's ports as <protocol>-<port>";
            out.push((suffix.clone(), Err(refused(None, reading, fix))));
            continue;
        };
        let setting = if listener.protocol == "TCP" {
            parse_listener_attributes(value)
        } else {
            Err((
                format!(
                    "AWS takes listener attributes on an NLB's TCP listeners only (a {} listener's idle timeout is fixed): not sent",
                    listener.protocol
                ),
                "remove it, or serve the port over TCP".to_string(),
            ))
        };
        let setting = setting.and_then(|attrs| {
            let piece = listener_attributes_record(&BTreeMap::from([(port, attrs.clone())]));
            let after = record_len + piece.len() + usize::from(record_len > 0);
            if after > tags::MAX_TAG_VALUE {
                return Err((
                    "more listener attributes than this CCM can record in one tag (256 characters): not sent".to_string(),
                    "set them on fewer listeners".to_string(),
                ));
            }
            record_len = after;
            Ok((port, attrs))
        });
        let setting = setting.map_err(|(reading, fix)| refused(Some(port), reading, &fix));
        out.push((suffix.clone(), setting));
    }
    out
}

/// `key=value,...` as AWS would take it on an NLB's TCP listener.
fn parse_listener_attributes(value: &str) -> Result<BTreeMap<String, String>, (String, String)> {
    let mut attrs = BTreeMap::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .map(|(k, v)| (k.trim(), v.trim()))
            .unwrap_or((pair, ""));
        if k != super::LISTENER_IDLE_TIMEOUT {
            return Err((
                format!(
                    "`{k}` is not a listener attribute AWS takes on an NLB: this listener's attributes are not sent"
                ),
                format!("write {}=<seconds>", super::LISTENER_IDLE_TIMEOUT),
            ));
        }
        let range = super::LISTENER_IDLE_TIMEOUTS;
        if !v.parse::<u32>().is_ok_and(|s| range.contains(&s)) {
            return Err((
                format!(
                    "{k}={v:?} is not a timeout AWS takes: this listener's attributes are not sent"
                ),
                format!(
                    "write whole seconds from {} to {}",
                    range.start(),
                    range.end()
                ),
            ));
        }
        attrs.insert(k.to_string(), v.to_string());
    }
    Ok(attrs)
}

/// The listener attributes this CCM manages: only with cloud.conf
/// `NLBListenerSettings = true` (the Go CCM does not read the annotation).
/// A listener whose annotation AWS would refuse is held: its attributes
/// are left as they are (the reading warns of it).
fn listener_attributes(
    spec: &LoadBalancerSpec,
    cloud: &CloudConfig,
    listeners: &[Listener],
) -> Option<ListenerAttributes> {
    if !cloud.nlb_listener_settings {
        return None;
    }
    let mut setting = ListenerAttributes::default();
    for (_, read) in listener_attribute_settings(spec, listeners) {
        match read {
            Ok((port, attrs)) if !attrs.is_empty() => {
                setting.want.insert(port, attrs);
            }
            Ok(_) => {}
            Err(refused) => setting.held.extend(refused.port),
        }
    }
    Some(setting)
}

/// Pure: what AWS must look like for this Service. `Err` says what the user
/// must fix (address counts that do not match the subnets, TCP+UDP on one
/// port with different node ports).
pub(crate) fn desired(
    spec: &LoadBalancerSpec,
    service_key: &str,
    uid: &str,
    cluster_id: &str,
    cloud: &CloudConfig,
    env: &Environment,
) -> Result<Desired, String> {
    let name = load_balancer_name(uid);
    let tags = tags::owned_tags(
        cluster_id,
        env.legacy_cluster_tag,
        service_key,
        &spec.additional_tags,
    );
    let mut health = health_check(spec, cloud);
    let health_timeout = health_timeout(spec, cloud, health.interval);
    health.timeout = health_timeout.and_then(|t| t.want);
    let (listeners, target_groups) = listeners(spec, service_key, cluster_id, &health)?;
    let alpn = alpn(spec, cloud, &listeners);
    let listener_attributes = listener_attributes(spec, cloud, &listeners);
    let subnet_mappings = subnet_mappings(spec, env)?;
    let groups_managed = cloud.nlb_security_group_mode == NlbSecurityGroupMode::Managed;
    let (security_groups, owned_group) = if !groups_managed {
        // Upstream reads `security-groups` for an NLB only in Managed mode.
        (Vec::new(), None)
    } else if !spec.security_groups.is_empty() {
        (GroupRef::ids(&spec.security_groups), None)
    } else {
        let (namespace, svc_name) = service_key.split_once('/').unwrap_or(("", service_key));
        let group = OwnedGroup {
            name: super::managed_group_name(&env.cluster_name, namespace, svc_name, uid),
            description: super::MANAGED_GROUP_DESCRIPTION.to_string(),
            tags: tags::group_tags(cluster_id, env.legacy_cluster_tag, &spec.additional_tags),
            rules: owned_group_rules(spec, &listeners),
        };
        (vec![GroupRef::Owned], Some(group))
    };
    let pinned_addresses =
        !spec.eip_allocations.is_empty() || !spec.private_ipv4_addresses.is_empty();
    let addresses: Vec<String> = subnet_mappings
        .iter()
        .map(|m| {
            format!(
                "{}/{}/{}",
                m.subnet,
                m.allocation_id.as_deref().unwrap_or(""),
                m.private_ipv4.as_deref().unwrap_or("")
            )
        })
        .collect();
    let applied = Applied::network(
        spec.internal,
        &env.subnets,
        pinned_addresses.then_some(addresses.as_slice()),
    );
    Ok(Desired {
        security_groups,
        owned_group,
        groups_managed,
        applied,
        name,
        internal: spec.internal,
        ip_address_type: if spec.dualstack { "dualstack" } else { "ipv4" }.into(),
        subnet_mappings,
        pinned_addresses,
        tags,
        additional_tags: tags::user_tags(&spec.additional_tags),
        listeners,
        target_groups,
        target_group_attributes: spec.target_group_attributes.clone(),
        attributes: attributes(spec),
        deletion_protection: spec.deletion_protection,
        instances: env.instances.clone(),
        health_timeout,
        alpn,
        listener_attributes,
    })
}

/// One listener per frontend port (TCP and UDP on one port become TCP_UDP),
/// and the target groups they forward to.
pub(crate) fn listeners(
    spec: &LoadBalancerSpec,
    service_key: &str,
    cluster_id: &str,
    health: &HealthCheck,
) -> Result<(Vec<Listener>, Vec<TargetGroup>), String> {
    let (namespace, svc_name) = service_key.split_once('/').unwrap_or(("", service_key));
    let mut by_port: BTreeMap<i32, Vec<&annotations::ServicePortSpec>> = BTreeMap::new();
    for p in &spec.ports {
        by_port.entry(p.port).or_default().push(p);
    }
    let mut listeners = Vec::new();
    let mut target_groups: Vec<TargetGroup> = Vec::new();
    for p in &spec.ports {
        let same = &by_port[&p.port];
        if same.len() > 1 && same[0] != p {
            continue;
        }
        let (frontend, traffic, certificate, ssl_policy) = protocols(spec, p, same)?;
        let tg_name = target_group_name(
            cluster_id,
            namespace,
            svc_name,
            p.port,
            p.node_port,
            &traffic,
            &health.protocol,
            health.interval,
        );
        if !target_groups.iter().any(|t| t.name == tg_name) {
            target_groups.push(TargetGroup {
                name: tg_name.clone(),
                protocol: traffic,
                port: p.node_port,
                health: health.clone(),
            });
        }
        listeners.push(Listener {
            port: p.port,
            protocol: frontend,
            certificate,
            ssl_policy,
            target_group: tg_name,
        });
    }
    Ok((listeners, target_groups))
}

/// A port's frontend and traffic protocols, certificate and SSL policy.
/// `same` holds every entry on the port (two make TCP_UDP).
fn protocols(
    spec: &LoadBalancerSpec,
    p: &annotations::ServicePortSpec,
    same: &[&annotations::ServicePortSpec],
) -> Result<(String, String, Option<String>, Option<String>), String> {
    if same.len() > 1 {
        let node_ports: BTreeSet<i32> = same.iter().map(|q| q.node_port).collect();
        let protocols: BTreeSet<&str> = same.iter().map(|q| q.protocol.as_str()).collect();
        if node_ports.len() != 1 || protocols != BTreeSet::from(["TCP", "UDP"]) {
            return Err(format!(
                "port {} is listed {} times; an NLB takes one TCP and one UDP entry on the same port with the same nodePort (TCP_UDP), got protocols {:?} and node ports {:?}",
                p.port,
                same.len(),
                protocols,
                node_ports
            ));
        }
        return Ok(("TCP_UDP".to_string(), "TCP_UDP".to_string(), None, None));
    }
    let tls = p.protocol != "UDP"
        && spec.ssl_cert.is_some()
        && spec
            .ssl_ports
            .as_ref()
            .is_none_or(|s| s.contains(p.port, &p.name));
    if !tls {
        return Ok((p.protocol.clone(), p.protocol.clone(), None, None));
    }
    let traffic = if spec.backend_protocol == Some(BackendProtocol::Ssl) {
        "TLS"
    } else {
        p.protocol.as_str()
    };
    Ok((
        "TLS".to_string(),
        traffic.to_string(),
        spec.ssl_cert.clone(),
        spec.ssl_negotiation_policy.clone(),
    ))
}

/// One mapping per subnet, paired in order with the EIPs or private
/// addresses the annotations list (one per subnet, or none).
fn subnet_mappings(
    spec: &LoadBalancerSpec,
    env: &Environment,
) -> Result<Vec<SubnetMapping>, String> {
    let count_err = |what: &str, n: usize| {
        format!(
            "{what} lists {n} address(es) but the NLB has {} subnet(s) ({}); give one per subnet",
            env.subnets.len(),
            env.subnets.join(", ")
        )
    };
    if !spec.eip_allocations.is_empty() && spec.eip_allocations.len() != env.subnets.len() {
        return Err(count_err(
            annotations::EIP_ALLOCATIONS,
            spec.eip_allocations.len(),
        ));
    }
    if !spec.private_ipv4_addresses.is_empty()
        && spec.private_ipv4_addresses.len() != env.subnets.len()
    {
        return Err(count_err(
            annotations::PRIVATE_IPV4,
            spec.private_ipv4_addresses.len(),
        ));
    }
    Ok(env
        .subnets
        .iter()
        .enumerate()
        .map(|(i, s)| SubnetMapping {
            subnet: s.clone(),
            allocation_id: spec.eip_allocations.get(i).cloned(),
            private_ipv4: spec.private_ipv4_addresses.get(i).map(|ip| ip.to_string()),
        })
        .collect())
}

fn attributes(spec: &LoadBalancerSpec) -> BTreeMap<String, String> {
    let logs = spec.access_log_enabled;
    // AWS refuses an empty bucket: leave bucket and prefix alone when off.
    let when_logging = |v: &Option<String>| logs.then(|| v.clone().unwrap_or_default());
    [
        (ATTR_CROSS_ZONE, Some(spec.cross_zone.to_string())),
        (ATTR_ACCESS_LOGS, Some(logs.to_string())),
        (
            ATTR_ACCESS_LOGS_BUCKET,
            when_logging(&spec.access_log_bucket),
        ),
        (
            ATTR_ACCESS_LOGS_PREFIX,
            when_logging(&spec.access_log_prefix),
        ),
        // Only when the Service writes it: AWS's protection of a load
        // balancer the Service says nothing about is left as it is.
        (
            ATTR_DELETION_PROTECTION,
            spec.deletion_protection.map(|on| on.to_string()),
        ),
    ]
    .into_iter()
    .filter_map(|(k, v)| Some((k.to_string(), v?)))
    .collect()
}

/// The owned (managed) group's rules: the listeners' ports and ICMP for
/// path MTU, from the source ranges.
fn owned_group_rules(spec: &LoadBalancerSpec, listeners: &[Listener]) -> BTreeSet<Rule> {
    let mut rules: BTreeSet<Rule> = spec.source_ranges.iter().map(|r| mtu_rule(*r)).collect();
    for l in listeners {
        for proto in ip_protocols(&l.protocol) {
            for range in &spec.source_ranges {
                rules.insert(port_rule(proto, l.port, *range));
            }
        }
    }
    rules
}
