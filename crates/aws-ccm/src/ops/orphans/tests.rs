use std::collections::{BTreeMap, BTreeSet};

use super::read::{LoadBalancer, dead_rules_in, judge_groups, judge_load_balancers};
use super::*;
use crate::aws::security_groups::{SecurityGroup, Source};

const CLUSTER: &str = "c1";

fn live(names: &[&str]) -> Live {
    Live {
        load_balancers: names.iter().map(|n| n.to_string()).collect(),
        nodes: Vec::new(),
        adopted: BTreeSet::new(),
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

/// Load balancer names as the CCM gives them ("a" + 31 hex digits).
const ALIVE: &str = "a00000000000000000000000000a11fe";
const GONE: &str = "a0000000000000000000000000000901";
const GONE_NLB: &str = "a00000000000000000000000000009b1";

/// What the CCM writes on a load balancer or target group it makes.
fn ccm_tags(value: &str) -> BTreeMap<String, String> {
    let mut t = tags(value);
    t.insert("kubernetes.io/service-name".into(), "default/web".into());
    t
}

#[test]
fn a_dead_load_balancer_is_an_orphan_only_when_proven_the_ccms() {
    let lb = |name: &str, tags: BTreeMap<String, String>| LoadBalancer {
        kind: Kind::ClassicLoadBalancer,
        name: name.into(),
        id: name.into(),
        tags,
        created: None,
    };
    let mut kops = tags("owned");
    kops.insert("KubernetesCluster".into(), CLUSTER.into());
    kops.insert("Name".into(), "api.c1".into());
    let mut audit = Audit::default();
    judge_load_balancers(
        &[
            lb(ALIVE, ccm_tags("owned")),
            lb(GONE, ccm_tags("owned")),
            lb("a0000000000000000000000000000902", ccm_tags("shared")),
            lb("api-c1-vd3t5n", kops),
        ],
        &live(&[ALIVE]),
        CLUSTER,
        &mut audit,
    );
    let orphans: Vec<&str> = audit.orphans.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(orphans, vec![GONE]);
    assert!(
        audit.orphans[0]
            .recognised
            .contains("kubernetes.io/cluster/c1=owned")
    );
    assert_eq!(
        audit.orphans[0].deletion,
        Deletion::ClassicLoadBalancer(GONE.into())
    );
    let left: Vec<(&str, &str)> = (audit.left_alone.iter())
        .map(|l| (l.id.as_str(), l.why.as_str()))
        .collect();
    assert_eq!(
        left,
        vec![
            (
                "a0000000000000000000000000000902",
                "its cluster tag is \"shared\", not \"owned\" as the CCM tags what it makes"
            ),
            (
                "api-c1-vd3t5n",
                "its name is not \"a\" + a Service UID, the name the CCM gives a load balancer"
            ),
        ]
    );
}

#[test]
fn only_the_groups_the_ccm_makes_for_dead_load_balancers_are_orphans() {
    let groups = [
        group("sg-dead", &format!("k8s-elb-{GONE}"), "owned"),
        group("sg-alive", &format!("k8s-elb-{ALIVE}"), "owned"),
        group(
            "sg-shared",
            "k8s-elb-a0000000000000000000000000000903",
            "shared",
        ),
        group("sg-nlb", "k8s-default-web-0123456789", "owned"),
        group("sg-api", "api-elb.c1", "owned"),
        group("sg-nodes", "nodes.c1", "owned"),
        // The group of a load balancer that is left alone stays with it.
        group(
            "sg-kept",
            "k8s-elb-a0000000000000000000000000000904",
            "owned",
        ),
    ];
    let mut audit = Audit::default();
    let standing = BTreeSet::from([
        ALIVE.to_string(),
        "a0000000000000000000000000000904".to_string(),
    ]);
    let dead = judge_groups(&groups, &live(&[ALIVE]), &standing, CLUSTER, &mut audit);
    assert_eq!(
        dead.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["sg-dead"]
    );
    assert_eq!(audit.orphans.len(), 1);
    assert_eq!(
        audit.orphans[0].deletion,
        Deletion::SecurityGroup("sg-dead".into())
    );
    let left: Vec<&str> = audit.left_alone.iter().map(|l| l.id.as_str()).collect();
    assert_eq!(left, ["sg-shared", "sg-api", "sg-nodes"]);
    assert!(
        audit.left_alone[2]
            .why
            .contains("k8s-elb-<load balancer name>")
    );
}

#[test]
fn node_rules_for_dead_load_balancers_are_found_and_standing_ones_kept() {
    let dead = group("sg-dead", &format!("k8s-elb-{GONE}"), "owned");
    let mut holder = group("sg-node", "nodes", "owned");
    holder.ingress.insert(Rule::all_from_group("sg-dead"));
    holder.ingress.insert(Rule::all_from_group("sg-alive"));
    let keep = cidr_rule(30001, "10.0.0.0/16");
    let gone = cidr_rule(30002, "10.0.0.0/16");
    let gone_only = cidr_rule(30003, "192.168.0.0/16");
    // Described with the CCM's prefix but no load balancer name of the CCM's.
    let foreign = cidr_rule(30004, "172.16.0.0/16");
    let client = |name: &str| format!("kubernetes.io/rule/nlb/client={name}");
    for (rule, desc) in [
        (&keep, client(ALIVE)),
        (&gone, client(GONE_NLB)),
        (&gone_only, client(GONE_NLB)),
        (&foreign, client("my-nlb")),
    ] {
        holder.ingress.insert(rule.clone());
        holder.descriptions.insert(rule.clone(), desc);
    }
    // The MTU rule of a CIDR a live NLB still uses stays; the other goes.
    for cidr in ["10.0.0.0/16", "192.168.0.0/16"] {
        holder.ingress.insert(mtu(cidr));
        holder
            .descriptions
            .insert(mtu(cidr), crate::aws::nlb::MTU_RULE.to_string());
    }
    let standing = BTreeSet::from([ALIVE.to_string()]);
    let found = dead_rules_in(&holder, &[&dead], &standing);
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
    assert!(found.iter().all(|o| o.kind == Kind::NodeIngressRule));
    assert!(found[1].recognised.contains(GONE_NLB));
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
        deletion: Deletion::ClassicLoadBalancer("x".into()),
    };
    let now = DateTime::from_timestamp(4_600, 0).expect("time");
    assert_eq!(o.age(now), Some(Duration::from_secs(3_600)));
}

#[test]
fn a_load_balancer_kept_for_a_protected_service_is_listed_kept_never_an_orphan() {
    let mut kept_tags = ccm_tags("owned");
    kept_tags.insert(crate::aws::tags::KEPT_TAG.into(), "default/web".into());
    let mut shared_kept = kept_tags.clone();
    shared_kept.insert("kubernetes.io/cluster/c1".into(), "shared".into());
    let lb = |kind, name: &str, tags: BTreeMap<String, String>| LoadBalancer {
        kind,
        name: name.into(),
        id: format!("arn:{name}"),
        tags,
        created: None,
    };
    let mut audit = Audit::default();
    judge_load_balancers(
        &[
            lb(Kind::LoadBalancerV2, GONE_NLB, kept_tags.clone()),
            lb(Kind::ClassicLoadBalancer, GONE, ccm_tags("owned")),
            // The kept tag proves nothing on what the CCM did not make.
            lb(
                Kind::LoadBalancerV2,
                "a0000000000000000000000000000903",
                shared_kept,
            ),
        ],
        &live(&[]),
        CLUSTER,
        &mut audit,
    );
    assert_eq!(
        audit.kept,
        vec![Kept {
            kind: Kind::LoadBalancerV2,
            id: format!("arn:{GONE_NLB}"),
            name: GONE_NLB.into(),
            kept_from: "default/web".into(),
        }]
    );
    let orphans: Vec<&str> = audit.orphans.iter().map(|o| o.id.as_str()).collect();
    assert_eq!(orphans, [format!("arn:{GONE}").as_str()]);
    assert_eq!(audit.left_alone.len(), 1);
}

#[test]
fn an_adopted_load_balancer_lives_while_the_service_its_tags_name_does() {
    // Kept from default/web, adopted by default/new: its name is not
    // "a" + default/new's UID, its tags and the Service's name prove it.
    let mut adopted = ccm_tags("owned");
    adopted.extend(crate::aws::load_balancers::adopt::claim_tags("default/new"));
    let nlb = LoadBalancer {
        kind: Kind::LoadBalancerV2,
        name: GONE_NLB.into(),
        id: format!("arn:{GONE_NLB}"),
        tags: adopted.clone(),
        created: None,
    };
    let judge = |live: &Live, lb: &LoadBalancer| {
        let mut audit = Audit::default();
        let live = live.with_adopted([lb]);
        judge_load_balancers(std::slice::from_ref(lb), &live, CLUSTER, &mut audit);
        audit
    };
    let mut alive = live(&[]);
    alive
        .adopted
        .insert((GONE_NLB.to_string(), "default/new".to_string()));
    let audit = judge(&alive, &nlb);
    assert!(audit.orphans.is_empty() && audit.kept.is_empty() && audit.left_alone.is_empty());
    // The adopter gone: an orphan, as its own would be.
    let audit = judge(&live(&[]), &nlb);
    assert_eq!(audit.orphans.len(), 1, "{audit:?}");
    // Another live Service naming it proves nothing: the tags name default/new.
    let mut other = live(&[]);
    other
        .adopted
        .insert((GONE_NLB.to_string(), "default/other".to_string()));
    assert_eq!(judge(&other, &nlb).orphans.len(), 1);
    // Tags that do not agree (service-name moved on) prove nothing either.
    let mut half = nlb.clone();
    half.tags
        .insert("kubernetes.io/service-name".into(), "default/web".into());
    assert_eq!(judge(&alive, &half).orphans.len(), 1);
}
