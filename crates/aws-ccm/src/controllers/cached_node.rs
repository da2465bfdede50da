//! The Node the controllers cache and read.
//!
//! k8s-openapi's `Node` lays every status field out inline (nodeInfo,
//! config sources, capacity maps, ...): about 1.5 KB per object before a
//! single string, even with the status emptied. At 5,000 nodes that was
//! 8 MB of the cache. This `Node` has the same metadata and only the spec
//! and status fields a controller reads, so the rest is skipped while the
//! apiserver's JSON is decoded rather than built and then dropped. Every
//! Node write is a patch of named fields, so nothing left out is ever
//! written back.

use k8s_openapi::api::core::v1::{NodeAddress, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::ListParams;
use serde::{Deserialize, Serialize};

use crate::controllers::route::NETWORK_UNAVAILABLE;
use crate::controllers::route::publish::written_by_routes;

/// Every Node, listed from the API server (a consistent read) in pages of
/// 500, each page handed to `each` before the next is read (so a caller
/// that keeps less than the Nodes holds one page at a time): node IPAM's
/// start and `aws-ccm doctor`.
pub(crate) async fn list_all(api: &Api<Node>, mut each: impl FnMut(Vec<Node>)) -> kube::Result<()> {
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        each(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// A core/v1 Node with the status a controller reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<NodeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<NodeStatus>,
}

/// The spec fields a controller reads: the provider ID (node, routes, load
/// balancers, tagging), pod CIDRs (routes, node IPAM) and taints. The
/// deprecated `configSource` and `externalID`, and `unschedulable`, are
/// skipped: k8s-openapi's `NodeSpec` is 272 bytes inline, this one 96.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeSpec {
    #[serde(default, rename = "podCIDR", skip_serializing_if = "Option::is_none")]
    pub pod_cidr: Option<String>,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Option::is_none")]
    pub pod_cidrs: Option<Vec<String>>,
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) taints: Option<Vec<Taint>>,
}

/// The status fields a controller reads: addresses (node, route and load
/// balancer controllers) and conditions (node lifecycle, routes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "DecodedStatus")]
pub(crate) struct NodeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) addresses: Option<Vec<NodeAddress>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) conditions: Option<Vec<NodeCondition>>,
    /// Whether `NetworkUnavailable` has the reason the route controller
    /// writes with its status ([`written_by_routes`]): all the route
    /// controller compares of a reason, as upstream's
    /// `updateNetworkingCondition`. A flag of the status rather than a
    /// reason in each condition: 8 bytes a Node instead of 24 a condition.
    #[serde(skip)]
    pub(crate) network_reason_is_routes: bool,
}

/// A status as decoded, before the reasons are dropped.
#[derive(Deserialize)]
struct DecodedStatus {
    #[serde(default)]
    addresses: Option<Vec<NodeAddress>>,
    #[serde(default)]
    conditions: Option<Vec<DecodedCondition>>,
}

#[derive(Deserialize)]
struct DecodedCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
}

impl From<DecodedStatus> for NodeStatus {
    fn from(status: DecodedStatus) -> NodeStatus {
        let network_reason_is_routes = (status.conditions.iter().flatten())
            .find(|c| c.type_ == NETWORK_UNAVAILABLE)
            .is_some_and(|c| written_by_routes(&c.status, c.reason.as_deref()));
        let conditions = status.conditions.map(|all| {
            all.into_iter()
                .map(|c| NodeCondition {
                    type_: c.type_,
                    status: c.status,
                })
                .collect()
        });
        NodeStatus {
            addresses: status.addresses,
            conditions,
            network_reason_is_routes,
        }
    }
}

/// A node condition as a controller reads it: its type and status. The
/// reason, message and two timestamps (about 150 bytes a condition) are
/// dropped as the JSON is decoded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeCondition {
    #[serde(rename = "type")]
    pub(crate) type_: String,
    pub(crate) status: String,
}

/// kube's `Resource` comes with these, from the same constants as
/// k8s-openapi's Node.
impl k8s_openapi::Resource for Node {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Node";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "nodes";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for Node {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    /// The same resource as k8s-openapi's Node (URL, kind, references), and
    /// a kubelet-written Node decodes with only the kept status.
    #[test]
    fn is_the_core_v1_node_resource_and_decodes_a_full_node() {
        type Full = k8s_openapi::api::core::v1::Node;
        assert_eq!(Node::url_path(&(), None), Full::url_path(&(), None));
        assert_eq!(Node::api_version(&()), Full::api_version(&()));
        assert_eq!(Node::kind(&()), Full::kind(&()));
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u1", "labels": {"a": "b"}},
            "spec": {"providerID": "aws:///us-east-1a/i-1", "taints": [{"key": "k", "effect": "NoSchedule"}],
                     "podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24", "fd00:1::/64"],
                     "unschedulable": true, "externalID": "i-1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": "2026-11-22T00:00:00Z"}],
                       "images": [{"names": ["x"], "sizeBytes": 1}],
                       "nodeInfo": {"kubeletVersion": "v1.31.0", "architecture": "amd64", "bootID": "",
                                    "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "",
                                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""},
                       "capacity": {"cpu": "2"}},
        });
        let full: Full = serde_json::from_value(json.clone()).expect("a valid Node");
        let node: Node = serde_json::from_value(json).expect("decodes");
        assert_eq!(node.metadata, full.metadata);
        let spec = node.spec.clone().expect("spec");
        let full_spec = full.spec.clone().expect("spec");
        assert_eq!(spec.pod_cidr, full_spec.pod_cidr);
        assert_eq!(spec.pod_cidrs, full_spec.pod_cidrs);
        assert_eq!(spec.provider_id, full_spec.provider_id);
        assert_eq!(spec.taints, full_spec.taints);
        let status = node.status.clone().expect("status");
        let full_status = full.status.clone().expect("status");
        assert_eq!(status.addresses, full_status.addresses);
        // The type and status of each condition, in order.
        let ours: Vec<(&str, &str)> = (status.conditions.iter().flatten())
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        let theirs: Vec<(&str, &str)> = (full_status.conditions.iter().flatten())
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(ours, theirs);
        assert_eq!(ours, [("Ready", "True")]);
        assert_eq!(node.object_ref(&()), full.object_ref(&()));
        assert!(
            std::mem::size_of::<Node>() * 2 < std::mem::size_of::<Full>(),
            "{} vs {} bytes",
            std::mem::size_of::<Node>(),
            std::mem::size_of::<Full>()
        );
    }

    #[test]
    fn notes_whether_network_unavailable_has_the_route_controllers_reason() {
        let with = |status: &str, reason: &str| -> bool {
            let status: NodeStatus = serde_json::from_value(serde_json::json!({"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "NetworkUnavailable", "status": status, "reason": reason,
                 "message": "m", "lastTransitionTime": "2026-11-22T00:00:00Z"},
            ]}))
            .expect("decodes");
            status.network_reason_is_routes
        };
        assert!(with("False", "RouteCreated"));
        assert!(with("True", "NoRouteCreated"));
        assert!(!with("False", "CalicoIsUp"));
        assert!(!with("True", "RouteCreated"));
        assert!(!with("False", "NoRouteCreated"));
        assert!(!with("Unknown", "RouteCreated"));
        let without: NodeStatus =
            serde_json::from_value(serde_json::json!({"conditions": []})).expect("decodes");
        assert!(!without.network_reason_is_routes);
    }
}
