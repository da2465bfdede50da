//! The pure half of the route calls: which filters select the route
//! tables, and how AWS's answers read as the provider's [`RouteTable`]s and
//! [`TargetInstance`]s. No I/O; `io.rs` sends the requests.

use aws_sdk_ec2::types::Filter;
use ipnet::IpNet;

use crate::aws::Ec2Instance;
use crate::aws::instances::filter;
use crate::aws::permissions::Tagging;
use crate::aws::tags::{LEGACY_CLUSTER_TAG, cluster_tag_key};
use crate::provider::routes::{Route, RouteTable, RouteTableSelector, RouteTarget, TargetInstance};

/// The `DescribeRouteTables` filters for `selector`.
pub(crate) fn table_filters(selector: &RouteTableSelector) -> Vec<Filter> {
    match &selector.route_table_id {
        Some(id) => vec![filter("route-table-id", [id.clone()])],
        None => {
            // Either tag marks a cluster table; EC2 ORs the values of one
            // filter, and the legacy tag's value is checked in `parse_table`.
            let keys = [
                cluster_tag_key(&selector.cluster_id),
                LEGACY_CLUSTER_TAG.to_string(),
            ];
            let vpc = (selector.vpc_id.iter()).map(|vpc| filter("vpc-id", [vpc.clone()]));
            std::iter::once(filter("tag-key", keys))
                .chain(vpc)
                .collect()
        }
    }
}

/// A route table as the controller sees it. `None` when it has no ID, or
/// when it was selected by tag and carries neither cluster tag for
/// `selector`'s cluster (the legacy tag's value must match).
pub(crate) fn parse_table(
    table: &aws_sdk_ec2::types::RouteTable,
    selector: &RouteTableSelector,
) -> Option<RouteTable> {
    let id = table.route_table_id()?;
    let tags = || {
        table
            .tags()
            .iter()
            .filter_map(|t| Some((t.key()?, t.value().unwrap_or_default())))
    };
    if selector.route_table_id.is_none() && !selector.matches_tags(tags()) {
        return None;
    }
    Some(RouteTable {
        id: id.to_string(),
        vpc_id: table.vpc_id().map(str::to_string),
        routes: table.routes().iter().map(parse_route).collect(),
        tagging: Tagging::of(&selector.cluster_id, tags()),
        owner_id: table.owner_id().map(str::to_string),
    })
}

/// A route as the controller sees it: destination and target parsed.
fn parse_route(route: &aws_sdk_ec2::types::Route) -> Route {
    let destination = route
        .destination_cidr_block()
        .or(route.destination_ipv6_cidr_block())
        .and_then(|d| d.parse::<IpNet>().ok())
        .map(|d| d.trunc());
    let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_string);
    let target = if let Some(id) = non_empty(route.instance_id()) {
        RouteTarget::Instance(id)
    } else if route.gateway_id() == Some("local") {
        RouteTarget::Local
    } else if let Some(eni) = non_empty(route.network_interface_id()) {
        RouteTarget::NetworkInterface(eni)
    } else if let Some(gw) = [
        route.gateway_id(),
        route.nat_gateway_id(),
        route.transit_gateway_id(),
        route.vpc_peering_connection_id(),
        route.egress_only_internet_gateway_id(),
        route.carrier_gateway_id(),
        route.local_gateway_id(),
        route.core_network_arn(),
    ]
    .into_iter()
    .find_map(non_empty)
    {
        RouteTarget::Gateway(gw)
    } else {
        RouteTarget::None
    };
    Route {
        destination,
        target,
        blackhole: route.state().map(|s| s.as_str()) == Some("blackhole"),
        propagated: route.origin().map(|o| o.as_str()) == Some("EnableVgwRoutePropagation"),
    }
}

/// What the route controller needs to know of an instance of `cluster_id`.
pub(crate) fn target_instance(instance: &Ec2Instance, cluster_id: &str) -> TargetInstance {
    TargetInstance {
        id: instance.id.clone(),
        source_dest_check: instance.source_dest_check,
        terminated: instance.state.is_terminated(),
        tagging: Tagging::of(cluster_id, instance.tags.iter()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sdk_route() -> aws_sdk_ec2::types::builders::RouteBuilder {
        aws_sdk_ec2::types::Route::builder()
    }

    #[test]
    fn sdk_routes_are_parsed_once_at_the_door() {
        use aws_sdk_ec2::types::{RouteOrigin, RouteState};
        let local = parse_route(
            &sdk_route()
                .destination_cidr_block("10.0.0.0/16")
                .gateway_id("local")
                .origin(RouteOrigin::CreateRouteTable)
                .state(RouteState::Active)
                .build(),
        );
        assert_eq!(local.target, RouteTarget::Local);
        assert_eq!(local.destination, Some("10.0.0.0/16".parse().unwrap()));
        let instance = parse_route(
            &sdk_route()
                .destination_ipv6_cidr_block("fd00:10:244::/64")
                .instance_id("i-1")
                .network_interface_id("eni-1")
                .state(RouteState::Blackhole)
                .build(),
        );
        assert_eq!(instance.target, RouteTarget::Instance("i-1".into()));
        assert!(instance.blackhole);
        assert_eq!(
            instance.destination,
            Some("fd00:10:244::/64".parse().unwrap())
        );
        let nat = parse_route(
            &sdk_route()
                .destination_cidr_block("0.0.0.0/0")
                .nat_gateway_id("nat-1")
                .build(),
        );
        assert_eq!(nat.target, RouteTarget::Gateway("nat-1".into()));
        let eni = parse_route(
            &sdk_route()
                .destination_cidr_block("10.9.0.0/24")
                .network_interface_id("eni-9")
                .build(),
        );
        assert_eq!(eni.target, RouteTarget::NetworkInterface("eni-9".into()));
        let gone = parse_route(
            &sdk_route()
                .destination_cidr_block("10.9.1.0/24")
                .state(RouteState::Blackhole)
                .build(),
        );
        assert_eq!((gone.target, gone.blackhole), (RouteTarget::None, true));
        let propagated = parse_route(
            &sdk_route()
                .destination_cidr_block("172.16.0.0/12")
                .gateway_id("vgw-1")
                .origin(RouteOrigin::EnableVgwRoutePropagation)
                .build(),
        );
        assert!(propagated.propagated);
        let prefix_list = parse_route(
            &sdk_route()
                .destination_prefix_list_id("pl-1")
                .gateway_id("vpce-1")
                .build(),
        );
        assert_eq!(prefix_list.destination, None);
    }
}
