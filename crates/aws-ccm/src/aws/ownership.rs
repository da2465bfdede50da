//! Whether a load balancer, target group or security group is one this CCM
//! (or the Go CCM) makes for this cluster: the one proof every deletion of
//! those kinds asks for (a Service's deletion, a sync that replaces or
//! retires one, `aws-ccm orphans`). docs/ownership.md is the operator's page.
//!
//! A cluster tag alone proves nothing: kOps tags every resource of a
//! cluster `kubernetes.io/cluster/<name>=owned` and `KubernetesCluster=<name>`,
//! its API and bastion load balancers, their target groups and security
//! groups included (kubernetes/kops `pkg/model/context.go` `CloudTags`,
//! used by `pkg/model/awsmodel/api_loadbalancer.go` and `bastion.go`), and
//! Terraform or the AWS Load Balancer Controller may carry the same tag.
//! What tells the CCM's own apart is what it writes, read from the Go CCM
//! (kubernetes/cloud-provider-aws `pkg/providers/v1/`), which this CCM
//! writes the same:
//!
//! | kind | name | tags |
//! | --- | --- | --- |
//! | classic ELB, NLB | `a` + the Service UID without dashes, cut to 32 (`GetLoadBalancerName`, `cloudprovider.DefaultLoadBalancerName`) | cluster tag `owned`, `kubernetes.io/service-name=<ns>/<name>` (`aws_loadbalancer.go` `ensureLoadBalancer`, `ensureLoadBalancerv2`: `buildTags(ResourceLifecycleOwned, …)`) |
//! | NLB target group | `k8s-<ns:8>-<name:8>-<sha1:10>` (`buildTargetGroupName`) | the NLB's tags, service name included (`createListenerV2` → `ensureTargetGroup`) |
//! | classic ELB's group | `k8s-elb-<load balancer name>` (`aws.go` `buildELBSecurityGroupList`) | cluster tag `owned`, no service name (`ensureSecurityGroup`) |
//! | NLB's managed group | `k8s-<ns:8>-<name:8>-<sha256:10>` (`GetSecurityGroupNameForNLB`; earlier aws-ccm: `k8s-elb-<name>`) | as the classic ELB's group |
//! | shared backend group (this CCM's only, `NLBNodeIngress = SharedBackendGroup`) | `aws-ccm-backend-<cluster ID>` | cluster tag `owned`, `aws-ccm/shared-backend-group=<cluster ID>` |
//!
//! kOps' names never fit: `api-<cluster>-<hash>` and `bastion-<cluster>-<hash>`
//! for its load balancers (`awsup.GetResourceName32`), `tcp-…`, `tls-…`,
//! `kops-controller-…` for its target groups, `api-elb.<cluster>` and
//! `bastion-elb.<cluster>` for their groups, and none of them carries
//! `kubernetes.io/service-name`. The Load Balancer Controller's target
//! groups share the CCM's name pattern but not its service-name tag (it
//! tags `service.k8s.aws/stack`).
//!
//! The last part of the proof, that nothing live still refers to the
//! resource, is the caller's: a Service's deletion deletes what that Service
//! had; `aws-ccm orphans` checks every live Service.

use std::collections::BTreeMap;
use std::fmt;

use super::tags;

/// The kinds the CCM makes, each with its own name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Made {
    /// A classic ELB or an NLB.
    LoadBalancer,
    /// An NLB's target group.
    TargetGroup,
    /// A classic ELB's own group, `k8s-elb-<load balancer name>`.
    LoadBalancerGroup,
    /// An NLB's managed group (`NLBSecurityGroupMode = Managed`).
    NlbGroup,
    /// The cluster's shared backend group (`NLBNodeIngress =
    /// SharedBackendGroup`), this CCM's only: never deleted, only used.
    SharedBackendGroup,
}

impl Made {
    fn what(self) -> &'static str {
        match self {
            Made::LoadBalancer => "load balancer",
            Made::TargetGroup => "target group",
            Made::LoadBalancerGroup | Made::NlbGroup => "load balancer's security group",
            Made::SharedBackendGroup => "shared backend security group",
        }
    }

    /// The name pattern, as the verdict states it.
    fn pattern(self) -> &'static str {
        match self {
            Made::LoadBalancer => "\"a\" + a Service UID",
            Made::TargetGroup => "k8s-<namespace>-<name>-<hash> of its Service",
            Made::LoadBalancerGroup => "k8s-elb-<load balancer name>",
            Made::NlbGroup => "k8s-<namespace>-<name>-<hash> or k8s-elb-<load balancer name>",
            Made::SharedBackendGroup => {
                "aws-ccm-backend-<cluster ID> tagged aws-ccm/shared-backend-group=<cluster ID>"
            }
        }
    }

    /// Whether the CCM writes `kubernetes.io/service-name` on this kind.
    fn carries_service_name(self) -> bool {
        matches!(self, Made::LoadBalancer | Made::TargetGroup)
    }
}

/// Which part of the proof failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum NotMade {
    /// No `kubernetes.io/cluster/<id>` tag.
    Untagged,
    /// The cluster tag's value is not `owned` (`shared`, or empty).
    NotOwned(String),
    /// The name is not the one the CCM gives that kind.
    Name(Made),
    /// No `kubernetes.io/service-name` on a kind the CCM always writes it on.
    NoServiceName(Made),
    /// The service-name tag names another Service than the one asking (or,
    /// on a target group, than its name's `k8s-<ns>-<name>-` says).
    OtherService { tagged: String, expected: String },
}

impl fmt::Display for NotMade {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotMade::Untagged => f.write_str("it lacks this cluster's kubernetes.io/cluster tag"),
            NotMade::NotOwned(v) => write!(
                f,
                "its cluster tag is \"{v}\", not \"owned\" as the CCM tags what it makes"
            ),
            NotMade::Name(made) => write!(
                f,
                "its name is not {}, the name the CCM gives a {}",
                made.pattern(),
                made.what()
            ),
            NotMade::NoServiceName(made) => write!(
                f,
                "it has no {} tag, which the CCM writes on every {} it makes",
                tags::SERVICE_NAME_TAG,
                made.what()
            ),
            NotMade::OtherService { tagged, expected } => write!(
                f,
                "its {} tag names {tagged}, not {expected}",
                tags::SERVICE_NAME_TAG
            ),
        }
    }
}

/// Whether `name` with `tags` is a resource of kind `made` that the CCM
/// makes for cluster `cluster_id`. `service` (`<ns>/<name>`): the Service
/// whose load balancer is being deleted or changed, which the service-name
/// tag must then name; `None` (the orphans audit): any Service.
pub(crate) fn prove(
    made: Made,
    name: &str,
    tags: &BTreeMap<String, String>,
    cluster_id: &str,
    service: Option<&str>,
) -> Result<(), NotMade> {
    match tags.get(&tags::cluster_tag_key(cluster_id)) {
        None => return Err(NotMade::Untagged),
        Some(v) if v != tags::OWNED => return Err(NotMade::NotOwned(v.clone())),
        Some(_) => {}
    }
    let named = match made {
        Made::LoadBalancer => is_load_balancer_name(name),
        Made::TargetGroup => hashed_name(name).is_some(),
        Made::LoadBalancerGroup => is_load_balancer_group_name(name),
        Made::NlbGroup => hashed_name(name).is_some() || is_load_balancer_group_name(name),
        Made::SharedBackendGroup => {
            use super::nlb::shared_group::{SHARED_GROUP_TAG, shared_group_name};
            name == shared_group_name(cluster_id)
                && tags.get(SHARED_GROUP_TAG).map(String::as_str) == Some(cluster_id)
        }
    };
    if !named {
        return Err(NotMade::Name(made));
    }
    let tagged = tags.get(tags::SERVICE_NAME_TAG);
    if made.carries_service_name() {
        let Some(tagged) = tagged else {
            return Err(NotMade::NoServiceName(made));
        };
        if let Some(expected) = service.filter(|s| *s != tagged) {
            return Err(NotMade::OtherService {
                tagged: tagged.clone(),
                expected: expected.to_string(),
            });
        }
        // A target group's name starts with its Service's namespace and name.
        if made == Made::TargetGroup && hashed_name(name) != Some(prefix_of(tagged).as_str()) {
            return Err(NotMade::OtherService {
                tagged: tagged.clone(),
                expected: format!("the Service its name {name} was made for"),
            });
        }
    }
    Ok(())
}

/// Whether `name` is one the CCM gives a load balancer: `a` and 31
/// lowercase hex digits, `a` + a UUID without dashes, cut to 32. Node rules
/// carry no tags: an NLB rule's proof is its description naming such a
/// load balancer (`kubernetes.io/rule/nlb/client=<name>`, as the Go CCM's
/// `updateInstanceSecurityGroupsForNLB` writes and finds them).
pub(crate) fn is_load_balancer_name(name: &str) -> bool {
    name.strip_prefix('a')
        .is_some_and(|rest| rest.len() == 31 && is_hex(rest))
}

fn is_load_balancer_group_name(name: &str) -> bool {
    (name.strip_prefix("k8s-elb-")).is_some_and(is_load_balancer_name)
}

/// The `k8s-<ns:8>-<name:8>-` prefix of a `k8s-<ns:8>-<name:8>-<hash:10>`
/// name, each part at most eight ASCII letters and digits.
fn hashed_name(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("k8s-")?;
    let mut parts = rest.split('-');
    let (ns, svc, hash) = (parts.next()?, parts.next()?, parts.next()?);
    let short = |p: &str| p.len() <= 8 && p.chars().all(|c| c.is_ascii_alphanumeric());
    (parts.next().is_none() && short(ns) && short(svc) && hash.len() == 10 && is_hex(hash))
        .then(|| &name[..name.len() - hash.len()])
}

/// The prefix the CCM's names for Service `service_key` start with.
fn prefix_of(service_key: &str) -> String {
    super::nlb::target_group_prefix(service_key)
}

fn is_hex(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

#[cfg(test)]
mod tests;
