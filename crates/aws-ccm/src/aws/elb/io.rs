//! Classic ELB, I/O half: the reads that make an [`Actual`], and the calls
//! that apply a plan, each through the one door.

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_elasticloadbalancing::types as elbt;

use super::{Actual, ActualLb, Attributes, Change, GroupRef, HealthCheck, Listener, OwnedGroup};
use crate::aws::client::SdkCall;
use crate::aws::client::consistency::{AfterCreate, until_visible};
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::client::pages::every_page;
use crate::aws::memory::Journal;
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::tags::{Tags, key_values};
use crate::aws::{Aws, AwsClient};
use aws_sdk_elasticloadbalancing::Client;

fn build_err(what: &str, e: impl std::fmt::Display) -> AwsError {
    AwsError::NotFound {
        operation: Operation::ElbCreateLoadBalancer,
        what: format!("a valid {what} ({e})"),
    }
}

fn to_sdk_listeners(listeners: &[Listener]) -> Result<Vec<elbt::Listener>, AwsError> {
    listeners
        .iter()
        .map(|l| {
            elbt::Listener::builder()
                .protocol(&l.protocol)
                .load_balancer_port(l.lb_port)
                .instance_protocol(&l.instance_protocol)
                .instance_port(l.instance_port)
                .set_ssl_certificate_id(l.ssl_cert.clone())
                .build()
                .map_err(|e| build_err("listener", e))
        })
        .collect()
}

fn to_sdk_tags(tags: &BTreeMap<String, String>) -> Result<Vec<elbt::Tag>, AwsError> {
    tags.iter()
        .map(|(k, v)| {
            elbt::Tag::builder()
                .key(k)
                .value(v)
                .build()
                .map_err(|e| build_err("tag", e))
        })
        .collect()
}

fn instances(ids: &BTreeSet<String>) -> Vec<elbt::Instance> {
    ids.iter()
        .map(|id| elbt::Instance::builder().instance_id(id).build())
        .collect()
}

/// The load balancer with its tags, attributes not read (two reads), or
/// `None` when it does not exist.
pub(crate) async fn describe(aws: &AwsClient, name: &str) -> Result<Option<ActualLb>, AwsError> {
    let out = match aws
        .elb(Operation::ElbDescribeLoadBalancers, |c| {
            c.describe_load_balancers().load_balancer_names(name).send()
        })
        .await
    {
        Ok(out) => out,
        Err(e) if e.is_not_found() => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let Some(lb) = out.load_balancer_descriptions().first() else {
        return Ok(None);
    };
    let mut actual = lb_from_description(lb);
    let mut tags = tags_by_name(aws, &[name.to_string()]).await?;
    actual.tags = Tags::new(tags.remove(name).unwrap_or_default());
    Ok(Some(actual))
}

/// What `DescribeLoadBalancers` tells of one classic ELB: everything but
/// its attributes (left at the API defaults) and tags (left empty).
fn lb_from_description(lb: &elbt::LoadBalancerDescription) -> ActualLb {
    ActualLb {
        name: lb.load_balancer_name().unwrap_or_default().to_string(),
        dns_name: lb.dns_name().unwrap_or_default().to_string(),
        internal: lb.scheme() == Some("internal"),
        listeners: listeners_from_sdk(lb.listener_descriptions()),
        backend_policies: lb
            .backend_server_descriptions()
            .iter()
            .filter_map(|b| Some((b.instance_port()?, b.policy_names().to_vec())))
            .collect(),
        policies: lb
            .policies()
            .map(|p| p.other_policies().iter().cloned().collect())
            .unwrap_or_default(),
        health_check: lb.health_check().map(|h| HealthCheck {
            target: h.target().to_string(),
            healthy_threshold: h.healthy_threshold(),
            unhealthy_threshold: h.unhealthy_threshold(),
            interval: h.interval(),
            timeout: h.timeout(),
        }),
        subnets: lb.subnets().iter().cloned().collect(),
        security_groups: lb.security_groups().to_vec(),
        instances: lb
            .instances()
            .iter()
            .filter_map(|i| i.instance_id().map(str::to_string))
            .collect(),
        ..ActualLb::default()
    }
}

/// The managed attributes of classic ELB `name` (one read; AWS cannot
/// batch it).
pub(crate) async fn read_attributes(aws: &AwsClient, name: &str) -> Result<Attributes, AwsError> {
    let attrs = aws
        .elb(Operation::ElbDescribeLoadBalancerAttributes, |c| {
            c.describe_load_balancer_attributes()
                .load_balancer_name(name)
                .send()
        })
        .await?;
    Ok(attributes_from_sdk(attrs.load_balancer_attributes()))
}

/// Tags of classic ELBs by name, 20 names per call (the API's limit).
pub(crate) async fn tags_by_name(
    aws: &AwsClient,
    names: &[String],
) -> Result<BTreeMap<String, BTreeMap<String, String>>, AwsError> {
    let mut out = BTreeMap::new();
    for chunk in names.chunks(20) {
        let res = aws
            .elb(Operation::ElbDescribeTags, |c| {
                c.describe_tags()
                    .set_load_balancer_names(Some(chunk.to_vec()))
                    .send()
            })
            .await?;
        for d in res.tag_descriptions() {
            if let Some(name) = d.load_balancer_name() {
                let tags = key_values(d.tags().iter().map(|t| (Some(t.key()), t.value())));
                out.insert(name.to_string(), tags);
            }
        }
    }
    Ok(out)
}

/// The managed attributes as AWS reports them (API defaults where missing).
fn attributes_from_sdk(a: Option<&elbt::LoadBalancerAttributes>) -> Attributes {
    let log = a.and_then(|a| a.access_log());
    let draining = a.and_then(|a| a.connection_draining());
    let cross_zone = a.and_then(|a| a.cross_zone_load_balancing());
    Attributes {
        cross_zone: cross_zone.is_some_and(|c| c.enabled()),
        access_log_enabled: log.is_some_and(|l| l.enabled()),
        access_log_interval: log.and_then(|l| l.emit_interval()),
        access_log_bucket: log.and_then(|l| l.s3_bucket_name()).map(str::to_string),
        access_log_prefix: log.and_then(|l| l.s3_bucket_prefix()).map(str::to_string),
        draining_enabled: draining.is_some_and(|d| d.enabled()),
        draining_timeout: draining.and_then(|d| d.timeout()),
        idle_timeout: a
            .and_then(|a| a.connection_settings())
            .map_or(60, |s| s.idle_timeout()),
    }
}

/// Listeners with the policies set on them; protocols upper case.
fn listeners_from_sdk(descriptions: &[elbt::ListenerDescription]) -> Vec<(Listener, Vec<String>)> {
    let upper = |s: &str| s.to_ascii_uppercase();
    descriptions
        .iter()
        .filter_map(|d| {
            let l = d.listener()?;
            Some((
                Listener {
                    lb_port: l.load_balancer_port(),
                    protocol: upper(l.protocol()),
                    instance_port: l.instance_port(),
                    instance_protocol: upper(l.instance_protocol().unwrap_or(l.protocol())),
                    ssl_cert: l.ssl_certificate_id().map(str::to_string),
                },
                d.policy_names().to_vec(),
            ))
        })
        .collect()
}

/// Every classic ELB in the region as `DescribeLoadBalancers` tells it
/// ([`lb_from_description`]): one paginated read, 400 per page (the
/// API's largest page).
pub(crate) async fn list_all(aws: &AwsClient) -> Result<Vec<ActualLb>, AwsError> {
    every_page(|marker| async move {
        let page = aws
            .elb(Operation::ElbDescribeLoadBalancers, |c| {
                c.describe_load_balancers()
                    .set_marker(marker.clone())
                    .page_size(400)
                    .send()
            })
            .await?;
        let lbs: Vec<_> = page
            .load_balancer_descriptions()
            .iter()
            .map(lb_from_description)
            .collect();
        Ok((lbs, page.next_marker().map(str::to_string)))
    })
    .await
}

/// Applies a plan in order. Returns the DNS name of a load balancer it
/// created, if any.
pub(crate) async fn apply(
    aws: &Aws,
    journal: &mut Journal,
    name: &str,
    vpc_id: Option<&str>,
    actual: &Actual,
    changes: &[Change],
) -> Result<Option<String>, AwsError> {
    let mut at = Applying {
        aws,
        journal,
        name,
        vpc_id,
        owned: actual.owned_group.as_ref().map(|g| g.id.clone()),
        dns: None,
    };
    let mut window = AfterCreate::default();
    for change in changes {
        tracing::info!(load_balancer = name, change = %super::plan::describe(change), "applying");
        loop {
            match at.step(change).await {
                Ok(()) => break,
                // A step naming an object this apply created moments ago.
                Err(e) if window.retry(&e).await => {}
                Err(e) => return Err(e),
            }
        }
        let creates = matches!(
            change,
            Change::CreateSecurityGroup(_) | Change::CreateLoadBalancer { .. }
        );
        if creates {
            window.created(aws);
        }
    }
    Ok(at.dns)
}

/// What one plan's steps share: the load balancer, the owned group's ID
/// once known and the DNS name of a load balancer a step created.
struct Applying<'a> {
    aws: &'a Aws,
    journal: &'a mut Journal,
    name: &'a str,
    vpc_id: Option<&'a str>,
    owned: Option<String>,
    dns: Option<String>,
}

impl Applying<'_> {
    /// Each step applies itself.
    async fn step(&mut self, change: &Change) -> Result<(), AwsError> {
        match change {
            Change::CreateSecurityGroup(g) => self.create_group(g).await,
            Change::AuthorizeIngress(rules) => {
                let id = self.group(&GroupRef::Owned)?;
                sg::io::authorize(self.aws, self.journal, &id, rules).await
            }
            Change::RevokeIngress(rules) => {
                let id = self.group(&GroupRef::Owned)?;
                sg::io::revoke(self.aws, self.journal, &id, rules).await
            }
            Change::AuthorizeNodeIngress { node_group, from } => {
                let rule = BTreeSet::from([Rule::all_from_group(&self.group(from)?)]);
                sg::io::authorize(self.aws, self.journal, node_group, &rule).await
            }
            Change::RevokeNodeIngress { node_group, from } => {
                let rule = BTreeSet::from([Rule::all_from_group(&self.group(from)?)]);
                sg::io::revoke(self.aws, self.journal, node_group, &rule).await
            }
            Change::DeleteLoadBalancer { .. } => self.delete_lb().await,
            Change::CreateLoadBalancer {
                listeners,
                subnets,
                groups,
                internal,
                tags,
            } => {
                self.create_lb(listeners, subnets, groups, *internal, tags)
                    .await
            }
            Change::DeleteListeners(ports) => self.delete_listeners(ports).await,
            Change::CreateListeners(listeners) => self.create_listeners(listeners).await,
            Change::AttachSubnets(s) => self.attach_subnets(s).await,
            Change::DetachSubnets(s) => self.detach_subnets(s).await,
            Change::ApplySecurityGroups(groups) => self.apply_groups(groups).await,
            Change::AddTags(tags) => self.add_tags(tags).await,
            Change::RemoveTags(keys) => self.remove_tags(keys).await,
            Change::CreatePolicy {
                name,
                type_name,
                attributes,
            } => self.create_policy(name, type_name, attributes).await,
            Change::SetBackendPolicies {
                instance_port,
                policies,
            } => {
                self.call(Operation::ElbSetLoadBalancerPoliciesForBackendServer, |c| {
                    c.set_load_balancer_policies_for_backend_server()
                        .load_balancer_name(self.name)
                        .instance_port(*instance_port)
                        .set_policy_names(Some(policies.to_vec()))
                        .send()
                })
                .await
            }
            Change::SetListenerPolicies { lb_port, policies } => {
                self.call(Operation::ElbSetLoadBalancerPoliciesOfListener, |c| {
                    c.set_load_balancer_policies_of_listener()
                        .load_balancer_name(self.name)
                        .load_balancer_port(*lb_port)
                        .set_policy_names(Some(policies.to_vec()))
                        .send()
                })
                .await
            }
            Change::ConfigureHealthCheck(h) => self.configure_health_check(h).await,
            Change::ModifyAttributes(a) => self.modify_attributes(a).await,
            Change::RegisterInstances(ids) => self.register(ids).await,
            Change::DeregisterInstances(ids) => self.deregister(ids).await,
            Change::DeleteSecurityGroup(id) => delete_owned_group(self.aws, self.journal, id).await,
        }
    }

    /// One call whose answer the plan does not need.
    async fn call<F: SdkCall<Client>>(&self, op: Operation, f: F) -> Result<(), AwsError> {
        self.aws.elb(op, f).await.map(drop)
    }

    /// The ID a group reference stands for.
    fn group(&self, r: &GroupRef) -> Result<String, AwsError> {
        r.resolve(self.owned.as_ref(), self.name)
    }

    fn groups(&self, refs: &[GroupRef]) -> Result<Vec<String>, AwsError> {
        refs.iter().map(|g| self.group(g)).collect()
    }

    async fn create_group(&mut self, g: &OwnedGroup) -> Result<(), AwsError> {
        let vpc = self.vpc_id.unwrap_or_default();
        let created = sg::io::create(
            self.aws,
            self.journal,
            vpc,
            &g.name,
            &g.description,
            &g.tags,
        );
        self.owned = Some(created.await?);
        Ok(())
    }

    async fn delete_lb(&self) -> Result<(), AwsError> {
        let name = self.name;
        let deleted = self.call(Operation::ElbDeleteLoadBalancer, |c| {
            c.delete_load_balancer().load_balancer_name(name).send()
        });
        match deleted.await {
            // The answer was lost: done if the load balancer is gone.
            Err(e) if e.may_have_been_applied() => match describe(self.aws, name).await? {
                None => Ok(()),
                Some(_) => Err(e),
            },
            other => other,
        }
    }

    async fn create_lb(
        &mut self,
        listeners: &[Listener],
        subnets: &BTreeSet<String>,
        groups: &[GroupRef],
        internal: bool,
        tags: &BTreeMap<String, String>,
    ) -> Result<(), AwsError> {
        let name = self.name;
        let listeners = to_sdk_listeners(listeners)?;
        let groups = self.groups(groups)?;
        let tags = to_sdk_tags(tags)?;
        let created = self
            .aws
            .elb(Operation::ElbCreateLoadBalancer, |c| {
                c.create_load_balancer()
                    .load_balancer_name(name)
                    .set_listeners(Some(listeners.clone()))
                    .set_subnets(Some(subnets.iter().cloned().collect()))
                    .set_security_groups(Some(groups.clone()))
                    .set_scheme(internal.then(|| "internal".to_string()))
                    .set_tags(Some(tags.clone()))
                    .send()
            })
            .await;
        self.dns = match created {
            Ok(out) => out.dns_name().map(str::to_string),
            // It exists: made by an attempt whose answer was lost, or by a
            // sync that read before it was visible. The next sync's plan
            // reconciles any setting that differs.
            Err(e) if e.is_already_exists() => {
                tracing::info!(load_balancer = name, error = %e, "load balancer exists already; reading it");
                Some(existing_dns_name(self.aws, name).await?)
            }
            Err(e) => return Err(e),
        };
        Ok(())
    }

    async fn delete_listeners(&self, ports: &[i32]) -> Result<(), AwsError> {
        self.call(Operation::ElbDeleteLoadBalancerListeners, |c| {
            c.delete_load_balancer_listeners()
                .load_balancer_name(self.name)
                .set_load_balancer_ports(Some(ports.to_vec()))
                .send()
        })
        .await
    }

    async fn create_listeners(&self, listeners: &[Listener]) -> Result<(), AwsError> {
        let listeners = to_sdk_listeners(listeners)?;
        let created = self.call(Operation::ElbCreateLoadBalancerListeners, |c| {
            c.create_load_balancer_listeners()
                .load_balancer_name(self.name)
                .set_listeners(Some(listeners.clone()))
                .send()
        });
        match created.await {
            // The attempt whose answer was lost made these listeners.
            Err(e) if e.applied_before_answer_lost() => Ok(()),
            other => other,
        }
    }

    async fn attach_subnets(&self, s: &BTreeSet<String>) -> Result<(), AwsError> {
        self.call(Operation::ElbAttachLoadBalancerToSubnets, |c| {
            c.attach_load_balancer_to_subnets()
                .load_balancer_name(self.name)
                .set_subnets(Some(s.iter().cloned().collect()))
                .send()
        })
        .await
    }

    async fn detach_subnets(&self, s: &BTreeSet<String>) -> Result<(), AwsError> {
        self.call(Operation::ElbDetachLoadBalancerFromSubnets, |c| {
            c.detach_load_balancer_from_subnets()
                .load_balancer_name(self.name)
                .set_subnets(Some(s.iter().cloned().collect()))
                .send()
        })
        .await
    }

    async fn apply_groups(&self, groups: &[GroupRef]) -> Result<(), AwsError> {
        let groups = self.groups(groups)?;
        self.call(Operation::ElbApplySecurityGroupsToLoadBalancer, |c| {
            c.apply_security_groups_to_load_balancer()
                .load_balancer_name(self.name)
                .set_security_groups(Some(groups.clone()))
                .send()
        })
        .await
    }

    async fn add_tags(&self, tags: &BTreeMap<String, String>) -> Result<(), AwsError> {
        let tags = to_sdk_tags(tags)?;
        self.call(Operation::ElbAddTags, |c| {
            c.add_tags()
                .load_balancer_names(self.name)
                .set_tags(Some(tags.clone()))
                .send()
        })
        .await
    }

    async fn remove_tags(&self, keys: &BTreeSet<String>) -> Result<(), AwsError> {
        let keys: Vec<elbt::TagKeyOnly> = keys
            .iter()
            .map(|k| elbt::TagKeyOnly::builder().key(k).build())
            .collect();
        self.call(Operation::ElbRemoveTags, |c| {
            c.remove_tags()
                .load_balancer_names(self.name)
                .set_tags(Some(keys.clone()))
                .send()
        })
        .await
    }

    /// A policy that already exists (an earlier, interrupted sync) is fine.
    async fn create_policy(
        &self,
        policy: &str,
        type_name: &str,
        attributes: &[(String, String)],
    ) -> Result<(), AwsError> {
        let attrs: Vec<elbt::PolicyAttribute> = attributes
            .iter()
            .map(|(k, v)| {
                elbt::PolicyAttribute::builder()
                    .attribute_name(k)
                    .attribute_value(v)
                    .build()
            })
            .collect();
        let result = self.call(Operation::ElbCreateLoadBalancerPolicy, |c| {
            c.create_load_balancer_policy()
                .load_balancer_name(self.name)
                .policy_name(policy)
                .policy_type_name(type_name)
                .set_policy_attributes(Some(attrs.clone()))
                .send()
        });
        match result.await {
            Err(e) if !e.is_already_exists() => Err(e),
            _ => Ok(()),
        }
    }

    async fn configure_health_check(&self, h: &HealthCheck) -> Result<(), AwsError> {
        let hc = elbt::HealthCheck::builder()
            .target(&h.target)
            .interval(h.interval)
            .timeout(h.timeout)
            .healthy_threshold(h.healthy_threshold)
            .unhealthy_threshold(h.unhealthy_threshold)
            .build()
            .map_err(|e| build_err("health check", e))?;
        self.call(Operation::ElbConfigureHealthCheck, |c| {
            c.configure_health_check()
                .load_balancer_name(self.name)
                .health_check(hc.clone())
                .send()
        })
        .await
    }

    async fn modify_attributes(&self, a: &Attributes) -> Result<(), AwsError> {
        let attrs = to_sdk_attributes(a)?;
        self.call(Operation::ElbModifyLoadBalancerAttributes, |c| {
            c.modify_load_balancer_attributes()
                .load_balancer_name(self.name)
                .load_balancer_attributes(attrs.clone())
                .send()
        })
        .await
    }

    async fn register(&self, ids: &BTreeSet<String>) -> Result<(), AwsError> {
        let list = instances(ids);
        self.call(Operation::ElbRegisterInstancesWithLoadBalancer, |c| {
            c.register_instances_with_load_balancer()
                .load_balancer_name(self.name)
                .set_instances(Some(list.clone()))
                .send()
        })
        .await
    }

    async fn deregister(&self, ids: &BTreeSet<String>) -> Result<(), AwsError> {
        let list = instances(ids);
        self.call(Operation::ElbDeregisterInstancesFromLoadBalancer, |c| {
            c.deregister_instances_from_load_balancer()
                .load_balancer_name(self.name)
                .set_instances(Some(list.clone()))
                .send()
        })
        .await
    }
}

fn to_sdk_attributes(a: &Attributes) -> Result<elbt::LoadBalancerAttributes, AwsError> {
    Ok(elbt::LoadBalancerAttributes::builder()
        .cross_zone_load_balancing(
            elbt::CrossZoneLoadBalancing::builder()
                .enabled(a.cross_zone)
                .build(),
        )
        .access_log(
            elbt::AccessLog::builder()
                .enabled(a.access_log_enabled)
                .set_emit_interval(a.access_log_interval)
                .set_s3_bucket_name(a.access_log_bucket.clone())
                .set_s3_bucket_prefix(a.access_log_prefix.clone())
                .build(),
        )
        .connection_draining(
            elbt::ConnectionDraining::builder()
                .enabled(a.draining_enabled)
                .set_timeout(a.draining_timeout)
                .build(),
        )
        .connection_settings(
            elbt::ConnectionSettings::builder()
                .idle_timeout(a.idle_timeout)
                .build()
                .map_err(|e| build_err("connection settings", e))?,
        )
        .build())
}

/// The DNS name of the classic ELB `name`, waiting for it to become visible.
async fn existing_dns_name(aws: &AwsClient, name: &str) -> Result<String, AwsError> {
    let what = format!("classic load balancer {name}");
    until_visible(aws, Operation::ElbDescribeLoadBalancers, &what, || async {
        match aws
            .elb(Operation::ElbDescribeLoadBalancers, |c| {
                c.describe_load_balancers().load_balancer_names(name).send()
            })
            .await
        {
            Ok(out) => Ok(out
                .load_balancer_descriptions()
                .first()
                .map(|lb| lb.dns_name().unwrap_or_default().to_string())),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    })
    .await
}

/// Deletes an owned group. `DependencyViolation` (the network interfaces
/// of a just-deleted load balancer release it late) is returned as it is:
/// the service controller retries the sync soon, without holding a sync
/// slot while it waits.
pub(crate) async fn delete_owned_group(
    aws: &AwsClient,
    journal: &mut Journal,
    id: &str,
) -> Result<(), AwsError> {
    sg::io::delete(aws, journal, id).await
}
