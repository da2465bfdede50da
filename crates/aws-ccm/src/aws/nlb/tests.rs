use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;

use super::node_rules::*;
use super::plan::*;
use super::*;
use crate::aws::annotations::tests::service;
use crate::aws::annotations::{self as ann, LoadBalancerSpec};
use crate::aws::elb::{Environment, GroupRef};
use crate::aws::security_groups::{self as sg, Rule, Source};
use crate::aws::tags::Tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode};
use crate::cloud_config::{NlbNodeIngress, NlbSecurityGroupMode};

const UID: &str = "0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef";

fn spec(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> LoadBalancerSpec {
    let mut a = vec![(ann::TYPE, "nlb")];
    a.extend_from_slice(annotations);
    LoadBalancerSpec::from_service(&service(&a, ports)).unwrap()
}

fn env(subnets: &[&str], instances: &[&str]) -> Environment {
    Environment {
        subnets: subnets.iter().map(|s| s.to_string()).collect(),
        instances: instances.iter().map(|s| s.to_string()).collect(),
        node_groups: BTreeSet::new(),
        cluster_name: "kubernetes".to_string(),
        legacy_cluster_tag: false,
    }
}

fn want(annotations: &[(&str, &str)], ports: &[(i32, i32)], e: &Environment) -> Desired {
    desired(
        &spec(annotations, ports),
        "default/web",
        UID,
        "c1",
        &CloudConfig::default(),
        e,
    )
    .unwrap()
}

/// AWS exactly as `d` asks, made by this CCM (with the record).
fn converged(d: &Desired) -> Actual {
    let tgs: Vec<ActualTargetGroup> = d
        .target_groups
        .iter()
        .map(|g| ActualTargetGroup {
            arn: format!("arn:tg/{}", g.name),
            name: g.name.clone(),
            protocol: g.protocol.clone(),
            port: g.port,
            health: g.health.clone(),
            tags: Tags::new(d.create_tags()),
            attributes: d.target_group_attributes.clone(),
            targets: d.instances.clone(),
        })
        .collect();
    Actual {
        lb: Some(ActualLb {
            arn: "arn:lb".into(),
            dns_name: "x.elb.amazonaws.com".into(),
            internal: d.internal,
            ip_address_type: d.ip_address_type.clone(),
            subnet_mappings: d.subnet_mappings.iter().cloned().collect(),
            addresses_reported: true,
            security_groups: d
                .security_groups
                .iter()
                .map(|g| match g {
                    GroupRef::Id(id) => id.clone(),
                    GroupRef::Owned => "sg-owned".into(),
                })
                .collect(),
            tags: Tags::new(d.applied.tagged(&d.create_tags())),
            attributes: d.attributes.clone(),
            listeners: d
                .listeners
                .iter()
                .map(|l| ActualListener {
                    arn: format!("arn:listener/{}", l.port),
                    port: l.port,
                    protocol: l.protocol.clone(),
                    certificate: l.certificate.clone(),
                    ssl_policy: l.ssl_policy.clone(),
                    target_group_arn: Some(format!("arn:tg/{}", l.target_group)),
                    alpn: None,
                    tags: Some(Tags::new(d.create_tags())),
                })
                .collect(),
        }),
        target_groups: tgs,
        owned_group: d.owned_group.as_ref().map(|g| sg::SecurityGroup {
            id: "sg-owned".into(),
            name: g.name.clone(),
            vpc_id: Some("vpc-1".into()),
            tags: g.tags.clone(),
            ingress: g.rules.clone(),
            descriptions: BTreeMap::new(),
            owner_id: None,
        }),
    }
}

#[test]
fn target_group_name_is_upstreams() {
    // sha1("c1" "default" "web" "80" "30080" "TCP" "instance" "TCP" "30"), as the Go CCM.
    assert_eq!(
        target_group_name("c1", "default", "web", 80, 30080, "TCP", "TCP", 30),
        "k8s-default-web-2e7f1b24e2"
    );
    let long = target_group_name(
        "c1",
        "kube-system",
        "my.long-service",
        80,
        1,
        "UDP",
        "TCP",
        30,
    );
    assert!(long.starts_with("k8s-kubesyst-mylongse-"), "{long}");
    assert!(long.len() <= 32);
}

#[test]
fn health_check_defaults_local_and_shared() {
    let cloud = CloudConfig::default();
    let hc = health_check(&spec(&[], &[(80, 30080)]), &cloud);
    assert_eq!(
        hc,
        HealthCheck {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: None,
            interval: 30,
            healthy: 3,
            unhealthy: 3,
            timeout: None,
        }
    );
    let mut local = spec(&[], &[(80, 30080)]);
    local.local_health_check_node_port = Some(32000);
    let hc = health_check(&local, &cloud);
    assert_eq!(
        (hc.protocol.as_str(), hc.port.as_str(), hc.path.as_deref()),
        ("HTTP", "32000", Some("/healthz"))
    );
    assert_eq!((hc.interval, hc.healthy, hc.unhealthy), (10, 2, 2));

    let shared = CloudConfig {
        health_probe_mode: HealthProbeMode::Shared,
        ..CloudConfig::default()
    };
    let hc = health_check(&spec(&[(ann::HC_INTERVAL, "10")], &[(80, 30080)]), &shared);
    assert_eq!(
        (
            hc.protocol.as_str(),
            hc.port.as_str(),
            hc.path.as_deref(),
            hc.interval
        ),
        ("HTTP", "10256", Some("/healthz"), 10)
    );
    // Local wins over the shared probe.
    assert_eq!(health_check(&local, &shared).port, "32000");
}

#[test]
fn fresh_service_creates_everything_and_converged_plans_nothing() {
    let e = env(&["subnet-a", "subnet-b"], &["i-1", "i-2"]);
    let d = want(
        &[(ann::ADDITIONAL_TAGS, "team=a")],
        &[(80, 30080), (443, 30443)],
        &e,
    );
    let changes = plan(&d, &Actual::default(), "c1");
    let kinds: Vec<String> = changes.iter().map(describe).collect();
    assert!(
        matches!(changes[0], Change::CreateLoadBalancer { .. }),
        "{kinds:?}"
    );
    let creates_tg = changes
        .iter()
        .filter(|c| matches!(c, Change::CreateTargetGroup { .. }))
        .count();
    let listeners = changes
        .iter()
        .filter(|c| matches!(c, Change::CreateListener { .. }))
        .count();
    assert_eq!((creates_tg, listeners), (2, 2), "{kinds:?}");
    // Target groups come before the listeners that use them.
    let first_listener = changes
        .iter()
        .position(|c| matches!(c, Change::CreateListener { .. }))
        .unwrap();
    let last_tg = changes
        .iter()
        .rposition(|c| matches!(c, Change::CreateTargetGroup { .. }))
        .unwrap();
    assert!(last_tg < first_listener);
    // Listeners are tagged owned at creation: the policy grants
    // ModifyListener/DeleteListener only on those.
    for c in &changes {
        if let Change::CreateListener { tags, listener, .. } = c {
            assert_eq!(
                tags.get("kubernetes.io/cluster/c1").map(String::as_str),
                Some("owned"),
                "listener {}: {tags:?}",
                listener.port
            );
        }
    }
    let Some(Change::CreateTargetGroup { tags, group }) = changes
        .iter()
        .find(|c| matches!(c, Change::CreateTargetGroup { .. }))
    else {
        panic!("no target group created: {kinds:?}");
    };
    assert_eq!(tags["team"], "a");
    assert!(tags.contains_key("kubernetes.io/cluster/c1"));
    assert_eq!(group.health.interval, 30);
    assert_eq!(plan(&d, &converged(&d), "c1"), vec![]);
}

#[test]
fn node_churn_registers_and_deregisters_only_the_delta() {
    let before = want(
        &[],
        &[(80, 30080)],
        &env(&["subnet-a"], &["i-1", "i-2", "i-3"]),
    );
    let actual = converged(&before);
    let after = want(
        &[],
        &[(80, 30080)],
        &env(&["subnet-a"], &["i-2", "i-3", "i-4"]),
    );
    let changes = plan(&after, &actual, "c1");
    assert_eq!(
        changes,
        vec![
            Change::RegisterTargets {
                target_group: TgRef::Arn(format!("arn:tg/{}", after.target_groups[0].name)),
                port: 30080,
                instances: BTreeSet::from(["i-4".to_string()]),
            },
            Change::DeregisterTargets {
                arn: format!("arn:tg/{}", after.target_groups[0].name),
                port: 30080,
                instances: BTreeSet::from(["i-1".to_string()]),
            },
        ]
    );
}

/// The creates of `changes` (NLB, target groups, listeners), each with the
/// tags it sends.
fn created_tags(changes: &[Change]) -> Vec<(&Change, &BTreeMap<String, String>)> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::CreateLoadBalancer { tags, .. }
            | Change::CreateTargetGroup { tags, .. }
            | Change::CreateListener { tags, .. } => Some((c, tags)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_legacy_cluster_creates_with_the_legacy_tag_and_never_adds_it_later() {
    let mut e = env(&["subnet-a"], &["i-1"]);
    e.legacy_cluster_tag = true;
    let d = want(&[], &[(80, 30080)], &e);
    let changes = plan(&d, &Actual::default(), "c1");
    let created = created_tags(&changes);
    for (c, tags) in &created {
        assert_eq!(
            tags.get("KubernetesCluster").map(String::as_str),
            Some("c1"),
            "{}",
            describe(c)
        );
        assert_eq!(tags["kubernetes.io/cluster/c1"], "owned");
    }
    assert_eq!(
        created.len(),
        3,
        "{:?}",
        changes.iter().map(describe).collect::<Vec<_>>()
    );
    // An NLB this CCM made before (without the legacy tag): no AddTags for
    // it, which kOps' policy would deny on a resource that lacks it.
    let mut actual = converged(&d);
    for tags in actual
        .lb
        .iter_mut()
        .map(|lb| &mut lb.tags)
        .chain(actual.target_groups.iter_mut().map(|g| &mut g.tags))
    {
        Tags::make_mut(tags).remove("KubernetesCluster");
    }
    assert_eq!(plan(&d, &actual, "c1"), vec![]);
}

#[test]
fn health_check_interval_change_moves_the_listener_to_a_new_group_then_deletes_the_old() {
    let e = env(&["subnet-a"], &["i-1"]);
    let before = want(&[], &[(80, 30080)], &e);
    let after = want(&[(ann::HC_INTERVAL, "10")], &[(80, 30080)], &e);
    assert_ne!(before.target_groups[0].name, after.target_groups[0].name);
    let changes = plan(&after, &converged(&before), "c1");
    let pos = |f: &dyn Fn(&Change) -> bool| changes.iter().position(f).unwrap();
    let create = pos(&|c| matches!(c, Change::CreateTargetGroup { .. }));
    let register = pos(&|c| matches!(c, Change::RegisterTargets { .. }));
    let modify = pos(&|c| matches!(c, Change::ModifyListener { .. }));
    let delete = pos(&|c| matches!(c, Change::DeleteTargetGroup { .. }));
    assert!(
        create < register && register < modify && modify < delete,
        "{changes:?}"
    );
    assert!(!changes.iter().any(|c| matches!(
        c,
        Change::DeleteListener { .. } | Change::CreateListener { .. }
    )));
    // The threshold alone is modified in place.
    let tweak = want(&[(ann::HC_HEALTHY, "5")], &[(80, 30080)], &e);
    let changes = plan(&tweak, &converged(&before), "c1");
    assert!(
        matches!(changes.as_slice(), [Change::ModifyHealthCheck { .. }]),
        "{changes:?}"
    );
}

#[test]
fn tls_listeners_backend_ssl_and_udp() {
    let e = env(&["subnet-a"], &[]);
    let d = want(
        &[
            (ann::SSL_CERT, "arn:cert"),
            (ann::SSL_PORTS, "443"),
            (
                ann::SSL_NEGOTIATION_POLICY,
                "ELBSecurityPolicy-TLS13-1-2-2021-06",
            ),
            (ann::BACKEND_PROTOCOL, "ssl"),
        ],
        &[(80, 30080), (443, 30443)],
        &e,
    );
    let l443 = d.listeners.iter().find(|l| l.port == 443).unwrap();
    assert_eq!(l443.protocol, "TLS");
    assert_eq!(l443.certificate.as_deref(), Some("arn:cert"));
    assert_eq!(
        l443.ssl_policy.as_deref(),
        Some("ELBSecurityPolicy-TLS13-1-2-2021-06")
    );
    let tg = d.target_groups.iter().find(|t| t.port == 30443).unwrap();
    assert_eq!(tg.protocol, "TLS");
    let l80 = d.listeners.iter().find(|l| l.port == 80).unwrap();
    assert_eq!(
        (l80.protocol.as_str(), l80.certificate.as_ref()),
        ("TCP", None)
    );

    // TCP and UDP on one port (same node port) become one TCP_UDP listener.
    let mut svc = service(&[(ann::TYPE, "nlb")], &[(53, 30053), (53, 30053)]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
    let s = LoadBalancerSpec::from_service(&svc).unwrap();
    let d = desired(&s, "default/web", UID, "c1", &CloudConfig::default(), &e).unwrap();
    assert_eq!(d.listeners.len(), 1);
    assert_eq!(d.listeners[0].protocol, "TCP_UDP");
    assert_eq!(d.target_groups[0].protocol, "TCP_UDP");
    // ... and refuse different node ports.
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].node_port = Some(30054);
    let s = LoadBalancerSpec::from_service(&svc).unwrap();
    let err = desired(&s, "default/web", UID, "c1", &CloudConfig::default(), &e).unwrap_err();
    assert!(err.contains("same nodePort"), "{err}");
}

#[test]
fn addresses_pair_with_subnets_and_counts_must_match() {
    let e = env(&["subnet-a", "subnet-b"], &[]);
    let d = want(
        &[(ann::EIP_ALLOCATIONS, "eipalloc-1,eipalloc-2")],
        &[(80, 30080)],
        &e,
    );
    assert_eq!(
        d.subnet_mappings[1].allocation_id.as_deref(),
        Some("eipalloc-2")
    );
    assert!(d.pinned_addresses);
    let bad = desired(
        &spec(&[(ann::EIP_ALLOCATIONS, "eipalloc-1")], &[(80, 30080)]),
        "default/web",
        UID,
        "c1",
        &CloudConfig::default(),
        &e,
    )
    .unwrap_err();
    assert!(
        bad.contains("eip-allocations") && bad.contains("2 subnet"),
        "{bad}"
    );

    // Changing pinned addresses recreates the NLB, deleting first.
    let other = want(
        &[(ann::EIP_ALLOCATIONS, "eipalloc-3,eipalloc-4")],
        &[(80, 30080)],
        &e,
    );
    let changes = plan(&other, &converged(&d), "c1");
    assert!(matches!(changes[0], Change::DeleteLoadBalancer { .. }));
    assert!(matches!(changes[1], Change::CreateLoadBalancer { .. }));
}

#[test]
fn internal_toggle_recreates_and_dualstack_and_attributes_modify_in_place() {
    let e = env(&["subnet-a"], &[]);
    let d = want(&[], &[(80, 30080)], &e);
    let internal = want(&[(ann::INTERNAL, "true")], &[(80, 30080)], &e);
    let changes = plan(&internal, &converged(&d), "c1");
    assert!(matches!(changes[0], Change::DeleteLoadBalancer { .. }));
    assert!(matches!(
        changes[1],
        Change::CreateLoadBalancer { internal: true, .. }
    ));
    // Listeners are recreated on the new NLB; the target groups stay.
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::CreateListener { .. }))
    );
    assert!(!changes.iter().any(|c| matches!(
        c,
        Change::CreateTargetGroup { .. } | Change::DeleteTargetGroup { .. }
    )));

    // Not ours: never deleted.
    let mut foreign = converged(&d);
    if let Some(lb) = foreign.lb.as_mut() {
        lb.tags = Tags::default();
    }
    assert!(
        !plan(&internal, &foreign, "c1")
            .iter()
            .any(|c| matches!(c, Change::DeleteLoadBalancer { .. }))
    );

    let dual = want(
        &[
            (ann::IP_ADDRESS_TYPE, "dualstack"),
            (ann::CROSS_ZONE, "true"),
            (ann::ACCESS_LOG_ENABLED, "true"),
            (ann::ACCESS_LOG_BUCKET, "logs"),
            (
                ann::TARGET_GROUP_ATTRIBUTES,
                "proxy_protocol_v2.enabled=true",
            ),
        ],
        &[(80, 30080)],
        &e,
    );
    let changes = plan(&dual, &converged(&d), "c1");
    assert!(changes.contains(&Change::SetIpAddressType("dualstack".into())));
    assert!(changes.contains(&Change::ModifyAttributes(BTreeMap::from([
        (ATTR_CROSS_ZONE.to_string(), "true".to_string()),
        (ATTR_ACCESS_LOGS.to_string(), "true".to_string()),
        (ATTR_ACCESS_LOGS_BUCKET.to_string(), "logs".to_string()),
    ]))));
    assert!(changes.iter().any(|c| matches!(c, Change::ModifyTargetGroupAttributes { attributes, .. } if attributes["proxy_protocol_v2.enabled"] == "true")));
}

#[test]
fn create_time_settings_change_only_when_the_service_asks_for_it() {
    let e = env(&["subnet-a", "subnet-b"], &[]);
    let eips = [(ann::EIP_ALLOCATIONS, "eipalloc-1,eipalloc-2")];
    let before = want(&eips, &[(80, 30080)], &e);
    // Made by the Go CCM (no record), and the annotations drifted since:
    // internal, other EIPs, other subnets. Nothing is deleted or moved.
    let mut go_made = converged(&before);
    Tags::make_mut(&mut go_made.lb.as_mut().unwrap().tags).remove(crate::aws::tags::APPLIED_TAG);
    let e2 = env(&["subnet-a", "subnet-c"], &[]);
    let drifted = want(
        &[
            (ann::INTERNAL, "true"),
            (ann::EIP_ALLOCATIONS, "eipalloc-3,eipalloc-4"),
        ],
        &[(80, 30080)],
        &e2,
    );
    assert_eq!(plan(&drifted, &go_made, "c1"), vec![]);
    let notes = left_alone(&drifted, &go_made, "c1");
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes[0].contains("scheme is internet-facing") && notes[1].contains("eip-allocations"));
    // Unpinned subnets of a Go-made NLB: not moved either (upstream never
    // changes an NLB's subnets).
    let plain = want(&[], &[(80, 30080)], &e);
    let mut go_plain = converged(&plain);
    go_plain.lb.as_mut().unwrap().tags = Tags::new(plain.tags.clone());
    let moved = want(&[], &[(80, 30080)], &e2);
    assert_eq!(plan(&moved, &go_plain, "c1"), vec![]);
    assert!(left_alone(&moved, &go_plain, "c1")[0].contains("subnets are subnet-a, subnet-b"));
    // Its own NLB: the Service asked for other subnets, so SetSubnets, and
    // the record follows; no note.
    let changes = plan(&moved, &converged(&plain), "c1");
    assert_eq!(
        changes,
        vec![
            Change::SetSubnets(moved.subnet_mappings.clone()),
            Change::AddTags {
                arn: Some("arn:lb".into()),
                tags: BTreeMap::from([(
                    crate::aws::tags::APPLIED_TAG.to_string(),
                    moved.applied.to_value()
                )])
            }
        ]
    );
    assert!(left_alone(&moved, &converged(&plain), "c1").is_empty());
    // The record says these EIPs were applied but AWS shows others (changed
    // outside Kubernetes): the Service asked for nothing new, left alone.
    let mut outside = converged(&drifted);
    outside.lb.as_mut().unwrap().subnet_mappings = converged(&before).lb.unwrap().subnet_mappings;
    outside.lb.as_mut().unwrap().internal = true;
    assert!(
        !plan(&drifted, &outside, "c1")
            .iter()
            .any(|c| matches!(c, Change::DeleteLoadBalancer { .. }))
    );
    assert_eq!(left_alone(&drifted, &outside, "c1").len(), 1);
}

#[test]
fn delete_removes_only_owned_things() {
    let d = want(
        &[],
        &[(80, 30080), (81, 30081)],
        &env(&["subnet-a"], &["i-1"]),
    );
    let mut actual = converged(&d);
    actual.target_groups[1].tags = Tags::default();
    let changes = plan_delete(&actual, "c1", &d.name, "default/web");
    assert!(matches!(changes[0], Change::DeleteLoadBalancer { .. }));
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(plan_delete(&actual, "other", &d.name, "default/web").is_empty());
    // Another Service's deletion proves nothing of this one's.
    assert!(plan_delete(&actual, "c1", &d.name, "default/other").is_empty());
}

/// Groups an earlier sync failed to delete (from the memory) are deleted,
/// except one the Service wants again by name and one the read holds (the
/// plan decides those).
#[test]
fn groups_left_behind_are_deleted_unless_wanted_or_held() {
    let d = want(&[], &[(80, 30080)], &env(&["subnet-a"], &["i-1"]));
    let actual = converged(&d);
    let held = &actual.target_groups[0];
    let left = vec![
        ("arn:left".to_string(), "k8s-default-web-old".to_string()),
        (
            "arn:wanted-again".to_string(),
            d.target_groups[0].name.clone(),
        ),
        (held.arn.clone(), "renamed".to_string()),
    ];
    let changes = left_behind(&d, &actual, left);
    assert_eq!(
        changes,
        vec![Change::DeleteTargetGroup {
            arn: "arn:left".into(),
            name: "k8s-default-web-old".into(),
        }]
    );
    assert!(left_behind(&d, &actual, Vec::new()).is_empty());
}

fn cidr(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

#[test]
fn node_rules_are_described_and_only_ours_are_revoked() {
    let d = want(&[], &[(80, 30080)], &env(&["subnet-a"], &["i-1"]));
    let ranges = [cidr("10.0.0.0/8")];
    let rules = node_rules(&d, &ranges, &[cidr("10.1.0.0/24")]);
    assert_eq!(rules.client.len(), 1);
    assert_eq!(rules.health.len(), 1);
    let name = &d.name;
    let ch = node_group_changes(name, &BTreeMap::new(), Some(&rules), &BTreeSet::new());
    assert_eq!(ch.authorize.len(), 3, "{ch:?}");
    assert_eq!(ch.authorize.values().filter(|d| **d == MTU_RULE).count(), 1);
    assert!(
        ch.authorize
            .values()
            .any(|d| *d == client_rule_description(name))
    );
    assert!(
        ch.authorize
            .values()
            .any(|d| *d == health_rule_description(name))
    );

    // Applied, then a user's rule appears: removing the NLB revokes ours only.
    let mut have = ch.authorize.clone();
    let users = Rule {
        protocol: "tcp".into(),
        from: 22,
        to: 22,
        source: Source::Cidr(cidr("1.2.3.4/32")),
    };
    have.insert(users.clone(), "ssh".into());
    assert!(node_group_changes(name, &have, Some(&rules), &BTreeSet::new()).is_empty());
    let gone = node_group_changes(name, &have, None, &BTreeSet::new());
    assert_eq!(gone.revoke.len(), 3);
    assert!(!gone.revoke.contains(&users));
    assert!(gone.authorize.is_empty());

    // Another NLB's client rule from the same range keeps the MTU rule.
    let mut shared = have.clone();
    shared.insert(
        Rule {
            protocol: "tcp".into(),
            from: 31000,
            to: 31000,
            source: Source::Cidr(cidr("10.0.0.0/8")),
        },
        client_rule_description("aother"),
    );
    let gone = node_group_changes(name, &shared, None, &BTreeSet::new());
    assert_eq!(gone.revoke.len(), 2);

    // From anywhere, TCP, same ports: health rules are covered by the client rules.
    let open = node_rules(&d, &[Ipv4Net::default()], &[cidr("10.1.0.0/24")]);
    assert!(open.health.is_empty());
}

/// `NLBNodeIngress = LoadBalancerGroup`: one rule from the NLB's group
/// replaces the CIDR rules, added before they go; back to CIDR rules the
/// other way round; the group rule of a group another NLB carries stays.
#[test]
fn a_group_rule_replaces_the_cidr_rules_and_back() {
    let d = want(
        &[],
        &[(80, 30080), (443, 30443)],
        &env(&["subnet-a"], &["i-1"]),
    );
    let name = &d.name;
    let ranges = [cidr("10.0.0.0/8")];
    let cidr_rules = node_rules(&d, &ranges, &[cidr("10.1.0.0/24"), cidr("10.2.0.0/24")]);
    let none = BTreeSet::new();
    // The Go CCM's state: client, health and MTU rules.
    let go_state = node_group_changes(name, &BTreeMap::new(), Some(&cidr_rules), &none).authorize;
    assert_eq!(go_state.len(), 2 + 2 * 2 + 1, "{go_state:?}");
    // Unchanged without the group: nothing to do (a swap changes nothing).
    assert!(node_group_changes(name, &go_state, Some(&cidr_rules), &none).is_empty());

    let grouped = NodeRules {
        from_group: Some("sg-nlb".into()),
        ..cidr_rules.clone()
    };
    let to_group = node_group_changes(name, &go_state, Some(&grouped), &none);
    let group_rule = Rule::all_from_group("sg-nlb");
    assert_eq!(
        to_group.authorize,
        BTreeMap::from([(group_rule.clone(), GROUP_RULE.to_string())])
    );
    // Every CIDR rule of this NLB goes, the MTU rule with them.
    assert_eq!(
        to_group.revoke,
        go_state.keys().cloned().collect::<BTreeSet<_>>()
    );
    assert!(to_group.adds_first() && to_group.adds_group_rule());

    // Applied: one rule, and nothing more to do.
    let grouped_state = to_group.authorize.clone();
    assert!(node_group_changes(name, &grouped_state, Some(&grouped), &none).is_empty());

    // The fallback at the rules limit is the CIDR plan: on the Go CCM's
    // state it changes nothing.
    assert!(node_group_changes(name, &go_state, Some(&grouped.cidr_only()), &none).is_empty());

    // Back to CIDR rules (the operator unsets the key): they are added
    // first, then the group rule goes, when no other NLB carries its group.
    let revocable = BTreeSet::from(["sg-nlb".to_string()]);
    let back = node_group_changes(name, &grouped_state, Some(&cidr_rules), &revocable);
    assert_eq!(back.authorize, go_state);
    assert_eq!(back.revoke, BTreeSet::from([group_rule.clone()]));
    assert!(back.adds_first());
    // Another NLB carries the group too: its rule stays.
    let kept = node_group_changes(name, &grouped_state, Some(&cidr_rules), &none);
    assert!(kept.revoke.is_empty(), "{kept:?}");

    // A group that stops being a backend loses the group rule (revocable).
    let left = node_group_changes(name, &grouped_state, None, &revocable);
    assert_eq!(left.revoke, BTreeSet::from([group_rule.clone()]));

    // A user's rule from the same group (another description) is theirs:
    // never revoked, and not added again.
    let users = BTreeMap::from([(group_rule.clone(), "mine".to_string())]);
    assert!(node_group_changes(name, &users, Some(&grouped), &revocable).is_empty());
    assert!(node_group_changes(name, &users, None, &revocable).is_empty());
}

/// Rules per node group when `services` NLBs (two ports each, health
/// checks on their own node port as `externalTrafficPolicy: Local` asks,
/// two NLB subnets, clients from anywhere) all back one node group, each
/// NLB planned on what the ones before it left: the Go CCM's CIDR rules,
/// one group rule per NLB (each its own group), or the shared backend
/// group's rule (every NLB carries the one group).
fn rules_per_node_group(services: usize, ingress: NlbNodeIngress) -> usize {
    let subnets = [cidr("10.1.0.0/24"), cidr("10.2.0.0/24")];
    let mut have: DescribedRules = BTreeMap::new();
    for i in 0..services {
        let uid = format!("{i:08x}-1234-4f6e-9a7b-abcdefabcdef");
        let e = env(&["subnet-a", "subnet-b"], &["i-1"]);
        let port = 30000 + 2 * i as i32;
        let mut spec = spec(&[], &[(80, port), (443, port + 1)]);
        spec.local_health_check_node_port = Some(32000 + i as i32);
        let d = desired(
            &spec,
            "default/web",
            &uid,
            "c1",
            &CloudConfig::default(),
            &e,
        )
        .unwrap();
        let mut rules = node_rules(&d, &[Ipv4Net::default()], &subnets);
        rules.from_group = match ingress {
            NlbNodeIngress::Cidr => None,
            NlbNodeIngress::LoadBalancerGroup => Some(format!("sg-{i}")),
            NlbNodeIngress::SharedBackendGroup => Some("sg-shared".into()),
        };
        let ch = node_group_changes(&d.name, &have, Some(&rules), &BTreeSet::new());
        for r in &ch.revoke {
            have.remove(r);
        }
        have.extend(ch.authorize);
    }
    have.len()
}

#[test]
fn rules_per_node_group_grow_by_one_per_nlb_with_group_rules() {
    // Go CCM: two client rules and two health rules (one port, two
    // subnets) per NLB, and one MTU rule; AWS's default limit of 60 is
    // reached at the 15th NLB.
    for n in [10, 100, 500] {
        let (cidr, group, shared) = (
            rules_per_node_group(n, NlbNodeIngress::Cidr),
            rules_per_node_group(n, NlbNodeIngress::LoadBalancerGroup),
            rules_per_node_group(n, NlbNodeIngress::SharedBackendGroup),
        );
        eprintln!(
            "rules per node group at {n} NLBs: CIDR {cidr}, LoadBalancerGroup {group}, SharedBackendGroup {shared}"
        );
        // The shared group's one rule, whatever the number of NLBs.
        assert_eq!((cidr, group, shared), (n * 4 + 1, n, 1));
    }
}

#[test]
fn managed_group_and_byo_switching() {
    let managed = CloudConfig {
        nlb_security_group_mode: NlbSecurityGroupMode::Managed,
        ..CloudConfig::default()
    };
    let e = env(&["subnet-a"], &["i-1"]);
    let mk = |a: &[(&str, &str)]| {
        desired(
            &spec(a, &[(80, 30080)]),
            "default/web",
            UID,
            "c1",
            &managed,
            &e,
        )
        .unwrap()
    };
    let d = mk(&[(ann::SOURCE_RANGES, "10.0.0.0/8")]);
    let owned = d.owned_group.clone().unwrap();
    // Upstream's name: sha256("kubernetes" "web" "default" UID).
    assert_eq!(owned.name, "k8s-default-web-9797dd8004");
    assert_eq!(
        owned.description,
        "[k8s] Managed SecurityGroup for LoadBalancer"
    );
    assert_eq!(owned.rules.len(), 2, "port 80 and ICMP from the range");
    let changes = plan(&d, &Actual::default(), "c1");
    assert!(matches!(changes[0], Change::CreateSecurityGroup(_)));
    assert!(changes.iter().any(|c| matches!(c, Change::CreateLoadBalancer { security_groups, .. } if security_groups == &vec![GroupRef::Owned])));
    assert_eq!(plan(&d, &converged(&d), "c1"), vec![]);

    // Managed → BYO: the NLB takes the user's groups, then the owned group goes.
    let byo = mk(&[(ann::SECURITY_GROUPS, "sg-user")]);
    assert!(byo.owned_group.is_none());
    let changes = plan(&byo, &converged(&d), "c1");
    assert_eq!(
        changes,
        vec![
            Change::SetSecurityGroups(vec![GroupRef::Id("sg-user".into())]),
            Change::DeleteSecurityGroup("sg-owned".into()),
        ]
    );
    // BYO → Managed: a new owned group; the user's group is left alone.
    let mut from_byo = converged(&byo);
    from_byo.owned_group = None;
    let changes = plan(&d, &from_byo, "c1");
    assert!(matches!(changes[0], Change::CreateSecurityGroup(_)));
    assert!(changes.contains(&Change::SetSecurityGroups(vec![GroupRef::Owned])));
    assert!(!changes.iter().any(|c| matches!(
        c,
        Change::DeleteSecurityGroup(_) | Change::DeleteLoadBalancer { .. }
    )));
    // An NLB created without groups cannot get any: left without, as
    // upstream (no group made, nothing recreated).
    let plain = want(&[], &[(80, 30080)], &e);
    assert_eq!(plan(&d, &converged(&plain), "c1"), vec![]);
    // Outside Managed mode an NLB's groups are left as they are, and
    // `security-groups` is not read (as upstream).
    let unmanaged = want(&[(ann::SECURITY_GROUPS, "sg-user")], &[(80, 30080)], &e);
    assert!(unmanaged.security_groups.is_empty());
    assert_eq!(plan(&unmanaged, &converged(&d), "c1"), vec![]);
    // Deletion removes the owned group after the NLB.
    let del = plan_delete(&converged(&d), "c1", &d.name, "default/web");
    assert_eq!(
        del.last(),
        Some(&Change::DeleteSecurityGroup("sg-owned".into()))
    );
}

#[test]
fn at_the_target_quota_every_later_deregistration_makes_room() {
    let ids = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let register = |arn: &str| Change::RegisterTargets {
        target_group: TgRef::Arn(arn.into()),
        port: 30080,
        instances: ids(&["i-new"]),
    };
    let deregister = |arn: &str| Change::DeregisterTargets {
        arn: arn.into(),
        port: 30080,
        instances: ids(&["i-old"]),
    };
    // Two ports: the plan registers, then deregisters, group by group.
    let changes = vec![
        register("arn:tg/a"),
        deregister("arn:tg/a"),
        register("arn:tg/b"),
        deregister("arn:tg/b"),
        Change::DeleteTargetGroup {
            arn: "arn:tg/old".into(),
            name: "old".into(),
        },
    ];
    // The first register refused: both groups' leaving targets go first
    // (the quota counts the NLB's groups together).
    let none = BTreeSet::new();
    assert_eq!(io::leaving_targets(&changes, 0, &none), vec![1, 3]);
    // Once they went, a later refusal finds nothing left to make room with.
    let done = BTreeSet::from([1, 3]);
    assert!(io::leaving_targets(&changes, 2, &done).is_empty());
    // A deregistration already behind the refused step is not one to redo.
    assert_eq!(io::leaving_targets(&changes, 2, &none), vec![3]);
    // A new group's first register has no leaving targets.
    let new_group = vec![Change::RegisterTargets {
        target_group: TgRef::Name("new".into()),
        port: 30080,
        instances: ids(&["i-new"]),
    }];
    assert!(io::leaving_targets(&new_group, 0, &none).is_empty());
}

const PROTECTED: (&str, &str) = (ann::LB_ATTRIBUTES, "deletion_protection.enabled=true");

#[test]
fn a_protected_nlb_is_created_with_awss_deletion_protection_and_the_ccms_tag() {
    let e = env(&["subnet-a"], &["i-1"]);
    let d = want(&[PROTECTED], &[(80, 30080)], &e);
    assert_eq!(d.attributes[ATTR_DELETION_PROTECTION], "true");
    let changes = plan(&d, &Actual::default(), "c1");
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::CreateLoadBalancer { tags, .. }
        if tags.get(crate::aws::tags::DELETION_PROTECTION_TAG).map(String::as_str) == Some("on")))
    );
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::ModifyAttributes(a)
        if a.get(ATTR_DELETION_PROTECTION).map(String::as_str) == Some("true")))
    );
    // Without the key: no attribute asked for, none touched.
    let plain = want(&[], &[(80, 30080)], &e);
    assert!(!plain.attributes.contains_key(ATTR_DELETION_PROTECTION));
}

#[test]
fn only_the_protection_this_ccm_turned_on_is_turned_off() {
    let e = env(&["subnet-a"], &["i-1"]);
    let plain = want(&[], &[(80, 30080)], &e);
    // AWS protects it (by hand, or the Go CCM's era): left as it is.
    let mut by_hand = converged(&plain);
    let lb = by_hand.lb.as_mut().unwrap();
    lb.attributes
        .insert(ATTR_DELETION_PROTECTION.into(), "true".into());
    assert!(!unprotecting(&plain, &lb.tags));
    assert_eq!(plan(&plain, &by_hand, "c1"), vec![]);
    // This CCM turned it on and the Service no longer asks: off, and the tag says so.
    let mut ours = by_hand.clone();
    let lb = ours.lb.as_mut().unwrap();
    let mut t = (*lb.tags).clone();
    t.insert(
        crate::aws::tags::DELETION_PROTECTION_TAG.into(),
        "on".into(),
    );
    lb.tags = Tags::new(t);
    let our_tags = lb.tags.clone();
    assert!(unprotecting(&plain, &our_tags));
    let changes = plan(&plain, &ours, "c1");
    assert!(
        changes.contains(&Change::ModifyAttributes(BTreeMap::from([(
            ATTR_DELETION_PROTECTION.to_string(),
            "false".to_string()
        )]))),
        "{changes:?}"
    );
    assert!(
        changes
            .iter()
            .any(|c| matches!(c, Change::AddTags { tags, .. }
        if tags.get(crate::aws::tags::DELETION_PROTECTION_TAG).map(String::as_str) == Some("off")))
    );
    // Still asked for: nothing to do.
    let protected = want(&[PROTECTED], &[(80, 30080)], &e);
    assert!(!unprotecting(&protected, &our_tags));
    assert_eq!(plan(&protected, &ours, "c1"), vec![]);
    // `false` written: off, whoever turned it on.
    let off = want(
        &[(ann::LB_ATTRIBUTES, "deletion_protection.enabled=false")],
        &[(80, 30080)],
        &e,
    );
    assert!(
        plan(&off, &by_hand, "c1").contains(&Change::ModifyAttributes(BTreeMap::from([(
            ATTR_DELETION_PROTECTION.to_string(),
            "false".to_string()
        )])))
    );
}

#[test]
fn keeping_a_protected_nlb_deregisters_its_targets_and_tags_it_kept() {
    let d = want(
        &[PROTECTED],
        &[(80, 30080)],
        &env(&["subnet-a"], &["i-1", "i-2"]),
    );
    let actual = converged(&d);
    let changes = plan_keep(&actual, "c1", &d.name, "default/web").expect("proven");
    let tg = &actual.target_groups[0];
    assert_eq!(
        changes,
        vec![
            Change::DeregisterTargets {
                arn: tg.arn.clone(),
                port: tg.port,
                instances: BTreeSet::from(["i-1".to_string(), "i-2".to_string()]),
            },
            Change::AddTags {
                arn: Some("arn:lb".into()),
                tags: BTreeMap::from([(
                    crate::aws::tags::KEPT_TAG.to_string(),
                    "default/web".to_string()
                )]),
            },
        ]
    );
    assert!(!changes.iter().any(|c| matches!(
        c,
        Change::DeleteLoadBalancer { .. }
            | Change::DeleteTargetGroup { .. }
            | Change::DeleteListener { .. }
    )));
    // A target group on the NLB that is not proven made for the Service
    // (someone else's listener) keeps its targets.
    let mut foreign = actual.clone();
    let mut byhand = actual.target_groups[0].clone();
    byhand.arn = "arn:tg/byhand".into();
    byhand.name = "byhand".into();
    foreign.target_groups.push(byhand);
    assert_eq!(
        plan_keep(&foreign, "c1", &d.name, "default/web"),
        Some(changes.clone())
    );
    // Not proven this CCM's for the Service: not kept, not touched.
    assert_eq!(plan_keep(&actual, "other", &d.name, "default/web"), None);
    assert_eq!(plan_keep(&actual, "c1", &d.name, "default/other"), None);
    // Kept already, nothing registered: nothing more to do.
    let mut again = actual.clone();
    let lb = again.lb.as_mut().unwrap();
    let mut t = (*lb.tags).clone();
    t.insert(crate::aws::tags::KEPT_TAG.into(), "default/web".into());
    lb.tags = Tags::new(t);
    again.target_groups[0].targets.clear();
    assert_eq!(
        plan_keep(&again, "c1", &d.name, "default/web"),
        Some(vec![])
    );
}

const MARKER: &str = crate::aws::tags::MANAGED_TAGS_TAG;

/// The tag writes of a plan, by resource (`nlb`, `tg`, `listener`).
fn tag_writes(changes: &[Change]) -> Vec<(String, String)> {
    let kind = |arn: &Option<String>| match arn.as_deref() {
        None | Some("arn:lb") => "nlb".to_string(),
        Some(a) if a.starts_with("arn:tg/") => "tg".to_string(),
        Some(a) if a.starts_with("arn:listener/") => "listener".to_string(),
        Some(a) => a.to_string(),
    };
    changes
        .iter()
        .filter_map(|c| match c {
            Change::AddTags { arn, tags } => Some((kind(arn), format!("+{tags:?}"))),
            Change::RemoveTags { arn, keys } => Some((kind(arn), format!("-{keys:?}"))),
            _ => None,
        })
        .collect()
}

#[test]
fn created_resources_record_the_annotation_keys_they_carry() {
    let e = env(&["subnet-a"], &["i-1"]);
    let d = want(
        &[(ann::ADDITIONAL_TAGS, "team=a,env=prod")],
        &[(80, 30080)],
        &e,
    );
    let changes = plan(&d, &Actual::default(), "c1");
    let created = created_tags(&changes);
    for (c, tags) in &created {
        assert_eq!(tags[MARKER], "env team", "{c:?}");
        assert_eq!(tags["team"], "a");
    }
    assert_eq!(created.len(), 3, "{changes:?}");
    // Without additional tags no record is written.
    let bare = want(&[], &[(80, 30080)], &e);
    assert!(
        plan(&bare, &Actual::default(), "c1")
            .iter()
            .all(|c| match c {
                Change::CreateLoadBalancer { tags, .. } => !tags.contains_key(MARKER),
                _ => true,
            })
    );
}

#[test]
fn tags_follow_the_annotation_on_the_nlb_its_listeners_and_target_groups() {
    let e = env(&["subnet-a"], &["i-1"]);
    let before = want(
        &[(ann::ADDITIONAL_TAGS, "team=a,env=prod")],
        &[(80, 30080)],
        &e,
    );
    let live = converged(&before);
    assert!(plan(&before, &live, "c1").is_empty(), "steady: no write");
    // team changes, env is removed, cost is added.
    let after = want(
        &[(ann::ADDITIONAL_TAGS, "team=b,cost=42")],
        &[(80, 30080)],
        &e,
    );
    let writes = tag_writes(&plan(&after, &live, "c1"));
    for kind in ["nlb", "tg", "listener"] {
        let mine: Vec<&str> = writes
            .iter()
            .filter(|(k, _)| k == kind)
            .map(|(_, w)| w.as_str())
            .collect();
        assert_eq!(
            mine,
            [
                format!("+{{\"cost\": \"42\", \"{MARKER}\": \"cost team\", \"team\": \"b\"}}")
                    .as_str(),
                "-{\"env\"}",
            ],
            "{kind}: {writes:?}"
        );
    }
    // Every key removed: the record goes too.
    let none = want(&[], &[(80, 30080)], &e);
    let writes = tag_writes(&plan(&none, &live, "c1"));
    assert_eq!(writes.len(), 3, "{writes:?}");
    for (_, w) in &writes {
        assert_eq!(w, &format!("-{{\"env\", \"{MARKER}\", \"team\"}}"));
    }
}

#[test]
fn tags_nobody_recorded_are_never_removed() {
    let e = env(&["subnet-a"], &["i-1"]);
    let d = want(&[(ann::ADDITIONAL_TAGS, "team=a")], &[(80, 30080)], &e);
    // As the Go CCM leaves it: the tags, no record.
    let mut live = converged(&d);
    let strip = |t: &Tags| {
        let mut t = (**t).clone();
        t.remove(MARKER);
        t.insert("owner".into(), "someone".into());
        Tags::new(t)
    };
    let lb = live.lb.as_mut().unwrap();
    lb.tags = strip(&lb.tags);
    for l in &mut lb.listeners {
        l.tags = l.tags.as_ref().map(strip);
    }
    for tg in &mut live.target_groups {
        tg.tags = strip(&tg.tags);
    }
    assert!(plan(&d, &live, "c1").is_empty(), "a Go-made NLB: no write");
    // The key leaves the annotation: without a record it stays, as do the
    // tags someone else wrote.
    let gone = want(&[], &[(80, 30080)], &e);
    assert!(tag_writes(&plan(&gone, &live, "c1")).is_empty());
    // A new key is written with the record of what is now applied.
    let more = want(
        &[(ann::ADDITIONAL_TAGS, "team=a,env=x")],
        &[(80, 30080)],
        &e,
    );
    let writes = tag_writes(&plan(&more, &live, "c1"));
    assert_eq!(writes.len(), 3, "{writes:?}");
    for (_, w) in &writes {
        assert_eq!(
            w,
            &format!("+{{\"env\": \"x\", \"{MARKER}\": \"env team\"}}")
        );
    }
    // Listener tags not read: left as they are.
    let lb = live.lb.as_mut().unwrap();
    for l in &mut lb.listeners {
        l.tags = None;
    }
    let writes = tag_writes(&plan(&more, &live, "c1"));
    assert!(writes.iter().all(|(k, _)| k != "listener"), "{writes:?}");
}

#[test]
fn a_tag_the_controller_writes_is_refused_with_a_warning() {
    let r = LoadBalancerSpec::read(&service(
        &[
            (ann::TYPE, "nlb"),
            (
                ann::ADDITIONAL_TAGS,
                "kubernetes.io/service-name=other/x,team=a,kubernetes.io/cloud-controller/managed-tags=team",
            ),
        ],
        &[(80, 30080)],
    ));
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    let note = r
        .notes
        .iter()
        .find(|n| n.field == ann::ADDITIONAL_TAGS)
        .expect("a note");
    assert!(
        note.reading.contains("kubernetes.io/service-name"),
        "{note:?}"
    );
    assert_eq!(note.holds, ann::Holds::Nothing);
    let e = env(&["subnet-a"], &["i-1"]);
    let d = desired(
        &r.spec,
        "default/web",
        UID,
        "c1",
        &CloudConfig::default(),
        &e,
    )
    .unwrap();
    assert_eq!(d.tags[crate::aws::tags::SERVICE_NAME_TAG], "default/web");
    assert_eq!(
        d.additional_tags,
        BTreeMap::from([("team".to_string(), "a".to_string())])
    );
    assert_eq!(d.create_tags()[MARKER], "team");
}

const TG_RECORD: &str = crate::aws::tags::TARGET_GROUP_ATTRIBUTES_TAG;
const DEREG: &str = "deregistration_delay.timeout_seconds";

/// The target group attribute writes and record writes of a plan.
fn attribute_writes(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::ModifyTargetGroupAttributes { attributes, .. } => {
                Some(format!("set {attributes:?}"))
            }
            Change::AddTags { arn: Some(a), tags } if a.starts_with("arn:tg/") => {
                tags.get(TG_RECORD).map(|r| format!("record {r}"))
            }
            Change::RemoveTags { arn: Some(a), keys } if a.starts_with("arn:tg/") => {
                keys.contains(TG_RECORD).then(|| "unrecord".to_string())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn target_group_attributes_aws_documents_are_applied_and_dropped_ones_return_to_the_default() {
    let e = env(&["subnet-a"], &["i-1"]);
    let tga = ann::TARGET_GROUP_ATTRIBUTES;
    let d = want(
        &[(
            tga,
            "deregistration_delay.timeout_seconds=30,stickiness.enabled=true",
        )],
        &[(80, 30080)],
        &e,
    );
    // Created with the attributes and their record.
    let fresh = plan(&d, &Actual::default(), "c1");
    let created = fresh.iter().find_map(|c| match c {
        Change::CreateTargetGroup { tags, .. } => Some(tags.clone()),
        _ => None,
    });
    assert_eq!(
        created.unwrap()[TG_RECORD],
        format!("{DEREG} stickiness.enabled")
    );
    assert_eq!(
        attribute_writes(&fresh),
        [format!(
            "set {{\"{DEREG}\": \"30\", \"stickiness.enabled\": \"true\"}}"
        )]
    );
    // As created: steady.
    let mut live = converged(&d);
    for tg in &mut live.target_groups {
        let mut t = (*tg.tags).clone();
        t.insert(TG_RECORD.into(), format!("{DEREG} stickiness.enabled"));
        tg.tags = Tags::new(t);
    }
    assert!(plan(&d, &live, "c1").is_empty());
    // One dropped, one changed: the dropped returns to AWS's 300 s.
    let changed = want(&[(tga, "stickiness.enabled=false")], &[(80, 30080)], &e);
    assert_eq!(
        attribute_writes(&plan(&changed, &live, "c1")),
        [
            format!("set {{\"{DEREG}\": \"300\", \"stickiness.enabled\": \"false\"}}"),
            "record stickiness.enabled".to_string(),
        ]
    );
    // All dropped: both back to the defaults, the record gone.
    let none = want(&[], &[(80, 30080)], &e);
    assert_eq!(
        attribute_writes(&plan(&none, &live, "c1")),
        [
            format!("set {{\"{DEREG}\": \"300\", \"stickiness.enabled\": \"false\"}}"),
            "unrecord".to_string(),
        ]
    );
}

#[test]
fn target_group_attributes_nobody_recorded_are_left_as_they_are() {
    let e = env(&["subnet-a"], &["i-1"]);
    let tga = ann::TARGET_GROUP_ATTRIBUTES;
    // The Go CCM's state: it applied proxy protocol, and wrote no record.
    let d = want(
        &[(tga, "proxy_protocol_v2.enabled=true")],
        &[(80, 30080)],
        &e,
    );
    let live = converged(&d);
    assert!(plan(&d, &live, "c1").is_empty(), "a swap writes nothing");
    // The annotation removed: left on, as the Go CCM leaves it.
    let none = want(&[], &[(80, 30080)], &e);
    assert!(attribute_writes(&plan(&none, &live, "c1")).is_empty());
    // A change is applied and recorded; from then on it is this CCM's.
    let more = want(
        &[(
            tga,
            "proxy_protocol_v2.enabled=true,deregistration_delay.timeout_seconds=10",
        )],
        &[(80, 30080)],
        &e,
    );
    assert_eq!(
        attribute_writes(&plan(&more, &live, "c1")),
        [
            format!("set {{\"{DEREG}\": \"10\"}}"),
            format!("record {DEREG} proxy_protocol_v2.enabled"),
        ]
    );
}

#[test]
fn a_target_group_attribute_aws_refuses_is_refused_before_any_call() {
    for v in [
        "slow_start.duration_seconds=30",
        "deregistration_delay.timeout_seconds=3601",
        "stickiness.type=lb_cookie",
        "target_health_state.unhealthy.draining_interval_seconds=30",
    ] {
        let r = LoadBalancerSpec::read(&service(
            &[(ann::TYPE, "nlb"), (ann::TARGET_GROUP_ATTRIBUTES, v)],
            &[(80, 30080)],
        ));
        let e = r
            .errors
            .iter()
            .find(|e| e.field == ann::TARGET_GROUP_ATTRIBUTES);
        assert!(e.is_some_and(|e| e.value == v), "{v}: {:?}", r.errors);
    }
}

/// A UDP Service's NLB as `annotations` ask, through the spec reader.
fn udp_want(annotations: &[(&str, &str)], e: &Environment) -> Result<Desired, String> {
    let mut a = vec![(ann::TYPE, "nlb")];
    a.extend_from_slice(annotations);
    let mut svc = service(&a, &[(53, 30053)]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
    let s = LoadBalancerSpec::from_service(&svc).map_err(|e| e.to_string())?;
    desired(&s, "default/web", UID, "c1", &CloudConfig::default(), e)
}

#[test]
fn a_udp_group_refuses_what_aws_fixes_there_and_returns_to_udps_defaults() {
    let e = env(&["subnet-a"], &["i-1"]);
    let tga = ann::TARGET_GROUP_ATTRIBUTES;
    for v in [
        "preserve_client_ip.enabled=false",
        "target_health_state.unhealthy.connection_termination.enabled=true",
    ] {
        let err = udp_want(&[(tga, v)], &e).expect_err(v);
        assert!(err.contains("UDP port"), "{v}: {err}");
    }
    // Applied and recorded, then dropped: back to what AWS gives a UDP
    // group (it terminates at the end of the delay, and cannot terminate
    // unhealthy targets' connections), not a TCP group's defaults.
    let set = "deregistration_delay.connection_termination.enabled=false,target_health_state.unhealthy.connection_termination.enabled=false";
    let d = udp_want(&[(tga, set)], &e).unwrap();
    assert_eq!(d.target_groups[0].protocol, "UDP");
    let mut live = converged(&d);
    for tg in &mut live.target_groups {
        let mut t = (*tg.tags).clone();
        let record = d
            .target_group_attributes
            .keys()
            .cloned()
            .collect::<Vec<_>>();
        t.insert(TG_RECORD.into(), record.join(" "));
        tg.tags = Tags::new(t);
    }
    assert!(plan(&d, &live, "c1").is_empty());
    let none = udp_want(&[], &e).unwrap();
    assert_eq!(
        attribute_writes(&plan(&none, &live, "c1")),
        [
            // (Not `true` for the unhealthy switch, which AWS refuses on UDP.)
            "set {\"deregistration_delay.connection_termination.enabled\": \"true\"}".to_string(),
            "unrecord".to_string(),
        ]
    );
}

const HC_RECORD: &str = crate::aws::tags::HEALTH_TIMEOUT_TAG;

fn want_with(annotations: &[(&str, &str)], cloud: &CloudConfig, e: &Environment) -> Desired {
    desired(
        &spec(annotations, &[(80, 30080)]),
        "default/web",
        UID,
        "c1",
        cloud,
        e,
    )
    .unwrap()
}

/// The timeouts a plan sends and its record writes.
fn timeout_writes(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::ModifyHealthCheck { health, .. } => Some(format!("send {:?}", health.timeout)),
            Change::CreateTargetGroup { group, tags } => Some(format!(
                "create {:?} record {:?}",
                group.health.timeout,
                tags.get(HC_RECORD)
            )),
            Change::AddTags { tags, .. } => tags.get(HC_RECORD).map(|r| format!("record {r}")),
            Change::RemoveTags { keys, .. } => {
                keys.contains(HC_RECORD).then(|| "unrecord".to_string())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn health_check_timeout_is_sent_only_with_the_cloud_conf_key() {
    let e = env(&["subnet-a"], &["i-1"]);
    let off = CloudConfig::default();
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let ann = [(ann::HC_TIMEOUT, "20")];
    // The Go CCM's state: AWS's default 10 s, no record.
    let go = want_with(&ann, &off, &e);
    let mut live = converged(&go);
    for tg in &mut live.target_groups {
        tg.health.timeout = Some(10);
    }
    // Key off: created without a timeout, and a live NLB is left alone.
    assert_eq!(
        timeout_writes(&plan(&go, &Actual::default(), "c1")),
        ["create None record None"]
    );
    assert!(plan(&go, &live, "c1").is_empty());
    // Key on: created with it and its record; a live one modified in place.
    let d = want_with(&ann, &on, &e);
    assert_eq!(
        timeout_writes(&plan(&d, &Actual::default(), "c1")),
        ["create Some(20) record Some(\"20\")"]
    );
    assert_eq!(
        timeout_writes(&plan(&d, &live, "c1")),
        ["send Some(20)", "record 20"]
    );
    // Applied and recorded: steady.
    for tg in &mut live.target_groups {
        tg.health.timeout = Some(20);
        let mut t = (*tg.tags).clone();
        t.insert(HC_RECORD.into(), "20".into());
        tg.tags = Tags::new(t);
    }
    assert!(plan(&d, &live, "c1").is_empty());
    // Removed: back to AWS's 10 s for a TCP check, the record gone.
    let none = want_with(&[], &on, &e);
    assert_eq!(
        timeout_writes(&plan(&none, &live, "c1")),
        ["send Some(10)", "unrecord"]
    );
    // Key off again: nothing is touched.
    assert!(plan(&want_with(&[], &off, &e), &live, "c1").is_empty());
}

#[test]
fn health_check_timeout_nobody_recorded_or_above_the_interval_is_left_alone() {
    let e = env(&["subnet-a"], &["i-1"]);
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    // Set by hand to 15 s, no record: removal leaves it.
    let none = want_with(&[], &on, &e);
    let mut live = converged(&none);
    for tg in &mut live.target_groups {
        tg.health.timeout = Some(15);
    }
    assert!(plan(&none, &live, "c1").is_empty());
    // Above the 10 s interval, which AWS refuses: not sent.
    let over = want_with(
        &[(ann::HC_INTERVAL, "10"), (ann::HC_TIMEOUT, "20")],
        &on,
        &e,
    );
    assert_eq!(over.health_timeout, None);
    assert_eq!(
        timeout_writes(&plan(&over, &Actual::default(), "c1")),
        ["create None record None"]
    );
    assert_eq!(super::default_health_timeout("HTTP"), 6);
}

const ALPN_RECORD: &str = crate::aws::tags::ALPN_POLICY_TAG;
const CERT: &str = "arn:aws:acm:us-east-1:123456789012:certificate/x";

/// The ALPN policies a plan sends (by listener port) and its record writes.
fn alpn_writes(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::CreateListener { listener, alpn, .. } => {
                Some(format!("create {} {alpn:?}", listener.port))
            }
            Change::ModifyListener { listener, alpn, .. } => {
                Some(format!("modify {} {alpn:?}", listener.port))
            }
            Change::AddTags { arn: None, tags } => {
                tags.get(ALPN_RECORD).map(|r| format!("record {r}"))
            }
            Change::RemoveTags { arn: None, keys } => {
                keys.contains(ALPN_RECORD).then(|| "unrecord".to_string())
            }
            _ => None,
        })
        .collect()
}

fn tls_want(annotations: &[(&str, &str)], cloud: &CloudConfig, e: &Environment) -> Desired {
    let mut a = vec![(ann::SSL_CERT, CERT), (ann::SSL_PORTS, "443")];
    a.extend_from_slice(annotations);
    desired(
        &spec(&a, &[(80, 30080), (443, 30443)]),
        "default/web",
        UID,
        "c1",
        cloud,
        e,
    )
    .unwrap()
}

fn with_alpn(live: &mut Actual, policy: Option<&str>, record: Option<&str>) {
    let lb = live.lb.as_mut().unwrap();
    for l in &mut lb.listeners {
        if l.protocol == "TLS" {
            l.alpn = policy.map(String::from);
        }
    }
    let mut t = (*lb.tags).clone();
    match record {
        Some(r) => t.insert(ALPN_RECORD.into(), r.into()),
        None => t.remove(ALPN_RECORD),
    };
    lb.tags = Tags::new(t);
}

#[test]
fn alpn_policy_is_sent_to_tls_listeners_only_with_the_cloud_conf_key() {
    let e = env(&["subnet-a"], &["i-1"]);
    let off = CloudConfig::default();
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let ann = [(ann::ALPN_POLICY, "HTTP2Preferred")];
    // Key off (the Go CCM's reading): neither sent at creation nor on a
    // live NLB, whatever its listeners' policy.
    let go = tls_want(&ann, &off, &e);
    assert_eq!(go.alpn, None);
    assert_eq!(
        alpn_writes(&plan(&go, &Actual::default(), "c1")),
        ["create 80 None", "create 443 None"]
    );
    let mut live = converged(&go);
    with_alpn(&mut live, Some("None"), None);
    assert!(plan(&go, &live, "c1").is_empty());
    // Key on: created with it on the TLS listener only, and recorded.
    let d = tls_want(&ann, &on, &e);
    assert_eq!(
        alpn_writes(&plan(&d, &Actual::default(), "c1")),
        [
            "create 80 None",
            "create 443 Some(\"HTTP2Preferred\")",
            "record HTTP2Preferred"
        ]
    );
    // A live NLB (the Go CCM's): modified in place, then recorded.
    assert_eq!(
        alpn_writes(&plan(&d, &live, "c1")),
        [
            "modify 443 Some(\"HTTP2Preferred\")",
            "record HTTP2Preferred"
        ]
    );
    // Applied and recorded: steady.
    with_alpn(&mut live, Some("HTTP2Preferred"), Some("HTTP2Preferred"));
    assert!(plan(&d, &live, "c1").is_empty());
    assert!(!alpn_record_stale(&d, &live.lb.as_ref().unwrap().tags));
    // Changed: modified, the record kept up to date.
    let changed = tls_want(&[(ann::ALPN_POLICY, "HTTP1Only")], &on, &e);
    assert!(alpn_record_stale(&changed, &live.lb.as_ref().unwrap().tags));
    assert_eq!(
        alpn_writes(&plan(&changed, &live, "c1")),
        ["modify 443 Some(\"HTTP1Only\")", "record HTTP1Only"]
    );
    // Removed: back to AWS's None, then the record goes.
    let none = tls_want(&[], &on, &e);
    assert_eq!(
        alpn_writes(&plan(&none, &live, "c1")),
        ["modify 443 Some(\"None\")", "unrecord"]
    );
    // Key off again: nothing is touched.
    assert!(plan(&tls_want(&[], &off, &e), &live, "c1").is_empty());
}

#[test]
fn alpn_policy_nobody_recorded_or_refused_is_left_alone() {
    let e = env(&["subnet-a"], &["i-1"]);
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    // Set by hand, no record: the annotation's absence leaves it.
    let none = tls_want(&[], &on, &e);
    let mut live = converged(&none);
    with_alpn(&mut live, Some("HTTP2Only"), None);
    assert!(plan(&none, &live, "c1").is_empty());
    assert!(!alpn_record_stale(&none, &live.lb.as_ref().unwrap().tags));
    // A name AWS does not take: not sent, the hand-set policy left.
    let bad = tls_want(&[(ann::ALPN_POLICY, "h2")], &on, &e);
    assert_eq!(bad.alpn, None);
    assert!(plan(&bad, &live, "c1").is_empty());
    // No TLS listener to take it: not sent at creation either.
    let tcp = want_with(&[(ann::ALPN_POLICY, "HTTP2Preferred")], &on, &e);
    assert_eq!(tcp.alpn, None);
    assert_eq!(
        alpn_writes(&plan(&tcp, &Actual::default(), "c1")),
        ["create 80 None"]
    );
}

#[test]
fn the_settings_digest_changes_only_for_an_nlb_that_sets_an_alpn_policy() {
    use crate::aws::load_balancers::sweep::nlb_settings;
    let e = env(&["subnet-a"], &["i-1"]);
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let off = CloudConfig::default();
    let ann = [(ann::ALPN_POLICY, "HTTP2Preferred")];
    assert_eq!(
        nlb_settings(&tls_want(&[], &on, &e)),
        nlb_settings(&tls_want(&ann, &off, &e))
    );
    assert_ne!(
        nlb_settings(&tls_want(&ann, &on, &e)),
        nlb_settings(&tls_want(&ann, &off, &e))
    );
}

/// `NLBNodeIngress = SharedBackendGroup` on a Managed-mode NLB: the NLB
/// takes the shared group after its own (one SetSecurityGroups), a new one
/// is made with both; leaving keeps it until the node rules are back; an
/// NLB without groups is never given one; from the Go CCM's state with the
/// mode off nothing changes.
#[test]
fn the_shared_backend_group_joins_an_nlbs_groups_and_leaves_them() {
    use super::shared_group::{SharedUse, shared_use, with_shared};
    let managed = CloudConfig {
        nlb_security_group_mode: NlbSecurityGroupMode::Managed,
        ..CloudConfig::default()
    };
    let e = env(&["subnet-a"], &["i-1"]);
    let d = desired(
        &spec(&[], &[(80, 30080)]),
        "default/web",
        UID,
        "c1",
        &managed,
        &e,
    )
    .unwrap();
    let go_state = converged(&d);
    // Mode off, no shared group: the Go CCM's Managed-mode NLB is left as it is.
    let lb_groups = go_state.lb.as_ref().map(|l| l.security_groups.clone());
    let off = shared_use(false, true, None, lb_groups.as_deref());
    assert_eq!(off, SharedUse::None);
    let same = Desired {
        security_groups: with_shared(&d.security_groups, &off),
        ..d.clone()
    };
    assert_eq!(plan(&same, &go_state, "c1"), vec![]);

    // Mode on: one SetSecurityGroups, the NLB's own group first.
    let on = shared_use(true, true, Some("sg-shared"), lb_groups.as_deref());
    let with = Desired {
        security_groups: with_shared(&d.security_groups, &on),
        ..d.clone()
    };
    let shared_ref = GroupRef::Id("sg-shared".into());
    assert_eq!(
        plan(&with, &go_state, "c1"),
        vec![Change::SetSecurityGroups(vec![
            GroupRef::Owned,
            shared_ref.clone()
        ])]
    );
    // A new NLB is created with both.
    let fresh = plan(&with, &Actual::default(), "c1");
    assert!(fresh.iter().any(|c| matches!(c, Change::CreateLoadBalancer { security_groups, .. } if security_groups == &vec![GroupRef::Owned, shared_ref.clone()])));
    // Applied: nothing more to do.
    let mut carrying = go_state.clone();
    if let Some(lb) = carrying.lb.as_mut() {
        lb.security_groups.push("sg-shared".into());
    }
    assert_eq!(plan(&with, &carrying, "c1"), vec![]);

    // Leaving: the plan keeps the group (the detach follows the node rules).
    let carried = carrying.lb.as_ref().map(|l| l.security_groups.clone());
    let leaving = shared_use(false, true, Some("sg-shared"), carried.as_deref());
    assert_eq!(leaving, SharedUse::Leaving("sg-shared".into()));
    let kept = Desired {
        security_groups: with_shared(&d.security_groups, &leaving),
        ..d.clone()
    };
    assert_eq!(plan(&kept, &carrying, "c1"), vec![]);

    // An NLB made without groups (Managed mode off when it was made) gets none.
    assert_eq!(
        shared_use(true, false, Some("sg-shared"), Some(&[])),
        SharedUse::None
    );
}

/// The shared group's rule in a node group backing several NLBs: the first
/// NLB moves the node group onto it (added before the CIDR rules go), the
/// others only drop their CIDR rules, and none revokes it while another
/// NLB carries it; the last NLB to leave the mode puts its CIDR rules back
/// before the shared rule goes.
#[test]
fn one_shared_rule_serves_every_nlb_of_a_node_group() {
    let subnets = [cidr("10.1.0.0/24")];
    let ranges = [cidr("10.0.0.0/8")];
    let none = BTreeSet::new();
    let nlbs: Vec<(Desired, NodeRules)> = (0..3)
        .map(|i| {
            let uid = format!("{i:08x}-1234-4f6e-9a7b-abcdefabcdef");
            let e = env(&["subnet-a"], &["i-1"]);
            let d = desired(
                &spec(&[], &[(80, 30000 + i)]),
                "default/web",
                &uid,
                "c1",
                &CloudConfig::default(),
                &e,
            )
            .unwrap();
            let r = node_rules(&d, &ranges, &subnets);
            (d, r)
        })
        .collect();
    // The Go CCM's state: every NLB's CIDR rules.
    let mut have: DescribedRules = BTreeMap::new();
    for (d, r) in &nlbs {
        have.extend(node_group_changes(&d.name, &have, Some(r), &none).authorize);
    }
    let go_state = have.clone();
    let shared_rule = Rule::all_from_group("sg-shared");
    let apply = |have: &mut DescribedRules, ch: &RuleChanges| {
        have.extend(ch.authorize.clone());
        for r in &ch.revoke {
            have.remove(r);
        }
    };
    for (i, (d, r)) in nlbs.iter().enumerate() {
        let shared = NodeRules {
            from_group: Some("sg-shared".into()),
            ..r.clone()
        };
        // Other NLBs carry the shared group: never revocable here.
        let ch = node_group_changes(&d.name, &have, Some(&shared), &none);
        assert_eq!(ch.authorize.contains_key(&shared_rule), i == 0, "{ch:?}");
        assert!(ch.adds_first() || ch.authorize.is_empty());
        apply(&mut have, &ch);
        assert!(have.contains_key(&shared_rule));
    }
    assert_eq!(have.len(), 1, "one rule for three NLBs: {have:?}");
    // Leaving, NLB by NLB: CIDR rules back; the shared rule stays while
    // another NLB carries the group, and goes (after the adds) with the last.
    let revocable = BTreeSet::from(["sg-shared".to_string()]);
    for (i, (d, r)) in nlbs.iter().enumerate() {
        let last = i == nlbs.len() - 1;
        let carried_elsewhere = if last { &revocable } else { &none };
        let ch = node_group_changes(&d.name, &have, Some(r), carried_elsewhere);
        assert_eq!(ch.revoke.contains(&shared_rule), last, "{ch:?}");
        assert!(!ch.authorize.is_empty());
        if last {
            assert!(ch.adds_first());
        }
        apply(&mut have, &ch);
    }
    assert_eq!(have, go_state);
}

const ATTRIBUTES_RECORD: &str = crate::aws::tags::LISTENER_ATTRIBUTES_TAG;

/// The listener attributes a plan sends (by listener port, and whether to
/// a listener it knows) and its record writes.
fn listener_attribute_writes(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .filter_map(|c| match c {
            Change::ModifyListenerAttributes {
                arn,
                port,
                attributes,
            } => {
                let to = if arn.is_some() { "live" } else { "new" };
                let pairs: Vec<String> =
                    attributes.iter().map(|(k, v)| format!("{k}={v}")).collect();
                Some(format!("set {to} {port} {}", pairs.join(",")))
            }
            Change::AddTags { arn: None, tags } => {
                tags.get(ATTRIBUTES_RECORD).map(|r| format!("record {r}"))
            }
            Change::RemoveTags { arn: None, keys } => keys
                .contains(ATTRIBUTES_RECORD)
                .then(|| "unrecord".to_string()),
            _ => None,
        })
        .collect()
}

fn with_attributes_record(live: &mut Actual, record: Option<&str>) {
    let lb = live.lb.as_mut().unwrap();
    let mut t = (*lb.tags).clone();
    match record {
        Some(r) => t.insert(ATTRIBUTES_RECORD.into(), r.into()),
        None => t.remove(ATTRIBUTES_RECORD),
    };
    lb.tags = Tags::new(t);
}

fn tcp_80_attributes(value: &str) -> (String, String) {
    (
        format!("{}TCP-80", ann::LISTENER_ATTRIBUTES_PREFIX),
        value.to_string(),
    )
}

fn attributes_want(pairs: &[(String, String)], cloud: &CloudConfig, e: &Environment) -> Desired {
    let a: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    tls_want(&a, cloud, e)
}

#[test]
fn listener_attributes_are_sent_to_tcp_listeners_only_with_the_cloud_conf_key() {
    let e = env(&["subnet-a"], &["i-1"]);
    let off = CloudConfig::default();
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let ann = [tcp_80_attributes("tcp.idle_timeout.seconds=400")];
    // Key off (the Go CCM's reading): neither at creation nor on a live NLB.
    let go = attributes_want(&ann, &off, &e);
    assert_eq!(go.listener_attributes, None);
    assert!(listener_attribute_writes(&plan(&go, &Actual::default(), "c1")).is_empty());
    let mut live = converged(&go);
    assert!(plan(&go, &live, "c1").is_empty());
    // Key on: a new TCP listener gets them after its create, then the record.
    let d = attributes_want(&ann, &on, &e);
    let fresh = plan(&d, &Actual::default(), "c1");
    assert_eq!(
        listener_attribute_writes(&fresh),
        [
            "set new 80 tcp.idle_timeout.seconds=400",
            "record 80:tcp.idle_timeout.seconds=400"
        ]
    );
    let at = |p: fn(&Change) -> bool| fresh.iter().position(p).unwrap();
    assert!(
        at(|c| matches!(c, Change::CreateListener { listener, .. } if listener.port == 80))
            < at(|c| matches!(c, Change::ModifyListenerAttributes { .. }))
    );
    // A live NLB (the Go CCM's): the listener it has, then the record.
    assert!(listener_attributes_stale(
        &d,
        &live.lb.as_ref().unwrap().tags
    ));
    assert_eq!(
        listener_attribute_writes(&plan(&d, &live, "c1")),
        [
            "set live 80 tcp.idle_timeout.seconds=400",
            "record 80:tcp.idle_timeout.seconds=400"
        ]
    );
    // Applied and recorded: steady, and the listeners need no read.
    with_attributes_record(&mut live, Some("80:tcp.idle_timeout.seconds=400"));
    assert!(plan(&d, &live, "c1").is_empty());
    assert!(!listener_attributes_stale(
        &d,
        &live.lb.as_ref().unwrap().tags
    ));
    // Changed: set again, the record kept up to date.
    let changed = attributes_want(
        &[tcp_80_attributes("tcp.idle_timeout.seconds=600")],
        &on,
        &e,
    );
    assert_eq!(
        listener_attribute_writes(&plan(&changed, &live, "c1")),
        [
            "set live 80 tcp.idle_timeout.seconds=600",
            "record 80:tcp.idle_timeout.seconds=600"
        ]
    );
    // Removed: back to AWS's 350 s, then the record goes.
    let none = attributes_want(&[], &on, &e);
    assert_eq!(
        listener_attribute_writes(&plan(&none, &live, "c1")),
        ["set live 80 tcp.idle_timeout.seconds=350", "unrecord"]
    );
    // Key off again: nothing is touched.
    assert!(plan(&attributes_want(&[], &off, &e), &live, "c1").is_empty());
}

#[test]
fn listener_attributes_nobody_recorded_or_refused_are_left_alone() {
    let e = env(&["subnet-a"], &["i-1"]);
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    // Set by hand, no record: the annotation's absence leaves it.
    let none = attributes_want(&[], &on, &e);
    let mut live = converged(&none);
    assert!(plan(&none, &live, "c1").is_empty());
    // Applied and recorded, then a value AWS does not take: the listener
    // and its record are left as they are.
    with_attributes_record(&mut live, Some("80:tcp.idle_timeout.seconds=400"));
    for bad in ["tcp.idle_timeout.seconds=30", "idle=400"] {
        let d = attributes_want(&[tcp_80_attributes(bad)], &on, &e);
        assert_eq!(
            d.listener_attributes.as_ref().unwrap().held,
            BTreeSet::from([80])
        );
        assert!(plan(&d, &live, "c1").is_empty(), "{bad}");
        assert!(!listener_attributes_stale(
            &d,
            &live.lb.as_ref().unwrap().tags
        ));
    }
    // The TLS listener, or a port the Service lacks: never sent.
    for key in ["TLS-443", "TCP-81"] {
        let pair = (
            format!("{}{key}", ann::LISTENER_ATTRIBUTES_PREFIX),
            "tcp.idle_timeout.seconds=400".to_string(),
        );
        let d = attributes_want(&[pair], &on, &e);
        assert!(
            listener_attribute_writes(&plan(&d, &Actual::default(), "c1")).is_empty(),
            "{key}"
        );
    }
    // A record that does not read proves nothing: nothing is reset.
    with_attributes_record(&mut live, Some("garbage 80-tcp 80:idle=400"));
    assert_eq!(
        listener_attribute_writes(&plan(&none, &live, "c1")),
        ["unrecord"]
    );
}

#[test]
fn the_listener_attributes_record_reads_back_what_it_wrote() {
    let applied = BTreeMap::from([
        (
            80,
            BTreeMap::from([(LISTENER_IDLE_TIMEOUT.to_string(), "400".to_string())]),
        ),
        (
            8080,
            BTreeMap::from([(LISTENER_IDLE_TIMEOUT.to_string(), "60".to_string())]),
        ),
    ]);
    let record = listener_attributes_record(&applied);
    assert_eq!(
        record,
        "80:tcp.idle_timeout.seconds=400 8080:tcp.idle_timeout.seconds=60"
    );
    let tags = BTreeMap::from([(ATTRIBUTES_RECORD.to_string(), record)]);
    assert_eq!(super::plan::listener_attributes_recorded(&tags), applied);
}

#[test]
fn the_settings_digest_changes_only_for_an_nlb_that_sets_listener_attributes() {
    use crate::aws::load_balancers::sweep::nlb_settings;
    let e = env(&["subnet-a"], &["i-1"]);
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let off = CloudConfig::default();
    let ann = [tcp_80_attributes("tcp.idle_timeout.seconds=400")];
    assert_eq!(
        nlb_settings(&attributes_want(&[], &on, &e)),
        nlb_settings(&attributes_want(&ann, &off, &e))
    );
    assert_ne!(
        nlb_settings(&attributes_want(&ann, &on, &e)),
        nlb_settings(&attributes_want(&ann, &off, &e))
    );
}
