//! Runs the start-up permission self-check ([`PermissionCheck`], on AWS
//! `aws::permissions::self_check`) once the controllers start (after leader election), and reports each
//! denial: one log line with the IAM action, the resource ARN and the fix,
//! and a Warning event `PermissionDenied`. The event regards the CCM's own
//! Pod when `POD_NAME` and `POD_NAMESPACE` are set (the downward API, as in
//! manifests/base/daemonset.yaml), else the `kube-system` Namespace.

use std::sync::LazyLock;

use k8s_openapi::api::core::v1::ObjectReference;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::Environment;
use crate::cloud_config::CloudConfig;
use crate::options::Validated;
use crate::options::controller_names::ControllerName;
use crate::provider::Cloud;
use crate::provider::permissions::{Scope, Verdict};

/// Reason of the start-up Warning event for each denied write.
const EVENT_PERMISSION_DENIED: &str = "PermissionDenied";

/// Reason of the start-up Warning event for an action the policy lacks
/// altogether (e.g. kOps' own CCM policy without the additions).
const EVENT_POLICY_LACKS_ACTION: &str = "PolicyLacksAction";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

/// `aws_ccm_iam_policy_missing_action{action}`: 1 for each action the
/// start-up check found the policy lacking.
static MISSING: LazyLock<Family<ActionLabels, Gauge>> = LazyLock::new(|| {
    let family = Family::<ActionLabels, Gauge>::default();
    crate::metrics::register(
        "aws_ccm_iam_policy_missing_action",
        "1 for each IAM action the start-up permission check found the policy lacking (docs/iam-self-check.md)",
        family.clone(),
    );
    family
});

/// `aws_ccm_iam_self_check_problems`: how many writes the start-up check
/// found denied plus how many actions it found the policy lacking; absent
/// until the check has run, so 0 says "checked, nothing wrong".
static PROBLEMS: LazyLock<Gauge> = LazyLock::new(|| {
    let gauge = Gauge::default();
    crate::metrics::register(
        "aws_ccm_iam_self_check_problems",
        "Denied writes plus missing IAM actions the start-up permission check found; absent until it has run (docs/iam-self-check.md)",
        gauge.clone(),
    );
    gauge
});

/// What the events regard: the CCM's Pod, else the `kube-system` Namespace.
fn event_subject(pod_name: Option<String>, pod_namespace: Option<String>) -> ObjectReference {
    let pod_name = pod_name.filter(|n| !n.is_empty());
    let (kind, name, namespace) = match (pod_name, pod_namespace.filter(|n| !n.is_empty())) {
        (Some(name), Some(namespace)) => ("Pod", name, Some(namespace)),
        _ => ("Namespace", "kube-system".to_string(), None),
    };
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace,
        ..Default::default()
    }
}

/// The writes the enabled controllers will make, from the options,
/// cloud.conf and the cluster ID (also what `aws-ccm doctor` checks).
pub(crate) fn scope_for(opts: &Validated, cloud: &CloudConfig, cluster_id: &str) -> Scope {
    let enabled = |c| opts.controllers.contains(&c);
    let routes = (enabled(ControllerName::Route) && opts.options.configure_cloud_routes)
        .then(|| opts.cluster_cidrs.as_ref()?.cidrs().first().copied())
        .flatten()
        .map(|destination| (super::route::table_selector(cloud, cluster_id), destination));
    Scope {
        routes,
        node_groups: enabled(ControllerName::Service) && !cloud.disable_security_group_ingress,
        tagging: enabled(ControllerName::Tagging),
        load_balancers: enabled(ControllerName::Service),
    }
}

/// Runs the self-check and reports what it found.
pub(crate) async fn run<C: Cloud>(env: Environment<C>) {
    let scope = scope_for(&env.options, &env.cloud, &env.cluster_id);
    let findings = env.provider.check_writes(&scope).await;
    let events = super::events::Events::new(env.kube.clone(), "cloud-controller-manager");
    let subject = event_subject(
        std::env::var("POD_NAME").ok(),
        std::env::var("POD_NAMESPACE").ok(),
    );
    let mut denied = 0;
    for finding in &findings {
        match &finding.verdict {
            Verdict::Denied(denial) => {
                denied += 1;
                tracing::warn!(
                    iam_action = denial.action.iam_action(),
                    resource_arn = %denial.resource_arn,
                    missing_tag = %denial.missing_tag,
                    fix = denial.render_option.as_deref().unwrap_or("widen the policy"),
                    "permission self-check: {denial}"
                );
                events
                    .warning(&subject, EVENT_PERMISSION_DENIED, denial.to_string())
                    .await;
            }
            Verdict::Allowed => {
                tracing::debug!(action = %finding.probe.action(), resource = finding.probe.resource_id(), "permission self-check: allowed")
            }
            Verdict::Unknown => {}
        }
    }
    let gaps = env.provider.missing_actions(&scope).await;
    for gap in &gaps {
        denied += 1;
        let text = gap.description.clone();
        tracing::warn!(iam_action = gap.action, "permission self-check: {text}");
        MISSING
            .get_or_create(&ActionLabels {
                action: gap.action.to_string(),
            })
            .set(1);
        events
            .warning(&subject, EVENT_POLICY_LACKS_ACTION, text)
            .await;
    }
    tracing::info!(
        checked = findings.len(),
        denied,
        policy_lacks = gaps.len(),
        "permission self-check done"
    );
    PROBLEMS.set(denied);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_regard_the_pod_else_the_kube_system_namespace() {
        let pod = event_subject(Some("ccm-abc".into()), Some("kube-system".into()));
        assert_eq!(pod.kind.as_deref(), Some("Pod"));
        assert_eq!(pod.name.as_deref(), Some("ccm-abc"));
        assert_eq!(pod.namespace.as_deref(), Some("kube-system"));
        let fallback = event_subject(Some("ccm-abc".into()), None);
        assert_eq!(fallback.kind.as_deref(), Some("Namespace"));
        assert_eq!(fallback.name.as_deref(), Some("kube-system"));
        assert_eq!(fallback.namespace, None);
    }
}
