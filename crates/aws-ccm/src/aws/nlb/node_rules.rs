//! NLB, pure: the rules the backend nodes' groups hold for an NLB (default
//! mode, no NLB security group), marked by their descriptions.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;

use super::{
    CLIENT_RULE_PREFIX, Desired, MTU_RULE, client_rule_description, health_rule_description,
    ip_protocols, mtu_rule, port_rule,
};
use crate::aws::security_groups::{Rule, Source};

/// What the backend nodes' groups must admit for one NLB (default mode, no
/// NLB security group): client traffic to the node ports from the source
/// ranges, health checks from the NLB subnets, ICMP for path MTU.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NodeRules {
    pub(crate) client: BTreeSet<Rule>,
    pub(crate) health: BTreeSet<Rule>,
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
}

/// Pure: the rule changes on one node group for NLB `lb_name`. `want` is
/// `None` when the group backs no node of this NLB (or the NLB is going):
/// every rule of ours for it is revoked. Rules with other descriptions are
/// never touched; MTU rules follow every NLB's client rules in the group.
pub(crate) fn node_group_changes(
    lb_name: &str,
    have: &DescribedRules,
    want: Option<&NodeRules>,
) -> RuleChanges {
    let client_desc = client_rule_description(lb_name);
    let health_desc = health_rule_description(lb_name);
    let mut want_all: DescribedRules = BTreeMap::new();
    if let Some(w) = want {
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
        if (*d == client_desc || *d == health_desc) && !want_all.contains_key(r) {
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
