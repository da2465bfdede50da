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
//! On top of that sit the coalescing lookups: single-instance lookups by ID
//! or private DNS name batched into one `DescribeInstances`, the shared
//! cluster sweep, and the cached zone map (their calls are in
//! `aws/instances/io.rs`).
//!
//! The SDK clients must be built with SDK retries disabled and without an
//! operation timeout: this layer owns both, and SDK retries underneath would
//! multiply every attempt made here.

pub mod api_metrics;
pub mod clients;
pub mod coalesce;
pub mod consistency;
pub mod door;
pub mod errors;
pub mod operations;
pub mod retry;
#[cfg(test)]
pub(crate) mod test_stub;
pub mod throttle;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use futures::future::FutureExt;
use tokio::time::Instant;

use self::coalesce::{Batcher, SingleFlight};
use self::door::Door;
use self::errors::{AttemptFailure, AwsError, ErrorClass};
use self::operations::{Category, Operation, Service};
use self::retry::RetryPolicy;
use self::throttle::{AimdConfig, Priority};
use super::instances::{self, Ec2Instance};

pub use self::clients::SdkClients;

/// Tuning of the client layer. `Default` is what the CCM runs with.
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
    /// How long a cluster sweep stays fresh.
    pub sweep_ttl: Duration,
    /// Whether the sweep also finds instances tagged with the legacy
    /// `KubernetesCluster=<id>` tag: a second query, as long as the first
    /// when instances carry both tags (kOps). The manager sets it, as the Go
    /// CCM does, only for a cluster identified by the legacy tag.
    pub legacy_cluster_tag: bool,
    /// Whether the load balancers, listeners, target groups and security
    /// groups this CCM creates also carry `KubernetesCluster=<id>`: the Go
    /// CCM's `usesLegacyTags`, which the manager sets from cloud.conf
    /// `KubernetesClusterTag` or this instance's tags (kOps).
    pub write_legacy_cluster_tag: bool,
    /// How long the zone name → zone ID map stays fresh.
    pub zone_ttl: Duration,
    /// cloud.conf `SupportedTopologyInstanceTypePattern`: the instance
    /// types expected to have a network topology (upstream's default when
    /// `None`; see `aws::instances::topology`).
    pub topology_pattern: Option<String>,
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
            sweep_ttl: Duration::from_secs(30),
            legacy_cluster_tag: true,
            write_legacy_cluster_tag: false,
            zone_ttl: Duration::from_secs(3600),
            topology_pattern: None,
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
    pub fn validate(&self) -> Result<(), OptionsError> {
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
    pub(crate) fn or_defaults(self) -> ClientOptions {
        let mut options = self;
        let Err(err) = options.validate() else {
            return options;
        };
        tracing::error!(error = %err, "invalid AWS client options; using the defaults for the invalid ones");
        let defaults = ClientOptions::default();
        if !(options.budget_fraction > 0.0 && options.budget_fraction <= 10.0) {
            options.budget_fraction = defaults.budget_fraction;
        }
        if options.call_timeout.is_zero() {
            options.call_timeout = defaults.call_timeout;
        }
        options.max_attempts = options.max_attempts.max(1);
        options.max_ids_per_call = options.max_ids_per_call.max(1);
        options.max_dns_names_per_call = options.max_dns_names_per_call.max(1);
        options
    }

    pub(crate) fn retry_policy(&self) -> RetryPolicy {
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
    pub deadline: Option<Instant>,
}

impl CallOptions {
    /// Options with a deadline `timeout` from now.
    pub fn within(timeout: Duration) -> CallOptions {
        CallOptions {
            deadline: Some(Instant::now() + timeout),
        }
    }
}

/// The AWS client every controller uses. Cheap to clone (an `Arc` inside).
#[derive(Clone)]
pub struct AwsClient {
    inner: Arc<Inner>,
}

struct Inner {
    core: Arc<Core>,
    permissions: Arc<super::permissions::Permissions>,
    by_id: Batcher<String, Ec2Instance>,
    by_private_dns: Batcher<String, Ec2Instance>,
    sweep: SingleFlight<Arc<Vec<Ec2Instance>>>,
    zones: SingleFlight<Arc<Zones>>,
    /// The VPC's security groups, shared by every sync.
    groups: super::security_groups::view::SgView,
    topology: instances::topology::Topology,
}

/// The Region's availability zones, from one `DescribeAvailabilityZones`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Zones {
    /// Zone name → zone ID (`us-east-1a` → `use1-az1`).
    pub ids: Arc<HashMap<String, String>>,
    /// Zone name → zone type (`availability-zone`, `local-zone`,
    /// `wavelength-zone`); a zone AWS gives no type for is left out.
    pub types: HashMap<String, String>,
}

/// What the batch tasks need: everything but the batchers themselves (which
/// hold their fetch closures; keeping those apart avoids an `Arc` cycle).
pub(in crate::aws) struct Core {
    pub(in crate::aws) clients: SdkClients,
    pub(in crate::aws) cluster_id: String,
    pub(in crate::aws) options: ClientOptions,
    pub(in crate::aws) door: Arc<Door>,
}

impl std::fmt::Debug for AwsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsClient")
            .field("cluster_id", &self.inner.core.cluster_id)
            .field("options", &self.inner.core.options)
            .finish_non_exhaustive()
    }
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
    /// Builds the client. Invalid options are logged and replaced by their
    /// defaults (validate them earlier with [`ClientOptions::validate`] to
    /// refuse them instead).
    pub fn new(clients: SdkClients, cluster_id: String, opts: ClientOptions) -> AwsClient {
        let door = Door::new(&opts);
        AwsClient::with_door(clients, cluster_id, opts, door)
    }

    /// Builds the client around a [`Door`] that others share too: the
    /// credentials provider assuming cloud.conf's `RoleARN` calls STS
    /// through the same door, and it must exist before the SDK clients.
    /// The door's own options (throttle, timeout, retries) are the ones it
    /// was built with; `opts` sets the rest.
    pub fn with_door(
        clients: SdkClients,
        cluster_id: String,
        opts: ClientOptions,
        door: Arc<Door>,
    ) -> AwsClient {
        let options = opts.or_defaults();
        let core = Arc::new(Core {
            clients,
            cluster_id,
            options,
            door,
        });

        let options = &core.options;
        let region = core
            .clients
            .ec2
            .config()
            .region()
            .map_or(String::new(), |r| r.to_string());
        let inner = Inner {
            by_id: Batcher::new(
                "instance_id",
                Operation::Ec2DescribeInstances,
                options.coalesce_window,
                options.max_ids_per_call,
                instances::io::fetch_by_id(core.clone()),
            ),
            by_private_dns: Batcher::new(
                "private_dns_name",
                Operation::Ec2DescribeInstances,
                options.coalesce_window,
                options.max_dns_names_per_call,
                instances::io::fetch_by_private_dns(core.clone()),
            ),
            sweep: SingleFlight::new(Operation::Ec2DescribeInstances, options.sweep_ttl),
            zones: SingleFlight::new(Operation::Ec2DescribeAvailabilityZones, options.zone_ttl),
            groups: Default::default(),
            topology: instances::topology::Topology::new(
                core.clone(),
                region.clone(),
                options.topology_pattern.as_deref(),
            ),
            permissions: Arc::new(super::permissions::Permissions::new(
                &core.cluster_id,
                &region,
                super::permissions::DEFAULT_TTL,
            )),
            core,
        };
        AwsClient {
            inner: Arc::new(inner),
        }
    }

    /// The cluster ID this client was built for.
    pub fn cluster_id(&self) -> &str {
        &self.inner.core.cluster_id
    }

    /// What IAM lets this client write: the shared registry of DryRun
    /// verdicts (see [`super::permissions`]).
    pub fn permissions(&self) -> &super::permissions::Permissions {
        &self.inner.permissions
    }

    /// The options in force (after validation).
    pub fn options(&self) -> &ClientOptions {
        &self.inner.core.options
    }

    /// The current adaptive rate of a category, in requests per second.
    pub fn current_rate(&self, category: Category) -> f64 {
        self.inner.core.door.current_rate(category)
    }

    /// Stops every change to AWS from this process (the door refuses each
    /// mutating call from now on) and waits, at most `bound`, for those
    /// already sent to be answered; returns how many still are not. Called
    /// the moment the process cannot prove it still leads.
    pub async fn stop_mutations(&self, bound: Duration) -> usize {
        self.inner.core.door.stop_mutations_and_drain(bound).await
    }

    /// Calls AWS through the service whose SDK client `f` takes. `f` builds
    /// and sends one request; it is called again for every attempt.
    ///
    /// ```ignore
    /// let out = aws.call_with(Operation::Ec2DescribeRouteTables, CallOptions::within(t), |ec2: aws_sdk_ec2::Client| {
    ///     ec2.describe_route_tables().filters(vpc_filter.clone()).send()
    /// }).await?;
    /// ```
    pub async fn call_with<C, T, E, F, Fut>(
        &self,
        op: Operation,
        opts: CallOptions,
        f: F,
    ) -> Result<T, AwsError>
    where
        C: SdkService,
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let client = C::pick(&self.inner.core.clients);
        self.inner
            .core
            .door
            .call(C::SERVICE, op, opts, Priority::Normal, || f(client.clone()))
            .await
    }

    /// Calls EC2 with no deadline of the caller's; see [`AwsClient::call_with`].
    pub async fn ec2<T, E, F, Fut>(&self, op: Operation, f: F) -> Result<T, AwsError>
    where
        F: Fn(aws_sdk_ec2::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls classic ELB; see [`AwsClient::call_with`].
    pub async fn elb<T, E, F, Fut>(&self, op: Operation, f: F) -> Result<T, AwsError>
    where
        F: Fn(aws_sdk_elasticloadbalancing::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls ELBv2; see [`AwsClient::call_with`].
    pub async fn elbv2<T, E, F, Fut>(&self, op: Operation, f: F) -> Result<T, AwsError>
    where
        F: Fn(aws_sdk_elasticloadbalancingv2::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls STS; see [`AwsClient::call_with`].
    pub async fn sts<T, E, F, Fut>(&self, op: Operation, f: F) -> Result<T, AwsError>
    where
        F: Fn(aws_sdk_sts::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Calls IAM (`aws-ccm doctor` only); see [`AwsClient::call_with`].
    pub async fn iam<T, E, F, Fut>(&self, op: Operation, f: F) -> Result<T, AwsError>
    where
        F: Fn(aws_sdk_iam::Client) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        self.call_with(op, CallOptions::default(), f).await
    }

    /// Sends a request with `DryRun=true` (which `f` must set) through the
    /// door: the same token bucket and metrics as the real request, retried
    /// on throttling and transient failures like any call. `Ok` with the
    /// verdict when AWS answered `DryRunOperation` or
    /// `UnauthorizedOperation`; any other answer is an error, including a
    /// service that carried the request out (it ignored `DryRun`).
    pub async fn dry_run<C, T, E, F, Fut>(&self, op: Operation, f: F) -> Result<DryRun, AwsError>
    where
        C: SdkService,
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, SdkError<E, HttpResponse>>>,
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        let client = C::pick(&self.inner.core.clients);
        let answer = self
            .inner
            .core
            .door
            .call_as(
                C::SERVICE,
                op,
                CallOptions::default(),
                Priority::Normal,
                true,
                || f(client.clone()),
            )
            .await;
        match answer {
            Err(e) if e.code() == Some(DRY_RUN_ALLOWED_CODE) => Ok(DryRun::Allowed),
            Err(e) if e.code().is_some_and(|c| DRY_RUN_DENIED_CODES.contains(&c)) => {
                Ok(DryRun::Denied {
                    message: e.message(),
                })
            }
            Err(e) => Err(e),
            Ok(_) => Err(AwsError::from_attempt(
                op,
                AttemptFailure::new(
                    ErrorClass::Fatal,
                    None,
                    format!(
                        "{op} with DryRun=true was carried out instead of answering DryRunOperation; \
                         the endpoint does not honour DryRun, so no permission can be inferred"
                    ),
                ),
                1,
            )),
        }
    }

    /// One instance by ID, coalesced with concurrent lookups into one
    /// `DescribeInstances`. [`AwsError::NotFound`] when it does not exist;
    /// a terminated instance that EC2 still lists is returned (its `state`
    /// says so), because the node lifecycle controller needs to see it.
    pub async fn instance_by_id(&self, id: &str) -> Result<Ec2Instance, AwsError> {
        self.instance_by_id_with(id, CallOptions::default()).await
    }

    /// [`AwsClient::instance_by_id`] with a deadline for this caller's wait
    /// (the shared batch call goes on for the others).
    pub async fn instance_by_id_with(
        &self,
        id: &str,
        opts: CallOptions,
    ) -> Result<Ec2Instance, AwsError> {
        let lookup = self.inner.by_id.get(id.to_string());
        let found = with_deadline(Operation::Ec2DescribeInstances, opts, lookup).await?;
        found.ok_or_else(|| AwsError::NotFound {
            operation: Operation::Ec2DescribeInstances,
            what: format!("EC2 instance {id}"),
        })
    }

    /// One live (not terminated) instance by private DNS name
    /// (`ip-10-0-0-1.ec2.internal`), coalesced like [`AwsClient::instance_by_id`].
    pub async fn instance_by_private_dns(&self, name: &str) -> Result<Ec2Instance, AwsError> {
        self.instance_by_private_dns_with(name, CallOptions::default())
            .await
    }

    /// [`AwsClient::instance_by_private_dns`] with a deadline.
    pub async fn instance_by_private_dns_with(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<Ec2Instance, AwsError> {
        let lookup = self.inner.by_private_dns.get(name.to_string());
        let found = with_deadline(Operation::Ec2DescribeInstances, opts, lookup).await?;
        found.ok_or_else(|| AwsError::NotFound {
            operation: Operation::Ec2DescribeInstances,
            what: format!("EC2 instance with private DNS name {name}"),
        })
    }

    /// Every instance of the cluster (any state), by the Go CCM's rule: tag
    /// key `kubernetes.io/cluster/<id>`, or legacy tag
    /// `KubernetesCluster=<id>`. One paginated sweep (1,000 per page) serves
    /// all concurrent callers and is cached for `sweep_ttl`.
    pub async fn cluster_instances(&self) -> Result<Arc<Vec<Ec2Instance>>, AwsError> {
        let core = self.inner.core.clone();
        self.inner
            .sweep
            .get(move || async move { core.sweep_cluster().await.map(Arc::new) }.boxed())
            .await
    }

    /// The network nodes above an instance, top layer first, from
    /// `DescribeInstanceTopology` (batched, at most 100 IDs per call).
    /// `Ok(None)` when the instance has none, or is not asked: no type, or
    /// its Region, type or ID was lately found to answer nothing (see
    /// [`instances::topology`]).
    pub async fn network_nodes(
        &self,
        id: &str,
        instance_type: Option<&str>,
    ) -> Result<Option<Vec<String>>, AwsError> {
        self.inner.topology.network_nodes(id, instance_type).await
    }

    /// Whether instances of this type are expected to have a topology
    /// (cloud.conf `SupportedTopologyInstanceTypePattern`).
    pub fn expects_topology(&self, instance_type: &str) -> bool {
        self.inner.topology.expects_topology(instance_type)
    }

    /// Forgets the cached sweep (after the caller changed instances, or
    /// learned the cache is stale); the next `cluster_instances` reads AWS.
    pub fn invalidate_sweep(&self) {
        self.inner.sweep.invalidate();
    }

    /// Availability zone name → zone ID (`us-east-1a` → `use1-az1`), cached.
    pub async fn zone_ids(&self) -> Result<Arc<HashMap<String, String>>, AwsError> {
        Ok(self.zones().await?.ids.clone())
    }

    /// The VPC's security groups as the sync paths share them (see
    /// [`super::security_groups::view`]); writes through
    /// `security_groups::io` keep it current.
    pub fn group_view(&self) -> &super::security_groups::view::SgView {
        &self.inner.groups
    }

    /// The Region's zones with their IDs and types, cached (one read shared
    /// with [`Self::zone_ids`]).
    pub async fn zones(&self) -> Result<Arc<Zones>, AwsError> {
        let core = self.inner.core.clone();
        self.inner
            .zones
            .get(move || async move { core.describe_zones().await.map(Arc::new) }.boxed())
            .await
    }
}

/// EC2's answer to a DryRun request that would have succeeded.
pub const DRY_RUN_ALLOWED_CODE: &str = "DryRunOperation";
/// Answers that mean IAM denies the request (EC2; ELB and STS spell it
/// `AccessDenied`).
pub const DRY_RUN_DENIED_CODES: &[&str] = &["UnauthorizedOperation", "AccessDenied"];

/// What a `DryRun=true` request found out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DryRun {
    /// `DryRunOperation`: the request would have been allowed.
    Allowed,
    /// `UnauthorizedOperation`: IAM denies it; AWS's message (it carries an
    /// encoded authorization message naming the policy statement).
    Denied { message: String },
}

/// Bounds a wait by the caller's deadline.
async fn with_deadline<T>(
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
    use crate::aws::client::test_stub::{Fault, StubEc2, StubInstance};

    /// Fast retries so failure-path tests take milliseconds.
    fn fast_options() -> ClientOptions {
        ClientOptions {
            backoff_base: Duration::from_millis(5),
            backoff_max: Duration::from_millis(20),
            ..ClientOptions::default()
        }
    }

    fn fleet(n: usize) -> Vec<StubInstance> {
        (0..n)
            .map(|i| {
                StubInstance::running(
                    &format!("i-{i:017x}"),
                    &format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
                )
                .tagged("kubernetes.io/cluster/demo", "owned")
            })
            .collect()
    }

    /// Controllers spawn their reconciles on Tokio: the client and every
    /// future it returns must be `Send`. Type-checked, never run.
    #[allow(dead_code)]
    fn client_and_its_futures_are_send(aws: &AwsClient) {
        fn is_send<T: Send + 'static>(_: T) {}
        fn is_send_ref<T: Send>(_: T) {}
        is_send(aws.clone());
        is_send_ref(aws.instance_by_id("i-1"));
        is_send_ref(aws.instance_by_private_dns("ip-10-0-0-1.ec2.internal"));
        is_send_ref(aws.cluster_instances());
        is_send_ref(aws.zone_ids());
        is_send_ref(aws.ec2(Operation::Ec2DescribeVpcs, |ec2| ec2.describe_vpcs().send()));
        is_send_ref(aws.elbv2(Operation::Elbv2DescribeTargetGroups, |elbv2| {
            elbv2.describe_target_groups().send()
        }));
    }

    async fn client_for(stub: &StubEc2, options: ClientOptions) -> AwsClient {
        AwsClient::new(stub.clients(), "demo".to_string(), options)
    }

    #[tokio::test]
    async fn concurrent_lookups_by_id_coalesce_and_isolate_unknown_ids() {
        let stub = StubEc2::start(fleet(300)).await;
        let aws = client_for(&stub, fast_options()).await;
        let mut ids: Vec<String> = (0..300).map(|i| format!("i-{i:017x}")).collect();
        ids.push("i-0000000000000dead".to_string());
        let lookups = ids.iter().map(|id| {
            let aws = aws.clone();
            async move { (id.clone(), aws.instance_by_id(id).await) }
        });
        let results = futures::future::join_all(lookups).await;
        for (id, result) in results {
            if id.ends_with("dead") {
                let err = result.expect_err("unknown ID");
                assert!(err.is_not_found(), "{err}");
                assert!(err.to_string().contains("i-0000000000000dead"), "{err}");
            } else {
                assert_eq!(
                    result.expect("known ID").id,
                    id,
                    "each caller gets its own instance"
                );
            }
        }
        assert!(
            stub.calls("DescribeInstances") <= 2,
            "{} calls",
            stub.calls("DescribeInstances")
        );
        let filters = stub.describe_filters();
        assert_eq!(
            filters[0][0].0, "instance-id",
            "uses the filter, not InstanceIds"
        );
    }

    #[tokio::test]
    async fn lookups_by_private_dns_coalesce_in_bounded_batches() {
        let stub = StubEc2::start(fleet(450)).await;
        let aws = client_for(&stub, fast_options()).await;
        let names: Vec<String> = (0..450)
            .map(|i| format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250))
            .collect();
        let results =
            futures::future::join_all(names.iter().map(|name| aws.instance_by_private_dns(name)))
                .await;
        for (name, result) in names.iter().zip(results) {
            assert_eq!(
                result.expect("found").private_dns_name.as_deref(),
                Some(name.as_str())
            );
        }
        let filters = stub.describe_filters();
        assert!(
            filters.len() <= 4,
            "{} calls for 450 names in batches of 200",
            filters.len()
        );
        for call in &filters {
            let names = call
                .iter()
                .find(|(n, _)| n == "private-dns-name")
                .map(|(_, v)| v.len());
            assert!(names.is_some_and(|n| n <= 200), "{call:?}");
            assert!(
                call.iter().any(|(n, _)| n == "instance-state-name"),
                "terminated instances excluded"
            );
        }
    }

    #[tokio::test]
    async fn the_sweep_is_paginated_shared_and_cached() {
        let mut instances = fleet(2300);
        instances.push(
            StubInstance::running("i-legacy", "ip-legacy").tagged("KubernetesCluster", "demo"),
        );
        instances.push(
            StubInstance::running("i-foreign", "ip-foreign")
                .tagged("kubernetes.io/cluster/other", "owned"),
        );
        let stub = StubEc2::start(instances).await;
        let aws = client_for(&stub, fast_options()).await;
        let sweeps = futures::future::join_all((0..50).map(|_| aws.cluster_instances())).await;
        for sweep in &sweeps {
            let sweep = sweep.as_ref().expect("sweep");
            assert_eq!(
                sweep.len(),
                2301,
                "tagged and legacy-tagged, not the foreign one"
            );
            assert!(sweep.iter().any(|i| i.id == "i-legacy"));
        }
        // 3 pages of 1,000 for the tag-key query, 1 for the legacy tag.
        assert_eq!(stub.calls("DescribeInstances"), 4);
        aws.cluster_instances().await.expect("cached");
        assert_eq!(stub.calls("DescribeInstances"), 4, "served from cache");
        aws.invalidate_sweep();
        aws.cluster_instances().await.expect("fresh");
        assert_eq!(stub.calls("DescribeInstances"), 8);

        // A cluster identified by the current tag makes the one query.
        let aws = client_for(
            &stub,
            ClientOptions {
                legacy_cluster_tag: false,
                ..fast_options()
            },
        )
        .await;
        let sweep = aws.cluster_instances().await.expect("sweep");
        assert_eq!(sweep.len(), 2300);
        assert_eq!(
            stub.calls("DescribeInstances"),
            11,
            "3 pages, no legacy query"
        );
    }

    #[tokio::test]
    async fn zones_are_read_once() {
        let stub = StubEc2::start(Vec::new()).await;
        let aws = client_for(&stub, fast_options()).await;
        let zones = aws.zone_ids().await.expect("zones");
        assert_eq!(
            zones.get("us-east-1b").map(String::as_str),
            Some("use1-az2")
        );
        aws.zone_ids().await.expect("zones");
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 1);
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
