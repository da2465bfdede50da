//! An NLB's rules in the node security groups (the NLB has no group of its
//! own by default: the nodes' groups admit clients and health checks).

use std::collections::{BTreeMap, BTreeSet};

use super::Warning;
use super::{AwsLoadBalancers, CloudError, EnsureRequest, NlbPlan};
use crate::aws::nlb;
use crate::aws::nlb::node_rules::RuleChanges;
use crate::aws::security_groups as sg;

impl AwsLoadBalancers {
    /// Brings the NLB's rules in the node groups to what the plan `at`
    /// wants (its listeners, for the backends' node groups):
    /// `groups` holds the backends' groups; every group holding a rule of
    /// this NLB is added, so a group that stopped being a backend's loses
    /// them. Groups IAM refuses are skipped with a warning. Returns the
    /// descriptions of what changed.
    pub(super) async fn sync_nlb_node_rules(
        &self,
        req: &EnsureRequest,
        at: &NlbPlan,
        groups: BTreeMap<String, sg::SecurityGroup>,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<String>, CloudError> {
        let planned = self.plan_nlb_node_rules(req, at, groups, warnings).await?;
        let mut described = Vec::new();
        for (g, ch) in &planned {
            tracing::info!(load_balancer = %at.name, group = %g.id, authorize = ch.authorize.len(), revoke = ch.revoke.len(), "updating node group rules");
            if self
                .write_node_rules(&req.service_key, g, ch, warnings)
                .await?
            {
                described.push(format!(
                    "node group {}: +{} -{} rule(s)",
                    g.id,
                    ch.authorize.len(),
                    ch.revoke.len()
                ));
            }
        }
        Ok(described)
    }

    /// The rule changes [`Self::sync_nlb_node_rules`] would write, per
    /// group, without writing (groups IAM refuses left out, with a warning).
    pub(crate) async fn plan_nlb_node_rules(
        &self,
        req: &EnsureRequest,
        at: &NlbPlan,
        mut groups: BTreeMap<String, sg::SecurityGroup>,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<(sg::SecurityGroup, RuleChanges)>, CloudError> {
        let aws = &self.aws;
        let cidrs = self
            .memory()
            .subnets()
            .cidrs(aws, &at.vpc_id, &at.subnet_ids)
            .await?;
        let rules = nlb::node_rules::node_rules(&at.desired, &req.spec.source_ranges, &cidrs);
        let ports: BTreeSet<i32> = rules
            .client
            .iter()
            .chain(&rules.health)
            .map(|r| r.from)
            .collect();
        let ours = [
            nlb::client_rule_description(&at.name),
            nlb::health_rule_description(&at.name),
        ];
        let view = aws.memory().groups().groups(aws, &at.vpc_id).await?;
        for g in view.with_rule_ports(&ports) {
            // Only a group holding a rule of this NLB: another cluster
            // in the VPC may use the same node port.
            if g.descriptions.values().any(|d| ours.contains(d)) {
                groups.entry(g.id.clone()).or_insert(g);
            }
        }
        let mut planned = Vec::new();
        for g in groups.into_values() {
            let want = at.node_groups.contains(&g.id).then_some(&rules);
            let ch = nlb::node_rules::node_group_changes(&at.name, &g.descriptions, want);
            if ch.is_empty() || self.group_refused(&req.service_key, &g, warnings).await {
                continue;
            }
            planned.push((g, ch));
        }
        Ok(planned)
    }
}
