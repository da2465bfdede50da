//! The table of every AWS operation this project calls.
//!
//! Each row names the service, the AWS action (as it appears on the wire in
//! `Action=` and in CloudTrail), the throttle [`Category`] AWS charges it to,
//! whether it mutates, and how safe it is to repeat. The generic call API in
//! [`super::AwsClient`] takes an [`Operation`], so a call that is not in
//! this table does not compile: the limiter, the retry policy and the metrics
//! can never miss an operation.
//!
//! ## Idempotency and client tokens
//!
//! EC2 offers `ClientToken` idempotency only on launch-type actions
//! (`RunInstances`, `CreateFleet`, ...). None of the operations below accept
//! one (checked against aws-sdk-ec2 1.274 and the ELB SDKs: no `client_token`
//! field on any of their inputs), so the client retries them as they are and
//! [`Idempotency`] says what a repeated attempt can observe; the door turns
//! a duplicate (or, for a removal, a not-found) answer after a lost one into
//! [`super::errors::AwsError::AnswerLost`], so callers re-read and carry on
//! instead of failing or creating a second object.

use std::fmt;

/// The AWS service an operation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    Ec2,
    /// Classic Elastic Load Balancing (API version 2012-06-01).
    Elb,
    /// Elastic Load Balancing v2: ALB/NLB (API version 2015-12-01).
    Elbv2,
    Sts,
    /// IAM: only `aws-ccm doctor`'s policy simulation; the CCM never calls it.
    Iam,
}

impl Service {
    /// Short lowercase name used in metric labels and logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Service::Ec2 => "ec2",
            Service::Elb => "elb",
            Service::Elbv2 => "elbv2",
            Service::Sts => "sts",
            Service::Iam => "iam",
        }
    }

    /// Parses the names a proxy or a log may use for a service. Classic ELB and
    /// ELBv2 share the signing name `elasticloadbalancing`; only the API version
    /// tells them apart, so that name alone maps to classic ELB.
    pub fn parse(name: &str) -> Option<Service> {
        match name.to_ascii_lowercase().as_str() {
            "ec2" => Some(Service::Ec2),
            "elb" | "elasticloadbalancing" | "elb-2012-06-01" => Some(Service::Elb),
            "elbv2" | "elasticloadbalancingv2" | "elb-2015-12-01" => Some(Service::Elbv2),
            "sts" => Some(Service::Sts),
            "iam" => Some(Service::Iam),
            _ => None,
        }
    }

    /// Display name used in user-facing messages.
    fn display_name(self) -> &'static str {
        match self {
            Service::Ec2 => "EC2",
            Service::Elb => "ELB",
            Service::Elbv2 => "ELBv2",
            Service::Sts => "STS",
            Service::Iam => "IAM",
        }
    }
}

impl fmt::Display for Service {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.display_name())
    }
}

/// An AWS throttle category: one token bucket each, sized as AWS documents it.
///
/// Classic ELB and ELBv2 share the `elasticloadbalancing` quota namespace, so
/// they share these buckets too. AWS now documents EC2 buckets as evaluated
/// per API action; a bucket shared by the whole category is the conservative
/// reading (it never lets more through than either reading allows), and the
/// budget fraction leaves the rest of the account its share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// EC2 `Describe*` and other read-only actions.
    Ec2NonMutating,
    /// `DescribeInstances` / `DescribeSecurityGroups` with neither a filter nor
    /// pagination: AWS's most expensive reads, with their own smaller bucket.
    Ec2UnfilteredDescribe,
    /// EC2 actions that change something (routes, security groups, attributes).
    Ec2Mutating,
    /// `Authorize/RevokeSecurityGroupIngress/Egress`.
    Ec2SecurityGroupRules,
    /// `CreateTags` / `DeleteTags`.
    Ec2Tags,
    /// ELB and ELBv2 `Describe*`.
    ElbNonMutating,
    /// ELB and ELBv2 changes other than the ones below.
    ElbMutating,
    /// Registering and deregistering instances or targets.
    ElbRegistration,
    /// `CreateLoadBalancer` and subnet changes: AWS's slowest bucket.
    ElbCreateAndSubnets,
    /// STS (`GetCallerIdentity`, `AssumeRole`) and IAM's
    /// `SimulatePrincipalPolicy` (`aws-ccm doctor` only).
    Sts,
}

/// Size of an AWS token bucket: how many requests fit in a burst and how many
/// tokens come back per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct BucketSize {
    pub(crate) burst: f64,
    pub(crate) refill_per_sec: f64,
}

impl Category {
    /// Every category, in a stable order (for metrics and tests).
    pub(crate) const ALL: [Category; 10] = [
        Category::Ec2NonMutating,
        Category::Ec2UnfilteredDescribe,
        Category::Ec2Mutating,
        Category::Ec2SecurityGroupRules,
        Category::Ec2Tags,
        Category::ElbNonMutating,
        Category::ElbMutating,
        Category::ElbRegistration,
        Category::ElbCreateAndSubnets,
        Category::Sts,
    ];

    /// The bucket AWS applies to this category for a whole account and Region
    /// (EC2: "Request throttling for the Amazon EC2 API"; ELB: the API request
    /// rate quotas of Elastic Load Balancing). STS documents no per-category
    /// bucket for these read-mostly calls (its account quota is hundreds per
    /// second); the CCM makes a handful of them, so a modest bucket is enough.
    /// IAM's `SimulatePrincipalPolicy` shares it: IAM documents no per-action
    /// rate either, and only `aws-ccm doctor` calls it, fifteen times a run.
    pub(crate) fn aws_bucket(self) -> BucketSize {
        let (burst, refill_per_sec) = match self {
            Category::Ec2NonMutating => (100.0, 20.0),
            Category::Ec2UnfilteredDescribe => (50.0, 10.0),
            Category::Ec2Mutating => (50.0, 5.0),
            Category::Ec2SecurityGroupRules => (50.0, 5.0),
            Category::Ec2Tags => (100.0, 10.0),
            Category::ElbNonMutating => (40.0, 10.0),
            Category::ElbMutating => (20.0, 3.0),
            Category::ElbRegistration => (20.0, 4.0),
            Category::ElbCreateAndSubnets => (10.0, 0.2),
            Category::Sts => (100.0, 50.0),
        };
        BucketSize {
            burst,
            refill_per_sec,
        }
    }

    /// Label value used in metrics.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Category::Ec2NonMutating => "ec2_non_mutating",
            Category::Ec2UnfilteredDescribe => "ec2_unfiltered_describe",
            Category::Ec2Mutating => "ec2_mutating",
            Category::Ec2SecurityGroupRules => "ec2_security_group_rules",
            Category::Ec2Tags => "ec2_tags",
            Category::ElbNonMutating => "elb_non_mutating",
            Category::ElbMutating => "elb_mutating",
            Category::ElbRegistration => "elb_registration",
            Category::ElbCreateAndSubnets => "elb_create_and_subnets",
            Category::Sts => "sts",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What repeating an operation can do after an ambiguous failure: an
/// attempt whose answer was lost (a timeout, a connection reset, a 5xx)
/// may have been applied by AWS. The door ([`super::door`]) reads this
/// column, and only this column, to decide what a later answer means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Idempotency {
    /// Reads nothing but state: always safe to repeat.
    ReadOnly,
    /// Repeating it leaves AWS in the same state and returns success
    /// (set/replace/modify/tag/register style actions).
    Natural,
    /// A create that refuses a second object of the same name or key
    /// (`InvalidGroup.Duplicate`, `DuplicateTargetGroupName`,
    /// `DuplicateListener`, `RouteAlreadyExists`, ...). The door repeats it;
    /// a duplicate answer after a lost one is reported as
    /// [`super::errors::AwsError::AnswerLost`] with `applied: true`, and
    /// callers re-read the object and carry on.
    Create,
    /// A call the door does not repeat once an answer is lost: it reports
    /// [`super::errors::AwsError::AnswerLost`] with `applied: false`, and
    /// the caller reads before acting again. For a create whose repeat could
    /// make a second object (AWS answers a same-settings ELBv2
    /// `CreateLoadBalancer` or `CreateListener` with the existing one; moto,
    /// which the tests run against, makes another), and for a load
    /// balancer delete: once the load balancer is gone, a repeat is refused
    /// by IAM (the policy's `aws:ResourceTag` condition cannot match a
    /// resource that no longer exists), not answered with success.
    ReadBeforeRepeat,
    /// A delete or revoke: `*.NotFound` means it is done, whether the object
    /// never existed or an earlier attempt whose answer was lost removed it.
    Remove,
}

macro_rules! operations {
    ($( $(#[$doc:meta])* $variant:ident => ($service:ident, $action:literal, $category:ident, $idem:ident), )*) => {
        /// One AWS operation the project calls. See the module docs.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Operation {
            $( $(#[$doc])* $variant, )*
        }

        impl Operation {
            /// Every operation in the table.
            pub const ALL: &'static [Operation] = &[ $( Operation::$variant, )* ];

            /// The service that serves this operation.
            pub fn service(self) -> Service {
                match self { $( Operation::$variant => Service::$service, )* }
            }

            /// The AWS action name, as sent in `Action=`.
            pub fn action(self) -> &'static str {
                match self { $( Operation::$variant => $action, )* }
            }

            /// The throttle category AWS charges this operation to.
            pub(crate) fn category(self) -> Category {
                match self { $( Operation::$variant => Category::$category, )* }
            }

            /// What a repeated attempt can observe.
            pub(crate) fn idempotency(self) -> Idempotency {
                match self { $( Operation::$variant => Idempotency::$idem, )* }
            }
        }
    };
}

operations! {
    // ---- EC2 ----
    /// Filtered or paginated `DescribeInstances` (every call the client makes).
    Ec2DescribeInstances => (Ec2, "DescribeInstances", Ec2NonMutating, ReadOnly),
    /// `DescribeInstances` with neither filters nor pagination; charged to
    /// AWS's smaller bucket. Prefer filters.
    Ec2DescribeInstancesUnfiltered => (Ec2, "DescribeInstances", Ec2UnfilteredDescribe, ReadOnly),
    Ec2DescribeAvailabilityZones => (Ec2, "DescribeAvailabilityZones", Ec2NonMutating, ReadOnly),
    /// Network nodes of instances, at most 100 IDs per call (the
    /// `topology.k8s.aws/network-node-layer-N` labels).
    Ec2DescribeInstanceTopology => (Ec2, "DescribeInstanceTopology", Ec2NonMutating, ReadOnly),
    Ec2DescribeRouteTables => (Ec2, "DescribeRouteTables", Ec2NonMutating, ReadOnly),
    Ec2CreateRoute => (Ec2, "CreateRoute", Ec2Mutating, Create),
    Ec2ReplaceRoute => (Ec2, "ReplaceRoute", Ec2Mutating, Natural),
    Ec2DeleteRoute => (Ec2, "DeleteRoute", Ec2Mutating, Remove),
    Ec2ModifyInstanceAttribute => (Ec2, "ModifyInstanceAttribute", Ec2Mutating, Natural),
    Ec2DescribeSubnets => (Ec2, "DescribeSubnets", Ec2NonMutating, ReadOnly),
    Ec2DescribeVpcs => (Ec2, "DescribeVpcs", Ec2NonMutating, ReadOnly),
    /// Filtered or paginated `DescribeSecurityGroups`.
    Ec2DescribeSecurityGroups => (Ec2, "DescribeSecurityGroups", Ec2NonMutating, ReadOnly),
    /// `DescribeSecurityGroups` with neither filters nor pagination.
    Ec2DescribeSecurityGroupsUnfiltered => (Ec2, "DescribeSecurityGroups", Ec2UnfilteredDescribe, ReadOnly),
    Ec2CreateSecurityGroup => (Ec2, "CreateSecurityGroup", Ec2Mutating, Create),
    Ec2DeleteSecurityGroup => (Ec2, "DeleteSecurityGroup", Ec2Mutating, Remove),
    Ec2AuthorizeSecurityGroupIngress => (Ec2, "AuthorizeSecurityGroupIngress", Ec2SecurityGroupRules, Create),
    Ec2RevokeSecurityGroupIngress => (Ec2, "RevokeSecurityGroupIngress", Ec2SecurityGroupRules, Remove),
    Ec2CreateTags => (Ec2, "CreateTags", Ec2Tags, Natural),
    Ec2DeleteTags => (Ec2, "DeleteTags", Ec2Tags, Natural),
    Ec2DescribeInternetGateways => (Ec2, "DescribeInternetGateways", Ec2NonMutating, ReadOnly),
    Ec2DescribeAddresses => (Ec2, "DescribeAddresses", Ec2NonMutating, ReadOnly),
    Ec2DescribeNetworkInterfaces => (Ec2, "DescribeNetworkInterfaces", Ec2NonMutating, ReadOnly),

    // ---- Classic ELB ----
    ElbCreateLoadBalancer => (Elb, "CreateLoadBalancer", ElbCreateAndSubnets, Create),
    /// Succeeds when the load balancer is already gone.
    ElbDeleteLoadBalancer => (Elb, "DeleteLoadBalancer", ElbMutating, ReadBeforeRepeat),
    ElbDescribeLoadBalancers => (Elb, "DescribeLoadBalancers", ElbNonMutating, ReadOnly),
    ElbDescribeTags => (Elb, "DescribeTags", ElbNonMutating, ReadOnly),
    ElbAddTags => (Elb, "AddTags", ElbMutating, Natural),
    ElbRemoveTags => (Elb, "RemoveTags", ElbMutating, Natural),
    ElbCreateLoadBalancerListeners => (Elb, "CreateLoadBalancerListeners", ElbMutating, Create),
    ElbDeleteLoadBalancerListeners => (Elb, "DeleteLoadBalancerListeners", ElbMutating, Natural),
    ElbConfigureHealthCheck => (Elb, "ConfigureHealthCheck", ElbMutating, Natural),
    ElbDescribeLoadBalancerAttributes => (Elb, "DescribeLoadBalancerAttributes", ElbNonMutating, ReadOnly),
    ElbModifyLoadBalancerAttributes => (Elb, "ModifyLoadBalancerAttributes", ElbMutating, Natural),
    ElbRegisterInstancesWithLoadBalancer => (Elb, "RegisterInstancesWithLoadBalancer", ElbRegistration, Natural),
    ElbDeregisterInstancesFromLoadBalancer => (Elb, "DeregisterInstancesFromLoadBalancer", ElbRegistration, Natural),
    ElbApplySecurityGroupsToLoadBalancer => (Elb, "ApplySecurityGroupsToLoadBalancer", ElbMutating, Natural),
    ElbAttachLoadBalancerToSubnets => (Elb, "AttachLoadBalancerToSubnets", ElbCreateAndSubnets, Natural),
    ElbDetachLoadBalancerFromSubnets => (Elb, "DetachLoadBalancerFromSubnets", ElbCreateAndSubnets, Natural),
    ElbCreateLoadBalancerPolicy => (Elb, "CreateLoadBalancerPolicy", ElbMutating, Create),
    ElbSetLoadBalancerPoliciesForBackendServer => (Elb, "SetLoadBalancerPoliciesForBackendServer", ElbMutating, Natural),
    ElbSetLoadBalancerPoliciesOfListener => (Elb, "SetLoadBalancerPoliciesOfListener", ElbMutating, Natural),

    // ---- ELBv2 ----
    Elbv2CreateLoadBalancer => (Elbv2, "CreateLoadBalancer", ElbCreateAndSubnets, ReadBeforeRepeat),
    Elbv2DeleteLoadBalancer => (Elbv2, "DeleteLoadBalancer", ElbMutating, ReadBeforeRepeat),
    Elbv2DescribeLoadBalancers => (Elbv2, "DescribeLoadBalancers", ElbNonMutating, ReadOnly),
    Elbv2DescribeTags => (Elbv2, "DescribeTags", ElbNonMutating, ReadOnly),
    Elbv2AddTags => (Elbv2, "AddTags", ElbMutating, Natural),
    Elbv2RemoveTags => (Elbv2, "RemoveTags", ElbMutating, Natural),
    Elbv2CreateTargetGroup => (Elbv2, "CreateTargetGroup", ElbMutating, Create),
    Elbv2DeleteTargetGroup => (Elbv2, "DeleteTargetGroup", ElbMutating, Remove),
    Elbv2DescribeTargetGroups => (Elbv2, "DescribeTargetGroups", ElbNonMutating, ReadOnly),
    Elbv2ModifyTargetGroup => (Elbv2, "ModifyTargetGroup", ElbMutating, Natural),
    Elbv2DescribeTargetGroupAttributes => (Elbv2, "DescribeTargetGroupAttributes", ElbNonMutating, ReadOnly),
    Elbv2ModifyTargetGroupAttributes => (Elbv2, "ModifyTargetGroupAttributes", ElbMutating, Natural),
    Elbv2RegisterTargets => (Elbv2, "RegisterTargets", ElbRegistration, Natural),
    Elbv2DeregisterTargets => (Elbv2, "DeregisterTargets", ElbRegistration, Natural),
    Elbv2DescribeTargetHealth => (Elbv2, "DescribeTargetHealth", ElbNonMutating, ReadOnly),
    /// AWS answers a same-settings repeat with the existing listener; moto
    /// makes a second one on the same port.
    Elbv2CreateListener => (Elbv2, "CreateListener", ElbMutating, ReadBeforeRepeat),
    Elbv2DeleteListener => (Elbv2, "DeleteListener", ElbMutating, Remove),
    Elbv2DescribeListeners => (Elbv2, "DescribeListeners", ElbNonMutating, ReadOnly),
    Elbv2ModifyListener => (Elbv2, "ModifyListener", ElbMutating, Natural),
    Elbv2ModifyListenerAttributes => (Elbv2, "ModifyListenerAttributes", ElbMutating, Natural),
    Elbv2DescribeLoadBalancerAttributes => (Elbv2, "DescribeLoadBalancerAttributes", ElbNonMutating, ReadOnly),
    Elbv2ModifyLoadBalancerAttributes => (Elbv2, "ModifyLoadBalancerAttributes", ElbMutating, Natural),
    Elbv2SetSecurityGroups => (Elbv2, "SetSecurityGroups", ElbMutating, Natural),
    Elbv2SetSubnets => (Elbv2, "SetSubnets", ElbCreateAndSubnets, Natural),
    Elbv2SetIpAddressType => (Elbv2, "SetIpAddressType", ElbMutating, Natural),

    // ---- STS ----
    StsGetCallerIdentity => (Sts, "GetCallerIdentity", Sts, ReadOnly),
    StsAssumeRole => (Sts, "AssumeRole", Sts, ReadOnly),

    // ---- IAM ----
    /// `aws-ccm doctor`'s check of the ELB writes, which cannot be dry-run:
    /// IAM's policy simulator, called with the operator's credentials.
    IamSimulatePrincipalPolicy => (Iam, "SimulatePrincipalPolicy", Sts, ReadOnly),
}

impl Operation {
    /// Whether the operation changes state in AWS.
    pub fn is_mutating(self) -> bool {
        self.idempotency() != Idempotency::ReadOnly
    }

    /// Looks an operation up by service and AWS action name. For the two
    /// actions with an unfiltered variant this returns the filtered one (the
    /// bucket the client normally charges).
    fn from_action(service: Service, action: &str) -> Option<Operation> {
        Operation::ALL
            .iter()
            .copied()
            .find(|op| op.service() == service && op.action() == action)
    }

    /// [`Operation::from_action`] with the service given by name, as a proxy
    /// or a log reports it ("ec2", "elasticloadbalancing",
    /// "elasticloadbalancingv2", "sts").
    pub fn from_names(service: &str, action: &str) -> Option<Operation> {
        Operation::from_action(Service::parse(service)?, action)
    }

    /// Value of the `request` label of the Go CCM's
    /// `cloudprovider_aws_api_request_*` metrics. The Go CCM named only a few
    /// EC2 calls (`describe_instance`, `describe_security_groups`,
    /// `describe_route_tables`, `describe_network_interfaces`, `create_tags`,
    /// `delete_tags`); we keep those names so existing dashboards keep working
    /// and name the rest the same way, prefixed by service outside EC2.
    pub(crate) fn metric_request_name(self) -> String {
        if self.action() == "DescribeInstances" {
            return "describe_instance".to_string();
        }
        let snake = snake_case(self.action());
        match self.service() {
            Service::Ec2 => snake,
            other => format!("{}_{snake}", other.as_str()),
        }
    }

    /// The action as an IAM policy names it (`ec2:CreateRoute`,
    /// `elasticloadbalancing:CreateLoadBalancer` for both ELB APIs).
    pub(crate) fn iam_action(self) -> String {
        let prefix = match self.service() {
            Service::Ec2 => "ec2",
            Service::Elb | Service::Elbv2 => "elasticloadbalancing",
            Service::Sts => "sts",
            Service::Iam => "iam",
        };
        format!("{prefix}:{}", self.action())
    }

    /// `ec2:DescribeInstances`-style name for logs and the
    /// `aws_ccm_api_calls_total{operation}` label.
    pub(crate) fn qualified_name(self) -> String {
        format!("{}:{}", self.service().as_str(), self.action())
    }
}

/// IAM actions kOps' own CCM policy lacks and `iam/render.sh
/// --kops-additions` grants: a refusal of one names that fix (the door's
/// hint, and `permissions::gaps`' self-check).
pub(crate) const KOPS_GAPS: &[&str] = &[
    "elasticloadbalancing:DescribeTags",
    "elasticloadbalancing:SetSubnets",
    "elasticloadbalancing:SetIpAddressType",
    "elasticloadbalancing:SetSecurityGroups",
    "elasticloadbalancing:ModifyListenerAttributes",
    "elasticloadbalancing:AddTags",
    "ec2:ReplaceRoute",
];

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.service(), self.action())
    }
}

fn snake_case(action: &str) -> String {
    let mut out = String::with_capacity(action.len() + 8);
    for (i, c) in action.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn bucket_table_matches_aws_documentation() {
        let cases = [
            (Category::Ec2NonMutating, 100.0, 20.0),
            (Category::Ec2UnfilteredDescribe, 50.0, 10.0),
            (Category::Ec2Mutating, 50.0, 5.0),
            (Category::Ec2SecurityGroupRules, 50.0, 5.0),
            (Category::Ec2Tags, 100.0, 10.0),
            (Category::ElbNonMutating, 40.0, 10.0),
            (Category::ElbMutating, 20.0, 3.0),
            (Category::ElbRegistration, 20.0, 4.0),
            (Category::ElbCreateAndSubnets, 10.0, 0.2),
        ];
        for (category, burst, refill) in cases {
            let bucket = category.aws_bucket();
            assert_eq!(bucket.burst, burst, "{category} burst");
            assert_eq!(bucket.refill_per_sec, refill, "{category} refill");
        }
    }

    #[test]
    fn operations_are_charged_to_the_documented_category() {
        use Category::*;
        let cases = [
            (Operation::Ec2DescribeInstances, Ec2NonMutating),
            (
                Operation::Ec2DescribeInstancesUnfiltered,
                Ec2UnfilteredDescribe,
            ),
            (
                Operation::Ec2DescribeSecurityGroupsUnfiltered,
                Ec2UnfilteredDescribe,
            ),
            (Operation::Ec2CreateRoute, Ec2Mutating),
            (
                Operation::Ec2AuthorizeSecurityGroupIngress,
                Ec2SecurityGroupRules,
            ),
            (
                Operation::Ec2RevokeSecurityGroupIngress,
                Ec2SecurityGroupRules,
            ),
            (Operation::Ec2CreateTags, Ec2Tags),
            (Operation::Ec2DeleteTags, Ec2Tags),
            (Operation::ElbDescribeLoadBalancers, ElbNonMutating),
            (Operation::Elbv2DescribeTargetHealth, ElbNonMutating),
            (Operation::ElbConfigureHealthCheck, ElbMutating),
            (Operation::Elbv2RegisterTargets, ElbRegistration),
            (
                Operation::ElbDeregisterInstancesFromLoadBalancer,
                ElbRegistration,
            ),
            (Operation::ElbCreateLoadBalancer, ElbCreateAndSubnets),
            (Operation::Elbv2CreateLoadBalancer, ElbCreateAndSubnets),
            (Operation::Elbv2SetSubnets, ElbCreateAndSubnets),
            (
                Operation::ElbAttachLoadBalancerToSubnets,
                ElbCreateAndSubnets,
            ),
        ];
        for (op, category) in cases {
            assert_eq!(op.category(), category, "{op}");
        }
    }

    #[test]
    fn reads_are_exactly_the_non_mutating_categories() {
        // STS is one category for reads and AssumeRole alike; IAM's
        // simulation shares it.
        for &op in Operation::ALL
            .iter()
            .filter(|op| !matches!(op.service(), Service::Sts | Service::Iam))
        {
            let read_category = matches!(
                op.category(),
                Category::Ec2NonMutating
                    | Category::Ec2UnfilteredDescribe
                    | Category::ElbNonMutating
            );
            assert_eq!(read_category, !op.is_mutating(), "{op}");
            assert_eq!(
                op.action().starts_with("Describe"),
                !op.is_mutating(),
                "{op}"
            );
        }
    }

    #[test]
    fn from_action_round_trips_and_rejects_unknown_actions() {
        for &op in Operation::ALL {
            let found = Operation::from_action(op.service(), op.action());
            let expected = match op {
                Operation::Ec2DescribeInstancesUnfiltered => Operation::Ec2DescribeInstances,
                Operation::Ec2DescribeSecurityGroupsUnfiltered => {
                    Operation::Ec2DescribeSecurityGroups
                }
                other => other,
            };
            assert_eq!(found, Some(expected));
        }
        assert_eq!(Operation::from_action(Service::Ec2, "RunInstances"), None);
        assert_eq!(
            Operation::from_names("elasticloadbalancingv2", "RegisterTargets"),
            Some(Operation::Elbv2RegisterTargets)
        );
        assert_eq!(
            Operation::from_names("elasticloadbalancing", "RegisterInstancesWithLoadBalancer"),
            Some(Operation::ElbRegisterInstancesWithLoadBalancer)
        );
        assert_eq!(Operation::from_names("s3", "GetObject"), None);
        // Same action name, different service.
        assert_eq!(
            Operation::from_action(Service::Elbv2, "RegisterInstancesWithLoadBalancer"),
            None
        );
    }

    #[test]
    fn required_operations_are_in_the_table() {
        let names: HashSet<(Service, &str)> = Operation::ALL
            .iter()
            .map(|op| (op.service(), op.action()))
            .collect();
        let ec2 = [
            "DescribeInstances",
            "DescribeAvailabilityZones",
            "DescribeRouteTables",
            "CreateRoute",
            "ReplaceRoute",
            "DeleteRoute",
            "ModifyInstanceAttribute",
            "DescribeSubnets",
            "DescribeVpcs",
            "DescribeSecurityGroups",
            "CreateSecurityGroup",
            "DeleteSecurityGroup",
            "AuthorizeSecurityGroupIngress",
            "RevokeSecurityGroupIngress",
            "CreateTags",
            "DeleteTags",
            "DescribeInternetGateways",
            "DescribeAddresses",
            "DescribeNetworkInterfaces",
        ];
        let elb = [
            "CreateLoadBalancer",
            "DeleteLoadBalancer",
            "DescribeLoadBalancers",
            "DescribeTags",
            "AddTags",
            "CreateLoadBalancerListeners",
            "DeleteLoadBalancerListeners",
            "ConfigureHealthCheck",
            "DescribeLoadBalancerAttributes",
            "ModifyLoadBalancerAttributes",
            "RegisterInstancesWithLoadBalancer",
            "DeregisterInstancesFromLoadBalancer",
            "ApplySecurityGroupsToLoadBalancer",
            "AttachLoadBalancerToSubnets",
            "DetachLoadBalancerFromSubnets",
            "CreateLoadBalancerPolicy",
            "SetLoadBalancerPoliciesForBackendServer",
            "SetLoadBalancerPoliciesOfListener",
        ];
        let elbv2 = [
            "CreateLoadBalancer",
            "DeleteLoadBalancer",
            "DescribeLoadBalancers",
            "DescribeTags",
            "AddTags",
            "CreateTargetGroup",
            "DeleteTargetGroup",
            "DescribeTargetGroups",
            "ModifyTargetGroup",
            "DescribeTargetGroupAttributes",
            "ModifyTargetGroupAttributes",
            "RegisterTargets",
            "DeregisterTargets",
            "DescribeTargetHealth",
            "CreateListener",
            "DeleteListener",
            "DescribeListeners",
            "ModifyListener",
            "DescribeLoadBalancerAttributes",
            "ModifyLoadBalancerAttributes",
            "SetSecurityGroups",
            "SetSubnets",
            "SetIpAddressType",
        ];
        let sts = ["GetCallerIdentity", "AssumeRole"];
        for (service, list) in [
            (Service::Ec2, &ec2[..]),
            (Service::Elb, &elb[..]),
            (Service::Elbv2, &elbv2[..]),
            (Service::Sts, &sts[..]),
        ] {
            for action in list {
                assert!(
                    names.contains(&(service, *action)),
                    "{service} {action} missing from the table"
                );
            }
        }
    }

    #[test]
    fn metric_names_keep_the_go_ccm_values() {
        assert_eq!(
            Operation::Ec2DescribeInstances.metric_request_name(),
            "describe_instance"
        );
        assert_eq!(
            Operation::Ec2DescribeSecurityGroups.metric_request_name(),
            "describe_security_groups"
        );
        assert_eq!(
            Operation::Ec2CreateTags.metric_request_name(),
            "create_tags"
        );
        assert_eq!(
            Operation::Elbv2RegisterTargets.metric_request_name(),
            "elbv2_register_targets"
        );
        assert_eq!(
            Operation::ElbCreateLoadBalancer.metric_request_name(),
            "elb_create_load_balancer"
        );
        assert_eq!(
            Operation::Ec2DescribeInstances.qualified_name(),
            "ec2:DescribeInstances"
        );
    }
}
