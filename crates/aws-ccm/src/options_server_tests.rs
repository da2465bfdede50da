//! The HTTPS endpoint's flags: `--authentication-*`, `--authorization-*`,
//! `--tls-min-version`, `--tls-cipher-suites`; and the logging and webhook
//! flags of k8s.io/component-base and k8s.io/cloud-provider.

use std::path::PathBuf;
use std::time::Duration;

use super::LogFormat;
use crate::server::TlsPolicy;

use super::tests::parse;

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
    assert!(!v.tls.http1_only, "HTTP/2 is served unless turned off");
    let v = parse(&["--cloud-provider=aws", "--disable-http2-serving"]).unwrap();
    assert!(v.tls.http1_only && v.ignored_flags.is_empty());
    let v = parse(&["--cloud-provider=aws", "--disable-http2-serving=false"]).unwrap();
    assert!(!v.tls.http1_only);
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

#[test]
fn logging_format_is_upstreams_name_for_log_format() {
    let v = parse(&["--cloud-provider=aws", "--logging-format=json"]).unwrap();
    assert_eq!(v.options.log_format, LogFormat::Json);
    let v = parse(&["--cloud-provider=aws", "--logging-format", "text"]).unwrap();
    assert_eq!(v.options.log_format, LogFormat::Text);
    let v = parse(&["--cloud-provider=aws", "--log-format=json"]).unwrap();
    assert_eq!(v.options.log_format, LogFormat::Json);
    let err = parse(&["--cloud-provider=aws", "--logging-format=xml"]).unwrap_err();
    assert!(err.contains("xml"), "{err}");
}

#[test]
fn logging_stream_and_webhook_flags_are_accepted_and_reported_as_ignored() {
    let v = parse(&[
        "--cloud-provider=aws",
        "--log-text-split-stream",
        "--log-text-info-buffer-size=4Ki",
        "--log-json-split-stream=true",
        "--log-json-info-buffer-size",
        "1M",
        "--webhooks=*",
        "--webhook-bind-address",
        "0.0.0.0",
        "--webhook-secure-port=10260",
        "--webhook-disable-http2-serving",
        "--webhook-cert-dir=/var/run/webhook",
        "--webhook-tls-cert-file=/c.pem",
        "--webhook-tls-private-key-file=/k.pem",
        "--webhook-tls-cipher-suites=TLS_AES_128_GCM_SHA256",
        "--webhook-tls-min-version=VersionTLS12",
        "--webhook-tls-sni-cert-key=/c.pem,/k.pem",
        "--v=3",
    ])
    .unwrap();
    assert_eq!(
        v.ignored_flags,
        [
            "log-text-split-stream",
            "log-text-info-buffer-size",
            "log-json-split-stream",
            "log-json-info-buffer-size",
            "webhooks",
            "webhook-bind-address",
            "webhook-secure-port",
            "webhook-disable-http2-serving",
            "webhook-cert-dir",
            "webhook-tls-cert-file",
            "webhook-tls-private-key-file",
            "webhook-tls-cipher-suites",
            "webhook-tls-min-version",
            "webhook-tls-sni-cert-key",
        ]
    );
    // The values were consumed with their flags; the next flag still applies.
    assert_eq!(v.options.verbosity, 3);
}
