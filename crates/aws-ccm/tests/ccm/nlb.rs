//! Network Load Balancers end to end: the real binary against the API test
//! server and moto (elbv2), optionally behind the fault proxy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use crate::service::node;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

#[derive(Clone)]
pub(crate) struct Cloud {
    pub(crate) ec2: aws_sdk_ec2::Client,
    pub(crate) elbv2: elbv2::Client,
    pub(crate) elb: aws_sdk_elasticloadbalancing::Client,
    pub(crate) node_group: String,
    pub(crate) instances: Vec<String>,
    subnet: String,
}

impl Cloud {
    /// The VPC of the node group (and of the seeded subnet).
    pub(crate) async fn vpc_id(&self) -> anyhow::Result<String> {
        let described = (self.ec2.describe_security_groups())
            .group_ids(&self.node_group)
            .send()
            .await?;
        let vpc = (described.security_groups().first()).and_then(|g| g.vpc_id());
        let vpc = vpc.ok_or_else(|| anyhow::anyhow!("the node group has no VPC"))?;
        Ok(vpc.to_string())
    }
}

/// A VPC with one public subnet (10.0.1.0/24), a cluster-tagged node group
/// and `nodes` node instances.
pub(crate) async fn seed(env: &Env, nodes: i32) -> anyhow::Result<Cloud> {
    let seeded = seed_cluster(env, nodes).await?;
    Ok(Cloud {
        elbv2: elbv2::Client::new(&seeded.conf),
        elb: aws_sdk_elasticloadbalancing::Client::new(&seeded.conf),
        ec2: seeded.ec2,
        node_group: seeded.node_group,
        instances: seeded.instances,
        subnet: seeded.subnet,
    })
}

/// Gives the seeded subnet an IPv6 CIDR block (the first /64 of an
/// Amazon-provided /56 on its VPC), as a dual-stack NLB needs on AWS: the
/// proxy refuses one in a subnet without, as ELBv2 does.
async fn with_ipv6(cloud: &Cloud) -> anyhow::Result<()> {
    let vpc = cloud.vpc_id().await?;
    let block = crate::ipv6::give_vpc(&cloud.ec2, &vpc).await?;
    crate::ipv6::give_subnet(&cloud.ec2, &cloud.subnet, &block, 0).await?;
    Ok(())
}

pub(crate) fn nlb_service(name: &str, annotations: serde_json::Value) -> Service {
    let mut a = annotations;
    a["service.beta.kubernetes.io/aws-load-balancer-type"] = "nlb".into();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": a},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

pub(crate) fn hostname(svc: &Service) -> Option<String> {
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

pub(crate) fn lb_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.clone().unwrap();
    format!("a{}", uid.replace('-', ""))[..32].to_string()
}

/// Everything in elbv2 carrying this cluster's tag: (ARN, tags).
pub(crate) async fn cluster_tagged_elbv2(
    c: &elbv2::Client,
) -> anyhow::Result<Vec<(String, std::collections::BTreeMap<String, String>)>> {
    let mut arns: Vec<String> = Vec::new();
    let lbs = c.describe_load_balancers().send().await?;
    arns.extend(
        lbs.load_balancers()
            .iter()
            .filter_map(|l| l.load_balancer_arn().map(str::to_string)),
    );
    let tgs = c.describe_target_groups().send().await?;
    arns.extend(
        tgs.target_groups()
            .iter()
            .filter_map(|g| g.target_group_arn().map(str::to_string)),
    );
    let key = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let mut out = Vec::new();
    for chunk in arns.chunks(20) {
        let t = c
            .describe_tags()
            .set_resource_arns(Some(chunk.to_vec()))
            .send()
            .await?;
        for d in t.tag_descriptions() {
            let tags: std::collections::BTreeMap<String, String> = d
                .tags()
                .iter()
                .map(|t| {
                    (
                        t.key().unwrap_or_default().to_string(),
                        t.value().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            if tags.contains_key(&key) {
                out.push((d.resource_arn().unwrap_or_default().to_string(), tags));
            }
        }
    }
    Ok(out)
}

/// The node group's rules as (protocol, from, cidr, description).
pub(crate) async fn node_rules(
    ec2: &aws_sdk_ec2::Client,
    group: &str,
) -> anyhow::Result<Vec<(String, i32, String, String)>> {
    let out = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    let mut rules = Vec::new();
    for p in out.security_groups()[0].ip_permissions() {
        for r in p.ip_ranges() {
            rules.push((
                p.ip_protocol().unwrap_or_default().to_string(),
                p.from_port().unwrap_or(-1),
                r.cidr_ip().unwrap_or_default().to_string(),
                r.description().unwrap_or_default().to_string(),
            ));
        }
    }
    Ok(rules)
}

/// The node `n0` on the first seeded instance; the API client and the
/// `default` namespace's Services.
pub(crate) async fn node_n0(
    env: &Env,
    cloud: &Cloud,
) -> anyhow::Result<(kube::Client, Api<Service>)> {
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n0", &cloud.instances[0]))
        .await?;
    let services = Api::namespaced(client.clone(), "default");
    Ok((client, services))
}

/// One node (`n0`) and `svc`, then a CCM running the service controller
/// until the Service has its NLB hostname. Returns the Service as created.
pub(crate) async fn one_node_nlb(
    env: &Env,
    cloud: &Cloud,
    svc: &Service,
) -> anyhow::Result<(Service, Ccm)> {
    let (_, services) = node_n0(env, cloud).await?;
    let created = services.create(&PostParams::default(), svc).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the NLB hostname", WAIT, || async {
        services.get(&name).await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    Ok((created, ccm))
}

/// An NLB Service `dns` with these ports.
fn dns_service(ports: serde_json::Value) -> Service {
    let mut svc = nlb_service("dns", serde_json::json!({}));
    svc.spec.as_mut().unwrap().ports = serde_json::from_value(ports).unwrap();
    svc
}

/// The NLB's listeners and target groups as sorted (port, protocol) pairs.
async fn listeners_and_groups(
    cloud: &Cloud,
    svc: &Service,
) -> anyhow::Result<(Vec<(i32, String)>, Vec<(i32, String)>)> {
    let lb = cloud
        .elbv2
        .describe_load_balancers()
        .names(lb_name(svc))
        .send()
        .await?;
    let arn = lb.load_balancers()[0].load_balancer_arn().unwrap();
    let listeners = cloud
        .elbv2
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let ports = port_protocols(
        listeners
            .listeners()
            .iter()
            .map(|l| (l.port(), l.protocol())),
    );
    let tgs = cloud
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let groups = port_protocols(tgs.target_groups().iter().map(|g| (g.port(), g.protocol())));
    Ok((ports, groups))
}

/// Sorted (port, protocol) pairs of listeners or target groups.
fn port_protocols<'a>(
    items: impl Iterator<Item = (Option<i32>, Option<&'a elbv2::types::ProtocolEnum>)>,
) -> Vec<(i32, String)> {
    let mut pairs: Vec<(i32, String)> = items
        .map(|(port, protocol)| (port.unwrap(), protocol.unwrap().as_str().to_string()))
        .collect();
    pairs.sort();
    pairs
}

#[tokio::test]
async fn nlb_lifecycle_creates_target_groups_rules_and_deletes_everything() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 2).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in cloud.instances.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i}"), id))
            .await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &nlb_service(
                "web",
                serde_json::json!({
                    "service.beta.kubernetes.io/load-balancer-source-ranges": "10.0.0.0/8",
                    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=edge",
                    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
                    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes": "proxy_protocol_v2.enabled=true",
                    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold": "4",
                }),
            ),
        )
        .await?;
    let name = lb_name(&svc);
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
        .node_port
        .unwrap();

    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let host = eventually("the NLB hostname in the Service status", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // The NLB: network type, internet-facing, tagged.
    let lbs = cloud
        .elbv2
        .describe_load_balancers()
        .names(&name)
        .send()
        .await?;
    let lb = &lbs.load_balancers()[0];
    assert_eq!(lb.dns_name(), Some(host.as_str()));
    assert_eq!(
        lb.r#type(),
        Some(&elbv2::types::LoadBalancerTypeEnum::Network)
    );
    assert_eq!(
        lb.scheme(),
        Some(&elbv2::types::LoadBalancerSchemeEnum::InternetFacing)
    );
    let lb_arn = lb.load_balancer_arn().unwrap().to_string();
    let attrs = cloud
        .elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(&lb_arn)
        .send()
        .await?;
    assert!(
        attrs
            .attributes()
            .iter()
            .any(|a| a.key() == Some("load_balancing.cross_zone.enabled")
                && a.value() == Some("true")),
        "{attrs:?}"
    );

    // One TCP target group on the node port with upstream's name, both nodes registered.
    let tgs = cloud
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(&lb_arn)
        .send()
        .await?;
    assert_eq!(tgs.target_groups().len(), 1);
    let tg = &tgs.target_groups()[0];
    assert!(
        tg.target_group_name()
            .unwrap()
            .starts_with("k8s-default-web-")
    );
    assert_eq!(tg.port(), Some(node_port));
    assert_eq!(tg.protocol(), Some(&elbv2::types::ProtocolEnum::Tcp));
    assert_eq!(tg.healthy_threshold_count(), Some(4));
    assert_eq!(tg.health_check_interval_seconds(), Some(30));
    let tg_arn = tg.target_group_arn().unwrap().to_string();
    let tg_attrs = cloud
        .elbv2
        .describe_target_group_attributes()
        .target_group_arn(&tg_arn)
        .send()
        .await?;
    assert!(
        tg_attrs
            .attributes()
            .iter()
            .any(|a| a.key() == Some("proxy_protocol_v2.enabled") && a.value() == Some("true"))
    );
    let health = cloud
        .elbv2
        .describe_target_health()
        .target_group_arn(&tg_arn)
        .send()
        .await?;
    let mut registered: Vec<String> = health
        .target_health_descriptions()
        .iter()
        .filter_map(|d| d.target()?.id().map(str::to_string))
        .collect();
    registered.sort();
    let mut want = cloud.instances.clone();
    want.sort();
    assert_eq!(registered, want);

    // Tags on the LB and the target group: ownership, service, additional.
    let tagged = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert_eq!(tagged.len(), 2, "{tagged:?}");
    for (_, t) in &tagged {
        assert_eq!(t["kubernetes.io/service-name"], "default/web");
        assert_eq!(t["team"], "edge");
    }
    let listeners = cloud
        .elbv2
        .describe_listeners()
        .load_balancer_arn(&lb_arn)
        .send()
        .await?;
    assert_eq!(listeners.listeners().len(), 1);
    assert_eq!(listeners.listeners()[0].port(), Some(80));

    // Node rules: client from the source range, health from the subnet, MTU.
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    let client = format!("kubernetes.io/rule/nlb/client={name}");
    let health_desc = format!("kubernetes.io/rule/nlb/health={name}");
    assert!(
        rules.contains(&("tcp".into(), node_port, "10.0.0.0/8".into(), client.clone())),
        "{rules:?}"
    );
    assert!(
        rules.contains(&(
            "tcp".into(),
            node_port,
            "10.0.1.0/24".into(),
            health_desc.clone()
        )),
        "{rules:?}"
    );
    assert!(
        rules.contains(&(
            "icmp".into(),
            3,
            "10.0.0.0/8".into(),
            "kubernetes.io/rule/nlb/mtu".into()
        )),
        "{rules:?}"
    );
    // A rule someone else wrote must survive everything below.
    cloud
        .ec2
        .authorize_security_group_ingress()
        .group_id(&cloud.node_group)
        .ip_permissions(
            aws_sdk_ec2::types::IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(22)
                .to_port(22)
                .ip_ranges(
                    aws_sdk_ec2::types::IpRange::builder()
                        .cidr_ip("1.2.3.4/32")
                        .description("ssh")
                        .build(),
                )
                .build(),
        )
        .send()
        .await?;

    // A fresh process adopts all of it: not one mutating call.
    drop(ccm);
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    ccm.wait_synced(1, WAIT).await?;
    assert_eq!(
        mutations(&proxy),
        BTreeMap::new(),
        "an unchanged NLB Service caused mutations\nlogs:\n{}",
        ccm.logs()
    );

    // One node leaves the backends: only it is deregistered.
    nodes.delete("n1", &DeleteParams::default()).await?;
    let kept = cloud.instances[0].clone();
    eventually("the removed node deregistered", WAIT, || async {
        let h = cloud
            .elbv2
            .describe_target_health()
            .target_group_arn(&tg_arn)
            .send()
            .await
            .ok()?;
        let ids: Vec<String> = h
            .target_health_descriptions()
            .iter()
            .filter(|d| {
                d.target_health().and_then(|t| t.reason())
                    != Some(&elbv2::types::TargetHealthReasonEnum::DeregistrationInProgress)
            })
            .filter_map(|d| d.target()?.id().map(str::to_string))
            .collect();
        (ids == vec![kept.clone()]).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(
        proxy
            .calls()
            .get("elasticloadbalancingv2", "RegisterTargets")
            .received,
        0
    );

    // Delete: nothing with this cluster's tag is left, our rules are revoked.
    services.delete("web", &DeleteParams::default()).await?;
    eventually("the Service gone", WAIT, || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(cluster_tagged_elbv2(&cloud.elbv2).await?.is_empty());
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    assert!(
        rules
            .iter()
            .all(|r| !r.3.starts_with("kubernetes.io/rule/nlb/")),
        "{rules:?}"
    );
    assert!(rules.iter().any(|r| r.3 == "ssh"));
    env.finish().await
}

#[tokio::test]
async fn clb_to_nlb_to_clb_and_internal_toggle_leave_no_orphan() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let (_, services) = node_n0(&env, &cloud).await?;
    let mut svc = nlb_service("web", serde_json::json!({}));
    svc.metadata.annotations = None;
    let svc = services.create(&PostParams::default(), &svc).await?;
    let name = lb_name(&svc);
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());

    let clb_exists = || async {
        cloud
            .elb
            .describe_load_balancers()
            .load_balancer_names(&name)
            .send()
            .await
            .map(|o| !o.load_balancer_descriptions().is_empty())
            .unwrap_or(false)
    };
    let nlb_scheme = || async {
        let o = cloud
            .elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await
            .ok()?;
        o.load_balancers()
            .first()
            .and_then(|l| l.scheme())
            .map(|s| s.as_str().to_string())
    };
    eventually("a classic ELB", WAIT, || async {
        clb_exists().await.then_some(())
    })
    .await
    .map_err(fail)?;

    let patch = |v: serde_json::Value| {
        let services = services.clone();
        async move {
            services
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"metadata": {"annotations": v}})),
                )
                .await
        }
    };
    // CLB → NLB: the NLB appears and the classic ELB (and its group) go.
    patch(serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"})).await?;
    eventually("an NLB replaces the classic ELB", WAIT, || async {
        (nlb_scheme().await.is_some() && !clb_exists().await).then_some(())
    })
    .await
    .map_err(fail)?;
    // Internal toggle: recreated as internal.
    patch(serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}))
        .await?;
    eventually("an internal NLB", WAIT, || async {
        (nlb_scheme().await.as_deref() == Some("internal")).then_some(())
    })
    .await
    .map_err(fail)?;
    let tagged = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert_eq!(tagged.len(), 2, "one NLB and one target group: {tagged:?}");
    // NLB → CLB.
    patch(serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-type": null, "service.beta.kubernetes.io/aws-load-balancer-internal": null})).await?;
    eventually("a classic ELB replaces the NLB", WAIT, || async {
        (nlb_scheme().await.is_none() && clb_exists().await).then_some(())
    })
    .await
    .map_err(fail)?;
    eventually("no NLB target group left", WAIT, || async {
        cluster_tagged_elbv2(&cloud.elbv2)
            .await
            .ok()?
            .is_empty()
            .then_some(())
    })
    .await
    .map_err(fail)?;
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    assert!(
        rules
            .iter()
            .all(|r| !r.3.starts_with("kubernetes.io/rule/nlb/")),
        "{rules:?}"
    );
    env.finish().await
}

/// Registered (not draining) instance IDs of a target group, sorted.
pub(crate) async fn targets_of(c: &elbv2::Client, tg_arn: &str) -> Option<Vec<String>> {
    let h = c
        .describe_target_health()
        .target_group_arn(tg_arn)
        .send()
        .await
        .ok()?;
    let mut ids: Vec<String> = h
        .target_health_descriptions()
        .iter()
        .filter(|d| {
            d.target_health().and_then(|t| t.reason())
                != Some(&elbv2::types::TargetHealthReasonEnum::DeregistrationInProgress)
        })
        .filter_map(|d| d.target()?.id().map(str::to_string))
        .collect();
    ids.sort();
    Some(ids)
}

/// Target group ARNs of every NLB.
pub(crate) async fn all_target_groups(c: &elbv2::Client) -> Vec<String> {
    c.describe_target_groups()
        .send()
        .await
        .map(|o| {
            o.target_groups()
                .iter()
                .filter_map(|g| g.target_group_arn().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn node_churn_across_ten_nlbs_registers_only_the_delta_in_one_call_per_group()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 20).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..10 {
        nodes
            .create(
                &PostParams::default(),
                &node(&format!("n{i}"), &cloud.instances[i]),
            )
            .await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for s in 0..10 {
        services
            .create(
                &PostParams::default(),
                &nlb_service(&format!("svc{s}"), serde_json::json!({})),
            )
            .await?;
    }
    let started = std::time::Instant::now();
    // Setup, not measured: creates have a small AWS bucket (one per 5 s at
    // full size), which ten NLBs would wait out at the default budget.
    let ccm = env
        .start_ccm(&["--controllers=service", "--aws-api-budget-fraction=10"])
        .await?;
    let mut first: Vec<String> = cloud.instances[..10].to_vec();
    first.sort();
    eventually(
        "10 NLBs with 10 targets each",
        Duration::from_secs(120),
        || async {
            let tgs = all_target_groups(&cloud.elbv2).await;
            if tgs.len() != 10 {
                return None;
            }
            for tg in &tgs {
                if targets_of(&cloud.elbv2, tg).await? != first {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    println!("10 NLBs created in {:?}", started.elapsed());
    drop(ccm);

    // 5 nodes leave, 10 join; a fresh process syncs each Service once.
    for i in 0..5 {
        nodes
            .delete(&format!("n{i}"), &DeleteParams::default())
            .await?;
    }
    for i in 10..20 {
        nodes
            .create(
                &PostParams::default(),
                &node(&format!("n{i}"), &cloud.instances[i]),
            )
            .await?;
    }
    let proxy = ccm_testkit::aws_proxy::FaultProxy::start(
        &env.moto.endpoint(),
        ccm_testkit::aws_proxy::ProxyConfig::default(),
    )
    .await?;
    let started = std::time::Instant::now();
    let ccm = env
        .start_ccm_via(&proxy.endpoint(), &["--controllers=service"])
        .await?;
    let mut now: Vec<String> = cloud.instances[5..].to_vec();
    now.sort();
    eventually(
        "every target group holds exactly the 15 current nodes",
        Duration::from_secs(120),
        || async {
            for tg in &all_target_groups(&cloud.elbv2).await {
                if targets_of(&cloud.elbv2, tg).await? != now {
                    return None;
                }
            }
            Some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    println!("churn synced in {:?}", started.elapsed());
    let calls = proxy.calls();
    let register = calls
        .get("elasticloadbalancingv2", "RegisterTargets")
        .received;
    let deregister = calls
        .get("elasticloadbalancingv2", "DeregisterTargets")
        .received;
    println!("node churn over 10 NLBs: RegisterTargets={register} DeregisterTargets={deregister}");
    assert_eq!(register, 10, "one RegisterTargets per target group");
    assert_eq!(deregister, 10, "one DeregisterTargets per target group");
    for action in [
        "CreateLoadBalancer",
        "CreateTargetGroup",
        "CreateListener",
        "ModifyListener",
    ] {
        assert_eq!(
            calls.get("elasticloadbalancingv2", action).received,
            0,
            "{action}"
        );
    }
    env.finish().await
}

/// Upstream's #1328: at the targets-per-load-balancer quota a register
/// first cannot succeed. Two NLB Services at a quota of 3 (the proxy
/// refuses as AWS does); a node replaced (one joins, one leaves, in one
/// node-set change): AWS refuses the register, the leaving node is
/// deregistered, the register sent again, and each NLB ends up with the
/// new node and without the old, with no failed sync.
#[tokio::test]
async fn a_node_replacement_at_the_target_quota_deregisters_then_registers() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 4).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    for i in 0..3 {
        nodes
            .create(&pp, &node(&format!("n{i}"), &cloud.instances[i]))
            .await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    for name in ["a", "b"] {
        services
            .create(&pp, &nlb_service(name, serde_json::json!({})))
            .await?;
    }
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    proxy.set_targets_per_load_balancer(Some(3));
    let sorted = |ids: &[String]| {
        let mut ids = ids.to_vec();
        ids.sort();
        ids
    };
    let holding = |want: Vec<String>| {
        let elbv2 = cloud.elbv2.clone();
        async move {
            eventually("both NLBs' groups to hold the nodes", WAIT, || async {
                let tgs = all_target_groups(&elbv2).await;
                if tgs.len() != 2 {
                    return None;
                }
                for tg in &tgs {
                    if targets_of(&elbv2, tg).await? != want {
                        return None;
                    }
                }
                Some(tgs)
            })
            .await
        }
    };
    let tgs = holding(sorted(&cloud.instances[..3]))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let moves = ["RegisterTargets", "DeregisterTargets"];
    let before = proxy.requests_of(&moves).len();
    proxy.reset_counts();

    // n0 is replaced by n3 in one node-set change: the CCM is stopped
    // while both land, so its watch delivers them together however slow
    // the machine (two writes could otherwise fall into two settle
    // windows, and two syncs).
    ccm.signal(libc::SIGSTOP);
    let replaced = async {
        nodes.create(&pp, &node("n3", &cloud.instances[3])).await?;
        nodes.delete("n0", &DeleteParams::default()).await
    }
    .await;
    ccm.signal(libc::SIGCONT);
    replaced?;
    holding(sorted(&cloud.instances[1..]))
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    let (old, new) = (&cloud.instances[0], &cloud.instances[3]);
    let moved = proxy.requests_of(&moves);
    for tg in &tgs {
        let steps: Vec<(String, Vec<String>)> = moved[before..]
            .iter()
            .filter(|c| c.params.get("TargetGroupArn") == Some(tg))
            .map(|c| {
                let ids = c
                    .params
                    .iter()
                    .filter(|(k, _)| k.starts_with("Targets.member.") && k.ends_with(".Id"))
                    .map(|(_, id)| id.clone())
                    .collect();
                (c.action.clone(), ids)
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                ("RegisterTargets".to_string(), vec![new.clone()]),
                ("DeregisterTargets".to_string(), vec![old.clone()]),
                ("RegisterTargets".to_string(), vec![new.clone()]),
            ],
            "{tg}: register (refused), deregister, register"
        );
    }
    // The quota refused one register per NLB, and nothing else failed.
    let calls = proxy.calls();
    let register = calls.get("elasticloadbalancingv2", "RegisterTargets");
    assert_eq!(
        (register.received, register.faulted, register.forwarded),
        (4, 2, 2),
        "{register:?}"
    );
    let deregister = calls.get("elasticloadbalancingv2", "DeregisterTargets");
    assert_eq!((deregister.received, deregister.faulted), (2, 0));
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let failed: Vec<String> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
        .map(|e| e.message.unwrap_or_default())
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");

    for name in ["a", "b"] {
        services.delete(name, &DeleteParams::default()).await?;
    }
    eventually("the Services to be gone", WAIT, || async {
        let left = services.list(&Default::default()).await.ok()?.items;
        left.is_empty().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// Requests a certificate from moto's ACM with a raw JSON-protocol POST (the
/// project has no ACM SDK crate); returns its ARN.
pub(crate) async fn acm_certificate(endpoint: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let body = r#"{"DomainName":"nlb.example.com"}"#;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/x-amz-json-1.1\r\n\
         X-Amz-Target: CertificateManager.RequestCertificate\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/{REGION}/acm/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&authority).await?;
    stream.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    stream.read_to_string(&mut out).await?;
    let json = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or_else(|| anyhow::anyhow!("no body in {out}"))?;
    let start = json
        .find('{')
        .ok_or_else(|| anyhow::anyhow!("no JSON in {out}"))?;
    let end = json.rfind('}').unwrap_or(json.len() - 1);
    let v: serde_json::Value = serde_json::from_str(&json[start..=end])?;
    v["CertificateArn"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("no CertificateArn in {out}"))
}

#[tokio::test]
async fn nlb_annotations_take_effect_in_aws() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    with_ipv6(&cloud).await?;
    let cert = acm_certificate(&env.moto.endpoint()).await?;
    let eip = cloud
        .ec2
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc)
        .send()
        .await?
        .allocation_id()
        .unwrap()
        .to_string();
    let (_, services) = node_n0(&env, &cloud).await?;

    // Internal, TLS on 443 to a TLS backend, dualstack, access logs, Local policy.
    let tls: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "tls", "namespace": "default", "annotations": {
            "service.beta.kubernetes.io/aws-load-balancer-type": "nlb",
            "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
            "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": cert,
            "service.beta.kubernetes.io/aws-load-balancer-ssl-ports": "443",
            "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy": "ELBSecurityPolicy-TLS13-1-2-2021-06",
            "service.beta.kubernetes.io/aws-load-balancer-backend-protocol": "ssl",
            "service.beta.kubernetes.io/aws-load-balancer-ip-address-type": "dualstack",
            "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled": "true",
            "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name": "logs",
            "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix": "nlb",
            "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses": "10.0.1.10",
        }},
        "spec": {"type": "LoadBalancer", "selector": {"app": "tls"},
                 "externalTrafficPolicy": "Local", "healthCheckNodePort": 32123,
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080},
                           {"name": "https", "port": 443, "targetPort": 8443}]}
    }))?;
    let tls = services.create(&PostParams::default(), &tls).await?;
    // Internet-facing with an EIP on the annotated subnet.
    let eip_svc = services
        .create(
            &PostParams::default(),
            &nlb_service(
                "eip",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-subnets": cloud.subnet,
                    "service.beta.kubernetes.io/aws-load-balancer-eip-allocations": eip,
                }),
            ),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    for name in ["tls", "eip"] {
        eventually("the NLB hostname", WAIT, || async {
            services.get(name).await.ok().as_ref().and_then(hostname)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{name}: {e}\nlogs:\n{}", ccm.logs()))?;
    }

    let lb = cloud
        .elbv2
        .describe_load_balancers()
        .names(lb_name(&tls))
        .send()
        .await?
        .load_balancers()[0]
        .clone();
    assert_eq!(
        lb.scheme(),
        Some(&elbv2::types::LoadBalancerSchemeEnum::Internal)
    );
    assert_eq!(
        lb.ip_address_type(),
        Some(&elbv2::types::IpAddressType::Dualstack)
    );
    let arn = lb.load_balancer_arn().unwrap();
    let attrs = cloud
        .elbv2
        .describe_load_balancer_attributes()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let attr = |k: &str| {
        attrs
            .attributes()
            .iter()
            .find(|a| a.key() == Some(k))
            .and_then(|a| a.value())
            .map(str::to_string)
    };
    assert_eq!(attr("access_logs.s3.enabled").as_deref(), Some("true"));
    assert_eq!(attr("access_logs.s3.bucket").as_deref(), Some("logs"));
    assert_eq!(attr("access_logs.s3.prefix").as_deref(), Some("nlb"));
    let listeners = cloud
        .elbv2
        .describe_listeners()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let l443 = listeners
        .listeners()
        .iter()
        .find(|l| l.port() == Some(443))
        .unwrap();
    assert_eq!(l443.protocol(), Some(&elbv2::types::ProtocolEnum::Tls));
    assert_eq!(
        l443.certificates()[0].certificate_arn(),
        Some(cert.as_str())
    );
    assert_eq!(
        l443.ssl_policy(),
        Some("ELBSecurityPolicy-TLS13-1-2-2021-06")
    );
    let l80 = listeners
        .listeners()
        .iter()
        .find(|l| l.port() == Some(80))
        .unwrap();
    assert_eq!(l80.protocol(), Some(&elbv2::types::ProtocolEnum::Tcp));
    let tgs = cloud
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(arn)
        .send()
        .await?;
    let tg443 = tgs
        .target_groups()
        .iter()
        .find(|g| {
            Some(g.target_group_arn().unwrap()) == l443.default_actions()[0].target_group_arn()
        })
        .unwrap();
    assert_eq!(tg443.protocol(), Some(&elbv2::types::ProtocolEnum::Tls));
    // Local: HTTP /healthz on healthCheckNodePort, 2/2/10.
    for g in tgs.target_groups() {
        assert_eq!(
            g.health_check_protocol(),
            Some(&elbv2::types::ProtocolEnum::Http)
        );
        assert_eq!(g.health_check_port(), Some("32123"));
        assert_eq!(g.health_check_path(), Some("/healthz"));
        assert_eq!(g.health_check_interval_seconds(), Some(10));
        assert_eq!(g.healthy_threshold_count(), Some(2));
        assert_eq!(g.unhealthy_threshold_count(), Some(2));
    }

    let lb = cloud
        .elbv2
        .describe_load_balancers()
        .names(lb_name(&eip_svc))
        .send()
        .await?
        .load_balancers()[0]
        .clone();
    let zones: Vec<String> = lb
        .availability_zones()
        .iter()
        .filter_map(|z| z.subnet_id().map(str::to_string))
        .collect();
    assert_eq!(zones, vec![cloud.subnet.clone()]);
    println!("eip NLB zones: {:?}", lb.availability_zones());
    println!(
        "tls NLB zones: {:?}",
        cloud
            .elbv2
            .describe_load_balancers()
            .names(lb_name(&tls))
            .send()
            .await?
            .load_balancers()[0]
            .availability_zones()
    );
    env.finish().await
}

#[tokio::test]
async fn an_nlb_made_by_the_go_ccm_is_adopted_without_a_single_mutation() -> anyhow::Result<()> {
    use sha1::Digest;
    let env = Env::start().await?;
    let cloud = seed(&env, 2).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in cloud.instances.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i}"), id))
            .await?;
    }
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &nlb_service("web", serde_json::json!({})),
        )
        .await?;
    let name = lb_name(&svc);
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
        .node_port
        .unwrap();

    // What the Go CCM would have made: upstream names, tags and defaults.
    let mut h = sha1::Sha1::new();
    for part in [
        CLUSTER_ID.to_string(),
        "default".into(),
        "web".into(),
        "80".into(),
        node_port.to_string(),
        "TCP".into(),
        "instance".into(),
        "TCP".into(),
        "30".into(),
    ] {
        h.update(part.as_bytes());
    }
    let tg_name = format!("k8s-default-web-{}", &hex::encode(h.finalize())[..10]);
    let go_tags: Vec<elbv2::types::Tag> = [
        (
            format!("kubernetes.io/cluster/{CLUSTER_ID}"),
            "owned".to_string(),
        ),
        ("kubernetes.io/service-name".into(), "default/web".into()),
    ]
    .into_iter()
    .map(|(k, v)| elbv2::types::Tag::builder().key(k).value(v).build())
    .collect();
    let lb = cloud
        .elbv2
        .create_load_balancer()
        .name(&name)
        .r#type(elbv2::types::LoadBalancerTypeEnum::Network)
        .subnets(&cloud.subnet)
        .set_tags(Some(go_tags.clone()))
        .send()
        .await?;
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_string();
    let vpc = lb.load_balancers()[0].vpc_id().unwrap().to_string();
    let tg = cloud
        .elbv2
        .create_target_group()
        .name(&tg_name)
        .vpc_id(vpc)
        .port(node_port)
        .protocol(elbv2::types::ProtocolEnum::Tcp)
        .target_type(elbv2::types::TargetTypeEnum::Instance)
        .health_check_protocol(elbv2::types::ProtocolEnum::Tcp)
        .health_check_port("traffic-port")
        .health_check_interval_seconds(30)
        .healthy_threshold_count(3)
        .unhealthy_threshold_count(3)
        .set_tags(Some(go_tags.clone()))
        .send()
        .await?;
    let tg_arn = tg.target_groups()[0]
        .target_group_arn()
        .unwrap()
        .to_string();
    cloud
        .elbv2
        .register_targets()
        .target_group_arn(&tg_arn)
        .set_targets(Some(
            cloud
                .instances
                .iter()
                .map(|i| {
                    elbv2::types::TargetDescription::builder()
                        .id(i)
                        .port(node_port)
                        .build()
                })
                .collect(),
        ))
        .send()
        .await?;
    cloud
        .elbv2
        .create_listener()
        .load_balancer_arn(&lb_arn)
        .port(80)
        .protocol(elbv2::types::ProtocolEnum::Tcp)
        .default_actions(
            elbv2::types::Action::builder()
                .r#type(elbv2::types::ActionTypeEnum::Forward)
                .target_group_arn(&tg_arn)
                .build(),
        )
        .send()
        .await?;
    // The Go CCM's rules in the node group: client traffic on the node port
    // from the source ranges (everywhere), and ICMP fragmentation-needed
    // for path MTU discovery (health checks ride on the client rule).
    let described = |protocol: &str, from: i32, to: i32, description: String| {
        aws_sdk_ec2::types::IpPermission::builder()
            .ip_protocol(protocol)
            .from_port(from)
            .to_port(to)
            .ip_ranges(
                aws_sdk_ec2::types::IpRange::builder()
                    .cidr_ip("0.0.0.0/0")
                    .description(description)
                    .build(),
            )
            .build()
    };
    cloud
        .ec2
        .authorize_security_group_ingress()
        .group_id(&cloud.node_group)
        .ip_permissions(described(
            "tcp",
            node_port,
            node_port,
            format!("kubernetes.io/rule/nlb/client={name}"),
        ))
        .ip_permissions(described(
            "icmp",
            3,
            4,
            "kubernetes.io/rule/nlb/mtu".to_string(),
        ))
        .send()
        .await?;

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    eventually("the adopted NLB's hostname in the status", WAIT, || async {
        services.get("web").await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    // Adoption changes nothing: not one mutating call of any kind (the
    // Operation table says which are; DryRun permission checks are not).
    let calls = proxy.calls();
    let mutations: Vec<String> = calls
        .iter()
        .filter(|(s, a, c)| {
            c.received > 0
                && aws_ccm::aws::Operation::from_names(s, a).is_some_and(|op| op.is_mutating())
        })
        .map(|(s, a, _)| format!("{s}:{a}"))
        .collect();
    assert!(mutations.is_empty(), "{mutations:?}\nlogs:\n{}", ccm.logs());
    assert_eq!(all_target_groups(&cloud.elbv2).await, vec![tg_arn]);
    env.finish().await
}

#[tokio::test]
async fn managed_security_group_mode_and_byo_switching() -> anyhow::Result<()> {
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    ))
    .await?;
    let cloud = seed(&env, 1).await?;
    let vpc = cloud.vpc_id().await?;
    let user_group = cloud
        .ec2
        .create_security_group()
        .group_name("users-own")
        .description("brought by the user")
        .vpc_id(&vpc)
        .send()
        .await?
        .group_id()
        .unwrap()
        .to_string();
    let (_, services) = node_n0(&env, &cloud).await?;
    let svc = services
        .create(
            &PostParams::default(),
            &nlb_service("web", serde_json::json!({})),
        )
        .await?;
    let name = lb_name(&svc);
    // Upstream's managed group name, so a Go-made group is adopted.
    let owned_name = crate::swap::go_managed_group_name(&svc);
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    let lb_groups = || async {
        let o = cloud
            .elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await
            .ok()?;
        o.load_balancers()
            .first()
            .map(|l| l.security_groups().to_vec())
    };
    let owned_id = || async {
        cloud
            .ec2
            .describe_security_groups()
            .filters(
                Filter::builder()
                    .name("group-name")
                    .values(&owned_name)
                    .build(),
            )
            .send()
            .await
            .ok()?
            .security_groups()
            .first()
            .and_then(|g| g.group_id().map(str::to_string))
    };
    let managed = eventually("the NLB with its managed group", WAIT, || async {
        let id = owned_id().await?;
        (lb_groups().await? == vec![id.clone()]).then_some(id)
    })
    .await
    .map_err(fail)?;

    // Managed → BYO: the user's group on the NLB, the managed group deleted.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-security-groups": user_group
            }}})),
        )
        .await?;
    eventually(
        "the user's group replaces the managed one",
        WAIT,
        || async {
            (lb_groups().await? == vec![user_group.clone()] && owned_id().await.is_none())
                .then_some(())
        },
    )
    .await
    .map_err(fail)?;

    // BYO → Managed: a new managed group; the user's group is left alone.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-security-groups": null
            }}})),
        )
        .await?;
    let again = eventually("a managed group again", WAIT, || async {
        let id = owned_id().await?;
        (lb_groups().await? == vec![id.clone()]).then_some(id)
    })
    .await
    .map_err(fail)?;
    assert_ne!(again, managed);
    let users = cloud
        .ec2
        .describe_security_groups()
        .group_ids(&user_group)
        .send()
        .await?;
    assert_eq!(users.security_groups().len(), 1);

    // Delete: the managed group goes with the NLB.
    services.delete("web", &DeleteParams::default()).await?;
    eventually("the NLB and its managed group gone", WAIT, || async {
        (lb_groups().await.is_none() && owned_id().await.is_none()).then_some(())
    })
    .await
    .map_err(fail)?;
    assert!(cluster_tagged_elbv2(&cloud.elbv2).await?.is_empty());
    env.finish().await
}

/// TCP and UDP on different ports of one Service (one port for both is the
/// next test).
#[tokio::test]
async fn tcp_and_udp_ports_get_their_listeners_groups_and_node_rules() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = dns_service(
        serde_json::json!([{"name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30053},
                           {"name": "syslog", "port": 514, "protocol": "UDP", "nodePort": 30514}]),
    );
    let (svc, _ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let (got, protocols) = listeners_and_groups(&cloud, &svc).await?;
    assert_eq!(got, vec![(53, "TCP".into()), (514, "UDP".into())]);
    assert_eq!(
        protocols,
        vec![(30053, "TCP".into()), (30514, "UDP".into())]
    );
    // Node rules: TCP and UDP to the node ports.
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    for (proto, port) in [("tcp", 30053), ("udp", 30514)] {
        assert!(
            rules
                .iter()
                .any(|r| r.0 == proto && r.1 == port && r.2 == "0.0.0.0/0"),
            "{proto} {port}: {rules:?}"
        );
    }
    assert!(
        !rules.iter().any(|r| r.0 == "udp" && r.1 == 30053),
        "{rules:?}"
    );
    // The UDP port's health check is TCP: it needs the subnet rule.
    assert!(
        rules
            .iter()
            .any(|r| r.0 == "tcp" && r.1 == 30514 && r.2 == "10.0.1.0/24"),
        "{rules:?}"
    );
    env.finish().await
}

/// DNS on TCP and UDP 53 with one node port (the API server allows one node
/// port for both protocols): one `TCP_UDP` listener and target group, and
/// node rules for both protocols on that port.
#[tokio::test]
async fn tcp_and_udp_on_one_port_share_a_tcp_udp_listener_and_group() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = dns_service(
        serde_json::json!([{"name": "dns-tcp", "port": 53, "protocol": "TCP", "nodePort": 30053},
                           {"name": "dns-udp", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
    );
    let (svc, _ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let (got, groups) = listeners_and_groups(&cloud, &svc).await?;
    assert_eq!(got, vec![(53, "TCP_UDP".to_string())]);
    assert_eq!(groups, vec![(30053, "TCP_UDP".to_string())]);
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    for proto in ["tcp", "udp"] {
        assert!(
            rules
                .iter()
                .any(|r| r.0 == proto && r.1 == 30053 && r.2 == "0.0.0.0/0"),
            "{proto} 30053: {rules:?}"
        );
    }
    // Going back: the Go CCM refuses the mixed protocols but finds the NLB
    // by name, and its deletion removes every group this CCM made.
    go_would_find_everything(&cloud, &svc).await?;
    env.finish().await
}

/// What the Go CCM meets of a Service's NLB when it takes over again: the
/// load balancer by its name (`a` + UID) with the cluster and Service tags,
/// and, through the load balancer's ARN (how its `EnsureLoadBalancerDeleted`
/// lists them), every target group this CCM made for the Service (by the
/// Service tag): nothing is left behind when the Go CCM deletes it.
async fn go_would_find_everything(
    cloud: &Cloud,
    svc: &Service,
) -> anyhow::Result<elbv2::types::LoadBalancer> {
    let name = crate::backends::lb_name(svc);
    let key = format!(
        "default/{}",
        svc.metadata.name.as_deref().unwrap_or_default()
    );
    let lbs = cloud
        .elbv2
        .describe_load_balancers()
        .names(&name)
        .send()
        .await?;
    let lb = lbs
        .load_balancers()
        .first()
        .cloned()
        .expect("found by name");
    let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
    let tagged: BTreeMap<String, BTreeMap<String, String>> = cluster_tagged_elbv2(&cloud.elbv2)
        .await?
        .into_iter()
        .collect();
    let lb_tags = tagged.get(&arn).cloned().unwrap_or_default();
    assert_eq!(
        lb_tags
            .get(&format!("kubernetes.io/cluster/{CLUSTER_ID}"))
            .map(String::as_str),
        Some("owned")
    );
    assert_eq!(lb_tags.get("kubernetes.io/service-name"), Some(&key));
    let by_lb: BTreeSet<String> = cloud
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(&arn)
        .send()
        .await?
        .target_groups()
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let by_tag: BTreeSet<String> = tagged
        .into_iter()
        .filter(|(arn, t)| {
            arn.contains(":targetgroup/") && t.get("kubernetes.io/service-name") == Some(&key)
        })
        .map(|(arn, _)| arn)
        .collect();
    assert!(!by_lb.is_empty());
    assert_eq!(by_lb, by_tag, "groups the Go CCM's deletion would miss");
    Ok(lb)
}

/// Going back with `ip-address-type: dualstack`, which the Go CCM lacks: it
/// finds the NLB by name, adopts its TCP target group (the Go CCM's own name
/// for it), and leaves the address type as it is.
#[tokio::test]
async fn going_back_a_dualstack_nlb_is_one_the_go_ccm_adopts() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    with_ipv6(&cloud).await?;
    let mut svc = nlb_service(
        "web",
        serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-ip-address-type": "dualstack"}),
    );
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    let (svc, _ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let lb = go_would_find_everything(&cloud, &svc).await?;
    assert_eq!(
        lb.ip_address_type(),
        Some(&elbv2::types::IpAddressType::Dualstack)
    );
    let groups = cloud
        .elbv2
        .describe_target_groups()
        .load_balancer_arn(lb.load_balancer_arn().unwrap_or_default())
        .send()
        .await?;
    let names: Vec<&str> = groups
        .target_groups()
        .iter()
        .filter_map(|g| g.target_group_name())
        .collect();
    assert_eq!(
        names,
        [crate::swap::go_target_group_name("web", 30080).as_str()]
    );
    env.finish().await
}

/// AWS rejects a whole AuthorizeSecurityGroupIngress when any one of its
/// rules already exists, e.g. the MTU rule another NLB's sync added a moment
/// earlier. The other rules of that call must still be added, not taken as
/// done (this lost client rules when syncs ran concurrently).
#[tokio::test]
async fn a_duplicate_rule_does_not_lose_the_other_rules_of_the_call() -> anyhow::Result<()> {
    use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 400,
            code: "InvalidPermission.Duplicate".into(),
            message: "the specified rule \"peer: 0.0.0.0/0, ICMP, type: 3, code: 4, ALLOW\" already exists".into(),
        })
        .for_action("AuthorizeSecurityGroupIngress")
        .real_calls_only()
        .at_most(1),
    ]);
    let mut svc = nlb_service("web", serde_json::json!({}));
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    let _ccm = one_node_nlb(&env, &cloud, &svc).await?;
    assert_eq!(
        env.proxy
            .calls()
            .get("ec2", "AuthorizeSecurityGroupIngress")
            .faulted,
        1,
        "the fault must have hit the node rules' call"
    );
    let rules = node_rules(&cloud.ec2, &cloud.node_group).await?;
    // The client rule (it also admits the health checks) and the MTU rule.
    for (proto, port, cidr) in [("tcp", 30080, "0.0.0.0/0"), ("icmp", 3, "0.0.0.0/0")] {
        assert!(
            rules
                .iter()
                .any(|r| r.0 == proto && r.1 == port && r.2 == cidr),
            "{proto} {port} from {cidr} missing: {rules:?}"
        );
    }
    env.finish().await
}

/// A node whose instance was launched after the cluster sweep was cached
/// (the sweep is reused for 30 s) is registered by the sync its arrival
/// starts, not left out until a later sweep and a later sync.
#[tokio::test]
async fn a_node_launched_after_the_cached_sweep_is_registered_at_once() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let elbv2 = elbv2::Client::new(&seeded.conf);
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &node("n0", &seeded.instances[0]))
        .await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &nlb_service("web", serde_json::json!({})),
        )
        .await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let tg = eventually("the target group with n0", WAIT, || async {
        let tg = all_target_groups(&elbv2).await.into_iter().next()?;
        (targets_of(&elbv2, &tg).await? == vec![seeded.instances[0].clone()]).then_some(tg)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    let late = seeded.launch(1).await?.remove(0);
    nodes
        .create(&PostParams::default(), &node("n1", &late))
        .await?;
    let mut want = vec![seeded.instances[0].clone(), late];
    want.sort();
    // Well inside the sweep's 30 s reuse: without the lookup by ID the
    // new instance would not be registered before then (nor after, with no
    // further node change).
    eventually("n1 registered", Duration::from_secs(20), || async {
        (targets_of(&elbv2, &tg).await? == want).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// An NLB's node rules follow its backends' node groups: a group whose
/// nodes all leave the backends loses them, and gets them back when a node
/// returns. A sync reads the backends' groups and the groups holding rules
/// on the NLB's node ports, not every cluster-tagged group, so the group it
/// must clean is found although it holds no backend any more.
#[tokio::test]
async fn nlb_node_rules_follow_the_backends_node_groups() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let group2 = seeded.node_group_named("nodes-2").await?;
    let i2 = seeded.launch_in(&group2, 1).await?;
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    nodes.create(&pp, &node("n0", &seeded.instances[0])).await?;
    nodes.create(&pp, &node("n1", &i2[0])).await?;
    let mut svc = nlb_service("web", serde_json::json!({}));
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30080);
    let services: Api<Service> = Api::namespaced(client, "default");
    services.create(&pp, &svc).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let has_client_rule = |group: String| {
        let ec2 = seeded.ec2.clone();
        async move {
            let rules = node_rules(&ec2, &group).await.ok()?;
            Some(
                rules
                    .iter()
                    .any(|r| r.0 == "tcp" && r.1 == 30080 && r.2 == "0.0.0.0/0"),
            )
        }
    };
    let both = || async {
        (has_client_rule(seeded.node_group.clone()).await == Some(true)
            && has_client_rule(group2.clone()).await == Some(true))
        .then_some(())
    };
    eventually("rules in both node groups", WAIT, both)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;

    // n1, the only node in group 2, leaves the backends.
    let exclude = |value: Option<&str>| {
        serde_json::json!({"metadata": {"labels": {
            "node.kubernetes.io/exclude-from-external-load-balancers": value}}})
    };
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(exclude(Some(""))),
        )
        .await?;
    eventually("group 2's rule to go", WAIT, || async {
        (has_client_rule(group2.clone()).await == Some(false)).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert_eq!(
        has_client_rule(seeded.node_group.clone()).await,
        Some(true),
        "group 1 still holds a backend"
    );
    assert!(
        node_rules(&seeded.ec2, &group2).await?.is_empty(),
        "no rule of the NLB may stay in group 2"
    );

    // n1 comes back: so does the rule.
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(exclude(None)))
        .await?;
    eventually("rules in both node groups again", WAIT, both)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// ELBv2 refuses a dual-stack NLB in a subnet without IPv6 (moto does not;
/// the proxy does, as AWS): the Service gets AWS's words in a Warning and no
/// load balancer, and once the subnet has an IPv6 block the retry makes it.
#[tokio::test]
async fn a_dualstack_nlb_without_ipv6_subnets_is_refused_as_aws_refuses_it() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let (client, services) = node_n0(&env, &cloud).await?;
    let svc = nlb_service(
        "v6",
        serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-ip-address-type": "dualstack"}),
    );
    services.create(&PostParams::default(), &svc).await?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let note = crate::swap::event_note(&client, "v6", "SyncLoadBalancerFailed").await?;
    assert!(note.contains("IPv6 CIDR block"), "{note}");
    let refused = env
        .proxy
        .calls()
        .get("elasticloadbalancingv2", "CreateLoadBalancer");
    assert!(
        refused.received > refused.forwarded,
        "the refusal fired: {refused:?}"
    );
    let lbs = cloud.elbv2.describe_load_balancers().send().await?;
    assert!(lbs.load_balancers().is_empty(), "no NLB was made");

    with_ipv6(&cloud).await?;
    eventually(
        "the NLB hostname once the subnet has IPv6",
        WAIT,
        || async { services.get("v6").await.ok().as_ref().and_then(hostname) },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// `dualstack` added to a live NLB whose subnet has no IPv6: AWS refuses
/// `SetIpAddressType`, and only that change stops. A node that joins is
/// still registered (the Go CCM ignores the annotation, so its targets
/// follow the nodes), and the Service says what AWS refused.
#[tokio::test]
async fn a_refused_dualstack_change_keeps_a_live_nlbs_targets_current() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 2).await?;
    let svc = nlb_service("live", serde_json::json!({}));
    let (_, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    services
        .patch(
            "live",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-ip-address-type": "dualstack"}}})),
        )
        .await?;
    let note = crate::swap::event_note(&client, "live", "SyncLoadBalancerFailed").await?;
    assert!(note.contains("IPv6 CIDR block"), "{note}");
    let refused = env
        .proxy
        .calls()
        .get("elasticloadbalancingv2", "SetIpAddressType");
    assert!(
        refused.received > refused.forwarded,
        "the refusal fired: {refused:?}"
    );

    Api::<Node>::all(client)
        .create(&PostParams::default(), &node("n1", &cloud.instances[1]))
        .await?;
    let mut both = cloud.instances[..2].to_vec();
    both.sort();
    eventually(
        "the joined node registered despite the refusal",
        WAIT,
        || async {
            let groups = all_target_groups(&cloud.elbv2).await;
            let tg = groups.first()?;
            (targets_of(&cloud.elbv2, tg).await? == both).then_some(())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    env.finish().await
}

/// A node group's inbound rules as (protocol, from port, source CIDR or
/// group, description), sorted.
pub(crate) async fn node_group_rules(
    ec2: &aws_sdk_ec2::Client,
    group: &str,
) -> anyhow::Result<BTreeSet<(String, i32, String, String)>> {
    let out = ec2
        .describe_security_groups()
        .group_ids(group)
        .send()
        .await?;
    let mut rules = BTreeSet::new();
    for p in out.security_groups()[0].ip_permissions() {
        let (protocol, from) = (
            p.ip_protocol().unwrap_or_default(),
            p.from_port().unwrap_or(-1),
        );
        for r in p.ip_ranges() {
            let (source, desc) = (r.cidr_ip(), r.description());
            rules.insert((protocol, from, source, desc));
        }
        for g in p.user_id_group_pairs() {
            rules.insert((protocol, from, g.group_id(), g.description()));
        }
    }
    Ok(rules
        .into_iter()
        .map(|(p, f, s, d)| {
            let s = s.unwrap_or_default().to_string();
            (p.to_string(), f, s, d.unwrap_or_default().to_string())
        })
        .collect())
}

/// `NLBNodeIngress = LoadBalancerGroup` (this CCM's, opt-in) on a
/// Managed-mode NLB whose node group holds the Go CCM's CIDR rules: without
/// the key a restart changes nothing; with it, at the rules limit (the fault
/// proxy's quota, which must fire) the CIDR rules stay with a Warning;
/// with room, one rule admitting the NLB's group replaces them; unset again,
/// the CIDR rules come back and the group rule goes; deleting the Service
/// revokes the group rule and deletes the managed group.
#[tokio::test]
async fn node_rules_move_to_the_nlbs_group_when_asked_and_back() -> anyhow::Result<()> {
    let managed = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    );
    let env = Env::start_with_conf(&managed).await?;
    let cloud = seed(&env, 1).await?;
    let (client, services) = node_n0(&env, &cloud).await?;
    let svc = services
        .create(
            &PostParams::default(),
            &nlb_service("web", serde_json::json!({})),
        )
        .await?;
    let name = lb_name(&svc);
    let ours = |d: &str| d.ends_with(&format!("={name}")) || d == "kubernetes.io/rule/nlb/mtu";
    let group_rule = "aws-ccm/rule/nlb/from-group";
    let lb_group = || async {
        let o = (cloud
            .elbv2
            .describe_load_balancers()
            .names(&name)
            .send()
            .await)
            .ok()?;
        o.load_balancers()
            .first()?
            .security_groups()
            .first()
            .cloned()
    };
    let rules = || async { node_group_rules(&cloud.ec2, &cloud.node_group).await.ok() };
    // This NLB's CIDR and MTU rules and the group rule.
    let ours_and_group = || async {
        let r = rules().await?.into_iter();
        Some(BTreeSet::from_iter(
            r.filter(|r| ours(&r.3) || r.3 == group_rule),
        ))
    };
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let fail = |ccm: &Ccm| {
        let logs = ccm.logs();
        move |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{logs}")
    };
    // The Go CCM's rules (this CCM writes the same without the key).
    let (managed_group, go_rules) = eventually("the NLB and its CIDR node rules", WAIT, || async {
        let g = lb_group().await?;
        let r = rules().await?;
        let cidr: BTreeSet<_> = r.into_iter().filter(|r| ours(&r.3)).collect();
        (cidr.len() == 2).then_some((g, cidr))
    })
    .await
    .map_err(fail(&ccm))?;
    assert!(go_rules.iter().all(|r| r.2 == "0.0.0.0/0"), "{go_rules:?}");
    drop(ccm);
    // A restart without the key: not one mutating call.
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let addr = ccm.https_addr().await?;
    let synced = ["service_controller_loadbalancer_sync_total 1"];
    metrics_with(&addr, &synced, WAIT)
        .await
        .map_err(fail(&ccm))?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    drop(ccm);

    // With the key, at the limit: the quota is what the group holds.
    std::fs::write(
        &env.cloud_conf,
        format!("{managed}NLBNodeIngress = LoadBalancerGroup\n"),
    )?;
    let held = rules().await.unwrap_or_default().len();
    let config = ccm_testkit::aws_proxy::ProxyConfig::default();
    let proxy = ccm_testkit::aws_proxy::FaultProxy::start(&env.moto.endpoint(), config).await?;
    proxy.set_rules_per_security_group(Some(held));
    let ccm = (env.start_ccm_via(&proxy.endpoint(), &["--controllers=service"])).await?;
    let note = crate::swap::event_note(&client, "web", "NodeSecurityGroupRuleLimit")
        .await
        .map_err(fail(&ccm))?;
    assert!(
        note.contains(&cloud.node_group) && note.contains(&managed_group),
        "{note}"
    );
    let authorize = proxy.calls().get("ec2", "AuthorizeSecurityGroupIngress");
    assert!(
        authorize.faulted >= 1,
        "the quota never refused: {authorize:?}"
    );
    let revoke = proxy.calls().get("ec2", "RevokeSecurityGroupIngress");
    assert_eq!(revoke.received, 0, "a rule went at the limit");
    let now: BTreeSet<_> = rules()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| ours(&r.3))
        .collect();
    assert_eq!(now, go_rules);
    drop(ccm);

    // With room: one rule from the NLB's group, the CIDR rules gone.
    let (_proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let want = BTreeSet::from([(
        "-1".to_string(),
        -1,
        managed_group.clone(),
        group_rule.to_string(),
    )]);
    eventually("the group rule alone", WAIT, || async {
        let r = ours_and_group().await?;
        (r == want).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);

    // Unset: the CIDR rules back, the group rule gone.
    std::fs::write(&env.cloud_conf, &managed)?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the CIDR rules back", WAIT, || async {
        let r = ours_and_group().await?;
        (r == go_rules).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);

    // Deleted in group mode: the group rule goes before the managed group.
    std::fs::write(
        &env.cloud_conf,
        format!("{managed}NLBNodeIngress = LoadBalancerGroup\n"),
    )?;
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the group rule again", WAIT, || async {
        let r = ours_and_group().await?;
        (r == want).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    services.delete("web", &DeleteParams::default()).await?;
    eventually(
        "the NLB, its group and every rule of it gone",
        WAIT,
        || async {
            let gone = cloud
                .ec2
                .describe_security_groups()
                .group_ids(&managed_group)
                .send()
                .await
                .is_err();
            let r = rules().await?;
            (lb_group().await.is_none()
                && gone
                && !r.iter().any(|r| ours(&r.3) || r.3 == group_rule))
            .then_some(())
        },
    )
    .await
    .map_err(fail(&ccm))?;
    env.finish().await
}

/// Two NLBs carrying the same bring-your-own security group, in
/// `NLBNodeIngress = LoadBalancerGroup`: the node group holds one rule
/// admitting that group, for both. The second NLB is made after the first
/// sync read the load-balancer sweep (kept for five minutes with this
/// resync period); deleting the first must still see the second carrying
/// the group, so the rule stays for it. The group is the user's: it stays.
#[tokio::test]
async fn a_group_rule_stays_while_a_newer_nlb_carries_the_group() -> anyhow::Result<()> {
    let conf = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\nNLBNodeIngress = LoadBalancerGroup\n"
    );
    let env = Env::start_with_conf(&conf).await?;
    let cloud = seed(&env, 1).await?;
    let vpc = cloud.vpc_id().await?;
    let shared = cloud
        .ec2
        .create_security_group()
        .group_name("shared-by-two")
        .description("the user's, on two NLBs")
        .vpc_id(&vpc)
        .send()
        .await?
        .group_id()
        .unwrap_or_default()
        .to_string();
    let (_, services) = node_n0(&env, &cloud).await?;
    let byo =
        serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-security-groups": shared});
    let group_rule = (
        "-1".to_string(),
        -1,
        shared.clone(),
        "aws-ccm/rule/nlb/from-group".to_string(),
    );
    let holds_rule = || async {
        let r = node_group_rules(&cloud.ec2, &cloud.node_group).await.ok()?;
        Some(r.contains(&group_rule))
    };
    let carries = |name: String| {
        let elbv2 = cloud.elbv2.clone();
        async move {
            let o = elbv2
                .describe_load_balancers()
                .names(name)
                .send()
                .await
                .ok()?;
            Some(o.load_balancers().first()?.security_groups().to_vec())
        }
    };
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    let one = services
        .create(&PostParams::default(), &nlb_service("one", byo.clone()))
        .await?;
    eventually("the first NLB's group rule", WAIT, || async {
        holds_rule().await?.then_some(())
    })
    .await
    .map_err(fail)?;
    let two = services
        .create(&PostParams::default(), &nlb_service("two", byo))
        .await?;
    eventually("the second NLB with the same group", WAIT, || async {
        (carries(lb_name(&two)).await? == vec![shared.clone()]).then_some(())
    })
    .await
    .map_err(fail)?;
    services.delete("one", &DeleteParams::default()).await?;
    eventually("the first NLB gone", WAIT, || async {
        carries(lb_name(&one)).await.is_none().then_some(())
    })
    .await
    .map_err(fail)?;
    assert_eq!(
        holds_rule().await,
        Some(true),
        "the rule the second NLB relies on was revoked\nlogs:\n{}",
        ccm.logs()
    );
    env.finish().await
}

/// The names of the target groups behind NLB `arn`, or (`None`) of every
/// target group.
async fn group_names(c: &elbv2::Client, arn: Option<&str>) -> anyhow::Result<Vec<String>> {
    let out = (c.describe_target_groups())
        .set_load_balancer_arn(arn.map(str::to_string))
        .send()
        .await?;
    Ok((out.target_groups().iter())
        .filter_map(|g| g.target_group_name().map(str::to_string))
        .collect())
}

/// Service `created`'s NLB with one target group (its ARN and that
/// group's name); then AWS answers 5xx to every DeleteTargetGroup, and the
/// Service asks for another health-check interval, which is in its target
/// group's name: a new group, the old one to delete.
async fn replace_group_failing_its_delete(
    env: &Env,
    cloud: &Cloud,
    created: &Service,
) -> anyhow::Result<(String, Vec<String>)> {
    use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
    let lbs = (cloud.elbv2.describe_load_balancers())
        .names(lb_name(created))
        .send()
        .await?;
    let arn = (lbs.load_balancers().first())
        .and_then(|l| l.load_balancer_arn())
        .unwrap_or_default()
        .to_string();
    let old = group_names(&cloud.elbv2, Some(&arn)).await?;
    assert_eq!(old.len(), 1, "{old:?}");
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::ServerError(500)).for_action("DeleteTargetGroup"),
    ]);
    let change = serde_json::json!({"metadata": {"annotations": {
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "10"}}});
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let name = created.metadata.name.as_deref().unwrap_or_default();
    services
        .patch(name, &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    Ok((arn, old))
}

/// A replaced target group whose delete AWS keeps failing (a 5xx on every
/// try): once the listener moved to the new group, AWS lists the old one
/// under no load balancer (the proxy links groups as AWS does, not as moto
/// does), so no read of the NLB meets it again. The Service's deletion
/// finds it by its name and tags (one listing of every target group) and
/// deletes it; nothing is left. (The next test: a later sync deletes it.)
#[tokio::test]
async fn a_replaced_group_whose_delete_failed_goes_with_its_service() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({}));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let (arn, old) = replace_group_failing_its_delete(&env, &cloud, &created).await?;
    let behind = || group_names(&cloud.elbv2, Some(&arn));
    eventually("the listener on the new group", WAIT, || async {
        let now = behind().await.ok()?;
        (now.len() == 1 && now != old).then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let client = env.api.client().await?;
    crate::swap::event_note(&client, "web", "SyncLoadBalancerFailed").await?;
    let fired = || env.proxy.fired().iter().map(|(_, n)| n).sum::<u64>();
    let first = fired();
    assert!(first > 0, "the old group's delete was never refused");
    // AWS still refuses: the next sync tries the delete again, last, and
    // its failure fails nothing else (the Service's sync finishes).
    ccm.wait_synced(1, WAIT).await?;
    eventually("the delete tried again", WAIT, || async {
        (fired() > first).then_some(())
    })
    .await?;
    let left = cloud
        .elbv2
        .describe_target_groups()
        .names(&old[0])
        .send()
        .await?;
    assert!(
        left.target_groups()[0].load_balancer_arns().is_empty(),
        "the old group is left, behind no load balancer"
    );

    env.proxy.set_faults(Vec::new());
    services.delete("web", &DeleteParams::default()).await?;
    eventually("Service web gone", WAIT, || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    let tagged = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert!(
        tagged.is_empty(),
        "the old group went with its Service: {tagged:?}"
    );
    env.finish().await
}

/// The same failed delete while the Service lives: AWS answers 5xx to
/// DeleteTargetGroup until the sync has failed on it (its Warning seen),
/// then recovers. The old group is behind no load balancer, so no read
/// finds it; the sync that failed remembers it, and the retry deletes it,
/// with the Service still there, its listener on the new group.
#[tokio::test]
async fn a_replaced_group_whose_delete_failed_is_deleted_by_the_next_sync() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let svc = nlb_service("web", serde_json::json!({}));
    let (created, ccm) = one_node_nlb(&env, &cloud, &svc).await?;
    let client = env.api.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let (arn, old) = replace_group_failing_its_delete(&env, &cloud, &created).await?;
    let note = crate::swap::event_note(&client, "web", "SyncLoadBalancerFailed").await?;
    let fired: u64 = env.proxy.fired().iter().map(|(_, n)| n).sum();
    assert!(fired > 0, "the delete was never refused: {note}");
    let new = group_names(&cloud.elbv2, Some(&arn)).await?;
    assert!(
        new.len() == 1 && new != old,
        "the listener moved first: {new:?}"
    );
    env.proxy.set_faults(Vec::new());

    let all = eventually("the old group deleted by a later sync", WAIT, || async {
        let all = group_names(&cloud.elbv2, None).await.ok()?;
        (!all.contains(&old[0])).then_some(all)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))?;
    assert!(
        services.get_opt("web").await?.is_some(),
        "the Service lives"
    );
    assert_eq!(all, new, "the new group stays, the only one");
    let tagged = cluster_tagged_elbv2(&cloud.elbv2).await?;
    assert_eq!(tagged.len(), 2, "the NLB and its one group: {tagged:?}");
    env.finish().await
}
