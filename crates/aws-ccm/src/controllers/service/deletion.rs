//! The event a Service's deletion ends with: deleted, kept (protected) or
//! left to the controller it was handed to.

use k8s_openapi::api::core::v1::Service;
use kube::{Resource, ResourceExt};

use super::{FINALIZER, ServiceController};
use crate::provider::load_balancers::{LoadBalancers, TYPE};

impl<L: LoadBalancers> ServiceController<L> {
    /// Says how the deletion of `svc` (UID `uid`) ended: `kept` names the
    /// protected load balancer kept in AWS.
    pub(super) async fn deletion_event(
        &self,
        svc: &Service,
        uid: &str,
        handed_over: bool,
        kept: Option<String>,
    ) {
        let obj = svc.object_ref(&());
        if handed_over {
            let name = self.lbs.name(uid);
            let value = svc.annotations().get(TYPE).cloned().unwrap_or_default();
            tracing::info!(load_balancer = %name, "handed to another controller: left in AWS as it is");
            let note = format!(
                "Left load balancer {name} in AWS as it is: the Service is handed to another controller ({TYPE}: {value}), so nothing was deleted and the finalizer {FINALIZER} is released"
            );
            self.events
                .normal(&obj, "LoadBalancerHandedOver", note)
                .await;
        } else if let Some(what) = kept {
            let note = format!(
                "Kept the protected {what} in AWS with its listeners, target groups and own security group; its node targets and node security-group rules were removed (the Service's node ports are released), and the finalizer {FINALIZER} is released. `aws-ccm orphans` lists it as protected, kept, and never deletes it"
            );
            self.events.normal(&obj, "LoadBalancerKept", note).await;
        } else {
            self.events
                .normal(&obj, "DeletedLoadBalancer", "Deleted load balancer")
                .await;
        }
    }
}
