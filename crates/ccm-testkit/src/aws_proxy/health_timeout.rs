//! ELBv2's refusal of an NLB health-check timeout out of its rule, which
//! moto 5.2.5 does not make in full: moto's `CreateTargetGroup` checks the
//! timeout against the interval but not AWS's 2–120 s range, and its
//! `ModifyTargetGroup` checks neither. For a target group of an NLB's
//! protocols (TCP, UDP, TCP_UDP, TLS), `HealthCheckTimeoutSeconds` outside
//! 2–120, or above the health-check interval (the call's, else the
//! group's), gets AWS's `ValidationError`.
//!
//! `ModifyTargetGroup` reads the target group from moto itself (not
//! counted, faulted or recorded); a group moto does not know, or an ALB's,
//! is left to moto.

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{first, param};
use super::tg_attributes::{NLB_PROTOCOLS, nlb_target_group};
use super::throttle::SERVICE_ELBV2;

/// What AWS answers for `timeout` on an NLB's target group whose interval
/// is `interval`, if it refuses.
fn refusal(timeout: &str, interval: Option<i64>) -> Option<AwsError> {
    let refuse = |message: String| Some(AwsError::new(400, "ValidationError", message));
    let Ok(t) = timeout.parse::<i64>() else {
        return refuse(format!(
            "Health check timeout '{timeout}' is not a valid integer"
        ));
    };
    if !(2..=120).contains(&t) {
        return refuse(format!(
            "Health check timeout '{t}' must be between '2' and '120' seconds"
        ));
    }
    match interval {
        Some(i) if t > i => refuse(format!(
            "Health check timeout '{t}' must be smaller than or equal to the interval '{i}'"
        )),
        _ => None,
    }
}

/// AWS's refusal of a `CreateTargetGroup`/`ModifyTargetGroup` whose
/// health-check timeout an NLB's target group does not take.
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
    let timeout = param(params, "HealthCheckTimeoutSeconds")?;
    let interval = param(params, "HealthCheckIntervalSeconds").and_then(|i| i.parse().ok());
    match action {
        "CreateTargetGroup" => {
            let protocol = param(params, "Protocol")?;
            if !NLB_PROTOCOLS.contains(&protocol) {
                return None;
            }
            // moto compares with the interval (its default 30 when none is
            // given, as AWS's for these protocols); the range is the gap.
            refusal(timeout, None)
        }
        "ModifyTargetGroup" => {
            let (_, group) =
                nlb_target_group(state, headers, param(params, "TargetGroupArn")?).await?;
            let interval = interval.or_else(|| {
                first(&group, "HealthCheckIntervalSeconds").and_then(|i| i.parse().ok())
            });
            refusal(timeout, interval)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::refusal;

    #[test]
    fn an_nlb_timeout_is_held_to_aws_range_and_the_interval() {
        assert!(refusal("2", Some(10)).is_none());
        assert!(refusal("10", Some(10)).is_none(), "equal to the interval");
        assert!(refusal("120", None).is_none());
        for out in ["1", "121", "0", "-5", "x"] {
            let e = refusal(out, None).expect("refused");
            assert_eq!(e.code, "ValidationError", "{out}: {e:?}");
        }
        let above = refusal("20", Some(10)).expect("above the interval");
        assert!(above.message.contains("interval '10'"), "{above:?}");
    }
}
