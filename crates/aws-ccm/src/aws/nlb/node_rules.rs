//! NLB, pure: the rules the backend nodes' groups hold for an NLB, marked
//! by their descriptions: the Go CCM's per-port CIDR rules, or (cloud.conf
//! `NLBNodeIngress = LoadBalancerGroup`, for an NLB that carries a security
//! group) one rule admitting that group.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;

use super::{
    CLIENT_RULE_PREFIX, Desired, GROUP_RULE, MTU_RULE, client_rule_description,
    health_rule_description, ip_protocols, mtu_rule, port_rule,
};
use crate::aws::security_groups::{Rule, Source};

/// What the backend nodes' groups must admit for one NLB: client traffic
/// to the node ports from the source ranges, health checks from the NLB
/// subnets, ICMP for path MTU; or, with `from_group`, everything from the
/// NLB's security group instead (its clients' and its health checks'
/// packets reach the nodes from the NLB's interfaces, which carry it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeRules {
    pub(crate) client: BTreeSet<Rule>,
    pub(crate) health: BTreeSet<Rule>,
    /// The NLB's security group the node groups admit instead of the CIDR
    /// rules (`NLBNodeIngress = LoadBalancerGroup`).
    pub(crate) from_group: Option<String>,
}

impl NodeRules {
    /// The same NLB's CIDR rules (the fallback when a node group has no
    /// room for the group rule).
    pub(crate) fn cidr_only(&self) -> NodeRules {
        NodeRules {
            from_group: None,
            ..self.clone()
        }
    }
}

/// Pure: upstream's rule set for one NLB. Health rules are left out when the
/// client rules already cover them (TCP from anywhere on the same ports).
pub(crate) fn node_rules(
    desired: &Desired,
    source_ranges: &[Ipv4Net],
    subnet_cidrs: &[Ipv4Net],
) -> NodeRules {
    let mut out = NodeRules::default();
    let mut health_ports = BTreeSet::new();
    let mut tcp_ports = BTreeSet::new();
    for tg in &desired.target_groups {
        health_ports.insert(tg.health.port.parse::<i32>().unwrap_or(tg.port));
        // Each group's own protocol(s) on its own port (upstream opens every
        // port for UDP once one port is UDP; this is exact).
        for proto in ip_protocols(&tg.protocol) {
            if *proto == "tcp" {
                tcp_ports.insert(tg.port);
            }
            for range in source_ranges {
                out.client.insert(port_rule(proto, tg.port, *range));
            }
        }
    }
    let covered = source_ranges == [Ipv4Net::default()] && health_ports.is_subset(&tcp_ports);
    if !covered {
        for port in &health_ports {
            for cidr in subnet_cidrs {
                out.health.insert(port_rule("tcp", *port, *cidr));
            }
        }
    }
    out
}

/// One node group's rules with their descriptions, as read from EC2.
pub(crate) type DescribedRules = BTreeMap<Rule, String>;

/// Rule changes on one node group.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleChanges {
    pub(crate) authorize: DescribedRules,
    pub(crate) revoke: BTreeSet<Rule>,
}

impl RuleChanges {
    pub(crate) fn is_empty(&self) -> bool {
        self.authorize.is_empty() && self.revoke.is_empty()
    }

    /// Whether the rules to add go before the rules to remove: when the
    /// changes move a node group between CIDR rules and a group rule (in
    /// either direction), so that the nodes are never without access.
    /// Otherwise removing first makes room at the group's rule limit, as
    /// the Go CCM orders it.
    pub(crate) fn adds_first(&self) -> bool {
        let from_group = |r: &Rule| matches!(r.source, Source::Group(_));
        self.authorize.keys().any(from_group) || self.revoke.iter().any(from_group)
    }

    /// Whether these changes add a rule admitting a group.
    pub(crate) fn adds_group_rule(&self) -> bool {
        (self.authorize.keys()).any(|r| matches!(r.source, Source::Group(_)))
    }
}

/// Pure: the rule changes on one node group for NLB `lb_name`. `want` is
/// `None` when the group backs no node of this NLB (or the NLB is going):
/// every rule of ours for it is revoked. Rules with other descriptions are
/// never touched; MTU rules follow every NLB's client rules in the group.
///
/// A group rule ([`GROUP_RULE`]) is one per source group, whichever NLB
/// wrote it: it is revoked only when its source is in `revocable`, the
/// groups this NLB carries that no other NLB carries.
pub(crate) fn node_group_changes(
    lb_name: &str,
    have: &DescribedRules,
    want: Option<&NodeRules>,
    revocable: &BTreeSet<String>,
) -> RuleChanges {
    let client_desc = client_rule_description(lb_name);
    let health_desc = health_rule_description(lb_name);
    let mut want_all: DescribedRules = BTreeMap::new();
    if let Some(group) = want.and_then(|w| w.from_group.as_ref()) {
        want_all.insert(Rule::all_from_group(group), GROUP_RULE.to_string());
    } else if let Some(w) = want {
        for r in &w.client {
            want_all.insert(r.clone(), client_desc.clone());
        }
        for r in &w.health {
            // A rule that is also a client rule keeps the client description.
            want_all
                .entry(r.clone())
                .or_insert_with(|| health_desc.clone());
        }
    }
    let mut out = RuleChanges::default();
    for (r, d) in &want_all {
        if !have.contains_key(r) {
            out.authorize.insert(r.clone(), d.clone());
        }
    }
    for (r, d) in have {
        let ours = *d == client_desc
            || *d == health_desc
            || (d == GROUP_RULE && matches!(&r.source, Source::Group(g) if revocable.contains(g)));
        if ours && !want_all.contains_key(r) {
            out.revoke.insert(r.clone());
        }
    }
    // MTU: ICMP 3/4 from every CIDR of a client rule left in the group.
    let mut client_cidrs = BTreeSet::new();
    for (r, d) in have {
        if d.starts_with(CLIENT_RULE_PREFIX)
            && !out.revoke.contains(r)
            && let Source::Cidr(c) = r.source
        {
            client_cidrs.insert(c);
        }
    }
    for (r, d) in &out.authorize {
        if d.starts_with(CLIENT_RULE_PREFIX)
            && let Source::Cidr(c) = r.source
        {
            client_cidrs.insert(c);
        }
    }
    let mtu_want: BTreeSet<Rule> = client_cidrs.into_iter().map(mtu_rule).collect();
    for r in &mtu_want {
        if !have.contains_key(r) {
            out.authorize.insert(r.clone(), MTU_RULE.to_string());
        }
    }
    for (r, d) in have {
        if d == MTU_RULE && !mtu_want.contains(r) {
            out.revoke.insert(r.clone());
        }
    }
    out
}
