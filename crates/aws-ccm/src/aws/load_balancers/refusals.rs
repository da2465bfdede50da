//! Load-balancer writes the IAM policy denies, refused up front (issue 16;
//! see docs/iam-self-check.md).
//!
//! Two writes of a sync may fall outside the least-privilege policy:
//! ingress rules on a node security group without the cluster tag (kubeadm's
//! usual single, untagged node group), and `ModifyListener`/`DeleteListener`
//! on an NLB listener without `kubernetes.io/cluster/<id>=owned` (made by the
//! Go CCM before it tagged listeners). Those are skipped, the rest of the
//! load balancer syncs, and the Service gets a Warning event naming the
//! resource and the fix. A real call IAM refuses is recorded in the
//! permission registry as denied, so it is not retried until the re-check.

use std::collections::{BTreeMap, BTreeSet};

use super::{AwsLoadBalancers, CloudError, Warning};
use crate::aws::memory::{Applied, Journal};
use crate::aws::permissions::{Action, Denial, Probe, Tagging};
use crate::aws::security_groups::{self as sg, SecurityGroup};
use crate::aws::{AwsError, tags};
use crate::aws::{elb, nlb};

/// Event reason: a node security group IAM lets this CCM not write.
const SECURITY_GROUP_UNAUTHORIZED: &str = "SecurityGroupUnauthorized";
/// Event reason: an NLB listener IAM lets this CCM not change.
const LISTENER_UNAUTHORIZED: &str = "ListenerUnauthorized";

/// How a write of node rules ended, when AWS did not fail it otherwise.
#[derive(Debug)]
pub(super) enum Written {
    Done,
    /// IAM refused it (a warning is recorded).
    Refused,
    /// AWS refused a rule past the group's rules limit
    /// (`RulesPerSecurityGroupLimitExceeded`); nothing after it was sent.
    AtRuleLimit(AwsError),
}

/// The Warning for a node group whose ingress rules IAM denies.
fn group_warning(service_key: &str, denial: &Denial) -> Warning {
    Warning {
        reason: SECURITY_GROUP_UNAUTHORIZED,
        message: format!(
            "Not writing the load balancer's rules of {service_key} into node security group {}: {denial}",
            denial.resource_id
        ),
    }
}

/// The Warning for NLB listeners the policy does not let this CCM change
/// (`arns`, lacking `owned_tag` = `kubernetes.io/cluster/<id>=owned`): one
/// event (events fold by reason) with one command that tags them all,
/// ARNs sorted.
fn untagged_listeners_warning(service_key: &str, arns: &[String], owned_tag: &str) -> Warning {
    let (key, value) = owned_tag.split_once('=').unwrap_or((owned_tag, ""));
    let mut arns = arns.to_vec();
    arns.sort();
    Warning {
        reason: LISTENER_UNAUTHORIZED,
        message: format!(
            "Not modifying or deleting listener {list} of {service_key}: the IAM policy grants ModifyListener, ModifyListenerAttributes and DeleteListener only on listeners tagged {owned_tag}, which listeners made before 2022 lack; tag them: aws elbv2 add-tags --resource-arns {args} --tags Key={key},Value={value}",
            list = arns.join(", "),
            args = arns.join(" "),
        ),
    }
}

/// The Warning for a listener write a real call found refused.
fn listener_warning(service_key: &str, denial: &Denial) -> Warning {
    Warning {
        reason: LISTENER_UNAUTHORIZED,
        message: format!(
            "Not modifying or deleting listener {} of {service_key}: {denial}",
            denial.resource_arn
        ),
    }
}

fn log(service_key: &str, denial: &Denial, what: &str) {
    tracing::warn!(
        service = service_key,
        resource = %denial.resource_id,
        iam_action = denial.action.iam_action(),
        resource_arn = %denial.resource_arn,
        missing_tag = %denial.missing_tag,
        fix = denial.render_option.as_deref().unwrap_or("tag the resource"),
        "{what} refused: {denial}"
    );
}

/// Logs a node group write IAM refuses and warns of it.
fn group_denied(service_key: &str, denial: &Denial, warnings: &mut Vec<Warning>) {
    log(service_key, denial, "node security group write");
    warnings.push(group_warning(service_key, denial));
}

/// The listener `change` would modify or delete, if any.
fn listener_write(change: &nlb::Change) -> Option<&String> {
    match change {
        nlb::Change::ModifyListener { arn, .. } | nlb::Change::DeleteListener { arn } => Some(arn),
        nlb::Change::ModifyListenerAttributes { arn: Some(arn), .. } => Some(arn),
        _ => None,
    }
}

/// The listener ARNs `changes` would modify or delete.
fn listener_writes(changes: &[nlb::Change]) -> Vec<String> {
    changes.iter().filter_map(listener_write).cloned().collect()
}

/// Drops the listener writes IAM would deny: `ModifyListener`,
/// `ModifyListenerAttributes` and `DeleteListener` on a listener whose tags (`listener_tags`, by ARN; a
/// missing entry is no tags) lack `kubernetes.io/cluster/<id>=owned`, or
/// that a real call was refused before (`denied`). A target group such a
/// listener still forwards to is not deleted either (AWS refuses to delete
/// a target group in use). Returns the kept changes and the refused ARNs.
fn refuse_listener_writes(
    changes: Vec<nlb::Change>,
    actual: &nlb::Actual,
    listener_tags: &BTreeMap<String, BTreeMap<String, String>>,
    cluster_id: &str,
    denied: impl Fn(&str) -> bool,
) -> (Vec<nlb::Change>, Vec<String>) {
    let no_tags = BTreeMap::new();
    let refused: Vec<String> = listener_writes(&changes)
        .into_iter()
        .filter(|arn| {
            !tags::is_owned(listener_tags.get(arn).unwrap_or(&no_tags), cluster_id) || denied(arn)
        })
        .collect();
    let kept_groups: Vec<&str> = actual
        .lb
        .iter()
        .flat_map(|lb| &lb.listeners)
        .filter(|l| refused.contains(&l.arn))
        .filter_map(|l| l.target_group_arn.as_deref())
        .collect();
    let unwired = unwired_groups(&changes, &refused);
    // The record of an ALPN policy or of listener attributes says it was
    // applied: not while a listener it is for is refused.
    let alpn_refused = changes.iter().any(|c| {
        matches!(c, nlb::Change::ModifyListener { arn, alpn: Some(_), .. } if refused.contains(arn))
    });
    let attributes_refused = changes.iter().any(|c| {
        matches!(c, nlb::Change::ModifyListenerAttributes { arn: Some(arn), .. } if refused.contains(arn))
    });
    let held = |key: &str| {
        key == tags::ALPN_POLICY_TAG && alpn_refused
            || key == tags::LISTENER_ATTRIBUTES_TAG && attributes_refused
    };
    let kept = changes
        .into_iter()
        .filter(|c| match c {
            _ if let Some(arn) = listener_write(c) => !refused.contains(arn),
            nlb::Change::AddTags { arn: None, tags } => !tags.keys().any(|k| held(k)),
            nlb::Change::RemoveTags { arn: None, keys } => !keys.iter().any(|k| held(k)),
            nlb::Change::DeleteTargetGroup { arn, .. } => !kept_groups.contains(&arn.as_str()),
            nlb::Change::CreateTargetGroup { group, .. } => !unwired.contains(&group.name),
            nlb::Change::RegisterTargets {
                target_group: nlb::TgRef::Name(name),
                ..
            }
            | nlb::Change::ModifyTargetGroupAttributes {
                target_group: nlb::TgRef::Name(name),
                ..
            } => !unwired.contains(name),
            _ => true,
        })
        .collect();
    (kept, refused)
}

/// Names of the new target groups only refused listener writes would have
/// pointed at: made anyway, they would belong to no listener (an orphan
/// of a live Service), so they are not made until the listener is ours.
fn unwired_groups(changes: &[nlb::Change], refused: &[String]) -> BTreeSet<String> {
    let mut only_refused = BTreeSet::new();
    let mut wired = BTreeSet::new();
    for change in changes {
        match change {
            nlb::Change::ModifyListener { arn, listener, .. } if refused.contains(arn) => {
                only_refused.insert(listener.target_group.clone());
            }
            nlb::Change::ModifyListener { listener, .. }
            | nlb::Change::CreateListener { listener, .. } => {
                wired.insert(listener.target_group.clone());
            }
            _ => {}
        }
    }
    only_refused.retain(|name| !wired.contains(name));
    only_refused
}

impl AwsLoadBalancers {
    /// Whether IAM refuses ingress writes to `group`: a group without the
    /// cluster tag is asked with a DryRun (cached in the registry); a
    /// tagged one is granted by the policy unless a real call was refused.
    /// A refusal is logged and added to `warnings`.
    pub(super) async fn group_refused(
        &self,
        service_key: &str,
        group: &SecurityGroup,
        warnings: &mut Vec<Warning>,
    ) -> bool {
        let perms = self.aws.memory().permissions();
        perms.learn_account(group.owner_id.as_deref());
        let tagging = self.group_tagging(group);
        let action = Action::AuthorizeSecurityGroupIngress;
        let verdict = if tagging == Tagging::Current {
            perms.cached(action, &group.id)
        } else {
            let probe = Probe::Ingress {
                group_id: group.id.clone(),
            };
            Some(perms.check(&self.aws, &probe, tagging).await)
        };
        let denial = verdict.as_ref().and_then(|v| v.denial());
        if let Some(denial) = denial {
            group_denied(service_key, denial, warnings);
        }
        denial.is_some()
    }

    /// How `group` is tagged for this cluster, as IAM's conditions see it.
    fn group_tagging(&self, group: &SecurityGroup) -> Tagging {
        let tags = group.tags.iter().map(|(k, v)| (k.as_str(), v.as_str()));
        Tagging::of(&self.cluster_id, tags)
    }

    /// Drops a classic ELB's node-group rule changes on groups IAM refuses
    /// (see [`Self::group_refused`]); `groups` holds the groups by ID.
    pub(super) async fn refuse_node_ingress(
        &self,
        service_key: &str,
        groups: &BTreeMap<String, SecurityGroup>,
        changes: Vec<elb::Change>,
        warnings: &mut Vec<Warning>,
    ) -> Vec<elb::Change> {
        let node_group = |c: &elb::Change| match c {
            elb::Change::AuthorizeNodeIngress { node_group, .. }
            | elb::Change::RevokeNodeIngress { node_group, .. } => Some(node_group.clone()),
            _ => None,
        };
        let touched: BTreeSet<String> = changes.iter().filter_map(node_group).collect();
        let mut refused = BTreeSet::new();
        for id in touched {
            if let Some(g) = groups.get(&id)
                && self.group_refused(service_key, g, warnings).await
            {
                refused.insert(id);
            }
        }
        changes
            .into_iter()
            .filter(|c| node_group(c).is_none_or(|g| !refused.contains(&g)))
            .collect()
    }

    /// Writes an NLB's rule changes to one node group (adding first when
    /// [`nlb::node_rules::RuleChanges::adds_first`]). IAM's refusal of the
    /// real call is recorded as denied and becomes a warning, not an error;
    /// AWS's refusal of a rule past the group's limit is returned as
    /// [`Written::AtRuleLimit`] for the caller to fall back.
    pub(super) async fn write_node_rules(
        &self,
        service_key: &str,
        group: &SecurityGroup,
        changes: &nlb::node_rules::RuleChanges,
        warnings: &mut Vec<Warning>,
    ) -> Result<Written, CloudError> {
        let mut journal = Journal::default();
        let (aws, id, described) = (&self.aws, &group.id, &group.descriptions);
        let written = async {
            if changes.adds_first() {
                sg::io::authorize_described(aws, &mut journal, id, &changes.authorize).await?;
                sg::io::revoke_described(aws, &mut journal, id, &changes.revoke, described).await
            } else {
                sg::io::revoke_described(aws, &mut journal, id, &changes.revoke, described).await?;
                sg::io::authorize_described(aws, &mut journal, id, &changes.authorize).await
            }
        }
        .await;
        self.memory().applied(Applied::Writes(journal));
        let Err(e) = written else {
            return Ok(Written::Done);
        };
        if e.is_rule_limit() {
            return Ok(Written::AtRuleLimit(e));
        }
        let action = Action::AuthorizeSecurityGroupIngress;
        let tagging = self.group_tagging(group);
        let perms = self.aws.memory().permissions();
        let Some(denial) = perms.record_refusal(&e, action, &group.id, tagging) else {
            return Err(e.into());
        };
        group_denied(service_key, &denial, warnings);
        Ok(Written::Refused)
    }

    /// Drops the listener writes IAM would deny (see
    /// [`refuse_listener_writes`]), reading the tags of the listeners
    /// `changes` would modify or delete (only those, 20 per DescribeTags).
    pub(super) async fn refuse_listeners(
        &self,
        service_key: &str,
        actual: &nlb::Actual,
        changes: Vec<nlb::Change>,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<nlb::Change>, CloudError> {
        let arns = listener_writes(&changes);
        if arns.is_empty() {
            return Ok(changes);
        }
        let listener_tags = nlb::read::tags_of(&self.aws, &arns).await?;
        let perms = self.aws.memory().permissions();
        let (kept, refused) =
            refuse_listener_writes(changes, actual, &listener_tags, &self.cluster_id, |arn| {
                perms
                    .cached(Action::ModifyListener, arn)
                    .is_some_and(|v| v.denial().is_some())
            });
        if !refused.is_empty() {
            for arn in &refused {
                let owned = listener_tags
                    .get(arn)
                    .is_some_and(|t| tags::is_owned(t, &self.cluster_id));
                let tagging = if owned {
                    Tagging::Current
                } else {
                    Tagging::Untagged
                };
                log(
                    service_key,
                    &perms.denial(Action::ModifyListener, arn, tagging),
                    "listener write",
                );
            }
            let owned_tag = perms.wanted_tag(Action::ModifyListener);
            warnings.push(untagged_listeners_warning(
                service_key,
                &refused,
                &owned_tag,
            ));
        }
        Ok(kept)
    }

    /// Records listener writes a real call found refused and warns of them.
    pub(super) fn record_refused_listeners(
        &self,
        service_key: &str,
        refused: &[(String, AwsError)],
        warnings: &mut Vec<Warning>,
    ) {
        for (arn, error) in refused {
            let perms = self.aws.memory().permissions();
            if let Some(denial) =
                perms.record_refusal(error, Action::ModifyListener, arn, Tagging::Current)
            {
                log(service_key, &denial, "listener write");
                warnings.push(listener_warning(service_key, &denial));
            }
        }
    }
}

#[cfg(test)]
mod tests;
