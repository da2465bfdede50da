//! What the instance lookups ask EC2, and the string sharing of one read.
//! Pure: `io.rs` sends the requests.

use std::collections::HashSet;
use std::sync::Arc;

use aws_sdk_ec2::types::Filter;

use super::{Ec2Instance, Shared, filter, present};
use crate::aws::tags::{LEGACY_CLUSTER_TAG, cluster_tag_key};

/// States in which an instance can still be a node. Lookups by private DNS
/// name exclude terminated instances, because a terminated instance keeps its
/// name for about an hour and a new node may already reuse it.
pub(crate) const ALIVE_STATES: [&str; 5] =
    ["pending", "running", "shutting-down", "stopping", "stopped"];

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
