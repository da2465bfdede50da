//! Network Load Balancers (elbv2): desired state from a Service spec, actual
//! state from a few reads, a pure plan between them, and the calls that apply
//! it (in [`io`]).
//!
//! Load balancer and target group names and tags are the Go CCM's (`a` + UID;
//! `k8s-<ns:8>-<name:8>-<sha1:10>` over the same inputs), so an NLB it made is
//! adopted with no create call, and vice versa.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;
use sha1::{Digest, Sha1};

use super::annotations::{BackendProtocol, HealthCheckPort, LoadBalancerSpec};
use super::elb::{GroupRef, OwnedGroup};
use super::security_groups::{self as sg, Rule, Source};
use super::tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode, NlbSecurityGroupMode};

pub use super::elb::load_balancer_name;

/// Rule descriptions on node groups, as upstream: they mark the rules this
/// controller wrote (and may revoke).
pub const CLIENT_RULE_PREFIX: &str = "kubernetes.io/rule/nlb/client";
pub const HEALTH_RULE_PREFIX: &str = "kubernetes.io/rule/nlb/health";
pub const MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";

pub const ATTR_CROSS_ZONE: &str = "load_balancing.cross_zone.enabled";
pub const ATTR_ACCESS_LOGS: &str = "access_logs.s3.enabled";
pub const ATTR_ACCESS_LOGS_BUCKET: &str = "access_logs.s3.bucket";
pub const ATTR_ACCESS_LOGS_PREFIX: &str = "access_logs.s3.prefix";

/// Registration calls carry at most this many targets (as upstream).
pub const TARGET_CHUNK: usize = 100;

pub fn client_rule_description(lb_name: &str) -> String {
    format!("{CLIENT_RULE_PREFIX}={lb_name}")
}

pub fn health_rule_description(lb_name: &str) -> String {
    format!("{HEALTH_RULE_PREFIX}={lb_name}")
}

/// Upstream's `buildTargetGroupName`: `k8s-{ns:8}-{name:8}-{sha1:10}`, the
/// hash over everything a target group cannot change in place.
#[allow(clippy::too_many_arguments)]
pub fn target_group_name(
    cluster_id: &str,
    namespace: &str,
    name: &str,
    service_port: i32,
    node_port: i32,
    target_protocol: &str,
    health_protocol: &str,
    health_interval: i32,
) -> String {
    let mut h = Sha1::new();
    for part in [
        cluster_id,
        namespace,
        name,
        &service_port.to_string(),
        &node_port.to_string(),
        target_protocol,
        "instance",
        health_protocol,
        &health_interval.to_string(),
    ] {
        h.update(part.as_bytes());
    }
    let hash = hex::encode(h.finalize());
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-{}", clean(namespace), clean(name), &hash[..10])
}

/// `k8s-<ns:8>-<name:8>-`: what every target group of the Service starts with.
pub fn target_group_prefix(service_key: &str) -> String {
    let (namespace, name) = service_key.split_once('/').unwrap_or(("", service_key));
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-", clean(namespace), clean(name))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP`, `HTTPS`.
    pub protocol: String,
    /// `traffic-port` or a port number.
    pub port: String,
    /// Only for HTTP/HTTPS.
    pub path: Option<String>,
    pub interval: i32,
    pub healthy: i32,
    pub unhealthy: i32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetGroup {
    pub name: String,
    /// `TCP`, `UDP`, `TLS`, `TCP_UDP`.
    pub protocol: String,
    /// The node port.
    pub port: i32,
    pub health: HealthCheck,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub port: i32,
    /// `TCP`, `UDP`, `TLS`, `TCP_UDP`.
    pub protocol: String,
    pub certificate: Option<String>,
    pub ssl_policy: Option<String>,
    /// Name of the target group it forwards to.
    pub target_group: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SubnetMapping {
    pub subnet: String,
    pub allocation_id: Option<String>,
    pub private_ipv4: Option<String>,
}

/// What AWS must look like for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub name: String,
    pub internal: bool,
    /// `ipv4` or `dualstack`.
    pub ip_address_type: String,
    pub subnet_mappings: Vec<SubnetMapping>,
    /// Whether the mappings carry addresses (then they are create-time only).
    pub pinned_addresses: bool,
    pub tags: BTreeMap<String, String>,
    pub listeners: Vec<Listener>,
    pub target_groups: Vec<TargetGroup>,
    /// Only the keys the Service sets.
    pub target_group_attributes: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    pub instances: BTreeSet<String>,
    /// The NLB's groups: the `security-groups` annotation's, the owned one
    /// (`NLBSecurityGroupMode = Managed`), or none.
    pub security_groups: Vec<GroupRef>,
    pub owned_group: Option<OwnedGroup>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActualListener {
    pub arn: String,
    pub port: i32,
    pub protocol: String,
    pub certificate: Option<String>,
    pub ssl_policy: Option<String>,
    pub target_group_arn: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActualLb {
    pub arn: String,
    pub dns_name: String,
    pub internal: bool,
    pub ip_address_type: String,
    pub subnet_mappings: BTreeSet<SubnetMapping>,
    /// Whether AWS listed the zones' addresses at all (moto does not).
    pub addresses_reported: bool,
    pub security_groups: Vec<String>,
    pub tags: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    pub listeners: Vec<ActualListener>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActualTargetGroup {
    pub arn: String,
    pub name: String,
    pub protocol: String,
    pub port: i32,
    pub health: HealthCheck,
    pub tags: BTreeMap<String, String>,
    pub attributes: BTreeMap<String, String>,
    /// Registered instance IDs (on `port`), draining ones left out.
    pub targets: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Actual {
    pub lb: Option<ActualLb>,
    /// The Service's target groups: those behind the LB's listeners and any
    /// found by name.
    pub target_groups: Vec<ActualTargetGroup>,
    /// The owned (managed) group `k8s-elb-<name>`, when it exists.
    pub owned_group: Option<sg::SecurityGroup>,
}

/// A target group named in a plan: an existing ARN, or one the plan creates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TgRef {
    Arn(String),
    Name(String),
}

/// One mutating step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    CreateSecurityGroup(OwnedGroup),
    AuthorizeIngress(BTreeSet<Rule>),
    RevokeIngress(BTreeSet<Rule>),
    SetSecurityGroups(Vec<GroupRef>),
    DeleteSecurityGroup(String),
    DeleteLoadBalancer {
        arn: String,
        reason: String,
    },
    CreateLoadBalancer {
        internal: bool,
        ip_address_type: String,
        subnet_mappings: Vec<SubnetMapping>,
        security_groups: Vec<GroupRef>,
        tags: BTreeMap<String, String>,
    },
    SetSubnets(Vec<SubnetMapping>),
    SetIpAddressType(String),
    AddTags {
        arn: Option<String>,
        tags: BTreeMap<String, String>,
    },
    ModifyAttributes(BTreeMap<String, String>),
    CreateTargetGroup {
        group: TargetGroup,
        tags: BTreeMap<String, String>,
    },
    ModifyHealthCheck {
        arn: String,
        health: HealthCheck,
    },
    ModifyTargetGroupAttributes {
        target_group: TgRef,
        attributes: BTreeMap<String, String>,
    },
    RegisterTargets {
        target_group: TgRef,
        port: i32,
        instances: BTreeSet<String>,
    },
    DeregisterTargets {
        arn: String,
        port: i32,
        instances: BTreeSet<String>,
    },
    CreateListener {
        listener: Listener,
        tags: BTreeMap<String, String>,
    },
    ModifyListener {
        arn: String,
        listener: Listener,
    },
    DeleteListener {
        arn: String,
    },
    DeleteTargetGroup {
        arn: String,
        name: String,
    },
}

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

/// Inputs read from AWS that shape the desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// In the order addresses pair with them.
    pub subnets: Vec<String>,
    pub instances: BTreeSet<String>,
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
    let (namespace, svc_name) = service_key.split_once('/').unwrap_or(("", service_key));
    let tags = tags::owned_tags(cluster_id, service_key, &spec.additional_tags);
    let health = health_check(spec, cloud);

    // One listener per frontend port; TCP and UDP on one port become TCP_UDP.
    let mut by_port: BTreeMap<i32, Vec<&super::annotations::ServicePortSpec>> = BTreeMap::new();
    for p in &spec.ports {
        by_port.entry(p.port).or_default().push(p);
    }
    let mut listeners = Vec::new();
    let mut target_groups: Vec<TargetGroup> = Vec::new();
    for p in &spec.ports {
        let same = &by_port[&p.port];
        let merged = same.len() > 1;
        if merged && same[0] != p {
            continue;
        }
        let (frontend, traffic, certificate, ssl_policy) = if merged {
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
            ("TCP_UDP".to_string(), "TCP_UDP".to_string(), None, None)
        } else {
            let tls = p.protocol != "UDP"
                && spec.ssl_cert.is_some()
                && spec
                    .ssl_ports
                    .as_ref()
                    .is_none_or(|s| s.contains(p.port, &p.name));
            if tls {
                let traffic = if spec.backend_protocol == Some(BackendProtocol::Ssl) {
                    "TLS"
                } else {
                    p.protocol.as_str()
                };
                (
                    "TLS".to_string(),
                    traffic.to_string(),
                    spec.ssl_cert.clone(),
                    spec.ssl_negotiation_policy.clone(),
                )
            } else {
                (p.protocol.clone(), p.protocol.clone(), None, None)
            }
        };
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

    let count_err = |what: &str, n: usize| {
        format!(
            "{what} lists {n} address(es) but the NLB has {} subnet(s) ({}); give one per subnet",
            env.subnets.len(),
            env.subnets.join(", ")
        )
    };
    if !spec.eip_allocations.is_empty() && spec.eip_allocations.len() != env.subnets.len() {
        return Err(count_err(
            super::annotations::EIP_ALLOCATIONS,
            spec.eip_allocations.len(),
        ));
    }
    if !spec.private_ipv4_addresses.is_empty()
        && spec.private_ipv4_addresses.len() != env.subnets.len()
    {
        return Err(count_err(
            super::annotations::PRIVATE_IPV4,
            spec.private_ipv4_addresses.len(),
        ));
    }
    let subnet_mappings = env
        .subnets
        .iter()
        .enumerate()
        .map(|(i, s)| SubnetMapping {
            subnet: s.clone(),
            allocation_id: spec.eip_allocations.get(i).cloned(),
            private_ipv4: spec.private_ipv4_addresses.get(i).map(|ip| ip.to_string()),
        })
        .collect();

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

    let (security_groups, owned_group) = if !spec.security_groups.is_empty() {
        (
            spec.security_groups
                .iter()
                .cloned()
                .map(GroupRef::Id)
                .collect(),
            None,
        )
    } else if cloud.nlb_security_group_mode == NlbSecurityGroupMode::Managed {
        let mut rules = BTreeSet::new();
        for l in &listeners {
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
        (
            vec![GroupRef::Owned],
            Some(OwnedGroup {
                name: super::elb::owned_group_name(&name),
                description: format!("Security group for Kubernetes NLB {name} ({service_key})"),
                tags: tags.clone(),
                rules,
            }),
        )
    } else {
        (Vec::new(), None)
    };

    Ok(Desired {
        security_groups,
        owned_group,
        name,
        internal: spec.internal,
        ip_address_type: if spec.dualstack { "dualstack" } else { "ipv4" }.into(),
        subnet_mappings,
        pinned_addresses: !spec.eip_allocations.is_empty()
            || !spec.private_ipv4_addresses.is_empty(),
        tags,
        listeners,
        target_groups,
        target_group_attributes: spec.target_group_attributes.clone(),
        attributes,
        instances: env.instances.clone(),
    })
}

fn missing_tags(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| have.get(*k) != Some(v))
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

    // The owned group and its rules first: the NLB is created with it.
    if let Some(want) = &desired.owned_group {
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
    let owned_id = actual.owned_group.as_ref().map(|g| g.id.clone());
    let want_groups: BTreeSet<String> = desired
        .security_groups
        .iter()
        .map(|g| match g {
            GroupRef::Id(id) => id.clone(),
            GroupRef::Owned => owned_id.clone().unwrap_or_else(|| "<owned>".into()),
        })
        .collect();

    // Scheme and pinned addresses are create-time only: recreate.
    let mut lb = actual.lb.clone();
    if let Some(current) = &lb {
        let want: BTreeSet<SubnetMapping> = desired.subnet_mappings.iter().cloned().collect();
        let reason = if current.security_groups.is_empty() != desired.security_groups.is_empty() {
            // AWS sets an NLB's groups only if it was created with some, and
            // never takes them all away.
            Some(if desired.security_groups.is_empty() {
                "it must lose its security groups".to_string()
            } else {
                "security groups are added to an NLB only at creation".to_string()
            })
        } else if current.internal != desired.internal {
            Some(format!(
                "scheme changes from {} to {}",
                scheme(current.internal),
                scheme(desired.internal)
            ))
        } else if desired.pinned_addresses
            && current.addresses_reported
            && current.subnet_mappings != want
        {
            // (An NLB whose addresses AWS does not report is left as it is.)
            Some("its subnet addresses (EIPs or private IPv4) changed".to_string())
        } else {
            None
        };
        if let Some(reason) = reason {
            if tags::is_owned(&current.tags, cluster_id) {
                changes.push(Change::DeleteLoadBalancer {
                    arn: current.arn.clone(),
                    reason,
                });
                lb = None;
            } else {
                tracing::warn!(load_balancer = %desired.name, %reason, "the NLB lacks this cluster's ownership tag; not recreating it");
            }
        }
    }
    let fresh = lb.is_none();
    let lb = match lb {
        Some(lb) => lb,
        None => {
            changes.push(Change::CreateLoadBalancer {
                internal: desired.internal,
                ip_address_type: desired.ip_address_type.clone(),
                subnet_mappings: desired.subnet_mappings.clone(),
                security_groups: desired.security_groups.clone(),
                tags: desired.tags.clone(),
            });
            ActualLb {
                arn: String::new(),
                dns_name: String::new(),
                internal: desired.internal,
                ip_address_type: desired.ip_address_type.clone(),
                subnet_mappings: desired.subnet_mappings.iter().cloned().collect(),
                addresses_reported: true,
                security_groups: want_groups.iter().cloned().collect(),
                tags: desired.tags.clone(),
                attributes: BTreeMap::from([
                    (ATTR_CROSS_ZONE.to_string(), "false".to_string()),
                    (ATTR_ACCESS_LOGS.to_string(), "false".to_string()),
                ]),
                listeners: Vec::new(),
            }
        }
    };
    let lb_arn = (!fresh).then(|| lb.arn.clone());

    if !fresh && !desired.pinned_addresses {
        let have: BTreeSet<&str> = lb
            .subnet_mappings
            .iter()
            .map(|m| m.subnet.as_str())
            .collect();
        let want: BTreeSet<&str> = desired
            .subnet_mappings
            .iter()
            .map(|m| m.subnet.as_str())
            .collect();
        if have != want {
            changes.push(Change::SetSubnets(desired.subnet_mappings.clone()));
        }
    }
    let have_groups: BTreeSet<String> = lb.security_groups.iter().cloned().collect();
    if !fresh && have_groups != want_groups {
        changes.push(Change::SetSecurityGroups(desired.security_groups.clone()));
    }
    if lb.ip_address_type != desired.ip_address_type {
        changes.push(Change::SetIpAddressType(desired.ip_address_type.clone()));
    }
    let tags = missing_tags(&desired.tags, &lb.tags);
    if !tags.is_empty() {
        changes.push(Change::AddTags {
            arn: lb_arn.clone(),
            tags,
        });
    }
    let attrs = attribute_delta(&desired.attributes, &lb.attributes);
    if !attrs.is_empty() {
        changes.push(Change::ModifyAttributes(attrs));
    }

    // Target groups first: listeners are created or moved onto them.
    let by_name: BTreeMap<&str, &ActualTargetGroup> = actual
        .target_groups
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    for tg in &desired.target_groups {
        match by_name.get(tg.name.as_str()) {
            None => {
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
            Some(have) => {
                let h = &have.health;
                let w = &tg.health;
                let path_differs = w.protocol != "TCP" && w.path != h.path;
                if w.port != h.port
                    || w.healthy != h.healthy
                    || w.unhealthy != h.unhealthy
                    || path_differs
                {
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
        }
    }

    // Listeners, one per port: modify in place (protocol, certificate,
    // policy, target group), create the missing, delete the extra.
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

    // Target groups no listener will use any more.
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
    // Managed → BYO (or no group): the owned group goes once the NLB left it.
    if desired.owned_group.is_none()
        && let Some(g) = &actual.owned_group
        && tags::is_owned(&g.tags, cluster_id)
    {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
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

/// What the backend nodes' groups must admit for one NLB (default mode, no
/// NLB security group): client traffic to the node ports from the source
/// ranges, health checks from the NLB subnets, ICMP for path MTU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRules {
    pub client: BTreeSet<Rule>,
    pub health: BTreeSet<Rule>,
}

/// Pure: upstream's rule set for one NLB. Health rules are left out when the
/// client rules already cover them (TCP from anywhere on the same ports).
pub fn node_rules(
    desired: &Desired,
    source_ranges: &[Ipv4Net],
    subnet_cidrs: &[Ipv4Net],
) -> NodeRules {
    let mut out = NodeRules::default();
    let mut health_ports = BTreeSet::new();
    let mut tcp_ports = BTreeSet::new();
    for tg in &desired.target_groups {
        health_ports.insert(tg.health.port.parse::<i32>().unwrap_or(tg.port));
        // Each group's own protocol(s) on its own port (upstream opens every
        // port for UDP once one port is UDP; this is exact).
        let protocols: &[&str] = match tg.protocol.as_str() {
            "UDP" => &["udp"],
            "TCP_UDP" => &["tcp", "udp"],
            _ => &["tcp"],
        };
        for proto in protocols {
            if *proto == "tcp" {
                tcp_ports.insert(tg.port);
            }
            for range in source_ranges {
                out.client.insert(Rule {
                    protocol: proto.to_string(),
                    from: tg.port,
                    to: tg.port,
                    source: Source::Cidr(*range),
                });
            }
        }
    }
    let covered = source_ranges == [Ipv4Net::default()] && health_ports.is_subset(&tcp_ports);
    if !covered {
        for port in &health_ports {
            for cidr in subnet_cidrs {
                out.health.insert(Rule {
                    protocol: "tcp".into(),
                    from: *port,
                    to: *port,
                    source: Source::Cidr(*cidr),
                });
            }
        }
    }
    out
}

/// One node group's rules with their descriptions, as read from EC2.
pub type DescribedRules = BTreeMap<Rule, String>;

/// Rule changes on one node group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleChanges {
    pub authorize: DescribedRules,
    pub revoke: BTreeSet<Rule>,
}

impl RuleChanges {
    pub fn is_empty(&self) -> bool {
        self.authorize.is_empty() && self.revoke.is_empty()
    }
}

/// Pure: the rule changes on one node group for NLB `lb_name`. `want` is
/// `None` when the group backs no node of this NLB (or the NLB is going):
/// every rule of ours for it is revoked. Rules with other descriptions are
/// never touched; MTU rules follow every NLB's client rules in the group.
pub fn node_group_changes(
    lb_name: &str,
    have: &DescribedRules,
    want: Option<&NodeRules>,
) -> RuleChanges {
    let client_desc = client_rule_description(lb_name);
    let health_desc = health_rule_description(lb_name);
    let mut want_all: DescribedRules = BTreeMap::new();
    if let Some(w) = want {
        for r in &w.client {
            want_all.insert(r.clone(), client_desc.clone());
        }
        for r in &w.health {
            // A rule that is also a client rule keeps the client description.
            want_all
                .entry(r.clone())
                .or_insert_with(|| health_desc.clone());
        }
    }
    let mut out = RuleChanges::default();
    for (r, d) in &want_all {
        if !have.contains_key(r) {
            out.authorize.insert(r.clone(), d.clone());
        }
    }
    for (r, d) in have {
        if (*d == client_desc || *d == health_desc) && !want_all.contains_key(r) {
            out.revoke.insert(r.clone());
        }
    }
    // MTU: ICMP 3/4 from every CIDR of a client rule left in the group.
    let mut client_cidrs = BTreeSet::new();
    for (r, d) in have {
        if d.starts_with(CLIENT_RULE_PREFIX)
            && !out.revoke.contains(r)
            && let Source::Cidr(c) = r.source
        {
            client_cidrs.insert(c);
        }
    }
    for (r, d) in &out.authorize {
        if d.starts_with(CLIENT_RULE_PREFIX)
            && let Source::Cidr(c) = r.source
        {
            client_cidrs.insert(c);
        }
    }
    let mtu_want: BTreeSet<Rule> = client_cidrs
        .into_iter()
        .map(|c| Rule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            source: Source::Cidr(c),
        })
        .collect();
    for r in &mtu_want {
        if !have.contains_key(r) {
            out.authorize.insert(r.clone(), MTU_RULE.to_string());
        }
    }
    for (r, d) in have {
        if d == MTU_RULE && !mtu_want.contains(r) {
            out.revoke.insert(r.clone());
        }
    }
    out
}

pub mod io;

#[cfg(test)]
mod tests;
