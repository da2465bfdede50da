//! `aws-fault-proxy`: the AWS throttling and fault proxy as a standalone
//! process, for `make sandbox`, benchmarks and manual experiments. Point the
//! AWS SDK (`AWS_ENDPOINT_URL`) at the address it prints.
//!
//! ```text
//! aws-fault-proxy --upstream http://127.0.0.1:5000 --budget-fraction 1.0 \
//!     --fault DescribeInstances:throttle:0.1 --fault ec2/*:503:0.01
//! ```

use std::io::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use ccm_testkit::aws_proxy::{BucketScope, FaultProxy, FaultRule, ProxyConfig};
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(
    name = "aws-fault-proxy",
    about = "Throttling and fault-injecting proxy between the AWS SDK and moto",
    after_help = "GET /proxy-api/counts returns per-action counts as JSON; POST /proxy-api/reset-counts clears them."
)]
struct Args {
    /// Address to listen on (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,

    /// Upstream AWS endpoint, e.g. moto's http://127.0.0.1:5000.
    #[arg(long)]
    upstream: String,

    /// Enforce AWS's documented request buckets at this fraction of their
    /// size (1.0 = as documented). Omit to enforce nothing.
    #[arg(long)]
    budget_fraction: Option<f64>,

    /// Latency added to every forwarded call, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,

    /// Fault to inject, repeatable: [SERVICE/]ACTION:KIND:PROB[:MAX] where
    /// ACTION is a name or *, KIND is throttle, reset, lost-reset,
    /// lost-stall=MS, 500, 503, html=STATUS (an HTML page, as a proxy answers),
    /// latency=MS or error=STATUS/CODE[/MESSAGE].
    #[arg(long = "fault", value_name = "ACTION:KIND:PROB", value_parser = parse_fault)]
    faults: Vec<FaultRule>,

    /// Seed of the random source that decides which calls a probabilistic
    /// fault hits; the seed in use is printed at start, give it back to
    /// replay a run.
    #[arg(long)]
    seed: Option<u64>,

    /// Eventual consistency: a created security group, load balancer,
    /// target group or listener stays invisible this long (milliseconds).
    #[arg(long, default_value_t = 0)]
    consistency_delay_ms: u64,

    /// Share buckets per throttle category (default) or per action.
    #[arg(long, value_enum, default_value_t = Scope::Category)]
    bucket_scope: Scope,
}

/// Parses a `--fault` spec, showing the whole reason chain (clap would only
/// show the outermost context of an anyhow error).
fn parse_fault(spec: &str) -> Result<FaultRule, String> {
    spec.parse::<FaultRule>().map_err(|err| format!("{err:#}"))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Scope {
    Category,
    Action,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line with the whole cause chain, not a backtrace dump.
            eprintln!("aws-fault-proxy: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();

    let args = Args::parse();
    let config = ProxyConfig {
        budget_fraction: args.budget_fraction,
        latency: Duration::from_millis(args.latency_ms),
        faults: args.faults,
        seed: args.seed,
        consistency_delay: Duration::from_millis(args.consistency_delay_ms),
    };
    let proxy = FaultProxy::start_on(args.listen, &args.upstream, config).await?;
    proxy.set_bucket_scope(match args.bucket_scope {
        Scope::Category => BucketScope::PerCategory,
        Scope::Action => BucketScope::PerAction,
    });

    // Scripts wait for this exact line to learn the port.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "aws-fault-proxy listening on {}", proxy.endpoint())
        .and_then(|()| writeln!(stdout, "aws-fault-proxy seed {}", proxy.seed()))
        .and_then(|()| stdout.flush())
        .context("cannot write the listening address to stdout")?;
    drop(stdout);

    shutdown_signal().await?;
    drop(proxy);
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("cannot listen for Ctrl-C")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
