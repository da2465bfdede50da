//! IAM: the CCM's start-up permission self-check, run as it runs at
//! start-up (a `DryRun` of each write on a real resource, and the probes for
//! actions a published policy lacks), each denial reported with its fix.

use super::{Check, Context};
use crate::controllers::permission_check::scope_for;
use crate::provider::permissions::{PermissionCheck, Verdict};

/// One check per denied write or missing action; one pass line otherwise.
pub async fn checks(ctx: &Context) -> Vec<Check> {
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
                let fix = match &denial.render_option {
                    Some(option) => format!(
                        "tag {} {}, or render the policy with iam/render.sh {option}",
                        denial.resource_id, denial.missing_tag
                    ),
                    None => format!("tag {} {}", denial.resource_id, denial.missing_tag),
                };
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
