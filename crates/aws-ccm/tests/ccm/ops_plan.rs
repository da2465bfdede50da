//! Issue 20: `aws-ccm plan` shows what the next sync does. The plan's AWS
//! actions are held against the mutating calls the CCM then sends, counted
//! at a fault proxy of their own; an unchanged cluster plans "no changes".

use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use ccm_testkit::aws_proxy::FaultProxy;

use crate::ops_orphans::run_tool;
use crate::routes::WAIT;
use crate::service::{hostname, lb_service, node};
use crate::support::*;

/// The CCM runs the service controller alone; the tool plans what it runs.
const SERVICE_ONLY: &str = "--controllers=service";

/// The AWS actions of a `plan -o json`, sorted.
fn planned_actions(json: &str) -> anyhow::Result<Vec<String>> {
    let sections: Vec<serde_json::Value> = serde_json::from_str(json)?;
    let mut actions: Vec<String> = sections
        .iter()
        .flat_map(|s| s["steps"].as_array().cloned().unwrap_or_default())
        .flat_map(|st| st["actions"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    actions.sort();
    Ok(actions)
}

/// The writes that reached `proxy` (DryRun probes and reads left out), sorted.
fn written_actions(proxy: &FaultProxy) -> Vec<String> {
    let mut out = Vec::new();
    for (_, action, _) in proxy.calls().iter() {
        if action.starts_with("Describe") || action.starts_with("Get") {
            continue;
        }
        for call in proxy.requests(action) {
            if call.params.get("DryRun").map(String::as_str) != Some("true") {
                out.push(action.to_string());
            }
        }
    }
    out.sort();
    out
}

/// Two Nodes and Service `web`, whose classic ELB a CCM running the service
/// controller made before it stopped.
async fn web_made_by_a_stopped_ccm(env: &Env) -> anyhow::Result<(Api<Node>, Api<Service>)> {
    let seeded = seed_cluster(env, 2).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in seeded.instances.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i}"), id))
            .await?;
    }
    let services: Api<Service> = Api::namespaced(client, "default");
    services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await?;
    let mut ccm = env.start_ccm(&[SERVICE_ONLY]).await?;
    eventually("the load balancer hostname", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    Ok((nodes, services))
}

/// Service `web` gets `annotations`, and Node `n0` leaves the backends.
async fn annotate_web_and_exclude_n0(
    services: &Api<Service>,
    nodes: &Api<Node>,
    annotations: &serde_json::Value,
) -> anyhow::Result<()> {
    services
        .patch("web", &PatchParams::default(), &Patch::Merge(annotations))
        .await?;
    let exclude = json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}});
    nodes
        .patch("n0", &PatchParams::default(), &Patch::Merge(&exclude))
        .await?;
    Ok(())
}

/// Runs a CCM with `flags`, counted at a proxy of its own, until the plan
/// (`aws-ccm plan` with `flags`) ends in "no changes"; the writes it sent.
async fn next_run_writes(env: &Env, flags: &[&str]) -> anyhow::Result<Vec<String>> {
    let (counted, mut ccm) = env.start_counted_ccm(flags).await?;
    eventually("the run to leave nothing to plan", WAIT, || async {
        let (_, text, _) = run_tool(env, "plan", flags, "").await.ok()?;
        text.ends_with("no changes\n").then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    Ok(written_actions(&counted))
}

async fn plan_text(env: &Env) -> Option<String> {
    let (ok, out, _) = run_tool(env, "plan", &[SERVICE_ONLY], "").await.ok()?;
    ok.then_some(out)
}

#[tokio::test]
async fn plan_shows_exactly_what_the_next_sync_does_and_no_changes_at_rest() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let (nodes, services) = web_made_by_a_stopped_ccm(&env).await?;

    // At rest: nothing to change.
    let (ok, out, err) = run_tool(&env, "plan", &[SERVICE_ONLY], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    assert_eq!(out, "no changes\n");

    // A health check and an attribute annotation, and one node excluded.
    let annotations = json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "30",
        "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true"
    }}});
    annotate_web_and_exclude_n0(&services, &nodes, &annotations).await?;

    let (ok, text, err) = run_tool(&env, "plan", &[SERVICE_ONLY], "").await?;
    assert!(ok, "{err}");
    assert!(text.starts_with("default/web:\n"), "{text}");
    assert!(text.contains("  ~ health check "), "{text}");
    assert!(text.contains(" -> HealthCheck {"), "{text}");
    assert!(text.contains("  ~ attributes "), "{text}");
    assert!(text.contains("  - deregister 1 instance(s)"), "{text}");
    assert!(text.ends_with("3 change(s)\n"), "{text}");
    let (ok, json_out, err) = run_tool(&env, "plan", &[SERVICE_ONLY, "-o", "json"], "").await?;
    assert!(ok, "{err}");
    let planned = planned_actions(&json_out)?;
    assert_eq!(
        planned,
        [
            "ConfigureHealthCheck",
            "DeregisterInstancesFromLoadBalancer",
            "ModifyLoadBalancerAttributes"
        ]
    );

    // The next sync, counted at a proxy of its own, makes exactly those calls.
    let (counted, mut ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    eventually("the sync to leave nothing to plan", WAIT, || async {
        plan_text(&env).await.filter(|t| t == "no changes\n")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    assert_eq!(written_actions(&counted), planned, "logs:\n{}", ccm.logs());
    env.finish().await
}

#[tokio::test]
async fn plan_shows_the_route_changes_the_next_reconcile_makes() -> anyhow::Result<()> {
    use crate::routes::{Cloud, as_strs, create, node as route_node, nodes_api, route_args};
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let table = cloud.route_table(true).await?;
    let ids = cloud.instances(2).await?;
    let nodes = nodes_api(&env).await?;
    create(&nodes, route_node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    create(&nodes, route_node("n2", Some(&ids[1]), &["10.244.2.0/24"])).await?;
    // A stale route: n2's instance, a CIDR no node holds.
    cloud
        .instance_route(&table, "10.244.9.0/24", &ids[1])
        .await?;

    let routes_only = "--controllers=route";
    let (ok, text, err) = run_tool(&env, "plan", &[routes_only], "").await?;
    assert!(ok, "{err}");
    assert!(text.starts_with("routes:\n"), "{text}");
    assert!(
        text.contains(&format!(
            "  + route 10.244.1.0/24 -> instance {} in {table} (node n1)",
            ids[0]
        )),
        "{text}"
    );
    assert!(text.contains(&format!("  - route 10.244.9.0/24 -> instance {} in {table} (not a pod CIDR of the node on its target instance)", ids[1])), "{text}");
    let (ok, json_out, err) = run_tool(&env, "plan", &[routes_only, "-o", "json"], "").await?;
    assert!(ok, "{err}");
    let planned = planned_actions(&json_out)?;
    assert_eq!(
        planned,
        [
            "CreateRoute",
            "CreateRoute",
            "DeleteRoute",
            "ModifyInstanceAttribute",
            "ModifyInstanceAttribute"
        ]
    );

    let (counted, mut ccm) = env.start_counted_ccm(&as_strs(&route_args(&[]))).await?;
    eventually("the reconcile to leave nothing to plan", WAIT, || async {
        let (ok, out, _) = run_tool(&env, "plan", &[routes_only], "").await.ok()?;
        (ok && out == "no changes\n").then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    assert_eq!(written_actions(&counted), planned, "logs:\n{}", ccm.logs());
    env.finish().await
}

/// A Service that no longer asks for a load balancer (its finalizer still
/// on): the plan shows the deletion, and the next sync sends exactly those
/// calls. A Service with a bad annotation: the plan says the sync would
/// fail and exits non-zero.
#[tokio::test]
async fn plan_shows_a_deletion_and_fails_on_a_sync_that_would_fail() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n0", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client, "default");
    let svc = services
        .create(&PostParams::default(), &lb_service("web", json!({})))
        .await?;
    let name =
        aws_ccm::aws::elb::load_balancer_name(svc.metadata.uid.as_deref().unwrap_or_default());
    let mut ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the load balancer hostname", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;

    let to_cluster_ip = json!({"spec": {"type": "ClusterIP"}});
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&to_cluster_ip),
        )
        .await?;
    let (ok, text, err) = run_tool(&env, "plan", &[SERVICE_ONLY], "").await?;
    assert!(ok, "{err}");
    assert!(
        text.contains(&format!(
            "  - classic ELB {name} (the Service no longer asks for a load balancer)"
        )),
        "{text}"
    );
    assert!(text.contains(&format!("(k8s-elb-{name})")), "{text}");
    let (_, json_out, _) = run_tool(&env, "plan", &[SERVICE_ONLY, "-o", "json"], "").await?;
    let planned = planned_actions(&json_out)?;
    assert_eq!(
        planned,
        [
            "DeleteLoadBalancer",
            "DeleteSecurityGroup",
            "RevokeSecurityGroupIngress"
        ]
    );
    let (counted, mut ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    eventually("the deletion to leave nothing to plan", WAIT, || async {
        plan_text(&env).await.filter(|t| t == "no changes\n")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    assert_eq!(written_actions(&counted), planned, "logs:\n{}", ccm.logs());

    let bad = json!({"service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "often"});
    services
        .create(&PostParams::default(), &lb_service("bad", bad))
        .await?;
    let (ok, text, _) = run_tool(&env, "plan", &[SERVICE_ONLY, "bad"], "").await?;
    assert!(!ok, "a sync that would fail fails the plan: {text}");
    assert!(
        text.contains("default/bad:\n  note: invalid Service"),
        "{text}"
    );
    env.finish().await
}

/// Issue 43: a Service handed to another controller (`aws-load-balancer-type:
/// external`) plans exactly "handed to another controller: nothing to do",
/// alive (type LoadBalancer) and after a type change (ClusterIP, still
/// holding the finalizer); the next run then sends no write and releases
/// the finalizer.
#[tokio::test]
async fn plan_shows_a_service_handed_to_another_controller_as_nothing_to_do() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let (_nodes, services) = web_made_by_a_stopped_ccm(&env).await?;
    let want = "default/web:\n  note: handed to another controller: nothing to do\nno changes\n";
    let external = json!({"metadata": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "external"}}});
    let to_cluster_ip = json!({"spec": {"type": "ClusterIP"}});
    for patch in [external, to_cluster_ip] {
        services
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let (ok, out, err) = run_tool(&env, "plan", &[SERVICE_ONLY], "").await?;
        assert!(ok, "aws-ccm plan failed: {err}");
        assert_eq!(out, want);
    }
    let (counted, mut ccm) = env.start_counted_ccm(&[SERVICE_ONLY]).await?;
    eventually("the finalizer to be released", WAIT, || async {
        let svc = services.get("web").await.ok()?;
        svc.metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;
    assert_eq!(written_actions(&counted), Vec::<String>::new());
    // The Service lives on and handed its load balancer over: `orphans`
    // counts it as alive, so the audit finds nothing.
    env.finish().await
}

/// After a swap, a Service carrying a value the Go CCM refuses
/// (`healthcheck-interval: abc`) and one it reads its own way (`type: NLB`,
/// a Classic ELB): the plan says so, fails (the settings cannot be
/// applied), and plans only the upkeep the next sync then makes: the
/// excluded node's deregistration, nothing else.
#[tokio::test]
async fn plan_shows_the_upkeep_of_a_service_with_a_refused_value() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let (nodes, services) = web_made_by_a_stopped_ccm(&env).await?;

    let annotations = json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "abc",
        "service.beta.kubernetes.io/aws-load-balancer-type": "NLB"
    }}});
    annotate_web_and_exclude_n0(&services, &nodes, &annotations).await?;

    let (ok, text, _) = run_tool(&env, "plan", &[SERVICE_ONLY], "").await?;
    assert!(!ok, "a refused value fails the plan:\n{text}");
    for w in [
        "  - deregister 1 instance(s)",
        "note: taken as the Go CCM takes it: service.beta.kubernetes.io/aws-load-balancer-type=\"NLB\"",
        "note: refused (the Go CCM refuses it too): service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval=\"abc\"",
        "1 change(s)\n",
    ] {
        assert!(text.contains(w), "{w:?} missing from:\n{text}");
    }
    let (_, json_out, _) = run_tool(&env, "plan", &[SERVICE_ONLY, "-o", "json"], "").await?;
    let planned = planned_actions(&json_out)?;
    assert_eq!(planned, ["DeregisterInstancesFromLoadBalancer"]);

    assert_eq!(next_run_writes(&env, &[SERVICE_ONLY]).await?, planned);
    env.finish().await
}

/// The tagging controller's part of a swap: a Node the Go CCM tagged (its
/// label carries the checksum of the tag set) plans nothing, an untagged one
/// plans its `CreateTags`, which the next run then sends, and nothing else.
#[tokio::test]
async fn plan_shows_the_tags_the_tagging_controller_would_write() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let tags = [("team".to_string(), "web".to_string())];
    let checksum = aws_ccm::controllers::tagging::tags_checksum(&tags);
    let mut tagged = node("n0", &seeded.instances[0]);
    tagged.metadata.labels = Some([("k8s.io/cloud-provider-aws".to_string(), checksum)].into());
    nodes.create(&PostParams::default(), &tagged).await?;
    nodes
        .create(&PostParams::default(), &node("n1", &seeded.instances[1]))
        .await?;
    let flags = ["--controllers=tagging", "--tags=team=web"];

    let (ok, text, err) = run_tool(&env, "plan", &flags, "").await?;
    assert!(ok, "{err}");
    let line = format!(
        "  + tags team=web on instance {} (node n1;",
        seeded.instances[1]
    );
    assert!(text.contains(&line), "{line:?} missing from:\n{text}");
    assert!(!text.contains(&seeded.instances[0]), "{text}");
    assert!(text.ends_with("1 change(s)\n"), "{text}");
    let (_, json_out, _) = run_tool(&env, "plan", &[flags[0], flags[1], "-o", "json"], "").await?;
    let planned = planned_actions(&json_out)?;
    assert_eq!(planned, ["CreateTags"]);

    assert_eq!(next_run_writes(&env, &flags).await?, planned);
    env.finish().await
}
