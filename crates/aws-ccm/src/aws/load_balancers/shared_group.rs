//! The cluster's shared backend security group (`NLBNodeIngress =
//! SharedBackendGroup`, see [`crate::aws::nlb::shared_group`]): found in
//! the VPC's groups by its name and proven by its tags, made by the first
//! NLB sync that needs it, and detached from an NLB leaving the mode once
//! its node rules are back. The CCM never deletes it.

use std::collections::BTreeMap;

use super::{AwsLoadBalancers, CloudError, NlbPlan, Warning};
use crate::aws::memory::{Applied, Journal};
use crate::aws::nlb::shared_group::{
    SHARED_GROUP_DESCRIPTION, SharedUse, shared_group_name, shared_group_tags, with_shared,
};
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups::{self as sg, SecurityGroup};
use crate::aws::{elb, nlb};

/// Event reason: a group has the shared backend group's name but not its
/// tags; the NLB keeps its node rules as they are.
const SHARED_GROUP_NOT_OURS: &str = "SharedBackendGroupNotOurs";

/// What [`AwsLoadBalancers::shared_use`] decided for one NLB.
pub(super) struct SharedOutcome {
    pub(super) use_: SharedUse,
    /// The group's ID, when it exists and is proven ours (or made now).
    pub(super) id: Option<String>,
    /// The group is made first (this sync made it; a plan would).
    pub(super) creates: bool,
    /// A group has its name but not its proof.
    pub(super) warning: Option<Warning>,
}

/// The shared group as a sync found it among the VPC's groups.
pub(super) enum Found {
    /// Proven this CCM's: its ID.
    Ours(String),
    /// Nothing has its name.
    Missing,
    /// A group has its name but not its proof: never used.
    NotOurs { id: String, why: String },
}

impl AwsLoadBalancers {
    fn mode_on(&self) -> bool {
        use crate::cloud_config::NlbNodeIngress;
        self.cloud.nlb_node_ingress == NlbNodeIngress::SharedBackendGroup
    }

    /// The shared group's name in this cluster.
    pub(super) fn shared_group_name(&self) -> String {
        shared_group_name(&self.cluster_id)
    }

    /// The shared group among `groups` (read with its name).
    pub(super) fn find_shared_group(&self, groups: &BTreeMap<String, SecurityGroup>) -> Found {
        let name = self.shared_group_name();
        let Some(g) = groups.values().find(|g| g.name == name) else {
            return Found::Missing;
        };
        match ownership::prove(
            Made::SharedBackendGroup,
            &g.name,
            &g.tags,
            &self.cluster_id,
            None,
        ) {
            Ok(()) => Found::Ours(g.id.clone()),
            Err(why) => Found::NotOurs {
                id: g.id.clone(),
                why: why.to_string(),
            },
        }
    }

    /// Makes the shared group in `vpc_id` (no rules: the NLBs' own groups
    /// admit their clients). Returns its ID.
    pub(super) async fn create_shared_group(&self, vpc_id: &str) -> Result<String, CloudError> {
        let name = self.shared_group_name();
        let tags = shared_group_tags(&self.cluster_id);
        let mut journal = Journal::default();
        let created = sg::io::create(
            &self.aws,
            &mut journal,
            vpc_id,
            &name,
            SHARED_GROUP_DESCRIPTION,
            &tags,
        )
        .await;
        self.memory().applied(Applied::Writes(journal));
        let id = created?;
        tracing::info!(group = %id, %name, vpc = vpc_id, "created the shared backend security group");
        Ok(id)
    }

    /// The shared group's use by the NLB `desired` asks for (`actual`, as
    /// read), its groups in `desired` completed with it; made when the mode
    /// wants it and `create` (a sync, not a plan). A group with its name
    /// that is not proven ours is never used: a warning, and the NLB's
    /// groups and node rules stay as the mode would leave them without it.
    pub(super) async fn shared_use(
        &self,
        vpc_id: &str,
        groups: &BTreeMap<String, SecurityGroup>,
        desired: &mut nlb::Desired,
        actual: &nlb::Actual,
        create: bool,
    ) -> Result<SharedOutcome, CloudError> {
        let mode_on = self.mode_on();
        // As `nlb::plan::plan`: an existing NLB without groups keeps none.
        let lb_groups = actual.lb.as_ref().map(|l| l.security_groups.as_slice());
        let manages_groups = desired.groups_managed && lb_groups.is_none_or(|g| !g.is_empty());
        let mut out = SharedOutcome {
            use_: SharedUse::None,
            id: None,
            creates: false,
            warning: None,
        };
        let id = match self.find_shared_group(groups) {
            Found::Ours(id) => Some(id),
            Found::NotOurs { id, why } => {
                if mode_on && manages_groups {
                    let name = self.shared_group_name();
                    tracing::warn!(group = %id, %name, %why, "a security group has the shared backend group's name but is not this CCM's: not using it");
                    out.warning = Some(Warning {
                        reason: SHARED_GROUP_NOT_OURS,
                        message: format!(
                            "Security group {id} is named {name}, the shared backend group's name, but {why}: the NLB does not use it and keeps its node rules. Rename or delete {id}, or tag it kubernetes.io/cluster/{}=owned and {}={} if this CCM made it",
                            self.cluster_id,
                            nlb::shared_group::SHARED_GROUP_TAG,
                            self.cluster_id
                        ),
                    });
                }
                return Ok(out);
            }
            Found::Missing if mode_on && manages_groups => {
                out.creates = true;
                // A plan shows the placeholder ID.
                if create {
                    Some(self.create_shared_group(vpc_id).await?)
                } else {
                    None
                }
            }
            Found::Missing => None,
        };
        out.use_ = nlb::shared_group::shared_use(mode_on, manages_groups, id.as_deref(), lb_groups);
        if lb_groups.is_none()
            && !nlb::shared_group::carried_at_create(desired.security_groups.len())
        {
            tracing::info!(
                load_balancer = %desired.name,
                groups = desired.security_groups.len(),
                "a new NLB whose own groups fill the default quota: made without the shared backend group"
            );
            out.use_ = SharedUse::None;
        }
        desired.security_groups = with_shared(&desired.security_groups, &out.use_);
        out.id = id;
        Ok(out)
    }

    /// After NLB `at`'s node rules are back in its node groups: detaches
    /// the shared group from it (leaving the mode). `Ok(true)` when it did.
    pub(super) async fn detach_shared_group(
        &self,
        at: &NlbPlan,
        owned: Option<&str>,
    ) -> Result<bool, CloudError> {
        let SharedUse::Leaving(shared) = &at.shared else {
            return Ok(false);
        };
        let keep: Vec<elb::GroupRef> = (at.desired.security_groups.iter())
            .filter(|g| **g != elb::GroupRef::Id(shared.clone()))
            .cloned()
            .collect();
        let mut actual = at.actual.clone();
        if let Some(id) = owned {
            actual
                .owned_group
                .get_or_insert_with(SecurityGroup::default)
                .id = id.to_string();
        }
        tracing::info!(load_balancer = %at.name, group = %shared, "node rules in: detaching the shared backend security group");
        let change = nlb::Change::SetSecurityGroups(keep);
        self.apply_nlb(&at.name, &at.vpc_id, &actual, &[change])
            .await?;
        // A sweep read before this write no longer answers for this NLB.
        self.settings_synced(&at.name, &at.settings, false, true);
        Ok(true)
    }

    /// The node groups whose rule from the shared group `shared` (proven
    /// ours) goes once NLB `at` no longer carries it: none in the mode or
    /// while `at` keeps it, none while another NLB carries it (by a sweep
    /// fresh enough for a revoke). Nothing is read from the load balancers
    /// when no group holds such a rule. The one reading for the sync and for
    /// `aws-ccm plan`.
    pub(super) async fn unused_shared_rule_holders(
        &self,
        at: &NlbPlan,
        shared: &str,
    ) -> Result<Vec<SecurityGroup>, CloudError> {
        if self.mode_on() || matches!(at.shared, SharedUse::Carry(_)) {
            return Ok(Vec::new());
        }
        let rule = sg::Rule::all_from_group(shared);
        let view = (self.aws.memory().groups())
            .groups(&self.aws, &at.vpc_id)
            .await?;
        let holders: Vec<SecurityGroup> = (view.referencing(shared).into_iter())
            .filter(|g| g.descriptions.get(&rule).map(String::as_str) == Some(nlb::GROUP_RULE))
            .collect();
        if holders.is_empty() {
            return Ok(holders);
        }
        let others = (self.memory().sweep())
            .carried_by_other_nlbs(&self.aws, &[shared.to_string()].into(), &at.name)
            .await?;
        Ok(if others.is_empty() {
            holders
        } else {
            Vec::new()
        })
    }

    /// Out of the mode, with NLB `at` no longer carrying the shared group
    /// (`shared`, proven ours): revokes its rules in the VPC's groups once no
    /// NLB carries it ([`Self::unused_shared_rule_holders`]). `Ok(true)` when
    /// it revoked.
    pub(super) async fn revoke_unused_shared_rules(
        &self,
        at: &NlbPlan,
        shared: &str,
    ) -> Result<bool, CloudError> {
        let holders = self.unused_shared_rule_holders(at, shared).await?;
        if holders.is_empty() {
            return Ok(false);
        }
        let mut journal = Journal::default();
        let revoke = std::collections::BTreeSet::from([sg::Rule::all_from_group(shared)]);
        let written = async {
            for g in &holders {
                tracing::info!(group = %g.id, %shared, "no NLB carries the shared backend group: revoking its rule");
                sg::io::revoke_described(&self.aws, &mut journal, &g.id, &revoke, &g.descriptions)
                    .await?;
            }
            Ok::<_, crate::aws::AwsError>(())
        }
        .await;
        self.memory().applied(Applied::Writes(journal));
        written?;
        Ok(true)
    }
}
