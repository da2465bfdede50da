//! Controllers and what they share: the [`Environment`] the manager builds
//! and the [`ControllerContext`] with the shared informer caches
//! ([`informers::run_all`] starts them and every enabled controller).

pub mod cached_node;
pub mod events;
pub mod informers;
pub mod node;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod node_settle;
pub mod permission_check;
pub mod route;
pub mod service;
pub mod service_metrics;
pub mod tagging;
pub mod workqueue;

use std::sync::Arc;
use std::time::Duration;

use cached_node::Node;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::aws::Aws;
use crate::aws::load_balancers::AwsLoadBalancers;
use crate::cloud_config::CloudConfig;
use crate::options::Validated;

/// What every controller shares, built once by the manager.
#[derive(Clone)]
pub struct Environment {
    pub kube: Client,
    /// AWS: the one door, and what the CCM keeps of AWS between reads
    /// (the controllers see it only through the provider traits).
    pub aws: Aws,
    pub cloud: Arc<CloudConfig>,
    pub options: Arc<Validated>,
    pub cluster_id: String,
    pub region: String,
    /// What the service controller syncs Services' load balancers with;
    /// built here, in the wiring, so the controller sees only the
    /// provider's `LoadBalancers` trait.
    pub load_balancers: AwsLoadBalancers,
}

/// Everything a controller needs: the environment plus the shared informer
/// caches (one watch per kind, whatever the number of controllers).
#[derive(Clone)]
pub struct ControllerContext {
    pub env: Environment,
    pub nodes: Store<Node>,
    pub services: Store<Service>,
    /// Bumped after every watch event the node informer has applied to
    /// `nodes`. A controller that must react to changes (not only poll)
    /// waits on `changed()` and diffs the store: no second watch, and the
    /// informer never blocks on a slow controller (a `watch` channel keeps
    /// only the latest value).
    pub node_changes: watch::Receiver<u64>,
    /// The names of the Nodes behind those events, for controllers that
    /// follow each Node ([`node::changes::node_changes`]).
    pub node_feed: node::changes::Feed,
    /// The same for `services`.
    pub service_changes: watch::Receiver<u64>,
}

impl std::ops::Deref for ControllerContext {
    type Target = Environment;
    fn deref(&self) -> &Environment {
        &self.env
    }
}

/// Runs `pass` now and then every `period` after the last one began (a
/// pass longer than the period is followed at once by the next, never by a
/// burst of missed ones), until `stop` is cancelled, which also cuts a pass
/// short: the periodic controllers' one loop.
pub async fn every<F, Fut>(period: Duration, stop: &CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pass() => {}
        }
    }
}

/// Waits until the informer behind `changes` has applied an event, or
/// `at_most` has passed (the controller's own timers: retries, debounce).
/// Controllers wake on changes instead of re-reading whole stores on a fast
/// timer, so an idle cluster costs them nothing.
pub async fn changed_or(changes: &mut watch::Receiver<u64>, at_most: Duration) {
    match tokio::time::timeout(at_most, changes.changed()).await {
        Ok(Ok(())) | Err(_) => {}
        // The informer is gone (shutting down): fall back to the timer
        // rather than spinning on a closed channel.
        Ok(Err(_)) => tokio::time::sleep(at_most).await,
    }
}
