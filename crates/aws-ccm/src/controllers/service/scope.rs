//! What one sync of a Service may change, from its reading
//! ([`LoadBalancerSpec::read`](crate::aws::annotations::LoadBalancerSpec::read)):
//! everything, the upkeep of an existing load balancer (a value the Go CCM
//! refuses too), or nothing (such a value, or a held `type`, on a Service
//! without a load balancer); and the Warnings that say so, or that say
//! what a sync could not do.

use k8s_openapi::api::core::v1::Service;
use kube::Resource;

use super::{Outcome, ServiceController, has_load_balancer};
use crate::provider::CloudError;
use crate::provider::load_balancers::{
    Holds, LoadBalancers, Reading, Scope, Warning, merged, scope,
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
        reading: &Reading,
        service_changed: bool,
    ) -> Option<Scope> {
        let obj = svc.object_ref(&());
        let exists = has_load_balancer(svc);
        if service_changed {
            // One Warning per reason, the notes that hold something first:
            // events of one reason on one object fold into a series that
            // keeps its first note, so a note of its own would be lost.
            let mut notes: Vec<_> = reading.notes.iter().collect();
            notes.sort_by_key(|n| n.holds == Holds::Nothing);
            let warnings = notes
                .into_iter()
                .map(|note| {
                    tracing::warn!(value = %note.value, annotation = %note.field, "{note}");
                    let held = if note.holds != Holds::Nothing && !exists {
                        "; no load balancer is made until it is fixed"
                    } else {
                        ""
                    };
                    Warning {
                        reason: note.reason,
                        message: format!("{note}{held}"),
                    }
                })
                .collect();
            for w in merged(warnings) {
                self.events.warning(&obj, w.reason, w.message).await;
            }
        }
        let scope = scope(reading, exists);
        if reading.errors.is_empty() {
            return scope;
        }
        let refused = reading
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        let kept = if exists {
            "The Go CCM refuses it too. Only the change it governs waits: the load balancer's backends and node security rules are kept current"
        } else {
            "The Go CCM refuses it too. No AWS call was made"
        };
        tracing::warn!(error = %refused, "invalid Service value; {kept}");
        self.events
            .warning(
                &obj,
                "SyncLoadBalancerFailed",
                format!("Error syncing load balancer: {refused}. {kept}; fix the Service"),
            )
            .await;
        scope
    }
    /// A Warning for a failed ensure.
    pub(super) async fn ensure_failed(
        &self,
        svc: &Service,
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
        self.events
            .warning(&svc.object_ref(&()), reason, format!("{what}: {e}; {hint}"))
            .await;
        Outcome::Failed
    }
}
