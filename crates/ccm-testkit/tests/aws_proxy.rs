//! The moto launcher and the AWS throttling/fault proxy, driven by the real AWS
//! SDK crates: the errors the proxy makes up must parse, classify and retry
//! exactly like real AWS errors.
//!
//! Needs moto: `scripts/install-moto.sh` (or `make test`).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_config::retry::RetryConfig;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::operation::RequestId;
use aws_smithy_runtime_api::client::result::SdkError;
use ccm_testkit::aws_proxy::{
    BucketScope, Category, FaultKind, FaultProxy, FaultRule, ProxyConfig, category_of,
    category_of_call,
};
use ccm_testkit::moto::{Moto, process_is_gone, test_sdk_config};

#[path = "aws_proxy/harsh.rs"]
mod harsh;

// ---------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------

/// One moto for the whole test binary: starting moto costs about a second of
/// CPU, and tests here only read from it or create uniquely named resources.
/// It is never dropped; the launcher's watchdog kills it when this process
/// exits.
fn shared_moto_endpoint() -> String {
    static MOTO: OnceLock<Result<Moto, String>> = OnceLock::new();
    let moto = MOTO.get_or_init(|| {
        // Moto::start needs a runtime; the calling test's runtime is busy
        // blocking on this very call, so start it on a thread of its own.
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|err| format!("cannot build a runtime to start moto: {err}"))?;
            runtime
                .block_on(Moto::start())
                .map_err(|err| format!("{err:#}"))
        })
        .join()
        .unwrap_or_else(|_| Err("the thread starting moto panicked".to_owned()))
    });
    match moto {
        Ok(moto) => moto.endpoint(),
        Err(err) => panic!("moto is needed for these tests: {err}"),
    }
}

async fn proxy(config: ProxyConfig) -> FaultProxy {
    FaultProxy::start(&shared_moto_endpoint(), config)
        .await
        .expect("the proxy starts")
}

fn no_retries() -> RetryConfig {
    RetryConfig::disabled()
}

/// The SDK's standard retry mode with a tiny backoff so tests stay fast.
fn standard_retries(max_attempts: u32) -> RetryConfig {
    RetryConfig::standard()
        .with_max_attempts(max_attempts)
        .with_initial_backoff(Duration::from_millis(1))
}

async fn ec2(endpoint: &str, retry: RetryConfig) -> aws_sdk_ec2::Client {
    let shared = test_sdk_config(endpoint).await;
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&shared)
            .retry_config(retry)
            .build(),
    )
}

async fn elbv2(endpoint: &str, retry: RetryConfig) -> aws_sdk_elasticloadbalancingv2::Client {
    let shared = test_sdk_config(endpoint).await;
    aws_sdk_elasticloadbalancingv2::Client::from_conf(
        aws_sdk_elasticloadbalancingv2::config::Builder::from(&shared)
            .retry_config(retry)
            .build(),
    )
}

async fn elb(endpoint: &str, retry: RetryConfig) -> aws_sdk_elasticloadbalancing::Client {
    let shared = test_sdk_config(endpoint).await;
    aws_sdk_elasticloadbalancing::Client::from_conf(
        aws_sdk_elasticloadbalancing::config::Builder::from(&shared)
            .retry_config(retry)
            .build(),
    )
}

async fn sts(endpoint: &str) -> aws_sdk_sts::Client {
    let shared = test_sdk_config(endpoint).await;
    aws_sdk_sts::Client::new(&shared)
}

/// HTTP status of a service error.
fn status<E: std::fmt::Debug>(err: &SdkError<E, aws_smithy_runtime_api::http::Response>) -> u16 {
    err.raw_response()
        .map(|response| response.status().as_u16())
        .unwrap_or_else(|| panic!("expected an HTTP error response, got {err:?}"))
}

fn not_throttled(counts: ccm_testkit::aws_proxy::ActionCounts) -> bool {
    counts.throttled == 0
}

// ---------------------------------------------------------------------------
// moto launcher
// ---------------------------------------------------------------------------

/// Whether `pid` is gone within `within`.
fn wait_until_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if process_is_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    process_is_gone(pid)
}

#[tokio::test]
async fn moto_starts_resets_and_dies_on_drop() {
    let moto = Moto::start().await.expect("moto starts");
    let pid = moto.pid().expect("the launcher reports moto's pid");
    assert!(moto.endpoint().starts_with("http://127.0.0.1:"));
    assert!(!process_is_gone(pid), "moto must be running");

    let client = ec2(&moto.endpoint(), no_retries()).await;
    client
        .create_security_group()
        .group_name("reset-probe")
        .description("removed by reset")
        .send()
        .await
        .expect("moto creates a security group");
    let named = |client: aws_sdk_ec2::Client| async move {
        client
            .describe_security_groups()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("group-name")
                    .values("reset-probe")
                    .build(),
            )
            .send()
            .await
            .expect("moto describes security groups")
            .security_groups()
            .len()
    };
    assert_eq!(named(client.clone()).await, 1);
    moto.reset().await.expect("moto resets");
    assert_eq!(named(client).await, 0, "reset must clear moto's state");

    drop(moto);
    assert!(
        wait_until_gone(pid, Duration::from_secs(5)),
        "moto (pid {pid}) must be gone once the Moto is dropped"
    );
}

#[tokio::test]
async fn a_moto_that_dies_at_start_up_reports_its_log() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fake = dir.path().join("moto_server");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho 'ModuleNotFoundError: No module named moto' >&2\nexit 3\n",
    )
    .expect("write a failing moto_server");
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755))
            .expect("make it executable");
    }
    let err = match Moto::start_with(&fake).await {
        Ok(_) => panic!("a moto_server that exits at once cannot start"),
        Err(err) => format!("{err:#}"),
    };
    assert!(err.contains("exited before answering"), "{err}");
    assert!(err.contains("exit status: 3"), "{err}");
    assert!(
        err.contains("ModuleNotFoundError: No module named moto"),
        "{err}"
    );
}

const HOLDER_ENV: &str = "AWS_PROXY_TEST_HOLD_MOTO";

/// In the child process of `moto_dies_with_a_killed_test_process`: starts
/// moto, prints its pid and waits to be SIGKILLed.
fn hold_moto_until_killed() {
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    runtime.block_on(async {
        let moto = Moto::start().await.expect("moto starts");
        println!("MOTO_PID={}", moto.pid().expect("moto's pid is known"));
        // Bounded, in case the parent dies without killing us.
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(moto);
    });
}

#[test]
fn moto_dies_with_a_killed_test_process() {
    // The same test, re-run as a child with HOLDER_ENV set, plays the process
    // that starts moto and is then killed.
    if std::env::var_os(HOLDER_ENV).is_some() {
        hold_moto_until_killed();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut holder = Command::new(exe)
        .args([
            "--exact",
            "moto_dies_with_a_killed_test_process",
            "--nocapture",
        ])
        .env(HOLDER_ENV, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the helper test process starts");
    let stdout = holder.stdout.take().expect("piped stdout");
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(pid) = line.strip_prefix("MOTO_PID=") {
                let _ = sender.send(pid.trim().parse::<u32>().ok());
                return;
            }
        }
        let _ = sender.send(None);
    });
    let pid = receiver
        .recv_timeout(Duration::from_secs(90))
        .ok()
        .flatten();
    // SIGKILL: no destructor runs in the helper.
    let _ = holder.kill();
    let _ = holder.wait();
    let pid = pid.expect("the helper reported moto's pid");
    assert!(
        wait_until_gone(pid, Duration::from_secs(10)),
        "moto (pid {pid}) outlived the SIGKILLed test process that started it"
    );
}

// ---------------------------------------------------------------------------
// Counting
// ---------------------------------------------------------------------------

#[tokio::test]
async fn counts_every_action_exactly() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    let ec2 = ec2(&endpoint, no_retries()).await;
    for _ in 0..3 {
        ec2.describe_instances()
            .send()
            .await
            .expect("DescribeInstances");
    }
    for _ in 0..2 {
        ec2.describe_vpcs().send().await.expect("DescribeVpcs");
    }
    elbv2(&endpoint, no_retries())
        .await
        .describe_load_balancers()
        .send()
        .await
        .expect("ELBv2 DescribeLoadBalancers");
    elb(&endpoint, no_retries())
        .await
        .describe_load_balancers()
        .send()
        .await
        .expect("classic DescribeLoadBalancers");
    sts(&endpoint)
        .await
        .get_caller_identity()
        .send()
        .await
        .expect("GetCallerIdentity");

    let calls = proxy.calls();
    let di = calls.get("ec2", "DescribeInstances");
    assert_eq!(
        (di.received, di.forwarded, di.throttled, di.faulted),
        (3, 3, 0, 0)
    );
    assert_eq!(calls.get("ec2", "DescribeVpcs").forwarded, 2);
    assert_eq!(
        calls
            .get("elasticloadbalancingv2", "DescribeLoadBalancers")
            .forwarded,
        1
    );
    assert_eq!(
        calls
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .forwarded,
        1
    );
    assert_eq!(calls.get("sts", "GetCallerIdentity").forwarded, 1);
    assert_eq!(calls.get("ec2", "NeverCalled").received, 0);
    assert_eq!(calls.total_forwarded(), 8);
    assert_eq!(calls.total_received(), 8);
    assert_eq!(calls.throttled_total(), 0);
    assert_eq!(calls.faulted_total(), 0);
    let seen: Vec<(String, String, u64)> = calls
        .iter()
        .map(|(service, action, counts)| (service.to_owned(), action.to_owned(), counts.forwarded))
        .collect();
    assert_eq!(
        seen,
        [
            ("ec2".to_owned(), "DescribeInstances".to_owned(), 3),
            ("ec2".to_owned(), "DescribeVpcs".to_owned(), 2),
            (
                "elasticloadbalancing".to_owned(),
                "DescribeLoadBalancers".to_owned(),
                1
            ),
            (
                "elasticloadbalancingv2".to_owned(),
                "DescribeLoadBalancers".to_owned(),
                1
            ),
            ("sts".to_owned(), "GetCallerIdentity".to_owned(), 1),
        ]
    );

    proxy.reset_counts();
    assert!(proxy.calls().is_empty());
}

#[tokio::test]
async fn moto_api_is_forwarded_but_never_counted_or_throttled() {
    // A budget so small that any counted call would be throttled at once.
    let proxy = proxy(ProxyConfig {
        budget_fraction: Some(0.001),
        ..ProxyConfig::default()
    })
    .await;
    for _ in 0..5 {
        let status = http_request("POST", &format!("{}/moto-api/reset", proxy.endpoint()))
            .await
            .0;
        assert_eq!(status, 200);
    }
    assert!(proxy.calls().is_empty(), "{:?}", proxy.calls());
}

#[tokio::test]
async fn counts_are_served_as_json() {
    let proxy = proxy(ProxyConfig::default()).await;
    let ec2 = ec2(&proxy.endpoint(), no_retries()).await;
    ec2.describe_subnets()
        .send()
        .await
        .expect("DescribeSubnets");
    let (status, body) =
        http_request("GET", &format!("{}/proxy-api/counts", proxy.endpoint())).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("counts are JSON");
    assert_eq!(json["total_forwarded"], 1);
    assert_eq!(json["calls"][0]["service"], "ec2");
    assert_eq!(json["calls"][0]["action"], "DescribeSubnets");
    assert_eq!(json["calls"][0]["forwarded"], 1);

    let (status, _) = http_request(
        "POST",
        &format!("{}/proxy-api/reset-counts", proxy.endpoint()),
    )
    .await;
    assert_eq!(status, 200);
    assert!(proxy.calls().is_empty());
}

/// A bare HTTP request (no SDK), returning status and body.
async fn http_request(method: &str, url: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Empty};
    let client: hyper_util::client::legacy::Client<_, Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let request = http::Request::builder()
        .method(method)
        .uri(url)
        .body(Empty::new())
        .expect("valid request");
    let response = client
        .request(request)
        .await
        .expect("the request is answered");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body is read")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

// ---------------------------------------------------------------------------
// Throttling: budget enforcement and the error format the SDK sees
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ec2_over_budget_is_request_limit_exceeded() {
    // Non-mutating EC2: 100 * 0.02 = 2 tokens, refilling 0.4/s.
    let proxy = proxy(ProxyConfig {
        budget_fraction: Some(0.02),
        ..ProxyConfig::default()
    })
    .await;
    // Frozen bucket clock: no refill, however slow the machine is.
    proxy.use_manual_clock();
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    for _ in 0..2 {
        client.describe_vpcs().send().await.expect("within budget");
    }
    let err = client
        .describe_vpcs()
        .send()
        .await
        .expect_err("over budget");
    assert_eq!(err.code(), Some("RequestLimitExceeded"));
    assert_eq!(err.message(), Some("Request limit exceeded."));
    assert_eq!(status(&err), 503);
    assert!(err.request_id().is_some_and(|id| !id.is_empty()));
    let counts = proxy.calls().get("ec2", "DescribeVpcs");
    assert_eq!(
        (counts.received, counts.forwarded, counts.throttled),
        (3, 2, 1)
    );
}

#[tokio::test]
async fn elb_over_budget_is_throttling_and_each_api_version_has_its_own_bucket() {
    // ELB non-mutating: 40 * 0.05 = 2 tokens per API version, 0.5/s.
    let proxy = proxy(ProxyConfig {
        budget_fraction: Some(0.05),
        ..ProxyConfig::default()
    })
    .await;
    // Frozen bucket clock: no refill, however slow the machine is.
    proxy.use_manual_clock();
    let v2 = elbv2(&proxy.endpoint(), no_retries()).await;
    for _ in 0..2 {
        v2.describe_load_balancers()
            .send()
            .await
            .expect("within budget");
    }
    let err = v2
        .describe_load_balancers()
        .send()
        .await
        .expect_err("over budget");
    assert_eq!(err.code(), Some("Throttling"));
    assert_eq!(err.message(), Some("Rate exceeded"));
    assert_eq!(status(&err), 400);
    assert!(err.request_id().is_some_and(|id| !id.is_empty()));

    // Classic ELB draws from its own bucket, untouched by the v2 calls.
    let classic = elb(&proxy.endpoint(), no_retries()).await;
    for _ in 0..2 {
        classic
            .describe_load_balancers()
            .send()
            .await
            .expect("within budget");
    }
    let err = classic
        .describe_load_balancers()
        .send()
        .await
        .expect_err("over budget");
    assert_eq!(err.code(), Some("Throttling"));
    assert_eq!(err.message(), Some("Rate exceeded"));
    assert_eq!(status(&err), 400);

    let calls = proxy.calls();
    assert_eq!(
        calls
            .get("elasticloadbalancingv2", "DescribeLoadBalancers")
            .throttled,
        1
    );
    assert_eq!(
        calls
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .throttled,
        1
    );
    assert_eq!(calls.throttled_total(), 2);
}

#[tokio::test]
async fn burst_is_exact_and_the_bucket_refills() {
    // ELB non-mutating at 0.05: burst 2, one token back every 2 s, on a
    // clock the test moves by hand.
    let proxy = proxy(ProxyConfig {
        budget_fraction: Some(0.05),
        ..ProxyConfig::default()
    })
    .await;
    let clock = proxy.use_manual_clock();
    let client = elbv2(&proxy.endpoint(), no_retries()).await;
    let mut outcomes = Vec::new();
    for _ in 0..4 {
        outcomes.push(client.describe_load_balancers().send().await.is_ok());
    }
    assert_eq!(outcomes, [true, true, false, false]);

    clock.advance(Duration::from_millis(1_999));
    assert!(
        client.describe_load_balancers().send().await.is_err(),
        "not yet a whole token"
    );
    clock.advance(Duration::from_millis(1));
    assert!(
        client.describe_load_balancers().send().await.is_ok(),
        "one token refilled"
    );
    assert!(
        client.describe_load_balancers().send().await.is_err(),
        "and only one"
    );
    let counts = proxy
        .calls()
        .get("elasticloadbalancingv2", "DescribeLoadBalancers");
    assert_eq!((counts.forwarded, counts.throttled), (3, 4));
}

#[tokio::test]
async fn unfiltered_describe_instances_uses_the_smaller_bucket() {
    // At 0.04: unfiltered DescribeInstances 50 * 0.04 = 2; filtered
    // (ordinary non-mutating) 100 * 0.04 = 4, in a separate bucket.
    let proxy = proxy(ProxyConfig {
        budget_fraction: Some(0.04),
        ..ProxyConfig::default()
    })
    .await;
    // Frozen bucket clock: no refill, however slow the machine is.
    proxy.use_manual_clock();
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    assert_eq!(
        category_of_call("ec2", "DescribeInstances", []),
        Category::Ec2UnfilteredDescribe
    );

    for _ in 0..2 {
        client
            .describe_instances()
            .send()
            .await
            .expect("unfiltered within budget");
    }
    let err = client
        .describe_instances()
        .send()
        .await
        .expect_err("unfiltered over budget");
    assert_eq!(err.code(), Some("RequestLimitExceeded"));

    let running = aws_sdk_ec2::types::Filter::builder()
        .name("instance-state-name")
        .values("running")
        .build();
    for _ in 0..4 {
        client
            .describe_instances()
            .filters(running.clone())
            .send()
            .await
            .expect("filtered calls use the larger bucket");
    }
    assert!(
        client
            .describe_instances()
            .filters(running)
            .send()
            .await
            .is_err()
    );
    // Paginated calls are "filtered" too.
    assert_eq!(
        category_of_call("ec2", "DescribeInstances", ["MaxResults"]),
        category_of("ec2", "DescribeInstances")
    );
}

#[tokio::test]
async fn budget_can_be_changed_and_switched_off() {
    let proxy = proxy(ProxyConfig::default()).await;
    proxy.use_manual_clock();
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    for _ in 0..20 {
        client
            .describe_vpcs()
            .send()
            .await
            .expect("no budget, no throttling");
    }
    proxy.set_budget_fraction(Some(0.01)); // 1 token
    client
        .describe_vpcs()
        .send()
        .await
        .expect("the new bucket starts full");
    assert!(client.describe_vpcs().send().await.is_err());
    proxy.set_budget_fraction(None);
    client
        .describe_vpcs()
        .send()
        .await
        .expect("enforcement off again");
    assert_eq!(proxy.calls().get("ec2", "DescribeVpcs").throttled, 1);

    // Per-action buckets: each non-mutating action gets its own 2 tokens.
    proxy.set_budget_fraction(Some(0.02));
    proxy.set_bucket_scope(BucketScope::PerAction);
    for _ in 0..2 {
        client
            .describe_vpcs()
            .send()
            .await
            .expect("DescribeVpcs bucket");
    }
    assert!(client.describe_vpcs().send().await.is_err());
    for _ in 0..2 {
        client
            .describe_subnets()
            .send()
            .await
            .expect("DescribeSubnets has its own bucket");
    }
    assert!(client.describe_subnets().send().await.is_err());
}

// ---------------------------------------------------------------------------
// The SDK retries injected throttling like real throttling
// ---------------------------------------------------------------------------

#[tokio::test]
async fn sdk_retries_throttling_from_every_service() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle)
            .for_action("DescribeVpcs")
            .at_most(2),
        FaultRule::new(FaultKind::Throttle)
            .for_service("elasticloadbalancingv2")
            .for_action("DescribeTargetGroups")
            .at_most(2),
        FaultRule::new(FaultKind::Throttle)
            .for_service("elasticloadbalancing")
            .for_action("DescribeLoadBalancers")
            .at_most(2),
    ]);
    ec2(&endpoint, standard_retries(3))
        .await
        .describe_vpcs()
        .send()
        .await
        .expect("succeeds on the third attempt");
    elbv2(&endpoint, standard_retries(3))
        .await
        .describe_target_groups()
        .send()
        .await
        .expect("succeeds on the third attempt");
    elb(&endpoint, standard_retries(3))
        .await
        .describe_load_balancers()
        .send()
        .await
        .expect("succeeds on the third attempt");

    let calls = proxy.calls();
    for (service, action) in [
        ("ec2", "DescribeVpcs"),
        ("elasticloadbalancingv2", "DescribeTargetGroups"),
        ("elasticloadbalancing", "DescribeLoadBalancers"),
    ] {
        let counts = calls.get(service, action);
        assert_eq!(
            (counts.received, counts.faulted, counts.forwarded),
            (3, 2, 1),
            "{service} {action}: two throttled attempts, then success"
        );
        assert!(
            not_throttled(counts),
            "fault throttles count as faults, not budget throttles"
        );
    }
}

#[tokio::test]
async fn sdk_gives_up_on_persistent_throttling_with_the_throttling_error() {
    let proxy = proxy(ProxyConfig {
        faults: vec![FaultRule::new(FaultKind::Throttle).for_action("DescribeLoadBalancers")],
        ..ProxyConfig::default()
    })
    .await;
    let err = elbv2(&proxy.endpoint(), standard_retries(3))
        .await
        .describe_load_balancers()
        .send()
        .await
        .expect_err("every attempt throttled");
    assert_eq!(err.code(), Some("Throttling"));
    assert_eq!(
        proxy
            .calls()
            .get("elasticloadbalancingv2", "DescribeLoadBalancers")
            .received,
        3,
        "max_attempts = 3"
    );
}

// ---------------------------------------------------------------------------
// Server errors, arbitrary errors, connection resets
// ---------------------------------------------------------------------------

#[tokio::test]
async fn server_errors_parse_like_real_aws_and_are_retried() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    let ec2_once = ec2(&endpoint, no_retries()).await;
    let v2_once = elbv2(&endpoint, no_retries()).await;

    for (status_code, ec2_code, query_code) in [
        (500, "InternalError", "InternalFailure"),
        (503, "ServiceUnavailable", "ServiceUnavailable"),
    ] {
        proxy.set_faults(vec![FaultRule::new(FaultKind::ServerError(status_code))]);
        let err = ec2_once
            .describe_vpcs()
            .send()
            .await
            .expect_err("server error");
        assert_eq!(err.code(), Some(ec2_code));
        assert!(err.message().is_some_and(|m| !m.is_empty()));
        assert_eq!(status(&err), status_code);
        let err = v2_once
            .describe_load_balancers()
            .send()
            .await
            .expect_err("server error");
        assert_eq!(err.code(), Some(query_code));
        assert_eq!(status(&err), status_code);
    }

    // Transient: the standard retry mode tries again.
    proxy.reset_counts();
    proxy.set_faults(vec![FaultRule::new(FaultKind::ServerError(500)).at_most(1)]);
    ec2(&endpoint, standard_retries(3))
        .await
        .describe_vpcs()
        .send()
        .await
        .expect("retried past one 500");
    let counts = proxy.calls().get("ec2", "DescribeVpcs");
    assert_eq!(
        (counts.received, counts.faulted, counts.forwarded),
        (2, 1, 1)
    );
}

#[tokio::test]
async fn arbitrary_errors_keep_their_code_and_are_not_retried() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Error {
            status: 400,
            code: "DependencyViolation".into(),
            message: "resource sg-0123 has a dependent object".into(),
        })
        .for_action("DeleteSecurityGroup"),
        FaultRule::new(FaultKind::Error {
            status: 400,
            code: "LoadBalancerNotFound".into(),
            message: "One or more load balancers not found".into(),
        })
        .for_action("DescribeLoadBalancers"),
    ]);

    let err = ec2(&endpoint, standard_retries(3))
        .await
        .delete_security_group()
        .group_id("sg-0123")
        .send()
        .await
        .expect_err("injected DependencyViolation");
    assert_eq!(err.code(), Some("DependencyViolation"));
    assert_eq!(
        err.message(),
        Some("resource sg-0123 has a dependent object")
    );
    assert_eq!(status(&err), 400);

    // A modeled error code becomes the SDK's typed error, as from real AWS.
    let err = elbv2(&endpoint, standard_retries(3))
        .await
        .describe_load_balancers()
        .names("missing")
        .send()
        .await
        .expect_err("injected LoadBalancerNotFound");
    assert_eq!(err.code(), Some("LoadBalancerNotFound"));
    assert!(
        err.into_service_error()
            .is_load_balancer_not_found_exception()
    );
    let err = elb(&endpoint, standard_retries(3))
        .await
        .describe_load_balancers()
        .load_balancer_names("missing")
        .send()
        .await
        .expect_err("injected LoadBalancerNotFound");
    assert!(
        err.into_service_error()
            .is_access_point_not_found_exception()
    );

    let calls = proxy.calls();
    // Client errors are final: one attempt each despite retries being on.
    assert_eq!(calls.get("ec2", "DeleteSecurityGroup").received, 1);
    assert_eq!(
        calls
            .get("elasticloadbalancingv2", "DescribeLoadBalancers")
            .received,
        1
    );
    assert_eq!(
        calls
            .get("elasticloadbalancing", "DescribeLoadBalancers")
            .received,
        1
    );
    assert_eq!(calls.faulted_total(), 3);
    assert_eq!(calls.total_forwarded(), 0);
}

#[tokio::test]
async fn connection_reset_is_a_dispatch_failure_and_is_retried() {
    let proxy = proxy(ProxyConfig::default()).await;
    let endpoint = proxy.endpoint();
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::ConnectionReset).for_action("DescribeVpcs"),
    ]);
    let err = ec2(&endpoint, no_retries())
        .await
        .describe_vpcs()
        .send()
        .await
        .expect_err("connection reset");
    let SdkError::DispatchFailure(dispatch) = &err else {
        panic!("expected a dispatch failure, got {err:?}");
    };
    assert!(dispatch.is_io(), "expected an I/O error, got {dispatch:?}");

    proxy.set_faults(vec![
        FaultRule::new(FaultKind::ConnectionReset)
            .for_action("DescribeVpcs")
            .at_most(1),
    ]);
    proxy.reset_counts();
    ec2(&endpoint, standard_retries(3))
        .await
        .describe_vpcs()
        .send()
        .await
        .expect("retried past the reset");
    let counts = proxy.calls().get("ec2", "DescribeVpcs");
    assert_eq!(
        (counts.received, counts.faulted, counts.forwarded),
        (2, 1, 1)
    );
}

// ---------------------------------------------------------------------------
// Fault rule mechanics
// ---------------------------------------------------------------------------

#[tokio::test]
async fn probability_and_max_count_behave() {
    let proxy = proxy(ProxyConfig::default()).await;
    let client = ec2(&proxy.endpoint(), no_retries()).await;

    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).with_probability(0.0),
    ]);
    for _ in 0..20 {
        client
            .describe_vpcs()
            .send()
            .await
            .expect("probability 0 never faults");
    }
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).with_probability(1.0),
    ]);
    for _ in 0..20 {
        assert!(
            client.describe_vpcs().send().await.is_err(),
            "probability 1 always faults"
        );
    }
    assert_eq!(proxy.calls().get("ec2", "DescribeVpcs").faulted, 20);

    proxy.reset_counts();
    proxy.set_faults(vec![FaultRule::new(FaultKind::ServerError(503)).at_most(3)]);
    let failures = {
        let mut failures = 0;
        for _ in 0..10 {
            if client.describe_vpcs().send().await.is_err() {
                failures += 1;
            }
        }
        failures
    };
    assert_eq!(failures, 3, "max_count caps the faults");
    let counts = proxy.calls().get("ec2", "DescribeVpcs");
    assert_eq!((counts.faulted, counts.forwarded), (3, 7));

    // Rules narrowed to another action or service leave this one alone.
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).for_action("DescribeSubnets"),
        FaultRule::new(FaultKind::Throttle).for_service("elasticloadbalancingv2"),
    ]);
    client
        .describe_vpcs()
        .send()
        .await
        .expect("no rule matches DescribeVpcs");
    assert!(client.describe_subnets().send().await.is_err());

    proxy.set_faults(Vec::new());
    client
        .describe_subnets()
        .send()
        .await
        .expect("faults cleared");
}

#[tokio::test]
async fn latency_is_added_to_forwarded_calls() {
    let proxy = proxy(ProxyConfig {
        latency: Duration::from_millis(200),
        ..ProxyConfig::default()
    })
    .await;
    let client = ec2(&proxy.endpoint(), no_retries()).await;
    // Warm up the SDK and the connection pools so only the proxy's delay is
    // being measured below.
    client.describe_vpcs().send().await.expect("warm-up");

    let started = Instant::now();
    client.describe_vpcs().send().await.expect("delayed call");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "took {elapsed:?}");

    proxy.set_latency(Duration::ZERO);
    proxy.set_faults(vec![
        FaultRule::new(FaultKind::Latency(Duration::from_millis(300)))
            .for_action("DescribeSubnets"),
    ]);
    let started = Instant::now();
    client
        .describe_subnets()
        .send()
        .await
        .expect("delayed by a latency fault");
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(300), "took {elapsed:?}");
    let counts = proxy.calls().get("ec2", "DescribeSubnets");
    assert_eq!(
        (counts.faulted, counts.forwarded),
        (1, 1),
        "a latency fault still forwards"
    );
}

// ---------------------------------------------------------------------------
// The binary
// ---------------------------------------------------------------------------

#[tokio::test]
async fn binary_prints_its_address_and_serves_counts() {
    let upstream = shared_moto_endpoint();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_aws-fault-proxy"))
        .args([
            "--upstream",
            &upstream,
            "--budget-fraction",
            // One token, refilling at one per 50 s: no refill during the test
            // however slow the machine (the binary has no manual clock).
            "0.001",
            "--fault",
            "ec2/DescribeSubnets:error=400/InvalidParameterValue/bad subnet:1:1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("aws-fault-proxy starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the address is printed in time")
        .expect("stdout is readable")
        .expect("a line is printed");
    let endpoint = line
        .strip_prefix("aws-fault-proxy listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let client = ec2(&endpoint, no_retries()).await;
    let err = client
        .describe_subnets()
        .send()
        .await
        .expect_err("fault from --fault");
    assert_eq!(err.code(), Some("InvalidParameterValue"));
    assert_eq!(err.message(), Some("bad subnet"));
    // The faulted call spent the only token: the budget is charged before
    // faults, as a failed real call still counts.
    let err = client
        .describe_subnets()
        .send()
        .await
        .expect_err("budget from --budget-fraction");
    assert_eq!(err.code(), Some("RequestLimitExceeded"));

    let (status, body) = http_request("GET", &format!("{endpoint}/proxy-api/counts")).await;
    assert_eq!(status, 200);
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON counts");
    assert_eq!(json["total_received"], 2);
    assert_eq!(json["total_forwarded"], 0);
    assert_eq!(json["throttled_total"], 1);
    assert_eq!(json["faulted_total"], 1);

    child.kill().await.expect("the proxy stops");
}
