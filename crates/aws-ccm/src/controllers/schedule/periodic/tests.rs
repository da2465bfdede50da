use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::*;

const SECOND: Duration = Duration::from_secs(1);

/// The sample of `metric` for queue `name` in a scrape.
fn sample(metric: &str, name: &str) -> Option<f64> {
    let prefix = format!("{metric}{{name=\"{name}\"}} ");
    crate::metrics::encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

/// When each pass began, from `t0`.
type Starts = Arc<Mutex<Vec<Duration>>>;

/// Runs `runner` in a task; each pass records its start and answers what
/// `outcome` says for its number (1 = the first).
fn start(
    runner: Periodic,
    outcome: impl Fn(usize) -> Pass + Send + Sync + 'static,
) -> (Starts, CancellationToken) {
    let starts: Starts = Arc::default();
    let stop = CancellationToken::new();
    let (t0, s, st, outcome) = (
        Instant::now(),
        starts.clone(),
        stop.clone(),
        Arc::new(outcome),
    );
    tokio::spawn(async move {
        runner
            .run(&st, move || {
                let n = begun(&s, t0);
                std::future::ready(outcome(n))
            })
            .await
    });
    (starts, stop)
}

/// Records that a pass began now; its number (1 = the first).
fn begun(starts: &Starts, t0: Instant) -> usize {
    let mut s = starts.lock();
    s.push(t0.elapsed());
    s.len()
}

fn secs(list: &[f64]) -> Vec<Duration> {
    list.iter().map(|s| Duration::from_secs_f64(*s)).collect()
}

#[tokio::test(start_paused = true)]
async fn a_pass_runs_at_start_then_a_period_after_the_last_began_and_none_after_stop() {
    let stop = CancellationToken::new();
    let t0 = Instant::now();
    let runner =
        Periodic::new("test-periodic-period", Backoff::new(SECOND, SECOND)).every(5 * SECOND);
    let starts: Starts = Arc::default();
    let (s, stopper) = (starts.clone(), stop.clone());
    runner
        .run(&stop, move || {
            let n = begun(&s, t0);
            let stopper = stopper.clone();
            async move {
                // A pass that takes 7 s: the next starts at once, not in a
                // burst.
                if n == 2 {
                    tokio::time::sleep(7 * SECOND).await;
                }
                if n == 4 {
                    stopper.cancel();
                }
                Pass::Done
            }
        })
        .await;
    let starts = starts.lock().clone();
    assert_eq!(starts, secs(&[0.0, 5.0, 12.0, 17.0]));
    assert_eq!(
        sample(
            "workqueue_work_duration_seconds_count",
            "test-periodic-period"
        ),
        Some(4.0),
        "each pass is one work of the set's key"
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_pass_runs_again_by_the_backoff_never_later_than_the_period() {
    let name = "test-periodic-retry";
    let runner = Periodic::new(name, Backoff::new(SECOND, 300 * SECOND)).every(10 * SECOND);
    // Five failures in a row, then done.
    let (starts, stop) = start(runner, |n| if n <= 5 { Pass::Retry } else { Pass::Done });
    tokio::time::sleep(36 * SECOND).await;
    // 1, 2, 4 s after each failure; then 8 s, and the period (10 s) once
    // the backoff passes it; a done pass forgets the count.
    assert_eq!(
        *starts.lock(),
        secs(&[0.0, 1.0, 3.0, 7.0, 15.0, 25.0, 35.0])
    );
    assert_eq!(sample("workqueue_retries_total", name), Some(5.0));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn without_a_period_only_retries_and_changes_bring_a_pass() {
    let runner = Periodic::new("test-periodic-no-period", Backoff::new(SECOND, 4 * SECOND));
    let (starts, stop) = start(runner, |n| if n <= 3 { Pass::Retry } else { Pass::Done });
    tokio::time::sleep(600 * SECOND).await;
    // 1, 2, 4 s after each failure, then nothing more.
    assert_eq!(*starts.lock(), secs(&[0.0, 1.0, 3.0, 7.0]));
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_change_of_the_value_runs_a_pass_once_it_settles_and_other_changes_none() {
    let name = "test-periodic-change";
    let (tx, rx) = watch::channel(0u64);
    let value = Arc::new(AtomicU64::new(0));
    let v = value.clone();
    let quiet = Duration::from_millis(500);
    let runner = Periodic::new(name, Backoff::new(SECOND, SECOND))
        .every(3600 * SECOND)
        .on_change(rx, (quiet, 3 * SECOND), move || v.load(Ordering::SeqCst));
    let (starts, stop) = start(runner, |_| Pass::Done);
    let bump = |tx: &watch::Sender<u64>| tx.send_modify(|g| *g += 1);

    // The informer moves without the value moving (a heartbeat): no pass.
    tokio::time::sleep(SECOND).await;
    bump(&tx);
    tokio::time::sleep(SECOND).await;
    assert_eq!(*starts.lock(), secs(&[0.0]));

    // At 2 s the value changes: held while quiet is not reached, counted
    // in the depth meanwhile, then one pass.
    value.store(1, Ordering::SeqCst);
    bump(&tx);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(sample("workqueue_depth", name), Some(1.0), "held to settle");
    tokio::time::sleep(SECOND).await;
    assert_eq!(*starts.lock(), secs(&[0.0, 2.5]));
    assert_eq!(sample("workqueue_depth", name), Some(0.0));

    // Changes every 400 ms from 3.6 s to 13.2 s: never quiet, so one pass
    // 3 s after the first change since the last pass, and one once they
    // stop and the value is quiet.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..25u64 {
        value.store(10 + i, Ordering::SeqCst);
        bump(&tx);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    tokio::time::sleep(SECOND).await;
    let got: Vec<u128> = starts.lock().iter().map(Duration::as_millis).collect();
    assert_eq!(got, [0, 2500, 6600, 9800, 13000, 13700]);
    stop.cancel();
}

#[tokio::test(start_paused = true)]
async fn a_change_hastens_a_retry_and_stop_cuts_a_pass_short() {
    let (tx, rx) = watch::channel(0u64);
    let value = Arc::new(AtomicU64::new(0));
    let v = value.clone();
    let runner = Periodic::new("test-periodic-stop", Backoff::new(60 * SECOND, 60 * SECOND))
        .on_change(rx, (Duration::ZERO, Duration::ZERO), move || {
            v.load(Ordering::SeqCst)
        });
    let starts: Starts = Arc::default();
    let stop = CancellationToken::new();
    let (t0, s, st) = (Instant::now(), starts.clone(), stop.clone());
    let ended = tokio::spawn(async move {
        runner
            .run(&st, move || {
                let n = begun(&s, t0);
                async move {
                    if n == 2 {
                        // Never ends by itself.
                        std::future::pending::<()>().await;
                    }
                    Pass::Retry
                }
            })
            .await;
        t0.elapsed()
    });
    // The first pass failed: its retry is 60 s away, but the value
    // changes at 5 s and the pass runs then.
    tokio::time::sleep(5 * SECOND).await;
    value.store(1, Ordering::SeqCst);
    tx.send_modify(|g| *g += 1);
    tokio::time::sleep(5 * SECOND).await;
    assert_eq!(*starts.lock(), secs(&[0.0, 5.0]));
    stop.cancel();
    let ended = ended.await.expect("the runner ends");
    assert_eq!(ended, 10 * SECOND, "stopped inside its pass");
}
