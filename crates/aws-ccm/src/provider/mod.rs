//! Cloud-neutral traits and domain types the controllers depend on.
//!
//! Controllers never see `aws::` types or SDK types: they talk to these
//! traits, which `aws/` implements for real (`aws::Aws` for instances and
//! routes, `aws::load_balancers::AwsLoadBalancers`) and in-memory fakes
//! implement for unit tests. Dependencies run one way: `aws/` imports from
//! here; the `crate::aws` lines left here say why at the top of their file.

pub mod instances;
pub mod load_balancers;
pub mod permissions;
pub mod routes;
