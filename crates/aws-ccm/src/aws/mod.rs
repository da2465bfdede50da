//! Everything that talks to AWS. Controllers use the traits in `provider`, never
//! an SDK client; every call goes through [`client::AwsClient`], the one door,
//! which [`Aws`] puts beside what the CCM keeps of AWS between reads.

pub mod annotations;
pub(crate) mod applied;
pub mod client;
mod cloud;
pub(crate) mod cluster_id;
pub mod elb;
pub mod instances;
pub mod load_balancers;
pub(crate) mod memory;
pub mod nlb;
pub(crate) mod ownership;
pub(crate) mod permissions;
pub mod routes;
pub(crate) mod security_groups;
pub(crate) mod subnets;
pub(crate) mod tags;

pub use client::errors::{AwsError, ErrorClass};
pub use client::operations::{Category, Operation, Service};
pub use client::{AwsClient, CallOptions, ClientOptions, OptionsError, SdkClients, SdkService};
pub use cloud::{Aws, AwsSettings};
pub(crate) use instances::Ec2Instance;
pub use instances::cache::InstanceSettings;
