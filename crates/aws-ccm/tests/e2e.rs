//! The end-to-end suite. Two ways to run it:
//!
//! - **Cluster mode** (`e2e/run.sh` on a machine with Docker): `E2E_KUBECONFIG`
//!   and `E2E_AWS_ENDPOINT` point at a kind cluster and an AWS emulator the
//!   script seeded; the CCM already runs in the cluster from `manifests/`.
//!   `E2E_CLUSTER_ID` names the cluster tag and `E2E_FEATURES` (e.g.
//!   `nodes,routes` for LocalStack, which has no ELB) picks the tests the
//!   emulator can serve; the others say they are skipped and why.
//! - **Local mode** (CI, `cargo nextest run --test e2e`): each test starts the
//!   API test server and moto, seeds them as the script and the kubelets
//!   would, and runs the real binary as a subprocess.
//!
//! The assertions are the same in both modes.

#[path = "common/ipv6.rs"]
mod ipv6;
#[path = "ccm/support.rs"]
#[allow(dead_code)]
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, ResourceType};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

use support::{Ccm, Env, eventually, tags};

const WAIT: Duration = Duration::from_secs(120);
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const POD_CIDR: &str = "10.244.0.0/16";

/// Where the suite runs: a cluster and emulator, or local test servers.
struct Target {
    kube: kube::Client,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    cluster_id: String,
    features: Vec<String>,
    /// Local mode: the servers and the CCM, stopped on drop.
    _local: Option<(Env, Ccm)>,
}

impl Target {
    async fn start() -> anyhow::Result<Target> {
        match (
            std::env::var("E2E_KUBECONFIG"),
            std::env::var("E2E_AWS_ENDPOINT"),
        ) {
            (Ok(kubeconfig), Ok(endpoint)) => {
                let config = kube::Config::from_custom_kubeconfig(
                    kube::config::Kubeconfig::read_from(&kubeconfig)?,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await?;
                let aws = ccm_testkit::moto::test_sdk_config(&endpoint).await;
                Ok(Target {
                    kube: kube::Client::try_from(config)?,
                    ec2: aws_sdk_ec2::Client::new(&aws),
                    elb: aws_sdk_elasticloadbalancing::Client::new(&aws),
                    elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&aws),
                    cluster_id: std::env::var("E2E_CLUSTER_ID")
                        .unwrap_or_else(|_| "kind-e2e".into()),
                    features: std::env::var("E2E_FEATURES")
                        .unwrap_or_default()
                        .split(',')
                        .map(str::to_string)
                        .collect(),
                    _local: None,
                })
            }
            _ => Target::local().await,
        }
    }

    /// Seeds moto as e2e/seed.py does and registers three nodes as
    /// kubelets with `--cloud-provider=external --provider-id` would.
    async fn local() -> anyhow::Result<Target> {
        let env = Env::start().await?;
        let aws = env.moto.sdk_config().await;
        let ec2 = aws_sdk_ec2::Client::new(&aws);
        let instances = seed(&ec2, support::CLUSTER_ID, 3).await?;
        let kube = env.api.client().await?;
        let nodes: Api<Node> = Api::all(kube.clone());
        for (i, id) in instances.iter().enumerate() {
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": format!("e2e-node-{i}")},
                "spec": {
                    "providerID": format!("aws:///us-east-1a/{id}"),
                    "podCIDR": format!("10.244.{i}.0/24"),
                    "podCIDRs": [format!("10.244.{i}.0/24")],
                    "taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]
                }
            }))?;
            nodes.create(&PostParams::default(), &node).await?;
        }
        let ccm = env
            .start_ccm(&[
                "--configure-cloud-routes=true",
                &format!("--cluster-cidr={POD_CIDR}"),
            ])
            .await?;
        Ok(Target {
            kube,
            ec2,
            elb: aws_sdk_elasticloadbalancing::Client::new(&aws),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&aws),
            cluster_id: support::CLUSTER_ID.into(),
            features: ["nodes", "routes", "clb", "nlb"].map(String::from).to_vec(),
            _local: Some((env, ccm)),
        })
    }

    /// Whether the emulator serves `feature`; prints why a test stops early.
    fn serves(&self, feature: &str) -> bool {
        let ok = self.features.iter().any(|f| f == feature);
        if !ok {
            eprintln!(
                "skipped: E2E_FEATURES does not include {feature} (this emulator cannot serve it)"
            );
        }
        ok
    }

    fn cluster_tag(&self) -> String {
        format!("kubernetes.io/cluster/{}", self.cluster_id)
    }
}

/// A cluster-tagged VPC with an IPv6 /56, public subnets with a /64 each, route table and node group, and
/// `count` instances; the instance IDs in launch order.
async fn seed(
    ec2: &aws_sdk_ec2::Client,
    cluster_id: &str,
    count: i32,
) -> anyhow::Result<Vec<String>> {
    let owned = format!("kubernetes.io/cluster/{cluster_id}");
    let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await?;
    let vpc_id = vpc
        .vpc()
        .and_then(|v| v.vpc_id())
        .unwrap_or_default()
        .to_string();
    let subnet = ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.1.0/24")
        .availability_zone("us-east-1a")
        .tag_specifications(tags(
            ResourceType::Subnet,
            &[(&owned, "owned"), ("kubernetes.io/role/elb", "1")],
        ))
        .send()
        .await?;
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .unwrap_or_default()
        .to_string();
    // An Amazon-provided IPv6 /56: a dual-stack NLB needs IPv6 in each of
    // its subnets (AWS refuses one without, and so does the fault proxy).
    let v6_block = ipv6::give_vpc(ec2, &vpc_id).await?;
    ipv6::give_subnet(ec2, &subnet_id, &v6_block, 0).await?;
    let igw = ec2.create_internet_gateway().send().await?;
    let igw_id = igw
        .internet_gateway()
        .and_then(|g| g.internet_gateway_id())
        .unwrap_or_default()
        .to_string();
    ec2.attach_internet_gateway()
        .vpc_id(&vpc_id)
        .internet_gateway_id(&igw_id)
        .send()
        .await?;
    let table = ec2
        .create_route_table()
        .vpc_id(&vpc_id)
        .tag_specifications(tags(ResourceType::RouteTable, &[(&owned, "owned")]))
        .send()
        .await?;
    let table_id = table
        .route_table()
        .and_then(|t| t.route_table_id())
        .unwrap_or_default()
        .to_string();
    ec2.create_route()
        .route_table_id(&table_id)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw_id)
        .send()
        .await?;
    ec2.associate_route_table()
        .route_table_id(&table_id)
        .subnet_id(&subnet_id)
        .send()
        .await?;
    // A second public zone, so a load balancer's subnets can change.
    let second = ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.2.0/24")
        .availability_zone("us-east-1b")
        .tag_specifications(tags(
            ResourceType::Subnet,
            &[(&owned, "owned"), ("kubernetes.io/role/elb", "1")],
        ))
        .send()
        .await?;
    let second_id = (second.subnet())
        .and_then(|s| s.subnet_id())
        .unwrap_or_default();
    ipv6::give_subnet(ec2, second_id, &v6_block, 1).await?;
    ec2.associate_route_table()
        .route_table_id(&table_id)
        .subnet_id(second_id)
        .send()
        .await?;
    let group = ec2
        .create_security_group()
        .group_name(format!("{cluster_id}-nodes"))
        .description("e2e nodes")
        .vpc_id(&vpc_id)
        .tag_specifications(tags(ResourceType::SecurityGroup, &[(&owned, "owned")]))
        .send()
        .await?;
    let run = ec2
        .run_instances()
        .image_id(ccm_testkit::moto::AMI)
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Medium)
        .min_count(count)
        .max_count(count)
        .subnet_id(&subnet_id)
        .security_group_ids(group.group_id().unwrap_or_default())
        .tag_specifications(tags(ResourceType::Instance, &[(&owned, "owned")]))
        .send()
        .await?;
    let mut instances: Vec<_> = run.instances().to_vec();
    instances.sort_by_key(|i| i.ami_launch_index());
    let ids: Vec<String> = instances
        .iter()
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect();
    // A stale route, as a node replaced under the same PodCIDR leaves: the
    // first node's range still points at the second instance.
    if ids.len() > 1 {
        ec2.create_route()
            .route_table_id(&table_id)
            .destination_cidr_block("10.244.0.0/24")
            .instance_id(&ids[1])
            .send()
            .await?;
    }
    Ok(ids)
}

fn is_initialized(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    spec.and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| p.starts_with("aws://"))
        && !spec
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED))
        && node
            .labels()
            .contains_key("node.kubernetes.io/instance-type")
        && node.labels().contains_key("topology.kubernetes.io/zone")
}

#[tokio::test]
async fn nodes_are_initialized_and_untainted() -> anyhow::Result<()> {
    let t = Target::start().await?;
    if !t.serves("nodes") {
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(t.kube.clone());
    let names = eventually("every node initialized", WAIT, || async {
        let list = nodes.list(&ListParams::default()).await.ok()?;
        (!list.items.is_empty() && list.items.iter().all(is_initialized))
            .then(|| list.items.iter().map(|n| n.name_any()).collect::<Vec<_>>())
    })
    .await?;
    for name in names {
        let node = nodes.get(&name).await?;
        let status = node.status.unwrap_or_default();
        let addresses = status.addresses.unwrap_or_default();
        assert!(
            addresses.iter().any(|a| a.type_ == "InternalIP"),
            "node {name} has no InternalIP from EC2: {addresses:?}"
        );
        assert_eq!(
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("topology.kubernetes.io/region"))
                .map(String::as_str),
            Some("us-east-1"),
            "node {name} region label"
        );
    }
    Ok(())
}

#[tokio::test]
async fn routes_cover_every_pod_cidr() -> anyhow::Result<()> {
    let t = Target::start().await?;
    if !t.serves("routes") {
        return Ok(());
    }
    let nodes: Api<Node> = Api::all(t.kube.clone());
    // Node name -> (PodCIDR, instance ID) once the node is initialized.
    let want: BTreeMap<String, (String, String)> =
        eventually("nodes with PodCIDRs and provider IDs", WAIT, || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            let want: BTreeMap<_, _> = list
                .items
                .iter()
                .filter_map(|n| {
                    let spec = n.spec.as_ref()?;
                    let id = spec.provider_id.as_deref()?.rsplit('/').next()?.to_string();
                    Some((n.name_any(), (spec.pod_cidr.clone()?, id)))
                })
                .collect();
            (!list.items.is_empty() && want.len() == list.items.len()).then_some(want)
        })
        .await?;
    let tag = t.cluster_tag();
    eventually(
        "a route per PodCIDR in the cluster's route table",
        WAIT,
        || async {
            let tables = t
                .ec2
                .describe_route_tables()
                .filters(Filter::builder().name("tag-key").values(&tag).build())
                .send()
                .await
                .ok()?;
            let routes: BTreeMap<String, String> = tables
                .route_tables()
                .iter()
                .flat_map(|t| t.routes())
                .filter_map(|r| {
                    Some((
                        r.destination_cidr_block()?.to_string(),
                        r.instance_id()?.to_string(),
                    ))
                })
                .collect();
            want.values()
                .all(|(cidr, id)| routes.get(cidr) == Some(id))
                .then_some(())
        },
    )
    .await?;
    Ok(())
}

fn hostname(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

#[tokio::test]
async fn classic_elb_service_gets_a_load_balancer_and_leaves_nothing() -> anyhow::Result<()> {
    let t = Target::start().await?;
    if !t.serves("clb") {
        return Ok(());
    }
    let services: Api<Service> = Api::namespaced(t.kube.clone(), "default");
    let name = format!("e2e-clb-{}", std::process::id());
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": "e2e"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080}]}
    }))?;
    let created = services.create(&PostParams::default(), &svc).await?;
    let uid = created.uid().unwrap_or_default();
    let lb_name: String = format!("a{}", uid.replace('-', ""))
        .chars()
        .take(32)
        .collect();

    let host = eventually("the Service's load balancer hostname", WAIT, || async {
        hostname(&services.get(&name).await.ok()?)
    })
    .await?;
    let lbs = t
        .elb
        .describe_load_balancers()
        .load_balancer_names(&lb_name)
        .send()
        .await?;
    let lb = &lbs.load_balancer_descriptions()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    assert_eq!(
        lb.listener_descriptions().len(),
        1,
        "one listener for one port"
    );
    assert!(!lb.instances().is_empty(), "backend instances registered");
    let tags = t
        .elb
        .describe_tags()
        .load_balancer_names(&lb_name)
        .send()
        .await?;
    let owned = tags.tag_descriptions()[0]
        .tags()
        .iter()
        .any(|tag| tag.key() == t.cluster_tag() && tag.value() == Some("owned"));
    assert!(
        owned,
        "load balancer {lb_name} carries {}=owned",
        t.cluster_tag()
    );

    annotate(&services, &name, ADDITIONAL_TAGS, "team=e2e").await?;
    eventually("the new tag on the classic ELB", WAIT, || async {
        let tags = t
            .elb
            .describe_tags()
            .load_balancer_names(&lb_name)
            .send()
            .await
            .ok()?;
        tags.tag_descriptions()
            .first()?
            .tags()
            .iter()
            .any(|tag| tag.key() == "team" && tag.value() == Some("e2e"))
            .then_some(())
    })
    .await?;

    services.delete(&name, &DeleteParams::default()).await?;
    eventually("the Service gone (finalizer removed)", WAIT, || async {
        matches!(services.get_opt(&name).await, Ok(None)).then_some(())
    })
    .await?;
    let lb_left = t
        .elb
        .describe_load_balancers()
        .load_balancer_names(&lb_name)
        .send()
        .await;
    assert!(
        lb_left
            .map(|o| o.load_balancer_descriptions().is_empty())
            .unwrap_or(true),
        "load balancer {lb_name} still exists"
    );
    let groups = t
        .ec2
        .describe_security_groups()
        .filters(
            Filter::builder()
                .name("group-name")
                .values(format!("k8s-elb-{lb_name}"))
                .build(),
        )
        .send()
        .await?;
    assert!(
        groups.security_groups().is_empty(),
        "owned group k8s-elb-{lb_name} left behind"
    );
    Ok(())
}

const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
const ADDITIONAL_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";

async fn annotate(
    services: &Api<Service>,
    name: &str,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    services
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Backend nodes as upstream counts them for a plain Service: all but those
/// labelled out (kubeadm labels its control plane so). The label's value is
/// a Go boolean; only a false one keeps the node.
async fn backend_count(kube: &kube::Client) -> anyhow::Result<usize> {
    let nodes: Api<Node> = Api::all(kube.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| {
            n.labels()
                .get("node.kubernetes.io/exclude-from-external-load-balancers")
                .is_none_or(|v| matches!(v.as_str(), "0" | "f" | "F" | "false" | "FALSE" | "False"))
        })
        .count())
}

/// The target groups the NLB's listeners forward to: (ARN, health-check
/// interval, healthy threshold).
async fn target_groups(t: &Target, lb_arn: &str) -> Option<Vec<(String, i32, i32)>> {
    let listeners = t
        .elbv2
        .describe_listeners()
        .load_balancer_arn(lb_arn)
        .send()
        .await
        .ok()?;
    let arns: Vec<String> = listeners
        .listeners()
        .iter()
        .flat_map(|l| l.default_actions())
        .filter_map(|a| a.target_group_arn().map(str::to_string))
        .collect();
    if arns.is_empty() {
        return Some(Vec::new());
    }
    let out = t
        .elbv2
        .describe_target_groups()
        .set_target_group_arns(Some(arns))
        .send()
        .await
        .ok()?;
    Some(
        out.target_groups()
            .iter()
            .map(|g| {
                (
                    g.target_group_arn().unwrap_or_default().to_string(),
                    g.health_check_interval_seconds().unwrap_or_default(),
                    g.healthy_threshold_count().unwrap_or_default(),
                )
            })
            .collect(),
    )
}

async fn listener_count(t: &Target, lb_arn: &str) -> Option<usize> {
    let out = t
        .elbv2
        .describe_listeners()
        .load_balancer_arn(lb_arn)
        .send()
        .await
        .ok()?;
    Some(out.listeners().len())
}

#[tokio::test]
async fn network_load_balancer_service_follows_changes_and_leaves_nothing() -> anyhow::Result<()> {
    use aws_sdk_elasticloadbalancingv2::types::{IpAddressType, LoadBalancerTypeEnum};

    let t = Target::start().await?;
    if !t.serves("nlb") {
        return Ok(());
    }
    let services: Api<Service> = Api::namespaced(t.kube.clone(), "default");
    let name = format!("e2e-nlb-{}", std::process::id());
    // The cluster's public subnets, two zones (seeded so): the NLB starts in
    // one and is then spread over both.
    let tag = t.cluster_tag();
    let found = t
        .ec2
        .describe_subnets()
        .filters(Filter::builder().name("tag-key").values(&tag).build())
        .send()
        .await?;
    let mut subnets: Vec<String> = found
        .subnets()
        .iter()
        .filter_map(|s| s.subnet_id().map(str::to_string))
        .collect();
    subnets.sort();
    assert!(
        subnets.len() >= 2,
        "two cluster subnets seeded: {subnets:?}"
    );
    let port = |name: &str, port: i32, node_port: i32| serde_json::json!({"name": name, "port": port, "targetPort": port + 8000, "nodePort": node_port, "protocol": "TCP"});
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default",
                     "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
                                     SUBNETS: subnets[0]}},
        "spec": {"type": "LoadBalancer", "selector": {"app": "e2e"},
                 "ports": [port("http", 80, 30081), port("https", 443, 30443)]}
    }))?;
    let created = services.create(&PostParams::default(), &svc).await?;
    let uid = created.uid().unwrap_or_default();
    let lb_name: String = format!("a{}", uid.replace('-', ""))
        .chars()
        .take(32)
        .collect();

    let host = eventually("the NLB's hostname in status", WAIT, || async {
        hostname(&services.get(&name).await.ok()?)
    })
    .await?;
    let lbs = t
        .elbv2
        .describe_load_balancers()
        .names(&lb_name)
        .send()
        .await?;
    let lb = &lbs.load_balancers()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    assert_eq!(lb.r#type(), Some(&LoadBalancerTypeEnum::Network));
    let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_string();
    let tags = t
        .elbv2
        .describe_tags()
        .resource_arns(&lb_arn)
        .send()
        .await?;
    let lb_tags = tags.tag_descriptions()[0].tags();
    assert!(
        lb_tags
            .iter()
            .any(|tag| tag.key() == Some(t.cluster_tag().as_str()) && tag.value() == Some("owned")),
        "NLB {lb_name} carries {}=owned",
        t.cluster_tag()
    );
    assert_eq!(
        listener_count(&t, &lb_arn).await,
        Some(2),
        "a listener per port"
    );
    let groups = target_groups(&t, &lb_arn).await.unwrap_or_default();
    assert_eq!(groups.len(), 2, "a target group per port");
    let backends = backend_count(&t.kube).await?;
    for (arn, _, _) in &groups {
        let health = t
            .elbv2
            .describe_target_health()
            .target_group_arn(arn)
            .send()
            .await?;
        assert_eq!(
            health.target_health_descriptions().len(),
            backends,
            "every backend node registered in {arn}"
        );
    }

    // In-place changes, each its own elbv2 call.
    annotate(&services, &name, ADDITIONAL_TAGS, "team=e2e").await?;
    eventually("the new tag on the NLB", WAIT, || async {
        let tags = t
            .elbv2
            .describe_tags()
            .resource_arns(&lb_arn)
            .send()
            .await
            .ok()?;
        tags.tag_descriptions()
            .first()?
            .tags()
            .iter()
            .any(|tag| tag.key() == Some("team") && tag.value() == Some("e2e"))
            .then_some(())
    })
    .await?;
    annotate(
        &services,
        &name,
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold",
        "5",
    )
    .await?;
    eventually(
        "healthy threshold 5 on every target group",
        WAIT,
        || async {
            let groups = target_groups(&t, &lb_arn).await?;
            (groups.len() == 2 && groups.iter().all(|(_, _, healthy)| *healthy == 5)).then_some(())
        },
    )
    .await?;
    // The interval is part of a target group's identity: new groups, the
    // listeners moved to them, the old ones deleted.
    annotate(
        &services,
        &name,
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval",
        "10",
    )
    .await?;
    let before: Vec<String> = groups.iter().map(|(arn, _, _)| arn.clone()).collect();
    eventually(
        "target groups replaced with 10 s intervals",
        WAIT,
        || async {
            let groups = target_groups(&t, &lb_arn).await?;
            (groups.len() == 2
                && groups
                    .iter()
                    .all(|(arn, interval, _)| *interval == 10 && !before.contains(arn)))
            .then_some(())
        },
    )
    .await?;
    annotate(
        &services,
        &name,
        "service.beta.kubernetes.io/aws-load-balancer-ip-address-type",
        "dualstack",
    )
    .await?;
    eventually("the NLB dual-stack", WAIT, || async {
        let lbs = t
            .elbv2
            .describe_load_balancers()
            .names(&lb_name)
            .send()
            .await
            .ok()?;
        (lbs.load_balancers().first()?.ip_address_type() == Some(&IpAddressType::Dualstack))
            .then_some(())
    })
    .await?;
    assert_eq!(
        lb.availability_zones().len(),
        1,
        "created in the one annotated subnet"
    );
    let both = format!("{},{}", subnets[0], subnets[1]);
    annotate(&services, &name, SUBNETS, &both).await?;
    eventually("the NLB in both annotated subnets", WAIT, || async {
        let lbs = t
            .elbv2
            .describe_load_balancers()
            .names(&lb_name)
            .send()
            .await
            .ok()?;
        let mut zones: Vec<String> = lbs
            .load_balancers()
            .first()?
            .availability_zones()
            .iter()
            .filter_map(|z| z.subnet_id().map(str::to_string))
            .collect();
        zones.sort();
        (zones == subnets[..2]).then_some(())
    })
    .await?;
    let patch = serde_json::json!({"spec": {"ports": [port("http", 80, 30081)]}});
    services
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    eventually("one listener and one target group left", WAIT, || async {
        let groups = target_groups(&t, &lb_arn).await?;
        (listener_count(&t, &lb_arn).await? == 1 && groups.len() == 1).then_some(())
    })
    .await?;

    services.delete(&name, &DeleteParams::default()).await?;
    eventually("the Service gone (finalizer removed)", WAIT, || async {
        matches!(services.get_opt(&name).await, Ok(None)).then_some(())
    })
    .await?;
    let left = t
        .elbv2
        .describe_load_balancers()
        .names(&lb_name)
        .send()
        .await;
    assert!(
        left.map(|o| o.load_balancers().is_empty()).unwrap_or(true),
        "NLB {lb_name} still exists"
    );
    // Upstream's target group names keep the first 8 alphanumerics of the name.
    let short: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    let prefix = format!("k8s-default-{short}-");
    let groups = t.elbv2.describe_target_groups().send().await?;
    let orphans: Vec<_> = groups
        .target_groups()
        .iter()
        .filter_map(|g| g.target_group_name())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(orphans.is_empty(), "target groups left behind: {orphans:?}");
    let rules = t.ec2.describe_security_groups().send().await?;
    let ours: Vec<_> = rules
        .security_groups()
        .iter()
        .flat_map(|g| g.ip_permissions())
        .flat_map(|p| p.ip_ranges())
        .filter_map(|r| r.description())
        .filter(|d| d.contains(&lb_name))
        .collect();
    assert!(
        ours.is_empty(),
        "node rules for {lb_name} left behind: {ours:?}"
    );
    Ok(())
}
