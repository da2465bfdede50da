//! iam/policy.json grants exactly what the CCM calls.
//!
//! `policy_is_least_privilege` checks the policy on its own: every action is
//! one the client layer's operation table knows, reads are the only
//! unconditioned grants, and every write is conditioned on this cluster's
//! tag. `recorded_actions_match_policy` compares it with what the CCM
//! actually sent to AWS during the whole integration suite, as recorded by
//! the test proxies (`AWS_CCM_RECORD_ACTIONS`); `make test` runs it after
//! the suite (nextest's default filter leaves it out of a plain run).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use aws_ccm::aws::{Operation, Service};
use aws_ccm::testkit::aws_proxy::RECORD_ENV;
use serde_json::Value;

const CLUSTER_TAG: &str = "kubernetes.io/cluster/CLUSTER_ID";

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn policy() -> Value {
    let path = repo_file("iam/policy.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn list(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// IAM's name for an operation: ELB and ELBv2 share one prefix.
fn iam_action(service: &str, action: &str) -> String {
    let prefix = match service {
        "ec2" => "ec2",
        "elb" | "elbv2" | "elasticloadbalancing" | "elasticloadbalancingv2" => {
            "elasticloadbalancing"
        }
        "sts" => "sts",
        other => panic!("unknown service {other}"),
    };
    format!("{prefix}:{action}")
}

fn table_actions() -> BTreeSet<String> {
    Operation::ALL
        .iter()
        .map(|op| {
            let service = match op.service() {
                Service::Ec2 => "ec2",
                Service::Elb => "elb",
                Service::Elbv2 => "elbv2",
                Service::Sts => "sts",
            };
            iam_action(service, op.action())
        })
        .collect()
}

fn granted(policy: &Value) -> BTreeSet<String> {
    policy["Statement"]
        .as_array()
        .expect("Statement is a list")
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .flat_map(|s| list(&s["Action"]))
        .collect()
}

fn is_read(action: &str) -> bool {
    let name = action.split(':').nth(1).unwrap_or_default();
    name.starts_with("Describe") || name.starts_with("Get") || name.starts_with("List")
}

#[test]
fn policy_is_least_privilege() {
    let policy = policy();
    assert_eq!(policy["Version"], "2012-10-17");
    let table = table_actions();
    let mut sids = BTreeSet::new();
    for statement in policy["Statement"].as_array().expect("Statement is a list") {
        let sid = statement["Sid"]
            .as_str()
            .expect("every statement has a Sid");
        assert!(sids.insert(sid.to_string()), "duplicate Sid {sid}");
        assert_eq!(statement["Effect"], "Allow", "{sid}: only Allow statements");
        assert!(statement.get("NotAction").is_none() && statement.get("NotResource").is_none());
        let actions = list(&statement["Action"]);
        assert!(!actions.is_empty(), "{sid}: no actions");
        for action in &actions {
            assert!(!action.contains('*'), "{sid}: wildcard action {action}");
            assert!(
                table.contains(action),
                "{sid}: {action} is not an operation the client layer can call (src/aws/operations.rs)"
            );
        }
        let reads = actions.iter().filter(|a| is_read(a)).count();
        assert!(
            reads == 0 || reads == actions.len(),
            "{sid}: mixes reads and writes; keep writes in conditioned statements"
        );
        if reads == 0 {
            let condition = serde_json::to_string(&statement["Condition"]).unwrap_or_default();
            assert!(
                condition.contains(CLUSTER_TAG) || condition.contains("CreateAction"),
                "{sid}: writes ({}) must be conditioned on {CLUSTER_TAG} or be tag-on-create",
                actions.join(", ")
            );
            assert!(
                !list(&statement["Resource"]).iter().any(|r| r == "*"),
                "{sid}: writes name their resource types instead of \"*\""
            );
        }
        if actions.iter().any(|a| a.contains(":Delete")) {
            let condition = serde_json::to_string(&statement["Condition"]).unwrap_or_default();
            let owned = condition.contains(&format!("\"aws:ResourceTag/{CLUSTER_TAG}\":\"owned\""));
            let routes_or_tags = actions
                .iter()
                .filter(|a| a.contains(":Delete"))
                .all(|a| a == "ec2:DeleteRoute" || a == "ec2:DeleteTags");
            assert!(
                owned || routes_or_tags,
                "{sid}: deleting a resource needs {CLUSTER_TAG}=owned on it"
            );
        }
    }

    let trust_path = repo_file("iam/trust-policy.json");
    let trust: Value =
        serde_json::from_str(&std::fs::read_to_string(&trust_path).expect("trust policy"))
            .expect("trust policy is JSON");
    let statement = &trust["Statement"][0];
    assert_eq!(statement["Action"], "sts:AssumeRoleWithWebIdentity");
    assert_eq!(
        statement["Condition"]["StringEquals"]["OIDC_ISSUER:sub"],
        "system:serviceaccount:kube-system:cloud-controller-manager"
    );
}

#[test]
fn recorded_actions_match_policy() {
    let dir = std::env::var_os(RECORD_ENV).unwrap_or_else(|| {
        panic!("{RECORD_ENV} is not set: run `make test`, which records the suite's AWS calls and then runs this")
    });
    let mut recorded = BTreeSet::new();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for line in text.lines() {
            if let Some((service, action)) = line.split_once(' ') {
                recorded.insert(iam_action(service, action));
            }
        }
    }
    assert!(
        recorded.len() > 10,
        "only {} actions recorded in {}: did the integration suite run through the proxies?",
        recorded.len(),
        dir.display()
    );
    let granted = granted(&policy());
    let not_granted: Vec<_> = recorded.difference(&granted).collect();
    let never_called: Vec<_> = granted.difference(&recorded).collect();
    assert!(
        not_granted.is_empty() && never_called.is_empty(),
        "iam/policy.json and the CCM's calls differ.\n  called but not granted: {not_granted:?}\n  granted but never called by any test: {never_called:?}"
    );
}
