//! Cloud-neutral traits and domain types the controllers depend on.
//!
//! Controllers never see `aws::` types or SDK types: they talk to these
//! traits, which `AwsClient` implements for real and in-memory fakes
//! implement for unit tests.

pub mod instances;
pub mod load_balancers;
pub mod routes;
