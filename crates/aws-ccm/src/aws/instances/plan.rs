//! What the instance lookups ask EC2, and the string sharing of one read.
//! Pure: `io.rs` sends the requests.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::Arc;

use aws_sdk_ec2::types::Filter;

use super::{Ec2Instance, Shared, filter, present};
use crate::aws::tags::{LEGACY_CLUSTER_TAG, cluster_tag_key};

/// States in which an instance can still be a node. Lookups by private DNS
/// name exclude terminated instances, because a terminated instance keeps its
/// name for about an hour and a new node may already reuse it.
const ALIVE_STATES: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// A coalesced lookup by instance ID. `instance-id` as a filter, not
/// `InstanceIds`: with the parameter one unknown ID fails the whole call
/// (InvalidInstanceID.NotFound); the filter just leaves it out.
pub(crate) fn by_id_filters(ids: Vec<String>) -> Vec<Filter> {
    vec![filter("instance-id", ids)]
}

/// A coalesced lookup of live instances by private DNS name.
pub(crate) fn by_private_dns_filters(names: Vec<String>) -> Vec<Filter> {
    vec![
        filter("private-dns-name", names),
        filter("instance-state-name", ALIVE_STATES),
    ]
}

/// A coalesced lookup of live instances by their primary private IPv4
/// address (`private-ip-address`). Not
/// `network-interface.addresses.private-ip-address`: that one also matches
/// secondary addresses, which with the VPC CNI are other instances' pods.
pub(crate) fn by_private_ip_filters(ips: &[Ipv4Addr]) -> Vec<Filter> {
    vec![
        filter("private-ip-address", ips.iter().map(Ipv4Addr::to_string)),
        filter("instance-state-name", ALIVE_STATES),
    ]
}

/// The answer to a lookup by private IP, by asked address: every live
/// instance whose primary private address it is. What EC2's filters should
/// have left out (another address, a terminated instance) is left out here
/// again, so a stand-in that ignored a filter cannot make a node's proof.
pub(crate) fn group_by_private_ip(
    asked: &[Ipv4Addr],
    found: Vec<Ec2Instance>,
) -> HashMap<Ipv4Addr, Vec<Ec2Instance>> {
    let mut out: HashMap<Ipv4Addr, Vec<Ec2Instance>> = HashMap::new();
    for instance in found {
        if let Some(ip) = instance.private_ip
            && asked.contains(&ip)
            && instance.state != super::InstanceState::Terminated
        {
            out.entry(ip).or_default().push(instance);
        }
    }
    for instances in out.values_mut() {
        instances.sort_by(|a, b| a.id.cmp(&b.id));
    }
    out
}

/// The cluster sweep's query: the `kubernetes.io/cluster/<id>` tag key.
pub(crate) fn sweep_filters(cluster_id: &str) -> Vec<Filter> {
    vec![filter("tag-key", [cluster_tag_key(cluster_id)])]
}

/// The sweep's second query, for the legacy `KubernetesCluster=<id>` tag
/// (EC2 ANDs filters, so "either tag" takes a second query).
pub(crate) fn legacy_sweep_filters(cluster_id: &str) -> Vec<Filter> {
    vec![filter(
        &format!("tag:{LEGACY_CLUSTER_TAG}"),
        [cluster_id.to_string()],
    )]
}

/// The sweep's answer: `found`, then the instances of `legacy` it does not
/// hold already, sorted by ID.
pub(crate) fn merge_sweep(
    mut found: Vec<Ec2Instance>,
    legacy: Vec<Ec2Instance>,
) -> Vec<Ec2Instance> {
    let seen: HashSet<String> = found.iter().map(|i| i.id.clone()).collect();
    found.extend(legacy.into_iter().filter(|i| !seen.contains(&i.id)));
    found.sort_by(|a, b| a.id.cmp(&b.id));
    found
}

/// Hands out one [`Shared`] copy of each distinct string. A sweep of 5,000
/// instances names a few zones, types, subnets and node groups thousands of
/// times; as separate `String`s they were about half of each cached
/// instance. One interner lives for one read (all its pages) and is then
/// dropped, so nothing is kept across reads.
#[derive(Debug, Default)]
pub struct Interner(HashSet<Shared>);

impl Interner {
    pub(crate) fn get(&mut self, value: &str) -> Shared {
        if let Some(found) = self.0.get(value) {
            return found.clone();
        }
        let new: Shared = Arc::from(value);
        self.0.insert(new.clone());
        new
    }

    /// Trimmed `value`, shared; `None` when absent or empty.
    pub(super) fn non_empty(&mut self, value: Option<&str>) -> Option<Shared> {
        present(value).map(|v| self.get(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::instances::InstanceState;
    use crate::provider::instances::fake::instance;

    /// What the filters should have left out is left out again: another
    /// address, a terminated instance, an instance without an address.
    #[test]
    fn an_answer_by_address_keeps_only_live_instances_with_an_asked_address() {
        let asked: Vec<Ipv4Addr> = vec!["10.0.0.1".parse().expect("ip")];
        let mut gone = instance("i-gone", "10.0.0.1");
        gone.state = InstanceState::Terminated;
        let mut bare = instance("i-bare", "10.0.0.1");
        bare.private_ip = None;
        let found = vec![
            instance("i-b", "10.0.0.1"),
            instance("i-other", "10.0.0.2"),
            gone,
            bare,
            instance("i-a", "10.0.0.1"),
        ];
        let grouped = group_by_private_ip(&asked, found);
        let ids: Vec<&str> = grouped[&asked[0]].iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["i-a", "i-b"], "sorted by ID");
        assert_eq!(grouped.len(), 1);
        let filters = by_private_ip_filters(&asked);
        assert_eq!(filters[0].name(), Some("private-ip-address"));
        assert_eq!(filters[0].values(), ["10.0.0.1"]);
        assert_eq!(filters[1].name(), Some("instance-state-name"));
    }
}
