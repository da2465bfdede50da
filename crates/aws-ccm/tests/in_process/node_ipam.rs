//! Node IPAM (`controllers/node_ipam.rs`) against the API test server: the
//! CIDR patch with its preconditions, and the guard that stops allocating
//! at the first sign of another allocator (at start or later).

use ipnet::IpNet;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use aws_ccm::controllers::cached_node::Node;
use aws_ccm::controllers::events::Events;
use aws_ccm::controllers::node_ipam::guard::Sign;
use aws_ccm::controllers::node_ipam::testing::{Allocation, patch_pod_cidrs};
use aws_ccm::controllers::node_ipam::{PatchOutcome, pod_cidrs};
use aws_ccm::options::cidrs::{self, NodeCidrAllocation};
use ccm_testkit::apiserver::TestApiServer;

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

async fn node(api: &Api<Node>, name: &str) -> Node {
    let n: Node = serde_json::from_value(json!({"metadata": {"name": name}})).expect("node");
    api.create(&PostParams::default(), &n)
        .await
        .expect("create")
}

fn ids(n: &Node) -> (String, Option<String>) {
    (
        n.metadata.uid.clone().expect("uid"),
        n.metadata.resource_version.clone(),
    )
}

#[tokio::test]
async fn patch_sets_both_fields_and_rereads_on_conflict() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let api: Api<Node> = Api::all(server.client().await?);
    let created = node(&api, "n1").await;
    let (uid, stale_rv) = ids(&created);
    // Someone else (a kubelet) changes the node: our resourceVersion is stale.
    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await?;
    let cidrs = [net("10.244.1.0/24"), net("fd00::/64")];
    let outcome = patch_pod_cidrs(&api, "n1", &uid, stale_rv, &cidrs).await;
    assert!(matches!(outcome, PatchOutcome::Assigned));
    let spec = api.get("n1").await?.spec.expect("spec");
    assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.1.0/24"));
    assert_eq!(
        spec.pod_cidrs,
        Some(vec!["10.244.1.0/24".to_string(), "fd00::/64".to_string()])
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn cidrs_set_by_someone_else_first_are_kept() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let api: Api<Node> = Api::all(server.client().await?);
    let created = node(&api, "n1").await;
    let (uid, stale_rv) = ids(&created);
    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"podCIDR": "10.244.9.0/24", "podCIDRs": ["10.244.9.0/24"]}})),
    )
    .await?;
    let outcome = patch_pod_cidrs(&api, "n1", &uid, stale_rv, &[net("10.244.1.0/24")]).await;
    let PatchOutcome::TakenByOther(theirs) = outcome else {
        panic!("expected the other writer's CIDRs to win");
    };
    assert_eq!(theirs, [net("10.244.9.0/24")]);
    assert_eq!(
        api.get("n1")
            .await?
            .spec
            .and_then(|s| s.pod_cidr)
            .as_deref(),
        Some("10.244.9.0/24"),
        "never overwritten"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn a_deleted_or_recreated_node_is_gone() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let api: Api<Node> = Api::all(server.client().await?);
    let (uid, rv) = ids(&node(&api, "n1").await);
    api.delete("n1", &DeleteParams::default()).await?;
    let outcome = patch_pod_cidrs(&api, "n1", &uid, rv.clone(), &[net("10.244.1.0/24")]).await;
    assert!(matches!(outcome, PatchOutcome::Gone));
    // Same name, new node: the old node's decision does not apply to it.
    node(&api, "n1").await;
    let outcome = patch_pod_cidrs(&api, "n1", &uid, rv, &[net("10.244.1.0/24")]).await;
    assert!(matches!(outcome, PatchOutcome::Gone));
    assert_eq!(api.get("n1").await?.spec.and_then(|s| s.pod_cidr), None);
    server.shutdown().await;
    Ok(())
}

// The guard inside the allocator: a consistent start-up list, then syncs.

async fn ipam(server: &TestApiServer) -> anyhow::Result<(Allocation, Api<Node>)> {
    let client = server.client().await?;
    let cluster = cidrs::ClusterCidrs::parse("10.244.0.0/16", "--allocate-node-cidrs=true")?;
    let config = NodeCidrAllocation::new(cluster, cidrs::MaskFlags::default())?;
    let api: Api<Node> = Api::all(client.clone());
    Ok((
        Allocation::new(config, api.clone(), Events::new(client, "test")),
        api,
    ))
}

async fn cached(api: &Api<Node>) -> anyhow::Result<Vec<std::sync::Arc<Node>>> {
    let list = api.list(&Default::default()).await?;
    Ok(list.items.into_iter().map(std::sync::Arc::new).collect())
}

async fn with_cidr(api: &Api<Node>, name: &str, cidr: &str) -> anyhow::Result<()> {
    node(api, name).await;
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_cidr_outside_the_cluster_cidr_at_start_stops_allocation() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let (mut ipam, api) = ipam(&server).await?;
    with_cidr(&api, "kcm-made", "10.96.3.0/24").await?;
    node(&api, "bare").await;
    ipam.rebuild().await?;
    let other = ipam.other().cloned().expect("another allocator seen");
    assert_eq!(
        (other.node.as_str(), other.sign),
        ("kcm-made", Sign::OutsideClusterCidr)
    );
    ipam.sync(&cached(&api).await?).await;
    assert!(
        pod_cidrs(&api.get("bare").await?).is_empty(),
        "nothing allocated"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn cidrs_assigned_by_someone_else_after_start_stop_allocation() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let (mut ipam, api) = ipam(&server).await?;
    // Inside the range and present at start: fine (a previous leader).
    with_cidr(&api, "before", "10.244.0.0/24").await?;
    ipam.rebuild().await?;
    assert!(ipam.other().is_none());
    // Then another allocator gives a new node a CIDR; a bare node waits.
    with_cidr(&api, "after", "10.244.1.0/24").await?;
    node(&api, "bare").await;
    ipam.sync(&cached(&api).await?).await;
    let other = ipam.other().cloned().expect("another allocator seen");
    assert_eq!(
        (other.node.as_str(), other.sign),
        ("after", Sign::AssignedByOther)
    );
    assert!(
        pod_cidrs(&api.get("bare").await?).is_empty(),
        "nothing allocated"
    );
    server.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn without_another_allocator_nodes_are_allocated() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let (mut ipam, api) = ipam(&server).await?;
    with_cidr(&api, "before", "10.244.0.0/24").await?;
    ipam.rebuild().await?;
    node(&api, "bare").await;
    ipam.sync(&cached(&api).await?).await;
    assert!(ipam.other().is_none());
    assert_eq!(pod_cidrs(&api.get("bare").await?), [net("10.244.1.0/24")]);
    // Our own write, seen back through the cache, is not another allocator.
    ipam.sync(&cached(&api).await?).await;
    assert!(ipam.other().is_none());
    server.shutdown().await;
    Ok(())
}
