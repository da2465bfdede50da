//! Service annotations: one table, parsed into a typed, validated spec.
//!
//! [`table::ANNOTATIONS`] is the single source of truth for every annotation
//! the service controller reads: its name, value type, default, which load
//! balancer type it applies to, what it means, and how its value is parsed
//! into the spec. The annotation reference (docs/annotations.md) is
//! generated from it by the unit tests, which fail when the two drift.
//!
//! [`LoadBalancerSpec::from_service`] (in `parse.rs`) turns a Service into a
//! typed spec before any AWS call by walking the table.
//! [`LoadBalancerSpec::read`] follows the Go CCM value class by value class
//! (`CLASSES` in `upstream.rs`, a test oracle; docs/compatibility.md is
//! generated from it):
//! - a value the Go CCM takes or ignores is read as the Go CCM reads it and
//!   noted ([`SpecNote`]: a Warning naming the annotation, the value, what the
//!   Go CCM does with it and the fix);
//! - a value the Go CCM fails on too becomes a [`SpecError`]. It stops only
//!   the change it governs: the controller keeps an existing load balancer's
//!   backends and node rules current ("upkeep") from the rest of the reading.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use ipnet::Ipv4Net;

pub use findings::{Finding, SYNC_FAILED};

mod findings;
mod parse;
mod rows;
pub mod table;
// The comparison with the Go CCM, value class by value class: a test
// oracle (and docs/compatibility.md's source), not part of the product.
#[cfg(test)]
mod upstream;

/// Prefix of every AWS load balancer annotation.
#[cfg(test)]
const PREFIX: &str = "service.beta.kubernetes.io/";

macro_rules! key {
    ($suffix:literal) => {
        concat!("service.beta.kubernetes.io/aws-load-balancer-", $suffix)
    };
}

pub(crate) const TYPE: &str = key!("type");
pub(crate) const INTERNAL: &str = key!("internal");
pub(crate) const PROXY_PROTOCOL: &str = key!("proxy-protocol");
const ACCESS_LOG_EMIT_INTERVAL: &str = key!("access-log-emit-interval");
pub(crate) const ACCESS_LOG_ENABLED: &str = key!("access-log-enabled");
pub(crate) const ACCESS_LOG_BUCKET: &str = key!("access-log-s3-bucket-name");
const ACCESS_LOG_PREFIX: &str = key!("access-log-s3-bucket-prefix");
const DRAINING_ENABLED: &str = key!("connection-draining-enabled");
const DRAINING_TIMEOUT: &str = key!("connection-draining-timeout");
const IDLE_TIMEOUT: &str = key!("connection-idle-timeout");
pub(crate) const CROSS_ZONE: &str = key!("cross-zone-load-balancing-enabled");
pub(crate) const EXTRA_SECURITY_GROUPS: &str = key!("extra-security-groups");
pub(crate) const SECURITY_GROUPS: &str = key!("security-groups");
pub(crate) const SSL_CERT: &str = key!("ssl-cert");
pub(crate) const SSL_PORTS: &str = key!("ssl-ports");
pub(crate) const SSL_NEGOTIATION_POLICY: &str = key!("ssl-negotiation-policy");
pub(crate) const BACKEND_PROTOCOL: &str = key!("backend-protocol");
pub(crate) const ADDITIONAL_TAGS: &str = key!("additional-resource-tags");
pub(crate) const HC_PROTOCOL: &str = key!("healthcheck-protocol");
pub(crate) const HC_PORT: &str = key!("healthcheck-port");
pub(crate) const HC_PATH: &str = key!("healthcheck-path");
pub(crate) const HC_HEALTHY: &str = key!("healthcheck-healthy-threshold");
const HC_UNHEALTHY: &str = key!("healthcheck-unhealthy-threshold");
pub(crate) const HC_TIMEOUT: &str = key!("healthcheck-timeout");
pub(crate) const HC_INTERVAL: &str = key!("healthcheck-interval");
pub(crate) const EIP_ALLOCATIONS: &str = key!("eip-allocations");
pub(crate) const PRIVATE_IPV4: &str = key!("private-ipv4-addresses");
pub(crate) const TARGET_GROUP_ATTRIBUTES: &str = key!("target-group-attributes");
pub(crate) const TARGET_NODE_LABELS: &str = key!("target-node-labels");
pub(crate) const SUBNETS: &str = key!("subnets");
pub(crate) const IP_ADDRESS_TYPE: &str = key!("ip-address-type");
pub(crate) const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

// The AWS Load Balancer Controller's keys that the Go CCM does not read
// (tests/data/albc-annotations.json, read from that controller's source).
const SCHEME: &str = key!("scheme");
const NLB_TARGET_TYPE: &str = key!("nlb-target-type");
pub(crate) const NAME: &str = key!("name");
const PROXY_PROTOCOL_PER_TARGET_GROUP: &str = key!("proxy-protocol-per-target-group");
const HC_SUCCESS_CODES: &str = key!("healthcheck-success-codes");
const IPV6_ADDRESSES: &str = key!("ipv6-addresses");
pub(crate) const ALPN_POLICY: &str = key!("alpn-policy");
pub(crate) const LB_ATTRIBUTES: &str = key!("attributes");
/// The one key of [`LB_ATTRIBUTES`] this CCM reads.
pub(crate) const DELETION_PROTECTION: &str = "deletion_protection.enabled";
const MANAGE_BACKEND_SG_RULES: &str = key!("manage-backend-security-group-rules");
const PRIVATE_LINK_SG_RULES: &str = key!("inbound-sg-rules-on-private-link-traffic");
const SG_PREFIX_LISTS: &str = key!("security-group-prefix-lists");
/// A key pattern: `...listener-attributes.<protocol>-<port>`.
const LISTENER_ATTRIBUTES: &str = key!("listener-attributes.*");
/// [`LISTENER_ATTRIBUTES`] before its `<protocol>-<port>`.
pub(crate) const LISTENER_ATTRIBUTES_PREFIX: &str = key!("listener-attributes.");
const MULTI_CLUSTER_TARGET_GROUP: &str = key!("multi-cluster-target-group");
const IPV6_SOURCE_NAT: &str = key!("enable-prefix-for-ipv6-source-nat");
const SOURCE_NAT_IPV6_PREFIXES: &str = key!("source-nat-ipv6-prefixes");
const MIN_CAPACITY: &str = key!("minimum-load-balancer-capacity");
const ICMP_PATH_MTU: &str = key!("enable-icmp-for-path-mtu-discovery");
const TCP_UDP_LISTENER: &str = key!("enable-tcp-udp-listener");
const DISABLE_NLB_SG: &str = key!("disable-nlb-sg");
const QUIC_PORTS: &str = key!("quic-enabled-ports");

/// The Warning reason of a value taken as the Go CCM takes it.
const TOLERATED: &str = "AnnotationValueTolerated";
/// The Warning reason of an AWS Load Balancer Controller annotation that
/// this CCM, like the Go CCM, does not read.
const NOT_READ: &str = "AnnotationNotRead";
/// The Warning reason of an NLB setting of cloud.conf
/// `NLBListenerSettings = true` not applied because AWS would refuse it
/// (only that change is stopped).
pub(crate) const SETTING_REFUSED: &str = "NLBSettingRefused";

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

/// Whether `aws-load-balancer-type` hands the Service to another controller
/// (the AWS Load Balancer Controller), as the Go CCM's `isLBExternal` reads
/// it: exactly `external` or `nlb-ip`. Such a Service is not this CCM's: no
/// AWS call is made for it, on deletion neither.
pub(crate) fn is_external(svc: &k8s_openapi::api::core::v1::Service) -> bool {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TYPE))
        .is_some_and(|v| external_type(v))
}

/// The load balancer a Service may have adopted (see
/// `aws::load_balancers::adopt`), which its deletion deletes and
/// `aws-ccm orphans` counts as live, once its tags prove it the Service's:
/// the one its status names ([`held_name`]: what it adopted, kept when the
/// annotation is removed or names another), else the one its
/// `aws-load-balancer-name` names (adopted before its status was written).
pub(crate) fn adopt_name(svc: &k8s_openapi::api::core::v1::Service) -> Option<String> {
    held_name(svc).or_else(|| {
        (svc.metadata.annotations.as_ref())
            .and_then(|a| a.get(NAME))
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
    })
}

/// The name of the load balancer the Service's status points at, when it
/// is a name this CCM gives (`a` + 31 hex digits, the DNS name's first
/// label after an optional `internal-`) and not the Service's own: the load
/// balancer it adopted. A local read: no AWS call for a Service whose
/// status names its own load balancer, or none.
pub(crate) fn held_name(svc: &k8s_openapi::api::core::v1::Service) -> Option<String> {
    let own = crate::aws::elb::load_balancer_name(svc.metadata.uid.as_deref()?);
    let ingress = svc
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?;
    ingress
        .iter()
        .filter_map(|i| i.hostname.as_deref())
        .find_map(name_in_hostname)
        .filter(|n| *n != own)
}

/// Pure: the `a` + 31-hex-digit load balancer name a DNS name begins with.
pub(crate) fn name_in_hostname(hostname: &str) -> Option<String> {
    let h = hostname.strip_prefix("internal-").unwrap_or(hostname);
    let name = h.get(..32)?;
    let rest = h.get(32..)?;
    let hex = name.strip_prefix('a')?;
    (hex.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && (rest.starts_with('-') || rest.starts_with('.')))
    .then(|| name.to_string())
}

/// Whether the Service marks its load balancer protected:
/// `aws-load-balancer-attributes` holds `deletion_protection.enabled=true`
/// (read as [`LoadBalancerSpec::deletion_protection`] reads it). Its
/// deletion then keeps the load balancer (docs/ownership.md).
pub(crate) fn is_protected(svc: &k8s_openapi::api::core::v1::Service) -> bool {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LB_ATTRIBUTES))
        .is_some_and(|v| {
            parse_key_values(v)
                .get(DELETION_PROTECTION)
                .is_some_and(|v| v.trim() == "true")
        })
}

/// The `aws-load-balancer-type` values the Go CCM leaves to another controller.
fn external_type(v: &str) -> bool {
    v == "external" || v == "nlb-ip"
}

/// A value taken as the Go CCM takes it, though it is probably not what the
/// user meant: it becomes a Warning, and the sync goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SpecNote {
    pub(crate) field: String,
    pub(crate) value: String,
    /// What the Go CCM (and so this CCM) does with the value.
    pub(crate) reading: String,
    /// What to write instead.
    fix: String,
    /// What the value stops.
    pub(crate) holds: Holds,
    /// The reason of its Warning event: [`TOLERATED`] or [`NOT_READ`].
    pub(crate) reason: &'static str,
}

/// What a noted value stops, when the Go CCM's reading is almost surely not
/// what the user meant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Holds {
    /// Nothing: the sync goes on as the Go CCM reads the Service.
    Nothing,
    /// A Service without a load balancer yet gets none; an existing one is
    /// synced in full (`type: NLB`: the Classic ELB the Go CCM made stays
    /// one).
    New,
    /// A Service without a load balancer yet gets none; an existing one is
    /// kept as it is, in upkeep (its backends and node rules kept current):
    /// a full sync could change what the value is about
    /// (`aws-load-balancer-scheme: internal` without
    /// `aws-load-balancer-internal`: an internal load balancer would be
    /// recreated internet-facing).
    Changes,
}

impl fmt::Display for SpecNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}={:?}: {}; {}",
            self.field, self.value, self.reading, self.fix
        )
    }
}

/// Everything read from a Service: the spec (a refused value leaves its
/// part at the default), the values taken with a warning, and the values
/// refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub(crate) spec: LoadBalancerSpec,
    pub(crate) notes: Vec<SpecNote>,
    pub errors: Vec<SpecError>,
}

impl Reading {
    /// A new Service gets no load balancer until the value is fixed.
    pub(crate) fn holds_new(&self) -> bool {
        self.notes.iter().any(|n| n.holds != Holds::Nothing)
    }

    /// An existing load balancer is kept in upkeep until the value is fixed.
    pub(crate) fn holds_changes(&self) -> bool {
        self.notes.iter().any(|n| n.holds == Holds::Changes)
    }

    /// Whether the source ranges were read as written: the node rules of an
    /// NLB in upkeep are synced only then (the default would open them).
    pub(crate) fn source_ranges_known(&self) -> bool {
        !self
            .errors
            .iter()
            .any(|e| e.field == SOURCE_RANGES || e.field == "spec.loadBalancerSourceRanges")
    }
}

fn err(field: &str, value: &str, allowed: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

/// Which load balancer the Service asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum LoadBalancerKind {
    #[default]
    Classic,
    Network,
    /// `external` / `nlb-ip`: another controller's business.
    External,
}

/// Backend protocol annotation values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BackendProtocol {
    Http,
    Https,
    Ssl,
    Tcp,
}

/// Ports named by `ssl-ports`; `None` in the spec means every port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PortSet {
    numbers: BTreeSet<i32>,
    names: BTreeSet<String>,
}

impl PortSet {
    pub(crate) fn contains(&self, port: i32, name: &str) -> bool {
        self.numbers.contains(&port) || self.names.contains(&name.to_ascii_lowercase())
    }
}

/// `healthcheck-port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HealthCheckPort {
    TrafficPort,
    Port(i32),
}

/// Health check annotations, unresolved (defaults depend on the LB type).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HealthCheckOverrides {
    /// Upper-cased.
    pub(crate) protocol: Option<String>,
    pub(crate) port: Option<HealthCheckPort>,
    pub(crate) path: Option<String>,
    pub(crate) healthy_threshold: Option<i32>,
    pub(crate) unhealthy_threshold: Option<i32>,
    pub(crate) timeout: Option<i32>,
    pub(crate) interval: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ServicePortSpec {
    pub(crate) name: String,
    pub(crate) port: i32,
    pub(crate) node_port: i32,
    /// `TCP`, `UDP`, `SCTP`.
    pub(crate) protocol: String,
}

/// Everything a Service asks of its load balancer, typed and validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadBalancerSpec {
    pub(crate) kind: LoadBalancerKind,
    pub(crate) internal: bool,
    pub(crate) proxy_protocol: bool,
    pub(crate) access_log_enabled: bool,
    pub(crate) access_log_emit_interval: Option<i32>,
    pub(crate) access_log_bucket: Option<String>,
    pub(crate) access_log_prefix: Option<String>,
    pub(crate) draining_enabled: bool,
    pub(crate) draining_timeout: Option<i32>,
    pub(crate) idle_timeout: Option<i32>,
    pub(crate) cross_zone: bool,
    pub(crate) security_groups: Vec<String>,
    pub(crate) extra_security_groups: Vec<String>,
    pub(crate) ssl_cert: Option<String>,
    /// `None`: every port.
    pub(crate) ssl_ports: Option<PortSet>,
    pub(crate) ssl_negotiation_policy: Option<String>,
    /// `backend-protocol` when it is one of the documented (lower-case)
    /// values.
    pub(crate) backend_protocol: Option<BackendProtocol>,
    /// Any other `backend-protocol` value (`HTTP`, `grpc`): the Go CCM maps
    /// none of them to a listener, but its Classic ELB health check still
    /// reads `https`/`ssl` in any case form.
    backend_protocol_other: Option<String>,
    pub(crate) additional_tags: BTreeMap<String, String>,
    pub(crate) health_check: HealthCheckOverrides,
    pub(crate) eip_allocations: Vec<String>,
    pub(crate) private_ipv4_addresses: Vec<std::net::Ipv4Addr>,
    pub(crate) target_group_attributes: BTreeMap<String, String>,
    /// `alpn-policy` as written, on an NLB (read only with cloud.conf
    /// `NLBListenerSettings = true`; see `parse::refused_nlb_settings`).
    pub(crate) alpn_policy: Option<String>,
    /// `listener-attributes.<PROTO>-<port>` values as written, by the key's
    /// `<PROTO>-<port>`, on an NLB (read only with cloud.conf
    /// `NLBListenerSettings = true`).
    pub(crate) listener_attributes: BTreeMap<String, String>,
    /// `ip-address-type: dualstack` (NLB only).
    pub(crate) dualstack: bool,
    pub(crate) target_node_labels: BTreeMap<String, String>,
    /// `None`: auto-discover.
    pub(crate) subnets: Option<Vec<String>>,
    /// Never empty in a spec read from a Service (defaults to `0.0.0.0/0`;
    /// only `Default` leaves it empty); sorted, deduplicated.
    pub(crate) source_ranges: Vec<Ipv4Net>,
    /// Ports that have a node port (others are skipped, as upstream).
    pub(crate) ports: Vec<ServicePortSpec>,
    /// `externalTrafficPolicy: Local` with its `healthCheckNodePort`.
    pub(crate) local_health_check_node_port: Option<i32>,
    /// `aws-load-balancer-attributes: deletion_protection.enabled=<bool>`:
    /// `Some(true)` protects the load balancer (kept when the Service goes,
    /// see `aws::load_balancers::keep`); `None`: not written.
    pub(crate) deletion_protection: Option<bool>,
    /// `aws-load-balancer-name`: the kept load balancer the Service adopts,
    /// or has adopted (see `aws::load_balancers::adopt`).
    pub(crate) adopt_name: Option<String>,
    /// The load balancer the Service's status names when not its own
    /// ([`held_name`]): followed only while its tags say the Service
    /// adopted it (the annotation removed after the adoption).
    pub(crate) held_name: Option<String>,
}

impl LoadBalancerSpec {
    /// Whether the Service marks its load balancer protected.
    pub(crate) fn protected(&self) -> bool {
        self.deletion_protection == Some(true)
    }
}

impl LoadBalancerSpec {
    /// The Classic ELB health check's protocol is SSL rather than TCP: the Go
    /// CCM lower-cases `backend-protocol` for this one decision.
    pub(crate) fn backend_health_check_is_ssl(&self) -> bool {
        match self.backend_protocol {
            Some(BackendProtocol::Https | BackendProtocol::Ssl) => true,
            Some(_) => false,
            None => self
                .backend_protocol_other
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("https") || v.eq_ignore_ascii_case("ssl")),
        }
    }
}

/// Comma-separated list, blanks dropped.
fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

/// `k1=v1,k2=,k3` as upstream reads it.
pub(crate) fn parse_key_values(v: &str) -> BTreeMap<String, String> {
    v.trim()
        .split(',')
        .filter_map(|item| {
            let mut parts = item.trim().split('=');
            let key = parts.next().filter(|k| !k.is_empty())?;
            Some((
                key.to_string(),
                parts.next().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// Whether a Node's labels satisfy a Service's `target-node-labels`, read
/// by [`parse_key_values`], as upstream's `filterTargetNodes` does: every
/// pair must hold; a pair with an empty value (`key` or `key=`) asks only
/// that the label exists, with any value; a pair with a value asks for that
/// exact value. No pairs: every node matches.
pub(crate) fn labels_match(
    labels: &BTreeMap<String, String>,
    targets: &BTreeMap<String, String>,
) -> bool {
    targets.iter().all(|(key, want)| {
        labels
            .get(key)
            .is_some_and(|have| want.is_empty() || have == want)
    })
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
pub(crate) mod tests;

#[cfg(test)]
mod target_labels_tests;
