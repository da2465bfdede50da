//! Issue 16: writes the least-privilege IAM policy denies are refused up
//! front. IAM is played by the fault proxy: a 403 `UnauthorizedOperation`
//! rule on the DryRun call for one resource, as EC2 answers a DryRun the
//! caller may not make; moto (and the proxy, for route actions moto does not
//! honour DryRun on) answers every other DryRun `DryRunOperation`.

use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use ccm_testkit::aws_proxy::{FaultKind, FaultRule};

use crate::routes::{
    Cloud, WAIT, as_strs, create, events_for, node, nodes_api, route_args, wait_condition,
};
use crate::support::*;

fn denied(action: &str, param: &str, resource: &str) -> FaultRule {
    FaultRule::new(FaultKind::Error {
        status: 403,
        code: "UnauthorizedOperation".into(),
        message: "You are not authorized to perform this operation.".into(),
    })
    .for_service("ec2")
    .for_action(action)
    .dry_run_only()
    .with_param(param, resource)
}

/// Real (not DryRun) calls of `action` naming `resource` in `param`.
fn real_calls(env: &Env, action: &str, param: &str, resource: &str) -> usize {
    env.proxy
        .requests(action)
        .iter()
        .filter(|c| c.params.get(param).map(String::as_str) == Some(resource))
        .filter(|c| c.params.get("DryRun").map(String::as_str) != Some("true"))
        .count()
}

fn dry_runs(env: &Env, action: &str, param: &str, resource: &str) -> usize {
    env.proxy
        .requests(action)
        .iter()
        .filter(|c| c.params.get(param).map(String::as_str) == Some(resource))
        .filter(|c| c.params.get("DryRun").map(String::as_str) == Some("true"))
        .count()
}

#[tokio::test]
async fn route_writes_iam_denies_are_refused_with_an_event_and_other_nodes_are_routed()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb_ok = cloud.route_table(true).await?;
    // A table carrying only the legacy tag: routes go there (the Go CCM's
    // rule), but the policy grants it only with --legacy-cluster-tag.
    let rtb_legacy = cloud
        .ec2
        .create_route_table()
        .vpc_id(&cloud.vpc)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::RouteTable)
                .tags(
                    Tag::builder()
                        .key("KubernetesCluster")
                        .value("ccm-test")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?
        .route_table
        .and_then(|t| t.route_table_id)
        .expect("route table id");
    let ids = cloud.instances(2).await?;
    let (i1, i2) = (&ids[0], &ids[1]);
    // i2 carries only the legacy tag: outside the policy without
    // --legacy-cluster-tag.
    cloud
        .ec2
        .delete_tags()
        .resources(i2)
        .tags(Tag::builder().key("kubernetes.io/cluster/ccm-test").build())
        .send()
        .await?;
    cloud
        .ec2
        .create_tags()
        .resources(i2)
        .tags(
            Tag::builder()
                .key("KubernetesCluster")
                .value("ccm-test")
                .build(),
        )
        .send()
        .await?;

    env.proxy.record_requests(true);
    env.proxy.set_faults(vec![
        denied("CreateRoute", "RouteTableId", &rtb_legacy),
        denied("ModifyInstanceAttribute", "InstanceId", i2),
    ]);
    let api = nodes_api(&env).await?;
    create(&api, node("n1", Some(i1), &["10.244.1.0/24"])).await?;
    create(&api, node("n2", Some(i2), &["10.244.2.0/24"])).await?;
    let ccm = env.start_ccm(&as_strs(&route_args(&[]))).await?;

    // n1 is routed in the table IAM allows.
    eventually("n1's route in the allowed table", WAIT, || async {
        let r = cloud.routes(&rtb_ok).await.ok()?;
        (r.get("10.244.1.0/24") == Some(i1)).then_some(())
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(cloud.source_dest_check(i1).await?, Some(false));

    // The refusals: Warning events on the nodes naming the tag and the fix.
    let table_event = eventually("RouteTableUnauthorized on n1", WAIT, || async {
        events_for(&env, "n1", "RouteTableUnauthorized").await.pop()
    })
    .await
    .map_err(|e| e.context(ccm.logs()))?;
    let note = table_event.note.unwrap_or_default();
    for needle in [
        rtb_legacy.as_str(),
        "ec2:CreateRoute",
        "only the legacy KubernetesCluster tag",
        "kubernetes.io/cluster/ccm-test",
        "--legacy-cluster-tag",
    ] {
        assert!(note.contains(needle), "{needle} in {note}");
    }
    let instance_event = eventually("InstanceUnauthorized on n2", WAIT, || async {
        events_for(&env, "n2", "InstanceUnauthorized").await.pop()
    })
    .await?;
    let note = instance_event.note.unwrap_or_default();
    assert!(note.contains(&format!("instance/{i2}")), "{note}");
    assert!(note.contains("ec2:ModifyInstanceAttribute"), "{note}");
    assert!(note.contains("kubernetes.io/cluster/ccm-test"), "{note}");
    assert!(note.contains("--legacy-cluster-tag"), "{note}");
    wait_condition(&api, "n2", "True", "NoRouteCreated").await?;
    let logs = ccm.logs();
    assert!(
        logs.contains("route change failed") && logs.contains(&rtb_legacy),
        "a log line names the table: {logs}"
    );

    // Zero denied calls: the DryRun asked, the write was never sent.
    assert!(dry_runs(&env, "CreateRoute", "RouteTableId", &rtb_legacy) >= 1);
    assert_eq!(
        real_calls(&env, "CreateRoute", "RouteTableId", &rtb_legacy),
        0
    );
    assert!(dry_runs(&env, "ModifyInstanceAttribute", "InstanceId", i2) >= 1);
    assert_eq!(
        real_calls(&env, "ModifyInstanceAttribute", "InstanceId", i2),
        0
    );
    let legacy_routes = cloud.routes(&rtb_legacy).await?;
    assert!(
        !legacy_routes.contains_key("10.244.1.0/24"),
        "moto never saw a route write to the denied table"
    );
    assert_eq!(cloud.source_dest_check(i2).await?, Some(true));
    env.finish().await
}

#[tokio::test]
async fn the_start_up_self_check_logs_and_events_each_denial() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let rtb_ok = cloud.route_table(true).await?;
    let rtb_denied = cloud.route_table(true).await?;
    cloud.instances(1).await?;
    env.proxy.record_requests(true);
    env.proxy
        .set_faults(vec![denied("CreateRoute", "RouteTableId", &rtb_denied)]);
    let mut args = env.base_args();
    args.extend(route_args(&[]));
    let mut vars = env.aws_env();
    vars.push(("POD_NAME".into(), "ccm-test-pod".into()));
    vars.push(("POD_NAMESPACE".into(), "kube-system".into()));
    let ccm = Ccm::spawn(&args, &vars).await?;

    let problems = self_check_problems(&ccm, WAIT)
        .await
        .map_err(|e| e.context(ccm.logs()))?;
    assert_eq!(problems, 1, "the one denied table: {}", ccm.logs());
    let logs = ccm.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("permission self-check: IAM denies"))
        .unwrap_or_else(|| panic!("a denial line in {logs}"));
    // moto's account is 123456789012; the region comes from cloud.conf.
    let arn = format!("arn:aws:ec2:us-east-1:123456789012:route-table/{rtb_denied}");
    for needle in [
        "ec2:CreateRoute",
        arn.as_str(),
        "kubernetes.io/cluster/ccm-test",
    ] {
        assert!(line.contains(needle), "{needle} in {line}");
    }
    assert!(!logs.contains(&format!("route-table/{rtb_ok}")), "{logs}");
    let event = eventually("PermissionDenied on the CCM's Pod", WAIT, || async {
        events_for(&env, "ccm-test-pod", "PermissionDenied")
            .await
            .pop()
    })
    .await?;
    let regarding = event.regarding.unwrap_or_default();
    assert_eq!(regarding.kind.as_deref(), Some("Pod"));
    assert_eq!(regarding.namespace.as_deref(), Some("kube-system"));
    assert!(event.note.unwrap_or_default().contains(&arn));
    // No route write ever went to the denied table (the route controller
    // may ask once itself if it reconciles before the self-check answers).
    assert_eq!(
        real_calls(&env, "CreateRoute", "RouteTableId", &rtb_denied),
        0
    );
    assert!((1..=2).contains(&dry_runs(&env, "CreateRoute", "RouteTableId", &rtb_denied)));
    env.finish().await
}
