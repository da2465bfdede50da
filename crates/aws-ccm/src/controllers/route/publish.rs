//! The Kubernetes side of a reconcile: `NetworkUnavailable` conditions,
//! written unless the Node already says so, and Warning events, sent once
//! per failure and period.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tokio::time::Instant;

use super::plan::{Blocker, RouteChange};
use super::*;
use crate::controllers::cached_node::Node;
use crate::controllers::events::Events;

/// The Node reference events use: the node's name as UID, as upstream's
/// node events do, so `kubectl describe node` shows them.
pub(crate) fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.to_string()),
        uid: Some(name.to_string()),
        ..Default::default()
    }
}

/// The `NetworkUnavailable` condition the route controller writes, as
/// upstream's `updateNetworkingCondition`: (status, reason, message).
fn wanted(unavailable: bool) -> (&'static str, &'static str, &'static str) {
    if unavailable {
        (
            "True",
            REASON_NO_ROUTE_CREATED,
            "RouteController failed to create a route",
        )
    } else {
        (
            "False",
            REASON_ROUTE_CREATED,
            "RouteController created a route",
        )
    }
}

/// Whether `NetworkUnavailable` (status, reason) is one the route
/// controller writes: False/`RouteCreated` or True/`NoRouteCreated`.
pub(crate) fn written_by_routes(status: &str, reason: Option<&str>) -> bool {
    [false, true].into_iter().any(|unavailable| {
        let (s, r, _) = wanted(unavailable);
        s == status && reason == Some(r)
    })
}

/// Whether the Node already says what would be written: upstream skips the
/// write only when both the status and its own reason are there (the
/// message is not compared). The same status with another writer's reason,
/// such as Calico's False/`CalicoIsUp`, is rewritten.
fn already_set(node: &Node, unavailable: bool) -> bool {
    let (status, _, _) = wanted(unavailable);
    let Some(node_status) = node.status.as_ref() else {
        return false;
    };
    let conditions = node_status.conditions.iter().flatten();
    node_status.network_reason_is_routes
        && conditions
            .filter(|c| c.type_ == NETWORK_UNAVAILABLE)
            .any(|c| c.status == status)
}

/// Writes `NetworkUnavailable` through the status subresource with a
/// strategic merge on `status.conditions` (merge key `type`), touching no
/// other condition. Both timestamps are now at every write, as upstream's
/// (its `SetNodeCondition` sets the heartbeat, the controller the
/// transition).
async fn set_network_unavailable(
    api: &Api<Node>,
    node: &str,
    unavailable: bool,
) -> Result<(), kube::Error> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let (status, reason, message) = wanted(unavailable);
    let patch = json!({"status": {"conditions": [{
        "type": NETWORK_UNAVAILABLE,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
        "lastHeartbeatTime": now,
    }]}});
    api.patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await
        .map(|_| ())
}

/// The event reason of a failed change: IAM's denial, whether a DryRun found
/// it before the write or the write itself was answered so, names what IAM
/// refused (the instance or the route table); anything else is a failed
/// route.
pub(super) fn event_reason(failure: &ChangeFailure) -> &'static str {
    match (failure.error.is_denied(), &failure.change) {
        (true, RouteChange::DisableSourceDestCheck { .. }) => EVENT_INSTANCE_UNAUTHORIZED,
        (true, _) => EVENT_ROUTE_TABLE_UNAUTHORIZED,
        (false, _) => EVENT_FAILED_TO_CREATE_ROUTE,
    }
}

/// The Kubernetes side: conditions and events from a report, written only
/// when they change.
pub(super) struct Publisher {
    nodes_api: Api<Node>,
    events: Events,
    /// Node → the resourceVersion it had when its condition was written:
    /// while the cache still shows that version, it has not caught up with
    /// the write.
    written: HashMap<String, String>,
    /// (node, what failed) → when the event was last sent.
    announced: HashMap<(String, String), Instant>,
}

impl Publisher {
    pub(super) fn new(kube: kube::Client) -> Publisher {
        Publisher {
            nodes_api: Api::all(kube.clone()),
            events: Events::new(kube, "route_controller"),
            written: HashMap::new(),
            announced: HashMap::new(),
        }
    }

    pub(super) async fn publish(&mut self, report: &Report, cache: &HashMap<String, Arc<Node>>) {
        self.announce_failures(report).await;
        self.announce_blockers(report).await;
        self.warn_near_capacity(report).await;
        let now = Instant::now();
        self.write_conditions(report, cache).await;
        let live: HashSet<&String> = report.plan.nodes.keys().collect();
        self.announced
            .retain(|(node, _), at| live.contains(node) && now.duration_since(*at) < EVENT_REPEAT);
    }

    /// Events for failed changes, once per (node, change) per EVENT_REPEAT.
    async fn announce_failures(&mut self, report: &Report) {
        for failure in &report.failures {
            let Some(node) = failure.change.node() else {
                continue;
            };
            if failure.error.is_already_exists() {
                continue;
            }
            let note = match (&failure.change, failure.change.route()) {
                (_, Some((table_id, destination, Some(instance_id)))) => format!(
                    "Could not create route {destination} in route table {table_id} for node {node} \
                     (instance {instance_id}): {}",
                    failure.error
                ),
                (RouteChange::DisableSourceDestCheck { instance_id, .. }, _) => format!(
                    "Could not create routes for node {node}: turning off source/destination check on instance \
                     {instance_id} failed: {}",
                    failure.error
                ),
                _ => continue,
            };
            let reason = event_reason(failure);
            let key = (node.to_string(), failure.change.to_string());
            self.announce(node, key, reason, note).await;
        }
    }

    /// Blockers, except a missing provider ID (normal while a node starts).
    async fn announce_blockers(&mut self, report: &Report) {
        for (name, outcome) in &report.plan.nodes {
            for blocker in &outcome.blockers {
                if *blocker == Blocker::NoInstance {
                    continue;
                }
                let note = format!("Could not create routes for node {name}: {blocker}");
                let key = (name.clone(), blocker.to_string());
                self.announce(name, key, EVENT_FAILED_TO_CREATE_ROUTE, note)
                    .await;
            }
        }
    }

    async fn warn_near_capacity(&mut self, report: &Report) {
        for warning in &report.new_capacity_warnings {
            tracing::warn!(route_table = %warning.table_id, routes = warning.routes, limit = warning.limit, "{}", warning.message());
            // Events need an object; a table has none in Kubernetes, so the
            // warning goes on the first routed node (by name).
            let routed = report
                .nodes
                .iter()
                .find(|(_, r)| **r == NodeResult::Routed)
                .or_else(|| report.nodes.iter().next())
                .map(|(name, _)| name);
            if let Some(name) = routed {
                self.events
                    .warning(
                        &node_ref(name),
                        EVENT_ROUTE_TABLE_NEAR_CAPACITY,
                        warning.message(),
                    )
                    .await;
            }
        }
    }

    /// `NetworkUnavailable` of each node with a result, unless it already
    /// says so ([`already_set`]).
    async fn write_conditions(&mut self, report: &Report, cache: &HashMap<String, Arc<Node>>) {
        self.written.retain(|name, _| cache.contains_key(name));
        for (name, result) in &report.nodes {
            let unavailable = match result {
                NodeResult::Routed => false,
                NodeResult::Failed(_) => true,
                NodeResult::Unconfirmed => continue,
            };
            let Some(node) = cache.get(name) else {
                continue;
            };
            let version = node.metadata.resource_version.as_ref();
            if self.written.get(name) == version && version.is_some() {
                // Written from this version; the cache has not caught up.
                continue;
            }
            self.written.remove(name);
            if already_set(node, unavailable) {
                continue;
            }
            match set_network_unavailable(&self.nodes_api, name, unavailable).await {
                Ok(()) => {
                    tracing::info!(node = %name, unavailable, "set NetworkUnavailable");
                    if let Some(version) = version {
                        self.written.insert(name.clone(), version.clone());
                    }
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "could not update the node's NetworkUnavailable condition")
                }
            }
        }
    }

    async fn announce(&mut self, node: &str, key: (String, String), reason: &str, note: String) {
        let now = Instant::now();
        if self
            .announced
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < EVENT_REPEAT)
        {
            return;
        }
        tracing::warn!(node, "{note}");
        self.events.warning(&node_ref(node), reason, note).await;
        self.announced.insert(key, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Node whose `NetworkUnavailable` someone wrote, as the cache
    /// decodes it.
    fn with_condition(status: &str, reason: Option<&str>) -> Node {
        serde_json::from_value(json!({"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady"},
            {"type": NETWORK_UNAVAILABLE, "status": status, "reason": reason},
        ]}}))
        .expect("a valid Node")
    }

    /// Upstream's `updateNetworkingCondition`: the write is skipped only
    /// for its own status and reason together.
    #[test]
    fn only_the_route_controllers_own_status_and_reason_skip_the_write() {
        let routed = false;
        let unrouted = true;
        assert!(already_set(
            &with_condition("False", Some("RouteCreated")),
            routed
        ));
        assert!(already_set(
            &with_condition("True", Some("NoRouteCreated")),
            unrouted
        ));
        for (status, reason) in [
            ("False", Some("CalicoIsUp")),
            ("False", None),
            ("True", Some("RouteCreated")),
            ("True", Some("NoRouteCreated")),
            ("Unknown", Some("RouteCreated")),
        ] {
            assert!(
                !already_set(&with_condition(status, reason), routed),
                "{status}/{reason:?} is rewritten to False/RouteCreated"
            );
        }
        for (status, reason) in [
            ("True", Some("NodeInitializing")),
            ("True", None),
            ("False", Some("RouteCreated")),
        ] {
            assert!(
                !already_set(&with_condition(status, reason), unrouted),
                "{status}/{reason:?} is rewritten to True/NoRouteCreated"
            );
        }
        assert!(!already_set(&Node::default(), routed), "no condition yet");
    }
}
