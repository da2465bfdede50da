//! Subnets for load balancers: the annotation (IDs or Name tags) or upstream's
//! auto-discovery, as a pure choice over one read of subnets and route tables.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use parking_lot::Mutex;

use super::client::AwsClient;
use super::client::coalesce::SingleFlight;
use super::client::errors::AwsError;
use super::client::operations::Operation;
use super::instances::filter;
use super::tags;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Subnet {
    pub(crate) id: String,
    pub(crate) availability_zone: String,
    pub(crate) tags: BTreeMap<String, String>,
    /// Its route table (explicit, else the VPC's main one) routes to an internet gateway.
    pub(crate) public: bool,
    pub(crate) cidr: Option<ipnet::Ipv4Net>,
}

/// The subnet [`discover`] falls back to, as upstream's `selfAWSInstance`
/// has it: cloud.conf `SubnetID` when cloud.conf names the `VPC` with
/// `SubnetID` or `RoleARN` and the cluster ID (the Go CCM then runs
/// outside the VPC and never asks the metadata service), else the subnet
/// of the instance this CCM runs on, read once from the instance metadata
/// service. `None` when neither is known.
async fn own_subnet(cloud: &crate::cloud_config::CloudConfig) -> Option<String> {
    static FROM_METADATA: tokio::sync::OnceCell<Option<String>> =
        tokio::sync::OnceCell::const_new();
    let outside = cloud.vpc.is_some()
        && (cloud.subnet_id.is_some() || cloud.role_arn.is_some())
        && cloud.cluster_id().is_some();
    if outside {
        return cloud.subnet_id.clone();
    }
    FROM_METADATA
        .get_or_init(|| async {
            crate::aws::client::clients::imds::subnet_id(cloud.imds_endpoint())
                .await
                .map_err(|e| tracing::debug!(error = %e, "no subnet of this instance for the subnet fallback"))
                .ok()
        })
        .await
        .clone()
}

/// Whether [`discover`] over `subnets` needs [`own_subnet`]: no subnet is
/// this cluster's or of no cluster.
fn needs_own_subnet(subnets: &[Subnet], cluster_id: &str) -> bool {
    !subnets.iter().any(|s| is_candidate(s, cluster_id))
}

/// Upstream's discovery over the VPC's `subnets` ([`discover`]), asking
/// for [`own_subnet`] only when the fallback is taken. The flag says
/// whether it was.
pub(crate) async fn discover_with_fallback(
    subnets: &[Subnet],
    internal: bool,
    cluster_id: &str,
    zone_types: &HashMap<String, String>,
    cloud: &crate::cloud_config::CloudConfig,
) -> (Vec<String>, bool) {
    let fell_back = needs_own_subnet(subnets, cluster_id);
    let own = if fell_back {
        own_subnet(cloud).await
    } else {
        None
    };
    let chosen = discover(subnets, internal, cluster_id, zone_types, own.as_deref());
    (chosen, fell_back)
}

/// A route table reduced to what discovery needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct RouteTable {
    subnet_ids: BTreeSet<String>,
    main: bool,
    has_internet_gateway: bool,
}

/// Whether `subnet_id` routes to an internet gateway (`igw-*`), through its own
/// route table or, without one, the VPC's main table.
fn is_public(tables: &[RouteTable], subnet_id: &str) -> bool {
    tables
        .iter()
        .find(|t| t.subnet_ids.contains(subnet_id))
        .or_else(|| tables.iter().find(|t| t.main))
        .is_some_and(|t| t.has_internet_gateway)
}

/// The zone type of a regular availability zone; Local Zones
/// (`local-zone`) and Wavelength Zones (`wavelength-zone`) take no classic
/// ELB or NLB.
pub(crate) const REGULAR_ZONE: &str = "availability-zone";

/// Upstream's `hasClusterTag`: the cluster tag (any value) or the legacy
/// `KubernetesCluster=<id>`; every subnet when the cluster ID is empty
/// (`--allow-untagged-cloud`).
fn is_clusters(tags: &BTreeMap<String, String>, cluster_id: &str) -> bool {
    cluster_id.is_empty()
        || tags::has_cluster_tag(tags, cluster_id)
        || tags.get(tags::LEGACY_CLUSTER_TAG).map(String::as_str) == Some(cluster_id)
}

/// Upstream's `findSubnets` filter: this cluster's subnets and those of no
/// cluster (no `kubernetes.io/cluster/` tag at all).
fn is_candidate(subnet: &Subnet, cluster_id: &str) -> bool {
    is_clusters(&subnet.tags, cluster_id)
        || !(subnet.tags.keys()).any(|k| k.starts_with(tags::CLUSTER_TAG_PREFIX))
}

/// Upstream's `findELBSubnets` whole: [`one_per_zone`]'s rule over this
/// cluster's and unclaimed subnets; only when there are none at all (every
/// subnet of the VPC is another cluster's), over `own_subnet` alone: the
/// subnet of the instance the Go CCM runs on, or cloud.conf `SubnetID`
/// when it runs outside the cluster's account (`VPC` set). The fallback
/// goes through the same public and zone filters; candidates that exist
/// but do not fit (private subnets for an internet-facing load balancer,
/// Local Zones) are not a reason to fall back.
fn discover(
    subnets: &[Subnet],
    internal: bool,
    cluster_id: &str,
    zone_types: &HashMap<String, String>,
    own_subnet: Option<&str>,
) -> Vec<String> {
    let mut candidates: Vec<&Subnet> = (subnets.iter())
        .filter(|s| is_candidate(s, cluster_id))
        .collect();
    if candidates.is_empty() {
        candidates = (subnets.iter())
            .filter(|s| Some(s.id.as_str()) == own_subnet)
            .collect();
    }
    one_per_zone(&candidates, internal, cluster_id, zone_types)
}

/// Upstream's choice among the candidate subnets, one per zone;
/// internet-facing load balancers only in public subnets; none in a zone
/// whose type (`zone_types`, zone name → type) is known and not a regular
/// availability zone (a zone without a known type is kept, as upstream).
/// Ties in a zone go to the role tag, then this cluster's tag, then the
/// lowest ID. Sorted by zone.
fn one_per_zone(
    candidates: &[&Subnet],
    internal: bool,
    cluster_id: &str,
    zone_types: &HashMap<String, String>,
) -> Vec<String> {
    let role = if internal {
        tags::ROLE_INTERNAL_ELB
    } else {
        tags::ROLE_ELB
    };
    let rank = |s: &Subnet| {
        (
            !s.tags.contains_key(role),
            !is_clusters(&s.tags, cluster_id),
            s.id.clone(),
        )
    };
    let mut by_zone: BTreeMap<&str, &Subnet> = BTreeMap::new();
    for &s in candidates {
        // Upstream ignores a subnet with an empty zone or ID.
        if s.availability_zone.is_empty() || s.id.is_empty() || (!internal && !s.public) {
            continue;
        }
        let best = by_zone.entry(&s.availability_zone).or_insert(s);
        if rank(s) < rank(best) {
            *best = s;
        }
    }
    by_zone
        .into_iter()
        .filter(|(zone, _)| zone_types.get(*zone).is_none_or(|t| t == REGULAR_ZONE))
        .map(|(_, s)| s.id.clone())
        .collect()
}

/// Each subnet matching `filters` (with an ID), not yet marked public.
async fn describe_subnets(
    aws: &AwsClient,
    filters: Vec<aws_sdk_ec2::types::Filter>,
) -> Result<Vec<Subnet>, AwsError> {
    let out = aws
        .ec2(Operation::Ec2DescribeSubnets, |c| {
            c.describe_subnets()
                .set_filters(Some(filters.clone()))
                .send()
        })
        .await?;
    Ok(out
        .subnets()
        .iter()
        .filter_map(|s| {
            Some(Subnet {
                id: s.subnet_id()?.to_string(),
                availability_zone: s.availability_zone().unwrap_or_default().to_string(),
                tags: tags::from_ec2(s.tags()),
                public: false,
                cidr: s.cidr_block().and_then(|c| c.parse().ok()),
            })
        })
        .collect())
}

/// Subnets of the VPC with their public/private status: two reads.
pub(crate) async fn vpc_subnets(aws: &AwsClient, vpc_id: &str) -> Result<Vec<Subnet>, AwsError> {
    let mut subnets = describe_subnets(aws, vec![filter("vpc-id", [vpc_id])]).await?;
    let out = aws
        .ec2(Operation::Ec2DescribeRouteTables, |c| {
            c.describe_route_tables()
                .filters(filter("vpc-id", [vpc_id]))
                .send()
        })
        .await?;
    let tables: Vec<RouteTable> = out
        .route_tables()
        .iter()
        .map(|t| RouteTable {
            subnet_ids: t
                .associations()
                .iter()
                .filter_map(|a| a.subnet_id().map(str::to_string))
                .collect(),
            main: t.associations().iter().any(|a| a.main().unwrap_or(false)),
            has_internet_gateway: t
                .routes()
                .iter()
                .any(|r| r.gateway_id().is_some_and(|g| g.starts_with("igw"))),
        })
        .collect();
    for subnet in &mut subnets {
        subnet.public = is_public(&tables, &subnet.id);
    }
    Ok(subnets)
}

/// The VPC's subnets (with their public/private status and CIDRs) as every
/// Service sync sees them: read once per `ttl` per VPC and shared, so a
/// resync of 1,000 Services costs two EC2 reads per `ttl` instead of two
/// per Service. A sync that fails drops the cache ([`SubnetCache::invalidate`]):
/// its retry sees subnets as they are now.
#[derive(Clone)]
pub(crate) struct SubnetCache {
    ttl: Duration,
    vpcs: Arc<Mutex<HashMap<String, SubnetFlight>>>,
}

type SubnetFlight = SingleFlight<Arc<Vec<Subnet>>>;

impl SubnetCache {
    pub(crate) fn new(ttl: Duration) -> SubnetCache {
        SubnetCache {
            ttl,
            vpcs: Arc::default(),
        }
    }

    pub(crate) async fn vpc_subnets(
        &self,
        aws: &AwsClient,
        vpc_id: &str,
    ) -> Result<Arc<Vec<Subnet>>, AwsError> {
        let flight = self
            .vpcs
            .lock()
            .entry(vpc_id.to_string())
            .or_insert_with(|| SingleFlight::new(Operation::Ec2DescribeSubnets, self.ttl))
            .clone();
        let (aws, vpc_id) = (aws.clone(), vpc_id.to_string());
        flight
            .get(move || async move { vpc_subnets(&aws, &vpc_id).await.map(Arc::new) }.boxed())
            .await
    }

    /// IPv4 CIDR blocks of `ids`: from the cached VPC view when it has them
    /// all, else one read.
    pub(crate) async fn cidrs(
        &self,
        aws: &AwsClient,
        vpc_id: &str,
        ids: &[String],
    ) -> Result<Vec<ipnet::Ipv4Net>, AwsError> {
        let known = self.vpc_subnets(aws, vpc_id).await?;
        let cached: Option<Vec<ipnet::Ipv4Net>> = ids
            .iter()
            .map(|id| known.iter().find(|s| &s.id == id).and_then(|s| s.cidr))
            .collect();
        match cached {
            Some(cidrs) => Ok(cidrs),
            None => cidrs(aws, ids).await,
        }
    }

    pub(crate) fn invalidate(&self) {
        for flight in self.vpcs.lock().values() {
            flight.invalidate();
        }
    }
}

/// IPv4 CIDR blocks of the given subnets (one read).
async fn cidrs(aws: &AwsClient, ids: &[String]) -> Result<Vec<ipnet::Ipv4Net>, AwsError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let subnets = describe_subnets(aws, vec![filter("subnet-id", ids.to_vec())]).await?;
    Ok(subnets.into_iter().filter_map(|s| s.cidr).collect())
}

/// Resolves the `subnets` annotation (IDs and Name tags) to IDs; `Err(missing)`
/// names the entries that match nothing.
pub(crate) async fn resolve(
    aws: &AwsClient,
    vpc_id: &str,
    names_or_ids: &[String],
) -> Result<Result<Vec<String>, Vec<String>>, AwsError> {
    let (ids, names): (Vec<String>, Vec<String>) = names_or_ids
        .iter()
        .cloned()
        .partition(|s| s.starts_with("subnet-"));
    let mut found: BTreeMap<String, String> = BTreeMap::new(); // key (id or name) -> id
    if !ids.is_empty() {
        for s in describe_subnets(aws, vec![filter("subnet-id", ids.clone())]).await? {
            found.insert(s.id.clone(), s.id);
        }
    }
    if !names.is_empty() {
        let filters = vec![
            filter("tag:Name", names.clone()),
            filter("vpc-id", [vpc_id]),
        ];
        for s in describe_subnets(aws, filters).await? {
            if let Some(name) = s.tags.get("Name") {
                found.insert(name.clone(), s.id);
            }
        }
    }
    let missing: Vec<String> = names_or_ids
        .iter()
        .filter(|k| !found.contains_key(*k))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Ok(Err(missing));
    }
    let mut out: Vec<String> = names_or_ids.iter().map(|k| found[k].clone()).collect();
    out.sort();
    out.dedup();
    Ok(Ok(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`discover`] without the fallback.
    fn choose(
        subnets: &[Subnet],
        internal: bool,
        cluster_id: &str,
        zone_types: &HashMap<String, String>,
    ) -> Vec<String> {
        discover(subnets, internal, cluster_id, zone_types, None)
    }

    #[tokio::test]
    async fn the_own_subnet_is_cloud_confs_only_when_cloud_conf_names_the_vpc() {
        let cloud = crate::cloud_config::CloudConfig {
            vpc: Some("vpc-1".into()),
            subnet_id: Some("subnet-a".into()),
            kubernetes_cluster_id: Some("c1".into()),
            ..Default::default()
        };
        assert_eq!(own_subnet(&cloud).await.as_deref(), Some("subnet-a"));
        let others = [subnet(
            "subnet-a",
            "az1",
            true,
            &[("kubernetes.io/cluster/other", "owned")],
        )];
        assert!(needs_own_subnet(&others, "c1"));
        let unclaimed = [subnet("subnet-a", "az1", true, &[])];
        assert!(!needs_own_subnet(&unclaimed, "c1"));
    }

    fn subnet(id: &str, az: &str, public: bool, tags: &[(&str, &str)]) -> Subnet {
        Subnet {
            cidr: None,
            id: id.into(),
            availability_zone: az.into(),
            public,
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn one_per_zone_preferring_role_then_cluster_tag_then_lowest_id() {
        let c = "kubernetes.io/cluster/c1";
        let subnets = vec![
            subnet("subnet-b", "az1", true, &[]),
            subnet("subnet-a", "az1", true, &[]),
            subnet("subnet-z", "az2", true, &[(c, "shared")]),
            subnet("subnet-y", "az2", true, &[]),
            subnet("subnet-r", "az3", true, &[(tags::ROLE_ELB, "1")]),
            subnet("subnet-q", "az3", true, &[(c, "owned")]),
            subnet(
                "subnet-o",
                "az4",
                true,
                &[("kubernetes.io/cluster/other", "owned")],
            ),
            subnet("subnet-p", "az5", false, &[(tags::ROLE_ELB, "1")]),
        ];
        assert_eq!(
            choose(&subnets, false, "c1", &HashMap::new()),
            vec!["subnet-a", "subnet-z", "subnet-r"]
        );
        // Internal: private subnets count; the internal role tag decides.
        let internal = vec![
            subnet("subnet-1", "az1", false, &[]),
            subnet("subnet-2", "az1", true, &[(tags::ROLE_INTERNAL_ELB, "1")]),
        ];
        assert_eq!(
            choose(&internal, true, "c1", &HashMap::new()),
            vec!["subnet-2"]
        );
        assert!(choose(&internal[..1], false, "c1", &HashMap::new()).is_empty());
    }

    #[test]
    fn local_and_wavelength_zones_are_skipped_and_untyped_zones_kept() {
        let subnets = vec![
            subnet("subnet-a", "us-east-1a", true, &[]),
            subnet(
                "subnet-l",
                "us-east-1-bos-1a",
                true,
                &[(tags::ROLE_ELB, "1")],
            ),
            subnet("subnet-w", "us-east-1-wl1-bos-wlz-1", true, &[]),
            subnet("subnet-u", "us-east-1x", true, &[]),
        ];
        let types: HashMap<String, String> = [
            ("us-east-1a", REGULAR_ZONE),
            ("us-east-1-bos-1a", "local-zone"),
            ("us-east-1-wl1-bos-wlz-1", "wavelength-zone"),
        ]
        .into_iter()
        .map(|(z, t)| (z.to_string(), t.to_string()))
        .collect();
        assert_eq!(
            choose(&subnets, false, "c1", &types),
            vec!["subnet-a", "subnet-u"]
        );
        // Without zone types (none known), every zone counts.
        assert_eq!(choose(&subnets, false, "c1", &HashMap::new()).len(), 4);
    }

    #[test]
    fn public_means_an_internet_gateway_route_on_own_or_main_table() {
        let tables = vec![
            RouteTable {
                subnet_ids: BTreeSet::from(["subnet-priv".to_string()]),
                main: false,
                has_internet_gateway: false,
            },
            RouteTable {
                subnet_ids: BTreeSet::new(),
                main: true,
                has_internet_gateway: true,
            },
        ];
        assert!(!is_public(&tables, "subnet-priv"));
        assert!(is_public(&tables, "subnet-other"));
    }

    #[test]
    fn discover_falls_back_to_the_own_subnet_only_when_no_subnet_is_ours_or_unclaimed() {
        let other = [("kubernetes.io/cluster/other", "owned")];
        let types: HashMap<String, String> =
            HashMap::from([("lz".to_string(), "local-zone".to_string())]);
        let all_others = [
            subnet("subnet-a", "az1", true, &other),
            subnet("subnet-b", "az2", false, &other),
            subnet("subnet-l", "lz", true, &other),
        ];
        let d = |subnets: &[Subnet], internal, own| discover(subnets, internal, "c1", &types, own);
        assert_eq!(d(&all_others, false, Some("subnet-a")), ["subnet-a"]);
        // The fallback meets the same filters: public for internet-facing,
        // no Local Zone.
        assert!(d(&all_others, false, Some("subnet-b")).is_empty());
        assert_eq!(d(&all_others, true, Some("subnet-b")), ["subnet-b"]);
        assert!(d(&all_others, true, Some("subnet-l")).is_empty());
        assert!(d(&all_others, true, None).is_empty());
        // One unclaimed subnet, even a private one: no fallback at all.
        let mut with_unclaimed = all_others.to_vec();
        with_unclaimed.push(subnet("subnet-p", "az3", false, &[]));
        assert!(d(&with_unclaimed, false, Some("subnet-a")).is_empty());
        assert_eq!(d(&with_unclaimed, true, Some("subnet-a")), ["subnet-p"]);
    }

    #[test]
    fn an_untagged_vpc_is_discovered_like_the_go_ccm_does() {
        // No cluster or role tags anywhere: every subnet is unclaimed.
        let untagged = [
            subnet("subnet-b", "az1", true, &[("Name", "b")]),
            subnet("subnet-a", "az1", true, &[]),
            subnet("subnet-c", "az2", false, &[]),
            subnet("subnet-d", "az3", true, &[]),
        ];
        assert_eq!(
            discover(&untagged, false, "c1", &HashMap::new(), None),
            ["subnet-a", "subnet-d"]
        );
        assert_eq!(
            discover(&untagged, true, "c1", &HashMap::new(), None),
            ["subnet-a", "subnet-c", "subnet-d"]
        );
    }

    #[test]
    fn the_legacy_tag_and_an_untagged_cloud_count_as_ours() {
        let subnets = [
            subnet("subnet-a", "az1", true, &[]),
            subnet("subnet-b", "az1", true, &[(tags::LEGACY_CLUSTER_TAG, "c1")]),
            subnet(
                "subnet-o",
                "az2",
                true,
                &[("kubernetes.io/cluster/other", "owned")],
            ),
        ];
        // KubernetesCluster=c1 wins the tie as upstream's hasClusterTag.
        assert_eq!(choose(&subnets, false, "c1", &HashMap::new()), ["subnet-b"]);
        // A legacy tag of another cluster is no kubernetes.io/cluster/ tag:
        // unclaimed, as upstream.
        let legacy_other = [subnet(
            "subnet-x",
            "az1",
            true,
            &[(tags::LEGACY_CLUSTER_TAG, "c2")],
        )];
        assert_eq!(
            choose(&legacy_other, false, "c1", &HashMap::new()),
            ["subnet-x"]
        );
        // No cluster ID (--allow-untagged-cloud): every subnet is ours.
        assert_eq!(
            choose(&subnets, false, "", &HashMap::new()),
            ["subnet-a", "subnet-o"]
        );
    }
}
