//! Tolerant where the Go CCM is tolerant (issue 31): Services carrying the
//! values clusters keep for years. A value the Go CCM takes is taken the
//! same way with a Warning; one it refuses stops only the change it governs:
//! the load balancer's backends still follow the nodes. Counted at the fault
//! proxy.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::backends::{clb_instances, lb_name, nlb_targets};
use crate::service::{hostname, lb_service, node};
use crate::support::*;
use crate::swap::event_note;

const WAIT: Duration = Duration::from_secs(60);
const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
const BACKEND: &str = "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
const INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";

async fn annotate(
    services: &Api<Service>,
    name: &str,
    pairs: &[(&str, &str)],
) -> anyhow::Result<()> {
    let annotations: serde_json::Map<String, serde_json::Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": annotations}});
    services
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The mutating calls made since `before`, by `service:action`.
fn since(
    before: &std::collections::BTreeMap<String, u64>,
    now: std::collections::BTreeMap<String, u64>,
) -> std::collections::BTreeMap<String, u64> {
    now.into_iter()
        .map(|(k, n)| {
            let was = before.get(&k).copied().unwrap_or(0);
            (k, n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A Classic ELB and an NLB, then the values the Go CCM tolerates (`type:
/// NLB`, `backend-protocol: HTTP` / `grpc`) and refuses
/// (`healthcheck-interval: abc`, which the Go CCM's node-change path never
/// parses): a node joins and one leaves, and both load balancers' backends
/// follow, with no other change to AWS.
#[tokio::test]
async fn refused_and_tolerated_values_keep_backends_following_the_nodes() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 3).await?;
    let (i1, i2, i3) = (
        seeded.instances[0].clone(),
        seeded.instances[1].clone(),
        seeded.instances[2].clone(),
    );
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", &i1)).await?;
    nodes.create(&pp, &node("n2", &i2)).await?;
    let classic = services
        .create(&pp, &lb_service("classic", serde_json::json!({})))
        .await?;
    let network = services
        .create(
            &pp,
            &lb_service("network", serde_json::json!({TYPE: "nlb"})),
        )
        .await?;
    let (clb, nlb) = (lb_name(&classic), lb_name(&network));

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let first = BTreeSet::from([i1.clone(), i2.clone()]);
    eventually("both load balancers serving n1 and n2", WAIT, || async {
        let c = clb_instances(&elb, &clb).await?;
        let n = nlb_targets(&elbv2, &nlb).await?;
        (c == first && n == first).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    annotate(
        &services,
        "classic",
        &[(TYPE, "NLB"), (BACKEND, "HTTP"), (INTERVAL, "abc")],
    )
    .await?;
    annotate(
        &services,
        "network",
        &[(BACKEND, "grpc"), (INTERVAL, "abc")],
    )
    .await?;
    let tolerated = event_note(&client, "classic", "AnnotationValueTolerated").await?;
    assert!(tolerated.contains("Classic ELB"), "{tolerated}");
    for name in ["classic", "network"] {
        let refused = event_note(&client, name, "SyncLoadBalancerFailed").await?;
        for w in ["healthcheck-interval", "abc", "kept current"] {
            assert!(refused.contains(w), "{name}: {refused:?} lacks {w:?}");
        }
    }
    let before = mutations(&proxy);

    // A node joins and one leaves.
    nodes.create(&pp, &node("n3", &i3)).await?;
    nodes.delete("n1", &DeleteParams::default()).await?;
    let second = BTreeSet::from([i2.clone(), i3.clone()]);
    eventually("both load balancers following the nodes", WAIT, || async {
        let c = clb_instances(&elb, &clb).await?;
        let n = nlb_targets(&elbv2, &nlb).await?;
        (c == second && n == second).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // Only the backends moved: the listeners, health checks and the load
    // balancers themselves are as they were.
    let moved = since(&before, mutations(&proxy));
    let expected: BTreeSet<&str> = [
        "elasticloadbalancing:RegisterInstancesWithLoadBalancer",
        "elasticloadbalancing:DeregisterInstancesFromLoadBalancer",
        "elasticloadbalancingv2:RegisterTargets",
        "elasticloadbalancingv2:DeregisterTargets",
    ]
    .into();
    let keys: BTreeSet<&str> = moved.keys().map(String::as_str).collect();
    assert_eq!(keys, expected, "{moved:?}");
    let lb = elb
        .describe_load_balancers()
        .load_balancer_names(&clb)
        .send()
        .await?;
    let lb = &lb.load_balancer_descriptions()[0];
    assert_eq!(lb.health_check().map(|h| h.interval()), Some(10));
    let protocols: Vec<_> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|l| l.listener()?.instance_protocol())
        .collect();
    assert_eq!(protocols, vec!["TCP"]);
    assert!(hostname(&services.get("classic").await?).is_some());
    env.finish().await
}

/// A new Service whose type looks like `nlb` but is not exactly it: the Go
/// CCM would make a Classic ELB, which is almost surely not what was meant,
/// so none is made and a Warning says why. A word that is plainly not `nlb`
/// (`clb`) gets the Classic ELB the Go CCM makes, with a Warning.
#[tokio::test]
async fn a_new_service_of_type_upper_case_nlb_waits_and_one_of_type_clb_gets_a_classic_elb()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", &seeded.instances[0])).await?;
    let held = services
        .create(&pp, &lb_service("held", serde_json::json!({TYPE: "NLB"})))
        .await?;
    let clb = services
        .create(&pp, &lb_service("word", serde_json::json!({TYPE: "clb"})))
        .await?;

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    eventually("the clb Service's hostname", WAIT, || async {
        hostname(&services.get("word").await.ok()?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(clb_instances(&elb, &lb_name(&clb)).await.is_some());
    let note = event_note(&client, "word", "AnnotationValueTolerated").await?;
    assert!(
        note.contains("Classic ELB") && note.contains("clb"),
        "{note}"
    );
    let note = event_note(&client, "held", "AnnotationValueTolerated").await?;
    for w in ["\"NLB\"", "write nlb", "no load balancer is made"] {
        assert!(note.contains(w), "{note:?} lacks {w:?}");
    }
    let svc = services.get("held").await?;
    assert!(hostname(&svc).is_none());
    assert!(svc.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(clb_instances(&elb, &lb_name(&held)).await.is_none());
    assert_eq!(
        mutations(&proxy).get("elasticloadbalancing:CreateLoadBalancer"),
        Some(&1),
        "only the clb Service's load balancer is made"
    );
    env.finish().await
}

/// A cloud.conf the Go CCM starts with but fails every NLB sync on
/// (`NLBSecurityGroupMode = managed`, lower case): this CCM starts too, says
/// so, keeps the live NLB's targets following the nodes, and syncs a new
/// Classic ELB as the Go CCM does.
#[tokio::test]
async fn a_cloud_conf_value_the_go_ccm_fails_nlbs_on_keeps_them_in_upkeep() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 3).await?;
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", &seeded.instances[0])).await?;
    nodes.create(&pp, &node("n2", &seeded.instances[1])).await?;
    let network = services
        .create(
            &pp,
            &lb_service("network", serde_json::json!({TYPE: "nlb"})),
        )
        .await?;
    let nlb = lb_name(&network);
    let mut ccm = env.start_ccm(&["--controllers=service"]).await?;
    let first = BTreeSet::from([seeded.instances[0].clone(), seeded.instances[1].clone()]);
    eventually("the NLB serving n1 and n2", WAIT, || async {
        (nlb_targets(&elbv2, &nlb).await? == first).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(WAIT).await?;

    let conf = std::fs::read_to_string(&env.cloud_conf)?;
    std::fs::write(
        &env.cloud_conf,
        format!("{conf}NLBSecurityGroupMode = managed\n"),
    )?;
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let refused = event_note(&client, "network", "SyncLoadBalancerFailed").await?;
    for w in ["NLBSecurityGroupMode", "managed", "kept current"] {
        assert!(refused.contains(w), "{refused:?} lacks {w:?}");
    }
    // The start-up warning names the key too.
    ccm.wait_for_log("NLBSecurityGroupMode", WAIT).await?;
    services
        .create(&pp, &lb_service("classic", serde_json::json!({})))
        .await?;
    nodes.create(&pp, &node("n3", &seeded.instances[2])).await?;
    let all: BTreeSet<String> = seeded.instances.iter().cloned().collect();
    eventually(
        "the NLB following the nodes and the CLB made",
        WAIT,
        || async {
            let host = hostname(&services.get("classic").await.ok()?);
            (nlb_targets(&elbv2, &nlb).await? == all && host.is_some()).then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let elbv2_writes: Vec<String> = mutations(&proxy)
        .into_keys()
        .filter(|k| k.starts_with("elasticloadbalancingv2:"))
        .collect();
    assert_eq!(elbv2_writes, ["elasticloadbalancingv2:RegisterTargets"]);
    env.finish().await
}

const SCHEME: &str = "service.beta.kubernetes.io/aws-load-balancer-scheme";
const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
const TARGET_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";

/// The scheme of NLB `name`, as AWS describes it.
async fn nlb_scheme(elbv2: &elbv2::Client, name: &str) -> Option<String> {
    let out = elbv2
        .describe_load_balancers()
        .names(name)
        .send()
        .await
        .ok()?;
    Some(out.load_balancers().first()?.scheme()?.as_str().to_string())
}

/// Issue 43: a new NLB Service carrying the AWS Load Balancer Controller's
/// `scheme: internal` but no `aws-load-balancer-internal`, which the Go CCM
/// would make internet-facing: no load balancer is made (no create call at
/// the proxy, beside a plain Service's that is), and one Warning
/// `AnnotationNotRead` names both annotations and the fix, the hold first,
/// then the controller's other key (`nlb-target-type`). Setting
/// `aws-load-balancer-internal: "true"` resolves it: an internal NLB.
#[tokio::test]
async fn a_new_service_asking_for_an_internal_scheme_gets_no_public_load_balancer()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    Api::<Node>::all(client.clone())
        .create(&pp, &node("n1", &seeded.instances[0]))
        .await?;
    let asked = serde_json::json!({TYPE: "nlb", SCHEME: "internal", TARGET_TYPE: "instance"});
    let private = services.create(&pp, &lb_service("private", asked)).await?;
    let plain = services
        .create(&pp, &lb_service("plain", serde_json::json!({TYPE: "nlb"})))
        .await?;

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    eventually("the plain Service's hostname", WAIT, || async {
        hostname(&services.get("plain").await.ok()?)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let note = event_note(&client, "private", "AnnotationNotRead").await?;
    for w in [
        SCHEME,
        INTERNAL,
        "internet-facing",
        "\"true\"",
        "no load balancer is made",
        TARGET_TYPE,
    ] {
        assert!(note.contains(w), "{note:?} lacks {w:?}");
    }
    assert!(
        note.find(SCHEME) < note.find(TARGET_TYPE),
        "the hold comes first: {note}"
    );
    let svc = services.get("private").await?;
    assert!(hostname(&svc).is_none());
    assert!(svc.metadata.finalizers.unwrap_or_default().is_empty());
    assert!(nlb_scheme(&elbv2, &lb_name(&private)).await.is_none());
    assert_eq!(
        mutations(&proxy).get("elasticloadbalancingv2:CreateLoadBalancer"),
        Some(&1),
        "only the plain Service's load balancer is made"
    );
    assert_eq!(
        nlb_scheme(&elbv2, &lb_name(&plain)).await.as_deref(),
        Some("internet-facing")
    );

    // Resolved as the Warning says: the NLB is made, internal.
    annotate(&services, "private", &[(INTERNAL, "true")]).await?;
    let scheme = eventually("the private Service's NLB", WAIT, || async {
        hostname(&services.get("private").await.ok()?)?;
        nlb_scheme(&elbv2, &lb_name(&private)).await
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(scheme, "internal");
    env.finish().await
}

/// Issue 43: a live internet-facing NLB whose Service then gets the AWS
/// Load Balancer Controller's `scheme: internal` (and `nlb-target-type`):
/// kept as it is, never recreated, with a Warning; a node joining still
/// becomes a target, and that registration is the only write.
#[tokio::test]
async fn an_existing_load_balancer_given_an_internal_scheme_is_kept_and_its_targets_follow()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let (i1, i2) = (seeded.instances[0].clone(), seeded.instances[1].clone());
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    nodes.create(&pp, &node("n1", &i1)).await?;
    let network = services
        .create(&pp, &lb_service("web", serde_json::json!({TYPE: "nlb"})))
        .await?;
    let nlb = lb_name(&network);
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let first = BTreeSet::from([i1.clone()]);
    eventually("the NLB serving n1", WAIT, || async {
        hostname(&services.get("web").await.ok()?)?;
        (nlb_targets(&elbv2, &nlb).await? == first).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let arn = || async {
        let out = elbv2
            .describe_load_balancers()
            .names(&nlb)
            .send()
            .await
            .ok()?;
        out.load_balancers()
            .first()?
            .load_balancer_arn()
            .map(str::to_string)
    };
    let made = arn().await.expect("the NLB");
    let before = mutations(&proxy);

    annotate(
        &services,
        "web",
        &[(SCHEME, "internal"), (TARGET_TYPE, "instance")],
    )
    .await?;
    let note = event_note(&client, "web", "AnnotationNotRead").await?;
    for w in [SCHEME, INTERNAL, "kept as it is", TARGET_TYPE] {
        assert!(note.contains(w), "{note:?} lacks {w:?}");
    }
    assert!(!note.contains("no load balancer is made"), "{note}");

    nodes.create(&pp, &node("n2", &i2)).await?;
    let both = BTreeSet::from([i1, i2]);
    eventually("the joined node registered", WAIT, || async {
        (nlb_targets(&elbv2, &nlb).await? == both).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let moved = since(&before, mutations(&proxy));
    let keys: Vec<&str> = moved.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        ["elasticloadbalancingv2:RegisterTargets"],
        "{moved:?}"
    );
    assert_eq!(arn().await.as_deref(), Some(made.as_str()), "not recreated");
    assert_eq!(
        nlb_scheme(&elbv2, &nlb).await.as_deref(),
        Some("internet-facing")
    );
    assert!(hostname(&services.get("web").await?).is_some());
    env.finish().await
}
