//! `kube-test-server`: the project's Kubernetes API test server as a
//! stand-alone process, for `make sandbox` and manual runs.
//!
//! Prints `kube-test-server listening on http://127.0.0.1:PORT` once it
//! serves, then serves until SIGTERM or SIGINT.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use ccm_testkit::apiserver::{ServerOptions, TestApiServer, TokenUser};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "kube-test-server",
    about = "A Kubernetes API test server on 127.0.0.1 (plain HTTP)"
)]
struct Args {
    /// Port to listen on; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig pointing at the server to this path.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Multi-document YAML of objects to create at start.
    #[arg(long)]
    seed: Option<PathBuf>,
    /// How often watchers get BOOKMARK events, e.g. `1s`, `500ms`, `2` (seconds).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    bookmark_interval: Duration,
    /// Changes kept per resource for watch resumption.
    #[arg(long, default_value_t = 10_000)]
    history_size: usize,
    /// End every open watch this often (clients re-watch), e.g. `5s`.
    #[arg(long, value_parser = parse_duration)]
    watch_drop_every: Option<Duration>,
    /// Compact this often, so watches resumed from before get 410 Gone, e.g. `30s`.
    #[arg(long, value_parser = parse_duration)]
    compact_every: Option<Duration>,
    /// Delay of the watch cache behind writes (watch events and
    /// resourceVersion=0 reads), e.g. `2s`; 0 for none.
    #[arg(long, default_value = "0", value_parser = parse_lag)]
    watch_cache_lag: Duration,
    /// Enforce the RBAC of this YAML (ClusterRoles, Roles, bindings, e.g.
    /// manifests/base/rbac.yaml) on requests carrying a `--token`.
    #[arg(long)]
    rbac: Option<PathBuf>,
    /// `TOKEN=NAMESPACE/NAME`: accept TOKEN as a bearer token for that
    /// service account (repeatable).
    #[arg(long = "service-account-token", value_parser = parse_sa_token)]
    service_account_tokens: Vec<(String, String, String)>,
    /// Record each distinct request of an authenticated user to a file in
    /// this directory (for the RBAC coverage test).
    #[arg(long, env = ccm_testkit::apiserver::rbac::RECORD_KUBE_ENV)]
    record_dir: Option<PathBuf>,
}

/// A duration that may be zero.
fn parse_lag(s: &str) -> anyhow::Result<Duration> {
    if s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic()) == "0" {
        return Ok(Duration::ZERO);
    }
    parse_duration(s)
}

/// `TOKEN=NAMESPACE/NAME`.
fn parse_sa_token(s: &str) -> anyhow::Result<(String, String, String)> {
    let (token, sa) = s
        .split_once('=')
        .with_context(|| format!("{s:?} is not TOKEN=NAMESPACE/NAME"))?;
    let (ns, name) = sa
        .split_once('/')
        .with_context(|| format!("{s:?} is not TOKEN=NAMESPACE/NAME"))?;
    if token.is_empty() || ns.is_empty() || name.is_empty() {
        bail!("{s:?} is not TOKEN=NAMESPACE/NAME: each part must be non-empty");
    }
    Ok((token.into(), ns.into(), name.into()))
}

/// Parses `500ms`, `2s`, `1m` or a bare number of seconds.
fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        other => bail!("unknown duration unit {other:?} in {s:?} (use ms, s or m)"),
    };
    if !secs.is_finite() || secs <= 0.0 {
        bail!("duration {s:?} must be positive");
    }
    Ok(Duration::from_secs_f64(secs))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rbac_policy = match &args.rbac {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the RBAC policy {}", path.display()))?,
        ),
        None => None,
    };
    let server = TestApiServer::start_with(ServerOptions {
        bookmark_interval: args.bookmark_interval,
        history_size: args.history_size,
        port: args.port,
        watch_drop_every: args.watch_drop_every,
        compact_every: args.compact_every,
        watch_cache_lag: args.watch_cache_lag,
        rbac_policy,
        record_dir: args.record_dir.clone(),
    })
    .await?;
    for (token, ns, name) in &args.service_account_tokens {
        server.add_token(token, TokenUser::service_account(ns, name));
    }
    if let Some(seed) = &args.seed {
        let yaml = std::fs::read_to_string(seed)
            .with_context(|| format!("reading seed file {}", seed.display()))?;
        server.seed_yaml(&yaml).await?;
    }
    if let Some(path) = &args.kubeconfig {
        server.write_kubeconfig(path)?;
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "kube-test-server listening on {}", server.url())
            .context("writing to stdout")?;
        out.flush().context("flushing stdout")?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        r = tokio::signal::ctrl_c() => r.context("waiting for SIGINT")?,
    }
    server.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("2").ok(), Some(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m").ok(), Some(Duration::from_secs(60)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5h").is_err());
        assert_eq!(parse_lag("0").ok(), Some(Duration::ZERO));
        assert_eq!(parse_lag("0s").ok(), Some(Duration::ZERO));
        assert_eq!(parse_lag("250ms").ok(), Some(Duration::from_millis(250)));
        assert!(parse_sa_token("t=kube-system/ccm").is_ok());
        assert!(parse_sa_token("t=ccm").is_err());
    }
}
