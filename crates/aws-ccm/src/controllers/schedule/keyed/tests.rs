use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;

const BACKOFF: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
const SECOND: Duration = Duration::from_secs(1);

/// What the work saw: each batch's keys and when it began.
type Seen = Arc<Mutex<Vec<(Duration, Vec<String>)>>>;

/// Runs `q` with `workers`; each work records its keys, takes `took`, and
/// ends with what `outcome` says for its key.
fn start(
    q: &Keyed,
    workers: Workers,
    took: Duration,
    outcome: impl Fn(&Taken) -> Outcome + Send + Sync + 'static,
) -> (Seen, CancellationToken, Arc<Notify>) {
    let seen: Seen = Arc::default();
    let stop = CancellationToken::new();
    let ended = Arc::new(Notify::new());
    let (t0, s, e, outcome) = (
        Instant::now(),
        seen.clone(),
        ended.clone(),
        Arc::new(outcome),
    );
    let (q, st) = (q.clone(), stop.clone());
    tokio::spawn(async move {
        q.run(&st, workers, move |keys: Vec<Taken>| {
            let (s, e, outcome) = (s.clone(), e.clone(), outcome.clone());
            async move {
                s.lock()
                    .push((t0.elapsed(), keys.iter().map(|k| k.key.clone()).collect()));
                tokio::time::sleep(took).await;
                let out = keys.iter().map(|k| outcome(k)).collect();
                e.notify_one();
                out
            }
        })
        .await
    });
    (seen, stop, ended)
}

/// Lets the spawned loop and works run until nothing is ready at this instant.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn keys(seen: &Seen) -> Vec<Vec<String>> {
    seen.lock().iter().map(|(_, k)| k.clone()).collect()
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(start_paused = true)]
async fn the_most_urgent_class_goes_first_then_the_key_due_longest() {
    let q = Keyed::new("keyed-test-order", BACKOFF);
    q.add("resync", Class::Background);
    tokio::time::advance(SECOND).await;
    q.add("adopt-1", Class::Adoption);
    tokio::time::advance(SECOND).await;
    q.add("adopt-2", Class::Adoption);
    q.add("new", Class::UserWaits);
    // A Background key added again as UserWaits is now urgent.
    q.add("resync-changed", Class::Background);
    q.add("resync-changed", Class::UserWaits);
    let (seen, _stop, _) = start(&q, Workers::each(1), SECOND, |_| Outcome::Done);
    for _ in 0..6 {
        settle().await;
        tokio::time::advance(SECOND).await;
    }
    let order: Vec<String> = keys(&seen).concat();
    assert_eq!(
        order,
        strs(&["new", "resync-changed", "adopt-1", "adopt-2", "resync"])
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_is_never_worked_twice_at_once_and_an_add_meanwhile_runs_it_once_more() {
    let q = Keyed::new("keyed-test-once", BACKOFF);
    q.add("a", Class::UserWaits);
    let (seen, _stop, _) = start(&q, Workers::each(4), 10 * SECOND, |_| Outcome::Done);
    settle().await;
    assert_eq!(keys(&seen), vec![strs(&["a"])]);
    // Three adds while it is worked on: one more work, after this one.
    for _ in 0..3 {
        q.add("a", Class::UserWaits);
        settle().await;
    }
    assert_eq!(keys(&seen).len(), 1, "four workers, still one work of a");
    tokio::time::advance(10 * SECOND).await;
    settle().await;
    let seen_at: Vec<Duration> = seen.lock().iter().map(|(t, _)| *t).collect();
    assert_eq!(seen_at, vec![Duration::ZERO, 10 * SECOND]);
    tokio::time::advance(20 * SECOND).await;
    settle().await;
    assert_eq!(keys(&seen).len(), 2, "nothing more was added");
}

#[tokio::test(start_paused = true)]
async fn failures_back_off_and_a_change_or_success_ends_the_backoff() {
    let q = Keyed::new("keyed-test-backoff", BACKOFF);
    let fail = Arc::new(Mutex::new(true));
    let f = fail.clone();
    let (seen, _stop, _) = start(&q, Workers::each(1), Duration::ZERO, move |t| {
        assert_eq!(t.key, "a");
        if *f.lock() {
            Outcome::Retry
        } else {
            Outcome::Done
        }
    });
    q.add("a", Class::UserWaits);
    settle().await;
    // Retried after 5 s, then 10 s: the failure count grows.
    tokio::time::advance(5 * SECOND - Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(keys(&seen).len(), 1, "not before the backoff");
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    assert_eq!(keys(&seen).len(), 2);
    assert_eq!(q.failures("a"), 2);
    // A change while it backs off (10 s now): due at once.
    tokio::time::advance(3 * SECOND).await;
    q.add("a", Class::UserWaits);
    settle().await;
    assert_eq!(keys(&seen).len(), 3);
    assert_eq!(seen.lock()[2].0, 8 * SECOND);
    assert_eq!(q.failures("a"), 3);
    // It succeeds at its next retry (20 s later): the count is forgotten
    // and nothing follows.
    *fail.lock() = false;
    tokio::time::advance(20 * SECOND).await;
    settle().await;
    assert_eq!(keys(&seen).len(), 4);
    assert_eq!(q.failures("a"), 0);
    tokio::time::advance(600 * SECOND).await;
    settle().await;
    assert_eq!(keys(&seen).len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_chosen_wait_is_not_a_failure() {
    let q = Keyed::new("keyed-test-wait", BACKOFF);
    let (seen, _stop, _) = start(&q, Workers::each(1), Duration::ZERO, |t| {
        if t.failures == 0 {
            Outcome::Retry
        } else {
            Outcome::RetryAfter(Duration::from_millis(1500))
        }
    });
    q.add("a", Class::UserWaits);
    settle().await;
    tokio::time::advance(5 * SECOND).await;
    settle().await;
    assert_eq!(q.failures("a"), 1);
    for _ in 0..3 {
        tokio::time::advance(Duration::from_millis(1500)).await;
        settle().await;
    }
    let at: Vec<u128> = seen.lock().iter().map(|(t, _)| t.as_millis()).collect();
    assert_eq!(at, vec![0, 5000, 6500, 8000, 9500]);
    assert_eq!(q.failures("a"), 1, "waits kept the count as it was");
}

#[tokio::test(start_paused = true)]
async fn a_burst_settles_once_quiet_and_never_later_than_its_cap() {
    let q = Keyed::settling("keyed-test-settle", BACKOFF, (2 * SECOND, 10 * SECOND));
    let (seen, _stop, _) = start(&q, Workers::each(1), Duration::ZERO, |_| Outcome::Done);
    // Adds a second apart for 15 s: the cap (10 s after the first) ends it.
    for _ in 0..15 {
        q.add_settled("nodes", Class::Background);
        settle().await;
        tokio::time::advance(SECOND).await;
    }
    settle().await;
    let at: Vec<Duration> = seen.lock().iter().map(|(t, _)| *t).collect();
    assert_eq!(at[0], 10 * SECOND, "held to the cap, not a moment longer");
    // The adds after the first work form the next burst; it ends 2 s after
    // its last add. (A sleep, not an advance: the paused clock stops at
    // each timer on the way, so the work sees its own instant.)
    tokio::time::sleep(5 * SECOND).await;
    settle().await;
    let at: Vec<Duration> = seen.lock().iter().map(|(t, _)| *t).collect();
    assert_eq!(at, vec![10 * SECOND, 16 * SECOND]);
    // An add now is not held by a settling one.
    q.add_settled("other", Class::Background);
    q.add("other", Class::UserWaits);
    settle().await;
    assert_eq!(keys(&seen).last(), Some(&strs(&["other"])));
}

#[tokio::test(start_paused = true)]
async fn a_forgotten_key_is_not_worked_on_and_leaves_the_depth() {
    let q = Keyed::new("keyed-test-forget", BACKOFF);
    q.add_at("later", Instant::now() + 5 * SECOND, Class::Background);
    q.add("gone", Class::Background);
    assert_eq!(depth("keyed-test-forget"), Some(1.0), "only due keys count");
    q.forget("gone");
    q.forget("later");
    assert_eq!(depth("keyed-test-forget"), Some(0.0));
    let (seen, _stop, _) = start(&q, Workers::each(1), Duration::ZERO, |_| Outcome::Done);
    tokio::time::advance(10 * SECOND).await;
    settle().await;
    assert!(keys(&seen).is_empty());
}

#[tokio::test(start_paused = true)]
async fn retries_coming_due_count_in_the_depth_while_every_worker_is_busy() {
    let q = Keyed::new("keyed-test-depth", BACKOFF);
    q.add("slow", Class::UserWaits);
    let (_seen, _stop, _) = start(&q, Workers::each(1), 60 * SECOND, |_| Outcome::Done);
    settle().await;
    q.add_at("retry", Instant::now() + 5 * SECOND, Class::Background);
    assert_eq!(depth("keyed-test-depth"), Some(0.0));
    tokio::time::advance(5 * SECOND).await;
    settle().await;
    assert_eq!(
        depth("keyed-test-depth"),
        Some(1.0),
        "due, waiting for a worker"
    );
}

#[tokio::test(start_paused = true)]
async fn batches_take_every_due_key_up_to_the_limit() {
    let q = Keyed::new("keyed-test-batch", BACKOFF);
    for i in 0..250 {
        q.add(&format!("i-{i:03}"), Class::Background);
    }
    let (seen, _stop, _) = start(&q, Workers::batches(100), SECOND, |_| Outcome::Done);
    for _ in 0..4 {
        settle().await;
        tokio::time::advance(SECOND).await;
    }
    let sizes: Vec<usize> = keys(&seen).iter().map(Vec::len).collect();
    assert_eq!(
        sizes,
        vec![100, 100, 50],
        "one work at a time, all keys once"
    );
}

#[tokio::test(start_paused = true)]
async fn work_behind_another_queue_waits_for_it_to_be_idle_or_its_cap() {
    let ahead = Keyed::new("keyed-test-ahead", BACKOFF);
    let behind = Keyed::new("keyed-test-behind", BACKOFF);
    ahead.add("node-1", Class::UserWaits);
    let (_a, _s1, _) = start(&ahead, Workers::each(1), 3 * SECOND, |_| Outcome::Done);
    let workers = Workers::batches(100).behind(&ahead, 60 * SECOND);
    let started = Instant::now();
    let (seen, _s2, _) = start(&behind, workers, Duration::ZERO, |_| Outcome::Done);
    settle().await;
    behind.add("i-1", Class::Background);
    // While the queue ahead keeps busy, the questions gather.
    for i in 2..=3 {
        tokio::time::advance(SECOND).await;
        settle().await;
        behind.add(&format!("i-{i}"), Class::Background);
    }
    assert!(keys(&seen).is_empty());
    tokio::time::advance(SECOND).await;
    settle().await;
    assert_eq!(
        keys(&seen),
        vec![strs(&["i-1", "i-2", "i-3"])],
        "all at once, when idle"
    );
    assert_eq!(seen.lock()[0].0, 3 * SECOND);
    // A queue ahead that never rests holds them at most the cap.
    ahead.add("node-2", Class::UserWaits);
    settle().await;
    let t = Instant::now();
    behind.add("i-4", Class::Background);
    for _ in 0..30 {
        ahead.add("node-2", Class::UserWaits);
        tokio::time::advance(3 * SECOND).await;
        settle().await;
    }
    let (at, last) = seen.lock().last().cloned().expect("a second batch");
    assert_eq!(last, strs(&["i-4"]));
    assert_eq!(
        at,
        (t - started) + 60 * SECOND,
        "asked at the cap, not before"
    );
}

/// `workqueue_depth` of `name` in a scrape.
fn depth(name: &str) -> Option<f64> {
    let prefix = format!("workqueue_depth{{name=\"{name}\"}} ");
    crate::metrics::encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}
