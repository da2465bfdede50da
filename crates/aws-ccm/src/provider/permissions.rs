//! What the controllers ask before a write the cloud's policy may refuse,
//! and the answer: a [`Probe`] stands for the write, a [`Verdict`] says
//! whether it is allowed, a [`Denial`] says what would grant it.
//!
//! Only the data lives here. What these mean on AWS (the IAM action names,
//! the DryRun request each probe sends, the operator's message of a denial,
//! reading [`Tagging`] off a resource's tags) is implemented in
//! `aws::permissions`, which also keeps the shared registry of verdicts.

use ipnet::IpNet;

/// A mutating EC2 action the CCM performs on resources it may not own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
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
    pub action: Action,
    pub resource_id: String,
    /// `arn:<partition>:ec2:<region>:<account>:<type>/<id>`.
    pub resource_arn: String,
    /// The tag that would grant it: `kubernetes.io/cluster/<id>` with the
    /// value the policy wants.
    pub missing_tag: String,
    /// How the resource is tagged now.
    pub tagging: Tagging,
    /// The `iam/render.sh` option that grants it instead, if any.
    pub render_option: Option<String>,
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
    pub fn denial(&self) -> Option<&Denial> {
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
    pub fn action(&self) -> Action {
        match self {
            Probe::Route { .. } => Action::CreateRoute,
            Probe::Ingress { .. } => Action::AuthorizeSecurityGroupIngress,
            Probe::SourceDestCheck { .. } => Action::ModifyInstanceAttribute,
            Probe::Tags { .. } => Action::CreateTags,
        }
    }

    pub fn resource_id(&self) -> &str {
        match self {
            Probe::Route { table_id, .. } => table_id,
            Probe::Ingress { group_id } => group_id,
            Probe::SourceDestCheck { instance_id } | Probe::Tags { instance_id } => instance_id,
        }
    }
}
