//! iam/ecr-credential-provider-policy.json, evaluated as AWS evaluates it,
//! with the same oracle as the CCM's policy (`ccm_testkit::iam`), and
//! proven both ways against the real binary: with the policy enforced at
//! the fault proxy every pull's token is granted, and without any one of
//! its actions some pull is refused, so nothing is granted that is not needed.

use std::collections::BTreeSet;

use ccm_testkit::iam::{Context, Policy};
use serde_json::Value;

#[path = "plugin/support/mod.rs"]
#[allow(dead_code)]
mod support;

use support::{PRIVATE_HOST, V1, World, request};

/// What the plugin's calls need from the node's role (or the role it
/// assumes): ECR's token, and ECR Public's, which is a service bearer token.
const NEEDED: [&str; 3] = [
    "ecr:GetAuthorizationToken",
    "ecr-public:GetAuthorizationToken",
    "sts:GetServiceBearerToken",
];

fn policy_text() -> String {
    let path = ccm_testkit::repo_path("iam/ecr-credential-provider-policy.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn the_policy_grants_exactly_the_token_calls() {
    let text = policy_text();
    let policy = Policy::parse(&text).expect("the oracle parses the policy");
    for action in NEEDED {
        assert!(
            policy
                .evaluate(action, "*", &Context::default())
                .is_allowed(),
            "{action}"
        );
    }
    // Pulling the layers is the registry's business (the kubelet's runtime,
    // with the token), and nothing else is this plugin's.
    for action in [
        "ecr:BatchGetImage",
        "ecr:GetDownloadUrlForLayer",
        "ecr:PutImage",
        "ecr-public:PutImage",
        "sts:AssumeRole",
        "sts:GetCallerIdentity",
    ] {
        assert!(
            !policy
                .evaluate(action, "*", &Context::default())
                .is_allowed(),
            "{action}"
        );
    }
    let granted: BTreeSet<String> = policy.allowed_action_patterns().into_iter().collect();
    let needed: BTreeSet<String> = NEEDED.iter().map(|a| a.to_string()).collect();
    assert_eq!(granted, needed);
    let json: Value = serde_json::from_str(&text).expect("JSON");
    for statement in json["Statement"].as_array().expect("a list") {
        assert!(statement["Sid"].is_string(), "every statement has a Sid");
        assert_eq!(statement["Effect"], "Allow");
        // GetAuthorizationToken has no resource-level permissions.
        assert_eq!(statement["Resource"], "*");
        assert!(statement.get("NotAction").is_none() && statement.get("Condition").is_none());
    }
}

/// The policy without `action`.
fn without(text: &str, action: &str) -> String {
    let mut json: Value = serde_json::from_str(text).expect("JSON");
    let statements = json["Statement"].as_array_mut().expect("a list");
    for statement in statements.iter_mut() {
        let kept: Vec<Value> = match &statement["Action"] {
            Value::String(a) => vec![Value::from(a.as_str())],
            Value::Array(list) => list.clone(),
            _ => Vec::new(),
        }
        .into_iter()
        .filter(|a| a != action)
        .collect();
        statement["Action"] = Value::Array(kept);
    }
    statements.retain(|s| !s["Action"].as_array().is_some_and(Vec::is_empty));
    json.to_string()
}

#[tokio::test]
async fn every_grant_is_needed_and_enough() {
    let world = World::start().await;
    let text = policy_text();
    let pulls = [
        request(V1, &format!("{PRIVATE_HOST}/app:v1")),
        request(V1, "public.ecr.aws/nginx/nginx:1"),
    ];
    world
        .proxy
        .ecr()
        .set_caller_policy(Some(&text))
        .expect("policy");
    for pull in &pulls {
        world.run(pull, &[], &[]).await.response();
    }
    for action in NEEDED {
        world
            .proxy
            .ecr()
            .set_caller_policy(Some(&without(&text, action)))
            .expect("policy");
        let mut refused = 0;
        for pull in &pulls {
            let outcome = world.run(pull, &[], &[]).await;
            if outcome.code != Some(0) {
                assert!(
                    outcome
                        .stderr
                        .contains(&format!("not authorized to perform: {action}")),
                    "{}",
                    outcome.stderr
                );
                refused += 1;
            }
        }
        assert_eq!(
            refused, 1,
            "without {action} exactly one kind of pull fails"
        );
    }
}
