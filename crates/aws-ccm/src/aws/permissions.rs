//! What IAM lets this CCM write, found out with EC2's `DryRun` and kept in a
//! shared registry.
//!
//! The least-privilege policy (`iam/policy.json`) grants EC2 writes only on
//! resources that carry this cluster's tag. A write to anything else would
//! be answered `UnauthorizedOperation` on every retry, forever. So before a
//! write to a resource that may be outside the policy (a route table, a
//! node's security group, an instance), the controllers ask
//! [`Permissions::check`]: one `DryRun=true` request through the one door
//! (same token bucket and metrics as the real call), whose verdict is kept
//! per (action, resource) for [`DEFAULT_TTL`]. A denied write is refused up
//! front with a message naming the IAM action, the resource ARN, the tag that
//! is missing and how to grant it; once the tag is added (or the policy
//! widened), the next check after the TTL finds it allowed, without a restart.
//!
//! The start-up self-check ([`self_check`]) runs the same probes on one real
//! resource of each kind the CCM writes and logs every denial.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_ec2::Client as Ec2;
use aws_sdk_ec2::types::{AttributeBooleanValue, IpPermission, Tag, UserIdGroupPair};
use parking_lot::Mutex;
use tokio::time::Instant;

use super::client::operations::Operation;
use super::client::{AwsClient, DryRun};
use super::routes::io::{create_route_request, delete_route_request};
use super::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG, cluster_tag_key};
/// The types are the provider's (cloud-neutral); what they mean on AWS
/// (IAM action names, DryRun requests, the operator's message) is here.
pub(crate) use crate::provider::permissions::{Action, Denial, Probe, Tagging, Verdict};

mod gaps;
mod self_check;

/// How long a verdict is trusted before the next write asks again.
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(300);

/// The key the CreateTags probe uses: one no policy statement singles out
/// (the policy only forbids the cluster tags themselves).
const PROBE_TAG_KEY: &str = "aws-ccm/permission-check";

impl Action {
    /// The IAM action, as a policy names it.
    pub(crate) fn iam_action(self) -> &'static str {
        match self {
            Action::CreateRoute => "ec2:CreateRoute",
            Action::AuthorizeSecurityGroupIngress => "ec2:AuthorizeSecurityGroupIngress",
            Action::ModifyInstanceAttribute => "ec2:ModifyInstanceAttribute",
            Action::CreateTags => "ec2:CreateTags",
            Action::ModifyListener => "elasticloadbalancing:ModifyListener",
        }
    }

    /// The resource type in the ARN.
    fn resource_type(self) -> &'static str {
        match self {
            Action::CreateRoute => "route-table",
            Action::AuthorizeSecurityGroupIngress => "security-group",
            Action::ModifyInstanceAttribute | Action::CreateTags => "instance",
            Action::ModifyListener => "listener",
        }
    }

    /// The `iam/render.sh` option that grants this action on a resource
    /// without the cluster tag.
    fn render_option(self, resource_id: &str, tagging: Tagging) -> Option<String> {
        match (self, tagging) {
            // The policy's listener rows know no widening option.
            (Action::ModifyListener, _) => None,
            (_, Tagging::LegacyOnly) => Some("--legacy-cluster-tag".into()),
            (Action::CreateRoute, _) => Some(format!("--route-table {resource_id}")),
            (Action::AuthorizeSecurityGroupIngress, _) => {
                Some(format!("--security-group {resource_id}"))
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.iam_action())
    }
}

impl Tagging {
    /// Reads a resource's tags.
    pub(crate) fn of<'a>(
        cluster_id: &str,
        tags: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Tagging {
        let key = cluster_tag_key(cluster_id);
        let mut legacy = false;
        for (k, v) in tags {
            if k == key {
                return Tagging::Current;
            }
            legacy |= k == LEGACY_CLUSTER_TAG && v == cluster_id;
        }
        if legacy {
            Tagging::LegacyOnly
        } else {
            Tagging::Untagged
        }
    }
}

impl std::fmt::Display for Denial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let now = match self.tagging {
            Tagging::Current => "carries the cluster tag but is still denied",
            Tagging::LegacyOnly => "carries only the legacy KubernetesCluster tag",
            Tagging::Untagged => "lacks the cluster tag",
        };
        write!(
            f,
            "IAM denies {} on {} ({now}): tag it {}",
            self.action, self.resource_arn, self.missing_tag
        )?;
        match &self.render_option {
            Some(option) => write!(f, ", or render the policy with iam/render.sh {option}"),
            None if self.action == Action::ModifyListener => {
                let (key, value) = self.missing_tag.split_once('=').unwrap_or_default();
                write!(
                    f,
                    " (aws elbv2 add-tags --resource-arns {} --tags Key={key},Value={value})",
                    self.resource_arn
                )
            }
            None => f.write_str(", or widen the CCM role's policy"),
        }
    }
}

impl Probe {
    /// The probe's write, as a DryRun: a route's creation (with a target)
    /// or removal; `AuthorizeSecurityGroupIngress` of the group to itself;
    /// turning source/destination checking off; the [`PROBE_TAG_KEY`] tag
    /// on an instance.
    async fn send(&self, aws: &AwsClient) -> Result<DryRun, super::AwsError> {
        match self {
            Probe::Route {
                table_id,
                destination,
                instance_id: Some(instance_id),
            } => {
                aws.dry_run(Operation::Ec2CreateRoute, |ec2: Ec2| {
                    create_route_request(&ec2, table_id, *destination, instance_id)
                        .dry_run(true)
                        .send()
                })
                .await
            }
            Probe::Route {
                table_id,
                destination,
                instance_id: None,
            } => {
                aws.dry_run(Operation::Ec2DeleteRoute, |ec2: Ec2| {
                    delete_route_request(&ec2, table_id, *destination)
                        .dry_run(true)
                        .send()
                })
                .await
            }
            Probe::Ingress { group_id } => {
                let itself = IpPermission::builder()
                    .ip_protocol("-1")
                    .user_id_group_pairs(UserIdGroupPair::builder().group_id(group_id).build())
                    .build();
                aws.dry_run(Operation::Ec2AuthorizeSecurityGroupIngress, |ec2: Ec2| {
                    ec2.authorize_security_group_ingress()
                        .dry_run(true)
                        .group_id(group_id)
                        .ip_permissions(itself.clone())
                        .send()
                })
                .await
            }
            Probe::SourceDestCheck { instance_id } => {
                aws.dry_run(Operation::Ec2ModifyInstanceAttribute, |ec2: Ec2| {
                    ec2.modify_instance_attribute()
                        .dry_run(true)
                        .instance_id(instance_id)
                        .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                        .send()
                })
                .await
            }
            Probe::Tags { instance_id } => {
                let tag = Tag::builder().key(PROBE_TAG_KEY).value("dry-run").build();
                aws.dry_run(Operation::Ec2CreateTags, |ec2: Ec2| {
                    ec2.create_tags()
                        .dry_run(true)
                        .resources(instance_id)
                        .tags(tag.clone())
                        .send()
                })
                .await
            }
        }
    }
}

/// The partitions whose regions start with a prefix; any other region is
/// in `aws`.
const PARTITIONS: &[(&str, &str)] = &[
    ("cn-", "aws-cn"),
    ("us-gov-", "aws-us-gov"),
    ("us-iso-", "aws-iso"),
    ("us-isob-", "aws-iso-b"),
    ("eu-isoe-", "aws-iso-e"),
];

/// The AWS partition of a region (`aws`, `aws-cn`, `aws-us-gov`, ...).
fn partition(region: &str) -> &'static str {
    (PARTITIONS.iter())
        .find(|(prefix, _)| region.starts_with(prefix))
        .map_or("aws", |(_, partition)| partition)
}

#[derive(Clone, Debug)]
struct Entry {
    verdict: Verdict,
    at: Instant,
}

/// The shared registry of verdicts, keyed by (action, resource ID). Cheap
/// to share: [`super::Aws`] holds one beside the door.
#[derive(Debug)]
pub(crate) struct Permissions {
    cluster_id: String,
    region: String,
    ttl: Duration,
    account: Mutex<Option<String>>,
    entries: Mutex<HashMap<(Action, String), Entry>>,
}

impl Permissions {
    pub(crate) fn new(cluster_id: &str, region: &str, ttl: Duration) -> Permissions {
        Permissions {
            cluster_id: cluster_id.to_string(),
            region: region.to_string(),
            ttl,
            account: Mutex::new(None),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The account ID for ARNs, learned from an `OwnerId` AWS returned.
    pub(crate) fn learn_account(&self, owner_id: Option<&str>) {
        if let Some(id) = owner_id.filter(|id| !id.is_empty()) {
            self.account.lock().get_or_insert_with(|| id.to_string());
        }
    }

    pub(crate) fn account(&self) -> Option<String> {
        self.account.lock().clone()
    }

    /// The region ARNs are built for.
    pub(crate) fn region(&self) -> &str {
        &self.region
    }

    /// The resource's ARN, as IAM evaluates it (ELBv2 resources are
    /// known by their ARN already).
    pub(crate) fn arn(&self, action: Action, resource_id: &str) -> String {
        if resource_id.starts_with("arn:") {
            return resource_id.to_string();
        }
        let account = self.account().unwrap_or_else(|| "<account-id>".into());
        format!(
            "arn:{}:ec2:{}:{account}:{}/{resource_id}",
            partition(&self.region),
            self.region,
            action.resource_type()
        )
    }

    /// The tag the policy wants on a resource for `action`.
    pub(crate) fn wanted_tag(&self, action: Action) -> String {
        let key = format!("{CLUSTER_TAG_PREFIX}{}", self.cluster_id);
        match action {
            // The group is the nodes', not made by the CCM.
            Action::AuthorizeSecurityGroupIngress => format!("{key}=shared"),
            // Only what this CCM made.
            Action::ModifyListener => format!("{key}=owned"),
            _ => format!("{key}=owned (or shared)"),
        }
    }

    /// The denial of `action` on a resource tagged `tagging` (not recorded).
    pub(crate) fn denial(&self, action: Action, resource_id: &str, tagging: Tagging) -> Denial {
        Denial {
            action,
            resource_id: resource_id.to_string(),
            resource_arn: self.arn(action, resource_id),
            missing_tag: self.wanted_tag(action),
            tagging,
            render_option: action.render_option(resource_id, tagging),
        }
    }

    /// A fresh verdict, if one is known.
    pub(crate) fn cached(&self, action: Action, resource_id: &str) -> Option<Verdict> {
        let entries = self.entries.lock();
        let entry = entries.get(&(action, resource_id.to_string()))?;
        (entry.at.elapsed() < self.ttl).then(|| entry.verdict.clone())
    }

    /// Records a verdict (the self-check's, or a real call's
    /// `UnauthorizedOperation`).
    pub(crate) fn record(&self, action: Action, resource_id: &str, verdict: Verdict) {
        self.entries.lock().insert(
            (action, resource_id.to_string()),
            Entry {
                verdict,
                at: Instant::now(),
            },
        );
    }

    /// Marks a write denied because AWS answered a real call with
    /// `UnauthorizedOperation`; the next check after the TTL asks again.
    pub(crate) fn record_denied(
        &self,
        action: Action,
        resource_id: &str,
        tagging: Tagging,
    ) -> Denial {
        let denial = self.denial(action, resource_id, tagging);
        self.record(
            action,
            resource_id,
            Verdict::Denied(Box::new(denial.clone())),
        );
        denial
    }

    /// A real call's refusal: AWS answered `UnauthorizedOperation` (EC2) or
    /// `AccessDenied` (ELB): [`super::AwsError::is_denied`]. Recorded as denied so the write waits for the
    /// re-check instead of being retried; `None` for any other error.
    pub(crate) fn record_refusal(
        &self,
        error: &super::AwsError,
        action: Action,
        resource_id: &str,
        tagging: Tagging,
    ) -> Option<Denial> {
        error
            .is_denied()
            .then(|| self.record_denied(action, resource_id, tagging))
    }

    /// Whether the write `probe` stands for is allowed: the cached verdict,
    /// else one DryRun. `tagging` is how the resource is tagged now (it goes
    /// into the message of a denial).
    pub(crate) async fn check(&self, aws: &AwsClient, probe: &Probe, tagging: Tagging) -> Verdict {
        let (action, id) = (probe.action(), probe.resource_id());
        if let Some(verdict) = self.cached(action, id) {
            return verdict;
        }
        let verdict = match probe.send(aws).await {
            Ok(DryRun::Allowed) => Verdict::Allowed,
            Ok(DryRun::Denied { .. }) => {
                Verdict::Denied(Box::new(self.denial(action, id, tagging)))
            }
            Err(e) => {
                tracing::warn!(action = %action, resource = id, error = %e, "could not check the permission with DryRun; the write goes ahead");
                if e.class().is_retryable() {
                    // Not cached: the next write asks again.
                    return Verdict::Unknown;
                }
                Verdict::Unknown
            }
        };
        self.record(action, id, verdict.clone());
        verdict
    }
}

#[cfg(test)]
mod tests;
