//! The start-up permission self-check: a DryRun of each write the CCM will
//! make, on one real resource of each kind, so that a policy that is too
//! narrow shows at start-up rather than at the first node or Service. The
//! verdicts land in the shared registry, where the controllers find them.

use std::collections::BTreeSet;

use super::{Probe, Tagging};
use crate::aws::Aws;
use crate::aws::security_groups as sg;
use crate::provider::permissions::{MissingAction, PermissionCheck};
use crate::provider::routes::Routes;

use crate::provider::permissions::{Finding, Scope};

impl PermissionCheck for Aws {
    async fn check_writes(&self, scope: &Scope) -> Vec<Finding> {
        run(self, scope).await
    }

    async fn missing_actions(&self, scope: &Scope) -> Vec<MissingAction> {
        super::gaps::probe(self, scope.load_balancers, scope.routes.as_ref())
            .await
            .into_iter()
            .map(|gap| MissingAction {
                action: gap.action,
                description: gap.describe(self.cluster_id()),
            })
            .collect()
    }
}

/// Runs every probe the scope calls for. A resource that cannot be listed
/// is logged and skipped: the self-check informs, it never stops the CCM.
pub(crate) async fn run(aws: &Aws, scope: &Scope) -> Vec<Finding> {
    let cluster_id = aws.cluster_id().to_string();
    let mut probes: Vec<(Probe, Tagging)> = Vec::new();
    let instances = match aws.cluster_instances().await {
        Ok(list) => list,
        Err(e) => {
            tracing::warn!(error = %e, "permission self-check: cannot list the cluster's instances");
            Default::default()
        }
    };
    let live = || instances.iter().filter(|i| !i.state.is_terminated());
    let pick = |want: Tagging| live().find(|i| Tagging::of(&cluster_id, i.tags.iter()) == want);
    let current = pick(Tagging::Current);
    let legacy = pick(Tagging::LegacyOnly);
    if let Some((selector, destination)) = &scope.routes {
        match aws.route_tables(selector).await {
            Ok(tables) => {
                let target = current.or(legacy).map(|i| i.id.clone());
                for t in tables {
                    probes.push((
                        Probe::Route {
                            table_id: t.id.clone(),
                            destination: *destination,
                            instance_id: target.clone(),
                        },
                        t.tagging,
                    ));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "permission self-check: cannot list the route tables")
            }
        }
        for (i, tagging) in [(current, Tagging::Current), (legacy, Tagging::LegacyOnly)] {
            if let Some(i) = i {
                let instance_id = i.id.clone();
                probes.push((Probe::SourceDestCheck { instance_id }, tagging));
            }
        }
    }
    if scope.node_groups {
        probes.extend(group_probes(aws, &instances).await);
    }
    if scope.tagging
        && let Some((i, tagging)) = current
            .map(|i| (i, Tagging::Current))
            .or(legacy.map(|i| (i, Tagging::LegacyOnly)))
    {
        let instance_id = i.id.clone();
        probes.push((Probe::Tags { instance_id }, tagging));
    }
    let mut findings = Vec::with_capacity(probes.len());
    for (probe, tagging) in probes {
        let verdict = aws.memory().permissions().check(aws, &probe, tagging).await;
        findings.push(Finding { probe, verdict });
    }
    findings
}

/// One cluster-tagged group, and every group that is some instance's only
/// group and lacks the cluster tag: the service path writes those (the Go
/// CCM's choice of a node's group), and the policy does not grant them.
async fn group_probes(aws: &Aws, instances: &[crate::aws::Ec2Instance]) -> Vec<(Probe, Tagging)> {
    let cluster_id = aws.cluster_id();
    let key = crate::aws::tags::cluster_tag_key(cluster_id);
    let mut out = Vec::new();
    match sg::io::describe(aws, vec![crate::aws::instances::filter("tag-key", [key])]).await {
        Ok(groups) => {
            if let Some(g) = groups.first() {
                aws.memory()
                    .permissions()
                    .learn_account(g.owner_id.as_deref());
                let group_id = g.id.clone();
                out.push((Probe::Ingress { group_id }, Tagging::Current));
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "permission self-check: cannot list the cluster's security groups")
        }
    }
    let only: BTreeSet<String> = instances
        .iter()
        .filter(|i| !i.state.is_terminated() && i.security_groups.len() == 1)
        .map(|i| i.security_groups[0].id.to_string())
        .collect();
    if only.is_empty() {
        return out;
    }
    let ids: Vec<String> = only.into_iter().collect();
    match sg::io::by_ids(aws, &ids).await {
        Ok(groups) => {
            for g in groups {
                aws.memory()
                    .permissions()
                    .learn_account(g.owner_id.as_deref());
                let tagging = Tagging::of(
                    cluster_id,
                    g.tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                );
                if tagging != Tagging::Current {
                    out.push((Probe::Ingress { group_id: g.id }, tagging));
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "permission self-check: cannot read the nodes' security groups")
        }
    }
    out
}
