//! The cloud-node controller: initializes nodes registered with the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint, and keeps their
//! addresses up to date.
//!
//! Initializing a node: find its instance (providerID, else name, see
//! [`identity`]); plan providerID, labels, addresses and taint removal with a
//! pure function ([`plan`]); apply the plan in two writes (status with the
//! addresses first, so the node never becomes schedulable without them; then
//! one resourceVersion-guarded merge patch of labels, providerID and taints);
//! emit `Synced`. When the instance cannot be found or AWS fails, the taint
//! stays, a Warning event says what was looked up, and the node is retried
//! with exponential backoff: a node is never initialized from a guess.
//! Nothing but the instance (and the cached zone IDs) holds the taint: the
//! network-node labels come afterwards, from [`topology`]'s own task.
//!
//! A node whose providerID names a zone of another Region is left as it
//! is, taint and all, with no AWS call: it is that Region's CCM's to
//! initialize ([`outside_region`] reports it once).
//!
//! Every `--node-status-update-frequency` the addresses of all initialized
//! nodes are refreshed from the shared cluster sweep ([`status`]).
//!
//! Triggers come from the shared node informer ([`changes`]); the
//! reconciles run in kube-runtime's controller with `--concurrent-node-syncs`
//! workers, which dedups and requeues per node.

pub mod changes;
pub mod identity;
pub mod lookups;
pub mod outside_region;
pub mod plan;
mod progress;
mod status;
mod topology;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use self::identity::{IdentityError, Lookup};
use self::lookups::Prefetcher;
use self::plan::{InitPlan, PlanContext, PlanError};
use self::progress::ProgressBook;
use super::ControllerContext;
use super::events::Events;
use crate::cloud_config::IpFamily;
use crate::provider::Cloud;
use crate::provider::CloudError;
use crate::provider::instances::{Instance, Instances};

/// How long lookups for newly seen nodes wait for company (see [`lookups`]).
const GATHER_WINDOW: Duration = Duration::from_millis(300);
/// Attempts of the guarded spec patch when other writers keep winning.
const CONFLICT_ATTEMPTS: usize = 8;

pub const EVENT_SYNCED: &str = "Synced";
pub const EVENT_INVALID_PROVIDER_ID: &str = "InvalidProviderID";
pub const EVENT_INSTANCE_NOT_FOUND: &str = "InstanceNotFound";
pub const EVENT_LOOKUP_FAILED: &str = "InstanceLookupFailed";
pub const EVENT_INIT_FAILED: &str = "NodeInitializationFailed";
pub const EVENT_LABEL_CONFLICT: &str = "LabelConflict";

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
pub enum NodeError {
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
pub(crate) struct Shared<I: Instances> {
    pub(crate) kube: kube::Client,
    pub(crate) cloud: I,
    pub(crate) events: Events,
    pub(crate) region: String,
    pub(crate) cluster_id: String,
    pub(crate) families: Vec<IpFamily>,
    pub(crate) nodes: Store<Node>,
    pub(crate) workers: usize,
    prefetch: Prefetcher<I>,
    progress: ProgressBook,
    /// Nodes waiting for their network-node labels ([`topology`]).
    topology: topology::Queue,
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
pub async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    LazyLock::force(&METRICS);
    outside_region::register();
    let workers = ctx.options.options.concurrent_node_syncs.max(1) as usize;
    let shared = Arc::new(Shared {
        kube: ctx.kube.clone(),
        cloud: ctx.provider.clone(),
        events: Events::new(ctx.kube.clone(), "cloud-node-controller"),
        region: ctx.region.clone(),
        cluster_id: ctx.cluster_id.clone(),
        families: ctx.cloud.node_ip_families.clone(),
        nodes: ctx.nodes.clone(),
        workers,
        prefetch: Prefetcher::new(
            ctx.provider.clone(),
            GATHER_WINDOW,
            ctx.options.options.aws_instance_sweep_ttl,
        ),
        progress: ProgressBook::default(),
        topology: topology::Queue::default(),
    });
    // client-go's workqueue metrics under the Go controller's queue name;
    // the labeller asks its questions when this queue rests.
    let queue = super::schedule::workqueue::Queue::new("Nodes");
    let labeller = tokio::spawn(topology::run(shared.clone(), queue.clone(), stop.clone()));

    let refresher = tokio::spawn(status::run(
        shared.clone(),
        ctx.options.options.node_status_update_frequency,
        stop.clone(),
    ));

    let triggers = triggers(&ctx, shared.clone(), queue.clone());

    tracing::info!(workers, "cloud-node controller started");
    let (taken, retried) = (queue.clone(), queue);
    let reconcile = move |node: Arc<Node>, shared: Arc<Shared<C>>| {
        let work = taken.take(&node.name_any());
        async move {
            let done = reconcile(node, shared).await;
            drop(work);
            done
        }
    };
    let error_policy = move |node: Arc<Node>, err: &NodeError, shared: Arc<Shared<C>>| {
        retried.retry();
        error_policy(node, err, shared)
    };
    Controller::for_stream(triggers, ctx.nodes.clone())
        .with_config(Config::default().concurrency(workers.min(u16::MAX as usize) as u16))
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, shared)
        .for_each(|_| futures::future::ready(()))
        .await;
    let _ = tokio::join!(refresher, labeller);
}

/// The Nodes with work for [`reconcile`], from the informer's changes; the
/// prefetch, progress and topology books follow every change on the way.
fn triggers<C: Cloud>(
    ctx: &ControllerContext<C>,
    shared: Arc<Shared<C>>,
    queue: super::schedule::workqueue::Queue,
) -> impl futures::Stream<Item = Result<Node, kube::runtime::watcher::Error>> + Send + 'static {
    changes::node_changes(ctx.nodes.clone(), &ctx.node_feed).flat_map(move |changes| {
        let shared = &shared;
        for node in &changes.applied {
            if !plan::is_uninitialized(node) {
                shared.prefetch.cancel(&node.name_any());
                shared.progress.forget(&node.name_any());
                topology::queue_initialized(node, shared);
            } else if let Ok(lookup) = identity::lookup_for_node(node, &shared.region)
                && shared.progress.wants_lookup(node, &lookup)
            {
                shared.prefetch.prefetch(&node.name_any(), lookup);
            }
        }
        if !changes.deleted.is_empty() {
            let store = shared.nodes.clone();
            shared
                .prefetch
                .retain(|name| store.get(&ObjectRef::new(name)).is_some());
            for node in &changes.deleted {
                shared.progress.forget(&node.name_any());
                shared.topology.forget(&node.name_any());
                // The controller skips a key whose object is gone: it is
                // never taken, so it must not stay due.
                queue.forget(&node.name_any());
                outside_region::forget(node);
            }
        }
        // Only nodes with work reach the controller: at start-up every
        // node of the cluster is "applied", and queueing thousands of
        // initialized ones would cost a no-op reconcile each and leave
        // the scheduler's queue sized for all of them.
        let due: Vec<_> = (changes.applied.into_iter())
            .filter(|n| needs_reconcile(n))
            .collect();
        for n in &due {
            queue.due(&n.name_any());
        }
        futures::stream::iter(
            due.into_iter()
                .map(|n| Ok::<Node, kube::runtime::watcher::Error>(Node::clone(&n))),
        )
    })
}

/// Whether a changed node has work for [`reconcile`]: initializing, or a
/// beta label without its GA twin.
fn needs_reconcile(node: &Node) -> bool {
    plan::is_uninitialized(node) || !plan::plan_label_twins(node).is_empty()
}

fn error_policy<I: Instances>(node: Arc<Node>, err: &NodeError, shared: Arc<Shared<I>>) -> Action {
    let lookup = identity::lookup_for_node(&node, &shared.region).ok();
    let delay = shared.progress.failed(&node.name_any(), lookup);
    tracing::warn!(node = %node.name_any(), error = %err, retry_in = ?delay, "node not initialized");
    Action::requeue(delay)
}

#[tracing::instrument(skip_all, fields(node = %node.name_any()))]
async fn reconcile<I: Instances>(
    node: Arc<Node>,
    shared: Arc<Shared<I>>,
) -> Result<Action, NodeError> {
    // The scheduler read the node from the cache when it released the
    // request, which may be a while before this runs: meanwhile the cache
    // may have brought our own initializing write, and the triggers have
    // then forgotten that we made it. Work from what the cache holds now,
    // or that stale tainted copy is initialized a second time.
    let Some(node) = shared.nodes.get(&ObjectRef::from_obj(&*node)) else {
        return Ok(Action::await_change());
    };
    if !plan::is_uninitialized(&node) {
        return reconcile_initialized(&node, &shared).await;
    }
    // A tainted copy of a node this process just initialized is the cache
    // lagging behind our own write: ask the API server, not AWS.
    if !shared.progress.recently_initialized(&node) {
        return initialize(&node, &shared).await;
    }
    let name = node.name_any();
    match shared.api().get_opt(&name).await {
        Ok(Some(fresh)) if !plan::is_uninitialized(&fresh) => {
            reconcile_initialized(&fresh, &shared).await
        }
        Ok(Some(fresh)) => initialize(&fresh, &shared).await,
        Ok(None) => Ok(Action::await_change()),
        Err(source) => Err(NodeError::Kube { node: name, source }),
    }
}

/// An initialized node: its label twins (the network-node labels are
/// [`topology`]'s).
async fn reconcile_initialized<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<Action, NodeError> {
    shared.progress.forget(&node.name_any());
    reconcile_label_twins(node, shared).await?;
    Ok(Action::await_change())
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
async fn initialize<I: Instances>(node: &Node, shared: &Shared<I>) -> Result<Action, NodeError> {
    let lookup = match start_lookup(node, shared).await? {
        Ok(lookup) => lookup,
        Err(action) => return Ok(action),
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
        return Ok(Action::await_change());
    };
    shared.progress.succeeded(&applied);
    if plan::wants_network_nodes(&applied) {
        let instance_type = instance.instance_type.as_deref();
        (shared.topology).ask(&applied.name_any(), &instance.id, instance_type);
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
    Ok(Action::await_change())
}

/// How to find the node's instance; `Err(action)` when there is nothing to
/// do now (a Fargate node, a node of another Region, or a backoff still
/// running).
async fn start_lookup<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<Result<Lookup, Action>, NodeError> {
    let name = node.name_any();
    let lookup = match identity::lookup_for_node(node, &shared.region) {
        Ok(lookup) => lookup,
        Err(err @ IdentityError::Fargate { .. }) => {
            tracing::info!(error = %err, "skipping node");
            return Ok(Err(Action::await_change()));
        }
        Err(IdentityError::OutsideRegion(outside)) => {
            outside_region::report(&shared.events, node, &outside).await;
            return Ok(Err(Action::await_change()));
        }
        Err(err) => {
            // Other changes to the node do not make the warning come sooner.
            if let Some(wait) = shared.progress.backoff_left(&name, None) {
                return Ok(Err(Action::requeue(wait)));
            }
            shared
                .warn(node, EVENT_INVALID_PROVIDER_ID, err.to_string())
                .await;
            return Err(err.into());
        }
    };
    if let Some(wait) = shared.progress.backoff_left(&name, Some(&lookup)) {
        return Ok(Err(Action::requeue(wait)));
    }
    shared.progress.start(&name);
    Ok(Ok(lookup))
}

/// The node's instance; a Warning event when it is not found, the lookup
/// fails, or a name-based lookup found another cluster's instance.
async fn find_instance<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    lookup: &Lookup,
) -> Result<Instance, NodeError> {
    let name = node.name_any();
    let note = match shared.prefetch.resolve(&name, lookup).await {
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
        Ok(None) => not_found_note(&name, lookup, &shared.cluster_id),
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

fn not_found_note(name: &str, lookup: &Lookup, cluster_id: &str) -> String {
    let hint = match lookup {
        Lookup::ById(_) => "Check that the instance exists in this account and Region".to_string(),
        Lookup::ByPrivateDns(_) => format!(
            "The node name must be the instance's private DNS name (kubeadm's default), an instance ID, \
             or the kubelet must set --provider-id; the instance must be live and tagged \
             kubernetes.io/cluster/{cluster_id}"
        ),
    };
    format!(
        "No EC2 instance found for node {name} by {lookup}. {hint}. The node keeps its {} taint and is retried.",
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
