//! What one sync of a Service may change, from its reading
//! ([`LoadBalancerSpec::read`](crate::aws::annotations::LoadBalancerSpec::read)):
//! everything, the upkeep of an existing load balancer (a value the Go CCM
//! refuses too), or nothing (such a value, or a held `type`, on a Service
//! without a load balancer); and the Warnings that say so, or that say
//! what a sync could not do.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::api::Api;

use super::condition::{self, Stop};
use super::{Outcome, ServiceController, has_load_balancer};
use crate::provider::CloudError;
use crate::provider::load_balancers::{
    LoadBalancers, Reading, SYNC_FAILED, Scope, Warning, merged, scope,
};

impl<L: LoadBalancers> ServiceController<L> {
    /// What this sync may change, from the Service's reading: `None` when
    /// nothing is to be done (a refused or held value on a Service without a
    /// load balancer). Values taken as the Go CCM takes them are warned about
    /// when the Service changed; refused ones at every sync, since each
    /// leaves a change undone.
    pub(super) async fn read_scope(
        &self,
        svc: &Service,
        api: &Api<Service>,
        reading: &Reading,
        service_changed: bool,
    ) -> Option<Scope> {
        let obj = svc.object_ref(&());
        let exists = has_load_balancer(svc);
        if service_changed {
            // One Warning per reason, the notes that hold something first:
            // events of one reason on one object fold into a series that
            // keeps its first note, so a note of its own would be lost.
            for note in &reading.notes {
                tracing::warn!(value = %note.value, annotation = %note.field, "{note}");
            }
            let warnings = reading
                .note_findings(exists)
                .into_iter()
                .map(|f| Warning {
                    reason: f.reason,
                    message: f.message,
                })
                .collect();
            for w in merged(warnings) {
                self.events.warning(&obj, w.reason, w.message).await;
            }
        }
        let scope = scope(reading, exists);
        let Some(refusal) = reading.refusal(exists) else {
            if scope.is_none() || reading.holds_changes() {
                // Held: the note that holds it is the reason.
                let held = reading.note_findings(exists).into_iter().next();
                let message = held.map(|f| f.message).unwrap_or_default();
                condition::stopped(api, svc, Stop::HeldValue, &message).await;
            }
            return scope;
        };
        tracing::warn!(error = %refusal, "invalid Service value");
        condition::stopped(api, svc, Stop::RefusedValue, &refusal).await;
        self.events.warning(&obj, SYNC_FAILED, refusal).await;
        scope
    }
    /// A Warning for a failed ensure.
    pub(super) async fn ensure_failed(
        &self,
        svc: &Service,
        api: &Api<Service>,
        e: CloudError,
        service_changed: bool,
    ) -> Outcome {
        let (reason, what) = if service_changed {
            ("SyncLoadBalancerFailed", "Error syncing load balancer")
        } else {
            (
                "UpdateLoadBalancerFailed",
                "Error updating load balancer with new hosts",
            )
        };
        let hint = if e.is_invalid() {
            "fix it and the Service is retried"
        } else {
            "it is retried with backoff (5 s to 5 min), or at once when the Service changes"
        };
        tracing::warn!(error = %e, "load balancer sync failed");
        let message = format!("{what}: {e}; {hint}");
        condition::stopped(api, svc, Stop::Cloud(e.kind()), &message).await;
        self.events
            .warning(&svc.object_ref(&()), reason, message)
            .await;
        Outcome::Failed
    }
}
