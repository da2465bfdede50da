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

    /// A made-up failure for a status code, as injected by a test.
    pub fn for_code(code: u16, message: Option<String>) -> Self {
        let (reason, default_message) = match code {
            400 => (
                "BadRequest",
                "the server rejected our request for an unknown reason",
            ),
            401 => ("Unauthorized", "Unauthorized"),
            403 => ("Forbidden", "forbidden: injected failure"),
            404 => (
                "NotFound",
                "the server could not find the requested resource",
            ),
            405 => (
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            ),
            409 => ("Conflict", "the server reported a conflict"),
            410 => ("Expired", "the resource has expired"),
            422 => (
                "Invalid",
                "the server rejected our request due to an error in our request",
            ),
            429 => (
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            ),
            500 => (
                "InternalError",
                "an error on the server (\"injected failure\") has prevented the request from succeeding",
            ),
            503 => (
                "ServiceUnavailable",
                "the server is currently unable to handle the request",
            ),
            504 => (
                "Timeout",
                "the server was unable to return a response in the time allotted, but may still be processing the request",
            ),
            _ => ("", "injected failure"),
        };
        let mut e = ApiError::new(
            code,
            reason,
            message.unwrap_or_else(|| default_message.to_string()),
        );
        if code == 429 || code == 503 || code == 504 {
            e.retry_after = Some(1);
            e.details = Some(json!({"retryAfterSeconds": 1}));
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
