//! ELBv2's targets-per-load-balancer quota, which moto does not enforce.
//! With a quota of N set ([`super::FaultProxy::set_targets_per_load_balancer`]),
//! a `RegisterTargets` that would leave a load balancer holding more than N
//! targets gets AWS's 400 `TooManyTargets` and changes nothing. AWS counts
//! per load balancer, a target registered with several of its target
//! groups once per group; a target group attached to no load balancer is
//! counted alone. Registering a target the group already holds adds
//! nothing, as on AWS.
//!
//! The proxy reads the target groups and their targets from moto itself;
//! those reads are not counted, faulted or recorded. A group moto does not
//! know is left to moto's own answer. moto drops a deregistered target at
//! once, so a target that would still be draining on AWS is not counted.

use std::collections::BTreeSet;

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_ELBV2;

/// One registration: (target group ARN, target ID, port).
type Registration = (String, String, String);

/// AWS's refusal, when `RegisterTargets` would take a load balancer over
/// `quota` targets.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    let quota = (*state.target_quota.read())?;
    if (service, action) != (SERVICE_ELBV2, "RegisterTargets") {
        return None;
    }
    let arn = param(params, "TargetGroupArn")?.to_string();
    let upstream = Upstream::for_call(state, headers, SERVICE_ELBV2);
    let ask = |body: String| upstream.ask(body);
    let group = ask(format!(
        "Action=DescribeTargetGroups&Version=2015-12-01&TargetGroupArns.member.1={}",
        form_escape(&arn)
    ))
    .await?;
    let (port, load_balancers) = group_port_and_load_balancers(&group)?;
    // The groups counted together: every group of each load balancer the
    // group serves, or the group alone.
    let mut counted: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for lb in &load_balancers {
        let xml = ask(format!(
            "Action=DescribeTargetGroups&Version=2015-12-01&LoadBalancerArn={}",
            form_escape(lb)
        ))
        .await?;
        counted.push((Some(lb.clone()), group_arns(&xml)));
    }
    if counted.is_empty() {
        counted.push((None, vec![arn.clone()]));
    }
    let asked = requested(params, &arn, &port);
    for (lb, groups) in counted {
        let mut held = BTreeSet::new();
        for g in &groups {
            let xml = ask(format!(
                "Action=DescribeTargetHealth&Version=2015-12-01&TargetGroupArn={}",
                form_escape(g)
            ))
            .await?;
            held.extend(registered(&xml, g));
        }
        let after = held.union(&asked).count();
        if after > quota {
            return Some(too_many(quota, lb.is_some()));
        }
    }
    None
}

/// The refusal, in AWS's words.
fn too_many(quota: usize, per_load_balancer: bool) -> AwsError {
    let per = if per_load_balancer {
        "network load balancer"
    } else {
        "target group"
    };
    AwsError::new(
        400,
        "TooManyTargets",
        format!("You cannot have more than {quota} targets per {per}"),
    )
}

/// The port of the one group a `DescribeTargetGroups` answer holds (the
/// port of a target the request gives none) and the load balancers it
/// serves.
fn group_port_and_load_balancers(xml: &str) -> Option<(String, Vec<String>)> {
    let group = *elements(xml, "TargetGroups")
        .first()
        .map(|g| elements(g, "member"))?
        .first()?;
    let port = first(group, "Port").unwrap_or_default();
    let load_balancers = elements(group, "LoadBalancerArns")
        .into_iter()
        .flat_map(|l| elements(l, "member"))
        .map(str::to_string)
        .collect();
    Some((port, load_balancers))
}

/// The ARNs of the groups of a `DescribeTargetGroups` answer.
fn group_arns(xml: &str) -> Vec<String> {
    elements(xml, "TargetGroups")
        .into_iter()
        .flat_map(|g| elements(g, "member"))
        .filter_map(|g| first(g, "TargetGroupArn"))
        .collect()
}

/// The registrations a `DescribeTargetHealth` answer of group `arn` lists.
fn registered(xml: &str, arn: &str) -> BTreeSet<Registration> {
    elements(xml, "TargetHealthDescriptions")
        .into_iter()
        .flat_map(|d| elements(d, "member"))
        .flat_map(|m| elements(m, "Target"))
        .filter_map(|t| {
            let id = first(t, "Id")?;
            Some((arn.to_string(), id, first(t, "Port").unwrap_or_default()))
        })
        .collect()
}

/// The registrations a `RegisterTargets` asks for in group `arn`; a target
/// without a port gets the group's (`port`).
fn requested(params: &[(String, String)], arn: &str, port: &str) -> BTreeSet<Registration> {
    let value = |name: String| param(params, &name);
    (1..)
        .map_while(|i| {
            let id = value(format!("Targets.member.{i}.Id"))?;
            let port = value(format!("Targets.member.{i}.Port")).unwrap_or(port);
            Some((arn.to_string(), id.to_string(), port.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    #[test]
    fn reads_the_group_its_load_balancers_and_their_groups() {
        let one = "<DescribeTargetGroupsResult><TargetGroups><member>\
                   <TargetGroupArn>arn:tg/a</TargetGroupArn><HealthCheckPort>traffic-port</HealthCheckPort>\
                   <Port>30080</Port><LoadBalancerArns><member>arn:lb/1</member></LoadBalancerArns>\
                   </member></TargetGroups></DescribeTargetGroupsResult>";
        assert_eq!(
            group_port_and_load_balancers(one),
            Some(("30080".into(), vec!["arn:lb/1".into()]))
        );
        let alone = "<DescribeTargetGroupsResult><TargetGroups><member>\
                     <TargetGroupArn>arn:tg/a</TargetGroupArn><Port>80</Port><LoadBalancerArns/>\
                     </member></TargetGroups></DescribeTargetGroupsResult>";
        assert_eq!(
            group_port_and_load_balancers(alone),
            Some(("80".into(), vec![]))
        );
        let two = "<TargetGroups><member><TargetGroupArn>arn:tg/a</TargetGroupArn>\
                   <LoadBalancerArns><member>arn:lb/1</member></LoadBalancerArns></member>\
                   <member><TargetGroupArn>arn:tg/b</TargetGroupArn></member></TargetGroups>";
        assert_eq!(group_arns(two), ["arn:tg/a", "arn:tg/b"]);
    }

    #[test]
    fn counts_each_registration_once_and_fills_in_the_groups_port() {
        let health = "<DescribeTargetHealthResult><TargetHealthDescriptions>\
                      <member><HealthCheckPort>30080</HealthCheckPort><Target><Id>i-1</Id><Port>30080</Port></Target>\
                      <TargetHealth><State>healthy</State></TargetHealth></member>\
                      <member><Target><Id>i-2</Id><Port>30080</Port></Target></member>\
                      </TargetHealthDescriptions></DescribeTargetHealthResult>";
        let held = registered(health, "arn:tg/a");
        assert_eq!(held.len(), 2);
        let asked = requested(
            &p(&[
                ("TargetGroupArn", "arn:tg/a"),
                ("Targets.member.1.Id", "i-2"),
                ("Targets.member.2.Id", "i-3"),
                ("Targets.member.2.Port", "30080"),
            ]),
            "arn:tg/a",
            "30080",
        );
        // i-2 is held already: registering it again adds nothing.
        assert_eq!(held.union(&asked).count(), 3);
        // The same instance in another group counts again.
        let other = registered(health, "arn:tg/b");
        assert_eq!(held.union(&other).count(), 4);
    }

    #[test]
    fn the_refusal_is_awss_code() {
        let e = too_many(3, true);
        assert_eq!((e.status, e.code.as_str()), (400, "TooManyTargets"));
        assert!(
            e.message
                .contains("more than 3 targets per network load balancer")
        );
    }
}
