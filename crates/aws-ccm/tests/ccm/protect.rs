//! Issue 45: protected load balancers. A Service marked
//! `aws-load-balancer-attributes: deletion_protection.enabled=true` keeps its
//! load balancer (same ARN and DNS name), listeners, target groups and own
//! group when it is deleted or stops being `type: LoadBalancer`; its node
//! targets and node rules go, the finalizer is released with an event, the
//! load balancer is tagged kept, `aws-ccm orphans` lists it as "protected,
//! kept" and `--delete` leaves it. An NLB gets AWS's attribute too, which
//! the fault proxy enforces as AWS does (moto 5.2.5 deletes a protected NLB).

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use crate::nlb::{
    Cloud, cluster_tagged_elbv2, hostname, lb_name, nlb_service, node_rules, one_node_nlb, seed,
};
use crate::ops_orphans::run_tool;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);
const ATTRIBUTES: &str = "service.beta.kubernetes.io/aws-load-balancer-attributes";
const PROTECTED: &str = "deletion_protection.enabled=true";
const KEPT_TAG: &str = "aws-ccm/kept";

/// The NLB named `name`: (ARN, DNS name), if it exists.
async fn nlb_of(c: &elbv2::Client, name: &str) -> anyhow::Result<Option<(String, String)>> {
    let all = c.describe_load_balancers().send().await?;
    Ok(all
        .load_balancers()
        .iter()
        .find(|l| l.load_balancer_name() == Some(name))
        .map(|l| {
            (
                l.load_balancer_arn().unwrap_or_default().to_string(),
                l.dns_name().unwrap_or_default().to_string(),
            )
        }))
}

/// AWS's `deletion_protection.enabled` of the NLB `arn`.
async fn protection(c: &elbv2::Client, arn: &str) -> anyhow::Result<Option<String>> {
    let attrs = c
        .describe_load_balancer_attributes()
        .load_balancer_arn(arn)
        .send()
        .await?;
    Ok(attrs
        .attributes()
        .iter()
        .find(|a| a.key() == Some("deletion_protection.enabled"))
        .and_then(|a| a.value().map(str::to_string)))
}

async fn tags_of(c: &elbv2::Client, arn: &str) -> anyhow::Result<BTreeMap<String, String>> {
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

/// The target groups behind NLB `arn`, each with its registered instances
/// (those draining left out).
async fn groups_and_targets(
    c: &elbv2::Client,
    arn: &str,
) -> anyhow::Result<Vec<(String, Vec<String>)>> {
    let groups = c
        .describe_target_groups()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let mut out = Vec::new();
    for g in groups.target_groups() {
        let tg = g.target_group_arn().unwrap_or_default().to_string();
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
                    != Some(&elbv2::types::TargetHealthReasonEnum::DeregistrationInProgress)
            })
            .filter_map(|d| d.target()?.id().map(str::to_string))
            .collect();
        out.push((tg, ids));
    }
    Ok(out)
}

async fn listener_count(c: &elbv2::Client, arn: &str) -> anyhow::Result<usize> {
    let out = c.describe_listeners().load_balancer_arn(arn).send().await?;
    Ok(out.listeners().len())
}

/// How many of the node group's rules name NLB `name`.
async fn nlb_rule_count(cloud: &Cloud, name: &str) -> anyhow::Result<usize> {
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    Ok(rules
        .iter()
        .filter(|r| r.3.ends_with(&format!("={name}")))
        .count())
}

async fn gone(services: &Api<Service>, name: &str, ccm: &Ccm) -> anyhow::Result<()> {
    eventually(&format!("Service {name} gone"), WAIT, || async {
        services.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

/// A protected NLB Service deleted: `aws-ccm plan` shows the keep first;
/// then the NLB, its listener and target group stay with the same ARN and
/// DNS name and AWS's protection on, its targets and node rules go, the
/// finalizer is released with an event, and `aws-ccm orphans --delete`
/// lists it as protected, kept and leaves it. AWS (the proxy, as AWS)
/// refuses to delete it outright, and a later unprotect lets it go.
#[tokio::test]
async fn a_protected_nlb_is_kept_when_its_service_is_deleted() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let name = lb_name(&created);
    let (arn, dns) = nlb_of(&cloud.elbv2, &name).await?.expect("the NLB");
    eventually("AWS's deletion protection on", WAIT, || async {
        (protection(&cloud.elbv2, &arn).await.ok()?.as_deref() == Some("true")).then_some(())
    })
    .await?;
    assert_eq!(
        tags_of(&cloud.elbv2, &arn).await?["aws-ccm/deletion-protection"],
        "on"
    );
    let before = groups_and_targets(&cloud.elbv2, &arn).await?;
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].1, vec![cloud.instances[0].clone()]);
    assert!(nlb_rule_count(&cloud, &name).await? > 0);

    // The stand-in refuses to delete a protected NLB, as AWS does.
    let via_proxy =
        elbv2::Client::new(&ccm_testkit::moto::test_sdk_config(&env.proxy.endpoint()).await);
    let refused = via_proxy
        .delete_load_balancer()
        .load_balancer_arn(&arn)
        .send()
        .await;
    let code = refused
        .as_ref()
        .err()
        .and_then(|e| e.as_service_error())
        .and_then(|e| e.meta().code())
        .map(str::to_string);
    assert_eq!(
        code.as_deref(),
        Some("OperationNotPermitted"),
        "{refused:?}"
    );
    assert!(nlb_of(&cloud.elbv2, &name).await?.is_some(), "still there");

    // Deleted while no CCM runs: the plan shows the keep, no deletion.
    drop(ccm);
    services.delete("web", &DeleteParams::default()).await?;
    let (ok, plan, err) =
        run_tool(&env, "plan", &["--controllers=service", "default/web"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}\n{plan}");
    assert!(plan.contains(&format!("{KEPT_TAG}=default/web")), "{plan}");
    assert!(plan.contains("1 target(s) from target group"), "{plan}");
    assert!(
        !plan.contains("being deleted"),
        "no deletion of the NLB: {plan}"
    );
    assert!(
        !plan.contains("- target group"),
        "no deletion of its target group: {plan}"
    );

    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    gone(&services, "web", &ccm).await?;
    let note = crate::swap::event_note(&client, "web", "LoadBalancerKept").await?;
    assert!(note.contains(&name) && note.contains("protected"), "{note}");
    assert_eq!(nlb_of(&cloud.elbv2, &name).await?, Some((arn.clone(), dns)));
    assert_eq!(
        protection(&cloud.elbv2, &arn).await?.as_deref(),
        Some("true")
    );
    assert_eq!(listener_count(&cloud.elbv2, &arn).await?, 1);
    let after = groups_and_targets(&cloud.elbv2, &arn).await?;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].0, before[0].0, "the same target group");
    assert!(
        after[0].1.is_empty(),
        "its node targets are gone: {after:?}"
    );
    assert_eq!(tags_of(&cloud.elbv2, &arn).await?[KEPT_TAG], "default/web");
    assert_eq!(
        nlb_rule_count(&cloud, &name).await?,
        0,
        "node rules revoked"
    );

    // orphans: protected, kept; --delete leaves it.
    let (ok, out, err) = run_tool(&env, "orphans", &["--delete", "--yes"], "").await?;
    assert!(ok, "aws-ccm orphans failed: {err}");
    assert!(
        out.contains("protected, kept") && out.contains(&arn),
        "{out}"
    );
    assert!(!err.contains(&arn), "nothing of it deleted: {err}");
    assert!(nlb_of(&cloud.elbv2, &name).await?.is_some());
    let tagged = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert_eq!(
        tagged.len(),
        2,
        "the NLB and its target group stay: {tagged:?}"
    );
    env.finish().await
}

/// Removing the protection from a live NLB turns AWS's attribute off (and
/// only the one this CCM turned on); the Service's deletion then deletes
/// everything, which the proxy would refuse were the attribute still on.
#[tokio::test]
async fn unprotecting_an_nlb_turns_the_attribute_off_and_its_deletion_deletes_it()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let (arn, _) = nlb_of(&cloud.elbv2, &lb_name(&created))
        .await?
        .expect("the NLB");
    eventually("AWS's deletion protection on", WAIT, || async {
        (protection(&cloud.elbv2, &arn).await.ok()?.as_deref() == Some("true")).then_some(())
    })
    .await?;

    let unmark = serde_json::json!({"metadata": {"annotations": { ATTRIBUTES: null }}});
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(&unmark))
        .await?;
    eventually("AWS's deletion protection off", WAIT, || async {
        (protection(&cloud.elbv2, &arn).await.ok()?.as_deref() == Some("false")).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(
        tags_of(&cloud.elbv2, &arn).await?["aws-ccm/deletion-protection"],
        "off"
    );

    services.delete("web", &DeleteParams::default()).await?;
    gone(&services, "web", &ccm).await?;
    assert!(cluster_tagged_elbv2(&cloud.elbv2).await?.is_empty());
    let deletes = env
        .proxy
        .calls()
        .get("elasticloadbalancingv2", "DeleteLoadBalancer");
    assert!(deletes.forwarded > 0, "{deletes:?}");
    env.finish().await
}

/// A protected classic ELB whose Service becomes `type: NodePort`: the ELB,
/// its listener and its own group stay, its instances and the node group's
/// rule admitting its group go, the status and finalizer are cleared, and
/// it is tagged kept.
#[tokio::test]
async fn a_protected_classic_elb_is_kept_when_its_service_changes_type() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let svc = crate::service::lb_service("web", serde_json::json!({ ATTRIBUTES: PROTECTED }));
    let created = crate::swap::nodes_and_services(&env, &seeded, &[svc]).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let host = eventually("the classic ELB hostname", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let name = lb_name(&created[0]);
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let describe = || async {
        let out = elb
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await?;
        anyhow::Ok(out.load_balancer_descriptions()[0].clone())
    };
    let lb = describe().await?;
    assert_eq!(lb.instances().len(), 1);
    let group = lb.security_groups()[0].clone();
    let admits = || async {
        let out = seeded
            .ec2
            .describe_security_groups()
            .group_ids(&seeded.node_group)
            .send()
            .await?;
        anyhow::Ok(out.security_groups()[0].ip_permissions().iter().any(|p| {
            p.user_id_group_pairs()
                .iter()
                .any(|g| g.group_id() == Some(group.as_str()))
        }))
    };
    assert!(admits().await?, "the node group admits the ELB's group");

    let to_node_port = serde_json::json!({"spec": {"type": "NodePort"}});
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(&to_node_port))
        .await?;
    eventually("the finalizer released", WAIT, || async {
        let s = services.get("web").await.ok()?;
        (s.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()) && hostname(&s).is_none())
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let kept = describe().await?;
    assert_eq!(kept.dns_name(), Some(host.as_str()), "the same ELB");
    assert_eq!(kept.listener_descriptions().len(), 1);
    assert!(kept.instances().is_empty(), "{:?}", kept.instances());
    assert_eq!(kept.security_groups(), std::slice::from_ref(&group));
    let tags = elb
        .describe_tags()
        .load_balancer_names(&name)
        .send()
        .await?;
    let kept_from = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .find(|t| t.key() == KEPT_TAG)
        .map(|t| t.value().unwrap_or_default().to_string());
    assert_eq!(kept_from.as_deref(), Some("default/web"));
    assert!(!admits().await?, "the node rule is revoked");
    let groups = seeded
        .ec2
        .describe_security_groups()
        .group_ids(&group)
        .send()
        .await?;
    assert_eq!(groups.security_groups().len(), 1, "its own group stays");
    env.finish().await
}

/// After a swap from the Go CCM, nothing changes: a Go-made NLB whose
/// Service says nothing of protection, and one AWS protects by hand, see no
/// mutation. The hand-protected one's deletion is then the keep (AWS's
/// refusal is honoured, where the Go CCM fails forever); the other, once
/// its Service asks, gets AWS's attribute on the same NLB.
#[tokio::test]
async fn after_a_swap_nothing_changes_until_a_service_asks_for_protection() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let svcs = [
        nlb_service("plain", serde_json::json!({})),
        nlb_service("byhand", serde_json::json!({})),
    ];
    let created = crate::swap::nodes_and_services(&env, &seeded, &svcs).await?;
    for svc in &created {
        crate::swap::go_made_nlb(&seeded, svc, &[]).await?;
    }
    let c = elbv2::Client::new(&seeded.conf);
    let (plain_arn, _) = nlb_of(&c, &lb_name(&created[0])).await?.expect("plain");
    let (byhand_arn, byhand_dns) = nlb_of(&c, &lb_name(&created[1])).await?.expect("byhand");
    c.modify_load_balancer_attributes()
        .load_balancer_arn(&byhand_arn)
        .attributes(
            elbv2::types::LoadBalancerAttribute::builder()
                .key("deletion_protection.enabled")
                .value("true")
                .build(),
        )
        .send()
        .await?;
    let finalize = serde_json::json!({"metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup"]}});
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    for name in ["plain", "byhand"] {
        services
            .patch(name, &PatchParams::default(), &Patch::Merge(&finalize))
            .await?;
    }

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    for name in ["plain", "byhand"] {
        eventually(&format!("a hostname for {name}"), WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    }
    let mutations: Vec<String> = proxy
        .calls()
        .iter()
        .filter(|(_, a, c)| {
            c.received > 0
                && !a.starts_with("Describe")
                && !a.ends_with("+DryRun")
                && !a.starts_with("Get")
        })
        .map(|(s, a, _)| format!("{s}:{a}"))
        .collect();
    assert!(
        mutations.is_empty(),
        "a swap changed {mutations:?}\nlogs:\n{}",
        ccm.logs()
    );
    assert_eq!(
        protection(&c, &byhand_arn).await?.as_deref(),
        Some("true"),
        "left as it is"
    );

    services.delete("byhand", &DeleteParams::default()).await?;
    gone(&services, "byhand", &ccm).await?;
    assert_eq!(
        nlb_of(&c, &lb_name(&created[1])).await?,
        Some((byhand_arn.clone(), byhand_dns))
    );
    assert_eq!(tags_of(&c, &byhand_arn).await?[KEPT_TAG], "default/byhand");

    let mark = serde_json::json!({"metadata": {"annotations": { ATTRIBUTES: PROTECTED }}});
    services
        .patch("plain", &PatchParams::default(), &Patch::Merge(&mark))
        .await?;
    eventually(
        "AWS's deletion protection on the Go-made NLB",
        WAIT,
        || async {
            (protection(&c, &plain_arn).await.ok()?.as_deref() == Some("true")).then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(
        nlb_of(&c, &lb_name(&created[0])).await?.map(|l| l.0),
        Some(plain_arn),
        "not recreated"
    );
    env.finish().await
}
