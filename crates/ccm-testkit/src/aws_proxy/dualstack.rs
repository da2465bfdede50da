//! ELBv2's refusal of a dual-stack load balancer in a subnet without IPv6,
//! which moto does not make: `CreateLoadBalancer` with `IpAddressType`
//! `dualstack` (or `dualstack-without-public-ipv4`) and `SetIpAddressType`
//! to one of them get AWS's `ValidationError` ("You must specify subnets with
//! an associated IPv6 CIDR block.") unless every subnet of the load balancer
//! has an IPv6 CIDR block in the `associated` state.
//!
//! The proxy reads the subnets (and, for `SetIpAddressType`, the load
//! balancer) from moto itself; those reads are not counted, faulted or
//! recorded. A subnet or load balancer moto does not know is left to moto's
//! own answer.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{ask_upstream_as, elements, first, form_escape};
use super::request::signing_region;
use super::throttle::{SERVICE_EC2, SERVICE_ELBV2};

const DUAL_STACK: [&str; 2] = ["dualstack", "dualstack-without-public-ipv4"];

/// AWS's message, word for word.
const MESSAGE: &str = "You must specify subnets with an associated IPv6 CIDR block.";

/// The load balancer a dual-stack request puts in subnets, as the request
/// names them.
#[derive(Debug, PartialEq)]
enum Target {
    /// `CreateLoadBalancer`: the subnets it lists.
    Subnets(Vec<String>),
    /// `SetIpAddressType`: the subnets the load balancer is in.
    LoadBalancer(String),
}

fn target(service: &str, action: &str, params: &[(String, String)]) -> Option<Target> {
    if service != SERVICE_ELBV2 {
        return None;
    }
    let value = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    if !value("IpAddressType").is_some_and(|t| DUAL_STACK.contains(&t.as_str())) {
        return None;
    }
    match action {
        "CreateLoadBalancer" => {
            let subnets = params
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("Subnets.member.")
                        || (k.starts_with("SubnetMappings.member.") && k.ends_with(".SubnetId"))
                })
                .map(|(_, v)| v.clone())
                .collect();
            Some(Target::Subnets(subnets))
        }
        "SetIpAddressType" => value("LoadBalancerArn").cloned().map(Target::LoadBalancer),
        _ => None,
    }
}

/// AWS's refusal, when the request makes a dual-stack load balancer in a
/// subnet without IPv6.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    let region = signing_region(headers).unwrap_or_else(|| "us-east-1".into());
    let subnets = match target(service, action, params)? {
        Target::Subnets(subnets) => subnets,
        Target::LoadBalancer(arn) => {
            let body = format!(
                "Action=DescribeLoadBalancers&Version=2015-12-01&LoadBalancerArns.member.1={}",
                form_escape(&arn)
            );
            let xml = ask_upstream_as(state, SERVICE_ELBV2, &region, body).await?;
            load_balancer_subnets(&xml)
        }
    };
    for subnet in subnets {
        let body = format!(
            "Action=DescribeSubnets&Version=2016-11-15&SubnetId.1={}",
            form_escape(&subnet)
        );
        let Some(xml) = ask_upstream_as(state, SERVICE_EC2, &region, body).await else {
            continue;
        };
        if !elements(&xml, "subnetSet").is_empty() && !has_ipv6(&xml) {
            return Some(AwsError::new(400, "ValidationError", MESSAGE));
        }
    }
    None
}

/// The subnets of a `DescribeLoadBalancers` answer.
fn load_balancer_subnets(xml: &str) -> Vec<String> {
    elements(xml, "AvailabilityZones")
        .into_iter()
        .flat_map(|zones| elements(zones, "member"))
        .filter_map(|zone| first(zone, "SubnetId"))
        .collect()
}

/// Whether the (one) subnet of a `DescribeSubnets` answer has an associated
/// IPv6 CIDR block.
fn has_ipv6(xml: &str) -> bool {
    elements(xml, "ipv6CidrBlockAssociationSet")
        .into_iter()
        .flat_map(|set| elements(set, "item"))
        .any(|item| {
            first(item, "ipv6CidrBlock").is_some_and(|c| !c.is_empty())
                && elements(item, "ipv6CidrBlockState")
                    .first()
                    .and_then(|s| first(s, "state"))
                    .as_deref()
                    .map(moto_state)
                    == Some("associated")
        })
}

/// A state as AWS writes it (`associated`). moto 5.2.5 writes a subnet's
/// IPv6 association state as the Python dict it keeps
/// (`{'State': 'associated'}`): its value is read out of it.
fn moto_state(text: &str) -> &str {
    match text.strip_prefix("{'State': '") {
        Some(rest) => rest.strip_suffix("'}").unwrap_or(rest),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    #[test]
    fn only_dual_stack_requests_are_checked() {
        let create = |kind: &str| {
            p(&[
                ("IpAddressType", kind),
                ("Subnets.member.1", "subnet-a"),
                ("SubnetMappings.member.1.SubnetId", "subnet-b"),
                ("SubnetMappings.member.1.AllocationId", "eipalloc-1"),
            ])
        };
        assert_eq!(
            target(SERVICE_ELBV2, "CreateLoadBalancer", &create("dualstack")),
            Some(Target::Subnets(vec!["subnet-a".into(), "subnet-b".into()]))
        );
        assert!(
            target(
                SERVICE_ELBV2,
                "CreateLoadBalancer",
                &create("dualstack-without-public-ipv4")
            )
            .is_some()
        );
        assert_eq!(
            target(SERVICE_ELBV2, "CreateLoadBalancer", &create("ipv4")),
            None
        );
        assert_eq!(
            target(
                "elasticloadbalancing",
                "CreateLoadBalancer",
                &create("dualstack")
            ),
            None,
            "the Classic ELB API has no address type"
        );
        let set = p(&[
            ("IpAddressType", "dualstack"),
            ("LoadBalancerArn", "arn:lb"),
        ]);
        assert_eq!(
            target(SERVICE_ELBV2, "SetIpAddressType", &set),
            Some(Target::LoadBalancer("arn:lb".into()))
        );
    }

    #[test]
    fn reads_subnets_and_their_ipv6_state() {
        let lb = "<DescribeLoadBalancersResult><LoadBalancers><member><AvailabilityZones>\
                  <member><SubnetId>subnet-1</SubnetId><ZoneName>us-east-1a</ZoneName></member>\
                  <member><SubnetId>subnet-2</SubnetId></member></AvailabilityZones></member>\
                  </LoadBalancers></DescribeLoadBalancersResult>";
        assert_eq!(load_balancer_subnets(lb), ["subnet-1", "subnet-2"]);

        let subnet = |associations: &str| {
            format!(
                "<DescribeSubnetsResponse><subnetSet><item><subnetId>subnet-1</subnetId>\
                 <ipv6CidrBlockAssociationSet>{associations}</ipv6CidrBlockAssociationSet>\
                 </item></subnetSet></DescribeSubnetsResponse>"
            )
        };
        let association = |state: &str| {
            format!(
                "<item><ipv6CidrBlock>2600:1f18::/64</ipv6CidrBlock><associationId>a</associationId>\
                 <ipv6CidrBlockState><state>{state}</state></ipv6CidrBlockState></item>"
            )
        };
        assert!(has_ipv6(&subnet(&association("associated"))));
        assert!(
            has_ipv6(&subnet(&association("{'State': 'associated'}"))),
            "as moto writes it"
        );
        assert!(!has_ipv6(&subnet(&association(
            "{'State': 'disassociated'}"
        ))));
        assert!(!has_ipv6(&subnet(&association("disassociated"))));
        assert!(!has_ipv6(&subnet("")));
        assert!(!has_ipv6(
            "<DescribeSubnetsResponse><subnetSet><item><subnetId>s</subnetId></item></subnetSet></DescribeSubnetsResponse>"
        ));
    }
}
