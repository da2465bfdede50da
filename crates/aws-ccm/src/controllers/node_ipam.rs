// A set pass on the periodic runner (schedule/periodic.rs), not a keyed reconcile: each start must rebuild the taken-CIDR map from a consistent list before any allocation, and allocation order and reservations span all nodes, not one object at a time.
//! Node IPAM (`nodeipam`, `node-ipam-controller`) with
//! `--allocate-node-cidrs=true`: gives every node without one a pod CIDR
//! (`spec.podCIDR` / `spec.podCIDRs`, one per `--cluster-cidr` family) cut
//! from `--cluster-cidr` at the node mask, as upstream's range allocator.
//!
//! No CIDR is ever given to two nodes:
//! - before allocating anything, each start (every start is a new
//!   leadership) rebuilds the map of taken CIDRs from a consistent list of
//!   the nodes, not from a cache that may lag behind the previous leader;
//! - a CIDR is reserved in the map before the node is patched, so concurrent
//!   patches never pick the same one;
//! - the patch carries the node's `resourceVersion` (and UID) as a
//!   precondition: `podCIDRs` is immutable once set, so on a conflict the
//!   node is read again, and if someone else gave it CIDRs those are taken
//!   and ours released;
//! - CIDRs are released only when a node the cache has shown is deleted.
//!
//! A full range is a `CIDRNotAvailable` Warning event on the node (once per
//! node until it gets a CIDR) and the `node_ipam_cidrs_free` gauge at 0.

mod allocator;
pub mod guard;

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use ipnet::IpNet;
use kube::Api;
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::allocator::Allocator;
use self::guard::{OtherAllocator, Sign};
use super::ControllerContext;
use super::events::Events;
use super::route::publish::node_ref;
use super::schedule::periodic::{Pass, Periodic, SetPass};
use super::schedule::settle::Settle;
use crate::backoff::Backoff;
use crate::options::cidrs::NodeCidrAllocation;
use crate::provider::Cloud;

/// Node patches in flight at once (the kube client rate-limits underneath).
const CONCURRENT_PATCHES: usize = 8;
/// Attempts per node when its resourceVersion keeps moving.
const PATCH_ATTEMPTS: u32 = 4;
/// The next pass after a failed one (the start-up list, or a node's
/// patch): 500 ms, doubling to 30 s, so a start is not held up long by a
/// blip of the API server and a failing one is not hammered.
const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

const EVENT_CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
const EVENT_CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
#[allow(non_snake_case)]
struct ClusterCidrLabel {
    clusterCIDR: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CidrLabels {
    cluster_cidr: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    cluster_cidr: String,
    reason: String,
}

#[derive(Default)]
struct Metrics {
    free: Family<CidrLabels, Gauge>,
    used: Family<CidrLabels, Gauge>,
    failures: Family<FailureLabels, Counter>,
    allocations: Family<ClusterCidrLabel, Counter>,
    releases: Family<ClusterCidrLabel, Counter>,
    usage: Family<ClusterCidrLabel, Gauge<f64, AtomicU64>>,
    other_allocator: Gauge,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = Metrics::default();
    crate::metrics::register(
        "node_ipam_other_allocator_detected",
        "1 when node IPAM stopped because another pod CIDR allocator is at work",
        m.other_allocator.clone(),
    );
    crate::metrics::register(
        "node_ipam_cidrs_free",
        "Node CIDRs still free in each cluster CIDR",
        m.free.clone(),
    );
    crate::metrics::register(
        "node_ipam_cidrs_used",
        "Node CIDRs in use in each cluster CIDR",
        m.used.clone(),
    );
    crate::metrics::register(
        "node_ipam_allocation_failures",
        "Nodes that could not be given a CIDR, by reason (exhausted, patch_failed)",
        m.failures.clone(),
    );
    // Upstream's names, for existing dashboards.
    crate::metrics::register(
        "node_ipam_controller_cidrset_cidrs_allocations",
        "Counter measuring total number of CIDR allocations",
        m.allocations.clone(),
    );
    crate::metrics::register(
        "node_ipam_controller_cidrset_cidrs_releases",
        "Counter measuring total number of CIDR releases",
        m.releases.clone(),
    );
    crate::metrics::register(
        "node_ipam_controller_cidrset_usage_cidrs",
        "Gauge measuring percentage of allocated CIDRs",
        m.usage.clone(),
    );
    m
});

fn upstream_label(cidr: &IpNet) -> ClusterCidrLabel {
    ClusterCidrLabel {
        clusterCIDR: cidr.to_string(),
    }
}

/// The pod CIDRs a node holds (`spec.podCIDRs`, else `spec.podCIDR`), parsed.
pub fn pod_cidrs(node: &Node) -> Vec<IpNet> {
    let Some(spec) = node.spec.as_ref() else {
        return Vec::new();
    };
    let list: Vec<&String> = match &spec.pod_cidrs {
        Some(list) if !list.is_empty() => list.iter().collect(),
        _ => spec.pod_cidr.iter().collect(),
    };
    list.into_iter()
        .filter_map(|c| c.parse::<IpNet>().ok().map(|n| n.trunc()))
        .collect()
}

/// The start-up sign of another allocator: CIDRs of `node` outside every
/// `--cluster-cidr`.
fn outside_sign(node: &str, occupied: &allocator::Occupied) -> Option<OtherAllocator> {
    (!occupied.outside.is_empty()).then(|| OtherAllocator {
        node: node.to_string(),
        cidrs: occupied.outside.clone(),
        sign: Sign::OutsideClusterCidr,
    })
}

/// What a start of node IPAM would see in `nodes` (one list): the first
/// node holding CIDRs outside `--cluster-cidr` (another allocator at work,
/// node IPAM would stand down), and each node holding a CIDR another node
/// holds too, with those CIDRs. `aws-ccm doctor` reports them.
pub(crate) fn start_up_signs(
    config: &NodeCidrAllocation,
    nodes: &[Node],
) -> (Option<OtherAllocator>, Vec<(String, Vec<IpNet>)>) {
    let mut allocator = Allocator::new(&config.ranges);
    let (mut other, mut overlaps) = (None, Vec::new());
    for node in nodes {
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            continue;
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let occupied = allocator.occupy(&cidrs);
        if other.is_none() {
            other = outside_sign(&name, &occupied);
        }
        if !occupied.already_taken.is_empty() {
            overlaps.push((name, occupied.already_taken));
        }
    }
    (other, overlaps)
}

/// What a node holds, as far as this controller knows.
#[derive(Clone, Debug)]
struct Held {
    name: String,
    cidrs: Vec<IpNet>,
    /// The node cache has shown this node (only then may its absence from
    /// the cache mean it was deleted).
    seen: bool,
}

/// How one node's patch ended.
pub enum PatchOutcome {
    Assigned,
    /// Someone else set the node's CIDRs first.
    TakenByOther(Vec<IpNet>),
    /// The node was deleted (or replaced by a new one of the same name).
    Gone,
    Failed(String),
}

/// The allocator plus the bookkeeping around it.
struct Ipam {
    config: NodeCidrAllocation,
    allocator: Allocator,
    api: Api<Node>,
    events: Events,
    /// By node UID.
    held: HashMap<String, Held>,
    /// Nodes already told their range is full (by UID).
    exhausted_warned: HashSet<String>,
    /// Nodes whose last patch failed (by UID): warned once, tried again
    /// at the next pass, which the runner brings after its backoff.
    failed: HashSet<String>,
    /// The start-up list was read ([`Ipam::rebuild`]): allocating may begin.
    rebuilt: bool,
    /// Set on the first sign of another allocator; nothing is allocated
    /// after it.
    other: Option<OtherAllocator>,
}

impl Ipam {
    fn new(config: NodeCidrAllocation, api: Api<Node>, events: Events) -> Ipam {
        Ipam {
            allocator: Allocator::new(&config.ranges),
            config,
            api,
            events,
            held: HashMap::new(),
            exhausted_warned: HashSet::new(),
            failed: HashSet::new(),
            rebuilt: false,
            other: None,
        }
    }

    /// Takes every CIDR the nodes hold, from a consistent (quorum) list.
    async fn rebuild(&mut self) -> Result<(), kube::Error> {
        let mut allocator = Allocator::new(&self.config.ranges);
        let mut held = HashMap::new();
        let mut count = 0;
        let other = &mut self.other;
        let each = |page: Vec<Node>| {
            count += page.len();
            for node in &page {
                let cidrs = pod_cidrs(node);
                let (Some(uid), false) = (node.metadata.uid.clone(), cidrs.is_empty()) else {
                    continue;
                };
                let name = node.metadata.name.clone().unwrap_or_default();
                let occupied = allocator.occupy(&cidrs);
                if other.is_none() {
                    *other = outside_sign(&name, &occupied);
                }
                report_occupy(&name, &cidrs, occupied);
                held.insert(
                    uid,
                    Held {
                        name,
                        cidrs,
                        seen: false,
                    },
                );
            }
        };
        super::cached_node::list_all(&self.api, each).await?;
        self.allocator = allocator;
        self.held = held;
        tracing::info!(nodes = count, allocator = %self.allocator, "node CIDR map rebuilt from the API server");
        self.update_gauges();
        Ok(())
    }

    fn update_gauges(&self) {
        let m = &*METRICS;
        for set in self.allocator.sets() {
            let labels = CidrLabels {
                cluster_cidr: set.cluster_cidr().to_string(),
            };
            m.free.get_or_create(&labels).set(i64::from(set.free()));
            m.used.get_or_create(&labels).set(i64::from(set.used()));
            m.usage
                .get_or_create(&upstream_label(&set.cluster_cidr()))
                .set(f64::from(set.used()) / f64::from(set.total()));
        }
    }

    fn count(&self, family: &Family<ClusterCidrLabel, Counter>, cidrs: &[IpNet]) {
        for cidr in cidrs {
            if let Some(set) = self
                .allocator
                .sets()
                .iter()
                .find(|s| s.cluster_cidr().contains(cidr))
            {
                family
                    .get_or_create(&upstream_label(&set.cluster_cidr()))
                    .inc();
            }
        }
    }

    /// Notes that `uid` holds `cidrs` (taken in the allocator already).
    fn hold(&mut self, uid: &str, name: String, cidrs: Vec<IpNet>) {
        let held = Held {
            name,
            cidrs,
            seen: true,
        };
        self.held.insert(uid.to_string(), held);
    }

    /// Forgets what `uid` held and frees it in the allocator.
    fn unhold(&mut self, uid: &str) -> Option<Held> {
        let held = self.held.remove(uid)?;
        self.allocator.release(&held.cidrs);
        Some(held)
    }

    /// CIDRs someone else gave `uid`: a sign of another allocator, taken
    /// into the map in place of what `uid` held.
    fn adopt(&mut self, uid: &str, name: String, cidrs: Vec<IpNet>, sign: Sign) {
        saw_other(&mut self.other, &name, &cidrs, sign);
        self.unhold(uid);
        report_occupy(&name, &cidrs, self.allocator.occupy(&cidrs));
        self.hold(uid, name, cidrs);
    }

    /// One pass of the runner: the consistent list until it has been read,
    /// then a sync of the cache; to be done again soon while either fails.
    /// Once another allocator is seen, nothing more (said once).
    async fn pass(&mut self, nodes: &[std::sync::Arc<Node>]) -> Pass {
        let stood_down = self.other.is_some();
        if !stood_down {
            if !self.rebuilt {
                if let Err(e) = self.rebuild().await {
                    tracing::error!(error = %e, "listing nodes to rebuild the CIDR map failed; nothing is allocated until it succeeds");
                    return Pass::Retry;
                }
                self.rebuilt = true;
            }
            self.sync(nodes).await;
        }
        if let Some(other) = &self.other {
            if !stood_down {
                METRICS.other_allocator.set(1);
                tracing::error!("{other}");
            }
            return Pass::Done;
        }
        if self.failed.is_empty() {
            Pass::Done
        } else {
            Pass::Retry
        }
    }

    /// One sync of the node cache: take what others assigned, release what
    /// deleted nodes held, allocate for nodes without CIDRs.
    async fn sync(&mut self, nodes: &[std::sync::Arc<Node>]) {
        if self.other.is_some() {
            return;
        }
        let (live, candidates) = self.observe(nodes);
        self.release_deleted(&live);
        if self.other.is_some() {
            return;
        }
        let patches = self.reserve(candidates).await;
        self.update_gauges();
        if patches.is_empty() {
            return;
        }
        for (name, uid, cidrs, outcome) in self.send(patches).await {
            self.record(name, uid, cidrs, outcome).await;
        }
        self.update_gauges();
    }

    /// Takes the CIDRs nodes already have into the map (noting any that
    /// another allocator assigned); returns the live node UIDs and the nodes
    /// that need CIDRs now.
    fn observe<'n>(
        &mut self,
        nodes: &'n [std::sync::Arc<Node>],
    ) -> (HashSet<&'n str>, Vec<&'n Node>) {
        let mut live: HashSet<&str> = HashSet::with_capacity(nodes.len());
        let mut candidates: Vec<&Node> = Vec::new();
        for node in nodes {
            let Some(uid) = node.metadata.uid.as_deref() else {
                continue;
            };
            live.insert(uid);
            let name = node.metadata.name.clone().unwrap_or_default();
            let cidrs = pod_cidrs(node);
            let held = self.held.get_mut(uid).map(|held| {
                held.seen = true;
                cidrs.is_empty() || cidrs == held.cidrs
            });
            match held {
                Some(true) => {}
                // Changed by someone else (podCIDRs is immutable in a real
                // cluster, but keep the map true anyway), or neither in the
                // consistent start-up list nor written here.
                Some(false) => self.adopt(uid, name, cidrs, Sign::AssignedByOther),
                None if !cidrs.is_empty() => self.adopt(uid, name, cidrs, Sign::AssignedByOther),
                None => {
                    if node.metadata.deletion_timestamp.is_none() {
                        candidates.push(node);
                    }
                }
            }
        }
        (live, candidates)
    }

    /// Releases what deleted nodes held.
    fn release_deleted(&mut self, live: &HashSet<&str>) {
        let gone: Vec<String> = self
            .held
            .iter()
            .filter(|(uid, h)| h.seen && !live.contains(uid.as_str()))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            if let Some(held) = self.unhold(&uid) {
                self.count(&METRICS.releases, &held.cidrs);
                tracing::info!(node = %held.name, cidrs = ?held.cidrs, "node deleted; released its pod CIDRs");
            }
        }
        // Retries and warnings of nodes no longer live, the deleted ones too.
        self.failed.retain(|uid| live.contains(uid.as_str()));
        self.exhausted_warned
            .retain(|uid| live.contains(uid.as_str()));
    }

    /// Decides each candidate's CIDRs, reserving them before any patch is
    /// sent; a full range is a `CIDRNotAvailable` event, once per node.
    async fn reserve(&mut self, mut candidates: Vec<&Node>) -> Vec<PodCidrPatch> {
        candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut patches = Vec::new();
        for node in candidates {
            let uid = node.metadata.uid.clone().unwrap_or_default();
            let name = node.metadata.name.clone().unwrap_or_default();
            match self.allocator.allocate() {
                Ok(cidrs) => {
                    self.hold(&uid, name.clone(), cidrs.clone());
                    patches.push((name, uid, node.metadata.resource_version.clone(), cidrs));
                }
                Err(exhausted) => {
                    count_failure(&exhausted.cluster_cidr, "exhausted");
                    if self.exhausted_warned.insert(uid) {
                        let note = format!(
                            "Node {name} status is now: CIDRNotAvailable: {exhausted}. The node gets no pod CIDR \
                             until another node is deleted; widen --cluster-cidr or use a longer node mask \
                             (--node-cidr-mask-size-ipv4 / -ipv6) to fit more nodes"
                        );
                        tracing::warn!(node = %name, "{note}");
                        self.events
                            .warning(&node_ref(&name), EVENT_CIDR_NOT_AVAILABLE, note)
                            .await;
                    }
                }
            }
        }
        patches
    }

    /// Sends the patches, [`CONCURRENT_PATCHES`] at a time.
    async fn send(
        &self,
        patches: Vec<PodCidrPatch>,
    ) -> Vec<(String, String, Vec<IpNet>, PatchOutcome)> {
        let mut futures = Vec::with_capacity(patches.len());
        for (name, uid, rv, cidrs) in patches {
            let api = self.api.clone();
            futures.push(async move {
                let outcome = patch_pod_cidrs(&api, &name, &uid, rv, &cidrs).await;
                (name, uid, cidrs, outcome)
            });
        }
        futures::stream::iter(futures)
            .buffer_unordered(CONCURRENT_PATCHES)
            .collect()
            .await
    }

    /// Takes a patch's outcome into the map, the failed set and the metrics.
    async fn record(
        &mut self,
        name: String,
        uid: String,
        cidrs: Vec<IpNet>,
        outcome: PatchOutcome,
    ) {
        match outcome {
            PatchOutcome::Assigned => {
                tracing::info!(node = %name, cidrs = ?cidrs, "assigned pod CIDRs");
                self.count(&METRICS.allocations, &cidrs);
                self.exhausted_warned.remove(&uid);
                self.failed.remove(&uid);
            }
            PatchOutcome::TakenByOther(theirs) => {
                tracing::info!(node = %name, ours = ?cidrs, theirs = ?theirs, "node got pod CIDRs from someone else first; keeping theirs");
                // Ours, reserved for it, are released.
                self.adopt(&uid, name, theirs, Sign::LostRace);
            }
            PatchOutcome::Gone => {
                self.unhold(&uid);
            }
            PatchOutcome::Failed(error) => {
                self.unhold(&uid);
                let first_failure = self.failed.insert(uid);
                for set in self.allocator.sets() {
                    count_failure(&set.cluster_cidr(), "patch_failed");
                }
                let cidrs: Vec<String> = cidrs.iter().map(IpNet::to_string).collect();
                let note = format!(
                    "Node {name} status is now: CIDRAssignmentFailed: writing pod CIDRs {} failed: {error}; \
                         retrying",
                    cidrs.join(",")
                );
                tracing::warn!(node = %name, "{note}");
                if first_failure {
                    self.events
                        .warning(&node_ref(&name), EVENT_CIDR_ASSIGNMENT_FAILED, note)
                        .await;
                }
            }
        }
    }
}

fn count_failure(cluster_cidr: &IpNet, reason: &str) {
    let labels = FailureLabels {
        cluster_cidr: cluster_cidr.to_string(),
        reason: reason.to_string(),
    };
    METRICS.failures.get_or_create(&labels).inc();
}

/// A reserved node's name, UID, resourceVersion and CIDRs, to be patched.
type PodCidrPatch = (String, String, Option<String>, Vec<IpNet>);

fn report_occupy(node: &str, cidrs: &[IpNet], result: allocator::Occupied) {
    for cidr in result.already_taken {
        tracing::warn!(node, %cidr, "node's pod CIDR overlaps another node's; it was assigned outside this controller");
    }
    for cidr in result.outside {
        tracing::info!(node, %cidr, all = ?cidrs, "node's pod CIDR is outside --cluster-cidr; not tracked");
    }
}

/// Records the first sign of another allocator.
fn saw_other(slot: &mut Option<OtherAllocator>, node: &str, cidrs: &[IpNet], sign: Sign) {
    slot.get_or_insert_with(|| OtherAllocator {
        node: node.to_string(),
        cidrs: cidrs.to_vec(),
        sign,
    });
}

/// Order-independent fingerprint of what allocation depends on.
fn fingerprint(nodes: &[std::sync::Arc<Node>]) -> u64 {
    let mut sum = nodes.len() as u64;
    for node in nodes {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.metadata.uid.hash(&mut h);
        node.metadata.deletion_timestamp.is_some().hash(&mut h);
        if let Some(spec) = &node.spec {
            spec.pod_cidr.hash(&mut h);
            spec.pod_cidrs.hash(&mut h);
        }
        sum = sum.wrapping_add(h.finish());
    }
    sum
}

/// Sets `spec.podCIDR(s)` with the node's UID and resourceVersion as
/// preconditions; on a conflict reads the node again and decides again.
async fn patch_pod_cidrs(
    api: &Api<Node>,
    name: &str,
    uid: &str,
    mut resource_version: Option<String>,
    cidrs: &[IpNet],
) -> PatchOutcome {
    let strings: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
    let mut last_error = String::new();
    for _ in 0..PATCH_ATTEMPTS {
        let mut patch = json!({
            "metadata": {"uid": uid},
            "spec": {"podCIDR": strings[0], "podCIDRs": strings},
        });
        if let Some(rv) = &resource_version {
            patch["metadata"]["resourceVersion"] = json!(rv);
        }
        match super::merge_patch(api, name, patch).await {
            Ok(_) => return PatchOutcome::Assigned,
            Err(kube::Error::Api(e)) if e.code == 404 => return PatchOutcome::Gone,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                last_error = e.message.clone();
                match api.get_opt(name).await {
                    Ok(Some(node)) if node.metadata.uid.as_deref() == Some(uid) => {
                        let theirs = pod_cidrs(&node);
                        if !theirs.is_empty() {
                            return if theirs == cidrs {
                                PatchOutcome::Assigned
                            } else {
                                PatchOutcome::TakenByOther(theirs)
                            };
                        }
                        resource_version = node.metadata.resource_version.clone();
                    }
                    Ok(_) => return PatchOutcome::Gone,
                    Err(e) => return PatchOutcome::Failed(e.to_string()),
                }
            }
            Err(e) => return PatchOutcome::Failed(e.to_string()),
        }
    }
    PatchOutcome::Failed(format!(
        "the node kept changing ({PATCH_ATTEMPTS} conflicts): {last_error}"
    ))
}

/// Runs the controller until `stop` is cancelled.
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    if !ctx.options.options.allocate_node_cidrs {
        tracing::info!("node CIDRs are not allocated: --allocate-node-cidrs=false");
        stop.cancelled().await;
        return;
    }
    let Some(config) = ctx.options.node_cidr_allocation.clone() else {
        // Validation sets it whenever this controller runs with the flag on.
        tracing::error!(
            "--allocate-node-cidrs=true but no validated --cluster-cidr; node IPAM does nothing"
        );
        stop.cancelled().await;
        return;
    };
    tracing::info!(
        cluster_cidr = %config.cluster,
        node_masks = ?config.ranges.iter().map(|r| r.node_mask).collect::<Vec<_>>(),
        "starting node IPAM"
    );
    METRICS.other_allocator.set(0);
    let ipam = Ipam::new(
        config,
        Api::all(ctx.kube.clone()),
        Events::new(ctx.kube.clone(), "cidrAllocator"),
    );
    let set = IpamPass {
        ipam,
        nodes: ctx.nodes.clone(),
    };
    // A pass at start (the consistent list first), then once the nodes'
    // CIDRs or membership change, and after a failed pass by `RETRY`;
    // reported as the Go range allocator's queue.
    let nodes = ctx.nodes.clone();
    Periodic::new("cidrallocator_node", RETRY)
        .on_change(ctx.node_changes.clone(), Settle::AT_ONCE, move || {
            fingerprint(&nodes.state())
        })
        .run(&stop, set)
        .await
}

/// The allocator and the nodes it serves, for the runner.
struct IpamPass {
    ipam: Ipam,
    nodes: Store<Node>,
}

impl SetPass for IpamPass {
    async fn pass(&mut self) -> Pass {
        let snapshot = self.nodes.state();
        self.ipam.pass(&snapshot).await
    }
}

/// What `tests/in_process/node_ipam.rs` drives against the API test
/// server: the allocator without the controller's loop, and the CIDR patch.
/// Not an interface: the controller is [`run`].
#[doc(hidden)]
pub mod testing {
    use super::*;

    /// The allocator and its bookkeeping, as [`run`] holds them.
    pub struct Allocation(Ipam);

    impl Allocation {
        pub fn new(config: NodeCidrAllocation, api: Api<Node>, events: Events) -> Allocation {
            Allocation(Ipam::new(config, api, events))
        }

        /// [`run`]'s start: every CIDR the nodes hold, from a quorum list.
        pub async fn rebuild(&mut self) -> Result<(), kube::Error> {
            self.0.rebuild().await
        }

        /// [`run`]'s pass over the node cache.
        pub async fn sync(&mut self, nodes: &[std::sync::Arc<Node>]) {
            self.0.sync(nodes).await
        }

        /// The first sign of another allocator, after which nothing is
        /// allocated.
        pub fn other(&self) -> Option<&OtherAllocator> {
            self.0.other.as_ref()
        }
    }

    pub async fn patch_pod_cidrs(
        api: &Api<Node>,
        name: &str,
        uid: &str,
        resource_version: Option<String>,
        cidrs: &[IpNet],
    ) -> PatchOutcome {
        super::patch_pod_cidrs(api, name, uid, resource_version, cidrs).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn pod_cidrs_prefer_the_list_and_fall_back_to_the_single_field() {
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00::/64"]}
        }))
        .unwrap();
        assert_eq!(pod_cidrs(&n), [net("10.244.1.0/24"), net("fd00::/64")]);
        let n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "spec": {"podCIDR": "10.244.1.0/24"}
        }))
        .unwrap();
        assert_eq!(pod_cidrs(&n), [net("10.244.1.0/24")]);
    }
}
