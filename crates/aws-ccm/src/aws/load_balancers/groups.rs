//! The security groups a sync starts from, from the shared view of the
//! VPC's groups ([`crate::aws::security_groups::view`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{AwsLoadBalancers, CloudError};
use crate::aws::security_groups as sg;
use crate::aws::tags;

impl AwsLoadBalancers {
    /// The groups named one of `names` that carry this cluster's tag (any
    /// value), looked up by name (for deletion).
    pub(super) async fn cluster_groups_named(
        &self,
        names: Vec<String>,
    ) -> Result<Vec<sg::SecurityGroup>, CloudError> {
        let filters = vec![
            crate::aws::instances::filter("group-name", names),
            crate::aws::instances::filter("tag-key", [tags::cluster_tag_key(&self.cluster_id)]),
        ];
        Ok(sg::io::describe(&self.aws, filters).await?)
    }

    /// The security groups of `instances` and the groups named
    /// `extra_names` (a load balancer's owned group), by ID, from the
    /// shared view: no read per sync, whatever the number of Services.
    pub(super) async fn groups_of(
        &self,
        vpc_id: &str,
        instances: &[&crate::aws::Ec2Instance],
        extra_names: &[String],
    ) -> Result<BTreeMap<String, sg::SecurityGroup>, CloudError> {
        // From the shared view: a group it lacks is read by ID, once.
        let refs: Vec<crate::aws::instances::SecurityGroupRef> = instances
            .iter()
            .flat_map(|i| i.security_groups.iter().cloned())
            .collect();
        let view = self.aws.memory().groups();
        Ok(view.by_refs(&self.aws, vpc_id, &refs, extra_names).await?)
    }

    /// What a sync starts from, in one read: the load balancer's owned group
    /// (one of `owned_names`) and its backends' groups, and which of those are the
    /// backends' node groups.
    /// At the Service's resync slot (`uid`) they come from a listing that
    /// started after its last sync, so drift made behind the CCM's back is
    /// seen.
    pub(super) async fn sync_groups(
        &self,
        uid: &str,
        vpc_id: &str,
        owned_names: &[String],
        backends: &[&crate::aws::Ec2Instance],
    ) -> Result<(BTreeMap<String, sg::SecurityGroup>, BTreeSet<String>), CloudError> {
        let mut groups = self.groups_of(vpc_id, backends, owned_names).await?;
        let view = self.aws.memory().groups();
        let period = self.memory().sweep().resync_period().flatten();
        if let Some(since) = view.slot_due(uid, vpc_id, period) {
            view.listing_since(&self.aws, vpc_id, since).await?;
            groups = self.groups_of(vpc_id, backends, owned_names).await?;
        }
        let mut node_groups = BTreeSet::new();
        for i in backends {
            node_groups.extend(self.node_group(i, &groups)?);
        }
        Ok((groups, node_groups))
    }

    /// Adds the groups in `vpc_id` whose rules admit group `source`. For a
    /// group the cluster owns, every such group (only this CCM adds those
    /// rules, and the group cannot be deleted while one remains); for a
    /// shared group, only cluster-tagged ones: a rule someone added to a
    /// group outside the cluster is not ours to revoke.
    pub(super) async fn add_referencing(
        &self,
        groups: &mut BTreeMap<String, sg::SecurityGroup>,
        vpc_id: &str,
        source: &str,
        source_is_owned: bool,
    ) -> Result<(), CloudError> {
        let view = self.aws.memory().groups().groups(&self.aws, vpc_id).await?;
        for g in view.referencing(source) {
            if source_is_owned || tags::has_cluster_tag(&g.tags, &self.cluster_id) {
                groups.entry(g.id.clone()).or_insert(g);
            }
        }
        Ok(())
    }
}
