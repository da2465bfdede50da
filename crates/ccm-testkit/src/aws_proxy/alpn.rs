//! ELBv2's ALPN policy on an NLB's listeners, which moto 5.2.5 gets wrong:
//! its `CreateListener` stores any `AlpnPolicy` on any listener, and its
//! `ModifyListener` refuses `Protocol=TLS` ("Protocol TLS is not
//! supported") and drops `AlpnPolicy` unread. As ELBv2 does:
//!
//! - a policy not among AWS's names (`HTTP1Only`, `HTTP2Only`,
//!   `HTTP2Optional`, `HTTP2Preferred`, `None`) gets `ALPNPolicyNotFound`;
//!   more than one, or one on a listener that is not TLS (after the call),
//!   gets `ValidationError` (AWS takes "one policy name", "[TLS listeners]"
//!   only; the messages' wording is ours);
//! - a `ModifyListener` of a TLS listener is taken: moto is sent the call
//!   without `Protocol=TLS` (the listener's protocol already) and without
//!   the policy, which the proxy keeps and shows in the `ModifyListener` and
//!   `DescribeListeners` answers. A listener the call takes off TLS loses
//!   its policy (as its certificate and security policy). A TCP listener
//!   made TLS in place is still moto's refusal: a gap, not AWS's answer.
//!
//! The proxy reads the listener from moto itself (not counted, faulted or
//! recorded); a listener moto does not know is left to moto.

use std::collections::HashMap;
use std::sync::LazyLock;

use http::HeaderMap;
use parking_lot::Mutex;

use super::errors::AwsError;
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_ELBV2;
use super::{AwsCall, ProxyBody, State};

/// AWS's ALPN policy names.
const NAMES: [&str; 5] = [
    "HTTP1Only",
    "HTTP2Only",
    "HTTP2Optional",
    "HTTP2Preferred",
    "None",
];

/// The policies `ModifyListener` set, by upstream (moto's address) and
/// listener ARN (`None`: the listener left TLS and lost its policy). They
/// belong to the upstream, not to one proxy: every proxy in front of the
/// same moto shows them.
static SET: LazyLock<Mutex<Policies>> = LazyLock::new(Mutex::default);

type Policies = HashMap<(String, String), Option<String>>;

/// The policies set on `state`'s upstream, by listener ARN.
fn policies_of(state: &State) -> HashMap<String, Option<String>> {
    let upstream = state.upstream_authority.to_string();
    SET.lock()
        .iter()
        .filter(|((u, _), _)| *u == upstream)
        .map(|((_, arn), p)| (arn.clone(), p.clone()))
        .collect()
}

/// The request's `AlpnPolicy` members, in order.
fn asked(params: &[(String, String)]) -> Vec<&str> {
    (1..)
        .map_while(|i| param(params, &format!("AlpnPolicy.member.{i}")))
        .collect()
}

/// What AWS answers for `policies` on a listener whose protocol after the
/// call is `protocol`, if it refuses.
fn refusal(policies: &[&str], protocol: &str) -> Option<AwsError> {
    let [policy] = policies else {
        return (!policies.is_empty()).then(|| {
            AwsError::new(
                400,
                "ValidationError",
                "You can specify one ALPN policy name".to_string(),
            )
        });
    };
    if !NAMES.contains(policy) {
        return Some(AwsError::new(
            400,
            "ALPNPolicyNotFound",
            format!("ALPN policy '{policy}' not found"),
        ));
    }
    (protocol != "TLS").then(|| {
        AwsError::new(
            400,
            "ValidationError",
            format!(
                "An ALPN policy can only be set on a TLS listener, not on a {protocol} listener"
            ),
        )
    })
}

/// Listener `arn` as moto holds it (its `member` element).
pub(super) async fn listener(state: &State, headers: &HeaderMap, arn: &str) -> Option<String> {
    let xml = Upstream::for_call(state, headers, SERVICE_ELBV2)
        .ask(format!(
            "Action=DescribeListeners&Version=2015-12-01&ListenerArns.member.1={}",
            form_escape(arn)
        ))
        .await?;
    elements(&xml, "Listeners")
        .into_iter()
        .flat_map(|l| elements(l, "member"))
        .next()
        .map(str::to_string)
}

/// AWS's refusal of a `CreateListener`/`ModifyListener` ALPN policy.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    if service != SERVICE_ELBV2 {
        return None;
    }
    let policies = asked(params);
    if policies.is_empty() {
        return None;
    }
    match action {
        "CreateListener" => refusal(&policies, param(params, "Protocol")?),
        "ModifyListener" => {
            let protocol = match param(params, "Protocol") {
                Some(p) => p.to_string(),
                None => {
                    let l = listener(state, headers, param(params, "ListenerArn")?).await?;
                    first(&l, "Protocol")?
                }
            };
            refusal(&policies, &protocol)
        }
        _ => None,
    }
}

/// Whether the proxy answers `call` itself ([`answer`]).
pub(super) fn answers(state: &State, call: &AwsCall) -> bool {
    call.service == SERVICE_ELBV2
        && (call.action == "ModifyListener"
            || call.action == "DescribeListeners" && !policies_of(state).is_empty())
}

/// `ModifyListener` or `DescribeListeners` as ELBv2 answers it (see the
/// module's notes), moto doing the rest.
pub(super) async fn answer(
    state: &State,
    mut parts: http::request::Parts,
    body: bytes::Bytes,
    call: &AwsCall,
    params: &[(String, String)],
) -> http::Response<ProxyBody> {
    let mut body = body;
    let mut set = None;
    if call.action == "ModifyListener"
        && let Some(arn) = param(params, "ListenerArn")
        && let Some(l) = listener(state, &parts.headers, arn).await
    {
        let now = first(&l, "Protocol").unwrap_or_default();
        let after = param(params, "Protocol").unwrap_or(&now).to_string();
        let policy = asked(params).first().map(|p| p.to_string());
        let kept: Vec<String> = params
            .iter()
            .filter(|(k, v)| {
                let tls_already = k == "Protocol" && v == "TLS" && now == "TLS";
                !k.starts_with("AlpnPolicy.") && !tls_already
            })
            .map(|(k, v)| format!("{}={}", form_escape(k), form_escape(v)))
            .collect();
        let version = call.version.as_deref().unwrap_or("2015-12-01");
        body = bytes::Bytes::from(format!(
            "Action=ModifyListener&Version={}&{}",
            form_escape(version),
            kept.join("&")
        ));
        parts.headers.remove(http::header::CONTENT_LENGTH);
        set = match (policy, after == "TLS") {
            (Some(p), true) => Some((arn.to_string(), Some(p))),
            (_, false) => Some((arn.to_string(), None)),
            (None, true) => None,
        };
    }
    let answer = super::forward(state, parts, body).await;
    if !answer.status().is_success() {
        return answer;
    }
    if let Some((arn, policy)) = set {
        let upstream = state.upstream_authority.to_string();
        SET.lock().insert((upstream, arn), policy);
    }
    let (parts, body) = answer.into_parts();
    let Ok(bytes) = http_body_util::BodyExt::collect(body).await else {
        return super::plain_response(
            http::StatusCode::BAD_GATEWAY,
            "aws-fault-proxy lost the upstream's answer".to_string(),
        );
    };
    let text = String::from_utf8_lossy(&bytes.to_bytes()).into_owned();
    let shown = with_policies(&text, &policies_of(state));
    let mut response = super::xml_response(shown);
    *response.status_mut() = parts.status;
    response
}

/// `xml` (a listeners answer) with each listener in `policies` showing
/// its policy there instead of moto's.
fn with_policies(xml: &str, policies: &HashMap<String, Option<String>>) -> String {
    const START: &str = "<member><ListenerArn>";
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    while let Some(at) = rest.find(START) {
        out.push_str(&rest[..at]);
        let after = &rest[at + START.len()..];
        let end = after.find(START).map_or(after.len(), |n| n);
        let chunk = &rest[at..at + START.len() + end];
        let arn = after.split('<').next().unwrap_or_default();
        out.push_str(&match policies.get(arn) {
            Some(policy) => replace_policy(chunk, policy.as_deref()),
            None => chunk.to_string(),
        });
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// One listener's `chunk` with its `AlpnPolicy` element as `policy`.
fn replace_policy(chunk: &str, policy: Option<&str>) -> String {
    let element = match policy {
        Some(p) => format!("<AlpnPolicy><member>{p}</member></AlpnPolicy>"),
        None => "<AlpnPolicy/>".to_string(),
    };
    let span = chunk
        .find("<AlpnPolicy/>")
        .map(|s| (s, s + 13))
        .or_else(|| {
            let s = chunk.find("<AlpnPolicy>")?;
            let e = chunk[s..].find("</AlpnPolicy>")? + s + "</AlpnPolicy>".len();
            Some((s, e))
        });
    match span {
        Some((s, e)) => format!("{}{element}{}", &chunk[..s], &chunk[e..]),
        // None shown: after the ARN (order does not matter to a reader).
        None => {
            let e = chunk
                .find("</ListenerArn>")
                .map_or(0, |n| n + "</ListenerArn>".len());
            format!("{}{element}{}", &chunk[..e], &chunk[e..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_held_to_aws_names_one_per_tls_listener() {
        assert!(refusal(&["HTTP2Preferred"], "TLS").is_none());
        assert!(refusal(&["None"], "TLS").is_none());
        assert!(refusal(&[], "TCP").is_none(), "no policy asked");
        let e = refusal(&["h2"], "TLS").expect("an unknown name");
        assert_eq!(e.code, "ALPNPolicyNotFound");
        let e = refusal(&["HTTP1Only"], "TCP").expect("not a TLS listener");
        assert_eq!(e.code, "ValidationError");
        let e = refusal(&["HTTP1Only", "HTTP2Only"], "TLS").expect("two");
        assert_eq!(e.code, "ValidationError");
    }

    #[test]
    fn the_policies_set_are_shown_in_a_listeners_answer() {
        let xml = "<Listeners><member><ListenerArn>a</ListenerArn><Port>443</Port><Certificates><member><CertificateArn>c</CertificateArn></member></Certificates><AlpnPolicy><member>HTTP2Preferred</member></AlpnPolicy></member><member><ListenerArn>b</ListenerArn><AlpnPolicy/></member><member><ListenerArn>d</ListenerArn></member></Listeners>";
        let policies = HashMap::from([
            ("a".to_string(), Some("HTTP1Only".to_string())),
            ("b".to_string(), None),
            ("d".to_string(), Some("None".to_string())),
        ]);
        assert_eq!(
            with_policies(xml, &policies),
            "<Listeners><member><ListenerArn>a</ListenerArn><Port>443</Port><Certificates><member><CertificateArn>c</CertificateArn></member></Certificates><AlpnPolicy><member>HTTP1Only</member></AlpnPolicy></member><member><ListenerArn>b</ListenerArn><AlpnPolicy/></member><member><ListenerArn>d</ListenerArn><AlpnPolicy><member>None</member></AlpnPolicy></member></Listeners>"
        );
        assert_eq!(with_policies(xml, &HashMap::new()), xml);
    }
}
