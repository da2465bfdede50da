//! Issue 45: a later Service adopts a kept load balancer by name. A
//! protected Service's deletion keeps its NLB or classic ELB (tests/ccm/
//! protect.rs); a new Service whose `aws-load-balancer-name` names it takes
//! it over with no CreateLoadBalancer (counted at the proxy every CCM call
//! goes through), the same DNS name, its tags moved to the new Service and
//! the kept tag gone; its deletion then deletes it. A named load balancer
//! this CCM did not keep (a kOps-style one carrying only the cluster tag)
//! is left alone with a Warning, and the Service gets the `a` + UID load
//! balancer the Go CCM would make.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_elasticloadbalancing as elb;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::nlb::{cluster_tagged_elbv2, hostname, lb_name, nlb_service, one_node_nlb, seed};
use crate::ops_orphans::run_tool;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);
const ATTRIBUTES: &str = "service.beta.kubernetes.io/aws-load-balancer-attributes";
const PROTECTED: &str = "deletion_protection.enabled=true";
const NAME: &str = "service.beta.kubernetes.io/aws-load-balancer-name";
const KEPT_TAG: &str = "aws-ccm/kept";
const ADOPTED_TAG: &str = "aws-ccm/adopted";
const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";

/// How many CreateLoadBalancer calls of `service` reached the proxy.
fn creates(env: &Env, service: &str) -> u64 {
    env.proxy
        .calls()
        .get(service, "CreateLoadBalancer")
        .received
}

async fn gone(services: &Api<Service>, name: &str, ccm: &Ccm) -> anyhow::Result<()> {
    eventually(&format!("Service {name} gone"), WAIT, || async {
        services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

async fn wait_host(services: &Api<Service>, name: &str, ccm: &Ccm) -> anyhow::Result<String> {
    eventually(&format!("a hostname for {name}"), WAIT, || async {
        services.get(name).await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

async fn nlb_tags(
    c: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let out = c.describe_tags().resource_arns(arn).send().await?;
    Ok(out
        .tag_descriptions()
        .iter()
        .flat_map(|d| d.tags())
        .map(|t| {
            (
                t.key().unwrap_or_default().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

async fn clb_tags(c: &elb::Client, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let out = c.describe_tags().load_balancer_names(name).send().await?;
    Ok(out
        .tag_descriptions()
        .iter()
        .flat_map(|d| d.tags())
        .map(|t| {
            (
                t.key().to_string(),
                t.value().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// The target groups NLB `arn`'s listeners forward to: (name, registered
/// instance ids). Read through the listeners (what traffic reaches), not
/// `DescribeTargetGroups(LoadBalancerArn)`: moto 5.2.5 does not move a
/// target group's load balancer link when a listener is modified.
async fn groups(
    c: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let listeners = c.describe_listeners().load_balancer_arn(arn).send().await?;
    let forwarded: Vec<String> = listeners
        .listeners()
        .iter()
        .flat_map(|l| l.default_actions())
        .filter_map(|a| a.target_group_arn().map(str::to_string))
        .collect();
    let mut all = Vec::new();
    for tg in forwarded {
        let described = c
            .describe_target_groups()
            .target_group_arns(&tg)
            .send()
            .await?;
        let name = described
            .target_groups()
            .first()
            .and_then(|g| g.target_group_name())
            .unwrap_or_default()
            .to_string();
        let health = c
            .describe_target_health()
            .target_group_arn(&tg)
            .send()
            .await?;
        let ids = health
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health().and_then(|h| h.reason())
                    != Some(&aws_sdk_elasticloadbalancingv2::types::TargetHealthReasonEnum::DeregistrationInProgress)
            })
            .filter_map(|d| d.target()?.id().map(str::to_string))
            .collect();
        all.push((name, ids));
    }
    Ok(all)
}

/// A protected NLB's Service deleted (the NLB kept); a new Service naming
/// it adopts it: no CreateLoadBalancer, the same ARN and DNS name, its
/// service-name and adoption tags name the new Service, the kept tag and
/// the old Service's target group are gone, a new one holds the node.
/// The new Service does not ask for protection, so AWS's attribute (the one
/// this CCM turned on) goes off, and its deletion deletes the NLB.
#[tokio::test]
async fn a_kept_nlb_is_adopted_by_name_and_deleted_with_its_adopter() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let name = lb_name(&created);
    let lbs = cloud
        .elbv2
        .describe_load_balancers()
        .names(&name)
        .send()
        .await?;
    let arn = lbs.load_balancers()[0]
        .load_balancer_arn()
        .unwrap_or_default()
        .to_string();
    let dns = lbs.load_balancers()[0]
        .dns_name()
        .unwrap_or_default()
        .to_string();
    let old_groups = groups(&cloud.elbv2, &arn).await?;
    assert_eq!(old_groups.len(), 1, "{old_groups:?}");

    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    assert_eq!(nlb_tags(&cloud.elbv2, &arn).await?[KEPT_TAG], "default/web");
    let made = creates(&env, "elasticloadbalancingv2");
    assert_eq!(made, 1, "the kept NLB was made once");

    // Created while no CCM runs: `aws-ccm plan` shows the adoption, no
    // load balancer of the adopter's own name.
    drop(ccm);
    let adopter = nlb_service("web2", serde_json::json!({ NAME: name }));
    let adopter = services.create(&PostParams::default(), &adopter).await?;
    assert_ne!(lb_name(&adopter), name);
    let (ok, plan, err) =
        run_tool(&env, "plan", &["--controllers=service", "default/web2"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}\n{plan}");
    assert!(
        plan.contains(&format!("adopt {name} (kept from default/web)")),
        "{plan}"
    );
    assert!(
        !plan.contains(&lb_name(&adopter)),
        "no NLB of its own: {plan}"
    );
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let host = wait_host(&services, "web2", &ccm).await?;
    assert_eq!(host, dns, "the adopted NLB's DNS name");
    let adopted = eventually("the adoption complete", WAIT, || async {
        let t = nlb_tags(&cloud.elbv2, &arn).await.ok()?;
        (!t.contains_key(KEPT_TAG)).then_some(t)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(adopted[SERVICE_NAME_TAG], "default/web2");
    assert_eq!(adopted[ADOPTED_TAG], "default/web2");
    let new_groups = eventually("one target group, holding the node", WAIT, || async {
        let g = groups(&cloud.elbv2, &arn).await.ok()?;
        (g.len() == 1 && g[0].1 == vec![cloud.instances[0].clone()]).then_some(g)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_ne!(
        new_groups[0].0, old_groups[0].0,
        "the old Service's group went"
    );
    let all_groups = cloud.elbv2.describe_target_groups().send().await?;
    assert!(
        all_groups
            .target_groups()
            .iter()
            .all(|g| g.target_group_name() != Some(old_groups[0].0.as_str())),
        "the old Service's target group is deleted"
    );
    assert_eq!(creates(&env, "elasticloadbalancingv2"), made, "no create");
    let lbs = cloud.elbv2.describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancers().len(), 1, "no second NLB");
    let (ok, plan, err) =
        run_tool(&env, "plan", &["--controllers=service", "default/web2"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}\n{plan}");
    assert!(
        !plan.contains(&format!("adopt {name}")),
        "adopted: nothing more to adopt: {plan}"
    );

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    let left = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert!(
        left.is_empty(),
        "the adopted NLB went with its Service: {left:?}"
    );
    env.finish().await
}

/// The same for a classic ELB: kept at its protected Service's deletion,
/// adopted by name with no CreateLoadBalancer and the same DNS name, its
/// node attached again, deleted with its adopter.
#[tokio::test]
async fn a_kept_classic_elb_is_adopted_by_name_and_deleted_with_its_adopter() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let svc = crate::service::lb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let created = crate::swap::nodes_and_services(&env, &seeded, &[svc]).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let dns = wait_host(&services, "web", &ccm).await?;
    let name = lb_name(&created[0]);
    let c = elb::Client::new(&seeded.conf);
    let describe = || async {
        let out = c
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await?;
        anyhow::Ok(out.load_balancer_descriptions()[0].clone())
    };

    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    assert_eq!(clb_tags(&c, &name).await?[KEPT_TAG], "default/web");
    assert!(
        describe().await?.instances().is_empty(),
        "kept without its node"
    );
    let made = creates(&env, "elasticloadbalancing");
    assert_eq!(made, 1);

    let adopter = crate::service::lb_service("web2", serde_json::json!({ NAME: name }));
    services.create(&PostParams::default(), &adopter).await?;
    assert_eq!(wait_host(&services, "web2", &ccm).await?, dns);
    let adopted = eventually("the adoption complete", WAIT, || async {
        let t = clb_tags(&c, &name).await.ok()?;
        (!t.contains_key(KEPT_TAG)).then_some(t)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(adopted[SERVICE_NAME_TAG], "default/web2");
    assert_eq!(adopted[ADOPTED_TAG], "default/web2");
    eventually("the node attached again", WAIT, || async {
        (describe().await.ok()?.instances().len() == 1).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(creates(&env, "elasticloadbalancing"), made, "no create");
    let all = c.describe_load_balancers().send().await?;
    assert_eq!(all.load_balancer_descriptions().len(), 1, "no second ELB");

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    let all = c.describe_load_balancers().send().await?;
    assert!(
        all.load_balancer_descriptions().is_empty(),
        "the adopted ELB went with its Service"
    );
    env.finish().await
}

/// A kOps-style classic ELB (this cluster's tag, a name this CCM never
/// gives, never kept) named by a Service: not adopted, a Warning says why,
/// the Service gets its own `a` + UID ELB as the Go CCM would make, and the
/// kOps one is untouched (tags and all) and outlives the Service.
#[tokio::test]
async fn a_named_load_balancer_this_ccm_did_not_keep_is_not_adopted() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let c = elb::Client::new(&seeded.conf);
    let kops = "api-test-cluster-kops";
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    c.create_load_balancer()
        .load_balancer_name(kops)
        .subnets(&seeded.subnet)
        .listeners(
            elb::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(443)
                .instance_protocol("TCP")
                .instance_port(443)
                .build()?,
        )
        .tags(
            elb::types::Tag::builder()
                .key(&cluster_tag)
                .value("owned")
                .build()?,
        )
        .send()
        .await?;
    let kops_before = clb_tags(&c, kops).await?;

    let svc = crate::service::lb_service("web", serde_json::json!({ NAME: kops }));
    let created = crate::swap::nodes_and_services(&env, &seeded, &[svc]).await?;
    let (ok, plan, err) =
        run_tool(&env, "plan", &["--controllers=service", "default/web"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}\n{plan}");
    assert!(
        plan.contains("LoadBalancerNotAdopted") && !plan.contains(&format!("adopt {kops}")),
        "{plan}"
    );
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let host = wait_host(&services, "web", &ccm).await?;
    let own = lb_name(&created[0]);
    assert!(host.contains(&own), "{host} is the a+UID ELB {own}");
    let client = env.api.client().await?;
    let note = crate::swap::event_note(&client, "web", "LoadBalancerNotAdopted").await?;
    assert!(
        note.contains(kops) && note.contains("not one this cluster's CCM made"),
        "{note}"
    );
    assert_eq!(
        clb_tags(&c, kops).await?,
        kops_before,
        "the kOps ELB untouched"
    );

    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    let all = c.describe_load_balancers().send().await?;
    let names: Vec<_> = all
        .load_balancer_descriptions()
        .iter()
        .filter_map(|l| l.load_balancer_name())
        .collect();
    assert_eq!(
        names,
        vec![kops],
        "the Service's own ELB went, the kOps one stays"
    );
    // The kOps ELB is not this CCM's to clean up.
    c.delete_load_balancer()
        .load_balancer_name(kops)
        .send()
        .await?;
    env.finish().await
}

/// `NLBSecurityGroupMode = Managed`: the managed group's name (upstream's)
/// hashes the name and UID of the Service the NLB was made for, so the
/// adopter's name finds none. The adopted NLB keeps the group attached to
/// it: no CreateSecurityGroup, the same group on the NLB, and that group
/// deleted with the adopter (the orphan audit would see it left).
#[tokio::test]
async fn an_adopted_managed_mode_nlb_keeps_its_own_group() -> anyhow::Result<()> {
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    ))
    .await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let name = lb_name(&created);
    let lb_groups = || async {
        let o = cloud
            .elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await?;
        anyhow::Ok(
            o.load_balancers()
                .first()
                .map(|l| l.security_groups().to_vec())
                .unwrap_or_default(),
        )
    };
    let group = lb_groups().await?;
    assert_eq!(group.len(), 1, "the managed group: {group:?}");

    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    let group_creates = || env.proxy.calls().get("ec2", "CreateSecurityGroup").received;
    let made = group_creates();
    assert_eq!(made, 1, "the managed group was made once");

    let adopter = nlb_service("web2", serde_json::json!({ NAME: name }));
    services.create(&PostParams::default(), &adopter).await?;
    wait_host(&services, "web2", &ccm).await?;
    let elbv2 = &cloud.elbv2;
    eventually("the adoption complete", WAIT, || async {
        let arn = elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await
            .ok()?;
        let arn = arn
            .load_balancers()
            .first()?
            .load_balancer_arn()?
            .to_string();
        (!nlb_tags(elbv2, &arn).await.ok()?.contains_key(KEPT_TAG)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(lb_groups().await?, group, "the same group on the NLB");
    assert_eq!(
        group_creates(),
        made,
        "no second group\nlogs:\n{}",
        ccm.logs()
    );

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    let left = cloud
        .ec2
        .describe_security_groups()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-id")
                .values(&group[0])
                .build(),
        )
        .send()
        .await?;
    assert!(
        left.security_groups().is_empty(),
        "the adopted NLB's group went with it\nlogs:\n{}",
        ccm.logs()
    );
    env.finish().await
}

/// Two Services naming one kept classic ELB at once: exactly one adopts it
/// (the first claim to land); the other gets a Warning naming the first and
/// its own `a` + UID ELB, one CreateLoadBalancer. Both deletions then leave
/// nothing.
#[tokio::test]
async fn two_services_naming_one_kept_elb_one_adopts() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let svc = crate::service::lb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let created = crate::swap::nodes_and_services(&env, &seeded, &[svc]).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let dns = wait_host(&services, "web", &ccm).await?;
    let name = lb_name(&created[0]);
    let c = elb::Client::new(&seeded.conf);
    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    let made = creates(&env, "elasticloadbalancing");

    let mut made_now = Vec::new();
    for s in ["web2", "web3"] {
        let adopter = crate::service::lb_service(s, serde_json::json!({ NAME: name }));
        made_now.push(services.create(&PostParams::default(), &adopter).await?);
    }
    let hosts = [
        wait_host(&services, "web2", &ccm).await?,
        wait_host(&services, "web3", &ccm).await?,
    ];
    let adopters: Vec<usize> = (0..2).filter(|i| hosts[*i] == dns).collect();
    assert_eq!(adopters.len(), 1, "exactly one adopts: {hosts:?}");
    let (winner, loser) = (adopters[0], 1 - adopters[0]);
    let winner_key = format!("default/{}", ["web2", "web3"][winner]);
    let loser_name = ["web2", "web3"][loser];
    assert!(
        hosts[loser].contains(&lb_name(&made_now[loser])),
        "the other has its own a+UID ELB: {}",
        hosts[loser]
    );
    let tags = clb_tags(&c, &name).await?;
    assert_eq!(tags[SERVICE_NAME_TAG], winner_key);
    assert_eq!(tags[ADOPTED_TAG], winner_key);
    let client = env.api.client().await?;
    let note = crate::swap::event_note(&client, loser_name, "LoadBalancerNotAdopted").await?;
    assert!(note.contains(&name), "{note}");
    assert_eq!(creates(&env, "elasticloadbalancing"), made + 1);

    for s in ["web2", "web3"] {
        services.delete(s, &DeleteParams::default()).await?;
        gone(&services, s, &ccm).await?;
    }
    let all = c.describe_load_balancers().send().await?;
    assert!(all.load_balancer_descriptions().is_empty(), "both went");
    env.finish().await
}
