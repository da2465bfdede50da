//! What a Service's state makes of it: which change a scan adds to the
//! queue ([`trigger`]), what its sync must do when the queue hands it out
//! ([`plan`]), and what the sync's outcome leaves ([`record`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use tokio::time::Instant;

use super::{
    Backends, DEPENDENCY_PATIENCE, Derived, Job, KeyState, Outcome, WAITING, fingerprint, key,
    target_labels, tier, wants_load_balancer,
};
use crate::controllers::schedule::keyed::{self, Class};
use crate::provider::load_balancers::resync_slot;

/// How a scan adds a Service to the queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// The Service itself changed (or is seen for the first time): now.
    Now(Class),
    /// Only its backend set moved: once the node set settles.
    Settled(Class),
}

/// The version of `svc` `entry` knows, derived again only when its
/// resourceVersion changed; returns the fingerprint it had before.
fn derive(entry: &mut KeyState, svc: &Service) -> Option<u64> {
    let seen = entry.derived.as_ref().map(|d| d.fingerprint);
    let rv = svc.resource_version().unwrap_or_default();
    if entry
        .derived
        .as_ref()
        .is_none_or(|d| d.resource_version != rv || rv.is_empty())
    {
        entry.derived = Some(Derived {
            fingerprint: fingerprint(svc),
            targets: target_labels(svc),
            resource_version: rv,
        });
    }
    seen
}

/// As upstream's node sync: a changed backend set is acted on only when the
/// node set moved (`node_set`), then compared with the last synced one
/// (`nodesSufficientlyEqual`); a set equal to it is taken as synced.
fn backends_moved(entry: &mut KeyState, want: &Backends) -> bool {
    let node_set_moved = entry.synced_node_set != Some(want.node_set);
    let moved = node_set_moved && entry.synced_backends != Some(want.hash);
    if node_set_moved && !moved {
        entry.synced_node_set = Some(want.node_set);
    }
    moved
}

/// What a change makes due for `svc` (with state `entry`): its fingerprint
/// changed since the last scan saw it, or its backend set moved. A change
/// that touches neither (its status, its finalizers, another Node's label)
/// adds nothing, so a failed Service waits out its backoff unless it
/// changed. A Service `retrying` a failure is not hastened by its backends.
pub(super) fn trigger(
    entry: &mut KeyState,
    svc: &Service,
    mut backends: impl FnMut(&BTreeMap<String, String>) -> Backends,
    retrying: impl FnOnce(&KeyState) -> bool,
) -> Option<Due> {
    let seen = derive(entry, svc);
    let derived = entry.derived.as_ref()?;
    let fp = derived.fingerprint;
    if seen != Some(fp) {
        let service_changed = entry.synced_fingerprint != Some(fp);
        return Some(Due::Now(tier(entry, svc, service_changed)));
    }
    if !wants_load_balancer(svc) || entry.last_sync.is_none() {
        return None;
    }
    let want = backends(&derived.targets);
    if entry.asked_node_set == Some(want.node_set)
        || !backends_moved(entry, &want)
        || retrying(entry)
    {
        return None;
    }
    entry.asked_node_set = Some(want.node_set);
    Some(Due::Settled(tier(entry, svc, false)))
}

/// What the sync of `svc` (with state `entry`), taken from the queue after
/// `failures` failures in a row, must do; `None` when nothing moved since
/// its last sync (a change undone, a backend set back where it was) and no
/// retry or resync is due.
pub(super) fn plan(
    entry: &mut KeyState,
    svc: Arc<Service>,
    mut backends: impl FnMut(&BTreeMap<String, String>) -> Backends,
    failures: u32,
    resync: Option<Duration>,
    now: Instant,
) -> Option<Job> {
    derive(entry, &svc);
    let derived = entry.derived.as_ref()?;
    let fp = derived.fingerprint;
    let want_backends = wants_load_balancer(&svc).then(|| backends(&derived.targets));
    let service_changed = entry.synced_fingerprint != Some(fp);
    let backends_changed = want_backends
        .as_ref()
        .is_some_and(|want| backends_moved(entry, want));
    let resync_is_due = resync
        .zip(entry.last_sync)
        .is_some_and(|(every, t)| resync_due(&svc, every, t, now));
    let retry = failures > 0 || entry.waiting_since.is_some();
    let due =
        service_changed || backends_changed || retry || entry.last_sync.is_none() || resync_is_due;
    if !due {
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
            && !retry
            && !resync_is_due,
    })
}

/// What a sync's outcome leaves in `entry`, and what the queue does next.
pub(super) fn record(
    entry: &mut KeyState,
    job: &Job,
    outcome: Outcome,
    now: Instant,
) -> keyed::Outcome {
    entry.last_sync = Some(now);
    match outcome {
        Outcome::Done | Outcome::Invalid => {
            entry.synced_fingerprint = Some(job.fingerprint);
            entry.synced_backends = job.backends.as_ref().map(|b| b.hash);
            entry.synced_node_set = job.backends.as_ref().map(|b| b.node_set);
            entry.waiting_since = None;
            // Bad input waits for the Service to change: done for the queue.
            keyed::Outcome::Done
        }
        Outcome::Waiting => {
            let waited = now - *entry.waiting_since.get_or_insert(now);
            let delay = WAITING.after(1 + (waited.as_secs() / 10).min(8) as u32);
            keyed::Outcome::RetryAfter(delay)
        }
        Outcome::Failed => {
            entry.waiting_since = None;
            keyed::Outcome::Retry
        }
    }
}

/// Whether the periodic resync of `svc`, last synced at `last`, is due:
/// its resync slot moved on. Slots are offset per Service (by UID), so
/// Services synced together (a fresh leader's adoption) resync one by one
/// over the period, not in a burst.
pub(super) fn resync_due(svc: &Service, every: Duration, last: Instant, now: Instant) -> bool {
    let uid = svc.metadata.uid.as_deref().unwrap_or_default();
    resync_slot(uid, every, now) > resync_slot(uid, every, last)
}
