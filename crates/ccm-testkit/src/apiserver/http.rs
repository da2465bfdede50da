//! HTTP front: routes REST paths to the store, renders objects, lists and
//! watch streams, and applies request accounting and injected failures.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::sync::CancellationToken;

use super::admission;
use super::errors::ApiError;
use super::openapi;
use super::rbac::{Attributes, RbacPolicy, RbacRecord, Recorder, forbidden_message};
use super::resources::{self, RESOURCES, ResourceDef};
use super::reviews::{self, MASTERS_GROUP, Reviews};
use super::selectors::{FieldSelector, LabelSelector, Selectors};
use super::store::{
    Change, DeleteOpts, DisruptionCounters, EventType, ListOpts, Msg, PatchBody, Store, Stored,
    Writer,
};
use super::table;
use super::{FailureRule, RequestKey};

/// How often a reviewed write runs again when its object moved meanwhile.
const ADMISSION_TRIES: usize = 5;
/// The real server's request body limit.
const MAX_BODY: usize = 3 * 1024 * 1024;
/// How long a list waits for a resourceVersion the store has not reached.
const RV_WAIT: Duration = Duration::from_secs(3);
/// Watch duration when the client gives no timeoutSeconds.
const DEFAULT_WATCH_TIMEOUT: u64 = 1800;
/// Initial watch events are sent in chunks of about this size.
const CHUNK: usize = 256 * 1024;

/// State shared by every request of one server.
pub(crate) struct Shared {
    pub store: Store,
    pub stats: parking_lot::Mutex<HashMap<RequestKey, u64>>,
    /// Requests answered 409 Conflict, by the same keys.
    pub conflicts: parking_lot::Mutex<HashMap<RequestKey, u64>>,
    pub failures: parking_lot::Mutex<Vec<FailureRule>>,
    /// How many requests each armed rule failed or delayed, by the rule's
    /// verb, resource and code: a test shows its faults fired.
    pub fired: parking_lot::Mutex<std::collections::BTreeMap<(String, String, u16), u64>>,
    pub cancel: CancellationToken,
    /// Ends the watches open now; replaced by a fresh child of `cancel`
    /// each time watches are closed.
    pub watch_cancel: parking_lot::Mutex<CancellationToken>,
    pub address: String,
    /// Tokens and grants for TokenReview / SubjectAccessReview.
    pub reviews: Reviews,
    /// RBAC enforced on requests with a bearer token, if set.
    pub rbac: Option<RbacPolicy>,
    /// Where the requests of authenticated users are recorded.
    pub recorder: Recorder,
    /// Where admission webhooks' `clientConfig.service`s are served.
    pub routes: admission::ServiceRoutes,
}

impl Shared {
    /// Who a request is, for an AdmissionReview's userInfo: its token's
    /// user, or the test's own cluster admin.
    fn user_of(&self, headers: &HeaderMap) -> (String, Vec<String>) {
        bearer(headers)
            .and_then(|t| self.reviews.authenticate(t))
            .unwrap_or_else(|| {
                let groups = [MASTERS_GROUP, "system:authenticated"];
                ("system:admin".into(), groups.map(String::from).to_vec())
            })
    }

    /// Ends every open watch stream, as an apiserver restart would.
    pub fn close_watches(&self) {
        let mut current = self.watch_cancel.lock();
        current.cancel();
        *current = self.cancel.child_token();
    }

    /// With RBAC on: authenticates the bearer token and authorizes the
    /// request, recording it; an error response for a bad token (401) or
    /// a denied request (403). Requests without a token are the test's own
    /// and pass, as if made by a cluster admin.
    fn authorize(&self, headers: &HeaderMap, a: &Attributes) -> Option<Response> {
        // No policy, or no token: nothing to check.
        let policy = self.rbac.as_ref()?;
        let token = bearer(headers)?;
        let Some((user, groups)) = self.reviews.authenticate(token) else {
            return Some(error_response(&ApiError::new(
                401,
                "Unauthorized",
                "Unauthorized",
            )));
        };
        let granted_by = if groups.iter().any(|g| g == MASTERS_GROUP) {
            Vec::new()
        } else {
            policy.granting_rules(&user, &groups, a)
        };
        let allowed = !granted_by.is_empty() || groups.iter().any(|g| g == MASTERS_GROUP);
        self.recorder.record(RbacRecord {
            user: user.clone(),
            verb: a.verb.clone(),
            group: a.group.clone(),
            resource: a.resource.clone(),
            subresource: a.subresource.clone(),
            namespace: a.namespace.clone(),
            path: a.path.clone(),
            allowed,
            granted_by,
        });
        if allowed {
            return None;
        }
        tracing::info!(
            user,
            verb = a.verb,
            resource = a.combined_resource(),
            namespace = a.namespace,
            "kube-test-server: RBAC denied a request"
        );
        // responsewriters.Forbidden: NewForbidden(group resource, name, message).
        let why = forbidden_message(&user, a);
        let gr = if a.group.is_empty() {
            a.resource.clone()
        } else {
            format!("{}.{}", a.resource, a.group)
        };
        let message = match (a.path.is_some(), a.name.is_empty()) {
            (true, _) => format!("forbidden: {why}"),
            (false, true) => format!("{gr} is forbidden: {why}"),
            (false, false) => format!("{gr} {:?} is forbidden: {why}", a.name),
        };
        let mut e = ApiError::new(403, "Forbidden", message);
        if a.path.is_none() {
            let mut d = json!({"name": a.name, "kind": a.resource});
            if !a.group.is_empty() {
                d["group"] = json!(a.group);
            }
            e.details = Some(d);
        }
        Some(error_response(&e))
    }

    fn record(&self, key: &RequestKey) {
        *self.stats.lock().entry(key.clone()).or_insert(0) += 1;
    }

    /// The first armed rule matching this request, consuming one use of it.
    fn take_failure(
        &self,
        key: &RequestKey,
        ns: &str,
        name: &str,
        cas: bool,
    ) -> Option<FailureRule> {
        let mut rules = self.failures.lock();
        let pos = rules.iter().position(|r| r.matches(key, ns, name, cas))?;
        let hit = rules[pos].clone();
        let rule = (
            hit.verb.clone().unwrap_or_default(),
            hit.resource.clone().unwrap_or_default(),
            hit.code,
        );
        *self.fired.lock().entry(rule).or_insert(0) += 1;
        if let Some(left) = rules[pos].times.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                rules.remove(pos);
            }
        }
        Some(hit)
    }
}

/// Where a REST path points.
#[derive(Debug, PartialEq)]
struct Target {
    res: usize,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Route {
    Doc(Value),
    Text(&'static str),
    Resource(Target),
    NotFound,
}

fn route(path: &str, address: &str) -> Route {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => {
            return Route::Doc(json!({
                "major": "1",
                "minor": "37",
                "gitVersion": "v1.37.0-kube-test-server",
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25.0",
                "compiler": "gc",
                "platform": "linux/amd64",
            }));
        }
        ["healthz"] | ["livez"] | ["readyz"] => return Route::Text("ok"),
        ["openapi", "v2"] => return Route::Doc(openapi::v2().clone()),
        ["openapi", "v3"] => return Route::Doc(openapi::v3_root()),
        ["openapi", "v3", gv @ ..] => {
            return openapi::v3_group_version(&gv.join("/"))
                .map_or(Route::NotFound, |d| Route::Doc(d.clone()));
        }
        ["api"] => return Route::Doc(resources::core_versions(address)),
        ["apis"] => return Route::Doc(resources::group_list()),
        ["apis", g] => return resources::group(g).map_or(Route::NotFound, Route::Doc),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Route::NotFound,
    };
    if rest.is_empty() {
        return resources::resource_list(group, version).map_or(Route::NotFound, Route::Doc);
    }
    // /namespaces/{ns}/{plural}/... unless {plural} is a namespace subresource.
    if let ["namespaces", ns, plural, tail @ ..] = rest
        && let Some(res) = resources::find(group, version, plural)
        && RESOURCES[res].namespaced
    {
        return target(res, Some(ns), tail);
    }
    let Some(res) = resources::find(group, version, rest[0]) else {
        return Route::NotFound;
    };
    if RESOURCES[res].namespaced && rest.len() > 1 {
        return Route::NotFound;
    }
    target(res, None, &rest[1..])
}

fn target(res: usize, ns: Option<&str>, tail: &[&str]) -> Route {
    let (name, sub) = match tail {
        [] => (None, None),
        [name] => (Some(*name), None),
        [name, "status"] if RESOURCES[res].status_subresource => (Some(*name), Some("status")),
        _ => return Route::NotFound,
    };
    Route::Resource(Target {
        res,
        ns: ns.map(str::to_string),
        name: name.map(str::to_string),
        sub: sub.map(str::to_string),
    })
}

fn json_response(code: u16, body: impl Into<Body>) -> Response {
    let mut resp = Response::new(body.into());
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn value_response(code: u16, v: &Value) -> Response {
    json_response(code, serde_json::to_vec(v).unwrap_or_default())
}

fn error_response(e: &ApiError) -> Response {
    let mut resp = if e.plain_text {
        let mut r = Response::new(Body::from(format!("{}\n", e.message)));
        *r.status_mut() = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r.headers_mut().insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        r
    } else {
        value_response(e.code, &e.status())
    };
    if let Some(s) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

/// Whether the client asked for `PartialObjectMetadata(List)`.
fn wants_metadata(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=PartialObjectMetadata"))
}

/// Whether the client asked for a `meta.k8s.io/v1` Table.
fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(table::wants_table)
}

/// A Table answer of these objects, with `metadata` for the Table.
fn table_response(
    def: &ResourceDef,
    items: &[Arc<Stored>],
    metadata: Value,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let include = table::IncludeObject::parse(q.get("includeObject").map(String::as_str))
        .map_err(ApiError::bad_request)?;
    let pairs: Vec<(&Value, Value)> = items
        .iter()
        .map(|o| {
            (
                &o.value,
                resources::to_view(def, &o.value).unwrap_or_else(|| o.value.clone()),
            )
        })
        .collect();
    let mut resp = value_response(200, &table::table(def, &pairs, metadata, include));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(table::TABLE_CONTENT_TYPE),
    );
    Ok(resp)
}

/// Whether the client asked for aggregated discovery.
fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("as=APIGroupDiscoveryList"))
}

fn partial(v: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": v.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// An object's JSON in the form `def` serves (stored objects of aliased
/// resources are converted; others are sent as stored).
fn object_bytes(def: &ResourceDef, obj: &Stored, metadata_only: bool) -> Bytes {
    if metadata_only {
        Bytes::from(serde_json::to_vec(&partial(&obj.value)).unwrap_or_default())
    } else if let Some(view) = resources::to_view(def, &obj.value) {
        Bytes::from(serde_json::to_vec(&view).unwrap_or_default())
    } else {
        obj.json.clone()
    }
}

fn object_response(def: &ResourceDef, code: u16, obj: &Stored, metadata_only: bool) -> Response {
    json_response(code, object_bytes(def, obj, metadata_only))
}

fn render_list(
    def: &ResourceDef,
    rv: u64,
    items: &[Arc<Stored>],
    cont: Option<&str>,
    remaining: Option<u64>,
    metadata_only: bool,
) -> Bytes {
    let (kind, api_version) = if metadata_only {
        (
            "PartialObjectMetadataList".to_string(),
            "meta.k8s.io/v1".to_string(),
        )
    } else {
        (format!("{}List", def.kind), def.api_version())
    };
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    let size: usize = items.iter().map(|i| i.json.len() + 1).sum();
    let mut buf = BytesMut::with_capacity(size + 256);
    buf.extend_from_slice(
        format!(
            "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":["
        )
        .as_bytes(),
    );
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            buf.extend_from_slice(b",");
        }
        buf.extend_from_slice(&object_bytes(def, item, metadata_only));
    }
    buf.extend_from_slice(b"]}");
    buf.freeze()
}

fn verb(method: &Method, t: &Target, q: &HashMap<String, String>) -> Option<&'static str> {
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    Some(match (method.as_str(), t.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    })
}

/// The manager of a non-apply write: `fieldManager`, or the User-Agent
/// up to its first '/', as the real server derives it.
fn manager(q: &HashMap<String, String>, headers: &HeaderMap) -> Result<String, ApiError> {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        if m.len() > 128 {
            return Err(ApiError::bad_request(
                "fieldManager: Too long: may not be more than 128 bytes",
            ));
        }
        return Ok(m.clone());
    }
    let ua = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let prefix: String = ua
        .split('/')
        .next()
        .unwrap_or_default()
        .chars()
        .take(128)
        .collect();
    Ok(if prefix.is_empty() {
        "unknown".into()
    } else {
        prefix
    })
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

fn decode_body(bytes: &[u8], yaml: bool) -> Result<Value, ApiError> {
    if yaml {
        serde_yaml::from_slice::<Value>(bytes)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
    } else {
        serde_json::from_slice::<Value>(bytes).map_err(|e| {
            ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
        })
    }
}

fn rv_param(q: &HashMap<String, String>) -> Result<Option<u64>, ApiError> {
    match q.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(s) => s.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "invalid resource version {s:?}: not an unsigned integer"
            ))
        }),
    }
}

fn selectors(q: &HashMap<String, String>, def: &ResourceDef) -> Result<Selectors, ApiError> {
    Ok(Selectors {
        labels: LabelSelector::parse(
            q.get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        fields: FieldSelector::parse(
            q.get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
            def,
        )?,
    })
}

fn is_true(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| v == "true" || v == "1")
}

/// The bearer token of a request, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

impl Shared {
    /// Whether the requester may do `a`, as [`Shared::authorize`] decides
    /// it (without recording): the test's own requests (no token) and
    /// every request without an RBAC policy are allowed.
    fn may(&self, headers: &HeaderMap, a: &Attributes) -> bool {
        let (Some(policy), Some(token)) = (self.rbac.as_ref(), bearer(headers)) else {
            return true;
        };
        let Some((user, groups)) = self.reviews.authenticate(token) else {
            return false;
        };
        groups.iter().any(|g| g == MASTERS_GROUP)
            || !policy.granting_rules(&user, &groups, a).is_empty()
    }
}

/// The one entry point for every request.
pub(crate) async fn handle(State(sh): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let q: HashMap<String, String> = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
        .map(|Query(v)| v.into_iter().collect())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    if let Some((group, plural, kind)) = reviews::review_path(&path) {
        return review(
            &sh,
            &parts.method,
            &parts.headers,
            body,
            (group, plural, kind),
        )
        .await;
    }
    let t = match route(&path, &sh.address) {
        Route::Resource(t) => t,
        other => {
            let key = RequestKey {
                verb: parts.method.as_str().to_ascii_lowercase(),
                group: String::new(),
                resource: path.clone(),
            };
            sh.record(&key);
            let attrs = Attributes {
                verb: key.verb.clone(),
                path: Some(path.clone()),
                ..Default::default()
            };
            if let Some(resp) = sh.authorize(&parts.headers, &attrs) {
                return resp;
            }
            if let Some(rule) = sh.take_failure(&key, "", "", false)
                && let Some(resp) = injected(&rule, None).await
            {
                return resp;
            }
            // The v2 document is JSON only: a protobuf-only client is told so.
            if path.starts_with("/openapi/")
                && parts
                    .headers
                    .get(header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|a| a.contains("protobuf") && !a.contains("json"))
            {
                return error_response(&ApiError::new(
                    406,
                    "NotAcceptable",
                    "only the following media types are accepted: application/json",
                ));
            }
            let aggregated =
                wants_aggregated(&parts.headers) && (path == "/api" || path == "/apis");
            return match (other, parts.method == Method::GET) {
                (Route::Doc(_), true) if aggregated => {
                    let mut resp = value_response(200, &resources::aggregated(path == "/api"));
                    resp.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static(resources::AGGREGATED_DISCOVERY),
                    );
                    resp
                }
                (Route::Doc(doc), true) => value_response(200, &doc),
                (Route::Text(t), true) => (StatusCode::OK, t).into_response(),
                (Route::Doc(_) | Route::Text(_), false) => {
                    error_response(&ApiError::method_not_allowed(format!(
                        "the server does not allow this method on {path}"
                    )))
                }
                _ => error_response(&ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                )),
            };
        }
    };
    let def = &RESOURCES[t.res];
    let Some(verb) = verb(&parts.method, &t, &q) else {
        return error_response(&ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {path})",
            parts.method
        )));
    };
    let resource = match &t.sub {
        Some(s) => format!("{}/{s}", def.plural),
        None => def.plural.to_string(),
    };
    let key = RequestKey {
        verb: verb.to_string(),
        group: def.group.to_string(),
        resource,
    };
    sh.record(&key);
    let attrs = Attributes {
        verb: verb.to_string(),
        group: def.group.to_string(),
        resource: def.plural.to_string(),
        subresource: t.sub.clone().unwrap_or_default(),
        namespace: t.ns.clone().unwrap_or_default(),
        name: t.name.clone().unwrap_or_default(),
        path: None,
    };
    if let Some(resp) = sh.authorize(&parts.headers, &attrs) {
        return resp;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("failed to read the request body: {e}"),
            ));
        }
    };
    if let Some(rule) = sh.take_failure(
        &key,
        t.ns.as_deref().unwrap_or_default(),
        t.name.as_deref().unwrap_or_default(),
        carries_resource_version(verb, &parts.headers, &bytes),
    ) && let Some(resp) = injected(&rule, Some((def, name_of(&t)))).await
    {
        return resp;
    }
    if q.contains_key("dryRun") {
        return error_response(&ApiError::bad_request(
            "dryRun is not supported by kube-test-server",
        ));
    }
    let metadata_only = wants_metadata(&parts.headers);
    let result = match verb {
        "get" => get(&sh, &t, &q, &parts.headers, metadata_only),
        "list" => list(&sh, &t, &q, &parts.headers, metadata_only).await,
        "watch" => watch(&sh, &t, &q, metadata_only),
        "create" | "update" | "patch" => {
            Ok(admitted(&sh, &t, verb, &q, &parts.headers, &bytes).await)
        }
        "delete" => delete(&sh, &t, &q, &bytes),
        _ => delete_collection(&sh, &t, &q, &bytes, metadata_only),
    };
    let resp = result.unwrap_or_else(|e| error_response(&e));
    if resp.status() == StatusCode::CONFLICT {
        *sh.conflicts.lock().entry(key).or_insert(0) += 1;
    }
    tracing::debug!(
        verb,
        path = %parts.uri,
        code = resp.status().as_u16(),
        "kube-test-server request"
    );
    resp
}

/// TokenReview, SubjectAccessReview and SelfSubjectAccessReview:
/// create-only, cluster-scoped.
async fn review(
    sh: &Shared,
    method: &Method,
    headers: &HeaderMap,
    body: Body,
    (group, plural, kind): (&str, &str, &str),
) -> Response {
    if method != Method::POST {
        return error_response(&ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {plural}.{group})"
        )));
    }
    let key = RequestKey {
        verb: "create".to_string(),
        group: group.to_string(),
        resource: plural.to_string(),
    };
    sh.record(&key);
    let attrs = Attributes {
        verb: "create".into(),
        group: group.into(),
        resource: plural.into(),
        ..Default::default()
    };
    if let Some(resp) = sh.authorize(headers, &attrs) {
        return resp;
    }
    if let Some(rule) = sh.take_failure(&key, "", "", false)
        && let Some(resp) = injected(&rule, None).await
    {
        return resp;
    }
    let bytes = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return error_response(&ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("failed to read the request body: {e}"),
            ));
        }
    };
    let answer = if kind == reviews::SELF_REVIEW {
        reviews::self_access_review(&bytes, |a| sh.may(headers, a))
    } else {
        sh.reviews.review(kind, group, &bytes)
    };
    match answer {
        Ok(v) => value_response(201, &v),
        Err(e) => error_response(&e),
    }
}

/// Answers an injected failure after the rule's delay, or `None` when the
/// rule only delays (code 0) and the request is to be served.
async fn injected(rule: &FailureRule, target: Option<(&ResourceDef, &str)>) -> Option<Response> {
    if let Some(d) = rule.delay {
        tokio::time::sleep(d).await;
    }
    if rule.code == 0 {
        return None;
    }
    let target = target.filter(|(_, name)| !name.is_empty());
    Some(error_response(&ApiError::injected(
        rule.code,
        target,
        rule.message.clone(),
        rule.retry_after,
    )))
}

/// Whether a write is a compare-and-swap: it names the resourceVersion it
/// expects (an update's or a merge/strategic/apply patch's
/// `metadata.resourceVersion`, a JSON patch testing or setting it, a
/// delete's `preconditions.resourceVersion`).
fn carries_resource_version(verb: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let yaml = content_type(headers).contains("yaml");
    let Ok(v) = decode_body(body, yaml) else {
        return false;
    };
    let non_empty = |p: Option<&Value>| p.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    match verb {
        "update" | "patch" if v.is_array() => v.as_array().is_some_and(|ops| {
            ops.iter().any(|op| {
                op.get("path").and_then(Value::as_str) == Some("/metadata/resourceVersion")
                    && matches!(
                        op.get("op").and_then(Value::as_str),
                        Some("test" | "replace" | "add")
                    )
            })
        }),
        "update" | "patch" => non_empty(v.pointer("/metadata/resourceVersion")),
        "delete" | "deletecollection" => non_empty(v.pointer("/preconditions/resourceVersion")),
        _ => false,
    }
}

/// The namespace an object lives in: the path's, or "" when cluster-scoped.
fn ns_of(t: &Target) -> Result<String, ApiError> {
    match (&t.ns, RESOURCES[t.res].namespaced) {
        (Some(ns), _) => Ok(ns.clone()),
        (None, false) => Ok(String::new()),
        (None, true) => Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

fn name_of(t: &Target) -> &str {
    t.name.as_deref().unwrap_or_default()
}

fn get(
    sh: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    metadata_only: bool,
) -> Result<Response, ApiError> {
    // resourceVersion=0 is served from the watch cache, which may lag.
    let obj = if rv_param(q)? == Some(0) {
        sh.store.get_cached(t.res, &ns_of(t)?, name_of(t))?
    } else {
        sh.store.get(t.res, &ns_of(t)?, name_of(t))?
    };
    if wants_table(headers) {
        let meta = json!({"resourceVersion": obj.rv.to_string()});
        return table_response(&RESOURCES[t.res], &[obj], meta, q);
    }
    Ok(object_response(&RESOURCES[t.res], 200, &obj, metadata_only))
}

async fn list(
    sh: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    metadata_only: bool,
) -> Result<Response, ApiError> {
    let def = &RESOURCES[t.res];
    let sel = selectors(q, def)?;
    let limit = match q.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
        ),
        None => None,
    };
    let opts = ListOpts {
        resource_version: q.get("resourceVersion").cloned(),
        rv_match: q.get("resourceVersionMatch").cloned(),
        limit,
        continue_token: q.get("continue").cloned().filter(|c| !c.is_empty()),
    };
    // A NotOlderThan read of a future version waits a little, as the
    // watch cache does, before giving up.
    if let Some(rv) = rv_param(q)?
        && opts.rv_match.as_deref() != Some("Exact")
        && rv > sh.store.current_rv()
    {
        sh.store.wait_for_rv(rv, RV_WAIT).await;
    }
    let page = sh.store.list(t.res, t.ns.as_deref(), &sel, &opts)?;
    if wants_table(headers) {
        let mut meta = json!({"resourceVersion": page.rv.to_string()});
        if let Some(c) = &page.continue_token {
            meta["continue"] = json!(c);
        }
        if let Some(r) = page.remaining {
            meta["remainingItemCount"] = json!(r);
        }
        return table_response(def, &page.items, meta, q);
    }
    Ok(json_response(
        200,
        render_list(
            def,
            page.rv,
            &page.items,
            page.continue_token.as_deref(),
            page.remaining,
            metadata_only,
        ),
    ))
}

fn event_frame(kind: &str, object: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(object.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(kind.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(object);
    b.extend_from_slice(b"}\n");
    b.freeze()
}

/// One watch connection: its filters and where its events come from.
struct WatchStream {
    def: &'static ResourceDef,
    ns: Option<String>,
    sel: Selectors,
    metadata_only: bool,
    bookmarks: bool,
    pending: VecDeque<Bytes>,
    rx: tokio::sync::broadcast::Receiver<Msg>,
    deadline: tokio::time::Instant,
    cancel: CancellationToken,
    /// The server's own: cancelled at shutdown, which is not a drop.
    server: CancellationToken,
    disruptions: Arc<DisruptionCounters>,
    finished: bool,
    /// Changes up to this resourceVersion were sent already (or precede
    /// the watch): skipped.
    skip_through: u64,
}

impl WatchStream {
    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let (kind, api_version) = if self.metadata_only {
            (
                "PartialObjectMetadata".to_string(),
                "meta.k8s.io/v1".to_string(),
            )
        } else {
            (self.def.kind.to_string(), self.def.api_version())
        };
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": kind, "apiVersion": api_version, "metadata": meta});
        event_frame("BOOKMARK", &serde_json::to_vec(&obj).unwrap_or_default())
    }

    fn object(&self, obj: &Stored) -> Bytes {
        object_bytes(self.def, obj, self.metadata_only)
    }

    /// The event this watcher sees for a change, if any: selectors turn
    /// changes across their boundary into ADDED or DELETED, as the real
    /// watch cache does.
    fn frame(&self, c: &Change) -> Option<Bytes> {
        if self.ns.as_deref().is_some_and(|ns| ns != c.key.0) {
            return None;
        }
        if self.sel.is_empty() {
            return Some(event_frame(c.kind.as_str(), &self.object(&c.obj)));
        }
        let now = self.sel.matches(&c.obj.value);
        let before = c.prev.as_ref().is_some_and(|p| self.sel.matches(&p.value));
        let kind = match (c.kind, before, now) {
            (EventType::Added, _, true) => EventType::Added,
            (EventType::Modified, true, true) => EventType::Modified,
            (EventType::Modified, false, true) => EventType::Added,
            (EventType::Modified, true, false) => {
                // The previous content, stamped with this change's version.
                let mut prev = c.prev.as_ref().map(|p| p.value.clone()).unwrap_or_default();
                prev["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                let stored = Stored {
                    json: Bytes::from(serde_json::to_vec(&prev).unwrap_or_default()),
                    value: prev,
                    rv: c.rv,
                };
                return Some(event_frame("DELETED", &self.object(&stored)));
            }
            (EventType::Deleted, _, true) => EventType::Deleted,
            _ => return None,
        };
        Some(event_frame(kind.as_str(), &self.object(&c.obj)))
    }

    fn take(&mut self, msg: Msg, out: &mut BytesMut) {
        match msg {
            Msg::Change(c) => {
                if c.rv <= self.skip_through {
                    return;
                }
                if let Some(f) = self.frame(&c) {
                    out.extend_from_slice(&f);
                }
            }
            Msg::Tick(rv) => {
                if self.bookmarks {
                    out.extend_from_slice(&self.bookmark(rv, false));
                }
            }
        }
    }

    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, WatchStream)> {
        loop {
            if let Some(b) = self.pending.pop_front() {
                return Some((Ok(b), self));
            }
            if self.finished {
                return None;
            }
            let first = tokio::select! {
                _ = self.cancel.cancelled() => {
                    if !self.server.is_cancelled() {
                        DisruptionCounters::bump(&self.disruptions.watches_dropped);
                    }
                    return None;
                }
                _ = tokio::time::sleep_until(self.deadline) => return None,
                m = self.rx.recv() => m,
            };
            let mut out = BytesMut::new();
            match first {
                Ok(m) => self.take(m, &mut out),
                // A watcher that fell behind is closed, as the real server
                // does; the client resumes from its last resourceVersion.
                Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return None,
            }
            // Send whatever else is already queued in the same chunk.
            while out.len() < CHUNK {
                match self.rx.try_recv() {
                    Ok(m) => self.take(m, &mut out),
                    Err(TryRecvError::Empty) => break,
                    Err(_) => {
                        self.finished = true;
                        break;
                    }
                }
            }
            if !out.is_empty() {
                return Some((Ok(out.freeze()), self));
            }
        }
    }
}

fn watch(
    sh: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    metadata_only: bool,
) -> Result<Response, ApiError> {
    let def = &RESOURCES[t.res];
    let sel = selectors(q, def)?;
    let bookmarks = is_true(q, "allowWatchBookmarks");
    let initial_events = is_true(q, "sendInitialEvents");
    let rv_match = q.get("resourceVersionMatch").filter(|m| !m.is_empty());
    if initial_events {
        if !bookmarks {
            return Err(ApiError::bad_request(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        if rv_match.map(String::as_str) != Some("NotOlderThan") {
            return Err(ApiError::bad_request(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
    } else if rv_match.is_some() {
        return Err(ApiError::bad_request(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let timeout = match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        None => DEFAULT_WATCH_TIMEOUT,
    };
    let from = rv_param(q)?;
    let start = match sh.store.watch(t.res, t.ns.as_deref(), from, initial_events) {
        Ok(s) => s,
        Err(e) => {
            // Too old: 200, then one ERROR event carrying the 410 Status.
            let frame = event_frame(
                "ERROR",
                &serde_json::to_vec(&e.status()).unwrap_or_default(),
            );
            return Ok(json_response(200, frame));
        }
    };
    let mut ws = WatchStream {
        def,
        ns: t.ns.clone(),
        sel,
        metadata_only,
        bookmarks,
        pending: VecDeque::new(),
        rx: start.rx,
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
        cancel: sh.watch_cancel.lock().clone(),
        server: sh.cancel.clone(),
        disruptions: sh.store.disruptions.clone(),
        finished: false,
        skip_through: start.skip_through,
    };
    let mut chunk = BytesMut::new();
    for obj in start.initial.iter().filter(|o| ws.sel.matches(&o.value)) {
        chunk.extend_from_slice(&event_frame("ADDED", &ws.object(obj)));
        if chunk.len() >= CHUNK {
            ws.pending.push_back(std::mem::take(&mut chunk).freeze());
        }
    }
    for c in &start.replay {
        if let Some(f) = ws.frame(c) {
            chunk.extend_from_slice(&f);
            if chunk.len() >= CHUNK {
                ws.pending.push_back(std::mem::take(&mut chunk).freeze());
            }
        }
    }
    if initial_events {
        chunk.extend_from_slice(&ws.bookmark(start.rv, true));
    }
    if !chunk.is_empty() {
        ws.pending.push_back(chunk.freeze());
    }
    let stream = futures::stream::unfold(ws, WatchStream::next);
    Ok(json_response(200, Body::from_stream(stream)))
}

fn writer(q: &HashMap<String, String>, headers: &HeaderMap) -> Result<Writer, ApiError> {
    Ok(Writer {
        manager: manager(q, headers)?,
        ..Default::default()
    })
}

/// A write's result: the object, and whether it was created.
type Written = Result<(Arc<Stored>, bool), ApiError>;

/// A create, update or patch, through the validating webhooks that match
/// it (see `admission.rs`): dry-run, reviewed, then committed if the object
/// did not move meanwhile, else run again.
async fn admitted(
    sh: &Shared,
    t: &Target,
    verb: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Response {
    let def = &RESOURCES[t.res];
    let write = |w: &Writer| match verb {
        "create" => create(sh, t, headers, bytes, w),
        "update" => update(sh, t, headers, bytes, w),
        _ => patch(sh, t, q, headers, bytes, w),
    };
    let respond = |written: Written, warnings: &[String]| {
        let mut resp = match written {
            Ok((obj, created)) => {
                object_response(def, if created { 201 } else { 200 }, &obj, false)
            }
            Err(e) => error_response(&e),
        };
        for w in admission::warning_headers(warnings) {
            if let Ok(v) = HeaderValue::from_str(&w) {
                resp.headers_mut().append(header::WARNING, v);
            }
        }
        resp
    };
    let base = match writer(q, headers) {
        Ok(w) => w,
        Err(e) => return error_response(&e),
    };
    let configs = sh.store.all(resources::validating_webhooks());
    if !admission::any_for(&configs, def, t.sub.as_deref()) {
        return respond(write(&base), &[]);
    }
    let ns = t.ns.clone().unwrap_or_default();
    let user = sh.user_of(headers);
    let mut last = None;
    for _ in 0..ADMISSION_TRIES {
        let before = sh.store.get(t.res, &ns, name_of(t)).ok();
        let dry = Writer {
            dry_run: true,
            ..base.clone()
        };
        let (candidate, created) = match write(&dry) {
            Ok(c) => c,
            Err(e) => return error_response(&e),
        };
        let view = |v: &Value| resources::to_view(def, v).unwrap_or_else(|| v.clone());
        let (object, old) = (
            view(&candidate.value),
            before.as_ref().map(|b| view(&b.value)),
        );
        let namespace_labels = sh
            .store
            .get(resources::NAMESPACES, "", &ns)
            .ok()
            .and_then(|n| n.value.pointer("/metadata/labels").cloned());
        let meta = |k: &str| {
            candidate
                .value
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let name = meta("name");
        let attempt = admission::Attempt {
            def,
            sub: t.sub.as_deref(),
            operation: if created { "CREATE" } else { "UPDATE" },
            namespace: &ns,
            name: &name,
            object: &object,
            old: old.as_ref(),
            user: (&user.0, &user.1),
            namespace_labels: namespace_labels.as_ref(),
        };
        let admitted = admission::admit(&configs, &sh.routes, &attempt).await;
        if let Some(refused) = admitted.refused {
            return respond(Err(refused), &admitted.warnings);
        }
        let real = Writer {
            expect_rv: before.as_ref().map(|b| b.rv),
            pin: created.then(|| (name.clone(), meta("uid"), meta("creationTimestamp"))),
            ..base.clone()
        };
        match write(&real) {
            Err(e) if e.code == 409 && before.is_some() => last = Some((e, admitted.warnings)),
            written => return respond(written, &admitted.warnings),
        }
    }
    let (e, warnings) =
        last.unwrap_or_else(|| (ApiError::internal("admission did not settle"), Vec::new()));
    respond(Err(e), &warnings)
}

fn create(sh: &Shared, t: &Target, headers: &HeaderMap, bytes: &[u8], w: &Writer) -> Written {
    let body = decode_body(bytes, content_type(headers).contains("yaml"))?;
    let obj = sh.store.create(t.res, &ns_of(t)?, body, w, false)?;
    Ok((obj, true))
}

fn update(sh: &Shared, t: &Target, headers: &HeaderMap, bytes: &[u8], w: &Writer) -> Written {
    let body = decode_body(bytes, content_type(headers).contains("yaml"))?;
    sh.store
        .update(t.res, &ns_of(t)?, name_of(t), body, t.sub.as_deref(), w)
}

fn patch(
    sh: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    bytes: &[u8],
    w: &Writer,
) -> Written {
    let ct = content_type(headers);
    let body = match ct.as_str() {
        "application/merge-patch+json" => PatchBody::Merge(decode_body(bytes, false)?),
        "application/json-patch+json" => PatchBody::Json(decode_body(bytes, false)?),
        "application/strategic-merge-patch+json" => {
            PatchBody::Strategic(decode_body(bytes, false)?)
        }
        "application/apply-patch+yaml" => {
            if q.get("fieldManager").is_none_or(|m| m.is_empty()) {
                return Err(ApiError::bad_request(
                    "PATCH /apply requires fieldManager query parameter: fieldManager is required for apply requests",
                ));
            }
            let force = match q.get("force").map(String::as_str) {
                None | Some("") | Some("false") => false,
                Some("true") => true,
                Some(other) => {
                    return Err(ApiError::bad_request(format!(
                        "invalid force value {other:?}"
                    )));
                }
            };
            PatchBody::Apply {
                body: decode_body(bytes, true)?,
                force,
            }
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !matches!(body, PatchBody::Apply { .. }) && q.contains_key("force") {
        return Err(ApiError::bad_request(
            "force: Forbidden: may not be specified for non-apply patch",
        ));
    }
    sh.store
        .patch(t.res, &ns_of(t)?, name_of(t), t.sub.as_deref(), body, w)
}

fn delete_opts(bytes: &[u8]) -> Result<(DeleteOpts, Option<bool>), ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok((DeleteOpts::default(), None));
    }
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("error decoding DeleteOptions: {e}")))?;
    let pre = v.get("preconditions");
    let s = |k: &str| {
        pre.and_then(|p| p.get(k))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    Ok((
        DeleteOpts {
            uid: s("uid"),
            resource_version: s("resourceVersion"),
        },
        v.get("orphanDependents").and_then(Value::as_bool),
    ))
}

fn delete(
    sh: &Shared,
    t: &Target,
    _q: &HashMap<String, String>,
    bytes: &[u8],
) -> Result<Response, ApiError> {
    let def = &RESOURCES[t.res];
    let (opts, orphan) = delete_opts(bytes)?;
    let d = sh.store.delete(t.res, &ns_of(t)?, name_of(t), &opts)?;
    if !d.gone {
        // The real server answers 202 only when cascading was asked for explicitly.
        let code = if orphan == Some(false) { 202 } else { 200 };
        return Ok(object_response(&RESOURCES[t.res], code, &d.obj, false));
    }
    if def.return_deleted_object {
        return Ok(object_response(&RESOURCES[t.res], 200, &d.obj, false));
    }
    let mut details = json!({"name": name_of(t), "kind": def.plural, "uid": d.obj.value.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)});
    if !def.group.is_empty() {
        details["group"] = json!(def.group);
    }
    Ok(value_response(
        200,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
    ))
}

fn delete_collection(
    sh: &Shared,
    t: &Target,
    q: &HashMap<String, String>,
    bytes: &[u8],
    metadata_only: bool,
) -> Result<Response, ApiError> {
    let def = &RESOURCES[t.res];
    let sel = selectors(q, def)?;
    let (opts, _) = delete_opts(bytes)?;
    let (rv, items) = sh
        .store
        .delete_collection(t.res, t.ns.as_deref(), &sel, &opts)?;
    Ok(json_response(
        200,
        render_list(def, rv, &items, None, None, metadata_only),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    type Routed = (String, Option<String>, Option<String>, Option<String>);

    fn res_route(path: &str) -> Option<Routed> {
        match route(path, "x") {
            Route::Resource(t) => Some((RESOURCES[t.res].plural.to_string(), t.ns, t.name, t.sub)),
            _ => None,
        }
    }

    #[test]
    fn apiserver_routes() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            res_route("/api/v1/nodes"),
            Some(("nodes".into(), None, None, None))
        );
        assert_eq!(
            res_route("/api/v1/nodes/n1/status"),
            Some(("nodes".into(), None, s("n1"), s("status")))
        );
        assert_eq!(
            res_route("/api/v1/namespaces/default"),
            Some(("namespaces".into(), None, s("default"), None))
        );
        assert_eq!(
            res_route("/api/v1/namespaces/kube-system/status"),
            Some(("namespaces".into(), None, s("kube-system"), s("status")))
        );
        assert_eq!(
            res_route("/api/v1/namespaces/default/services/a/status"),
            Some(("services".into(), s("default"), s("a"), s("status")))
        );
        assert_eq!(
            res_route("/api/v1/services"),
            Some(("services".into(), None, None, None))
        );
        assert_eq!(
            res_route("/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"),
            Some(("leases".into(), s("kube-system"), s("l"), None))
        );
        assert_eq!(res_route("/api/v1/services/x"), None);
        assert_eq!(res_route("/api/v1/configmaps/x/status"), None);
        assert_eq!(
            res_route("/api/v1/namespaces/default/configmaps/x/status"),
            None
        );
        assert!(matches!(
            route("/apis/discovery.k8s.io/v1", "x"),
            Route::Doc(_)
        ));
        assert_eq!(route("/apis/nope/v1", "x"), Route::NotFound);
    }
}
