//! The record of what this CCM applied to a load balancer when it created it:
//! the settings AWS takes only at creation (type, scheme, an NLB's subnets
//! and pinned addresses), kept in the tag [`tags::APPLIED_TAG`] on the load
//! balancer.
//!
//! A load balancer is deleted and recreated for such a setting only when the
//! Service now asks for something other than the record says was applied.
//! The Go CCM reads these annotations only at creation, so on a cluster it ran
//! they often differ from the load balancer without anyone asking for a
//! change: a load balancer without the record (made by the Go CCM, or by an
//! older aws-ccm) is never deleted for a difference; the Service gets a
//! Warning event instead. The record is written only in the create call, so
//! adopting a Go-made load balancer changes nothing in AWS.
//!
//! The value fits the ELB tag rules (at most 256 characters of letters,
//! digits, spaces and `_.:/=+-@`): `v1 type=nlb scheme=internal
//! subnets=<sha1:10> addresses=<sha1:10>|none`.

use std::collections::{BTreeMap, BTreeSet};

use sha1::{Digest, Sha1};

use super::tags;

/// Event reason: a create-time setting differs from what the Service asks
/// for, and the load balancer is left as it is.
pub(crate) const DRIFT_REASON: &str = "LoadBalancerSettingNotApplied";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Classic,
    Network,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Classic => "clb",
            Kind::Network => "nlb",
        }
    }
}

/// The create-time settings of one load balancer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Applied {
    kind: Kind,
    pub(crate) internal: bool,
    /// NLB: digest of the subnet IDs (sorted).
    pub(crate) subnets: Option<String>,
    /// NLB: digest of the pinned addresses (subnet, EIP allocation, private
    /// IPv4, in the annotation's order); `none` without pinned addresses.
    pub(crate) addresses: Option<String>,
}

/// The first 10 hex digits of the SHA-1 over `parts`, each ended by a newline.
pub(crate) fn digest<'a>(parts: impl IntoIterator<Item = &'a str>) -> String {
    let mut h = Sha1::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\n");
    }
    hex::encode(h.finalize())[..10].to_string()
}

impl Applied {
    pub(crate) fn classic(internal: bool) -> Applied {
        Applied {
            kind: Kind::Classic,
            internal,
            subnets: None,
            addresses: None,
        }
    }

    /// An NLB's record: `subnets` in any order; `addresses` the pinned
    /// mappings as text in order, or `None` when nothing is pinned.
    pub(crate) fn network(
        internal: bool,
        subnets: &[String],
        addresses: Option<&[String]>,
    ) -> Applied {
        let sorted: BTreeSet<&str> = subnets.iter().map(String::as_str).collect();
        let addresses = addresses.map(|a| digest(a.iter().map(String::as_str)));
        Applied {
            kind: Kind::Network,
            internal,
            subnets: Some(digest(sorted)),
            addresses: Some(addresses.unwrap_or_else(|| "none".to_string())),
        }
    }

    /// The tag value.
    pub(crate) fn to_value(&self) -> String {
        let scheme = crate::aws::elb::plan::scheme(self.internal);
        let mut v = format!("v1 type={} scheme={scheme}", self.kind.as_str());
        if let Some(s) = &self.subnets {
            v.push_str(&format!(" subnets={s}"));
        }
        if let Some(a) = &self.addresses {
            v.push_str(&format!(" addresses={a}"));
        }
        v
    }

    /// Reads a tag value; `None` for anything this version did not write.
    pub(crate) fn parse(value: &str) -> Option<Applied> {
        let mut words = value.split(' ');
        if words.next()? != "v1" {
            return None;
        }
        let (mut kind, mut internal, mut subnets, mut addresses) = (None, None, None, None);
        for w in words {
            match w.split_once('=')? {
                ("type", "clb") => kind = Some(Kind::Classic),
                ("type", "nlb") => kind = Some(Kind::Network),
                ("scheme", "internal") => internal = Some(true),
                ("scheme", "internet-facing") => internal = Some(false),
                ("subnets", s) => subnets = Some(s.to_string()),
                ("addresses", a) => addresses = Some(a.to_string()),
                _ => return None,
            }
        }
        Some(Applied {
            kind: kind?,
            internal: internal?,
            subnets,
            addresses,
        })
    }

    /// The record on a load balancer with these tags, if any.
    pub(crate) fn from_tags(tags: &BTreeMap<String, String>) -> Option<Applied> {
        Applied::parse(tags.get(tags::APPLIED_TAG)?)
    }

    /// `tags` with the record added, for a create call. Left out (the load
    /// balancer is then treated as one made by the Go CCM: never recreated)
    /// when the tags already fill the load balancer's limit.
    pub(crate) fn tagged(&self, tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut out = tags.clone();
        if out.len() < tags::MAX_LB_TAGS || out.contains_key(tags::APPLIED_TAG) {
            out.insert(tags::APPLIED_TAG.to_string(), self.to_value());
        } else {
            tracing::warn!(
                limit = tags::MAX_LB_TAGS,
                "the load balancer's tags fill the limit: not recording its create-time settings; it will not be recreated when they change"
            );
        }
        out
    }
}

/// The Warning text for create-time settings left as they are: what differs,
/// why it was not applied, and how to apply it.
pub(crate) fn drift_message(
    service_key: &str,
    lb_name: &str,
    record: bool,
    diffs: &[String],
) -> String {
    let why = if record {
        "the Service asks for the same as when aws-ccm created it (the load balancer was changed outside Kubernetes)"
    } else {
        "aws-ccm did not create this load balancer (no aws-ccm/applied tag: made by the Go CCM or an older aws-ccm), and the Go CCM applies these settings only at creation"
    };
    format!(
        "Load balancer {lb_name} of {service_key} is left as it is although {}: {why}. To apply it, delete and recreate the Service (the load balancer gets a new DNS name).",
        diffs.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_reads_back_and_fits_a_tag_value() {
        let subnets: Vec<String> = (0..20).map(|i| format!("subnet-{i:017}")).collect();
        let addrs: Vec<String> = (0..20).map(|i| format!("s{i}/eipalloc-{i:017}/")).collect();
        for a in [
            Applied::classic(true),
            Applied::classic(false),
            Applied::network(true, &subnets, Some(&addrs)),
            Applied::network(false, &subnets, None),
        ] {
            let v = a.to_value();
            assert!(v.len() <= 256, "{v}");
            assert!(
                v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || " _.:/=+-@".contains(c)),
                "{v}"
            );
            assert_eq!(Applied::parse(&v), Some(a));
        }
    }

    #[test]
    fn subnet_order_does_not_matter_but_address_order_does() {
        let a = vec!["subnet-a".to_string(), "subnet-b".to_string()];
        let b = vec!["subnet-b".to_string(), "subnet-a".to_string()];
        assert_eq!(
            Applied::network(false, &a, None),
            Applied::network(false, &b, None)
        );
        assert_ne!(
            Applied::network(false, &a, Some(&a)),
            Applied::network(false, &a, Some(&b))
        );
    }

    #[test]
    fn unknown_or_foreign_values_are_no_record() {
        for v in [
            "",
            "v2 type=nlb scheme=internal",
            "v1 type=alb scheme=internal",
            "v1 scheme=internal",
            "v1 type=clb scheme=internal colour=blue",
        ] {
            assert_eq!(Applied::parse(v), None, "{v}");
        }
    }

    #[test]
    fn the_record_is_left_out_when_the_tags_are_full() {
        let full: BTreeMap<String, String> = (0..tags::MAX_LB_TAGS)
            .map(|i| (format!("k{i}"), "v".to_string()))
            .collect();
        assert_eq!(Applied::classic(false).tagged(&full), full);
        let some = BTreeMap::from([("k".to_string(), "v".to_string())]);
        assert!(
            Applied::classic(false)
                .tagged(&some)
                .contains_key(tags::APPLIED_TAG)
        );
    }
}
