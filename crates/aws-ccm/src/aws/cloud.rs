//! [`Aws`]: the door to AWS beside what this CCM keeps of AWS between
//! reads, which one owner holds: [`Memory`] (`memory/mod.rs`: the instance
//! sweep, zones and topology, the security-group view, the IAM verdicts,
//! and for load balancers the subnets, the sweep, the target cache and the
//! target record).
//!
//! The provider traits ([`crate::provider::instances::Instances`],
//! [`crate::provider::routes::Routes`],
//! [`crate::provider::permissions::PermissionCheck`]) are implemented on it,
//! and it dereferences to the door, so code that only sends calls takes an
//! [`AwsClient`] and is handed `&aws` as it is.

use std::collections::HashMap;
use std::sync::Arc;

use super::AwsError;
use super::client::door::Door;
use super::client::{AwsClient, CallOptions, ClientOptions, SdkClients};
use super::instances::Ec2Instance;
use super::instances::cache::{InstanceSettings, Zones};
use super::memory::Memory;

/// What the domain modules keep and write, beside the door's transport
/// options ([`ClientOptions`]): set by the manager from flags, cloud.conf
/// and the cluster's identity. `Default` is a cluster identified by its
/// current tag key, with the flags' defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// How the instance caches keep, and what the sweep asks.
    pub instances: InstanceSettings,
    /// Whether the load balancers, listeners, target groups and security
    /// groups this CCM creates also carry `KubernetesCluster=<id>`: the Go
    /// CCM's `usesLegacyTags`, which the manager sets from cloud.conf
    /// `KubernetesClusterTag` or this instance's tags (kOps).
    pub write_legacy_cluster_tag: bool,
}

/// The AWS side of the CCM. Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct Aws {
    client: AwsClient,
    memory: Memory,
    write_legacy_cluster_tag: bool,
}

impl crate::provider::Cloud for Aws {
    type LoadBalancers = super::load_balancers::AwsLoadBalancers;
}

impl std::fmt::Debug for Aws {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.client.fmt(f)
    }
}

impl std::ops::Deref for Aws {
    type Target = AwsClient;
    fn deref(&self) -> &AwsClient {
        &self.client
    }
}

impl Aws {
    /// A door of its own with these options, and empty caches kept as
    /// `settings` say. Invalid options are logged and replaced by their
    /// defaults (validate them earlier with [`ClientOptions::validate`] to
    /// refuse them instead).
    pub fn new(
        clients: SdkClients,
        cluster_id: String,
        opts: ClientOptions,
        settings: AwsSettings,
    ) -> Aws {
        let door = Door::new(&opts);
        Aws::with_door(clients, cluster_id, opts, settings, door)
    }

    /// [`AwsClient::with_door`]: a door others share too, with empty
    /// caches around it.
    pub(crate) fn with_door(
        clients: SdkClients,
        cluster_id: String,
        opts: ClientOptions,
        settings: AwsSettings,
        door: Arc<Door>,
    ) -> Aws {
        let client = AwsClient::with_door(clients, cluster_id, opts, door);
        Aws {
            memory: Memory::new(&client, &settings.instances),
            write_legacy_cluster_tag: settings.write_legacy_cluster_tag,
            client,
        }
    }

    /// What this CCM knows of AWS beyond a fresh read (see
    /// [`super::memory`]).
    pub(crate) fn memory(&self) -> &Memory {
        &self.memory
    }

    /// Whether what this CCM creates also carries the legacy
    /// `KubernetesCluster=<id>` tag ([`AwsSettings::write_legacy_cluster_tag`]).
    pub(crate) fn writes_legacy_cluster_tag(&self) -> bool {
        self.write_legacy_cluster_tag
    }

    /// The same door beside `memory` (a set of load balancers' own; see
    /// [`Memory::for_load_balancers`]).
    pub(crate) fn with_memory(&self, memory: Memory) -> Aws {
        Aws {
            client: self.client.clone(),
            memory,
            write_legacy_cluster_tag: self.write_legacy_cluster_tag,
        }
    }

    /// [`crate::aws::instances::cache::InstanceCache::by_id`] with no deadline of the caller's.
    pub async fn instance_by_id(&self, id: &str) -> Result<Ec2Instance, AwsError> {
        self.memory
            .instances()
            .by_id(id, CallOptions::default())
            .await
    }

    /// [`crate::aws::instances::cache::InstanceCache::by_private_dns`] with no deadline of the caller's.
    pub async fn instance_by_private_dns(&self, name: &str) -> Result<Ec2Instance, AwsError> {
        self.memory
            .instances()
            .by_private_dns(name, CallOptions::default())
            .await
    }

    /// [`crate::aws::instances::cache::InstanceCache::by_private_ip`] with no deadline of the caller's.
    pub(crate) async fn instances_by_private_ip(
        &self,
        ip: std::net::Ipv4Addr,
    ) -> Result<Vec<Ec2Instance>, AwsError> {
        self.memory
            .instances()
            .by_private_ip(ip, CallOptions::default())
            .await
    }

    /// [`crate::aws::instances::cache::InstanceCache::cluster_instances`].
    pub async fn cluster_instances(&self) -> Result<Arc<Vec<Ec2Instance>>, AwsError> {
        self.memory.instances().cluster_instances().await
    }

    /// Availability zone name → zone ID (`us-east-1a` → `use1-az1`), cached.
    pub async fn zone_ids(&self) -> Result<Arc<HashMap<String, String>>, AwsError> {
        Ok(self.memory.instances().zones().await?.ids.clone())
    }

    /// [`crate::aws::instances::cache::InstanceCache::zones`].
    pub(crate) async fn zones(&self) -> Result<Arc<Zones>, AwsError> {
        self.memory.instances().zones().await
    }
}
