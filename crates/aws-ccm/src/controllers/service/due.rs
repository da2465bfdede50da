//! When a Service needs a sync, and when it next will: what a scan
//! decides for each Service from its state, and the instant the controller
//! may sleep until (its retry, or its next resync slot).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tokio::time::Instant;

use super::{
    Backends, DEPENDENCY_PATIENCE, Derived, Job, KeyState, fingerprint, key, target_labels,
    wants_load_balancer,
};
use crate::provider::load_balancers::{next_resync_slot_at, resync_slot};

/// Whether `svc` (with state `entry`) needs a sync now, and which. A
/// Service whose sync failed is retried when its backoff is due, or at once
/// when it changed since.
pub(super) fn decide(
    entry: &mut KeyState,
    svc: Arc<Service>,
    mut backends: impl FnMut(&BTreeMap<String, String>) -> Backends,
    resync: Option<Duration>,
    now: Instant,
) -> Option<Job> {
    if entry.in_flight {
        return None;
    }
    let rv = svc.resource_version().unwrap_or_default();
    let derived = match entry.derived.take() {
        Some(d) if d.resource_version == rv && !rv.is_empty() => d,
        _ => Derived {
            fingerprint: fingerprint(&svc),
            targets: target_labels(&svc),
            resource_version: rv,
        },
    };
    let fp = derived.fingerprint;
    let want_backends = wants_load_balancer(&svc).then(|| backends(&derived.targets));
    entry.derived = Some(derived);
    let want_hash = want_backends.as_ref().map(|b| b.hash);
    let service_changed = entry.synced_fingerprint != Some(fp);
    // As upstream's node sync: a changed backend set is acted on only when
    // the node set moved (`node_set`), then compared with the last synced
    // one (`nodesSufficientlyEqual`); a set equal to it is taken as synced.
    let want_node_set = want_backends.as_ref().map(|b| b.node_set);
    let node_set_moved = want_node_set.is_some() && entry.synced_node_set != want_node_set;
    let backends_changed = node_set_moved && entry.synced_backends != want_hash;
    if node_set_moved && !backends_changed {
        entry.synced_node_set = want_node_set;
    }
    let resync_is_due = resync
        .zip(entry.last_sync)
        .is_some_and(|(every, t)| resync_due(&svc, every, t, now));
    let retry_due = entry.retry_at.is_some_and(|t| t <= now);
    let due = service_changed
        || backends_changed
        || retry_due
        || entry.last_sync.is_none()
        || resync_is_due;
    let backing_off =
        entry.retry_at.is_some_and(|t| t > now) && entry.failed_fingerprint == Some(fp);
    if !due || backing_off {
        return None;
    }
    let may_wait = entry
        .waiting_since
        .is_none_or(|since| now - since < DEPENDENCY_PATIENCE);
    Some(Job {
        key: key(&svc),
        svc,
        backends: want_backends,
        fingerprint: fp,
        service_changed,
        may_wait,
        // A retry or a resync ensures in full.
        targets_only: !service_changed
            && backends_changed
            && entry.synced_backends.is_some()
            && entry.retry_at.is_none()
            && !resync_is_due,
    })
}

/// When `entry`, not due now, comes due without any change: its retry, or
/// its next resync slot. `None` while a sync of it runs (its end wakes the
/// scan) or when nothing but a change will make it due.
pub(super) fn next_due(entry: &KeyState, uid: &str, resync: Option<Duration>) -> Option<Instant> {
    if entry.in_flight {
        return None;
    }
    let resync_at = resync
        .zip(entry.last_sync)
        .map(|(every, last)| next_resync_slot_at(uid, every, last));
    entry.retry_at.into_iter().chain(resync_at).min()
}

/// Whether the periodic resync of `svc`, last synced at `last`, is due:
/// its resync slot moved on. Slots are offset per Service (by UID), so
/// Services synced together (a fresh leader's adoption) resync one by one
/// over the period, not in a burst.
pub(super) fn resync_due(svc: &Service, every: Duration, last: Instant, now: Instant) -> bool {
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    resync_slot(uid, every, now) > resync_slot(uid, every, last)
}
