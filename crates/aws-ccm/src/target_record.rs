//! The target record: what this CCM last left registered in each NLB target
//! group, kept in a ConfigMap beside the leader Lease, so that the next
//! leader need not read every group's targets when it adopts the load
//! balancers. Those reads (`DescribeTargetHealth`, one call per group, which
//! AWS cannot batch) were most of a fresh leader's ELB describes.
//!
//! The record can only make a leader skip a read, never make it write, and
//! it is kept so that an entry present is true:
//!
//! * An entry (a group's key, see [`key`], and a digest of its port and
//!   instance IDs, see [`digest`]) is removed from the ConfigMap, and the
//!   removal confirmed by the API server, before this process registers or
//!   deregisters a target of that group ([`TargetRecord::before_change`],
//!   asked only by the memory, [`crate::aws::memory`]).
//!   It is written again only after the change succeeded. A leader killed or
//!   cut off between the two leaves the group without an entry.
//! * A new leader trusts the entries only when the Lease passed straight
//!   from the leader that stamped them: the stamp is the Lease's UID and its
//!   `leaseTransitions` when the stamping leader acquired it, and the new
//!   leader's acquisition must have found both unchanged. A Go CCM, an older
//!   aws-ccm or any other holder in between counts a transition and voids
//!   the record, as does a deleted and recreated Lease (a new UID).
//! * Every write replaces the ConfigMap at the resourceVersion last seen: a
//!   late write by a deposed leader fails with a conflict, and a stamp that
//!   is no longer ours stops this process's target changes.
//! * Without leader election, or when the ConfigMap cannot be read and
//!   written (RBAC from before the record), there is no record: every
//!   adoption reads every group, as before.
//!
//! Someone changing a group's targets outside this CCM makes its entry
//! wrong; the Service's resync slot reads every group in full and repairs
//! it, as it repairs the load balancer's settings.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::{Notify, watch};

use crate::backoff::Backoff;

/// The annotation holding the stamp: `<Lease UID>/<leaseTransitions>`.
const STAMP_ANNOTATION: &str = "aws-ccm.k8s.io/target-record-stamp";

/// At most this many entries (about 70 bytes each, well inside the 1 MiB
/// a ConfigMap may hold); groups past it are simply not recorded.
const MAX_ENTRIES: usize = 10_000;

/// How long a target change waits for its entry's removal to be confirmed.
const CONFIRM_WITHIN: Duration = Duration::from_secs(30);

/// `aws_ccm_target_record_wait_seconds`: how long each NLB target change
/// waited for the record before it could be sent to AWS (0 when the groups
/// had no entry to remove). This is the record's cost on the write path;
/// the scale bench's churn scenario prints it.
static WAIT: LazyLock<Histogram> = LazyLock::new(|| {
    // 1 ms .. 32 s: a confirmed ConfigMap write, up to CONFIRM_WITHIN.
    let h = Histogram::new(exponential_buckets(0.001, 2.0, 16));
    crate::metrics::register(
        "aws_ccm_target_record_wait_seconds",
        "Seconds an NLB target change waited for its groups' entries to leave the target record before it was sent to AWS",
        h.clone(),
    );
    h
});

/// The ConfigMap's name for the Lease `lease_name`.
pub(crate) fn configmap_name(lease_name: &str) -> String {
    format!("{lease_name}-targets")
}

/// A target group's key in the record: its name and ARN suffix
/// (`targetgroup/<name>/<id>`), so a group recreated under the same name
/// has another key. `None` for what is not a target group ARN.
pub(crate) fn key(arn: &str) -> Option<String> {
    let mut parts = arn.rsplit('/');
    let id = parts.next()?;
    let name = parts.next()?;
    let kind = parts.next()?;
    (kind.ends_with("targetgroup") && !id.is_empty() && !name.is_empty())
        .then(|| format!("{name}.{id}"))
}

/// The digest of the instances `instances` registered on `port`.
pub fn digest(port: i32, instances: &BTreeSet<String>) -> String {
    let port = port.to_string();
    crate::aws::applied::digest(
        std::iter::once(port.as_str()).chain(instances.iter().map(String::as_str)),
    )
}

/// What a leader's acquisition found and made of the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquisition {
    pub lease_uid: String,
    /// `leaseTransitions` before this acquisition; `None` when it created
    /// the Lease.
    pub before: Option<i32>,
    /// `leaseTransitions` after it.
    pub now: i32,
}

fn stamp(uid: &str, transitions: i32) -> String {
    format!("{uid}/{transitions}")
}

/// The stamp `cm` carries, if any.
pub fn stamp_on(cm: &ConfigMap) -> Option<String> {
    cm.metadata
        .annotations
        .as_ref()?
        .get(STAMP_ANNOTATION)
        .cloned()
}

/// A shared handle; the default one is off (never trusts, never waits).
#[derive(Clone, Default)]
pub struct TargetRecord {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    /// The last generation written (or failed: with the error); at first
    /// generation 0.
    flushed: watch::Sender<(u64, Option<String>)>,
}

#[derive(Default, PartialEq, Eq, Debug)]
enum Mode {
    #[default]
    Off,
    Active,
    /// Another leader stamped the ConfigMap: no more target changes.
    Lost(String),
}

#[derive(Default)]
struct State {
    mode: Mode,
    /// What the ConfigMap should hold.
    want: BTreeMap<String, String>,
    /// Every key the ConfigMap may hold now (a failed write may or may not
    /// have landed), including a write in flight.
    maybe_stored: BTreeSet<String>,
    generation: u64,
}

/// Why the record could not be started (it stays off).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(String);

impl TargetRecord {
    /// Reads the ConfigMap `namespace/name`, keeps its entries if `acq`
    /// says the Lease came straight from their stamper, stamps it as ours
    /// and starts the writer. Returns how many entries are trusted. On an
    /// error the record stays off.
    pub async fn start(
        &self,
        client: Client,
        namespace: &str,
        name: &str,
        acq: &Acquisition,
    ) -> Result<usize, StartError> {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let fail = |what: &str, e: kube::Error| {
            StartError(format!("{what} ConfigMap {namespace}/{name}: {e}"))
        };
        let existing = api.get_opt(name).await.map_err(|e| fail("reading", e))?;
        let found = existing.as_ref().and_then(stamp_on);
        let trusted = !acq.lease_uid.is_empty()
            && acq
                .before
                .is_some_and(|b| found.as_deref() == Some(stamp(&acq.lease_uid, b).as_str()));
        let kept = existing.as_ref().filter(|_| trusted);
        let entries = kept.and_then(|cm| cm.data.clone()).unwrap_or_default();
        let ours = stamp(&acq.lease_uid, acq.now);
        let cm = build(name, &ours, existing.as_ref(), &entries);
        let written = match &existing {
            Some(_) => api.replace(name, &PostParams::default(), &cm).await,
            None => api.create(&PostParams::default(), &cm).await,
        }
        .map_err(|e| fail("stamping", e))?;
        let n = entries.len();
        {
            let mut st = self.shared.state.lock();
            st.mode = Mode::Active;
            st.maybe_stored = entries.keys().cloned().collect();
            st.want = entries;
        }
        let writer = Writer {
            api,
            name: name.to_string(),
            stamp: ours,
            last: Some(written),
            shared: self.shared.clone(),
        };
        tokio::spawn(writer.run());
        tracing::info!(configmap = %format!("{namespace}/{name}"), trusted = n, voided = !trusted && found.is_some(), "target record ready");
        Ok(n)
    }

    /// Whether the group `key` is recorded with `digest`.
    pub fn trusts(&self, key: &str, digest: &str) -> bool {
        let st = self.shared.state.lock();
        st.mode == Mode::Active && st.want.get(key).map(String::as_str) == Some(digest)
    }

    /// Call before registering or deregistering targets of the groups
    /// `keys`: returns once their entries are gone from the ConfigMap
    /// (at once when none is there). An error means the change must not
    /// be made now. In the product only the memory asks it
    /// ([`crate::aws::memory`]); `pub` for the in-process tests.
    pub async fn before_change(&self, keys: &[String]) -> Result<(), String> {
        let start = tokio::time::Instant::now();
        let waited = self.confirm_removed(keys).await;
        // A sync that moves no target is not a target change.
        if waited.is_some() && !keys.is_empty() {
            WAIT.observe(start.elapsed().as_secs_f64());
        }
        waited.unwrap_or(Ok(()))
    }

    /// [`Self::before_change`]'s work: `None` when the record is off (no
    /// change of this process waits for it).
    async fn confirm_removed(&self, keys: &[String]) -> Option<Result<(), String>> {
        let generation = {
            let mut st = self.shared.state.lock();
            match &st.mode {
                Mode::Off => return None,
                Mode::Lost(why) => return Some(Err(why.clone())),
                Mode::Active => {}
            }
            let mut stored = false;
            for k in keys {
                st.want.remove(k);
                stored |= st.maybe_stored.contains(k);
            }
            if !stored {
                return Some(Ok(()));
            }
            st.generation += 1;
            st.generation
        };
        self.shared.wake.notify_one();
        let mut rx = self.shared.flushed.subscribe();
        let seen =
            tokio::time::timeout(CONFIRM_WITHIN, rx.wait_for(|(g, _)| *g >= generation)).await;
        Some(match seen {
            Ok(Ok(done)) => done.1.clone().map_or(Ok(()), Err),
            Ok(Err(_)) => Err("the target record's writer stopped".into()),
            Err(_) => Err(format!(
                "the target record was not written within {CONFIRM_WITHIN:?}"
            )),
        })
    }

    /// Records that the groups `entries` (key, digest) now hold what their
    /// digests say. Written in the background; nothing waits for it. In the
    /// product only the memory calls it; `pub` for the in-process tests.
    pub fn record(&self, entries: impl IntoIterator<Item = (String, String)>) {
        self.update(|want| {
            let mut changed = false;
            for (k, d) in entries {
                if want.len() >= MAX_ENTRIES && !want.contains_key(&k) {
                    continue;
                }
                changed |= want.insert(k, d.clone()).as_ref() != Some(&d);
            }
            changed
        });
    }

    /// Waits, at most `within`, until everything recorded so far is written
    /// (at shutdown: the successor then trusts every group).
    pub async fn flush(&self, within: Duration) {
        let generation = {
            let st = self.shared.state.lock();
            if st.mode != Mode::Active {
                return;
            }
            st.generation
        };
        let mut rx = self.shared.flushed.subscribe();
        let written = rx.wait_for(|(g, e)| *g >= generation && e.is_none());
        if tokio::time::timeout(within, written).await.is_err() {
            tracing::warn!(
                "the target record was not all written before shutdown; the successor reads the groups it lacks"
            );
        }
    }

    /// Drops the entries of groups `keys` (deleted), in the background.
    pub(crate) fn forget(&self, keys: &[String]) {
        self.update(|want| {
            keys.iter()
                .fold(false, |changed, k| want.remove(k).is_some() | changed)
        });
    }

    fn update(&self, change: impl FnOnce(&mut BTreeMap<String, String>) -> bool) {
        let mut st = self.shared.state.lock();
        if st.mode != Mode::Active || !change(&mut st.want) {
            return;
        }
        st.generation += 1;
        drop(st);
        self.shared.wake.notify_one();
    }
}

/// The ConfigMap `name` with stamp `stamp` and `entries`, keeping the
/// rest of `existing`'s metadata (its resourceVersion: a replace must be
/// based on what was read).
fn build(
    name: &str,
    stamp: &str,
    existing: Option<&ConfigMap>,
    entries: &BTreeMap<String, String>,
) -> ConfigMap {
    let mut meta = existing
        .map(|cm| cm.metadata.clone())
        .unwrap_or_else(|| ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        });
    meta.annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(STAMP_ANNOTATION.to_string(), stamp.to_string());
    ConfigMap {
        metadata: meta,
        data: Some(entries.clone()),
        ..ConfigMap::default()
    }
}

/// The one task writing the ConfigMap: each write carries everything
/// wanted so far, so many changes share one request.
struct Writer {
    api: Api<ConfigMap>,
    name: String,
    stamp: String,
    /// The ConfigMap as last written or read; `None` when it was deleted.
    last: Option<ConfigMap>,
    shared: Arc<Shared>,
}

impl Writer {
    async fn run(mut self) {
        let backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        let mut failures = 0;
        loop {
            let (want, generation, clean) = self.next_write();
            if clean {
                self.shared.flushed.send_replace((generation, None));
                self.shared.wake.notified().await;
                continue;
            }
            match self.write(&want).await {
                Ok(()) => {
                    failures = 0;
                    self.shared.state.lock().maybe_stored = want.keys().cloned().collect();
                    self.shared.flushed.send_replace((generation, None));
                }
                Err(e) => {
                    if matches!(self.shared.state.lock().mode, Mode::Lost(_)) {
                        return; // every waiter has been told
                    }
                    tracing::warn!(configmap = %self.name, error = %e, "writing the target record failed; will retry");
                    self.shared.flushed.send_replace((generation, Some(e)));
                    failures += 1;
                    tokio::time::sleep(backoff.after(failures)).await;
                }
            }
        }
    }

    /// What the ConfigMap should hold, its generation, and whether it holds
    /// it already (else its keys count as maybe stored from now on).
    fn next_write(&self) -> (BTreeMap<String, String>, u64, bool) {
        let mut st = self.shared.state.lock();
        let want = st.want.clone();
        let keys: BTreeSet<String> = want.keys().cloned().collect();
        // An empty map may come back as no `data` at all.
        let data = self.last.as_ref().and_then(|cm| cm.data.as_ref());
        let stored = data.map_or(want.is_empty(), |d| *d == want);
        let clean = stored && st.maybe_stored == keys;
        st.maybe_stored.extend(keys);
        (want, st.generation, clean)
    }

    /// One write of `want`; on a conflict the ConfigMap is read again and,
    /// if still ours, written once more.
    async fn write(&mut self, want: &BTreeMap<String, String>) -> Result<(), String> {
        for _ in 0..2 {
            let cm = build(&self.name, &self.stamp, self.last.as_ref(), want);
            let pp = PostParams::default();
            let written = match cm.metadata.resource_version {
                Some(_) => self.api.replace(&self.name, &pp, &cm).await,
                None => self.api.create(&pp, &cm).await,
            };
            match written {
                Ok(written) => {
                    self.last = Some(written);
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if [404, 409].contains(&s.code) => {
                    self.reread().await?;
                }
                Err(e) => return Err(format!("writing ConfigMap {}: {e}", self.name)),
            }
        }
        Err(format!(
            "ConfigMap {} keeps changing under this leader",
            self.name
        ))
    }

    /// After a conflict: the ConfigMap as it is, if still stamped by us.
    async fn reread(&mut self) -> Result<(), String> {
        let now = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| format!("reading ConfigMap {}: {e}", self.name))?;
        let theirs = now.as_ref().and_then(stamp_on);
        if let Some(theirs) = theirs.filter(|t| newer(t, &self.stamp)) {
            let why = format!(
                "ConfigMap {} was stamped by another leader ({theirs}); this process no longer changes targets",
                self.name,
            );
            tracing::error!(configmap = %self.name, "{why}");
            self.shared.state.lock().mode = Mode::Lost(why.clone());
            // Every waiter learns it now.
            self.shared
                .flushed
                .send_replace((u64::MAX, Some(why.clone())));
            return Err(why);
        }
        // Ours, an earlier leader's late write (written over: every write
        // carries everything this leader wants), or deleted (created again).
        self.last = now;
        Ok(())
    }
}

/// Whether stamp `theirs` is a later leader's than `ours`: another Lease
/// (a new UID), more transitions, or not a stamp at all.
fn newer(theirs: &str, ours: &str) -> bool {
    fn parse(stamp: &str) -> Option<(&str, i64)> {
        let (uid, n) = stamp.rsplit_once('/')?;
        Some((uid, n.parse().ok()?))
    }
    match (parse(theirs), parse(ours)) {
        (Some((u1, n1)), Some((u2, n2))) => u1 != u2 || n1 > n2,
        _ => true,
    }
}

#[cfg(test)]
#[path = "target_record_tests.rs"]
mod tests;
