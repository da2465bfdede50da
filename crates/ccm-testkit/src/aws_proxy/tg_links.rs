//! ELBv2's links from a target group to the load balancers that use it, as
//! AWS keeps them: a group's `LoadBalancerArns` names the load balancers
//! whose listeners (or listener rules) forward to it now, and
//! `DescribeTargetGroups(LoadBalancerArn=X)` lists exactly the groups X's
//! listeners forward to (API reference, `TargetGroup`).
//!
//! moto 5.2.5 keeps a list of its own instead: it adds a load balancer to a
//! group's list when `CreateListener` or `CreateRule` forwards to the group,
//! and never takes one off. After a `ModifyListener` moves a default action
//! from group A to group B, A still names the load balancer (and is listed
//! under it) while B names none and is not; a `DeleteListener` or a
//! `DeleteLoadBalancer` leaves the link too. A product relying on that would
//! find, on moto, a replaced group it would never find again on AWS.
//!
//! So the proxy answers `DescribeTargetGroups` from the listeners: with a
//! `LoadBalancerArn`, it reads that load balancer's listeners (and rules,
//! for HTTP/HTTPS listeners) and lists the groups they forward to, each
//! naming that load balancer alone (AWS lets a target group serve one load
//! balancer); otherwise it lets moto list the groups and gives each the
//! load balancers whose listeners forward to it, read from every load
//! balancer's listeners. A load balancer forwarding to no group gets
//! moto's own answer for an empty listing, `TargetGroupNotFound`.
//!
//! The reads are the proxy's own (not counted, faulted or recorded); when
//! one fails (moto does not know the load balancer, a listing fails) moto
//! answers the call itself.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use http::HeaderMap;

use super::State;
use super::errors::{AwsError, xml_escape};
use super::iam::{Upstream, elements, first, form_escape, param};
use super::throttle::SERVICE_ELBV2;

const VERSION: &str = "Version=2015-12-01";

/// Load balancers whose listeners the full scan reads at once.
const PARALLEL_READS: usize = 8;

/// Whether the proxy answers this call itself.
pub(super) fn wants(service: &str, action: &str) -> bool {
    (service, action) == (SERVICE_ELBV2, "DescribeTargetGroups")
}

/// The answer to a `DescribeTargetGroups` with AWS's links; `None`: let
/// moto answer.
pub(super) async fn answer(
    state: &State,
    headers: &HeaderMap,
    params: &[(String, String)],
) -> Option<Result<String, AwsError>> {
    let upstream = Upstream::for_call(state, headers, SERVICE_ELBV2);
    let filtered_by_name = params
        .iter()
        .any(|(k, _)| k.starts_with("TargetGroupArns.") || k.starts_with("Names."));
    match param(params, "LoadBalancerArn") {
        // Several filters at once: moto's (and AWS's) ValidationError.
        Some(_) if filtered_by_name => None,
        Some(lb) => behind_one(&upstream, lb).await,
        None => relinked_listing(&upstream, params).await.map(Ok),
    }
}

/// The groups `lb`'s listeners forward to, each linked to `lb` alone.
async fn behind_one(upstream: &Upstream<'_>, lb: &str) -> Option<Result<String, AwsError>> {
    let groups = forwarded_to(upstream, lb).await?;
    if groups.is_empty() {
        return Some(Err(AwsError::new(
            400,
            "TargetGroupNotFound",
            "One or more target groups not found",
        )));
    }
    let mut ask = format!("Action=DescribeTargetGroups&{VERSION}");
    for (i, arn) in groups.iter().enumerate() {
        ask.push_str(&format!(
            "&TargetGroupArns.member.{}={}",
            i + 1,
            form_escape(arn)
        ));
    }
    let xml = upstream.ask(ask).await?;
    let only = vec![lb.to_string()];
    Some(Ok(relinked(&xml, |_| only.clone())))
}

/// moto's listing for `params`, each group linked to the load balancers
/// that forward to it now.
async fn relinked_listing(upstream: &Upstream<'_>, params: &[(String, String)]) -> Option<String> {
    let mut ask = format!("Action=DescribeTargetGroups&{VERSION}");
    for (k, v) in params {
        ask.push_str(&format!("&{}={}", form_escape(k), form_escape(v)));
    }
    let xml = upstream.ask(ask).await?;
    if listed_groups(&xml).is_empty() {
        return Some(xml);
    }
    let links = all_links(upstream).await?;
    Some(relinked(&xml, |group| {
        links.get(group).cloned().unwrap_or_default()
    }))
}

/// For each target group some listener forwards to, the load balancers
/// whose listeners do.
async fn all_links(upstream: &Upstream<'_>) -> Option<BTreeMap<String, Vec<String>>> {
    let lbs = all_load_balancers(upstream).await?;
    let forwarded: Vec<(String, BTreeSet<String>)> = stream::iter(lbs)
        .map(|lb| async move {
            // A load balancer gone since the listing forwards to nothing.
            let groups = forwarded_to(upstream, &lb).await.unwrap_or_default();
            (lb, groups)
        })
        .buffer_unordered(PARALLEL_READS)
        .collect()
        .await;
    let mut links: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (lb, groups) in forwarded {
        for g in groups {
            links.entry(g).or_default().push(lb.clone());
        }
    }
    for lbs in links.values_mut() {
        lbs.sort();
    }
    Some(links)
}

/// Every ELBv2 load balancer's ARN, page by page.
async fn all_load_balancers(upstream: &Upstream<'_>) -> Option<Vec<String>> {
    let mut arns = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let mut ask = format!("Action=DescribeLoadBalancers&{VERSION}&PageSize=400");
        if let Some(m) = &marker {
            ask.push_str(&format!("&Marker={}", form_escape(m)));
        }
        let xml = upstream.ask(ask).await?;
        arns.extend(
            members(&xml, "LoadBalancers")
                .into_iter()
                .filter_map(|lb| first(lb, "LoadBalancerArn")),
        );
        marker = first(&xml, "NextMarker").filter(|m| !m.is_empty());
        if marker.is_none() {
            return Some(arns);
        }
    }
}

/// The target groups `lb`'s listeners and their rules forward to; `None`
/// when its listeners cannot be read (moto does not know it).
async fn forwarded_to(upstream: &Upstream<'_>, lb: &str) -> Option<BTreeSet<String>> {
    let xml = upstream
        .ask(format!(
            "Action=DescribeListeners&{VERSION}&LoadBalancerArn={}",
            form_escape(lb)
        ))
        .await?;
    let mut groups = BTreeSet::new();
    for listener in members(&xml, "Listeners") {
        groups.extend(group_arns(listener));
        let protocol = first(listener, "Protocol").unwrap_or_default();
        if !matches!(protocol.as_str(), "HTTP" | "HTTPS") {
            continue;
        }
        let Some(arn) = first(listener, "ListenerArn") else {
            continue;
        };
        let rules = upstream
            .ask(format!(
                "Action=DescribeRules&{VERSION}&ListenerArn={}",
                form_escape(&arn)
            ))
            .await?;
        groups.extend(group_arns(&rules));
    }
    Some(groups)
}

/// The `<member>`s of the first `<list>` in `xml`.
fn members<'a>(xml: &'a str, list: &str) -> Vec<&'a str> {
    elements(xml, list)
        .first()
        .map(|l| elements(l, "member"))
        .unwrap_or_default()
}

/// Every target group ARN an action in `xml` names (`TargetGroupArn`, and
/// each of a `ForwardConfig`'s).
fn group_arns(xml: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = xml;
    while let Some(at) = rest.find("<TargetGroupArn>") {
        let tail = &rest[at..];
        if let Some(arn) = first(tail, "TargetGroupArn") {
            out.insert(arn);
        }
        rest = &tail["<TargetGroupArn>".len()..];
    }
    out
}

/// The ARNs of the groups a `DescribeTargetGroups` answer lists.
fn listed_groups(xml: &str) -> Vec<String> {
    members(xml, "TargetGroups")
        .into_iter()
        .filter_map(|g| first(g, "TargetGroupArn"))
        .collect()
}

/// `xml` (a `DescribeTargetGroups` answer) with each group's
/// `LoadBalancerArns` replaced by `links(group ARN)`.
fn relinked(xml: &str, links: impl Fn(&str) -> Vec<String>) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut copied = 0;
    for group in members(xml, "TargetGroups") {
        let Some(arn) = first(group, "TargetGroupArn") else {
            continue;
        };
        // `group` is a slice of `xml`: its place in it.
        let start = group.as_ptr() as usize - xml.as_ptr() as usize;
        let Some((from, to)) = links_element(group) else {
            continue;
        };
        out.push_str(&xml[copied..start + from]);
        out.push_str(&links_xml(&links(&arn)));
        copied = start + to;
    }
    out.push_str(&xml[copied..]);
    out
}

/// Where a group's `LoadBalancerArns` element is in it: (start, end).
fn links_element(group: &str) -> Option<(usize, usize)> {
    if let Some(from) = group.find("<LoadBalancerArns>") {
        let close = "</LoadBalancerArns>";
        let to = group[from..].find(close)? + from + close.len();
        return Some((from, to));
    }
    let empty = "<LoadBalancerArns/>";
    let from = group.find(empty)?;
    Some((from, from + empty.len()))
}

fn links_xml(lbs: &[String]) -> String {
    if lbs.is_empty() {
        return "<LoadBalancerArns/>".to_string();
    }
    let members: String = lbs
        .iter()
        .map(|lb| format!("<member>{}</member>", xml_escape(lb)))
        .collect();
    format!("<LoadBalancerArns>{members}</LoadBalancerArns>")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(arn: &str, links: &str) -> String {
        format!(
            "<member><TargetGroupArn>{arn}</TargetGroupArn><Port>80</Port>{links}\
             <TargetType>instance</TargetType></member>"
        )
    }

    fn answer(groups: &[String]) -> String {
        format!(
            "<DescribeTargetGroupsResponse><DescribeTargetGroupsResult><TargetGroups>{}\
             </TargetGroups></DescribeTargetGroupsResult></DescribeTargetGroupsResponse>",
            groups.concat()
        )
    }

    #[test]
    fn each_group_gets_the_links_asked_for_and_nothing_else_changes() {
        let moto = answer(&[
            group(
                "arn:tg/old",
                "<LoadBalancerArns><member>arn:lb/x</member></LoadBalancerArns>",
            ),
            group("arn:tg/new", "<LoadBalancerArns/>"),
        ]);
        let fixed = relinked(&moto, |g| match g {
            "arn:tg/new" => vec!["arn:lb/x".to_string()],
            _ => vec![],
        });
        assert_eq!(
            fixed,
            answer(&[
                group("arn:tg/old", "<LoadBalancerArns/>"),
                group(
                    "arn:tg/new",
                    "<LoadBalancerArns><member>arn:lb/x</member></LoadBalancerArns>"
                ),
            ])
        );
        assert_eq!(listed_groups(&fixed), ["arn:tg/old", "arn:tg/new"]);
        // Unchanged links leave the answer as it was.
        let same = relinked(&moto, |g| match g {
            "arn:tg/old" => vec!["arn:lb/x".to_string()],
            _ => vec![],
        });
        assert_eq!(same, moto);
    }

    #[test]
    fn default_actions_forward_configs_and_rules_all_name_groups() {
        let listeners = "<Listeners><member><ListenerArn>arn:l/1</ListenerArn><Protocol>TCP</Protocol>\
             <DefaultActions><member><Type>forward</Type><TargetGroupArn>arn:tg/a</TargetGroupArn>\
             <ForwardConfig><TargetGroups><member><TargetGroupArn>arn:tg/a</TargetGroupArn></member>\
             <member><TargetGroupArn>arn:tg/b</TargetGroupArn></member></TargetGroups></ForwardConfig>\
             </member></DefaultActions></member></Listeners>";
        let found = members(listeners, "Listeners");
        assert_eq!(found.len(), 1);
        assert_eq!(
            group_arns(found[0]).into_iter().collect::<Vec<_>>(),
            ["arn:tg/a", "arn:tg/b"]
        );
        assert!(
            group_arns(
                "<DefaultActions><member><Type>fixed-response</Type></member></DefaultActions>"
            )
            .is_empty()
        );
    }

    #[test]
    fn only_elbv2_target_group_listings_are_answered() {
        assert!(wants(SERVICE_ELBV2, "DescribeTargetGroups"));
        assert!(!wants(SERVICE_ELBV2, "DescribeTargetHealth"));
        assert!(!wants("elasticloadbalancing", "DescribeTargetGroups"));
    }
}
