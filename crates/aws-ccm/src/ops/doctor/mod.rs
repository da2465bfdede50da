//! `aws-ccm doctor`: reads the cluster and AWS, changes nothing, and says
//! for each thing the CCM depends on whether it is right, with the exact
//! fix when it is not. Every check runs the CCM's own code: the cluster ID
//! and region as start-up resolves them ([`crate::manager`]), the subnet
//! choice of a load balancer sync ([`crate::aws::subnets`]), the node
//! security group choice ([`crate::aws::security_groups::node_group_of`]),
//! the route controller's tables and capacity warning, the start-up
//! permission self-check ([`crate::controllers::permission_check`]) and
//! node IPAM's sign of another allocator
//! ([`crate::controllers::node_ipam::start_up_signs`]).
//!
//! - [`identity`]: credentials, region, cluster ID;
//! - [`cloud`]: instances, subnets, route tables, security groups;
//! - [`iam`]: the permission self-check, and the ELB writes by IAM's
//!   policy simulator ([`simulation`]);
//! - [`kube`]: Nodes, kubelets, RBAC, IPAM, the leader Lease.

use std::fmt::Write as _;

use serde::Serialize;

use super::Context;

mod cloud;
mod iam;
pub(crate) mod identity;
mod kube;
mod simulation;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Pass,
    /// Works, but not as it should (it may break later); not a failure.
    Warn,
    Fail,
    /// Does not apply with these flags (e.g. routes off).
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One line of the checklist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Check {
    /// `aws`, `cluster`, `instances`, `subnets`, `route-tables`,
    /// `security-groups`, `iam` or `kubernetes`.
    section: &'static str,
    /// What was checked (`credentials`, `us-east-1a internet-facing`, ...).
    name: String,
    status: Status,
    /// What was found.
    detail: String,
    /// The exact fix, for a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

impl Check {
    /// The check of `name` in `section`; its verdict follows
    /// ([`Check::pass`], [`Check::skip`], [`Check::warn`], [`Check::fail`]).
    pub(crate) fn of(section: &'static str, name: impl Into<String>) -> CheckBuilder {
        CheckBuilder(section, name.into())
    }
}

/// [`Check::of`]`(section, name)` then the verdict.
pub(crate) struct CheckBuilder(&'static str, String);

impl CheckBuilder {
    fn with(self, status: Status, detail: impl Into<String>, fix: Option<String>) -> Check {
        Check {
            section: self.0,
            name: self.1,
            status,
            detail: detail.into(),
            fix,
        }
    }

    pub(crate) fn pass(self, detail: impl Into<String>) -> Check {
        self.with(Status::Pass, detail, None)
    }

    fn skip(self, detail: impl Into<String>) -> Check {
        self.with(Status::Skip, detail, None)
    }

    pub(crate) fn warn(self, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        self.with(Status::Warn, detail, Some(fix.into()))
    }

    pub(crate) fn fail(self, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        self.with(Status::Fail, detail, Some(fix.into()))
    }
}

/// The whole checklist.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    cluster_id: String,
    region: String,
    checks: Vec<Check>,
}

impl Report {
    /// Whether any check failed (the tool then exits non-zero).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }

    fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }
}

/// Runs every check against the cluster and AWS of `ctx`. `role_arn` is
/// the CCM's role, whose ELB writes IAM's simulator checks; when `None`,
/// the ServiceAccount's IRSA annotation, else the caller's identity.
pub async fn run(ctx: &Context, role_arn: Option<&str>) -> Report {
    let mut checks = identity::checks(ctx).await;
    let nodes = match kube::list_nodes(&ctx.kube).await {
        Ok(nodes) => nodes,
        Err(e) => {
            checks.push(Check::of("kubernetes", "Nodes").fail(
                format!("{e:#}"),
                "the kubeconfig's user needs list on nodes (the CCM's ClusterRole grants it); the Node checks below see no Node",
            ));
            Vec::new()
        }
    };
    let now = k8s_openapi::jiff::Timestamp::now();
    let found = cloud::NodeInstances::find(ctx, &nodes).await;
    checks.extend(found.checks(ctx));
    checks.extend(cloud::subnet_checks(ctx, &found).await);
    checks.extend(cloud::route_table_checks(ctx, &found).await);
    checks.extend(cloud::security_group_checks(ctx, &found).await);
    checks.extend(iam::checks(ctx, role_arn).await);
    checks.extend(kube::node_checks(&nodes, now));
    checks.extend(kube::rbac_checks(ctx).await);
    checks.push(kube::ipam_check(ctx, &nodes));
    checks.push(kube::lease_check(ctx, now).await);
    Report {
        cluster_id: ctx.cluster_id.clone(),
        region: ctx.region.clone(),
        checks,
    }
}

/// The report when AWS or the cluster could not even be reached: start-up
/// itself would fail this way.
pub fn unreachable(error: &anyhow::Error) -> Report {
    Report {
        cluster_id: String::new(),
        region: String::new(),
        checks: vec![Check::of("aws", "start-up").fail(
            format!("{error:#}"),
            "the message names the setting to change (cloud.conf, flags, kubeconfig); the CCM stops at start-up the same way",
        )],
    }
}

/// The checklist for people: one line a check, its fix under it.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "aws-ccm doctor: cluster {:?}, region {:?}",
        report.cluster_id, report.region
    );
    let mut section = "";
    for c in &report.checks {
        if c.section != section {
            section = c.section;
            let _ = writeln!(out, "\n{section}");
        }
        let _ = writeln!(out, "  [{}] {}: {}", c.status.label(), c.name, c.detail);
        if let Some(fix) = &c.fix {
            let _ = writeln!(out, "         fix: {fix}");
        }
    }
    let _ = writeln!(
        out,
        "\n{} checks: {} passed, {} warnings, {} failed, {} skipped",
        report.checks.len(),
        report.count(Status::Pass),
        report.count(Status::Warn),
        report.count(Status::Fail),
        report.count(Status::Skip)
    );
    out
}

/// At most `n` items of a list, then "and N more".
fn first(items: &[String], n: usize) -> String {
    let mut out = items.iter().take(n).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > n {
        let _ = write!(out, "; and {} more", items.len() - n);
    }
    out
}

#[cfg(test)]
mod tests;
