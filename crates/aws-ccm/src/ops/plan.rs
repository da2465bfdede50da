//! `aws-ccm plan`: what the controllers would change in AWS now, by their
//! own read-and-plan code ([`AwsLoadBalancers::plan`] for each LoadBalancer
//! Service, [`Reconciler::read_and_plan`] for routes, the node controllers'
//! plans for Nodes: [`nodes`]), stopping before apply. Each step carries the
//! AWS actions applying it sends, so a test can hold the plan against the
//! calls of the next sync.

mod nodes;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use serde::Serialize;

use super::Context;
use crate::aws::elb::{self, Change as ClbChange};
use crate::aws::load_balancers::adopt::AdoptedSync;
use crate::aws::load_balancers::{AwsLoadBalancers, ClbPlan, NlbPlan, Planned, Warning};
use crate::aws::nlb::shared_group::SharedUse;
use crate::aws::nlb::{self, Change as NlbChange};
use crate::aws::ownership::{self, Made};
use crate::aws::{security_groups as sg, tags};
use crate::controllers::cached_node::Node;
use crate::controllers::route::Reconciler;
use crate::controllers::route::plan::RouteChange;
use crate::controllers::service::{
    backends, has_finalizer, has_load_balancer, wants_load_balancer,
};
use crate::options::controller_names::ControllerName;
use crate::provider::load_balancers::{
    EnsureRequest, LoadBalancerSpec, Scope, is_external, is_protected, scope,
};

/// The plan of a Service handed to another controller
/// (`aws-load-balancer-type: external` or `nlb-ip`), alive or not: the
/// controllers make no AWS call for it.
const HANDED_OVER: &str = "handed to another controller: nothing to do";

/// One step, as `terraform plan` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
struct Step {
    /// `+`, `~`, `-` or `-/+`.
    symbol: &'static str,
    what: String,
    /// The AWS actions applying it sends (one each, before retries).
    actions: Vec<&'static str>,
}

/// The plan of one subject: a Service (`namespace/name`) or `routes`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Section {
    subject: String,
    steps: Vec<Step>,
    /// What keeps the plan from being complete: an invalid Service, a
    /// write IAM refuses, a failed read.
    notes: Vec<String>,
    /// The sync (or reconcile) would fail: an invalid Service, an error the
    /// plan met. `aws-ccm plan` then exits non-zero.
    pub would_fail: bool,
}

impl Section {
    fn new(subject: String) -> Section {
        Section {
            subject,
            ..Section::default()
        }
    }

    fn step(&mut self, symbol: &'static str, what: String, actions: &[&'static str]) {
        self.steps.push(step(symbol, what, actions));
    }

    fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    fn fails(&mut self, note: String) {
        self.note(note);
        self.would_fail = true;
    }
}

fn step(symbol: &'static str, what: String, actions: &[&'static str]) -> Step {
    Step {
        symbol,
        what,
        actions: actions.to_vec(),
    }
}

/// The plan for the Services named in `only` (`name` or `namespace/name`;
/// every LoadBalancer Service when empty), then for routes when the route
/// controller would run.
pub async fn plan(ctx: &Context, only: &[String]) -> anyhow::Result<Vec<Section>> {
    let lp = kube::api::ListParams::default();
    let services = kube::Api::<Service>::all(ctx.kube.clone())
        .list(&lp)
        .await?;
    let nodes: Vec<Arc<Node>> = kube::Api::<Node>::all(ctx.kube.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let lbs = AwsLoadBalancers::new(
        ctx.aws.clone(),
        ctx.cloud.clone(),
        ctx.cluster_id.clone(),
        ctx.validated.options.cluster_name.clone(),
    );
    let mut out = Vec::new();
    for svc in &services.items {
        let key = format!("{}/{}", svc.namespace().unwrap_or_default(), svc.name_any());
        let named = only.is_empty() || only.iter().any(|o| *o == key || *o == svc.name_any());
        if named && wants_load_balancer(svc) {
            out.push(service_section(&lbs, &ctx.cloud, svc, key, &nodes).await);
        } else if named && has_finalizer(svc) {
            out.push(deletion_section(ctx, svc, key).await);
        }
    }
    if !only.is_empty() {
        return Ok(out);
    }
    if let Some(scope) = ctx.route_scope() {
        let reconciler = Reconciler::new(
            ctx.aws.clone(),
            scope.cluster_cidrs,
            scope.selector,
            ctx.validated.options.route_table_limit,
        );
        out.push(route_section(&reconciler, &nodes).await);
    }
    out.extend(nodes::section(ctx, &nodes).await);
    out.extend(tagging_section(ctx, &nodes));
    Ok(out)
}

async fn service_section(
    lbs: &AwsLoadBalancers,
    cloud: &crate::cloud_config::CloudConfig,
    svc: &Service,
    key: String,
    nodes: &[Arc<Node>],
) -> Section {
    let mut section = Section::new(key.clone());
    if is_external(svc) {
        section.note(HANDED_OVER.into());
        return section;
    }
    let reading = LoadBalancerSpec::read_with(svc, cloud);
    for note in &reading.notes {
        let how = if note.reason == crate::aws::annotations::SETTING_REFUSED {
            "not applied (AWS would refuse it)"
        } else {
            "taken as the Go CCM takes it"
        };
        section.note(format!("{how}: {note}"));
    }
    let refused: Vec<String> = reading.errors.iter().map(ToString::to_string).collect();
    let Some(scope) = scope(&reading, has_load_balancer(svc)) else {
        if refused.is_empty() {
            section.note("held: no load balancer is made for this value".into());
        } else {
            section.fails(format!(
                "invalid Service, no AWS call would be made: {}",
                refused.join("; ")
            ));
        }
        return section;
    };
    if !refused.is_empty() {
        section.fails(format!(
            "refused (the Go CCM refuses it too): {}; only the load balancer's backends and node rules would be kept current",
            refused.join("; ")
        ));
    } else if scope != Scope::Full {
        section.note("held: the load balancer is kept as it is; only its backends and node rules would be kept current".into());
    }
    let spec = reading.spec;
    let req = EnsureRequest {
        service_key: key,
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        instance_ids: backends(nodes, &spec.target_node_labels),
        spec,
        scope,
    };
    let Some(adopted) = adoption_steps(lbs, &req, &mut section).await else {
        return section;
    };
    match lbs.plan(&adopted.request).await {
        Ok(Planned::Classic(p)) => clb_steps(&p, &mut section),
        Ok(Planned::Network {
            plan,
            node_rules,
            shared_rule_revokes,
        }) => {
            nlb_steps(&plan, &mut section);
            node_rule_steps(&plan, node_rules, &shared_rule_revokes, &mut section);
        }
        Err(e) => section.fails(format!("the sync would fail: {e}")),
    }
    section
}

/// What the sync's adoption by `aws-load-balancer-name` would do (reads
/// only for a Service with the annotation or an adopted load balancer):
/// the adoption's step, or the Warning of a refused name. `None` when the
/// sync would fail (said in `section`).
async fn adoption_steps<'a>(
    lbs: &AwsLoadBalancers,
    req: &'a EnsureRequest,
    section: &mut Section,
) -> Option<AdoptedSync<'a>> {
    let adopted = match lbs.adopted_sync(req, false).await {
        Ok(a) => a,
        Err(e) => {
            section.fails(format!("the sync would fail: {e}"));
            return None;
        }
    };
    if let Some(w) = &adopted.refused {
        section.note(format!("{w:?}"));
    }
    if let Some(from) = &adopted.kept_from {
        let name = elb::load_balancer_name(&adopted.request.uid);
        section.step(
            "~",
            format!(
                "adopt {name} (kept from {from}): its {} and {} tags name {}, then its {} tag and {from}'s target groups go",
                tags::SERVICE_NAME_TAG,
                tags::ADOPTED_TAG,
                req.service_key,
                tags::KEPT_TAG
            ),
            &["AddTags", "RemoveTags", "DeleteTargetGroup"],
        );
    }
    Some(adopted)
}

/// A Service carrying the finalizer that no longer wants a load balancer
/// (being deleted, or no longer of type LoadBalancer): what the service
/// controller's deletion removes, read as it reads it.
async fn deletion_section(ctx: &Context, svc: &Service, key: String) -> Section {
    let mut section = Section::new(key.clone());
    if is_external(svc) {
        // Left in AWS as it is: only the finalizer is released.
        section.note(HANDED_OVER.into());
        return section;
    }
    let why = if svc.metadata.deletion_timestamp.is_some() {
        "the Service is being deleted"
    } else {
        "the Service no longer asks for a load balancer"
    };
    let name = elb::load_balancer_name(svc.metadata.uid.as_deref().unwrap_or_default());
    let protected = is_protected(svc);
    if let Err(e) = deletion_steps(ctx, &key, &name, why, protected, &mut section).await {
        section.fails(format!("the deletion would fail: {e}"));
    }
    if section.steps.is_empty() && section.notes.is_empty() {
        section.note(format!(
            "{why}; no load balancer is left: only the finalizer is removed"
        ));
    }
    section
}

/// What the deletion does, step by step. `protected`: the Service protects
/// its load balancer; then (and for an NLB AWS protects) the proven load
/// balancer is kept ([`keep_steps`]).
async fn deletion_steps(
    ctx: &Context,
    key: &str,
    name: &str,
    why: &str,
    protected: bool,
    section: &mut Section,
) -> Result<(), crate::aws::AwsError> {
    let aws = &ctx.aws;
    // Each resource: deleted when proven this CCM's for the Service, as
    // the deletion itself decides (`aws::ownership`).
    let proof = |made: Made, name: &str, tags: &BTreeMap<String, String>| {
        ownership::prove(made, name, tags, &ctx.cluster_id, Some(key))
    };
    let clb = elb::io::describe(aws, name).await?;
    let v2 = nlb::read::describe(aws, name).await?;
    let (kept_clb, kept_nlb) = keeps(
        ctx,
        key,
        name,
        protected,
        clb.as_ref(),
        v2.as_ref(),
        section,
    )
    .await?;
    let load_balancer = |section: &mut Section, kind: &str, lb_tags: &BTreeMap<String, String>| {
        match proof(Made::LoadBalancer, name, lb_tags) {
            Ok(()) => section.step(
                "-",
                format!("{kind} {name} ({why})"),
                &["DeleteLoadBalancer"],
            ),
            Err(not_made) => section.note(format!(
                "{kind} {name} is not proven made by the CCM for {key} ({not_made}): the CCM leaves it"
            )),
        }
    };
    if let (false, Some(lb)) = (kept_clb, &clb) {
        load_balancer(section, "classic ELB", &lb.tags);
    }
    clb_group_steps(ctx, key, name, kept_clb, section).await?;
    if kept_nlb {
        return Ok(());
    }
    // What the delete reads: names, ARNs and tags.
    let lb = v2;
    if let Some(lb) = &lb {
        load_balancer(section, "NLB", &lb.tags);
    }
    let lb_arn = lb.as_ref().map(|l| l.arn.as_str());
    let target_groups = nlb::read::groups_to_delete(aws, lb_arn, Some(key)).await?;
    for tg in target_groups
        .iter()
        .filter(|t| proof(Made::TargetGroup, &t.name, &t.tags).is_ok())
    {
        section.step(
            "-",
            format!("target group {}", tg.name),
            &["DeleteTargetGroup"],
        );
    }
    Ok(())
}

/// The classic ELB's owned group (proven the CCM's) and the node groups'
/// rules admitting it: the rules are revoked, and the group deleted unless
/// the load balancer is `kept`.
async fn clb_group_steps(
    ctx: &Context,
    key: &str,
    name: &str,
    kept: bool,
    section: &mut Section,
) -> Result<(), crate::aws::AwsError> {
    let aws = &ctx.aws;
    let proof = |made: Made, name: &str, tags: &BTreeMap<String, String>| {
        ownership::prove(made, name, tags, &ctx.cluster_id, Some(key))
    };
    let filters = vec![
        crate::aws::instances::filter("group-name", [elb::owned_group_name(name)]),
        crate::aws::instances::filter("tag-key", [tags::cluster_tag_key(&ctx.cluster_id)]),
    ];
    let groups = sg::io::describe(aws, filters).await?;
    for g in groups
        .iter()
        .filter(|g| proof(Made::LoadBalancerGroup, &g.name, &g.tags).is_ok())
    {
        // EC2 refuses to delete a group another group's rule names: the
        // deletion revokes the node groups' rules admitting it first.
        if let Some(vpc) = &g.vpc_id {
            let rule = sg::Rule::all_from_group(&g.id);
            for other in sg::io::referencing(aws, vpc, &g.id).await? {
                if other.id != g.id && other.ingress.contains(&rule) {
                    let what = format!("rule of node group {} admitting {}", other.id, g.id);
                    section.step("-", what, &["RevokeSecurityGroupIngress"]);
                }
            }
        }
        if kept {
            continue;
        }
        section.step(
            "-",
            format!("security group {} ({})", g.id, g.name),
            &["DeleteSecurityGroup"],
        );
    }
    Ok(())
}

/// Which of the Service's load balancers (classic ELB `clb`, NLB `v2`, as
/// described) its deletion keeps, as the deletion decides it: proven the
/// CCM's for the Service, and `protected` (or, for an NLB, protected at
/// AWS); the keep's steps go to `section`.
async fn keeps(
    ctx: &Context,
    key: &str,
    name: &str,
    protected: bool,
    clb: Option<&elb::ActualLb>,
    v2: Option<&nlb::ActualLb>,
    section: &mut Section,
) -> Result<(bool, bool), crate::aws::AwsError> {
    let aws = &ctx.aws;
    let proof = |tags: &BTreeMap<String, String>| {
        ownership::prove(Made::LoadBalancer, name, tags, &ctx.cluster_id, Some(key)).is_ok()
    };
    let kept_clb = protected && clb.is_some_and(|lb| proof(&lb.tags));
    let kept_nlb = match v2 {
        Some(lb) if proof(&lb.tags) => protected || nlb::read::protected(aws, lb).await?,
        _ => false,
    };
    if let (true, Some(lb)) = (kept_clb, clb) {
        keep_steps(section, key, "classic ELB", name, &lb.tags);
        if !lb.instances.is_empty() {
            let what = format!("{} instance(s) from classic ELB {name}", lb.instances.len());
            section.step("-", what, &["DeregisterInstancesFromLoadBalancer"]);
        }
    }
    if let (true, Some(lb)) = (kept_nlb, v2) {
        keep_note(section, "NLB", name);
        // The keep's own plan, as the deletion computes it.
        let actual = nlb::read::for_keep(aws, lb.clone()).await?;
        let changes = nlb::plan::plan_keep(&actual, &ctx.cluster_id, name, key);
        for c in changes.iter().flatten() {
            let what = match c {
                NlbChange::DeregisterTargets { arn, instances, .. } => {
                    let group = (actual.target_groups.iter()).find(|t| t.arn == *arn);
                    let group = group.map_or(arn.as_str(), |t| t.name.as_str());
                    format!("{} target(s) from target group {group}", instances.len())
                }
                NlbChange::AddTags { .. } => kept_tag_step(key, "NLB", name),
                _ => nlb::plan::describe(c),
            };
            section.steps.push(nlb_step(c, what));
        }
    }
    Ok((kept_clb, kept_nlb))
}

/// The keep of a protected load balancer: it, its listeners, target
/// groups and own group stay, tagged kept (unless they already are).
fn keep_steps(
    section: &mut Section,
    key: &str,
    kind: &str,
    name: &str,
    lb_tags: &BTreeMap<String, String>,
) {
    keep_note(section, kind, name);
    if lb_tags.get(tags::KEPT_TAG).map(String::as_str) != Some(key) {
        section.step("~", kept_tag_step(key, kind, name), &["AddTags"]);
    }
}

/// The note that `kind` `name` is kept.
fn keep_note(section: &mut Section, kind: &str, name: &str) {
    section.note(format!(
        "{kind} {name} is protected: kept with its listeners, target groups and own security group; what reaches into the cluster (node targets, node rules) is removed"
    ));
}

/// The step tagging `kind` `name` kept from Service `key`.
fn kept_tag_step(key: &str, kind: &str, name: &str) -> String {
    format!(
        "{kind} {name}: tag {}={key} (protected, kept)",
        tags::KEPT_TAG
    )
}

/// What both kinds' steps start with: the other kind's load balancer
/// (`gone`), deleted first when the Service changed kinds, and the writes
/// IAM refuses.
fn prelude(section: &mut Section, handover: bool, gone: String, warnings: &[Warning]) {
    if handover {
        section.step("-", gone, &[]);
    }
    section
        .notes
        .extend(warnings.iter().map(|w| format!("{w:?}")));
}

/// Creating the load balancer, or replacing it when the plan deletes it
/// first (`recreate`: why).
fn create_step(noun: &str, name: &str, recreate: Option<&str>) -> Step {
    match recreate {
        Some(why) => step(
            "-/+",
            format!("{noun} {name} ({why})"),
            &["DeleteLoadBalancer", "CreateLoadBalancer"],
        ),
        None => step("+", format!("{noun} {name}"), &["CreateLoadBalancer"]),
    }
}

fn clb_steps(p: &ClbPlan, section: &mut Section) {
    let gone = format!(
        "NLB {} (the Service now asks for a classic ELB; its plan follows the deletion)",
        p.name
    );
    prelude(section, p.handover, gone, &p.warnings);
    let lb = p.actual.lb.as_ref();
    let recreate = p.changes.iter().find_map(|c| match c {
        ClbChange::DeleteLoadBalancer { reason } => Some(reason.as_str()),
        _ => None,
    });
    for c in &p.changes {
        let what = match c {
            ClbChange::DeleteLoadBalancer { .. } => continue,
            ClbChange::CreateLoadBalancer { .. } => {
                section
                    .steps
                    .push(create_step("classic ELB", &p.name, recreate));
                continue;
            }
            ClbChange::ConfigureHealthCheck(h) => format!(
                "health check {} -> {h:?}",
                lb.and_then(|l| l.health_check.as_ref())
                    .map_or("none".into(), |o| format!("{o:?}"))
            ),
            ClbChange::ModifyAttributes(a) => format!(
                "attributes {} -> {a:?}",
                lb.map_or("none".into(), |l| format!("{:?}", l.attributes))
            ),
            ClbChange::ApplySecurityGroups(g) => format!(
                "security groups {:?} -> {g:?}",
                lb.map(|l| l.security_groups.clone()).unwrap_or_default()
            ),
            _ => elb::plan::describe(c),
        };
        section.steps.push(clb_step(c, what));
    }
    if recreate.is_some()
        && !p
            .changes
            .iter()
            .any(|c| matches!(c, ClbChange::CreateLoadBalancer { .. }))
    {
        section.step(
            "-",
            format!("classic ELB {}", p.name),
            &["DeleteLoadBalancer"],
        );
    }
}

/// The step of one change, described `what`.
fn clb_step(c: &ClbChange, what: String) -> Step {
    let (symbol, action): (&'static str, &'static str) = match c {
        ClbChange::CreateSecurityGroup(_) => ("+", "CreateSecurityGroup"),
        ClbChange::AuthorizeIngress { .. } | ClbChange::AuthorizeNodeIngress { .. } => {
            ("+", "AuthorizeSecurityGroupIngress")
        }
        ClbChange::RevokeIngress { .. } | ClbChange::RevokeNodeIngress { .. } => {
            ("-", "RevokeSecurityGroupIngress")
        }
        ClbChange::DeleteListeners(_) => ("-", "DeleteLoadBalancerListeners"),
        ClbChange::CreateListeners(_) => ("+", "CreateLoadBalancerListeners"),
        ClbChange::AttachSubnets(_) => ("+", "AttachLoadBalancerToSubnets"),
        ClbChange::DetachSubnets(_) => ("-", "DetachLoadBalancerFromSubnets"),
        ClbChange::AddTags(_) => ("~", "AddTags"),
        ClbChange::RemoveTags(_) => ("~", "RemoveTags"),
        ClbChange::CreatePolicy { .. } => ("+", "CreateLoadBalancerPolicy"),
        ClbChange::SetBackendPolicies { .. } => ("~", "SetLoadBalancerPoliciesForBackendServer"),
        ClbChange::SetListenerPolicies { .. } => ("~", "SetLoadBalancerPoliciesOfListener"),
        ClbChange::RegisterInstances(_) => ("+", "RegisterInstancesWithLoadBalancer"),
        ClbChange::DeregisterInstances(_) => ("-", "DeregisterInstancesFromLoadBalancer"),
        ClbChange::DeleteSecurityGroup(_) => ("-", "DeleteSecurityGroup"),
        ClbChange::DeleteLoadBalancer { .. } => ("-", "DeleteLoadBalancer"),
        ClbChange::CreateLoadBalancer { .. } => ("+", "CreateLoadBalancer"),
        ClbChange::ConfigureHealthCheck(_) => ("~", "ConfigureHealthCheck"),
        ClbChange::ModifyAttributes(_) => ("~", "ModifyLoadBalancerAttributes"),
        ClbChange::ApplySecurityGroups(_) => ("~", "ApplySecurityGroupsToLoadBalancer"),
    };
    step(symbol, what, &[action])
}

fn nlb_steps(p: &NlbPlan, section: &mut Section) {
    let gone = format!(
        "classic ELB {} (the Service now asks for an NLB; its plan follows the deletion)",
        p.name
    );
    prelude(section, p.handover, gone, &p.warnings);
    let recreate = p.changes.iter().find_map(|c| match c {
        NlbChange::DeleteLoadBalancer { reason, .. } => Some(reason.as_str()),
        _ => None,
    });
    let creates = p
        .changes
        .iter()
        .any(|c| matches!(c, NlbChange::CreateLoadBalancer { .. }));
    if p.creates_shared {
        section.step(
            "+",
            "the cluster's shared backend security group (NLBNodeIngress = SharedBackendGroup)"
                .into(),
            &["CreateSecurityGroup"],
        );
    }
    for c in &p.changes {
        let what = match c {
            NlbChange::DeleteLoadBalancer { .. } if creates => continue,
            NlbChange::CreateLoadBalancer { .. } => {
                section.steps.push(create_step("NLB", &p.name, recreate));
                continue;
            }
            NlbChange::ModifyHealthCheck { arn, health } => {
                let old = p
                    .actual
                    .target_groups
                    .iter()
                    .find(|t| t.arn == *arn)
                    .map(|t| &t.health);
                format!("health check of {arn} {old:?} -> {health:?}")
            }
            NlbChange::ModifyAttributes(a) => {
                let old: BTreeMap<&String, Option<&String>> = a
                    .keys()
                    .map(|k| (k, p.actual.lb.as_ref().and_then(|l| l.attributes.get(k))))
                    .collect();
                format!("NLB attributes {old:?} -> {a:?}")
            }
            _ => nlb::plan::describe(c),
        };
        section.steps.push(nlb_step(c, what));
    }
}

/// The node-group rule steps of an NLB's plan, and the shared backend
/// group's detach after them and the revoke of its rule from the node
/// groups `shared_rule_revokes` once no NLB carries it (leaving
/// `SharedBackendGroup`).
fn node_rule_steps(
    plan: &NlbPlan,
    node_rules: Vec<(sg::SecurityGroup, nlb::node_rules::RuleChanges)>,
    shared_rule_revokes: &[String],
    section: &mut Section,
) {
    for (group, ch) in node_rules {
        if !ch.revoke.is_empty() {
            section.step(
                "-",
                format!("{} rule(s) of node group {}", ch.revoke.len(), group.id),
                &["RevokeSecurityGroupIngress"],
            );
        }
        if !ch.authorize.is_empty() {
            section.step(
                "+",
                format!("{} rule(s) in node group {}", ch.authorize.len(), group.id),
                &["AuthorizeSecurityGroupIngress"],
            );
        }
    }
    if let SharedUse::Leaving(id) = &plan.shared {
        section.step(
            "~",
            format!("detach the shared backend security group {id} from the NLB, once the node rules above are in"),
            &["SetSecurityGroups"],
        );
    }
    if let (Some(id), false) = (&plan.shared_id, shared_rule_revokes.is_empty()) {
        section.step(
            "-",
            format!(
                "the rule admitting the shared backend security group {id} from node group(s) {}: no NLB carries it then",
                shared_rule_revokes.join(", ")
            ),
            &["RevokeSecurityGroupIngress"],
        );
    }
}

/// The step of one change, described `what`.
fn nlb_step(c: &NlbChange, what: String) -> Step {
    let (symbol, action): (&'static str, &'static str) = match c {
        NlbChange::CreateSecurityGroup(_) => ("+", "CreateSecurityGroup"),
        NlbChange::AuthorizeIngress(_) => ("+", "AuthorizeSecurityGroupIngress"),
        NlbChange::RevokeIngress(_) => ("-", "RevokeSecurityGroupIngress"),
        NlbChange::SetSecurityGroups(_) => ("~", "SetSecurityGroups"),
        NlbChange::DeleteSecurityGroup(_) => ("-", "DeleteSecurityGroup"),
        NlbChange::DeleteLoadBalancer { .. } => ("-", "DeleteLoadBalancer"),
        NlbChange::CreateLoadBalancer { .. } => ("+", "CreateLoadBalancer"),
        NlbChange::SetSubnets(_) => ("~", "SetSubnets"),
        NlbChange::SetIpAddressType(_) => ("~", "SetIpAddressType"),
        NlbChange::AddTags { .. } => ("~", "AddTags"),
        NlbChange::RemoveTags { .. } => ("-", "RemoveTags"),
        NlbChange::ModifyAttributes(_) => ("~", "ModifyLoadBalancerAttributes"),
        NlbChange::CreateTargetGroup { .. } => ("+", "CreateTargetGroup"),
        NlbChange::ModifyHealthCheck { .. } => ("~", "ModifyTargetGroup"),
        NlbChange::ModifyTargetGroupAttributes { .. } => ("~", "ModifyTargetGroupAttributes"),
        NlbChange::RegisterTargets { .. } => ("+", "RegisterTargets"),
        NlbChange::DeregisterTargets { .. } => ("-", "DeregisterTargets"),
        NlbChange::CreateListener { .. } => ("+", "CreateListener"),
        NlbChange::ModifyListener { .. } => ("~", "ModifyListener"),
        NlbChange::ModifyListenerAttributes { .. } => ("~", "ModifyListenerAttributes"),
        NlbChange::DeleteListener { .. } => ("-", "DeleteListener"),
        NlbChange::DeleteTargetGroup { .. } => ("-", "DeleteTargetGroup"),
    };
    step(symbol, what, &[action])
}

async fn route_section(reconciler: &Reconciler<crate::aws::Aws>, nodes: &[Arc<Node>]) -> Section {
    let mut section = Section::new("routes".into());
    let node_routes: Vec<_> = nodes
        .iter()
        .map(|n| crate::controllers::route::node_routes(n))
        .collect();
    let plan = match reconciler.read_and_plan(&node_routes).await {
        Ok((_, _, plan)) => plan,
        Err(e) => {
            section.fails(format!("the reconcile would fail: {e}"));
            return section;
        }
    };
    for c in &plan.changes {
        section.steps.push(match c {
            RouteChange::DisableSourceDestCheck { node, instance_id } => step("~", format!("source/destination check of {instance_id} (node {node}) on -> off"), &["ModifyInstanceAttribute"]),
            RouteChange::Create { node, table_id, destination, instance_id } => step("+", format!("route {destination} -> instance {instance_id} in {table_id} (node {node})"), &["CreateRoute"]),
            RouteChange::Replace { node, table_id, destination, instance_id, previous, .. } => step("~", format!("route {destination} in {table_id}: {previous} -> instance {instance_id} (node {node})"), &["ReplaceRoute"]),
            RouteChange::Delete { table_id, destination, target, reason } => step("-", format!("route {destination} -> {target} in {table_id} ({reason})"), &["DeleteRoute"]),
        });
    }
    for (node, outcome) in &plan.nodes {
        for b in &outcome.blockers {
            section.note(format!("node {node} cannot be routed: {b}"));
        }
    }
    section
}

/// The tagging controller's tags on each Node's instance, when it runs:
/// the Nodes whose label says their instance lacks this tag set (the Go
/// CCM's label and checksum, so Nodes it tagged plan nothing).
fn tagging_section(ctx: &Context, nodes: &[Arc<Node>]) -> Option<Section> {
    use crate::controllers::tagging::{TAGGED_LABEL, needs_tagging, tags_checksum};
    let v = &ctx.validated;
    if !v.controllers.contains(&ControllerName::Tagging) || v.tags.is_empty() {
        return None;
    }
    let checksum = tags_checksum(&v.tags);
    let tags: Vec<String> = v.tags.iter().map(|(k, val)| format!("{k}={val}")).collect();
    let mut section = Section::new("tagging".into());
    for node in nodes {
        if let Some(instance) = needs_tagging(node, &checksum, &ctx.region) {
            section.step(
                "+",
                format!(
                    "tags {} on instance {instance} (node {}; then its label {TAGGED_LABEL}={checksum})",
                    tags.join(","),
                    node.name_any()
                ),
                &["CreateTags"],
            );
        }
    }
    Some(section)
}

/// The plan as `terraform plan` prints it; "no changes" when empty.
pub fn render(sections: &[Section]) -> String {
    let mut out = String::new();
    for s in sections {
        if s.steps.is_empty() && s.notes.is_empty() {
            continue;
        }
        out.push_str(&format!("{}:\n", s.subject));
        for st in &s.steps {
            out.push_str(&format!("  {:>3} {}\n", st.symbol, st.what));
        }
        for n in &s.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
    }
    let count: usize = sections.iter().map(|s| s.steps.len()).sum();
    if count == 0 {
        out.push_str("no changes\n");
    } else {
        out.push_str(&format!("{count} change(s)\n"));
    }
    out
}
