//! The CCM's ELB writes, checked by IAM's policy simulator
//! (`iam:SimulatePrincipalPolicy`): ELB and ELBv2 have no `DryRun`, and the
//! CCM's policy grants their writes only under tag conditions
//! (`iam/policy.json`), exactly what a hand-made role gets wrong.
//!
//! - The actions: every mutating operation of the elb and elbv2 services in
//!   the Operation table ([`crate::aws::Operation::ALL`]), each simulated on
//!   the resource shape it acts on, with the context AWS sends for the CCM's
//!   own request: `aws:RequestTag/kubernetes.io/cluster/<id>` = `owned` and
//!   `aws:TagKeys` on a create, `aws:ResourceTag/…` = `owned` on a write to a
//!   cluster-owned resource, `elasticloadbalancing:CreateAction` on the
//!   tag-on-create `AddTags`, and the region.
//! - The principal: doctor's `--role-arn`, else the
//!   `eks.amazonaws.com/role-arn` annotation of the CCM's ServiceAccount
//!   (`kube-system/cloud-controller-manager`, as `manifests/base/` has it),
//!   else the caller's own identity (an assumed-role session becomes its
//!   role; the session ARN has no role path).
//! - The caller (whoever runs doctor) needs `iam:SimulatePrincipalPolicy`;
//!   without it the check is a warning. The CCM's own policy does not grant
//!   it: the CCM never calls it.

use std::collections::BTreeMap;

use aws_sdk_iam::types::{
    ContextEntry, ContextKeyTypeEnum, EvaluationResult, PolicyEvaluationDecisionType,
};

use super::{Check, Context};
use crate::aws::client::pages::every_page;
use crate::aws::tags::cluster_tag_key;
use crate::aws::{Operation, Service};

/// The CCM's ServiceAccount, as `manifests/base/serviceaccount.yaml` names it.
pub(crate) const SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "cloud-controller-manager");

/// The IRSA annotation naming the role the ServiceAccount's Pods assume.
pub(crate) const IRSA_ANNOTATION: &str = "eks.amazonaws.com/role-arn";

/// A tag key the CCM adds to a resource it already owns (never a cluster key).
const RETAG_KEY: &str = "kubernetes.io/service-name";

/// The principal simulated, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Principal {
    arn: String,
    from: String,
    /// Something the reader should know about the choice.
    note: Option<String>,
}

/// The role (or user) an identity from `sts:GetCallerIdentity` simulates
/// as: an assumed-role session becomes its role (without the role's path,
/// which the session ARN does not carry, hence the note); an IAM user or
/// role ARN is itself. `Err` names why nothing can be simulated.
fn principal_of_caller(arn: &str) -> Result<(String, Option<String>), String> {
    let fields: Vec<&str> = arn.splitn(6, ':').collect();
    let [_, partition, service, _, account, resource] = fields[..] else {
        return Err(format!("{arn} is not an ARN"));
    };
    if service == "sts"
        && let Some(rest) = resource.strip_prefix("assumed-role/")
        && let Some((role, _session)) = rest.split_once('/')
    {
        return Ok((
            format!("arn:{partition}:iam::{account}:role/{role}"),
            Some(format!(
                "role ARN made from the session {arn}, which drops the role's path: if the role has one, pass --role-arn"
            )),
        ));
    }
    if service == "iam" && (resource.starts_with("role/") || resource.starts_with("user/")) {
        return Ok((arn.to_string(), None));
    }
    Err(format!(
        "the caller {arn} is neither an IAM user nor an assumed role, so it has no policies to simulate"
    ))
}

/// The principal to simulate: `flag`, else the ServiceAccount's
/// annotation (`Err` when the ServiceAccount could not be read), else the
/// caller's identity (`Err` when `sts:GetCallerIdentity` failed).
pub(crate) fn choose_principal(
    flag: Option<&str>,
    annotation: Result<Option<String>, String>,
    caller: Result<String, String>,
) -> Result<Principal, String> {
    let sa = format!("{}/{}", SERVICE_ACCOUNT.0, SERVICE_ACCOUNT.1);
    if let Some(arn) = flag.filter(|a| !a.is_empty()) {
        return Ok(Principal {
            arn: arn.to_string(),
            from: "--role-arn".into(),
            note: None,
        });
    }
    let unread = match annotation {
        Ok(Some(arn)) => {
            return Ok(Principal {
                arn,
                from: format!("the {IRSA_ANNOTATION} annotation of ServiceAccount {sa}"),
                note: None,
            });
        }
        Ok(None) => None,
        Err(e) => Some(format!("ServiceAccount {sa} could not be read ({e})")),
    };
    let with_unread = |why: String| match &unread {
        Some(sa) => format!("{sa}; {why}"),
        None => why,
    };
    let (arn, note) = caller
        .and_then(|c| principal_of_caller(&c))
        .map_err(with_unread)?;
    let notes: Vec<String> = unread.clone().into_iter().chain(note).collect();
    Ok(Principal {
        arn,
        from: format!(
            "the caller's own identity (no --role-arn, no {IRSA_ANNOTATION} on ServiceAccount {sa})"
        ),
        note: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// What a write does to its resource, which decides the context AWS sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// Creates the resource, with the cluster tag in the request.
    Create,
    /// Changes a cluster-owned resource.
    Change,
    /// Creates a listener on a cluster-owned load balancer, with tags.
    CreateOn,
    /// Adds a non-cluster tag to a cluster-owned resource.
    Retag,
    /// Tags the resource a create makes (`elasticloadbalancing:CreateAction`).
    TagOnCreate(&'static str),
}

/// The resource shapes the CCM's ELB writes act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Shape {
    ClassicLoadBalancer,
    NetworkLoadBalancer,
    TargetGroup,
    Listener,
}

impl Shape {
    fn noun(self) -> &'static str {
        match self {
            Shape::ClassicLoadBalancer => "classic load balancer",
            Shape::NetworkLoadBalancer => "network load balancer",
            Shape::TargetGroup => "target group",
            Shape::Listener => "listener",
        }
    }

    /// An ARN of this shape (the resource need not exist).
    fn arn(self, partition: &str, region: &str, account: &str) -> String {
        let id = "0123456789abcdef";
        let tail = match self {
            Shape::ClassicLoadBalancer => "loadbalancer/aws-ccm-doctor".to_string(),
            Shape::NetworkLoadBalancer => format!("loadbalancer/net/aws-ccm-doctor/{id}"),
            Shape::TargetGroup => format!("targetgroup/aws-ccm-doctor/{id}"),
            Shape::Listener => format!("listener/net/aws-ccm-doctor/{id}/{id}"),
        };
        format!("arn:{partition}:elasticloadbalancing:{region}:{account}:{tail}")
    }

    /// The policy's resource pattern for this shape.
    fn pattern(self, partition: &str) -> String {
        let kind = match self {
            Shape::ClassicLoadBalancer | Shape::NetworkLoadBalancer => "loadbalancer",
            Shape::TargetGroup => "targetgroup",
            Shape::Listener => "listener",
        };
        format!("arn:{partition}:elasticloadbalancing:*:*:{kind}/*")
    }
}

/// The ELB actions that create a tagged resource, and what they create.
fn created(service: Service, action: &str) -> Option<Shape> {
    match (service, action) {
        (Service::Elb, "CreateLoadBalancer") => Some(Shape::ClassicLoadBalancer),
        (Service::Elbv2, "CreateLoadBalancer") => Some(Shape::NetworkLoadBalancer),
        (Service::Elbv2, "CreateTargetGroup") => Some(Shape::TargetGroup),
        (Service::Elbv2, "CreateListener") => Some(Shape::Listener),
        _ => None,
    }
}

/// The resource shape(s) and mode of one ELB write of the Operation table.
fn targets(op: Operation) -> Vec<(Shape, Mode)> {
    let action = op.action();
    let classic = op.service() == Service::Elb;
    let shape = if classic {
        Shape::ClassicLoadBalancer
    } else if action.contains("TargetGroup") || action.ends_with("Targets") {
        Shape::TargetGroup
    } else if action.contains("Listener") && action != "CreateListener" {
        Shape::Listener
    } else {
        Shape::NetworkLoadBalancer
    };
    let mut out = match (created(op.service(), action), action) {
        (Some(Shape::Listener), _) => vec![(Shape::NetworkLoadBalancer, Mode::CreateOn)],
        (Some(made), _) => vec![(made, Mode::Create)],
        (None, "AddTags") if classic => vec![(shape, Mode::Retag)],
        (None, "AddTags" | "RemoveTags") => vec![
            (Shape::NetworkLoadBalancer, Mode::Retag),
            (Shape::TargetGroup, Mode::Retag),
            (Shape::Listener, Mode::Retag),
        ],
        (None, _) => vec![(shape, Mode::Change)],
    };
    if let Some(made) = created(op.service(), action) {
        out.push((made, Mode::TagOnCreate(action)));
    }
    out
}

/// One `SimulatePrincipalPolicy` request: these actions on one resource
/// with one context.
#[derive(Clone, Debug, PartialEq)]
struct Simulation {
    shape: Shape,
    mode: Mode,
    resource: String,
    actions: Vec<String>,
    context: Vec<ContextEntry>,
}

fn entry(key: &str, kind: ContextKeyTypeEnum, values: &[&str]) -> ContextEntry {
    let values = values.iter().map(|v| v.to_string()).collect();
    ContextEntry::builder()
        .context_key_name(key)
        .context_key_type(kind)
        .set_context_key_values(Some(values))
        .build()
}

/// The context AWS sends for the CCM's request in `mode`: the region; the
/// resource's cluster tag on a write to an owned resource; the new tags on
/// a create (or just [`RETAG_KEY`] on a retag); the create action on a
/// tag-on-create.
fn context(mode: Mode, cluster_key: &str, region: &str) -> Vec<ContextEntry> {
    use ContextKeyTypeEnum::{String as One, StringList as Many};
    let request_tag = format!("aws:RequestTag/{cluster_key}");
    let resource_tag = format!("aws:ResourceTag/{cluster_key}");
    let mut out = vec![entry("aws:RequestedRegion", One, &[region])];
    if matches!(mode, Mode::Change | Mode::CreateOn | Mode::Retag) {
        out.push(entry(&resource_tag, One, &["owned"]));
    }
    if matches!(mode, Mode::Create | Mode::CreateOn | Mode::TagOnCreate(_)) {
        out.push(entry(&request_tag, One, &["owned"]));
        out.push(entry("aws:TagKeys", Many, &[cluster_key, RETAG_KEY]));
    }
    if mode == Mode::Retag {
        out.push(entry("aws:TagKeys", Many, &[RETAG_KEY]));
    }
    if let Mode::TagOnCreate(action) = mode {
        out.push(entry("elasticloadbalancing:CreateAction", One, &[action]));
    }
    out
}

/// Every simulation the CCM's ELB writes need, from the Operation table.
fn simulations(partition: &str, region: &str, account: &str, cluster_id: &str) -> Vec<Simulation> {
    let mut grouped: BTreeMap<(Shape, Mode), Vec<String>> = BTreeMap::new();
    let writes = Operation::ALL
        .iter()
        .filter(|op| matches!(op.service(), Service::Elb | Service::Elbv2) && op.is_mutating());
    for op in writes {
        for (shape, mode) in targets(*op) {
            let action = match mode {
                Mode::TagOnCreate(_) => "AddTags",
                _ => op.action(),
            };
            let name = format!("elasticloadbalancing:{action}");
            let list = grouped.entry((shape, mode)).or_default();
            if !list.contains(&name) {
                list.push(name);
            }
        }
    }
    let cluster_key = cluster_tag_key(cluster_id);
    grouped
        .into_iter()
        .map(|((shape, mode), actions)| Simulation {
            shape,
            mode,
            resource: shape.arn(partition, region, account),
            actions,
            context: context(mode, &cluster_key, region),
        })
        .collect()
}

/// What the request looked like, for the check's detail.
fn described(mode: Mode, shape: Shape, cluster_key: &str) -> String {
    let noun = shape.noun();
    match mode {
        Mode::Create => format!("creating a {noun} tagged {cluster_key}=owned"),
        Mode::Change => format!("on a {noun} tagged {cluster_key}=owned"),
        Mode::CreateOn => {
            format!("on a {noun} tagged {cluster_key}=owned, the new listener tagged the same")
        }
        Mode::Retag => format!("adding {RETAG_KEY} to a {noun} tagged {cluster_key}=owned"),
        Mode::TagOnCreate(action) => {
            format!("tagging the {noun} {action} makes with {cluster_key}=owned")
        }
    }
}

/// The statement of `iam/policy.json` that grants it, and its condition.
fn grant(mode: Mode, cluster_key: &str) -> (&'static str, String) {
    match mode {
        Mode::Create => (
            "CreateOwnedLoadBalancers",
            format!("StringEquals aws:RequestTag/{cluster_key} = owned"),
        ),
        Mode::Change | Mode::CreateOn => (
            "ChangeOwnedLoadBalancers",
            format!("StringEquals aws:ResourceTag/{cluster_key} = owned"),
        ),
        Mode::Retag => (
            "RetagOwnedLoadBalancers",
            format!(
                "StringEquals aws:ResourceTag/{cluster_key} = owned, and aws:TagKeys not kubernetes.io/cluster/*"
            ),
        ),
        Mode::TagOnCreate(_) => (
            "TagOnCreateLoadBalancers",
            "StringEquals elasticloadbalancing:CreateAction = the create action".to_string(),
        ),
    }
}

/// One denied action of a simulation, as a failed check.
fn denial(
    sim: &Simulation,
    result: &EvaluationResult,
    principal: &Principal,
    ctx: &Context,
) -> Check {
    let (action, decision) = (result.eval_action_name(), result.eval_decision());
    let missing = result.missing_context_values();
    let cluster_key = cluster_tag_key(&ctx.cluster_id);
    let partition = principal.arn.split(':').nth(1).unwrap_or("aws");
    let mut detail = format!(
        "IAM simulation of {} answers {} ({}; {})",
        principal.arn,
        decision.as_str(),
        described(sim.mode, sim.shape, &cluster_key),
        sim.resource
    );
    if !missing.is_empty() {
        detail.push_str(&format!(
            "; the policy's conditions test {}, which the request has no value for",
            missing.join(", ")
        ));
    }
    let (sid, condition) = grant(sim.mode, &cluster_key);
    let fix = if *decision == PolicyEvaluationDecisionType::ExplicitDeny {
        format!(
            "a Deny statement in {}'s policies refuses {action}: remove or narrow it (the CCM's policy, iam/render.sh policy {}, has none)",
            principal.arn, ctx.cluster_id
        )
    } else {
        format!(
            "attach the policy iam/render.sh policy {} renders to {} (statement {sid}), or allow {action} on {} with the condition {condition}",
            ctx.cluster_id,
            principal.arn,
            sim.shape.pattern(partition)
        )
    };
    Check::of("iam", format!("{action} ({})", sim.shape.noun())).fail(detail, fix)
}

/// Runs one simulation, following `Marker` pages: its results.
async fn simulate(
    ctx: &Context,
    principal: &str,
    sim: &Simulation,
) -> Result<Vec<EvaluationResult>, crate::aws::AwsError> {
    every_page(|marker| async move {
        let page = ctx
            .aws
            .iam(Operation::IamSimulatePrincipalPolicy, |c| {
                c.simulate_principal_policy()
                    .policy_source_arn(principal)
                    .set_action_names(Some(sim.actions.clone()))
                    .resource_arns(&sim.resource)
                    .set_context_entries(Some(sim.context.clone()))
                    .set_marker(marker.clone())
                    .send()
            })
            .await?;
        let next = page.marker().filter(|_| page.is_truncated());
        Ok((page.evaluation_results().to_vec(), next.map(str::to_string)))
    })
    .await
}

/// The check of a simulation the caller could not run.
fn unsimulated(error: &crate::aws::AwsError, principal: &Principal) -> Check {
    let name = "the CCM's ELB writes";
    if error.is_denied() {
        Check::of("iam", name).warn(
            format!(
                "not checked: whoever runs doctor may not call iam:SimulatePrincipalPolicy ({error})"
            ),
            format!(
                "grant the doctor's own credentials iam:SimulatePrincipalPolicy on {} (not the CCM's role: the CCM never calls it), or run doctor with credentials that have it",
                principal.arn
            ),
        )
    } else if error.is_not_found() {
        // IAM's `NoSuchEntity`: the principal does not exist.
        Check::of("iam", name).fail(
            format!("IAM has no principal {} (from {}): {error}", principal.arn, principal.from),
            "name the CCM's role: doctor --role-arn, or the ServiceAccount's eks.amazonaws.com/role-arn annotation (docs/install-irsa.md)",
        )
    } else {
        Check::of("iam", name).warn(
            format!(
                "not checked: the IAM simulation of {} failed ({error})",
                principal.arn
            ),
            "run doctor again; pass --role-arn with the CCM's role ARN if the principal is wrong",
        )
    }
}

/// The ELB write checks for `principal`: one failed check a denied action,
/// one pass line otherwise.
pub(crate) async fn checks(ctx: &Context, principal: &Principal) -> Vec<Check> {
    let fields: Vec<&str> = principal.arn.split(':').collect();
    let (partition, account) = match fields[..] {
        ["arn", partition, "iam", "", account, _] => (partition, account),
        _ => {
            return vec![Check::of("iam", "the CCM's ELB writes").warn(
                format!(
                    "not checked: {} (from {}) is not an IAM user or role ARN",
                    principal.arn, principal.from
                ),
                "pass doctor --role-arn arn:PARTITION:iam::ACCOUNT:role/NAME (the CCM's role)",
            )];
        }
    };
    let mut out = Vec::new();
    let mut allowed = 0;
    let sims = simulations(partition, &ctx.region, account, &ctx.cluster_id);
    for sim in &sims {
        let results = match simulate(ctx, &principal.arn, sim).await {
            Ok(results) => results,
            Err(e) => return vec![unsimulated(&e, principal)],
        };
        for r in results {
            if *r.eval_decision() == PolicyEvaluationDecisionType::Allowed {
                allowed += 1;
            } else {
                out.push(denial(sim, &r, principal, ctx));
            }
        }
    }
    if out.is_empty() {
        let mut detail = format!(
            "{allowed} action/resource pairs in {} simulations allowed by IAM for {} (from {})",
            sims.len(),
            principal.arn,
            principal.from
        );
        if let Some(note) = &principal.note {
            detail.push_str(&format!("; {note}"));
        }
        out.push(Check::of("iam", "the CCM's ELB writes").pass(detail));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assumed_role_session_becomes_its_role_without_path() {
        let (arn, note) =
            principal_of_caller("arn:aws:sts::123456789012:assumed-role/ccm-role/i-0abc")
                .expect("a role");
        assert_eq!(arn, "arn:aws:iam::123456789012:role/ccm-role");
        assert!(note.is_some_and(|n| n.contains("path")));
        let user = "arn:aws-cn:iam::123456789012:user/ops/alice";
        assert_eq!(principal_of_caller(user), Ok((user.to_string(), None)));
        assert!(principal_of_caller("arn:aws:iam::123456789012:root").is_err());
        assert!(principal_of_caller("arn:aws:sts::123456789012:federated-user/bob").is_err());
    }

    #[test]
    fn the_flag_then_the_service_account_then_the_caller() {
        let caller = || Ok("arn:aws:sts::123456789012:assumed-role/r/s".to_string());
        let flag = choose_principal(
            Some("arn:aws:iam::1:role/flag"),
            Ok(Some("x".into())),
            caller(),
        )
        .expect("principal");
        assert_eq!(
            (flag.arn.as_str(), flag.from.as_str()),
            ("arn:aws:iam::1:role/flag", "--role-arn")
        );
        let sa = choose_principal(None, Ok(Some("arn:aws:iam::1:role/sa".into())), caller())
            .expect("principal");
        assert_eq!(sa.arn, "arn:aws:iam::1:role/sa");
        assert!(sa.from.contains(IRSA_ANNOTATION));
        let own = choose_principal(None, Err("forbidden".into()), caller()).expect("principal");
        assert_eq!(own.arn, "arn:aws:iam::123456789012:role/r");
        let note = own.note.expect("notes");
        assert!(
            note.contains("forbidden") && note.contains("path"),
            "{note}"
        );
        assert!(choose_principal(None, Ok(None), Err("no credentials".into())).is_err());
    }

    #[test]
    fn every_elb_write_of_the_operation_table_is_simulated_once_per_shape() {
        let sims = simulations("aws", "us-east-1", "123456789012", "c1");
        // docs/aws-ccm-tool.md gives the number of calls.
        assert_eq!(sims.len(), 16);
        let simulated: Vec<String> = sims.iter().flat_map(|s| s.actions.clone()).collect();
        for op in Operation::ALL
            .iter()
            .filter(|op| matches!(op.service(), Service::Elb | Service::Elbv2))
        {
            let name = format!("elasticloadbalancing:{}", op.action());
            assert_eq!(simulated.contains(&name), op.is_mutating(), "{name}");
        }
        let create = sims
            .iter()
            .find(|s| s.mode == Mode::Create && s.shape == Shape::NetworkLoadBalancer)
            .expect("the NLB create");
        assert_eq!(create.actions, ["elasticloadbalancing:CreateLoadBalancer"]);
        assert!(create.context.iter().any(|e| {
            e.context_key_name() == Some("aws:RequestTag/kubernetes.io/cluster/c1")
                && e.context_key_values() == ["owned"]
        }));
        assert!(create.context.iter().all(|e| {
            !e.context_key_name()
                .unwrap_or("")
                .starts_with("aws:ResourceTag")
        }));
        let change = sims
            .iter()
            .find(|s| s.mode == Mode::Change && s.shape == Shape::TargetGroup)
            .expect("target group writes");
        assert!(
            change
                .actions
                .contains(&"elasticloadbalancing:RegisterTargets".to_string())
        );
        assert!(change.resource.contains(":targetgroup/"));
        assert!(
            sims.iter()
                .any(|s| s.mode == Mode::TagOnCreate("CreateTargetGroup"))
        );
    }

    #[test]
    fn the_named_statements_are_the_policys() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../iam/policy.json");
        let policy = std::fs::read_to_string(path).expect("iam/policy.json");
        for mode in [
            Mode::Create,
            Mode::Change,
            Mode::Retag,
            Mode::TagOnCreate("CreateLoadBalancer"),
        ] {
            let (sid, _) = grant(mode, "k");
            assert!(policy.contains(&format!("\"Sid\": \"{sid}\"")), "{sid}");
        }
    }
}
