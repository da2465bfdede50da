//! The door's policy, shared by every caller of AWS: throttle, per-attempt
//! timeout, retries with backoff, metrics (steps 1-5 in [`super`]).
//!
//! It stands apart from [`super::AwsClient`] because the credentials
//! provider that assumes cloud.conf's `RoleARN` must call STS through it
//! too, and that provider is part of the SDK clients the `AwsClient` is
//! built from: the door comes first, then the SDK clients, then the client.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::api_metrics;
use super::errors::{AttemptFailure, AwsError, ErrorClass, dry_run_outcome};
use super::operations::{Category, Idempotency, Operation, Service};
use super::retry::RetryPolicy;
use super::throttle::{Priority, Throttle};
use super::{CallOptions, ClientOptions, SdkFuture};

/// Throttle buckets, retry policy and attempt timeout of one process.
pub(crate) struct Door {
    call_timeout: Duration,
    retry: RetryPolicy,
    throttle: Throttle,
    /// Cancelled when this process may no longer change AWS (it lost the
    /// leader Lease): no mutating call is sent after that.
    stop: CancellationToken,
    /// Mutating attempts sent and not yet answered.
    in_flight: tokio::sync::watch::Sender<usize>,
}

/// Counts one mutating attempt in flight while it lives.
struct InFlight<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> InFlight<'a> {
    fn start(counter: &'a tokio::sync::watch::Sender<usize>) -> InFlight<'a> {
        counter.send_modify(|n| *n += 1);
        InFlight(counter)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("call_timeout", &self.call_timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Door {
    /// A door with `options`' budget, timeout and retries (invalid values
    /// replaced by their defaults, as [`crate::aws::Aws::new`] does).
    pub(crate) fn new(options: &ClientOptions) -> Arc<Door> {
        let options = options.clone().or_defaults();
        api_metrics::init();
        Arc::new(Door {
            call_timeout: options.call_timeout,
            retry: options.retry_policy(),
            throttle: Throttle::new(options.budget_fraction, options.aimd.clone()),
            stop: CancellationToken::new(),
            in_flight: tokio::sync::watch::channel(0).0,
        })
    }

    /// From now on every mutating call fails with [`AwsError::Stopped`]
    /// before it is sent, and one waiting for a token or a retry gives up
    /// at once. The manager calls this the moment it cannot prove it still
    /// leads; reads go on (they change nothing).
    pub(crate) fn stop_mutations(&self) {
        self.stop.cancel();
    }

    /// [`Door::stop_mutations`], then waits (at most `bound`) until no
    /// mutating attempt sent before is still unanswered. Returns how many
    /// still are: zero means no change to AWS can land after this returns.
    pub(crate) async fn stop_mutations_and_drain(&self, bound: Duration) -> usize {
        self.stop_mutations();
        let mut watch = self.in_flight.subscribe();
        let drained = tokio::time::timeout(bound, watch.wait_for(|n| *n == 0)).await;
        match drained {
            Ok(Ok(_)) => 0,
            _ => *self.in_flight.borrow(),
        }
    }

    /// Fails a mutating call once mutations are stopped.
    fn check_stopped(&self, op: Operation, attempts: u32) -> Result<(), AwsError> {
        if op.is_mutating() && self.stop.is_cancelled() {
            api_metrics::record_call_error(op);
            return Err(AwsError::Stopped {
                operation: op,
                attempts,
            });
        }
        Ok(())
    }

    /// Sleeps `delay`, cut short (false) when a mutating call is stopped.
    async fn back_off(&self, op: Operation, delay: Duration) -> bool {
        if !op.is_mutating() {
            tokio::time::sleep(delay).await;
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(delay) => true,
            () = self.stop.cancelled() => false,
        }
    }

    /// The current adaptive rate of a category, in requests per second.
    pub(crate) fn current_rate(&self, category: Category) -> f64 {
        self.throttle.limiter(category).current_rate()
    }

    /// Calls AWS: `attempt` builds and sends one request of `op` (a
    /// `service` operation) and is called again for every attempt. The
    /// retry loop: throttle, send, classify, back off. With
    /// [`CallOptions::dry_run`], the answers of a `DryRun=true` request
    /// (`DryRunOperation`, `UnauthorizedOperation`) are answers, not
    /// failures: counted under their own outcome, never retried, and not
    /// counted as request errors.
    pub(crate) async fn call<F: Fn() -> Fut, Fut: SdkFuture>(
        &self,
        service: Service,
        op: Operation,
        opts: CallOptions,
        priority: Priority,
        attempt: F,
    ) -> Result<Fut::Ok, AwsError> {
        let start = Instant::now();
        if op.service() != service {
            return Err(wrong_service(op, service));
        }
        let limiter = self.throttle.limiter(op.category());
        let mut delays = self.retry.delays();
        let mut attempts: u32 = 0;
        let mut last: Option<AwsError> = None;
        let mut answer_lost = false;
        loop {
            self.check_stopped(op, attempts)?;
            if limiter.acquire_with(opts.deadline, priority).await.is_err() {
                return Err(deadline_exceeded(op, start, attempts, last));
            }
            // Counted before the last check: stop_mutations_and_drain
            // either sees this attempt in flight or it sees the stop.
            let in_flight = op.is_mutating().then(|| InFlight::start(&self.in_flight));
            self.check_stopped(op, attempts)?;
            attempts += 1;
            let answered = self.attempt_once(op, opts, start, attempts, &attempt).await;
            drop(in_flight);
            let failure = match answered {
                Attempted::Done(result) => return result,
                Attempted::Failed(failure) => failure,
            };
            if failure.class == ErrorClass::Throttling {
                api_metrics::record_throttled(op);
                limiter.on_throttled();
            }
            let error = judge_failure(op, failure, attempts, &mut answer_lost)?;
            let Some(delay) = delays.next() else {
                api_metrics::record_call_error(op);
                return Err(lost_wrapped(answer_lost, error));
            };
            if opts
                .deadline
                .is_some_and(|deadline| Instant::now() + delay >= deadline)
            {
                return Err(deadline_exceeded(op, start, attempts, Some(error)));
            }
            tracing::debug!(
                operation = %op,
                attempt = attempts,
                class = %error.class(),
                code = error.code().unwrap_or(""),
                delay_ms = delay.as_millis() as u64,
                "retrying AWS call"
            );
            last = Some(error);
            if !self.back_off(op, delay).await {
                return Err(AwsError::Stopped {
                    operation: op,
                    attempts,
                });
            }
        }
    }

    /// Sends attempt number `attempts` within the per-attempt timeout (cut
    /// to the caller's deadline), with its metrics.
    async fn attempt_once<F: Fn() -> Fut, Fut: SdkFuture>(
        &self,
        op: Operation,
        opts: CallOptions,
        start: Instant,
        attempts: u32,
        attempt: &F,
    ) -> Attempted<Fut::Ok> {
        let mut timeout = self.call_timeout;
        let mut cut_by_deadline = false;
        if let Some(deadline) = opts.deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            if left < timeout {
                timeout = left;
                cut_by_deadline = true;
            }
        }
        let sent = Instant::now();
        match tokio::time::timeout(timeout, attempt()).await {
            Ok(Ok(value)) => {
                api_metrics::observe_request_duration(op, sent.elapsed());
                api_metrics::record_attempt(op, "success");
                Attempted::Done(Ok(value))
            }
            Ok(Err(err)) => {
                let failure = AttemptFailure::from_sdk(&err);
                if let Some(status) = failure.http_status {
                    api_metrics::observe_request_duration(op, sent.elapsed());
                    api_metrics::record_response_status(op, status);
                }
                let verdict = opts
                    .dry_run
                    .then(|| failure.code.as_deref().and_then(dry_run_outcome))
                    .flatten();
                if let Some(outcome) = verdict {
                    api_metrics::record_attempt(op, outcome);
                    return Attempted::Done(Err(AwsError::from_attempt(op, failure, attempts)));
                }
                api_metrics::record_attempt(op, failure.class.as_str());
                Attempted::Failed(failure)
            }
            Err(_) => {
                api_metrics::record_attempt(op, "timeout");
                let failure = AttemptFailure::new(
                    ErrorClass::Transient,
                    None,
                    format!("no answer within {timeout:?}"),
                );
                if cut_by_deadline {
                    let last = AwsError::from_attempt(op, failure, attempts);
                    return Attempted::Done(Err(deadline_exceeded(
                        op,
                        start,
                        attempts,
                        Some(last),
                    )));
                }
                Attempted::Failed(failure)
            }
        }
    }
}

/// How one attempt ended.
enum Attempted<T> {
    /// The call is over: a value, or an answer not to retry (a DryRun
    /// verdict, the caller's deadline).
    Done(Result<T, AwsError>),
    /// The attempt failed; the retry policy decides what comes next.
    Failed(AttemptFailure),
}

/// What a failed attempt means: the error to retry on (`Ok`), or the error
/// to give up with, counted as a failed call (`Err`). A mutating call that
/// got no usable answer marks `answer_lost`, which decides what a later
/// duplicate or not-found answer means ([`after_lost_answer`]).
fn judge_failure(
    op: Operation,
    failure: AttemptFailure,
    attempts: u32,
    answer_lost: &mut bool,
) -> Result<AwsError, AwsError> {
    let retryable = failure.class.is_retryable();
    let error = AwsError::from_attempt(op, failure, attempts);
    let lost_now = op.is_mutating() && error.class() == ErrorClass::Transient;
    let error = after_lost_answer(op, *answer_lost, lost_now, error).inspect_err(|_| {
        api_metrics::record_call_error(op);
    })?;
    *answer_lost |= lost_now;
    if !retryable {
        api_metrics::record_call_error(op);
        return Err(error);
    }
    Ok(error)
}

/// What a failed attempt means given the answers lost before it, by the
/// operation's [`Idempotency`]: `Err` ends the call with that verdict,
/// `Ok` hands the error back to the retry policy.
///
/// - after a lost answer, a create's duplicate answer or a removal's
///   not-found answer proves the lost attempt was applied;
/// - a [`Idempotency::ReadBeforeRepeat`] create is never repeated once
///   an answer is lost: the caller reads first.
fn after_lost_answer(
    op: Operation,
    answer_lost: bool,
    lost_now: bool,
    error: AwsError,
) -> Result<AwsError, AwsError> {
    let applied = answer_lost
        && match op.idempotency() {
            Idempotency::Create | Idempotency::ReadBeforeRepeat => error.is_already_exists(),
            Idempotency::Remove => error.is_not_found(),
            Idempotency::ReadOnly | Idempotency::Natural => false,
        };
    if applied {
        tracing::info!(operation = %op, code = error.code().unwrap_or(""), "an answer was lost but AWS had applied the call");
        return Err(AwsError::AnswerLost {
            applied: true,
            last: Box::new(error),
        });
    }
    if lost_now && op.idempotency() == Idempotency::ReadBeforeRepeat {
        return Err(lost_wrapped(true, error));
    }
    Ok(error)
}

/// `error`, marked as possibly applied when an answer was lost.
fn lost_wrapped(answer_lost: bool, error: AwsError) -> AwsError {
    if !answer_lost {
        return error;
    }
    AwsError::AnswerLost {
        applied: false,
        last: Box::new(error),
    }
}

/// An operation passed to another service's client: a programming error
/// (e.g. an ELB operation passed to `ec2()`), refused since it would be
/// charged to the wrong bucket.
fn wrong_service(op: Operation, service: Service) -> AwsError {
    api_metrics::record_call_error(op);
    AwsError::local(
        op,
        ErrorClass::Fatal,
        format!("{op} was passed to the {service} client; this is a bug in aws-ccm"),
        0,
    )
}

/// The call ran out of the caller's time after `attempts` attempts.
fn deadline_exceeded(
    op: Operation,
    start: Instant,
    attempts: u32,
    last: Option<AwsError>,
) -> AwsError {
    api_metrics::record_call_error(op);
    AwsError::DeadlineExceeded {
        operation: op,
        attempts,
        elapsed: start.elapsed(),
        last: last.map(Box::new),
    }
}

#[cfg(test)]
mod tests {
    use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
    use aws_smithy_runtime_api::client::result::SdkError;

    use super::*;

    fn answer(op: Operation, class: ErrorClass, code: &str) -> AwsError {
        AwsError::from_attempt(op, AttemptFailure::new(class, Some(code), "answer"), 2)
    }

    #[test]
    fn a_duplicate_after_a_lost_answer_means_the_create_was_applied() {
        let dup = || {
            answer(
                Operation::Ec2CreateSecurityGroup,
                ErrorClass::Fatal,
                "InvalidGroup.Duplicate",
            )
        };
        let verdict = after_lost_answer(Operation::Ec2CreateSecurityGroup, true, false, dup())
            .expect_err("a verdict");
        assert!(verdict.applied_before_answer_lost(), "{verdict}");
        assert!(verdict.is_already_exists());
        // Without a lost answer a duplicate is just an answer.
        let plain = after_lost_answer(Operation::Ec2CreateSecurityGroup, false, false, dup())
            .expect("no verdict");
        assert!(!plain.may_have_been_applied());
    }

    #[test]
    fn a_not_found_after_a_lost_answer_means_the_removal_was_applied() {
        let gone = answer(
            Operation::Ec2DeleteSecurityGroup,
            ErrorClass::NotFound,
            "InvalidGroup.NotFound",
        );
        let verdict = after_lost_answer(Operation::Ec2DeleteSecurityGroup, true, false, gone)
            .expect_err("a verdict");
        assert!(verdict.applied_before_answer_lost() && verdict.is_not_found());
        // A natural operation's not-found stays a plain answer.
        let natural = answer(
            Operation::Elbv2RegisterTargets,
            ErrorClass::NotFound,
            "TargetGroupNotFound",
        );
        assert!(after_lost_answer(Operation::Elbv2RegisterTargets, true, false, natural).is_ok());
    }

    #[test]
    fn a_read_before_recreate_create_is_not_repeated_after_a_lost_answer() {
        let reset = answer(
            Operation::Elbv2CreateLoadBalancer,
            ErrorClass::Transient,
            "InternalError",
        );
        let verdict = after_lost_answer(Operation::Elbv2CreateLoadBalancer, false, true, reset)
            .expect_err("no repeat");
        assert!(verdict.may_have_been_applied() && !verdict.applied_before_answer_lost());
        // A create AWS refuses to duplicate is repeated.
        let reset = answer(
            Operation::Ec2CreateSecurityGroup,
            ErrorClass::Transient,
            "InternalError",
        );
        assert!(after_lost_answer(Operation::Ec2CreateSecurityGroup, false, true, reset).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn no_mutating_call_is_sent_once_mutations_are_stopped() {
        let door = Door::new(&ClientOptions::default());
        door.stop_mutations();
        let sent = std::sync::atomic::AtomicU32::new(0);
        let attempt = || {
            sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Ok::<
                    (),
                    SdkError<aws_sdk_ec2::operation::create_route::CreateRouteError, HttpResponse>,
                >(())
            }
        };
        let err = door
            .call(
                Service::Ec2,
                Operation::Ec2CreateRoute,
                CallOptions::default(),
                Priority::Normal,
                attempt,
            )
            .await
            .expect_err("stopped");
        assert!(matches!(err, AwsError::Stopped { .. }), "{err}");
        door.call(
            Service::Ec2,
            Operation::Ec2DescribeRouteTables,
            CallOptions::default(),
            Priority::Normal,
            attempt,
        )
        .await
        .expect("reads go on");
        assert_eq!(sent.load(std::sync::atomic::Ordering::SeqCst), 1);
    }
}
