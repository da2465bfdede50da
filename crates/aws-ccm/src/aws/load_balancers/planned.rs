//! A sync's reads and plan, stopping before apply: what `ensure` would
//! change now (`aws-ccm plan`). `ensure` runs the same functions and then
//! applies their changes.

use std::collections::{BTreeMap, BTreeSet};

use super::Warning;
use super::{AwsLoadBalancers, CloudError, EnsureRequest, LoadBalancerKind, Scope};
use crate::aws::nlb::node_rules::RuleChanges;
use crate::aws::nlb::shared_group::SharedUse;
use crate::aws::security_groups as sg;
use crate::aws::{elb, nlb};

/// A classic ELB sync's plan.
#[derive(Clone, Debug)]
pub struct ClbPlan {
    pub(crate) name: String,
    pub(crate) vpc_id: String,
    pub(crate) actual: elb::Actual,
    pub(crate) changes: Vec<elb::Change>,
    /// Writes IAM refuses, left out of `changes`.
    pub(crate) warnings: Vec<Warning>,
    /// Whether the Service's NLB goes first (it asked for an NLB before).
    pub(crate) handover: bool,
    /// The settings only per-load-balancer reads show.
    pub(crate) settings: Settings,
    /// The backend instances the plan registers.
    pub(crate) instances: BTreeSet<String>,
    /// The backends' security-group sets (for the targets-only path).
    pub(crate) backend_groups: super::targets::GroupSets,
}

/// The settings of a load balancer that only per-load-balancer reads show
/// (see [`super::sweep`]).
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    /// Their digest as the Service asks for them.
    pub(crate) digest: String,
    /// Whether they were read (else known: taken as asked for).
    pub(crate) read_in_full: bool,
}

/// An NLB sync's plan, its node rules apart.
#[derive(Clone, Debug)]
pub struct NlbPlan {
    pub(crate) name: String,
    pub(crate) vpc_id: String,
    pub(crate) subnet_ids: Vec<String>,
    pub(crate) desired: nlb::Desired,
    pub(crate) actual: nlb::Actual,
    pub(crate) changes: Vec<nlb::Change>,
    /// The deletes of target groups an earlier sync failed to delete
    /// ([`nlb::plan::left_behind`]): applied after everything else, and a
    /// failure of theirs fails nothing else.
    pub(crate) left_behind: Vec<nlb::Change>,
    pub(crate) warnings: Vec<Warning>,
    /// Whether the Service's classic ELB goes first.
    pub(crate) handover: bool,
    /// The groups read (the owned one and the backends').
    pub(crate) groups: BTreeMap<String, sg::SecurityGroup>,
    /// The backends' node groups (those that get the node rules).
    pub(crate) node_groups: BTreeSet<String>,
    /// What the NLB does with the cluster's shared backend group.
    pub(crate) shared: SharedUse,
    /// The shared group's ID, when it exists and is proven ours.
    pub(crate) shared_id: Option<String>,
    /// Whether the shared group is made first (this sync made it; for a
    /// plan, would make it).
    pub(crate) creates_shared: bool,
    /// The settings only per-load-balancer reads show.
    pub(crate) settings: Settings,
    /// The backends' security-group sets (for the targets-only path).
    pub(crate) backend_groups: super::targets::GroupSets,
}

/// What one Service's sync would change.
#[derive(Clone, Debug)]
pub enum Planned {
    Classic(Box<ClbPlan>),
    Network {
        plan: Box<NlbPlan>,
        /// Rule changes per node group.
        node_rules: Vec<(sg::SecurityGroup, RuleChanges)>,
        /// The node groups whose rule from the shared backend group goes
        /// after them, the NLB having let it go and no NLB carrying it
        /// (leaving `SharedBackendGroup`).
        shared_rule_revokes: Vec<String>,
    },
}

impl AwsLoadBalancers {
    /// What [`super::LoadBalancers::ensure`] would change now; nothing is
    /// written (a type change's handover is only looked for).
    /// In upkeep ([`Scope::Upkeep`]) only the upkeep's changes are kept.
    pub async fn plan(&self, req: &EnsureRequest) -> Result<Planned, CloudError> {
        let (upkeep, rules) = match req.scope {
            Scope::Full => (false, true),
            Scope::Upkeep { node_rules } => (true, node_rules),
        };
        if req.spec.kind != LoadBalancerKind::Network {
            let mut plan = self.plan_clb(req, false).await?;
            if upkeep {
                plan.changes.retain(super::upkeep::is_clb_upkeep);
            }
            return Ok(Planned::Classic(Box::new(plan)));
        }
        let mut plan = self.plan_nlb(req, false).await?;
        if upkeep {
            plan.changes.retain(super::upkeep::is_nlb_upkeep);
        }
        let mut node_rules = Vec::new();
        let mut shared_rule_revokes = Vec::new();
        if rules && !self.cloud.disable_security_group_ingress {
            let groups = std::mem::take(&mut plan.groups);
            let mut warnings = std::mem::take(&mut plan.warnings);
            node_rules = self
                .plan_nlb_node_rules(req, &plan, groups, None, &mut warnings)
                .await?
                .changes;
            plan.warnings = warnings;
            // As the sync: after the node rules (and a leaving NLB's
            // detach), the shared group's rules once no NLB carries it.
            if let Some(shared) = &plan.shared_id {
                shared_rule_revokes = (self.unused_shared_rule_holders(&plan, shared).await?)
                    .into_iter()
                    .map(|g| g.id)
                    .collect();
            }
        }
        Ok(Planned::Network {
            plan: Box::new(plan),
            node_rules,
            shared_rule_revokes,
        })
    }

    /// Type change handover: whether the Service was a classic ELB until
    /// now (with `hand_over` that ELB is deleted first; else only looked
    /// for). `exists`: the Service's NLB exists already.
    async fn nlb_handover(
        &self,
        req: &EnsureRequest,
        name: &str,
        exists: bool,
        hand_over: bool,
    ) -> Result<bool, CloudError> {
        Ok(match (exists, hand_over) {
            (true, _) => false,
            (false, true) => {
                let protected = req.spec.protected();
                (self.delete_clb(&req.service_key, &req.uid, true, protected))
                    .await?
                    .changed
            }
            (false, false) => elb::io::describe(&self.aws, name).await?.is_some(),
        })
    }

    /// Reads and plans an NLB sync, stopping before apply (the node rules
    /// are planned apart: [`Self::plan_nlb_node_rules`]). With `hand_over`
    /// a classic ELB the Service had is deleted first; without, only looked for.
    pub(crate) async fn plan_nlb(
        &self,
        req: &EnsureRequest,
        hand_over: bool,
    ) -> Result<NlbPlan, CloudError> {
        let spec = &req.spec;
        let name = elb::load_balancer_name(&req.uid);
        let (vpc_id, backends) = self.vpc_and_backends(&req.instance_ids).await?;
        let backends = backends.list();
        let backend_groups = super::targets::group_sets(backends.iter().copied());
        let subnet_ids = self.subnet_ids(spec, &vpc_id).await?;
        // An NLB's node rules are planned apart (see `nlb_rules`).
        let env = self.environment(subnet_ids.clone(), &backends, BTreeSet::new());
        let mut desired = nlb::plan::desired(
            spec,
            &req.service_key,
            &req.uid,
            &self.cluster_id,
            &self.cloud,
            &env,
        )
        .map_err(CloudError::invalid)?;

        let settings = super::sweep::nlb_settings(&desired);
        let (lb, target_groups, read_in_full) = self
            .nlb_actual(&name, &req.uid, &desired, &settings)
            .await?;
        let handover = (self.nlb_handover(req, &name, lb.is_some(), hand_over)).await?;
        let owned_names =
            (self.nlb_group_names_of(&req.service_key, &req.uid, lb.as_ref())).await?;
        let read_names = [owned_names.clone(), vec![self.shared_group_name()]].concat();
        let (groups, node_groups) = self
            .sync_groups(&req.uid, &vpc_id, &read_names, &backends)
            .await?;
        let actual = nlb::Actual {
            lb,
            target_groups,
            owned_group: self.nlb_owned_group(&owned_names, groups.values()),
        };
        let diffs = nlb::plan::left_alone(&desired, &actual, &self.cluster_id);
        let lb_tags = actual.lb.as_ref().map(|l| &*l.tags);
        let mut warnings: Vec<_> =
            super::drift::drift_warning(&req.service_key, &name, lb_tags, &diffs)
                .into_iter()
                .collect();
        // The shared backend group joins the NLB's groups (its own first).
        let shared = (self.shared_use(&vpc_id, &groups, &mut desired, &actual, hand_over)).await?;
        warnings.extend(shared.warning);
        let mut changes = nlb::plan::plan(&desired, &actual, &self.cluster_id);
        super::sweep::record_in_nlb_create(&mut changes, &settings);
        let changes = self
            .refuse_listeners(&req.service_key, &actual, changes, &mut warnings)
            .await?;
        let left = self.memory().left_target_groups(&name);
        let left_behind = nlb::plan::left_behind(&desired, &actual, left);
        Ok(NlbPlan {
            name,
            vpc_id,
            subnet_ids,
            desired,
            actual,
            changes,
            left_behind,
            warnings,
            handover,
            groups,
            node_groups,
            shared: shared.use_,
            shared_id: shared.id,
            creates_shared: shared.creates,
            settings: Settings {
                digest: settings,
                read_in_full,
            },
            backend_groups,
        })
    }
}
