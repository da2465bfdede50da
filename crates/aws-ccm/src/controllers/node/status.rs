//! Periodic address refresh of initialized nodes.
//!
//! Upstream asks AWS once per node every `--node-status-update-frequency`;
//! here one shared cluster sweep serves every node (instances missing from
//! it, e.g. untagged ones, are looked up by ID in batched calls), and only
//! nodes whose address list changed are written. A node of another Region
//! is left out: its instance is not in this one.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use kube::ResourceExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::identity::{self, Lookup};
use super::lookups::{SweepIndex, resolve_all};
use super::plan;
use crate::backoff::Backoff;
use crate::controllers::schedule::periodic::{Pass, Periodic};
use crate::provider::instances::Instances;

/// A failed sweep or write is tried again after 5 s, doubling up to the
/// period (the runner's bound).
const RETRY: Backoff = Backoff::new(Duration::from_secs(5), Duration::from_secs(300));

/// Runs the refresh on the periodic runner: a pass at start, then every
/// `every` after the last began, and after a failed one by [`RETRY`].
pub(super) async fn run<I: Instances>(
    shared: Arc<Shared<I>>,
    every: Duration,
    stop: CancellationToken,
) {
    let period = every.max(Duration::from_secs(1));
    Periodic::new("node-addresses", RETRY)
        .every(period)
        .run(&stop, move || {
            let shared = shared.clone();
            async move { refresh_all(&shared).await }
        })
        .await;
}

/// Refreshes every initialized node's addresses; to be done again soon
/// when the sweep or a write failed.
pub(super) async fn refresh_all<I: Instances>(shared: &Shared<I>) -> Pass {
    let nodes: Vec<(Arc<Node>, Lookup)> = shared
        .nodes
        .state()
        .into_iter()
        .filter(|n| !plan::is_uninitialized(n))
        .filter_map(|n| (identity::lookup_for_node(&n, &shared.region).ok()).map(|l| (n, l)))
        .collect();
    if nodes.is_empty() {
        return Pass::Done;
    }
    let sweep = match shared.cloud.cluster_instances().await {
        Ok(sweep) => sweep,
        Err(err) => {
            tracing::warn!(error = %err, "node address refresh skipped: the cluster sweep failed; retrying");
            return Pass::Retry;
        }
    };
    let index = SweepIndex::new(&sweep);
    let found = resolve_all(&shared.cloud, &index, nodes.iter().map(|(_, l)| l)).await;

    let mut patches = Vec::new();
    for (node, lookup) in &nodes {
        let instance = match found.get(lookup) {
            Some(Ok(Some(instance))) => instance,
            Some(Ok(None)) => {
                tracing::debug!(node = %node.name_any(), %lookup, "no instance; leaving addresses to the lifecycle controller");
                continue;
            }
            Some(Err(err)) => {
                tracing::warn!(node = %node.name_any(), %lookup, error = %err, "address refresh skipped for node");
                continue;
            }
            None => continue,
        };
        // A terminated instance has no addresses left to report.
        if instance.state.is_terminated() {
            continue;
        }
        match plan::address_change(node, instance, &shared.families) {
            Ok(Some(addresses)) => patches.push((node.name_any(), addresses)),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(node = %node.name_any(), error = %err, "address refresh skipped for node")
            }
        }
    }

    let api = shared.api();
    let changed = patches.len();
    let failed = futures::stream::iter(patches)
        .map(|(name, addresses)| {
            let api = api.clone();
            async move {
                tracing::info!(node = %name, addresses = %plan::format_addresses(&addresses), "updating node addresses");
                let patch = json!({"status": {"addresses": addresses}});
                let result = crate::controllers::merge_patch_status(&api, &name, patch).await;
                if let Err(err) = &result {
                    tracing::warn!(node = %name, error = %err, "updating node addresses failed; retrying");
                }
                result.is_err()
            }
        })
        .buffer_unordered(shared.workers)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    tracing::debug!(
        nodes = nodes.len(),
        changed,
        failed,
        "node addresses refreshed"
    );
    if failed == 0 { Pass::Done } else { Pass::Retry }
}
