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
use crate::provider::instances::Instances;

pub(super) async fn run<I: Instances>(
    shared: Arc<Shared<I>>,
    every: Duration,
    stop: CancellationToken,
) {
    let period = every.max(Duration::from_secs(1));
    crate::controllers::schedule::every(period, &stop, || async {
        refresh_all(&shared).await;
    })
    .await;
}

/// Refreshes every initialized node's addresses; returns how many changed.
pub(super) async fn refresh_all<I: Instances>(shared: &Shared<I>) -> usize {
    let nodes: Vec<(Arc<Node>, Lookup)> = shared
        .nodes
        .state()
        .into_iter()
        .filter(|n| !plan::is_uninitialized(n))
        .filter_map(|n| (identity::lookup_for_node(&n, &shared.region).ok()).map(|l| (n, l)))
        .collect();
    if nodes.is_empty() {
        return 0;
    }
    let sweep = match shared.cloud.cluster_instances().await {
        Ok(sweep) => sweep,
        Err(err) => {
            tracing::warn!(error = %err, "node address refresh skipped: the cluster sweep failed");
            return 0;
        }
    };
    let index = SweepIndex::new(&sweep);
    let found = resolve_all(
        &shared.cloud,
        &index,
        nodes.iter().map(|(_, l)| l.clone()).collect(),
    )
    .await;

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
    futures::stream::iter(patches)
        .for_each_concurrent(shared.workers, |(name, addresses)| {
            let api = api.clone();
            async move {
                tracing::info!(node = %name, addresses = %plan::format_addresses(&addresses), "updating node addresses");
                let patch = json!({"status": {"addresses": addresses}});
                if let Err(err) = crate::controllers::merge_patch_status(&api, &name, patch).await {
                    tracing::warn!(node = %name, error = %err, "updating node addresses failed; retried next period");
                }
            }
        })
        .await;
    tracing::debug!(nodes = nodes.len(), changed, "node addresses refreshed");
    changed
}
