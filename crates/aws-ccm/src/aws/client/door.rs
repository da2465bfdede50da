//! The door's policy, shared by every caller of AWS: throttle, per-attempt
//! timeout, retries with backoff, metrics (steps 1-5 in [`super`]).
//!
//! It stands apart from [`super::AwsClient`] because the credentials
//! provider that assumes cloud.conf's `RoleARN` must call STS through it
//! too, and that provider is part of the SDK clients the `AwsClient` is
//! built from: the door comes first, then the SDK clients, then the client.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use tokio::time::Instant;

use super::api_metrics;
use super::errors::{AttemptFailure, AwsError, ErrorClass};
use super::operations::{Category, Operation, Service};
use super::retry::RetryPolicy;
use super::throttle::{Priority, Throttle};
use super::{CallOptions, ClientOptions, DRY_RUN_ALLOWED_CODE, DRY_RUN_DENIED_CODES};

/// Throttle buckets, retry policy and attempt timeout of one process.
pub struct Door {
    call_timeout: Duration,
    retry: RetryPolicy,
    throttle: Throttle,
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
    /// replaced by their defaults, as [`super::AwsClient::new`] does).
    pub fn new(options: &ClientOptions) -> Arc<Door> {
        let options = options.clone().or_defaults();
        api_metrics::init();
        Arc::new(Door {
            call_timeout: options.call_timeout,
            retry: options.retry_policy(),
            throttle: Throttle::new(options.budget_fraction, options.aimd.clone()),
        })
    }

    /// The current adaptive rate of a category, in requests per second.
    pub fn current_rate(&self, category: Category) -> f64 {
        self.throttle.limiter(category).current_rate()
    }

    /// Calls AWS: `attempt` builds and sends one request of `op` (a
    /// `service` operation) and is called again for every attempt.
    pub async fn send<T, E, F, Fut>(
        &self,
        service: Service,
        op: Operation,
        opts: CallOptions,
        attempt: F,
    ) -> Result<T, AwsError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call(service, op, opts, Priority::Normal, attempt)
            .await
    }

    /// The retry loop: throttle, send, classify, back off.
    pub(crate) async fn call<T, E, F, Fut>(
        &self,
        service: Service,
        op: Operation,
        opts: CallOptions,
        priority: Priority,
        attempt: F,
    ) -> Result<T, AwsError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_as(service, op, opts, priority, false, attempt)
            .await
    }

    /// [`Door::call`]; with `dry_run`, the answers of a `DryRun=true`
    /// request (`DryRunOperation`, `UnauthorizedOperation`) are answers, not
    /// failures: counted under their own outcome, never retried, and not
    /// counted as request errors.
    pub(crate) async fn call_as<T, E, F, Fut>(
        &self,
        service: Service,
        op: Operation,
        opts: CallOptions,
        priority: Priority,
        dry_run: bool,
        attempt: F,
    ) -> Result<T, AwsError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let start = Instant::now();
        if op.service() != service {
            return Err(wrong_service(op, service));
        }
        let limiter = self.throttle.limiter(op.category());
        let mut delays = self.retry.delays();
        let mut attempts: u32 = 0;
        let mut last: Option<AwsError> = None;
        loop {
            if limiter.acquire_with(opts.deadline, priority).await.is_err() {
                return Err(deadline_exceeded(op, start, attempts, last));
            }
            attempts += 1;
            let failure = match self
                .attempt_once(op, opts, dry_run, start, attempts, &attempt)
                .await
            {
                Attempted::Done(result) => return result,
                Attempted::Failed(failure) => failure,
            };
            if failure.class == ErrorClass::Throttling {
                api_metrics::record_throttled(op);
                limiter.on_throttled();
            }
            let retryable = failure.class.is_retryable();
            let error = AwsError::from_attempt(op, failure, attempts);
            if !retryable {
                api_metrics::record_call_error(op);
                return Err(error);
            }
            let Some(delay) = delays.next() else {
                api_metrics::record_call_error(op);
                return Err(error);
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
            tokio::time::sleep(delay).await;
        }
    }

    /// Sends attempt number `attempts` within the per-attempt timeout (cut
    /// to the caller's deadline), with its metrics.
    async fn attempt_once<T, E, F, Fut>(
        &self,
        op: Operation,
        opts: CallOptions,
        dry_run: bool,
        start: Instant,
        attempts: u32,
        attempt: &F,
    ) -> Attempted<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
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
                let verdict = dry_run
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

/// An operation passed to another service's client: a programming error
/// (e.g. an ELB operation passed to `ec2()`), refused since it would be
/// charged to the wrong bucket.
fn wrong_service(op: Operation, service: Service) -> AwsError {
    api_metrics::record_call_error(op);
    AwsError::from_attempt(
        op,
        AttemptFailure::new(
            ErrorClass::Fatal,
            None,
            format!("{op} was passed to the {service} client; this is a bug in aws-ccm"),
        ),
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

/// The metrics outcome of an answer to a `DryRun=true` request, when it is
/// one: EC2 says `DryRunOperation` (HTTP 412) when the caller may make the
/// request and `UnauthorizedOperation` (HTTP 403) when IAM denies it.
fn dry_run_outcome(code: &str) -> Option<&'static str> {
    match code {
        DRY_RUN_ALLOWED_CODE => Some("dry_run_allowed"),
        code if DRY_RUN_DENIED_CODES.contains(&code) => Some("dry_run_denied"),
        _ => None,
    }
}
