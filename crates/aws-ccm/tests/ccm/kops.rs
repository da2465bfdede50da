//! kOps option 1 (docs/install-kops.md): this binary in kOps' own addon,
//! under the IAM policy kOps gives its CCM (`iam/kops-ccm-policy.json`, a
//! model of kOps' `AddCCMPermissions`) plus `iam/render.sh policy <cluster>
//! --kops-additions`, enforced by the fault proxy as AWS would. kOps
//! conditions every create on `aws:RequestTag/KubernetesCluster`, so this
//! works only because the CCM writes the legacy tag on a cluster that uses
//! it: the recorded creates are allowed as sent, and each is denied once
//! its `KubernetesCluster` tag is taken out.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types::Tag;
use ccm_testkit::aws_proxy::IamEnforcer;
use ccm_testkit::iam::{self, AuthorizationTable, Policy, RecordedRequest};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;

use crate::iam::rendered_policy;
use crate::service::{hostname, lb_service, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

/// kOps' CCM policy for this cluster plus the documented additions, as
/// one policy document.
fn kops_policy() -> anyhow::Result<String> {
    let path = ccm_testkit::repo_path("iam/kops-ccm-policy.json");
    let text = std::fs::read_to_string(&path)?
        .replace("CLUSTER_ID", CLUSTER_ID)
        .replace("PARTITION", "aws");
    let mut doc: Value = serde_json::from_str(&text)?;
    let additions: Value = serde_json::from_str(&rendered_policy(&["--kops-additions"])?)?;
    let statements = doc["Statement"]
        .as_array_mut()
        .ok_or_else(|| anyhow::anyhow!("{}: no Statement array", path.display()))?;
    statements.extend(additions.as_array().cloned().unwrap_or_default());
    Ok(doc.to_string())
}

/// How many real (not DryRun) calls the enforcing proxy denied, per action.
/// DryRun denials are the start-up permission check asking, not failures.
fn denied_writes(env: &Env) -> Vec<(String, usize)> {
    let mut out = BTreeMap::new();
    for (service, action, c) in env.proxy.calls().iter() {
        if c.faulted == 0 {
            continue;
        }
        let dry = env
            .proxy
            .requests(action)
            .iter()
            .filter(|r| r.params.get("DryRun").map(String::as_str) == Some("true"))
            .count() as u64;
        if c.faulted > dry {
            out.insert(format!("{service}:{action}"), (c.faulted - dry) as usize);
        }
    }
    out.into_iter().collect()
}

/// The request without its `KubernetesCluster` tag (CLB/ELBv2 `Tags.member.N`,
/// EC2 `TagSpecification.1.Tag.N`).
fn without_legacy_tag(params: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let prefixes: Vec<String> = params
        .iter()
        .filter(|(k, v)| k.ends_with(".Key") && v.as_str() == "KubernetesCluster")
        .map(|(k, _)| k.trim_end_matches("Key").to_string())
        .collect();
    params
        .iter()
        .filter(|(k, _)| !prefixes.iter().any(|p| k.starts_with(p.as_str())))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn first_denial(
    policy: &Policy,
    table: &AuthorizationTable,
    r: &RecordedRequest,
) -> Option<String> {
    iam::first_denial(policy, table, r, "aws")
        .unwrap_or_else(|e| panic!("the oracle cannot map {} {}: {e}", r.service, r.action))
        .map(|(auth, _)| format!("{} on {}", auth.action, auth.resource))
}

#[tokio::test]
async fn under_kops_policy_load_balancers_work_only_with_the_legacy_tag() -> anyhow::Result<()> {
    // kOps tags every instance and its node group with both tags; the
    // cluster uses the legacy one (KubernetesClusterTag, upstream's key).
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterTag = {CLUSTER_ID}\n"
    ))
    .await?;
    let seeded = seed_cluster(&env, 1).await?;
    seeded
        .ec2
        .create_tags()
        .resources(&seeded.node_group)
        .resources(&seeded.instances[0])
        .tags(
            Tag::builder()
                .key("KubernetesCluster")
                .value(CLUSTER_ID)
                .build(),
        )
        .send()
        .await?;
    let policy_json = kops_policy()?;
    env.proxy.record_requests(true);
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&policy_json)?));
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("clb", serde_json::json!({})),
        )
        .await?;
    let nlb = serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"});
    services
        .create(&PostParams::default(), &lb_service("nlb", nlb))
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    for name in ["clb", "nlb"] {
        eventually(&format!("{name} gets a hostname"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e}\ndenied: {:?}\nlogs:\n{}",
                denied_writes(&env),
                ccm.logs()
            )
        })?;
    }
    assert_eq!(denied_writes(&env), vec![], "logs:\n{}", ccm.logs());

    // Every create the CCM sent carries the legacy tag and is allowed; the
    // same request without it is denied by kOps' policy.
    let policy = Policy::parse(&policy_json).map_err(anyhow::Error::msg)?;
    let table = AuthorizationTable::parse(&std::fs::read_to_string(ccm_testkit::repo_path(
        "iam/authorization.json",
    ))?)
    .map_err(anyhow::Error::msg)?;
    let mut checked = BTreeMap::<String, usize>::new();
    for action in [
        "CreateLoadBalancer",
        "CreateTargetGroup",
        "CreateListener",
        "CreateSecurityGroup",
    ] {
        for call in env.proxy.requests(action) {
            let request = RecordedRequest {
                service: call.service.clone(),
                action: call.action.clone(),
                region: REGION.into(),
                params: call.params.clone(),
                tags: BTreeMap::new(),
                policy_options: Vec::new(),
            };
            assert!(
                call.params.iter().any(|(k, v)| k.ends_with(".Value")
                    && v == CLUSTER_ID
                    && call
                        .params
                        .get(&k.replace(".Value", ".Key"))
                        .map(String::as_str)
                        == Some("KubernetesCluster")),
                "{} {action} without KubernetesCluster={CLUSTER_ID}: {:?}",
                call.service,
                call.params
            );
            assert_eq!(first_denial(&policy, &table, &request), None, "{action}");
            let stripped = RecordedRequest {
                params: without_legacy_tag(&call.params),
                ..request
            };
            assert!(
                first_denial(&policy, &table, &stripped).is_some(),
                "{} {action} is allowed without the legacy tag: {:?}",
                call.service,
                stripped.params
            );
            *checked
                .entry(format!("{}:{action}", call.service))
                .or_default() += 1;
        }
    }
    // A classic ELB and its group, an NLB with its target group and listener.
    for key in [
        "elasticloadbalancing:CreateLoadBalancer",
        "ec2:CreateSecurityGroup",
        "elasticloadbalancingv2:CreateLoadBalancer",
        "elasticloadbalancingv2:CreateTargetGroup",
        "elasticloadbalancingv2:CreateListener",
    ] {
        assert!(checked.contains_key(key), "no {key} recorded: {checked:?}");
    }

    for name in ["clb", "nlb"] {
        services.delete(name, &DeleteParams::default()).await?;
    }
    eventually("both Services gone (finalizers released)", WAIT, || async {
        let left = services.list(&Default::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await
    .map_err(|e| {
        anyhow::anyhow!(
            "{e}\ndenied: {:?}\nlogs:\n{}",
            denied_writes(&env),
            ccm.logs()
        )
    })?;
    assert_eq!(denied_writes(&env), vec![], "logs:\n{}", ccm.logs());
    env.finish().await
}

/// kOps' policy without the additions: the start-up check names each
/// action it lacks once (log, `PolicyLacksAction`, metric) with the exact
/// additionalPolicies fix, instead of every sync finding out.
#[tokio::test]
async fn actions_kops_policy_lacks_are_reported_once_at_start_up() -> anyhow::Result<()> {
    use crate::routes::{Cloud, route_args};
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterTag = {CLUSTER_ID}\n"
    ))
    .await?;
    let cloud = Cloud::new(&env).await?;
    // kOps tags its route table and instances with both tags.
    let table = cloud.route_table(true).await?;
    let ids = cloud.instances(1).await?;
    cloud
        .ec2
        .create_tags()
        .resources(&table)
        .resources(&ids[0])
        .tags(
            Tag::builder()
                .key("KubernetesCluster")
                .value(CLUSTER_ID)
                .build(),
        )
        .send()
        .await?;
    let path = ccm_testkit::repo_path("iam/kops-ccm-policy.json");
    let kops_only = std::fs::read_to_string(&path)?
        .replace("CLUSTER_ID", CLUSTER_ID)
        .replace("PARTITION", "aws");
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&kops_only)?));
    let mut args = route_args(&[]);
    args[0] = "--controllers=service,route".into();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ccm = env.start_ccm(&args).await?;
    let problems = self_check_problems(&ccm, WAIT)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(problems, 2, "{}", ccm.logs());
    let logs = ccm.logs();
    for action in ["elasticloadbalancing:DescribeTags", "ec2:ReplaceRoute"] {
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| {
                l.contains("permission self-check: the IAM policy lacks") && l.contains(action)
            })
            .collect();
        assert_eq!(lines.len(), 1, "{action} once in {logs}");
        let fix = format!("iam/render.sh policy {CLUSTER_ID} --kops-additions");
        assert!(lines[0].contains(&fix), "{}", lines[0]);
        assert!(lines[0].contains("additionalPolicies"), "{}", lines[0]);
    }
    let addr = ccm.https_addr().await?;
    let lines = ["elasticloadbalancing:DescribeTags", "ec2:ReplaceRoute"]
        .map(|action| format!("aws_ccm_iam_policy_missing_action{{action=\"{action}\"}} 1"));
    metrics_with(&addr, &lines.each_ref().map(String::as_str), WAIT).await?;
    // Actions kOps grants are not reported.
    assert!(!logs.contains("lacks ec2:CreateRoute"), "{logs}");

    // With the additions, nothing is missing.
    drop(ccm);
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&kops_policy()?)?));
    let ccm = env.start_ccm(&args).await?;
    let problems = self_check_problems(&ccm, WAIT)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(problems, 0, "{}", ccm.logs());
    let addr = ccm.https_addr().await?;
    let m = metrics_with(&addr, &[], WAIT).await?;
    assert!(!m.contains("aws_ccm_iam_policy_missing_action{"), "{m}");
    env.finish().await
}
