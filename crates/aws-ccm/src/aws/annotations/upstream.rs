//! What the Go CCM does with each annotation, value class by value class,
//! beside what this CCM does: the column `go` was read from
//! kubernetes/cloud-provider-aws (`aws.go`: `EnsureLoadBalancer`,
//! `UpdateLoadBalancer`, `buildListener`, `buildNLBHealthCheckConfiguration`;
//! `aws_loadbalancer.go`: `isNLB`, `isLBExternal`, `reconcileLBAttributes`,
//! `getExpectedHealthCheck`; `aws_validations.go`), not from memory.
//!
//! The unit tests (`upstream_tests.rs`) hold [`LoadBalancerSpec::read`] to the
//! `here` column of every row; docs/compatibility.md's "Annotation values"
//! section is generated from this table ([`compatibility_section`]).
//!
//! One rule decides `here`: a value the Go CCM takes or ignores is taken or
//! ignored the same way, with a Warning; a value it fails on is refused, and
//! the refusal stops only the change the value governs (an existing load
//! balancer keeps its backends and node rules current). Rows whose `why` is
//! not empty are where this CCM deliberately differs, and say why.

use super::table::Applies;
use super::*;

/// What a CCM does with a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Does {
    /// Applies it as written.
    Uses,
    /// Behaves as if the annotation were absent.
    Ignores,
    /// Behaves as if the annotation had this value.
    ReadsAs(&'static str),
    /// Refuses the sync (the Go CCM: `EnsureLoadBalancer` returns an error,
    /// or AWS refuses the call it makes).
    Fails,
}

impl Does {
    fn text(self) -> String {
        match self {
            Does::Uses => "uses it".into(),
            Does::Ignores => "ignores it".into(),
            Does::ReadsAs("") => "reads it as absent".into(),
            Does::ReadsAs(v) => format!("reads it as `{v}`"),
            Does::Fails => "fails".into(),
        }
    }
}

/// One value class of one annotation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Class {
    annotation: &'static str,
    /// documented, other case, unknown word, empty, malformed number, other kind, …
    class: &'static str,
    /// An example of the class (the tests read it).
    value: &'static str,
    /// The kind of load balancer the class is read on.
    on: Applies,
    /// Other annotations set beside it.
    with: &'static [(&'static str, &'static str)],
    go: Does,
    here: Does,
    /// Why `here` differs from `go`, or what else happens (empty: nothing).
    why: &'static str,
}

const fn c(
    annotation: &'static str,
    class: &'static str,
    value: &'static str,
    on: Applies,
    go: Does,
) -> Class {
    Class {
        annotation,
        class,
        value,
        on,
        with: &[],
        go,
        here: go,
        why: "",
    }
}

impl Class {
    const fn here(self, here: Does, why: &'static str) -> Class {
        Class { here, why, ..self }
    }

    const fn with(self, with: &'static [(&'static str, &'static str)]) -> Class {
        Class { with, ..self }
    }
}

use Applies::{Both, Clb, Nlb};
use Does::{Fails, Ignores, ReadsAs, Uses};

const CERT: &[(&str, &str)] = &[(SSL_CERT, "arn:aws:acm:us-east-1:123456789012:certificate/c")];
const EMPTY_NUMBER: &str = "an empty value is taken as unset (the Go CCM fails to parse it)";
const OTHER_KIND: &str = "other kind";
const INTERNAL_TRUE: &[(&str, &str)] = &[(INTERNAL, "true")];
const INTERNAL_FALSE: &[(&str, &str)] = &[(INTERNAL, "false")];
/// The AWS Load Balancer Controller's scheme where the Go CCM's reading
/// would make public what it asks to keep private.
const SCHEME_HELD: &str = "Warning `AnnotationNotRead`; a new Service gets no load balancer and an existing one is kept as it is (upkeep) until `aws-load-balancer-internal: \"true\"` is set or the key removed, where the Go CCM makes it internet-facing";
/// `deletion_protection.enabled=true`: opt-in, never written by the Go CCM.
const PROTECTED: &str = "protection, which the Go CCM lacks (cloud-provider-aws #1240): deleting the Service or changing its type keeps the load balancer, its listeners, target groups and own security group (docs/ownership.md); on an NLB AWS's deletion protection is set too";
/// An AWS Load Balancer Controller annotation neither CCM reads.
const NOT_READ_WHY: &str =
    "Warning `AnnotationNotRead`: an AWS Load Balancer Controller annotation";

/// Every value class this CCM was compared on, in the order of the
/// annotation table.
const CLASSES: &[Class] = &[
    c(TYPE, "documented", "nlb", Both, Uses),
    c(TYPE, "documented", "external", Both, Uses),
    c(TYPE, "documented", "nlb-ip", Both, Uses),
    c(TYPE, "empty", "", Both, Ignores),
    c(TYPE, "other case", "NLB", Both, ReadsAs("")).here(ReadsAs(""), "Warning; an existing load balancer is kept as the Classic ELB the Go CCM made, a new Service gets none until the value is fixed"),
    c(TYPE, "other case", "External", Both, ReadsAs("")).here(ReadsAs(""), "Warning; a new Service gets no load balancer until the value is fixed"),
    c(TYPE, "unknown word", "clb", Both, ReadsAs("")).here(ReadsAs(""), "Warning"),
    c(INTERNAL, "documented", "true", Both, Uses),
    c(INTERNAL, "documented", "false", Both, Uses),
    c(INTERNAL, "any other word", "0.0.0.0/0", Both, ReadsAs("true")),
    c(INTERNAL, "empty", "", Both, Ignores),
    c(SCHEME, "documented", "internal", Both, Ignores).here(Ignores, SCHEME_HELD),
    c(SCHEME, "documented", "internet-facing", Both, Ignores),
    c(SCHEME, "documented, with internal true", "internal", Both, Ignores).with(INTERNAL_TRUE),
    c(SCHEME, "disagrees with internal false", "internal", Both, Ignores).with(INTERNAL_FALSE).here(Ignores, SCHEME_HELD),
    c(SCHEME, "disagrees with internal true", "internet-facing", Both, Ignores).with(INTERNAL_TRUE).here(Ignores, "Warning `AnnotationNotRead`; internal, as `aws-load-balancer-internal` says"),
    c(SCHEME, "other case", "Internal", Both, Ignores).here(Ignores, SCHEME_HELD),
    c(SCHEME, "unknown word", "private", Both, Ignores).here(Ignores, "Warning `AnnotationNotRead`"),
    c(SCHEME, "empty", "", Both, Ignores).here(Ignores, "Warning `AnnotationNotRead`"),
    c(PROXY_PROTOCOL, "documented", "*", Clb, Uses),
    c(PROXY_PROTOCOL, "unknown word", "true", Clb, Fails),
    c(PROXY_PROTOCOL, "empty", "", Clb, Ignores),
    c(PROXY_PROTOCOL, OTHER_KIND, "*", Nlb, Ignores).here(Ignores, "Warning"),
    c(ACCESS_LOG_EMIT_INTERVAL, "documented", "60", Clb, Uses),
    c(ACCESS_LOG_EMIT_INTERVAL, "number AWS refuses", "10", Clb, Fails).here(Fails, "refused before the call AWS would refuse"),
    c(ACCESS_LOG_EMIT_INTERVAL, "malformed number", "five", Clb, Fails),
    c(ACCESS_LOG_EMIT_INTERVAL, OTHER_KIND, "5", Nlb, Ignores).here(Ignores, "Warning"),
    c(ACCESS_LOG_ENABLED, "documented", "true", Both, Uses),
    c(ACCESS_LOG_ENABLED, "other case", "TRUE", Both, Uses),
    c(ACCESS_LOG_ENABLED, "unknown word", "yes", Both, Fails),
    c(ACCESS_LOG_ENABLED, "empty", "", Both, Ignores),
    c(ACCESS_LOG_BUCKET, "documented", "logs-bucket", Both, Uses),
    c(ACCESS_LOG_BUCKET, "empty", "", Both, Ignores),
    c(ACCESS_LOG_PREFIX, "documented", "prod", Both, Uses),
    c(ACCESS_LOG_PREFIX, "empty", "", Both, Ignores),
    c(DRAINING_ENABLED, "documented", "true", Clb, Uses),
    c(DRAINING_ENABLED, "unknown word", "on", Clb, Fails),
    c(DRAINING_ENABLED, OTHER_KIND, "true", Nlb, Ignores).here(Ignores, "Warning"),
    c(DRAINING_TIMEOUT, "documented", "300", Clb, Uses),
    c(DRAINING_TIMEOUT, "malformed number", "5m", Clb, Fails),
    c(DRAINING_TIMEOUT, OTHER_KIND, "300", Nlb, Ignores).here(Ignores, "Warning"),
    c(IDLE_TIMEOUT, "documented", "120", Clb, Uses),
    c(IDLE_TIMEOUT, "malformed number", "2m", Clb, Fails),
    c(IDLE_TIMEOUT, OTHER_KIND, "120", Nlb, Ignores).here(Ignores, "Warning"),
    c(CROSS_ZONE, "documented", "true", Both, Uses),
    c(CROSS_ZONE, "Go boolean", "1", Both, ReadsAs("true")),
    c(CROSS_ZONE, "unknown word", "yes", Both, Fails),
    c(CROSS_ZONE, "empty", "", Both, Ignores),
    c(EXTRA_SECURITY_GROUPS, "documented", "sg-1,sg-2", Clb, Uses),
    c(EXTRA_SECURITY_GROUPS, "empty", "", Clb, Ignores),
    c(EXTRA_SECURITY_GROUPS, OTHER_KIND, "sg-1", Nlb, Fails),
    c(EXTRA_SECURITY_GROUPS, "other kind, empty", "", Nlb, Fails),
    c(SECURITY_GROUPS, "documented", "sg-1", Both, Uses),
    c(SECURITY_GROUPS, "list with blanks", "sg-1, ,sg-2", Both, ReadsAs("sg-1,sg-2")),
    c(SECURITY_GROUPS, "empty", "", Both, Ignores),
    c(SSL_CERT, "documented", "arn:aws:acm:us-east-1:123456789012:certificate/c", Both, Uses),
    c(SSL_CERT, "empty", "", Both, Ignores),
    c(SSL_PORTS, "documented", "443,https", Both, Uses),
    c(SSL_PORTS, "every port", "*", Both, Ignores),
    c(SSL_NEGOTIATION_POLICY, "documented", "ELBSecurityPolicy-TLS-1-2-2017-01", Both, Uses),
    c(BACKEND_PROTOCOL, "documented", "http", Both, Uses),
    c(BACKEND_PROTOCOL, "documented", "tcp", Both, Uses),
    c(BACKEND_PROTOCOL, "other case, no certificate", "HTTP", Clb, ReadsAs("tcp")).here(ReadsAs("tcp"), "Warning"),
    c(BACKEND_PROTOCOL, "other case, no certificate", "HTTPS", Clb, ReadsAs("ssl")).here(ReadsAs("ssl"), "Warning (TCP listeners, SSL health check)"),
    c(BACKEND_PROTOCOL, "unknown word, no certificate", "grpc", Clb, ReadsAs("tcp")).here(ReadsAs("tcp"), "Warning"),
    c(BACKEND_PROTOCOL, "other case, certificate", "HTTP", Clb, Fails).with(CERT),
    c(BACKEND_PROTOCOL, "documented, certificate", "https", Clb, Uses).with(CERT),
    c(BACKEND_PROTOCOL, "unknown word", "grpc", Nlb, Ignores).here(Ignores, "Warning"),
    c(BACKEND_PROTOCOL, "other case, certificate", "SSL", Nlb, Ignores).with(CERT).here(Ignores, "Warning"),
    c(BACKEND_PROTOCOL, "empty", "", Both, Ignores),
    c(ADDITIONAL_TAGS, "documented", "team=a,env=prod", Both, Uses),
    c(ADDITIONAL_TAGS, "key only", "team", Both, ReadsAs("team=")),
    c(ADDITIONAL_TAGS, "empty", "", Both, Ignores),
    c(ADDITIONAL_TAGS, "a tag AWS refuses", "aws:team=a,env=prod", Both, Fails).here(ReadsAs("env=prod"), "Warning `AnnotationValueTolerated`: the pair AWS refuses (the reserved `aws:` prefix, a key over 128 or a value over 256 characters, a character other than letters, digits, spaces and `_.:/=+-@`) is not applied and the others are, so it stops no other change; the Go CCM sends it and AWS refuses the create"),
    c(ADDITIONAL_TAGS, "a tag the controller writes", "kubernetes.io/service-name=other,team=a", Both, Uses).here(Uses, "Warning `AnnotationValueTolerated`: the controller's own value stays, as in the Go CCM, which writes its tags over the user's"),
    c(HC_PROTOCOL, "documented", "HTTP", Both, Uses),
    c(HC_PROTOCOL, "other case", "http", Both, ReadsAs("HTTP")),
    c(HC_PROTOCOL, "documented", "SSL", Clb, Uses),
    c(HC_PROTOCOL, "not on an NLB", "SSL", Nlb, Fails),
    c(HC_PROTOCOL, "unknown word", "ICMP", Both, Fails),
    c(HC_PORT, "documented", "traffic-port", Both, Uses),
    c(HC_PORT, "documented", "8080", Both, Uses),
    c(HC_PORT, "malformed number", "http", Both, Fails),
    c(HC_PATH, "documented", "/healthz", Both, Uses),
    c(HC_HEALTHY, "documented", "3", Both, Uses),
    c(HC_HEALTHY, "malformed number", "three", Both, Fails),
    c(HC_HEALTHY, "empty", "", Both, Fails).here(Ignores, EMPTY_NUMBER),
    c(HC_UNHEALTHY, "documented", "3", Both, Uses),
    c(HC_UNHEALTHY, "malformed number", "three", Both, Fails),
    c(HC_TIMEOUT, "documented", "5", Both, Uses),
    c(HC_TIMEOUT, "malformed number", "5s", Both, Fails),
    c(HC_INTERVAL, "documented", "30", Both, Uses),
    c(HC_INTERVAL, "malformed number", "abc", Both, Fails),
    c(HC_INTERVAL, "empty", "", Both, Fails).here(Ignores, EMPTY_NUMBER),
    c(EIP_ALLOCATIONS, "documented", "eipalloc-1,eipalloc-2", Nlb, Uses),
    c(EIP_ALLOCATIONS, OTHER_KIND, "eipalloc-1", Clb, Ignores).here(Ignores, "Warning"),
    c(PRIVATE_IPV4, "documented", "10.0.1.10", Nlb, Uses),
    c(PRIVATE_IPV4, "not an address", "ten", Nlb, Fails).here(Fails, "refused before the call AWS would refuse"),
    c(PRIVATE_IPV4, OTHER_KIND, "ten", Clb, Ignores).here(Ignores, "Warning"),
    c(TARGET_GROUP_ATTRIBUTES, "documented", "preserve_client_ip.enabled=false", Nlb, Uses),
    c(TARGET_GROUP_ATTRIBUTES, "documented, an attribute AWS documents", "deregistration_delay.timeout_seconds=10", Nlb, Fails).here(Uses, "applied: every target group attribute AWS documents for an NLB is taken, checked as AWS checks it; the Go CCM takes two and refuses the rest, so a Service carrying another had no load balancer synced"),
    c(TARGET_GROUP_ATTRIBUTES, "attribute AWS does not take on an NLB", "slow_start.duration_seconds=30", Nlb, Fails),
    c(TARGET_GROUP_ATTRIBUTES, "value AWS refuses", "deregistration_delay.timeout_seconds=4000", Nlb, Fails).here(Fails, "refused before the call AWS would refuse"),
    c(TARGET_GROUP_ATTRIBUTES, "unknown word", "proxy_protocol_v2.enabled=yes", Nlb, Fails),
    c(TARGET_GROUP_ATTRIBUTES, "set twice", "proxy_protocol_v2.enabled=true,proxy_protocol_v2.enabled=false", Nlb, ReadsAs("proxy_protocol_v2.enabled=false")).here(ReadsAs("proxy_protocol_v2.enabled=false"), "Warning"),
    c(TARGET_GROUP_ATTRIBUTES, "empty", "", Nlb, Ignores),
    c(TARGET_GROUP_ATTRIBUTES, OTHER_KIND, "preserve_client_ip.enabled=true", Clb, Fails),
    c(IP_ADDRESS_TYPE, "documented", "dualstack", Nlb, Ignores).here(Uses, "not a Go CCM annotation (cloud-provider-aws #1219): dual-stack NLBs are a feature of this CCM"),
    c(IP_ADDRESS_TYPE, "documented", "ipv4", Nlb, Ignores),
    c(IP_ADDRESS_TYPE, "unknown word", "ipv6", Nlb, Ignores).here(Ignores, "Warning"),
    c(IP_ADDRESS_TYPE, OTHER_KIND, "dualstack", Clb, Ignores).here(Ignores, "Warning"),
    c(TARGET_NODE_LABELS, "documented", "role=web", Both, Uses),
    c(TARGET_NODE_LABELS, "empty", "", Both, Ignores),
    c(SUBNETS, "documented", "subnet-1,subnet-2", Both, Uses),
    c(SUBNETS, "empty", "", Both, Fails),
    c(SUBNETS, "blanks only", " , ", Both, Fails),
    c(SOURCE_RANGES, "documented", "10.0.0.0/8", Both, Uses),
    c(SOURCE_RANGES, "host bits set", "10.0.0.1/8", Both, ReadsAs("10.0.0.0/8")),
    c(SOURCE_RANGES, "malformed CIDR", "10.0.0.0/33", Both, Fails),
    c(SOURCE_RANGES, "empty", "", Both, Ignores),
    c(NLB_TARGET_TYPE, "documented", "ip", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(NAME, "documented", "my-nlb", Both, Ignores).here(Uses, "looked up at sync: naming no load balancer this CCM kept, it gets the event `LoadBalancerNotAdopted` and the load balancer is named `a` + the UID, as by the Go CCM"),
    c(NAME, "a load balancer this CCM kept", "a0123456789abcdef0123456789abcde", Both, Ignores).here(Uses, "adopted: no new load balancer; see docs/ownership.md"),
    c(PROXY_PROTOCOL_PER_TARGET_GROUP, "documented", "80,443", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(HC_SUCCESS_CODES, "documented", "200-399", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(IPV6_ADDRESSES, "documented", "2600:1f13:837:8501::1", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(ALPN_POLICY, "documented", "HTTP2Preferred", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(LB_ATTRIBUTES, "documented", "deletion_protection.enabled=true", Both, Ignores).here(Uses, PROTECTED),
    c(LB_ATTRIBUTES, "documented", "deletion_protection.enabled=false", Both, Ignores).here(Uses, "an NLB's AWS deletion protection is turned off; nothing else changes"),
    c(LB_ATTRIBUTES, "other attribute", "access_logs.s3.enabled=true", Both, Ignores).here(Ignores, "Warning `AnnotationNotRead`: only deletion_protection.enabled is read"),
    c(LB_ATTRIBUTES, "unknown word", "deletion_protection.enabled=yes", Both, Ignores).here(Ignores, "Warning `AnnotationNotRead`"),
    c(LB_ATTRIBUTES, "empty", "", Both, Ignores),
    c(MANAGE_BACKEND_SG_RULES, "documented", "false", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(PRIVATE_LINK_SG_RULES, "documented", "off", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(SG_PREFIX_LISTS, "documented", "pl-00000000", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(LISTENER_ATTRIBUTES, "documented", "tcp.idle_timeout.seconds=400", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(MULTI_CLUSTER_TARGET_GROUP, "documented", "true", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(IPV6_SOURCE_NAT, "documented", "on", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(SOURCE_NAT_IPV6_PREFIXES, "documented", "auto", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(MIN_CAPACITY, "documented", "CapacityUnits=1000", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(ICMP_PATH_MTU, "documented", "on", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(TCP_UDP_LISTENER, "documented", "true", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(DISABLE_NLB_SG, "documented", "true", Both, Ignores).here(Ignores, NOT_READ_WHY),
    c(QUIC_PORTS, "documented", "443", Both, Ignores).here(Ignores, NOT_READ_WHY),
];

const DOC_BEGIN: &str = "<!-- annotation-values:begin -->";
const DOC_END: &str = "<!-- annotation-values:end -->";

/// docs/compatibility.md's "Annotation values" table, from [`CLASSES`].
fn compatibility_section() -> String {
    let mut out = String::from(DOC_BEGIN);
    out.push_str("\n\n| annotation | value class | example | on | Go CCM | here |\n| --- | --- | --- | --- | --- | --- |\n");
    for k in CLASSES {
        let short = k.annotation.trim_start_matches(PREFIX);
        let here = match (k.here == k.go, k.why) {
            (true, "") => "same".to_string(),
            (true, why) => format!("same; {why}"),
            (false, why) => format!("{}: {why}", k.here.text()),
        };
        let with = k
            .with
            .iter()
            .map(|(a, _)| format!(" (with `{}`)", a.trim_start_matches(PREFIX)))
            .collect::<String>();
        let example = if k.value.is_empty() {
            "(empty)".to_string()
        } else {
            format!("`{}`", k.value.replace('|', "\\|"))
        };
        out.push_str(&format!(
            "| `{short}` | {}{with} | {example} | {} | {} | {here} |\n",
            k.class,
            k.on.as_str(),
            k.go.text(),
        ));
    }
    out.push('\n');
    out.push_str(DOC_END);
    out
}

#[cfg(test)]
#[path = "upstream_tests.rs"]
mod tests;
