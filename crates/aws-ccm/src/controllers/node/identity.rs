//! Which EC2 instance a Node is: from its `spec.providerID`, else from its
//! name, by the Go CCM's rules.
//!
//! Provider IDs are read by [`crate::ids`], the project's one parser
//! (`aws:///<zone>/<instance-id>`, `aws:////<id>`, `aws://<zone>/<id>`, a
//! bare `i-…`, as upstream).
//!
//! Node names: a resource-based name (`i-0123456789abcdef0`, optionally with
//! a domain: `i-0123456789abcdef0.us-west-2.compute.internal`) gives the
//! instance ID directly; any other name is looked up as the instance's
//! private DNS name (`ip-10-0-1-23.ec2.internal`,
//! `ip-10-0-1-23.eu-west-1.compute.internal`, ...).
//!
//! A Node whose providerID names a zone of another Region has no lookup
//! here ([`IdentityError::OutsideRegion`], decided by
//! [`crate::ids::node_outside_region`]): this CCM's Region does not hold its
//! instance, so "not found" would prove nothing, and that Node is the
//! other Region's CCM's.

use std::fmt;

use crate::controllers::cached_node::Node;
pub(crate) use crate::ids::{OutsideRegion, ProviderIdError, is_instance_id, parse_provider_id};

/// How to find a node's instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Lookup {
    /// By instance ID (from the providerID or a resource-based node name).
    ById(String),
    /// By the instance's private DNS name (an IP-based node name).
    ByPrivateDns(String),
}

impl fmt::Display for Lookup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lookup::ById(id) => write!(f, "instance ID {id}"),
            Lookup::ByPrivateDns(name) => write!(f, "private DNS name {name}"),
        }
    }
}

/// Why a node's instance cannot be determined.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IdentityError {
    #[error(
        "node {node} has spec.providerID {value:?}, which is not an AWS provider ID ({reason}). \
         Expected {form}. \
         spec.providerID cannot be changed once set: delete the Node and let the kubelet re-register it \
         without --provider-id, or with a correct one"
    )]
    InvalidProviderId {
        node: String,
        value: String,
        reason: ProviderIdError,
        form: &'static str,
    },
    #[error(
        "node {node} has spec.providerID {value:?}, which names a Fargate pod, not an EC2 instance; \
         this build does not manage Fargate nodes"
    )]
    Fargate { node: String, value: String },
    #[error("node has an empty name")]
    EmptyName,
    #[error(transparent)]
    OutsideRegion(#[from] OutsideRegion),
}

/// How a node name (without a providerID) maps to a lookup.
pub(crate) fn lookup_for_name(name: &str) -> Result<Lookup, IdentityError> {
    if name.is_empty() {
        return Err(IdentityError::EmptyName);
    }
    // Resource-based names: the instance ID, possibly with a domain suffix
    // (RHEL-like distributions use the FQDN as hostname).
    let first_label = name.split('.').next().unwrap_or(name);
    if is_instance_id(first_label) {
        return Ok(Lookup::ById(first_label.to_string()));
    }
    Ok(Lookup::ByPrivateDns(name.to_string()))
}

/// The lookup for a node in `region`, the CCM's: its providerID when set,
/// else its name.
pub(crate) fn lookup_for_node(node: &Node, region: &str) -> Result<Lookup, IdentityError> {
    if let Some(outside) = crate::ids::node_outside_region(node, region) {
        return Err(outside.into());
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    match node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
    {
        Some(value) => match parse_provider_id(value) {
            Ok(id) => Ok(Lookup::ById(id)),
            Err(ProviderIdError::Fargate) => Err(IdentityError::Fargate {
                node: name,
                value: value.to_string(),
            }),
            Err(reason) => Err(IdentityError::InvalidProviderId {
                node: name,
                value: value.to_string(),
                reason,
                form: crate::ids::EXPECTED_FORM,
            }),
        },
        None => lookup_for_name(&name),
    }
}

/// The instance ID a node's providerID names, if it is set and valid.
pub(crate) fn instance_id_of(node: &Node) -> Option<String> {
    crate::ids::node_instance_id(node).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::NodeSpec;
    use kube::api::ObjectMeta;

    #[test]
    fn node_names_map_to_the_right_lookup() {
        assert_eq!(
            lookup_for_name("i-0123456789abcdef0"),
            Ok(Lookup::ById("i-0123456789abcdef0".into()))
        );
        assert_eq!(
            lookup_for_name("i-0123456789abcdef0.us-west-2.compute.internal"),
            Ok(Lookup::ById("i-0123456789abcdef0".into()))
        );
        assert_eq!(
            lookup_for_name("ip-10-0-1-23.ec2.internal"),
            Ok(Lookup::ByPrivateDns("ip-10-0-1-23.ec2.internal".into()))
        );
        assert_eq!(
            lookup_for_name("ip-10-0-1-23.eu-west-1.compute.internal"),
            Ok(Lookup::ByPrivateDns(
                "ip-10-0-1-23.eu-west-1.compute.internal".into()
            ))
        );
        // Not an instance ID: looked up as a DNS name, as upstream.
        assert_eq!(
            lookup_for_name("i-am-a-node.corp.example"),
            Ok(Lookup::ByPrivateDns("i-am-a-node.corp.example".into()))
        );
        assert_eq!(lookup_for_name(""), Err(IdentityError::EmptyName));
    }

    fn node(name: &str, provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
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
    fn the_provider_id_wins_over_the_name() {
        let n = node(
            "worker-1.corp.example",
            Some("aws:///us-east-1b/i-0aaaaaaaaaaaaaaaa"),
        );
        assert_eq!(
            lookup_for_node(&n, "us-east-1"),
            Ok(Lookup::ById("i-0aaaaaaaaaaaaaaaa".into()))
        );
        assert_eq!(instance_id_of(&n).as_deref(), Some("i-0aaaaaaaaaaaaaaaa"));
        let n = node("ip-10-0-0-1.ec2.internal", Some(""));
        assert_eq!(
            lookup_for_node(&n, "us-east-1"),
            Ok(Lookup::ByPrivateDns("ip-10-0-0-1.ec2.internal".into()))
        );
    }

    #[test]
    fn a_malformed_provider_id_error_names_node_value_and_fix() {
        let n = node("worker-1", Some("aws:///us-east-1a/oops"));
        let err = lookup_for_node(&n, "us-east-1").unwrap_err().to_string();
        assert!(err.contains("worker-1"), "{err}");
        assert!(err.contains("aws:///us-east-1a/oops"), "{err}");
        assert!(err.contains("delete the Node"), "{err}");
        let n = node("fg", Some("aws:///us-east-1a/fargate-ip-10-0-0-1"));
        assert!(matches!(
            lookup_for_node(&n, "us-east-1"),
            Err(IdentityError::Fargate { .. })
        ));
    }

    #[test]
    fn a_node_of_another_region_has_no_lookup() {
        let n = node("worker-eu", Some("aws:///eu-west-1a/i-0aaaaaaaaaaaaaaaa"));
        assert!(matches!(
            lookup_for_node(&n, "us-east-1"),
            Err(IdentityError::OutsideRegion(o)) if o.zone == "eu-west-1a" && o.region == "eu-west-1"
        ));
        assert_eq!(
            lookup_for_node(&n, "eu-west-1"),
            Ok(Lookup::ById("i-0aaaaaaaaaaaaaaaa".into()))
        );
    }
}
