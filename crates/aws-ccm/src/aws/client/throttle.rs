//! Client-side rate limiting: one token bucket per AWS throttle category, plus
//! an adaptive (AIMD) rate on top of it.
//!
//! ## Design
//!
//! Each category has two limits that a caller passes in turn:
//!
//! 1. A `governor` GCRA limiter sized like AWS's bucket for the category,
//!    scaled by the budget fraction. It is the ceiling: it allows AWS's burst
//!    less one token ([`TRANSIT_RESERVE`]) and never more than the
//!    configured share of the refill rate.
//! 2. An adaptive pacer. When AWS throttles a request anyway (other clients in
//!    the account share the bucket), the category's rate is halved (down to a
//!    floor), then grows back linearly to the ceiling. While it is below the
//!    ceiling, grants are spaced at least `1 / rate` apart, with no burst.
//!
//! governor's quota is fixed when a limiter is built. Rebuilding it on every
//! rate change would drop its state (a fresh limiter starts with a full burst,
//! exactly when AWS's bucket is known to be empty) and would race with callers
//! already waiting on the old one. Pacing on top keeps governor's exact
//! bucket for the ceiling and makes the adaptive part a few lines of
//! arithmetic under a lock.
//!
//! Waiters queue on a fair (FIFO) async mutex, so only the head of the queue
//! polls governor: thousands of waiting callers cost one timer, not thousands
//! of wake-ups per token, and the first to ask is the first served. Callers
//! wait for a token and never fail for lack of one; only their own deadline
//! bounds the wait.
//!
//! One exception to FIFO: [`Priority::Shared`] requests (a coalesced
//! `DescribeInstances` serving hundreds of callers, the cluster sweep) skip
//! the queue and take the next token. Behind a backlog of single reads a
//! batch would otherwise make every one of its callers wait for the whole
//! backlog; letting it through costs the backlog one token.
//!
//! governor runs on a clock built from `tokio::time::Instant`, so tests with a
//! paused Tokio clock drive the limiter deterministically.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::api_metrics;
use super::operations::Category;

/// A governor clock that follows Tokio's (pausable) clock.
#[derive(Clone, Debug)]
struct TokioClock {
    origin: Instant,
}

impl Clock for TokioClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(Instant::now().saturating_duration_since(self.origin))
    }
}

/// Tokens of each bucket this client leaves unused, for the difference
/// between when a call is granted here and when AWS counts it.
const TRANSIT_RESERVE: u32 = 1;

type Gcra = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>;

/// How the adaptive rate reacts to throttling.
#[derive(Clone, Debug, PartialEq)]
pub struct AimdConfig {
    /// Factor applied to the rate on throttling (multiplicative decrease).
    decrease_factor: f64,
    /// Lowest rate, as a fraction of the ceiling.
    floor_fraction: f64,
    /// Additive increase, as a fraction of the ceiling regained per second.
    recovery_per_sec: f64,
    /// Throttling answers within this time of the last decrease do not
    /// decrease again: they are the same burst seen by several in-flight
    /// requests, and halving once per answer would collapse the rate to the
    /// floor on a single overload.
    decrease_cooldown: Duration,
}

impl Default for AimdConfig {
    fn default() -> AimdConfig {
        AimdConfig {
            decrease_factor: 0.5,
            floor_fraction: 0.05,
            recovery_per_sec: 0.05,
            decrease_cooldown: Duration::from_secs(1),
        }
    }
}

/// The caller's deadline passed while it waited for a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenWaitTimedOut {
    waited: Duration,
}

#[derive(Debug)]
struct Adaptive {
    rate: f64,
    last_update: Instant,
    last_decrease: Option<Instant>,
}

/// Whose turn a request takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Priority {
    /// First come, first served.
    #[default]
    Normal,
    /// One request serving many callers: takes the next token ahead of the
    /// queue.
    Shared,
}

/// The limiter of one throttle category.
pub struct CategoryLimiter {
    category: Category,
    ceiling: f64,
    #[cfg(test)]
    burst: u32,
    floor: f64,
    aimd: AimdConfig,
    gcra: Gcra,
    clock: TokioClock,
    /// FIFO order of normal waiters; guards nothing else.
    queue: tokio::sync::Mutex<()>,
    /// When the last token was granted (for the adaptive pacing).
    last_grant: Mutex<Option<Instant>>,
    /// Shared-priority requests waiting; the head of the normal queue lets
    /// them go first.
    shared_waiting: AtomicUsize,
    shared_done: Notify,
    adaptive: Mutex<Adaptive>,
}

impl CategoryLimiter {
    /// Sizes the category's bucket at `budget_fraction` of AWS's.
    pub fn new(category: Category, budget_fraction: f64, aimd: AimdConfig) -> CategoryLimiter {
        let bucket = category.aws_bucket();
        let ceiling = (bucket.refill_per_sec * budget_fraction).max(f64::MIN_POSITIVE);
        // A burst below one request would block forever; round so that a
        // small fraction of a small bucket still allows one call. One token
        // is kept back (TRANSIT_RESERVE): AWS counts a call when it
        // arrives, not when it is granted here, and a burst's first call
        // arriving late (a new connection) starts AWS's refill later than
        // this bucket's, so a later call granted here on time arrives at an
        // empty bucket and is throttled.
        let scaled = ((bucket.burst * budget_fraction).round() as u32).max(1);
        let burst = scaled.saturating_sub(TRANSIT_RESERVE).max(1);
        let period = Duration::from_secs_f64(1.0 / ceiling);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        let clock = TokioClock {
            origin: Instant::now(),
        };
        let gcra = RateLimiter::direct_with_clock(quota, clock.clone());
        let floor = (ceiling * aimd.floor_fraction).min(ceiling);
        api_metrics::set_rate(category, ceiling);
        CategoryLimiter {
            category,
            ceiling,
            #[cfg(test)]
            burst,
            floor,
            aimd,
            gcra,
            clock,
            queue: tokio::sync::Mutex::new(()),
            last_grant: Mutex::new(None),
            shared_waiting: AtomicUsize::new(0),
            shared_done: Notify::new(),
            adaptive: Mutex::new(Adaptive {
                rate: ceiling,
                last_update: Instant::now(),
                last_decrease: None,
            }),
        }
    }

    /// Configured burst.
    #[cfg(test)]
    fn burst(&self) -> u32 {
        self.burst
    }

    /// The current adaptive rate in requests per second (recovery applied).
    pub(crate) fn current_rate(&self) -> f64 {
        let mut adaptive = self.adaptive.lock();
        self.recover(&mut adaptive, Instant::now());
        adaptive.rate
    }

    fn recover(&self, adaptive: &mut Adaptive, now: Instant) {
        let elapsed = now
            .saturating_duration_since(adaptive.last_update)
            .as_secs_f64();
        adaptive.last_update = now;
        if adaptive.rate < self.ceiling {
            let grown = adaptive.rate + self.ceiling * self.aimd.recovery_per_sec * elapsed;
            adaptive.rate = grown.min(self.ceiling);
            api_metrics::set_rate(self.category, adaptive.rate);
        }
    }

    /// AWS throttled a request of this category: lower the rate.
    pub(crate) fn on_throttled(&self) {
        let now = Instant::now();
        let mut adaptive = self.adaptive.lock();
        self.recover(&mut adaptive, now);
        if adaptive
            .last_decrease
            .is_some_and(|at| now.saturating_duration_since(at) < self.aimd.decrease_cooldown)
        {
            return;
        }
        adaptive.rate = (adaptive.rate * self.aimd.decrease_factor).max(self.floor);
        adaptive.last_decrease = Some(now);
        api_metrics::set_rate(self.category, adaptive.rate);
        tracing::warn!(
            category = %self.category,
            rate_per_sec = adaptive.rate,
            ceiling_per_sec = self.ceiling,
            "AWS throttled a request; lowering the client-side rate for this category"
        );
    }

    /// Waits for a token. Returns how long the caller waited, or
    /// [`TokenWaitTimedOut`] if `deadline` passed first (no token is spent
    /// then).
    pub async fn acquire(&self, deadline: Option<Instant>) -> Result<Duration, TokenWaitTimedOut> {
        self.acquire_with(deadline, Priority::Normal).await
    }

    /// [`CategoryLimiter::acquire`] with a priority.
    pub(crate) async fn acquire_with(
        &self,
        deadline: Option<Instant>,
        priority: Priority,
    ) -> Result<Duration, TokenWaitTimedOut> {
        let start = Instant::now();
        let result = match priority {
            Priority::Normal => bounded(deadline, self.wait_in_queue()).await,
            Priority::Shared => {
                self.shared_waiting.fetch_add(1, Ordering::SeqCst);
                let result = bounded(deadline, self.wait_for_token()).await;
                self.shared_waiting.fetch_sub(1, Ordering::SeqCst);
                self.shared_done.notify_waiters();
                result
            }
        };
        let waited = start.elapsed();
        api_metrics::observe_token_wait(self.category, waited);
        result
            .map(|()| waited)
            .map_err(|()| TokenWaitTimedOut { waited })
    }

    async fn wait_in_queue(&self) {
        let _turn = self.queue.lock().await;
        // Let shared-priority requests go first.
        loop {
            let done = self.shared_done.notified();
            if self.shared_waiting.load(Ordering::SeqCst) == 0 {
                break;
            }
            done.await;
        }
        self.wait_for_token().await;
    }

    async fn wait_for_token(&self) {
        // Adaptive pacing: only while the rate is below the ceiling.
        loop {
            let rate = self.current_rate();
            let last = *self.last_grant.lock();
            let Some(last) = last else { break };
            if rate >= self.ceiling {
                break;
            }
            let next = last + Duration::from_secs_f64(1.0 / rate);
            if next <= Instant::now() {
                break;
            }
            // Re-check after the sleep: the rate may have recovered meanwhile.
            tokio::time::sleep_until(next).await;
        }
        // The AWS-shaped ceiling.
        loop {
            match self.gcra.check() {
                Ok(()) => break,
                Err(not_until) => {
                    let wait = not_until.wait_time_from(self.clock.now());
                    // governor rounds to nanoseconds; a zero wait would spin.
                    tokio::time::sleep(wait.max(Duration::from_micros(50))).await;
                }
            }
        }
        *self.last_grant.lock() = Some(Instant::now());
    }
}

/// Runs `wait` until `deadline`, if any.
async fn bounded(
    deadline: Option<Instant>,
    wait: impl std::future::Future<Output = ()>,
) -> Result<(), ()> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, wait)
            .await
            .map_err(|_| ()),
        None => {
            wait.await;
            Ok(())
        }
    }
}

/// All categories' limiters.
pub(crate) struct Throttle {
    limiters: Vec<CategoryLimiter>,
}

impl Throttle {
    pub(crate) fn new(budget_fraction: f64, aimd: AimdConfig) -> Throttle {
        Throttle {
            limiters: Category::ALL
                .iter()
                .map(|&category| CategoryLimiter::new(category, budget_fraction, aimd.clone()))
                .collect(),
        }
    }

    pub(crate) fn limiter(&self, category: Category) -> &CategoryLimiter {
        let index = Category::ALL
            .iter()
            .position(|&c| c == category)
            .unwrap_or(0);
        &self.limiters[index]
    }
}

#[cfg(test)]
impl CategoryLimiter {
    /// Configured ceiling in requests per second.
    fn ceiling(&self) -> f64 {
        self.ceiling
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_recovery() -> AimdConfig {
        AimdConfig {
            recovery_per_sec: 0.0,
            ..AimdConfig::default()
        }
    }

    #[test]
    fn buckets_are_scaled_by_the_budget_fraction() {
        // Half the bucket, less the one token kept for transit time.
        let limiter = CategoryLimiter::new(Category::Ec2NonMutating, 0.5, AimdConfig::default());
        assert_eq!(limiter.burst(), 49);
        assert!((limiter.ceiling() - 10.0).abs() < 1e-9);
        let slow = CategoryLimiter::new(Category::ElbCreateAndSubnets, 0.5, AimdConfig::default());
        assert_eq!(slow.burst(), 4);
        assert!((slow.ceiling() - 0.1).abs() < 1e-9);
        // A tiny fraction still allows one request.
        let tiny = CategoryLimiter::new(Category::ElbCreateAndSubnets, 0.01, AimdConfig::default());
        assert_eq!(tiny.burst(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn burst_is_immediate_then_refill_rate_applies() {
        let limiter = CategoryLimiter::new(Category::Ec2Mutating, 0.5, AimdConfig::default());
        // 25 burst less the transit reserve, 2.5/s.
        let start = Instant::now();
        for _ in 0..24 {
            limiter.acquire(None).await.expect("no deadline");
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst must not wait");
        for _ in 0..10 {
            limiter.acquire(None).await.expect("no deadline");
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (3.9..=4.1).contains(&elapsed),
            "10 tokens at 2.5/s took {elapsed}s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_time_out_at_their_deadline_without_spending_a_token() {
        let limiter =
            CategoryLimiter::new(Category::ElbCreateAndSubnets, 0.5, AimdConfig::default());
        for _ in 0..limiter.burst() {
            limiter.acquire(None).await.expect("burst");
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let err = limiter
            .acquire(Some(deadline))
            .await
            .expect_err("0.1/s cannot serve within 2 s");
        assert_eq!(err.waited, Duration::from_secs(2));
        // The next token is still due 10 s after the burst, not 20 s.
        let start = Instant::now();
        limiter.acquire(None).await.expect("no deadline");
        assert!(
            start.elapsed() <= Duration::from_secs(8),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn throttling_halves_the_rate_once_per_cooldown_down_to_the_floor() {
        let limiter = CategoryLimiter::new(Category::Ec2NonMutating, 1.0, no_recovery());
        assert_eq!(limiter.current_rate(), 20.0);
        limiter.on_throttled();
        limiter.on_throttled(); // same burst: ignored
        assert_eq!(limiter.current_rate(), 10.0);
        for _ in 0..10 {
            tokio::time::advance(Duration::from_millis(1100)).await;
            limiter.on_throttled();
        }
        assert_eq!(limiter.current_rate(), 1.0, "floor is 5 % of the ceiling");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_recovers_additively_to_the_ceiling() {
        let limiter = CategoryLimiter::new(Category::Ec2NonMutating, 1.0, AimdConfig::default());
        limiter.on_throttled();
        assert_eq!(limiter.current_rate(), 10.0);
        // +5 % of 20/s per second = +1/s per second.
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!((limiter.current_rate() - 14.0).abs() < 1e-6);
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(limiter.current_rate(), 20.0, "never above the ceiling");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lowered_rate_paces_callers_without_burst() {
        let limiter = CategoryLimiter::new(Category::Ec2NonMutating, 1.0, no_recovery());
        limiter.acquire(None).await.expect("first");
        limiter.on_throttled();
        limiter.on_throttled();
        tokio::time::advance(Duration::from_millis(1100)).await;
        limiter.on_throttled();
        limiter.on_throttled();
        let rate = limiter.current_rate();
        assert_eq!(rate, 5.0);
        // The governor bucket is nearly full, yet grants are 200 ms apart.
        let start = Instant::now();
        for _ in 0..10 {
            limiter.acquire(None).await.expect("no deadline");
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!(
            (1.7..=2.1).contains(&elapsed),
            "10 grants at 5/s took {elapsed}s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_request_skips_the_queue() {
        let limiter = std::sync::Arc::new(CategoryLimiter::new(
            Category::ElbMutating,
            0.5,
            AimdConfig::default(),
        ));
        for _ in 0..limiter.burst() {
            limiter.acquire(None).await.expect("burst");
        }
        // 20 normal waiters queue up (1.5/s: 13 s of backlog)...
        let mut backlog = Vec::new();
        for _ in 0..20 {
            let limiter = limiter.clone();
            backlog.push(tokio::spawn(async move { limiter.acquire(None).await }));
            tokio::task::yield_now().await;
        }
        // ...and a shared request arriving last waits about one token.
        let waited = limiter
            .acquire_with(None, Priority::Shared)
            .await
            .expect("no deadline");
        assert!(
            waited <= Duration::from_millis(1400),
            "shared request waited {waited:?}"
        );
        for task in backlog {
            task.await.expect("task").expect("no deadline");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_in_arrival_order() {
        let limiter = std::sync::Arc::new(CategoryLimiter::new(
            Category::ElbMutating,
            0.5,
            AimdConfig::default(),
        ));
        for _ in 0..limiter.burst() {
            limiter.acquire(None).await.expect("burst");
        }
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let limiter = limiter.clone();
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                limiter.acquire(None).await.expect("no deadline");
                order.lock().push(i);
            }));
            // Let each task enqueue before the next.
            tokio::task::yield_now().await;
        }
        for task in tasks {
            task.await.expect("task");
        }
        assert_eq!(*order.lock(), vec![0, 1, 2, 3, 4]);
    }
}
