//! Nothing secret on stderr, at any verbosity, on success or failure: not
//! the node's secret key, not the service account token, not a token or
//! password AWS answered, not the assumed role's secret or session token.

use ccm_testkit::aws_proxy::{FaultKind, FaultRule, SERVICE_ECR};

use crate::support::{
    MOTO_PASSWORD, MOTO_TOKEN_B64, NODE_SECRET_KEY, PRIVATE_HOST, V1, World, request,
    request_with_token,
};

const SA_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.service-account-token-never-logged.sig";

#[tokio::test]
async fn stderr_holds_no_secret_at_any_verbosity() {
    let world = World::start().await;
    let role = [(
        "eks.amazonaws.com/ecr-role-arn",
        "arn:aws:iam::123456789012:role/pull",
    )];
    let requests = [
        request(V1, &format!("{PRIVATE_HOST}/app")),
        request(V1, "public.ecr.aws/a/b"),
        request_with_token(PRIVATE_HOST, SA_TOKEN, &role),
        request_with_token("public.ecr.aws/a/b", SA_TOKEN, &role),
    ];
    let mut stderr = String::new();
    let mut public_passwords = 0;
    for verbosity in ["--v=0", "--v=1", "--v=10"] {
        // The SDK's trace events would describe requests and answers: no
        // subscriber is installed, whatever RUST_LOG says.
        let env = [("RUST_LOG", "trace")];
        for faults in [false, true] {
            world.proxy.set_faults(if faults {
                vec![
                    FaultRule::new(FaultKind::Throttle)
                        .for_service(SERVICE_ECR)
                        .at_most(1),
                ]
            } else {
                Vec::new()
            });
            for body in &requests {
                let outcome = world.run(body, &[verbosity], &env).await;
                outcome.response();
                stderr.push_str(&outcome.stderr);
            }
        }
        // A failure after the token was read: the bad answer is not quoted.
        world.proxy.ecr().set_answer(
            SERVICE_ECR,
            Some(
                r#"{"authorizationData":[{"authorizationToken":"QVdTLXNlY3JldC1uby1jb2xvbg=="}]}"#,
            ),
        );
        stderr.push_str(world.run(&requests[0], &[verbosity], &env).await.failure());
        world.proxy.ecr().set_answer(SERVICE_ECR, None);
        public_passwords = world.proxy.ecr().issued_public_passwords().len();
    }
    assert!(
        stderr.contains("answered for image"),
        "verbose runs say what they did: {stderr}"
    );
    let mut secrets = vec![
        NODE_SECRET_KEY.to_owned(),
        SA_TOKEN.to_owned(),
        MOTO_PASSWORD.to_owned(),
        MOTO_TOKEN_B64.to_owned(),
        "QVdTLXNlY3JldC1uby1jb2xvbg==".to_owned(),
        "AWS-secret-no-colon".to_owned(),
        // moto's session tokens all begin so.
        "FQoGZXIvYXdzE".to_owned(),
    ];
    secrets.extend(world.proxy.ecr().issued_public_passwords());
    assert_eq!(public_passwords, 12, "ECR Public tokens were issued");
    for secret in secrets {
        assert!(
            !stderr.contains(&secret),
            "stderr shows {secret:?}:\n{stderr}"
        );
    }
}
