//! Service annotations: one table, parsed into a typed, validated spec.
//!
//! [`ANNOTATIONS`] is the single source of truth for every annotation the
//! service controller reads: its name, value type, default, which load
//! balancer type it applies to, and what it means. The annotation
//! reference (docs/annotations.md) is generated from it ([`readme_section`]) and a test fails when
//! the two drift.
//!
//! [`LoadBalancerSpec::from_service`] turns a Service into a typed spec before
//! any AWS call. Every value that upstream would reject (or silently misuse)
//! becomes a [`SpecError`] naming the annotation, the value and what is
//! allowed; the controller turns it into a Warning event and leaves AWS alone.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Service;

/// Prefix of every AWS load balancer annotation.
pub const PREFIX: &str = "service.beta.kubernetes.io/";

/// Which load balancer types an annotation affects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    Both,
    /// Classic ELB only; rejected on an NLB when upstream rejects it.
    Clb,
    /// NLB only; rejected on a CLB when upstream rejects it.
    Nlb,
}

impl Applies {
    fn as_str(self) -> &'static str {
        match self {
            Applies::Both => "CLB, NLB",
            Applies::Clb => "CLB",
            Applies::Nlb => "NLB",
        }
    }
}

/// One row of the annotation table.
#[derive(Clone, Copy, Debug)]
pub struct AnnotationDef {
    /// Full annotation key.
    pub name: &'static str,
    /// Value type, as documented.
    pub kind: &'static str,
    /// Default when absent (`-` for none).
    pub default: &'static str,
    pub applies: Applies,
    /// Whether a value on the other LB type is rejected (as upstream does) or ignored.
    pub rejected_elsewhere: bool,
    pub meaning: &'static str,
}

macro_rules! key {
    ($suffix:literal) => {
        concat!("service.beta.kubernetes.io/aws-load-balancer-", $suffix)
    };
}

pub const TYPE: &str = key!("type");
pub const INTERNAL: &str = key!("internal");
pub const PROXY_PROTOCOL: &str = key!("proxy-protocol");
pub const ACCESS_LOG_EMIT_INTERVAL: &str = key!("access-log-emit-interval");
pub const ACCESS_LOG_ENABLED: &str = key!("access-log-enabled");
pub const ACCESS_LOG_BUCKET: &str = key!("access-log-s3-bucket-name");
pub const ACCESS_LOG_PREFIX: &str = key!("access-log-s3-bucket-prefix");
pub const DRAINING_ENABLED: &str = key!("connection-draining-enabled");
pub const DRAINING_TIMEOUT: &str = key!("connection-draining-timeout");
pub const IDLE_TIMEOUT: &str = key!("connection-idle-timeout");
pub const CROSS_ZONE: &str = key!("cross-zone-load-balancing-enabled");
pub const EXTRA_SECURITY_GROUPS: &str = key!("extra-security-groups");
pub const SECURITY_GROUPS: &str = key!("security-groups");
pub const SSL_CERT: &str = key!("ssl-cert");
pub const SSL_PORTS: &str = key!("ssl-ports");
pub const SSL_NEGOTIATION_POLICY: &str = key!("ssl-negotiation-policy");
pub const BACKEND_PROTOCOL: &str = key!("backend-protocol");
pub const ADDITIONAL_TAGS: &str = key!("additional-resource-tags");
pub const HC_PROTOCOL: &str = key!("healthcheck-protocol");
pub const HC_PORT: &str = key!("healthcheck-port");
pub const HC_PATH: &str = key!("healthcheck-path");
pub const HC_HEALTHY: &str = key!("healthcheck-healthy-threshold");
pub const HC_UNHEALTHY: &str = key!("healthcheck-unhealthy-threshold");
pub const HC_TIMEOUT: &str = key!("healthcheck-timeout");
pub const HC_INTERVAL: &str = key!("healthcheck-interval");
pub const EIP_ALLOCATIONS: &str = key!("eip-allocations");
pub const PRIVATE_IPV4: &str = key!("private-ipv4-addresses");
pub const TARGET_GROUP_ATTRIBUTES: &str = key!("target-group-attributes");
pub const TARGET_NODE_LABELS: &str = key!("target-node-labels");
pub const SUBNETS: &str = key!("subnets");
pub const IP_ADDRESS_TYPE: &str = key!("ip-address-type");
pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

const fn row(
    name: &'static str,
    kind: &'static str,
    default: &'static str,
    applies: Applies,
    rejected_elsewhere: bool,
    meaning: &'static str,
) -> AnnotationDef {
    AnnotationDef {
        name,
        kind,
        default,
        applies,
        rejected_elsewhere,
        meaning,
    }
}

/// Every annotation the service controller reads.
pub const ANNOTATIONS: &[AnnotationDef] = &[
    row(
        TYPE,
        "`nlb`, `external`, `nlb-ip`",
        "classic ELB",
        Applies::Both,
        false,
        "`nlb` provisions a Network Load Balancer; `external` and `nlb-ip` leave the Service to another controller (AWS Load Balancer Controller). Cannot change once the load balancer exists.",
    ),
    row(
        INTERNAL,
        "string",
        "internet-facing",
        Applies::Both,
        false,
        "Any value but `false` makes the load balancer internal (scheme `internal`). Changing it recreates the load balancer.",
    ),
    row(
        PROXY_PROTOCOL,
        "`*`",
        "-",
        Applies::Clb,
        false,
        "`*` enables proxy protocol v1 on every backend port (policy `k8s-proxyprotocol-enabled`).",
    ),
    row(
        ACCESS_LOG_EMIT_INTERVAL,
        "integer (5 or 60)",
        "60",
        Applies::Clb,
        false,
        "Minutes between access log publications.",
    ),
    row(
        ACCESS_LOG_ENABLED,
        "boolean",
        "false",
        Applies::Both,
        false,
        "Enables access logs.",
    ),
    row(
        ACCESS_LOG_BUCKET,
        "string",
        "-",
        Applies::Both,
        false,
        "S3 bucket for access logs.",
    ),
    row(
        ACCESS_LOG_PREFIX,
        "string",
        "-",
        Applies::Both,
        false,
        "Key prefix for access logs in the bucket.",
    ),
    row(
        DRAINING_ENABLED,
        "boolean",
        "false",
        Applies::Clb,
        false,
        "Enables connection draining.",
    ),
    row(
        DRAINING_TIMEOUT,
        "integer (seconds)",
        "300 (AWS)",
        Applies::Clb,
        false,
        "Connection draining timeout.",
    ),
    row(
        IDLE_TIMEOUT,
        "integer (seconds)",
        "60",
        Applies::Clb,
        false,
        "Idle connection timeout.",
    ),
    row(
        CROSS_ZONE,
        "boolean",
        "false",
        Applies::Both,
        false,
        "Enables cross-zone load balancing.",
    ),
    row(
        EXTRA_SECURITY_GROUPS,
        "comma-separated group IDs",
        "-",
        Applies::Clb,
        true,
        "Groups added to the load balancer besides its own (rejected on an NLB, as upstream).",
    ),
    row(
        SECURITY_GROUPS,
        "comma-separated group IDs",
        "-",
        Applies::Both,
        false,
        "Groups that replace the owned `k8s-elb-<name>` group; the controller does not change their rules.",
    ),
    row(
        SSL_CERT,
        "certificate ARN",
        "-",
        Applies::Both,
        false,
        "Certificate for TLS listeners (SSL/HTTPS on a CLB, TLS on an NLB) on the `ssl-ports`.",
    ),
    row(
        SSL_PORTS,
        "`*` or comma-separated port numbers and names",
        "`*`",
        Applies::Both,
        false,
        "Ports that get the certificate.",
    ),
    row(
        SSL_NEGOTIATION_POLICY,
        "predefined ELB security policy name",
        "AWS default",
        Applies::Both,
        false,
        "Security policy of the TLS listeners (CLB policy `k8s-SSLNegotiationPolicy-<name>`).",
    ),
    row(
        BACKEND_PROTOCOL,
        "`http`, `https`, `ssl`, `tcp`",
        "`tcp`",
        Applies::Both,
        false,
        "Protocol to the backends. With a certificate: `http`/`https` give HTTPS listeners, `ssl`/`tcp` SSL listeners; without one, `http` gives HTTP listeners.",
    ),
    row(
        ADDITIONAL_TAGS,
        "comma-separated `key=value`",
        "-",
        Applies::Both,
        false,
        "Extra tags on the load balancer and its owned security group.",
    ),
    row(
        HC_PROTOCOL,
        "`TCP`, `HTTP`, `HTTPS`, `SSL`",
        "`TCP` (`HTTP` for `externalTrafficPolicy: Local`)",
        Applies::Both,
        false,
        "Health check protocol.",
    ),
    row(
        HC_PORT,
        "`traffic-port` or a port number",
        "`traffic-port` (`healthCheckNodePort` for Local)",
        Applies::Both,
        false,
        "Health check port.",
    ),
    row(
        HC_PATH,
        "string",
        "`/` (`/healthz` for Local)",
        Applies::Both,
        false,
        "Health check path for HTTP/HTTPS checks.",
    ),
    row(
        HC_HEALTHY,
        "integer (2-10)",
        "2 (CLB), 3 (NLB)",
        Applies::Both,
        false,
        "Consecutive successes before a backend is healthy.",
    ),
    row(
        HC_UNHEALTHY,
        "integer (2-10)",
        "6 (CLB), 3 (NLB)",
        Applies::Both,
        false,
        "Consecutive failures before a backend is unhealthy.",
    ),
    row(
        HC_TIMEOUT,
        "integer (seconds, 2-60)",
        "5 (CLB), 10 (NLB)",
        Applies::Both,
        false,
        "Health check timeout; must be less than the interval.",
    ),
    row(
        HC_INTERVAL,
        "integer (seconds, 5-300)",
        "10 (CLB), 30 (NLB)",
        Applies::Both,
        false,
        "Seconds between health checks.",
    ),
    row(
        EIP_ALLOCATIONS,
        "comma-separated allocation IDs",
        "-",
        Applies::Nlb,
        false,
        "Elastic IPs of an internet-facing NLB, one per subnet (ignored on a CLB, as upstream).",
    ),
    row(
        PRIVATE_IPV4,
        "comma-separated IPv4 addresses",
        "-",
        Applies::Nlb,
        false,
        "Private addresses of an internal NLB, one per subnet (ignored on a CLB, as upstream).",
    ),
    row(
        TARGET_GROUP_ATTRIBUTES,
        "comma-separated `key=value`",
        "-",
        Applies::Nlb,
        true,
        "NLB target group attributes `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled` (rejected on a CLB, as upstream).",
    ),
    row(
        IP_ADDRESS_TYPE,
        "`ipv4`, `dualstack`",
        "`ipv4`",
        Applies::Nlb,
        true,
        "`dualstack` gives the NLB IPv4 and IPv6 addresses (its subnets need IPv6 CIDRs). Not in the Go CCM (cloud-provider-aws #1219).",
    ),
    row(
        TARGET_NODE_LABELS,
        "comma-separated `key=value`, `key=` or `key`",
        "all nodes",
        Applies::Both,
        false,
        "Only nodes with all these labels are backends. `key` and `key=` mean \"the label exists, any value\"; `key=value` wants that value. Pairs are trimmed, the text around `=` is not. Same as the Go CCM.",
    ),
    row(
        SUBNETS,
        "comma-separated subnet IDs or Name tags",
        "auto-discovered",
        Applies::Both,
        false,
        "Subnets of the load balancer. Without it: one subnet per zone in the VPC, tagged for this cluster or no cluster, preferring `kubernetes.io/role/elb` (internet-facing) or `kubernetes.io/role/internal-elb` (internal), then the cluster tag, then the lowest ID.",
    ),
    row(
        SOURCE_RANGES,
        "comma-separated IPv4 CIDRs",
        "`0.0.0.0/0`",
        Applies::Both,
        false,
        "Client ranges allowed in; `spec.loadBalancerSourceRanges` takes precedence.",
    ),
];

pub const README_BEGIN: &str = "<!-- annotations:begin -->";
pub const README_END: &str = "<!-- annotations:end -->";

/// The README's annotation reference, generated from [`ANNOTATIONS`].
pub fn readme_section() -> String {
    let mut out = String::new();
    out.push_str(README_BEGIN);
    out.push_str(
        "\n\n| Annotation | Value | Default | Applies to | Meaning |\n|---|---|---|---|---|\n",
    );
    for a in ANNOTATIONS {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            a.name,
            a.kind,
            a.default,
            a.applies.as_str(),
            a.meaning
        ));
    }
    out.push('\n');
    out.push_str(README_END);
    out
}

/// A Service value the controller refuses, with what is allowed instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}={value:?} is invalid: {allowed}")]
pub struct SpecError {
    /// Annotation key or spec field (`spec.ports[1].protocol`).
    pub field: String,
    pub value: String,
    /// What is allowed, and what to do.
    pub allowed: String,
}

fn err(field: &str, value: &str, allowed: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// Which load balancer the Service asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadBalancerKind {
    Classic,
    Network,
    /// `external` / `nlb-ip`: another controller's business.
    External,
}

/// Backend protocol annotation values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendProtocol {
    Http,
    Https,
    Ssl,
    Tcp,
}

impl BackendProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendProtocol::Http => "http",
            BackendProtocol::Https => "https",
            BackendProtocol::Ssl => "ssl",
            BackendProtocol::Tcp => "tcp",
        }
    }
}

/// Ports named by `ssl-ports`; `None` in the spec means every port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSet {
    pub numbers: BTreeSet<i32>,
    pub names: BTreeSet<String>,
}

impl PortSet {
    pub fn contains(&self, port: i32, name: &str) -> bool {
        self.numbers.contains(&port) || self.names.contains(&name.to_ascii_lowercase())
    }
}

/// `healthcheck-port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthCheckPort {
    TrafficPort,
    Port(i32),
}

/// Health check annotations, unresolved (defaults depend on the LB type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthCheckOverrides {
    /// Upper-cased.
    pub protocol: Option<String>,
    pub port: Option<HealthCheckPort>,
    pub path: Option<String>,
    pub healthy_threshold: Option<i32>,
    pub unhealthy_threshold: Option<i32>,
    pub timeout: Option<i32>,
    pub interval: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePortSpec {
    pub name: String,
    pub port: i32,
    pub node_port: i32,
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: String,
}

/// Everything a Service asks of its load balancer, typed and validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadBalancerSpec {
    pub kind: LoadBalancerKind,
    pub internal: bool,
    pub proxy_protocol: bool,
    pub access_log_enabled: bool,
    pub access_log_emit_interval: Option<i32>,
    pub access_log_bucket: Option<String>,
    pub access_log_prefix: Option<String>,
    pub draining_enabled: bool,
    pub draining_timeout: Option<i32>,
    pub idle_timeout: Option<i32>,
    pub cross_zone: bool,
    pub security_groups: Vec<String>,
    pub extra_security_groups: Vec<String>,
    pub ssl_cert: Option<String>,
    /// `None`: every port.
    pub ssl_ports: Option<PortSet>,
    pub ssl_negotiation_policy: Option<String>,
    pub backend_protocol: Option<BackendProtocol>,
    pub additional_tags: BTreeMap<String, String>,
    pub health_check: HealthCheckOverrides,
    pub eip_allocations: Vec<String>,
    pub private_ipv4_addresses: Vec<std::net::Ipv4Addr>,
    pub target_group_attributes: BTreeMap<String, String>,
    /// `ip-address-type: dualstack` (NLB only).
    pub dualstack: bool,
    pub target_node_labels: BTreeMap<String, String>,
    /// `None`: auto-discover.
    pub subnets: Option<Vec<String>>,
    /// Never empty (defaults to `0.0.0.0/0`); sorted, deduplicated.
    pub source_ranges: Vec<Ipv4Net>,
    /// Ports that have a node port (others are skipped, as upstream).
    pub ports: Vec<ServicePortSpec>,
    /// `externalTrafficPolicy: Local` with its `healthCheckNodePort`.
    pub local_health_check_node_port: Option<i32>,
}

/// strconv.ParseBool, which upstream uses.
fn parse_bool(key: &str, v: &str) -> Result<bool, SpecError> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(err(key, v, "allowed: true or false")),
    }
}

fn parse_int(key: &str, v: &str, min: i32, max: i32) -> Result<i32, SpecError> {
    match v.trim().parse::<i32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(err(
            key,
            v,
            format!("allowed: a whole number from {min} to {max}"),
        )),
    }
}

/// Comma-separated list, blanks dropped.
pub fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `k1=v1,k2=,k3` as upstream reads it.
pub fn parse_key_values(v: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for item in v.trim().split(',') {
        let mut parts = item.trim().split('=');
        let key = parts.next().unwrap_or_default();
        if key.is_empty() {
            continue;
        }
        out.insert(
            key.to_string(),
            parts.next().unwrap_or_default().to_string(),
        );
    }
    out
}

/// Whether a Node's labels satisfy a Service's `target-node-labels`, read
/// by [`parse_key_values`], as upstream's `filterTargetNodes` does: every
/// pair must hold; a pair with an empty value (`key` or `key=`) asks only
/// that the label exists, with any value; a pair with a value asks for that
/// exact value. No pairs: every node matches.
pub fn labels_match(labels: &BTreeMap<String, String>, targets: &BTreeMap<String, String>) -> bool {
    targets.iter().all(|(key, want)| {
        labels
            .get(key)
            .is_some_and(|have| want.is_empty() || have == want)
    })
}

fn parse_cidrs(field: &str, values: &[String]) -> Result<Vec<Ipv4Net>, SpecError> {
    let mut out = BTreeSet::new();
    for v in values {
        let net: Ipv4Net = v.trim().parse().map_err(|_| {
            err(
                field,
                v,
                "allowed: IPv4 CIDRs such as 10.0.0.0/8, comma-separated",
            )
        })?;
        out.insert(net.trunc());
    }
    Ok(out.into_iter().collect())
}

impl LoadBalancerSpec {
    /// Parses and validates a Service of type LoadBalancer.
    pub fn from_service(svc: &Service) -> Result<LoadBalancerSpec, SpecError> {
        let empty = BTreeMap::new();
        let a = svc.metadata.annotations.as_ref().unwrap_or(&empty);
        let get = |k: &str| a.get(k).map(String::as_str);
        let spec = svc.spec.clone().unwrap_or_default();

        let kind = match get(TYPE) {
            None | Some("") => LoadBalancerKind::Classic,
            Some("nlb") => LoadBalancerKind::Network,
            Some("external") | Some("nlb-ip") => LoadBalancerKind::External,
            Some(other) => {
                return Err(err(
                    TYPE,
                    other,
                    "allowed: nlb (Network Load Balancer), external or nlb-ip (another controller); remove it for a classic ELB",
                ));
            }
        };
        let is_nlb = kind == LoadBalancerKind::Network;

        // Upstream rejects these on the other type.
        if is_nlb && a.contains_key(EXTRA_SECURITY_GROUPS) {
            return Err(err(
                EXTRA_SECURITY_GROUPS,
                &a[EXTRA_SECURITY_GROUPS],
                "not supported on an NLB; use aws-load-balancer-security-groups or remove it",
            ));
        }
        let mut target_group_attributes = BTreeMap::new();
        if let Some(v) = get(TARGET_GROUP_ATTRIBUTES) {
            if !is_nlb {
                return Err(err(
                    TARGET_GROUP_ATTRIBUTES,
                    v,
                    "only supported on an NLB (aws-load-balancer-type: nlb); remove it for a classic ELB",
                ));
            }
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (k, val) = item.split_once('=').unwrap_or((item, ""));
                let valid_key = matches!(
                    k,
                    "preserve_client_ip.enabled" | "proxy_protocol_v2.enabled"
                );
                if !valid_key || !(val == "true" || val == "false") {
                    return Err(err(
                        TARGET_GROUP_ATTRIBUTES,
                        v,
                        "allowed: preserve_client_ip.enabled=true|false, proxy_protocol_v2.enabled=true|false",
                    ));
                }
                if target_group_attributes
                    .insert(k.to_string(), val.to_string())
                    .is_some()
                {
                    return Err(err(
                        TARGET_GROUP_ATTRIBUTES,
                        v,
                        format!("{k} is set twice; give each attribute once"),
                    ));
                }
            }
        }

        if spec
            .load_balancer_ip
            .as_deref()
            .is_some_and(|ip| !ip.is_empty())
        {
            return Err(err(
                "spec.loadBalancerIP",
                spec.load_balancer_ip.as_deref().unwrap_or_default(),
                "AWS load balancers cannot take a requested IP; remove spec.loadBalancerIP",
            ));
        }
        if let Some(affinity) = spec.session_affinity.as_deref()
            && affinity != "None"
        {
            return Err(err(
                "spec.sessionAffinity",
                affinity,
                "allowed: None (ELB stickiness is not configured through the Service)",
            ));
        }
        let raw_ports = spec.ports.clone().unwrap_or_default();
        if raw_ports.is_empty() {
            return Err(err(
                "spec.ports",
                "",
                "a load balancer needs at least one port",
            ));
        }
        let protocol_of = |p: &k8s_openapi::api::core::v1::ServicePort| {
            p.protocol.clone().unwrap_or_else(|| "TCP".to_string())
        };
        let first = protocol_of(&raw_ports[0]);
        let mut ports = Vec::new();
        for (i, p) in raw_ports.iter().enumerate() {
            let protocol = protocol_of(p);
            // An NLB takes TCP and UDP together (TCP_UDP on a shared port).
            if protocol != first && !is_nlb {
                return Err(err(
                    &format!("spec.ports[{i}].protocol"),
                    &protocol,
                    format!(
                        "mixed protocols are not supported; use {first} for every port or split the Service"
                    ),
                ));
            }
            let ok = protocol == "TCP" || (is_nlb && protocol == "UDP");
            if !ok {
                return Err(err(
                    &format!("spec.ports[{i}].protocol"),
                    &protocol,
                    if is_nlb {
                        "allowed on an NLB: TCP, UDP"
                    } else {
                        "allowed on a classic ELB: TCP (use aws-load-balancer-type: nlb for UDP)"
                    },
                ));
            }
            let node_port = p.node_port.unwrap_or(0);
            if node_port == 0 {
                tracing::warn!(port = p.port, "ignoring a service port without a node port");
                continue;
            }
            ports.push(ServicePortSpec {
                name: p.name.clone().unwrap_or_default(),
                port: p.port,
                node_port,
                protocol,
            });
        }

        let proxy_protocol = match get(PROXY_PROTOCOL) {
            None | Some("") => false,
            Some("*") => true,
            Some(v) => return Err(err(PROXY_PROTOCOL, v, "allowed: * (every backend port)")),
        };
        let opt_bool = |k: &str| -> Result<Option<bool>, SpecError> {
            match get(k) {
                None | Some("") => Ok(None),
                Some(v) => parse_bool(k, v).map(Some),
            }
        };
        let opt_int = |k: &str, min: i32, max: i32| -> Result<Option<i32>, SpecError> {
            match get(k) {
                None | Some("") => Ok(None),
                Some(v) => parse_int(k, v, min, max).map(Some),
            }
        };
        let opt_str = |k: &str| get(k).filter(|v| !v.is_empty()).map(str::to_string);

        let access_log_emit_interval = match get(ACCESS_LOG_EMIT_INTERVAL) {
            None | Some("") => None,
            Some(v) => match v.trim() {
                "5" => Some(5),
                "60" => Some(60),
                _ => {
                    return Err(err(
                        ACCESS_LOG_EMIT_INTERVAL,
                        v,
                        "allowed: 5 or 60 (minutes)",
                    ));
                }
            },
        };
        let backend_protocol = match get(BACKEND_PROTOCOL) {
            None | Some("") => None,
            Some("http") => Some(BackendProtocol::Http),
            Some("https") => Some(BackendProtocol::Https),
            Some("ssl") => Some(BackendProtocol::Ssl),
            Some("tcp") => Some(BackendProtocol::Tcp),
            Some(v) => {
                return Err(err(
                    BACKEND_PROTOCOL,
                    v,
                    "allowed: http, https, ssl, tcp (lower case)",
                ));
            }
        };
        let ssl_ports = match get(SSL_PORTS) {
            None | Some("") | Some("*") => None,
            Some(v) => {
                let mut set = PortSet::default();
                for item in split_list(v) {
                    match item.parse::<i32>() {
                        Ok(n) => set.numbers.insert(n),
                        Err(_) => set.names.insert(item.to_ascii_lowercase()),
                    };
                }
                Some(set)
            }
        };
        let hc_protocol = match get(HC_PROTOCOL) {
            None | Some("") => None,
            Some(v) => {
                let up = v.to_ascii_uppercase();
                let allowed: &[&str] = if is_nlb {
                    &["TCP", "HTTP", "HTTPS"]
                } else {
                    &["TCP", "HTTP", "HTTPS", "SSL"]
                };
                if !allowed.contains(&up.as_str()) {
                    return Err(err(
                        HC_PROTOCOL,
                        v,
                        format!("allowed: {}", allowed.join(", ")),
                    ));
                }
                Some(up)
            }
        };
        let hc_port = match get(HC_PORT) {
            None | Some("") => None,
            Some("traffic-port") => Some(HealthCheckPort::TrafficPort),
            Some(v) => Some(HealthCheckPort::Port(
                parse_int(HC_PORT, v, 1, 65535).map_err(|_| {
                    err(
                        HC_PORT,
                        v,
                        "allowed: traffic-port or a port number from 1 to 65535",
                    )
                })?,
            )),
        };
        let health_check = HealthCheckOverrides {
            protocol: hc_protocol,
            port: hc_port,
            path: opt_str(HC_PATH),
            healthy_threshold: opt_int(HC_HEALTHY, 2, 10)?,
            unhealthy_threshold: opt_int(HC_UNHEALTHY, 2, 10)?,
            timeout: opt_int(HC_TIMEOUT, 2, 120)?,
            interval: opt_int(HC_INTERVAL, 5, 300)?,
        };
        if let (Some(t), Some(i)) = (health_check.timeout, health_check.interval)
            && t >= i
            && !is_nlb
        {
            return Err(err(
                HC_TIMEOUT,
                &t.to_string(),
                format!("must be less than {HC_INTERVAL} ({i})"),
            ));
        }

        let private_ipv4_addresses = match get(PRIVATE_IPV4) {
            None => Vec::new(),
            Some(v) => split_list(v)
                .iter()
                .map(|s| {
                    s.parse().map_err(|_| {
                        err(PRIVATE_IPV4, v, "allowed: IPv4 addresses, comma-separated")
                    })
                })
                .collect::<Result<_, _>>()?,
        };

        // spec.loadBalancerSourceRanges wins over the annotation, as upstream.
        let spec_ranges = spec.load_balancer_source_ranges.clone().unwrap_or_default();
        let source_ranges = if !spec_ranges.is_empty() {
            parse_cidrs("spec.loadBalancerSourceRanges", &spec_ranges)?
        } else {
            match get(SOURCE_RANGES).map(split_list) {
                Some(list) if !list.is_empty() => parse_cidrs(SOURCE_RANGES, &list)?,
                _ => vec![Ipv4Net::default()],
            }
        };

        let subnets = match get(SUBNETS) {
            None => None,
            Some(v) => {
                let list = split_list(v);
                if list.is_empty() {
                    return Err(err(
                        SUBNETS,
                        v,
                        "give subnet IDs or Name tags, comma-separated, or remove it to auto-discover",
                    ));
                }
                Some(list)
            }
        };

        let local_health_check_node_port =
            if spec.external_traffic_policy.as_deref() == Some("Local") {
                spec.health_check_node_port
            } else {
                None
            };

        let dualstack = match get(IP_ADDRESS_TYPE) {
            None | Some("") | Some("ipv4") => false,
            Some("dualstack") if is_nlb => true,
            Some(v) => {
                return Err(err(
                    IP_ADDRESS_TYPE,
                    v,
                    if is_nlb {
                        "allowed: ipv4, dualstack"
                    } else {
                        "only supported on an NLB (aws-load-balancer-type: nlb); remove it for a classic ELB"
                    },
                ));
            }
        };
        if target_group_attributes
            .get("preserve_client_ip.enabled")
            .map(String::as_str)
            == Some("false")
            && ports.iter().any(|p| p.protocol == "UDP")
        {
            return Err(err(
                TARGET_GROUP_ATTRIBUTES,
                get(TARGET_GROUP_ATTRIBUTES).unwrap_or_default(),
                "preserve_client_ip.enabled cannot be false with a UDP port (AWS refuses it); remove it or the UDP port",
            ));
        }

        Ok(LoadBalancerSpec {
            kind,
            // Upstream: "false" is external, any other non-empty value internal.
            internal: get(INTERNAL).is_some_and(|v| !v.is_empty() && v != "false"),
            proxy_protocol,
            access_log_enabled: opt_bool(ACCESS_LOG_ENABLED)?.unwrap_or(false),
            access_log_emit_interval,
            access_log_bucket: opt_str(ACCESS_LOG_BUCKET),
            access_log_prefix: opt_str(ACCESS_LOG_PREFIX),
            draining_enabled: opt_bool(DRAINING_ENABLED)?.unwrap_or(false),
            draining_timeout: opt_int(DRAINING_TIMEOUT, 1, 3600)?,
            idle_timeout: opt_int(IDLE_TIMEOUT, 1, 4000)?,
            cross_zone: opt_bool(CROSS_ZONE)?.unwrap_or(false),
            security_groups: get(SECURITY_GROUPS).map(split_list).unwrap_or_default(),
            extra_security_groups: get(EXTRA_SECURITY_GROUPS)
                .map(split_list)
                .unwrap_or_default(),
            ssl_cert: opt_str(SSL_CERT),
            ssl_ports,
            ssl_negotiation_policy: opt_str(SSL_NEGOTIATION_POLICY),
            backend_protocol,
            additional_tags: get(ADDITIONAL_TAGS)
                .map(parse_key_values)
                .unwrap_or_default(),
            health_check,
            eip_allocations: get(EIP_ALLOCATIONS).map(split_list).unwrap_or_default(),
            private_ipv4_addresses,
            target_group_attributes,
            dualstack,
            target_node_labels: get(TARGET_NODE_LABELS)
                .map(parse_key_values)
                .unwrap_or_default(),
            subnets,
            source_ranges,
            ports,
            local_health_check_node_port,
        })
    }
}

impl fmt::Display for LoadBalancerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LoadBalancerKind::Classic => "classic ELB",
            LoadBalancerKind::Network => "NLB",
            LoadBalancerKind::External => "external",
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    pub fn service(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(port, node_port)| ServicePort {
                            name: Some(format!("p{port}")),
                            port: *port,
                            node_port: Some(*node_port),
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn parse(annotations: &[(&str, &str)]) -> Result<LoadBalancerSpec, SpecError> {
        LoadBalancerSpec::from_service(&service(annotations, &[(80, 30080)]))
    }

    #[test]
    fn table_has_every_upstream_annotation_once() {
        assert_eq!(ANNOTATIONS.len(), 32, "31 AWS annotations + source ranges");
        let names: BTreeSet<_> = ANNOTATIONS.iter().map(|a| a.name).collect();
        assert_eq!(names.len(), ANNOTATIONS.len());
        assert!(ANNOTATIONS.iter().all(|a| a.name.starts_with(PREFIX)));
    }

    #[test]
    fn readme_matches_the_table() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/annotations.md");
        let readme = std::fs::read_to_string(path).expect("docs/annotations.md is readable");
        let begin = readme
            .find(README_BEGIN)
            .expect("docs/annotations.md has the begin marker");
        let end = readme
            .find(README_END)
            .expect("docs/annotations.md has the end marker")
            + README_END.len();
        if std::env::var_os("UPDATE_README").is_some() {
            let updated = format!("{}{}{}", &readme[..begin], readme_section(), &readme[end..]);
            std::fs::write(path, updated).expect("docs/annotations.md is writable");
            return;
        }
        assert_eq!(
            &readme[begin..end],
            readme_section(),
            "docs/annotations.md drifted from crates/aws-ccm/src/aws/annotations.rs; \
             regenerate it with `UPDATE_README=1 cargo test -p aws-ccm --lib readme`"
        );
    }

    #[test]
    fn defaults() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.kind, LoadBalancerKind::Classic);
        assert!(!s.internal && !s.proxy_protocol && !s.cross_zone);
        assert_eq!(s.source_ranges, vec![Ipv4Net::default()]);
        assert_eq!(s.ports.len(), 1);
        assert_eq!(s.subnets, None);
    }

    #[test]
    fn typed_values() {
        let s = parse(&[
            (INTERNAL, "0.0.0.0/0"),
            (PROXY_PROTOCOL, "*"),
            (CROSS_ZONE, "True"),
            (IDLE_TIMEOUT, "120"),
            (SSL_PORTS, "443,HTTPS"),
            (ADDITIONAL_TAGS, "a=1, b=,c"),
            (SOURCE_RANGES, "10.0.0.1/8, 192.168.0.0/16"),
            (HC_PORT, "traffic-port"),
            (SUBNETS, "subnet-1, public-a"),
        ])
        .unwrap();
        assert!(s.internal && s.proxy_protocol && s.cross_zone);
        assert_eq!(s.idle_timeout, Some(120));
        let ports = s.ssl_ports.unwrap();
        assert!(ports.contains(443, "x") && ports.contains(1, "https"));
        assert_eq!(s.additional_tags["a"], "1");
        assert_eq!(s.additional_tags["c"], "");
        assert_eq!(
            s.source_ranges,
            vec![
                "10.0.0.0/8".parse::<Ipv4Net>().unwrap(),
                "192.168.0.0/16".parse().unwrap()
            ]
        );
        assert_eq!(s.health_check.port, Some(HealthCheckPort::TrafficPort));
        assert_eq!(s.subnets.unwrap(), vec!["subnet-1", "public-a"]);
        assert!(!parse(&[(INTERNAL, "false")]).unwrap().internal);
    }

    #[test]
    fn invalid_values_name_annotation_value_and_what_is_allowed() {
        let cases: &[(&str, &str, &str)] = &[
            (SOURCE_RANGES, "10.0.0.0/33", "CIDR"),
            (HC_INTERVAL, "ten", "whole number"),
            (BACKEND_PROTOCOL, "udp", "http, https, ssl, tcp"),
            (HC_PROTOCOL, "ICMP", "TCP"),
            (PROXY_PROTOCOL, "true", "*"),
            (CROSS_ZONE, "yes", "true or false"),
            (TYPE, "alb", "nlb"),
            (
                TARGET_GROUP_ATTRIBUTES,
                "proxy_protocol_v2.enabled=true",
                "only supported on an NLB",
            ),
            (ACCESS_LOG_EMIT_INTERVAL, "10", "5 or 60"),
        ];
        for (key, value, allowed) in cases {
            let e = parse(&[(key, value)]).unwrap_err();
            assert_eq!(e.field, *key);
            assert_eq!(e.value, *value);
            let text = e.to_string();
            assert!(
                text.contains(key) && text.contains(value) && text.contains(allowed),
                "{text}"
            );
        }
        let e = parse(&[(TYPE, "nlb"), (EXTRA_SECURITY_GROUPS, "sg-1")]).unwrap_err();
        assert_eq!(e.field, EXTRA_SECURITY_GROUPS);
    }

    #[test]
    fn spec_fields_are_validated() {
        let mut svc = service(&[], &[(80, 30080)]);
        svc.spec.as_mut().unwrap().load_balancer_ip = Some("1.2.3.4".into());
        assert_eq!(
            LoadBalancerSpec::from_service(&svc).unwrap_err().field,
            "spec.loadBalancerIP"
        );

        let mut svc = service(&[], &[(80, 30080), (53, 30053)]);
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
        let e = LoadBalancerSpec::from_service(&svc).unwrap_err();
        assert!(e.to_string().contains("mixed"), "{e}");

        let mut svc = service(&[], &[(53, 30053)]);
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        let e = LoadBalancerSpec::from_service(&svc).unwrap_err();
        assert!(e.to_string().contains("classic ELB: TCP"), "{e}");
        svc.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(TYPE.into(), "nlb".into());
        assert!(LoadBalancerSpec::from_service(&svc).is_ok());

        let mut svc = service(&[], &[(80, 30080)]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["bad".into()]);
        assert_eq!(
            LoadBalancerSpec::from_service(&svc).unwrap_err().field,
            "spec.loadBalancerSourceRanges"
        );
    }

    #[test]
    fn spec_source_ranges_win_over_the_annotation() {
        let mut svc = service(&[(SOURCE_RANGES, "10.0.0.0/8")], &[(80, 30080)]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["1.2.3.0/24".into()]);
        let s = LoadBalancerSpec::from_service(&svc).unwrap();
        assert_eq!(
            s.source_ranges,
            vec!["1.2.3.0/24".parse::<Ipv4Net>().unwrap()]
        );
    }
}

#[cfg(test)]
#[path = "annotations_target_labels_tests.rs"]
mod target_labels_tests;
