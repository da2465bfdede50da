//! Request limits the Elastic Load Balancing APIs enforce and moto does not:
//! at most 20 names or ARNs per `DescribeTags`, and a `PageSize` of 1 to
//! 400 on the listing calls. A request over them gets AWS's
//! `ValidationError`, so a client that batches wrongly fails here as on AWS.

use super::errors::AwsError;
use super::throttle::{SERVICE_ELB, SERVICE_ELBV2};

/// Names (classic) or ARNs (v2) one `DescribeTags` may carry.
pub const TAGS_PER_CALL: usize = 20;
/// The largest `PageSize` of `DescribeLoadBalancers` / `DescribeTargetGroups`.
pub const MAX_PAGE_SIZE: u32 = 400;

/// AWS's refusal of a request over a limit, if it is.
pub fn refuse(service: &str, action: &str, params: &[(String, String)]) -> Option<AwsError> {
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
