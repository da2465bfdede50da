//! The load-balancer sweep (issue 19, read side): a fresh leader adopts
//! every Service from a few batched reads and writes nothing; a write
//! invalidates only the load balancer it touched; drift someone made behind
//! the CCM's back is still repaired at the Service's resync; and a Service
//! created during a large adoption goes ahead of it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use aws_ccm::aws::load_balancers::{AwsLoadBalancers, EnsureRequest, LoadBalancers};
use aws_ccm::provider::load_balancers::LoadBalancerSpec;
use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule, ProxyConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::Api;
use kube::api::{ListParams, PostParams};

use crate::service::{hostname, lb_service, node};
use crate::support::*;

const WAIT: Duration = Duration::from_secs(180);
const CLB: &str = "elasticloadbalancing";
const V2: &str = "elasticloadbalancingv2";

fn nlb(name: &str) -> Service {
    lb_service(
        name,
        serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
    )
}

fn calls(proxy: &FaultProxy, service: &str, action: &str) -> u64 {
    proxy.calls().get(service, action).received
}

/// A node for every seeded instance, then `services`.
async fn nodes_and_services(
    env: &Env,
    seeded: &Seeded,
    services: &[Service],
) -> anyhow::Result<()> {
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in seeded.instances.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i}"), id))
            .await?;
    }
    let api: Api<Service> = Api::namespaced(client, "default");
    for s in services {
        api.create(&PostParams::default(), s).await?;
    }
    Ok(())
}

/// Waits until every Service in `default` has a hostname.
async fn all_have_hostnames(env: &Env, ccm: &Ccm, count: usize) -> anyhow::Result<()> {
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    eventually(&format!("{count} hostnames"), WAIT, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let with = list.items.iter().filter(|s| hostname(s).is_some()).count();
        (with == count).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

/// The first leader creates `clbs` classic ELBs and `nlbs` NLBs, then is
/// killed; returns once every Service has its load balancer.
async fn first_leader_creates(
    env: &Env,
    seeded: &Seeded,
    clbs: usize,
    nlbs: usize,
) -> anyhow::Result<()> {
    let mut services: Vec<Service> = (0..clbs)
        .map(|i| lb_service(&format!("c{i}"), serde_json::json!({})))
        .collect();
    services.extend((0..nlbs).map(|i| nlb(&format!("n{i}"))));
    nodes_and_services(env, seeded, &services).await?;
    let mut first = env
        .start_ccm(&[
            "--controllers=service",
            "--concurrent-service-syncs=10",
            // Creates have a small AWS bucket (one per 5 s at full size).
            "--aws-api-budget-fraction=10",
        ])
        .await?;
    all_have_hostnames(env, &first, clbs + nlbs).await?;
    // Its target record is written in the background: let it land (one
    // entry per NLB target group) before the kill.
    eventually("the target record written", WAIT, || async {
        (record_entries(env).await.ok()? == nlbs).then_some(())
    })
    .await?;
    first.signal(9);
    first.wait_exit(Duration::from_secs(30)).await?;
    Ok(())
}

/// Entries in the target record (`crate::target_record`).
async fn record_entries(env: &Env) -> anyhow::Result<usize> {
    let api: Api<ConfigMap> = Api::namespaced(env.api.client().await?, "kube-system");
    let cm = api.get("cloud-controller-manager-targets").await?;
    Ok(cm.data.map_or(0, |d| d.len()))
}

/// A fresh leader adopting 30 classic ELBs and 30 NLBs it (an earlier
/// leader) made: every sync reads from the shared sweep (one page of each
/// `DescribeLoadBalancers`, tags 20 per call, one page of target groups),
/// trusts the settings the load balancers' records vouch for (no attribute
/// or listener read) and, the Lease having passed straight from the leader
/// that wrote the target record, the targets it records (no
/// `DescribeTargetHealth`), and writes nothing.
#[tokio::test]
async fn a_fresh_leader_adopts_from_a_few_batched_reads_and_writes_nothing() -> anyhow::Result<()> {
    adopt_after_first_leader(false).await
}

/// As above, but another holder took the Lease in between (a Go CCM, say):
/// the target record is void, and each target group's targets are read
/// once. Nothing is written either.
#[tokio::test]
async fn a_holder_in_between_voids_the_target_record_and_each_group_is_read() -> anyhow::Result<()>
{
    adopt_after_first_leader(true).await
}

/// A node that joined while no leader ran makes the recorded digests
/// differ from what the Services ask for: the successor reads those groups
/// (it trusts nothing stale) and registers the node.
#[tokio::test]
async fn a_node_that_joined_between_leaders_is_registered_by_the_successor() -> anyhow::Result<()> {
    const N: usize = 3;
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    first_leader_creates(&env, &seeded, 0, N).await?;
    let joined = seeded.launch(1).await?;
    Api::<Node>::all(env.api.client().await?)
        .create(&PostParams::default(), &node("joined", &joined[0]))
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let want: BTreeSet<String> = seeded.instances.iter().chain(&joined).cloned().collect();
    every_group_holds(
        &seeded,
        &want,
        "every target group holds the joined node",
        &ccm,
    )
    .await?;
    env.finish().await
}

/// Waits (`what`) until every NLB target group holds exactly `want`.
async fn every_group_holds(
    seeded: &Seeded,
    want: &BTreeSet<String>,
    what: &str,
    ccm: &Ccm,
) -> anyhow::Result<()> {
    eventually(what, WAIT, || async {
        groups_not_holding(seeded, want)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

/// Another holder takes the expired Lease: it counts a transition.
async fn lease_taken_by_someone_else(env: &Env) -> anyhow::Result<()> {
    let api: Api<Lease> = Api::namespaced(env.api.client().await?, "kube-system");
    let mut lease = api.get("cloud-controller-manager").await?;
    let spec = lease.spec.get_or_insert_with(Default::default);
    spec.holder_identity = Some("go-ccm_0".into());
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    spec.lease_duration_seconds = Some(1);
    api.replace("cloud-controller-manager", &PostParams::default(), &lease)
        .await?;
    Ok(())
}

async fn adopt_after_first_leader(someone_in_between: bool) -> anyhow::Result<()> {
    const N: usize = 30;
    // 60 load balancers' node rules would pass EC2's 60 rules per group.
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nDisableSecurityGroupIngress = true\n"
    ))
    .await?;
    let seeded = seed_cluster(&env, 2).await?;
    first_leader_creates(&env, &seeded, N, N).await?;
    if someone_in_between {
        lease_taken_by_someone_else(&env).await?;
    }

    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let ccm = env
        .start_ccm_via(
            &proxy.endpoint(),
            &["--controllers=service", "--concurrent-service-syncs=10"],
        )
        .await?;
    adopted(&ccm, 2 * N).await?;

    let logs = ccm.logs();
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{logs}");
    // One sweep serves the whole adoption: the controllers keep it for the
    // resync period, at most 5 minutes (the adoption's deadline is 3), and
    // nothing was written to invalidate it. Each listing is one page; tags
    // go ceil(30/20) calls per kind.
    let sweeps = calls(&proxy, CLB, "DescribeLoadBalancers");
    assert_eq!(sweeps, 1, "logs:\n{logs}");
    let tag_calls = N.div_ceil(20) as u64;
    // The start-up permission probe asks each DescribeTags once.
    let probe = 1;
    let bounds = [
        (CLB, "DescribeLoadBalancers", 1),
        (CLB, "DescribeTags", tag_calls + probe),
        (V2, "DescribeLoadBalancers", 1),
        (V2, "DescribeTargetGroups", 1),
        // The NLBs' tags and their target groups' tags.
        (V2, "DescribeTags", 2 * tag_calls + probe),
        // Registered targets: from the record, else one read per target
        // group (not batchable).
        (
            V2,
            "DescribeTargetHealth",
            if someone_in_between { N as u64 } else { 0 },
        ),
        (CLB, "DescribeLoadBalancerAttributes", 0),
        (V2, "DescribeLoadBalancerAttributes", 0),
        (V2, "DescribeListeners", 0),
        (V2, "DescribeTargetGroupAttributes", 0),
    ];
    for (service, action, bound) in bounds {
        let n = calls(&proxy, service, action);
        assert!(n <= bound, "{service}:{action}: {n} calls, bound {bound}");
    }
    let describes: u64 = proxy
        .calls()
        .iter()
        .filter(|(s, a, _)| (*s == CLB || *s == V2) && a.starts_with("Describe"))
        .map(|(_, _, c)| c.received)
        .sum();
    eprintln!("adoption of {N} CLBs + {N} NLBs: {describes} ELB describe calls, {sweeps} sweeps");
    if someone_in_between {
        // Each group read once; the new leader records them again.
        assert_eq!(calls(&proxy, V2, "DescribeTargetHealth"), N as u64);
        eventually("the target record rewritten", WAIT, || async {
            (record_entries(&env).await.ok()? == N).then_some(())
        })
        .await?;
    }
    env.finish().await
}

/// A Service created while a fresh leader adopts a backlog (one sync at a
/// time) gets its load balancer next, not after the backlog.
#[tokio::test]
async fn a_service_created_during_adoption_goes_ahead_of_the_backlog() -> anyhow::Result<()> {
    // Without the priority, late would land anywhere in the backlog: at
    // most 2 syncs ahead of it by chance 3 times in N.
    const N: usize = 20;
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    first_leader_creates(&env, &seeded, 0, N).await?;
    // With the Lease passing straight on, the successor would take every
    // group's targets from the target record and read nothing: another
    // holder in between voids it.
    lease_taken_by_someone_else(&env).await?;
    // An adopted NLB's sync then reads its target group's health, the one
    // read the sweep cannot answer; holding each answer 500 ms makes the backlog
    // last ~10 s, so that the late Service arrives while it is still there
    // (a classic ELB's adoption makes no call of its own and the backlog
    // would drain before the watch delivers the late Service).
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Latency(Duration::from_millis(500)))
            .for_action("DescribeTargetHealth"),
    ]);

    let ccm = env
        .start_ccm(&["--controllers=service", "--concurrent-service-syncs=1"])
        .await?;
    // Adoption under way: a first Service synced.
    ccm.wait_synced(1, WAIT).await?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    // From here the proxy keeps the order of what it received.
    env.proxy.record_requests(true);
    api.create(
        &PostParams::default(),
        &lb_service("late", serde_json::json!({})),
    )
    .await?;
    eventually("a hostname for late", WAIT, || async {
        api.get("late").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    ccm.wait_synced(N as u64 + 1, WAIT).await?;
    // Each NLB's adoption sync reads its group's health once; late's sync
    // is the one CreateLoadBalancer. The adoption syncs that started
    // between late's creation and its own are those it waited for.
    let order: Vec<String> = (env.proxy)
        .requests_of(&["DescribeTargetHealth", "CreateLoadBalancer"])
        .into_iter()
        .map(|c| c.action)
        .collect();
    let ahead = (order.iter())
        .position(|a| a == "CreateLoadBalancer")
        .ok_or_else(|| anyhow::anyhow!("no CreateLoadBalancer for late in {order:?}"))?;
    eprintln!("late went after {ahead} adoption syncs: {order:?}");
    // At most the sync in flight when late arrived, and one more started
    // before the informer delivered it, go first.
    assert!(
        ahead <= 2,
        "late was synced after {ahead} adoption syncs: {order:?}"
    );
    assert!(
        order.len() > ahead + 1,
        "the adoption backlog had not drained before late: {order:?}"
    );
    env.finish().await
}

fn lbs(aws: aws_ccm::aws::Aws) -> AwsLoadBalancers {
    AwsLoadBalancers::new(
        aws,
        Arc::new(aws_ccm::cloud_config::CloudConfig::default()),
        CLUSTER_ID.into(),
        "kubernetes".into(),
    )
    .trusting_known_settings(Duration::from_secs(3600))
}

/// A classic ELB Service as the API server would hand it over.
fn request(name: &str, uid: &str, idle: &str, instances: &[String]) -> EnsureRequest {
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout": idle}},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}
    }))
    .unwrap();
    EnsureRequest {
        service_key: format!("default/{name}"),
        uid: uid.into(),
        spec: LoadBalancerSpec::from_service(&svc).unwrap(),
        instance_ids: instances.iter().cloned().collect(),
        scope: Default::default(),
    }
}

/// A change to one load balancer invalidates only its entry: the next
/// syncs read that one on its own and the others from the sweep, and no
/// sync reads attributes it knows.
#[tokio::test]
async fn a_write_invalidates_only_the_load_balancer_it_touched() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let proxy = FaultProxy::start(&env.moto.endpoint(), ProxyConfig::default()).await?;
    let uids = [
        "0a000000-0000-0000-0000-000000000001",
        "0b000000-0000-0000-0000-000000000002",
        "0c000000-0000-0000-0000-000000000003",
    ];
    let reqs: Vec<EnsureRequest> = ["a", "b", "c"]
        .iter()
        .zip(uids)
        .map(|(n, u)| request(n, u, "60", &seeded.instances))
        .collect();
    let creator = lbs(aws_client_via(&env, &proxy.endpoint()).await);
    for r in &reqs {
        creator.ensure(r).await?;
    }

    // A fresh process: one sweep serves all three, their records vouch
    // for the attributes.
    let lbs = lbs(aws_client_via(&env, &proxy.endpoint()).await);
    proxy.reset_counts();
    for r in &reqs {
        assert!(lbs.ensure(r).await?.changes.is_empty());
    }
    assert_eq!(calls(&proxy, CLB, "DescribeLoadBalancers"), 1);
    assert_eq!(calls(&proxy, CLB, "DescribeLoadBalancerAttributes"), 0);
    assert_eq!(mutations(&proxy), BTreeMap::new());

    // a asks for another idle timeout: read in full, changed.
    let changed = request("a", uids[0], "120", &seeded.instances);
    let done = lbs.ensure(&changed).await?;
    assert!(!done.changes.is_empty());

    proxy.reset_counts();
    proxy.record_requests(true);
    lbs.ensure(&changed).await?;
    lbs.ensure(&reqs[1]).await?;
    lbs.ensure(&reqs[2]).await?;
    let described = proxy.requests("DescribeLoadBalancers");
    let names: Vec<&str> = described
        .iter()
        .filter(|c| c.service == CLB)
        .filter_map(|c| {
            c.params
                .get("LoadBalancerNames.member.1")
                .map(String::as_str)
        })
        .collect();
    let a_name = format!("a{}", uids[0].replace('-', ""));
    assert_eq!(names, [&a_name[..32]], "only a is read on its own");
    assert_eq!(
        described.iter().filter(|c| c.service == CLB).count(),
        1,
        "b and c come from the sweep: {described:?}"
    );
    assert_eq!(calls(&proxy, CLB, "DescribeLoadBalancerAttributes"), 0);
    assert_eq!(mutations(&proxy), BTreeMap::new());
    // No Service stands behind these load balancers: delete them as the
    // controller would, and the audit finds nothing left.
    for r in &reqs {
        assert!(
            lbs.ensure_deleted(&r.service_key, &r.uid, false, None)
                .await?
                .changed
        );
    }
    env.finish().await
}

/// Someone changes a classic ELB's idle timeout behind the CCM's back:
/// the Service's periodic resync (its slot in `--service-resync-period`)
/// reads the load balancer in full and repairs it.
#[tokio::test]
async fn drift_behind_the_ccms_back_is_repaired_at_the_services_resync() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    nodes_and_services(&env, &seeded, &[lb_service("web", serde_json::json!({}))]).await?;
    let ccm = env
        .start_ccm(&["--controllers=service", "--service-resync-period=3s"])
        .await?;
    all_have_hostnames(&env, &ccm, 1).await?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let svc = api.get("web").await?;
    let name = format!("a{}", svc.metadata.uid.unwrap().replace('-', ""))[..32].to_string();
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let idle = || async {
        let out = elb
            .describe_load_balancer_attributes()
            .load_balancer_name(&name)
            .send()
            .await
            .ok()?;
        out.load_balancer_attributes()?
            .connection_settings()
            .map(|c| c.idle_timeout())
    };
    assert_eq!(idle().await, Some(60));
    elb.modify_load_balancer_attributes()
        .load_balancer_name(&name)
        .load_balancer_attributes(
            aws_sdk_elasticloadbalancing::types::LoadBalancerAttributes::builder()
                .connection_settings(
                    aws_sdk_elasticloadbalancing::types::ConnectionSettings::builder()
                        .idle_timeout(300)
                        .build()?,
                )
                .build(),
        )
        .send()
        .await?;
    eventually("the idle timeout repaired", WAIT, || async {
        (idle().await == Some(60)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// Someone deregisters a node from an NLB's target group by hand. The
/// Service's resyncs take its targets from the target record, which still
/// vouches for them, but once every few resync periods (at a slot of the
/// group's own) the targets are read anyway: the node is registered again.
#[tokio::test]
async fn a_target_moved_by_hand_is_restored_within_a_few_resync_periods() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    nodes_and_services(&env, &seeded, &[nlb("web")]).await?;
    let ccm = env
        .start_ccm(&["--controllers=service", "--service-resync-period=2s"])
        .await?;
    all_have_hostnames(&env, &ccm, 1).await?;
    let want: BTreeSet<String> = seeded.instances.iter().cloned().collect();
    every_group_holds(&seeded, &want, "the group holds both nodes", &ccm).await?;
    // The record vouches for the group now (this leader wrote it).
    eventually("the target record written", WAIT, || async {
        (record_entries(&env).await.ok()? == 1).then_some(())
    })
    .await?;
    let v2 = aws_sdk_elasticloadbalancingv2::Client::new(&seeded.conf);
    let group = v2.describe_target_groups().send().await?;
    let arn = group.target_groups()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string();
    v2.deregister_targets()
        .target_group_arn(&arn)
        .targets(
            aws_sdk_elasticloadbalancingv2::types::TargetDescription::builder()
                .id(&seeded.instances[0])
                .build(),
        )
        .send()
        .await?;
    assert!(!groups_not_holding(&seeded, &want).await?.is_empty());
    every_group_holds(&seeded, &want, "the node registered again", &ccm).await?;
    env.finish().await
}

/// The classic ELB name and owned group name of Service `svc`.
fn clb_names(svc: &Service) -> (String, String) {
    let uid = svc
        .metadata
        .uid
        .clone()
        .unwrap_or_default()
        .replace('-', "");
    let name = format!("a{uid}")[..32].to_string();
    let group = format!("k8s-elb-{name}");
    (name, group)
}

/// The CIDRs group `group` admits on port 80.
async fn port_80_cidrs(ec2: &aws_sdk_ec2::Client, group: &str) -> Vec<String> {
    let Some(g) = crate::service::group_by_name(ec2, group).await else {
        return Vec::new();
    };
    let mut out: Vec<String> = g
        .ip_permissions()
        .iter()
        .filter(|p| p.from_port() == Some(80))
        .flat_map(|p| p.ip_ranges().iter().filter_map(|r| r.cidr_ip()))
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// A fresh leader adopting classic ELBs and NLBs with their security-group
/// rules reads the VPC's groups from one shared view: a few
/// DescribeSecurityGroups calls in all, not two per Service.
#[tokio::test]
async fn adoption_reads_security_groups_in_a_few_calls_whatever_the_number_of_services()
-> anyhow::Result<()> {
    const N: usize = 12;
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    first_leader_creates(&env, &seeded, N, N).await?;
    let (proxy, ccm) = env
        .start_counted_ccm(&["--controllers=service", "--concurrent-service-syncs=10"])
        .await?;
    adopted(&ccm, 2 * N).await?;
    let logs = ccm.logs();
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{logs}");
    let reads = calls(&proxy, "ec2", "DescribeSecurityGroups");
    eprintln!("adoption of {N} CLBs + {N} NLBs: {reads} DescribeSecurityGroups calls");
    // One listing of the VPC (a page), the permission probe, and a read by
    // ID for a group the listing could lack: independent of N.
    assert!(
        reads <= 4,
        "{reads} DescribeSecurityGroups calls for {} Services",
        2 * N
    );
    env.finish().await
}

/// The CCM narrows a classic ELB's source range and widens it back: each
/// sync sees the rules the previous one wrote (the shared view holds this
/// process's own writes), so the group ends with exactly the range asked.
#[tokio::test]
async fn a_security_group_this_ccm_changed_is_seen_changed_by_the_next_sync() -> anyhow::Result<()>
{
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    nodes_and_services(&env, &seeded, &[lb_service("web", serde_json::json!({}))]).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    all_have_hostnames(&env, &ccm, 1).await?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let (_, group) = clb_names(&api.get("web").await?);
    assert_eq!(port_80_cidrs(&seeded.ec2, &group).await, ["0.0.0.0/0"]);
    for ranges in [vec!["10.1.0.0/16"], vec!["0.0.0.0/0"], vec!["10.2.0.0/16"]] {
        let patch = serde_json::json!({"spec": {"loadBalancerSourceRanges": ranges}});
        api.patch(
            "web",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
        let want: Vec<String> = ranges.iter().map(|s| s.to_string()).collect();
        eventually(&format!("port 80 open to {want:?} only"), WAIT, || async {
            (port_80_cidrs(&seeded.ec2, &group).await == want).then_some(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    }
    env.finish().await
}

/// Someone revokes a classic ELB group's rule behind the CCM's back: the
/// Service's resync (its slot in `--service-resync-period`) reads its own
/// groups by ID, though the shared view is minutes from its next listing,
/// and adds the rule back.
#[tokio::test]
async fn a_security_group_rule_removed_out_of_band_is_repaired_at_the_resync_slot()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    nodes_and_services(&env, &seeded, &[lb_service("web", serde_json::json!({}))]).await?;
    let ccm = env
        // moto shows a change at once: the CCM's own record of its writes
        // to the group need not answer over listings for 30 s.
        .start_ccm(&[
            "--controllers=service",
            "--service-resync-period=3s",
            "--aws-consistency-window=2s",
        ])
        .await?;
    all_have_hostnames(&env, &ccm, 1).await?;
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let (_, group) = clb_names(&api.get("web").await?);
    let id = crate::service::group_by_name(&seeded.ec2, &group)
        .await
        .and_then(|g| g.group_id().map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no group {group}"))?;
    assert_eq!(port_80_cidrs(&seeded.ec2, &group).await, ["0.0.0.0/0"]);
    seeded
        .ec2
        .revoke_security_group_ingress()
        .group_id(&id)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(
                    aws_sdk_ec2::types::IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;
    assert!(port_80_cidrs(&seeded.ec2, &group).await.is_empty());
    eventually("the rule repaired", WAIT, || async {
        (port_80_cidrs(&seeded.ec2, &group).await == ["0.0.0.0/0"]).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// Waits until `ccm` has synced `services` Services once, as its
/// `/metrics` counts them.
async fn adopted(ccm: &Ccm, services: usize) -> anyhow::Result<()> {
    ccm.wait_synced(services as u64, WAIT).await
}
