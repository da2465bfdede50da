//! The AWS calls: `GetAuthorizationToken` of ECR or ECR Public, after
//! `AssumeRoleWithWebIdentity` in service-account mode.
//!
//! Every client gets the SDK's standard retry mode with bounded attempts and
//! jittered exponential backoff (throttling codes such as
//! `ThrottlingException`, `TooManyRequestsException`, `Throttling` and
//! 5xx/transport errors are retried; the retry quota stops a storm of
//! retries), a connect timeout, a per-attempt and a whole-operation
//! timeout. Endpoints follow the SDK's standard settings
//! (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_ECR`, `AWS_ENDPOINT_URL_ECR_PUBLIC`,
//! `AWS_ENDPOINT_URL_STS`, `AWS_USE_FIPS_ENDPOINT`, …).
//!
//! Errors are rendered from their `Display` chain only, never their `Debug`
//! form: the SDK's `Debug` of a response error holds the raw HTTP answer,
//! whose body may be a token. One exception, [`non_json_answer`]: an error
//! answer whose body is not JSON (a proxy's HTML page for a 503) leaves the
//! SDK saying only "unexpected token", so the line names the operation, the
//! HTTP status and the start of that body instead; a body is shown only for
//! an error status, never for a 2xx answer.

use std::error::Error as StdError;
use std::time::{Duration, SystemTime};

use aws_config::BehaviorVersion;
use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_credential_types::Credentials;
use aws_smithy_runtime_api::http::Response as HttpResponse;
use aws_types::SdkConfig;
use aws_types::app_name::AppName;
use aws_types::region::Region;

use crate::attempts::AttemptLog;
use crate::log::Log;
use crate::registry::Registry;
use crate::secret::Secret;

/// The session name upstream gives the assumed role (visible in CloudTrail).
const SESSION_NAME: &str = "ecr-credential-provider";

/// Retry and timeout bounds of every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub connect_timeout: Duration,
    pub attempt_timeout: Duration,
    pub operation_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            attempt_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(30),
        }
    }
}

/// A token as AWS answered it, before it is checked.
pub struct RawToken {
    pub api: &'static str,
    /// `None` when the answer had no authorization data at all.
    pub data: Option<RawData>,
}

pub struct RawData {
    pub token: Option<Secret>,
    pub expires_at_unix: Option<i64>,
}

/// A failed AWS call, described without secrets.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    #[error("{api} GetAuthorizationToken in {region} failed: {detail}")]
    Token {
        api: &'static str,
        region: String,
        detail: String,
    },
    #[error(
        "AssumeRoleWithWebIdentity of role {role_arn} with the pod's service account token failed: {detail}"
    )]
    AssumeRole { role_arn: String, detail: String },
    #[error(
        "registry host {host:?} names no region and the SDK found no default one: set AWS_REGION in the provider's env in the kubelet's CredentialProviderConfig"
    )]
    NoRegion { host: String },
    #[error("AssumeRoleWithWebIdentity of role {role_arn} answered no credentials")]
    NoRoleCredentials { role_arn: String },
}

/// The SDK configuration for calls about `registry`.
pub async fn sdk_config(registry: &Registry, limits: &Limits) -> Result<SdkConfig, AwsError> {
    let retry = RetryConfig::standard()
        .with_max_attempts(limits.max_attempts)
        .with_initial_backoff(limits.initial_backoff)
        .with_max_backoff(limits.max_backoff);
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(limits.connect_timeout)
        .operation_attempt_timeout(limits.attempt_timeout)
        .operation_timeout(limits.operation_timeout)
        .build();
    // `app/ecr-credential-provider` in the user agent: CloudTrail tells the
    // plugin's calls from the node's other callers.
    let mut loader = aws_config::defaults(BehaviorVersion::latest())
        .retry_config(retry)
        .timeout_config(timeouts);
    if let Ok(app) = AppName::new("ecr-credential-provider") {
        loader = loader.app_name(app);
    }
    if let Some(region) = registry.api_region() {
        loader = loader.region(Region::new(region.to_owned()));
    }
    let config = loader.load().await;
    match config.region() {
        Some(_) => Ok(config),
        None => Err(AwsError::NoRegion {
            host: registry.host().to_owned(),
        }),
    }
}

/// Credentials of `role_arn`, assumed with the pod's service account token
/// (STS in the registry's API region; the call itself is unsigned).
pub async fn assume_role(
    config: &SdkConfig,
    role_arn: &str,
    token: &Secret,
    log: Log,
) -> Result<Credentials, AwsError> {
    let sts_config = aws_sdk_sts::config::Builder::from(config)
        .interceptor(AttemptLog::new("STS AssumeRoleWithWebIdentity", log))
        .build();
    let sts = aws_sdk_sts::Client::from_conf(sts_config);
    let output = sts
        .assume_role_with_web_identity()
        .role_arn(role_arn)
        .role_session_name(SESSION_NAME)
        .web_identity_token(token.expose())
        .send()
        .await
        .map_err(|e| AwsError::AssumeRole {
            role_arn: role_arn.to_owned(),
            detail: error_chain(&e),
        })?;
    let credentials = output
        .credentials()
        .filter(|c| !c.access_key_id().is_empty() && !c.secret_access_key().is_empty())
        .ok_or_else(|| AwsError::NoRoleCredentials {
            role_arn: role_arn.to_owned(),
        })?;
    let expiry = SystemTime::try_from(*credentials.expiration()).ok();
    Ok(Credentials::new(
        credentials.access_key_id(),
        credentials.secret_access_key(),
        Some(credentials.session_token().to_owned()),
        expiry,
        "AssumeRoleWithWebIdentity",
    ))
}

/// `GetAuthorizationToken` of the registry's API, with `credentials` when
/// given (service-account mode), else the SDK's default chain.
pub async fn get_token(
    config: &SdkConfig,
    registry: &Registry,
    credentials: Option<Credentials>,
    log: Log,
) -> Result<RawToken, AwsError> {
    let region = config.region().map(ToString::to_string).unwrap_or_default();
    let failed =
        |api: &'static str, operation: &str, e: &dyn StdError, raw: Option<&HttpResponse>| {
            AwsError::Token {
                api,
                region: region.clone(),
                detail: raw
                    .and_then(|raw| non_json_answer(operation, raw))
                    .unwrap_or_else(|| error_chain(e)),
            }
        };
    match registry {
        Registry::Private { .. } | Registry::Mirror { .. } => {
            let mut builder = aws_sdk_ecr::config::Builder::from(config)
                .interceptor(AttemptLog::new("ECR GetAuthorizationToken", log));
            if let Some(credentials) = credentials {
                builder = builder.credentials_provider(credentials);
            }
            let client = aws_sdk_ecr::Client::from_conf(builder.build());
            let output =
                client.get_authorization_token().send().await.map_err(|e| {
                    failed("ECR", "ecr:GetAuthorizationToken", &e, e.raw_response())
                })?;
            Ok(RawToken {
                api: "ECR",
                data: output.authorization_data().first().map(|d| RawData {
                    token: d.authorization_token().map(|t| Secret::new(t.to_owned())),
                    expires_at_unix: d.expires_at().map(|t| t.secs()),
                }),
            })
        }
        Registry::Public { .. } => {
            let mut builder = aws_sdk_ecrpublic::config::Builder::from(config)
                .interceptor(AttemptLog::new("ECR Public GetAuthorizationToken", log));
            if let Some(credentials) = credentials {
                builder = builder.credentials_provider(credentials);
            }
            let client = aws_sdk_ecrpublic::Client::from_conf(builder.build());
            let output = client.get_authorization_token().send().await.map_err(|e| {
                let raw = e.raw_response();
                failed("ECR Public", "ecr-public:GetAuthorizationToken", &e, raw)
            })?;
            Ok(RawToken {
                api: "ECR Public",
                data: output.authorization_data().map(|d| RawData {
                    token: d.authorization_token().map(|t| Secret::new(t.to_owned())),
                    expires_at_unix: d.expires_at().map(|t| t.secs()),
                }),
            })
        }
    }
}

/// Characters of a non-JSON body shown: enough for a proxy page's title.
const BODY_EXCERPT: usize = 200;

/// `operation answered HTTP <status> with a non-JSON body: <excerpt>` when
/// `raw` is such an answer; `None` for a JSON body, which the SDK's error
/// already describes.
pub fn non_json_answer(operation: &str, raw: &HttpResponse) -> Option<String> {
    let body = raw.body().bytes()?;
    if serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok() {
        return None;
    }
    let status = raw.status().as_u16();
    let told = format!("{operation} answered HTTP {status} with a non-JSON body");
    // A 2xx body might be the token itself, in a form not understood.
    if status < 400 {
        return Some(told);
    }
    Some(format!("{told}: {}", excerpt(body)))
}

/// The start of `body` on one line: UTF-8 decoded lossily, whitespace and
/// control characters collapsed to single spaces, cut at a character
/// boundary after [`BODY_EXCERPT`] characters ("…" when cut).
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let words: Vec<&str> = (text.split(|c: char| c.is_whitespace() || c.is_control()))
        .filter(|w| !w.is_empty())
        .collect();
    let one_line = words.join(" ");
    if one_line.is_empty() {
        return "(empty)".to_owned();
    }
    match one_line.char_indices().nth(BODY_EXCERPT) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

/// An error and its sources, by `Display` only, repeats dropped.
pub fn error_chain(error: &dyn StdError) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_types::body::SdkBody;

    fn answer(status: u16, body: &str) -> HttpResponse {
        let status = aws_smithy_runtime_api::http::StatusCode::try_from(status).expect("status");
        HttpResponse::new(status, SdkBody::from(body.to_owned()))
    }

    #[test]
    fn a_non_json_error_answer_names_operation_status_and_body() {
        let page =
            "<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head>\n</html>";
        let told = non_json_answer("ecr:GetAuthorizationToken", &answer(503, page)).expect("told");
        assert_eq!(
            told,
            "ecr:GetAuthorizationToken answered HTTP 503 with a non-JSON body: \
             <!DOCTYPE html> <html><head><title>503 Service Unavailable</title></head> </html>"
        );
        let json = r#"{"__type":"ServerException","message":"x"}"#;
        assert_eq!(
            non_json_answer("ecr:GetAuthorizationToken", &answer(500, json)),
            None
        );
        assert_eq!(
            non_json_answer("ecr:GetAuthorizationToken", &answer(502, "")).as_deref(),
            Some("ecr:GetAuthorizationToken answered HTTP 502 with a non-JSON body: (empty)")
        );
        // A 2xx answer's body is never shown: it may hold a token.
        assert_eq!(
            non_json_answer(
                "ecr:GetAuthorizationToken",
                &answer(200, "QVdTOnNlY3JldA==")
            )
            .as_deref(),
            Some("ecr:GetAuthorizationToken answered HTTP 200 with a non-JSON body")
        );
    }

    #[test]
    fn a_long_body_is_cut_at_a_character_boundary() {
        let long = "é".repeat(BODY_EXCERPT + 50);
        let told = excerpt(long.as_bytes());
        assert_eq!(told.chars().count(), BODY_EXCERPT + 1);
        assert!(told.ends_with('…'));
        assert_eq!(excerpt(&[0xff, b'a', b'\r', b'\n', b'b']), "\u{fffd}a b");
    }
}
