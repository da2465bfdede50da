//! The route changes IAM would refuse, found by DryRun before any write.

use std::collections::{BTreeMap, HashMap};

use super::Reconciler;
use super::plan::{Plan, RouteChange};
use crate::provider::CloudError;
use crate::provider::permissions::{Denial, Probe, Tagging};
use crate::provider::routes::{RouteTable, Routes, TargetInstance};

/// What a DryRun is cached by: `(0, route table ID)` or `(1, instance ID)`.
type ProbeKey = (u8, String);

impl<R: Routes> Reconciler<R> {
    /// The changes IAM would refuse, by index: one DryRun per route table
    /// and per instance whose source/destination check is to change (each
    /// verdict cached per resource), so a denied write is never sent.
    pub(super) async fn refusals(
        &self,
        plan: &Plan,
        tables: &[RouteTable],
        instances: &HashMap<String, TargetInstance>,
    ) -> HashMap<usize, CloudError> {
        let probes = probes_for(plan, tables, instances);
        let checks = probes
            .values()
            .map(|(probe, tagging)| self.routes.permission(probe, *tagging));
        let verdicts = futures::future::join_all(checks).await;
        let denied: HashMap<ProbeKey, Denial> = (probes.into_keys().zip(verdicts))
            .filter_map(|(key, verdict)| Some((key, verdict.denial()?.clone())))
            .collect();
        refused_by(plan, &denied)
    }
}

/// The DryRun that tells whether IAM allows `change`, with its cache key and
/// the tagging of the resource it writes (`None` tagging: not found).
fn probe_for(
    change: &RouteChange,
    tables: &[RouteTable],
    instances: &HashMap<String, TargetInstance>,
) -> Option<(ProbeKey, Probe, Option<Tagging>)> {
    if let RouteChange::DisableSourceDestCheck { instance_id, .. } = change {
        let probe = Probe::SourceDestCheck {
            instance_id: instance_id.clone(),
        };
        let tagging = instances.get(instance_id).map(|i| i.tagging);
        return Some(((1, instance_id.clone()), probe, tagging));
    }
    let (table_id, destination, instance_id) = change.route()?;
    let probe = Probe::Route {
        table_id: table_id.to_string(),
        destination,
        instance_id: instance_id.map(str::to_string),
    };
    let tagging = tables.iter().find(|t| t.id == table_id).map(|t| t.tagging);
    Some(((0, table_id.to_string()), probe, tagging))
}

/// One DryRun per route table and per instance, the best for each (a create
/// names a target, so it probes better than a delete).
fn probes_for(
    plan: &Plan,
    tables: &[RouteTable],
    instances: &HashMap<String, TargetInstance>,
) -> BTreeMap<ProbeKey, (Probe, Tagging)> {
    let mut probes: BTreeMap<ProbeKey, (Probe, Tagging)> = BTreeMap::new();
    for change in &plan.changes {
        let Some((key, probe, tagging)) = probe_for(change, tables, instances) else {
            continue;
        };
        let tagging = tagging.unwrap_or(Tagging::Untagged);
        // The policy grants instance writes on the cluster tag: a DryRun
        // per joining node would double the source/destination calls
        // under AWS's small mutating budget for nothing (the start-up
        // self-check probes one such instance).
        if matches!(probe, Probe::SourceDestCheck { .. }) && tagging == Tagging::Current {
            continue;
        }
        // A create probes better than a delete (it names a target).
        let better = matches!(
            &probe,
            Probe::Route {
                instance_id: Some(_),
                ..
            }
        );
        let replace = match probes.get(&key) {
            None => true,
            Some((
                Probe::Route {
                    instance_id: None, ..
                },
                _,
            )) => better,
            Some(_) => false,
        };
        if replace {
            probes.insert(key, (probe, tagging));
        }
    }
    probes
}

/// Each change whose route table or instance IAM denied, by index.
fn refused_by(plan: &Plan, denied: &HashMap<ProbeKey, Denial>) -> HashMap<usize, CloudError> {
    let refused = plan.changes.iter().enumerate().filter_map(|(i, change)| {
        let key = match change {
            RouteChange::Create { table_id, .. }
            | RouteChange::Replace { table_id, .. }
            | RouteChange::Delete { table_id, .. } => (0, table_id.clone()),
            RouteChange::DisableSourceDestCheck { instance_id, .. } => (1, instance_id.clone()),
        };
        Some((i, denied.get(&key)?.refusal()))
    });
    refused.collect()
}
