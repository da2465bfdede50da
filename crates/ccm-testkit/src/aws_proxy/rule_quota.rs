//! EC2's inbound rules per security group quota, at a size a test picks
//! (moto enforces only AWS's default of 60). With a quota of N set
//! ([`super::FaultProxy::set_rules_per_security_group`]), an
//! `AuthorizeSecurityGroupIngress` that would leave the group with more
//! than N inbound rules gets AWS's 400 `RulesPerSecurityGroupLimitExceeded`
//! and changes nothing. AWS counts each CIDR, prefix list and source group
//! of a permission as one rule; a rule the group holds already adds
//! nothing (moto answers it `InvalidPermission.Duplicate`).
//!
//! The proxy reads the group from moto itself; that read is not counted,
//! faulted or recorded. A group moto does not know is left to moto's own
//! answer.

use std::collections::BTreeSet;

use http::HeaderMap;

use super::State;
use super::errors::AwsError;
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_EC2;

/// One flat rule: protocol, from port, to port, source.
type FlatRule = (String, String, String, String);

/// AWS's refusal, when the authorize would take the group over `quota`.
pub(super) async fn refuse(
    state: &State,
    headers: &HeaderMap,
    service: &str,
    action: &str,
    params: &[(String, String)],
) -> Option<AwsError> {
    let quota = (*state.rule_quota.read())?;
    if (service, action) != (SERVICE_EC2, "AuthorizeSecurityGroupIngress") {
        return None;
    }
    let group = param(params, "GroupId")?;
    let xml = Upstream::for_call(state, headers, SERVICE_EC2)
        .ask(format!(
            "Action=DescribeSecurityGroups&Version=2016-11-15&GroupId.1={}",
            form_escape(group)
        ))
        .await?;
    let held = held_rules(&xml)?;
    let after = held.union(&requested(params)).count();
    (after > quota).then(too_many)
}

/// The refusal, in AWS's words.
fn too_many() -> AwsError {
    AwsError::new(
        400,
        "RulesPerSecurityGroupLimitExceeded",
        "The maximum number of rules per security group has been reached.".to_string(),
    )
}

/// The inbound rules of the one group a `DescribeSecurityGroups` answer
/// holds, flat; `None` when it holds none.
fn held_rules(xml: &str) -> Option<BTreeSet<FlatRule>> {
    let info = *elements(xml, "securityGroupInfo").first()?;
    let group = *elements(info, "item").first()?;
    let mut out = BTreeSet::new();
    let Some(perms) = elements(group, "ipPermissions").first().copied() else {
        return Some(out);
    };
    for perm in elements(perms, "item") {
        let protocol = first(perm, "ipProtocol").unwrap_or_default();
        let from = first(perm, "fromPort").unwrap_or_default();
        let to = first(perm, "toPort").unwrap_or_default();
        let mut sources = Vec::new();
        for (list, key) in [
            ("ipRanges", "cidrIp"),
            ("ipv6Ranges", "cidrIpv6"),
            ("groups", "groupId"),
            ("prefixListIds", "prefixListId"),
        ] {
            for l in elements(perm, list) {
                sources.extend(
                    elements(l, "item")
                        .into_iter()
                        .filter_map(|i| first(i, key)),
                );
            }
        }
        for s in sources {
            out.insert((protocol.clone(), from.clone(), to.clone(), s));
        }
    }
    Some(out)
}

/// The flat rules an `AuthorizeSecurityGroupIngress` asks for.
fn requested(params: &[(String, String)]) -> BTreeSet<FlatRule> {
    let value = |name: String| param(params, &name).map(str::to_string);
    let mut out = BTreeSet::new();
    for p in 1.. {
        let at = format!("IpPermissions.{p}");
        let Some(protocol) = value(format!("{at}.IpProtocol")) else {
            break;
        };
        let from = value(format!("{at}.FromPort")).unwrap_or_default();
        let to = value(format!("{at}.ToPort")).unwrap_or_default();
        for (list, key) in [
            ("IpRanges", "CidrIp"),
            ("Ipv6Ranges", "CidrIpv6"),
            ("Groups", "GroupId"),
            ("PrefixListIds", "PrefixListId"),
        ] {
            for i in 1.. {
                let Some(source) = value(format!("{at}.{list}.{i}.{key}")) else {
                    break;
                };
                out.insert((protocol.clone(), from.clone(), to.clone(), source));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aws_proxy::test_params as p;

    const GROUP: &str = "<DescribeSecurityGroupsResponse><securityGroupInfo><item>\
        <groupId>sg-1</groupId><ipPermissions>\
        <item><ipProtocol>tcp</ipProtocol><fromPort>30080</fromPort><toPort>30080</toPort>\
        <groups/><ipRanges><item><cidrIp>0.0.0.0/0</cidrIp><description>d</description></item>\
        <item><cidrIp>10.0.0.0/8</cidrIp></item></ipRanges></item>\
        <item><ipProtocol>-1</ipProtocol><groups><item><groupId>sg-lb</groupId></item></groups>\
        <ipRanges/></item>\
        </ipPermissions><ipPermissionsEgress><item><ipProtocol>-1</ipProtocol>\
        <ipRanges><item><cidrIp>0.0.0.0/0</cidrIp></item></ipRanges></item></ipPermissionsEgress>\
        </item></securityGroupInfo></DescribeSecurityGroupsResponse>";

    #[test]
    fn counts_each_source_of_each_inbound_permission() {
        let held = held_rules(GROUP).unwrap();
        // Two CIDRs and one group inbound; the egress rule does not count.
        assert_eq!(held.len(), 3, "{held:?}");
        assert!(held.contains(&("-1".into(), "".into(), "".into(), "sg-lb".into())));
    }

    #[test]
    fn a_rule_held_already_adds_nothing() {
        let held = held_rules(GROUP).unwrap();
        let asked = requested(&p(&[
            ("GroupId", "sg-1"),
            ("IpPermissions.1.IpProtocol", "tcp"),
            ("IpPermissions.1.FromPort", "30080"),
            ("IpPermissions.1.ToPort", "30080"),
            ("IpPermissions.1.IpRanges.1.CidrIp", "10.0.0.0/8"),
            ("IpPermissions.1.IpRanges.2.CidrIp", "10.1.0.0/16"),
            ("IpPermissions.2.IpProtocol", "-1"),
            ("IpPermissions.2.Groups.1.GroupId", "sg-other"),
        ]));
        assert_eq!(asked.len(), 3);
        assert_eq!(held.union(&asked).count(), 5);
    }

    #[test]
    fn the_refusal_is_awss_code() {
        let e = too_many();
        assert_eq!(
            (e.status, e.code.as_str()),
            (400, "RulesPerSecurityGroupLimitExceeded")
        );
    }
}
