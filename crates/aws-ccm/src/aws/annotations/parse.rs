//! Parsing a Service into a [`LoadBalancerSpec`]: the spec starts from its
//! defaults, each row of [`ANNOTATIONS`] parses its own value into it, then the
//! Service's own fields and the checks that span several values run.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::table::ANNOTATIONS;
use super::*;

/// What a row's parser may need besides its own value.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Context<'a> {
    pub(crate) is_nlb: bool,
    /// `spec.loadBalancerSourceRanges` is set (it wins over the annotation).
    pub(crate) spec_has_source_ranges: bool,
    /// Values taken as the Go CCM takes them, with a warning.
    notes: &'a RefCell<Vec<SpecNote>>,
}

impl Context<'_> {
    /// A value taken as the Go CCM takes it ([`TOLERATED`]).
    pub(super) fn note(&self, field: &str, value: &str, reading: &str, fix: &str, holds: Holds) {
        let note = SpecNote::of(field, value, reading, fix, holds);
        self.notes.borrow_mut().push(note);
    }

    /// An AWS Load Balancer Controller annotation this CCM does not read,
    /// as the Go CCM does not ([`NOT_READ`]).
    pub(super) fn not_read(
        &self,
        field: &str,
        value: &str,
        reading: &str,
        fix: &str,
        holds: Holds,
    ) {
        let note = SpecNote {
            reason: NOT_READ,
            ..SpecNote::of(field, value, reading, fix, holds)
        };
        self.notes.borrow_mut().push(note);
    }
}

impl SpecNote {
    /// A [`TOLERATED`] note.
    fn of(field: &str, value: &str, reading: &str, fix: &str, holds: Holds) -> SpecNote {
        SpecNote {
            field: field.to_string(),
            value: value.to_string(),
            reading: reading.to_string(),
            fix: fix.to_string(),
            holds,
            reason: TOLERATED,
        }
    }
}

/// With cloud.conf `NLBListenerSettings = true`, the NLB settings of
/// `spec` not applied because AWS would refuse them ([`SETTING_REFUSED`]):
/// a health-check timeout above the interval, an ALPN policy, listener
/// attributes. Each stops only itself.
fn refused_nlb_settings(
    spec: &LoadBalancerSpec,
    cloud: &crate::cloud_config::CloudConfig,
) -> Vec<SpecNote> {
    let interval = crate::aws::nlb::desired::health_check(spec, cloud).interval;
    let mut notes = Vec::new();
    if let Some(t) = spec.health_check.timeout
        && t > interval
    {
        notes.push(SpecNote {
            reason: SETTING_REFUSED,
            ..SpecNote::of(
                HC_TIMEOUT,
                &t.to_string(),
                &format!("above the NLB's health-check interval ({interval} s), which AWS refuses: not sent, the target groups' timeout is left as it is"),
                &format!("set it at most the interval, or raise {HC_INTERVAL}"),
                Holds::Nothing,
            )
        });
    }
    if let Some(policy) = &spec.alpn_policy {
        let tls = crate::aws::nlb::desired::has_tls_listener(spec, cloud);
        let refused = if !crate::aws::nlb::ALPN_POLICIES.contains(&policy.as_str()) {
            Some((
                "not an ALPN policy AWS takes: not sent, the TLS listeners' policy is left as it is".to_string(),
                format!("write one of {}", crate::aws::nlb::ALPN_POLICIES.join(", ")),
            ))
        } else if !tls {
            Some((
                "the NLB has no TLS listener, and AWS takes an ALPN policy on TLS listeners only: not sent".to_string(),
                format!("set {SSL_CERT} (and {SSL_PORTS}) for a TLS listener, or remove {ALPN_POLICY}"),
            ))
        } else {
            None
        };
        if let Some((reading, fix)) = refused {
            notes.push(SpecNote {
                reason: SETTING_REFUSED,
                ..SpecNote::of(ALPN_POLICY, policy, &reading, &fix, Holds::Nothing)
            });
        }
    }
    let listeners = crate::aws::nlb::desired::listeners_of(spec, cloud);
    for (suffix, read) in crate::aws::nlb::desired::listener_attribute_settings(spec, &listeners) {
        if let Err(r) = read {
            let key = format!("{LISTENER_ATTRIBUTES_PREFIX}{suffix}");
            let value = &spec.listener_attributes[&suffix];
            notes.push(SpecNote {
                reason: SETTING_REFUSED,
                ..SpecNote::of(&key, value, &r.reading, &r.fix, Holds::Nothing)
            });
        }
    }
    notes
}

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

    /// [`Self::read`], with the cloud.conf values the Go CCM fails every NLB
    /// sync on refused for an NLB, and those it fails every Shared-mode
    /// health check on refused for a Service probed that way, as the
    /// Service's own values are.
    pub fn read_with(svc: &Service, cloud: &crate::cloud_config::CloudConfig) -> Reading {
        let mut reading = LoadBalancerSpec::read(svc);
        let refused = |r: &crate::cloud_config::RefusedValue| SpecError {
            field: format!("cloud.conf [Global] {}", r.key),
            value: r.value.clone(),
            allowed: format!("allowed: {}", r.allowed),
        };
        if reading.spec.kind == LoadBalancerKind::Network {
            reading
                .errors
                .extend(cloud.nlb_refusals.iter().map(refused));
        }
        if reading.spec.kind == LoadBalancerKind::Network && cloud.nlb_listener_settings {
            // Read with the key: no longer "not read".
            reading.notes.retain(|n| {
                let read_now =
                    n.field == ALPN_POLICY || n.field.starts_with(LISTENER_ATTRIBUTES_PREFIX);
                !(n.reason == NOT_READ && read_now)
            });
            reading
                .notes
                .extend(refused_nlb_settings(&reading.spec, cloud));
        }
        let shared_probe = cloud.health_probe_mode == crate::cloud_config::HealthProbeMode::Shared
            && reading.spec.local_health_check_node_port.is_none();
        if shared_probe {
            reading
                .errors
                .extend(cloud.shared_probe_refusals.iter().map(refused));
        }
        reading
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
        // The Go CCM answers ImplementedElsewhere before reading anything.
        if kind != LoadBalancerKind::External {
            for (row, name, value) in ANNOTATIONS
                .iter()
                .flat_map(|row| row.present(annotations).map(move |(k, v)| (row, k, v)))
            {
                if !row.applies.to(cx.is_nlb) {
                    if row.rejected_elsewhere {
                        errors.push(err(name, value, row.elsewhere()));
                    } else {
                        let reading = format!("ignored on a {kind}, as the Go CCM ignores it");
                        cx.note(name, value, &reading, "remove it", Holds::Nothing);
                    }
                    continue;
                }
                if let Err(e) = row.parse.apply(&mut out, &cx, name, value) {
                    errors.push(e);
                }
            }
            out.read_spec_fields(&spec, &cx, annotations, &mut errors);
            out.held_name = super::held_name(svc);
        }
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
        // A refused port stops the sync, but upkeep still needs the node
        // ports of the ports that have one.
        keep(check_ports(spec, cx.is_nlb));
        self.ports = node_ports(spec, cx.is_nlb);
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
            source_ranges: vec![Ipv4Net::default()],
            ..LoadBalancerSpec::default()
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

    /// AWS refuses a UDP target group that does not preserve client IPs,
    /// or that terminates unhealthy targets' connections.
    fn check_udp_keeps_client_ip(
        &self,
        annotations: &BTreeMap<String, String>,
    ) -> Result<(), SpecError> {
        use crate::aws::nlb::attributes::{PRESERVE_CLIENT_IP, TERMINATE_UNHEALTHY};
        let set = |key: &str| self.target_group_attributes.get(key).map(String::as_str);
        let refused = [(PRESERVE_CLIENT_IP, "false"), (TERMINATE_UNHEALTHY, "true")]
            .into_iter()
            .find(|(key, value)| set(key) == Some(*value));
        if let Some((key, value)) = refused
            && self.ports.iter().any(|p| p.protocol == "UDP")
        {
            return Err(err(
                TARGET_GROUP_ATTRIBUTES,
                annotations
                    .get(TARGET_GROUP_ATTRIBUTES)
                    .map(String::as_str)
                    .unwrap_or_default(),
                format!(
                    "{key} cannot be {value} with a UDP port (AWS refuses it); remove it or the UDP port"
                ),
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

/// Checks the protocols of the Service's ports, and warns of each port
/// without a node port (skipped, as upstream).
fn check_ports(spec: &ServiceSpec, is_nlb: bool) -> Result<(), SpecError> {
    let raw_ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = raw_ports.first() else {
        return Err(err(
            "spec.ports",
            "",
            "a load balancer needs at least one port",
        ));
    };
    let first = first.protocol.as_deref().unwrap_or("TCP");
    for (i, p) in raw_ports.iter().enumerate() {
        check_port_protocol(i, p.protocol.as_deref().unwrap_or("TCP"), first, is_nlb)?;
        if p.node_port.unwrap_or(0) == 0 {
            tracing::warn!(port = p.port, "ignoring a service port without a node port");
        }
    }
    Ok(())
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

pub(super) fn parse_cidrs(field: &str, values: &[String]) -> Result<Vec<Ipv4Net>, SpecError> {
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

/// The Go CCM makes an NLB for exactly `nlb`, leaves exactly `external` and
/// `nlb-ip` to another controller, and makes a Classic ELB for anything else.
fn parse_kind(cx: &Context<'_>, v: &str) -> LoadBalancerKind {
    match v {
        "" => LoadBalancerKind::Classic,
        "nlb" => LoadBalancerKind::Network,
        _ if external_type(v) => LoadBalancerKind::External,
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
                    Holds::New,
                ),
                None => cx.note(
                    TYPE,
                    other,
                    "read as a Classic ELB, as the Go CCM reads any value but nlb, external and nlb-ip",
                    "remove it for a Classic ELB, or write nlb for an NLB",
                    Holds::Nothing,
                ),
            }
            LoadBalancerKind::Classic
        }
    }
}

/// The Service's ports with a node port and a protocol this kind can carry:
/// every port with a node port when [`check_ports`] passes; when it refuses
/// one, what the upkeep of an existing load balancer keeps (a port the load
/// balancer cannot carry never had a listener).
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
