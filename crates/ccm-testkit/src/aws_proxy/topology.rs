//! `ec2:DescribeInstanceTopology`, which moto does not implement, answered
//! by the proxy from what a test declared, with the real API's rules:
//!
//! - only instances whose type has a topology are listed (a declared
//!   instance with no network nodes is an unsupported type and is left out);
//! - `MaxResults` (1–100, default 20) pages through `nextToken`, and may not
//!   be combined with `InstanceId.N` (`InvalidParameterCombination`);
//! - at most 100 `InstanceId.N`, each a well-formed id
//!   (`InvalidInstanceID.Malformed` otherwise);
//! - filters `availability-zone`, `instance-type` (with `*` and `?`) and
//!   `zone-id`; any other filter name is `InvalidParameterValue`.
//!
//! A region without the API is a test's fault rule away:
//! `error=400/UnsupportedOperation/...`.

use super::errors::{AwsError, xml_escape};

/// One instance's place in the network, as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceTopology {
    pub instance_id: String,
    pub instance_type: String,
    pub availability_zone: String,
    pub zone_id: String,
    pub group_name: Option<String>,
    /// From the top layer down; empty for a type without topology.
    pub network_nodes: Vec<String>,
}

const DEFAULT_PAGE: usize = 20;
const MAX_PAGE: usize = 100;
const MAX_IDS: usize = 100;

fn invalid(message: impl Into<String>) -> AwsError {
    AwsError::new(400, "InvalidParameterValue", message)
}

/// `*` and `?` wildcards, as EC2 filters use them (the same matching as
/// IAM's: `*` any run of characters, `?` exactly one).
fn wildcard_match(pattern: &str, value: &str) -> bool {
    crate::iam::policy::glob(pattern, value)
}

/// `i-` and 8 or 17 lower-case hex digits, as EC2 issues instance ids.
fn well_formed_instance_id(id: &str) -> bool {
    id.strip_prefix("i-").is_some_and(|hex| {
        matches!(hex.len(), 8 | 17)
            && hex
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    })
}

/// The request's `Filter.N.Name` → values.
fn filters(params: &[(String, String)]) -> Result<Vec<(String, Vec<String>)>, AwsError> {
    let mut out: Vec<(usize, String, Vec<String>)> = Vec::new();
    for (name, value) in params {
        let Some(rest) = name.strip_prefix("Filter.") else {
            continue;
        };
        let (index, field) = rest.split_once('.').unwrap_or((rest, ""));
        let index: usize = index
            .parse()
            .map_err(|_| invalid(format!("invalid filter parameter {name}")))?;
        let slot = match out.iter().position(|(i, _, _)| *i == index) {
            Some(slot) => slot,
            None => {
                out.push((index, String::new(), Vec::new()));
                out.len() - 1
            }
        };
        if field == "Name" {
            out[slot].1 = value.clone();
        } else if field.starts_with("Value") {
            out[slot].2.push(value.clone());
        }
    }
    out.into_iter()
        .map(|(_, name, values)| match name.as_str() {
            "availability-zone" | "instance-type" | "zone-id" => Ok((name, values)),
            other => Err(invalid(format!("The filter '{other}' is invalid"))),
        })
        .collect()
}

fn matches(entry: &InstanceTopology, filters: &[(String, Vec<String>)]) -> bool {
    filters.iter().all(|(name, values)| {
        let field = match name.as_str() {
            "availability-zone" => &entry.availability_zone,
            "instance-type" => &entry.instance_type,
            _ => &entry.zone_id,
        };
        values.iter().any(|v| wildcard_match(v, field))
    })
}

/// The XML answer to one DescribeInstanceTopology call.
pub(crate) fn answer(
    declared: &[InstanceTopology],
    params: &[(String, String)],
) -> Result<String, AwsError> {
    let param = |name: &str| {
        params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let ids: Vec<&str> = params
        .iter()
        .filter(|(n, _)| n.starts_with("InstanceId."))
        .map(|(_, v)| v.as_str())
        .collect();
    let groups: Vec<&str> = params
        .iter()
        .filter(|(n, _)| n.starts_with("GroupName."))
        .map(|(_, v)| v.as_str())
        .collect();
    if let Some(bad) = ids.iter().find(|id| !well_formed_instance_id(id)) {
        return Err(AwsError::new(
            400,
            "InvalidInstanceID.Malformed",
            format!("Invalid id: \"{bad}\""),
        ));
    }
    if ids.len() > MAX_IDS {
        return Err(invalid(format!(
            "The maximum number of instance IDs is {MAX_IDS}, got {}",
            ids.len()
        )));
    }
    let page = match param("MaxResults") {
        Some(_) if !ids.is_empty() => {
            return Err(AwsError::new(
                400,
                "InvalidParameterCombination",
                "The parameter MaxResults cannot be used with the parameter InstanceIds",
            ));
        }
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(invalid(format!(
                    "Value ({text}) for parameter maxResults is invalid. Expecting a value between 1 and {MAX_PAGE}."
                )));
            }
        },
        None if !ids.is_empty() => MAX_IDS,
        None => DEFAULT_PAGE,
    };
    let start = match param("NextToken") {
        Some(token) => token
            .parse::<usize>()
            .map_err(|_| invalid(format!("The token '{token}' is invalid")))?,
        None => 0,
    };
    let filters = filters(params)?;
    let listed: Vec<&InstanceTopology> = declared
        .iter()
        .filter(|e| !e.network_nodes.is_empty())
        .filter(|e| ids.is_empty() || ids.contains(&e.instance_id.as_str()))
        .filter(|e| {
            groups.is_empty() || e.group_name.as_deref().is_some_and(|g| groups.contains(&g))
        })
        .filter(|e| matches(e, &filters))
        .collect();
    let end = (start + page).min(listed.len());
    let mut xml = String::from(
        "<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>topology</requestId><instanceSet>",
    );
    for entry in listed.get(start..end).unwrap_or_default() {
        xml.push_str(&item(entry));
    }
    xml.push_str("</instanceSet>");
    if end < listed.len() {
        xml.push_str(&format!("<nextToken>{end}</nextToken>"));
    }
    xml.push_str("</DescribeInstanceTopologyResponse>");
    Ok(xml)
}

fn item(entry: &InstanceTopology) -> String {
    let nodes: String = entry
        .network_nodes
        .iter()
        .map(|n| format!("<item>{}</item>", xml_escape(n)))
        .collect();
    let group = entry
        .group_name
        .as_deref()
        .map(|g| format!("<groupName>{}</groupName>", xml_escape(g)))
        .unwrap_or_default();
    format!(
        "<item><instanceId>{}</instanceId><instanceType>{}</instanceType>{group}<networkNodeSet>{nodes}</networkNodeSet><availabilityZone>{}</availabilityZone><zoneId>{}</zoneId></item>",
        xml_escape(&entry.instance_id),
        xml_escape(&entry.instance_type),
        xml_escape(&entry.availability_zone),
        xml_escape(&entry.zone_id),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    fn entry(id: &str, kind: &str, nodes: &[&str]) -> InstanceTopology {
        InstanceTopology {
            instance_id: id.into(),
            instance_type: kind.into(),
            availability_zone: "us-east-1a".into(),
            zone_id: "use1-az1".into(),
            group_name: None,
            network_nodes: nodes.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("p4d.*", "p4d.24xlarge"));
        assert!(wildcard_match("trn?.32xlarge", "trn1.32xlarge"));
        assert!(!wildcard_match("p5.*", "p4d.24xlarge"));
        assert!(wildcard_match("*", ""));
    }

    #[test]
    fn rules_of_the_real_api() {
        let declared = vec![
            entry(
                "i-0123456789abcdef1",
                "p4d.24xlarge",
                &["nn-a", "nn-b", "nn-c"],
            ),
            entry("i-0123456789abcdef2", "m5.large", &[]),
        ];
        let xml = answer(
            &declared,
            &p(&[
                ("InstanceId.1", "i-0123456789abcdef1"),
                ("InstanceId.2", "i-0123456789abcdef2"),
            ]),
        )
        .expect("answer");
        assert!(xml.contains("<instanceId>i-0123456789abcdef1</instanceId>"));
        assert!(xml.contains(
            "<networkNodeSet><item>nn-a</item><item>nn-b</item><item>nn-c</item></networkNodeSet>"
        ));
        assert!(!xml.contains("abcdef2"), "an unsupported type is left out");

        let err = answer(
            &declared,
            &p(&[("InstanceId.1", "i-0123456789abcdef1"), ("MaxResults", "5")]),
        )
        .expect_err("MaxResults with ids");
        assert_eq!(err.code, "InvalidParameterCombination");
        let err = answer(&declared, &p(&[("MaxResults", "101")])).expect_err("page too big");
        assert_eq!(err.code, "InvalidParameterValue");
        let err = answer(
            &declared,
            &p(&[("Filter.1.Name", "platform"), ("Filter.1.Value.1", "x")]),
        )
        .expect_err("unknown filter");
        assert_eq!(err.code, "InvalidParameterValue");
        let ids: Vec<(String, String)> = (1..=101)
            .map(|i| (format!("InstanceId.{i}"), format!("i-{i:017x}")))
            .collect();
        assert!(answer(&declared, &ids).is_err(), "at most 100 ids");

        let filtered = answer(
            &declared,
            &p(&[
                ("Filter.1.Name", "instance-type"),
                ("Filter.1.Value.1", "p5.*"),
            ]),
        )
        .expect("answer");
        assert!(!filtered.contains("abcdef1"));
        let err = answer(&declared, &p(&[("InstanceId.1", "i-1")])).expect_err("malformed id");
        assert_eq!(err.code, "InvalidInstanceID.Malformed");
    }

    #[test]
    fn pages_by_next_token() {
        let declared: Vec<_> = (0..45)
            .map(|i| entry(&format!("i-{i:017x}"), "trn1.32xlarge", &["nn-x"]))
            .collect();
        let mut seen = 0;
        let mut token: Option<String> = None;
        let mut pages = 0;
        loop {
            let mut params = Vec::new();
            if let Some(t) = &token {
                params.push(("NextToken".to_owned(), t.clone()));
            }
            let xml = answer(&declared, &params).expect("page");
            seen += xml.matches("<instanceId>").count();
            pages += 1;
            token = xml
                .split("<nextToken>")
                .nth(1)
                .and_then(|rest| rest.split("</nextToken>").next())
                .map(str::to_owned);
            if token.is_none() {
                break;
            }
        }
        assert_eq!((seen, pages), (45, 3), "default pages of 20");
    }
}
