//! ELBv2's refusal to delete a load balancer whose `deletion_protection.enabled`
//! attribute is `true`, which moto 5.2.5 does not make (its
//! `delete_load_balancer` drops the load balancer whatever its attributes):
//! AWS answers `DeleteLoadBalancer` with `OperationNotPermitted` (HTTP 400),
//! "Load balancer '<arn>' cannot be deleted because deletion protection is
//! enabled", and deletes nothing.
//!
//! The proxy reads the attribute from moto itself; that read is not counted,
//! faulted or recorded. A load balancer moto does not know is left to moto's
//! own answer.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{ask_upstream_as, elements, first, form_escape};
use super::request::signing_region;
use super::throttle::SERVICE_ELBV2;

/// The load balancer a `DeleteLoadBalancer` names.
fn target<'a>(service: &str, action: &str, params: &'a [(String, String)]) -> Option<&'a str> {
    if service != SERVICE_ELBV2 || action != "DeleteLoadBalancer" {
        return None;
    }
    params
        .iter()
        .find(|(k, _)| k == "LoadBalancerArn")
        .map(|(_, v)| v.as_str())
}

/// Whether a `DescribeLoadBalancerAttributes` answer has deletion
/// protection on.
fn protected(xml: &str) -> bool {
    elements(xml, "Attributes")
        .into_iter()
        .flat_map(|set| elements(set, "member"))
        .any(|a| {
            first(a, "Key").as_deref() == Some("deletion_protection.enabled")
                && first(a, "Value").as_deref() == Some("true")
        })
}

/// AWS's refusal, when the request deletes a protected load balancer.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    let arn = target(service, action, params)?;
    let region = signing_region(headers).unwrap_or_else(|| "us-east-1".into());
    let body = format!(
        "Action=DescribeLoadBalancerAttributes&Version=2015-12-01&LoadBalancerArn={}",
        form_escape(arn)
    );
    let xml = ask_upstream_as(state, SERVICE_ELBV2, &region, body).await?;
    protected(&xml).then(|| {
        AwsError::new(
            400,
            "OperationNotPermitted",
            format!(
                "Load balancer '{arn}' cannot be deleted because deletion protection is enabled"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    #[test]
    fn only_elbv2_deletes_are_checked() {
        let params = p(&[("LoadBalancerArn", "arn:lb")]);
        assert_eq!(
            target(SERVICE_ELBV2, "DeleteLoadBalancer", &params),
            Some("arn:lb")
        );
        assert_eq!(target(SERVICE_ELBV2, "DeleteTargetGroup", &params), None);
        assert_eq!(
            target("elasticloadbalancing", "DeleteLoadBalancer", &params),
            None,
            "a classic ELB has no deletion protection"
        );
    }

    #[test]
    fn reads_the_attribute() {
        let answer = |value: &str| {
            format!(
                "<DescribeLoadBalancerAttributesResult><Attributes>\
                 <member><Key>load_balancing.cross_zone.enabled</Key><Value>true</Value></member>\
                 <member><Key>deletion_protection.enabled</Key><Value>{value}</Value></member>\
                 </Attributes></DescribeLoadBalancerAttributesResult>"
            )
        };
        assert!(protected(&answer("true")));
        assert!(!protected(&answer("false")));
        assert!(!protected("<DescribeLoadBalancerAttributesResult/>"));
    }
}
