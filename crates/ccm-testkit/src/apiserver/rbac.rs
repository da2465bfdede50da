//! RBAC as kube-apiserver's RBAC authorizer decides it, from the
//! ClusterRoles, Roles and bindings of a manifest (read as data), plus the
//! bootstrap roles a manifest may bind without defining them.
//!
//! Matching follows `k8s.io/kubernetes/pkg/apis/rbac/v1` `VerbMatches`,
//! `APIGroupMatches`, `ResourceMatches` (`*`, `resource/subresource`,
//! `*/subresource`), `ResourceNameMatches` (a rule with names never
//! matches a request without one, such as `create` or `list`) and
//! `NonResourceURLMatches` (`*`, a trailing `*`, or exact). A RoleBinding
//! grants its role's resource rules in its own namespace only; non-resource
//! rules count only through ClusterRoleBindings.
//!
//! When a record directory is set (`AWS_CCM_RECORD_KUBE_REQUESTS` for the
//! integration suite), each distinct request of an authenticated user is
//! appended to `<dir>/<pid>-<port>.kube-requests` as one JSON
//! [`RbacRecord`] per line, with the rules that granted it, for the RBAC
//! coverage test (`crates/aws-ccm/tests/rbac_policy.rs`).

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variable naming the directory the integration suite
/// records the Kubernetes requests of authenticated users to.
pub const RECORD_KUBE_ENV: &str = "AWS_CCM_RECORD_KUBE_REQUESTS";

/// The roles kube-apiserver creates at start-up that a manifest may bind
/// (`plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go` and
/// `namespace_policy.go`), with the bindings to every authenticated user
/// it creates for discovery, basic-user and public-info-viewer.
const BOOTSTRAP: &str = r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:auth-delegator"}
rules:
  - apiGroups: [authentication.k8s.io]
    resources: [tokenreviews]
    verbs: [create]
  - apiGroups: [authorization.k8s.io]
    resources: [subjectaccessreviews]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: extension-apiserver-authentication-reader, namespace: kube-system}
rules:
  - apiGroups: [""]
    resources: [configmaps]
    resourceNames: [extension-apiserver-authentication]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:discovery"}
rules:
  - nonResourceURLs: [/api, /api/*, /apis, /apis/*, /healthz, /livez, /openapi, /openapi/*, /readyz, /version, /version/]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:basic-user"}
rules:
  - apiGroups: [authorization.k8s.io]
    resources: [selfsubjectaccessreviews, selfsubjectrulesreviews]
    verbs: [create]
  - apiGroups: [authentication.k8s.io]
    resources: [selfsubjectreviews]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:public-info-viewer"}
rules:
  - nonResourceURLs: [/healthz, /livez, /readyz, /version, /version/]
    verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:discovery"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:discovery"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:basic-user"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:basic-user"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:public-info-viewer"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:public-info-viewer"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "system:authenticated"}]
"#;

/// One rule of a role, as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PolicyRule {
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    pub resource_names: Vec<String>,
    #[serde(rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

/// A ClusterRole or Role.
#[derive(Debug, Clone, PartialEq)]
pub struct Role {
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub id: String,
    pub rules: Vec<PolicyRule>,
    /// Created by kube-apiserver, not by the manifest.
    pub bootstrap: bool,
}

#[derive(Debug, Clone, PartialEq)]
struct Binding {
    /// The RoleBinding's namespace; `None` for a ClusterRoleBinding.
    namespace: Option<String>,
    /// The role's id (see [`Role::id`]).
    role: String,
    /// User names and `group:`-prefixed group names.
    subjects: Vec<String>,
    /// Created by kube-apiserver, not by the manifest.
    bootstrap: bool,
}

/// The request attributes RBAC decides on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// Set for non-resource requests (discovery, /version, …) only.
    pub path: Option<String>,
}

impl Attributes {
    /// `resource` or `resource/subresource`.
    pub fn combined_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// Which rule of which role granted a request.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RuleRef {
    pub role: String,
    pub rule: usize,
}

/// One recorded request of an authenticated user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RbacRecord {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// Empty at the cluster scope.
    pub namespace: String,
    /// Set for non-resource requests.
    pub path: Option<String>,
    pub allowed: bool,
    /// The rules that allow it (empty when denied).
    pub granted_by: Vec<RuleRef>,
}

/// Roles and bindings: what RBAC grants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RbacPolicy {
    pub roles: Vec<Role>,
    bindings: Vec<Binding>,
}

fn list(v: &Value, key: &str) -> Vec<Value> {
    v.get(key)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

impl RbacPolicy {
    /// The roles and bindings of a multi-document YAML (other kinds are
    /// ignored), with kube-apiserver's bootstrap roles added.
    pub fn parse(yaml: &str) -> anyhow::Result<RbacPolicy> {
        let mut policy = RbacPolicy::default();
        policy.add(BOOTSTRAP, true).context("the bootstrap roles")?;
        policy.add(yaml, false)?;
        Ok(policy)
    }

    fn add(&mut self, yaml: &str, bootstrap: bool) -> anyhow::Result<()> {
        for (i, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
            let v: Value = Deserialize::deserialize(doc)
                .with_context(|| format!("parsing RBAC YAML document {}", i + 1))?;
            if v.is_null() {
                continue;
            }
            let api_version = text(&v, "/apiVersion");
            let kind = text(&v, "/kind");
            if api_version != "rbac.authorization.k8s.io/v1" {
                continue;
            }
            let name = text(&v, "/metadata/name");
            let ns = text(&v, "/metadata/namespace");
            if name.is_empty() {
                bail!("RBAC document {} ({kind}) has no metadata.name", i + 1);
            }
            match kind {
                "ClusterRole" | "Role" => {
                    let id = if kind == "Role" {
                        if ns.is_empty() {
                            bail!("Role {name} has no metadata.namespace: a Role is namespaced");
                        }
                        format!("Role/{ns}/{name}")
                    } else {
                        format!("ClusterRole/{name}")
                    };
                    let rules = list(&v, "rules")
                        .into_iter()
                        .enumerate()
                        .map(|(j, r)| {
                            serde_json::from_value(r)
                                .with_context(|| format!("{id}: rule {j} is not a PolicyRule"))
                        })
                        .collect::<anyhow::Result<Vec<PolicyRule>>>()?;
                    self.roles.retain(|r| r.id != id);
                    self.roles.push(Role {
                        id,
                        rules,
                        bootstrap,
                    });
                }
                "ClusterRoleBinding" | "RoleBinding" => {
                    let ref_kind = text(&v, "/roleRef/kind");
                    let ref_name = text(&v, "/roleRef/name");
                    let role = match (kind, ref_kind) {
                        (_, "ClusterRole") => format!("ClusterRole/{ref_name}"),
                        ("RoleBinding", "Role") if !ns.is_empty() => {
                            format!("Role/{ns}/{ref_name}")
                        }
                        _ => bail!(
                            "{kind} {name}: roleRef kind {ref_kind:?} cannot be bound by a {kind} (use ClusterRole, or Role from a RoleBinding)"
                        ),
                    };
                    let subjects = list(&v, "subjects")
                        .iter()
                        .map(|s| {
                            let sname = text(s, "/name");
                            match text(s, "/kind") {
                                "ServiceAccount" => Ok(format!(
                                    "system:serviceaccount:{}:{sname}",
                                    match text(s, "/namespace") {
                                        "" => ns,
                                        n => n,
                                    }
                                )),
                                "User" => Ok(sname.to_string()),
                                "Group" => Ok(format!("group:{sname}")),
                                other => bail!("{kind} {name}: unknown subject kind {other:?}"),
                            }
                        })
                        .collect::<anyhow::Result<Vec<String>>>()?;
                    self.bindings.push(Binding {
                        namespace: (kind == "RoleBinding").then(|| ns.to_string()),
                        role,
                        subjects,
                        bootstrap,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The roles the manifest itself (not kube-apiserver's bootstrap
    /// bindings) binds to `user` or one of its `groups`, each once.
    pub fn roles_bound_by_manifest(&self, user: &str, groups: &[String]) -> Vec<&Role> {
        let mut out: Vec<&Role> = Vec::new();
        for b in self.bindings.iter().filter(|b| !b.bootstrap) {
            let bound = b.subjects.iter().any(|s| match s.strip_prefix("group:") {
                Some(g) => groups.iter().any(|x| x == g),
                None => s == user,
            });
            if let Some(role) = self.roles.iter().find(|r| r.id == b.role)
                && bound
                && !out.iter().any(|r| r.id == role.id)
            {
                out.push(role);
            }
        }
        out
    }

    /// The rules that allow `user` (in `groups`) this request; empty means
    /// RBAC denies it.
    pub fn granting_rules(&self, user: &str, groups: &[String], a: &Attributes) -> Vec<RuleRef> {
        let mut out = Vec::new();
        for b in &self.bindings {
            let bound = b.subjects.iter().any(|s| match s.strip_prefix("group:") {
                Some(g) => groups.iter().any(|x| x == g),
                None => s == user,
            });
            if !bound {
                continue;
            }
            if let Some(ns) = &b.namespace
                && (a.path.is_some() || *ns != a.namespace)
            {
                continue;
            }
            let Some(role) = self.roles.iter().find(|r| r.id == b.role) else {
                // RBAC ignores a binding to a missing role.
                continue;
            };
            for (i, rule) in role.rules.iter().enumerate() {
                if rule_allows(rule, a) {
                    let r = RuleRef {
                        role: role.id.clone(),
                        rule: i,
                    };
                    if !out.contains(&r) {
                        out.push(r);
                    }
                }
            }
        }
        out
    }
}

fn has(list: &[String], wanted: &str) -> bool {
    list.iter().any(|x| x == "*" || x == wanted)
}

/// RBAC's `RuleAllows`.
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if !has(&rule.verbs, &a.verb) {
        return false;
    }
    if let Some(path) = &a.path {
        return rule.non_resource_urls.iter().any(|u| {
            u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p))
        });
    }
    if !has(&rule.api_groups, &a.group) {
        return false;
    }
    let combined = a.combined_resource();
    let resource_ok = rule.resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource.as_str()))
    });
    resource_ok
        && (rule.resource_names.is_empty()
            || (!a.name.is_empty() && rule.resource_names.contains(&a.name)))
}

/// kube-apiserver's Forbidden message for a denied request
/// (`responsewriters.forbiddenMessage`).
pub(crate) fn forbidden_message(user: &str, a: &Attributes) -> String {
    if let Some(path) = &a.path {
        return format!("User {user:?} cannot {} path {path:?}", a.verb);
    }
    let resource = a.combined_resource();
    if a.namespace.is_empty() {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb, a.group
        )
    } else {
        format!(
            "User {user:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.verb, a.group, a.namespace
        )
    }
}

/// Appends each distinct [`RbacRecord`] to a file, when recording is on.
pub(crate) struct Recorder {
    lines: crate::records::JsonLines,
}

impl Recorder {
    pub(crate) fn new(dir: Option<PathBuf>, port: u16) -> Recorder {
        Recorder {
            lines: crate::records::JsonLines::new(dir.as_deref(), port, "kube-requests"),
        }
    }

    pub(crate) fn record(&self, r: RbacRecord) {
        self.lines
            .append(&r, "a Kubernetes request for the RBAC coverage test");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            path: None,
        }
    }

    const SA: &str = "system:serviceaccount:kube-system:ccm";

    fn policy() -> RbacPolicy {
        RbacPolicy::parse(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: r}
rules:
  - apiGroups: [""]
    resources: [nodes, "*/status"]
    verbs: [get, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: r}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: r}
subjects: [{kind: ServiceAccount, name: ccm, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: le, namespace: kube-system}
rules:
  - apiGroups: [coordination.k8s.io]
    resources: [leases]
    resourceNames: [lock]
    verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: le, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: le}
subjects: [{kind: ServiceAccount, name: ccm}]
"#,
        )
        .expect("test policy parses")
    }

    #[test]
    fn apiserver_rbac_matches_as_the_rbac_authorizer() {
        let p = policy();
        let groups = vec!["system:authenticated".to_string()];
        let ok = |a: &Attributes| !p.granting_rules(SA, &groups, a).is_empty();
        assert!(ok(&attrs("get", "", "nodes", "", "", "n1")));
        assert!(ok(&attrs("patch", "", "nodes", "status", "", "n1")));
        assert!(ok(&attrs(
            "patch", "", "services", "status", "default", "s"
        )));
        assert!(!ok(&attrs("patch", "", "services", "", "default", "s")));
        assert!(!ok(&attrs("delete", "", "nodes", "", "", "n1")));
        assert!(!ok(&attrs("get", "apps", "nodes", "", "", "n1")));
        // resourceNames: only that name, never a name-less request.
        assert!(ok(&attrs(
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "lock"
        )));
        assert!(!ok(&attrs(
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            "other"
        )));
        assert!(!ok(&attrs(
            "list",
            "coordination.k8s.io",
            "leases",
            "",
            "kube-system",
            ""
        )));
        // A RoleBinding grants in its namespace only.
        assert!(!ok(&attrs(
            "get",
            "coordination.k8s.io",
            "leases",
            "",
            "default",
            "lock"
        )));
        // Another user gets nothing but discovery.
        assert!(
            p.granting_rules("bob", &groups, &attrs("get", "", "nodes", "", "", "n1"))
                .is_empty()
        );
        let discovery = Attributes {
            verb: "get".into(),
            path: Some("/apis/coordination.k8s.io/v1".into()),
            ..Default::default()
        };
        assert!(!p.granting_rules("bob", &groups, &discovery).is_empty());
    }

    #[test]
    fn apiserver_rbac_forbidden_text_is_kube_apiservers() {
        assert_eq!(
            forbidden_message(SA, &attrs("list", "", "nodes", "", "", "")),
            "User \"system:serviceaccount:kube-system:ccm\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message(
                SA,
                &attrs("patch", "", "services", "status", "default", "s")
            ),
            "User \"system:serviceaccount:kube-system:ccm\" cannot patch resource \"services/status\" in API group \"\" in the namespace \"default\""
        );
    }

    #[test]
    fn apiserver_rbac_rejects_malformed_bindings() {
        let bad = "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: x}\nroleRef: {kind: Role, name: y}\n";
        let err = RbacPolicy::parse(bad).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("roleRef kind \"Role\"")));
    }
}
