//! IAM: the CCM's start-up permission self-check, run as it runs at
//! start-up (a `DryRun` of each write on a real resource, and the probes for
//! actions a published policy lacks), each denial reported with its fix;
//! then the ELB writes, which have no `DryRun`, by IAM's policy simulator
//! ([`super::simulation`]).

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;

use super::simulation::{self, IRSA_ANNOTATION, Principal, SERVICE_ACCOUNT};
use super::{Check, Context};
use crate::aws::Operation;
use crate::controllers::permission_check::scope_for;
use crate::provider::permissions::{PermissionCheck, Verdict};

/// The self-check's lines, then the ELB writes' by simulation.
pub(crate) async fn checks(ctx: &Context, role_arn: Option<&str>) -> Vec<Check> {
    let mut out = dry_run_checks(ctx).await;
    if ctx.cluster_id.is_empty() {
        out.push(
            Check::of("iam", "the CCM's ELB writes")
                .skip("no cluster ID: the policy's conditions name it (see the cluster ID check)"),
        );
        return out;
    }
    match principal(ctx, role_arn).await {
        Ok(principal) => out.extend(simulation::checks(ctx, &principal).await),
        Err(why) => out.push(Check::of("iam", "the CCM's ELB writes").warn(
            format!("not checked: no principal to simulate ({why})"),
            "pass doctor --role-arn with the CCM's role ARN",
        )),
    }
    out
}

/// The principal whose ELB writes are simulated (see [`simulation`]).
async fn principal(ctx: &Context, role_arn: Option<&str>) -> Result<Principal, String> {
    if let Some(flag) = role_arn {
        return simulation::choose_principal(Some(flag), Ok(None), Err("not asked".to_string()));
    }
    let (namespace, name) = SERVICE_ACCOUNT;
    let accounts: Api<ServiceAccount> = Api::namespaced(ctx.kube.clone(), namespace);
    let annotation = (accounts.get_opt(name).await)
        .map(|found| {
            found
                .and_then(|sa| sa.metadata.annotations?.remove(IRSA_ANNOTATION))
                .filter(|arn| !arn.is_empty())
        })
        .map_err(|e| e.to_string());
    let caller = ctx
        .aws
        .sts(Operation::StsGetCallerIdentity, |c| {
            c.get_caller_identity().send()
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|who| {
            who.arn()
                .map(str::to_string)
                .ok_or_else(|| "sts:GetCallerIdentity named no ARN".to_string())
        });
    simulation::choose_principal(None, annotation, caller)
}

/// One check per denied write or missing action; one pass line otherwise.
async fn dry_run_checks(ctx: &Context) -> Vec<Check> {
    let scope = scope_for(&ctx.validated, &ctx.cloud, &ctx.cluster_id);
    let findings = ctx.aws.check_writes(&scope).await;
    let gaps = ctx.aws.missing_actions(&scope).await;
    let mut out = Vec::new();
    let mut allowed = Vec::new();
    for f in &findings {
        let what = format!("{} on {}", f.probe.action(), f.probe.resource_id());
        match &f.verdict {
            Verdict::Allowed => allowed.push(what),
            Verdict::Denied(denial) => {
                let mut fix = format!("tag {} {}", denial.resource_id, denial.missing_tag);
                if let Some(option) = &denial.render_option {
                    fix.push_str(&format!(
                        ", or render the policy with iam/render.sh {option}"
                    ));
                }
                out.push(Check::of("iam", what).fail(denial.to_string(), fix));
            }
            Verdict::Unknown => out.push(Check::of("iam", what).warn(
                "the DryRun got no answer (throttled, or an endpoint that ignores DryRun)",
                "run again; the CCM itself goes ahead and the write's own answer decides",
            )),
        }
    }
    for gap in &gaps {
        out.push(Check::of("iam", gap.action).fail(
            gap.description.clone(),
            format!(
                "grant {} to the CCM's role (iam/render.sh policy {})",
                gap.action, ctx.cluster_id
            ),
        ));
    }
    if out.is_empty() {
        let detail = if allowed.is_empty() {
            "no write to probe (no cluster instance, group or route table found); no action missing"
                .to_string()
        } else {
            format!(
                "allowed by DryRun: {}; no action missing",
                allowed.join(", ")
            )
        };
        out.push(Check::of("iam", "the CCM's writes").pass(detail));
    }
    out
}
