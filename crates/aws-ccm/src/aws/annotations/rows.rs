//! The row parsers of the annotation table: [`Parse`], the common shapes,
//! then the rows with their own function, in table order. Each reads one
//! annotation's value into the spec, or refuses it as the Go CCM does
//! ([`super::upstream`] says, value class by value class).

use std::collections::BTreeMap;

use super::LoadBalancerSpec as Spec;
use super::parse::{Context as Cx, parse_cidrs};
use super::*;

/// How a row reads its value (possibly empty) into the spec: the common
/// shapes by the spec field they set, the others by their own function.
/// An empty value means "not set" for flags, numbers and strings.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Parse {
    /// A string.
    Text(fn(&mut Spec) -> &mut Option<String>),
    /// strconv.ParseBool, which upstream uses.
    Flag(fn(&mut Spec) -> &mut bool),
    /// A whole number from the first bound to the second.
    Number(i32, i32, fn(&mut Spec) -> &mut Option<i32>),
    /// A comma-separated list ([`split_list`]).
    List(fn(&mut Spec) -> &mut Vec<String>),
    /// `k1=v1,k2=,k3` ([`parse_key_values`]).
    Pairs(fn(&mut Spec) -> &mut BTreeMap<String, String>),
    /// The spec so far, the context, the annotation key and its value.
    Own(fn(&mut Spec, &Cx<'_>, &str, &str) -> Result<(), SpecError>),
    /// An AWS Load Balancer Controller annotation this CCM does not read
    /// (nor does the Go CCM): any value gets a Warning saying so and what to
    /// do instead (the text).
    NotRead(&'static str),
}

impl Parse {
    /// Parses the value `v` of annotation `k` into the spec and validates it.
    pub(crate) fn apply(
        self,
        s: &mut Spec,
        cx: &Cx<'_>,
        k: &str,
        v: &str,
    ) -> Result<(), SpecError> {
        match self {
            Parse::Text(field) => *field(s) = (!v.is_empty()).then(|| v.to_string()),
            Parse::Flag(field) => {
                *field(s) = match v {
                    "1" | "t" | "T" | "TRUE" | "true" | "True" => true,
                    "" | "0" | "f" | "F" | "FALSE" | "false" | "False" => false,
                    _ => return Err(err(k, v, "allowed: true or false")),
                }
            }
            Parse::Number(min, max, field) => {
                *field(s) = (!v.is_empty())
                    .then(|| parse_int(k, v, min, max))
                    .transpose()?
            }
            Parse::List(field) => *field(s) = split_list(v),
            Parse::Pairs(field) => *field(s) = parse_key_values(v),
            Parse::Own(parse) => return parse(s, cx, k, v),
            Parse::NotRead(instead) => cx.not_read(
                k,
                v,
                "an AWS Load Balancer Controller annotation, which this CCM does not read (nor does the Go CCM): ignored",
                instead,
                Holds::Nothing,
            ),
        }
        Ok(())
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

// The rows with their own function, in table order. `read` reads the type first, as every
// other row may depend on it; its row only checks it is the same.

pub(crate) fn kind(s: &mut Spec, _: &Cx, _: &str, _: &str) -> Result<(), SpecError> {
    debug_assert!(s.kind != LoadBalancerKind::External);
    Ok(())
}

pub(crate) fn internal(s: &mut Spec, _: &Cx, _: &str, v: &str) -> Result<(), SpecError> {
    // Upstream: "false" is external, any other non-empty value internal.
    s.internal = !v.is_empty() && v != "false";
    Ok(())
}

/// The AWS Load Balancer Controller's scheme, which the Go CCM does not
/// read: it takes the scheme from `aws-load-balancer-internal` alone (read
/// before this row, in table order, into `s.internal`). Where that reading
/// would make public what this key keeps private, the more private reading
/// wins, never a silent exposure: `internal` without a true
/// `aws-load-balancer-internal` holds the change (a new Service gets no load
/// balancer, an existing one is kept as it is); `internet-facing` with it
/// stays internal. Where both agree, nothing is said.
pub(crate) fn scheme(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    let asked = v.trim();
    if asked.eq_ignore_ascii_case("internal") && !s.internal {
        cx.not_read(
            k,
            v,
            &format!("the Go CCM does not read it and, without {INTERNAL} set to a value other than false, makes the load balancer internet-facing; a new Service gets no load balancer until this is resolved, and an existing one is kept as it is (its backends and node rules kept current)"),
            &format!("set {INTERNAL}: \"true\" for an internal load balancer, or remove {k}"),
            Holds::Changes,
        );
    } else if asked.eq_ignore_ascii_case("internet-facing") && s.internal {
        cx.not_read(
            k,
            v,
            &format!(
                "ignored: {INTERNAL} makes the load balancer internal, as the Go CCM reads it"
            ),
            &format!("remove {k}, or remove {INTERNAL} for an internet-facing load balancer"),
            Holds::Nothing,
        );
    } else if !asked.eq_ignore_ascii_case("internal")
        && !asked.eq_ignore_ascii_case("internet-facing")
    {
        cx.not_read(
            k,
            v,
            &format!("not a scheme (internal or internet-facing): ignored; the scheme comes from {INTERNAL}, as in the Go CCM"),
            &format!("write internal or internet-facing, or remove {k}"),
            Holds::Nothing,
        );
    }
    Ok(())
}

pub(crate) fn proxy_protocol(s: &mut Spec, _: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    s.proxy_protocol = match v {
        "" => false,
        "*" => true,
        _ => return Err(err(k, v, "allowed: * (every backend port)")),
    };
    Ok(())
}

pub(crate) fn access_log_emit_interval(
    s: &mut Spec,
    _: &Cx,
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

pub(crate) fn ssl_ports(s: &mut Spec, _: &Cx, _: &str, v: &str) -> Result<(), SpecError> {
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

pub(crate) fn backend_protocol(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
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
                Holds::Nothing,
            );
            None
        }
    };
    Ok(())
}

pub(crate) fn hc_protocol(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
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

pub(crate) fn hc_port(s: &mut Spec, _: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    let allowed = "allowed: traffic-port or a port number from 1 to 65535";
    s.health_check.port = match v {
        "" => None,
        "traffic-port" => Some(HealthCheckPort::TrafficPort),
        _ => Some(HealthCheckPort::Port(
            parse_int(k, v, 1, 65535).map_err(|_| err(k, v, allowed))?,
        )),
    };
    Ok(())
}

pub(crate) fn private_ipv4(s: &mut Spec, _: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
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
/// Every attribute AWS documents for an NLB target group is taken, checked
/// as AWS checks it (`nlb::attributes`); upstream takes two and refuses the
/// rest.
pub(super) fn target_group_attributes(
    s: &mut Spec,
    cx: &Cx,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    let mut attributes = BTreeMap::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = item.split_once('=').unwrap_or((item, ""));
        if let Some(why) = crate::aws::nlb::attributes::refusal(name, value) {
            return Err(err(k, v, why));
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
                Holds::Nothing,
            );
        }
    }
    if let Some(why) = crate::aws::nlb::attributes::set_refusal(&attributes) {
        return Err(err(k, v, why));
    }
    s.target_group_attributes = attributes;
    Ok(())
}

/// Read as upstream reads it; a pair whose key the controller writes itself
/// (`kubernetes.io/cluster/...`, `kubernetes.io/service-name`, its records)
/// is refused with a Warning: the controller's value stays, as in the Go
/// CCM, whose own tags are written over the user's.
/// A pair AWS would refuse (its `Tag` rules) is not applied, with a
/// Warning: it governs only itself, so the rest of the sync goes on. The Go
/// CCM sends it, and its create fails.
pub(super) fn additional_tags(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    s.additional_tags = parse_key_values(v);
    s.additional_tags.retain(|key, value| {
        let Some(why) = crate::aws::tags::aws_refusal(key, value) else {
            return true;
        };
        cx.note(
            k,
            v,
            &format!("{why}: AWS refuses the tag, so it is not applied (the other pairs are); the Go CCM sends it, and its create fails"),
            "fix or remove the pair",
            Holds::Nothing,
        );
        false
    });
    let unrecorded: Vec<&str> = (s.additional_tags.keys())
        .filter(|key| key.contains(' '))
        .map(String::as_str)
        .collect();
    if cx.is_nlb && !unrecorded.is_empty() {
        cx.note(
            k,
            v,
            &format!("{}: applied, but a key with a space cannot be recorded in {} (space-separated), so removing it from the annotation will not remove it from the NLB", unrecorded.join(", "), crate::aws::tags::MANAGED_TAGS_TAG),
            "use a key without spaces",
            Holds::Nothing,
        );
    }
    let refused: Vec<&str> = s
        .additional_tags
        .keys()
        .map(String::as_str)
        .filter(|key| crate::aws::tags::is_controller_tag(key))
        .collect();
    if !refused.is_empty() {
        cx.note(
            k,
            v,
            &format!(
                "{} {} a tag the controller writes itself: its value stays the controller's (as in the Go CCM) and the pair is not applied to the load balancer, its listeners or target groups",
                refused.join(", "),
                if refused.len() == 1 { "is" } else { "are" }
            ),
            "remove the pair, or give the tag another key",
            Holds::Nothing,
        );
    }
    Ok(())
}

/// The AWS Load Balancer Controller's ALPN policy, which the Go CCM does
/// not read: noted as not read, as before; an NLB keeps the value, which
/// cloud.conf `NLBListenerSettings = true` reads instead of the note
/// (`parse::refused_nlb_settings`).
pub(crate) fn alpn_policy(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    cx.not_read(
        k,
        v,
        "an AWS Load Balancer Controller annotation, which this CCM does not read (nor does the Go CCM): ignored",
        "this CCM sets none (AWS's default) unless cloud.conf [Global] NLBListenerSettings = true",
        Holds::Nothing,
    );
    if cx.is_nlb && !v.trim().is_empty() {
        s.alpn_policy = Some(v.trim().to_string());
    }
    Ok(())
}

/// The AWS Load Balancer Controller's listener attributes, which the Go
/// CCM does not read: as [`alpn_policy`], noted as not read and kept on an
/// NLB for cloud.conf `NLBListenerSettings = true`.
pub(crate) fn listener_attributes(
    s: &mut Spec,
    cx: &Cx,
    k: &str,
    v: &str,
) -> Result<(), SpecError> {
    cx.not_read(
        k,
        v,
        "an AWS Load Balancer Controller annotation, which this CCM does not read (nor does the Go CCM): ignored",
        "this CCM sets no listener attributes (AWS's defaults) unless cloud.conf [Global] NLBListenerSettings = true",
        Holds::Nothing,
    );
    if cx.is_nlb
        && let Some(suffix) = k.strip_prefix(LISTENER_ATTRIBUTES_PREFIX)
    {
        s.listener_attributes
            .insert(suffix.to_string(), v.trim().to_string());
    }
    Ok(())
}

/// The AWS Load Balancer Controller's load balancer attributes: this CCM
/// reads `deletion_protection.enabled` alone. A value it cannot read, or
/// another key, gets a Warning and changes nothing: the Go CCM reads none
/// of the key, so neither refuses the sync.
pub(crate) fn lb_attributes(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    let pairs = parse_key_values(v);
    let others: Vec<&str> = (pairs.keys())
        .map(String::as_str)
        .filter(|key| *key != DELETION_PROTECTION)
        .collect();
    if !others.is_empty() {
        cx.not_read(
            k,
            v,
            &format!("this CCM reads only {DELETION_PROTECTION} of it; {} ignored (an AWS Load Balancer Controller setting, which the Go CCM does not read either)", others.join(", ")),
            "use aws-load-balancer-access-log-enabled, -access-log-s3-bucket-name, -access-log-s3-bucket-prefix and aws-load-balancer-cross-zone-load-balancing-enabled for those",
            Holds::Nothing,
        );
    }
    match pairs.get(DELETION_PROTECTION).map(|v| v.trim()) {
        None => {}
        Some("true") => s.deletion_protection = Some(true),
        Some("false") => s.deletion_protection = Some(false),
        Some(other) => cx.not_read(
            k,
            v,
            &format!("{DELETION_PROTECTION}={other:?} is neither true nor false: ignored, the load balancer's protection is left as it is"),
            &format!("write {DELETION_PROTECTION}=true or {DELETION_PROTECTION}=false"),
            Holds::Nothing,
        ),
    }
    Ok(())
}

pub(crate) fn ip_address_type(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
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
                Holds::Nothing,
            );
            false
        }
    };
    Ok(())
}

pub(crate) fn subnets(s: &mut Spec, _: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
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
pub(crate) fn source_ranges(s: &mut Spec, cx: &Cx, k: &str, v: &str) -> Result<(), SpecError> {
    if cx.spec_has_source_ranges {
        return Ok(());
    }
    let list = split_list(v);
    if !list.is_empty() {
        s.source_ranges = parse_cidrs(k, &list)?;
    }
    Ok(())
}
