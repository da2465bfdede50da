use super::*;

/// The sample of `metric` for queue `name` in the scrape.
fn sample(metric: &str, name: &str) -> Option<f64> {
    let prefix = format!("{metric}{{name=\"{name}\"}} ");
    crate::metrics::encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
}

#[test]
fn a_key_is_added_once_until_taken_and_its_work_is_observed() {
    let q = Queue::new("test-once");
    // Served from the start, as client-go's.
    assert_eq!(sample("workqueue_adds_total", "test-once"), Some(0.0));
    assert_eq!(
        sample("workqueue_unfinished_work_seconds", "test-once"),
        Some(0.0)
    );
    q.due("a");
    q.due("a");
    q.due("b");
    assert_eq!(sample("workqueue_adds_total", "test-once"), Some(2.0));
    assert_eq!(sample("workqueue_depth", "test-once"), Some(2.0));
    let work = q.take("a");
    assert_eq!(sample("workqueue_depth", "test-once"), Some(1.0));
    assert_eq!(
        sample("workqueue_queue_duration_seconds_count", "test-once"),
        Some(1.0)
    );
    assert!(sample("workqueue_longest_running_processor_seconds", "test-once").is_some());
    assert_eq!(
        sample("workqueue_work_duration_seconds_count", "test-once"),
        Some(0.0),
        "no work observed yet"
    );
    drop(work);
    assert_eq!(
        sample("workqueue_work_duration_seconds_count", "test-once"),
        Some(1.0)
    );
    assert_eq!(
        sample("workqueue_longest_running_processor_seconds", "test-once"),
        Some(0.0)
    );
    q.retry();
    assert_eq!(sample("workqueue_retries_total", "test-once"), Some(1.0));
    // Taken again without being due: counted as an add.
    drop(q.take("a"));
    assert_eq!(sample("workqueue_adds_total", "test-once"), Some(3.0));
    // A key the scheduler no longer holds leaves the depth.
    assert_eq!(sample("workqueue_depth", "test-once"), Some(1.0));
    q.forget("b");
    assert_eq!(sample("workqueue_depth", "test-once"), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn idle_waits_for_every_due_key_and_every_work_to_finish() {
    use futures::FutureExt;
    let q = Queue::new("test-idle");
    assert!(q.idle().now_or_never().is_some(), "an empty queue is idle");
    q.due("a");
    q.due("b");
    let idle = q.idle();
    futures::pin_mut!(idle);
    assert!(idle.as_mut().now_or_never().is_none(), "two keys due");
    let work = q.take("a");
    q.forget("b");
    assert!(
        idle.as_mut().now_or_never().is_none(),
        "b forgotten, a still worked on"
    );
    q.forget("a");
    assert!(
        idle.as_mut().now_or_never().is_none(),
        "forget leaves work alone"
    );
    drop(work);
    assert!(
        idle.now_or_never().is_some(),
        "nothing due, nothing worked on"
    );
    assert_eq!(sample("workqueue_depth", "test-idle"), Some(0.0));
}
