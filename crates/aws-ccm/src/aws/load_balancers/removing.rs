//! Removing a Service's load balancer: its deletion, each part only when
//! [`crate::aws::ownership`] proves it this CCM's for the Service, or its keep when it
//! is protected ([`super::keep`]); and the type-change handover, which
//! deletes the other kind's.

use std::collections::BTreeSet;

use super::{AwsLoadBalancers, Removed, admitting, drift, keep};
use crate::aws::applied::Kind;
use crate::aws::elb::{self, Actual};
use crate::aws::nlb;
use crate::aws::ownership::Made;
use crate::aws::security_groups as sg;
use crate::aws::tags;
use crate::provider::CloudError;

impl AwsLoadBalancers {
    /// Deletes Service `service_key`'s classic ELB, its owned group and node
    /// rules, each only when [`ownership`] proves it this CCM's.
    /// `handover`: the Service now asks for an NLB; then only a classic ELB
    /// this CCM created is deleted. `protected`: the Service protects it; a
    /// deletion keeps it ([`elb::plan::plan_keep`]), a handover is refused.
    pub(super) async fn delete_clb(
        &self,
        service_key: &str,
        uid: &str,
        handover: bool,
        protected: bool,
    ) -> Result<Removed, CloudError> {
        let aws = &self.aws;
        let name = elb::load_balancer_name(uid);
        // A delete needs no attributes: name, tags, groups and instances.
        let lb = elb::io::describe(aws, &name).await?;
        if let (true, Some(l)) = (handover, &lb) {
            drift::handover_allowed(service_key, &name, Kind::Classic, &l.tags, &self.cluster_id)?;
            if protected {
                return Err(keep::handover_refused(
                    service_key,
                    "classic ELB",
                    &name,
                    "an NLB",
                ));
            }
        }
        let actual = self.clb_removal(service_key, &name, lb).await?;
        if protected
            && let Some(changes) = elb::plan::plan_keep(&actual, &self.cluster_id, service_key)
        {
            self.apply_clb(&name, None, &actual, &changes).await?;
            return Ok(keep::kept(
                service_key,
                "classic ELB",
                &name,
                !changes.is_empty(),
            ));
        }
        let changes = elb::plan::plan_delete(&actual, &self.cluster_id, service_key);
        self.apply_clb(&name, None, &actual, &changes).await?;
        Ok(Removed {
            changed: !changes.is_empty(),
            kept: None,
        })
    }

    /// What the removal of Service `service_key`'s classic ELB `name`
    /// (`lb`, as described) compares against: its owned group and the node
    /// groups whose rules admit it, or the shared group's rules no other
    /// load balancer needs.
    async fn clb_removal(
        &self,
        service_key: &str,
        name: &str,
        lb: Option<elb::ActualLb>,
    ) -> Result<Actual, CloudError> {
        let aws = &self.aws;
        let proven = lb
            .as_ref()
            .filter(|l| self.left_unless_proven(service_key, Made::LoadBalancer, name, &l.tags));
        let owned_name = elb::owned_group_name(name);
        let owned_group = self
            .cluster_groups_named(vec![owned_name])
            .await?
            .into_iter()
            .next();
        // Every group whose rules admit the owned group: EC2 refuses to
        // delete a group another group's rule still names.
        let mut node_groups_with_rule = BTreeSet::new();
        if let Some(g) = &owned_group
            && let Some(vpc) = &g.vpc_id
        {
            node_groups_with_rule = admitting(&sg::io::referencing(aws, vpc, &g.id).await?, &g.id);
        }
        // No owned group: the node rules admit the load balancer's first
        // (shared) group; revoke those no other load balancer needs.
        let mut shared_lb_group = None;
        let mut shared_group_needed = None;
        if owned_group.is_none()
            && !self.cloud.disable_security_group_ingress
            && let Some(l) = proven
            && let Some(first) = l.security_groups.first()
            && let Some(vpc) = self.cluster_vpc(&aws.cluster_instances().await?)
        {
            let referencing = sg::io::referencing(aws, &vpc, first).await?;
            let tagged = referencing
                .iter()
                .filter(|g| tags::has_cluster_tag(&g.tags, &self.cluster_id));
            node_groups_with_rule = admitting(tagged, first);
            if !node_groups_with_rule.is_empty() {
                shared_group_needed = self.node_groups_used_by_others(first, name, &vpc).await?;
                shared_lb_group = Some(first.clone());
            }
        }
        let actual = Actual {
            lb,
            owned_group,
            node_groups_with_rule,
            shared_group_needed,
            shared_lb_group,
            owned_group_node_rules: BTreeSet::new(),
        };
        Ok(actual)
    }
}

impl AwsLoadBalancers {
    /// Deletes the Service's NLB, its target groups and its node rules.
    /// Service deletion also looks for target groups no NLB points at (one
    /// listing of every target group); the type-change `handover` (the
    /// Service now asks for a classic ELB) only cleans up an NLB that exists
    /// and this CCM created. A protected NLB (`protected`, or AWS's own
    /// deletion protection: [`nlb::read::protected`]) is kept by a deletion
    /// ([`Self::keep_nlb`]); its handover is refused. `clb_kept`: the
    /// Service's classic ELB was kept, and with it its `k8s-elb-<name>`
    /// group, which is then not the group of an NLB of the earlier aws-ccm
    /// name scheme (the same name) to delete.
    pub(super) async fn delete_nlb(
        &self,
        service_key: &str,
        uid: &str,
        handover: bool,
        protected: bool,
        clb_kept: bool,
    ) -> Result<Removed, CloudError> {
        let aws = &self.aws;
        let thorough = !handover;
        let name = elb::load_balancer_name(uid);
        // Names, ARNs and tags are what a delete needs (and the deletion
        // protection attribute): no listeners or targets are read.
        let lb = nlb::read::describe(aws, &name).await?;
        if lb.is_none() && !thorough {
            return Ok(Removed::default());
        }
        if let (false, Some(l)) = (thorough, &lb) {
            drift::handover_allowed(service_key, &name, Kind::Network, &l.tags, &self.cluster_id)?;
            if protected || nlb::read::protected(aws, l).await? {
                return Err(keep::handover_refused(
                    service_key,
                    "NLB",
                    &name,
                    "a classic ELB",
                ));
            }
        }
        if let Some(l) = lb.as_ref().filter(|_| thorough)
            && self.proven_quietly(service_key, &name, &l.tags)
            && (protected || nlb::read::protected(aws, l).await?)
        {
            return self.keep_nlb(service_key, &name, l.clone()).await;
        }
        if let Some(l) = &lb {
            self.left_unless_proven(service_key, Made::LoadBalancer, &name, &l.tags);
        }
        let lb_arn = lb.as_ref().map(|l| l.arn.as_str());
        let target_groups =
            nlb::read::groups_to_delete(aws, lb_arn, thorough.then_some(service_key)).await?;
        // The Service's managed group, looked up by name.
        let mut names = self
            .nlb_group_names_of(service_key, uid, lb.as_ref())
            .await?;
        if clb_kept {
            names.retain(|n| *n != elb::owned_group_name(&name));
        }
        let found = self.cluster_groups_named(names.clone()).await?;
        let actual = nlb::Actual {
            lb,
            target_groups,
            owned_group: self.nlb_owned_group(&names, found.iter()),
        };
        let changes = nlb::plan::plan_delete(&actual, &self.cluster_id, &name, service_key);
        // Node rules admitting the NLB's groups go before the groups: EC2
        // refuses to delete a group another group's rule names.
        let revocable = self.groups_leaving_with(&name, actual.lb.as_ref()).await?;
        let revoked_first =
            !revocable.is_empty() && self.revoke_nlb_node_rules(&name, &revocable).await?;
        self.apply_nlb(&name, "", &actual, &changes).await?;

        let revoked = revoked_first || self.revoke_nlb_node_rules(&name, &revocable).await?;
        Ok(Removed {
            changed: !changes.is_empty() || revoked,
            kept: None,
        })
    }
}
