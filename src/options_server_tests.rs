//! The HTTPS endpoint's flags: `--authentication-*`, `--authorization-*`,
//! `--tls-min-version`, `--tls-cipher-suites`.

use std::path::PathBuf;
use std::time::Duration;

use super::{Options, Validated};
use crate::server::TlsPolicy;

fn parse(args: &[&str]) -> Result<Validated, String> {
    let mut argv = vec!["aws-cloud-controller-manager"];
    argv.extend_from_slice(args);
    let (opts, ignored) = Options::parse_args(argv).map_err(|e| e.to_string())?;
    opts.validate(ignored).map_err(|e| e.to_string())
}

#[test]
fn auth_and_tls_flags_are_honoured_with_upstream_defaults() {
    let v = parse(&["--cloud-provider=aws"]).unwrap();
    assert_eq!(v.auth.token_ttl, Duration::from_secs(10));
    assert_eq!(v.auth.allow_ttl, Duration::from_secs(10));
    assert_eq!(v.auth.deny_ttl, Duration::from_secs(10));
    for open in ["/healthz", "/readyz", "/livez"] {
        assert!(v.auth.always_allow_paths.matches(open), "{open}");
    }
    assert!(!v.auth.always_allow_paths.matches("/metrics"));
    assert_eq!(v.auth.authentication_kubeconfig, None);
    assert_eq!(v.tls, TlsPolicy::default());
    let v = parse(&[
        "--cloud-provider=aws",
        "--authentication-kubeconfig=/etc/authn.conf",
        "--authorization-kubeconfig=",
        "--authentication-skip-lookup",
        "--authentication-tolerate-lookup-failure=true",
        "--authentication-token-webhook-cache-ttl=1m",
        "--authorization-webhook-cache-authorized-ttl=30s",
        "--authorization-webhook-cache-unauthorized-ttl=0s",
        "--authorization-always-allow-paths=/healthz,/debug/*",
        "--tls-min-version=VersionTLS13",
        "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    ])
    .unwrap();
    assert!(v.ignored_flags.is_empty(), "{:?}", v.ignored_flags);
    assert_eq!(
        v.auth.authentication_kubeconfig,
        Some(PathBuf::from("/etc/authn.conf"))
    );
    assert_eq!(v.auth.authorization_kubeconfig, None);
    assert_eq!(v.auth.token_ttl, Duration::from_secs(60));
    assert_eq!(v.auth.deny_ttl, Duration::ZERO);
    assert!(v.auth.always_allow_paths.matches("/debug/pprof"));
    assert!(!v.auth.always_allow_paths.matches("/readyz"));
    assert!(v.tls.tls13_only);
}

#[test]
fn bad_tls_and_allow_path_values_are_refused_by_name() {
    let err = parse(&["--cloud-provider=aws", "--tls-min-version=VersionTLS11"]).unwrap_err();
    assert!(
        err.contains("--tls-min-version=VersionTLS11")
            && err.contains("VersionTLS12, VersionTLS13"),
        "{err}"
    );
    let err = parse(&[
        "--cloud-provider=aws",
        "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    ])
    .unwrap_err();
    assert!(
        err.contains("TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA") && err.contains("supported:"),
        "{err}"
    );
    let err = parse(&[
        "--cloud-provider=aws",
        "--authorization-always-allow-paths=/a*b",
    ])
    .unwrap_err();
    assert!(err.contains("/a*b") && err.contains("trailing"), "{err}");
}
