//! Credentials and identity (`sts:GetCallerIdentity` through the one door),
//! the region and the cluster ID, each with where it came from.

use super::{Check, Context};
use crate::aws::Operation;

/// How the SDK's default chain (environment, profile, web identity,
/// container, instance metadata: the order of
/// `aws_config::default_provider::credentials`) finds credentials here,
/// read from the variables `env` gives; with cloud.conf `RoleARN`, the role
/// assumed with them. A description for people, not a second chain: the
/// call itself ([`checks`]) is what proves the credentials work.
pub(crate) fn credential_source(
    env: impl Fn(&str) -> Option<String>,
    role_arn: Option<&str>,
) -> String {
    let set = |name: &str| env(name).filter(|v| !v.is_empty());
    let base = if set("AWS_ACCESS_KEY_ID").is_some() {
        "environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)".to_string()
    } else if let Some(profile) = set("AWS_PROFILE") {
        format!("the shared config profile {profile} (AWS_PROFILE)")
    } else if let (Some(token), Some(role)) =
        (set("AWS_WEB_IDENTITY_TOKEN_FILE"), set("AWS_ROLE_ARN"))
    {
        format!("IRSA web identity: role {role}, token file {token}")
    } else if set("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_some()
        || set("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_some()
    {
        "the container credentials endpoint (EKS Pod Identity or ECS task role)".to_string()
    } else {
        "the shared config files' default profile if they hold credentials, else the instance profile (instance metadata)".to_string()
    };
    match role_arn {
        Some(role) => format!("role {role} (cloud.conf RoleARN), assumed with {base}"),
        None => base,
    }
}

/// What to do when the credentials do not work, by where they came from.
fn credentials_fix(source: &str) -> String {
    if source.starts_with("IRSA") {
        "check the service account's eks.amazonaws.com/role-arn annotation and the role's trust policy (docs/install-irsa.md, iam/trust-policy.json)".to_string()
    } else if source.starts_with("environment") {
        "the keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) are refused: replace them".to_string()
    } else {
        "give the CCM credentials: an instance profile on the control-plane nodes, or IRSA (docs/install-irsa.md)".to_string()
    }
}

/// Credentials, region and cluster ID.
pub(crate) async fn checks(ctx: &Context) -> Vec<Check> {
    let source = credential_source(|k| std::env::var(k).ok(), ctx.cloud.role_arn.as_deref());
    let call = ctx
        .aws
        .sts(Operation::StsGetCallerIdentity, |c| {
            c.get_caller_identity().send()
        })
        .await;
    let credentials = match call {
        Ok(who) => Check::of("aws", "credentials").pass(format!(
            "{} (account {}), found through {source}",
            who.arn().unwrap_or("?"),
            who.account().unwrap_or("?")
        )),
        Err(e) => Check::of("aws", "credentials").fail(
            format!("sts:GetCallerIdentity failed ({e}); credentials found through {source}"),
            credentials_fix(&source),
        ),
    };
    let region =
        Check::of("aws", "region").pass(format!("{} from {}", ctx.region, ctx.region_from));
    let cluster = if ctx.cluster_id.is_empty() {
        Check::of("cluster", "cluster ID").warn(
            format!("none ({})", ctx.cluster_id_from),
            "set KubernetesClusterID in the [Global] section of cloud.conf: without it nothing can be attributed to this cluster",
        )
    } else {
        Check::of("cluster", "cluster ID")
            .pass(format!("{} from {}", ctx.cluster_id, ctx.cluster_id_from))
    };
    vec![credentials, region, cluster]
}
