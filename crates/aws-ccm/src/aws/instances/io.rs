//! The instance calls, sent through the one door: the paginated
//! `DescribeInstances` behind the coalesced lookups (by ID, private DNS
//! name and private IP) and the cluster sweep,
//! `DescribeAvailabilityZones`, and the tag writes; the provider's
//! [`Instances`] trait on [`Aws`]. What each lookup asks is in
//! `plan.rs`.

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use aws_sdk_ec2::types::{Filter, Instance, Tag};
use futures::future::FutureExt;

use super::describe_xml;
use super::plan::{self, Interner};
use super::{Ec2Instance, RawInstance, RawInterface, Text};
use crate::aws::client::coalesce::BatchFetch;
use crate::aws::client::{CallOptions, Core};
use crate::aws::{Aws, AwsError, Operation};
use crate::provider::CloudError;
use crate::provider::instances::Instances;

impl Ec2Instance {
    /// Converts an SDK instance, sharing repeated strings through
    /// `strings`. `None` when it has no instance ID (which EC2 never sends;
    /// such an entry cannot be matched to anything).
    pub fn from_sdk(instance: &Instance, strings: &mut Interner) -> Option<Ec2Instance> {
        fn text(v: Option<&str>) -> Text<'_> {
            v.map(Cow::Borrowed)
        }
        RawInstance {
            id: text(instance.instance_id()),
            availability_zone: text(instance.placement().and_then(|p| p.availability_zone())),
            instance_type: text(instance.instance_type().map(|t| t.as_str())),
            state: text(instance.state().and_then(|s| s.name()).map(|n| n.as_str())),
            private_dns_name: text(instance.private_dns_name()),
            public_dns_name: text(instance.public_dns_name()),
            private_ip: text(instance.private_ip_address()),
            public_ip: text(instance.public_ip_address()),
            subnet_id: text(instance.subnet_id()),
            vpc_id: text(instance.vpc_id()),
            source_dest_check: instance.source_dest_check(),
            security_groups: (instance.security_groups().iter())
                .map(|g| (text(g.group_id()), text(g.group_name())))
                .collect(),
            tags: (instance.tags().iter())
                .map(|t| (text(t.key()), text(t.value())))
                .collect(),
            network_interfaces: (instance.network_interfaces().iter())
                .map(|eni| RawInterface {
                    id: text(eni.network_interface_id()),
                    status: text(eni.status().map(|s| s.as_str())),
                    device_index: eni.attachment().and_then(|a| a.device_index()),
                    private_ip: text(eni.private_ip_address()),
                    private_ips: (eni.private_ip_addresses().iter())
                        .map(|a| (text(a.private_ip_address()), a.primary().unwrap_or(false)))
                        .collect(),
                    ipv6_addresses: (eni.ipv6_addresses().iter())
                        .map(|a| text(a.ipv6_address()))
                        .collect(),
                    public_ip: text(eni.association().and_then(|a| a.public_ip())),
                })
                .collect(),
        }
        .convert(strings)
    }
}

/// The fetch of the lookups by instance ID: one `DescribeInstances` for a
/// batch of IDs.
pub(in crate::aws) fn fetch_by_id(core: Arc<Core>) -> BatchFetch<String, Ec2Instance> {
    Arc::new(move |ids: Vec<String>| {
        let core = core.clone();
        async move {
            let found = core
                .describe_instances(plan::by_id_filters(ids), CallOptions::default())
                .await?;
            Ok(found.into_iter().map(|i| (i.id.clone(), i)).collect())
        }
        .boxed()
    })
}

/// The fetch of the lookups by private DNS name: one `DescribeInstances`
/// for a batch of names, live instances only.
pub(in crate::aws) fn fetch_by_private_dns(core: Arc<Core>) -> BatchFetch<String, Ec2Instance> {
    Arc::new(move |names: Vec<String>| {
        let core = core.clone();
        async move {
            let found = core
                .describe_instances(plan::by_private_dns_filters(names), CallOptions::default())
                .await?;
            Ok((found.into_iter())
                .filter_map(|i| Some((i.private_dns_name.clone()?, i)))
                .collect())
        }
        .boxed()
    })
}

/// The fetch of the lookups by primary private IPv4 address: one
/// `DescribeInstances` for a batch of addresses, live instances only, every
/// instance of an address kept (the node controller's proof needs to know
/// when there are two).
pub(in crate::aws) fn fetch_by_private_ip(
    core: Arc<Core>,
) -> BatchFetch<Ipv4Addr, Vec<Ec2Instance>> {
    Arc::new(move |ips: Vec<Ipv4Addr>| {
        let core = core.clone();
        async move {
            let found = core
                .describe_instances(plan::by_private_ip_filters(&ips), CallOptions::default())
                .await?;
            Ok(plan::group_by_private_ip(&ips, found))
        }
        .boxed()
    })
}

impl Core {
    /// Paginated, filtered `DescribeInstances` (1,000 per page), converted.
    /// Pages are decoded by [`describe_xml::SlimDecoder`] straight into
    /// instances; a page it hands back to the SDK is converted from the
    /// SDK's model.
    pub(in crate::aws) async fn describe_instances(
        &self,
        filters: Vec<Filter>,
        opts: CallOptions,
    ) -> Result<Vec<Ec2Instance>, AwsError> {
        let mut out = Vec::new();
        // Strings shared by the pages the SDK decodes (the slim decoder
        // shares within each page it reads).
        let mut strings = Interner::default();
        let mut next_token: Option<String> = None;
        loop {
            let slot = describe_xml::Slot::default();
            // Every caller of this serves many callers of its own (a
            // coalesced batch, the sweep): it goes ahead of single calls.
            let page = self
                .shared_ec2(Operation::Ec2DescribeInstances, opts, |ec2| {
                    ec2.describe_instances()
                        .set_filters(Some(filters.clone()))
                        .max_results(1000)
                        .set_next_token(next_token.clone())
                        .customize()
                        .interceptor(describe_xml::SlimDecoder::new(slot.clone()))
                        .send()
                })
                .await?;
            match slot.take() {
                Some(decoded) => out.extend(decoded.instances),
                None => out.extend(
                    page.reservations()
                        .iter()
                        .flat_map(|r| r.instances())
                        .filter_map(|i| Ec2Instance::from_sdk(i, &mut strings)),
                ),
            }
            match page.next_token() {
                Some(token) if !token.is_empty() => next_token = Some(token.to_string()),
                _ => {
                    // The sweep keeps this for a refresh period: not the
                    // doubling's spare capacity with it.
                    out.shrink_to_fit();
                    return Ok(out);
                }
            }
        }
    }

    /// The cluster's instances by its tag key, and by the legacy
    /// `KubernetesCluster` tag too with `legacy`.
    pub(in crate::aws) async fn sweep_cluster(
        &self,
        legacy: bool,
    ) -> Result<Vec<Ec2Instance>, AwsError> {
        let found = self
            .describe_instances(
                plan::sweep_filters(&self.cluster_id),
                CallOptions::default(),
            )
            .await?;
        let legacy = if legacy {
            self.describe_instances(
                plan::legacy_sweep_filters(&self.cluster_id),
                CallOptions::default(),
            )
            .await?
        } else {
            Vec::new()
        };
        Ok(plan::merge_sweep(found, legacy))
    }

    pub(in crate::aws) async fn describe_zones(
        &self,
    ) -> Result<crate::aws::instances::cache::Zones, AwsError> {
        let out = self
            .shared_ec2(
                Operation::Ec2DescribeAvailabilityZones,
                CallOptions::default(),
                |ec2| ec2.describe_availability_zones().send(),
            )
            .await?;
        let zones = out.availability_zones();
        Ok(crate::aws::instances::cache::Zones {
            ids: Arc::new(
                zones
                    .iter()
                    .filter_map(|z| Some((z.zone_name()?.to_string(), z.zone_id()?.to_string())))
                    .collect(),
            ),
            types: zones
                .iter()
                .filter_map(|z| Some((z.zone_name()?.to_string(), z.zone_type()?.to_string())))
                .collect(),
        })
    }
}

fn not_found_is_none(
    result: Result<Ec2Instance, AwsError>,
) -> Result<Option<Ec2Instance>, CloudError> {
    match result {
        Ok(instance) => Ok(Some(instance)),
        Err(err) if err.is_not_found() => Ok(None),
        Err(err) => Err(err.into()),
    }
}

fn sdk_tags(tags: &[(String, String)]) -> Vec<Tag> {
    tags.iter()
        .map(|(k, v)| Tag::builder().key(k).value(v).build())
        .collect()
}

impl Instances for Aws {
    async fn instance_by_id(&self, id: &str) -> Result<Option<Ec2Instance>, CloudError> {
        not_found_is_none(Aws::instance_by_id(self, id).await)
    }

    async fn instance_by_private_dns(&self, name: &str) -> Result<Option<Ec2Instance>, CloudError> {
        not_found_is_none(Aws::instance_by_private_dns(self, name).await)
    }

    async fn instances_by_private_ip(&self, ip: Ipv4Addr) -> Result<Vec<Ec2Instance>, CloudError> {
        Ok(Aws::instances_by_private_ip(self, ip).await?)
    }

    async fn cluster_instances(&self) -> Result<Arc<Vec<Ec2Instance>>, CloudError> {
        Ok(Aws::cluster_instances(self).await?)
    }

    async fn zone_ids(&self) -> Result<Arc<HashMap<String, String>>, CloudError> {
        Ok(Aws::zone_ids(self).await?)
    }

    async fn network_nodes(
        &self,
        id: &str,
        instance_type: Option<&str>,
    ) -> Result<Option<Vec<String>>, CloudError> {
        Ok(self
            .memory()
            .instances()
            .network_nodes(id, instance_type)
            .await?)
    }

    fn expects_topology(&self, instance_type: &str) -> bool {
        self.memory().instances().expects_topology(instance_type)
    }

    async fn create_tags(
        &self,
        ids: &[String],
        tags: &[(String, String)],
    ) -> Result<(), CloudError> {
        let ids = ids.to_vec();
        let tags = sdk_tags(tags);
        self.ec2(Operation::Ec2CreateTags, |ec2| {
            ec2.create_tags()
                .set_resources(Some(ids.clone()))
                .set_tags(Some(tags.clone()))
                .send()
        })
        .await?;
        Ok(())
    }

    async fn delete_tags(
        &self,
        ids: &[String],
        tags: &[(String, String)],
    ) -> Result<(), CloudError> {
        let ids = ids.to_vec();
        let tags = sdk_tags(tags);
        self.ec2(Operation::Ec2DeleteTags, |ec2| {
            ec2.delete_tags()
                .set_resources(Some(ids.clone()))
                .set_tags(Some(tags.clone()))
                .send()
        })
        .await?;
        Ok(())
    }
}
