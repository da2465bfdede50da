//! `--cluster-cidr` and the node mask flags, parsed and checked once at
//! start-up so a bad value stops the process with a message naming it,
//! instead of surfacing later as a controller that silently does nothing.
//!
//! The rules are upstream's (k8s.io/cloud-provider `processCIDRs` and the
//! node IPAM mask selection): one CIDR, or two of different IP families for
//! dual-stack; IPv4 nodes get /24 and IPv6 nodes /64 unless told otherwise;
//! `--node-cidr-mask-size` is the single-stack flag and cannot be mixed with
//! the per-family ones; a cluster CIDR may hold at most 2^16 node CIDRs.

use std::fmt;

use ipnet::IpNet;

/// Default node mask of IPv4 pod ranges (upstream's).
const DEFAULT_NODE_MASK_IPV4: u8 = 24;
/// Default node mask of IPv6 pod ranges (upstream's).
const DEFAULT_NODE_MASK_IPV6: u8 = 64;
/// Upstream's cap on node CIDRs per cluster CIDR: node mask − cluster mask ≤ 16.
const MAX_NODE_MASK_DIFF: u8 = 16;

/// IP family of a CIDR.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub(crate) fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// A bad `--cluster-cidr` or node mask flag. Every message names the flag and
/// the value and says what would be accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    #[error(
        "--cluster-cidr is empty but {needed_by} needs it: set --cluster-cidr to the pod range, e.g. \
         --cluster-cidr=10.244.0.0/16 (or 10.244.0.0/16,fd00:10:244::/56 for dual-stack)"
    )]
    Missing { needed_by: String },
    #[error(
        "--cluster-cidr={value:?}: {item:?} is not a CIDR; expected an address and a prefix length such as \
         10.244.0.0/16 or fd00:10:244::/56, comma-separated for dual-stack"
    )]
    NotACidr { value: String, item: String },
    #[error(
        "--cluster-cidr={value:?} has {count} CIDRs; give one, or two (one IPv4 and one IPv6) for dual-stack"
    )]
    TooMany { value: String, count: usize },
    #[error(
        "--cluster-cidr={value:?} has two {family} CIDRs; dual-stack takes exactly one IPv4 and one IPv6 CIDR \
         (to widen a range, use one larger CIDR)"
    )]
    SameFamily { value: String, family: Family },
    #[error(
        "--node-cidr-mask-size cannot be used with the dual-stack --cluster-cidr={value:?}: use \
         --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6"
    )]
    SingleStackMaskWithDualStack { value: String },
    #[error(
        "--node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 cannot be combined with --node-cidr-mask-size: \
         for a single-stack cluster use --node-cidr-mask-size alone, for dual-stack the per-family flags"
    )]
    MixedMaskFlags,
    #[error(
        "--{flag} is set but --cluster-cidr={value:?} has no {family} CIDR; remove the flag or add a {family} \
         range to --cluster-cidr"
    )]
    MaskForAbsentFamily {
        flag: &'static str,
        value: String,
        family: Family,
    },
    #[error(
        "--{flag}={mask} is not a valid {family} prefix length; use 1 to {max} (default {default})",
        max = if *.family == Family::V4 { 32 } else { 128 },
        default = if *.family == Family::V4 { DEFAULT_NODE_MASK_IPV4 } else { DEFAULT_NODE_MASK_IPV6 },
    )]
    MaskOutOfRange {
        flag: &'static str,
        mask: u8,
        family: Family,
    },
    #[error(
        "--cluster-cidr={cidr} is smaller than one node's range: its prefix /{cluster_prefix} is longer than the \
         node mask /{node_mask} (--{flag}); use a larger cluster CIDR or a node mask of at least /{cluster_prefix}"
    )]
    ClusterSmallerThanNode {
        cidr: IpNet,
        cluster_prefix: u8,
        node_mask: u8,
        flag: &'static str,
    },
    #[error(
        "--cluster-cidr={cidr} with node mask /{node_mask} (--{flag}) makes 2^{diff} node CIDRs; at most 2^16 are \
         allowed: use a node mask of at most /{max_mask}, or a smaller cluster CIDR",
        diff = .node_mask - .cidr.prefix_len(),
        max_mask = .cidr.prefix_len() + MAX_NODE_MASK_DIFF,
    )]
    TooManyNodeCidrs {
        cidr: IpNet,
        node_mask: u8,
        flag: &'static str,
    },
}

/// The validated `--cluster-cidr`: one CIDR, or one per family, in the order
/// given (the first is the node's primary `spec.podCIDR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterCidrs {
    cidrs: Vec<IpNet>,
}

impl ClusterCidrs {
    /// Parses `--cluster-cidr`. Host bits are dropped (`10.244.1.0/16` is
    /// `10.244.0.0/16`), as Go's `net.ParseCIDR` does.
    pub fn parse(value: &str, needed_by: &str) -> Result<ClusterCidrs, CidrError> {
        let trimmed = value.trim();
        if trimmed.is_empty() {
            return Err(CidrError::Missing {
                needed_by: needed_by.to_string(),
            });
        }
        let mut cidrs = Vec::new();
        for item in trimmed.split(',') {
            let item = item.trim();
            let net: IpNet = item.parse().map_err(|_| CidrError::NotACidr {
                value: value.to_string(),
                item: item.to_string(),
            })?;
            cidrs.push(net.trunc());
        }
        if cidrs.len() > 2 {
            return Err(CidrError::TooMany {
                value: value.to_string(),
                count: cidrs.len(),
            });
        }
        if cidrs.len() == 2 && Family::of(&cidrs[0]) == Family::of(&cidrs[1]) {
            return Err(CidrError::SameFamily {
                value: value.to_string(),
                family: Family::of(&cidrs[0]),
            });
        }
        Ok(ClusterCidrs { cidrs })
    }

    /// The CIDRs, primary first.
    pub fn cidrs(&self) -> &[IpNet] {
        &self.cidrs
    }

    pub(crate) fn is_dual_stack(&self) -> bool {
        self.cidrs.len() == 2
    }

    /// Whether `net` lies wholly inside one of the cluster CIDRs.
    pub(crate) fn contains(&self, net: &IpNet) -> bool {
        self.cidrs.iter().any(|c| c.contains(net))
    }

    fn has(&self, family: Family) -> bool {
        self.cidrs.iter().any(|c| Family::of(c) == family)
    }
}

impl fmt::Display for ClusterCidrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.cidrs.iter().map(|c| c.to_string()).collect();
        f.write_str(&parts.join(","))
    }
}

/// One range node CIDRs are cut from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeCidrRange {
    pub(crate) cluster_cidr: IpNet,
    /// Prefix length of each node's CIDR.
    pub(crate) node_mask: u8,
}

/// What node IPAM allocates from: one range per cluster CIDR, primary first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCidrAllocation {
    pub(crate) cluster: ClusterCidrs,
    pub(crate) ranges: Vec<NodeCidrRange>,
}

/// The node mask flags as given (`None` = not set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaskFlags {
    pub(crate) node_cidr_mask_size: Option<u8>,
    pub(crate) ipv4: Option<u8>,
    pub(crate) ipv6: Option<u8>,
}

/// A family's node mask and the flag it came from (for error messages).
type NodeMask = (u8, &'static str);

impl NodeCidrAllocation {
    /// Picks each family's node mask as upstream does and checks that every
    /// cluster CIDR can be cut into node CIDRs.
    pub fn new(cluster: ClusterCidrs, masks: MaskFlags) -> Result<NodeCidrAllocation, CidrError> {
        let (v4, v6) = node_masks(&cluster, masks)?;
        let ranges = cluster
            .cidrs()
            .iter()
            .map(|cidr| match Family::of(cidr) {
                Family::V4 => node_range(cidr, v4),
                Family::V6 => node_range(cidr, v6),
            })
            .collect::<Result<_, _>>()?;
        Ok(NodeCidrAllocation { cluster, ranges })
    }
}

/// The IPv4 and IPv6 node masks: the defaults, replaced by the flags that
/// apply to this cluster's families; flags that do not apply are errors.
fn node_masks(cluster: &ClusterCidrs, masks: MaskFlags) -> Result<(NodeMask, NodeMask), CidrError> {
    let value = cluster.to_string();
    let (mut v4, mut v6) = (
        (DEFAULT_NODE_MASK_IPV4, "node-cidr-mask-size-ipv4"),
        (DEFAULT_NODE_MASK_IPV6, "node-cidr-mask-size-ipv6"),
    );
    if let Some(m) = masks.node_cidr_mask_size {
        if cluster.is_dual_stack() {
            return Err(CidrError::SingleStackMaskWithDualStack { value });
        }
        if masks.ipv4.is_some() || masks.ipv6.is_some() {
            return Err(CidrError::MixedMaskFlags);
        }
        return Ok(((m, "node-cidr-mask-size"), (m, "node-cidr-mask-size")));
    }
    // A dual-stack cluster has both families, so only a single-stack one
    // can lack the family of a per-family flag.
    for (mask, family, slot) in [
        (masks.ipv4, Family::V4, &mut v4),
        (masks.ipv6, Family::V6, &mut v6),
    ] {
        if let Some(m) = mask {
            if !cluster.has(family) {
                return Err(CidrError::MaskForAbsentFamily {
                    flag: slot.1,
                    value,
                    family,
                });
            }
            slot.0 = m;
        }
    }
    Ok((v4, v6))
}

/// One cluster CIDR cut at `node_mask`, if that mask fits it.
fn node_range(cidr: &IpNet, (node_mask, flag): NodeMask) -> Result<NodeCidrRange, CidrError> {
    let family = Family::of(cidr);
    if node_mask == 0 || node_mask > cidr.max_prefix_len() {
        return Err(CidrError::MaskOutOfRange {
            flag,
            mask: node_mask,
            family,
        });
    }
    if cidr.prefix_len() > node_mask {
        return Err(CidrError::ClusterSmallerThanNode {
            cidr: *cidr,
            cluster_prefix: cidr.prefix_len(),
            node_mask,
            flag,
        });
    }
    if node_mask - cidr.prefix_len() > MAX_NODE_MASK_DIFF {
        return Err(CidrError::TooManyNodeCidrs {
            cidr: *cidr,
            node_mask,
            flag,
        });
    }
    Ok(NodeCidrRange {
        cluster_cidr: *cidr,
        node_mask,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidrs(v: &str) -> Result<ClusterCidrs, CidrError> {
        ClusterCidrs::parse(v, "test")
    }

    fn alloc(v: &str, masks: MaskFlags) -> Result<NodeCidrAllocation, String> {
        NodeCidrAllocation::new(cidrs(v).map_err(|e| e.to_string())?, masks)
            .map_err(|e| e.to_string())
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn single_and_dual_stack_parse_in_order_with_default_masks() {
        let a = alloc("10.244.0.0/16", MaskFlags::default()).unwrap();
        assert_eq!(
            a.ranges,
            [NodeCidrRange {
                cluster_cidr: net("10.244.0.0/16"),
                node_mask: 24
            }]
        );
        let a = alloc(" fd00:10:244::/56 , 10.244.0.0/16 ", MaskFlags::default()).unwrap();
        assert!(a.cluster.is_dual_stack());
        assert_eq!(a.ranges[0].cluster_cidr, net("fd00:10:244::/56"));
        assert_eq!(a.ranges[0].node_mask, 64);
        assert_eq!(a.ranges[1].node_mask, 24);
    }

    #[test]
    fn host_bits_are_dropped_as_go_does() {
        assert_eq!(
            cidrs("10.244.7.1/16").unwrap().cidrs(),
            [net("10.244.0.0/16")]
        );
    }

    #[test]
    fn bad_values_name_the_value() {
        for (value, needle) in [
            ("10.244.0.0", "\"10.244.0.0\" is not a CIDR"),
            ("banana", "\"banana\" is not a CIDR"),
            ("10.244.0.0/33", "is not a CIDR"),
            ("10.0.0.0/16,", "\"\" is not a CIDR"),
            ("10.0.0.0/16,10.1.0.0/16", "two IPv4 CIDRs"),
            ("fd00::/48,fd01::/48", "two IPv6 CIDRs"),
            ("10.0.0.0/16,fd00::/48,10.1.0.0/16", "has 3 CIDRs"),
        ] {
            let err = cidrs(value).unwrap_err().to_string();
            assert!(err.contains("--cluster-cidr"), "{err}");
            assert!(err.contains(needle), "{value}: {err}");
        }
        let err = cidrs("  ").unwrap_err().to_string();
        assert!(err.contains("empty") && err.contains("test"), "{err}");
    }

    #[test]
    fn cluster_cidr_must_hold_at_least_one_node_cidr() {
        let err = alloc("10.244.0.0/25", MaskFlags::default()).unwrap_err();
        assert!(
            err.contains("10.244.0.0/25") && err.contains("/25") && err.contains("/24"),
            "{err}"
        );
        let err = alloc(
            "10.244.0.0/16",
            MaskFlags {
                node_cidr_mask_size: Some(12),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(
            err.contains("--node-cidr-mask-size") && err.contains("/12"),
            "{err}"
        );
    }

    #[test]
    fn at_most_two_to_the_sixteen_node_cidrs() {
        let err = alloc("10.0.0.0/7", MaskFlags::default()).unwrap_err();
        assert!(err.contains("2^17") && err.contains("at most /23"), "{err}");
        assert!(
            alloc("10.0.0.0/8", MaskFlags::default()).is_ok(),
            "exactly 2^16 is fine"
        );
        let err = alloc("fd00::/32", MaskFlags::default()).unwrap_err();
        assert!(err.contains("fd00::/32"), "{err}");
    }

    #[test]
    fn mask_flags_follow_upstream_rules() {
        // Single-stack: --node-cidr-mask-size applies to the one family.
        let a = alloc(
            "fd00::/48",
            MaskFlags {
                node_cidr_mask_size: Some(56),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(a.ranges[0].node_mask, 56);
        // It cannot be combined with the per-family flags...
        let err = alloc(
            "10.0.0.0/16",
            MaskFlags {
                node_cidr_mask_size: Some(24),
                ipv4: Some(25),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.contains("cannot be combined"), "{err}");
        // ...nor used with dual-stack.
        let err = alloc(
            "10.0.0.0/16,fd00::/48",
            MaskFlags {
                node_cidr_mask_size: Some(24),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.contains("dual-stack"), "{err}");
        // A per-family flag for a family the cluster does not have.
        let err = alloc(
            "10.0.0.0/16",
            MaskFlags {
                ipv6: Some(64),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(
            err.contains("--node-cidr-mask-size-ipv6") && err.contains("no IPv6"),
            "{err}"
        );
        // Dual-stack with both per-family flags.
        let a = alloc(
            "10.0.0.0/16,fd00::/48",
            MaskFlags {
                ipv4: Some(26),
                ipv6: Some(60),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!((a.ranges[0].node_mask, a.ranges[1].node_mask), (26, 60));
        let err = alloc(
            "10.0.0.0/16",
            MaskFlags {
                ipv4: Some(40),
                ..Default::default()
            },
        )
        .unwrap_err();
        assert!(err.contains("--node-cidr-mask-size-ipv4=40"), "{err}");
    }

    #[test]
    fn containment_is_whole_ranges_only() {
        let c = cidrs("10.244.0.0/16,fd00::/48").unwrap();
        assert!(c.contains(&net("10.244.3.0/24")));
        assert!(c.contains(&net("10.244.0.0/16")));
        assert!(!c.contains(&net("10.0.0.0/8")), "a supernet is not inside");
        assert!(!c.contains(&net("10.245.0.0/24")));
        assert!(c.contains(&net("fd00:0:0:5::/64")));
    }
}
