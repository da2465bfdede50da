//! The node CIDR allocator: which node CIDRs of each cluster CIDR are taken.
//!
//! Pure data, no I/O. The controller rebuilds it from the nodes that already
//! have CIDRs before it hands out any (so nothing is given twice across
//! restarts and failovers), then allocates, occupies what others assign, and
//! releases what deleted nodes held.
//!
//! Allocation walks forward from where the last one stopped, as upstream's
//! range allocator does, so a CIDR just released (its routes possibly still
//! being removed) is the last one to be handed out again.

use std::fmt;

use ipnet::IpNet;

use crate::options::cidrs::{Family, NodeCidrRange};

/// The node CIDRs of one cluster CIDR, as a bitmap (at most 2^16 entries).
#[derive(Clone, Debug)]
pub(crate) struct CidrSet {
    range: NodeCidrRange,
    /// Address of the cluster CIDR's first node CIDR, as a number.
    base: u128,
    /// Bits per node CIDR: `max_prefix_len - node_mask`.
    host_bits: u32,
    total: u32,
    used: u32,
    bits: Vec<u64>,
    next: u32,
}

/// An address as a number.
fn addr_bits(addr: std::net::IpAddr) -> u128 {
    match addr {
        std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
        std::net::IpAddr::V6(a) => u128::from(a),
    }
}

impl CidrSet {
    /// `range` must have passed [`crate::options::cidrs::NodeCidrAllocation::new`]
    /// (node mask within 16 bits of the cluster prefix).
    pub(crate) fn new(range: NodeCidrRange) -> CidrSet {
        let cluster = range.cluster_cidr.trunc();
        let diff = u32::from(range.node_mask.saturating_sub(cluster.prefix_len())).min(16);
        let total = 1u32 << diff;
        CidrSet {
            base: addr_bits(cluster.network()),
            host_bits: u32::from(cluster.max_prefix_len() - range.node_mask),
            range: NodeCidrRange {
                cluster_cidr: cluster,
                node_mask: range.node_mask,
            },
            total,
            used: 0,
            bits: vec![0; total.div_ceil(64) as usize],
            next: 0,
        }
    }

    pub(crate) fn cluster_cidr(&self) -> IpNet {
        self.range.cluster_cidr
    }

    fn family(&self) -> Family {
        Family::of(&self.range.cluster_cidr)
    }

    fn node_mask(&self) -> u8 {
        self.range.node_mask
    }

    /// Node CIDRs in the cluster CIDR.
    pub(crate) fn total(&self) -> u32 {
        self.total
    }

    pub(crate) fn used(&self) -> u32 {
        self.used
    }

    pub(crate) fn free(&self) -> u32 {
        self.total - self.used
    }

    fn is_set(&self, i: u32) -> bool {
        self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: u32, on: bool) {
        let was = self.is_set(i);
        let word = &mut self.bits[(i / 64) as usize];
        if on {
            *word |= 1 << (i % 64);
        } else {
            *word &= !(1 << (i % 64));
        }
        match (was, on) {
            (false, true) => self.used += 1,
            (true, false) => self.used -= 1,
            _ => {}
        }
    }

    fn cidr_at(&self, i: u32) -> IpNet {
        let bits = self.base + (u128::from(i) << self.host_bits);
        // In range by construction: `bits` lies in the cluster CIDR.
        let addr = match self.range.cluster_cidr {
            IpNet::V4(_) => std::net::IpAddr::from(std::net::Ipv4Addr::from(bits as u32)),
            IpNet::V6(_) => std::net::IpAddr::from(std::net::Ipv6Addr::from(bits)),
        };
        IpNet::new(addr, self.range.node_mask)
            .unwrap_or_default()
            .trunc()
    }

    /// Indices of the node CIDRs `cidr` overlaps (all of them when it is
    /// larger than the cluster CIDR); `None` when it is outside.
    fn indices(&self, cidr: &IpNet) -> Option<std::ops::RangeInclusive<u32>> {
        let cluster = self.range.cluster_cidr;
        if Family::of(cidr) != self.family() {
            return None;
        }
        if cidr.contains(&cluster) {
            return Some(0..=self.total - 1);
        }
        if !cluster.contains(cidr) {
            return None;
        }
        let index = |addr| ((addr_bits(addr) - self.base) >> self.host_bits) as u32;
        Some(index(cidr.network())..=index(cidr.broadcast()))
    }

    /// The next free node CIDR, or `None` when every one is taken.
    fn allocate_next(&mut self) -> Option<IpNet> {
        if self.used >= self.total {
            return None;
        }
        for step in 0..self.total {
            let i = (self.next + step) % self.total;
            if !self.is_set(i) {
                self.set(i, true);
                self.next = (i + 1) % self.total;
                return Some(self.cidr_at(i));
            }
        }
        None
    }

    /// Marks every node CIDR that `cidr` overlaps as taken (`on`) or free.
    fn mark(&mut self, cidr: &IpNet, on: bool) {
        for i in self.indices(cidr).into_iter().flatten() {
            self.set(i, on);
        }
    }

    /// Whether any node CIDR `cidr` overlaps is taken.
    pub(crate) fn is_occupied(&self, cidr: &IpNet) -> bool {
        self.indices(cidr)
            .is_some_and(|mut r| r.any(|i| self.is_set(i)))
    }
}

/// No free node CIDR in a cluster CIDR.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no free /{node_mask} left in cluster CIDR {cluster_cidr} (all {total} in use)")]
pub(crate) struct Exhausted {
    pub(crate) cluster_cidr: IpNet,
    node_mask: u8,
    total: u32,
}

/// One [`CidrSet`] per cluster CIDR; a node gets one CIDR from each.
#[derive(Clone, Debug)]
pub(crate) struct Allocator {
    sets: Vec<CidrSet>,
}

/// How [`Allocator::occupy`] went for a node's existing CIDRs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Occupied {
    /// CIDRs that some other node already held (an overlap made outside
    /// this controller, or by a racing writer).
    pub(crate) already_taken: Vec<IpNet>,
    /// CIDRs outside every cluster CIDR (e.g. `--cluster-cidr` changed).
    pub(crate) outside: Vec<IpNet>,
}

impl fmt::Display for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sets: Vec<String> = (self.sets.iter())
            .map(|s| {
                format!(
                    "{} (/{}): {}/{} used",
                    s.cluster_cidr(),
                    s.node_mask(),
                    s.used(),
                    s.total()
                )
            })
            .collect();
        f.write_str(&sets.join(", "))
    }
}

impl Allocator {
    pub(crate) fn new(ranges: &[NodeCidrRange]) -> Allocator {
        Allocator {
            sets: ranges.iter().copied().map(CidrSet::new).collect(),
        }
    }

    pub(crate) fn sets(&self) -> &[CidrSet] {
        &self.sets
    }

    /// One CIDR from every cluster CIDR, primary first; all or nothing.
    pub(crate) fn allocate(&mut self) -> Result<Vec<IpNet>, Exhausted> {
        let mut taken = Vec::with_capacity(self.sets.len());
        for n in 0..self.sets.len() {
            let Some(cidr) = self.sets[n].allocate_next() else {
                let set = &self.sets[n];
                let err = Exhausted {
                    cluster_cidr: set.cluster_cidr(),
                    node_mask: set.node_mask(),
                    total: set.total(),
                };
                self.release(&taken);
                return Err(err);
            };
            taken.push(cidr);
        }
        Ok(taken)
    }

    fn set_for(&mut self, cidr: &IpNet) -> Option<&mut CidrSet> {
        self.sets.iter_mut().find(|s| {
            let c = s.cluster_cidr();
            Family::of(&c) == Family::of(cidr) && (c.contains(cidr) || cidr.contains(&c))
        })
    }

    /// Marks a node's existing CIDRs as taken, reporting overlaps.
    pub(crate) fn occupy(&mut self, cidrs: &[IpNet]) -> Occupied {
        let mut report = Occupied::default();
        for cidr in cidrs {
            match self.set_for(cidr) {
                Some(set) => {
                    if set.is_occupied(cidr) {
                        report.already_taken.push(*cidr);
                    }
                    // Within the set's cluster CIDR by the search above.
                    set.mark(cidr, true);
                }
                None => report.outside.push(*cidr),
            }
        }
        report
    }

    /// Frees CIDRs; those outside every cluster CIDR are ignored.
    pub(crate) fn release(&mut self, cidrs: &[IpNet]) {
        for cidr in cidrs {
            if let Some(set) = self.set_for(cidr) {
                set.mark(cidr, false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    impl Allocator {
        fn is_occupied(&self, cidr: &IpNet) -> bool {
            self.sets.iter().any(|s| s.is_occupied(cidr))
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn range(cidr: &str, mask: u8) -> NodeCidrRange {
        NodeCidrRange {
            cluster_cidr: net(cidr),
            node_mask: mask,
        }
    }

    #[test]
    fn allocates_in_order_and_never_twice() {
        let mut a = Allocator::new(&[range("10.244.0.0/16", 24)]);
        let first: Vec<_> = (0..3).map(|_| a.allocate().unwrap()[0]).collect();
        assert_eq!(
            first,
            [
                net("10.244.0.0/24"),
                net("10.244.1.0/24"),
                net("10.244.2.0/24")
            ]
        );
        let mut seen: HashSet<IpNet> = first.into_iter().collect();
        while let Ok(c) = a.allocate() {
            assert!(seen.insert(c[0]), "{} handed out twice", c[0]);
        }
        assert_eq!(seen.len(), 256);
        assert_eq!(a.sets()[0].free(), 0);
    }

    #[test]
    fn exhaustion_is_an_error_not_a_panic_and_release_makes_room() {
        let mut a = Allocator::new(&[range("10.0.0.0/23", 24)]);
        let x = a.allocate().unwrap();
        let _y = a.allocate().unwrap();
        let err = a.allocate().unwrap_err();
        assert_eq!(err.cluster_cidr, net("10.0.0.0/23"));
        assert_eq!(err.total, 2);
        assert!(err.to_string().contains("10.0.0.0/23"), "{err}");
        a.release(&x);
        assert_eq!(a.allocate().unwrap(), x);
    }

    #[test]
    fn released_cidrs_are_reused_last() {
        let mut a = Allocator::new(&[range("10.0.0.0/22", 24)]);
        let c0 = a.allocate().unwrap();
        a.release(&c0);
        // The walk continues past 10.0.0.0/24 before coming back to it.
        assert_eq!(a.allocate().unwrap(), [net("10.0.1.0/24")]);
        assert_eq!(a.allocate().unwrap(), [net("10.0.2.0/24")]);
        assert_eq!(a.allocate().unwrap(), [net("10.0.3.0/24")]);
        assert_eq!(a.allocate().unwrap(), c0);
    }

    #[test]
    fn rebuild_from_existing_nodes_skips_their_cidrs() {
        let mut a = Allocator::new(&[range("10.244.0.0/16", 24)]);
        for existing in ["10.244.0.0/24", "10.244.2.0/24"] {
            assert_eq!(a.occupy(&[net(existing)]), Occupied::default());
        }
        assert_eq!(a.allocate().unwrap(), [net("10.244.1.0/24")]);
        assert_eq!(a.allocate().unwrap(), [net("10.244.3.0/24")]);
    }

    #[test]
    fn occupy_reports_overlaps_and_out_of_range_and_handles_odd_sizes() {
        let mut a = Allocator::new(&[range("10.244.0.0/16", 24)]);
        assert!(a.occupy(&[net("10.244.5.0/24")]).already_taken.is_empty());
        let r = a.occupy(&[net("10.244.5.0/24"), net("192.168.0.0/24")]);
        assert_eq!(r.already_taken, [net("10.244.5.0/24")]);
        assert_eq!(r.outside, [net("192.168.0.0/24")]);
        // A wider CIDR takes every node CIDR it covers; a narrower one the
        // node CIDR that contains it.
        a.occupy(&[net("10.244.8.0/23"), net("10.244.20.128/25")]);
        for c in ["10.244.8.0/24", "10.244.9.0/24", "10.244.20.0/24"] {
            assert!(a.is_occupied(&net(c)), "{c}");
        }
        assert_eq!(a.sets()[0].used(), 4);
        // Covering the whole cluster CIDR fills it.
        let mut b = Allocator::new(&[range("10.0.0.0/22", 24)]);
        b.occupy(&[net("10.0.0.0/16")]);
        assert!(b.allocate().is_err());
    }

    #[test]
    fn dual_stack_gives_one_of_each_family_primary_first() {
        let mut a = Allocator::new(&[range("fd00:10:244::/56", 64), range("10.244.0.0/16", 24)]);
        let c = a.allocate().unwrap();
        assert_eq!(c, [net("fd00:10:244::/64"), net("10.244.0.0/24")]);
        let c = a.allocate().unwrap();
        assert_eq!(c, [net("fd00:10:244:1::/64"), net("10.244.1.0/24")]);
        // Occupy and release find the right family.
        a.occupy(&[net("fd00:10:244:2::/64"), net("10.244.2.0/24")]);
        assert_eq!(
            a.allocate().unwrap(),
            [net("fd00:10:244:3::/64"), net("10.244.3.0/24")]
        );
        a.release(&[net("10.244.0.0/24")]);
        assert!(!a.is_occupied(&net("10.244.0.0/24")));
        assert!(a.is_occupied(&net("fd00:10:244::/64")));
    }

    #[test]
    fn dual_stack_is_all_or_nothing() {
        // 4 IPv6 node CIDRs but only 2 IPv4: the third node gets neither.
        let mut a = Allocator::new(&[range("fd00::/62", 64), range("10.0.0.0/23", 24)]);
        a.allocate().unwrap();
        a.allocate().unwrap();
        let err = a.allocate().unwrap_err();
        assert_eq!(err.cluster_cidr, net("10.0.0.0/23"));
        assert_eq!(
            a.sets()[0].used(),
            2,
            "the IPv6 CIDR taken for the failed node was given back"
        );
    }

    #[test]
    fn the_largest_set_is_exact() {
        let mut a = Allocator::new(&[range("10.0.0.0/8", 24)]);
        assert_eq!(a.sets()[0].total(), 65536);
        a.occupy(&[net("10.255.255.0/24")]);
        assert!(a.is_occupied(&net("10.255.255.0/24")));
        assert_eq!(a.sets()[0].used(), 1);
        let ipv6 = CidrSet::new(range("fd00::/48", 64));
        assert_eq!(ipv6.total(), 65536);
    }
}
