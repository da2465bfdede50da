//! Cloud-neutral traits and domain types the controllers depend on.
//!
//! Controllers never see `aws::` types or SDK types: they talk to these
//! traits, which `aws/` implements for real (`aws::Aws` for instances and
//! routes, `aws::load_balancers::AwsLoadBalancers`) and in-memory fakes
//! implement for unit tests. Dependencies run one way: `aws/` imports from
//! here; the `crate::aws` lines left here say why at the top of their file.
//! Every trait fails with the one [`CloudError`] (see [`error`]).

mod error;
pub mod instances;
pub mod load_balancers;
pub(crate) mod permissions;
pub mod routes;

pub(crate) use error::{CloudError, CloudResult, ErrorKind};

/// Everything the controllers need of a cloud, as one type the wiring hands
/// them: its instances, routes and permission check, and the load balancers
/// the service controller syncs. The manager wires AWS (`aws::Aws`); the
/// controllers are generic over it and see only these traits.
pub trait Cloud:
    instances::Instances + routes::Routes + permissions::PermissionCheck + Clone + Send + Sync + 'static
{
    type LoadBalancers: load_balancers::LoadBalancers;
}
