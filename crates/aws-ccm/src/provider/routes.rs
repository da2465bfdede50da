//! Routes: the route tables and routes the route controller manages, and
//! the [`Routes`] trait it talks to. `aws::Aws` implements it in
//! `aws/routes/`; [`fake::FakeRoutes`] is an in-memory cloud for unit tests.
//!
//! Everything here is parsed at the door: destinations are [`IpNet`]s,
//! targets an enum, so the controller's plan never looks at SDK types.
//!
//! The one `crate::aws` import, on purpose: `aws::tags` is the leaf module of
//! tag names (no client, no SDK); a [`RouteTableSelector`] matches tables by
//! the cluster tag, the same names the AWS side writes, so both use one copy.

use std::collections::HashMap;
use std::future::Future;

use ipnet::IpNet;

use crate::aws::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG, cluster_tag_key};
use crate::provider::CloudResult;
use crate::provider::permissions::{Probe, Tagging, Verdict};

#[cfg(test)]
pub(crate) mod fake;

/// Where a route sends traffic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum RouteTarget {
    /// An EC2 instance (AWS also names its network interface).
    Instance(String),
    /// A network interface not attached to an instance.
    NetworkInterface(String),
    /// The VPC's own `local` route.
    Local,
    /// An internet, NAT, transit, VPN, egress-only or carrier gateway, a
    /// peering connection, a VPC endpoint, a core network...: never ours.
    Gateway(String),
    /// No target left (a blackhole whose target was deleted).
    None,
}

impl std::fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteTarget::Instance(id) => write!(f, "instance {id}"),
            RouteTarget::NetworkInterface(id) => write!(f, "network interface {id}"),
            RouteTarget::Local => f.write_str("local"),
            RouteTarget::Gateway(id) => write!(f, "gateway {id}"),
            RouteTarget::None => f.write_str("no target"),
        }
    }
}

/// One route of a route table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Route {
    /// IPv4 or IPv6 destination; `None` for prefix-list destinations.
    pub(crate) destination: Option<IpNet>,
    pub(crate) target: RouteTarget,
    /// AWS state `blackhole`: the target is gone or stopped.
    pub(crate) blackhole: bool,
    /// Propagated by a virtual private gateway: cannot be changed by route
    /// calls, and does not count against the route table quota.
    pub(crate) propagated: bool,
}

/// A route table with its routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTable {
    pub(crate) id: String,
    pub(crate) vpc_id: Option<String>,
    pub(crate) routes: Vec<Route>,
    /// How the table is marked as the cluster's: the least-privilege policy
    /// grants route writes only on `kubernetes.io/cluster/<id>` tables.
    pub(crate) tagging: Tagging,
    /// The owning account (for the ARN in a permission message).
    pub(crate) owner_id: Option<String>,
}

impl RouteTable {
    /// Routes that count against AWS's "routes per route table" quota.
    pub(crate) fn counted_routes(&self) -> usize {
        self.routes.iter().filter(|r| !r.propagated).count()
    }
}

/// Which route tables the cluster's routes go in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTableSelector {
    /// `RouteTableID` from cloud.conf: exactly this table.
    pub route_table_id: Option<String>,
    /// `VPC` from cloud.conf: only tables of this VPC.
    pub vpc_id: Option<String>,
    /// Otherwise every table carrying the cluster tag
    /// (`kubernetes.io/cluster/<id>`, or legacy `KubernetesCluster=<id>`).
    pub cluster_id: String,
}

impl RouteTableSelector {
    /// Whether a table's tags mark it as the cluster's (the Go CCM's rule).
    pub(crate) fn matches_tags<'a>(
        &self,
        mut tags: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> bool {
        let key = cluster_tag_key(&self.cluster_id);
        tags.any(|(k, v)| k == key || (k == LEGACY_CLUSTER_TAG && v == self.cluster_id))
    }
}

impl std::fmt::Display for RouteTableSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.route_table_id {
            Some(id) => write!(f, "route table {id} (RouteTableID in cloud.conf)"),
            None => {
                write!(
                    f,
                    "route tables tagged {CLUSTER_TAG_PREFIX}{}",
                    self.cluster_id
                )?;
                if let Some(vpc) = &self.vpc_id {
                    write!(f, " in {vpc}")?;
                }
                Ok(())
            }
        }
    }
}

/// What the route controller needs to know about a route's target instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInstance {
    pub(crate) id: String,
    /// `Some(false)` once source/destination checking is off (needed for the
    /// instance to forward pod traffic it is not the address of).
    pub(crate) source_dest_check: Option<bool>,
    /// Terminated or shutting down: routes to it cannot be created.
    pub(crate) terminated: bool,
    /// How the instance is marked as the cluster's (the policy grants
    /// ModifyInstanceAttribute only on `kubernetes.io/cluster/<id>` ones).
    pub(crate) tagging: Tagging,
}

/// The cloud operations the route controller uses.
///
/// Methods return `Send` futures so the controller can run them on any
/// task; implementations write them as `async fn`.
pub trait Routes: Send + Sync {
    /// The selected route tables with their routes, in one read.
    fn route_tables(
        &self,
        selector: &RouteTableSelector,
    ) -> impl Future<Output = CloudResult<Vec<RouteTable>>> + Send;

    /// The instances among `ids` that exist; missing IDs are left out.
    fn instances(
        &self,
        ids: &[String],
    ) -> impl Future<Output = CloudResult<HashMap<String, TargetInstance>>> + Send;

    /// Turns source/destination checking off on an instance.
    fn disable_source_dest_check(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = CloudResult<()>> + Send;

    fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> impl Future<Output = CloudResult<()>> + Send;

    /// Points an existing route (a blackhole, or a stale target) at `instance_id`.
    fn replace_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> impl Future<Output = CloudResult<()>> + Send;

    fn delete_route(
        &self,
        table_id: &str,
        destination: IpNet,
    ) -> impl Future<Output = CloudResult<()>> + Send;

    /// Whether IAM allows the write `probe` stands for: a DryRun, its
    /// verdict kept per (action, resource) for a while.
    fn permission(&self, probe: &Probe, tagging: Tagging) -> impl Future<Output = Verdict> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_tables_by_either_tag() {
        let sel = RouteTableSelector {
            route_table_id: None,
            vpc_id: None,
            cluster_id: "c1".into(),
        };
        assert!(sel.matches_tags([("kubernetes.io/cluster/c1", "shared")].into_iter()));
        assert!(sel.matches_tags([("KubernetesCluster", "c1")].into_iter()));
        assert!(!sel.matches_tags([("KubernetesCluster", "c2")].into_iter()));
        assert!(!sel.matches_tags([("kubernetes.io/cluster/c2", "owned")].into_iter()));
    }
}
