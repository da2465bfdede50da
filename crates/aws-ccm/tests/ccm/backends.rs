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
