//! ELBv2's listener attributes on an NLB, which moto 5.2.5 takes leniently:
//! its `ModifyListenerAttributes` stores any key and any value on any
//! listener. As ELBv2 does (`ListenerAttribute`, and the Network Load
//! Balancer guide's "Update the TCP idle timeout"), an NLB listener takes
//! `tcp.idle_timeout.seconds` only, a whole number of seconds from 60 to
//! 6000, and only on a TCP listener (a TLS listener's idle timeout is fixed
//! at 350 s, a UDP listener has none to set); anything else is refused with
//! `InvalidConfigurationRequest` (the messages' wording is ours). Other
//! calls, and what moto stores and answers, are moto's.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{first, param};
use super::throttle::SERVICE_ELBV2;

/// The one attribute an NLB listener takes.
const IDLE_TIMEOUT: &str = "tcp.idle_timeout.seconds";

/// The request's `Attributes` members, in order, as (key, value).
fn asked(params: &[(String, String)]) -> Vec<(&str, &str)> {
    (1..)
        .map_while(|i| {
            let key = param(params, &format!("Attributes.member.{i}.Key"))?;
            let value = param(params, &format!("Attributes.member.{i}.Value")).unwrap_or("");
            Some((key, value))
        })
        .collect()
}

/// What AWS answers for `attributes` on a listener of `protocol`, if it
/// refuses.
fn refusal(attributes: &[(&str, &str)], protocol: &str) -> Option<AwsError> {
    let invalid =
        |message: String| Some(AwsError::new(400, "InvalidConfigurationRequest", message));
    if attributes.is_empty() {
        return invalid("Attributes must contain at least one attribute".into());
    }
    for (key, value) in attributes {
        if *key != IDLE_TIMEOUT {
            return invalid(format!("Listener attribute key '{key}' is not recognized"));
        }
        if !value.parse::<u32>().is_ok_and(|s| (60..=6000).contains(&s)) {
            return invalid(format!(
                "Listener attribute '{key}' must be an integer from 60 to 6000, not '{value}'"
            ));
        }
    }
    (protocol != "TCP").then(|| {
        AwsError::new(
            400,
            "InvalidConfigurationRequest",
            format!(
                "Listener attribute '{IDLE_TIMEOUT}' is not supported on a {protocol} listener"
            ),
        )
    })
}

/// AWS's refusal of a `ModifyListenerAttributes`; a listener moto does not
/// know is left to moto (its `ListenerNotFound`).
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    if service != SERVICE_ELBV2 || action != "ModifyListenerAttributes" {
        return None;
    }
    let listener = super::alpn::listener(state, headers, param(params, "ListenerArn")?).await?;
    refusal(&asked(params), &first(&listener, "Protocol")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_nlb_listener_takes_the_tcp_idle_timeout_alone_on_tcp() {
        assert!(refusal(&[(IDLE_TIMEOUT, "400")], "TCP").is_none());
        assert!(refusal(&[(IDLE_TIMEOUT, "60")], "TCP").is_none());
        assert!(refusal(&[(IDLE_TIMEOUT, "6000")], "TCP").is_none());
        for (attrs, protocol) in [
            (&[(IDLE_TIMEOUT, "59")][..], "TCP"),
            (&[(IDLE_TIMEOUT, "6001")][..], "TCP"),
            (&[(IDLE_TIMEOUT, "4m")][..], "TCP"),
            (
                &[("routing.http.response.server.enabled", "false")][..],
                "TCP",
            ),
            (&[(IDLE_TIMEOUT, "400")][..], "TLS"),
            (&[(IDLE_TIMEOUT, "400")][..], "UDP"),
            (&[][..], "TCP"),
        ] {
            let e = refusal(attrs, protocol).expect("refused");
            assert_eq!(
                e.code, "InvalidConfigurationRequest",
                "{attrs:?} {protocol}"
            );
        }
    }
}
