//! ELBv2's refusal to give security groups to a Network Load Balancer that
//! was made without any, which moto 5.2.5 does not make (its
//! `set_security_groups` stores whatever it is sent). AWS's
//! `SetSecurityGroups`: "You can't perform this operation on a Network Load
//! Balancer unless you specified a security group for the load balancer
//! when you created it", answered `InvalidConfigurationRequest` (HTTP 400;
//! the message's wording is ours).
//!
//! The proxy tells such an NLB by the groups moto holds for it: none. An
//! NLB made with groups and later stripped of them all would be refused
//! too, which AWS may not do; the CCM never sends an empty
//! `SetSecurityGroups`. The read of moto is not counted, faulted or
//! recorded; a load balancer moto does not know is left to moto.
//!
//! Also the count of groups one load balancer may carry, which moto does
//! not bound: AWS documents 5 for an Application Load Balancer and for a
//! network interface, names no figure for an NLB, and its error code for
//! the excess is not confirmed here. So the proxy refuses a
//! `CreateLoadBalancer` or `SetSecurityGroups` naming more than 5 groups by
//! default, with a code a test may change
//! ([`super::FaultProxy::set_security_groups_per_load_balancer`]): a CCM
//! that passes must handle the refusal whatever its code.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_ELBV2;

/// Whether a `DescribeLoadBalancers` answer (of one load balancer) is an
/// NLB without security groups.
fn nlb_without_groups(xml: &str) -> bool {
    let groups = elements(xml, "SecurityGroups");
    let none = groups.iter().all(|g| elements(g, "member").is_empty());
    first(xml, "Type").as_deref() == Some("network") && none
}

/// The groups one load balancer may carry, and the refusal's code past it.
#[derive(Clone, Copy, Debug)]
pub(super) struct GroupsQuota {
    pub(super) quota: usize,
    pub(super) code: &'static str,
}

impl Default for GroupsQuota {
    fn default() -> Self {
        GroupsQuota {
            quota: 5,
            code: "InvalidConfigurationRequest",
        }
    }
}

/// The refusal of a request naming more groups than `limit` allows.
fn over_quota(limit: GroupsQuota, action: &str, params: &[(String, String)]) -> Option<AwsError> {
    if action != "SetSecurityGroups" && action != "CreateLoadBalancer" {
        return None;
    }
    let named = (params.iter())
        .filter(|(k, _)| k.starts_with("SecurityGroups.member."))
        .count();
    (named > limit.quota).then(|| {
        AwsError::new(
            400,
            limit.code,
            format!(
                "A load balancer can have at most {} security groups; {named} were given",
                limit.quota
            ),
        )
    })
}

/// AWS's refusal, when the request names more groups than a load balancer
/// may carry, or gives groups to an NLB made without.
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
    let quota = *state.groups_quota.read();
    if let Some(refusal) = over_quota(quota, action, params) {
        return Some(refusal);
    }
    if action != "SetSecurityGroups" {
        return None;
    }
    param(params, "SecurityGroups.member.1")?;
    let arn = param(params, "LoadBalancerArn")?;
    let xml = Upstream::for_call(state, headers, SERVICE_ELBV2)
        .ask(format!(
            "Action=DescribeLoadBalancers&Version=2015-12-01&LoadBalancerArns.member.1={}",
            form_escape(arn)
        ))
        .await?;
    nlb_without_groups(&xml).then(|| {
        AwsError::new(
            400,
            "InvalidConfigurationRequest",
            format!("Security groups cannot be set on Network Load Balancer '{arn}': it was created without security groups"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_groups_than_the_quota_are_refused_with_its_code() {
        let ask = |n: usize| -> Vec<(String, String)> {
            (1..=n)
                .map(|i| (format!("SecurityGroups.member.{i}"), format!("sg-{i}")))
                .chain([("LoadBalancerArn".to_string(), "arn".to_string())])
                .collect()
        };
        let quota = GroupsQuota::default();
        assert!(over_quota(quota, "SetSecurityGroups", &ask(5)).is_none());
        assert!(over_quota(quota, "CreateLoadBalancer", &ask(5)).is_none());
        let refused = over_quota(quota, "SetSecurityGroups", &ask(6)).expect("refused");
        assert_eq!(refused.code, "InvalidConfigurationRequest");
        assert_eq!(refused.status, 400);
        assert!(over_quota(quota, "CreateLoadBalancer", &ask(6)).is_some());
        assert!(over_quota(quota, "DescribeLoadBalancers", &ask(6)).is_none());
        let raised = GroupsQuota {
            quota: 6,
            code: "SomethingElse",
        };
        assert!(over_quota(raised, "SetSecurityGroups", &ask(6)).is_none());
        let lowered = GroupsQuota {
            quota: 1,
            code: "SomethingElse",
        };
        let refused = over_quota(lowered, "SetSecurityGroups", &ask(2)).expect("refused");
        assert_eq!(refused.code, "SomethingElse");
    }

    #[test]
    fn only_an_nlb_without_groups_is_refused() {
        let lb = |kind: &str, groups: &str| {
            format!(
                "<LoadBalancers><member><Type>{kind}</Type><AvailabilityZones><member><ZoneName>a</ZoneName></member></AvailabilityZones>{groups}</member></LoadBalancers>"
            )
        };
        assert!(nlb_without_groups(&lb("network", "<SecurityGroups/>")));
        assert!(nlb_without_groups(&lb("network", "")));
        assert!(nlb_without_groups(&lb(
            "network",
            "<SecurityGroups></SecurityGroups>"
        )));
        let with = "<SecurityGroups><member>sg-1</member></SecurityGroups>";
        assert!(!nlb_without_groups(&lb("network", with)));
        assert!(!nlb_without_groups(&lb("application", "<SecurityGroups/>")));
    }
}
