//! The one keyed scheduler: every controller that works on keys (the
//! cloud-node controller, the service controller, the tagging controller
//! and the network-node labeller) says *which* keys need work, and this
//! queue decides *when* each is worked on, by whom, how often it is retried
//! and what `workqueue_*` reports about it.
//!
//! **Why not kube-runtime's `Controller`.** It is what this queue is
//! modelled on (a key is never worked on twice at once, an add while it is
//! worked on runs it once more afterwards, a bounded number of workers), but
//! three needs the project measured are outside what it can carry:
//! * *Priority.* It hands out keys in the order they came due. A Service a
//!   user just created then waits behind a fresh leader's adoption of every
//!   other Service (the bench's "Service created during adoption" figure: a
//!   hostname within 15 s at 1,000 Services needs the new one first).
//! * *Batches.* Its reconciler takes one key. EC2 tags 1,000 instances in
//!   one `CreateTags`, and answers `DescribeInstanceTopology` for 100
//!   instances in one call; the tagging controller and the labeller take
//!   every due key at once, up to that limit.
//! * *Work that follows another queue.* The labeller asks only once the
//!   cloud-node controller's queue is idle, so its questions gather for as
//!   long as a join lasts instead of for a window of time ([`Workers::behind`]).
//!
//! What it does, once for all its users:
//! * **Due.** A key is due now ([`Keyed::add`]), at an instant
//!   ([`Keyed::add_at`]: a resync slot), or once a burst of adds settles
//!   ([`Keyed::add_settled`]: quiet for a while, but never later than a cap
//!   after the burst's first add). The earliest of its due instants wins.
//! * **Order.** Among due keys, the more urgent [`Class`] first, then the
//!   one due longest.
//! * **Retries.** Work ends with an [`Outcome`]. A failure counts against
//!   the key and it is due again after the queue's [`Backoff`]; a success
//!   forgets the count. [`Outcome::RetryAfter`] is a wait the work chose
//!   (AWS's `DependencyViolation` while a group is released), not a failure.
//! * **Metrics.** client-go's `workqueue_*` under the queue's name
//!   ([`workqueue::Queue`]): depth counts due keys, retries are counted, and
//!   a key's wait is observed when it is taken, retries included.
//!
//! Only [`Keyed::run`] takes keys: the one loop of every keyed controller.
//! A controller that finds its due keys by scanning the informer caches
//! (the service controller: a node change makes due only the Services
//! whose backends it moves) scans in [`scan_at_changes`].

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::workqueue;
use crate::backoff::Backoff;

/// How urgent a key's work is; the more urgent goes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Class {
    /// Somebody waits for it: a new or changed object, a deletion.
    UserWaits,
    /// A fresh leader taking over what already exists.
    Adoption,
    /// Resyncs and retries.
    Background,
}

/// How a key's work ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Done: the failure count is forgotten.
    Done,
    /// Failed: due again after the queue's backoff for one more failure.
    Retry,
    /// Not done, not failed: due again after this wait, the failure count
    /// kept as it is.
    RetryAfter(Duration),
}

/// A key handed to the work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) key: String,
    /// Its class when taken.
    class: Class,
    /// Failures in a row before this attempt.
    pub(crate) failures: u32,
}

/// Who takes keys in [`Keyed::run`].
#[derive(Clone)]
pub(crate) struct Workers {
    /// At most this many works at once.
    count: usize,
    /// At most this many keys per work.
    batch: usize,
    /// Take keys only while this queue is idle, or once the key due longest
    /// has waited this long.
    behind: Option<(Keyed, Duration)>,
}

impl Workers {
    /// `count` works of one key each.
    pub(crate) fn each(count: usize) -> Workers {
        Workers {
            count: count.max(1),
            batch: 1,
            behind: None,
        }
    }

    /// One work at a time, of up to `batch` keys.
    pub(crate) fn batches(batch: usize) -> Workers {
        Workers {
            count: 1,
            batch: batch.max(1),
            behind: None,
        }
    }

    /// The same, taking keys only once `queue` is idle (or after `at_most`).
    pub(crate) fn behind(self, queue: &Keyed, at_most: Duration) -> Workers {
        Workers {
            behind: Some((queue.clone(), at_most)),
            ..self
        }
    }
}

#[derive(Debug)]
struct Entry {
    class: Class,
    /// Due at this instant (an add, an add at, a retry).
    at: Option<Instant>,
    /// A settling burst: its first and its last add.
    burst: Option<(Instant, Instant)>,
    /// Where the entry sits in the index, if it does.
    indexed: Option<Slot>,
    /// Being worked on: adds while so are kept and take effect when the
    /// work ends.
    leased: bool,
    failures: u32,
}

impl Entry {
    fn new(class: Class) -> Entry {
        Entry {
            class,
            at: None,
            burst: None,
            indexed: None,
            leased: false,
            failures: 0,
        }
    }
}

/// An entry's place in the index: future ones by instant, due ones by class.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Slot {
    Later(Instant, String),
    Ready(Class, Instant, String),
}

struct State {
    entries: HashMap<String, Entry>,
    later: BTreeSet<Slot>,
    ready: BTreeSet<Slot>,
}

struct Inner {
    backoff: Backoff,
    settle: Option<(Duration, Duration)>,
    state: Mutex<State>,
    /// An add or the end of a work: the loop looks again.
    changed: Notify,
    metrics: workqueue::Queue,
}

/// One controller's queue of keys.
#[derive(Clone)]
pub(crate) struct Keyed {
    inner: Arc<Inner>,
}

impl Keyed {
    /// A queue reporting `workqueue_*` as `name` (the Go controller's queue
    /// name), retrying failures with `backoff`.
    pub(crate) fn new(name: &'static str, backoff: Backoff) -> Keyed {
        Keyed {
            inner: Arc::new(Inner {
                backoff,
                settle: None,
                state: Mutex::new(State {
                    entries: HashMap::new(),
                    later: BTreeSet::new(),
                    ready: BTreeSet::new(),
                }),
                changed: Notify::new(),
                metrics: workqueue::Queue::new(name),
            }),
        }
    }

    /// The same, with the settling rule of [`Keyed::add_settled`]: due once
    /// `quiet` passed without an add, at the latest `cap` after the first.
    pub(crate) fn settling(
        name: &'static str,
        backoff: Backoff,
        (quiet, cap): (Duration, Duration),
    ) -> Keyed {
        let mut q = Keyed::new(name, backoff);
        if let Some(inner) = Arc::get_mut(&mut q.inner) {
            inner.settle = Some((quiet, cap));
        }
        q
    }

    /// `key` needs work now.
    pub(crate) fn add(&self, key: &str, class: Class) {
        self.add_at(key, Instant::now(), class);
    }

    /// `key` needs work at `at` (or earlier, if it is due earlier already).
    pub(crate) fn add_at(&self, key: &str, at: Instant, class: Class) {
        self.update(key, class, |e| {
            e.at = Some(e.at.map_or(at, |t| t.min(at)));
        });
    }

    /// `key` needs work once its burst of adds settles. Without a settling
    /// rule, now.
    pub(crate) fn add_settled(&self, key: &str, class: Class) {
        let Some(_) = self.inner.settle else {
            return self.add(key, class);
        };
        let now = Instant::now();
        self.update(key, class, |e| {
            let first = e.burst.map_or(now, |(first, _)| first);
            e.burst = Some((first, now));
        });
    }

    /// `key`'s object is gone: not due any more, its failures forgotten. A
    /// work in progress ends as it will; nothing follows it.
    pub(crate) fn forget(&self, key: &str) {
        let mut state = self.inner.state.lock();
        let Some(mut e) = state.entries.remove(key) else {
            return;
        };
        // A work in progress finds no entry at its end and schedules nothing.
        state.unindex(&mut e);
        drop(state);
        self.inner.metrics.forget(key);
    }

    /// Failures in a row of `key`'s work so far.
    pub(crate) fn failures(&self, key: &str) -> u32 {
        self.inner
            .state
            .lock()
            .entries
            .get(key)
            .map_or(0, |e| e.failures)
    }

    /// Completes once no key is due and none is being worked on.
    pub(crate) async fn idle(&self) {
        self.inner.metrics.idle().await
    }

    fn update(&self, key: &str, class: Class, change: impl FnOnce(&mut Entry)) {
        let mut state = self.inner.state.lock();
        let mut e = state
            .entries
            .remove(key)
            .unwrap_or_else(|| Entry::new(class));
        state.unindex(&mut e);
        // A key already due keeps the more urgent class; else the add's.
        e.class = if e.at.is_some() || e.burst.is_some() {
            e.class.min(class)
        } else {
            class
        };
        change(&mut e);
        state.index(key, &mut e, self.inner.settle, &self.inner.metrics);
        state.entries.insert(key.to_string(), e);
        drop(state);
        self.inner.changed.notify_one();
    }

    /// Moves keys whose instant came to the ready set; returns when the next
    /// one comes.
    fn promote(&self, now: Instant) -> Option<Instant> {
        let mut state = self.inner.state.lock();
        while let Some(Slot::Later(at, key)) = state.later.first().cloned() {
            if at > now {
                return Some(at);
            }
            if let Some(mut e) = state.entries.remove(&key) {
                state.unindex(&mut e);
                state.index(&key, &mut e, self.inner.settle, &self.inner.metrics);
                state.entries.insert(key, e);
            } else {
                state.later.remove(&Slot::Later(at, key));
            }
        }
        None
    }

    /// Up to `max` due keys, most urgent first, leased to one work.
    fn take(&self, max: usize) -> Vec<(Taken, workqueue::Work)> {
        let mut state = self.inner.state.lock();
        let mut taken = Vec::new();
        while taken.len() < max {
            let Some(Slot::Ready(class, at, key)) = state.ready.first().cloned() else {
                break;
            };
            let Some(mut e) = state.entries.remove(&key) else {
                state.ready.remove(&Slot::Ready(class, at, key));
                continue;
            };
            state.unindex(&mut e);
            e.at = None;
            e.burst = None;
            e.leased = true;
            let failures = e.failures;
            state.entries.insert(key.clone(), e);
            let work = self.inner.metrics.take(&key);
            taken.push((
                Taken {
                    key,
                    class,
                    failures,
                },
                work,
            ));
        }
        taken
    }

    /// The instant the key due longest became due, if any is.
    fn oldest_ready(&self) -> Option<Instant> {
        let state = self.inner.state.lock();
        state
            .ready
            .iter()
            .filter_map(|s| match s {
                Slot::Ready(_, at, _) => Some(*at),
                Slot::Later(..) => None,
            })
            .min()
    }

    /// The work on `key` ended so.
    fn release(&self, key: &str, outcome: Outcome) {
        let now = Instant::now();
        let mut state = self.inner.state.lock();
        let Some(mut e) = state.entries.remove(key) else {
            return;
        };
        e.leased = false;
        // An add while the work ran keeps its instant (an add now beats any
        // backoff: the object changed since it failed) and its class.
        let retry_at = match outcome {
            Outcome::Done => {
                e.failures = 0;
                None
            }
            Outcome::Retry => {
                e.failures = e.failures.saturating_add(1);
                Some(now + self.inner.backoff.after(e.failures))
            }
            Outcome::RetryAfter(wait) => Some(now + wait),
        };
        if let Some(at) = retry_at {
            self.inner.metrics.retry();
            e.at = Some(e.at.map_or(at, |t| t.min(at)));
        }
        state.index(key, &mut e, self.inner.settle, &self.inner.metrics);
        state.entries.insert(key.to_string(), e);
        drop(state);
        self.inner.changed.notify_one();
    }

    /// Takes keys as they come due and runs `work` on them by `workers`,
    /// until `stop` is cancelled; then waits for the works in progress.
    /// `work` gets at most `workers.batch` keys and answers one outcome
    /// per key, in their order (a missing one counts as [`Outcome::Retry`]).
    pub(crate) async fn run<F, Fut>(&self, stop: &CancellationToken, workers: Workers, work: F)
    where
        F: Fn(Vec<Taken>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Outcome>> + Send + 'static,
    {
        let work = Arc::new(work);
        let slots = Arc::new(Semaphore::new(workers.count));
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let next = self.promote(now);
            let free = slots.available_permits() > 0;
            let held = match &workers.behind {
                None => None,
                Some((ahead, at_most)) => {
                    let idle = futures::FutureExt::now_or_never(ahead.idle()).is_some();
                    let waited_enough = self.oldest_ready().is_some_and(|t| now >= t + *at_most);
                    (!idle && !waited_enough)
                        .then(|| (ahead.clone(), self.oldest_ready().map(|t| t + *at_most)))
                }
            };
            if free && held.is_none() {
                let batch = self.take(workers.batch);
                if !batch.is_empty() {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        unreachable!("a slot was free and only this loop takes slots");
                    };
                    let (queue, work) = (self.clone(), work.clone());
                    tokio::spawn(async move {
                        let (keys, metrics): (Vec<Taken>, Vec<workqueue::Work>) =
                            batch.into_iter().unzip();
                        let names: Vec<String> = keys.iter().map(|t| t.key.clone()).collect();
                        let outcomes = work(keys).await;
                        // Released before the work is observed done, so the
                        // queue never looks idle in between.
                        for (i, key) in names.iter().enumerate() {
                            queue.release(key, outcomes.get(i).copied().unwrap_or(Outcome::Retry));
                        }
                        drop(metrics);
                        drop(permit);
                        queue.inner.changed.notify_one();
                    });
                    continue;
                }
            }
            let timer = async {
                let until = match &held {
                    Some((_, cap)) => next.into_iter().chain(*cap).min(),
                    None => next,
                };
                match until {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let ahead_idle = async {
                match &held {
                    Some((ahead, _)) => ahead.idle().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = &mut changed => {}
                _ = ahead_idle => {}
                _ = timer => {}
            }
        }
        let _ = slots.acquire_many(workers.count as u32).await;
    }
}

impl State {
    fn unindex(&mut self, e: &mut Entry) {
        match e.indexed.take() {
            Some(s @ Slot::Later(..)) => {
                self.later.remove(&s);
            }
            Some(s @ Slot::Ready(..)) => {
                self.ready.remove(&s);
            }
            None => {}
        }
    }

    /// Puts `e` where its due instant says (nowhere, when it is not due or is
    /// being worked on), and tells the metrics once it is due.
    fn index(
        &mut self,
        key: &str,
        e: &mut Entry,
        settle: Option<(Duration, Duration)>,
        metrics: &workqueue::Queue,
    ) {
        if e.leased {
            return;
        }
        let settled = e
            .burst
            .zip(settle)
            .map(|((first, last), (quiet, cap))| (last + quiet).min(first + cap));
        let Some(at) = e.at.into_iter().chain(settled).min() else {
            metrics.forget(key);
            return;
        };
        let slot = if at <= Instant::now() {
            metrics.due(key);
            Slot::Ready(e.class, at, key.to_string())
        } else {
            metrics.forget(key);
            Slot::Later(at, key.to_string())
        };
        match &slot {
            Slot::Later(..) => self.later.insert(slot.clone()),
            Slot::Ready(..) => self.ready.insert(slot.clone()),
        };
        e.indexed = Some(slot);
    }
}

/// Calls `scan` at once and again after every change of any of `changes`
/// (informer generations), until `stop` is cancelled: where a controller
/// that adds keys from whole-cache scans waits. A change that lands while
/// `scan` runs is seen by the one scan after it; several changes before a
/// scan cost one scan.
pub(crate) async fn scan_at_changes(
    stop: &CancellationToken,
    mut changes: Vec<watch::Receiver<u64>>,
    mut scan: impl FnMut(),
) {
    loop {
        for c in &mut changes {
            c.borrow_and_update();
        }
        scan();
        let any = async {
            if changes.is_empty() {
                return std::future::pending().await;
            }
            let each = changes.iter_mut().map(|c| Box::pin(super::changed(c)));
            futures::future::select_all(each).await;
        };
        if super::wait(stop, None, any).await == super::Wake::Stopped {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
