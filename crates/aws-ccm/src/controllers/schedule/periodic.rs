//! The one runner of the set passes: the controllers that act on a whole
//! set at once (the route controller's reconcile of every route, the node
//! lifecycle controller's check of every Node, the address refresh of every
//! initialized Node, node IPAM's rebuild and allocation) each say what one
//! pass does and what it watches; when a pass runs is decided here, once.
//!
//! A [`Periodic`] runs its pass:
//! * at start;
//! * every `period` after the last one began ([`Periodic::every`]): a pass
//!   longer than the period is followed at once by the next, never by a
//!   burst of missed ones (k8s.io/apimachinery's `NonSlidingUntil`, which
//!   upstream's route controller runs on);
//! * once a watched value has changed since the last pass and settled
//!   ([`Periodic::on_change`], [`settle::Settle`]): the value is sampled
//!   when an informer's generation moves, so a change that does not move
//!   it (a Node's heartbeat, for routes) costs no pass;
//! * after a pass that answered [`Pass::Retry`], by the runner's
//!   [`Backoff`] for the failures in a row, never later than the period; a
//!   pass that is done forgets the count.
//!
//! Stopping ends a wait and cuts a pass short. Each runner reports as
//! client-go's `workqueue_*` under its name ([`workqueue::Queue`]), with one
//! key, the set: added while a change is held to settle, taken when a pass
//! starts, retried after a pass that answered [`Pass::Retry`].
//!
//! Why not the keyed queue ([`super::keyed`]): a set pass has one key, and
//! what it needs beyond one key's schedule is a period and a value to
//! watch, which keys have not.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Wake, changed, settle, wait, workqueue};
use crate::backoff::Backoff;

/// What a controller runs on a [`Periodic`]: its state, and one pass over
/// its set, which may change the state (one pass at a time, so it owns it).
pub(crate) trait SetPass: Send {
    fn pass(&mut self) -> impl Future<Output = Pass> + Send;
}

/// A closure whose future owns what it needs is a pass too.
impl<F, Fut> SetPass for F
where
    F: FnMut() -> Fut + Send,
    Fut: Future<Output = Pass> + Send,
{
    fn pass(&mut self) -> impl Future<Output = Pass> + Send {
        self()
    }
}

/// How a set pass ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Done: the next pass comes with the period or a change.
    Done,
    /// Failed, or left something to try again soon: the next pass comes
    /// after the runner's backoff for one more failure in a row.
    Retry,
}

/// One set pass's schedule (see the module comment).
pub(crate) struct Periodic {
    queue: workqueue::Queue,
    retry: Backoff,
    period: Option<Duration>,
    trigger: Option<Trigger>,
}

/// What makes a pass due before its period: a change of `value`, sampled
/// when `changes` moves, once it settles.
struct Trigger {
    changes: watch::Receiver<u64>,
    value: Box<dyn FnMut() -> u64 + Send>,
    settle: settle::Settle,
}

/// The runner's one key in `workqueue_*`: the whole set.
const SET_KEY: &str = "set";

impl Periodic {
    /// A pass at start, and again after a failed one by `retry`, reported
    /// as `name` (the Go controller's queue name, where it has one).
    pub(crate) fn new(name: &'static str, retry: Backoff) -> Periodic {
        Periodic {
            queue: workqueue::Queue::new(name),
            retry,
            period: None,
            trigger: None,
        }
    }

    /// A pass every `period` after the last one began.
    pub(crate) fn every(self, period: Duration) -> Periodic {
        Periodic {
            period: Some(period),
            ..self
        }
    }

    /// A pass once `value` has changed since the last pass and settled by
    /// `settle` (quiet, cap: [`settle::Settle`]); `value` is sampled
    /// whenever `changes` (an informer's generation) moves.
    pub(crate) fn on_change(
        self,
        changes: watch::Receiver<u64>,
        settle: (Duration, Duration),
        value: impl FnMut() -> u64 + Send + 'static,
    ) -> Periodic {
        Periodic {
            trigger: Some(Trigger {
                changes,
                value: Box::new(value),
                settle: settle::Settle::new(settle),
            }),
            ..self
        }
    }

    /// Runs `set`'s pass as said until `stop` is cancelled, which also cuts a
    /// pass short: the one loop of every set pass.
    pub(crate) async fn run(mut self, stop: &CancellationToken, mut set: impl SetPass) {
        let mut due = Some(Instant::now());
        // The value the last pass saw, and when a held change settles.
        let mut passed: Option<u64> = None;
        let mut held: Option<Instant> = None;
        let mut failures = 0u32;
        loop {
            let wake = held.into_iter().chain(due).min();
            // Changes are sampled while one is held too: sampled only when
            // it settles, a stream of changes would look quiet at each
            // wake-up and never reach the cap.
            let change = async {
                match &mut self.trigger {
                    Some(t) => changed(&mut t.changes).await,
                    None => std::future::pending().await,
                }
            };
            if wait(stop, wake, change).await == Wake::Stopped {
                return;
            }
            let now = Instant::now();
            held = None;
            let seen = self.trigger.as_mut().map(|t| {
                let value = (t.value)();
                (value, t.settle.observe(value, now))
            });
            if due.is_none_or(|d| now < d) {
                // Woken by a change, or by a held one settling.
                let Some((value, settled)) = seen else {
                    continue;
                };
                if passed == Some(value) {
                    continue;
                }
                if !settled {
                    held = self.trigger.as_ref().and_then(|t| t.settle.settles_at(now));
                    self.queue.due(SET_KEY);
                    continue;
                }
            }
            let work = self.queue.take(SET_KEY);
            let Wake::Changed(outcome) = wait(stop, None, set.pass()).await else {
                return;
            };
            drop(work);
            if let Some(t) = &mut self.trigger {
                t.settle.acted();
            }
            passed = seen.map(|(value, _)| value);
            let periodic = self.period.map(|p| now + p);
            due = match outcome {
                Pass::Done => {
                    failures = 0;
                    periodic
                }
                Pass::Retry => {
                    failures = failures.saturating_add(1);
                    self.queue.retry();
                    let retry = Instant::now() + self.retry.after(failures);
                    Some(periodic.map_or(retry, |p| p.min(retry)))
                }
            };
        }
    }
}

#[cfg(test)]
mod tests;
