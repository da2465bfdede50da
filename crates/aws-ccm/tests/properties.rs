//! Generated bad input (issue 18): annotations, Service specs, cloud.conf,
//! providerIDs and flags, drawn at random from the shapes users write and
//! the shapes they get wrong. Each parser must never panic, and each value
//! it refuses must come back as an error that names it, so the controller's
//! Warning event and log line can say what to fix. (That a refused Service
//! makes no AWS call is asserted end to end in `tests/ccm/clb.rs`.)
//!
//! Runs are deterministic: proptest's default seed source is replaced by a
//! fixed seed (`PROPTEST_RNG_SEED` picks another), and every failure prints
//! the minimal input it shrank to.

use std::collections::BTreeMap;
use std::path::Path;

use aws_ccm::aws::annotations::LoadBalancerSpec;
use aws_ccm::aws::annotations::table::ANNOTATIONS;
use aws_ccm::cloud_config::CloudConfig;
use aws_ccm::ids::{format_provider_id, is_instance_id, parse_provider_id};
use aws_ccm::options::Options;
use ccm_testkit::values::annotation_value;
use k8s_openapi::api::core::v1::Service;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, RngSeed};

fn config(cases: u32) -> Config {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x0a75_cc11);
    Config {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

fn service(annotations: BTreeMap<String, String>, spec: serde_json::Value) -> Option<Service> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "generated", "namespace": "default", "uid": "0b8a7c3e-1d2f-4a5b-9c6d-7e8f9a0b1c2d",
                     "annotations": annotations},
        "spec": spec,
    }))
    .ok()
}

fn lb_spec() -> serde_json::Value {
    serde_json::json!({"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"}]})
}

proptest! {
    #![proptest_config(config(400))]

    /// Several annotations at once, cross-field checks included.
    #[test]
    fn many_annotations_never_panic_and_refusals_name_the_annotation_and_value_given(
        picks in proptest::collection::btree_map(0..ANNOTATIONS.len(), annotation_value(), 1..8),
    ) {
        let annotations: BTreeMap<String, String> = picks
            .into_iter()
            .map(|(row, v)| (ANNOTATIONS[row].name.to_string(), v))
            .collect();
        let Some(svc) = service(annotations.clone(), lb_spec()) else { return Ok(()) };
        // The spec around them is valid, so every refusal is of an
        // annotation given, and names that annotation and (a piece of) the
        // value it was given, with what is allowed.
        for e in LoadBalancerSpec::read(&svc).errors {
            let given = annotations.get(&e.field);
            prop_assert!(given.is_some(), "{e} names no annotation given: {annotations:?}");
            prop_assert!(given.is_some_and(|v| v.contains(&e.value)), "{e}: given {given:?}");
            prop_assert!(!e.allowed.trim().is_empty(), "{e} says nothing of what is allowed");
        }
    }

    /// Service specs: odd ports, protocols, source ranges, families.
    #[test]
    fn service_specs_never_panic_and_refusals_name_the_spec_field_and_value_given(
        ports in proptest::collection::vec(
            (any::<i32>(), "(TCP|UDP|SCTP|tcp|HTTP|\\PC{0,5})", proptest::option::of(any::<i32>())),
            0..5,
        ),
        ranges in proptest::collection::vec(annotation_value(), 0..3),
        policy in "(Cluster|Local|local|\\PC{0,6})",
        class in proptest::option::of("[a-z./-]{0,20}"),
    ) {
        let ports: Vec<serde_json::Value> = ports
            .iter()
            .enumerate()
            .map(|(i, (port, protocol, node_port))| serde_json::json!({
                "name": format!("p{i}"), "port": port, "protocol": protocol, "nodePort": node_port,
            }))
            .collect();
        let spec = serde_json::json!({
            "type": "LoadBalancer", "ports": ports, "loadBalancerSourceRanges": ranges,
            "externalTrafficPolicy": policy, "loadBalancerClass": class,
        });
        let Some(svc) = service(BTreeMap::new(), spec) else { return Ok(()) };
        // No annotation is set, so a refusal names a spec field of this
        // input and the value that field holds.
        for e in LoadBalancerSpec::read(&svc).errors {
            let held: Vec<String> = match e.field.as_str() {
                "spec.ports" if ports.is_empty() => vec![String::new()],
                "spec.loadBalancerSourceRanges" => ranges.clone(),
                "spec.externalTrafficPolicy" => vec![policy.clone()],
                field => field
                    .strip_prefix("spec.ports[")
                    .and_then(|rest| rest.strip_suffix("].protocol"))
                    .and_then(|i| i.parse::<usize>().ok())
                    .and_then(|i| ports.get(i)?["protocol"].as_str())
                    .map(|protocol| vec![protocol.to_string()])
                    .unwrap_or_default(),
            };
            prop_assert!(held.contains(&e.value), "{e}: that field of the input holds {held:?}");
            prop_assert!(!e.allowed.trim().is_empty(), "{e} says nothing of what is allowed");
        }
    }

    /// providerIDs: never a panic; what parses is an instance ID that
    /// formats and parses back to itself.
    #[test]
    fn provider_ids_never_panic_and_round_trip(
        value in prop_oneof![
            "aws://[a-z0-9-]{0,12}/[a-z0-9-]{0,14}/i-[0-9a-f]{0,17}",
            "(aws:///)?(i|fargate|mi)-[0-9a-zA-Z]{0,17}",
            "aws://\\PC{0,20}",
            "\\PC{0,40}",
        ],
        zone in proptest::option::of("[a-z]{2}-[a-z]{4,9}-[1-9][a-z]"),
    ) {
        if let Ok(id) = parse_provider_id(&value) {
            prop_assert!(is_instance_id(&id), "{value:?} gave {id:?}");
            let formatted = format_provider_id(zone.as_deref(), &id);
            prop_assert_eq!(parse_provider_id(&formatted).ok(), Some(id));
        }
    }
}

/// Upstream's cloud.conf keys, as `tests/data/upstream-cloud-config.json`
/// lists them.
fn cloud_conf_keys() -> Vec<(String, String)> {
    let path = ccm_testkit::repo_path("crates/aws-ccm/tests/data/upstream-cloud-config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    rows.iter()
        .filter_map(|r| {
            Some((
                r["section"].as_str()?.to_string(),
                r["key"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// One line of a cloud.conf: a section header, a known key with a random
/// value, an unknown key, a comment, or junk.
fn cloud_conf_line(keys: Vec<(String, String)>) -> impl Strategy<Value = String> {
    let sections: Vec<String> = keys.iter().map(|(s, _)| s.clone()).collect();
    prop_oneof![
        proptest::sample::select(sections).prop_map(|s| format!("[{s}]")),
        (proptest::sample::select(keys), annotation_value())
            .prop_map(|((_, k), v)| format!("{k} = {v}")),
        ("[A-Za-z]{1,12}", annotation_value()).prop_map(|(k, v)| format!("{k} = {v}")),
        Just("; a comment".to_string()),
        Just("[ServiceOverride \"1\"]".to_string()),
        "\\PC{0,30}",
    ]
}

#[test]
fn cloud_conf_never_panics_and_errors_name_file_and_line() {
    let keys = cloud_conf_keys();
    assert!(keys.len() > 10, "read too few upstream keys: {keys:?}");
    let mut runner = proptest::test_runner::TestRunner::new(config(400));
    let lines = proptest::collection::vec(cloud_conf_line(keys), 0..12);
    runner
        .run(&lines, |lines| {
            let text = lines.join("\n");
            let path = Path::new("/etc/kubernetes/cloud.conf");
            if let Err(e) = CloudConfig::parse_with_warnings(&text, path) {
                let shown = e.to_string();
                prop_assert!(
                    shown.starts_with("cloud config /etc/kubernetes/cloud.conf"),
                    "{shown}"
                );
                // A bad key's error names its line, and that line holds it
                // (a required key that is missing names its section's line).
                if let aws_ccm::cloud_config::CloudConfigError::Key { line, key, .. } = &e {
                    let key = key.to_ascii_lowercase();
                    let holds = |l: &str| {
                        let l = l.trim().to_ascii_lowercase();
                        l.strip_prefix(&key)
                            .is_some_and(|rest| rest.trim_start().starts_with('='))
                    };
                    let held = text.lines().nth(line - 1).unwrap_or_default();
                    if text.lines().any(holds) {
                        prop_assert!(holds(held), "{shown}: line {line} is {held:?}");
                    }
                    prop_assert!(*line >= 1 && *line <= text.lines().count(), "{shown}");
                    prop_assert!(shown.contains(&format!("cloud.conf:{line}:")), "{shown}");
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Upstream's flags, as `tests/data/upstream-flags.json` lists them.
fn upstream_flags() -> Vec<String> {
    let path = ccm_testkit::repo_path("crates/aws-ccm/tests/data/upstream-flags.json");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    rows.iter()
        .filter_map(|r| r["flag"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn flags_never_panic_and_refusals_name_the_flag() {
    let flags = upstream_flags();
    assert!(flags.len() > 30, "read too few upstream flags: {flags:?}");
    let mut runner = proptest::test_runner::TestRunner::new(config(300));
    let args =
        proptest::collection::vec((proptest::sample::select(flags), annotation_value()), 0..6);
    runner
        .run(&args, |args| {
            let mut argv = vec![
                "aws-cloud-controller-manager".to_string(),
                "--cloud-provider=aws".into(),
            ];
            argv.extend(args.iter().map(|(f, v)| format!("--{f}={v}")));
            match Options::parse_args(argv.clone()) {
                Err(e) => {
                    let shown = e.to_string();
                    prop_assert!(
                        shown.contains("--") || shown.contains('\''),
                        "{argv:?}: {shown}"
                    );
                }
                Ok((options, ignored)) => {
                    // A refusal names a flag given, or the --controllers
                    // combination, and says what to do.
                    if let Err(e) = options.validate(ignored) {
                        let shown = e.to_string();
                        let names_one = args.iter().any(|(f, _)| shown.contains(&format!("--{f}")))
                            || shown.contains("--controllers")
                            || shown.contains("--cluster-cidr")
                            || shown.contains("--tags");
                        prop_assert!(names_one, "{argv:?}: {shown}");
                    }
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}
