//! The invariant as a table: each apply outcome against the read that must
//! follow it. An outcome other than "ok" must never leave an entry that
//! lets the next sync skip its read.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::*;
use crate::aws::annotations::LoadBalancerSpec;
use crate::aws::client::ClientOptions;
use crate::aws::client::test_stub::{StubEc2, fleet};
use crate::aws::load_balancers::targets::GroupSets;
use crate::aws::security_groups::Source;

/// How an apply ended, as the memory hears it: the write's result.
#[derive(Clone, Copy, Debug)]
enum End {
    Ok,
    /// AWS refused it (a 400).
    Failed,
    /// The answer was lost or timed out: it may have gone through.
    Lost,
    /// Part of it went through (the per-rule retry of a duplicate) before
    /// a later part failed.
    Partial,
    /// IAM refused it.
    Denied,
}

const ENDS: [End; 5] = [End::Ok, End::Failed, End::Lost, End::Partial, End::Denied];

impl End {
    fn result(self) -> Result<(), &'static str> {
        match self {
            End::Ok => Ok(()),
            End::Failed => Err("InvalidParameterValue"),
            End::Lost => Err("timed out"),
            End::Partial => Err("second rule: InvalidParameterValue"),
            End::Denied => Err("UnauthorizedOperation"),
        }
    }
}

async fn memory() -> (StubEc2, Memory) {
    let stub = StubEc2::start(fleet(3)).await;
    let aws = crate::aws::Aws::new(
        stub.clients(),
        "demo".into(),
        ClientOptions::default(),
        crate::aws::AwsSettings::default(),
    );
    // Trusted with no resync period: only what an apply says can make an
    // entry stop vouching.
    let memory = aws
        .memory()
        .for_load_balancers(Some(None), TargetRecord::default());
    (stub, memory)
}

fn rule(port: i32) -> Rule {
    Rule {
        protocol: "tcp".into(),
        from: port,
        to: port,
        source: Source::Cidr("10.0.0.0/16".parse().unwrap()),
    }
}

fn group(id: &str) -> SecurityGroup {
    SecurityGroup {
        id: id.into(),
        vpc_id: Some("vpc-1".into()),
        ..SecurityGroup::default()
    }
}

/// One apply with one write to group `id`, ended as `end`.
fn write_group(memory: &Memory, id: &str, end: End, done: impl FnOnce() -> Write) {
    let mut journal = Journal::default();
    journal.group_write(id, &end.result(), done);
    memory.applied(Applied::Writes(journal));
}

/// Each security-group write, each way it can end: after any end but "ok"
/// the next sync reads the group by ID (the lost AuthorizeSecurityGroupIngress
/// included); after "ok" the view answers from its own record.
#[tokio::test]
async fn a_group_write_that_did_not_end_ok_makes_the_next_sync_read_the_group() {
    type Make = fn(&str) -> Write;
    let writes: [(&str, Make); 4] = [
        ("AuthorizeSecurityGroupIngress", |g| Write::Authorized {
            group: g.into(),
            rules: BTreeSet::from([rule(443)]),
            descriptions: BTreeMap::from([(rule(443), "ours".into())]),
        }),
        ("RevokeSecurityGroupIngress", |g| Write::Revoked {
            group: g.into(),
            rules: BTreeSet::from([rule(80)]),
        }),
        ("CreateSecurityGroup", |g| Write::GroupCreated(group(g))),
        ("DeleteSecurityGroup", |g| Write::GroupDeleted {
            group: g.into(),
        }),
    ];
    for (action, make) in writes {
        for end in ENDS {
            let (_stub, memory) = memory().await;
            let id = "sg-1";
            // The group as an earlier, successful create left it.
            write_group(&memory, id, End::Ok, || Write::GroupCreated(group(id)));
            write_group(&memory, id, end, || make(id));
            let read_again = memory.groups().unknown_ids().contains(&id.to_string());
            assert_eq!(
                read_again,
                !matches!(end, End::Ok),
                "{action} ended {end:?}: the next sync reads the group: {read_again}"
            );
        }
    }
}

fn known(instances: &[&str]) -> Known {
    let svc = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default", "uid": "u-1"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
    }))
    .unwrap();
    Known {
        spec: LoadBalancerSpec::from_service(&svc).unwrap(),
        hostname: "lb.example".into(),
        groups: GroupSets::new(),
        lb: KnownLb::Classic {
            name: "lb".into(),
            instances: Arc::new(instances.iter().map(|s| s.to_string()).collect()),
        },
    }
}

/// A sync of a Service (RegisterTargets, CreateListener, any step) ended
/// each way. Its last full ensure stops vouching before it applies, and is
/// written again only by a full ensure that wrote everything: after any
/// other end the next ensure reads the targets and the load balancer
/// fresh (no targets-only shortcut, no trusted settings).
#[tokio::test]
async fn a_sync_that_did_not_end_ok_leaves_its_load_balancer_and_targets_to_be_read() {
    let (uid, digest) = ("u-1", "settings-1");
    let name = &crate::aws::elb::load_balancer_name(uid);
    for end in ENDS {
        let (_stub, memory) = memory().await;
        // What an earlier, complete sync left.
        memory.applied(Applied::EnsuredInFull {
            uid,
            known: Box::new(known(&["i-1"])),
        });
        let (in_full, changed) = (true, false);
        memory.applied(Applied::Settings {
            name,
            digest,
            in_full,
            changed,
        });
        assert!(memory.known_targets(uid).is_some());
        assert!(
            !memory
                .sweep()
                .must_read(name, uid, &BTreeMap::new(), digest)
        );

        memory.before_sync(uid);
        match end {
            End::Ok => {
                memory.applied(Applied::Settings {
                    name,
                    digest,
                    in_full,
                    changed: true,
                });
                memory.applied(Applied::EnsuredInFull {
                    uid,
                    known: Box::new(known(&["i-1", "i-2"])),
                });
            }
            _ => memory.applied(Applied::SyncFailed { uid }),
        }
        let ok = matches!(end, End::Ok);
        assert_eq!(
            memory.known_targets(uid).is_some(),
            ok,
            "sync ended {end:?}: the targets-only path may skip the ensure"
        );
        assert_eq!(
            memory
                .sweep()
                .must_read(name, uid, &BTreeMap::new(), digest),
            !ok,
            "sync ended {end:?}: the next sync reads the load balancer's settings"
        );
    }
}

/// The targets-only path moved a classic ELB's instances: after "ok" the
/// entry lists the new instances; after any other end the path falls back
/// to a full ensure, which forgets the entry before it applies.
#[tokio::test]
async fn moved_targets_are_known_only_after_the_move_ended_ok() {
    let (uid, name) = ("u-1", "lb");
    for end in ENDS {
        let (_stub, memory) = memory().await;
        let before = known(&["i-1"]);
        memory.applied(Applied::EnsuredInFull {
            uid,
            known: Box::new(before.clone()),
        });
        let want = BTreeSet::from(["i-2".to_string()]);
        match end {
            End::Ok => memory.applied(Applied::TargetsMoved {
                name,
                classic: Some((uid, &before, want.clone())),
            }),
            _ => memory.before_sync(uid),
        }
        let held = memory.known_targets(uid).map(|k| match k.lb {
            KnownLb::Classic { instances, .. } => (*instances).clone(),
            KnownLb::Network { .. } => unreachable!(),
        });
        let expected = matches!(end, End::Ok).then_some(want);
        assert_eq!(held, expected, "move ended {end:?}");
    }
}

/// ModifyInstanceAttribute (source/dest check), however it ended (the
/// route path reports it before looking at the answer: a lost answer may
/// have gone through): the cached sweep says what it said before, so the
/// next read goes to AWS.
#[tokio::test]
async fn an_instance_write_makes_the_next_sweep_read_aws() {
    let (stub, memory) = memory().await;
    memory.instances().cluster_instances().await.unwrap();
    let before = stub.calls("DescribeInstances");
    memory.instances().cluster_instances().await.unwrap();
    assert_eq!(
        stub.calls("DescribeInstances"),
        before,
        "served from memory"
    );
    let mut journal = Journal::default();
    journal.push(Write::InstanceChanged);
    memory.applied(Applied::Writes(journal));
    memory.instances().cluster_instances().await.unwrap();
    assert!(stub.calls("DescribeInstances") > before, "read from AWS");
}

/// A Service deleted: nothing of its load balancer vouches any more.
#[tokio::test]
async fn a_deleted_service_leaves_nothing_that_vouches() {
    let (_stub, memory) = memory().await;
    let uid = "u-1";
    let name = crate::aws::elb::load_balancer_name(uid);
    memory.applied(Applied::EnsuredInFull {
        uid,
        known: Box::new(known(&["i-1"])),
    });
    memory.applied(Applied::Settings {
        name: &name,
        digest: "d",
        in_full: true,
        changed: false,
    });
    memory.applied(Applied::ServiceGone { uid });
    assert!(memory.known_targets(uid).is_none());
    assert!(memory.sweep().must_read(&name, uid, &BTreeMap::new(), "d"));
}

/// A target group's delete that failed (any end but "ok") is remembered for
/// its load balancer, so the next sync deletes it; it is forgotten once
/// deleted, and with its Service. Another load balancer's list is its own.
#[tokio::test]
async fn a_failed_target_group_delete_is_left_for_the_next_sync() {
    let uid = "u-1";
    let name = crate::aws::elb::load_balancer_name(uid);
    let arn = "arn:aws:elasticloadbalancing:us-east-1:1:targetgroup/k8s-default-web-1/abc";
    let delete = |memory: &Memory, end: End| {
        let mut journal = Journal::default();
        if end.result().is_err() {
            journal.push(Write::TargetGroupLeft {
                load_balancer: name.clone(),
                arn: arn.into(),
                name: "k8s-default-web-1".into(),
            });
        } else {
            let key = target_record::key(arn).unwrap();
            journal.push(Write::TargetGroupDeleted { key });
        }
        memory.applied(Applied::Writes(journal));
    };
    let left = vec![(arn.to_string(), "k8s-default-web-1".to_string())];
    for end in ENDS {
        let (_stub, memory) = memory().await;
        delete(&memory, end);
        let ok = matches!(end, End::Ok);
        let expected = if ok { Vec::new() } else { left.clone() };
        assert_eq!(memory.left_target_groups(&name), expected, "{end:?}");
        assert!(memory.left_target_groups("other").is_empty());
        if !ok {
            // The next sync's delete went through.
            delete(&memory, End::Ok);
            assert!(memory.left_target_groups(&name).is_empty(), "{end:?}");
            // Left again, then the Service deleted: its deletion lists them.
            delete(&memory, end);
            memory.applied(Applied::ServiceGone { uid });
            assert!(memory.left_target_groups(&name).is_empty(), "{end:?}");
        }
    }
}
