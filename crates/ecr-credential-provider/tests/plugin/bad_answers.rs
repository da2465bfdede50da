//! Answers AWS should not give, and refusals it does give, end in a clear
//! failure, never a half-filled response.

use ccm_testkit::aws_proxy::{SERVICE_ECR, SERVICE_ECR_PUBLIC};

use crate::support::{PRIVATE_HOST, V1, World, request};

/// base64 of a token without ':' and of one with an empty password.
const NO_COLON_B64: &str = "QVdTbm9jb2xvbg==";
const EMPTY_PASSWORD_B64: &str = "QVdTOg==";

#[tokio::test]
async fn unusable_tokens_are_errors() {
    let world = World::start().await;
    let private = [
        (r#"{}"#, "ECR answered without authorization data"),
        (
            r#"{"authorizationData":[]}"#,
            "ECR answered without authorization data",
        ),
        (
            r#"{"authorizationData":[{"expiresAt":1.7e9}]}"#,
            "ECR answered authorization data without a token",
        ),
        (
            r#"{"authorizationData":[{"authorizationToken":"%%not-base64%%"}]}"#,
            "not base64",
        ),
        (
            &format!(r#"{{"authorizationData":[{{"authorizationToken":"{NO_COLON_B64}"}}]}}"#),
            "no ':'",
        ),
        (
            &format!(
                r#"{{"authorizationData":[{{"authorizationToken":"{EMPTY_PASSWORD_B64}"}}]}}"#
            ),
            "empty password",
        ),
    ];
    for (body, reason) in private {
        world.proxy.ecr().set_answer(SERVICE_ECR, Some(body));
        let outcome = world
            .run(&request(V1, &format!("{PRIVATE_HOST}/app")), &[], &[])
            .await;
        let stderr = outcome.failure();
        assert!(stderr.contains(reason), "{body}: {stderr}");
        assert!(
            stderr.contains(&format!("{PRIVATE_HOST}/app")),
            "names the image: {stderr}"
        );
    }
    let public = [
        (r#"{}"#, "ECR Public answered without authorization data"),
        (
            r#"{"authorizationData":{}}"#,
            "ECR Public answered authorization data without a token",
        ),
        (
            &format!(r#"{{"authorizationData":{{"authorizationToken":"{NO_COLON_B64}"}}}}"#),
            "no ':'",
        ),
    ];
    for (body, reason) in public {
        world.proxy.ecr().set_answer(SERVICE_ECR_PUBLIC, Some(body));
        let outcome = world
            .run(&request(V1, "public.ecr.aws/a/b"), &[], &[])
            .await;
        assert!(
            outcome.failure().contains(reason),
            "{body}: {}",
            outcome.stderr
        );
    }
    // Each bad answer was received once: a bad answer is not retried.
    assert_eq!(
        world.proxy.ecr().calls().len(),
        private.len() + public.len()
    );
}

#[tokio::test]
async fn ecr_public_needs_the_service_bearer_token_permission() {
    let world = World::start().await;
    let without_bearer = r#"{"Version":"2012-10-17","Statement":[{"Sid":"Pull","Effect":"Allow",
        "Action":["ecr:GetAuthorizationToken","ecr-public:GetAuthorizationToken"],"Resource":"*"}]}"#;
    world
        .proxy
        .ecr()
        .set_caller_policy(Some(without_bearer))
        .expect("policy parses");
    let outcome = world
        .run(&request(V1, "public.ecr.aws/a/b"), &[], &[])
        .await;
    let stderr = outcome.failure();
    assert!(stderr.contains("AccessDeniedException"), "{stderr}");
    assert!(stderr.contains("sts:GetServiceBearerToken"), "{stderr}");
    // The same node can still pull private images.
    world
        .run(&request(V1, PRIVATE_HOST), &[], &[])
        .await
        .response();

    let policy = std::fs::read_to_string(ccm_testkit::repo_path(
        "iam/ecr-credential-provider-policy.json",
    ))
    .expect("the plugin's policy");
    world
        .proxy
        .ecr()
        .set_caller_policy(Some(&policy))
        .expect("policy parses");
    world
        .run(&request(V1, "public.ecr.aws/a/b"), &[], &[])
        .await
        .response();
    world
        .run(&request(V1, PRIVATE_HOST), &[], &[])
        .await
        .response();
}
