//! `aws-ccm orphans`: the AWS resources carrying this cluster's tag that
//! belong to no live Service or Node, and their deletion.
//!
//! Only what [`crate::aws::ownership`] proves the CCM (or the Go CCM) made
//! for this cluster is an orphan; anything else carrying the cluster tag
//! (kOps' API and bastion load balancers, their target groups and groups,
//! the node groups, what Terraform or the Load Balancer Controller tagged)
//! is listed apart, [`LeftAlone`], with the part of the proof it failed, and
//! never deleted.
//!
//! What counts as alive is decided by the same rules the controllers use:
//! - a load balancer is alive when a Service the service controller manages
//!   ([`crate::controllers::service::wants_load_balancer`]), or one handed
//!   to another controller ([`crate::aws::annotations::is_external`], of any
//!   type), has its name (`a` + UID, [`crate::aws::elb::load_balancer_name`]);
//! - a target group when a load balancer that is not an orphan points at it;
//! - a group `k8s-elb-<name>` when load balancer `<name>` is alive or left
//!   alone;
//! - a node ingress rule when the group it admits (a classic ELB's owned
//!   group) is alive, or, for an NLB's rule, when the NLB its description
//!   names (`kubernetes.io/rule/nlb/...=<name>`) is alive or left alone;
//! - a route when the route controller's own plan
//!   ([`crate::controllers::route::plan::plan`]) over the live Nodes keeps
//!   it: its deletions are the orphans (blackholes and routes to instances
//!   no Node runs on, or to a node's instance for a CIDR the node no longer
//!   holds). Only inside `--cluster-cidr`, as the controller.
//!
//! A load balancer the CCM kept for a protected Service (proven made by it,
//! and tagged [`crate::aws::tags::KEPT_TAG`]) is no orphan: it is listed as
//! "protected, kept", [`Kept`], never deleted, and keeps what it uses.
//!
//! The reads are in [`read`]. [`find`] is the library entry point the
//! integration tests use as their orphan audit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use crate::controllers::cached_node::Node;
use serde::Serialize;

use crate::aws::Aws;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::elb;
use crate::aws::load_balancers::adopt;
use crate::aws::memory::Journal;
use crate::aws::security_groups::{self as sg, Rule};
use crate::controllers::route::plan::NodeRoutes;
use crate::options::cidrs::ClusterCidrs;
use crate::provider::routes::{RouteTableSelector, Routes};

pub mod read;

/// What is alive in the cluster, from the Kubernetes API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Names of the load balancers live Services have.
    load_balancers: BTreeSet<String>,
    /// Every Node with what routes depend on.
    nodes: Vec<NodeRoutes>,
    /// (load balancer name, `<ns>/<name>`) of each live Service that may
    /// have adopted a kept load balancer ([`crate::aws::annotations::adopt_name`]):
    /// live when its tags say so too ([`Live::with_adopted`]).
    adopted: BTreeSet<(String, String)>,
}

impl Live {
    /// What `services` and `nodes` keep alive.
    fn from_objects(services: &[Service], nodes: &[Node]) -> Live {
        Live {
            load_balancers: services
                .iter()
                .filter(|s| {
                    // A Service handed to another controller keeps what this
                    // CCM made before, whatever its type now: that controller's.
                    crate::controllers::service::wants_load_balancer(s)
                        || crate::aws::annotations::is_external(s)
                })
                .filter_map(|s| s.metadata.uid.as_deref())
                .map(elb::load_balancer_name)
                .collect(),
            nodes: nodes
                .iter()
                .map(crate::controllers::route::node_routes)
                .collect(),
            adopted: services
                .iter()
                .filter(|s| crate::controllers::service::wants_load_balancer(s))
                .filter_map(|s| {
                    let name = crate::aws::annotations::adopt_name(s)?;
                    let key = format!(
                        "{}/{}",
                        s.metadata.namespace.as_deref()?,
                        s.metadata.name.as_deref()?
                    );
                    Some((name, key))
                })
                .collect(),
        }
    }

    /// With the load balancers live Services adopted (`lbs`: those found),
    /// by the proof the Service's sync and deletion take: the Service names
    /// it and its tags name the Service ([`adopt::is_adopted_by`]).
    fn with_adopted<'a>(&self, lbs: impl IntoIterator<Item = &'a read::LoadBalancer>) -> Live {
        let mut live = self.clone();
        for lb in lbs {
            let adopted = (lb.tags.get(crate::aws::tags::ADOPTED_TAG))
                .filter(|key| self.adopted.contains(&(lb.name.clone(), (*key).clone())))
                .is_some_and(|key| adopt::is_adopted_by(&lb.tags, key));
            if adopted {
                live.load_balancers.insert(lb.name.clone());
            }
        }
        live
    }

    /// Lists every Service and Node.
    pub async fn read(kube: &kube::Client) -> Result<Live, kube::Error> {
        let lp = kube::api::ListParams::default();
        let services = kube::Api::<Service>::all(kube.clone()).list(&lp).await?;
        let nodes = kube::Api::<Node>::all(kube.clone()).list(&lp).await?;
        Ok(Live::from_objects(&services.items, &nodes.items))
    }
}

/// Where to look, besides the cluster tag.
#[derive(Clone, Debug)]
pub struct Scope {
    pub cluster_id: String,
    /// The route tables and cluster CIDRs of the route controller; `None`
    /// when routes are not configured (no `--cluster-cidr`, or
    /// `--configure-cloud-routes=false`): routes are then not audited.
    pub routes: Option<RouteScope>,
}

#[derive(Clone, Debug)]
pub struct RouteScope {
    pub selector: RouteTableSelector,
    pub cluster_cidrs: ClusterCidrs,
}

/// The kinds of orphans, in the order they are deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// An ingress rule of a node's group admitting a dead load balancer.
    NodeIngressRule,
    ClassicLoadBalancer,
    /// An ELBv2 load balancer (NLB).
    LoadBalancerV2,
    TargetGroup,
    SecurityGroup,
    Route,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::NodeIngressRule => "node-ingress-rule",
            Kind::ClassicLoadBalancer => "classic-load-balancer",
            Kind::LoadBalancerV2 => "load-balancer-v2",
            Kind::TargetGroup => "target-group",
            Kind::SecurityGroup => "security-group",
            Kind::Route => "route",
        }
    }
}

/// One resource the CCM made and left behind: `--delete` removes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub kind: Kind,
    /// What AWS calls it: a name, an ARN, a group ID, `<group>: <rules>`,
    /// `<table>: <destination>`.
    pub id: String,
    /// How it was recognised as made by the CCM for this cluster, and as dead.
    pub recognised: String,
    /// When AWS says it was created (load balancers only).
    pub created: Option<DateTime<Utc>>,
    #[serde(skip)]
    deletion: Deletion,
}

/// A resource tagged for this cluster that the CCM did not make (its names
/// and tags do not prove it did): listed, never deleted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LeftAlone {
    pub kind: Kind,
    /// A load balancer's name or ARN, a target group's ARN, a group's ID.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The part of the proof it failed ([`crate::aws::ownership::NotMade`]).
    pub why: String,
}

/// A load balancer the CCM kept when its protected Service went (its
/// [`crate::aws::tags::KEPT_TAG`]): "protected, kept". Listed, never
/// deleted; what it uses (listeners, target groups, its own group) stays
/// with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Kept {
    pub kind: Kind,
    /// A classic ELB's name or an NLB's ARN.
    pub id: String,
    pub name: String,
    /// The Service (`<ns>/<name>`) it was kept from.
    pub kept_from: String,
}

/// What [`find`] reports: the orphans, what is left alone, and what was
/// kept for a protected Service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Audit {
    /// Sorted by kind (the deletion order), then ID.
    pub orphans: Vec<Orphan>,
    /// Sorted by kind, then ID.
    pub left_alone: Vec<LeftAlone>,
    /// Sorted by kind, then ID.
    pub kept: Vec<Kept>,
}

impl Orphan {
    /// How long ago it was created, when AWS says.
    pub fn age(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.created.and_then(|c| (now - c).to_std().ok())
    }
}

/// The call that deletes an orphan.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Deletion {
    Rules {
        group: String,
        rules: BTreeSet<Rule>,
    },
    ClassicLoadBalancer(String),
    LoadBalancerV2(String),
    TargetGroup(String),
    SecurityGroup(String),
    Route {
        table: String,
        destination: IpNet,
    },
}

/// Every orphan of the cluster, and what carries its tag but is not the
/// CCM's.
pub async fn find(aws: &Aws, live: &Live, scope: &Scope) -> anyhow::Result<Audit> {
    let cluster_id = scope.cluster_id.as_str();
    let mut audit = Audit::default();
    let (clbs, v2) = tokio::try_join!(
        read::classic_load_balancers(aws, cluster_id),
        read::load_balancers_v2(aws, cluster_id)
    )?;
    let live = &live.with_adopted(clbs.iter().chain(&v2));
    read::judge_load_balancers(&clbs, live, cluster_id, &mut audit);
    read::judge_load_balancers(&v2, live, cluster_id, &mut audit);
    // What the deletion of the orphans frees: only what they use; a load
    // balancer that stays (live, or left alone) keeps what it uses.
    let dead: BTreeSet<&str> = (audit.orphans.iter())
        .filter(|o| matches!(o.kind, Kind::ClassicLoadBalancer | Kind::LoadBalancerV2))
        .map(|o| o.id.as_str())
        .collect();
    let standing: BTreeSet<String> = (clbs.iter().chain(&v2))
        .filter(|lb| !dead.contains(lb.id.as_str()))
        .map(|lb| lb.name.clone())
        .chain(live.load_balancers.iter().cloned())
        .collect();
    let behind = read::Behind {
        live: (v2.iter())
            .filter(|lb| live.load_balancers.contains(&lb.name))
            .map(|lb| lb.id.as_str())
            .collect(),
        dead: dead.clone(),
    };
    let mut found = Audit::default();
    read::dead_target_groups(aws, cluster_id, &behind, &mut found).await?;
    read::dead_groups_and_rules(aws, cluster_id, live, &standing, &mut found).await?;
    audit.orphans.extend(found.orphans);
    audit.left_alone.extend(found.left_alone);
    if let Some(routes) = &scope.routes {
        audit
            .orphans
            .extend(read::dead_routes(aws, routes, live).await?);
    }
    audit
        .orphans
        .sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
    audit
        .left_alone
        .sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
    audit
        .kept
        .sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
    Ok(audit)
}

/// What happened to one orphan under `--delete`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "detail")]
pub enum Outcome {
    Deleted,
    Failed(String),
}

/// Deletes the orphans in dependency order (node rules, load balancers,
/// target groups, security groups, routes), telling `report` about each as
/// it goes. Returns how many failed. What is left alone is never passed here.
pub async fn delete(
    aws: &Aws,
    orphans: &[Orphan],
    mut report: impl FnMut(&Orphan, &Outcome),
) -> usize {
    let mut ordered: Vec<&Orphan> = orphans.iter().collect();
    ordered.sort_by_key(|o| o.kind);
    let mut failed = 0;
    for orphan in ordered {
        let outcome = if let Err(e) = delete_one(aws, &orphan.deletion).await {
            failed += 1;
            Outcome::Failed(e)
        } else {
            Outcome::Deleted
        };
        report(orphan, &outcome);
    }
    failed
}

async fn delete_one(aws: &Aws, deletion: &Deletion) -> Result<(), String> {
    let done = match deletion {
        Deletion::Rules { group, rules } => {
            let mut journal = Journal::default();
            let done = sg::io::revoke(aws, &mut journal, group, rules).await;
            journal.discard();
            done
        }
        Deletion::ClassicLoadBalancer(name) => aws
            .elb(Operation::ElbDeleteLoadBalancer, |c| {
                c.delete_load_balancer().load_balancer_name(name).send()
            })
            .await
            .map(drop),
        Deletion::LoadBalancerV2(arn) => aws
            .elbv2(Operation::Elbv2DeleteLoadBalancer, |c| {
                c.delete_load_balancer().load_balancer_arn(arn).send()
            })
            .await
            .map(drop),
        Deletion::TargetGroup(arn) => {
            delete_patiently(arn, || async {
                aws.elbv2(Operation::Elbv2DeleteTargetGroup, |c| {
                    c.delete_target_group().target_group_arn(arn).send()
                })
                .await
                .map(drop)
            })
            .await
        }
        Deletion::SecurityGroup(id) => {
            delete_patiently(id, || async {
                let mut journal = Journal::default();
                let done = elb::io::delete_owned_group(aws, &mut journal, id).await;
                journal.discard();
                done
            })
            .await
        }
        Deletion::Route { table, destination } => {
            return (aws.delete_route(table, *destination).await).map_err(|e| e.to_string());
        }
    };
    done.map_err(|e| e.to_string())
}

/// Runs a delete, retrying while AWS says the resource is still in use
/// ([`AwsError::is_in_use`]: `ResourceInUse` for a target group,
/// `DependencyViolation` for a group) for a bounded time: what a
/// just-deleted load balancer used is released late. Already gone is done.
async fn delete_patiently<F, Fut>(what: &str, mut delete: F) -> Result<(), AwsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), AwsError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut wait = Duration::from_millis(500);
    loop {
        match delete().await {
            Err(e) if e.is_in_use() && tokio::time::Instant::now() + wait < deadline => {
                tracing::info!(resource = what, "still in use; retrying its deletion");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(10));
            }
            Err(e) if e.is_not_found() => return Ok(()),
            other => return other,
        }
    }
}

/// `tags` rendered for a message: `key=value` of the cluster tag, and the
/// Service the resource was made for when it says.
fn tag_note(tags: &BTreeMap<String, String>, cluster_id: &str) -> String {
    let key = crate::aws::tags::cluster_tag_key(cluster_id);
    let mut note = format!("tagged {key}={}", tags.get(&key).map_or("", String::as_str));
    if let Some(svc) = tags.get(crate::aws::tags::SERVICE_NAME_TAG) {
        note.push_str(&format!(", made for Service {svc}"));
    }
    note
}

#[cfg(test)]
mod tests;
