//! The target record's part in NLB syncs (see [`crate::target_record`]): a
//! group's targets come from the record, not from `DescribeTargetHealth`,
//! when it holds what the Service asks for; every change of a group's
//! targets removes its entry first, and a sync that succeeded records what
//! each group now holds.

use std::collections::BTreeSet;

use aws_sdk_elasticloadbalancingv2::types as t;

use super::{AwsLoadBalancers, CloudError};
use crate::aws::nlb;
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
    /// [`nlb::io::apply`] keeping the record true: the groups whose targets
    /// `changes` move lose their entries (the removal confirmed) before
    /// anything is applied, and deleted groups' entries go after.
    pub(super) async fn apply_nlb(
        &self,
        name: &str,
        vpc_id: &str,
        actual: &nlb::Actual,
        changes: &[nlb::Change],
    ) -> Result<nlb::io::Applied, CloudError> {
        let moved: Vec<String> = changes
            .iter()
            .filter_map(moved_group)
            .filter_map(target_record::key)
            .collect();
        self.record
            .before_change(&moved)
            .await
            .map_err(|e| {
                CloudError::new(
                    "target record",
                    ErrorKind::Transient,
                    format!(
                        "not changing the targets of NLB {name} yet: their entries in the target record could not be removed first: {e}"
                    ),
                )
            })?;
        let applied = nlb::io::apply(&self.aws, name, vpc_id, actual, changes).await?;
        let deleted: Vec<String> = changes
            .iter()
            .filter_map(|c| match c {
                nlb::Change::DeleteTargetGroup { arn, .. } => target_record::key(arn),
                _ => None,
            })
            .collect();
        self.record.forget(&deleted);
        Ok(applied)
    }

    /// Whether the record says group `g` holds exactly `instances`.
    pub(super) fn recorded_as(&self, g: &t::TargetGroup, instances: &BTreeSet<String>) -> bool {
        let (Some(arn), Some(port)) = (g.target_group_arn(), g.port()) else {
            return false;
        };
        target_record::key(arn).is_some_and(|k| {
            self.record
                .trusts(&k, &target_record::digest(port, instances))
        })
    }
}

#[cfg(test)]
mod tests {
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
