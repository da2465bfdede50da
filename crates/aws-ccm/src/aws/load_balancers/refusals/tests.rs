use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::aws::nlb::{ActualLb, ActualListener, Change, Listener};
use crate::aws::permissions::{DEFAULT_TTL, Permissions};
use crate::provider::load_balancers::merged;

const CLUSTER: &str = "demo";

fn listener(arn: &str, port: i32, tg: &str) -> ActualListener {
    ActualListener {
        arn: arn.into(),
        port,
        protocol: "TCP".into(),
        certificate: None,
        ssl_policy: None,
        target_group_arn: Some(tg.into()),
        alpn: None,
        tags: None,
    }
}

fn actual(listeners: Vec<ActualListener>) -> nlb::Actual {
    nlb::Actual {
        lb: Some(ActualLb {
            arn: "arn:lb".into(),
            dns_name: "lb.example".into(),
            internal: false,
            ip_address_type: "ipv4".into(),
            subnet_mappings: BTreeSet::new(),
            addresses_reported: false,
            security_groups: vec![],
            tags: Default::default(),
            attributes: BTreeMap::new(),
            listeners,
        }),
        ..Default::default()
    }
}

fn want(port: i32) -> Listener {
    Listener {
        port,
        protocol: "TCP".into(),
        certificate: None,
        ssl_policy: None,
        target_group: format!("tg-{port}"),
    }
}

fn owned() -> BTreeMap<String, String> {
    BTreeMap::from([(
        "kubernetes.io/cluster/demo".to_string(),
        "owned".to_string(),
    )])
}

#[test]
fn untagged_listeners_are_not_modified_or_deleted_and_keep_their_target_group() {
    let actual = actual(vec![
        listener("arn:old-80", 80, "arn:tg-old"),
        listener("arn:ours-443", 443, "arn:tg-443"),
        listener("arn:old-8080", 8080, "arn:tg-8080"),
    ]);
    let changes = vec![
        Change::DeleteListener {
            arn: "arn:old-80".into(),
        },
        Change::ModifyListener {
            arn: "arn:ours-443".into(),
            listener: want(443),
            alpn: None,
        },
        Change::ModifyListener {
            arn: "arn:old-8080".into(),
            listener: want(8080),
            alpn: None,
        },
        Change::DeleteTargetGroup {
            arn: "arn:tg-old".into(),
            name: "old".into(),
        },
        Change::DeleteTargetGroup {
            arn: "arn:tg-gone".into(),
            name: "gone".into(),
        },
    ];
    // A listener tagged `shared` is not what the policy grants either.
    let tags = BTreeMap::from([
        ("arn:ours-443".to_string(), owned()),
        (
            "arn:old-8080".to_string(),
            BTreeMap::from([(
                "kubernetes.io/cluster/demo".to_string(),
                "shared".to_string(),
            )]),
        ),
    ]);
    let (kept, refused) = refuse_listener_writes(changes, &actual, &tags, CLUSTER, |_| false);
    assert_eq!(
        refused,
        vec!["arn:old-80".to_string(), "arn:old-8080".into()]
    );
    assert_eq!(
        kept,
        vec![
            Change::ModifyListener {
                arn: "arn:ours-443".into(),
                listener: want(443),
                alpn: None,
            },
            Change::DeleteTargetGroup {
                arn: "arn:tg-gone".into(),
                name: "gone".into(),
            },
        ]
    );
}

fn new_group(name: &str) -> nlb::TargetGroup {
    nlb::TargetGroup {
        name: name.into(),
        protocol: "TCP".into(),
        port: 30080,
        health: nlb::HealthCheck {
            protocol: "TCP".into(),
            port: "traffic-port".into(),
            path: None,
            interval: 10,
            healthy: 3,
            unhealthy: 3,
            timeout: None,
        },
    }
}

#[test]
fn a_target_group_only_a_refused_listener_would_use_is_not_made() {
    let actual = actual(vec![listener("arn:old-80", 80, "arn:tg-old")]);
    let register = |name: &str| Change::RegisterTargets {
        target_group: nlb::TgRef::Name(name.into()),
        port: 30080,
        instances: BTreeSet::from(["i-1".to_string()]),
    };
    let create = |name: &str| Change::CreateTargetGroup {
        group: new_group(name),
        tags: BTreeMap::new(),
    };
    let changes = vec![
        create("tg-80"),
        register("tg-80"),
        create("tg-81"),
        register("tg-81"),
        Change::ModifyListener {
            arn: "arn:old-80".into(),
            listener: want(80),
            alpn: None,
        },
        Change::CreateListener {
            listener: want(81),
            tags: owned(),
            alpn: None,
        },
    ];
    let (kept, refused) =
        refuse_listener_writes(changes, &actual, &BTreeMap::new(), CLUSTER, |_| false);
    assert_eq!(refused, vec!["arn:old-80".to_string()]);
    assert_eq!(
        kept,
        vec![
            create("tg-81"),
            register("tg-81"),
            Change::CreateListener {
                listener: want(81),
                tags: owned(),
                alpn: None,
            },
        ],
        "the group for 80 would belong to no listener"
    );
}

#[test]
fn a_listener_a_real_call_was_refused_on_waits_for_the_recheck() {
    let actual = actual(vec![listener("arn:ours-443", 443, "arn:tg-443")]);
    let changes = vec![Change::ModifyListener {
        arn: "arn:ours-443".into(),
        listener: want(443),
        alpn: None,
    }];
    let tags = BTreeMap::from([("arn:ours-443".to_string(), owned())]);
    let (kept, refused) = refuse_listener_writes(changes, &actual, &tags, CLUSTER, |arn| {
        arn == "arn:ours-443"
    });
    assert!(kept.is_empty());
    assert_eq!(refused, vec!["arn:ours-443".to_string()]);
}

#[test]
fn other_changes_pass_untouched() {
    let changes = vec![Change::CreateListener {
        listener: want(80),
        tags: owned(),
        alpn: None,
    }];
    let (kept, refused) = refuse_listener_writes(
        changes.clone(),
        &actual(vec![]),
        &BTreeMap::new(),
        CLUSTER,
        |_| true,
    );
    assert_eq!((kept, refused), (changes, vec![]));
}

#[test]
fn listener_warning_names_the_arns_and_the_add_tags_fix() {
    let arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:listener/net/a/1/2";
    let w = untagged_listeners_warning(
        "default/web",
        &[arn.to_string()],
        "kubernetes.io/cluster/demo=owned",
    );
    assert_eq!(w.reason, "ListenerUnauthorized");
    assert!(
        w.message
            .contains(&format!("listener {arn} of default/web")),
        "{}",
        w.message
    );
    assert!(
        w.message.contains(&format!(
            "aws elbv2 add-tags --resource-arns {arn} --tags Key=kubernetes.io/cluster/demo,Value=owned"
        )),
        "{}",
        w.message
    );
    // Several: one event, one command tagging them all.
    let w = untagged_listeners_warning(
        "default/web",
        &["arn:a".to_string(), "arn:b".to_string()],
        "kubernetes.io/cluster/demo=owned",
    );
    assert!(
        w.message.contains("listener arn:a, arn:b of"),
        "{}",
        w.message
    );
    assert!(
        w.message.contains("--resource-arns arn:a arn:b --tags"),
        "{}",
        w.message
    );
}

#[test]
fn a_refused_real_call_names_the_listener_and_the_fix() {
    let perms = Permissions::new(CLUSTER, "us-east-1", DEFAULT_TTL);
    let denial = perms.denial(Action::ModifyListener, "arn:l", Tagging::Current);
    let w = listener_warning("default/web", &denial);
    assert!(
        w.message.contains("listener arn:l of default/web"),
        "{}",
        w.message
    );
    assert!(
        w.message.contains("add-tags --resource-arns arn:l"),
        "{}",
        w.message
    );
}

#[test]
fn warnings_with_one_reason_become_one_event() {
    let w = |reason, message: &str| Warning {
        reason,
        message: message.into(),
    };
    assert_eq!(
        merged(vec![
            w(SECURITY_GROUP_UNAUTHORIZED, "sg-1"),
            w(LISTENER_UNAUTHORIZED, "arn:l"),
            w(SECURITY_GROUP_UNAUTHORIZED, "sg-2"),
            w(SECURITY_GROUP_UNAUTHORIZED, "sg-1"),
        ]),
        vec![
            w(SECURITY_GROUP_UNAUTHORIZED, "sg-1 | sg-2"),
            w(LISTENER_UNAUTHORIZED, "arn:l"),
        ]
    );
}

#[test]
fn group_warning_names_the_group_the_tag_and_the_render_option() {
    let perms = Permissions::new(CLUSTER, "us-east-1", DEFAULT_TTL);
    perms.learn_account(Some("123456789012"));
    let denial = perms.denial(
        Action::AuthorizeSecurityGroupIngress,
        "sg-0abc",
        Tagging::Untagged,
    );
    let w = group_warning("default/web", &denial);
    assert_eq!(w.reason, "SecurityGroupUnauthorized");
    for part in [
        "default/web",
        "node security group sg-0abc",
        "arn:aws:ec2:us-east-1:123456789012:security-group/sg-0abc",
        "kubernetes.io/cluster/demo=shared",
        "iam/render.sh --security-group sg-0abc",
    ] {
        assert!(w.message.contains(part), "{part} missing: {}", w.message);
    }
}

#[test]
fn an_alpn_record_waits_while_its_listener_is_refused() {
    let actual = actual(vec![listener("arn:old-443", 443, "arn:tg-443")]);
    let record = |tag: &str| Change::AddTags {
        arn: None,
        tags: BTreeMap::from([(tag.to_string(), "HTTP2Preferred".to_string())]),
    };
    let changes = vec![
        Change::ModifyListener {
            arn: "arn:old-443".into(),
            listener: want(443),
            alpn: Some("HTTP2Preferred".into()),
        },
        record(crate::aws::tags::ALPN_POLICY_TAG),
        record("team"),
    ];
    let (kept, refused) =
        refuse_listener_writes(changes.clone(), &actual, &BTreeMap::new(), CLUSTER, |_| {
            false
        });
    assert_eq!(refused, vec!["arn:old-443".to_string()]);
    assert_eq!(kept, vec![record("team")]);
    // The listener ours: all kept.
    let tags = BTreeMap::from([("arn:old-443".to_string(), owned())]);
    let (kept, _) = refuse_listener_writes(changes.clone(), &actual, &tags, CLUSTER, |_| false);
    assert_eq!(kept, changes);
}
