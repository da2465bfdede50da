//! NLB, pure half: the plan that takes what AWS reports to the desired
//! state ([`super::desired`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ATTR_ACCESS_LOGS, ATTR_CROSS_ZONE, ATTR_DELETION_PROTECTION, Actual, ActualLb, ActualListener,
    ActualTargetGroup, Change, Desired, SubnetMapping, TargetGroup, TgRef, attributes,
};
use crate::aws::applied::Applied;
use crate::aws::elb::plan::{owned_group_changes, scheme};
use crate::aws::load_balancers::delta;
use crate::aws::ownership::{self, Made};
use crate::aws::tags;

mod retired;
mod settings;
#[cfg(test)]
pub(crate) use settings::listener_attributes_recorded;
use settings::{
    alpn_record, alpn_target, health_timeout_record, health_timeout_target,
    listener_attributes_changes,
};
pub(crate) use settings::{
    alpn_record_stale, listener_attributes_record, listener_attributes_stale,
};

pub(crate) use super::desired::desired;
#[cfg(test)]
pub(crate) use super::desired::health_check;
use retired::retired_changes;
pub(crate) use retired::{left_behind, plan_delete};

/// Attributes `want` asks for that `have` lacks; an attribute AWS does not
/// report counts as its default (`false` for switches, empty otherwise).
fn attribute_delta(
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    want.iter()
        .filter(|(k, v)| {
            let default = if k.ends_with(".enabled") { "false" } else { "" };
            have.get(*k).map(String::as_str).unwrap_or(default) != v.as_str()
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Pure: the changes that take `actual` to `desired`, in the order to apply
/// them. Empty when nothing differs. Target groups the Service no longer
/// uses are deleted only after no listener points at them, and only when
/// [`ownership`] proves this CCM made them for the Service.
pub fn plan(desired: &Desired, actual: &Actual, cluster_id: &str) -> Vec<Change> {
    let mut changes = Vec::new();
    // An existing NLB without groups keeps none (see Desired::groups_managed).
    let manage_groups = desired.groups_managed
        && actual
            .lb
            .as_ref()
            .is_none_or(|l| !l.security_groups.is_empty());
    // The owned group and its rules first: the NLB is created with it.
    if manage_groups {
        let (want, have) = (desired.owned_group.as_ref(), actual.owned_group.as_ref());
        let steps = (
            Change::CreateSecurityGroup,
            Change::AuthorizeIngress,
            Change::RevokeIngress,
        );
        owned_group_changes(want, have, steps, &mut changes);
    }
    let owned_id = actual.owned_group.as_ref().map(|g| g.id.as_str());
    let want_groups: BTreeSet<String> = desired
        .security_groups
        .iter()
        .map(|g| g.planned_id(owned_id))
        .collect();
    let lb = existing_unless_recreated(desired, actual, cluster_id, &mut changes);
    let fresh = lb.is_none();
    let lb = lb.unwrap_or_else(|| created(desired, &want_groups, &mut changes));
    let groups = manage_groups.then_some(&want_groups);
    load_balancer_changes(desired, &lb, fresh, groups, &mut changes);
    // Target groups first: listeners are created or moved onto them.
    let by_name: BTreeMap<&str, &ActualTargetGroup> = actual
        .target_groups
        .iter()
        .map(|t| (t.name.as_str(), t))
        .collect();
    for tg in &desired.target_groups {
        match by_name.get(tg.name.as_str()) {
            None => new_target_group_changes(desired, tg, &mut changes),
            Some(have) => target_group_changes(desired, tg, have, &mut changes),
        }
    }
    listener_changes(desired, &lb, &by_name, cluster_id, &mut changes);
    alpn_record(desired, &lb.tags, &mut changes);
    let have: BTreeMap<i32, &ActualListener> = lb.listeners.iter().map(|l| (l.port, l)).collect();
    listener_attributes_changes(desired, &have, &lb.tags, &mut changes);
    retired_changes(desired, actual, cluster_id, manage_groups, &mut changes);
    changes
}

/// A create-time setting of an existing NLB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Scheme,
    /// Pinned addresses (EIPs or private IPv4) and their subnets.
    Addresses,
    /// Subnets without pinned addresses (changed in place with SetSubnets).
    Subnets,
}

/// The create-time settings where the NLB differs from what the Service
/// asks for, each with a sentence saying how.
fn differences(desired: &Desired, current: &ActualLb) -> Vec<(Field, String)> {
    let mut out = Vec::new();
    if current.internal != desired.internal {
        out.push((
            Field::Scheme,
            format!(
                "its scheme is {} and the Service asks for {}",
                scheme(current.internal),
                scheme(desired.internal)
            ),
        ));
    }
    let want: BTreeSet<SubnetMapping> = desired.subnet_mappings.iter().cloned().collect();
    // (An NLB whose addresses AWS does not report is left as it is.)
    if desired.pinned_addresses && current.addresses_reported && current.subnet_mappings != want {
        out.push((
            Field::Addresses,
            "its subnet addresses differ from the Service's eip-allocations or private-ipv4-addresses".to_string(),
        ));
    }
    let have: BTreeSet<&str> = current
        .subnet_mappings
        .iter()
        .map(|m| m.subnet.as_str())
        .collect();
    let want: BTreeSet<&str> = want.iter().map(|m| m.subnet.as_str()).collect();
    if !desired.pinned_addresses && have != want {
        out.push((
            Field::Subnets,
            format!(
                "its subnets are {} and the Service's are {}",
                have.into_iter().collect::<Vec<_>>().join(", "),
                want.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    out
}

/// Whether the Service asks for a different `field` than this CCM applied
/// (the record on the NLB); never without a record.
fn asked(field: Field, record: Option<&Applied>, want: &Applied) -> bool {
    let Some(r) = record else {
        return false;
    };
    match field {
        Field::Scheme => r.internal != want.internal,
        Field::Addresses => r.addresses != want.addresses,
        Field::Subnets => r.subnets != want.subnets,
    }
}

/// Pure: the create-time differences a sync leaves as they are (the Service
/// did not ask for them, see `crate::aws::applied`, or the NLB lacks this
/// cluster's ownership tag), for the Warning event. Empty when none.
pub(crate) fn left_alone(desired: &Desired, actual: &Actual, cluster_id: &str) -> Vec<String> {
    let Some(current) = &actual.lb else {
        return Vec::new();
    };
    let record = Applied::from_tags(&current.tags);
    let owned = ours(
        desired,
        &desired.name,
        &current.tags,
        cluster_id,
        Made::LoadBalancer,
    );
    differences(desired, current)
        .into_iter()
        .filter(|(f, _)| !owned || !asked(*f, record.as_ref(), &desired.applied))
        .map(|(_, what)| what)
        .collect()
}

/// The existing NLB, or `None` when there is none or it must be recreated
/// (then after a delete step): scheme and pinned addresses are create-time
/// only, and are recreated for only when the Service asks for other values
/// than the NLB's record says were applied.
fn existing_unless_recreated(
    desired: &Desired,
    actual: &Actual,
    cluster_id: &str,
    changes: &mut Vec<Change>,
) -> Option<ActualLb> {
    let current = actual.lb.as_ref()?;
    let record = Applied::from_tags(&current.tags);
    let reason = differences(desired, current)
        .into_iter()
        .find(|(f, _)| *f != Field::Subnets && asked(*f, record.as_ref(), &desired.applied));
    let Some((_, reason)) = reason else {
        return Some(current.clone());
    };
    if let Err(why) = prove(
        desired,
        &desired.name,
        &current.tags,
        cluster_id,
        Made::LoadBalancer,
    ) {
        tracing::warn!(load_balancer = %desired.name, %reason, %why, "the NLB is not proven this CCM's; not recreating it");
        return Some(current.clone());
    }
    changes.push(Change::DeleteLoadBalancer {
        arn: current.arn.clone(),
        reason,
    });
    None
}

/// The create step, and the NLB it makes as the later steps see it.
fn created(
    desired: &Desired,
    want_groups: &BTreeSet<String>,
    changes: &mut Vec<Change>,
) -> ActualLb {
    let tags = desired
        .applied
        .tagged(&with_protection(desired, desired.create_tags()));
    changes.push(Change::CreateLoadBalancer {
        internal: desired.internal,
        ip_address_type: desired.ip_address_type.clone(),
        subnet_mappings: desired.subnet_mappings.clone(),
        security_groups: desired.security_groups.clone(),
        tags: tags.clone(),
    });
    ActualLb {
        internal: desired.internal,
        ip_address_type: desired.ip_address_type.clone(),
        subnet_mappings: desired.subnet_mappings.iter().cloned().collect(),
        addresses_reported: true,
        security_groups: want_groups.iter().cloned().collect(),
        tags: tags::Tags::new(tags),
        attributes: BTreeMap::from([
            (ATTR_CROSS_ZONE.to_string(), "false".to_string()),
            (ATTR_ACCESS_LOGS.to_string(), "false".to_string()),
        ]),
        ..ActualLb::default()
    }
}

/// The NLB's own settings: subnets (only when the Service asks for others
/// than were applied), groups (`want_groups`, `None` to leave them), address
/// type, tags (with the record brought up to date on an NLB that has one and
/// nothing left alone), attributes.
fn load_balancer_changes(
    desired: &Desired,
    lb: &ActualLb,
    fresh: bool,
    want_groups: Option<&BTreeSet<String>>,
    changes: &mut Vec<Change>,
) {
    let lb_arn = (!fresh).then(|| lb.arn.clone());
    let record = Applied::from_tags(&lb.tags);
    let mut want_tags = load_balancer_tags(desired);
    let mut want_attributes = desired.attributes.clone();
    if unprotecting(desired, &lb.tags) {
        want_tags.insert(tags::DELETION_PROTECTION_TAG.into(), "off".into());
        want_attributes.insert(ATTR_DELETION_PROTECTION.into(), "false".into());
    }
    let diffs = if fresh {
        Vec::new()
    } else {
        differences(desired, lb)
    };
    let asked_for = |f: Field| asked(f, record.as_ref(), &desired.applied);
    if diffs
        .iter()
        .any(|(f, _)| *f == Field::Subnets && asked_for(*f))
    {
        changes.push(Change::SetSubnets(desired.subnet_mappings.clone()));
    }
    if record.is_some()
        && record.as_ref() != Some(&desired.applied)
        && diffs.iter().all(|(f, _)| asked_for(*f))
    {
        want_tags.insert(tags::APPLIED_TAG.to_string(), desired.applied.to_value());
    }
    let have_groups: BTreeSet<String> = lb.security_groups.iter().cloned().collect();
    if let Some(want) = want_groups
        && !fresh
        && have_groups != *want
    {
        changes.push(Change::SetSecurityGroups(desired.security_groups.clone()));
    }
    if lb.ip_address_type != desired.ip_address_type {
        changes.push(Change::SetIpAddressType(desired.ip_address_type.clone()));
    }
    tag_changes(desired, &want_tags, &lb.tags, lb_arn, changes);
    let attrs = attribute_delta(&want_attributes, &lb.attributes);
    if !attrs.is_empty() {
        changes.push(Change::ModifyAttributes(attrs));
    }
}

/// The NLB's own tags: the Service's, and [`tags::DELETION_PROTECTION_TAG`]
/// `on` while the Service protects it (the proof that this CCM turned AWS's
/// attribute on, so that it may turn it off again).
fn load_balancer_tags(desired: &Desired) -> BTreeMap<String, String> {
    with_protection(desired, desired.tags.clone())
}

/// `tags` with [`tags::DELETION_PROTECTION_TAG`] `on` while the Service
/// protects the NLB.
fn with_protection(
    desired: &Desired,
    mut tags: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    if desired.deletion_protection == Some(true) {
        tags.insert(tags::DELETION_PROTECTION_TAG.into(), "on".into());
    }
    tags
}

/// Whether the NLB's records of what this CCM applied (its `tags`) cannot
/// vouch for what the Service asks, so AWS's attributes and listeners must
/// be read as they are: turning off the protection this CCM set (the
/// settings digest cannot tell it, as the Service no longer writes the
/// key), or an ALPN policy or listener attributes whose record differs.
pub(crate) fn records_stale(desired: &Desired, tags: &BTreeMap<String, String>) -> bool {
    unprotecting(desired, tags)
        || alpn_record_stale(desired, tags)
        || listener_attributes_stale(desired, tags)
}

/// Whether the sync turns off the deletion protection this CCM turned on
/// (the NLB's `tags` say so) because the Service no longer asks for it.
/// Protection set by anyone else is left as it is.
pub(crate) fn unprotecting(desired: &Desired, tags: &BTreeMap<String, String>) -> bool {
    desired.deletion_protection != Some(true)
        && tags.get(tags::DELETION_PROTECTION_TAG).map(String::as_str) == Some("on")
}

/// Pure: what the deletion of a protected Service does to its NLB, when
/// [`ownership`] proves it this CCM's for `service_key` (`None` when not:
/// the deletion leaves it anyway). The NLB, its listeners, target groups
/// and own security group stay; its targets are deregistered, since the
/// Service's node ports are released with it and may be given to another
/// Service; it is tagged [`tags::KEPT_TAG`] with the Service it was kept
/// from. `actual.target_groups` carry their registered targets; only those
/// of a group proven made for the Service (as [`plan_delete`] proves the
/// groups it deletes) are deregistered.
pub(crate) fn plan_keep(
    actual: &Actual,
    cluster_id: &str,
    lb_name: &str,
    service_key: &str,
) -> Option<Vec<Change>> {
    let proven = |made: Made, name: &str, tags: &BTreeMap<String, String>| {
        ownership::prove(made, name, tags, cluster_id, Some(service_key)).is_ok()
    };
    let lb = (actual.lb.as_ref()).filter(|lb| proven(Made::LoadBalancer, lb_name, &lb.tags))?;
    let mut changes: Vec<Change> = (actual.target_groups.iter())
        .filter(|tg| !tg.targets.is_empty() && proven(Made::TargetGroup, &tg.name, &tg.tags))
        .map(|tg| Change::DeregisterTargets {
            arn: tg.arn.clone(),
            port: tg.port,
            instances: tg.targets.clone(),
        })
        .collect();
    if lb.tags.get(tags::KEPT_TAG).map(String::as_str) != Some(service_key) {
        changes.push(Change::AddTags {
            arn: Some(lb.arn.clone()),
            tags: BTreeMap::from([(tags::KEPT_TAG.to_string(), service_key.to_string())]),
        });
    }
    Some(changes)
}

/// The tag writes that take one resource (`arn`, `None` for the NLB) from
/// `have` to `want`, following `additional-resource-tags`
/// ([`tags::follow_annotation`]): additions first, then removals.
fn tag_changes(
    desired: &Desired,
    want: &BTreeMap<String, String>,
    have: &BTreeMap<String, String>,
    arn: Option<String>,
    changes: &mut Vec<Change>,
) {
    let writes = tags::follow_annotation(want, &desired.additional_tags, have);
    if !writes.add.is_empty() {
        changes.push(Change::AddTags {
            arn: arn.clone(),
            tags: writes.add,
        });
    }
    if !writes.remove.is_empty() {
        changes.push(Change::RemoveTags {
            arn,
            keys: writes.remove,
        });
    }
}

/// A target group to create: then its attributes and targets.
fn new_target_group_changes(desired: &Desired, tg: &TargetGroup, changes: &mut Vec<Change>) {
    let mut tags = desired.create_tags();
    if let Some(record) =
        tags::record_value(&tags::recordable(desired.target_group_attributes.keys()))
        && tags.len() < tags::MAX_LB_TAGS
    {
        tags.insert(tags::TARGET_GROUP_ATTRIBUTES_TAG.to_string(), record);
    }
    if let Some(t) = tg.health.timeout
        && tags.len() < tags::MAX_LB_TAGS
    {
        tags.insert(tags::HEALTH_TIMEOUT_TAG.to_string(), t.to_string());
    }
    changes.push(Change::CreateTargetGroup {
        group: tg.clone(),
        tags,
    });
    if !desired.target_group_attributes.is_empty() {
        changes.push(Change::ModifyTargetGroupAttributes {
            target_group: TgRef::Name(tg.name.clone()),
            attributes: desired.target_group_attributes.clone(),
        });
    }
    if !desired.instances.is_empty() {
        changes.push(Change::RegisterTargets {
            target_group: TgRef::Name(tg.name.clone()),
            port: tg.port,
            instances: desired.instances.clone(),
        });
    }
}

/// An existing target group: health check, tags, attributes, targets.
fn target_group_changes(
    desired: &Desired,
    tg: &TargetGroup,
    have: &ActualTargetGroup,
    changes: &mut Vec<Change>,
) {
    let h = &have.health;
    let mut w = tg.health.clone();
    w.timeout = health_timeout_target(desired, have);
    let path_differs = w.protocol != "TCP" && w.path != h.path;
    let timeout_differs = w.timeout.is_some_and(|t| h.timeout != Some(t));
    if w.port != h.port
        || w.healthy != h.healthy
        || w.unhealthy != h.unhealthy
        || path_differs
        || timeout_differs
    {
        changes.push(Change::ModifyHealthCheck {
            arn: have.arn.clone(),
            health: w,
        });
    }
    health_timeout_record(desired, have, timeout_differs, changes);
    tag_changes(
        desired,
        &desired.tags,
        &have.tags,
        Some(have.arn.clone()),
        changes,
    );
    target_group_attribute_changes(desired, have, changes);
    target_changes(
        &have.arn,
        have.port,
        &have.targets,
        &desired.instances,
        changes,
    );
}

/// An existing group's attributes: those the annotation names, and those
/// this CCM applied before (its record) that it no longer names, back to
/// AWS's default; then the record of the keys applied. A group without a
/// record whose attributes already match (the Go CCM's) gets no write.
fn target_group_attribute_changes(
    desired: &Desired,
    have: &ActualTargetGroup,
    changes: &mut Vec<Change>,
) {
    let want = &desired.target_group_attributes;
    let recorded = tags::recorded_keys(&have.tags, tags::TARGET_GROUP_ATTRIBUTES_TAG);
    let mut attrs = attribute_delta(want, &have.attributes);
    for (key, default) in attributes::defaults_of_dropped(&recorded, want, &have.protocol) {
        if have.attributes.get(&key) != Some(&default) {
            attrs.insert(key, default);
        }
    }
    let written = !attrs.is_empty();
    if written {
        changes.push(Change::ModifyTargetGroupAttributes {
            target_group: TgRef::Arn(have.arn.clone()),
            attributes: attrs,
        });
    }
    let has_record = have.tags.contains_key(tags::TARGET_GROUP_ATTRIBUTES_TAG);
    let keys = tags::recordable(want.keys());
    if !(written || has_record) || has_record && recorded == keys {
        return;
    }
    let arn = Some(have.arn.clone());
    if keys.is_empty() {
        changes.push(Change::RemoveTags {
            arn,
            keys: BTreeSet::from([tags::TARGET_GROUP_ATTRIBUTES_TAG.to_string()]),
        });
    } else if let Some(record) = tags::record_value(&keys) {
        changes.push(Change::AddTags {
            arn,
            tags: BTreeMap::from([(tags::TARGET_GROUP_ATTRIBUTES_TAG.to_string(), record)]),
        });
    }
}

/// Registers the targets `want` adds to `have` in group `arn` on `port`,
/// then deregisters those it drops (the group never goes empty while
/// nodes are replaced): at most one step each.
pub(crate) fn target_changes(
    arn: &str,
    port: i32,
    have: &BTreeSet<String>,
    want: &BTreeSet<String>,
    changes: &mut Vec<Change>,
) {
    let (register, deregister) = delta(have, want);
    if !register.is_empty() {
        changes.push(Change::RegisterTargets {
            target_group: TgRef::Arn(arn.to_string()),
            port,
            instances: register,
        });
    }
    if !deregister.is_empty() {
        changes.push(Change::DeregisterTargets {
            arn: arn.to_string(),
            port,
            instances: deregister,
        });
    }
}

/// Listeners, one per port: modify in place (protocol, certificate,
/// policy, target group), create the missing, delete the extra; the tags
/// of those whose tags were read follow the annotation.
fn listener_changes(
    desired: &Desired,
    lb: &ActualLb,
    by_name: &BTreeMap<&str, &ActualTargetGroup>,
    cluster_id: &str,
    changes: &mut Vec<Change>,
) {
    let arn_of = |name: &str| by_name.get(name).map(|t| t.arn.clone());
    let have: BTreeMap<i32, &ActualListener> = lb.listeners.iter().map(|l| (l.port, l)).collect();
    let want_ports: BTreeSet<i32> = desired.listeners.iter().map(|l| l.port).collect();
    for l in &lb.listeners {
        if !want_ports.contains(&l.port) {
            changes.push(Change::DeleteListener { arn: l.arn.clone() });
        }
    }
    let alpn = alpn_target(desired, &lb.tags);
    for l in &desired.listeners {
        let tls = l.protocol == "TLS";
        match have.get(&l.port) {
            None => changes.push(Change::CreateListener {
                listener: l.clone(),
                tags: desired.create_tags(),
                alpn: desired
                    .alpn
                    .as_ref()
                    .and_then(|a| a.want.clone())
                    .filter(|_| tls),
            }),
            Some(h) => {
                let alpn = alpn.clone().filter(|_| tls);
                let have_alpn = h.alpn.as_deref().unwrap_or(super::ALPN_NONE);
                let same = h.protocol == l.protocol
                    && h.certificate == l.certificate
                    && (l.ssl_policy.is_none() || h.ssl_policy == l.ssl_policy)
                    && h.target_group_arn.is_some()
                    && h.target_group_arn == arn_of(&l.target_group)
                    && alpn.as_deref().is_none_or(|p| p == have_alpn);
                if !same {
                    changes.push(Change::ModifyListener {
                        arn: h.arn.clone(),
                        listener: l.clone(),
                        alpn,
                    });
                }
                // Only a listener tagged as this cluster's: AWS (and the
                // policy) let the CCM tag no other.
                if let Some(have_tags) = &h.tags
                    && tags::is_owned(have_tags, cluster_id)
                {
                    tag_changes(
                        desired,
                        &desired.tags,
                        have_tags,
                        Some(h.arn.clone()),
                        changes,
                    );
                }
            }
        }
    }
}

/// [`ownership::prove`] for a resource of the Service `desired` is for.
fn prove(
    desired: &Desired,
    name: &str,
    tags: &BTreeMap<String, String>,
    cluster_id: &str,
    made: Made,
) -> Result<(), ownership::NotMade> {
    let service = desired.tags.get(tags::SERVICE_NAME_TAG).map(String::as_str);
    ownership::prove(made, name, tags, cluster_id, service)
}

fn ours(
    desired: &Desired,
    name: &str,
    tags: &BTreeMap<String, String>,
    cluster_id: &str,
    made: Made,
) -> bool {
    prove(desired, name, tags, cluster_id, made).is_ok()
}

/// A short, stable description of a change for logs and events.
pub(crate) fn describe(change: &Change) -> String {
    match change {
        Change::CreateSecurityGroup(g) => format!("create security group {}", g.name),
        Change::AuthorizeIngress(r) => format!("authorize {} rule(s) on the NLB group", r.len()),
        Change::RevokeIngress(r) => format!("revoke {} rule(s) on the NLB group", r.len()),
        Change::SetSecurityGroups(g) => format!("set the NLB's security groups ({})", g.len()),
        Change::DeleteSecurityGroup(id) => format!("delete security group {id}"),
        Change::DeleteLoadBalancer { reason, .. } => format!("delete NLB ({reason})"),
        Change::CreateLoadBalancer { .. } => "create NLB".into(),
        Change::SetSubnets(m) => format!("set subnets ({})", m.len()),
        Change::SetIpAddressType(t) => format!("set IP address type {t}"),
        Change::AddTags { arn, tags } => format!(
            "tag {} with {:?}",
            arn.as_deref().unwrap_or("the NLB"),
            tags.keys().collect::<Vec<_>>()
        ),
        Change::RemoveTags { arn, keys } => format!(
            "untag {} of {:?}",
            arn.as_deref().unwrap_or("the NLB"),
            keys
        ),
        Change::ModifyAttributes(a) => format!("set attributes {:?}", a.keys().collect::<Vec<_>>()),
        Change::CreateTargetGroup { group, .. } => {
            format!(
                "create target group {} ({} {})",
                group.name, group.protocol, group.port
            )
        }
        Change::ModifyHealthCheck { arn, .. } => format!("modify health check of {arn}"),
        Change::ModifyTargetGroupAttributes { target_group, .. } => {
            format!("set attributes of target group {target_group:?}")
        }
        Change::RegisterTargets {
            target_group,
            instances,
            ..
        } => format!("register {} target(s) in {target_group:?}", instances.len()),
        Change::DeregisterTargets { arn, instances, .. } => {
            format!("deregister {} target(s) from {arn}", instances.len())
        }
        Change::CreateListener {
            listener,
            alpn: Some(p),
            ..
        } => format!(
            "create listener {} {} (ALPN policy {p})",
            listener.protocol, listener.port
        ),
        Change::CreateListener { listener, .. } => {
            format!("create listener {} {}", listener.protocol, listener.port)
        }
        Change::ModifyListener {
            listener,
            alpn: Some(p),
            ..
        } => format!(
            "modify listener {} {} (ALPN policy {p})",
            listener.protocol, listener.port
        ),
        Change::ModifyListener { listener, .. } => {
            format!("modify listener {} {}", listener.protocol, listener.port)
        }
        Change::ModifyListenerAttributes {
            port, attributes, ..
        } => {
            let pairs: Vec<String> = attributes.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(
                "set the attributes of listener {port}: {}",
                pairs.join(", ")
            )
        }
        Change::DeleteListener { arn } => format!("delete listener {arn}"),
        Change::DeleteTargetGroup { name, .. } => format!("delete target group {name}"),
    }
}
