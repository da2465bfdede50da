//! `cloud.conf`: the INI (gcfg) file the Go aws-cloud-controller-manager reads.
//!
//! Same sections and keys as upstream: `[Global]` and `[ServiceOverride "N"]`.
//! As in gcfg, section and key names are case-insensitive, a key may repeat
//! where its value is a list (NodeIPFamilies), and a bare key means `true` for
//! booleans. As upstream (gcfg in fatal-only mode), an unknown key or
//! section does not stop start-up; unlike upstream, each is logged as a
//! warning with its file, line and the nearest known name. A bad value of a
//! known key stops start-up with the file, line, key and what is allowed.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use ini::{Ini, ParseOption};
use regex::Regex;

mod parse;
#[cfg(test)]
mod upstream;
use parse::expand_bare_keys;

/// IP families reported as node addresses, in order (`NodeIPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IpFamily {
    Ipv4,
    Ipv6,
}

/// `ClusterServiceLoadBalancerHealthProbeMode`: upstream's values are
/// `ServiceNodePort` (also an empty value, the default) and `Shared`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum HealthProbeMode {
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
pub(crate) enum NlbSecurityGroupMode {
    /// Rules on the nodes' security groups; the NLB has no group (upstream default).
    #[default]
    Unmanaged,
    /// An owned security group is created for and attached to each NLB.
    Managed,
}

/// `NLBNodeIngress` (this CCM's, the Go CCM ignores it): what an NLB's
/// backend node groups admit. Only `Cidr` is the Go CCM's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum NlbNodeIngress {
    /// Per-port client and health rules from CIDRs, and the MTU rule, in
    /// every backend node group, for every NLB (the Go CCM's rules).
    #[default]
    Cidr,
    /// For an NLB that carries a security group (`NLBSecurityGroupMode =
    /// Managed`, owned or bring-your-own): one rule in each backend node
    /// group admitting that group, instead of the CIDR rules. An NLB
    /// without a group keeps the CIDR rules.
    LoadBalancerGroup,
    /// For an NLB that carries a security group: the NLB carries the
    /// cluster's shared backend group too (one per cluster, made by this
    /// CCM), and each backend node group holds one rule admitting it,
    /// whatever the number of NLBs. An NLB without a group keeps the CIDR
    /// rules.
    SharedBackendGroup,
}

/// One `[ServiceOverride "N"]` section: a custom endpoint for an AWS service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServiceOverride {
    key: String,
    service: String,
    region: String,
    pub(crate) url: String,
    pub(crate) signing_region: String,
    signing_method: String,
    pub(crate) signing_name: String,
}

/// The AWS APIs a `[ServiceOverride]` can point at another endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OverrideService {
    Ec2,
    /// Classic ELB.
    Elb,
    Elbv2,
    Sts,
    /// The instance metadata service (IMDS); matched in any region.
    Imds,
}

impl OverrideService {
    pub(crate) const ALL: [OverrideService; 5] = [
        OverrideService::Ec2,
        OverrideService::Elb,
        OverrideService::Elbv2,
        OverrideService::Sts,
        OverrideService::Imds,
    ];

    /// Upstream's name (the Go SDK's service ID), then the names this
    /// project accepted before.
    fn names(self) -> (&'static str, &'static [&'static str]) {
        match self {
            OverrideService::Ec2 => ("EC2", &[]),
            OverrideService::Elb => ("Elastic Load Balancing", &["elasticloadbalancing"]),
            OverrideService::Elbv2 => ("Elastic Load Balancing v2", &["elasticloadbalancing"]),
            OverrideService::Sts => ("STS", &[]),
            OverrideService::Imds => ("ec2imds", &[]),
        }
    }
}

/// The `[Global]` section, typed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfig {
    pub(crate) zone: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) vpc: Option<String>,
    pub(crate) subnet_id: Option<String>,
    pub(crate) route_table_id: Option<String>,
    pub(crate) role_arn: Option<String>,
    pub(crate) source_arn: Option<String>,
    pub(crate) kubernetes_cluster_tag: Option<String>,
    pub(crate) kubernetes_cluster_id: Option<String>,
    pub(crate) disable_security_group_ingress: bool,
    pub(crate) elb_security_group: Option<String>,
    pub(crate) node_ip_families: Vec<IpFamily>,
    pub(crate) health_probe_mode: HealthProbeMode,
    pub(crate) shared_health_probe_port: u16,
    pub(crate) shared_health_probe_path: String,
    pub(crate) supported_topology_instance_type_pattern: Option<String>,
    pub(crate) nlb_security_group_mode: NlbSecurityGroupMode,
    pub(crate) nlb_node_ingress: NlbNodeIngress,
    /// `NLBListenerSettings = true` (this CCM's key, the Go CCM skips it):
    /// NLB settings the Go CCM reads but never sends (today the health-check
    /// timeout) are applied. Off (the default): none of them is.
    pub(crate) nlb_listener_settings: bool,
    pub(crate) service_overrides: Vec<ServiceOverride>,
    /// Values the Go CCM starts with but fails every NLB sync on: each NLB
    /// is kept in upkeep instead (docs/cloud-config.md), Classic ELBs are
    /// synced as the Go CCM syncs them.
    pub(crate) nlb_refusals: Vec<RefusedValue>,
    /// Values the Go CCM starts with but fails every Shared-mode health
    /// check on: each load balancer of a Service probed through the shared
    /// port is kept in upkeep instead.
    pub(crate) shared_probe_refusals: Vec<RefusedValue>,
    /// Values taken as the Go CCM takes them, with the log line that says so.
    pub(crate) tolerated: Vec<String>,
}

/// A cloud.conf value refused for the syncs it governs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RefusedValue {
    pub(crate) key: &'static str,
    pub(crate) value: String,
    /// What is allowed.
    pub(crate) allowed: &'static str,
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
            nlb_node_ingress: NlbNodeIngress::Cidr,
            nlb_listener_settings: false,
            service_overrides: Vec::new(),
            nlb_refusals: Vec::new(),
            shared_probe_refusals: Vec::new(),
            tolerated: Vec::new(),
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

/// An unknown key or section: the Go CCM (gcfg in fatal-only mode) skips it
/// silently; this CCM skips it too, and says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudConfigWarning {
    path: PathBuf,
    line: usize,
    /// The section as written, e.g. `Global` or `ServiceOverride "1"`.
    section: String,
    /// The unknown key; `None` when the whole section is unknown.
    key: Option<String>,
    /// The known key (or section) nearest by edit distance.
    nearest: &'static str,
}

impl std::fmt::Display for CloudConfigWarning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (path, line, section) = (self.path.display(), self.line, &self.section);
        match &self.key {
            Some(key) => write!(
                f,
                "cloud config {path}:{line}: [{section}] unknown key {key:?} is ignored (the Go CCM ignores it too); nearest known key: {}",
                self.nearest
            ),
            None => write!(
                f,
                "cloud config {path}:{line}: unknown section [{section}] is ignored with all its keys (the Go CCM ignores it too); nearest known section: [{}]",
                self.nearest
            ),
        }
    }
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
    // This CCM's own keys (the Go CCM skips them as unknown).
    "NLBNodeIngress",
    "NLBListenerSettings",
];

const OVERRIDE_KEYS: &[&str] = &[
    "Service",
    "Region",
    "URL",
    "SigningRegion",
    "SigningMethod",
    "SigningName",
];

/// The region part of a zone name, as upstream's `azToRegion`: the
/// leading `letters-` groups and the digits after them (`^([a-zA-Z]+-)+\d+`;
/// Go's `\d` is ASCII, so `[0-9]` here).
pub(crate) fn region_of_zone(zone: &str) -> Option<&str> {
    static REGION: LazyLock<Option<Regex>> =
        LazyLock::new(|| Regex::new("^([a-zA-Z]+-)+[0-9]+").ok());
    REGION.as_ref()?.find(zone).map(|m| m.as_str())
}

impl CloudConfig {
    /// Loads and validates a cloud.conf file, logging one warning per
    /// unknown key or section (the Go CCM skips them silently).
    pub(crate) fn load(path: &Path) -> Result<CloudConfig, CloudConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| CloudConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let (cfg, warnings) = CloudConfig::parse_with_warnings(&text, path)?;
        for w in &warnings {
            tracing::warn!("{w}");
        }
        Ok(cfg)
    }

    /// Parses cloud.conf text; `path` is used only in messages. Unknown
    /// keys and sections are dropped; see [`CloudConfig::parse_with_warnings`]
    /// (which the product uses: this one is the unit tests' shorthand).
    #[cfg(test)]
    pub fn parse(text: &str, path: &Path) -> Result<CloudConfig, CloudConfigError> {
        CloudConfig::parse_with_warnings(text, path).map(|(cfg, _)| cfg)
    }

    /// Parses cloud.conf text. As upstream (gcfg in fatal-only mode), an
    /// unknown key or section does not stop start-up: each becomes a
    /// [`CloudConfigWarning`]. A bad value of a known key is an error.
    pub fn parse_with_warnings(
        text: &str,
        path: &Path,
    ) -> Result<(CloudConfig, Vec<CloudConfigWarning>), CloudConfigError> {
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
        let mut parser = parse::Parser::new(path, text);
        for (section, props) in ini.iter() {
            parser.section(section, props)?;
        }
        parser.finish()
    }

    /// The cluster ID from the file: KubernetesClusterID, else the legacy KubernetesClusterTag.
    pub(crate) fn cluster_id(&self) -> Option<&str> {
        self.kubernetes_cluster_id
            .as_deref()
            .or(self.kubernetes_cluster_tag.as_deref())
    }

    /// Whether the cluster ID is the legacy `KubernetesClusterTag` (no
    /// `KubernetesClusterID`): the cluster's instances carry the legacy
    /// `KubernetesCluster` tag.
    pub(crate) fn cluster_id_is_legacy(&self) -> bool {
        self.kubernetes_cluster_id.is_none() && self.kubernetes_cluster_tag.is_some()
    }

    /// Upstream's meaning of `KubernetesClusterTag`: the cluster uses the
    /// legacy tag, so what this CCM creates carries `KubernetesCluster=<id>`
    /// next to `kubernetes.io/cluster/<id>` (with or without
    /// `KubernetesClusterID`, which must then name the same cluster).
    pub(crate) fn uses_legacy_tag(&self) -> bool {
        self.kubernetes_cluster_tag.is_some()
    }

    /// The region from the file, as upstream's `getRegionFromMetadata`:
    /// `Zone` decides when set (`us-east-1a`, local zone `us-west-2-lax-1a`
    /// and Wavelength `us-east-1-wl1-bos-wlz-1` all give their region), even
    /// over `Region`; else `Region`.
    pub(crate) fn region(&self) -> Option<String> {
        self.zone
            .as_deref()
            .and_then(region_of_zone)
            .map(str::to_string)
            .or_else(|| self.region.clone())
    }

    /// The `[ServiceOverride]` for `service` in `region` (any region for
    /// instance metadata), matched as upstream: Service equal to the Go
    /// SDK's service ID (`EC2`, `Elastic Load Balancing`, `Elastic Load
    /// Balancing v2`, `ec2imds`) and Region equal to the client's region.
    /// This CCM also accepts those names in any case, `STS` (upstream does
    /// not override STS), and the legacy `elasticloadbalancing` for both ELB
    /// APIs; an exact upstream name wins over the others.
    pub(crate) fn endpoint_override(
        &self,
        service: OverrideService,
        region: &str,
    ) -> Option<&ServiceOverride> {
        let candidates: Vec<&ServiceOverride> = self
            .service_overrides
            .iter()
            .filter(|o| service == OverrideService::Imds || o.region == region)
            .collect();
        let (name, legacy) = service.names();
        let exact = candidates.iter().find(|o| o.service == name);
        let folded = || {
            candidates
                .iter()
                .find(|o| o.service.eq_ignore_ascii_case(name))
        };
        let aliased = || {
            candidates
                .iter()
                .find(|o| legacy.iter().any(|l| o.service.eq_ignore_ascii_case(l)))
        };
        exact.or_else(folded).or_else(aliased).copied()
    }

    /// The instance metadata endpoint from a `[ServiceOverride]` for `ec2imds`.
    pub(crate) fn imds_endpoint(&self) -> Option<&str> {
        self.endpoint_override(OverrideService::Imds, "")
            .map(|o| o.url.as_str())
    }

    /// What start-up should say about `[ServiceOverride]` sections that
    /// this CCM accepts but does not act on, as upstream also does not:
    /// unknown service names, KMS (this CCM makes no KMS calls) and a
    /// SigningMethod other than SigV4 (upstream never reads it).
    pub(crate) fn override_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for o in &self.service_overrides {
            let known = OverrideService::ALL.iter().any(|s| {
                let (name, legacy) = s.names();
                o.service.eq_ignore_ascii_case(name)
                    || legacy.iter().any(|l| o.service.eq_ignore_ascii_case(l))
            });
            if o.service.eq_ignore_ascii_case("KMS") {
                notes.push(format!(
                    "[ServiceOverride \"{}\"] Service = {}: accepted and unused; this CCM makes no KMS calls",
                    o.key, o.service
                ));
            } else if !known {
                notes.push(format!(
                    "[ServiceOverride \"{}\"] Service = {:?} is not a service this CCM calls and is ignored, as the Go CCM ignores it; known: EC2, Elastic Load Balancing, Elastic Load Balancing v2, STS, ec2imds",
                    o.key, o.service
                ));
            }
            let method = o.signing_method.to_ascii_lowercase();
            if !matches!(method.as_str(), "" | "v4" | "sigv4") {
                notes.push(format!(
                    "[ServiceOverride \"{}\"] SigningMethod = {:?} is ignored, as the Go CCM ignores it; requests are signed with SigV4",
                    o.key, o.signing_method
                ));
            }
        }
        notes
    }
}

#[cfg(test)]
#[path = "cloud_config_tests.rs"]
mod tests;
