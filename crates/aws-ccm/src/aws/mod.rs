//! Everything that talks to AWS. Controllers use the traits in `provider`, never
//! an SDK client; every call goes through [`client::AwsClient`], the one door.

pub mod annotations;
pub mod api_metrics;
pub mod client;
pub mod clients;
pub mod coalesce;
pub mod describe_xml;
pub mod door;
pub mod elb;
pub mod errors;
pub mod instances;
pub mod nlb;
pub mod operations;
pub mod permissions;
pub mod retry;
pub mod security_groups;
pub mod subnets;
pub mod tags;
#[cfg(test)]
mod test_stub;
pub mod throttle;

pub use client::{AwsClient, CallOptions, ClientOptions, OptionsError, SdkClients, SdkService};
pub use errors::{AwsError, ErrorClass};
pub use instances::Ec2Instance;
pub use operations::{Category, Operation, Service};
