//! NLB, pure: the settings behind cloud.conf `NLBListenerSettings = true`
//! (the health-check timeout, the ALPN policy) and this CCM's record of
//! what it applied, as the plan ([`super`]) sends and records them: back to
//! AWS's default only for what the record says this CCM applied.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{ActualTargetGroup, Change, Desired};
use crate::aws::tags;

/// The health-check timeout to send to an existing group: with cloud.conf
/// `NLBListenerSettings = true`, the annotation's, else AWS's default when
/// this CCM's record says it applied one; otherwise none (left as it is).
pub(super) fn health_timeout_target(desired: &Desired, have: &ActualTargetGroup) -> Option<i32> {
    let setting = desired.health_timeout?;
    let recorded = have.tags.contains_key(tags::HEALTH_TIMEOUT_TAG);
    match setting.want {
        Some(t) => Some(t),
        None if recorded => Some(super::super::default_health_timeout(&have.health.protocol)),
        None => None,
    }
}

/// The record of the timeout this CCM applied: written with the timeout
/// (or kept up to date), removed when the annotation is. A timeout nobody
/// recorded that already matches (the Go CCM's group) gets no write.
pub(super) fn health_timeout_record(
    desired: &Desired,
    have: &ActualTargetGroup,
    written: bool,
    changes: &mut Vec<Change>,
) {
    let Some(setting) = desired.health_timeout else {
        return;
    };
    let recorded = have.tags.get(tags::HEALTH_TIMEOUT_TAG);
    let arn = Some(have.arn.clone());
    match setting.want {
        Some(t) if written || recorded.is_some_and(|r| *r != t.to_string()) => {
            changes.push(Change::AddTags {
                arn,
                tags: BTreeMap::from([(tags::HEALTH_TIMEOUT_TAG.to_string(), t.to_string())]),
            });
        }
        None if recorded.is_some() => changes.push(Change::RemoveTags {
            arn,
            keys: BTreeSet::from([tags::HEALTH_TIMEOUT_TAG.to_string()]),
        }),
        _ => {}
    }
}

/// The ALPN policy to send to the TLS listeners: with cloud.conf
/// `NLBListenerSettings = true`, the annotation's, else AWS's `None` when
/// the NLB's record (`lb_tags`) says this CCM applied one; otherwise none
/// (left as it is).
pub(super) fn alpn_target(desired: &Desired, lb_tags: &BTreeMap<String, String>) -> Option<String> {
    let setting = desired.alpn.as_ref()?;
    match &setting.want {
        Some(p) => Some(p.clone()),
        None if lb_tags.contains_key(tags::ALPN_POLICY_TAG) => {
            Some(super::super::ALPN_NONE.to_string())
        }
        None => None,
    }
}

/// Whether the NLB's record of the ALPN policy this CCM applied (on
/// `lb_tags`) differs from what the Service asks for: then the listeners
/// are read, not taken as asked for.
pub(crate) fn alpn_record_stale(desired: &Desired, lb_tags: &BTreeMap<String, String>) -> bool {
    let Some(setting) = &desired.alpn else {
        return false;
    };
    lb_tags.get(tags::ALPN_POLICY_TAG) != setting.want.as_ref()
}

/// The record of the ALPN policy this CCM applied, after the listeners:
/// written with the policy (or kept up to date), removed once the
/// listeners are back to AWS's `None`.
pub(super) fn alpn_record(
    desired: &Desired,
    lb_tags: &BTreeMap<String, String>,
    changes: &mut Vec<Change>,
) {
    let Some(setting) = &desired.alpn else {
        return;
    };
    let recorded = lb_tags.get(tags::ALPN_POLICY_TAG);
    match &setting.want {
        Some(p) if recorded != Some(p) && lb_tags.len() < tags::MAX_LB_TAGS => {
            changes.push(Change::AddTags {
                arn: None,
                tags: BTreeMap::from([(tags::ALPN_POLICY_TAG.to_string(), p.clone())]),
            });
        }
        None if recorded.is_some() => changes.push(Change::RemoveTags {
            arn: None,
            keys: BTreeSet::from([tags::ALPN_POLICY_TAG.to_string()]),
        }),
        _ => {}
    }
}
