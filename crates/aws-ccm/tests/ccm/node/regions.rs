//! Nodes of another Region (issue 43): a cluster that spans Regions runs one
//! CCM per Region, and a Node whose providerID names a zone of another
//! Region is that Region's CCM's. This one never looks its instance up,
//! deletes, taints, initializes or tags it, and reports it once (Warning
//! `NodeOutsideRegion`, gauge `node_lifecycle_nodes_outside_region`).

use super::tolerance::existing_not_ready;
use super::*;
use ccm_testkit::aws_proxy::RecordedCall;

const OUTSIDE: &str = "NodeOutsideRegion";

/// The recorded calls of `action` that name `instance` anywhere in their
/// parameters (an `InstanceId.N`, a `Filter.N.Value.M`, a `ResourceId.N`).
fn naming(proxy: &FaultProxy, action: &str, instance: &str) -> Vec<RecordedCall> {
    (proxy.requests(action).into_iter())
        .filter(|c| c.params.values().any(|v| v == instance))
        .collect()
}

/// How many times an Event was emitted: the recorder folds repeats into one
/// object and counts them.
fn times(event: &Event) -> i32 {
    (event.series.as_ref().map(|s| s.count))
        .or(event.deprecated_count)
        .unwrap_or(1)
}

/// Exactly one `NodeOutsideRegion` Warning on `name`, emitted once, naming
/// the node, its zone and both Regions.
async fn reported_once(client: &kube::Client, name: &str, zone: &str) -> anyhow::Result<()> {
    let found = events(client, name, OUTSIDE).await;
    anyhow::ensure!(found.len() == 1, "{name}: {found:?}");
    anyhow::ensure!(times(&found[0]) == 1, "{name} reported again: {found:?}");
    let note = found[0].note.clone().unwrap_or_default();
    for part in [name, zone, "eu-west-1", REGION] {
        anyhow::ensure!(note.contains(part), "{note} lacks {part}");
    }
    Ok(())
}

/// A NotReady Node of eu-west-1, whose instance us-east-1 (moto's Region)
/// does not hold: before, the lifecycle controller deleted it as "not
/// found". Now it is kept untouched and never asked about, while a Node of
/// this Region whose instance is unknown is deleted by the same passes.
#[tokio::test]
async fn a_not_ready_node_of_another_region_is_never_judged() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let (proxy, ccm) = env
        .start_counted_ccm(&[NODE_CONTROLLERS, "--node-monitor-period=1s"])
        .await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let eu_instance = "i-0eeeeeeeeeeeeeeee";
    let eu_pid = format!("aws:///eu-west-1a/{eu_instance}");
    existing_not_ready(&nodes, "eu-worker", Some(&eu_pid)).await?;
    let before = nodes.get("eu-worker").await?;

    let note = warning_note(&client, "eu-worker", OUTSIDE, Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(note.contains("eu-west-1a"), "{note}");
    // Passes after the report: a Node of this Region, its instance unknown
    // too, is deleted, so the lifecycle controller ran and judged it.
    for sentinel in ["sentinel-1", "sentinel-2"] {
        let pid = "aws:///us-east-1a/i-0cccccccccccccccc";
        existing_not_ready(&nodes, sentinel, Some(pid)).await?;
        eventually(
            &format!("{sentinel} deleted"),
            Duration::from_secs(60),
            || async { matches!(nodes.get_opt(sentinel).await, Ok(None)).then_some(()) },
        )
        .await?;
    }

    let now = nodes.get("eu-worker").await?;
    assert_eq!(now.spec, before.spec, "no taint added, same providerID");
    assert_eq!(now.metadata.uid, before.metadata.uid, "never deleted");
    assert!(!has_taint(&now, SHUTDOWN));
    assert!(
        events(&client, "eu-worker", "DeletingNode")
            .await
            .is_empty()
    );
    reported_once(&client, "eu-worker", "eu-west-1a").await?;
    let (_, metrics) = https_get(&ccm.https_addr().await?, "/metrics").await?;
    assert!(
        metrics.contains("node_lifecycle_nodes_outside_region 1\n"),
        "{metrics}"
    );
    assert!(
        naming(&proxy, "DescribeInstances", eu_instance).is_empty(),
        "never looked up"
    );
    assert!(
        !naming(&proxy, "DescribeInstances", "i-0cccccccccccccccc").is_empty(),
        "the sentinels were looked up"
    );
    env.finish().await
}

/// An uninitialized Node of eu-west-1 (its kubelet started with
/// `--provider-id`) keeps its taint and costs no AWS call; an initialized,
/// Ready one of eu-west-1 keeps the shutdown taint its own CCM set, is not
/// tagged, and is not untagged when deleted. A Node of this Region joining
/// meanwhile is initialized and tagged, so every controller ran.
#[tokio::test]
async fn nodes_of_another_region_are_not_initialized_refreshed_or_tagged() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let ec2 = Ec2::new(&env).await?;
    let (proxy, ccm) = env
        .start_counted_ccm(&[
            "--controllers=cloud-node,cloud-node-lifecycle,tagging",
            "--tags=team=infra",
            "--node-monitor-period=1s",
            "--node-status-update-frequency=1s",
        ])
        .await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let checksum = aws_ccm::controllers::tagging::tags_checksum(&[("team".into(), "infra".into())]);

    let joining = ("eu-joining", "i-0dddddddddddddddd", "eu-west-1b");
    let pid = format!("aws:///{}/{}", joining.2, joining.1);
    register_node(&nodes, joining.0, Some(&pid), &[], true).await?;
    // As the eu-west-1 CCM leaves a Node whose instance is stopped, then
    // started: Ready, the shutdown taint still on, tagged with the other
    // tag set.
    let ready = ("eu-ready", "i-0ffffffffffffffff", "eu-west-1a");
    let mut node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": ready.0, "labels": {"k8s.io/cloud-provider-aws": "0ld"}},
        "spec": {
            "providerID": format!("aws:///{}/{}", ready.2, ready.1),
            "taints": [{"key": SHUTDOWN, "effect": "NoSchedule"}],
        },
    }))?;
    node = nodes.create(&PostParams::default(), &node).await?;
    set_ready(&nodes, ready.0, true).await?;
    let ready_before = node.spec.clone();

    for (name, _, zone) in [joining, ready] {
        let note = warning_note(&client, name, OUTSIDE, Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
        assert!(note.contains(zone), "{note}");
    }
    // A Node of this Region joins after the reports: initialized and
    // tagged, and a NotReady one whose instance is terminated deleted, so the
    // cloud-node, tagging and lifecycle controllers each ran since.
    let ours = ec2.launch(1).await?.remove(0);
    register_node(&nodes, &dns(&ours), None, &[], true).await?;
    initialized(&nodes, &dns(&ours), Duration::from_secs(60)).await?;
    eventually("ours tagged", Duration::from_secs(60), || async {
        let node = nodes.get_opt(&dns(&ours)).await.ok()??;
        (labels(&node).get("k8s.io/cloud-provider-aws") == Some(&checksum)).then_some(())
    })
    .await?;
    // The sentinel's instance is a real, terminated one: the tagging
    // controller tags it too, and IAM allows that only on an instance the
    // cluster tag names (a made-up ID would be denied on AWS).
    let gone = ec2.launch(1).await?.remove(0);
    let sentinel = id(&gone);
    ec2.client
        .terminate_instances()
        .instance_ids(&sentinel)
        .send()
        .await?;
    existing_not_ready(
        &nodes,
        "sentinel",
        Some(&format!("aws:///us-east-1a/{sentinel}")),
    )
    .await?;
    eventually("the sentinel deleted", Duration::from_secs(60), || async {
        matches!(nodes.get_opt("sentinel").await, Ok(None)).then_some(())
    })
    .await?;

    let now = nodes.get(joining.0).await?;
    assert!(has_taint(&now, UNINITIALIZED), "the taint stays");
    assert_eq!(provider_id(&now), Some(pid.clone()));
    assert!(!labels(&now).contains_key("topology.kubernetes.io/zone"));
    let now = nodes.get(ready.0).await?;
    assert_eq!(now.spec, ready_before, "the shutdown taint stays");
    assert_eq!(
        labels(&now)
            .get("k8s.io/cloud-provider-aws")
            .map(String::as_str),
        Some("0ld"),
        "not tagged"
    );
    for (name, _, zone) in [joining, ready] {
        reported_once(&client, name, zone).await?;
    }
    let (_, metrics) = https_get(&ccm.https_addr().await?, "/metrics").await?;
    assert!(
        metrics.contains("node_lifecycle_nodes_outside_region 2\n"),
        "{metrics}"
    );

    // Deleted, the tagged one is not untagged here either.
    nodes.delete(ready.0, &Default::default()).await?;
    let ours_deleted = dns(&ours);
    nodes.delete(&ours_deleted, &Default::default()).await?;
    eventually(
        "ours untagged, so a tagging pass ran after both deletions",
        Duration::from_secs(60),
        || async {
            let tags = ec2.tags(&id(&ours)).await.ok()?;
            (!tags.contains_key("team")).then_some(())
        },
    )
    .await?;
    for (_, instance, _) in [joining, ready] {
        for action in ["DescribeInstances", "CreateTags", "DeleteTags"] {
            let calls = naming(&proxy, action, instance);
            assert!(calls.is_empty(), "{action} for {instance}: {calls:?}");
        }
    }
    // The recording works: this Region's instances were named.
    assert!(!naming(&proxy, "DescribeInstances", &sentinel).is_empty());
    for action in ["CreateTags", "DeleteTags"] {
        assert!(!naming(&proxy, action, &id(&ours)).is_empty(), "{action}");
    }
    env.finish().await
}
