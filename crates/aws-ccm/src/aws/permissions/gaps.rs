//! Actions this CCM calls that published policies lack: kOps' own CCM
//! policy (`AddCCMPermissions`; `iam/kops-ccm-actions.txt`) and the Go CCM's
//! documented one. Under such a policy every sync would fail on them, so the
//! start-up self-check asks once for those it can ask without side effects,
//! and reports each missing one with the exact fix:
//! - `elasticloadbalancing:DescribeTags` (both ELB APIs): a real describe of
//!   a load balancer that does not exist; IAM answers before the lookup, so
//!   `AccessDenied` means the policy lacks it, any other answer that it
//!   grants it.
//! - `ec2:ReplaceRoute`: a `DryRun` on a route table the route controller
//!   writes (kOps grants `CreateRoute` and `DeleteRoute` only).
//!
//! The tag-conditioned load balancer writes (`SetSubnets`,
//! `SetIpAddressType`, `SetSecurityGroups`, tag-on-create `AddTags`) have no
//! `DryRun`; a denial of them at the first use carries the same fix in its
//! error ([`fix_for`]).

use ipnet::IpNet;

use super::super::Aws;
use super::super::client::DryRun;
use super::super::client::operations::{KOPS_GAPS, Operation};
use crate::provider::routes::{RouteTableSelector, Routes};

/// The load balancer name the describe probes ask about: a valid name this
/// CCM never makes (its names are 32 hex digits).
const PROBE_LB_NAME: &str = "aws-ccm-permission-probe";

/// One action the policy lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Gap {
    /// The IAM action, e.g. `elasticloadbalancing:DescribeTags`.
    pub(crate) action: &'static str,
    /// What AWS said.
    message: String,
}

impl Gap {
    /// The log and event text: the action, AWS's answer and the fix.
    pub(crate) fn describe(&self, cluster_id: &str) -> String {
        format!(
            "the IAM policy lacks {}, which load balancer and route syncs call ({}); {}",
            self.action,
            self.message,
            fix_for(self.action, cluster_id).unwrap_or_else(|| "add it to the policy".into())
        )
    }
}

/// The fix for an action of [`KOPS_GAPS`] (kept beside the operations, as
/// the door's refusal hint names it too), for a policy made by kOps or
/// rendered from `iam/`.
fn fix_for(action: &str, cluster_id: &str) -> Option<String> {
    let cluster = if cluster_id.is_empty() {
        "<cluster>"
    } else {
        cluster_id
    };
    KOPS_GAPS.contains(&action).then(|| {
        format!(
            "with kOps' own policy, add the output of `iam/render.sh policy {cluster} --kops-additions` \
             under spec.additionalPolicies.control-plane (docs/install-kops.md, option 1); otherwise \
             use the policy `iam/render.sh policy {cluster}` prints"
        )
    })
}

/// Asks for each action: the describes when load balancers are managed, the
/// `ReplaceRoute` DryRun when routes are (on the first table found).
pub(crate) async fn probe(
    aws: &Aws,
    load_balancers: bool,
    routes: Option<&(RouteTableSelector, IpNet)>,
) -> Vec<Gap> {
    let mut out = Vec::new();
    if load_balancers {
        let classic = aws
            .elb(Operation::ElbDescribeTags, |c| {
                c.describe_tags().load_balancer_names(PROBE_LB_NAME).send()
            })
            .await;
        if let Err(e) = &classic
            && e.is_denied()
        {
            out.push(gap("elasticloadbalancing:DescribeTags", e.message()));
        }
        let permissions = aws.memory().permissions();
        let region = permissions.region();
        let arn = format!(
            "arn:{}:elasticloadbalancing:{region}:{}:loadbalancer/net/{PROBE_LB_NAME}/0000000000000000",
            super::partition(region),
            permissions
                .account()
                .unwrap_or_else(|| "000000000000".into()),
        );
        let v2 = aws
            .elbv2(Operation::Elbv2DescribeTags, |c| {
                c.describe_tags().resource_arns(arn.clone()).send()
            })
            .await;
        if let Err(e) = v2
            && e.is_denied()
            && out.is_empty()
        {
            out.push(gap("elasticloadbalancing:DescribeTags", e.message()));
        }
    }
    if let Some((selector, destination)) = routes {
        let tables = match aws.route_tables(selector).await {
            Ok(tables) => tables,
            Err(e) => {
                tracing::warn!(error = %e, "permission self-check: cannot list the route tables");
                Vec::new()
            }
        };
        let instance = aws.cluster_instances().await.ok().and_then(|all| {
            all.iter()
                .find(|i| !i.state.is_terminated())
                .map(|i| i.id.to_string())
        });
        if let (Some(table), Some(instance)) = (tables.first(), instance) {
            let answer = aws
                .dry_run(Operation::Ec2ReplaceRoute, |ec2: aws_sdk_ec2::Client| {
                    let call = ec2
                        .replace_route()
                        .dry_run(true)
                        .route_table_id(&table.id)
                        .instance_id(&instance);
                    match destination {
                        IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
                        IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
                    }
                    .send()
                })
                .await;
            if let Ok(DryRun::Denied { message }) = answer {
                out.push(gap("ec2:ReplaceRoute", message));
            }
        }
    }
    out
}

fn gap(action: &'static str, message: String) -> Gap {
    Gap { action, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fix_names_the_kops_additions_for_the_cluster() {
        let fix = fix_for("elasticloadbalancing:SetSubnets", "k.example.com").unwrap();
        assert!(
            fix.contains("iam/render.sh policy k.example.com --kops-additions"),
            "{fix}"
        );
        assert!(fix.contains("additionalPolicies"), "{fix}");
        assert_eq!(fix_for("ec2:DescribeInstances", "k"), None);
        let text = gap("ec2:ReplaceRoute", "UnauthorizedOperation".into()).describe("");
        assert!(
            text.contains("ec2:ReplaceRoute") && text.contains("policy <cluster> --kops-additions"),
            "{text}"
        );
    }
}
