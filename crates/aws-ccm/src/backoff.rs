//! The one retry policy of the controllers and the target record's writer:
//! a wait that doubles with each failure in a row, from a first wait to a
//! cap. Each user names its two figures (the Go controller's, where it has
//! them: 5 s to 5 min for a Service, as k8s.io/cloud-provider's
//! `minRetryDelay` and `maxRetryDelay`); the arithmetic is here, once.

use std::time::Duration;

/// Doubling from `first` to `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    cap: Duration,
}

impl Backoff {
    pub(crate) const fn new(first: Duration, cap: Duration) -> Backoff {
        Backoff { first, cap }
    }

    /// The wait after the `n`-th failure in a row (`n` = 1: `first`).
    pub(crate) fn after(&self, n: u32) -> Duration {
        // 2^20 times any first wait a controller uses is past every cap.
        let doublings = n.saturating_sub(1).min(20);
        self.first.saturating_mul(1 << doublings).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_wait_to_the_cap() {
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
        let waits: Vec<u64> = (1..=9).map(|n| b.after(n).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(b.after(0), b.first, "no failure yet counts as the first");
        assert_eq!(b.after(u32::MAX), b.cap);
        let ms = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));
        assert_eq!(ms.after(3), Duration::from_secs(2));
        assert_eq!(ms.after(8), Duration::from_secs(30));
    }
}
