//! Routes on AWS: the provider's [`crate::provider::routes::Routes`] trait
//! on [`crate::aws::AwsClient`]. `plan.rs` is pure (filters, parsing);
//! `io.rs` sends the calls through the one door.

pub(crate) mod io;
pub mod plan;
