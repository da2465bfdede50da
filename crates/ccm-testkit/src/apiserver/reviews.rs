//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview
//! (`authorization.k8s.io/v1`) as kube-apiserver answers them, for the
//! CCM's delegated authentication and authorization.
//!
//! Tokens are registered by tests ([`TokenUser`]); authorization follows
//! registered [`NonResourceGrant`]s the way RBAC matches non-resource URLs
//! (`*` matches all, a trailing `*` a prefix, otherwise exact), and
//! `system:masters` may do anything, as kube-apiserver's privileged-group
//! authorizer allows. Resource attributes are reviewed too but no grant
//! covers them: only `system:masters` is allowed.
//!
//! Strict as the real server: a TokenReview without `spec.token` is 400; a
//! SubjectAccessReview with neither or both of `resourceAttributes` /
//! `nonResourceAttributes`, with neither `user` nor `groups`, or with
//! metadata set is 422; a body that is not the kind is 400.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::errors::{ApiError, Cause};
use super::rbac::Attributes;

/// Group added by the real server to every authenticated user.
pub(crate) const AUTHENTICATED_GROUP: &str = "system:authenticated";
pub(crate) const MASTERS_GROUP: &str = "system:masters";

/// Who a registered token is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenUser {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl TokenUser {
    pub fn new(username: &str) -> TokenUser {
        TokenUser {
            username: username.to_string(),
            ..Default::default()
        }
    }

    /// A service account's identity, as kube-apiserver's service account
    /// token authenticator gives it: `system:serviceaccount:NS:NAME` in
    /// the groups `system:serviceaccounts` and `system:serviceaccounts:NS`.
    pub fn service_account(namespace: &str, name: &str) -> TokenUser {
        TokenUser::new(&format!("system:serviceaccount:{namespace}:{name}"))
            .group("system:serviceaccounts")
            .group(&format!("system:serviceaccounts:{namespace}"))
    }

    pub fn group(mut self, group: &str) -> TokenUser {
        self.groups.push(group.to_string());
        self
    }
}

/// Whom a grant is for.
#[derive(Debug, Clone, PartialEq)]
pub enum Subject {
    User(String),
    Group(String),
}

/// An RBAC-style rule: `subject` may use `verbs` on `urls` (non-resource).
#[derive(Debug, Clone, PartialEq)]
pub struct NonResourceGrant {
    pub subject: Subject,
    pub verbs: Vec<String>,
    pub urls: Vec<String>,
}

impl NonResourceGrant {
    pub fn new(subject: Subject, verbs: &[&str], urls: &[&str]) -> NonResourceGrant {
        NonResourceGrant {
            subject,
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            urls: urls.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn covers(&self, user: &str, groups: &[String], verb: &str, path: &str) -> bool {
        let subject = match &self.subject {
            Subject::User(u) => u == user,
            Subject::Group(g) => groups.iter().any(|x| x == g),
        };
        subject
            && self.verbs.iter().any(|v| v == "*" || v == verb)
            && self.urls.iter().any(|u| url_matches(u, path))
    }
}

/// RBAC's `NonResourceURLMatches`.
fn url_matches(rule: &str, path: &str) -> bool {
    rule == "*"
        || rule == path
        || rule
            .strip_suffix('*')
            .is_some_and(|prefix| path.starts_with(prefix))
}

/// Registered tokens and grants of one server.
#[derive(Default)]
pub(crate) struct Reviews {
    pub tokens: parking_lot::Mutex<HashMap<String, TokenUser>>,
    pub grants: parking_lot::Mutex<Vec<NonResourceGrant>>,
}

/// The kind of a SelfSubjectAccessReview: answered for the requester
/// (its bearer token) from the enforced RBAC rules ([`self_access_review`]).
pub(crate) const SELF_REVIEW: &str = "SelfSubjectAccessReview";

/// Which review a path asks for: (group, plural, kind).
pub(crate) fn review_path(path: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match path.trim_end_matches('/') {
        "/apis/authentication.k8s.io/v1/tokenreviews" => {
            Some(("authentication.k8s.io", "tokenreviews", "TokenReview"))
        }
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => Some((
            "authorization.k8s.io",
            "subjectaccessreviews",
            "SubjectAccessReview",
        )),
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" => Some((
            "authorization.k8s.io",
            "selfsubjectaccessreviews",
            SELF_REVIEW,
        )),
        _ => None,
    }
}

fn decode(body: &[u8], group: &str, kind: &str) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request was in an unknown format: {e}"
        ))
    })?;
    let want = format!("{group}/v1");
    let api_version = v.get("apiVersion").and_then(Value::as_str);
    let got_kind = v.get("kind").and_then(Value::as_str);
    if api_version != Some(want.as_str()) || got_kind != Some(kind) {
        return Err(ApiError::bad_request(format!(
            "expected {kind} in {want}, got kind {got_kind:?} apiVersion {api_version:?}"
        )));
    }
    Ok(v)
}

impl Reviews {
    /// The user a bearer token stands for, with `system:authenticated`
    /// added to its groups.
    pub fn authenticate(&self, token: &str) -> Option<(String, Vec<String>)> {
        let u = self.tokens.lock().get(token).cloned()?;
        let mut groups = u.groups;
        if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            groups.push(AUTHENTICATED_GROUP.to_string());
        }
        Some((u.username, groups))
    }

    /// Answers one review request body; the value is the created review.
    pub fn review(&self, kind: &str, group: &str, body: &[u8]) -> Result<Value, ApiError> {
        let v = decode(body, group, kind)?;
        if kind == "TokenReview" {
            self.token_review(v)
        } else {
            self.access_review(v)
        }
    }

    fn token_review(&self, mut v: Value) -> Result<Value, ApiError> {
        let token = v
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or("");
        if token.is_empty() {
            return Err(ApiError::bad_request(
                "token is required for TokenReview in authentication",
            ));
        }
        let status = match self.tokens.lock().get(token) {
            Some(u) => {
                let mut groups = u.groups.clone();
                if !groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
                    groups.push(AUTHENTICATED_GROUP.to_string());
                }
                json!({
                    "authenticated": true,
                    "user": {"username": u.username, "uid": u.uid, "groups": groups, "extra": u.extra},
                })
            }
            // Go omits `authenticated: false`; the user is an empty object.
            None => json!({"user": {}}),
        };
        v["status"] = status;
        v["metadata"] = json!({});
        Ok(v)
    }

    fn access_review(&self, mut v: Value) -> Result<Value, ApiError> {
        validate_access_review(&v)?;
        let spec = &v["spec"];
        let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
        let groups: Vec<String> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let status = if groups.iter().any(|g| g == MASTERS_GROUP) {
            json!({"allowed": true})
        } else if let Some(nr) = spec.get("nonResourceAttributes") {
            let path = nr.get("path").and_then(Value::as_str).unwrap_or("");
            let verb = nr.get("verb").and_then(Value::as_str).unwrap_or("");
            match self
                .grants
                .lock()
                .iter()
                .find(|g| g.covers(user, &groups, verb, path))
            {
                Some(g) => json!({
                    "allowed": true,
                    "reason": format!("allowed by the kube-test-server grant to {:?}", g.subject),
                }),
                None => json!({"allowed": false}),
            }
        } else {
            json!({"allowed": false})
        };
        v["status"] = status;
        Ok(v)
    }
}

fn invalid(field: &str, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        message: format!("Invalid value: {message}"),
        field: field.to_string(),
    }
}

/// What a SelfSubjectAccessReview asks, as RBAC attributes.
fn self_review_attributes(spec: &Value) -> Attributes {
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    match spec.get("nonResourceAttributes").filter(|v| !v.is_null()) {
        Some(nr) => Attributes {
            verb: text(nr, "verb"),
            path: Some(text(nr, "path")),
            ..Default::default()
        },
        None => {
            let r = spec
                .get("resourceAttributes")
                .cloned()
                .unwrap_or(Value::Null);
            Attributes {
                verb: text(&r, "verb"),
                group: text(&r, "group"),
                resource: text(&r, "resource"),
                subresource: text(&r, "subresource"),
                namespace: text(&r, "namespace"),
                name: text(&r, "name"),
                path: None,
            }
        }
    }
}

/// Answers a SelfSubjectAccessReview body: `allowed` says whether the
/// requester may do what `spec` asks (kube-apiserver's
/// `ValidateSelfSubjectAccessReview`: exactly one of the attribute kinds,
/// 422 otherwise).
pub(crate) fn self_access_review(
    body: &[u8],
    allowed: impl FnOnce(&Attributes) -> bool,
) -> Result<Value, ApiError> {
    let mut v = decode(body, "authorization.k8s.io", SELF_REVIEW)?;
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let has = |k: &str| spec.get(k).is_some_and(|x| !x.is_null());
    if has("resourceAttributes") == has("nonResourceAttributes") {
        return Err(ApiError::invalid_kind(
            SELF_REVIEW,
            "authorization.k8s.io",
            vec![invalid(
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        ));
    }
    let attrs = self_review_attributes(&spec);
    v["status"] = json!({"allowed": allowed(&attrs)});
    v["metadata"] = json!({});
    Ok(v)
}

/// kube-apiserver's `ValidateSubjectAccessReview`.
fn validate_access_review(v: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let meta_set = v
        .get("metadata")
        .and_then(Value::as_object)
        .is_some_and(|m| {
            m.iter()
                .any(|(k, _)| k != "managedFields" && k != "creationTimestamp")
        });
    if meta_set {
        causes.push(invalid("metadata", "must be empty"));
    }
    let spec = v.get("spec").cloned().unwrap_or(Value::Null);
    let has = |k: &str| spec.get(k).is_some_and(|x| !x.is_null());
    match (has("resourceAttributes"), has("nonResourceAttributes")) {
        (true, true) => causes.push(invalid(
            "spec.nonResourceAttributes",
            "cannot be specified in combination with resourceAttributes",
        )),
        (false, false) => causes.push(invalid(
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
        _ => {}
    }
    let user = spec.get("user").and_then(Value::as_str).unwrap_or("");
    let groups = spec
        .get("groups")
        .and_then(Value::as_array)
        .is_some_and(|g| !g.is_empty());
    if user.is_empty() && !groups {
        causes.push(invalid(
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_kind(
            "SubjectAccessReview",
            "authorization.k8s.io",
            causes,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sar(spec: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }))
        .unwrap()
    }

    fn allowed(r: &Reviews, spec: Value) -> bool {
        r.review("SubjectAccessReview", "authorization.k8s.io", &sar(spec))
            .unwrap()["status"]["allowed"]
            == json!(true)
    }

    #[test]
    fn apiserver_reviews_match_non_resource_urls_as_rbac() {
        let r = Reviews::default();
        r.grants.lock().push(NonResourceGrant::new(
            Subject::Group("monitoring".into()),
            &["get"],
            &["/metrics", "/debug/*"],
        ));
        let attrs = |user: &str, group: &str, path: &str, verb: &str| json!({"user": user, "groups": [group], "nonResourceAttributes": {"path": path, "verb": verb}});
        assert!(allowed(&r, attrs("p", "monitoring", "/metrics", "get")));
        assert!(allowed(
            &r,
            attrs("p", "monitoring", "/debug/pprof/heap", "get")
        ));
        assert!(!allowed(
            &r,
            attrs("p", "monitoring", "/metrics/extra", "get")
        ));
        assert!(!allowed(&r, attrs("p", "monitoring", "/metrics", "create")));
        assert!(!allowed(&r, attrs("p", "other", "/metrics", "get")));
        assert!(allowed(
            &r,
            attrs("root", "system:masters", "/anything", "delete")
        ));
    }

    #[test]
    fn apiserver_reviews_refuse_what_kube_apiserver_refuses() {
        let r = Reviews::default();
        let err = r
            .review(
                "SubjectAccessReview",
                "authorization.k8s.io",
                &sar(json!({"user": "u"})),
            )
            .unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("exactly one of"), "{}", err.message);
        let err = r
            .review(
                "SubjectAccessReview",
                "authorization.k8s.io",
                &sar(json!({"nonResourceAttributes": {"path": "/metrics", "verb": "get"}})),
            )
            .unwrap_err();
        assert_eq!(err.code, 422);
        assert!(err.message.contains("spec.user"), "{}", err.message);
        let tr = |spec: Value| {
            serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}))
                .unwrap()
        };
        let err = r
            .review("TokenReview", "authentication.k8s.io", &tr(json!({})))
            .unwrap_err();
        assert_eq!(err.code, 400);
        let unknown = r
            .review(
                "TokenReview",
                "authentication.k8s.io",
                &tr(json!({"token": "nope"})),
            )
            .unwrap();
        assert_eq!(unknown["status"].get("authenticated"), None);
        r.tokens
            .lock()
            .insert("t".into(), TokenUser::new("alice").group("dev"));
        let known = r
            .review(
                "TokenReview",
                "authentication.k8s.io",
                &tr(json!({"token": "t"})),
            )
            .unwrap();
        assert_eq!(known["status"]["authenticated"], json!(true));
        assert_eq!(
            known["status"]["user"]["groups"],
            json!(["dev", "system:authenticated"])
        );
        let err = r
            .review(
                "TokenReview",
                "authentication.k8s.io",
                b"{\"kind\":\"Node\"}",
            )
            .unwrap_err();
        assert_eq!(err.code, 400);
    }
}
