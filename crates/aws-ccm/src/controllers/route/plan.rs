//! The route plan: a pure function from the nodes and the route tables (and
//! what AWS says about the nodes' instances) to the list of changes.
//!
//! What it guarantees:
//! - every node with pod CIDRs and an instance gets a route per pod CIDR in
//!   every selected table, after its instance's source/destination check is
//!   turned off (once, and only when it is still on);
//! - a blackhole for a node's CIDR, or an in-range route to another instance,
//!   is replaced in place (one call, no window without a route);
//! - routes to instances inside the cluster CIDRs that point to no node's
//!   instance for that CIDR, or are blackholes, are deleted;
//! - a route outside the cluster CIDRs, a local route, a gateway route, a
//!   route to a bare network interface, or a propagated route is never
//!   changed: when it is in a node's way, the node is reported instead;
//!   nor is a blackhole that points at no instance deleted (it is not one
//!   this controller made; one in a node's way is replaced);
//! - an unchanged cluster yields an empty plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use ipnet::IpNet;

use crate::options::cidrs::ClusterCidrs;
use crate::provider::routes::{Route, RouteTable, RouteTarget, TargetInstance};

/// What the plan needs to know about a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NodeRoutes {
    pub(crate) name: String,
    /// From `spec.providerID`; `None` when absent or not an EC2 instance.
    pub(crate) instance_id: Option<String>,
    /// `spec.podCIDRs` (or `spec.podCIDR`), parsed.
    pub(crate) pod_cidrs: Vec<IpNet>,
}

/// Why a route is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeleteReason {
    /// Its target is gone (AWS state `blackhole`).
    Blackhole,
    /// It points to an instance no node runs on.
    NoSuchNode,
    /// It points to a node's instance, but that node's pod CIDRs do not
    /// include this destination (the node's CIDR changed, or a leftover).
    NotTheNodesCidr,
}

impl fmt::Display for DeleteReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeleteReason::Blackhole => "blackhole",
            DeleteReason::NoSuchNode => "no node runs on its target instance",
            DeleteReason::NotTheNodesCidr => "not a pod CIDR of the node on its target instance",
        })
    }
}

/// One change to make in AWS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum RouteChange {
    DisableSourceDestCheck {
        node: String,
        instance_id: String,
    },
    Create {
        node: String,
        table_id: String,
        destination: IpNet,
        instance_id: String,
    },
    /// Points an existing route at the node's instance.
    Replace {
        node: String,
        table_id: String,
        destination: IpNet,
        instance_id: String,
        previous: RouteTarget,
        was_blackhole: bool,
    },
    Delete {
        table_id: String,
        destination: IpNet,
        target: RouteTarget,
        reason: DeleteReason,
    },
}

impl RouteChange {
    /// The node the change is made for, if any.
    pub(crate) fn node(&self) -> Option<&str> {
        match self {
            RouteChange::DisableSourceDestCheck { node, .. }
            | RouteChange::Create { node, .. }
            | RouteChange::Replace { node, .. } => Some(node),
            RouteChange::Delete { .. } => None,
        }
    }

    /// The route the change writes: (table, destination, and for a Create
    /// or Replace the node's instance it points at); `None` for a
    /// source/destination change.
    pub(crate) fn route(&self) -> Option<(&str, IpNet, Option<&str>)> {
        match self {
            RouteChange::Create {
                table_id,
                destination,
                instance_id,
                ..
            }
            | RouteChange::Replace {
                table_id,
                destination,
                instance_id,
                ..
            } => Some((table_id, *destination, Some(instance_id))),
            RouteChange::Delete {
                table_id,
                destination,
                ..
            } => Some((table_id, *destination, None)),
            RouteChange::DisableSourceDestCheck { .. } => None,
        }
    }

    /// Metric label.
    pub(crate) fn action(&self) -> &'static str {
        match self {
            RouteChange::DisableSourceDestCheck { .. } => "disable_source_dest_check",
            RouteChange::Create { .. } => "create",
            RouteChange::Replace { .. } => "replace",
            RouteChange::Delete { .. } => "delete",
        }
    }
}

impl fmt::Display for RouteChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteChange::DisableSourceDestCheck { node, instance_id } => {
                write!(
                    f,
                    "disable source/destination check on {instance_id} (node {node})"
                )
            }
            RouteChange::Create {
                node,
                table_id,
                destination,
                instance_id,
            } => write!(
                f,
                "create {table_id}: {destination} -> {instance_id} (node {node})"
            ),
            RouteChange::Replace {
                node,
                table_id,
                destination,
                instance_id,
                previous,
                was_blackhole,
            } => write!(
                f,
                "replace {table_id}: {destination} -> {instance_id} (node {node}), was {previous}{}",
                if *was_blackhole { " (blackhole)" } else { "" }
            ),
            RouteChange::Delete {
                table_id,
                destination,
                target,
                reason,
            } => write!(f, "delete {table_id}: {destination} -> {target} ({reason})"),
        }
    }
}

/// Why a node cannot have its routes; the node's `NetworkUnavailable`
/// condition says so and nothing is sent to AWS for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Blocker {
    /// No `spec.providerID` naming an EC2 instance (yet).
    NoInstance,
    /// AWS does not know the instance.
    InstanceNotFound(String),
    InstanceTerminated(String),
    /// Another node (first by name) has the same pod CIDR.
    DuplicateCidr {
        cidr: IpNet,
        other_node: String,
    },
    /// Another route for the node's CIDR is in the way and is not ours to change.
    Conflict {
        table_id: String,
        destination: IpNet,
        target: RouteTarget,
        why: &'static str,
    },
}

impl fmt::Display for Blocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocker::NoInstance => f.write_str(
                "the node has no spec.providerID naming an EC2 instance yet (the cloud-node controller sets it)",
            ),
            Blocker::InstanceNotFound(id) => write!(f, "EC2 instance {id} was not found"),
            Blocker::InstanceTerminated(id) => write!(f, "EC2 instance {id} is terminated"),
            Blocker::DuplicateCidr { cidr, other_node } => write!(
                f,
                "pod CIDR {cidr} is also node {other_node}'s; only {other_node} is routed until one of them changes"
            ),
            Blocker::Conflict {
                table_id,
                destination,
                target,
                why,
            } => write!(
                f,
                "route table {table_id} already routes {destination} to {target}, which this controller does not \
                 change ({why}); remove that route or fix the node's pod CIDR"
            ),
        }
    }
}

/// What the plan expects for one node with pod CIDRs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeOutcome {
    /// Indices into [`Plan::changes`] that must all succeed.
    pub(crate) changes: Vec<usize>,
    /// Reasons the node cannot be routed; empty when it can.
    pub(crate) blockers: Vec<Blocker>,
}

/// The plan of one reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Source/destination changes first, then route changes.
    pub(crate) changes: Vec<RouteChange>,
    /// Every node that has pod CIDRs, by name.
    pub(crate) nodes: BTreeMap<String, NodeOutcome>,
}

impl Plan {
    pub(crate) fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

fn is_gateway_like(target: &RouteTarget) -> bool {
    matches!(target, RouteTarget::Local | RouteTarget::Gateway(_))
}

/// Computes the changes. Deterministic: the same input gives the same plan.
pub(crate) fn plan(
    cluster_cidrs: &ClusterCidrs,
    nodes: &[NodeRoutes],
    tables: &[RouteTable],
    instances: &HashMap<String, TargetInstance>,
) -> Plan {
    let mut sorted: Vec<&NodeRoutes> = nodes.iter().filter(|n| !n.pod_cidrs.is_empty()).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut planner = Planner::new(cluster_cidrs);
    for node in &sorted {
        planner.plan_node(node, tables, instances);
    }
    planner.delete_stale_routes(tables);
    planner.finish(&sorted)
}

/// The state one [`plan`] builds up while it walks the nodes (by name) and
/// then the tables.
struct Planner<'a> {
    cluster_cidrs: &'a ClusterCidrs,
    out: Plan,
    route_changes: Vec<RouteChange>,
    /// (table, destination) pairs some node claims: never deleted.
    claimed: BTreeSet<(String, IpNet)>,
    /// Destinations of nodes whose instance is not known: kept unless blackholed.
    protected: BTreeSet<IpNet>,
    /// Instances nodes run on, with the CIDRs they should carry.
    node_instances: BTreeMap<&'a str, BTreeSet<IpNet>>,
    source_dest_done: BTreeSet<&'a str>,
    /// First node (by name) to claim each CIDR; later claims are blocked, so
    /// two nodes with one CIDR never make the route flip between them.
    owner: BTreeMap<IpNet, &'a str>,
}

impl<'a> Planner<'a> {
    fn new(cluster_cidrs: &'a ClusterCidrs) -> Self {
        Planner {
            cluster_cidrs,
            out: Plan::default(),
            route_changes: Vec::new(),
            claimed: BTreeSet::new(),
            protected: BTreeSet::new(),
            node_instances: BTreeMap::new(),
            source_dest_done: BTreeSet::new(),
            owner: BTreeMap::new(),
        }
    }

    fn plan_node(
        &mut self,
        node: &'a NodeRoutes,
        tables: &[RouteTable],
        instances: &HashMap<String, TargetInstance>,
    ) {
        let Some(cidrs) = self.claim_cidrs(node) else {
            return;
        };
        let Some(instance_id) = self.usable_instance(node, &cidrs, instances) else {
            return;
        };
        let mut node_changes = Vec::new();
        let mut blockers = Vec::new();
        for table in tables {
            for cidr in &cidrs {
                self.claimed.insert((table.id.clone(), *cidr));
                match self.route_change(node, instance_id, table, *cidr) {
                    Ok(Some(change)) => node_changes.push(change),
                    Ok(None) => {}
                    Err(blocker) => blockers.push(blocker),
                }
            }
        }
        if !blockers.is_empty() {
            // Leave the node alone until the conflict is resolved; its
            // routes (claimed above) are kept.
            self.outcome(node).blockers.extend(blockers);
            return;
        }
        let source_dest_on = instances
            .get(instance_id)
            .is_some_and(|i| i.source_dest_check != Some(false));
        if source_dest_on && self.source_dest_done.insert(instance_id) {
            self.out.changes.push(RouteChange::DisableSourceDestCheck {
                node: node.name.clone(),
                instance_id: instance_id.to_string(),
            });
        }
        self.route_changes.extend(node_changes);
    }

    fn outcome(&mut self, node: &NodeRoutes) -> &mut NodeOutcome {
        self.out.nodes.entry(node.name.clone()).or_default()
    }

    /// The node's CIDRs (truncated, sorted, unique), or `None` when another
    /// node claimed one of them first.
    fn claim_cidrs(&mut self, node: &'a NodeRoutes) -> Option<Vec<IpNet>> {
        let mut cidrs: Vec<IpNet> = node.pod_cidrs.iter().map(IpNet::trunc).collect();
        cidrs.sort();
        cidrs.dedup();
        let mut blockers = Vec::new();
        for cidr in &cidrs {
            let first = *self.owner.entry(*cidr).or_insert(node.name.as_str());
            if first != node.name {
                blockers.push(Blocker::DuplicateCidr {
                    cidr: *cidr,
                    other_node: first.to_string(),
                });
            }
        }
        let blocked = !blockers.is_empty();
        self.outcome(node).blockers.extend(blockers);
        (!blocked).then_some(cidrs)
    }

    /// The node's instance when routes can point to it; otherwise the node
    /// is blocked and its CIDRs' routes are protected from deletion.
    fn usable_instance(
        &mut self,
        node: &'a NodeRoutes,
        cidrs: &[IpNet],
        instances: &HashMap<String, TargetInstance>,
    ) -> Option<&'a str> {
        let Some(instance_id) = node.instance_id.as_deref() else {
            self.block_and_protect(node, Blocker::NoInstance, cidrs);
            return None;
        };
        self.node_instances
            .entry(instance_id)
            .or_default()
            .extend(cidrs.iter().copied());
        let blocker = match instances.get(instance_id) {
            None => Blocker::InstanceNotFound(instance_id.to_string()),
            Some(i) if i.terminated => Blocker::InstanceTerminated(instance_id.to_string()),
            Some(_) => return Some(instance_id),
        };
        self.block_and_protect(node, blocker, cidrs);
        None
    }

    fn block_and_protect(&mut self, node: &NodeRoutes, blocker: Blocker, cidrs: &[IpNet]) {
        self.outcome(node).blockers.push(blocker);
        self.protected.extend(cidrs.iter().copied());
    }

    /// What one table needs for one of the node's CIDRs: nothing, a change,
    /// or a blocker when a route this controller does not change is there.
    fn route_change(
        &self,
        node: &NodeRoutes,
        instance_id: &str,
        table: &RouteTable,
        cidr: IpNet,
    ) -> Result<Option<RouteChange>, Blocker> {
        let Some(existing) = table.routes.iter().find(|r| r.destination == Some(cidr)) else {
            return Ok(Some(RouteChange::Create {
                node: node.name.clone(),
                table_id: table.id.clone(),
                destination: cidr,
                instance_id: instance_id.to_string(),
            }));
        };
        let conflict = |why: &'static str| Blocker::Conflict {
            table_id: table.id.clone(),
            destination: cidr,
            target: existing.target.clone(),
            why,
        };
        let replace = |was_blackhole: bool| RouteChange::Replace {
            node: node.name.clone(),
            table_id: table.id.clone(),
            destination: cidr,
            instance_id: instance_id.to_string(),
            previous: existing.target.clone(),
            was_blackhole,
        };
        if is_gateway_like(&existing.target) {
            Err(conflict("a local or gateway route"))
        } else if existing.propagated {
            Err(conflict("a propagated route"))
        } else if existing.blackhole {
            Ok(Some(replace(true)))
        } else if existing.target == RouteTarget::Instance(instance_id.to_string()) {
            Ok(None)
        } else if matches!(existing.target, RouteTarget::NetworkInterface(_)) {
            Err(conflict("a route to a network interface of no instance"))
        } else if !self.cluster_cidrs.contains(&cidr) {
            Err(conflict("outside --cluster-cidr"))
        } else {
            Ok(Some(replace(false)))
        }
    }

    /// Routes inside the cluster CIDRs that no node claims: blackholes, and
    /// routes to instances no node runs on or for CIDRs the node lost.
    fn delete_stale_routes(&mut self, tables: &[RouteTable]) {
        for table in tables {
            for route in &table.routes {
                let Some(dest) = route.destination else {
                    continue;
                };
                if !self.cluster_cidrs.contains(&dest)
                    || is_gateway_like(&route.target)
                    || route.propagated
                    || self.claimed.contains(&(table.id.clone(), dest))
                {
                    continue;
                }
                if let Some(reason) = self.delete_reason(route, dest) {
                    self.route_changes.push(RouteChange::Delete {
                        table_id: table.id.clone(),
                        destination: dest,
                        target: route.target.clone(),
                        reason,
                    });
                }
            }
        }
    }

    /// Why a route inside the cluster CIDRs that no node claims is deleted;
    /// `None`: it stays. This controller (and the Go CCM's, `aws_routes.go`
    /// `CreateRoute`) makes routes to instances only, which EC2 keeps by the
    /// instance's primary network interface: once the instance is
    /// terminated, its route is a blackhole to that interface, with no
    /// instance left to name. So a route to an instance, and a blackhole to
    /// a network interface, may be deleted; a blackhole to a gateway or to
    /// nothing is another owner's (the Go CCM deletes every blackhole in the
    /// cluster CIDR; docs/ownership.md).
    fn delete_reason(&self, route: &Route, dest: IpNet) -> Option<DeleteReason> {
        let id = match &route.target {
            RouteTarget::Instance(id) => id,
            RouteTarget::NetworkInterface(_) if route.blackhole => {
                return Some(DeleteReason::Blackhole);
            }
            _ => return None,
        };
        if route.blackhole {
            return Some(DeleteReason::Blackhole);
        }
        if self.protected.contains(&dest) {
            return None;
        }
        match self.node_instances.get(id.as_str()) {
            None => Some(DeleteReason::NoSuchNode),
            Some(cidrs) if !cidrs.contains(&dest) => Some(DeleteReason::NotTheNodesCidr),
            // The node's own route in a table where it waits behind a
            // blocker: keep it.
            Some(_) => None,
        }
    }

    /// Source/destination changes first, then route changes; each node's
    /// outcome lists the changes it needs, including the one
    /// source/destination change of an instance it shares.
    fn finish(mut self, sorted: &[&NodeRoutes]) -> Plan {
        let mut out = std::mem::take(&mut self.out);
        out.changes.append(&mut self.route_changes);
        for (index, change) in out.changes.iter().enumerate() {
            if let Some(node) = change.node()
                && let Some(outcome) = out.nodes.get_mut(node)
            {
                outcome.changes.push(index);
            }
        }
        for node in sorted {
            if let (Some(id), Some(outcome)) =
                (node.instance_id.as_deref(), out.nodes.get_mut(&node.name))
                && outcome.blockers.is_empty()
            {
                // The source/destination changes, which come first.
                for (index, change) in out.changes.iter().enumerate() {
                    let RouteChange::DisableSourceDestCheck { instance_id, .. } = change else {
                        break;
                    };
                    if instance_id == id && !outcome.changes.contains(&index) {
                        outcome.changes.insert(0, index);
                    }
                }
            }
        }
        out
    }
}

/// Routes a table holds after the plan is applied (counted against AWS's
/// quota), for the capacity warning.
pub(crate) fn routes_after(table: &RouteTable, changes: &[RouteChange]) -> usize {
    let mut count = table.counted_routes() as i64;
    for change in changes {
        match change {
            RouteChange::Create { table_id, .. } if *table_id == table.id => count += 1,
            RouteChange::Delete { table_id, .. } if *table_id == table.id => count -= 1,
            _ => {}
        }
    }
    count.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::routes::Route;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn cluster(s: &str) -> ClusterCidrs {
        ClusterCidrs::parse(s, "test").expect("test cluster CIDR")
    }

    fn node(name: &str, instance: Option<&str>, cidrs: &[&str]) -> NodeRoutes {
        NodeRoutes {
            name: name.into(),
            instance_id: instance.map(String::from),
            pod_cidrs: cidrs.iter().map(|c| net(c)).collect(),
        }
    }

    fn route(dest: &str, target: RouteTarget) -> Route {
        Route {
            destination: Some(net(dest)),
            target,
            blackhole: false,
            propagated: false,
        }
    }

    fn to(id: &str) -> RouteTarget {
        RouteTarget::Instance(id.into())
    }

    fn table(id: &str, routes: Vec<Route>) -> RouteTable {
        let mut all = vec![route("10.0.0.0/16", RouteTarget::Local)];
        all.extend(routes);
        RouteTable {
            id: id.into(),
            vpc_id: None,
            routes: all,
            tagging: crate::provider::permissions::Tagging::Current,
            owner_id: None,
        }
    }

    fn instances(list: &[(&str, bool)]) -> HashMap<String, TargetInstance> {
        list.iter()
            .map(|(id, check)| {
                (
                    id.to_string(),
                    TargetInstance {
                        id: id.to_string(),
                        source_dest_check: Some(*check),
                        terminated: false,
                        tagging: crate::provider::permissions::Tagging::Current,
                    },
                )
            })
            .collect()
    }

    fn summary(p: &Plan) -> Vec<String> {
        p.changes.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn new_node_gets_source_dest_off_then_a_route_in_every_table() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[table("rtb-1", vec![]), table("rtb-2", vec![])],
            &instances(&[("i-a", true)]),
        );
        assert_eq!(
            summary(&p),
            [
                "disable source/destination check on i-a (node a)",
                "create rtb-1: 10.244.1.0/24 -> i-a (node a)",
                "create rtb-2: 10.244.1.0/24 -> i-a (node a)",
            ]
        );
        assert_eq!(p.nodes["a"].changes, [0, 1, 2]);
        assert!(p.nodes["a"].blockers.is_empty());
    }

    #[test]
    fn an_unchanged_cluster_is_an_empty_plan() {
        let p = plan(
            &cluster("10.244.0.0/16,fd00:10:244::/56"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24", "fd00:10:244:1::/64"]),
                node("b", Some("i-b"), &["10.244.2.0/24"]),
            ],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-a")),
                    route("fd00:10:244:1::/64", to("i-a")),
                    route("10.244.2.0/24", to("i-b")),
                    route("0.0.0.0/0", RouteTarget::Gateway("igw-1".into())),
                ],
            )],
            &instances(&[("i-a", false), ("i-b", false)]),
        );
        assert!(p.is_empty(), "{:?}", summary(&p));
        assert!(p.nodes["a"].changes.is_empty() && p.nodes["a"].blockers.is_empty());
    }

    #[test]
    fn source_dest_check_already_off_is_not_touched_and_shared_instances_change_once() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[table("rtb-1", vec![])],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(summary(&p), ["create rtb-1: 10.244.1.0/24 -> i-a (node a)"]);
        // Unknown state (None) counts as on.
        let mut unknown = instances(&[("i-a", true)]);
        unknown.get_mut("i-a").unwrap().source_dest_check = None;
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24"]),
                node("b", Some("i-a"), &["10.244.2.0/24"]),
            ],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-a")),
                    route("10.244.2.0/24", to("i-a")),
                ],
            )],
            &unknown,
        );
        assert_eq!(
            summary(&p),
            ["disable source/destination check on i-a (node a)"]
        );
        assert_eq!(p.nodes["a"].changes, [0]);
        assert_eq!(
            p.nodes["b"].changes,
            [0],
            "b waits on the shared change too"
        );
    }

    #[test]
    fn deleted_nodes_lose_their_routes() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-a")),
                    route("10.244.9.0/24", to("i-gone")),
                ],
            )],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(
            summary(&p),
            [
                "delete rtb-1: 10.244.9.0/24 -> instance i-gone (no node runs on its target instance)"
            ]
        );
    }

    #[test]
    fn a_blackhole_for_a_nodes_cidr_is_replaced_and_other_instance_blackholes_deleted() {
        let mut hole = route("10.244.1.0/24", to("i-old"));
        hole.blackhole = true;
        let mut stray = route("10.244.7.0/24", RouteTarget::None);
        stray.blackhole = true;
        let mut own_hole = route("10.244.8.0/24", to("i-b"));
        own_hole.blackhole = true;
        // A route to a terminated instance: EC2 shows its primary network
        // interface, blackholed, and no instance.
        let mut terminated = route(
            "10.244.9.0/24",
            RouteTarget::NetworkInterface("eni-gone".into()),
        );
        terminated.blackhole = true;
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24"]),
                node("b", Some("i-b"), &["10.244.2.0/24"]),
            ],
            &[table(
                "rtb-1",
                vec![
                    hole,
                    stray,
                    own_hole,
                    terminated,
                    route("10.244.2.0/24", to("i-b")),
                ],
            )],
            &instances(&[("i-a", false), ("i-b", false)]),
        );
        assert_eq!(
            summary(&p),
            [
                "replace rtb-1: 10.244.1.0/24 -> i-a (node a), was instance i-old (blackhole)",
                // The blackhole to no target (10.244.7.0/24) is not provably
                // one this controller made: it stays.
                "delete rtb-1: 10.244.8.0/24 -> instance i-b (blackhole)",
                "delete rtb-1: 10.244.9.0/24 -> network interface eni-gone (blackhole)",
            ]
        );
    }

    #[test]
    fn a_route_to_the_wrong_instance_is_replaced_inside_the_cluster_cidr_only() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24"]),
                // A pod CIDR outside --cluster-cidr (e.g. the flag changed).
                node("b", Some("i-b"), &["192.168.5.0/24"]),
            ],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-stale")),
                    route("192.168.5.0/24", to("i-other")),
                ],
            )],
            &instances(&[("i-a", false), ("i-b", false)]),
        );
        assert_eq!(
            summary(&p),
            ["replace rtb-1: 10.244.1.0/24 -> i-a (node a), was instance i-stale"]
        );
        assert!(matches!(
            &p.nodes["b"].blockers[..],
            [Blocker::Conflict {
                why: "outside --cluster-cidr",
                ..
            }]
        ));
    }

    #[test]
    fn out_of_range_local_gateway_and_interface_routes_are_never_touched() {
        let mut dead_gw = route("10.244.50.0/24", RouteTarget::Gateway("nat-gone".into()));
        dead_gw.blackhole = true;
        let mut propagated = route("10.244.60.0/24", RouteTarget::Gateway("vgw-1".into()));
        propagated.propagated = true;
        // Blackholes of other owners: a transit gateway, nothing left.
        let mut dead_tgw = route("10.244.71.0/24", RouteTarget::Gateway("tgw-gone".into()));
        dead_tgw.blackhole = true;
        let mut no_target = route("10.244.72.0/24", RouteTarget::None);
        no_target.blackhole = true;
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[],
            &[RouteTable {
                id: "rtb-1".into(),
                vpc_id: None,
                tagging: crate::provider::permissions::Tagging::Current,
                owner_id: None,
                routes: vec![
                    route("10.0.0.0/16", RouteTarget::Local),
                    // Covers the cluster CIDR but is not inside it.
                    route("10.0.0.0/8", to("i-x")),
                    route("192.168.0.0/24", to("i-x")),
                    route("0.0.0.0/0", RouteTarget::Gateway("igw-1".into())),
                    route(
                        "10.244.40.0/24",
                        RouteTarget::NetworkInterface("eni-1".into()),
                    ),
                    route("10.244.44.0/24", RouteTarget::Gateway("pcx-1".into())),
                    dead_gw,
                    propagated,
                    dead_tgw,
                    no_target,
                    Route {
                        destination: None,
                        target: RouteTarget::Gateway("vpce-1".into()),
                        blackhole: false,
                        propagated: false,
                    },
                ],
            }],
            &HashMap::new(),
        );
        assert!(p.is_empty(), "{:?}", summary(&p));
    }

    #[test]
    fn a_gateway_or_interface_route_in_a_nodes_way_blocks_that_node_only() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24"]),
                node("b", Some("i-b"), &["10.244.2.0/24"]),
            ],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", RouteTarget::Gateway("tgw-1".into())),
                    route(
                        "10.244.2.0/24",
                        RouteTarget::NetworkInterface("eni-1".into()),
                    ),
                ],
            )],
            &instances(&[("i-a", true), ("i-b", true)]),
        );
        assert!(p.is_empty(), "{:?}", summary(&p));
        assert!(matches!(
            &p.nodes["a"].blockers[..],
            [Blocker::Conflict {
                why: "a local or gateway route",
                ..
            }]
        ));
        assert!(p.nodes["b"].blockers[0].to_string().contains("eni-1"));
    }

    #[test]
    fn a_stale_cidr_on_a_live_node_is_deleted() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-a")),
                    route("10.244.3.0/24", to("i-a")),
                ],
            )],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(
            summary(&p),
            [
                "delete rtb-1: 10.244.3.0/24 -> instance i-a (not a pod CIDR of the node on its target instance)"
            ]
        );
    }

    #[test]
    fn nodes_without_an_instance_are_blocked_and_their_routes_kept() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("no-provider-id", None, &["10.244.1.0/24"]),
                node("unknown", Some("i-unknown"), &["10.244.2.0/24"]),
                node("no-cidr", Some("i-x"), &[]),
            ],
            &[table(
                "rtb-1",
                vec![
                    route("10.244.1.0/24", to("i-1")),
                    route("10.244.2.0/24", to("i-unknown")),
                ],
            )],
            &HashMap::new(),
        );
        assert!(p.is_empty(), "{:?}", summary(&p));
        assert_eq!(p.nodes["no-provider-id"].blockers, [Blocker::NoInstance]);
        assert_eq!(
            p.nodes["unknown"].blockers,
            [Blocker::InstanceNotFound("i-unknown".into())]
        );
        assert!(
            !p.nodes.contains_key("no-cidr"),
            "nodes without pod CIDRs are not judged"
        );
    }

    #[test]
    fn terminated_instances_are_blocked_and_their_blackholes_cleaned() {
        let mut hole = route("10.244.1.0/24", to("i-a"));
        hole.blackhole = true;
        let mut dead = instances(&[("i-a", false)]);
        dead.get_mut("i-a").unwrap().terminated = true;
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[table("rtb-1", vec![hole])],
            &dead,
        );
        assert_eq!(
            summary(&p),
            ["delete rtb-1: 10.244.1.0/24 -> instance i-a (blackhole)"]
        );
        assert_eq!(
            p.nodes["a"].blockers,
            [Blocker::InstanceTerminated("i-a".into())]
        );
    }

    #[test]
    fn ipv6_and_dual_stack_routes() {
        let p = plan(
            &cluster("10.244.0.0/16,fd00:10:244::/56"),
            &[node(
                "a",
                Some("i-a"),
                &["10.244.1.0/24", "fd00:10:244:1::/64"],
            )],
            &[table(
                "rtb-1",
                vec![
                    route("fd00:10:244:9::/64", to("i-gone")),
                    route("fd00:99::/64", to("i-gone")),
                ],
            )],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(
            summary(&p),
            [
                "create rtb-1: 10.244.1.0/24 -> i-a (node a)",
                "create rtb-1: fd00:10:244:1::/64 -> i-a (node a)",
                "delete rtb-1: fd00:10:244:9::/64 -> instance i-gone (no node runs on its target instance)",
            ]
        );
    }

    #[test]
    fn two_tables_are_reconciled_independently() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.0/24"])],
            &[
                table("rtb-1", vec![route("10.244.1.0/24", to("i-a"))]),
                table("rtb-2", vec![route("10.244.5.0/24", to("i-gone"))]),
            ],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(
            summary(&p),
            [
                "create rtb-2: 10.244.1.0/24 -> i-a (node a)",
                "delete rtb-2: 10.244.5.0/24 -> instance i-gone (no node runs on its target instance)",
            ]
        );
    }

    #[test]
    fn duplicate_pod_cidrs_and_host_bits_are_normalised() {
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[node("a", Some("i-a"), &["10.244.1.7/24", "10.244.1.0/24"])],
            &[table("rtb-1", vec![])],
            &instances(&[("i-a", false)]),
        );
        assert_eq!(summary(&p), ["create rtb-1: 10.244.1.0/24 -> i-a (node a)"]);
    }

    #[test]
    fn a_cidr_claimed_by_two_nodes_is_routed_to_the_first_only() {
        let nodes = [
            node("b", Some("i-b"), &["10.244.1.0/24"]),
            node("a", Some("i-a"), &["10.244.1.0/24"]),
        ];
        let p = plan(
            &cluster("10.244.0.0/16"),
            &nodes,
            &[table("rtb-1", vec![route("10.244.1.0/24", to("i-a"))])],
            &instances(&[("i-a", false), ("i-b", false)]),
        );
        // No flapping between the two: a keeps it, b is reported.
        assert!(p.is_empty(), "{:?}", summary(&p));
        assert_eq!(
            p.nodes["b"].blockers,
            [Blocker::DuplicateCidr {
                cidr: net("10.244.1.0/24"),
                other_node: "a".into()
            }]
        );
    }

    #[test]
    fn capacity_is_counted_after_the_plan() {
        let t = table("rtb-1", vec![route("10.244.9.0/24", to("i-gone"))]);
        let p = plan(
            &cluster("10.244.0.0/16"),
            &[
                node("a", Some("i-a"), &["10.244.1.0/24"]),
                node("b", Some("i-b"), &["10.244.2.0/24"]),
            ],
            std::slice::from_ref(&t),
            &instances(&[("i-a", false), ("i-b", false)]),
        );
        // local + stale now; + 2 creates - 1 delete.
        assert_eq!(t.counted_routes(), 2);
        assert_eq!(routes_after(&t, &p.changes), 3);
    }
}
