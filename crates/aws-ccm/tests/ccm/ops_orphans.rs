//! Issue 20: `aws-ccm orphans` against moto and the API test server: a
//! planted orphan of every kind is found (by the library audit and by the
//! binary, which agree), live resources and resources of others are not,
//! and `--delete --yes` removes exactly the orphans. Issue 43: what carries
//! the cluster tag but is not proven made by the CCM (a kOps cluster's own
//! load balancers, target groups and groups, Terraform's) is listed apart,
//! with why, and never deleted.

use std::collections::BTreeSet;
use std::process::Stdio;

use aws_ccm::ops::orphans::{self, Audit, Kind, LeftAlone, Live, Orphan, RouteScope, Scope};
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

fn ec2_tags(tags: Tags) -> aws_sdk_ec2::types::TagSpecification {
    let mut spec = aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup);
    for (k, v) in tags {
        spec = spec.tags(aws_sdk_ec2::types::Tag::builder().key(*k).value(*v).build());
    }
    spec.build()
}

type Tags<'a> = &'a [(&'a str, &'a str)];

const OWNED: (&str, &str) = ("kubernetes.io/cluster/ccm-test", "owned");
const SHARED: (&str, &str) = ("kubernetes.io/cluster/ccm-test", "shared");
const OTHER: (&str, &str) = ("kubernetes.io/cluster/other", "owned");
/// The CCM's tags on a load balancer or target group it made for
/// default/web (live) or default/gone (an orphan).
const FOR_WEB: Tags = &[OWNED, ("kubernetes.io/service-name", "default/web")];
const FOR_GONE: Tags = &[OWNED, ("kubernetes.io/service-name", "default/gone")];

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
    /// Tagged for the cluster, not made by the CCM: never deleted.
    left_alone: BTreeSet<(Kind, String)>,
}

async fn clb(p: &Planted, name: &str, tags: Tags<'_>) -> anyhow::Result<()> {
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
        .set_tags(Some(tags.iter().map(|(k, v)| tag(k, v)).collect()))
        .send()
        .await?;
    Ok(())
}

async fn group(p: &Planted, name: &str, tags: Tags<'_>) -> anyhow::Result<String> {
    let out = p
        .cloud
        .ec2
        .create_security_group()
        .group_name(name)
        .description("test")
        .vpc_id(&p.cloud.vpc)
        .tag_specifications(ec2_tags(tags))
        .send()
        .await?;
    Ok(out.group_id().unwrap_or_default().to_string())
}

async fn nlb(
    p: &Planted,
    name: &str,
    tg: &str,
    tags: Tags<'_>,
) -> anyhow::Result<(String, String)> {
    let lb = p
        .elbv2
        .create_load_balancer()
        .name(name)
        .r#type(LoadBalancerTypeEnum::Network)
        .subnets(&p.cloud.subnet)
        .set_tags(Some(tags.iter().map(|(k, v)| tag_v2(k, v)).collect()))
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

async fn target_group(p: &Planted, name: &str, tags: Tags<'_>) -> anyhow::Result<String> {
    let tg = p
        .elbv2
        .create_target_group()
        .name(name)
        .protocol(aws_sdk_elasticloadbalancingv2::types::ProtocolEnum::Tcp)
        .port(30080)
        .vpc_id(&p.cloud.vpc)
        .set_tags(Some(tags.iter().map(|(k, v)| tag_v2(k, v)).collect()))
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
    let conf = env.sdk_config().await;
    let mut p = Planted {
        cloud,
        elb: aws_sdk_elasticloadbalancing::Client::new(&conf),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&conf),
        live_name: String::new(),
        node_group: String::new(),
        live_group: String::new(),
        table: String::new(),
        orphans: BTreeSet::new(),
        left_alone: BTreeSet::new(),
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
    clb(&p, &live, FOR_WEB).await?;
    clb(&p, dead_clb, FOR_GONE).await?;
    clb(&p, shared_clb, &[SHARED, FOR_GONE[1]]).await?;
    clb(&p, "a0000000000000000000000000other", &[OTHER]).await?;
    nlb(&p, &live, "k8s-default-web-0000000001", FOR_WEB).await?;
    let (dead_nlb_arn, dead_tg) =
        nlb(&p, dead_nlb, "k8s-default-gone-00000dead0", FOR_GONE).await?;
    let loose_tg = target_group(&p, "k8s-default-gone-000000100e", FOR_GONE).await?;
    target_group(&p, "k8s-other-tg", &[OTHER]).await?;

    p.node_group = group(&p, "nodes", &[OWNED]).await?;
    p.live_group = group(&p, &format!("k8s-elb-{live}"), &[OWNED]).await?;
    let dead_group = group(&p, &format!("k8s-elb-{dead_clb}"), &[OWNED]).await?;
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
        (Kind::LoadBalancerV2, dead_nlb_arn),
        (Kind::TargetGroup, dead_tg),
        (Kind::TargetGroup, loose_tg),
        (Kind::SecurityGroup, dead_group),
        (Kind::Route, format!("{}: 10.244.5.0/24", p.table)),
        (Kind::Route, format!("{}: 10.244.9.0/24", p.table)),
    ]);
    // Tagged for the cluster but not the CCM's: a CLB re-tagged shared, and
    // a node group.
    p.left_alone = BTreeSet::from([
        (Kind::ClassicLoadBalancer, shared_clb.to_string()),
        (Kind::SecurityGroup, p.node_group.clone()),
    ]);
    Ok(p)
}

fn keys(found: &[Orphan]) -> BTreeSet<(Kind, String)> {
    found.iter().map(|o| (o.kind, o.id.clone())).collect()
}

fn left_keys(found: &[LeftAlone]) -> BTreeSet<(Kind, String)> {
    found.iter().map(|l| (l.kind, l.id.clone())).collect()
}

/// (kind, id) of each entry of one section of the tool's JSON.
fn listed(json: &serde_json::Value, section: &str) -> BTreeSet<(String, String)> {
    json[section]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or("").to_string(),
                o["id"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn as_strings(keys: &BTreeSet<(Kind, String)>) -> BTreeSet<(String, String)> {
    keys.iter()
        .map(|(k, id)| (k.as_str().to_string(), id.clone()))
        .collect()
}

/// The library audit over the API test server's Services and Nodes.
async fn audit(env: &Env) -> anyhow::Result<Audit> {
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
    assert_eq!(keys(&found.orphans), p.orphans);
    assert_eq!(left_keys(&found.left_alone), p.left_alone);
    for o in &found.orphans {
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
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(listed(&json, "orphans"), as_strings(&p.orphans));
    assert_eq!(listed(&json, "left_alone"), as_strings(&p.left_alone));

    let (ok, stdout, _) = tool(&env, &[], "").await?;
    assert!(ok);
    assert!(
        stdout.contains("classic-load-balancer a00000000000000000000000000dead1 (age "),
        "{stdout}"
    );
    let (_, left) = stdout
        .split_once("# tagged for this cluster, not made by the CCM: left alone\n")
        .expect("the left-alone section");
    assert!(
        left.contains("classic-load-balancer a00000000000000000000000000dead2 (a00000000000000000000000000dead2): its cluster tag is \"shared\""),
        "{stdout}"
    );
    // orphan audit: this test plants orphans on purpose and asserts them.
    Ok(())
}

#[tokio::test]
async fn orphans_delete_removes_only_the_orphans_in_dependency_order() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let p = plant(&env).await?;

    // Asked and refused: nothing changes.
    let (ok, _, stderr) = tool(&env, &["--delete"], "n\n").await?;
    assert!(!ok, "a refused deletion exits non-zero");
    assert!(stderr.contains("nothing deleted"), "{stderr}");
    assert_eq!(keys(&audit(&env).await?.orphans), p.orphans);

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
    assert_eq!(order.len(), p.orphans.len(), "{stderr}");

    // No orphan is left; what was left alone, live resources and others'
    // are intact.
    let after = audit(&env).await?;
    assert_eq!(keys(&after.orphans), BTreeSet::new());
    assert_eq!(left_keys(&after.left_alone), p.left_alone);
    let shared = p
        .elb
        .describe_load_balancers()
        .load_balancer_names("a00000000000000000000000000dead2")
        .send()
        .await?;
    assert_eq!(shared.load_balancer_descriptions().len(), 1);
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
    // What is left is live or left alone: no orphan.
    env.finish().await
}

/// kOps' `CloudTags(name, false)` for cluster `ccm-test`
/// (kubernetes/kops `pkg/model/context.go`): `KubernetesCluster`, `Name`
/// and the cluster tag `owned`, as its integration test outputs show them
/// on the API and bastion load balancers, target groups and groups.
fn kops_tags(name: &str) -> Vec<(&'static str, String)> {
    vec![
        ("KubernetesCluster", CLUSTER_ID.to_string()),
        ("Name", name.to_string()),
        (OWNED.0, OWNED.1.to_string()),
    ]
}

fn borrowed<'a>(tags: &'a [(&'static str, String)]) -> Vec<(&'a str, &'a str)> {
    tags.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// A kOps cluster's own cluster-tagged resources beside what the CCM left:
/// kOps' API NLB with its target group and the API classic ELB (kOps up to
/// 1.36 made one, named by `awsup.GetResourceName32` as the NLB), the
/// bastion's classic ELB (kOps before its bastion moved to an NLB), their
/// groups `api-elb.<cluster>` and `bastion-elb.<cluster>`, the node and
/// control-plane groups with kOps' rules from those groups, and a
/// Terraform-made load balancer someone tagged with the cluster key. None
/// is an orphan: each is listed as left alone with the part of the proof it
/// failed, and `--delete --yes` sends no delete for any of them (the
/// proxy's recorded calls), while the CCM's own orphans (a classic ELB and
/// its group, an NLB and its target group) are found and deleted.
#[tokio::test]
async fn orphans_leaves_a_kops_clusters_own_load_balancers_alone() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    let conf = env.sdk_config().await;
    let p = Planted {
        cloud,
        elb: aws_sdk_elasticloadbalancing::Client::new(&conf),
        elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&conf),
        live_name: String::new(),
        node_group: String::new(),
        live_group: String::new(),
        table: String::new(),
        orphans: BTreeSet::new(),
        left_alone: BTreeSet::new(),
    };
    // kOps' names for cluster ccm-test (`api-<cluster>-<hash>` and
    // `tcp-<cluster>-<hash>` are GetResourceName32's shape).
    let (api, bastion, api_tg) = (
        "api-ccm-test-vd3t5n",
        "bastion-ccm-test-4grhsv",
        "tcp-ccm-test-vpjolq",
    );
    let api_tags = kops_tags("api.ccm-test");
    clb(&p, api, &borrowed(&api_tags)).await?;
    let (api_nlb, api_tg_arn) = nlb(&p, api, api_tg, &borrowed(&api_tags)).await?;
    // kOps names the target group's Name tag after the group itself.
    p.elbv2
        .add_tags()
        .resource_arns(&api_tg_arn)
        .tags(tag_v2("Name", api_tg))
        .send()
        .await?;
    clb(&p, bastion, &borrowed(&kops_tags("bastion.ccm-test"))).await?;
    let mut kops_groups = Vec::new();
    for name in [
        "api-elb.ccm-test",
        "bastion-elb.ccm-test",
        "nodes.ccm-test",
        "masters.ccm-test",
    ] {
        kops_groups.push(group(&p, name, &borrowed(&kops_tags(name))).await?);
    }
    let [api_elb, bastion_elb, nodes, masters] =
        <[String; 4]>::try_from(kops_groups).map_err(|_| anyhow::anyhow!("four kOps groups"))?;
    // kOps' rules from its load balancers' groups: `tcp-api-cp` (443 from
    // the API ELB's group into the control plane's), `ssh-to-bastion`-like
    // traffic from the bastion ELB's group into the nodes'.
    for (into, from, port) in [(&masters, &api_elb, 443), (&nodes, &bastion_elb, 22)] {
        p.cloud
            .ec2
            .authorize_security_group_ingress()
            .group_id(into)
            .ip_permissions(
                IpPermission::builder()
                    .ip_protocol("tcp")
                    .from_port(port)
                    .to_port(port)
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id(from).build())
                    .build(),
            )
            .send()
            .await?;
    }
    // Terraform's: its default name prefix, the cluster tag and nothing else.
    let terraform = "tf-lb-20261201000000000000000001";
    clb(&p, terraform, &[OWNED]).await?;

    // What the CCM left (its Services are gone), with the tags it writes.
    let (gone_clb, gone_nlb) = (
        "a0000000000000000000000000000901",
        "a00000000000000000000000000009b1",
    );
    clb(&p, gone_clb, FOR_GONE).await?;
    let gone_group = group(&p, &format!("k8s-elb-{gone_clb}"), &[OWNED]).await?;
    let (gone_nlb_arn, gone_tg) =
        nlb(&p, gone_nlb, "k8s-default-gone-0123456789", FOR_GONE).await?;

    let kops_and_terraform = BTreeSet::from([
        (Kind::ClassicLoadBalancer, api.to_string()),
        (Kind::ClassicLoadBalancer, bastion.to_string()),
        (Kind::ClassicLoadBalancer, terraform.to_string()),
        (Kind::LoadBalancerV2, api_nlb.clone()),
        (Kind::TargetGroup, api_tg_arn.clone()),
        (Kind::SecurityGroup, api_elb.clone()),
        (Kind::SecurityGroup, bastion_elb.clone()),
        (Kind::SecurityGroup, nodes.clone()),
        (Kind::SecurityGroup, masters.clone()),
    ]);
    let ccms = BTreeSet::from([
        (Kind::ClassicLoadBalancer, gone_clb.to_string()),
        (Kind::LoadBalancerV2, gone_nlb_arn.clone()),
        (Kind::TargetGroup, gone_tg.clone()),
        (Kind::SecurityGroup, gone_group.clone()),
    ]);

    let found = audit(&env).await?;
    assert_eq!(keys(&found.orphans), ccms);
    assert_eq!(left_keys(&found.left_alone), kops_and_terraform);
    let why = |id: &str| {
        found
            .left_alone
            .iter()
            .find(|l| l.id == id)
            .map(|l| l.why.clone())
            .unwrap_or_default()
    };
    for id in [api, bastion, api_nlb.as_str(), terraform] {
        assert!(
            why(id).starts_with("its name is not \"a\" + a Service UID"),
            "{id}: {}",
            why(id)
        );
    }
    assert!(
        why(&api_tg_arn).starts_with("its name is not k8s-<namespace>-<name>-<hash>"),
        "{}",
        why(&api_tg_arn)
    );
    for id in [&api_elb, &bastion_elb, &nodes, &masters] {
        assert!(
            why(id).contains("k8s-elb-<load balancer name>"),
            "{id}: {}",
            why(id)
        );
    }

    // The tool says the same, in its own section and in JSON.
    let (ok, stdout, stderr) = tool(&env, &["-o", "json"], "").await?;
    assert!(ok, "aws-ccm orphans failed: {stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(listed(&json, "left_alone"), as_strings(&kops_and_terraform));
    assert_eq!(listed(&json, "orphans"), as_strings(&ccms));
    let api_entry = json["left_alone"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["id"] == api && l["kind"] == "classic-load-balancer")
        .cloned()
        .unwrap_or_default();
    assert_eq!(api_entry["name"], api);
    assert_eq!(api_entry["why"], why(api).as_str());

    // Deleting: every delete sent names one of the CCM's orphans, and the
    // kOps and Terraform resources are all still there.
    env.proxy.record_requests(true);
    env.proxy.reset_counts();
    let (ok, _, stderr) = tool(&env, &["--delete", "--yes"], "").await?;
    assert!(ok, "aws-ccm orphans --delete --yes failed: {stderr}");
    let sent = |action: &str, param: &str| -> BTreeSet<String> {
        env.proxy
            .requests(action)
            .iter()
            .filter_map(|c| c.params.get(param).cloned())
            .collect()
    };
    assert_eq!(
        sent("DeleteLoadBalancer", "LoadBalancerName"),
        BTreeSet::from([gone_clb.to_string()])
    );
    assert_eq!(
        sent("DeleteLoadBalancer", "LoadBalancerArn"),
        BTreeSet::from([gone_nlb_arn.clone()])
    );
    assert_eq!(
        sent("DeleteTargetGroup", "TargetGroupArn"),
        BTreeSet::from([gone_tg.clone()])
    );
    assert_eq!(
        sent("DeleteSecurityGroup", "GroupId"),
        BTreeSet::from([gone_group.clone()])
    );
    assert_eq!(env.proxy.requests("RevokeSecurityGroupIngress").len(), 0);
    let calls = env.proxy.calls();
    for (service, action, want) in [
        ("elasticloadbalancing", "DeleteLoadBalancer", 1),
        ("elasticloadbalancingv2", "DeleteLoadBalancer", 1),
        ("elasticloadbalancingv2", "DeleteTargetGroup", 1),
        ("ec2", "DeleteSecurityGroup", 1),
        ("ec2", "RevokeSecurityGroupIngress", 0),
    ] {
        assert_eq!(
            calls.get(service, action).received,
            want,
            "{service}:{action}"
        );
    }

    let after = audit(&env).await?;
    assert_eq!(keys(&after.orphans), BTreeSet::new());
    assert_eq!(left_keys(&after.left_alone), kops_and_terraform);
    let clbs = p.elb.describe_load_balancers().send().await?;
    let clb_names: BTreeSet<&str> = clbs
        .load_balancer_descriptions()
        .iter()
        .filter_map(|l| l.load_balancer_name())
        .collect();
    assert_eq!(clb_names, BTreeSet::from([api, bastion, terraform]));
    let v2 = p.elbv2.describe_load_balancers().send().await?;
    let v2_arns: Vec<&str> = v2
        .load_balancers()
        .iter()
        .filter_map(|l| l.load_balancer_arn())
        .collect();
    assert_eq!(v2_arns, [api_nlb.as_str()]);
    let tgs = p.elbv2.describe_target_groups().send().await?;
    let tg_arns: Vec<&str> = tgs
        .target_groups()
        .iter()
        .filter_map(|t| t.target_group_arn())
        .collect();
    assert_eq!(tg_arns, [api_tg_arn.as_str()]);
    // kOps' rules from its load balancers' groups are still there.
    for (into, from) in [(&masters, &api_elb), (&nodes, &bastion_elb)] {
        let g = p
            .cloud
            .ec2
            .describe_security_groups()
            .group_ids(into)
            .send()
            .await?;
        let sources: Vec<&str> = g.security_groups()[0]
            .ip_permissions()
            .iter()
            .flat_map(|q| q.user_id_group_pairs())
            .filter_map(|pair| pair.group_id())
            .collect();
        assert_eq!(sources, [from.as_str()], "rules of {into}");
    }
    // What is left is kOps' and Terraform's: no orphan.
    env.finish().await
}
