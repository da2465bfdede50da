//! Private and public images, each API version, the web-identity path.

use std::time::Duration;

use ccm_testkit::aws_proxy::{SERVICE_ECR, SERVICE_ECR_PUBLIC};

use crate::support::kubelet::PluginCacheKeyType;
use crate::support::{
    MOTO_PASSWORD, NODE_ACCESS_KEY, PRIVATE_HOST, V1, V1ALPHA1, V1BETA1, World, request,
    request_with_token,
};

const ROLE: &str = "arn:aws:iam::123456789012:role/ecr-pull";

#[tokio::test]
async fn private_images_get_moto_s_token_in_each_api_version() {
    let world = World::start().await;
    for version in [V1, V1BETA1, V1ALPHA1] {
        let image = format!("{PRIVATE_HOST}/team/app:v1");
        let response = world
            .run(&request(version, &image), &[], &[])
            .await
            .response();
        assert_eq!(
            response.api_version, version,
            "answered in the request's version"
        );
        assert_eq!(response.cache_key_type, PluginCacheKeyType::Registry);
        assert_eq!(response.auth.len(), 1);
        let auth = &response.auth[PRIVATE_HOST];
        assert_eq!(
            (auth.username.as_str(), auth.password.as_str()),
            ("AWS", MOTO_PASSWORD)
        );
        // moto's token expired in 2015: no cacheDuration, so the kubelet
        // applies its defaultCacheDuration (upstream's rule), never a
        // negative duration.
        assert_eq!(response.cache_duration, None);
    }
    let counts = world
        .proxy
        .calls()
        .get(SERVICE_ECR, "GetAuthorizationToken");
    assert_eq!((counts.received, counts.forwarded), (3, 3));
    for call in world.proxy.ecr().calls() {
        assert_eq!(
            call.region.as_deref(),
            Some("us-west-2"),
            "the region comes from the host"
        );
        assert_eq!(call.access_key_id.as_deref(), Some(NODE_ACCESS_KEY));
    }
}

#[tokio::test]
async fn public_images_get_an_ecr_public_token_from_us_east_1() {
    let world = World::start().await;
    for (host, version) in [("public.ecr.aws", V1), ("ecr-public.aws.com", V1BETA1)] {
        let image = format!("{host}/nginx/nginx:1.27");
        // A node in another region still asks ECR Public in us-east-1.
        let outcome = world
            .run(
                &request(version, &image),
                &[],
                &[("AWS_REGION", "eu-west-1")],
            )
            .await;
        let response = outcome.response();
        assert_eq!(response.api_version, version);
        let auth = &response.auth[host];
        assert_eq!(auth.username, "AWS");
        let issued = world.proxy.ecr().issued_public_passwords();
        assert_eq!(Some(&auth.password), issued.last());
        // Half of the 12 hours the token is valid, give or take the run.
        let cache = response.cache_duration().expect("a cacheDuration");
        assert!(
            (Duration::from_secs(6 * 3600 - 5)..=Duration::from_secs(6 * 3600)).contains(&cache),
            "{cache:?}"
        );
    }
    let calls = world.proxy.ecr().calls();
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.service == SERVICE_ECR_PUBLIC && c.region.as_deref() == Some("us-east-1"))
    );
}

#[tokio::test]
async fn a_token_without_expiry_is_not_cached() {
    let world = World::start().await;
    world.proxy.ecr().set_answer(
        SERVICE_ECR,
        Some(r#"{"authorizationData":[{"authorizationToken":"QVdTOnB3"}]}"#),
    );
    let response = world
        .run(&request(V1, PRIVATE_HOST), &[], &[])
        .await
        .response();
    assert_eq!(response.cache_duration(), Some(Duration::ZERO));
    assert_eq!(response.auth[PRIVATE_HOST].password, "pw");
}

#[tokio::test]
async fn a_service_account_token_assumes_the_annotated_role_first() {
    let world = World::start().await;
    world.proxy.record_requests(true);
    let request = request_with_token(
        &format!("{PRIVATE_HOST}/app:v1"),
        "eyJhbGciOiJSUzI1NiJ9.sa-token.sig",
        &[("eks.amazonaws.com/ecr-role-arn", ROLE)],
    );
    let response = world.run(&request, &[], &[]).await.response();
    assert_eq!(response.auth[PRIVATE_HOST].password, MOTO_PASSWORD);
    let assumed = world.proxy.requests("AssumeRoleWithWebIdentity");
    assert_eq!(assumed.len(), 1);
    assert_eq!(assumed[0].params["RoleArn"], ROLE);
    assert_eq!(
        assumed[0].params["RoleSessionName"],
        "ecr-credential-provider"
    );
    assert_eq!(
        assumed[0].params["WebIdentityToken"],
        "eyJhbGciOiJSUzI1NiJ9.sa-token.sig"
    );
    // ECR was called with the role's credentials, not the node's.
    let calls = world.proxy.ecr().calls();
    assert_eq!(calls.len(), 1);
    let key = calls[0].access_key_id.as_deref().expect("signed");
    assert_ne!(key, NODE_ACCESS_KEY);
    assert!(key.starts_with("ASIA"), "moto's temporary key: {key}");
}

#[tokio::test]
async fn the_role_can_come_from_the_environment_and_a_token_alone_uses_the_node() {
    let world = World::start().await;
    let with_env = request_with_token("public.ecr.aws/a/b:1", "sa-token", &[]);
    world
        .run(&with_env, &[], &[("AWS_ECR_ROLE_ARN", ROLE)])
        .await
        .response();
    let sts = world.proxy.calls().get("sts", "AssumeRoleWithWebIdentity");
    assert_eq!(sts.forwarded, 1);
    let public_call = &world.proxy.ecr().calls()[0];
    assert_ne!(public_call.access_key_id.as_deref(), Some(NODE_ACCESS_KEY));

    // No role anywhere: upstream's rule, the node's own credentials.
    world.run(&with_env, &[], &[]).await.response();
    assert_eq!(
        world
            .proxy
            .calls()
            .get("sts", "AssumeRoleWithWebIdentity")
            .received,
        1
    );
    assert_eq!(
        world.proxy.ecr().calls()[1].access_key_id.as_deref(),
        Some(NODE_ACCESS_KEY)
    );
}
