//! The cloud-node controller: initializes nodes registered with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint, and keeps their
//! addresses up to date.
//!
//! Initializing a node: find its instance (providerID, else name, see
//! [`identity`]; a name that finds nothing, by the node's address with a
//! proof, see [`by_address`]); plan providerID, labels, addresses and taint removal with a
//! pure function ([`plan`]); apply the plan in two writes (status with the
//! addresses first, so the node never becomes schedulable without them; then
//! one resourceVersion-guarded merge patch of labels, providerID and taints);
//! emit `Synced`. When the instance cannot be found or AWS fails, the taint
//! stays, a Warning event says what was looked up, and the node is retried
//! with the queue's backoff: a node is never initialized from a guess.
//! Nothing but the instance (and the cached zone IDs) holds the taint: the
//! network-node labels come afterwards, from [`topology`]'s own queue.
//!
//! A node whose providerID names a zone of another Region is left as it
//! is, taint and all, with no AWS call: it is that Region's CCM's to
//! initialize ([`outside_region`] reports it once).
//!
//! Every `--node-status-update-frequency` the addresses of all initialized
//! nodes are refreshed from the shared cluster sweep ([`status`]).
//!
//! Scheduling is the keyed queue's ([`Keyed`], queue name `Nodes`, as the
//! Go controller's): this file says which Nodes have work ([`on_changes`],
//! from the shared node informer's [`changes`]) and what the work is
//! ([`reconcile`]); the queue runs it with `--concurrent-node-syncs`
//! workers, never twice at once for one Node, and retries a failure after
//! [`RETRY`].

pub(crate) mod by_address;
pub(crate) mod changes;
pub(crate) mod identity;
pub(crate) mod lookups;
pub(crate) mod outside_region;
pub(crate) mod plan;
mod progress;
mod status;
mod topology;

use std::collections::HashSet;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use self::changes::Changes;
use self::identity::{IdentityError, Lookup};
use self::lookups::{Prefetcher, Search};
use self::plan::{InitPlan, PlanContext, PlanError};
use self::progress::ProgressBook;
use super::ControllerContext;
use super::events::Events;
use super::schedule::keyed::{Class, Keyed, Outcome, Taken, Workers};
use crate::backoff::Backoff;
use crate::cloud_config::IpFamily;
use crate::provider::Cloud;
use crate::provider::CloudError;
use crate::provider::instances::{Instance, Instances};

/// The wait before a Node whose initialization failed is tried again: 1 s,
/// doubling to 5 min; a change of what it is looked up by tries it at once.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
/// How long the first lookup of a newly seen node waits for company (see
/// [`lookups`]).
const GATHER: Duration = Duration::from_millis(300);
/// Attempts of the guarded spec patch when other writers keep winning.
const CONFLICT_ATTEMPTS: usize = 8;

const EVENT_SYNCED: &str = "Synced";
const EVENT_INVALID_PROVIDER_ID: &str = "InvalidProviderID";
const EVENT_INSTANCE_NOT_FOUND: &str = "InstanceNotFound";
const EVENT_LOOKUP_FAILED: &str = "InstanceLookupFailed";
const EVENT_INIT_FAILED: &str = "NodeInitializationFailed";
const EVENT_LABEL_CONFLICT: &str = "LabelConflict";

struct Metrics {
    taint_removal_delay: Histogram,
    initial_sync_delay: Histogram,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    // 1 s .. ~17 min, as upstream.
    let m = Metrics {
        taint_removal_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
        initial_sync_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
    };
    crate::metrics::register(
        "node_controller_cloud_provider_taint_removal_delay_seconds",
        "Number of seconds after node creation when NodeController removed the cloud-provider taint of a single node.",
        m.taint_removal_delay.clone(),
    );
    crate::metrics::register(
        "node_controller_initial_node_sync_delay_seconds",
        "Number of seconds after node creation when NodeController finished the initial synchronization of a single node.",
        m.initial_sync_delay.clone(),
    );
    m
});

/// Seconds since the node was created (0 when unknown).
fn age_seconds(node: &Node) -> f64 {
    let created = node.metadata.creation_timestamp.as_ref();
    created.map_or(0.0, |t| seconds_since(t.0.as_millisecond()))
}

/// Seconds from `millis` (since the epoch) to now; 0 for a time to come.
pub(crate) fn seconds_since(millis: i64) -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(millis, |d| d.as_millis() as i64);
    ((now - millis) as f64 / 1000.0).max(0.0)
}

/// Why a reconcile did not finish; the node is retried with backoff.
#[derive(Debug, thiserror::Error)]
enum NodeError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("no EC2 instance found for node {node} by {lookup}")]
    NotFound { node: String, lookup: Lookup },
    #[error("looking up the EC2 instance of node {node} by {lookup} failed: {source}")]
    Cloud {
        node: String,
        lookup: Lookup,
        source: CloudError,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("updating node {node} failed: {source}")]
    Kube { node: String, source: kube::Error },
    #[error(
        "node {node} kept changing under us: gave up after {CONFLICT_ATTEMPTS} conflicting writes"
    )]
    Conflicts { node: String },
}

/// State shared by the reconciles and the status refresher.
struct Shared<I: Instances> {
    kube: kube::Client,
    cloud: I,
    events: Events,
    region: String,
    cluster_id: String,
    /// cloud.conf `VPC`: where a node found by its address must be.
    vpc: Option<String>,
    families: Vec<IpFamily>,
    nodes: Store<Node>,
    workers: usize,
    prefetch: Prefetcher<I>,
    progress: ProgressBook,
    /// Nodes waiting for their network-node labels ([`topology`]).
    topology: topology::Labeller,
}

impl<I: Instances> Shared<I> {
    fn api(&self) -> Api<Node> {
        Api::all(self.kube.clone())
    }

    /// Queues a Warning event on `node`.
    async fn warn(&self, node: &Node, reason: &str, note: impl Into<String>) {
        self.events
            .warning(&node.object_ref(&()), reason, note)
            .await;
    }
}

/// Runs the controller until `stop` is cancelled.
pub(crate) async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    LazyLock::force(&METRICS);
    outside_region::register();
    let workers = ctx.options.options.concurrent_node_syncs.max(1) as usize;
    let shared = Arc::new(Shared {
        kube: ctx.kube.clone(),
        cloud: ctx.provider.clone(),
        events: Events::new(ctx.kube.clone(), "cloud-node-controller"),
        region: ctx.region.clone(),
        cluster_id: ctx.cluster_id.clone(),
        vpc: ctx.cloud.vpc.clone(),
        families: ctx.cloud.node_ip_families.clone(),
        nodes: ctx.nodes.clone(),
        workers,
        prefetch: Prefetcher::new(
            ctx.provider.clone(),
            GATHER,
            ctx.options.options.aws_instance_sweep_ttl,
        ),
        progress: ProgressBook::default(),
        topology: topology::Labeller::new(),
    });
    let queue = Keyed::new("Nodes", RETRY);
    // The labeller asks its questions when this queue rests.
    let labeller = tokio::spawn(topology::run(shared.clone(), queue.clone(), stop.clone()));
    let prefetcher = shared.prefetch.clone();
    let (prefetch_stop, refresh_stop) = (stop.clone(), stop.clone());
    let prefetch = tokio::spawn(async move { prefetcher.run(&prefetch_stop).await });
    let refresher = tokio::spawn(status::run(
        shared.clone(),
        ctx.options.options.node_status_update_frequency,
        refresh_stop,
    ));

    let triggers = changes::node_changes(ctx.nodes.clone(), &ctx.node_feed)
        .take_until(stop.clone().cancelled_owned())
        .for_each(|changes| {
            on_changes(&shared, &queue, changes);
            futures::future::ready(())
        });
    tracing::info!(workers, "cloud-node controller started");
    let work = {
        let shared = shared.clone();
        move |taken: Vec<Taken>| {
            let shared = shared.clone();
            async move {
                let mut outcomes = Vec::with_capacity(taken.len());
                for t in &taken {
                    outcomes.push(reconcile_key(&shared, t).await);
                }
                outcomes
            }
        }
    };
    tokio::join!(triggers, queue.run(&stop, Workers::each(workers), work));
    let _ = tokio::join!(refresher, labeller, prefetch);
}

/// Says which Nodes have work for [`reconcile`], from the informer's
/// changes; the prefetch, progress and topology books follow every change
/// on the way.
fn on_changes<I: Instances>(shared: &Shared<I>, queue: &Keyed, changes: Changes) {
    // A node replaced by a new one of the same name is in both lists: its
    // books start over, and its key stays for the new one.
    let applied: HashSet<String> = changes.applied.iter().map(|n| n.name_any()).collect();
    for node in &changes.deleted {
        let name = node.name_any();
        shared.progress.forget(&name);
        shared.topology.forget(&name);
        outside_region::forget(node);
        if !applied.contains(&name) {
            shared.prefetch.cancel(&name);
            queue.forget(&name);
        }
    }
    for node in &changes.applied {
        let name = node.name_any();
        if !plan::is_uninitialized(node) {
            shared.prefetch.cancel(&name);
            shared.progress.forget(&name);
            topology::queue_initialized(node, shared);
            // Only nodes with work reach the queue: at start-up every node
            // of the cluster is "applied", and thousands of initialized ones
            // would cost a no-op reconcile each.
            if !plan::plan_label_twins(node).is_empty() {
                queue.add(&name, Class::Background);
            }
            continue;
        }
        let lookup = identity::lookup_for_node(node, &shared.region);
        // An attempt by the same lookup is in progress, or failed and is
        // retried after its backoff: this change does not bring it sooner.
        let by = match &lookup {
            Ok(lookup) => Some(lookup),
            Err(IdentityError::Fargate { .. } | IdentityError::OutsideRegion(_)) => {
                queue.add(&name, Class::UserWaits);
                continue;
            }
            Err(_) => None,
        };
        if !shared.progress.wants_attempt(&name, by) {
            continue;
        }
        if let Some(lookup) = by
            && shared.progress.wants_lookup(node, lookup)
        {
            (shared.prefetch).prefetch(&name, Search::for_node(node, lookup.clone()));
        }
        queue.add(&name, Class::UserWaits);
    }
}

/// One key of the queue: the Node as the cache has it now (the key may
/// have waited a while; meanwhile the cache may have brought our own
/// initializing write), reconciled.
async fn reconcile_key<I: Instances>(shared: &Shared<I>, taken: &Taken) -> Outcome {
    let Some(node) = shared.nodes.get(&ObjectRef::new(&taken.key)) else {
        return Outcome::Done;
    };
    let span = tracing::info_span!("reconcile", node = %taken.key);
    match reconcile(&node, shared).instrument(span).await {
        Ok(()) => Outcome::Done,
        Err(err) => {
            let failures = taken.failures + 1;
            tracing::warn!(node = %taken.key, error = %err, failures, "node not initialized; retried with backoff");
            Outcome::Retry
        }
    }
}

async fn reconcile<I: Instances>(node: &Node, shared: &Shared<I>) -> Result<(), NodeError> {
    if !plan::is_uninitialized(node) {
        return reconcile_initialized(node, shared).await;
    }
    // A tainted copy of a node this process just initialized is the cache
    // lagging behind our own write: ask the API server, not AWS.
    if !shared.progress.recently_initialized(node) {
        return initialize(node, shared).await;
    }
    let name = node.name_any();
    match shared.api().get_opt(&name).await {
        Ok(Some(fresh)) if !plan::is_uninitialized(&fresh) => {
            reconcile_initialized(&fresh, shared).await
        }
        Ok(Some(fresh)) => initialize(&fresh, shared).await,
        Ok(None) => Ok(()),
        Err(source) => Err(NodeError::Kube { node: name, source }),
    }
}

/// An initialized node: its label twins (the network-node labels are
/// [`topology`]'s).
async fn reconcile_initialized<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<(), NodeError> {
    shared.progress.forget(&node.name_any());
    reconcile_label_twins(node, shared).await
}

/// Keeps GA labels next to their beta twins on initialized nodes (no AWS).
async fn reconcile_label_twins<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<(), NodeError> {
    let twins = plan::plan_label_twins(node);
    if twins.is_empty() {
        return Ok(());
    }
    let name = node.name_any();
    let patch = json!({"metadata": {
        "resourceVersion": node.resource_version(),
        "labels": twins,
    }});
    match super::merge_patch(&shared.api(), &name, patch).await {
        Ok(_) => Ok(()),
        // Someone wrote meanwhile: the watch brings the new version back.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(source) => Err(NodeError::Kube { node: name, source }),
    }
}

/// Initializes a tainted node, in steps: the lookup (or a wait), the
/// instance, the plan, then the writes; then queues its network-node
/// question, which holds nothing.
async fn initialize<I: Instances>(node: &Node, shared: &Shared<I>) -> Result<(), NodeError> {
    let Some(lookup) = start_lookup(node, shared).await? else {
        return Ok(());
    };
    let instance = find_instance(node, shared, &lookup).await?;
    let zone_ids = zone_ids(node, shared, &lookup).await?;
    let cx = PlanContext {
        region: &shared.region,
        families: &shared.families,
        zone_ids: &zone_ids,
    };
    let plan = plan_for(node, shared, &instance, &cx).await?;
    tracing::info!(instance = %instance.id, plan = %plan, "initializing node");
    let Some(applied) = apply(node, &instance, plan, &cx, shared).await? else {
        return Ok(());
    };
    shared.progress.succeeded(&applied);
    if plan::wants_network_nodes(&applied) {
        let (name, instance_type) = (applied.name_any(), instance.instance_type.as_deref());
        (shared.topology).ask(&name, &instance.id, instance_type, Class::UserWaits);
    }
    METRICS.initial_sync_delay.observe(age_seconds(&applied));
    shared
        .events
        .normal(
            &node.object_ref(&()),
            EVENT_SYNCED,
            "Node synced successfully",
        )
        .await;
    tracing::info!(instance = %instance.id, "node initialized");
    Ok(())
}

/// How to find the node's instance; `None` when there is nothing to do (a
/// Fargate node, a node of another Region).
async fn start_lookup<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<Option<Lookup>, NodeError> {
    let name = node.name_any();
    let lookup = match identity::lookup_for_node(node, &shared.region) {
        Ok(lookup) => lookup,
        Err(err @ IdentityError::Fargate { .. }) => {
            tracing::info!(error = %err, "skipping node");
            return Ok(None);
        }
        Err(IdentityError::OutsideRegion(outside)) => {
            outside_region::report(&shared.events, node, &outside).await;
            return Ok(None);
        }
        Err(err) => {
            shared.progress.tried(&name, None);
            shared
                .warn(node, EVENT_INVALID_PROVIDER_ID, err.to_string())
                .await;
            return Err(err.into());
        }
    };
    shared.progress.tried(&name, Some(lookup.clone()));
    Ok(Some(lookup))
}

/// The node's instance; a Warning event when it is not found, the lookup
/// fails, or a name-based lookup found another cluster's instance. A name
/// that finds nothing goes on by the node's address ([`by_address`]).
async fn find_instance<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    lookup: &Lookup,
) -> Result<Instance, NodeError> {
    let name = node.name_any();
    let search = Search::for_node(node, lookup.clone());
    let answer = shared.prefetch.resolve(&name, search.clone()).await;
    let note = match answer.found {
        // As upstream, a name-based lookup only trusts instances of this
        // cluster: another cluster's instance may have the same DNS name.
        Ok(Some(instance))
            if !matches!(lookup, Lookup::ByPrivateDns(_))
                || instance.is_in_cluster(&shared.cluster_id) =>
        {
            return Ok(instance);
        }
        Ok(Some(instance)) => format!(
            "Instance {} has private DNS name {name} but is not tagged as a member of cluster {} \
             (tag kubernetes.io/cluster/{}=owned or shared); node {name} is not initialized from it. \
             Tag the instance, or set the kubelet's --provider-id.",
            instance.id, shared.cluster_id, shared.cluster_id
        ),
        Ok(None) if !by_address::falls_back(lookup) => {
            not_found_note(&name, lookup, &shared.cluster_id, None)
        }
        Ok(None) => match by_address(node, shared, &search, answer.by_address) {
            Ok(instance) => {
                tracing::info!(instance = %instance.id, addresses = ?search.addresses,
                    "no instance has the node's name as its private DNS name; found by the node's address");
                return Ok(instance);
            }
            Err(AddressError::Refused(refusal)) => {
                let why = format!("By its address: {refusal}");
                not_found_note(&name, lookup, &shared.cluster_id, Some(&why))
            }
            Err(AddressError::Failed(source)) => {
                let note = format!(
                    "No EC2 instance found for node {name} by {lookup}; looking it up by its address \
                     ({}) failed: {source}. The node keeps its {} taint and is retried.",
                    display_ips(&search.addresses),
                    plan::UNINITIALIZED_TAINT
                );
                shared.warn(node, EVENT_LOOKUP_FAILED, note).await;
                return Err(NodeError::Cloud {
                    node: name,
                    lookup: lookup.clone(),
                    source,
                });
            }
        },
        Err(source) => {
            let note = format!(
                "Looking up the EC2 instance of node {name} by {lookup} failed: {source}. \
                 The node keeps its {} taint and is retried.",
                plan::UNINITIALIZED_TAINT
            );
            shared.warn(node, EVENT_LOOKUP_FAILED, note).await;
            return Err(NodeError::Cloud {
                node: name,
                lookup: lookup.clone(),
                source,
            });
        }
    };
    shared.warn(node, EVENT_INSTANCE_NOT_FOUND, note).await;
    Err(NodeError::NotFound {
        node: name,
        lookup: lookup.clone(),
    })
}

/// Why the address did not give the node's instance.
enum AddressError {
    Refused(by_address::Refusal),
    Failed(CloudError),
}

/// The instance the node's address proves, for a search whose lookup found
/// nothing; `by_address` is what the address lookups answered.
fn by_address<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    search: &Search,
    by_address: Option<Result<Vec<Instance>, CloudError>>,
) -> Result<Instance, AddressError> {
    let found = match by_address {
        Some(Ok(found)) => found,
        Some(Err(source)) => return Err(AddressError::Failed(source)),
        // Not asked: the node has no address.
        None => Vec::new(),
    };
    let rules = by_address::Rules {
        cluster_id: &shared.cluster_id,
        vpc: shared.vpc.as_deref(),
    };
    let nodes = shared.nodes.state();
    by_address::judge(node, &search.addresses, &found, &rules, &nodes)
        .map_err(AddressError::Refused)
}

fn display_ips(ips: &[std::net::Ipv4Addr]) -> String {
    let ips: Vec<String> = ips.iter().map(|ip| ip.to_string()).collect();
    ips.join(", ")
}

/// Zone name → zone ID (cached by the cloud); a Warning when reading fails.
async fn zone_ids<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    lookup: &Lookup,
) -> Result<Arc<std::collections::HashMap<String, String>>, NodeError> {
    let name = node.name_any();
    match shared.cloud.zone_ids().await {
        Ok(zones) => Ok(zones),
        Err(source) => {
            let note = format!(
                "Reading the availability zone IDs for node {name} failed: {source}. Retrying."
            );
            shared.warn(node, EVENT_LOOKUP_FAILED, note).await;
            Err(NodeError::Cloud {
                node: name,
                lookup: lookup.clone(),
                source,
            })
        }
    }
}

/// The plan, with a Warning when it cannot be made and one per label someone
/// else set to another value.
async fn plan_for<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    instance: &Instance,
    cx: &PlanContext<'_>,
) -> Result<InitPlan, NodeError> {
    let name = node.name_any();
    let plan = match plan::plan_initialization(node, instance, cx) {
        Ok(plan) => plan,
        Err(err) => {
            shared.warn(node, EVENT_INIT_FAILED, err.to_string()).await;
            return Err(err.into());
        }
    };
    if let Some(zone) = &plan.unknown_zone {
        tracing::warn!(
            zone,
            "zone ID unknown for this zone; the topology.k8s.aws/zone-id label is left out"
        );
    }
    for c in &plan.conflicts {
        let what = if c.replaced {
            "it is set to the instance's value, as the Go CCM does (both labels of the pair follow the instance)"
        } else {
            "the existing value is kept. Remove the label if the cloud's value should apply"
        };
        let note = format!(
            "Node {name} has label {}={} but its instance {} says {}; {what}.",
            c.key, c.existing, instance.id, c.wanted
        );
        shared.warn(node, EVENT_LABEL_CONFLICT, note).await;
    }
    Ok(plan)
}

fn not_found_note(
    name: &str,
    lookup: &Lookup,
    cluster_id: &str,
    by_address: Option<&str>,
) -> String {
    let hint = match lookup {
        Lookup::ById(_) => "Check that the instance exists in this account and Region".to_string(),
        Lookup::ByPrivateDns(_) => format!(
            "The node must be named by its instance's private DNS name (kubeadm's default) or \
             instance ID, or report as its address the primary private IP of exactly one live \
             instance, or its kubelet must set --provider-id; the instance must be live and tagged \
             kubernetes.io/cluster/{cluster_id}"
        ),
    };
    let by_address = by_address.map(|why| format!(" {why}.")).unwrap_or_default();
    format!(
        "No EC2 instance found for node {name} by {lookup}.{by_address} {hint}. The node keeps its {} taint and is retried.",
        plan::UNINITIALIZED_TAINT
    )
}

/// Writes the plan: addresses (status subresource), then labels, providerID
/// and taints in one patch guarded by resourceVersion; on a conflict the
/// node is read again and the plan recomputed. `None` when the node is gone.
async fn apply<I: Instances>(
    node: &Node,
    instance: &Instance,
    mut plan: InitPlan,
    cx: &PlanContext<'_>,
    shared: &Shared<I>,
) -> Result<Option<Node>, NodeError> {
    let api = shared.api();
    let name = node.name_any();
    let kube_err = |source| NodeError::Kube {
        node: name.clone(),
        source,
    };
    let mut current = node.clone();
    for _ in 0..CONFLICT_ATTEMPTS {
        if let Some(patch) = plan.status_patch() {
            match super::merge_patch_status(&api, &name, patch).await {
                Ok(updated) => current = updated,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
                Err(e) => return Err(kube_err(e)),
            }
        }
        if !plan.touches_spec() {
            return Ok(Some(current));
        }
        let patch = plan.spec_patch(&current.resource_version().unwrap_or_default());
        match super::merge_patch(&api, &name, patch).await {
            Ok(updated) => {
                if plan.taints.is_some() {
                    METRICS.taint_removal_delay.observe(age_seconds(&updated));
                }
                return Ok(Some(updated));
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!("conflict writing the node; reading it again");
                current = match api.get_opt(&name).await.map_err(kube_err)? {
                    Some(fresh) => fresh,
                    None => return Ok(None),
                };
                plan = plan::plan_initialization(&current, instance, cx)?;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(e) => return Err(kube_err(e)),
        }
    }
    Err(NodeError::Conflicts { node: name })
}
