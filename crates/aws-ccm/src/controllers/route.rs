// A set pass on the periodic runner (schedule/periodic.rs), not a keyed reconcile: one reconcile covers the whole cluster (one DescribeRouteTables, one plan over every node), not one object at a time.
//! The route controller (`route`, `node-route-controller`): a VPC route
//! `podCIDR -> instance` for every node, in every route table of the cluster,
//! so pods reach each other without an overlay.
//!
//! One reconcile reads the route tables once (one `DescribeRouteTables`),
//! looks the nodes' instances up in the shared cached sweep, computes a
//! [`plan::plan`], and makes only the changes in it: an unchanged cluster
//! costs one read and no write. It runs on node changes (debounced) and every
//! `--route-reconciliation-period`.
//!
//! Node changes are read from the shared node cache rather than a watch of
//! its own: the controller wakes when the informer applies an event and
//! compares a fingerprint of the fields routes depend on (name, provider ID,
//! pod CIDRs). Nodes change all the time for reasons that do not matter here
//! (kubelet heartbeats, conditions, labels), so comparing the projection
//! filters them, at the cost of hashing a few strings per node per change.
//!
//! After applying, each node's `NetworkUnavailable` condition says whether
//! its routes exist (False/`RouteCreated`, True/`NoRouteCreated`, as
//! upstream), written unless the node already shows that status with that
//! reason (a CNI's False/`CalicoIsUp` is rewritten, as upstream rewrites
//! it); failures give the node a `FailedToCreateRoute` Warning event naming
//! the CIDR, table and AWS error.

mod metrics;
pub(crate) mod plan;
pub(crate) mod publish;
mod refusals;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use ipnet::IpNet;
use kube::runtime::reflector::Store;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::metrics::{ChangeLabels, METRICS, TableLabels};
use self::plan::{NodeOutcome, NodeRoutes, Plan, RouteChange};
use self::publish::Publisher;
use super::ControllerContext;
use super::schedule::periodic::{Pass, Periodic, SetPass};
use super::schedule::settle::Settle;
use crate::backoff::Backoff;
use crate::cloud_config::CloudConfig;
use crate::options::cidrs::ClusterCidrs;
use crate::provider::Cloud;
use crate::provider::CloudError;
use crate::provider::routes::{
    RouteTable, RouteTableSelector, RouteTarget, Routes, TargetInstance,
};

/// Share of `--route-table-limit` past which the controller warns.
pub(crate) const CAPACITY_WARNING_RATIO: f64 = 0.8;
/// Route calls in flight at once (the AWS client throttles underneath).
const CONCURRENT_CHANGES: usize = 16;
/// A repeated failure of the same route is re-announced after this long.
const EVENT_REPEAT: Duration = Duration::from_secs(600);
/// The next reconcile after one that failed or left a route to confirm:
/// 2 s (a create to confirm is usually visible by then), doubling while
/// they go on; the period bounds it, as the periodic reconcile comes anyway.
const RETRY: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(300));

pub(crate) const NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";
const REASON_ROUTE_CREATED: &str = "RouteCreated";
const REASON_NO_ROUTE_CREATED: &str = "NoRouteCreated";
const EVENT_FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
const EVENT_ROUTE_TABLE_NEAR_CAPACITY: &str = "RouteTableNearCapacity";
/// A route write IAM denies on the route table (it lacks the cluster tag).
const EVENT_ROUTE_TABLE_UNAUTHORIZED: &str = "RouteTableUnauthorized";
/// Turning off the source/destination check IAM denies on the instance.
const EVENT_INSTANCE_UNAUTHORIZED: &str = "InstanceUnauthorized";

/// A reconcile that could not even start planning.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ReconcileError {
    #[error(
        "no route table found for {selector}; the route controller needs one: tag the cluster's route table(s) \
         kubernetes.io/cluster/<cluster-id>=owned (or set RouteTableID in cloud.conf), or pass \
         --configure-cloud-routes=false if pod traffic does not use VPC routes (overlay CNI)"
    )]
    NoRouteTables { selector: String },
    #[error("listing route tables ({selector}): {source}")]
    DescribeTables {
        selector: String,
        source: CloudError,
    },
    #[error("looking up the nodes' instances: {0}")]
    Instances(CloudError),
}

/// How one node fared in a reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NodeResult {
    /// Every route of the node exists.
    Routed,
    /// Something failed or is in the way; the messages say what.
    Failed(Vec<String>),
    /// Not decided this round (e.g. a create answered "already exists"
    /// after a retry): the next reconcile re-reads and decides.
    Unconfirmed,
}

/// How one change went: `None` when it was not attempted.
type ChangeResult = Option<Result<(), CloudError>>;

/// A change AWS refused.
#[derive(Clone, Debug)]
struct ChangeFailure {
    change: RouteChange,
    error: CloudError,
}

/// A table above the warning threshold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CapacityWarning {
    pub(crate) table_id: String,
    pub(crate) routes: usize,
    pub(crate) limit: u32,
}

impl CapacityWarning {
    pub(crate) fn message(&self) -> String {
        format!(
            "route table {} holds {} routes, over {:.0} % of --route-table-limit={} (the AWS quota \"Routes per \
             route table\" is 50 by default, up to 1,000). Before it fills and new nodes get no route: raise the \
             quota in Service Quotas and --route-table-limit with it, or move to an overlay CNI and run with \
             --configure-cloud-routes=false",
            self.table_id,
            self.routes,
            CAPACITY_WARNING_RATIO * 100.0,
            self.limit
        )
    }
}

/// What a reconcile did.
#[derive(Clone, Debug, Default)]
pub(crate) struct Report {
    plan: Plan,
    nodes: BTreeMap<String, NodeResult>,
    failures: Vec<ChangeFailure>,
    /// Changes that succeeded.
    applied: usize,
    /// Tables that crossed the warning threshold in this reconcile.
    new_capacity_warnings: Vec<CapacityWarning>,
    /// Per table: routes after the changes.
    table_routes: BTreeMap<String, usize>,
}

impl Report {
    /// Whether the next reconcile should come soon rather than after the
    /// period: a create that needs confirming, or a failure worth retrying.
    fn retry_soon(&self) -> bool {
        self.failures
            .iter()
            .any(|f| f.error.is_already_exists() || f.error.is_transient())
    }
}

/// The AWS side of the route controller, over any [`Routes`] implementation.
pub(crate) struct Reconciler<R> {
    routes: R,
    cluster_cidrs: ClusterCidrs,
    selector: RouteTableSelector,
    table_limit: u32,
    /// Tables currently above the warning threshold (warned once per crossing).
    over_threshold: HashSet<String>,
}

impl<R: Routes> Reconciler<R> {
    pub(crate) fn new(
        routes: R,
        cluster_cidrs: ClusterCidrs,
        selector: RouteTableSelector,
        table_limit: u32,
    ) -> Reconciler<R> {
        Reconciler {
            routes,
            cluster_cidrs,
            selector,
            table_limit: table_limit.max(1),
            over_threshold: HashSet::new(),
        }
    }

    /// Reads the tables and instances, plans, applies.
    pub(crate) async fn reconcile(
        &mut self,
        nodes: &[NodeRoutes],
    ) -> Result<Report, ReconcileError> {
        let metrics = &*METRICS;
        metrics.syncs.inc();
        let read = self.read_and_plan(nodes).await;
        // Whether no table matched; unknown while the tables cannot be read.
        if !matches!(read, Err(ReconcileError::DescribeTables { .. })) {
            let missing = matches!(read, Err(ReconcileError::NoRouteTables { .. }));
            metrics.tables_missing.set(i64::from(missing));
        }
        let (tables, instances, plan) = read?;
        let refused = self.refusals(&plan, &tables, &instances).await;
        let mut report = self.apply(plan, &refused).await;
        self.account(&tables, &mut report);
        Ok(report)
    }

    /// The reads and the plan of a reconcile, stopping before apply
    /// (`aws-ccm plan`): the tables, the nodes' instances, the plan.
    pub(crate) async fn read_and_plan(
        &self,
        nodes: &[NodeRoutes],
    ) -> Result<(Vec<RouteTable>, HashMap<String, TargetInstance>, Plan), ReconcileError> {
        let tables = self
            .routes
            .route_tables(&self.selector)
            .await
            .map_err(|source| ReconcileError::DescribeTables {
                selector: self.selector.to_string(),
                source,
            })?;
        if tables.is_empty() {
            return Err(ReconcileError::NoRouteTables {
                selector: self.selector.to_string(),
            });
        }
        let ids: BTreeSet<String> = (nodes.iter().filter(|n| !n.pod_cidrs.is_empty()))
            .filter_map(|n| n.instance_id.clone())
            .collect();
        let ids: Vec<String> = ids.into_iter().collect();
        let instances = if ids.is_empty() {
            HashMap::new()
        } else {
            self.routes
                .instances(&ids)
                .await
                .map_err(ReconcileError::Instances)?
        };
        let plan = plan::plan(&self.cluster_cidrs, nodes, &tables, &instances);
        Ok((tables, instances, plan))
    }

    async fn apply(&self, plan: Plan, refused: &HashMap<usize, CloudError>) -> Report {
        let mut results: Vec<ChangeResult> = vec![None; plan.changes.len()];
        let groups = groups_by_node(&plan.changes);
        for (i, result) in self.apply_groups(&plan.changes, &groups, refused).await {
            results[i] = result;
        }
        let mut report = Report::default();
        record_changes(&plan, &results, refused, &mut report);
        for (name, outcome) in &plan.nodes {
            let result = node_result(&plan, outcome, &results);
            report.nodes.insert(name.clone(), result);
        }
        METRICS.nodes_unrouted.set(
            report
                .nodes
                .values()
                .filter(|r| matches!(r, NodeResult::Failed(_)))
                .count() as i64,
        );
        report.plan = plan;
        report
    }

    /// Applies each group's changes in order, a bounded number of groups at
    /// once. Route changes after a failed source/destination change are not
    /// attempted (`None`).
    async fn apply_groups(
        &self,
        changes: &[RouteChange],
        groups: &[Vec<usize>],
        refused: &HashMap<usize, CloudError>,
    ) -> Vec<(usize, ChangeResult)> {
        // Futures built up front (not by a closure inside the stream) keep
        // the whole future provably `Send`.
        let mut futures = Vec::with_capacity(groups.len());
        for group in groups {
            futures.push(async move {
                let mut out = Vec::with_capacity(group.len());
                let mut source_dest_failed = false;
                for &i in group {
                    let change = &changes[i];
                    let is_source_dest =
                        matches!(change, RouteChange::DisableSourceDestCheck { .. });
                    if source_dest_failed && !is_source_dest {
                        out.push((i, None));
                        continue;
                    }
                    let result = match refused.get(&i) {
                        Some(denied) => Err(denied.clone()),
                        None => self.apply_one(change).await,
                    };
                    source_dest_failed |= is_source_dest && result.is_err();
                    out.push((i, Some(result)));
                }
                out
            });
        }
        futures::stream::iter(futures)
            .buffer_unordered(CONCURRENT_CHANGES)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    async fn apply_one(&self, change: &RouteChange) -> Result<(), CloudError> {
        match change {
            RouteChange::DisableSourceDestCheck { instance_id, .. } => {
                self.routes.disable_source_dest_check(instance_id).await
            }
            RouteChange::Create {
                table_id,
                destination,
                instance_id,
                ..
            } => {
                self.routes
                    .create_route(table_id, *destination, instance_id)
                    .await
            }
            RouteChange::Replace {
                table_id,
                destination,
                instance_id,
                ..
            } => {
                self.routes
                    .replace_route(table_id, *destination, instance_id)
                    .await
            }
            RouteChange::Delete {
                table_id,
                destination,
                ..
            } => match self.routes.delete_route(table_id, *destination).await {
                // Already gone: what we wanted.
                Err(e) if e.is_not_found() => Ok(()),
                other => other,
            },
        }
    }

    /// Route counts per table, capacity warnings, metrics.
    fn account(&mut self, tables: &[RouteTable], report: &mut Report) {
        let metrics = &*METRICS;
        let applied: Vec<RouteChange> = report
            .plan
            .changes
            .iter()
            .filter(|c| !report.failures.iter().any(|f| &f.change == *c))
            .cloned()
            .collect();
        for table in tables {
            let routes = plan::routes_after(table, &applied);
            report.table_routes.insert(table.id.clone(), routes);
            let labels = TableLabels {
                route_table: table.id.clone(),
            };
            metrics
                .table_routes
                .get_or_create(&labels)
                .set(routes as i64);
            let ratio = routes as f64 / f64::from(self.table_limit);
            metrics.table_usage.get_or_create(&labels).set(ratio);
            let managed = managed_routes_after(table, &applied, &self.cluster_cidrs);
            metrics.routes.get_or_create(&labels).set(managed as i64);
            if ratio > CAPACITY_WARNING_RATIO {
                if self.over_threshold.insert(table.id.clone()) {
                    report.new_capacity_warnings.push(CapacityWarning {
                        table_id: table.id.clone(),
                        routes,
                        limit: self.table_limit,
                    });
                }
            } else {
                self.over_threshold.remove(&table.id);
            }
        }
    }
}

/// Instance routes inside the cluster CIDRs after the applied changes.
fn managed_routes_after(
    table: &RouteTable,
    applied: &[RouteChange],
    cidrs: &ClusterCidrs,
) -> usize {
    let mut routes: BTreeMap<IpNet, bool> = table
        .routes
        .iter()
        .filter_map(|r| {
            let d = r.destination?;
            let ours =
                cidrs.contains(&d) && matches!(r.target, RouteTarget::Instance(_)) && !r.blackhole;
            Some((d, ours))
        })
        .collect();
    for change in applied {
        match change.route() {
            Some((table_id, destination, Some(_))) if table_id == table.id => {
                routes.insert(destination, cidrs.contains(&destination));
            }
            Some((table_id, destination, None)) if table_id == table.id => {
                routes.remove(&destination);
            }
            _ => {}
        }
    }
    routes.values().filter(|ours| **ours).count()
}

/// The fields of a node that routes depend on.
pub(crate) fn node_routes(node: &Node) -> NodeRoutes {
    let spec = node.spec.as_ref();
    let mut pod_cidrs: Vec<IpNet> = spec
        .and_then(|s| s.pod_cidrs.clone())
        .unwrap_or_default()
        .iter()
        .chain(spec.and_then(|s| s.pod_cidr.as_ref()))
        .filter_map(|c| {
            c.parse::<IpNet>()
                .map_err(|_| {
                    tracing::warn!(node = node.metadata.name.as_deref().unwrap_or(""), pod_cidr = %c, "node has an unparseable pod CIDR; ignoring it");
                })
                .ok()
        })
        .map(|c| c.trunc())
        .collect();
    pod_cidrs.sort();
    pod_cidrs.dedup();
    NodeRoutes {
        name: node.metadata.name.clone().unwrap_or_default(),
        instance_id: spec
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| crate::ids::parse_provider_id(p).ok()),
        pod_cidrs,
    }
}

/// One group per node, run a bounded number at once: its instance's
/// source/destination check first (a route to an instance that drops
/// forwarded packets would be worse than none), then its routes. Under AWS's
/// small mutating budget, nodes get working routes one after another rather
/// than all at the end. Deletes are groups of one.
fn groups_by_node(changes: &[RouteChange]) -> Vec<Vec<usize>> {
    let mut by_node: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, change) in changes.iter().enumerate() {
        match change.node() {
            Some(node) => by_node.entry(node).or_default().push(i),
            None => groups.push(vec![i]),
        }
    }
    groups.extend(by_node.into_values());
    groups
}

/// Counts each change's outcome, logs it, and lists the failures.
fn record_changes(
    plan: &Plan,
    results: &[ChangeResult],
    refused: &HashMap<usize, CloudError>,
    report: &mut Report,
) {
    for (i, change) in plan.changes.iter().enumerate() {
        let outcome = match &results[i] {
            Some(Ok(())) => "success",
            _ if refused.contains_key(&i) => "refused",
            Some(Err(_)) => "error",
            None => "skipped",
        };
        METRICS
            .changes
            .get_or_create(&ChangeLabels {
                action: change.action().to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
        match &results[i] {
            Some(Ok(())) => {
                report.applied += 1;
                tracing::info!(change = %change, "route change made");
            }
            Some(Err(error)) => {
                tracing::warn!(change = %change, error = %error, "route change failed");
                report.failures.push(ChangeFailure {
                    change: change.clone(),
                    error: error.clone(),
                });
            }
            None => {}
        }
    }
}

/// A node's result: failed with its blockers and failed changes, routed, or
/// unconfirmed when a create found its route already there.
fn node_result(plan: &Plan, outcome: &NodeOutcome, results: &[ChangeResult]) -> NodeResult {
    let mut problems: Vec<String> = outcome.blockers.iter().map(|b| b.to_string()).collect();
    let mut unconfirmed = false;
    for &i in &outcome.changes {
        match &results[i] {
            Some(Ok(())) => {}
            Some(Err(e)) if e.is_already_exists() => unconfirmed = true,
            Some(Err(e)) => problems.push(format!("{}: {e}", plan.changes[i])),
            None => problems.push(format!(
                "{}: not attempted because turning off the instance's source/destination check failed",
                plan.changes[i]
            )),
        }
    }
    if !problems.is_empty() {
        NodeResult::Failed(problems)
    } else if unconfirmed {
        NodeResult::Unconfirmed
    } else {
        NodeResult::Routed
    }
}

/// An order-independent fingerprint of what routes depend on.
fn fingerprint(nodes: &[Arc<Node>]) -> u64 {
    let mut sum: u64 = nodes.len() as u64;
    for node in nodes {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.metadata.name.hash(&mut h);
        if let Some(spec) = &node.spec {
            spec.provider_id.hash(&mut h);
            spec.pod_cidr.hash(&mut h);
            spec.pod_cidrs.hash(&mut h);
        }
        sum = sum.wrapping_add(h.finish());
    }
    sum
}

/// Runs the controller until `stop` is cancelled, on the periodic runner:
/// a reconcile at start, every period after the last began, once a change
/// of the nodes' routes settles ([`Settle::ROUTES`]), and after a reconcile
/// that failed or left a route to confirm, by [`RETRY`] (never later than
/// the period). It reports as k8s.io/cloud-provider's watch-based route
/// controller's queue, `Routes`, with its one key.
pub(crate) async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    let Some((reconciler, period)) = start(&ctx) else {
        stop.cancelled().await;
        return;
    };
    let nodes = ctx.nodes.clone();
    let set = RoutePass {
        reconciler,
        publisher: Publisher::new(ctx.kube.clone()),
        nodes: ctx.nodes.clone(),
    };
    Periodic::new("Routes", RETRY)
        .every(period)
        .on_change(ctx.node_changes.clone(), Settle::ROUTES, move || {
            fingerprint(&nodes.state())
        })
        .run(&stop, set)
        .await
}

/// What the reconciles keep between them, and the nodes they reconcile.
struct RoutePass<R: Routes> {
    reconciler: Reconciler<R>,
    publisher: Publisher,
    nodes: Store<Node>,
}

impl<R: Routes> SetPass for RoutePass<R> {
    async fn pass(&mut self) -> Pass {
        let snapshot = self.nodes.state();
        reconcile_once(&mut self.reconciler, &mut self.publisher, &snapshot).await
    }
}

/// The route tables cloud.conf and the cluster ID name: the controller's,
/// the permission check's and `aws-ccm`'s subcommands'.
pub(crate) fn table_selector(cloud: &CloudConfig, cluster_id: &str) -> RouteTableSelector {
    RouteTableSelector {
        route_table_id: cloud.route_table_id.clone(),
        vpc_id: cloud.vpc.clone(),
        cluster_id: cluster_id.to_string(),
    }
}

/// The reconciler, and the period between full reconciles, when routes are
/// on and `--cluster-cidr` is set; `None` (after saying why) otherwise.
fn start<C: Cloud>(ctx: &ControllerContext<C>) -> Option<(Reconciler<C>, Duration)> {
    let opts = &ctx.options.options;
    if !opts.configure_cloud_routes {
        tracing::info!("Will not configure cloud provider routes, --configure-cloud-routes: false");
        return None;
    }
    let Some(cluster_cidrs) = ctx.options.cluster_cidrs.clone() else {
        tracing::warn!(
            "--configure-cloud-routes is true but --cluster-cidr is empty: the route controller does nothing. \
             Set --cluster-cidr to the pod range, or pass --configure-cloud-routes=false (for example with an \
             overlay or VPC CNI) to silence this"
        );
        return None;
    };
    let selector = table_selector(&ctx.cloud, &ctx.cluster_id);
    let period = opts.route_reconciliation_period.max(Duration::from_secs(1));
    tracing::info!(cluster_cidr = %cluster_cidrs, tables = %selector, period = ?period, "starting route controller");
    let reconciler = Reconciler::new(
        ctx.provider.clone(),
        cluster_cidrs,
        selector,
        opts.route_table_limit,
    );
    Some((reconciler, period))
}

/// One reconcile of every node in `snapshot`, its outcome published on the
/// Nodes; to be done again soon when the tables could not be read, or a
/// route failed or must be confirmed soon ([`Report::retry_soon`]).
async fn reconcile_once<R: Routes>(
    reconciler: &mut Reconciler<R>,
    publisher: &mut Publisher,
    snapshot: &[Arc<Node>],
) -> Pass {
    let nodes: Vec<NodeRoutes> = snapshot.iter().map(|n| node_routes(n)).collect();
    let started = Instant::now();
    let report = match reconciler.reconcile(&nodes).await {
        Ok(report) => report,
        Err(e) => {
            tracing::error!(error = %e, "could not reconcile routes; retrying");
            return Pass::Retry;
        }
    };
    if !report.plan.is_empty() {
        tracing::info!(
            changes = report.plan.changes.len(),
            applied = report.applied,
            failed = report.failures.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "routes reconciled"
        );
    } else {
        tracing::debug!(nodes = nodes.len(), "routes reconciled; nothing to change");
    }
    let cache: HashMap<String, Arc<Node>> = snapshot
        .iter()
        .filter_map(|n| Some((n.metadata.name.clone()?, n.clone())))
        .collect();
    publisher.publish(&report, &cache).await;
    if report.retry_soon() {
        Pass::Retry
    } else {
        Pass::Done
    }
}

#[cfg(test)]
mod tests;
