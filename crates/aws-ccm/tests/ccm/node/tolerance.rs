//! Tolerant where the Go CCM is tolerant (issue 31, the node half): what
//! another API does never holds a node's taint, and the node lifecycle
//! controller deletes only a Node whose instance is proven gone.

use super::*;

/// `count` nodes named after `instances` registered together, as kubelets
/// with `--cloud-provider=external` do.
async fn join(nodes: &Api<Node>, instances: &[Instance]) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = instances.iter().map(dns).collect();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names.clone())
        .map(|name| {
            let nodes = nodes.clone();
            async move { register_node(&nodes, &name, None, &[], true).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(names)
}

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
    ccm.wait_for_log("cloud-node controller started", Duration::from_secs(30))
        .await?;
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
