//! An NLB's rules in the node security groups (the NLB has no group of its
//! own by default: the nodes' groups admit clients and health checks). With
//! cloud.conf `NLBNodeIngress = LoadBalancerGroup`, a backend node group of
//! an NLB that carries a security group holds one rule admitting that group
//! instead; with `SharedBackendGroup`, one rule admitting the cluster's
//! shared backend group, which every such NLB carries (so one rule per
//! node group, whatever the number of NLBs). A group at its rules limit
//! keeps the CIDR rules.

use std::collections::{BTreeMap, BTreeSet};

use super::refusals::Written;
use super::{AwsLoadBalancers, CloudError, EnsureRequest, NlbPlan};
use super::{NODE_GROUP_RULE_LIMIT, Warning};
use crate::aws::nlb;
use crate::aws::nlb::node_rules::{NodeRules, RuleChanges};
use crate::aws::security_groups::{self as sg, Rule, Source};
use crate::cloud_config::NlbNodeIngress;

/// What one NLB's node rules are planned from.
pub(crate) struct NodeRulePlan {
    /// The rules each backend node group needs.
    rules: NodeRules,
    /// The groups whose group rules this NLB may revoke (see
    /// [`nlb::node_rules::node_group_changes`]).
    revocable: BTreeSet<String>,
    /// Rule changes per node group (groups IAM refuses left out).
    pub(crate) changes: Vec<(sg::SecurityGroup, RuleChanges)>,
}

/// The groups NLB `at` carries once its plan's changes are applied: the
/// plan's create or `SetSecurityGroups` step, else what AWS reports.
/// `owned`: the owned group's ID once known (else a placeholder, for
/// `aws-ccm plan` before the group exists).
fn carried_groups(at: &NlbPlan, owned: Option<&str>) -> Vec<String> {
    let owned = owned.or(at.actual.owned_group.as_ref().map(|g| g.id.as_str()));
    for change in &at.changes {
        if let nlb::Change::CreateLoadBalancer {
            security_groups: refs,
            ..
        }
        | nlb::Change::SetSecurityGroups(refs) = change
        {
            return refs.iter().map(|g| g.planned_id(owned)).collect();
        }
    }
    let lb = at.actual.lb.as_ref();
    lb.map(|l| l.security_groups.clone()).unwrap_or_default()
}

/// The Warning for a node group with no room for an NLB's group rule.
fn at_limit_warning(
    service_key: &str,
    group: &str,
    source: &str,
    e: &crate::aws::AwsError,
) -> Warning {
    Warning {
        reason: NODE_GROUP_RULE_LIMIT,
        message: format!(
            "Node security group {group} has no room for the rule admitting {service_key}'s NLB security group {source} ({}): keeping the per-port CIDR rules there. Remove unused rules from {group} or raise the quota \"Inbound or outbound rules per security group\"; the next sync tries again",
            e.message()
        ),
    }
}

impl AwsLoadBalancers {
    /// Brings the NLB's rules in the node groups to what the plan `at`
    /// wants (its listeners, for the backends' node groups):
    /// `groups` holds the backends' groups; every group holding a rule of
    /// this NLB is added, so a group that stopped being a backend's loses
    /// them. Groups IAM refuses are skipped with a warning. `owned`: the
    /// owned group's ID as the apply left it. Returns the descriptions of
    /// what changed.
    pub(super) async fn sync_nlb_node_rules(
        &self,
        req: &EnsureRequest,
        at: &NlbPlan,
        groups: BTreeMap<String, sg::SecurityGroup>,
        owned: Option<&str>,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<String>, CloudError> {
        let planned = self
            .plan_nlb_node_rules(req, at, groups, owned, warnings)
            .await?;
        let mut described = Vec::new();
        for (g, ch) in &planned.changes {
            tracing::info!(load_balancer = %at.name, group = %g.id, authorize = ch.authorize.len(), revoke = ch.revoke.len(), "updating node group rules");
            let mut written = self
                .write_node_rules(&req.service_key, g, ch, warnings)
                .await?;
            let mut ch = ch.clone();
            // No room for the group rule: nothing was removed (it goes
            // first); the node group keeps or gets the CIDR rules.
            if let Written::AtRuleLimit(e) = &written
                && let Some(source) = &planned.rules.from_group
                && ch.adds_group_rule()
            {
                tracing::warn!(service = %req.service_key, load_balancer = %at.name, group = %g.id, %source, error = %e, "node security group at its rules limit: keeping the CIDR rules");
                warnings.push(at_limit_warning(&req.service_key, &g.id, source, e));
                let cidr = planned.rules.cidr_only();
                ch = nlb::node_rules::node_group_changes(
                    &at.name,
                    &g.descriptions,
                    Some(&cidr),
                    &planned.revocable,
                );
                written = if ch.is_empty() {
                    Written::Refused
                } else {
                    self.write_node_rules(&req.service_key, g, &ch, warnings)
                        .await?
                };
            }
            match written {
                Written::Done => described.push(format!(
                    "node group {}: +{} -{} rule(s)",
                    g.id,
                    ch.authorize.len(),
                    ch.revoke.len()
                )),
                Written::Refused => {}
                Written::AtRuleLimit(e) => return Err(e.into()),
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
        owned: Option<&str>,
        warnings: &mut Vec<Warning>,
    ) -> Result<NodeRulePlan, CloudError> {
        let aws = &self.aws;
        let cidrs = self
            .memory()
            .subnets()
            .cidrs(aws, &at.vpc_id, &at.subnet_ids)
            .await?;
        let mut rules = nlb::node_rules::node_rules(&at.desired, &req.spec.source_ranges, &cidrs);
        let carried = carried_groups(at, owned);
        match self.cloud.nlb_node_ingress {
            NlbNodeIngress::LoadBalancerGroup => rules.from_group = carried.first().cloned(),
            // Only once the NLB carries it (a held NLB may not yet).
            NlbNodeIngress::SharedBackendGroup => {
                rules.from_group = (at.shared.carried())
                    .filter(|id| carried.iter().any(|c| c == id))
                    .map(str::to_string);
            }
            NlbNodeIngress::Cidr => {}
        }
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
        // Groups holding a group rule from a group this NLB carries.
        for source in &carried {
            let rule = Rule::all_from_group(source);
            for g in view.referencing(source) {
                if g.descriptions.get(&rule).map(String::as_str) == Some(nlb::GROUP_RULE) {
                    groups.entry(g.id.clone()).or_insert(g);
                }
            }
        }
        let want_of = |g: &sg::SecurityGroup| at.node_groups.contains(&g.id).then_some(&rules);
        let carried: BTreeSet<String> = carried.into_iter().collect();
        let revocable = self
            .revocable_group_rules(&at.name, &groups, want_of, carried)
            .await?;
        let mut changes = Vec::new();
        for g in groups.into_values() {
            let ch = nlb::node_rules::node_group_changes(
                &at.name,
                &g.descriptions,
                want_of(&g),
                &revocable,
            );
            if ch.is_empty() || self.group_refused(&req.service_key, &g, warnings).await {
                continue;
            }
            changes.push((g, ch));
        }
        Ok(NodeRulePlan {
            rules,
            revocable,
            changes,
        })
    }

    /// Of `carried` (the groups NLB `lb_name` carries), those whose group
    /// rules in `groups` it may revoke: those the plan (`want_of` each
    /// group) would revoke, less those another NLB carries. Only a rule
    /// about to go needs to know who else carries its group (a fresh read,
    /// see `carried_by_other_nlbs`), not every sync of a node group that
    /// keeps its rule.
    async fn revocable_group_rules<'a>(
        &self,
        lb_name: &str,
        groups: &BTreeMap<String, sg::SecurityGroup>,
        want_of: impl Fn(&sg::SecurityGroup) -> Option<&'a NodeRules>,
        carried: BTreeSet<String>,
    ) -> Result<BTreeSet<String>, CloudError> {
        let at_stake: BTreeSet<String> = (groups.values())
            .flat_map(|g| {
                nlb::node_rules::node_group_changes(lb_name, &g.descriptions, want_of(g), &carried)
                    .revoke
            })
            .filter_map(|r| match r.source {
                Source::Group(source) => Some(source),
                Source::Cidr(_) => None,
            })
            .collect();
        self.carried_by_no_other_nlb(lb_name, at_stake).await
    }

    /// The groups of NLB `lb` (being deleted) whose group rules go with it:
    /// those no other NLB carries.
    pub(super) async fn groups_leaving_with(
        &self,
        lb_name: &str,
        lb: Option<&nlb::ActualLb>,
    ) -> Result<BTreeSet<String>, CloudError> {
        let carried: BTreeSet<String> = lb
            .map(|l| l.security_groups.iter().cloned().collect())
            .unwrap_or_default();
        self.carried_by_no_other_nlb(lb_name, carried).await
    }

    /// Of `groups`, those no NLB but `lb_name` carries, by a sweep fresh
    /// enough for a revoke (`carried_by_other_nlbs`); no read for none.
    async fn carried_by_no_other_nlb(
        &self,
        lb_name: &str,
        groups: BTreeSet<String>,
    ) -> Result<BTreeSet<String>, CloudError> {
        if groups.is_empty() {
            return Ok(groups);
        }
        let shared = (self.memory().sweep())
            .carried_by_other_nlbs(&self.aws, &groups, lb_name)
            .await?;
        Ok(groups.difference(&shared).cloned().collect())
    }
}
