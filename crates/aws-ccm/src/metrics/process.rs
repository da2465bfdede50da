//! The metrics every Go component serves without asking, under the Go
//! names dashboards for the Go CCM query: the process collector of
//! client_golang (`process_*`, read from `/proc/self` at each scrape, as it
//! reads them) and component-base's `kubernetes_build_info` (a constant 1,
//! labelled with this build).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// `process_*` and `kubernetes_build_info`, computed at each scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// What `/proc/self/stat` and friends say now.
#[derive(Clone, Debug, Default, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time_seconds: f64,
    open_fds: f64,
    max_fds: f64,
}

impl ProcessStats {
    /// `None` off Linux, or when `/proc` cannot be read.
    pub(super) fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let boot_time = std::fs::read_to_string("/proc/stat").ok()?;
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
        // SAFETY: sysconf only reads configuration values.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        parse(
            &stat,
            &boot_time,
            &limits,
            open_fds,
            ticks as f64,
            page as f64,
        )
    }
}

/// The pure half of [`ProcessStats::read`].
fn parse(
    stat: &str,
    proc_stat: &str,
    limits: &str,
    open_fds: usize,
    ticks: f64,
    page: f64,
) -> Option<ProcessStats> {
    // Fields after the command name, which is in parentheses and may hold
    // spaces: field 3 (state) is the first.
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Option<f64> { f.get(n - 3)?.parse().ok() };
    let boot = proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse::<f64>()
        .ok()?;
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Some(ProcessStats {
        cpu_seconds: (field(14)? + field(15)?) / ticks,
        start_time_seconds: boot + field(22)? / ticks,
        virtual_bytes: field(23)?,
        resident_bytes: field(24)? * page,
        open_fds: open_fds as f64,
        max_fds,
    })
}

impl Collector for ProcessCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        build_info(&mut e)?;
        let Some(s) = ProcessStats::read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        let m = e.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(m)?;
        for (name, help, value) in [
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                s.start_time_seconds,
            ),
        ] {
            let g = ConstGauge::new(value);
            g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

/// component-base's labels: major, minor, git_version, git_commit,
/// git_tree_state, build_date, go_version, compiler, platform. This build
/// answers what it knows: its version, the Rust compiler in place of Go's.
fn build_info(e: &mut DescriptorEncoder) -> std::fmt::Result {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    let labels: [(&str, String); 9] = [
        ("major", parts.next().unwrap_or_default().to_string()),
        ("minor", parts.next().unwrap_or_default().to_string()),
        ("git_version", format!("v{version}")),
        (
            "git_commit",
            option_env!("AWS_CCM_GIT_COMMIT").unwrap_or("").to_string(),
        ),
        ("git_tree_state", String::new()),
        ("build_date", String::new()),
        ("go_version", String::new()),
        ("compiler", "rustc".to_string()),
        (
            "platform",
            format!("{}/{}", std::env::consts::OS, go_arch()),
        ),
    ];
    let g = ConstGauge::new(1i64);
    let mut m = e.encode_descriptor(
        "kubernetes_build_info",
        "A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
        None,
        g.metric_type(),
    )?;
    let labels: Vec<(&str, &str)> = labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    g.encode(m.encode_family(&labels)?)
}

/// Go's name for the architecture (`amd64`, `arm64`), as in `platform`.
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_a_command_with_spaces() {
        let stat = "4242 (aws ccm) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 7 0 1000 104857600 2560 18446744073709551615";
        let s = parse(stat, "cpu 1 2 3\nbtime 1700000000\n", "Limit Soft Hard Units\nMax open files            1048576              1048576              files\n", 12, 100.0, 4096.0).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
        assert_eq!(s.virtual_bytes, 104_857_600.0);
        assert_eq!(s.resident_bytes, 2560.0 * 4096.0);
        assert_eq!((s.open_fds, s.max_fds), (12.0, 1_048_576.0));
    }

    #[test]
    fn this_process_is_read_and_served_under_the_go_names() {
        let s = ProcessStats::read().expect("/proc is readable on Linux");
        assert!(s.resident_bytes > 0.0 && s.open_fds > 0.0 && s.start_time_seconds > 1.6e9);
        super::super::register_process_collector();
        let text = super::super::encode();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
            "kubernetes_build_info{major=\"0\",minor=\"1\",git_version=\"v0.1.0\"",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
