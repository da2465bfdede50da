//! Backoff between attempts: exponential, capped, with full jitter.
//!
//! backon builds the exponential sequence; its own jitter adds up to one more
//! delay on top (`d + rand·d`), which keeps retries of a throttled burst
//! bunched together. "Full jitter" (`rand·d`, from AWS's "Exponential Backoff
//! And Jitter") spreads them over the whole window, which is what relieves a
//! shared token bucket, so the jitter is applied here instead.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use rand::Rng;

/// Retry policy of one call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RetryPolicy {
    /// Total attempts, the first included. 1 disables retries.
    pub(crate) max_attempts: u32,
    /// Upper bound of the first backoff window.
    pub(crate) base_delay: Duration,
    /// Upper bound of any backoff window.
    pub(crate) max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            // With a 20 s cap this spans about a minute of retrying, long
            // enough to ride out a throttling episode; the caller's deadline
            // cuts it shorter where that matters.
            max_attempts: 8,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// The backoff windows (before jitter) between attempts:
    /// `max_attempts - 1` of them.
    fn windows(&self) -> impl Iterator<Item = Duration> + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.base_delay)
            .with_max_delay(self.max_delay)
            .with_factor(2.0)
            .with_max_times(self.max_attempts.saturating_sub(1) as usize)
            .build()
    }

    /// A jittered schedule of delays: uniform in `[0, window]` for each window.
    pub(crate) fn delays(&self) -> impl Iterator<Item = Duration> + use<> {
        self.windows().map(full_jitter)
    }
}

/// A uniformly random duration in `[0, window]`.
fn full_jitter(window: Duration) -> Duration {
    window.mul_f64(rand::rng().random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_grow_exponentially_to_the_cap_and_stop_at_max_attempts() {
        let policy = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        };
        let windows: Vec<_> = policy.windows().collect();
        assert_eq!(windows.len(), 9, "one window between each pair of attempts");
        // backon multiplies by an f32 factor: compare at millisecond precision.
        let millis: Vec<u128> = windows.iter().map(Duration::as_millis).collect();
        assert_eq!(
            millis,
            vec![100, 200, 400, 800, 1600, 2000, 2000, 2000, 2000]
        );
    }

    #[test]
    fn delays_stay_within_their_windows_and_are_spread() {
        let policy = RetryPolicy::default();
        let mut first_delays = Vec::new();
        for _ in 0..200 {
            for (delay, window) in policy.delays().zip(policy.windows()) {
                assert!(delay <= window, "{delay:?} > {window:?}");
            }
            first_delays.push(policy.delays().next().unwrap_or_default());
        }
        // Full jitter: the first delay covers its window, not just its top.
        let below_half = first_delays
            .iter()
            .filter(|d| **d < Duration::from_millis(100))
            .count();
        assert!(
            (40..=160).contains(&below_half),
            "{below_half} of 200 below half the window"
        );
    }

    #[test]
    fn one_attempt_means_no_retry() {
        let policy = RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        };
        assert_eq!(policy.windows().count(), 0);
    }
}
