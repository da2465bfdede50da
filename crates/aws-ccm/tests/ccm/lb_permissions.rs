//! Issue 16, the service path: load-balancer writes the least-privilege
//! policy denies are refused up front, under the fault proxy's ENFORCED
//! policy (`iam/render.sh policy ccm-test`, evaluated as AWS would). A node
//! whose only security group is untagged (kubeadm's usual setup), and an NLB
//! listener made without tags (the Go CCM before 2022): the write is
//! skipped with a Warning event on the Service, the rest of the load
//! balancer syncs, and the proxy denies nothing.

use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use ccm_testkit::aws_proxy::IamEnforcer;
use elbv2::types::{Action as LbAction, ActionTypeEnum, ProtocolEnum, Tag as LbTag};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::PostParams;

use crate::iam::rendered_policy;
use crate::routes::events_for;
use crate::service::{hostname, lb_service, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);
const NLB: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

/// Denied calls at the proxy, per action (DryRuns count as
/// `<Action>+DryRun`: a denied DryRun is the check, not a refused write).
fn denied_writes(env: &Env) -> Vec<(String, u64)> {
    env.proxy
        .calls()
        .iter()
        .filter(|(_, action, c)| c.faulted > 0 && !action.ends_with("+DryRun"))
        .map(|(service, action, c)| (format!("{service}:{action}"), c.faulted))
        .collect()
}

/// Real (not DryRun) calls of `action` whose `param` is `value`.
fn real_calls(env: &Env, action: &str, param: &str, value: &str) -> usize {
    env.proxy
        .requests(action)
        .iter()
        .filter(|c| c.params.get(param).map(String::as_str) == Some(value))
        .filter(|c| c.params.get("DryRun").map(String::as_str) != Some("true"))
        .count()
}

/// A node instance whose only security group carries no tag at all.
async fn untagged_node(seeded: &Seeded) -> anyhow::Result<(String, String)> {
    let group = seeded
        .ec2
        .create_security_group()
        .group_name("kubeadm-nodes")
        .description("nodes, as kubeadm leaves them")
        .vpc_id(&seeded.vpc)
        .send()
        .await?
        .group_id
        .unwrap_or_default();
    let instance = seeded.launch_in(&group, 1).await?.remove(0);
    Ok((group, instance))
}

async fn ingress_rules(seeded: &Seeded, group: &str) -> anyhow::Result<usize> {
    let out = seeded
        .ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .map(|g| g.ip_permissions().len())
        .sum())
}

/// One node (in `instance`), a classic ELB Service and an NLB Service.
async fn create_objects(env: &Env, instance: &str) -> anyhow::Result<Api<Service>> {
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n1", instance))
        .await?;
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("clb", serde_json::json!({})),
        )
        .await?;
    services
        .create(
            &PostParams::default(),
            &lb_service("nlb", serde_json::json!({NLB: "nlb"})),
        )
        .await?;
    Ok(services)
}

#[tokio::test]
async fn an_untagged_node_group_is_skipped_with_a_warning_and_the_load_balancers_sync()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let (group, instance) = untagged_node(&seeded).await?;
    env.proxy.record_requests(true);
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&rendered_policy(&[])?)?));
    let services = create_objects(&env, &instance).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;

    for name in ["clb", "nlb"] {
        eventually(&format!("{name} gets a hostname"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| e.context(ccm.logs()))?;
        let event = eventually(
            &format!("SecurityGroupUnauthorized on {name}"),
            WAIT,
            || async {
                events_for(&env, name, "SecurityGroupUnauthorized")
                    .await
                    .pop()
            },
        )
        .await
        .map_err(|e| e.context(ccm.logs()))?;
        let note = event.note.unwrap_or_default();
        for needle in [
            format!("node security group {group}"),
            format!("security-group/{group}"),
            "kubernetes.io/cluster/ccm-test=shared".into(),
            format!("iam/render.sh --security-group {group}"),
        ] {
            assert!(note.contains(&needle), "{needle} in {note}");
        }
    }
    let logs = ccm.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("node security group write refused")
                && l.contains(&group)
                && l.contains("default/nlb")),
        "a log line names the Service and the group: {logs}"
    );
    assert_eq!(denied_writes(&env), Vec::<(String, u64)>::new(), "{logs}");
    for action in [
        "AuthorizeSecurityGroupIngress",
        "RevokeSecurityGroupIngress",
    ] {
        assert_eq!(real_calls(&env, action, "GroupId", &group), 0, "{action}");
    }
    assert_eq!(ingress_rules(&seeded, &group).await?, 0);
    env.finish().await
}

#[tokio::test]
async fn a_node_group_the_policy_names_gets_its_rules() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let (group, instance) = untagged_node(&seeded).await?;
    env.proxy.record_requests(true);
    let options = ["--security-group", group.as_str()];
    env.proxy.set_iam_policy_options(&options);
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&rendered_policy(&options)?)?));
    let services = create_objects(&env, &instance).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;

    for name in ["clb", "nlb"] {
        eventually(&format!("{name} gets a hostname"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    }
    // The classic ELB's group rule and the NLB's client and health rules.
    eventually("the rules are in the node group", WAIT, || async {
        (ingress_rules(&seeded, &group).await.ok()? >= 2).then_some(())
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    assert!(real_calls(&env, "AuthorizeSecurityGroupIngress", "GroupId", &group) >= 2);
    // (An allowed DryRun is answered by the enforcing proxy, so it counts
    // as faulted there: only real calls are looked at.)
    assert_eq!(
        denied_writes(&env),
        Vec::<(String, u64)>::new(),
        "{}",
        ccm.logs()
    );
    for name in ["clb", "nlb"] {
        assert!(
            events_for(&env, name, "SecurityGroupUnauthorized")
                .await
                .is_empty()
        );
    }
    env.finish().await
}

/// An NLB as the Go CCM made it before 2022 for the Service with `uid`:
/// the load balancer tagged owned, its listeners (ports `old_ports`)
/// untagged. Returns the listener ARNs.
async fn legacy_nlb(seeded: &Seeded, uid: &str, old_ports: &[i32]) -> anyhow::Result<Vec<String>> {
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let owned = |k: &str, v: &str| LbTag::builder().key(k).value(v).build();
    let lb = elbv2
        .create_load_balancer()
        .name(aws_ccm::aws::elb::load_balancer_name(uid))
        .r#type(elbv2::types::LoadBalancerTypeEnum::Network)
        .subnets(&seeded.subnet)
        .tags(owned("kubernetes.io/cluster/ccm-test", "owned"))
        .tags(owned("kubernetes.io/service-name", "default/nlb"))
        .send()
        .await?;
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap_or_default()
        .to_string();
    let tg = elbv2
        .create_target_group()
        .name("legacy-tg")
        .protocol(ProtocolEnum::Tcp)
        .port(31000)
        .vpc_id(&seeded.vpc)
        .send()
        .await?;
    let tg_arn = tg.target_groups()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string();
    let mut arns = Vec::new();
    for port in old_ports {
        let l = elbv2
            .create_listener()
            .load_balancer_arn(&lb_arn)
            .protocol(ProtocolEnum::Tcp)
            .port(*port)
            .default_actions(
                LbAction::builder()
                    .r#type(ActionTypeEnum::Forward)
                    .target_group_arn(&tg_arn)
                    .build(),
            )
            .send()
            .await?;
        arns.push(
            l.listeners()[0]
                .listener_arn()
                .unwrap_or_default()
                .to_string(),
        );
    }
    Ok(arns)
}

#[tokio::test]
async fn untagged_nlb_listeners_are_left_alone_with_a_warning() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n1", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client, "default");
    // Port 80 now; the old NLB listens on 80 (to another target group: a
    // ModifyListener) and on 8080 (a port the Service dropped: a
    // DeleteListener). A second port, 81, gets a new listener.
    let mut svc = lb_service("nlb", serde_json::json!({NLB: "nlb"}));
    if let Some(ports) = svc.spec.as_mut().and_then(|s| s.ports.as_mut()) {
        let mut second = ports[0].clone();
        second.name = Some("alt".into());
        second.port = 81;
        ports.push(second);
    }
    let svc = services.create(&PostParams::default(), &svc).await?;
    let uid = svc.metadata.uid.clone().unwrap_or_default();
    let old = legacy_nlb(&seeded, &uid, &[80, 8080]).await?;
    env.proxy.record_requests(true);
    env.proxy
        .enforce_iam(Some(IamEnforcer::from_repo(&rendered_policy(&[])?)?));
    let ccm = env.start_ccm(&["--controllers=service"]).await?;

    eventually("nlb gets a hostname", WAIT, || async {
        services.get("nlb").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let event = eventually("ListenerUnauthorized on nlb", WAIT, || async {
        events_for(&env, "nlb", "ListenerUnauthorized").await.pop()
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let note = event.note.unwrap_or_default();
    let mut sorted = old.clone();
    sorted.sort();
    let fix = format!(
        "aws elbv2 add-tags --resource-arns {} --tags Key=kubernetes.io/cluster/ccm-test,Value=owned",
        sorted.join(" ")
    );
    assert!(note.contains(&fix), "{fix} in {note}");
    for arn in &old {
        for action in ["ModifyListener", "DeleteListener"] {
            assert_eq!(
                real_calls(&env, action, "ListenerArn", arn),
                0,
                "{action} {arn}"
            );
        }
    }
    assert_eq!(
        denied_writes(&env),
        Vec::<(String, u64)>::new(),
        "{}",
        ccm.logs()
    );

    // The new listener (81) was made by the CCM, tagged owned at creation.
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let created = eventually("the listener on 81", WAIT, || async {
        let lb = elbv2
            .describe_load_balancers()
            .names(aws_ccm::aws::elb::load_balancer_name(&uid))
            .send()
            .await
            .ok()?;
        let lb_arn = lb
            .load_balancers()
            .first()?
            .load_balancer_arn()?
            .to_string();
        let listeners = elbv2
            .describe_listeners()
            .load_balancer_arn(lb_arn)
            .send()
            .await
            .ok()?;
        listeners
            .listeners()
            .iter()
            .find(|l| l.port() == Some(81))
            .and_then(|l| l.listener_arn().map(str::to_string))
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let tags = elbv2.describe_tags().resource_arns(&created).send().await?;
    let owned = tags
        .tag_descriptions()
        .iter()
        .flat_map(|d| d.tags())
        .any(|t| t.key() == Some("kubernetes.io/cluster/ccm-test") && t.value() == Some("owned"));
    assert!(owned, "{tags:?}");
    env.finish().await
}

#[tokio::test]
async fn a_real_call_iam_refuses_is_recorded_and_not_retried_by_the_next_sync() -> anyhow::Result<()>
{
    use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let group = seeded.node_group.clone();
    env.proxy.record_requests(true);
    // The node group carries the cluster tag, so no DryRun asks first; IAM
    // (a policy changed under the running CCM, say) refuses the real call.
    // Aimed at the NLB's node-rules call (its first rule is the MTU rule),
    // not at the start-up self-check's DryRun.
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 403,
            code: "UnauthorizedOperation".into(),
            message: "You are not authorized to perform this operation.".into(),
        })
        .for_service("ec2")
        .for_action("AuthorizeSecurityGroupIngress")
        .with_param("GroupId", group.as_str())
        .with_param(
            "IpPermissions.1.IpRanges.1.Description",
            "kubernetes.io/rule/nlb/mtu",
        ),
    ]);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n1", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("nlb", serde_json::json!({NLB: "nlb"})),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("nlb gets a hostname", WAIT, || async {
        services.get("nlb").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let event = eventually("SecurityGroupUnauthorized on nlb", WAIT, || async {
        events_for(&env, "nlb", "SecurityGroupUnauthorized")
            .await
            .pop()
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let note = event.note.unwrap_or_default();
    assert!(note.contains(&format!("security-group/{group}")), "{note}");
    assert!(note.contains("still denied"), "{note}");
    let refused = || real_calls(&env, "AuthorizeSecurityGroupIngress", "GroupId", &group);
    assert_eq!(refused(), 1, "{}", ccm.logs());

    // A second node: the next sync registers it and does not ask again.
    nodes
        .create(&PostParams::default(), &node("n2", &seeded.instances[1]))
        .await?;
    eventually("the sync for n2 is done", WAIT, || async {
        events_for(&env, "nlb", "UpdatedLoadBalancer").await.pop()
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(refused(), 1, "{}", ccm.logs());
    for reason in ["SyncLoadBalancerFailed", "UpdateLoadBalancerFailed"] {
        assert!(events_for(&env, "nlb", reason).await.is_empty(), "{reason}");
    }
    env.finish().await
}
