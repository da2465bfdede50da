//! What the IAM oracle needs from the proxy: each call as AWS would
//! authorize it (parameters, region, and the tags the resources it names
//! have at that moment, read from the upstream just before forwarding), and,
//! when a test asks for it, the answer AWS gives when the policy denies.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};

use super::State;
use super::errors::AwsError;
use super::request::{AwsCall, signing_region};
use super::throttle::{SERVICE_EC2, SERVICE_ELB, SERVICE_ELBV2};
use crate::iam::{self, AuthorizationTable, Decision, Policy, RecordedRequest};

/// A policy the proxy enforces, with the reference table it evaluates by.
pub struct Enforcer {
    pub policy: Policy,
    pub table: AuthorizationTable,
    pub partition: String,
}

impl Enforcer {
    /// `iam/authorization.json` from the repository and `policy` (rendered JSON).
    pub fn from_repo(policy_json: &str) -> anyhow::Result<Enforcer> {
        let path = crate::repo_path("iam/authorization.json");
        let table = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
            .and_then(|t| AuthorizationTable::parse(&t).map_err(anyhow::Error::msg))?;
        let policy = Policy::parse(policy_json).map_err(anyhow::Error::msg)?;
        Ok(Enforcer {
            policy,
            table,
            partition: "aws".into(),
        })
    }

    /// The error AWS answers for `request`, or `None` when it is allowed
    /// and should go on. An allowed EC2 `DryRun` is answered here, as EC2
    /// does, with `DryRunOperation`.
    pub(super) fn answer(&self, request: &RecordedRequest, call: &AwsCall) -> Option<AwsError> {
        let denial = match iam::first_denial(&self.policy, &self.table, request, &self.partition) {
            Ok(denial) => denial,
            Err(unknown) => {
                return Some(AwsError::new(
                    403,
                    "AccessDenied",
                    format!("aws-fault-proxy cannot evaluate IAM for this request: {unknown}"),
                ));
            }
        };
        let ec2 = call.service == SERVICE_EC2;
        match denial {
            Some((auth, decision)) => {
                let why = match decision {
                    Decision::ExplicitDeny(sid) => {
                        format!("with an explicit deny in statement {sid}")
                    }
                    _ => "because no identity-based policy allows the action".to_string(),
                };
                let message = format!(
                    "User: arn:aws:sts::{}:assumed-role/aws-ccm/test is not authorized to perform: {} on resource: {} {why}",
                    iam::TEST_ACCOUNT,
                    auth.action,
                    auth.resource
                );
                Some(if ec2 {
                    AwsError::new(403, "UnauthorizedOperation", message)
                } else {
                    AwsError::new(403, "AccessDenied", message)
                })
            }
            None if ec2 && request.is_dry_run() => Some(AwsError::new(
                412,
                "DryRunOperation",
                "Request would have succeeded, but DryRun flag is set.",
            )),
            None => None,
        }
    }
}

fn is_read(action: &str) -> bool {
    ["Describe", "Get", "List"]
        .iter()
        .any(|p| action.starts_with(p))
}

/// The call as the oracle sees it; reads carry no tags (they are
/// authorized against `*`).
pub(super) async fn recorded_request(
    state: &State,
    headers: &HeaderMap,
    call: &AwsCall,
    params: &[(String, String)],
) -> RecordedRequest {
    let mut request = RecordedRequest {
        service: call.service.clone(),
        action: call.action.clone(),
        region: signing_region(headers).unwrap_or_default(),
        params: params.iter().cloned().collect(),
        tags: BTreeMap::new(),
        policy_options: state.iam_policy_options.read().clone(),
    };
    if !is_read(&call.action) {
        request.tags = resource_tags(state, headers, &call.service, params).await;
    }
    request
}

/// Tags of every resource `params` names, by the ID, name or ARN used.
async fn resource_tags(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    params: &[(String, String)],
) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if service == SERVICE_EC2 {
        let ids: Vec<&str> = params
            .iter()
            .map(|(_, v)| v.as_str())
            .filter(|v| is_ec2_id(v))
            .collect();
        if ids.is_empty() {
            return out;
        }
        let mut body =
            "Action=DescribeTags&Version=2016-11-15&Filter.1.Name=resource-id".to_string();
        for (n, id) in ids.iter().enumerate() {
            body.push_str(&format!("&Filter.1.Value.{}={id}", n + 1));
        }
        if let Some(xml) = ask_upstream(state, headers, body).await {
            for item in elements(&xml, "item") {
                let (Some(id), Some(key)) = (first(item, "resourceId"), first(item, "key")) else {
                    continue;
                };
                let value = first(item, "value").unwrap_or_default();
                out.entry(id)
                    .or_insert_with(BTreeMap::new)
                    .insert(key, value);
            }
            for id in ids {
                out.entry(id.to_string()).or_default();
            }
        }
        return out;
    }
    let (version, list, names): (&str, &str, Vec<String>) = if service == SERVICE_ELB {
        let names = params
            .iter()
            .filter(|(k, _)| k == "LoadBalancerName" || k.starts_with("LoadBalancerNames.member."))
            .map(|(_, v)| v.clone())
            .collect();
        ("2012-06-01", "LoadBalancerNames", names)
    } else if service == SERVICE_ELBV2 {
        let arns = params
            .iter()
            .filter(|(_, v)| v.starts_with("arn:") && v.contains(":elasticloadbalancing:"))
            .map(|(_, v)| v.clone())
            .collect();
        ("2015-12-01", "ResourceArns", arns)
    } else {
        return out;
    };
    for name in names {
        let body = format!(
            "Action=DescribeTags&Version={version}&{list}.member.1={}",
            form_escape(&name)
        );
        let Some(xml) = ask_upstream(state, headers, body).await else {
            continue;
        };
        let tags = elements(&xml, "Tags")
            .into_iter()
            .flat_map(|tags| elements(tags, "member"))
            .filter_map(|m| Some((first(m, "Key")?, first(m, "Value").unwrap_or_default())))
            .collect();
        out.insert(name, tags);
    }
    out
}

fn is_ec2_id(v: &str) -> bool {
    let Some((prefix, rest)) = v.split_once('-') else {
        return false;
    };
    ["i", "sg", "rtb", "vpc", "subnet", "eni", "igw"].contains(&prefix)
        && !rest.is_empty()
        && rest.chars().all(|c| c.is_ascii_alphanumeric())
}

pub(super) fn form_escape(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Parameter `name` of a call, as sent.
pub(super) fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The reads a refusal hook makes of the upstream for one call: to
/// `service`, in the call's signing region (us-east-1 when it has none).
pub(super) struct Upstream<'a> {
    state: &'a State,
    service: &'static str,
    region: String,
}

impl<'a> Upstream<'a> {
    pub(super) fn for_call(
        state: &'a State,
        headers: &HeaderMap,
        service: &'static str,
    ) -> Upstream<'a> {
        let region = signing_region(headers).unwrap_or_else(|| "us-east-1".into());
        Upstream {
            state,
            service,
            region,
        }
    }

    /// One read (see [`ask_upstream_as`]).
    pub(super) async fn ask(&self, body: String) -> Option<String> {
        ask_upstream_as(self.state, self.service, &self.region, body).await
    }
}

/// A read the proxy makes for itself of `signing_service` (the SigV4 scope's
/// name: `ec2`, `elasticloadbalancing`), whatever service the call it checks
/// went to.
pub(super) async fn ask_upstream_as(
    state: &State,
    service: &str,
    region: &str,
    body: String,
) -> Option<String> {
    let scope = if service == SERVICE_ELBV2 {
        SERVICE_ELB
    } else {
        service
    };
    let auth = format!(
        "AWS4-HMAC-SHA256 Credential=testing/20250101/{region}/{scope}/aws4_request, SignedHeaders=host, Signature=00"
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::AUTHORIZATION,
        HeaderValue::from_str(&auth).ok()?,
    );
    ask_upstream(state, &headers, body).await
}

/// A read the proxy makes for itself: not counted, faulted or recorded.
async fn ask_upstream(state: &State, headers: &HeaderMap, body: String) -> Option<String> {
    let uri = Uri::builder()
        .scheme(state.upstream_scheme.clone())
        .authority(state.upstream_authority.clone())
        .path_and_query("/")
        .build()
        .ok()?;
    let mut request = Request::new(Full::new(Bytes::from(body)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    let out_headers = request.headers_mut();
    for name in [http::header::AUTHORIZATION, http::header::HOST] {
        if let Some(v) = headers.get(&name) {
            out_headers.insert(name, v.clone());
        }
    }
    out_headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let response = state.client.request(request).await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    String::from_utf8(bytes.to_vec()).ok()
}

/// The inner text of every `<name>…</name>` (not nested in another of the
/// same name) in `xml`.
pub(super) fn elements<'a>(xml: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        // Same-name nesting (ELB's <member> in <member>): match depth.
        let mut depth = 1;
        let mut at = 0;
        let mut end = None;
        while depth > 0 {
            let next_open = after[at..].find(&open).map(|i| i + at);
            let next_close = after[at..].find(&close).map(|i| i + at);
            match (next_open, next_close) {
                (Some(o), Some(c)) if o < c => {
                    depth += 1;
                    at = o + open.len();
                }
                (_, Some(c)) => {
                    depth -= 1;
                    at = c + close.len();
                    if depth == 0 {
                        end = Some(c);
                    }
                }
                _ => break,
            }
        }
        let Some(end) = end else { break };
        out.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    out
}

/// The unescaped text of the first `<name>…</name>` in `xml`.
pub(super) fn first(xml: &str, name: &str) -> Option<String> {
    if xml.contains(&format!("<{name}/>")) && !xml.contains(&format!("<{name}>")) {
        return Some(String::new());
    }
    elements(xml, name).first().map(|s| unescape(s))
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#x2F;", "/")
        .replace("&amp;", "&")
}

/// Shared handle type for the proxy's state.
pub(super) type SharedEnforcer = Option<Arc<Enforcer>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_elb_tags_through_nested_members() {
        let xml = "<DescribeTagsResult><TagDescriptions><member><ResourceArn>a</ResourceArn><Tags><member><Key>k1</Key><Value>v&amp;1</Value></member><member><Key>k2</Key><Value/></member></Tags></member></TagDescriptions></DescribeTagsResult>";
        let tags: Vec<(String, String)> = elements(xml, "Tags")
            .into_iter()
            .flat_map(|t| elements(t, "member"))
            .filter_map(|m| Some((first(m, "Key")?, first(m, "Value").unwrap_or_default())))
            .collect();
        assert_eq!(
            tags,
            vec![("k1".into(), "v&1".into()), ("k2".into(), String::new())]
        );
    }

    #[test]
    fn recognises_ec2_ids_only() {
        assert!(is_ec2_id("sg-0123abcd"));
        assert!(is_ec2_id("i-1"));
        assert!(!is_ec2_id("tcp"));
        assert!(!is_ec2_id("sg-"));
        assert!(!is_ec2_id("kubernetes.io/cluster-x"));
    }
}
