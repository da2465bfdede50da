//! manifests/base/rbac.yaml against what the CCM does.
//!
//! The integration suite runs the CCM as the service account
//! `kube-system/cloud-controller-manager` against the API test server, which
//! enforces this manifest's RBAC (403 for anything not granted) and, when
//! `AWS_CCM_RECORD_KUBE_REQUESTS` names a directory, records each distinct
//! request with the rules that granted it. `recorded_requests_are_allowed`
//! reads what the whole suite recorded (`make test` runs it last; nextest's
//! default filter leaves it out of a plain run) and fails both ways:
//! a request RBAC denied (used but not granted), and a verb on a resource
//! that a rule grants but no request used (granted but never used).

use std::collections::{BTreeMap, BTreeSet};

use ccm_testkit::apiserver::rbac::{
    Attributes, RECORD_KUBE_ENV, RbacPolicy, RbacRecord, rule_allows,
};

const CCM_USER: &str = "system:serviceaccount:kube-system:cloud-controller-manager";

fn ccm_groups() -> Vec<String> {
    [
        "system:serviceaccounts",
        "system:serviceaccounts:kube-system",
        "system:authenticated",
    ]
    .iter()
    .map(|g| g.to_string())
    .collect()
}

fn manifest() -> RbacPolicy {
    let path = ccm_testkit::repo_path("manifests/base/rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    RbacPolicy::parse(&text).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// Grants the manifest binds on purpose although no test makes the CCM use
/// them, each with its reason: (role id, verb, resource).
const UNUSED_ON_PURPOSE: &[(&str, &str, &str, &str)] = &[(
    "Role/kube-system/extension-apiserver-authentication-reader",
    "*",
    "configmaps",
    "every cloud-controller-manager install grants it, so the --authentication-* flags keep working when a later version reads the client CA from this ConfigMap (manifest comment)",
)];

#[test]
fn the_manifest_binds_the_ccms_service_account() {
    let policy = manifest();
    let roles: BTreeSet<String> = policy
        .roles_bound_by_manifest(CCM_USER, &ccm_groups())
        .iter()
        .map(|r| r.id.clone())
        .collect();
    for wanted in [
        "ClusterRole/system:cloud-controller-manager",
        "Role/kube-system/cloud-controller-manager:leader-election",
        "ClusterRole/system:auth-delegator",
    ] {
        assert!(
            roles.contains(wanted),
            "{wanted} is not bound to {CCM_USER}: {roles:?}"
        );
    }
    // What the CCM cannot do: change Services' specs, or touch Secrets.
    let attrs = |verb: &str, resource: &str, sub: &str| Attributes {
        verb: verb.into(),
        resource: resource.into(),
        subresource: sub.into(),
        namespace: "default".into(),
        name: "x".into(),
        ..Default::default()
    };
    for (verb, resource) in [
        ("update", "services"),
        ("get", "secrets"),
        ("delete", "services"),
    ] {
        assert!(
            policy
                .granting_rules(CCM_USER, &ccm_groups(), &attrs(verb, resource, ""))
                .is_empty(),
            "{verb} {resource} is granted"
        );
    }
}

fn recorded() -> Vec<RbacRecord> {
    ccm_testkit::records::read_all(RECORD_KUBE_ENV)
}

fn describe(r: &RbacRecord) -> String {
    if let Some(path) = &r.path {
        return format!("{} {path}", r.verb);
    }
    let resource = if r.subresource.is_empty() {
        r.resource.clone()
    } else {
        format!("{}/{}", r.resource, r.subresource)
    };
    let group = if r.group.is_empty() { "core" } else { &r.group };
    let scope = if r.namespace.is_empty() {
        "cluster scope".to_string()
    } else {
        format!("namespace {}", r.namespace)
    };
    format!("{} {resource} (group {group}, {scope})", r.verb)
}

#[test]
fn recorded_requests_are_allowed() {
    let records: Vec<RbacRecord> = recorded()
        .into_iter()
        .filter(|r| r.user == CCM_USER)
        .collect();
    assert!(
        records.len() > 10,
        "only {} requests of {CCM_USER} recorded: did the integration suite run the CCM against the API test server with {RECORD_KUBE_ENV} set?",
        records.len()
    );
    let denied: BTreeSet<String> = records
        .iter()
        .filter(|r| !r.allowed)
        .map(describe)
        .collect();
    let used: BTreeSet<String> = records.iter().filter(|r| r.allowed).map(describe).collect();
    println!(
        "rbac: {} distinct requests of {CCM_USER}: {} allowed, {} denied",
        records.len(),
        used.len(),
        denied.len()
    );
    assert!(
        denied.is_empty(),
        "manifests/base/rbac.yaml does not grant these requests the CCM made (kube-apiserver answers 403):\n  {}",
        denied.iter().cloned().collect::<Vec<_>>().join("\n  ")
    );

    // Granted but never used: each verb of each rule, on each resource it
    // names, must have been granted by that rule to some request.
    let policy = manifest();
    let mut unused: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for role in policy.roles_bound_by_manifest(CCM_USER, &ccm_groups()) {
        for (i, rule) in role.rules.iter().enumerate() {
            let by_rule: Vec<&RbacRecord> = records
                .iter()
                .filter(|r| {
                    r.granted_by
                        .iter()
                        .any(|g| g.role == role.id && g.rule == i)
                })
                .collect();
            let resources: Vec<String> = if rule.non_resource_urls.is_empty() {
                rule.resources.clone()
            } else {
                rule.non_resource_urls.clone()
            };
            for verb in &rule.verbs {
                for resource in &resources {
                    let covered = by_rule.iter().any(|r| {
                        let one = ccm_testkit::apiserver::rbac::PolicyRule {
                            verbs: vec![verb.clone()],
                            resources: vec![resource.clone()],
                            non_resource_urls: rule
                                .non_resource_urls
                                .iter()
                                .filter(|u| *u == resource)
                                .cloned()
                                .collect(),
                            ..rule.clone()
                        };
                        let a = Attributes {
                            verb: r.verb.clone(),
                            group: r.group.clone(),
                            resource: r.resource.clone(),
                            subresource: r.subresource.clone(),
                            namespace: r.namespace.clone(),
                            // The rule matched the request, names included.
                            name: rule.resource_names.first().cloned().unwrap_or_default(),
                            path: r.path.clone(),
                        };
                        rule_allows(&one, &a)
                    });
                    let on_purpose = UNUSED_ON_PURPOSE.iter().any(|(id, v, res, _)| {
                        *id == role.id && (*v == "*" || v == verb) && res == resource
                    });
                    if !covered && !on_purpose {
                        unused
                            .entry(format!("{} rule {i}", role.id))
                            .or_default()
                            .push(format!("{verb} {resource}"));
                    }
                }
            }
        }
    }
    assert!(
        unused.is_empty(),
        "manifests/base/rbac.yaml grants what no test made the CCM use (remove it, or add a test that needs it):\n{}",
        unused
            .iter()
            .map(|(rule, what)| format!("  {rule}: {}", what.join(", ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
