//! Kubernetes Events for controllers, through the core/v1 Event API as the
//! Go CCM's recorder (client-go `record`) writes them, with repeats folded
//! into one event whose `count` and `lastTimestamp` go up, as client-go's
//! correlator does. core/v1, not events.k8s.io/v1: kOps' (and upstream's)
//! RBAC for the CCM grants only core `events`.
//!
//! kube's `Recorder` keeps every event it published for six minutes, whole,
//! and scans all of them on each publish: a 5,000-node join kept 5,000
//! `Synced` events, 18 MB, a third of the CCM's heap. This recorder keeps a
//! bounded table of fingerprints instead: [`MAX_SEEN`] entries (client-go's
//! correlator LRU size) of a few dozen bytes, each remembered for
//! [`SERIES_WINDOW`].
//!
//! Publishing is best effort and does not hold the caller up: an event is
//! queued (at most [`MAX_QUEUED`], client-go's broadcaster queue; past that
//! it is dropped with a log line, as client-go drops it) and one writer task
//! per recorder writes the queue in order through the same client and
//! limiter. A failed event is logged, never an error of the reconcile that
//! emitted it, as with client-go's recorder. Before, every reconcile waited
//! for its events: a fresh leader adopting 1,000 Services wrote 2,000
//! `EnsuringLoadBalancer`/`EnsuredLoadBalancer` events at the client's 20
//! QPS, and that (100 s), not AWS, was how long the adoption took.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::mpsc;

/// Most distinct events remembered for folding (client-go: 4,096).
const MAX_SEEN: usize = 4096;
/// A repeat within this long of the last one joins its series (kube: 6 min).
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
/// Most events waiting to be written (client-go's `maxQueuedEvents`).
pub const MAX_QUEUED: usize = 1000;

/// Publishes events as one controller (`reportingController`). Clones share
/// the queue and its writer.
#[derive(Clone)]
pub struct Events {
    queue: mpsc::Sender<Queued>,
}

enum Queued {
    Event {
        object: Box<ObjectReference>,
        type_: &'static str,
        reason: String,
        note: String,
    },
    /// Answered once everything queued before it is written (tests wait
    /// on it).
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The writer task's half: the client and the series table.
struct Writer {
    client: Client,
    controller: String,
    instance: String,
    seen: Seen,
}

impl Events {
    /// `controller` is the upstream component name, e.g.
    /// `cloud-node-controller`. Starts the writer task (on the current
    /// runtime); it ends when the last clone is dropped and the queue is
    /// written.
    pub fn new(client: Client, controller: &str) -> Events {
        let instance = std::env::var("POD_NAME")
            .ok()
            .unwrap_or_else(|| gethostname::gethostname().to_string_lossy().into_owned());
        let writer = Writer {
            client,
            controller: controller.to_string(),
            instance,
            seen: Seen::new(MAX_SEEN, SERIES_WINDOW),
        };
        let (queue, rx) = mpsc::channel(MAX_QUEUED);
        tokio::spawn(writer.run(rx));
        Events { queue }
    }

    /// Queues a Normal event; returns at once.
    pub async fn normal(&self, object: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.enqueue(object, "Normal", reason, note.into());
    }

    /// Queues a Warning event; returns at once.
    pub async fn warning(&self, object: &ObjectReference, reason: &str, note: impl Into<String>) {
        self.enqueue(object, "Warning", reason, note.into());
    }

    fn enqueue(&self, object: &ObjectReference, type_: &'static str, reason: &str, note: String) {
        let event = Queued::Event {
            object: Box::new(object.clone()),
            type_,
            reason: reason.to_string(),
            note,
        };
        match self.queue.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => tracing::warn!(
                reason,
                object = ?object.name,
                queued = MAX_QUEUED,
                "event queue full; event dropped"
            ),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::debug!(reason, object = ?object.name, "event writer stopped; event dropped");
            }
        }
    }

    /// Waits until every event queued before this call is written (or its
    /// write failed). The in-process tests (`tests/in_process/events.rs`)
    /// wait on it.
    pub async fn flushed(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.queue.send(Queued::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

impl Writer {
    async fn run(mut self, mut rx: mpsc::Receiver<Queued>) {
        while let Some(queued) = rx.recv().await {
            match queued {
                Queued::Event {
                    object,
                    type_,
                    reason,
                    note,
                } => {
                    if let Err(e) = self.write(&object, type_, &reason, note).await {
                        tracing::warn!(error = %e, reason, object = ?object.name, "failed to publish event");
                    }
                }
                Queued::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
    }

    async fn write(
        &mut self,
        object: &ObjectReference,
        type_: &str,
        reason: &str,
        note: String,
    ) -> Result<(), kube::Error> {
        // Cluster-scoped objects (Nodes) get their events in `default`.
        let namespace = object.namespace.as_deref().unwrap_or("default");
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let key = fingerprint(object, type_, reason);
        let now = k8s_openapi::jiff::Timestamp::now();
        if let Some((name, count)) = self.seen.repeat(key, Instant::now()) {
            // client-go's correlator: the repeat bumps count and
            // lastTimestamp of the first event (its message stays).
            let patch = serde_json::json!({
                "count": count,
                "lastTimestamp": Time(now),
            });
            match super::merge_patch(&api, &name, patch).await {
                Ok(_) => return Ok(()),
                // The apiserver dropped it (event TTL): start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let base = object.name.as_deref().unwrap_or(&self.controller);
        let name = format!("{base}.{:x}", now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            involved_object: object.clone(),
            reason: Some(reason.to_string()),
            // The API server rejects messages over 1 kB from new clients.
            message: Some(truncate(&note, 1024)),
            type_: Some(type_.to_string()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(self.controller.clone()),
                host: None,
            }),
            reporting_component: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        api.create(&PostParams::default(), &event).await?;
        self.seen.record(key, name, Instant::now());
        Ok(())
    }
}

/// What makes two events "the same" for a series: the object, the type and
/// the reason (the note may differ, as in client-go's aggregation).
fn fingerprint(object: &ObjectReference, type_: &str, reason: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        &object.kind,
        &object.namespace,
        &object.name,
        &object.uid,
        type_,
        reason,
    )
        .hash(&mut h);
    h.finish()
}

/// Recently published events: fingerprint → (event name, count, last seen).
struct Seen {
    entries: HashMap<u64, (String, i32, Instant)>,
    cap: usize,
    window: Duration,
}

impl Seen {
    fn new(cap: usize, window: Duration) -> Seen {
        Seen {
            entries: HashMap::new(),
            cap,
            window,
        }
    }

    /// A repeat of a live series: its event name and new count, counted.
    fn repeat(&mut self, key: u64, now: Instant) -> Option<(String, i32)> {
        let window = self.window;
        let entry = self.entries.get_mut(&key)?;
        if now.duration_since(entry.2) >= window {
            self.entries.remove(&key);
            return None;
        }
        entry.1 += 1;
        entry.2 = now;
        Some((entry.0.clone(), entry.1))
    }

    /// A new event: the start of a series. When full, expired entries go
    /// first, then the least recently seen.
    fn record(&mut self, key: u64, name: String, now: Instant) {
        if self.entries.len() >= self.cap && !self.entries.contains_key(&key) {
            let window = self.window;
            self.entries
                .retain(|_, (_, _, last)| now.duration_since(*last) < window);
            if self.entries.len() >= self.cap
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, _, last))| *last)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (name, 1, now));
    }
}

fn truncate(s: &str, max: usize) -> String {
    s[..s.floor_char_boundary(max)].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_on_a_char_boundary() {
        let note = "é".repeat(600);
        let cut = super::truncate(&note, 1024);
        assert!(cut.len() <= 1024 && note.starts_with(&cut));
        assert_eq!(super::truncate("short", 1024), "short");
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_oldest_and_the_expired() {
        let t0 = Instant::now();
        let mut seen = Seen::new(3, Duration::from_secs(60));
        for k in 0..3u64 {
            seen.record(k, format!("e{k}"), t0 + Duration::from_secs(k));
        }
        assert_eq!(
            seen.repeat(1, t0 + Duration::from_secs(10)),
            Some(("e1".into(), 2))
        );
        // Full: the least recently seen (0) makes room for 3.
        seen.record(3, "e3".into(), t0 + Duration::from_secs(11));
        assert_eq!(seen.entries.len(), 3);
        assert_eq!(seen.repeat(0, t0 + Duration::from_secs(12)), None);
        assert_eq!(
            seen.repeat(1, t0 + Duration::from_secs(12)),
            Some(("e1".into(), 3))
        );
        // Past the window a repeat starts a new series.
        assert_eq!(seen.repeat(2, t0 + Duration::from_secs(62)), None);
        assert!(!seen.entries.contains_key(&2));
        // Full again with expired entries: they all go, nothing live does.
        let late = t0 + Duration::from_secs(71);
        seen.record(4, "e4".into(), t0 + Duration::from_secs(13));
        seen.record(5, "e5".into(), late);
        assert!(seen.entries.contains_key(&5) && seen.entries.contains_key(&4));
        assert!(!seen.entries.contains_key(&3), "expired at 71 s");
    }
}
