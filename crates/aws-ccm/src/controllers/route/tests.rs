//! The reconciler against the in-memory cloud: what moto cannot show
//! (blackholes, quota errors, partial failures) and the call counts.

use super::plan::NodeRoutes;
use super::*;
use crate::provider::ErrorKind;
use crate::provider::routes::fake::{FakeCall, FakeRoutes};
use crate::provider::routes::{Route, RouteTarget};
use serde_json::json;

const CLUSTER: &str = "c1";

fn net(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

fn node(name: &str, instance: &str, cidrs: &[&str]) -> NodeRoutes {
    NodeRoutes {
        name: name.into(),
        instance_id: Some(instance.into()),
        pod_cidrs: cidrs.iter().map(|c| net(c)).collect(),
    }
}

fn selector() -> RouteTableSelector {
    RouteTableSelector {
        route_table_id: None,
        vpc_id: None,
        cluster_id: CLUSTER.into(),
    }
}

fn reconciler(fake: &FakeRoutes, cidrs: &str, limit: u32) -> Reconciler<FakeRoutes> {
    Reconciler::new(
        fake.clone(),
        ClusterCidrs::parse(cidrs, "test").expect("test CIDR"),
        selector(),
        limit,
    )
}

fn cloud(tables: &[&str], instances: &[&str]) -> FakeRoutes {
    let fake = FakeRoutes::new();
    for t in tables {
        fake.add_table(t, CLUSTER, "10.0.0.0/16");
    }
    for i in instances {
        fake.add_instance(i, true);
    }
    fake
}

fn instance_route(dest: &str, id: &str) -> Route {
    Route {
        destination: Some(net(dest)),
        target: RouteTarget::Instance(id.into()),
        blackhole: false,
        propagated: false,
    }
}

#[tokio::test]
async fn creates_routes_in_every_table_then_an_unchanged_cluster_costs_no_writes() {
    let fake = cloud(&["rtb-a", "rtb-b"], &["i-1", "i-2"]);
    // A table of another cluster is not touched.
    fake.add_table("rtb-other", "c2", "10.0.0.0/16");
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let nodes = [
        node("n1", "i-1", &["10.244.1.0/24"]),
        node("n2", "i-2", &["10.244.2.0/24"]),
    ];
    let report = r.reconcile(&nodes).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
    assert_eq!(report.nodes["n2"], NodeResult::Routed);
    for table in ["rtb-a", "rtb-b"] {
        assert_eq!(
            fake.route_to(table, "10.244.1.0/24").unwrap().target,
            RouteTarget::Instance("i-1".into())
        );
        assert_eq!(
            fake.route_to(table, "10.244.2.0/24").unwrap().target,
            RouteTarget::Instance("i-2".into())
        );
    }
    assert_eq!(fake.routes("rtb-other").len(), 1);
    assert_eq!(fake.instance("i-1").unwrap().source_dest_check, Some(false));
    assert_eq!(fake.instance("i-2").unwrap().source_dest_check, Some(false));
    // 2 source/dest + 4 creates.
    assert_eq!(fake.mutating_calls().len(), 6);

    fake.reset_calls();
    let report = r.reconcile(&nodes).await.unwrap();
    assert!(report.plan.is_empty());
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
    assert_eq!(fake.mutating_calls(), []);
    assert_eq!(
        fake.calls()
            .iter()
            .filter(|c| **c == FakeCall::DescribeRouteTables)
            .count(),
        1,
        "one DescribeRouteTables per reconcile"
    );
}

#[tokio::test]
async fn a_replaced_instance_gets_its_blackholed_route_replaced_in_place() {
    let fake = cloud(&["rtb-a"], &["i-old"]);
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    r.reconcile(&[node("n1", "i-old", &["10.244.1.0/24"])])
        .await
        .unwrap();
    // The instance dies; AWS turns its route into a blackhole. The node
    // comes back on a new instance with the same pod CIDR.
    fake.terminate_instance("i-old");
    fake.add_instance("i-new", true);
    fake.reset_calls();
    let report = r
        .reconcile(&[node("n1", "i-new", &["10.244.1.0/24"])])
        .await
        .unwrap();
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
    assert_eq!(
        fake.mutating_calls(),
        [
            FakeCall::DisableSourceDestCheck("i-new".into()),
            FakeCall::ReplaceRoute("rtb-a".into(), net("10.244.1.0/24"), "i-new".into()),
        ]
    );
    let route = fake.route_to("rtb-a", "10.244.1.0/24").unwrap();
    assert!(!route.blackhole);
    assert_eq!(route.target, RouteTarget::Instance("i-new".into()));
}

#[tokio::test]
async fn deleted_nodes_and_stray_blackholes_are_cleaned_but_foreign_routes_stay() {
    let fake = cloud(&["rtb-a"], &["i-1", "i-2"]);
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    r.reconcile(&[
        node("n1", "i-1", &["10.244.1.0/24"]),
        node("n2", "i-2", &["10.244.2.0/24"]),
    ])
    .await
    .unwrap();
    let mut hole = instance_route("10.244.9.0/24", "i-dead");
    hole.blackhole = true;
    fake.put_route("rtb-a", hole);
    fake.put_route("rtb-a", instance_route("192.168.0.0/24", "i-2"));
    fake.put_route(
        "rtb-a",
        Route {
            destination: Some(net("0.0.0.0/0")),
            target: RouteTarget::Gateway("igw-1".into()),
            blackhole: false,
            propagated: false,
        },
    );
    fake.reset_calls();
    // n2 is deleted.
    r.reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap();
    let mut deleted: Vec<FakeCall> = fake.mutating_calls();
    deleted.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(
        deleted,
        [
            FakeCall::DeleteRoute("rtb-a".into(), net("10.244.2.0/24")),
            FakeCall::DeleteRoute("rtb-a".into(), net("10.244.9.0/24")),
        ]
    );
    assert!(fake.route_to("rtb-a", "192.168.0.0/24").is_some());
    assert!(fake.route_to("rtb-a", "0.0.0.0/0").is_some());
    assert!(
        fake.route_to("rtb-a", "10.0.0.0/16").is_some(),
        "local route"
    );
}

#[tokio::test]
async fn ipv6_and_dual_stack_routes() {
    let fake = cloud(&["rtb-a"], &["i-1"]);
    let mut r = reconciler(&fake, "10.244.0.0/16,fd00:10:244::/56", 50);
    let report = r
        .reconcile(&[node("n1", "i-1", &["10.244.1.0/24", "fd00:10:244:1::/64"])])
        .await
        .unwrap();
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
    assert!(fake.route_to("rtb-a", "fd00:10:244:1::/64").is_some());
    assert!(fake.route_to("rtb-a", "10.244.1.0/24").is_some());
    fake.reset_calls();
    r.reconcile(&[]).await.unwrap();
    assert_eq!(fake.mutating_calls().len(), 2, "both families removed");
    assert!(fake.route_to("rtb-a", "fd00:10:244:1::/64").is_none());
}

#[tokio::test]
async fn failures_name_cidr_table_and_error_and_block_only_that_node() {
    let fake = cloud(&["rtb-a"], &["i-1", "i-2"]);
    fake.fail(
        "create",
        "10.244.2.0/24",
        CloudError::new(
            "ec2:CreateRoute",
            ErrorKind::Rejected,
            "RouteLimitExceeded: The maximum number of routes has been reached",
        ),
    );
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let report = r
        .reconcile(&[
            node("n1", "i-1", &["10.244.1.0/24"]),
            node("n2", "i-2", &["10.244.2.0/24"]),
        ])
        .await
        .unwrap();
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
    let NodeResult::Failed(problems) = &report.nodes["n2"] else {
        panic!("n2 should fail: {:?}", report.nodes["n2"]);
    };
    let text = problems.join("; ");
    assert!(
        text.contains("10.244.2.0/24")
            && text.contains("rtb-a")
            && text.contains("RouteLimitExceeded"),
        "{text}"
    );
    assert_eq!(report.failures.len(), 1);
    // Fixed: the next reconcile retries only what failed.
    fake.clear_failures();
    fake.reset_calls();
    let report = r
        .reconcile(&[
            node("n1", "i-1", &["10.244.1.0/24"]),
            node("n2", "i-2", &["10.244.2.0/24"]),
        ])
        .await
        .unwrap();
    assert_eq!(report.nodes["n2"], NodeResult::Routed);
    assert_eq!(
        fake.mutating_calls(),
        [FakeCall::CreateRoute(
            "rtb-a".into(),
            net("10.244.2.0/24"),
            "i-2".into()
        )]
    );
}

#[tokio::test]
async fn no_route_is_made_to_an_instance_whose_source_dest_check_could_not_be_turned_off() {
    let fake = cloud(&["rtb-a"], &["i-1"]);
    fake.fail(
        "source_dest",
        "i-1",
        CloudError::new(
            "ec2:ModifyInstanceAttribute",
            ErrorKind::Denied,
            "UnauthorizedOperation: not allowed",
        ),
    );
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let report = r
        .reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap();
    assert!(
        matches!(&report.nodes["n1"], NodeResult::Failed(p) if p.iter().any(|m| m.contains("UnauthorizedOperation") || m.contains("not allowed")))
    );
    assert_eq!(
        fake.mutating_calls(),
        [FakeCall::DisableSourceDestCheck("i-1".into())]
    );
    assert!(fake.route_to("rtb-a", "10.244.1.0/24").is_none());
}

#[tokio::test]
async fn an_ambiguous_create_is_left_for_the_next_read_and_a_vanished_route_is_deleted_quietly() {
    let fake = cloud(&["rtb-a"], &["i-1"]);
    fake.fail(
        "create",
        "10.244.1.0/24",
        CloudError::new("ec2:CreateRoute", ErrorKind::AlreadyExists, "exists"),
    );
    fake.fail(
        "delete",
        "10.244.9.0/24",
        CloudError::new("ec2:DeleteRoute", ErrorKind::NotFound, "gone"),
    );
    fake.put_route("rtb-a", instance_route("10.244.9.0/24", "i-gone"));
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let report = r
        .reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap();
    assert_eq!(report.nodes["n1"], NodeResult::Unconfirmed);
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    assert!(report.failures[0].error.is_already_exists());
}

#[tokio::test]
async fn route_table_id_from_cloud_conf_selects_exactly_that_table() {
    let fake = cloud(&["rtb-a", "rtb-b"], &["i-1"]);
    fake.add_table_with_tags("rtb-untagged", Default::default(), "10.0.0.0/16");
    let mut r = Reconciler::new(
        fake.clone(),
        ClusterCidrs::parse("10.244.0.0/16", "test").unwrap(),
        RouteTableSelector {
            route_table_id: Some("rtb-untagged".into()),
            vpc_id: None,
            cluster_id: CLUSTER.into(),
        },
        50,
    );
    r.reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap();
    assert!(fake.route_to("rtb-untagged", "10.244.1.0/24").is_some());
    assert!(fake.route_to("rtb-a", "10.244.1.0/24").is_none());
}

#[tokio::test]
async fn no_route_table_is_an_error_that_says_what_to_do_and_changes_nothing() {
    let fake = cloud(&[], &["i-1"]);
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let err = r
        .reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no route table")
            && text.contains("kubernetes.io/cluster/c1")
            && text.contains("RouteTableID"),
        "{text}"
    );
    assert_eq!(fake.mutating_calls(), []);
}

#[tokio::test]
async fn capacity_warning_once_per_crossing() {
    let fake = cloud(&["rtb-a"], &["i-1", "i-2", "i-3", "i-4", "i-5"]);
    // Limit 5: local + 4 node routes = 5 > 4 (80 %).
    let mut r = reconciler(&fake, "10.244.0.0/16", 5);
    let nodes: Vec<NodeRoutes> = (1..=3)
        .map(|i| {
            node(
                &format!("n{i}"),
                &format!("i-{i}"),
                &[&format!("10.244.{i}.0/24")],
            )
        })
        .collect();
    let report = r.reconcile(&nodes).await.unwrap();
    assert!(
        report.new_capacity_warnings.is_empty(),
        "4 of 5 is exactly 80 %"
    );
    let mut more = nodes.clone();
    more.push(node("n4", "i-4", &["10.244.4.0/24"]));
    let report = r.reconcile(&more).await.unwrap();
    assert_eq!(
        report.new_capacity_warnings,
        [CapacityWarning {
            table_id: "rtb-a".into(),
            routes: 5,
            limit: 5
        }]
    );
    let msg = report.new_capacity_warnings[0].message();
    assert!(
        msg.contains("Service Quotas") && msg.contains("--configure-cloud-routes=false"),
        "{msg}"
    );
    // Still above: no repeat. Back below and above again: warned again.
    assert!(
        r.reconcile(&more)
            .await
            .unwrap()
            .new_capacity_warnings
            .is_empty()
    );
    assert!(
        r.reconcile(&nodes)
            .await
            .unwrap()
            .new_capacity_warnings
            .is_empty()
    );
    assert_eq!(
        r.reconcile(&more)
            .await
            .unwrap()
            .new_capacity_warnings
            .len(),
        1
    );
    assert_eq!(report.table_routes["rtb-a"], 5);
}

#[test]
fn node_fields_are_read_from_the_spec() {
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1"},
        "spec": {
            "providerID": "aws:///us-east-1a/i-0abc",
            "podCIDR": "10.244.1.0/24",
            "podCIDRs": ["10.244.1.0/24", "fd00::/64", "junk"]
        }
    }))
    .unwrap();
    let r = node_routes(&node);
    assert_eq!(r.name, "n1");
    assert_eq!(r.instance_id.as_deref(), Some("i-0abc"));
    assert_eq!(r.pod_cidrs, [net("10.244.1.0/24"), net("fd00::/64")]);
}

#[test]
fn fingerprint_ignores_order_and_irrelevant_fields() {
    let a: Node = serde_json::from_value(
        json!({"metadata": {"name": "a"}, "spec": {"podCIDR": "10.244.1.0/24"}}),
    )
    .unwrap();
    let b: Node =
        serde_json::from_value(json!({"metadata": {"name": "b", "labels": {"x": "y"}}})).unwrap();
    let mut b2 = b.clone();
    b2.metadata.labels = None;
    b2.metadata.resource_version = Some("99".into());
    let one = fingerprint(&[Arc::new(a.clone()), Arc::new(b)]);
    assert_eq!(
        one,
        fingerprint(&[Arc::new(b2.clone()), Arc::new(a.clone())])
    );
    let mut a2 = a.clone();
    a2.spec.as_mut().unwrap().provider_id = Some("aws:///z/i-1".into());
    assert_ne!(one, fingerprint(&[Arc::new(a2), Arc::new(b2)]));
}

#[tokio::test]
async fn writes_iam_denies_are_refused_up_front_and_the_rest_is_routed() {
    use crate::provider::permissions::Action;
    let fake = cloud(&["rtb-a", "rtb-denied"], &["i-1", "i-2"]);
    fake.deny(Action::CreateRoute, "rtb-denied");
    fake.set_instance_tagging("i-2", crate::provider::permissions::Tagging::LegacyOnly);
    fake.deny(Action::ModifyInstanceAttribute, "i-2");
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let nodes = [
        node("n1", "i-1", &["10.244.1.0/24"]),
        node("n2", "i-2", &["10.244.2.0/24"]),
    ];
    let report = r.reconcile(&nodes).await.unwrap();

    // Nothing IAM denies was sent: no route write to the denied table, no
    // source/destination change (nor routes) for the denied instance.
    for call in fake.mutating_calls() {
        match &call {
            FakeCall::CreateRoute(table, _, _) => {
                assert_eq!(table, "rtb-a", "{call:?}");
            }
            FakeCall::DisableSourceDestCheck(id) => assert_eq!(id, "i-1"),
            other => panic!("unexpected write {other:?}"),
        }
    }
    assert_eq!(
        fake.route_to("rtb-a", "10.244.1.0/24").unwrap().target,
        RouteTarget::Instance("i-1".into()),
        "the allowed table still gets its route"
    );
    assert!(fake.route_to("rtb-denied", "10.244.1.0/24").is_none());
    let refused: Vec<&ChangeFailure> = report
        .failures
        .iter()
        .filter(|f| f.error.is_denied())
        .collect();
    assert!(
        refused
            .iter()
            .any(|f| f.error.operation() == Some("ec2:CreateRoute")
                && f.error.to_string().contains("route-table/rtb-denied")),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(
            |f| f.error.operation() == Some("ec2:ModifyInstanceAttribute")
                && f.error.to_string().contains("instance/i-2")
        ),
        "{refused:?}"
    );
    assert!(
        matches!(report.nodes["n1"], NodeResult::Failed(_)),
        "rtb-denied is missing n1's route"
    );
    assert!(matches!(report.nodes["n2"], NodeResult::Failed(_)));
    assert!(!report.retry_soon(), "a refusal is not retried soon");

    // Granted (tag added, policy widened): the next check allows it.
    fake.allow(Action::CreateRoute, "rtb-denied");
    let report = r.reconcile(&nodes).await.unwrap();
    assert_eq!(
        fake.route_to("rtb-denied", "10.244.1.0/24").unwrap().target,
        RouteTarget::Instance("i-1".into())
    );
    assert_eq!(report.nodes["n1"], NodeResult::Routed);
}

/// A write IAM denies although its DryRun was allowed (the verdict cached,
/// the policy changed since) reaches the report as denied, as a refusal
/// found up front does: the Node gets the same Unauthorized event.
#[tokio::test]
async fn a_write_iam_denies_after_an_allowed_dry_run_is_reported_denied() {
    let fake = cloud(&["rtb-a"], &["i-1"]);
    fake.fail(
        "create",
        "10.244.1.0/24",
        CloudError::new(
            "ec2:CreateRoute",
            ErrorKind::Denied,
            "UnauthorizedOperation: You are not authorized to perform this operation",
        ),
    );
    let mut r = reconciler(&fake, "10.244.0.0/16", 50);
    let report = r
        .reconcile(&[node("n1", "i-1", &["10.244.1.0/24"])])
        .await
        .unwrap();
    assert!(
        fake.mutating_calls()
            .iter()
            .any(|c| matches!(c, FakeCall::CreateRoute(..))),
        "the write was sent"
    );
    assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
    let failure = &report.failures[0];
    assert!(failure.error.is_denied(), "{}", failure.error);
    assert_eq!(
        publish::event_reason(failure),
        EVENT_ROUTE_TABLE_UNAUTHORIZED
    );
    assert!(!report.retry_soon(), "a denial is not retried soon");
    assert!(matches!(report.nodes["n1"], NodeResult::Failed(_)));
}
