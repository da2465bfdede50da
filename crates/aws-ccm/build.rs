//! Links the optimised binaries as position-dependent executables.
//!
//! A position-independent executable carries a relative relocation for
//! every address in its data (vtables, string tables): about 1 MB of
//! `.rela.dyn` that the loader reads at every start, and 0.7 MB of
//! `.data.rel.ro` that it rewrites, so those pages are private and resident
//! for the process's life. Linked at a fixed address, both are resolved at
//! link time (docs/scale.md, "Where the resident memory is").
//!
//! The Go CCM's release binary is position-dependent too (`CGO_ENABLED=0`,
//! the default build mode). The heap, the stacks, mmaps and shared
//! libraries are still randomised; the binary's own code is not.
//! `AWS_CCM_PIE=1` at build time keeps a position-independent executable.
//! Debug builds (tests) are left as the toolchain makes them.

fn main() {
    println!("cargo:rerun-if-env-changed=AWS_CCM_PIE");
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    // glibc targets only: a musl build links statically, as rustc chooses.
    let linux_gnu = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").is_ok_and(|env| env == "gnu");
    let keep_pie = std::env::var_os("AWS_CCM_PIE").is_some_and(|v| v == "1");
    if release && linux_gnu && !keep_pie {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
