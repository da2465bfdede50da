//! The route controller's Prometheus metrics.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TableLabels {
    pub(super) route_table: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ChangeLabels {
    pub(super) action: String,
    pub(super) outcome: String,
}

#[derive(Default)]
pub(super) struct Metrics {
    pub(super) syncs: Counter,
    pub(super) routes: Family<TableLabels, Gauge>,
    pub(super) table_routes: Family<TableLabels, Gauge>,
    pub(super) table_usage: Family<TableLabels, Gauge<f64, AtomicU64>>,
    pub(super) tables_missing: Gauge,
    pub(super) changes: Family<ChangeLabels, Counter>,
    pub(super) nodes_unrouted: Gauge,
}

pub(super) static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let m = Metrics::default();
    crate::metrics::register(
        "route_controller_route_sync",
        "Times routes have been synced with the cloud provider (upstream's name)",
        m.syncs.clone(),
    );
    crate::metrics::register(
        "route_controller_routes",
        "Node routes (pod CIDR -> instance) in each route table after the last reconcile",
        m.routes.clone(),
    );
    crate::metrics::register(
        "route_controller_route_table_routes",
        "Routes counted against the AWS routes-per-table quota, per route table",
        m.table_routes.clone(),
    );
    crate::metrics::register(
        "route_controller_route_table_usage_ratio",
        "Routes in each route table divided by --route-table-limit; warnings start at 0.8",
        m.table_usage.clone(),
    );
    crate::metrics::register(
        "route_controller_route_tables_missing",
        "1 while no route table matches (RouteTableID, or the cluster tag); nothing is routed then",
        m.tables_missing.clone(),
    );
    crate::metrics::register(
        "route_controller_route_changes",
        "Route changes made, by action and outcome",
        m.changes.clone(),
    );
    crate::metrics::register(
        "route_controller_nodes_unrouted",
        "Nodes with pod CIDRs whose routes could not all be made in the last reconcile",
        m.nodes_unrouted.clone(),
    );
    m
});
