//! Logging set-up: `--v` (klog verbosity) or `RUST_LOG` choose what is
//! logged, and a cap no setting can lift keeps secrets out of the log.
//!
//! # Why the cap
//!
//! At `trace` the AWS SDK logs whole requests and responses:
//! aws-smithy-runtime's orchestrator logs the request it transmits and the
//! response it receives (`transmitting request`, `received response from
//! service`), aws-sigv4 logs the request it signs with its headers and the
//! string to sign, and aws-config's credential-process provider logs its
//! command unredacted. Those carry the web-identity token sent to STS
//! `AssumeRoleWithWebIdentity`, the secret keys and session tokens STS sends
//! back, and the signed headers of every call. The HTTP and TLS stack under
//! it (hyper, h2, rustls, tower) logs connection and frame details at
//! `debug`/`trace`. At `debug` the SDK crates log only decisions (endpoint
//! chosen, which credentials provider answered, retries, request IDs), read
//! in aws-smithy-runtime 1.16, aws-sigv4 1.6, aws-config 1.13 and
//! aws-runtime 1.10.
//!
//! So whatever `--v` or `RUST_LOG` ask for, the SDK crates are capped at
//! `debug` and the HTTP/TLS crates at `info`. The cap is a separate filter
//! layered after the `--v`/`RUST_LOG` filter: an event must pass both, so no
//! directive in `RUST_LOG` (however specific) can lift it.

use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::options::LogFormat;

/// Target prefixes of the AWS SDK crates (a target matches a prefix when it
/// starts with it: `aws_smithy` covers `aws_smithy_runtime::client::…`).
/// Not `aws_` alone: that would catch this crate (`aws_ccm`) too.
const SDK_TARGETS: &[&str] = &[
    "aws_config",
    "aws_credential_types",
    "aws_runtime",
    "aws_sdk",
    "aws_sigv4",
    "aws_smithy",
    "aws_types",
];

/// The highest level the SDK crates may log at (see the module docs).
const SDK_CAP: LevelFilter = LevelFilter::DEBUG;

/// Target prefixes of the HTTP and TLS crates under the SDK and kube
/// (`hyper` covers `hyper_util` and `hyper_rustls`, `tower` `tower_http`).
const TRANSPORT_TARGETS: &[&str] = &[
    "h2",
    "http",
    "hyper",
    "reqwest",
    "rustls",
    "tokio_rustls",
    "tower",
];

/// The highest level the HTTP/TLS crates may log at.
const TRANSPORT_CAP: LevelFilter = LevelFilter::INFO;

/// The filter `--v` stands for: 0-1 info, 2-3 info plus this crate's debug,
/// 4-5 debug (the SDK's orchestrator and the HTTP stack at info: they
/// would drown the rest), 6 and above trace (the cap still applies on top).
fn verbosity_filter(verbosity: u8) -> &'static str {
    match verbosity {
        0..=1 => "info",
        2..=3 => "info,aws_ccm=debug",
        4..=5 => "debug,hyper=info,h2=info,rustls=info,aws_smithy_runtime=info",
        _ => "trace",
    }
}

/// The cap on the SDK and HTTP/TLS crates; everything else passes (the
/// `--v`/`RUST_LOG` filter decides about it).
fn secret_cap() -> Targets {
    Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(SDK_TARGETS.iter().map(|t| (*t, SDK_CAP)))
        .with_targets(TRANSPORT_TARGETS.iter().map(|t| (*t, TRANSPORT_CAP)))
}

/// Installs the global subscriber: logs to stderr as text or JSON, filtered
/// by `RUST_LOG` when it is set and not empty, else by `--v`, and always
/// under [`secret_cap`].
pub fn init(verbosity: u8, format: LogFormat) {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let filter = match from_env {
        Some(directives) => EnvFilter::try_new(&directives).unwrap_or_else(|err| {
            eprintln!(
                "warning: RUST_LOG={directives:?} is not a valid filter ({err}); using --v={verbosity}"
            );
            EnvFilter::new(verbosity_filter(verbosity))
        }),
        None => EnvFilter::new(verbosity_filter(verbosity)),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let fmt = match format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .boxed(),
        LogFormat::Text => fmt.boxed(),
    };
    // `init` also routes `log` records (rustls uses `log`) through these
    // filters, by their own targets.
    tracing_subscriber::registry()
        .with(filter)
        .with(secret_cap())
        .with(fmt)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn the_cap_stops_what_carries_requests_and_keeps_the_rest() {
        let cap = secret_cap();
        for (target, level) in [
            // "transmitting request" / "received response from service"
            ("aws_smithy_runtime::client::orchestrator", Level::TRACE),
            (
                "aws_smithy_runtime::client::orchestrator::http",
                Level::TRACE,
            ),
            // "signing request" with its headers; the string to sign
            ("aws_sigv4::http_request::sign", Level::TRACE),
            ("aws_config::credential_process", Level::TRACE),
            (
                "aws_sdk_sts::operation::assume_role_with_web_identity",
                Level::TRACE,
            ),
            ("hyper::proto::h1::role", Level::DEBUG),
            ("hyper_util::client::legacy::pool", Level::DEBUG),
            ("h2::codec::framed_write", Level::DEBUG),
            ("rustls::client::hs", Level::DEBUG),
            ("tower_http::trace", Level::DEBUG),
        ] {
            assert!(
                !cap.would_enable(target, &level),
                "{target} at {level} must be capped"
            );
        }
        for (target, level) in [
            ("aws_ccm::aws::client", Level::TRACE),
            ("aws_ccm", Level::TRACE),
            ("kube_runtime::controller", Level::TRACE),
            ("aws_smithy_runtime::client::retries", Level::DEBUG),
            ("aws_config::meta::credentials::chain", Level::DEBUG),
            ("hyper_util::client::legacy::pool", Level::INFO),
            ("rustls::conn", Level::WARN),
        ] {
            assert!(
                cap.would_enable(target, &level),
                "{target} at {level} passes the cap"
            );
        }
    }

    #[test]
    fn verbosity_levels_follow_klog() {
        assert_eq!(verbosity_filter(0), "info");
        assert_eq!(verbosity_filter(2), "info,aws_ccm=debug");
        assert!(verbosity_filter(4).starts_with("debug,"));
        assert_eq!(verbosity_filter(6), "trace");
        assert_eq!(verbosity_filter(10), "trace");
    }
}
