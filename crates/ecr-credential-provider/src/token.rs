//! From an authorization token to a username, a password and how long the
//! kubelet may cache them.

use crate::secret::Secret;

/// An authorization token AWS answered that cannot be used. Never carries
/// the token itself.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("{api} answered without authorization data")]
    NoData { api: &'static str },
    #[error("{api} answered authorization data without a token")]
    NoToken { api: &'static str },
    #[error("{api} answered a token that is not base64 ({length} characters)")]
    NotBase64 { api: &'static str, length: usize },
    #[error("{api} answered a token that is not UTF-8 text once decoded")]
    NotText { api: &'static str },
    #[error("{api} answered a token that is not \"user:password\" once decoded (no ':')")]
    NoSeparator { api: &'static str },
    #[error("{api} answered a token with an empty {part}")]
    EmptyPart {
        api: &'static str,
        part: &'static str,
    },
}

/// The username and password in an ECR token: base64 of `user:password`.
/// Every flaw is an error: the kubelet never gets half a credential.
pub fn split_token(api: &'static str, token: &str) -> Result<(String, Secret), TokenError> {
    let decoded = aws_smithy_types::base64::decode(token).map_err(|_| TokenError::NotBase64 {
        api,
        length: token.len(),
    })?;
    let text = String::from_utf8(decoded).map_err(|_| TokenError::NotText { api })?;
    let (user, password) = text
        .split_once(':')
        .ok_or(TokenError::NoSeparator { api })?;
    if user.is_empty() {
        return Err(TokenError::EmptyPart {
            api,
            part: "username",
        });
    }
    if password.is_empty() {
        return Err(TokenError::EmptyPart {
            api,
            part: "password",
        });
    }
    Ok((user.to_owned(), Secret::new(password.to_owned())))
}

/// How long the kubelet may cache the credentials, as upstream decides it:
/// - no expiry in the answer: `Some(0)`, i.e. do not cache;
/// - otherwise half the whole seconds left until expiry (truncated, as Go's
///   integer division does), leaving slack for the time the token took to
///   reach the kubelet;
/// - when that is not positive (the expiry is past or under 2 s away,
///   e.g. moto's fixed 2015 expiry or a node clock far ahead): `None`, so
///   the response carries no `cacheDuration` and the kubelet applies its
///   `defaultCacheDuration`. Never a negative duration.
pub fn cache_seconds(expires_at_unix: Option<i64>, now_unix: i64) -> Option<u64> {
    let Some(expires) = expires_at_unix else {
        return Some(0);
    };
    let half = expires.saturating_sub(now_unix) / 2;
    u64::try_from(half).ok().filter(|s| *s > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &str) -> String {
        aws_smithy_types::base64::encode(text)
    }

    #[test]
    fn tokens_split_at_the_first_colon() {
        let (user, password) = split_token("ECR", &b64("AWS:a:b")).expect("valid");
        assert_eq!(user, "AWS");
        assert_eq!(password.expose(), "a:b");
        let (user, password) =
            split_token("ECR", "QVdTOjEyMzQ1Njc4OTAxMi1hdXRoLXRva2Vu").expect("moto's token");
        assert_eq!(
            (user.as_str(), password.expose()),
            ("AWS", "123456789012-auth-token")
        );
    }

    #[test]
    fn flawed_tokens_are_errors() {
        assert_eq!(
            split_token("ECR", "not base64!"),
            Err(TokenError::NotBase64 {
                api: "ECR",
                length: 11
            })
        );
        assert_eq!(
            split_token("ECR", &b64("foo")),
            Err(TokenError::NoSeparator { api: "ECR" })
        );
        assert_eq!(
            split_token("ECR", &b64(":pw")),
            Err(TokenError::EmptyPart {
                api: "ECR",
                part: "username"
            })
        );
        assert_eq!(
            split_token("ECR", &b64("AWS:")),
            Err(TokenError::EmptyPart {
                api: "ECR",
                part: "password"
            })
        );
        assert_eq!(
            split_token(
                "ECR",
                &aws_smithy_types::base64::encode([0xff_u8, b':', 0xfe])
            ),
            Err(TokenError::NotText { api: "ECR" })
        );
    }

    #[test]
    fn errors_never_quote_the_token() {
        let token = b64("secret-no-colon");
        let err = split_token("ECR", &token).expect_err("no colon");
        assert!(!err.to_string().contains(&token));
        assert!(!err.to_string().contains("secret-no-colon"));
    }

    /// Upstream's `Test_getCacheDuration` cases, plus the past expiry.
    #[test]
    fn cache_duration_is_half_the_time_left() {
        let now = 1_700_000_000;
        assert_eq!(cache_seconds(None, now), Some(0));
        assert_eq!(cache_seconds(Some(now + 12 * 3600), now), Some(6 * 3600));
        assert_eq!(cache_seconds(Some(now + 3), now), Some(1));
        assert_eq!(cache_seconds(Some(now + 1), now), None);
        assert_eq!(cache_seconds(Some(now), now), None);
        // moto's token expires 2015-01-01T00:00:00Z.
        assert_eq!(cache_seconds(Some(1_420_070_400), now), None);
        assert_eq!(cache_seconds(Some(i64::MIN), i64::MAX), None);
    }
}
