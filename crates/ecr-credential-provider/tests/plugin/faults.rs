//! Throttling, 5xx and slow answers are retried within bounds; each
//! injected fault is shown to have fired at the proxy.

use std::time::Duration;

use ccm_testkit::aws_proxy::{FaultKind, FaultRule, SERVICE_ECR, SERVICE_ECR_PUBLIC};

use crate::support::{MOTO_PASSWORD, PRIVATE_HOST, V1, World, request, request_with_token};

const ACTION: &str = "GetAuthorizationToken";

fn error(status: u16, code: &str, message: &str) -> FaultKind {
    FaultKind::Error {
        status,
        code: code.into(),
        message: message.into(),
    }
}

#[tokio::test]
async fn throttling_errors_aws_returns_are_retried() {
    let world = World::start().await;
    // ECR's ThrottlingException (400) and the TooManyRequestsException of
    // other AWS JSON APIs, on both registries' APIs.
    let cases = [
        (SERVICE_ECR, PRIVATE_HOST.to_owned(), FaultKind::Throttle),
        (
            SERVICE_ECR,
            PRIVATE_HOST.to_owned(),
            error(400, "TooManyRequestsException", "Too many requests"),
        ),
        (
            SERVICE_ECR_PUBLIC,
            "public.ecr.aws/a/b".to_owned(),
            FaultKind::Throttle,
        ),
        (
            SERVICE_ECR_PUBLIC,
            "public.ecr.aws/a/b".to_owned(),
            error(429, "TooManyRequestsException", "Too many requests"),
        ),
    ];
    for (service, image, kind) in cases {
        world.proxy.reset_counts();
        world.proxy.set_faults(vec![
            FaultRule::new(kind.clone())
                .for_service(service)
                .for_action(ACTION)
                .at_most(2),
        ]);
        world.run(&request(V1, &image), &[], &[]).await.response();
        let counts = world.proxy.calls().get(service, ACTION);
        assert_eq!(
            (counts.faulted, counts.received),
            (2, 3),
            "{service} {kind:?}: {counts:?}"
        );
    }
}

#[tokio::test]
async fn server_errors_and_resets_are_retried() {
    let world = World::start().await;
    for kind in [
        FaultKind::ServerError(500),
        FaultKind::ServerError(503),
        FaultKind::ConnectionReset,
    ] {
        for (service, image) in [
            (SERVICE_ECR, PRIVATE_HOST),
            (SERVICE_ECR_PUBLIC, "ecr-public.aws.com/a/b"),
        ] {
            world.proxy.reset_counts();
            world.proxy.set_faults(vec![
                FaultRule::new(kind.clone()).for_service(service).at_most(1),
            ]);
            world.run(&request(V1, image), &[], &[]).await.response();
            let counts = world.proxy.calls().get(service, ACTION);
            assert_eq!(
                (counts.faulted, counts.received),
                (1, 2),
                "{service} {kind:?}"
            );
        }
    }
}

#[tokio::test]
async fn sts_throttling_is_retried_too() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle)
            .for_service("sts")
            .at_most(2),
    ]);
    let request = request_with_token(
        PRIVATE_HOST,
        "sa-token",
        &[(
            "eks.amazonaws.com/ecr-role-arn",
            "arn:aws:iam::123456789012:role/pull",
        )],
    );
    let response = world.run(&request, &[], &[]).await.response();
    assert_eq!(response.auth[PRIVATE_HOST].password, MOTO_PASSWORD);
    let sts = world.proxy.calls().get("sts", "AssumeRoleWithWebIdentity");
    assert_eq!((sts.faulted, sts.received, sts.forwarded), (2, 3, 1));
}

#[tokio::test]
async fn retries_are_bounded_and_the_last_error_is_told() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).for_service(SERVICE_ECR),
    ]);
    let outcome = world
        .run(
            &request(V1, PRIVATE_HOST),
            &["--max-attempts=3", "--v=2"],
            &[],
        )
        .await;
    let stderr = outcome.failure();
    for attempt in 1..=3 {
        let line = format!(
            "ECR GetAuthorizationToken attempt {attempt} failed: HTTP 400 ThrottlingException"
        );
        assert!(
            stderr.contains(&line),
            "--v=2 shows each failed attempt: {stderr}"
        );
    }
    assert!(
        stderr.contains("ECR GetAuthorizationToken in us-west-2 failed"),
        "{stderr}"
    );
    assert!(stderr.contains("ThrottlingException"), "{stderr}");
    let counts = world.proxy.calls().get(SERVICE_ECR, ACTION);
    assert_eq!(
        (counts.received, counts.faulted, counts.forwarded),
        (3, 3, 0)
    );
}

/// A proxy in front of ECR answering 503 with an HTML page: the one line
/// the kubelet logs names the operation and the status, and the page's
/// start, instead of the SDK's bare "unexpected token".
#[tokio::test]
async fn an_html_5xx_names_the_status_and_the_operation() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::HtmlPage(503))
            .for_service(SERVICE_ECR)
            .for_action(ACTION),
    ]);
    let outcome = world
        .run(&request(V1, PRIVATE_HOST), &["--max-attempts=2"], &[])
        .await;
    let stderr = outcome.failure();
    assert!(
        stderr.contains(
            "ecr:GetAuthorizationToken answered HTTP 503 with a non-JSON body: <!DOCTYPE html>"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("503 Service Unavailable"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    let counts = world.proxy.calls().get(SERVICE_ECR, ACTION);
    assert_eq!(
        (counts.received, counts.faulted, counts.forwarded),
        (2, 2, 0),
        "the page was answered, and retried as a 503"
    );
}

#[tokio::test]
async fn refusals_are_not_retried() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(error(
            400,
            "AccessDeniedException",
            "User: node is not authorized to perform: ecr:GetAuthorizationToken on resource: *",
        ))
        .for_service(SERVICE_ECR),
    ]);
    let outcome = world.run(&request(V1, PRIVATE_HOST), &[], &[]).await;
    assert!(
        outcome.failure().contains("AccessDeniedException"),
        "{}",
        outcome.stderr
    );
    assert_eq!(world.proxy.calls().get(SERVICE_ECR, ACTION).received, 1);
}

#[tokio::test]
async fn a_slow_attempt_times_out_and_is_retried() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Latency(Duration::from_secs(5)))
            .for_service(SERVICE_ECR)
            .at_most(1),
    ]);
    let started = std::time::Instant::now();
    let outcome = world
        .run(
            &request(V1, PRIVATE_HOST),
            &["--attempt-timeout=500ms"],
            &[],
        )
        .await;
    outcome.response();
    let counts = world.proxy.calls().get(SERVICE_ECR, ACTION);
    // The slow attempt was cut and another one answered. On a loaded
    // machine an unfaulted attempt can outlast 500 ms too and be cut in
    // turn: the promise is the retry, not how many the machine needed
    // (at most the 5 attempts of the default limits).
    assert_eq!(counts.faulted, 1, "{counts:?}");
    assert!((2..=5).contains(&counts.received), "{counts:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "did not wait for the slow answer: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn the_operation_timeout_bounds_the_whole_call() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Latency(Duration::from_secs(10))).for_service(SERVICE_ECR),
    ]);
    let started = std::time::Instant::now();
    let outcome = world
        .run(
            &request(V1, PRIVATE_HOST),
            &["--attempt-timeout=5s", "--operation-timeout=1s"],
            &[],
        )
        .await;
    let stderr = outcome.failure();
    assert!(
        stderr.contains("timeout") || stderr.contains("timed out"),
        "{stderr}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(world.proxy.calls().get(SERVICE_ECR, ACTION).faulted, 1);
}
