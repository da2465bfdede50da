//! Tag names, and the ownership tags: what marks an AWS resource as
//! belonging to the cluster, and as made by (and deletable by) this
//! cluster's controller. The same keys and values as the Go CCM, so its
//! resources are adopted as they are. Every tag name of the crate is
//! defined here, once.

use std::collections::{BTreeMap, BTreeSet};

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
/// On a load balancer (and its target groups and own security group) this
/// CCM kept when its protected Service went: the Service (`<ns>/<name>`)
/// it was kept from. The proof `aws-ccm orphans` reads as "protected,
/// kept" (see `aws::load_balancers::keep`). The Go CCM writes no such tag.
pub(crate) const KEPT_TAG: &str = "aws-ccm/kept";
/// On a kept load balancer a later Service adopted by name
/// (`aws-load-balancer-name`): that Service (`<ns>/<name>`). With the
/// service-name tag naming the same Service it is the proof that the load
/// balancer, whose name is not `a` + that Service's UID, is its own (see
/// `aws::load_balancers::adopt`). The Go CCM writes no such tag.
pub(crate) const ADOPTED_TAG: &str = "aws-ccm/adopted";
/// On an NLB whose AWS `deletion_protection.enabled` attribute this CCM
/// turned on (`on`), or back off (`off`): only then does removing the
/// annotation turn the attribute off, so a protection set by hand (on a
/// load balancer the Go CCM made) is never undone.
pub(crate) const DELETION_PROTECTION_TAG: &str = "aws-ccm/deletion-protection";
/// On an NLB, its listeners and target groups: the `additional-resource-tags`
/// keys the controller applied ([`record_value`]), so that a key the
/// annotation drops is removed and a tag written by anyone else is not. The
/// key is upstream's (kubernetes/cloud-provider-aws PR #1447, which names it
/// for the same purpose), so after a swap either way one owner remains.
pub(crate) const MANAGED_TAGS_TAG: &str = "kubernetes.io/cloud-controller/managed-tags";
/// On a target group this CCM set attributes on: the
/// `target-group-attributes` keys it applied ([`record_value`]), so that a key
/// the annotation drops returns to AWS's default and a value nobody
/// recorded (the Go CCM's, a hand edit) is left alone.
pub(crate) const TARGET_GROUP_ATTRIBUTES_TAG: &str = "aws-ccm/target-group-attributes";
/// On a target group: the health-check timeout this CCM applied (cloud.conf
/// `NLBListenerSettings = true`); only a timeout so recorded returns to
/// AWS's default when the annotation is removed.
pub(crate) const HEALTH_TIMEOUT_TAG: &str = "aws-ccm/health-check-timeout";
/// On an NLB: the ALPN policy this CCM applied to its TLS listeners
/// (cloud.conf `NLBListenerSettings = true`); only a policy so recorded
/// returns to AWS's `None` when the annotation is removed.
pub(crate) const ALPN_POLICY_TAG: &str = "aws-ccm/alpn-policy";
/// On an NLB: the listener attributes this CCM applied to its TCP listeners
/// (cloud.conf `NLBListenerSettings = true`), as `<port>:<key>=<value>`
/// pieces; only an attribute so recorded returns to AWS's default when the
/// annotation no longer asks for it.
pub(crate) const LISTENER_ATTRIBUTES_TAG: &str = "aws-ccm/listener-attributes";
/// The NLB's records of listener settings this CCM applied: each claims a
/// listener write AWS took.
pub(crate) const LISTENER_SETTING_RECORDS: [&str; 2] = [ALPN_POLICY_TAG, LISTENER_ATTRIBUTES_TAG];
/// Longest tag value AWS takes.
pub(crate) const MAX_TAG_VALUE: usize = 256;
/// Longest tag key AWS takes.
const MAX_TAG_KEY: usize = 128;
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
    let mut tags = user_tags(additional);
    tags.insert(SERVICE_NAME_TAG.to_string(), service_key.to_string());
    tags.insert(cluster_tag_key(cluster_id), OWNED.to_string());
    if legacy && !cluster_id.is_empty() {
        tags.insert(LEGACY_CLUSTER_TAG.to_string(), cluster_id.to_string());
    }
    tags
}

/// The `additional-resource-tags` pairs the controller applies: all but
/// those whose key it writes itself ([`is_controller_tag`]).
pub(crate) fn user_tags(additional: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    additional
        .iter()
        .filter(|(k, _)| !is_controller_tag(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
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

/// Whether `key` is one the controller writes itself (ownership, the
/// Service's name, its records): an `additional-resource-tags` pair with
/// such a key is refused, never applied over the controller's value.
pub(crate) fn is_controller_tag(key: &str) -> bool {
    key.starts_with(CLUSTER_TAG_PREFIX)
        || [
            SERVICE_NAME_TAG,
            LEGACY_CLUSTER_TAG,
            APPLIED_TAG,
            APPLIED_SETTINGS_TAG,
            MANAGED_TAGS_TAG,
            TARGET_GROUP_ATTRIBUTES_TAG,
            HEALTH_TIMEOUT_TAG,
            ALPN_POLICY_TAG,
            LISTENER_ATTRIBUTES_TAG,
            KEPT_TAG,
            ADOPTED_TAG,
            DELETION_PROTECTION_TAG,
        ]
        .contains(&key)
}

/// The keys [`MANAGED_TAGS_TAG`] on `tags` records (none without it).
fn managed_keys(tags: &BTreeMap<String, String>) -> BTreeSet<String> {
    recorded_keys(tags, MANAGED_TAGS_TAG)
}

/// The keys record `tag` on `tags` holds ([`record_value`]; none without
/// it). Commas separate too: a record in that form cannot be on AWS, which
/// refuses them in a tag value, but costs nothing to read.
pub(crate) fn recorded_keys(tags: &BTreeMap<String, String>, tag: &str) -> BTreeSet<String> {
    tags.get(tag)
        .map(|v| {
            v.split([' ', ','])
                .filter(|k| !k.is_empty() && !is_controller_tag(k))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Of `keys`, those a record can hold: a key with a space or a comma in it
/// is applied but not recorded (so not removed when the annotation drops
/// it).
pub(crate) fn recordable<'a>(keys: impl IntoIterator<Item = &'a String>) -> BTreeSet<String> {
    keys.into_iter()
        .filter(|k| !k.contains([' ', ',']))
        .cloned()
        .collect()
}

/// The record of `keys` as a tag value: space-separated, as the `aws-ccm/applied`
/// record is (AWS takes letters, digits, spaces and `_.:/=+-@` in a tag
/// value, no comma); `None` when there are none, or they do not fit in one
/// value.
pub(crate) fn record_value(keys: &BTreeSet<String>) -> Option<String> {
    let record = keys.iter().cloned().collect::<Vec<_>>().join(" ");
    (!record.is_empty() && record.chars().count() <= MAX_TAG_VALUE).then_some(record)
}

/// The tag writes that take one resource's tags `have` to `want` (its
/// owned tags with `additional`, the annotation's): the missing or
/// different pairs to add, and the keys to remove, which are only those
/// [`MANAGED_TAGS_TAG`] says the controller applied and the annotation no
/// longer names. The record is brought up to date with any change of an
/// annotation key (and removed with the last one); a resource without a
/// record whose tags already match (one the Go CCM made) is left as it is.
pub(crate) fn follow_annotation(
    want: &BTreeMap<String, String>,
    additional: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> TagWrites {
    let mut add: BTreeMap<String, String> = want
        .iter()
        .filter(|(k, v)| have.get(*k) != Some(v) && added_to_existing(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let recorded = managed_keys(have);
    let mut remove: BTreeSet<String> = recorded
        .iter()
        .filter(|k| !additional.contains_key(*k) && have.contains_key(*k))
        .cloned()
        .collect();
    let keys = recordable(additional.keys());
    let touched = add.keys().any(|k| additional.contains_key(k)) || !remove.is_empty();
    let has_record = have.contains_key(MANAGED_TAGS_TAG);
    let record_right = has_record && recorded == keys;
    if (touched || has_record) && !record_right {
        match record_value(&keys) {
            Some(record) => {
                add.insert(MANAGED_TAGS_TAG.to_string(), record);
            }
            None if keys.is_empty() => {
                if has_record {
                    remove.insert(MANAGED_TAGS_TAG.to_string());
                }
            }
            None => tracing::warn!(
                keys = ?keys,
                "the additional-resource-tags keys do not fit in one tag value ({MAX_TAG_VALUE} characters): they are applied but not recorded in {MANAGED_TAGS_TAG}, so removing one from the annotation will not remove it; use fewer or shorter keys"
            ),
        }
    }
    // AWS refuses an AddTags past its 50 tags, and with it the rest of the
    // sync: the annotation's new keys that do not fit are left out (the Go
    // CCM writes none on a live NLB), with a log line, until room is made.
    let room = MAX_LB_TAGS.saturating_sub(have.len());
    let new_keys: Vec<String> = (add.keys())
        .filter(|k| !have.contains_key(*k) && additional.contains_key(*k))
        .cloned()
        .collect();
    let controller_new = (add.keys())
        .filter(|k| !have.contains_key(*k) && !additional.contains_key(*k))
        .count();
    if controller_new + new_keys.len() > room {
        let fit = room.saturating_sub(controller_new);
        let left_out = new_keys.get(fit..).unwrap_or_default();
        tracing::warn!(
            keys = ?left_out,
            "the resource would carry more than {MAX_LB_TAGS} tags, which AWS refuses: these additional-resource-tags keys are not applied; remove some tags"
        );
        for k in left_out {
            add.remove(k);
        }
    }
    TagWrites { add, remove }
}

/// The tags of a resource created for a Service: `tags` with the record of
/// the `additional-resource-tags` keys applied, when there are some (and room).
pub(crate) fn at_creation(
    tags: &BTreeMap<String, String>,
    additional: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut out = tags.clone();
    if let Some(record) = record_value(&recordable(additional.keys()))
        && out.len() < MAX_LB_TAGS
    {
        out.insert(MANAGED_TAGS_TAG.to_string(), record);
    }
    out
}

/// What [`follow_annotation`] asks of one resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TagWrites {
    pub(crate) add: BTreeMap<String, String>,
    pub(crate) remove: BTreeSet<String>,
}

impl TagWrites {
    pub(crate) fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty()
    }
}

/// Why the Elastic Load Balancing APIs (both) would refuse the tag
/// `key=value`, if they would (API reference, `Tag`: a key of 1 to 128 and
/// a value of at most 256 letters, digits, spaces and `_.:/=+-@`; the
/// `aws:` prefix is AWS's own).
pub(crate) fn aws_refusal(key: &str, value: &str) -> Option<String> {
    let allowed = |c: char| c.is_alphanumeric() || c == ' ' || "_.:/=+-@".contains(c);
    let bad_char = key.chars().chain(value.chars()).find(|c| !allowed(*c));
    if key.to_ascii_lowercase().starts_with("aws:") {
        Some(format!(
            "{key}: the aws: prefix is reserved for AWS's own tags"
        ))
    } else if key.is_empty() || key.chars().count() > MAX_TAG_KEY {
        Some(format!(
            "{key:?}: a tag key has 1 to {MAX_TAG_KEY} characters"
        ))
    } else if value.chars().count() > MAX_TAG_VALUE {
        Some(format!(
            "{key}: a tag value has at most {MAX_TAG_VALUE} characters"
        ))
    } else {
        bad_char.map(|c| {
            format!("{key}: {c:?} is not taken in a tag (letters, digits, spaces and _.:/=+-@ are)")
        })
    }
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
    fn keys_past_awss_fifty_tags_are_left_out() {
        let have: BTreeMap<String, String> = (0..48)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        let additional: BTreeMap<String, String> = ["a", "b", "c"]
            .map(|k| (k.to_string(), "1".to_string()))
            .into();
        let mut want = additional.clone();
        want.insert("k0".into(), "changed".into());
        let writes = follow_annotation(&want, &additional, &have);
        // Room for two new keys: the marker (the controller's own goes
        // first) and the first of the annotation's; the changed value of an
        // existing key takes no room.
        let new: Vec<&String> = (writes.add.keys())
            .filter(|k| !have.contains_key(*k))
            .collect();
        assert_eq!(new.len(), 2, "{writes:?}");
        assert_eq!(writes.add["k0"], "changed");
        assert!(writes.add.contains_key(MANAGED_TAGS_TAG), "{writes:?}");
        assert_eq!(have.len() + new.len(), MAX_LB_TAGS);
    }

    #[test]
    fn tags_aws_refuses_are_told_apart() {
        assert_eq!(aws_refusal("team", "a b/c=d+e-f@g_h.i:j"), None);
        assert_eq!(aws_refusal("équipe", "café"), None, "letters of any script");
        assert_eq!(aws_refusal("team", ""), None);
        assert_eq!(
            aws_refusal(&"k".repeat(MAX_TAG_KEY), &"v".repeat(MAX_TAG_VALUE)),
            None
        );
        for (key, value) in [
            ("aws:team", "a"),
            ("AWS:team", "a"),
            (&*"k".repeat(MAX_TAG_KEY + 1), "a"),
            ("team", &*"v".repeat(MAX_TAG_VALUE + 1)),
            ("team", "a#b"),
            ("te*m", "a"),
        ] {
            assert!(aws_refusal(key, value).is_some(), "{key}={value}");
        }
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
