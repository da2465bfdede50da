//! Service controller: a load balancer for each `type: LoadBalancer` Service
//! without `spec.loadBalancerClass`, as k8s.io/cloud-provider's controller.
//!
//! It runs on the one keyed scheduler ([`Keyed`], queue `service`): this
//! file says which Services need a sync, the queue says when and by whom.
//! * **Triggers.** A scan of the shared informer caches, at start and at
//!   every Node or Service change, adds a Service whose own fingerprint
//!   (spec, annotations, deletion) changed, now; one whose backend instance
//!   set changed at a node change upstream syncs on ([`node_set`]; so a node
//!   change only touches Services whose backends it changes, and a taint or
//!   deletionTimestamp alone none), once those node changes settle
//!   ([`Settle::NODE_SET`]); a deleted one is forgotten. After each sync
//!   that is done the Service is added at its periodic resync slot (a
//!   failed one comes back by its backoff, and a resync does not hasten it).
//! * **Order.** What a user waits for first, then a fresh leader's
//!   adoption, then resyncs and backend moves ([`tier`]); a retry keeps the
//!   class of the sync that failed.
//! * **Work.** At most `--concurrent-service-syncs` syncs at once; one
//!   Service never has two. What a sync must do (in full, targets only, or
//!   nothing) is decided when it starts, from what this process last synced.
//!   A failed sync is retried by the queue's backoff (5 s doubling to
//!   300 s, upstream's), or at once when the Service changes meanwhile. A
//!   sync that meets a `DependencyViolation` (a group its load balancer's
//!   network interfaces release late) gives its slot back and is retried
//!   within a second or a few, for up to two minutes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Service};
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::ControllerContext;
use super::events::Events;
use super::schedule::keyed::{self, Class, Keyed, Taken, Workers};
use super::schedule::settle::Settle;
use crate::backoff::Backoff;
use crate::provider::Cloud;
use crate::provider::load_balancers::{
    EnsureRequest, LoadBalancerSpec, LoadBalancers, Scope, adopt_name, is_external, is_protected,
    next_resync_slot_at,
};

mod condition;
mod deletion;
mod due;
mod scope;

use due::{Due, plan, record, trigger};

const FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// Retries of a failed sync: upstream's `minRetryDelay` to `maxRetryDelay`.
const FAILED: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));
/// Retries of a sync waiting for AWS to release a resource: from 1 s,
/// doubling every 10 s of waiting up to 10 s, for at most
/// [`DEPENDENCY_PATIENCE`]; then it fails with a Warning like any other error.
const WAITING: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
const DEPENDENCY_PATIENCE: Duration = Duration::from_secs(120);

/// The queue the controller runs on: upstream's queue name, its backoff,
/// and backend-only syncs held while the node set still moves.
fn queue() -> Keyed {
    Keyed::settling("service", FAILED, Settle::NODE_SET)
}

/// Runs the controller until `stop` is cancelled.
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
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
        queue: queue(),
        workers: ctx.options.options.concurrent_service_syncs.max(1) as usize,
        resync: Some(ctx.options.options.service_resync_period).filter(|d| !d.is_zero()),
        cloud: ctx.cloud.clone(),
    };
    controller.run(stop).await;
}

/// Whether the controller manages this Service's load balancer at all.
pub(crate) fn wants_load_balancer(svc: &Service) -> bool {
    let spec = svc.spec.as_ref();
    svc.metadata.deletion_timestamp.is_none()
        && spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec.and_then(|s| s.load_balancer_class.as_ref()).is_none()
}

/// Whether the Service carries the controller's finalizer (its load
/// balancer may still exist).
pub(crate) fn has_finalizer(svc: &Service) -> bool {
    svc.finalizers().iter().any(|f| f == FINALIZER)
}

/// The EC2 instance a backend node is, by the project's one providerID
/// parser ([`crate::ids`]): `aws:///<zone>/i-…`, `aws://<zone>/i-…` or a bare
/// `i-…`. As upstream's `mapToAWSInstanceIDsTolerant`, a node without a
/// providerID (not initialized yet) or with one that names no instance is
/// left out of the backends; the second is logged, once per node and value.
pub(crate) fn instance_id(node: &Node) -> Option<String> {
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
fn is_backend(node: &Node, target_labels: &BTreeMap<String, String>) -> bool {
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
fn excluded_by_label(node: &Node) -> bool {
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
pub(crate) fn backends(
    nodes: &[Arc<Node>],
    target_labels: &BTreeMap<String, String>,
) -> BTreeSet<String> {
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

/// What this process knows of one Service: what it last saw, and what its
/// last sync made of it. Reconcile state; when the Service is due is the
/// queue's.
#[derive(Default)]
struct KeyState {
    derived: Option<Derived>,
    synced_fingerprint: Option<u64>,
    synced_backends: Option<u64>,
    /// [`Backends::node_set`] when the backends were last synced or found
    /// unchanged: a changed backend set waits until this moves.
    synced_node_set: Option<u64>,
    /// The [`Backends::node_set`] a backend-only sync was last asked for:
    /// a scan for another reason adds nothing, so only a node change
    /// extends the settling.
    asked_node_set: Option<u64>,
    last_sync: Option<Instant>,
    /// Since when syncs wait for an AWS resource another one still uses.
    waiting_since: Option<Instant>,
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
    queue: Keyed,
    /// `--concurrent-service-syncs`.
    workers: usize,
    /// `--service-resync-period`; `None` never resyncs an unchanged Service.
    resync: Option<Duration>,
    /// cloud.conf: its values the Go CCM fails NLB syncs on.
    cloud: Arc<crate::cloud_config::CloudConfig>,
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

/// A sync to run: what a Service's state says it must do when taken.
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

/// How urgent a Service's sync is. A user waits for it when the Service is
/// new (no finalizer or no load balancer yet), changed since this process
/// synced it, or is being deleted. Then a fresh leader's adoption: not yet
/// synced by this process. A Service's first sync reads what the
/// load-balancer sweep cannot show only when AWS lacks this CCM's record; a
/// resync reads it always. Adoption going first keeps the resync slots that
/// come due while others are still being adopted (every slot does in a
/// period shorter than the adoption) from holding the adoption back. Then
/// the rest: resyncs, backend moves of synced Services.
fn tier(entry: &KeyState, svc: &Service, service_changed: bool) -> Class {
    let changed = entry.synced_fingerprint.is_some() && service_changed;
    if changed || !has_finalizer(svc) || !wants_load_balancer(svc) || !has_ingress(svc) {
        Class::UserWaits
    } else if entry.last_sync.is_none() {
        Class::Adoption
    } else {
        Class::Background
    }
}

impl<L: LoadBalancers> ServiceController<L> {
    async fn run(self, stop: CancellationToken) {
        let this = self.clone();
        let work = self.queue.run(
            &stop,
            Workers::each(self.workers),
            move |taken: Vec<Taken>| {
                let this = this.clone();
                async move {
                    let mut outcomes = Vec::with_capacity(taken.len());
                    for t in &taken {
                        outcomes.push(this.work(t).await);
                    }
                    outcomes
                }
            },
        );
        let changes = vec![self.node_changes.clone(), self.service_changes.clone()];
        let triggers = keyed::scan_at_changes(&stop, changes, || self.scan());
        // The queue waits for running syncs before it returns.
        tokio::join!(triggers, work);
        condition::forget_all();
    }

    /// Adds to the queue every Service a change made due, and forgets the
    /// deleted ones.
    fn scan(&self) {
        // The generation is read before the store, so a change that lands
        // in between bumps it again and the next scan sees it.
        let node_generation = *self.node_changes.borrow();
        let mut nodes = self.node_list();
        let services = self.services.state();
        let mut state = self.state.lock();
        let mut index = self.index.lock();
        let live: HashSet<String> = services.iter().map(|s| key(s)).collect();
        state.retain(|k, _| {
            let alive = live.contains(k);
            if !alive {
                self.queue.forget(k);
                condition::forget(k);
            }
            alive
        });
        for svc in services {
            if !(wants_load_balancer(&svc) || has_finalizer(&svc) || condition::carried(&svc)) {
                continue;
            }
            let key = key(&svc);
            let entry = state.entry(key.clone()).or_default();
            let backends = |targets: &BTreeMap<String, String>| {
                index.get(node_generation, targets.clone(), &mut nodes)
            };
            self.add_if_due(entry, &svc, backends, || self.queue.failures(&key));
        }
    }

    /// Adds `svc` to the queue if a change made it due ([`trigger`]). A
    /// Service retrying a failure (`failures` in a row, or waiting for AWS)
    /// is synced in full at its retry, with the backends of then: a node
    /// change does not hasten it.
    fn add_if_due(
        &self,
        entry: &mut KeyState,
        svc: &Service,
        backends: impl FnMut(&BTreeMap<String, String>) -> Backends,
        failures: impl FnOnce() -> u32,
    ) {
        let retrying = |entry: &KeyState| entry.waiting_since.is_some() || failures() > 0;
        match trigger(entry, svc, backends, retrying) {
            Some(Due::Now(class)) => self.queue.add(&key(svc), class),
            Some(Due::Settled(class)) => self.queue.add_settled(&key(svc), class),
            None => {}
        }
    }

    /// The scan of one Service whose sync just ended done: a node change
    /// that came while it was retrying added nothing, and now may.
    fn scan_after_sync(&self, key: &str) {
        let Some(svc) = self.service(key) else {
            return;
        };
        let node_generation = *self.node_changes.borrow();
        let mut nodes = self.node_list();
        let mut state = self.state.lock();
        let mut index = self.index.lock();
        let Some(entry) = state.get_mut(key) else {
            return;
        };
        let backends = |targets: &BTreeMap<String, String>| {
            index.get(node_generation, targets.clone(), &mut nodes)
        };
        self.add_if_due(entry, &svc, backends, || 0);
    }

    /// The Nodes of the cache, listed once at the first call.
    fn node_list(&self) -> impl FnMut() -> Arc<Vec<Arc<Node>>> + '_ {
        let mut list: Option<Arc<Vec<Arc<Node>>>> = None;
        move || {
            list.get_or_insert_with(|| Arc::new(self.nodes.state()))
                .clone()
        }
    }

    /// One Service taken from the queue: its sync, if its state says one is
    /// needed, then, once it is done, its next resync slot.
    async fn work(&self, taken: &Taken) -> keyed::Outcome {
        let Some(svc) = self.service(&taken.key) else {
            return keyed::Outcome::Done;
        };
        if !(wants_load_balancer(&svc) || has_finalizer(&svc)) {
            // Left `type: LoadBalancer` before it had a load balancer (a
            // refused or held value): nothing in AWS, only the condition.
            let api = Api::namespaced(self.kube.clone(), &svc.namespace().unwrap_or_default());
            condition::cleared(&api, &svc).await;
            return keyed::Outcome::Done;
        }
        let job = {
            let node_generation = *self.node_changes.borrow();
            let mut nodes = self.node_list();
            let mut state = self.state.lock();
            let mut index = self.index.lock();
            let entry = state.entry(taken.key.clone()).or_default();
            let backends = |targets: &BTreeMap<String, String>| {
                index.get(node_generation, targets.clone(), &mut nodes)
            };
            plan(
                entry,
                svc.clone(),
                backends,
                taken.failures,
                self.resync,
                Instant::now(),
            )
        };
        let outcome = match job {
            // Nothing moved since the last sync (a change undone, a backend
            // set back where it was).
            None => keyed::Outcome::Done,
            Some(job) => {
                let span = tracing::info_span!("sync_service", service = %job.key);
                let outcome = self.sync(&job).instrument(span).await;
                let mut state = self.state.lock();
                let entry = state.entry(job.key.clone()).or_default();
                record(entry, &job, outcome, Instant::now())
            }
        };
        // A retry is due by the backoff; its end adds the resync.
        if outcome == keyed::Outcome::Done {
            self.scan_after_sync(&taken.key);
            self.resync_later(&taken.key, &svc);
        }
        outcome
    }

    /// Adds the Service at its next resync slot, while it still exists.
    fn resync_later(&self, key: &str, svc: &Service) {
        let Some(every) = self.resync else { return };
        let Some(last) = self.state.lock().get(key).and_then(|e| e.last_sync) else {
            return;
        };
        if self.service(key).is_some() {
            let uid = svc.metadata.uid.as_deref().unwrap_or_default();
            let at = next_resync_slot_at(uid, every, last);
            self.queue.add_at(key, at, Class::Background);
        }
    }

    /// The cached Service of `key` (`namespace/name`).
    fn service(&self, key: &str) -> Option<Arc<Service>> {
        let (ns, name) = key.split_once('/')?;
        self.services.get(&ObjectRef::new(name).within(ns))
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
            condition::cleared(&api, svc).await;
            return Outcome::Done;
        }
        let obj = svc.object_ref(&());
        let reading = LoadBalancerSpec::read_with(svc, &self.cloud);
        let Some(scope) = self.read_scope(svc, &api, &reading, service_changed).await else {
            return Outcome::Invalid;
        };
        let spec = reading.spec;
        if !has_finalizer(svc)
            && let Err(e) = self.set_finalizer(&api, svc, true).await
        {
            tracing::warn!(error = %e, "failed to add the finalizer; nothing created");
            condition::write_failed(&api, svc, "add the finalizer", &e).await;
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
                match self.ensured(svc, &api, done, false, false).await {
                    Outcome::Done => Outcome::Invalid,
                    other => other,
                }
            }
            Ok(done) => self.ensured(svc, &api, done, service_changed, true).await,
            Err(e) if may_wait && e.in_use() => {
                tracing::info!(error = %e, "an AWS resource is still in use; retrying soon");
                Outcome::Waiting
            }
            Err(e) => self.ensure_failed(svc, &api, e, service_changed).await,
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
        let mut kept = None;
        if !handed_over {
            self.events
                .normal(&obj, "DeletingLoadBalancer", "Deleting load balancer")
                .await;
            let deleted = (self.lbs)
                .ensure_deleted(
                    &key(svc),
                    &uid,
                    is_protected(svc),
                    adopt_name(svc).as_deref(),
                )
                .await;
            match deleted {
                Ok(removed) => kept = removed.kept,
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
        self.deletion_event(svc, &uid, handed_over, kept).await;
        condition::cleared(api, svc).await;
        Outcome::Done
    }

    /// Publishes an ensured load balancer: the status, IAM's refusals, the
    /// events, and, for a sync in `full`, that it finished.
    async fn ensured(
        &self,
        svc: &Service,
        api: &Api<Service>,
        done: crate::provider::load_balancers::Ensured,
        service_changed: bool,
        full: bool,
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
                condition::write_failed(api, svc, "write the load balancer status", &e).await;
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
            let what = format!("Updated load balancer: {}", done.changes.join("; "));
            self.events.normal(&obj, "UpdatedLoadBalancer", what).await;
        }
        if full {
            condition::finished(api, svc).await;
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
pub(crate) fn has_load_balancer(svc: &Service) -> bool {
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
    use tokio_util::sync::CancellationToken;

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

    /// Adoption (issue 45): the status naming the adopted load balancer
    /// (the held name a sync follows once the annotation goes) is no
    /// change to sync for; adding or removing `aws-load-balancer-name` is
    /// one, as any annotation.
    #[test]
    fn the_held_name_in_the_status_is_no_change_the_name_annotation_is() {
        let svc = lb_service("1", "10");
        let mut held = (*svc).clone();
        held.status = Some(
            serde_json::from_value(serde_json::json!({"loadBalancer": {"ingress": [
            {"hostname": "a0123456789abcdef0123456789abcde-1.us-east-1.elb.amazonaws.com"}]}}))
            .unwrap(),
        );
        assert!(
            crate::aws::annotations::held_name(&held).is_none(),
            "no UID: nothing held"
        );
        held.metadata.uid = Some("fedcba98-7654-3210-fedc-ba9876543210".into());
        let mut before = (*svc).clone();
        before.metadata.uid = held.metadata.uid.clone();
        assert!(crate::aws::annotations::held_name(&held).is_some());
        assert_eq!(fingerprint(&held), fingerprint(&before));
        let mut named = before.clone();
        named.metadata.annotations.get_or_insert_default().insert(
            crate::aws::annotations::NAME.to_string(),
            "a0123456789abcdef0123456789abcde".into(),
        );
        assert_ne!(fingerprint(&named), fingerprint(&before));
    }

    fn no_backends(_: &BTreeMap<String, String>) -> Backends {
        Backends {
            hash: 0,
            ids: Arc::new(BTreeSet::new()),
            node_set: 0,
        }
    }

    /// What the queue handed out, and when.
    type Handed = Arc<Mutex<Vec<(Instant, Taken)>>>;

    /// Runs `q` as the controller does, with one worker whose every sync
    /// ends as `outcome`.
    fn work_on(q: &Keyed, outcome: keyed::Outcome) -> (Handed, CancellationToken) {
        let taken: Handed = Arc::default();
        let stop = CancellationToken::new();
        let (q, st, t) = (q.clone(), stop.clone(), taken.clone());
        tokio::spawn(async move {
            q.run(&st, Workers::each(1), move |keys: Vec<Taken>| {
                let t = t.clone();
                async move {
                    let now = Instant::now();
                    t.lock().extend(keys.iter().map(|k| (now, k.clone())));
                    vec![outcome; keys.len()]
                }
            })
            .await
        });
        (taken, stop)
    }

    /// Lets the queue's loop and works run until nothing is ready now.
    async fn settle() {
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
    }

    /// What a scan adds for `svc`: `q.add` for a change of the Service
    /// itself, `q.add_settled` for a backend move. Returns the class.
    fn scan_one(
        q: &Keyed,
        entry: &mut KeyState,
        svc: &Service,
        backends: impl FnMut(&BTreeMap<String, String>) -> Backends,
    ) -> Option<Due> {
        let retrying = |e: &KeyState| e.waiting_since.is_some() || q.failures(&key(svc)) > 0;
        let due = trigger(entry, svc, backends, retrying);
        match &due {
            Some(Due::Now(class)) => q.add(&key(svc), *class),
            Some(Due::Settled(class)) => q.add_settled(&key(svc), *class),
            None => {}
        }
        due
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_service_waits_out_its_backoff_unless_it_changed() {
        let q = queue();
        let (taken, _stop) = work_on(&q, keyed::Outcome::Retry);
        let t0 = Instant::now();
        let mut entry = KeyState::default();
        let broken = lb_service("1", "often");
        assert!(scan_one(&q, &mut entry, &broken, no_backends).is_some());
        settle().await;
        assert_eq!(taken.lock().len(), 1, "a new Service is synced at once");
        entry.last_sync = Some(t0);
        // Its status written (a new resourceVersion, the same fingerprint):
        // nothing is added, the backoff holds for upstream's 5 s.
        assert_eq!(
            scan_one(&q, &mut entry, &lb_service("2", "often"), no_backends),
            None
        );
        tokio::time::advance(Duration::from_millis(4_999)).await;
        settle().await;
        assert_eq!(taken.lock().len(), 1, "the backoff holds");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        {
            let taken = taken.lock();
            assert_eq!(taken.len(), 2);
            assert_eq!(taken[1].0 - t0, FAILED.first, "the retry comes at 5 s");
            assert_eq!(taken[1].1.failures, 1);
        }
        // The next wait is 10 s; a fix 3 s into it is synced at once.
        tokio::time::advance(Duration::from_secs(3)).await;
        let fixed = lb_service("3", "10");
        assert!(scan_one(&q, &mut entry, &fixed, no_backends).is_some());
        settle().await;
        let taken = taken.lock();
        assert_eq!(taken.len(), 3, "a changed Service beats its backoff");
        assert_eq!(taken[2].0 - t0, Duration::from_secs(8));
        let job = plan(
            &mut entry,
            fixed.clone(),
            no_backends,
            2,
            None,
            Instant::now(),
        )
        .expect("the fix is synced");
        assert!(job.service_changed && job.may_wait && !job.targets_only);
        assert_eq!(job.fingerprint, fingerprint(&fixed));
    }

    /// The state a successful sync of `svc` left.
    fn synced(svc: &Service, now: Instant) -> KeyState {
        let mut entry = KeyState {
            synced_fingerprint: Some(fingerprint(svc)),
            synced_backends: Some(0),
            synced_node_set: Some(0),
            last_sync: Some(now),
            ..KeyState::default()
        };
        derive_for_test(&mut entry, svc);
        entry
    }

    /// `entry` has seen `svc` (a scan derived it).
    fn derive_for_test(entry: &mut KeyState, svc: &Service) {
        trigger(entry, svc, no_backends, |_| true);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_on_a_dependency_is_bounded() {
        let now = Instant::now();
        let svc = lb_service("1", "10");
        let mut entry = synced(&svc, now);
        entry.waiting_since = Some(now);
        let job = plan(&mut entry, svc.clone(), no_backends, 0, None, now).expect("due");
        assert!(job.may_wait && !job.targets_only);
        // Retried after 1 s at first, up to 10 s after 40 s of waiting;
        // not a failure.
        let s = Duration::from_secs;
        let after = |entry: &mut KeyState, at| record(entry, &job, Outcome::Waiting, at);
        assert_eq!(after(&mut entry, now), keyed::Outcome::RetryAfter(s(1)));
        assert_eq!(
            after(&mut entry, now + s(30)),
            keyed::Outcome::RetryAfter(s(8))
        );
        assert_eq!(
            after(&mut entry, now + s(40)),
            keyed::Outcome::RetryAfter(s(10))
        );
        let mut entry = synced(&svc, now);
        entry.waiting_since = Some(now - DEPENDENCY_PATIENCE);
        let job = plan(&mut entry, svc, no_backends, 0, None, now).expect("due");
        assert!(
            !job.may_wait,
            "after two minutes it is reported like any failure"
        );
        assert_eq!(
            record(&mut entry, &job, Outcome::Failed, now),
            keyed::Outcome::Retry
        );
        assert_eq!(entry.waiting_since, None);
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
        let class =
            |entry: &mut KeyState, svc: &Service| match trigger(entry, svc, no_backends, |_| false)
            {
                Some(Due::Now(class)) => class,
                other => panic!("{}: added now, not {other:?}", key(svc)),
            };
        // A fresh leader adopting a Service that has its load balancer.
        assert_eq!(
            class(&mut KeyState::default(), &adopted("old", "u1")),
            Class::Adoption,
            "adoption waits"
        );
        // Once synced by this process, its resyncs and backend moves wait
        // behind the Services this process has not synced yet.
        let entry = synced(&adopted("old", "u1"), now);
        assert_eq!(
            tier(&entry, &adopted("old", "u1"), false),
            Class::Background
        );
        assert!(Class::UserWaits < Class::Adoption && Class::Adoption < Class::Background);
        // New: no finalizer, or no load balancer yet.
        let new = lb_service("1", "10");
        assert_eq!(class(&mut KeyState::default(), &new), Class::UserWaits);
        let mut fresh = (*adopted("new", "u2")).clone();
        fresh.status = None;
        assert_eq!(class(&mut KeyState::default(), &fresh), Class::UserWaits);
        // Changed since this process synced it.
        let mut entry = synced(&adopted("old", "u1"), now);
        let mut changed = (*adopted("old", "u1")).clone();
        changed.metadata.resource_version = Some("2".into());
        changed.metadata.annotations = Some(BTreeMap::from([("a".into(), "b".into())]));
        assert_eq!(class(&mut entry, &changed), Class::UserWaits);
        // Being deleted.
        let mut deleting = serde_json::to_value(&*adopted("gone", "u3")).unwrap();
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        let deleting: Service = serde_json::from_value(deleting).unwrap();
        assert_eq!(class(&mut KeyState::default(), &deleting), Class::UserWaits);
        // In the queue, in that order whatever the order they came due in.
        let q = queue();
        q.add("resync", Class::Background);
        q.add("adopt", Class::Adoption);
        q.add("new", Class::UserWaits);
        let (taken, _stop) = work_on(&q, keyed::Outcome::Done);
        settle().await;
        let order: Vec<String> = taken.lock().iter().map(|(_, t)| t.key.clone()).collect();
        assert_eq!(order, ["new", "adopt", "resync"]);
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

    /// A synced Service is added at `next_resync_slot_at` its last sync: it
    /// must be the first instant at which `plan` finds a resync due, never
    /// later (a missed resync) and never earlier (a sync for nothing).
    #[tokio::test(start_paused = true)]
    async fn the_resync_slot_is_when_plan_finds_the_resync_due() {
        let every = Duration::from_secs(100);
        let one_ms = Duration::from_millis(1);
        let synced = Instant::now();
        for i in 0..50 {
            let svc = adopted(&format!("s{i}"), &format!("uid-{i}"));
            let uid = svc.metadata.uid.clone().unwrap();
            let mut entry = super::tests::synced(&svc, synced);
            let at = next_resync_slot_at(&uid, every, synced);
            assert!(
                at > synced && at <= synced + every,
                "{i}: within one period"
            );
            let before = at.checked_sub(one_ms).unwrap();
            let plan_at = |entry: &mut KeyState, t| {
                plan(entry, svc.clone(), backends_hashed(0), 0, Some(every), t)
            };
            assert!(plan_at(&mut entry, before).is_none(), "{i}: not yet");
            let job = plan_at(&mut entry, at).expect("the resync is due at its slot");
            assert!(!job.targets_only && !job.service_changed);
        }
        // Without a resync period, an unchanged Service has nothing to do.
        let svc = adopted("s0", "uid-0");
        let mut entry = super::tests::synced(&svc, synced);
        let much_later = synced + every * 100;
        assert!(plan(&mut entry, svc, backends_hashed(0), 0, None, much_later).is_none());
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
        let synced = || {
            let mut entry = super::tests::synced(&svc, now);
            entry.synced_backends = Some(1);
            entry.synced_node_set = Some(1);
            entry
        };
        let resync = Some(Duration::from_secs(600));
        let mut entry = synced();
        let job = plan(&mut entry, svc.clone(), backends_hashed(2), 0, resync, now)
            .expect("a new backend set is synced");
        assert!(job.targets_only && !job.service_changed);
        // The Service changed too: the full ensure.
        let mut entry = synced();
        let changed = lb_service("2", "20");
        let job = plan(&mut entry, changed, backends_hashed(2), 0, resync, now).expect("due");
        assert!(!job.targets_only && job.service_changed);
        // A retry after a failure or a wait, and a due resync, ensure in full.
        let mut entry = synced();
        let job = plan(&mut entry, svc.clone(), backends_hashed(2), 1, resync, now).expect("due");
        assert!(!job.targets_only);
        let mut entry = synced();
        entry.waiting_since = Some(now);
        let job = plan(&mut entry, svc.clone(), backends_hashed(2), 0, resync, now).expect("due");
        assert!(!job.targets_only);
        let mut entry = synced();
        let later = now + Duration::from_secs(601);
        let job = plan(
            &mut entry,
            svc.clone(),
            backends_hashed(2),
            0,
            resync,
            later,
        )
        .expect("due");
        assert!(!job.targets_only);
        // Never synced: in full.
        let mut entry = KeyState::default();
        let job = plan(&mut entry, svc, backends_hashed(2), 0, resync, now).expect("due");
        assert!(!job.targets_only);
    }

    /// A backend move is added to settle once per node set: a scan for
    /// another reason does not extend the settling, a node change does; a
    /// Service retrying a failure waits for its retry. In the queue it goes
    /// once the node set was quiet for 2 s.
    #[tokio::test(start_paused = true)]
    async fn a_backend_move_settles_and_waits_for_a_retry() {
        let now = Instant::now();
        let svc = adopted("web", "uid-web");
        let q = queue();
        let mut entry = synced(&svc, now);
        let moved = scan_one(&q, &mut entry, &svc, backends_hashed(2));
        assert_eq!(moved, Some(Due::Settled(Class::Background)));
        assert_eq!(scan_one(&q, &mut entry, &svc, backends_hashed(2)), None);
        assert_eq!(
            scan_one(&q, &mut entry, &svc, backends_hashed(3)),
            Some(Due::Settled(Class::Background))
        );
        let mut failing = synced(&svc, now);
        assert_eq!(
            trigger(&mut failing, &svc, backends_hashed(2), |_| true),
            None
        );
        // Its retry done (with the backends it planned before the move),
        // the scan after it adds the move.
        assert_eq!(
            trigger(&mut failing, &svc, backends_hashed(2), |_| false),
            Some(Due::Settled(Class::Background))
        );
        let (taken, _stop) = work_on(&q, keyed::Outcome::Done);
        tokio::time::advance(Settle::NODE_SET.0 - Duration::from_millis(1)).await;
        settle().await;
        assert!(taken.lock().is_empty(), "still settling");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        let taken = taken.lock();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].0 - now, Settle::NODE_SET.0);
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
        let mut entry = KeyState {
            synced_fingerprint: Some(fingerprint(svc)),
            synced_backends: Some(backends.hash),
            synced_node_set: Some(backends.node_set),
            last_sync: Some(now),
            ..KeyState::default()
        };
        derive_for_test(&mut entry, svc);
        entry
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
        let no_retry = |_: &KeyState| false;
        assert_eq!(
            trigger(&mut entry, &svc, |_| tainted_set.clone(), no_retry),
            None,
            "the taint alone adds nothing to the queue"
        );
        assert!(
            plan(
                &mut entry,
                svc.clone(),
                |_| tainted_set.clone(),
                0,
                None,
                now
            )
            .is_none(),
            "the taint alone starts no sync: b stays registered"
        );
        let changed = lb_service("2", "20");
        let job = plan(&mut entry, changed, |_| tainted_set.clone(), 0, None, now)
            .expect("a Service change syncs");
        assert!(!job.targets_only);
        assert_eq!(*job.backends.expect("backends").ids, ids(&["a"]));
        let mut joined = tainted;
        joined.push(node("c", &[], None));
        let joined_set = at(3, joined);
        let job = plan(&mut entry, svc, |_| joined_set.clone(), 0, None, now)
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
        assert!(plan(&mut entry, svc.clone(), |_| draining.clone(), 0, None, now).is_none());
        let gone = at(3, vec![a]);
        let job = plan(&mut entry, svc, |_| gone.clone(), 0, None, now).expect("the Node is gone");
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
        let job = plan(&mut entry, svc, |_| labelled.clone(), 0, None, now)
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
        assert!(plan(&mut entry, svc.clone(), |_| joined.clone(), 0, None, now).is_none());
        assert_eq!(entry.synced_node_set, Some(joined.node_set));
        let tainted = at(3, vec![node("a", &[], Some(TO_BE_DELETED_TAINT)), excluded]);
        assert!(plan(&mut entry, svc, |_| tainted.clone(), 0, None, now).is_none());
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
