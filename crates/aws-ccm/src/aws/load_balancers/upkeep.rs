//! Upkeep: the part of a sync that keeps an existing load balancer serving
//! while its Service carries a value this CCM refuses (docs/compatibility.md,
//! "Annotation values"). A refused value governs a setting (a listener, the
//! health check, an attribute, the subnets), never which nodes serve: so the
//! backends are registered and deregistered as the nodes come and go, and
//! the backends' security rules follow them, while listeners, health checks,
//! attributes, tags, subnets and the load balancer itself are left as they
//! are and nothing is created. The Go CCM's `UpdateLoadBalancer` does the
//! same for a Classic ELB (instances and node rules) while its
//! `EnsureLoadBalancer` fails; for an NLB it runs the failing ensure, so its
//! targets freeze: here they do not.
//!
//! Both kinds are looked for, the Service's reading first: a type value the
//! Go CCM reads as a Classic ELB may sit on an NLB made before it was edited.

use super::{AwsLoadBalancers, CloudError, EnsureRequest, Ensured, LoadBalancerKind, merged};
use crate::aws::{elb, nlb};

impl AwsLoadBalancers {
    /// Keeps the Service's existing load balancer's backends current; an
    /// empty hostname when it has none.
    /// `node_rules`: the backends' node rules are kept too.
    pub(super) async fn upkeep(
        &self,
        req: &EnsureRequest,
        node_rules: bool,
    ) -> Result<Ensured, CloudError> {
        let first = req.spec.kind;
        let second = match first {
            LoadBalancerKind::Network => LoadBalancerKind::Classic,
            _ => LoadBalancerKind::Network,
        };
        for kind in [first, second] {
            let mut req = req.clone();
            req.spec.kind = kind;
            let kept = match kind {
                LoadBalancerKind::Network => self.upkeep_nlb(&req, node_rules).await?,
                _ => self.upkeep_clb(&req).await?,
            };
            if let Some(done) = kept {
                return Ok(done);
            }
        }
        Ok(Ensured::default())
    }

    async fn upkeep_clb(&self, req: &EnsureRequest) -> Result<Option<Ensured>, CloudError> {
        let p = self.plan_clb(req, false).await?;
        let Some(lb) = &p.actual.lb else {
            return Ok(None);
        };
        let kept: Vec<elb::Change> = p.changes.into_iter().filter(is_clb_upkeep).collect();
        self.apply_clb(&p.name, Some(&p.vpc_id), &p.actual, &kept)
            .await?;
        let (name, classic) = (&p.name, None);
        (self.memory()).applied(crate::aws::memory::Applied::TargetsMoved { name, classic });
        Ok(Some(Ensured {
            hostname: lb.dns_name.clone(),
            changes: kept.iter().map(elb::plan::describe).collect(),
            warnings: merged(p.warnings),
        }))
    }

    async fn upkeep_nlb(
        &self,
        req: &EnsureRequest,
        node_rules: bool,
    ) -> Result<Option<Ensured>, CloudError> {
        let mut p = self.plan_nlb(req, false).await?;
        let Some(hostname) = p.actual.lb.as_ref().map(|lb| lb.dns_name.clone()) else {
            return Ok(None);
        };
        let mut warnings = std::mem::take(&mut p.warnings);
        let groups = std::mem::take(&mut p.groups);
        p.changes.retain(is_nlb_upkeep);
        let applied = (self.apply_nlb(&p.name, &p.vpc_id, &p.actual, &p.changes)).await?;
        let mut described: Vec<String> = p.changes.iter().map(nlb::plan::describe).collect();
        if node_rules && !self.cloud.disable_security_group_ingress {
            let done = self
                .sync_nlb_node_rules(
                    req,
                    &p,
                    groups,
                    applied.owned_group.as_deref(),
                    &mut warnings,
                )
                .await?;
            described.extend(done);
        }
        Ok(Some(Ensured {
            hostname,
            changes: described,
            warnings: merged(warnings),
        }))
    }
}

/// Instances and the node rules that let the load balancer's (existing)
/// group reach them.
pub(super) fn is_clb_upkeep(change: &elb::Change) -> bool {
    match change {
        elb::Change::RegisterInstances(_) | elb::Change::DeregisterInstances(_) => true,
        elb::Change::AuthorizeNodeIngress { from, .. }
        | elb::Change::RevokeNodeIngress { from, .. } => matches!(from, elb::GroupRef::Id(_)),
        _ => false,
    }
}

/// Targets of target groups that exist.
pub(super) fn is_nlb_upkeep(change: &nlb::Change) -> bool {
    match change {
        nlb::Change::RegisterTargets { target_group, .. } => {
            matches!(target_group, nlb::TgRef::Arn(_))
        }
        nlb::Change::DeregisterTargets { .. } => true,
        _ => false,
    }
}
