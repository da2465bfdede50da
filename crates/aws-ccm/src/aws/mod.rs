//! Everything that talks to AWS. Controllers use the traits in `provider`, never
//! an SDK client; every call goes through [`client::AwsClient`], the one door,
//! which [`Aws`] puts beside what the CCM keeps of AWS between reads.

pub mod annotations;
pub mod applied;
pub mod client;
pub mod cloud;
pub mod cluster_id;
pub mod elb;
pub mod instances;
pub mod load_balancers;
pub mod memory;
pub mod nlb;
pub mod ownership;
pub mod permissions;
pub mod routes;
pub mod security_groups;
pub mod subnets;
pub mod tags;

pub use client::errors::{AwsError, ErrorClass};
pub use client::operations::{Category, Operation, Service};
pub use client::{AwsClient, CallOptions, ClientOptions, OptionsError, SdkClients, SdkService};
pub use cloud::{Aws, AwsSettings};
pub use instances::Ec2Instance;
pub use instances::cache::InstanceSettings;
