//! The annotation table: what each annotation means (docs/annotations.md is
//! generated from it) and how its value is parsed ([`Parse`]).

use super::rows::{self as parse, Parse};
use super::*;

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
    /// Whether the row is read on this kind of load balancer.
    pub fn to(self, is_nlb: bool) -> bool {
        match self {
            Applies::Both => true,
            Applies::Clb => !is_nlb,
            Applies::Nlb => is_nlb,
        }
    }

    #[cfg(test)]
    pub fn as_str(self) -> &'static str {
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
    /// Parses a present value (possibly empty) into the spec and validates it.
    pub parse: Parse,
}

impl AnnotationDef {
    /// The row, with a value on the other LB type refused, as upstream does
    /// (a [`row`] ignores it, with a note).
    const fn rejected_elsewhere(self) -> AnnotationDef {
        AnnotationDef {
            rejected_elsewhere: true,
            ..self
        }
    }

    /// Why a value on the other kind is refused (`rejected_elsewhere`).
    pub fn elsewhere(&self) -> &'static str {
        match self.applies {
            Applies::Nlb => {
                "only supported on an NLB (aws-load-balancer-type: nlb), as the Go CCM requires; remove it for a classic ELB"
            }
            _ => "not supported on an NLB, as the Go CCM refuses it there too; remove it",
        }
    }
}

/// A row whose value on the other LB type is ignored, with a note.
const fn row(
    name: &'static str,
    kind: &'static str,
    default: &'static str,
    applies: Applies,
    meaning: &'static str,
    parse: Parse,
) -> AnnotationDef {
    AnnotationDef {
        name,
        kind,
        default,
        applies,
        rejected_elsewhere: false,
        meaning,
        parse,
    }
}

/// Every annotation the service controller reads.
pub const ANNOTATIONS: &[AnnotationDef] = &[
    row(
        TYPE,
        "`nlb`, `external`, `nlb-ip`",
        "classic ELB",
        Applies::Both,
        "`nlb` provisions a Network Load Balancer; `external` and `nlb-ip` leave the Service to another controller (AWS Load Balancer Controller). Cannot change once the load balancer exists.",
        Parse::Own(parse::kind),
    ),
    row(
        INTERNAL,
        "string",
        "internet-facing",
        Applies::Both,
        "Any value but `false` makes the load balancer internal (scheme `internal`). Changing it recreates the load balancer.",
        Parse::Own(parse::internal),
    ),
    row(
        PROXY_PROTOCOL,
        "`*`",
        "-",
        Applies::Clb,
        "`*` enables proxy protocol v1 on every backend port (policy `k8s-proxyprotocol-enabled`).",
        Parse::Own(parse::proxy_protocol),
    ),
    row(
        ACCESS_LOG_EMIT_INTERVAL,
        "integer (5 or 60)",
        "60",
        Applies::Clb,
        "Minutes between access log publications.",
        Parse::Own(parse::access_log_emit_interval),
    ),
    row(
        ACCESS_LOG_ENABLED,
        "boolean",
        "false",
        Applies::Both,
        "Enables access logs.",
        Parse::Flag(|s| &mut s.access_log_enabled),
    ),
    row(
        ACCESS_LOG_BUCKET,
        "string",
        "-",
        Applies::Both,
        "S3 bucket for access logs.",
        Parse::Text(|s| &mut s.access_log_bucket),
    ),
    row(
        ACCESS_LOG_PREFIX,
        "string",
        "-",
        Applies::Both,
        "Key prefix for access logs in the bucket.",
        Parse::Text(|s| &mut s.access_log_prefix),
    ),
    row(
        DRAINING_ENABLED,
        "boolean",
        "false",
        Applies::Clb,
        "Enables connection draining.",
        Parse::Flag(|s| &mut s.draining_enabled),
    ),
    row(
        DRAINING_TIMEOUT,
        "integer (seconds)",
        "300 (AWS)",
        Applies::Clb,
        "Connection draining timeout.",
        Parse::Number(1, 3600, |s| &mut s.draining_timeout),
    ),
    row(
        IDLE_TIMEOUT,
        "integer (seconds)",
        "60",
        Applies::Clb,
        "Idle connection timeout.",
        Parse::Number(1, 4000, |s| &mut s.idle_timeout),
    ),
    row(
        CROSS_ZONE,
        "boolean",
        "false",
        Applies::Both,
        "Enables cross-zone load balancing.",
        Parse::Flag(|s| &mut s.cross_zone),
    ),
    row(
        EXTRA_SECURITY_GROUPS,
        "comma-separated group IDs",
        "-",
        Applies::Clb,
        "Groups added to the load balancer besides its own (rejected on an NLB, as upstream).",
        Parse::List(|s| &mut s.extra_security_groups),
    )
    .rejected_elsewhere(),
    row(
        SECURITY_GROUPS,
        "comma-separated group IDs",
        "-",
        Applies::Both,
        "Groups that replace the owned `k8s-elb-<name>` group; the controller does not change their rules.",
        Parse::List(|s| &mut s.security_groups),
    ),
    row(
        SSL_CERT,
        "certificate ARN",
        "-",
        Applies::Both,
        "Certificate for TLS listeners (SSL/HTTPS on a CLB, TLS on an NLB) on the `ssl-ports`.",
        Parse::Text(|s| &mut s.ssl_cert),
    ),
    row(
        SSL_PORTS,
        "`*` or comma-separated port numbers and names",
        "`*`",
        Applies::Both,
        "Ports that get the certificate.",
        Parse::Own(parse::ssl_ports),
    ),
    row(
        SSL_NEGOTIATION_POLICY,
        "predefined ELB security policy name",
        "AWS default",
        Applies::Both,
        "Security policy of the TLS listeners (CLB policy `k8s-SSLNegotiationPolicy-<name>`).",
        Parse::Text(|s| &mut s.ssl_negotiation_policy),
    ),
    row(
        BACKEND_PROTOCOL,
        "`http`, `https`, `ssl`, `tcp`",
        "`tcp`",
        Applies::Both,
        "Protocol to the backends. With a certificate: `http`/`https` give HTTPS listeners, `ssl`/`tcp` SSL listeners; without one, `http` gives HTTP listeners.",
        Parse::Own(parse::backend_protocol),
    ),
    row(
        ADDITIONAL_TAGS,
        "comma-separated `key=value`",
        "-",
        Applies::Both,
        "Extra tags on the load balancer and its owned security group.",
        Parse::Pairs(|s| &mut s.additional_tags),
    ),
    row(
        HC_PROTOCOL,
        "`TCP`, `HTTP`, `HTTPS`, `SSL`",
        "`TCP` (`HTTP` for `externalTrafficPolicy: Local`)",
        Applies::Both,
        "Health check protocol.",
        Parse::Own(parse::hc_protocol),
    ),
    row(
        HC_PORT,
        "`traffic-port` or a port number",
        "`traffic-port` (`healthCheckNodePort` for Local)",
        Applies::Both,
        "Health check port.",
        Parse::Own(parse::hc_port),
    ),
    row(
        HC_PATH,
        "string",
        "`/` (`/healthz` for Local)",
        Applies::Both,
        "Health check path for HTTP/HTTPS checks.",
        Parse::Text(|s| &mut s.health_check.path),
    ),
    row(
        HC_HEALTHY,
        "integer (2-10)",
        "2 (CLB), 3 (NLB)",
        Applies::Both,
        "Consecutive successes before a backend is healthy.",
        Parse::Number(2, 10, |s| &mut s.health_check.healthy_threshold),
    ),
    row(
        HC_UNHEALTHY,
        "integer (2-10)",
        "6 (CLB), 3 (NLB)",
        Applies::Both,
        "Consecutive failures before a backend is unhealthy.",
        Parse::Number(2, 10, |s| &mut s.health_check.unhealthy_threshold),
    ),
    row(
        HC_TIMEOUT,
        "integer (seconds, 2-60)",
        "5 (CLB), 10 (NLB)",
        Applies::Both,
        "Health check timeout; must be less than the interval.",
        Parse::Number(2, 120, |s| &mut s.health_check.timeout),
    ),
    row(
        HC_INTERVAL,
        "integer (seconds, 5-300)",
        "10 (CLB), 30 (NLB)",
        Applies::Both,
        "Seconds between health checks.",
        Parse::Number(5, 300, |s| &mut s.health_check.interval),
    ),
    row(
        EIP_ALLOCATIONS,
        "comma-separated allocation IDs",
        "-",
        Applies::Nlb,
        "Elastic IPs of an internet-facing NLB, one per subnet (ignored on a CLB, as upstream).",
        Parse::List(|s| &mut s.eip_allocations),
    ),
    row(
        PRIVATE_IPV4,
        "comma-separated IPv4 addresses",
        "-",
        Applies::Nlb,
        "Private addresses of an internal NLB, one per subnet (ignored on a CLB, as upstream).",
        Parse::Own(parse::private_ipv4),
    ),
    row(
        TARGET_GROUP_ATTRIBUTES,
        "comma-separated `key=value`",
        "-",
        Applies::Nlb,
        "NLB target group attributes `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled` (rejected on a CLB, as upstream).",
        Parse::Own(parse::target_group_attributes),
    )
    .rejected_elsewhere(),
    row(
        IP_ADDRESS_TYPE,
        "`ipv4`, `dualstack`",
        "`ipv4`",
        Applies::Nlb,
        "`dualstack` gives the NLB IPv4 and IPv6 addresses (its subnets need IPv6 CIDRs). Not in the Go CCM (cloud-provider-aws #1219), which ignores it; ignored on a CLB.",
        Parse::Own(parse::ip_address_type),
    ),
    row(
        TARGET_NODE_LABELS,
        "comma-separated `key=value`, `key=` or `key`",
        "all nodes",
        Applies::Both,
        "Only nodes with all these labels are backends. `key` and `key=` mean \"the label exists, any value\"; `key=value` wants that value. Pairs are trimmed, the text around `=` is not. Same as the Go CCM.",
        Parse::Pairs(|s| &mut s.target_node_labels),
    ),
    row(
        SUBNETS,
        "comma-separated subnet IDs or Name tags",
        "auto-discovered",
        Applies::Both,
        "Subnets of the load balancer. Without it: one subnet per zone in the VPC, tagged for this cluster or no cluster, preferring `kubernetes.io/role/elb` (internet-facing) or `kubernetes.io/role/internal-elb` (internal), then the cluster tag, then the lowest ID.",
        Parse::Own(parse::subnets),
    ),
    row(
        SOURCE_RANGES,
        "comma-separated IPv4 CIDRs",
        "`0.0.0.0/0`",
        Applies::Both,
        "Client ranges allowed in; `spec.loadBalancerSourceRanges` takes precedence.",
        Parse::Own(parse::source_ranges),
    ),
];
