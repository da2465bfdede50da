//! One request, one answer: which registry, which credentials, which token.

use crate::aws::{self, AwsError, Limits, RawToken};
use crate::log::Log;
use crate::protocol::{Request, Response};
use crate::registry::{Registry, RegistryError, registry_of};
use crate::token::{TokenError, cache_seconds, split_token};

/// What the command line chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub limits: Limits,
    /// Answer non-ECR hosts with the default region's token, as upstream
    /// does (the default); `--non-ecr-hosts=refuse` turns it off.
    pub mirrors: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            limits: Limits::default(),
            mirrors: true,
        }
    }
}

/// The service account annotation naming the role to pull as (upstream's).
pub const ROLE_ANNOTATION: &str = "eks.amazonaws.com/ecr-role-arn";

/// The environment variable naming that role when the annotation is absent.
pub const ROLE_ENV: &str = "AWS_ECR_ROLE_ARN";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Aws(#[from] AwsError),
    #[error("image {image:?}: {source}")]
    Token { image: String, source: TokenError },
}

/// The role to assume for this request, as upstream chooses it: only with a
/// service account token; the service account's annotation when present
/// (even empty), else `AWS_ECR_ROLE_ARN`; an empty ARN means none.
pub fn role_to_assume(request: &Request, env_role: Option<&str>) -> Option<String> {
    request.service_account_token.as_ref()?;
    let role = match request.service_account_annotations.get(ROLE_ANNOTATION) {
        Some(annotated) => annotated.as_str(),
        None => env_role.unwrap_or_default(),
    };
    (!role.is_empty()).then(|| role.to_owned())
}

/// The kubelet's answer to `request`.
pub async fn answer(
    request: &Request,
    options: &Options,
    env_role: Option<&str>,
    log: &Log,
) -> Result<Response, PluginError> {
    let registry = registry_of(&request.image, options.mirrors)?;
    describe(&registry, &request.image, log);
    let config = aws::sdk_config(&registry, &options.limits).await?;
    let credentials = match (
        role_to_assume(request, env_role),
        &request.service_account_token,
    ) {
        (Some(role), Some(token)) => {
            log.info(
                1,
                &format!("assuming role {role} with the pod's service account token"),
            );
            Some(aws::assume_role(&config, &role, token, *log).await?)
        }
        (None, Some(_)) => {
            log.info(
                1,
                &format!(
                    "a service account token came without a role ({ROLE_ANNOTATION} annotation or {ROLE_ENV}): using the node's credentials"
                ),
            );
            None
        }
        _ => None,
    };
    let raw = aws::get_token(&config, &registry, credentials, *log).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    to_response(request, &registry, raw, now).map_err(|source| PluginError::Token {
        image: request.image.clone(),
        source,
    })
}

fn describe(registry: &Registry, image: &str, log: &Log) {
    let what = match registry {
        Registry::Private {
            account,
            region,
            partition,
            ..
        } => {
            format!("private ECR registry of account {account} in {region} (partition {partition})")
        }
        Registry::Public { .. } => "ECR Public (API in us-east-1)".to_owned(),
        Registry::Mirror { .. } => {
            "not an ECR host: answered with the default region's private ECR token, as upstream (--non-ecr-hosts=refuse refuses it)".to_owned()
        }
    };
    log.info(1, &format!("image {image:?}: {what}"));
}

/// The response for a token AWS answered; every flaw in it is an error.
fn to_response(
    request: &Request,
    registry: &Registry,
    raw: RawToken,
    now_unix: i64,
) -> Result<Response, TokenError> {
    let api = raw.api;
    let data = raw.data.ok_or(TokenError::NoData { api })?;
    let token = data.token.ok_or(TokenError::NoToken { api })?;
    let (username, password) = split_token(api, token.expose())?;
    Ok(Response::for_registry(
        request.api_version,
        registry.host(),
        username,
        password,
        cache_seconds(data.expires_at_unix, now_unix),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::RawData;
    use crate::protocol::parse_request;
    use crate::secret::Secret;

    fn request(extra: &str) -> Request {
        let text = format!(
            r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"123456789012.dkr.ecr.us-west-2.amazonaws.com/a"{extra}}}"#
        );
        parse_request(text.as_bytes()).expect("valid request")
    }

    /// Upstream's service-account cases: token + annotation assumes; token
    /// without an ARN does not; no token never does.
    #[test]
    fn the_role_comes_from_the_annotation_then_the_environment() {
        let annotated = request(
            r#","serviceAccountToken":"t","serviceAccountAnnotations":{"eks.amazonaws.com/ecr-role-arn":"arn:a"}"#,
        );
        assert_eq!(
            role_to_assume(&annotated, Some("arn:env")).as_deref(),
            Some("arn:a")
        );
        let token_only = request(r#","serviceAccountToken":"t""#);
        assert_eq!(
            role_to_assume(&token_only, Some("arn:env")).as_deref(),
            Some("arn:env")
        );
        assert_eq!(role_to_assume(&token_only, None), None);
        let empty_annotation = request(
            r#","serviceAccountToken":"t","serviceAccountAnnotations":{"eks.amazonaws.com/ecr-role-arn":""}"#,
        );
        assert_eq!(role_to_assume(&empty_annotation, Some("arn:env")), None);
        assert_eq!(role_to_assume(&request(""), Some("arn:env")), None);
    }

    fn raw(data: Option<(Option<&str>, Option<i64>)>) -> RawToken {
        RawToken {
            api: "ECR",
            data: data.map(|(token, expires)| RawData {
                token: token.map(|t| Secret::new(t.to_owned())),
                expires_at_unix: expires,
            }),
        }
    }

    #[test]
    fn answers_without_a_usable_token_are_errors() {
        let request = request("");
        let registry = registry_of(&request.image, false).expect("ECR");
        let now = 1_700_000_000;
        let cases = [
            (raw(None), TokenError::NoData { api: "ECR" }),
            (
                raw(Some((None, Some(now)))),
                TokenError::NoToken { api: "ECR" },
            ),
            (
                raw(Some((Some("Zm9v"), Some(now)))),
                TokenError::NoSeparator { api: "ECR" },
            ),
        ];
        for (answer, expected) in cases {
            let err = to_response(&request, &registry, answer, now).expect_err("refused");
            assert_eq!(err, expected);
        }
        let ok = to_response(
            &request,
            &registry,
            raw(Some((Some("QVdTOnB3"), Some(now + 7200)))),
            now,
        )
        .expect("valid");
        let json: serde_json::Value = serde_json::from_str(&ok.to_json()).expect("JSON");
        assert_eq!(json["cacheDuration"], "1h0m0s");
        assert_eq!(
            json["auth"]["123456789012.dkr.ecr.us-west-2.amazonaws.com"]["password"],
            "pw"
        );
    }
}
