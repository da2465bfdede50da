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
pub mod values;

/// Set by `make unit`: a stand-in server (moto, the API test server, the
/// fault proxy) refuses to start, so a library test that needs one fails
/// there instead of slowing the unit run down unseen; such a test is an
/// integration test and lives under its crate's `tests/`.
pub const NO_SERVERS_ENV: &str = "AWS_CCM_NO_SERVERS";

/// Errors when [`NO_SERVERS_ENV`] is set: `what` would start a server.
pub fn servers_allowed(what: &str) -> anyhow::Result<()> {
    if std::env::var_os(NO_SERVERS_ENV).is_some() {
        anyhow::bail!(
            "{what} started in a unit run ({NO_SERVERS_ENV} is set): a test that needs a server \
             is an integration test; move it under its crate's tests/"
        );
    }
    Ok(())
}

/// A file or directory of this repository (the workspace root), for the
/// tests and tools that read `iam/`, `manifests/` or `docs/`.
///
/// The checkout that runs the test, from the `CARGO_MANIFEST_DIR` cargo gives
/// a test binary (its package, `crates/<name>`), else the one that compiled
/// this crate: two checkouts sharing a target dir (a CI clone and the work
/// tree) share this crate's build, and with it the other's baked-in path.
pub fn repo_path(relative: &str) -> std::path::PathBuf {
    let compiled = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let running = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
    let root = |crate_dir: &std::path::Path| crate_dir.join("../..");
    running
        .map(|dir| root(&dir))
        .filter(|r| r.join("Cargo.toml").is_file() && r.join("crates/ccm-testkit").is_dir())
        .unwrap_or_else(|| root(&compiled))
        .join(relative)
}
