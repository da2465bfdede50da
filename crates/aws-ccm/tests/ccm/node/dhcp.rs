//! Nodes on a custom DHCP domain (issue 45; kubernetes/cloud-provider-aws
//! #63, #384, #799): a kubelet named `ip-10-0-1-5.corp.example`, without a
//! providerID, whose name no instance has as its private DNS name. The Go
//! CCM leaves such a Node tainted forever; this one finds its instance by
//! the Node's address when exactly one live, cluster-tagged instance has it
//! (in cloud.conf's VPC when set), and keeps the taint, with the reason in
//! the `InstanceNotFound` Warning, on anything less.

use aws_sdk_ec2::types::Vpc;

use super::*;
use crate::ops_orphans::run_tool;

/// `ip-a-b-c-d.corp.example`: the hostname a DHCP option set with its own
/// domain gives the instance with private address `a.b.c.d`.
fn dhcp_name(instance: &Instance) -> String {
    format!("ip-{}.corp.example", ip(instance).replace('.', "-"))
}

fn ip(instance: &Instance) -> String {
    instance
        .private_ip_address()
        .unwrap_or_default()
        .to_string()
}

/// A tainted Node as a kubelet with `--cloud-provider=external` on such a
/// domain registers it: no providerID, its InternalIPs (and Hostname) in its
/// status, Ready or not.
async fn register_dhcp(
    api: &Api<Node>,
    name: &str,
    internal_ips: &[&str],
    ready: bool,
) -> anyhow::Result<()> {
    register_node(api, name, None, &[], ready).await?;
    let mut addresses: Vec<serde_json::Value> = (internal_ips.iter())
        .map(|ip| json!({"type": "InternalIP", "address": ip}))
        .collect();
    addresses.push(json!({"type": "Hostname", "address": name}));
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"addresses": addresses}})),
    )
    .await
    .with_context(|| format!("setting the addresses of node {name}"))?;
    Ok(())
}

/// A second VPC with the first one's CIDR and a subnet with the first
/// subnet's: the same private addresses exist twice in the Region.
async fn overlapping_vpc(ec2: &Ec2) -> anyhow::Result<(String, String)> {
    let vpc: Vpc = (ec2
        .client
        .create_vpc()
        .cidr_block("10.0.0.0/16")
        .send()
        .await?)
        .vpc
        .context("no vpc")?;
    let vpc = vpc.vpc_id.context("no vpc id")?;
    let subnet = (ec2.client.create_subnet())
        .vpc_id(&vpc)
        .cidr_block("10.0.0.0/20")
        .availability_zone("us-east-1a")
        .send()
        .await?
        .subnet
        .and_then(|s| s.subnet_id)
        .context("no subnet id")?;
    Ok((vpc, subnet))
}

/// One instance in `subnet` with `private_ip`, cluster-tagged or not.
async fn launch_at(
    ec2: &Ec2,
    subnet: &str,
    private_ip: Option<&str>,
    tagged: bool,
) -> anyhow::Result<Instance> {
    let mut run = (ec2.client.run_instances())
        .image_id(AMI)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet)
        .set_private_ip_address(private_ip.map(str::to_string));
    if tagged {
        run = run.tag_specifications(Ec2::cluster_tags());
    }
    let out = run.send().await?;
    let instance = out.instances().first().cloned().context("no instance")?;
    if let Some(want) = private_ip {
        anyhow::ensure!(ip(&instance) == want, "moto gave {instance:?}");
    }
    Ok(instance)
}

/// The instances EC2 (moto) returns for the `private-ip-address` filter:
/// the filter the lookup sends is honoured by the stand-in, so a test
/// cannot pass because it was ignored.
async fn described_at(ec2: &Ec2, address: &str) -> anyhow::Result<Vec<String>> {
    let out = (ec2.client.describe_instances())
        .filters(
            Filter::builder()
                .name("private-ip-address")
                .values(address)
                .build(),
        )
        .send()
        .await?;
    let mut ids: Vec<String> = (out.reservations().iter())
        .flat_map(|r| r.instances())
        .map(id)
        .collect();
    ids.sort();
    Ok(ids)
}

/// The sum and count of `aws_ccm_api_coalesced_batch_size` for `kind`.
fn batches(metrics: &str, kind: &str) -> (f64, f64) {
    let value = |suffix: &str| {
        let prefix = format!("aws_ccm_api_coalesced_batch_size_{suffix}{{kind=\"{kind}\"}} ");
        (metrics.lines())
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (value("sum"), value("count"))
}

/// From the Go CCM's state: one Node it initialized (left exactly as it
/// was) and one on a custom DHCP domain it left tainted. `aws-ccm plan`
/// shows that one's initialization and nothing for the other; the CCM then
/// initializes it from its instance, found by its address, as any node
/// (providerID, labels, addresses, taint removed, `Synced`), with no AWS
/// mutation. Later, NotReady with its instance terminated, its providerID
/// proves the instance gone and the lifecycle controller deletes it.
#[tokio::test]
async fn a_custom_dhcp_node_the_go_ccm_left_tainted_is_initialized_by_its_address()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let launched = ec2.launch(2).await?;
    let (go_made, dhcp) = (&launched[0], &launched[1]);
    assert_eq!(described_at(&ec2, &ip(dhcp)).await?, [id(dhcp)]);

    // What the Go CCM left: the one named by its private DNS name initialized...
    let done: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": dns(go_made), "labels": expected_labels(&dns(go_made), "m5.large")},
        "spec": {"providerID": format!("aws:///us-east-1a/{}", id(go_made))},
    }))?;
    nodes.create(&PostParams::default(), &done).await?;
    let go_addresses = json!([
        {"type": "InternalIP", "address": ip(go_made)},
        {"type": "InternalDNS", "address": dns(go_made)},
        {"type": "Hostname", "address": dns(go_made)},
    ]);
    let done = nodes
        .patch_status(
            &dns(go_made),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": go_addresses}})),
        )
        .await?;
    // ...and the one on the DHCP domain tainted, with its kubelet's address.
    let name = dhcp_name(dhcp);
    register_dhcp(&nodes, &name, &[&ip(dhcp)], true).await?;

    let flags = [NODE_CONTROLLERS, "--node-monitor-period=1s"];
    let (ok, text, err) = run_tool(&env, "plan", &flags, "").await?;
    assert!(ok, "{err}");
    let init = format!(
        "node {name}: initialize (providerID aws:///us-east-1a/{}",
        id(dhcp)
    );
    assert!(text.contains(&init), "{init:?} missing from:\n{text}");
    assert!(
        text.contains(&format!("instance {} found by its address", id(dhcp))),
        "{text}"
    );
    assert!(
        !text.contains(&dns(go_made)),
        "nothing for the Go CCM's node:\n{text}"
    );
    assert!(text.ends_with("1 change(s)\n"), "{text}");

    let ccm = env.start_ccm_via(&proxy.endpoint(), &flags).await?;
    let node = initialized(&nodes, &name, Duration::from_secs(60)).await?;
    assert_eq!(
        provider_id(&node),
        Some(format!("aws:///us-east-1a/{}", id(dhcp)))
    );
    assert_eq!(labels(&node), expected_labels(&name, "m5.large"));
    // The instance's addresses, as for a kubelet that set --provider-id.
    assert_eq!(
        addresses(&node),
        pairs(&[
            ("InternalIP", &ip(dhcp)),
            ("InternalDNS", &dns(dhcp)),
            ("Hostname", &dns(dhcp)),
        ])
    );
    eventually("a Synced event", Duration::from_secs(30), || async {
        let synced = events(&client, &name, "Synced").await;
        (!synced.is_empty()).then_some(())
    })
    .await?;
    // It went by the address: one batched lookup by private IP.
    let addr = ccm.https_addr().await?;
    let metrics = metrics_with(
        &addr,
        &["aws_ccm_api_coalesced_batch_size_count{kind=\"private_ip\"}"],
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(batches(&metrics, "private_ip"), (1.0, 1.0), "{metrics}");
    assert!(events(&client, &name, "InstanceNotFound").await.is_empty());

    // The Go CCM's node: not written, and nothing mutated in AWS.
    let after = nodes.get(&dns(go_made)).await?;
    assert_eq!(after.resource_version(), done.resource_version());
    assert_eq!(mutations(&proxy), BTreeMap::new());

    // Its providerID now proves its instance gone: terminated and
    // NotReady, the Node is deleted, as any other.
    (ec2.client.terminate_instances())
        .instance_ids(id(dhcp))
        .send()
        .await?;
    set_ready(&nodes, &name, false).await?;
    eventually("the node deleted", Duration::from_secs(90), || async {
        matches!(nodes.get_opt(&name).await, Ok(None)).then_some(())
    })
    .await?;
    assert!(nodes.get_opt(&dns(go_made)).await?.is_some());
    env.finish().await
}

/// Less than the proof keeps today's taint and Warning, with the reason:
/// the address in two VPCs (one instance untagged) without cloud.conf's
/// VPC, an untagged instance, no instance, no address. The lifecycle
/// controller keeps each of them NotReady (`KeepingNode`), never deletes.
/// With cloud.conf naming the VPC, the other VPC's instance no longer
/// counts and the first node is initialized, once the lookup by address,
/// failing at first, answers.
#[tokio::test]
async fn an_ambiguous_or_unproven_custom_dhcp_node_keeps_its_taint_with_the_reason()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let (other_vpc, other_subnet) = overlapping_vpc(&ec2).await?;
    let tagged = launch_at(&ec2, &ec2.subnet, Some("10.0.3.7"), true).await?;
    let twin = launch_at(&ec2, &other_subnet, Some("10.0.3.7"), false).await?;
    let untagged = launch_at(&ec2, &ec2.subnet, Some("10.0.3.8"), false).await?;
    let mut both = vec![id(&tagged), id(&twin)];
    both.sort();
    assert_eq!(described_at(&ec2, "10.0.3.7").await?, both);
    assert!(described_at(&ec2, "10.0.9.99").await?.is_empty());

    let ambiguous = dhcp_name(&tagged);
    let not_tagged = dhcp_name(&untagged);
    let (nobody, no_address) = ("ip-10-0-9-99.corp.example", "worker-new.corp.example");
    register_dhcp(&nodes, &ambiguous, &["10.0.3.7"], false).await?;
    register_dhcp(&nodes, &not_tagged, &["10.0.3.8"], false).await?;
    register_dhcp(&nodes, nobody, &["10.0.9.99"], false).await?;
    register_dhcp(&nodes, no_address, &[], false).await?;

    let flags = [NODE_CONTROLLERS, "--node-monitor-period=1s"];
    let (ok, text, err) = run_tool(&env, "plan", &flags, "").await?;
    assert!(ok, "{err}");
    for name in [&ambiguous, &not_tagged, nobody, no_address] {
        let note = format!(
            "note: node {name}: no instance found by private DNS name {name}, nor by its address ("
        );
        assert!(text.contains(&note), "{note:?} missing from:\n{text}");
    }
    assert!(!text.contains(": initialize ("), "{text}");

    let mut ccm = env.start_ccm(&flags).await?;
    let deadline = Duration::from_secs(60);
    let note = warning_note(&client, &ambiguous, "InstanceNotFound", deadline).await?;
    for part in [
        "2 live instances have its address",
        &id(&tagged),
        &id(&twin),
        &other_vpc,
        "set VPC in cloud.conf",
    ] {
        assert!(note.contains(part), "{part:?} missing from: {note}");
    }
    let note = warning_note(&client, &not_tagged, "InstanceNotFound", deadline).await?;
    assert!(
        note.contains(&id(&untagged))
            && note.contains(&format!("not tagged as a member of cluster {CLUSTER_ID}")),
        "{note}"
    );
    let note = warning_note(&client, nobody, "InstanceNotFound", deadline).await?;
    assert!(note.contains("no live instance has 10.0.9.99"), "{note}");
    let note = warning_note(&client, no_address, "InstanceNotFound", deadline).await?;
    assert!(
        note.contains("reports no IPv4 InternalIP address"),
        "{note}"
    );
    // The lifecycle controller judged each of them, and kept it.
    for name in [&ambiguous, &not_tagged, nobody, no_address] {
        warning_note(&client, name, "KeepingNode", deadline).await?;
    }
    for name in [&ambiguous, &not_tagged, nobody, no_address] {
        let node = nodes.get(name).await?;
        assert!(has_taint(&node, UNINITIALIZED), "{name} keeps its taint");
        assert_eq!(provider_id(&node), None, "{name}");
        assert!(!labels(&node).contains_key("topology.kubernetes.io/zone"));
    }

    // cloud.conf names the cluster's VPC: the twin in the other one no
    // longer counts, and the proof holds.
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(Duration::from_secs(30)).await?;
    std::fs::write(
        &env.cloud_conf,
        format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nVPC = {}\n",
            ec2.vpc
        ),
    )?;
    // The lookup by address failing is no answer either: the taint stays,
    // the Warning says which lookup failed, and the node is initialized
    // once AWS answers.
    let by_address = FaultRule::new(FaultKind::ServerError(503))
        .for_action("DescribeInstances")
        .with_param("Filter.1.Name", "private-ip-address");
    env.proxy.set_faults(vec![by_address]);
    let _ccm = env.start_ccm(&flags).await?;
    let note = warning_note(&client, &ambiguous, "InstanceLookupFailed", deadline).await?;
    assert!(
        note.contains("looking it up by its address (10.0.3.7) failed"),
        "{note}"
    );
    let fired: u64 = env.proxy.fired().iter().map(|(_, n)| n).sum();
    assert!(fired > 0, "the fault fired");
    assert!(has_taint(&nodes.get(&ambiguous).await?, UNINITIALIZED));
    env.proxy.set_faults(vec![]);
    let node = initialized(&nodes, &ambiguous, deadline).await?;
    assert_eq!(
        provider_id(&node),
        Some(format!("aws:///us-east-1a/{}", id(&tagged)))
    );
    for name in [&not_tagged, nobody, no_address] {
        let node = nodes.get(name).await?;
        assert!(has_taint(&node, UNINITIALIZED), "{name} keeps its taint");
    }
    env.finish().await
}

/// 100 custom-DHCP Nodes at once: their names go in one batched lookup,
/// their addresses in one more, whatever `--concurrent-node-syncs` is;
/// every Node gets its own instance.
#[tokio::test]
async fn a_hundred_custom_dhcp_nodes_cost_a_few_describe_calls() -> anyhow::Result<()> {
    const NODES: usize = 100;
    let env = Env::start().await?;
    let proxy = env.full_budget_proxy().await?;
    let ec2 = Ec2::new(&env).await?;
    let launched = ec2.launch(NODES as i32).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let registered: Vec<anyhow::Result<()>> =
        futures::stream::iter(launched.clone())
            .map(|instance| {
                let nodes = nodes.clone();
                async move {
                    register_dhcp(&nodes, &dhcp_name(&instance), &[&ip(&instance)], true).await
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
    registered
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;

    let ccm = start_for_a_burst(&env, &proxy).await?;
    eventually(
        "every node initialized",
        Duration::from_secs(120),
        || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            let done = (list.items.iter())
                .filter(|n| !has_taint(n, UNINITIALIZED) && provider_id(n).is_some())
                .count();
            (done == NODES).then_some(())
        },
    )
    .await?;
    let describe = proxy.calls().get("ec2", "DescribeInstances");
    let addr = ccm.https_addr().await?;
    let metrics = metrics_with(
        &addr,
        &["aws_ccm_api_coalesced_batch_size_count{kind=\"private_ip\"}"],
        Duration::from_secs(30),
    )
    .await?;
    let (asked, calls) = batches(&metrics, "private_ip");
    eprintln!(
        "{NODES} custom-DHCP nodes: DescribeInstances received {}, {calls} by address for {asked} addresses",
        describe.received
    );
    assert_eq!(asked, NODES as f64, "each address asked once");
    // The CCM saw every node at once (its first list): one batch by name
    // and one by address, or two of each when the first gathering window
    // closed before the list was through.
    assert!(calls <= 2.0, "{calls} calls by address");
    assert!(
        describe.received <= 4,
        "DescribeInstances calls: {}",
        describe.received
    );
    assert_eq!(proxy.calls().throttled_total(), 0);
    let list = nodes.list(&ListParams::default()).await?;
    let by_name: BTreeMap<String, String> =
        launched.iter().map(|i| (dhcp_name(i), id(i))).collect();
    for node in &list.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        assert_eq!(
            provider_id(node),
            Some(format!("aws:///us-east-1a/{}", by_name[&name]))
        );
    }
    assert_eq!(mutations(&proxy), BTreeMap::new());
    env.finish().await
}
