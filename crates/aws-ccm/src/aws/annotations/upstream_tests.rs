//! Every value class of the table, read on the kinds it names, held to its
//! `here` column: whether the sync proceeds, whether a Warning is given, and
//! what is built (kind, listeners, health check, the rest of the spec)
//! compared with the value the class is read as.

use super::*;
use crate::aws::annotations::tests::service;
use crate::aws::{elb, nlb};
use crate::cloud_config::CloudConfig;
use ccm_testkit::values::annotation_value;
use proptest::prelude::*;

fn read(pairs: &[(&str, &str)], is_nlb: bool) -> Reading {
    let mut all: Vec<(&str, &str)> = pairs.to_vec();
    if is_nlb && !pairs.iter().any(|(k, _)| *k == TYPE) {
        all.push((TYPE, "nlb"));
    }
    LoadBalancerSpec::read(&service(&all, &[(80, 30080), (443, 30443)]))
}

/// What the load balancer would be: the kind, the listeners and health
/// check of its kind, and the rest of the spec. `backend-protocol` is
/// compared through what it builds, not as written.
fn outcome(r: &Reading) -> String {
    let cloud = CloudConfig::default();
    let spec = &r.spec;
    let built = match spec.kind {
        LoadBalancerKind::Network => {
            let hc = nlb::desired::health_check(spec, &cloud);
            format!(
                "{:?}",
                nlb::desired::listeners(spec, "default/web", "c", &hc)
            )
        }
        _ => format!(
            "{:?} {:?}",
            elb::plan::listeners(spec),
            elb::plan::health_check(spec, &cloud)
        ),
    };
    let mut rest = spec.clone();
    rest.backend_protocol = None;
    rest.backend_protocol_other = None;
    // Kept on an NLB, but read only with cloud.conf `NLBListenerSettings =
    // true` (not this default config): its own tests hold it.
    rest.alpn_policy = None;
    rest.listener_attributes.clear();
    format!("{built} {rest:?}")
}

fn kinds(on: Applies) -> &'static [bool] {
    match on {
        Applies::Both => &[false, true],
        Applies::Clb => &[false],
        Applies::Nlb => &[true],
    }
}

fn check(k: &Class, is_nlb: bool) {
    let mut pairs = k.with.to_vec();
    pairs.push((k.annotation, k.value));
    let got = read(&pairs, is_nlb);
    let at = format!(
        "{}={:?} on an {}",
        k.annotation,
        k.value,
        if is_nlb { "NLB" } else { "CLB" }
    );
    let refused = got.errors.iter().any(|e| e.field == k.annotation);
    let noted = got.notes.iter().any(|n| n.field == k.annotation);
    assert_eq!(
        refused,
        k.here == Does::Fails,
        "{at}: refused? {:?}",
        got.errors
    );
    if k.here == Does::Fails {
        let e = got.errors.iter().find(|e| e.field == k.annotation).unwrap();
        assert_eq!(e.value, k.value, "{at}: the error names the value");
        return;
    }
    assert!(got.errors.is_empty(), "{at}: {:?}", got.errors);
    assert_eq!(
        noted,
        k.why.contains("Warning"),
        "{at}: warned? {:?}",
        got.notes
    );
    let same_as = match k.here {
        Does::Ignores => Some(""),
        Does::ReadsAs(v) => Some(v),
        _ => None,
    };
    if let Some(v) = same_as {
        let mut twin = k.with.to_vec();
        if !v.is_empty() {
            twin.push((k.annotation, v));
        }
        // A type class is read on its own (`check` is called without an NLB).
        let expected = read(&twin, is_nlb);
        assert_eq!(outcome(&got), outcome(&expected), "{at}: read as {v:?}");
    }
}

#[test]
fn every_value_class_is_read_as_its_row_says() {
    for k in CLASSES {
        if k.annotation == TYPE {
            // The type decides the kind: read on its own.
            check(k, false);
            continue;
        }
        for is_nlb in kinds(k.on) {
            check(k, *is_nlb);
        }
    }
}

#[test]
fn every_annotation_of_the_table_has_value_classes() {
    for row in super::super::table::ANNOTATIONS {
        let classes: Vec<_> = CLASSES
            .iter()
            .filter(|k| k.annotation == row.name)
            .collect();
        assert!(!classes.is_empty(), "{} has no value class", row.name);
        assert!(
            classes.iter().any(|k| k.class.starts_with("documented")),
            "{} has no documented value class",
            row.name
        );
    }
}

#[test]
fn a_class_that_differs_says_why() {
    for k in CLASSES {
        assert!(
            k.here == k.go || !k.why.is_empty(),
            "{} {:?} differs without a why",
            k.annotation,
            k.value
        );
    }
}

#[test]
fn compatibility_doc_matches_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/compatibility.md");
    let page = std::fs::read_to_string(path).expect("docs/compatibility.md is readable");
    let begin = page
        .find(DOC_BEGIN)
        .expect("docs/compatibility.md has the begin marker");
    let end = page
        .find(DOC_END)
        .expect("docs/compatibility.md has the end marker")
        + DOC_END.len();
    if std::env::var_os("UPDATE_README").is_some() {
        let updated = format!(
            "{}{}{}",
            &page[..begin],
            compatibility_section(),
            &page[end..]
        );
        std::fs::write(path, updated).expect("docs/compatibility.md is writable");
        return;
    }
    assert_eq!(
        &page[begin..end],
        compatibility_section(),
        "docs/compatibility.md drifted from annotations/upstream.rs; regenerate it with \
         `UPDATE_README=1 cargo test -p aws-ccm --lib compatibility_doc`"
    );
}

/// The Go CCM's `isNLB` / `isLBExternal`: exact lower-case values only.
fn go_kind(v: &str) -> LoadBalancerKind {
    match v {
        "nlb" => LoadBalancerKind::Network,
        "external" | "nlb-ip" => LoadBalancerKind::External,
        _ => LoadBalancerKind::Classic,
    }
}

/// The Go CCM's Classic ELB listener and health-check protocols for a
/// `backend-protocol` value without a certificate (`buildListener`, and the
/// lower-cased check in `EnsureLoadBalancer`).
fn go_clb_protocols(v: &str) -> (&'static str, &'static str) {
    let listener = if v == "http" { "HTTP" } else { "TCP" };
    let lower = v.to_ascii_lowercase();
    let health = if lower == "https" || lower == "ssl" {
        "SSL"
    } else {
        "TCP"
    };
    (listener, health)
}

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nlb".to_string()),
        Just("external".to_string()),
        Just("nlb-ip".to_string()),
        Just("http".to_string()),
        Just("https".to_string()),
        Just("ssl".to_string()),
        Just("tcp".to_string()),
        "[a-zA-Z-]{0,8}",
    ]
    .prop_flat_map(|w| {
        // Any case form of the word.
        let n = w.len();
        (Just(w), proptest::collection::vec(any::<bool>(), n))
    })
    .prop_map(|(w, upper)| {
        w.chars()
            .zip(upper)
            .map(|(c, u)| if u { c.to_ascii_uppercase() } else { c })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(31), ..ProptestConfig::default() })]

    /// Any type value: the kind the Go CCM makes, the sync goes on, and a
    /// value that is not one of the three words is warned about.
    #[test]
    fn any_type_value_makes_the_go_ccms_kind(v in word()) {
        let got = read(&[(TYPE, &v)], false);
        prop_assert_eq!(got.spec.kind, go_kind(&v));
        prop_assert!(got.errors.is_empty(), "{:?}", got.errors);
        let documented = ["", "nlb", "external", "nlb-ip"].contains(&v.as_str());
        prop_assert_eq!(got.notes.iter().any(|n| n.field == TYPE), !documented);
        let looks_meant = ["nlb", "external", "nlb-ip"].iter().any(|m| m.eq_ignore_ascii_case(v.trim()));
        prop_assert_eq!(got.holds_new(), !documented && looks_meant);
    }

    /// Any backend-protocol value without a certificate on a Classic ELB:
    /// the Go CCM's listener and health-check protocols, and no refusal.
    #[test]
    fn any_backend_protocol_builds_the_go_ccms_listeners(v in word()) {
        let got = read(&[(BACKEND_PROTOCOL, &v)], false);
        prop_assert!(got.errors.is_empty(), "{:?}", got.errors);
        let (listener, health) = go_clb_protocols(&v);
        let listeners = elb::plan::listeners(&got.spec);
        prop_assert!(listeners.iter().all(|l| l.protocol == listener && l.instance_protocol == listener));
        let hc = elb::plan::health_check(&got.spec, &CloudConfig::default());
        prop_assert!(hc.target.starts_with(&format!("{health}:")), "{}", hc.target);
    }

    /// With a certificate the Go CCM maps only the four lower-case words and
    /// fails on any other: so does this CCM.
    #[test]
    fn backend_protocol_with_a_certificate_is_refused_unless_mapped(v in word()) {
        let mut pairs = CERT.to_vec();
        pairs.push((BACKEND_PROTOCOL, &v));
        let got = read(&pairs, false);
        let mapped = ["", "http", "https", "ssl", "tcp"].contains(&v.as_str());
        prop_assert_eq!(got.errors.iter().any(|e| e.field == BACKEND_PROTOCOL), !mapped);
    }

    /// Any value of any annotation in the table, alone: an annotation the
    /// Go CCM never fails on (no value class of it fails in [`CLASSES`]) is
    /// never refused, whatever its value; a refusal names the annotation and
    /// the value; one refused value leaves every other part of the reading
    /// as it is without the annotation.
    #[test]
    fn one_annotation_never_panics_and_a_refusal_names_it(
        row in 0..super::super::table::ANNOTATIONS.len(),
        value in annotation_value(),
        nlb in any::<bool>(),
    ) {
        let key = super::super::table::ANNOTATIONS[row].name;
        let mut pairs = vec![(key, value.as_str())];
        if nlb && key != TYPE {
            pairs.push((TYPE, "nlb"));
        }
        let reading = LoadBalancerSpec::read(&service(&pairs, &[(80, 30080)]));
        let never_fails = CLASSES
            .iter()
            .filter(|c| c.annotation == key)
            .all(|c| c.here != Does::Fails);
        if never_fails {
            prop_assert!(reading.errors.is_empty(), "{key}={value:?} refused: {:?}", reading.errors);
        }
        for e in &reading.errors {
            let text = e.to_string();
            prop_assert_eq!(&e.field, key, "{}", text);
            prop_assert!(!e.allowed.is_empty(), "{text}: says nothing of what is allowed");
            // The whole value, or the one element of a list that is wrong.
            prop_assert!(value.contains(&e.value), "the error names another value: {}", text);
        }
        if !reading.errors.is_empty() {
            pairs.retain(|(k, _)| *k != key);
            let without = LoadBalancerSpec::read(&service(&pairs, &[(80, 30080)]));
            prop_assert_eq!(reading.spec.kind, without.spec.kind);
            prop_assert_eq!(&reading.spec.ports, &without.spec.ports);
        }
    }
}
