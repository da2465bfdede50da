//! Per-action call counters, kept by the proxy and handed out as snapshots.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use serde::Serialize;

/// What happened to the calls of one (service, action).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ActionCounts {
    /// Every call that reached the proxy (each SDK attempt counts once).
    pub received: u64,
    /// Calls sent on to the upstream (moto), including those delayed by a
    /// `Latency` fault.
    pub forwarded: u64,
    /// Calls rejected with the throttling error because their token bucket
    /// was empty (budget enforcement; a `Throttle` fault counts as faulted).
    pub throttled: u64,
    /// Calls a fault rule fired on (any kind, `Latency` included), and
    /// calls the stand-in refused as AWS would: an IAM denial, the targets
    /// quota, the security groups per load balancer.
    pub faulted: u64,
}

/// A snapshot of the proxy's counters, keyed by (service, action).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    calls: BTreeMap<(String, String), ActionCounts>,
}

impl CallCounts {
    /// Counts for one action; all zero when it was never called.
    pub fn get(&self, service: &str, action: &str) -> ActionCounts {
        self.calls
            .get(&(service.to_owned(), action.to_owned()))
            .copied()
            .unwrap_or_default()
    }

    /// Every (service, action) seen, in sorted order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, ActionCounts)> + '_ {
        self.calls
            .iter()
            .map(|((service, action), counts)| (service.as_str(), action.as_str(), *counts))
    }

    /// Calls received, over all actions.
    pub fn total_received(&self) -> u64 {
        self.calls.values().map(|c| c.received).sum()
    }

    /// Calls forwarded to the upstream, over all actions.
    pub fn total_forwarded(&self) -> u64 {
        self.calls.values().map(|c| c.forwarded).sum()
    }

    /// Calls rejected for being over budget, over all actions.
    pub fn throttled_total(&self) -> u64 {
        self.calls.values().map(|c| c.throttled).sum()
    }

    /// Calls a fault rule fired on, over all actions.
    pub fn faulted_total(&self) -> u64 {
        self.calls.values().map(|c| c.faulted).sum()
    }

    /// Whether no AWS call was seen.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The JSON served at `GET /proxy-api/counts`.
    pub fn to_json(&self) -> serde_json::Value {
        let calls: Vec<serde_json::Value> = self
            .iter()
            .map(|(service, action, c)| {
                serde_json::json!({
                    "service": service,
                    "action": action,
                    "received": c.received,
                    "forwarded": c.forwarded,
                    "throttled": c.throttled,
                    "faulted": c.faulted,
                })
            })
            .collect();
        serde_json::json!({
            "calls": calls,
            "total_received": self.total_received(),
            "total_forwarded": self.total_forwarded(),
            "throttled_total": self.throttled_total(),
            "faulted_total": self.faulted_total(),
        })
    }
}

/// Which counter to bump.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Received,
    Forwarded,
    Throttled,
    Faulted,
}

/// The live counters. Nested maps so a hit looks up by `&str` without
/// allocating, which matters at thousands of calls per second.
#[derive(Default)]
pub(crate) struct Counters {
    by_service: Mutex<HashMap<String, HashMap<String, ActionCounts>>>,
}

impl Counters {
    pub(crate) fn bump(&self, service: &str, action: &str, outcome: Outcome) {
        let mut by_service = self.by_service.lock();
        if let Some(actions) = by_service.get_mut(service) {
            bump_action(actions, action, outcome);
        } else {
            let mut actions = HashMap::new();
            bump_action(&mut actions, action, outcome);
            by_service.insert(service.to_owned(), actions);
        }
    }

    pub(crate) fn snapshot(&self) -> CallCounts {
        let by_service = self.by_service.lock();
        let calls = by_service
            .iter()
            .flat_map(|(service, actions)| {
                actions
                    .iter()
                    .map(move |(action, counts)| ((service.clone(), action.clone()), *counts))
            })
            .collect();
        CallCounts { calls }
    }

    pub(crate) fn reset(&self) {
        self.by_service.lock().clear();
    }
}

fn bump_action(actions: &mut HashMap<String, ActionCounts>, action: &str, outcome: Outcome) {
    if let Some(counts) = actions.get_mut(action) {
        outcome.apply(counts);
    } else {
        let mut counts = ActionCounts::default();
        outcome.apply(&mut counts);
        actions.insert(action.to_owned(), counts);
    }
}

impl Outcome {
    fn apply(self, counts: &mut ActionCounts) {
        match self {
            Outcome::Received => counts.received += 1,
            Outcome::Forwarded => counts.forwarded += 1,
            Outcome::Throttled => counts.throttled += 1,
            Outcome::Faulted => counts.faulted += 1,
        }
    }
}
