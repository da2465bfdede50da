//! NLB, pure: the cluster's shared backend security group (cloud.conf
//! `NLBNodeIngress = SharedBackendGroup`). One group per cluster, made by
//! this CCM, carried by every NLB that carries security groups; each
//! backend node group holds one rule admitting it (see
//! [`super::node_rules`]), whatever the number of NLBs. It holds no rules
//! of its own: the NLB's own groups admit the clients.
//!
//! Leaving the mode: an NLB keeps carrying the group until its node rules
//! are back in the node groups, then it is detached
//! ([`SharedUse::Leaving`]). The group itself is never deleted by the CCM.

use std::collections::BTreeMap;

use crate::aws::elb::GroupRef;
use crate::aws::tags;

/// The tag that, with the cluster tag `owned` and the name
/// [`shared_group_name`], proves the group this CCM's shared backend group
/// for the cluster it names.
pub(crate) const SHARED_GROUP_TAG: &str = "aws-ccm/shared-backend-group";

/// The shared group's description.
pub(crate) const SHARED_GROUP_DESCRIPTION: &str =
    "[k8s] aws-ccm shared backend SecurityGroup for the cluster's NLBs";

/// The ID a plan shows for the shared group before it exists
/// (`aws-ccm plan`).
const PLANNED_SHARED_ID: &str = "<shared backend group>";

/// The security groups one load balancer carries at AWS's default quota
/// (documented for an Application Load Balancer and for a network
/// interface; the NLB guide names no figure).
const DEFAULT_GROUPS_PER_LOAD_BALANCER: usize = 5;

/// Whether a new NLB whose own groups are `own` is made with the shared
/// group too: not when they fill [`DEFAULT_GROUPS_PER_LOAD_BALANCER`], for
/// AWS would refuse the create. Its next sync asks with `SetSecurityGroups`,
/// which a raised quota takes and a refusal leaves the NLB as it is.
pub(crate) fn carried_at_create(own: usize) -> bool {
    own < DEFAULT_GROUPS_PER_LOAD_BALANCER
}

/// The shared group's name for cluster `cluster_id`: not `k8s-…`, so no
/// name pattern of the Go CCM's groups matches it.
pub(crate) fn shared_group_name(cluster_id: &str) -> String {
    format!("aws-ccm-backend-{cluster_id}")
}

/// The tags the shared group is created with.
pub(crate) fn shared_group_tags(cluster_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (tags::cluster_tag_key(cluster_id), tags::OWNED.to_string()),
        (SHARED_GROUP_TAG.to_string(), cluster_id.to_string()),
    ])
}

/// What one NLB does with the shared group this sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SharedUse {
    /// Nothing: the mode is off and the NLB does not carry it, or the NLB
    /// carries no security groups (AWS gives an NLB made without groups
    /// none, ever).
    None,
    /// The mode is on: the NLB carries the group (ID, or
    /// [`PLANNED_SHARED_ID`] before it exists) and its node groups admit it.
    Carry(String),
    /// The mode is off and the NLB still carries the group: it keeps it
    /// until its node rules are back, then it is detached.
    Leaving(String),
}

impl SharedUse {
    /// The group the NLB carries through this sync's plan.
    pub(crate) fn carried(&self) -> Option<&str> {
        match self {
            SharedUse::None => None,
            SharedUse::Carry(id) | SharedUse::Leaving(id) => Some(id),
        }
    }
}

/// Pure: the shared group's use by an NLB. `mode_on`: cloud.conf asks for
/// it; `manages_groups`: the plan manages the NLB's security groups (see
/// `nlb::plan::plan`); `shared`: the proven shared group's ID, if it
/// exists; `lb_groups`: the groups the existing NLB carries.
pub(crate) fn shared_use(
    mode_on: bool,
    manages_groups: bool,
    shared: Option<&str>,
    lb_groups: Option<&[String]>,
) -> SharedUse {
    if !manages_groups {
        return SharedUse::None;
    }
    if mode_on {
        return SharedUse::Carry(shared.unwrap_or(PLANNED_SHARED_ID).to_string());
    }
    match shared {
        Some(id) if lb_groups.is_some_and(|g| g.iter().any(|x| x == id)) => {
            SharedUse::Leaving(id.to_string())
        }
        _ => SharedUse::None,
    }
}

/// The groups the NLB asks for with the shared group's `use_`: appended
/// after its own (the NLB's first group stays its own).
pub(crate) fn with_shared(groups: &[GroupRef], use_: &SharedUse) -> Vec<GroupRef> {
    let mut out = groups.to_vec();
    if let Some(id) = use_.carried() {
        let r = GroupRef::Id(id.to_string());
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_new_nlb_takes_the_group_only_below_the_default_quota() {
        assert!(carried_at_create(0));
        assert!(carried_at_create(4));
        assert!(!carried_at_create(5));
        assert!(!carried_at_create(6));
    }

    #[test]
    fn the_mode_on_carries_the_group_or_its_placeholder() {
        assert_eq!(
            shared_use(true, true, Some("sg-shared"), None),
            SharedUse::Carry("sg-shared".into())
        );
        assert_eq!(
            shared_use(true, true, None, Some(&groups(&["sg-own"]))),
            SharedUse::Carry(PLANNED_SHARED_ID.into())
        );
    }

    #[test]
    fn an_nlb_without_managed_groups_never_gets_it() {
        let lb = groups(&["sg-shared"]);
        assert_eq!(
            shared_use(true, false, Some("sg-shared"), None),
            SharedUse::None
        );
        assert_eq!(
            shared_use(false, false, Some("sg-shared"), Some(&lb)),
            SharedUse::None
        );
    }

    #[test]
    fn leaving_keeps_it_only_where_it_is_carried() {
        let carrying = groups(&["sg-own", "sg-shared"]);
        let not = groups(&["sg-own"]);
        assert_eq!(
            shared_use(false, true, Some("sg-shared"), Some(&carrying)),
            SharedUse::Leaving("sg-shared".into())
        );
        assert_eq!(
            shared_use(false, true, Some("sg-shared"), Some(&not)),
            SharedUse::None
        );
        assert_eq!(
            shared_use(false, true, None, Some(&carrying)),
            SharedUse::None
        );
    }

    #[test]
    fn the_shared_group_goes_after_the_nlbs_own() {
        let own = vec![GroupRef::Owned];
        let with = with_shared(&own, &SharedUse::Carry("sg-shared".into()));
        assert_eq!(
            with,
            vec![GroupRef::Owned, GroupRef::Id("sg-shared".into())]
        );
        assert_eq!(
            with_shared(&with, &SharedUse::Carry("sg-shared".into())),
            with
        );
        assert_eq!(with_shared(&own, &SharedUse::None), own);
    }

    #[test]
    fn its_name_matches_no_pattern_of_the_go_ccms_groups() {
        let name = shared_group_name("0123456789");
        assert!(!name.starts_with("k8s-"));
        let tags = shared_group_tags("0123456789");
        assert_eq!(tags[SHARED_GROUP_TAG], "0123456789");
        assert_eq!(tags[&tags::cluster_tag_key("0123456789")], tags::OWNED);
    }
}
