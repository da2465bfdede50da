//! NLB, I/O half: the elbv2 reads that make an [`super::Actual`].

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancingv2::types as t;

use super::{ActualLb, ActualListener, ActualTargetGroup, HealthCheck, SubnetMapping};
use crate::aws::client::AwsClient;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::client::pages::every_page;
use crate::aws::load_balancers::sweep::SweptGroup;
use crate::aws::tags::{SERVICE_NAME_TAG, Tags, key_values};

/// Tags of elbv2 resources by ARN (20 per call, the API's limit).
pub(crate) async fn tags_of(
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

/// The NLB named `name` with its tags (attributes and listeners not
/// read), or `None`.
pub(crate) async fn describe(aws: &AwsClient, name: &str) -> Result<Option<ActualLb>, AwsError> {
    let out = match aws
        .elbv2(Operation::Elbv2DescribeLoadBalancers, |c| {
            c.describe_load_balancers().names(name).send()
        })
        .await
    {
        Ok(out) => out,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    let Some(lb) = out
        .load_balancers()
        .iter()
        .find(|l| l.r#type() == Some(&t::LoadBalancerTypeEnum::Network))
    else {
        return Ok(None);
    };
    let mut actual = lb_from_sdk(lb);
    let mut tags = tags_of(aws, std::slice::from_ref(&actual.arn)).await?;
    actual.tags = Tags::new(tags.remove(&actual.arn).unwrap_or_default());
    Ok(Some(actual))
}

/// What `DescribeLoadBalancers` tells of one NLB: everything but its
/// tags, attributes and listeners (left empty).
fn lb_from_sdk(lb: &t::LoadBalancer) -> ActualLb {
    ActualLb {
        dns_name: lb.dns_name().unwrap_or_default().to_string(),
        internal: lb.scheme() == Some(&t::LoadBalancerSchemeEnum::Internal),
        ip_address_type: lb
            .ip_address_type()
            .map(|t| t.as_str().to_string())
            .unwrap_or_else(|| "ipv4".into()),
        subnet_mappings: mappings_from_sdk(lb.availability_zones()),
        security_groups: lb.security_groups().to_vec(),
        addresses_reported: lb
            .availability_zones()
            .iter()
            .any(|z| !z.load_balancer_addresses().is_empty()),
        arn: lb.load_balancer_arn().unwrap_or_default().to_string(),
        ..ActualLb::default()
    }
}

/// Every NLB in the region ([`lb_from_sdk`]), by name: one paginated read,
/// 400 per page (the API's largest page).
pub(crate) async fn list_all(aws: &AwsClient) -> Result<BTreeMap<String, ActualLb>, AwsError> {
    every_page(|marker| async move {
        let page = aws
            .elbv2(Operation::Elbv2DescribeLoadBalancers, |c| {
                c.describe_load_balancers()
                    .set_marker(marker.clone())
                    .page_size(400)
                    .send()
            })
            .await?;
        let nlbs: Vec<_> = page
            .load_balancers()
            .iter()
            .filter(|lb| lb.r#type() == Some(&t::LoadBalancerTypeEnum::Network))
            .filter_map(|lb| Some((lb.load_balancer_name()?.to_string(), lb_from_sdk(lb))))
            .collect();
        Ok((nlbs, page.next_marker().map(str::to_string)))
    })
    .await
}

/// The NLB's attributes (one read; AWS cannot batch it).
pub(crate) async fn read_attributes(
    aws: &AwsClient,
    arn: &str,
) -> Result<BTreeMap<String, String>, AwsError> {
    let attrs = aws
        .elbv2(Operation::Elbv2DescribeLoadBalancerAttributes, |c| {
            c.describe_load_balancer_attributes()
                .load_balancer_arn(arn)
                .send()
        })
        .await?;
    Ok(key_values(
        attrs.attributes().iter().map(|a| (a.key(), a.value())),
    ))
}

/// The NLB's listeners (one read; AWS cannot batch it).
pub(crate) async fn read_listeners(
    aws: &AwsClient,
    arn: &str,
) -> Result<Vec<ActualListener>, AwsError> {
    let listeners = aws
        .elbv2(Operation::Elbv2DescribeListeners, |c| {
            c.describe_listeners().load_balancer_arn(arn).send()
        })
        .await?;
    Ok(listeners_from_sdk(listeners.listeners()))
}

/// The listeners' tags (one read per 20 listeners).
pub(crate) async fn read_listener_tags(
    aws: &AwsClient,
    listeners: &mut [ActualListener],
) -> Result<(), AwsError> {
    let arns: Vec<String> = listeners.iter().map(|l| l.arn.clone()).collect();
    let mut by_arn = tags_of(aws, &arns).await?;
    for l in listeners {
        l.tags = Some(std::sync::Arc::new(
            by_arn.remove(&l.arn).unwrap_or_default(),
        ));
    }
    Ok(())
}

/// The subnets with the EIP or private address pinned in each.
fn mappings_from_sdk(zones: &[t::AvailabilityZone]) -> BTreeSet<SubnetMapping> {
    zones
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
        .collect()
}

fn listeners_from_sdk(listeners: &[t::Listener]) -> Vec<ActualListener> {
    listeners
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
                alpn: l.alpn_policy().first().cloned(),
                tags: None,
            })
        })
        .collect()
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
        timeout: g.health_check_timeout_seconds(),
    }
}

/// One group's state from its listing entry and `tags`: its attributes,
/// read unless `known_attributes` gives them, and its registered targets,
/// read unless `known_targets` (the target record) gives them.
pub(crate) async fn complete_one(
    aws: &AwsClient,
    g: &t::TargetGroup,
    tags: Tags,
    known_attributes: Option<&BTreeMap<String, String>>,
    known_targets: Option<&BTreeSet<String>>,
) -> Result<ActualTargetGroup, AwsError> {
    let arn = g.target_group_arn().unwrap_or_default();
    let attributes = match known_attributes {
        Some(a) => a.clone(),
        None => {
            let attrs = aws
                .elbv2(Operation::Elbv2DescribeTargetGroupAttributes, |c| {
                    c.describe_target_group_attributes()
                        .target_group_arn(arn)
                        .send()
                })
                .await?;
            key_values(attrs.attributes().iter().map(|a| (a.key(), a.value())))
        }
    };
    let targets = match known_targets {
        Some(t) => t.clone(),
        None => {
            let health = aws
                .elbv2(Operation::Elbv2DescribeTargetHealth, |c| {
                    c.describe_target_health().target_group_arn(arn).send()
                })
                .await?;
            registered(
                health.target_health_descriptions(),
                g.port().unwrap_or_default(),
            )
        }
    };
    Ok(ActualTargetGroup {
        attributes,
        targets,
        ..listed(g, tags)
    })
}

/// The instances `health` lists on `port`, leaving out those already
/// draining (a deregistration in progress).
pub fn registered(health: &[t::TargetHealthDescription], port: i32) -> BTreeSet<String> {
    health
        .iter()
        .filter(|d| {
            d.target_health().and_then(|h| h.reason())
                != Some(&t::TargetHealthReasonEnum::DeregistrationInProgress)
        })
        .filter_map(|d| d.target())
        .filter(|t| t.port().is_none_or(|p| p == port))
        .filter_map(|t| t.id().map(str::to_string))
        .collect()
}

/// What the listing and `tags` tell of a group; its attributes and targets
/// are not read (left empty). Enough to delete it.
fn listed(g: &t::TargetGroup, tags: Tags) -> ActualTargetGroup {
    ActualTargetGroup {
        arn: g.target_group_arn().unwrap_or_default().to_string(),
        name: g.target_group_name().unwrap_or_default().to_string(),
        protocol: g
            .protocol()
            .map(|p| p.as_str().to_string())
            .unwrap_or_default(),
        port: g.port().unwrap_or_default(),
        health: health_of(g),
        tags,
        ..ActualTargetGroup::default()
    }
}

/// The target groups a delete removes, with their tags (attributes and
/// targets are not read): those behind the NLB `lb_arn`, and with
/// `orphans_of` (a Service key) also every group named and tagged for that
/// Service that no listener points at any more, each once.
pub(crate) async fn groups_to_delete(
    aws: &AwsClient,
    lb_arn: Option<&str>,
    orphans_of: Option<&str>,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    let mut groups: Vec<ActualTargetGroup> = match lb_arn {
        Some(arn) => listed_target_groups(aws, arn)
            .await?
            .into_iter()
            .map(|(g, tags)| listed(&g, tags))
            .collect(),
        None => Vec::new(),
    };
    if let Some(key) = orphans_of {
        for g in find_service_target_groups(aws, key, false).await? {
            if !groups.iter().any(|t| t.arn == g.arn) {
                groups.push(g);
            }
        }
    }
    Ok(groups)
}

/// Whether NLB `lb` is protected at AWS: this CCM's tag
/// [`crate::aws::tags::DELETION_PROTECTION_TAG`] says it turned the
/// attribute on (no read), or the attribute, read, is on. What a deletion
/// and `aws-ccm plan` both ask.
pub(crate) async fn protected(aws: &AwsClient, lb: &ActualLb) -> Result<bool, AwsError> {
    let tag = lb.tags.get(crate::aws::tags::DELETION_PROTECTION_TAG);
    if tag.map(String::as_str) == Some("on") {
        return Ok(true);
    }
    let attributes = read_attributes(aws, &lb.arn).await?;
    Ok(attributes
        .get(super::ATTR_DELETION_PROTECTION)
        .map(String::as_str)
        == Some("true"))
}

/// What the keep of NLB `lb` compares against ([`super::plan::plan_keep`]):
/// it, and its target groups with their registered targets (no attributes
/// read).
pub(crate) async fn for_keep(aws: &AwsClient, lb: ActualLb) -> Result<super::Actual, AwsError> {
    let no_attributes = BTreeMap::new();
    let mut target_groups = Vec::new();
    for (g, tags) in listed_target_groups(aws, &lb.arn).await? {
        target_groups.push(complete_one(aws, &g, tags, Some(&no_attributes), None).await?);
    }
    Ok(super::Actual {
        lb: Some(lb),
        target_groups,
        owned_group: None,
    })
}

/// The target groups behind the NLB as the listing shows them, with their
/// tags (attributes and targets not read).
pub(crate) async fn listed_target_groups(
    aws: &AwsClient,
    lb_arn: &str,
) -> Result<Vec<SweptGroup>, AwsError> {
    let res = match aws
        .elbv2(Operation::Elbv2DescribeTargetGroups, |c| {
            c.describe_target_groups().load_balancer_arn(lb_arn).send()
        })
        .await
    {
        Ok(res) => res,
        Err(e) if e.is_not_found() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    with_tags(aws, res.target_groups().to_vec()).await
}

/// `groups` with their tags.
async fn with_tags(
    aws: &AwsClient,
    groups: Vec<t::TargetGroup>,
) -> Result<Vec<SweptGroup>, AwsError> {
    let arns: Vec<String> = groups
        .iter()
        .filter_map(|g| g.target_group_arn().map(str::to_string))
        .collect();
    let mut tags = tags_of(aws, &arns).await?;
    Ok(groups
        .into_iter()
        .map(|g| {
            let t = g.target_group_arn().and_then(|a| tags.remove(a));
            (g, Tags::new(t.unwrap_or_default()))
        })
        .collect())
}

/// Every target group of the account in the region: one paginated listing
/// (400 per page).
pub(crate) async fn all_target_groups(aws: &AwsClient) -> Result<Vec<t::TargetGroup>, AwsError> {
    every_page(|marker| async move {
        let page = aws
            .elbv2(Operation::Elbv2DescribeTargetGroups, |c| {
                c.describe_target_groups()
                    .set_marker(marker.clone())
                    .page_size(400)
                    .send()
            })
            .await?;
        let next = page.next_marker().map(str::to_string);
        Ok((page.target_groups.unwrap_or_default(), next))
    })
    .await
}

/// The target groups named and tagged for Service `service_key` that no
/// listener forwards to: AWS links a group only to the load balancers whose
/// listeners forward to it now, so a group a listener moved off is behind
/// no load balancer and found only by its name and tags. For deletes.
pub(crate) async fn unused_service_target_groups(
    aws: &AwsClient,
    service_key: &str,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    find_service_target_groups(aws, service_key, true).await
}

/// Every target group whose name has the Service's prefix and whose tags
/// name the Service (`unused_only`: and behind no load balancer): finds
/// groups no listener points at any more (after an interrupted sync or a
/// deleted NLB). One paginated listing and their tags; attributes and
/// targets are not read. For deletes.
async fn find_service_target_groups(
    aws: &AwsClient,
    service_key: &str,
    unused_only: bool,
) -> Result<Vec<ActualTargetGroup>, AwsError> {
    let name_prefix = super::target_group_prefix(service_key);
    let candidates: Vec<t::TargetGroup> = all_target_groups(aws)
        .await?
        .into_iter()
        .filter(|g| {
            g.target_group_name()
                .is_some_and(|n| n.starts_with(&name_prefix))
                && (!unused_only || g.load_balancer_arns().is_empty())
        })
        .collect();
    Ok(with_tags(aws, candidates)
        .await?
        .into_iter()
        .filter(|(_, t)| t.get(SERVICE_NAME_TAG).is_some_and(|s| s == service_key))
        .map(|(g, t)| listed(&g, t))
        .collect())
}
