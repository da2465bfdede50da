//! AWS error responses in each protocol's real wire format, so the SDK parses
//! an injected error exactly like one from AWS.
//!
//! - `ec2Query` (EC2): `<Response><Errors><Error><Code/><Message/></Error></Errors><RequestID/></Response>`;
//!   throttling is HTTP 503 `RequestLimitExceeded` "Request limit exceeded.".
//! - `awsQuery` (ELB, ELBv2, STS): `<ErrorResponse xmlns="…/doc/VERSION/"><Error><Type/><Code/><Message/></Error><RequestId/></ErrorResponse>`;
//!   throttling is HTTP 400 `Throttling` "Rate exceeded" with `Type` Sender
//!   (the code ELB really returns; the SDK lists it as a throttling code).
//! - `awsJson`: `{"__type": CODE, "message": …}` plus `x-amzn-ErrorType`;
//!   throttling is HTTP 400 `ThrottlingException`.
//!
//! Every response also carries `x-amzn-RequestId`, where the SDK looks for
//! the request id of an error.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};

use super::request::{AwsCall, Protocol};
use super::throttle::SERVICE_STS;

/// One AWS error, ready to be encoded for a call's protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsError {
    /// HTTP status code.
    pub status: u16,
    /// The AWS error code, e.g. "DependencyViolation".
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

impl AwsError {
    /// The throttling error `call`'s service returns when over its budget.
    pub fn throttling(protocol: Protocol) -> AwsError {
        match protocol {
            Protocol::Ec2Query => {
                AwsError::new(503, "RequestLimitExceeded", "Request limit exceeded.")
            }
            Protocol::AwsQuery => AwsError::new(400, "Throttling", "Rate exceeded"),
            Protocol::AwsJson => AwsError::new(400, "ThrottlingException", "Rate exceeded"),
        }
    }

    /// A 5xx error as the service reports it. EC2 reports 500 as
    /// `InternalError`; the query/JSON services' common error is
    /// `InternalFailure`. 503 is `ServiceUnavailable` everywhere. Other codes
    /// get `InternalError`/`InternalFailure` too.
    pub fn server_error(protocol: Protocol, status: u16) -> AwsError {
        if status == 503 {
            return AwsError::new(
                503,
                "ServiceUnavailable",
                "The request has failed due to a temporary failure of the server.",
            );
        }
        match protocol {
            Protocol::Ec2Query => AwsError::new(
                status,
                "InternalError",
                "An internal error has occurred. Retry your request, but if the problem persists, contact us with details by posting a message on the AWS forums.",
            ),
            Protocol::AwsQuery | Protocol::AwsJson => AwsError::new(
                status,
                "InternalFailure",
                "The request processing has failed because of an unknown error, exception or failure.",
            ),
        }
    }

    /// An arbitrary error.
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> AwsError {
        AwsError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// The HTTP response carrying this error for `call`.
    pub fn to_response(&self, call: &AwsCall) -> Response<Bytes> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let (content_type, body) = match call.protocol {
            Protocol::Ec2Query => ("text/xml;charset=UTF-8", self.ec2_body(&request_id)),
            Protocol::AwsQuery => ("text/xml", self.query_body(call, &request_id)),
            Protocol::AwsJson => ("application/x-amz-json-1.1", self.json_body()),
        };
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static(content_type),
        );
        if let Ok(value) = HeaderValue::from_str(&request_id) {
            headers.insert("x-amzn-requestid", value);
        }
        if call.protocol == Protocol::AwsJson
            && let Ok(value) = HeaderValue::from_str(&self.code)
        {
            headers.insert("x-amzn-errortype", value);
        }
        response
    }

    fn ec2_body(&self, request_id: &str) -> String {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code><Message>{}</Message></Error></Errors><RequestID>{}</RequestID></Response>",
            xml_escape(&self.code),
            xml_escape(&self.message),
            request_id
        )
    }

    fn query_body(&self, call: &AwsCall, request_id: &str) -> String {
        // AWS marks who is at fault: the caller for 4xx, the service for 5xx.
        let fault_type = if self.status >= 500 {
            "Receiver"
        } else {
            "Sender"
        };
        format!(
            "<ErrorResponse xmlns=\"{}\">\n  <Error>\n    <Type>{}</Type>\n    <Code>{}</Code>\n    <Message>{}</Message>\n  </Error>\n  <RequestId>{}</RequestId>\n</ErrorResponse>\n",
            xml_escape(&query_namespace(call)),
            fault_type,
            xml_escape(&self.code),
            xml_escape(&self.message),
            request_id
        )
    }

    fn json_body(&self) -> String {
        serde_json::json!({ "__type": self.code, "message": self.message }).to_string()
    }
}

/// The XML namespace an awsQuery service puts on its responses.
fn query_namespace(call: &AwsCall) -> String {
    let version = call.version.as_deref().unwrap_or("");
    match call.service.as_str() {
        SERVICE_STS => format!("https://sts.amazonaws.com/doc/{version}/"),
        // Classic ELB and ELBv2 share the namespace host; the version differs.
        "elasticloadbalancing" | "elasticloadbalancingv2" => {
            format!("http://elasticloadbalancing.amazonaws.com/doc/{version}/")
        }
        other => format!("https://{other}.amazonaws.com/doc/{version}/"),
    }
}

/// Escapes text for an XML element or attribute.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(service: &str, version: &str, protocol: Protocol) -> AwsCall {
        AwsCall {
            service: service.into(),
            action: "X".into(),
            version: Some(version.into()),
            param_names: Vec::new(),
            protocol,
        }
    }

    fn body_text(response: &Response<Bytes>) -> String {
        String::from_utf8(response.body().to_vec()).expect("utf-8 body")
    }

    #[test]
    fn ec2_throttling_is_503_request_limit_exceeded() {
        let response = AwsError::throttling(Protocol::Ec2Query).to_response(&call(
            "ec2",
            "2016-11-15",
            Protocol::Ec2Query,
        ));
        assert_eq!(response.status(), 503);
        let body = body_text(&response);
        assert!(
            body.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"),
            "{body}"
        );
        assert!(body.contains("<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>"), "{body}");
        let header_id = response.headers()["x-amzn-requestid"]
            .to_str()
            .expect("ascii");
        assert!(
            body.contains(&format!("<RequestID>{header_id}</RequestID>")),
            "{body}"
        );
    }

    #[test]
    fn query_throttling_is_400_throttling_sender() {
        let response = AwsError::throttling(Protocol::AwsQuery).to_response(&call(
            "elasticloadbalancingv2",
            "2015-12-01",
            Protocol::AwsQuery,
        ));
        assert_eq!(response.status(), 400);
        let body = body_text(&response);
        assert!(body.contains("<ErrorResponse xmlns=\"http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/\">"), "{body}");
        assert!(body.contains("<Type>Sender</Type>"), "{body}");
        assert!(body.contains("<Code>Throttling</Code>"), "{body}");
        assert!(body.contains("<Message>Rate exceeded</Message>"), "{body}");

        let sts = AwsError::server_error(Protocol::AwsQuery, 500).to_response(&call(
            "sts",
            "2011-06-15",
            Protocol::AwsQuery,
        ));
        let body = body_text(&sts);
        assert!(
            body.contains("xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\""),
            "{body}"
        );
        assert!(body.contains("<Type>Receiver</Type>"), "{body}");
        assert!(body.contains("<Code>InternalFailure</Code>"), "{body}");
    }

    #[test]
    fn json_errors_carry_type_and_header() {
        let response = AwsError::throttling(Protocol::AwsJson).to_response(&call(
            "acm",
            "",
            Protocol::AwsJson,
        ));
        assert_eq!(response.status(), 400);
        assert_eq!(
            response.headers()["x-amzn-errortype"],
            "ThrottlingException"
        );
        let json: serde_json::Value = serde_json::from_slice(response.body()).expect("JSON body");
        assert_eq!(json["__type"], "ThrottlingException");
        assert_eq!(json["message"], "Rate exceeded");
    }

    #[test]
    fn messages_are_escaped() {
        let response = AwsError::new(400, "InvalidParameterValue", "a<b & \"c\"")
            .to_response(&call("ec2", "2016-11-15", Protocol::Ec2Query));
        assert!(body_text(&response).contains("<Message>a&lt;b &amp; &quot;c&quot;</Message>"));
    }
}
