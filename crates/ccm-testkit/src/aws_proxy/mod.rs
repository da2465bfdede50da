//! AWS throttling and fault proxy.
//!
//! Moto never throttles or fails, so tests put this proxy between the AWS SDK
//! and moto. It recognises each call's service and action, counts it, enforces
//! AWS's documented request-rate buckets (scaled by a budget fraction), injects
//! faults, and otherwise forwards the request byte for byte. Errors it makes up
//! are in each service's real wire format, so the SDK parses and retries them
//! exactly as it would real AWS errors.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule, ProxyConfig};
//! use ccm_testkit::moto::Moto;
//!
//! let moto = Moto::start().await?;
//! let proxy = FaultProxy::start(
//!     &moto.endpoint(),
//!     ProxyConfig { budget_fraction: Some(1.0), ..ProxyConfig::default() },
//! )
//! .await?;
//! proxy.set_faults(vec![FaultRule::new(FaultKind::Throttle).for_action("DescribeInstances").at_most(1)]);
//! // point the SDK at proxy.endpoint() ...
//! assert_eq!(proxy.calls().get("ec2", "DescribeInstances").throttled, 0);
//! # Ok(())
//! # }
//! ```
//!
//! Each AWS call is handled in this order: counted as received; charged to its
//! token bucket (over budget → the service's throttling error, nothing else
//! happens); then the first fault rule that fires applies (a faulted call has
//! already spent its token, as a failed real call does); then the configured
//! latency (plus any `Latency` fault) is waited out and the call forwarded.
//!
//! Paths under `/moto-api/` are forwarded but never counted or throttled;
//! `GET /proxy-api/counts` returns the counters as JSON and
//! `POST /proxy-api/reset-counts` clears them.

mod alpn;
mod consistency;
mod counts;
mod deletion_protection;
mod dry_run;
mod dualstack;
mod ecr_public;
mod errors;
mod faults;
mod health_timeout;
mod iam;
mod limits;
mod listener_attributes;
mod nlb_groups;
mod random;
mod record;
mod request;
mod rule_quota;
mod simulate;
mod target_quota;
mod tg_attributes;
mod tg_links;
mod throttle;
mod topology;

pub use consistency::ConsistencyHits;
pub use counts::{ActionCounts, CallCounts};
pub use ecr_public::{ECR_PUBLIC_REGION, EcrCall, EcrStandIn, SERVICE_ECR, SERVICE_ECR_PUBLIC};
pub use errors::{AwsError, xml_escape};
pub use faults::{AnswerLoss, FaultKind, FaultRule};
pub use iam::Enforcer as IamEnforcer;
pub use record::{CCM_APP_MARK, RECORD_ENV};
pub use request::{AwsCall, Protocol, identify};
pub use simulate::CCM_ROLE as IAM_CCM_ROLE;
pub use throttle::{
    BucketLimits, BucketScope, Budget, BudgetDecision, Category, EC2_UNFILTERED_DESCRIBE_ACTIONS,
    SERVICE_EC2, SERVICE_ELB, SERVICE_ELBV2, SERVICE_STS, TokenBucket, category_of,
    category_of_call, valid_fraction,
};
pub use topology::InstanceTopology;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::{Mutex, RwLock};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use counts::{Counters, Outcome};
use faults::ActiveRules;

/// How the proxy behaves; every field can also be changed while it runs.
#[derive(Clone, Debug, Default)]
pub struct ProxyConfig {
    /// `Some(1.0)` enforces AWS's documented buckets at full size, `Some(0.5)`
    /// at half (burst and refill rate); `None` enforces nothing.
    pub budget_fraction: Option<f64>,
    /// Added to every forwarded call.
    pub latency: Duration,
    /// Faults to inject, first match wins.
    pub faults: Vec<FaultRule>,
    /// Seed of the random source deciding which calls a probabilistic fault
    /// hits; `None` picks one (read it back with [`FaultProxy::seed`]).
    pub seed: Option<u64>,
    /// How long a resource stays invisible after it was created (eventual
    /// consistency; zero: never).
    pub consistency_delay: Duration,
}

impl ProxyConfig {
    /// Checks the numbers, naming what is wrong.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(fraction) = self.budget_fraction
            && !valid_fraction(fraction)
        {
            bail!("budget fraction must be a positive finite number, got {fraction}");
        }
        for rule in &self.faults {
            rule.validate()
                .with_context(|| format!("fault rule {rule}"))?;
        }
        Ok(())
    }
}

/// A running proxy. Dropping it stops the listener and every open connection.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<State>,
    server: JoinHandle<()>,
}

struct State {
    upstream_scheme: Scheme,
    upstream_authority: Authority,
    /// One pooled client for every forwarded call: keeps connections to moto
    /// alive so the proxy adds little at thousands of calls per second.
    client: Client<HttpConnector, Full<Bytes>>,
    /// `None` when no budget is enforced.
    budget: Mutex<Option<Budget>>,
    bucket_scope: Mutex<BucketScope>,
    latency: RwLock<Duration>,
    faults: RwLock<Arc<ActiveRules>>,
    counters: Counters,
    /// `Some` once a test took control of the buckets' clock.
    manual_clock: RwLock<Option<ManualClock>>,
    /// The CCM's actions, for the IAM policy coverage test.
    recorder: record::Recorder,
    /// Answers some actions itself instead of forwarding them (the scale
    /// benchmark's instance simulator).
    local: RwLock<Option<Arc<dyn LocalService>>>,
    /// Parameters of every received call, kept only while recording is on.
    recording: AtomicBool,
    recorded: Mutex<Vec<RecordedCall>>,
    /// A policy to answer `UnauthorizedOperation`/`AccessDenied` by, as AWS would.
    iam_enforcer: RwLock<iam::SharedEnforcer>,
    /// `iam/render.sh` options this test's setup needs, written with each
    /// recorded request so the IAM test renders the policy the same way.
    iam_policy_options: RwLock<Vec<String>>,
    /// Which calls probabilistic faults hit: seeded, replayable.
    rolls: random::Rolls,
    /// Resources inside their eventual-consistency window.
    consistency: consistency::Consistency,
    /// What `DescribeInstanceTopology` answers (moto does not know it).
    topology: RwLock<Vec<InstanceTopology>>,
    /// ELBv2's targets-per-load-balancer quota (moto has none); `None`:
    /// not enforced.
    target_quota: RwLock<Option<usize>>,
    /// Inbound rules per security group (see `rule_quota`).
    rule_quota: RwLock<Option<usize>>,
    /// Security groups per load balancer and the code of the refusal past
    /// it (see `nlb_groups`).
    groups_quota: RwLock<nlb_groups::GroupsQuota>,
    /// The policies `iam:SimulatePrincipalPolicy` evaluates, by principal
    /// ARN (moto does not simulate).
    iam_principals: RwLock<simulate::Principals>,
    /// ECR Public (moto has none) and ECR's token answer.
    ecr: EcrStandIn,
}

/// One call's parameters as sent (form-decoded), kept by
/// [`FaultProxy::record_requests`] so a test can assert what was asked for
/// when the emulator does not store it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedCall {
    pub service: String,
    pub action: String,
    /// Every parameter but `Action` and `Version`, e.g.
    /// `Listeners.member.1.InstanceProtocol` = `HTTP`.
    pub params: std::collections::BTreeMap<String, String>,
}

impl State {
    /// The time buckets refill by: real time unless a test froze it.
    fn now(&self) -> Instant {
        match &*self.manual_clock.read() {
            Some(clock) => clock.now(),
            None => Instant::now(),
        }
    }
}

/// A clock for the proxy's token buckets that only moves when a test says
/// so, making refill assertions exact and sleep-free. Get one from
/// [`FaultProxy::use_manual_clock`]. Only the buckets follow it; latency and
/// everything else keep real time.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.now.lock() += by;
    }

    /// The clock's current reading.
    pub fn now(&self) -> Instant {
        *self.now.lock()
    }
}

impl FaultProxy {
    /// Starts a proxy on 127.0.0.1 (an ephemeral port) in front of `upstream`
    /// (e.g. moto's `http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str, config: ProxyConfig) -> anyhow::Result<FaultProxy> {
        FaultProxy::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), upstream, config).await
    }

    /// Starts a proxy listening on `listen`.
    pub async fn start_on(
        listen: SocketAddr,
        upstream: &str,
        config: ProxyConfig,
    ) -> anyhow::Result<FaultProxy> {
        crate::servers_allowed("the AWS fault proxy")?;
        config.validate()?;
        let (upstream_scheme, upstream_authority) = parse_upstream(upstream)?;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("aws-fault-proxy cannot listen on {listen}"))?;
        let addr = listener
            .local_addr()
            .context("aws-fault-proxy cannot read its listening address")?;

        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(512)
            .build(connector);

        let state = Arc::new(State {
            upstream_scheme,
            upstream_authority,
            client,
            budget: Mutex::new(
                config
                    .budget_fraction
                    .map(|fraction| Budget::new(fraction, BucketScope::default())),
            ),
            bucket_scope: Mutex::new(BucketScope::default()),
            latency: RwLock::new(config.latency),
            faults: RwLock::new(Arc::new(ActiveRules::new(config.faults))),
            counters: Counters::default(),
            manual_clock: RwLock::new(None),
            recorder: record::Recorder::from_env(addr.port()),
            recording: AtomicBool::new(false),
            recorded: Mutex::new(Vec::new()),
            local: RwLock::new(None),
            iam_enforcer: RwLock::new(None),
            iam_policy_options: RwLock::new(Vec::new()),
            rolls: random::Rolls::new(config.seed),
            consistency: consistency::Consistency::default(),
            topology: RwLock::new(Vec::new()),
            target_quota: RwLock::new(None),
            rule_quota: RwLock::new(None),
            groups_quota: RwLock::new(nlb_groups::GroupsQuota::default()),
            iam_principals: RwLock::new(simulate::Principals::new()),
            ecr: EcrStandIn::default(),
        });
        state.consistency.set_delay(config.consistency_delay);
        let server = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        tracing::debug!(%addr, upstream, "aws-fault-proxy started");
        Ok(FaultProxy {
            addr,
            state,
            server,
        })
    }

    /// `http://127.0.0.1:PORT`, for the SDK's `endpoint_url`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address the proxy listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A snapshot of the per-(service, action) counters.
    pub fn calls(&self) -> CallCounts {
        self.state.counters.snapshot()
    }

    /// Sets every counter back to zero.
    pub fn reset_counts(&self) {
        self.state.counters.reset();
    }

    /// Replaces the fault rules (and their `max_count` tallies).
    ///
    /// # Panics
    /// If a rule is invalid (probability outside [0, 1], a non-5xx server
    /// error, …): a test asking for an impossible fault is a bug in the test.
    pub fn set_faults(&self, faults: Vec<FaultRule>) {
        for rule in &faults {
            if let Err(err) = rule.validate() {
                panic!("invalid fault rule {rule}: {err:#}");
            }
        }
        *self.state.faults.write() = Arc::new(ActiveRules::new(faults));
    }

    /// Each fault rule set by [`FaultProxy::set_faults`], with how many
    /// calls it fired on: proof that each kind of fault a test injects was
    /// met, where [`CallCounts::faulted_total`] shows only their sum.
    pub fn fired(&self) -> Vec<(FaultRule, u64)> {
        self.state.faults.read().fired()
    }

    /// Turns budget enforcement on (at `fraction` of AWS's limits) or off.
    /// Buckets start full at the new size.
    ///
    /// # Panics
    /// If `fraction` is not a positive finite number.
    pub fn set_budget_fraction(&self, fraction: Option<f64>) {
        let scope = *self.state.bucket_scope.lock();
        *self.state.budget.lock() = fraction.map(|fraction| Budget::new(fraction, scope));
    }

    /// Changes how calls share buckets (per category, the default, or per
    /// action); buckets start full.
    pub fn set_bucket_scope(&self, scope: BucketScope) {
        *self.state.bucket_scope.lock() = scope;
        let mut budget = self.state.budget.lock();
        if let Some(current) = budget.as_ref() {
            *budget = Some(Budget::new(current.fraction(), scope));
        }
    }

    /// Stops real time for the token buckets: from now on they refill only
    /// when the returned clock is advanced. Calling it again hands out the
    /// same clock.
    pub fn use_manual_clock(&self) -> ManualClock {
        let mut slot = self.state.manual_clock.write();
        slot.get_or_insert_with(|| ManualClock {
            // Starting at the real "now" keeps time monotonic for buckets
            // created earlier.
            now: Arc::new(Mutex::new(Instant::now())),
        })
        .clone()
    }

    /// Starts (or stops) keeping every call's parameters; off by default so
    /// long runs do not hold every body in memory.
    pub fn record_requests(&self, on: bool) {
        self.state.recording.store(on, Ordering::Release);
    }

    /// Evaluates every call from the CCM against `enforcer`'s policy first and
    /// answers as AWS does when it denies (`UnauthorizedOperation` for EC2,
    /// `AccessDenied` for ELB), or `DryRunOperation` for an allowed EC2
    /// `DryRun`. `None` turns enforcement off.
    pub fn enforce_iam(&self, enforcer: Option<IamEnforcer>) {
        *self.state.iam_enforcer.write() = enforcer.map(Arc::new);
    }

    /// The `iam/render.sh` options (e.g. `--legacy-cluster-tag`) that the
    /// recorded requests of this proxy need to be allowed; the IAM test
    /// renders the policy with them.
    pub fn set_iam_policy_options(&self, options: &[&str]) {
        *self.state.iam_policy_options.write() = options.iter().map(|o| o.to_string()).collect();
    }

    /// The recorded calls of `action` (any service), oldest first.
    pub fn requests(&self, action: &str) -> Vec<RecordedCall> {
        self.requests_of(&[action])
    }

    /// The recorded calls of any of `actions`, in the order received: what
    /// was asked for first, across actions.
    pub fn requests_of(&self, actions: &[&str]) -> Vec<RecordedCall> {
        self.state
            .recorded
            .lock()
            .iter()
            .filter(|c| actions.contains(&c.action.as_str()))
            .cloned()
            .collect()
    }

    /// The seed of the random source deciding which calls probabilistic
    /// faults hit: give it back as [`ProxyConfig::seed`] (or `--seed`) to
    /// replay a run.
    pub fn seed(&self) -> u64 {
        self.state.rolls.seed()
    }

    /// Restarts the random source from `seed`.
    pub fn reseed(&self, seed: u64) {
        self.state.rolls.reseed(seed);
    }

    /// Resources created from now on stay invisible for `delay`: calls naming
    /// them get the service's NotFound error and lists leave them out (see
    /// the `consistency` module). The window follows the bucket clock, so
    /// [`FaultProxy::use_manual_clock`] makes it exact.
    pub fn set_consistency_delay(&self, delay: Duration) {
        self.state.consistency.set_delay(delay);
    }

    /// How often the consistency window changed an answer: proof that the
    /// invisibility a test sets was met.
    pub fn consistency_hits(&self) -> ConsistencyHits {
        self.state.consistency.hits()
    }

    /// What `ec2:DescribeInstanceTopology` answers from now on (the proxy
    /// answers it itself; see the `topology` module for its rules).
    pub fn set_instance_topology(&self, instances: Vec<InstanceTopology>) {
        *self.state.topology.write() = instances;
    }

    /// From now on a `RegisterTargets` that would leave a load balancer
    /// with more than `quota` targets gets AWS's `TooManyTargets` (see the
    /// `target_quota` module for how AWS counts); `None` lifts the quota.
    /// A refusal counts as faulted.
    pub fn set_targets_per_load_balancer(&self, quota: Option<usize>) {
        *self.state.target_quota.write() = quota;
    }

    /// From now on an `AuthorizeSecurityGroupIngress` that would leave a
    /// group with more than `quota` inbound rules gets AWS's
    /// `RulesPerSecurityGroupLimitExceeded` (see the `rule_quota` module for
    /// how AWS counts); `None` leaves moto's own limit of 60. A refusal
    /// counts as faulted.
    pub fn set_rules_per_security_group(&self, quota: Option<usize>) {
        *self.state.rule_quota.write() = quota;
    }

    /// From now on a `CreateLoadBalancer` or `SetSecurityGroups` naming more
    /// than `quota` security groups is refused with `code` (HTTP 400; see the
    /// `nlb_groups` module: 5 and `InvalidConfigurationRequest` until a test
    /// says otherwise). A refusal counts as faulted.
    pub fn set_security_groups_per_load_balancer(&self, quota: usize, code: &'static str) {
        *self.state.groups_quota.write() = nlb_groups::GroupsQuota { quota, code };
    }

    /// The identity policy `iam:SimulatePrincipalPolicy` evaluates for the
    /// user, group or role `arn` (the proxy answers it itself; see the
    /// `simulate` module for its rules); `None` forgets it, and the
    /// principal is then unknown (`NoSuchEntity`) unless it is
    /// [`IAM_CCM_ROLE`] and a policy is enforced.
    pub fn set_iam_principal_policy(&self, arn: &str, policy: Option<&str>) -> anyhow::Result<()> {
        let mut principals = self.state.iam_principals.write();
        match policy {
            Some(text) => {
                let parsed = crate::iam::Policy::parse(text)
                    .map_err(|e| anyhow::anyhow!("the policy for {arn}: {e}"))?;
                principals.insert(arn.to_string(), Arc::new(parsed));
            }
            None => {
                principals.remove(arn);
            }
        }
        Ok(())
    }

    /// ECR Public's and ECR's `GetAuthorizationToken` stand-in (see the
    /// `ecr_public` module).
    pub fn ecr(&self) -> &EcrStandIn {
        &self.state.ecr
    }

    /// Sets the latency added to every forwarded call.
    pub fn set_latency(&self, latency: Duration) {
        *self.state.latency.write() = latency;
    }

    /// Lets `service` answer the calls it knows instead of the upstream,
    /// after the budget, faults and latency, which apply to them as to any
    /// call (`None` forwards everything again).
    pub fn serve_locally(&self, service: Option<Arc<dyn LocalService>>) {
        *self.state.local.write() = service;
    }
}

/// Something that answers some AWS calls in place of the upstream; see
/// [`FaultProxy::serve_locally`].
pub trait LocalService: Send + Sync {
    /// `None` to forward the call; otherwise the XML body of a 200 answer,
    /// or the error to answer with (encoded in the call's protocol).
    fn answer(
        &self,
        service: &str,
        action: &str,
        params: &[(String, String)],
    ) -> Option<Result<String, AwsError>>;
}

/// A call's form-decoded parameters from its query and body, without
/// `Action` and `Version`.
fn call_params(query: Option<&str>, body: &Bytes) -> Vec<(String, String)> {
    let body_text = std::str::from_utf8(body).unwrap_or_default();
    [query.unwrap_or_default(), body_text]
        .into_iter()
        .flat_map(request::form_pairs)
        .filter(|(k, _)| k != "Action" && k != "Version")
        .collect()
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops its JoinSet, which aborts every
        // connection task with it.
        self.server.abort();
    }
}

/// A call's parameters from `(name, value)` pairs, for the modules' tests.
#[cfg(test)]
pub(crate) fn test_params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn parse_upstream(upstream: &str) -> anyhow::Result<(Scheme, Authority)> {
    let uri: Uri = upstream
        .parse()
        .with_context(|| format!("upstream {upstream:?} is not a URL"))?;
    let scheme = uri
        .scheme()
        .cloned()
        .with_context(|| format!("upstream {upstream:?} has no scheme: use http://HOST:PORT"))?;
    if scheme != Scheme::HTTP {
        bail!(
            "upstream {upstream:?}: only http:// upstreams are supported (moto serves plain HTTP)"
        );
    }
    let authority = uri
        .authority()
        .cloned()
        .with_context(|| format!("upstream {upstream:?} has no host: use http://HOST:PORT"))?;
    if !matches!(uri.path(), "" | "/") {
        bail!("upstream {upstream:?}: a path prefix is not supported, give only http://HOST:PORT");
    }
    Ok((scheme, authority))
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(stream, Arc::clone(&state)));
                }
                Err(err) => {
                    // Usually EMFILE under load: back off briefly instead of
                    // spinning, then keep serving.
                    tracing::warn!(error = %err, "aws-fault-proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            // Reap finished connections so the set does not grow forever.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn serve_connection(stream: TcpStream, state: Arc<State>) {
    let reset = Arc::new(AtomicBool::new(false));
    let io = TokioIo::new(ResettableStream {
        inner: stream,
        reset: Arc::clone(&reset),
    });
    let service = service_fn(move |request| {
        let state = Arc::clone(&state);
        let reset = Arc::clone(&reset);
        async move { handle(state, request, reset).await }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .keep_alive(true)
        .serve_connection(io, service)
        .await;
    if let Err(err) = result {
        tracing::debug!(error = %err, "aws-fault-proxy connection ended with an error");
    }
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// Returned by the service to make hyper drop the connection unanswered.
#[derive(Debug)]
struct ResetConnection;

impl std::fmt::Display for ResetConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection reset injected by aws-fault-proxy")
    }
}

impl std::error::Error for ResetConnection {}

async fn handle(
    state: Arc<State>,
    request: Request<Incoming>,
    reset: Arc<AtomicBool>,
) -> Result<Response<ProxyBody>, ResetConnection> {
    let path = request.uri().path();
    if path.starts_with("/proxy-api/") {
        return Ok(proxy_api(&state, &request));
    }
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return Ok(plain_response(
                StatusCode::BAD_REQUEST,
                format!("aws-fault-proxy could not read the request body: {err}"),
            ));
        }
    };

    // moto's own API (reset, data) is test plumbing, not an AWS call.
    if parts.uri.path().starts_with("/moto-api/") {
        return Ok(forward(&state, parts, body).await);
    }
    let Some(call) = identify(&parts.headers, parts.uri.query(), &body) else {
        return Ok(forward(&state, parts, body).await);
    };

    let params = call_params(parts.uri.query(), &body);
    // A DryRun changes nothing: counted apart (`CreateRoute+DryRun`), so
    // "no writes" assertions keep meaning writes.
    let counted = dry_run::counted_action(&call.action, &params);
    let counters = &state.counters;
    counters.bump(&call.service, &counted, Outcome::Received);
    let enforcer = state.iam_enforcer.read().clone();
    let from_ccm = record::from_ccm(&parts.headers);
    if from_ccm && (state.recorder.is_on() || enforcer.is_some()) {
        let request = iam::recorded_request(&state, &parts.headers, &call, &params).await;
        state.recorder.record(&request);
        if let Some(answer) = enforcer.and_then(|e| e.answer(&request, &call)) {
            // An allowed DryRun is answered, not faulted: only denials count.
            if answer.code != "DryRunOperation" {
                counters.bump(&call.service, &counted, Outcome::Faulted);
            }
            return Ok(error_response(&answer, &call));
        }
    }
    if state.recording.load(Ordering::Acquire) {
        state.recorded.lock().push(RecordedCall {
            service: call.service.clone(),
            action: call.action.clone(),
            params: call_params(parts.uri.query(), &body).into_iter().collect(),
        });
    }

    let category = category_of_call(
        &call.service,
        &call.action,
        call.param_names.iter().map(String::as_str),
    );
    let now = state.now();
    let over_budget = {
        let mut budget = state.budget.lock();
        budget.as_mut().is_some_and(|budget| {
            budget.check(&call.service, &call.action, category, now) == BudgetDecision::Throttled
        })
    };
    if over_budget {
        counters.bump(&call.service, &counted, Outcome::Throttled);
        return Ok(error_response(&AwsError::throttling(call.protocol), &call));
    }

    let mut delay = *state.latency.read();
    let mut lost = None;
    let rules = Arc::clone(&state.faults.read());
    if !rules.is_empty() {
        let fault = rules
            .pick_for(&call.service, &call.action, &params, || state.rolls.roll())
            .cloned();
        if let Some(fault) = fault {
            counters.bump(&call.service, &counted, Outcome::Faulted);
            match fault {
                FaultKind::ServerError(status) => {
                    return Ok(error_response(
                        &AwsError::server_error(call.protocol, status),
                        &call,
                    ));
                }
                FaultKind::Throttle => {
                    return Ok(error_response(&AwsError::throttling(call.protocol), &call));
                }
                FaultKind::HtmlPage(status) => return Ok(html_page(status)),
                FaultKind::Error {
                    status,
                    code,
                    message,
                } => {
                    return Ok(error_response(&AwsError::new(status, code, message), &call));
                }
                FaultKind::ConnectionReset => {
                    reset.store(true, Ordering::Release);
                    return Err(ResetConnection);
                }
                FaultKind::Latency(extra) => delay += extra,
                FaultKind::AnswerLost(loss) => lost = Some(loss),
            }
        }
    }

    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(answer) = dry_run::answer(&call.service, &call.action, &params) {
        return Ok(error_response(&answer, &call));
    }
    if let Some(refusal) = limits::refuse(&call.service, &call.action, &params) {
        return Ok(error_response(&refusal, &call));
    }
    if let Some(missing) =
        state
            .consistency
            .refuse(&call.service, &call.action, &params, state.now())
    {
        return Ok(error_response(&missing, &call));
    }
    if let Some(refusal) =
        dualstack::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        deletion_protection::refuse(&state, &parts.headers, &call.service, &call.action, &params)
            .await
    {
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        tg_attributes::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        health_timeout::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        alpn::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        listener_attributes::refuse(&state, &parts.headers, &call.service, &call.action, &params)
            .await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        nlb_groups::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        target_quota::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    if let Some(refusal) =
        rule_quota::refuse(&state, &parts.headers, &call.service, &call.action, &params).await
    {
        counters.bump(&call.service, &counted, Outcome::Faulted);
        return Ok(error_response(&refusal, &call));
    }
    counters.bump(&call.service, &counted, Outcome::Forwarded);
    let answer = applied_regardless_of_caller(&state, parts, body, &call, &params).await;
    match lost {
        None => Ok(answer),
        Some(loss) => {
            // AWS has applied the call once its whole answer is in.
            let _ = answer.into_body().collect().await;
            if let AnswerLoss::Stall(hold) = loss {
                tokio::time::sleep(hold).await;
            }
            reset.store(true, Ordering::Release);
            Err(ResetConnection)
        }
    }
}

/// The answer to a call AWS has accepted. AWS goes on applying a call whose
/// caller hung up (a client timeout, a killed process), so the work runs in its
/// own task: dropping the caller's connection does not cancel it.
async fn applied_regardless_of_caller(
    state: &Arc<State>,
    parts: http::request::Parts,
    body: Bytes,
    call: &AwsCall,
    params: &[(String, String)],
) -> Response<ProxyBody> {
    let state = Arc::clone(state);
    let call = call.clone();
    let params = params.to_vec();
    let applying = tokio::spawn(async move {
        let answer = upstream_answer(&state, parts, body, &call, &params).await;
        seen_by_consistency(&state, &call, &params, answer).await
    });
    match applying.await {
        Ok(answer) => answer,
        Err(err) => plain_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("aws-fault-proxy lost the upstream call: {err}"),
        ),
    }
}

/// The answer to an AWS call: the local service's, or the upstream's.
async fn upstream_answer(
    state: &State,
    parts: http::request::Parts,
    body: Bytes,
    call: &AwsCall,
    params: &[(String, String)],
) -> Response<ProxyBody> {
    if call.service == SERVICE_EC2 && call.action == "DescribeInstanceTopology" {
        let answer = topology::answer(&state.topology.read(), params);
        return match answer {
            Ok(xml) => xml_response(xml),
            Err(e) => error_response(&e, call),
        };
    }
    if call.service == "iam" && call.action == "SimulatePrincipalPolicy" {
        let enforcer = state.iam_enforcer.read().clone();
        let answer = simulate::answer(
            params,
            &state.iam_principals.read(),
            enforcer.as_deref().map(|e| &e.policy),
        );
        return match answer {
            Ok(xml) => xml_response(xml),
            Err(e) => error_response(&e, call),
        };
    }
    if let Some(answer) = state.ecr.answer(call, &parts.headers) {
        return answer.map(|body| {
            Full::new(body)
                .map_err(|never: Infallible| match never {})
                .boxed()
        });
    }
    if tg_links::wants(&call.service, &call.action)
        && let Some(answer) = tg_links::answer(state, &parts.headers, params).await
    {
        return match answer {
            Ok(xml) => xml_response(xml),
            Err(e) => error_response(&e, call),
        };
    }
    if alpn::answers(state, call) {
        return alpn::answer(state, parts, body, call, params).await;
    }
    let local = state.local.read().clone();
    if let Some(local) = local {
        match local.answer(&call.service, &call.action, params) {
            Some(Ok(xml)) => return xml_response(xml),
            Some(Err(e)) => return error_response(&e, call),
            None => {}
        }
    }
    forward(state, parts, body).await
}

/// `answer`, after the consistency window has seen it: a create starts a
/// window, a list leaves out what is still inside one.
async fn seen_by_consistency(
    state: &State,
    call: &AwsCall,
    params: &[(String, String)],
    answer: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let now = state.now();
    if answer.status() != StatusCode::OK
        || !state
            .consistency
            .wants_answer(&call.service, &call.action, now)
    {
        return answer;
    }
    let (mut parts, body) = answer.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(err) => {
            return plain_response(
                StatusCode::BAD_GATEWAY,
                format!("aws-fault-proxy lost the upstream's answer: {err}"),
            );
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    let bytes = match state
        .consistency
        .observe(&call.service, &call.action, params, &text, now)
    {
        Some(rewritten) => {
            parts.headers.remove(http::header::CONTENT_LENGTH);
            Bytes::from(rewritten)
        }
        None => bytes,
    };
    Response::from_parts(
        parts,
        Full::new(bytes)
            .map_err(|never: Infallible| match never {})
            .boxed(),
    )
}

/// Sends the request to the upstream unchanged (method, path, query, headers,
/// body) and streams the answer back.
async fn forward(state: &State, parts: http::request::Parts, body: Bytes) -> Response<ProxyBody> {
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let uri = match Uri::builder()
        .scheme(state.upstream_scheme.clone())
        .authority(state.upstream_authority.clone())
        .path_and_query(path_and_query)
        .build()
    {
        Ok(uri) => uri,
        Err(err) => {
            return plain_response(
                StatusCode::BAD_REQUEST,
                format!("aws-fault-proxy cannot build the upstream URL: {err}"),
            );
        }
    };
    let mut upstream_request = Request::new(Full::new(body));
    *upstream_request.method_mut() = parts.method;
    *upstream_request.uri_mut() = uri;
    *upstream_request.headers_mut() = parts.headers;
    match state.client.request(upstream_request).await {
        Ok(response) => response.map(BodyExt::boxed),
        Err(err) => plain_response(
            StatusCode::BAD_GATEWAY,
            format!(
                "aws-fault-proxy could not reach upstream {}://{}: {err}",
                state.upstream_scheme, state.upstream_authority
            ),
        ),
    }
}

fn proxy_api(state: &State, request: &Request<Incoming>) -> Response<ProxyBody> {
    match (request.method(), request.uri().path()) {
        (&http::Method::GET, "/proxy-api/counts") => {
            let json = state.counters.snapshot().to_json().to_string();
            let mut response = full_response(StatusCode::OK, json);
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            response
        }
        (&http::Method::POST, "/proxy-api/reset-counts") => {
            state.counters.reset();
            full_response(StatusCode::OK, "{}".to_owned())
        }
        (method, path) => plain_response(
            StatusCode::NOT_FOUND,
            format!(
                "aws-fault-proxy has no {method} {path}: use GET /proxy-api/counts or POST /proxy-api/reset-counts"
            ),
        ),
    }
}

fn error_response(error: &AwsError, call: &AwsCall) -> Response<ProxyBody> {
    error.to_response(call).map(|body| {
        Full::new(body)
            .map_err(|never: Infallible| match never {})
            .boxed()
    })
}

fn xml_response(xml: String) -> Response<ProxyBody> {
    let mut response = full_response(StatusCode::OK, xml);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/xml;charset=UTF-8"),
    );
    response
}

/// A 5xx as a proxy in front of the service answers it: an HTML page.
fn html_page(status: u16) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let reason = status.canonical_reason().unwrap_or("Error");
    let page = format!(
        "<!DOCTYPE html>\n<html><head><title>{code} {reason}</title></head>\n\
         <body><h1>{code} {reason}</h1><p>The server is temporarily unable to service \
         your request. Please try again later.</p></body></html>\n",
        code = status.as_u16()
    );
    let mut response = full_response(status, page);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    response
}

fn full_response(status: StatusCode, body: String) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

fn plain_response(status: StatusCode, message: String) -> Response<ProxyBody> {
    let mut response = full_response(status, message);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The accepted TCP stream, able to end in a reset: when the handler injects
/// `ConnectionReset`, dropping the stream sets `SO_LINGER` to zero first so
/// the kernel sends RST instead of an orderly FIN, as a crashed server would.
struct ResettableStream {
    inner: TcpStream,
    reset: Arc<AtomicBool>,
}

impl Drop for ResettableStream {
    fn drop(&mut self) {
        if self.reset.load(Ordering::Acquire)
            && let Err(err) = self.inner.set_zero_linger()
        {
            tracing::debug!(error = %err, "aws-fault-proxy could not arm a connection reset");
        }
    }
}

impl AsyncRead for ResettableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ResettableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
