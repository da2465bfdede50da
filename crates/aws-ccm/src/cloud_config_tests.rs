//! Unit tests of the cloud.conf parser.

use super::*;

fn parse(text: &str) -> Result<CloudConfig, CloudConfigError> {
    CloudConfig::parse(text, Path::new("/etc/kubernetes/cloud.conf"))
}

#[test]
fn full_upstream_file_parses() {
    let cfg = parse(
        r#"
; comments as gcfg allows
[Global]
Zone = us-west-2a
VPC = vpc-0123
SubnetID = subnet-1
RouteTableID = rtb-1
RoleARN = arn:aws:iam::123456789012:role/ccm
SourceARN = arn:aws:eks:us-west-2:123456789012:cluster/x
KubernetesClusterTag = my-cluster
KubernetesClusterID = my-cluster
disablesecuritygroupingress = true
ElbSecurityGroup = sg-1
NodeIPFamilies = ipv6
NodeIPFamilies = ipv4
ClusterServiceLoadBalancerHealthProbeMode = Shared
ClusterServiceSharedLoadBalancerHealthProbePort = 10257
ClusterServiceSharedLoadBalancerHealthProbePath = /livez
SupportedTopologyInstanceTypePattern = ^(c|m|r)[5-7].*
NLBSecurityGroupMode = Managed

[ServiceOverride "1"]
Service = ec2
Region = us-west-2
URL = https://ec2.example.com
SigningRegion = us-west-2
SigningMethod = v4

[serviceoverride "2"]
service = elasticloadbalancing
region = us-west-2
url = "https://elb.example.com"
signingregion = us-west-2
"#,
    )
    .unwrap();
    assert_eq!(cfg.region().as_deref(), Some("us-west-2"));
    assert_eq!(cfg.cluster_id(), Some("my-cluster"));
    assert!(cfg.disable_security_group_ingress);
    assert_eq!(cfg.node_ip_families, [IpFamily::Ipv6, IpFamily::Ipv4]);
    assert_eq!(cfg.health_probe_mode, HealthProbeMode::Shared);
    assert_eq!(cfg.shared_health_probe_port, 10257);
    assert_eq!(cfg.shared_health_probe_path, "/livez");
    assert_eq!(cfg.nlb_security_group_mode, NlbSecurityGroupMode::Managed);
    assert_eq!(cfg.service_overrides.len(), 2);
    let elb = cfg
        .endpoint_override(OverrideService::Elbv2, "us-west-2")
        .unwrap();
    assert_eq!(elb.url, "https://elb.example.com");
    assert!(
        cfg.endpoint_override(OverrideService::Ec2, "eu-west-1")
            .is_none()
    );
}

#[test]
fn defaults_as_upstream() {
    let cfg = parse("[Global]\n").unwrap();
    assert_eq!(cfg.node_ip_families, [IpFamily::Ipv4]);
    assert_eq!(cfg.health_probe_mode, HealthProbeMode::ServiceNodePort);
    assert_eq!(cfg.shared_health_probe_port, 10256);
    assert_eq!(cfg.shared_health_probe_path, "/healthz");
    assert_eq!(cfg.cluster_id(), None);
    assert_eq!(parse("").unwrap(), CloudConfig::default());
    // The legacy tag is the fallback cluster ID.
    assert_eq!(
        parse("[Global]\nKubernetesClusterTag=old\n")
            .unwrap()
            .cluster_id(),
        Some("old")
    );
    assert!(
        parse("[Global]\nKubernetesClusterTag=old\n")
            .unwrap()
            .cluster_id_is_legacy()
    );
    // Both keys must name one cluster (upstream's awsTagging.init); the
    // legacy key still means "write the legacy tag".
    let both = parse("[Global]\nKubernetesClusterTag=c1\nKubernetesClusterID=c1\n").unwrap();
    assert!(!both.cluster_id_is_legacy());
    assert!(both.uses_legacy_tag());
    let err = parse("[Global]\nKubernetesClusterTag=old\nKubernetesClusterID=new\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"old\"") && err.contains("\"new\""), "{err}");
    assert!(
        !parse("[Global]\nKubernetesClusterID=new\n")
            .unwrap()
            .uses_legacy_tag()
    );
    assert!(!cfg.cluster_id_is_legacy());
    // A bare boolean key means true, as in gcfg.
    assert!(
        parse("[Global]\nDisableSecurityGroupIngress\n")
            .unwrap()
            .disable_security_group_ingress
    );
    assert!(
        !parse("[Global]\nDisableSecurityGroupIngress =\n")
            .unwrap()
            .disable_security_group_ingress
    );
    // A bare non-boolean key is a value error on its own line.
    let err = parse("[Global]\nZone = us-east-1a\nNodeIPFamilies\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(":3:") && err.contains("NodeIPFamilies"),
        "{err}"
    );
}

#[test]
fn unknown_keys_warn_with_file_line_and_nearest_key_and_start_up_goes_on() {
    let (cfg, warnings) = CloudConfig::parse_with_warnings(
        "[Global]\nZone = us-east-1a\nKubernetesClusterIDD = x\n\
             ClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort\n\
             [ServiceOverride \"1\"]\nService = EC2\nRegion = r\nURL = https://x\n\
             SigningRegion = r\nSigninName = ec2\n",
        Path::new("/etc/kubernetes/cloud.conf"),
    )
    .unwrap();
    // The known keys around the unknown ones still apply.
    assert_eq!(cfg.zone.as_deref(), Some("us-east-1a"));
    assert_eq!(cfg.service_overrides.len(), 1);
    let shown: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(
        shown[0].starts_with("cloud config /etc/kubernetes/cloud.conf:3: [Global]")
            && shown[0].contains("\"KubernetesClusterIDD\"")
            && shown[0].ends_with("nearest known key: KubernetesClusterID"),
        "{}",
        shown[0]
    );
    assert_eq!(warnings[1].line, 10);
    assert_eq!(warnings[1].nearest, "SigningName");
    assert_eq!(warnings[1].section, "ServiceOverride \"1\"");
}

#[test]
fn unknown_sections_warn_once_and_are_skipped() {
    let (cfg, warnings) = CloudConfig::parse_with_warnings(
            "[Global]\nZone = us-east-1a\n[Globl]\nZone = eu-west-1a\nVPC = v\n[Global \"x\"]\nVPC = w\n",
            Path::new("c.conf"),
        )
        .unwrap();
    assert_eq!(cfg.zone.as_deref(), Some("us-east-1a"));
    assert_eq!(cfg.vpc, None);
    let shown: Vec<String> = warnings.iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 2, "{shown:?}");
    assert!(
        shown[0].starts_with("cloud config c.conf:3: unknown section [Globl]")
            && shown[0].ends_with("nearest known section: [Global]"),
        "{}",
        shown[0]
    );
    assert!(
        shown[1].starts_with("cloud config c.conf:6:"),
        "{}",
        shown[1]
    );
}

#[test]
fn nearest_key_is_by_edit_distance() {
    use super::parse::nearest;
    assert_eq!(nearest("subnetid", GLOBAL_KEYS), "SubnetID");
    assert_eq!(nearest("RoleArm", GLOBAL_KEYS), "RoleARN");
    assert_eq!(nearest("NodeIPFamily", GLOBAL_KEYS), "NodeIPFamilies");
    assert_eq!(nearest("Servce", OVERRIDE_KEYS), "Service");
}

#[test]
fn bad_values_name_the_value_and_what_is_allowed() {
    let cases = [
        (
            "[Global]\nDisableSecurityGroupIngress = maybe\n",
            "maybe",
            "true or false",
        ),
        (
            "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = port\n",
            "port",
            "1-65535",
        ),
        ("[Global]\nRoleARN = my-role\n", "my-role", "arn:aws:iam"),
        (
            "[Global]\nSupportedTopologyInstanceTypePattern = ([\n",
            "([",
            "regular expression",
        ),
    ];
    for (text, value, allowed) in cases {
        let err = parse(text).unwrap_err().to_string();
        assert!(
            err.contains(":2:") && err.contains(value) && err.contains(allowed),
            "{text:?} gave {err}"
        );
    }
}

#[test]
fn service_override_sections_are_validated() {
    let err = parse("[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("URL") && err.contains("required"), "{err}");
    let err = parse(
        "[ServiceOverride \"a\"]\nService=ec2\nRegion=r\nURL=https://x\nSigningRegion=r\n\
             [ServiceOverride \"b\"]\nService=ec2\nRegion=r\nURL=https://y\nSigningRegion=r\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("both override"), "{err}");
    // gcfg maps [ServiceOverride] with no name to the name "".
    let cfg = parse("[ServiceOverride]\nService=EC2\nRegion=r\nURL=https://x\nSigningRegion=r\n")
        .unwrap();
    assert_eq!(cfg.service_overrides[0].key, "");
}

#[test]
fn health_probe_mode_takes_upstreams_values() {
    let mode = |v: &str| {
        parse(&format!(
            "[Global]\nClusterServiceLoadBalancerHealthProbeMode = {v}\n"
        ))
        .map(|c| c.health_probe_mode)
    };
    assert_eq!(
        mode("ServiceNodePort").unwrap(),
        HealthProbeMode::ServiceNodePort
    );
    assert_eq!(mode("").unwrap(), HealthProbeMode::ServiceNodePort);
    assert_eq!(mode("Cluster").unwrap(), HealthProbeMode::ServiceNodePort);
    assert_eq!(mode("Shared").unwrap(), HealthProbeMode::Shared);
    // Upstream compares case-sensitively; so do we. Its Classic ELB path
    // reads anything but `Shared` as the default, its NLB health check fails.
    assert_eq!(mode("shared").unwrap(), HealthProbeMode::ServiceNodePort);
    // 0 and empty mean the defaults, as upstream.
    let cfg = parse(
        "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 0\n\
             ClusterServiceSharedLoadBalancerHealthProbePath =\n",
    )
    .unwrap();
    assert_eq!(cfg.shared_health_probe_port, 10256);
    assert_eq!(cfg.shared_health_probe_path, "/healthz");
}

#[test]
fn region_from_zone() {
    let cfg = parse("[Global]\nZone = eu-central-1b\n").unwrap();
    assert_eq!(cfg.region().as_deref(), Some("eu-central-1"));
    // Zone decides over Region, as upstream's getRegionFromMetadata.
    let cfg = parse("[Global]\nZone = eu-central-1b\nRegion = us-east-1\n").unwrap();
    assert_eq!(cfg.region().as_deref(), Some("eu-central-1"));
    assert_eq!(
        parse("[Global]\nRegion = us-east-1\n")
            .unwrap()
            .region()
            .as_deref(),
        Some("us-east-1")
    );
    for (zone, region) in [
        ("us-west-2-lax-1a", "us-west-2"),
        ("us-east-1-wl1-bos-wlz-1", "us-east-1"),
        ("us-gov-west-1a", "us-gov-west-1"),
        ("cn-north-1a", "cn-north-1"),
        ("us-east-1", "us-east-1"),
    ] {
        assert_eq!(
            crate::cloud_config::region_of_zone(zone),
            Some(region),
            "{zone}"
        );
    }
    for bad in ["", "us", "1a", "us-east", "-1a"] {
        assert_eq!(crate::cloud_config::region_of_zone(bad), None, "{bad}");
    }
    let err = parse("[Global]\nZone = useast1a\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("useast1a") && err.contains("Zone"), "{err}");
}

#[test]
fn service_overrides_match_upstreams_names_and_region() {
    let cfg = parse(
        "[ServiceOverride \"ec2\"]\nService = EC2\nRegion = us-east-1\nURL = https://ec2.x\nSigningRegion = r\n\
         [ServiceOverride \"clb\"]\nService = Elastic Load Balancing\nRegion = us-east-1\nURL = https://clb.x\nSigningRegion = r\n\
         [ServiceOverride \"legacy\"]\nService = elasticloadbalancing\nRegion = us-east-1\nURL = https://legacy.x\nSigningRegion = r\n\
         [ServiceOverride \"imds\"]\nService = ec2imds\nRegion = anywhere\nURL = http://169.254.1.1\nSigningRegion = r\n\
         [ServiceOverride \"sts\"]\nService = sts\nRegion = us-east-1\nURL = https://sts.x\nSigningRegion = r\n",
    )
    .unwrap();
    let url = |s: OverrideService, r: &str| cfg.endpoint_override(s, r).map(|o| o.url.as_str());
    assert_eq!(
        url(OverrideService::Ec2, "us-east-1"),
        Some("https://ec2.x")
    );
    // Region must match exactly, as upstream.
    assert_eq!(url(OverrideService::Ec2, "us-east-2"), None);
    // Classic ELB and ELBv2 are separate: the exact name wins; the legacy
    // lower-case name still covers the API with no exact override.
    assert_eq!(
        url(OverrideService::Elb, "us-east-1"),
        Some("https://clb.x")
    );
    assert_eq!(
        url(OverrideService::Elbv2, "us-east-1"),
        Some("https://legacy.x")
    );
    // IMDS has no region in upstream's matching.
    assert_eq!(
        url(OverrideService::Imds, "us-east-1"),
        Some("http://169.254.1.1")
    );
    assert_eq!(
        url(OverrideService::Sts, "us-east-1"),
        Some("https://sts.x")
    );
    assert!(
        cfg.override_notes().is_empty(),
        "{:?}",
        cfg.override_notes()
    );
}

#[test]
fn overrides_this_ccm_does_not_act_on_are_noted() {
    let cfg = parse(
        "[ServiceOverride \"1\"]\nService = s3\nRegion = r\nURL = https://s3.x\nSigningRegion = r\n\
         [ServiceOverride \"2\"]\nService = KMS\nRegion = r\nURL = https://kms.x\nSigningRegion = r\n\
         [ServiceOverride \"3\"]\nService = EC2\nRegion = r\nURL = https://ec2.x\nSigningRegion = r\nSigningMethod = v2\n",
    )
    .unwrap();
    let notes = cfg.override_notes();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(
        notes[0].contains("\"s3\"") && notes[0].contains("ignored"),
        "{}",
        notes[0]
    );
    assert!(notes[1].contains("KMS"), "{}", notes[1]);
    assert!(notes[2].contains("SigningMethod = \"v2\""), "{}", notes[2]);
}

/// Values the Go CCM starts with: taken as it takes them, never a reason to
/// stop start-up. Those it then fails every NLB sync on are refused for NLBs
/// (which are kept in upkeep); unknown address families are skipped.
#[test]
fn values_the_go_ccm_starts_with_are_taken_and_noted() {
    let cfg = parse(
        "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Local\nNLBSecurityGroupMode = managed\n\
         NodeIPFamilies = ipv5\nNodeIPFamilies = ipv6\nNodeIPFamilies = ipv6\n",
    )
    .unwrap();
    assert_eq!(cfg.health_probe_mode, HealthProbeMode::ServiceNodePort);
    assert_eq!(cfg.nlb_security_group_mode, NlbSecurityGroupMode::Unmanaged);
    let refused: Vec<(&str, &str)> = cfg
        .nlb_refusals
        .iter()
        .map(|r| (r.key, r.value.as_str()))
        .collect();
    assert_eq!(
        refused,
        [
            ("ClusterServiceLoadBalancerHealthProbeMode", "Local"),
            ("NLBSecurityGroupMode", "managed")
        ]
    );
    assert_eq!(cfg.node_ip_families, [IpFamily::Ipv6]);
    assert_eq!(cfg.tolerated.len(), 1);
    assert!(cfg.tolerated[0].contains("\"ipv5\""), "{:?}", cfg.tolerated);
    // Nothing but unknown families: ipv4, the default.
    let cfg = parse("[Global]\nNodeIPFamilies = IP4\n").unwrap();
    assert_eq!(cfg.node_ip_families, [IpFamily::Ipv4]);
}
