//! What a plan deletes: the target groups and owned group a Service's NLB
//! no longer uses, those an earlier sync failed to delete, and everything
//! at the Service's deletion. Each only where [`ownership`] proves this CCM
//! made it for that Service.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{Actual, Change, Desired};
use super::ours;
use crate::aws::ownership::{self, Made};

/// Target groups no listener will use any more, and an owned group the NLB
/// left (Managed → BYO or no group).
pub(super) fn retired_changes(
    desired: &Desired,
    actual: &Actual,
    cluster_id: &str,
    manage_groups: bool,
    changes: &mut Vec<Change>,
) {
    let wanted: BTreeSet<&str> = desired
        .target_groups
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    for tg in &actual.target_groups {
        if !wanted.contains(tg.name.as_str())
            && ours(desired, &tg.name, &tg.tags, cluster_id, Made::TargetGroup)
        {
            changes.push(Change::DeleteTargetGroup {
                arn: tg.arn.clone(),
                name: tg.name.clone(),
            });
        }
    }
    if manage_groups
        && desired.owned_group.is_none()
        && let Some(g) = &actual.owned_group
        && ours(desired, &g.name, &g.tags, cluster_id, Made::NlbGroup)
    {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
}

/// The target groups an earlier sync of this NLB proved the Service's and
/// failed to delete after its listener moved off them (`left`: ARN, name,
/// from the memory), deleted now: AWS lists such a group under no load
/// balancer, so `actual` does not hold it. One the Service wants again by
/// name, or that `actual` holds (the plan decides those), is left alone.
pub(crate) fn left_behind(
    desired: &Desired,
    actual: &Actual,
    left: Vec<(String, String)>,
) -> Vec<Change> {
    let wanted: BTreeSet<&str> = (desired.target_groups.iter())
        .map(|t| t.name.as_str())
        .collect();
    let held: BTreeSet<&str> = (actual.target_groups.iter())
        .map(|t| t.arn.as_str())
        .collect();
    (left.into_iter())
        .filter(|(arn, name)| !wanted.contains(name.as_str()) && !held.contains(arn.as_str()))
        .map(|(arn, name)| Change::DeleteTargetGroup { arn, name })
        .collect()
}

/// Pure: what deleting Service `service_key`'s NLB `lb_name` takes: the
/// load balancer, then its target groups, then its managed group, each only
/// when [`ownership`] proves this CCM made it for that Service.
pub(crate) fn plan_delete(
    actual: &Actual,
    cluster_id: &str,
    lb_name: &str,
    service_key: &str,
) -> Vec<Change> {
    let proven = |made: Made, name: &str, tags: &BTreeMap<String, String>| {
        ownership::prove(made, name, tags, cluster_id, Some(service_key)).is_ok()
    };
    let mut changes = Vec::new();
    if let Some(lb) = &actual.lb
        && proven(Made::LoadBalancer, lb_name, &lb.tags)
    {
        changes.push(Change::DeleteLoadBalancer {
            arn: lb.arn.clone(),
            reason: "the Service no longer asks for it".into(),
        });
    }
    for tg in &actual.target_groups {
        if proven(Made::TargetGroup, &tg.name, &tg.tags) {
            changes.push(Change::DeleteTargetGroup {
                arn: tg.arn.clone(),
                name: tg.name.clone(),
            });
        }
    }
    if let Some(g) = &actual.owned_group
        && proven(Made::NlbGroup, &g.name, &g.tags)
    {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
}
