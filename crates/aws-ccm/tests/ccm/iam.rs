//! The real binary against a fault proxy that enforces the rendered IAM
//! policy (`iam/render.sh policy ccm-test`) as AWS would: every request the
//! CCM makes is evaluated by the offline oracle first, and a denied one gets
//! `UnauthorizedOperation`/`AccessDenied` instead of reaching moto. A Classic
//! ELB and an NLB must be created, wired and deleted without one denial.

use std::time::Duration;

use ccm_testkit::aws_proxy::IamEnforcer;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::service::{hostname, lb_service, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);

/// The policy an operator renders for this cluster, with `options`.
pub fn rendered_policy(options: &[&str]) -> anyhow::Result<String> {
    let script = ccm_testkit::repo_path("iam/render.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .args(["policy", CLUSTER_ID])
        .args(options)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "render.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

fn explain(e: anyhow::Error, env: &Env, ccm: &Ccm) -> anyhow::Error {
    anyhow::anyhow!("{e}\ndenied: {:?}\nlogs:\n{}", denied(env), ccm.logs())
}

/// How many of the CCM's calls the enforcing proxy denied, per action.
fn denied(env: &Env) -> Vec<(String, u64)> {
    let calls = env.proxy.calls();
    calls
        .iter()
        .filter(|(_, _, c)| c.faulted > 0)
        .map(|(service, action, c)| (format!("{service}:{action}"), c.faulted))
        .collect()
}

#[tokio::test]
async fn load_balancers_are_created_and_deleted_under_the_enforced_policy() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&rendered_policy(&[])?)?));
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
    services
        .create(
            &PostParams::default(),
            &lb_service(
                "nlb",
                serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
            ),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    for name in ["clb", "nlb"] {
        eventually(&format!("{name} gets a hostname"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| explain(e, &env, &ccm))?;
    }
    assert_eq!(
        denied(&env),
        Vec::<(String, u64)>::new(),
        "logs:\n{}",
        ccm.logs()
    );

    for name in ["clb", "nlb"] {
        services.delete(name, &DeleteParams::default()).await?;
    }
    eventually("both Services gone (finalizers released)", WAIT, || async {
        let left = services.list(&Default::default()).await.ok()?;
        left.items.is_empty().then_some(())
    })
    .await
    .map_err(|e| explain(e, &env, &ccm))?;
    assert_eq!(
        denied(&env),
        Vec::<(String, u64)>::new(),
        "logs:\n{}",
        ccm.logs()
    );
    env.finish().await
}

/// `NLBNodeIngress = SharedBackendGroup` under the enforced policy: making
/// the shared group (CreateSecurityGroup with its tags), giving it to the
/// NLB (at CreateLoadBalancer), the node-group rule from it, and leaving the
/// mode (the CIDR rules back, the detach, the rule's revoke): not one denial.
#[tokio::test]
async fn the_shared_backend_group_is_made_used_and_left_under_the_enforced_policy()
-> anyhow::Result<()> {
    let managed = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    );
    let env =
        Env::start_with_conf(&format!("{managed}NLBNodeIngress = SharedBackendGroup\n")).await?;
    let seeded = seed_cluster(&env, 1).await?;
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&rendered_policy(&[])?)?));
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n1", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let nlb = serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"});
    services
        .create(&PostParams::default(), &lb_service("nlb", nlb))
        .await?;
    let group_rule = |g: &aws_sdk_ec2::types::SecurityGroup| {
        (g.ip_permissions().iter())
            .flat_map(|p| p.user_id_group_pairs())
            .filter_map(|p| p.group_id().map(str::to_string))
            .collect::<Vec<_>>()
    };
    let node_group = || async {
        let o = (seeded.ec2.describe_security_groups())
            .group_ids(&seeded.node_group)
            .send()
            .await
            .ok()?;
        o.security_groups().first().cloned()
    };
    let shared_id = || async {
        let o = (seeded.ec2.describe_security_groups())
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("group-name")
                    .values(format!("aws-ccm-backend-{CLUSTER_ID}"))
                    .build(),
            )
            .send()
            .await
            .ok()?;
        o.security_groups().first()?.group_id().map(str::to_string)
    };
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let shared = eventually("the NLB and the shared group's node rule", WAIT, || async {
        services.get("nlb").await.ok().as_ref().and_then(hostname)?;
        let id = shared_id().await?;
        (group_rule(&node_group().await?) == vec![id.clone()]).then_some(id)
    })
    .await
    .map_err(|e| explain(e, &env, &ccm))?;
    assert_eq!(
        denied(&env),
        Vec::<(String, u64)>::new(),
        "logs:\n{}",
        ccm.logs()
    );
    drop(ccm);

    std::fs::write(&env.cloud_conf, &managed)?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let elbv2 = aws_sdk_elasticloadbalancingv2::Client::new(&seeded.conf);
    // The NLB's groups, from AWS.
    let nlb_groups = || async {
        let o = elbv2.describe_load_balancers().send().await.ok()?;
        Some(o.load_balancers().first()?.security_groups().to_vec())
    };
    eventually(
        "the shared group's rule gone, CIDR rules back, the group detached",
        WAIT,
        || async {
            let g = node_group().await?;
            let cidr = (g.ip_permissions().iter()).any(|p| !p.ip_ranges().is_empty());
            let detached = !nlb_groups().await?.contains(&shared);
            (group_rule(&g).is_empty() && cidr && detached).then_some(())
        },
    )
    .await
    .map_err(|e| explain(e, &env, &ccm))?;
    assert_eq!(
        denied(&env),
        Vec::<(String, u64)>::new(),
        "logs:\n{}",
        ccm.logs()
    );
    let writes = env.proxy.calls();
    // A new NLB is created with both groups; the detach (seen above on
    // the NLB) is a SetSecurityGroups.
    assert!(
        writes
            .get("elasticloadbalancingv2", "SetSecurityGroups")
            .forwarded
            >= 1
    );
    assert!(
        writes.get("ec2", "CreateSecurityGroup").forwarded >= 1,
        "{shared}"
    );
    env.finish().await
}
