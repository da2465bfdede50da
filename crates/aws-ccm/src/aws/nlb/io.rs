//! NLB, I/O half: the elbv2 calls that apply a plan, each through the one
//! door. The reads are in [`super::read`].

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types as t;

use super::{
    Actual, Change, HealthCheck, Listener, SubnetMapping, TARGET_CHUNK, TargetGroup, TgRef,
};
use crate::aws::client::SdkCall;
use crate::aws::client::consistency::{AfterCreate, until_visible};
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::elb::GroupRef;
use crate::aws::memory::{Journal, Write};
use crate::aws::security_groups as sg;
use crate::aws::{Aws, AwsClient};
use aws_sdk_elasticloadbalancingv2::Client;

mod listeners;

fn sdk_tags(tags: &BTreeMap<String, String>) -> Vec<t::Tag> {
    tags.iter()
        .map(|(k, v)| t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn sdk_mappings(m: &[SubnetMapping]) -> Vec<t::SubnetMapping> {
    m.iter()
        .map(|m| {
            t::SubnetMapping::builder()
                .subnet_id(&m.subnet)
                .set_allocation_id(m.allocation_id.clone())
                .set_private_ipv4_address(m.private_ipv4.clone())
                .build()
        })
        .collect()
}

/// The instances as targets on `port`, [`TARGET_CHUNK`] per call.
fn target_chunks(ids: &BTreeSet<String>, port: i32) -> Vec<Vec<t::TargetDescription>> {
    let all: Vec<_> = ids
        .iter()
        .map(|id| t::TargetDescription::builder().id(id).port(port).build())
        .collect();
    all.chunks(TARGET_CHUNK).map(<[_]>::to_vec).collect()
}

/// What applying a plan produced.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// DNS name of the NLB (created or existing).
    pub(crate) dns_name: Option<String>,
    lb_arn: Option<String>,
    /// The target groups' ARNs by name, those the plan created included.
    pub(crate) target_groups: BTreeMap<String, String>,
    /// Listener writes IAM refused (`AccessDenied`): the listener's ARN and
    /// the error. The other changes went ahead; the caller records these.
    pub(crate) refused_listeners: Vec<(String, AwsError)>,
    /// AWS refused the plan's `SetSecurityGroups` (over the groups a load
    /// balancer may carry, a group it does not take, IAM): the NLB keeps
    /// the groups it had and the other changes went ahead.
    pub(crate) refused_groups: Option<AwsError>,
    /// The ARNs of the listeners the plan created, by port.
    listeners: BTreeMap<i32, String>,
    /// The owned (managed) group's ID, the one the plan created included.
    pub(crate) owned_group: Option<String>,
}

/// Applies a plan in order.
pub(crate) async fn apply(
    aws: &Aws,
    journal: &mut Journal,
    name: &str,
    vpc_id: &str,
    actual: &Actual,
    changes: &[Change],
) -> Result<Applied, AwsError> {
    let mut at = Applying {
        aws,
        journal,
        name,
        vpc_id,
        owned: actual.owned_group.as_ref().map(|g| g.id.clone()),
        out: Applied {
            lb_arn: actual.lb.as_ref().map(|l| l.arn.clone()),
            dns_name: actual.lb.as_ref().map(|l| l.dns_name.clone()),
            target_groups: actual
                .target_groups
                .iter()
                .map(|g| (g.name.clone(), g.arn.clone()))
                .collect(),
            refused_listeners: Vec::new(),
            refused_groups: None,
            listeners: BTreeMap::new(),
            owned_group: None,
        },
    };
    let mut window = AfterCreate::default();
    // Deregistrations applied before their turn, to make room at the quota.
    let mut done_early = BTreeSet::new();
    for (i, change) in changes.iter().enumerate() {
        if done_early.contains(&i) {
            continue;
        }
        tracing::info!(load_balancer = name, change = %super::plan::describe(change), "applying");
        let mut made_room = false;
        loop {
            match at.step(change).await {
                Ok(()) => break,
                // A step naming an object this apply created moments ago.
                Err(e) if window.retry(&e).await => {}
                // The plan registers first so that a replaced node's group
                // never shrinks; at the targets quota that order stalls
                // the replacement, so the leaving targets go first and the
                // register is sent again, once (as the Go CCM orders it).
                Err(e) if e.is_target_quota() && !made_room => {
                    let leaving = leaving_targets(changes, i, &done_early);
                    if leaving.is_empty() {
                        return Err(e);
                    }
                    tracing::info!(load_balancer = name, error = %e, "at the targets quota: deregistering the leaving targets first");
                    for j in leaving {
                        let deregister = &changes[j];
                        tracing::info!(load_balancer = name, change = %super::plan::describe(deregister), "applying");
                        at.step(deregister).await?;
                        done_early.insert(j);
                    }
                    made_room = true;
                }
                Err(e) => return Err(e),
            }
        }
        let creates = matches!(
            change,
            Change::CreateSecurityGroup(_)
                | Change::CreateLoadBalancer { .. }
                | Change::CreateTargetGroup { .. }
                | Change::CreateListener { .. }
        );
        if creates {
            window.created(aws);
        }
    }
    at.out.owned_group = at.owned;
    Ok(at.out)
}

/// The plan's deregistrations after step `at` not yet applied (`done`):
/// every target leaving this NLB, whichever of its groups, since AWS counts
/// the quota over the load balancer's groups together.
pub(crate) fn leaving_targets(changes: &[Change], at: usize, done: &BTreeSet<usize>) -> Vec<usize> {
    changes
        .iter()
        .enumerate()
        .skip(at + 1)
        .filter(|(j, c)| matches!(c, Change::DeregisterTargets { .. }) && !done.contains(j))
        .map(|(j, _)| j)
        .collect()
}

/// What one plan's steps share: the NLB, the owned group's ID, the target
/// groups' ARNs by name (as steps create them) and the listener writes IAM
/// refused.
struct Applying<'a> {
    aws: &'a Aws,
    journal: &'a mut Journal,
    name: &'a str,
    vpc_id: &'a str,
    owned: Option<String>,
    /// What the steps produced so far.
    out: Applied,
}

impl Applying<'_> {
    /// Each step applies itself.
    async fn step(&mut self, change: &Change) -> Result<(), AwsError> {
        match change {
            Change::CreateSecurityGroup(g) => {
                let (vpc, journal) = (self.vpc_id, &mut *self.journal);
                let id = sg::io::create(self.aws, journal, vpc, &g.name, &g.description, &g.tags);
                self.owned = Some(id.await?);
                Ok(())
            }
            Change::AuthorizeIngress(rules) => {
                let id = GroupRef::Owned.resolve(self.owned.as_ref(), self.name)?;
                sg::io::authorize(self.aws, self.journal, &id, rules).await
            }
            Change::RevokeIngress(rules) => {
                let id = GroupRef::Owned.resolve(self.owned.as_ref(), self.name)?;
                sg::io::revoke(self.aws, self.journal, &id, rules).await
            }
            Change::SetSecurityGroups(refs) => self.set_security_groups(refs).await,
            Change::DeleteSecurityGroup(id) => {
                crate::aws::elb::io::delete_owned_group(self.aws, self.journal, id).await
            }
            Change::DeleteLoadBalancer { arn, .. } => self.delete_lb(arn).await,
            Change::CreateLoadBalancer {
                internal,
                ip_address_type,
                subnet_mappings,
                security_groups,
                tags,
            } => {
                let groups = self.groups(security_groups)?;
                self.create_lb(*internal, ip_address_type, subnet_mappings, groups, tags)
                    .await
            }
            Change::SetSubnets(m) => self.set_subnets(m).await,
            Change::SetIpAddressType(kind) => self.set_ip_address_type(kind).await,
            Change::AddTags { arn, tags } => self.add_tags(arn.as_deref(), tags).await,
            Change::RemoveTags { arn, keys } => self.remove_tags(arn.as_deref(), keys).await,
            Change::ModifyAttributes(attrs) => self.modify_attributes(attrs).await,
            Change::CreateTargetGroup { group, tags } => {
                self.create_target_group(group, tags).await
            }
            Change::ModifyHealthCheck { arn, health } => {
                self.modify_health_check(arn, health).await
            }
            Change::ModifyTargetGroupAttributes {
                target_group,
                attributes,
            } => {
                self.modify_target_group_attributes(target_group, attributes)
                    .await
            }
            Change::RegisterTargets {
                target_group,
                port,
                instances,
            } => self.register(target_group, *port, instances).await,
            Change::DeregisterTargets {
                arn,
                port,
                instances,
            } => self.deregister(arn, *port, instances).await,
            Change::CreateListener { .. }
            | Change::ModifyListener { .. }
            | Change::ModifyListenerAttributes { .. }
            | Change::DeleteListener { .. } => self.listener_step(change).await,
            Change::DeleteTargetGroup { arn, name } => {
                let deleted = self.delete_target_group(arn).await;
                if deleted.is_err() {
                    self.journal.push(Write::TargetGroupLeft {
                        load_balancer: self.name.to_string(),
                        arn: arn.clone(),
                        name: name.clone(),
                    });
                }
                deleted
            }
        }
    }

    /// A target group's health check, changed in place.
    async fn modify_health_check(&self, arn: &str, health: &HealthCheck) -> Result<(), AwsError> {
        self.call(Operation::Elbv2ModifyTargetGroup, |c| {
            c.modify_target_group()
                .target_group_arn(arn)
                .health_check_port(&health.port)
                .set_health_check_path(health.path.clone())
                .healthy_threshold_count(health.healthy)
                .unhealthy_threshold_count(health.unhealthy)
                .set_health_check_timeout_seconds(health.timeout)
                .send()
        })
        .await
    }

    /// One call whose answer the plan does not need.
    async fn call<F: SdkCall<Client>>(&self, op: Operation, f: F) -> Result<(), AwsError> {
        self.aws.elbv2(op, f).await.map(drop)
    }

    /// The IDs group references stand for.
    fn groups(&self, refs: &[GroupRef]) -> Result<Vec<String>, AwsError> {
        refs.iter()
            .map(|r| r.resolve(self.owned.as_ref(), self.name))
            .collect()
    }

    /// The NLB's ARN; a step that needs it follows the create step.
    fn lb(&self) -> Result<String, AwsError> {
        self.out.lb_arn.clone().ok_or_else(|| AwsError::NotFound {
            operation: Operation::Elbv2CreateLoadBalancer,
            what: format!("the NLB {}", self.name),
        })
    }

    /// The ARN a target group reference stands for.
    fn target_group(&self, r: &TgRef) -> Result<String, AwsError> {
        match r {
            TgRef::Arn(a) => Ok(a.clone()),
            TgRef::Name(n) => {
                self.out
                    .target_groups
                    .get(n)
                    .cloned()
                    .ok_or_else(|| AwsError::NotFound {
                        operation: Operation::Elbv2CreateTargetGroup,
                        what: format!("the target group {n}"),
                    })
            }
        }
    }

    /// A refusal is kept in [`Applied::refused_groups`], not returned: the
    /// groups are one setting of a live NLB, and its targets and listeners
    /// are kept current without it.
    async fn set_security_groups(&mut self, refs: &[GroupRef]) -> Result<(), AwsError> {
        let arn = self.lb()?;
        let groups = self.groups(refs)?;
        let set = self.call(Operation::Elbv2SetSecurityGroups, |c| {
            c.set_security_groups()
                .load_balancer_arn(&arn)
                .set_security_groups(Some(groups.clone()))
                .send()
        });
        match set.await {
            Ok(_) => Ok(()),
            Err(e) if e.is_refusal() => {
                tracing::info!(load_balancer = self.name, groups = ?groups, error = %e, "AWS refused the NLB's security groups: it keeps those it has");
                self.out.refused_groups = Some(e);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn delete_lb(&mut self, arn: &str) -> Result<(), AwsError> {
        let deleted = self.call(Operation::Elbv2DeleteLoadBalancer, |c| {
            c.delete_load_balancer().load_balancer_arn(arn).send()
        });
        match deleted.await {
            // The answer was lost: done if the load balancer is gone.
            Err(e)
                if e.may_have_been_applied()
                    && super::read::describe(self.aws, self.name).await?.is_some() =>
            {
                return Err(e);
            }
            Err(e) if !e.may_have_been_applied() && !e.is_not_found() => return Err(e),
            _ => {}
        }
        self.out.lb_arn = None;
        self.out.dns_name = None;
        Ok(())
    }

    async fn create_lb(
        &mut self,
        internal: bool,
        ip_address_type: &str,
        subnet_mappings: &[SubnetMapping],
        groups: Vec<String>,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let name = self.name;
        let mappings = sdk_mappings(subnet_mappings);
        let tags = sdk_tags(tags);
        let groups = (!groups.is_empty()).then_some(groups);
        let create = || {
            self.aws.elbv2(Operation::Elbv2CreateLoadBalancer, |c| {
                c.create_load_balancer()
                    .name(name)
                    .r#type(t::LoadBalancerTypeEnum::Network)
                    .scheme(if internal {
                        t::LoadBalancerSchemeEnum::Internal
                    } else {
                        t::LoadBalancerSchemeEnum::InternetFacing
                    })
                    .ip_address_type(t::IpAddressType::from(ip_address_type))
                    .set_subnet_mappings(Some(mappings.clone()))
                    .set_security_groups(groups.clone())
                    .set_tags(Some(tags.clone()))
                    .send()
            })
        };
        (self.out.lb_arn, self.out.dns_name) = match create().await {
            Ok(out) => arn_and_dns(out.load_balancers().first()),
            // An answer was lost: read before re-creating, since a second
            // create could make a second NLB.
            Err(e) if e.may_have_been_applied() || e.is_already_exists() => {
                tracing::info!(load_balancer = name, error = %e, "NLB create may have been applied; reading it");
                match existing_lb(self.aws, name).await {
                    Ok(found) => found,
                    Err(missing) if missing.is_not_found() => {
                        arn_and_dns(create().await?.load_balancers().first())
                    }
                    Err(other) => return Err(other),
                }
            }
            Err(e) => return Err(e),
        };
        Ok(())
    }

    async fn set_subnets(&self, m: &[SubnetMapping]) -> Result<(), AwsError> {
        let arn = self.lb()?;
        let mappings = sdk_mappings(m);
        self.call(Operation::Elbv2SetSubnets, |c| {
            c.set_subnets()
                .load_balancer_arn(&arn)
                .set_subnet_mappings(Some(mappings.clone()))
                .send()
        })
        .await
    }

    async fn set_ip_address_type(&self, kind: &str) -> Result<(), AwsError> {
        let arn = self.lb()?;
        self.call(Operation::Elbv2SetIpAddressType, |c| {
            c.set_ip_address_type()
                .load_balancer_arn(&arn)
                .ip_address_type(t::IpAddressType::from(kind))
                .send()
        })
        .await
    }

    async fn modify_attributes(&self, attrs: &BTreeMap<String, String>) -> Result<(), AwsError> {
        let arn = self.lb()?;
        let attrs: Vec<t::LoadBalancerAttribute> = attrs
            .iter()
            .map(|(k, v)| t::LoadBalancerAttribute::builder().key(k).value(v).build())
            .collect();
        self.call(Operation::Elbv2ModifyLoadBalancerAttributes, |c| {
            c.modify_load_balancer_attributes()
                .load_balancer_arn(&arn)
                .set_attributes(Some(attrs.clone()))
                .send()
        })
        .await
    }

    /// Creates the group, or adopts the one an earlier, interrupted sync
    /// made; its ARN is then known by name.
    async fn create_target_group(
        &mut self,
        group: &TargetGroup,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let aws = self.aws;
        let vpc_id = self.vpc_id;
        let tags = sdk_tags(tags);
        let h = &group.health;
        let res = aws
            .elbv2(Operation::Elbv2CreateTargetGroup, |c| {
                c.create_target_group()
                    .name(&group.name)
                    .vpc_id(vpc_id)
                    .port(group.port)
                    .protocol(t::ProtocolEnum::from(group.protocol.as_str()))
                    .target_type(t::TargetTypeEnum::Instance)
                    .health_check_protocol(t::ProtocolEnum::from(h.protocol.as_str()))
                    .health_check_port(&h.port)
                    .set_health_check_path(h.path.clone())
                    .health_check_interval_seconds(h.interval)
                    .healthy_threshold_count(h.healthy)
                    .unhealthy_threshold_count(h.unhealthy)
                    .set_health_check_timeout_seconds(h.timeout)
                    .set_tags(Some(tags.clone()))
                    .send()
            })
            .await;
        let arn = match res {
            Ok(out) => out
                .target_groups()
                .first()
                .and_then(|g| g.target_group_arn())
                .map(str::to_string),
            // It exists: made by an attempt whose answer was lost, or by a
            // sync that read before it was visible.
            Err(e) if e.is_already_exists() => {
                tracing::info!(target_group = %group.name, error = %e, "target group exists already; reading it");
                Some(existing_target_group(aws, &group.name).await?)
            }
            Err(e) => return Err(e),
        };
        if let Some(arn) = arn {
            self.out.target_groups.insert(group.name.clone(), arn);
        }
        Ok(())
    }

    async fn modify_target_group_attributes(
        &self,
        target_group: &TgRef,
        attributes: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let arn = self.target_group(target_group)?;
        let attrs: Vec<t::TargetGroupAttribute> = attributes
            .iter()
            .map(|(k, v)| t::TargetGroupAttribute::builder().key(k).value(v).build())
            .collect();
        self.call(Operation::Elbv2ModifyTargetGroupAttributes, |c| {
            c.modify_target_group_attributes()
                .target_group_arn(&arn)
                .set_attributes(Some(attrs.clone()))
                .send()
        })
        .await
    }

    /// Registers in chunks of [`TARGET_CHUNK`].
    async fn register(
        &self,
        target_group: &TgRef,
        port: i32,
        instances: &BTreeSet<String>,
    ) -> Result<(), AwsError> {
        let arn = self.target_group(target_group)?;
        for targets in target_chunks(instances, port) {
            self.call(Operation::Elbv2RegisterTargets, |c| {
                c.register_targets()
                    .target_group_arn(&arn)
                    .set_targets(Some(targets.clone()))
                    .send()
            })
            .await?;
        }
        Ok(())
    }

    /// Deregisters in chunks of [`TARGET_CHUNK`]; a target or group already
    /// gone is fine.
    async fn deregister(
        &self,
        arn: &str,
        port: i32,
        instances: &BTreeSet<String>,
    ) -> Result<(), AwsError> {
        for targets in target_chunks(instances, port) {
            let deregistered = self.call(Operation::Elbv2DeregisterTargets, |c| {
                c.deregister_targets()
                    .target_group_arn(arn)
                    .set_targets(Some(targets.clone()))
                    .send()
            });
            match deregistered.await {
                Err(e) if !(e.is_not_found() || e.is_invalid_target()) => {
                    return Err(e);
                }
                _ => {}
            }
        }
        Ok(())
    }

    async fn delete_target_group(&self, arn: &str) -> Result<(), AwsError> {
        let deleted = self.call(Operation::Elbv2DeleteTargetGroup, |c| {
            c.delete_target_group().target_group_arn(arn).send()
        });
        match deleted.await {
            Err(e) if !e.is_not_found() => Err(e),
            _ => Ok(()),
        }
    }
}

fn forward(tg_arn: &str) -> t::Action {
    t::Action::builder()
        .r#type(t::ActionTypeEnum::Forward)
        .target_group_arn(tg_arn)
        .build()
}

fn tls_parts(l: &Listener) -> (Option<Vec<t::Certificate>>, Option<String>) {
    if l.protocol != "TLS" {
        return (None, None);
    }
    (
        l.certificate
            .as_ref()
            .map(|c| vec![t::Certificate::builder().certificate_arn(c).build()]),
        l.ssl_policy.clone(),
    )
}

/// The ARN and DNS name of `lb`, when there is one.
fn arn_and_dns(lb: Option<&t::LoadBalancer>) -> (Option<String>, Option<String>) {
    (
        lb.and_then(|l| l.load_balancer_arn()).map(str::to_string),
        lb.and_then(|l| l.dns_name()).map(str::to_string),
    )
}

/// What `find` picks from `op`'s answer, read again until it finds it
/// ([`until_visible`], which names `what` when it gives up); an answer
/// saying the object is gone finds nothing.
async fn once_visible<F: SdkCall<Client>, T>(
    aws: &AwsClient,
    op: Operation,
    what: &str,
    call: F,
    find: impl Fn(F::Ok) -> Option<T>,
) -> Result<T, AwsError> {
    until_visible(aws, op, what, || async {
        match aws.elbv2(op, &call).await {
            Ok(out) => Ok(find(out)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await
}

/// The ARN and DNS name of the NLB `name`, waiting for it to become visible.
async fn existing_lb(
    aws: &AwsClient,
    name: &str,
) -> Result<(Option<String>, Option<String>), AwsError> {
    let what = format!("NLB {name}");
    let describe = |c: Client| c.describe_load_balancers().names(name).send();
    once_visible(
        aws,
        Operation::Elbv2DescribeLoadBalancers,
        &what,
        describe,
        |out| Some(arn_and_dns(Some(out.load_balancers().first()?))),
    )
    .await
}

/// The ARN of the target group `name`, waiting for it to become visible.
async fn existing_target_group(aws: &AwsClient, name: &str) -> Result<String, AwsError> {
    let what = format!("target group {name}");
    let describe = |c: Client| c.describe_target_groups().names(name).send();
    once_visible(
        aws,
        Operation::Elbv2DescribeTargetGroups,
        &what,
        describe,
        |out| Some(out.target_groups().first()?.target_group_arn()?.to_string()),
    )
    .await
}
