//! Swapping the Go CCM for this one (issue 17): AWS and the API test server
//! seeded exactly as the Go CCM leaves them, drifted annotations included,
//! then this binary started behind the fault proxy; the mutating calls it
//! makes are counted there.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_ec2::types::{Filter, IpPermission, IpRange, ResourceType};
use aws_sdk_elasticloadbalancingv2 as elbv2;
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::PostParams;

use crate::service::node;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(60);

fn nlb_service(name: &str, annotations: serde_json::Value) -> Service {
    let mut a = annotations;
    a["service.beta.kubernetes.io/aws-load-balancer-type"] = "nlb".into();
    plain_service(name, a)
}

fn plain_service(name: &str, annotations: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn lb_name(svc: &Service) -> String {
    let uid = svc.metadata.uid.clone().unwrap();
    format!("a{}", uid.replace('-', ""))[..32].to_string()
}

fn node_port(svc: &Service) -> i32 {
    svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0]
        .node_port
        .unwrap()
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

/// The note of the first event with `reason` about Service `name`.
pub(crate) async fn event_note(
    client: &kube::Client,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let e = eventually(&format!("a {reason} event for {name}"), WAIT, || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(name)
            })
    })
    .await?;
    Ok(e.message.unwrap_or_default())
}

/// Upstream's `buildTargetGroupName` for a TCP port with the default TCP
/// health check, computed here from its inputs.
pub(crate) fn go_target_group_name(svc: &str, node_port: i32) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    for part in [
        CLUSTER_ID.to_string(),
        "default".into(),
        svc.to_string(),
        "80".into(),
        node_port.to_string(),
        "TCP".into(),
        "instance".into(),
        "TCP".into(),
        "30".into(),
    ] {
        h.update(part.as_bytes());
    }
    format!("k8s-default-{svc}-{}", &hex::encode(h.finalize())[..10])
}

/// Upstream's `GetSecurityGroupNameForNLB` with the default `--cluster-name`.
pub fn go_managed_group_name(svc: &Service) -> String {
    use sha2::Digest;
    let name = svc.metadata.name.clone().unwrap();
    let mut h = sha2::Sha256::new();
    for part in [
        "kubernetes",
        &name,
        "default",
        svc.metadata.uid.as_deref().unwrap(),
    ] {
        h.update(part.as_bytes());
    }
    format!("k8s-default-{name}-{}", &hex::encode(h.finalize())[..10])
}

/// What the Go CCM leaves for an NLB Service: the internet-facing NLB in
/// `subnet` (with `groups`, if any), its target group with every instance,
/// the listener, and the node group's client and MTU rules (no health rule:
/// the client rule from 0.0.0.0/0 covers it). Returns the target group ARN.
pub(crate) async fn go_made_nlb(
    seeded: &Seeded,
    svc: &Service,
    groups: &[String],
) -> anyhow::Result<String> {
    let c = elbv2::Client::new(&seeded.conf);
    let key = format!("default/{}", svc.metadata.name.as_deref().unwrap());
    let name = lb_name(svc);
    let np = node_port(svc);
    let go_tags: Vec<elbv2::types::Tag> = [
        (
            format!("kubernetes.io/cluster/{CLUSTER_ID}"),
            "owned".to_string(),
        ),
        ("kubernetes.io/service-name".into(), key),
    ]
    .into_iter()
    .map(|(k, v)| elbv2::types::Tag::builder().key(k).value(v).build())
    .collect();
    let lb = c
        .create_load_balancer()
        .name(&name)
        .r#type(elbv2::types::LoadBalancerTypeEnum::Network)
        .subnets(&seeded.subnet)
        .set_security_groups((!groups.is_empty()).then(|| groups.to_vec()))
        .set_tags(Some(go_tags.clone()))
        .send()
        .await?;
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap()
        .to_string();
    let tg = c
        .create_target_group()
        .name(go_target_group_name(
            svc.metadata.name.as_deref().unwrap(),
            np,
        ))
        .vpc_id(&seeded.vpc)
        .port(np)
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
    let targets = seeded
        .instances
        .iter()
        .map(|i| {
            elbv2::types::TargetDescription::builder()
                .id(i)
                .port(np)
                .build()
        })
        .collect();
    c.register_targets()
        .target_group_arn(&tg_arn)
        .set_targets(Some(targets))
        .send()
        .await?;
    c.create_listener()
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
    let range = |desc: String| {
        IpRange::builder()
            .cidr_ip("0.0.0.0/0")
            .description(desc)
            .build()
    };
    seeded
        .ec2
        .authorize_security_group_ingress()
        .group_id(&seeded.node_group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(np)
                .to_port(np)
                .ip_ranges(range(format!("kubernetes.io/rule/nlb/client={name}")))
                .build(),
        )
        .send()
        .await?;
    // One MTU rule per range serves every NLB of the group.
    let mtu = seeded
        .ec2
        .authorize_security_group_ingress()
        .group_id(&seeded.node_group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(range("kubernetes.io/rule/nlb/mtu".into()))
                .build(),
        )
        .send()
        .await;
    if let Err(e) = mtu {
        let code = e.as_service_error().and_then(|e| e.meta().code());
        anyhow::ensure!(code == Some("InvalidPermission.Duplicate"), "{e:?}");
    }
    Ok(tg_arn)
}

/// Nodes for every seeded instance, then the Services; returns them as created.
pub(crate) async fn nodes_and_services(
    env: &Env,
    seeded: &Seeded,
    services: &[Service],
) -> anyhow::Result<Vec<Service>> {
    let client = env.api.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, id) in seeded.instances.iter().enumerate() {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i}"), id))
            .await?;
    }
    let api: Api<Service> = Api::namespaced(client, "default");
    let mut out = Vec::new();
    for s in services {
        out.push(api.create(&PostParams::default(), s).await?);
    }
    Ok(out)
}

pub(crate) async fn wait_hostname(env: &Env, ccm: &Ccm, name: &str) -> anyhow::Result<String> {
    let api: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    eventually(&format!("a hostname for {name}"), WAIT, || async {
        api.get(name).await.ok().as_ref().and_then(hostname)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs()))
}

/// The Go CCM read `internal` only at creation, ignored `security-groups`
/// outside `NLBSecurityGroupMode = Managed`, and refuses type changes. A
/// Go-made NLB under such drifted annotations is neither recreated nor
/// regrouped nor converted: zero mutating calls, and Warning events that
/// say what differs and how to apply it.
#[tokio::test]
async fn go_made_nlbs_with_drifted_annotations_are_left_with_a_warning() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let user_group = seeded.node_group_named("users-own").await?;
    let svcs = nodes_and_services(
        &env,
        &seeded,
        &[
            nlb_service(
                "web",
                serde_json::json!({
                    "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
                    "service.beta.kubernetes.io/aws-load-balancer-subnets": seeded.subnet,
                    "service.beta.kubernetes.io/aws-load-balancer-security-groups": user_group,
                }),
            ),
            // The type annotation removed since the Go CCM made its NLB.
            plain_service("typed", serde_json::json!({})),
        ],
    )
    .await?;
    for s in &svcs {
        go_made_nlb(&seeded, s, &[]).await?;
    }

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    let client = env.api.client().await?;
    let note = event_note(&client, "web", "LoadBalancerSettingNotApplied").await?;
    assert!(
        note.contains("its scheme is internet-facing and the Service asks for internal")
            && note.contains("aws-ccm did not create this load balancer"),
        "{note}"
    );
    let refused = event_note(&client, "typed", "SyncLoadBalancerFailed").await?;
    assert!(
        refused.contains("has a Network Load Balancer")
            && refused
                .contains("set service.beta.kubernetes.io/aws-load-balancer-type back to nlb"),
        "{refused}"
    );
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    // The refused value stays on its Service as a condition (the NLB's
    // ensure refuses it: InvalidValue); the Service whose sync finished
    // gets no status condition at all.
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let condition_of = crate::service::sync_condition;
    let typed = eventually("the refused Service's condition", WAIT, || async {
        condition_of(services.get("typed").await.ok()?)
    })
    .await?;
    assert_eq!(
        (typed.status.as_str(), typed.reason.as_str()),
        ("False", "InvalidValue")
    );
    assert!(condition_of(services.get("web").await?).is_none());
    let c = elbv2::Client::new(&seeded.conf);
    let lbs = c.describe_load_balancers().send().await?;
    assert_eq!(lbs.load_balancers().len(), 2);
    for lb in lbs.load_balancers() {
        // (moto leaves out the default scheme)
        assert_ne!(
            lb.scheme(),
            Some(&elbv2::types::LoadBalancerSchemeEnum::Internal)
        );
        assert!(lb.security_groups().is_empty());
    }
    env.finish().await
}

/// `NLBSecurityGroupMode = Managed`: the Go CCM's managed group (upstream's
/// name and description, cluster tag only, listener and ICMP rules) on its
/// NLB is adopted: no group created, none deleted, nothing else changed.
#[tokio::test]
async fn the_go_ccms_managed_nlb_group_is_adopted() -> anyhow::Result<()> {
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    ))
    .await?;
    let seeded = seed_cluster(&env, 1).await?;
    let svcs =
        nodes_and_services(&env, &seeded, &[nlb_service("web", serde_json::json!({}))]).await?;
    let group_name = go_managed_group_name(&svcs[0]);
    let ct = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let group = seeded
        .ec2
        .create_security_group()
        .group_name(&group_name)
        .description("[k8s] Managed SecurityGroup for LoadBalancer")
        .vpc_id(&seeded.vpc)
        .tag_specifications(tags(ResourceType::SecurityGroup, &[(&ct, "owned")]))
        .send()
        .await?
        .group_id()
        .unwrap()
        .to_string();
    let anywhere = IpRange::builder().cidr_ip("0.0.0.0/0").build();
    seeded
        .ec2
        .authorize_security_group_ingress()
        .group_id(&group)
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(80)
                .to_port(80)
                .ip_ranges(anywhere.clone())
                .build(),
        )
        .ip_permissions(
            IpPermission::builder()
                .ip_protocol("icmp")
                .from_port(3)
                .to_port(4)
                .ip_ranges(anywhere)
                .build(),
        )
        .send()
        .await?;
    go_made_nlb(&seeded, &svcs[0], std::slice::from_ref(&group)).await?;

    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "web").await?;
    // The hostname is written after the whole sync; nothing it did may mutate.
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    let lbs = elbv2::Client::new(&seeded.conf)
        .describe_load_balancers()
        .send()
        .await?;
    assert_eq!(lbs.load_balancers()[0].security_groups(), [group.as_str()]);
    let named = seeded
        .ec2
        .describe_security_groups()
        .filters(Filter::builder().name("vpc-id").values(&seeded.vpc).build())
        .send()
        .await?;
    let k8s: Vec<&str> = named
        .security_groups()
        .iter()
        .filter_map(|g| g.group_name())
        .filter(|n| n.starts_with("k8s-"))
        .collect();
    assert_eq!(k8s, vec![group_name.as_str()]);
    env.finish().await
}

/// A VPC whose subnets carry no cluster and no role tags, as the Go CCM
/// tolerates (`findSubnets` keeps the subnets tagged for no cluster): an
/// internet-facing Classic ELB and NLB land in its public subnets, one per
/// zone, and never in the private one.
#[tokio::test]
async fn an_untagged_vpc_takes_load_balancers_as_the_go_ccm_does() -> anyhow::Result<()> {
    use aws_sdk_ec2::types::Tag;
    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 2).await?;
    let ec2 = &seeded.ec2;
    // The seeded subnet (us-east-1a, public) loses its cluster and role tags.
    ec2.delete_tags()
        .resources(&seeded.subnet)
        .tags(
            Tag::builder()
                .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
                .build(),
        )
        .tags(Tag::builder().key("kubernetes.io/role/elb").build())
        .send()
        .await?;
    let vpc = seeded.vpc.as_str();
    let subnet = |cidr: &'static str, zone: &'static str| async move {
        let out = ec2
            .create_subnet()
            .vpc_id(vpc)
            .cidr_block(cidr)
            .availability_zone(zone)
            .send()
            .await?;
        anyhow::Ok(
            out.subnet()
                .and_then(|s| s.subnet_id())
                .unwrap()
                .to_string(),
        )
    };
    // Public through the VPC's main table (it routes to the gateway).
    let public_b = subnet("10.0.2.0/24", "us-east-1b").await?;
    // Private: a table of its own without a gateway.
    let private_c = subnet("10.0.3.0/24", "us-east-1c").await?;
    let table = ec2.create_route_table().vpc_id(&seeded.vpc).send().await?;
    ec2.associate_route_table()
        .route_table_id(
            table
                .route_table()
                .and_then(|t| t.route_table_id())
                .unwrap(),
        )
        .subnet_id(&private_c)
        .send()
        .await?;
    let untagged = ec2
        .describe_subnets()
        .filters(Filter::builder().name("vpc-id").values(&seeded.vpc).build())
        .send()
        .await?;
    assert!(
        (untagged.subnets().iter()).all(|s| s
            .tags()
            .iter()
            .all(|t| !t.key().unwrap_or_default().starts_with("kubernetes.io/"))),
        "the VPC carries no cluster or role tag"
    );

    nodes_and_services(
        &env,
        &seeded,
        &[
            plain_service("classic", serde_json::json!({})),
            nlb_service("network", serde_json::json!({})),
        ],
    )
    .await?;
    let (_proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    wait_hostname(&env, &ccm, "classic").await?;
    wait_hostname(&env, &ccm, "network").await?;

    let mut want = vec![seeded.subnet.clone(), public_b];
    want.sort();
    let elb = aws_sdk_elasticloadbalancing::Client::new(&seeded.conf);
    let classic = elb.describe_load_balancers().send().await?;
    let classic = classic.load_balancer_descriptions();
    assert_eq!(classic.len(), 1);
    let mut got = classic[0].subnets().to_vec();
    got.sort();
    assert_eq!(got, want, "Classic ELB in the public subnets, one per zone");
    let v2 = elbv2::Client::new(&seeded.conf);
    let network = v2.describe_load_balancers().send().await?;
    let mut got: Vec<String> = (network.load_balancers().iter())
        .flat_map(|lb| lb.availability_zones())
        .filter_map(|z| z.subnet_id().map(str::to_string))
        .collect();
    got.sort();
    assert_eq!(got, want, "NLB in the public subnets, one per zone");
    env.finish().await
}
