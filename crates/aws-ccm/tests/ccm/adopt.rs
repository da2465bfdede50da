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
use aws_sdk_elasticloadbalancingv2::error::ProvideErrorMetadata;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

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
const HEALTH_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";

/// The names of the classic ELBs in moto.
async fn clb_names(c: &elb::Client) -> anyhow::Result<Vec<String>> {
    let all = c.describe_load_balancers().send().await?;
    Ok((all.load_balancer_descriptions().iter())
        .filter_map(|l| l.load_balancer_name().map(str::to_string))
        .collect())
}

/// The ARN and DNS name of NLB `name`.
async fn arn_and_dns(
    c: &aws_sdk_elasticloadbalancingv2::Client,
    name: &str,
) -> anyhow::Result<(String, String)> {
    let lbs = c.describe_load_balancers().names(name).send().await?;
    let lb = lbs
        .load_balancers()
        .first()
        .ok_or_else(|| anyhow::anyhow!("no NLB {name}"))?;
    Ok((
        lb.load_balancer_arn().unwrap_or_default().to_string(),
        lb.dns_name().unwrap_or_default().to_string(),
    ))
}

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

/// The target groups behind NLB `arn` (those its listeners forward to: the
/// proxy the tests read through links them as AWS does), with their
/// registered instance ids.
async fn groups(
    c: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let behind = match c
        .describe_target_groups()
        .load_balancer_arn(arn)
        .send()
        .await
    {
        Ok(out) => out.target_groups().to_vec(),
        Err(e) if e.code() == Some("TargetGroupNotFound") => Vec::new(),
        Err(e) => return Err(e.into()),
    };
    let mut all = Vec::new();
    for g in behind {
        let tg = g.target_group_arn().unwrap_or_default();
        let health = c
            .describe_target_health()
            .target_group_arn(tg)
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
        all.push((g.target_group_name().unwrap_or_default().to_string(), ids));
    }
    Ok(all)
}

/// The names of every target group in the account.
async fn all_group_names(
    c: &aws_sdk_elasticloadbalancingv2::Client,
) -> anyhow::Result<Vec<String>> {
    let out = c.describe_target_groups().send().await?;
    Ok(out
        .target_groups()
        .iter()
        .filter_map(|g| g.target_group_name().map(str::to_string))
        .collect())
}

/// Service `name` deleted while no CCM runs, its finalizer stripped: gone
/// without its load balancer's deletion, as after a forced removal.
async fn delete_unfinalized(services: &Api<Service>, name: &str) -> anyhow::Result<()> {
    services.delete(name, &DeleteParams::default()).await?;
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    if services.get_opt(name).await?.is_some() {
        services
            .patch(name, &PatchParams::default(), &Patch::Merge(&strip))
            .await?;
    }
    eventually(&format!("Service {name} gone"), WAIT, || async {
        services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
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
    let (arn, dns) = arn_and_dns(&cloud.elbv2, &name).await?;
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
    assert_eq!(clb_names(&c).await?.len(), 1, "no second ELB");

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    assert!(
        clb_names(&c).await?.is_empty(),
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
    let names = clb_names(&c).await?;
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
    assert!(clb_names(&c).await?.is_empty(), "both went");
    env.finish().await
}

/// A protected classic ELB's Service `web` deleted and the ELB kept, then
/// adopted by `web2` (the annotation names it): returns the ELB's name, its
/// DNS name, the CCM and how many ELBs were created so far.
async fn adopted_clb(
    env: &Env,
    seeded: &Seeded,
    services: &Api<Service>,
) -> anyhow::Result<(String, String, Ccm, u64)> {
    let svc = crate::service::lb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let created = crate::swap::nodes_and_services(env, seeded, &[svc]).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let dns = wait_host(services, "web", &ccm).await?;
    let name = lb_name(&created[0]);
    services.delete("web", &DeleteParams::default()).await?;
    gone(services, "web", &ccm).await?;
    let made = creates(env, "elasticloadbalancing");
    let adopter = crate::service::lb_service("web2", serde_json::json!({ NAME: name }));
    services.create(&PostParams::default(), &adopter).await?;
    assert_eq!(wait_host(services, "web2", &ccm).await?, dns);
    let c = elb::Client::new(&seeded.conf);
    eventually("the adoption complete", WAIT, || async {
        let t = clb_tags(&c, &name).await.ok()?;
        (!t.contains_key(KEPT_TAG)
            && t.get(ADOPTED_TAG).map(String::as_str) == Some("default/web2"))
        .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    Ok((name, dns, ccm, made))
}

/// The health check interval of classic ELB `name`.
async fn health_interval(c: &elb::Client, name: &str) -> anyhow::Result<i32> {
    let out = c
        .describe_load_balancers()
        .load_balancer_names(name)
        .send()
        .await?;
    Ok(out.load_balancer_descriptions()[0]
        .health_check()
        .map(|h| h.interval())
        .unwrap_or_default())
}

/// The annotation removed from the adopter (with a health check interval
/// set in the same change, whose arrival on the adopted ELB shows the sync
/// ran): the Service keeps the ELB it adopted, found by its status and
/// tags. No second ELB, the same DNS name, and its deletion deletes it.
#[tokio::test]
async fn removing_the_name_after_adoption_keeps_the_adopted_load_balancer() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let (name, dns, ccm, made) = adopted_clb(&env, &seeded, &services).await?;
    let c = elb::Client::new(&seeded.conf);
    assert_ne!(health_interval(&c, &name).await?, 7);

    let change =
        serde_json::json!({"metadata": {"annotations": { NAME: null, HEALTH_INTERVAL: "7" }}});
    services
        .patch("web2", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    eventually(
        "the adopted ELB synced to the changed Service",
        WAIT,
        || async { (health_interval(&c, &name).await.ok()? == 7).then_some(()) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let now = services.get("web2").await?;
    assert_eq!(
        hostname(&now).as_deref(),
        Some(dns.as_str()),
        "the same DNS name"
    );
    assert_eq!(creates(&env, "elasticloadbalancing"), made, "no second ELB");
    assert_eq!(clb_names(&c).await?.len(), 1, "one ELB");
    assert_eq!(clb_tags(&c, &name).await?[ADOPTED_TAG], "default/web2");

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    assert!(
        clb_names(&c).await?.is_empty(),
        "the adopted ELB went with its Service"
    );
    env.finish().await
}

/// A Service that adopted one kept ELB then names another kept one: it
/// keeps the first (a Service holds one load balancer; taking the second
/// would leave the first tagged its and never deleted), a
/// `LoadBalancerNotAdopted` Warning says so, and the second stays kept,
/// untouched. The adopter's deletion deletes the first only.
#[tokio::test]
async fn an_adopter_naming_another_kept_load_balancer_keeps_the_first() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    // A second protected Service, kept too.
    let other = crate::service::lb_service("other", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let other = services.create(&PostParams::default(), &other).await?;
    let (name, dns, ccm, _) = adopted_clb(&env, &seeded, &services).await?;
    let second = lb_name(&other);
    wait_host(&services, "other", &ccm).await?;
    services.delete("other", &DeleteParams::default()).await?;
    gone(&services, "other", &ccm).await?;
    let c = elb::Client::new(&seeded.conf);
    let second_before = clb_tags(&c, &second).await?;
    assert_eq!(second_before[KEPT_TAG], "default/other");
    let made = creates(&env, "elasticloadbalancing");

    let change = serde_json::json!({"metadata": {"annotations": { NAME: second }}});
    services
        .patch("web2", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    let client = env.api.client().await?;
    let note = crate::swap::event_note(&client, "web2", "LoadBalancerNotAdopted").await?;
    assert!(
        note.contains(&second) && note.contains(&format!("adopted {name} already")),
        "{note}"
    );
    assert_eq!(
        clb_tags(&c, &second).await?,
        second_before,
        "the second stays kept, untouched"
    );
    assert_eq!(clb_tags(&c, &name).await?[ADOPTED_TAG], "default/web2");
    let now = services.get("web2").await?;
    assert_eq!(
        hostname(&now).as_deref(),
        Some(dns.as_str()),
        "it keeps the first"
    );
    assert_eq!(creates(&env, "elasticloadbalancing"), made, "no create");
    let orphans = env.orphans().await?;
    assert!(
        orphans
            .iter()
            .all(|o| !o.contains(&name) && !o.contains(&second)),
        "the first is live, the second kept: {orphans:?}"
    );

    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    let left = clb_names(&c).await?;
    assert_eq!(
        left,
        vec![second.as_str()],
        "the first went, the kept one stays"
    );
    env.finish().await
}

/// An adopted NLB through `aws-ccm orphans` and a second protection: not
/// an orphan (nor kept) while its adopter lives; the adopter protected and
/// deleted keeps it again (`aws-ccm/kept` names the adopter, listed
/// "protected, kept"); a third Service adopts it once more with no create,
/// the same DNS name, and the second Service's target group deleted (found
/// by its name and tags: no listener forwards to it after the move); that
/// adopter gone without the CCM (its finalizer stripped) leaves an orphan
/// the tool names and deletes.
#[tokio::test]
async fn an_adopted_nlb_in_orphans_kept_again_and_adopted_again() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let name = lb_name(&created);
    let (arn, dns) = arn_and_dns(&cloud.elbv2, &name).await?;
    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    let made = creates(&env, "elasticloadbalancingv2");

    // Adopted by a protected Service.
    let adopter = nlb_service(
        "web2",
        serde_json::json!({ NAME: name, ATTRIBUTES: PROTECTED }),
    );
    services.create(&PostParams::default(), &adopter).await?;
    assert_eq!(wait_host(&services, "web2", &ccm).await?, dns);
    let adopted = |by: &'static str| {
        let elbv2 = cloud.elbv2.clone();
        let arn = arn.clone();
        async move {
            let t = nlb_tags(&elbv2, &arn).await.ok()?;
            (!t.contains_key(KEPT_TAG) && t.get(ADOPTED_TAG).map(String::as_str) == Some(by))
                .then_some(())
        }
    };
    eventually("adopted by web2", WAIT, || adopted("default/web2"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let web2_groups = eventually("one target group, holding the node", WAIT, || async {
        let g = groups(&cloud.elbv2, &arn).await.ok()?;
        (g.len() == 1 && g[0].1 == vec![cloud.instances[0].clone()]).then_some(g)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let orphans = env.orphans().await?;
    assert!(
        orphans.iter().all(|o| !o.contains(&arn)),
        "live while its adopter lives: {orphans:?}"
    );
    let (ok, out, err) = run_tool(&env, "orphans", &[], "").await?;
    assert!(ok, "aws-ccm orphans failed: {err}");
    assert!(!out.contains(&arn), "neither an orphan nor kept: {out}");

    // The protected adopter deleted: kept again, from it.
    services.delete("web2", &DeleteParams::default()).await?;
    gone(&services, "web2", &ccm).await?;
    assert_eq!(
        nlb_tags(&cloud.elbv2, &arn).await?[KEPT_TAG],
        "default/web2"
    );
    let (ok, out, err) = run_tool(&env, "orphans", &[], "").await?;
    assert!(ok, "aws-ccm orphans failed: {err}");
    assert!(
        out.contains("protected, kept") && out.contains(&arn),
        "{out}"
    );

    // Adopted once more.
    let third = nlb_service("web3", serde_json::json!({ NAME: name }));
    services.create(&PostParams::default(), &third).await?;
    assert_eq!(wait_host(&services, "web3", &ccm).await?, dns);
    eventually("adopted by web3", WAIT, || adopted("default/web3"))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let web3_groups = eventually("web2's target group deleted", WAIT, || async {
        let all = all_group_names(&cloud.elbv2).await.ok()?;
        let g = groups(&cloud.elbv2, &arn).await.ok()?;
        (!all.contains(&web2_groups[0].0) && g.len() == 1 && all.len() == 1).then_some(g)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(web3_groups[0].1, vec![cloud.instances[0].clone()]);
    assert_eq!(creates(&env, "elasticloadbalancingv2"), made, "no create");

    // web3 gone while no CCM runs: its NLB is an orphan now.
    drop(ccm);
    delete_unfinalized(&services, "web3").await?;
    let orphans = env.orphans().await?;
    assert!(
        orphans.iter().any(|o| o.contains(&arn)),
        "an orphan once its adopter is gone: {orphans:?}"
    );
    let (ok, _, err) = run_tool(&env, "orphans", &["--delete", "--yes"], "").await?;
    assert!(ok, "aws-ccm orphans --delete failed: {err}");
    assert!(err.contains(&arn), "{err}");
    let left = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert!(
        left.is_empty(),
        "the orphan NLB and its group deleted: {left:?}"
    );
    env.finish().await
}

/// Adoption whose delete of the kept-from Service's target group fails:
/// AWS answers 5xx to DeleteTargetGroup until the adopter's sync has failed
/// on it (its Warning seen), then recovers. The kept tag stays until that
/// delete goes through, so a later sync finishes the adoption, the adopter
/// alive: the old group gone, the kept tag gone, the same DNS name.
#[tokio::test]
async fn an_adoption_whose_group_delete_failed_is_finished_by_a_later_sync() -> anyhow::Result<()> {
    use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let name = lb_name(&created);
    let (arn, dns) = arn_and_dns(&cloud.elbv2, &name).await?;
    let old = groups(&cloud.elbv2, &arn).await?;
    assert_eq!(old.len(), 1, "{old:?}");
    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;

    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::ServerError(500)).for_action("DeleteTargetGroup"),
    ]);
    let adopter = nlb_service("web2", serde_json::json!({ NAME: name }));
    services.create(&PostParams::default(), &adopter).await?;
    let note = crate::swap::event_note(&client, "web2", "SyncLoadBalancerFailed").await?;
    let fired: u64 = env.proxy.fired().iter().map(|(_, n)| n).sum();
    assert!(fired > 0, "the delete was never refused: {note}");
    let tags = nlb_tags(&cloud.elbv2, &arn).await?;
    assert_eq!(tags[ADOPTED_TAG], "default/web2", "claimed: {tags:?}");
    assert!(tags.contains_key(KEPT_TAG), "not finished yet: {tags:?}");
    env.proxy.set_faults(Vec::new());

    eventually("the adoption finished by a later sync", WAIT, || async {
        let t = nlb_tags(&cloud.elbv2, &arn).await.ok()?;
        let names = all_group_names(&cloud.elbv2).await.ok()?;
        (!t.contains_key(KEPT_TAG) && !names.contains(&old[0].0)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(wait_host(&services, "web2", &ccm).await?, dns);
    let now = groups(&cloud.elbv2, &arn).await?;
    assert!(now.len() == 1 && now[0].0 != old[0].0, "{now:?}");
    assert_eq!(creates(&env, "elasticloadbalancingv2"), 1, "no create");
    drop(ccm);
    env.finish().await
}
