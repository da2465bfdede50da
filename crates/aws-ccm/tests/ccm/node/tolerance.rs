//! Tolerant where the Go CCM is tolerant (issue 31, the node half): what
//! another API does never holds a node's taint, and the node lifecycle
//! controller deletes only a Node whose instance is proven gone.

use super::*;

/// With `DescribeInstanceTopology` failing at the fault proxy, in turn
/// with 5xx, throttling and a hang past the call timeout, every joining
/// node is initialized (taint gone, zone and instance-type labels set)
/// while the fault still fires: the question holds no taint and its
/// retries take no worker. The Go CCM keeps these nodes (a type expected
/// to have a topology) tainted until AWS answers; before this change, 100
/// nodes joining with the API failing took minutes here.
#[tokio::test]
async fn a_failing_topology_api_holds_no_taint_whatever_its_failure() -> anyhow::Result<()> {
    const PER_FAULT: usize = 100;
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // Default --concurrent-node-syncs (1 worker), as upstream.
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &[NODE_CONTROLLERS])
        .await?;
    wait_controller_running(&ccm, "cloud-node-controller", Duration::from_secs(30)).await?;
    let hang = Duration::from_secs(45);
    let faults = [
        ("5xx", FaultKind::ServerError(500)),
        ("throttled", FaultKind::Throttle),
        ("hanging past the call timeout", FaultKind::Latency(hang)),
    ];
    for (what, fault) in faults {
        let instances = ec2
            .launch_typed(
                PER_FAULT as i32,
                aws_sdk_ec2::types::InstanceType::P4d24xlarge,
            )
            .await?;
        let declared: Vec<_> = (instances.iter().enumerate())
            .map(|(i, instance)| topology_of(instance, &three_layers(i)))
            .collect();
        proxy.set_instance_topology(declared);
        proxy.set_faults(vec![
            FaultRule::new(fault).for_action("DescribeInstanceTopology"),
        ]);
        let faulted_before = (proxy.calls())
            .get("ec2", "DescribeInstanceTopology")
            .faulted;
        let names = join(&nodes, &instances).await?;
        for name in &names {
            let node = initialized(&nodes, name, Duration::from_secs(60))
                .await
                .map_err(|e| anyhow::anyhow!("{what}: {e}\nlogs:\n{}", ccm.logs()))?;
            assert_eq!(
                labels(&node),
                expected_labels(name, "p4d.24xlarge"),
                "{what}: {name} initialized without network-node labels"
            );
        }
        // The fault fires (the questions follow the initializations).
        let faulted = eventually(
            &format!("{what}: the fault fired"),
            Duration::from_secs(30),
            || async {
                let faulted = (proxy.calls())
                    .get("ec2", "DescribeInstanceTopology")
                    .faulted;
                (faulted > faulted_before).then_some(faulted)
            },
        )
        .await?;
        for name in &names {
            assert!(layers(&nodes.get(name).await?).is_empty(), "{what}: {name}");
        }
        eprintln!(
            "topology {what}: {PER_FAULT} nodes initialized, {faulted} questions faulted so far"
        );
    }
    proxy.set_faults(vec![]);
    drop(ccm);
    env.finish().await
}

/// A Node as a cluster run by the Go CCM holds it: initialized or never
/// tainted (a machine outside EC2), with `provider_id` or none, NotReady.
pub(super) async fn existing_not_ready(
    nodes: &Api<Node>,
    name: &str,
    provider_id: Option<&str>,
) -> anyhow::Result<()> {
    let mut node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
    }))?;
    if let Some(id) = provider_id {
        node.spec.get_or_insert_default().provider_id = Some(id.to_string());
    }
    nodes
        .create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    set_ready(nodes, name, false).await
}

/// The Go CCM's state, NotReady Nodes all: the lifecycle controller
/// deletes the Nodes whose instance is proven gone, as the Go CCM's
/// (since upstream PR #1474 an instance-ID name EC2 does not know too), and
/// keeps the others, reporting those whose name finds no instance (Warning
/// `KeepingNode`, gauge `node_lifecycle_nodes_unverified`; the Go CCM
/// deletes these since PR #1474, a deliberate difference).
#[tokio::test]
async fn lifecycle_deletes_only_nodes_whose_instance_is_proven_gone() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let (proxy, ccm) = env
        .start_counted_ccm(&[NODE_CONTROLLERS, "--node-monitor-period=1s"])
        .await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let launched = ec2.launch(3).await?;
    ec2.client
        .terminate_instances()
        .instance_ids(id(&launched[0]))
        .instance_ids(id(&launched[1]))
        .send()
        .await?;
    let (terminated_by_pid, terminated_by_name) = (&launched[0], &launched[1]);
    let dns_of_terminated = dns(&launched[1]);
    let running = &launched[2];
    let never = "i-0aaaaaaaaaaaaaaaa";

    // Deleted by the Go CCM: a providerID terminated or not found; an
    // instance-ID name (no providerID) terminated, or not found
    // (InvalidInstanceID.NotFound; upstream PR #1474).
    let gone = [
        (
            "pid-terminated".to_string(),
            Some(format!("aws:///us-east-1a/{}", id(terminated_by_pid))),
        ),
        (
            "pid-not-found".to_string(),
            Some(format!("aws:///us-east-1a/{never}")),
        ),
        (id(terminated_by_name), None),
        ("i-0bbbbbbbbbbbbbbbb".to_string(), None),
    ];
    // Kept here: a name looked up as a private DNS name finds nothing
    // (which does not prove the machine gone), or the providerID is not
    // AWS's; or the instance is running.
    let unverified = [
        "worker-onprem-1".to_string(),
        "ip-10-0-200-1.ec2.internal".to_string(),
        // The private DNS name of a terminated instance: a name lookup
        // finds only live instances.
        dns_of_terminated,
    ];
    let kept = [
        (
            "kind-worker".to_string(),
            Some("kind://docker/kind/kind-worker".to_string()),
        ),
        (dns(running), None),
        (
            "pid-running".to_string(),
            Some(format!("aws:///us-east-1a/{}", id(running))),
        ),
    ];
    for (name, pid) in gone.iter().chain(&kept) {
        existing_not_ready(&nodes, name, pid.as_deref()).await?;
    }
    for name in &unverified {
        existing_not_ready(&nodes, name, None).await?;
    }

    for (name, _) in &gone {
        eventually(
            &format!("{name} deleted"),
            Duration::from_secs(90),
            || async { matches!(nodes.get_opt(name).await, Ok(None)).then_some(()) },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    }
    for name in &unverified {
        let note = warning_note(&client, name, "KeepingNode", Duration::from_secs(90)).await?;
        assert!(
            note.contains(name.as_str()) && note.contains("--provider-id"),
            "{note}"
        );
    }
    // A pass after every warning: a Node registered now is deleted, and the
    // kept ones are still there, warned once.
    let sentinel = "pid-sentinel";
    let sentinel_pid = "aws:///us-east-1a/i-0cccccccccccccccc";
    existing_not_ready(&nodes, sentinel, Some(sentinel_pid)).await?;
    eventually("the sentinel deleted", Duration::from_secs(90), || async {
        matches!(nodes.get_opt(sentinel).await, Ok(None)).then_some(())
    })
    .await?;
    let (_, metrics) = https_get(&ccm.https_addr().await?, "/metrics").await?;
    assert!(
        metrics.contains(&format!(
            "node_lifecycle_nodes_unverified {}",
            unverified.len()
        )),
        "{metrics}"
    );
    for name in unverified.iter().chain(kept.iter().map(|(n, _)| n)) {
        assert!(nodes.get_opt(name).await?.is_some(), "{name} is kept");
    }
    for name in &unverified {
        assert_eq!(
            events(&client, name, "KeepingNode").await.len(),
            1,
            "{name}"
        );
        assert!(
            events(&client, name, "DeletingNode").await.is_empty(),
            "{name}"
        );
    }
    assert!(proxy.calls().get("ec2", "DescribeInstances").received > 0);
    env.finish().await
}

/// A Node as the Go CCM leaves it once initialized: providerID, the zone,
/// region and instance-type label pairs and the zone ID, the addresses in
/// its order, no taint, Ready.
fn go_initialized(instance: &Instance) -> anyhow::Result<Node> {
    let name = dns(instance);
    let instance_type = instance.instance_type().map_or("", |t| t.as_str());
    let mut labels = expected_labels(&name, instance_type);
    labels.insert("kubernetes.io/hostname".into(), name.clone());
    let mut addresses =
        vec![json!({"type": "InternalIP", "address": instance.private_ip_address()})];
    if let Some(ip) = instance.public_ip_address() {
        addresses.push(json!({"type": "ExternalIP", "address": ip}));
    }
    addresses.push(json!({"type": "InternalDNS", "address": name}));
    addresses.push(json!({"type": "Hostname", "address": name}));
    if let Some(public) = instance.public_dns_name().filter(|d| !d.is_empty()) {
        addresses.push(json!({"type": "ExternalDNS", "address": public}));
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": format!("aws:///us-east-1a/{}", id(instance))},
        "status": {"addresses": addresses},
    }))?)
}

/// The `nodes` section of `aws-ccm plan -o json`: steps and notes.
async fn planned_nodes(env: &Env) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let flags = [NODE_CONTROLLERS, "-o", "json"];
    let (ok, out, err) = crate::ops_orphans::run_tool(env, "plan", &flags, "").await?;
    anyhow::ensure!(ok, "plan failed: {err}\n{out}");
    let sections: Vec<serde_json::Value> = serde_json::from_str(&out)?;
    let nodes = (sections.iter())
        .find(|s| s["subject"] == "nodes")
        .context("no nodes section")?;
    let texts = |field: &str, key: Option<&str>| -> Vec<String> {
        (nodes[field].as_array().cloned().unwrap_or_default().iter())
            .filter_map(|v| {
                key.map_or(v.as_str(), |k| v[k].as_str())
                    .map(str::to_string)
            })
            .collect()
    };
    Ok((texts("steps", Some("what")), texts("notes", None)))
}

/// `aws-ccm plan` plans the node controllers too. On the Go CCM's state
/// (initialized Nodes, a NotReady machine outside EC2 without providerID)
/// it plans no change, and notes the kept Node; a NotReady Node whose
/// instance is terminated and a joining Node are planned as the
/// controllers would handle them.
#[tokio::test]
async fn plan_shows_no_node_change_on_the_go_ccms_state() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let launched = ec2.launch(4).await?;
    for instance in &launched[..2] {
        // As EC2 describes it now (addresses, DNS names).
        let described = ec2.describe(&id(instance)).await?;
        let node = go_initialized(&described)?;
        nodes.create(&PostParams::default(), &node).await?;
        set_ready(&nodes, &dns(instance), true).await?;
    }
    existing_not_ready(&nodes, "worker-onprem-1", None).await?;

    let (steps, notes) = planned_nodes(&env).await?;
    assert!(
        steps.is_empty(),
        "no change on the Go CCM's state: {steps:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("worker-onprem-1") && n.contains("kept")),
        "{notes:?}"
    );

    // A terminated instance's NotReady Node, and a joining Node.
    let (gone, joining) = (&launched[2], &launched[3]);
    let pid = format!("aws:///us-east-1a/{}", id(gone));
    existing_not_ready(&nodes, "pid-terminated", Some(&pid)).await?;
    ec2.client
        .terminate_instances()
        .instance_ids(id(gone))
        .send()
        .await?;
    register_node(&nodes, &dns(joining), None, &[], true).await?;
    let (steps, _) = planned_nodes(&env).await?;
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(
        steps
            .iter()
            .any(|s| s.starts_with("node pid-terminated (NotReady")),
        "{steps:?}"
    );
    let init = format!(
        "node {}: initialize (providerID aws:///us-east-1a/{}",
        dns(joining),
        id(joining)
    );
    assert!(
        steps
            .iter()
            .any(|s| s.starts_with(&init) && s.contains("uninitialized taint removed")),
        "{steps:?}"
    );
    env.finish().await
}

/// A binary swap onto the Go CCM's state with `DescribeInstanceTopology`
/// failing: `p4d` Nodes the Go CCM initialized (no network-node labels, as
/// it would leave them during an outage) and a NotReady machine outside
/// EC2 without providerID. Nothing is deleted, tainted or rewritten while
/// the fault fires; once AWS answers, the topology Nodes get their labels
/// and nothing else changes.
#[tokio::test]
async fn a_swap_onto_the_go_ccms_nodes_changes_only_the_network_node_labels() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let p4d = ec2
        .launch_typed(2, aws_sdk_ec2::types::InstanceType::P4d24xlarge)
        .await?;
    let mut before = BTreeMap::new();
    for instance in &p4d {
        let node = go_initialized(&ec2.describe(&id(instance)).await?)?;
        nodes.create(&PostParams::default(), &node).await?;
        set_ready(&nodes, &dns(instance), true).await?;
        before.insert(dns(instance), nodes.get(&dns(instance)).await?);
    }
    existing_not_ready(&nodes, "worker-onprem-1", None).await?;
    let declared = (p4d.iter().enumerate())
        .map(|(i, instance)| topology_of(instance, &three_layers(i)))
        .collect();
    proxy.set_instance_topology(declared);
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::ServerError(500)).for_action("DescribeInstanceTopology"),
    ]);
    let ccm = env
        .start_ccm_via(
            &proxy.endpoint(),
            &[NODE_CONTROLLERS, "--node-monitor-period=1s"],
        )
        .await?;
    eventually(
        "the on-prem Node kept and reported",
        Duration::from_secs(60),
        || async {
            events(&client, "worker-onprem-1", "KeepingNode")
                .await
                .into_iter()
                .next()
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    eventually(
        "the topology questions failing",
        Duration::from_secs(30),
        || async {
            let faulted = proxy.calls().get("ec2", "DescribeInstanceTopology").faulted;
            (faulted > 0).then_some(())
        },
    )
    .await?;
    for (name, was) in &before {
        let now = nodes.get(name).await?;
        assert_eq!(labels(&now), labels(was), "{name}: labels unchanged");
        assert_eq!(
            addresses(&now),
            addresses(was),
            "{name}: addresses unchanged"
        );
        assert_eq!(now.spec, was.spec, "{name}: no taint, same providerID");
    }
    proxy.set_faults(vec![]);
    for (i, instance) in p4d.iter().enumerate() {
        let name = dns(instance);
        let want: BTreeMap<String, String> = (three_layers(i).into_iter().enumerate())
            .map(|(layer, n)| ((layer + 1).to_string(), n))
            .collect();
        let now = eventually(
            &format!("labels on {name}"),
            Duration::from_secs(90),
            || async {
                let node = nodes.get(&name).await.ok()?;
                (layers(&node) == want).then_some(node)
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
        let mut expected = labels(&before[&name]);
        expected.extend(want.iter().map(|(l, n)| (format!("{LAYER}{l}"), n.clone())));
        assert_eq!(
            labels(&now),
            expected,
            "{name}: only the layer labels added"
        );
        assert_eq!(addresses(&now), addresses(&before[&name]));
    }
    assert!(nodes.get_opt("worker-onprem-1").await?.is_some());
    env.finish().await
}
