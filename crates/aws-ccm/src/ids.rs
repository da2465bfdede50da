//! The one reader (and writer) of Kubernetes provider IDs (`Node.spec.providerID`): which
//! EC2 instance a Node is. Every controller (node, node lifecycle, tagging,
//! route, service) asks here, so a Node is the same instance to all of them.
//!
//! Forms, as upstream's `KubernetesInstanceID.MapToAWSInstanceID` reads them
//! (pkg/providers/v1/instances.go): a value starting with `aws://` is a URL
//! whose authority (a zone in `aws://<zone>/<id>`, empty in
//! `aws:///<zone>/<id>`) is ignored; any other value is read as a bare path
//! (upstream prefixes it with `aws:////`), so `i-0123456789abcdef0` and
//! `us-east-1a/i-0123…` work too. Query and fragment are not path. The
//! instance ID is the last non-empty path segment and must start with `i-`.
//!
//! Differences, all on values that name no instance: upstream accepts any
//! text after `i-` but `/` (`i-`, `i-a b`), which then matches no instance and
//! is skipped; here only letters and digits are accepted, so such a Node is
//! reported as malformed. Fargate IDs (`fargate-…`) are recognised and
//! refused: this build manages EC2 instances only, and upstream finds no
//! instance for them in the load-balancer path either.
//!
//! The zone of a provider ID is its first path segment when the path is
//! `<zone>/<id>` (`aws:///us-east-1a/i-…`, bare `us-east-1a/i-…`), else the
//! authority of `aws://us-east-1a/i-…`; `aws:///i-…`, `aws:////i-…` and a
//! bare ID name none. Its Region is upstream's `azToRegion`
//! ([`region_of_zone`]): `us-east-1a`, the Local Zone `us-east-1-bos-1a` and
//! the Wavelength Zone `us-east-1-wl1-bos-wlz-1` are all in `us-east-1`. A
//! Node whose zone is in another Region is not this CCM's to look up or
//! judge ([`node_outside_region`]): a cluster that spans Regions runs one
//! CCM per Region, and an instance another Region holds is never found in
//! this one (upstream issue #939, open PR #1372). A Node whose providerID
//! names no zone, or a value that is no zone, is in this CCM's Region, as
//! before.

use crate::cloud_config::region_of_zone;
use crate::controllers::cached_node::Node;

/// The form this CCM writes and documents in every error.
pub(crate) const EXPECTED_FORM: &str =
    "aws:///<availability-zone>/<instance-id> (e.g. aws:///us-east-1a/i-0123456789abcdef0)";

/// Why a provider ID names no EC2 instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderIdError {
    #[error("it is empty")]
    Empty,
    #[error("it has no instance ID")]
    NoId,
    #[error("it names a Fargate pod, not an EC2 instance")]
    Fargate,
    #[error("its last path segment is not an EC2 instance ID (i-...)")]
    NotAnInstance,
}

/// A Node whose providerID names no EC2 instance.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {node} has spec.providerID {value:?}, which names no EC2 instance ({reason}); \
     expected {EXPECTED_FORM} or a bare instance ID"
)]
pub(crate) struct NodeProviderIdError {
    pub(crate) node: String,
    pub(crate) value: String,
    reason: ProviderIdError,
}

/// The provider ID of an instance, `aws:///<zone>/<instance-id>`, as the Go
/// CCM writes it (`aws:///<instance-id>` when the zone is unknown).
pub fn format_provider_id(zone: Option<&str>, instance_id: &str) -> String {
    match zone {
        Some(zone) => format!("aws:///{zone}/{instance_id}"),
        None => format!("aws:///{instance_id}"),
    }
}

/// The EC2 instance ID in a provider ID, in every form upstream accepts.
pub fn parse_provider_id(value: &str) -> Result<String, ProviderIdError> {
    if value.trim().is_empty() {
        return Err(ProviderIdError::Empty);
    }
    let path = match value.strip_prefix("aws://") {
        // Skip the authority: everything up to the first `/`.
        Some(rest) => rest.find('/').map_or("", |slash| &rest[slash..]),
        None => value,
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let id = path
        .trim_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default();
    if id.is_empty() {
        return Err(ProviderIdError::NoId);
    }
    if id.starts_with("fargate-") {
        return Err(ProviderIdError::Fargate);
    }
    if !is_instance_id(id) {
        return Err(ProviderIdError::NotAnInstance);
    }
    Ok(id.to_string())
}

/// The zone a provider ID names, if any (see the module's note on forms).
fn provider_id_zone(value: &str) -> Option<&str> {
    let (authority, path) = match value.strip_prefix("aws://") {
        Some(rest) => rest.split_at(rest.find('/').unwrap_or(rest.len())),
        None => ("", value),
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let zone = match segments.as_slice() {
        [zone, _id] => *zone,
        [_id] if !authority.is_empty() => authority,
        _ => return None,
    };
    region_of_zone(zone).map(|_| zone)
}

/// A Node whose providerID names a zone in another Region than the CCM's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {node} has spec.providerID {value:?}, in zone {zone} of Region {region}, not this CCM's \
     Region {ours}; it is left to the CCM of {region}"
)]
pub(crate) struct OutsideRegion {
    pub(crate) node: String,
    value: String,
    pub(crate) zone: String,
    pub(crate) region: String,
    pub(crate) ours: String,
}

/// `Some` when `node`'s providerID places it in a Region other than `ours`:
/// no controller looks its instance up or acts on it.
pub(crate) fn node_outside_region(node: &Node, ours: &str) -> Option<OutsideRegion> {
    let value = node.spec.as_ref()?.provider_id.as_deref()?;
    let zone = provider_id_zone(value)?;
    let region = region_of_zone(zone)?;
    (region != ours).then(|| OutsideRegion {
        node: node.metadata.name.clone().unwrap_or_default(),
        value: value.to_string(),
        zone: zone.to_string(),
        region: region.to_string(),
        ours: ours.to_string(),
    })
}

/// `i-` followed by letters and digits (`i-12345678`, `i-0123456789abcdef0`).
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-")
        .is_some_and(|rest| !rest.is_empty() && rest.chars().all(|c| c.is_ascii_alphanumeric()))
}

/// The instance a Node's providerID names: `Ok(None)` when it has none (not
/// yet initialized), an error naming the Node, the value and the expected
/// form when it is set but names no instance.
pub(crate) fn node_instance_id(node: &Node) -> Result<Option<String>, NodeProviderIdError> {
    let Some(value) = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|v| !v.is_empty())
    else {
        return Ok(None);
    };
    parse_provider_id(value)
        .map(Some)
        .map_err(|reason| NodeProviderIdError {
            node: node.metadata.name.clone().unwrap_or_default(),
            value: value.to_string(),
            reason,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::NodeSpec;
    use kube::api::ObjectMeta;

    #[test]
    fn every_upstream_provider_id_form_parses() {
        let id = "i-0123456789abcdef0";
        for form in [
            "aws:///us-east-1a/i-0123456789abcdef0",
            "aws:////i-0123456789abcdef0",
            "aws:///i-0123456789abcdef0",
            "aws://us-east-1a/i-0123456789abcdef0",
            // Bare: upstream reads it as the path of aws:////<value>.
            "i-0123456789abcdef0",
            "us-east-1a/i-0123456789abcdef0",
            // The last path segment, whatever comes before.
            "aws:///us-east-1a/extra/i-0123456789abcdef0",
            "aws:///us-east-1a/i-0123456789abcdef0/",
            "aws:///us-east-1a/i-0123456789abcdef0?x=1",
            "aws:///us-east-1a/i-0123456789abcdef0#f",
        ] {
            assert_eq!(parse_provider_id(form).as_deref(), Ok(id), "{form}");
        }
        assert_eq!(
            parse_provider_id("aws:///us-east-1a/i-12345678").as_deref(),
            Ok("i-12345678"),
            "the short, old ID format"
        );
    }

    #[test]
    fn malformed_provider_ids_are_rejected_with_a_reason() {
        use ProviderIdError::*;
        for (bad, why) in [
            ("", Empty),
            (" ", Empty),
            ("aws://", NoId),
            ("aws:///", NoId),
            ("aws:///us-east-1a/", NotAnInstance),
            ("aws://us-east-1a", NoId),
            ("aws:///us-east-1a/vol-0123", NotAnInstance),
            ("gce://project/zone/instance-1", NotAnInstance),
            ("aws:///us-east-1a/i-", NotAnInstance),
            ("aws:///us-east-1a/i-01 23", NotAnInstance),
            ("azure:///subscriptions/x/i-123/vm", NotAnInstance),
            ("aws:///us-east-1a/fargate-ip-10-0-0-1", Fargate),
        ] {
            assert_eq!(parse_provider_id(bad), Err(why), "{bad:?}");
        }
    }

    fn node(provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("worker-1".into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_without_a_provider_id_has_no_instance_yet() {
        assert_eq!(node_instance_id(&node(None)), Ok(None));
        assert_eq!(node_instance_id(&node(Some(""))), Ok(None));
        assert_eq!(
            node_instance_id(&node(Some("i-0abc"))),
            Ok(Some("i-0abc".into()))
        );
    }

    #[test]
    fn the_zone_of_a_provider_id_is_read_from_every_form_that_names_one() {
        for (value, zone) in [
            ("aws:///us-east-1a/i-0123456789abcdef0", Some("us-east-1a")),
            ("aws://us-east-1a/i-0123456789abcdef0", Some("us-east-1a")),
            ("us-east-1a/i-0123456789abcdef0", Some("us-east-1a")),
            ("aws:///eu-west-1b/i-1?x=1", Some("eu-west-1b")),
            ("aws:///us-east-1-bos-1a/i-1", Some("us-east-1-bos-1a")),
            (
                "aws:///us-east-1-wl1-bos-wlz-1/i-1",
                Some("us-east-1-wl1-bos-wlz-1"),
            ),
            // No zone: in the CCM's Region, as before.
            ("aws:///i-0123456789abcdef0", None),
            ("aws:////i-0123456789abcdef0", None),
            ("i-0123456789abcdef0", None),
            // A segment that is no zone, or more segments than <zone>/<id>.
            ("aws:///oops/i-1", None),
            ("aws:///us-east-1a/extra/i-1", None),
            ("aws://us-east-1a/extra/i-1", None),
        ] {
            assert_eq!(provider_id_zone(value), zone, "{value}");
        }
    }

    #[test]
    fn only_a_zone_of_another_region_puts_a_node_outside_the_ccms() {
        for (value, region) in [
            ("aws:///eu-west-1a/i-1", Some("eu-west-1")),
            ("aws://ap-southeast-2c/i-1", Some("ap-southeast-2")),
            ("aws:///us-west-2-lax-1a/i-1", Some("us-west-2")),
            ("aws:///us-west-2-wl1-den-wlz-1/i-1", Some("us-west-2")),
            ("aws:///us-east-1a/i-1", None),
            ("aws:///us-east-1-bos-1a/i-1", None),
            ("aws:///us-east-1-wl1-bos-wlz-1/i-1", None),
            ("aws:///i-1", None),
            ("i-1", None),
        ] {
            let outside = node_outside_region(&node(Some(value)), "us-east-1");
            assert_eq!(
                outside.as_ref().map(|o| o.region.as_str()),
                region,
                "{value}"
            );
        }
        assert_eq!(node_outside_region(&node(None), "us-east-1"), None);
        let text = node_outside_region(&node(Some("aws:///eu-west-1a/i-1")), "us-east-1")
            .unwrap()
            .to_string();
        for part in ["worker-1", "eu-west-1a", "eu-west-1", "us-east-1"] {
            assert!(text.contains(part), "{text} lacks {part}");
        }
    }

    #[test]
    fn a_malformed_provider_id_error_names_node_value_and_expected_form() {
        let err = node_instance_id(&node(Some("aws:///us-east-1a/oops"))).unwrap_err();
        assert_eq!(err.reason, ProviderIdError::NotAnInstance);
        let text = err.to_string();
        for part in ["worker-1", "\"aws:///us-east-1a/oops\"", EXPECTED_FORM] {
            assert!(text.contains(part), "{text} lacks {part}");
        }
    }
}
