// A set pass on the periodic runner (schedule/periodic.rs), not a keyed reconcile: a pass over every node with one batched AWS lookup per period, not a reaction to object changes.
//! The cloud-node-lifecycle controller.
//!
//! Every `--node-monitor-period`: a Ready node loses the shutdown taint; a
//! node that is not Ready (condition False or Unknown, or none) is checked
//! against AWS: if its instance is proven gone the Node is deleted (event
//! `DeletingNode`, `DeletingNodeFailed` on failure); if the instance is
//! stopped the Node gets `node.cloudprovider.kubernetes.io/shutdown:NoSchedule`.
//!
//! What proves an instance gone depends on how the Node names it
//! ([`Named`]), as in the Go CCM, whose lifecycle controller deletes a Node
//! only when `InstanceExists` answers false without an error: a providerID
//! whose instance is terminated or not found; a Node without providerID
//! named by instance ID whose instance is terminated or not found (since
//! upstream PR #1474, merged after 63ec440: EC2's `InvalidInstanceID.NotFound`
//! for that ID is proof). A Node without providerID whose name finds no
//! live instance of this cluster as private DNS name is kept, with a
//! Warning `KeepingNode` (once per Node) and the gauge
//! `node_lifecycle_nodes_unverified`: a name that finds nothing does not
//! prove the machine gone (PR #1474 deletes it too; this is a deliberate
//! difference, as kubernetes/kubernetes#141364 argues).
//!
//! A Node whose providerID names a zone of another Region is not judged at
//! all, Ready or not: no lookup, no deletion, no shutdown taint added or
//! removed. That Region's CCM owns it; it is reported once
//! ([`outside_region`]).
//!
//! AWS is asked once per period for all nodes: the shared cluster sweep
//! (cached, also used by the cloud-node controller), plus batched lookups by
//! ID for instances the sweep does not list (untagged, or gone). Absence from
//! the sweep alone never deletes a Node, and an AWS error is never taken for
//! "gone": when the sweep fails nothing is deleted or tainted that period.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::controllers::cached_node::Node;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Taint;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::ControllerContext;
use super::events::Events;
use super::node::identity::{self, Lookup};
use super::node::lookups::{SweepIndex, lookup};
use super::node::outside_region;
use super::node::plan::{has_taint, taints_without};
use super::schedule::periodic::{Pass, Periodic};
use crate::backoff::Backoff;
use crate::ids::OutsideRegion;
use crate::provider::Cloud;
use crate::provider::instances::{InstanceState, Instances};

pub(crate) const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
const EVENT_DELETING_NODE: &str = "DeletingNode";
const EVENT_DELETING_NODE_FAILED: &str = "DeletingNodeFailed";
const EVENT_KEEPING_NODE: &str = "KeepingNode";

static UNVERIFIED: LazyLock<Gauge> = LazyLock::new(|| {
    let gauge = Gauge::default();
    crate::metrics::register(
        "node_lifecycle_nodes_unverified",
        "NotReady Nodes without spec.providerID whose name, looked up as a private DNS name, found no instance of this cluster, kept at the last node monitor pass.",
        gauge.clone(),
    );
    gauge
});

/// How a Node names its instance, which decides what AWS's answer proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Named {
    /// `spec.providerID`: terminated or not found is gone (upstream's
    /// `InstanceExistsByProviderID`).
    ProviderId,
    /// No providerID, a resource-based name (`i-…`): terminated or not
    /// found is gone (upstream since PR #1474).
    InstanceIdName,
    /// No providerID, any other name, looked up as a live cluster
    /// instance's private DNS name: not found keeps the Node (upstream's
    /// `InstanceNotFound` error).
    PrivateDnsName,
}

impl Named {
    pub(crate) fn of(node: &Node, lookup: &Lookup) -> Named {
        let has_provider_id = (node.spec.as_ref())
            .and_then(|s| s.provider_id.as_deref())
            .is_some_and(|p| !p.is_empty());
        match lookup {
            _ if has_provider_id => Named::ProviderId,
            Lookup::ById(_) => Named::InstanceIdName,
            Lookup::ByPrivateDns(_) => Named::PrivateDnsName,
        }
    }
}

/// What AWS says about a node's instance.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Observation {
    /// The instance exists in this state.
    Exists(InstanceState),
    /// AWS answered that there is no such instance.
    Gone,
}

/// What the controller does to one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Nothing,
    Delete,
    /// NotReady, and no lookup found its instance: kept and reported.
    KeepUnverified,
    /// In another Region: not judged, reported once.
    OutsideRegion(OutsideRegion),
    AddShutdownTaint,
    RemoveShutdownTaint,
}

/// `Ready` condition is `True`.
fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// The decision for one node, given how it names its instance and what
/// AWS said about it (`None`: AWS was not asked or failed; never a reason
/// to delete).
fn decide(node: &Node, answer: Option<(Named, &Observation)>) -> Decision {
    use InstanceState::{Stopped, Terminated};
    use Observation::{Exists, Gone};
    if is_ready(node) {
        return if has_taint(node, SHUTDOWN_TAINT) {
            Decision::RemoveShutdownTaint
        } else {
            Decision::Nothing
        };
    }
    match answer {
        // As upstream: only `terminated` means gone (a shutting-down
        // instance may still be stopped instead). An ID EC2 does not know
        // is gone whether the providerID or the name holds it.
        Some((Named::ProviderId | Named::InstanceIdName, Gone | Exists(Terminated))) => {
            Decision::Delete
        }
        // A name lookup finds only live instances (upstream filters out
        // terminated ones), so a terminated one is no answer either.
        Some((Named::PrivateDnsName, Gone | Exists(Terminated))) => Decision::KeepUnverified,
        Some((_, Exists(Stopped))) if !has_taint(node, SHUTDOWN_TAINT) => {
            Decision::AddShutdownTaint
        }
        _ => Decision::Nothing,
    }
}

/// Observations for every lookup, or `None` when the sweep failed (then
/// nothing may be deleted). Lookups that failed are left out. As upstream,
/// a private DNS name finds only an instance of this cluster.
async fn observe<I: Instances>(
    cloud: &I,
    cluster_id: &str,
    keys: &[Lookup],
) -> Option<HashMap<Lookup, Observation>> {
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
            Ok(Some(instance))
                if matches!(key, Lookup::ById(_)) || instance.is_in_cluster(cluster_id) =>
            {
                out.insert(key, Observation::Exists(instance.state));
            }
            Ok(_) => {
                out.insert(key, Observation::Gone);
            }
            Err(err) => {
                tracing::warn!(lookup = %key, error = %err, "instance lookup failed; the node is left alone this period");
            }
        }
    }
    Some(out)
}

/// A pass whose sweep failed is run again after 1 s, doubling up to the
/// period (the runner's bound).
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));

struct Shared<I: Instances> {
    kube: kube::Client,
    cloud: I,
    cluster_id: String,
    region: String,
    events: Events,
    /// UIDs of the Nodes kept unverified at the last pass, each reported
    /// once while it stays so.
    unverified: Mutex<HashSet<String>>,
}

/// Runs the controller until `stop` is cancelled.
pub(crate) async fn run<C: Cloud>(ctx: ControllerContext<C>, stop: CancellationToken) {
    let shared = Arc::new(Shared {
        kube: ctx.kube.clone(),
        cloud: ctx.provider.clone(),
        cluster_id: ctx.cluster_id.clone(),
        region: ctx.region.clone(),
        events: Events::new(ctx.kube.clone(), "cloud-node-lifecycle-controller"),
        unverified: Mutex::default(),
    });
    LazyLock::force(&UNVERIFIED);
    outside_region::register();
    let period = ctx
        .options
        .options
        .node_monitor_period
        .max(Duration::from_millis(100));
    tracing::info!(?period, "cloud-node-lifecycle controller started");
    Periodic::new("node-lifecycle", RETRY)
        .every(period)
        .run(&stop, move || {
            let (shared, nodes) = (shared.clone(), ctx.nodes.state());
            async move { monitor(&shared, nodes).await }
        })
        .await;
}

/// What the controller does to each node now, `Nothing` left out (also
/// `aws-ccm plan`'s), and whether AWS answered: `false` when the sweep
/// failed, and then nothing is decided. A node of another Region than
/// `region`, the CCM's, is `OutsideRegion`, and nothing else is asked.
pub(crate) async fn decisions<I: Instances>(
    cloud: &I,
    cluster_id: &str,
    region: &str,
    nodes: Vec<Arc<Node>>,
) -> (Vec<(Arc<Node>, Decision)>, bool) {
    let mut checks: Vec<(Arc<Node>, Option<Lookup>)> = Vec::with_capacity(nodes.len());
    let mut outside = Vec::new();
    for node in nodes {
        if let Some(o) = crate::ids::node_outside_region(&node, region) {
            outside.push((node, Decision::OutsideRegion(o)));
            continue;
        }
        let key = match (!is_ready(&node)).then(|| identity::lookup_for_node(&node, region)) {
            Some(Err(err)) => {
                tracing::debug!(node = %node.name_any(), error = %err, "cannot check the instance of a NotReady node");
                None
            }
            key => key.and_then(Result::ok),
        };
        checks.push((node, key));
    }
    let keys: Vec<Lookup> = checks.iter().filter_map(|(_, k)| k.clone()).collect();
    let observations = if keys.is_empty() {
        Some(HashMap::new())
    } else {
        observe(cloud, cluster_id, &keys).await
    };
    let decisions = checks
        .into_iter()
        .map(|(node, key)| {
            let answer = key.and_then(|key| {
                let observed = observations.as_ref()?.get(&key)?;
                Some((Named::of(&node, &key), observed))
            });
            let decision = decide(&node, answer);
            (node, decision)
        })
        .filter(|(_, d)| *d != Decision::Nothing)
        .chain(outside)
        .collect();
    (decisions, observations.is_some())
}

/// One pass over every node; to be done again soon when AWS did not answer.
async fn monitor<I: Instances>(shared: &Shared<I>, nodes: Vec<Arc<Node>>) -> Pass {
    let (decisions, answered) =
        decisions(&shared.cloud, &shared.cluster_id, &shared.region, nodes).await;
    if answered {
        report_unverified(shared, &decisions).await;
    }
    let outside: Vec<(Arc<Node>, OutsideRegion)> = (decisions.iter())
        .filter_map(|(node, d)| match d {
            Decision::OutsideRegion(o) => Some((node.clone(), o.clone())),
            _ => None,
        })
        .collect();
    outside_region::report_all(&shared.events, &outside).await;
    let decisions = (decisions.into_iter())
        .filter(|(_, d)| !matches!(d, Decision::KeepUnverified | Decision::OutsideRegion(_)));
    futures::stream::iter(decisions)
        .for_each_concurrent(8, |(node, decision)| async move {
            apply(shared, &node, decision).await;
        })
        .await;
    if answered { Pass::Done } else { Pass::Retry }
}

/// The Nodes kept because no lookup found their instance: the gauge, and
/// a Warning for each Node newly so (not every period: each would be a
/// write to the API server).
async fn report_unverified<I: Instances>(shared: &Shared<I>, decisions: &[(Arc<Node>, Decision)]) {
    let kept: Vec<&Arc<Node>> = (decisions.iter())
        .filter(|(_, d)| *d == Decision::KeepUnverified)
        .map(|(node, _)| node)
        .collect();
    UNVERIFIED.set(kept.len() as i64);
    let uid = |node: &Node| node.metadata.uid.clone().unwrap_or_else(|| node.name_any());
    let now: HashSet<String> = kept.iter().map(|n| uid(n)).collect();
    let before = std::mem::replace(&mut *shared.unverified.lock(), now);
    for node in kept.into_iter().filter(|n| !before.contains(&uid(n))) {
        let name = node.name_any();
        // No providerID (else it is not unverified): the name says how.
        let lookup = identity::lookup_for_name(&name)
            .map(|l| l.to_string())
            .unwrap_or_default();
        tracing::warn!(node = %name, %lookup, "node is not Ready and no EC2 instance was found for it; it is kept: a name that finds nothing does not prove the machine gone");
        let note = format!(
            "Node {name} is not Ready and has no spec.providerID; no EC2 instance of this cluster was found by {lookup}. \
             It is kept: without a provider ID, a name that finds no instance does not prove the machine gone. \
             Delete the Node if its machine is gone, or start its kubelet with --provider-id."
        );
        (shared.events)
            .warning(&node.object_ref(&()), EVENT_KEEPING_NODE, note)
            .await;
    }
}

async fn apply<I: Instances>(shared: &Shared<I>, node: &Node, decision: Decision) {
    let api: Api<Node> = Api::all(shared.kube.clone());
    let name = node.name_any();
    match decision {
        Decision::Nothing | Decision::KeepUnverified | Decision::OutsideRegion(_) => {}
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
            let uid = node.metadata.uid.clone();
            let params = DeleteParams::default().preconditions(Preconditions {
                uid,
                resource_version: None,
            });
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
            patch_taints(&api, node, taints).await;
        }
        Decision::RemoveShutdownTaint => {
            let taints = taints_without(node, SHUTDOWN_TAINT).unwrap_or_default();
            tracing::info!(node = %name, "node is Ready: removing the shutdown taint");
            patch_taints(&api, node, taints).await;
        }
    }
}

/// Writes `taints` (none: the field removed) if `node` is unchanged since read.
async fn patch_taints(api: &Api<Node>, node: &Node, taints: Vec<Taint>) {
    let name = node.name_any();
    let patch = json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": if taints.is_empty() { Value::Null } else { json!(taints) }},
    });
    match super::merge_patch(api, &name, patch).await {
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
    use crate::controllers::cached_node::{NodeCondition, NodeSpec, NodeStatus};
    use crate::provider::instances::fake::{FakeInstances, instance};
    use crate::provider::{CloudError, ErrorKind};
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
        let id = Named::ProviderId;
        // Ready nodes are never checked against AWS.
        assert_eq!(decide(&node(Some("True"), &[]), Some((id, &Gone))), Nothing);
        assert_eq!(
            decide(&node(Some("True"), &[SHUTDOWN_TAINT]), None),
            RemoveShutdownTaint,
            "a Ready node is not asked about: no answer"
        );
        for not_ready in [Some("False"), Some("Unknown"), None] {
            let n = node(not_ready, &[]);
            for named in [
                Named::ProviderId,
                Named::InstanceIdName,
                Named::PrivateDnsName,
            ] {
                assert_eq!(decide(&n, Some((named, &stopped))), AddShutdownTaint);
                assert_eq!(decide(&n, Some((named, &running))), Nothing);
                let shutting_down = Exists(InstanceState::ShuttingDown);
                assert_eq!(decide(&n, Some((named, &shutting_down))), Nothing);
                assert_eq!(decide(&n, None), Nothing, "no answer is not an answer");
            }
        }
        assert_eq!(
            decide(
                &node(Some("False"), &[SHUTDOWN_TAINT]),
                Some((id, &stopped))
            ),
            Nothing,
            "already tainted"
        );
    }

    /// Only an instance proven gone deletes its Node: terminated, or an ID
    /// EC2 does not know; a name that finds nothing is kept and reported.
    #[test]
    fn only_an_instance_proven_gone_deletes_its_node() {
        use Decision::*;
        use Observation::*;
        let terminated = Exists(InstanceState::Terminated);
        let n = node(Some("False"), &[]);
        // An instance-ID name EC2 does not know is gone, as upstream since
        // PR #1474; a private DNS name that finds nothing is kept here (a
        // deliberate difference).
        for (named, gone, terminated_too) in [
            (Named::ProviderId, Delete, Delete),
            (Named::InstanceIdName, Delete, Delete),
            (Named::PrivateDnsName, KeepUnverified, KeepUnverified),
        ] {
            assert_eq!(
                decide(&n, Some((named, &Gone))),
                gone,
                "{named:?}, not found"
            );
            assert_eq!(
                decide(&n, Some((named, &terminated))),
                terminated_too,
                "{named:?}, terminated"
            );
        }
        let bare = |name: &str| Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let by_id = Lookup::ById("i-0123456789abcdef0".into());
        let by_dns = Lookup::ByPrivateDns("worker-1".into());
        assert_eq!(Named::of(&n, &by_id), Named::ProviderId);
        assert_eq!(
            Named::of(&bare("i-0123456789abcdef0"), &by_id),
            Named::InstanceIdName
        );
        assert_eq!(Named::of(&bare("worker-1"), &by_dns), Named::PrivateDnsName);
    }

    /// A Node of another Region is neither looked up nor judged, Ready or
    /// not, whatever AWS would say: no deletion, no shutdown taint added or
    /// removed.
    #[tokio::test]
    async fn a_node_of_another_region_is_not_judged() {
        let cloud = FakeInstances::new();
        let with_pid = |mut n: Node, pid: &str| {
            n.spec.get_or_insert_default().provider_id = Some(pid.into());
            n
        };
        let nodes: Vec<Arc<Node>> = [
            with_pid(node(Some("False"), &[]), "aws:///eu-west-1a/i-0eu"),
            with_pid(
                node(Some("True"), &[SHUTDOWN_TAINT]),
                "aws:///eu-west-1b/i-1eu",
            ),
            with_pid(node(None, &[]), "aws:///us-west-2-lax-1a/i-2la"),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let (decided, answered) = decisions(&cloud, "test", "us-east-1", nodes).await;
        assert!(answered);
        let regions: Vec<_> = (decided.iter())
            .map(|(_, d)| match d {
                Decision::OutsideRegion(o) => o.region.as_str(),
                other => panic!("judged: {other:?}"),
            })
            .collect();
        assert_eq!(regions, ["eu-west-1", "eu-west-1", "us-west-2"]);
        assert_eq!(cloud.calls(), Default::default(), "AWS was not asked");

        // The same NotReady Node in the CCM's own Region is judged: gone.
        let ours = with_pid(node(Some("False"), &[]), "aws:///us-east-1-bos-1a/i-0gone");
        let (decided, _) = decisions(&cloud, "test", "us-east-1", vec![Arc::new(ours)]).await;
        assert_eq!(decided[0].1, Decision::Delete);
        assert_eq!(cloud.calls().by_id, ["i-0gone"]);
    }

    /// A Node on a custom DHCP domain without providerID is judged by its
    /// name like any such Node: kept whatever AWS says, and never judged by
    /// its address (an address proves no instance gone). Once the
    /// cloud-node controller has proven its instance, it has a providerID.
    #[tokio::test]
    async fn a_custom_dhcp_node_without_provider_id_is_kept() {
        let cloud = FakeInstances::new();
        let mut gone = instance("i-gone", "10.0.1.5");
        gone.state = InstanceState::Terminated;
        cloud.add(gone);
        let mut dhcp = node(
            Some("False"),
            &[crate::controllers::node::plan::UNINITIALIZED_TAINT],
        );
        dhcp.metadata.name = Some("ip-10-0-1-5.corp.example".into());
        dhcp.spec.get_or_insert_default().provider_id = None;
        dhcp.status.get_or_insert_default().addresses =
            Some(vec![k8s_openapi::api::core::v1::NodeAddress {
                type_: "InternalIP".into(),
                address: "10.0.1.5".into(),
            }]);
        let (decided, answered) =
            decisions(&cloud, "test", "us-east-1", vec![Arc::new(dhcp)]).await;
        assert!(answered);
        assert_eq!(decided.len(), 1);
        assert_eq!(decided[0].1, Decision::KeepUnverified);
        let calls = cloud.calls();
        assert_eq!(calls.by_private_dns, ["ip-10-0-1-5.corp.example"]);
        assert!(calls.by_private_ip.is_empty(), "not judged by its address");
    }

    #[tokio::test]
    async fn absence_from_the_sweep_is_confirmed_and_errors_observe_nothing() {
        let cloud = FakeInstances::new();
        cloud.add(instance("i-tagged", "10.0.0.1"));
        let mut untagged = instance("i-untagged", "10.0.0.2");
        untagged.state = InstanceState::Stopped;
        cloud.add(untagged);
        cloud.hide_from_sweep("i-untagged");
        let mut foreign = instance("i-foreign", "10.0.0.3");
        foreign.tags.clear();
        cloud.add(foreign);
        cloud.hide_from_sweep("i-foreign");
        let keys = [
            Lookup::ById("i-tagged".into()),
            Lookup::ById("i-untagged".into()),
            Lookup::ById("i-gone".into()),
            Lookup::ByPrivateDns("ip-10-0-0-9.ec2.internal".into()),
            Lookup::ByPrivateDns("ip-10-0-0-3.ec2.internal".into()),
        ];
        let seen = observe(&cloud, "test", &keys).await.unwrap();
        assert_eq!(seen[&keys[0]], Observation::Exists(InstanceState::Running));
        assert_eq!(
            seen[&keys[1]],
            Observation::Exists(InstanceState::Stopped),
            "an untagged instance is not gone"
        );
        assert_eq!(seen[&keys[2]], Observation::Gone);
        assert_eq!(seen[&keys[3]], Observation::Gone);
        assert_eq!(
            seen[&keys[4]],
            Observation::Gone,
            "by name, another cluster's instance is no answer (as upstream)"
        );
        assert_eq!(cloud.calls().by_id, ["i-untagged", "i-gone"]);

        // A failed confirmation leaves the node out; a failed sweep observes nothing.
        let down = CloudError::new("ec2:DescribeInstances", ErrorKind::Transient, "503");
        cloud.fail_lookups(Some(down.clone()));
        let seen = observe(&cloud, "test", &keys).await.unwrap();
        assert!(!seen.contains_key(&keys[2]));
        assert_eq!(seen[&keys[0]], Observation::Exists(InstanceState::Running));
        cloud.fail_sweep(Some(down));
        assert_eq!(observe(&cloud, "test", &keys).await, None);
    }
}
