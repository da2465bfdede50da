//! Routes: the route tables and routes the route controller manages, the
//! [`Routes`] trait it talks to, that trait on [`AwsClient`], and an
//! in-memory cloud for unit tests ([`FakeRoutes`]).
//!
//! Everything here is parsed at the door: destinations are [`IpNet`]s,
//! targets an enum, so the controller's plan never looks at SDK types.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use aws_sdk_ec2::types::{AttributeBooleanValue, Filter};
use ipnet::IpNet;
use parking_lot::Mutex;

use crate::aws::permissions::{Action, Denial, Probe, Tagging, Verdict};
use crate::aws::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG, cluster_tag_key};
use crate::aws::{AwsClient, AwsError, ErrorClass, Operation};

/// Where a route sends traffic.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RouteTarget {
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
pub struct Route {
    /// IPv4 or IPv6 destination; `None` for prefix-list destinations.
    pub destination: Option<IpNet>,
    pub target: RouteTarget,
    /// AWS state `blackhole`: the target is gone or stopped.
    pub blackhole: bool,
    /// Propagated by a virtual private gateway: cannot be changed by route
    /// calls, and does not count against the route table quota.
    pub propagated: bool,
}

/// A route table with its routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTable {
    pub id: String,
    pub vpc_id: Option<String>,
    pub routes: Vec<Route>,
    /// How the table is marked as the cluster's: the least-privilege policy
    /// grants route writes only on `kubernetes.io/cluster/<id>` tables.
    pub tagging: Tagging,
    /// The owning account (for the ARN in a permission message).
    pub owner_id: Option<String>,
}

impl RouteTable {
    /// Routes that count against AWS's "routes per route table" quota.
    pub fn counted_routes(&self) -> usize {
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
    pub fn matches_tags<'a>(&self, mut tags: impl Iterator<Item = (&'a str, &'a str)>) -> bool {
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
    pub id: String,
    /// `Some(false)` once source/destination checking is off (needed for the
    /// instance to forward pod traffic it is not the address of).
    pub source_dest_check: Option<bool>,
    /// Terminated or shutting down: routes to it cannot be created.
    pub terminated: bool,
    /// How the instance is marked as the cluster's (the policy grants
    /// ModifyInstanceAttribute only on `kubernetes.io/cluster/<id>` ones).
    pub tagging: Tagging,
}

/// What kind of failure a [`RoutesError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutesErrorKind {
    /// The object named does not exist (already deleted, or not visible yet).
    NotFound,
    /// The route already exists (a create retried after an ambiguous failure,
    /// or created by someone else meanwhile).
    AlreadyExists,
    /// Worth retrying later: throttling, 5xx, timeouts.
    Transient,
    /// Repeating will not help: permissions, quotas, invalid values.
    Permanent,
    /// Not attempted: IAM denies it (a DryRun said so); the message names
    /// the tag to add or the policy option that grants it.
    Refused,
}

/// A failed route call, with a message that says what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RoutesError {
    pub kind: RoutesErrorKind,
    /// The AWS error code, when AWS sent one (`RouteLimitExceeded`, ...).
    pub code: Option<String>,
    pub message: String,
}

impl RoutesError {
    pub fn new(
        kind: RoutesErrorKind,
        code: Option<&str>,
        message: impl Into<String>,
    ) -> RoutesError {
        RoutesError {
            kind,
            code: code.map(str::to_string),
            message: message.into(),
        }
    }
}

impl From<AwsError> for RoutesError {
    fn from(err: AwsError) -> RoutesError {
        let kind = if err.is_already_exists() {
            RoutesErrorKind::AlreadyExists
        } else {
            match err.class() {
                ErrorClass::NotFound => RoutesErrorKind::NotFound,
                ErrorClass::Throttling | ErrorClass::Transient => RoutesErrorKind::Transient,
                ErrorClass::Fatal => RoutesErrorKind::Permanent,
            }
        };
        // EC2 answers DeleteRoute for a missing route with
        // `InvalidRoute.NotFound`, which the class above already covers.
        RoutesError {
            kind,
            code: err.code().map(str::to_string),
            message: err.to_string(),
        }
    }
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
    ) -> impl Future<Output = Result<Vec<RouteTable>, RoutesError>> + Send;

    /// The instances among `ids` that exist; missing IDs are left out.
    fn instances(
        &self,
        ids: &[String],
    ) -> impl Future<Output = Result<HashMap<String, TargetInstance>, RoutesError>> + Send;

    /// Turns source/destination checking off on an instance.
    fn disable_source_dest_check(
        &self,
        instance_id: &str,
    ) -> impl Future<Output = Result<(), RoutesError>> + Send;

    fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> impl Future<Output = Result<(), RoutesError>> + Send;

    /// Points an existing route (a blackhole, or a stale target) at `instance_id`.
    fn replace_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> impl Future<Output = Result<(), RoutesError>> + Send;

    fn delete_route(
        &self,
        table_id: &str,
        destination: IpNet,
    ) -> impl Future<Output = Result<(), RoutesError>> + Send;

    /// Whether IAM allows the write `probe` stands for: a DryRun, its
    /// verdict kept per (action, resource) for a while.
    fn permission(&self, probe: &Probe, tagging: Tagging) -> impl Future<Output = Verdict> + Send;
}

fn parse_route(route: &aws_sdk_ec2::types::Route) -> Route {
    let destination = route
        .destination_cidr_block()
        .or(route.destination_ipv6_cidr_block())
        .and_then(|d| d.parse::<IpNet>().ok())
        .map(|d| d.trunc());
    let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
    let target = if let Some(id) = non_empty(route.instance_id()) {
        RouteTarget::Instance(id)
    } else if route.gateway_id() == Some("local") {
        RouteTarget::Local
    } else if let Some(eni) = non_empty(route.network_interface_id()) {
        RouteTarget::NetworkInterface(eni)
    } else if let Some(gw) = [
        route.gateway_id(),
        route.nat_gateway_id(),
        route.transit_gateway_id(),
        route.vpc_peering_connection_id(),
        route.egress_only_internet_gateway_id(),
        route.carrier_gateway_id(),
        route.local_gateway_id(),
        route.core_network_arn(),
    ]
    .into_iter()
    .find_map(non_empty)
    {
        RouteTarget::Gateway(gw)
    } else {
        RouteTarget::None
    };
    Route {
        destination,
        target,
        blackhole: route.state().map(|s| s.as_str()) == Some("blackhole"),
        propagated: route.origin().map(|o| o.as_str()) == Some("EnableVgwRoutePropagation"),
    }
}

fn filter(name: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Filter {
    crate::aws::instances::filter(name, values)
}

impl Routes for AwsClient {
    async fn route_tables(
        &self,
        selector: &RouteTableSelector,
    ) -> Result<Vec<RouteTable>, RoutesError> {
        let mut filters = Vec::new();
        match &selector.route_table_id {
            Some(id) => filters.push(filter("route-table-id", [id.clone()])),
            None => {
                // Either tag marks a cluster table; EC2 ORs the values of one
                // filter, and the legacy tag's value is checked below.
                filters.push(filter(
                    "tag-key",
                    [
                        cluster_tag_key(&selector.cluster_id),
                        LEGACY_CLUSTER_TAG.to_string(),
                    ],
                ));
                if let Some(vpc) = &selector.vpc_id {
                    filters.push(filter("vpc-id", [vpc.clone()]));
                }
            }
        }
        let mut tables = Vec::new();
        let mut next_token: Option<String> = None;
        loop {
            let page = self
                .ec2(Operation::Ec2DescribeRouteTables, |ec2| {
                    ec2.describe_route_tables()
                        .set_filters(Some(filters.clone()))
                        .set_next_token(next_token.clone())
                        .send()
                })
                .await?;
            for table in page.route_tables() {
                let Some(id) = table.route_table_id() else {
                    continue;
                };
                self.permissions().learn_account(table.owner_id());
                if selector.route_table_id.is_none()
                    && !selector.matches_tags(
                        table
                            .tags()
                            .iter()
                            .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default()))),
                    )
                {
                    continue;
                }
                tables.push(RouteTable {
                    id: id.to_string(),
                    vpc_id: table.vpc_id().map(str::to_string),
                    routes: table.routes().iter().map(parse_route).collect(),
                    tagging: Tagging::of(
                        &selector.cluster_id,
                        table
                            .tags()
                            .iter()
                            .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default()))),
                    ),
                    owner_id: table.owner_id().map(str::to_string),
                });
            }
            match page.next_token() {
                Some(token) if !token.is_empty() => next_token = Some(token.to_string()),
                _ => break,
            }
        }
        tables.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tables)
    }

    async fn instances(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, TargetInstance>, RoutesError> {
        let cluster_id = self.cluster_id();
        let to_target = |i: &crate::aws::Ec2Instance| TargetInstance {
            id: i.id.clone(),
            source_dest_check: i.source_dest_check,
            terminated: i.state.is_terminated(),
            tagging: Tagging::of(cluster_id, i.tags.iter()),
        };
        // The shared, cached sweep of the cluster's instances answers most
        // lookups without a call of our own.
        let sweep = self.cluster_instances().await?;
        let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut found: HashMap<String, TargetInstance> = sweep
            .iter()
            .filter(|i| wanted.contains(i.id.as_str()))
            .map(|i| (i.id.clone(), to_target(i)))
            .collect();
        // Untagged instances, or ones launched after the sweep: single
        // lookups, which the client coalesces into one DescribeInstances.
        let missing: Vec<&String> = ids.iter().filter(|id| !found.contains_key(*id)).collect();
        let lookups = missing.iter().map(|id| self.instance_by_id(id));
        for result in futures::future::join_all(lookups).await {
            match result {
                Ok(instance) => {
                    found.insert(instance.id.clone(), to_target(&instance));
                }
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(found)
    }

    async fn disable_source_dest_check(&self, instance_id: &str) -> Result<(), RoutesError> {
        self.ec2(Operation::Ec2ModifyInstanceAttribute, |ec2| {
            ec2.modify_instance_attribute()
                .instance_id(instance_id)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                .send()
        })
        .await?;
        // The cached sweep still says "on"; the next read must see the change.
        self.invalidate_sweep();
        Ok(())
    }

    async fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> Result<(), RoutesError> {
        self.ec2(Operation::Ec2CreateRoute, |ec2| {
            create_route_request(&ec2, table_id, destination, instance_id).send()
        })
        .await?;
        Ok(())
    }

    async fn replace_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> Result<(), RoutesError> {
        self.ec2(Operation::Ec2ReplaceRoute, |ec2| {
            let call = ec2
                .replace_route()
                .route_table_id(table_id)
                .instance_id(instance_id);
            match destination {
                IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
                IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
            }
            .send()
        })
        .await?;
        Ok(())
    }

    async fn delete_route(&self, table_id: &str, destination: IpNet) -> Result<(), RoutesError> {
        self.ec2(Operation::Ec2DeleteRoute, |ec2| {
            let call = ec2.delete_route().route_table_id(table_id);
            match destination {
                IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
                IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
            }
            .send()
        })
        .await?;
        Ok(())
    }

    async fn permission(&self, probe: &Probe, tagging: Tagging) -> Verdict {
        self.permissions().check(self, probe, tagging).await
    }
}

/// A call the fake recorded, for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeCall {
    DescribeRouteTables,
    DescribeInstances(Vec<String>),
    DisableSourceDestCheck(String),
    CreateRoute(String, IpNet, String),
    ReplaceRoute(String, IpNet, String),
    DeleteRoute(String, IpNet),
    /// A permission check of `action` on a resource (a DryRun).
    DryRun(Action, String),
}

impl FakeCall {
    pub fn is_mutating(&self) -> bool {
        !matches!(
            self,
            FakeCall::DescribeRouteTables | FakeCall::DescribeInstances(_) | FakeCall::DryRun(..)
        )
    }
}

#[derive(Debug, Default)]
struct FakeState {
    /// Table ID → (tags, routes by destination).
    tables: BTreeMap<String, (BTreeMap<String, String>, Vec<Route>)>,
    instances: BTreeMap<String, TargetInstance>,
    calls: Vec<FakeCall>,
    /// Errors to return: (call kind, key such as the CIDR or instance ID).
    failures: Vec<(&'static str, String, RoutesError)>,
    route_limit: Option<usize>,
    /// (action, resource) pairs IAM denies.
    denied: std::collections::BTreeSet<(Action, String)>,
}

/// An in-memory cloud with AWS's route semantics (duplicate creates fail,
/// replacing or deleting a missing route fails, blackholes exist), for
/// controller unit tests. Cheap to clone; clones share state.
#[derive(Clone, Debug, Default)]
pub struct FakeRoutes {
    state: Arc<Mutex<FakeState>>,
}

impl FakeRoutes {
    pub fn new() -> FakeRoutes {
        FakeRoutes::default()
    }

    /// Adds a table tagged for `cluster_id`, with the VPC's local route.
    pub fn add_table(&self, id: &str, cluster_id: &str, vpc_cidr: &str) {
        let tags = BTreeMap::from([(cluster_tag_key(cluster_id), "owned".to_string())]);
        self.add_table_with_tags(id, tags, vpc_cidr);
    }

    pub fn add_table_with_tags(&self, id: &str, tags: BTreeMap<String, String>, vpc_cidr: &str) {
        let local = Route {
            destination: vpc_cidr.parse().ok(),
            target: RouteTarget::Local,
            blackhole: false,
            propagated: false,
        };
        self.state
            .lock()
            .tables
            .insert(id.to_string(), (tags, vec![local]));
    }

    /// Puts a route in a table as-is (no checks), e.g. a blackhole.
    pub fn put_route(&self, table_id: &str, route: Route) {
        let mut st = self.state.lock();
        if let Some((_, routes)) = st.tables.get_mut(table_id) {
            routes.retain(|r| r.destination != route.destination);
            routes.push(route);
        }
    }

    pub fn add_instance(&self, id: &str, source_dest_check: bool) {
        self.state.lock().instances.insert(
            id.to_string(),
            TargetInstance {
                id: id.to_string(),
                source_dest_check: Some(source_dest_check),
                terminated: false,
                tagging: Tagging::Current,
            },
        );
    }

    /// Marks an instance as tagged `tagging` (e.g. only the legacy tag).
    pub fn set_instance_tagging(&self, id: &str, tagging: Tagging) {
        if let Some(i) = self.state.lock().instances.get_mut(id) {
            i.tagging = tagging;
        }
    }

    /// Makes IAM deny `action` on `resource_id`: its DryRun answers
    /// `UnauthorizedOperation`.
    pub fn deny(&self, action: Action, resource_id: &str) {
        self.state
            .lock()
            .denied
            .insert((action, resource_id.to_string()));
    }

    /// Grants it again.
    pub fn allow(&self, action: Action, resource_id: &str) {
        self.state
            .lock()
            .denied
            .remove(&(action, resource_id.to_string()));
    }

    pub fn terminate_instance(&self, id: &str) {
        let mut st = self.state.lock();
        if let Some(i) = st.instances.get_mut(id) {
            i.terminated = true;
        }
        // AWS turns routes to a terminated instance into blackholes.
        for (_, routes) in st.tables.values_mut() {
            for r in routes.iter_mut() {
                if r.target == RouteTarget::Instance(id.to_string()) {
                    r.blackhole = true;
                }
            }
        }
    }

    /// Fails calls of `kind` (`"create"`, `"replace"`, `"delete"`,
    /// `"source_dest"`, `"describe"`) whose key (CIDR, instance ID, or `*`)
    /// matches, until cleared.
    pub fn fail(&self, kind: &'static str, key: &str, err: RoutesError) {
        self.state
            .lock()
            .failures
            .push((kind, key.to_string(), err));
    }

    pub fn clear_failures(&self) {
        self.state.lock().failures.clear();
    }

    /// AWS's routes-per-table quota; creates beyond it fail with `RouteLimitExceeded`.
    pub fn set_route_limit(&self, limit: usize) {
        self.state.lock().route_limit = Some(limit);
    }

    pub fn routes(&self, table_id: &str) -> Vec<Route> {
        self.state
            .lock()
            .tables
            .get(table_id)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    pub fn route_to(&self, table_id: &str, destination: &str) -> Option<Route> {
        let dest: IpNet = destination.parse().ok()?;
        self.routes(table_id)
            .into_iter()
            .find(|r| r.destination == Some(dest))
    }

    pub fn instance(&self, id: &str) -> Option<TargetInstance> {
        self.state.lock().instances.get(id).cloned()
    }

    pub fn calls(&self) -> Vec<FakeCall> {
        self.state.lock().calls.clone()
    }

    pub fn mutating_calls(&self) -> Vec<FakeCall> {
        self.calls()
            .into_iter()
            .filter(FakeCall::is_mutating)
            .collect()
    }

    pub fn reset_calls(&self) {
        self.state.lock().calls.clear();
    }

    fn check(st: &FakeState, kind: &str, key: &str) -> Result<(), RoutesError> {
        match st
            .failures
            .iter()
            .find(|(k, fk, _)| *k == kind && (fk == key || fk == "*"))
        {
            Some((_, _, err)) => Err(err.clone()),
            None => Ok(()),
        }
    }

    fn instance_route(destination: IpNet, instance_id: &str) -> Route {
        Route {
            destination: Some(destination),
            target: RouteTarget::Instance(instance_id.to_string()),
            blackhole: false,
            propagated: false,
        }
    }

    fn not_found(what: String) -> RoutesError {
        RoutesError::new(
            RoutesErrorKind::NotFound,
            Some("InvalidRoute.NotFound"),
            what,
        )
    }
}

impl Routes for FakeRoutes {
    async fn route_tables(
        &self,
        selector: &RouteTableSelector,
    ) -> Result<Vec<RouteTable>, RoutesError> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::DescribeRouteTables);
        Self::check(&st, "describe", "*")?;
        Ok(st
            .tables
            .iter()
            .filter(|(id, (tags, _))| match &selector.route_table_id {
                Some(want) => want == *id,
                None => selector.matches_tags(tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
            })
            .map(|(id, (tags, routes))| RouteTable {
                id: id.clone(),
                vpc_id: None,
                routes: routes.clone(),
                tagging: Tagging::of(
                    &selector.cluster_id,
                    tags.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                ),
                owner_id: None,
            })
            .collect())
    }

    async fn instances(
        &self,
        ids: &[String],
    ) -> Result<HashMap<String, TargetInstance>, RoutesError> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::DescribeInstances(ids.to_vec()));
        Ok(ids
            .iter()
            .filter_map(|id| st.instances.get(id).map(|i| (id.clone(), i.clone())))
            .collect())
    }

    async fn disable_source_dest_check(&self, instance_id: &str) -> Result<(), RoutesError> {
        let mut st = self.state.lock();
        st.calls
            .push(FakeCall::DisableSourceDestCheck(instance_id.to_string()));
        Self::check(&st, "source_dest", instance_id)?;
        match st.instances.get_mut(instance_id) {
            Some(i) => {
                i.source_dest_check = Some(false);
                Ok(())
            }
            None => Err(RoutesError::new(
                RoutesErrorKind::NotFound,
                Some("InvalidInstanceID.NotFound"),
                format!("instance {instance_id} does not exist"),
            )),
        }
    }

    async fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> Result<(), RoutesError> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::CreateRoute(
            table_id.to_string(),
            destination,
            instance_id.to_string(),
        ));
        Self::check(&st, "create", &destination.to_string())?;
        let limit = st.route_limit;
        if !st.instances.contains_key(instance_id) {
            return Err(RoutesError::new(
                RoutesErrorKind::NotFound,
                Some("InvalidInstanceID.NotFound"),
                format!("instance {instance_id} does not exist"),
            ));
        }
        let (_, routes) = st.tables.get_mut(table_id).ok_or_else(|| {
            RoutesError::new(
                RoutesErrorKind::NotFound,
                Some("InvalidRouteTableID.NotFound"),
                format!("route table {table_id} does not exist"),
            )
        })?;
        if routes.iter().any(|r| r.destination == Some(destination)) {
            return Err(RoutesError::new(
                RoutesErrorKind::AlreadyExists,
                Some("RouteAlreadyExists"),
                format!("the route identified by {destination} already exists"),
            ));
        }
        if limit.is_some_and(|l| routes.iter().filter(|r| !r.propagated).count() >= l) {
            return Err(RoutesError::new(
                RoutesErrorKind::Permanent,
                Some("RouteLimitExceeded"),
                format!("route table {table_id} is full"),
            ));
        }
        routes.push(Self::instance_route(destination, instance_id));
        Ok(())
    }

    async fn replace_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> Result<(), RoutesError> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::ReplaceRoute(
            table_id.to_string(),
            destination,
            instance_id.to_string(),
        ));
        Self::check(&st, "replace", &destination.to_string())?;
        let routes = st
            .tables
            .get_mut(table_id)
            .map(|(_, r)| r)
            .ok_or_else(|| Self::not_found(format!("route table {table_id} does not exist")))?;
        let route = routes
            .iter_mut()
            .find(|r| r.destination == Some(destination))
            .ok_or_else(|| Self::not_found(format!("no route to {destination} in {table_id}")))?;
        *route = Self::instance_route(destination, instance_id);
        Ok(())
    }

    async fn delete_route(&self, table_id: &str, destination: IpNet) -> Result<(), RoutesError> {
        let mut st = self.state.lock();
        st.calls
            .push(FakeCall::DeleteRoute(table_id.to_string(), destination));
        Self::check(&st, "delete", &destination.to_string())?;
        let routes = st
            .tables
            .get_mut(table_id)
            .map(|(_, r)| r)
            .ok_or_else(|| Self::not_found(format!("route table {table_id} does not exist")))?;
        let before = routes.len();
        routes.retain(|r| r.destination != Some(destination));
        if routes.len() == before {
            return Err(Self::not_found(format!(
                "no route to {destination} in {table_id}"
            )));
        }
        Ok(())
    }

    async fn permission(&self, probe: &Probe, tagging: Tagging) -> Verdict {
        let mut st = self.state.lock();
        let key = (probe.action(), probe.resource_id().to_string());
        st.calls.push(FakeCall::DryRun(key.0, key.1.clone()));
        if !st.denied.contains(&key) {
            return Verdict::Allowed;
        }
        let registry =
            crate::aws::permissions::Permissions::new("demo", "us-east-1", Default::default());
        let denial: Denial = registry.record_denied(key.0, &key.1, tagging);
        Verdict::Denied(Box::new(denial))
    }
}

/// The `CreateRoute` request for a route to an instance (IPv4 or IPv6
/// destination); the permission check sends the same one with `DryRun`.
pub(crate) fn create_route_request(
    ec2: &aws_sdk_ec2::Client,
    table_id: &str,
    destination: IpNet,
    instance_id: &str,
) -> aws_sdk_ec2::operation::create_route::builders::CreateRouteFluentBuilder {
    let call = ec2
        .create_route()
        .route_table_id(table_id)
        .instance_id(instance_id);
    match destination {
        IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
        IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk_route() -> aws_sdk_ec2::types::builders::RouteBuilder {
        aws_sdk_ec2::types::Route::builder()
    }

    #[test]
    fn sdk_routes_are_parsed_once_at_the_door() {
        use aws_sdk_ec2::types::{RouteOrigin, RouteState};
        let local = parse_route(
            &sdk_route()
                .destination_cidr_block("10.0.0.0/16")
                .gateway_id("local")
                .origin(RouteOrigin::CreateRouteTable)
                .state(RouteState::Active)
                .build(),
        );
        assert_eq!(local.target, RouteTarget::Local);
        assert_eq!(local.destination, Some("10.0.0.0/16".parse().unwrap()));
        let instance = parse_route(
            &sdk_route()
                .destination_ipv6_cidr_block("fd00:10:244::/64")
                .instance_id("i-1")
                .network_interface_id("eni-1")
                .state(RouteState::Blackhole)
                .build(),
        );
        assert_eq!(instance.target, RouteTarget::Instance("i-1".into()));
        assert!(instance.blackhole);
        assert_eq!(
            instance.destination,
            Some("fd00:10:244::/64".parse().unwrap())
        );
        let nat = parse_route(
            &sdk_route()
                .destination_cidr_block("0.0.0.0/0")
                .nat_gateway_id("nat-1")
                .build(),
        );
        assert_eq!(nat.target, RouteTarget::Gateway("nat-1".into()));
        let eni = parse_route(
            &sdk_route()
                .destination_cidr_block("10.9.0.0/24")
                .network_interface_id("eni-9")
                .build(),
        );
        assert_eq!(eni.target, RouteTarget::NetworkInterface("eni-9".into()));
        let gone = parse_route(
            &sdk_route()
                .destination_cidr_block("10.9.1.0/24")
                .state(RouteState::Blackhole)
                .build(),
        );
        assert_eq!((gone.target, gone.blackhole), (RouteTarget::None, true));
        let propagated = parse_route(
            &sdk_route()
                .destination_cidr_block("172.16.0.0/12")
                .gateway_id("vgw-1")
                .origin(RouteOrigin::EnableVgwRoutePropagation)
                .build(),
        );
        assert!(propagated.propagated);
        let prefix_list = parse_route(
            &sdk_route()
                .destination_prefix_list_id("pl-1")
                .gateway_id("vpce-1")
                .build(),
        );
        assert_eq!(prefix_list.destination, None);
    }

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

    #[tokio::test]
    async fn the_fake_behaves_like_ec2() {
        let fake = FakeRoutes::new();
        fake.add_table("rtb-1", "c1", "10.0.0.0/16");
        fake.add_instance("i-1", true);
        let dest: IpNet = "10.244.1.0/24".parse().unwrap();
        fake.create_route("rtb-1", dest, "i-1").await.unwrap();
        let dup = fake.create_route("rtb-1", dest, "i-1").await.unwrap_err();
        assert_eq!(dup.kind, RoutesErrorKind::AlreadyExists);
        fake.terminate_instance("i-1");
        assert!(fake.route_to("rtb-1", "10.244.1.0/24").unwrap().blackhole);
        fake.delete_route("rtb-1", dest).await.unwrap();
        let gone = fake.delete_route("rtb-1", dest).await.unwrap_err();
        assert_eq!(gone.kind, RoutesErrorKind::NotFound);
        let missing = fake.replace_route("rtb-1", dest, "i-1").await.unwrap_err();
        assert_eq!(missing.kind, RoutesErrorKind::NotFound);
    }
}
