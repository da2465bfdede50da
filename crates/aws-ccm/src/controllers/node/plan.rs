//! The cloud-node controller's plans: pure functions from a Node and its
//! instance to the changes the Node needs. No I/O here; `node.rs` applies.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use crate::controllers::cached_node::Node;
use k8s_openapi::api::core::v1::{NodeAddress, Taint};
use serde_json::{Value, json};

use crate::cloud_config::IpFamily;
use crate::provider::instances::Instance;

/// The kubelet (`--cloud-provider=external`) registers nodes with this taint;
/// the cloud-node controller removes it once the node is initialized.
pub(crate) const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// The node IP(s) the kubelet was given with `--node-ip`.
pub(crate) const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

pub(crate) const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
const LABEL_REGION: &str = "topology.kubernetes.io/region";
const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";
/// `topology.k8s.aws/network-node-layer-1`, `-2`, `-3`: the network nodes
/// above the instance, top layer first (from `DescribeInstanceTopology`).
const LABEL_NETWORK_NODE_PREFIX: &str = "topology.k8s.aws/network-node-layer-";

/// The beta/GA label pairs upstream keeps in step on initialized nodes
/// (beta is the source, as in k8s.io/cloud-provider).
const LABEL_TWINS: [(&str, &str); 3] = [
    (LABEL_ZONE_BETA, LABEL_ZONE),
    (LABEL_REGION_BETA, LABEL_REGION),
    (LABEL_INSTANCE_TYPE_BETA, LABEL_INSTANCE_TYPE),
];

/// What the plans need besides the Node and the instance.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PlanContext<'a> {
    pub(crate) region: &'a str,
    pub(crate) families: &'a [IpFamily],
    /// Zone name → zone ID.
    pub(crate) zone_ids: &'a HashMap<String, String>,
}

/// A label someone else already set to another value than the instance's.
/// The zone, region and instance-type labels (each beta/GA pair judged
/// together) are `replaced` with the instance's values, as upstream's
/// cloud-node controller does; `topology.k8s.aws/zone-id` is kept, as
/// upstream adds it only when missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LabelConflict {
    pub(crate) key: String,
    pub(crate) existing: String,
    pub(crate) wanted: String,
    pub(crate) replaced: bool,
}

/// Why a node cannot be initialized from this instance.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlanError {
    #[error(
        "instance {instance} of node {node} is {state}; a node is never initialized from a \
         terminated instance (the cloud-node-lifecycle controller removes the Node once it is NotReady)"
    )]
    InstanceGone {
        node: String,
        instance: String,
        state: String,
    },
    #[error(
        "node {node} has annotation {PROVIDED_NODE_IP_ANNOTATION}={value:?} (from the kubelet's --node-ip), \
         but {reason}; instance {instance} has addresses [{available}]. Fix the kubelet's --node-ip \
         to one of the instance's addresses"
    )]
    ProvidedNodeIp {
        node: String,
        value: String,
        reason: String,
        instance: String,
        available: String,
    },
}

/// The changes that initialize one node.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct InitPlan {
    /// Set when the node has no providerID yet.
    pub(crate) provider_id: Option<String>,
    /// Labels to add (only ones the node does not have).
    pub(crate) labels: BTreeMap<String, String>,
    /// Labels left as they were because another value was already set.
    pub(crate) conflicts: Vec<LabelConflict>,
    /// The node's taints without the uninitialized taint; `None` when the
    /// taint is already gone.
    pub(crate) taints: Option<Vec<Taint>>,
    /// The new address list, when it differs from the node's.
    pub(crate) addresses: Option<Vec<NodeAddress>>,
    /// Zone whose ID was not in the zone map (the label is left out).
    pub(crate) unknown_zone: Option<String>,
}

impl InitPlan {
    /// Whether the metadata/spec patch has anything to write.
    pub(crate) fn touches_spec(&self) -> bool {
        self.provider_id.is_some() || !self.labels.is_empty() || self.taints.is_some()
    }

    /// JSON merge patch of metadata and spec (labels, providerID, taints),
    /// guarded by `resource_version`: a concurrent writer makes it fail with
    /// 409 instead of being overwritten (the taint list is replaced whole).
    pub(crate) fn spec_patch(&self, resource_version: &str) -> Value {
        let mut patch = json!({"metadata": {"resourceVersion": resource_version}});
        if !self.labels.is_empty() {
            patch["metadata"]["labels"] = json!(self.labels);
        }
        // `spec` appears with its first field.
        if let Some(id) = &self.provider_id {
            patch["spec"]["providerID"] = json!(id);
        }
        if let Some(taints) = &self.taints {
            // An empty list is removed rather than stored as [].
            patch["spec"]["taints"] = if taints.is_empty() {
                Value::Null
            } else {
                json!(taints)
            };
        }
        patch
    }

    /// JSON merge patch of the status subresource, when addresses change.
    /// Merge patch replaces the list whole: a strategic merge patch keyed
    /// by address type would mangle several addresses of one type.
    pub(crate) fn status_patch(&self) -> Option<Value> {
        self.addresses
            .as_ref()
            .map(|addresses| json!({"status": {"addresses": addresses}}))
    }
}

impl fmt::Display for InitPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(id) = &self.provider_id {
            parts.push(format!("set providerID {id}"));
        }
        for (k, v) in &self.labels {
            parts.push(format!("label {k}={v}"));
        }
        if self.taints.is_some() {
            parts.push(format!("remove taint {UNINITIALIZED_TAINT}"));
        }
        if let Some(addresses) = &self.addresses {
            parts.push(format!("addresses [{}]", format_addresses(addresses)));
        }
        if parts.is_empty() {
            f.write_str("nothing to change")
        } else {
            f.write_str(&parts.join("; "))
        }
    }
}

/// `InternalIP 10.0.0.1, Hostname ip-10-0-0-1.ec2.internal, ...`
pub(crate) fn format_addresses(addresses: &[NodeAddress]) -> String {
    addresses
        .iter()
        .map(|a| format!("{} {}", a.type_, a.address))
        .collect::<Vec<_>>()
        .join(", ")
}

fn address(type_: &str, address: impl ToString) -> NodeAddress {
    NodeAddress {
        type_: type_.to_string(),
        address: address.to_string(),
    }
}

/// The instance's addresses in the Go CCM's order, per family in the
/// configured order. IPv4: every private IPv4 of every interface by device
/// index (InternalIP), the public IPv4 (ExternalIP), the private DNS name
/// (InternalDNS and Hostname), the public DNS name (ExternalDNS). IPv6: the
/// first IPv6 address of each interface (InternalIP; AWS has no IPv6 DNS
/// names, and upstream reports even public IPv6 addresses as internal).
fn cloud_addresses(instance: &Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let mut out = Vec::new();
    for family in families {
        match family {
            IpFamily::Ipv4 => {
                for eni in &instance.network_interfaces {
                    out.extend(eni.private_ips.iter().map(|ip| address("InternalIP", ip)));
                }
                if let Some(ip) = instance.public_ip {
                    out.push(address("ExternalIP", ip));
                }
                if let Some(name) = &instance.private_dns_name {
                    out.push(address("InternalDNS", name));
                    out.push(address("Hostname", name));
                }
                if let Some(name) = &instance.public_dns_name {
                    out.push(address("ExternalDNS", name));
                }
            }
            IpFamily::Ipv6 => {
                for eni in &instance.network_interfaces {
                    if let Some(ip) = eni.ipv6_addresses.first() {
                        out.push(address("InternalIP", ip));
                    }
                }
            }
        }
    }
    out
}

/// Parses the provided-node-ip annotation as the kubelet writes it: one IP,
/// or a dual-stack pair (one of each family) separated by a comma.
pub(crate) fn parse_provided_node_ip(value: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips = Vec::new();
    for part in value.split(',') {
        match part.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip.to_canonical()),
            Err(_) => return Err(format!("{part:?} is not an IP address")),
        }
    }
    match ips.as_slice() {
        [_] => Ok(ips),
        [a, b] if a.is_ipv4() == b.is_ipv4() => {
            Err("it must be a single IP or a dual-stack pair of IPs".into())
        }
        [a, b] if a.is_unspecified() || b.is_unspecified() => {
            Err("a dual-stack node IP cannot include 0.0.0.0 or ::".into())
        }
        [_, _] => Ok(ips),
        _ => Err("it must be a single IP or a dual-stack pair of IPs".into()),
    }
}

fn ip_of(address: &NodeAddress) -> Option<IpAddr> {
    address
        .address
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical())
}

/// k8s.io/cloud-provider's rule for the kubelet's `--node-ip`: each given IP
/// must be among the cloud's addresses; for every address type a given IP
/// has (usually InternalIP), the given IPs become the only addresses of that
/// type, listed first in the annotation's order; every address of the other
/// types follows in the cloud's order.
fn apply_provided_node_ip(value: &str, cloud: &[NodeAddress]) -> Result<Vec<NodeAddress>, String> {
    let node_ips = parse_provided_node_ip(value)?;
    let mut enforced = Vec::new();
    let mut types = Vec::new();
    for ip in &node_ips {
        let matching: Vec<&NodeAddress> = cloud.iter().filter(|a| ip_of(a) == Some(*ip)).collect();
        if matching.is_empty() {
            return Err(format!("{ip} is not one of the instance's addresses"));
        }
        for a in matching {
            enforced.push(a.clone());
            if !types.contains(&a.type_) {
                types.push(a.type_.clone());
            }
        }
    }
    enforced.extend(cloud.iter().filter(|a| !types.contains(&a.type_)).cloned());
    Ok(enforced)
}

fn node_name(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

fn current_addresses(node: &Node) -> &[NodeAddress] {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
}

/// The addresses the node should have: the cloud's, keeping the kubelet's
/// Hostname when the cloud has none, filtered by the provided node IP.
fn desired_addresses(
    node: &Node,
    instance: &Instance,
    families: &[IpFamily],
) -> Result<Vec<NodeAddress>, PlanError> {
    let mut addresses = cloud_addresses(instance, families);
    if !addresses.iter().any(|a| a.type_ == "Hostname") {
        addresses.extend(
            current_addresses(node)
                .iter()
                .filter(|a| a.type_ == "Hostname")
                .cloned(),
        );
    }
    let provided = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROVIDED_NODE_IP_ANNOTATION));
    match provided {
        None => Ok(addresses),
        Some(value) => {
            apply_provided_node_ip(value, &addresses).map_err(|reason| PlanError::ProvidedNodeIp {
                node: node_name(node),
                value: value.clone(),
                reason,
                instance: instance.id.clone(),
                available: format_addresses(&addresses),
            })
        }
    }
}

/// The new address list, or `None` when the node already has exactly it
/// (same addresses, same order) or the cloud reports none.
pub(crate) fn address_change(
    node: &Node,
    instance: &Instance,
    families: &[IpFamily],
) -> Result<Option<Vec<NodeAddress>>, PlanError> {
    let desired = desired_addresses(node, instance, families)?;
    if desired.is_empty() || desired.as_slice() == current_addresses(node) {
        return Ok(None);
    }
    Ok(Some(desired))
}

pub(crate) fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// Whether the node still waits for the cloud-node controller.
pub(crate) fn is_uninitialized(node: &Node) -> bool {
    has_taint(node, UNINITIALIZED_TAINT)
}

/// The node's taints without `key`; `None` when it has no such taint.
pub(crate) fn taints_without(node: &Node, key: &str) -> Option<Vec<Taint>> {
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    let others = taints.iter().filter(|t| t.key != key);
    taints
        .iter()
        .any(|t| t.key == key)
        .then(|| others.cloned().collect())
}

/// Adds `key=value` to `plan` unless the node has it. A different existing
/// value is reported, and replaced when `replace` (else kept).
fn want_label(
    node: &Node,
    (key, value): (&str, &str),
    replace: bool,
    labels: &mut BTreeMap<String, String>,
    conflicts: &mut Vec<LabelConflict>,
) {
    match node.metadata.labels.as_ref().and_then(|l| l.get(key)) {
        Some(existing) if existing == value => return,
        Some(existing) => conflicts.push(LabelConflict {
            key: key.to_string(),
            existing: existing.clone(),
            wanted: value.to_string(),
            replaced: replace,
        }),
        None => {}
    }
    if replace || !conflicts.iter().any(|c| c.key == key) {
        labels.insert(key.to_string(), value.to_string());
    }
}

/// Everything that initializes `node` from `instance`: providerID, labels,
/// addresses, and the removal of the uninitialized taint.
pub(crate) fn plan_initialization(
    node: &Node,
    instance: &Instance,
    cx: &PlanContext<'_>,
) -> Result<InitPlan, PlanError> {
    if instance.state.is_terminated() {
        return Err(PlanError::InstanceGone {
            node: node_name(node),
            instance: instance.id.clone(),
            state: instance.state.to_string(),
        });
    }
    // Checked before anything is written, as upstream: a node whose
    // --node-ip matches nothing stays tainted.
    let addresses = address_change(node, instance, cx.families)?;

    let provider_id = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
        .is_none()
        .then(|| instance.provider_id());

    let mut labels = BTreeMap::new();
    let mut conflicts = Vec::new();
    // Upstream's cloud-node controller sets both labels of each pair from
    // the instance, over any value already there: the pair never disagrees.
    let (l, c) = (&mut labels, &mut conflicts);
    if let Some(instance_type) = &instance.instance_type {
        for key in [LABEL_INSTANCE_TYPE, LABEL_INSTANCE_TYPE_BETA] {
            want_label(node, (key, instance_type), true, l, c);
        }
    }
    let mut unknown_zone = None;
    if let Some(zone) = &instance.availability_zone {
        for key in [LABEL_ZONE, LABEL_ZONE_BETA] {
            want_label(node, (key, zone), true, l, c);
        }
        match cx.zone_ids.get(&**zone) {
            Some(zone_id) => want_label(node, (LABEL_ZONE_ID, zone_id), false, l, c),
            None => unknown_zone = Some(zone.to_string()),
        }
    }
    if !cx.region.is_empty() {
        for key in [LABEL_REGION, LABEL_REGION_BETA] {
            want_label(node, (key, cx.region), true, l, c);
        }
    }

    Ok(InitPlan {
        provider_id,
        labels,
        conflicts,
        taints: taints_without(node, UNINITIALIZED_TAINT),
        addresses,
        unknown_zone,
    })
}

/// Upstream's rule: a node with `topology.k8s.aws/network-node-layer-1`
/// keeps its network-node labels as they are and its instance is not asked.
pub(crate) fn wants_network_nodes(node: &Node) -> bool {
    let first = format!("{LABEL_NETWORK_NODE_PREFIX}1");
    !node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(&first))
}

/// The network-node labels to write: one per layer, `-1` the top one, set
/// over any value already there (as upstream's cloud-node controller
/// applies them), none when the node [keeps its own](wants_network_nodes).
pub(crate) fn network_node_labels(
    node: &Node,
    network_nodes: &[String],
) -> BTreeMap<String, String> {
    if !wants_network_nodes(node) {
        return BTreeMap::new();
    }
    let current = node.metadata.labels.as_ref();
    network_nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (format!("{LABEL_NETWORK_NODE_PREFIX}{}", i + 1), n))
        .filter(|(key, n)| current.and_then(|l| l.get(key)) != Some(*n))
        .map(|(key, n)| (key, n.clone()))
        .collect()
}

/// For an initialized node: the GA labels missing next to their beta twin
/// or disagreeing with it, set to the beta value (k8s.io/cloud-provider's
/// label reconciliation: the beta label is the source of truth).
pub(crate) fn plan_label_twins(node: &Node) -> BTreeMap<String, String> {
    let Some(labels) = node.metadata.labels.as_ref() else {
        return BTreeMap::new();
    };
    LABEL_TWINS
        .iter()
        .filter_map(|(primary, secondary)| {
            let value = labels.get(*primary)?;
            (labels.get(*secondary) != Some(value)).then(|| (secondary.to_string(), value.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::{NodeSpec, NodeStatus};
    use crate::provider::instances::{InstanceState, NetworkInterface, fake};
    use kube::api::ObjectMeta;
    use pretty_assertions::assert_eq;

    impl InitPlan {
        /// True when applying the plan would write nothing.
        fn is_empty(&self) -> bool {
            self.provider_id.is_none()
                && self.labels.is_empty()
                && self.taints.is_none()
                && self.addresses.is_none()
        }
    }

    fn a(type_: &str, addr: &str) -> NodeAddress {
        address(type_, addr)
    }

    fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            value: Some("true".into()),
            ..Default::default()
        }
    }

    fn tainted_node(name: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![taint(UNINITIALIZED_TAINT), taint("dedicated")]),
                ..Default::default()
            }),
            status: Some(NodeStatus::default()),
        }
    }

    /// Two interfaces (given out of order), a secondary private IP, IPv6 and
    /// public addresses.
    fn rich_instance() -> Instance {
        let mut i = fake::instance("i-0123456789abcdef0", "10.0.1.10");
        i.public_ip = Some("54.1.2.3".parse().unwrap());
        i.public_dns_name = Some("ec2-54-1-2-3.compute-1.amazonaws.com".into());
        i.network_interfaces[0]
            .private_ips
            .push("10.0.1.11".parse().unwrap());
        i.network_interfaces[0].ipv6_addresses = vec![
            "2600:1f18::10".parse().unwrap(),
            "2600:1f18::11".parse().unwrap(),
        ];
        i.network_interfaces.push(NetworkInterface {
            device_index: Some(1),
            private_ips: vec!["10.0.2.20".parse().unwrap()],
            ipv6_addresses: vec!["2600:1f18::20".parse().unwrap()],
            public_ip: None,
        });
        i
    }

    #[test]
    fn ipv4_addresses_follow_the_go_ccm_order() {
        assert_eq!(
            cloud_addresses(&rich_instance(), &[IpFamily::Ipv4]),
            vec![
                a("InternalIP", "10.0.1.10"),
                a("InternalIP", "10.0.1.11"),
                a("InternalIP", "10.0.2.20"),
                a("ExternalIP", "54.1.2.3"),
                a("InternalDNS", "ip-10-0-1-10.ec2.internal"),
                a("Hostname", "ip-10-0-1-10.ec2.internal"),
                a("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ]
        );
    }

    #[test]
    fn families_come_in_the_configured_order_with_one_ipv6_per_interface() {
        let i = rich_instance();
        assert_eq!(
            cloud_addresses(&i, &[IpFamily::Ipv6, IpFamily::Ipv4])[..3],
            [
                a("InternalIP", "2600:1f18::10"),
                a("InternalIP", "2600:1f18::20"),
                a("InternalIP", "10.0.1.10"),
            ]
        );
        let v4_first = cloud_addresses(&i, &[IpFamily::Ipv4, IpFamily::Ipv6]);
        assert_eq!(
            v4_first[v4_first.len() - 2..],
            [
                a("InternalIP", "2600:1f18::10"),
                a("InternalIP", "2600:1f18::20")
            ]
        );
        assert!(
            cloud_addresses(&i, &[IpFamily::Ipv6])
                .iter()
                .all(|a| a.type_ == "InternalIP")
        );
    }

    #[test]
    fn provided_node_ip_becomes_the_only_address_of_its_type() {
        let cloud = cloud_addresses(&rich_instance(), &[IpFamily::Ipv4, IpFamily::Ipv6]);
        assert_eq!(
            apply_provided_node_ip("10.0.2.20", &cloud).unwrap(),
            vec![
                a("InternalIP", "10.0.2.20"),
                a("ExternalIP", "54.1.2.3"),
                a("InternalDNS", "ip-10-0-1-10.ec2.internal"),
                a("Hostname", "ip-10-0-1-10.ec2.internal"),
                a("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ]
        );
        // A dual-stack pair keeps the annotation's order.
        assert_eq!(
            apply_provided_node_ip("2600:1f18::20,10.0.1.10", &cloud).unwrap()[..2],
            [
                a("InternalIP", "2600:1f18::20"),
                a("InternalIP", "10.0.1.10")
            ]
        );
        // The public IP is an ExternalIP: only that type is narrowed.
        let external = apply_provided_node_ip("54.1.2.3", &cloud).unwrap();
        assert_eq!(external[0], a("ExternalIP", "54.1.2.3"));
        assert_eq!(
            external.iter().filter(|a| a.type_ == "InternalIP").count(),
            5
        );
    }

    #[test]
    fn bad_provided_node_ips_are_errors() {
        let cloud = cloud_addresses(&rich_instance(), &[IpFamily::Ipv4]);
        for (value, want) in [
            ("10.9.9.9", "not one of the instance's addresses"),
            ("banana", "not an IP address"),
            ("10.0.1.10,10.0.1.11", "dual-stack pair"),
            ("10.0.1.10,2600:1f18::10,10.0.1.11", "dual-stack pair"),
            ("0.0.0.0,::1", "cannot include"),
            (" 10.0.1.10", "not an IP address"),
        ] {
            let err = apply_provided_node_ip(value, &cloud).unwrap_err();
            assert!(err.contains(want), "{value:?}: {err}");
        }
    }

    fn cx<'a>(zones: &'a HashMap<String, String>, families: &'a [IpFamily]) -> PlanContext<'a> {
        PlanContext {
            region: "us-east-1",
            families,
            zone_ids: zones,
        }
    }

    fn zones() -> HashMap<String, String> {
        HashMap::from([("us-east-1a".to_string(), "use1-az6".to_string())])
    }

    #[test]
    fn initialization_plan_sets_everything_once() {
        let node = tainted_node("ip-10-0-1-10.ec2.internal");
        let zones = zones();
        let plan =
            plan_initialization(&node, &rich_instance(), &cx(&zones, &[IpFamily::Ipv4])).unwrap();
        assert_eq!(
            plan.provider_id.as_deref(),
            Some("aws:///us-east-1a/i-0123456789abcdef0")
        );
        assert_eq!(
            plan.labels,
            BTreeMap::from(
                [
                    (LABEL_INSTANCE_TYPE, "m5.large"),
                    (LABEL_INSTANCE_TYPE_BETA, "m5.large"),
                    (LABEL_ZONE, "us-east-1a"),
                    (LABEL_ZONE_BETA, "us-east-1a"),
                    (LABEL_ZONE_ID, "use1-az6"),
                    (LABEL_REGION, "us-east-1"),
                    (LABEL_REGION_BETA, "us-east-1"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
            )
        );
        assert!(plan.conflicts.is_empty());
        assert_eq!(plan.taints, Some(vec![taint("dedicated")]));
        assert_eq!(plan.addresses.as_ref().map(Vec::len), Some(7));
        assert_eq!(plan.unknown_zone, None);

        let patch = plan.spec_patch("7");
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(
            patch["spec"]["providerID"],
            "aws:///us-east-1a/i-0123456789abcdef0"
        );
        assert_eq!(patch["spec"]["taints"][0]["key"], "dedicated");
        assert_eq!(
            patch["metadata"]["labels"][LABEL_ZONE_ID],
            json!("use1-az6")
        );
        let status = plan.status_patch().unwrap();
        assert_eq!(status["status"]["addresses"][0]["type"], "InternalIP");
        assert_eq!(status["status"]["addresses"][0]["address"], "10.0.1.10");
    }

    #[test]
    fn an_initialized_node_yields_an_empty_plan() {
        let zones = zones();
        let instance = rich_instance();
        let cx = cx(&zones, &[IpFamily::Ipv4]);
        let mut node = tainted_node("n");
        let plan = plan_initialization(&node, &instance, &cx).unwrap();
        // Apply the plan to the node by hand.
        node.spec.as_mut().unwrap().provider_id = plan.provider_id.clone();
        node.spec.as_mut().unwrap().taints = plan.taints.clone();
        node.metadata.labels = Some(plan.labels.clone());
        node.status.as_mut().unwrap().addresses = plan.addresses.clone();
        let again = plan_initialization(&node, &instance, &cx).unwrap();
        assert!(again.is_empty(), "{again}");
        assert_eq!(again.to_string(), "nothing to change");
        assert!(plan_label_twins(&node).is_empty());
    }

    #[test]
    fn preset_zone_region_and_type_labels_are_replaced_as_a_pair_zone_id_kept() {
        let zones = zones();
        let mut node = tainted_node("n");
        node.metadata.labels = Some(BTreeMap::from([
            (LABEL_ZONE.to_string(), "us-east-1z".to_string()),
            (LABEL_INSTANCE_TYPE.to_string(), "m5.large".to_string()),
            (LABEL_ZONE_ID.to_string(), "custom".to_string()),
        ]));
        let plan =
            plan_initialization(&node, &rich_instance(), &cx(&zones, &[IpFamily::Ipv4])).unwrap();
        // Both zone labels from the instance: the pair never disagrees.
        assert_eq!(plan.labels[LABEL_ZONE], "us-east-1a");
        assert_eq!(plan.labels[LABEL_ZONE_BETA], "us-east-1a");
        assert!(!plan.labels.contains_key(LABEL_ZONE_ID));
        assert!(
            !plan.labels.contains_key(LABEL_INSTANCE_TYPE),
            "same value: no write"
        );
        assert_eq!(
            plan.conflicts,
            vec![
                LabelConflict {
                    key: LABEL_ZONE.into(),
                    existing: "us-east-1z".into(),
                    wanted: "us-east-1a".into(),
                    replaced: true,
                },
                LabelConflict {
                    key: LABEL_ZONE_ID.into(),
                    existing: "custom".into(),
                    wanted: "use1-az6".into(),
                    replaced: false,
                },
            ]
        );
        // A conflict does not hold the node back.
        assert!(plan.taints.is_some());
        // A wrong beta label alone: replaced too.
        node.metadata.labels = Some(BTreeMap::from([(
            LABEL_ZONE_BETA.to_string(),
            "us-east-1z".to_string(),
        )]));
        let plan =
            plan_initialization(&node, &rich_instance(), &cx(&zones, &[IpFamily::Ipv4])).unwrap();
        assert_eq!(plan.labels[LABEL_ZONE], "us-east-1a");
        assert_eq!(plan.labels[LABEL_ZONE_BETA], "us-east-1a");
    }

    #[test]
    fn a_preset_provider_id_is_never_rewritten() {
        let zones = zones();
        let mut node = tainted_node("worker-1.corp.example");
        node.spec.as_mut().unwrap().provider_id = Some("aws:////i-0123456789abcdef0".into());
        let plan =
            plan_initialization(&node, &rich_instance(), &cx(&zones, &[IpFamily::Ipv4])).unwrap();
        assert_eq!(plan.provider_id, None);
        assert!(plan.spec_patch("1")["spec"].get("providerID").is_none());
    }

    #[test]
    fn terminated_instances_and_bad_node_ips_keep_the_taint() {
        let zones = zones();
        let cx = cx(&zones, &[IpFamily::Ipv4]);
        let node = tainted_node("n");
        let mut gone = rich_instance();
        gone.state = InstanceState::Terminated;
        assert!(matches!(
            plan_initialization(&node, &gone, &cx),
            Err(PlanError::InstanceGone { .. })
        ));
        let mut node = tainted_node("n");
        node.metadata.annotations = Some(BTreeMap::from([(
            PROVIDED_NODE_IP_ANNOTATION.to_string(),
            "10.9.9.9".to_string(),
        )]));
        let err = plan_initialization(&node, &rich_instance(), &cx).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("10.9.9.9") && text.contains("--node-ip"),
            "{text}"
        );
    }

    #[test]
    fn unknown_zone_ids_leave_the_label_out_and_say_so() {
        let none = HashMap::new();
        let plan = plan_initialization(
            &tainted_node("n"),
            &rich_instance(),
            &cx(&none, &[IpFamily::Ipv4]),
        )
        .unwrap();
        assert!(!plan.labels.contains_key(LABEL_ZONE_ID));
        assert_eq!(plan.unknown_zone.as_deref(), Some("us-east-1a"));
    }

    #[test]
    fn the_kubelet_hostname_is_kept_when_the_cloud_has_none() {
        let mut instance = rich_instance();
        instance.private_dns_name = None;
        let mut node = tainted_node("n");
        node.status.as_mut().unwrap().addresses = Some(vec![a("Hostname", "my-host")]);
        let addresses = desired_addresses(&node, &instance, &[IpFamily::Ipv4]).unwrap();
        assert_eq!(addresses.last(), Some(&a("Hostname", "my-host")));
    }

    #[test]
    fn address_changes_are_detected_by_content_and_order() {
        let instance = rich_instance();
        let mut node = tainted_node("n");
        let desired = desired_addresses(&node, &instance, &[IpFamily::Ipv4]).unwrap();
        node.status.as_mut().unwrap().addresses = Some(desired.clone());
        assert_eq!(
            address_change(&node, &instance, &[IpFamily::Ipv4]),
            Ok(None)
        );
        let mut reordered = desired.clone();
        reordered.swap(0, 1);
        node.status.as_mut().unwrap().addresses = Some(reordered);
        assert_eq!(
            address_change(&node, &instance, &[IpFamily::Ipv4]),
            Ok(Some(desired))
        );
    }

    #[test]
    fn label_twins_follow_the_beta_label() {
        let mut node = tainted_node("n");
        node.metadata.labels = Some(BTreeMap::from([
            (LABEL_ZONE_BETA.to_string(), "us-east-1a".to_string()),
            (LABEL_REGION_BETA.to_string(), "us-east-1".to_string()),
            (LABEL_REGION.to_string(), "elsewhere".to_string()),
        ]));
        // Missing GA zone filled in, disagreeing GA region overwritten.
        assert_eq!(
            plan_label_twins(&node),
            BTreeMap::from([
                (LABEL_ZONE.to_string(), "us-east-1a".to_string()),
                (LABEL_REGION.to_string(), "us-east-1".to_string()),
            ])
        );
    }

    #[test]
    fn network_node_labels_are_added_unless_layer_one_is_there() {
        let zones = zones();
        let cx = cx(&zones, &[IpFamily::Ipv4]);
        let nodes = ["nn-a".to_string(), "nn-b".to_string(), "nn-c".to_string()];
        let mut node = tainted_node("n");
        let want: BTreeMap<String, String> = (nodes.iter().enumerate())
            .map(|(i, n)| (format!("{LABEL_NETWORK_NODE_PREFIX}{}", i + 1), n.clone()))
            .collect();
        assert_eq!(network_node_labels(&node, &nodes), want);
        // A lower layer someone set differently is overwritten, as upstream.
        node.metadata.labels = Some(BTreeMap::from([(
            format!("{LABEL_NETWORK_NODE_PREFIX}2"),
            "old".to_string(),
        )]));
        assert!(wants_network_nodes(&node));
        assert_eq!(
            network_node_labels(&node, &nodes),
            BTreeMap::from([
                (format!("{LABEL_NETWORK_NODE_PREFIX}1"), "nn-a".to_string()),
                (format!("{LABEL_NETWORK_NODE_PREFIX}2"), "nn-b".to_string()),
                (format!("{LABEL_NETWORK_NODE_PREFIX}3"), "nn-c".to_string()),
            ])
        );
        // With layer 1 present, every layer label is kept as it is.
        node.metadata.labels = Some(BTreeMap::from([(
            format!("{LABEL_NETWORK_NODE_PREFIX}1"),
            "mine".to_string(),
        )]));
        assert!(!wants_network_nodes(&node));
        assert!(network_node_labels(&node, &nodes).is_empty());
        // The initializing write never waits for them: they come later.
        let plan = plan_initialization(&tainted_node("n"), &rich_instance(), &cx).unwrap();
        assert!(
            !plan
                .labels
                .keys()
                .any(|k| k.starts_with(LABEL_NETWORK_NODE_PREFIX))
        );
        // No network nodes known: no labels.
        assert!(network_node_labels(&tainted_node("m"), &[]).is_empty());
    }
}
