//! An NLB's security groups: its managed group (found by upstream's name,
//! or the one earlier aws-ccm versions used), what AWS's refusal of its
//! groups says, and the sweep of its node rules on deletion.

use std::collections::BTreeSet;

use super::Warning;
use super::{AwsLoadBalancers, CloudError, EnsureRequest, NLB_SECURITY_GROUPS_REFUSED, NlbPlan};
use crate::aws::memory::{Applied, Journal};
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups::{self as sg, SecurityGroup};
use crate::aws::{AwsError, annotations};
use crate::aws::{elb, nlb};

impl AwsLoadBalancers {
    /// The names an NLB's managed group may have: upstream's, then
    /// `k8s-elb-<lb-name>` (what aws-ccm named it before it took upstream's;
    /// such a group is kept and used, not replaced).
    pub(super) fn nlb_group_names(&self, service_key: &str, uid: &str) -> Vec<String> {
        let (namespace, name) = service_key.split_once('/').unwrap_or(("", service_key));
        vec![
            nlb::managed_group_name(&self.cluster_name, namespace, name, uid),
            elb::owned_group_name(&elb::load_balancer_name(uid)),
        ]
    }

    /// The managed group among `groups`: the first of `names` proven this
    /// CCM's ([`ownership`]).
    pub(super) fn nlb_owned_group<'a>(
        &self,
        names: &[String],
        groups: impl Iterator<Item = &'a SecurityGroup> + Clone,
    ) -> Option<SecurityGroup> {
        let proven = |g: &SecurityGroup| {
            ownership::prove(Made::NlbGroup, &g.name, &g.tags, &self.cluster_id, None).is_ok()
        };
        names
            .iter()
            .find_map(|n| groups.clone().find(|g| &g.name == n && proven(g)).cloned())
    }

    /// Revokes NLB `name`'s node rules from every cluster group and every
    /// group a cluster instance is in (deletion is rare and must leave no
    /// rule). `Ok(true)` when something was revoked.
    /// `revocable`: the NLB's groups no other NLB carries, whose group
    /// rules go too.
    pub(super) async fn revoke_nlb_node_rules(
        &self,
        name: &str,
        revocable: &BTreeSet<String>,
    ) -> Result<bool, CloudError> {
        let aws = &self.aws;
        let mut revoked = false;
        let swept = aws.cluster_instances().await?;
        let Some(vpc) = self.cluster_vpc(&swept) else {
            return Ok(false);
        };
        if self.cloud.disable_security_group_ingress {
            return Ok(false);
        }
        let live: Vec<&crate::aws::Ec2Instance> =
            swept.iter().filter(|i| !i.state.is_terminated()).collect();
        let mut groups = self.groups_of(&vpc, &live, &[]).await?;
        for g in sg::io::cluster_groups(aws, &vpc, &self.cluster_id).await? {
            groups.entry(g.id.clone()).or_insert(g);
        }
        let mut journal = Journal::default();
        let written = async {
            for g in groups.values() {
                let ch =
                    nlb::node_rules::node_group_changes(name, &g.descriptions, None, revocable);
                // Either call sends nothing for no rules.
                let described = &g.descriptions;
                sg::io::revoke_described(aws, &mut journal, &g.id, &ch.revoke, described).await?;
                sg::io::authorize_described(aws, &mut journal, &g.id, &ch.authorize).await?;
                revoked |= !ch.revoke.is_empty();
            }
            Ok::<_, crate::aws::AwsError>(())
        }
        .await;
        self.memory().applied(Applied::Writes(journal));
        written?;
        Ok(revoked)
    }
}

/// The Warning for AWS's refusal (`e`) of NLB `p`'s `SetSecurityGroups`:
/// the NLB keeps the groups it has (see `nlb::io::Applied::refused_groups`).
/// `owned`: the managed group's ID as the apply left it (made by it, too).
pub(super) fn groups_refused_warning(
    req: &EnsureRequest,
    p: &NlbPlan,
    owned: Option<&str>,
    e: &AwsError,
) -> Warning {
    let want: Vec<String> = (p.desired.security_groups.iter())
        .map(|g| g.planned_id(owned))
        .collect();
    let have = (p.actual.lb.as_ref()).map_or_else(Vec::new, |l| l.security_groups.clone());
    let code = e.code().unwrap_or("refused");
    let shared = match p.shared.carried() {
        Some(_) => format!(
            " With NLBNodeIngress = SharedBackendGroup the shared backend group is one of them, and it counts against the groups one load balancer may carry (5 by default): name one group fewer in {} or raise that quota.",
            annotations::SECURITY_GROUPS
        ),
        None => String::new(),
    };
    let warning = Warning {
        reason: NLB_SECURITY_GROUPS_REFUSED,
        message: format!(
            "AWS refused to set the security groups of NLB {} to [{}] ({code}: {}): it keeps [{}], its node rules follow those, and its listeners and targets are kept current. Check that every group {} names exists in VPC {}.{shared} The next sync tries again",
            p.name,
            want.join(", "),
            e.message(),
            have.join(", "),
            annotations::SECURITY_GROUPS,
            p.vpc_id,
        ),
    };
    tracing::warn!(service = %req.service_key, load_balancer = %p.name, message = %warning.message, "the NLB's security groups refused");
    warning
}
