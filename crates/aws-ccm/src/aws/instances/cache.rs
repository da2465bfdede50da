//! What this CCM keeps of EC2's instances between reads: the coalesced
//! lookups by ID, by private DNS name and by private IP, the shared cluster sweep (fresh
//! for [`InstanceSettings::sweep_ttl`]), the Region's zones (fresh for
//! [`InstanceSettings::zone_ttl`]) and the
//! network topology's memory. The door ([`AwsClient`]) only carries the
//! calls; these live here, beside the calls they cache (`io.rs`) and the one
//! invalidation ([`InstanceCache::invalidate_sweep`]).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::FutureExt;

use super::{Ec2Instance, io, topology::Topology};
use crate::aws::client::coalesce::{Batcher, SingleFlight};
use crate::aws::client::{AwsClient, CallOptions, with_deadline};
use crate::aws::{AwsError, Operation};

/// The Region's availability zones, from one `DescribeAvailabilityZones`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Zones {
    /// Zone name → zone ID (`us-east-1a` → `use1-az1`).
    pub(crate) ids: Arc<HashMap<String, String>>,
    /// Zone name → zone type (`availability-zone`, `local-zone`,
    /// `wavelength-zone`); a zone AWS gives no type for is left out.
    pub(crate) types: HashMap<String, String>,
}

/// How the instance caches keep and what the sweep asks: set by the
/// manager from flags, cloud.conf and the cluster's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceSettings {
    /// How long a cluster sweep stays fresh (`--aws-instance-sweep-ttl`).
    pub sweep_ttl: Duration,
    /// How long the zone name → zone ID map stays fresh.
    pub zone_ttl: Duration,
    /// Whether the sweep also finds instances tagged with the legacy
    /// `KubernetesCluster=<id>` tag: a second query, as long as the first
    /// when instances carry both tags (kOps). The manager sets it, as the Go
    /// CCM does, only for a cluster identified by the legacy tag.
    pub legacy_cluster_tag: bool,
    /// cloud.conf `SupportedTopologyInstanceTypePattern`: the instance
    /// types expected to have a network topology (upstream's default when
    /// `None`; see `aws::instances::topology`).
    pub topology_pattern: Option<String>,
}

impl Default for InstanceSettings {
    fn default() -> InstanceSettings {
        InstanceSettings {
            sweep_ttl: Duration::from_secs(30),
            zone_ttl: Duration::from_secs(3600),
            legacy_cluster_tag: true,
            topology_pattern: None,
        }
    }
}

/// The instance lookups and caches of one client. Clones share them.
#[derive(Clone)]
pub(crate) struct InstanceCache {
    inner: Arc<Inner>,
}

struct Inner {
    client: AwsClient,
    by_id: Batcher<String, Ec2Instance>,
    by_private_dns: Batcher<String, Ec2Instance>,
    by_private_ip: Batcher<Ipv4Addr, Vec<Ec2Instance>>,
    sweep: SingleFlight<Arc<Vec<Ec2Instance>>>,
    zones: SingleFlight<Arc<Zones>>,
    topology: Topology,
    legacy_cluster_tag: bool,
}

impl InstanceCache {
    /// The lookups of `client`, sized and timed by its options, kept as
    /// `settings` say.
    pub(crate) fn new(client: &AwsClient, settings: &InstanceSettings) -> InstanceCache {
        let core = client.core();
        let options = &core.options;
        let region = client.region();
        InstanceCache {
            inner: Arc::new(Inner {
                by_id: Batcher::new(
                    "instance_id",
                    Operation::Ec2DescribeInstances,
                    options.coalesce_window,
                    options.max_ids_per_call,
                    io::fetch_by_id(core.clone()),
                ),
                by_private_dns: Batcher::new(
                    "private_dns_name",
                    Operation::Ec2DescribeInstances,
                    options.coalesce_window,
                    options.max_dns_names_per_call,
                    io::fetch_by_private_dns(core.clone()),
                ),
                // A filter takes as many addresses as names.
                by_private_ip: Batcher::new(
                    "private_ip",
                    Operation::Ec2DescribeInstances,
                    options.coalesce_window,
                    options.max_dns_names_per_call,
                    io::fetch_by_private_ip(core.clone()),
                ),
                sweep: SingleFlight::new(Operation::Ec2DescribeInstances, settings.sweep_ttl),
                zones: SingleFlight::new(
                    Operation::Ec2DescribeAvailabilityZones,
                    settings.zone_ttl,
                ),
                topology: Topology::new(core.clone(), region, settings.topology_pattern.as_deref()),
                legacy_cluster_tag: settings.legacy_cluster_tag,
                client: client.clone(),
            }),
        }
    }

    /// One instance by ID, coalesced with concurrent lookups into one
    /// `DescribeInstances`. [`AwsError::NotFound`] when it does not exist;
    /// a terminated instance that EC2 still lists is returned (its `state`
    /// says so), because the node lifecycle controller needs to see it.
    /// `opts` bounds this caller's wait (the shared batch call goes on for
    /// the others).
    pub(crate) async fn by_id(&self, id: &str, opts: CallOptions) -> Result<Ec2Instance, AwsError> {
        let lookup = self.inner.by_id.get(id.to_string());
        let found = with_deadline(Operation::Ec2DescribeInstances, opts, lookup).await?;
        found.ok_or_else(|| AwsError::NotFound {
            operation: Operation::Ec2DescribeInstances,
            what: format!("EC2 instance {id}"),
        })
    }

    /// One live (not terminated) instance by private DNS name
    /// (`ip-10-0-0-1.ec2.internal`), coalesced like [`Self::by_id`].
    pub(crate) async fn by_private_dns(
        &self,
        name: &str,
        opts: CallOptions,
    ) -> Result<Ec2Instance, AwsError> {
        let lookup = self.inner.by_private_dns.get(name.to_string());
        let found = with_deadline(Operation::Ec2DescribeInstances, opts, lookup).await?;
        found.ok_or_else(|| AwsError::NotFound {
            operation: Operation::Ec2DescribeInstances,
            what: format!("EC2 instance with private DNS name {name}"),
        })
    }

    /// Every live (not terminated) instance whose primary private IPv4
    /// address is `ip`, in any VPC, tagged or not (empty when none),
    /// coalesced like [`Self::by_id`]. The caller judges them: this answers
    /// what EC2 has, not which one is a node's.
    pub(crate) async fn by_private_ip(
        &self,
        ip: Ipv4Addr,
        opts: CallOptions,
    ) -> Result<Vec<Ec2Instance>, AwsError> {
        let lookup = self.inner.by_private_ip.get(ip);
        let found = with_deadline(Operation::Ec2DescribeInstances, opts, lookup).await?;
        Ok(found.unwrap_or_default())
    }

    /// Every instance of the cluster (any state), by the Go CCM's rule: tag
    /// key `kubernetes.io/cluster/<id>`, or legacy tag
    /// `KubernetesCluster=<id>`. One paginated sweep (1,000 per page) serves
    /// all concurrent callers and is cached for `sweep_ttl`.
    pub(crate) async fn cluster_instances(&self) -> Result<Arc<Vec<Ec2Instance>>, AwsError> {
        let core = self.inner.client.core().clone();
        let legacy = self.inner.legacy_cluster_tag;
        self.inner
            .sweep
            .get(move || async move { core.sweep_cluster(legacy).await.map(Arc::new) }.boxed())
            .await
    }

    /// Forgets the cached sweep (after the caller changed instances, or
    /// learned the cache is stale); the next `cluster_instances` reads AWS.
    pub(crate) fn invalidate_sweep(&self) {
        self.inner.sweep.invalidate();
    }

    /// The network nodes above an instance, top layer first, from
    /// `DescribeInstanceTopology` (batched, at most 100 IDs per call).
    /// `Ok(None)` when the instance has none, or is not asked (see
    /// [`super::topology`]).
    pub(crate) async fn network_nodes(
        &self,
        id: &str,
        instance_type: Option<&str>,
    ) -> Result<Option<Vec<String>>, AwsError> {
        self.inner.topology.network_nodes(id, instance_type).await
    }

    /// Whether instances of this type are expected to have a topology
    /// (cloud.conf `SupportedTopologyInstanceTypePattern`).
    pub(crate) fn expects_topology(&self, instance_type: &str) -> bool {
        self.inner.topology.expects_topology(instance_type)
    }

    /// The Region's zones with their IDs and types, cached for `zone_ttl`.
    pub(crate) async fn zones(&self) -> Result<Arc<Zones>, AwsError> {
        let core = self.inner.client.core().clone();
        self.inner
            .zones
            .get(move || async move { core.describe_zones().await.map(Arc::new) }.boxed())
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws::client::ClientOptions;
    use crate::aws::client::test_stub::{StubEc2, StubInstance, fleet};
    use crate::aws::{Aws, AwsSettings};

    async fn client_for(stub: &StubEc2, settings: AwsSettings) -> Aws {
        Aws::new(
            stub.clients(),
            "demo".to_string(),
            ClientOptions::default(),
            settings,
        )
    }

    /// Controllers spawn their reconciles on Tokio: the client and every
    /// future it returns must be `Send`. Type-checked, never run.
    #[allow(dead_code)]
    fn client_and_its_futures_are_send(aws: &Aws) {
        fn is_send<T: Send + 'static>(_: T) {}
        fn is_send_ref<T: Send>(_: T) {}
        is_send(aws.clone());
        is_send_ref(aws.instance_by_id("i-1"));
        is_send_ref(aws.instance_by_private_dns("ip-10-0-0-1.ec2.internal"));
        is_send_ref(aws.cluster_instances());
        is_send_ref(aws.zone_ids());
        is_send_ref(aws.ec2(Operation::Ec2DescribeVpcs, |ec2| ec2.describe_vpcs().send()));
        is_send_ref(aws.elbv2(Operation::Elbv2DescribeTargetGroups, |elbv2| {
            elbv2.describe_target_groups().send()
        }));
    }

    #[tokio::test]
    async fn concurrent_lookups_by_id_coalesce_and_isolate_unknown_ids() {
        let stub = StubEc2::start(fleet(300)).await;
        let aws = client_for(&stub, AwsSettings::default()).await;
        let mut ids: Vec<String> = (0..300).map(|i| format!("i-{i:017x}")).collect();
        ids.push("i-0000000000000dead".to_string());
        let lookups = ids.iter().map(|id| {
            let aws = aws.clone();
            async move { (id.clone(), aws.instance_by_id(id).await) }
        });
        let results = futures::future::join_all(lookups).await;
        for (id, result) in results {
            if id.ends_with("dead") {
                let err = result.expect_err("unknown ID");
                assert!(err.is_not_found(), "{err}");
                assert!(err.to_string().contains("i-0000000000000dead"), "{err}");
            } else {
                assert_eq!(
                    result.expect("known ID").id,
                    id,
                    "each caller gets its own instance"
                );
            }
        }
        assert!(
            stub.calls("DescribeInstances") <= 2,
            "{} calls",
            stub.calls("DescribeInstances")
        );
        let filters = stub.describe_filters();
        assert_eq!(
            filters[0][0].0, "instance-id",
            "uses the filter, not InstanceIds"
        );
    }

    #[tokio::test]
    async fn lookups_by_private_dns_coalesce_in_bounded_batches() {
        let stub = StubEc2::start(fleet(450)).await;
        let aws = client_for(&stub, AwsSettings::default()).await;
        let names: Vec<String> = (0..450)
            .map(|i| format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250))
            .collect();
        let results =
            futures::future::join_all(names.iter().map(|name| aws.instance_by_private_dns(name)))
                .await;
        for (name, result) in names.iter().zip(results) {
            assert_eq!(
                result.expect("found").private_dns_name.as_deref(),
                Some(name.as_str())
            );
        }
        let filters = stub.describe_filters();
        assert!(
            filters.len() <= 4,
            "{} calls for 450 names in batches of 200",
            filters.len()
        );
        for call in &filters {
            let names = call
                .iter()
                .find(|(n, _)| n == "private-dns-name")
                .map(|(_, v)| v.len());
            assert!(names.is_some_and(|n| n <= 200), "{call:?}");
            assert!(
                call.iter().any(|(n, _)| n == "instance-state-name"),
                "terminated instances excluded"
            );
        }
    }

    /// Lookups by address coalesce like those by name; each address gets
    /// every live instance that has it as its primary address (two in two
    /// VPCs, say), whatever their tags, and no terminated one.
    #[tokio::test]
    async fn lookups_by_private_ip_coalesce_and_keep_every_live_instance() {
        let mut instances = fleet(450);
        instances.push(StubInstance::running("i-twin", "ip-10-0-0-7.ec2.internal"));
        let mut old = StubInstance::running("i-old", "ip-10-0-0-8.ec2.internal");
        old.state = "terminated";
        instances.push(old);
        let stub = StubEc2::start(instances).await;
        let aws = client_for(&stub, AwsSettings::default()).await;
        let ip = |i: usize| std::net::Ipv4Addr::new(10, 0, (i / 250) as u8, (i % 250) as u8);
        let mut ips: Vec<std::net::Ipv4Addr> = (0..450).map(ip).collect();
        ips.push("10.9.9.9".parse().expect("literal"));
        let results =
            futures::future::join_all(ips.iter().map(|ip| aws.instances_by_private_ip(*ip))).await;
        for (at, (asked, result)) in ips.iter().zip(results).enumerate() {
            let found: Vec<String> = result
                .expect("answered")
                .into_iter()
                .map(|i| i.id)
                .collect();
            let want: Vec<String> = match at {
                7 => vec![format!("i-{at:017x}"), "i-twin".into()],
                450 => vec![],
                _ => vec![format!("i-{at:017x}")],
            };
            assert_eq!(found, want, "{asked}");
        }
        let filters = stub.describe_filters();
        assert!(
            filters.len() <= 4,
            "{} calls for 451 addresses in batches of 200",
            filters.len()
        );
        for call in &filters {
            let ips = (call.iter())
                .find(|(n, _)| n == "private-ip-address")
                .map(|(_, v)| v.len());
            assert!(ips.is_some_and(|n| n <= 200), "{call:?}");
            assert!(
                call.iter().any(|(n, _)| n == "instance-state-name"),
                "terminated instances excluded"
            );
        }
    }

    #[tokio::test]
    async fn the_sweep_is_paginated_shared_and_cached() {
        let mut instances = fleet(2300);
        instances.push(
            StubInstance::running("i-legacy", "ip-legacy").tagged("KubernetesCluster", "demo"),
        );
        instances.push(
            StubInstance::running("i-foreign", "ip-foreign")
                .tagged("kubernetes.io/cluster/other", "owned"),
        );
        let stub = StubEc2::start(instances).await;
        let aws = client_for(&stub, AwsSettings::default()).await;
        let sweeps = futures::future::join_all((0..50).map(|_| aws.cluster_instances())).await;
        for sweep in &sweeps {
            let sweep = sweep.as_ref().expect("sweep");
            assert_eq!(
                sweep.len(),
                2301,
                "tagged and legacy-tagged, not the foreign one"
            );
            assert!(sweep.iter().any(|i| i.id == "i-legacy"));
        }
        // 3 pages of 1,000 for the tag-key query, 1 for the legacy tag.
        assert_eq!(stub.calls("DescribeInstances"), 4);
        aws.cluster_instances().await.expect("cached");
        assert_eq!(stub.calls("DescribeInstances"), 4, "served from cache");
        aws.memory().instances().invalidate_sweep();
        aws.cluster_instances().await.expect("fresh");
        assert_eq!(stub.calls("DescribeInstances"), 8);

        // A cluster identified by the current tag makes the one query.
        let aws = client_for(
            &stub,
            AwsSettings {
                instances: InstanceSettings {
                    legacy_cluster_tag: false,
                    ..InstanceSettings::default()
                },
                ..AwsSettings::default()
            },
        )
        .await;
        let sweep = aws.cluster_instances().await.expect("sweep");
        assert_eq!(sweep.len(), 2300);
        assert_eq!(
            stub.calls("DescribeInstances"),
            11,
            "3 pages, no legacy query"
        );
    }

    #[tokio::test]
    async fn zones_are_read_once() {
        let stub = StubEc2::start(Vec::new()).await;
        let aws = client_for(&stub, AwsSettings::default()).await;
        let zones = aws.zone_ids().await.expect("zones");
        assert_eq!(
            zones.get("us-east-1b").map(String::as_str),
            Some("use1-az2")
        );
        aws.zone_ids().await.expect("zones");
        assert_eq!(stub.calls("DescribeAvailabilityZones"), 1);
    }
}
