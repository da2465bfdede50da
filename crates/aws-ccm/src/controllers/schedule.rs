//! When a controller acts: the one mechanism every controller here is
//! scheduled by, in small pieces each takes as it needs.
//!
//! * **Wake-ups.** A controller loop sleeps in [`wait`] and nowhere else:
//!   until its own next due instant, a change, or shutdown. Changes come
//!   from the shared informer caches ([`changed`] on their generation, or
//!   the per-Node feed); no controller re-reads a cache on a fast timer, so
//!   an idle cluster costs nothing. Periodic passes (node lifecycle,
//!   address refresh) run in [`every`].
//! * **Due instants.** What a controller sleeps until comes from three
//!   rules, each defined once: retries back off by [`crate::backoff::Backoff`]
//!   (kept per key, beside the key's other state); bursts of node changes
//!   settle by [`settle::Settle`]; periodic resyncs fall in per-Service slots
//!   (`provider::load_balancers::resync_slot`), which the load balancers'
//!   own re-reads share.
//! * **Metrics.** Every queue reports to [`workqueue::Queue`], client-go's
//!   `workqueue_*` families under the Go controllers' queue names.
//!
//! The cloud-node controller reacts to one Node at a time, so it runs in
//! kube-runtime's `Controller` (its triggers, dedup and concurrency) with
//! these pieces for its backoff and metrics. The others act on sets (every
//! Service a node change reaches, every route of the cluster, every Node to
//! tag in one call), which per-object reconciles cannot express; the first
//! line of each one's file says what it needs. docs/operations.md, "When
//! each controller acts", has the table an operator reads.

pub mod keyed;
pub mod settle;
pub mod workqueue;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What ended a [`wait`].
#[derive(Debug, PartialEq, Eq)]
pub enum Wake<T> {
    /// The due instant came.
    Due,
    /// The change future completed, with its output.
    Changed(T),
    /// `stop` was cancelled: the controller returns.
    Stopped,
}

/// Sleeps until `due` (with `None`, only a change or `stop` ends it), until
/// `change` completes, or until `stop` is cancelled, whichever comes first:
/// the one place a controller loop sleeps.
pub async fn wait<T>(
    stop: &CancellationToken,
    due: Option<Instant>,
    change: impl Future<Output = T>,
) -> Wake<T> {
    let timer = async {
        match due {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    // In this order when several are ready: stop always wins, and a change
    // is taken before the timer, so a due instant in the past never keeps
    // a loop from reading its changes.
    tokio::select! {
        biased;
        _ = stop.cancelled() => Wake::Stopped,
        out = change => Wake::Changed(out),
        _ = timer => Wake::Due,
    }
}

/// Sleeps for `d` unless `stop` is cancelled first: a wait with no change.
pub async fn sleep(stop: &CancellationToken, d: Duration) -> Wake<()> {
    wait(stop, Some(Instant::now() + d), std::future::pending()).await
}

/// Completes when the informer behind `changes` has applied an event since
/// this receiver last looked; never, once the informer is gone (shutting
/// down), so a closed channel cannot spin a loop: the [`wait`] timer or
/// `stop` ends the wait instead.
pub async fn changed(changes: &mut watch::Receiver<u64>) {
    if changes.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Runs `pass` now and then every `period` after the last one began (a
/// pass longer than the period is followed at once by the next, never by a
/// burst of missed ones), until `stop` is cancelled, which also cuts a pass
/// short: the periodic controllers' one loop.
pub async fn every<F, Fut>(period: Duration, stop: &CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if wait(stop, None, ticker.tick()).await == Wake::Stopped {
            return;
        }
        if wait(stop, None, pass()).await == Wake::Stopped {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_at_the_first_of_due_change_and_stop() {
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let second = Duration::from_secs(1);
        let (tx, mut rx) = watch::channel(0u64);

        // Nothing changes: the due instant ends it, not a moment early.
        let woke = wait(&stop, Some(t0 + second), changed(&mut rx)).await;
        assert_eq!(woke, Wake::Due);
        assert_eq!(Instant::now(), t0 + second);

        // A change before the due instant ends it at once.
        tx.send(1).expect("receiver alive");
        let woke = wait(&stop, Some(t0 + 10 * second), changed(&mut rx)).await;
        assert_eq!(woke, Wake::Changed(()));
        assert_eq!(Instant::now(), t0 + second);

        // The informer gone: no spin on the closed channel; the timer ends it.
        drop(tx);
        let woke = wait(&stop, Some(t0 + 3 * second), changed(&mut rx)).await;
        assert_eq!(woke, Wake::Due);
        assert_eq!(Instant::now(), t0 + 3 * second);

        // Stop wins over a change that is already there.
        let cancel = stop.clone();
        let woke = wait(&stop, None, async move {
            cancel.cancel();
            std::future::pending::<()>().await
        })
        .await;
        assert_eq!(woke, Wake::Stopped);
        let woke = wait(&stop, None, std::future::ready(7)).await;
        assert_eq!(woke, Wake::Stopped);
    }

    #[tokio::test(start_paused = true)]
    async fn every_runs_a_pass_per_period_and_none_after_stop() {
        let stop = CancellationToken::new();
        let t0 = Instant::now();
        let period = Duration::from_secs(5);
        let mut starts = Vec::new();
        let stopper = stop.clone();
        every(period, &stop, || {
            starts.push(Instant::now() - t0);
            // A pass that takes 7 s: the next starts at once, not in a burst.
            let long = starts.len() == 2;
            let stopper = stopper.clone();
            let n = starts.len();
            async move {
                if long {
                    tokio::time::sleep(Duration::from_secs(7)).await;
                }
                if n == 4 {
                    stopper.cancel();
                }
            }
        })
        .await;
        let s = Duration::from_secs;
        assert_eq!(starts, vec![s(0), s(5), s(12), s(17)]);
    }
}
