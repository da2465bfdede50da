//! Classic ELB: names and the types of desired and actual state. The pure
//! desired state and plan are in [`plan`]; the reads and the calls that apply
//! a plan, through the one door, in [`io`].
//!
//! Names, tags, policies and group names are the Go CCM's, so a load balancer
//! it made is adopted as it is (no create call) and vice versa.

use std::collections::{BTreeMap, BTreeSet};

use super::security_groups::{self as sg, Rule};
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;

const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// `a` + the Service UID without dashes, cut to 32 characters (upstream's
/// `cloudprovider.DefaultLoadBalancerName`).
pub fn load_balancer_name(uid: &str) -> String {
    let mut name: String = format!("a{}", uid.replace('-', ""));
    name.truncate(32);
    name
}

/// The owned security group's name.
pub(crate) fn owned_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

fn ssl_policy_name(policy: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{policy}")
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Listener {
    lb_port: i32,
    /// Upper case: TCP, SSL, HTTP, HTTPS.
    pub(crate) protocol: String,
    instance_port: i32,
    pub(crate) instance_protocol: String,
    ssl_cert: Option<String>,
}

impl Listener {
    fn is_tls(&self) -> bool {
        self.protocol == "SSL" || self.protocol == "HTTPS"
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    /// `TCP:30080`, `HTTP:32000/healthz`.
    pub(crate) target: String,
    healthy_threshold: i32,
    unhealthy_threshold: i32,
    pub(crate) interval: i32,
    pub(crate) timeout: i32,
}

/// Attributes the controller manages; `None` fields are left as AWS has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attributes {
    cross_zone: bool,
    access_log_enabled: bool,
    access_log_interval: Option<i32>,
    access_log_bucket: Option<String>,
    access_log_prefix: Option<String>,
    draining_enabled: bool,
    draining_timeout: Option<i32>,
    idle_timeout: i32,
}

/// What a freshly created classic ELB has (API defaults).
impl Default for Attributes {
    fn default() -> Attributes {
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
}

impl Attributes {
    /// Whether `actual` already has every value `self` asks for.
    fn satisfied_by(&self, actual: &Attributes) -> bool {
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

impl GroupRef {
    /// References to the known groups `ids`, in order.
    pub(crate) fn ids(ids: &[String]) -> Vec<GroupRef> {
        ids.iter().cloned().map(GroupRef::Id).collect()
    }

    /// The ID a plan compares: the owned group's is `owned`, or a
    /// placeholder until the plan's create step makes it.
    pub(crate) fn planned_id(&self, owned: Option<&str>) -> String {
        match self {
            GroupRef::Id(id) => id.clone(),
            GroupRef::Owned => owned.unwrap_or("<owned>").to_string(),
        }
    }

    /// The ID a step applies: the owned group's is `owned` once known;
    /// without it the step of load balancer `lb` cannot run.
    pub(crate) fn resolve(&self, owned: Option<&String>, lb: &str) -> Result<String, AwsError> {
        match self {
            GroupRef::Id(id) => Ok(id.clone()),
            GroupRef::Owned => owned.cloned().ok_or_else(|| AwsError::NotFound {
                operation: Operation::Ec2CreateSecurityGroup,
                what: format!("the owned security group of {lb}"),
            }),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedGroup {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) rules: BTreeSet<Rule>,
}

/// What AWS must look like for one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    name: String,
    /// Whose ownership tag a group must carry to be deleted.
    cluster_id: String,
    internal: bool,
    pub(crate) listeners: Vec<Listener>,
    health_check: HealthCheck,
    pub(crate) attributes: Attributes,
    subnets: BTreeSet<String>,
    /// In order: the LB's own group (owned, annotated or cloud.conf), then extras.
    pub(crate) groups: Vec<GroupRef>,
    pub(crate) owned_group: Option<OwnedGroup>,
    pub(crate) tags: BTreeMap<String, String>,
    proxy_protocol: bool,
    ssl_negotiation_policy: Option<String>,
    pub(crate) instances: BTreeSet<String>,
    /// Backend nodes' groups that must admit the LB's group; `None` when
    /// `DisableSecurityGroupIngress` is set.
    pub(crate) node_groups: Option<BTreeSet<String>>,
    /// The create-time settings, recorded on the load balancer this CCM creates.
    applied: crate::aws::applied::Applied,
}

/// A classic ELB as AWS reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ActualLb {
    pub(crate) name: String,
    pub(crate) dns_name: String,
    pub(crate) internal: bool,
    /// Listener and the policies set on it.
    pub(crate) listeners: Vec<(Listener, Vec<String>)>,
    backend_policies: BTreeMap<i32, Vec<String>>,
    /// Policies defined on the load balancer.
    policies: BTreeSet<String>,
    pub(crate) health_check: Option<HealthCheck>,
    subnets: BTreeSet<String>,
    pub(crate) security_groups: Vec<String>,
    pub(crate) instances: BTreeSet<String>,
    pub(crate) attributes: Attributes,
    pub(crate) tags: crate::aws::tags::Tags,
}

/// Everything the plan compares against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Actual {
    pub(crate) lb: Option<ActualLb>,
    /// The owned group, when it exists and carries this cluster's tag.
    pub(crate) owned_group: Option<sg::SecurityGroup>,
    /// Node groups (by ID) that already admit the LB's own group.
    pub(crate) node_groups_with_rule: BTreeSet<String>,
    /// When the LB's own group is shared (the `security-groups` annotation or
    /// cloud.conf `ElbSecurityGroup`): the node groups that other load
    /// balancers using it still reach, so their rule stays. `None` when not
    /// looked up: then no rule from a shared group is revoked.
    pub(crate) shared_group_needed: Option<BTreeSet<String>>,
    /// For deletion: the shared group the node rules admit (the load
    /// balancer's first group when it has no owned group).
    pub(crate) shared_lb_group: Option<String>,
    /// Node groups admitting the owned group, read only when the owned group
    /// is no longer wanted (`security-groups` or `ElbSecurityGroup` replaced it).
    pub(crate) owned_group_node_rules: BTreeSet<String>,
}

/// One mutating step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    CreateSecurityGroup(OwnedGroup),
    /// Rules to add to and remove from the owned group.
    AuthorizeIngress(BTreeSet<Rule>),
    RevokeIngress(BTreeSet<Rule>),
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
    /// Tags this CCM wrote that no longer hold (an adoption's kept tag).
    RemoveTags(BTreeSet<String>),
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

/// Inputs read from AWS that shape the desired state of a classic ELB or
/// an NLB.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Environment {
    /// The load balancer's subnets, in the order an NLB's addresses pair
    /// with them.
    pub(crate) subnets: Vec<String>,
    /// The backend instances.
    pub(crate) instances: BTreeSet<String>,
    /// The backends' node groups, which must admit a classic ELB's group.
    pub(crate) node_groups: BTreeSet<String>,
    /// `--cluster-name` (upstream hashes it into an NLB's managed group name).
    pub(crate) cluster_name: String,
    /// Whether what is created also carries the legacy `KubernetesCluster`
    /// tag ([`crate::aws::tags::owned_tags`]).
    pub(crate) legacy_cluster_tag: bool,
}

pub(crate) mod io;
pub mod plan;

#[cfg(test)]
mod tests;
