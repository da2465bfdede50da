//! NLB, pure: the settings behind cloud.conf `NLBListenerSettings = true`
//! (the health-check timeout, the ALPN policy, the listener attributes) and this CCM's record of
//! what it applied, as the plan ([`super`]) sends and records them: back to
//! AWS's default only for what the record says this CCM applied.

use std::collections::{BTreeMap, BTreeSet};

use super::super::{ActualListener, ActualTargetGroup, Change, Desired};
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

/// This CCM's record of the listener attributes it applied, as the NLB's
/// tag [`tags::LISTENER_ATTRIBUTES_TAG`] holds it: `<port>:<key>=<value>`,
/// space-separated (AWS's tag values take no comma). A piece that does not
/// read, or names a key this CCM does not send, is dropped (it proves
/// nothing was applied, and has no default to return to).
pub(crate) fn listener_attributes_recorded(
    lb_tags: &BTreeMap<String, String>,
) -> BTreeMap<i32, BTreeMap<String, String>> {
    let mut out: BTreeMap<i32, BTreeMap<String, String>> = BTreeMap::new();
    let record = lb_tags.get(tags::LISTENER_ATTRIBUTES_TAG);
    for piece in record.into_iter().flat_map(|r| r.split_whitespace()) {
        let Some((port, pair)) = piece.split_once(':') else {
            continue;
        };
        if let (Ok(port), Some((k, v))) = (port.parse(), pair.split_once('='))
            && k == super::super::LISTENER_IDLE_TIMEOUT
        {
            out.entry(port).or_default().insert(k.into(), v.into());
        }
    }
    out
}

/// The record of `applied` (see [`listener_attributes_recorded`]).
pub(crate) fn listener_attributes_record(
    applied: &BTreeMap<i32, BTreeMap<String, String>>,
) -> String {
    let pieces = applied
        .iter()
        .flat_map(|(port, attrs)| attrs.iter().map(move |(k, v)| format!("{port}:{k}={v}")));
    pieces.collect::<Vec<_>>().join(" ")
}

/// What the record should say after this plan: each TCP listener's wanted
/// attributes, or, for a listener whose annotation is held (refused), what
/// the record said. `None` without cloud.conf `NLBListenerSettings = true`.
fn listener_attributes_after(
    desired: &Desired,
    lb_tags: &BTreeMap<String, String>,
) -> Option<BTreeMap<i32, BTreeMap<String, String>>> {
    let setting = desired.listener_attributes.as_ref()?;
    let recorded = listener_attributes_recorded(lb_tags);
    let tcp = desired.listeners.iter().filter(|l| l.protocol == "TCP");
    let after = tcp.filter_map(|l| {
        let attrs = if setting.held.contains(&l.port) {
            recorded.get(&l.port)
        } else {
            setting.want.get(&l.port)
        };
        attrs.filter(|a| !a.is_empty()).map(|a| (l.port, a.clone()))
    });
    Some(after.collect())
}

/// Whether the NLB's record of the listener attributes this CCM applied
/// differs from what the Service asks for: then the listeners are read,
/// not taken as asked for.
pub(crate) fn listener_attributes_stale(
    desired: &Desired,
    lb_tags: &BTreeMap<String, String>,
) -> bool {
    listener_attributes_after(desired, lb_tags)
        .is_some_and(|after| after != listener_attributes_recorded(lb_tags))
}

/// The `ModifyListenerAttributes` steps after the listener steps, then the
/// record: a TCP listener gets what the Service asks for where the record
/// says otherwise (or it is new, or just made TCP), and AWS's default for a
/// key this CCM recorded that the Service no longer asks for. A held
/// listener, a listener that is not TCP, and a value nobody recorded that
/// the Service does not ask for (the Go CCM's, a hand edit) are left.
pub(super) fn listener_attributes_changes(
    desired: &Desired,
    have: &BTreeMap<i32, &ActualListener>,
    lb_tags: &BTreeMap<String, String>,
    changes: &mut Vec<Change>,
) {
    let Some(setting) = &desired.listener_attributes else {
        return;
    };
    let recorded = listener_attributes_recorded(lb_tags);
    let none = BTreeMap::new();
    for l in desired.listeners.iter().filter(|l| l.protocol == "TCP") {
        if setting.held.contains(&l.port) {
            continue;
        }
        let existing = have.get(&l.port);
        let was_tcp = existing.is_some_and(|h| h.protocol == "TCP");
        let want = setting.want.get(&l.port).unwrap_or(&none);
        let rec = recorded.get(&l.port).filter(|_| was_tcp).unwrap_or(&none);
        let mut send: BTreeMap<String, String> = want
            .iter()
            .filter(|(k, v)| !was_tcp || rec.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for k in rec.keys().filter(|k| !want.contains_key(*k)) {
            let default = super::super::LISTENER_IDLE_TIMEOUT_DEFAULT;
            send.insert(k.clone(), default.to_string());
        }
        if !send.is_empty() {
            changes.push(Change::ModifyListenerAttributes {
                arn: existing.map(|h| h.arn.clone()),
                port: l.port,
                attributes: send,
            });
        }
    }
    let after = listener_attributes_after(desired, lb_tags).unwrap_or_default();
    let record = listener_attributes_record(&after);
    let now = lb_tags.get(tags::LISTENER_ATTRIBUTES_TAG);
    if after.is_empty() {
        if now.is_some() {
            changes.push(Change::RemoveTags {
                arn: None,
                keys: BTreeSet::from([tags::LISTENER_ATTRIBUTES_TAG.to_string()]),
            });
        }
    } else if now != Some(&record) && (now.is_some() || lb_tags.len() < tags::MAX_LB_TAGS) {
        changes.push(Change::AddTags {
            arn: None,
            tags: BTreeMap::from([(tags::LISTENER_ATTRIBUTES_TAG.to_string(), record)]),
        });
    }
}
