use ipnet::Ipv4Net;

use super::io::{rules_from_sdk, rules_to_sdk};
use super::plan::load_balancer_rules;
use super::*;

#[test]
fn owned_group_rules_cover_ports_ranges_and_icmp() {
    let ranges: Vec<Ipv4Net> = vec!["10.0.0.0/8".parse().unwrap(), "0.0.0.0/0".parse().unwrap()];
    let rules = load_balancer_rules(&[80, 443], &ranges);
    assert_eq!(rules.len(), 6);
    assert!(
        rules
            .iter()
            .any(|r| r.protocol == "icmp" && r.from == 3 && r.to == 4)
    );
}

#[test]
fn sdk_round_trip_is_lossless() {
    let mut rules = load_balancer_rules(&[80], &["1.2.3.0/24".parse().unwrap()]);
    rules.insert(Rule::all_from_group("sg-1"));
    assert_eq!(rules_from_sdk(&rules_to_sdk(&rules)), rules);
}

/// A node group as the console or Terraform writes it: one all-traffic
/// permission holding both the group's self-reference and the load
/// balancer group's pair. Read, it is two rules; revoking the load
/// balancer's sends one permission with its one pair, never the
/// self-reference sharing the permission (upstream's #1473).
#[test]
fn a_shared_permission_is_two_rules_and_a_revoke_names_one_pair() {
    use aws_sdk_ec2::types::{IpPermission, UserIdGroupPair};
    let pair = |id: &str| UserIdGroupPair::builder().group_id(id).build();
    let shared = IpPermission::builder()
        .ip_protocol("-1")
        .user_id_group_pairs(pair("sg-node"))
        .user_id_group_pairs(pair("sg-lb"))
        .build();
    assert_eq!(
        rules_from_sdk(&[shared]),
        [
            Rule::all_from_group("sg-node"),
            Rule::all_from_group("sg-lb")
        ]
        .into_iter()
        .collect()
    );
    let sent = rules_to_sdk(&[Rule::all_from_group("sg-lb")].into_iter().collect());
    let [revoked] = sent.as_slice() else {
        panic!("one permission: {sent:?}");
    };
    let pairs: Vec<_> = revoked
        .user_id_group_pairs()
        .iter()
        .map(|p| p.group_id())
        .collect();
    assert_eq!(pairs, [Some("sg-lb")]);
    assert!(revoked.ip_ranges().is_empty() && revoked.prefix_list_ids().is_empty());
}
