//! Load balancers: what the service controller needs from the cloud.
//!
//! [`LoadBalancers`] is implemented for AWS by
//! `aws::load_balancers::AwsLoadBalancers` (read AWS, plan with the pure
//! functions in `aws::elb` and `aws::nlb`, apply).
//!
//! One `crate::aws` line stays, on purpose: [`LoadBalancerSpec`] is the
//! Service's load-balancer request as the annotation table parses it
//! (`aws::annotations`, the one place that knows the annotation names); the
//! controller parses it once and hands it through to the implementation
//! untouched, so it is shared rather than copied into a second type. The
//! same goes for the target-node-labels annotation, by which the controller
//! picks a Service's backend nodes, and for `aws-load-balancer-type`, by
//! which it leaves a Service to another controller ([`is_external`]), and
//! for the protection by which its deletion keeps the load balancer
//! ([`is_protected`]).

use std::collections::BTreeSet;
use std::future::Future;

use crate::provider::CloudResult;

pub use crate::aws::annotations::LoadBalancerSpec;
pub(crate) use crate::aws::annotations::{
    Reading, SYNC_FAILED, TARGET_NODE_LABELS, TYPE, adopt_name, is_external, is_protected,
    labels_match, parse_key_values,
};

/// The resync slot of the Service with UID `uid` that holds `at`: slots
/// are `period` long and each Service's are shifted by a fixed offset drawn
/// from its UID, so that Services synced together (a fresh leader adopts all
/// at once) come due one by one, evenly over the period, not in a burst. A
/// Service is due for its periodic resync once the slot moved on since its
/// last sync; the load balancers use the same slots to decide when to read
/// a load balancer in full again (drift repair).
pub(crate) fn resync_slot(uid: &str, period: std::time::Duration, at: tokio::time::Instant) -> u64 {
    let (epoch, period, offset) = slot_grid(uid, period);
    ((at.saturating_duration_since(epoch).as_nanos() + offset) / period) as u64
}

/// When the resync slot after the one holding `at` begins: the instant a
/// Service synced at `at` comes due for its resync.
pub(crate) fn next_resync_slot_at(
    uid: &str,
    period: std::time::Duration,
    at: tokio::time::Instant,
) -> tokio::time::Instant {
    let (epoch, period_ns, offset) = slot_grid(uid, period);
    let next = u128::from(resync_slot(uid, period, at)) + 1;
    let since_epoch = (next * period_ns).saturating_sub(offset);
    epoch + std::time::Duration::from_nanos(u64::try_from(since_epoch).unwrap_or(u64::MAX))
}

/// The process's slot epoch, `period` in nanoseconds and `uid`'s offset.
fn slot_grid(uid: &str, period: std::time::Duration) -> (tokio::time::Instant, u128, u128) {
    use std::hash::{Hash, Hasher};
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(tokio::time::Instant::now);
    let period = period.as_nanos().max(1);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    uid.hash(&mut h);
    (epoch, period, u128::from(h.finish()) % period)
}

/// One Service's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsureRequest {
    /// `namespace/name`.
    pub service_key: String,
    pub uid: String,
    pub spec: LoadBalancerSpec,
    /// EC2 instance IDs of the backend nodes.
    pub instance_ids: BTreeSet<String>,
    /// What the sync may change.
    pub scope: Scope,
}

/// What a sync of a Service with this reading may change: `None` when
/// nothing is to be done. `has_load_balancer`: the Service has one already
/// (its status or the finalizer says so). A refused value leaves an existing
/// load balancer in upkeep and a new Service without one; a value held for
/// new Services (`type: NLB`) only holds a new Service; one that holds
/// changes (`aws-load-balancer-scheme: internal` alone) holds a new Service
/// and keeps an existing load balancer in upkeep, as a refused value does.
pub(crate) fn scope(reading: &Reading, has_load_balancer: bool) -> Option<Scope> {
    if !reading.errors.is_empty() || reading.holds_changes() {
        return has_load_balancer.then_some(Scope::Upkeep {
            node_rules: reading.source_ranges_known(),
        });
    }
    (has_load_balancer || !reading.holds_new()).then_some(Scope::Full)
}

/// What a sync may change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Everything the Service asks for.
    #[default]
    Full,
    /// The Service carries a value this CCM refuses: only an existing load
    /// balancer's backends and (when `node_rules`) its backends' security
    /// rules are kept current; nothing is created.
    Upkeep { node_rules: bool },
}

/// What an ensure did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ensured {
    pub(crate) hostname: String,
    /// Descriptions of the changes applied; empty when nothing differed.
    pub changes: Vec<String>,
    /// Writes the cloud refused: left undone, the rest synced.
    pub(crate) warnings: Vec<Warning>,
}

pub trait LoadBalancers: Clone + Send + Sync + 'static {
    fn ensure(&self, req: &EnsureRequest) -> impl Future<Output = CloudResult<Ensured>> + Send;
    /// The same outcome as [`Self::ensure`] for a Service whose spec is
    /// unchanged since its last ensure and whose backend set changed
    /// (upstream's `UpdateLoadBalancer`): the implementation may move only
    /// the targets, and ensures in full when it cannot tell that is enough.
    fn update_targets(
        &self,
        req: &EnsureRequest,
    ) -> impl Future<Output = CloudResult<Ensured>> + Send;
    /// The name this CCM gives the load balancer of the Service with UID
    /// `uid` (of either kind), whether it exists or not.
    fn name(&self, uid: &str) -> String;
    /// Removes everything made for the Service; with `protected` (the
    /// Service marks its load balancer protected, [`is_protected`]), or when
    /// the cloud protects it, keeps the load balancer and its own parts and
    /// removes only what reaches into the cluster.
    /// `adopted`: the Service's `aws-load-balancer-name` (the load balancer
    /// it may have adopted, [`adopt_name`]).
    fn ensure_deleted(
        &self,
        service_key: &str,
        uid: &str,
        protected: bool,
        adopted: Option<&str>,
    ) -> impl Future<Output = CloudResult<Removed>> + Send;
}

/// What a Service's deletion did to its load balancer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    /// Whether anything in the cloud was deleted or changed.
    pub changed: bool,
    /// The protected load balancer that was kept, when one was: what it is
    /// and how it is marked kept (`NLB a1b2… (tagged …)`).
    pub(crate) kept: Option<String>,
}

/// Something a sync left undone that only the operator can fix; the rest
/// of the load balancer was synced. Becomes a Warning event on the Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Warning {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// One warning per reason: events with the same reason on one object fold
/// into a series that keeps the first note, so a second note would be lost.
pub(crate) fn merged(warnings: Vec<Warning>) -> Vec<Warning> {
    let mut out: Vec<Warning> = Vec::new();
    for w in warnings {
        match out.iter_mut().find(|o| o.reason == w.reason) {
            Some(o) if !o.message.contains(&w.message) => {
                o.message = format!("{} | {}", o.message, w.message);
            }
            Some(_) => {}
            None => out.push(w),
        }
    }
    out
}
