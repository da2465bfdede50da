//! Everything an operator hands the Go aws-cloud-controller-manager is
//! accepted here and named in the reference: every flag (docs/flags.md),
//! every cloud.conf key (docs/cloud-config.md) and every annotation
//! (docs/annotations.md), so existing arguments, cloud.conf and Services
//! keep working after the swap.
//!
//! The lists are `tests/data/upstream-*.json`, read from the Go sources by
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

fn doc(page: &str) -> String {
    let path = format!("{}/../../docs/{page}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(serde::Deserialize)]
struct UpstreamKey {
    section: String,
    key: String,
    #[serde(rename = "type")]
    kind: String,
    source: String,
}

fn data<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A valid value for each upstream cloud.conf key.
fn key_sample(key: &UpstreamKey) -> &'static str {
    match key.key.as_str() {
        "Zone" => "us-east-1a",
        "Region" | "SigningRegion" => "us-east-1",
        "VPC" => "vpc-0123456789abcdef0",
        "SubnetID" => "subnet-0123456789abcdef0",
        "RouteTableID" => "rtb-0123456789abcdef0",
        "RoleARN" => "arn:aws:iam::123456789012:role/ccm",
        "SourceARN" => "arn:aws:iam::123456789012:role/source",
        "KubernetesClusterTag" | "KubernetesClusterID" => "prod",
        "ElbSecurityGroup" => "sg-0123456789abcdef0",
        "NodeIPFamilies" => "ipv4",
        "ClusterServiceLoadBalancerHealthProbeMode" => "ServiceNodePort",
        "ClusterServiceSharedLoadBalancerHealthProbePath" => "/healthz",
        "SupportedTopologyInstanceTypePattern" => "^p[0-9]+",
        "NLBSecurityGroupMode" => "Managed",
        "Service" => "ec2",
        "URL" => "https://ec2.us-east-1.amazonaws.com",
        "SigningMethod" => "v4",
        "SigningName" => "ec2",
        _ => match key.kind.as_str() {
            "bool" => "false",
            "int32" | "int" => "10256",
            other => panic!("no sample for {} of type {other}", key.key),
        },
    }
}

#[test]
fn every_upstream_cloud_config_key_is_accepted_and_documented() {
    let keys: Vec<UpstreamKey> = data("upstream-cloud-config.json");
    assert!(keys.len() > 20, "the whole config struct");
    let mut text = String::new();
    for section in ["Global", "ServiceOverride"] {
        text.push_str(&match section {
            "Global" => "[Global]\n".to_owned(),
            _ => "[ServiceOverride \"1\"]\n".to_owned(),
        });
        for key in keys.iter().filter(|k| k.section == section) {
            text.push_str(&format!("{} = {}\n", key.key, key_sample(key)));
        }
    }
    let (_, warnings) = aws_ccm::cloud_config::CloudConfig::parse_with_warnings(
        &text,
        std::path::Path::new("upstream.conf"),
    )
    .unwrap_or_else(|e| panic!("upstream keys with valid values are refused: {e}\n{text}"));
    let unknown: Vec<String> = warnings.iter().map(|w| w.to_string()).collect();
    assert!(
        unknown.is_empty(),
        "upstream keys treated as unknown:\n{}",
        unknown.join("\n")
    );

    let page = doc("cloud-config.md");
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| !page.contains(&format!("`{}`", k.key)))
        .map(|k| format!("[{}] {} ({})", k.section, k.key, k.source))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/cloud-config.md does not name these upstream keys:\n{}",
        missing.join("\n")
    );
}

#[derive(serde::Deserialize)]
struct UpstreamAnnotation {
    annotation: String,
    source: String,
}

#[test]
fn every_upstream_annotation_is_in_the_reference() {
    let upstream: Vec<UpstreamAnnotation> = data("upstream-annotations.json");
    assert!(upstream.len() >= 30, "every annotation the Go CCM names");
    // docs/annotations.md is generated from the annotation table the
    // service controller parses with (a unit test keeps them equal).
    let page = doc("annotations.md");
    let missing: Vec<String> = upstream
        .iter()
        .filter(|a| !page.contains(&format!("`{}`", a.annotation)))
        .map(|a| format!("{} ({})", a.annotation, a.source))
        .collect();
    assert!(
        missing.is_empty(),
        "annotations the Go CCM reads and this one does not:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_upstream_flag_is_documented() {
    let doc = doc("flags.md");
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

/// docs/compatibility.md has one row per upstream flag, cloud.conf key and
/// annotation, each with a verdict a user can act on (the section is
/// generated by scripts/gen-compatibility-names.py).
#[test]
fn every_upstream_name_has_a_compatibility_row() {
    let page = doc("compatibility.md");
    let section = page
        .split("<!-- upstream-names:begin -->")
        .nth(1)
        .and_then(|s| s.split("<!-- upstream-names:end -->").next())
        .expect("docs/compatibility.md has the upstream-names section");
    let verdict_of = |name: &str| -> Option<String> {
        section
            .lines()
            .find(|l| l.contains(&format!("| `{name}` |")))
            .and_then(|l| l.trim_end_matches('|').rsplit('|').next())
            .map(|v| v.trim().to_string())
    };
    let mut names: Vec<String> = upstream()
        .into_iter()
        .map(|f| format!("--{}", f.flag))
        .collect();
    let keys: Vec<UpstreamKey> = data("upstream-cloud-config.json");
    names.extend(keys.into_iter().map(|k| k.key));
    let annotations: Vec<UpstreamAnnotation> = data("upstream-annotations.json");
    names.extend(annotations.into_iter().map(|a| a.annotation));
    let bad: Vec<String> = names
        .iter()
        .filter_map(|name| match verdict_of(name) {
            None => Some(format!("{name}: no row")),
            Some(v)
                if v.starts_with("same")
                    || v.starts_with("accepted and ignored: ")
                    || v.starts_with("differs") && v.len() > "differs: ".len() =>
            {
                None
            }
            Some(v) => Some(format!("{name}: verdict {v:?}")),
        })
        .collect();
    assert!(
        bad.is_empty(),
        "docs/compatibility.md (run scripts/gen-compatibility-names.py):\n{}",
        bad.join("\n")
    );
}
