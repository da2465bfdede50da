//! What the plugin costs an image pull: start-to-answer time of the binary
//! against moto's ECR, and the binary's size. Prints figures, asserts
//! nothing (`make bench-ecr`; not part of `make test`).
//!
//! Each run is what the kubelet does on a credential-cache miss: spawn the
//! binary, write the request, read the response, wait for the exit. Two
//! cases: a private ECR image (config load, SigV4, one HTTP call to moto on
//! loopback) and a non-ECR image (refused before any call: the floor of
//! process start and request parsing). Real AWS adds its own round trip
//! (tens of ms in-region) and, on a node, the instance profile's IMDS
//! calls, once per run.
//!
//! `make bench-ecr` builds the release binary exactly as the Dockerfile does
//! and hands it over in `ECR_BENCH_BINARY`; this harness itself runs in the
//! dev profile (`cargo bench --profile dev`), so the test tools among the
//! crate's dev-dependencies are not rebuilt with fat LTO for a bench that
//! does not use them. Without `ECR_BENCH_BINARY` it measures the binary
//! cargo built beside it. `ECR_BENCH_RUNS` (default 50) sets the runs per
//! case; `MOTO_SERVER` (else `<repo>/.venv/bin/moto_server`) finds moto.

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary cargo built beside this bench.
const BUILT: &str = env!("CARGO_BIN_EXE_ecr-credential-provider");

fn binary() -> PathBuf {
    std::env::var_os("ECR_BENCH_BINARY").map_or_else(|| PathBuf::from(BUILT), PathBuf::from)
}
const PRIVATE: &str = "123456789012.dkr.ecr.us-west-2.amazonaws.com/app:v1";
const NOT_ECR: &str = "registry.k8s.io/pause:3.10";

/// moto, killed when dropped.
struct MotoProcess(Child);

impl Drop for MotoProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto_server() -> PathBuf {
    std::env::var_os("MOTO_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/moto_server")
        })
}

fn start_moto() -> (MotoProcess, u16) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let server = moto_server();
    let child = Command::new(&server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run make tools or set MOTO_SERVER)",
                server.display()
            )
        });
    let moto = MotoProcess(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "moto did not answer on port {port} within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (moto, port)
}

/// One kubelet-style run; its wall time and whether it answered.
fn run_once(binary: &Path, image: &str, port: u16) -> (Duration, bool) {
    let request = format!(
        r#"{{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"{image}"}}"#
    );
    let started = Instant::now();
    // Refusing other hosts keeps the non-ECR case the floor: start, refuse,
    // exit (by default it would load the SDK's config for the default region).
    let mut child = Command::new(binary)
        .arg("--non-ecr-hosts=refuse")
        .env_clear()
        .env("AWS_ACCESS_KEY_ID", "AKIABENCHEXAMPLE0001")
        .env("AWS_SECRET_ACCESS_KEY", "bench-secret")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
        .env("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the plugin starts");
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(request.as_bytes())
            .expect("request written");
    }
    let output = child.wait_with_output().expect("the plugin exits");
    (started.elapsed(), output.status.success())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn measure(binary: &Path, name: &str, image: &str, expect_answer: bool, runs: usize, port: u16) {
    for _ in 0..3 {
        run_once(binary, image, port); // warm the page cache and moto
    }
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let (took, answered) = run_once(binary, image, port);
        assert_eq!(answered, expect_answer, "{name}: unexpected outcome");
        times.push(took);
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "| {name} | {runs} | {:.1} | {:.1} | {:.1} |",
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.95)),
        ms(times[times.len() - 1]),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to filter.
    let runs: usize = std::env::var("ECR_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(50);
    let (_moto, port) = start_moto();
    let binary = binary();
    let size = std::fs::metadata(&binary)
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()))
        .len();
    println!(
        "ecr-credential-provider start-to-answer ({})",
        binary.display()
    );
    println!(
        "binary size: {size} bytes ({:.1} MiB)",
        size as f64 / 1_048_576.0
    );
    println!();
    println!("| case | runs | p50 ms | p95 ms | max ms |");
    println!("| --- | --- | --- | --- | --- |");
    measure(
        &binary,
        "private ECR image, moto on loopback",
        PRIVATE,
        true,
        runs,
        port,
    );
    measure(
        &binary,
        "non-ECR image, refused before any call",
        NOT_ECR,
        false,
        runs,
        port,
    );
}
