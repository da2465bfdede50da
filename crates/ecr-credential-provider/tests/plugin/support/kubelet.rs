//! The kubelet's side of the protocol, written from the field names and
//! types of `k8s.io/kubelet/pkg/apis/credentialprovider/v1` (types.go),
//! independent of the plugin's own types so a drift shows:
//!
//! - `CredentialProviderResponse`: `kind`, `apiVersion` (TypeMeta),
//!   `cacheKeyType` (`PluginCacheKeyType`: "Image", "Registry" or
//!   "Global"; required), `cacheDuration` (`*metav1.Duration`, a Go
//!   duration string, omitempty), `auth` (`map[string]AuthConfig`, omitempty);
//! - `AuthConfig`: `username`, `password` (strings).
//!
//! Stricter than the kubelet's decoder, which ignores unknown fields: any
//! field the schema does not have is an error here.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialProviderResponse {
    pub kind: String,
    #[serde(rename = "apiVersion")]
    pub api_version: String,
    #[serde(rename = "cacheKeyType")]
    pub cache_key_type: PluginCacheKeyType,
    #[serde(rename = "cacheDuration", default)]
    pub cache_duration: Option<String>,
    #[serde(default)]
    pub auth: BTreeMap<String, AuthConfig>,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
pub enum PluginCacheKeyType {
    Image,
    Registry,
    Global,
}

#[derive(Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub username: String,
    pub password: String,
}

impl CredentialProviderResponse {
    /// `cacheDuration` as the kubelet reads it (Go's `time.ParseDuration`).
    pub fn cache_duration(&self) -> Option<Duration> {
        self.cache_duration.as_deref().map(|text| {
            parse_go_duration(text)
                .unwrap_or_else(|| panic!("cacheDuration {text:?} is not a Go duration"))
        })
    }
}

/// Decodes a response and checks what the kubelet checks: the kind, a
/// known apiVersion.
pub fn parse_response(json: &str) -> Result<CredentialProviderResponse, String> {
    let response: CredentialProviderResponse =
        serde_json::from_str(json).map_err(|e| e.to_string())?;
    if response.kind != "CredentialProviderResponse" {
        return Err(format!("kind is {:?}", response.kind));
    }
    let known = [super::V1, super::V1BETA1, super::V1ALPHA1];
    if !known.contains(&response.api_version.as_str()) {
        return Err(format!("apiVersion is {:?}", response.api_version));
    }
    if let Some(text) = &response.cache_duration
        && parse_go_duration(text).is_none()
    {
        return Err(format!("cacheDuration {text:?} is not a Go duration"));
    }
    Ok(response)
}

/// Go's `time.ParseDuration` for non-negative durations: `0`, or numbers
/// each followed by a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g.
/// `6h0m0s`, `1.5s`.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    if text == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|end| *end > 0)?;
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_end..];
    }
    Some(Duration::from_secs_f64(total))
}
