//! Classic ELB, pure half: the desired state from a Service spec, and the
//! plan that takes what AWS reports to it.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Actual, ActualLb, Attributes, Change, Desired, Environment, GroupRef, HealthCheck, Listener,
    OwnedGroup, PROXY_PROTOCOL_POLICY, load_balancer_name, owned_group_name, ssl_policy_name,
};
use crate::aws::annotations::{BackendProtocol, HealthCheckPort, LoadBalancerSpec};
use crate::aws::applied::Applied;
use crate::aws::load_balancers::delta;
use crate::aws::ownership::{self, Made};
use crate::aws::security_groups::{self as sg, Rule};
use crate::aws::tags;
use crate::cloud_config::{CloudConfig, HealthProbeMode};

/// Listeners for the Service ports, as upstream's `buildListener`.
pub(crate) fn listeners(spec: &LoadBalancerSpec) -> Vec<Listener> {
    spec.ports
        .iter()
        .map(|p| {
            let ssl_port = spec
                .ssl_ports
                .as_ref()
                .is_none_or(|set| set.contains(p.port, &p.name));
            let (protocol, instance_protocol, cert) = match (&spec.ssl_cert, spec.backend_protocol)
            {
                (Some(cert), backend) if ssl_port => match backend {
                    None => ("SSL", "TCP", Some(cert.clone())),
                    Some(BackendProtocol::Http) => ("HTTPS", "HTTP", Some(cert.clone())),
                    Some(BackendProtocol::Https) => ("HTTPS", "HTTPS", Some(cert.clone())),
                    Some(BackendProtocol::Ssl) => ("SSL", "SSL", Some(cert.clone())),
                    Some(BackendProtocol::Tcp) => ("SSL", "TCP", Some(cert.clone())),
                },
                (_, Some(BackendProtocol::Http)) => ("HTTP", "HTTP", None),
                _ => ("TCP", "TCP", None),
            };
            Listener {
                lb_port: p.port,
                protocol: protocol.into(),
                instance_port: p.node_port,
                instance_protocol: instance_protocol.into(),
                ssl_cert: cert,
            }
        })
        .collect()
}

/// The health check, as upstream: Local services probe kube-proxy's
/// `healthCheckNodePort` over HTTP; otherwise TCP (SSL for an SSL/HTTPS
/// backend) on the first node port, or the shared probe from cloud.conf; the
/// healthcheck-* annotations override any part of it.
pub(crate) fn health_check(spec: &LoadBalancerSpec, cloud: &CloudConfig) -> HealthCheck {
    let first_port = spec.ports.first().map(|p| p.node_port).unwrap_or(0);
    let (mut protocol, mut port, mut path) =
        if let Some(hc_port) = spec.local_health_check_node_port {
            ("HTTP".to_string(), hc_port, "/healthz".to_string())
        } else if cloud.health_probe_mode == HealthProbeMode::Shared {
            (
                "HTTP".to_string(),
                i32::from(cloud.shared_health_probe_port),
                cloud.shared_health_probe_path.clone(),
            )
        } else {
            let proto = if spec.backend_health_check_is_ssl() {
                "SSL"
            } else {
                "TCP"
            };
            (proto.to_string(), first_port, String::new())
        };
    let o = &spec.health_check;
    if let Some(p) = &o.protocol {
        protocol = p.clone();
    }
    match o.port {
        Some(HealthCheckPort::Port(p)) => port = p,
        Some(HealthCheckPort::TrafficPort) if spec.local_health_check_node_port.is_some() => {
            port = first_port
        }
        _ => {}
    }
    if protocol == "HTTP" || protocol == "HTTPS" {
        if path.is_empty() {
            path = "/".into();
        }
        if let Some(p) = &o.path {
            path = p.clone();
        }
    } else {
        path.clear();
    }
    HealthCheck {
        target: format!("{protocol}:{port}{path}"),
        healthy_threshold: o.healthy_threshold.unwrap_or(2),
        unhealthy_threshold: o.unhealthy_threshold.unwrap_or(6),
        interval: o.interval.unwrap_or(10),
        timeout: o.timeout.unwrap_or(5),
    }
}

/// Pure: what AWS must look like for this Service.
pub(crate) fn desired(
    spec: &LoadBalancerSpec,
    service_key: &str,
    uid: &str,
    cluster_id: &str,
    cloud: &CloudConfig,
    env: &Environment,
) -> Desired {
    let name = load_balancer_name(uid);
    let tags = tags::owned_tags(
        cluster_id,
        env.legacy_cluster_tag,
        service_key,
        &spec.additional_tags,
    );
    let (mut groups, owned_group) = if !spec.security_groups.is_empty() {
        (GroupRef::ids(&spec.security_groups), None)
    } else if let Some(global) = &cloud.elb_security_group {
        (vec![GroupRef::Id(global.clone())], None)
    } else {
        let ports: Vec<i32> = spec.ports.iter().map(|p| p.port).collect();
        (
            vec![GroupRef::Owned],
            Some(OwnedGroup {
                name: owned_group_name(&name),
                description: format!("Security group for Kubernetes ELB {name} ({service_key})"),
                tags: tags::group_tags(cluster_id, env.legacy_cluster_tag, &spec.additional_tags),
                rules: sg::plan::load_balancer_rules(&ports, &spec.source_ranges),
            }),
        )
    };
    for extra in &spec.extra_security_groups {
        let r = GroupRef::Id(extra.clone());
        if !groups.contains(&r) {
            groups.push(r);
        }
    }
    Desired {
        name,
        cluster_id: cluster_id.to_string(),
        internal: spec.internal,
        listeners: listeners(spec),
        health_check: health_check(spec, cloud),
        attributes: Attributes {
            cross_zone: spec.cross_zone,
            access_log_enabled: spec.access_log_enabled,
            access_log_interval: spec.access_log_emit_interval,
            access_log_bucket: spec.access_log_bucket.clone(),
            access_log_prefix: spec.access_log_prefix.clone(),
            draining_enabled: spec.draining_enabled,
            draining_timeout: spec.draining_timeout,
            idle_timeout: spec.idle_timeout.unwrap_or(60),
        },
        subnets: env.subnets.iter().cloned().collect(),
        groups,
        owned_group,
        tags,
        proxy_protocol: spec.proxy_protocol,
        ssl_negotiation_policy: spec.ssl_negotiation_policy.clone(),
        instances: env.instances.clone(),
        node_groups: (!cloud.disable_security_group_ingress).then(|| env.node_groups.clone()),
        applied: Applied::classic(spec.internal),
    }
}

/// Pure: the changes that take `actual` to `desired`, in the order to apply
/// them. Empty when nothing differs.
pub fn plan(desired: &Desired, actual: &Actual) -> Vec<Change> {
    let mut changes = Vec::new();
    let owned_id = actual.owned_group.as_ref().map(|g| g.id.as_str());
    // The owned group and its rules come first: the LB is created with it.
    let (want, have) = (desired.owned_group.as_ref(), actual.owned_group.as_ref());
    let steps = (
        Change::CreateSecurityGroup,
        Change::AuthorizeIngress,
        Change::RevokeIngress,
    );
    owned_group_changes(want, have, steps, &mut changes);
    let lb = current_or_created(desired, actual, owned_id, &mut changes);
    let recreated = listener_changes(desired, &lb, &mut changes);
    subnet_changes(desired, &lb, &mut changes);
    security_group_changes(desired, &lb, owned_id, &mut changes);
    tag_changes(desired, &lb, &mut changes);
    proxy_protocol_changes(desired, &lb, &mut changes);
    ssl_policy_changes(desired, &lb, &recreated, &mut changes);
    if lb.health_check.as_ref() != Some(&desired.health_check) {
        changes.push(Change::ConfigureHealthCheck(desired.health_check.clone()));
    }
    if !desired.attributes.satisfied_by(&lb.attributes) {
        changes.push(Change::ModifyAttributes(desired.attributes.clone()));
    }
    node_ingress_changes(desired, actual, &mut changes);
    instance_changes(&lb.instances, &desired.instances, &mut changes);
    retired_owned_group_changes(desired, actual, &mut changes);
    changes
}

/// The owned group `want`, when one is wanted: created when `have` is
/// missing, its rules brought to the wanted set; `steps` makes the kind's
/// create, authorize and revoke steps.
pub(crate) fn owned_group_changes<C>(
    want: Option<&OwnedGroup>,
    have: Option<&sg::SecurityGroup>,
    steps: (
        impl Fn(OwnedGroup) -> C,
        impl Fn(BTreeSet<Rule>) -> C,
        impl Fn(BTreeSet<Rule>) -> C,
    ),
    changes: &mut Vec<C>,
) {
    let (create, authorize, revoke) = steps;
    let Some(want) = want else {
        return;
    };
    if have.is_none() {
        changes.push(create(want.clone()));
    }
    let have = have.map(|g| g.ingress.clone()).unwrap_or_default();
    let (add, remove) = delta(&have, &want.rules);
    if !add.is_empty() {
        changes.push(authorize(add));
    }
    if !remove.is_empty() {
        changes.push(revoke(remove));
    }
}

/// The load balancer the later steps compare against: the existing one, or
/// (after a create step, and a delete step when the scheme changes: a classic
/// ELB cannot change it) the one the create step makes.
fn current_or_created(
    desired: &Desired,
    actual: &Actual,
    owned_id: Option<&str>,
    changes: &mut Vec<Change>,
) -> ActualLb {
    let mut lb = actual.lb.clone();
    if let Some(current) = &lb
        && current.internal != desired.internal
        && scheme_asked(desired, current)
        && ours(desired, current)
    {
        changes.push(Change::DeleteLoadBalancer {
            reason: format!(
                "scheme changes from {} to {}",
                scheme(current.internal),
                scheme(desired.internal)
            ),
        });
        lb = None;
    }
    if let Some(lb) = lb {
        return lb;
    }
    let tags = desired.applied.tagged(&desired.tags);
    changes.push(Change::CreateLoadBalancer {
        listeners: desired.listeners.clone(),
        subnets: desired.subnets.clone(),
        groups: desired.groups.clone(),
        internal: desired.internal,
        tags: tags.clone(),
    });
    ActualLb {
        name: desired.name.clone(),
        internal: desired.internal,
        listeners: desired
            .listeners
            .iter()
            .map(|l| (l.clone(), vec![]))
            .collect(),
        subnets: desired.subnets.clone(),
        // Created with the owned group's real ID when it exists (a
        // recreate), so no ApplySecurityGroups follows.
        security_groups: desired
            .groups
            .iter()
            .map(|g| g.planned_id(owned_id))
            .collect(),
        tags: tags::Tags::new(tags),
        ..ActualLb::default()
    }
}

/// Whether `lb` is proven a load balancer this CCM makes for the Service
/// `desired` is for ([`ownership`]): only then is it ever deleted.
fn ours(desired: &Desired, lb: &ActualLb) -> bool {
    let service = desired.tags.get(tags::SERVICE_NAME_TAG).map(String::as_str);
    ownership::prove(
        Made::LoadBalancer,
        &lb.name,
        &lb.tags,
        &desired.cluster_id,
        service,
    )
    .is_ok()
}

/// Whether the Service asks for another scheme than this CCM applied (the
/// record on the load balancer, see `crate::aws::applied`); never without
/// a record.
fn scheme_asked(desired: &Desired, current: &ActualLb) -> bool {
    Applied::from_tags(&current.tags).is_some_and(|r| r.internal != desired.internal)
}

/// Pure: the create-time differences a sync leaves as they are (the Service
/// did not ask for them, or the load balancer lacks this cluster's
/// ownership tag), for the Warning event. Empty when none.
pub(crate) fn left_alone(desired: &Desired, actual: &Actual) -> Vec<String> {
    match &actual.lb {
        Some(current)
            if current.internal != desired.internal
                && !(scheme_asked(desired, current) && ours(desired, current)) =>
        {
            vec![format!(
                "its scheme is {} and the Service asks for {}",
                scheme(current.internal),
                scheme(desired.internal)
            )]
        }
        _ => Vec::new(),
    }
}

/// Listeners: replace any that differ, by load balancer port. Returns the
/// listeners (re)created.
fn listener_changes(desired: &Desired, lb: &ActualLb, changes: &mut Vec<Change>) -> Vec<Listener> {
    let have: BTreeMap<i32, &Listener> = lb.listeners.iter().map(|(l, _)| (l.lb_port, l)).collect();
    let want: BTreeMap<i32, &Listener> = desired.listeners.iter().map(|l| (l.lb_port, l)).collect();
    let delete: Vec<i32> = have
        .iter()
        .filter(|(port, l)| want.get(port) != Some(l))
        .map(|(p, _)| *p)
        .collect();
    let create: Vec<Listener> = want
        .iter()
        .filter(|(port, l)| have.get(port) != Some(l))
        .map(|(_, l)| (*l).clone())
        .collect();
    if !delete.is_empty() {
        changes.push(Change::DeleteListeners(delete));
    }
    if !create.is_empty() {
        changes.push(Change::CreateListeners(create.clone()));
    }
    create
}

fn subnet_changes(desired: &Desired, lb: &ActualLb, changes: &mut Vec<Change>) {
    let (attach, detach) = delta(&lb.subnets, &desired.subnets);
    // Detach first, as upstream: a CLB takes one subnet per zone, so moving
    // to another subnet in the same zone fails while the old one is attached.
    if !detach.is_empty() {
        changes.push(Change::DetachSubnets(detach));
    }
    if !attach.is_empty() {
        changes.push(Change::AttachSubnets(attach));
    }
}

fn security_group_changes(
    desired: &Desired,
    lb: &ActualLb,
    owned_id: Option<&str>,
    changes: &mut Vec<Change>,
) {
    let want_groups: BTreeSet<String> = desired
        .groups
        .iter()
        .map(|g| g.planned_id(owned_id))
        .collect();
    let have_groups: BTreeSet<String> = lb.security_groups.iter().cloned().collect();
    if want_groups != have_groups {
        changes.push(Change::ApplySecurityGroups(desired.groups.clone()));
    }
}

fn tag_changes(desired: &Desired, lb: &ActualLb, changes: &mut Vec<Change>) {
    let mut want = desired.tags.clone();
    // A record (only on a load balancer this CCM made) follows the Service
    // once the load balancer has what it asks for.
    let record = Applied::from_tags(&lb.tags);
    if record.is_some()
        && record != Some(desired.applied.clone())
        && lb.internal == desired.internal
    {
        want.insert(tags::APPLIED_TAG.to_string(), desired.applied.to_value());
    }
    let missing = missing_tags(&want, &lb.tags);
    if !missing.is_empty() {
        changes.push(Change::AddTags(missing));
    }
}

/// Tags of `want` that `have` lacks or holds with another value, those a
/// sync adds to an existing load balancer.
fn missing_tags(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| have.get(*k) != Some(v) && tags::added_to_existing(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Proxy protocol on every backend port, or on none.
fn proxy_protocol_changes(desired: &Desired, lb: &ActualLb, changes: &mut Vec<Change>) {
    if desired.proxy_protocol && !lb.policies.contains(PROXY_PROTOCOL_POLICY) {
        changes.push(Change::CreatePolicy {
            name: PROXY_PROTOCOL_POLICY.into(),
            type_name: "ProxyProtocolPolicyType".into(),
            attributes: vec![("ProxyProtocol".into(), "true".into())],
        });
    }
    let instance_ports: BTreeSet<i32> = desired.listeners.iter().map(|l| l.instance_port).collect();
    for port in &instance_ports {
        let current = lb.backend_policies.get(port).cloned().unwrap_or_default();
        let has = current.iter().any(|p| p == PROXY_PROTOCOL_POLICY);
        if has != desired.proxy_protocol {
            changes.push(Change::SetBackendPolicies {
                instance_port: *port,
                policies: desired
                    .proxy_protocol
                    .then(|| PROXY_PROTOCOL_POLICY.into())
                    .into_iter()
                    .collect(),
            });
        }
    }
    for (port, policies) in &lb.backend_policies {
        if !instance_ports.contains(port) && policies.iter().any(|p| p == PROXY_PROTOCOL_POLICY) {
            changes.push(Change::SetBackendPolicies {
                instance_port: *port,
                policies: vec![],
            });
        }
    }
}

/// The SSL negotiation policy, and on every TLS listener (`recreated` ones
/// lost theirs).
fn ssl_policy_changes(
    desired: &Desired,
    lb: &ActualLb,
    recreated: &[Listener],
    changes: &mut Vec<Change>,
) {
    let Some(policy) = &desired.ssl_negotiation_policy else {
        return;
    };
    let name = ssl_policy_name(policy);
    if !lb.policies.contains(&name) {
        changes.push(Change::CreatePolicy {
            name: name.clone(),
            type_name: "SSLNegotiationPolicyType".into(),
            attributes: vec![("Reference-Security-Policy".into(), policy.clone())],
        });
    }
    let current: BTreeMap<i32, &Vec<String>> =
        lb.listeners.iter().map(|(l, p)| (l.lb_port, p)).collect();
    for l in desired.listeners.iter().filter(|l| l.is_tls()) {
        let again = recreated.iter().any(|c| c.lb_port == l.lb_port);
        let has = !again && current.get(&l.lb_port).is_some_and(|p| p.contains(&name));
        if !has {
            changes.push(Change::SetListenerPolicies {
                lb_port: l.lb_port,
                policies: vec![name.clone()],
            });
        }
    }
}

/// Backend nodes' groups admit the LB's own group.
fn node_ingress_changes(desired: &Desired, actual: &Actual, changes: &mut Vec<Change>) {
    let Some(want_nodes) = &desired.node_groups else {
        return;
    };
    let Some(lb_group) = desired.groups.first() else {
        return;
    };
    for g in want_nodes.difference(&actual.node_groups_with_rule) {
        changes.push(Change::AuthorizeNodeIngress {
            node_group: g.clone(),
            from: lb_group.clone(),
        });
    }
    // A rule from the owned group serves only this load balancer; one
    // from a shared group is revoked only when no other load balancer
    // using that group still reaches the node group.
    let unneeded = actual.node_groups_with_rule.difference(want_nodes);
    let revoke: Vec<&String> = match (lb_group, &actual.shared_group_needed) {
        (GroupRef::Owned, _) => unneeded.collect(),
        (GroupRef::Id(_), Some(needed)) => unneeded.filter(|g| !needed.contains(*g)).collect(),
        (GroupRef::Id(_), None) => Vec::new(),
    };
    revoke_node_ingress(revoke, lb_group, changes);
}

/// Revokes the rule admitting `from` in each of `node_groups`.
fn revoke_node_ingress<'a>(
    node_groups: impl IntoIterator<Item = &'a String>,
    from: &GroupRef,
    changes: &mut Vec<Change>,
) {
    for g in node_groups {
        changes.push(Change::RevokeNodeIngress {
            node_group: g.clone(),
            from: from.clone(),
        });
    }
}

/// Registers the instances `want` adds to `have`, then deregisters those
/// it drops: at most one step each.
pub(crate) fn instance_changes(
    have: &BTreeSet<String>,
    want: &BTreeSet<String>,
    changes: &mut Vec<Change>,
) {
    let (register, deregister) = delta(have, want);
    if !register.is_empty() {
        changes.push(Change::RegisterInstances(register));
    }
    if !deregister.is_empty() {
        changes.push(Change::DeregisterInstances(deregister));
    }
}

/// An owned group replaced by configured groups: once the load balancer
/// no longer uses it (ApplySecurityGroups before), its node rules and the
/// group itself go.
fn retired_owned_group_changes(desired: &Desired, actual: &Actual, changes: &mut Vec<Change>) {
    if desired.owned_group.is_none()
        && let Some(g) = &actual.owned_group
        && ownership::prove(
            Made::LoadBalancerGroup,
            &g.name,
            &g.tags,
            &desired.cluster_id,
            None,
        )
        .is_ok()
    {
        revoke_node_ingress(&actual.owned_group_node_rules, &GroupRef::Owned, changes);
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
}

/// Pure: what deleting Service `service_key`'s load balancer takes: only
/// what [`ownership`] proves this CCM made for it is deleted, and node
/// rules only from a group so proven, or from the shared group of a load
/// balancer so proven.
pub(crate) fn plan_delete(actual: &Actual, cluster_id: &str, service_key: &str) -> Vec<Change> {
    let mut changes = Vec::new();
    let owned_group = actual.owned_group.as_ref().filter(|g| {
        ownership::prove(Made::LoadBalancerGroup, &g.name, &g.tags, cluster_id, None).is_ok()
    });
    let lb = actual.lb.as_ref().filter(|lb| {
        ownership::prove(
            Made::LoadBalancer,
            &lb.name,
            &lb.tags,
            cluster_id,
            Some(service_key),
        )
        .is_ok()
    });
    if owned_group.is_some() {
        revoke_node_ingress(
            &actual.node_groups_with_rule,
            &GroupRef::Owned,
            &mut changes,
        );
    } else if let (Some(shared), Some(needed), Some(_)) =
        (&actual.shared_lb_group, &actual.shared_group_needed, lb)
    {
        let unneeded = actual.node_groups_with_rule.difference(needed);
        revoke_node_ingress(unneeded, &GroupRef::Id(shared.clone()), &mut changes);
    }
    if lb.is_some() {
        changes.push(Change::DeleteLoadBalancer {
            reason: "the Service no longer asks for it".into(),
        });
    }
    if let Some(g) = owned_group {
        changes.push(Change::DeleteSecurityGroup(g.id.clone()));
    }
    changes
}

/// Pure: what the deletion of a protected Service does to its classic
/// ELB, when [`ownership`] proves it this CCM's for `service_key` (`None`
/// when not: the deletion leaves it anyway). What [`plan_delete`] would do
/// to the node groups' rules it does (the Service's node ports are released
/// with it and may go to another Service), and the instances are
/// deregistered for the same reason; the load balancer, its listeners and
/// its own group stay, and it is tagged [`tags::KEPT_TAG`] with the Service
/// it was kept from.
pub(crate) fn plan_keep(
    actual: &Actual,
    cluster_id: &str,
    service_key: &str,
) -> Option<Vec<Change>> {
    let lb = actual.lb.as_ref()?;
    ownership::prove(
        Made::LoadBalancer,
        &lb.name,
        &lb.tags,
        cluster_id,
        Some(service_key),
    )
    .ok()?;
    let mut changes: Vec<Change> = plan_delete(actual, cluster_id, service_key)
        .into_iter()
        .filter(|c| matches!(c, Change::RevokeNodeIngress { .. }))
        .collect();
    if !lb.instances.is_empty() {
        changes.push(Change::DeregisterInstances(lb.instances.clone()));
    }
    if lb.tags.get(tags::KEPT_TAG).map(String::as_str) != Some(service_key) {
        let kept = BTreeMap::from([(tags::KEPT_TAG.to_string(), service_key.to_string())]);
        changes.push(Change::AddTags(kept));
    }
    Some(changes)
}

/// A load balancer's scheme as AWS names it.
pub(crate) fn scheme(internal: bool) -> &'static str {
    if internal {
        "internal"
    } else {
        "internet-facing"
    }
}

/// A short, stable description of a change for logs and dry runs.
pub(crate) fn describe(change: &Change) -> String {
    match change {
        Change::CreateSecurityGroup(g) => format!("create security group {}", g.name),
        Change::AuthorizeIngress(r) => format!("authorize {} rule(s) on the LB group", r.len()),
        Change::RevokeIngress(r) => format!("revoke {} rule(s) on the LB group", r.len()),
        Change::DeleteLoadBalancer { reason } => format!("delete load balancer ({reason})"),
        Change::CreateLoadBalancer { .. } => "create load balancer".into(),
        Change::DeleteListeners(p) => format!("delete listeners {p:?}"),
        Change::CreateListeners(l) => format!(
            "create listeners {:?}",
            l.iter().map(|l| l.lb_port).collect::<Vec<_>>()
        ),
        Change::AttachSubnets(s) => format!("attach subnets {s:?}"),
        Change::DetachSubnets(s) => format!("detach subnets {s:?}"),
        Change::ApplySecurityGroups(_) => "apply security groups".into(),
        Change::AddTags(t) => format!("add tags {:?}", t.keys().collect::<Vec<_>>()),
        Change::RemoveTags(keys) => format!("remove tags {keys:?}"),
        Change::CreatePolicy { name, .. } => format!("create policy {name}"),
        Change::SetBackendPolicies { instance_port, .. } => {
            format!("set backend policies on {instance_port}")
        }
        Change::SetListenerPolicies { lb_port, .. } => {
            format!("set listener policies on {lb_port}")
        }
        Change::ConfigureHealthCheck(h) => format!("configure health check {}", h.target),
        Change::ModifyAttributes(_) => "modify attributes".into(),
        Change::RegisterInstances(i) => format!("register {} instance(s)", i.len()),
        Change::DeregisterInstances(i) => format!("deregister {} instance(s)", i.len()),
        Change::AuthorizeNodeIngress { node_group, .. } => {
            format!("allow the LB group into {node_group}")
        }
        Change::RevokeNodeIngress { node_group, .. } => {
            format!("revoke the LB group from {node_group}")
        }
        Change::DeleteSecurityGroup(id) => format!("delete security group {id}"),
    }
}
