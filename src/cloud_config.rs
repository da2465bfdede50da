//! `cloud.conf`: the INI (gcfg) file the Go aws-cloud-controller-manager reads.
//!
//! Same sections and keys as upstream: `[Global]` and `[ServiceOverride "N"]`.
//! As in gcfg, section and key names are case-insensitive, a key may repeat
//! where its value is a list (NodeIPFamilies), and a bare key means `true` for
//! booleans. Unlike a silent parser, every unknown key or bad value stops
//! start-up with the file, line, key and what is allowed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use ini::{Ini, ParseOption};

/// IP families reported as node addresses, in order (`NodeIPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

/// `ClusterServiceLoadBalancerHealthProbeMode`: upstream's values are
/// `ServiceNodePort` (also an empty value, the default) and `Shared`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthProbeMode {
    /// `ServiceNodePort`: health checks hit the service's own node port
    /// (upstream default). `Cluster`, this project's earlier name for it, is
    /// still accepted.
    #[default]
    ServiceNodePort,
    /// `Shared`: for services whose `externalTrafficPolicy` is not `Local`,
    /// health checks are HTTP to a shared port/path on every node
    /// (kube-proxy's healthz).
    Shared,
}

/// `NLBSecurityGroupMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NlbSecurityGroupMode {
    /// Rules on the nodes' security groups; the NLB has no group (upstream default).
    #[default]
    Unmanaged,
    /// An owned security group is created for and attached to each NLB.
    Managed,
}

/// One `[ServiceOverride "N"]` section: a custom endpoint for an AWS service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOverride {
    pub key: String,
    pub service: String,
    pub region: String,
    pub url: String,
    pub signing_region: String,
    pub signing_method: String,
    pub signing_name: String,
}

/// The `[Global]` section, typed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    pub zone: Option<String>,
    pub region: Option<String>,
    pub vpc: Option<String>,
    pub subnet_id: Option<String>,
    pub route_table_id: Option<String>,
    pub role_arn: Option<String>,
    pub source_arn: Option<String>,
    pub kubernetes_cluster_tag: Option<String>,
    pub kubernetes_cluster_id: Option<String>,
    pub disable_security_group_ingress: bool,
    pub elb_security_group: Option<String>,
    pub node_ip_families: Vec<IpFamily>,
    pub health_probe_mode: HealthProbeMode,
    pub shared_health_probe_port: u16,
    pub shared_health_probe_path: String,
    pub supported_topology_instance_type_pattern: Option<String>,
    pub nlb_security_group_mode: NlbSecurityGroupMode,
    pub service_overrides: Vec<ServiceOverride>,
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            zone: None,
            region: None,
            vpc: None,
            subnet_id: None,
            route_table_id: None,
            role_arn: None,
            source_arn: None,
            kubernetes_cluster_tag: None,
            kubernetes_cluster_id: None,
            disable_security_group_ingress: false,
            elb_security_group: None,
            node_ip_families: vec![IpFamily::Ipv4],
            health_probe_mode: HealthProbeMode::ServiceNodePort,
            shared_health_probe_port: 10256,
            shared_health_probe_path: "/healthz".to_string(),
            supported_topology_instance_type_pattern: None,
            nlb_security_group_mode: NlbSecurityGroupMode::Unmanaged,
            service_overrides: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CloudConfigError {
    #[error("cloud config {path}: cannot read: {error}")]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cloud config {path}:{line}: {message}")]
    Syntax {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("cloud config {path}:{line}: [{section}] {key}: {message}")]
    Key {
        path: PathBuf,
        line: usize,
        section: String,
        key: String,
        message: String,
    },
    #[error("cloud config {path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

const GLOBAL_KEYS: &[&str] = &[
    "Zone",
    "Region",
    "VPC",
    "SubnetID",
    "RouteTableID",
    "RoleARN",
    "SourceARN",
    "KubernetesClusterTag",
    "KubernetesClusterID",
    "DisableSecurityGroupIngress",
    "ElbSecurityGroup",
    "NodeIPFamilies",
    "ClusterServiceLoadBalancerHealthProbeMode",
    "ClusterServiceSharedLoadBalancerHealthProbePort",
    "ClusterServiceSharedLoadBalancerHealthProbePath",
    "SupportedTopologyInstanceTypePattern",
    "NLBSecurityGroupMode",
];

const OVERRIDE_KEYS: &[&str] = &[
    "Service",
    "Region",
    "URL",
    "SigningRegion",
    "SigningMethod",
    "SigningName",
];

/// Line numbers of `key = value` lines, by (lowercased section, lowercased key),
/// in file order. rust-ini keeps values but not positions, and every error we
/// report must point at a line.
struct LineIndex(
    HashMap<(String, String), Vec<usize>>,
    HashMap<String, usize>,
);

impl LineIndex {
    fn build(text: &str) -> LineIndex {
        let mut keys: HashMap<(String, String), Vec<usize>> = HashMap::new();
        let mut sections = HashMap::new();
        let mut section = String::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.starts_with('[') {
                section = normalize_section(line.trim_start_matches('[').trim_end_matches(']'));
                sections.entry(section.clone()).or_insert(i + 1);
            } else if !(line.is_empty() || line.starts_with(';') || line.starts_with('#')) {
                let key = line
                    .split(['=', ':'])
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase();
                keys.entry((section.clone(), key)).or_default().push(i + 1);
            }
        }
        LineIndex(keys, sections)
    }

    fn line(&self, section: &str, key: &str, occurrence: usize) -> usize {
        let lines = self.0.get(&(section.to_string(), key.to_ascii_lowercase()));
        lines
            .and_then(|l| l.get(occurrence).or(l.last()).copied())
            .or_else(|| self.1.get(section).copied())
            .unwrap_or(0)
    }
}

/// `ServiceOverride "1"` -> `serviceoverride "1"`: the section name is
/// case-insensitive, the quoted subsection is not (gcfg rules).
fn normalize_section(raw: &str) -> String {
    let raw = raw.trim();
    match raw.split_once(char::is_whitespace) {
        Some((name, sub)) => format!("{} {}", name.to_ascii_lowercase(), sub.trim()),
        None => raw.to_ascii_lowercase(),
    }
}

impl CloudConfig {
    /// Loads and validates a cloud.conf file.
    pub fn load(path: &Path) -> Result<CloudConfig, CloudConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| CloudConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        CloudConfig::parse(&text, path)
    }

    /// Parses cloud.conf text; `path` is used only in error messages.
    pub fn parse(text: &str, path: &Path) -> Result<CloudConfig, CloudConfigError> {
        let opts = ParseOption {
            enabled_quote: true,
            enabled_escape: true,
            ..ParseOption::default()
        };
        let ini = Ini::load_from_str_opt(&expand_bare_keys(text), opts).map_err(|e| {
            CloudConfigError::Syntax {
                path: path.to_path_buf(),
                line: e.line + 1,
                message: e.msg.to_string(),
            }
        })?;
        let index = LineIndex::build(text);
        let mut cfg = CloudConfig::default();
        let mut families_seen = false;
        let mut overrides: BTreeMap<String, BTreeMap<&'static str, (String, usize)>> =
            BTreeMap::new();
        let mut occurrences: HashMap<(String, String), usize> = HashMap::new();

        for (section, props) in ini.iter() {
            let Some(section_raw) = section else {
                if let Some((key, _)) = props.iter().next() {
                    return Err(CloudConfigError::Syntax {
                        path: path.to_path_buf(),
                        line: index.line("", key, 0),
                        message: format!(
                            "key {key:?} is outside any section; put it under [Global]"
                        ),
                    });
                }
                continue;
            };
            let section_norm = normalize_section(section_raw);
            let (kind, subsection) = match section_norm.split_once(' ') {
                Some((kind, sub)) => (kind.to_string(), Some(sub.trim_matches('"').to_string())),
                None => (section_norm.clone(), None),
            };
            for (key, value) in props.iter() {
                let n = occurrences
                    .entry((section_norm.clone(), key.to_ascii_lowercase()))
                    .or_default();
                let line = index.line(&section_norm, key, *n);
                *n += 1;
                let key_err = |message: String| CloudConfigError::Key {
                    path: path.to_path_buf(),
                    line,
                    section: section_raw.to_string(),
                    key: key.to_string(),
                    message,
                };
                let value = value.trim();
                match (kind.as_str(), &subsection) {
                    ("global", None) => {
                        let canonical = GLOBAL_KEYS
                            .iter()
                            .find(|k| k.eq_ignore_ascii_case(key))
                            .ok_or_else(|| {
                                key_err(format!(
                                    "unknown key; [Global] accepts {}",
                                    GLOBAL_KEYS.join(", ")
                                ))
                            })?;
                        let text = || (!value.is_empty()).then(|| value.to_string());
                        match *canonical {
                            "Zone" => cfg.zone = text(),
                            "Region" => cfg.region = text(),
                            "VPC" => cfg.vpc = text(),
                            "SubnetID" => cfg.subnet_id = text(),
                            "RouteTableID" => cfg.route_table_id = text(),
                            "RoleARN" => {
                                if !value.is_empty() && !value.starts_with("arn:") {
                                    return Err(key_err(format!(
                                        "{value:?} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)"
                                    )));
                                }
                                cfg.role_arn = text()
                            }
                            "SourceARN" => cfg.source_arn = text(),
                            "KubernetesClusterTag" => cfg.kubernetes_cluster_tag = text(),
                            "KubernetesClusterID" => cfg.kubernetes_cluster_id = text(),
                            "DisableSecurityGroupIngress" => {
                                cfg.disable_security_group_ingress =
                                    parse_bool(value).map_err(key_err)?
                            }
                            "ElbSecurityGroup" => cfg.elb_security_group = text(),
                            "NodeIPFamilies" => {
                                if !families_seen {
                                    cfg.node_ip_families.clear();
                                    families_seen = true;
                                }
                                // Accept both repeated keys and a comma list.
                                for item in
                                    value.split(',').map(str::trim).filter(|s| !s.is_empty())
                                {
                                    let family = match item.to_ascii_lowercase().as_str() {
                                        "ipv4" => IpFamily::Ipv4,
                                        "ipv6" => IpFamily::Ipv6,
                                        _ => {
                                            return Err(key_err(format!(
                                                "{item:?} is not allowed; use ipv4 or ipv6"
                                            )));
                                        }
                                    };
                                    if cfg.node_ip_families.contains(&family) {
                                        return Err(key_err(format!("{item:?} is listed twice")));
                                    }
                                    cfg.node_ip_families.push(family);
                                }
                            }
                            "ClusterServiceLoadBalancerHealthProbeMode" => {
                                // Case-sensitive, as upstream compares.
                                cfg.health_probe_mode = match value {
                                    "" | "ServiceNodePort" | "Cluster" => {
                                        HealthProbeMode::ServiceNodePort
                                    }
                                    "Shared" => HealthProbeMode::Shared,
                                    _ => {
                                        return Err(key_err(format!(
                                            "{value:?} is not allowed; use ServiceNodePort (the default) or Shared"
                                        )));
                                    }
                                }
                            }
                            "ClusterServiceSharedLoadBalancerHealthProbePort" => {
                                // Upstream treats 0 (and an empty value) as "use the default, 10256".
                                cfg.shared_health_probe_port = match value.parse::<u16>() {
                                    _ if value.is_empty() => 10256,
                                    Ok(0) => 10256,
                                    Ok(p) => p,
                                    Err(_) => {
                                        return Err(key_err(format!(
                                            "{value:?} is not a port number (1-65535, or 0 for the default 10256)"
                                        )));
                                    }
                                }
                            }
                            "ClusterServiceSharedLoadBalancerHealthProbePath" => {
                                // Upstream treats an empty value as "use the default, /healthz".
                                if value.is_empty() {
                                    cfg.shared_health_probe_path = "/healthz".to_string();
                                } else if !value.starts_with('/') {
                                    return Err(key_err(format!(
                                        "{value:?} must be an HTTP path starting with /"
                                    )));
                                } else {
                                    cfg.shared_health_probe_path = value.to_string()
                                }
                            }
                            "SupportedTopologyInstanceTypePattern" => {
                                if let Err(e) = regex::Regex::new(value) {
                                    return Err(key_err(format!(
                                        "{value:?} is not a valid regular expression: {e}"
                                    )));
                                }
                                cfg.supported_topology_instance_type_pattern = text()
                            }
                            "NLBSecurityGroupMode" => {
                                cfg.nlb_security_group_mode = match value {
                                    "" => NlbSecurityGroupMode::Unmanaged,
                                    "Managed" => NlbSecurityGroupMode::Managed,
                                    _ => {
                                        return Err(key_err(format!(
                                            "{value:?} is not allowed; use Managed or leave it unset"
                                        )));
                                    }
                                }
                            }
                            other => {
                                return Err(key_err(format!(
                                    "{other} is listed as a [Global] key but not handled; report this as a bug"
                                )));
                            }
                        }
                    }
                    ("serviceoverride", Some(sub)) => {
                        let canonical = OVERRIDE_KEYS
                            .iter()
                            .find(|k| k.eq_ignore_ascii_case(key))
                            .ok_or_else(|| {
                                key_err(format!(
                                    "unknown key; [ServiceOverride \"N\"] accepts {}",
                                    OVERRIDE_KEYS.join(", ")
                                ))
                            })?;
                        overrides
                            .entry(sub.clone())
                            .or_default()
                            .insert(canonical, (value.to_string(), line));
                    }
                    _ => {
                        return Err(CloudConfigError::Syntax {
                            path: path.to_path_buf(),
                            line: index.line(&section_norm, key, 0).saturating_sub(0),
                            message: format!(
                                "unknown section [{section_raw}]; allowed: [Global], [ServiceOverride \"N\"]"
                            ),
                        });
                    }
                }
            }
        }

        for (name, keys) in overrides {
            let get = |k: &str| keys.get(k).map(|(v, _)| v.clone()).unwrap_or_default();
            let first_line = keys.values().map(|(_, l)| *l).min().unwrap_or(0);
            for required in ["Service", "Region", "URL", "SigningRegion"] {
                if get(required).is_empty() {
                    return Err(CloudConfigError::Key {
                        path: path.to_path_buf(),
                        line: first_line,
                        section: format!("ServiceOverride \"{name}\""),
                        key: required.to_string(),
                        message: "is required in every [ServiceOverride] section (Service, Region, URL, SigningRegion)".to_string(),
                    });
                }
            }
            let url = get("URL");
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                let line = keys.get("URL").map_or(first_line, |(_, l)| *l);
                return Err(CloudConfigError::Key {
                    path: path.to_path_buf(),
                    line,
                    section: format!("ServiceOverride \"{name}\""),
                    key: "URL".to_string(),
                    message: format!("{url:?} is not an http(s) URL"),
                });
            }
            let entry = ServiceOverride {
                key: name.clone(),
                service: get("Service"),
                region: get("Region"),
                url,
                signing_region: get("SigningRegion"),
                signing_method: get("SigningMethod"),
                signing_name: get("SigningName"),
            };
            if let Some(dup) = cfg
                .service_overrides
                .iter()
                .find(|o| o.service == entry.service && o.region == entry.region)
            {
                return Err(CloudConfigError::Invalid {
                    path: path.to_path_buf(),
                    message: format!(
                        "[ServiceOverride \"{}\"] and [ServiceOverride \"{}\"] both override service {:?} in region {:?}; keep one",
                        dup.key, name, entry.service, entry.region
                    ),
                });
            }
            cfg.service_overrides.push(entry);
        }
        if cfg.node_ip_families.is_empty() {
            cfg.node_ip_families.push(IpFamily::Ipv4);
        }
        Ok(cfg)
    }

    /// The cluster ID from the file: KubernetesClusterID, else the legacy KubernetesClusterTag.
    pub fn cluster_id(&self) -> Option<&str> {
        self.kubernetes_cluster_id
            .as_deref()
            .or(self.kubernetes_cluster_tag.as_deref())
    }

    /// Whether the cluster ID is the legacy `KubernetesClusterTag` (no
    /// `KubernetesClusterID`): the cluster's instances carry the legacy
    /// `KubernetesCluster` tag.
    pub fn cluster_id_is_legacy(&self) -> bool {
        self.kubernetes_cluster_id.is_none() && self.kubernetes_cluster_tag.is_some()
    }

    /// The region from the file: Region, else derived from Zone (us-east-1a -> us-east-1).
    pub fn region(&self) -> Option<String> {
        self.region.clone().or_else(|| {
            self.zone
                .as_ref()
                .filter(|z| z.len() > 1 && z.ends_with(|c: char| c.is_ascii_lowercase()))
                .map(|z| z[..z.len() - 1].to_string())
        })
    }

    /// The endpoint override for `service` (`ec2`, `elasticloadbalancing`, `sts`) in `region`.
    pub fn service_override(&self, service: &str, region: &str) -> Option<&ServiceOverride> {
        self.service_overrides
            .iter()
            .find(|o| o.service.eq_ignore_ascii_case(service) && o.region == region)
    }
}

/// gcfg lets a boolean be written as a bare key (`DisableSecurityGroupIngress`
/// alone means true); rust-ini needs `key = value`, so bare keys are rewritten
/// in place, keeping line numbers.
fn expand_bare_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let t = line.trim();
        let bare = !(t.is_empty() || t.starts_with(['[', ';', '#']) || t.contains(['=', ':']));
        out.push_str(line);
        if bare {
            out.push_str(" = true");
        }
        out.push('\n');
    }
    out
}

/// gcfg booleans; an explicitly empty value is false.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "" => Ok(false),
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("{value:?} is not a boolean; use true or false")),
    }
}

#[cfg(test)]
mod tests {
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
KubernetesClusterTag = legacy
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
            .service_override("elasticloadbalancing", "us-west-2")
            .unwrap();
        assert_eq!(elb.url, "https://elb.example.com");
        assert!(cfg.service_override("ec2", "eu-west-1").is_none());
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
        assert!(
            !parse("[Global]\nKubernetesClusterTag=old\nKubernetesClusterID=new\n")
                .unwrap()
                .cluster_id_is_legacy()
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
    fn unknown_key_names_file_line_key_and_allowed_keys() {
        let err = parse("[Global]\nZone = us-east-1a\nKubernetesClusterIDD = x\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("cloud config /etc/kubernetes/cloud.conf:3:"),
            "{err}"
        );
        assert!(
            err.contains("KubernetesClusterIDD") && err.contains("KubernetesClusterID,"),
            "{err}"
        );
    }

    #[test]
    fn bad_values_name_the_value_and_what_is_allowed() {
        let cases = [
            ("[Global]\nNodeIPFamilies = ipv5\n", "ipv5", "ipv4 or ipv6"),
            (
                "[Global]\nDisableSecurityGroupIngress = maybe\n",
                "maybe",
                "true or false",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Local\n",
                "Local",
                "ServiceNodePort (the default) or Shared",
            ),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 99999\n",
                "99999",
                "1-65535",
            ),
            (
                "[Global]\nNLBSecurityGroupMode = managed\n",
                "managed",
                "Managed",
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
        let err = parse("[Bogus]\nx = 1\n").unwrap_err().to_string();
        assert!(
            err.contains("unknown section") && err.contains("Bogus"),
            "{err}"
        );
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
        // Upstream compares case-sensitively; so do we.
        assert!(mode("shared").is_err());
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
    }
}
