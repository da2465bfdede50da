//! The fault proxy's ECR Public stand-in, called with the AWS SDK itself:
//! its refusals and faults reach a real client as AWS's would.

use aws_sdk_ecrpublic::error::ProvideErrorMetadata as _;
use aws_smithy_types::retry::RetryConfig;
use ccm_testkit::aws_proxy::{FaultKind, FaultRule, SERVICE_ECR_PUBLIC};

use crate::support::World;

async fn client(world: &World, region: &str) -> aws_sdk_ecrpublic::Client {
    let credentials =
        aws_credential_types::Credentials::new("AKIDSTANDIN", "secret", None, None, "test");
    let config = aws_sdk_ecrpublic::Config::builder()
        .behavior_version(aws_sdk_ecrpublic::config::BehaviorVersion::latest())
        .region(aws_sdk_ecrpublic::config::Region::new(region.to_owned()))
        .endpoint_url(world.proxy.endpoint())
        .credentials_provider(credentials)
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .build();
    aws_sdk_ecrpublic::Client::from_conf(config)
}

#[tokio::test]
async fn ecr_public_answers_the_sdk_in_us_east_1_and_refuses_other_regions() {
    let world = World::start().await;
    let ok = client(&world, "us-east-1")
        .await
        .get_authorization_token()
        .send()
        .await
        .expect("a token");
    let data = ok.authorization_data().expect("authorization data");
    assert!(data.authorization_token().is_some_and(|t| !t.is_empty()));
    assert!(data.expires_at().is_some());

    let refused = client(&world, "us-west-2")
        .await
        .get_authorization_token()
        .send()
        .await;
    let err = refused.expect_err("us-west-2 is not ECR Public's region");
    assert_eq!(err.code(), Some("InvalidSignatureException"));
    assert!(
        err.message().is_some_and(|m| m.contains("us-west-2")),
        "{err:?}"
    );
    let calls = world
        .proxy
        .calls()
        .get(SERVICE_ECR_PUBLIC, "GetAuthorizationToken");
    assert_eq!(calls.received, 2, "a refusal is not retried");
}

#[tokio::test]
async fn ecr_public_throttling_reaches_the_sdk_as_aws_sends_it() {
    let world = World::start().await;
    world.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle).for_service(SERVICE_ECR_PUBLIC),
    ]);
    let err = client(&world, "us-east-1")
        .await
        .get_authorization_token()
        .send()
        .await
        .expect_err("always throttled");
    assert_eq!(err.code(), Some("ThrottlingException"));
    let calls = world
        .proxy
        .calls()
        .get(SERVICE_ECR_PUBLIC, "GetAuthorizationToken");
    assert_eq!(
        (calls.received, calls.faulted),
        (3, 3),
        "the SDK retried a throttling error"
    );
}
