//! When a controller acts: the one mechanism every controller here is
//! scheduled by. A controller file says what its work is and what makes it
//! due; when it runs, how it is retried and what `workqueue_*` reports is
//! decided here.
//!
//! * **Keys.** [`keyed::Keyed`], the one keyed scheduler (priority classes,
//!   per-key backoff, settling adds, batches), hands keys to the controllers
//!   that work on keys: one key at a time (cloud-node, service) or every
//!   due key in one batched call (tagging, the network-node labeller).
//! * **Sets.** The controllers that pass over a whole set at once (route,
//!   node lifecycle, address refresh, node IPAM) run on
//!   [`periodic::Periodic`]: a pass at start, every period after the last
//!   began, once a watched value's change settles, and after a failed pass
//!   by the backoff, never later than the period.
//! * **Wake-ups.** Loops sleep in this module and nowhere else: the
//!   periodic runner and the change scans in [`wait`], the keyed queue's one
//!   loop until its next due key (`Keyed::run`); each until its own next due
//!   instant, a change, or shutdown. Changes come from the shared
//!   informer caches ([`changed`] on their generation, or the per-Node
//!   feed); no controller re-reads a cache on a fast timer, so an idle
//!   cluster costs nothing.
//! * **Due instants.** Retries back off by [`crate::backoff::Backoff`], the
//!   one policy, each user naming its two figures; bursts of node changes
//!   settle by [`settle::Settle`]; periodic resyncs of Services fall in
//!   per-Service slots (`provider::load_balancers::resync_slot`), which the
//!   load balancers' own re-reads share.
//! * **Metrics.** Every queue and runner reports to [`workqueue::Queue`],
//!   client-go's `workqueue_*` families under the Go controllers' queue
//!   names, retries included.
//!
//! Which controllers run where: the cloud-node controller, its network-node
//! labeller and its instance prefetch, the service controller and the
//! tagging controller on [`keyed::Keyed`]; each one's file says which keys a
//! change makes due (for the service controller, a node change only the
//! Services whose backends it moves), the queue when, by how many workers,
//! with which backoff. Route, node lifecycle, the address refresh and node
//! IPAM on [`periodic::Periodic`]; each one's file holds only its pass.
//! docs/operations.md, "When each controller acts", has the table an
//! operator reads.

pub(crate) mod keyed;
pub(crate) mod periodic;
pub(crate) mod settle;
mod workqueue;

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What ended a [`wait`].
#[derive(Debug, PartialEq, Eq)]
enum Wake<T> {
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
async fn wait<T>(
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

/// Completes when the informer behind `changes` has applied an event since
/// this receiver last looked; never, once the informer is gone (shutting
/// down), so a closed channel cannot spin a loop: the [`wait`] timer or
/// `stop` ends the wait instead.
async fn changed(changes: &mut watch::Receiver<u64>) {
    if changes.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
}
