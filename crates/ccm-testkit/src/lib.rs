//! Test tools owned by this project: a Kubernetes API test server, an AWS
//! throttling/fault proxy, and a moto launcher. They are used by `tests/`,
//! `benches/`, `make sandbox` and their own binaries; the CCM binary never
//! calls them.

pub mod apiserver;
pub mod aws_proxy;
pub mod iam;
pub mod instance_sim;
pub mod moto;
pub mod records;
pub mod tls;

/// A file or directory of this repository (the workspace root), for the
/// tests and tools that read `iam/`, `manifests/` or `docs/`.
pub fn repo_path(relative: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative)
}
