// Not kube-runtime's Controller: it is a periodic pass over every node with one batched AWS lookup per period, not a reaction to object changes.
//! The cloud-node-lifecycle controller.
//!
//! Every `--node-monitor-period`: a Ready node loses the shutdown taint; a
//! node that is not Ready (condition False or Unknown, or none) is checked
//! against AWS: if its instance is terminated or no longer exists the Node is
//! deleted (event `DeletingNode`, `DeletingNodeFailed` on failure); if the
//! instance is stopped the Node gets `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`.
//!
//! AWS is asked once per period for all nodes: the shared cluster sweep
//! (cached, also used by the cloud-node controller), plus batched lookups by
//! ID for instances the sweep does not list (untagged, or gone). Absence from
//! the sweep alone never deletes a Node, and an AWS error is never taken for
//! "gone": when the sweep fails nothing is deleted or tainted that period.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Taint;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ControllerContext;
use super::events::Events;
use super::node::identity::{self, Lookup};
use super::node::lookups::{SweepIndex, lookup};
use super::node::plan::taints_without;
use crate::provider::instances::{InstanceState, Instances};

pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
pub const EVENT_DELETING_NODE: &str = "DeletingNode";
pub const EVENT_DELETING_NODE_FAILED: &str = "DeletingNodeFailed";

/// What AWS says about a node's instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The instance exists in this state.
    Exists(InstanceState),
    /// AWS answered that there is no such instance.
    Gone,
}

/// What the controller does to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Nothing,
    Delete,
    AddShutdownTaint,
    RemoveShutdownTaint,
}

/// `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

fn has_shutdown_taint(node: &Node) -> bool {
    taints_without(node, SHUTDOWN_TAINT).is_some()
}

/// The decision for one node, given what AWS said about its instance
/// (`None`: AWS could not be asked or failed; never a reason to delete).
pub fn decide(node: &Node, observation: Option<&Observation>) -> Decision {
    if is_ready(node) {
        return if has_shutdown_taint(node) {
            Decision::RemoveShutdownTaint
        } else {
            Decision::Nothing
        };
    }
    match observation {
        // As upstream: only `terminated` means gone (a shutting-down
        // instance may still be stopped instead).
        Some(Observation::Gone) | Some(Observation::Exists(InstanceState::Terminated)) => {
            Decision::Delete
        }
        Some(Observation::Exists(InstanceState::Stopped)) if !has_shutdown_taint(node) => {
            Decision::AddShutdownTaint
        }
        _ => Decision::Nothing,
    }
}

/// Observations for every lookup, or `None` when the sweep failed (then
/// nothing may be deleted). Lookups that failed are left out.
async fn observe<I: Instances>(cloud: &I, keys: &[Lookup]) -> Option<HashMap<Lookup, Observation>> {
    let sweep = match cloud.cluster_instances().await {
        Ok(sweep) => sweep,
        Err(err) => {
            tracing::warn!(error = %err, "cluster sweep failed: no node is deleted or tainted this period");
            return None;
        }
    };
    let index = SweepIndex::new(&sweep);
    let mut out = HashMap::new();
    let mut confirm = Vec::new();
    for key in keys {
        match index.find(key) {
            Some(instance) => {
                out.insert(key.clone(), Observation::Exists(instance.state.clone()));
            }
            // Missing from the sweep: gone, or just not tagged. Ask.
            None => confirm.push(key.clone()),
        }
    }
    let answers = futures::future::join_all(confirm.iter().map(|key| lookup(cloud, key))).await;
    for (key, answer) in confirm.into_iter().zip(answers) {
        match answer {
            Ok(Some(instance)) => {
                out.insert(key, Observation::Exists(instance.state));
            }
            Ok(None) => {
                out.insert(key, Observation::Gone);
            }
            Err(err) => {
                tracing::warn!(lookup = %key, error = %err, "instance lookup failed; the node is left alone this period");
            }
        }
    }
    Some(out)
}

struct Shared<I: Instances> {
    kube: kube::Client,
    cloud: I,
    events: Events,
}

/// Runs the controller until `stop` is cancelled.
pub async fn run(ctx: ControllerContext, stop: CancellationToken) {
    let shared = Arc::new(Shared {
        kube: ctx.kube.clone(),
        cloud: ctx.aws.clone(),
        events: Events::new(ctx.kube.clone(), "cloud-node-lifecycle-controller"),
    });
    let period = ctx
        .options
        .options
        .node_monitor_period
        .max(Duration::from_millis(100));
    tracing::info!(?period, "cloud-node-lifecycle controller started");
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let nodes = ctx.nodes.state();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = monitor(&shared, nodes) => {}
        }
    }
}

/// One pass over every node.
async fn monitor<I: Instances>(shared: &Shared<I>, nodes: Vec<Arc<Node>>) {
    let mut checks: Vec<(Arc<Node>, Option<Lookup>)> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let key = if is_ready(&node) {
            None
        } else {
            match identity::lookup_for_node(&node) {
                Ok(key) => Some(key),
                Err(err) => {
                    tracing::debug!(node = %node.name_any(), error = %err, "cannot check the instance of a NotReady node");
                    None
                }
            }
        };
        checks.push((node, key));
    }
    let keys: Vec<Lookup> = checks.iter().filter_map(|(_, k)| k.clone()).collect();
    let observations = if keys.is_empty() {
        Some(HashMap::new())
    } else {
        observe(&shared.cloud, &keys).await
    };
    let decisions: Vec<(Arc<Node>, Decision)> = checks
        .into_iter()
        .map(|(node, key)| {
            let observed = key
                .as_ref()
                .and_then(|k| observations.as_ref().and_then(|o| o.get(k)));
            let decision = decide(&node, observed);
            (node, decision)
        })
        .filter(|(_, d)| *d != Decision::Nothing)
        .collect();
    futures::stream::iter(decisions)
        .for_each_concurrent(8, |(node, decision)| async move {
            apply(shared, &node, decision).await;
        })
        .await;
}

fn taint_patch(node: &Node, taints: Vec<Taint>) -> Value {
    json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": if taints.is_empty() { Value::Null } else { json!(taints) }},
    })
}

async fn apply<I: Instances>(shared: &Shared<I>, node: &Node, decision: Decision) {
    let api: Api<Node> = Api::all(shared.kube.clone());
    let name = node.name_any();
    match decision {
        Decision::Nothing => {}
        Decision::Delete => {
            let reference = node.object_ref(&());
            tracing::info!(node = %name, "deleting node since it is no longer present in the cloud provider");
            shared
                .events
                .normal(
                    &reference,
                    EVENT_DELETING_NODE,
                    format!("Deleting node {name} because it does not exist in the cloud provider"),
                )
                .await;
            // Only this Node: not a new one registered under the same name.
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: node.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(err) => {
                    tracing::error!(node = %name, error = %err, "unable to delete node");
                    shared
                        .events
                        .warning(
                            &reference,
                            EVENT_DELETING_NODE_FAILED,
                            format!("Failed deleting node {name}: {err}"),
                        )
                        .await;
                }
            }
        }
        Decision::AddShutdownTaint => {
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints.push(Taint {
                key: SHUTDOWN_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            });
            tracing::info!(node = %name, "instance is stopped: adding the shutdown taint");
            patch_taints(&api, &name, taint_patch(node, taints)).await;
        }
        Decision::RemoveShutdownTaint => {
            let taints = taints_without(node, SHUTDOWN_TAINT).unwrap_or_default();
            tracing::info!(node = %name, "node is Ready: removing the shutdown taint");
            patch_taints(&api, &name, taint_patch(node, taints)).await;
        }
    }
}

async fn patch_taints(api: &Api<Node>, name: &str, patch: Value) {
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {}
        // Changed or gone meanwhile: the next period looks again.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
        Err(err) => {
            tracing::warn!(node = %name, error = %err, "updating the shutdown taint failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::NodeCondition;
    use crate::controllers::cached_node::NodeStatus;
    use crate::provider::instances::fake::{FakeInstances, instance};
    use crate::provider::instances::{CloudError, CloudErrorKind};
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn node(ready: Option<&str>, taints: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some("aws:///us-east-1a/i-1".into()),
                taints: Some(
                    taints
                        .iter()
                        .map(|k| Taint {
                            key: k.to_string(),
                            effect: "NoSchedule".into(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: ready.map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn decisions_follow_readiness_and_instance_state() {
        use Decision::*;
        use Observation::*;
        let running = Exists(InstanceState::Running);
        let stopped = Exists(InstanceState::Stopped);
        let terminated = Exists(InstanceState::Terminated);
        // Ready nodes are never checked against AWS.
        assert_eq!(decide(&node(Some("True"), &[]), Some(&Gone)), Nothing);
        assert_eq!(
            decide(&node(Some("True"), &[SHUTDOWN_TAINT]), None),
            RemoveShutdownTaint
        );
        for not_ready in [Some("False"), Some("Unknown"), None] {
            let n = node(not_ready, &[]);
            assert_eq!(decide(&n, Some(&Gone)), Delete);
            assert_eq!(decide(&n, Some(&terminated)), Delete);
            assert_eq!(decide(&n, Some(&stopped)), AddShutdownTaint);
            assert_eq!(decide(&n, Some(&running)), Nothing);
            assert_eq!(
                decide(&n, Some(&Exists(InstanceState::ShuttingDown))),
                Nothing
            );
            assert_eq!(decide(&n, None), Nothing, "no answer is not an answer");
        }
        assert_eq!(
            decide(&node(Some("False"), &[SHUTDOWN_TAINT]), Some(&stopped)),
            Nothing,
            "already tainted"
        );
    }

    #[tokio::test]
    async fn absence_from_the_sweep_is_confirmed_and_errors_observe_nothing() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-tagged", "10.0.0.1"));
        let mut untagged = instance("i-untagged", "10.0.0.2");
        untagged.state = InstanceState::Stopped;
        cloud.add(untagged);
        cloud.hide_from_sweep("i-untagged");
        let keys = [
            Lookup::ById("i-tagged".into()),
            Lookup::ById("i-untagged".into()),
            Lookup::ById("i-gone".into()),
            Lookup::ByPrivateDns("ip-10-0-0-9.ec2.internal".into()),
        ];
        let seen = observe(&cloud, &keys).await.unwrap();
        assert_eq!(seen[&keys[0]], Observation::Exists(InstanceState::Running));
        assert_eq!(
            seen[&keys[1]],
            Observation::Exists(InstanceState::Stopped),
            "an untagged instance is not gone"
        );
        assert_eq!(seen[&keys[2]], Observation::Gone);
        assert_eq!(seen[&keys[3]], Observation::Gone);
        assert_eq!(cloud.calls().by_id, ["i-untagged", "i-gone"]);

        // A failed confirmation leaves the node out; a failed sweep observes nothing.
        let down = CloudError::new(CloudErrorKind::Transient, "503");
        cloud.fail_lookups(Some(down.clone()));
        let seen = observe(&cloud, &keys).await.unwrap();
        assert!(!seen.contains_key(&keys[2]));
        assert_eq!(seen[&keys[0]], Observation::Exists(InstanceState::Running));
        cloud.fail_sweep(Some(down));
        assert_eq!(observe(&cloud, &keys).await, None);
    }
}
