//! ecr-credential-provider: the kubelet's image credential provider for
//! Amazon ECR and ECR Public, a drop-in for kubernetes/cloud-provider-aws's
//! `cmd/ecr-credential-provider`.
//!
//! The kubelet runs it for an image matching the provider's `matchImages`
//! whose credentials it has not cached, writes one `CredentialProviderRequest`
//! on stdin and reads one `CredentialProviderResponse` from stdout. Exit
//! status 0 with a response, or non-zero with the reason on stderr.
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod attempts;
mod aws;
mod install;
mod log;
mod plugin;
mod protocol;
mod registry;
mod secret;
mod token;

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use log::Log;
use plugin::Options;

const USAGE: &str = "\
usage: ecr-credential-provider [flags] < CredentialProviderRequest.json

The kubelet's image credential provider for Amazon ECR and ECR Public.
Reads one CredentialProviderRequest (credentialprovider.kubelet.k8s.io/v1,
v1beta1 or v1alpha1) on stdin, writes the CredentialProviderResponse on stdout.
Positional arguments (kOps passes get-credentials) are ignored, as upstream's are.

flags:
  -v, --v N                  verbosity of stderr lines (0: errors only; 1: what is asked;
                             2: each failed attempt)
  --max-attempts N           attempts per AWS call, retries included (default 5)
  --attempt-timeout DUR      limit of one attempt, e.g. 10s or 500ms (default 10s)
  --operation-timeout DUR    limit of one call, retries included (default 30s)
  --non-ecr-hosts MODE       default-region (default): an image whose host is not ECR's
                             is answered with the default region's private ECR token,
                             as upstream does (registry mirrors backed by an ECR
                             pull-through cache, kOps' useECRCredentialsForMirrors);
                             refuse: it is an error, before any AWS call
  --install-to DIR           copy this binary to DIR/ecr-credential-provider (atomically,
                             mode 0755) and exit: how a DaemonSet with a hostPath puts
                             it on a node from this image, which has no shell or cp
  --version                  print the version and exit
  -h, --help                 print this help and exit

AWS settings come from the SDK's standard sources: the default credentials
chain (instance profile on a node), AWS_ENDPOINT_URL_ECR and friends,
AWS_ECR_ROLE_ARN for service-account-token mode.";

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Run { verbosity: u8, options: Options },
    Help,
    Version,
    InstallTo(String),
}

fn parse_args(args: &[String]) -> Result<Command, String> {
    let mut verbosity = 0;
    let mut options = Options::default();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (arg, None),
        };
        let mut value = || -> Result<String, String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            args.get(i)
                .cloned()
                .ok_or(format!("flag {name} needs a value"))
        };
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "--version" => return Ok(Command::Version),
            "--install-to" => return Ok(Command::InstallTo(value()?)),
            "-v" | "--v" => {
                let text = value()?;
                verbosity = text
                    .parse()
                    .map_err(|_| format!("{name}: {text:?} is not a number"))?;
            }
            "--max-attempts" => {
                let text = value()?;
                options.limits.max_attempts = text.parse().ok().filter(|n| *n >= 1).ok_or(
                    format!("{name}: {text:?} is not a number of attempts (1 or more)"),
                )?;
            }
            "--attempt-timeout" => options.limits.attempt_timeout = duration(name, &value()?)?,
            "--operation-timeout" => options.limits.operation_timeout = duration(name, &value()?)?,
            "--non-ecr-hosts" => {
                options.mirrors = match value()?.as_str() {
                    "refuse" => false,
                    "default-region" => true,
                    other => {
                        return Err(format!(
                            "{name}: {other:?} is neither \"refuse\" nor \"default-region\""
                        ));
                    }
                };
            }
            _ if name.starts_with('-') => {
                return Err(format!("unknown flag {arg:?} (see --help)"));
            }
            // Positional arguments are accepted and ignored, as upstream's
            // command does: kOps passes `get-credentials`.
            _ => {}
        }
        i += 1;
    }
    Ok(Command::Run { verbosity, options })
}

/// `500ms`, `10s` or `2m`: a positive duration.
fn duration(flag: &str, text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().unwrap_or(0);
    let value = match unit {
        "ms" => Duration::from_millis(number),
        "s" => Duration::from_secs(number),
        "m" => Duration::from_secs(number.saturating_mul(60)),
        _ => Duration::ZERO,
    };
    if value.is_zero() {
        return Err(format!(
            "{flag}: {text:?} is not a positive duration such as 500ms, 10s or 2m"
        ));
    }
    Ok(value)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (verbosity, options) = match parse_args(&args) {
        Ok(Command::Run { verbosity, options }) => (verbosity, options),
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::InstallTo(dir)) => {
            return match install::install_to(std::path::Path::new(&dir)) {
                Ok(path) => {
                    println!("installed {}", path.display());
                    ExitCode::SUCCESS
                }
                Err(message) => {
                    Log::default().error(&message);
                    ExitCode::FAILURE
                }
            };
        }
        Ok(Command::Version) => {
            println!("ecr-credential-provider {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            Log::default().error(&message);
            return ExitCode::from(2);
        }
    };
    let log = Log::new(verbosity);
    match run(&options, &log) {
        Ok(json) => {
            let mut stdout = std::io::stdout().lock();
            if let Err(err) = stdout
                .write_all(json.as_bytes())
                .and_then(|()| stdout.flush())
            {
                log.error(&format!("cannot write the response to stdout: {err}"));
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            log.error(&message);
            ExitCode::FAILURE
        }
    }
}

/// The response's JSON, or why there is none.
fn run(options: &Options, log: &Log) -> Result<String, String> {
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| format!("cannot read the request from stdin: {e}"))?;
    let request = protocol::parse_request(&input).map_err(|e| e.to_string())?;
    let env_role = std::env::var(plugin::ROLE_ENV).ok();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let response = runtime
        .block_on(plugin::answer(&request, options, env_role.as_deref(), log))
        .map_err(|e| e.to_string())?;
    log.info(1, &format!("answered for image {:?}", request.image));
    Ok(response.to_json())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_are_read_klog_style() {
        let Ok(Command::Run { verbosity, options }) = parse_args(&args(&[
            "get-credentials",
            "--v=4",
            "--max-attempts",
            "3",
            "--attempt-timeout=500ms",
            "--operation-timeout",
            "2m",
        ])) else {
            panic!("valid flags");
        };
        assert_eq!(verbosity, 4);
        let limits = options.limits;
        assert!(
            options.mirrors,
            "non-ECR hosts answered by default, as upstream"
        );
        assert_eq!(limits.max_attempts, 3);
        assert_eq!(limits.attempt_timeout, Duration::from_millis(500));
        assert_eq!(limits.operation_timeout, Duration::from_secs(120));
        assert_eq!(
            parse_args(&args(&["-v", "2"])).map(|c| matches!(c, Command::Run { verbosity: 2, .. })),
            Ok(true)
        );
        assert_eq!(parse_args(&args(&["--version"])), Ok(Command::Version));
        for (value, mirrors) in [("default-region", true), ("refuse", false)] {
            let Ok(Command::Run { options, .. }) = parse_args(&args(&["--non-ecr-hosts", value]))
            else {
                panic!("valid flags");
            };
            assert_eq!(options.mirrors, mirrors, "{value}");
        }
    }

    #[test]
    fn bad_flags_are_named() {
        for (list, expected) in [
            (&["--nope"][..], "unknown flag \"--nope\""),
            (&["--v=x"][..], "not a number"),
            (&["--max-attempts=0"][..], "1 or more"),
            (&["--attempt-timeout=5h"][..], "not a positive duration"),
            (&["--attempt-timeout=0s"][..], "not a positive duration"),
            (&["--v"][..], "needs a value"),
            (&["--non-ecr-hosts=maybe"][..], "neither"),
        ] {
            let err = parse_args(&args(list)).expect_err("refused");
            assert!(err.contains(expected), "{list:?}: {err}");
        }
    }
}
