//! Every apply of a load-balancer sync, and what it tells the memory
//! ([`crate::aws::memory`]): the writes it sent, as each ended, once it
//! ends however it ends; and for an NLB, the target record made ready
//! first (the groups whose targets the plan moves lose their entries, the
//! removal confirmed, before anything is applied).

use super::targets::{GroupSets, Known, KnownLb};
use super::{AwsLoadBalancers, CloudError, EnsureRequest, planned};
use crate::aws::memory::{Applied, Journal, Write};
use crate::aws::{elb, nlb};
use crate::provider::ErrorKind;
use crate::target_record;

/// The group whose targets change `c` moves (an existing group: a group
/// the same plan creates has no entry yet).
fn moved_group(c: &nlb::Change) -> Option<&str> {
    match c {
        nlb::Change::RegisterTargets {
            target_group: nlb::TgRef::Arn(arn),
            ..
        }
        | nlb::Change::DeregisterTargets { arn, .. } => Some(arn),
        _ => None,
    }
}

impl AwsLoadBalancers {
    /// [`elb::io::apply`], its writes told to the memory.
    pub(super) async fn apply_clb(
        &self,
        name: &str,
        vpc_id: Option<&str>,
        actual: &elb::Actual,
        changes: &[elb::Change],
    ) -> Result<Option<String>, CloudError> {
        let mut journal = Journal::default();
        let applied = elb::io::apply(&self.aws, &mut journal, name, vpc_id, actual, changes).await;
        self.memory().applied(Applied::Writes(journal));
        Ok(applied?)
    }

    /// [`nlb::io::apply`] keeping the target record true (see the module
    /// header); deleted groups' entries go after, with the other writes.
    pub(super) async fn apply_nlb(
        &self,
        name: &str,
        vpc_id: &str,
        actual: &nlb::Actual,
        changes: &[nlb::Change],
    ) -> Result<nlb::io::Applied, CloudError> {
        let moved: Vec<&str> = changes.iter().filter_map(moved_group).collect();
        self.memory()
            .before_target_changes(&moved)
            .await
            .map_err(|e| {
                CloudError::new(
                    "target record",
                    ErrorKind::Transient,
                    format!("not changing the targets of NLB {name} yet: {e}"),
                )
            })?;
        let mut journal = Journal::default();
        let applied = nlb::io::apply(&self.aws, &mut journal, name, vpc_id, actual, changes).await;
        if applied.is_ok() {
            for c in changes {
                if let nlb::Change::DeleteTargetGroup { arn, .. } = c
                    && let Some(key) = target_record::key(arn)
                {
                    journal.push(Write::TargetGroupDeleted { key });
                }
            }
        }
        self.memory().applied(Applied::Writes(journal));
        Ok(applied?)
    }

    /// The deletes of the target groups an earlier sync of NLB `p` left
    /// behind, last of its sync: a failure is logged and fails nothing else
    /// (the memory keeps the entry, and the next sync tries again), so a
    /// group that cannot go never stops the NLB's upkeep. What was done.
    pub(super) async fn delete_left_behind(&self, p: &planned::NlbPlan) -> Vec<String> {
        if p.left_behind.is_empty() {
            return Vec::new();
        }
        match (self.apply_nlb(&p.name, &p.vpc_id, &p.actual, &p.left_behind)).await {
            Ok(_) => p.left_behind.iter().map(nlb::plan::describe).collect(),
            Err(e) => {
                tracing::warn!(load_balancer = %p.name, error = %e, "a target group an earlier sync failed to delete is not deleted yet; the next sync tries again");
                Vec::new()
            }
        }
    }

    /// After a successful apply to load balancer `name`: its settings are
    /// known (until its next resync slot). `created`: the apply created it
    /// (with the settings tag); `changed`: it wrote.
    pub(super) fn settings_synced(
        &self,
        name: &str,
        settings: &planned::Settings,
        created: bool,
        changed: bool,
    ) {
        self.memory().applied(Applied::Settings {
            name,
            digest: &settings.digest,
            in_full: settings.read_in_full || created,
            changed,
        });
    }

    /// After a full ensure that wrote everything it planned: what the
    /// targets-only path needs for Service `req`.
    pub(super) fn ensured_in_full(
        &self,
        req: &EnsureRequest,
        hostname: &str,
        groups: GroupSets,
        lb: KnownLb,
    ) {
        let known = Box::new(Known {
            spec: req.spec.clone(),
            hostname: hostname.to_string(),
            groups,
            lb,
        });
        let uid = &req.uid;
        self.memory().applied(Applied::EnsuredInFull { uid, known });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn only_target_moves_of_existing_groups_need_the_record() {
        let arn = "arn:aws:elasticloadbalancing:r:1:targetgroup/tg/1".to_string();
        let one = BTreeSet::from(["i-1".to_string()]);
        let register = nlb::Change::RegisterTargets {
            target_group: nlb::TgRef::Arn(arn.clone()),
            port: 80,
            instances: one.clone(),
        };
        let deregister = nlb::Change::DeregisterTargets {
            arn: arn.clone(),
            port: 80,
            instances: one.clone(),
        };
        let new_group = nlb::Change::RegisterTargets {
            target_group: nlb::TgRef::Name("tg".into()),
            port: 80,
            instances: one,
        };
        assert_eq!(moved_group(&register), Some(arn.as_str()));
        assert_eq!(moved_group(&deregister), Some(arn.as_str()));
        assert_eq!(moved_group(&new_group), None);
        assert_eq!(moved_group(&nlb::Change::DeleteListener { arn }), None);
    }
}
