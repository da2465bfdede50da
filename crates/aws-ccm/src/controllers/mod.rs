//! Controllers and what they share: the [`Environment`] the manager builds
//! and the [`ControllerContext`] with the shared informer caches
//! ([`informers::run_all`] starts them and every enabled controller).
//!
//! When each acts is decided by one mechanism, [`schedule`]: one keyed
//! scheduler for the controllers that work on keys, one periodic runner for
//! the set passes (route, node lifecycle, address refresh, node IPAM), one
//! module where loops sleep, one backoff, one settling rule for bursts of
//! changes (each user naming its quiet time and cap) and one set of
//! `workqueue_*` metrics.

pub mod cached_node;
pub mod events;
pub(crate) mod informers;
pub(crate) mod node;
pub mod node_ipam;
pub(crate) mod node_lifecycle;
pub(crate) mod permission_check;
pub(crate) mod route;
mod schedule;
pub mod service;
mod service_metrics;
pub mod tagging;

use std::sync::Arc;

use cached_node::Node;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;

use crate::aws::Aws;
use crate::cloud_config::CloudConfig;
use crate::options::Validated;
use crate::provider::Cloud;

/// What every controller shares, built once by the manager with `C` =
/// [`Aws`]. The controllers are generic over the [`Cloud`]: they see the
/// provider traits, never an AWS type.
#[derive(Clone)]
pub struct Environment<C: Cloud = Aws> {
    pub(crate) kube: Client,
    /// The cloud: for AWS, the one door and what the CCM keeps of AWS
    /// between reads.
    pub(crate) provider: C,
    pub(crate) cloud: Arc<CloudConfig>,
    pub(crate) options: Arc<Validated>,
    pub(crate) cluster_id: String,
    pub(crate) region: String,
    /// What the service controller syncs Services' load balancers with.
    pub(crate) load_balancers: C::LoadBalancers,
}

/// Everything a controller needs: the environment plus the shared informer
/// caches (one watch per kind, whatever the number of controllers).
#[derive(Clone)]
pub struct ControllerContext<C: Cloud = Aws> {
    env: Environment<C>,
    nodes: Store<Node>,
    services: Store<Service>,
    /// Bumped after every watch event the node informer has applied to
    /// `nodes`. A controller that must react to changes (not only poll)
    /// waits on `changed()` and diffs the store: no second watch, and the
    /// informer never blocks on a slow controller (a `watch` channel keeps
    /// only the latest value).
    node_changes: watch::Receiver<u64>,
    /// The names of the Nodes behind those events, for controllers that
    /// follow each Node ([`node::changes::node_changes`]).
    node_feed: node::changes::Feed,
    /// The same for `services`.
    service_changes: watch::Receiver<u64>,
}

/// Every object write of the controllers but the Event creates: a JSON
/// merge patch of `name`, with no field manager.
async fn merge_patch<K>(api: &Api<K>, name: &str, patch: Value) -> kube::Result<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// The same of `name`'s status subresource.
async fn merge_patch_status<K>(api: &Api<K>, name: &str, patch: Value) -> kube::Result<K>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

impl<C: Cloud> std::ops::Deref for ControllerContext<C> {
    type Target = Environment<C>;
    fn deref(&self) -> &Environment<C> {
        &self.env
    }
}
