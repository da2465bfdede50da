//! Rules per node security group at 100 NLB Services, from AWS
//! (`DescribeSecurityGroupRules`), in the three node-ingress modes:
//! `Cidr` (the Go CCM's per-port client rules and one MTU rule) and
//! `LoadBalancerGroup` (one rule per NLB admitting its managed group) grow
//! with the Services, so at 100 NLBs both meet AWS's default quota of 60
//! inbound rules per group: the fault proxy enforces it (and must be seen
//! to refuse), the node group ends up holding exactly the quota, and the
//! Services past it are the ones told so. `SharedBackendGroup` (one rule
//! admitting the cluster's shared backend group) does not grow: one rule.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::PostParams;

use crate::nlb::{Cloud, lb_name, nlb_service, seed};
use crate::service::node;
use crate::sg_rules::inbound_rules;
use crate::support::*;

/// NLB Services per test (measured: see each test's printed time).
const NLBS: usize = 100;
/// AWS's default "Inbound rules per security group" quota.
const DEFAULT_QUOTA: usize = 60;
const WAIT: Duration = Duration::from_secs(240);
const CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client=";
const MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";
const GROUP_RULE: &str = "aws-ccm/rule/nlb/from-group";

/// `NLBS` one-port NLB Services on one node (`n0`); returns them as created.
async fn services(env: &Env, cloud: &Cloud) -> anyhow::Result<(kube::Client, Vec<Service>)> {
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node("n0", &cloud.instances[0]))
        .await?;
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut out = Vec::new();
    for i in 0..NLBS {
        let svc = nlb_service(&format!("svc{i}"), serde_json::json!({}));
        out.push(api.create(&PostParams::default(), &svc).await?);
    }
    Ok((client, out))
}

/// The Services named in events with `reason`.
async fn services_with_event(client: &kube::Client, reason: &str) -> Option<BTreeSet<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = events.list(&Default::default()).await.ok()?;
    Some(
        (list.items.into_iter())
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.involved_object.name)
            .collect(),
    )
}

/// The fault proxy in front of moto at AWS's default rule quota, and a CCM
/// running the service controller through it.
async fn ccm_at_default_quota(
    env: &Env,
) -> anyhow::Result<(ccm_testkit::aws_proxy::FaultProxy, Ccm)> {
    let config = ccm_testkit::aws_proxy::ProxyConfig::default();
    let proxy = ccm_testkit::aws_proxy::FaultProxy::start(&env.moto.endpoint(), config).await?;
    proxy.set_rules_per_security_group(Some(DEFAULT_QUOTA));
    proxy.record_requests(true);
    // Setup speed, not a figure: creates have a small AWS bucket.
    let args = ["--controllers=service", "--aws-api-budget-fraction=10"];
    let ccm = env.start_ccm_via(&proxy.endpoint(), &args).await?;
    Ok((proxy, ccm))
}

/// What a CCM at the default quota ([`ccm_at_default_quota`]) leaves once
/// the node group holds `held` rules and `failing` Services have a
/// `SyncLoadBalancerFailed` event: the proxy, the CCM, the group's rules
/// and those Services. `mode` names the run in its printed time.
async fn run_to_quota(
    env: &Env,
    cloud: &Cloud,
    client: &kube::Client,
    (held, failing): (usize, usize),
    mode: &str,
) -> anyhow::Result<(
    ccm_testkit::aws_proxy::FaultProxy,
    Ccm,
    Vec<crate::sg_rules::InboundRule>,
    BTreeSet<String>,
)> {
    let started = Instant::now();
    let (proxy, ccm) = ccm_at_default_quota(env).await?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    let (rules, failed) = eventually("the node group at its quota", WAIT, || async {
        let rules = inbound_rules(&cloud.ec2, &cloud.node_group).await.ok()?;
        let failed = services_with_event(client, "SyncLoadBalancerFailed").await?;
        (rules.len() == held && failed.len() == failing).then_some((rules, failed))
    })
    .await
    .map_err(fail)?;
    println!(
        "{mode}: node group holds {} rules (quota {DEFAULT_QUOTA}) after {:?}",
        rules.len(),
        started.elapsed()
    );
    Ok((proxy, ccm, rules, failed))
}

/// The Go CCM's rules (the default, `NLBNodeIngress` unset): each NLB needs
/// one client rule per port and source range (health checks share the
/// traffic port, covered by the client rule from anywhere), and the group
/// one MTU rule for the one source range. At 100 NLBs that is 101 rules: the
/// group fills at the quota, with the MTU rule and the client rules of
/// quota − 1 NLBs; the others' syncs fail on the quota.
#[tokio::test]
async fn cidr_rules_per_node_group_at_100_nlbs_meet_the_default_quota() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let cloud = seed(&env, 1).await?;
    let before = inbound_rules(&cloud.ec2, &cloud.node_group).await?.len();
    let (client, created) = services(&env, &cloud).await?;
    let ports: usize = (created.iter())
        .map(|s| {
            s.spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map_or(0, Vec::len)
        })
        .sum();
    let needed = before + ports + 1;
    let held = needed.min(DEFAULT_QUOTA);
    let covered = created.len().min(DEFAULT_QUOTA - before - 1);
    let names: BTreeSet<String> = created.iter().map(lb_name).collect();
    let (proxy, ccm, rules, failed) = run_to_quota(
        &env,
        &cloud,
        &client,
        (held, created.len() - covered),
        &format!(
            "Cidr, {} NLB Services needing {needed} rules",
            created.len()
        ),
    )
    .await?;
    let with_client: BTreeSet<String> = (rules.iter())
        .filter_map(|(_, d)| d.strip_prefix(CLIENT_RULE).map(str::to_string))
        .collect();
    assert_eq!(with_client.len(), covered, "{rules:?}");
    assert!(with_client.is_subset(&names), "{with_client:?}");
    let mtu = rules.iter().filter(|(_, d)| d == MTU_RULE).count();
    assert_eq!(mtu, 1, "{rules:?}");
    // The Services told of a failed sync are exactly those left without.
    let uncovered: BTreeSet<String> = (created.iter())
        .filter(|s| !with_client.contains(&lb_name(s)))
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    assert_eq!(failed, uncovered);
    let authorize = proxy.calls().get("ec2", "AuthorizeSecurityGroupIngress");
    assert!(
        authorize.faulted >= 1,
        "the quota never refused: {authorize:?}"
    );
    drop(ccm);
    env.finish().await
}

/// `NLBNodeIngress = LoadBalancerGroup` on Managed-mode NLBs, from a fresh
/// cluster: one rule per NLB admitting its own group, so 100 NLBs need 100
/// rules. The first quota's worth get their group rule; for each NLB past
/// it the fallback fires (its CIDR rules are asked for, which only the
/// fallback does in this mode) and finds no room either, so its sync fails
/// on the quota (`SyncLoadBalancerFailed`; the fallback's own Warning
/// `NodeSecurityGroupRuleLimit` goes with the failed sync).
#[tokio::test]
async fn group_rules_per_node_group_at_100_nlbs_meet_the_default_quota() -> anyhow::Result<()> {
    let conf = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\nNLBNodeIngress = LoadBalancerGroup\n"
    );
    let env = Env::start_with_conf(&conf).await?;
    let cloud = seed(&env, 1).await?;
    let before = inbound_rules(&cloud.ec2, &cloud.node_group).await?.len();
    let (client, created) = services(&env, &cloud).await?;
    let needed = before + created.len();
    let held = needed.min(DEFAULT_QUOTA);
    let covered = created.len().min(DEFAULT_QUOTA - before);
    let (proxy, ccm, rules, warned) = run_to_quota(
        &env,
        &cloud,
        &client,
        (held, created.len() - covered),
        &format!(
            "LoadBalancerGroup, {} NLB Services needing {needed} rules",
            created.len()
        ),
    )
    .await?;
    // moto's DescribeSecurityGroupRules leaves out a group source's
    // description: DescribeSecurityGroups has it.
    let group_rules: BTreeSet<&str> = (rules.iter())
        .filter(|(s, _)| s.starts_with("sg-"))
        .map(|(s, _)| s.as_str())
        .collect();
    assert_eq!(group_rules.len(), covered, "{rules:?}");
    let described = crate::nlb::node_group_rules(&cloud.ec2, &cloud.node_group).await?;
    let described_group: BTreeSet<&str> = (described.iter())
        .filter(|r| r.3 == GROUP_RULE)
        .map(|r| r.2.as_str())
        .collect();
    assert_eq!(described_group, group_rules, "{described:?}");
    assert!(
        !rules
            .iter()
            .any(|(_, d)| d.starts_with(CLIENT_RULE) || d == MTU_RULE),
        "a CIDR rule beside the group rules: {rules:?}"
    );
    // Each group rule admits one NLB's own group; the warned Services are
    // exactly those whose group is not admitted.
    let mut uncovered = BTreeSet::new();
    let mut fell_back = BTreeSet::new();
    for svc in &created {
        let lb = (cloud.elbv2.describe_load_balancers())
            .names(lb_name(svc))
            .send()
            .await?;
        let carried = (lb.load_balancers().first()).map_or(&[][..], |l| l.security_groups());
        let [group] = carried else {
            anyhow::bail!(
                "{} carries {carried:?}, not its one managed group",
                lb_name(svc)
            );
        };
        if !group_rules.contains(group.as_str()) {
            uncovered.extend(svc.metadata.name.clone());
            fell_back.insert(format!("{CLIENT_RULE}{}", lb_name(svc)));
        }
    }
    assert_eq!(warned, uncovered);
    // The fallback fired for each of them: their CIDR rules were asked of
    // the node group (and refused: the group holds none).
    let asked: BTreeSet<String> = (proxy.requests("AuthorizeSecurityGroupIngress").into_iter())
        .filter(|c| c.params.get("GroupId") == Some(&cloud.node_group))
        .flat_map(|c| c.params.into_values())
        .filter(|v| v.starts_with(CLIENT_RULE))
        .collect();
    assert_eq!(asked, fell_back);
    let authorize = proxy.calls().get("ec2", "AuthorizeSecurityGroupIngress");
    assert!(
        authorize.faulted >= 1,
        "the quota never refused: {authorize:?}"
    );
    drop(ccm);
    env.finish().await
}

/// `NLBNodeIngress = SharedBackendGroup` on Managed-mode NLBs, from a fresh
/// cluster: every NLB carries its own group and the cluster's shared
/// backend group, and the node group holds one rule admitting the shared
/// group, whatever the number of NLBs. So at 100 NLBs the node group holds
/// what it had plus one rule, the proxy's quota (which refuses nothing
/// here) is never reached, and every Service gets its NLB.
#[tokio::test]
async fn shared_group_rule_per_node_group_at_100_nlbs_is_one() -> anyhow::Result<()> {
    let conf = format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nNLBSecurityGroupMode = Managed\nNLBNodeIngress = SharedBackendGroup\n"
    );
    let env = Env::start_with_conf(&conf).await?;
    let cloud = seed(&env, 1).await?;
    let before = inbound_rules(&cloud.ec2, &cloud.node_group).await?.len();
    let (client, created) = services(&env, &cloud).await?;
    let started = Instant::now();
    let (proxy, ccm) = ccm_at_default_quota(&env).await?;
    let fail = |e: anyhow::Error| anyhow::anyhow!("{e}\nlogs:\n{}", ccm.logs());
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    eventually("every NLB Service with its hostname", WAIT, || async {
        let list = api.list(&Default::default()).await.ok()?;
        let done = (list.items.iter()).filter(|s| crate::nlb::hostname(s).is_some());
        (done.count() == created.len()).then_some(())
    })
    .await
    .map_err(fail)?;
    let rules = inbound_rules(&cloud.ec2, &cloud.node_group).await?;
    println!(
        "SharedBackendGroup, {} NLB Services: node group holds {} rules (quota {DEFAULT_QUOTA}) after {:?}",
        created.len(),
        rules.len(),
        started.elapsed()
    );
    assert_eq!(rules.len(), before + 1, "{rules:?}");
    let sources: Vec<&str> = (rules.iter())
        .filter(|(s, _)| s.starts_with("sg-"))
        .map(|(s, _)| s.as_str())
        .collect();
    let [shared] = sources[..] else {
        anyhow::bail!("not one group rule: {rules:?}");
    };
    // Every NLB carries its own group, then the one the node group admits.
    for svc in &created {
        let lb = (cloud.elbv2.describe_load_balancers())
            .names(lb_name(svc))
            .send()
            .await?;
        let carried = (lb.load_balancers().first()).map_or(&[][..], |l| l.security_groups());
        let [own, second] = carried else {
            anyhow::bail!("{} carries {carried:?}", lb_name(svc));
        };
        assert_eq!(
            (second.as_str(), own != second),
            (shared, true),
            "{carried:?}"
        );
    }
    assert!(
        !rules
            .iter()
            .any(|(_, d)| d.starts_with(CLIENT_RULE) || d == MTU_RULE),
        "a CIDR rule beside the shared group's: {rules:?}"
    );
    let failed = services_with_event(&client, "SyncLoadBalancerFailed").await;
    assert_eq!(failed, Some(BTreeSet::new()));
    let authorize = proxy.calls().get("ec2", "AuthorizeSecurityGroupIngress");
    assert_eq!(authorize.faulted, 0, "the quota refused: {authorize:?}");
    drop(ccm);
    env.finish().await
}
