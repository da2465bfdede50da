//! ECR Public, and ECR's token answer, in the fault proxy.
//!
//! moto 5.2.5 answers ECR's `GetAuthorizationToken` (always the token
//! `AWS:<account>-auth-token`, expiring 2015-01-01) but has no ECR Public
//! (HTTP 500). The proxy answers ECR Public's `GetAuthorizationToken`
//! itself, as AWS documents it, refusals included:
//! - an unsigned call: 400 `MissingAuthenticationTokenException`;
//! - a call signed for a region other than `us-east-1`, the API's only
//!   region: 400 `InvalidSignatureException` (the credential scope names
//!   a region the endpoint does not serve);
//! - with a caller policy set ([`EcrStandIn::set_caller_policy`]): 400
//!   `AccessDeniedException` unless the policy allows both
//!   `ecr-public:GetAuthorizationToken` and `sts:GetServiceBearerToken`
//!   (ECR Public's token is a service bearer token), or for ECR unless it
//!   allows `ecr:GetAuthorizationToken`.
//!
//! The answer: `{"authorizationData": {"authorizationToken": base64("AWS:<token>"),
//! "expiresAt": <epoch seconds>}}`, valid 12 hours unless told otherwise.
//!
//! A test can also replace either API's 200 answer with a body of its own
//! ([`EcrStandIn::set_answer`]) to see a client refuse a bad one (no data,
//! a token that is not base64 or has no `:`). Throttling and 5xx come from
//! the proxy's fault rules (`FaultRule::for_service("ecr-public")`), which
//! apply before this module answers, in each API's JSON error format.
//! Every call either API receives is kept with its signing region and
//! access key id ([`EcrStandIn::calls`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use parking_lot::{Mutex, RwLock};

use super::errors::AwsError;
use super::request::{AwsCall, signing_region};
use crate::iam::{Context, Policy};

/// The signing name of ECR.
pub const SERVICE_ECR: &str = "ecr";
/// The signing name of ECR Public.
pub const SERVICE_ECR_PUBLIC: &str = "ecr-public";
/// ECR Public's only API region.
pub const ECR_PUBLIC_REGION: &str = "us-east-1";

const ACTION: &str = "GetAuthorizationToken";

/// One `GetAuthorizationToken` call as the stand-in saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcrCall {
    /// `ecr` or `ecr-public`.
    pub service: String,
    /// The region of the call's SigV4 credential scope.
    pub region: Option<String>,
    /// The access key id that signed it (never the secret).
    pub access_key_id: Option<String>,
}

/// The ECR/ECR Public stand-in of one proxy; see the module docs.
pub struct EcrStandIn {
    settings: RwLock<Settings>,
    calls: Mutex<Vec<EcrCall>>,
    issued: Mutex<Vec<String>>,
}

struct Settings {
    public_token_lifetime: Duration,
    caller_policy: Option<Arc<Policy>>,
    answers: BTreeMap<String, String>,
}

impl Default for EcrStandIn {
    fn default() -> EcrStandIn {
        EcrStandIn {
            settings: RwLock::new(Settings {
                public_token_lifetime: Duration::from_secs(12 * 3600),
                caller_policy: None,
                answers: BTreeMap::new(),
            }),
            calls: Mutex::new(Vec::new()),
            issued: Mutex::new(Vec::new()),
        }
    }
}

impl EcrStandIn {
    /// How long ECR Public's tokens are valid from now on (12 h by default).
    pub fn set_public_token_lifetime(&self, lifetime: Duration) {
        self.settings.write().public_token_lifetime = lifetime;
    }

    /// The identity policy every caller of either API has (`None`: every
    /// call is allowed).
    pub fn set_caller_policy(&self, policy: Option<&str>) -> anyhow::Result<()> {
        let parsed = match policy {
            Some(text) => Some(Arc::new(
                Policy::parse(text).map_err(|e| anyhow::anyhow!("the caller policy: {e}"))?,
            )),
            None => None,
        };
        self.settings.write().caller_policy = parsed;
        Ok(())
    }

    /// Answers `service`'s (`ecr` or `ecr-public`) `GetAuthorizationToken`
    /// with this 200 body instead of the real answer (`None`: the real one).
    pub fn set_answer(&self, service: &str, body: Option<&str>) {
        let mut settings = self.settings.write();
        match body {
            Some(body) => settings.answers.insert(service.to_owned(), body.to_owned()),
            None => settings.answers.remove(service),
        };
    }

    /// Every `GetAuthorizationToken` received, oldest first.
    pub fn calls(&self) -> Vec<EcrCall> {
        self.calls.lock().clone()
    }

    /// The passwords of the ECR Public tokens issued, oldest first.
    pub fn issued_public_passwords(&self) -> Vec<String> {
        self.issued.lock().clone()
    }

    /// The answer to `call` when this stand-in gives it; `None` forwards it.
    pub(super) fn answer(&self, call: &AwsCall, headers: &HeaderMap) -> Option<Response<Bytes>> {
        let public = call.service == SERVICE_ECR_PUBLIC;
        if !(public || call.service == SERVICE_ECR) || call.action != ACTION {
            return None;
        }
        let region = signing_region(headers);
        let access_key_id = access_key_id(headers);
        self.calls.lock().push(EcrCall {
            service: call.service.clone(),
            region: region.clone(),
            access_key_id: access_key_id.clone(),
        });
        let settings = self.settings.read();
        if let Some(refusal) = refusal(
            public,
            region.as_deref(),
            access_key_id.as_deref(),
            &settings,
        ) {
            return Some(refusal.to_response(call));
        }
        if let Some(body) = settings.answers.get(&call.service) {
            return Some(json_response(body.clone()));
        }
        if !public {
            return None;
        }
        let password = format!("ecr-public-{}", uuid::Uuid::new_v4().simple());
        let expires = chrono::Utc::now()
            + chrono::Duration::from_std(settings.public_token_lifetime).unwrap_or_default();
        let body = serde_json::json!({
            "authorizationData": {
                "authorizationToken": base64(format!("AWS:{password}").as_bytes()),
                "expiresAt": expires.timestamp_millis() as f64 / 1000.0,
            }
        });
        self.issued.lock().push(password);
        Some(json_response(body.to_string()))
    }
}

/// Why AWS would refuse the call, if it would.
fn refusal(
    public: bool,
    region: Option<&str>,
    access_key_id: Option<&str>,
    settings: &Settings,
) -> Option<AwsError> {
    let Some(access_key_id) = access_key_id else {
        return Some(AwsError::new(
            400,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    if public && region != Some(ECR_PUBLIC_REGION) {
        return Some(AwsError::new(
            400,
            "InvalidSignatureException",
            format!(
                "Credential should be scoped to a valid region, not '{}'. ",
                region.unwrap_or_default()
            ),
        ));
    }
    let policy = settings.caller_policy.as_ref()?;
    let needed: &[&str] = if public {
        &[
            "ecr-public:GetAuthorizationToken",
            "sts:GetServiceBearerToken",
        ]
    } else {
        &["ecr:GetAuthorizationToken"]
    };
    let denied = needed.iter().find(|action| {
        !policy
            .evaluate(action, "*", &Context::default())
            .is_allowed()
    })?;
    Some(AwsError::new(
        400,
        "AccessDeniedException",
        format!(
            "User: {access_key_id} is not authorized to perform: {denied} on resource: * because no identity-based policy allows the {denied} action"
        ),
    ))
}

/// The access key id of a SigV4 `Authorization` header.
fn access_key_id(headers: &HeaderMap) -> Option<String> {
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let credential = auth
        .split([',', ' '])
        .find_map(|part| part.trim().strip_prefix("Credential="))?;
    credential
        .split('/')
        .next()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

fn json_response(body: String) -> Response<Bytes> {
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-amz-json-1.1"),
    );
    if let Ok(id) = HeaderValue::from_str(&uuid::Uuid::new_v4().to_string()) {
        headers.insert("x-amzn-requestid", id);
    }
    response
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::request::Protocol;

    fn call(service: &str) -> AwsCall {
        AwsCall {
            service: service.into(),
            action: ACTION.into(),
            version: None,
            param_names: Vec::new(),
            protocol: Protocol::AwsJson,
        }
    }

    fn signed(region: &str, service: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!(
            "AWS4-HMAC-SHA256 Credential=AKIDTEST/20250101/{region}/{service}/aws4_request, SignedHeaders=host, Signature=00"
        );
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&value).expect("header"),
        );
        headers
    }

    fn json(response: &Response<Bytes>) -> serde_json::Value {
        serde_json::from_slice(response.body()).expect("JSON body")
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(
            base64(b"AWS:123456789012-auth-token"),
            "QVdTOjEyMzQ1Njc4OTAxMi1hdXRoLXRva2Vu"
        );
    }

    #[test]
    fn public_tokens_are_issued_in_us_east_1_only() {
        let stand_in = EcrStandIn::default();
        let ok = stand_in
            .answer(
                &call(SERVICE_ECR_PUBLIC),
                &signed("us-east-1", "ecr-public"),
            )
            .expect("answered");
        assert_eq!(ok.status(), 200);
        let body = json(&ok);
        let password = &stand_in.issued_public_passwords()[0];
        assert_eq!(
            body["authorizationData"]["authorizationToken"],
            base64(format!("AWS:{password}").as_bytes())
        );
        let expires = body["authorizationData"]["expiresAt"]
            .as_f64()
            .expect("number");
        let left = expires - chrono::Utc::now().timestamp() as f64;
        assert!((43_000.0..=43_201.0).contains(&left), "{left}");

        let wrong = stand_in
            .answer(
                &call(SERVICE_ECR_PUBLIC),
                &signed("us-west-2", "ecr-public"),
            )
            .expect("answered");
        assert_eq!(wrong.status(), 400);
        assert_eq!(json(&wrong)["__type"], "InvalidSignatureException");
        let unsigned = stand_in
            .answer(&call(SERVICE_ECR_PUBLIC), &HeaderMap::new())
            .expect("answered");
        assert_eq!(
            json(&unsigned)["__type"],
            "MissingAuthenticationTokenException"
        );
        assert_eq!(stand_in.calls().len(), 3);
        assert_eq!(stand_in.calls()[1].region.as_deref(), Some("us-west-2"));
        assert_eq!(
            stand_in.calls()[0].access_key_id.as_deref(),
            Some("AKIDTEST")
        );
    }

    #[test]
    fn the_caller_policy_needs_the_bearer_token_for_ecr_public() {
        let stand_in = EcrStandIn::default();
        let without_bearer = r#"{"Version":"2012-10-17","Statement":[{"Sid":"A","Effect":"Allow",
            "Action":["ecr:GetAuthorizationToken","ecr-public:GetAuthorizationToken"],"Resource":"*"}]}"#;
        stand_in
            .set_caller_policy(Some(without_bearer))
            .expect("policy");
        let denied = stand_in
            .answer(
                &call(SERVICE_ECR_PUBLIC),
                &signed("us-east-1", "ecr-public"),
            )
            .expect("answered");
        let body = json(&denied);
        assert_eq!(body["__type"], "AccessDeniedException");
        assert!(
            body["message"]
                .as_str()
                .expect("text")
                .contains("sts:GetServiceBearerToken")
        );
        // ECR itself needs no bearer token: forwarded to moto.
        assert!(
            stand_in
                .answer(&call(SERVICE_ECR), &signed("us-west-2", "ecr"))
                .is_none()
        );
        stand_in
            .set_caller_policy(Some(r#"{"Version":"2012-10-17","Statement":[]}"#))
            .expect("policy");
        let denied = stand_in
            .answer(&call(SERVICE_ECR), &signed("us-west-2", "ecr"))
            .expect("answered");
        assert!(
            json(&denied)["message"]
                .as_str()
                .expect("text")
                .contains("ecr:GetAuthorizationToken")
        );
    }

    #[test]
    fn answers_can_be_replaced_and_others_are_forwarded() {
        let stand_in = EcrStandIn::default();
        stand_in.set_answer(SERVICE_ECR, Some(r#"{"authorizationData":[]}"#));
        let replaced = stand_in
            .answer(&call(SERVICE_ECR), &signed("us-west-2", "ecr"))
            .expect("answered");
        assert_eq!(json(&replaced)["authorizationData"], serde_json::json!([]));
        stand_in.set_answer(SERVICE_ECR, None);
        assert!(
            stand_in
                .answer(&call(SERVICE_ECR), &signed("us-west-2", "ecr"))
                .is_none()
        );
        let mut other = call(SERVICE_ECR);
        other.action = "DescribeRepositories".into();
        assert!(
            stand_in
                .answer(&other, &signed("us-west-2", "ecr"))
                .is_none()
        );
    }
}
