//! `aws-ccm plan`'s nodes: what the cloud-node controller's initialization
//! and address refresh, and the lifecycle controller, would change now, by
//! their own plan functions ([`plan_initialization`], [`plan_label_twins`],
//! [`address_change`], the lifecycle's [`decisions`]), stopping before the
//! writes. These are Kubernetes writes: the steps carry no AWS action. The
//! network-node labels are left out (a question to AWS the controller asks
//! after initialization, not a plan). A tainted node whose name finds no
//! instance is judged by its address as the controller judges it
//! ([`by_address::judge`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use kube::ResourceExt;

use super::Section;
use crate::controllers::cached_node::Node;
use crate::controllers::node::by_address;
use crate::controllers::node::identity::{Lookup, lookup_for_node};
use crate::controllers::node::lookups::{Resolutions, SweepIndex, by_addresses, resolve_all};
use crate::controllers::node::plan::{
    InitPlan, PlanContext, address_change, format_addresses, is_uninitialized, plan_initialization,
    plan_label_twins,
};
use crate::controllers::node_lifecycle::{Decision, SHUTDOWN_TAINT, decisions};
use crate::ops::Context;
use crate::options::controller_names::ControllerName;
use crate::provider::CloudResult;
use crate::provider::instances::{Instance, InstanceState};

/// The `nodes` section, when the CCM would run a node controller.
pub(in crate::ops) async fn section(ctx: &Context, nodes: &[Arc<Node>]) -> Option<Section> {
    let runs = |name| ctx.validated.controllers.contains(&name);
    let cloud_node = runs(ControllerName::CloudNode);
    let lifecycle = runs(ControllerName::CloudNodeLifecycle);
    if !cloud_node && !lifecycle {
        return None;
    }
    let mut section = Section::new("nodes".into());
    if cloud_node && let Err(note) = cloud_node_steps(ctx, nodes, &mut section).await {
        section.fails(note);
    }
    if lifecycle {
        let (decided, answered) =
            decisions(&ctx.aws, &ctx.cluster_id, &ctx.region, nodes.to_vec()).await;
        if !answered {
            section
                .fails("the cluster sweep failed: the lifecycle controller decides nothing".into());
        }
        for (node, decision) in decided {
            lifecycle_step(&node, decision, &mut section);
        }
    }
    Some(section)
}

/// Initialization of tainted nodes, label twins and addresses of the others.
async fn cloud_node_steps(
    ctx: &Context,
    nodes: &[Arc<Node>],
    section: &mut Section,
) -> Result<(), String> {
    let sweep = (ctx.aws.cluster_instances().await)
        .map_err(|e| format!("reading the cluster's instances failed: {e}"))?;
    let zone_ids = (ctx.aws.zone_ids().await)
        .map_err(|e| format!("reading the availability zone IDs failed: {e}"))?;
    let index = SweepIndex::new(&sweep);
    let keyed: Vec<(&Arc<Node>, Lookup)> = (nodes.iter())
        .filter_map(|n| Some((n, lookup_for_node(n, &ctx.region).ok()?)))
        .collect();
    let found = resolve_all(&ctx.aws, &index, keyed.iter().map(|(_, k)| k)).await;
    let cx = PlanContext {
        region: &ctx.region,
        families: &ctx.cloud.node_ip_families,
        zone_ids: &zone_ids,
    };
    let mut by_address = lookups_by_address(ctx, &keyed, &found).await;
    for &(node, ref key) in &keyed {
        let name = node.name_any();
        let found_by_address;
        // As the controller: by name, only an instance of this cluster.
        let instance: &Instance = match found.get(key) {
            Some(Ok(Some(i)))
                if matches!(key, Lookup::ById(_)) || i.is_in_cluster(&ctx.cluster_id) =>
            {
                i
            }
            Some(Err(e)) => {
                section.note(format!("node {name}: looking up {key} failed: {e}"));
                continue;
            }
            _ if by_address.contains_key(&name) => {
                let Some((addresses, answer)) = by_address.remove(&name) else {
                    continue;
                };
                let judged = judge_by_address(ctx, node, &addresses, answer, nodes);
                match judged {
                    Ok(instance) => {
                        let what = format!(
                            "node {name}: no instance found by {key}; instance {} found by its address",
                            instance.id
                        );
                        section.note(what);
                        found_by_address = instance;
                        &found_by_address
                    }
                    Err(why) => {
                        let note = format!(
                            "node {name}: no instance found by {key}, nor by its address ({why}); it stays tainted"
                        );
                        section.note(note);
                        continue;
                    }
                }
            }
            _ if is_uninitialized(node) => {
                let note = format!("node {name}: no instance found by {key}; it stays tainted");
                section.note(note);
                continue;
            }
            _ => continue,
        };
        if is_uninitialized(node) {
            match plan_initialization(node, instance, &cx) {
                Ok(plan) => section.step("~", init_text(&name, &plan), &[]),
                Err(e) => section.note(format!("node {name}: stays tainted: {e}")),
            }
        } else {
            refresh_steps(&name, node, instance, &cx, section);
        }
    }
    Ok(())
}

/// As the controller: a tainted node whose name found nothing is looked up
/// by its address, every such node's lookups at once.
async fn lookups_by_address(
    ctx: &Context,
    keyed: &[(&Arc<Node>, Lookup)],
    found: &Resolutions<'_, '_>,
) -> HashMap<String, (Vec<Ipv4Addr>, CloudResult<Vec<Instance>>)> {
    let fall_back: Vec<&Arc<Node>> = (keyed.iter())
        .filter(|(node, key)| {
            is_uninitialized(node)
                && by_address::falls_back(key)
                && matches!(found.get(key), Some(Ok(None)))
        })
        .map(|(node, _)| *node)
        .collect();
    let asked = fall_back.iter().map(|node| async move {
        let addresses = by_address::node_addresses(node);
        let found = match addresses.is_empty() {
            true => Ok(Vec::new()),
            false => by_addresses(&ctx.aws, &addresses).await,
        };
        (node.name_any(), (addresses, found))
    });
    futures::future::join_all(asked).await.into_iter().collect()
}

/// The by-address proof of `node`'s instance, or why there is none.
fn judge_by_address(
    ctx: &Context,
    node: &Node,
    addresses: &[Ipv4Addr],
    answer: CloudResult<Vec<Instance>>,
    nodes: &[Arc<Node>],
) -> Result<Instance, String> {
    let rules = &by_address::Rules {
        cluster_id: &ctx.cluster_id,
        vpc: ctx.cloud.vpc.as_deref(),
    };
    let candidates = answer.map_err(|e| format!("looking it up failed: {e}"))?;
    by_address::judge(node, addresses, &candidates, rules, nodes).map_err(|r| r.to_string())
}

/// An initialized node: GA labels following their beta twins, and the
/// address refresh.
fn refresh_steps(
    name: &str,
    node: &Node,
    instance: &Instance,
    cx: &PlanContext<'_>,
    section: &mut Section,
) {
    let twins = plan_label_twins(node);
    if !twins.is_empty() {
        let what = format!("node {name}: labels {}", pairs(&twins));
        section.step("~", what, &[]);
    }
    // As the refresh: a terminated instance has no addresses to report.
    if matches!(
        instance.state,
        InstanceState::Terminated | InstanceState::ShuttingDown
    ) {
        return;
    }
    match address_change(node, instance, cx.families) {
        Ok(Some(addresses)) => {
            let was = node.status.as_ref().and_then(|s| s.addresses.clone());
            let what = format!(
                "node {name}: addresses [{}] -> [{}]",
                format_addresses(&was.unwrap_or_default()),
                format_addresses(&addresses)
            );
            section.step("~", what, &[]);
        }
        Ok(None) => {}
        Err(e) => section.note(format!("node {name}: addresses: {e}")),
    }
}

fn pairs(labels: &std::collections::BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(", ")
}

fn init_text(name: &str, plan: &InitPlan) -> String {
    let mut parts = Vec::new();
    if let Some(id) = &plan.provider_id {
        parts.push(format!("providerID {id}"));
    }
    if !plan.labels.is_empty() {
        parts.push(format!("labels {}", pairs(&plan.labels)));
    }
    if let Some(addresses) = &plan.addresses {
        parts.push(format!("addresses [{}]", format_addresses(addresses)));
    }
    if plan.taints.is_some() {
        parts.push("uninitialized taint removed".into());
    }
    format!("node {name}: initialize ({})", parts.join("; "))
}

fn lifecycle_step(node: &Node, decision: Decision, section: &mut Section) {
    let name = node.name_any();
    let (symbol, what) = match decision {
        Decision::Nothing => return,
        Decision::Delete => (
            "-",
            format!("node {name} (NotReady; its instance is terminated or gone)"),
        ),
        Decision::AddShutdownTaint => (
            "~",
            format!("node {name}: + taint {SHUTDOWN_TAINT} (NotReady; its instance is stopped)"),
        ),
        Decision::RemoveShutdownTaint => (
            "~",
            format!("node {name}: - taint {SHUTDOWN_TAINT} (Ready)"),
        ),
        Decision::KeepUnverified => {
            let note = format!(
                "node {name}: NotReady and no instance found by its private DNS name (no providerID); kept"
            );
            section.note(note);
            return;
        }
        Decision::OutsideRegion(outside) => {
            section.note(format!("{outside}: nothing to do"));
            return;
        }
    };
    section.step(symbol, what, &[]);
}
