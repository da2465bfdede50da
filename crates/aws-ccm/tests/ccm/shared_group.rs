//! `NLBNodeIngress = SharedBackendGroup` on a live cluster: two
//! Managed-mode NLBs backed by one node group move from the Go CCM's CIDR
//! rules onto the one rule admitting the cluster's shared backend group,
//! and back, while a sampler reads AWS between (and during) the syncs: at
//! no sample does the node group admit fewer of either NLB's ports (by a
//! CIDR rule on the port, or a rule from a group that NLB carries).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use crate::nlb::{
    Cloud, all_target_groups, lb_name, nlb_service, node_group_rules, node_n0, seed, targets_of,
};
use crate::ops_orphans::run_tool;
use crate::service::node;
use crate::support::*;

const WAIT: Duration = Duration::from_secs(90);
const GROUP_RULE: &str = "aws-ccm/rule/nlb/from-group";
const CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client=";

/// What the sampler saw.
#[derive(Default, Debug)]
struct Samples {
    /// Samples taken with the NLBs' groups stable across the rules read.
    judged: usize,
    /// Ports admitted through a group rule / through a CIDR rule.
    by_group: usize,
    by_cidr: usize,
    /// Each sample where an NLB's port was not admitted.
    violations: Vec<String>,
}

/// The security groups each NLB carries, by name.
async fn carried(cloud: &Cloud, names: &[String]) -> Option<BTreeMap<String, Vec<String>>> {
    let o = (cloud.elbv2.describe_load_balancers())
        .set_names(Some(names.to_vec()))
        .send()
        .await
        .ok()?;
    let lbs = o.load_balancers();
    (lbs.len() == names.len()).then(|| {
        lbs.iter()
            .map(|l| {
                let name = l.load_balancer_name().unwrap_or_default().to_string();
                (name, l.security_groups().to_vec())
            })
            .collect()
    })
}

/// The ports each NLB forwards to (its target groups' ports), from AWS.
async fn nlb_ports(cloud: &Cloud, names: &[String]) -> anyhow::Result<BTreeMap<String, Vec<i32>>> {
    let mut out = BTreeMap::new();
    for name in names {
        let lb = cloud
            .elbv2
            .describe_load_balancers()
            .names(name)
            .send()
            .await?;
        let arn = (lb.load_balancers().first())
            .and_then(|l| l.load_balancer_arn())
            .unwrap_or_default()
            .to_string();
        let tgs = (cloud.elbv2.describe_target_groups())
            .load_balancer_arn(arn)
            .send()
            .await?;
        let ports: Vec<i32> = tgs
            .target_groups()
            .iter()
            .filter_map(|t| t.port())
            .collect();
        anyhow::ensure!(!ports.is_empty(), "NLB {name} has no target group");
        out.insert(name.clone(), ports);
    }
    Ok(out)
}

/// Samples until `stop`: NLB groups, node-group rules, NLB groups again;
/// judged only when the two group reads agree.
async fn sample(
    cloud: Cloud,
    names: Vec<String>,
    ports: BTreeMap<String, Vec<i32>>,
    stop: Arc<AtomicBool>,
) -> Samples {
    let mut s = Samples::default();
    while !stop.load(Ordering::Relaxed) {
        let before = carried(&cloud, &names).await;
        let rules = node_group_rules(&cloud.ec2, &cloud.node_group).await.ok();
        let after = carried(&cloud, &names).await;
        let (Some(groups), Some(rules), true) = (before.clone(), rules, before == after) else {
            continue;
        };
        s.judged += 1;
        for (name, lb_ports) in &ports {
            let carries = &groups[name];
            for port in lb_ports {
                let by_cidr = rules
                    .iter()
                    .any(|r| r.0 == "tcp" && r.1 == *port && r.2 == "0.0.0.0/0");
                let by_group = rules.iter().any(|r| r.0 == "-1" && carries.contains(&r.2));
                s.by_cidr += usize::from(by_cidr);
                s.by_group += usize::from(by_group);
                if !by_cidr && !by_group {
                    s.violations.push(format!(
                        "NLB {name} port {port} not admitted; it carries {carries:?}; rules {rules:?}"
                    ));
                }
            }
        }
    }
    s
}

/// The shared group of the cluster, by its name: (ID, tags).
async fn shared_group(cloud: &Cloud) -> Option<(String, BTreeMap<String, String>)> {
    let name = format!("aws-ccm-backend-{CLUSTER_ID}");
    let o = (cloud.ec2.describe_security_groups())
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("group-name")
                .values(name)
                .build(),
        )
        .send()
        .await
        .ok()?;
    let g = o.security_groups().first()?;
    let tags = (g.tags().iter())
        .map(|t| {
            let k = t.key().unwrap_or_default().to_string();
            (k, t.value().unwrap_or_default().to_string())
        })
        .collect();
    Some((g.group_id()?.to_string(), tags))
}

/// cloud.conf with `NLBSecurityGroupMode = Managed`, without and with
/// `NLBNodeIngress = SharedBackendGroup`.
fn confs() -> (String, String) {
    let managed = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\n"
    );
    let shared = format!("{managed}NLBNodeIngress = SharedBackendGroup\n");
    (managed, shared)
}

#[tokio::test]
async fn nlbs_move_onto_the_shared_backend_group_and_back_never_admitting_fewer_ports()
-> anyhow::Result<()> {
    let (managed, shared_mode) = confs();
    let env = Env::start_with_conf(&managed).await?;
    let cloud = seed(&env, 1).await?;
    let (_client, services) = node_n0(&env, &cloud).await?;
    let mut names = Vec::new();
    for svc in ["one", "two"] {
        let created = services
            .create(
                &PostParams::default(),
                &nlb_service(svc, serde_json::json!({})),
            )
            .await?;
        names.push(lb_name(&created));
    }
    let ours = |d: &str| names.iter().any(|n| d == format!("{CLIENT_RULE}{n}"));
    let ours_or_group = |d: &str| ours(d) || d == GROUP_RULE;
    let rules = || async { node_group_rules(&cloud.ec2, &cloud.node_group).await.ok() };
    let fail = |ccm: &Ccm| {
        let logs = ccm.logs();
        move |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{logs}")
    };

    // The Go CCM's state: each NLB's client rule from anywhere (and the MTU rule).
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let go_rules = eventually("both NLBs and their CIDR node rules", WAIT, || async {
        carried(&cloud, &names).await?;
        let r = rules().await?;
        let cidr: BTreeSet<_> = r.into_iter().filter(|r| ours_or_group(&r.3)).collect();
        (cidr.len() == 2).then_some(cidr)
    })
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);
    let own_groups = carried(&cloud, &names).await.unwrap_or_default();
    assert!(own_groups.values().all(|g| g.len() == 1), "{own_groups:?}");
    assert!(
        shared_group(&cloud).await.is_none(),
        "made before it was asked for"
    );
    let ports = nlb_ports(&cloud, &names).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample(cloud.clone(), names.clone(), ports, stop.clone()));

    // Into the mode: both NLBs carry the shared group after their own, and
    // the node group holds its one rule instead of the CIDR rules.
    std::fs::write(&env.cloud_conf, &shared_mode)?;
    // `aws-ccm plan` shows it first: the group, each NLB taking it, the
    // node-group rule in and the CIDR rules out.
    let (ok, text, err) = run_tool(&env, "plan", &["--controllers=service"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    assert_eq!(
        text.matches("+ the cluster's shared backend security group")
            .count(),
        2,
        "{text}"
    );
    assert_eq!(
        text.matches("~ set the NLB's security groups (2)").count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("rule(s) in node group") && text.contains("rule(s) of node group"),
        "{text}"
    );
    assert!(
        shared_group(&cloud).await.is_none(),
        "the plan made the group"
    );
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let (shared, tags) = eventually("the shared group and its one rule", WAIT, || async {
        let (id, tags) = shared_group(&cloud).await?;
        let groups = carried(&cloud, &names).await?;
        let all_carry =
            (groups.iter()).all(|(n, g)| *g == vec![own_groups[n][0].clone(), id.clone()]);
        let want = BTreeSet::from([("-1".to_string(), -1, id.clone(), GROUP_RULE.to_string())]);
        let r: BTreeSet<_> = rules()
            .await?
            .into_iter()
            .filter(|r| ours_or_group(&r.3))
            .collect();
        (all_carry && r == want).then_some((id, tags))
    })
    .await
    .map_err(fail(&ccm))?;
    assert_eq!(
        tags.get(&format!("kubernetes.io/cluster/{CLUSTER_ID}"))
            .map(String::as_str),
        Some("owned")
    );
    assert_eq!(
        tags.get("aws-ccm/shared-backend-group").map(String::as_str),
        Some(CLUSTER_ID)
    );
    drop(ccm);

    // Converged: a restart in the mode writes nothing.
    let (proxy, ccm) = env.start_counted_ccm(&["--controllers=service"]).await?;
    let addr = ccm.https_addr().await?;
    metrics_with(
        &addr,
        &["service_controller_loadbalancer_sync_total 2"],
        WAIT,
    )
    .await
    .map_err(fail(&ccm))?;
    assert_eq!(mutations(&proxy), BTreeMap::new(), "logs:\n{}", ccm.logs());
    drop(ccm);

    // Out of the mode: the CIDR rules back first, then the NLBs let the
    // group go and its rule goes with the last of them; the group is kept.
    std::fs::write(&env.cloud_conf, &managed)?;
    let (ok, text, err) = run_tool(&env, "plan", &["--controllers=service"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    let detach = format!("~ detach the shared backend security group {shared} from the NLB");
    assert_eq!(text.matches(&detach).count(), 2, "{text}");
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually(
        "the CIDR rules back and the shared group detached",
        WAIT,
        || async {
            let groups = carried(&cloud, &names).await?;
            let r: BTreeSet<_> = rules()
                .await?
                .into_iter()
                .filter(|r| ours_or_group(&r.3))
                .collect();
            (groups == own_groups && r == go_rules).then_some(())
        },
    )
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);
    stop.store(true, Ordering::Relaxed);

    // A rule from the shared group left behind with no NLB carrying it (a
    // CCM stopped between the last detach and the revoke): `aws-ccm plan`
    // shows it going in each NLB's section, and the next sync revokes it.
    use aws_sdk_ec2::types::{IpPermission, UserIdGroupPair};
    let pair = UserIdGroupPair::builder()
        .group_id(&shared)
        .description(GROUP_RULE);
    (cloud.ec2.authorize_security_group_ingress())
        .group_id(&cloud.node_group)
        .ip_permissions(
            (IpPermission::builder().ip_protocol("-1"))
                .user_id_group_pairs(pair.build())
                .build(),
        )
        .send()
        .await?;
    let (ok, text, err) = run_tool(&env, "plan", &["--controllers=service"], "").await?;
    assert!(ok, "aws-ccm plan failed: {err}");
    let revoke = format!(
        "- the rule admitting the shared backend security group {shared} from node group(s) {}",
        cloud.node_group
    );
    assert_eq!(text.matches(&revoke).count(), 2, "{text}");
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    eventually("the leftover shared-group rule revoked", WAIT, || async {
        let r: BTreeSet<_> = (rules().await?.into_iter())
            .filter(|r| ours_or_group(&r.3))
            .collect();
        (r == go_rules).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);
    let seen = sampler.await?;
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    // The sampler saw both states: ports admitted by the group and by CIDR.
    assert!(
        seen.judged > 0 && seen.by_group > 0 && seen.by_cidr > 0,
        "{seen:?}"
    );
    eprintln!("shared group move: {seen:?}");
    // Kept (never deleted by the CCM), still proven ours, carried by none.
    assert_eq!(shared_group(&cloud).await.map(|g| g.0), Some(shared));
    env.finish().await
}

/// `count` security groups of the user's in the node group's VPC.
async fn user_groups(cloud: &Cloud, count: usize) -> anyhow::Result<Vec<String>> {
    let vpc = cloud.vpc_id().await?;
    let mut ids = Vec::new();
    for i in 0..count {
        let made = (cloud.ec2.create_security_group())
            .group_name(format!("users-own-{i}"))
            .description("brought by the user")
            .vpc_id(&vpc)
            .send()
            .await?;
        ids.push(made.group_id().unwrap_or_default().to_string());
    }
    Ok(ids)
}

/// A bring-your-own NLB whose five groups fill AWS's default count, under
/// `SharedBackendGroup`: the Go CCM's NLB, at the swap, asks for a sixth
/// (the shared group) and AWS refuses it, with a code nobody confirmed
/// (the proxy's quota, which must fire): the NLB keeps its five and its
/// CIDR node rules, the Service gets `SecurityGroupsRefused` naming the
/// fix, a joining node is still registered, and each full sync asks again.
/// With the quota raised, a later sync of the same CCM moves it onto the
/// shared group. A new Service with five
/// groups is made without the shared group, not refused.
#[tokio::test]
async fn a_byo_nlb_at_the_groups_quota_keeps_its_groups_and_upkeep_when_aws_refuses_the_shared_group()
-> anyhow::Result<()> {
    // Upstream reads `security-groups` for an NLB in Managed mode only.
    let (base, shared_mode) = confs();
    let env = Env::start_with_conf(&base).await?;
    let cloud = seed(&env, 2).await?;
    let (client, services) = node_n0(&env, &cloud).await?;
    let five = user_groups(&cloud, 5).await?;
    let byo = serde_json::json!({"service.beta.kubernetes.io/aws-load-balancer-security-groups": five.join(",")});
    let svc = (services.create(&PostParams::default(), &nlb_service("byo", byo.clone()))).await?;
    let names = vec![lb_name(&svc)];
    let client_rule = format!("{CLIENT_RULE}{}", names[0]);
    let rules = || async { node_group_rules(&cloud.ec2, &cloud.node_group).await.ok() };
    let fail = |ccm: &Ccm| {
        let logs = ccm.logs();
        move |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{logs}")
    };

    // The Go CCM's state: five groups, the client rule from anywhere.
    let ccm = env.start_ccm(&["--controllers=service"]).await?;
    let go_rules = eventually("the NLB and its CIDR node rules", WAIT, || async {
        let groups = carried(&cloud, &names).await?;
        let r: BTreeSet<_> = (rules().await?.into_iter())
            .filter(|r| r.3 == client_rule)
            .collect();
        (groups[&names[0]].len() == 5 && !r.is_empty()).then_some(r)
    })
    .await
    .map_err(fail(&ccm))?;
    drop(ccm);

    // The swap into the mode: AWS refuses the sixth group.
    env.proxy
        .set_security_groups_per_load_balancer(5, "SecurityGroupLimitExceeded");
    std::fs::write(&env.cloud_conf, &shared_mode)?;
    // A short resync: each full sync asks again.
    let ccm = (env.start_ccm(&["--controllers=service", "--service-resync-period=3s"])).await?;
    let note = crate::swap::event_note(&client, "byo", "SecurityGroupsRefused")
        .await
        .map_err(fail(&ccm))?;
    assert!(
        note.contains("SecurityGroupLimitExceeded") && note.contains("name one group fewer"),
        "{note}"
    );
    let refused = (env.proxy.calls()).get("elasticloadbalancingv2", "SetSecurityGroups");
    assert!(refused.faulted > 0, "the quota fired: {refused:?}");
    let shared = shared_group(&cloud).await.map(|g| g.0);
    assert!(shared.is_some(), "the mode made its group");
    let groups = carried(&cloud, &names).await.unwrap_or_default();
    assert_eq!(groups[&names[0]], five, "the NLB keeps its own groups");
    let now: BTreeSet<_> = (rules().await.unwrap_or_default().into_iter())
        .filter(|r| r.3 == client_rule || r.3 == GROUP_RULE)
        .collect();
    assert_eq!(now, go_rules, "the node group keeps the CIDR rules");
    // Upkeep goes on: a joining node is registered.
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n1", &cloud.instances[1]))
        .await?;
    let mut both = cloud.instances[..2].to_vec();
    both.sort();
    eventually("the joined node registered", WAIT, || async {
        let groups = all_target_groups(&cloud.elbv2).await;
        (targets_of(&cloud.elbv2, groups.first()?).await? == both).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    eventually("the next full sync asking again", WAIT, || async {
        let again = (env.proxy.calls()).get("elasticloadbalancingv2", "SetSecurityGroups");
        (again.faulted > refused.faulted).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;

    // The quota raised, the CCM running on: a later sync moves the NLB
    // onto the shared group.
    env.proxy
        .set_security_groups_per_load_balancer(6, "SecurityGroupLimitExceeded");
    let shared = shared.unwrap_or_default();
    eventually(
        "the NLB on the shared group, its one rule",
        WAIT,
        || async {
            let groups = carried(&cloud, &names).await?;
            let mut want = five.clone();
            want.push(shared.clone());
            let r: BTreeSet<_> = (rules().await?.into_iter())
                .filter(|r| r.3 == client_rule || r.3 == GROUP_RULE)
                .collect();
            let one = r.len() == 1 && r.iter().all(|r| r.2 == shared);
            (groups[&names[0]] == want && one).then_some(())
        },
    )
    .await
    .map_err(fail(&ccm))?;

    // A new Service naming five groups at the default quota: made with
    // them alone, not refused.
    env.proxy
        .set_security_groups_per_load_balancer(5, "SecurityGroupLimitExceeded");
    let two = (services.create(&PostParams::default(), &nlb_service("two", byo))).await?;
    let two_name = vec![lb_name(&two)];
    eventually("the second NLB made with its five groups", WAIT, || async {
        let svc = services.get("two").await.ok()?;
        crate::nlb::hostname(&svc)?;
        let groups = carried(&cloud, &two_name).await?;
        (groups[&two_name[0]] == five).then_some(())
    })
    .await
    .map_err(fail(&ccm))?;
    let created = (env.proxy.calls()).get("elasticloadbalancingv2", "CreateLoadBalancer");
    assert_eq!(created.faulted, 0, "{created:?}");
    drop(ccm);
    env.finish().await
}
