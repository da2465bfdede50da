//! Signs that something else assigns pod CIDRs in this cluster, most often
//! kube-controller-manager with `--allocate-node-cidrs=true` (kOps passes the
//! flag to it and to the CCM alike). Two allocators can give one CIDR to two
//! nodes, so on any sign node IPAM stops allocating (the other controllers
//! keep running) and says why.
//!
//! What tells, and why it is reliable: the kubelet never sets `podCIDR`, so
//! a CIDR this controller did not write came from another allocator (or a
//! person). Before allocating, every start takes a consistent list of the
//! nodes; from then on every CIDR it writes is recorded first. So:
//! - a CIDR outside `--cluster-cidr` at start: someone allocates from
//!   another range;
//! - after that list, a node showing CIDRs this controller did not write, or
//!   a node whose CIDRs change: someone allocates right now;
//! - a patch that lost to another writer's CIDRs: the same, caught in the act.

use std::fmt;

use ipnet::IpNet;

/// What was seen, on which node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherAllocator {
    pub node: String,
    pub(crate) cidrs: Vec<IpNet>,
    pub sign: Sign,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sign {
    /// At start, a CIDR outside every `--cluster-cidr`.
    OutsideClusterCidr,
    /// After start, CIDRs this controller did not write.
    AssignedByOther,
    /// Our patch found another writer's CIDRs already there.
    LostRace,
}

impl fmt::Display for OtherAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cidrs = self
            .cidrs
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let what = match self.sign {
            Sign::OutsideClusterCidr => "which lie outside --cluster-cidr",
            Sign::AssignedByOther => "which this controller did not assign",
            Sign::LostRace => "written by someone else while this controller was assigning it",
        };
        write!(
            f,
            "another pod CIDR allocator is at work: node {} holds {cidrs}, {what}. Node IPAM stops \
             allocating so that no CIDR is given twice (the other controllers keep running). If \
             kube-controller-manager runs with --allocate-node-cidrs=true, leave allocation to it \
             and drop nodeipam from --controllers; to use this allocator instead, turn it off there \
             and restart this CCM",
            self.node
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_node_cidrs_sign_and_fix() {
        let seen = OtherAllocator {
            node: "n7".into(),
            cidrs: vec!["10.96.3.0/24".parse().unwrap()],
            sign: Sign::OutsideClusterCidr,
        };
        let text = seen.to_string();
        for part in [
            "n7",
            "10.96.3.0/24",
            "outside --cluster-cidr",
            "kube-controller-manager",
            "nodeipam",
        ] {
            assert!(text.contains(part), "{text} lacks {part}");
        }
    }
}
