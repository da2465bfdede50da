//! The CCM against a harsh AWS: answers lost after AWS applied the call, and
//! objects invisible for a while after they were created (eventual
//! consistency). Each create and delete kind loses one answer; the Service
//! must still converge with no failed sync surfaced as a Warning, no
//! duplicate, and nothing left behind once it is deleted.

use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use ccm_testkit::aws_proxy::{
    AnswerLoss, FaultKind, FaultRule, SERVICE_EC2, SERVICE_ELB, SERVICE_ELBV2,
};
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::nlb;
use crate::service::{hostname, lb_service, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);
/// How long a created object stays invisible to describes and to calls
/// naming it.
const CONSISTENCY_WINDOW: Duration = Duration::from_millis(1500);

/// One lost answer (AWS applied the call, the connection was then reset)
/// for each of `actions` of `service`.
fn lose_one_answer_of(service: &str, actions: &[&str]) -> Vec<FaultRule> {
    actions
        .iter()
        .map(|action| {
            FaultRule::new(FaultKind::AnswerLost(AnswerLoss::Reset))
                .for_service(service)
                .for_action(*action)
                .real_calls_only()
                .at_most(1)
        })
        .collect()
}

/// The Warning events about Service `name`.
async fn warnings_about(client: &kube::Client, name: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    Ok(events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.type_.as_deref() == Some("Warning") && e.involved_object.name.as_deref() == Some(name)
        })
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default()
            )
        })
        .collect())
}

/// IDs of the security groups named `name`.
async fn groups_named(ec2: &aws_sdk_ec2::Client, name: &str) -> anyhow::Result<Vec<String>> {
    let out = ec2
        .describe_security_groups()
        .filters(Filter::builder().name("group-name").values(name).build())
        .send()
        .await?;
    Ok(out
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id().map(str::to_string))
        .collect())
}

/// Each fault that was set fired once: the test exercised what it claims.
fn assert_each_fault_fired(proxy: &ccm_testkit::aws_proxy::FaultProxy, lost: &[(&str, &str)]) {
    let calls = proxy.calls();
    for (service, action) in lost {
        assert_eq!(
            calls.get(service, action).faulted,
            1,
            "the answer of {service}:{action} was not lost; the test proves nothing about it"
        );
    }
}

/// Deletes Service `name` and waits until it is gone (finalizer removed).
async fn delete_and_wait(services: &Api<Service>, name: &str, ccm: &Ccm) -> anyhow::Result<()> {
    services.delete(name, &DeleteParams::default()).await?;
    eventually("the Service gone", WAIT, || async {
        services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

#[tokio::test]
async fn classic_elb_survives_lost_answers_and_eventual_consistency() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = nlb::seed(&env, 1).await?;
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n0", &cloud.instances[0]))
        .await?;
    let lost = [
        (SERVICE_EC2, "CreateSecurityGroup"),
        (SERVICE_EC2, "AuthorizeSecurityGroupIngress"),
        (SERVICE_ELB, "CreateLoadBalancer"),
        (SERVICE_ELB, "DeleteLoadBalancer"),
        (SERVICE_EC2, "RevokeSecurityGroupIngress"),
        (SERVICE_EC2, "DeleteSecurityGroup"),
    ];
    let mut faults = Vec::new();
    for (service, action) in lost {
        faults.extend(lose_one_answer_of(service, &[action]));
    }
    env.proxy.set_faults(faults);
    env.proxy.set_consistency_delay(CONSISTENCY_WINDOW);

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &lb_service("web", serde_json::json!({})),
        )
        .await?;
    let name = nlb::lb_name(&svc);
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the load balancer hostname", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    let groups = groups_named(&cloud.ec2, &format!("k8s-elb-{name}")).await?;
    assert_eq!(groups.len(), 1, "one owned group, no duplicate: {groups:?}");
    let elb = &cloud.elb;
    let lbs = elb.describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancer_descriptions().len(), 1);

    delete_and_wait(&services, "web", &ccm).await?;
    assert_each_fault_fired(&env.proxy, &lost);
    let warnings = warnings_about(&client, "web").await?;
    assert!(
        warnings.is_empty(),
        "failed syncs surfaced: {warnings:?}\nlogs:\n{}",
        ccm.logs()
    );
    assert!(
        groups_named(&cloud.ec2, &format!("k8s-elb-{name}"))
            .await?
            .is_empty(),
        "the owned group leaked"
    );
    let lbs = elb.describe_load_balancers().send().await?;
    assert!(
        lbs.load_balancer_descriptions().is_empty(),
        "the ELB leaked"
    );
    env.finish().await
}

#[tokio::test]
async fn nlb_survives_lost_answers_and_eventual_consistency() -> anyhow::Result<()> {
    // Managed mode: the NLB gets a security group of its own, one more
    // create and delete to lose answers of.
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    ))
    .await?;
    let cloud = nlb::seed(&env, 1).await?;
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n0", &cloud.instances[0]))
        .await?;
    let lost = [
        (SERVICE_EC2, "CreateSecurityGroup"),
        (SERVICE_ELBV2, "CreateLoadBalancer"),
        (SERVICE_ELBV2, "CreateTargetGroup"),
        (SERVICE_ELBV2, "CreateListener"),
        (SERVICE_ELBV2, "DeleteLoadBalancer"),
        (SERVICE_ELBV2, "DeleteTargetGroup"),
        (SERVICE_EC2, "DeleteSecurityGroup"),
    ];
    let mut faults = Vec::new();
    for (service, action) in lost {
        faults.extend(lose_one_answer_of(service, &[action]));
    }
    env.proxy.set_faults(faults);
    env.proxy.set_consistency_delay(CONSISTENCY_WINDOW);

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &nlb::nlb_service("web", serde_json::json!({})),
        )
        .await?;
    let name = nlb::lb_name(&svc);
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the NLB hostname", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    let lbs = cloud.elbv2.describe_load_balancers().send().await?;
    let named: Vec<_> = lbs
        .load_balancers()
        .iter()
        .filter(|l| l.load_balancer_name() == Some(name.as_str()))
        .collect();
    assert_eq!(named.len(), 1, "one NLB, no duplicate");
    let arn = named[0].load_balancer_arn().unwrap_or_default().to_string();
    let tgs = cloud.elbv2.describe_target_groups().send().await?;
    assert_eq!(
        tgs.target_groups().len(),
        1,
        "one target group, no duplicate"
    );
    let listeners = cloud
        .elbv2
        .describe_listeners()
        .load_balancer_arn(&arn)
        .send()
        .await?;
    assert_eq!(listeners.listeners().len(), 1, "one listener");

    delete_and_wait(&services, "web", &ccm).await?;
    assert_each_fault_fired(&env.proxy, &lost);
    let warnings = warnings_about(&client, "web").await?;
    assert!(
        warnings.is_empty(),
        "failed syncs surfaced: {warnings:?}\nlogs:\n{}",
        ccm.logs()
    );
    let left = nlb::cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    let owned = cloud
        .ec2
        .describe_security_groups()
        .filters(
            Filter::builder()
                .name("tag-key")
                .values(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                .build(),
        )
        .send()
        .await?;
    let leaked: Vec<_> = owned
        .security_groups()
        .iter()
        .filter(|g| g.group_id() != Some(cloud.node_group.as_str()))
        .filter_map(|g| g.group_name())
        .collect();
    assert!(leaked.is_empty(), "groups leaked: {leaked:?}");
    env.finish().await
}
