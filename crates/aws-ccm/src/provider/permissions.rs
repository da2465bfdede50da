//! What the controllers ask before a write the cloud's policy may refuse,
//! and the answer: a [`Probe`] stands for the write, a [`Verdict`] says
//! whether it is allowed, a [`Denial`] says what would grant it.
//!
//! Only the data lives here. What these mean on AWS (the IAM action names,
//! the DryRun request each probe sends, the operator's message of a denial,
//! reading [`Tagging`] off a resource's tags) is implemented in
//! `aws::permissions`, which also keeps the shared registry of verdicts.
//!
//! [`PermissionCheck`] is the start-up check the permission-check controller
//! runs (`aws::Aws` implements it in `aws::permissions::self_check`).

use std::future::Future;

use ipnet::IpNet;

use crate::provider::routes::RouteTableSelector;
use crate::provider::{CloudError, ErrorKind};

/// A mutating EC2 action the CCM performs on resources it may not own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Action {
    /// `ec2:CreateRoute` (and with it ReplaceRoute and DeleteRoute, which
    /// the policy grants on the same condition).
    CreateRoute,
    /// `ec2:AuthorizeSecurityGroupIngress` (and RevokeSecurityGroupIngress).
    AuthorizeSecurityGroupIngress,
    /// `ec2:ModifyInstanceAttribute` (source/destination check).
    ModifyInstanceAttribute,
    /// `ec2:CreateTags` on an instance (the tagging controller).
    CreateTags,
    /// `elasticloadbalancing:ModifyListener` (and DeleteListener) on an NLB
    /// listener. Never DryRun (ELBv2 has none): the listener's tags decide
    /// up front, and a real call's `AccessDenied` is recorded.
    ModifyListener,
}

/// How a resource is marked as the cluster's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tagging {
    /// `kubernetes.io/cluster/<id>` (any value).
    Current,
    /// Only the legacy `KubernetesCluster=<id>`.
    LegacyOnly,
    /// Neither.
    Untagged,
}

/// A write IAM refuses, with everything an operator needs to grant it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub(crate) action: Action,
    pub(crate) resource_id: String,
    /// `arn:<partition>:ec2:<region>:<account>:<type>/<id>`.
    pub(crate) resource_arn: String,
    /// The tag that would grant it: `kubernetes.io/cluster/<id>` with the
    /// value the policy wants.
    pub(crate) missing_tag: String,
    /// How the resource is tagged now.
    pub(crate) tagging: Tagging,
    /// The `iam/render.sh` option that grants it instead, if any.
    pub(crate) render_option: Option<String>,
}

impl Denial {
    /// The error of the write this denial stops before it is sent: denied,
    /// as the cloud would have answered it, naming the action and the fix.
    pub(crate) fn refusal(&self) -> CloudError {
        CloudError::new(
            self.action.to_string(),
            ErrorKind::Denied,
            format!("not sent: {self}"),
        )
    }
}

/// A verdict on one write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied(Box<Denial>),
    /// The check itself failed (throttled past its attempts, an endpoint
    /// that ignores DryRun): the write goes ahead and its own answer decides.
    Unknown,
}

impl Verdict {
    pub(crate) fn denial(&self) -> Option<&Denial> {
        match self {
            Verdict::Denied(d) => Some(d),
            _ => None,
        }
    }
}

/// The DryRun request that stands for a write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    /// A route in `table_id`: `CreateRoute` when a target instance is known,
    /// else `DeleteRoute` (the policy grants both on the same tag).
    Route {
        table_id: String,
        destination: IpNet,
        instance_id: Option<String>,
    },
    /// An ingress rule on `group_id` (the group admitting itself: valid in
    /// every VPC, and nothing is added).
    Ingress { group_id: String },
    /// Turning off an instance's source/destination check.
    SourceDestCheck { instance_id: String },
    /// A tag on an instance (`aws::permissions::PROBE_TAG_KEY`).
    Tags { instance_id: String },
}

impl Probe {
    pub(crate) fn action(&self) -> Action {
        match self {
            Probe::Route { .. } => Action::CreateRoute,
            Probe::Ingress { .. } => Action::AuthorizeSecurityGroupIngress,
            Probe::SourceDestCheck { .. } => Action::ModifyInstanceAttribute,
            Probe::Tags { .. } => Action::CreateTags,
        }
    }

    pub(crate) fn resource_id(&self) -> &str {
        match self {
            Probe::Route { table_id, .. } => table_id,
            Probe::Ingress { group_id } => group_id,
            Probe::SourceDestCheck { instance_id } | Probe::Tags { instance_id } => instance_id,
        }
    }
}

/// Which writes this process will make (the enabled controllers).
#[derive(Clone, Debug)]
pub struct Scope {
    /// The route controller's tables, and a destination inside the cluster
    /// CIDR for the probe (routes enabled only).
    pub routes: Option<(RouteTableSelector, IpNet)>,
    /// The service controller writes node security groups.
    pub(crate) node_groups: bool,
    /// The tagging controller tags instances.
    pub(crate) tagging: bool,
    /// The service controller syncs load balancers (the policy must grant
    /// the reads their syncs make).
    pub(crate) load_balancers: bool,
}

/// One probe and what the cloud said.
#[derive(Clone, Debug)]
pub struct Finding {
    pub(crate) probe: Probe,
    pub(crate) verdict: Verdict,
}

/// An action the policy lacks altogether (not a resource it does not
/// reach): every call of it fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingAction {
    /// The action as a policy names it.
    pub(crate) action: &'static str,
    /// What failed and how to grant it.
    pub(crate) description: String,
}

/// The start-up permission check: what the cloud's policy lets this process
/// do, before the first node or Service needs it. It informs; it never
/// stops the CCM.
pub trait PermissionCheck: Clone + Send + Sync + 'static {
    /// One probe per kind of write `scope` calls for, on a real resource,
    /// with its verdict.
    fn check_writes(&self, scope: &Scope) -> impl Future<Output = Vec<Finding>> + Send;

    /// The actions `scope`'s syncs call that the policy lacks altogether.
    fn missing_actions(&self, scope: &Scope) -> impl Future<Output = Vec<MissingAction>> + Send;
}
