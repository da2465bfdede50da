//! Recognising which AWS service and action an HTTP request is.
//!
//! The SDK crates this project uses all speak query protocols: EC2 uses
//! `ec2Query`; ELB, ELBv2 and STS use `awsQuery`. Both send a form-encoded
//! body `Action=...&Version=...&<params>` with a SigV4 `Authorization` header
//! whose credential scope names the signing service. JSON protocols
//! (`awsJson1_0`/`awsJson1_1`, e.g. ACM) name the operation in `X-Amz-Target`
//! instead; they are recognised too so the proxy can count and fault them.

use http::HeaderMap;

use super::throttle::{SERVICE_EC2, SERVICE_ELB, SERVICE_ELBV2, SERVICE_STS};

/// The wire protocol of a call, which decides the shape of error bodies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// EC2's query protocol: errors are `<Response><Errors><Error>…`.
    Ec2Query,
    /// The AWS query protocol (ELB, ELBv2, STS): errors are
    /// `<ErrorResponse><Error>…`.
    AwsQuery,
    /// AWS JSON 1.0/1.1: errors are `{"__type": …}`.
    AwsJson,
}

/// An AWS API call as the proxy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsCall {
    /// "ec2", "elasticloadbalancing" (classic), "elasticloadbalancingv2", "sts", …
    pub service: String,
    /// The operation name, e.g. "DescribeInstances".
    pub action: String,
    /// The API version sent (`Version` parameter), if any.
    pub version: Option<String>,
    /// Names of the other query parameters, in order (values are not kept:
    /// only their presence matters for throttling).
    pub param_names: Vec<String>,
    /// How errors for this call must be encoded.
    pub protocol: Protocol,
}

/// Works out the AWS call a request carries, from its headers, its URL query
/// and its (form-encoded) body. `None` when nothing names an action, e.g. a
/// request for moto's own API.
pub fn identify(headers: &HeaderMap, query: Option<&str>, body: &[u8]) -> Option<AwsCall> {
    let scope_service = signing_service(headers);

    if let Some(target) = headers
        .get("x-amz-target")
        .and_then(|value| value.to_str().ok())
    {
        // "CertificateManager.DescribeCertificate" or "Foo_20180101.Bar".
        let action = target.rsplit('.').next().unwrap_or(target).to_owned();
        let service = scope_service
            .unwrap_or_else(|| target.split('.').next().unwrap_or("").to_ascii_lowercase());
        return Some(AwsCall {
            service,
            action,
            version: None,
            param_names: Vec::new(),
            protocol: Protocol::AwsJson,
        });
    }

    let mut action = None;
    let mut version = None;
    let mut param_names = Vec::new();
    let body_text = std::str::from_utf8(body).ok();
    for source in [query, body_text].into_iter().flatten() {
        for (name, value) in form_pairs(source) {
            match name.as_str() {
                "Action" => action = Some(value),
                "Version" => version = Some(value),
                _ => param_names.push(name),
            }
        }
    }
    let action = action.filter(|a| !a.is_empty())?;

    let service = match (scope_service.as_deref(), version.as_deref()) {
        // Both ELB APIs sign as "elasticloadbalancing"; AWS throttles them in
        // separate buckets, so the API version tells them apart.
        (Some(SERVICE_ELB), Some(ELBV2_VERSION)) => SERVICE_ELBV2.to_owned(),
        (Some(service), _) => service.to_owned(),
        (None, Some(version)) => service_for_version(version)?.to_owned(),
        (None, None) => return None,
    };
    let protocol = if service == SERVICE_EC2 {
        Protocol::Ec2Query
    } else {
        Protocol::AwsQuery
    };
    Some(AwsCall {
        service,
        action,
        version,
        param_names,
        protocol,
    })
}

const EC2_VERSION: &str = "2016-11-15";
const ELB_VERSION: &str = "2012-06-01";
const ELBV2_VERSION: &str = "2015-12-01";
const STS_VERSION: &str = "2011-06-15";

/// The service an API version belongs to, for unsigned requests (STS's
/// `AssumeRoleWithWebIdentity`, hand-made test requests).
fn service_for_version(version: &str) -> Option<&'static str> {
    match version {
        EC2_VERSION => Some(SERVICE_EC2),
        ELB_VERSION => Some(SERVICE_ELB),
        ELBV2_VERSION => Some(SERVICE_ELBV2),
        STS_VERSION => Some(SERVICE_STS),
        _ => None,
    }
}

/// The service named in a SigV4 credential scope:
/// `AWS4-HMAC-SHA256 Credential=AKID/20240101/us-east-1/ec2/aws4_request, …`.
fn signing_service(headers: &HeaderMap) -> Option<String> {
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let credential = auth
        .split([',', ' '])
        .find_map(|part| part.trim().strip_prefix("Credential="))?;
    // AKID/date/region/service/aws4_request; the access key id never contains '/'.
    let mut fields = credential.rsplit('/');
    let terminator = fields.next()?;
    if terminator != "aws4_request" {
        return None;
    }
    let service = fields.next()?;
    (!service.is_empty()).then(|| service.to_owned())
}

/// The region of the SigV4 credential scope (`AKID/date/region/service/aws4_request`).
pub fn signing_region(headers: &HeaderMap) -> Option<String> {
    let auth = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let credential = auth
        .split([',', ' '])
        .find_map(|part| part.trim().strip_prefix("Credential="))?;
    let mut fields = credential.rsplit('/');
    fields.next()?; // aws4_request
    fields.next()?; // service
    fields.next().filter(|r| !r.is_empty()).map(str::to_owned)
}

/// Decodes `application/x-www-form-urlencoded` text into (name, value) pairs.
/// Malformed escapes are kept literally rather than failing: the proxy only
/// needs names, and moto gets the original bytes regardless.
pub fn form_pairs(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.split('&').filter(|pair| !pair.is_empty()).map(|pair| {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(name), percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            // Both hex digits must exist: index i + 2 must be in range.
            b'%' if i + 2 < bytes.len() => {
                match (hex_value(bytes[i + 1]), hex_value(bytes[i + 2])) {
                    (Some(high), Some(low)) => {
                        out.push(high << 4 | low);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            byte => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn signed(service: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let value = format!(
            "AWS4-HMAC-SHA256 Credential=testing/20250101/us-east-1/{service}/aws4_request, SignedHeaders=content-type;host;x-amz-date, Signature=00ff"
        );
        headers.insert(
            http::header::AUTHORIZATION,
            HeaderValue::from_str(&value).expect("valid header"),
        );
        headers
    }

    #[test]
    fn ec2_query_call() {
        let body = b"Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=tag%3AName&Filter.1.Value.1=a+b";
        let call = identify(&signed("ec2"), None, body).expect("an AWS call");
        assert_eq!(call.service, "ec2");
        assert_eq!(call.action, "DescribeInstances");
        assert_eq!(call.version.as_deref(), Some("2016-11-15"));
        assert_eq!(call.param_names, ["Filter.1.Name", "Filter.1.Value.1"]);
        assert_eq!(call.protocol, Protocol::Ec2Query);
    }

    #[test]
    fn elb_versions_are_told_apart() {
        let v2 = identify(
            &signed("elasticloadbalancing"),
            None,
            b"Action=DescribeLoadBalancers&Version=2015-12-01",
        )
        .expect("an AWS call");
        assert_eq!(v2.service, "elasticloadbalancingv2");
        assert_eq!(v2.protocol, Protocol::AwsQuery);
        let classic = identify(
            &signed("elasticloadbalancing"),
            None,
            b"Action=DescribeLoadBalancers&Version=2012-06-01",
        )
        .expect("an AWS call");
        assert_eq!(classic.service, "elasticloadbalancing");
    }

    #[test]
    fn unsigned_calls_fall_back_to_the_version() {
        let call = identify(
            &HeaderMap::new(),
            Some("Action=AssumeRoleWithWebIdentity&Version=2011-06-15"),
            b"",
        )
        .expect("an AWS call");
        assert_eq!(call.service, "sts");
        assert_eq!(call.action, "AssumeRoleWithWebIdentity");
        assert!(identify(&HeaderMap::new(), None, b"Action=Foo&Version=1999-01-01").is_none());
    }

    #[test]
    fn json_protocol_uses_the_target_header() {
        let mut headers = signed("acm");
        headers.insert(
            "x-amz-target",
            HeaderValue::from_static("CertificateManager.DescribeCertificate"),
        );
        let call = identify(&headers, None, br#"{"CertificateArn":"arn"}"#).expect("an AWS call");
        assert_eq!(call.service, "acm");
        assert_eq!(call.action, "DescribeCertificate");
        assert_eq!(call.protocol, Protocol::AwsJson);
    }

    #[test]
    fn requests_without_an_action_are_not_aws_calls() {
        assert!(identify(&signed("ec2"), None, b"").is_none());
        assert!(identify(&HeaderMap::new(), None, b"{\"json\": true}").is_none());
        assert!(identify(&signed("ec2"), None, b"Action=&Version=2016-11-15").is_none());
    }

    #[test]
    fn form_decoding() {
        let pairs: Vec<(String, String)> = form_pairs("a=1&b=x%20y+z&c&d=%zz&e=%4").collect();
        assert_eq!(
            pairs,
            [
                ("a".into(), "1".into()),
                ("b".into(), "x y z".into()),
                ("c".into(), String::new()),
                ("d".into(), "%zz".into()),
                ("e".into(), "%4".into()),
            ]
        );
    }
}
