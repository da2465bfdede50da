//! manifests/ecr-credential-provider/credential-provider-config.yaml, read
//! as the kubelet reads it: every host form the plugin serves is matched by
//! one of its globs (the kubelet's rule: same number of DNS labels, each
//! matched by its own glob), every glob serves some host form, and hosts
//! that are not ECR's are matched by none, so the kubelet never runs the
//! plugin for them.

use serde_yaml::Value;

const CONFIG: &str = "manifests/ecr-credential-provider/credential-provider-config.yaml";

/// One host of every form the plugin accepts (tests/plugin/hosts.rs runs
/// the binary on these).
const SERVED: [&str; 14] = [
    "123456789012.dkr.ecr.us-west-2.amazonaws.com",
    "123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com",
    "123456789012.dkr-ecr.us-east-2.on.aws",
    "123456789012.dkr-ecr-fips.us-gov-east-1.on.aws",
    "123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn",
    "123456789012.dkr-ecr.cn-northwest-1.on.amazonwebservices.com.cn",
    "123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu",
    "123456789012.dkr.ecr-fips.eusc-de-east-1.amazonaws.eu",
    "123456789012.dkr.ecr.us-iso-east-1.c2s.ic.gov",
    "123456789012.dkr.ecr.us-isob-east-1.sc2s.sgov.gov",
    "123456789012.dkr.ecr.eu-isoe-west-1.cloud.adc-e.uk",
    "123456789012.dkr.ecr.us-isof-south-1.csp.hci.ic.gov",
    "public.ecr.aws",
    "ecr-public.aws.com",
];

const NOT_SERVED: [&str; 4] = [
    "registry.k8s.io",
    "docker.io",
    "123456789012.dkr.ecr.us-west-2.amazonaws.com.evil.example",
    "public.ecr.aws.evil.example",
];

/// The kubelet's `URLsMatch` on hosts: equal label counts, each label
/// matched by its glob (`*` within one label).
fn kubelet_matches(glob: &str, host: &str) -> bool {
    let globs: Vec<&str> = glob.split('.').collect();
    let labels: Vec<&str> = host.split('.').collect();
    globs.len() == labels.len() && globs.iter().zip(&labels).all(|(g, l)| label_matches(g, l))
}

fn label_matches(glob: &str, label: &str) -> bool {
    match glob.split_once('*') {
        None => glob == label,
        Some((prefix, rest)) => {
            let Some(after) = label.strip_prefix(prefix) else {
                return false;
            };
            (0..=after.len()).any(|i| after.is_char_boundary(i) && label_matches(rest, &after[i..]))
        }
    }
}

#[test]
fn the_example_config_matches_every_served_host_and_nothing_else() {
    let text = std::fs::read_to_string(ccm_testkit::repo_path(CONFIG)).expect("the example");
    let config: Value = serde_yaml::from_str(&text).expect("YAML");
    assert_eq!(config["apiVersion"], "kubelet.config.k8s.io/v1");
    assert_eq!(config["kind"], "CredentialProviderConfig");
    let provider = &config["providers"][0];
    // The kubelet runs <bin-dir>/<name>.
    assert_eq!(provider["name"], "ecr-credential-provider");
    assert_eq!(
        provider["apiVersion"],
        "credentialprovider.kubelet.k8s.io/v1"
    );
    assert_eq!(provider["defaultCacheDuration"], "12h");
    let globs: Vec<&str> = provider["matchImages"]
        .as_sequence()
        .expect("matchImages is a list")
        .iter()
        .map(|g| g.as_str().expect("a string"))
        .collect();
    for host in SERVED {
        assert!(
            globs.iter().any(|g| kubelet_matches(g, host)),
            "no glob matches {host}"
        );
    }
    for glob in &globs {
        assert!(
            SERVED.iter().any(|h| kubelet_matches(glob, h)),
            "{glob} serves no host form"
        );
    }
    for host in NOT_SERVED {
        assert!(
            !globs.iter().any(|g| kubelet_matches(g, host)),
            "{host} would reach the plugin"
        );
    }
}

#[test]
fn the_glob_rule_is_the_kubelet_s() {
    assert!(kubelet_matches(
        "*.dkr.ecr.*.amazonaws.com",
        "1.dkr.ecr.r.amazonaws.com"
    ));
    assert!(!kubelet_matches(
        "*.amazonaws.com",
        "1.dkr.ecr.r.amazonaws.com"
    ));
    assert!(kubelet_matches("a*c.io", "abbc.io"));
    assert!(!kubelet_matches("a*c.io", "abbd.io"));
}
