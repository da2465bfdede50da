//! API errors rendered as `metav1.Status`, with the messages and reasons the
//! real kube-apiserver uses, so kube-rs turns them into `kube::Error::Api`
//! carrying the right code and reason.

use serde_json::{Map, Value, json};

use super::resources::ResourceDef;

/// A failed request: becomes an HTTP status code plus a `Status` body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429 and 5xx).
    pub retry_after: Option<u64>,
    /// Sent as `text/plain` (`message` and a newline) instead of a
    /// `Status`, as kube-apiserver's priority-and-fairness and
    /// max-in-flight filters answer a rejected request with Go's
    /// `http.Error`.
    pub plain_text: bool,
}

/// One entry of `details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Cause {
    pub reason: &'static str,
    pub message: String,
    pub field: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
            retry_after: None,
            plain_text: false,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `details` as the real server fills them: `kind` holds the plural.
    fn resource_details(res: &ResourceDef, name: &str) -> Value {
        let mut d = Map::new();
        d.insert("name".into(), json!(name));
        if !res.group.is_empty() {
            d.insert("group".into(), json!(res.group));
        }
        d.insert("kind".into(), json!(res.plural));
        Value::Object(d)
    }

    pub fn not_found(res: &ResourceDef, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.group_resource()),
        )
        .with_details(Self::resource_details(res, name))
    }

    pub fn already_exists(res: &ResourceDef, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.group_resource()),
        )
        .with_details(Self::resource_details(res, name))
    }

    /// A 409 Conflict; `why` follows the standard prefix.
    pub fn conflict(res: &ResourceDef, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.group_resource()
            ),
        )
        .with_details(Self::resource_details(res, name))
    }

    /// The conflict of an update whose resourceVersion is not the stored one.
    pub fn stale(res: &ResourceDef, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// A server-side apply conflict: its message is the whole text.
    pub fn apply_conflict(
        res: &ResourceDef,
        name: &str,
        message: String,
        causes: Vec<Cause>,
    ) -> Self {
        let mut details = Self::resource_details(res, name);
        details["causes"] = causes_json(&causes);
        ApiError::new(409, "Conflict", message).with_details(details)
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// A 422 for an object without a name (a review): `Kind.group "" is invalid: …`.
    pub fn invalid_kind(kind: &str, group: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list.join("")
        } else {
            format!("[{}]", list.join(", "))
        };
        let details =
            json!({"name": "", "group": group, "kind": kind, "causes": causes_json(&causes)});
        ApiError::new(
            422,
            "Invalid",
            format!("{kind}.{group} \"\" is invalid: {joined}"),
        )
        .with_details(details)
    }

    /// A 422 with field causes, formatted as the real validation errors.
    pub fn invalid(res: &ResourceDef, name: &str, causes: Vec<Cause>) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list.join("")
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut details = json!({"name": name, "kind": res.kind, "causes": causes_json(&causes)});
        if !res.group.is_empty() {
            details["group"] = json!(res.group);
        }
        ApiError::new(
            422,
            "Invalid",
            format!("{} \"{name}\" is invalid: {joined}", res.group_kind()),
        )
        .with_details(details)
    }

    /// A 422 without a field, as for a JSON patch that cannot be applied.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    /// 410 Gone with reason Expired: a resourceVersion or continue token that is too old.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn forbidden(res: &ResourceDef, name: &str, why: &str) -> Self {
        ApiError::new(
            403,
            "Forbidden",
            format!("{} \"{name}\" is forbidden: {why}", res.group_resource()),
        )
        .with_details(Self::resource_details(res, name))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                 application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message)
    }

    /// The error for a list or get at a resourceVersion the server has not reached.
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        let mut e = ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details = Some(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }));
        e.retry_after = Some(1);
        e
    }

    /// An injected failure for a status code, in the form kube-apiserver
    /// produces that code (`k8s.io/apimachinery/pkg/api/errors` and the
    /// apiserver filters). `target` names the resource and object of the
    /// request, when it has one; `message` replaces the standard text's
    /// variable part; `retry_after` sets `Retry-After` (and
    /// `details.retryAfterSeconds` where the real server sets both).
    pub fn injected(
        code: u16,
        target: Option<(&ResourceDef, &str)>,
        message: Option<String>,
        retry_after: Option<u64>,
    ) -> Self {
        let mut e = match (code, target) {
            // The optimistic-concurrency conflict of a write whose
            // resourceVersion is not the stored one (`NewConflict`).
            (409, Some((res, name))) => Self::stale(res, name),
            // The priority-and-fairness / max-in-flight rejection: Go's
            // `http.Error` with a plain-text body and `Retry-After`.
            (429, _) => {
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    "Too many requests, please try again later.",
                );
                e.plain_text = true;
                e.retry_after = Some(retry_after.unwrap_or(1));
                e
            }
            // `NewInternalError(err)`.
            (500, _) => {
                let cause = message.clone().unwrap_or_else(|| "injected failure".into());
                ApiError::new(500, "InternalError", format!("Internal error occurred: {cause}"))
                    .with_details(json!({"causes": [{"message": cause}]}))
            }
            // `NewServiceUnavailable(reason)`: the message is the reason.
            (503, _) => ApiError::new(
                503,
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            // The timeout filter's `NewTimeoutError(..., 0)`.
            (504, _) => ApiError::new(
                504,
                "Timeout",
                "Timeout: request did not complete within requested timeout - context deadline exceeded",
            )
            .with_details(json!({})),
            (403, _) => ApiError::new(403, "Forbidden", "forbidden: injected failure"),
            (404, Some((res, name))) => Self::not_found(res, name),
            (409, None) => ApiError::new(409, "Conflict", "Operation cannot be fulfilled: injected failure"),
            (410, _) => Self::expired("too old resource version: injected failure"),
            (400, _) => Self::bad_request("injected failure"),
            (401, _) => ApiError::new(401, "Unauthorized", "Unauthorized"),
            (404, None) => ApiError::new(404, "NotFound", "the server could not find the requested resource"),
            (422, _) => Self::unprocessable("injected failure"),
            _ => ApiError::new(code, "", "injected failure"),
        };
        if let Some(m) = message
            && code != 500
        {
            e.message = m;
        }
        if let Some(s) = retry_after.filter(|_| code != 429) {
            e.retry_after = Some(s);
            let mut d = e.details.take().unwrap_or_else(|| json!({}));
            d["retryAfterSeconds"] = json!(s);
            e.details = Some(d);
        }
        e
    }

    /// The `Status` object for this error.
    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

fn causes_json(causes: &[Cause]) -> Value {
    Value::Array(
        causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect(),
    )
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::resources::{RESOURCES, find};

    #[test]
    fn apiserver_status_bodies_match_real_format() {
        let lease = &RESOURCES[find("coordination.k8s.io", "v1", "leases").unwrap_or(0)];
        let s = ApiError::not_found(lease, "l1").status();
        assert_eq!(s["message"], "leases.coordination.k8s.io \"l1\" not found");
        assert_eq!(
            s["details"],
            json!({"name": "l1", "group": "coordination.k8s.io", "kind": "leases"})
        );
        assert_eq!(s["code"], 404);
        let node = &RESOURCES[find("", "v1", "nodes").unwrap_or(0)];
        let c = ApiError::stale(node, "n1");
        assert_eq!(
            c.message,
            "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again"
        );
        let inv = ApiError::invalid(
            node,
            "n1",
            vec![Cause {
                reason: "FieldValueForbidden",
                message: "Forbidden: nope".into(),
                field: "metadata.finalizers".into(),
            }],
        );
        assert_eq!(
            inv.message,
            "Node \"n1\" is invalid: metadata.finalizers: Forbidden: nope"
        );
    }
}
