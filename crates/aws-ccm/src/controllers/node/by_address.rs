//! A tainted Node whose name finds no instance, found by its address.
//!
//! A kubelet on a custom DHCP domain names its Node after its hostname
//! (`ip-10-0-1-5.corp.example`), which no instance has as its private DNS
//! name: without a providerID, the Go CCM leaves that Node tainted forever
//! (kubernetes/cloud-provider-aws #63, #384, #799). Here, when the lookup by
//! name finds nothing, the Node's instance is looked up by the Node's
//! address: the IPv4 addresses of `alpha.kubernetes.io/provided-node-ip`
//! (the kubelet's `--node-ip`) when it is set, else its `InternalIP`
//! addresses, each as an instance's primary private IPv4 address
//! (`DescribeInstances` filter `private-ip-address`, live instances only;
//! coalesced with other nodes' lookups at the door).
//!
//! An address alone is weak evidence, so the answer is accepted only as a
//! proof ([`judge`]): exactly one live instance has one of the Node's
//! addresses (in cloud.conf's `VPC` when it names one, else in any VPC of
//! the Region), that instance carries this cluster's tag, and no other Node
//! names it (by providerID or name) or, uninitialized, reports the same
//! address. Anything less ([`Refusal`]) keeps the taint and today's
//! `InstanceNotFound` Warning, which then says why.
//!
//! Nothing changes for a Node the Go CCM initializes: the name is looked
//! up first, as there, and the address only when the name found nothing.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use kube::ResourceExt;

use super::identity::{self, Lookup};
use super::plan::{PROVIDED_NODE_IP_ANNOTATION, is_uninitialized, parse_provided_node_ip};
use crate::controllers::cached_node::Node;
use crate::provider::instances::Instance;

/// The addresses a Node's instance is looked up by: the IPv4 addresses of
/// its `alpha.kubernetes.io/provided-node-ip` when that parses, else its
/// `InternalIP` IPv4 addresses, in order, each once.
pub(crate) fn node_addresses(node: &Node) -> Vec<Ipv4Addr> {
    let provided = (node.metadata.annotations.as_ref())
        .and_then(|a| a.get(PROVIDED_NODE_IP_ANNOTATION))
        .and_then(|value| parse_provided_node_ip(value).ok());
    let mut out: Vec<Ipv4Addr> = Vec::new();
    let mut keep = |ip: Ipv4Addr| {
        if !out.contains(&ip) {
            out.push(ip);
        }
    };
    if let Some(ips) = provided {
        for ip in ips {
            if let IpAddr::V4(ip) = ip {
                keep(ip);
            }
        }
        return out;
    }
    let addresses = (node.status.as_ref()).and_then(|s| s.addresses.as_deref());
    for address in addresses.unwrap_or_default() {
        if address.type_ == "InternalIP"
            && let Ok(IpAddr::V4(ip)) = address.address.parse::<IpAddr>()
        {
            keep(ip);
        }
    }
    out
}

/// Whether `lookup` for a Node falls back to its addresses when it finds
/// nothing: a lookup by name (an instance ID EC2 does not know is an
/// answer; a providerID is one too).
pub(crate) fn falls_back(lookup: &Lookup) -> bool {
    matches!(lookup, Lookup::ByPrivateDns(_))
}

/// What the proof is judged against.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules<'a> {
    pub(crate) cluster_id: &'a str,
    /// cloud.conf `VPC`: only instances in it count. `None`: every VPC of
    /// the Region counts, so the same address in two VPCs is ambiguous.
    pub(crate) vpc: Option<&'a str>,
}

/// An instance named in a refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    id: String,
    ip: Option<Ipv4Addr>,
    vpc: Option<String>,
}

impl Candidate {
    fn of(instance: &Instance) -> Candidate {
        Candidate {
            id: instance.id.clone(),
            ip: instance.private_ip,
            vpc: instance.vpc_id.as_deref().map(str::to_string),
        }
    }
}

impl fmt::Display for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.id)?;
        if let Some(ip) = self.ip {
            write!(f, " ({ip}")?;
            if let Some(vpc) = &self.vpc {
                write!(f, " in {vpc}")?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

fn list(candidates: &[Candidate]) -> String {
    let names: Vec<String> = candidates.iter().map(Candidate::to_string).collect();
    names.join(", ")
}

fn ips(addresses: &[Ipv4Addr]) -> String {
    let names: Vec<String> = addresses.iter().map(Ipv4Addr::to_string).collect();
    names.join(", ")
}

/// Why a Node's address does not prove its instance. Each says what was
/// found and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The Node reports no IPv4 address yet.
    NoAddress,
    /// No live instance has any of the addresses.
    NotFound {
        addresses: Vec<Ipv4Addr>,
        vpc: Option<String>,
    },
    /// Instances have the address, but none in cloud.conf's VPC.
    OutsideVpc { vpc: String, found: Vec<Candidate> },
    /// More than one live instance has one of the addresses.
    Ambiguous { found: Vec<Candidate> },
    /// The one instance lacks this cluster's tag.
    NotInCluster {
        instance: Candidate,
        cluster_id: String,
    },
    /// Another Node already names the instance, or reports the address.
    Claimed { instance: String, node: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NoAddress => write!(
                f,
                "the Node reports no IPv4 InternalIP address (nor {PROVIDED_NODE_IP_ANNOTATION}) to look its instance up by yet"
            ),
            Refusal::NotFound { addresses, vpc } => {
                write!(
                    f,
                    "no live instance has {} as its primary private address",
                    ips(addresses)
                )?;
                match vpc {
                    Some(vpc) => write!(f, " in {vpc}"),
                    None => Ok(()),
                }
            }
            Refusal::OutsideVpc { vpc, found } => write!(
                f,
                "{} has the address but is not in the cluster's VPC {vpc} (cloud.conf VPC)",
                list(found)
            ),
            Refusal::Ambiguous { found } => write!(
                f,
                "{} live instances have its address ({}): an address names one instance only \
                 within one VPC; set VPC in cloud.conf if they are in different VPCs",
                found.len(),
                list(found)
            ),
            Refusal::NotInCluster {
                instance,
                cluster_id,
            } => write!(
                f,
                "instance {instance} has the address but is not tagged as a member of cluster \
                 {cluster_id} (tag kubernetes.io/cluster/{cluster_id}=owned or shared)"
            ),
            Refusal::Claimed { instance, node } => write!(
                f,
                "instance {instance} has the address, but Node {node} already names it or reports \
                 the same address; delete the Node that is not this machine's"
            ),
        }
    }
}

/// The Node's instance, when `found` (every live instance the lookups of
/// `addresses` returned) proves it; else why not. `nodes` are the cluster's
/// Nodes (this one among them, or not).
pub(crate) fn judge(
    node: &Node,
    addresses: &[Ipv4Addr],
    found: &[Instance],
    rules: &Rules<'_>,
    nodes: &[Arc<Node>],
) -> Result<Instance, Refusal> {
    if addresses.is_empty() {
        return Err(Refusal::NoAddress);
    }
    let mut candidates: Vec<&Instance> = Vec::new();
    for instance in found {
        // A stand-in that ignored a filter proves nothing either.
        let has_address = instance
            .private_ip
            .is_some_and(|ip| addresses.contains(&ip));
        if has_address
            && !instance.state.is_terminated()
            && !candidates.iter().any(|c| c.id == instance.id)
        {
            candidates.push(instance);
        }
    }
    candidates.sort_by(|a, b| a.id.cmp(&b.id));
    let (inside, outside): (Vec<&Instance>, Vec<&Instance>) = match rules.vpc {
        Some(vpc) => (candidates.iter()).partition(|i| i.vpc_id.as_deref() == Some(vpc)),
        None => (candidates, Vec::new()),
    };
    let instance = match (inside.as_slice(), rules.vpc) {
        ([], Some(vpc)) if !outside.is_empty() => {
            return Err(Refusal::OutsideVpc {
                vpc: vpc.to_string(),
                found: outside.iter().map(|i| Candidate::of(i)).collect(),
            });
        }
        ([], vpc) => {
            return Err(Refusal::NotFound {
                addresses: addresses.to_vec(),
                vpc: vpc.map(str::to_string),
            });
        }
        ([one], _) => *one,
        (many, _) => {
            return Err(Refusal::Ambiguous {
                found: many.iter().map(|i| Candidate::of(i)).collect(),
            });
        }
    };
    if !instance.is_in_cluster(rules.cluster_id) {
        return Err(Refusal::NotInCluster {
            instance: Candidate::of(instance),
            cluster_id: rules.cluster_id.to_string(),
        });
    }
    if let Some(other) = claimant(node, instance, addresses, nodes) {
        return Err(Refusal::Claimed {
            instance: instance.id.clone(),
            node: other,
        });
    }
    Ok(instance.clone())
}

/// Another Node that names `instance` (its providerID, or its name as the
/// instance's ID or private DNS name), or that is uninitialized without a
/// providerID and reports one of `addresses` too.
fn claimant(
    node: &Node,
    instance: &Instance,
    addresses: &[Ipv4Addr],
    nodes: &[Arc<Node>],
) -> Option<String> {
    let this = node.name_any();
    let names_it = |other: &Node| {
        let name = other.name_any();
        identity::instance_id_of(other).as_deref() == Some(instance.id.as_str())
            || instance.private_dns_name.as_deref() == Some(name.as_str())
            || identity::lookup_for_name(&name) == Ok(Lookup::ById(instance.id.clone()))
    };
    let reports_it = |other: &Node| {
        is_uninitialized(other)
            && identity::instance_id_of(other).is_none()
            && node_addresses(other)
                .iter()
                .any(|ip| addresses.contains(ip))
    };
    (nodes.iter())
        .filter(|other| other.name_any() != this)
        .find(|other| names_it(other) || reports_it(other))
        .map(|other| other.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::cached_node::{NodeSpec, NodeStatus};
    use crate::provider::instances::InstanceState;
    use crate::provider::instances::fake::instance;
    use k8s_openapi::api::core::v1::{NodeAddress, Taint};
    use kube::api::ObjectMeta;

    fn dhcp_node(name: &str, internal: &[&str], provided: Option<&str>) -> Node {
        let mut addresses: Vec<NodeAddress> = (internal.iter())
            .map(|a| NodeAddress {
                type_: "InternalIP".into(),
                address: a.to_string(),
            })
            .collect();
        addresses.push(NodeAddress {
            type_: "Hostname".into(),
            address: name.into(),
        });
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: provided
                    .map(|p| [(PROVIDED_NODE_IP_ANNOTATION.to_string(), p.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: super::super::plan::UNINITIALIZED_TAINT.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(addresses),
                ..Default::default()
            }),
        }
    }

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("test IP")
    }

    const RULES: Rules<'static> = Rules {
        cluster_id: "test",
        vpc: None,
    };

    #[test]
    fn the_provided_node_ip_wins_over_the_internal_addresses() {
        let n = dhcp_node("n", &["10.0.1.5", "fd00::5", "10.0.1.5", "10.0.2.9"], None);
        assert_eq!(node_addresses(&n), [ip("10.0.1.5"), ip("10.0.2.9")]);
        let n = dhcp_node("n", &["10.0.1.5"], Some("10.0.3.3,fd00::3"));
        assert_eq!(node_addresses(&n), [ip("10.0.3.3")]);
        // A value the kubelet could not have written is no address; the
        // plan refuses it later, naming the fix.
        let n = dhcp_node("n", &["10.0.1.5"], Some("not-an-ip"));
        assert_eq!(node_addresses(&n), [ip("10.0.1.5")]);
        assert!(node_addresses(&dhcp_node("n", &["fd00::1"], None)).is_empty());
        assert!(falls_back(&Lookup::ByPrivateDns("n".into())));
        assert!(!falls_back(&Lookup::ById("i-1".into())));
    }

    #[test]
    fn exactly_one_tagged_live_instance_with_the_address_is_the_proof() {
        let n = dhcp_node("ip-10-0-1-5.corp.example", &["10.0.1.5"], None);
        let addresses = node_addresses(&n);
        let only = instance("i-1", "10.0.1.5");
        let found = judge(&n, &addresses, std::slice::from_ref(&only), &RULES, &[]);
        assert_eq!(found, Ok(only.clone()));

        // Nothing, or only a terminated instance, or another address.
        let mut gone = instance("i-gone", "10.0.1.5");
        gone.state = InstanceState::Terminated;
        let other = instance("i-other", "10.0.1.6");
        assert_eq!(
            judge(&n, &addresses, &[gone, other], &RULES, &[]),
            Err(Refusal::NotFound {
                addresses: addresses.clone(),
                vpc: None
            })
        );
        assert_eq!(
            judge(&n, &[], std::slice::from_ref(&only), &RULES, &[]),
            Err(Refusal::NoAddress)
        );

        // Two instances, even one of them untagged, in another VPC.
        let mut twin = instance("i-2", "10.0.1.5");
        twin.tags.clear();
        twin.vpc_id = Some("vpc-2".into());
        let both = [twin.clone(), only.clone()];
        let refused = judge(&n, &addresses, &both, &RULES, &[]).unwrap_err();
        assert!(matches!(&refused, Refusal::Ambiguous { found } if found.len() == 2));
        let note = refused.to_string();
        assert!(
            note.contains("i-1 (10.0.1.5 in vpc-1)") && note.contains("i-2"),
            "{note}"
        );
        assert!(note.contains("set VPC in cloud.conf"), "{note}");

        // With cloud.conf's VPC the other VPC's instance does not count...
        let in_vpc = |vpc: &'static str| Rules {
            vpc: Some(vpc),
            ..RULES
        };
        assert_eq!(
            judge(&n, &addresses, &both, &in_vpc("vpc-1"), &[]),
            Ok(only.clone())
        );
        // ...and an instance only there is named.
        let refused = judge(&n, &addresses, &both, &in_vpc("vpc-9"), &[]).unwrap_err();
        assert!(matches!(&refused, Refusal::OutsideVpc { found, .. } if found.len() == 2));
        assert!(refused.to_string().contains("cloud.conf VPC"), "{refused}");

        // One instance, untagged or another cluster's.
        let refused = judge(&n, &addresses, &[twin], &RULES, &[]).unwrap_err();
        assert!(matches!(refused, Refusal::NotInCluster { .. }));
        assert!(
            refused.to_string().contains("kubernetes.io/cluster/test"),
            "{refused}"
        );
    }

    #[test]
    fn an_instance_another_node_names_or_shares_an_address_with_is_no_proof() {
        let n = Arc::new(dhcp_node("dhcp-a.corp.example", &["10.0.1.5"], None));
        let addresses = node_addresses(&n);
        let found = [instance("i-1", "10.0.1.5")];
        let judged = |others: Vec<Node>| {
            let mut nodes: Vec<Arc<Node>> = others.into_iter().map(Arc::new).collect();
            nodes.push(n.clone());
            judge(&n, &addresses, &found, &RULES, &nodes)
        };
        assert!(judged(vec![]).is_ok(), "this Node itself is no other");
        let mut by_pid = dhcp_node("old.corp.example", &[], None);
        by_pid.spec.get_or_insert_default().provider_id = Some("aws:///us-east-1a/i-1".into());
        let by_dns = dhcp_node("ip-10-0-1-5.ec2.internal", &[], None);
        let by_id = dhcp_node("i-1.us-east-1.compute.internal", &[], None);
        let same_ip = dhcp_node("dhcp-b.corp.example", &["10.0.1.5"], None);
        for other in [by_pid, by_dns, by_id, same_ip] {
            let name = other.name_any();
            assert_eq!(
                judged(vec![other]),
                Err(Refusal::Claimed {
                    instance: "i-1".into(),
                    node: name
                })
            );
        }
        // An initialized Node elsewhere with the same address names
        // another instance by its providerID: no claim on this one.
        let mut elsewhere = dhcp_node("far.corp.example", &["10.0.1.5"], None);
        let spec = elsewhere.spec.get_or_insert_default();
        spec.provider_id = Some("aws:///us-east-1a/i-9".into());
        spec.taints = None;
        assert!(judged(vec![elsewhere]).is_ok());
    }
}
