//! The target group attributes AWS documents for an NLB's instance target
//! groups (ELBv2 API reference, `TargetGroupAttribute`), with the values
//! AWS takes and its defaults: what `aws-load-balancer-target-group-attributes`
//! is checked against before any call, and what a key this CCM applied
//! returns to when the annotation drops it.

use std::collections::{BTreeMap, BTreeSet};

/// The values an attribute takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Values {
    /// `true` or `false`.
    Switch,
    /// A whole number in the range.
    Range(u32, u32),
    /// One of these words.
    Words(&'static [&'static str]),
    /// `off` or a whole number from 1 up to the given bound.
    OffOrUpTo(u32),
}

impl Values {
    fn takes(self, v: &str) -> bool {
        match self {
            Values::Switch => v == "true" || v == "false",
            Values::Range(lo, hi) => v.parse::<u32>().is_ok_and(|n| (lo..=hi).contains(&n)),
            Values::Words(words) => words.contains(&v),
            Values::OffOrUpTo(hi) => {
                v == "off" || v.parse::<u32>().is_ok_and(|n| (1..=hi).contains(&n))
            }
        }
    }

    fn allowed(self) -> String {
        match self {
            Values::Switch => "true or false".into(),
            Values::Range(lo, hi) => format!("a whole number from {lo} to {hi}"),
            Values::Words(words) => words.join(" or "),
            Values::OffOrUpTo(hi) => format!("off or a whole number from 1 to {hi}"),
        }
    }
}

/// One attribute: its key, values and AWS's default for an instance target
/// group of TCP or TLS (see [`default_for`] for UDP and TCP_UDP).
#[derive(Clone, Copy, Debug)]
struct Attribute {
    key: &'static str,
    values: Values,
    default: &'static str,
}

const fn a(key: &'static str, values: Values, default: &'static str) -> Attribute {
    Attribute {
        key,
        values,
        default,
    }
}

/// The two keys the Go CCM takes (it refuses every other).
pub(crate) const PRESERVE_CLIENT_IP: &str = "preserve_client_ip.enabled";
const PROXY_PROTOCOL_V2: &str = "proxy_protocol_v2.enabled";
const TERMINATE_ON_DEREGISTRATION: &str = "deregistration_delay.connection_termination.enabled";
pub(crate) const TERMINATE_UNHEALTHY: &str =
    "target_health_state.unhealthy.connection_termination.enabled";
const UNHEALTHY_DRAINING: &str = "target_health_state.unhealthy.draining_interval_seconds";

/// Every attribute AWS documents for an NLB's target groups.
const ATTRIBUTES: &[Attribute] = &[
    a(
        "deregistration_delay.timeout_seconds",
        Values::Range(0, 3600),
        "300",
    ),
    a(TERMINATE_ON_DEREGISTRATION, Values::Switch, "false"),
    a("stickiness.enabled", Values::Switch, "false"),
    a(
        "stickiness.type",
        Values::Words(&["source_ip"]),
        "source_ip",
    ),
    a(PROXY_PROTOCOL_V2, Values::Switch, "false"),
    a(PRESERVE_CLIENT_IP, Values::Switch, "true"),
    a(
        "load_balancing.cross_zone.enabled",
        Values::Words(&["true", "false", "use_load_balancer_configuration"]),
        "use_load_balancer_configuration",
    ),
    a(
        "target_group_health.dns_failover.minimum_healthy_targets.count",
        Values::OffOrUpTo(u32::MAX),
        "1",
    ),
    a(
        "target_group_health.dns_failover.minimum_healthy_targets.percentage",
        Values::OffOrUpTo(100),
        "off",
    ),
    // The only count or percentage without `off` (ELBv2 API reference).
    a(
        "target_group_health.unhealthy_state_routing.minimum_healthy_targets.count",
        Values::Range(1, u32::MAX),
        "1",
    ),
    a(
        "target_group_health.unhealthy_state_routing.minimum_healthy_targets.percentage",
        Values::OffOrUpTo(100),
        "off",
    ),
    a(TERMINATE_UNHEALTHY, Values::Switch, "true"),
    a(UNHEALTHY_DRAINING, Values::Range(0, 360_000), "0"),
];

fn attribute(key: &str) -> Option<&'static Attribute> {
    ATTRIBUTES.iter().find(|a| a.key == key)
}

/// Why AWS would refuse `key=value` on an NLB target group, if it would.
pub(crate) fn refusal(key: &str, value: &str) -> Option<String> {
    let Some(attr) = attribute(key) else {
        let keys: Vec<&str> = ATTRIBUTES.iter().map(|a| a.key).collect();
        return Some(format!(
            "{key} is not a target group attribute of an NLB; AWS takes {}",
            keys.join(", ")
        ));
    };
    (!attr.values.takes(value))
        .then(|| format!("{key} takes {}, not {value:?}", attr.values.allowed()))
}

/// Why AWS would refuse the set as a whole, if it would: the unhealthy
/// draining interval is set only where unhealthy targets' connections are
/// not terminated.
pub(crate) fn set_refusal(set: &BTreeMap<String, String>) -> Option<String> {
    let draining = set.get(UNHEALTHY_DRAINING)?;
    (draining != "0" && set.get(TERMINATE_UNHEALTHY).map(String::as_str) != Some("false")).then(
        || {
            format!(
                "{UNHEALTHY_DRAINING} is set only with {TERMINATE_UNHEALTHY}=false, as AWS requires"
            )
        },
    )
}

/// AWS's default of `attr` on a target group of `protocol`: a UDP or
/// TCP_UDP group terminates connections at the end of the deregistration
/// delay, and cannot terminate those of unhealthy targets (ELBv2 API
/// reference, `TargetGroupAttribute`).
fn default_for(attr: &Attribute, protocol: &str) -> &'static str {
    let udp = protocol == "UDP" || protocol == "TCP_UDP";
    match attr.key {
        TERMINATE_ON_DEREGISTRATION if udp => "true",
        TERMINATE_UNHEALTHY if udp => "false",
        _ => attr.default,
    }
}

/// The keys `recorded` as applied by this CCM that `want` no longer names,
/// each with AWS's default for a target group of `protocol`.
pub(crate) fn defaults_of_dropped(
    recorded: &BTreeSet<String>,
    want: &BTreeMap<String, String>,
    protocol: &str,
) -> BTreeMap<String, String> {
    recorded
        .iter()
        .filter(|k| !want.contains_key(*k))
        .filter_map(|k| Some((k.clone(), default_for(attribute(k)?, protocol).to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_checked_as_aws_checks_them() {
        assert_eq!(refusal("deregistration_delay.timeout_seconds", "120"), None);
        assert!(refusal("deregistration_delay.timeout_seconds", "3601").is_some());
        assert!(refusal("deregistration_delay.timeout_seconds", "-1").is_some());
        assert!(refusal("stickiness.type", "lb_cookie").is_some());
        assert_eq!(refusal("stickiness.type", "source_ip"), None);
        assert!(
            refusal("slow_start.duration_seconds", "30").is_some(),
            "an ALB key"
        );
        assert!(refusal("proxy_protocol_v2.enabled", "yes").is_some());
        assert_eq!(
            refusal(
                "target_group_health.dns_failover.minimum_healthy_targets.percentage",
                "off"
            ),
            None
        );
        assert!(
            refusal(
                "target_group_health.dns_failover.minimum_healthy_targets.percentage",
                "101"
            )
            .is_some()
        );
        assert!(
            refusal(
                "target_group_health.unhealthy_state_routing.minimum_healthy_targets.count",
                "0"
            )
            .is_some()
        );
        assert!(
            refusal(
                "target_group_health.unhealthy_state_routing.minimum_healthy_targets.count",
                "off"
            )
            .is_some(),
            "the one count AWS takes no `off` for"
        );
        for a in ATTRIBUTES {
            assert_eq!(
                refusal(a.key, a.default),
                None,
                "{}: its default is taken",
                a.key
            );
        }
        let set = |p: &[(&str, &str)]| -> BTreeMap<String, String> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(set_refusal(&set(&[(UNHEALTHY_DRAINING, "30")])).is_some());
        assert!(
            set_refusal(&set(&[
                (UNHEALTHY_DRAINING, "30"),
                (TERMINATE_UNHEALTHY, "false")
            ]))
            .is_none()
        );
        assert!(set_refusal(&set(&[(UNHEALTHY_DRAINING, "0")])).is_none());
    }

    #[test]
    fn a_dropped_key_returns_to_its_default() {
        let recorded: BTreeSet<String> =
            ["deregistration_delay.timeout_seconds", "stickiness.enabled"]
                .map(String::from)
                .into();
        let want = BTreeMap::from([("stickiness.enabled".to_string(), "true".to_string())]);
        assert_eq!(
            defaults_of_dropped(&recorded, &want, "TCP"),
            BTreeMap::from([(
                "deregistration_delay.timeout_seconds".to_string(),
                "300".to_string()
            )])
        );
    }

    #[test]
    fn a_udp_group_returns_to_the_defaults_aws_gives_udp() {
        let recorded: BTreeSet<String> = [TERMINATE_ON_DEREGISTRATION, TERMINATE_UNHEALTHY]
            .map(String::from)
            .into();
        let back = |protocol| defaults_of_dropped(&recorded, &BTreeMap::new(), protocol);
        let tcp = back("TCP");
        assert_eq!(tcp[TERMINATE_ON_DEREGISTRATION], "false");
        assert_eq!(tcp[TERMINATE_UNHEALTHY], "true");
        for udp in ["UDP", "TCP_UDP"] {
            let udp = back(udp);
            assert_eq!(udp[TERMINATE_ON_DEREGISTRATION], "true");
            assert_eq!(udp[TERMINATE_UNHEALTHY], "false", "AWS refuses true there");
        }
    }
}
