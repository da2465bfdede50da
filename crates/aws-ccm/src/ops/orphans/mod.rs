//! `aws-ccm orphans`: the AWS resources carrying this cluster's tag that
//! belong to no live Service or Node, and their deletion.
//!
//! What counts as alive is decided by the same rules the controllers use:
//! - a load balancer is alive when a Service the service controller manages
//!   ([`crate::controllers::service::wants_load_balancer`]) has its name
//!   (`a` + UID, [`crate::aws::elb::load_balancer_name`]);
//! - a target group when a live load balancer points at it;
//! - an owned security group `k8s-elb-<name>` when load balancer `<name>`
//!   is alive; other cluster-tagged groups (node groups) are never orphans;
//! - a node ingress rule when the group it admits (a classic ELB's owned
//!   group) is alive, or, for an NLB's rule, when the NLB its description
//!   names (`kubernetes.io/rule/nlb/...=<name>`) is alive;
//! - a route when the route controller's own plan
//!   ([`crate::controllers::route::plan::plan`]) over the live Nodes keeps
//!   it: its deletions are the orphans (blackholes, routes to instances no
//!   Node runs on, routes to a node's instance for a CIDR the node no
//!   longer holds). Only inside `--cluster-cidr`, as the controller.
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
use crate::aws::security_groups::{self as sg, Rule};
use crate::controllers::route::plan::NodeRoutes;
use crate::options::cidrs::ClusterCidrs;
use crate::provider::routes::{RouteTableSelector, Routes};

pub mod read;

/// What is alive in the cluster, from the Kubernetes API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Names of the load balancers live Services have.
    pub load_balancers: BTreeSet<String>,
    /// Every Node with what routes depend on.
    pub nodes: Vec<NodeRoutes>,
}

impl Live {
    /// What `services` and `nodes` keep alive.
    pub fn from_objects(services: &[Service], nodes: &[Node]) -> Live {
        Live {
            load_balancers: services
                .iter()
                .filter(|s| crate::controllers::service::wants_load_balancer(s))
                .filter_map(|s| s.metadata.uid.as_deref())
                .map(elb::load_balancer_name)
                .collect(),
            nodes: nodes
                .iter()
                .map(crate::controllers::route::node_routes)
                .collect(),
        }
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

/// One resource left behind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub kind: Kind,
    /// What AWS calls it: a name, an ARN, a group ID, `<group>: <rules>`,
    /// `<table>: <destination>`.
    pub id: String,
    /// How it was recognised as this cluster's and as dead.
    pub recognised: String,
    /// When AWS says it was created (load balancers only).
    pub created: Option<DateTime<Utc>>,
    /// Whether `--delete` removes it: tagged `owned` by this cluster (a
    /// rule or a route: made by the CCM, see the module documentation).
    pub owned: bool,
    #[serde(skip)]
    pub(crate) deletion: Deletion,
}

impl Orphan {
    /// How long ago it was created, when AWS says.
    pub fn age(&self, now: DateTime<Utc>) -> Option<Duration> {
        self.created.and_then(|c| (now - c).to_std().ok())
    }
}

/// The call that deletes an orphan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Deletion {
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

/// Every orphan of the cluster, sorted by kind (the deletion order), then ID.
pub async fn find(aws: &Aws, live: &Live, scope: &Scope) -> anyhow::Result<Vec<Orphan>> {
    let cluster_id = scope.cluster_id.as_str();
    let mut out = Vec::new();
    let (clbs, v2) = tokio::try_join!(
        read::classic_load_balancers(aws, cluster_id),
        read::load_balancers_v2(aws, cluster_id)
    )?;
    out.extend(read::dead_load_balancers(&clbs, live, cluster_id));
    out.extend(read::dead_load_balancers(&v2, live, cluster_id));
    let live_v2: BTreeSet<&str> = v2
        .iter()
        .filter(|lb| live.load_balancers.contains(&lb.name))
        .map(|lb| lb.id.as_str())
        .collect();
    out.extend(read::dead_target_groups(aws, cluster_id, &live_v2).await?);
    out.extend(read::dead_groups_and_rules(aws, cluster_id, live).await?);
    if let Some(routes) = &scope.routes {
        out.extend(read::dead_routes(aws, routes, live).await?);
    }
    out.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
    Ok(out)
}

/// What happened to one orphan under `--delete`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome", content = "detail")]
pub enum Outcome {
    Deleted,
    /// Not tagged `owned`: left alone.
    NotOwned,
    Failed(String),
}

/// Deletes the owned orphans in dependency order (node rules, load
/// balancers, target groups, security groups, routes), telling `report`
/// about each as it goes. Returns how many failed.
pub async fn delete(
    aws: &Aws,
    orphans: &[Orphan],
    mut report: impl FnMut(&Orphan, &Outcome),
) -> usize {
    let mut ordered: Vec<&Orphan> = orphans.iter().collect();
    ordered.sort_by_key(|o| o.kind);
    let mut failed = 0;
    for orphan in ordered {
        let outcome = if !orphan.owned {
            Outcome::NotOwned
        } else if let Err(e) = delete_one(aws, &orphan.deletion).await {
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
        Deletion::Rules { group, rules } => sg::io::revoke(aws, group, rules).await,
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
            delete_patiently(arn, "ResourceInUse", || async {
                aws.elbv2(Operation::Elbv2DeleteTargetGroup, |c| {
                    c.delete_target_group().target_group_arn(arn).send()
                })
                .await
                .map(drop)
            })
            .await
        }
        Deletion::SecurityGroup(id) => {
            delete_patiently(id, "DependencyViolation", || {
                elb::io::delete_owned_group(aws, id)
            })
            .await
        }
        Deletion::Route { table, destination } => {
            return (aws.delete_route(table, *destination).await).map_err(|e| e.to_string());
        }
    };
    done.map_err(|e| e.to_string())
}

/// Runs a delete, retrying `in_use` (`ResourceInUse` for a target group,
/// `DependencyViolation` for a group) for a bounded time: what a
/// just-deleted load balancer used is released late. Already gone is done.
async fn delete_patiently<F, Fut>(what: &str, in_use: &str, mut delete: F) -> Result<(), AwsError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), AwsError>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut wait = Duration::from_millis(500);
    loop {
        match delete().await {
            Err(e) if e.code() == Some(in_use) && tokio::time::Instant::now() + wait < deadline => {
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
pub(crate) fn tag_note(tags: &BTreeMap<String, String>, cluster_id: &str) -> String {
    let key = crate::aws::tags::cluster_tag_key(cluster_id);
    let mut note = format!("tagged {key}={}", tags.get(&key).map_or("", String::as_str));
    if let Some(svc) = tags.get(crate::aws::tags::SERVICE_NAME_TAG) {
        note.push_str(&format!(", made for Service {svc}"));
    }
    note
}

#[cfg(test)]
mod tests;
