//! Delegated authentication and authorization of the HTTPS endpoint, as
//! upstream's cloud-controller-manager does with k8s.io/apiserver's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions`:
//!
//! 1. A bearer token (`Authorization: Bearer …`) is checked with a
//!    TokenReview; a token the API server does not accept is 401. A
//!    request without a token is the user `system:anonymous` in the group
//!    `system:unauthenticated`.
//! 2. Members of `system:masters` and the `--authorization-always-allow-paths`
//!    (default `/healthz`, `/readyz`, `/livez`; a trailing `*` matches a
//!    prefix) are allowed without asking. Anything else is a
//!    SubjectAccessReview for the non-resource URL and the verb of the
//!    method (`get` for GET and HEAD): allowed is served, denied is 403, an
//!    API error is 500.
//! 3. Answers are cached: token reviews for
//!    `--authentication-token-webhook-cache-ttl` (accepted and rejected
//!    alike, as upstream), access reviews for
//!    `--authorization-webhook-cache-authorized-ttl` /
//!    `--authorization-webhook-cache-unauthorized-ttl`. Errors are not.
//!
//! One difference on purpose: upstream answers a denied *anonymous* request
//! with 403; here it is 401, which tells a scraper without credentials what
//! is missing. Who may read what is the same (an RBAC rule that lets
//! `system:anonymous` read `/metrics` still opens it).
//!
//! Client-certificate and request-header (front-proxy) authentication are
//! not implemented, so the `extension-apiserver-authentication` ConfigMap
//! is never read and `--authentication-skip-lookup` /
//! `--authentication-tolerate-lookup-failure` change nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use super::cache::TtlCache;

const ANONYMOUS_USER: &str = "system:anonymous";
const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// Upstream's default `AlwaysAllowGroups`.
const ALWAYS_ALLOW_GROUPS: &[&str] = &["system:masters"];
/// Entries per cache; beyond it the oldest answers go first.
const CACHE_CAPACITY: usize = 4096;

/// `--authorization-always-allow-paths`, parsed: exact paths and prefixes
/// (a trailing `*`), compared without the leading `/` as upstream does.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AllowPaths {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AllowPaths {
    pub fn parse(paths: &[String]) -> Result<AllowPaths, String> {
        let mut out = AllowPaths::default();
        for raw in paths.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
            let p = raw.strip_prefix('/').unwrap_or(raw);
            let prefix = p.strip_suffix('*');
            if prefix.unwrap_or(p).contains('*') {
                return Err(format!(
                    "--authorization-always-allow-paths: {raw:?} has a '*' before its end; only a trailing '*' (prefix match) is allowed"
                ));
            }
            match prefix {
                Some(prefix) => out.prefixes.push(prefix.to_string()),
                None => out.exact.push(p.to_string()),
            }
        }
        Ok(out)
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        let p = path.strip_prefix('/').unwrap_or(path);
        self.exact.iter().any(|e| e == p) || self.prefixes.iter().any(|pre| p.starts_with(pre))
    }
}

/// The authentication and authorization flags, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthSettings {
    pub always_allow_paths: AllowPaths,
    pub token_ttl: Duration,
    pub allow_ttl: Duration,
    pub deny_ttl: Duration,
    /// `--authentication-kubeconfig`; the main client when `None`.
    pub authentication_kubeconfig: Option<PathBuf>,
    /// `--authorization-kubeconfig`; the main client when `None`.
    pub authorization_kubeconfig: Option<PathBuf>,
}

/// Who a request is, as a TokenReview tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    fn anonymous() -> UserInfo {
        UserInfo {
            username: ANONYMOUS_USER.to_string(),
            groups: vec![UNAUTHENTICATED_GROUP.to_string()],
            ..Default::default()
        }
    }
}

/// A SubjectAccessReview's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// The two questions asked of the API server; a trait so tests can count.
pub trait Reviewer: Send + Sync + 'static {
    /// `Ok(None)` when the token is not accepted.
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, String>>;
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        path: &'a str,
        verb: &'a str,
    ) -> BoxFuture<'a, Result<Decision, String>>;
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Allow,
    Unauthorized,
    Forbidden(String),
    Error(String),
}

/// The authenticator, authorizer and their caches.
pub struct Auth {
    reviewer: Arc<dyn Reviewer>,
    settings: AuthSettings,
    tokens: TtlCache<[u8; 32], Option<UserInfo>>,
    decisions: TtlCache<(UserInfo, String, String), Decision>,
}

/// The verb of a non-resource request, as upstream's RequestInfoFactory names it.
fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// The bearer token, if the header carries one (upstream's bearertoken
/// authenticator: `Bearer` in any case, one space-separated value).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

impl Auth {
    pub fn new(reviewer: Arc<dyn Reviewer>, settings: AuthSettings) -> Arc<Auth> {
        Arc::new(Auth {
            reviewer,
            settings,
            tokens: TtlCache::new(CACHE_CAPACITY),
            decisions: TtlCache::new(CACHE_CAPACITY),
        })
    }

    /// Authenticates then authorizes one request.
    pub async fn check(&self, method: &Method, path: &str, headers: &HeaderMap) -> Verdict {
        let user = match bearer(headers) {
            None => UserInfo::anonymous(),
            Some(token) => match self.authenticate(token).await {
                Ok(Some(user)) => user,
                Ok(None) => return Verdict::Unauthorized,
                Err(e) => {
                    tracing::warn!(error = %e, path, "TokenReview failed; answering 401");
                    return Verdict::Unauthorized;
                }
            },
        };
        if user
            .groups
            .iter()
            .any(|g| ALWAYS_ALLOW_GROUPS.contains(&g.as_str()))
            || self.settings.always_allow_paths.matches(path)
        {
            return Verdict::Allow;
        }
        let verb = verb(method);
        match self.authorize(&user, path, verb).await {
            Ok(d) if d.allowed => Verdict::Allow,
            Ok(_) if user.username == ANONYMOUS_USER => Verdict::Unauthorized,
            Ok(d) => Verdict::Forbidden(forbidden_message(&user.username, verb, path, &d.reason)),
            Err(e) => {
                tracing::warn!(error = %e, path, user = %user.username, "SubjectAccessReview failed; answering 500");
                Verdict::Error(format!("authorization of {path} failed: {e}"))
            }
        }
    }

    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        // Keyed by a hash so the cache holds no credential.
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.tokens.get(&key) {
            return Ok(hit);
        }
        let answer = self.reviewer.authenticate(token).await?;
        self.tokens
            .insert(key, answer.clone(), self.settings.token_ttl);
        Ok(answer)
    }

    async fn authorize(&self, user: &UserInfo, path: &str, verb: &str) -> Result<Decision, String> {
        let key = (user.clone(), path.to_string(), verb.to_string());
        if let Some(hit) = self.decisions.get(&key) {
            return Ok(hit);
        }
        let d = self.reviewer.authorize(user, path, verb).await?;
        let ttl = if d.allowed {
            self.settings.allow_ttl
        } else {
            self.settings.deny_ttl
        };
        self.decisions.insert(key, d.clone(), ttl);
        Ok(d)
    }
}

fn forbidden_message(user: &str, verb: &str, path: &str, reason: &str) -> String {
    let mut msg = format!("forbidden: User \"{user}\" cannot {verb} path \"{path}\"");
    if !reason.is_empty() {
        msg.push_str(": ");
        msg.push_str(reason);
    }
    msg
}

/// A `metav1.Status` failure body, as the API server's own errors look.
fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

impl IntoResponse for Verdict {
    fn into_response(self) -> Response {
        match self {
            Verdict::Allow => StatusCode::OK.into_response(),
            Verdict::Unauthorized => {
                status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
            }
            Verdict::Forbidden(m) => status(StatusCode::FORBIDDEN, "Forbidden", &m),
            Verdict::Error(m) => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", &m),
        }
    }
}

/// The axum middleware in front of every route.
pub async fn guard(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    match auth
        .check(req.method(), req.uri().path(), req.headers())
        .await
    {
        Verdict::Allow => next.run(req).await,
        other => other.into_response(),
    }
}
