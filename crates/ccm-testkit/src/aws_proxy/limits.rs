//! Request limits the Elastic Load Balancing APIs enforce and moto does not:
//! at most 20 names or ARNs per `DescribeTags`, and a `PageSize` of 1 to
//! 400 on the listing calls. A request over them gets AWS's
//! `ValidationError`, so a client that batches wrongly fails here as on AWS.
//! The tags of `AddTags` and of the creates that carry tags are held to
//! AWS's `Tag` rules too (a key of 1 to 128, a value of at most 256 letters,
//! digits, spaces and `_.:/=+-@`, no `aws:` prefix, at most 50 in a call),
//! which moto does not check.

use super::errors::AwsError;
use super::throttle::{SERVICE_ELB, SERVICE_ELBV2};

/// Names (classic) or ARNs (v2) one `DescribeTags` may carry.
pub const TAGS_PER_CALL: usize = 20;
/// The largest `PageSize` of `DescribeLoadBalancers` / `DescribeTargetGroups`.
pub const MAX_PAGE_SIZE: u32 = 400;

/// Most tags one load balancer, listener or target group takes.
pub const MAX_TAGS: usize = 50;

/// AWS's refusal of the tags a tagging call carries, if it refuses them.
fn refuse_tags(service: &str, action: &str, params: &[(String, String)]) -> Option<AwsError> {
    let tagging = matches!(
        action,
        "AddTags" | "CreateLoadBalancer" | "CreateTargetGroup" | "CreateListener"
    );
    if !tagging || (service != SERVICE_ELB && service != SERVICE_ELBV2) {
        return None;
    }
    let get = |name: String| params.iter().find(|(k, _)| *k == name).map(|(_, v)| v);
    let tags: Vec<(&String, Option<&String>)> = (1..)
        .map_while(|i| {
            let key = get(format!("Tags.member.{i}.Key"))?;
            Some((key, get(format!("Tags.member.{i}.Value"))))
        })
        .collect();
    if tags.len() > MAX_TAGS {
        return Some(AwsError::new(
            400,
            "TooManyTags",
            format!(
                "The quota for the number of tags that can be assigned to a load balancer has been reached ({} given, at most {MAX_TAGS})",
                tags.len()
            ),
        ));
    }
    let allowed = |c: char| c.is_alphanumeric() || c == ' ' || "_.:/=+-@".contains(c);
    for (i, (key, value)) in tags.iter().enumerate() {
        let at = i + 1;
        let value = value.map(String::as_str).unwrap_or_default();
        let broken = if key.is_empty() || key.chars().count() > 128 {
            Some(format!(
                "Value '{key}' at 'tags.{at}.member.key' failed to satisfy constraint: Member must have length between 1 and 128"
            ))
        } else if value.chars().count() > 256 {
            Some(format!(
                "Value '{value}' at 'tags.{at}.member.value' failed to satisfy constraint: Member must have length less than or equal to 256"
            ))
        } else if !key.chars().chain(value.chars()).all(allowed) {
            Some(format!(
                "Value at 'tags.{at}.member' failed to satisfy constraint: Member must satisfy regular expression pattern: ^([\\p{{L}}\\p{{Z}}\\p{{N}}_.:/=+\\-@]*)$"
            ))
        } else if key.to_ascii_lowercase().starts_with("aws:") {
            Some(format!(
                "Tag key '{key}' is invalid: the 'aws:' prefix is reserved"
            ))
        } else {
            None
        };
        if let Some(message) = broken {
            return Some(validation(message));
        }
    }
    None
}

/// AWS's refusal of a request over a limit, if it is.
pub fn refuse(service: &str, action: &str, params: &[(String, String)]) -> Option<AwsError> {
    if let Some(refusal) = refuse_tags(service, action, params) {
        return Some(refusal);
    }
    let members = |list: &str| {
        let prefix = format!("{list}.member.");
        params
            .iter()
            .filter(|(k, _)| k.starts_with(&prefix))
            .count()
    };
    // The list parameter, and its name in AWS's message.
    let tags_list = match (service, action) {
        (SERVICE_ELB, "DescribeTags") => Some(("LoadBalancerNames", "loadBalancerNames")),
        (SERVICE_ELBV2, "DescribeTags") => Some(("ResourceArns", "resourceArns")),
        _ => None,
    };
    if let Some((list, shown)) = tags_list {
        let n = members(list);
        if n > TAGS_PER_CALL {
            return Some(validation(format!(
                "1 validation error detected: Value at '{shown}' failed to satisfy constraint: Member must have length less than or equal to {TAGS_PER_CALL} ({n} given)"
            )));
        }
    }
    let pages = matches!(
        (service, action),
        (SERVICE_ELB, "DescribeLoadBalancers")
            | (
                SERVICE_ELBV2,
                "DescribeLoadBalancers" | "DescribeTargetGroups"
            )
    );
    let size = params.iter().find(|(k, _)| k == "PageSize").map(|(_, v)| v);
    match size.map(|v| v.parse::<u32>()) {
        Some(Ok(n)) if pages && (n == 0 || n > MAX_PAGE_SIZE) => Some(validation(format!(
            "1 validation error detected: Value '{n}' at 'pageSize' failed to satisfy constraint: Member must have value between 1 and {MAX_PAGE_SIZE}"
        ))),
        Some(Err(_)) if pages => Some(validation("PageSize must be a number".to_string())),
        _ => None,
    }
}

fn validation(message: String) -> AwsError {
    AwsError::new(400, "ValidationError", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &str, n: usize) -> Vec<(String, String)> {
        (1..=n)
            .map(|i| (format!("{list}.member.{i}"), format!("x{i}")))
            .collect()
    }

    #[test]
    fn describe_tags_takes_at_most_twenty() {
        assert!(
            refuse(
                SERVICE_ELB,
                "DescribeTags",
                &params("LoadBalancerNames", 20)
            )
            .is_none()
        );
        let err = refuse(
            SERVICE_ELB,
            "DescribeTags",
            &params("LoadBalancerNames", 21),
        )
        .expect("21 names are refused");
        assert_eq!(err.code, "ValidationError");
        assert!(refuse(SERVICE_ELBV2, "DescribeTags", &params("ResourceArns", 21)).is_some());
        assert!(refuse(SERVICE_ELBV2, "DescribeTags", &params("ResourceArns", 20)).is_none());
    }

    fn tagged(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (i, (k, v)) in pairs.iter().enumerate() {
            out.push((format!("Tags.member.{}.Key", i + 1), k.to_string()));
            out.push((format!("Tags.member.{}.Value", i + 1), v.to_string()));
        }
        out
    }

    #[test]
    fn tags_are_held_to_awss_rules() {
        let ok = tagged(&[("team", "a b/c=d+e-f@g_h.i:j"), ("équipe", "")]);
        for action in [
            "AddTags",
            "CreateLoadBalancer",
            "CreateTargetGroup",
            "CreateListener",
        ] {
            assert!(refuse(SERVICE_ELBV2, action, &ok).is_none(), "{action}");
        }
        let long_key = "k".repeat(129);
        let long_value = "v".repeat(257);
        for pairs in [
            vec![("aws:team", "a")],
            vec![(long_key.as_str(), "a")],
            vec![("team", long_value.as_str())],
            vec![("team", "a"), ("team2", "a#b")],
            // A record of keys in the form the CCM wrote it before: AWS
            // refuses the comma (moto takes it).
            vec![("kubernetes.io/cloud-controller/managed-tags", "env,team")],
        ] {
            let err = refuse(SERVICE_ELBV2, "AddTags", &tagged(&pairs)).expect("refused");
            assert_eq!(err.code, "ValidationError", "{pairs:?}");
            assert!(refuse(SERVICE_ELB, "AddTags", &tagged(&pairs)).is_some());
        }
        let keys: Vec<String> = (0..=MAX_TAGS).map(|i| format!("k{i}")).collect();
        let many: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
        let err = refuse(SERVICE_ELBV2, "CreateLoadBalancer", &tagged(&many)).expect("51 tags");
        assert_eq!(err.code, "TooManyTags");
        assert!(
            refuse(
                SERVICE_ELBV2,
                "CreateLoadBalancer",
                &tagged(&many[..MAX_TAGS])
            )
            .is_none()
        );
        // Other calls are not looked at.
        assert!(refuse(SERVICE_ELBV2, "ModifyListener", &tagged(&[("aws:x", "")])).is_none());
    }

    #[test]
    fn page_size_is_one_to_four_hundred() {
        let size = |v: &str| vec![("PageSize".to_string(), v.to_string())];
        assert!(refuse(SERVICE_ELBV2, "DescribeLoadBalancers", &size("400")).is_none());
        assert!(refuse(SERVICE_ELBV2, "DescribeLoadBalancers", &size("401")).is_some());
        assert!(refuse(SERVICE_ELB, "DescribeLoadBalancers", &size("0")).is_some());
        assert!(refuse(SERVICE_ELBV2, "DescribeTargetGroups", &size("500")).is_some());
        assert!(refuse(SERVICE_ELBV2, "DescribeListeners", &size("500")).is_none());
    }
}
