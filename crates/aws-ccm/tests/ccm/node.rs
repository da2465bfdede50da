//! Node initialization, node lifecycle and instance tagging (issue 4): the
//! real binary against moto and the API test server.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use aws_sdk_ec2::types::{
    Filter, Instance, InstanceNetworkInterfaceSpecification, ResourceType, Tag, TagSpecification,
};
use ccm_testkit::apiserver::ServerOptions;
use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule, ProxyConfig};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::*;

mod dhcp;
mod regions;
mod tolerance;

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
use ccm_testkit::moto::AMI;
/// What moto reports for us-east-1a.
const ZONE_ID: &str = "use1-az6";

/// A VPC with one subnet in us-east-1a, in moto.
struct Ec2 {
    client: aws_sdk_ec2::Client,
    vpc: String,
    subnet: String,
}

impl Ec2 {
    async fn new(env: &Env) -> anyhow::Result<Ec2> {
        Ec2::create(env, false).await
    }

    /// With an Amazon-provided IPv6 block on the VPC and the subnet.
    async fn dual_stack(env: &Env) -> anyhow::Result<Ec2> {
        Ec2::create(env, true).await
    }

    async fn create(env: &Env, ipv6: bool) -> anyhow::Result<Ec2> {
        let client = aws_sdk_ec2::Client::new(&env.moto.sdk_config().await);
        let vpc = client
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .amazon_provided_ipv6_cidr_block(ipv6)
            .send()
            .await?
            .vpc
            .context("no vpc")?;
        let vpc_id = vpc.vpc_id.clone().context("no vpc id")?;
        let mut subnet = client
            .create_subnet()
            .vpc_id(&vpc_id)
            .cidr_block("10.0.0.0/20")
            .availability_zone("us-east-1a");
        if ipv6 {
            let block = vpc
                .ipv6_cidr_block_association_set()
                .first()
                .and_then(|a| a.ipv6_cidr_block())
                .context("no IPv6 block on the VPC")?;
            subnet = subnet.ipv6_cidr_block(block.replace("/56", "/64"));
        }
        let subnet = subnet
            .send()
            .await?
            .subnet
            .and_then(|s| s.subnet_id)
            .context("no subnet id")?;
        Ok(Ec2 {
            client,
            vpc: vpc_id,
            subnet,
        })
    }

    fn cluster_tags() -> TagSpecification {
        TagSpecification::builder()
            .resource_type(ResourceType::Instance)
            .tags(
                Tag::builder()
                    .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                    .value("owned")
                    .build(),
            )
            .build()
    }

    /// `count` cluster-tagged m5.large instances in the subnet.
    async fn launch(&self, count: i32) -> anyhow::Result<Vec<Instance>> {
        self.launch_typed(count, aws_sdk_ec2::types::InstanceType::M5Large)
            .await
    }

    /// `count` cluster-tagged instances of `kind` in the subnet.
    async fn launch_typed(
        &self,
        count: i32,
        kind: aws_sdk_ec2::types::InstanceType,
    ) -> anyhow::Result<Vec<Instance>> {
        let out = self
            .client
            .run_instances()
            .image_id(AMI)
            .instance_type(kind)
            .min_count(count)
            .max_count(count)
            .subnet_id(&self.subnet)
            .tag_specifications(Ec2::cluster_tags())
            .send()
            .await?;
        Ok(out.instances().to_vec())
    }

    /// One instance with two interfaces (the second in a second subnet) and
    /// a public IP on the first.
    async fn launch_two_interfaces(&self) -> anyhow::Result<Instance> {
        let second = self
            .client
            .create_subnet()
            .vpc_id(&self.vpc)
            .cidr_block("10.0.16.0/24")
            .availability_zone("us-east-1a")
            .send()
            .await?
            .subnet
            .and_then(|s| s.subnet_id)
            .context("no subnet id")?;
        let out = self
            .client
            .run_instances()
            .image_id(AMI)
            .instance_type(aws_sdk_ec2::types::InstanceType::C5Xlarge)
            .min_count(1)
            .max_count(1)
            .network_interfaces(
                InstanceNetworkInterfaceSpecification::builder()
                    .device_index(0)
                    .subnet_id(&self.subnet)
                    .associate_public_ip_address(true)
                    .build(),
            )
            .network_interfaces(
                InstanceNetworkInterfaceSpecification::builder()
                    .device_index(1)
                    .subnet_id(second)
                    .build(),
            )
            .tag_specifications(Ec2::cluster_tags())
            .send()
            .await?;
        out.instances().first().cloned().context("no instance")
    }

    /// One instance with an IPv6 address.
    async fn launch_ipv6(&self) -> anyhow::Result<Instance> {
        let out = self
            .client
            .run_instances()
            .image_id(AMI)
            .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
            .min_count(1)
            .max_count(1)
            .subnet_id(&self.subnet)
            .ipv6_address_count(1)
            .tag_specifications(Ec2::cluster_tags())
            .send()
            .await?;
        out.instances().first().cloned().context("no instance")
    }

    /// The instance as EC2 describes it now.
    async fn describe(&self, id: &str) -> anyhow::Result<Instance> {
        let out = self
            .client
            .describe_instances()
            .filters(Filter::builder().name("instance-id").values(id).build())
            .send()
            .await?;
        out.reservations()
            .iter()
            .flat_map(|r| r.instances())
            .next()
            .cloned()
            .with_context(|| format!("instance {id} not in moto"))
    }

    async fn tags(&self, id: &str) -> anyhow::Result<BTreeMap<String, String>> {
        Ok(self
            .describe(id)
            .await?
            .tags()
            .iter()
            .map(|t| {
                (
                    t.key().unwrap_or_default().to_string(),
                    t.value().unwrap_or_default().to_string(),
                )
            })
            .collect())
    }
}

fn id(i: &Instance) -> String {
    i.instance_id().unwrap_or_default().to_string()
}

fn dns(i: &Instance) -> String {
    i.private_dns_name().unwrap_or_default().to_string()
}

/// Registers a node the way a kubelet with `--cloud-provider=external`
/// does: tainted, optionally with a providerID and annotations, and with
/// a Ready condition.
/// The node controllers behind `proxy` with the API budget raised (so a
/// test measures the controller, not the client-side QPS limit), started,
/// and the proxy's counts zeroed.
async fn start_for_a_burst(env: &Env, proxy: &FaultProxy) -> anyhow::Result<Ccm> {
    let flags = [
        NODE_CONTROLLERS,
        "--kube-api-qps=500",
        "--kube-api-burst=500",
    ];
    let ccm = env.start_ccm_via(&proxy.endpoint(), &flags).await?;
    wait_controller_running(&ccm, "cloud-node-controller", Duration::from_secs(30)).await?;
    // Its start-up calls (the permission self-check's) are not the burst's.
    self_check_problems(&ccm, Duration::from_secs(30)).await?;
    proxy.reset_counts();
    Ok(ccm)
}

async fn register_node(
    api: &Api<Node>,
    name: &str,
    provider_id: Option<&str>,
    annotations: &[(&str, &str)],
    ready: bool,
) -> anyhow::Result<()> {
    let mut node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        },
        "spec": {
            "taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
    }))?;
    if let Some(id) = provider_id {
        node.spec.get_or_insert_default().provider_id = Some(id.to_string());
    }
    api.create(&PostParams::default(), &node)
        .await
        .with_context(|| format!("creating node {name}"))?;
    set_ready(api, name, ready).await
}

async fn set_ready(api: &Api<Node>, name: &str, ready: bool) -> anyhow::Result<()> {
    let status = if ready { "True" } else { "False" };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [{
            "type": "Ready",
            "status": status,
            "reason": if ready { "KubeletReady" } else { "KubeletNotReady" },
            "message": "set by the test",
        }]}})),
    )
    .await
    .with_context(|| format!("setting Ready={status} on node {name}"))?;
    Ok(())
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

fn addresses(node: &Node) -> Vec<(String, String)> {
    node.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| {
            a.iter()
                .map(|a| (a.type_.clone(), a.address.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

fn provider_id(node: &Node) -> Option<String> {
    node.spec.as_ref().and_then(|s| s.provider_id.clone())
}

/// Waits until the node no longer has the uninitialized taint.
async fn initialized(api: &Api<Node>, name: &str, deadline: Duration) -> anyhow::Result<Node> {
    eventually(&format!("node {name} initialized"), deadline, || async {
        api.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(|n| !has_taint(n, UNINITIALIZED))
    })
    .await
}

/// The labels the CCM sets on a node of `instance_type` in us-east-1a,
/// plus the hostname label the kubelet set.
fn expected_labels(name: &str, instance_type: &str) -> BTreeMap<String, String> {
    [
        ("kubernetes.io/hostname", name),
        ("node.kubernetes.io/instance-type", instance_type),
        ("beta.kubernetes.io/instance-type", instance_type),
        ("topology.kubernetes.io/zone", "us-east-1a"),
        ("failure-domain.beta.kubernetes.io/zone", "us-east-1a"),
        ("topology.kubernetes.io/region", REGION),
        ("failure-domain.beta.kubernetes.io/region", REGION),
        ("topology.k8s.aws/zone-id", ZONE_ID),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(t, a)| (t.to_string(), a.to_string()))
        .collect()
}

/// Nodes named after `instances` registered together, as kubelets with
/// `--cloud-provider=external` do; their names.
pub(crate) async fn join(nodes: &Api<Node>, instances: &[Instance]) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = instances.iter().map(dns).collect();
    register_all(nodes, &names).await?;
    Ok(names)
}

/// Tainted Nodes `names` registered together, 32 at a time.
async fn register_all(nodes: &Api<Node>, names: &[String]) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names.to_vec())
        .map(|name| {
            let nodes = nodes.clone();
            async move { register_node(&nodes, &name, None, &[], true).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// The note of the first Warning event `reason` about Node `node`, waited
/// for up to `deadline`.
pub(crate) async fn warning_note(
    client: &kube::Client,
    node: &str,
    reason: &str,
    deadline: Duration,
) -> anyhow::Result<String> {
    let what = format!("a {reason} Warning on {node}");
    let warning = eventually(&what, deadline, || async {
        events(client, node, reason).await.into_iter().next()
    })
    .await?;
    anyhow::ensure!(
        warning.type_.as_deref() == Some("Warning"),
        "{reason} on {node} is not a Warning: {warning:?}"
    );
    Ok(warning.note.unwrap_or_default())
}

/// events.k8s.io/v1 Events about `node` with `reason`.
async fn events(client: &kube::Client, node: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node)
        })
        .collect()
}

const NODE_CONTROLLERS: &str = "--controllers=cloud-node,cloud-node-lifecycle";

#[tokio::test]
async fn initializes_ip_named_resource_named_preset_and_multi_interface_nodes() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ccm = env.start_ccm(&[NODE_CONTROLLERS]).await?;
    wait_controller_running(&ccm, "cloud-node-controller", Duration::from_secs(30)).await?;

    let launched = ec2.launch(4).await?;
    let (kubeadm, rbn, rbn_fqdn, custom) = (&launched[0], &launched[1], &launched[2], &launched[3]);
    let multi = ec2.launch_two_interfaces().await?;

    // kubeadm: the node is named after the private DNS name.
    register_node(&nodes, &dns(kubeadm), None, &[], true).await?;
    // Resource-based names, bare and with a domain.
    register_node(&nodes, &id(rbn), None, &[], true).await?;
    let rbn_fqdn_name = format!("{}.ec2.internal", id(rbn_fqdn));
    register_node(&nodes, &rbn_fqdn_name, None, &[], true).await?;
    // A custom DHCP domain: the name says nothing, the kubelet set --provider-id.
    let preset = format!("aws:///us-east-1a/{}", id(custom));
    register_node(&nodes, "worker-7.corp.example", Some(&preset), &[], true).await?;
    register_node(&nodes, &dns(&multi), None, &[], true).await?;

    let deadline = Duration::from_secs(60);
    for (name, instance) in [
        (dns(kubeadm), kubeadm),
        (id(rbn), rbn),
        (rbn_fqdn_name.clone(), rbn_fqdn),
    ] {
        let node = initialized(&nodes, &name, deadline).await?;
        assert_eq!(
            provider_id(&node),
            Some(format!("aws:///us-east-1a/{}", id(instance))),
            "{name}"
        );
        assert_eq!(labels(&node), expected_labels(&name, "m5.large"), "{name}");
        let ip = instance.private_ip_address().unwrap_or_default();
        assert_eq!(
            addresses(&node),
            pairs(&[
                ("InternalIP", ip),
                ("InternalDNS", &dns(instance)),
                ("Hostname", &dns(instance)),
            ]),
            "{name}"
        );
        // The taint is gone, nothing else about the spec changed.
        assert!(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(|t| t.is_empty())
        );
    }

    let node = initialized(&nodes, "worker-7.corp.example", deadline).await?;
    assert_eq!(
        provider_id(&node),
        Some(preset.clone()),
        "a preset providerID is kept"
    );
    assert_eq!(
        labels(&node),
        expected_labels("worker-7.corp.example", "m5.large")
    );
    assert_eq!(
        addresses(&node),
        pairs(&[
            (
                "InternalIP",
                custom.private_ip_address().unwrap_or_default()
            ),
            ("InternalDNS", &dns(custom)),
            ("Hostname", &dns(custom)),
        ])
    );

    let node = initialized(&nodes, &dns(&multi), deadline).await?;
    let described = ec2.describe(&id(&multi)).await?;
    let mut enis: Vec<_> = described.network_interfaces().to_vec();
    enis.sort_by_key(|e| e.attachment().and_then(|a| a.device_index()));
    let eni_ips: Vec<&str> = enis
        .iter()
        .map(|e| e.private_ip_address().unwrap_or_default())
        .collect();
    let public_ip = described
        .public_ip_address()
        .context("moto gave no public IP")?;
    let public_dns = described
        .public_dns_name()
        .context("moto gave no public DNS name")?;
    assert_eq!(
        addresses(&node),
        pairs(&[
            ("InternalIP", eni_ips[0]),
            ("InternalIP", eni_ips[1]),
            ("ExternalIP", public_ip),
            ("InternalDNS", &dns(&multi)),
            ("Hostname", &dns(&multi)),
            ("ExternalDNS", public_dns),
        ])
    );
    assert_eq!(labels(&node), expected_labels(&dns(&multi), "c5.xlarge"));

    // One Synced event per node.
    for name in [dns(kubeadm), id(rbn), "worker-7.corp.example".into()] {
        let synced = eventually(&format!("Synced event for {name}"), deadline, || async {
            let found = events(&client, &name, "Synced").await;
            (!found.is_empty()).then_some(found)
        })
        .await?;
        assert_eq!(synced[0].type_.as_deref(), Some("Normal"));
    }

    // Upstream's metrics, one observation per initialized node.
    let addr = ccm.https_addr().await?;
    let families = [
        "node_controller_cloud_provider_taint_removal_delay_seconds_count 5",
        "node_controller_initial_node_sync_delay_seconds_count 5",
        // The AWS client layer's families, with the Go CCM's label names.
        "cloudprovider_aws_api_request_duration_seconds_count{request=\"describe_instance\"}",
        "aws_ccm_api_calls_total{operation=\"ec2:DescribeInstances\",outcome=",
        "aws_ccm_api_coalesced_batch_size_count{",
        "aws_ccm_api_rate_limit{category=",
    ];
    metrics_with(&addr, &families, deadline).await?;
    env.finish().await
}

#[tokio::test]
async fn dual_stack_addresses_follow_node_ip_families_and_the_provided_node_ip()
-> anyhow::Result<()> {
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNodeIPFamilies = ipv6\nNodeIPFamilies = ipv4\n"
    ))
    .await?;
    let ec2 = Ec2::dual_stack(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ccm = env.start_ccm(&[NODE_CONTROLLERS]).await?;

    let plain = ec2.launch_ipv6().await?;
    let pinned = ec2.launch_ipv6().await?;
    register_node(&nodes, &dns(&plain), None, &[], true).await?;
    // The kubelet ran with --node-ip=<IPv4>: only that InternalIP remains.
    let pinned_ip = pinned.private_ip_address().unwrap_or_default().to_string();
    register_node(
        &nodes,
        &dns(&pinned),
        None,
        &[("alpha.kubernetes.io/provided-node-ip", &pinned_ip)],
        true,
    )
    .await?;

    let ipv6 = |i: &Instance| -> anyhow::Result<String> {
        i.network_interfaces()
            .first()
            .and_then(|e| e.ipv6_addresses().first())
            .and_then(|a| a.ipv6_address())
            .map(String::from)
            .context("moto gave no IPv6 address")
    };
    let node = initialized(&nodes, &dns(&plain), Duration::from_secs(60)).await?;
    assert_eq!(
        addresses(&node),
        pairs(&[
            ("InternalIP", &ipv6(&plain)?),
            ("InternalIP", plain.private_ip_address().unwrap_or_default()),
            ("InternalDNS", &dns(&plain)),
            ("Hostname", &dns(&plain)),
        ])
    );
    let node = initialized(&nodes, &dns(&pinned), Duration::from_secs(60)).await?;
    assert_eq!(
        addresses(&node),
        pairs(&[
            ("InternalIP", &pinned_ip),
            ("InternalDNS", &dns(&pinned)),
            ("Hostname", &dns(&pinned)),
        ])
    );
    env.finish().await
}

#[tokio::test]
async fn a_node_without_an_instance_keeps_its_taint_and_gets_a_warning() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let proxy = env.full_budget_proxy().await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &[NODE_CONTROLLERS])
        .await?;

    let good = ec2.launch(1).await?.remove(0);
    let ghost = "ip-10-0-99-99.ec2.internal";
    register_node(&nodes, ghost, None, &[], true).await?;
    register_node(&nodes, &dns(&good), None, &[], true).await?;
    let bad_pid = "aws:///us-east-1a/not-an-instance";
    register_node(&nodes, "bad-provider-id", Some(bad_pid), &[], true).await?;

    initialized(&nodes, &dns(&good), Duration::from_secs(60)).await?;
    let note = warning_note(&client, ghost, "InstanceNotFound", Duration::from_secs(30)).await?;
    assert!(
        note.contains(ghost) && note.contains("private DNS name"),
        "the warning names the node and what was looked up: {note}"
    );
    let note = warning_note(
        &client,
        "bad-provider-id",
        "InvalidProviderID",
        Duration::from_secs(30),
    )
    .await?;
    assert!(
        note.contains("bad-provider-id") && note.contains(bad_pid) && note.contains("aws:///"),
        "the warning names node, value and fix: {note}"
    );

    // Retried with backoff, never initialized from a guess: the retries
    // are the queue's, so they show in its `workqueue_*` families (the two
    // failing nodes, each tried again after 1 s, then 2 s).
    let addr = ccm.https_addr().await?;
    eventually(
        "retries of the two failing nodes on /metrics",
        Duration::from_secs(30),
        || async {
            let (_, body) = https_get(&addr, "/metrics").await.ok()?;
            let retries: f64 = (body.lines())
                .find_map(|l| l.strip_prefix("workqueue_retries_total{name=\"Nodes\"} "))?
                .trim()
                .parse()
                .ok()?;
            (retries >= 4.0).then_some(())
        },
    )
    .await?;
    for name in [ghost, "bad-provider-id"] {
        let node = nodes.get(name).await?;
        assert!(has_taint(&node, UNINITIALIZED), "{name} keeps its taint");
        assert_eq!(
            provider_id(&node).as_deref(),
            (name != ghost).then_some(bad_pid)
        );
        assert!(addresses(&node).is_empty(), "{name} got no addresses");
        assert!(!labels(&node).contains_key("topology.kubernetes.io/zone"));
    }
    let calls = proxy.calls();
    let mutations: Vec<String> = calls
        .iter()
        .filter(|(_, action, c)| {
            c.received > 0
                && !action.starts_with("Describe")
                && !action.ends_with("+DryRun")
                && !action.starts_with("Get")
        })
        .map(|(service, action, c)| format!("{service}:{action} x{}", c.received))
        .collect();
    assert!(mutations.is_empty(), "no AWS mutations, got {mutations:?}");
    assert!(calls.get("ec2", "DescribeInstances").received >= 2);

    // AWS failing is not "not found" either: the taint stays, the warning
    // says the lookup failed, and the node is initialized once AWS answers.
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::ServerError(503)).for_action("DescribeInstances"),
    ]);
    let late = ec2.launch(1).await?.remove(0);
    register_node(&nodes, &dns(&late), None, &[], true).await?;
    let note = warning_note(
        &client,
        &dns(&late),
        "InstanceLookupFailed",
        Duration::from_secs(60),
    )
    .await?;
    assert!(
        note.contains(&dns(&late)) && note.contains("private DNS name"),
        "{note}"
    );
    assert!(has_taint(&nodes.get(&dns(&late)).await?, UNINITIALIZED));
    proxy.set_faults(vec![]);
    initialized(&nodes, &dns(&late), Duration::from_secs(60)).await?;
    env.finish().await
}

#[tokio::test]
async fn stopped_instances_taint_terminated_ones_delete_and_a_failed_sweep_deletes_nothing()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ccm = env
        .start_ccm_via(
            &proxy.endpoint(),
            &[
                NODE_CONTROLLERS,
                "--node-monitor-period=1s",
                "--aws-instance-sweep-ttl=1s",
            ],
        )
        .await?;
    let launched = ec2.launch(3).await?;
    let (stopped, terminated, kept) = (&launched[0], &launched[1], &launched[2]);
    for instance in &launched {
        register_node(&nodes, &dns(instance), None, &[], true).await?;
    }
    for instance in &launched {
        initialized(&nodes, &dns(instance), Duration::from_secs(60)).await?;
    }
    // The sweep is reused for a second, the monitor runs every second; a
    // failed sweep takes its retries' backoff (seconds each), and two of
    // them on a loaded CI machine took over 30 s.
    let deadline = Duration::from_secs(90);

    // Stopped and NotReady: tainted. Ready again: untainted.
    ec2.client
        .stop_instances()
        .instance_ids(id(stopped))
        .send()
        .await?;
    set_ready(&nodes, &dns(stopped), false).await?;
    eventually("shutdown taint", deadline, || async {
        nodes
            .get_opt(&dns(stopped))
            .await
            .ok()
            .flatten()
            .filter(|n| has_taint(n, SHUTDOWN))
    })
    .await?;
    set_ready(&nodes, &dns(stopped), true).await?;
    eventually("shutdown taint removed", deadline, || async {
        nodes
            .get_opt(&dns(stopped))
            .await
            .ok()
            .flatten()
            .filter(|n| !has_taint(n, SHUTDOWN))
    })
    .await?;

    // Terminated and NotReady: deleted, with an event.
    ec2.client
        .terminate_instances()
        .instance_ids(id(terminated))
        .send()
        .await?;
    set_ready(&nodes, &dns(terminated), false).await?;
    eventually("terminated node deleted", deadline, || async {
        matches!(nodes.get_opt(&dns(terminated)).await, Ok(None)).then_some(())
    })
    .await?;
    // The event is written beside the delete, not before it: wait for it.
    let deleting = eventually("DeletingNode event", deadline, || async {
        let found = events(&client, &dns(terminated), "DeletingNode").await;
        (!found.is_empty()).then_some(found)
    })
    .await?;
    assert_eq!(deleting.len(), 1, "{deleting:?}");
    assert_eq!(deleting[0].type_.as_deref(), Some("Normal"));

    // AWS fails: the sweep and every lookup get 503. Nothing is deleted,
    // even though the instance really is terminated.
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::ServerError(503)).for_action("DescribeInstances"),
    ]);
    ec2.client
        .terminate_instances()
        .instance_ids(id(kept))
        .send()
        .await?;
    set_ready(&nodes, &dns(kept), false).await?;
    // Wait until the controller itself has seen two sweeps fail (each is a
    // whole call, retries included), not merely until AWS refused attempts.
    const SWEEP_FAILED: &str = "cluster sweep failed";
    let before = ccm.logs().matches(SWEEP_FAILED).count();
    eventually(
        "two failed sweeps observed by the controller",
        deadline,
        || async { (ccm.logs().matches(SWEEP_FAILED).count() >= before + 2).then_some(()) },
    )
    .await?;
    assert!(
        nodes.get_opt(&dns(kept)).await?.is_some(),
        "a failed sweep must not delete the node"
    );
    assert!(events(&client, &dns(kept), "DeletingNode").await.is_empty());
    // AWS is back: now it goes.
    proxy.set_faults(vec![]);
    eventually("node deleted once AWS answers", deadline, || async {
        matches!(nodes.get_opt(&dns(kept)).await, Ok(None)).then_some(())
    })
    .await?;
    env.finish().await
}

#[tokio::test]
async fn a_300_node_join_burst_costs_a_handful_of_describe_calls_and_no_throttling()
-> anyhow::Result<()> {
    const NODES: usize = 300;
    let env = Env::start().await?;
    // AWS's documented buckets, enforced at full size.
    let proxy = env.full_budget_proxy().await?;
    let ec2 = Ec2::new(&env).await?;
    let launched = ec2.launch(NODES as i32).await?;
    assert_eq!(launched.len(), NODES);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    // Default --concurrent-node-syncs (1): the reads from AWS are batched
    // whatever the number of workers. The API budget is raised so the test
    // measures the controller, not the client-side QPS limit.
    let _ccm = start_for_a_burst(&env, &proxy).await?;

    // Kubelets register concurrently, as in a scale-up.
    let start = tokio::time::Instant::now();
    join(&nodes, &launched).await?;
    let registered = start.elapsed();

    eventually(
        "every node initialized",
        Duration::from_secs(180),
        || async {
            let list = nodes.list(&ListParams::default()).await.ok()?;
            let done = list
                .items
                .iter()
                .filter(|n| !has_taint(n, UNINITIALIZED) && provider_id(n).is_some())
                .count();
            (done == NODES).then_some(())
        },
    )
    .await?;
    let elapsed = start.elapsed();
    let describe = proxy.calls().get("ec2", "DescribeInstances");
    let throttled = proxy.calls().throttled_total();
    eprintln!(
        "join burst: {NODES} nodes registered in {registered:?}, all initialized after {elapsed:?}; \
         DescribeInstances received {} forwarded {} throttled {}; throttled in total {throttled}",
        describe.received, describe.forwarded, describe.throttled
    );
    // The promise: at most one batched read per 300 ms of registration
    // (node.rs GATHER: a batch is sent once its first lookup has waited
    // that long, one batch at a time) while the burst is small, then the
    // shared sweep (one page for 300 instances). A fixed count would count
    // the machine's speed: a slower registration spreads over more batches.
    let windows = (registered.as_millis() / 300) as u64 + 2;
    assert!(
        describe.received <= windows + 1,
        "DescribeInstances calls: {} for a registration of {registered:?} ({windows} windows)",
        describe.received
    );
    assert_eq!(throttled, 0, "no throttled response at all");
    // Two writes per node: addresses (status), then labels, providerID and
    // taints in one patch guarded by resourceVersion. (The other status
    // patch is the test's Ready.) When the test's Ready lands between the
    // two, the guarded patch meets a 409 and is sent again on the fresh
    // node: that retry is counted apart, and nothing else is written.
    let stats = env.api.stats();
    let retried = stats.conflicts("patch", "nodes");
    assert_eq!(stats.count("patch", "nodes") - retried, NODES as u64);
    assert_eq!(stats.count("patch", "nodes/status"), 2 * NODES as u64);
    // Every node got its own instance's data.
    let list = nodes.list(&ListParams::default()).await?;
    let by_dns: BTreeMap<String, String> = launched.iter().map(|i| (dns(i), id(i))).collect();
    for node in &list.items {
        let name = node.metadata.name.clone().unwrap_or_default();
        assert_eq!(
            provider_id(node),
            Some(format!("aws:///us-east-1a/{}", by_dns[&name]))
        );
    }
    env.finish().await
}

#[tokio::test]
async fn the_tagging_controller_refuses_to_start_without_tags() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let mut args = env.base_args();
    args.push("--controllers=*,tagging".into());
    let (status, logs) = Ccm::run_to_exit(&args, &env.aws_env()).await?;
    assert!(!status.success(), "exit status {status:?}");
    assert!(logs.contains("--tags"), "the error names the flag: {logs}");
    env.finish().await
}

#[tokio::test]
async fn tagging_tags_instances_untags_deleted_nodes_and_leaves_unchanged_nodes_alone()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let flags = [
        "--controllers=cloud-node,tagging",
        "--tags=team=infra,env=test",
    ];
    let mut ccm = env.start_ccm_via(&proxy.endpoint(), &flags).await?;
    let launched = ec2.launch(3).await?;
    for instance in &launched {
        register_node(&nodes, &dns(instance), None, &[], true).await?;
    }
    let checksum = aws_ccm::controllers::tagging::tags_checksum(&[
        ("team".into(), "infra".into()),
        ("env".into(), "test".into()),
    ]);
    let deadline = Duration::from_secs(60);
    for instance in &launched {
        eventually(&format!("tags on {}", id(instance)), deadline, || async {
            let tags = ec2.tags(&id(instance)).await.ok()?;
            (tags.get("team").map(String::as_str) == Some("infra")
                && tags.get("env").map(String::as_str) == Some("test"))
            .then_some(())
        })
        .await?;
        eventually(
            &format!("tagging label on {}", dns(instance)),
            deadline,
            || async {
                let node = nodes.get_opt(&dns(instance)).await.ok()??;
                (labels(&node).get("k8s.io/cloud-provider-aws") == Some(&checksum)).then_some(())
            },
        )
        .await?;
    }
    let create_tags = proxy.calls().get("ec2", "CreateTags").received;
    eprintln!("tagging 3 nodes took {create_tags} CreateTags call(s)");
    assert!(
        (1..=3).contains(&create_tags),
        "CreateTags calls: {create_tags}"
    );

    // A restarted CCM sees every node again: none needs tags, no call.
    ccm.signal(libc::SIGTERM);
    ccm.wait_exit(Duration::from_secs(30)).await?;
    proxy.reset_counts();
    let ccm = env.start_ccm_via(&proxy.endpoint(), &flags).await?;
    ccm.wait_for_log("tagging pass", Duration::from_secs(60))
        .await?;
    assert!(ccm.logs().contains("initial=true"), "{}", ccm.logs());
    // An unrelated change to a node costs nothing either.
    nodes
        .patch(
            &dns(&launched[1]),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": "blue"}}})),
        )
        .await?;

    // Deleting a node takes the tags off its instance, and only those.
    nodes
        .delete(&dns(&launched[0]), &Default::default())
        .await?;
    eventually(
        "tags removed from the deleted node's instance",
        deadline,
        || async {
            let tags = ec2.tags(&id(&launched[0])).await.ok()?;
            (!tags.contains_key("team") && !tags.contains_key("env")).then_some(tags)
        },
    )
    .await
    .map(|tags| {
        assert!(
            tags.contains_key(&format!("kubernetes.io/cluster/{CLUSTER_ID}")),
            "other tags stay: {tags:?}"
        )
    })?;
    for instance in &launched[1..] {
        assert_eq!(
            ec2.tags(&id(instance))
                .await?
                .get("team")
                .map(String::as_str),
            Some("infra")
        );
    }
    let calls = proxy.calls();
    assert_eq!(
        calls.get("ec2", "CreateTags").received,
        0,
        "no calls for unchanged nodes"
    );
    assert_eq!(calls.get("ec2", "DeleteTags").received, 1);
    env.finish().await
}

#[tokio::test]
async fn addresses_are_refreshed_for_all_nodes_from_one_sweep() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ccm = env
        .start_ccm_via(
            &proxy.endpoint(),
            &[
                NODE_CONTROLLERS,
                "--node-status-update-frequency=1s",
                "--aws-instance-sweep-ttl=2s",
            ],
        )
        .await?;
    let launched = ec2.launch(4).await?;
    for instance in &launched {
        register_node(&nodes, &dns(instance), None, &[], true).await?;
    }
    for instance in &launched {
        initialized(&nodes, &dns(instance), Duration::from_secs(60)).await?;
    }
    proxy.reset_counts();
    proxy.record_requests(true);
    env.api.reset_stats();

    // An Elastic IP appears on one instance.
    let target = &launched[2];
    let eip = ec2
        .client
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc)
        .send()
        .await?;
    ec2.client
        .associate_address()
        .instance_id(id(target))
        .allocation_id(eip.allocation_id().unwrap_or_default())
        .send()
        .await?;
    let public_ip = eip.public_ip().unwrap_or_default().to_string();
    let public_dns = format!(
        "ec2-{}.compute-1.amazonaws.com",
        public_ip.replace('.', "-")
    );
    // The sweep is reused for 2 s.
    let node = eventually(
        "ExternalIP on the node",
        Duration::from_secs(30),
        || async {
            nodes
                .get_opt(&dns(target))
                .await
                .ok()
                .flatten()
                .filter(|n| {
                    addresses(n)
                        .iter()
                        .any(|(t, a)| t == "ExternalIP" && *a == public_ip)
                })
        },
    )
    .await?;
    assert_eq!(
        addresses(&node),
        pairs(&[
            (
                "InternalIP",
                target.private_ip_address().unwrap_or_default()
            ),
            ("ExternalIP", &public_ip),
            ("InternalDNS", &dns(target)),
            ("Hostname", &dns(target)),
            ("ExternalDNS", &public_dns),
        ])
    );
    // Refreshed every second for four nodes, yet every DescribeInstances
    // AWS saw was a page of the cluster sweep (the cluster tag or the legacy
    // tag), never a lookup of a node's instance by ID or name.
    let describes = proxy.requests("DescribeInstances");
    assert!(!describes.is_empty(), "the refresh read AWS");
    for call in &describes {
        let by_node = call.params.keys().any(|k| k.starts_with("InstanceId."))
            || call.params.values().any(|v| v == "private-dns-name");
        assert!(!by_node, "a per-node lookup: {:?}", call.params);
    }
    // Only the changed node was written.
    assert_eq!(env.api.stats().count("patch", "nodes/status"), 1);
    for other in launched.iter().filter(|i| id(i) != id(target)) {
        let node = nodes.get(&dns(other)).await?;
        assert!(addresses(&node).iter().all(|(t, _)| t != "ExternalIP"));
    }
    env.finish().await
}

/// Nodes that are already initialized when the CCM starts are left alone,
/// except one with a beta topology label whose GA twin is missing or
/// disagrees: that one gets the beta value (upstream keeps the pairs in
/// step). Only nodes with work reach the node controller's queue. A joining
/// node whose GA zone label someone set wrong gets both zone labels from the
/// instance, as upstream, never two different zones.
#[tokio::test]
async fn at_start_up_only_an_initialized_node_missing_a_ga_label_is_written() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let ec2 = Ec2::new(&env).await?;
    let launched = ec2.launch(4).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let initialized =
        |name: &str, instance: &Instance, labels: serde_json::Value| -> anyhow::Result<Node> {
            Ok(serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"providerID": format!("aws:///us-east-1a/{}", id(instance))},
            }))?)
        };
    let both = json!({"beta.kubernetes.io/instance-type": "m5.large",
                      "node.kubernetes.io/instance-type": "m5.large"});
    let done = nodes
        .create(
            &PostParams::default(),
            &initialized("done", &launched[0], both)?,
        )
        .await?;
    let beta_only = json!({"beta.kubernetes.io/instance-type": "m5.large"});
    nodes
        .create(
            &PostParams::default(),
            &initialized("beta-only", &launched[1], beta_only)?,
        )
        .await?;
    let disagreeing = json!({"failure-domain.beta.kubernetes.io/zone": "us-east-1a",
                             "topology.kubernetes.io/zone": "us-east-1z"});
    nodes
        .create(
            &PostParams::default(),
            &initialized("disagreeing", &launched[2], disagreeing)?,
        )
        .await?;
    let joining = format!("aws:///us-east-1a/{}", id(&launched[3]));
    register_node(&nodes, "joining", Some(&joining), &[], true).await?;
    nodes
        .patch(
            "joining",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "us-east-1z"}}}),
            ),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=cloud-node"]).await?;
    let joined = self::initialized(&nodes, "joining", Duration::from_secs(30)).await?;
    assert_eq!(
        labels(&joined),
        expected_labels("joining", "m5.large"),
        "both zone labels from the instance"
    );
    let conflict = eventually(
        "a LabelConflict Warning on joining",
        Duration::from_secs(30),
        || async { events(&client, "joining", "LabelConflict").await.pop() },
    )
    .await?;
    let note = conflict.note.unwrap_or_default();
    assert!(
        note.contains("us-east-1z") && note.contains("set to the instance's value"),
        "{note}"
    );
    eventually(
        "the GA zone follows beta on disagreeing",
        Duration::from_secs(30),
        || async {
            let node = nodes.get("disagreeing").await.ok()?;
            (node
                .labels()
                .get("topology.kubernetes.io/zone")
                .map(String::as_str)
                == Some("us-east-1a"))
            .then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    eventually(
        "the GA twin on beta-only",
        Duration::from_secs(30),
        || async {
            let node = nodes.get("beta-only").await.ok()?;
            (node
                .labels()
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str)
                == Some("m5.large"))
            .then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let after = nodes.get("done").await?;
    assert_eq!(
        after.metadata.labels, done.metadata.labels,
        "the node with both labels is not relabelled"
    );
    assert!(
        after
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_none(),
        "an initialized node gets no taint"
    );
    env.finish().await
}

const LAYER: &str = "topology.k8s.aws/network-node-layer-";

/// The network-node labels of a node, by layer.
fn layers(node: &Node) -> BTreeMap<String, String> {
    labels(node)
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(LAYER)?.to_string(), v)))
        .collect()
}

/// What the fault proxy answers for `instance`: three network nodes for
/// a topology type, none (an unsupported type) otherwise.
fn topology_of(instance: &Instance, nodes: &[String]) -> ccm_testkit::aws_proxy::InstanceTopology {
    ccm_testkit::aws_proxy::InstanceTopology {
        instance_id: id(instance),
        instance_type: instance
            .instance_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_default(),
        availability_zone: "us-east-1a".into(),
        zone_id: ZONE_ID.into(),
        group_name: None,
        network_nodes: nodes.to_vec(),
    }
}

fn three_layers(i: usize) -> Vec<String> {
    vec![
        format!("nn-top-{}", i % 2),
        format!("nn-mid-{}", i % 8),
        format!("nn-bot-{i}"),
    ]
}

/// A node registered like [`register_node`], with labels of its own from
/// the start.
async fn register_labelled(
    api: &Api<Node>,
    name: &str,
    own: &[(&str, &str)],
) -> anyhow::Result<()> {
    let mut labels: BTreeMap<&str, &str> = own.iter().copied().collect();
    labels.insert("kubernetes.io/hostname", name);
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
    }))?;
    api.create(&PostParams::default(), &node).await?;
    set_ready(api, name, true).await
}

/// Upstream's `topology.k8s.aws/network-node-layer-N` labels: nodes of a
/// type with topology (p4d, upstream's default pattern) get their three
/// layers right after the initializing write; a node whose layer 1 is already set
/// keeps its labels; other types get none. 120 joining topology nodes cost
/// a few batched `DescribeInstanceTopology` calls (at most 100 IDs each, as
/// AWS allows), and a type found without topology is not asked again.
#[tokio::test]
async fn network_node_labels_come_batched_and_only_where_upstream_sets_them() -> anyhow::Result<()>
{
    const TOPOLOGY_NODES: usize = 120;
    let env = Env::start().await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let p4d = ec2
        .launch_typed(
            TOPOLOGY_NODES as i32,
            aws_sdk_ec2::types::InstanceType::P4d24xlarge,
        )
        .await?;
    let m5 = ec2.launch(4).await?;
    let mut declared: Vec<_> = (p4d.iter().enumerate())
        .map(|(i, instance)| topology_of(instance, &three_layers(i)))
        .collect();
    declared.extend(m5.iter().map(|instance| topology_of(instance, &[])));
    proxy.set_instance_topology(declared);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ccm = start_for_a_burst(&env, &proxy).await?;

    // One topology node already labelled by someone (layer 1 only).
    let preset = dns(&p4d[0]);
    register_labelled(
        &nodes,
        &preset,
        &[("topology.k8s.aws/network-node-layer-1", "mine")],
    )
    .await?;
    let joining: Vec<String> = (p4d[1..].iter().chain(&m5[..3])).map(dns).collect();
    register_all(&nodes, &joining).await?;
    for name in joining.iter().chain([&preset]) {
        initialized(&nodes, name, Duration::from_secs(120))
            .await
            .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    }

    // The labels follow the taint's removal (they never hold it).
    for (i, instance) in p4d.iter().enumerate().skip(1) {
        let want: BTreeMap<String, String> = (three_layers(i).into_iter().enumerate())
            .map(|(layer, n)| ((layer + 1).to_string(), n))
            .collect();
        let name = dns(instance);
        eventually(
            &format!("network-node labels on {name}"),
            Duration::from_secs(60),
            || async {
                let node = nodes.get(&name).await.ok()?;
                (layers(&node) == want).then_some(())
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    }
    assert_eq!(
        layers(&nodes.get(&preset).await?),
        BTreeMap::from([("1".to_string(), "mine".to_string())]),
        "layer 1 set by someone else: every layer label left as it is"
    );
    for instance in &m5[..3] {
        assert!(layers(&nodes.get(&dns(instance)).await?).is_empty());
    }
    let asked = proxy.calls().get("ec2", "DescribeInstanceTopology");
    eprintln!(
        "network nodes: {} joining nodes, DescribeInstanceTopology received {}",
        joining.len(),
        asked.received,
    );
    // The promise at any speed: one call per 100 nodes (the stand-in
    // refuses more IDs, as EC2 does, and every label came), and at most
    // one more for a join that rested once. A timing window counted the
    // machine's speed instead.
    let bound = joining.len().div_ceil(100) + 1;
    assert!(
        (1..=bound as u64).contains(&(asked.received as u64)),
        "{} joining nodes asked in batches of at most 100: {} calls, at most {bound} promised",
        joining.len(),
        asked.received
    );

    // m5.large answered nothing: another one joining costs no call.
    let before = proxy
        .calls()
        .get("ec2", "DescribeInstanceTopology")
        .received;
    register_node(&nodes, &dns(&m5[3]), None, &[], true).await?;
    let late = initialized(&nodes, &dns(&m5[3]), Duration::from_secs(60)).await?;
    assert!(layers(&late).is_empty());
    assert_eq!(
        proxy
            .calls()
            .get("ec2", "DescribeInstanceTopology")
            .received,
        before,
        "a type without topology is remembered"
    );
    env.finish().await
}

/// A throttled `DescribeInstanceTopology` does not hold a node's
/// initialization back (upstream keeps the node tainted): the node is
/// initialized without the network-node labels, which come once AWS
/// answers again.
#[tokio::test]
async fn a_failing_topology_question_does_not_hold_initialization_back() -> anyhow::Result<()> {
    failing_topology_question(ServerOptions::default()).await
}

/// The same behind a watch cache that lags writes: the controller sees a
/// tainted copy of the node after its own initializing write, and must
/// still come back for the labels (it once took that copy for "nothing to
/// do" and dropped the retry until the node next changed).
#[tokio::test]
async fn a_failing_topology_question_is_asked_again_behind_a_lagging_watch_cache()
-> anyhow::Result<()> {
    failing_topology_question(ServerOptions {
        watch_cache_lag: Duration::from_secs(2),
        ..Default::default()
    })
    .await
}

async fn failing_topology_question(api: ServerOptions) -> anyhow::Result<()> {
    let env = Env::start_with(
        &format!("[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n"),
        api,
    )
    .await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ec2 = Ec2::new(&env).await?;
    let p4d = ec2
        .launch_typed(1, aws_sdk_ec2::types::InstanceType::P4d24xlarge)
        .await?
        .remove(0);
    proxy.set_instance_topology(vec![topology_of(&p4d, &three_layers(7))]);
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).for_action("DescribeInstanceTopology"),
    ]);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &[NODE_CONTROLLERS])
        .await?;
    register_node(&nodes, &dns(&p4d), None, &[], true).await?;
    let node = initialized(&nodes, &dns(&p4d), Duration::from_secs(60))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(labels(&node), expected_labels(&dns(&p4d), "p4d.24xlarge"));
    eventually(
        "the topology question throttled",
        Duration::from_secs(30),
        || async {
            (proxy.calls().get("ec2", "DescribeInstanceTopology").faulted > 0).then_some(())
        },
    )
    .await?;
    let node = nodes.get(&dns(&p4d)).await?;
    assert!(layers(&node).is_empty(), "no labels while AWS throttles");

    proxy.set_faults(vec![]);
    let labelled = eventually(
        "network-node labels after AWS answers again",
        Duration::from_secs(60),
        || async {
            let node = nodes.get(&dns(&p4d)).await.ok()?;
            (layers(&node).len() == 3).then_some(node)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(
        layers(&labelled),
        BTreeMap::from([
            ("1".to_string(), "nn-top-1".to_string()),
            ("2".to_string(), "nn-mid-7".to_string()),
            ("3".to_string(), "nn-bot-7".to_string()),
        ])
    );
    env.finish().await
}
