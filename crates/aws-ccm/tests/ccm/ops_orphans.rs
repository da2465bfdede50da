//! Issue 20: `aws-ccm orphans` against moto and the API test server: a
//! planted orphan of every kind is found (by the library audit and by the
//! binary, which agree), live resources and resources of others are not,
//! and `--delete --yes` removes exactly the owned orphans.

use std::collections::BTreeSet;
use std::process::Stdio;

use aws_ccm::ops::orphans::{self, Kind, Live, Orphan, RouteScope, Scope};
use aws_ccm::provider::routes::RouteTableSelector;
use aws_sdk_ec2::types::{IpPermission, IpRange, UserIdGroupPair};
use aws_sdk_elasticloadbalancing::types::Listener as ClbListener;
use aws_sdk_elasticloadbalancingv2::types::{Action, ActionTypeEnum, LoadBalancerTypeEnum};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::PostParams;

use crate::routes::{CLUSTER_CIDR, Cloud, create, node, nodes_api};
use crate::service::lb_service;
use crate::support::*;

pub const TOOL: &str = env!("CARGO_BIN_EXE_aws-ccm");

fn tag(key: &str, value: &str) -> aws_sdk_elasticloadbalancing::types::Tag {
    aws_sdk_elasticloadbalancing::types::Tag::builder()
        .key(key)
        .value(value)
        .build()
        .expect("a tag")
}

fn tag_v2(key: &str, value: &str) -> aws_sdk_elasticloadbalancingv2::types::Tag {
    aws_sdk_elasticloadbalancingv2::types::Tag::builder()
        .key(key)
        .value(value)
        .build()
}

fn ec2_tag(key: &str, value: &str) -> aws_sdk_ec2::types::TagSpecification {
    aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
        .tags(
            aws_sdk_ec2::types::Tag::builder()
                .key(key)
                .value(value)
                .build(),
        )
        .build()
}

const OWNED: (&str, &str) = ("kubernetes.io/cluster/ccm-test", "owned");
const SHARED: (&str, &str) = ("kubernetes.io/cluster/ccm-test", "shared");
const OTHER: (&str, &str) = ("kubernetes.io/cluster/other", "owned");

/// What was planted: the orphans expected, by (kind, id).
struct Planted {
    cloud: Cloud,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    live_name: String,
    node_group: String,
    live_group: String,
    table: String,
    orphans: BTreeSet<(Kind, String)>,
    /// The orphans not tagged owned (kept by --delete).
    shared: BTreeSet<(Kind, String)>,
}

async fn clb(p: &Planted, name: &str, tags: (&str, &str)) -> anyhow::Result<()> {
    p.elb
        .create_load_balancer()
        .load_balancer_name(name)
        .listeners(
            ClbListener::builder()
                .protocol("TCP")
                .load_balancer_port(80)
                .instance_port(30080)
                .build()?,
        )
        .subnets(&p.cloud.subnet)
        .tags(tag(tags.0, tags.1))
        .send()
        .await?;
    Ok(())
}

async fn group(p: &Planted, name: &str, tags: (&str, &str)) -> anyhow::Result<String> {
    let out = p
        .cloud
        .ec2
        .create_security_group()
        .group_name(name)
        .description("test")
        .vpc_id(&p.cloud.vpc)
        .tag_specifications(ec2_tag(tags.0, tags.1))
        .send()
        .await?;
    Ok(out.group_id().unwrap_or_default().to_string())
}

async fn nlb(
    p: &Planted,
    name: &str,
    tg: &str,
    tags: (&str, &str),
) -> anyhow::Result<(String, String)> {
    let lb = p
        .elbv2
        .create_load_balancer()
        .name(name)
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&p.cloud.subnet)
        .tags(tag_v2(tags.0, tags.1))
        .send()
        .await?;
    let lb_arn = lb.load_balancers()[0]
        .load_balancer_arn()
        .unwrap_or_default()
        .to_string();
    let tg_arn = target_group(p, tg, tags).await?;
    p.elbv2
        .create_listener()
        .load_balancer_arn(&lb_arn)
        .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
        .port(80)
        .default_actions(
            Action::builder()
                .r#type(ActionTypeEnum::Forward)
                .target_group_arn(&tg_arn)
                .build(),
        )
        .send()
        .await?;
    Ok((lb_arn, tg_arn))
}

async fn target_group(p: &Planted, name: &str, tags: (&str, &str)) -> anyhow::Result<String> {
    let tg = p
        .elbv2
        .create_target_group()
        .name(name)
        .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
        .port(30080)
        .vpc_id(&p.cloud.vpc)
        .tags(tag_v2(tags.0, tags.1))
        .send()
        .await?;
    Ok(tg.target_groups()[0]
        .target_group_arn()
        .unwrap_or_default()
        .to_string())
}

/// Node group rules: everything from `groups`, and NLB client rules
/// described for each of `nlbs` (one port each).
async fn node_rules(p: &Planted, groups: &[&str], nlbs: &[&str]) -> anyhow::Result<()> {
    let mut perms = Vec::new();
    for g in groups {
        perms.push(
            IpPermission::builder()
                .ip_protocol("-1")
                .user_id_group_pairs(UserIdGroupPair::builder().group_id(*g).build())
                .build(),
        );
    }
    for (i, name) in nlbs.iter().enumerate() {
        perms.push(
            IpPermission::builder()
                .ip_protocol("tcp")
                .from_port(30100 + i as i32)
                .to_port(30100 + i as i32)
                .ip_ranges(
                    IpRange::builder()
                        .cidr_ip("0.0.0.0/0")
                        .description(format!("kubernetes.io/rule/nlb/client={name}"))
                        .build(),
                )
                .build(),
        );
    }
    p.cloud
        .ec2
        .authorize_security_group_ingress()
        .group_id(&p.node_group)
        .set_ip_permissions(Some(perms))
        .send()
        .await?;
    Ok(())
}

/// The live cluster (a LoadBalancer Service, two Nodes with pod CIDRs) and
/// one orphan of every kind next to live resources and another cluster's.
async fn plant(env: &Env) -> anyhow::Result<Planted> {
    let cloud = Cloud::new(env).await?;
    let conf = env.moto.sdk_config().await;
    let mut p = Planted {
        cloud,
        elb: aws_sdk_elasticloadbalancing::Client::new(&conf),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&conf),
        live_name: String::new(),
        node_group: String::new(),
        live_group: String::new(),
        table: String::new(),
        orphans: BTreeSet::new(),
        shared: BTreeSet::new(),
    };
    let services: Api<Service> = Api::namespaced(env.api.client().await?, "default");
    let svc = services
        .create(
            &PostParams::default(),
            &lb_service("web", serde_json::json!({})),
        )
        .await?;
    p.live_name =
        aws_ccm::aws::elb::load_balancer_name(svc.metadata.uid.as_deref().unwrap_or_default());
    let ids = p.cloud.instances(3).await?;
    let nodes = nodes_api(env).await?;
    create(&nodes, node("n1", Some(&ids[0]), &["10.244.1.0/24"])).await?;
    create(&nodes, node("n2", Some(&ids[1]), &["10.244.2.0/24"])).await?;

    let live = p.live_name.clone();
    let (dead_clb, shared_clb, dead_nlb) = (
        "a00000000000000000000000000dead1",
        "a00000000000000000000000000dead2",
        "a00000000000000000000000000dead3",
    );
    clb(&p, &live, OWNED).await?;
    clb(&p, dead_clb, OWNED).await?;
    clb(&p, shared_clb, SHARED).await?;
    clb(&p, "a0000000000000000000000000other", OTHER).await?;
    nlb(&p, &live, "k8s-default-web-live", OWNED).await?;
    let (dead_nlb_arn, dead_tg) = nlb(&p, dead_nlb, "k8s-default-gone-dead", OWNED).await?;
    let loose_tg = target_group(&p, "k8s-default-gone-loose", OWNED).await?;
    target_group(&p, "k8s-other-tg", OTHER).await?;

    p.node_group = group(&p, "nodes", OWNED).await?;
    p.live_group = group(&p, &format!("k8s-elb-{live}"), OWNED).await?;
    let dead_group = group(&p, &format!("k8s-elb-{dead_clb}"), OWNED).await?;
    node_rules(&p, &[&p.live_group, &dead_group], &[&live, dead_nlb]).await?;

    p.table = p.cloud.route_table(true).await?;
    for (dest, at) in [
        ("10.244.1.0/24", 0),
        ("10.244.2.0/24", 1),
        ("10.244.5.0/24", 1),
        ("10.244.9.0/24", 2),
        ("192.168.0.0/24", 2),
    ] {
        p.cloud.instance_route(&p.table, dest, &ids[at]).await?;
    }
    p.cloud
        .ec2
        .terminate_instances()
        .instance_ids(&ids[2])
        .send()
        .await?;

    let ng = p.node_group.clone();
    p.orphans = BTreeSet::from([
        (Kind::NodeIngressRule, format!("{ng}: from {dead_group}")),
        (Kind::NodeIngressRule, format!("{ng}: 1 NLB rule(s)")),
        (Kind::ClassicLoadBalancer, dead_clb.to_string()),
        (Kind::ClassicLoadBalancer, shared_clb.to_string()),
        (Kind::LoadBalancerV2, dead_nlb_arn),
        (Kind::TargetGroup, dead_tg),
        (Kind::TargetGroup, loose_tg),
        (Kind::SecurityGroup, dead_group),
        (Kind::Route, format!("{}: 10.244.5.0/24", p.table)),
        (Kind::Route, format!("{}: 10.244.9.0/24", p.table)),
    ]);
    p.shared = BTreeSet::from([(Kind::ClassicLoadBalancer, shared_clb.to_string())]);
    Ok(p)
}

fn keys(found: &[Orphan]) -> BTreeSet<(Kind, String)> {
    found.iter().map(|o| (o.kind, o.id.clone())).collect()
}

/// The library audit over the API test server's Services and Nodes.
async fn audit(env: &Env) -> anyhow::Result<Vec<Orphan>> {
    let live = Live::read(&env.api.client().await?).await?;
    let scope = Scope {
        cluster_id: CLUSTER_ID.into(),
        routes: Some(RouteScope {
            selector: RouteTableSelector {
                route_table_id: None,
                vpc_id: None,
                cluster_id: CLUSTER_ID.into(),
            },
            cluster_cidrs: aws_ccm::options::cidrs::ClusterCidrs::parse(CLUSTER_CIDR, "test")?,
        }),
    };
    orphans::find(&aws_client(env).await, &live, &scope).await
}

/// Runs `aws-ccm orphans` with the CCM's flags; (exit success, stdout, stderr).
async fn tool(env: &Env, extra: &[&str], stdin: &str) -> anyhow::Result<(bool, String, String)> {
    run_tool(env, "orphans", extra, stdin).await
}

/// Runs `aws-ccm <subcommand>` with the CCM's flags for `env` and `extra`,
/// AWS reached through `env`'s pass-through proxy; (exit success, stdout, stderr).
pub async fn run_tool(
    env: &Env,
    subcommand: &str,
    extra: &[&str],
    stdin: &str,
) -> anyhow::Result<(bool, String, String)> {
    run_tool_as(env, &env.kubeconfig, subcommand, extra, stdin).await
}

/// [`run_tool`] with another kubeconfig (an operator's, say).
pub async fn run_tool_as(
    env: &Env,
    kubeconfig: &std::path::Path,
    subcommand: &str,
    extra: &[&str],
    stdin: &str,
) -> anyhow::Result<(bool, String, String)> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new(TOOL);
    cmd.arg(subcommand)
        .arg(format!("--cloud-config={}", env.cloud_conf.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--cluster-cidr={CLUSTER_CIDR}"))
        .args(extra)
        .envs(env.aws_env())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn()?;
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn orphans_finds_a_planted_orphan_of_every_kind_and_the_tool_agrees() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let p = plant(&env).await?;
    let found = audit(&env).await?;
    assert_eq!(keys(&found), p.orphans);
    let not_owned: BTreeSet<_> = keys(
        &found
            .iter()
            .filter(|o| !o.owned)
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert_eq!(not_owned, p.shared);
    for o in &found {
        assert!(!o.recognised.is_empty(), "{o:?} says how it was recognised");
        let has_age = matches!(o.kind, Kind::ClassicLoadBalancer | Kind::LoadBalancerV2);
        assert_eq!(
            o.created.is_some(),
            has_age,
            "{o:?}: age where AWS gives one"
        );
    }

    let (ok, stdout, stderr) = tool(&env, &["-o", "json"], "").await?;
    assert!(ok, "aws-ccm orphans failed: {stderr}");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&stdout)?;
    let listed: BTreeSet<(String, String)> = listed
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or("").to_string(),
                o["id"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    let expected: BTreeSet<(String, String)> = p
        .orphans
        .iter()
        .map(|(k, id)| (k.as_str().to_string(), id.clone()))
        .collect();
    assert_eq!(listed, expected);

    let (ok, stdout, _) = tool(&env, &[], "").await?;
    assert!(ok);
    assert!(
        stdout.contains("classic-load-balancer a00000000000000000000000000dead2 (age "),
        "{stdout}"
    );
    assert!(stdout.contains("shared)"), "{stdout}");
    // orphan audit: this test plants orphans on purpose and asserts them.
    Ok(())
}

#[tokio::test]
async fn orphans_delete_removes_only_the_owned_orphans_in_dependency_order() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let p = plant(&env).await?;

    // Asked and refused: nothing changes.
    let (ok, _, stderr) = tool(&env, &["--delete"], "n\n").await?;
    assert!(!ok, "a refused deletion exits non-zero");
    assert!(stderr.contains("nothing deleted"), "{stderr}");
    assert_eq!(keys(&audit(&env).await?), p.orphans);

    let (ok, _, stderr) = tool(&env, &["--delete", "--yes"], "").await?;
    assert!(ok, "aws-ccm orphans --delete --yes failed: {stderr}");
    let order: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("deleted "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut sorted = order.clone();
    let rank = |k: &&str| {
        [
            "node-ingress-rule",
            "classic-load-balancer",
            "load-balancer-v2",
            "target-group",
            "security-group",
            "route",
        ]
        .iter()
        .position(|x| x == k)
    };
    sorted.sort_by_key(rank);
    assert_eq!(order, sorted, "deleted in dependency order: {stderr}");
    assert_eq!(order.len(), p.orphans.len() - p.shared.len(), "{stderr}");
    assert!(
        stderr.contains(
            "kept classic-load-balancer a00000000000000000000000000dead2 (not tagged owned)"
        ),
        "{stderr}"
    );

    // Only the shared orphan is left; live resources and others' are intact.
    assert_eq!(keys(&audit(&env).await?), p.shared);
    let live_clb = p
        .elb
        .describe_load_balancers()
        .load_balancer_names(&p.live_name)
        .send()
        .await?;
    assert_eq!(live_clb.load_balancer_descriptions().len(), 1);
    let other = p
        .elb
        .describe_load_balancers()
        .load_balancer_names("a0000000000000000000000000other")
        .send()
        .await?;
    assert_eq!(other.load_balancer_descriptions().len(), 1);
    let node_group = p
        .cloud
        .ec2
        .describe_security_groups()
        .group_ids(&p.node_group)
        .send()
        .await?;
    let perms = node_group.security_groups()[0].ip_permissions();
    let from: Vec<&str> = perms
        .iter()
        .flat_map(|q| q.user_id_group_pairs())
        .filter_map(|g| g.group_id())
        .collect();
    assert_eq!(from, vec![p.live_group.as_str()]);
    let described: Vec<&str> = perms
        .iter()
        .flat_map(|q| q.ip_ranges())
        .filter_map(|r| r.description())
        .collect();
    assert_eq!(
        described,
        vec![format!("kubernetes.io/rule/nlb/client={}", p.live_name).as_str()]
    );
    let routes: Vec<String> = p
        .cloud
        .routes(&p.table)
        .await?
        .into_keys()
        .filter(|d| !d.contains(':'))
        .collect();
    assert_eq!(
        routes,
        [
            "10.0.0.0/16",
            "10.244.1.0/24",
            "10.244.2.0/24",
            "192.168.0.0/24"
        ]
    );
    // orphan audit: the shared orphans planted here stay on purpose.
    Ok(())
}
