//! Coalescing: many concurrent lookups become one AWS call.
//!
//! [`Batcher`] gathers single-key lookups for a short window (or until the
//! batch is full) and serves them with one batch call; each caller gets its
//! own answer, and a key the batch did not return is "not found" for that
//! caller alone. [`SingleFlight`] shares one in-flight computation, and its
//! result for a TTL, among all concurrent callers (the cluster sweep and the
//! zone map).
//!
//! Batch calls run on spawned tasks: a caller that gives up (its deadline
//! passed, its reconcile was cancelled) must not cancel the work the other
//! callers of the same batch wait for.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::api_metrics;
use super::errors::{AwsError, ErrorClass};
use super::operations::Operation;

/// Fetches a batch of keys; the map holds the keys that were found.
pub(crate) type BatchFetch<K, V> =
    Arc<dyn Fn(Vec<K>) -> BoxFuture<'static, Result<HashMap<K, V>, AwsError>> + Send + Sync>;

type Reply<V> = oneshot::Sender<Result<Option<V>, AwsError>>;

struct Pending<K, V> {
    waiters: HashMap<K, Vec<Reply<V>>>,
    /// Bumped each time a batch is taken, so a window timer that fires after
    /// its batch was already flushed (because it filled up) does nothing.
    generation: u64,
}

/// Gathers single-key lookups into batch calls. Cheap to clone.
pub(crate) struct Batcher<K, V> {
    inner: Arc<BatcherInner<K, V>>,
}

impl<K, V> Clone for Batcher<K, V> {
    fn clone(&self) -> Self {
        Batcher {
            inner: self.inner.clone(),
        }
    }
}

struct BatcherInner<K, V> {
    kind: &'static str,
    operation: Operation,
    window: Duration,
    max_keys: usize,
    fetch: BatchFetch<K, V>,
    pending: Mutex<Pending<K, V>>,
}

impl<K, V> Batcher<K, V>
where
    K: Eq + Hash + Clone + Send + Sync + 'static,
    V: Clone + Send + 'static,
{
    /// `kind` labels the batch-size metric; `operation` names the AWS call in
    /// errors; a batch is sent `window` after its first key arrives, or as
    /// soon as it holds `max_keys` distinct keys.
    pub(crate) fn new(
        kind: &'static str,
        operation: Operation,
        window: Duration,
        max_keys: usize,
        fetch: BatchFetch<K, V>,
    ) -> Batcher<K, V> {
        Batcher {
            inner: Arc::new(BatcherInner {
                kind,
                operation,
                window,
                max_keys: max_keys.max(1),
                fetch,
                pending: Mutex::new(Pending {
                    waiters: HashMap::new(),
                    generation: 0,
                }),
            }),
        }
    }

    /// Looks one key up. `Ok(None)` when the batch call succeeded but did not
    /// return this key.
    pub(crate) async fn get(&self, key: K) -> Result<Option<V>, AwsError> {
        let (reply, answer) = oneshot::channel();
        let full_batch = {
            let mut pending = self.inner.pending.lock();
            let first = pending.waiters.is_empty();
            pending.waiters.entry(key).or_default().push(reply);
            if pending.waiters.len() >= self.inner.max_keys {
                Some(take(&mut pending))
            } else {
                if first {
                    self.start_window(pending.generation);
                }
                None
            }
        };
        if let Some(batch) = full_batch {
            self.flush(batch);
        }
        answer.await.unwrap_or_else(|_| {
            // Only if the batch task panicked.
            Err(AwsError::local(
                self.inner.operation,
                ErrorClass::Transient,
                "the coalesced lookup was abandoned",
                1,
            ))
        })
    }

    fn start_window(&self, generation: u64) {
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(this.inner.window).await;
            let batch = {
                let mut pending = this.inner.pending.lock();
                if pending.generation != generation || pending.waiters.is_empty() {
                    return;
                }
                take(&mut pending)
            };
            this.flush(batch);
        });
    }

    fn flush(&self, batch: HashMap<K, Vec<Reply<V>>>) {
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let keys: Vec<K> = batch.keys().cloned().collect();
            api_metrics::observe_batch_size(inner.kind, keys.len());
            match (inner.fetch)(keys).await {
                Ok(mut found) => {
                    for (key, replies) in batch {
                        let value = found.remove(&key);
                        for reply in replies {
                            // The caller may have gone; nothing to do then.
                            let _ = reply.send(Ok(value.clone()));
                        }
                    }
                }
                Err(err) => {
                    for reply in batch.into_values().flatten() {
                        let _ = reply.send(Err(err.clone()));
                    }
                }
            }
        });
    }
}

fn take<K, V>(pending: &mut Pending<K, V>) -> HashMap<K, Vec<Reply<V>>> {
    pending.generation = pending.generation.wrapping_add(1);
    std::mem::take(&mut pending.waiters)
}

type SharedResult<T> = Shared<BoxFuture<'static, Result<T, AwsError>>>;

struct FlightState<T> {
    cached: Option<(Instant, T)>,
    in_flight: Option<SharedResult<T>>,
    /// Bumped by `invalidate`, so a computation started before it does not
    /// install its (possibly stale) result.
    generation: u64,
}

/// One shared computation with a TTL-cached result. Clones share it.
#[derive(Clone)]
pub(crate) struct SingleFlight<T> {
    operation: Operation,
    ttl: Duration,
    state: Arc<Mutex<FlightState<T>>>,
}

impl<T> SingleFlight<T>
where
    T: Clone + Send + Sync + 'static,
{
    pub(crate) fn new(operation: Operation, ttl: Duration) -> SingleFlight<T> {
        SingleFlight {
            operation,
            ttl,
            state: Arc::new(Mutex::new(FlightState {
                cached: None,
                in_flight: None,
                generation: 0,
            })),
        }
    }

    /// The cached value if fresh; otherwise joins the computation in flight,
    /// or starts one with `start`. Errors are not cached: the next caller
    /// tries again.
    pub(crate) async fn get<F>(&self, start: F) -> Result<T, AwsError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<T, AwsError>>,
    {
        let shared = {
            let mut state = self.state.lock();
            if let Some((at, value)) = &state.cached
                && at.elapsed() < self.ttl
            {
                return Ok(value.clone());
            }
            match &state.in_flight {
                Some(shared) => shared.clone(),
                None => {
                    // The expired value serves no one from here on: drop it
                    // now rather than when the new one lands, so the two
                    // (two 5,000-instance sweeps) are not held at once.
                    state.cached = None;
                    let generation = state.generation;
                    let work = start();
                    let slot = self.state.clone();
                    let operation = self.operation;
                    let task = tokio::spawn(async move {
                        let started = Instant::now();
                        let result = work.await;
                        let mut state = slot.lock();
                        if state.generation == generation {
                            state.in_flight = None;
                            if let Ok(value) = &result {
                                // Age from the start: the data is as old as
                                // the first page read.
                                state.cached = Some((started, value.clone()));
                            }
                        }
                        result
                    });
                    let shared = async move {
                        task.await.unwrap_or_else(|_| {
                            Err(AwsError::local(
                                operation,
                                ErrorClass::Transient,
                                "the shared AWS read was abandoned",
                                1,
                            ))
                        })
                    }
                    .boxed()
                    .shared();
                    state.in_flight = Some(shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    /// Drops the cached value; the next `get` reads AWS again. A computation
    /// already in flight finishes for its waiters but is not cached.
    pub(crate) fn invalidate(&self) {
        let mut state = self.state.lock();
        state.generation = state.generation.wrapping_add(1);
        state.cached = None;
        state.in_flight = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::client::errors::AttemptFailure;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Calls = Arc<Mutex<Vec<Vec<u32>>>>;

    /// A fake batch call: knows the even keys, records each batch.
    fn even_keys(calls: Calls) -> BatchFetch<u32, String> {
        Arc::new(move |keys: Vec<u32>| {
            let calls = calls.clone();
            async move {
                let mut sorted = keys.clone();
                sorted.sort_unstable();
                calls.lock().push(sorted);
                Ok(keys
                    .into_iter()
                    .filter(|k| k % 2 == 0)
                    .map(|k| (k, format!("value-{k}")))
                    .collect())
            }
            .boxed()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_lookups_share_one_call_and_unknown_keys_are_isolated() {
        let calls: Calls = Arc::default();
        let batcher = Batcher::new(
            "test",
            Operation::Ec2DescribeInstances,
            Duration::from_millis(5),
            1000,
            even_keys(calls.clone()),
        );
        let lookups = (0..100u32).map(|k| {
            let batcher = batcher.clone();
            async move { (k, batcher.get(k).await) }
        });
        let results = futures::future::join_all(lookups).await;
        assert_eq!(calls.lock().len(), 1, "one batch call");
        assert_eq!(calls.lock()[0].len(), 100);
        for (key, result) in results {
            let value = result.expect("batch succeeded");
            if key % 2 == 0 {
                assert_eq!(
                    value,
                    Some(format!("value-{key}")),
                    "each caller gets its own value"
                );
            } else {
                assert_eq!(
                    value, None,
                    "unknown key {key} is not found for its caller only"
                );
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_is_sent_at_once_and_duplicates_share_a_slot() {
        let calls: Calls = Arc::default();
        let batcher = Batcher::new(
            "test",
            Operation::Ec2DescribeInstances,
            Duration::from_secs(3600),
            10,
            even_keys(calls.clone()),
        );
        // 25 distinct keys, the last one asked three times: batches of 10,
        // 10, and 5 (the last one after its window).
        let start = Instant::now();
        let keys: Vec<u32> = (0..25).chain([24, 24]).collect();
        let lookups = keys.into_iter().map(|key| {
            let batcher = batcher.clone();
            async move { batcher.get(key).await }
        });
        let results = futures::future::join_all(lookups).await;
        assert!(results.iter().all(Result::is_ok));
        let sizes: Vec<usize> = calls.lock().iter().map(Vec::len).collect();
        assert_eq!(
            sizes.iter().sum::<usize>(),
            25,
            "duplicates are fetched once: {sizes:?}"
        );
        assert!(sizes.iter().all(|s| *s <= 10), "{sizes:?}");
        assert_eq!(sizes.len(), 3, "{sizes:?}");
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(3600),
            "the remainder waited for its window"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lookups_in_different_windows_are_separate_calls() {
        let calls: Calls = Arc::default();
        let batcher = Batcher::new(
            "test",
            Operation::Ec2DescribeInstances,
            Duration::from_millis(5),
            1000,
            even_keys(calls.clone()),
        );
        assert_eq!(batcher.get(2).await.expect("ok"), Some("value-2".into()));
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(batcher.get(4).await.expect("ok"), Some("value-4".into()));
        assert_eq!(*calls.lock(), vec![vec![2], vec![4]]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_every_caller_with_the_same_error() {
        let fetch: BatchFetch<u32, String> = Arc::new(|_keys| {
            async {
                Err(AwsError::from_attempt(
                    Operation::Ec2DescribeInstances,
                    AttemptFailure::new(ErrorClass::Fatal, Some("UnauthorizedOperation"), "no"),
                    1,
                ))
            }
            .boxed()
        });
        let batcher = Batcher::new(
            "test",
            Operation::Ec2DescribeInstances,
            Duration::from_millis(5),
            1000,
            fetch,
        );
        let (a, b) = tokio::join!(batcher.get(1), batcher.get(2));
        for result in [a, b] {
            assert_eq!(
                result.expect_err("failed").code(),
                Some("UnauthorizedOperation")
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_caller_does_not_cancel_the_batch() {
        let calls: Calls = Arc::default();
        let batcher = Batcher::new(
            "test",
            Operation::Ec2DescribeInstances,
            Duration::from_millis(5),
            1000,
            even_keys(calls.clone()),
        );
        let impatient = tokio::time::timeout(Duration::from_millis(1), batcher.get(2));
        let patient = batcher.get(4);
        let (impatient, patient) = tokio::join!(impatient, patient);
        assert!(impatient.is_err(), "timed out");
        assert_eq!(patient.expect("ok"), Some("value-4".into()));
        assert_eq!(*calls.lock(), vec![vec![2, 4]]);
    }

    #[tokio::test(start_paused = true)]
    async fn single_flight_shares_the_computation_and_caches_for_the_ttl() {
        let flight = SingleFlight::new(Operation::Ec2DescribeInstances, Duration::from_secs(30));
        let runs = Arc::new(AtomicUsize::new(0));
        let start = |runs: Arc<AtomicUsize>| {
            move || {
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok(Arc::new(n))
                }
                .boxed()
            }
        };
        let all = futures::future::join_all((0..20).map(|_| flight.get(start(runs.clone())))).await;
        assert!(all.iter().all(|r| matches!(r, Ok(v) if **v == 1)));
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one computation for 20 concurrent callers"
        );

        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(*flight.get(start(runs.clone())).await.expect("cached"), 1);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "served from cache within the TTL"
        );

        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(*flight.get(start(runs.clone())).await.expect("fresh"), 2);

        flight.invalidate();
        assert_eq!(*flight.get(start(runs.clone())).await.expect("fresh"), 3);
    }

    /// A refresh releases the expired value when it starts, not when it
    /// ends: a large value is never held twice by the cache.
    #[tokio::test(start_paused = true)]
    async fn single_flight_releases_the_expired_value_before_refreshing() {
        let flight: SingleFlight<Arc<u32>> =
            SingleFlight::new(Operation::Ec2DescribeInstances, Duration::from_secs(30));
        let old = Arc::downgrade(
            &flight
                .get(|| async { Ok(Arc::new(1)) }.boxed())
                .await
                .expect("first"),
        );
        assert!(old.upgrade().is_some(), "cached");
        tokio::time::advance(Duration::from_secs(31)).await;
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let refresh = tokio::spawn({
            let flight = flight.clone();
            async move {
                flight
                    .get(|| {
                        async move {
                            let _ = released.await;
                            Ok(Arc::new(2))
                        }
                        .boxed()
                    })
                    .await
            }
        });
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            old.upgrade().is_none(),
            "expired value dropped while the refresh runs"
        );
        release.send(()).expect("refresh waiting");
        assert_eq!(*refresh.await.expect("task").expect("fresh"), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn single_flight_does_not_cache_errors() {
        let flight: SingleFlight<Arc<u32>> =
            SingleFlight::new(Operation::Ec2DescribeInstances, Duration::from_secs(30));
        let failing = || {
            async {
                Err(AwsError::from_attempt(
                    Operation::Ec2DescribeInstances,
                    AttemptFailure::new(ErrorClass::Transient, Some("InternalError"), "boom"),
                    1,
                ))
            }
            .boxed()
        };
        assert!(flight.get(failing).await.is_err());
        let ok = flight.get(|| async { Ok(Arc::new(7)) }.boxed()).await;
        assert_eq!(*ok.expect("not cached: computed again"), 7);
    }
}
