//! The cloud.conf parser proper: one pass over rust-ini's sections that
//! types known keys, collects `[ServiceOverride]` sections and records a
//! warning for every unknown key or section.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use ini::Properties;

use super::{
    CloudConfig, CloudConfigError, CloudConfigWarning, GLOBAL_KEYS, HealthProbeMode, IpFamily,
    NlbNodeIngress, NlbSecurityGroupMode, OVERRIDE_KEYS, RefusedValue, ServiceOverride,
};

/// Section kinds gcfg maps onto upstream's struct, as written in messages.
const SECTIONS: &[&str] = &["Global", "ServiceOverride"];

type OverrideKeys = BTreeMap<&'static str, (String, usize)>;

pub(super) struct Parser<'a> {
    path: &'a Path,
    index: LineIndex,
    cfg: CloudConfig,
    families_seen: bool,
    overrides: BTreeMap<String, OverrideKeys>,
    warned_sections: HashSet<String>,
    warnings: Vec<CloudConfigWarning>,
}

impl<'a> Parser<'a> {
    pub(super) fn new(path: &'a Path, text: &str) -> Parser<'a> {
        Parser {
            path,
            index: LineIndex::build(text),
            cfg: CloudConfig::default(),
            families_seen: false,
            overrides: BTreeMap::new(),
            warned_sections: HashSet::new(),
            warnings: Vec::new(),
        }
    }

    /// One section as rust-ini read it (`None`: keys before any section).
    pub(super) fn section(
        &mut self,
        section: Option<&str>,
        props: &Properties,
    ) -> Result<(), CloudConfigError> {
        let Some(section_raw) = section else {
            if let Some((key, _)) = props.iter().next() {
                return Err(CloudConfigError::Syntax {
                    path: self.path.to_path_buf(),
                    line: self.index.next("", key),
                    message: format!("key {key:?} is outside any section; put it under [Global]"),
                });
            }
            return Ok(());
        };
        let section_norm = normalize_section(section_raw);
        let (kind, subsection) = match section_norm.split_once(' ') {
            Some((kind, sub)) => (kind.to_string(), Some(sub.trim_matches('"').to_string())),
            None => (section_norm.clone(), None),
        };
        match (kind.as_str(), subsection) {
            ("global", None) => {
                for (key, value) in props.iter() {
                    let line = self.index.next(&section_norm, key);
                    self.global_key(section_raw, key, value.trim(), line)?;
                }
            }
            // gcfg maps `[ServiceOverride]` with no name to the name "".
            ("serviceoverride", sub) => {
                let sub = sub.unwrap_or_default();
                for (key, value) in props.iter() {
                    let line = self.index.next(&section_norm, key);
                    self.override_key(section_raw, &sub, key, value.trim(), line);
                }
            }
            // gcfg (fatal-only) skips unknown sections, and a subsection of
            // [Global], with everything in them.
            _ => self.unknown_section(section_raw, &section_norm, &kind),
        }
        Ok(())
    }

    fn unknown_section(&mut self, section_raw: &str, section_norm: &str, kind: &str) {
        if !self.warned_sections.insert(section_norm.to_string()) {
            return;
        }
        self.warnings.push(CloudConfigWarning {
            path: self.path.to_path_buf(),
            line: self.index.section_line(section_norm),
            section: section_raw.to_string(),
            key: None,
            nearest: nearest(kind, SECTIONS),
        });
    }

    fn unknown_key(&mut self, section_raw: &str, key: &str, line: usize, known: &[&'static str]) {
        self.warnings.push(CloudConfigWarning {
            path: self.path.to_path_buf(),
            line,
            section: section_raw.to_string(),
            key: Some(key.to_string()),
            nearest: nearest(key, known),
        });
    }

    fn global_key(
        &mut self,
        section_raw: &str,
        key: &str,
        value: &str,
        line: usize,
    ) -> Result<(), CloudConfigError> {
        let Some(canonical) = GLOBAL_KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)) else {
            self.unknown_key(section_raw, key, line, GLOBAL_KEYS);
            return Ok(());
        };
        self.set_global(canonical, value)
            .map_err(|message| CloudConfigError::Key {
                path: self.path.to_path_buf(),
                line,
                section: section_raw.to_string(),
                key: key.to_string(),
                message,
            })
    }

    fn override_key(&mut self, section_raw: &str, name: &str, key: &str, value: &str, line: usize) {
        let Some(canonical) = OVERRIDE_KEYS.iter().find(|k| k.eq_ignore_ascii_case(key)) else {
            self.unknown_key(section_raw, key, line, OVERRIDE_KEYS);
            return;
        };
        self.overrides
            .entry(name.to_string())
            .or_default()
            .insert(canonical, (value.to_string(), line));
    }

    /// Types one known [Global] key; the error is the message for its line.
    fn set_global(&mut self, key: &str, value: &str) -> Result<(), String> {
        if value == BARE && key != "DisableSecurityGroupIngress" {
            // gcfg: "missing value" for a bare key of any other type.
            return Err("needs a value: only a boolean may be written as a bare key".into());
        }
        let cfg = &mut self.cfg;
        let text = || (!value.is_empty()).then(|| value.to_string());
        match key {
            "Zone" => {
                if !value.is_empty() && super::region_of_zone(value).is_none() {
                    return Err(format!(
                        "{value:?} is not an availability zone name (e.g. us-east-1a, or a local zone such as us-west-2-lax-1a): Zone decides the region"
                    ));
                }
                cfg.zone = text();
            }
            "Region" => cfg.region = text(),
            "VPC" => cfg.vpc = text(),
            "SubnetID" => cfg.subnet_id = text(),
            "RouteTableID" => cfg.route_table_id = text(),
            "RoleARN" => {
                if !value.is_empty() && !value.starts_with("arn:") {
                    return Err(format!(
                        "{value:?} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)"
                    ));
                }
                cfg.role_arn = text()
            }
            "SourceARN" => cfg.source_arn = text(),
            "KubernetesClusterTag" => cfg.kubernetes_cluster_tag = text(),
            "KubernetesClusterID" => cfg.kubernetes_cluster_id = text(),
            "DisableSecurityGroupIngress" => {
                cfg.disable_security_group_ingress = parse_bool(value)?
            }
            "ElbSecurityGroup" => cfg.elb_security_group = text(),
            "NodeIPFamilies" => {
                if !self.families_seen {
                    cfg.node_ip_families.clear();
                    self.families_seen = true;
                }
                push_families(cfg, value)
            }
            "ClusterServiceLoadBalancerHealthProbeMode" => set_probe_mode(cfg, value),
            "ClusterServiceSharedLoadBalancerHealthProbePort" => {
                cfg.shared_health_probe_port = parse_probe_port(cfg, value)?
            }
            "ClusterServiceSharedLoadBalancerHealthProbePath" => {
                cfg.shared_health_probe_path = parse_probe_path(cfg, value)
            }
            "SupportedTopologyInstanceTypePattern" => {
                if let Err(e) = regex::Regex::new(value) {
                    return Err(format!("{value:?} is not a valid regular expression: {e}"));
                }
                cfg.supported_topology_instance_type_pattern = text()
            }
            "NLBSecurityGroupMode" => set_nlb_group_mode(cfg, value),
            "NLBNodeIngress" => set_node_ingress(cfg, value),
            "NLBListenerSettings" => set_listener_settings(cfg, value),
            other => {
                return Err(format!(
                    "{other} is listed as a [Global] key but not handled; report this as a bug"
                ));
            }
        }
        Ok(())
    }

    /// Validates the collected `[ServiceOverride]` sections and returns the result.
    pub(super) fn finish(
        mut self,
    ) -> Result<(CloudConfig, Vec<CloudConfigWarning>), CloudConfigError> {
        for (name, keys) in std::mem::take(&mut self.overrides) {
            let entry = self.override_entry(&name, &keys)?;
            if let Some(dup) = self
                .cfg
                .service_overrides
                .iter()
                .find(|o| o.service == entry.service && o.region == entry.region)
            {
                return Err(CloudConfigError::Invalid {
                    path: self.path.to_path_buf(),
                    message: format!(
                        "[ServiceOverride \"{}\"] and [ServiceOverride \"{}\"] both override service {:?} in region {:?}; keep one",
                        dup.key, name, entry.service, entry.region
                    ),
                });
            }
            self.cfg.service_overrides.push(entry);
        }
        if self.cfg.node_ip_families.is_empty() {
            self.cfg.node_ip_families.push(IpFamily::Ipv4);
        }
        if let (Some(tag), Some(id)) = (
            &self.cfg.kubernetes_cluster_tag,
            &self.cfg.kubernetes_cluster_id,
        ) && tag != id
        {
            // Upstream's awsTagging.init refuses the pair the same way.
            return Err(CloudConfigError::Invalid {
                path: self.path.to_path_buf(),
                message: format!(
                    "KubernetesClusterTag {tag:?} and KubernetesClusterID {id:?} name different clusters; give one cluster ID (KubernetesClusterTag also writes the legacy KubernetesCluster tag)"
                ),
            });
        }
        Ok((self.cfg, self.warnings))
    }

    /// One `[ServiceOverride "name"]`, with upstream's required keys checked.
    fn override_entry(
        &self,
        name: &str,
        keys: &OverrideKeys,
    ) -> Result<ServiceOverride, CloudConfigError> {
        let get = |k: &str| keys.get(k).map(|(v, _)| v.clone()).unwrap_or_default();
        let first_line = keys.values().map(|(_, l)| *l).min().unwrap_or(0);
        let key_err = |key: &str, message: String| CloudConfigError::Key {
            path: self.path.to_path_buf(),
            line: keys.get(key).map_or(first_line, |(_, l)| *l),
            section: format!("ServiceOverride \"{name}\""),
            key: key.to_string(),
            message,
        };
        for required in ["Service", "Region", "URL", "SigningRegion"] {
            if get(required).is_empty() {
                return Err(key_err(
                    required,
                    "is required in every [ServiceOverride] section (Service, Region, URL, SigningRegion)".to_string(),
                ));
            }
        }
        let url = get("URL");
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(key_err("URL", format!("{url:?} is not an http(s) URL")));
        }
        Ok(ServiceOverride {
            key: name.to_string(),
            service: get("Service"),
            region: get("Region"),
            url,
            signing_region: get("SigningRegion"),
            signing_method: get("SigningMethod"),
            signing_name: get("SigningName"),
        })
    }
}

/// Appends a `NodeIPFamilies` value: repeated keys and comma lists both
/// work. The Go CCM adds addresses for `ipv4` and `ipv6` and skips any other
/// value; so does this CCM, saying so (a list left empty means `ipv4`).
fn push_families(cfg: &mut CloudConfig, value: &str) {
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let family = match item.to_ascii_lowercase().as_str() {
            "ipv4" => IpFamily::Ipv4,
            "ipv6" => IpFamily::Ipv6,
            _ => {
                cfg.tolerated.push(format!(
                    "NodeIPFamilies {item:?} is skipped, as the Go CCM skips it: use ipv4 or ipv6"
                ));
                continue;
            }
        };
        if !cfg.node_ip_families.contains(&family) {
            cfg.node_ip_families.push(family);
        }
    }
}

/// Upstream's values, compared case-sensitively as upstream does (`Cluster`
/// is this project's earlier name for `ServiceNodePort`). The Go CCM's
/// Classic ELB path reads only `Shared`; its NLB health check fails on any
/// other value than its two: so NLBs are refused on one.
fn set_probe_mode(cfg: &mut CloudConfig, value: &str) {
    cfg.health_probe_mode = match value {
        "" | "ServiceNodePort" | "Cluster" => HealthProbeMode::ServiceNodePort,
        "Shared" => HealthProbeMode::Shared,
        _ => {
            cfg.nlb_refusals.push(RefusedValue {
                key: "ClusterServiceLoadBalancerHealthProbeMode",
                value: value.to_string(),
                allowed: "ServiceNodePort (the default) or Shared, case-sensitive",
            });
            HealthProbeMode::ServiceNodePort
        }
    };
}

/// The Go CCM starts with any value, then fails each NLB sync on one other
/// than `Managed` (`IsNLBSecurityGroupModeManaged`).
fn set_nlb_group_mode(cfg: &mut CloudConfig, value: &str) {
    cfg.nlb_security_group_mode = match value {
        "" => NlbSecurityGroupMode::Unmanaged,
        "Managed" => NlbSecurityGroupMode::Managed,
        _ => {
            cfg.nlb_refusals.push(RefusedValue {
                key: "NLBSecurityGroupMode",
                value: value.to_string(),
                allowed: "Managed, or leave it unset",
            });
            NlbSecurityGroupMode::Unmanaged
        }
    };
}

/// This CCM's key, unknown to the Go CCM, which starts whatever its value:
/// a value this CCM does not know is skipped, saying so, and the Go CCM's
/// CIDR rules (the default) stay.
fn set_node_ingress(cfg: &mut CloudConfig, value: &str) {
    cfg.nlb_node_ingress = match value {
        "" | "Cidr" => NlbNodeIngress::Cidr,
        "LoadBalancerGroup" => NlbNodeIngress::LoadBalancerGroup,
        "SharedBackendGroup" => NlbNodeIngress::SharedBackendGroup,
        _ => {
            cfg.tolerated.push(format!(
                "NLBNodeIngress {value:?} is skipped (the Go CCM skips the whole key), so the Go CCM's per-port CIDR rules stay: use Cidr, LoadBalancerGroup or SharedBackendGroup (case-sensitive)"
            ));
            NlbNodeIngress::Cidr
        }
    };
}

/// This CCM's key, unknown to the Go CCM: `true` applies the NLB settings
/// the Go CCM leaves unsent; a value other than `true` or `false` is
/// skipped, saying so, and they stay unsent (the Go CCM's behaviour).
fn set_listener_settings(cfg: &mut CloudConfig, value: &str) {
    cfg.nlb_listener_settings = match value {
        "true" => true,
        "" | "false" => false,
        _ => {
            cfg.tolerated.push(format!(
                "NLBListenerSettings {value:?} is skipped (the Go CCM skips the whole key), so the NLB health-check timeout, ALPN policy and listener attributes stay unsent, as the Go CCM leaves them: use true or false"
            ));
            false
        }
    };
}

/// Upstream treats 0 (and an empty value) as "the default, 10256". A number
/// gcfg reads (an int32) that is no port starts the Go CCM, which then fails
/// each Shared-mode health check on it: so it refuses those syncs here.
fn parse_probe_port(cfg: &mut CloudConfig, value: &str) -> Result<u16, String> {
    match value.parse::<i32>() {
        _ if value.is_empty() => Ok(10256),
        Ok(0) => Ok(10256),
        Ok(p) => Ok(u16::try_from(p).ok().filter(|p| *p > 0).unwrap_or_else(|| {
            cfg.shared_probe_refusals.push(RefusedValue {
                key: "ClusterServiceSharedLoadBalancerHealthProbePort",
                value: value.to_string(),
                allowed: "a port number from 1 to 65535, or 0 for the default 10256",
            });
            10256
        })),
        Err(_) => Err(format!(
            "{value:?} is not a port number (1-65535, or 0 for the default 10256)"
        )),
    }
}

/// Upstream treats an empty value as "the default, /healthz"; it starts
/// with a path without the leading `/` and fails each Shared-mode health
/// check on it: so it refuses those syncs here.
fn parse_probe_path(cfg: &mut CloudConfig, value: &str) -> String {
    if value.is_empty() {
        "/healthz".to_string()
    } else if value.starts_with('/') {
        value.to_string()
    } else {
        cfg.shared_probe_refusals.push(RefusedValue {
            key: "ClusterServiceSharedLoadBalancerHealthProbePath",
            value: value.to_string(),
            allowed: "an HTTP path starting with /",
        });
        "/healthz".to_string()
    }
}

/// The known name closest to `name` (case-insensitive edit distance).
pub(super) fn nearest(name: &str, known: &[&'static str]) -> &'static str {
    let name = name.to_ascii_lowercase();
    known
        .iter()
        .min_by_key(|k| edit_distance(&name, &k.to_ascii_lowercase()))
        .copied()
        .unwrap_or("")
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diag + usize::from(ca != *cb));
            diag = above;
        }
    }
    row[b.len()]
}

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

    /// The line of the next `key` of `section` in file order (the last one
    /// again once every one was taken), else the section's line.
    fn next(&mut self, section: &str, key: &str) -> usize {
        match self
            .0
            .get_mut(&(section.to_string(), key.to_ascii_lowercase()))
        {
            Some(lines) if lines.len() > 1 => lines.remove(0),
            Some(lines) if !lines.is_empty() => lines[0],
            _ => self.section_line(section),
        }
    }

    fn section_line(&self, section: &str) -> usize {
        self.1.get(section).copied().unwrap_or(0)
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

/// gcfg lets a boolean be written as a bare key (`DisableSecurityGroupIngress`
/// alone means true); rust-ini needs `key = value`, so bare keys are rewritten
/// in place, keeping line numbers.
pub(super) fn expand_bare_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let t = line.trim();
        let bare = !(t.is_empty() || t.starts_with(['[', ';', '#']) || t.contains(['=', ':']));
        out.push_str(line);
        if bare {
            out.push_str(" = ");
            out.push_str(BARE);
        }
        out.push('\n');
    }
    out
}

/// The value a bare key is rewritten with: true for a boolean, an error
/// for any other key, as gcfg has it.
const BARE: &str = "__gcfg_bare_key__";

/// gcfg booleans; an explicitly empty value is false.
fn parse_bool(value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "" => Ok(false),
        v if v == BARE => Ok(true),
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("{value:?} is not a boolean; use true or false")),
    }
}
