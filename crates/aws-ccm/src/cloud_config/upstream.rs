//! What the Go CCM does with each `[Global]` cloud.conf key, value class by
//! value class, beside what this CCM does: the `go` column was read from
//! kubernetes/cloud-provider-aws (`config/config.go`, gcfg's types, and
//! where `aws.go`, `topology.go` and `tags.go` use each key), not from
//! memory. The tests hold [`CloudConfig::parse`] to the `here` column;
//! docs/cloud-config.md's "Value classes" section is generated from the
//! table ([`doc_section`]).
//!
//! The rule is the annotations' ([`crate::aws::annotations::upstream`]): a
//! value the Go CCM starts with is taken the same way (with a warning where
//! it is surely a mistake), and only a value it cannot start with stops
//! start-up. Rows whose `why` says so are where this CCM deliberately
//! differs.

use super::GLOBAL_KEYS;

/// What a CCM does with a cloud.conf value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Takes {
    /// Starts and uses it.
    Uses,
    /// Starts as if it were not set.
    Ignores,
    /// Starts, with a warning, and leaves the value out (a list item).
    Skips,
    /// Starts; every NLB sync fails on it (here: every NLB kept in upkeep).
    FailsNlbs,
    /// Starts; every health check through the shared probe fails on it
    /// (here: each load balancer probed that way kept in upkeep).
    FailsShared,
    /// Starts; the calls that use it fail later.
    FailsLater,
    /// Does not start.
    FailsAtStart,
}

impl Takes {
    fn text(self) -> &'static str {
        match self {
            Takes::Uses => "starts, uses it",
            Takes::Ignores => "starts, as if unset",
            Takes::Skips => "starts, skips it",
            Takes::FailsNlbs => "starts, fails every NLB sync",
            Takes::FailsShared => "starts, fails every sync probed through the shared port",
            Takes::FailsLater => "starts, fails the calls that use it",
            Takes::FailsAtStart => "does not start",
        }
    }
}

/// One value class of one `[Global]` key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Class {
    key: &'static str,
    class: &'static str,
    value: &'static str,
    go: Takes,
    here: Takes,
    /// Why `here` differs from `go` (empty when it does not).
    why: &'static str,
}

const fn c(key: &'static str, class: &'static str, value: &'static str, go: Takes) -> Class {
    Class {
        key,
        class,
        value,
        go,
        here: go,
        why: "",
    }
}

impl Class {
    const fn here(self, here: Takes, why: &'static str) -> Class {
        Class { here, why, ..self }
    }
}

use Takes::{FailsAtStart, FailsLater, FailsNlbs, FailsShared, Ignores, Skips, Uses};

const STOPS: &str = "refused at start-up with the file, line and what is allowed: every AWS call (through AssumeRole) would fail";
const SHARED: &str =
    "each load balancer probed through the shared port kept in upkeep, a warning at start-up";

/// Every value class compared, in the order of the keys.
const CLASSES: &[Class] = &[
    c("Zone", "documented", "us-east-1a", Uses),
    c("Zone", "local zone", "us-west-2-lax-1a", Uses),
    c("Zone", "no region in it", "useast1a", FailsAtStart),
    c("Zone", "empty", "", Ignores),
    c("Region", "documented", "eu-west-1", Uses),
    c("Region", "empty", "", Ignores),
    c("VPC", "documented", "vpc-0123", Uses),
    c("SubnetID", "documented", "subnet-1", Uses),
    c("RouteTableID", "documented", "rtb-1", Uses),
    c("RoleARN", "documented", "arn:aws:iam::123456789012:role/ccm", Uses),
    c("RoleARN", "not an ARN", "ccm-role", FailsLater).here(FailsAtStart, STOPS),
    c("RoleARN", "empty", "", Ignores),
    c("SourceARN", "documented", "arn:aws:eks:us-west-2:123456789012:cluster/x", Uses),
    c("KubernetesClusterTag", "documented", "prod", Uses),
    c("KubernetesClusterID", "documented", "prod", Uses),
    c("DisableSecurityGroupIngress", "documented", "true", Uses),
    c("DisableSecurityGroupIngress", "gcfg boolean", "yes", Uses),
    c("DisableSecurityGroupIngress", "unknown word", "maybe", FailsAtStart),
    c("DisableSecurityGroupIngress", "empty", "", Ignores),
    c("ElbSecurityGroup", "documented", "sg-1", Uses),
    c("NodeIPFamilies", "documented", "ipv6", Uses),
    c("NodeIPFamilies", "unknown word", "ipv5", Skips).here(Skips, "with a warning at start-up"),
    c("ClusterServiceLoadBalancerHealthProbeMode", "documented", "Shared", Uses),
    c("ClusterServiceLoadBalancerHealthProbeMode", "empty", "", Ignores),
    c("ClusterServiceLoadBalancerHealthProbeMode", "other case", "shared", FailsNlbs).here(FailsNlbs, "every NLB kept in upkeep (its targets and node rules follow the nodes), a warning at start-up; Classic ELBs use the node port, as the Go CCM's"),
    c("ClusterServiceLoadBalancerHealthProbeMode", "unknown word", "Local", FailsNlbs).here(FailsNlbs, "every NLB kept in upkeep, a warning at start-up"),
    c("ClusterServiceSharedLoadBalancerHealthProbePort", "documented", "10257", Uses),
    c("ClusterServiceSharedLoadBalancerHealthProbePort", "zero: the default", "0", Ignores),
    c("ClusterServiceSharedLoadBalancerHealthProbePort", "not a number", "port", FailsAtStart),
    c("ClusterServiceSharedLoadBalancerHealthProbePort", "above 65535", "99999", FailsShared).here(FailsShared, SHARED),
    c("ClusterServiceSharedLoadBalancerHealthProbePath", "documented", "/livez", Uses),
    c("ClusterServiceSharedLoadBalancerHealthProbePath", "empty: the default", "", Ignores),
    c("ClusterServiceSharedLoadBalancerHealthProbePath", "no leading /", "healthz", FailsShared).here(FailsShared, SHARED),
    c("SupportedTopologyInstanceTypePattern", "documented", "^p5\\..*$", Uses),
    c("SupportedTopologyInstanceTypePattern", "not an expression", "([", FailsAtStart),
    c("NLBSecurityGroupMode", "documented", "Managed", Uses),
    c("NLBSecurityGroupMode", "empty", "", Ignores),
    c("NLBSecurityGroupMode", "other case", "managed", FailsNlbs).here(FailsNlbs, "every NLB kept in upkeep, a warning at start-up"),
    // This CCM's own key: the Go CCM skips it as unknown whatever its value.
    c("NLBNodeIngress", "documented", "LoadBalancerGroup", Ignores).here(Uses, "this CCM's key (docs/nlb.md): an NLB with a security group gets one node rule admitting it"),
    c("NLBNodeIngress", "shared group", "SharedBackendGroup", Ignores).here(Uses, "this CCM's key (docs/nlb.md): an NLB with a security group carries the cluster's shared backend group, which each node group admits with one rule"),
    c("NLBNodeIngress", "default", "Cidr", Ignores),
    c("NLBNodeIngress", "empty", "", Ignores),
    c("NLBNodeIngress", "unknown word", "loadbalancergroup", Ignores).here(Skips, "this CCM's key: skipped with a log line naming the value and what is allowed; the CIDR rules stay"),
    c("NLBListenerSettings", "documented", "true", Ignores).here(Uses, "this CCM's key (docs/nlb.md): the NLB health-check timeout, ALPN policy and listener attributes annotations are applied"),
    c("NLBListenerSettings", "default", "false", Ignores),
    c("NLBListenerSettings", "empty", "", Ignores),
    c("NLBListenerSettings", "unknown word", "yes", Ignores).here(Skips, "this CCM's key: skipped with a log line naming the value and what is allowed; the timeout, ALPN policy and listener attributes stay unsent"),
];

/// Every `[Global]` key has classes (the upstream names' test checks the
/// key list itself).
fn keys_without_classes() -> Vec<&'static str> {
    GLOBAL_KEYS
        .iter()
        .copied()
        .filter(|k| !CLASSES.iter().any(|c| c.key == *k))
        .collect()
}

const DOC_BEGIN: &str = "<!-- cloud-conf-values:begin -->";
const DOC_END: &str = "<!-- cloud-conf-values:end -->";

/// docs/cloud-config.md's "Value classes" table, from [`CLASSES`].
fn doc_section() -> String {
    let mut out = String::from(DOC_BEGIN);
    out.push_str(
        "\n\n| key | value class | example | Go CCM | here |\n| --- | --- | --- | --- | --- |\n",
    );
    for k in CLASSES {
        let example = if k.value.is_empty() {
            "(empty)".to_string()
        } else {
            format!("`{}`", k.value)
        };
        let here = match (k.here == k.go, k.why) {
            (true, "") => "same".to_string(),
            (true, why) => format!("same; {why}"),
            (false, why) => format!("{}: {why}", k.here.text()),
        };
        out.push_str(&format!(
            "| `{}` | {} | {example} | {} | {here} |\n",
            k.key,
            k.class,
            k.go.text()
        ));
    }
    out.push('\n');
    out.push_str(DOC_END);
    out
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
