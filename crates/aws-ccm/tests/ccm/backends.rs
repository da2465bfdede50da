//! Which nodes are load-balancer backends, from Nodes exactly as they exist
//! under the Go CCM: a bare `i-…` providerID (kubelets started with
//! `--provider-id=i-…`), `target-node-labels` with bare keys, and the
//! exclusion label set to `false`.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::PostParams;

use crate::service::{hostname, lb_service};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

fn labelled_node(name: &str, provider_id: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"providerID": provider_id}
    }))
    .unwrap()
}

pub(crate) fn lb_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.clone().unwrap();
    format!("a{}", uid.replace('-', ""))[..32].to_string()
}

pub(crate) async fn clb_instances(
    elb: &aws_sdk_elasticloadbalancing::Client,
    name: &str,
) -> Option<BTreeSet<String>> {
    let out = elb
        .describe_load_balancers()
        .load_balancer_names(name)
        .send()
        .await
        .ok()?;
    let lb = out.load_balancer_descriptions().first()?;
    Some(
        lb.instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect(),
    )
}

pub(crate) async fn nlb_targets(elbv2: &elbv2::Client, name: &str) -> Option<BTreeSet<String>> {
    let lbs = elbv2
        .describe_load_balancers()
        .names(name)
        .send()
        .await
        .ok()?;
    let arn = lbs
        .load_balancers()
        .first()?
        .load_balancer_arn()?
        .to_string();
    let tgs = elbv2
        .describe_target_groups()
        .load_balancer_arn(&arn)
        .send()
        .await
        .ok()?;
    let tg = tgs.target_groups().first()?.target_group_arn()?.to_string();
    let health = elbv2
        .describe_target_health()
        .target_group_arn(&tg)
        .send()
        .await
        .ok()?;
    Some(
        health
            .target_health_descriptions()
            .iter()
            // AWS lists a deregistered target as draining for the
            // deregistration delay (moto drops it at once): not a backend.
            .filter(|d| {
                d.target_health().and_then(|h| h.state())
                    != Some(&elbv2::types::TargetHealthStateEnum::Draining)
            })
            .filter_map(|d| d.target()?.id().map(str::to_string))
            .collect(),
    )
}

#[tokio::test]
async fn bare_provider_ids_bare_label_keys_and_exclude_false_are_backends() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let (i1, i2) = (seeded.instances[0].clone(), seeded.instances[1].clone());
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    let exclude = "node.kubernetes.io/exclude-from-external-load-balancers";
    // n1: bare providerID, in the pool, exclusion label explicitly false.
    let n1_labels = serde_json::json!({"pool": "web", exclude: "false"});
    nodes
        .create(&pp, &labelled_node("n1", &i1, n1_labels))
        .await?;
    // n2: a valid instance, but not in the pool.
    let n2_labels = serde_json::json!({"other": "web"});
    let n2 = labelled_node("n2", &format!("aws:///us-east-1a/{i2}"), n2_labels);
    nodes.create(&pp, &n2).await?;
    // n3: in the pool, but its providerID names no instance.
    let n3 = labelled_node(
        "n3",
        "aws:///us-east-1a/oops",
        serde_json::json!({"pool": "x"}),
    );
    nodes.create(&pp, &n3).await?;

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let key = "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
    let clb = services
        .create(
            &pp,
            &lb_service("classic", serde_json::json!({key: "pool"})),
        )
        .await?;
    let nlb_annotations = serde_json::json!({
        key: "pool=",
        "service.beta.kubernetes.io/aws-load-balancer-type": "nlb"
    });
    let nlb = services
        .create(&pp, &lb_service("network", nlb_annotations))
        .await?;

    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    for name in ["classic", "network"] {
        eventually("the load balancer hostname", WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{name}: {e}\nlogs:\n{}", ccm.logs()))?;
    }
    let want = BTreeSet::from([i1.clone()]);
    assert_eq!(
        clb_instances(&elb, &lb_name(&clb)).await,
        Some(want.clone())
    );
    assert_eq!(nlb_targets(&elbv2, &lb_name(&nlb)).await, Some(want));
    let logs = ccm.logs();
    assert!(
        logs.contains("n3") && logs.contains("aws:///us-east-1a/oops"),
        "the malformed providerID is reported with node and value:\n{logs}"
    );
    env.finish().await
}

/// Calls that read a load balancer in full: the targets-only path makes none.
const FULL_READS: [(&str, &str); 7] = [
    ("elasticloadbalancing", "DescribeLoadBalancers"),
    ("elasticloadbalancing", "DescribeLoadBalancerAttributes"),
    ("elasticloadbalancingv2", "DescribeLoadBalancers"),
    ("elasticloadbalancingv2", "DescribeListeners"),
    ("elasticloadbalancingv2", "DescribeLoadBalancerAttributes"),
    ("elasticloadbalancingv2", "DescribeTargetGroups"),
    ("elasticloadbalancingv2", "DescribeTargetGroupAttributes"),
];

/// Waits until every CLB in `clbs` and every NLB in `nlbs` targets exactly `want`.
async fn wait_targets(
    seeded: &Seeded,
    clbs: &[String],
    nlbs: &[String],
    want: &BTreeSet<String>,
) -> anyhow::Result<()> {
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let elbv2 = elbv2::Client::new(&seeded.conf);
    eventually("every load balancer to target the nodes", WAIT, || async {
        for name in clbs {
            if clb_instances(&elb, name).await.as_ref() != Some(want) {
                return None;
            }
        }
        for name in nlbs {
            if nlb_targets(&elbv2, name).await.as_ref() != Some(want) {
                return None;
            }
        }
        Some(())
    })
    .await
}

/// What one node change cost at the proxy: no full read of any load
/// balancer, and one register or deregister call per load balancer.
fn assert_targets_only(
    calls: &ccm_testkit::aws_proxy::CallCounts,
    k: u64,
    register: bool,
) -> anyhow::Result<()> {
    for (service, action) in FULL_READS {
        let n = calls.get(service, action).received;
        anyhow::ensure!(n == 0, "{service} {action}: {n} calls; want none");
    }
    let (clb_write, nlb_write, clb_other, nlb_other) = if register {
        (
            "RegisterInstancesWithLoadBalancer",
            "RegisterTargets",
            "DeregisterInstancesFromLoadBalancer",
            "DeregisterTargets",
        )
    } else {
        (
            "DeregisterInstancesFromLoadBalancer",
            "DeregisterTargets",
            "RegisterInstancesWithLoadBalancer",
            "RegisterTargets",
        )
    };
    for (service, action, want) in [
        ("elasticloadbalancing", clb_write, k),
        ("elasticloadbalancingv2", nlb_write, k),
        ("elasticloadbalancing", clb_other, 0),
        ("elasticloadbalancingv2", nlb_other, 0),
        // One per NLB target group.
        ("elasticloadbalancingv2", "DescribeTargetHealth", k),
    ] {
        let n = calls.get(service, action).received;
        anyhow::ensure!(n == want, "{service} {action}: {n} calls; want {want}");
    }
    Ok(())
}

/// A node added behind K classic ELBs and K NLBs moves targets only: no
/// load balancer, listener or attribute read, one register call per load
/// balancer (per target group); a node removed, one deregister call each.
/// A change to a Service's spec still ensures its load balancer in full.
#[tokio::test]
async fn a_node_change_moves_targets_only() -> anyhow::Result<()> {
    const K: usize = 2;
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 3).await?;
    let [i1, i2, i3] = [0, 1, 2].map(|i| seeded.instances[i].clone());
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    for (name, id) in [("n1", &i1), ("n2", &i2)] {
        nodes.create(&pp, &crate::service::node(name, id)).await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let (mut clbs, mut nlbs) = (Vec::new(), Vec::new());
    for i in 0..K {
        let clb = lb_service(&format!("classic-{i}"), serde_json::json!({}));
        clbs.push(lb_name(&services.create(&pp, &clb).await?));
        let annotations =
            serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"});
        let nlb = lb_service(&format!("network-{i}"), annotations);
        nlbs.push(lb_name(&services.create(&pp, &nlb).await?));
    }
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let mut want = BTreeSet::from([i1.clone(), i2.clone()]);
    wait_targets(&seeded, &clbs, &nlbs, &want).await?;
    for i in 0..K {
        for name in [format!("classic-{i}"), format!("network-{i}")] {
            eventually("the load balancer hostname", WAIT, || async {
                services.get(&name).await.ok().as_ref().and_then(hostname)
            })
            .await
            .map_err(|e| anyhow::anyhow!("{name}: {e}\nlogs:\n{}", ccm.logs()))?;
        }
    }

    // A node joins.
    proxy.reset_counts();
    nodes.create(&pp, &crate::service::node("n3", &i3)).await?;
    want.insert(i3.clone());
    wait_targets(&seeded, &clbs, &nlbs, &want).await?;
    assert_targets_only(&proxy.calls(), K as u64, true)
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // A node goes.
    proxy.reset_counts();
    nodes.delete("n1", &Default::default()).await?;
    want.remove(&i1);
    wait_targets(&seeded, &clbs, &nlbs, &want).await?;
    assert_targets_only(&proxy.calls(), K as u64, false)
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // A spec change is a full ensure.
    proxy.reset_counts();
    let interval = serde_json::json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "20"}}});
    services
        .patch(
            "classic-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&interval),
        )
        .await?;
    // The targets-only path never configures a health check; the full
    // ensure does (its attributes are known from the sweep's settings record,
    // so they need no read).
    eventually(
        "the full ensure of the changed Service's ELB",
        WAIT,
        || async {
            let calls = proxy.calls();
            (calls
                .get("elasticloadbalancing", "ConfigureHealthCheck")
                .received
                > 0)
            .then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// A Node from `value` (its metadata, spec).
fn node_from(value: serde_json::Value) -> Node {
    let mut node = serde_json::json!({"apiVersion": "v1", "kind": "Node"});
    node.as_object_mut()
        .unwrap()
        .extend(value.as_object().unwrap().clone());
    serde_json::from_value(node).unwrap()
}

/// The value of `metric` for the service controller's queue.
fn service_queue(body: &str, metric: &str) -> Option<f64> {
    let prefix = format!("{metric}{{name=\"service\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))?
        .trim()
        .parse()
        .ok()
}

/// Waits until the service controller holds no Service due and runs no
/// sync (`workqueue_depth` and `workqueue_longest_running_processor_seconds`
/// of its queue both 0).
async fn service_queue_idle(addr: &str) -> anyhow::Result<()> {
    eventually("an idle service queue", WAIT, || async {
        let (_, body) = https_get(addr, "/metrics").await.ok()?;
        let depth = service_queue(&body, "workqueue_depth")?;
        let running = service_queue(&body, "workqueue_longest_running_processor_seconds")?;
        (depth == 0.0 && running == 0.0).then_some(())
    })
    .await
}

/// The cluster autoscaler's `ToBeDeletedByClusterAutoscaler` taint and a
/// deletionTimestamp (a Node held by a finalizer while it drains) on
/// backend nodes, as k8s.io/cloud-provider's service controller takes them:
/// neither change starts a sync, so both nodes stay registered behind the
/// Classic ELB and the NLB while a new Service, synced after the CCM saw
/// both changes, already leaves them out. When the draining Node is gone,
/// the node sync that follows deregisters it, and the tainted node with it
/// (upstream leaves tainted nodes out of any sync).
#[tokio::test]
async fn a_tainted_or_draining_node_stays_registered_until_the_node_set_changes()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 3).await?;
    let [i1, i2, i3] = [0, 1, 2].map(|i| seeded.instances[i].clone());
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    let spec = |id: &str| serde_json::json!({"providerID": format!("aws:///us-east-1a/{id}")});
    for (name, id) in [("n1", &i1), ("n3", &i3)] {
        let node = node_from(serde_json::json!({"metadata": {"name": name}, "spec": spec(id)}));
        nodes.create(&pp, &node).await?;
    }
    // Karpenter's finalizer holds n2 while it drains.
    let n2 = node_from(serde_json::json!({
        "metadata": {"name": "n2", "finalizers": ["karpenter.sh/termination"]},
        "spec": spec(&i2),
    }));
    nodes.create(&pp, &n2).await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let clb = lb_name(
        &services
            .create(&pp, &lb_service("classic", serde_json::json!({})))
            .await?,
    );
    let nlb_type = serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"});
    let nlb = lb_name(
        &services
            .create(&pp, &lb_service("network", nlb_type))
            .await?,
    );
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let addr = ccm.https_addr().await?;
    let all = BTreeSet::from([i1.clone(), i2.clone(), i3.clone()]);
    let (clbs, nlbs) = (vec![clb.clone()], vec![nlb.clone()]);
    wait_targets(&seeded, &clbs, &nlbs, &all)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    for name in ["classic", "network"] {
        eventually("the load balancer hostname", WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await?;
    }
    service_queue_idle(&addr).await?;

    // The autoscaler taints n1; n2 is deleted and waits on its finalizer.
    // Then the three are labelled for a probe Service, n3 last: the Node
    // watch is in order, so a CCM that has seen n3's label has seen the
    // taint and the deletion.
    proxy.reset_counts();
    let registers_before = proxy.requests("RegisterInstancesWithLoadBalancer").len();
    let merge = |v: serde_json::Value| kube::api::Patch::Merge(v);
    let patch = kube::api::PatchParams::default();
    let taint = serde_json::json!({
        "metadata": {"labels": {"probe": "yes"}},
        "spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1764600000",
                             "effect": "NoSchedule"}]},
    });
    nodes.patch("n1", &patch, &merge(taint)).await?;
    nodes.delete("n2", &Default::default()).await?;
    let label = serde_json::json!({"metadata": {"labels": {"probe": "yes"}}});
    for name in ["n2", "n3"] {
        nodes.patch(name, &patch, &merge(label.clone())).await?;
    }
    let draining = nodes.get("n2").await?;
    assert!(draining.metadata.deletion_timestamp.is_some());
    let targets = "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
    let probe = lb_name(
        &services
            .create(
                &pp,
                &lb_service("probe", serde_json::json!({targets: "probe=yes"})),
            )
            .await?,
    );
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let only_n3 = BTreeSet::from([i3.clone()]);
    eventually("the probe targeting n3 alone", WAIT, || async {
        (clb_instances(&elb, &probe).await.as_ref() == Some(&only_n3)).then_some(())
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    service_queue_idle(&addr)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    // The tainted and the draining node are still behind both load
    // balancers, and no call moved a target of theirs.
    let elbv2 = elbv2::Client::new(&seeded.conf);
    assert_eq!(clb_instances(&elb, &clb).await, Some(all.clone()));
    assert_eq!(nlb_targets(&elbv2, &nlb).await, Some(all.clone()));
    let calls = proxy.calls();
    for (service, action) in [
        (
            "elasticloadbalancing",
            "DeregisterInstancesFromLoadBalancer",
        ),
        ("elasticloadbalancingv2", "DeregisterTargets"),
        ("elasticloadbalancingv2", "RegisterTargets"),
    ] {
        let n = calls.get(service, action).received;
        assert_eq!(n, 0, "{service} {action}: {n} calls\nlogs:\n{}", ccm.logs());
    }
    let registers = proxy.requests("RegisterInstancesWithLoadBalancer");
    let named: BTreeSet<&str> = registers[registers_before..]
        .iter()
        .filter_map(|c| c.params.get("LoadBalancerName").map(String::as_str))
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([probe.as_str()]),
        "only the probe's ELB registered"
    );

    // n2's finalizer is removed: the Node is gone, and the node sync that
    // follows takes it and the tainted n1 out of both; the probe, already
    // without them, is not touched.
    proxy.reset_counts();
    let release = serde_json::json!({"metadata": {"finalizers": []}});
    nodes.patch("n2", &patch, &merge(release)).await?;
    eventually("n2 gone", WAIT, || async {
        matches!(nodes.get_opt("n2").await, Ok(None)).then_some(())
    })
    .await?;
    wait_targets(&seeded, &clbs, &nlbs, &only_n3)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    service_queue_idle(&addr).await?;
    let calls = proxy.calls();
    for (service, action, want) in [
        (
            "elasticloadbalancing",
            "DeregisterInstancesFromLoadBalancer",
            1,
        ),
        ("elasticloadbalancingv2", "DeregisterTargets", 1),
        (
            "elasticloadbalancing",
            "RegisterInstancesWithLoadBalancer",
            0,
        ),
        ("elasticloadbalancingv2", "RegisterTargets", 0),
    ] {
        let n = calls.get(service, action).received;
        assert_eq!(
            n,
            want,
            "{service} {action}: {n} calls\nlogs:\n{}",
            ccm.logs()
        );
    }
    assert_eq!(clb_instances(&elb, &probe).await, Some(only_n3));
    env.finish().await
}
