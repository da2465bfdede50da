//! A sync's reads and plan, stopping before apply: what `ensure` would
//! change now (`aws-ccm plan`). `ensure` runs the same functions and then
//! applies their changes.

use std::collections::{BTreeMap, BTreeSet};

use super::nlb_rules::NlbNodeRules;
use super::refusals::Warning;
use super::{AwsLoadBalancers, EnsureRequest, LbError, LoadBalancerKind};
use crate::aws::nlb::node_rules::RuleChanges;
use crate::aws::security_groups as sg;
use crate::aws::{elb, nlb};

/// A classic ELB sync's plan.
#[derive(Clone, Debug)]
pub struct ClbPlan {
    pub name: String,
    pub vpc_id: String,
    pub actual: elb::Actual,
    pub changes: Vec<elb::Change>,
    /// Writes IAM refuses, left out of `changes`.
    pub warnings: Vec<Warning>,
    /// Whether the Service's NLB goes first (it asked for an NLB before).
    pub handover: bool,
}

/// An NLB sync's plan, its node rules apart.
#[derive(Clone, Debug)]
pub struct NlbPlan {
    pub name: String,
    pub vpc_id: String,
    pub subnet_ids: Vec<String>,
    pub desired: nlb::Desired,
    pub actual: nlb::Actual,
    pub changes: Vec<nlb::Change>,
    pub warnings: Vec<Warning>,
    /// Whether the Service's classic ELB goes first.
    pub handover: bool,
    /// The groups read (the owned one and the backends').
    pub groups: BTreeMap<String, sg::SecurityGroup>,
    /// The backends' node groups.
    pub node_groups: BTreeSet<String>,
}

/// What one Service's sync would change.
#[derive(Clone, Debug)]
pub enum Planned {
    Classic(ClbPlan),
    Network {
        plan: NlbPlan,
        /// Rule changes per node group.
        node_rules: Vec<(sg::SecurityGroup, RuleChanges)>,
    },
}

impl AwsLoadBalancers {
    /// What [`super::LoadBalancers::ensure`] would change now; nothing is
    /// written (a type change's handover is only looked for).
    pub async fn plan(&self, req: &EnsureRequest) -> Result<Planned, LbError> {
        if req.spec.kind != LoadBalancerKind::Network {
            return Ok(Planned::Classic(self.plan_clb(req, false).await?));
        }
        let mut plan = self.plan_nlb(req, false).await?;
        let mut node_rules = Vec::new();
        if !self.cloud.disable_security_group_ingress {
            let groups = std::mem::take(&mut plan.groups);
            let at = NlbNodeRules {
                name: &plan.name,
                vpc_id: &plan.vpc_id,
                subnet_ids: &plan.subnet_ids,
                desired: &plan.desired,
                node_groups: &plan.node_groups,
            };
            node_rules = self
                .plan_nlb_node_rules(req, &at, groups, &mut plan.warnings)
                .await?;
        }
        Ok(Planned::Network { plan, node_rules })
    }
}
