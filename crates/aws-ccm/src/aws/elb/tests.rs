use super::plan::*;
use super::*;
use crate::aws::annotations::LoadBalancerSpec;
use crate::aws::annotations::{self as ann, tests::service};
use crate::aws::tags::Tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode};

fn spec(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> LoadBalancerSpec {
    LoadBalancerSpec::from_service(&service(annotations, ports)).unwrap()
}

fn env() -> Environment {
    Environment {
        subnets: vec!["subnet-a".to_string(), "subnet-b".to_string()],
        instances: BTreeSet::from(["i-1".to_string(), "i-2".to_string()]),
        node_groups: BTreeSet::from(["sg-node".to_string()]),
        cluster_name: "kubernetes".to_string(),
        legacy_cluster_tag: false,
    }
}

fn want(annotations: &[(&str, &str)], ports: &[(i32, i32)], env: &Environment) -> Desired {
    desired(
        &spec(annotations, ports),
        "default/web",
        "0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef",
        "c1",
        &CloudConfig::default(),
        env,
    )
}

/// AWS exactly as `d` asks, made by this CCM (with the record).
fn converged(d: &Desired) -> Actual {
    let owned = d.owned_group.as_ref().map(|g| sg::SecurityGroup {
        id: "sg-owned".into(),
        name: g.name.clone(),
        vpc_id: Some("vpc-1".into()),
        tags: g.tags.clone(),
        ingress: g.rules.clone(),
        descriptions: BTreeMap::new(),
        owner_id: None,
    });
    let ports: BTreeSet<i32> = d.listeners.iter().map(|l| l.instance_port).collect();
    let mut policies = BTreeSet::new();
    if d.proxy_protocol {
        policies.insert(PROXY_PROTOCOL_POLICY.to_string());
    }
    let ssl = d.ssl_negotiation_policy.as_deref().map(ssl_policy_name);
    policies.extend(ssl.clone());
    Actual {
        lb: Some(ActualLb {
            name: d.name.clone(),
            dns_name: "x.elb.amazonaws.com".into(),
            internal: d.internal,
            listeners: d
                .listeners
                .iter()
                .map(|l| {
                    (
                        l.clone(),
                        if l.is_tls() {
                            ssl.clone().into_iter().collect()
                        } else {
                            vec![]
                        },
                    )
                })
                .collect(),
            backend_policies: if d.proxy_protocol {
                ports
                    .iter()
                    .map(|p| (*p, vec![PROXY_PROTOCOL_POLICY.to_string()]))
                    .collect()
            } else {
                BTreeMap::new()
            },
            policies,
            health_check: Some(d.health_check.clone()),
            subnets: d.subnets.clone(),
            security_groups: d
                .groups
                .iter()
                .map(|g| g.planned_id(Some("sg-owned")))
                .collect(),
            instances: d.instances.clone(),
            attributes: Attributes {
                access_log_interval: Some(60),
                ..d.attributes.clone()
            },
            tags: Tags::new(d.applied.tagged(&d.tags)),
        }),
        owned_group: owned,
        node_groups_with_rule: d.node_groups.clone().unwrap_or_default(),
        shared_group_needed: None,
        shared_lb_group: None,
        owned_group_node_rules: BTreeSet::new(),
    }
}

#[test]
fn name_is_upstreams() {
    assert_eq!(
        load_balancer_name("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef"),
        "a0b9c8e4a12344f6e9a7babcdefabcde"
    );
    assert_eq!(
        load_balancer_name("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef").len(),
        32
    );
}

#[test]
fn a_new_service_creates_group_lb_and_wiring() {
    let d = want(&[], &[(80, 30080)], &env());
    let changes = plan(&d, &Actual::default());
    let kinds: Vec<String> = changes.iter().map(describe).collect();
    assert!(
        matches!(changes[0], Change::CreateSecurityGroup(ref g) if g.name == "k8s-elb-a0b9c8e4a12344f6e9a7babcdefabcde"),
        "{kinds:?}"
    );
    assert!(matches!(changes[1], Change::AuthorizeIngress(ref rules) if rules.len() == 2));
    assert!(matches!(
        changes[2],
        Change::CreateLoadBalancer {
            internal: false,
            ..
        }
    ));
    assert!(changes.contains(&Change::ConfigureHealthCheck(HealthCheck {
        target: "TCP:30080".into(),
        healthy_threshold: 2,
        unhealthy_threshold: 6,
        interval: 10,
        timeout: 5
    })));
    assert!(changes.contains(&Change::AuthorizeNodeIngress {
        node_group: "sg-node".into(),
        from: GroupRef::Owned
    }));
    assert!(changes.contains(&Change::RegisterInstances(env().instances)));
    // Defaults need no attribute call.
    assert!(
        !changes
            .iter()
            .any(|c| matches!(c, Change::ModifyAttributes(_))),
        "{kinds:?}"
    );
}

#[test]
fn an_unchanged_service_plans_nothing() {
    for a in [
        vec![],
        vec![(ann::PROXY_PROTOCOL, "*"), (ann::CROSS_ZONE, "true")],
        vec![
            (ann::SSL_CERT, "arn:cert"),
            (ann::SSL_NEGOTIATION_POLICY, "ELBSecurityPolicy-2016-08"),
        ],
        vec![
            (ann::SECURITY_GROUPS, "sg-x"),
            (ann::EXTRA_SECURITY_GROUPS, "sg-y"),
        ],
    ] {
        let d = want(&a, &[(80, 30080), (443, 30443)], &env());
        assert_eq!(plan(&d, &converged(&d)), vec![], "{a:?}");
    }
}

#[test]
fn updates_are_minimal() {
    let before = want(&[], &[(80, 30080)], &env());
    let actual = converged(&before);

    // A new port: one listener, its rule, nothing else.
    let after = want(&[], &[(80, 30080), (8080, 30081)], &env());
    let changes = plan(&after, &actual);
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(
        matches!(&changes[0], Change::AuthorizeIngress(rules) if rules.len() == 1 && rules.iter().all(|r| r.from == 8080))
    );
    assert!(
        matches!(&changes[1], Change::CreateListeners(l) if l.len() == 1 && l[0].lb_port == 8080)
    );

    // A node leaves and another comes: register/deregister the delta only.
    let mut e = env();
    e.instances = BTreeSet::from(["i-2".to_string(), "i-3".to_string()]);
    let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
    assert_eq!(
        changes,
        vec![
            Change::RegisterInstances(BTreeSet::from(["i-3".to_string()])),
            Change::DeregisterInstances(BTreeSet::from(["i-1".to_string()])),
        ]
    );

    // Source ranges: swap the rules, nothing else.
    let changes = plan(
        &want(
            &[(ann::SOURCE_RANGES, "10.0.0.0/8")],
            &[(80, 30080)],
            &env(),
        ),
        &actual,
    );
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert!(matches!(changes[0], Change::AuthorizeIngress { .. }));
    assert!(matches!(changes[1], Change::RevokeIngress { .. }));

    // Node groups no longer used lose the rule; shared groups keep theirs.
    let mut e = env();
    e.node_groups = BTreeSet::from(["sg-node2".to_string()]);
    let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
    assert_eq!(
        changes,
        vec![
            Change::AuthorizeNodeIngress {
                node_group: "sg-node2".into(),
                from: GroupRef::Owned
            },
            Change::RevokeNodeIngress {
                node_group: "sg-node".into(),
                from: GroupRef::Owned
            },
        ]
    );
}

#[test]
fn a_shared_groups_node_rule_goes_only_when_no_other_load_balancer_needs_it() {
    let mut e = env();
    e.node_groups = BTreeSet::from(["sg-node".to_string(), "sg-node2".to_string()]);
    let shared = [(ann::SECURITY_GROUPS, "sg-shared")];
    let mut actual = converged(&want(&shared, &[(80, 30080)], &e));
    // sg-node2's nodes left this load balancer.
    let after = want(&shared, &[(80, 30080)], &env());
    let revoke_node2 = Change::RevokeNodeIngress {
        node_group: "sg-node2".into(),
        from: GroupRef::Id("sg-shared".into()),
    };
    // Not looked up: the rule stays.
    assert_eq!(plan(&after, &actual), vec![]);
    // Another load balancer with sg-shared still reaches sg-node2.
    actual.shared_group_needed = Some(BTreeSet::from(["sg-node2".to_string()]));
    assert_eq!(plan(&after, &actual), vec![]);
    // Nobody else does: revoked.
    actual.shared_group_needed = Some(BTreeSet::new());
    assert_eq!(plan(&after, &actual), vec![revoke_node2.clone()]);

    // Deleting: the same rule, from the shared group, never the group itself.
    actual.owned_group = None;
    actual.shared_lb_group = Some("sg-shared".into());
    actual.shared_group_needed = Some(BTreeSet::from(["sg-node".to_string()]));
    assert_eq!(
        plan_delete(&actual, "c1", "default/web"),
        vec![
            revoke_node2,
            Change::DeleteLoadBalancer {
                reason: "the Service no longer asks for it".into()
            },
        ]
    );
}

#[test]
fn configured_groups_replace_the_owned_group() {
    let mut actual = converged(&want(&[], &[(80, 30080)], &env()));
    actual.owned_group_node_rules = BTreeSet::from(["sg-node".to_string()]);
    // The rule the node group has is from the owned group, not sg-mine.
    actual.node_groups_with_rule.clear();
    let after = want(&[(ann::SECURITY_GROUPS, "sg-mine")], &[(80, 30080)], &env());
    assert_eq!(
        plan(&after, &actual),
        vec![
            Change::ApplySecurityGroups(vec![GroupRef::Id("sg-mine".into())]),
            Change::AuthorizeNodeIngress {
                node_group: "sg-node".into(),
                from: GroupRef::Id("sg-mine".into())
            },
            Change::RevokeNodeIngress {
                node_group: "sg-node".into(),
                from: GroupRef::Owned
            },
            Change::DeleteSecurityGroup("sg-owned".into()),
        ]
    );
    // Not this cluster's: left alone.
    actual.owned_group.as_mut().unwrap().tags.clear();
    assert!(
        !plan(&after, &actual)
            .iter()
            .any(|c| matches!(c, Change::DeleteSecurityGroup(_)))
    );
}

#[test]
fn scheme_change_recreates_and_subnets_change_in_place() {
    let before = want(&[], &[(80, 30080)], &env());
    let actual = converged(&before);
    let changes = plan(
        &want(&[(ann::INTERNAL, "true")], &[(80, 30080)], &env()),
        &actual,
    );
    assert!(
        matches!(changes[0], Change::DeleteLoadBalancer { .. }),
        "{changes:?}"
    );
    assert!(matches!(
        changes[1],
        Change::CreateLoadBalancer { internal: true, .. }
    ));
    // The new load balancer is created with the existing owned group:
    // nothing to re-apply, no group to create.
    assert!(
        !changes.iter().any(|c| matches!(
            c,
            Change::ApplySecurityGroups(_) | Change::CreateSecurityGroup(_)
        )),
        "{changes:?}"
    );

    let mut e = env();
    e.subnets = vec!["subnet-a".to_string(), "subnet-c".to_string()];
    let changes = plan(&want(&[], &[(80, 30080)], &e), &actual);
    assert_eq!(
        changes,
        vec![
            Change::DetachSubnets(BTreeSet::from(["subnet-b".to_string()])),
            Change::AttachSubnets(BTreeSet::from(["subnet-c".to_string()])),
        ]
    );
}

#[test]
fn listeners_follow_ssl_and_backend_annotations() {
    let l = listeners(&spec(
        &[(ann::SSL_CERT, "arn:c"), (ann::SSL_PORTS, "443")],
        &[(80, 30080), (443, 30443)],
    ));
    assert_eq!(
        (l[0].protocol.as_str(), l[0].instance_protocol.as_str()),
        ("TCP", "TCP")
    );
    assert_eq!(
        (l[1].protocol.as_str(), l[1].instance_protocol.as_str()),
        ("SSL", "TCP")
    );
    assert_eq!(l[1].ssl_cert.as_deref(), Some("arn:c"));
    let l = listeners(&spec(
        &[(ann::SSL_CERT, "arn:c"), (ann::BACKEND_PROTOCOL, "http")],
        &[(443, 30443)],
    ));
    assert_eq!(
        (l[0].protocol.as_str(), l[0].instance_protocol.as_str()),
        ("HTTPS", "HTTP")
    );
    let l = listeners(&spec(&[(ann::BACKEND_PROTOCOL, "http")], &[(80, 30080)]));
    assert_eq!(
        (l[0].protocol.as_str(), l[0].ssl_cert.as_ref()),
        ("HTTP", None)
    );
}

#[test]
fn health_check_modes() {
    let cloud = CloudConfig::default();
    let mut svc = service(&[], &[(80, 30080)]);
    let s = svc.spec.as_mut().unwrap();
    s.external_traffic_policy = Some("Local".into());
    s.health_check_node_port = Some(32000);
    let local = LoadBalancerSpec::from_service(&svc).unwrap();
    assert_eq!(health_check(&local, &cloud).target, "HTTP:32000/healthz");

    let shared = CloudConfig {
        health_probe_mode: HealthProbeMode::Shared,
        ..CloudConfig::default()
    };
    assert_eq!(
        health_check(&spec(&[], &[(80, 30080)]), &shared).target,
        "HTTP:10256/healthz"
    );

    let hc = health_check(
        &spec(
            &[
                (ann::HC_PROTOCOL, "http"),
                (ann::HC_PATH, "/ready"),
                (ann::HC_INTERVAL, "30"),
                (ann::HC_PORT, "8080"),
            ],
            &[(80, 30080)],
        ),
        &cloud,
    );
    assert_eq!((hc.target.as_str(), hc.interval), ("HTTP:8080/ready", 30));
    assert_eq!(
        health_check(
            &spec(&[(ann::BACKEND_PROTOCOL, "ssl")], &[(80, 30080)]),
            &cloud
        )
        .target,
        "SSL:30080"
    );
}

#[test]
fn cloud_conf_group_and_disabled_ingress() {
    let cloud = CloudConfig {
        elb_security_group: Some("sg-global".into()),
        disable_security_group_ingress: true,
        ..CloudConfig::default()
    };
    let d = desired(
        &spec(&[], &[(80, 30080)]),
        "default/web",
        "u",
        "c1",
        &cloud,
        &env(),
    );
    assert_eq!(d.groups, vec![GroupRef::Id("sg-global".into())]);
    assert!(d.owned_group.is_none() && d.node_groups.is_none());
    let changes = plan(&d, &Actual::default());
    assert!(!changes.iter().any(|c| matches!(
        c,
        Change::CreateSecurityGroup(_) | Change::AuthorizeNodeIngress { .. }
    )));
}

#[test]
fn a_scheme_the_service_did_not_ask_to_change_is_left_with_a_note() {
    let before = want(&[], &[(80, 30080)], &env());
    let internal = want(&[(ann::INTERNAL, "true")], &[(80, 30080)], &env());
    // Made by the Go CCM (no record): internal was read only at creation.
    let mut go_made = converged(&before);
    Tags::make_mut(&mut go_made.lb.as_mut().unwrap().tags).remove(crate::aws::tags::APPLIED_TAG);
    assert_eq!(plan(&internal, &go_made), vec![]);
    let notes = left_alone(&internal, &go_made);
    assert_eq!(
        notes,
        vec!["its scheme is internet-facing and the Service asks for internal".to_string()]
    );
    // The record says internal was applied, yet the LB is internet-facing
    // (recreated outside Kubernetes): the Service asked for nothing new.
    let mut drifted = converged(&before);
    drifted.lb.as_mut().unwrap().tags = Tags::new(internal.applied.tagged(&internal.tags));
    assert_eq!(plan(&internal, &drifted), vec![]);
    assert_eq!(left_alone(&internal, &drifted).len(), 1);
    // Asked for, on its own load balancer: recreated, no note.
    assert!(left_alone(&internal, &converged(&before)).is_empty());
    // Back to what the load balancer has: the record follows.
    let changes = plan(&before, &drifted);
    assert_eq!(
        changes,
        vec![Change::AddTags(BTreeMap::from([(
            crate::aws::tags::APPLIED_TAG.to_string(),
            before.applied.to_value()
        )]))]
    );
    // A create carries the record.
    let fresh = plan(&before, &Actual::default());
    assert!(fresh.iter().any(|c| matches!(c, Change::CreateLoadBalancer { tags, .. }
        if tags.get(crate::aws::tags::APPLIED_TAG) == Some(&"v1 type=clb scheme=internet-facing".to_string()))));
}

#[test]
fn deletion_touches_only_what_this_cluster_owns() {
    let d = want(&[], &[(80, 30080)], &env());
    let actual = converged(&d);
    let changes = plan_delete(&actual, "c1", "default/web");
    assert_eq!(
        changes,
        vec![
            Change::RevokeNodeIngress {
                node_group: "sg-node".into(),
                from: GroupRef::Owned
            },
            Change::DeleteLoadBalancer {
                reason: "the Service no longer asks for it".into()
            },
            Change::DeleteSecurityGroup("sg-owned".into()),
        ]
    );
    assert!(plan_delete(&actual, "other-cluster", "default/web").is_empty());
}

#[test]
fn keeping_a_protected_classic_elb_removes_only_what_reaches_into_the_cluster() {
    let protected = [(ann::LB_ATTRIBUTES, "deletion_protection.enabled=true")];
    let d = want(&protected, &[(80, 30080)], &env());
    let actual = converged(&d);
    let changes = plan_keep(&actual, "c1", "default/web").expect("proven");
    assert_eq!(
        changes,
        vec![
            Change::RevokeNodeIngress {
                node_group: "sg-node".into(),
                from: GroupRef::Owned
            },
            Change::DeregisterInstances(actual.lb.as_ref().unwrap().instances.clone()),
            Change::AddTags(BTreeMap::from([(
                crate::aws::tags::KEPT_TAG.to_string(),
                "default/web".to_string()
            )])),
        ]
    );
    assert!(!actual.lb.as_ref().unwrap().instances.is_empty());
    assert_eq!(plan_keep(&actual, "other-cluster", "default/web"), None);
    assert_eq!(plan_keep(&actual, "c1", "default/other"), None);
}
