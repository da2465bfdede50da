//! The proxy as harsh as AWS can be: answers lost after the call was
//! applied, eventual consistency, seeded randomness that replays, and the
//! quotas moto leaves out.

use super::*;

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange};
use ccm_testkit::aws_proxy::AnswerLoss;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

async fn groups_named(client: &aws_sdk_ec2::Client, name: &str) -> Vec<String> {
    client
        .describe_security_groups()
        .filters(Filter::builder().name("group-name").values(name).build())
        .send()
        .await
        .expect("describe security groups")
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_lost_answer_leaves_the_call_applied_and_a_retry_sees_a_duplicate() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::AnswerLost(AnswerLoss::Reset))
            .for_action("CreateSecurityGroup")
            .at_most(1),
    ]);
    let name = unique("lost");
    let err = ec2(&endpoint, no_retries())
        .await
        .create_security_group()
        .group_name(&name)
        .description("lost answer")
        .send()
        .await
        .expect_err("the answer is lost");
    let SdkError::DispatchFailure(dispatch) = &err else {
        panic!("expected a dispatch failure, got {err:?}");
    };
    assert!(dispatch.is_io(), "expected an I/O error, got {dispatch:?}");
    let client = ec2(&endpoint, no_retries()).await;
    assert_eq!(
        groups_named(&client, &name).await.len(),
        1,
        "AWS applied it"
    );
    let counts = proxy.calls().get("ec2", "CreateSecurityGroup");
    assert_eq!((counts.faulted, counts.forwarded), (1, 1));

    // The SDK retries a dispatch failure: the retry meets the group the lost
    // call made, exactly as on AWS.
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::AnswerLost(AnswerLoss::Reset))
            .for_action("CreateSecurityGroup")
            .at_most(1),
    ]);
    let again = unique("lost");
    let err = ec2(&endpoint, standard_retries(3))
        .await
        .create_security_group()
        .group_name(&again)
        .description("lost answer")
        .send()
        .await
        .expect_err("the retry finds a duplicate");
    assert_eq!(err.code(), Some("InvalidGroup.Duplicate"), "{err:?}");
    assert_eq!(
        groups_named(&client, &again).await.len(),
        1,
        "one group, not two"
    );
}

#[tokio::test]
async fn a_stalled_answer_is_a_timeout_after_the_call_was_applied() {
    let proxy = proxy(ProxyConfig::default()).await;
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::AnswerLost(AnswerLoss::Stall(
            Duration::from_secs(30),
        )))
        .for_action("CreateSecurityGroup"),
    ]);
    let shared = test_sdk_config(&proxy.endpoint()).await;
    let client = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&shared)
            .retry_config(no_retries())
            .timeout_config(
                aws_config::timeout::TimeoutConfig::builder()
                    .operation_attempt_timeout(Duration::from_millis(300))
                    .build(),
            )
            .build(),
    );
    let name = unique("stall");
    let err = client
        .create_security_group()
        .group_name(&name)
        .description("stalled answer")
        .send()
        .await
        .expect_err("the client gives up");
    assert!(matches!(err, SdkError::TimeoutError(_)), "{err:?}");
    // The caller hung up; AWS goes on with the call all the same. It may
    // still be applying it when the timeout fires, so wait on the outcome.
    let reader = ec2(&proxy.endpoint(), no_retries()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut found = groups_named(&reader, &name).await;
    while found.is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        found = groups_named(&reader, &name).await;
    }
    assert_eq!(found.len(), 1, "AWS applied it although the caller hung up");
}

#[tokio::test]
async fn a_new_group_is_not_found_until_its_consistency_window_ends() {
    let proxy = proxy(ProxyConfig {
        consistency_delay: Duration::from_secs(5),
        ..ProxyConfig::default()
    })
    .await;
    let clock = proxy.use_manual_clock();
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    let name = unique("ec");
    let id = client
        .create_security_group()
        .group_name(&name)
        .description("eventually consistent")
        .send()
        .await
        .expect("created")
        .group_id()
        .map(str::to_owned)
        .expect("a group id");
    let rule = IpPermission::builder()
        .ip_protocol("tcp")
        .from_port(80)
        .to_port(80)
        .ip_ranges(IpRange::builder().cidr_ip("10.0.0.0/8").build())
        .build();
    let err = client
        .authorize_security_group_ingress()
        .group_id(&id)
        .ip_permissions(rule.clone())
        .send()
        .await
        .expect_err("not visible yet");
    assert_eq!(err.code(), Some("InvalidGroup.NotFound"), "{err:?}");
    assert_eq!(
        err.message(),
        Some(format!("The security group '{id}' does not exist").as_str())
    );
    let err = client
        .describe_security_groups()
        .group_ids(&id)
        .send()
        .await
        .expect_err("not visible by id");
    assert_eq!(err.code(), Some("InvalidGroup.NotFound"));
    assert!(
        groups_named(&client, &name).await.is_empty(),
        "left out of lists"
    );

    clock.advance(Duration::from_secs(5));
    client
        .authorize_security_group_ingress()
        .group_id(&id)
        .ip_permissions(rule)
        .send()
        .await
        .expect("visible after the window");
    assert_eq!(groups_named(&client, &name).await, vec![id]);
}

#[tokio::test]
async fn new_load_balancers_and_target_groups_are_not_found_in_their_window() {
    let proxy = proxy(ProxyConfig {
        consistency_delay: Duration::from_secs(5),
        ..ProxyConfig::default()
    })
    .await;
    let clock = proxy.use_manual_clock();
    let v2 = elbv2(&proxy.endpoint(), no_retries()).await;
    let vpc = ec2(&proxy.endpoint(), no_retries())
        .await
        .describe_vpcs()
        .send()
        .await
        .expect("vpcs")
        .vpcs()
        .first()
        .and_then(|v| v.vpc_id().map(str::to_owned))
        .expect("moto's default VPC");
    let tg_name = unique("tg")[..20].to_owned();
    let arn = v2
        .create_target_group()
        .name(&tg_name)
        .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
        .port(30080)
        .vpc_id(&vpc)
        .send()
        .await
        .expect("created")
        .target_groups()
        .first()
        .and_then(|t| t.target_group_arn().map(str::to_owned))
        .expect("an ARN");
    let err = v2
        .describe_target_groups()
        .target_group_arns(&arn)
        .send()
        .await
        .expect_err("not visible yet");
    assert_eq!(err.code(), Some("TargetGroupNotFound"), "{err:?}");
    let listed = v2
        .describe_target_groups()
        .send()
        .await
        .expect("list")
        .target_groups()
        .iter()
        .any(|t| t.target_group_arn() == Some(arn.as_str()));
    assert!(!listed, "left out of the list");

    let classic = elb(&proxy.endpoint(), no_retries()).await;
    let lb_name = unique("clb")[..24].to_owned();
    classic
        .create_load_balancer()
        .load_balancer_name(&lb_name)
        .availability_zones("us-east-1a")
        .listeners(
            aws_sdk_elasticloadbalancing::types::Listener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_protocol("TCP")
                .instance_port(30080)
                .build()
                .expect("listener"),
        )
        .send()
        .await
        .expect("created");
    let err = classic
        .describe_load_balancers()
        .load_balancer_names(&lb_name)
        .send()
        .await
        .expect_err("not visible yet");
    assert_eq!(err.code(), Some("LoadBalancerNotFound"), "{err:?}");

    clock.advance(Duration::from_secs(5));
    v2.describe_target_groups()
        .target_group_arns(&arn)
        .send()
        .await
        .expect("visible after the window");
    classic
        .describe_load_balancers()
        .load_balancer_names(&lb_name)
        .send()
        .await
        .expect("visible after the window");
}

/// Which of `calls` sequential DescribeVpcs calls a 50 % fault hit.
async fn fault_pattern(proxy: &FaultProxy, calls: usize) -> Vec<bool> {
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    let mut hits = Vec::with_capacity(calls);
    for _ in 0..calls {
        hits.push(client.describe_vpcs().send().await.is_err());
    }
    hits
}

#[tokio::test]
async fn one_seed_replays_the_same_faults() {
    let rule = || {
        vec![
            FaultRule::new(FaultKind::ServerError(500))
                .for_action("DescribeVpcs")
                .with_probability(0.5),
        ]
    };
    let first = proxy(ProxyConfig {
        seed: Some(42),
        faults: rule(),
        ..ProxyConfig::default()
    })
    .await;
    assert_eq!(first.seed(), 42);
    let pattern = fault_pattern(&first, 32).await;
    assert!(
        pattern.contains(&true) && pattern.contains(&false),
        "{pattern:?}"
    );

    let second = proxy(ProxyConfig {
        seed: Some(42),
        faults: rule(),
        ..ProxyConfig::default()
    })
    .await;
    assert_eq!(
        fault_pattern(&second, 32).await,
        pattern,
        "same seed, same run"
    );
    second.reseed(43);
    assert_ne!(fault_pattern(&second, 32).await, pattern, "another seed");

    // Without a seed one is chosen, and giving it back replays the run.
    let chosen = proxy(ProxyConfig {
        faults: rule(),
        ..ProxyConfig::default()
    })
    .await;
    let seed = chosen.seed();
    let run = fault_pattern(&chosen, 16).await;
    chosen.reseed(seed);
    assert_eq!(fault_pattern(&chosen, 16).await, run);
}

#[tokio::test]
async fn instance_topology_is_answered_with_the_real_apis_rules() {
    use ccm_testkit::aws_proxy::InstanceTopology;
    let proxy = proxy(ProxyConfig::default()).await;
    let entry = |id: &str, kind: &str, nodes: &[&str]| InstanceTopology {
        instance_id: id.into(),
        instance_type: kind.into(),
        availability_zone: "us-east-1a".into(),
        zone_id: "use1-az1".into(),
        group_name: None,
        network_nodes: nodes.iter().map(|n| n.to_string()).collect(),
    };
    proxy.set_instance_topology(vec![
        entry(
            "i-0123456789abcdef0",
            "p4d.24xlarge",
            &["nn-1", "nn-2", "nn-3"],
        ),
        entry("i-0123456789abcdef1", "m5.large", &[]),
    ]);
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    let out = client
        .describe_instance_topology()
        .instance_ids("i-0123456789abcdef0")
        .instance_ids("i-0123456789abcdef1")
        .send()
        .await
        .expect("answered");
    let instances = out.instances();
    assert_eq!(instances.len(), 1, "an unsupported type is not listed");
    assert_eq!(instances[0].instance_id(), Some("i-0123456789abcdef0"));
    assert_eq!(instances[0].network_nodes(), ["nn-1", "nn-2", "nn-3"]);
    assert_eq!(instances[0].zone_id(), Some("use1-az1"));

    let err = client
        .describe_instance_topology()
        .instance_ids("i-0123456789abcdef0")
        .max_results(5)
        .send()
        .await
        .expect_err("MaxResults cannot go with InstanceIds");
    assert_eq!(err.code(), Some("InvalidParameterCombination"));
    let err = client
        .describe_instance_topology()
        .dry_run(true)
        .send()
        .await
        .expect_err("DryRun answers DryRunOperation");
    assert_eq!(err.code(), Some("DryRunOperation"));
}

/// A running instance in moto's default VPC.
async fn instance(client: &aws_sdk_ec2::Client) -> String {
    client
        .run_instances()
        .image_id(ccm_testkit::moto::AMI)
        .min_count(1)
        .max_count(1)
        .send()
        .await
        .expect("an instance")
        .instances()[0]
        .instance_id()
        .expect("an ID")
        .to_owned()
}

/// The first subnet of `vpc`.
async fn first_subnet(ec2c: &aws_sdk_ec2::Client, vpc: &str) -> String {
    ec2c.describe_subnets()
        .filters(Filter::builder().name("vpc-id").values(vpc).build())
        .send()
        .await
        .expect("subnets")
        .subnets()[0]
        .subnet_id()
        .expect("a subnet")
        .to_owned()
}

/// moto's default VPC and a new NLB in its first subnet (its ARN).
async fn nlb_in_default_vpc(
    ec2c: &aws_sdk_ec2::Client,
    v2: &aws_sdk_elasticloadbalancingv2::Client,
) -> (String, String) {
    use aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum;
    let vpc = ec2c
        .describe_vpcs()
        .send()
        .await
        .expect("vpcs")
        .vpcs()
        .first()
        .and_then(|v| v.vpc_id().map(str::to_owned))
        .expect("moto's default VPC");
    let subnet = first_subnet(ec2c, &vpc).await;
    let lb = v2
        .create_load_balancer()
        .name(&unique("nlb")[..24])
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&subnet)
        .send()
        .await
        .expect("an NLB")
        .load_balancers()[0]
        .load_balancer_arn()
        .expect("an ARN")
        .to_owned();
    (vpc, lb)
}

/// A new TCP target group on `port` in `vpc` (its ARN).
async fn tcp_group(v2: &aws_sdk_elasticloadbalancingv2::Client, vpc: &str, port: i32) -> String {
    v2.create_target_group()
        .name(&unique("tg")[..24])
        .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
        .port(port)
        .vpc_id(vpc)
        .send()
        .await
        .expect("a target group")
        .target_groups()[0]
        .target_group_arn()
        .expect("an ARN")
        .to_owned()
}

#[tokio::test]
async fn register_targets_is_refused_over_the_targets_per_load_balancer_quota() {
    use aws_sdk_elasticloadbalancingv2::types::{
        Action, ActionTypeEnum, ProtocolEnum, TargetDescription,
    };
    let proxy = proxy(ProxyConfig::default()).await;
    let ec2c = ec2(&proxy.endpoint(), no_retries()).await;
    let v2 = elbv2(&proxy.endpoint(), no_retries()).await;
    let (vpc, lb) = nlb_in_default_vpc(&ec2c, &v2).await;
    let group = |port: i32| tcp_group(&v2, &vpc, port);
    let listen = |port: i32, tg: String| {
        let v2 = v2.clone();
        let lb = lb.clone();
        async move {
            v2.create_listener()
                .load_balancer_arn(lb)
                .protocol(ProtocolEnum::Tcp)
                .port(port)
                .default_actions(
                    Action::builder()
                        .r#type(ActionTypeEnum::Forward)
                        .target_group_arn(tg)
                        .build(),
                )
                .send()
                .await
                .expect("a listener");
        }
    };
    let register = |tg: &str, ids: &[&String]| {
        let mut req = v2.register_targets().target_group_arn(tg);
        for id in ids {
            req = req.targets(TargetDescription::builder().id(id.as_str()).build());
        }
        req.send()
    };
    let held = |tg: String| {
        let v2 = v2.clone();
        async move {
            let out = v2
                .describe_target_health()
                .target_group_arn(tg)
                .send()
                .await
                .expect("target health");
            let mut ids: Vec<String> = out
                .target_health_descriptions()
                .iter()
                .filter_map(|d| d.target().and_then(|t| t.id()).map(str::to_owned))
                .collect();
            ids.sort();
            ids
        }
    };
    let a = group(30080).await;
    listen(80, a.clone()).await;
    let (i1, i2, i3) = (
        instance(&ec2c).await,
        instance(&ec2c).await,
        instance(&ec2c).await,
    );
    proxy.set_targets_per_load_balancer(Some(2));

    register(&a, &[&i1, &i2]).await.expect("two fit");
    let err = register(&a, &[&i3]).await.expect_err("a third does not");
    assert_eq!(err.code(), Some("TooManyTargets"), "{err:?}");
    assert_eq!(status(&err), 400);
    let mut both = vec![i1.clone(), i2.clone()];
    both.sort();
    assert_eq!(
        held(a.clone()).await,
        both,
        "the refused call changed nothing"
    );
    register(&a, &[&i2])
        .await
        .expect("a target held already adds nothing");
    let counts = proxy
        .calls()
        .get("elasticloadbalancingv2", "RegisterTargets");
    assert_eq!(
        (counts.received, counts.faulted, counts.forwarded),
        (3, 1, 2)
    );

    // The quota counts the load balancer's groups together: a second group
    // behind another listener finds it full.
    let b = group(30081).await;
    listen(81, b.clone()).await;
    let err = register(&b, &[&i1]).await.expect_err("the NLB is full");
    assert_eq!(err.code(), Some("TooManyTargets"), "{err:?}");

    // Deregistering makes room.
    v2.deregister_targets()
        .target_group_arn(&a)
        .targets(TargetDescription::builder().id(&i1).build())
        .send()
        .await
        .expect("deregistered");
    register(&a, &[&i3]).await.expect("room again");

    // A group no load balancer uses is counted alone.
    let lone = group(30082).await;
    register(&lone, &[&i1, &i2]).await.expect("two fit");
    let err = register(&lone, &[&i3]).await.expect_err("a third does not");
    assert!(
        err.message()
            .unwrap_or_default()
            .contains("per target group"),
        "{err:?}"
    );

    proxy.set_targets_per_load_balancer(None);
    register(&lone, &[&i3]).await.expect("no quota, no refusal");
}

#[tokio::test]
async fn target_group_links_follow_the_listeners_as_on_aws() {
    use aws_sdk_elasticloadbalancingv2::types::{Action, ActionTypeEnum, ProtocolEnum};
    let proxy = proxy(ProxyConfig::default()).await;
    let ec2c = ec2(&proxy.endpoint(), no_retries()).await;
    let v2 = elbv2(&proxy.endpoint(), no_retries()).await;
    // moto itself, to show the leniency the proxy takes away.
    let moto = elbv2(&shared_moto_endpoint(), no_retries()).await;
    let (vpc, lb) = nlb_in_default_vpc(&ec2c, &v2).await;
    let group = || tcp_group(&v2, &vpc, 30080);
    let forward = |tg: &str| {
        Action::builder()
            .r#type(ActionTypeEnum::Forward)
            .target_group_arn(tg)
            .build()
    };
    // The load balancers each of `groups` names, as `client` answers.
    let links = |client: aws_sdk_elasticloadbalancingv2::Client, groups: Vec<String>| async move {
        let out = client
            .describe_target_groups()
            .set_target_group_arns(Some(groups.clone()))
            .send()
            .await
            .expect("the groups");
        groups
            .iter()
            .map(|g| {
                out.target_groups()
                    .iter()
                    .find(|t| t.target_group_arn() == Some(g.as_str()))
                    .map(|t| t.load_balancer_arns().to_vec())
                    .expect("listed")
            })
            .collect::<Vec<_>>()
    };
    // The groups listed under the load balancer, or the error code.
    let behind = |client: aws_sdk_elasticloadbalancingv2::Client, lb: String| async move {
        match client
            .describe_target_groups()
            .load_balancer_arn(lb)
            .send()
            .await
        {
            Ok(out) => Ok(out
                .target_groups()
                .iter()
                .filter_map(|t| t.target_group_arn().map(str::to_owned))
                .collect::<Vec<_>>()),
            Err(e) => Err(e.code().unwrap_or_default().to_owned()),
        }
    };
    let in_full_listing = |client: aws_sdk_elasticloadbalancingv2::Client, tg: String| async move {
        client
            .describe_target_groups()
            .send()
            .await
            .expect("the listing")
            .target_groups()
            .iter()
            .find(|t| t.target_group_arn() == Some(tg.as_str()))
            .map(|t| t.load_balancer_arns().to_vec())
            .expect("listed")
    };

    let (a, b) = (group().await, group().await);
    let listener = v2
        .create_listener()
        .load_balancer_arn(&lb)
        .protocol(ProtocolEnum::Tcp)
        .port(80)
        .default_actions(forward(&a))
        .send()
        .await
        .expect("a listener")
        .listeners()[0]
        .listener_arn()
        .expect("an ARN")
        .to_owned();
    let lb_only = vec![lb.clone()];
    assert_eq!(
        links(v2.clone(), vec![a.clone(), b.clone()]).await,
        [lb_only.clone(), vec![]]
    );
    assert_eq!(behind(v2.clone(), lb.clone()).await, Ok(vec![a.clone()]));

    // The listener moves to b: on AWS the links move with it.
    v2.modify_listener()
        .listener_arn(&listener)
        .default_actions(forward(&b))
        .send()
        .await
        .expect("moved");
    assert_eq!(
        links(moto.clone(), vec![a.clone(), b.clone()]).await,
        [lb_only.clone(), vec![]],
        "moto keeps the old link and makes no new one (else this test shows nothing)"
    );
    assert_eq!(
        behind(moto.clone(), lb.clone()).await,
        Ok(vec![a.clone()]),
        "moto lists the group no listener uses"
    );
    assert_eq!(
        links(v2.clone(), vec![a.clone(), b.clone()]).await,
        [vec![], lb_only.clone()]
    );
    assert_eq!(behind(v2.clone(), lb.clone()).await, Ok(vec![b.clone()]));
    assert_eq!(
        in_full_listing(v2.clone(), a.clone()).await,
        Vec::<String>::new()
    );
    assert_eq!(in_full_listing(v2.clone(), b.clone()).await, lb_only);

    // No listener left: no group is behind the load balancer.
    v2.delete_listener()
        .listener_arn(&listener)
        .send()
        .await
        .expect("deleted");
    assert_eq!(
        links(v2.clone(), vec![a.clone(), b.clone()]).await,
        [Vec::<String>::new(), vec![]]
    );
    assert_eq!(
        behind(v2.clone(), lb.clone()).await,
        Err("TargetGroupNotFound".to_owned())
    );
    assert_eq!(
        behind(
            v2.clone(),
            "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/none/0"
                .to_owned()
        )
        .await,
        Err("LoadBalancerNotFound".to_owned()),
        "an unknown load balancer is moto's own answer"
    );
    // The proxy's own reads are not the caller's calls.
    let counts = proxy.calls();
    assert_eq!(
        counts
            .get("elasticloadbalancingv2", "DescribeListeners")
            .received,
        0
    );
    assert_eq!(
        counts
            .get("elasticloadbalancingv2", "DescribeTargetGroups")
            .received,
        9
    );
    for g in [&a, &b] {
        v2.delete_target_group()
            .target_group_arn(g)
            .send()
            .await
            .expect("deleted");
    }
    v2.delete_load_balancer()
        .load_balancer_arn(&lb)
        .send()
        .await
        .expect("deleted");
}

/// ELBv2 gives security groups only to an NLB made with some; moto takes
/// them for any. The proxy refuses the first as AWS does, counted as
/// faulted, and passes the second.
#[tokio::test]
async fn set_security_groups_is_refused_on_an_nlb_made_without_groups() {
    use aws_sdk_elasticloadbalancingv2::types::LoadBalancerTypeEnum;
    let proxy = proxy(ProxyConfig::default()).await;
    let ec2c = ec2(&proxy.endpoint(), no_retries()).await;
    let v2 = elbv2(&proxy.endpoint(), no_retries()).await;
    let (vpc, bare) = nlb_in_default_vpc(&ec2c, &v2).await;
    let group = |name: String| {
        let ec2c = ec2c.clone();
        let vpc = vpc.clone();
        async move {
            ec2c.create_security_group()
                .group_name(name)
                .description("test")
                .vpc_id(vpc)
                .send()
                .await
                .expect("a group")
                .group_id()
                .expect("an ID")
                .to_owned()
        }
    };
    let sg = group(unique("sg")).await;
    let refused = v2
        .set_security_groups()
        .load_balancer_arn(&bare)
        .security_groups(&sg)
        .send()
        .await
        .expect_err("an NLB made without groups takes none");
    assert_eq!(
        refused.as_service_error().and_then(|e| e.code()),
        Some("InvalidConfigurationRequest")
    );
    let groups_of = |arn: String| {
        let v2 = v2.clone();
        async move {
            v2.describe_load_balancers()
                .load_balancer_arns(arn)
                .send()
                .await
                .expect("the NLB")
                .load_balancers()[0]
                .security_groups()
                .to_vec()
        }
    };
    assert!(groups_of(bare.clone()).await.is_empty(), "nothing was set");
    // Made with a group: its groups can be changed.
    let subnet = first_subnet(&ec2c, &vpc).await;
    let with = v2
        .create_load_balancer()
        .name(&unique("nlb")[..24])
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&subnet)
        .security_groups(&sg)
        .send()
        .await
        .expect("an NLB with a group")
        .load_balancers()[0]
        .load_balancer_arn()
        .expect("an ARN")
        .to_owned();
    let other = group(unique("sg")).await;
    v2.set_security_groups()
        .load_balancer_arn(&with)
        .security_groups(&sg)
        .security_groups(&other)
        .send()
        .await
        .expect("an NLB made with a group takes others");
    assert_eq!(groups_of(with).await.len(), 2);
    let calls = proxy
        .calls()
        .get("elasticloadbalancingv2", "SetSecurityGroups");
    assert_eq!((calls.received, calls.faulted), (2, 1));
}
