//! Parsing a Service into a [`LoadBalancerSpec`]: the spec starts from its
//! defaults, each row of [`ANNOTATIONS`] parses its own value into it, then the
//! Service's own fields and the checks that span several values run.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};

use super::table::ANNOTATIONS;
use super::*;

/// What a row's parser may need besides its own value.
#[derive(Clone, Copy, Debug)]
pub struct Context<'a> {
    pub is_nlb: bool,
    /// `spec.loadBalancerSourceRanges` is set (it wins over the annotation).
    pub spec_has_source_ranges: bool,
    /// Values taken as the Go CCM takes them, with a warning.
    pub notes: &'a RefCell<Vec<SpecNote>>,
}

impl Context<'_> {
    fn note(&self, field: &str, value: &str, reading: &str, fix: &str, hold_if_new: bool) {
        self.notes.borrow_mut().push(SpecNote {
            field: field.to_string(),
            value: value.to_string(),
            reading: reading.to_string(),
            fix: fix.to_string(),
            hold_if_new,
        });
    }
}

/// A row's parser: the spec so far, the context, the annotation key and its value.
pub type Parse = fn(&mut LoadBalancerSpec, &Context<'_>, &str, &str) -> Result<(), SpecError>;

impl LoadBalancerSpec {
    /// Parses and validates a Service of type LoadBalancer: the first value
    /// refused, else the spec (values taken with a warning included).
    pub fn from_service(svc: &Service) -> Result<LoadBalancerSpec, SpecError> {
        let reading = LoadBalancerSpec::read(svc);
        match reading.errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(reading.spec),
        }
    }

    /// Reads a Service of type LoadBalancer as the Go CCM does: every row
    /// of the table, each value refused or noted on its own, so that one bad
    /// value leaves the rest of the spec read.
    pub fn read(svc: &Service) -> Reading {
        let empty = BTreeMap::new();
        let annotations = svc.metadata.annotations.as_ref().unwrap_or(&empty);
        let spec = svc.spec.clone().unwrap_or_default();
        let notes = RefCell::new(Vec::new());
        let mut errors = Vec::new();
        let mut cx = Context {
            is_nlb: false,
            spec_has_source_ranges: spec
                .load_balancer_source_ranges
                .as_ref()
                .is_some_and(|r| !r.is_empty()),
            notes: &notes,
        };
        let kind = parse_kind(&cx, annotations.get(TYPE).map_or("", String::as_str));
        cx.is_nlb = kind == LoadBalancerKind::Network;
        let mut out = LoadBalancerSpec::defaults(kind);
        if kind == LoadBalancerKind::External {
            // The Go CCM answers ImplementedElsewhere before reading anything.
            return Reading {
                spec: out,
                notes: notes.into_inner(),
                errors,
            };
        }
        for row in ANNOTATIONS {
            let Some(value) = annotations.get(row.name) else {
                continue;
            };
            if !row.applies.to(cx.is_nlb) {
                if row.rejected_elsewhere {
                    errors.push(err(row.name, value, row.elsewhere()));
                } else {
                    let reading = format!("ignored on a {kind}, as the Go CCM ignores it");
                    cx.note(row.name, value, &reading, "remove it", false);
                }
                continue;
            }
            if let Err(e) = (row.parse)(&mut out, &cx, row.name, value) {
                errors.push(e);
            }
        }
        out.read_spec_fields(&spec, &cx, annotations, &mut errors);
        Reading {
            spec: out,
            notes: notes.into_inner(),
            errors,
        }
    }

    /// The Service's own fields and the checks that span several values.
    fn read_spec_fields(
        &mut self,
        spec: &ServiceSpec,
        cx: &Context<'_>,
        annotations: &BTreeMap<String, String>,
        errors: &mut Vec<SpecError>,
    ) {
        let mut keep = |r: Result<(), SpecError>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        keep(check_spec_fields(spec));
        match parse_ports(spec, cx.is_nlb) {
            Ok(ports) => self.ports = ports,
            Err(e) => {
                // Upkeep still needs the node ports of the ports that have one.
                self.ports = node_ports(spec, cx.is_nlb);
                keep(Err(e));
            }
        }
        keep(self.check_health_check_timing(cx));
        keep(self.check_backend_protocol_with_cert(cx));
        if let Some(ranges) = spec.load_balancer_source_ranges.as_deref()
            && cx.spec_has_source_ranges
        {
            match parse_cidrs("spec.loadBalancerSourceRanges", ranges) {
                Ok(r) => self.source_ranges = r,
                Err(e) => keep(Err(e)),
            }
        }
        keep(self.check_udp_keeps_client_ip(annotations));
        if spec.external_traffic_policy.as_deref() == Some("Local") {
            self.local_health_check_node_port = spec.health_check_node_port;
        }
    }

    /// A Classic ELB listener with a certificate maps `backend-protocol`
    /// through http/https/ssl/tcp; the Go CCM fails on any other value there.
    fn check_backend_protocol_with_cert(&self, cx: &Context<'_>) -> Result<(), SpecError> {
        let (Some(other), Some(_), false) =
            (&self.backend_protocol_other, &self.ssl_cert, cx.is_nlb)
        else {
            return Ok(());
        };
        let ssl_port = self.ports.iter().any(|p| {
            self.ssl_ports
                .as_ref()
                .is_none_or(|set| set.contains(p.port, &p.name))
        });
        if ssl_port {
            return Err(err(
                BACKEND_PROTOCOL,
                other,
                "with aws-load-balancer-ssl-cert the backend protocol must be http, https, ssl or tcp (lower case), as the Go CCM requires",
            ));
        }
        Ok(())
    }

    /// The spec of a Service without annotations, before its ports are read.
    fn defaults(kind: LoadBalancerKind) -> LoadBalancerSpec {
        LoadBalancerSpec {
            kind,
            internal: false,
            proxy_protocol: false,
            access_log_enabled: false,
            access_log_emit_interval: None,
            access_log_bucket: None,
            access_log_prefix: None,
            draining_enabled: false,
            draining_timeout: None,
            idle_timeout: None,
            cross_zone: false,
            security_groups: Vec::new(),
            extra_security_groups: Vec::new(),
            ssl_cert: None,
            ssl_ports: None,
            ssl_negotiation_policy: None,
            backend_protocol: None,
            backend_protocol_other: None,
            additional_tags: BTreeMap::new(),
            health_check: HealthCheckOverrides::default(),
            eip_allocations: Vec::new(),
            private_ipv4_addresses: Vec::new(),
            target_group_attributes: BTreeMap::new(),
            dualstack: false,
            target_node_labels: BTreeMap::new(),
            subnets: None,
            source_ranges: vec![Ipv4Net::default()],
            ports: Vec::new(),
            local_health_check_node_port: None,
        }
    }

    /// A classic ELB needs the health check timeout below its interval.
    fn check_health_check_timing(&self, cx: &Context) -> Result<(), SpecError> {
        if let (Some(t), Some(i)) = (self.health_check.timeout, self.health_check.interval)
            && t >= i
            && !cx.is_nlb
        {
            return Err(err(
                HC_TIMEOUT,
                &t.to_string(),
                format!("must be less than {HC_INTERVAL} ({i})"),
            ));
        }
        Ok(())
    }

    /// AWS refuses a UDP target group that does not preserve client IPs.
    fn check_udp_keeps_client_ip(
        &self,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), SpecError> {
        if self
            .target_group_attributes
            .get("preserve_client_ip.enabled")
            .map(String::as_str)
            == Some("false")
            && self.ports.iter().any(|p| p.protocol == "UDP")
        {
            return Err(err(
                TARGET_GROUP_ATTRIBUTES,
                annotations
                    .get(TARGET_GROUP_ATTRIBUTES)
                    .map(String::as_str)
                    .unwrap_or_default(),
                "preserve_client_ip.enabled cannot be false with a UDP port (AWS refuses it); remove it or the UDP port",
            ));
        }
        Ok(())
    }
}

/// Service fields an AWS load balancer cannot honour.
fn check_spec_fields(spec: &ServiceSpec) -> Result<(), SpecError> {
    if let Some(ip) = spec.load_balancer_ip.as_deref()
        && !ip.is_empty()
    {
        return Err(err(
            "spec.loadBalancerIP",
            ip,
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
    Ok(())
}

/// The Service's ports with a node port, after checking their protocols.
fn parse_ports(spec: &ServiceSpec, is_nlb: bool) -> Result<Vec<ServicePortSpec>, SpecError> {
    let raw_ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = raw_ports.first() else {
        return Err(err(
            "spec.ports",
            "",
            "a load balancer needs at least one port",
        ));
    };
    let protocol_of = |p: &ServicePort| p.protocol.clone().unwrap_or_else(|| "TCP".to_string());
    let first = protocol_of(first);
    let mut ports = Vec::new();
    for (i, p) in raw_ports.iter().enumerate() {
        let protocol = protocol_of(p);
        check_port_protocol(i, &protocol, &first, is_nlb)?;
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
    Ok(ports)
}

fn check_port_protocol(
    i: usize,
    protocol: &str,
    first: &str,
    is_nlb: bool,
) -> Result<(), SpecError> {
    // An NLB takes TCP and UDP together (TCP_UDP on a shared port).
    if protocol != first && !is_nlb {
        return Err(err(
            &format!("spec.ports[{i}].protocol"),
            protocol,
            format!(
                "mixed protocols are not supported; use {first} for every port or split the Service"
            ),
        ));
    }
    let ok = protocol == "TCP" || (is_nlb && protocol == "UDP");
    if !ok {
        return Err(err(
            &format!("spec.ports[{i}].protocol"),
            protocol,
            if is_nlb {
                "allowed on an NLB: TCP, UDP"
            } else {
                "allowed on a classic ELB: TCP (use aws-load-balancer-type: nlb for UDP)"
            },
        ));
    }
    Ok(())
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

/// An empty value means "not set" for flags, numbers and strings.
fn flag(key: &str, v: &str) -> Result<bool, SpecError> {
    if v.is_empty() {
        Ok(false)
    } else {
        parse_bool(key, v)
    }
}

fn number(key: &str, v: &str, min: i32, max: i32) -> Result<Option<i32>, SpecError> {
    if v.is_empty() {
        Ok(None)
    } else {
        parse_int(key, v, min, max).map(Some)
    }
}

fn text(v: &str) -> Option<String> {
    (!v.is_empty()).then(|| v.to_string())
}

/// The Go CCM makes an NLB for exactly `nlb`, leaves exactly `external` and
/// `nlb-ip` to another controller, and makes a Classic ELB for anything else.
fn parse_kind(cx: &Context<'_>, v: &str) -> LoadBalancerKind {
    match v {
        "" => LoadBalancerKind::Classic,
        "nlb" => LoadBalancerKind::Network,
        "external" | "nlb-ip" => LoadBalancerKind::External,
        other => {
            let meant = ["nlb", "external", "nlb-ip"]
                .into_iter()
                .find(|m| other.trim().eq_ignore_ascii_case(m));
            match meant {
                Some(m) => cx.note(
                    TYPE,
                    other,
                    "the Go CCM makes a Classic ELB for it (only the exact lower-case value counts); an existing load balancer is kept as the Classic ELB it is, and a new Service gets none until the value is fixed",
                    &format!("write {m}"),
                    true,
                ),
                None => cx.note(
                    TYPE,
                    other,
                    "read as a Classic ELB, as the Go CCM reads any value but nlb, external and nlb-ip",
                    "remove it for a Classic ELB, or write nlb for an NLB",
                    false,
                ),
            }
            LoadBalancerKind::Classic
        }
    }
}

/// The Service's ports with a node port and a protocol this kind can carry:
/// what the upkeep of an existing load balancer keeps when another port is
/// refused (a port the load balancer cannot carry never had a listener).
fn node_ports(spec: &ServiceSpec, is_nlb: bool) -> Vec<ServicePortSpec> {
    spec.ports
        .iter()
        .flatten()
        .filter(|p| p.node_port.unwrap_or(0) != 0)
        .filter(|p| match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => true,
            "UDP" => is_nlb,
            _ => false,
        })
        .map(|p| ServicePortSpec {
            name: p.name.clone().unwrap_or_default(),
            port: p.port,
            node_port: p.node_port.unwrap_or(0),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
        })
        .collect()
}

// The row parsers, in table order. `read` reads the type first, as every
// other row may depend on it; its row only checks it is the same.

pub fn kind(s: &mut LoadBalancerSpec, _: &Context, _: &str, _: &str) -> Result<(), SpecError> {
    debug_assert!(s.kind != LoadBalancerKind::External);
    Ok(())
}

pub fn internal(s: &mut LoadBalancerSpec, _: &Context, _: &str, v: &str) -> Result<(), SpecError> {
    // Upstream: "false" is external, any other non-empty value internal.
    s.internal = !v.is_empty() && v != "false";
    Ok(())
}

pub fn proxy_protocol(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.proxy_protocol = match v {
        "" => false,
        "*" => true,
        _ => return Err(err(k, v, "allowed: * (every backend port)")),
    };
    Ok(())
}

pub fn access_log_emit_interval(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.access_log_emit_interval = match v.trim() {
        _ if v.is_empty() => None,
        "5" => Some(5),
        "60" => Some(60),
        _ => return Err(err(k, v, "allowed: 5 or 60 (minutes)")),
    };
    Ok(())
}

pub fn access_log_enabled(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.access_log_enabled = flag(k, v)?;
    Ok(())
}

pub fn access_log_bucket(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.access_log_bucket = text(v);
    Ok(())
}

pub fn access_log_prefix(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.access_log_prefix = text(v);
    Ok(())
}

pub fn draining_enabled(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.draining_enabled = flag(k, v)?;
    Ok(())
}

pub fn draining_timeout(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.draining_timeout = number(k, v, 1, 3600)?;
    Ok(())
}

pub fn idle_timeout(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.idle_timeout = number(k, v, 1, 4000)?;
    Ok(())
}

pub fn cross_zone(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.cross_zone = flag(k, v)?;
    Ok(())
}

/// Upstream rejects it on an NLB, even empty (the row says so).
pub fn extra_security_groups(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.extra_security_groups = split_list(v);
    Ok(())
}

pub fn security_groups(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.security_groups = split_list(v);
    Ok(())
}

pub fn ssl_cert(s: &mut LoadBalancerSpec, _: &Context, _: &str, v: &str) -> Result<(), SpecError> {
    s.ssl_cert = text(v);
    Ok(())
}

pub fn ssl_ports(s: &mut LoadBalancerSpec, _: &Context, _: &str, v: &str) -> Result<(), SpecError> {
    if v.is_empty() || v == "*" {
        s.ssl_ports = None;
        return Ok(());
    }
    let mut set = PortSet::default();
    for item in split_list(v) {
        match item.parse::<i32>() {
            Ok(n) => set.numbers.insert(n),
            Err(_) => set.names.insert(item.to_ascii_lowercase()),
        };
    }
    s.ssl_ports = Some(set);
    Ok(())
}

pub fn ssl_negotiation_policy(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.ssl_negotiation_policy = text(v);
    Ok(())
}

pub fn backend_protocol(
    s: &mut LoadBalancerSpec,
    cx: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.backend_protocol = match v {
        "" => None,
        "http" => Some(BackendProtocol::Http),
        "https" => Some(BackendProtocol::Https),
        "ssl" => Some(BackendProtocol::Ssl),
        "tcp" => Some(BackendProtocol::Tcp),
        other => {
            // Refused later only on a Classic ELB with a certificate, where
            // the Go CCM fails on it too.
            s.backend_protocol_other = Some(other.to_string());
            let reading = if cx.is_nlb {
                "ignored on an NLB, as the Go CCM reads only ssl (with a certificate) there"
            } else if other.eq_ignore_ascii_case("https") || other.eq_ignore_ascii_case("ssl") {
                "the Go CCM makes TCP listeners for it (only http, https, ssl, tcp in lower case count) and an SSL health check"
            } else {
                "the Go CCM makes TCP listeners for it (only http, https, ssl, tcp in lower case count)"
            };
            cx.note(
                k,
                v,
                reading,
                "use http, https, ssl or tcp in lower case",
                false,
            );
            None
        }
    };
    Ok(())
}

pub fn additional_tags(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.additional_tags = parse_key_values(v);
    Ok(())
}

pub fn hc_protocol(
    s: &mut LoadBalancerSpec,
    cx: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    if v.is_empty() {
        s.health_check.protocol = None;
        return Ok(());
    }
    let up = v.to_ascii_uppercase();
    let allowed: &[&str] = if cx.is_nlb {
        &["TCP", "HTTP", "HTTPS"]
    } else {
        &["TCP", "HTTP", "HTTPS", "SSL"]
    };
    if !allowed.contains(&up.as_str()) {
        return Err(err(k, v, format!("allowed: {}", allowed.join(", "))));
    }
    s.health_check.protocol = Some(up);
    Ok(())
}

pub fn hc_port(s: &mut LoadBalancerSpec, _: &Context, k: &str, v: &str) -> Result<(), SpecError> {
    s.health_check.port = match v {
        "" => None,
        "traffic-port" => Some(HealthCheckPort::TrafficPort),
        _ => Some(HealthCheckPort::Port(parse_int(k, v, 1, 65535).map_err(
            |_| {
                err(
                    k,
                    v,
                    "allowed: traffic-port or a port number from 1 to 65535",
                )
            },
        )?)),
    };
    Ok(())
}

pub fn hc_path(s: &mut LoadBalancerSpec, _: &Context, _: &str, v: &str) -> Result<(), SpecError> {
    s.health_check.path = text(v);
    Ok(())
}

pub fn hc_healthy(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.health_check.healthy_threshold = number(k, v, 2, 10)?;
    Ok(())
}

pub fn hc_unhealthy(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.health_check.unhealthy_threshold = number(k, v, 2, 10)?;
    Ok(())
}

pub fn hc_timeout(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.health_check.timeout = number(k, v, 2, 120)?;
    Ok(())
}

pub fn hc_interval(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.health_check.interval = number(k, v, 5, 300)?;
    Ok(())
}

pub fn eip_allocations(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.eip_allocations = split_list(v);
    Ok(())
}

pub fn private_ipv4(
    s: &mut LoadBalancerSpec,
    _: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.private_ipv4_addresses = split_list(v)
        .iter()
        .map(|a| {
            a.parse()
                .map_err(|_| err(k, v, "allowed: IPv4 addresses, comma-separated"))
        })
        .collect::<Result<_, _>>()?;
    Ok(())
}

/// Upstream rejects it on anything but an NLB, even empty (the row says so).
pub fn target_group_attributes(
    s: &mut LoadBalancerSpec,
    cx: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    let mut attributes = BTreeMap::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').unwrap_or((item, ""));
        let valid_name = matches!(
            name,
            "preserve_client_ip.enabled" | "proxy_protocol_v2.enabled"
        );
        if !valid_name || !(value == "true" || value == "false") {
            return Err(err(
                k,
                v,
                "allowed: preserve_client_ip.enabled=true|false, proxy_protocol_v2.enabled=true|false",
            ));
        }
        if attributes
            .insert(name.to_string(), value.to_string())
            .is_some()
        {
            cx.note(
                k,
                v,
                &format!("{name} is set twice: the last value counts, as in the Go CCM"),
                "give each attribute once",
                false,
            );
        }
    }
    s.target_group_attributes = attributes;
    Ok(())
}

pub fn ip_address_type(
    s: &mut LoadBalancerSpec,
    cx: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.dualstack = match v {
        "" | "ipv4" => false,
        "dualstack" => true,
        other => {
            // Not a Go CCM annotation: the Go CCM ignores every value.
            cx.note(
                k,
                other,
                "read as ipv4 (the Go CCM has no such annotation and ignores it)",
                "write ipv4 or dualstack",
                false,
            );
            false
        }
    };
    Ok(())
}

pub fn target_node_labels(
    s: &mut LoadBalancerSpec,
    _: &Context,
    _: &str,
    v: &str,
) -> Result<(), SpecError> {
    s.target_node_labels = parse_key_values(v);
    Ok(())
}

pub fn subnets(s: &mut LoadBalancerSpec, _: &Context, k: &str, v: &str) -> Result<(), SpecError> {
    let list = split_list(v);
    if list.is_empty() {
        return Err(err(
            k,
            v,
            "give subnet IDs or Name tags, comma-separated, or remove it to auto-discover",
        ));
    }
    s.subnets = Some(list);
    Ok(())
}

/// Skipped when `spec.loadBalancerSourceRanges` is set: the spec wins, as upstream.
pub fn source_ranges(
    s: &mut LoadBalancerSpec,
    cx: &Context,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    if cx.spec_has_source_ranges {
        return Ok(());
    }
    let list = split_list(v);
    if !list.is_empty() {
        s.source_ranges = parse_cidrs(k, &list)?;
    }
    Ok(())
}
