//! The one door to AWS.
//!
//! Every AWS request of the project goes through [`AwsClient`], in this order:
//!
//! 1. **Throttle**: wait for a token of the operation's AWS throttle category
//!    (sized at a fraction of AWS's bucket, adapting down on throttling).
//! 2. **Send** with a per-attempt timeout.
//! 3. **Classify** the answer; on throttling lower the category's rate.
//! 4. **Retry** throttling and transient failures with capped exponential
//!    backoff and full jitter, within the attempt limit and the caller's
//!    deadline. Each retry takes a token again: a retry is a request too.
//! 5. **Metrics** for every attempt and every call.
//!
//! Nothing else lives here: what the CCM keeps of AWS between reads is kept
//! by the domain module that invalidates it (the instance lookups, sweep and
//! zones in `aws/instances/cache.rs`, the security-group view in
//! `aws/security_groups/view.rs`, the DryRun verdicts in `aws/permissions.rs`),
//! and [`crate::aws::Aws`] puts them beside this door. The generic
//! coalescing (`coalesce.rs`: batching and single flight) is here; what it
//! batches is theirs.
//!
//! The SDK clients must be built with SDK retries disabled and without an
//! operation timeout: this layer owns both, and SDK retries underneath would
//! multiply every attempt made here.

mod api_metrics;
pub mod clients;
pub(crate) mod coalesce;
pub(crate) mod consistency;
pub(crate) mod door;
pub(crate) mod errors;
pub(crate) mod operations;
pub(crate) mod pages;
pub(crate) mod retry;
#[cfg(test)]
pub(crate) mod test_stub;
pub mod throttle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use aws_sdk_ec2::Client as Ec2;
use aws_sdk_elasticloadbalancing::Client as Elb;
use aws_sdk_elasticloadbalancingv2::Client as Elbv2;
use aws_sdk_iam::Client as Iam;
use aws_sdk_sts::Client as Sts;
use tokio::time::Instant;

use self::door::Door;
use self::errors::{AwsError, ErrorClass};
use self::operations::{Category, Operation, Service};
use self::retry::RetryPolicy;
use self::throttle::{AimdConfig, Priority};

pub use self::clients::SdkClients;

/// Tuning of the client layer: transport only (budget, timeouts, retries,
/// coalescing, how long AWS may take to show a change). What the domain
/// modules keep and write is theirs ([`crate::aws::AwsSettings`]).
/// `Default` is what the CCM runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientOptions {
    /// Share of each AWS bucket this process may use (`--aws-api-budget-fraction`).
    /// The rest is left to the other users of the account. In `(0, 10]`;
    /// above 1 only for accounts whose limits AWS has raised.
    pub budget_fraction: f64,
    /// Time limit of one attempt.
    pub call_timeout: Duration,
    /// Attempts per call, the first included.
    pub max_attempts: u32,
    /// Upper bound of the first backoff window.
    pub backoff_base: Duration,
    /// Upper bound of any backoff window.
    pub backoff_max: Duration,
    /// How the per-category rate adapts to throttling.
    pub aimd: AimdConfig,
    /// How long single-instance lookups wait for company before one
    /// `DescribeInstances` serves them all.
    pub coalesce_window: Duration,
    /// Instance IDs per coalesced call (`instance-id` filter values).
    pub max_ids_per_call: usize,
    /// Private DNS names per coalesced call (`private-dns-name` filter values).
    pub max_dns_names_per_call: usize,
    /// How long an object created moments ago may stay invisible (AWS is
    /// eventually consistent): the bound of [`consistency::Patience`].
    pub consistency_patience: Duration,
}

impl Default for ClientOptions {
    fn default() -> ClientOptions {
        let retry = RetryPolicy::default();
        ClientOptions {
            budget_fraction: 0.5,
            call_timeout: Duration::from_secs(30),
            max_attempts: retry.max_attempts,
            backoff_base: retry.base_delay,
            backoff_max: retry.max_delay,
            aimd: AimdConfig::default(),
            coalesce_window: Duration::from_millis(5),
            max_ids_per_call: 1000,
            max_dns_names_per_call: 200,
            consistency_patience: Duration::from_secs(30),
        }
    }
}

/// A [`ClientOptions`] value that cannot work.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptionsError {
    #[error(
        "--aws-api-budget-fraction {0} is out of range: give a share of AWS's API rate limits greater than 0 \
         and at most 10 (0.5 = half of each bucket, the default)"
    )]
    BudgetFraction(f64),
    #[error("the AWS call timeout must be greater than zero (got {0:?})")]
    CallTimeout(Duration),
    #[error("the AWS client needs at least one attempt per call (got max_attempts = 0)")]
    MaxAttempts,
    #[error("coalesced lookups need at least one {what} per call (got 0)")]
    BatchSize { what: &'static str },
}

impl ClientOptions {
    /// Checks the options; the CLI calls this when parsing flags so a bad
    /// value stops the process with a clear message instead of misbehaving.
    pub(crate) fn validate(&self) -> Result<(), OptionsError> {
        if !(self.budget_fraction > 0.0 && self.budget_fraction <= 10.0) {
            return Err(OptionsError::BudgetFraction(self.budget_fraction));
        }
        if self.call_timeout.is_zero() {
            return Err(OptionsError::CallTimeout(self.call_timeout));
        }
        if self.max_attempts == 0 {
            return Err(OptionsError::MaxAttempts);
        }
        if self.max_ids_per_call == 0 {
            return Err(OptionsError::BatchSize {
                what: "instance ID",
            });
        }
        if self.max_dns_names_per_call == 0 {
            return Err(OptionsError::BatchSize {
                what: "private DNS name",
            });
        }
        Ok(())
    }

    /// The options with each invalid value replaced by its default (the
    /// error logged).
    fn or_defaults(mut self) -> ClientOptions {
        let Err(err) = self.validate() else {
            return self;
        };
        tracing::error!(error = %err, "invalid AWS client options; using the defaults for the invalid ones");
        let defaults = ClientOptions::default();
        if !(self.budget_fraction > 0.0 && self.budget_fraction <= 10.0) {
            self.budget_fraction = defaults.budget_fraction;
        }
        if self.call_timeout.is_zero() {
            self.call_timeout = defaults.call_timeout;
        }
        self.max_attempts = self.max_attempts.max(1);
        self.max_ids_per_call = self.max_ids_per_call.max(1);
        self.max_dns_names_per_call = self.max_dns_names_per_call.max(1);
        self
    }

    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.max(1),
            base_delay: self.backoff_base,
            max_delay: self.backoff_max,
        }
    }
}

/// Per-call options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    /// The call fails with [`AwsError::DeadlineExceeded`] rather than
    /// continue past this instant (waiting for a token, sending, or backing
    /// off). `None`: bounded by the attempt limit only.
    deadline: Option<Instant>,
    /// The request is sent with `DryRun=true`: see [`AwsClient::dry_run`].
    dry_run: bool,
}

impl CallOptions {
    /// Options with a deadline `timeout` from now.
    pub fn within(timeout: Duration) -> CallOptions {
        CallOptions {
            deadline: Some(Instant::now() + timeout),
            dry_run: false,
        }
    }
}

/// The one door: every AWS call of the process goes through it. Cheap to
/// clone (an `Arc` inside); it holds no domain state.
#[derive(Clone)]
pub struct AwsClient {
    core: Arc<Core>,
}

/// What the door and the domain modules' batched fetches share.
pub(in crate::aws) struct Core {
    pub(in crate::aws) clients: SdkClients,
    pub(in crate::aws) cluster_id: String,
    pub(in crate::aws) options: ClientOptions,
    pub(in crate::aws) door: Arc<Door>,
}

impl Core {
    /// Calls EC2 at [`Priority::Shared`]: the reads many callers wait on
    /// (batched lookups, the sweep, zones).
    pub(in crate::aws) async fn shared_ec2<F: SdkCall<Ec2>>(
        &self,
        op: Operation,
        opts: CallOptions,
        f: F,
    ) -> Result<F::Ok, AwsError> {
        let ec2 = &self.clients.ec2;
        self.door
            .call(Service::Ec2, op, opts, Priority::Shared, || f(ec2.clone()))
            .await
    }
}

impl std::fmt::Debug for AwsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsClient")
            .field("cluster_id", &self.core.cluster_id)
            .field("options", &self.core.options)
            .finish_non_exhaustive()
    }
}

/// What one attempt of an AWS call returns: the future of an SDK
/// operation's `send()`, whose error the door classifies.
pub trait SdkFuture: Future<Output = Result<Self::Ok, SdkError<Self::Err, HttpResponse>>> {
    type Ok;
    type Err: ProvideErrorMetadata + std::error::Error + 'static;
}

impl<Fut, T, E> SdkFuture for Fut
where
    Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    type Ok = T;
    type Err = E;
}

/// Builds and sends one request through the SDK client `C`: called again
/// for every attempt.
pub trait SdkCall<C>: Fn(C) -> <Self as SdkCall<C>>::Fut {
    type Fut: SdkFuture<Ok = Self::Ok>;
    type Ok;
}

impl<C, F, Fut> SdkCall<C> for F
where
    F: Fn(C) -> Fut,
    Fut: SdkFuture,
{
    type Fut = Fut;
    type Ok = Fut::Ok;
}

/// An SDK client the one door can send calls through: which service it is
/// and where the shared clients keep it.
pub trait SdkService: Clone {
    const SERVICE: Service;
    fn pick(clients: &SdkClients) -> &Self;
}

impl SdkService for aws_sdk_ec2::Client {
    const SERVICE: Service = Service::Ec2;
    fn pick(clients: &SdkClients) -> &Self {
        &clients.ec2
    }
}

impl SdkService for aws_sdk_elasticloadbalancing::Client {
    const SERVICE: Service = Service::Elb;
    fn pick(clients: &SdkClients) -> &Self {
        &clients.elb
    }
}

impl SdkService for aws_sdk_elasticloadbalancingv2::Client {
    const SERVICE: Service = Service::Elbv2;
    fn pick(clients: &SdkClients) -> &Self {
        &clients.elbv2
    }
}

impl SdkService for aws_sdk_sts::Client {
    const SERVICE: Service = Service::Sts;
    fn pick(clients: &SdkClients) -> &Self {
        &clients.sts
    }
}

impl SdkService for aws_sdk_iam::Client {
    const SERVICE: Service = Service::Iam;
    fn pick(clients: &SdkClients) -> &Self {
        &clients.iam
    }
}

impl AwsClient {
    /// Builds the client (invalid options replaced by their defaults, as
    /// [`crate::aws::Aws::new`] says) around a [`Door`] that others share too: the
    /// credentials provider assuming cloud.conf's `RoleARN` calls STS
    /// through the same door, and it must exist before the SDK clients.
    /// The door's own options (throttle, timeout, retries) are the ones it
    /// was built with; `opts` sets the rest.
    pub(crate) fn with_door(
        clients: SdkClients,
        cluster_id: String,
        opts: ClientOptions,
        door: Arc<Door>,
    ) -> AwsClient {
        let options = opts.or_defaults();
        AwsClient {
            core: Arc::new(Core {
                clients,
                cluster_id,
                options,
                door,
            }),
        }
    }

    /// What the domain modules' batched fetches share with the door.
    pub(in crate::aws) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// The Region its SDK clients call (empty when none is configured).
    pub(crate) fn region(&self) -> String {
        let ec2 = self.core.clients.ec2.config();
        ec2.region().map_or(String::new(), |r| r.to_string())
    }

    /// The cluster ID this client was built for.
    pub(crate) fn cluster_id(&self) -> &str {
        &self.core.cluster_id
    }

    /// The options in force (after validation).
    pub(crate) fn options(&self) -> &ClientOptions {
        &self.core.options
    }

    /// The current adaptive rate of a category, in requests per second.
    pub fn current_rate(&self, category: Category) -> f64 {
        self.core.door.current_rate(category)
    }

    /// Stops every change to AWS from this process (the door refuses each
    /// mutating call from now on) and waits, at most `bound`, for those
    /// already sent to be answered; returns how many still are not. Called
    /// the moment the process cannot prove it still leads.
    pub(crate) async fn stop_mutations(&self, bound: Duration) -> usize {
        self.core.door.stop_mutations_and_drain(bound).await
    }

    /// Calls AWS through the service whose SDK client `f` takes. `f` builds
    /// and sends one request; it is called again for every attempt.
    ///
    /// ```ignore
    /// let out = aws.call_with(Operation::Ec2DescribeRouteTables, CallOptions::within(t), |ec2: aws_sdk_ec2::Client| {
    ///     ec2.describe_route_tables().filters(vpc_filter.clone()).send()
    /// }).await?;
    /// ```
    pub async fn call_with<C: SdkService, F: SdkCall<C>>(
        &self,
        op: Operation,
        opts: CallOptions,
        f: F,
    ) -> Result<F::Ok, AwsError> {
        let client = C::pick(&self.core.clients);
        self.core
            .door
            .call(C::SERVICE, op, opts, Priority::Normal, || f(client.clone()))
            .await
    }

    /// Calls EC2 with no deadline of the caller's; see [`AwsClient::call_with`].
    pub async fn ec2<F: SdkCall<Ec2>>(&self, op: Operation, f: F) -> Result<F::Ok, AwsError> {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls classic ELB; see [`AwsClient::call_with`].
    pub async fn elb<F: SdkCall<Elb>>(&self, op: Operation, f: F) -> Result<F::Ok, AwsError> {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls ELBv2; see [`AwsClient::call_with`].
    pub async fn elbv2<F: SdkCall<Elbv2>>(&self, op: Operation, f: F) -> Result<F::Ok, AwsError> {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls STS; see [`AwsClient::call_with`].
    pub async fn sts<F: SdkCall<Sts>>(&self, op: Operation, f: F) -> Result<F::Ok, AwsError> {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls IAM (`aws-ccm doctor` only); see [`AwsClient::call_with`].
    pub(crate) async fn iam<F: SdkCall<Iam>>(
        &self,
        op: Operation,
        f: F,
    ) -> Result<F::Ok, AwsError> {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Sends a request with `DryRun=true` (which `f` must set) through the
    /// door: the same token bucket and metrics as the real request, retried
    /// on throttling and transient failures like any call. `Ok` with the
    /// verdict when AWS answered `DryRunOperation` or
    /// `UnauthorizedOperation`; any other answer is an error, including a
    /// service that carried the request out (it ignored `DryRun`).
    pub(crate) async fn dry_run<C: SdkService, F: SdkCall<C>>(
        &self,
        op: Operation,
        f: F,
    ) -> Result<DryRun, AwsError> {
        let client = C::pick(&self.core.clients);
        let opts = CallOptions {
            dry_run: true,
            ..CallOptions::default()
        };
        let answer = self
            .core
            .door
            .call(C::SERVICE, op, opts, Priority::Normal, || f(client.clone()))
            .await;
        match answer {
            Err(e) if e.is_dry_run_allowed() => Ok(DryRun::Allowed),
            Err(e) if e.is_denied() => Ok(DryRun::Denied {
                message: e.message(),
            }),
            Err(e) => Err(e),
            Ok(_) => Err(AwsError::local(
                op,
                ErrorClass::Fatal,
                format!(
                    "{op} with DryRun=true was carried out instead of answering DryRunOperation; \
                     the endpoint does not honour DryRun, so no permission can be inferred"
                ),
                1,
            )),
        }
    }
}

/// What a `DryRun=true` request found out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DryRun {
    /// `DryRunOperation`: the request would have been allowed.
    Allowed,
    /// `UnauthorizedOperation`: IAM denies it; AWS's message (it carries an
    /// encoded authorization message naming the policy statement).
    Denied { message: String },
}

/// Bounds a wait by the caller's deadline.
pub(in crate::aws) async fn with_deadline<T>(
    op: Operation,
    opts: CallOptions,
    work: impl Future<Output = Result<T, AwsError>>,
) -> Result<T, AwsError> {
    let Some(deadline) = opts.deadline else {
        return work.await;
    };
    let start = Instant::now();
    match tokio::time::timeout_at(deadline, work).await {
        Ok(result) => result,
        Err(_) => Err(AwsError::DeadlineExceeded {
            operation: op,
            attempts: 0,
            elapsed: start.elapsed(),
            last: None,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::client::errors::ErrorClass;
    use crate::aws::client::test_stub::{Fault, StubEc2, fleet};

    /// Fast retries so failure-path tests take milliseconds.
    fn fast_options() -> ClientOptions {
        ClientOptions {
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            ..ClientOptions::default()
        }
    }

    async fn client_for(stub: &StubEc2, options: ClientOptions) -> crate::aws::Aws {
        crate::aws::Aws::new(
            stub.clients(),
            "demo".to_string(),
            options,
            crate::aws::AwsSettings::default(),
        )
    }

    #[tokio::test]
    async fn transient_errors_and_throttling_are_retried_and_throttling_lowers_the_rate() {
        let stub = StubEc2::start(fleet(1)).await;
        let aws = client_for(&stub, fast_options()).await;
        stub.push_faults([
            Fault::Error {
                status: 503,
                code: "Unavailable",
            },
            Fault::Error {
                status: 500,
                code: "InternalError",
            },
            Fault::Error {
                status: 503,
                code: "RequestLimitExceeded",
            },
        ]);
        let before = aws.current_rate(Category::Ec2NonMutating);
        let zones = aws
            .ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
                ec2.describe_availability_zones().send()
            })
            .await
            .expect("succeeds on the 4th attempt");
        assert_eq!(zones.availability_zones().len(), 2);
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 4);
        assert!(
            aws.current_rate(Category::Ec2NonMutating) < before,
            "throttling lowered the rate"
        );
    }

    #[tokio::test]
    async fn fatal_and_not_found_errors_are_not_retried() {
        let stub = StubEc2::start(fleet(1)).await;
        let aws = client_for(&stub, fast_options()).await;
        for (code, class) in [
            ("InvalidParameterValue", ErrorClass::Fatal),
            ("UnauthorizedOperation", ErrorClass::Fatal),
            ("InvalidRouteTableID.NotFound", ErrorClass::NotFound),
        ] {
            let before = stub.calls("DescribeAvailabilityZones");
            stub.push_faults([Fault::Error { status: 400, code }]);
            let err = aws
                .ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
                    ec2.describe_availability_zones().send()
                })
                .await
                .expect_err("fails");
            assert_eq!(err.class(), class, "{err}");
            assert_eq!(err.code(), Some(code));
            assert_eq!(err.attempts(), 1);
            assert!(
                err.message().contains("stub says"),
                "AWS message kept: {err}"
            );
            assert_eq!(
                stub.calls("DescribeAvailabilityZones") - before,
                1,
                "{code} not retried"
            );
        }
    }

    #[tokio::test]
    async fn retries_stop_at_max_attempts() {
        let stub = StubEc2::start(Vec::new()).await;
        let options = ClientOptions {
            max_attempts: 3,
            ..fast_options()
        };
        let aws = client_for(&stub, options).await;
        stub.push_faults((0..5).map(|_| Fault::Error {
            status: 500,
            code: "InternalError",
        }));
        let err = aws
            .ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
                ec2.describe_availability_zones().send()
            })
            .await
            .expect_err("all attempts fail");
        assert_eq!(err.attempts(), 3);
        assert_eq!(err.class(), ErrorClass::Transient);
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 3);
        let text = err.to_string();
        assert!(
            text.contains("EC2 DescribeAvailabilityZones failed after 3 attempt(s)"),
            "{text}"
        );
        assert!(text.contains("InternalError"), "{text}");
    }

    #[tokio::test]
    async fn slow_answers_time_out_per_attempt_and_deadlines_are_honoured() {
        let stub = StubEc2::start(Vec::new()).await;
        let options = ClientOptions {
            call_timeout: Duration::from_millis(100),
            ..fast_options()
        };
        let aws = client_for(&stub, options).await;
        // First attempt hangs past the per-call timeout; the retry succeeds.
        stub.push_faults([Fault::Delay(Duration::from_secs(2))]);
        aws.ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
            ec2.describe_availability_zones().send()
        })
        .await
        .expect("retry after a timeout");
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 2);

        // With every attempt slow, the caller's deadline ends the call.
        stub.push_faults((0..10).map(|_| Fault::Delay(Duration::from_secs(2))));
        let start = Instant::now();
        let err = aws
            .call_with(
                Operation::Ec2DescribeAvailabilityZones,
                CallOptions::within(Duration::from_millis(250)),
                |ec2: aws_sdk_ec2::Client| ec2.describe_availability_zones().send(),
            )
            .await
            .expect_err("deadline");
        // DeadlineExceeded (not the 2 s answer, nor retries running out)
        // proves the deadline ended the call; only a lower bound on time.
        assert!(matches!(err, AwsError::DeadlineExceeded { .. }), "{err}");
        assert!(start.elapsed() >= Duration::from_millis(250));
    }

    #[tokio::test]
    async fn a_caller_deadline_bounds_the_wait_for_a_token() {
        let stub = StubEc2::start(Vec::new()).await;
        let options = ClientOptions {
            budget_fraction: 0.1, // ELB create bucket: 1 burst, one per 50 s
            ..fast_options()
        };
        let aws = client_for(&stub, options).await;
        let call = || {
            aws.call_with(
                Operation::ElbCreateLoadBalancer,
                CallOptions::within(Duration::from_millis(100)),
                |elb: aws_sdk_elasticloadbalancing::Client| elb.describe_load_balancers().send(),
            )
        };
        // The first call takes the only token (and fails at the stub, which
        // does not speak ELB); the second cannot get one before its deadline.
        let first = call().await.expect_err("stub does not serve ELB");
        assert_eq!(first.class(), ErrorClass::Fatal);
        let second = call().await.expect_err("no token within 100 ms");
        assert!(
            matches!(second, AwsError::DeadlineExceeded { attempts: 0, .. }),
            "{second}"
        );
    }

    #[tokio::test]
    async fn an_operation_of_another_service_is_refused() {
        let stub = StubEc2::start(Vec::new()).await;
        let aws = client_for(&stub, fast_options()).await;
        let err = aws
            .ec2(Operation::ElbDescribeLoadBalancers, |ec2| {
                ec2.describe_availability_zones().send()
            })
            .await
            .expect_err("wrong service");
        assert_eq!(err.class(), ErrorClass::Fatal);
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 0);
    }

    #[tokio::test]
    async fn metrics_use_the_go_ccm_names() {
        let stub = StubEc2::start(fleet(1)).await;
        let aws = client_for(&stub, fast_options()).await;
        stub.push_faults([Fault::Error {
            status: 400,
            code: "RequestLimitExceeded",
        }]);
        aws.instance_by_id(&format!("i-{:017x}", 0))
            .await
            .expect("found after a retry");
        stub.push_faults([Fault::Error {
            status: 400,
            code: "InvalidParameterValue",
        }]);
        aws.ec2(Operation::Ec2DescribeAvailabilityZones, |ec2| {
            ec2.describe_availability_zones().send()
        })
        .await
        .expect_err("fatal");
        let text = crate::metrics::encode();
        for needle in [
            "cloudprovider_aws_api_request_duration_seconds_bucket{le=\"+Inf\",request=\"describe_instance\"}",
            "cloudprovider_aws_api_request_duration_seconds_count{request=\"describe_instance\"}",
            "cloudprovider_aws_api_request_errors{request=\"describe_availability_zones\"}",
            "cloudprovider_aws_api_throttled_requests_total{operation_name=\"DescribeInstances\"}",
            "cloudprovider_aws_api_response_status_total{service=\"EC2\",operation=\"DescribeAvailabilityZones\",status_code=\"400\"}",
            "aws_ccm_api_calls_total{operation=\"ec2:DescribeInstances\",outcome=\"success\"}",
            "aws_ccm_api_calls_total{operation=\"ec2:DescribeInstances\",outcome=\"throttled\"}",
            "aws_ccm_api_coalesced_batch_size_count{kind=\"instance_id\"}",
            "aws_ccm_api_token_wait_seconds_count{category=\"ec2_non_mutating\"}",
            "aws_ccm_api_rate_limit{category=\"ec2_non_mutating\"}",
        ] {
            assert!(text.contains(needle), "missing {needle} in\n{text}");
        }
    }
}
