//! Tag names, and the ownership tags: what marks an AWS resource as
//! belonging to the cluster, and as made by (and deletable by) this
//! cluster's controller. The same keys and values as the Go CCM, so its
//! resources are adopted as they are. Every tag name of the crate is
//! defined here, once.

use std::collections::BTreeMap;

/// Value of the cluster tag on resources the controller created.
pub(crate) const OWNED: &str = "owned";
/// `kubernetes.io/service-name=<namespace>/<name>` on load balancers and their groups.
pub(crate) const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";
/// Subnet role tags used by discovery.
pub(crate) const ROLE_ELB: &str = "kubernetes.io/role/elb";
pub(crate) const ROLE_INTERNAL_ELB: &str = "kubernetes.io/role/internal-elb";
/// Tag key prefix that marks resources of a cluster:
/// `kubernetes.io/cluster/<cluster-id>` = `owned` | `shared`.
pub(crate) const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// The pre-1.6 cluster tag: `KubernetesCluster` = `<cluster-id>`.
pub(crate) const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";
/// On a load balancer this CCM created: the create-time settings it applied
/// (see `aws::applied`). The Go CCM writes no such tag.
pub(crate) const APPLIED_TAG: &str = "aws-ccm/applied";
/// On a load balancer this CCM created: a digest of the settings only a
/// per-load-balancer read shows (attributes; an NLB's listeners and target
/// group attributes) as it created them (see `aws::load_balancers::sweep`).
/// Written only in the create call.
pub(crate) const APPLIED_SETTINGS_TAG: &str = "aws-ccm/applied-settings";
/// Most tags a classic ELB, an NLB or a target group takes.
pub(crate) const MAX_LB_TAGS: usize = 50;

/// A load balancer's or target group's tags as read. Shared: the sweep's
/// tag cache, its snapshot and the plans that read it hold one copy.
pub(crate) type Tags = std::sync::Arc<BTreeMap<String, String>>;

/// `kubernetes.io/cluster/<cluster_id>`.
pub(crate) fn cluster_tag_key(cluster_id: &str) -> String {
    format!("{CLUSTER_TAG_PREFIX}{cluster_id}")
}

/// Key/value pairs as AWS returns them (tags, attributes) into a map; a pair
/// without a key is dropped, a missing value is empty.
pub(crate) fn key_values<'a>(
    pairs: impl IntoIterator<Item = (Option<&'a str>, Option<&'a str>)>,
) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .filter_map(|(k, v)| Some((k?.to_string(), v.unwrap_or_default().to_string())))
        .collect()
}

/// An EC2 resource's tags as a map.
pub(crate) fn from_ec2(tags: &[aws_sdk_ec2::types::Tag]) -> BTreeMap<String, String> {
    key_values(tags.iter().map(|t| (t.key(), t.value())))
}

/// The tags of a resource owned by `cluster_id` for `service_key` (`ns/name`),
/// with the user's extra tags (which never override the ownership tags).
/// With `legacy` (the cluster is identified by the legacy tag: cloud.conf
/// `KubernetesClusterTag`, or this instance carries `KubernetesCluster`, as
/// kOps tags every instance) also `KubernetesCluster=<cluster_id>`, as the
/// Go CCM's `buildTags` writes it on every load balancer, listener, target
/// group and security group it creates. kOps' IAM policy requires it on
/// those creates (`aws:RequestTag/KubernetesCluster`).
pub(crate) fn owned_tags(
    cluster_id: &str,
    legacy: bool,
    service_key: &str,
    additional: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut tags = additional.clone();
    tags.insert(SERVICE_NAME_TAG.to_string(), service_key.to_string());
    tags.insert(cluster_tag_key(cluster_id), OWNED.to_string());
    if legacy && !cluster_id.is_empty() {
        tags.insert(LEGACY_CLUSTER_TAG.to_string(), cluster_id.to_string());
    }
    tags
}

/// The tags of a security group made for a load balancer: the cluster tag
/// and `additional-resource-tags`, without `kubernetes.io/service-name`,
/// which the Go CCM puts on load balancers only (`ensureSecurityGroup` tags
/// a group through `buildTags` with the additional tags).
pub(crate) fn group_tags(
    cluster_id: &str,
    legacy: bool,
    additional: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut tags = owned_tags(cluster_id, legacy, "", additional);
    tags.remove(SERVICE_NAME_TAG);
    if let Some(v) = additional.get(SERVICE_NAME_TAG) {
        tags.insert(SERVICE_NAME_TAG.to_string(), v.clone());
    }
    tags
}

/// Whether a tag the plan wants but an existing resource lacks is added
/// to it. The legacy `KubernetesCluster` tag is written at creation only,
/// as the Go CCM writes it: kOps' policy allows adding tags only to
/// resources that already carry it, so a repair could never succeed there.
pub(crate) fn added_to_existing(key: &str) -> bool {
    key != LEGACY_CLUSTER_TAG
}

/// Whether the tags say `cluster_id` owns the resource (and may delete it).
pub(crate) fn is_owned(tags: &BTreeMap<String, String>, cluster_id: &str) -> bool {
    tags.get(&cluster_tag_key(cluster_id))
        .is_some_and(|v| v == OWNED)
}

/// Whether the resource is tagged for `cluster_id` at all (`owned` or `shared`).
pub(crate) fn has_cluster_tag(tags: &BTreeMap<String, String>, cluster_id: &str) -> bool {
    tags.contains_key(&cluster_tag_key(cluster_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the resource is tagged for some cluster other than `cluster_id`.
    fn tagged_for_other_cluster(tags: &BTreeMap<String, String>, cluster_id: &str) -> bool {
        let own = cluster_tag_key(cluster_id);
        tags.keys()
            .any(|k| k.starts_with(CLUSTER_TAG_PREFIX) && *k != own)
    }

    #[test]
    fn ownership_tags_cannot_be_overridden_by_user_tags() {
        let extra = BTreeMap::from([
            ("team".to_string(), "a".to_string()),
            ("kubernetes.io/cluster/c1".to_string(), "shared".to_string()),
        ]);
        let tags = owned_tags("c1", false, "ns/web", &extra);
        assert!(is_owned(&tags, "c1"));
        assert_eq!(tags[SERVICE_NAME_TAG], "ns/web");
        assert_eq!(tags["team"], "a");
        assert!(!is_owned(&tags, "c2"));
        assert!(tagged_for_other_cluster(&tags, "c2"));
        assert!(!tagged_for_other_cluster(&tags, "c1"));
        assert!(!tags.contains_key(LEGACY_CLUSTER_TAG));
    }

    #[test]
    fn the_legacy_tag_is_written_for_a_legacy_cluster_and_never_repaired() {
        let tags = owned_tags("c1", true, "ns/web", &BTreeMap::new());
        assert_eq!(tags[LEGACY_CLUSTER_TAG], "c1");
        assert!(is_owned(&tags, "c1"));
        assert!(!added_to_existing(LEGACY_CLUSTER_TAG));
        assert!(added_to_existing(&cluster_tag_key("c1")));
        // No cluster ID (--allow-untagged-cloud): no empty legacy tag.
        assert!(!owned_tags("", true, "ns/web", &BTreeMap::new()).contains_key(LEGACY_CLUSTER_TAG));
    }
}
