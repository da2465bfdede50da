use super::table::ANNOTATIONS;
use super::*;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;

pub(crate) fn service(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some("0b9c8e4a-1234-4f6e-9a7b-abcdefabcdef".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(port, node_port)| ServicePort {
                        name: Some(format!("p{port}")),
                        port: *port,
                        node_port: Some(*node_port),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

fn parse(annotations: &[(&str, &str)]) -> Result<LoadBalancerSpec, SpecError> {
    LoadBalancerSpec::from_service(&service(annotations, &[(80, 30080)]))
}

/// The table holds each annotation the Go CCM reads (the list read from
/// its source, `tests/data/upstream-annotations.json`) exactly once, plus
/// this CCM's own: `ip-address-type` and the core source-ranges one.
#[test]
fn table_has_every_upstream_annotation_once() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/upstream-annotations.json"
    );
    let text = std::fs::read_to_string(path).expect("the upstream list is readable");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON list");
    let upstream: BTreeSet<&str> = listed
        .iter()
        .filter_map(|a| a["annotation"].as_str())
        .collect();
    assert!(upstream.len() >= 30, "the upstream list is whole");
    let rows: Vec<&str> = ANNOTATIONS.iter().map(|a| a.name).collect();
    let names: BTreeSet<&str> = rows.iter().copied().collect();
    assert_eq!(names.len(), rows.len(), "a row appears twice");
    let ours: BTreeSet<&str> = [IP_ADDRESS_TYPE, SOURCE_RANGES].into();
    let albc = albc_annotations();
    let expected: BTreeSet<&str> = upstream
        .union(&ours)
        .copied()
        .chain(albc.iter().map(String::as_str))
        .collect();
    assert_eq!(
        names, expected,
        "the table and the Go CCM's and AWS Load Balancer Controller's annotations differ"
    );
    assert!(ANNOTATIONS.iter().all(|a| a.name.starts_with(PREFIX)));
    // The Load Balancer Controller's keys the Go CCM does not read are the
    // rows that are not read, the scheme, which is read for its safety, and
    // the attributes, read for deletion protection alone, the name, read
    // for adoption alone, and the ALPN policy and listener attributes, read
    // with cloud.conf `NLBListenerSettings = true`.
    let read_albc = [
        SCHEME,
        LB_ATTRIBUTES,
        NAME,
        ALPN_POLICY,
        LISTENER_ATTRIBUTES,
    ];
    for row in ANNOTATIONS {
        let not_read = matches!(row.parse, super::rows::Parse::NotRead(_));
        let albc_only =
            albc.contains(row.name) && !upstream.contains(row.name) && !ours.contains(row.name);
        assert_eq!(
            not_read || read_albc.contains(&row.name),
            albc_only,
            "{}",
            row.name
        );
    }
}

/// The AWS Load Balancer Controller's `aws-load-balancer-*` Service
/// annotations, as `scripts/gen-albc-annotations.py` read them from its
/// source into `tests/data/albc-annotations.json`.
fn albc_annotations() -> BTreeSet<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/albc-annotations.json"
    );
    let text = std::fs::read_to_string(path).expect("the controller's list is readable");
    let listed: Vec<serde_json::Value> = serde_json::from_str(&text).expect("a JSON list");
    let names: BTreeSet<String> = listed
        .iter()
        .filter_map(|a| a["annotation"].as_str().map(str::to_string))
        .collect();
    assert!(names.len() >= 40, "the controller's list is whole");
    names
}

#[test]
fn readme_matches_the_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/annotations.md");
    let readme = std::fs::read_to_string(path).expect("docs/annotations.md is readable");
    let begin = readme
        .find(README_BEGIN)
        .expect("docs/annotations.md has the begin marker");
    let end = readme
        .find(README_END)
        .expect("docs/annotations.md has the end marker")
        + README_END.len();
    if std::env::var_os("UPDATE_README").is_some() {
        let updated = format!("{}{}{}", &readme[..begin], readme_section(), &readme[end..]);
        std::fs::write(path, updated).expect("docs/annotations.md is writable");
        return;
    }
    assert_eq!(
        &readme[begin..end],
        readme_section(),
        "docs/annotations.md drifted from crates/aws-ccm/src/aws/annotations/table.rs; \
         regenerate it with `UPDATE_README=1 cargo test -p aws-ccm --lib readme`"
    );
}

#[test]
fn defaults() {
    let s = parse(&[]).unwrap();
    assert_eq!(s.kind, LoadBalancerKind::Classic);
    assert!(!s.internal && !s.proxy_protocol && !s.cross_zone);
    assert_eq!(s.source_ranges, vec![Ipv4Net::default()]);
    assert_eq!(s.ports.len(), 1);
    assert_eq!(s.subnets, None);
}

#[test]
fn typed_values() {
    let s = parse(&[
        (INTERNAL, "0.0.0.0/0"),
        (PROXY_PROTOCOL, "*"),
        (CROSS_ZONE, "True"),
        (IDLE_TIMEOUT, "120"),
        (SSL_PORTS, "443,HTTPS"),
        (ADDITIONAL_TAGS, "a=1, b=,c"),
        (SOURCE_RANGES, "10.0.0.1/8, 192.168.0.0/16"),
        (HC_PORT, "traffic-port"),
        (SUBNETS, "subnet-1, public-a"),
    ])
    .unwrap();
    assert!(s.internal && s.proxy_protocol && s.cross_zone);
    assert_eq!(s.idle_timeout, Some(120));
    let ports = s.ssl_ports.unwrap();
    assert!(ports.contains(443, "x") && ports.contains(1, "https"));
    assert_eq!(s.additional_tags["a"], "1");
    assert_eq!(s.additional_tags["c"], "");
    assert_eq!(
        s.source_ranges,
        vec![
            "10.0.0.0/8".parse::<Ipv4Net>().unwrap(),
            "192.168.0.0/16".parse().unwrap()
        ]
    );
    assert_eq!(s.health_check.port, Some(HealthCheckPort::TrafficPort));
    assert_eq!(s.subnets.unwrap(), vec!["subnet-1", "public-a"]);
    assert!(!parse(&[(INTERNAL, "false")]).unwrap().internal);
}

#[test]
fn invalid_values_name_annotation_value_and_what_is_allowed() {
    let cases: &[(&str, &str, &str)] = &[
        (SOURCE_RANGES, "10.0.0.0/33", "CIDR"),
        (HC_INTERVAL, "ten", "whole number"),
        (HC_PROTOCOL, "ICMP", "TCP"),
        (PROXY_PROTOCOL, "true", "*"),
        (CROSS_ZONE, "yes", "true or false"),
        (
            TARGET_GROUP_ATTRIBUTES,
            "proxy_protocol_v2.enabled=true",
            "only supported on an NLB",
        ),
        (ACCESS_LOG_EMIT_INTERVAL, "10", "5 or 60"),
    ];
    for (key, value, allowed) in cases {
        let e = parse(&[(key, value)]).unwrap_err();
        assert_eq!(e.field, *key);
        assert_eq!(e.value, *value);
        let text = e.to_string();
        assert!(
            text.contains(key) && text.contains(value) && text.contains(allowed),
            "{text}"
        );
    }
    let e = parse(&[(TYPE, "nlb"), (EXTRA_SECURITY_GROUPS, "sg-1")]).unwrap_err();
    assert_eq!(e.field, EXTRA_SECURITY_GROUPS);
    let cert = "arn:aws:acm:us-east-1:1:certificate/c";
    let e = parse(&[(SSL_CERT, cert), (BACKEND_PROTOCOL, "udp")]).unwrap_err();
    assert_eq!(
        (e.field.as_str(), e.value.as_str()),
        (BACKEND_PROTOCOL, "udp")
    );
    assert!(e.to_string().contains("http, https, ssl or tcp"), "{e}");
}

#[test]
fn one_refused_value_leaves_the_rest_of_the_reading() {
    let svc = service(
        &[
            (HC_INTERVAL, "abc"),
            (CROSS_ZONE, "yes"),
            (IDLE_TIMEOUT, "120"),
            (TYPE, "NLB"),
        ],
        &[(80, 30080)],
    );
    let r = LoadBalancerSpec::read(&svc);
    let refused: Vec<&str> = r.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(refused, vec![CROSS_ZONE, HC_INTERVAL]);
    // Read as the Go CCM reads it: a Classic ELB, held while it has none.
    assert_eq!(r.spec.kind, LoadBalancerKind::Classic);
    assert!(r.holds_new());
    assert_eq!(r.spec.idle_timeout, Some(120));
    assert_eq!(r.spec.health_check.interval, None);
    assert_eq!(r.spec.ports.len(), 1);
    assert!(r.source_ranges_known());
    let r = LoadBalancerSpec::read(&service(&[(SOURCE_RANGES, "bad")], &[(80, 30080)]));
    assert!(!r.source_ranges_known());
}

#[test]
fn spec_fields_are_validated() {
    let mut svc = service(&[], &[(80, 30080)]);
    svc.spec.as_mut().unwrap().load_balancer_ip = Some("1.2.3.4".into());
    assert_eq!(
        LoadBalancerSpec::from_service(&svc).unwrap_err().field,
        "spec.loadBalancerIP"
    );

    let mut svc = service(&[], &[(80, 30080), (53, 30053)]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
    let e = LoadBalancerSpec::from_service(&svc).unwrap_err();
    assert!(e.to_string().contains("mixed"), "{e}");

    let mut svc = service(&[], &[(53, 30053)]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
    let e = LoadBalancerSpec::from_service(&svc).unwrap_err();
    assert!(e.to_string().contains("classic ELB: TCP"), "{e}");
    svc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(TYPE.into(), "nlb".into());
    assert!(LoadBalancerSpec::from_service(&svc).is_ok());

    let mut svc = service(&[], &[(80, 30080)]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["bad".into()]);
    assert_eq!(
        LoadBalancerSpec::from_service(&svc).unwrap_err().field,
        "spec.loadBalancerSourceRanges"
    );
}

#[test]
fn spec_source_ranges_win_over_the_annotation() {
    let mut svc = service(&[(SOURCE_RANGES, "10.0.0.0/8")], &[(80, 30080)]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["1.2.3.0/24".into()]);
    let s = LoadBalancerSpec::from_service(&svc).unwrap();
    assert_eq!(
        s.source_ranges,
        vec!["1.2.3.0/24".parse::<Ipv4Net>().unwrap()]
    );
}

/// cloud.conf values the Go CCM starts with but fails some syncs on are
/// refused for exactly those syncs: NLBs for the NLB-only ones, Services
/// probed through the shared port for the shared probe's.
#[test]
fn cloud_conf_refusals_apply_to_the_syncs_they_govern() {
    use crate::cloud_config::{CloudConfig, HealthProbeMode, RefusedValue};
    let refused = |key: &'static str, value: &str| RefusedValue {
        key,
        value: value.to_string(),
        allowed: "x",
    };
    let mut cloud = CloudConfig::default();
    cloud
        .nlb_refusals
        .push(refused("NLBSecurityGroupMode", "managed"));
    cloud.shared_probe_refusals.push(refused(
        "ClusterServiceSharedLoadBalancerHealthProbePath",
        "healthz",
    ));
    let fields = |svc: &Service, cloud: &CloudConfig| -> Vec<String> {
        let r = LoadBalancerSpec::read_with(svc, cloud);
        r.errors.into_iter().map(|e| e.field).collect()
    };
    let clb = service(&[], &[(80, 30080)]);
    let nlb = service(&[(TYPE, "nlb")], &[(80, 30080)]);
    assert!(fields(&clb, &cloud).is_empty());
    assert_eq!(
        fields(&nlb, &cloud),
        ["cloud.conf [Global] NLBSecurityGroupMode"]
    );
    cloud.health_probe_mode = HealthProbeMode::Shared;
    let probe = "cloud.conf [Global] ClusterServiceSharedLoadBalancerHealthProbePath";
    assert_eq!(fields(&clb, &cloud), [probe]);
    let mut local = clb.clone();
    let spec = local.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32123);
    assert!(
        fields(&local, &cloud).is_empty(),
        "a Local Service probes its own port"
    );
}

const README_BEGIN: &str = "<!-- annotations:begin -->";
const README_END: &str = "<!-- annotations:end -->";

/// The README's annotation reference, generated from [`ANNOTATIONS`].
fn readme_section() -> String {
    let mut out = String::new();
    out.push_str(README_BEGIN);
    out.push_str(
        "\n\n| Annotation | Value | Default | Applies to | Meaning |\n|---|---|---|---|---|\n",
    );
    for a in ANNOTATIONS {
        let here = match a.parse {
            super::rows::Parse::NotRead(instead) => format!(
                " Not read by this CCM, nor by the Go CCM: a value gets one Warning `{NOT_READ}`; {instead}."
            ),
            _ => String::new(),
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {}{here} |\n",
            a.name,
            a.kind,
            a.default,
            a.applies.as_str(),
            a.meaning
        ));
    }
    out.push('\n');
    out.push_str(README_END);
    out
}

/// `is_external` is the Go CCM's `isLBExternal`: exactly `external` or
/// `nlb-ip`, and it agrees with the kind the reading gives.
#[test]
fn only_the_exact_external_types_hand_the_service_over() {
    for (value, external) in [
        ("external", true),
        ("nlb-ip", true),
        ("External", false),
        ("nlb-ip ", false),
        ("nlb", false),
        ("", false),
    ] {
        let svc = service(&[(TYPE, value)], &[(80, 30080)]);
        assert_eq!(is_external(&svc), external, "{value:?}");
        let kind = LoadBalancerSpec::read(&svc).spec.kind;
        assert_eq!(kind == LoadBalancerKind::External, external, "{value:?}");
    }
    assert!(!is_external(&service(&[], &[(80, 30080)])));
}

fn read_on_nlb(pairs: &[(&str, &str)]) -> Reading {
    let mut all = vec![(TYPE, "nlb")];
    all.extend_from_slice(pairs);
    LoadBalancerSpec::read(&service(&all, &[(80, 30080)]))
}

/// The AWS Load Balancer Controller's `scheme: internal` where the Go CCM,
/// which reads only `aws-load-balancer-internal`, would make the load
/// balancer internet-facing: a new Service gets none, an existing one is
/// kept in upkeep, and the Warning names both keys and the fix (issue 43).
#[test]
fn scheme_internal_without_a_true_internal_key_holds_the_change() {
    use crate::provider::load_balancers::{Scope, scope};
    for pairs in [
        &[(SCHEME, "internal")][..],
        &[(SCHEME, "Internal")],
        &[(SCHEME, " internal ")],
        &[(SCHEME, "internal"), (INTERNAL, "false")],
        &[(SCHEME, "internal"), (INTERNAL, "")],
    ] {
        let r = read_on_nlb(pairs);
        assert!(r.errors.is_empty(), "{pairs:?}: {:?}", r.errors);
        assert!(!r.spec.internal, "{pairs:?}: read as the Go CCM reads it");
        assert!(r.holds_new() && r.holds_changes(), "{pairs:?}");
        assert_eq!(scope(&r, false), None, "{pairs:?}: a new Service gets none");
        assert_eq!(
            scope(&r, true),
            Some(Scope::Upkeep { node_rules: true }),
            "{pairs:?}: an existing one is kept as it is"
        );
        let [note] = &r.notes[..] else {
            panic!("{pairs:?}: one note, got {:?}", r.notes)
        };
        assert_eq!((note.field.as_str(), note.reason), (SCHEME, NOT_READ));
        let text = note.to_string();
        for w in [
            SCHEME,
            INTERNAL,
            "\"true\"",
            "internet-facing",
            "kept as it is",
        ] {
            assert!(text.contains(w), "{text:?} lacks {w:?}");
        }
    }
    // Both keys agree, or the scheme asks for the Go CCM's default: nothing said.
    for pairs in [
        &[(SCHEME, "internal"), (INTERNAL, "true")][..],
        &[(SCHEME, "internet-facing")],
        &[(SCHEME, "internet-facing"), (INTERNAL, "false")],
    ] {
        let r = read_on_nlb(pairs);
        assert!(
            r.notes.is_empty() && r.errors.is_empty(),
            "{pairs:?}: {r:?}"
        );
        assert_eq!(scope(&r, false), Some(Scope::Full));
    }
    // `internet-facing` beside a true internal key: the private reading,
    // with a Warning, and no hold.
    let r = read_on_nlb(&[(SCHEME, "internet-facing"), (INTERNAL, "true")]);
    assert!(r.spec.internal && !r.holds_new() && r.errors.is_empty());
    assert_eq!(r.notes.len(), 1);
    assert_eq!(r.notes[0].reason, NOT_READ);
    // Another word: ignored with a Warning.
    let r = read_on_nlb(&[(SCHEME, "private")]);
    assert!(!r.holds_new() && r.notes.len() == 1, "{r:?}");
    // A Service handed to the Load Balancer Controller: its keys are its own.
    let r = LoadBalancerSpec::read(&service(
        &[(TYPE, "external"), (SCHEME, "internal")],
        &[(80, 30080)],
    ));
    assert!(r.notes.is_empty() && !r.holds_new());
}

/// Every other key of the AWS Load Balancer Controller that this CCM does
/// not read: one Warning naming the key and what to do instead, and the
/// spec exactly as without it, on either kind.
#[test]
fn load_balancer_controller_keys_are_warned_about_and_change_nothing() {
    let rows: Vec<_> = ANNOTATIONS
        .iter()
        .filter(|r| matches!(r.parse, super::rows::Parse::NotRead(_)))
        .collect();
    // 16 since `aws-load-balancer-attributes` (deletion protection) and
    // `aws-load-balancer-name` (adoption) are read, and `alpn-policy` with
    // cloud.conf `NLBListenerSettings = true`, as are `listener-attributes.*`
    // (their own tests: `an_nlb_alpn_policy_is_read_only_with_the_key_...`,
    // `nlb_listener_attributes_are_read_only_with_the_key_...`).
    assert!(rows.len() >= 15, "{}", rows.len());
    for kind in ["nlb", ""] {
        let plain = LoadBalancerSpec::read(&service(&[(TYPE, kind)], &[(80, 30080)]));
        for row in &rows {
            let super::rows::Parse::NotRead(instead) = row.parse else {
                unreachable!()
            };
            let key = row.name.replace('*', "TCP-80");
            let r = LoadBalancerSpec::read(&service(&[(TYPE, kind), (&key, "x")], &[(80, 30080)]));
            assert_eq!(r.spec, plain.spec, "{key}");
            assert!(r.errors.is_empty(), "{key}: {:?}", r.errors);
            let [note] = &r.notes[..] else {
                panic!("{key}: one note, got {:?}", r.notes)
            };
            assert_eq!(note.field, key);
            assert_eq!((note.reason, note.holds), (NOT_READ, Holds::Nothing));
            assert!(note.to_string().contains(instead), "{note}");
        }
    }
    // The listener-attributes pattern names each listener's key.
    let r = read_on_nlb(&[
        (&LISTENER_ATTRIBUTES.replace('*', "TCP-80"), "a=1"),
        (&LISTENER_ATTRIBUTES.replace('*', "UDP-53"), "a=1"),
    ]);
    let fields: Vec<&str> = r.notes.iter().map(|n| n.field.as_str()).collect();
    assert_eq!(fields.len(), 2, "{fields:?}");
    assert!(fields.iter().all(|f| !f.ends_with('*')), "{fields:?}");
}

/// The scheme row reads `s.internal`, which the internal row sets: it
/// must come after it.
#[test]
fn the_scheme_row_comes_after_the_internal_row() {
    let at = |name| ANNOTATIONS.iter().position(|r| r.name == name);
    assert!(at(INTERNAL) < at(SCHEME) && at(SCHEME).is_some());
}

#[test]
fn protection_is_read_from_the_attributes_key_alone() {
    let svc = |v: &str| service(&[(LB_ATTRIBUTES, v)], &[(80, 30080)]);
    assert!(is_protected(&svc("deletion_protection.enabled=true")));
    assert!(is_protected(&svc(
        "access_logs.s3.enabled=false, deletion_protection.enabled=true"
    )));
    assert!(!is_protected(&svc("deletion_protection.enabled=false")));
    assert!(!is_protected(&svc("deletion_protection.enabled=yes")));
    assert!(!is_protected(&service(&[], &[(80, 30080)])));
    let r = LoadBalancerSpec::read(&svc(
        "access_logs.s3.enabled=false,deletion_protection.enabled=true",
    ));
    assert!(r.spec.protected() && r.errors.is_empty());
    let [note] = &r.notes[..] else {
        panic!("{:?}", r.notes)
    };
    assert!(note.reading.contains("access_logs.s3.enabled"), "{note}");
    assert_eq!((note.reason, note.holds), (NOT_READ, Holds::Nothing));
}

#[test]
fn an_nlb_health_timeout_above_the_interval_is_warned_only_with_the_key() {
    use crate::cloud_config::CloudConfig;
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let notes = |annotations: &[(&str, &str)], cloud: &CloudConfig| -> Vec<String> {
        let svc = service(annotations, &[(80, 30080)]);
        let r = LoadBalancerSpec::read_with(&svc, cloud);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        r.findings(true)
            .into_iter()
            .filter(|f| f.reason == SETTING_REFUSED)
            .map(|f| f.message)
            .collect()
    };
    let over = [(TYPE, "nlb"), (HC_INTERVAL, "10"), (HC_TIMEOUT, "20")];
    let [note] = notes(&over, &on).try_into().expect("one note");
    assert!(note.starts_with(&format!("{HC_TIMEOUT}=\"20\"")), "{note}");
    assert!(
        note.contains("interval (10 s)") && note.contains("at most the interval"),
        "{note}"
    );
    // Without the key the Go CCM's reading: no new Warning.
    assert!(notes(&over, &CloudConfig::default()).is_empty());
    // Within the interval (the NLB's default 30 s here), or a CLB: none.
    assert!(notes(&[(TYPE, "nlb"), (HC_TIMEOUT, "20")], &on).is_empty());
    assert!(notes(&[(HC_INTERVAL, "10"), (HC_TIMEOUT, "5")], &on).is_empty());
}

#[test]
fn an_nlb_alpn_policy_is_read_only_with_the_key_and_refused_as_aws_refuses() {
    use crate::cloud_config::CloudConfig;
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let findings = |annotations: &[(&str, &str)], cloud: &CloudConfig| -> Vec<(String, String)> {
        let svc = service(annotations, &[(443, 30443)]);
        let r = LoadBalancerSpec::read_with(&svc, cloud);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        r.findings(true)
            .into_iter()
            .filter(|f| f.message.starts_with(ALPN_POLICY))
            .map(|f| (f.reason.to_string(), f.message))
            .collect()
    };
    let cert = (SSL_CERT, "arn:aws:acm:us-east-1:123456789012:certificate/x");
    let good = [(TYPE, "nlb"), cert, (ALPN_POLICY, "HTTP2Preferred")];
    // Without the key: not read, as before.
    let [(reason, _)] = findings(&good, &CloudConfig::default())
        .try_into()
        .expect("one finding");
    assert_eq!(reason, NOT_READ);
    // With it: read, nothing to say.
    assert!(findings(&good, &on).is_empty());
    // A name AWS does not take, or no TLS listener: refused, with the fix.
    let [(reason, note)] = findings(&[(TYPE, "nlb"), cert, (ALPN_POLICY, "h2")], &on)
        .try_into()
        .expect("one finding");
    assert_eq!(reason, SETTING_REFUSED);
    assert!(note.contains("HTTP2Preferred"), "{note}");
    let [(reason, note)] = findings(&[(TYPE, "nlb"), (ALPN_POLICY, "HTTP1Only")], &on)
        .try_into()
        .expect("one finding");
    assert_eq!(reason, SETTING_REFUSED);
    assert!(note.contains("no TLS listener"), "{note}");
    // A classic ELB: not read, key or not.
    let [(reason, _)] = findings(&[cert, (ALPN_POLICY, "HTTP1Only")], &on)
        .try_into()
        .expect("one finding");
    assert_eq!(reason, NOT_READ);
}

#[test]
fn nlb_listener_attributes_are_read_only_with_the_key_and_refused_as_aws_refuses() {
    use crate::cloud_config::CloudConfig;
    let on = CloudConfig {
        nlb_listener_settings: true,
        ..CloudConfig::default()
    };
    let key = |listener: &str| format!("{LISTENER_ATTRIBUTES_PREFIX}{listener}");
    let findings = |pairs: &[(String, &str)], cloud: &CloudConfig| -> Vec<(String, String)> {
        let cert = (SSL_CERT, "arn:aws:acm:us-east-1:123456789012:certificate/x");
        let mut annotations = vec![(TYPE, "nlb"), cert, (SSL_PORTS, "443")];
        annotations.extend(pairs.iter().map(|(k, v)| (k.as_str(), *v)));
        let svc = service(&annotations, &[(80, 30080), (443, 30443)]);
        let r = LoadBalancerSpec::read_with(&svc, cloud);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        r.findings(true)
            .into_iter()
            .filter(|f| f.message.starts_with(LISTENER_ATTRIBUTES_PREFIX))
            .map(|f| (f.reason.to_string(), f.message))
            .collect()
    };
    let good = [(key("TCP-80"), "tcp.idle_timeout.seconds=400")];
    // Without the key: not read, as before.
    let [(reason, _)] = findings(&good, &CloudConfig::default())
        .try_into()
        .expect("one finding");
    assert_eq!(reason, NOT_READ);
    // With it: read, nothing to say.
    assert!(findings(&good, &on).is_empty());
    // What AWS refuses: each with its own Warning and fix.
    for (pair, says) in [
        (
            (key("TCP-80"), "tcp.idle_timeout.seconds=30"),
            "from 60 to 6000",
        ),
        (
            (key("TCP-80"), "tcp.idle_timeout.seconds=7000"),
            "from 60 to 6000",
        ),
        (
            (key("TCP-80"), "deletion_protection.enabled=true"),
            "not a listener attribute",
        ),
        (
            (key("TLS-443"), "tcp.idle_timeout.seconds=400"),
            "TCP listeners only",
        ),
        (
            (key("TCP-81"), "tcp.idle_timeout.seconds=400"),
            "no TCP listener on port 81",
        ),
        (
            (key("eighty"), "tcp.idle_timeout.seconds=400"),
            "names no listener",
        ),
    ] {
        let [(reason, note)] = findings(std::slice::from_ref(&pair), &on)
            .try_into()
            .unwrap_or_else(|f| panic!("{pair:?}: one finding, got {f:?}"));
        assert_eq!(reason, SETTING_REFUSED, "{pair:?}");
        assert!(note.starts_with(&format!("{}=", pair.0)), "{note}");
        assert!(note.contains(says), "{pair:?}: {note}");
    }
}
