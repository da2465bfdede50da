// Not kube-runtime's Controller: a node change must re-sync only the Services whose backend set it changes, found by diffing every Service against the whole node cache per scan, which per-object triggers cannot express.
//! Service controller: a load balancer for each `type: LoadBalancer` Service
//! without `spec.loadBalancerClass`, as k8s.io/cloud-provider's controller.
//!
//! Work is decided from the shared informer caches: a Service is synced when
//! its own fingerprint (spec, annotations, deletion, finalizers) changed, when
//! its backend instance set changed at a node change upstream syncs on
//! ([`node_set`]; so a node change only touches Services whose backends it
//! changes, and a taint or deletionTimestamp alone none), when a failed
//! sync's backoff (5 s doubling to
//! 300 s) is due or the failed Service changed since, or at the periodic
//! resync. At most `--concurrent-service-syncs` syncs run at once; one
//! Service never has two. A sync that meets a `DependencyViolation` (a group
//! its load balancer's network interfaces release late) gives its slot back
//! and is retried within a second or a few, for up to two minutes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::ControllerContext;
use super::events::Events;
use super::schedule::settle::Settle;
use super::schedule::{self, Wake};
use crate::backoff::Backoff;
use crate::provider::Cloud;
use crate::provider::load_balancers::{
    EnsureRequest, LoadBalancerSpec, LoadBalancers, Scope, TYPE, is_external,
};

mod due;
mod scope;

use due::{decide, next_due};

pub const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Retries of a failed sync: upstream's `minRetryDelay` to `maxRetryDelay`.
const FAILED: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
/// Retries of a sync waiting for AWS to release a resource: from 1 s,
/// doubling every 10 s of waiting up to 10 s, for at most
/// [`DEPENDENCY_PATIENCE`]; then it fails with a Warning like any other error.
const WAITING: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
const DEPENDENCY_PATIENCE: Duration = Duration::from_secs(120);
/// Longest wait between scans without any Node or Service change. A scan
/// says when its next retry, resync slot or settled node set is due and the
/// controller sleeps until then; this only bounds the sleep.
const SCAN_AT_LEAST_EVERY: Duration = Duration::from_secs(60);
/// The shortest wait between a scan and one the timer starts. Resync slots
/// of many Services come due close together (1,000 at a 60 s period: one
/// every 60 ms), and a scan for each cost more CPU than the syncs it
/// started (steady bench: 11.3 s in 180 s against 6.9 s with a one-second
/// poll). One scan a second starts every Service that came due meanwhile.
/// Changes and ended syncs still wake a scan at once.
const TIMER_SCAN_GAP: Duration = Duration::from_secs(1);

/// Runs the controller until `stop` is cancelled.
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    let workers = ctx.options.options.concurrent_service_syncs.max(1) as usize;
    let controller = ServiceController {
        kube: ctx.kube.clone(),
        events: Events::new(ctx.kube.clone(), "service-controller"),
        lbs: ctx.load_balancers.clone(),
        nodes: ctx.nodes.clone(),
        services: ctx.services.clone(),
        node_changes: ctx.node_changes.clone(),
        service_changes: ctx.service_changes.clone(),
        state: Arc::new(Mutex::new(HashMap::new())),
        index: Arc::new(Mutex::new(BackendIndex::default())),
        settle: Arc::new(Mutex::new(Settle::new(Settle::NODE_SET))),
        workers: Arc::new(Semaphore::new(workers)),
        sync_done: Arc::new(tokio::sync::Notify::new()),
        worker_count: workers as u32,
        resync: Some(ctx.options.options.service_resync_period).filter(|d| !d.is_zero()),
        cloud: ctx.cloud.clone(),
        queue: super::schedule::workqueue::Queue::new("service"),
    };
    controller.run(stop).await;
}

/// Whether the controller manages this Service's load balancer at all.
pub fn wants_load_balancer(svc: &Service) -> bool {
    let spec = svc.spec.as_ref();
    svc.metadata.deletion_timestamp.is_none()
        && spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec.and_then(|s| s.load_balancer_class.as_ref()).is_none()
}

/// Whether the Service carries the controller's finalizer (its load
/// balancer may still exist).
pub fn has_finalizer(svc: &Service) -> bool {
    svc.finalizers().iter().any(|f| f == FINALIZER)
}

/// The EC2 instance a backend node is, by the project's one providerID
/// parser ([`crate::ids`]): `aws:///<zone>/i-…`, `aws://<zone>/i-…` or a bare
/// `i-…`. As upstream's `mapToAWSInstanceIDsTolerant`, a node without a
/// providerID (not initialized yet) or with one that names no instance is
/// left out of the backends; the second is logged, once per node and value.
pub fn instance_id(node: &Node) -> Option<String> {
    match crate::ids::node_instance_id(node) {
        Ok(id) => id,
        Err(e) => {
            warn_once(&e);
            None
        }
    }
}

/// Logs a malformed providerID the first time this (node, value) is seen:
/// backends are recomputed at every node change, which would repeat it.
fn warn_once(e: &crate::ids::NodeProviderIdError) {
    static SEEN: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());
    let fresh = SEEN.lock().insert((e.node.clone(), e.value.clone()));
    if fresh {
        tracing::warn!(node = %e.node, "{e}; the node is not a load-balancer backend");
    }
}

/// Backend predicate: what a sync registers. k8s.io/cloud-provider's
/// `stableNodeSetPredicates` (not being deleted, not excluded by label, not
/// tainted by the cluster autoscaler; readiness is not one, KEP-3458), then
/// the Go CCM's `filterTargetNodes` (every `target-node-labels` label). A
/// Node that leaves this set only by its taint or deletionTimestamp starts
/// no sync ([`node_set`]): it stays registered until a sync made for
/// another reason leaves it out.
pub fn is_backend(node: &Node, target_labels: &BTreeMap<String, String>) -> bool {
    if node.metadata.deletion_timestamp.is_some() || excluded_by_label(node) {
        return false;
    }
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TO_BE_DELETED_TAINT));
    !tainted && crate::provider::load_balancers::labels_match(node.labels(), target_labels)
}

/// `node.kubernetes.io/exclude-from-external-load-balancers`, read as
/// k8s.io/cloud-provider's `nodeIncludedPredicate` reads it: the value is a
/// Go boolean (`strconv.ParseBool`); a false one keeps the node, a true one
/// excludes it, and so does any value that is not a boolean (an empty one
/// too).
pub fn excluded_by_label(node: &Node) -> bool {
    node.labels()
        .get(EXCLUDE_LABEL)
        .is_some_and(|v| go_parse_bool(v) != Some(false))
}

/// Go's `strconv.ParseBool`: exactly these spellings, nothing trimmed.
fn go_parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// What a change of the nodes must move for a node-driven sync to start,
/// as upstream's node handlers decide (`shouldSyncUpdatedNode`, and a sync
/// at each Node added or gone): the Nodes there are, each one's providerID
/// and the verdict of its exclusion label. A Node that only gets the
/// autoscaler's `ToBeDeletedByClusterAutoscaler` taint or a
/// deletionTimestamp (a finalizer holding it while it drains) moves
/// nothing here, so its connections are not cut then: upstream keeps such
/// a Node until it is gone, or until a sync started by something else
/// (another Node's change, a Service change or retry, this CCM's resync)
/// leaves it out. Order-independent.
fn node_set(nodes: &[Arc<Node>]) -> u64 {
    nodes.iter().fold(nodes.len() as u64, |sum, n| {
        let provider_id = n.spec.as_ref().and_then(|s| s.provider_id.as_deref());
        let node = (
            n.metadata.name.as_deref(),
            provider_id,
            excluded_by_label(n),
        );
        sum.wrapping_add(hash_of(&node))
    })
}

/// The Nodes `target-node-labels` selects, by name: a Node labelled into or
/// out of a Service's selection starts its sync at once. Upstream waits for
/// the next node-set or Service change (its node handlers do not look at
/// labels); kubernetes/kubernetes#133165 asks for this.
fn selected(nodes: &[Arc<Node>], target_labels: &BTreeMap<String, String>) -> u64 {
    if target_labels.is_empty() {
        return 0;
    }
    let names: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| crate::provider::load_balancers::labels_match(n.labels(), target_labels))
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    hash_of(&names)
}

/// Instance IDs of the backends.
pub fn backends(nodes: &[Arc<Node>], target_labels: &BTreeMap<String, String>) -> BTreeSet<String> {
    nodes
        .iter()
        .filter(|n| is_backend(n, target_labels))
        .filter_map(|n| instance_id(n))
        .collect()
}

/// What a sync depends on. Not the finalizers: the sync's own finalizer patch
/// would otherwise start a second, empty sync of every new Service (upstream's
/// `needsUpdate` ignores them too); a finalizer someone strips is restored at
/// the next sync.
fn fingerprint(svc: &Service) -> u64 {
    let deps = (
        &svc.metadata.annotations,
        &svc.spec,
        svc.metadata.deletion_timestamp.is_some(),
        &svc.metadata.uid,
    );
    hash_of(&serde_json::to_string(&deps).unwrap_or_default())
}

/// Hash of a fingerprint's text or of a backend set: what a scan compares,
/// so an unchanged Service costs O(1) instead of a set comparison.
fn hash_of(value: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// One backend set, shared by every Service with the same target labels.
#[derive(Clone)]
struct Backends {
    hash: u64,
    ids: Arc<BTreeSet<String>>,
    /// The node changes a changed set is acted on at: [`node_set`] and the
    /// Nodes the labels select ([`selected`]).
    node_set: u64,
}

/// Backend sets of one node generation, per distinct `target-node-labels`
/// set. Services share a few label sets (most have none), so a scan costs
/// O(distinct label sets × Nodes) instead of O(Services × Nodes), and a scan
/// without a node change reuses the sets outright.
#[derive(Default)]
struct BackendIndex {
    node_generation: Option<u64>,
    /// [`node_set`] of this generation, once a set needed it.
    node_set: Option<u64>,
    sets: HashMap<BTreeMap<String, String>, Backends>,
}

impl BackendIndex {
    /// The backends for `targets`; `nodes` is called at most once per node
    /// generation and label set.
    fn get(
        &mut self,
        node_generation: u64,
        targets: BTreeMap<String, String>,
        nodes: &mut impl FnMut() -> Arc<Vec<Arc<Node>>>,
    ) -> Backends {
        if self.node_generation != Some(node_generation) {
            self.sets.clear();
            self.node_set = None;
            self.node_generation = Some(node_generation);
        }
        if let Some(known) = self.sets.get(&targets) {
            return known.clone();
        }
        let nodes = nodes();
        let all = *self.node_set.get_or_insert_with(|| node_set(&nodes));
        let ids = backends(&nodes, &targets);
        let set = Backends {
            hash: hash_of(&ids),
            ids: Arc::new(ids),
            node_set: hash_of(&(all, selected(&nodes, &targets))),
        };
        self.sets.insert(targets, set.clone());
        set
    }
}

/// What a scan derives from one version of a Service, kept until its
/// resourceVersion changes so an idle scan serializes nothing.
struct Derived {
    resource_version: String,
    fingerprint: u64,
    targets: BTreeMap<String, String>,
}

#[derive(Default)]
struct KeyState {
    derived: Option<Derived>,
    synced_fingerprint: Option<u64>,
    synced_backends: Option<u64>,
    /// [`Backends::node_set`] when the backends were last synced or found
    /// unchanged: a changed backend set waits until this moves.
    synced_node_set: Option<u64>,
    last_sync: Option<Instant>,
    failures: u32,
    retry_at: Option<Instant>,
    /// The fingerprint of the Service a failed (or waiting) sync saw: the
    /// backoff holds only while the Service is still that one.
    failed_fingerprint: Option<u64>,
    /// Since when syncs wait for an AWS resource another one still uses.
    waiting_since: Option<Instant>,
    in_flight: bool,
}

#[derive(Clone)]
struct ServiceController<L: LoadBalancers> {
    kube: kube::Client,
    events: Events,
    lbs: L,
    nodes: Store<Node>,
    services: Store<Service>,
    node_changes: tokio::sync::watch::Receiver<u64>,
    service_changes: tokio::sync::watch::Receiver<u64>,
    state: Arc<Mutex<HashMap<String, KeyState>>>,
    index: Arc<Mutex<BackendIndex>>,
    /// Holds backend-only syncs while the node set is still changing.
    settle: Arc<Mutex<Settle>>,
    workers: Arc<Semaphore>,
    /// Signalled when a sync ends: its slot is free for the next Service
    /// (without it, a backlog would move one sync per scan tick).
    sync_done: Arc<tokio::sync::Notify>,
    worker_count: u32,
    /// `--service-resync-period`; `None` never resyncs an unchanged Service.
    resync: Option<Duration>,
    /// cloud.conf: its values the Go CCM fails NLB syncs on.
    cloud: Arc<crate::cloud_config::CloudConfig>,
    /// client-go's workqueue metrics under the Go controller's name.
    queue: super::schedule::workqueue::Queue,
}

enum Outcome {
    Done,
    /// Bad input: wait for the Service to change.
    Invalid,
    Failed,
    /// AWS refused to delete a resource another one still uses (a group
    /// whose load balancer's network interfaces go late): retried soon,
    /// without a Warning and without holding a sync slot meanwhile.
    Waiting,
}

/// A sync to start: what a scan decided for one Service.
struct Job {
    key: String,
    svc: Arc<Service>,
    backends: Option<Backends>,
    fingerprint: u64,
    service_changed: bool,
    /// A `DependencyViolation` is still waited out rather than reported.
    may_wait: bool,
    /// Only the backend set changed since the last successful sync: the
    /// load balancers may move only the targets.
    targets_only: bool,
}

/// Whether a user waits for this sync: the Service is new (no finalizer or
/// no load balancer yet), changed since this process synced it, or is
/// being deleted. These go ahead of adoption, resync and retry work.
fn user_waits(entry: &KeyState, job: &Job) -> bool {
    let changed = entry.synced_fingerprint.is_some() && job.service_changed;
    changed || !has_finalizer(&job.svc) || !wants_load_balancer(&job.svc) || !has_ingress(&job.svc)
}

/// In which order a scan starts syncs: what a user waits for, then a fresh
/// leader's adoption, then resyncs and retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    UserWaits,
    /// Not yet synced by this process. A Service's first sync reads what
    /// the load-balancer sweep cannot show only when AWS lacks this CCM's
    /// record; a resync reads it always. Adoption going first keeps the
    /// resync slots that come due while others are still being adopted
    /// (every slot does in a period shorter than the adoption) from
    /// holding the adoption back.
    Adoption,
    Background,
}

fn tier(entry: &KeyState, job: &Job) -> Tier {
    if user_waits(entry, job) {
        Tier::UserWaits
    } else if entry.last_sync.is_none() {
        Tier::Adoption
    } else {
        Tier::Background
    }
}

impl<L: LoadBalancers> ServiceController<L> {
    async fn run(self, stop: CancellationToken) {
        let mut node_changes = self.node_changes.clone();
        let mut service_changes = self.service_changes.clone();
        loop {
            let next = self.scan();
            // Scan again when a Node or Service changes, a sync ends (its
            // slot is free), or the next retry or resync comes due.
            let scanned = Instant::now();
            let at_most = scanned + SCAN_AT_LEAST_EVERY;
            let change = async {
                tokio::select! {
                    _ = schedule::changed(&mut node_changes) => {}
                    _ = schedule::changed(&mut service_changes) => {}
                    _ = self.sync_done.notified() => {}
                }
            };
            let due = next.map_or(at_most, |at| at.max(scanned + TIMER_SCAN_GAP).min(at_most));
            if schedule::wait(&stop, Some(due), change).await == Wake::Stopped {
                break;
            }
        }
        // Let running syncs finish before the controller reports stopped.
        let _ = self.workers.acquire_many(self.worker_count).await;
    }

    /// Starts a sync for every Service that needs one, while sync slots are
    /// free; returns when a Service not due now comes due without any change
    /// (a retry, a resync slot, a settled node set).
    fn scan(&self) -> Option<Instant> {
        // The generation is read before the store, so a change that lands
        // in between bumps it again and the next scan sees it.
        let node_generation = *self.node_changes.borrow();
        let mut node_list: Option<Arc<Vec<Arc<Node>>>> = None;
        let mut nodes = || {
            node_list
                .get_or_insert_with(|| Arc::new(self.nodes.state()))
                .clone()
        };
        let now = Instant::now();
        // Whether backend-only syncs may go, and if not, when they may.
        let (nodes_settled, settles_at) = {
            let mut settle = self.settle.lock();
            let settled = settle.observe(node_generation, now);
            (settled, settle.settles_at(now))
        };
        let services = self.services.state();
        let mut state = self.state.lock();
        let mut index = self.index.lock();
        let live: BTreeSet<String> = services.iter().map(|s| key(s)).collect();
        state.retain(|k, s| live.contains(k) || s.in_flight);
        // Jobs by tier; past the first, only as many as there are free
        // slots are kept.
        let mut tiers: [Vec<Job>; 3] = Default::default();
        let mut due = HashSet::new();
        let free = self.workers.available_permits();
        let mut next: Option<Instant> = None;
        for svc in services {
            if !(wants_load_balancer(&svc) || has_finalizer(&svc)) {
                continue;
            }
            let entry = state.entry(key(&svc)).or_default();
            let backends = |targets: &BTreeMap<String, String>| {
                index.get(node_generation, targets.clone(), &mut nodes)
            };
            let Some(job) = decide(entry, svc.clone(), backends, self.resync, now) else {
                let uid = svc.metadata.uid.as_deref().unwrap_or_default();
                next = next
                    .into_iter()
                    .chain(next_due(entry, uid, self.resync))
                    .min();
                continue;
            };
            self.queue.due(&job.key);
            due.insert(job.key.clone());
            if job.targets_only && !nodes_settled {
                // Held until the node set settles: the next scan is then.
                next = next.into_iter().chain(settles_at).min();
                continue;
            }
            let t = tier(entry, &job);
            let jobs = &mut tiers[t as usize];
            if t == Tier::UserWaits || jobs.len() < free {
                jobs.push(job);
            }
        }
        self.queue
            .keep_only(&due.iter().map(String::as_str).collect());
        // By tier, each in store order.
        for job in tiers.into_iter().flatten() {
            // Out of slots: the end of a sync wakes the next scan.
            let Ok(permit) = self.workers.clone().try_acquire_owned() else {
                return next;
            };
            if let Some(entry) = state.get_mut(&job.key) {
                entry.in_flight = true;
            }
            self.start(job, permit);
        }
        next
    }

    /// Runs one sync in its own task, holding a sync slot, and records how
    /// it ended.
    fn start(&self, job: Job, permit: tokio::sync::OwnedSemaphorePermit) {
        let this = self.clone();
        tokio::spawn(async move {
            let work = this.queue.take(&job.key);
            let span = tracing::info_span!("sync_service", service = %job.key);
            let outcome = this.sync(&job).instrument(span).await;
            drop(permit);
            drop(work);
            if matches!(outcome, Outcome::Failed) {
                this.queue.retry();
            }
            this.record(&job, outcome);
            this.sync_done.notify_one();
        });
    }

    /// Notes a sync's outcome: when the Service is next due.
    fn record(&self, job: &Job, outcome: Outcome) {
        let mut state = self.state.lock();
        let entry = state.entry(job.key.clone()).or_default();
        let now = Instant::now();
        entry.in_flight = false;
        entry.last_sync = Some(now);
        match outcome {
            Outcome::Done | Outcome::Invalid => {
                entry.synced_fingerprint = Some(job.fingerprint);
                entry.synced_backends = job.backends.as_ref().map(|b| b.hash);
                entry.synced_node_set = job.backends.as_ref().map(|b| b.node_set);
                entry.failures = 0;
                entry.retry_at = None;
                entry.failed_fingerprint = None;
                entry.waiting_since = None;
            }
            Outcome::Waiting => {
                let waited = now - *entry.waiting_since.get_or_insert(now);
                let delay = WAITING.after(1 + (waited.as_secs() / 10).min(8) as u32);
                entry.retry_at = Some(now + delay);
                entry.failed_fingerprint = Some(job.fingerprint);
            }
            Outcome::Failed => {
                entry.failures += 1;
                let delay = FAILED.after(entry.failures);
                entry.retry_at = Some(now + delay);
                entry.failed_fingerprint = Some(job.fingerprint);
                entry.waiting_since = None;
            }
        }
    }

    async fn sync(&self, job: &Job) -> Outcome {
        let (svc, service_changed, may_wait) = (&*job.svc, job.service_changed, job.may_wait);
        let api: Api<Service> =
            Api::namespaced(self.kube.clone(), &svc.namespace().unwrap_or_default());
        if !wants_load_balancer(svc) {
            if !has_finalizer(svc) {
                return Outcome::Done;
            }
            return self.sync_deletion(svc, &api, may_wait).await;
        }
        // Another controller's (the Go CCM answers ImplementedElsewhere):
        // no AWS call, the status is that controller's to write.
        if is_external(svc) {
            return Outcome::Done;
        }
        let obj = svc.object_ref(&());
        let reading = LoadBalancerSpec::read_with(svc, &self.cloud);
        let Some(scope) = self.read_scope(svc, &reading, service_changed).await else {
            return Outcome::Invalid;
        };
        let spec = reading.spec;
        if !has_finalizer(svc)
            && let Err(e) = self.set_finalizer(&api, svc, true).await
        {
            tracing::warn!(error = %e, "failed to add the finalizer; nothing created");
            return Outcome::Failed;
        }
        if service_changed {
            self.events
                .normal(&obj, "EnsuringLoadBalancer", "Ensuring load balancer")
                .await;
        }
        let req = EnsureRequest {
            service_key: key(svc),
            uid: svc.metadata.uid.clone().unwrap_or_default(),
            spec,
            instance_ids: job
                .backends
                .as_ref()
                .map(|b| (*b.ids).clone())
                .unwrap_or_default(),
            scope,
        };
        let started = Instant::now();
        let ensured = if job.targets_only && scope == Scope::Full {
            self.lbs.update_targets(&req).await
        } else {
            self.lbs.ensure(&req).await
        };
        super::service_metrics::ensured(service_changed, started.elapsed(), ensured.is_ok());
        if req.instance_ids.is_empty() && (service_changed || ensured.is_ok()) {
            // Upstream's event and text, on an ensure and on a host update.
            let note = "There are no available nodes for LoadBalancer";
            self.events
                .warning(&svc.object_ref(&()), "UnAvailableLoadBalancer", note)
                .await;
        }
        match ensured {
            Ok(done) if scope != Scope::Full => {
                // Kept current; the refused value still waits for a fix.
                match self.ensured(svc, &api, done, false).await {
                    Outcome::Done => Outcome::Invalid,
                    other => other,
                }
            }
            Ok(done) => self.ensured(svc, &api, done, service_changed).await,
            Err(e) if may_wait && e.in_use() => {
                tracing::info!(error = %e, "an AWS resource is still in use; retrying soon");
                Outcome::Waiting
            }
            Err(e) => self.ensure_failed(svc, e, service_changed).await,
        }
    }

    /// Deletes the load balancer of a Service that no longer wants one, then
    /// clears its status and removes the finalizer. A Service handed to
    /// another controller (`aws-load-balancer-type: external` or `nlb-ip`)
    /// keeps everything in AWS as it is: the Go CCM's
    /// `EnsureLoadBalancerDeleted` returns at once for it, so the load
    /// balancer this CCM made before the hand-off now belongs to that
    /// controller (or to whoever took it over). Upstream's controller still
    /// clears the status and releases the finalizer; so does this one.
    async fn sync_deletion(&self, svc: &Service, api: &Api<Service>, may_wait: bool) -> Outcome {
        let obj = svc.object_ref(&());
        let uid = svc.metadata.uid.clone().unwrap_or_default();
        let handed_over = is_external(svc);
        if !handed_over {
            self.events
                .normal(&obj, "DeletingLoadBalancer", "Deleting load balancer")
                .await;
            match self.lbs.ensure_deleted(&key(svc), &uid).await {
                Ok(_) => {}
                Err(e) if may_wait && e.in_use() => {
                    tracing::info!(error = %e, "an AWS resource is still in use; retrying soon");
                    return Outcome::Waiting;
                }
                Err(e) => {
                    self.events
                        .warning(&obj, "DeleteLoadBalancerFailed", format!("Error deleting load balancer: {e}. It is retried with backoff; the finalizer {FINALIZER} stays until it succeeds"))
                        .await;
                    return Outcome::Failed;
                }
            }
        }
        if svc.metadata.deletion_timestamp.is_none() && has_ingress(svc) {
            let clear = serde_json::json!({"status": {"loadBalancer": {"ingress": null}}});
            if let Err(e) = super::merge_patch_status(api, &svc.name_any(), clear).await {
                tracing::warn!(error = %e, "failed to clear the load balancer status");
                return Outcome::Failed;
            }
        }
        if let Err(e) = self.set_finalizer(api, svc, false).await {
            tracing::warn!(error = %e, "failed to remove the finalizer");
            return Outcome::Failed;
        }
        if handed_over {
            let name = self.lbs.name(&uid);
            let value = svc.annotations().get(TYPE).cloned().unwrap_or_default();
            tracing::info!(load_balancer = %name, "handed to another controller: left in AWS as it is");
            let note = format!(
                "Left load balancer {name} in AWS as it is: the Service is handed to another controller ({TYPE}: {value}), so nothing was deleted and the finalizer {FINALIZER} is released"
            );
            self.events
                .normal(&obj, "LoadBalancerHandedOver", note)
                .await;
        } else {
            self.events
                .normal(&obj, "DeletedLoadBalancer", "Deleted load balancer")
                .await;
        }
        Outcome::Done
    }

    /// Publishes an ensured load balancer: the status, IAM's refusals, the
    /// events.
    async fn ensured(
        &self,
        svc: &Service,
        api: &Api<Service>,
        done: crate::provider::load_balancers::Ensured,
        service_changed: bool,
    ) -> Outcome {
        let obj = svc.object_ref(&());
        tracing::info!(
            hostname = %done.hostname,
            changes = done.changes.len(),
            "load balancer ensured"
        );
        if current_hostname(svc) != Some(done.hostname.as_str()) && !done.hostname.is_empty() {
            let patch = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"hostname": done.hostname}]}}});
            if let Err(e) = super::merge_patch_status(api, &svc.name_any(), patch).await {
                tracing::warn!(error = %e, "failed to write the load balancer status");
                return Outcome::Failed;
            }
        }
        // Writes IAM refused: the rest is synced, so no retry; the next
        // sync (or the registry's re-check) tries them again.
        for w in &done.warnings {
            self.events.warning(&obj, w.reason, w.message.clone()).await;
        }
        if service_changed {
            self.events
                .normal(&obj, "EnsuredLoadBalancer", "Ensured load balancer")
                .await;
        } else if !done.changes.is_empty() {
            self.events
                .normal(
                    &obj,
                    "UpdatedLoadBalancer",
                    format!("Updated load balancer: {}", done.changes.join("; ")),
                )
                .await;
        }
        Outcome::Done
    }

    async fn set_finalizer(
        &self,
        api: &Api<Service>,
        svc: &Service,
        present: bool,
    ) -> Result<(), kube::Error> {
        let mut finalizers: Vec<String> = svc
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        if present {
            finalizers.push(FINALIZER.to_string());
        }
        // resourceVersion makes this a compare-and-swap: a concurrent change
        // to the list fails with 409 and the sync is retried.
        let patch = serde_json::json!({
            "metadata": {"finalizers": finalizers, "resourceVersion": svc.resource_version()}
        });
        super::merge_patch(api, &svc.name_any(), patch).await?;
        Ok(())
    }
}

fn key(svc: &Service) -> String {
    format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any())
}

fn target_labels(svc: &Service) -> BTreeMap<String, String> {
    svc.annotations()
        .get(crate::provider::load_balancers::TARGET_NODE_LABELS)
        .map(|v| crate::provider::load_balancers::parse_key_values(v))
        .unwrap_or_default()
}

/// The Service's load-balancer ingress points, as its status shows them.
fn ingress(svc: &Service) -> &[LoadBalancerIngress] {
    let status = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
    status
        .and_then(|l| l.ingress.as_deref())
        .unwrap_or_default()
}

fn has_ingress(svc: &Service) -> bool {
    !ingress(svc).is_empty()
}

/// Whether the Service has a load balancer already (its status or the
/// finalizer says so): what a refused or held value keeps in upkeep
/// rather than leaving alone.
pub fn has_load_balancer(svc: &Service) -> bool {
    has_finalizer(svc) || current_hostname(svc).is_some()
}

/// The hostname of the Service's load balancer, as its status shows it.
pub fn current_hostname(svc: &Service) -> Option<&str> {
    ingress(svc).first()?.hostname.as_deref()
}

#[cfg(test)]
mod tests {
    use super::due::resync_due;
    use super::*;
    use crate::controllers::cached_node::NodeSpec;
    use k8s_openapi::api::core::v1::Taint;
    use kube::api::ObjectMeta;

    fn lb_service(rv: &str, interval: &str) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "namespace": "default", "resourceVersion": rv,
                    "annotations": {"service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": interval}},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
            }))
            .unwrap(),
        )
    }

    fn no_backends(_: &BTreeMap<String, String>) -> Backends {
        Backends {
            hash: 0,
            ids: Arc::new(BTreeSet::new()),
            node_set: 0,
        }
    }

    /// The state a failed sync of `svc` left, its backoff running.
    fn failed(svc: &Service, now: Instant) -> KeyState {
        KeyState {
            synced_backends: Some(0),
            last_sync: Some(now),
            failures: 3,
            retry_at: Some(now + Duration::from_secs(40)),
            failed_fingerprint: Some(fingerprint(svc)),
            ..KeyState::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_service_waits_out_its_backoff_unless_it_changed() {
        let now = Instant::now();
        let broken = lb_service("1", "often");
        let mut entry = failed(&broken, now);
        assert!(
            decide(&mut entry, broken.clone(), no_backends, None, now).is_none(),
            "unchanged: the backoff holds"
        );
        let fixed = lb_service("2", "10");
        let job = decide(&mut entry, fixed.clone(), no_backends, None, now)
            .expect("a fixed Service is retried at once");
        assert!(job.service_changed && job.may_wait);
        assert_eq!(job.fingerprint, fingerprint(&fixed));
        // The backoff itself still comes due.
        let mut entry = failed(&broken, now);
        let later = now + Duration::from_secs(41);
        assert!(decide(&mut entry, broken, no_backends, None, later).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_on_a_dependency_is_bounded() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let mut entry = failed(&svc, now);
        entry.retry_at = Some(now);
        entry.waiting_since = Some(now);
        let job = decide(&mut entry, svc.clone(), no_backends, None, now).expect("due");
        assert!(job.may_wait);
        let mut entry = failed(&svc, now);
        entry.retry_at = Some(now);
        entry.waiting_since = Some(now - DEPENDENCY_PATIENCE);
        let job = decide(&mut entry, svc, no_backends, None, now).expect("due");
        assert!(
            !job.may_wait,
            "after two minutes it is reported like any failure"
        );
    }

    fn adopted(name: &str, uid: &str) -> Arc<Service> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": "default", "uid": uid, "resourceVersion": "1",
                    "finalizers": [FINALIZER]},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
                "status": {"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}}
            }))
            .unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn new_changed_and_deleted_services_go_ahead_of_adoption_and_resync() {
        let now = Instant::now();
        let job = |entry: &mut KeyState, svc: Arc<Service>| {
            decide(entry, svc, no_backends, None, now).expect("due")
        };
        // A fresh leader adopting a Service that has its load balancer.
        let mut entry = KeyState::default();
        let j = job(&mut entry, adopted("old", "u1"));
        assert_eq!(tier(&entry, &j), Tier::Adoption, "adoption waits");
        // Its resync or a retry: no one waits either, and they wait behind
        // the Services this process has not synced yet.
        let mut entry = failed(&adopted("old", "u1"), now);
        entry.retry_at = Some(now);
        entry.synced_fingerprint = Some(fingerprint(&adopted("old", "u1")));
        let j = job(&mut entry, adopted("old", "u1"));
        assert_eq!(tier(&entry, &j), Tier::Background, "a retry waits");
        let every = Duration::from_secs(60);
        let mut entry = KeyState {
            synced_fingerprint: Some(fingerprint(&adopted("old", "u1"))),
            synced_backends: Some(0),
            last_sync: Some(now),
            ..KeyState::default()
        };
        let at = (1..=61)
            .map(|s| now + Duration::from_secs(s))
            .find(|t| resync_due(&adopted("old", "u1"), every, now, *t))
            .expect("a slot comes due within the period");
        let j = decide(
            &mut entry,
            adopted("old", "u1"),
            no_backends,
            Some(every),
            at,
        )
        .expect("the resync is due");
        assert_eq!(tier(&entry, &j), Tier::Background, "a resync waits");
        assert!(Tier::UserWaits < Tier::Adoption && Tier::Adoption < Tier::Background);
        // New: no finalizer, or no load balancer yet.
        let mut entry = KeyState::default();
        let j = job(&mut entry, lb_service("1", "10"));
        assert_eq!(tier(&entry, &j), Tier::UserWaits);
        let mut fresh = (*adopted("new", "u2")).clone();
        fresh.status = None;
        let mut entry = KeyState::default();
        let j = job(&mut entry, Arc::new(fresh));
        assert_eq!(tier(&entry, &j), Tier::UserWaits);
        // Changed since this process synced it.
        let mut entry = KeyState {
            synced_fingerprint: Some(1),
            last_sync: Some(now),
            ..KeyState::default()
        };
        let j = job(&mut entry, adopted("old", "u1"));
        assert_eq!(tier(&entry, &j), Tier::UserWaits);
        // Being deleted.
        let mut deleting = serde_json::to_value(&*adopted("gone", "u3")).unwrap();
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        let deleting: Service = serde_json::from_value(deleting).unwrap();
        let mut entry = KeyState::default();
        let j = job(&mut entry, Arc::new(deleting));
        assert_eq!(tier(&entry, &j), Tier::UserWaits);
    }

    #[tokio::test(start_paused = true)]
    async fn services_synced_together_resync_spread_over_the_period() {
        let every = Duration::from_secs(100);
        let synced = Instant::now();
        let svcs: Vec<Arc<Service>> = (0..300)
            .map(|i| adopted(&format!("s{i}"), &format!("uid-{i}")))
            .collect();
        let mut counted = vec![0usize; 10];
        let mut seen = BTreeSet::new();
        for (tenth, count) in counted.iter_mut().enumerate() {
            let now = synced + every * (tenth as u32 + 1) / 10;
            for s in &svcs {
                if resync_due(s, every, synced, now) && seen.insert(key(s)) {
                    *count += 1;
                }
            }
        }
        assert_eq!(seen.len(), svcs.len(), "every Service within one period");
        assert!(counted.iter().all(|c| *c <= 60), "no burst: {counted:?}");
        // Once resynced at its slot, a Service is not due again within it.
        for s in &svcs {
            let mut at = synced;
            while !resync_due(s, every, synced, at) {
                at += every / 1000;
            }
            assert!(!resync_due(s, every, at, at + every * 99 / 100));
        }
    }

    /// A scan sleeps until `next_due`: it must be the first instant at
    /// which `decide` finds the Service due without any change (a resync
    /// slot, a retry), never later (a missed sync) and never much earlier
    /// (a scan for nothing).
    #[tokio::test(start_paused = true)]
    async fn the_next_due_instant_is_when_decide_turns_due() {
        let every = Duration::from_secs(100);
        let one_ms = Duration::from_millis(1);
        let synced = Instant::now();
        for i in 0..50 {
            let svc = adopted(&format!("s{i}"), &format!("uid-{i}"));
            let uid = svc.metadata.uid.clone().unwrap();
            let mut entry = KeyState {
                synced_fingerprint: Some(fingerprint(&svc)),
                synced_backends: Some(0),
                last_sync: Some(synced),
                ..KeyState::default()
            };
            let at = next_due(&entry, &uid, Some(every)).expect("a resync is due some time");
            assert!(
                at > synced && at <= synced + every,
                "{i}: within one period"
            );
            let before = at.checked_sub(one_ms).unwrap();
            assert!(
                decide(
                    &mut entry,
                    svc.clone(),
                    backends_hashed(0),
                    Some(every),
                    before
                )
                .is_none()
            );
            assert!(decide(&mut entry, svc.clone(), backends_hashed(0), Some(every), at).is_some());
            // A retry due sooner comes first; a running sync wakes the scan
            // itself when it ends.
            entry.retry_at = Some(synced + one_ms);
            assert_eq!(next_due(&entry, &uid, Some(every)), entry.retry_at);
            entry.in_flight = true;
            assert_eq!(next_due(&entry, &uid, Some(every)), None);
        }
        // Without a resync period only a retry is ever due.
        let entry = KeyState {
            last_sync: Some(synced),
            ..KeyState::default()
        };
        assert_eq!(next_due(&entry, "uid-0", None), None);
    }

    /// A backend set of this hash, after a node change of the same number.
    fn backends_hashed(hash: u64) -> impl FnMut(&BTreeMap<String, String>) -> Backends {
        move |_| Backends {
            hash,
            ids: Arc::new(BTreeSet::new()),
            node_set: hash,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_backend_change_alone_moves_targets_only() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let synced = || KeyState {
            synced_fingerprint: Some(fingerprint(&svc)),
            synced_backends: Some(1),
            synced_node_set: Some(1),
            last_sync: Some(now),
            ..KeyState::default()
        };
        let resync = Some(Duration::from_secs(600));
        let mut entry = synced();
        let job = decide(&mut entry, svc.clone(), backends_hashed(2), resync, now)
            .expect("a new backend set is synced");
        assert!(job.targets_only && !job.service_changed);
        // The Service changed too: the full ensure.
        let mut entry = synced();
        let changed = lb_service("2", "20");
        let job = decide(&mut entry, changed, backends_hashed(2), resync, now).expect("due");
        assert!(!job.targets_only && job.service_changed);
        // A retry after a failure, and a due resync, ensure in full.
        let mut entry = synced();
        entry.retry_at = Some(now);
        let job = decide(&mut entry, svc.clone(), backends_hashed(2), resync, now).expect("due");
        assert!(!job.targets_only);
        let mut entry = synced();
        let later = now + Duration::from_secs(601);
        let job = decide(&mut entry, svc.clone(), backends_hashed(2), resync, later).expect("due");
        assert!(!job.targets_only);
        // Never synced: in full.
        let mut entry = KeyState::default();
        let job = decide(&mut entry, svc, backends_hashed(2), resync, now).expect("due");
        assert!(!job.targets_only);
    }

    fn node(name: &str, labels: &[(&str, &str)], taint: Option<&str>) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///us-east-1a/i-{name}")),
                taints: taint.map(|t| {
                    vec![Taint {
                        key: t.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: None,
        })
    }

    #[test]
    fn backend_predicate_matches_upstream() {
        let nodes = vec![
            node("a", &[], None),
            node("b", &[(EXCLUDE_LABEL, "")], None),
            node("c", &[], Some(TO_BE_DELETED_TAINT)),
            node("d", &[("pool", "web")], None),
        ];
        assert_eq!(
            backends(&nodes, &BTreeMap::new()),
            BTreeSet::from(["i-a".to_string(), "i-d".to_string()])
        );
        let web = BTreeMap::from([("pool".to_string(), "web".to_string())]);
        assert_eq!(backends(&nodes, &web), BTreeSet::from(["i-d".to_string()]));
    }

    /// `node` with a deletionTimestamp: held by a finalizer while it drains.
    fn deleting(node: &Node) -> Arc<Node> {
        let mut value = serde_json::to_value(node).unwrap();
        value["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        value["metadata"]["finalizers"] = serde_json::json!(["karpenter.sh/termination"]);
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn ids(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| format!("i-{n}")).collect()
    }

    /// The backends generation `generation` of `index` holds for `nodes`.
    fn backends_at(
        index: &mut BackendIndex,
        generation: u64,
        targets: &BTreeMap<String, String>,
        nodes: Vec<Arc<Node>>,
    ) -> Backends {
        let nodes = Arc::new(nodes);
        index.get(generation, targets.clone(), &mut || nodes.clone())
    }

    /// The state a successful sync against `backends` left.
    fn synced_at(svc: &Service, backends: &Backends, now: Instant) -> KeyState {
        KeyState {
            synced_fingerprint: Some(fingerprint(svc)),
            synced_backends: Some(backends.hash),
            synced_node_set: Some(backends.node_set),
            last_sync: Some(now),
            ..KeyState::default()
        }
    }

    #[test]
    fn the_node_set_moves_as_upstreams_node_handlers_sync() {
        let base = || vec![node("a", &[], None), node("b", &[("pool", "web")], None)];
        let before = node_set(&base());
        let with = |change: &dyn Fn(&mut Vec<Arc<Node>>)| {
            let mut nodes = base();
            change(&mut nodes);
            node_set(&nodes)
        };
        // A sync: a Node added or gone, a providerID changed, the exclusion
        // label's verdict flipped.
        assert_ne!(with(&|n| n.push(node("c", &[], None))), before);
        assert_ne!(with(&|n| drop(n.pop())), before);
        assert_ne!(
            with(&|n| {
                let mut a = (*n[0]).clone();
                a.spec.as_mut().unwrap().provider_id = Some("aws:///us-east-1b/i-other".into());
                n[0] = Arc::new(a);
            }),
            before
        );
        assert_ne!(
            with(&|n| n[0] = node("a", &[(EXCLUDE_LABEL, "true")], None)),
            before
        );
        // No sync: the autoscaler's taint, a deletionTimestamp, another
        // label, the exclusion label with the same verdict.
        assert_eq!(
            with(&|n| n[0] = node("a", &[], Some(TO_BE_DELETED_TAINT))),
            before
        );
        assert_eq!(with(&|n| n[0] = deleting(&n[0])), before);
        assert_eq!(with(&|n| n[0] = node("a", &[("pool", "db")], None)), before);
        assert_eq!(
            with(&|n| n[0] = node("a", &[(EXCLUDE_LABEL, "false")], None)),
            before
        );
        assert_eq!(with(&|n| n.reverse()), before, "order-independent");
    }

    /// ToBeDeletedByClusterAutoscaler, as upstream: the taint starts no
    /// sync, a sync made for another reason leaves the node out (a Service
    /// change: a full ensure; another node's join: targets only).
    #[tokio::test(start_paused = true)]
    async fn an_autoscaler_taint_waits_for_the_next_sync_that_happens_anyway() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let mut index = BackendIndex::default();
        let targets = BTreeMap::new();
        let mut at = |generation, nodes| backends_at(&mut index, generation, &targets, nodes);
        let first = at(1, vec![node("a", &[], None), node("b", &[], None)]);
        let mut entry = synced_at(&svc, &first, now);
        let tainted = vec![
            node("a", &[], None),
            node("b", &[], Some(TO_BE_DELETED_TAINT)),
        ];
        let tainted_set = at(2, tainted.clone());
        assert_eq!(*tainted_set.ids, ids(&["a"]), "no longer a backend");
        assert!(
            decide(&mut entry, svc.clone(), |_| tainted_set.clone(), None, now).is_none(),
            "the taint alone starts no sync: b stays registered"
        );
        let changed = lb_service("2", "20");
        let job = decide(&mut entry, changed, |_| tainted_set.clone(), None, now)
            .expect("a Service change syncs");
        assert!(!job.targets_only);
        assert_eq!(*job.backends.expect("backends").ids, ids(&["a"]));
        let mut joined = tainted;
        joined.push(node("c", &[], None));
        let joined_set = at(3, joined);
        let job = decide(&mut entry, svc, |_| joined_set.clone(), None, now)
            .expect("another node's join syncs");
        assert!(job.targets_only);
        assert_eq!(*job.backends.expect("backends").ids, ids(&["a", "c"]));
    }

    /// A Node held by a finalizer while it drains stays registered until it
    /// is gone, as upstream.
    #[tokio::test(start_paused = true)]
    async fn a_deleting_node_stays_a_target_until_it_is_gone() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let mut index = BackendIndex::default();
        let targets = BTreeMap::new();
        let mut at = |generation, nodes| backends_at(&mut index, generation, &targets, nodes);
        let (a, b) = (node("a", &[], None), node("b", &[], None));
        let first = at(1, vec![a.clone(), b.clone()]);
        let mut entry = synced_at(&svc, &first, now);
        let draining = at(2, vec![a.clone(), deleting(&b)]);
        assert_eq!(*draining.ids, ids(&["a"]));
        assert!(decide(&mut entry, svc.clone(), |_| draining.clone(), None, now).is_none());
        let gone = at(3, vec![a]);
        let job = decide(&mut entry, svc, |_| gone.clone(), None, now).expect("the Node is gone");
        assert!(job.targets_only);
        assert_eq!(*job.backends.expect("backends").ids, ids(&["a"]));
    }

    /// A deliberate difference: a Node labelled into (or out of) a
    /// Service's `target-node-labels` moves its targets at once.
    #[tokio::test(start_paused = true)]
    async fn a_node_labelled_into_a_selection_is_registered_at_once() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let web = BTreeMap::from([("pool".to_string(), "web".to_string())]);
        let mut index = BackendIndex::default();
        let targets = web.clone();
        let mut at = |generation, nodes| backends_at(&mut index, generation, &targets, nodes);
        let first = at(
            1,
            vec![node("a", &[("pool", "web")], None), node("b", &[], None)],
        );
        let mut entry = synced_at(&svc, &first, now);
        let labelled = at(
            2,
            vec![
                node("a", &[("pool", "web")], None),
                node("b", &[("pool", "web")], None),
            ],
        );
        let job = decide(&mut entry, svc, |_| labelled.clone(), None, now)
            .expect("the new selection syncs");
        assert!(job.targets_only);
        assert_eq!(*job.backends.expect("backends").ids, ids(&["a", "b"]));
    }

    /// A node change that leaves the backend set as it was costs nothing,
    /// and is taken as synced: a later taint alone still starts no sync.
    #[tokio::test(start_paused = true)]
    async fn a_node_change_with_the_same_backends_is_taken_as_synced() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let mut index = BackendIndex::default();
        let targets = BTreeMap::new();
        let mut at = |generation, nodes| backends_at(&mut index, generation, &targets, nodes);
        let first = at(1, vec![node("a", &[], None)]);
        let mut entry = synced_at(&svc, &first, now);
        let excluded = node("x", &[(EXCLUDE_LABEL, "true")], None);
        let joined = at(2, vec![node("a", &[], None), excluded.clone()]);
        assert_ne!(joined.node_set, first.node_set);
        assert!(decide(&mut entry, svc.clone(), |_| joined.clone(), None, now).is_none());
        assert_eq!(entry.synced_node_set, Some(joined.node_set));
        let tainted = at(3, vec![node("a", &[], Some(TO_BE_DELETED_TAINT)), excluded]);
        assert!(decide(&mut entry, svc, |_| tainted.clone(), None, now).is_none());
    }

    #[test]
    fn exclude_label_is_a_go_boolean_and_anything_else_excludes() {
        for kept in ["false", "False", "FALSE", "f", "F", "0"] {
            assert!(
                !excluded_by_label(&node("n", &[(EXCLUDE_LABEL, kept)], None)),
                "{kept:?} keeps the node"
            );
        }
        for dropped in [
            "true", "True", "TRUE", "t", "T", "1", "", "yes", "no", " false",
        ] {
            assert!(
                excluded_by_label(&node("n", &[(EXCLUDE_LABEL, dropped)], None)),
                "{dropped:?} excludes the node"
            );
        }
        assert!(!excluded_by_label(&node("n", &[], None)));
        let nodes = vec![
            node("a", &[(EXCLUDE_LABEL, "false")], None),
            node("b", &[(EXCLUDE_LABEL, "true")], None),
        ];
        assert_eq!(
            backends(&nodes, &BTreeMap::new()),
            BTreeSet::from(["i-a".to_string()])
        );
    }

    #[test]
    fn a_bare_target_label_key_selects_nodes_with_any_value() {
        let nodes = vec![
            node("a", &[("pool", "web")], None),
            node("b", &[("pool", "")], None),
            node("c", &[("other", "web")], None),
        ];
        let want = BTreeSet::from(["i-a".to_string(), "i-b".to_string()]);
        for annotation in ["pool", "pool="] {
            let targets = crate::provider::load_balancers::parse_key_values(annotation);
            assert_eq!(backends(&nodes, &targets), want, "{annotation:?}");
        }
    }

    #[test]
    fn backend_index_lists_nodes_once_per_label_set_and_generation() {
        let all = Arc::new(vec![
            node("a", &[], None),
            node("d", &[("pool", "web")], None),
        ]);
        let mut lists = 0;
        let mut nodes = || {
            lists += 1;
            all.clone()
        };
        let web = BTreeMap::from([("pool".to_string(), "web".to_string())]);
        let mut index = BackendIndex::default();
        // 1,000 Services over two label sets: two node walks.
        for i in 0..1000 {
            let targets = if i % 2 == 0 {
                BTreeMap::new()
            } else {
                web.clone()
            };
            let got = index.get(7, targets.clone(), &mut nodes);
            assert_eq!(*got.ids, backends(&all, &targets));
            assert_eq!(got.hash, hash_of(&backends(&all, &targets)));
        }
        // A node change (new generation) recomputes.
        let again = index.get(8, web.clone(), &mut nodes);
        assert_eq!(*again.ids, BTreeSet::from(["i-d".to_string()]));
        assert_eq!(lists, 3);
        assert_ne!(
            hash_of(&BTreeSet::from(["i-a".to_string()])),
            hash_of(&BTreeSet::from(["i-d".to_string()]))
        );
    }

    #[test]
    fn backends_take_every_provider_id_form_the_go_ccm_takes() {
        let mut nodes = Vec::new();
        for (name, pid) in [
            ("zoned", "aws:///us-east-1a/i-0aaa"),
            ("zoneless", "aws:///i-0bbb"),
            ("bare", "i-0ccc"),
            ("authority", "aws://us-east-1a/i-0ddd"),
            ("gce", "gce://p/z/n"),
            ("fargate", "aws:///us-east-1a/fargate-ip-10-0-0-1"),
            ("uninitialized", ""),
        ] {
            let mut n = (*node(name, &[], None)).clone();
            n.spec.as_mut().unwrap().provider_id = Some(pid.into());
            nodes.push(Arc::new(n));
        }
        let want = ["i-0aaa", "i-0bbb", "i-0ccc", "i-0ddd"].map(String::from);
        assert_eq!(backends(&nodes, &BTreeMap::new()), BTreeSet::from(want));
    }
}
