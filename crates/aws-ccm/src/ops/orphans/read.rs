//! The reads behind [`super::find`], each through the one door, and the
//! pure choices of what in them is dead.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};

use super::{Audit, Deletion, Kept, Kind, LeftAlone, Live, Orphan, RouteScope, tag_note};
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::client::pages::every_page;
use crate::aws::elb;
use crate::aws::instances::filter;
use crate::aws::nlb::{self, node_rules};
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::tags;
use crate::aws::{Aws, AwsClient};
use crate::controllers::route::plan::{self as route_plan, RouteChange};
use crate::provider::routes::Routes;

/// A load balancer of either API, as far as orphans go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LoadBalancer {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    /// The name (classic) or the ARN (v2).
    pub(crate) id: String,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) created: Option<DateTime<Utc>>,
}

fn to_chrono(t: Option<&aws_smithy_types::DateTime>) -> Option<DateTime<Utc>> {
    t.and_then(|t| DateTime::from_timestamp(t.secs(), t.subsec_nanos()))
}

/// Every classic ELB carrying the cluster tag.
pub(crate) async fn classic_load_balancers(
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
pub(crate) async fn load_balancers_v2(
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

/// Pure: the load balancers no live Service has are orphans when proven
/// made by the CCM, kept when also tagged kept, and left alone when not
/// proven.
pub(crate) fn judge_load_balancers(
    lbs: &[LoadBalancer],
    live: &Live,
    cluster_id: &str,
    audit: &mut Audit,
) {
    for lb in lbs
        .iter()
        .filter(|lb| !live.load_balancers.contains(&lb.name))
    {
        let kept_from = lb.tags.get(tags::KEPT_TAG);
        match ownership::prove(Made::LoadBalancer, &lb.name, &lb.tags, cluster_id, None) {
            Ok(()) if kept_from.is_some() => audit.kept.push(Kept {
                kind: lb.kind,
                id: lb.id.clone(),
                name: lb.name.clone(),
                kept_from: kept_from.cloned().unwrap_or_default(),
            }),
            Ok(()) => audit.orphans.push(Orphan {
                kind: lb.kind,
                id: lb.id.clone(),
                recognised: format!(
                    "{}; no LoadBalancer Service has the name {} (\"a\" + its UID)",
                    tag_note(&lb.tags, cluster_id),
                    lb.name
                ),
                created: lb.created,
                deletion: match lb.kind {
                    Kind::ClassicLoadBalancer => Deletion::ClassicLoadBalancer(lb.id.clone()),
                    _ => Deletion::LoadBalancerV2(lb.id.clone()),
                },
            }),
            Err(why) => audit.left_alone.push(LeftAlone {
                kind: lb.kind,
                id: lb.id.clone(),
                name: lb.name.clone(),
                why: why.to_string(),
            }),
        }
    }
}

/// The load balancers by ARN (`lbs`'s IDs): the live ones, and the orphans.
pub(crate) struct Behind<'a> {
    pub(crate) live: BTreeSet<&'a str>,
    pub(crate) dead: BTreeSet<&'a str>,
}

/// Cluster-tagged target groups that no live load balancer points at:
/// orphans when proven made by the CCM and behind no load balancer but the
/// orphans, left alone when not proven.
pub(crate) async fn dead_target_groups(
    aws: &AwsClient,
    cluster_id: &str,
    lbs: &Behind<'_>,
    audit: &mut Audit,
) -> Result<(), AwsError> {
    let groups = nlb::read::all_target_groups(aws).await?;
    let arns: Vec<String> = groups
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let tags_by_arn = nlb::read::tags_of(aws, &arns).await?;
    for g in &groups {
        let arn = g.target_group_arn().unwrap_or_default();
        let name = g.target_group_name().unwrap_or_default();
        let behind = g.load_balancer_arns();
        match tags_by_arn.get(arn) {
            Some(tags) if tags::has_cluster_tag(tags, cluster_id) => {
                judge_target_group(arn, name, tags, behind, lbs, cluster_id, audit)
            }
            _ => {}
        }
    }
    Ok(())
}

/// Pure: one cluster-tagged target group behind the load balancers `behind`.
fn judge_target_group(
    arn: &str,
    name: &str,
    tags: &BTreeMap<String, String>,
    behind: &[String],
    lbs: &Behind<'_>,
    cluster_id: &str,
    audit: &mut Audit,
) {
    if behind.iter().any(|lb| lbs.live.contains(lb.as_str())) {
        return;
    }
    if let Err(why) = ownership::prove(Made::TargetGroup, name, tags, cluster_id, None) {
        audit.left_alone.push(LeftAlone {
            kind: Kind::TargetGroup,
            id: arn.to_string(),
            name: name.to_string(),
            why: why.to_string(),
        });
        return;
    }
    // A load balancer that stays (left alone, or not this cluster's) keeps
    // what it uses.
    if !behind.iter().all(|lb| lbs.dead.contains(lb.as_str())) {
        return;
    }
    let why = if behind.is_empty() {
        "no load balancer points at it".to_string()
    } else {
        format!(
            "only dead load balancers point at it ({})",
            behind.join(", ")
        )
    };
    audit.orphans.push(Orphan {
        kind: Kind::TargetGroup,
        id: arn.to_string(),
        recognised: format!("{name} {}; {why}", tag_note(tags, cluster_id)),
        created: None,
        deletion: Deletion::TargetGroup(arn.to_string()),
    });
}

/// The `k8s-elb-*` groups of dead load balancers, and the node ingress
/// rules admitting a dead load balancer: rules from such a group, and NLB
/// rules whose description names a dead NLB. `standing`: the names of
/// the load balancers that stay (live, or left alone). A cluster-tagged
/// group that is no load balancer's group the CCM makes is left alone.
pub(crate) async fn dead_groups_and_rules(
    aws: &Aws,
    cluster_id: &str,
    live: &Live,
    standing: &BTreeSet<String>,
    audit: &mut Audit,
) -> Result<(), AwsError> {
    let tagged = sg::io::describe(
        aws,
        vec![filter("tag-key", [tags::cluster_tag_key(cluster_id)])],
    )
    .await?;
    let dead = judge_groups(&tagged, live, standing, cluster_id, audit);
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
        audit.orphans.extend(dead_rules_in(holder, &dead, standing));
    }
    Ok(())
}

/// Pure: the dead load balancers' groups among the cluster-tagged `groups`
/// (each an orphan, also returned), and the groups left alone. A group the
/// CCM makes for an NLB (`k8s-<ns>-<name>-<hash>`) is neither: which
/// Service it belongs to takes the Service's UID, so it is not audited.
/// `standing`: the load balancers that stay, whose groups stay too.
pub(crate) fn judge_groups<'a>(
    groups: &'a [sg::SecurityGroup],
    live: &Live,
    standing: &BTreeSet<String>,
    cluster_id: &str,
    audit: &mut Audit,
) -> Vec<&'a sg::SecurityGroup> {
    let mut dead = Vec::new();
    for g in groups {
        let lb = g.name.strip_prefix(&elb::owned_group_name(""));
        if lb.is_some_and(|lb| live.load_balancers.contains(lb)) {
            continue;
        }
        let verdict =
            match ownership::prove(Made::LoadBalancerGroup, &g.name, &g.tags, cluster_id, None) {
                Err(ownership::NotMade::Name(_)) => {
                    ownership::prove(Made::NlbGroup, &g.name, &g.tags, cluster_id, None)
                        .map(|()| false)
                }
                other => other.map(|()| true),
            };
        match verdict {
            Ok(true) if lb.is_some_and(|lb| standing.contains(lb)) => {}
            Ok(true) => {
                audit.orphans.push(Orphan {
                    kind: Kind::SecurityGroup,
                    id: g.id.clone(),
                    recognised: format!(
                        "{} {}; the load balancer it was made for has no live Service",
                        g.name,
                        tag_note(&g.tags, cluster_id)
                    ),
                    created: None,
                    deletion: Deletion::SecurityGroup(g.id.clone()),
                });
                dead.push(g);
            }
            Ok(false) => {}
            Err(why) => audit.left_alone.push(LeftAlone {
                kind: Kind::SecurityGroup,
                id: g.id.clone(),
                name: g.name.clone(),
                why: why.to_string(),
            }),
        }
    }
    dead
}

/// Pure: the rules of `holder` that admit a dead load balancer, at most two
/// orphans: one for the dead groups' rules, one for dead NLBs' rules.
pub(crate) fn dead_rules_in(
    holder: &sg::SecurityGroup,
    dead_groups: &[&sg::SecurityGroup],
    standing: &BTreeSet<String>,
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
        let sources: BTreeSet<String> = from_dead
            .iter()
            .filter_map(|r| match &r.source {
                sg::Source::Group(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        out.push(Orphan {
            kind: Kind::NodeIngressRule,
            id: format!("{}: from {}", holder.id, join(&sources)),
            recognised: format!(
                "rule of {} ({}) admitting the group of a dead load balancer",
                holder.id, holder.name
            ),
            created: None,
            deletion: Deletion::Rules {
                group: holder.id.clone(),
                rules: from_dead,
            },
        });
    }
    let (revoke, dead_nlbs) = dead_nlb_rules(&holder.descriptions, standing);
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
            deletion: Deletion::Rules {
                group: holder.id.clone(),
                rules: revoke,
            },
        });
    }
    out
}

/// The NLB rules (and the MTU rules only they needed) for NLBs of the
/// CCM's names that do not stand, by the NLB controller's own rule planner.
fn dead_nlb_rules(
    descriptions: &BTreeMap<Rule, String>,
    standing: &BTreeSet<String>,
) -> (BTreeSet<Rule>, BTreeSet<String>) {
    let dead: BTreeSet<String> = descriptions
        .values()
        .filter_map(|d| {
            d.strip_prefix(nlb::CLIENT_RULE_PREFIX)
                .or_else(|| d.strip_prefix(nlb::HEALTH_RULE_PREFIX))
                .and_then(|rest| rest.strip_prefix('='))
        })
        .filter(|name| ownership::is_load_balancer_name(name) && !standing.contains(*name))
        .map(str::to_string)
        .collect();
    let mut have = descriptions.clone();
    let mut revoke = BTreeSet::new();
    for name in &dead {
        let changes = node_rules::node_group_changes(name, &have, None, &BTreeSet::new());
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
pub(crate) async fn dead_routes(
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
                deletion: Deletion::Route {
                    table: table_id,
                    destination,
                },
            }),
            _ => None,
        })
        .collect())
}
