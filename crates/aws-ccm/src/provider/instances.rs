//! Instances: the lookups and tag writes the node controllers need.
//!
//! The node, node-lifecycle and tagging controllers talk to [`Instances`];
//! `aws::Aws` implements it for real in `aws/instances/io.rs` (every call
//! through the one door: coalesced lookups, the shared cluster sweep,
//! throttled tag writes), and
//! [`fake::FakeInstances`] implements it in memory for unit tests.
//!
//! The instance type itself is [`Instance`], which the AWS side parses from
//! EC2's answers at the door (no SDK type crosses this boundary); it is
//! defined here so controllers import nothing from `aws::`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use super::error::CloudResult;

/// EC2 accepts at most this many resource IDs in one CreateTags/DeleteTags.
pub(crate) const MAX_TAG_RESOURCES: usize = 1000;
/// EC2 accepts at most this many instance IDs in one
/// DescribeInstanceTopology: one question's worth of network-node lookups.
pub(crate) const MAX_TOPOLOGY_IDS: usize = 100;

/// Lifecycle state of an instance.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Pending,
    Running,
    ShuttingDown,
    Terminated,
    Stopping,
    Stopped,
    /// A state this build does not know; kept verbatim.
    Other(String),
}

impl InstanceState {
    pub fn parse(name: &str) -> InstanceState {
        use InstanceState::*;
        let known = [
            Pending,
            Running,
            ShuttingDown,
            Terminated,
            Stopping,
            Stopped,
        ];
        (known.into_iter().find(|state| state.as_str() == name))
            .unwrap_or_else(|| Other(name.to_string()))
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            InstanceState::Pending => "pending",
            InstanceState::Running => "running",
            InstanceState::ShuttingDown => "shutting-down",
            InstanceState::Terminated => "terminated",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
            InstanceState::Other(name) => name,
        }
    }

    /// Terminated or on its way there: the node should go away.
    pub(crate) fn is_terminated(&self) -> bool {
        matches!(
            self,
            InstanceState::ShuttingDown | InstanceState::Terminated
        )
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A network interface attached to an instance: the addresses a node
/// reports. Its ID, subnet and VPC are not kept (nothing reads them, and
/// every instance of the sweep carries them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkInterface {
    /// Device index of the attachment (0 is the primary interface).
    pub(crate) device_index: Option<i32>,
    /// The interface's primary private IPv4 address first, then secondaries.
    pub private_ips: Vec<Ipv4Addr>,
    pub(crate) ipv6_addresses: Vec<Ipv6Addr>,
    pub(crate) public_ip: Option<Ipv4Addr>,
}

/// A security group reference on an instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecurityGroupRef {
    pub id: Shared,
    pub name: Option<Shared>,
}

/// A string that repeats across the instances of one read (zone, type,
/// subnet, VPC, security group, tag): one allocation, shared. See
/// `aws::instances::plan::Interner`.
pub type Shared = Arc<str>;

/// A cloud instance (EC2: parsed at the door, see `aws::instances`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// Availability zone name (`us-east-1a`), from the placement.
    pub availability_zone: Option<Shared>,
    pub instance_type: Option<Shared>,
    pub state: InstanceState,
    pub private_dns_name: Option<String>,
    pub(crate) public_dns_name: Option<String>,
    pub private_ip: Option<Ipv4Addr>,
    pub(crate) public_ip: Option<Ipv4Addr>,
    /// Sorted by device index.
    pub network_interfaces: Vec<NetworkInterface>,
    pub(crate) tags: InstanceTags,
    pub(crate) source_dest_check: Option<bool>,
    pub subnet_id: Option<Shared>,
    pub vpc_id: Option<Shared>,
    pub security_groups: Vec<SecurityGroupRef>,
}

/// An instance's kept tags, sorted by key. One or two entries in a flat
/// list: a `BTreeMap` allocates a node of eleven slots (about 540 bytes)
/// for even one entry, and the sweep holds one set per instance. Keys and
/// values are [`Shared`]: every instance of a cluster carries the same ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceTags(pub(crate) Vec<(Shared, Shared)>);

impl InstanceTags {
    fn position(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(key))
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.position(key).ok().map(|i| &*self.0[i].1)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_ok()
    }

    pub(crate) fn insert_shared(&mut self, key: Shared, value: Shared) {
        match self.position(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    /// `(key, value)` pairs in key order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

/// The answer to a lookup of one instance: `Ok(None)` when the cloud
/// answered that there is no such instance.
pub(crate) type Found = CloudResult<Option<Instance>>;

/// What the node controllers ask of the cloud. Every method may be called
/// concurrently from many tasks; implementations batch and share the work.
pub trait Instances: Clone + Send + Sync + 'static {
    /// One instance by ID, in any state. `Ok(None)` when the cloud answered
    /// that no such instance exists.
    fn instance_by_id(&self, id: &str) -> impl Future<Output = Found> + Send;

    /// The live (not terminated) instance with this private DNS name.
    fn instance_by_private_dns(&self, name: &str) -> impl Future<Output = Found> + Send;

    /// Every live (not terminated) instance whose primary private IPv4
    /// address is `ip`, in any VPC, tagged for any cluster or none; empty
    /// when there is none. Concurrent lookups are batched. The caller
    /// decides what the answer proves (see
    /// `controllers::node::by_address`).
    fn instances_by_private_ip(
        &self,
        ip: Ipv4Addr,
    ) -> impl Future<Output = CloudResult<Vec<Instance>>> + Send;

    /// Every instance tagged as a member of the cluster, in any state; a
    /// shared, cached sweep. An instance missing from it may still exist
    /// (untagged): confirm with [`Instances::instance_by_id`] before acting
    /// on absence.
    fn cluster_instances(&self) -> impl Future<Output = CloudResult<Arc<Vec<Instance>>>> + Send;

    /// Availability zone name → zone ID (`us-east-1a` → `use1-az1`), cached.
    fn zone_ids(&self) -> impl Future<Output = CloudResult<Arc<HashMap<String, String>>>> + Send;

    /// The network nodes above an instance, top layer first (the
    /// `topology.k8s.aws/network-node-layer-N` labels). `Ok(None)` when it
    /// has none or is not asked (no type; lately found to answer nothing).
    /// Concurrent questions are batched.
    fn network_nodes(
        &self,
        id: &str,
        instance_type: Option<&str>,
    ) -> impl Future<Output = CloudResult<Option<Vec<String>>>> + Send;

    /// Whether instances of this type are expected to have network nodes
    /// (cloud.conf `SupportedTopologyInstanceTypePattern`).
    fn expects_topology(&self, instance_type: &str) -> bool;

    /// Adds (or overwrites) `tags` on every instance in `ids` in one call
    /// (at most [`MAX_TAG_RESOURCES`] IDs). Fails as a whole, like EC2: one
    /// unknown ID fails the call with a not-found error.
    fn create_tags(
        &self,
        ids: &[String],
        tags: &[(String, String)],
    ) -> impl Future<Output = CloudResult<()>> + Send;

    /// Removes `tags` from every instance in `ids` where the tag still has
    /// the given value (a tag someone changed since is left alone).
    fn delete_tags(
        &self,
        ids: &[String],
        tags: &[(String, String)],
    ) -> impl Future<Output = CloudResult<()>> + Send;
}

/// What the tests write into an instance's tags.
#[cfg(test)]
impl InstanceTags {
    /// Sets `key` to `value`, replacing an earlier value.
    pub(crate) fn insert(&mut self, key: &str, value: &str) {
        self.insert_shared(key.into(), value.into());
    }

    pub(crate) fn remove(&mut self, key: &str) -> Option<Shared> {
        self.position(key).ok().map(|i| self.0.remove(i).1)
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

#[cfg(test)]
impl From<std::collections::BTreeMap<String, String>> for InstanceTags {
    fn from(map: std::collections::BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the list is sorted.
        InstanceTags(map.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }
}

#[cfg(test)]
impl Extend<(String, String)> for InstanceTags {
    fn extend<I: IntoIterator<Item = (String, String)>>(&mut self, iter: I) {
        for (k, v) in iter {
            self.insert(&k, &v);
        }
    }
}

/// An in-memory cloud for unit tests of the controllers.
#[cfg(test)]
pub(crate) mod fake {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::provider::{CloudError, ErrorKind};

    /// What the fake was asked, for assertions.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub(crate) struct Calls {
        pub(crate) by_id: Vec<String>,
        pub(crate) by_private_dns: Vec<String>,
        /// Addresses asked by [`Instances::instances_by_private_ip`].
        pub(crate) by_private_ip: Vec<Ipv4Addr>,
        pub(crate) sweeps: u32,
        /// Instance IDs asked for network nodes, one entry per question.
        network_nodes: Vec<String>,
        pub(crate) create_tags: Vec<Vec<String>>,
        delete_tags: Vec<Vec<String>>,
    }

    #[derive(Default)]
    struct State {
        instances: BTreeMap<String, Instance>,
        /// Instances that exist but are left out of the sweep (untagged).
        hidden_from_sweep: Vec<String>,
        zone_ids: HashMap<String, String>,
        fail_lookups: Option<CloudError>,
        fail_sweep: Option<CloudError>,
        fail_tags: Option<CloudError>,
        /// Instance ID → network nodes.
        topology: HashMap<String, Vec<String>>,
        /// Types expected to have network nodes.
        topology_types: Vec<String>,
        fail_topology: Option<CloudError>,
        calls: Calls,
    }

    /// Cheap to clone; clones share state.
    #[derive(Clone, Default)]
    pub(crate) struct FakeInstances {
        state: Arc<Mutex<State>>,
    }

    impl FakeInstances {
        pub(crate) fn new() -> FakeInstances {
            FakeInstances::default()
        }

        pub(crate) fn add(&self, instance: Instance) {
            self.state
                .lock()
                .instances
                .insert(instance.id.clone(), instance);
        }

        pub(crate) fn hide_from_sweep(&self, id: &str) {
            self.state.lock().hidden_from_sweep.push(id.to_string());
        }

        pub(crate) fn fail_lookups(&self, err: Option<CloudError>) {
            self.state.lock().fail_lookups = err;
        }

        pub(crate) fn fail_sweep(&self, err: Option<CloudError>) {
            self.state.lock().fail_sweep = err;
        }

        pub(crate) fn calls(&self) -> Calls {
            self.state.lock().calls.clone()
        }

        pub(crate) fn tags_of(&self, id: &str) -> BTreeMap<String, String> {
            self.state
                .lock()
                .instances
                .get(id)
                .map(|i| {
                    i.tags
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
                .unwrap_or_default()
        }

        fn unknown_ids(state: &State, operation: &str, ids: &[String]) -> Option<CloudError> {
            let unknown: Vec<&str> = ids
                .iter()
                .filter(|id| !state.instances.contains_key(*id))
                .map(String::as_str)
                .collect();
            (!unknown.is_empty()).then(|| {
                CloudError::new(
                    operation,
                    ErrorKind::NotFound,
                    format!("The instance IDs '{}' do not exist", unknown.join(", ")),
                )
            })
        }
    }

    impl Instances for FakeInstances {
        async fn instance_by_id(&self, id: &str) -> Result<Option<Instance>, CloudError> {
            let mut st = self.state.lock();
            st.calls.by_id.push(id.to_string());
            if let Some(err) = st.fail_lookups.clone() {
                return Err(err);
            }
            Ok(st.instances.get(id).cloned())
        }

        async fn instance_by_private_dns(
            &self,
            name: &str,
        ) -> Result<Option<Instance>, CloudError> {
            let mut st = self.state.lock();
            st.calls.by_private_dns.push(name.to_string());
            if let Some(err) = st.fail_lookups.clone() {
                return Err(err);
            }
            Ok(st
                .instances
                .values()
                .find(|i| {
                    i.private_dns_name.as_deref() == Some(name)
                        && i.state != InstanceState::Terminated
                })
                .cloned())
        }

        async fn instances_by_private_ip(&self, ip: Ipv4Addr) -> Result<Vec<Instance>, CloudError> {
            let mut st = self.state.lock();
            st.calls.by_private_ip.push(ip);
            if let Some(err) = st.fail_lookups.clone() {
                return Err(err);
            }
            Ok((st.instances.values())
                .filter(|i| i.private_ip == Some(ip) && i.state != InstanceState::Terminated)
                .cloned()
                .collect())
        }

        async fn cluster_instances(&self) -> Result<Arc<Vec<Instance>>, CloudError> {
            let mut st = self.state.lock();
            st.calls.sweeps += 1;
            if let Some(err) = st.fail_sweep.clone() {
                return Err(err);
            }
            Ok(Arc::new(
                st.instances
                    .values()
                    .filter(|i| !st.hidden_from_sweep.contains(&i.id))
                    .cloned()
                    .collect(),
            ))
        }

        async fn zone_ids(&self) -> Result<Arc<HashMap<String, String>>, CloudError> {
            Ok(Arc::new(self.state.lock().zone_ids.clone()))
        }

        async fn network_nodes(
            &self,
            id: &str,
            instance_type: Option<&str>,
        ) -> Result<Option<Vec<String>>, CloudError> {
            if instance_type.is_none_or(str::is_empty) {
                return Ok(None);
            }
            let mut st = self.state.lock();
            st.calls.network_nodes.push(id.to_string());
            if let Some(err) = st.fail_topology.clone() {
                return Err(err);
            }
            Ok(st.topology.get(id).cloned())
        }

        fn expects_topology(&self, instance_type: &str) -> bool {
            (self.state.lock().topology_types.iter()).any(|t| t == instance_type)
        }

        async fn create_tags(
            &self,
            ids: &[String],
            tags: &[(String, String)],
        ) -> Result<(), CloudError> {
            let mut st = self.state.lock();
            st.calls.create_tags.push(ids.to_vec());
            if let Some(err) = st.fail_tags.clone() {
                return Err(err);
            }
            if let Some(err) = FakeInstances::unknown_ids(&st, "ec2:CreateTags", ids) {
                return Err(err);
            }
            for id in ids {
                if let Some(i) = st.instances.get_mut(id) {
                    i.tags.extend(tags.iter().cloned());
                }
            }
            Ok(())
        }

        async fn delete_tags(
            &self,
            ids: &[String],
            tags: &[(String, String)],
        ) -> Result<(), CloudError> {
            let mut st = self.state.lock();
            st.calls.delete_tags.push(ids.to_vec());
            if let Some(err) = st.fail_tags.clone() {
                return Err(err);
            }
            if let Some(err) = FakeInstances::unknown_ids(&st, "ec2:DeleteTags", ids) {
                return Err(err);
            }
            for id in ids {
                if let Some(i) = st.instances.get_mut(id) {
                    for (k, v) in tags {
                        if i.tags.get(k) == Some(v) {
                            i.tags.remove(k);
                        }
                    }
                }
            }
            Ok(())
        }
    }

    /// A running instance in `us-east-1a` with one interface, for tests.
    pub(crate) fn instance(id: &str, private_ip: &str) -> Instance {
        let ip: std::net::Ipv4Addr = private_ip.parse().expect("test IP");
        let dns = format!("ip-{}.ec2.internal", private_ip.replace('.', "-"));
        Instance {
            id: id.to_string(),
            availability_zone: Some("us-east-1a".into()),
            instance_type: Some("m5.large".into()),
            state: InstanceState::Running,
            private_dns_name: Some(dns),
            public_dns_name: None,
            private_ip: Some(ip),
            public_ip: None,
            network_interfaces: vec![NetworkInterface {
                device_index: Some(0),
                private_ips: vec![ip],
                ipv6_addresses: vec![],
                public_ip: None,
            }],
            tags: BTreeMap::from([(
                "kubernetes.io/cluster/test".to_string(),
                "owned".to_string(),
            )])
            .into(),
            source_dest_check: Some(true),
            subnet_id: Some("subnet-1".into()),
            vpc_id: Some("vpc-1".into()),
            security_groups: vec![],
        }
    }
}
