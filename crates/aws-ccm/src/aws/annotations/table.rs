//! The annotation table: what each annotation means (docs/annotations.md is
//! generated from it) and how its value is parsed ([`Parse`]).

use std::ops::Bound;

use super::rows::{self as parse, Parse};
use super::*;

/// Which load balancer types an annotation affects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applies {
    Both,
    /// Classic ELB only; rejected on an NLB when upstream rejects it.
    Clb,
    /// NLB only; rejected on a CLB when upstream rejects it.
    Nlb,
}

impl Applies {
    /// Whether the row is read on this kind of load balancer.
    pub(crate) fn to(self, is_nlb: bool) -> bool {
        match self {
            Applies::Both => true,
            Applies::Clb => !is_nlb,
            Applies::Nlb => is_nlb,
        }
    }

    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
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
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the generated annotation reference, a unit test"
        )
    )]
    pub(crate) kind: &'static str,
    /// Default when absent (`-` for none).
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the generated annotation reference, a unit test"
        )
    )]
    pub(crate) default: &'static str,
    pub(crate) applies: Applies,
    /// Whether a value on the other LB type is rejected (as upstream does) or ignored.
    pub(crate) rejected_elsewhere: bool,
    #[cfg_attr(
        not(test),
        expect(
            dead_code,
            reason = "read by the generated annotation reference, a unit test"
        )
    )]
    pub(crate) meaning: &'static str,
    /// Parses a present value (possibly empty) into the spec and validates it.
    pub(crate) parse: Parse,
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

    /// The row's keys present in `annotations`, with their values: its
    /// name, or every key a pattern row (`...listener-attributes.*`) matches.
    pub(crate) fn present<'a>(
        &self,
        annotations: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = (&'a str, &'a str)> {
        let prefix = self.name.strip_suffix('*');
        let exact = prefix
            .is_none()
            .then(|| annotations.get_key_value(self.name))
            .flatten();
        let matched = prefix.into_iter().flat_map(move |p| {
            annotations
                .range::<str, _>((Bound::Included(p), Bound::Unbounded))
                .take_while(move |(k, _)| k.starts_with(p))
        });
        exact
            .into_iter()
            .chain(matched)
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Why a value on the other kind is refused (`rejected_elsewhere`).
    pub(crate) fn elsewhere(&self) -> &'static str {
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

/// An AWS Load Balancer Controller annotation this CCM does not read, nor
/// does the Go CCM: known by name so that a value gets one Warning saying
/// so (`meaning`: what it asks that controller for; `instead`: what this
/// CCM does, or which of its annotations does the same).
const fn not_read(
    name: &'static str,
    kind: &'static str,
    meaning: &'static str,
    instead: &'static str,
) -> AnnotationDef {
    row(
        name,
        kind,
        "-",
        Applies::Both,
        meaning,
        Parse::NotRead(instead),
    )
}

/// Every annotation the service controller reads, then the AWS Load
/// Balancer Controller's that it knows by name and does not read.
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
        SCHEME,
        "`internal`, `internet-facing`",
        "from `aws-load-balancer-internal`",
        Applies::Both,
        "The AWS Load Balancer Controller's scheme. The Go CCM does not read it: it takes the scheme from `aws-load-balancer-internal` alone, so `internal` without that key would give an internet-facing load balancer. Here that is never done silently: a new Service gets no load balancer and an existing one is kept as it is (its backends and node rules kept current), with a Warning `AnnotationNotRead` naming both keys, until `aws-load-balancer-internal: \"true\"` is set or this key removed. With both keys, the more private reading wins: `internal` beside `aws-load-balancer-internal: \"false\"` is held the same way; `internet-facing` beside a true `aws-load-balancer-internal` stays internal, with a Warning. `internet-facing` alone is the Go CCM's default: nothing is said. Another value: a Warning, ignored.",
        Parse::Own(parse::scheme),
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
        "Extra tags on the load balancer and its owned security group; on an NLB also its listeners and target groups, kept following the annotation: a pair added or changed is written to the live NLB, its listeners and target groups, and a key removed from the annotation is removed from them when the record `kubernetes.io/cloud-controller/managed-tags` (upstream's, from cloud-provider-aws PR #1447) says the controller applied it; other tags are never removed. A key the controller writes itself (`kubernetes.io/cluster/...`, `kubernetes.io/service-name`, `KubernetesCluster`, `aws-ccm/...`, the record) is refused with a Warning and keeps the controller's value. A pair AWS would refuse (the reserved `aws:` prefix, a key over 128 or a value over 256 characters, a character other than letters, digits, spaces and `_.:/=+-@`) is not applied, with a Warning; the others are.",
        Parse::Own(parse::additional_tags),
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
        "Health check timeout; on a CLB it must be less than the interval. On an NLB the Go CCM parses it (a non-number fails the sync) but never sends it: this CCM sends it only with cloud.conf `NLBListenerSettings = true`, at most the interval (a larger one is not sent, with Warning `NLBSettingRefused`; the rest of the NLB syncs), at CreateTargetGroup and in place by ModifyTargetGroup; the timeout applied is recorded in the target group's tag `aws-ccm/health-check-timeout`, and only a recorded one returns to AWS's default (6 s for an HTTP check, 10 s otherwise) when the annotation is removed.",
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
        "NLB target group attributes, on every target group: any AWS documents for an NLB (`deregistration_delay.timeout_seconds`, `deregistration_delay.connection_termination.enabled`, `stickiness.enabled`, `stickiness.type`, `proxy_protocol_v2.enabled`, `preserve_client_ip.enabled`, `load_balancing.cross_zone.enabled`, `target_group_health.*`, `target_health_state.unhealthy.*`), keys and values checked as AWS checks them before any call; the Go CCM takes only `preserve_client_ip.enabled` and `proxy_protocol_v2.enabled` and refuses the rest. A key this CCM applied (recorded in the target group's tag `aws-ccm/target-group-attributes`) returns to AWS's default when the annotation drops it; a value nobody recorded (set by the Go CCM or by hand) is left as it is, as the Go CCM leaves it. Rejected on a CLB, as upstream.",
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
    not_read(
        NLB_TARGET_TYPE,
        "`instance`, `ip`",
        "AWS Load Balancer Controller: the NLB's target type.",
        "this CCM's NLB targets are always the nodes' instances on the node port (instance); ip targets need that controller (aws-load-balancer-type: external)",
    ),
    row(
        NAME,
        "string",
        "`a` + the Service UID",
        Applies::Both,
        "The AWS Load Balancer Controller's key, read for one thing only: adopting a load balancer this CCM kept (see `aws-load-balancer-attributes`). When it names a classic ELB (or, with `aws-load-balancer-type: nlb`, an NLB) that carries this cluster's `owned` tag and this CCM's `aws-ccm/kept` tag, and the Service has no load balancer of its own, the Service adopts it: no new load balancer, the same DNS name and Elastic IPs; its tags then name the Service (`kubernetes.io/service-name`, `aws-ccm/adopted`) and its listeners, target groups and node rules are brought to what the Service asks. Any other value names nothing this CCM made: Warning `LoadBalancerNotAdopted` saying why, and the load balancer is named `a` + the Service UID as by the Go CCM, which ignores the key. Removing the key after an adoption keeps the adopted load balancer (found by the Service's status and proven by those tags), never a second one. See docs/ownership.md.",
        Parse::Text(|s| &mut s.adopt_name),
    ),
    not_read(
        PROXY_PROTOCOL_PER_TARGET_GROUP,
        "comma-separated ports",
        "AWS Load Balancer Controller: proxy protocol v2 on these ports' target groups only.",
        "on an NLB use aws-load-balancer-target-group-attributes: proxy_protocol_v2.enabled=true (every target group); on a classic ELB aws-load-balancer-proxy-protocol: \"*\"",
    ),
    not_read(
        HC_SUCCESS_CODES,
        "HTTP codes",
        "AWS Load Balancer Controller: the codes an HTTP(S) health check takes as healthy.",
        "this CCM, as the Go CCM, leaves them at AWS's default",
    ),
    not_read(
        IPV6_ADDRESSES,
        "comma-separated IPv6 addresses",
        "AWS Load Balancer Controller: the NLB's IPv6 address in each subnet.",
        "with aws-load-balancer-ip-address-type: dualstack AWS assigns them",
    ),
    row(
        ALPN_POLICY,
        "`HTTP1Only`, `HTTP2Only`, `HTTP2Optional`, `HTTP2Preferred`, `None`",
        "-",
        Applies::Both,
        "AWS Load Balancer Controller: the ALPN policy of the NLB's TLS listeners. The Go CCM does not read it; nor does this CCM without cloud.conf `NLBListenerSettings = true` (Warning `AnnotationNotRead`, as before). With the key, on an NLB, it is sent at CreateListener and in place by ModifyListener on every TLS listener and recorded in the NLB's tag `aws-ccm/alpn-policy`; removing it returns the TLS listeners to AWS's `None` only when so recorded (a policy set by hand is left). A value AWS does not take, or an NLB without a TLS listener, gets Warning `NLBSettingRefused` and only the policy is left as it is. Not read on a CLB.",
        Parse::Own(parse::alpn_policy),
    ),
    row(
        LB_ATTRIBUTES,
        "comma-separated `key=value`",
        "-",
        Applies::Both,
        "Only `deletion_protection.enabled` (`true` or `false`) is read (the AWS Load Balancer Controller's key; the Go CCM reads none of it). `true` protects the load balancer: when the Service is deleted or stops being `type: LoadBalancer`, the load balancer, its listeners, target groups and own security group are kept (its node targets and node security-group rules are removed, as the Service's node ports are released) and tagged `aws-ccm/kept`; on an NLB AWS's `deletion_protection.enabled` attribute is set too. On a classic ELB, which has no such attribute, the key is the marker alone. `false`, or removing `true` from an NLB this CCM protected, turns AWS's attribute off. Other keys are not read (Warning `AnnotationNotRead`); see docs/ownership.md.",
        Parse::Own(parse::lb_attributes),
    ),
    not_read(
        MANAGE_BACKEND_SG_RULES,
        "boolean",
        "AWS Load Balancer Controller: whether it writes the node groups' rules.",
        "node rules follow cloud.conf DisableSecurityGroupIngress",
    ),
    not_read(
        PRIVATE_LINK_SG_RULES,
        "`on`, `off`",
        "AWS Load Balancer Controller: whether the NLB's security group rules apply to PrivateLink traffic.",
        "this CCM does not set it (AWS's default)",
    ),
    not_read(
        SG_PREFIX_LISTS,
        "comma-separated prefix list IDs",
        "AWS Load Balancer Controller: managed prefix lists allowed in.",
        "give the client CIDRs in service.beta.kubernetes.io/load-balancer-source-ranges or spec.loadBalancerSourceRanges",
    ),
    row(
        LISTENER_ATTRIBUTES,
        "comma-separated `key=value`: `tcp.idle_timeout.seconds=<60..6000>`",
        "-",
        Applies::Both,
        "AWS Load Balancer Controller: attributes of the NLB listener `<protocol>-<port>` (keys such as `...listener-attributes.TCP-80`). The Go CCM does not read them; nor does this CCM without cloud.conf `NLBListenerSettings = true` (Warning `AnnotationNotRead`, as before). With the key, on an NLB's TCP listener, `tcp.idle_timeout.seconds` is sent by ModifyListenerAttributes (after CreateListener for a new listener) and recorded in the NLB's tag `aws-ccm/listener-attributes`; an attribute no longer asked for returns to AWS's default (350 s) only when so recorded (a value set by hand is left). Another key, a value out of range, a listener that is not TCP, or one the Service does not have gets Warning `NLBSettingRefused` and only that listener's attributes are left as they are. Not read on a CLB.",
        Parse::Own(parse::listener_attributes),
    ),
    not_read(
        MULTI_CLUSTER_TARGET_GROUP,
        "boolean",
        "AWS Load Balancer Controller: target groups shared with other clusters.",
        "this CCM's target groups hold exactly this cluster's backend nodes (other targets are deregistered)",
    ),
    not_read(
        IPV6_SOURCE_NAT,
        "`on`, `off`",
        "AWS Load Balancer Controller: IPv6 source NAT prefixes on a dual-stack NLB.",
        "this CCM does not set them",
    ),
    not_read(
        SOURCE_NAT_IPV6_PREFIXES,
        "comma-separated IPv6 prefixes",
        "AWS Load Balancer Controller: the IPv6 source NAT prefix of each subnet.",
        "this CCM does not set them",
    ),
    not_read(
        MIN_CAPACITY,
        "`key=value`",
        "AWS Load Balancer Controller: the load balancer's minimum capacity reservation.",
        "this CCM reserves none",
    ),
    not_read(
        ICMP_PATH_MTU,
        "`on`",
        "AWS Load Balancer Controller: an ICMP rule for path MTU discovery.",
        "this CCM already admits ICMP 3/4 for path MTU in an NLB's node rules, as the Go CCM",
    ),
    not_read(
        TCP_UDP_LISTENER,
        "boolean",
        "AWS Load Balancer Controller: one TCP_UDP listener for a port with TCP and UDP.",
        "this CCM makes one TCP_UDP listener for such a port without it",
    ),
    not_read(
        DISABLE_NLB_SG,
        "boolean",
        "AWS Load Balancer Controller: no security group on the NLB.",
        "an NLB gets a security group here only with cloud.conf NLBSecurityGroupMode = Managed",
    ),
    not_read(
        QUIC_PORTS,
        "comma-separated ports",
        "AWS Load Balancer Controller: QUIC listeners on these UDP ports.",
        "this CCM makes UDP listeners for them",
    ),
];
