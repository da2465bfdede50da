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
