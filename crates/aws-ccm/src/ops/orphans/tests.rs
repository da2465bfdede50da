use std::collections::{BTreeMap, BTreeSet};

use super::read::{LoadBalancer, dead_load_balancers, dead_rules_in};
use super::*;
use crate::aws::security_groups::{SecurityGroup, Source};

const CLUSTER: &str = "c1";

fn live(names: &[&str]) -> Live {
    Live {
        load_balancers: names.iter().map(|n| n.to_string()).collect(),
        nodes: Vec::new(),
    }
}

fn tags(value: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("kubernetes.io/cluster/c1".to_string(), value.to_string())])
}

fn group(id: &str, name: &str, tag: &str) -> SecurityGroup {
    SecurityGroup {
        id: id.into(),
        name: name.into(),
        vpc_id: Some("vpc-1".into()),
        tags: tags(tag),
        ingress: BTreeSet::new(),
        descriptions: BTreeMap::new(),
        owner_id: None,
    }
}

fn cidr_rule(port: i32, cidr: &str) -> Rule {
    Rule {
        protocol: "tcp".into(),
        from: port,
        to: port,
        source: Source::Cidr(cidr.parse().expect("cidr")),
    }
}

fn mtu(cidr: &str) -> Rule {
    Rule {
        protocol: "icmp".into(),
        from: 3,
        to: 4,
        source: Source::Cidr(cidr.parse().expect("cidr")),
    }
}

#[test]
fn a_load_balancer_is_dead_when_no_live_service_has_its_name_and_owned_only_when_tagged_so() {
    let lb = |name: &str, tag: &str| LoadBalancer {
        kind: Kind::ClassicLoadBalancer,
        name: name.into(),
        id: name.into(),
        tags: tags(tag),
        created: None,
    };
    let found = dead_load_balancers(
        &[
            lb("alive", "owned"),
            lb("gone", "owned"),
            lb("theirs", "shared"),
        ],
        &live(&["alive"]),
        CLUSTER,
    );
    let got: Vec<(&str, bool)> = found.iter().map(|o| (o.id.as_str(), o.owned)).collect();
    assert_eq!(got, vec![("gone", true), ("theirs", false)]);
    assert!(
        found[0]
            .recognised
            .contains("kubernetes.io/cluster/c1=owned")
    );
    assert_eq!(
        found[0].deletion,
        Deletion::ClassicLoadBalancer("gone".into())
    );
}

#[test]
fn node_rules_for_dead_load_balancers_are_found_and_live_ones_kept() {
    let dead = group("sg-dead", "k8s-elb-gone", "owned");
    let mut holder = group("sg-node", "nodes", "owned");
    holder.ingress.insert(Rule::all_from_group("sg-dead"));
    holder.ingress.insert(Rule::all_from_group("sg-alive"));
    let keep = cidr_rule(30001, "10.0.0.0/16");
    let gone = cidr_rule(30002, "10.0.0.0/16");
    let gone_only = cidr_rule(30003, "192.168.0.0/16");
    for (rule, desc) in [
        (&keep, "kubernetes.io/rule/nlb/client=alive"),
        (&gone, "kubernetes.io/rule/nlb/client=gone-nlb"),
        (&gone_only, "kubernetes.io/rule/nlb/client=gone-nlb"),
    ] {
        holder.ingress.insert(rule.clone());
        holder.descriptions.insert(rule.clone(), desc.to_string());
    }
    // The MTU rule of a CIDR a live NLB still uses stays; the other goes.
    for cidr in ["10.0.0.0/16", "192.168.0.0/16"] {
        holder.ingress.insert(mtu(cidr));
        holder
            .descriptions
            .insert(mtu(cidr), crate::aws::nlb::MTU_RULE.to_string());
    }
    let found = dead_rules_in(&holder, &[&dead], &live(&["alive", "k8s-elb-x"]), CLUSTER);
    let deletions: Vec<&Deletion> = found.iter().map(|o| &o.deletion).collect();
    assert_eq!(
        deletions,
        vec![
            &Deletion::Rules {
                group: "sg-node".into(),
                rules: BTreeSet::from([Rule::all_from_group("sg-dead")]),
            },
            &Deletion::Rules {
                group: "sg-node".into(),
                rules: BTreeSet::from([gone, gone_only, mtu("192.168.0.0/16")]),
            },
        ]
    );
    assert!(
        found
            .iter()
            .all(|o| o.owned && o.kind == Kind::NodeIngressRule)
    );
    assert!(found[1].recognised.contains("gone-nlb"));
}

#[test]
fn rules_from_a_shared_dead_group_are_not_owned() {
    let dead = group("sg-dead", "k8s-elb-gone", "shared");
    let mut holder = group("sg-node", "nodes", "owned");
    holder.ingress.insert(Rule::all_from_group("sg-dead"));
    let found = dead_rules_in(&holder, &[&dead], &live(&[]), CLUSTER);
    assert_eq!(found.len(), 1);
    assert!(!found[0].owned);
}

#[test]
fn live_comes_from_services_the_controller_manages_and_every_node() {
    let svc = |name: &str, uid: &str, type_: &str| -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid},
            "spec": {"type": type_}
        }))
        .expect("service")
    };
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "n1"},
        "spec": {"providerID": "aws:///us-east-1a/i-1", "podCIDR": "10.244.1.0/24"}
    }))
    .expect("node");
    let live = Live::from_objects(
        &[
            svc("web", "1111-2222", "LoadBalancer"),
            svc("internal", "3333-4444", "ClusterIP"),
        ],
        &[node],
    );
    assert_eq!(
        live.load_balancers,
        BTreeSet::from(["a11112222".to_string()])
    );
    assert_eq!(live.nodes.len(), 1);
    assert_eq!(live.nodes[0].instance_id.as_deref(), Some("i-1"));
}

#[test]
fn ages_come_from_the_creation_time() {
    let created = DateTime::from_timestamp(1_000, 0).expect("time");
    let o = Orphan {
        kind: Kind::ClassicLoadBalancer,
        id: "x".into(),
        recognised: String::new(),
        created: Some(created),
        owned: true,
        deletion: Deletion::ClassicLoadBalancer("x".into()),
    };
    let now = DateTime::from_timestamp(4_600, 0).expect("time");
    assert_eq!(o.age(now), Some(Duration::from_secs(3_600)));
}
