//! `iam:SimulatePrincipalPolicy`, answered by the proxy from the IAM oracle
//! ([`crate::iam::Policy`]): moto keeps no policy evaluation. The principal's
//! policy is one a test installed for its ARN
//! ([`super::FaultProxy::set_iam_principal_policy`]), or, for the CCM's test
//! role ([`CCM_ROLE`]), the policy the proxy enforces. The real API's rules,
//! as its reference states them:
//!
//! - `PolicySourceArn` must name an IAM user, group or role (an STS
//!   assumed-role session ARN is `InvalidInput`); one IAM does not know is
//!   `NoSuchEntity` (404);
//! - `ActionNames` is required, each `service:Action`; `ResourceArns`
//!   defaults to `*`, and every action is evaluated on every resource;
//! - `ContextEntries` each carry a name, a type (`string`, `stringList`,
//!   `numeric`, `boolean`, `ip`, `binary`, `date` and their `…List`) and
//!   values of that type: one value for a single-valued type, `true` or
//!   `false` for a boolean, a number for a numeric (`InvalidInput`
//!   otherwise);
//! - `MaxItems` is 1 to 1000 (default 100; `ValidationError` outside), and a
//!   longer answer is `IsTruncated` with a `Marker` for the next call;
//! - each result is `allowed`, `implicitDeny` or `explicitDeny`, with the
//!   condition keys the applying statements test and the request lacked in
//!   `MissingContextValues`.
//!
//! What the oracle cannot simulate (a resource policy, a permissions
//! boundary, a caller ARN) is refused, never ignored.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::errors::{AwsError, xml_escape};
use crate::iam::{Context, Decision, Policy, TEST_ACCOUNT};

/// The role whose policy is the one the proxy enforces, when it enforces one.
pub const CCM_ROLE: &str = "role/aws-ccm";

const DEFAULT_ITEMS: usize = 100;
const MAX_ITEMS: usize = 1000;

const SCALAR_TYPES: [&str; 6] = ["string", "numeric", "boolean", "ip", "binary", "date"];

fn invalid(message: impl Into<String>) -> AwsError {
    AwsError::new(400, "InvalidInput", message)
}

/// Policies by principal ARN (installed by tests).
pub type Principals = BTreeMap<String, Arc<Policy>>;

/// `arn:PARTITION:iam::ACCOUNT:(user|group|role)/[path/]name` → (kind, name).
fn principal_parts(arn: &str) -> Option<(&str, &str)> {
    let fields: Vec<&str> = arn.splitn(6, ':').collect();
    let [prefix, partition, service, region, account, resource] = fields[..] else {
        return None;
    };
    let (kind, rest) = resource.split_once('/')?;
    let name = rest.rsplit('/').next()?;
    (prefix == "arn"
        && !partition.is_empty()
        && service == "iam"
        && region.is_empty()
        && account.len() == 12
        && account.chars().all(|c| c.is_ascii_digit())
        && ["user", "group", "role"].contains(&kind)
        && !name.is_empty())
    .then_some((kind, name))
}

/// Values of `Prefix.member.N`, in N order.
fn members(params: &[(String, String)], prefix: &str) -> Vec<String> {
    let lead = format!("{prefix}.member.");
    let mut found: Vec<(usize, String)> = params
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(&lead)?.parse().ok()?, v.clone())))
        .collect();
    found.sort();
    found.into_iter().map(|(_, v)| v).collect()
}

fn one(params: &[(String, String)], name: &str) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
}

/// The request's `ContextEntries`, type-checked.
fn context(params: &[(String, String)]) -> Result<Context, AwsError> {
    let mut indexes: Vec<usize> = params
        .iter()
        .filter_map(|(k, _)| {
            k.strip_prefix("ContextEntries.member.")?
                .split('.')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    indexes.sort_unstable();
    indexes.dedup();
    let mut out = Context::default();
    for n in indexes {
        let at = format!("ContextEntries.member.{n}");
        let name = one(params, &format!("{at}.ContextKeyName"))
            .filter(|s| !s.is_empty())
            .ok_or_else(|| invalid(format!("{at}.ContextKeyName is required")))?;
        let kind = one(params, &format!("{at}.ContextKeyType")).unwrap_or_default();
        let values = members(params, &format!("{at}.ContextKeyValues"));
        let scalar = kind.strip_suffix("List").unwrap_or(&kind);
        if !SCALAR_TYPES.contains(&scalar) {
            return Err(invalid(format!(
                "context key {name}: ContextKeyType {kind:?} is not one of string, stringList, numeric, numericList, boolean, booleanList, ip, ipList, binary, binaryList, date, dateList"
            )));
        }
        if !kind.ends_with("List") && values.len() != 1 {
            return Err(invalid(format!(
                "context key {name} of type {kind} takes exactly one value, got {}",
                values.len()
            )));
        }
        for v in &values {
            let fits = match scalar {
                "boolean" => v == "true" || v == "false",
                "numeric" => v.parse::<f64>().is_ok(),
                _ => true,
            };
            if !fits {
                return Err(invalid(format!(
                    "context key {name}: {v:?} is not a {scalar} value"
                )));
            }
        }
        out.set_many(&name, values);
    }
    Ok(out)
}

/// The policy of the principal `arn` names: installed, or enforced for
/// [`CCM_ROLE`]; `NoSuchEntity` otherwise.
fn principal_policy(
    arn: &str,
    principals: &Principals,
    enforced: Option<&Policy>,
) -> Result<Arc<Policy>, AwsError> {
    let (kind, name) = principal_parts(arn).ok_or_else(|| {
        invalid(format!(
            "Invalid Entity Arn: {arn}: PolicySourceArn must be the ARN of an IAM user, group or role (not an STS session)"
        ))
    })?;
    if let Some(policy) = principals.get(arn) {
        return Ok(policy.clone());
    }
    if let Some(policy) = enforced
        && arn.ends_with(&format!(":iam::{TEST_ACCOUNT}:{CCM_ROLE}"))
    {
        return Ok(Arc::new(policy.clone()));
    }
    Err(AwsError::new(
        404,
        "NoSuchEntity",
        format!("The {kind} with name {name} cannot be found."),
    ))
}

/// The parameters the oracle cannot take into account.
const UNSIMULATED: [&str; 6] = [
    "PermissionsBoundaryPolicyInputList",
    "ResourcePolicy",
    "ResourceOwner",
    "CallerArn",
    "ResourceHandlingOption",
    "PolicyExclusionList",
];

/// The answer to one `SimulatePrincipalPolicy` request.
pub fn answer(
    params: &[(String, String)],
    principals: &Principals,
    enforced: Option<&Policy>,
) -> Result<String, AwsError> {
    if let Some((name, _)) = params
        .iter()
        .find(|(k, _)| UNSIMULATED.iter().any(|p| k.starts_with(p)))
    {
        return Err(invalid(format!(
            "aws-fault-proxy does not simulate {name}: remove it from the request"
        )));
    }
    let source =
        one(params, "PolicySourceArn").ok_or_else(|| invalid("PolicySourceArn is required"))?;
    let mut policies = vec![principal_policy(&source, principals, enforced)?];
    for (n, text) in members(params, "PolicyInputList").iter().enumerate() {
        let policy = Policy::parse(text).map_err(|e| {
            AwsError::new(
                400,
                "MalformedPolicyDocument",
                format!("PolicyInputList.member.{}: {e}", n + 1),
            )
        })?;
        policies.push(Arc::new(policy));
    }
    let actions = members(params, "ActionNames");
    if actions.is_empty() {
        return Err(invalid("ActionNames is required: at least one action"));
    }
    if let Some(bad) = actions.iter().find(|a| {
        a.split_once(':')
            .is_none_or(|(service, action)| service.is_empty() || action.is_empty())
    }) {
        return Err(invalid(format!(
            "action {bad:?} must include the service identifier, such as iam:CreateUser"
        )));
    }
    let mut resources = members(params, "ResourceArns");
    if resources.is_empty() {
        resources.push("*".into());
    }
    if let Some(bad) = resources
        .iter()
        .find(|r| *r != "*" && !r.starts_with("arn:"))
    {
        return Err(invalid(format!("resource {bad:?} is not an ARN")));
    }
    let context = context(params)?;
    let page = page(params)?;
    let results: Vec<String> = actions
        .iter()
        .flat_map(|a| resources.iter().map(move |r| (a, r)))
        .map(|(action, resource)| result(&policies, action, resource, &context))
        .collect();
    let start = page.marker.unwrap_or(0);
    if start > results.len() {
        return Err(invalid(format!(
            "Marker {start} is past the end of the results"
        )));
    }
    let end = (start + page.max_items).min(results.len());
    let mut body = format!(
        "<IsTruncated>{}</IsTruncated>",
        if end < results.len() { "true" } else { "false" }
    );
    if end < results.len() {
        body.push_str(&format!("<Marker>{end}</Marker>"));
    }
    body.push_str("<EvaluationResults>");
    body.push_str(&results[start..end].concat());
    body.push_str("</EvaluationResults>");
    Ok(format!(
        "<SimulatePrincipalPolicyResponse xmlns=\"https://iam.amazonaws.com/doc/2010-05-08/\"><SimulatePrincipalPolicyResult>{body}</SimulatePrincipalPolicyResult><ResponseMetadata><RequestId>{}</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>",
        uuid::Uuid::new_v4()
    ))
}

struct Page {
    max_items: usize,
    marker: Option<usize>,
}

fn page(params: &[(String, String)]) -> Result<Page, AwsError> {
    let max_items = match one(params, "MaxItems") {
        None => DEFAULT_ITEMS,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_ITEMS).contains(n))
            .ok_or_else(|| {
                AwsError::new(
                    400,
                    "ValidationError",
                    format!("1 validation error detected: Value '{v}' at 'maxItems' failed to satisfy constraint: Member must have value between 1 and {MAX_ITEMS}"),
                )
            })?,
    };
    let marker = match one(params, "Marker") {
        None => None,
        Some(m) => Some(
            m.parse::<usize>()
                .map_err(|_| invalid(format!("Marker {m:?} was not returned by this API")))?,
        ),
    };
    Ok(Page { max_items, marker })
}

/// One `<member>` of `EvaluationResults`: an explicit deny in any policy
/// wins, then an allow in any, else the implicit deny.
fn result(policies: &[Arc<Policy>], action: &str, resource: &str, context: &Context) -> String {
    let decisions: Vec<Decision> = policies
        .iter()
        .map(|p| p.evaluate(action, resource, context))
        .collect();
    let decision = if decisions
        .iter()
        .any(|d| matches!(d, Decision::ExplicitDeny(_)))
    {
        "explicitDeny"
    } else if decisions.iter().any(Decision::is_allowed) {
        "allowed"
    } else {
        "implicitDeny"
    };
    let mut missing: Vec<String> = Vec::new();
    for key in policies
        .iter()
        .flat_map(|p| p.missing_context_keys(action, resource, context))
    {
        if !missing.contains(&key) {
            missing.push(key);
        }
    }
    let missing: String = missing
        .iter()
        .map(|k| format!("<member>{}</member>", xml_escape(k)))
        .collect();
    format!(
        "<member><EvalActionName>{}</EvalActionName><EvalResourceName>{}</EvalResourceName><EvalDecision>{decision}</EvalDecision><MatchedStatements/><MissingContextValues>{missing}</MissingContextValues></member>",
        xml_escape(action),
        xml_escape(resource)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    const ROLE: &str = "arn:aws:iam::123456789012:role/ccm";

    fn principals() -> Principals {
        let policy = Policy::parse(
            r#"{"Version":"2012-10-17","Statement":[
              {"Sid":"Create","Effect":"Allow","Action":"elasticloadbalancing:CreateLoadBalancer",
               "Resource":"arn:aws:elasticloadbalancing:*:*:loadbalancer/*",
               "Condition":{"StringEquals":{"aws:RequestTag/kubernetes.io/cluster/c1":"owned"}}},
              {"Sid":"NoDelete","Effect":"Deny","Action":"elasticloadbalancing:DeleteLoadBalancer","Resource":"*"}]}"#,
        )
        .expect("policy");
        BTreeMap::from([(ROLE.to_string(), Arc::new(policy))])
    }

    fn decisions(xml: &str) -> Vec<String> {
        xml.split("<EvalDecision>")
            .skip(1)
            .filter_map(|s| s.split("</EvalDecision>").next())
            .map(str::to_owned)
            .collect()
    }

    const LB: &str = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/a";

    #[test]
    fn decides_each_action_with_the_context_and_names_missing_keys() {
        let base = [
            ("PolicySourceArn", ROLE),
            (
                "ActionNames.member.1",
                "elasticloadbalancing:CreateLoadBalancer",
            ),
            (
                "ActionNames.member.2",
                "elasticloadbalancing:DeleteLoadBalancer",
            ),
            ("ActionNames.member.3", "elasticloadbalancing:AddTags"),
            ("ResourceArns.member.1", LB),
        ];
        let with_tag = [
            (
                "ContextEntries.member.1.ContextKeyName",
                "aws:RequestTag/kubernetes.io/cluster/c1",
            ),
            ("ContextEntries.member.1.ContextKeyType", "string"),
            ("ContextEntries.member.1.ContextKeyValues.member.1", "owned"),
        ];
        let all: Vec<_> = base.iter().chain(&with_tag).copied().collect();
        let xml = answer(&p(&all), &principals(), None).expect("answer");
        assert_eq!(decisions(&xml), ["allowed", "explicitDeny", "implicitDeny"]);
        assert!(xml.contains("<IsTruncated>false</IsTruncated>"));
        let xml = answer(&p(&base), &principals(), None).expect("answer");
        assert_eq!(decisions(&xml)[0], "implicitDeny");
        assert!(xml.contains(
            "<MissingContextValues><member>aws:RequestTag/kubernetes.io/cluster/c1</member></MissingContextValues>"
        ));
    }

    #[test]
    fn refuses_what_iam_refuses() {
        let code = |pairs: &[(&str, &str)]| {
            answer(&p(pairs), &principals(), None)
                .expect_err("refused")
                .code
        };
        let action = ("ActionNames.member.1", "elasticloadbalancing:AddTags");
        assert_eq!(
            code(&[
                (
                    "PolicySourceArn",
                    "arn:aws:sts::123456789012:assumed-role/ccm/s"
                ),
                action
            ]),
            "InvalidInput"
        );
        let unknown = answer(
            &p(&[
                ("PolicySourceArn", "arn:aws:iam::123456789012:role/other"),
                action,
            ]),
            &principals(),
            None,
        )
        .expect_err("unknown role");
        assert_eq!(
            (unknown.status, unknown.code.as_str()),
            (404, "NoSuchEntity")
        );
        assert_eq!(code(&[("PolicySourceArn", ROLE)]), "InvalidInput");
        assert_eq!(
            code(&[
                ("PolicySourceArn", ROLE),
                ("ActionNames.member.1", "AddTags")
            ]),
            "InvalidInput"
        );
        assert_eq!(
            code(&[("PolicySourceArn", ROLE), action, ("MaxItems", "1001")]),
            "ValidationError"
        );
        assert_eq!(
            code(&[("PolicySourceArn", ROLE), action, ("MaxItems", "0")]),
            "ValidationError"
        );
        let typed = |kind: &'static str, values: &[&'static str]| {
            let mut pairs = vec![
                ("PolicySourceArn", ROLE),
                action,
                ("ContextEntries.member.1.ContextKeyName", "aws:TagKeys"),
                ("ContextEntries.member.1.ContextKeyType", kind),
            ];
            let names = [
                "ContextEntries.member.1.ContextKeyValues.member.1",
                "ContextEntries.member.1.ContextKeyValues.member.2",
            ];
            pairs.extend(names.iter().copied().zip(values.iter().copied()));
            answer(&p(&pairs), &principals(), None).map(|_| ())
        };
        assert!(typed("stringList", &["a", "b"]).is_ok());
        assert_eq!(
            typed("string", &["a", "b"]).expect_err("two").code,
            "InvalidInput"
        );
        assert_eq!(
            typed("boolean", &["yes"]).expect_err("bool").code,
            "InvalidInput"
        );
        assert_eq!(
            typed("numeric", &["x"]).expect_err("num").code,
            "InvalidInput"
        );
        assert_eq!(
            typed("text", &["x"]).expect_err("type").code,
            "InvalidInput"
        );
        assert_eq!(
            code(&[("PolicySourceArn", ROLE), action, ("CallerArn", ROLE)]),
            "InvalidInput"
        );
    }

    #[test]
    fn pages_with_max_items_and_marker() {
        let mut pairs = vec![("PolicySourceArn".to_string(), ROLE.to_string())];
        for n in 1..=5 {
            pairs.push((
                format!("ActionNames.member.{n}"),
                format!("elasticloadbalancing:Action{n}"),
            ));
        }
        pairs.push(("MaxItems".into(), "2".into()));
        let mut seen = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let mut request = pairs.clone();
            if let Some(m) = &marker {
                request.push(("Marker".into(), m.clone()));
            }
            let xml = answer(&request, &principals(), None).expect("page");
            for name in xml.split("<EvalActionName>").skip(1) {
                seen.push(name.split('<').next().unwrap_or("").to_string());
            }
            marker = xml
                .split("<Marker>")
                .nth(1)
                .and_then(|rest| rest.split("</Marker>").next())
                .map(str::to_owned);
            if marker.is_none() {
                assert!(xml.contains("<IsTruncated>false</IsTruncated>"));
                break;
            }
            assert!(xml.contains("<IsTruncated>true</IsTruncated>"));
        }
        let want: Vec<String> = (1..=5)
            .map(|n| format!("elasticloadbalancing:Action{n}"))
            .collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn the_enforced_policy_is_the_ccm_roles() {
        let enforced = principals().remove(ROLE).expect("policy");
        let xml = answer(
            &p(&[
                ("PolicySourceArn", "arn:aws:iam::123456789012:role/aws-ccm"),
                (
                    "ActionNames.member.1",
                    "elasticloadbalancing:DeleteLoadBalancer",
                ),
            ]),
            &Principals::new(),
            Some(&enforced),
        )
        .expect("answer");
        assert_eq!(decisions(&xml), ["explicitDeny"]);
    }
}
