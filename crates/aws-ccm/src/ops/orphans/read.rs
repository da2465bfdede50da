//! The reads behind [`super::find`], each through the one door, and the
//! pure choices of what in them is dead.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::{Deletion, Kind, Live, Orphan, RouteScope, tag_note};
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::client::pages::every_page;
use crate::aws::elb;
use crate::aws::instances::filter;
use crate::aws::nlb::{self, node_rules};
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::tags;
use crate::aws::{Aws, AwsClient};
use crate::controllers::route::plan::{self as route_plan, RouteChange};
use crate::provider::routes::Routes;

/// A load balancer of either API, as far as orphans go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancer {
    pub kind: Kind,
    pub name: String,
    /// The name (classic) or the ARN (v2).
    pub id: String,
    pub tags: BTreeMap<String, String>,
    pub created: Option<DateTime<Utc>>,
}

fn to_chrono(t: Option<&aws_smithy_types::DateTime>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::from_timestamp(t.secs(), t.subsec_nanos()))
}

/// Every classic ELB carrying the cluster tag.
pub async fn classic_load_balancers(
    aws: &AwsClient,
    cluster_id: &str,
) -> Result<Vec<LoadBalancer>, AwsError> {
    let mut all: Vec<LoadBalancer> = every_page(|marker| async move {
        let page = aws
            .elb(Operation::ElbDescribeLoadBalancers, |c| {
                c.describe_load_balancers()
                    .set_marker(marker.clone())
                    .send()
            })
            .await?;
        let lbs: Vec<_> = page
            .load_balancer_descriptions()
            .iter()
            .map(|lb| {
                let name = lb.load_balancer_name().unwrap_or_default().to_string();
                LoadBalancer {
                    kind: Kind::ClassicLoadBalancer,
                    id: name.clone(),
                    name,
                    tags: BTreeMap::new(),
                    created: to_chrono(lb.created_time()),
                }
            })
            .collect();
        Ok((lbs, page.next_marker().map(str::to_string)))
    })
    .await?;
    let names: Vec<String> = all.iter().map(|l| l.name.clone()).collect();
    let mut tags_by_name = elb::io::tags_by_name(aws, &names).await?;
    for lb in &mut all {
        lb.tags = tags_by_name.remove(&lb.name).unwrap_or_default();
    }
    all.retain(|lb| tags::has_cluster_tag(&lb.tags, cluster_id));
    Ok(all)
}

/// Every ELBv2 load balancer carrying the cluster tag.
pub async fn load_balancers_v2(
    aws: &AwsClient,
    cluster_id: &str,
) -> Result<Vec<LoadBalancer>, AwsError> {
    let mut all: Vec<LoadBalancer> = every_page(|marker| async move {
        let page = aws
            .elbv2(Operation::Elbv2DescribeLoadBalancers, |c| {
                c.describe_load_balancers()
                    .set_marker(marker.clone())
                    .send()
            })
            .await?;
        let lbs: Vec<_> = page
            .load_balancers()
            .iter()
            .map(|lb| LoadBalancer {
                kind: Kind::LoadBalancerV2,
                name: lb.load_balancer_name().unwrap_or_default().to_string(),
                id: lb.load_balancer_arn().unwrap_or_default().to_string(),
                tags: BTreeMap::new(),
                created: to_chrono(lb.created_time()),
            })
            .collect();
        Ok((lbs, page.next_marker().map(str::to_string)))
    })
    .await?;
    let arns: Vec<String> = all.iter().map(|l| l.id.clone()).collect();
    let mut tags_by_arn = nlb::read::tags_of(aws, &arns).await?;
    for lb in &mut all {
        lb.tags = tags_by_arn.remove(&lb.id).unwrap_or_default();
    }
    all.retain(|lb| tags::has_cluster_tag(&lb.tags, cluster_id));
    Ok(all)
}

/// Pure: the load balancers no live Service has.
pub fn dead_load_balancers(lbs: &[LoadBalancer], live: &Live, cluster_id: &str) -> Vec<Orphan> {
    lbs.iter()
        .filter(|lb| !live.load_balancers.contains(&lb.name))
        .map(|lb| Orphan {
            kind: lb.kind,
            id: lb.id.clone(),
            recognised: format!(
                "{}; no LoadBalancer Service has the name {} (\"a\" + its UID)",
                tag_note(&lb.tags, cluster_id),
                lb.name
            ),
            created: lb.created,
            owned: tags::is_owned(&lb.tags, cluster_id),
            deletion: match lb.kind {
                Kind::ClassicLoadBalancer => Deletion::ClassicLoadBalancer(lb.id.clone()),
                _ => Deletion::LoadBalancerV2(lb.id.clone()),
            },
        })
        .collect()
}

/// Cluster-tagged target groups that no live load balancer (by ARN in
/// `live_lbs`) points at.
pub async fn dead_target_groups(
    aws: &AwsClient,
    cluster_id: &str,
    live_lbs: &BTreeSet<&str>,
) -> Result<Vec<Orphan>, AwsError> {
    let groups = nlb::read::all_target_groups(aws).await?;
    let arns: Vec<String> = groups
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let tags_by_arn = nlb::read::tags_of(aws, &arns).await?;
    let mut out = Vec::new();
    for g in &groups {
        let arn = g.target_group_arn().unwrap_or_default();
        let Some(tags) = tags_by_arn.get(arn) else {
            continue;
        };
        let behind = g.load_balancer_arns();
        if !tags::has_cluster_tag(tags, cluster_id)
            || behind.iter().any(|lb| live_lbs.contains(lb.as_str()))
        {
            continue;
        }
        let why = if behind.is_empty() {
            "no load balancer points at it".to_string()
        } else {
            format!(
                "only dead load balancers point at it ({})",
                behind.join(", ")
            )
        };
        out.push(Orphan {
            kind: Kind::TargetGroup,
            id: arn.to_string(),
            recognised: format!(
                "{} {}; {why}",
                g.target_group_name().unwrap_or_default(),
                tag_note(tags, cluster_id)
            ),
            created: None,
            owned: tags::is_owned(tags, cluster_id),
            deletion: Deletion::TargetGroup(arn.to_string()),
        });
    }
    Ok(out)
}

/// The owned `k8s-elb-*` groups of dead load balancers, and the node
/// ingress rules admitting a dead load balancer: rules from such a group,
/// and NLB rules whose description names a dead NLB.
pub async fn dead_groups_and_rules(
    aws: &Aws,
    cluster_id: &str,
    live: &Live,
) -> Result<Vec<Orphan>, AwsError> {
    let tagged = sg::io::describe(
        aws,
        vec![filter("tag-key", [tags::cluster_tag_key(cluster_id)])],
    )
    .await?;
    let dead: Vec<&sg::SecurityGroup> = tagged
        .iter()
        .filter(|g| {
            g.name
                .strip_prefix(&elb::owned_group_name(""))
                .is_some_and(|lb| !live.load_balancers.contains(lb))
        })
        .collect();
    let mut out: Vec<Orphan> = dead
        .iter()
        .map(|g| Orphan {
            kind: Kind::SecurityGroup,
            id: g.id.clone(),
            recognised: format!(
                "{} {}; the load balancer it was made for has no live Service",
                g.name,
                tag_note(&g.tags, cluster_id)
            ),
            created: None,
            owned: tags::is_owned(&g.tags, cluster_id),
            deletion: Deletion::SecurityGroup(g.id.clone()),
        })
        .collect();
    // Groups that may hold node rules: the cluster's, those of the
    // cluster's instances, and any group admitting a dead group.
    let mut holders: BTreeMap<String, sg::SecurityGroup> =
        tagged.iter().map(|g| (g.id.clone(), g.clone())).collect();
    let instance_groups: BTreeSet<String> = aws
        .cluster_instances()
        .await?
        .iter()
        .filter(|i| !i.state.is_terminated())
        .flat_map(|i| i.security_groups.iter().map(|g| g.id.to_string()))
        .filter(|id| !holders.contains_key(id))
        .collect();
    let ids: Vec<String> = instance_groups.into_iter().collect();
    for g in sg::io::by_ids(aws, &ids).await? {
        holders.entry(g.id.clone()).or_insert(g);
    }
    for g in &dead {
        if let Some(vpc) = &g.vpc_id {
            for h in sg::io::referencing(aws, vpc, &g.id).await? {
                holders.entry(h.id.clone()).or_insert(h);
            }
        }
    }
    for holder in holders.values() {
        out.extend(dead_rules_in(holder, &dead, live, cluster_id));
    }
    Ok(out)
}

/// Pure: the rules of `holder` that admit a dead load balancer, at most two
/// orphans: one for the dead groups' rules, one for dead NLBs' rules.
pub fn dead_rules_in(
    holder: &sg::SecurityGroup,
    dead_groups: &[&sg::SecurityGroup],
    live: &Live,
    cluster_id: &str,
) -> Vec<Orphan> {
    let mut out = Vec::new();
    let from_dead: BTreeSet<Rule> = holder
        .ingress
        .iter()
        .filter(|r| {
            matches!(&r.source, sg::Source::Group(id)
                if *id != holder.id && dead_groups.iter().any(|d| d.id == *id))
        })
        .cloned()
        .collect();
    if !from_dead.is_empty() {
        // The dead groups the rules admit (the rules' sources, all groups).
        let admitted: Vec<&&sg::SecurityGroup> = dead_groups
            .iter()
            .filter(|d| (from_dead.iter()).any(|r| r.source == sg::Source::Group(d.id.clone())))
            .collect();
        let sources: BTreeSet<String> = admitted.iter().map(|d| d.id.clone()).collect();
        out.push(Orphan {
            kind: Kind::NodeIngressRule,
            id: format!("{}: from {}", holder.id, join(&sources)),
            recognised: format!(
                "rule of {} ({}) admitting the group of a dead load balancer",
                holder.id, holder.name
            ),
            created: None,
            owned: admitted.iter().all(|d| tags::is_owned(&d.tags, cluster_id)),
            deletion: Deletion::Rules {
                group: holder.id.clone(),
                rules: from_dead,
            },
        });
    }
    let (revoke, dead_nlbs) = dead_nlb_rules(&holder.descriptions, live);
    if !revoke.is_empty() {
        out.push(Orphan {
            kind: Kind::NodeIngressRule,
            id: format!("{}: {} NLB rule(s)", holder.id, revoke.len()),
            recognised: format!(
                "rules of {} ({}) described {}=<name> or {}=<name> for dead NLB(s) {}",
                holder.id,
                holder.name,
                nlb::CLIENT_RULE_PREFIX,
                nlb::HEALTH_RULE_PREFIX,
                join(&dead_nlbs)
            ),
            created: None,
            owned: true,
            deletion: Deletion::Rules {
                group: holder.id.clone(),
                rules: revoke,
            },
        });
    }
    out
}

/// The NLB rules (and the MTU rules only they needed) for NLBs no live
/// Service has, by the NLB controller's own rule planner.
fn dead_nlb_rules(
    descriptions: &BTreeMap<Rule, String>,
    live: &Live,
) -> (BTreeSet<Rule>, BTreeSet<String>) {
    let dead: BTreeSet<String> = descriptions
        .values()
        .filter_map(|d| {
            d.strip_prefix(nlb::CLIENT_RULE_PREFIX)
                .or_else(|| d.strip_prefix(nlb::HEALTH_RULE_PREFIX))
                .and_then(|rest| rest.strip_prefix('='))
        })
        .filter(|name| !live.load_balancers.contains(*name))
        .map(str::to_string)
        .collect();
    let mut have = descriptions.clone();
    let mut revoke = BTreeSet::new();
    for name in &dead {
        let changes = node_rules::node_group_changes(name, &have, None);
        for r in changes.revoke {
            have.remove(&r);
            revoke.insert(r);
        }
    }
    (revoke, dead)
}

fn join(items: &BTreeSet<String>) -> String {
    items.iter().cloned().collect::<Vec<_>>().join(", ")
}

/// The route controller's deletions over the live Nodes.
pub async fn dead_routes(
    aws: &Aws,
    scope: &RouteScope,
    live: &Live,
) -> anyhow::Result<Vec<Orphan>> {
    let tables = aws
        .route_tables(&scope.selector)
        .await
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", scope.selector))?;
    let mut ids: Vec<String> = live
        .nodes
        .iter()
        .filter(|n| !n.pod_cidrs.is_empty())
        .filter_map(|n| n.instance_id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    let instances = if ids.is_empty() {
        HashMap::new()
    } else {
        aws.instances(&ids)
            .await
            .map_err(|e| anyhow::anyhow!("reading the Nodes' instances: {e}"))?
    };
    let plan = route_plan::plan(&scope.cluster_cidrs, &live.nodes, &tables, &instances);
    Ok(plan
        .changes
        .into_iter()
        .filter_map(|c| match c {
            RouteChange::Delete {
                table_id,
                destination,
                target,
                reason,
            } => Some(Orphan {
                kind: Kind::Route,
                id: format!("{table_id}: {destination}"),
                recognised: format!("route to {target} in {} ({reason})", scope.selector),
                created: None,
                owned: true,
                deletion: Deletion::Route {
                    table: table_id,
                    destination,
                },
            }),
            _ => None,
        })
        .collect())
}
