//! ELBv2's refusal of a target group attribute an NLB's target group does
//! not take, which moto does not make: moto 5.2.5 stores any key and most
//! values. `ModifyTargetGroupAttributes` on a target group of an NLB's
//! protocols (TCP, UDP, TCP_UDP, TLS) gets AWS's `ValidationError` for a key
//! AWS does not document for it ("Target group attribute key 'x' is not
//! recognized") or a value out of its range, as the ELBv2 API reference
//! (`TargetGroupAttribute`) lists them, and on a UDP or TCP_UDP group the
//! two switches AWS fixes there (client IP preservation off, connection
//! termination of unhealthy targets on).
//!
//! The proxy reads the target group from moto itself (not counted, faulted
//! or recorded); a group moto does not know, or an ALB's, is left to moto.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_ELBV2;

/// The values AWS takes for each attribute of an NLB's target group.
fn takes(key: &str, v: &str) -> Option<bool> {
    let switch = v == "true" || v == "false";
    let seconds = |hi: u32| v.parse::<u32>().is_ok_and(|n| n <= hi);
    let off_or = |hi: u32| v == "off" || v.parse::<u32>().is_ok_and(|n| (1..=hi).contains(&n));
    Some(match key {
        "deregistration_delay.timeout_seconds" => seconds(3600),
        "deregistration_delay.connection_termination.enabled"
        | "stickiness.enabled"
        | "proxy_protocol_v2.enabled"
        | "preserve_client_ip.enabled"
        | "target_health_state.unhealthy.connection_termination.enabled" => switch,
        "stickiness.type" => v == "source_ip",
        "load_balancing.cross_zone.enabled" => switch || v == "use_load_balancer_configuration",
        "target_group_health.dns_failover.minimum_healthy_targets.count" => off_or(u32::MAX),
        // The one count without `off`.
        "target_group_health.unhealthy_state_routing.minimum_healthy_targets.count" => {
            v.parse::<u32>().is_ok_and(|n| n >= 1)
        }
        "target_group_health.dns_failover.minimum_healthy_targets.percentage"
        | "target_group_health.unhealthy_state_routing.minimum_healthy_targets.percentage" => {
            off_or(100)
        }
        "target_health_state.unhealthy.draining_interval_seconds" => seconds(360_000),
        _ => return None,
    })
}

/// The request's attributes, in order.
fn attributes(params: &[(String, String)]) -> Vec<(String, String)> {
    let get = |name: String| {
        params
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
    };
    (1..)
        .map_while(|i| {
            let key = get(format!("Attributes.member.{i}.Key"))?;
            Some((
                key,
                get(format!("Attributes.member.{i}.Value")).unwrap_or_default(),
            ))
        })
        .collect()
}

/// What AWS answers for `attrs` on an NLB's target group of `protocol`, if
/// it refuses.
fn refusal(attrs: &[(String, String)], protocol: &str) -> Option<AwsError> {
    let udp = protocol == "UDP" || protocol == "TCP_UDP";
    for (key, value) in attrs {
        let fixed_for_udp = match key.as_str() {
            "preserve_client_ip.enabled" => value == "false",
            "target_health_state.unhealthy.connection_termination.enabled" => value == "true",
            _ => false,
        };
        if udp && fixed_for_udp {
            return Some(AwsError::new(
                400,
                "ValidationError",
                format!(
                    "Target group attribute '{key}' cannot be '{value}' for a target group with the '{protocol}' protocol"
                ),
            ));
        }
        match takes(key, value) {
            None => {
                return Some(AwsError::new(
                    400,
                    "ValidationError",
                    format!("Target group attribute key '{key}' is not recognized"),
                ));
            }
            Some(false) => {
                return Some(AwsError::new(
                    400,
                    "ValidationError",
                    format!("Target group attribute '{key}' has an invalid value '{value}'"),
                ));
            }
            Some(true) => {}
        }
    }
    None
}

/// The protocols of an NLB's target groups.
pub(super) const NLB_PROTOCOLS: [&str; 4] = ["TCP", "UDP", "TCP_UDP", "TLS"];

/// Target group `arn` as moto holds it (its `member` element) and its
/// protocol, when that is an NLB's; read from moto itself (not counted,
/// faulted or recorded). A group moto does not know, or an ALB's: `None`.
pub(super) async fn nlb_target_group(
    state: &State,
    headers: &HeaderMap,
    arn: &str,
) -> Option<(String, String)> {
    let xml = Upstream::for_call(state, headers, SERVICE_ELBV2)
        .ask(format!(
            "Action=DescribeTargetGroups&Version=2015-12-01&TargetGroupArns.member.1={}",
            form_escape(arn)
        ))
        .await?;
    let group = elements(&xml, "TargetGroups")
        .into_iter()
        .flat_map(|groups| elements(groups, "member"))
        .next()?;
    let protocol = first(group, "Protocol")?;
    NLB_PROTOCOLS
        .contains(&protocol.as_str())
        .then(|| (protocol, group.to_string()))
}

/// AWS's refusal of a `ModifyTargetGroupAttributes` an NLB's target group
/// does not take.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    if service != SERVICE_ELBV2 || action != "ModifyTargetGroupAttributes" {
        return None;
    }
    let attrs = attributes(params);
    // Most calls are taken whatever the protocol: only a refusal asks moto.
    refusal(&attrs, "UDP")?;
    let (protocol, _) = nlb_target_group(state, headers, param(params, "TargetGroupArn")?).await?;
    refusal(&attrs, &protocol)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal_tcp(attrs: &[(String, String)]) -> Option<AwsError> {
        refusal(attrs, "TCP")
    }

    fn attrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut params = Vec::new();
        for (i, (k, v)) in pairs.iter().enumerate() {
            params.push((format!("Attributes.member.{}.Key", i + 1), k.to_string()));
            params.push((format!("Attributes.member.{}.Value", i + 1), v.to_string()));
        }
        attributes(&params)
    }

    #[test]
    fn an_nlb_target_group_takes_only_what_aws_documents() {
        assert!(refusal_tcp(&attrs(&[("deregistration_delay.timeout_seconds", "30")])).is_none());
        assert!(
            refusal_tcp(&attrs(&[
                ("stickiness.enabled", "true"),
                ("stickiness.type", "source_ip")
            ]))
            .is_none()
        );
        let unknown =
            refusal_tcp(&attrs(&[("slow_start.duration_seconds", "30")])).expect("refused");
        assert!(unknown.message.contains("is not recognized"), "{unknown:?}");
        assert!(refusal_tcp(&attrs(&[("deregistration_delay.timeout_seconds", "3601")])).is_some());
        assert!(refusal_tcp(&attrs(&[("stickiness.type", "lb_cookie")])).is_some());
        assert!(refusal_tcp(&attrs(&[("proxy_protocol_v2.enabled", "yes")])).is_some());
        // The second attribute of a call is checked too.
        assert!(refusal_tcp(&attrs(&[("stickiness.enabled", "true"), ("bogus", "1")])).is_some());
        let routing = "target_group_health.unhealthy_state_routing.minimum_healthy_targets.count";
        assert!(refusal_tcp(&attrs(&[(routing, "off")])).is_some(), "no off");
        assert!(refusal_tcp(&attrs(&[(routing, "2")])).is_none());
    }

    #[test]
    fn a_udp_group_refuses_the_switches_aws_fixes_for_udp() {
        let no_client_ip = attrs(&[("preserve_client_ip.enabled", "false")]);
        let terminate = attrs(&[(
            "target_health_state.unhealthy.connection_termination.enabled",
            "true",
        )]);
        for udp in ["UDP", "TCP_UDP"] {
            assert!(refusal(&no_client_ip, udp).is_some());
            assert!(refusal(&terminate, udp).is_some());
        }
        assert!(refusal(&no_client_ip, "TCP").is_none());
        assert!(refusal(&terminate, "TCP").is_none());
        let keep = attrs(&[(
            "target_health_state.unhealthy.connection_termination.enabled",
            "false",
        )]);
        assert!(refusal(&keep, "UDP").is_none());
    }
}
