//! Issue 5: the route controller and node IPAM, end to end: the real binary
//! against moto (EC2) and the Kubernetes API test server.
//!
//! moto never reports a route as `blackhole` (its routes are always active),
//! so blackhole replacement is covered against the in-memory cloud in
//! `crates/aws-ccm/src/controllers/route/tests.rs` and by the plan's unit tests.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule, ProxyConfig};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::support::*;

pub(crate) const AZ: &str = "us-east-1a";
const CLUSTER_TAG: &str = "kubernetes.io/cluster/ccm-test";
pub(crate) const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// The EC2 side of a test cluster, seeded in moto with the SDK.
pub(crate) struct Cloud {
    pub(crate) ec2: aws_sdk_ec2::Client,
    pub(crate) vpc: String,
    pub(crate) subnet: String,
}

fn cluster_tags(resource: ResourceType) -> TagSpecification {
    TagSpecification::builder()
        .resource_type(resource)
        .tags(Tag::builder().key(CLUSTER_TAG).value("owned").build())
        .build()
}

impl Cloud {
    pub(crate) async fn new(env: &Env) -> anyhow::Result<Cloud> {
        let ec2 = aws_sdk_ec2::Client::new(&env.moto.sdk_config().await);
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .amazon_provided_ipv6_cidr_block(true)
            .send()
            .await?
            .vpc
            .and_then(|v| v.vpc_id)
            .ok_or_else(|| anyhow::anyhow!("no VPC id"))?;
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block("10.0.1.0/24")
            .availability_zone(AZ)
            .send()
            .await?
            .subnet
            .and_then(|s| s.subnet_id)
            .ok_or_else(|| anyhow::anyhow!("no subnet id"))?;
        Ok(Cloud { ec2, vpc, subnet })
    }

    pub(crate) async fn route_table(&self, tagged: bool) -> anyhow::Result<String> {
        let mut call = self.ec2.create_route_table().vpc_id(&self.vpc);
        if tagged {
            call = call.tag_specifications(cluster_tags(ResourceType::RouteTable));
        }
        call.send()
            .await?
            .route_table
            .and_then(|t| t.route_table_id)
            .ok_or_else(|| anyhow::anyhow!("no route table id"))
    }

    pub(crate) async fn instances(&self, count: i32) -> anyhow::Result<Vec<String>> {
        let out = self
            .ec2
            .run_instances()
            .image_id(ccm_testkit::moto::AMI)
            .min_count(count)
            .max_count(count)
            .subnet_id(&self.subnet)
            .tag_specifications(cluster_tags(ResourceType::Instance))
            .send()
            .await?;
        Ok(out
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect())
    }

    pub(crate) async fn instance_route(
        &self,
        table: &str,
        dest: &str,
        instance: &str,
    ) -> anyhow::Result<()> {
        let call = self
            .ec2
            .create_route()
            .route_table_id(table)
            .instance_id(instance);
        let call = if dest.contains(':') {
            call.destination_ipv6_cidr_block(dest)
        } else {
            call.destination_cidr_block(dest)
        };
        call.send().await?;
        Ok(())
    }

    /// Destination → target of every route in a table.
    pub(crate) async fn routes(&self, table: &str) -> anyhow::Result<BTreeMap<String, String>> {
        let out = self
            .ec2
            .describe_route_tables()
            .route_table_ids(table)
            .send()
            .await?;
        let mut routes = BTreeMap::new();
        for t in out.route_tables() {
            for r in t.routes() {
                let dest = r
                    .destination_cidr_block()
                    .or(r.destination_ipv6_cidr_block())
                    .unwrap_or_default();
                let target = r.instance_id().or(r.gateway_id()).unwrap_or_default();
                routes.insert(dest.to_string(), target.to_string());
            }
        }
        Ok(routes)
    }

    pub(crate) async fn source_dest_check(&self, instance: &str) -> anyhow::Result<Option<bool>> {
        let out = self
            .ec2
            .describe_instances()
            .instance_ids(instance)
            .send()
            .await?;
        Ok(out
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find_map(|i| i.source_dest_check()))
    }
}

pub(crate) fn node(name: &str, instance: Option<&str>, pod_cidrs: &[&str]) -> Node {
    let mut spec = json!({});
    if let Some(id) = instance {
        spec["providerID"] = json!(format!("aws:///{AZ}/{id}"));
    }
    if let Some(first) = pod_cidrs.first() {
        spec["podCIDR"] = json!(first);
        spec["podCIDRs"] = json!(pod_cidrs);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("a valid Node")
}

pub(crate) async fn nodes_api(env: &Env) -> anyhow::Result<Api<Node>> {
    Ok(Api::all(env.api.client().await?))
}

pub(crate) async fn create(api: &Api<Node>, node: Node) -> anyhow::Result<()> {
    api.create(&PostParams::default(), &node).await?;
    Ok(())
}

/// `NetworkUnavailable` (status, reason) of a node.
pub(crate) async fn network_unavailable(api: &Api<Node>, name: &str) -> Option<(String, String)> {
    let node = api.get_opt(name).await.ok()??;
    let c = node
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "NetworkUnavailable")?;
    Some((c.status, c.reason.unwrap_or_default()))
}

pub(crate) async fn wait_condition(
    api: &Api<Node>,
    name: &str,
    status: &str,
    reason: &str,
) -> anyhow::Result<()> {
    eventually(
        &format!("{name} NetworkUnavailable={status} ({reason})"),
        WAIT,
        || async {
            (network_unavailable(api, name).await == Some((status.into(), reason.into())))
                .then_some(())
        },
    )
    .await
}

/// Warning events with `reason` about node `name`.
pub(crate) async fn events_for(env: &Env, name: &str, reason: &str) -> Vec<Event> {
    let Ok(client) = env.api.client().await else {
        return Vec::new();
    };
    let Ok(list) = Api::<Event>::all(client).list(&Default::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .collect()
}

async fn pod_cidrs(api: &Api<Node>, name: &str) -> Option<Vec<String>> {
    api.get_opt(name)
        .await
        .ok()??
        .spec?
        .pod_cidrs
        .filter(|c| !c.is_empty())
}

pub(crate) fn route_args(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--controllers=route".into(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        "--route-reconciliation-period=2s".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

pub(crate) fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test]
async fn routes_follow_nodes_in_every_tagged_table_and_nothing_else_is_touched()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb_a = cloud.route_table(true).await?;
    let rtb_b = cloud.route_table(true).await?;
    let rtb_other = cloud.route_table(false).await?;
    let ids = cloud.instances(4).await?;
    let (i1, i2, stray, i4) = (&ids[0], &ids[1], &ids[2], &ids[3]);

    // What must survive: an out-of-range instance route, a gateway route, the
    // local routes, and everything in a table of no cluster.
    let igw = cloud
        .ec2
        .create_internet_gateway()
        .send()
        .await?
        .internet_gateway
        .and_then(|g| g.internet_gateway_id)
        .expect("igw id");
    cloud
        .ec2
        .attach_internet_gateway()
        .internet_gateway_id(&igw)
        .vpc_id(&cloud.vpc)
        .send()
        .await?;
    cloud
        .ec2
        .create_route()
        .route_table_id(&rtb_a)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await?;
    cloud
        .instance_route(&rtb_a, "192.168.0.0/24", stray)
        .await?;
    cloud
        .instance_route(&rtb_other, "10.244.1.0/24", stray)
        .await?;
    // What must go: an in-range route to an instance no node runs on.
    cloud
        .instance_route(&rtb_a, "10.244.200.0/24", stray)
        .await?;
    let other_before = cloud.routes(&rtb_other).await?;

    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(i1), &["10.244.1.0/24"])).await?;
    create(&api, node("n2", Some(i2), &["10.244.2.0/24"])).await?;
    let ccm = env.start_ccm(&as_strs(&route_args(&[]))).await?;

    for table in [&rtb_a, &rtb_b] {
        eventually(&format!("node routes in {table}"), WAIT, || async {
            let r = cloud.routes(table).await.ok()?;
            (r.get("10.244.1.0/24") == Some(i1)
                && r.get("10.244.2.0/24") == Some(i2)
                && !r.contains_key("10.244.200.0/24"))
            .then_some(())
        })
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    }
    let a = cloud.routes(&rtb_a).await?;
    assert_eq!(a.get("192.168.0.0/24"), Some(stray), "out of range: kept");
    assert_eq!(a.get("0.0.0.0/0"), Some(&igw), "gateway route: kept");
    assert_eq!(a.get("10.0.0.0/16").map(String::as_str), Some("local"));
    assert_eq!(
        cloud.routes(&rtb_other).await?,
        other_before,
        "untagged table untouched"
    );

    for id in [i1, i2] {
        assert_eq!(cloud.source_dest_check(id).await?, Some(false), "{id}");
    }
    assert_eq!(
        cloud.source_dest_check(stray).await?,
        Some(true),
        "not a node"
    );
    wait_condition(&api, "n1", "False", "RouteCreated").await?;
    wait_condition(&api, "n2", "False", "RouteCreated").await?;

    // A new node is routed on the node change, well before the next period
    // would matter; a deleted one loses its routes.
    create(&api, node("n3", Some(i4), &["10.244.3.0/24"])).await?;
    api.delete("n2", &DeleteParams::default()).await?;
    for table in [&rtb_a, &rtb_b] {
        eventually(
            &format!("n3 routed and n2 unrouted in {table}"),
            WAIT,
            || async {
                let r = cloud.routes(table).await.ok()?;
                (r.get("10.244.3.0/24") == Some(i4) && !r.contains_key("10.244.2.0/24"))
                    .then_some(())
            },
        )
        .await?;
    }
    assert_eq!(cloud.source_dest_check(i4).await?, Some(false));
    wait_condition(&api, "n3", "False", "RouteCreated").await?;
    assert_eq!(cloud.routes(&rtb_other).await?, other_before);
    env.finish().await
}

#[tokio::test]
async fn an_unchanged_cluster_costs_one_read_and_no_writes_per_reconcile() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(5).await?;
    let api = nodes_api(&env).await?;
    for (n, id) in ids.iter().enumerate() {
        create(
            &api,
            node(&format!("n{n}"), Some(id), &[&format!("10.244.{n}.0/24")]),
        )
        .await?;
    }
    let proxy = env.full_budget_proxy().await?;
    let args = vec![
        "--controllers=route".to_string(),
        format!("--cluster-cidr={CLUSTER_CIDR}"),
        "--route-reconciliation-period=1s".into(),
    ];
    let started = Instant::now();
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &as_strs(&args))
        .await?;
    for n in 0..ids.len() {
        wait_condition(&api, &format!("n{n}"), "False", "RouteCreated")
            .await
            .map_err(|e| e.context(ccm.logs()))?;
    }
    let converged = started.elapsed();
    let routes = cloud.routes(&rtb).await?;
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(routes.get(&format!("10.244.{n}.0/24")), Some(id));
    }
    let first = proxy.calls();
    // The permission DryRuns are counted apart (`CreateRoute+DryRun`).
    assert_eq!(first.get("ec2", "CreateRoute").received, 5);
    assert!(first.get("ec2", "CreateRoute+DryRun").received >= 1);
    assert_eq!(first.get("ec2", "ModifyInstanceAttribute").received, 5);
    assert_eq!(first.get("ec2", "DeleteRoute").received, 0);

    // From now on nothing changes: every reconcile is one read, no write.
    proxy.reset_counts();
    eventually(
        "three reconciles after the reset",
        Duration::from_secs(20),
        || async { (proxy.calls().get("ec2", "DescribeRouteTables").received >= 3).then_some(()) },
    )
    .await?;
    let steady = proxy.calls();
    for action in [
        "CreateRoute",
        "ReplaceRoute",
        "DeleteRoute",
        "ModifyInstanceAttribute",
    ] {
        assert_eq!(
            steady.get("ec2", action).received,
            0,
            "{action}: {:?}",
            steady.to_json()
        );
    }
    let reconciles = steady.get("ec2", "DescribeRouteTables").received;
    let describes = steady.get("ec2", "DescribeInstances").received;
    eprintln!(
        "figures: converged 5 nodes in {converged:?}; first reconcile calls {}; steady state over {reconciles} \
         reconciles: {}",
        first.to_json(),
        steady.to_json()
    );
    // Instances come from the shared 30 s sweep, not one lookup per reconcile.
    assert!(
        describes <= reconciles,
        "{describes} DescribeInstances for {reconciles} reconciles"
    );
    env.finish().await
}

#[tokio::test]
async fn a_cold_start_of_thirty_nodes_stays_inside_the_aws_budget() -> anyhow::Result<()> {
    // 60 mutating calls (30 ModifyInstanceAttribute + 30 CreateRoute) against
    // AWS's mutating bucket (50 burst, 5/s), enforced by the proxy at full
    // size while the CCM uses its default half: paced, never throttled.
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(30).await?;
    let api = nodes_api(&env).await?;
    for (n, id) in ids.iter().enumerate() {
        create(
            &api,
            node(
                &format!("n{n:02}"),
                Some(id),
                &[&format!("10.244.{n}.0/24")],
            ),
        )
        .await?;
    }
    let proxy = env.full_budget_proxy().await?;
    let started = Instant::now();
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &as_strs(&route_args(&[])))
        .await?;
    for n in 0..ids.len() {
        wait_condition(&api, &format!("n{n:02}"), "False", "RouteCreated")
            .await
            .map_err(|e| e.context(ccm.logs()))?;
    }
    let took = started.elapsed();
    let routes = cloud.routes(&rtb).await?;
    for (n, id) in ids.iter().enumerate() {
        assert_eq!(routes.get(&format!("10.244.{n}.0/24")), Some(id));
    }
    let calls = proxy.calls();
    assert_eq!(calls.throttled_total(), 0, "{:?}", calls.to_json());
    assert_eq!(calls.get("ec2", "CreateRoute").received, 30);
    assert_eq!(calls.get("ec2", "ModifyInstanceAttribute").received, 30);
    eprintln!(
        "figures: 30-node cold start routed in {took:?}, {}",
        calls.to_json()
    );
    env.finish().await
}

#[tokio::test]
async fn dual_stack_nodes_get_ipv4_and_ipv6_routes() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    create(
        &api,
        node(
            "n1",
            Some(&ids[0]),
            &["10.244.1.0/24", "fd00:10:244:1::/64"],
        ),
    )
    .await?;
    let ccm = env
        .start_ccm(&[
            "--controllers=route",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--route-reconciliation-period=2s",
        ])
        .await?;
    eventually("IPv4 and IPv6 routes", WAIT, || async {
        let r = cloud.routes(&rtb).await.ok()?;
        (r.get("10.244.1.0/24") == Some(&ids[0]) && r.get("fd00:10:244:1::/64") == Some(&ids[0]))
            .then_some(())
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    wait_condition(&api, "n1", "False", "RouteCreated").await?;
    api.delete("n1", &DeleteParams::default()).await?;
    eventually("both routes removed", WAIT, || async {
        let r = cloud.routes(&rtb).await.ok()?;
        (!r.contains_key("10.244.1.0/24") && !r.contains_key("fd00:10:244:1::/64")).then_some(())
    })
    .await?;
    env.finish().await
}

#[tokio::test]
async fn a_failed_route_marks_the_node_and_names_cidr_table_and_error() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    let proxy = FaultProxy::start(
        &env.moto.endpoint(),
        ProxyConfig {
            faults: vec![
                FaultRule::new(FaultKind::Error {
                    status: 400,
                    code: "RouteLimitExceeded".into(),
                    message: "The maximum number of routes has been reached.".into(),
                })
                .for_action("CreateRoute"),
            ],
            ..Default::default()
        },
    )
    .await?;
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &as_strs(&route_args(&[])))
        .await?;
    wait_condition(&api, "n1", "True", "NoRouteCreated")
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    let events = eventually("FailedToCreateRoute event", WAIT, || async {
        let e = events_for(&env, "n1", "FailedToCreateRoute").await;
        (!e.is_empty()).then_some(e)
    })
    .await?;
    let note = events[0].note.clone().unwrap_or_default();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        note.contains("10.244.1.0/24")
            && note.contains(&rtb)
            && note.contains("RouteLimitExceeded"),
        "{note}"
    );
    // Fixed: the next reconcile creates the route and clears the condition.
    proxy.set_faults(Vec::new());
    wait_condition(&api, "n1", "False", "RouteCreated").await?;
    assert_eq!(
        cloud.routes(&rtb).await?.get("10.244.1.0/24"),
        Some(&ids[0])
    );
    env.finish().await
}

/// Upstream's `updateNetworkingCondition`: the condition is left alone only
/// when it holds the route controller's own status and reason. What a CNI
/// wrote with the same status and another reason (Calico's node agent:
/// False/`CalicoIsUp`) becomes False/`RouteCreated` once the route exists,
/// and another writer's True on a node whose route cannot be made becomes
/// True/`NoRouteCreated`, each with upstream's message and both timestamps
/// set at the write.
#[tokio::test]
async fn a_network_condition_with_another_reason_is_rewritten_as_upstream_does()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    // n2's providerID names an instance EC2 does not have: no route.
    create(
        &api,
        node("n2", Some("i-0123456789abcdef0"), &["10.244.2.0/24"]),
    )
    .await?;
    let before = "2026-01-01T00:00:00Z";
    for (name, status, reason, message) in [
        (
            "n1",
            "False",
            "CalicoIsUp",
            "Calico is running on this node",
        ),
        (
            "n2",
            "True",
            "NodeInitializing",
            "the network plugin has not started",
        ),
    ] {
        let condition = json!({"status": {"conditions": [{
            "type": "NetworkUnavailable", "status": status, "reason": reason, "message": message,
            "lastTransitionTime": before, "lastHeartbeatTime": before,
        }]}});
        api.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Strategic(condition),
        )
        .await?;
    }
    let ccm = env.start_ccm(&as_strs(&route_args(&[]))).await?;
    wait_condition(&api, "n1", "False", "RouteCreated")
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    wait_condition(&api, "n2", "True", "NoRouteCreated")
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(
        cloud.routes(&rtb).await?.get("10.244.1.0/24"),
        Some(&ids[0])
    );
    for (name, message) in [
        ("n1", "RouteController created a route"),
        ("n2", "RouteController failed to create a route"),
    ] {
        let node = api.get(name).await?;
        let condition = (node.status.and_then(|s| s.conditions).unwrap_or_default())
            .into_iter()
            .find(|c| c.type_ == "NetworkUnavailable")
            .expect("the condition");
        assert_eq!(condition.message.as_deref(), Some(message), "{name}");
        for (field, at) in [
            ("lastTransitionTime", &condition.last_transition_time),
            ("lastHeartbeatTime", &condition.last_heartbeat_time),
        ] {
            let at = at.as_ref().map(|t| t.0.to_string());
            assert!(
                at.as_deref().is_some_and(|t| !t.starts_with("2026-01-01")),
                "{name} {field}: {at:?}"
            );
        }
    }
    env.finish().await
}

#[tokio::test]
async fn without_a_route_table_the_controller_says_so_and_retries() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    let ccm = env.start_ccm(&as_strs(&route_args(&[]))).await?;
    let addr = ccm.https_addr().await?;
    metrics_with(&addr, &["route_controller_route_tables_missing 1"], WAIT).await?;
    let rtb = cloud.route_table(true).await?;
    eventually("route once the table exists", WAIT, || async {
        let r = cloud.routes(&rtb).await.ok()?;
        (r.get("10.244.1.0/24") == Some(&ids[0])).then_some(())
    })
    .await?;
    eventually("metric cleared", WAIT, || async {
        let (_, m) = https_get(&addr, "/metrics").await.ok()?;
        m.contains("route_controller_route_tables_missing 0")
            .then_some(())
    })
    .await?;
    env.finish().await
}

#[tokio::test]
async fn route_table_id_in_cloud_conf_selects_exactly_that_table() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let tagged = cloud.route_table(true).await?;
    let chosen = cloud.route_table(false).await?;
    std::fs::write(
        &env.cloud_conf,
        format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nRouteTableID = {chosen}\n"
        ),
    )?;
    // The table lacks the cluster tag: the operator renders the policy
    // with it (the IAM test evaluates these requests that way).
    env.proxy
        .set_iam_policy_options(&["--route-table", chosen.as_str()]);
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    let _ccm = env.start_ccm(&as_strs(&route_args(&[]))).await?;
    eventually("route in the configured table", WAIT, || async {
        let r = cloud.routes(&chosen).await.ok()?;
        (r.get("10.244.1.0/24") == Some(&ids[0])).then_some(())
    })
    .await?;
    assert!(!cloud.routes(&tagged).await?.contains_key("10.244.1.0/24"));
    env.finish().await
}

#[tokio::test]
async fn node_ipam_and_routes_together_route_freshly_allocated_cidrs() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb = cloud.route_table(true).await?;
    let ids = cloud.instances(3).await?;
    let api = nodes_api(&env).await?;
    for (n, id) in ids.iter().enumerate() {
        create(&api, node(&format!("n{n}"), Some(id), &[])).await?;
    }
    let ccm = env
        .start_ccm(&[
            "--controllers=nodeipam,route",
            "--allocate-node-cidrs=true",
            "--cluster-cidr=10.244.0.0/16",
            "--route-reconciliation-period=2s",
        ])
        .await?;
    for (n, id) in ids.iter().enumerate() {
        let name = format!("n{n}");
        let cidrs = eventually(&format!("{name} gets a CIDR"), WAIT, || {
            pod_cidrs(&api, &name)
        })
        .await
        .map_err(|e| e.context(ccm.logs()))?;
        eventually(&format!("route for {name}"), WAIT, || async {
            let r = cloud.routes(&rtb).await.ok()?;
            (r.get(&cidrs[0]) == Some(id)).then_some(())
        })
        .await?;
        wait_condition(&api, &name, "False", "RouteCreated").await?;
    }
    env.finish().await
}

// ---- node IPAM ----

fn ipam_args(cluster_cidr: &str) -> Vec<String> {
    vec![
        "--controllers=nodeipam".into(),
        "--allocate-node-cidrs=true".into(),
        format!("--cluster-cidr={cluster_cidr}"),
    ]
}

/// Every node's pod CIDRs, once all `expected` nodes have them.
async fn all_allocated(
    api: &Api<Node>,
    expected: usize,
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    eventually(
        &format!("{expected} nodes with pod CIDRs"),
        Duration::from_secs(60),
        || async {
            let list = api.list(&Default::default()).await.ok()?;
            let got: BTreeMap<String, Vec<String>> = list
                .items
                .iter()
                .filter_map(|n| {
                    Some((
                        n.metadata.name.clone()?,
                        n.spec
                            .as_ref()?
                            .pod_cidrs
                            .clone()
                            .filter(|c| !c.is_empty())?,
                    ))
                })
                .collect();
            (got.len() == expected && list.items.len() == expected).then_some(got)
        },
    )
    .await
}

fn assert_distinct(all: &BTreeMap<String, Vec<String>>) {
    let mut seen = HashSet::new();
    for (name, cidrs) in all {
        for c in cidrs {
            assert!(
                seen.insert(c.clone()),
                "{c} given twice (second to {name}): {all:?}"
            );
        }
    }
}

#[tokio::test]
async fn fifty_nodes_get_distinct_cidrs_and_restarts_and_failovers_give_nothing_twice()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let api = nodes_api(&env).await?;
    // Assigned before the CCM ever ran (e.g. by the Go CCM): never reused.
    create(&api, node("pre", None, &["10.244.0.0/24"])).await?;
    for n in 0..50 {
        create(&api, node(&format!("n{n:02}"), None, &[])).await?;
    }
    let args = ipam_args(CLUSTER_CIDR);
    let started = Instant::now();
    let mut first = env.start_ccm(&as_strs(&args)).await?;
    let all = all_allocated(&api, 51)
        .await
        .map_err(|e| e.context(first.logs()))?;
    let took = started.elapsed();
    assert_distinct(&all);
    assert_eq!(all["pre"], ["10.244.0.0/24"]);
    for (name, cidrs) in &all {
        let net: ipnet::IpNet = cidrs[0].parse()?;
        assert_eq!(net.prefix_len(), 24, "{name}");
        assert!(
            CLUSTER_CIDR.parse::<ipnet::IpNet>()?.contains(&net),
            "{name}: {net}"
        );
    }
    eprintln!("figures: 50 nodes allocated in {took:?} (process start included)");

    // Failover: a standby takes over after the leader is killed mid-flight.
    let second = env.start_ccm(&as_strs(&args)).await?;
    wait_leading(&second, false, WAIT).await?;
    for n in 50..60 {
        create(&api, node(&format!("n{n:02}"), None, &[])).await?;
    }
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(5)).await?;
    for n in 60..70 {
        create(&api, node(&format!("n{n:02}"), None, &[])).await?;
    }
    let all = all_allocated(&api, 71)
        .await
        .map_err(|e| e.context(second.logs()))?;
    // Distinct CIDRs for all 71 prove the new leader rebuilt its map from
    // the API server before allocating: an empty map would hand n60 the
    // range n00 holds.
    assert_distinct(&all);

    // Restart: a clean stop, a new process, more nodes.
    let mut second = second;
    second.signal(libc::SIGTERM);
    second.wait_exit(Duration::from_secs(15)).await?;
    let third = env.start_ccm(&as_strs(&args)).await?;
    for n in 70..80 {
        create(&api, node(&format!("n{n:02}"), None, &[])).await?;
    }
    let all = all_allocated(&api, 81)
        .await
        .map_err(|e| e.context(third.logs()))?;
    // The nodes made after the second stopped have CIDRs: the third
    // allocated them.
    assert_distinct(&all);
    assert_eq!(all["pre"], ["10.244.0.0/24"]);
    env.finish().await
}

#[tokio::test]
async fn a_full_range_warns_the_node_and_a_deleted_node_frees_its_cidr() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let api = nodes_api(&env).await?;
    create(&api, node("a", None, &[])).await?;
    create(&api, node("b", None, &[])).await?;
    // Two /24s in a /23: the third node has to wait.
    let ccm = env.start_ccm(&as_strs(&ipam_args("10.244.0.0/23"))).await?;
    let ab = eventually("a and b allocated", WAIT, || async {
        Some((pod_cidrs(&api, "a").await?, pod_cidrs(&api, "b").await?))
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    create(&api, node("c", None, &[])).await?;
    let events = eventually("CIDRNotAvailable on c", WAIT, || async {
        let e = events_for(&env, "c", "CIDRNotAvailable").await;
        (!e.is_empty()).then_some(e)
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(note.contains("10.244.0.0/23"), "{note}");
    assert_eq!(pod_cidrs(&api, "c").await, None);
    let addr = ccm.https_addr().await?;
    metrics_with(
        &addr,
        &["node_ipam_cidrs_free{cluster_cidr=\"10.244.0.0/23\"} 0"],
        WAIT,
    )
    .await?;

    api.delete("a", &DeleteParams::default()).await?;
    let c = eventually("c gets the freed CIDR", WAIT, || pod_cidrs(&api, "c"))
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(c, ab.0);
    assert_ne!(c, ab.1);
    env.finish().await
}

#[tokio::test]
async fn dual_stack_nodes_get_one_cidr_of_each_family() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let api = nodes_api(&env).await?;
    for n in 0..3 {
        create(&api, node(&format!("n{n}"), None, &[])).await?;
    }
    let ccm = env
        .start_ccm(&as_strs(&ipam_args("10.244.0.0/16,fd00:10:244::/56")))
        .await?;
    let all = all_allocated(&api, 3)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_distinct(&all);
    for name in all.keys() {
        let n = api.get(name).await?;
        let spec = n.spec.expect("spec");
        let cidrs = spec.pod_cidrs.expect("podCIDRs");
        assert_eq!(cidrs.len(), 2, "{name}: {cidrs:?}");
        let v4: ipnet::IpNet = cidrs[0].parse()?;
        let v6: ipnet::IpNet = cidrs[1].parse()?;
        assert!(
            matches!(v4, ipnet::IpNet::V4(_)) && v4.prefix_len() == 24,
            "{v4}"
        );
        assert!(
            matches!(v6, ipnet::IpNet::V6(_)) && v6.prefix_len() == 64,
            "{v6}"
        );
        assert_eq!(
            spec.pod_cidr.as_deref(),
            Some(cidrs[0].as_str()),
            "podCIDR is the primary"
        );
    }
    env.finish().await
}

/// kOps passes `--allocate-node-cidrs=true` to the Go CCM, which has no
/// IPAM controller, while kube-controller-manager allocates: after a swap the
/// default controllers must not start a second allocator, and say so.
#[tokio::test]
async fn default_controllers_do_not_run_node_ipam_even_with_allocate_node_cidrs()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let api = nodes_api(&env).await?;
    create(&api, node("n0", None, &[])).await?;
    let ccm = env
        .start_ccm(&["--allocate-node-cidrs=true", "--cluster-cidr=10.244.0.0/16"])
        .await?;
    // The four default controllers start; node IPAM is not among them
    // (the controllers named are started together, or not at all).
    let defaults = [
        "cloud-node-controller",
        "cloud-node-lifecycle-controller",
        "service-lb-controller",
        "node-route-controller",
    ];
    let lines: Vec<String> = defaults.iter().map(|n| controller_running(n)).collect();
    let needles: Vec<&str> = lines.iter().map(String::as_str).collect();
    let addr = ccm.https_addr().await?;
    let m = metrics_with(&addr, &needles, WAIT).await?;
    assert!(!m.contains("node-ipam-controller"), "{m}");
    assert_eq!(m.matches("aws_ccm_controller_running{").count(), 4, "{m}");
    // And says why (the log reader may trail the process by a moment).
    ccm.wait_for_log("node IPAM is not running", WAIT).await?;
    let logs = ccm.logs();
    assert!(logs.contains("--controllers names nodeipam"), "{logs}");
    assert!(!logs.contains("starting node IPAM"), "{logs}");
    assert!(pod_cidrs(&api, "n0").await.is_none());
    env.finish().await
}

/// A Node holding a CIDR outside --cluster-cidr (kube-controller-manager
/// allocating from its own range): node IPAM refuses to allocate, says why,
/// and the gauge shows it; the other controllers keep running.
#[tokio::test]
async fn node_ipam_stands_down_when_another_allocator_is_at_work() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let api = nodes_api(&env).await?;
    create(&api, node("kcm-made", None, &["100.96.3.0/24"])).await?;
    create(&api, node("bare", None, &[])).await?;
    let mut args = ipam_args("10.244.0.0/16");
    args[0] = "--controllers=nodeipam,service".into();
    let ccm = env.start_ccm(&as_strs(&args)).await?;
    // Node IPAM stood down; the other controllers run on.
    let addr = ccm.https_addr().await?;
    let running = controller_running("service-lb-controller");
    metrics_with(
        &addr,
        &["node_ipam_other_allocator_detected 1", &running],
        WAIT,
    )
    .await?;
    assert!(pod_cidrs(&api, "bare").await.is_none());
    // And says why, naming the Node and its CIDR.
    ccm.wait_for_log("another pod CIDR allocator is at work", WAIT)
        .await?;
    let logs = ccm.logs();
    assert!(
        logs.contains("kcm-made") && logs.contains("100.96.3.0/24"),
        "{logs}"
    );
    env.finish().await
}

#[tokio::test]
async fn a_bad_cluster_cidr_stops_start_up_naming_the_value() -> anyhow::Result<()> {
    let env = Env::start().await?;
    for (value, needle) in [
        ("10.244.0.0", "\"10.244.0.0\" is not a CIDR"),
        ("10.0.0.0/16,10.1.0.0/16", "two IPv4 CIDRs"),
        ("10.244.0.0/25", "10.244.0.0/25"),
    ] {
        let mut args = env.base_args();
        args.extend([
            "--controllers=*,nodeipam".to_string(),
            "--allocate-node-cidrs=true".to_string(),
            format!("--cluster-cidr={value}"),
        ]);
        let (status, logs) = Ccm::run_to_exit(&args, &env.aws_env()).await?;
        assert!(!status.success(), "{value}: {logs}");
        assert!(
            logs.contains("--cluster-cidr") && logs.contains(needle),
            "{value}: {logs}"
        );
    }
    env.finish().await
}
