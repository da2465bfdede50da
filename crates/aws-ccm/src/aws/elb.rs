//! Classic ELB: desired state from a Service spec, actual state from AWS in a
//! handful of reads, a pure plan between them, and the calls that apply it.
//!
//! Names, tags, policies and group names are the Go CCM's, so a load balancer
//! it made is adopted as it is (no create call) and vice versa.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;

use super::annotations::{BackendProtocol, HealthCheckPort, LoadBalancerSpec};
use super::security_groups::{self as sg, Rule, Source};
use super::tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode};

pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// `a` + the Service UID without dashes, cut to 32 characters (upstream's
/// `cloudprovider.DefaultLoadBalancerName`).
pub fn load_balancer_name(uid: &str) -> String {
    let mut name: String = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    name
}

/// The owned security group's name.
pub fn owned_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

pub fn ssl_policy_name(policy: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{policy}")
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    pub lb_port: i32,
    /// Upper case: TCP, SSL, HTTP, HTTPS.
    pub protocol: String,
    pub instance_port: i32,
    pub instance_protocol: String,
    pub ssl_cert: Option<String>,
}

impl Listener {
    pub fn is_tls(&self) -> bool {
        self.protocol == "SSL" || self.protocol == "HTTPS"
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP:30080`, `HTTP:32000/healthz`.
    pub target: String,
    pub healthy_threshold: i32,
    pub unhealthy_threshold: i32,
    pub interval: i32,
    pub timeout: i32,
}

/// Attributes the controller manages; `None` fields are left as AWS has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub cross_zone: bool,
    pub access_log_enabled: bool,
    pub access_log_interval: Option<i32>,
    pub access_log_bucket: Option<String>,
    pub access_log_prefix: Option<String>,
    pub draining_enabled: bool,
    pub draining_timeout: Option<i32>,
    pub idle_timeout: i32,
}

impl Attributes {
    /// What a freshly created classic ELB has (API defaults).
    pub fn aws_defaults() -> Attributes {
        Attributes {
            cross_zone: false,
            access_log_enabled: false,
            access_log_interval: None,
            access_log_bucket: None,
            access_log_prefix: None,
            draining_enabled: false,
            draining_timeout: None,
            idle_timeout: 60,
        }
    }

    /// Whether `actual` already has every value `self` asks for.
    pub fn satisfied_by(&self, actual: &Attributes) -> bool {
        let opt = |want: &Option<i32>, have: &Option<i32>| want.is_none() || want == have;
        let opt_s = |want: &Option<String>, have: &Option<String>| want.is_none() || want == have;
        self.cross_zone == actual.cross_zone
            && self.access_log_enabled == actual.access_log_enabled
            && opt(&self.access_log_interval, &actual.access_log_interval)
            && opt_s(&self.access_log_bucket, &actual.access_log_bucket)
            && opt_s(&self.access_log_prefix, &actual.access_log_prefix)
            && self.draining_enabled == actual.draining_enabled
            && opt(&self.draining_timeout, &actual.draining_timeout)
            && self.idle_timeout == actual.idle_timeout
    }
}

/// A security group named in a plan: a known ID, or the owned group (whose ID
/// exists only once the plan's create step ran).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupRef {
    Owned,
    Id(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedGroup {
    pub name: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    pub rules: BTreeSet<Rule>,
}

/// What AWS must look like for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub name: String,
    /// Whose ownership tag a group must carry to be deleted.
    pub cluster_id: String,
    pub internal: bool,
    pub listeners: Vec<Listener>,
    pub health_check: HealthCheck,
    pub attributes: Attributes,
    pub subnets: BTreeSet<String>,
    /// In order: the LB's own group (owned, annotated or cloud.conf), then extras.
    pub groups: Vec<GroupRef>,
    pub owned_group: Option<OwnedGroup>,
    pub tags: BTreeMap<String, String>,
    pub proxy_protocol: bool,
    pub ssl_negotiation_policy: Option<String>,
    pub instances: BTreeSet<String>,
    /// Backend nodes' groups that must admit the LB's group; `None` when
    /// `DisableSecurityGroupIngress` is set.
    pub node_groups: Option<BTreeSet<String>>,
}

/// A classic ELB as AWS reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActualLb {
    pub name: String,
    pub dns_name: String,
    pub internal: bool,
    /// Listener and the policies set on it.
    pub listeners: Vec<(Listener, Vec<String>)>,
    pub backend_policies: BTreeMap<i32, Vec<String>>,
    /// Policies defined on the load balancer.
    pub policies: BTreeSet<String>,
    pub health_check: Option<HealthCheck>,
    pub subnets: BTreeSet<String>,
    pub security_groups: Vec<String>,
    pub instances: BTreeSet<String>,
    pub attributes: Attributes,
    pub tags: BTreeMap<String, String>,
}

/// Everything the plan compares against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Actual {
    pub lb: Option<ActualLb>,
    /// The owned group, when it exists and carries this cluster's tag.
    pub owned_group: Option<sg::SecurityGroup>,
    /// Node groups (by ID) that already admit the LB's own group.
    pub node_groups_with_rule: BTreeSet<String>,
    /// When the LB's own group is shared (the `security-groups` annotation or
    /// cloud.conf `ElbSecurityGroup`): the node groups that other load
    /// balancers using it still reach, so their rule stays. `None` when not
    /// looked up: then no rule from a shared group is revoked.
    pub shared_group_needed: Option<BTreeSet<String>>,
    /// For deletion: the shared group the node rules admit (the load
    /// balancer's first group when it has no owned group).
    pub shared_lb_group: Option<String>,
    /// Node groups admitting the owned group, read only when the owned group
    /// is no longer wanted (`security-groups` or `ElbSecurityGroup` replaced it).
    pub owned_group_node_rules: BTreeSet<String>,
}

/// One mutating step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    CreateSecurityGroup(OwnedGroup),
    AuthorizeIngress {
        group: GroupRef,
        rules: BTreeSet<Rule>,
    },
    RevokeIngress {
        group: GroupRef,
        rules: BTreeSet<Rule>,
    },
    DeleteLoadBalancer {
        reason: String,
    },
    CreateLoadBalancer {
        listeners: Vec<Listener>,
        subnets: BTreeSet<String>,
        groups: Vec<GroupRef>,
        internal: bool,
        tags: BTreeMap<String, String>,
    },
    DeleteListeners(Vec<i32>),
    CreateListeners(Vec<Listener>),
    AttachSubnets(BTreeSet<String>),
    DetachSubnets(BTreeSet<String>),
    ApplySecurityGroups(Vec<GroupRef>),
    AddTags(BTreeMap<String, String>),
    CreatePolicy {
        name: String,
        type_name: String,
        attributes: Vec<(String, String)>,
    },
    SetBackendPolicies {
        instance_port: i32,
        policies: Vec<String>,
    },
    SetListenerPolicies {
        lb_port: i32,
        policies: Vec<String>,
    },
    ConfigureHealthCheck(HealthCheck),
    ModifyAttributes(Attributes),
    RegisterInstances(BTreeSet<String>),
    DeregisterInstances(BTreeSet<String>),
    /// Let everything from the LB's group into a backend node's group.
    AuthorizeNodeIngress {
        node_group: String,
        from: GroupRef,
    },
    RevokeNodeIngress {
        node_group: String,
        from: GroupRef,
    },
    DeleteSecurityGroup(String),
}

/// Listeners for the Service ports, as upstream's `buildListener`.
pub fn listeners(spec: &LoadBalancerSpec) -> Vec<Listener> {
    spec.ports
        .iter()
        .map(|p| {
            let ssl_port = spec
                .ssl_ports
                .as_ref()
                .is_none_or(|set| set.contains(p.port, &p.name));
            let (protocol, instance_protocol, cert) = match (&spec.ssl_cert, spec.backend_protocol)
            {
                (Some(cert), backend) if ssl_port => match backend {
                    None => ("SSL", "TCP", Some(cert.clone())),
                    Some(BackendProtocol::Http) => ("HTTPS", "HTTP", Some(cert.clone())),
                    Some(BackendProtocol::Https) => ("HTTPS", "HTTPS", Some(cert.clone())),
                    Some(BackendProtocol::Ssl) => ("SSL", "SSL", Some(cert.clone())),
                    Some(BackendProtocol::Tcp) => ("SSL", "TCP", Some(cert.clone())),
                },
                (_, Some(BackendProtocol::Http)) => ("HTTP", "HTTP", None),
                _ => ("TCP", "TCP", None),
            };
            Listener {
                lb_port: p.port,
                protocol: protocol.into(),
                instance_port: p.node_port,
                instance_protocol: instance_protocol.into(),
                ssl_cert: cert,
            }
        })
        .collect()
}

/// The health check, as upstream: Local services probe kube-proxy's
/// `healthCheckNodePort` over HTTP; otherwise TCP (SSL for an SSL/HTTPS
/// backend) on the first node port, or the shared probe from cloud.conf; the
/// healthcheck-* annotations override any part of it.
pub fn health_check(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> HealthCheck {
    let first_port = spec.ports.first().map(|p| p.node_port).unwrap_or(0);
    let (mut protocol, mut port, mut path) =
        if let Some(hc_port) = spec.local_health_check_node_port {
            ("HTTP".to_string(), hc_port, "/healthz".to_string())
        } else if cloud.health_probe_mode == HealthProbeMode::Shared {
            (
                "HTTP".to_string(),
                i32::from(cloud.shared_health_probe_port),
                cloud.shared_health_probe_path.clone(),
            )
        } else {
            let proto = match spec.backend_protocol {
                Some(BackendProtocol::Https) | Some(BackendProtocol::Ssl) => "SSL",
                _ => "TCP",
            };
            (proto.to_string(), first_port, String::new())
        };
    let o = &spec.health_check;
    if let Some(p) = &o.protocol {
        protocol = p.clone();
    }
    match o.port {
        Some(HealthCheckPort::Port(p)) => port = p,
        Some(HealthCheckPort::TrafficPort) if spec.local_health_check_node_port.is_some() => {
            port = first_port
        }
        _ => {}
    }
    if protocol == "HTTP" || protocol == "HTTPS" {
        if path.is_empty() {
            path = "/".into();
        }
        if let Some(p) = &o.path {
            path = p.clone();
        }
    } else {
        path.clear();
    }
    HealthCheck {
        target: format!("{protocol}:{port}{path}"),
        healthy_threshold: o.healthy_threshold.unwrap_or(2),
        unhealthy_threshold: o.unhealthy_threshold.unwrap_or(6),
        interval: o.interval.unwrap_or(10),
        timeout: o.timeout.unwrap_or(5),
    }
}

/// Inputs read from AWS that shape the desired state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    pub subnets: BTreeSet<String>,
    pub instances: BTreeSet<String>,
    pub node_groups: BTreeSet<String>,
}

/// Pure: what AWS must look like for this Service.
pub fn desired(
    spec: &LoadBalancerSpec,
    service_key: &str,
    uid: &str,
    cluster_id: &str,
    cloud: &CloudConfig,
    env: &Environment,
) -> Desired {
    let name = load_balancer_name(uid);
    let tags = tags::owned_tags(cluster_id, service_key, &spec.additional_tags);
    let (mut groups, owned_group) = if !spec.security_groups.is_empty() {
        (
            spec.security_groups
                .iter()
                .cloned()
                .map(GroupRef::Id)
                .collect::<Vec<_>>(),
            None,
        )
    } else if let Some(global) = &cloud.elb_security_group {
        (vec![GroupRef::Id(global.clone())], None)
    } else {
        let ports: Vec<i32> = spec.ports.iter().map(|p| p.port).collect();
        (
            vec![GroupRef::Owned],
            Some(OwnedGroup {
                name: owned_group_name(&name),
                description: format!("Security group for Kubernetes ELB {name} ({service_key})"),
                tags: tags.clone(),
                rules: sg::load_balancer_rules(&ports, &spec.source_ranges),
            }),
        )
    };
    for extra in &spec.extra_security_groups {
        let r = GroupRef::Id(extra.clone());
        if !groups.contains(&r) {
            groups.push(r);
        }
    }
    Desired {
        name,
        cluster_id: cluster_id.to_string(),
        internal: spec.internal,
        listeners: listeners(spec),
        health_check: health_check(spec, cloud),
        attributes: Attributes {
            cross_zone: spec.cross_zone,
            access_log_enabled: spec.access_log_enabled,
            access_log_interval: spec.access_log_emit_interval,
            access_log_bucket: spec.access_log_bucket.clone(),
            access_log_prefix: spec.access_log_prefix.clone(),
            draining_enabled: spec.draining_enabled,
            draining_timeout: spec.draining_timeout,
            idle_timeout: spec.idle_timeout.unwrap_or(60),
        },
        subnets: env.subnets.clone(),
        groups,
        owned_group,
        tags,
        proxy_protocol: spec.proxy_protocol,
        ssl_negotiation_policy: spec.ssl_negotiation_policy.clone(),
        instances: env.instances.clone(),
        node_groups: (!cloud.disable_security_group_ingress).then(|| env.node_groups.clone()),
    }
}

fn resolve_group(r: &GroupRef, owned: Option<&str>) -> Option<String> {
    match r {
        GroupRef::Id(id) => Some(id.clone()),
        GroupRef::Owned => owned.map(str::to_string),
    }
}

/// Pure: the changes that take `actual` to `desired`, in the order to apply
/// them. Empty when nothing differs.
pub fn plan(desired: &Desired, actual: &Actual) -> Vec<Change> {
    let mut changes = Vec::new();
    let owned_id = actual.owned_group.as_ref().map(|g| g.id.as_str());

    // The owned group and its rules come first: the LB is created with it.
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
            changes.push(Change::AuthorizeIngress {
                group: GroupRef::Owned,
                rules: add,
            });
        }
        if !remove.is_empty() {
            changes.push(Change::RevokeIngress {
                group: GroupRef::Owned,
                rules: remove,
            });
        }
    }

    // A classic ELB cannot change its scheme: recreate it.
    let mut lb = actual.lb.clone();
    if let Some(current) = &lb
        && current.internal != desired.internal
    {
        changes.push(Change::DeleteLoadBalancer {
            reason: format!(
                "scheme changes from {} to {}",
                scheme(current.internal),
                scheme(desired.internal)
            ),
        });
        lb = None;
    }
    let lb = match lb {
        Some(lb) => lb,
        None => {
            changes.push(Change::CreateLoadBalancer {
                listeners: desired.listeners.clone(),
                subnets: desired.subnets.clone(),
                groups: desired.groups.clone(),
                internal: desired.internal,
                tags: desired.tags.clone(),
            });
            ActualLb {
                name: desired.name.clone(),
                dns_name: String::new(),
                internal: desired.internal,
                listeners: desired
                    .listeners
                    .iter()
                    .map(|l| (l.clone(), vec![]))
                    .collect(),
                backend_policies: BTreeMap::new(),
                policies: BTreeSet::new(),
                health_check: None,
                subnets: desired.subnets.clone(),
                // Created with the owned group's real ID when it exists (a
                // recreate), so no ApplySecurityGroups follows.
                security_groups: desired
                    .groups
                    .iter()
                    .filter_map(|g| resolve_group(g, Some(owned_id.unwrap_or("<owned>"))))
                    .collect(),
                instances: BTreeSet::new(),
                attributes: Attributes::aws_defaults(),
                tags: desired.tags.clone(),
            }
        }
    };

    // Listeners: replace any that differ, by load balancer port.
    let have: BTreeMap<i32, &Listener> = lb.listeners.iter().map(|(l, _)| (l.lb_port, l)).collect();
    let want: BTreeMap<i32, &Listener> = desired.listeners.iter().map(|l| (l.lb_port, l)).collect();
    let delete: Vec<i32> = have
        .iter()
        .filter(|(port, l)| want.get(port) != Some(l))
        .map(|(p, _)| *p)
        .collect();
    let create: Vec<Listener> = want
        .iter()
        .filter(|(port, l)| have.get(port) != Some(l))
        .map(|(_, l)| (*l).clone())
        .collect();
    if !delete.is_empty() {
        changes.push(Change::DeleteListeners(delete));
    }
    if !create.is_empty() {
        changes.push(Change::CreateListeners(create.clone()));
    }

    let attach: BTreeSet<String> = desired.subnets.difference(&lb.subnets).cloned().collect();
    let detach: BTreeSet<String> = lb.subnets.difference(&desired.subnets).cloned().collect();
    // Detach first, as upstream: a CLB takes one subnet per zone, so moving
    // to another subnet in the same zone fails while the old one is attached.
    if !detach.is_empty() {
        changes.push(Change::DetachSubnets(detach));
    }
    if !attach.is_empty() {
        changes.push(Change::AttachSubnets(attach));
    }

    let want_groups: BTreeSet<String> = desired
        .groups
        .iter()
        .filter_map(|g| resolve_group(g, Some(owned_id.unwrap_or("<owned>"))))
        .collect();
    let have_groups: BTreeSet<String> = lb.security_groups.iter().cloned().collect();
    if want_groups != have_groups {
        changes.push(Change::ApplySecurityGroups(desired.groups.clone()));
    }

    let missing_tags: BTreeMap<String, String> = desired
        .tags
        .iter()
        .filter(|(k, v)| lb.tags.get(*k) != Some(v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !missing_tags.is_empty() {
        changes.push(Change::AddTags(missing_tags));
    }

    // Proxy protocol on every backend port, or on none.
    if desired.proxy_protocol && !lb.policies.contains(PROXY_PROTOCOL_POLICY) {
        changes.push(Change::CreatePolicy {
            name: PROXY_PROTOCOL_POLICY.into(),
            type_name: "ProxyProtocolPolicyType".into(),
            attributes: vec![("ProxyProtocol".into(), "true".into())],
        });
    }
    let instance_ports: BTreeSet<i32> = desired.listeners.iter().map(|l| l.instance_port).collect();
    for port in &instance_ports {
        let current = lb.backend_policies.get(port).cloned().unwrap_or_default();
        let has = current.iter().any(|p| p == PROXY_PROTOCOL_POLICY);
        if has != desired.proxy_protocol {
            let policies = if desired.proxy_protocol {
                vec![PROXY_PROTOCOL_POLICY.to_string()]
            } else {
                vec![]
            };
            changes.push(Change::SetBackendPolicies {
                instance_port: *port,
                policies,
            });
        }
    }
    for (port, policies) in &lb.backend_policies {
        if !instance_ports.contains(port) && policies.iter().any(|p| p == PROXY_PROTOCOL_POLICY) {
            changes.push(Change::SetBackendPolicies {
                instance_port: *port,
                policies: vec![],
            });
        }
    }

    if let Some(policy) = &desired.ssl_negotiation_policy {
        let name = ssl_policy_name(policy);
        if !lb.policies.contains(&name) {
            changes.push(Change::CreatePolicy {
                name: name.clone(),
                type_name: "SSLNegotiationPolicyType".into(),
                attributes: vec![("Reference-Security-Policy".into(), policy.clone())],
            });
        }
        let current: BTreeMap<i32, &Vec<String>> =
            lb.listeners.iter().map(|(l, p)| (l.lb_port, p)).collect();
        for l in desired.listeners.iter().filter(|l| l.is_tls()) {
            let recreated = create.iter().any(|c| c.lb_port == l.lb_port);
            let has = !recreated && current.get(&l.lb_port).is_some_and(|p| p.contains(&name));
            if !has {
                changes.push(Change::SetListenerPolicies {
                    lb_port: l.lb_port,
                    policies: vec![name.clone()],
                });
            }
        }
    }

    if lb.health_check.as_ref() != Some(&desired.health_check) {
        changes.push(Change::ConfigureHealthCheck(desired.health_check.clone()));
    }
    if !desired.attributes.satisfied_by(&lb.attributes) {
        changes.push(Change::ModifyAttributes(desired.attributes.clone()));
    }

    // Backend nodes' groups admit the LB's own group.
    if let Some(want_nodes) = &desired.node_groups {
        let lb_group = desired.groups.first().cloned();
        if let Some(lb_group) = lb_group {
            let rule_source = match &lb_group {
                GroupRef::Owned => GroupRef::Owned,
                GroupRef::Id(id) => GroupRef::Id(id.clone()),
            };
            for g in want_nodes.difference(&actual.node_groups_with_rule) {
                changes.push(Change::AuthorizeNodeIngress {
                    node_group: g.clone(),
                    from: rule_source.clone(),
                });
            }
            // A rule from the owned group serves only this load balancer; one
            // from a shared group is revoked only when no other load balancer
            // using that group still reaches the node group.
            let unneeded = actual.node_groups_with_rule.difference(want_nodes);
            let revoke: Vec<&String> = match (&lb_group, &actual.shared_group_needed) {
                (GroupRef::Owned, _) => unneeded.collect(),
                (GroupRef::Id(_), Some(needed)) => {
                    unneeded.filter(|g| !needed.contains(*g)).collect()
                }
                (GroupRef::Id(_), None) => Vec::new(),
            };
            for g in revoke {
                changes.push(Change::RevokeNodeIngress {
                    node_group: g.clone(),
                    from: rule_source.clone(),
                });
            }
        }
    }

    let register: BTreeSet<String> = desired
        .instances
        .difference(&lb.instances)
        .cloned()
        .collect();
    let deregister: BTreeSet<String> = lb
        .instances
        .difference(&desired.instances)
        .cloned()
        .collect();
    if !register.is_empty() {
        changes.push(Change::RegisterInstances(register));
    }
    if !deregister.is_empty() {
        changes.push(Change::DeregisterInstances(deregister));
    }

    // An owned group replaced by configured groups: once the load balancer
    // no longer uses it (ApplySecurityGroups above), its node rules and the
    // group itself go.
    if desired.owned_group.is_none()
        && let Some(g) = &actual.owned_group
        && tags::is_owned(&g.tags, &desired.cluster_id)
    {
        for node_group in &actual.owned_group_node_rules {
            changes.push(Change::RevokeNodeIngress {
                node_group: node_group.clone(),
                from: GroupRef::Owned,
            });
        }
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
}

/// Pure: what deleting the Service's load balancer takes. Nothing without this
/// cluster's ownership tag is deleted.
pub fn plan_delete(actual: &Actual, cluster_id: &str) -> Vec<Change> {
    let mut changes = Vec::new();
    let owned_group = actual
        .owned_group
        .as_ref()
        .filter(|g| tags::is_owned(&g.tags, cluster_id));
    if owned_group.is_some() {
        for g in &actual.node_groups_with_rule {
            changes.push(Change::RevokeNodeIngress {
                node_group: g.clone(),
                from: GroupRef::Owned,
            });
        }
    } else if let (Some(shared), Some(needed), Some(lb)) = (
        &actual.shared_lb_group,
        &actual.shared_group_needed,
        &actual.lb,
    ) && tags::is_owned(&lb.tags, cluster_id)
    {
        for g in actual.node_groups_with_rule.difference(needed) {
            changes.push(Change::RevokeNodeIngress {
                node_group: g.clone(),
                from: GroupRef::Id(shared.clone()),
            });
        }
    }
    if let Some(lb) = &actual.lb
        && tags::is_owned(&lb.tags, cluster_id)
    {
        changes.push(Change::DeleteLoadBalancer {
            reason: "the Service no longer asks for it".into(),
        });
    }
    if let Some(g) = owned_group {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
}

fn scheme(internal: bool) -> &'static str {
    if internal {
        "internal"
    } else {
        "internet-facing"
    }
}

/// A short, stable description of a change for logs and dry runs.
pub fn describe(change: &Change) -> String {
    match change {
        Change::CreateSecurityGroup(g) => format!("create security group {}", g.name),
        Change::AuthorizeIngress { rules, .. } => {
            format!("authorize {} rule(s) on the LB group", rules.len())
        }
        Change::RevokeIngress { rules, .. } => {
            format!("revoke {} rule(s) on the LB group", rules.len())
        }
        Change::DeleteLoadBalancer { reason } => format!("delete load balancer ({reason})"),
        Change::CreateLoadBalancer { .. } => "create load balancer".into(),
        Change::DeleteListeners(p) => format!("delete listeners {p:?}"),
        Change::CreateListeners(l) => format!(
            "create listeners {:?}",
            l.iter().map(|l| l.lb_port).collect::<Vec<_>>()
        ),
        Change::AttachSubnets(s) => format!("attach subnets {s:?}"),
        Change::DetachSubnets(s) => format!("detach subnets {s:?}"),
        Change::ApplySecurityGroups(_) => "apply security groups".into(),
        Change::AddTags(t) => format!("add tags {:?}", t.keys().collect::<Vec<_>>()),
        Change::CreatePolicy { name, .. } => format!("create policy {name}"),
        Change::SetBackendPolicies { instance_port, .. } => {
            format!("set backend policies on {instance_port}")
        }
        Change::SetListenerPolicies { lb_port, .. } => {
            format!("set listener policies on {lb_port}")
        }
        Change::ConfigureHealthCheck(h) => format!("configure health check {}", h.target),
        Change::ModifyAttributes(_) => "modify attributes".into(),
        Change::RegisterInstances(i) => format!("register {} instance(s)", i.len()),
        Change::DeregisterInstances(i) => format!("deregister {} instance(s)", i.len()),
        Change::AuthorizeNodeIngress { node_group, .. } => {
            format!("allow the LB group into {node_group}")
        }
        Change::RevokeNodeIngress { node_group, .. } => {
            format!("revoke the LB group from {node_group}")
        }
        Change::DeleteSecurityGroup(id) => format!("delete security group {id}"),
    }
}

/// Source ranges of the owned group's rules (for tests and status).
pub fn rule_sources(rules: &BTreeSet<Rule>) -> BTreeSet<Ipv4Net> {
    rules
        .iter()
        .filter_map(|r| match r.source {
            Source::Cidr(c) => Some(c),
            Source::Group(_) => None,
        })
        .collect()
}

/// The calls that read a classic ELB and apply a plan to it.
pub mod io {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    use aws_sdk_elasticloadbalancing::types as elbt;

    use super::{Actual, ActualLb, Attributes, Change, GroupRef, HealthCheck, Listener};
    use crate::aws::client::AwsClient;
    use crate::aws::client::errors::AwsError;
    use crate::aws::client::operations::Operation;
    use crate::aws::security_groups::{self as sg, Rule};

    fn build_err(what: &str, e: impl std::fmt::Display) -> AwsError {
        AwsError::NotFound {
            operation: Operation::ElbCreateLoadBalancer,
            what: format!("a valid {what} ({e})"),
        }
    }

    fn to_sdk_listener(l: &Listener) -> Result<elbt::Listener, AwsError> {
        elbt::Listener::builder()
            .protocol(&l.protocol)
            .load_balancer_port(l.lb_port)
            .instance_protocol(&l.instance_protocol)
            .instance_port(l.instance_port)
            .set_ssl_certificate_id(l.ssl_cert.clone())
            .build()
            .map_err(|e| build_err("listener", e))
    }

    fn to_sdk_tags(tags: &BTreeMap<String, String>) -> Result<Vec<elbt::Tag>, AwsError> {
        tags.iter()
            .map(|(k, v)| {
                elbt::Tag::builder()
                    .key(k)
                    .value(v)
                    .build()
                    .map_err(|e| build_err("tag", e))
            })
            .collect()
    }

    fn instances(ids: &BTreeSet<String>) -> Vec<elbt::Instance> {
        ids.iter()
            .map(|id| elbt::Instance::builder().instance_id(id).build())
            .collect()
    }

    /// The load balancer with its attributes and tags (three reads), or
    /// `None` when it does not exist.
    pub async fn read_lb(aws: &AwsClient, name: &str) -> Result<Option<ActualLb>, AwsError> {
        let out = match aws
            .elb(Operation::ElbDescribeLoadBalancers, |c| {
                c.describe_load_balancers().load_balancer_names(name).send()
            })
            .await
        {
            Ok(out) => out,
            Err(e) if e.is_not_found() || e.code() == Some("LoadBalancerNotFound") => {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let Some(lb) = out.load_balancer_descriptions().first() else {
            return Ok(None);
        };
        let attrs = aws
            .elb(Operation::ElbDescribeLoadBalancerAttributes, |c| {
                c.describe_load_balancer_attributes()
                    .load_balancer_name(name)
                    .send()
            })
            .await?;
        let tags = aws
            .elb(Operation::ElbDescribeTags, |c| {
                c.describe_tags().load_balancer_names(name).send()
            })
            .await?;
        let a = attrs.load_balancer_attributes();
        let attributes = Attributes {
            cross_zone: a
                .and_then(|a| a.cross_zone_load_balancing())
                .is_some_and(|c| c.enabled()),
            access_log_enabled: a.and_then(|a| a.access_log()).is_some_and(|l| l.enabled()),
            access_log_interval: a
                .and_then(|a| a.access_log())
                .and_then(|l| l.emit_interval()),
            access_log_bucket: a
                .and_then(|a| a.access_log())
                .and_then(|l| l.s3_bucket_name())
                .map(str::to_string),
            access_log_prefix: a
                .and_then(|a| a.access_log())
                .and_then(|l| l.s3_bucket_prefix())
                .map(str::to_string),
            draining_enabled: a
                .and_then(|a| a.connection_draining())
                .is_some_and(|d| d.enabled()),
            draining_timeout: a
                .and_then(|a| a.connection_draining())
                .and_then(|d| d.timeout()),
            idle_timeout: a
                .and_then(|a| a.connection_settings())
                .map(|s| s.idle_timeout())
                .unwrap_or(60),
        };
        let upper = |s: &str| s.to_ascii_uppercase();
        Ok(Some(ActualLb {
            name: name.to_string(),
            dns_name: lb.dns_name().unwrap_or_default().to_string(),
            internal: lb.scheme() == Some("internal"),
            listeners: lb
                .listener_descriptions()
                .iter()
                .filter_map(|d| {
                    let l = d.listener()?;
                    Some((
                        Listener {
                            lb_port: l.load_balancer_port(),
                            protocol: upper(l.protocol()),
                            instance_port: l.instance_port(),
                            instance_protocol: upper(l.instance_protocol().unwrap_or(l.protocol())),
                            ssl_cert: l.ssl_certificate_id().map(str::to_string),
                        },
                        d.policy_names().to_vec(),
                    ))
                })
                .collect(),
            backend_policies: lb
                .backend_server_descriptions()
                .iter()
                .filter_map(|b| Some((b.instance_port()?, b.policy_names().to_vec())))
                .collect(),
            policies: lb
                .policies()
                .map(|p| p.other_policies().iter().cloned().collect())
                .unwrap_or_default(),
            health_check: lb.health_check().map(|h| HealthCheck {
                target: h.target().to_string(),
                healthy_threshold: h.healthy_threshold(),
                unhealthy_threshold: h.unhealthy_threshold(),
                interval: h.interval(),
                timeout: h.timeout(),
            }),
            subnets: lb.subnets().iter().cloned().collect(),
            security_groups: lb.security_groups().to_vec(),
            instances: lb
                .instances()
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_string))
                .collect(),
            attributes,
            tags: tags
                .tag_descriptions()
                .iter()
                .flat_map(|d| d.tags())
                .map(|t| {
                    (
                        t.key().to_string(),
                        t.value().unwrap_or_default().to_string(),
                    )
                })
                .collect(),
        }))
    }

    /// Every classic ELB in the region with its security groups and
    /// instances (paginated): only read when a shared group's node rule may
    /// have to go, to see which other load balancers still use it.
    pub async fn list_all(aws: &AwsClient) -> Result<Vec<ActualLb>, AwsError> {
        let mut out = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let page = aws
                .elb(Operation::ElbDescribeLoadBalancers, |c| {
                    c.describe_load_balancers()
                        .set_marker(marker.clone())
                        .send()
                })
                .await?;
            for lb in page.load_balancer_descriptions() {
                out.push(ActualLb {
                    name: lb.load_balancer_name().unwrap_or_default().to_string(),
                    dns_name: lb.dns_name().unwrap_or_default().to_string(),
                    internal: lb.scheme() == Some("internal"),
                    listeners: Vec::new(),
                    backend_policies: BTreeMap::new(),
                    policies: BTreeSet::new(),
                    health_check: None,
                    subnets: lb.subnets().iter().cloned().collect(),
                    security_groups: lb.security_groups().to_vec(),
                    instances: lb
                        .instances()
                        .iter()
                        .filter_map(|i| i.instance_id().map(str::to_string))
                        .collect(),
                    attributes: Attributes::aws_defaults(),
                    tags: BTreeMap::new(),
                });
            }
            marker = page.next_marker().map(str::to_string);
            if marker.is_none() {
                return Ok(out);
            }
        }
    }

    /// Applies a plan in order. Returns the DNS name of a load balancer it
    /// created, if any.
    pub async fn apply(
        aws: &AwsClient,
        name: &str,
        vpc_id: Option<&str>,
        actual: &Actual,
        changes: &[Change],
    ) -> Result<Option<String>, AwsError> {
        let mut owned: Option<String> = actual.owned_group.as_ref().map(|g| g.id.clone());
        let mut dns = None;
        let resolve = |r: &GroupRef, owned: &Option<String>| -> Result<String, AwsError> {
            match r {
                GroupRef::Id(id) => Ok(id.clone()),
                GroupRef::Owned => owned.clone().ok_or_else(|| AwsError::NotFound {
                    operation: Operation::Ec2CreateSecurityGroup,
                    what: format!("the owned security group of {name}"),
                }),
            }
        };
        for change in changes {
            tracing::info!(load_balancer = name, change = %super::describe(change), "applying");
            match change {
                Change::CreateSecurityGroup(g) => {
                    let vpc = vpc_id.unwrap_or_default();
                    owned = Some(sg::create(aws, vpc, &g.name, &g.description, &g.tags).await?);
                }
                Change::AuthorizeIngress { group, rules } => {
                    sg::authorize(aws, &resolve(group, &owned)?, rules).await?
                }
                Change::RevokeIngress { group, rules } => {
                    sg::revoke(aws, &resolve(group, &owned)?, rules).await?
                }
                Change::AuthorizeNodeIngress { node_group, from } => {
                    let rule = Rule::all_from_group(&resolve(from, &owned)?);
                    sg::authorize(aws, node_group, &BTreeSet::from([rule])).await?
                }
                Change::RevokeNodeIngress { node_group, from } => {
                    let rule = Rule::all_from_group(&resolve(from, &owned)?);
                    sg::revoke(aws, node_group, &BTreeSet::from([rule])).await?
                }
                Change::DeleteLoadBalancer { .. } => {
                    aws.elb(Operation::ElbDeleteLoadBalancer, |c| {
                        c.delete_load_balancer().load_balancer_name(name).send()
                    })
                    .await?;
                }
                Change::CreateLoadBalancer {
                    listeners,
                    subnets,
                    groups,
                    internal,
                    tags,
                } => {
                    let listeners = listeners
                        .iter()
                        .map(to_sdk_listener)
                        .collect::<Result<Vec<_>, _>>()?;
                    let groups = groups
                        .iter()
                        .map(|g| resolve(g, &owned))
                        .collect::<Result<Vec<_>, _>>()?;
                    let tags = to_sdk_tags(tags)?;
                    let out = aws
                        .elb(Operation::ElbCreateLoadBalancer, |c| {
                            c.create_load_balancer()
                                .load_balancer_name(name)
                                .set_listeners(Some(listeners.clone()))
                                .set_subnets(Some(subnets.iter().cloned().collect()))
                                .set_security_groups(Some(groups.clone()))
                                .set_scheme(internal.then(|| "internal".to_string()))
                                .set_tags(Some(tags.clone()))
                                .send()
                        })
                        .await?;
                    dns = out.dns_name().map(str::to_string);
                }
                Change::DeleteListeners(ports) => {
                    aws.elb(Operation::ElbDeleteLoadBalancerListeners, |c| {
                        c.delete_load_balancer_listeners()
                            .load_balancer_name(name)
                            .set_load_balancer_ports(Some(ports.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::CreateListeners(listeners) => {
                    let listeners = listeners
                        .iter()
                        .map(to_sdk_listener)
                        .collect::<Result<Vec<_>, _>>()?;
                    aws.elb(Operation::ElbCreateLoadBalancerListeners, |c| {
                        c.create_load_balancer_listeners()
                            .load_balancer_name(name)
                            .set_listeners(Some(listeners.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::AttachSubnets(s) => {
                    aws.elb(Operation::ElbAttachLoadBalancerToSubnets, |c| {
                        c.attach_load_balancer_to_subnets()
                            .load_balancer_name(name)
                            .set_subnets(Some(s.iter().cloned().collect()))
                            .send()
                    })
                    .await?;
                }
                Change::DetachSubnets(s) => {
                    aws.elb(Operation::ElbDetachLoadBalancerFromSubnets, |c| {
                        c.detach_load_balancer_from_subnets()
                            .load_balancer_name(name)
                            .set_subnets(Some(s.iter().cloned().collect()))
                            .send()
                    })
                    .await?;
                }
                Change::ApplySecurityGroups(groups) => {
                    let groups = groups
                        .iter()
                        .map(|g| resolve(g, &owned))
                        .collect::<Result<Vec<_>, _>>()?;
                    aws.elb(Operation::ElbApplySecurityGroupsToLoadBalancer, |c| {
                        c.apply_security_groups_to_load_balancer()
                            .load_balancer_name(name)
                            .set_security_groups(Some(groups.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::AddTags(tags) => {
                    let tags = to_sdk_tags(tags)?;
                    aws.elb(Operation::ElbAddTags, |c| {
                        c.add_tags()
                            .load_balancer_names(name)
                            .set_tags(Some(tags.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::CreatePolicy {
                    name: policy,
                    type_name,
                    attributes,
                } => {
                    let attrs: Vec<elbt::PolicyAttribute> = attributes
                        .iter()
                        .map(|(k, v)| {
                            elbt::PolicyAttribute::builder()
                                .attribute_name(k)
                                .attribute_value(v)
                                .build()
                        })
                        .collect();
                    let result = aws
                        .elb(Operation::ElbCreateLoadBalancerPolicy, |c| {
                            c.create_load_balancer_policy()
                                .load_balancer_name(name)
                                .policy_name(policy)
                                .policy_type_name(type_name)
                                .set_policy_attributes(Some(attrs.clone()))
                                .send()
                        })
                        .await;
                    match result {
                        Err(e) if !e.is_already_exists() => return Err(e),
                        _ => {}
                    }
                }
                Change::SetBackendPolicies {
                    instance_port,
                    policies,
                } => {
                    aws.elb(Operation::ElbSetLoadBalancerPoliciesForBackendServer, |c| {
                        c.set_load_balancer_policies_for_backend_server()
                            .load_balancer_name(name)
                            .instance_port(*instance_port)
                            .set_policy_names(Some(policies.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::SetListenerPolicies { lb_port, policies } => {
                    aws.elb(Operation::ElbSetLoadBalancerPoliciesOfListener, |c| {
                        c.set_load_balancer_policies_of_listener()
                            .load_balancer_name(name)
                            .load_balancer_port(*lb_port)
                            .set_policy_names(Some(policies.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::ConfigureHealthCheck(h) => {
                    let hc = elbt::HealthCheck::builder()
                        .target(&h.target)
                        .interval(h.interval)
                        .timeout(h.timeout)
                        .healthy_threshold(h.healthy_threshold)
                        .unhealthy_threshold(h.unhealthy_threshold)
                        .build()
                        .map_err(|e| build_err("health check", e))?;
                    aws.elb(Operation::ElbConfigureHealthCheck, |c| {
                        c.configure_health_check()
                            .load_balancer_name(name)
                            .health_check(hc.clone())
                            .send()
                    })
                    .await?;
                }
                Change::ModifyAttributes(a) => {
                    let attrs = elbt::LoadBalancerAttributes::builder()
                        .cross_zone_load_balancing(
                            elbt::CrossZoneLoadBalancing::builder()
                                .enabled(a.cross_zone)
                                .build(),
                        )
                        .access_log(
                            elbt::AccessLog::builder()
                                .enabled(a.access_log_enabled)
                                .set_emit_interval(a.access_log_interval)
                                .set_s3_bucket_name(a.access_log_bucket.clone())
                                .set_s3_bucket_prefix(a.access_log_prefix.clone())
                                .build(),
                        )
                        .connection_draining(
                            elbt::ConnectionDraining::builder()
                                .enabled(a.draining_enabled)
                                .set_timeout(a.draining_timeout)
                                .build(),
                        )
                        .connection_settings(
                            elbt::ConnectionSettings::builder()
                                .idle_timeout(a.idle_timeout)
                                .build()
                                .map_err(|e| build_err("connection settings", e))?,
                        )
                        .build();
                    aws.elb(Operation::ElbModifyLoadBalancerAttributes, |c| {
                        c.modify_load_balancer_attributes()
                            .load_balancer_name(name)
                            .load_balancer_attributes(attrs.clone())
                            .send()
                    })
                    .await?;
                }
                Change::RegisterInstances(ids) => {
                    let list = instances(ids);
                    aws.elb(Operation::ElbRegisterInstancesWithLoadBalancer, |c| {
                        c.register_instances_with_load_balancer()
                            .load_balancer_name(name)
                            .set_instances(Some(list.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::DeregisterInstances(ids) => {
                    let list = instances(ids);
                    aws.elb(Operation::ElbDeregisterInstancesFromLoadBalancer, |c| {
                        c.deregister_instances_from_load_balancer()
                            .load_balancer_name(name)
                            .set_instances(Some(list.clone()))
                            .send()
                    })
                    .await?;
                }
                Change::DeleteSecurityGroup(id) => delete_group_patiently(aws, id).await?,
            }
        }
        Ok(dns)
    }

    /// Deletes a group, retrying `DependencyViolation` for a bounded time: the
    /// network interfaces of a just-deleted load balancer release it late.
    pub async fn delete_group_patiently(aws: &AwsClient, id: &str) -> Result<(), AwsError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        let mut wait = Duration::from_millis(500);
        loop {
            match sg::delete(aws, id).await {
                Err(e)
                    if e.code() == Some("DependencyViolation")
                        && tokio::time::Instant::now() + wait < deadline =>
                {
                    tracing::info!(
                        group = id,
                        "security group still in use; retrying its deletion"
                    );
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
                other => return other,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::annotations::{self as ann, tests::service};

    fn spec(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> LoadBalancerSpec {
        LoadBalancerSpec::from_service(&service(annotations, ports)).unwrap()
    }

    fn env() -> Environment {
        Environment {
            subnets: BTreeSet::from(["subnet-a".to_string(), "subnet-b".to_string()]),
            instances: BTreeSet::from(["i-1".to_string(), "i-2".to_string()]),
            node_groups: BTreeSet::from(["sg-node".to_string()]),
        }
    }

    fn want(annotations: &[(&str, &str)], ports: &[(i32, i32)], env: &Environment) -> Desired {
        desired(
            &spec(annotations, ports),
            "default/web",
            "0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef",
            "c1",
            &CloudConfig::default(),
            env,
        )
    }

    /// AWS exactly as `d` asks.
    fn converged(d: &Desired) -> Actual {
        let owned = d.owned_group.as_ref().map(|g| sg::SecurityGroup {
            id: "sg-owned".into(),
            name: g.name.clone(),
            vpc_id: Some("vpc-1".into()),
            tags: g.tags.clone(),
            ingress: g.rules.clone(),
            descriptions: BTreeMap::new(),
            owner_id: None,
        });
        let ports: BTreeSet<i32> = d.listeners.iter().map(|l| l.instance_port).collect();
        let mut policies = BTreeSet::new();
        if d.proxy_protocol {
            policies.insert(PROXY_PROTOCOL_POLICY.to_string());
        }
        let ssl = d.ssl_negotiation_policy.as_deref().map(ssl_policy_name);
        policies.extend(ssl.clone());
        Actual {
            lb: Some(ActualLb {
                name: d.name.clone(),
                dns_name: "x.elb.amazonaws.com".into(),
                internal: d.internal,
                listeners: d
                    .listeners
                    .iter()
                    .map(|l| {
                        (
                            l.clone(),
                            if l.is_tls() {
                                ssl.clone().into_iter().collect()
                            } else {
                                vec![]
                            },
                        )
                    })
                    .collect(),
                backend_policies: if d.proxy_protocol {
                    ports
                        .iter()
                        .map(|p| (*p, vec![PROXY_PROTOCOL_POLICY.to_string()]))
                        .collect()
                } else {
                    BTreeMap::new()
                },
                policies,
                health_check: Some(d.health_check.clone()),
                subnets: d.subnets.clone(),
                security_groups: d
                    .groups
                    .iter()
                    .filter_map(|g| resolve_group(g, Some("sg-owned")))
                    .collect(),
                instances: d.instances.clone(),
                attributes: Attributes {
                    access_log_interval: Some(60),
                    ..d.attributes.clone()
                },
                tags: d.tags.clone(),
            }),
            owned_group: owned,
            node_groups_with_rule: d.node_groups.clone().unwrap_or_default(),
            shared_group_needed: None,
            shared_lb_group: None,
            owned_group_node_rules: BTreeSet::new(),
        }
    }

    #[test]
    fn name_is_upstreams() {
        assert_eq!(
            load_balancer_name("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef"),
            "a0b9c8e4a12344f6e9a7babcdefabcde"
        );
        assert_eq!(
            load_balancer_name("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef").len(),
            32
        );
    }

    #[test]
    fn a_new_service_creates_group_lb_and_wiring() {
        let d = want(&[], &[(80, 30080)], &env());
        let changes = plan(&d, &Actual::default());
        let kinds: Vec<String> = changes.iter().map(describe).collect();
        assert!(
            matches!(changes[0], Change::CreateSecurityGroup(ref g) if g.name == "k8s-elb-a0b9c8e4a12344f6e9a7babcdefabcde"),
            "{kinds:?}"
        );
        assert!(
            matches!(changes[1], Change::AuthorizeIngress { ref rules, .. } if rules.len() == 2)
        );
        assert!(matches!(
            changes[2],
            Change::CreateLoadBalancer {
                internal: false,
                ..
            }
        ));
        assert!(changes.contains(&Change::ConfigureHealthCheck(HealthCheck {
            target: "TCP:30080".into(),
            healthy_threshold: 2,
            unhealthy_threshold: 6,
            interval: 10,
            timeout: 5
        })));
        assert!(changes.contains(&Change::AuthorizeNodeIngress {
            node_group: "sg-node".into(),
            from: GroupRef::Owned
        }));
        assert!(changes.contains(&Change::RegisterInstances(env().instances)));
        // Defaults need no attribute call.
        assert!(
            !changes
                .iter()
                .any(|c| matches!(c, Change::ModifyAttributes(_))),
            "{kinds:?}"
        );
    }

    #[test]
    fn an_unchanged_service_plans_nothing() {
        for a in [
            vec![],
            vec![(ann::PROXY_PROTOCOL, "*"), (ann::CROSS_ZONE, "true")],
            vec![
                (ann::SSL_CERT, "arn:cert"),
                (ann::SSL_NEGOTIATION_POLICY, "ELBSecurityPolicy-2016-08"),
            ],
            vec![
                (ann::SECURITY_GROUPS, "sg-x"),
                (ann::EXTRA_SECURITY_GROUPS, "sg-y"),
            ],
        ] {
            let d = want(&a, &[(80, 30080), (443, 30443)], &env());
            assert_eq!(plan(&d, &converged(&d)), vec![], "{a:?}");
        }
    }

    #[test]
    fn updates_are_minimal() {
        let before = want(&[], &[(80, 30080)], &env());
        let actual = converged(&before);

        // A new port: one listener, its rule, nothing else.
        let after = want(&[], &[(80, 30080), (8080, 30081)], &env());
        let changes = plan(&after, &actual);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(
            matches!(&changes[0], Change::AuthorizeIngress { rules, .. } if rules.len() == 1 && rules.iter().all(|r| r.from == 8080))
        );
        assert!(
            matches!(&changes[1], Change::CreateListeners(l) if l.len() == 1 && l[0].lb_port == 8080)
        );

        // A node leaves and another comes: register/deregister the delta only.
        let mut e = env();
        e.instances = BTreeSet::from(["i-2".to_string(), "i-3".to_string()]);
        let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
        assert_eq!(
            changes,
            vec![
                Change::RegisterInstances(BTreeSet::from(["i-3".to_string()])),
                Change::DeregisterInstances(BTreeSet::from(["i-1".to_string()])),
            ]
        );

        // Source ranges: swap the rules, nothing else.
        let changes = plan(
            &want(
                &[(ann::SOURCE_RANGES, "10.0.0.0/8")],
                &[(80, 30080)],
                &env(),
            ),
            &actual,
        );
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(matches!(changes[0], Change::AuthorizeIngress { .. }));
        assert!(matches!(changes[1], Change::RevokeIngress { .. }));

        // Node groups no longer used lose the rule; shared groups keep theirs.
        let mut e = env();
        e.node_groups = BTreeSet::from(["sg-node2".to_string()]);
        let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
        assert_eq!(
            changes,
            vec![
                Change::AuthorizeNodeIngress {
                    node_group: "sg-node2".into(),
                    from: GroupRef::Owned
                },
                Change::RevokeNodeIngress {
                    node_group: "sg-node".into(),
                    from: GroupRef::Owned
                },
            ]
        );
    }

    #[test]
    fn a_shared_groups_node_rule_goes_only_when_no_other_load_balancer_needs_it() {
        let mut e = env();
        e.node_groups = BTreeSet::from(["sg-node".to_string(), "sg-node2".to_string()]);
        let shared = [(ann::SECURITY_GROUPS, "sg-shared")];
        let mut actual = converged(&want(&shared, &[(80, 30080)], &e));
        // sg-node2's nodes left this load balancer.
        let after = want(&shared, &[(80, 30080)], &env());
        let revoke_node2 = Change::RevokeNodeIngress {
            node_group: "sg-node2".into(),
            from: GroupRef::Id("sg-shared".into()),
        };
        // Not looked up: the rule stays.
        assert_eq!(plan(&after, &actual), vec![]);
        // Another load balancer with sg-shared still reaches sg-node2.
        actual.shared_group_needed = Some(BTreeSet::from(["sg-node2".to_string()]));
        assert_eq!(plan(&after, &actual), vec![]);
        // Nobody else does: revoked.
        actual.shared_group_needed = Some(BTreeSet::new());
        assert_eq!(plan(&after, &actual), vec![revoke_node2.clone()]);

        // Deleting: the same rule, from the shared group, never the group itself.
        actual.owned_group = None;
        actual.shared_lb_group = Some("sg-shared".into());
        actual.shared_group_needed = Some(BTreeSet::from(["sg-node".to_string()]));
        assert_eq!(
            plan_delete(&actual, "c1"),
            vec![
                revoke_node2,
                Change::DeleteLoadBalancer {
                    reason: "the Service no longer asks for it".into()
                },
            ]
        );
    }

    #[test]
    fn configured_groups_replace_the_owned_group() {
        let mut actual = converged(&want(&[], &[(80, 30080)], &env()));
        actual.owned_group_node_rules = BTreeSet::from(["sg-node".to_string()]);
        // The rule the node group has is from the owned group, not sg-mine.
        actual.node_groups_with_rule.clear();
        let after = want(&[(ann::SECURITY_GROUPS, "sg-mine")], &[(80, 30080)], &env());
        assert_eq!(
            plan(&after, &actual),
            vec![
                Change::ApplySecurityGroups(vec![GroupRef::Id("sg-mine".into())]),
                Change::AuthorizeNodeIngress {
                    node_group: "sg-node".into(),
                    from: GroupRef::Id("sg-mine".into())
                },
                Change::RevokeNodeIngress {
                    node_group: "sg-node".into(),
                    from: GroupRef::Owned
                },
                Change::DeleteSecurityGroup("sg-owned".into()),
            ]
        );
        // Not this cluster's: left alone.
        actual.owned_group.as_mut().unwrap().tags.clear();
        assert!(
            !plan(&after, &actual)
                .iter()
                .any(|c| matches!(c, Change::DeleteSecurityGroup(_)))
        );
    }

    #[test]
    fn scheme_change_recreates_and_subnets_change_in_place() {
        let before = want(&[], &[(80, 30080)], &env());
        let actual = converged(&before);
        let changes = plan(
            &want(&[(ann::INTERNAL, "true")], &[(80, 30080)], &env()),
            &actual,
        );
        assert!(
            matches!(changes[0], Change::DeleteLoadBalancer { .. }),
            "{changes:?}"
        );
        assert!(matches!(
            changes[1],
            Change::CreateLoadBalancer { internal: true, .. }
        ));
        // The new load balancer is created with the existing owned group:
        // nothing to re-apply, no group to create.
        assert!(
            !changes.iter().any(|c| matches!(
                c,
                Change::ApplySecurityGroups(_) | Change::CreateSecurityGroup(_)
            )),
            "{changes:?}"
        );

        let mut e = env();
        e.subnets = BTreeSet::from(["subnet-a".to_string(), "subnet-c".to_string()]);
        let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
        assert_eq!(
            changes,
            vec![
                Change::DetachSubnets(BTreeSet::from(["subnet-b".to_string()])),
                Change::AttachSubnets(BTreeSet::from(["subnet-c".to_string()])),
            ]
        );
    }

    #[test]
    fn listeners_follow_ssl_and_backend_annotations() {
        let l = listeners(&spec(
            &[(ann::SSL_CERT, "arn:c"), (ann::SSL_PORTS, "443")],
            &[(80, 30080), (443, 30443)],
        ));
        assert_eq!(
            (l[0].protocol.as_str(), l[0].instance_protocol.as_str()),
            ("TCP", "TCP")
        );
        assert_eq!(
            (l[1].protocol.as_str(), l[1].instance_protocol.as_str()),
            ("SSL", "TCP")
        );
        assert_eq!(l[1].ssl_cert.as_deref(), Some("arn:c"));
        let l = listeners(&spec(
            &[(ann::SSL_CERT, "arn:c"), (ann::BACKEND_PROTOCOL, "http")],
            &[(443, 30443)],
        ));
        assert_eq!(
            (l[0].protocol.as_str(), l[0].instance_protocol.as_str()),
            ("HTTPS", "HTTP")
        );
        let l = listeners(&spec(&[(ann::BACKEND_PROTOCOL, "http")], &[(80, 30080)]));
        assert_eq!(
            (l[0].protocol.as_str(), l[0].ssl_cert.as_ref()),
            ("HTTP", None)
        );
    }

    #[test]
    fn health_check_modes() {
        let cloud = CloudConfig::default();
        let mut svc = service(&[], &[(80, 30080)]);
        let s = svc.spec.as_mut().unwrap();
        s.external_traffic_policy = Some("Local".into());
        s.health_check_node_port = Some(32000);
        let local = LoadBalancerSpec::from_service(&svc).unwrap();
        assert_eq!(health_check(&local, &cloud).target, "HTTP:32000/healthz");

        let shared = CloudConfig {
            health_probe_mode: HealthProbeMode::Shared,
            ..CloudConfig::default()
        };
        assert_eq!(
            health_check(&spec(&[], &[(80, 30080)]), &shared).target,
            "HTTP:10256/healthz"
        );

        let hc = health_check(
            &spec(
                &[
                    (ann::HC_PROTOCOL, "http"),
                    (ann::HC_PATH, "/ready"),
                    (ann::HC_INTERVAL, "30"),
                    (ann::HC_PORT, "8080"),
                ],
                &[(80, 30080)],
            ),
            &cloud,
        );
        assert_eq!((hc.target.as_str(), hc.interval), ("HTTP:8080/ready", 30));
        assert_eq!(
            health_check(
                &spec(&[(ann::BACKEND_PROTOCOL, "ssl")], &[(80, 30080)]),
                &cloud
            )
            .target,
            "SSL:30080"
        );
    }

    #[test]
    fn cloud_conf_group_and_disabled_ingress() {
        let cloud = CloudConfig {
            elb_security_group: Some("sg-global".into()),
            disable_security_group_ingress: true,
            ..CloudConfig::default()
        };
        let d = desired(
            &spec(&[], &[(80, 30080)]),
            "default/web",
            "u",
            "c1",
            &cloud,
            &env(),
        );
        assert_eq!(d.groups, vec![GroupRef::Id("sg-global".into())]);
        assert!(d.owned_group.is_none() && d.node_groups.is_none());
        let changes = plan(&d, &Actual::default());
        assert!(!changes.iter().any(|c| matches!(
            c,
            Change::CreateSecurityGroup(_) | Change::AuthorizeNodeIngress { .. }
        )));
    }

    #[test]
    fn deletion_touches_only_what_this_cluster_owns() {
        let d = want(&[], &[(80, 30080)], &env());
        let actual = converged(&d);
        let changes = plan_delete(&actual, "c1");
        assert_eq!(
            changes,
            vec![
                Change::RevokeNodeIngress {
                    node_group: "sg-node".into(),
                    from: GroupRef::Owned
                },
                Change::DeleteLoadBalancer {
                    reason: "the Service no longer asks for it".into()
                },
                Change::DeleteSecurityGroup("sg-owned".into()),
            ]
        );
        assert!(plan_delete(&actual, "other-cluster").is_empty());
    }
}
