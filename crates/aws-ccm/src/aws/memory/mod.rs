//! What this CCM knows of AWS beyond a fresh read: one owner, [`Memory`],
//! with private state, one trust rule, and one call after each apply
//! ([`Memory::applied`]) that says what the apply did. docs/memory.md is the
//! operator's page.
//!
//! # The invariant
//!
//! **An entry never claims more than AWS has, beyond the entry's lifetime.**
//!
//! * *What may be trusted:* an entry written after the apply it describes
//!   succeeded (the two load-balancer tags: in the create call itself), or
//!   read from AWS, until its lifetime ends (below).
//! * *What forgets it:* every apply reports here how it ended. An apply that
//!   succeeded records its effect; any other end (AWS refused it, IAM denied
//!   it, its answer was lost or timed out, or it went part of the way) makes
//!   what it touched unknown, so the next read of it goes to AWS. Before a
//!   sync applies anything, its Service's last full ensure stops vouching for
//!   it; before a target of an NLB group changes, the group's target-record
//!   entry is removed and the removal confirmed.
//! * *For how long:* each store is read in full again at its own time, so a
//!   change made by hand, outside the CCM, is seen and repaired:
//!
//! | store | vouches for | lifetime |
//! | --- | --- | --- |
//! | the instance sweep (`instances/cache.rs`) | the cluster's instances | `--aws-instance-sweep-ttl` |
//! | zones (`instances/cache.rs`) | zone IDs and types | an hour |
//! | network topology (`instances/topology.rs`) | which types and Regions answer | until asked again |
//! | the security-group view (`security_groups/view.rs`) | the VPC's groups and rules | the load-balancer sweep's lifetime; a write of this process answers over listings for `--aws-consistency-window` |
//! | IAM verdicts (`permissions.rs`) | writes refused up front | 5 min |
//! | subnets (`subnets.rs`) | a VPC's subnets and route tables | 60 s |
//! | the load-balancer sweep and its tags (`load_balancers/sweep.rs`, `sweep_tags.rs`) | which load balancers exist, their settings and tags | the resync period, 30 s to 5 min; settings and tags to the Service's resync slot |
//! | the target cache (`load_balancers/targets.rs`) | a Service's last full ensure | until the Service's next full ensure |
//! | the target record (`crate::target_record`) | each NLB group's registered instances | 4 resync periods, at the group's slot |
//! | target groups left behind (`LeftGroups`, here) | groups whose delete failed after their listener moved off them | until deleted, or their Service's deletion |
//!
//! The first five stores live as long as the process; the last five are
//! made fresh for each set of load balancers ([`Memory::for_load_balancers`]:
//! a new leadership term forgets what the last one knew of them).
//!
//! The stores' structures and the reads that use them are in their own
//! files; what makes them forget or record is here and only here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::client::AwsClient;
use super::instances::cache::{InstanceCache, InstanceSettings};
use super::load_balancers::sweep::{self, LbSweep};
use super::load_balancers::targets::{Known, KnownLb, TargetCache};
use super::permissions::{DEFAULT_TTL, Permissions};
use super::security_groups::view::SgView;
use super::security_groups::{Rule, SecurityGroup};
use super::subnets::SubnetCache;
use crate::target_record::{self, TargetRecord};

#[cfg(test)]
mod tests;

/// How long the VPC's subnets and route tables are reused between syncs.
const SUBNET_TTL: Duration = Duration::from_secs(60);

/// One write an apply sent, as it ended. Security-group writes report
/// themselves here (`security_groups::io`); the apply hands the journal to
/// [`Memory::applied`] when it ends, however it ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Write {
    /// Group created (no rules yet).
    GroupCreated(SecurityGroup),
    /// `rules` added to `group`, with the descriptions they carry.
    Authorized {
        group: String,
        rules: BTreeSet<Rule>,
        descriptions: BTreeMap<Rule, String>,
    },
    /// `rules` revoked from `group`.
    Revoked {
        group: String,
        rules: BTreeSet<Rule>,
    },
    /// `group` deleted.
    GroupDeleted { group: String },
    /// A write to `group` that did not end in a known way: refused, denied,
    /// lost, timed out, or found the group existing already.
    GroupUnsure { group: String },
    /// An instance's attributes were changed (or may have been).
    InstanceChanged,
    /// The NLB target group with record key `key` was deleted.
    TargetGroupDeleted { key: String },
    /// The delete of NLB `load_balancer`'s target group `arn` (`name`),
    /// which the plan proved the Service's, failed. AWS lists a group no
    /// listener forwards to under no load balancer, so the next sync's read
    /// does not meet it: this entry leads that sync to it.
    TargetGroupLeft {
        load_balancer: String,
        arn: String,
        name: String,
    },
}

/// The writes of one apply, in order.
#[derive(Debug, Default)]
#[must_use = "hand the journal to Memory::applied: what it holds changes what may be trusted"]
pub(crate) struct Journal(Vec<Write>);

impl Journal {
    pub(crate) fn push(&mut self, write: Write) {
        self.0.push(write);
    }

    /// Records how a write to `group` ended: `done` when it went through,
    /// the group unsure otherwise.
    pub(crate) fn group_write<T, E>(
        &mut self,
        group: &str,
        result: &Result<T, E>,
        done: impl FnOnce() -> Write,
    ) {
        self.push(match result {
            Ok(_) => done(),
            Err(_) => Write::GroupUnsure {
                group: group.to_string(),
            },
        });
    }

    /// A journal nobody keeps: the one-shot operator tools (`aws-ccm
    /// orphans`) read AWS afresh for every question and keep no memory.
    pub(crate) fn discard(self) {}
}

/// What an apply did, as the memory hears it once the apply ended.
pub(crate) enum Applied<'a> {
    /// One apply's writes (see [`Journal`]).
    Writes(Journal),
    /// A sync of Service `uid` failed: any step may have gone through, so
    /// its load balancer is read in full, and the subnets afresh (one may
    /// have been deleted or retagged since they were read).
    SyncFailed { uid: &'a str },
    /// A sync applied the settings of load balancer `name` (digest
    /// `digest`; `in_full`: read in full or created; `changed`: it wrote).
    Settings {
        name: &'a str,
        digest: &'a str,
        in_full: bool,
        changed: bool,
    },
    /// A full ensure of Service `uid` wrote everything it planned: what the
    /// targets-only path needs next time.
    EnsuredInFull { uid: &'a str, known: Box<Known> },
    /// Targets moved outside a full ensure (the targets-only path, upkeep)
    /// on load balancer `name`: sweeps that started before no longer answer
    /// for it. `classic`: the targets-only path moved a classic ELB's
    /// instances, and Service `uid`'s entry now lists them.
    TargetsMoved {
        name: &'a str,
        classic: Option<(&'a str, &'a Known, BTreeSet<String>)>,
    },
    /// After a successful apply, NLB target groups `groups` (ARN, port)
    /// hold exactly `instances`.
    GroupsHold {
        groups: &'a [(String, i32)],
        instances: &'a BTreeSet<String>,
    },
    /// Service `uid`'s load balancer is being deleted, or is gone.
    ServiceGone { uid: &'a str },
}

/// The one owner of what this CCM knows of AWS. Cheap to clone: clones
/// share everything. The [`super::Aws`] every controller shares holds one
/// whose load-balancer part stays empty; each set of load balancers holds
/// its own ([`Memory::for_load_balancers`]).
#[derive(Clone)]
pub(crate) struct Memory {
    // For the process's life.
    instances: InstanceCache,
    groups: SgView,
    permissions: Arc<Permissions>,
    // For one set of load balancers.
    subnets: SubnetCache,
    sweep: LbSweep,
    targets: TargetCache,
    record: TargetRecord,
    left: LeftGroups,
}

/// Target groups left behind, by load balancer name: ARN → group name.
/// Claims no more than that the group may still exist: its one use is a
/// delete, and a group already gone answers not-found, which is success.
#[derive(Clone, Default)]
struct LeftGroups(Arc<std::sync::Mutex<BTreeMap<String, BTreeMap<String, String>>>>);

impl LeftGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeMap<String, String>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn left(&self, load_balancer: String, arn: String, name: String) {
        self.lock()
            .entry(load_balancer)
            .or_default()
            .insert(arn, name);
    }

    /// The group with record key `key` is gone.
    fn deleted(&self, key: &str) {
        self.lock().retain(|_, groups| {
            groups.retain(|arn, _| target_record::key(arn).as_deref() != Some(key));
            !groups.is_empty()
        });
    }

    fn of(&self, load_balancer: &str) -> Vec<(String, String)> {
        let all = self.lock();
        let groups = all.get(load_balancer).into_iter().flatten();
        groups.map(|(a, n)| (a.clone(), n.clone())).collect()
    }

    fn forget(&self, load_balancer: &str) {
        self.lock().remove(load_balancer);
    }
}

/// Why the target record could not be made ready for a change.
#[derive(Debug, thiserror::Error)]
#[error("their entries in the target record could not be removed first: {0}")]
pub(crate) struct RecordNotReady(String);

impl Memory {
    /// Empty memory beside `client`, the instances kept as `instances`
    /// says: a write of this process answers over listings for the
    /// client's consistency window.
    pub(crate) fn new(client: &AwsClient, instances: &InstanceSettings) -> Memory {
        Memory {
            instances: InstanceCache::new(client, instances),
            groups: SgView::new(client.options().consistency_patience),
            permissions: Arc::new(Permissions::new(
                client.cluster_id(),
                &client.region(),
                DEFAULT_TTL,
            )),
            subnets: SubnetCache::new(SUBNET_TTL),
            sweep: LbSweep::new(None),
            targets: TargetCache::default(),
            record: TargetRecord::default(),
            left: LeftGroups::default(),
        }
    }

    /// This memory's process-wide part, with nothing known of load
    /// balancers, and the target `record` (off by default). `trust`: known
    /// settings are trusted until each Service's resync slot (`Some(period)`,
    /// `None` inside: no resync) instead of read at every sync (`None`:
    /// `aws-ccm plan`).
    pub(crate) fn for_load_balancers(
        &self,
        trust: Option<Option<Duration>>,
        record: TargetRecord,
    ) -> Memory {
        if trust.is_some() {
            self.groups.serve_for(sweep::sweep_ttl(trust));
        }
        Memory {
            subnets: SubnetCache::new(SUBNET_TTL),
            sweep: LbSweep::new(trust),
            targets: TargetCache::default(),
            record,
            left: LeftGroups::default(),
            ..self.clone()
        }
    }

    /// The target record this memory keeps.
    pub(crate) fn target_record(&self) -> &TargetRecord {
        &self.record
    }
}

/// Reads: what may be trusted, each from its store.
impl Memory {
    /// Instance lookups and the cluster's sweep, zones and topology.
    pub(crate) fn instances(&self) -> &InstanceCache {
        &self.instances
    }

    /// The VPC's security groups as the sync paths share them.
    pub(crate) fn groups(&self) -> &SgView {
        &self.groups
    }

    /// What IAM lets this CCM write: the DryRun verdicts.
    pub(crate) fn permissions(&self) -> &Permissions {
        &self.permissions
    }

    /// The VPC's subnets.
    pub(crate) fn subnets(&self) -> &SubnetCache {
        &self.subnets
    }

    /// The cluster's load balancers, their settings and tags.
    pub(crate) fn sweep(&self) -> &LbSweep {
        &self.sweep
    }

    /// What Service `uid`'s last full ensure wrote, when it still vouches.
    pub(crate) fn known_targets(&self, uid: &str) -> Option<Known> {
        self.targets.get(uid)
    }

    /// Whether the record says the group `arn` holds exactly `instances` on
    /// `port`.
    pub(crate) fn recorded_as(&self, arn: &str, port: i32, instances: &BTreeSet<String>) -> bool {
        target_record::key(arn).is_some_and(|k| {
            self.record
                .trusts(&k, &target_record::digest(port, instances))
        })
    }

    /// NLB `load_balancer`'s target groups whose delete failed, (ARN, name):
    /// its next sync deletes them.
    pub(crate) fn left_target_groups(&self, load_balancer: &str) -> Vec<(String, String)> {
        self.left.of(load_balancer)
    }
}

/// Before an apply: what it may change stops vouching.
impl Memory {
    /// Before a sync of Service `uid` applies anything: its last full
    /// ensure no longer vouches for it.
    pub(crate) fn before_sync(&self, uid: &str) {
        self.targets.forget(uid);
    }

    /// Before the targets of the NLB groups `arns` change: their entries
    /// leave the target record, the removal confirmed.
    pub(crate) async fn before_target_changes(&self, arns: &[&str]) -> Result<(), RecordNotReady> {
        let keys: Vec<String> = arns.iter().filter_map(|a| target_record::key(a)).collect();
        self.record
            .before_change(&keys)
            .await
            .map_err(|e| RecordNotReady(e.to_string()))
    }
}

/// The one call after each apply.
impl Memory {
    /// What the apply `what` did: the memory records it or forgets what it
    /// touched (see the module header).
    pub(crate) fn applied(&self, what: Applied<'_>) {
        match what {
            Applied::Writes(journal) => {
                for write in journal.0 {
                    self.wrote(write);
                }
            }
            Applied::SyncFailed { uid } => {
                self.subnets.invalidate();
                self.sweep.forget(&super::elb::load_balancer_name(uid));
            }
            Applied::Settings {
                name,
                digest,
                in_full,
                changed,
            } => self.sweep.synced(name, digest, in_full, changed),
            Applied::EnsuredInFull { uid, known } => self.targets.record(uid, *known),
            Applied::TargetsMoved { name, classic } => {
                self.sweep.touch(name);
                if let Some((uid, known, instances)) = classic {
                    let mut now = known.clone();
                    if let KnownLb::Classic {
                        instances: held, ..
                    } = &mut now.lb
                    {
                        *held = Arc::new(instances);
                    }
                    self.targets.record(uid, now);
                }
            }
            Applied::GroupsHold { groups, instances } => {
                self.record.record(groups.iter().filter_map(|(arn, port)| {
                    let digest = target_record::digest(*port, instances);
                    Some((target_record::key(arn)?, digest))
                }));
            }
            Applied::ServiceGone { uid } => {
                let name = super::elb::load_balancer_name(uid);
                self.targets.forget(uid);
                self.groups.forget_slot(uid);
                self.sweep.forget(&name);
                self.left.forget(&name);
            }
        }
    }

    fn wrote(&self, write: Write) {
        match write {
            Write::GroupCreated(g) => self.groups.created(g),
            Write::Authorized {
                group,
                rules,
                descriptions,
            } => self.groups.authorized(&group, &rules, &descriptions),
            Write::Revoked { group, rules } => self.groups.revoked(&group, &rules),
            Write::GroupDeleted { group } => self.groups.deleted(&group),
            Write::GroupUnsure { group } => self.groups.unknown(&group),
            Write::InstanceChanged => self.instances.invalidate_sweep(),
            Write::TargetGroupDeleted { key } => {
                self.left.deleted(&key);
                self.record.forget(&[key]);
            }
            Write::TargetGroupLeft {
                load_balancer,
                arn,
                name,
            } => self.left.left(load_balancer, arn, name),
        }
    }
}
