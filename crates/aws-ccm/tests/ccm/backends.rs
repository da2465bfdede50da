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

fn lb_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.clone().unwrap();
    format!("a{}", uid.replace('-', ""))[..32].to_string()
}

async fn clb_instances(
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

async fn nlb_targets(elbv2: &elbv2::Client, name: &str) -> Option<BTreeSet<String>> {
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
