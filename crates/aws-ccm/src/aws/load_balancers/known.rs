//! What this CCM knows of its load balancers beyond a fresh read, and the
//! one rule that keeps it true (docs/memory.md is the operator's page).
//!
//! | what | kept in | vouches for |
//! | --- | --- | --- |
//! | create-time settings | the `aws-ccm/applied` tag ([`crate::aws::applied`]) | type, scheme, an NLB's subnets and addresses, as created |
//! | settings | the `aws-ccm/applied-settings` tag, and [`LbSweep`]'s verified digests | attributes, listeners, health checks |
//! | tags | [`LbSweep`]'s tag cache (`sweep_tags.rs`) | a load balancer's and its groups' tags |
//! | a Service's last full ensure | [`TargetCache`] (`targets.rs`) | spec, hostname, backends' groups, targets |
//! | NLB targets | the target record ConfigMap ([`crate::target_record`]) | each group's registered instances |
//!
//! The rule: an entry is written only after the apply it describes
//! succeeded (the two tags: in the create call itself; the target record:
//! after the change, its old entry removed before), and what a sync may
//! change is forgotten before it applies and again when it fails, so a
//! failure, a crash or a partial apply leaves no entry that claims more than
//! AWS has. Each entry is read in full again at its own slot of the resync
//! period (settings, tags, targets), so a change made by hand is repaired.
//!
//! Every write-back and invalidation is one call here; the structures and
//! the reads that use them are in their own files.
//!
//! [`LbSweep`]: super::sweep::LbSweep
//! [`TargetCache`]: super::targets::TargetCache

use std::collections::BTreeSet;
use std::sync::Arc;

use super::targets::{GroupSets, Known, KnownLb};
use super::{AwsLoadBalancers, EnsureRequest, planned};
use crate::aws::elb;
use crate::target_record;

impl AwsLoadBalancers {
    /// Before a sync of Service `uid` applies anything: its last full
    /// ensure no longer vouches for it (written again by a sync that
    /// writes everything it planned).
    pub(super) fn forget_before_sync(&self, uid: &str) {
        self.targets.forget(uid);
    }

    /// After a sync of Service `uid` failed: any step may have gone
    /// through, so its load balancer is read in full, and the subnets
    /// afresh (one may have been deleted or retagged since they were read).
    pub(super) fn forget_after_failure(&self, uid: &str) {
        self.subnets.invalidate();
        self.sweep.forget(&elb::load_balancer_name(uid));
    }

    /// After a write to load balancer `name` outside a full ensure (targets
    /// moved, upkeep): sweeps that started before it no longer answer for
    /// it, nor do the tags they read.
    pub(super) fn after_write(&self, name: &str) {
        self.sweep.touch(name);
    }

    /// Service `uid`'s load balancer is being deleted (or is gone): nothing
    /// of it is known.
    pub(super) fn forget_service(&self, uid: &str) {
        self.targets.forget(uid);
        self.aws.group_view().forget_slot(uid);
        self.sweep.forget(&elb::load_balancer_name(uid));
    }

    /// After a successful apply to load balancer `name`: its settings are
    /// known (until its next resync slot). `created`: the apply created it
    /// (with the settings tag); `changed`: it wrote.
    pub(super) fn settings_synced(
        &self,
        name: &str,
        settings: &planned::Settings,
        created: bool,
        changed: bool,
    ) {
        let in_full = settings.read_in_full || created;
        self.sweep.synced(name, &settings.digest, in_full, changed);
    }

    /// After a full ensure that wrote everything it planned: what the
    /// targets-only path needs for Service `req`.
    pub(super) fn record_targets(
        &self,
        req: &EnsureRequest,
        hostname: &str,
        groups: GroupSets,
        lb: KnownLb,
    ) {
        let known = Known {
            spec: req.spec.clone(),
            hostname: hostname.to_string(),
            groups,
            lb,
        };
        self.targets.record(&req.uid, known);
    }

    /// After the targets-only path moved a classic ELB's instances: the
    /// Service's entry now lists `instances`.
    pub(super) fn record_classic_instances(
        &self,
        uid: &str,
        known: &Known,
        instances: BTreeSet<String>,
    ) {
        let mut now = known.clone();
        if let KnownLb::Classic {
            instances: held, ..
        } = &mut now.lb
        {
            *held = Arc::new(instances);
        }
        self.targets.record(uid, now);
    }

    /// After a successful sync: the groups `groups` (ARN, port) hold
    /// `instances`, in the target record.
    pub(super) fn record_groups(&self, groups: &[(String, i32)], instances: &BTreeSet<String>) {
        self.record.record(groups.iter().filter_map(|(arn, port)| {
            let digest = target_record::digest(*port, instances);
            Some((target_record::key(arn)?, digest))
        }));
    }
}
