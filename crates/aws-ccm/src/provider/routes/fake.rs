//! An in-memory cloud with AWS's route semantics, for the route
//! controller's unit tests.
//!
//! Test-only, so it may reach into `crate::aws`: the cluster tag's name
//! (`aws::tags`) and the real permission registry, whose caching the route
//! controller's tests exercise through the fake.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::Mutex;

use super::{Route, RouteTable, RouteTableSelector, RouteTarget, Routes, TargetInstance};
use crate::aws::tags::cluster_tag_key;
use crate::provider::permissions::{Action, Denial, Probe, Tagging, Verdict};
use crate::provider::{CloudError, CloudResult, ErrorKind};

/// A call the fake recorded, for assertions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum FakeCall {
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
    pub(crate) fn is_mutating(&self) -> bool {
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
    failures: Vec<(&'static str, String, CloudError)>,
    route_limit: Option<usize>,
    /// (action, resource) pairs IAM denies.
    denied: std::collections::BTreeSet<(Action, String)>,
}

/// An in-memory cloud with AWS's route semantics (duplicate creates fail,
/// replacing or deleting a missing route fails, blackholes exist), for
/// controller unit tests. Cheap to clone; clones share state.
#[derive(Clone, Debug, Default)]
pub(crate) struct FakeRoutes {
    state: Arc<Mutex<FakeState>>,
}

impl FakeRoutes {
    pub(crate) fn new() -> FakeRoutes {
        FakeRoutes::default()
    }

    /// Adds a table tagged for `cluster_id`, with the VPC's local route.
    pub(crate) fn add_table(&self, id: &str, cluster_id: &str, vpc_cidr: &str) {
        let tags = BTreeMap::from([(cluster_tag_key(cluster_id), "owned".to_string())]);
        self.add_table_with_tags(id, tags, vpc_cidr);
    }

    pub(crate) fn add_table_with_tags(
        &self,
        id: &str,
        tags: BTreeMap<String, String>,
        vpc_cidr: &str,
    ) {
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
    pub(crate) fn put_route(&self, table_id: &str, route: Route) {
        let mut st = self.state.lock();
        if let Some((_, routes)) = st.tables.get_mut(table_id) {
            routes.retain(|r| r.destination != route.destination);
            routes.push(route);
        }
    }

    pub(crate) fn add_instance(&self, id: &str, source_dest_check: bool) {
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
    pub(crate) fn set_instance_tagging(&self, id: &str, tagging: Tagging) {
        if let Some(i) = self.state.lock().instances.get_mut(id) {
            i.tagging = tagging;
        }
    }

    /// Makes IAM deny `action` on `resource_id`: its DryRun answers
    /// `UnauthorizedOperation`.
    pub(crate) fn deny(&self, action: Action, resource_id: &str) {
        self.state
            .lock()
            .denied
            .insert((action, resource_id.to_string()));
    }

    /// Grants it again.
    pub(crate) fn allow(&self, action: Action, resource_id: &str) {
        self.state
            .lock()
            .denied
            .remove(&(action, resource_id.to_string()));
    }

    pub(crate) fn terminate_instance(&self, id: &str) {
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
    pub(crate) fn fail(&self, kind: &'static str, key: &str, err: CloudError) {
        self.state
            .lock()
            .failures
            .push((kind, key.to_string(), err));
    }

    pub(crate) fn clear_failures(&self) {
        self.state.lock().failures.clear();
    }

    pub(crate) fn routes(&self, table_id: &str) -> Vec<Route> {
        self.state
            .lock()
            .tables
            .get(table_id)
            .map(|(_, r)| r.clone())
            .unwrap_or_default()
    }

    pub(crate) fn route_to(&self, table_id: &str, destination: &str) -> Option<Route> {
        let dest: IpNet = destination.parse().ok()?;
        self.routes(table_id)
            .into_iter()
            .find(|r| r.destination == Some(dest))
    }

    pub(crate) fn instance(&self, id: &str) -> Option<TargetInstance> {
        self.state.lock().instances.get(id).cloned()
    }

    pub(crate) fn calls(&self) -> Vec<FakeCall> {
        self.state.lock().calls.clone()
    }

    pub(crate) fn mutating_calls(&self) -> Vec<FakeCall> {
        self.calls()
            .into_iter()
            .filter(FakeCall::is_mutating)
            .collect()
    }

    pub(crate) fn reset_calls(&self) {
        self.state.lock().calls.clear();
    }

    fn check(st: &FakeState, kind: &str, key: &str) -> CloudResult<()> {
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

    fn not_found(operation: &str, what: String) -> CloudError {
        CloudError::new(operation, ErrorKind::NotFound, what)
    }
}

impl Routes for FakeRoutes {
    async fn route_tables(&self, selector: &RouteTableSelector) -> CloudResult<Vec<RouteTable>> {
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

    async fn instances(&self, ids: &[String]) -> CloudResult<HashMap<String, TargetInstance>> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::DescribeInstances(ids.to_vec()));
        Ok(ids
            .iter()
            .filter_map(|id| st.instances.get(id).map(|i| (id.clone(), i.clone())))
            .collect())
    }

    async fn disable_source_dest_check(&self, instance_id: &str) -> CloudResult<()> {
        let mut st = self.state.lock();
        st.calls
            .push(FakeCall::DisableSourceDestCheck(instance_id.to_string()));
        Self::check(&st, "source_dest", instance_id)?;
        match st.instances.get_mut(instance_id) {
            Some(i) => {
                i.source_dest_check = Some(false);
                Ok(())
            }
            None => Err(CloudError::new(
                "ec2:ModifyInstanceAttribute",
                ErrorKind::NotFound,
                format!("instance {instance_id} does not exist"),
            )),
        }
    }

    async fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> CloudResult<()> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::CreateRoute(
            table_id.to_string(),
            destination,
            instance_id.to_string(),
        ));
        Self::check(&st, "create", &destination.to_string())?;
        let limit = st.route_limit;
        if !st.instances.contains_key(instance_id) {
            return Err(CloudError::new(
                "ec2:CreateRoute",
                ErrorKind::NotFound,
                format!("instance {instance_id} does not exist"),
            ));
        }
        let (_, routes) = st.tables.get_mut(table_id).ok_or_else(|| {
            CloudError::new(
                "ec2:CreateRoute",
                ErrorKind::NotFound,
                format!("route table {table_id} does not exist"),
            )
        })?;
        if routes.iter().any(|r| r.destination == Some(destination)) {
            return Err(CloudError::new(
                "ec2:CreateRoute",
                ErrorKind::AlreadyExists,
                format!("the route identified by {destination} already exists"),
            ));
        }
        if limit.is_some_and(|l| routes.iter().filter(|r| !r.propagated).count() >= l) {
            return Err(CloudError::new(
                "ec2:CreateRoute",
                ErrorKind::Rejected,
                format!("RouteLimitExceeded: route table {table_id} is full"),
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
    ) -> CloudResult<()> {
        let mut st = self.state.lock();
        st.calls.push(FakeCall::ReplaceRoute(
            table_id.to_string(),
            destination,
            instance_id.to_string(),
        ));
        Self::check(&st, "replace", &destination.to_string())?;
        let routes = st.tables.get_mut(table_id).map(|(_, r)| r).ok_or_else(|| {
            Self::not_found(
                "ec2:ReplaceRoute",
                format!("route table {table_id} does not exist"),
            )
        })?;
        let route = routes
            .iter_mut()
            .find(|r| r.destination == Some(destination))
            .ok_or_else(|| {
                Self::not_found(
                    "ec2:ReplaceRoute",
                    format!("no route to {destination} in {table_id}"),
                )
            })?;
        *route = Self::instance_route(destination, instance_id);
        Ok(())
    }

    async fn delete_route(&self, table_id: &str, destination: IpNet) -> CloudResult<()> {
        let mut st = self.state.lock();
        st.calls
            .push(FakeCall::DeleteRoute(table_id.to_string(), destination));
        Self::check(&st, "delete", &destination.to_string())?;
        let routes = st.tables.get_mut(table_id).map(|(_, r)| r).ok_or_else(|| {
            Self::not_found(
                "ec2:DeleteRoute",
                format!("route table {table_id} does not exist"),
            )
        })?;
        let before = routes.len();
        routes.retain(|r| r.destination != Some(destination));
        if routes.len() == before {
            return Err(Self::not_found(
                "ec2:DeleteRoute",
                format!("no route to {destination} in {table_id}"),
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_fake_behaves_like_ec2() {
        let fake = FakeRoutes::new();
        fake.add_table("rtb-1", "c1", "10.0.0.0/16");
        fake.add_instance("i-1", true);
        let dest: IpNet = "10.244.1.0/24".parse().unwrap();
        fake.create_route("rtb-1", dest, "i-1").await.unwrap();
        let dup = fake.create_route("rtb-1", dest, "i-1").await.unwrap_err();
        assert!(dup.is_already_exists(), "{dup}");
        fake.terminate_instance("i-1");
        assert!(fake.route_to("rtb-1", "10.244.1.0/24").unwrap().blackhole);
        fake.delete_route("rtb-1", dest).await.unwrap();
        let gone = fake.delete_route("rtb-1", dest).await.unwrap_err();
        assert!(gone.is_not_found(), "{gone}");
        let missing = fake.replace_route("rtb-1", dest, "i-1").await.unwrap_err();
        assert!(missing.is_not_found(), "{missing}");
    }
}
