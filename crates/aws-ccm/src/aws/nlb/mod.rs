//! Network Load Balancers (elbv2): names and the types of desired and actual
//! state. The pure desired state and plan are in [`plan`], the node groups'
//! rules in [`node_rules`]; the reads are in [`read`], the calls that apply a
//! plan in [`io`].
//!
//! Load balancer and target group names and tags are the Go CCM's (`a` + UID;
//! `k8s-<ns:8>-<name:8>-<sha1:10>` over the same inputs), so an NLB it made is
//! adopted with no create call, and vice versa.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;
use sha1::{Digest, Sha1};

use super::elb::{GroupRef, OwnedGroup};
use super::security_groups::{self as sg, Rule, Source};

/// Rule descriptions on node groups, as upstream: they mark the rules this
/// controller wrote (and may revoke).
pub(crate) const CLIENT_RULE_PREFIX: &str = "kubernetes.io/rule/nlb/client";
pub(crate) const HEALTH_RULE_PREFIX: &str = "kubernetes.io/rule/nlb/health";
pub(crate) const MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";
/// This CCM's (not the Go CCM's) description of a node group's rule that
/// admits everything from an NLB's security group (`NLBNodeIngress =
/// LoadBalancerGroup`). It names no NLB: NLBs that share a group share the
/// rule.
pub(crate) const GROUP_RULE: &str = "aws-ccm/rule/nlb/from-group";

const ATTR_CROSS_ZONE: &str = "load_balancing.cross_zone.enabled";
const ATTR_ACCESS_LOGS: &str = "access_logs.s3.enabled";
const ATTR_ACCESS_LOGS_BUCKET: &str = "access_logs.s3.bucket";
const ATTR_ACCESS_LOGS_PREFIX: &str = "access_logs.s3.prefix";
const ATTR_DELETION_PROTECTION: &str = crate::aws::annotations::DELETION_PROTECTION;

/// Registration calls carry at most this many targets (as upstream).
const TARGET_CHUNK: usize = 100;

pub(crate) fn client_rule_description(lb_name: &str) -> String {
    format!("{CLIENT_RULE_PREFIX}={lb_name}")
}

pub(crate) fn health_rule_description(lb_name: &str) -> String {
    format!("{HEALTH_RULE_PREFIX}={lb_name}")
}

/// The IP protocols a listener or target group protocol carries.
fn ip_protocols(protocol: &str) -> &'static [&'static str] {
    match protocol {
        "UDP" => &["udp"],
        "TCP_UDP" => &["tcp", "udp"],
        _ => &["tcp"],
    }
}

/// A rule admitting IP protocol `protocol` on `port` from `cidr`.
fn port_rule(protocol: &str, port: i32, cidr: Ipv4Net) -> Rule {
    Rule {
        protocol: protocol.to_string(),
        from: port,
        to: port,
        source: Source::Cidr(cidr),
    }
}

/// ICMP destination unreachable, fragmentation needed (path MTU
/// discovery) from `cidr`.
fn mtu_rule(cidr: Ipv4Net) -> Rule {
    Rule {
        protocol: "icmp".into(),
        from: 3,
        to: 4,
        source: Source::Cidr(cidr),
    }
}

/// Upstream's `buildTargetGroupName`: `k8s-{ns:8}-{name:8}-{sha1:10}`, the
/// hash over everything a target group cannot change in place.
#[allow(clippy::too_many_arguments)]
fn target_group_name(
    cluster_id: &str,
    namespace: &str,
    name: &str,
    service_port: i32,
    node_port: i32,
    target_protocol: &str,
    health_protocol: &str,
    health_interval: i32,
) -> String {
    let parts = [
        cluster_id,
        namespace,
        name,
        &service_port.to_string(),
        &node_port.to_string(),
        target_protocol,
        "instance",
        health_protocol,
        &health_interval.to_string(),
    ];
    hashed_name::<Sha1>(namespace, name, &parts)
}

/// Upstream's `GetSecurityGroupNameForNLB`: the managed group of an NLB in
/// `NLBSecurityGroupMode = Managed`, `k8s-{ns:8}-{name:8}-{sha256:10}` over
/// the cluster name (`--cluster-name`), the Service's name, namespace and UID.
pub(crate) fn managed_group_name(
    cluster_name: &str,
    namespace: &str,
    name: &str,
    uid: &str,
) -> String {
    let parts = [cluster_name, name, namespace, uid];
    hashed_name::<sha2::Sha256>(namespace, name, &parts)
}

/// `k8s-<ns:8>-<name:8>-` and the first ten hex digits of hash `D` over
/// `parts`, one after the other.
fn hashed_name<D: Digest>(namespace: &str, name: &str, parts: &[&str]) -> String {
    let mut h = D::new();
    for part in parts {
        h.update(part.as_bytes());
    }
    let hash = hex::encode(h.finalize());
    format!("{}{}", name_prefix(namespace, name), &hash[..10])
}

/// The managed group's description, as upstream.
const MANAGED_GROUP_DESCRIPTION: &str = "[k8s] Managed SecurityGroup for LoadBalancer";

/// `k8s-<ns:8>-<name:8>-`: what every target group of the Service starts with.
pub(crate) fn target_group_prefix(service_key: &str) -> String {
    let (namespace, name) = service_key.split_once('/').unwrap_or(("", service_key));
    name_prefix(namespace, name)
}

/// `k8s-<ns:8>-<name:8>-`, each part's first eight ASCII letters and digits.
fn name_prefix(namespace: &str, name: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-", clean(namespace), clean(name))
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP`, `HTTP`, `HTTPS`.
    pub(crate) protocol: String,
    /// `traffic-port` or a port number.
    pub(crate) port: String,
    /// Only for HTTP/HTTPS.
    pub(crate) path: Option<String>,
    pub(crate) interval: i32,
    pub(crate) healthy: i32,
    pub(crate) unhealthy: i32,
    /// `HealthCheckTimeoutSeconds`: sent only when set (cloud.conf
    /// `NLBListenerSettings = true` and the annotation, or AWS's default
    /// restored); read from AWS always.
    pub(crate) timeout: Option<i32>,
}

/// AWS's health-check timeout of an NLB target group whose health check
/// uses `protocol` (ELBv2 `CreateTargetGroup`: 6 s for HTTP, 10 s for TCP
/// and HTTPS).
fn default_health_timeout(protocol: &str) -> i32 {
    if protocol == "HTTP" { 6 } else { 10 }
}

/// With cloud.conf `NLBListenerSettings = true`, the health-check timeout
/// the Service asks for (`None`: none, so one this CCM applied returns to
/// AWS's default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HealthTimeout {
    want: Option<i32>,
}

/// The ALPN policies ELBv2 takes on a TLS listener (`AlpnPolicy`), AWS's
/// default last.
pub(crate) const ALPN_POLICIES: [&str; 5] = [
    "HTTP1Only",
    "HTTP2Only",
    "HTTP2Optional",
    "HTTP2Preferred",
    "None",
];
/// AWS's ALPN policy of a TLS listener created without one.
const ALPN_NONE: &str = "None";

/// With cloud.conf `NLBListenerSettings = true`, the ALPN policy the
/// Service asks for on its TLS listeners (`None`: none, or one AWS would
/// refuse; a policy this CCM applied then returns to AWS's `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Alpn {
    pub(crate) want: Option<String>,
}

/// The listener attribute this CCM manages on an NLB's TCP listeners: the
/// only one ELBv2 documents for an NLB (`ListenerAttribute`), taken on TCP
/// listeners only (a TLS listener's idle timeout is fixed at 350 s).
const LISTENER_IDLE_TIMEOUT: &str = "tcp.idle_timeout.seconds";
/// AWS's TCP idle timeout of a listener that sets none.
const LISTENER_IDLE_TIMEOUT_DEFAULT: &str = "350";
/// The TCP idle timeouts, in seconds, ELBv2 takes.
const LISTENER_IDLE_TIMEOUTS: std::ops::RangeInclusive<u32> = 60..=6000;

/// With cloud.conf `NLBListenerSettings = true`, the listener attributes
/// the Service asks for, by listener port (only what AWS takes: see
/// `desired::listener_attribute_settings`; a listener absent here whose
/// attributes this CCM applied returns to AWS's defaults).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ListenerAttributes {
    pub(crate) want: BTreeMap<i32, BTreeMap<String, String>>,
    /// Listeners whose annotation AWS would refuse (a Warning says so):
    /// their attributes and their record are left as they are.
    held: BTreeSet<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetGroup {
    pub(crate) name: String,
    /// `TCP`, `UDP`, `TLS`, `TCP_UDP`.
    pub(crate) protocol: String,
    /// The node port.
    pub(crate) port: i32,
    pub(crate) health: HealthCheck,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub(crate) port: i32,
    /// `TCP`, `UDP`, `TLS`, `TCP_UDP`.
    pub(crate) protocol: String,
    pub(crate) certificate: Option<String>,
    pub(crate) ssl_policy: Option<String>,
    /// Name of the target group it forwards to.
    pub(crate) target_group: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SubnetMapping {
    subnet: String,
    allocation_id: Option<String>,
    private_ipv4: Option<String>,
}

/// What AWS must look like for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub(crate) name: String,
    internal: bool,
    /// `ipv4` or `dualstack`.
    ip_address_type: String,
    subnet_mappings: Vec<SubnetMapping>,
    /// Whether the mappings carry addresses (then they are create-time only).
    pinned_addresses: bool,
    /// The tags every resource of the NLB carries (ownership, Service name,
    /// the user's): written by the creates and kept by the plan.
    pub(crate) tags: BTreeMap<String, String>,
    /// The `additional-resource-tags` pairs applied (the user's part of
    /// `tags`): what [`crate::aws::tags::MANAGED_TAGS_TAG`] records.
    pub(crate) additional_tags: BTreeMap<String, String>,
    pub(crate) listeners: Vec<Listener>,
    pub(crate) target_groups: Vec<TargetGroup>,
    /// Only the keys the Service sets.
    pub(crate) target_group_attributes: BTreeMap<String, String>,
    pub(crate) attributes: BTreeMap<String, String>,
    /// `aws-load-balancer-attributes: deletion_protection.enabled`, when the
    /// Service writes it (also in `attributes`).
    deletion_protection: Option<bool>,
    pub(crate) instances: BTreeSet<String>,
    /// In `NLBSecurityGroupMode = Managed`, the NLB's groups: the
    /// `security-groups` annotation's, else the owned (managed) one. Outside
    /// it, none: an NLB is created without groups and its groups are left as
    /// they are, as upstream.
    pub(crate) security_groups: Vec<GroupRef>,
    pub(crate) owned_group: Option<OwnedGroup>,
    /// `NLBSecurityGroupMode = Managed`. Even then an existing NLB without
    /// groups is left without (AWS adds groups only at creation; upstream
    /// skips such an NLB).
    pub(crate) groups_managed: bool,
    /// The create-time settings, recorded on the NLB this CCM creates.
    applied: crate::aws::applied::Applied,
    /// `None` without cloud.conf `NLBListenerSettings = true`: the timeout
    /// is neither sent nor compared, as the Go CCM leaves it.
    health_timeout: Option<HealthTimeout>,
    /// `None` without cloud.conf `NLBListenerSettings = true`: the TLS
    /// listeners' ALPN policy is neither sent nor compared, as the Go CCM
    /// leaves it.
    pub(crate) alpn: Option<Alpn>,
    /// `None` without cloud.conf `NLBListenerSettings = true`: listener
    /// attributes are neither sent nor recorded, as the Go CCM leaves them.
    pub(crate) listener_attributes: Option<ListenerAttributes>,
}

impl Desired {
    /// The tags of a resource the plan creates for it.
    pub(crate) fn create_tags(&self) -> BTreeMap<String, String> {
        crate::aws::tags::at_creation(&self.tags, &self.additional_tags)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ActualListener {
    pub(crate) arn: String,
    pub(crate) port: i32,
    pub(crate) protocol: String,
    pub(crate) certificate: Option<String>,
    pub(crate) ssl_policy: Option<String>,
    pub(crate) target_group_arn: Option<String>,
    /// `AlpnPolicy` as AWS reports it (`None`: it reports none).
    pub(crate) alpn: Option<String>,
    /// Read only when the NLB's tags follow an annotation (see
    /// `load_balancers::sweep`); `None`: not read, left as they are.
    pub(crate) tags: Option<crate::aws::tags::Tags>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActualLb {
    pub(crate) arn: String,
    pub(crate) dns_name: String,
    pub(crate) internal: bool,
    pub(crate) ip_address_type: String,
    pub(crate) subnet_mappings: BTreeSet<SubnetMapping>,
    /// Whether AWS listed the zones' addresses at all (moto does not).
    pub(crate) addresses_reported: bool,
    pub(crate) security_groups: Vec<String>,
    pub(crate) tags: crate::aws::tags::Tags,
    pub(crate) attributes: BTreeMap<String, String>,
    pub(crate) listeners: Vec<ActualListener>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActualTargetGroup {
    pub(crate) arn: String,
    pub(crate) name: String,
    protocol: String,
    port: i32,
    pub(crate) health: HealthCheck,
    pub(crate) tags: crate::aws::tags::Tags,
    attributes: BTreeMap<String, String>,
    /// Registered instance IDs (on `port`), draining ones left out.
    targets: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Actual {
    pub(crate) lb: Option<ActualLb>,
    /// The Service's target groups: those behind the LB's listeners and any
    /// found by name.
    pub(crate) target_groups: Vec<ActualTargetGroup>,
    /// The owned (managed) group `k8s-elb-<name>`, when it exists.
    pub(crate) owned_group: Option<sg::SecurityGroup>,
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
    /// Keys the controller applied that the annotation no longer names, on
    /// a target group or listener (`arn`) or, without one, the NLB.
    RemoveTags {
        arn: Option<String>,
        keys: BTreeSet<String>,
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
    /// `alpn`: the ALPN policy to send (a TLS listener with cloud.conf
    /// `NLBListenerSettings = true` only).
    CreateListener {
        listener: Listener,
        tags: BTreeMap<String, String>,
        alpn: Option<String>,
    },
    ModifyListener {
        arn: String,
        listener: Listener,
        alpn: Option<String>,
    },
    /// `ModifyListenerAttributes` of the listener on `port`: `arn`, or
    /// (`None`) the one this plan creates.
    ModifyListenerAttributes {
        arn: Option<String>,
        port: i32,
        attributes: BTreeMap<String, String>,
    },
    DeleteListener {
        arn: String,
    },
    DeleteTargetGroup {
        arn: String,
        name: String,
    },
}

pub(crate) mod attributes;
pub(crate) mod desired;
pub(crate) mod io;
pub(crate) mod node_rules;
pub mod plan;
pub mod read;
pub(crate) mod shared_group;

#[cfg(test)]
mod tests;
