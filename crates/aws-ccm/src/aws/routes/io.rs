//! The route calls, sent through the one door: `DescribeRouteTables`,
//! the instance lookups, `ModifyInstanceAttribute` and the route writes.
//! What to ask and how to read the answers is in `plan.rs`.

use std::collections::HashMap;

use aws_sdk_ec2::types::AttributeBooleanValue;
use ipnet::IpNet;

use super::plan;
use crate::aws::client::pages::every_page;
use crate::aws::memory::{Applied, Journal, Write};
use crate::aws::permissions::{Probe, Tagging, Verdict};
use crate::aws::{Aws, AwsError, Operation};
use crate::provider::CloudResult;
use crate::provider::routes::{RouteTable, RouteTableSelector, Routes, TargetInstance};

impl Routes for Aws {
    async fn route_tables(&self, selector: &RouteTableSelector) -> CloudResult<Vec<RouteTable>> {
        let filters = &plan::table_filters(selector);
        let mut tables: Vec<RouteTable> = every_page(|next_token| async move {
            let page = self
                .ec2(Operation::Ec2DescribeRouteTables, |ec2| {
                    ec2.describe_route_tables()
                        .set_filters(Some(filters.clone()))
                        .set_next_token(next_token.clone())
                        .send()
                })
                .await?;
            let mut tables = Vec::new();
            for table in page.route_tables() {
                if table.route_table_id().is_some() {
                    self.memory().permissions().learn_account(table.owner_id());
                    tables.extend(plan::parse_table(table, selector));
                }
            }
            Ok::<_, AwsError>((tables, page.next_token().map(str::to_string)))
        })
        .await?;
        tables.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(tables)
    }

    async fn instances(&self, ids: &[String]) -> CloudResult<HashMap<String, TargetInstance>> {
        let cluster_id = self.cluster_id();
        let to_target = |i: &crate::aws::Ec2Instance| plan::target_instance(i, cluster_id);
        // The shared, cached sweep of the cluster's instances answers most
        // lookups without a call of our own.
        let sweep = self.cluster_instances().await?;
        let wanted: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
        let mut found: HashMap<String, TargetInstance> = sweep
            .iter()
            .filter(|i| wanted.contains(i.id.as_str()))
            .map(|i| (i.id.clone(), to_target(i)))
            .collect();
        // Untagged instances, or ones launched after the sweep: single
        // lookups, which the client coalesces into one DescribeInstances.
        let missing: Vec<&String> = ids.iter().filter(|id| !found.contains_key(*id)).collect();
        let lookups = missing.iter().map(|id| self.instance_by_id(id));
        for result in futures::future::join_all(lookups).await {
            match result {
                Ok(instance) => {
                    found.insert(instance.id.clone(), to_target(&instance));
                }
                Err(err) if err.is_not_found() => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(found)
    }

    async fn disable_source_dest_check(&self, instance_id: &str) -> CloudResult<()> {
        let done = self
            .ec2(Operation::Ec2ModifyInstanceAttribute, |ec2| {
                ec2.modify_instance_attribute()
                    .instance_id(instance_id)
                    .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                    .send()
            })
            .await;
        // The cached sweep says "on": the next read must see the change,
        // or what a lost answer may have done.
        let mut journal = Journal::default();
        journal.push(Write::InstanceChanged);
        self.memory().applied(Applied::Writes(journal));
        done?;
        Ok(())
    }

    async fn create_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> CloudResult<()> {
        // The attempt whose answer was lost made this very route.
        done_if_lost(
            self.ec2(Operation::Ec2CreateRoute, |ec2| {
                create_route_request(&ec2, table_id, destination, instance_id).send()
            })
            .await,
        )
    }

    async fn replace_route(
        &self,
        table_id: &str,
        destination: IpNet,
        instance_id: &str,
    ) -> CloudResult<()> {
        self.ec2(Operation::Ec2ReplaceRoute, |ec2| {
            let call = ec2
                .replace_route()
                .route_table_id(table_id)
                .instance_id(instance_id);
            match destination {
                IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
                IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
            }
            .send()
        })
        .await?;
        Ok(())
    }

    async fn delete_route(&self, table_id: &str, destination: IpNet) -> CloudResult<()> {
        // The attempt whose answer was lost removed it.
        done_if_lost(
            self.ec2(Operation::Ec2DeleteRoute, |ec2| {
                delete_route_request(&ec2, table_id, destination).send()
            })
            .await,
        )
    }

    async fn permission(&self, probe: &Probe, tagging: Tagging) -> Verdict {
        self.memory()
            .permissions()
            .check(self, probe, tagging)
            .await
    }
}

/// A route write's outcome: done when it failed only because the answer of
/// an attempt that made the change was lost.
fn done_if_lost<T>(result: Result<T, AwsError>) -> CloudResult<()> {
    match result {
        Err(err) if err.applied_before_answer_lost() => Ok(()),
        other => Ok(other.map(drop)?),
    }
}

/// The `CreateRoute` request for a route to an instance (IPv4 or IPv6
/// destination); the permission check sends the same one with `DryRun`.
pub(crate) fn create_route_request(
    ec2: &aws_sdk_ec2::Client,
    table_id: &str,
    destination: IpNet,
    instance_id: &str,
) -> aws_sdk_ec2::operation::create_route::builders::CreateRouteFluentBuilder {
    let call = ec2
        .create_route()
        .route_table_id(table_id)
        .instance_id(instance_id);
    match destination {
        IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
        IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
    }
}

/// The `DeleteRoute` request for a route (IPv4 or IPv6 destination); the
/// permission check sends the same one with `DryRun`.
pub(crate) fn delete_route_request(
    ec2: &aws_sdk_ec2::Client,
    table_id: &str,
    destination: IpNet,
) -> aws_sdk_ec2::operation::delete_route::builders::DeleteRouteFluentBuilder {
    let call = ec2.delete_route().route_table_id(table_id);
    match destination {
        IpNet::V4(_) => call.destination_cidr_block(destination.to_string()),
        IpNet::V6(_) => call.destination_ipv6_cidr_block(destination.to_string()),
    }
}
