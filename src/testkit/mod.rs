//! Test tools owned by this project: a Kubernetes API test server, an AWS
//! throttling/fault proxy, and a moto launcher. They are used by `tests/`,
//! `benches/`, `make sandbox` and their own binaries; the CCM binary never
//! calls them.

pub mod apiserver;
pub mod aws_proxy;
pub mod iam;
pub mod instance_sim;
pub mod moto;
pub mod tls;
