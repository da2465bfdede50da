//! The elbv2 calls that read an NLB and its target groups and apply a plan.

use std::collections::BTreeMap;

use aws_sdk_elasticloadbalancingv2::types as t;

use super::{
    Actual, ActualLb, ActualListener, ActualTargetGroup, Change, HealthCheck, Listener,
    SubnetMapping, TARGET_CHUNK, TgRef,
};
use crate::aws::client::AwsClient;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::elb::GroupRef;
use crate::aws::security_groups as sg;
use crate::aws::tags::key_values;

fn sdk_tags(tags: &BTreeMap<String, String>) -> Vec<t::Tag> {
    tags.iter()
        .map(|(k, v)| t::Tag::builder().key(k).value(v).build())
        .collect()
}

fn not_found(e: &AwsError) -> bool {
    e.is_not_found()
        || matches!(
            e.code(),
            Some("LoadBalancerNotFound" | "TargetGroupNotFound" | "ListenerNotFound")
        )
}

/// Tags of elbv2 resources by ARN (20 per call, the API's limit).
pub async fn tags_of(
    aws: &AwsClient,
    arns: &[String],
) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
    let mut out = BTreeMap::new();
    for chunk in arns.chunks(20) {
        let res = aws
            .elbv2(Operation::Elbv2DescribeTags, |c| {
                c.describe_tags()
                    .set_resource_arns(Some(chunk.to_vec()))
                    .send()
            })
            .await?;
        for d in res.tag_descriptions() {
            if let Some(arn) = d.resource_arn() {
                out.insert(
                    arn.to_string(),
                    key_values(d.tags().iter().map(|t| (t.key(), t.value()))),
                );
            }
        }
    }
    Ok(out)
}

/// The NLB named `name` with its tags, attributes and listeners, or `None`.
pub async fn read_lb(aws: &AwsClient, name: &str) -> Result<Option<ActualLb>, AwsError> {
    let out = match aws
        .elbv2(Operation::Elbv2DescribeLoadBalancers, |c| {
            c.describe_load_balancers().names(name).send()
        })
        .await
    {
        Ok(out) => out,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(lb) = out
        .load_balancers()
        .iter()
        .find(|l| l.r#type() == Some(&t::LoadBalancerTypeEnum::Network))
    else {
        return Ok(None);
    };
    let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
    let tags = tags_of(aws, std::slice::from_ref(&arn))
        .await?
        .remove(&arn)
        .unwrap_or_default();
    let attrs = aws
        .elbv2(Operation::Elbv2DescribeLoadBalancerAttributes, |c| {
            c.describe_load_balancer_attributes()
                .load_balancer_arn(&arn)
                .send()
        })
        .await?;
    let listeners = aws
        .elbv2(Operation::Elbv2DescribeListeners, |c| {
            c.describe_listeners().load_balancer_arn(&arn).send()
        })
        .await?;
    Ok(Some(ActualLb {
        dns_name: lb.dns_name().unwrap_or_default().to_string(),
        internal: lb.scheme() == Some(&t::LoadBalancerSchemeEnum::Internal),
        ip_address_type: lb
            .ip_address_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_else(|| "ipv4".into()),
        subnet_mappings: lb
            .availability_zones()
            .iter()
            .filter_map(|z| {
                let addr = z
                    .load_balancer_addresses()
                    .iter()
                    .find(|a| a.allocation_id().is_some() || a.private_ipv4_address().is_some());
                Some(SubnetMapping {
                    subnet: z.subnet_id()?.to_string(),
                    allocation_id: addr.and_then(|a| a.allocation_id()).map(str::to_string),
                    private_ipv4: addr
                        .and_then(|a| a.private_ipv4_address())
                        .map(str::to_string),
                })
            })
            .collect(),
        security_groups: lb.security_groups().to_vec(),
        addresses_reported: lb
            .availability_zones()
            .iter()
            .any(|z| !z.load_balancer_addresses().is_empty()),
        tags,
        attributes: key_values(attrs.attributes().iter().map(|a| (a.key(), a.value()))),
        listeners: listeners
            .listeners()
            .iter()
            .filter_map(|l| {
                Some(ActualListener {
                    arn: l.listener_arn()?.to_string(),
                    port: l.port()?,
                    protocol: l.protocol()?.as_str().to_string(),
                    certificate: l
                        .certificates()
                        .first()
                        .and_then(|c| c.certificate_arn())
                        .map(str::to_string),
                    ssl_policy: l.ssl_policy().map(str::to_string),
                    target_group_arn: l
                        .default_actions()
                        .first()
                        .and_then(|a| a.target_group_arn())
                        .map(str::to_string),
                })
            })
            .collect(),
        arn,
    }))
}

fn health_of(g: &t::TargetGroup) -> HealthCheck {
    let protocol = g
        .health_check_protocol()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "TCP".into());
    HealthCheck {
        path: if protocol == "TCP" {
            None
        } else {
            g.health_check_path().map(str::to_string)
        },
        protocol,
        port: g.health_check_port().unwrap_or("traffic-port").to_string(),
        interval: g.health_check_interval_seconds().unwrap_or(30),
        healthy: g.healthy_threshold_count().unwrap_or(3),
        unhealthy: g.unhealthy_threshold_count().unwrap_or(3),
    }
}

/// Full state (tags, attributes, registered targets) of the given groups.
async fn complete(
    aws: &AwsClient,
    groups: Vec<t::TargetGroup>,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    let arns: Vec<String> = groups
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let mut tags = tags_of(aws, &arns).await?;
    let mut out = Vec::new();
    for g in &groups {
        let Some(arn) = g.target_group_arn() else {
            continue;
        };
        let attrs = aws
            .elbv2(Operation::Elbv2DescribeTargetGroupAttributes, |c| {
                c.describe_target_group_attributes()
                    .target_group_arn(arn)
                    .send()
            })
            .await?;
        let health = aws
            .elbv2(Operation::Elbv2DescribeTargetHealth, |c| {
                c.describe_target_health().target_group_arn(arn).send()
            })
            .await?;
        let port = g.port().unwrap_or_default();
        out.push(ActualTargetGroup {
            arn: arn.to_string(),
            name: g.target_group_name().unwrap_or_default().to_string(),
            protocol: g
                .protocol()
                .map(|p| p.as_str().to_string())
                .unwrap_or_default(),
            port,
            health: health_of(g),
            tags: tags.remove(arn).unwrap_or_default(),
            attributes: key_values(attrs.attributes().iter().map(|a| (a.key(), a.value()))),
            targets: health
                .target_health_descriptions()
                .iter()
                .filter(|d| {
                    d.target_health().and_then(|h| h.reason())
                        != Some(&t::TargetHealthReasonEnum::DeregistrationInProgress)
                })
                .filter_map(|d| d.target())
                .filter(|t| t.port().is_none_or(|p| p == port))
                .filter_map(|t| t.id().map(str::to_string))
                .collect(),
        });
    }
    Ok(out)
}

/// The target groups behind the NLB (those its listeners may point at).
pub async fn read_target_groups(
    aws: &AwsClient,
    lb_arn: &str,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    let res = match aws
        .elbv2(Operation::Elbv2DescribeTargetGroups, |c| {
            c.describe_target_groups().load_balancer_arn(lb_arn).send()
        })
        .await
    {
        Ok(res) => res,
        Err(e) if not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    complete(aws, res.target_groups().to_vec()).await
}

/// Every target group whose name has the Service's prefix and whose tags
/// name the Service: finds groups no listener points at any more (after an
/// interrupted sync or a deleted NLB). One paginated listing; for deletes.
pub async fn find_service_target_groups(
    aws: &AwsClient,
    name_prefix: &str,
    service_key: &str,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    let mut candidates = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let page = aws
            .elbv2(Operation::Elbv2DescribeTargetGroups, |c| {
                c.describe_target_groups()
                    .set_marker(marker.clone())
                    .page_size(400)
                    .send()
            })
            .await?;
        candidates.extend(
            page.target_groups()
                .iter()
                .filter(|g| {
                    g.target_group_name()
                        .is_some_and(|n| n.starts_with(name_prefix))
                })
                .cloned(),
        );
        marker = page.next_marker().map(str::to_string);
        if marker.is_none() {
            break;
        }
    }
    let arns: Vec<String> = candidates
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let tags = tags_of(aws, &arns).await?;
    let mine: Vec<t::TargetGroup> = candidates
        .into_iter()
        .filter(|g| {
            g.target_group_arn()
                .and_then(|a| tags.get(a))
                .and_then(|t| t.get(crate::aws::tags::SERVICE_NAME_TAG))
                .is_some_and(|s| s == service_key)
        })
        .collect();
    complete(aws, mine).await
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

fn targets(ids: &[String], port: i32) -> Vec<t::TargetDescription> {
    ids.iter()
        .map(|id| t::TargetDescription::builder().id(id).port(port).build())
        .collect()
}

/// What applying a plan produced.
#[derive(Debug, Default)]
pub struct Applied {
    /// DNS name of the NLB (created or existing).
    pub dns_name: Option<String>,
    pub lb_arn: Option<String>,
    /// Listener writes IAM refused (`AccessDenied`): the listener's ARN and
    /// the error. The other changes went ahead; the caller records these.
    pub refused_listeners: Vec<(String, AwsError)>,
}

/// Whether `e` is IAM's refusal (`AccessDenied`, `UnauthorizedOperation`).
fn iam_refused(e: &AwsError) -> bool {
    e.code()
        .is_some_and(|c| crate::aws::client::DRY_RUN_DENIED_CODES.contains(&c))
}

/// Applies a plan in order.
pub async fn apply(
    aws: &AwsClient,
    name: &str,
    vpc_id: &str,
    actual: &Actual,
    changes: &[Change],
) -> Result<Applied, AwsError> {
    let mut owned: Option<String> = actual.owned_group.as_ref().map(|g| g.id.clone());
    let groups_of = |refs: &[GroupRef], owned: &Option<String>| -> Result<Vec<String>, AwsError> {
        refs.iter()
            .map(|r| match r {
                GroupRef::Id(id) => Ok(id.clone()),
                GroupRef::Owned => owned.clone().ok_or_else(|| AwsError::NotFound {
                    operation: Operation::Ec2CreateSecurityGroup,
                    what: format!("the owned security group of {name}"),
                }),
            })
            .collect()
    };
    let mut lb_arn: Option<String> = actual.lb.as_ref().map(|l| l.arn.clone());
    let mut refused_listeners = Vec::new();
    let mut dns = actual.lb.as_ref().map(|l| l.dns_name.clone());
    let mut tg_arns: BTreeMap<String, String> = actual
        .target_groups
        .iter()
        .map(|g| (g.name.clone(), g.arn.clone()))
        .collect();
    let need_lb = |lb: &Option<String>| -> Result<String, AwsError> {
        lb.clone().ok_or_else(|| AwsError::NotFound {
            operation: Operation::Elbv2CreateLoadBalancer,
            what: format!("the NLB {name}"),
        })
    };
    let resolve = |r: &TgRef, arns: &BTreeMap<String, String>| -> Result<String, AwsError> {
        match r {
            TgRef::Arn(a) => Ok(a.clone()),
            TgRef::Name(n) => arns.get(n).cloned().ok_or_else(|| AwsError::NotFound {
                operation: Operation::Elbv2CreateTargetGroup,
                what: format!("the target group {n}"),
            }),
        }
    };
    for change in changes {
        tracing::info!(load_balancer = name, change = %super::describe(change), "applying");
        match change {
            Change::CreateSecurityGroup(g) => {
                owned = Some(sg::create(aws, vpc_id, &g.name, &g.description, &g.tags).await?);
            }
            Change::AuthorizeIngress(rules) => {
                let id = groups_of(&[GroupRef::Owned], &owned)?.remove(0);
                sg::authorize(aws, &id, rules).await?;
            }
            Change::RevokeIngress(rules) => {
                let id = groups_of(&[GroupRef::Owned], &owned)?.remove(0);
                sg::revoke(aws, &id, rules).await?;
            }
            Change::SetSecurityGroups(refs) => {
                let arn = need_lb(&lb_arn)?;
                let groups = groups_of(refs, &owned)?;
                aws.elbv2(Operation::Elbv2SetSecurityGroups, |c| {
                    c.set_security_groups()
                        .load_balancer_arn(&arn)
                        .set_security_groups(Some(groups.clone()))
                        .send()
                })
                .await?;
            }
            Change::DeleteSecurityGroup(id) => {
                crate::aws::elb::io::delete_group_patiently(aws, id).await?;
            }
            Change::DeleteLoadBalancer { arn, .. } => {
                match aws
                    .elbv2(Operation::Elbv2DeleteLoadBalancer, |c| {
                        c.delete_load_balancer().load_balancer_arn(arn).send()
                    })
                    .await
                {
                    Err(e) if !not_found(&e) => return Err(e),
                    _ => {}
                }
                lb_arn = None;
                dns = None;
            }
            Change::CreateLoadBalancer {
                internal,
                ip_address_type,
                subnet_mappings,
                security_groups: desired_groups,
                tags,
            } => {
                let mappings = sdk_mappings(subnet_mappings);
                let tags = sdk_tags(tags);
                let groups = groups_of(desired_groups, &owned)?;
                let groups = (!groups.is_empty()).then_some(groups);
                let out = aws
                    .elbv2(Operation::Elbv2CreateLoadBalancer, |c| {
                        c.create_load_balancer()
                            .name(name)
                            .r#type(t::LoadBalancerTypeEnum::Network)
                            .scheme(if *internal {
                                t::LoadBalancerSchemeEnum::Internal
                            } else {
                                t::LoadBalancerSchemeEnum::InternetFacing
                            })
                            .ip_address_type(t::IpAddressType::from(ip_address_type.as_str()))
                            .set_subnet_mappings(Some(mappings.clone()))
                            .set_security_groups(groups.clone())
                            .set_tags(Some(tags.clone()))
                            .send()
                    })
                    .await?;
                let lb = out.load_balancers().first();
                lb_arn = lb.and_then(|l| l.load_balancer_arn()).map(str::to_string);
                dns = lb.and_then(|l| l.dns_name()).map(str::to_string);
            }
            Change::SetSubnets(m) => {
                let arn = need_lb(&lb_arn)?;
                let mappings = sdk_mappings(m);
                aws.elbv2(Operation::Elbv2SetSubnets, |c| {
                    c.set_subnets()
                        .load_balancer_arn(&arn)
                        .set_subnet_mappings(Some(mappings.clone()))
                        .send()
                })
                .await?;
            }
            Change::SetIpAddressType(kind) => {
                let arn = need_lb(&lb_arn)?;
                aws.elbv2(Operation::Elbv2SetIpAddressType, |c| {
                    c.set_ip_address_type()
                        .load_balancer_arn(&arn)
                        .ip_address_type(t::IpAddressType::from(kind.as_str()))
                        .send()
                })
                .await?;
            }
            Change::AddTags { arn, tags } => {
                let arn = match arn {
                    Some(a) => a.clone(),
                    None => need_lb(&lb_arn)?,
                };
                let tags = sdk_tags(tags);
                aws.elbv2(Operation::Elbv2AddTags, |c| {
                    c.add_tags()
                        .resource_arns(&arn)
                        .set_tags(Some(tags.clone()))
                        .send()
                })
                .await?;
            }
            Change::ModifyAttributes(attrs) => {
                let arn = need_lb(&lb_arn)?;
                let attrs: Vec<t::LoadBalancerAttribute> = attrs
                    .iter()
                    .map(|(k, v)| t::LoadBalancerAttribute::builder().key(k).value(v).build())
                    .collect();
                aws.elbv2(Operation::Elbv2ModifyLoadBalancerAttributes, |c| {
                    c.modify_load_balancer_attributes()
                        .load_balancer_arn(&arn)
                        .set_attributes(Some(attrs.clone()))
                        .send()
                })
                .await?;
            }
            Change::CreateTargetGroup { group, tags } => {
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
                    // Made by an earlier, interrupted sync: use it.
                    Err(e) if e.code() == Some("DuplicateTargetGroupName") => aws
                        .elbv2(Operation::Elbv2DescribeTargetGroups, |c| {
                            c.describe_target_groups().names(&group.name).send()
                        })
                        .await?
                        .target_groups()
                        .first()
                        .and_then(|g| g.target_group_arn())
                        .map(str::to_string),
                    Err(e) => return Err(e),
                };
                if let Some(arn) = arn {
                    tg_arns.insert(group.name.clone(), arn);
                }
            }
            Change::ModifyHealthCheck { arn, health } => {
                aws.elbv2(Operation::Elbv2ModifyTargetGroup, |c| {
                    c.modify_target_group()
                        .target_group_arn(arn)
                        .health_check_port(&health.port)
                        .set_health_check_path(health.path.clone())
                        .healthy_threshold_count(health.healthy)
                        .unhealthy_threshold_count(health.unhealthy)
                        .send()
                })
                .await?;
            }
            Change::ModifyTargetGroupAttributes {
                target_group,
                attributes,
            } => {
                let arn = resolve(target_group, &tg_arns)?;
                let attrs: Vec<t::TargetGroupAttribute> = attributes
                    .iter()
                    .map(|(k, v)| t::TargetGroupAttribute::builder().key(k).value(v).build())
                    .collect();
                aws.elbv2(Operation::Elbv2ModifyTargetGroupAttributes, |c| {
                    c.modify_target_group_attributes()
                        .target_group_arn(&arn)
                        .set_attributes(Some(attrs.clone()))
                        .send()
                })
                .await?;
            }
            Change::RegisterTargets {
                target_group,
                port,
                instances,
            } => {
                let arn = resolve(target_group, &tg_arns)?;
                let ids: Vec<String> = instances.iter().cloned().collect();
                for chunk in ids.chunks(TARGET_CHUNK) {
                    let targets = targets(chunk, *port);
                    aws.elbv2(Operation::Elbv2RegisterTargets, |c| {
                        c.register_targets()
                            .target_group_arn(&arn)
                            .set_targets(Some(targets.clone()))
                            .send()
                    })
                    .await?;
                }
            }
            Change::DeregisterTargets {
                arn,
                port,
                instances,
            } => {
                let ids: Vec<String> = instances.iter().cloned().collect();
                for chunk in ids.chunks(TARGET_CHUNK) {
                    let targets = targets(chunk, *port);
                    match aws
                        .elbv2(Operation::Elbv2DeregisterTargets, |c| {
                            c.deregister_targets()
                                .target_group_arn(arn)
                                .set_targets(Some(targets.clone()))
                                .send()
                        })
                        .await
                    {
                        Err(e) if !(not_found(&e) || e.code() == Some("InvalidTarget")) => {
                            return Err(e);
                        }
                        _ => {}
                    }
                }
            }
            Change::CreateListener { listener, tags } => {
                let arn = need_lb(&lb_arn)?;
                let tg = resolve(&TgRef::Name(listener.target_group.clone()), &tg_arns)?;
                let tags = sdk_tags(tags);
                let (certs, policy) = tls_parts(listener);
                aws.elbv2(Operation::Elbv2CreateListener, |c| {
                    c.create_listener()
                        .load_balancer_arn(&arn)
                        .port(listener.port)
                        .protocol(t::ProtocolEnum::from(listener.protocol.as_str()))
                        .default_actions(forward(&tg))
                        .set_certificates(certs.clone())
                        .set_ssl_policy(policy.clone())
                        .set_tags(Some(tags.clone()))
                        .send()
                })
                .await?;
            }
            Change::ModifyListener { arn, listener } => {
                let tg = resolve(&TgRef::Name(listener.target_group.clone()), &tg_arns)?;
                let (certs, policy) = tls_parts(listener);
                let modified = aws
                    .elbv2(Operation::Elbv2ModifyListener, |c| {
                        c.modify_listener()
                            .listener_arn(arn)
                            .port(listener.port)
                            .protocol(t::ProtocolEnum::from(listener.protocol.as_str()))
                            .default_actions(forward(&tg))
                            .set_certificates(certs.clone())
                            .set_ssl_policy(policy.clone())
                            .send()
                    })
                    .await;
                match modified {
                    Err(e) if iam_refused(&e) => refused_listeners.push((arn.clone(), e)),
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
            Change::DeleteListener { arn } => {
                match aws
                    .elbv2(Operation::Elbv2DeleteListener, |c| {
                        c.delete_listener().listener_arn(arn).send()
                    })
                    .await
                {
                    Err(e) if iam_refused(&e) => refused_listeners.push((arn.clone(), e)),
                    Err(e) if !not_found(&e) => return Err(e),
                    _ => {}
                }
            }
            Change::DeleteTargetGroup { arn, .. } => {
                match aws
                    .elbv2(Operation::Elbv2DeleteTargetGroup, |c| {
                        c.delete_target_group().target_group_arn(arn).send()
                    })
                    .await
                {
                    Err(e) if !not_found(&e) => return Err(e),
                    _ => {}
                }
            }
        }
    }
    Ok(Applied {
        dns_name: dns,
        lb_arn,
        refused_listeners,
    })
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
