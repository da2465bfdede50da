//! What AWS holds for the cluster: every Node's instance with the cluster
//! tag, a load balancer subnet per zone holding nodes, the route tables,
//! and one cluster-tagged security group per instance.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kube::ResourceExt;

use super::{Check, Context, first};
use crate::aws::subnets::{self, Subnet};
use crate::aws::{Ec2Instance, Operation, security_groups as sg, tags};
use crate::controllers::cached_node::Node;
use crate::controllers::route::{CAPACITY_WARNING_RATIO, CapacityWarning};
use crate::provider::routes::Routes;

/// Problems listed per check before "and N more".
const LISTED: usize = 10;

/// The Nodes' instances as AWS has them.
pub(crate) struct NodeInstances {
    /// Live instances backing a Node, by ID.
    live: BTreeMap<String, Ec2Instance>,
    /// One line per Node whose instance is wrong, and its fix.
    problems: Vec<(String, String)>,
    /// Nodes without a providerID (not initialized yet).
    without_provider_id: usize,
    nodes: usize,
}

impl NodeInstances {
    /// The cluster's instances (the CCM's tag sweep), then one lookup per
    /// Node whose instance the sweep did not return, to tell a missing tag
    /// from a missing instance.
    pub(crate) async fn find(ctx: &Context, nodes: &[Node]) -> NodeInstances {
        let mut out = NodeInstances {
            live: BTreeMap::new(),
            problems: Vec::new(),
            without_provider_id: 0,
            nodes: nodes.len(),
        };
        let swept: HashMap<String, Ec2Instance> = match ctx.aws.cluster_instances().await {
            Ok(list) => list.iter().map(|i| (i.id.clone(), i.clone())).collect(),
            Err(e) => {
                let fix = "grant ec2:DescribeInstances (see the iam checks)".to_string();
                out.problems
                    .push((format!("listing the cluster's instances failed: {e}"), fix));
                HashMap::new()
            }
        };
        for node in nodes {
            match crate::ids::node_instance_id(node) {
                Ok(None) => out.without_provider_id += 1,
                Err(e) => out.problems.push((
                    e.to_string(),
                    format!("fix the kubelet's --provider-id on {}", node.name_any()),
                )),
                Ok(Some(id)) => match swept.get(&id) {
                    Some(i) if !i.state.is_terminated() => {
                        out.live.insert(id, i.clone());
                    }
                    _ => out.look_up(ctx, &node.name_any(), &id).await,
                },
            }
        }
        out
    }

    async fn look_up(&mut self, ctx: &Context, node: &str, id: &str) {
        let key = tags::cluster_tag_key(&ctx.cluster_id);
        let problem = match ctx.aws.instance_by_id(id).await {
            Ok(i) if i.state.is_terminated() => (
                format!("Node {node}: instance {id} is {:?}", i.state),
                format!(
                    "delete the Node (kubectl delete node {node}); the CCM's node lifecycle controller does so once it runs"
                ),
            ),
            Ok(i) => {
                self.live.insert(id.to_string(), i);
                (
                    format!("Node {node}: instance {id} lacks the cluster tag {key}"),
                    format!("aws ec2 create-tags --resources {id} --tags Key={key},Value=owned"),
                )
            }
            Err(e) => (
                format!("Node {node}: no instance {id} in {} ({e})", ctx.region),
                format!(
                    "the Node's providerID names no instance of this account and region: delete the Node (kubectl delete node {node}) or fix its kubelet's --provider-id"
                ),
            ),
        };
        self.problems.push(problem);
    }

    /// The instances check: every Node's instance found with the tag.
    pub(crate) fn checks(&self, ctx: &Context) -> Vec<Check> {
        let key = tags::cluster_tag_key(&ctx.cluster_id);
        let name = "every Node's instance, with the cluster tag";
        if self.problems.is_empty() {
            return vec![Check::of("instances", name).pass(format!(
                "{} of {} Nodes have their instance, tagged {key} ({} without a providerID yet)",
                self.live.len(),
                self.nodes,
                self.without_provider_id
            ))];
        }
        let mut out: Vec<Check> = self
            .problems
            .iter()
            .take(LISTED)
            .map(|(problem, fix)| Check::of("instances", name).fail(problem, fix))
            .collect();
        if self.problems.len() > LISTED {
            out.push(Check::of("instances", name).fail(
                format!("and {} more Nodes", self.problems.len() - LISTED),
                "run again after fixing the ones above",
            ));
        }
        out
    }

    /// The VPC load balancers go in: cloud.conf `VPC`, else the nodes'.
    fn vpc(&self, ctx: &Context) -> Option<String> {
        ctx.cloud.vpc.clone().or_else(|| {
            self.live
                .values()
                .find_map(|i| i.vpc_id.as_deref().map(str::to_string))
        })
    }

    fn zones(&self) -> BTreeSet<String> {
        self.live
            .values()
            .filter_map(|i| i.availability_zone.as_deref().map(str::to_string))
            .collect()
    }
}

/// Per zone holding nodes, for internet-facing and internal load balancers:
/// the subnet a sync would choose (the same `subnets::discover_with_fallback`).
pub(crate) async fn subnet_checks(ctx: &Context, found: &NodeInstances) -> Vec<Check> {
    let check = Check::of("subnets", "load balancer subnets");
    let Some(vpc) = found.vpc(ctx) else {
        return vec![check.skip("no VPC: no Node's instance was found and cloud.conf sets no VPC")];
    };
    let read = async {
        let subnets = subnets::vpc_subnets(&ctx.aws, &vpc).await?;
        let zones = ctx.aws.zones().await?;
        Ok::<_, crate::aws::AwsError>((subnets, zones))
    };
    let (all, zones) = match read.await {
        Ok(x) => x,
        Err(e) => {
            return vec![check.fail(
                format!("reading the subnets of {vpc} failed: {e}"),
                "grant ec2:DescribeSubnets, ec2:DescribeRouteTables and ec2:DescribeAvailabilityZones",
            )];
        }
    };
    let mut out = Vec::new();
    for internal in [false, true] {
        let (chosen, fallback) = subnets::discover_with_fallback(
            &all,
            internal,
            &ctx.cluster_id,
            &zones.types,
            &ctx.cloud,
        )
        .await;
        for zone in found.zones() {
            let pick = all
                .iter()
                .find(|s| s.availability_zone == zone && chosen.contains(&s.id));
            let verdict = ZoneSubnets {
                all: &all,
                zone: &zone,
                internal,
                cluster_id: &ctx.cluster_id,
            };
            out.push(match pick {
                Some(s) => verdict.usable(s, fallback),
                None => verdict.unusable(&vpc, &zones.types),
            });
        }
    }
    out
}

/// The subnets of one zone for one kind of load balancer.
pub(crate) struct ZoneSubnets<'a> {
    pub(crate) all: &'a [Subnet],
    pub(crate) zone: &'a str,
    pub(crate) internal: bool,
    pub(crate) cluster_id: &'a str,
}

impl ZoneSubnets<'_> {
    fn name(&self) -> String {
        let kind = if self.internal {
            "internal"
        } else {
            "internet-facing"
        };
        format!("{} {kind}", self.zone)
    }

    fn role(&self) -> &'static str {
        if self.internal {
            tags::ROLE_INTERNAL_ELB
        } else {
            tags::ROLE_ELB
        }
    }

    /// The tags a subnet needs to be chosen on purpose.
    fn wanted_tags(&self) -> String {
        format!(
            "{}=1 and {}=shared",
            self.role(),
            tags::cluster_tag_key(self.cluster_id)
        )
    }

    /// `s` is chosen: pass, naming the tags that made it so, or warn when
    /// it was taken only for carrying no cluster's tag, or as the fallback.
    pub(crate) fn usable(&self, s: &Subnet, fallback: bool) -> Check {
        let check = Check::of("subnets", self.name());
        let key = tags::cluster_tag_key(self.cluster_id);
        let made: Vec<String> = [self.role(), key.as_str()]
            .iter()
            .filter_map(|k| s.tags.get(*k).map(|v| format!("{k}={v}")))
            .collect();
        if fallback {
            return check.warn(
                format!("{}: no subnet of the VPC is this cluster's or of no cluster; the sync falls back to the CCM's own subnet (cloud.conf SubnetID outside the VPC)", s.id),
                format!("tag a subnet in {} with {}", self.zone, self.wanted_tags()),
            );
        }
        if made.is_empty() {
            return check.warn(
                format!("{} is taken only because it carries no cluster's tag; another subnet of the zone tagged later would be taken instead", s.id),
                format!("tag {} with {}", s.id, self.wanted_tags()),
            );
        }
        check.pass(format!("{} ({})", s.id, made.join(", ")))
    }

    /// No subnet of the zone is chosen: the candidates, why each is not
    /// usable, and the tag that would make it so.
    pub(crate) fn unusable(&self, vpc: &str, zone_types: &HashMap<String, String>) -> Check {
        let check = Check::of("subnets", self.name());
        let mut candidates = Vec::new();
        let mut fixable = Vec::new();
        for s in self.all.iter().filter(|s| s.availability_zone == self.zone) {
            let why = if zone_types
                .get(self.zone)
                .is_some_and(|t| t != subnets::REGULAR_ZONE)
            {
                "the zone takes no load balancer".to_string()
            } else if !self.internal && !s.public {
                "private: no route to an internet gateway".to_string()
            } else {
                fixable.push(s.id.clone());
                let others: Vec<&str> = s
                    .tags
                    .keys()
                    .filter(|k| k.starts_with(tags::CLUSTER_TAG_PREFIX))
                    .map(String::as_str)
                    .collect();
                format!("tagged for another cluster ({})", others.join(", "))
            };
            candidates.push(format!("{} ({why})", s.id));
        }
        let detail = if candidates.is_empty() {
            format!("no subnet of {vpc} is in this zone; nodes here have no load balancer subnet")
        } else {
            format!("no usable subnet; candidates: {}", first(&candidates, 10))
        };
        let fix = match fixable.first() {
            Some(id) => format!(
                "aws ec2 create-tags --resources {id} --tags Key={},Value=1 Key={},Value=shared",
                self.role(),
                tags::cluster_tag_key(self.cluster_id)
            ),
            None if self.internal => format!(
                "create a subnet in {} in {vpc} tagged {}",
                self.zone,
                self.wanted_tags()
            ),
            None => format!(
                "create a public subnet (a route 0.0.0.0/0 to an internet gateway) in {} in {vpc} tagged {}, or use internal load balancers",
                self.zone,
                self.wanted_tags()
            ),
        };
        check.fail(detail, fix)
    }
}

/// The route controller's tables (only when it runs) and their capacity
/// against `--route-table-limit`.
pub(crate) async fn route_table_checks(ctx: &Context, found: &NodeInstances) -> Vec<Check> {
    let Some(scope) = ctx.route_scope() else {
        return vec![Check::of("route-tables", "cluster route table").skip(
            "the route controller does not run (--configure-cloud-routes=false, the route controller off, or no --cluster-cidr)",
        )];
    };
    let limit = ctx.validated.options.route_table_limit;
    let tables = match ctx.aws.route_tables(&scope.selector).await {
        Ok(t) => t,
        Err(e) => {
            return vec![Check::of("route-tables", "cluster route table").fail(
                format!("reading the route tables failed: {e}"),
                "grant ec2:DescribeRouteTables",
            )];
        }
    };
    if tables.is_empty() {
        return vec![untagged_tables(ctx, &scope.selector, found).await];
    }
    tables
        .iter()
        .map(|t| {
            let check = Check::of("route-tables", t.id.clone());
            let routes = t.counted_routes();
            let warning = CapacityWarning {
                table_id: t.id.clone(),
                routes,
                limit,
            };
            if routes >= limit as usize {
                check.fail(
                    format!(
                        "{routes} routes, at --route-table-limit={limit}: new nodes get no route"
                    ),
                    warning.message(),
                )
            } else if routes as f64 / f64::from(limit) > CAPACITY_WARNING_RATIO {
                check.warn(format!("{routes} of {limit} routes"), warning.message())
            } else {
                check.pass(format!(
                    "{routes} of --route-table-limit={limit} routes, cluster-tagged"
                ))
            }
        })
        .collect()
}

/// No table matches: the table to tag is the one the nodes' subnets route
/// through (their explicit association, else their VPC's main table), found
/// in the nodes' VPC, never elsewhere in the account.
async fn untagged_tables(
    ctx: &Context,
    selector: &crate::provider::routes::RouteTableSelector,
    found: &NodeInstances,
) -> Check {
    let key = tags::cluster_tag_key(&ctx.cluster_id);
    let check = Check::of("route-tables", "cluster route table");
    if let Some(id) = &selector.route_table_id {
        return check.fail(
            format!("cloud.conf RouteTableID {id} names no route table"),
            "set RouteTableID in cloud.conf to a route table of the cluster's VPC",
        );
    }
    let Some(vpc) = selector.vpc_id.clone().or_else(|| found.vpc(ctx)) else {
        return check.fail(
            format!("no route table carries {key}; routes are on, so no Node gets a route"),
            format!("tag the route table of the nodes' subnets {key}=owned (no node instance was found to name it)"),
        );
    };
    let subnets: BTreeSet<String> = found
        .live
        .values()
        .filter_map(|i| i.subnet_id.as_deref().map(str::to_string))
        .collect();
    let call = ctx.aws.ec2(Operation::Ec2DescribeRouteTables, |c| {
        c.describe_route_tables()
            .filters(crate::aws::instances::filter("vpc-id", [vpc.as_str()]))
            .send()
    });
    let tables = (call.await.map(|out| out.route_tables().to_vec())).unwrap_or_default();
    let to_tag = nodes_route_tables(&tables, &subnets);
    let (used, fix) = if to_tag.is_empty() {
        let fix = format!("tag the route table of the nodes' subnets in {vpc} {key}=owned");
        ("none found".to_string(), fix)
    } else {
        let fix = format!(
            "tag the route table the nodes' subnets use: aws ec2 create-tags --resources {} --tags Key={key},Value=owned (or set RouteTableID in cloud.conf)",
            to_tag.join(" ")
        );
        (first(&to_tag, 10), fix)
    };
    check.fail(
        format!(
            "no route table carries {key}; routes are on, so no Node gets a route (the nodes' subnets in {vpc} use: {used})"
        ),
        fix,
    )
}

/// The tables `subnets` route through: each subnet's explicitly associated
/// table, else the VPC's main table (as EC2 routes a subnet).
fn nodes_route_tables(
    tables: &[aws_sdk_ec2::types::RouteTable],
    subnets: &BTreeSet<String>,
) -> Vec<String> {
    let associated = |subnet: &str| {
        tables.iter().find(|t| {
            t.associations()
                .iter()
                .any(|a| a.subnet_id() == Some(subnet))
        })
    };
    let main = tables
        .iter()
        .find(|t| t.associations().iter().any(|a| a.main() == Some(true)));
    let mut out: Vec<String> = subnets
        .iter()
        .filter_map(|s| associated(s).or(main))
        .filter_map(|t| t.route_table_id().map(str::to_string))
        .collect();
    if subnets.is_empty()
        && let Some(id) = main.and_then(|t| t.route_table_id())
    {
        out.push(id.to_string());
    }
    out.sort();
    out.dedup();
    out
}

/// Exactly one cluster-tagged security group per instance (the group a
/// load balancer opens), by the service path's own choice.
pub(crate) async fn security_group_checks(ctx: &Context, found: &NodeInstances) -> Vec<Check> {
    let name = "one cluster-tagged group per instance";
    let (Some(vpc), false) = (found.vpc(ctx), found.live.is_empty()) else {
        return vec![Check::of("security-groups", name).skip("no Node's instance was found")];
    };
    let refs: Vec<_> = found
        .live
        .values()
        .flat_map(|i| i.security_groups.iter().cloned())
        .collect();
    let groups: HashMap<String, sg::SecurityGroup> =
        match sg::io::by_refs(&ctx.aws, &vpc, &refs, &[]).await {
            Ok(list) => list.into_iter().map(|g| (g.id.clone(), g)).collect(),
            Err(e) => {
                return vec![Check::of("security-groups", name).fail(
                    format!("reading the instances' security groups failed: {e}"),
                    "grant ec2:DescribeSecurityGroups",
                )];
            }
        };
    let key = tags::cluster_tag_key(&ctx.cluster_id);
    let tagged = |id: &str| {
        groups
            .get(id)
            .is_some_and(|g| tags::has_cluster_tag(&g.tags, &ctx.cluster_id))
    };
    let mut out = Vec::new();
    for i in found.live.values() {
        let ids: Vec<&str> = i.security_groups.iter().map(|g| &*g.id).collect();
        let check = Check::of("security-groups", i.id.clone());
        out.push(match sg::node_group_of(&i.id, &ids, tagged, &ctx.cluster_id) {
            Ok(Some(g)) if tagged(&g) => continue,
            Ok(Some(g)) => check.warn(
                format!("{g}, the instance's only group, lacks {key}: load balancers open it, but the least-privilege policy does not let the CCM change it"),
                format!("aws ec2 create-tags --resources {g} --tags Key={key},Value=owned"),
            ),
            Ok(None) => check.fail(
                "the instance has no security group",
                format!("attach a security group tagged {key}=owned"),
            ),
            Err(e) => check.fail(e, "tag exactly one of the instance's groups"),
        });
    }
    if out.is_empty() {
        out.push(Check::of("security-groups", name).pass(format!(
            "each of {} instances has exactly one group tagged {key}",
            found.live.len()
        )));
    }
    out
}
