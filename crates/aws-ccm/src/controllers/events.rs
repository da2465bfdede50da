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
pub const MAX_SEEN: usize = 4096;
/// A repeat within this long of the last one joins its series (kube: 6 min).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);
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
    use ccm_testkit::apiserver::TestApiServer;

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

    /// An API test server whose first event create is held `hold`, its
    /// client, and a service-controller recorder on it.
    async fn held_server(hold: Duration) -> anyhow::Result<(TestApiServer, Client, Events)> {
        let server = TestApiServer::start().await?;
        server.inject_failure(
            ccm_testkit::apiserver::FailureRule::slow("create", "events", hold).times(1),
        );
        let client = server.client().await?;
        let events = Events::new(client.clone(), "service-controller");
        Ok((server, client, events))
    }

    /// A reference to Service `default/name`.
    fn service_ref(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }
    }

    /// Publishing does not wait for the apiserver: with the event's create
    /// held 10 s by the server, the call has returned and nothing is stored
    /// yet (had it waited, the event would be); `flushed` then waits for it.
    #[tokio::test]
    async fn publishing_does_not_wait_for_the_write() -> anyhow::Result<()> {
        let (server, client, events) = held_server(Duration::from_secs(10)).await?;
        let svc = service_ref("web");
        let api: Api<Event> = Api::namespaced(client, "default");
        events
            .normal(&svc, "EnsuringLoadBalancer", "Ensuring load balancer")
            .await;
        events
            .normal(&svc, "EnsuredLoadBalancer", "Ensured load balancer")
            .await;
        assert!(api.list(&Default::default()).await?.items.is_empty());
        events.flushed().await;
        let reasons: Vec<_> = api
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        assert_eq!(reasons, ["EnsuringLoadBalancer", "EnsuredLoadBalancer"]);
        server.shutdown().await;
        Ok(())
    }

    /// While the writer is held by a slow write, the queue takes
    /// [`MAX_QUEUED`] events and drops the rest: the series written after
    /// the flush counts only the events that fit.
    #[tokio::test]
    async fn a_full_queue_drops_what_does_not_fit() -> anyhow::Result<()> {
        let (server, client, events) = held_server(Duration::from_secs(5)).await?;
        let svc = service_ref;
        let api: Api<Event> = Api::namespaced(client, "default");
        events
            .normal(&svc("held"), "EnsuringLoadBalancer", "held")
            .await;
        // The writer takes the held event once it runs; wait until the
        // server has its create, so the queue is empty again.
        let seen = || server.stats().count("create", "events");
        for _ in 0..500 {
            if seen() > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(seen(), 1, "the held create reached the server");
        for i in 0..MAX_QUEUED + 5 {
            events
                .warning(&svc("busy"), "Busy", format!("try {i}"))
                .await;
        }
        events.flushed().await;
        let busy = api
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Busy"))
            .expect("the Busy series");
        assert_eq!(busy.count, Some(MAX_QUEUED as i32), "5 dropped");
        server.shutdown().await;
        Ok(())
    }

    /// Against the API test server: the first event is created (core/v1), a
    /// repeat patches its count, another reason or object is its own event, and
    /// a series whose event the apiserver dropped starts a new one.
    #[tokio::test]
    async fn repeats_fold_into_a_series_on_the_apiserver() -> anyhow::Result<()> {
        let server = TestApiServer::start().await?;
        let client = server.client().await?;
        let events = Events::new(client.clone(), "cloud-node-controller");
        let node = |name: &str| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        };
        let api: Api<Event> = Api::namespaced(client.clone(), "default");
        let list = || async { anyhow::Ok(api.list(&Default::default()).await?.items) };

        events.warning(&node("n1"), "Failed", "first try").await;
        events.warning(&node("n1"), "Failed", "second try").await;
        events.warning(&node("n1"), "Failed", "third try").await;
        events.normal(&node("n1"), "Synced", "ok").await;
        events.warning(&node("n2"), "Failed", "first try").await;
        events.flushed().await;
        let all = list().await?;
        assert_eq!(all.len(), 3, "{all:?}");
        let n1_failed = all
            .iter()
            .find(|e| {
                e.reason.as_deref() == Some("Failed")
                    && e.involved_object.name.as_deref() == Some("n1")
            })
            .expect("n1's Failed event");
        assert_eq!(n1_failed.count, Some(3));
        assert_eq!(n1_failed.message.as_deref(), Some("first try"));
        assert_eq!(n1_failed.type_.as_deref(), Some("Warning"));
        assert_eq!(
            n1_failed.reporting_component.as_deref(),
            Some("cloud-node-controller")
        );
        assert_eq!(
            n1_failed
                .source
                .as_ref()
                .and_then(|s| s.component.as_deref()),
            Some("cloud-node-controller")
        );
        assert!(
            all.iter()
                .filter(|e| e.reason.as_deref() != Some("Failed")
                    || e.involved_object.name.as_deref() != Some("n1"))
                .all(|e| e.count == Some(1))
        );
        // The same events through events.k8s.io/v1 (one storage).
        let v1: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
        let seen = v1.list(&Default::default()).await?.items;
        assert!(
            seen.iter()
                .any(|e| e.note.as_deref() == Some("first try") && e.deprecated_count == Some(3)),
            "{seen:?}"
        );

        // The apiserver drops the event (its TTL): the next repeat creates.
        let name = n1_failed.metadata.name.clone().expect("name");
        api.delete(&name, &Default::default()).await?;
        events.warning(&node("n1"), "Failed", "after the TTL").await;
        events.flushed().await;
        let all = list().await?;
        assert_eq!(all.len(), 3, "{all:?}");
        assert!(
            all.iter()
                .any(|e| e.message.as_deref() == Some("after the TTL"))
        );
        server.shutdown().await;
        Ok(())
    }
}
