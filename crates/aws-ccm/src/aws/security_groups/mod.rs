//! Security groups: a flat, comparable model of ingress rules. The rules a
//! classic ELB's owned group needs are in [`plan`]; the EC2 calls that read
//! and change groups, through the one door, in [`io`].

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;

pub(crate) mod io;
pub(crate) mod plan;
pub(crate) mod view;

/// Where an ingress rule lets traffic in from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Source {
    Cidr(Ipv4Net),
    Group(String),
}

/// One ingress rule: protocol (`tcp`, `udp`, `icmp`, `-1`), port range (ICMP:
/// type and code; `-1` for all), and one source. AWS groups rules into
/// permissions with many sources; comparing flat rules makes diffs exact.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    pub(crate) protocol: String,
    pub(crate) from: i32,
    pub(crate) to: i32,
    pub(crate) source: Source,
}

impl Rule {
    /// Everything from another group (what a backend node's group gets).
    pub(crate) fn all_from_group(group_id: &str) -> Rule {
        Rule {
            protocol: "-1".into(),
            from: -1,
            to: -1,
            source: Source::Group(group_id.to_string()),
        }
    }
}

/// A security group as read from EC2.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityGroup {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) vpc_id: Option<String>,
    pub(crate) tags: BTreeMap<String, String>,
    pub(crate) ingress: BTreeSet<Rule>,
    /// Descriptions of the rules that carry one (IPv4 CIDR or group sources).
    pub(crate) descriptions: BTreeMap<Rule, String>,
    /// The account that owns the group (for ARNs in permission messages).
    pub(crate) owner_id: Option<String>,
}

#[cfg(test)]
mod tests;

/// The node security group of an instance, as upstream chooses it: the one
/// group of `group_ids` tagged for `cluster_id` (`is_cluster_tagged`), else
/// the only group. `Err` names the instance, the groups and the fix.
pub(crate) fn node_group_of(
    instance_id: &str,
    group_ids: &[&str],
    is_cluster_tagged: impl Fn(&str) -> bool,
    cluster_id: &str,
) -> Result<Option<String>, String> {
    let tagged: Vec<&str> = group_ids
        .iter()
        .copied()
        .filter(|id| is_cluster_tagged(id))
        .collect();
    let key = super::tags::cluster_tag_key(cluster_id);
    match (tagged.len(), group_ids.len()) {
        (1, _) => Ok(Some(tagged[0].to_string())),
        (0, 1) => Ok(Some(group_ids[0].to_string())),
        (0, 0) => Ok(None),
        (0, _) => Err(format!(
            "instance {instance_id} has several security groups ({}) and none is tagged {key}; tag the one the load balancer should open",
            group_ids.join(", ")
        )),
        _ => Err(format!(
            "instance {instance_id} has several security groups tagged {key} ({}); tag only the node group",
            tagged.join(", ")
        )),
    }
}
