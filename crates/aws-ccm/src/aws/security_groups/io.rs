//! Security groups, I/O half: rules to and from the SDK's permissions, and
//! the EC2 calls that read and change groups. Each write says how it ended
//! in the apply's [`Journal`]; what that changes in the shared view is the
//! memory's to decide ([`crate::aws::memory`]).

use std::collections::{BTreeMap, BTreeSet};

use aws_sdk_ec2::types::{IpPermission, IpRange, UserIdGroupPair};
use ipnet::Ipv4Net;

use super::{Rule, SecurityGroup, Source};
use crate::aws::client::AwsClient;
use crate::aws::client::consistency::until_visible;
use crate::aws::client::errors::AwsError;
use crate::aws::client::operations::Operation;
use crate::aws::client::pages::every_page;
use crate::aws::instances::filter;
use crate::aws::memory::{Journal, Write};

/// Flattens SDK permissions into rules (IPv4 CIDRs and groups; other source
/// kinds are not made by this controller and are left alone).
pub(crate) fn rules_from_sdk(perms: &[IpPermission]) -> BTreeSet<Rule> {
    perms
        .iter()
        .flat_map(permission_rules)
        .map(|(rule, _)| rule)
        .collect()
}

/// The rules (CIDR or group sources) that carry a description, with it.
fn described_rules(perms: &[IpPermission]) -> BTreeMap<Rule, String> {
    perms
        .iter()
        .flat_map(permission_rules)
        .filter_map(|(rule, description)| Some((rule, description?.to_string())))
        .collect()
}

/// The rules of one permission (its IPv4 CIDRs, then its groups), each
/// with the description its source carries.
fn permission_rules(p: &IpPermission) -> impl Iterator<Item = (Rule, Option<&str>)> {
    let protocol = p.ip_protocol().unwrap_or("-1").to_ascii_lowercase();
    let (from, to) = if protocol == "-1" {
        (-1, -1)
    } else {
        (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1))
    };
    let cidrs = p.ip_ranges().iter().filter_map(|r| {
        let net: Ipv4Net = r.cidr_ip()?.parse().ok()?;
        Some((Source::Cidr(net), r.description()))
    });
    let groups = p
        .user_id_group_pairs()
        .iter()
        .filter_map(|g| Some((Source::Group(g.group_id()?.to_string()), g.description())));
    cidrs.chain(groups).map(move |(source, description)| {
        let rule = Rule {
            protocol: protocol.clone(),
            from,
            to,
            source,
        };
        (rule, description)
    })
}

/// Authorizes rules with their descriptions (a CIDR's or a source group's).
pub(crate) async fn authorize_described(
    aws: &AwsClient,
    journal: &mut Journal,
    group_id: &str,
    rules: &BTreeMap<Rule, String>,
) -> Result<(), AwsError> {
    if rules.is_empty() {
        return Ok(());
    }
    let perms = rules.iter().map(|(r, d)| permission(r, Some(d))).collect();
    let done = authorize_permissions(aws, group_id, perms).await;
    journal.group_write(group_id, &done, || Write::Authorized {
        group: group_id.to_string(),
        rules: rules.keys().cloned().collect(),
        descriptions: rules.clone(),
    });
    done
}

/// Adds `perms` to the group in one call. `InvalidPermission.Duplicate`
/// rejects the whole call when any one rule already exists (a retried
/// attempt that landed, or another sync adding a shared rule such as the
/// NLB MTU rule at the same time), so then each rule is sent alone and only
/// a rule that exists by itself counts as done: the others are not lost.
async fn authorize_permissions(
    aws: &AwsClient,
    group_id: &str,
    perms: Vec<IpPermission>,
) -> Result<(), AwsError> {
    let send = |perms: Vec<IpPermission>| async move {
        match aws
            .ec2(Operation::Ec2AuthorizeSecurityGroupIngress, |c| {
                c.authorize_security_group_ingress()
                    .group_id(group_id)
                    .set_ip_permissions(Some(perms.clone()))
                    .send()
            })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_already_exists() => Ok(false),
            Err(e) => Err(e),
        }
    };
    let single = perms.len() <= 1;
    if send(perms.clone()).await? || single {
        return Ok(());
    }
    for perm in perms {
        send(vec![perm]).await?;
    }
    Ok(())
}

/// Rules as SDK permissions, one per rule (AWS merges them).
pub(crate) fn rules_to_sdk(rules: &BTreeSet<Rule>) -> Vec<IpPermission> {
    rules.iter().map(|r| permission(r, None)).collect()
}

/// One rule as an SDK permission; its source carries `description`.
fn permission(r: &Rule, description: Option<&String>) -> IpPermission {
    let mut p = IpPermission::builder().ip_protocol(&r.protocol);
    if r.protocol != "-1" {
        p = p.from_port(r.from).to_port(r.to);
    }
    match &r.source {
        Source::Cidr(net) => p.ip_ranges(
            IpRange::builder()
                .cidr_ip(net.to_string())
                .set_description(description.cloned())
                .build(),
        ),
        Source::Group(id) => p.user_id_group_pairs(
            UserIdGroupPair::builder()
                .group_id(id)
                .set_description(description.cloned())
                .build(),
        ),
    }
    .build()
}

fn from_sdk(g: &aws_sdk_ec2::types::SecurityGroup) -> Option<SecurityGroup> {
    Some(SecurityGroup {
        id: g.group_id()?.to_string(),
        name: g.group_name().unwrap_or_default().to_string(),
        vpc_id: g.vpc_id().map(str::to_string),
        tags: crate::aws::tags::from_ec2(g.tags()),
        ingress: rules_from_sdk(g.ip_permissions()),
        descriptions: described_rules(g.ip_permissions()),
        owner_id: g.owner_id().map(str::to_string),
    })
}

/// Security groups matching every filter (paginated).
pub(crate) async fn describe(
    aws: &AwsClient,
    filters: Vec<aws_sdk_ec2::types::Filter>,
) -> Result<Vec<SecurityGroup>, AwsError> {
    let filters = &filters;
    every_page(|token| async move {
        let page = aws
            .ec2(Operation::Ec2DescribeSecurityGroups, |c| {
                c.describe_security_groups()
                    .set_filters(Some(filters.clone()))
                    .set_next_token(token.clone())
                    .max_results(1000)
                    .send()
            })
            .await?;
        let groups: Vec<_> = page.security_groups().iter().filter_map(from_sdk).collect();
        Ok((groups, page.next_token().map(str::to_string)))
    })
    .await
}

/// Every group in `vpc_id` tagged for the cluster (node groups and owned
/// load balancer groups alike): one call serves the whole reconcile.
pub(crate) async fn cluster_groups(
    aws: &AwsClient,
    vpc_id: &str,
    cluster_id: &str,
) -> Result<Vec<SecurityGroup>, AwsError> {
    describe(
        aws,
        vec![
            filter("vpc-id", [vpc_id]),
            filter("tag-key", [crate::aws::tags::cluster_tag_key(cluster_id)]),
        ],
    )
    .await
}

/// Values EC2 takes in one filter; longer lists are split over calls.
const MAX_FILTER_VALUES: usize = 200;

/// Groups matching `fixed` and any of `values` for filter `name`, in as few
/// calls as EC2's per-filter limit allows.
async fn describe_any_of(
    aws: &AwsClient,
    fixed: &[aws_sdk_ec2::types::Filter],
    name: &str,
    values: &[String],
) -> Result<Vec<SecurityGroup>, AwsError> {
    let mut out = Vec::new();
    for chunk in values.chunks(MAX_FILTER_VALUES) {
        let mut filters = fixed.to_vec();
        filters.push(filter(name, chunk.iter().cloned()));
        out.extend(describe(aws, filters).await?);
    }
    Ok(out)
}

/// Groups by ID (those not found are left out).
pub(crate) async fn by_ids(
    aws: &AwsClient,
    ids: &[String],
) -> Result<Vec<SecurityGroup>, AwsError> {
    describe_any_of(aws, &[], "group-id", ids).await
}

/// The groups in `vpc_id` that `refs` point at (an instance's description
/// names its groups), plus those named `extra_names`: one call by name, and
/// one by ID only for a reference without a name. A name with a wildcard
/// character can match more groups than asked for; those are dropped.
pub(crate) async fn by_refs(
    aws: &AwsClient,
    vpc_id: &str,
    refs: &[crate::aws::instances::SecurityGroupRef],
    extra_names: &[String],
) -> Result<Vec<SecurityGroup>, AwsError> {
    let mut names: BTreeSet<String> = extra_names.iter().cloned().collect();
    let mut ids: BTreeSet<&str> = BTreeSet::new();
    let mut unnamed: BTreeSet<String> = BTreeSet::new();
    for r in refs {
        ids.insert(&r.id);
        match r.name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => names.insert(n.to_string()),
            None => unnamed.insert(r.id.to_string()),
        };
    }
    let names: Vec<String> = names.into_iter().collect();
    let unnamed: Vec<String> = unnamed.into_iter().collect();
    let mut found =
        describe_any_of(aws, &[filter("vpc-id", [vpc_id])], "group-name", &names).await?;
    found.extend(by_ids(aws, &unnamed).await?);
    found.retain(|g| ids.contains(g.id.as_str()) || extra_names.contains(&g.name));
    found.sort_by(|a, b| a.id.cmp(&b.id));
    found.dedup_by(|a, b| a.id == b.id);
    Ok(found)
}

/// Groups in `vpc_id` with an ingress rule from group `source`: exactly the
/// groups that admit a classic ELB's group, wherever they are. (EC2 refuses
/// to delete a group that another group's rule still names.)
pub(crate) async fn referencing(
    aws: &AwsClient,
    vpc_id: &str,
    source: &str,
) -> Result<Vec<SecurityGroup>, AwsError> {
    describe(
        aws,
        vec![
            filter("vpc-id", [vpc_id]),
            filter("ip-permission.group-id", [source]),
        ],
    )
    .await
}

pub(crate) async fn create(
    aws: &AwsClient,
    journal: &mut Journal,
    vpc_id: &str,
    name: &str,
    description: &str,
    tags: &BTreeMap<String, String>,
) -> Result<String, AwsError> {
    let tag_spec = aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(aws_sdk_ec2::types::ResourceType::SecurityGroup)
        .set_tags(Some(
            tags.iter()
                .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build())
                .collect(),
        ))
        .build();
    let created = aws
        .ec2(Operation::Ec2CreateSecurityGroup, |c| {
            c.create_security_group()
                .group_name(name)
                .description(description)
                .vpc_id(vpc_id)
                .tag_specifications(tag_spec.clone())
                .send()
        })
        .await;
    match created {
        Ok(out) => {
            let id = out.group_id().unwrap_or_default().to_string();
            journal.push(Write::GroupCreated(SecurityGroup {
                id: id.clone(),
                name: name.to_string(),
                vpc_id: Some(vpc_id.to_string()),
                tags: tags.clone(),
                // No rules yet; the create call does not say the owner.
                ..SecurityGroup::default()
            }));
            Ok(id)
        }
        // The group exists: an attempt whose answer was lost made it, or a
        // sync that read before it was visible. Use it (its rules are
        // read again before the view answers for it).
        Err(e) if e.is_already_exists() => {
            tracing::info!(group = name, vpc = vpc_id, error = %e, "security group exists already; reading it");
            let id = existing_id(aws, vpc_id, name).await?;
            journal.push(Write::GroupUnsure { group: id.clone() });
            Ok(id)
        }
        Err(e) => Err(e),
    }
}

/// The ID of the group named `name` in `vpc_id`, waiting for it to become
/// visible.
async fn existing_id(aws: &AwsClient, vpc_id: &str, name: &str) -> Result<String, AwsError> {
    let what = format!("security group {name} in {vpc_id}");
    until_visible(aws, Operation::Ec2DescribeSecurityGroups, &what, || async {
        let found = describe(
            aws,
            vec![filter("vpc-id", [vpc_id]), filter("group-name", [name])],
        )
        .await?;
        Ok(found.into_iter().find(|g| g.name == name).map(|g| g.id))
    })
    .await
}

pub(crate) async fn authorize(
    aws: &AwsClient,
    journal: &mut Journal,
    group_id: &str,
    rules: &BTreeSet<Rule>,
) -> Result<(), AwsError> {
    if rules.is_empty() {
        return Ok(());
    }
    let done = authorize_permissions(aws, group_id, rules_to_sdk(rules)).await;
    journal.group_write(group_id, &done, || Write::Authorized {
        group: group_id.to_string(),
        rules: rules.clone(),
        descriptions: BTreeMap::new(),
    });
    done
}

pub(crate) async fn revoke(
    aws: &AwsClient,
    journal: &mut Journal,
    group_id: &str,
    rules: &BTreeSet<Rule>,
) -> Result<(), AwsError> {
    revoke_described(aws, journal, group_id, rules, &BTreeMap::new()).await
}

/// [`revoke`], each rule sent with the description `described` has for it.
/// EC2 matches a rule without its description; moto matches a source
/// group's description too, and answers a revoke without it
/// `InvalidPermission.NotFound`: sending it satisfies both.
pub(crate) async fn revoke_described(
    aws: &AwsClient,
    journal: &mut Journal,
    group_id: &str,
    rules: &BTreeSet<Rule>,
    described: &BTreeMap<Rule, String>,
) -> Result<(), AwsError> {
    if rules.is_empty() {
        return Ok(());
    }
    let perms: Vec<IpPermission> = rules
        .iter()
        .map(|r| permission(r, described.get(r)))
        .collect();
    let done = match aws
        .ec2(Operation::Ec2RevokeSecurityGroupIngress, |c| {
            c.revoke_security_group_ingress()
                .group_id(group_id)
                .set_ip_permissions(Some(perms.clone()))
                .send()
        })
        .await
    {
        Err(e) if e.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    };
    journal.group_write(group_id, &done, || Write::Revoked {
        group: group_id.to_string(),
        rules: rules.clone(),
    });
    done
}

pub(crate) async fn delete(
    aws: &AwsClient,
    journal: &mut Journal,
    group_id: &str,
) -> Result<(), AwsError> {
    let done = match aws
        .ec2(Operation::Ec2DeleteSecurityGroup, |c| {
            c.delete_security_group().group_id(group_id).send()
        })
        .await
    {
        Err(e) if e.is_not_found() => Ok(()),
        other => other.map(|_| ()),
    };
    journal.group_write(group_id, &done, || Write::GroupDeleted {
        group: group_id.to_string(),
    });
    done
}
