//! Protected load balancers: a Service that marks its load balancer
//! protected (`aws-load-balancer-attributes: deletion_protection.enabled=true`),
//! or whose NLB AWS protects, keeps it when the Service is deleted or stops
//! being `type: LoadBalancer`. Kept: the load balancer (its DNS name and
//! Elastic IPs), its listeners, its target groups and its own security
//! group. Removed: what reaches into the cluster, its registered node
//! targets and the node groups' rules admitting it, since the Service's node
//! ports are released with it and may be given to another Service, whose
//! traffic the kept load balancer would otherwise receive. The load balancer
//! is tagged [`tags::KEPT_TAG`] with the Service it was kept from: the proof
//! `aws-ccm orphans` reads ("protected, kept"), and never deletes.
//! docs/ownership.md is the operator's page.

use std::collections::BTreeMap;

use super::{AwsLoadBalancers, Removed};
use crate::aws::nlb;
use crate::aws::ownership::{self, Made};
use crate::aws::tags;
use crate::provider::CloudError;

/// What a deletion that kept `kind` `name` did.
pub(super) fn kept(service_key: &str, kind: &str, name: &str, changed: bool) -> Removed {
    tracing::info!(service = %service_key, load_balancer = %name, "protected: kept the {kind}, its listeners, target groups and own security group; removed its node targets and node rules");
    Removed {
        changed,
        kept: Some(format!(
            "{kind} {name} (tagged {}={service_key})",
            tags::KEPT_TAG
        )),
    }
}

/// The refusal of a type change that would delete protected `kind` `name`.
pub(super) fn handover_refused(
    service_key: &str,
    kind: &str,
    name: &str,
    asked: &str,
) -> CloudError {
    CloudError::invalid(format!(
        "Service {service_key}: its {kind} {name} is protected ({}: {}=true, or AWS's deletion protection), so it is not replaced by {asked}; the load balancer is left as it is. To change the load balancer type, remove the protection first (an NLB's AWS attribute is turned off at the next sync), or set {} back",
        crate::aws::annotations::LB_ATTRIBUTES,
        crate::aws::annotations::DELETION_PROTECTION,
        crate::aws::annotations::TYPE,
    ))
}

impl AwsLoadBalancers {
    /// Whether [`ownership`] proves load balancer `name` this CCM's for
    /// the Service (the deletion logs why when not).
    pub(super) fn proven_quietly(
        &self,
        service_key: &str,
        name: &str,
        tags: &BTreeMap<String, String>,
    ) -> bool {
        ownership::prove(
            Made::LoadBalancer,
            name,
            tags,
            &self.cluster_id,
            Some(service_key),
        )
        .is_ok()
    }

    /// Keeps the protected NLB `lb` (named `name`) of Service `service_key`
    /// ([`nlb::plan::plan_keep`]), then revokes its node rules.
    pub(super) async fn keep_nlb(
        &self,
        service_key: &str,
        name: &str,
        lb: nlb::ActualLb,
    ) -> Result<Removed, CloudError> {
        let actual = nlb::read::for_keep(&self.aws, lb).await?;
        let changes =
            nlb::plan::plan_keep(&actual, &self.cluster_id, name, service_key).unwrap_or_default();
        self.apply_nlb(name, "", &actual, &changes).await?;
        // The kept NLB keeps its groups; the node rules admitting them go
        // (those of a group no other NLB carries).
        let revocable = self.groups_leaving_with(name, actual.lb.as_ref()).await?;
        let revoked = self.revoke_nlb_node_rules(name, &revocable).await?;
        Ok(kept(
            service_key,
            "NLB",
            name,
            !changes.is_empty() || revoked,
        ))
    }
}
