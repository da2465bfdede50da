//! The route changes IAM would refuse, found by DryRun before any write.

use std::collections::{BTreeMap, HashMap};

use super::Reconciler;
use super::plan::{Plan, RouteChange};
use crate::provider::routes::{RouteTable, Routes, RoutesError, RoutesErrorKind};

impl<R: Routes> Reconciler<R> {
    /// The changes IAM would refuse, by index: one DryRun per route table
    /// and per instance whose source/destination check is to change (each
    /// verdict cached per resource), so a denied write is never sent.
    pub(super) async fn refusals(
        &self,
        plan: &Plan,
        tables: &[RouteTable],
        instances: &HashMap<String, crate::provider::routes::TargetInstance>,
    ) -> HashMap<usize, RoutesError> {
        use crate::aws::permissions::{Probe, Tagging};
        let mut probes: BTreeMap<(u8, String), (Probe, Tagging)> = BTreeMap::new();
        for change in &plan.changes {
            let (key, probe, tagging) = match change {
                RouteChange::Create { .. } | RouteChange::Replace { .. } => {
                    let Some((table_id, destination, instance_id)) = change.route_to_instance()
                    else {
                        continue;
                    };
                    (
                        (0, table_id.to_string()),
                        Probe::Route {
                            table_id: table_id.to_string(),
                            destination,
                            instance_id: Some(instance_id.to_string()),
                        },
                        tables.iter().find(|t| t.id == table_id).map(|t| t.tagging),
                    )
                }
                RouteChange::Delete {
                    table_id,
                    destination,
                    ..
                } => (
                    (0, table_id.clone()),
                    Probe::Route {
                        table_id: table_id.clone(),
                        destination: *destination,
                        instance_id: None,
                    },
                    tables.iter().find(|t| &t.id == table_id).map(|t| t.tagging),
                ),
                RouteChange::DisableSourceDestCheck { instance_id, .. } => (
                    (1, instance_id.clone()),
                    Probe::SourceDestCheck {
                        instance_id: instance_id.clone(),
                    },
                    instances.get(instance_id).map(|i| i.tagging),
                ),
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
        let checks = probes
            .values()
            .map(|(probe, tagging)| self.routes.permission(probe, *tagging));
        let verdicts = futures::future::join_all(checks).await;
        let mut denied: HashMap<(u8, String), String> = HashMap::new();
        for (key, verdict) in probes.into_keys().zip(verdicts) {
            if let Some(denial) = verdict.denial() {
                denied.insert(key, denial.to_string());
            }
        }
        let mut refused = HashMap::new();
        for (i, change) in plan.changes.iter().enumerate() {
            let key = match change {
                RouteChange::Create { table_id, .. }
                | RouteChange::Replace { table_id, .. }
                | RouteChange::Delete { table_id, .. } => (0, table_id.clone()),
                RouteChange::DisableSourceDestCheck { instance_id, .. } => (1, instance_id.clone()),
            };
            if let Some(message) = denied.get(&key) {
                refused.insert(
                    i,
                    RoutesError::new(
                        RoutesErrorKind::Refused,
                        Some("UnauthorizedOperation"),
                        message.clone(),
                    ),
                );
            }
        }
        refused
    }
}
