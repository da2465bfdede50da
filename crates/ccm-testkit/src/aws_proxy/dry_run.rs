//! DryRun as EC2 answers it, for the actions the upstream emulator does not
//! honour it on.
//!
//! EC2 answers a permitted `DryRun=true` request with HTTP 412
//! `DryRunOperation` and changes nothing. moto 5.2.5 checks the flag for most
//! actions (`error_on_dryrun`), but not for `CreateRoute`, `ReplaceRoute` and
//! `DeleteRoute` (moto/ec2/responses/route_tables.py): it would carry the
//! request out and answer 200, a leniency AWS never shows. Nor for
//! `DescribeInstanceTopology`, which the proxy answers itself (moto does not
//! know it). The proxy answers those itself, after the fault rules (so an injected 403
//! `UnauthorizedOperation` still wins), and never forwards them.

use super::errors::AwsError;

/// EC2 actions moto carries out despite `DryRun=true`.
const NOT_HONOURED_UPSTREAM: &[&str] = &[
    "CreateRoute",
    "ReplaceRoute",
    "DeleteRoute",
    "DescribeInstanceTopology",
];

fn is_dry_run(params: &[(String, String)]) -> bool {
    params
        .iter()
        .any(|(k, v)| k == "DryRun" && v.eq_ignore_ascii_case("true"))
}

/// The name a call is counted under: `<Action>+DryRun` for a DryRun call.
pub(crate) fn counted_action(action: &str, params: &[(String, String)]) -> String {
    if is_dry_run(params) {
        format!("{action}+DryRun")
    } else {
        action.to_string()
    }
}

/// The answer EC2 gives a permitted DryRun call of `action`, when the
/// upstream would not give it.
pub(crate) fn answer(service: &str, action: &str, params: &[(String, String)]) -> Option<AwsError> {
    (service == "ec2" && is_dry_run(params) && NOT_HONOURED_UPSTREAM.contains(&action)).then(|| {
        AwsError::new(
            412,
            "DryRunOperation",
            "Request would have succeeded, but DryRun flag is set.",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dry_runs_of_route_actions_are_answered() {
        let dry = vec![("DryRun".to_string(), "true".to_string())];
        let answer_for = |action: &str, params: &[(String, String)]| {
            answer("ec2", action, params).map(|e| e.code)
        };
        assert_eq!(
            answer_for("CreateRoute", &dry).as_deref(),
            Some("DryRunOperation")
        );
        assert_eq!(answer_for("CreateRoute", &[]), None, "a real call");
        assert_eq!(
            answer_for("AuthorizeSecurityGroupIngress", &dry),
            None,
            "moto honours it"
        );
        assert!(answer("elasticloadbalancingv2", "CreateRoute", &dry).is_none());
        assert_eq!(counted_action("CreateRoute", &dry), "CreateRoute+DryRun");
        assert_eq!(counted_action("CreateRoute", &[]), "CreateRoute");
    }
}
