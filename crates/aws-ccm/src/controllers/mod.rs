//! Controllers and what they share: the [`Environment`] the manager builds
//! and the [`ControllerContext`] with the shared informer caches
//! ([`informers::run_all`] starts them and every enabled controller).
//!
//! When each acts is decided by one mechanism, [`schedule`]: one place a
//! loop sleeps, one backoff, one debounce of node bursts, one periodic
//! loop and one set of `workqueue_*` metrics.

pub mod cached_node;
pub mod events;
pub mod informers;
pub mod node;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod permission_check;
pub mod route;
pub mod schedule;
pub mod service;
pub mod service_metrics;
pub mod tagging;

use std::sync::Arc;

use cached_node::Node;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::runtime::reflector::Store;
use tokio::sync::watch;

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
