//! `aws-cloud-controller-manager`: flags -> config -> manager::run.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

use std::process::ExitCode;

use aws_ccm::options::Options;

fn main() -> ExitCode {
    let (options, ignored) = match Options::parse_args(std::env::args()) {
        Ok(parsed) => parsed,
        // clap prints help/version/usage errors itself and picks the exit code.
        Err(e) => e.exit(),
    };
    let validated = match options.validate(ignored) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    aws_ccm::logging::init(validated.options.verbosity, validated.options.log_format);
    // kube, the health server and the AWS SDK all use rustls; pick its
    // provider once so none of them has to guess.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();

    tune_malloc();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(aws_ccm::manager::run(validated)) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runtime worker threads: one per core up to [`MAX_WORKERS`]. The CCM
/// waits on the network almost all the time; tokio's default of one thread
/// per core gives a 64-core node 64 threads (and, with glibc, up to 64 malloc
/// arenas) for no throughput.
fn worker_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(MAX_WORKERS)
}

const MAX_WORKERS: usize = 4;

/// glibc's defaults suit short programs, not a daemon that rebuilds
/// multi-megabyte caches every period; measured in the scale benchmark
/// (docs/scale.md). Each setting is skipped when its own environment
/// variable is set, so an operator's choice wins. Must run before any
/// thread starts.
/// - Arenas: glibc gives each thread that contends for the heap its own
///   arena (up to 8 per core), and memory freed in one arena is not reused
///   by another. One arena serves a few workers.
/// - mmap threshold: glibc raises it to the size of each large block freed
///   (up to 32 MB), after which buffers such as a 2 MB page body come from
///   the heap and their pages stay with the process. Fixing it at the
///   default 128 KiB keeps every large buffer in its own mapping, returned
///   when freed (and stops the trim threshold rising with it).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn tune_malloc() {
    for (variable, parameter, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, MALLOC_ARENAS),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 128 * 1024),
    ] {
        if std::env::var_os(variable).is_some() {
            continue;
        }
        // SAFETY: mallopt only sets allocator parameters; it is called
        // before any other thread exists, so nothing allocates concurrently.
        unsafe {
            libc::mallopt(parameter, value);
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: libc::c_int = 1;

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn tune_malloc() {}
