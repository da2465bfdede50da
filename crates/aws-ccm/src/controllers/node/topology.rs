//! The `topology.k8s.aws/network-node-layer-N` labels.
//!
//! At initialization the instance's network nodes are asked for right
//! after the instance is found, in the lookup prefetch (so the questions of
//! nodes that join together are batched; which instances are asked, and
//! what is remembered, is the cloud's business: see
//! `aws::instances::topology`) and the labels go into the same write as the
//! zone and instance-type labels. A node that already has layer 1 keeps its
//! labels and costs no call, as upstream.
//!
//! Unlike upstream, a failed question (throttled, AWS down) does not hold
//! the node's initialization back: the node is initialized without the
//! labels, and asked again with backoff until an answer comes. An
//! initialized node without layer 1 whose `node.kubernetes.io/instance-type`
//! is expected to have a topology (cloud.conf
//! `SupportedTopologyInstanceTypePattern`) is asked too, so the labels also
//! come after a restart; the cloud remembers empty answers for a day, so
//! this costs at most one question per node per day.

use std::collections::HashMap;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::json;
use tokio::time::Instant;

use super::{NodeError, Shared, plan};
use crate::controllers::cached_node::Node;
use crate::ids::{is_instance_id, node_instance_id};
use crate::provider::instances::{Instance, Instances};

/// First wait after a failed question; doubled per failure.
const RETRY_BASE: Duration = Duration::from_secs(5);
/// Longest wait between questions for one node.
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Nodes whose question failed: attempts so far and when to ask again.
#[derive(Default)]
pub(super) struct Retries {
    nodes: Mutex<HashMap<String, (u32, Instant)>>,
}

impl Retries {
    /// Records a failure; the wait before the next question.
    fn failed(&self, name: &str) -> Duration {
        let mut nodes = self.nodes.lock();
        let attempts = nodes.get(name).map_or(0, |(n, _)| *n);
        let delay = RETRY_BASE
            .saturating_mul(1 << attempts.min(16))
            .min(RETRY_MAX);
        nodes.insert(name.to_string(), (attempts + 1, Instant::now() + delay));
        delay
    }

    pub(super) fn forget(&self, name: &str) {
        self.nodes.lock().remove(name);
    }

    /// `None` when the node has no failed question; else how long until the
    /// next one is due (zero: due now).
    fn wait_left(&self, name: &str) -> Option<Duration> {
        (self.nodes.lock().get(name)).map(|(_, at)| at.saturating_duration_since(Instant::now()))
    }
}

fn instance_type_label(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(plan::LABEL_INSTANCE_TYPE))
        .map(String::as_str)
}

/// At initialization: the instance's network nodes (empty when it has
/// none or the node keeps its own labels), and the wait before asking
/// again when the question failed.
pub(super) async fn at_init<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
    instance: &Instance,
) -> (Vec<String>, Option<Duration>) {
    if !plan::wants_network_nodes(node) {
        return (Vec::new(), None);
    }
    let name = node.name_any();
    let answer = match shared.prefetch.take_network_nodes(&name, &instance.id) {
        Some(answer) => answer,
        None => {
            (shared.cloud)
                .network_nodes(&instance.id, instance.instance_type.as_deref())
                .await
        }
    };
    match answer {
        Ok(nodes) => {
            shared.topology.forget(&name);
            (nodes.unwrap_or_default(), None)
        }
        Err(err) => {
            let delay = shared.topology.failed(&name);
            tracing::warn!(instance = %instance.id, error = %err, retry_in = ?delay, "reading the instance's network topology failed; the node is initialized without the topology.k8s.aws/network-node-layer-N labels, which are added once AWS answers");
            (Vec::new(), Some(delay))
        }
    }
}

/// Whether an initialized node has a question due: no layer-1 label, and
/// a failed question whose wait is over, or (none failed) an instance type
/// expected to have a topology.
pub(super) fn worth_asking<I: Instances>(node: &Node, shared: &Shared<I>) -> bool {
    if plan::is_uninitialized(node) || !plan::wants_network_nodes(node) {
        return false;
    }
    match shared.topology.wait_left(&node.name_any()) {
        Some(wait) => wait.is_zero(),
        None => instance_type_label(node).is_some_and(|t| shared.cloud.expects_topology(t)),
    }
}

/// For an initialized node: asks when [`worth_asking`] and writes the
/// labels; `Some(wait)` to come back after a failure.
pub(super) async fn label_initialized<I: Instances>(
    node: &Node,
    shared: &Shared<I>,
) -> Result<Option<Duration>, NodeError> {
    let name = node.name_any();
    if !plan::wants_network_nodes(node) {
        shared.topology.forget(&name);
        return Ok(None);
    }
    if let Some(wait) = shared.topology.wait_left(&name).filter(|w| !w.is_zero()) {
        return Ok(Some(wait));
    }
    if !worth_asking(node, shared) {
        return Ok(None);
    }
    let Some(id) = node_instance_id(node)
        .ok()
        .flatten()
        .filter(|id| is_instance_id(id))
    else {
        return Ok(None);
    };
    let nodes = match shared
        .cloud
        .network_nodes(&id, instance_type_label(node))
        .await
    {
        Ok(nodes) => nodes.unwrap_or_default(),
        Err(err) => {
            let delay = shared.topology.failed(&name);
            tracing::warn!(node = %name, instance = %id, error = %err, retry_in = ?delay, "reading the instance's network topology failed; retrying");
            return Ok(Some(delay));
        }
    };
    shared.topology.forget(&name);
    let labels = plan::network_node_labels(node, &nodes);
    if labels.is_empty() {
        return Ok(None);
    }
    tracing::info!(node = %name, instance = %id, ?labels, "adding network-node labels");
    let patch = json!({"metadata": {
        "resourceVersion": node.resource_version(),
        "labels": labels,
    }});
    match (shared.api())
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => Ok(None),
        // Someone wrote meanwhile: look again at the new version soon.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(shared.topology.failed(&name))),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
        Err(source) => Err(NodeError::Kube { node: name, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_doubling_up_to_the_cap_and_are_forgotten() {
        let r = Retries::default();
        assert_eq!(r.wait_left("n"), None);
        assert_eq!(r.failed("n"), RETRY_BASE);
        assert_eq!(r.failed("n"), RETRY_BASE * 2);
        assert_eq!(r.failed("n"), RETRY_BASE * 4);
        for _ in 0..40 {
            r.failed("n");
        }
        assert_eq!(r.failed("n"), RETRY_MAX);
        assert!(r.wait_left("n").is_some_and(|w| w <= RETRY_MAX));
        r.forget("n");
        assert_eq!(r.wait_left("n"), None);
    }
}
