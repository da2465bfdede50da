//! Every flag the Go aws-cloud-controller-manager registers is accepted by
//! this binary and named in docs/flags.md, so an operator's existing
//! arguments keep working after the swap.
//!
//! The list is `tests/data/upstream-flags.json`, read from the Go sources by
//! `scripts/gen-upstream-flags.py` (module versions in that script). A flag
//! is accepted when `aws-cloud-controller-manager FLAG=VALUE --version`
//! exits 0: clap parses arguments in order, so an unknown flag or a value it
//! rejects fails before `--version` prints.

use std::collections::BTreeSet;
use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_aws-cloud-controller-manager");

#[derive(serde::Deserialize)]
struct UpstreamFlag {
    flag: String,
    #[serde(rename = "type")]
    kind: String,
    source: String,
}

fn upstream() -> Vec<UpstreamFlag> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/upstream-flags.json"
    );
    let text = std::fs::read_to_string(path).expect("upstream-flags.json is readable");
    serde_json::from_str(&text).expect("upstream-flags.json parses")
}

/// A value an operator could really pass: upstream's documented values for
/// flags that take a word from a set, a plain value of the type otherwise.
fn sample(flag: &UpstreamFlag) -> Option<&'static str> {
    let by_name = match flag.flag.as_str() {
        // The terminators themselves.
        "version" | "help" => return None,
        "cloud-provider" => "aws",
        "cloud-config" => "/etc/kubernetes/cloud.conf",
        "tls-min-version" | "webhook-tls-min-version" => "VersionTLS12",
        "tls-cipher-suites" | "webhook-tls-cipher-suites" => {
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
        }
        "tls-curve-preferences" | "webhook-tls-curve-preferences" => "23",
        "tls-sni-cert-key" | "webhook-tls-sni-cert-key" => "/etc/tls/a.crt,/etc/tls/a.key",
        "logging-format" => "text",
        "leader-elect-resource-lock" => "leases",
        "cidr-allocator-type" => "RangeAllocator",
        "kube-api-content-type" => "application/vnd.kubernetes.protobuf",
        "cluster-cidr" => "10.0.0.0/16",
        "controllers" | "webhooks" => "*",
        "feature-gates" => "AllAlpha=false",
        "v" => "2",
        "vmodule" => "service*=4",
        "log-text-info-buffer-size" | "log-json-info-buffer-size" => "0",
        "resources" => "instance",
        "tags" => "team=infra",
        "authorization-always-allow-paths" => "/healthz,/readyz",
        "bind-address" | "webhook-bind-address" => "0.0.0.0",
        _ => "",
    };
    if !by_name.is_empty() {
        return Some(by_name);
    }
    Some(match flag.kind.as_str() {
        "Bool" => "true",
        "Duration" => "1m0s",
        "Int" | "Int32" | "Int64" | "Uint" | "Uint32" => "1",
        "Float32" | "Float64" => "0.5",
        "StringSlice" | "StringArray" => "a,b",
        _ => "/var/lib/aws-ccm/value",
    })
}

#[test]
fn every_upstream_flag_is_accepted() {
    let flags = upstream();
    assert!(flags.len() > 80, "the list is the whole command line");
    let mut refused = Vec::new();
    for flag in &flags {
        let Some(value) = sample(flag) else { continue };
        let out = Command::new(BINARY)
            .arg(format!("--{}={value}", flag.flag))
            .arg("--version")
            .output()
            .expect("the binary runs");
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            refused.push(format!(
                "--{}={value} ({}): {}",
                flag.flag,
                flag.source,
                stderr.lines().next().unwrap_or("")
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "upstream flags this binary refuses:\n{}",
        refused.join("\n")
    );
}

#[test]
fn every_upstream_flag_is_documented() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/flags.md");
    let doc = std::fs::read_to_string(path).expect("docs/flags.md is readable");
    let named: BTreeSet<&str> = doc
        .match_indices("--")
        .map(|(at, _)| {
            let rest = &doc[at + 2..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect();
    let missing: Vec<String> = upstream()
        .into_iter()
        .filter(|f| !named.contains(f.flag.as_str()))
        .map(|f| format!("--{} ({})", f.flag, f.source))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/flags.md does not name these upstream flags:\n{}",
        missing.join("\n")
    );
}
