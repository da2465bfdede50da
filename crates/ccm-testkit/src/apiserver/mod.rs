//! A Kubernetes API test server: an in-process, plain-HTTP stand-in for
//! kube-apiserver that every Kubernetes-side test and `make sandbox` use.
//!
//! It stores objects of a fixed table of resources (core/v1 nodes,
//! services, endpoints, events, namespaces, configmaps, pods,
//! serviceaccounts;
//! events.k8s.io/v1 events; coordination.k8s.io/v1 leases;
//! discovery.k8s.io/v1 endpointslices) as generic JSON and behaves as the
//! real server does where clients can tell: resourceVersions and
//! conflicts, `Status` errors, list pagination and resourceVersion
//! semantics, watches with bookmarks and `410 Expired`, the four patch
//! types including server-side apply with managedFields, status
//! subresources, and finalizers.
//!
//! # Differences from kube-apiserver
//!
//! Kept on purpose small; each is what a test of the CCM cannot observe or
//! does not need:
//! - Plain HTTP on loopback; no admission or protobuf (JSON is always
//!   served). Credentials are checked only when RBAC is enforced
//!   ([`ServerOptions::rbac_policy`]): then a registered bearer token
//!   ([`TestApiServer::add_token`]) is authorized by the policy's roles
//!   and bindings (403 with kube-apiserver's Forbidden text), an unknown
//!   token is 401, and a request without a token passes as the test's own
//!   cluster-admin. TokenReview and SubjectAccessReview answer for the
//!   registered tokens and non-resource grants ([`TestApiServer::grant`]);
//!   SelfSubjectAccessReview answers for the requester from the enforced
//!   RBAC rules (allowed without RBAC or without a token); these three are
//!   not in discovery. `dryRun` is rejected with 400 rather
//!   than silently persisted; `fieldValidation` is accepted and ignored.
//! - `as=Table` answers lists and gets with kube-apiserver's columns for
//!   nodes, services, events and leases (Name/Created At for the rest), not
//!   watches. `/openapi/v2` (JSON only) and `/openapi/v3` serve the real
//!   schemas of the served kinds (see `openapi/gen-openapi.py`).
//! - Validation covers names, `generateName`, finalizers on deleting
//!   objects, node `providerID`/`podCIDRs` and service `clusterIP`
//!   immutability, node ports already in use, and service source ranges
//!   (CIDRs, `type: LoadBalancer` only); other fields are stored
//!   as sent. Defaulting covers services (type, protocol, targetPort, node
//!   ports, health check node port, cluster IP, policies) and the status
//!   the create strategies set for services, pods and namespaces.
//! - No garbage collector and no graceful pod deletion: `propagationPolicy`
//!   is accepted and ignored, pods without finalizers go at once, and a
//!   namespace without finalizers is removed at once with its contents.
//! - `metadata.generation` is kept for resources with a spec (nodes,
//!   services, pods) and bumps on any change outside metadata and status.
//! - Harshness on demand ([`ServerOptions`]): watches dropped every few
//!   seconds, compaction on a timer, a watch cache lagging writes (its
//!   view is rebuilt from history, so a lag longer than `history_size`
//!   writes is not modelled), and [`FailureRule`]s.
//! - Watches: bookmarks go out on every `bookmark_interval` tick; a watcher
//!   too far behind (more than the history size, at most 8192 changes) is
//!   closed without an ERROR event and resumes from its last
//!   resourceVersion, or gets 410 if that is gone. A watch from a future
//!   resourceVersion starts now.
//! - Lists at `resourceVersion=0` are served from the current state and
//!   honour `limit`. Continue tokens are opaque and name a frozen snapshot
//!   kept for 5 minutes (256 at most); an evicted or compacted one is 410.
//! - Server-side apply tracks leaves, keyed list items (`k:`) and set items
//!   (`v:`) but writes no `.` for maps; lists not in the resource table are
//!   atomic. managedFields sent with a create are ignored.
//! - kube's default client retries 429, 503 and 504 by itself (up to 15
//!   times, honouring `Retry-After`), so an injected burst of those codes is
//!   invisible through [`TestApiServer::client`] unless it outlasts the
//!   retries; build a client with `default_retry = false` to see them.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use ccm_testkit::apiserver::TestApiServer;
//! use k8s_openapi::api::core::v1::Node;
//! let server = TestApiServer::start().await?;
//! let nodes: kube::Api<Node> = kube::Api::all(server.client().await?);
//! assert!(nodes.list(&Default::default()).await?.items.is_empty());
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod admission;
mod errors;
mod http;
mod openapi;
mod patch;
pub mod rbac;
mod resources;
mod reviews;
mod selectors;
mod ssa;
mod store;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use self::http::Shared;
use self::resources::{NAMESPACES, RESOURCES};
pub use self::reviews::{NonResourceGrant, Subject, TokenUser};
use self::store::{Store, Writer};

/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public", "kube-node-lease"];

/// How long [`TestApiServer::shutdown`] waits for connections to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Settings of a [`TestApiServer`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// How often watchers that asked for bookmarks get a BOOKMARK event.
    pub bookmark_interval: Duration,
    /// Changes kept per resource for watch resumption and exact lists;
    /// a watch from an older resourceVersion gets 410 Expired.
    pub history_size: usize,
    /// Port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    /// End every open watch this often, as kube-apiserver ends watches
    /// when their (randomised) timeout passes or it restarts; clients
    /// re-watch from their last resourceVersion. `None`: never.
    pub watch_drop_every: Option<Duration>,
    /// Compact this often (see [`TestApiServer::compact`]): a watch
    /// resumed from before the last compaction gets 410 Gone and must
    /// relist. `None`: never.
    pub compact_every: Option<Duration>,
    /// How long the watch cache lags behind writes: watch events, and
    /// lists and gets at `resourceVersion=0` (or a list at a version the
    /// cache has seen), see a write this much later. Quorum reads (no
    /// resourceVersion) see it at once. Zero: no lag.
    pub watch_cache_lag: Duration,
    /// RBAC to enforce, as the YAML of ClusterRoles, Roles and bindings
    /// (e.g. `manifests/base/rbac.yaml`): requests with a bearer token
    /// registered by [`TestApiServer::add_token`] are authorized by it (403
    /// otherwise), unknown tokens get 401, requests without a token pass.
    pub rbac_policy: Option<String>,
    /// Record each distinct request of an authenticated user here (see
    /// [`rbac`]); needs `rbac_policy`.
    pub record_dir: Option<PathBuf>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            bookmark_interval: Duration::from_secs(1),
            history_size: 10_000,
            port: 0,
            watch_drop_every: None,
            compact_every: None,
            watch_cache_lag: Duration::ZERO,
            rbac_policy: None,
            record_dir: None,
        }
    }
}

/// What the server's own chaos ([`ServerOptions::watch_drop_every`],
/// [`ServerOptions::compact_every`], [`ServerOptions::watch_cache_lag`], or
/// [`TestApiServer::close_watches`] and [`TestApiServer::compact`]) did to
/// its clients so far: proof that each disruption a test configures was met.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Disruptions {
    /// Open watch streams ended by a drop (not by their timeout or the
    /// server's shutdown).
    pub watches_dropped: u64,
    /// 410 Gone answers (a watch, exact list or continue token older than
    /// the history kept), injected failures apart.
    pub expired: u64,
    /// Changes the lagging watch cache delivered late to open watches.
    pub lagged_events: u64,
    /// Reads served from the lagging watch cache (`resourceVersion=0` gets
    /// and lists) that missed a write already made.
    pub stale_reads: u64,
}

/// Identifies a class of requests in [`RequestStats`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestKey {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`; for non-resource paths the lower-case HTTP method.
    pub verb: String,
    /// API group, empty for core.
    pub group: String,
    /// `plural` or `plural/subresource`; for non-resource paths, the path.
    pub resource: String,
}

/// Request counts by verb and resource, as seen by the server.
///
/// A resource is named `plural`, `plural/status`, or with its group to
/// tell apart resources of the same plural: `events.events.k8s.io`,
/// `leases.coordination.k8s.io/…`. A bare `events` counts both groups;
/// `*` counts every resource.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestStats {
    counts: BTreeMap<RequestKey, u64>,
    conflicts: BTreeMap<RequestKey, u64>,
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

/// Parses a resource name of [`RequestStats`]/[`FailureRule`]:
/// (plural with subresource, group if named).
fn parse_resource(resource: &str) -> (String, Option<String>) {
    let (gr, sub) = match resource.split_once('/') {
        Some((gr, sub)) => (gr, Some(sub)),
        None => (resource, None),
    };
    let (plural, group) = match gr.split_once('.') {
        Some((p, g)) => (p, Some(g.to_string())),
        None => (gr, None),
    };
    let name = match sub {
        Some(s) => format!("{plural}/{s}"),
        None => plural.to_string(),
    };
    (name, group)
}

fn resource_matches(pattern: &str, key: &RequestKey) -> bool {
    if pattern == "*" {
        return true;
    }
    if pattern.starts_with('/') {
        return key.resource == pattern;
    }
    let (name, group) = parse_resource(pattern);
    key.resource == name && group.is_none_or(|g| g == key.group)
}

impl RequestStats {
    /// Requests with this verb on this resource (see the type docs for names).
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|(k, _)| k.verb == verb && resource_matches(resource, k))
            .map(|(_, n)| n)
            .sum()
    }

    /// Requests with this verb on this resource that the store answered
    /// 409 Conflict (a write carrying a stale resourceVersion, or a create
    /// of an existing name): a client's optimistic-concurrency retries.
    pub fn conflicts(&self, verb: &str, resource: &str) -> u64 {
        self.conflicts
            .iter()
            .filter(|(k, _)| k.verb == verb && resource_matches(resource, k))
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes (create, update, patch, delete, deletecollection) on a resource.
    pub fn writes(&self, resource: &str) -> u64 {
        WRITE_VERBS.iter().map(|v| self.count(v, resource)).sum()
    }

    /// Writes on every resource.
    pub fn total_writes(&self) -> u64 {
        self.writes("*")
    }

    /// All requests, discovery included.
    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }

    /// Every (key, count) pair, sorted.
    pub fn entries(&self) -> impl Iterator<Item = (&RequestKey, u64)> {
        self.counts.iter().map(|(k, n)| (k, *n))
    }
}

/// A failure to inject: matching requests answer with `code` and the body
/// kube-apiserver sends for it instead of being served:
/// - 409: the optimistic-concurrency `Conflict` Status of the object
///   ("Operation cannot be fulfilled on nodes \"n1\": the object has been
///   modified; …"); with [`FailureRule::compare_and_swap`] only writes that
///   carry a resourceVersion (a PUT, a patch naming
///   `metadata.resourceVersion`, a DELETE with a resourceVersion
///   precondition) fail, as only those can conflict.
/// - 429: the priority-and-fairness rejection, a plain-text
///   `Too many requests, please try again later.` with `Retry-After`
///   ([`FailureRule::retry_after`], 1 s by default).
/// - 500: `InternalError`, "Internal error occurred: …".
/// - 503: `ServiceUnavailable`; 504: the timeout filter's `Timeout`.
///
/// [`FailureRule::slow`] makes matching requests wait and then be served.
///
/// ```
/// use ccm_testkit::apiserver::FailureRule;
/// // The next two PATCHes of any node's status answer 500.
/// let rule = FailureRule::new("patch", "nodes/status", 500).times(2);
/// // Every compare-and-swap update of a Lease conflicts.
/// let cas = FailureRule::new("update", "leases", 409).compare_and_swap().always();
/// # let _ = (rule, cas);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FailureRule {
    /// Verb as in [`RequestKey::verb`]; `None` matches any.
    pub verb: Option<String>,
    /// Resource as in [`RequestStats`]; `None` matches any.
    pub resource: Option<String>,
    /// Object name; `None` matches any.
    pub name: Option<String>,
    /// Namespace; `None` matches any.
    pub namespace: Option<String>,
    /// HTTP status code to answer with; 0 serves the request (after `delay`).
    pub code: u16,
    /// Message of the `Status`; a standard one for the code if `None`.
    pub message: Option<String>,
    /// How many requests fail; `None` means every one until cleared.
    pub times: Option<u32>,
    /// Wait this long before answering (to exercise client timeouts).
    pub delay: Option<Duration>,
    /// Only writes that carry a resourceVersion precondition match.
    pub compare_and_swap: bool,
    /// `Retry-After` seconds (429 always has one: 1 unless set).
    pub retry_after: Option<u64>,
}

impl FailureRule {
    /// Fails the next matching request (use [`FailureRule::times`] for more).
    /// `verb` and `resource` may be `"*"` for any.
    pub fn new(verb: &str, resource: &str, code: u16) -> FailureRule {
        let any = |s: &str| (s != "*" && !s.is_empty()).then(|| s.to_string());
        FailureRule {
            verb: any(verb),
            resource: any(resource),
            name: None,
            namespace: None,
            code,
            message: None,
            times: Some(1),
            delay: None,
            compare_and_swap: false,
            retry_after: None,
        }
    }

    /// Matching requests wait `delay` and are then served normally (the
    /// next one; use [`FailureRule::times`] or [`FailureRule::always`]
    /// for more).
    pub fn slow(verb: &str, resource: &str, delay: Duration) -> FailureRule {
        FailureRule::new(verb, resource, 0).delay(delay)
    }

    /// Only writes carrying a resourceVersion precondition match: the
    /// compare-and-swap writes that can meet a 409 Conflict.
    pub fn compare_and_swap(mut self) -> FailureRule {
        self.compare_and_swap = true;
        self
    }

    /// Send `Retry-After: secs` (and `details.retryAfterSeconds`).
    pub fn retry_after(mut self, secs: u64) -> FailureRule {
        self.retry_after = Some(secs);
        self
    }

    /// Fails the next `n` matching requests.
    pub fn times(mut self, n: u32) -> FailureRule {
        self.times = Some(n);
        self
    }

    /// Fails every matching request until [`TestApiServer::clear_failures`].
    pub fn always(mut self) -> FailureRule {
        self.times = None;
        self
    }

    /// Only requests for this object name.
    pub fn name(mut self, name: &str) -> FailureRule {
        self.name = Some(name.to_string());
        self
    }

    /// Only requests in this namespace.
    pub fn namespace(mut self, ns: &str) -> FailureRule {
        self.namespace = Some(ns.to_string());
        self
    }

    /// The `Status` message to send.
    pub fn message(mut self, message: &str) -> FailureRule {
        self.message = Some(message.to_string());
        self
    }

    /// Wait before answering.
    pub fn delay(mut self, d: Duration) -> FailureRule {
        self.delay = Some(d);
        self
    }

    fn matches(&self, key: &RequestKey, ns: &str, name: &str, cas: bool) -> bool {
        (cas || !self.compare_and_swap)
            && self.verb.as_deref().is_none_or(|v| v == key.verb)
            && self
                .resource
                .as_deref()
                .is_none_or(|r| resource_matches(r, key))
            && self.name.as_deref().is_none_or(|n| n == name)
            && self.namespace.as_deref().is_none_or(|n| n == ns)
    }
}

#[derive(Clone, Copy)]
enum Periodic {
    DropWatches,
    Compact,
}

/// A running test server. Dropping it stops serving (in-flight watches end).
pub struct TestApiServer {
    shared: Arc<Shared>,
    url: String,
    tasks: Vec<JoinHandle<()>>,
}

impl TestApiServer {
    /// Starts on 127.0.0.1 with an ephemeral port and default options.
    pub async fn start() -> anyhow::Result<TestApiServer> {
        Self::start_with(ServerOptions::default()).await
    }

    /// Starts with the given options.
    pub async fn start_with(opts: ServerOptions) -> anyhow::Result<TestApiServer> {
        crate::servers_allowed("the Kubernetes API test server")?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port))
            .await
            .with_context(|| format!("binding kube-test-server to 127.0.0.1:{}", opts.port))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let url = format!("http://{addr}");
        let cancel = CancellationToken::new();
        let rbac = match &opts.rbac_policy {
            Some(yaml) => {
                Some(rbac::RbacPolicy::parse(yaml).context("parsing the RBAC policy to enforce")?)
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            rbac,
            recorder: rbac::Recorder::new(opts.record_dir.clone(), addr.port()),
            store: Store::new(opts.history_size, opts.watch_cache_lag),
            stats: parking_lot::Mutex::new(HashMap::new()),
            conflicts: parking_lot::Mutex::new(HashMap::new()),
            failures: parking_lot::Mutex::new(Vec::new()),
            fired: parking_lot::Mutex::new(Default::default()),
            cancel: cancel.clone(),
            watch_cancel: parking_lot::Mutex::new(cancel.child_token()),
            address: addr.to_string(),
            reviews: Default::default(),
            routes: Default::default(),
        });
        let w = Writer {
            manager: "kube-apiserver".into(),
            ..Default::default()
        };
        for ns in INITIAL_NAMESPACES {
            shared
                .store
                .create(
                    NAMESPACES,
                    "",
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                    &w,
                    false,
                )
                .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {e}"))?;
        }

        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let shutdown = cancel.clone();
        let serve = tokio::spawn(async move {
            let result = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
            if let Err(e) = result {
                tracing::warn!(error = %e, "kube-test-server stopped serving");
            }
        });
        let ticker_shared = shared.clone();
        let interval = opts.bookmark_interval.max(Duration::from_millis(10));
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = ticker_shared.cancel.cancelled() => break,
                    _ = tick.tick() => ticker_shared.store.tick(),
                }
            }
        });
        let mut tasks = vec![serve, ticker];
        let cache_shared = shared.clone();
        tasks.push(tokio::spawn(async move {
            cache_shared
                .store
                .run_watch_cache(cache_shared.cancel.clone())
                .await;
        }));
        for (every, action) in [
            (opts.watch_drop_every, Periodic::DropWatches),
            (opts.compact_every, Periodic::Compact),
        ] {
            let Some(every) = every else { continue };
            let sh = shared.clone();
            tasks.push(tokio::spawn(async move {
                let every = every.max(Duration::from_millis(1));
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = sh.cancel.cancelled() => break,
                        _ = tick.tick() => match action {
                            Periodic::DropWatches => sh.close_watches(),
                            Periodic::Compact => sh.store.compact(),
                        },
                    }
                }
            }));
        }
        Ok(TestApiServer { shared, url, tasks })
    }

    /// Serves the admission webhooks whose `clientConfig.service` is
    /// `namespace/name` on `port` from `addr` (a test's stand-in for the
    /// Service's endpoints); the webhook's certificate must name
    /// `<name>.<namespace>.svc`.
    pub fn route_service(
        &self,
        namespace: &str,
        name: &str,
        port: u16,
        addr: std::net::SocketAddr,
    ) {
        self.shared.routes.add(namespace, name, port, addr);
    }

    /// The base URL, e.g. `http://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// A kubeconfig whose current context points at [`TestApiServer::url`]
    /// with namespace `default` and no credentials.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: kube-test-server\n  cluster:\n    server: {url}\n\
             users:\n\
             - name: kube-test-server\n  user: {{}}\n\
             contexts:\n\
             - name: kube-test-server\n  context:\n    cluster: kube-test-server\n    user: kube-test-server\n    namespace: default\n\
             current-context: kube-test-server\n",
            url = self.url
        )
    }

    /// [`TestApiServer::kubeconfig_yaml`] whose user sends `token` as a
    /// bearer token (register it with [`TestApiServer::add_token`]).
    pub fn kubeconfig_yaml_with_token(&self, token: &str) -> String {
        self.kubeconfig_yaml()
            .replace("user: {}\n", &format!("user:\n    token: {token}\n"))
    }

    /// Writes [`TestApiServer::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
            .with_context(|| format!("writing kubeconfig to {}", path.display()))
    }

    /// A kube client for this server (default namespace `default`).
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let uri = self
            .url
            .parse()
            .with_context(|| format!("parsing server url {}", self.url))?;
        let config = kube::Config::new(uri);
        kube::Client::try_from(config).context("building a kube client for the test server")
    }

    /// A copy of the request counts so far.
    pub fn stats(&self) -> RequestStats {
        RequestStats {
            counts: self
                .shared
                .stats
                .lock()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            conflicts: self
                .shared
                .conflicts
                .lock()
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
        }
    }

    /// What the server's chaos did to its clients so far.
    pub fn disruptions(&self) -> Disruptions {
        self.shared.store.disruptions.snapshot()
    }

    /// Forgets the request counts.
    pub fn reset_stats(&self) {
        self.shared.stats.lock().clear();
        self.shared.conflicts.lock().clear();
    }

    /// Drops all watch history and pagination snapshots, as an etcd
    /// compaction does: a watch or exact list from any older
    /// resourceVersion now gets 410 Gone.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// Ends every open watch stream now, as an apiserver restart would;
    /// clients re-watch from their last resourceVersion.
    pub fn close_watches(&self) {
        self.shared.close_watches();
    }

    /// The current (global) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    /// Arms a failure rule; rules are checked in the order they were added.
    pub fn inject_failure(&self, rule: FailureRule) {
        self.shared.failures.lock().push(rule);
    }

    /// Makes TokenReview accept `token` as `user` (the server adds
    /// `system:authenticated` to its groups, as kube-apiserver does).
    pub fn add_token(&self, token: &str, user: TokenUser) {
        self.shared
            .reviews
            .tokens
            .lock()
            .insert(token.to_string(), user);
    }

    /// Lets a user or group use verbs on non-resource URLs in
    /// SubjectAccessReviews (RBAC matching: `*`, a trailing `*`, or exact).
    pub fn grant(&self, grant: NonResourceGrant) {
        self.shared.reviews.grants.lock().push(grant);
    }

    /// How many requests the rules armed with this verb, resource and code
    /// answered (failed, or delayed for code 0): proof a fault fired.
    pub fn fired(&self, verb: &str, resource: &str, code: u16) -> u64 {
        self.shared
            .fired
            .lock()
            .get(&(verb.replace('*', ""), resource.replace('*', ""), code))
            .copied()
            .unwrap_or(0)
    }

    /// Disarms every failure rule.
    pub fn clear_failures(&self) {
        self.shared.failures.lock().clear();
    }

    /// Creates the objects of a multi-document YAML (documents may also be
    /// `kind: List`). Namespaces go first; pre-created namespaces are
    /// skipped; namespaced objects without a namespace go to `default`.
    /// Server-set metadata (resourceVersion, uid, …) in the YAML is
    /// ignored, and a `status` is kept as written, even for resources
    /// whose create resets it.
    pub async fn seed_yaml(&self, multi_doc_yaml: &str) -> anyhow::Result<()> {
        let mut docs = Vec::new();
        for (i, doc) in serde_yaml::Deserializer::from_str(multi_doc_yaml).enumerate() {
            let v: Value = serde::Deserialize::deserialize(doc)
                .with_context(|| format!("parsing YAML document {}", i + 1))?;
            match v {
                Value::Null => {}
                v if v
                    .get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
                {
                    docs.extend(
                        v.get("items")
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default(),
                    );
                }
                v => docs.push(v),
            }
        }
        docs.sort_by_key(|d| d.get("kind").and_then(Value::as_str) != Some("Namespace"));
        let w = Writer {
            manager: "kube-test-server".into(),
            ..Default::default()
        };
        for mut doc in docs {
            let api_version = doc
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let kind = doc
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let Some(res) = resources::find_kind(&api_version, &kind) else {
                bail!("seed: kube-test-server does not serve {api_version} {kind}");
            };
            let def = &RESOURCES[res];
            if let Some(meta) = doc.get_mut("metadata").and_then(Value::as_object_mut) {
                for k in [
                    "resourceVersion",
                    "uid",
                    "creationTimestamp",
                    "managedFields",
                    "generation",
                ] {
                    meta.remove(k);
                }
            }
            let name = doc
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let ns = match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
                Some(ns) if def.namespaced => ns.to_string(),
                _ if def.namespaced => "default".to_string(),
                _ => String::new(),
            };
            if res == NAMESPACES && INITIAL_NAMESPACES.contains(&name.as_str()) {
                continue;
            }
            let status = doc.get("status").cloned();
            let created = self
                .shared
                .store
                .create(res, &ns, doc, &w, false)
                .map_err(|e| anyhow::anyhow!("seed: creating {kind} {ns}/{name}: {e}"))?;
            if let Some(status) = status
                && def.status_subresource
                && created.value.get("status") != Some(&status)
            {
                let created_name = created
                    .value
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let mut with_status = created.value.clone();
                with_status["status"] = status;
                self.shared
                    .store
                    .update(res, &ns, &created_name, with_status, Some("status"), &w)
                    .map_err(|e| {
                        anyhow::anyhow!("seed: setting the status of {kind} {ns}/{name}: {e}")
                    })?;
            }
        }
        Ok(())
    }

    /// Stops serving: watches end, connections close, the port is freed.
    pub async fn shutdown(mut self) {
        self.shared.cancel.cancel();
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        // Cancelling ends the watches and starts a graceful shutdown that
        // finishes in the background; aborting the serve task instead would
        // leave its connection tasks running.
        self.shared.cancel.cancel();
    }
}

impl std::fmt::Debug for TestApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestApiServer")
            .field("url", &self.url)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apiserver_stats_resource_names() {
        let mut stats = RequestStats::default();
        let key = |verb: &str, group: &str, resource: &str| RequestKey {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
        };
        stats.counts.insert(key("patch", "", "nodes/status"), 2);
        stats.counts.insert(key("create", "", "events"), 1);
        stats
            .counts
            .insert(key("create", "events.k8s.io", "events"), 3);
        stats
            .counts
            .insert(key("get", "coordination.k8s.io", "leases"), 4);
        assert_eq!(stats.count("patch", "nodes/status"), 2);
        assert_eq!(stats.count("patch", "nodes"), 0);
        assert_eq!(stats.writes("events"), 4);
        assert_eq!(stats.writes("events.events.k8s.io"), 3);
        assert_eq!(stats.count("get", "leases.coordination.k8s.io"), 4);
        assert_eq!(stats.total_writes(), 6);
        assert_eq!(stats.total(), 10);
    }

    #[test]
    fn apiserver_failure_rule_matching() {
        let key = RequestKey {
            verb: "patch".into(),
            group: String::new(),
            resource: "nodes/status".into(),
        };
        assert!(FailureRule::new("patch", "nodes/status", 500).matches(&key, "", "n1", false));
        assert!(FailureRule::new("*", "*", 500).matches(&key, "", "n1", false));
        assert!(!FailureRule::new("patch", "nodes", 500).matches(&key, "", "n1", false));
        assert!(
            !FailureRule::new("patch", "nodes/status", 500)
                .name("n2")
                .matches(&key, "", "n1", false)
        );
    }
}
