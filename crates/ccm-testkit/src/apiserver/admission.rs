//! Validating admission webhooks, called as kube-apiserver calls them
//! (k8s.io/apiserver's `admission/plugin/webhook`): for a create or update
//! that a ValidatingWebhookConfiguration's rules and selectors match, an
//! `admission.k8s.io/v1` AdmissionReview (fresh `uid`, kind, resource,
//! operation, object, oldObject, userInfo) is POSTed to the webhook over
//! TLS verified against its `caBundle`, within `timeoutSeconds` (default
//! 10). The answer must be a v1 AdmissionReview whose `response.uid` is the
//! request's, or the call failed. A failed call refuses the write with 500
//! under `failurePolicy: Fail` (the default) and is skipped under
//! `Ignore`; `allowed: false` refuses it with the webhook's status (403 by
//! default). Every webhook's `warnings` reach the client as `Warning: 299
//! - "..."` headers, deduplicated and truncated as kube-apiserver's
//! warning recorder does ([`warning_headers`]).
//!
//! The object reviewed is the write's result, defaults and validation
//! included (the store's dry run); the write then commits only if the
//! object did not move meanwhile, and runs again otherwise, as
//! kube-apiserver's update loop does. A create commits the uid, name and
//! creationTimestamp that were reviewed.
//!
//! Differences, none of which the CCM's webhook can observe: only CREATE
//! and UPDATE are admitted (a DELETE or CONNECT rule is accepted and never
//! called); `matchPolicy` is always `Exact`; `matchConditions` are not
//! evaluated; a `clientConfig.service` is reached at the address a test
//! registered for it ([`super::TestApiServer::route_service`]), with the
//! server name `<name>.<namespace>.svc`; calls are HTTP/1.1.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};

use super::errors::{ApiError, Cause};
use super::resources::ResourceDef;

pub(crate) const GROUP: &str = "admissionregistration.k8s.io";
/// kube-apiserver's limits on warnings: all of them, and each one once
/// the total is over.
const TOTAL_RUNES: usize = 4 * 1024;
const ITEM_RUNES: usize = 256;

/// Where each `clientConfig.service` (namespace, name, port) is served.
#[derive(Default)]
pub(crate) struct ServiceRoutes(Mutex<HashMap<(String, String, u16), SocketAddr>>);

impl ServiceRoutes {
    pub fn add(&self, namespace: &str, name: &str, port: u16, addr: SocketAddr) {
        self.0
            .lock()
            .insert((namespace.into(), name.into(), port), addr);
    }

    fn get(&self, namespace: &str, name: &str, port: u16) -> Option<SocketAddr> {
        self.0
            .lock()
            .get(&(namespace.into(), name.into(), port))
            .copied()
    }
}

/// One write under review.
pub(crate) struct Attempt<'a> {
    /// The resource as requested.
    pub def: &'static ResourceDef,
    pub sub: Option<&'a str>,
    /// `CREATE` or `UPDATE`.
    pub operation: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
    pub user: (&'a str, &'a [String]),
    /// The labels of the object's namespace (namespaced resources).
    pub namespace_labels: Option<&'a Value>,
}

/// A write's admission: the warnings to return, and the refusal if any.
pub(crate) struct Admitted {
    pub warnings: Vec<String>,
    pub refused: Option<ApiError>,
}

/// Whether any webhook of `configs` could match a write of `def` (`sub`):
/// a write nothing matches is not dry-run first.
pub(crate) fn any_for(configs: &[Value], def: &ResourceDef, sub: Option<&str>) -> bool {
    def.group != GROUP
        && hooks(configs).any(|h| rules(h).any(|r| rule_resource_matches(r, def, sub)))
}

fn hooks(configs: &[Value]) -> impl Iterator<Item = &Value> {
    configs
        .iter()
        .filter_map(|c| c.get("webhooks").and_then(Value::as_array))
        .flatten()
}

fn rules(hook: &Value) -> impl Iterator<Item = &Value> {
    hook.get("rules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn rule_resource_matches(rule: &Value, def: &ResourceDef, sub: Option<&str>) -> bool {
    let any_of = |list: Vec<&str>, want: &str| list.iter().any(|v| *v == "*" || *v == want);
    let resource_ok = strings(rule.get("resources")).iter().any(|r| {
        let (res, rsub) = r.split_once('/').unwrap_or((r, ""));
        let res_ok = res == "*" || res == def.plural;
        let sub_ok = match sub {
            None => rsub.is_empty(),
            Some(s) => rsub == "*" || rsub == s,
        };
        res_ok && sub_ok
    });
    let scope = rule.get("scope").and_then(Value::as_str).unwrap_or("*");
    let scope_ok = match scope {
        "Cluster" => !def.namespaced,
        "Namespaced" => def.namespaced,
        _ => true,
    };
    any_of(strings(rule.get("apiGroups")), def.group)
        && any_of(strings(rule.get("apiVersions")), def.version)
        && resource_ok
        && scope_ok
}

fn hook_matches(hook: &Value, a: &Attempt) -> bool {
    let rule_ok = rules(hook).any(|r| {
        let ops = strings(r.get("operations"));
        (ops.contains(&"*") || ops.contains(&a.operation)) && rule_resource_matches(r, a.def, a.sub)
    });
    let labels = |o: Option<&Value>| o.and_then(|o| o.pointer("/metadata/labels")).cloned();
    let object_ok = match hook.get("objectSelector") {
        None => true,
        Some(sel) => [labels(Some(a.object)), labels(a.old)]
            .iter()
            .any(|l| selector_matches(sel, l.as_ref())),
    };
    let namespace_ok = match (hook.get("namespaceSelector"), a.def.namespaced) {
        (Some(sel), true) => selector_matches(sel, a.namespace_labels),
        _ => true,
    };
    rule_ok && object_ok && namespace_ok
}

/// A metav1.LabelSelector over `labels`; an empty selector matches all.
fn selector_matches(sel: &Value, labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let by_label = sel
        .get("matchLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| get(k) == v.as_str());
    let by_expression = sel
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .all(|e| {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values = strings(e.get("values"));
            match e.get("operator").and_then(Value::as_str) {
                Some("In") => get(key).is_some_and(|v| values.contains(&v)),
                Some("NotIn") => get(key).is_none_or(|v| !values.contains(&v)),
                Some("Exists") => get(key).is_some(),
                Some("DoesNotExist") => get(key).is_none(),
                _ => false,
            }
        });
    by_label && by_expression
}

/// Calls every webhook of `configs` that matches `a`, all at once.
pub(crate) async fn admit(configs: &[Value], routes: &ServiceRoutes, a: &Attempt<'_>) -> Admitted {
    let matching: Vec<&Value> = hooks(configs).filter(|h| hook_matches(h, a)).collect();
    let calls = matching.iter().map(|h| call_one(h, routes, a));
    let answers = futures::future::join_all(calls).await;
    let mut out = Admitted {
        warnings: Vec::new(),
        refused: None,
    };
    for (hook, answer) in matching.iter().zip(answers) {
        let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
        let ignore = hook.get("failurePolicy").and_then(Value::as_str) == Some("Ignore");
        match answer {
            Ok(response) => {
                out.warnings.extend(
                    strings(response.get("warnings"))
                        .into_iter()
                        .map(str::to_string),
                );
                if response.get("allowed").and_then(Value::as_bool) != Some(true) {
                    out.refused
                        .get_or_insert_with(|| denied(name, response.get("status")));
                }
            }
            Err(e) if ignore => {
                tracing::info!(webhook = name, error = %e, "kube-test-server: failed calling webhook, ignored (failurePolicy Ignore)");
            }
            Err(e) => {
                out.refused.get_or_insert_with(|| {
                    ApiError::internal(format!(
                        "Internal error occurred: failed calling webhook {name:?}: {e}"
                    ))
                });
            }
        }
    }
    out
}

/// k8s.io/apiserver's `ToStatusErr` for a webhook that refused.
fn denied(name: &str, status: Option<&Value>) -> ApiError {
    let field = |k: &str| {
        status
            .and_then(|s| s.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
    };
    let code = status
        .and_then(|s| s.get("code"))
        .and_then(Value::as_u64)
        .filter(|c| (400..600).contains(c))
        .unwrap_or(403) as u16;
    let by = format!("admission webhook {name:?} denied the request");
    let message = match (field("message"), field("reason")) {
        ("", "") => format!("{by} without explanation"),
        ("", reason) => format!("{by}: {reason}"),
        (message, _) => format!("{by}: {message}"),
    };
    ApiError::new(code, field("reason"), message)
}

async fn call_one(hook: &Value, routes: &ServiceRoutes, a: &Attempt<'_>) -> Result<Value, String> {
    let secs = hook
        .get("timeoutSeconds")
        .and_then(Value::as_u64)
        .unwrap_or(10);
    let uid = uuid::Uuid::new_v4().to_string();
    let review = review(a, &uid);
    let call = post(hook, routes, review.to_string());
    let body = match tokio::time::timeout(Duration::from_secs(secs), call).await {
        Ok(answer) => answer?,
        Err(_) => return Err("context deadline exceeded".into()),
    };
    verify(&body, &uid)
}

/// The AdmissionReview kube-apiserver sends for `a`.
fn review(a: &Attempt, uid: &str) -> Value {
    let kind = json!({"group": a.def.group, "version": a.def.version, "kind": a.def.kind});
    let resource =
        json!({"group": a.def.group, "version": a.def.version, "resource": a.def.plural});
    let options = if a.operation == "CREATE" {
        "CreateOptions"
    } else {
        "UpdateOptions"
    };
    let mut request = json!({
        "uid": uid,
        "kind": kind, "resource": resource,
        "requestKind": kind, "requestResource": resource,
        "name": a.name,
        "operation": a.operation,
        "userInfo": {"username": a.user.0, "groups": a.user.1},
        "object": a.object,
        "oldObject": a.old,
        "dryRun": false,
        "options": {"kind": options, "apiVersion": "meta.k8s.io/v1"},
    });
    if a.def.namespaced {
        request["namespace"] = json!(a.namespace);
    }
    if let Some(sub) = a.sub {
        request["subResource"] = json!(sub);
        request["requestSubResource"] = json!(sub);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// k8s.io/apiserver's `VerifyAdmissionResponse` for a validating webhook.
fn verify(body: &[u8], uid: &str) -> Result<Value, String> {
    let review: Value = serde_json::from_slice(body)
        .map_err(|e| format!("received invalid webhook response: {e}"))?;
    let response = review
        .get("response")
        .filter(|r| r.is_object())
        .ok_or("webhook response was absent")?;
    let got = response
        .get("uid")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if got != uid {
        return Err(format!("expected response.uid={uid:?}, got {got:?}"));
    }
    let gvk = (
        review.get("apiVersion").and_then(Value::as_str),
        review.get("kind").and_then(Value::as_str),
    );
    if gvk != (Some("admission.k8s.io/v1"), Some("AdmissionReview")) {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {gvk:?}"
        ));
    }
    if response.get("patch").is_some() || response.get("patchType").is_some() {
        return Err(
            "validating webhook may not return response.patch or response.patchType".into(),
        );
    }
    Ok(response.clone())
}

/// Where a webhook is, and the name its certificate must carry.
fn target(hook: &Value, routes: &ServiceRoutes) -> Result<(SocketAddr, String, String), String> {
    let client = hook.get("clientConfig").unwrap_or(&Value::Null);
    if let Some(url) = client.get("url").and_then(Value::as_str) {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid url {url:?}: {e}"))?;
        let host = uri
            .host()
            .unwrap_or_default()
            .trim_matches(['[', ']'])
            .to_string();
        let port = uri.port_u16().unwrap_or(443);
        let addr = tokio_lookup(&host, port)?;
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        return Ok((addr, host, path));
    }
    let svc = client.get("service").unwrap_or(&Value::Null);
    let s = |k: &str| svc.get(k).and_then(Value::as_str).unwrap_or_default();
    let port = svc.get("port").and_then(Value::as_u64).unwrap_or(443) as u16;
    let addr = routes
        .get(s("namespace"), s("name"), port)
        .ok_or_else(|| format!("service \"{}/{}\" not found", s("namespace"), s("name")))?;
    let path = Some(s("path")).filter(|p| !p.is_empty()).unwrap_or("/");
    Ok((
        addr,
        format!("{}.{}.svc", s("name"), s("namespace")),
        path.to_string(),
    ))
}

fn tokio_lookup(host: &str, port: u16) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("dial tcp: lookup {host}: no such host"))
}

/// POSTs `body` over TLS trusting only the webhook's `caBundle`.
async fn post(hook: &Value, routes: &ServiceRoutes, body: String) -> Result<Vec<u8>, String> {
    use http_body_util::{BodyExt, Full};

    let (addr, server_name, path) = target(hook, routes)?;
    let url = format!("https://{server_name}{path}");
    let fail = |e: String| format!("failed to call webhook: Post {url:?}: {e}");
    let ca = hook
        .pointer("/clientConfig/caBundle")
        .and_then(Value::as_str)
        .and_then(base64_decode)
        .unwrap_or_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&ca).flatten() {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from(server_name.clone()).map_err(|e| fail(e.to_string()))?;
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| fail(format!("dial tcp {addr}: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| fail(format!("tls: {e}")))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail(e.to_string()))?;
    tokio::spawn(conn);
    let req = http::Request::post(path)
        .header("host", server_name)
        .header("content-type", "application/json")
        .header("accept", "application/json, */*")
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| fail(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| fail(e.to_string()))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| fail(e.to_string()))?
        .to_bytes();
    if status != 200 {
        return Err(format!(
            "failed to call webhook: the server responded with status code {status}: {}",
            String::from_utf8_lossy(&bytes)
        ));
    }
    Ok(bytes.to_vec())
}

/// The `Warning` header values for `texts`, as kube-apiserver's warning
/// recorder writes them: each text once; while they fit in 4,096 runes in
/// all, whole; past that, every one cut to 256 runes. A text with a control
/// character is dropped (`NewWarningHeader` refuses it).
pub(crate) fn warning_headers(texts: &[String]) -> Vec<String> {
    let cut = |t: &str| -> (String, usize) {
        let runes = t.chars().count();
        if runes > ITEM_RUNES {
            (t.chars().take(ITEM_RUNES).collect(), ITEM_RUNES)
        } else {
            (t.to_string(), runes)
        }
    };
    let mut recorded = std::collections::HashSet::new();
    let mut ordered: Vec<&str> = Vec::new();
    let (mut out, mut written, mut truncating) = (Vec::new(), 0, false);
    for text in texts.iter().map(String::as_str) {
        if text.is_empty() || (truncating && written >= TOTAL_RUNES) || !recorded.insert(text) {
            continue;
        }
        ordered.push(text);
        let (text, runes) = if truncating {
            cut(text)
        } else {
            (text.to_string(), text.chars().count())
        };
        let Some(value) = header(&text) else {
            continue;
        };
        if truncating || written + runes <= TOTAL_RUNES {
            written += runes;
            out.push(value);
            continue;
        }
        // Over the total: start again, every warning so far cut.
        (truncating, written) = (true, 0);
        out.clear();
        for (text, runes) in ordered.iter().map(|t| cut(t)) {
            if let Some(value) = header(&text) {
                written += runes;
                out.push(value);
            }
        }
    }
    out
}

/// `NewWarningHeader(299, "-", text)`: `None` for a control character.
fn header(text: &str) -> Option<String> {
    if text.chars().any(char::is_control) {
        return None;
    }
    let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
    Some(format!("299 - \"{quoted}\""))
}

/// What kube-apiserver's validation refuses in a
/// ValidatingWebhookConfiguration.
pub(crate) fn validate_configuration(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let mut names = std::collections::HashSet::new();
    let empty = Vec::new();
    let hooks = obj
        .get("webhooks")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for (i, hook) in hooks.iter().enumerate() {
        let at = |f: &str| format!("webhooks[{i}].{f}");
        let mut bad = |field: String, reason: &'static str, message: String| {
            causes.push(Cause {
                reason,
                message,
                field,
            })
        };
        let name = hook.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.split('.').filter(|s| !s.is_empty()).count() < 3 {
            bad(
                at("name"),
                "FieldValueInvalid",
                format!(
                    "Invalid value: {name:?}: should be a domain with at least three segments separated by dots"
                ),
            );
        } else if !names.insert(name) {
            bad(
                at("name"),
                "FieldValueDuplicate",
                format!("Duplicate value: {name:?}"),
            );
        }
        let versions = strings(hook.get("admissionReviewVersions"));
        if versions.is_empty() {
            bad(
                at("admissionReviewVersions"),
                "FieldValueRequired",
                "Required value: must specify one of v1, v1beta1".into(),
            );
        } else if !versions.iter().any(|v| *v == "v1" || *v == "v1beta1") {
            bad(
                at("admissionReviewVersions"),
                "FieldValueInvalid",
                format!("Invalid value: {versions:?}: must include at least one of v1, v1beta1"),
            );
        }
        match hook.get("sideEffects").and_then(Value::as_str) {
            Some("None" | "NoneOnDryRun") => {}
            None => bad(
                at("sideEffects"),
                "FieldValueRequired",
                "Required value: must specify one of None, NoneOnDryRun".into(),
            ),
            Some(v) => bad(
                at("sideEffects"),
                "FieldValueNotSupported",
                format!("Unsupported value: {v:?}: supported values: \"None\", \"NoneOnDryRun\""),
            ),
        }
        if let Some(p) = hook.get("failurePolicy").and_then(Value::as_str)
            && p != "Ignore"
            && p != "Fail"
        {
            bad(
                at("failurePolicy"),
                "FieldValueNotSupported",
                format!("Unsupported value: {p:?}: supported values: \"Fail\", \"Ignore\""),
            );
        }
        if let Some(t) = hook.get("timeoutSeconds").and_then(Value::as_i64)
            && !(1..=30).contains(&t)
        {
            bad(
                at("timeoutSeconds"),
                "FieldValueInvalid",
                format!("Invalid value: {t}: the timeout value must be between 1 and 30 seconds"),
            );
        }
        let client = hook.get("clientConfig").unwrap_or(&Value::Null);
        match (
            client.get("url").and_then(Value::as_str),
            client.get("service"),
        ) {
            (Some(_), Some(_)) | (None, None) => bad(
                at("clientConfig"),
                "FieldValueRequired",
                "Required value: exactly one of url or service is required".into(),
            ),
            (Some(url), None) => {
                let ok = url.parse::<http::Uri>().is_ok_and(|u| {
                    u.scheme_str() == Some("https") && u.host().is_some() && u.query().is_none()
                }) && !url.contains('#')
                    && !url.contains('@');
                if !ok {
                    bad(
                        at("clientConfig.url"),
                        "FieldValueInvalid",
                        format!(
                            "Invalid value: {url:?}: must be an https URL with a host, no user info, query or fragment"
                        ),
                    );
                }
            }
            (None, Some(svc)) => {
                for k in ["namespace", "name"] {
                    if svc.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                        bad(
                            at(&format!("clientConfig.service.{k}")),
                            "FieldValueRequired",
                            "Required value: service namespace and name are required".into(),
                        );
                    }
                }
            }
        }
        if let Some(ca) = client.get("caBundle").and_then(Value::as_str)
            && base64_decode(ca).is_none()
        {
            bad(
                at("clientConfig.caBundle"),
                "FieldValueInvalid",
                "Invalid value: illegal base64 data".into(),
            );
        }
        for (j, rule) in rules(hook).enumerate() {
            for op in strings(rule.get("operations")) {
                if !matches!(op, "*" | "CREATE" | "UPDATE" | "DELETE" | "CONNECT") {
                    bad(
                        format!("webhooks[{i}].rules[{j}].operations"),
                        "FieldValueNotSupported",
                        format!(
                            "Unsupported value: {op:?}: supported values: \"*\", \"CONNECT\", \"CREATE\", \"DELETE\", \"UPDATE\""
                        ),
                    );
                }
            }
            if strings(rule.get("resources")).is_empty() {
                bad(
                    format!("webhooks[{i}].rules[{j}].resources"),
                    "FieldValueRequired",
                    "Required value: resources is required".into(),
                );
            }
        }
    }
    if causes.is_empty() {
        return Ok(());
    }
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    Err(ApiError::invalid(def, name, causes))
}

/// Standard base64, padding required, as Go's `[]byte` JSON decoding reads it.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (n, chunk) in bytes.chunks(4).enumerate() {
        let last = n + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|b| **b == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut acc = 0u32;
        for &b in &chunk[..4 - pad] {
            let v = ALPHABET.iter().position(|a| *a == b)? as u32;
            acc = (acc << 6) | v;
        }
        acc <<= 6 * pad as u32;
        let three = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_deduplicated_then_cut_as_kube_apiservers_recorder_does() {
        let short = vec![
            "a \"quoted\" \\ value".to_string(),
            "a \"quoted\" \\ value".into(),
        ];
        assert_eq!(
            warning_headers(&short),
            [r#"299 - "a \"quoted\" \\ value""#]
        );
        assert!(warning_headers(&["bell\u{7}".to_string()]).is_empty());
        // Under the total, whole; over it, each cut to 256 runes.
        let long = "é".repeat(300);
        assert_eq!(
            warning_headers(std::slice::from_ref(&long))[0]
                .chars()
                .count(),
            300 + 8
        );
        let many: Vec<String> = (0..20).map(|i| format!("{i}{long}")).collect();
        let cut = warning_headers(&many);
        assert_eq!(cut.len(), 16, "16 × 256 runes fill the 4,096");
        assert!(cut.iter().all(|h| h.chars().count() == 256 + 8));
    }

    #[test]
    fn base64_reads_padded_standard_encoding_only() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert!(base64_decode("aGk").is_none());
        assert!(base64_decode("a=Gk").is_none());
        assert!(base64_decode("aG-k").is_none());
    }

    #[test]
    fn rules_match_group_version_resource_subresource_and_scope() {
        let svc = super::super::resources::RESOURCES
            .iter()
            .find(|r| r.plural == "services")
            .unwrap();
        let rule = |resources: Value, scope: &str| json!({"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": resources, "scope": scope});
        assert!(rule_resource_matches(
            &rule(json!(["services"]), "Namespaced"),
            svc,
            None
        ));
        assert!(!rule_resource_matches(
            &rule(json!(["services"]), "*"),
            svc,
            Some("status")
        ));
        assert!(rule_resource_matches(
            &rule(json!(["services/*"]), "*"),
            svc,
            Some("status")
        ));
        assert!(!rule_resource_matches(
            &rule(json!(["services"]), "Cluster"),
            svc,
            None
        ));
        assert!(!rule_resource_matches(
            &rule(json!(["nodes"]), "*"),
            svc,
            None
        ));
        let sel = json!({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}], "matchLabels": {"x": "1"}});
        assert!(selector_matches(
            &sel,
            Some(&json!({"x": "1", "team": "b"}))
        ));
        assert!(!selector_matches(
            &sel,
            Some(&json!({"x": "1", "team": "a"}))
        ));
        assert!(!selector_matches(&sel, None));
        assert!(selector_matches(&json!({}), None));
    }
}
