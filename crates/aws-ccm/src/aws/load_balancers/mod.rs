//! Load balancers on AWS: [`AwsLoadBalancers`] implements the provider's
//! [`LoadBalancers`] trait (read AWS, plan with the pure functions in
//! `aws::elb` and `aws::nlb`, apply).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::aws::annotations::{LoadBalancerKind, LoadBalancerSpec};
use crate::aws::elb::{self, Actual};
use crate::aws::memory::Applied;
use crate::aws::nlb;
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::{Aws, subnets, tags};
use crate::cloud_config::CloudConfig;
use crate::provider::CloudError;
pub use crate::provider::load_balancers::{EnsureRequest, LoadBalancers};
pub(crate) use crate::provider::load_balancers::{Ensured, Removed, Scope, Warning, merged};

pub(crate) mod adopt;
mod applying;
mod drift;
mod groups;
mod keep;
mod nlb_groups;
use nlb_groups::groups_refused_warning;
mod nlb_rules;
mod planned;
mod refusals;
mod removing;
mod shared_group;
pub(crate) mod sweep;
mod sweep_tags;
pub(crate) mod targets;
pub(crate) use targets::delta;
mod upkeep;
pub(crate) use planned::{ClbPlan, NlbPlan, Planned};

/// Event reason: a node security group had no room for the rule admitting
/// an NLB's security group (it keeps the CIDR rules).
const NODE_GROUP_RULE_LIMIT: &str = "NodeSecurityGroupRuleLimit";

/// Event reason: AWS refused an NLB's `SetSecurityGroups` (it keeps the
/// groups it has, and its node rules follow those).
const NLB_SECURITY_GROUPS_REFUSED: &str = "SecurityGroupsRefused";

/// Classic ELBs and NLBs through the one door. What they know of AWS
/// beyond a fresh read is `aws`'s [`crate::aws::memory::Memory`], a set of
/// load balancers' own (made fresh by [`AwsLoadBalancers::new`]).
#[derive(Clone)]
pub struct AwsLoadBalancers {
    aws: Aws,
    cloud: Arc<CloudConfig>,
    cluster_id: String,
    /// `--cluster-name`: upstream hashes it into an NLB's managed group name.
    cluster_name: String,
    /// One adoption claim at a time ([`adopt`]).
    adoptions: Arc<tokio::sync::Mutex<()>>,
}

impl AwsLoadBalancers {
    /// Load balancers of cluster `cluster_id` through `aws`, knowing
    /// nothing of them yet: every sync reads their settings (see
    /// [`Self::trusting_known_settings`]), and no target record.
    pub fn new(
        aws: Aws,
        cloud: Arc<CloudConfig>,
        cluster_id: String,
        cluster_name: String,
    ) -> AwsLoadBalancers {
        let memory = aws.memory().for_load_balancers(None, Default::default());
        AwsLoadBalancers {
            aws: aws.with_memory(memory),
            cloud,
            cluster_id,
            cluster_name,
            adoptions: Arc::default(),
        }
    }

    /// Trusts a load balancer's known settings (its
    /// [`tags::APPLIED_SETTINGS_TAG`], or this process's last sync) instead
    /// of reading them at every sync, and reads them in full again once per
    /// `resync` (`--service-resync-period`; zero: never). Without this
    /// (`aws-ccm plan`), every sync reads them.
    pub fn trusting_known_settings(self, resync: std::time::Duration) -> AwsLoadBalancers {
        let trust = Some(Some(resync).filter(|d| !d.is_zero()));
        let record = self.memory().target_record().clone();
        self.remembering(trust, record)
    }

    /// Keeps each NLB target group's registered instances in `record`,
    /// shared with the next leader (off by default: `aws-ccm plan` and
    /// tests read every group).
    pub(crate) fn with_target_record(
        self,
        record: crate::target_record::TargetRecord,
    ) -> AwsLoadBalancers {
        let trust = self.memory().sweep().resync_period();
        self.remembering(trust, record)
    }

    fn remembering(
        mut self,
        trust: Option<Option<std::time::Duration>>,
        record: crate::target_record::TargetRecord,
    ) -> AwsLoadBalancers {
        let memory = self.aws.memory().for_load_balancers(trust, record);
        self.aws = self.aws.with_memory(memory);
        self
    }

    /// The target record these load balancers keep (which the leader
    /// starts).
    pub(crate) fn target_record(&self) -> &crate::target_record::TargetRecord {
        self.memory().target_record()
    }

    /// What these load balancers know of AWS.
    fn memory(&self) -> &crate::aws::memory::Memory {
        self.aws.memory()
    }
}

impl AwsLoadBalancers {
    /// Node security group of each backend instance, as upstream chooses it:
    /// the one cluster-tagged group, else the only group. `groups` holds the
    /// instance's groups (see [`Self::groups_of`]).
    fn node_group(
        &self,
        instance: &crate::aws::Ec2Instance,
        groups: &BTreeMap<String, sg::SecurityGroup>,
    ) -> Result<Option<String>, CloudError> {
        let ids: Vec<&str> = instance.security_groups.iter().map(|g| &*g.id).collect();
        let tagged = |id: &str| {
            groups
                .get(id)
                .is_some_and(|g| tags::has_cluster_tag(&g.tags, &self.cluster_id))
        };
        sg::node_group_of(&instance.id, &ids, tagged, &self.cluster_id).map_err(CloudError::invalid)
    }
}

impl AwsLoadBalancers {
    /// Whether Service `service_key`'s `made` named `name` (tags `tags`) is
    /// proven this CCM's ([`ownership`]); when not, says why it is left.
    fn left_unless_proven(
        &self,
        service_key: &str,
        made: Made,
        name: &str,
        tags: &BTreeMap<String, String>,
    ) -> bool {
        match ownership::prove(made, name, tags, &self.cluster_id, Some(service_key)) {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(service = %service_key, resource = %name, %why, "not proven made by the CCM for this Service; leaving it");
                false
            }
        }
    }
}

/// The groups (by ID) other than `group` whose rules admit everything
/// from `group`.
fn admitting<'a>(
    groups: impl IntoIterator<Item = &'a sg::SecurityGroup>,
    group: &str,
) -> BTreeSet<String> {
    let rule = Rule::all_from_group(group);
    groups
        .into_iter()
        .filter(|g| g.id != group && g.ingress.contains(&rule))
        .map(|g| g.id.clone())
        .collect()
}

impl AwsLoadBalancers {
    /// Node groups reached by other classic ELBs that use `group`; `None`
    /// when one of their instances cannot be placed (then nothing is revoked).
    async fn node_groups_used_by_others(
        &self,
        group: &str,
        this_lb: &str,
        vpc_id: &str,
    ) -> Result<Option<BTreeSet<String>>, CloudError> {
        // The sweep is cached: this is no extra DescribeInstances.
        let swept = self.aws.cluster_instances().await?;
        let by_id: BTreeMap<&str, &crate::aws::Ec2Instance> = swept
            .iter()
            .filter(|i| !i.state.is_terminated())
            .map(|i| (i.id.as_str(), i))
            .collect();
        let live: Vec<&crate::aws::Ec2Instance> = by_id.values().copied().collect();
        let instance_groups = self.groups_of(vpc_id, &live, &[]).await?;
        let mut needed = BTreeSet::new();
        for other in elb::io::list_all(&self.aws).await? {
            if other.name == this_lb || !other.security_groups.iter().any(|g| g == group) {
                continue;
            }
            for id in &other.instances {
                let Some(instance) = by_id.get(id.as_str()) else {
                    return Ok(None);
                };
                let Ok(node_group) = self.node_group(instance, &instance_groups) else {
                    return Ok(None);
                };
                needed.extend(node_group);
            }
        }
        Ok(Some(needed))
    }
}

impl AwsLoadBalancers {
    /// The load balancer's subnets: the annotation's (in its order when it
    /// names IDs only: EIPs and private addresses pair with them in order),
    /// else upstream's discovery.
    async fn subnet_ids(
        &self,
        spec: &LoadBalancerSpec,
        vpc_id: &str,
    ) -> Result<Vec<String>, CloudError> {
        let aws = &self.aws;
        match &spec.subnets {
            Some(list) => match subnets::resolve(aws, vpc_id, list).await? {
                // IDs only: in the annotation's order, once each.
                Ok(_) if list.iter().all(|s| s.starts_with("subnet-")) => {
                    let mut seen = BTreeSet::new();
                    Ok(list.iter().filter(|s| seen.insert(*s)).cloned().collect())
                }
                Ok(ids) => Ok(ids),
                Err(missing) => Err(CloudError::invalid(format!(
                    "{}: no subnet in VPC {vpc_id} has the ID or Name tag {}; fix the annotation",
                    crate::aws::annotations::SUBNETS,
                    missing.join(", ")
                ))),
            },
            None => {
                let found = self.memory().subnets().vpc_subnets(aws, vpc_id).await?;
                // Local and Wavelength Zones take no CLB or NLB (as upstream).
                let zones = aws.zones().await?;
                let (chosen, fell_back) = subnets::discover_with_fallback(
                    &found,
                    spec.internal,
                    &self.cluster_id,
                    &zones.types,
                    &self.cloud,
                )
                .await;
                if fell_back && !chosen.is_empty() {
                    tracing::warn!(vpc = vpc_id, subnet = ?chosen, "no subnet of the VPC is this cluster's or of no cluster; falling back to this CCM's own subnet (cloud.conf SubnetID when VPC is set), as the Go CCM does");
                }
                if chosen.is_empty() {
                    let (role, route) = if spec.internal {
                        (tags::ROLE_INTERNAL_ELB, "")
                    } else {
                        (tags::ROLE_ELB, " (it needs a route to an internet gateway)")
                    };
                    return Err(CloudError::invalid(format!(
                        "no suitable subnet for an {} load balancer in VPC {vpc_id}: tag a subnet per zone with {role}=1 and {}=shared{route}, or set {}",
                        elb::plan::scheme(spec.internal),
                        tags::cluster_tag_key(&self.cluster_id),
                        crate::aws::annotations::SUBNETS,
                    )));
                }
                Ok(chosen)
            }
        }
    }
}

impl AwsLoadBalancers {
    async fn ensure_clb(&self, req: &EnsureRequest) -> Result<Ensured, CloudError> {
        let p = self.plan_clb(req, true).await?;
        let new_dns = self
            .apply_clb(&p.name, Some(&p.vpc_id), &p.actual, &p.changes)
            .await?;
        let created = p.actual.lb.is_none();
        self.settings_synced(&p.name, &p.settings, created, !p.changes.is_empty());
        let hostname = new_dns
            .or_else(|| p.actual.lb.as_ref().map(|l| l.dns_name.clone()))
            .unwrap_or_default();
        if p.warnings.is_empty() && !hostname.is_empty() {
            let lb = targets::KnownLb::Classic {
                name: p.name.clone(),
                instances: Arc::new(p.instances),
            };
            self.ensured_in_full(req, &hostname, p.backend_groups, lb);
        }
        Ok(Ensured {
            hostname,
            changes: p.changes.iter().map(elb::plan::describe).collect(),
            warnings: merged(p.warnings),
        })
    }

    /// Reads and plans a classic ELB sync, stopping before apply. With
    /// `hand_over` an NLB the Service had is deleted first (a sync); without,
    /// it is only looked for (`aws-ccm plan`).
    async fn plan_clb(&self, req: &EnsureRequest, hand_over: bool) -> Result<ClbPlan, CloudError> {
        let aws = &self.aws;
        let spec = &req.spec;
        let name = elb::load_balancer_name(&req.uid);
        let mut lb = self.memory().sweep().clb(aws, &name).await?;
        // Type change handover: the Service was an NLB until now. First, so
        // that the NLB's group (same name scheme) is gone before groups are read.
        let mut handover = false;
        if lb.is_none()
            && hand_over
            && (self.delete_nlb(&req.service_key, &req.uid, true, spec.protected(), false))
                .await?
                .changed
        {
            tracing::info!(load_balancer = %name, "deleted the NLB this Service had before it asked for a classic ELB");
        } else if lb.is_none() && !hand_over {
            handover = nlb::read::describe(aws, &name).await?.is_some();
        }

        let (vpc_id, backends) = self.vpc_and_backends(&req.instance_ids).await?;
        let backends = backends.list();
        let backend_groups = targets::group_sets(backends.iter().copied());

        let owned_names = [elb::owned_group_name(&name)];
        let (mut all_groups, node_groups) = self
            .sync_groups(&req.uid, &vpc_id, &owned_names, &backends)
            .await?;
        let owned_group = all_groups
            .values()
            .find(|g| g.name == owned_names[0] && tags::has_cluster_tag(&g.tags, &self.cluster_id))
            .cloned();

        let subnets = self.subnet_ids(spec, &vpc_id).await?;
        let env = self.environment(subnets, &backends, node_groups);
        let desired = elb::plan::desired(
            spec,
            &req.service_key,
            &req.uid,
            &self.cluster_id,
            &self.cloud,
            &env,
        );
        let settings = self.clb_attributes(lb.as_mut(), &req.uid, &desired).await?;

        let actual = self
            .clb_actual(&name, &vpc_id, &desired, lb, owned_group, &mut all_groups)
            .await?;
        let diffs = elb::plan::left_alone(&desired, &actual);
        let lb_tags = actual.lb.as_ref().map(|l| &*l.tags);
        let mut warnings: Vec<_> = drift::drift_warning(&req.service_key, &name, lb_tags, &diffs)
            .into_iter()
            .collect();
        let mut changes = self
            .refuse_node_ingress(
                &req.service_key,
                &all_groups,
                elb::plan::plan(&desired, &actual),
                &mut warnings,
            )
            .await;
        sweep::record_in_clb_create(&mut changes, &settings.digest);
        Ok(ClbPlan {
            name,
            vpc_id,
            actual,
            changes,
            warnings,
            handover,
            settings,
            instances: env.instances,
            backend_groups,
        })
    }

    /// What the classic ELB plan compares against, past the load balancer
    /// and its owned group: the node groups that admit the load balancer's
    /// group (added to `all_groups`), and what the plan needs to revoke
    /// rules safely.
    async fn clb_actual(
        &self,
        name: &str,
        vpc_id: &str,
        desired: &elb::Desired,
        lb: Option<elb::ActualLb>,
        owned_group: Option<sg::SecurityGroup>,
        all_groups: &mut BTreeMap<String, sg::SecurityGroup>,
    ) -> Result<Actual, CloudError> {
        // The LB's own group: the first configured one (a shared group:
        // annotation or cloud.conf), or the owned `k8s-elb-*` group.
        let (lb_group, shared) = match desired.groups.first() {
            Some(elb::GroupRef::Id(id)) => (Some(id.clone()), true),
            _ => (owned_group.as_ref().map(|g| g.id.clone()), false),
        };
        // Every group that admits the load balancer's group, backend or not:
        // a group that stopped being a backend's still has the rule.
        let mut node_groups_with_rule = BTreeSet::new();
        if let Some(id) = &lb_group {
            // Every group's rule from the owned group is this CCM's to
            // revoke only when the group is proven its own.
            let owned = owned_group.as_ref().is_some_and(|g| {
                &g.id == id
                    && ownership::prove(
                        Made::LoadBalancerGroup,
                        &g.name,
                        &g.tags,
                        &self.cluster_id,
                        None,
                    )
                    .is_ok()
            });
            self.add_referencing(all_groups, vpc_id, id, owned).await?;
            node_groups_with_rule = admitting(all_groups.values(), id);
        }
        // A shared LB group's node rule that this load balancer no longer
        // needs: look up who else uses the group (only then; see
        // elb::Actual::shared_group_needed).
        let shared_group_needed = match (&lb_group, &desired.node_groups) {
            (Some(g), Some(want)) if shared && !node_groups_with_rule.is_subset(want) => {
                self.node_groups_used_by_others(g, name, vpc_id).await?
            }
            _ => None,
        };
        // An owned group the Service no longer wants: which node groups admit it.
        let owned_group_node_rules = match &owned_group {
            Some(g) if desired.owned_group.is_none() => {
                if lb_group.as_ref() != Some(&g.id) {
                    self.add_referencing(all_groups, vpc_id, &g.id, true)
                        .await?;
                }
                admitting(all_groups.values(), &g.id)
            }
            _ => BTreeSet::new(),
        };
        Ok(Actual {
            lb,
            owned_group,
            node_groups_with_rule,
            shared_group_needed,
            shared_lb_group: None,
            owned_group_node_rules,
        })
    }
}

impl LoadBalancers for AwsLoadBalancers {
    async fn ensure(&self, req: &EnsureRequest) -> Result<Ensured, CloudError> {
        let adopted = self.adopted_sync(req, req.scope == Scope::Full).await?;
        let mut ensured = self.ensure_named(&adopted.request).await?;
        ensured.warnings.extend(adopted.refused);
        if let (Some(from), Scope::Full) = (&adopted.kept_from, req.scope) {
            let network = req.spec.kind == LoadBalancerKind::Network;
            let name = elb::load_balancer_name(&adopted.request.uid);
            self.finish_adoption(&name, network, &req.service_key, from)
                .await?;
        }
        Ok(ensured)
    }

    async fn update_targets(&self, req: &EnsureRequest) -> Result<Ensured, CloudError> {
        let adopted = self.adopted_sync(req, false).await?;
        if adopted.refused.is_some() || adopted.kept_from.is_some() {
            // Not the Service's yet, or its adoption not complete: a full sync says and does so.
            return LoadBalancers::ensure(self, req).await;
        }
        let req = &*adopted.request;
        let result = self.update_targets_or_ensure(req).await;
        // A classic ELB's description lists its instances: a sweep that
        // started before the move no longer answers for it.
        let name = &elb::load_balancer_name(&req.uid);
        let classic = None;
        self.memory()
            .applied(Applied::TargetsMoved { name, classic });
        result
    }

    fn name(&self, uid: &str) -> String {
        elb::load_balancer_name(uid)
    }

    /// Removes whichever kind the Service has (or had): both are looked
    /// for; an adopted one ([`adopt`]) by the name the Service gives.
    async fn ensure_deleted(
        &self,
        service_key: &str,
        uid: &str,
        protected: bool,
        adopted: Option<&str>,
    ) -> Result<Removed, CloudError> {
        let uid = self.adopted_uid(service_key, uid, adopted).await?;
        let uid = uid.as_str();
        self.memory().applied(Applied::ServiceGone { uid });
        let deleted = async {
            let clb = self.delete_clb(service_key, uid, false, protected).await?;
            let clb_kept = clb.kept.is_some();
            let nlb = (self.delete_nlb(service_key, uid, false, protected, clb_kept)).await?;
            Ok(Removed {
                changed: clb.changed || nlb.changed,
                kept: clb.kept.or(nlb.kept),
            })
        }
        .await;
        self.memory().applied(Applied::ServiceGone { uid });
        deleted
    }
}

impl AwsLoadBalancers {
    /// [`LoadBalancers::ensure`] of a request whose UID names the load
    /// balancer ([`adopt`]).
    async fn ensure_named(&self, req: &EnsureRequest) -> Result<Ensured, CloudError> {
        self.memory().before_sync(&req.uid);
        let result = match (req.scope, req.spec.kind) {
            (Scope::Upkeep { node_rules }, _) => self.upkeep(req, node_rules).await,
            (Scope::Full, LoadBalancerKind::Network) => self.ensure_nlb(req).await,
            (Scope::Full, _) => self.ensure_clb(req).await,
        };
        // AWS refused one of the sync's changes (a dual-stack type on
        // IPv4-only subnets, an attribute it will not take): that change
        // stops, not the upkeep of a live load balancer. Its backends and
        // node rules still follow the nodes, as a refused annotation value
        // leaves them (`upkeep`), and the refusal is still reported.
        if let (Scope::Full, Err(e)) = (req.scope, &result)
            && e.is_rejected()
            && let Err(e) = self.upkeep(req, true).await
        {
            tracing::warn!(service = %req.service_key, error = %e, "keeping the load balancer's backends current failed too");
        }
        if result.is_err() {
            let uid = &req.uid;
            self.memory().applied(Applied::SyncFailed { uid });
        }
        result
    }
}

/// A Service's backend instances: positions in the cached sweep, which is
/// shared rather than copied (a Service that targets every node would
/// otherwise copy the whole sweep on every sync, once per concurrent sync),
/// and the few looked up apart from it.
struct Backends {
    swept: Arc<Vec<crate::aws::Ec2Instance>>,
    picked: Vec<usize>,
    extra: Vec<crate::aws::Ec2Instance>,
}

impl Backends {
    /// Every backend, sorted by instance ID.
    fn list(&self) -> Vec<&crate::aws::Ec2Instance> {
        let mut all: Vec<&crate::aws::Ec2Instance> = self
            .picked
            .iter()
            .filter_map(|at| self.swept.get(*at))
            .chain(&self.extra)
            .collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }
}

impl AwsLoadBalancers {
    /// The cluster's VPC: cloud.conf's, else the first swept instance's.
    fn cluster_vpc(&self, swept: &[crate::aws::Ec2Instance]) -> Option<String> {
        (self.cloud.vpc.clone()).or_else(|| {
            swept
                .iter()
                .find_map(|i| i.vpc_id.as_deref().map(str::to_string))
        })
    }

    /// The VPC and the Service's live backend instances, from the cached sweep.
    /// What a plan of either kind works in: `subnets`, the backends'
    /// instances, the node groups that get the load balancer's rule.
    fn environment(
        &self,
        subnets: Vec<String>,
        backends: &[&crate::aws::Ec2Instance],
        node_groups: BTreeSet<String>,
    ) -> elb::Environment {
        elb::Environment {
            subnets,
            instances: backends.iter().map(|i| i.id.clone()).collect(),
            node_groups,
            cluster_name: self.cluster_name.clone(),
            legacy_cluster_tag: self.aws.writes_legacy_cluster_tag(),
        }
    }

    async fn vpc_and_backends(
        &self,
        instance_ids: &BTreeSet<String>,
    ) -> Result<(String, Backends), CloudError> {
        let swept = self.aws.cluster_instances().await?;
        let picked: Vec<usize> = swept
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.state.is_terminated() && instance_ids.contains(&i.id))
            .map(|(at, _)| at)
            .collect();
        let mut extra = Vec::new();
        // A node that joined after the cached sweep was read (or whose
        // instance lacks the cluster tag) is looked up by ID: these lookups
        // coalesce into one DescribeInstances across concurrent syncs. Left
        // out, the node would wait for the next sweep and the next sync.
        let swept_ids: BTreeSet<&str> = swept.iter().map(|i| i.id.as_str()).collect();
        let missing: Vec<&String> = instance_ids
            .iter()
            .filter(|id| !swept_ids.contains(id.as_str()))
            .collect();
        let looked_up =
            futures::future::join_all(missing.iter().map(|id| self.aws.instance_by_id(id))).await;
        for found in looked_up {
            match found {
                Ok(instance) if !instance.state.is_terminated() => extra.push(instance),
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        let vpc_id = self.cluster_vpc(&swept).ok_or_else(|| {
                CloudError::invalid(
                    "cannot tell the cluster's VPC: set VPC in cloud.conf or tag the node instances with the cluster tag",
                )
            })?;
        Ok((
            vpc_id,
            Backends {
                swept,
                picked,
                extra,
            },
        ))
    }

    async fn ensure_nlb(&self, req: &EnsureRequest) -> Result<Ensured, CloudError> {
        let mut p = self.plan_nlb(req, true).await?;
        let mut warnings = std::mem::take(&mut p.warnings);
        let node_groups = std::mem::take(&mut p.groups);
        let applied = self
            .apply_nlb(&p.name, &p.vpc_id, &p.actual, &p.changes)
            .await?;
        if let Some(e) = &applied.refused_groups {
            // The NLB keeps its groups: the node rules follow those.
            p.changes
                .retain(|c| !matches!(c, nlb::Change::SetSecurityGroups(_)));
            let owned = applied.owned_group.as_deref();
            warnings.push(groups_refused_warning(req, &p, owned, e));
        }
        let created = p.actual.lb.is_none();
        // The target groups as applied: (ARN, port).
        let groups: Vec<(String, i32)> = p
            .desired
            .target_groups
            .iter()
            .filter_map(|g| Some((applied.target_groups.get(&g.name)?.clone(), g.port)))
            .collect();
        let instances = &p.desired.instances;
        (self.memory()).applied(Applied::GroupsHold {
            groups: &groups,
            instances,
        });
        self.settings_synced(&p.name, &p.settings, created, !p.changes.is_empty());
        self.record_refused_listeners(&req.service_key, &applied.refused_listeners, &mut warnings);
        let mut described: Vec<String> = p.changes.iter().map(nlb::plan::describe).collect();
        if p.handover {
            described.push("deleted the classic ELB the Service had before".into());
        }
        if p.creates_shared {
            described.insert(0, "created the shared backend security group".into());
        }

        if !self.cloud.disable_security_group_ingress {
            let before = warnings.len();
            let owned = applied.owned_group.as_deref();
            let done =
                (self.sync_nlb_node_rules(req, &p, node_groups, owned, &mut warnings)).await?;
            described.extend(done);
            // Leaving SharedBackendGroup: the node rules are in (none
            // refused or held back by a warning), so the NLB lets it go.
            let detached = warnings.len() == before && self.detach_shared_group(&p, owned).await?;
            if detached {
                described.push("detached the shared backend security group".into());
            }
            // Out of the mode, the NLB no longer carrying it: the group's
            // rules go once no NLB carries it.
            if let Some(shared) = &p.shared_id
                && (detached || p.shared == nlb::shared_group::SharedUse::None)
                && self.revoke_unused_shared_rules(&p, shared).await?
            {
                described.push(
                    "revoked the shared backend group's node rules: no NLB carries it".into(),
                );
            }
        }
        described.extend(self.delete_left_behind(&p).await);
        let hostname = applied.dns_name.unwrap_or_default();
        if groups.len() == p.desired.target_groups.len()
            && warnings.is_empty()
            && !hostname.is_empty()
        {
            let lb = targets::KnownLb::Network {
                name: p.name.clone(),
                groups,
            };
            self.ensured_in_full(req, &hostname, p.backend_groups, lb);
        }
        Ok(Ensured {
            hostname,
            changes: described,
            warnings: merged(warnings),
        })
    }
}
