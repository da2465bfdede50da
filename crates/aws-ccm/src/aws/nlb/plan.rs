//! NLB, pure half: the desired state from a Service spec, and the plan that
//! takes what AWS reports to it.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ATTR_ACCESS_LOGS, ATTR_ACCESS_LOGS_BUCKET, ATTR_ACCESS_LOGS_PREFIX, ATTR_CROSS_ZONE, Actual,
    ActualLb, ActualListener, ActualTargetGroup, Change, Desired, HealthCheck, Listener,
    SubnetMapping, TargetGroup, TgRef, target_group_name,
};
use crate::aws::annotations::{self, BackendProtocol, HealthCheckPort, LoadBalancerSpec};
use crate::aws::applied::Applied;
use crate::aws::elb::{Environment, GroupRef, OwnedGroup, load_balancer_name};
use crate::aws::security_groups::{Rule, Source};
use crate::aws::tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode, NlbSecurityGroupMode};

/// Upstream's `buildNLBHealthCheckConfiguration`.
pub fn health_check(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> HealthCheck {
    let mut hc = match spec.local_health_check_node_port {
        Some(port) => HealthCheck {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: Some("/healthz".into()),
            interval: 10,
            healthy: 2,
            unhealthy: 2,
        },
        None => HealthCheck {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: Some("/".into()),
            interval: 30,
            healthy: 3,
            unhealthy: 3,
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
    if let Some(i) = o.interval {
        hc.interval = i;
    }
    if let Some(t) = o.healthy_threshold {
        hc.healthy = t;
    }
    if let Some(t) = o.unhealthy_threshold {
        hc.unhealthy = t;
    }
    hc
}

/// Pure: what AWS must look like for this Service. `Err` says what the user
/// must fix (address counts that do not match the subnets, TCP+UDP on one
/// port with different node ports).
pub fn desired(
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
    let health = health_check(spec, cloud);
    let (listeners, target_groups) = listeners(spec, service_key, cluster_id, &health)?;
    let subnet_mappings = subnet_mappings(spec, env)?;
    let groups_managed = cloud.nlb_security_group_mode == NlbSecurityGroupMode::Managed;
    let (security_groups, owned_group) = if !groups_managed {
        // Upstream reads `security-groups` for an NLB only in Managed mode.
        (Vec::new(), None)
    } else if !spec.security_groups.is_empty() {
        (
            spec.security_groups
                .iter()
                .cloned()
                .map(GroupRef::Id)
                .collect(),
            None,
        )
    } else {
        let (namespace, svc_name) = service_key.split_once('/').unwrap_or(("", service_key));
        let group = OwnedGroup {
            name: super::managed_group_name(&env.cluster_name, namespace, svc_name, uid),
            description: super::MANAGED_GROUP_DESCRIPTION.to_string(),
            tags: tags.clone(),
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
        listeners,
        target_groups,
        target_group_attributes: spec.target_group_attributes.clone(),
        attributes: attributes(spec),
        instances: env.instances.clone(),
    })
}

/// One listener per frontend port (TCP and UDP on one port become TCP_UDP),
/// and the target groups they forward to.
fn listeners(
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
    let mut attributes = BTreeMap::from([
        (ATTR_CROSS_ZONE.to_string(), spec.cross_zone.to_string()),
        (
            ATTR_ACCESS_LOGS.to_string(),
            spec.access_log_enabled.to_string(),
        ),
    ]);
    // AWS refuses an empty bucket: leave bucket and prefix alone when off.
    if spec.access_log_enabled {
        attributes.insert(
            ATTR_ACCESS_LOGS_BUCKET.into(),
            spec.access_log_bucket.clone().unwrap_or_default(),
        );
        attributes.insert(
            ATTR_ACCESS_LOGS_PREFIX.into(),
            spec.access_log_prefix.clone().unwrap_or_default(),
        );
    }
    attributes
}

/// The owned (managed) group's rules: the listeners' ports and ICMP for
/// path MTU, from the source ranges.
fn owned_group_rules(spec: &LoadBalancerSpec, listeners: &[Listener]) -> BTreeSet<Rule> {
    let mut rules = BTreeSet::new();
    for l in listeners {
        let protocols: &[&str] = match l.protocol.as_str() {
            "UDP" => &["udp"],
            "TCP_UDP" => &["tcp", "udp"],
            _ => &["tcp"],
        };
        for proto in protocols {
            for range in &spec.source_ranges {
                rules.insert(Rule {
                    protocol: proto.to_string(),
                    from: l.port,
                    to: l.port,
                    source: Source::Cidr(*range),
                });
            }
        }
    }
    for range in &spec.source_ranges {
        rules.insert(Rule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            source: Source::Cidr(*range),
        });
    }
    rules
}

fn missing_tags(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| have.get(*k) != Some(v) && tags::added_to_existing(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Attributes `want` asks for that `have` lacks; an attribute AWS does not
/// report counts as its default (`false` for switches, empty otherwise).
fn attribute_delta(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| {
            let default = if k.ends_with(".enabled") { "false" } else { "" };
            have.get(*k).map(String::as_str).unwrap_or(default) != v.as_str()
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn scheme(internal: bool) -> &'static str {
    if internal {
        "internal"
    } else {
        "internet-facing"
    }
}

/// Pure: the changes that take `actual` to `desired`, in the order to apply
/// them. Empty when nothing differs. Target groups the Service no longer
/// uses are deleted only after no listener points at them, and only when
/// they carry this cluster's ownership tag.
pub fn plan(desired: &Desired, actual: &Actual, cluster_id: &str) -> Vec<Change> {
    let mut changes = Vec::new();
    // An existing NLB without groups keeps none (see Desired::groups_managed).
    let manage_groups = desired.groups_managed
        && actual
            .lb
            .as_ref()
            .is_none_or(|l| !l.security_groups.is_empty());
    // The owned group and its rules first: the NLB is created with it.
    if manage_groups {
        owned_group_changes(desired, actual, &mut changes);
    }
    let owned_id = actual.owned_group.as_ref().map(|g| g.id.clone());
    let want_groups: BTreeSet<String> = desired
        .security_groups
        .iter()
        .map(|g| match g {
            GroupRef::Id(id) => id.clone(),
            GroupRef::Owned => owned_id.clone().unwrap_or_else(|| "<owned>".into()),
        })
        .collect();
    let lb = existing_unless_recreated(desired, actual, cluster_id, &mut changes);
    let fresh = lb.is_none();
    let lb = lb.unwrap_or_else(|| created(desired, &want_groups, &mut changes));
    let groups = manage_groups.then_some(&want_groups);
    load_balancer_changes(desired, &lb, fresh, groups, &mut changes);
    // Target groups first: listeners are created or moved onto them.
    let by_name: BTreeMap<&str, &ActualTargetGroup> = actual
        .target_groups
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    for tg in &desired.target_groups {
        match by_name.get(tg.name.as_str()) {
            None => new_target_group_changes(desired, tg, &mut changes),
            Some(have) => target_group_changes(desired, tg, have, &mut changes),
        }
    }
    listener_changes(desired, &lb, &by_name, &mut changes);
    retired_changes(desired, actual, cluster_id, manage_groups, &mut changes);
    changes
}

/// The owned group: created when missing, its rules brought to the wanted set.
fn owned_group_changes(desired: &Desired, actual: &Actual, changes: &mut Vec<Change>) {
    let Some(want) = &desired.owned_group else {
        return;
    };
    let have = actual
        .owned_group
        .as_ref()
        .map(|g| g.ingress.clone())
        .unwrap_or_default();
    if actual.owned_group.is_none() {
        changes.push(Change::CreateSecurityGroup(want.clone()));
    }
    let add: BTreeSet<Rule> = want.rules.difference(&have).cloned().collect();
    let remove: BTreeSet<Rule> = have.difference(&want.rules).cloned().collect();
    if !add.is_empty() {
        changes.push(Change::AuthorizeIngress(add));
    }
    if !remove.is_empty() {
        changes.push(Change::RevokeIngress(remove));
    }
}

/// A create-time setting of an existing NLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Scheme,
    /// Pinned addresses (EIPs or private IPv4) and their subnets.
    Addresses,
    /// Subnets without pinned addresses (changed in place with SetSubnets).
    Subnets,
}

/// The create-time settings where the NLB differs from what the Service
/// asks for, each with a sentence saying how.
fn differences(desired: &Desired, current: &ActualLb) -> Vec<(Field, String)> {
    let mut out = Vec::new();
    if current.internal != desired.internal {
        out.push((
            Field::Scheme,
            format!(
                "its scheme is {} and the Service asks for {}",
                scheme(current.internal),
                scheme(desired.internal)
            ),
        ));
    }
    let want: BTreeSet<SubnetMapping> = desired.subnet_mappings.iter().cloned().collect();
    // (An NLB whose addresses AWS does not report is left as it is.)
    if desired.pinned_addresses && current.addresses_reported && current.subnet_mappings != want {
        out.push((
            Field::Addresses,
            "its subnet addresses differ from the Service's eip-allocations or private-ipv4-addresses".to_string(),
        ));
    }
    let have: BTreeSet<&str> = current
        .subnet_mappings
        .iter()
        .map(|m| m.subnet.as_str())
        .collect();
    let want: BTreeSet<&str> = want.iter().map(|m| m.subnet.as_str()).collect();
    if !desired.pinned_addresses && have != want {
        out.push((
            Field::Subnets,
            format!(
                "its subnets are {} and the Service's are {}",
                have.into_iter().collect::<Vec<_>>().join(", "),
                want.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    out
}

/// Whether the Service asks for a different `field` than this CCM applied
/// (the record on the NLB); never without a record.
fn asked(field: Field, record: Option<&Applied>, want: &Applied) -> bool {
    let Some(r) = record else {
        return false;
    };
    match field {
        Field::Scheme => r.internal != want.internal,
        Field::Addresses => r.addresses != want.addresses,
        Field::Subnets => r.subnets != want.subnets,
    }
}

/// Pure: the create-time differences a sync leaves as they are (the Service
/// did not ask for them, see `crate::aws::applied`, or the NLB lacks this
/// cluster's ownership tag), for the Warning event. Empty when none.
pub fn left_alone(desired: &Desired, actual: &Actual, cluster_id: &str) -> Vec<String> {
    let Some(current) = &actual.lb else {
        return Vec::new();
    };
    let record = Applied::from_tags(&current.tags);
    let owned = tags::is_owned(&current.tags, cluster_id);
    differences(desired, current)
        .into_iter()
        .filter(|(f, _)| !owned || !asked(*f, record.as_ref(), &desired.applied))
        .map(|(_, what)| what)
        .collect()
}

/// The existing NLB, or `None` when there is none or it must be recreated
/// (then after a delete step): scheme and pinned addresses are create-time
/// only, and are recreated for only when the Service asks for other values
/// than the NLB's record says were applied.
fn existing_unless_recreated(
    desired: &Desired,
    actual: &Actual,
    cluster_id: &str,
    changes: &mut Vec<Change>,
) -> Option<ActualLb> {
    let current = actual.lb.as_ref()?;
    let record = Applied::from_tags(&current.tags);
    let reason = differences(desired, current)
        .into_iter()
        .find(|(f, _)| *f != Field::Subnets && asked(*f, record.as_ref(), &desired.applied));
    let Some((_, reason)) = reason else {
        return Some(current.clone());
    };
    if !tags::is_owned(&current.tags, cluster_id) {
        tracing::warn!(load_balancer = %desired.name, %reason, "the NLB lacks this cluster's ownership tag; not recreating it");
        return Some(current.clone());
    }
    changes.push(Change::DeleteLoadBalancer {
        arn: current.arn.clone(),
        reason,
    });
    None
}

/// The create step, and the NLB it makes as the later steps see it.
fn created(
    desired: &Desired,
    want_groups: &BTreeSet<String>,
    changes: &mut Vec<Change>,
) -> ActualLb {
    let tags = desired.applied.tagged(&desired.tags);
    changes.push(Change::CreateLoadBalancer {
        internal: desired.internal,
        ip_address_type: desired.ip_address_type.clone(),
        subnet_mappings: desired.subnet_mappings.clone(),
        security_groups: desired.security_groups.clone(),
        tags: tags.clone(),
    });
    ActualLb {
        arn: String::new(),
        dns_name: String::new(),
        internal: desired.internal,
        ip_address_type: desired.ip_address_type.clone(),
        subnet_mappings: desired.subnet_mappings.iter().cloned().collect(),
        addresses_reported: true,
        security_groups: want_groups.iter().cloned().collect(),
        tags,
        attributes: BTreeMap::from([
            (ATTR_CROSS_ZONE.to_string(), "false".to_string()),
            (ATTR_ACCESS_LOGS.to_string(), "false".to_string()),
        ]),
        listeners: Vec::new(),
    }
}

/// The NLB's own settings: subnets (only when the Service asks for others
/// than were applied), groups (`want_groups`, `None` to leave them), address
/// type, tags (with the record brought up to date on an NLB that has one and
/// nothing left alone), attributes.
fn load_balancer_changes(
    desired: &Desired,
    lb: &ActualLb,
    fresh: bool,
    want_groups: Option<&BTreeSet<String>>,
    changes: &mut Vec<Change>,
) {
    let lb_arn = (!fresh).then(|| lb.arn.clone());
    let record = Applied::from_tags(&lb.tags);
    let mut want_tags = desired.tags.clone();
    let diffs = if fresh {
        Vec::new()
    } else {
        differences(desired, lb)
    };
    let asked_for = |f: Field| asked(f, record.as_ref(), &desired.applied);
    if diffs
        .iter()
        .any(|(f, _)| *f == Field::Subnets && asked_for(*f))
    {
        changes.push(Change::SetSubnets(desired.subnet_mappings.clone()));
    }
    if record.is_some()
        && record.as_ref() != Some(&desired.applied)
        && diffs.iter().all(|(f, _)| asked_for(*f))
    {
        want_tags.insert(tags::APPLIED_TAG.to_string(), desired.applied.to_value());
    }
    let have_groups: BTreeSet<String> = lb.security_groups.iter().cloned().collect();
    if let Some(want) = want_groups
        && !fresh
        && have_groups != *want
    {
        changes.push(Change::SetSecurityGroups(desired.security_groups.clone()));
    }
    if lb.ip_address_type != desired.ip_address_type {
        changes.push(Change::SetIpAddressType(desired.ip_address_type.clone()));
    }
    let tags = missing_tags(&want_tags, &lb.tags);
    if !tags.is_empty() {
        changes.push(Change::AddTags { arn: lb_arn, tags });
    }
    let attrs = attribute_delta(&desired.attributes, &lb.attributes);
    if !attrs.is_empty() {
        changes.push(Change::ModifyAttributes(attrs));
    }
}

/// A target group to create: then its attributes and targets.
fn new_target_group_changes(desired: &Desired, tg: &TargetGroup, changes: &mut Vec<Change>) {
    changes.push(Change::CreateTargetGroup {
        group: tg.clone(),
        tags: desired.tags.clone(),
    });
    if !desired.target_group_attributes.is_empty() {
        changes.push(Change::ModifyTargetGroupAttributes {
            target_group: TgRef::Name(tg.name.clone()),
            attributes: desired.target_group_attributes.clone(),
        });
    }
    if !desired.instances.is_empty() {
        changes.push(Change::RegisterTargets {
            target_group: TgRef::Name(tg.name.clone()),
            port: tg.port,
            instances: desired.instances.clone(),
        });
    }
}

/// An existing target group: health check, tags, attributes, targets.
fn target_group_changes(
    desired: &Desired,
    tg: &TargetGroup,
    have: &ActualTargetGroup,
    changes: &mut Vec<Change>,
) {
    let h = &have.health;
    let w = &tg.health;
    let path_differs = w.protocol != "TCP" && w.path != h.path;
    if w.port != h.port || w.healthy != h.healthy || w.unhealthy != h.unhealthy || path_differs {
        changes.push(Change::ModifyHealthCheck {
            arn: have.arn.clone(),
            health: w.clone(),
        });
    }
    let tags = missing_tags(&desired.tags, &have.tags);
    if !tags.is_empty() {
        changes.push(Change::AddTags {
            arn: Some(have.arn.clone()),
            tags,
        });
    }
    let attrs = attribute_delta(&desired.target_group_attributes, &have.attributes);
    if !attrs.is_empty() {
        changes.push(Change::ModifyTargetGroupAttributes {
            target_group: TgRef::Arn(have.arn.clone()),
            attributes: attrs,
        });
    }
    let register: BTreeSet<String> = desired
        .instances
        .difference(&have.targets)
        .cloned()
        .collect();
    let deregister: BTreeSet<String> = have
        .targets
        .difference(&desired.instances)
        .cloned()
        .collect();
    if !register.is_empty() {
        changes.push(Change::RegisterTargets {
            target_group: TgRef::Arn(have.arn.clone()),
            port: have.port,
            instances: register,
        });
    }
    if !deregister.is_empty() {
        changes.push(Change::DeregisterTargets {
            arn: have.arn.clone(),
            port: have.port,
            instances: deregister,
        });
    }
}

/// Listeners, one per port: modify in place (protocol, certificate,
/// policy, target group), create the missing, delete the extra.
fn listener_changes(
    desired: &Desired,
    lb: &ActualLb,
    by_name: &BTreeMap<&str, &ActualTargetGroup>,
    changes: &mut Vec<Change>,
) {
    let arn_of = |name: &str| by_name.get(name).map(|t| t.arn.clone());
    let have: BTreeMap<i32, &ActualListener> = lb.listeners.iter().map(|l| (l.port, l)).collect();
    let want_ports: BTreeSet<i32> = desired.listeners.iter().map(|l| l.port).collect();
    for l in &lb.listeners {
        if !want_ports.contains(&l.port) {
            changes.push(Change::DeleteListener { arn: l.arn.clone() });
        }
    }
    for l in &desired.listeners {
        match have.get(&l.port) {
            None => changes.push(Change::CreateListener {
                listener: l.clone(),
                tags: desired.tags.clone(),
            }),
            Some(h) => {
                let same = h.protocol == l.protocol
                    && h.certificate == l.certificate
                    && (l.ssl_policy.is_none() || h.ssl_policy == l.ssl_policy)
                    && h.target_group_arn.is_some()
                    && h.target_group_arn == arn_of(&l.target_group);
                if !same {
                    changes.push(Change::ModifyListener {
                        arn: h.arn.clone(),
                        listener: l.clone(),
                    });
                }
            }
        }
    }
}

/// Target groups no listener will use any more, and an owned group the NLB
/// left (Managed → BYO or no group).
fn retired_changes(
    desired: &Desired,
    actual: &Actual,
    cluster_id: &str,
    manage_groups: bool,
    changes: &mut Vec<Change>,
) {
    let wanted: BTreeSet<&str> = desired
        .target_groups
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    for tg in &actual.target_groups {
        if !wanted.contains(tg.name.as_str()) && tags::is_owned(&tg.tags, cluster_id) {
            changes.push(Change::DeleteTargetGroup {
                arn: tg.arn.clone(),
                name: tg.name.clone(),
            });
        }
    }
    if manage_groups
        && desired.owned_group.is_none()
        && let Some(g) = &actual.owned_group
        && tags::is_owned(&g.tags, cluster_id)
    {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
}

/// Pure: what deleting the Service's NLB takes: the load balancer, then its
/// target groups. Nothing without this cluster's ownership tag is deleted.
pub fn plan_delete(actual: &Actual, cluster_id: &str) -> Vec<Change> {
    let mut changes = Vec::new();
    if let Some(lb) = &actual.lb
        && tags::is_owned(&lb.tags, cluster_id)
    {
        changes.push(Change::DeleteLoadBalancer {
            arn: lb.arn.clone(),
            reason: "the Service no longer asks for it".into(),
        });
    }
    for tg in &actual.target_groups {
        if tags::is_owned(&tg.tags, cluster_id) {
            changes.push(Change::DeleteTargetGroup {
                arn: tg.arn.clone(),
                name: tg.name.clone(),
            });
        }
    }
    if let Some(g) = &actual.owned_group
        && tags::is_owned(&g.tags, cluster_id)
    {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
}

/// A short, stable description of a change for logs and events.
pub fn describe(change: &Change) -> String {
    match change {
        Change::CreateSecurityGroup(g) => format!("create security group {}", g.name),
        Change::AuthorizeIngress(r) => format!("authorize {} rule(s) on the NLB group", r.len()),
        Change::RevokeIngress(r) => format!("revoke {} rule(s) on the NLB group", r.len()),
        Change::SetSecurityGroups(g) => format!("set the NLB's security groups ({})", g.len()),
        Change::DeleteSecurityGroup(id) => format!("delete security group {id}"),
        Change::DeleteLoadBalancer { reason, .. } => format!("delete NLB ({reason})"),
        Change::CreateLoadBalancer { .. } => "create NLB".into(),
        Change::SetSubnets(m) => format!("set subnets ({})", m.len()),
        Change::SetIpAddressType(t) => format!("set IP address type {t}"),
        Change::AddTags { arn, tags } => format!(
            "tag {} with {:?}",
            arn.as_deref().unwrap_or("the NLB"),
            tags.keys().collect::<Vec<_>>()
        ),
        Change::ModifyAttributes(a) => format!("set attributes {:?}", a.keys().collect::<Vec<_>>()),
        Change::CreateTargetGroup { group, .. } => {
            format!(
                "create target group {} ({} {})",
                group.name, group.protocol, group.port
            )
        }
        Change::ModifyHealthCheck { arn, .. } => format!("modify health check of {arn}"),
        Change::ModifyTargetGroupAttributes { target_group, .. } => {
            format!("set attributes of target group {target_group:?}")
        }
        Change::RegisterTargets {
            target_group,
            instances,
            ..
        } => format!("register {} target(s) in {target_group:?}", instances.len()),
        Change::DeregisterTargets { arn, instances, .. } => {
            format!("deregister {} target(s) from {arn}", instances.len())
        }
        Change::CreateListener { listener, .. } => {
            format!("create listener {} {}", listener.protocol, listener.port)
        }
        Change::ModifyListener { listener, .. } => {
            format!("modify listener {} {}", listener.protocol, listener.port)
        }
        Change::DeleteListener { arn } => format!("delete listener {arn}"),
        Change::DeleteTargetGroup { name, .. } => format!("delete target group {name}"),
    }
}
