//! The kubelet's exec credential provider protocol: one
//! `CredentialProviderRequest` as JSON on stdin, one
//! `CredentialProviderResponse` on stdout.
//!
//! The kubelet sends the `apiVersion` named in its `CredentialProviderConfig`
//! (`credentialprovider.kubelet.k8s.io/v1`, or the older `v1beta1` and
//! `v1alpha1`) and decodes the answer with the same version, so the response
//! carries the request's version. The three versions have the same fields
//! for what this plugin answers; `serviceAccountToken` and
//! `serviceAccountAnnotations` (KEP-4412) are only sent by a v1 kubelet
//! configured with `tokenAttributes`, and are read from any version.
//! Unknown fields are ignored, as the kubelet's own (non-strict) decoder does.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::secret::Secret;

/// The API group of the protocol.
const GROUP: &str = "credentialprovider.kubelet.k8s.io";

/// The versions of the protocol this plugin speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1beta1,
    V1alpha1,
}

impl ApiVersion {
    const ALL: [ApiVersion; 3] = [ApiVersion::V1, ApiVersion::V1beta1, ApiVersion::V1alpha1];

    /// `credentialprovider.kubelet.k8s.io/v1` etc.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "credentialprovider.kubelet.k8s.io/v1",
            ApiVersion::V1beta1 => "credentialprovider.kubelet.k8s.io/v1beta1",
            ApiVersion::V1alpha1 => "credentialprovider.kubelet.k8s.io/v1alpha1",
        }
    }

    fn parse(text: &str) -> Option<ApiVersion> {
        ApiVersion::ALL.into_iter().find(|v| v.as_str() == text)
    }
}

/// Why a request cannot be answered.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("the request on stdin is not a JSON object: {0}")]
    NotJson(serde_json::Error),
    #[error(
        "the request's apiVersion is {0:?}; this plugin speaks {GROUP}/v1, v1beta1 and v1alpha1: set providers[].apiVersion in the kubelet's CredentialProviderConfig to one of them"
    )]
    UnsupportedVersion(String),
    #[error("the request's kind is {0:?}, expected \"CredentialProviderRequest\"")]
    WrongKind(String),
    #[error("the request names no image (field \"image\" is missing or empty)")]
    NoImage,
}

/// A `CredentialProviderRequest`, as the kubelet sends it.
#[derive(Debug)]
pub struct Request {
    pub api_version: ApiVersion,
    /// The image being pulled, e.g. `123456789012.dkr.ecr.us-west-2.amazonaws.com/app:v1`.
    pub image: String,
    /// The pod's service account token (KEP-4412), when the kubelet's
    /// `tokenAttributes` ask for one.
    pub service_account_token: Option<Secret>,
    /// The annotations of that service account the kubelet was told to pass.
    pub service_account_annotations: BTreeMap<String, String>,
}

/// The wire form; every field optional so a missing one gets a clear error
/// of ours rather than serde's.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestWire {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    service_account_token: Option<String>,
    #[serde(default)]
    service_account_annotations: Option<BTreeMap<String, String>>,
}

/// Parses and checks the request the kubelet wrote on stdin.
pub fn parse_request(bytes: &[u8]) -> Result<Request, RequestError> {
    let wire: RequestWire = serde_json::from_slice(bytes).map_err(RequestError::NotJson)?;
    let version_text = wire.api_version.unwrap_or_default();
    let api_version =
        ApiVersion::parse(&version_text).ok_or(RequestError::UnsupportedVersion(version_text))?;
    let kind = wire.kind.unwrap_or_default();
    if kind != "CredentialProviderRequest" {
        return Err(RequestError::WrongKind(kind));
    }
    let image = wire
        .image
        .filter(|i| !i.trim().is_empty())
        .ok_or(RequestError::NoImage)?;
    Ok(Request {
        api_version,
        image,
        service_account_token: wire
            .service_account_token
            .filter(|t| !t.is_empty())
            .map(Secret::new),
        service_account_annotations: wire.service_account_annotations.unwrap_or_default(),
    })
}

/// A `CredentialProviderResponse`: fields in the order and form the kubelet's
/// Go types encode them (`cacheDuration` is a Go duration string, omitted
/// when the kubelet's `defaultCacheDuration` should apply).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Response {
    kind: &'static str,
    api_version: &'static str,
    cache_key_type: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_duration: Option<String>,
    auth: BTreeMap<String, AuthConfig>,
}

/// One registry's username and password.
#[derive(Debug, Serialize)]
pub struct AuthConfig {
    username: String,
    password: Secret,
}

impl Response {
    /// Credentials for every image of `registry` (`cacheKeyType: Registry`,
    /// as upstream), cached by the kubelet for `cache_seconds` (`None`: the
    /// kubelet's `defaultCacheDuration`).
    pub fn for_registry(
        version: ApiVersion,
        registry: &str,
        username: String,
        password: Secret,
        cache_seconds: Option<u64>,
    ) -> Response {
        let mut auth = BTreeMap::new();
        auth.insert(registry.to_owned(), AuthConfig { username, password });
        Response {
            kind: "CredentialProviderResponse",
            api_version: version.as_str(),
            cache_key_type: "Registry",
            cache_duration: cache_seconds.map(go_duration),
            auth,
        }
    }

    /// The JSON the kubelet reads.
    pub fn to_json(&self) -> String {
        // Serialising plain strings and maps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Whole seconds as Go's `time.Duration.String()` writes them, which is
/// what `metav1.Duration` parses: `0s`, `45s`, `1m30s`, `6h0m0s`.
pub fn go_duration(seconds: u64) -> String {
    let (hours, minutes, secs) = (seconds / 3600, (seconds / 60) % 60, seconds % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{secs}s")
    } else if minutes > 0 {
        format!("{minutes}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_version_is_read_and_answered_in_kind() {
        for version in ApiVersion::ALL {
            let text = format!(
                r#"{{"apiVersion":"{}","kind":"CredentialProviderRequest","image":"public.ecr.aws/a/b:1"}}"#,
                version.as_str()
            );
            let request = parse_request(text.as_bytes()).expect("valid request");
            assert_eq!(request.api_version, version);
            assert_eq!(request.image, "public.ecr.aws/a/b:1");
            assert!(request.service_account_token.is_none());
            let response = Response::for_registry(
                version,
                "public.ecr.aws",
                "AWS".into(),
                Secret::new("pw".into()),
                Some(60),
            );
            let json: serde_json::Value = serde_json::from_str(&response.to_json()).expect("JSON");
            assert_eq!(json["apiVersion"], version.as_str());
            assert_eq!(json["kind"], "CredentialProviderResponse");
            assert_eq!(json["cacheKeyType"], "Registry");
            assert_eq!(json["cacheDuration"], "1m0s");
            assert_eq!(json["auth"]["public.ecr.aws"]["username"], "AWS");
            assert_eq!(json["auth"]["public.ecr.aws"]["password"], "pw");
        }
    }

    #[test]
    fn service_account_fields_are_read() {
        let text = br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest",
            "image":"x","serviceAccountToken":"tok","serviceAccountAnnotations":{"a":"b"},"extra":1}"#;
        let request = parse_request(text).expect("valid request");
        assert_eq!(
            request.service_account_token.as_ref().map(Secret::expose),
            Some("tok")
        );
        assert_eq!(request.service_account_annotations["a"], "b");
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let cases: [(&[u8], &str); 5] = [
            (b"not json", "not a JSON object"),
            (
                br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v2","kind":"CredentialProviderRequest","image":"x"}"#,
                "v2",
            ),
            (br#"{"kind":"CredentialProviderRequest","image":"x"}"#, "apiVersion is \"\""),
            (
                br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"Pod","image":"x"}"#,
                "kind is \"Pod\"",
            ),
            (
                br#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":" "}"#,
                "names no image",
            ),
        ];
        for (input, expected) in cases {
            let err = parse_request(input).expect_err("must be refused");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    #[test]
    fn durations_are_written_as_go_does() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(45), "45s");
        assert_eq!(go_duration(90), "1m30s");
        assert_eq!(go_duration(3600), "1h0m0s");
        assert_eq!(go_duration(6 * 3600), "6h0m0s");
        assert_eq!(go_duration(43_199), "11h59m59s");
    }

    #[test]
    fn no_cache_duration_means_the_field_is_absent() {
        let response = Response::for_registry(
            ApiVersion::V1,
            "r",
            "AWS".into(),
            Secret::new("p".into()),
            None,
        );
        assert!(!response.to_json().contains("cacheDuration"));
    }
}
