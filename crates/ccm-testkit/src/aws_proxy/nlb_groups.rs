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

/// AWS's refusal, when the request gives groups to an NLB made without.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    if service != SERVICE_ELBV2 || action != "SetSecurityGroups" {
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
