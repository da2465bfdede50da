//! Load balancers: what the service controller needs from the cloud.
//!
//! [`LoadBalancers`] is implemented for real by [`AwsLoadBalancers`] (read
//! AWS, plan with the pure functions in `aws::elb`, apply) and in memory by
//! [`FakeLoadBalancers`] for controller tests.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;

pub use crate::aws::annotations::{LoadBalancerKind, LoadBalancerSpec, SpecError};
use crate::aws::elb::{self, Actual};
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::{AwsClient, AwsError, subnets, tags};
use crate::cloud_config::CloudConfig;

/// One Service's request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnsureRequest {
    /// `namespace/name`.
    pub service_key: String,
    pub uid: String,
    pub spec: LoadBalancerSpec,
    /// EC2 instance IDs of the backend nodes.
    pub instance_ids: BTreeSet<String>,
}

/// What an ensure did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ensured {
    pub hostname: String,
    /// Descriptions of the changes applied; empty when nothing differed.
    pub changes: Vec<String>,
    pub created: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LbError {
    /// Something the user must fix (tags, annotations); retrying alone will not help.
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Aws(#[from] AwsError),
}

pub trait LoadBalancers: Clone + Send + Sync + 'static {
    fn ensure(&self, req: &EnsureRequest) -> impl Future<Output = Result<Ensured, LbError>> + Send;
    /// Removes everything made for the Service; `Ok(true)` when something was deleted.
    fn ensure_deleted(
        &self,
        service_key: &str,
        uid: &str,
    ) -> impl Future<Output = Result<bool, LbError>> + Send;
}

/// Classic ELBs through the one door.
#[derive(Clone)]
pub struct AwsLoadBalancers {
    pub aws: AwsClient,
    pub cloud: Arc<CloudConfig>,
    pub cluster_id: String,
}

impl AwsLoadBalancers {
    /// Node security group of each backend instance, as upstream chooses it:
    /// the one cluster-tagged group, else the only group.
    fn node_group(
        &self,
        instance: &crate::aws::Ec2Instance,
        cluster_groups: &BTreeMap<String, sg::SecurityGroup>,
    ) -> Result<Option<String>, LbError> {
        let ids: Vec<&str> = instance
            .security_groups
            .iter()
            .map(|g| g.id.as_str())
            .collect();
        let tagged: Vec<&str> = ids
            .iter()
            .copied()
            .filter(|id| cluster_groups.contains_key(*id))
            .collect();
        match (tagged.len(), ids.len()) {
            (1, _) => Ok(Some(tagged[0].to_string())),
            (0, 1) => Ok(Some(ids[0].to_string())),
            (0, 0) => Ok(None),
            (0, _) => Err(LbError::Config(format!(
                "instance {} has several security groups and none is tagged {}; tag the one the load balancer should open",
                instance.id,
                tags::cluster_tag_key(&self.cluster_id)
            ))),
            _ => Err(LbError::Config(format!(
                "instance {} has several security groups tagged {} ({}); tag only the node group",
                instance.id,
                tags::cluster_tag_key(&self.cluster_id),
                tagged.join(", ")
            ))),
        }
    }
}

/// Whether the load balancer's own group is a shared one (annotation or
/// cloud.conf), not the owned `k8s-elb-*` group.
fn actual_group_is_shared(desired: &elb::Desired) -> bool {
    matches!(desired.groups.first(), Some(elb::GroupRef::Id(_)))
}

impl AwsLoadBalancers {
    /// Node groups reached by other classic ELBs that use `group`; `None`
    /// when one of their instances cannot be placed (then nothing is revoked).
    async fn node_groups_used_by_others(
        &self,
        group: &str,
        this_lb: &str,
        by_id: &BTreeMap<&str, &crate::aws::Ec2Instance>,
        cluster_groups: &BTreeMap<String, sg::SecurityGroup>,
    ) -> Result<Option<BTreeSet<String>>, LbError> {
        let mut needed = BTreeSet::new();
        for other in elb::io::list_all(&self.aws).await? {
            if other.name == this_lb || !other.security_groups.iter().any(|g| g == group) {
                continue;
            }
            for id in &other.instances {
                let Some(instance) = by_id.get(id.as_str()) else {
                    return Ok(None);
                };
                match self.node_group(instance, cluster_groups) {
                    Ok(Some(g)) => {
                        needed.insert(g);
                    }
                    Ok(None) => {}
                    Err(_) => return Ok(None),
                }
            }
        }
        Ok(Some(needed))
    }
}

impl LoadBalancers for AwsLoadBalancers {
    async fn ensure(&self, req: &EnsureRequest) -> Result<Ensured, LbError> {
        let aws = &self.aws;
        let spec = &req.spec;
        let name = elb::load_balancer_name(&req.uid);

        let swept = aws.cluster_instances().await?;
        let by_id: BTreeMap<&str, &crate::aws::Ec2Instance> = swept
            .iter()
            .filter(|i| !i.state.is_terminated())
            .map(|i| (i.id.as_str(), i))
            .collect();
        let backends: Vec<&crate::aws::Ec2Instance> = req
            .instance_ids
            .iter()
            .filter_map(|id| by_id.get(id.as_str()).copied())
            .collect();
        let vpc_id = self
            .cloud
            .vpc
            .clone()
            .or_else(|| swept.iter().find_map(|i| i.vpc_id.clone()))
            .ok_or_else(|| {
                LbError::Config(
                    "cannot tell the cluster's VPC: set VPC in cloud.conf or tag the node instances with the cluster tag".into(),
                )
            })?;

        // One read of the cluster's groups serves owned group, node groups and rules.
        let cluster_groups: BTreeMap<String, sg::SecurityGroup> =
            sg::cluster_groups(aws, &vpc_id, &self.cluster_id)
                .await?
                .into_iter()
                .map(|g| (g.id.clone(), g))
                .collect();
        let owned_name = elb::owned_group_name(&name);
        let owned_group = cluster_groups
            .values()
            .find(|g| g.name == owned_name)
            .cloned();

        let mut node_groups = BTreeSet::new();
        for i in &backends {
            node_groups.extend(self.node_group(i, &cluster_groups)?);
        }
        let untagged: Vec<String> = node_groups
            .iter()
            .filter(|g| !cluster_groups.contains_key(*g))
            .cloned()
            .collect();
        let mut all_groups = cluster_groups.clone();
        for g in sg::by_ids(aws, &untagged).await? {
            all_groups.insert(g.id.clone(), g);
        }

        let subnet_ids: BTreeSet<String> = match &spec.subnets {
            Some(list) => match subnets::resolve(aws, &vpc_id, list).await? {
                Ok(ids) => ids.into_iter().collect(),
                Err(missing) => {
                    return Err(LbError::Config(format!(
                        "{}: no subnet in VPC {vpc_id} has the ID or Name tag {}; fix the annotation",
                        crate::aws::annotations::SUBNETS,
                        missing.join(", ")
                    )));
                }
            },
            None => {
                let found = subnets::vpc_subnets(aws, &vpc_id).await?;
                let chosen = subnets::choose(&found, spec.internal, &self.cluster_id);
                if chosen.is_empty() {
                    let role = if spec.internal {
                        tags::ROLE_INTERNAL_ELB
                    } else {
                        tags::ROLE_ELB
                    };
                    return Err(LbError::Config(format!(
                        "no suitable subnet for an {} load balancer in VPC {vpc_id}: tag a subnet per zone with {role}=1 and {}=shared{}, or set {}",
                        if spec.internal {
                            "internal"
                        } else {
                            "internet-facing"
                        },
                        tags::cluster_tag_key(&self.cluster_id),
                        if spec.internal {
                            ""
                        } else {
                            " (it needs a route to an internet gateway)"
                        },
                        crate::aws::annotations::SUBNETS,
                    )));
                }
                chosen.into_iter().collect()
            }
        };

        let lb = elb::io::read_lb(aws, &name).await?;
        let env = elb::Environment {
            subnets: subnet_ids,
            instances: backends.iter().map(|i| i.id.clone()).collect(),
            node_groups,
        };
        let desired = elb::desired(
            spec,
            &req.service_key,
            &req.uid,
            &self.cluster_id,
            &self.cloud,
            &env,
        );

        // The LB's own group: owned, or the first configured one.
        let lb_group = match desired.groups.first() {
            Some(elb::GroupRef::Id(id)) => Some(id.clone()),
            _ => owned_group.as_ref().map(|g| g.id.clone()),
        };
        let node_groups_with_rule = match &lb_group {
            Some(id) => {
                let rule = Rule::all_from_group(id);
                all_groups
                    .values()
                    .filter(|g| Some(&g.id) != lb_group.as_ref() && g.ingress.contains(&rule))
                    .map(|g| g.id.clone())
                    .collect()
            }
            None => BTreeSet::new(),
        };
        // A shared LB group's node rule that this load balancer no longer
        // needs: look up who else uses the group (only then; see
        // elb::Actual::shared_group_needed).
        let shared_group_needed = match (&lb_group, &desired.node_groups) {
            (Some(g), Some(want))
                if actual_group_is_shared(&desired) && !node_groups_with_rule.is_subset(want) =>
            {
                self.node_groups_used_by_others(g, &name, &by_id, &cluster_groups)
                    .await?
            }
            _ => None,
        };
        // An owned group the Service no longer wants: which node groups admit it.
        let owned_group_node_rules = match &owned_group {
            Some(g) if desired.owned_group.is_none() => {
                let rule = Rule::all_from_group(&g.id);
                all_groups
                    .values()
                    .filter(|n| n.id != g.id && n.ingress.contains(&rule))
                    .map(|n| n.id.clone())
                    .collect()
            }
            _ => BTreeSet::new(),
        };
        let actual = Actual {
            lb,
            owned_group,
            node_groups_with_rule,
            shared_group_needed,
            shared_lb_group: None,
            owned_group_node_rules,
        };
        let changes = elb::plan(&desired, &actual);
        let created = changes
            .iter()
            .any(|c| matches!(c, elb::Change::CreateLoadBalancer { .. }));
        let new_dns = elb::io::apply(aws, &name, Some(&vpc_id), &actual, &changes).await?;
        let hostname = new_dns
            .or_else(|| actual.lb.as_ref().map(|l| l.dns_name.clone()))
            .unwrap_or_default();
        Ok(Ensured {
            hostname,
            changes: changes.iter().map(elb::describe).collect(),
            created,
        })
    }

    async fn ensure_deleted(&self, _service_key: &str, uid: &str) -> Result<bool, LbError> {
        let aws = &self.aws;
        let name = elb::load_balancer_name(uid);
        let lb = elb::io::read_lb(aws, &name).await?;
        if let Some(lb) = &lb
            && !tags::is_owned(&lb.tags, &self.cluster_id)
        {
            tracing::warn!(load_balancer = %name, "load balancer lacks this cluster's ownership tag; leaving it");
        }
        let owned_group = sg::describe(
            aws,
            vec![
                crate::aws::instances::filter("group-name", [elb::owned_group_name(&name)]),
                crate::aws::instances::filter("tag-key", [tags::cluster_tag_key(&self.cluster_id)]),
            ],
        )
        .await?
        .into_iter()
        .next();
        let mut node_groups_with_rule = BTreeSet::new();
        if let Some(g) = &owned_group
            && let Some(vpc) = &g.vpc_id
        {
            let rule = Rule::all_from_group(&g.id);
            let mut candidates = sg::cluster_groups(aws, vpc, &self.cluster_id).await?;
            // Untagged single node groups are opened too: look at the backends'.
            let swept = aws.cluster_instances().await?;
            let extra: Vec<String> = swept
                .iter()
                .flat_map(|i| i.security_groups.iter().map(|s| s.id.clone()))
                .filter(|id| !candidates.iter().any(|c| &c.id == id))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            candidates.extend(sg::by_ids(aws, &extra).await?);
            node_groups_with_rule = candidates
                .iter()
                .filter(|c| c.id != g.id && c.ingress.contains(&rule))
                .map(|c| c.id.clone())
                .collect();
        }
        // No owned group: the node rules admit the load balancer's first
        // (shared) group; revoke those no other load balancer needs.
        let mut shared_lb_group = None;
        let mut shared_group_needed = None;
        if owned_group.is_none()
            && !self.cloud.disable_security_group_ingress
            && let Some(l) = &lb
            && tags::is_owned(&l.tags, &self.cluster_id)
            && let Some(first) = l.security_groups.first()
        {
            let swept = aws.cluster_instances().await?;
            let by_id: BTreeMap<&str, &crate::aws::Ec2Instance> = swept
                .iter()
                .filter(|i| !i.state.is_terminated())
                .map(|i| (i.id.as_str(), i))
                .collect();
            let vpc = self
                .cloud
                .vpc
                .clone()
                .or_else(|| swept.iter().find_map(|i| i.vpc_id.clone()));
            if let Some(vpc) = vpc {
                let cluster_groups: BTreeMap<String, sg::SecurityGroup> =
                    sg::cluster_groups(aws, &vpc, &self.cluster_id)
                        .await?
                        .into_iter()
                        .map(|g| (g.id.clone(), g))
                        .collect();
                let rule = Rule::all_from_group(first);
                node_groups_with_rule = cluster_groups
                    .values()
                    .filter(|g| &g.id != first && g.ingress.contains(&rule))
                    .map(|g| g.id.clone())
                    .collect();
                if !node_groups_with_rule.is_empty() {
                    shared_group_needed = self
                        .node_groups_used_by_others(first, &name, &by_id, &cluster_groups)
                        .await?;
                    shared_lb_group = Some(first.clone());
                }
            }
        }
        let actual = Actual {
            lb,
            owned_group,
            node_groups_with_rule,
            shared_group_needed,
            shared_lb_group,
            owned_group_node_rules: BTreeSet::new(),
        };
        let changes = elb::plan_delete(&actual, &self.cluster_id);
        elb::io::apply(aws, &name, None, &actual, &changes).await?;
        Ok(!changes.is_empty())
    }
}

/// In-memory load balancers for controller tests: records every request and
/// can be told to fail.
#[derive(Clone, Default)]
pub struct FakeLoadBalancers {
    pub state: Arc<Mutex<FakeState>>,
}

#[derive(Default)]
pub struct FakeState {
    /// Current load balancers by Service UID.
    pub balancers: BTreeMap<String, EnsureRequest>,
    pub ensure_calls: usize,
    pub delete_calls: usize,
    /// When set, every call fails with this message.
    pub fail_with: Option<String>,
}

impl LoadBalancers for FakeLoadBalancers {
    async fn ensure(&self, req: &EnsureRequest) -> Result<Ensured, LbError> {
        let mut s = self.state.lock();
        s.ensure_calls += 1;
        if let Some(msg) = &s.fail_with {
            return Err(LbError::Config(msg.clone()));
        }
        let previous = s.balancers.insert(req.uid.clone(), req.clone());
        let changes = if previous.as_ref() == Some(req) {
            vec![]
        } else {
            vec!["update".to_string()]
        };
        Ok(Ensured {
            hostname: format!("{}.elb.amazonaws.com", elb::load_balancer_name(&req.uid)),
            created: previous.is_none(),
            changes,
        })
    }

    async fn ensure_deleted(&self, _service_key: &str, uid: &str) -> Result<bool, LbError> {
        let mut s = self.state.lock();
        s.delete_calls += 1;
        if let Some(msg) = &s.fail_with {
            return Err(LbError::Config(msg.clone()));
        }
        Ok(s.balancers.remove(uid).is_some())
    }
}
