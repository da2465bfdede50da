//! Security groups, pure half.

use std::collections::BTreeSet;

use ipnet::Ipv4Net;

use super::{Rule, Source};

/// The rules of a classic ELB's owned group: each service port from each
/// source range, plus ICMP "fragmentation needed" (type 3 code 4) for path
/// MTU discovery, as upstream.
pub(crate) fn load_balancer_rules(ports: &[i32], ranges: &[Ipv4Net]) -> BTreeSet<Rule> {
    let mut rules = BTreeSet::new();
    for range in ranges {
        for port in ports {
            rules.insert(Rule {
                protocol: "tcp".into(),
                from: *port,
                to: *port,
                source: Source::Cidr(*range),
            });
        }
        rules.insert(Rule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            source: Source::Cidr(*range),
        });
    }
    rules
}
