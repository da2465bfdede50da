//! The process itself: leader election, health endpoints, signals, and
//! start-up errors (issue: foundation).

use std::time::Duration;

use ccm_testkit::apiserver::TokenUser;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

use crate::support::*;

async fn lease(env: &Env) -> Option<Lease> {
    let client = env.api.client().await.ok()?;
    Api::<Lease>::namespaced(client, "kube-system")
        .get_opt("cloud-controller-manager")
        .await
        .ok()?
}

fn holder(lease: &Lease) -> Option<String> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .clone()
        .filter(|h| !h.is_empty())
}

fn renew_time(lease: &Lease) -> Option<String> {
    Some(lease.spec.as_ref()?.renew_time.as_ref()?.0.to_string())
}

/// Waits until the Lease names a holder other than `not` (any holder when
/// `None`), and returns that holder.
async fn held_by_other(env: &Env, not: Option<&str>, deadline: Duration) -> anyhow::Result<String> {
    eventually("the Lease held by another holder", deadline, || async {
        lease(env)
            .await
            .as_ref()
            .and_then(holder)
            .filter(|h| Some(h.as_str()) != not)
    })
    .await
}

#[tokio::test]
async fn acquires_and_renews_the_lease_and_serves_health_and_metrics() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let ccm = env.start_ccm(&[]).await?;
    // The only replica: the Lease's holder is this process, which says so
    // on /metrics.
    let me = held_by_other(&env, None, Duration::from_secs(30)).await?;
    wait_leading(&ccm, true, Duration::from_secs(10)).await?;
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    assert!(
        me.starts_with(&format!("{host}_")),
        "identity {me} is <hostname>_<uuid>"
    );

    let first = eventually("lease held by the CCM", Duration::from_secs(10), || async {
        lease(&env)
            .await
            .filter(|l| holder(l).as_deref() == Some(me.as_str()))
    })
    .await?;
    assert_eq!(
        first.spec.as_ref().and_then(|s| s.lease_duration_seconds),
        Some(3)
    );
    // Renewed: renewTime moves forward while the holder stays the same.
    let first_renew = renew_time(&first);
    eventually("lease renewal", Duration::from_secs(10), || async {
        lease(&env)
            .await
            .filter(|l| holder(l).as_deref() == Some(me.as_str()) && renew_time(l) != first_renew)
    })
    .await?;

    let addr = ccm.https_addr().await?;
    assert_eq!(https_get(&addr, "/healthz").await?, (200, "ok".to_string()));
    eventually(
        "/readyz ok after caches sync",
        Duration::from_secs(20),
        || async { matches!(https_get(&addr, "/readyz").await, Ok((200, _))).then_some(()) },
    )
    .await?;
    let (status, body) = https_get(&addr, "/metrics").await?;
    assert_eq!(status, 200);
    assert!(
        body.contains("# EOF"),
        "OpenMetrics text ends with # EOF: {body}"
    );
    // Delegated authentication and authorization, as upstream: no token is
    // 401, a token whose user may not get /metrics is 403, probes stay open.
    env.api.add_token("no-rights", TokenUser::new("someone"));
    assert_eq!(https_get_as(&addr, "/metrics", None).await?.0, 401);
    assert_eq!(
        https_get_as(&addr, "/metrics", Some("no-rights")).await?.0,
        403
    );
    assert_eq!(https_get_as(&addr, "/healthz", None).await?.0, 200);
    let stats = env.api.stats();
    assert!(stats.count("create", "tokenreviews") >= 2, "{stats:?}");
    assert!(
        stats.count("create", "subjectaccessreviews") >= 2,
        "{stats:?}"
    );
    env.finish().await
}

#[tokio::test]
async fn a_standby_waits_and_takes_over_when_the_leader_dies() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let mut first = env.start_ccm(&[]).await?;
    let first_id = held_by_other(&env, None, Duration::from_secs(30)).await?;
    wait_leading(&first, true, Duration::from_secs(10)).await?;
    wait_controller_running(&first, "cloud-node-controller", Duration::from_secs(20)).await?;

    let second = env.start_ccm(&[]).await?;
    wait_leading(&second, false, Duration::from_secs(30)).await?;
    // The standby tries three times (a read of the Lease each, where the
    // leader's renewals are a read and an update each) while the leader
    // renews: it must neither take the Lease nor act.
    let l = lease(&env).await.expect("lease");
    let standby_reads = || {
        let stats = env.api.stats();
        let (gets, updates) = (
            stats.count("get", "leases"),
            stats.count("update", "leases"),
        );
        (gets.saturating_sub(updates), updates)
    };
    let (reads_before, renewals_before) = standby_reads();
    eventually(
        "three attempts of the standby while the leader renews",
        Duration::from_secs(15),
        || async {
            let (reads, renewals) = standby_reads();
            (reads >= reads_before + 3 && renewals > renewals_before).then_some(())
        },
    )
    .await?;
    assert_eq!(
        holder(&lease(&env).await.expect("lease")).as_deref(),
        Some(first_id.as_str())
    );
    assert!(holder(&l).is_some());
    let standby_logs = second.logs();
    assert!(
        !standby_logs.contains("successfully acquired lease"),
        "{standby_logs}"
    );
    let (_, m) = https_get(&second.https_addr().await?, "/metrics").await?;
    assert!(
        !m.contains("aws_ccm_controller_running{"),
        "standby acted:\n{m}\n{standby_logs}"
    );
    // client-go's gauge, as the Go CCM exposes it: 1 on the leader, 0 on the standby.
    let status =
        |v: u8| format!("leader_election_master_status{{name=\"cloud-controller-manager\"}} {v}");
    let (_, m) = https_get(&first.https_addr().await?, "/metrics").await?;
    assert!(m.contains(&status(1)), "{m}");
    let (_, m) = https_get(&second.https_addr().await?, "/metrics").await?;
    assert!(m.contains(&status(0)), "{m}");

    // Kill the leader without letting it release: the standby takes over,
    // but not before the Lease it last saw renewed has expired: lease
    // duration (3 s) from a renewal that was at most the renew deadline
    // (2 s) before the kill, or the leader would have given up. How long
    // after is up to the machine's load, so only this lower bound is
    // asserted.
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(5)).await?;
    let killed_at = tokio::time::Instant::now();
    let second_id = held_by_other(&env, Some(&first_id), Duration::from_secs(10)).await?;
    let took = killed_at.elapsed();
    assert!(
        took >= Duration::from_millis(3000 - 2000),
        "the standby took the Lease {took:?} after the kill, before it expired"
    );
    // The new holder is the standby: the only replica left says it leads.
    let (_, m) = https_get(&second.https_addr().await?, "/metrics").await?;
    assert!(m.contains(&status(1)), "{m}");
    let l = eventually(
        "lease moved to the standby",
        Duration::from_secs(5),
        || async {
            lease(&env)
                .await
                .filter(|l| holder(l).as_deref() == Some(second_id.as_str()))
        },
    )
    .await?;
    assert_eq!(l.spec.and_then(|s| s.lease_transitions), Some(1));
    wait_controller_running(&second, "cloud-node-controller", Duration::from_secs(20)).await?;
    env.finish().await
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_releases_the_lease() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let mut ccm = env.start_ccm(&[]).await?;
    wait_controller_running(&ccm, "cloud-node-controller", Duration::from_secs(30)).await?;
    ccm.signal(libc::SIGTERM);
    let status = ccm.wait_exit(Duration::from_secs(15)).await?;
    assert!(
        status.success(),
        "exit status {status:?}; logs:\n{}",
        ccm.logs()
    );
    let logs = ccm.logs();
    // Controllers stop before the Lease is released.
    let stopped = logs
        .find("controller stopped")
        .expect("controllers stopped");
    let released = logs.find("released leader lease").expect("lease released");
    assert!(stopped < released, "{logs}");
    let l = lease(&env).await.expect("lease");
    assert_eq!(holder(&l), None, "lease released: {l:?}");

    // A successor takes over at once rather than after the lease duration.
    let next = env.start_ccm(&[]).await?;
    held_by_other(&env, None, Duration::from_secs(3)).await?;
    wait_leading(&next, true, Duration::from_secs(3)).await?;
    env.finish().await
}

#[tokio::test]
async fn without_leader_election_controllers_start_directly() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let mut ccm = env
        .start_ccm(&["--leader-elect=false", "--controllers=cloud-node,-route"])
        .await?;
    let m = wait_controller_running(&ccm, "cloud-node-controller", Duration::from_secs(30)).await?;
    // The only one named: no other controller was started at all.
    let running = m.matches("aws_ccm_controller_running{").count();
    assert_eq!(running, 1, "{m}");
    assert!(
        lease(&env).await.is_none(),
        "no Lease without leader election"
    );
    ccm.signal(libc::SIGTERM);
    assert!(ccm.wait_exit(Duration::from_secs(15)).await?.success());
    env.finish().await
}

#[tokio::test]
async fn bad_cloud_conf_and_bad_flags_exit_non_zero_with_a_clear_message() -> anyhow::Result<()> {
    let env = Env::start_with_conf(
        "[Global]\nRegion = us-east-1\nKubernetesClusterID = c\nDisableSecurityGroupIngress = maybe\n",
    )
    .await?;
    let (status, logs) = Ccm::run_to_exit(&env.base_args(), &env.aws_env()).await?;
    assert!(!status.success());
    let conf = env.cloud_conf.display().to_string();
    assert!(
        logs.contains(&format!("{conf}:4:"))
            && logs.contains("DisableSecurityGroupIngress")
            && logs.contains("maybe")
            && logs.contains("true or false"),
        "{logs}"
    );

    let mut args = env.base_args();
    args[0] = "--cloud-provider=gce".into();
    let (status, logs) = Ccm::run_to_exit(&args, &env.aws_env()).await?;
    assert!(!status.success());
    assert!(
        logs.contains("--cloud-provider") && logs.contains("gce"),
        "{logs}"
    );

    // No cluster ID anywhere and no --allow-untagged-cloud: refuse to start.
    std::fs::write(&env.cloud_conf, "[Global]\nRegion = us-east-1\n")?;
    let (status, logs) = Ccm::run_to_exit(&env.base_args(), &env.aws_env()).await?;
    assert!(!status.success());
    assert!(
        logs.contains("KubernetesClusterID") && logs.contains("--allow-untagged-cloud"),
        "{logs}"
    );
    env.finish().await
}

/// An operator's existing Go CCM cloud.conf and flags: an unknown key (the
/// Go CCM skips it), upstream's default health probe mode spelled out, an
/// override under upstream's service name, and component-base's logging and
/// cloud-provider's webhook flags. The CCM starts, leads, and says what it
/// skipped, where, and what was probably meant.
#[tokio::test]
async fn an_upstream_cloud_conf_and_flags_start_with_a_warning_for_the_unknown_key()
-> anyhow::Result<()> {
    let env = Env::start().await?;
    std::fs::write(
        &env.cloud_conf,
        format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n\
             KubernetesClusterIDD = typo\n\
             ClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort\n\
             [ServiceOverride \"1\"]\nService = EC2\nRegion = {REGION}\nURL = {}\n\
             SigningRegion = {REGION}\nSigningName = ec2\n",
            env.proxy.endpoint()
        ),
    )?;
    let ccm = env
        .start_ccm(&[
            "--logging-format=text",
            "--log-text-split-stream",
            "--webhooks=*",
            "--webhook-secure-port=0",
        ])
        .await?;
    // It starts and leads; what it skipped is what it logs.
    wait_leading(&ccm, true, Duration::from_secs(30)).await?;
    let logs = ccm.logs();
    let conf = env.cloud_conf.display().to_string();
    let warning = logs
        .lines()
        .find(|l| l.contains("KubernetesClusterIDD"))
        .unwrap_or_else(|| panic!("no warning for the unknown key:\n{logs}"));
    assert!(
        warning.contains("WARN")
            && warning.contains(&format!("{conf}:4:"))
            && warning.contains("nearest known key: KubernetesClusterID"),
        "{warning}"
    );
    assert!(logs.contains("webhook-secure-port"), "{logs}");
    env.finish().await
}

/// Mutating AWS calls the proxy received, by `service:action`.
fn mutating_calls(proxy: &ccm_testkit::aws_proxy::FaultProxy) -> Vec<(String, u64)> {
    proxy
        .calls()
        .iter()
        .filter(|(service, action, _)| {
            aws_ccm::aws::Operation::from_names(service, action).is_some_and(|op| op.is_mutating())
        })
        .map(|(service, action, counts)| (format!("{service}:{action}"), counts.received))
        .collect()
}

#[tokio::test]
async fn a_leader_that_loses_its_lease_makes_no_aws_change_afterwards() -> anyhow::Result<()> {
    use ccm_testkit::apiserver::FailureRule;
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::api::PostParams;

    let env = Env::start().await?;
    let seeded = seed_cluster(&env, 1).await?;
    let client = env.api.client().await?;
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &crate::service::node("n0", &seeded.instances[0]),
        )
        .await?;
    let mut ccm = env.start_ccm(&["--controllers=service"]).await?;
    wait_controller_running(&ccm, "service-lb-controller", Duration::from_secs(30)).await?;
    // Slow AWS, and Services to provision: syncs are under way when the
    // Lease is lost.
    env.proxy.set_latency(Duration::from_millis(200));
    let services: Api<Service> = Api::namespaced(client, "default");
    for i in 0..6 {
        services
            .create(
                &PostParams::default(),
                &crate::service::lb_service(&format!("web{i}"), serde_json::json!({})),
            )
            .await?;
    }
    eventually("AWS changes under way", Duration::from_secs(30), || async {
        (!mutating_calls(&env.proxy).is_empty()).then_some(())
    })
    .await?;
    // The API server stops answering Lease reads: the leader cannot renew.
    env.api
        .inject_failure(FailureRule::new("get", "leases", 500).always());
    ccm.wait_for_log("stopped all changes to AWS", Duration::from_secs(30))
        .await?;
    let at_stop = mutating_calls(&env.proxy);
    let status = ccm.wait_exit(Duration::from_secs(10)).await?;
    assert!(!status.success(), "a lost Lease exits non-zero: {status:?}");
    assert_eq!(
        mutating_calls(&env.proxy),
        at_stop,
        "mutating AWS calls after the Lease was lost\nlogs:\n{}",
        ccm.logs()
    );
    let logs = ccm.logs();
    let stopped = logs.find("stopped all changes to AWS").unwrap_or(0);
    let lost = logs
        .find("leaderelection lost")
        .expect("the loss is logged");
    assert!(stopped < lost, "AWS changes stop before the exit: {logs}");
    env.finish().await
}

/// The harness's own start-up (`Ccm::spawn`): a `--secure-port` another
/// process holds makes the CCM exit with `Address already in use`, and the
/// harness starts it again on a fresh port, where it serves. Without that,
/// a port taken between the check and the CCM's bind failed whichever test
/// it fell to.
#[tokio::test]
async fn a_taken_secure_port_is_replaced_when_the_harness_starts_the_ccm() -> anyhow::Result<()> {
    let env = Env::start().await?;
    let held = std::net::TcpListener::bind("127.0.0.1:0")?;
    let taken = format!("127.0.0.1:{}", held.local_addr()?.port());
    let port = format!("--secure-port={}", held.local_addr()?.port());
    let ccm = env.start_ccm(&["--controllers=service", &port]).await?;
    let addr = ccm.https_addr().await?;
    assert_ne!(addr, taken, "{}", ccm.logs());
    assert_eq!(https_get(&addr, "/healthz").await?, (200, "ok".to_string()));
    drop(held);
    env.finish().await
}
