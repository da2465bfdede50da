//! The targets-only path: when only a Service's backend nodes changed, move
//! the load balancer's targets by delta instead of ensuring it in full
//! (upstream's `UpdateLoadBalancer` on a node change).
//!
//! A full ensure that wrote everything it planned records what the path
//! needs: the Service's spec, the hostname, the security-group sets of its
//! backends and, per kind, the classic ELB's registered instances or the
//! NLB's target groups (ARN and port). A later backend-only change then
//! costs, for a classic ELB, one register and one deregister call (the
//! registered list is the recorded one: `DescribeInstanceHealth` is not in
//! the Go CCM's IAM policy) and, per NLB target group, one
//! `DescribeTargetHealth` and one register and one deregister call. No load
//! balancer, listener or attribute is read.
//!
//! The full ensure runs instead when nothing is recorded (the first sync
//! of a process, or after a failure), when the spec differs, when the
//! backends' security-group sets differ (a node group may gain or lose the
//! load balancer's rules) or when a call fails (a target group deleted out
//! of band, say: the full ensure reads everything and repairs it).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use super::{AwsLoadBalancers, CloudError, EnsureRequest, Ensured, LoadBalancerSpec};
use crate::aws::instances::Shared;
use crate::aws::memory::Applied;
use crate::aws::nlb::plan::target_changes;
use crate::aws::{Ec2Instance, Operation, elb, nlb};

/// The security groups of each backend, as sets of group IDs: equal sets
/// give equal node groups (the node group is chosen from an instance's
/// groups alone), so the load balancer's node rules stay as they are.
pub(crate) type GroupSets = BTreeSet<Vec<Shared>>;

/// The group sets of `backends`.
pub(crate) fn group_sets<'a>(backends: impl IntoIterator<Item = &'a Ec2Instance>) -> GroupSets {
    backends
        .into_iter()
        .map(|i| {
            let mut ids: Vec<Shared> = i.security_groups.iter().map(|g| g.id.clone()).collect();
            ids.sort();
            ids
        })
        .collect()
}

/// What the targets-only path knows of one Service's load balancer.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub(crate) spec: LoadBalancerSpec,
    pub(crate) hostname: String,
    pub(crate) groups: GroupSets,
    pub(crate) lb: KnownLb,
}

#[derive(Clone, Debug)]
pub(crate) enum KnownLb {
    /// A classic ELB and the instances registered with it.
    Classic {
        name: String,
        instances: Arc<BTreeSet<String>>,
    },
    /// An NLB's target groups: (ARN, target port).
    Network {
        name: String,
        groups: Vec<(String, i32)>,
    },
}

/// Per Service UID, what the last full ensure recorded. Instance sets are
/// shared between Services with equal sets (most target every node), so
/// the cache holds about one copy of the node list, not one per Service.
#[derive(Clone, Default)]
pub(crate) struct TargetCache {
    inner: Arc<Mutex<Entries>>,
}

#[derive(Default)]
struct Entries {
    /// Boxed: a `Known` is about 600 bytes, and a table sized for 1,000
    /// Services holds 2,048 slots (1.3 MB inline, 1.3 MB more while it
    /// grows).
    by_uid: HashMap<String, Box<Known>>,
    /// Distinct instance sets, for sharing.
    sets: Vec<Arc<BTreeSet<String>>>,
}

impl TargetCache {
    pub(crate) fn get(&self, uid: &str) -> Option<Known> {
        self.inner.lock().by_uid.get(uid).map(|k| Known::clone(k))
    }

    pub(crate) fn forget(&self, uid: &str) {
        let mut e = self.inner.lock();
        e.by_uid.remove(uid);
        e.sets.retain(|s| Arc::strong_count(s) > 1);
    }

    /// Records `known` for `uid`, sharing its instance set with an equal one.
    pub(crate) fn record(&self, uid: &str, mut known: Known) {
        let mut e = self.inner.lock();
        if let KnownLb::Classic { instances, .. } = &mut known.lb {
            match e.sets.iter().find(|s| **s == *instances) {
                Some(same) => *instances = same.clone(),
                None => e.sets.push(instances.clone()),
            }
        }
        e.by_uid.insert(uid.to_string(), Box::new(known));
        e.sets.retain(|s| Arc::strong_count(s) > 1);
    }
}

/// What to add and what to remove to go from `have` to `want`: instances
/// to register and deregister, rules to authorize and revoke, subnets to
/// attach and detach.
pub(crate) fn delta<T: Ord + Clone>(
    have: &BTreeSet<T>,
    want: &BTreeSet<T>,
) -> (BTreeSet<T>, BTreeSet<T>) {
    (
        want.difference(have).cloned().collect(),
        have.difference(want).cloned().collect(),
    )
}

impl AwsLoadBalancers {
    /// Moves only the targets when that is all that changed, else ensures
    /// in full (see the module header).
    pub(super) async fn update_targets_or_ensure(
        &self,
        req: &EnsureRequest,
    ) -> Result<Ensured, CloudError> {
        match self.targets_only(req).await {
            Ok(Some(done)) => return Ok(done),
            Ok(None) => {}
            Err(e) => {
                tracing::info!(service = %req.service_key, error = %e, "moving targets failed; ensuring the load balancer in full");
            }
        }
        self.memory().before_sync(&req.uid);
        super::LoadBalancers::ensure(self, req).await
    }

    /// `Ok(None)` when the targets-only path does not apply.
    async fn targets_only(&self, req: &EnsureRequest) -> Result<Option<Ensured>, CloudError> {
        let Some(known) = (self.memory().known_targets(&req.uid)).filter(|k| k.spec == req.spec)
        else {
            return Ok(None);
        };
        let (_, backends) = self.vpc_and_backends(&req.instance_ids).await?;
        let backends = backends.list();
        if group_sets(backends.iter().copied()) != known.groups {
            tracing::debug!(service = %req.service_key, "the backends' security groups changed; ensuring in full");
            return Ok(None);
        }
        let want: BTreeSet<String> = backends.iter().map(|i| i.id.clone()).collect();
        let changes = match &known.lb {
            KnownLb::Classic { name, instances } => {
                let mut steps = Vec::new();
                elb::plan::instance_changes(instances, &want, &mut steps);
                let none = elb::Actual::default();
                self.apply_clb(name, None, &none, &steps).await?;
                let classic = Some((req.uid.as_str(), &known, want));
                (self.memory()).applied(Applied::TargetsMoved { name, classic });
                steps.iter().map(elb::plan::describe).collect()
            }
            KnownLb::Network { name, groups } => {
                let mut steps = Vec::new();
                for (arn, port) in groups {
                    let health = self
                        .aws
                        .elbv2(Operation::Elbv2DescribeTargetHealth, |c| {
                            c.describe_target_health().target_group_arn(arn).send()
                        })
                        .await?;
                    // Those already draining left out, as the full read does.
                    let have = nlb::read::registered(health.target_health_descriptions(), *port);
                    target_changes(arn, *port, &have, &want, &mut steps);
                }
                let none = nlb::Actual::default();
                self.apply_nlb(name, "", &none, &steps).await?;
                let instances = &want;
                (self.memory()).applied(Applied::GroupsHold { groups, instances });
                steps.iter().map(nlb::plan::describe).collect::<Vec<_>>()
            }
        };
        Ok(Some(Ensured {
            hostname: known.hostname,
            changes,
            warnings: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn delta_registers_the_new_and_deregisters_the_gone() {
        let (add, remove) = delta(&set(&["i-1", "i-2"]), &set(&["i-2", "i-3"]));
        assert_eq!(add, set(&["i-3"]));
        assert_eq!(remove, set(&["i-1"]));
        let (add, remove) = delta(&set(&["i-1"]), &set(&["i-1"]));
        assert!(add.is_empty() && remove.is_empty());
    }

    #[test]
    fn nlb_steps_are_one_register_and_one_deregister_per_group_at_most() {
        let mut steps = Vec::new();
        target_changes(
            "arn:tg",
            30080,
            &set(&["i-1", "i-2"]),
            &set(&["i-2", "i-3", "i-4"]),
            &mut steps,
        );
        assert_eq!(
            steps,
            vec![
                nlb::Change::RegisterTargets {
                    target_group: nlb::TgRef::Arn("arn:tg".into()),
                    port: 30080,
                    instances: set(&["i-3", "i-4"]),
                },
                nlb::Change::DeregisterTargets {
                    arn: "arn:tg".into(),
                    port: 30080,
                    instances: set(&["i-1"]),
                },
            ]
        );
        let mut none = Vec::new();
        target_changes("arn:tg", 1, &set(&["i-1"]), &set(&["i-1"]), &mut none);
        assert!(none.is_empty());
    }

    fn known(instances: &[&str]) -> Known {
        let svc = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
        }))
        .unwrap();
        Known {
            spec: LoadBalancerSpec::from_service(&svc).unwrap(),
            hostname: "h".into(),
            groups: GroupSets::new(),
            lb: KnownLb::Classic {
                name: "lb".into(),
                instances: Arc::new(set(instances)),
            },
        }
    }

    fn instances_of(k: &Known) -> Arc<BTreeSet<String>> {
        match &k.lb {
            KnownLb::Classic { instances, .. } => instances.clone(),
            KnownLb::Network { .. } => unreachable!(),
        }
    }

    #[test]
    fn equal_instance_sets_are_stored_once() {
        let cache = TargetCache::default();
        for uid in 0..100 {
            cache.record(&uid.to_string(), known(&["i-1", "i-2"]));
        }
        cache.record("other", known(&["i-3"]));
        let a = instances_of(&cache.get("0").unwrap());
        let b = instances_of(&cache.get("99").unwrap());
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(cache.inner.lock().sets.len(), 2);
        cache.forget("other");
        assert!(cache.get("other").is_none());
        assert_eq!(cache.inner.lock().sets.len(), 1, "an unused set is dropped");
    }
}
