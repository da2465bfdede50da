//! Integration tests of the AWS client layer against moto, through the fault
//! proxy that enforces AWS's documented token buckets and injects faults.
//!
//! Every test keeps its AWS volume bounded and deterministic (fixed call
//! counts, fixed request mix) and ends by checking that every action the
//! proxy saw is in the operation table.

#[path = "aws_client/support.rs"]
mod support;

use std::time::Duration;

use aws_ccm::aws::instances::describe_xml::{SlimDecoder, Slot};
use aws_ccm::aws::instances::plan::Interner;
use aws_ccm::aws::instances::{Ec2Instance, filter};
use aws_ccm::aws::{
    AwsError, AwsSettings, CallOptions, Category, ClientOptions, ErrorClass, InstanceSettings,
    Operation,
};
use ccm_testkit::aws_proxy::{FaultKind, FaultRule, ProxyConfig};
use support::{CLUSTER_ID, World, ec2_read, mixed_workload, quick_retry};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_instance_lookups_cost_a_handful_of_calls() {
    let world = World::start(ProxyConfig::default()).await;
    let seeded = world.seed_instances(499).await;
    let aws = world.client(ClientOptions::default()).await;

    let mut ids: Vec<String> = seeded.iter().map(|s| s.id.clone()).collect();
    ids.push("i-0123456789abcdef0".to_string()); // unknown to moto
    let lookups = ids.iter().map(|id| {
        let aws = aws.clone();
        async move { (id.clone(), aws.instance_by_id(id).await) }
    });
    let results = futures::future::join_all(lookups).await;

    for (id, result) in &results {
        if id == "i-0123456789abcdef0" {
            let err = result.as_ref().expect_err("unknown ID");
            assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
        } else {
            let instance = result.as_ref().unwrap_or_else(|err| panic!("{id}: {err}"));
            assert_eq!(&instance.id, id, "each caller gets its own instance");
            assert!(instance.is_in_cluster(support::CLUSTER_ID));
        }
    }
    let calls = world.proxy.calls().get("ec2", "DescribeInstances");
    assert!(
        (1..=3).contains(&calls.received),
        "500 lookups took {} DescribeInstances calls",
        calls.received
    );
    world.assert_every_action_is_in_the_table();
}

/// Instances the sweep test seeds: one RunInstances batch (the sharing is
/// under test, not the size).
const INSTANCES: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_sweep_is_one_paginated_read_shared_by_concurrent_callers() {
    let world = World::start(ProxyConfig::default()).await;
    world.seed_instances(INSTANCES).await;
    let aws = world
        .client_with(
            // The test is about sharing, not timeouts: moto's answer for
            // every instance slows with the machine's load, and a call cut
            // at the default 30 s would be retried (seen: 300 s and killed
            // with both cores busy).
            ClientOptions {
                call_timeout: Duration::from_secs(240),
                ..ClientOptions::default()
            },
            AwsSettings {
                instances: InstanceSettings {
                    legacy_cluster_tag: false,
                    ..InstanceSettings::default()
                },
                ..AwsSettings::default()
            },
        )
        .await;

    let sweeps = futures::future::join_all((0..100).map(|_| aws.cluster_instances())).await;
    for sweep in sweeps {
        assert_eq!(sweep.expect("sweep").len(), INSTANCES);
    }
    // One call for 100 callers (moto ignores MaxResults when filters are
    // given and answers in one page whatever the count, so more instances
    // would only slow moto; the unit tests check pagination against a stub
    // that honours it).
    let calls = world.proxy.calls().get("ec2", "DescribeInstances").received;
    assert_eq!(
        calls, 1,
        "DescribeInstances calls for 100 concurrent sweeps"
    );
    world.assert_every_action_is_in_the_table();

    // The sweep's slim decoder reads moto's pages as the SDK's model
    // converts them.
    let sweep = aws.cluster_instances().await.expect("sweep");
    let ec2 = world.direct_ec2().await;
    let request = || {
        ec2.describe_instances().filters(filter(
            "tag-key",
            [format!("kubernetes.io/cluster/{CLUSTER_ID}")],
        ))
    };
    let plain = request().send().await.expect("DescribeInstances");
    let mut want: Vec<Ec2Instance> = (plain.reservations().iter())
        .flat_map(|r| r.instances())
        .filter_map(|i| Ec2Instance::from_sdk(i, &mut Interner::default()))
        .collect();
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(want.len(), INSTANCES);
    assert_eq!(*sweep, want);
    let slot = Slot::default();
    request()
        .customize()
        .interceptor(SlimDecoder::new(slot.clone()))
        .send()
        .await
        .expect("DescribeInstances");
    let mut decoded = slot
        .take()
        .expect("the slim decoder read moto's page")
        .instances;
    decoded.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(decoded, want);
}

/// The default budget (half of AWS's) never draws a throttling error from a
/// proxy enforcing AWS's full buckets: the client waits instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_budget_is_never_throttled_by_full_aws_buckets() {
    let world = World::start(ProxyConfig {
        budget_fraction: Some(1.0),
        ..ProxyConfig::default()
    })
    .await;
    let seeded = world.seed_instances(400).await;
    let aws = world.client(ClientOptions::default()).await;

    let report = mixed_workload(&aws, &seeded, 2000).await;

    assert!(
        report.errors.is_empty(),
        "errors reached callers: {:?}",
        &report.errors[..report.errors.len().min(5)]
    );
    let calls = world.proxy.calls();
    assert_eq!(
        calls.throttled_total(),
        0,
        "throttled at the proxy: {:?}",
        calls.to_json()
    );
    assert!(calls.total_forwarded() > 100, "the workload reached AWS");
    world.assert_every_action_is_in_the_table();
}

/// With the proxy at half of AWS's budget and the client believing it has
/// all of it, AWS throttles; the client retries, halves its rate, and every
/// call still completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_retried_and_the_rate_adapts() {
    let world = World::start(ProxyConfig {
        budget_fraction: Some(0.5),
        ..ProxyConfig::default()
    })
    .await;
    let aws = world
        .client(quick_retry(ClientOptions {
            budget_fraction: 1.0,
            max_attempts: 10,
            ..ClientOptions::default()
        }))
        .await;
    let ceiling = aws.current_rate(Category::Ec2NonMutating);

    // Watch the adaptive rate, and its gauge, while the calls run.
    let sampler = {
        let aws = aws.clone();
        tokio::spawn(async move {
            let mut lowest = f64::MAX;
            let mut lowest_gauge = f64::MAX;
            loop {
                lowest = lowest.min(aws.current_rate(Category::Ec2NonMutating));
                if let Some(gauge) = rate_gauge(&aws_ccm::metrics::encode(), "ec2_non_mutating") {
                    lowest_gauge = lowest_gauge.min(gauge);
                }
                if lowest < ceiling && lowest_gauge < ceiling {
                    return (lowest, lowest_gauge);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let results = futures::future::join_all((0..200).map(|i| ec2_read(&aws, i))).await;
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(ToString::to_string)
        .collect();
    assert!(
        errors.is_empty(),
        "{} calls failed, e.g. {:?}",
        errors.len(),
        errors.first()
    );

    let calls = world.proxy.calls();
    assert!(
        calls.throttled_total() > 0,
        "the proxy throttled: {:?}",
        calls.to_json()
    );
    let (lowest, lowest_gauge) = tokio::time::timeout(Duration::from_secs(5), sampler)
        .await
        .expect("the rate dropped below the ceiling")
        .expect("sampler");
    assert!(
        lowest_gauge < ceiling * 0.6,
        "the rate gauge dropped: lowest {lowest_gauge}"
    );
    // Halved, give or take the additive recovery between the cut and the
    // sample.
    assert!(
        lowest < ceiling * 0.6,
        "rate halved on throttling: lowest {lowest}, ceiling {ceiling}"
    );
    let metrics = aws_ccm::metrics::encode();
    assert!(
        metrics.contains("cloudprovider_aws_api_throttled_requests_total{operation_name="),
        "throttles are counted"
    );
    world.assert_every_action_is_in_the_table();
}

/// The value of `aws_ccm_api_rate_limit{category="..."}` in a metrics text.
fn rate_gauge(metrics: &str, category: &str) -> Option<f64> {
    let prefix = format!("aws_ccm_api_rate_limit{{category=\"{category}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_at_twenty_percent_are_retried_to_success() {
    let world = World::start(ProxyConfig {
        faults: vec![
            FaultRule::new(FaultKind::ConnectionReset)
                .for_action("DescribeVpcs")
                .with_probability(0.2),
            FaultRule::new(FaultKind::ServerError(503)).with_probability(0.1),
            FaultRule::new(FaultKind::ServerError(500)).with_probability(0.12),
        ],
        // Replayable: a failure names the seed that produced it.
        seed: Some(18),
        ..ProxyConfig::default()
    })
    .await;
    // At most about 37 % of attempts fail (DescribeVpcs); with 20 attempts
    // a call exhausts them with a chance below 1e-8, so the 200 calls all
    // succeed however the concurrent calls draw their faults (the default 8
    // attempts left about a 1 % chance per run).
    let aws = world
        .client(quick_retry(ClientOptions {
            budget_fraction: 1.0,
            max_attempts: 20,
            ..ClientOptions::default()
        }))
        .await;

    let results = futures::future::join_all((0..200).map(|i| ec2_read(&aws, i))).await;
    let errors: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .map(ToString::to_string)
        .collect();
    assert!(
        errors.is_empty(),
        "{} calls failed, e.g. {:?}",
        errors.len(),
        errors.first()
    );
    let calls = world.proxy.calls();
    assert!(
        calls.faulted_total() >= 10,
        "faults were injected: {:?}",
        calls.to_json()
    );
    assert_eq!(
        calls.total_received(),
        200 + calls.faulted_total(),
        "exactly one retry per injected fault"
    );
    let metrics = aws_ccm::metrics::encode();
    assert!(
        metrics.contains("outcome=\"transient\""),
        "transient attempts are counted"
    );
    world.assert_every_action_is_in_the_table();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validation_and_not_found_errors_are_not_retried() {
    let world = World::start(ProxyConfig {
        faults: vec![
            FaultRule::new(FaultKind::Error {
                status: 400,
                code: "InvalidParameterValue".into(),
                message: "Value (x) for parameter y is invalid".into(),
            })
            .for_action("DescribeSubnets")
            .at_most(1),
        ],
        ..ProxyConfig::default()
    })
    .await;
    let aws = world.client(quick_retry(ClientOptions::default())).await;

    let err = aws
        .ec2(Operation::Ec2DescribeSubnets, |ec2| {
            ec2.describe_subnets().send()
        })
        .await
        .expect_err("injected validation error");
    assert_eq!(err.class(), ErrorClass::Fatal);
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert!(
        err.to_string()
            .contains("Value (x) for parameter y is invalid"),
        "{err}"
    );
    assert_eq!(
        world.proxy.calls().get("ec2", "DescribeSubnets").received,
        1
    );

    // A real bad request, answered by moto itself.
    let err = aws
        .ec2(Operation::Ec2CreateRoute, |ec2| {
            ec2.create_route()
                .route_table_id("rtb-0000000000000dead")
                .destination_cidr_block("10.1.0.0/24")
                .instance_id("i-0000000000000dead")
                .send()
        })
        .await
        .expect_err("no such route table");
    assert_eq!(err.class(), ErrorClass::NotFound, "{err}");
    assert_eq!(err.code(), Some("InvalidRouteTableID.NotFound"));
    assert_eq!(world.proxy.calls().get("ec2", "CreateRoute").received, 1);
    world.assert_every_action_is_in_the_table();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_and_call_timeouts_are_honoured() {
    let world = World::start(ProxyConfig {
        faults: vec![
            FaultRule::new(FaultKind::Latency(Duration::from_secs(3)))
                .for_action("DescribeVpcs")
                .at_most(1),
        ],
        ..ProxyConfig::default()
    })
    .await;
    let aws = world
        .client(quick_retry(ClientOptions {
            call_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        }))
        .await;

    // The slow first attempt times out after 500 ms; the retry is fast.
    let start = std::time::Instant::now();
    aws.ec2(Operation::Ec2DescribeVpcs, |ec2| ec2.describe_vpcs().send())
        .await
        .expect("succeeds on the second attempt");
    // The first attempt ended by timing out (the metric says so), not by
    // its 3 s answer; only a lower bound on time.
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert_eq!(world.proxy.calls().get("ec2", "DescribeVpcs").received, 2);
    let metrics = aws_ccm::metrics::encode();
    assert!(
        metrics.contains(
            "aws_ccm_api_calls_total{operation=\"ec2:DescribeVpcs\",outcome=\"timeout\"} 1"
        ),
        "the first attempt timed out:\n{metrics}"
    );

    // Every attempt slow: the caller's 800 ms deadline ends the call.
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Latency(Duration::from_secs(3))).for_action("DescribeVpcs"),
    ]);
    let start = std::time::Instant::now();
    let err = aws
        .call_with(
            Operation::Ec2DescribeVpcs,
            CallOptions::within(Duration::from_millis(800)),
            |ec2: aws_sdk_ec2::Client| ec2.describe_vpcs().send(),
        )
        .await
        .expect_err("deadline");
    let elapsed = start.elapsed();
    assert!(matches!(err, AwsError::DeadlineExceeded { .. }), "{err}");
    // DeadlineExceeded proves the deadline ended it (without one, timed-out
    // attempts would run out as a transient error); only a lower bound.
    assert!(
        elapsed >= Duration::from_millis(700),
        "returned before the deadline: {elapsed:?}"
    );
    world.assert_every_action_is_in_the_table();
}

/// Drives one call of many table operations through the client: the table
/// check at the end then covers the API surface the controllers will use,
/// and the calls show the generic API works for each service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_of_every_service_go_through_the_table() {
    use aws_sdk_ec2::types::{Filter, IpPermission, IpRange};
    use aws_sdk_elasticloadbalancing::types::{Instance as ElbInstance, Listener};
    use aws_sdk_elasticloadbalancingv2::types::{ProtocolEnum, TargetDescription};

    let world = World::start(ProxyConfig::default()).await;
    let seeded = world.seed_instances(2).await;
    let aws = world
        .client(ClientOptions {
            budget_fraction: 1.0,
            ..ClientOptions::default()
        })
        .await;

    let instance = aws.instance_by_id(&seeded[0].id).await.expect("instance");
    let vpc = instance
        .vpc_id
        .as_deref()
        .expect("moto puts instances in the default VPC")
        .to_string();
    let subnet = instance.subnet_id.as_deref().expect("subnet").to_string();
    let zones = aws.zone_ids().await.expect("zones");
    assert!(!zones.is_empty());

    let vpc_filter = Filter::builder().name("vpc-id").values(vpc.clone()).build();
    let tables = aws
        .ec2(Operation::Ec2DescribeRouteTables, |ec2| {
            ec2.describe_route_tables()
                .filters(vpc_filter.clone())
                .send()
        })
        .await
        .expect("route tables");
    let table = tables.route_tables()[0]
        .route_table_id()
        .unwrap_or_default()
        .to_string();
    aws.ec2(Operation::Ec2CreateRoute, |ec2| {
        ec2.create_route()
            .route_table_id(&table)
            .destination_cidr_block("100.64.1.0/24")
            .instance_id(&seeded[0].id)
            .send()
    })
    .await
    .expect("create route");
    aws.ec2(Operation::Ec2ReplaceRoute, |ec2| {
        ec2.replace_route()
            .route_table_id(&table)
            .destination_cidr_block("100.64.1.0/24")
            .instance_id(&seeded[1].id)
            .send()
    })
    .await
    .expect("replace route");
    aws.ec2(Operation::Ec2DeleteRoute, |ec2| {
        ec2.delete_route()
            .route_table_id(&table)
            .destination_cidr_block("100.64.1.0/24")
            .send()
    })
    .await
    .expect("delete route");
    aws.ec2(Operation::Ec2ModifyInstanceAttribute, |ec2| {
        ec2.modify_instance_attribute()
            .instance_id(&seeded[0].id)
            .source_dest_check(
                aws_sdk_ec2::types::AttributeBooleanValue::builder()
                    .value(false)
                    .build(),
            )
            .send()
    })
    .await
    .expect("source/dest check");

    let group = aws
        .ec2(Operation::Ec2CreateSecurityGroup, |ec2| {
            ec2.create_security_group()
                .group_name("k8s-elb-itest")
                .description("itest")
                .vpc_id(&vpc)
                .send()
        })
        .await
        .expect("create security group");
    let group_id = group.group_id().unwrap_or_default().to_string();
    let rule = IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(80)
        .to_port(80)
        .ip_ranges(IpRange::builder().cidr_ip("0.0.0.0/0").build())
        .build();
    aws.ec2(Operation::Ec2AuthorizeSecurityGroupIngress, |ec2| {
        ec2.authorize_security_group_ingress()
            .group_id(&group_id)
            .ip_permissions(rule.clone())
            .send()
    })
    .await
    .expect("authorize");
    let duplicate = aws
        .ec2(Operation::Ec2AuthorizeSecurityGroupIngress, |ec2| {
            ec2.authorize_security_group_ingress()
                .group_id(&group_id)
                .ip_permissions(rule.clone())
                .send()
        })
        .await
        .expect_err("same rule twice");
    assert!(duplicate.is_already_exists(), "{duplicate}");
    aws.ec2(Operation::Ec2RevokeSecurityGroupIngress, |ec2| {
        ec2.revoke_security_group_ingress()
            .group_id(&group_id)
            .ip_permissions(rule.clone())
            .send()
    })
    .await
    .expect("revoke");
    aws.ec2(Operation::Ec2DescribeSecurityGroups, |ec2| {
        ec2.describe_security_groups().group_ids(&group_id).send()
    })
    .await
    .expect("describe security group");
    aws.ec2(Operation::Ec2CreateTags, |ec2| {
        ec2.create_tags()
            .resources(&group_id)
            .tags(
                aws_sdk_ec2::types::Tag::builder()
                    .key("k")
                    .value("v")
                    .build(),
            )
            .send()
    })
    .await
    .expect("tag");
    aws.ec2(Operation::Ec2DeleteTags, |ec2| {
        ec2.delete_tags()
            .resources(&group_id)
            .tags(aws_sdk_ec2::types::Tag::builder().key("k").build())
            .send()
    })
    .await
    .expect("untag");
    aws.ec2(Operation::Ec2DescribeInternetGateways, |ec2| {
        ec2.describe_internet_gateways().send()
    })
    .await
    .expect("internet gateways");
    aws.ec2(Operation::Ec2DescribeAddresses, |ec2| {
        ec2.describe_addresses().send()
    })
    .await
    .expect("addresses");

    // Classic ELB.
    let listener = Listener::builder()
        .protocol("TCP")
        .load_balancer_port(80)
        .instance_protocol("TCP")
        .instance_port(30080)
        .build()
        .expect("listener");
    aws.elb(Operation::ElbCreateLoadBalancer, |elb| {
        elb.create_load_balancer()
            .load_balancer_name("a-itest")
            .listeners(listener.clone())
            .subnets(&subnet)
            .security_groups(&group_id)
            .send()
    })
    .await
    .expect("create classic ELB");
    aws.elb(Operation::ElbRegisterInstancesWithLoadBalancer, |elb| {
        elb.register_instances_with_load_balancer()
            .load_balancer_name("a-itest")
            .instances(ElbInstance::builder().instance_id(&seeded[0].id).build())
            .send()
    })
    .await
    .expect("register instance");
    aws.elb(Operation::ElbDescribeLoadBalancers, |elb| {
        elb.describe_load_balancers()
            .load_balancer_names("a-itest")
            .send()
    })
    .await
    .expect("describe classic ELB");
    aws.elb(Operation::ElbDeleteLoadBalancer, |elb| {
        elb.delete_load_balancer()
            .load_balancer_name("a-itest")
            .send()
    })
    .await
    .expect("delete classic ELB");

    // ELBv2.
    let target_group = aws
        .elbv2(Operation::Elbv2CreateTargetGroup, |elbv2| {
            elbv2
                .create_target_group()
                .name("k8s-itest")
                .protocol(ProtocolEnum::Tcp)
                .port(30080)
                .vpc_id(&vpc)
                .send()
        })
        .await
        .expect("create target group");
    let target_group_arn = target_group.target_groups()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string();
    aws.elbv2(Operation::Elbv2RegisterTargets, |elbv2| {
        elbv2
            .register_targets()
            .target_group_arn(&target_group_arn)
            .targets(
                TargetDescription::builder()
                    .id(&seeded[0].id)
                    .port(30080)
                    .build(),
            )
            .send()
    })
    .await
    .expect("register target");
    aws.elbv2(Operation::Elbv2DescribeTargetHealth, |elbv2| {
        elbv2
            .describe_target_health()
            .target_group_arn(&target_group_arn)
            .send()
    })
    .await
    .expect("target health");
    aws.elbv2(Operation::Elbv2DeleteTargetGroup, |elbv2| {
        elbv2
            .delete_target_group()
            .target_group_arn(&target_group_arn)
            .send()
    })
    .await
    .expect("delete target group");

    // STS.
    aws.sts(Operation::StsGetCallerIdentity, |sts| {
        sts.get_caller_identity().send()
    })
    .await
    .expect("caller identity");

    let seen: Vec<(String, String)> = world
        .proxy
        .calls()
        .iter()
        .map(|(s, a, _)| (s.to_string(), a.to_string()))
        .collect();
    for expected in [
        ("ec2", "ModifyInstanceAttribute"),
        ("elasticloadbalancing", "CreateLoadBalancer"),
        ("elasticloadbalancingv2", "RegisterTargets"),
        ("sts", "GetCallerIdentity"),
    ] {
        assert!(
            seen.iter().any(|(s, a)| s == expected.0 && a == expected.1),
            "{expected:?} not seen at the proxy: {seen:?}"
        );
    }
    world.assert_every_action_is_in_the_table();
}
