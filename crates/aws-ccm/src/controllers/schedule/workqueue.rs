//! client-go's workqueue metrics, with component-base's names, labels and
//! buckets (`metrics/prometheus/workqueue`), for this CCM's schedulers:
//! `workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_retries_total`,
//! `workqueue_unfinished_work_seconds` and
//! `workqueue_longest_running_processor_seconds`, each labelled `name` with
//! the Go controller's queue name (`service`, `Nodes`), so dashboards built
//! for the Go CCM read this one.
//!
//! A scheduler tells its [`Queue`] what it holds: a key becomes due
//! ([`Queue::due`]: an add, once until it is taken), is taken to work on
//! ([`Queue::take`]: its wait observed; the returned [`Work`] observes the
//! work when dropped) or is retried ([`Queue::retry`]). Keys a scheduler no
//! longer holds leave the depth ([`Queue::forget`]).
//! Work that follows a controller's own (the network-node questions after
//! the cloud-node controller's initializations) waits for [`Queue::idle`]:
//! nothing due and nothing worked on.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::sync::watch;

type Labels = Vec<(&'static str, &'static str)>;

struct Families {
    depth: Family<Labels, Gauge>,
    adds: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    queue_duration: Family<Labels, Histogram>,
    work_duration: Family<Labels, Histogram>,
}

/// component-base's buckets: 10 ns to 10 s, ten of them.
fn seconds() -> Histogram {
    Histogram::new(exponential_buckets(10e-9, 10.0, 10))
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| {
    let f = Families {
        depth: Family::default(),
        adds: Family::default(),
        retries: Family::default(),
        queue_duration: Family::new_with_constructor(seconds),
        work_duration: Family::new_with_constructor(seconds),
    };
    use crate::metrics::register;
    register(
        "workqueue_depth",
        "Current depth of workqueue",
        f.depth.clone(),
    );
    register(
        "workqueue_adds",
        "Total number of adds handled by workqueue",
        f.adds.clone(),
    );
    register(
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        f.retries.clone(),
    );
    register(
        "workqueue_queue_duration_seconds",
        "How long in seconds an item stays in workqueue before being requested",
        f.queue_duration.clone(),
    );
    register(
        "workqueue_work_duration_seconds",
        "How long in seconds processing an item from workqueue takes",
        f.work_duration.clone(),
    );
    crate::metrics::register_collector(Box::new(InFlight));
    f
});

/// Every live queue's state, for the in-flight gauges computed at scrape.
static QUEUES: LazyLock<Mutex<Vec<Weak<Mutex<State>>>>> = LazyLock::new(Default::default);

#[derive(Default)]
struct State {
    name: &'static str,
    /// Due keys and when each became due.
    waiting: HashMap<String, Instant>,
    /// Work in progress: its token and start.
    running: HashMap<u64, Instant>,
    next_token: u64,
}

/// One scheduler's queue metrics.
#[derive(Clone)]
pub(crate) struct Queue {
    labels: Labels,
    state: Arc<Mutex<State>>,
    /// Whether any key is due or being worked on, for [`Queue::idle`].
    busy: Arc<watch::Sender<bool>>,
}

/// Work on one key; observed when dropped.
pub(crate) struct Work {
    queue: Queue,
    token: u64,
    started: Instant,
}

impl Queue {
    pub(crate) fn new(name: &'static str) -> Queue {
        let q = Queue {
            labels: vec![("name", name)],
            state: Arc::new(Mutex::new(State {
                name,
                ..State::default()
            })),
            busy: Arc::new(watch::channel(false).0),
        };
        // Every family of the queue is served from its start, as client-go's.
        let f = &*FAMILIES;
        f.depth.get_or_create(&q.labels).set(0);
        let _ = f.adds.get_or_create(&q.labels);
        let _ = f.retries.get_or_create(&q.labels);
        let _ = f.queue_duration.get_or_create(&q.labels);
        let _ = f.work_duration.get_or_create(&q.labels);
        let mut all = QUEUES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&q.state));
        q
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After every change of `state`: the depth gauge and the busy flag.
    fn changed(&self, state: &State) {
        FAMILIES
            .depth
            .get_or_create(&self.labels)
            .set(state.waiting.len() as i64);
        let busy = !state.waiting.is_empty() || !state.running.is_empty();
        self.busy
            .send_if_modified(|was| std::mem::replace(was, busy) != busy);
    }

    /// Completes once no key is due and none is being worked on (at once
    /// when that is so already).
    pub(crate) async fn idle(&self) {
        let mut busy = self.busy.subscribe();
        // The sender lives as long as `self`: the wait cannot fail.
        let _ = busy.wait_for(|busy| !busy).await;
    }

    /// `key` needs work: an add, unless it is already waiting.
    pub(crate) fn due(&self, key: &str) {
        let mut state = self.state();
        if state.waiting.contains_key(key) {
            return;
        }
        state.waiting.insert(key.to_string(), Instant::now());
        FAMILIES.adds.get_or_create(&self.labels).inc();
        self.changed(&state);
    }

    /// Forgets `key` if it is waiting (its object was deleted before the
    /// scheduler took it).
    pub(crate) fn forget(&self, key: &str) {
        let mut state = self.state();
        if state.waiting.remove(key).is_some() {
            self.changed(&state);
        }
    }

    /// `key` is taken to work on: its wait is observed (an add first, when
    /// the scheduler took it without saying it was due).
    pub(crate) fn take(&self, key: &str) -> Work {
        let now = Instant::now();
        let mut state = self.state();
        let since = state.waiting.remove(key).unwrap_or_else(|| {
            FAMILIES.adds.get_or_create(&self.labels).inc();
            now
        });
        FAMILIES
            .queue_duration
            .get_or_create(&self.labels)
            .observe(now.duration_since(since).as_secs_f64());
        let token = state.next_token;
        state.next_token += 1;
        state.running.insert(token, now);
        self.changed(&state);
        Work {
            queue: self.clone(),
            token,
            started: now,
        }
    }

    /// The work failed and is tried again later.
    pub(crate) fn retry(&self) {
        FAMILIES.retries.get_or_create(&self.labels).inc();
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        FAMILIES
            .work_duration
            .get_or_create(&self.queue.labels)
            .observe(self.started.elapsed().as_secs_f64());
        let mut state = self.queue.state();
        state.running.remove(&self.token);
        self.queue.changed(&state);
    }
}

/// `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds`, from the work in progress
/// at scrape time, as client-go's `updateUnfinishedWork` reports them.
#[derive(Debug)]
struct InFlight;

impl Collector for InFlight {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = Instant::now();
        let queues: Vec<Arc<Mutex<State>>> = QUEUES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        let mut rows = Vec::new();
        for state in &queues {
            let state = state.lock().unwrap_or_else(|p| p.into_inner());
            let ages = state
                .running
                .values()
                .map(|s| now.duration_since(*s).as_secs_f64());
            let total = ages.clone().fold(0.0, |a, b| a + b);
            let longest = ages.fold(0.0, f64::max);
            rows.push((state.name, total, longest));
        }
        for (metric, help, pick) in [
            (
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases",
                0,
            ),
            (
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running",
                1,
            ),
        ] {
            let probe = ConstGauge::new(0.0);
            let mut m = e.encode_descriptor(metric, help, None, probe.metric_type())?;
            for (name, total, longest) in &rows {
                let v = if pick == 0 { *total } else { *longest };
                ConstGauge::new(v).encode(m.encode_family(&vec![("name", *name)])?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
