//! Fault rules: which calls to break, how, how often and how many times.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};

/// How a faulted call fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A 5xx answer in the service's error format: 500 is `InternalError`
    /// (EC2) or `InternalFailure` (query/JSON services), 503 is
    /// `ServiceUnavailable`.
    ServerError(u16),
    /// A 5xx answer whose body is an HTML page (`text/html`), not the
    /// service's error format: what a proxy or load balancer in front of
    /// the service sends when it, not AWS, fails.
    HtmlPage(u16),
    /// The TCP connection is reset (RST) without any response: the SDK sees a
    /// dispatch (I/O) failure.
    ConnectionReset,
    /// The call is delayed by this much on top of the configured latency,
    /// then forwarded normally.
    Latency(Duration),
    /// The service's real throttling error (EC2 503 `RequestLimitExceeded`,
    /// ELB/STS 400 `Throttling`).
    Throttle,
    /// The call is forwarded and applied by AWS, then its answer is lost:
    /// the "did my create happen?" case of a timeout or a reset after the
    /// fact. Counted as faulted and as forwarded.
    AnswerLost(AnswerLoss),
    /// Any AWS error in the service's format, e.g. 400 `DependencyViolation`.
    Error {
        /// HTTP status code.
        status: u16,
        /// AWS error code.
        code: String,
        /// Error message.
        message: String,
    },
}

/// How an applied call's answer is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerLoss {
    /// The connection is reset once the upstream has answered.
    Reset,
    /// The answer is held this long (longer than the client's attempt
    /// timeout makes it a timeout), then the connection is reset.
    Stall(Duration),
}

/// One fault to inject.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// Only this action (e.g. "DescribeInstances"); `None` = any action.
    pub action: Option<String>,
    /// Only this service ("ec2", "elasticloadbalancing" for classic ELB,
    /// "elasticloadbalancingv2", "sts"); `None` = any service.
    pub service: Option<String>,
    /// What happens to a faulted call.
    pub kind: FaultKind,
    /// Chance in [0, 1] that a matching call is faulted.
    pub probability: f64,
    /// Stop after faulting this many calls; `None` = no limit.
    pub max_count: Option<u64>,
    /// Only calls carrying every one of these (form-decoded) parameters
    /// with exactly this value, e.g. (`DryRun`, `true`) or
    /// (`RouteTableId`, `rtb-…`). Not part of the command-line form.
    pub params: Vec<(String, String)>,
    /// Never `DryRun=true` calls: a fault meant for the write itself, not
    /// for the permission check that may precede it.
    pub skip_dry_runs: bool,
}

impl FaultRule {
    /// A rule faulting every call of every service (probability 1, no limit);
    /// narrow it with the builder methods.
    pub fn new(kind: FaultKind) -> FaultRule {
        FaultRule {
            skip_dry_runs: false,
            action: None,
            service: None,
            kind,
            probability: 1.0,
            max_count: None,
            params: Vec::new(),
        }
    }

    /// Only calls whose parameter `name` is `value` (e.g. `GroupId`).
    pub fn with_param(mut self, name: impl Into<String>, value: impl Into<String>) -> FaultRule {
        self.params.push((name.into(), value.into()));
        self
    }

    /// Only `DryRun=true` calls: a permission check, as IAM answers it.
    pub fn dry_run_only(self) -> FaultRule {
        self.with_param("DryRun", "true")
    }

    /// Only calls that are not `DryRun=true`: the write, not its permission check.
    pub fn real_calls_only(mut self) -> FaultRule {
        self.skip_dry_runs = true;
        self
    }

    /// Whether the call carries every parameter the rule asks for.
    fn params_match(&self, params: &[(String, String)]) -> bool {
        let dry_run = params
            .iter()
            .any(|(n, v)| n == "DryRun" && v.eq_ignore_ascii_case("true"));
        if self.skip_dry_runs && dry_run {
            return false;
        }
        self.params
            .iter()
            .all(|(name, value)| params.iter().any(|(n, v)| n == name && v == value))
    }

    /// Only calls of `action`.
    pub fn for_action(mut self, action: impl Into<String>) -> FaultRule {
        self.action = Some(action.into());
        self
    }

    /// Only calls to `service`.
    pub fn for_service(mut self, service: impl Into<String>) -> FaultRule {
        self.service = Some(service.into());
        self
    }

    /// Fault a matching call with this probability.
    pub fn with_probability(mut self, probability: f64) -> FaultRule {
        self.probability = probability;
        self
    }

    /// Fault at most `count` calls.
    pub fn at_most(mut self, count: u64) -> FaultRule {
        self.max_count = Some(count);
        self
    }

    /// Whether the rule applies to a call of `action` on `service`.
    pub fn matches(&self, service: &str, action: &str) -> bool {
        self.service.as_deref().is_none_or(|s| s == service)
            && self.action.as_deref().is_none_or(|a| a == action)
    }

    /// Checks the rule's numbers, naming what is wrong.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.probability.is_finite() && (0.0..=1.0).contains(&self.probability)) {
            bail!(
                "fault probability must be between 0 and 1, got {}",
                self.probability
            );
        }
        match &self.kind {
            FaultKind::ServerError(status) | FaultKind::HtmlPage(status)
                if !(500..=599).contains(status) =>
            {
                bail!("a server-error fault needs a 5xx status, got {status}")
            }
            FaultKind::Error { status, code, .. } => {
                if !(400..=599).contains(status) {
                    bail!("an error fault needs a 4xx or 5xx status, got {status}");
                }
                if code.is_empty() {
                    bail!("an error fault needs a non-empty AWS error code");
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Parses the command-line form `[SERVICE/]ACTION:KIND:PROB[:MAX]`:
///
/// - `ACTION` is an action name or `*` for any; `SERVICE/` narrows the
///   service (`ec2/*`, `elasticloadbalancingv2/RegisterTargets`).
/// - `KIND` is `throttle`, `reset`, `lost-reset` or `lost-stall=MS` (the
///   call is applied, then its answer lost), a 5xx status (`500`, `503`),
///   `latency=MS` (milliseconds, `ms` suffix allowed) or
///   `error=STATUS/CODE[/MESSAGE]`.
/// - `PROB` is the probability in [0, 1]; `MAX` caps how many calls fault.
///
/// Example: `DescribeInstances:throttle:0.5`, `ec2/*:error=400/DependencyViolation/in use:1:3`.
impl FromStr for FaultRule {
    type Err = anyhow::Error;

    fn from_str(spec: &str) -> anyhow::Result<FaultRule> {
        let fields: Vec<&str> = spec.split(':').collect();
        let usage =
            "expected [SERVICE/]ACTION:KIND:PROB[:MAX], e.g. DescribeInstances:throttle:0.5";
        if !(3..=4).contains(&fields.len()) {
            bail!(
                "fault spec {spec:?} has {} ':'-separated fields; {usage}",
                fields.len()
            );
        }
        let (service, action) = match fields[0].split_once('/') {
            Some((service, action)) => (Some(service), action),
            None => (None, fields[0]),
        };
        let kind = parse_kind(fields[1]).with_context(|| format!("fault spec {spec:?}"))?;
        let probability: f64 = fields[2].parse().with_context(|| {
            format!(
                "fault spec {spec:?}: probability {:?} is not a number",
                fields[2]
            )
        })?;
        let max_count = match fields.get(3) {
            Some(max) => Some(max.parse::<u64>().with_context(|| {
                format!("fault spec {spec:?}: MAX {max:?} is not a whole number")
            })?),
            None => None,
        };
        let rule = FaultRule {
            action: (!action.is_empty() && action != "*").then(|| action.to_owned()),
            service: service
                .filter(|s| !s.is_empty() && *s != "*")
                .map(str::to_owned),
            kind,
            probability,
            max_count,
            params: Vec::new(),
            skip_dry_runs: false,
        };
        rule.validate()
            .with_context(|| format!("fault spec {spec:?}"))?;
        Ok(rule)
    }
}

fn parse_kind(text: &str) -> anyhow::Result<FaultKind> {
    let lower = text.to_ascii_lowercase();
    if lower == "throttle" {
        return Ok(FaultKind::Throttle);
    }
    if lower == "reset" {
        return Ok(FaultKind::ConnectionReset);
    }
    if lower == "lost-reset" {
        return Ok(FaultKind::AnswerLost(AnswerLoss::Reset));
    }
    if let Some(ms) = lower.strip_prefix("lost-stall=") {
        let ms = ms.strip_suffix("ms").unwrap_or(ms);
        let ms: u64 = ms
            .parse()
            .with_context(|| format!("stall {ms:?} is not a whole number of milliseconds"))?;
        return Ok(FaultKind::AnswerLost(AnswerLoss::Stall(
            Duration::from_millis(ms),
        )));
    }
    if let Some(status) = lower.strip_prefix("html=") {
        let status: u16 = status
            .parse()
            .with_context(|| format!("html status {status:?} is not an HTTP status code"))?;
        return Ok(FaultKind::HtmlPage(status));
    }
    if let Some(ms) = lower.strip_prefix("latency=") {
        let ms = ms.strip_suffix("ms").unwrap_or(ms);
        let ms: u64 = ms
            .parse()
            .with_context(|| format!("latency {ms:?} is not a whole number of milliseconds"))?;
        return Ok(FaultKind::Latency(Duration::from_millis(ms)));
    }
    if let Some(rest) = text
        .get("error=".len()..)
        .filter(|_| lower.starts_with("error="))
    {
        let mut parts = rest.splitn(3, '/');
        let status = parts.next().unwrap_or("");
        let status: u16 = status
            .parse()
            .with_context(|| format!("error status {status:?} is not an HTTP status code"))?;
        let code = parts.next().unwrap_or("").to_owned();
        let message = parts
            .next()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{code} injected by aws-fault-proxy"));
        return Ok(FaultKind::Error {
            status,
            code,
            message,
        });
    }
    if let Ok(status) = text.parse::<u16>() {
        return Ok(FaultKind::ServerError(status));
    }
    bail!(
        "unknown fault kind {text:?}: use throttle, reset, lost-reset, lost-stall=MS, 500, 503, html=STATUS, latency=MS or error=STATUS/CODE[/MESSAGE]"
    )
}

impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(service) = &self.service {
            write!(f, "{service}/")?;
        }
        write!(f, "{}:", self.action.as_deref().unwrap_or("*"))?;
        match &self.kind {
            FaultKind::ServerError(status) => write!(f, "{status}")?,
            FaultKind::HtmlPage(status) => write!(f, "html={status}")?,
            FaultKind::ConnectionReset => f.write_str("reset")?,
            FaultKind::Latency(d) => write!(f, "latency={}", d.as_millis())?,
            FaultKind::Throttle => f.write_str("throttle")?,
            FaultKind::AnswerLost(AnswerLoss::Reset) => f.write_str("lost-reset")?,
            FaultKind::AnswerLost(AnswerLoss::Stall(d)) => {
                write!(f, "lost-stall={}", d.as_millis())?
            }
            FaultKind::Error {
                status,
                code,
                message,
            } => write!(f, "error={status}/{code}/{message}")?,
        }
        write!(f, ":{}", self.probability)?;
        if let Some(max) = self.max_count {
            write!(f, ":{max}")?;
        }
        Ok(())
    }
}

/// A rule in force, with how often it has fired.
#[derive(Debug)]
pub(crate) struct ActiveRule {
    rule: FaultRule,
    fired: AtomicU64,
}

/// The rules in force, evaluated in order; the first one that fires wins.
#[derive(Debug, Default)]
pub(crate) struct ActiveRules {
    rules: Vec<ActiveRule>,
}

impl ActiveRules {
    pub(crate) fn new(rules: Vec<FaultRule>) -> ActiveRules {
        ActiveRules {
            rules: rules
                .into_iter()
                .map(|rule| ActiveRule {
                    rule,
                    fired: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// The fault to apply to a call, if any. `roll` yields uniform numbers in
    /// [0, 1) (injected so tests can be deterministic).
    #[cfg(test)]
    pub(crate) fn pick(
        &self,
        service: &str,
        action: &str,
        roll: impl FnMut() -> f64,
    ) -> Option<&FaultKind> {
        self.pick_for(service, action, &[], roll)
    }

    /// [`ActiveRules::pick`] for a call with these parameters (rules with
    /// parameter conditions match only when the call carries them).
    pub(crate) fn pick_for(
        &self,
        service: &str,
        action: &str,
        params: &[(String, String)],
        mut roll: impl FnMut() -> f64,
    ) -> Option<&FaultKind> {
        self.rules.iter().find_map(|active| {
            let rule = &active.rule;
            if !rule.matches(service, action) || !rule.params_match(params) {
                return None;
            }
            // 1.0 and 0.0 are exact: no roll can make them flaky.
            let hit =
                rule.probability >= 1.0 || (rule.probability > 0.0 && roll() < rule.probability);
            if !hit {
                return None;
            }
            // Claim one of the rule's firings; concurrent calls never push it
            // past max_count.
            let claimed = active
                .fired
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |fired| {
                    match rule.max_count {
                        Some(max) if fired >= max => None,
                        _ => Some(fired + 1),
                    }
                })
                .is_ok();
            claimed.then_some(&rule.kind)
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Each rule in force, with how many calls it has fired on.
    pub(crate) fn fired(&self) -> Vec<(FaultRule, u64)> {
        self.rules
            .iter()
            .map(|active| (active.rule.clone(), active.fired.load(Ordering::Acquire)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_command_line_specs() {
        let rule: FaultRule = "DescribeInstances:throttle:0.5"
            .parse()
            .expect("valid spec");
        assert_eq!(
            rule,
            FaultRule::new(FaultKind::Throttle)
                .for_action("DescribeInstances")
                .with_probability(0.5)
        );
        let rule: FaultRule = "*:reset:1".parse().expect("valid spec");
        assert_eq!(rule, FaultRule::new(FaultKind::ConnectionReset));
        let rule: FaultRule = "ec2/*:503:1:2".parse().expect("valid spec");
        assert_eq!(
            rule,
            FaultRule::new(FaultKind::ServerError(503))
                .for_service("ec2")
                .at_most(2)
        );
        let rule: FaultRule = "ecr/GetAuthorizationToken:html=503:1"
            .parse()
            .expect("valid spec");
        assert_eq!(rule.kind, FaultKind::HtmlPage(503));
        let again: FaultRule = rule.to_string().parse().expect("display output parses");
        assert_eq!(again, rule);
        assert!("*:html=404:1".parse::<FaultRule>().is_err(), "5xx only");
        let rule: FaultRule = "elasticloadbalancingv2/RegisterTargets:latency=250ms:0.1"
            .parse()
            .expect("valid spec");
        assert_eq!(rule.kind, FaultKind::Latency(Duration::from_millis(250)));
        assert_eq!(rule.service.as_deref(), Some("elasticloadbalancingv2"));
        let rule: FaultRule = "DeleteSecurityGroup:error=400/DependencyViolation/resource sg-1 has a dependent object:1"
            .parse()
            .expect("valid spec");
        assert_eq!(
            rule.kind,
            FaultKind::Error {
                status: 400,
                code: "DependencyViolation".into(),
                message: "resource sg-1 has a dependent object".into()
            }
        );
        // Display round-trips.
        let again: FaultRule = rule.to_string().parse().expect("display output parses");
        assert_eq!(again, rule);
        for (spec, loss) in [
            ("CreateSecurityGroup:lost-reset:1", AnswerLoss::Reset),
            (
                "ec2/CreateRoute:lost-stall=3000ms:1:1",
                AnswerLoss::Stall(Duration::from_secs(3)),
            ),
        ] {
            let rule: FaultRule = spec.parse().expect("valid spec");
            assert_eq!(rule.kind, FaultKind::AnswerLost(loss), "{spec}");
            let again: FaultRule = rule.to_string().parse().expect("display output parses");
            assert_eq!(again, rule);
        }
    }

    #[test]
    fn rejects_bad_specs_with_reasons() {
        for (spec, why) in [
            ("DescribeInstances:throttle", "fields"),
            ("DescribeInstances:explode:1", "unknown fault kind"),
            ("DescribeInstances:lost-stall=soon:1", "not a whole number"),
            ("DescribeInstances:throttle:1.5", "between 0 and 1"),
            ("DescribeInstances:404:1", "5xx"),
            ("DescribeInstances:error=200/Nope:1", "4xx or 5xx"),
            ("DescribeInstances:error=400:1", "non-empty"),
            ("DescribeInstances:latency=soon:1", "milliseconds"),
            ("DescribeInstances:throttle:1:many", "whole number"),
        ] {
            let err = spec.parse::<FaultRule>().expect_err(spec);
            let text = format!("{err:#}");
            assert!(text.contains(why), "{spec}: {text}");
        }
    }

    #[test]
    fn picks_first_matching_rule_and_honours_limits() {
        let rules = ActiveRules::new(vec![
            FaultRule::new(FaultKind::Throttle)
                .for_action("DescribeInstances")
                .at_most(2),
            FaultRule::new(FaultKind::ServerError(500)).for_service("ec2"),
        ]);
        let never = || -> f64 { panic!("probability 1 needs no roll") };
        assert_eq!(
            rules.pick("ec2", "DescribeInstances", never),
            Some(&FaultKind::Throttle)
        );
        assert_eq!(
            rules.pick("ec2", "DescribeInstances", never),
            Some(&FaultKind::Throttle)
        );
        // The first rule is spent; the second still applies.
        assert_eq!(
            rules.pick("ec2", "DescribeInstances", never),
            Some(&FaultKind::ServerError(500))
        );
        assert_eq!(
            rules.pick("elasticloadbalancingv2", "DescribeLoadBalancers", never),
            None
        );
        // Each rule's firings are counted apart.
        let fired: Vec<u64> = rules.fired().into_iter().map(|(_, n)| n).collect();
        assert_eq!(fired, vec![2, 1]);
    }

    #[test]
    fn parameter_conditions_target_dry_runs_of_one_resource() {
        let rules = ActiveRules::new(vec![
            FaultRule::new(FaultKind::Error {
                status: 403,
                code: "UnauthorizedOperation".into(),
                message: "denied".into(),
            })
            .for_action("CreateRoute")
            .dry_run_only()
            .with_param("RouteTableId", "rtb-1"),
        ]);
        let never = || -> f64 { panic!("probability 1 needs no roll") };
        let call = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let dry = call(&[("DryRun", "true"), ("RouteTableId", "rtb-1")]);
        assert!(rules.pick_for("ec2", "CreateRoute", &dry, never).is_some());
        let real = call(&[("RouteTableId", "rtb-1")]);
        assert!(rules.pick_for("ec2", "CreateRoute", &real, never).is_none());
        let other = call(&[("DryRun", "true"), ("RouteTableId", "rtb-2")]);
        assert!(
            rules
                .pick_for("ec2", "CreateRoute", &other, never)
                .is_none()
        );
        assert!(rules.pick("ec2", "CreateRoute", never).is_none());
    }

    #[test]
    fn probability_uses_the_roll() {
        let rules = ActiveRules::new(vec![
            FaultRule::new(FaultKind::Throttle).with_probability(0.25),
        ]);
        assert!(rules.pick("ec2", "X", || 0.2).is_some());
        assert!(rules.pick("ec2", "X", || 0.3).is_none());
        let never = ActiveRules::new(vec![
            FaultRule::new(FaultKind::Throttle).with_probability(0.0),
        ]);
        assert!(never.pick("ec2", "X", || 0.0).is_none());
    }
}
