//! Command-line flags. Names, spellings and defaults follow the upstream
//! cloud-controller-manager so existing manifests run unchanged.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

use crate::duration;
use crate::server::{AllowPaths, AuthSettings, TlsPolicy};

pub mod cidrs;
pub(crate) mod controller_names;
mod ignored;
use cidrs::{ClusterCidrs, MaskFlags, NodeCidrAllocation};
use controller_names::ControllerName;
use ignored::strip_ignored;

fn go_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s).map_err(|e| e.to_string())
}

/// A path that may be empty (`--flag=` means unset, as upstream).
fn any_path(s: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(s))
}

/// Parses Go-style booleans (`--flag`, `--flag=true`, `--flag=false`, `=1`, `=0`).
fn go_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "t" | "1" => Ok(true),
        "false" | "f" | "0" => Ok(false),
        other => Err(format!("invalid boolean {other:?}: use true or false")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "aws-cloud-controller-manager",
    version,
    about = "Kubernetes cloud-controller-manager for AWS (drop-in for the Go aws-cloud-controller-manager)",
    // Upstream uses Go's pflag: `--flag=value`, and booleans must use `=`.
    // pflag also takes a flag given twice (a manifest's flag and an
    // operator's override): a scalar's last value wins, a list's values
    // add up. Clap's `Append` lists add up; the rest override themselves.
    disable_help_subcommand = true,
    args_override_self = true
)]
pub struct Options {
    /// The provider for cloud services. Must be "aws".
    #[arg(long, default_value = "")]
    pub cloud_provider: String,

    /// The path to the cloud provider configuration file (cloud.conf). Empty string for no configuration file.
    #[arg(long)]
    pub(crate) cloud_config: Option<PathBuf>,

    /// Path to kubeconfig file with authorization and master location information.
    #[arg(long)]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long)]
    pub(crate) master: Option<String>,

    /// A list of controllers to enable. '*' enables all on-by-default controllers, 'foo' enables the controller named 'foo', '-foo' disables the controller named 'foo'. Off by default: tagging, and nodeipam (node CIDR allocation, which the Go CCM does not have; name it to run it).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    controllers: Vec<String>,

    /// Start a leader election client and gain leadership before executing the main loop.
    #[arg(long, default_value = "true", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub(crate) leader_elect: bool,

    /// The duration that non-leader candidates will wait after observing a leadership renewal until attempting to acquire leadership.
    #[arg(long, default_value = "15s", value_parser = go_duration)]
    pub(crate) leader_elect_lease_duration: Duration,

    /// The interval between attempts by the acting master to renew a leadership slot before it stops leading.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub(crate) leader_elect_renew_deadline: Duration,

    /// The duration the clients should wait between attempting acquisition and renewal of a leadership.
    #[arg(long, default_value = "2s", value_parser = go_duration)]
    pub(crate) leader_elect_retry_period: Duration,

    /// The name of resource object that is used for locking during leader election.
    #[arg(long, default_value = "cloud-controller-manager")]
    pub(crate) leader_elect_resource_name: String,

    /// The namespace of resource object that is used for locking during leader election.
    #[arg(long, default_value = "kube-system")]
    pub(crate) leader_elect_resource_namespace: String,

    /// The type of resource object that is used for locking. Only "leases" is supported (as in current upstream).
    #[arg(long, default_value = "leases")]
    leader_elect_resource_lock: String,

    /// Should CIDRs for Pods be allocated and set on the cloud provider.
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub(crate) allocate_node_cidrs: bool,

    /// CIDR Range for Pods in cluster (one, or two comma-separated for dual-stack).
    #[arg(long, default_value = "")]
    cluster_cidr: String,

    /// Mask size for node CIDRs in the cluster (single-stack IPv4 and IPv6). Default 24 for IPv4, 64 for IPv6.
    #[arg(long)]
    node_cidr_mask_size: Option<u8>,

    /// Mask size for IPv4 node CIDRs in a dual-stack cluster.
    #[arg(long)]
    node_cidr_mask_size_ipv4: Option<u8>,

    /// Mask size for IPv6 node CIDRs in a dual-stack cluster.
    #[arg(long)]
    node_cidr_mask_size_ipv6: Option<u8>,

    /// Should CIDRs allocated by allocate-node-cidrs be configured on the cloud provider.
    #[arg(long, default_value = "true", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub(crate) configure_cloud_routes: bool,

    /// The instance prefix for the cluster.
    #[arg(long, default_value = "kubernetes")]
    pub(crate) cluster_name: String,

    /// Allow the cluster to run without the cluster-id on cloud instances.
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub(crate) allow_untagged_cloud: bool,

    /// The number of services that are allowed to sync concurrently.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) concurrent_service_syncs: u32,

    /// Number of workers concurrently synchronizing nodes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) concurrent_node_syncs: u32,

    /// Specifies how often the controller updates nodes' status (addresses).
    #[arg(long, default_value = "5m0s", value_parser = go_duration)]
    pub(crate) node_status_update_frequency: Duration,

    /// The period for syncing NodeStatus in the cloud-node-lifecycle controller.
    #[arg(long, default_value = "5s", value_parser = go_duration)]
    pub(crate) node_monitor_period: Duration,

    /// The period for reconciling routes created for Nodes by cloud provider.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    pub(crate) route_reconciliation_period: Duration,

    /// The resync period in reflectors will be random between MinResyncPeriod and 2*MinResyncPeriod.
    #[arg(long, default_value = "12h0m0s", value_parser = go_duration)]
    min_resync_period: Duration,

    /// The port on which to serve HTTPS with authentication and authorization (/healthz, /readyz, /metrics). 0 disables it.
    #[arg(long, default_value_t = 10258)]
    pub(crate) secure_port: u16,

    /// The IP address on which to listen for the --secure-port port.
    #[arg(long, default_value = "0.0.0.0")]
    pub(crate) bind_address: IpAddr,

    /// File containing the default x509 certificate for HTTPS. Without it a self-signed certificate is generated.
    #[arg(long)]
    pub(crate) tls_cert_file: Option<PathBuf>,

    /// File containing the default x509 private key matching --tls-cert-file.
    #[arg(long)]
    pub(crate) tls_private_key_file: Option<PathBuf>,

    /// Minimum TLS version of the HTTPS endpoint: VersionTLS12 or VersionTLS13 (rustls has no TLS 1.0/1.1). Empty means TLS 1.2.
    #[arg(long, default_value = "")]
    tls_min_version: String,

    /// If true, HTTP/2 is not served on the HTTPS endpoint (upstream's --disable-http2-serving).
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    disable_http2_serving: bool,

    /// Comma-separated TLS 1.2 cipher suites of the HTTPS endpoint, IANA names as upstream (e.g. TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256). TLS 1.3 suites are always on. Empty means rustls's defaults.
    #[arg(long, value_delimiter = ',')]
    tls_cipher_suites: Vec<String>,

    /// kubeconfig pointing at the 'core' kubernetes server with enough rights to create tokenreviews.authentication.k8s.io. Optional: without it the client of --kubeconfig (or in-cluster) is used.
    #[arg(long, value_parser = any_path)]
    authentication_kubeconfig: Option<PathBuf>,

    /// The duration to cache responses from the webhook token authenticator.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    authentication_token_webhook_cache_ttl: Duration,

    /// Accepted for compatibility: client-certificate and front-proxy authentication are not implemented, so the extension-apiserver-authentication ConfigMap is never looked up.
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    authentication_skip_lookup: bool,

    /// Accepted for compatibility: no authentication configuration is looked up in the cluster (see --authentication-skip-lookup).
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    authentication_tolerate_lookup_failure: bool,

    /// kubeconfig pointing at the 'core' kubernetes server with enough rights to create subjectaccessreviews.authorization.k8s.io. Optional: without it the client of --kubeconfig (or in-cluster) is used.
    #[arg(long, value_parser = any_path)]
    authorization_kubeconfig: Option<PathBuf>,

    /// The duration to cache 'authorized' responses from the webhook authorizer.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    authorization_webhook_cache_authorized_ttl: Duration,

    /// The duration to cache 'unauthorized' responses from the webhook authorizer.
    #[arg(long, default_value = "10s", value_parser = go_duration)]
    authorization_webhook_cache_unauthorized_ttl: Duration,

    /// A list of HTTP paths to skip during authorization, i.e. these are authorized without contacting the 'core' kubernetes server. A trailing '*' matches a prefix.
    #[arg(long, value_delimiter = ',', default_value = "/healthz,/readyz,/livez")]
    authorization_always_allow_paths: Vec<String>,

    /// QPS to use while talking with the Kubernetes apiserver.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) kube_api_qps: f32,

    /// Burst to use while talking with the Kubernetes apiserver.
    #[arg(long, default_value_t = 30)]
    pub(crate) kube_api_burst: u32,

    /// Content type of requests sent to apiserver. Accepted for compatibility; JSON is always used.
    #[arg(long, default_value = "application/vnd.kubernetes.protobuf")]
    kube_api_content_type: String,

    /// Tags to apply to instances by the tagging controller: k1=v1,k2=v2.
    #[arg(long, default_value = "")]
    tags: String,

    /// Resource types the tagging controller tags. Only "instance" is supported.
    #[arg(
        long,
        alias = "resources",
        value_delimiter = ',',
        default_value = "instance"
    )]
    tag_resources: Vec<String>,

    /// If true, the HTTPS endpoint also serves the service admission check at /admission/v1/services: a validating webhook that answers a Service's create or update with a Warning for each value its load balancer sync refuses, holds or ignores (never a refusal). Off by default; the chart's admissionWebhook.enabled installs its ValidatingWebhookConfiguration. Not in the Go CCM.
    #[arg(long, default_value = "false", value_parser = go_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true", action = ArgAction::Set)]
    pub(crate) service_admission_webhook: bool,

    /// Routes per VPC route table before a warning is raised at 80 % (AWS default quota is 50).
    #[arg(long, default_value_t = 50)]
    pub(crate) route_table_limit: u32,

    /// How often an unchanged LoadBalancer Service is re-ensured anyway, to repair drift made outside Kubernetes (each costs about 8 ELB/EC2 describe calls). 0 turns it off.
    #[arg(long, default_value = "1h0m0s", value_parser = go_duration)]
    pub(crate) service_resync_period: Duration,

    /// Share of AWS's documented API rate limits this process may use; the rest is left to other clients in the account. Above 1 only where AWS raised the account's limits.
    #[arg(long, default_value_t = 0.5)]
    aws_api_budget_fraction: f64,

    /// How long one read of the cluster's instances (the sweep every node controller shares) is reused. Shorter sees instance changes sooner at one sweep per period (one DescribeInstances per 1,000 instances).
    #[arg(long, default_value = "30s", value_parser = go_duration)]
    pub(crate) aws_instance_sweep_ttl: Duration,

    /// How long AWS may take to show a change (it is eventually consistent): an object created moments ago and not yet visible is waited for this long, and this process's own security-group writes answer over listings that started sooner after them. Lower it only against an endpoint that shows changes at once (tests, emulators).
    #[arg(long, default_value = "30s", value_parser = go_duration)]
    aws_consistency_window: Duration,

    /// Number for the log level verbosity (0-10, as klog): 0-1 info, 2-3 our debug, 4-5 debug, 6+ trace. RUST_LOG, when set, replaces it. AWS SDK and HTTP internals stay capped at debug/info so no credentials reach the log.
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    pub verbosity: u8,

    /// Log format: text or json. `--logging-format` (upstream's name, from component-base) is the same flag.
    #[arg(long, visible_alias = "logging-format", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, thiserror::Error)]
pub enum OptionsError {
    #[error(
        "--cloud-provider={0:?} is not supported: this binary only implements --cloud-provider=aws"
    )]
    WrongProvider(String),
    #[error("--cloud-provider is required: set --cloud-provider=aws")]
    MissingProvider,
    #[error(transparent)]
    Controllers(#[from] controller_names::UnknownController),
    #[error(
        "--leader-elect-resource-lock={0:?} is not supported: only \"leases\" is (configmaps and endpoints locks were removed upstream)"
    )]
    ResourceLock(String),
    #[error(
        "leader election timings are inconsistent: need --leader-elect-lease-duration ({lease:?}) > --leader-elect-renew-deadline ({renew:?}) > --leader-elect-retry-period ({retry:?}) > 0"
    )]
    LeaderTimings {
        lease: Duration,
        renew: Duration,
        retry: Duration,
    },
    #[error("--kube-api-qps={0} must be greater than 0")]
    Qps(f32),
    #[error("--kube-api-burst must be at least 1")]
    Burst,
    #[error(transparent)]
    AwsClient(#[from] crate::aws::OptionsError),
    #[error("--tls-cert-file and --tls-private-key-file must be given together")]
    TlsPair,
    #[error(transparent)]
    Tls(#[from] crate::server::tls::TlsFlagError),
    #[error("{0}")]
    AllowPaths(String),
    #[error("--tags={value:?} is invalid: {reason}; expected k1=v1,k2=v2")]
    Tags { value: String, reason: String },
    #[error(transparent)]
    Cidr(#[from] cidrs::CidrError),
    #[error(
        "the tagging controller is enabled (--controllers) but --tags is empty: give the tags to put on \
         instances as --tags=k1=v1,k2=v2, or disable it with --controllers=*,-tagging"
    )]
    TaggingWithoutTags,
    #[error("--resources={0:?} is not supported: the tagging controller only tags \"instance\"")]
    TagResource(String),
}

/// Flags after validation, plus what was ignored (logged once at start-up).
#[derive(Debug, Clone)]
pub struct Validated {
    pub options: Options,
    pub(crate) controllers: BTreeSet<ControllerName>,
    pub(crate) tags: Vec<(String, String)>,
    pub(crate) ignored_flags: Vec<String>,
    /// `--cluster-cidr`, parsed when a selected controller uses it (node
    /// IPAM with `--allocate-node-cidrs`, the route controller with
    /// `--configure-cloud-routes`); `None` otherwise or when left empty for
    /// the route controller alone (it then logs why it does nothing).
    pub(crate) cluster_cidrs: Option<ClusterCidrs>,
    /// What node IPAM allocates from; `Some` exactly when it will run.
    pub(crate) node_cidr_allocation: Option<NodeCidrAllocation>,
    /// `--tls-min-version` and `--tls-cipher-suites`.
    pub(crate) tls: TlsPolicy,
    /// The `--authentication-*` and `--authorization-*` flags.
    pub(crate) auth: AuthSettings,
}

impl Options {
    /// Parses argv, removing the upstream flags we ignore before clap sees them.
    pub fn parse_args<I, T>(args: I) -> Result<(Options, Vec<String>), clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        let (kept, ignored) = strip_ignored(args.into_iter().map(Into::into).collect());
        Ok((Options::try_parse_from(kept)?, ignored))
    }

    /// Tuning of the AWS client layer that flags control.
    pub(crate) fn aws_client_options(&self) -> crate::aws::ClientOptions {
        crate::aws::ClientOptions {
            budget_fraction: self.aws_api_budget_fraction,
            consistency_patience: self.aws_consistency_window,
            ..Default::default()
        }
    }

    /// What the AWS domain modules keep that flags control; the manager
    /// adds what cloud.conf and the cluster's identity decide.
    pub(crate) fn aws_settings(&self) -> crate::aws::AwsSettings {
        crate::aws::AwsSettings {
            instances: crate::aws::InstanceSettings {
                sweep_ttl: self.aws_instance_sweep_ttl,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    pub fn validate(self, ignored_flags: Vec<String>) -> Result<Validated, OptionsError> {
        match self.cloud_provider.as_str() {
            "aws" => {}
            "" => return Err(OptionsError::MissingProvider),
            other => return Err(OptionsError::WrongProvider(other.to_string())),
        }
        if self.leader_elect_resource_lock != "leases" {
            return Err(OptionsError::ResourceLock(
                self.leader_elect_resource_lock.clone(),
            ));
        }
        let (lease, renew, retry) = (
            self.leader_elect_lease_duration,
            self.leader_elect_renew_deadline,
            self.leader_elect_retry_period,
        );
        if self.leader_elect && !(lease > renew && renew > retry && !retry.is_zero()) {
            return Err(OptionsError::LeaderTimings {
                lease,
                renew,
                retry,
            });
        }
        if self.kube_api_qps.is_nan() || self.kube_api_qps <= 0.0 {
            return Err(OptionsError::Qps(self.kube_api_qps));
        }
        if self.kube_api_burst == 0 {
            return Err(OptionsError::Burst);
        }
        self.aws_client_options().validate()?;
        if self.tls_cert_file.is_some() != self.tls_private_key_file.is_some() {
            return Err(OptionsError::TlsPair);
        }
        let tls = TlsPolicy {
            http1_only: self.disable_http2_serving,
            ..TlsPolicy::parse(&self.tls_min_version, &self.tls_cipher_suites)?
        };
        let auth = AuthSettings {
            always_allow_paths: AllowPaths::parse(&self.authorization_always_allow_paths)
                .map_err(OptionsError::AllowPaths)?,
            token_ttl: self.authentication_token_webhook_cache_ttl,
            allow_ttl: self.authorization_webhook_cache_authorized_ttl,
            deny_ttl: self.authorization_webhook_cache_unauthorized_ttl,
            authentication_kubeconfig: non_empty_path(&self.authentication_kubeconfig),
            authorization_kubeconfig: non_empty_path(&self.authorization_kubeconfig),
        };
        let controllers = controller_names::select(&self.controllers)?;
        let tags = parse_tags(&self.tags)?;
        let (cluster_cidrs, node_cidr_allocation) = self.cidr_config(&controllers)?;
        if controllers.contains(&ControllerName::Tagging) {
            if tags.is_empty() {
                return Err(OptionsError::TaggingWithoutTags);
            }
            if let Some(other) = self.tag_resources.iter().find(|r| r.as_str() != "instance") {
                return Err(OptionsError::TagResource(other.clone()));
            }
        }
        Ok(Validated {
            options: self,
            controllers,
            tags,
            ignored_flags,
            cluster_cidrs,
            node_cidr_allocation,
            tls,
            auth,
        })
    }

    /// Parses `--cluster-cidr` and the node masks only when a selected
    /// controller will use them, as upstream checks them when starting those
    /// controllers: a stale value on a cluster that uses neither must not
    /// stop the swap to this binary.
    fn cidr_config(
        &self,
        controllers: &BTreeSet<ControllerName>,
    ) -> Result<(Option<ClusterCidrs>, Option<NodeCidrAllocation>), OptionsError> {
        let ipam = self.allocate_node_cidrs && controllers.contains(&ControllerName::NodeIpam);
        let routes = self.configure_cloud_routes && controllers.contains(&ControllerName::Route);
        if !ipam && (!routes || self.cluster_cidr.trim().is_empty()) {
            return Ok((None, None));
        }
        let needed_by = if ipam {
            "--allocate-node-cidrs=true"
        } else {
            "--configure-cloud-routes=true"
        };
        let cluster = ClusterCidrs::parse(&self.cluster_cidr, needed_by)?;
        let masks = MaskFlags {
            node_cidr_mask_size: self.node_cidr_mask_size,
            ipv4: self.node_cidr_mask_size_ipv4,
            ipv6: self.node_cidr_mask_size_ipv6,
        };
        let allocation = ipam
            .then(|| NodeCidrAllocation::new(cluster.clone(), masks))
            .transpose()?;
        Ok((Some(cluster), allocation))
    }
}

/// `--flag=` means unset, as an empty string does upstream.
fn non_empty_path(p: &Option<PathBuf>) -> Option<PathBuf> {
    p.clone().filter(|p| !p.as_os_str().is_empty())
}

fn parse_tags(value: &str) -> Result<Vec<(String, String)>, OptionsError> {
    let err = |reason: String| OptionsError::Tags {
        value: value.to_string(),
        reason,
    };
    let mut tags = Vec::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| err(format!("{pair:?} has no '='")))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(err(format!("{pair:?} has an empty key")));
        }
        if k.len() > 128 || v.len() > 256 {
            return Err(err(format!(
                "{pair:?} exceeds AWS tag limits (key 128, value 256 characters)"
            )));
        }
        if k.starts_with("aws:") {
            return Err(err(format!("{k:?} uses the reserved aws: prefix")));
        }
        if tags.iter().any(|(existing, _)| existing == k) {
            return Err(err(format!("key {k:?} appears twice")));
        }
        tags.push((k.to_string(), v.trim().to_string()));
    }
    Ok(tags)
}

#[cfg(test)]
#[path = "options_server_tests.rs"]
mod server_flag_tests;

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn parse(args: &[&str]) -> Result<Validated, String> {
        let mut argv = vec!["aws-cloud-controller-manager"];
        argv.extend_from_slice(args);
        let (opts, ignored) = Options::parse_args(argv).map_err(|e| e.to_string())?;
        opts.validate(ignored).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_match_upstream() {
        let v = parse(&["--cloud-provider=aws"]).unwrap();
        let o = &v.options;
        assert!(o.leader_elect);
        assert_eq!(o.leader_elect_lease_duration, Duration::from_secs(15));
        assert_eq!(o.leader_elect_renew_deadline, Duration::from_secs(10));
        assert_eq!(o.leader_elect_retry_period, Duration::from_secs(2));
        assert_eq!(o.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(o.leader_elect_resource_namespace, "kube-system");
        assert!(!o.allocate_node_cidrs);
        assert!(o.configure_cloud_routes);
        assert_eq!(o.cluster_name, "kubernetes");
        assert_eq!(o.concurrent_service_syncs, 1);
        assert_eq!(o.concurrent_node_syncs, 1);
        assert_eq!(o.node_status_update_frequency, Duration::from_secs(300));
        assert_eq!(o.node_monitor_period, Duration::from_secs(5));
        assert_eq!(o.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(o.secure_port, 10258);
        assert_eq!(o.bind_address.to_string(), "0.0.0.0");
        assert_eq!(o.kube_api_qps, 20.0);
        assert_eq!(o.kube_api_burst, 30);
        assert_eq!(o.aws_api_budget_fraction, 0.5);
        assert!(v.controllers.contains(&ControllerName::CloudNode));
        assert!(!v.controllers.contains(&ControllerName::Tagging));
    }

    #[test]
    fn go_style_booleans_and_durations() {
        let v = parse(&[
            "--cloud-provider=aws",
            "--leader-elect=false",
            "--allocate-node-cidrs",
            "--cluster-cidr=10.244.0.0/16",
            "--configure-cloud-routes=0",
            "--node-status-update-frequency=1m30s",
            "--v=4",
        ])
        .unwrap();
        assert!(!v.options.leader_elect);
        assert!(v.options.allocate_node_cidrs);
        assert!(!v.options.configure_cloud_routes);
        assert_eq!(
            v.options.node_status_update_frequency,
            Duration::from_secs(90)
        );
        assert_eq!(v.options.verbosity, 4);
    }

    /// As pflag: a flag given twice is no error; a scalar's last value
    /// wins and a list's values add up (`StringSlice`).
    #[test]
    fn a_flag_given_twice_takes_the_last_value_and_lists_add_up() {
        let v = parse(&[
            "--cloud-provider=aws",
            "--kube-api-qps=10",
            "--service-resync-period=1h",
            "--leader-elect=false",
            "--controllers=cloud-node",
            "--authorization-always-allow-paths=/healthz",
            "--kube-api-qps=30",
            "--service-resync-period=2h",
            "--leader-elect=true",
            "--controllers=service,route",
            "--authorization-always-allow-paths=/metrics",
        ])
        .unwrap();
        assert_eq!(v.options.kube_api_qps, 30.0);
        assert_eq!(v.options.service_resync_period, Duration::from_secs(7200));
        assert!(v.options.leader_elect);
        assert_eq!(v.options.controllers, ["cloud-node", "service", "route"]);
        assert_eq!(
            v.options.authorization_always_allow_paths,
            ["/healthz", "/metrics"]
        );
    }

    #[test]
    fn cloud_provider_must_be_aws_and_the_error_names_the_flag() {
        let err = parse(&["--cloud-provider=gce"]).unwrap_err();
        assert!(
            err.contains("--cloud-provider") && err.contains("gce"),
            "{err}"
        );
        let err = parse(&[]).unwrap_err();
        assert!(err.contains("--cloud-provider"), "{err}");
    }

    #[test]
    fn ignored_upstream_flags_are_accepted_and_reported() {
        let v = parse(&[
            "--cloud-provider=aws",
            "--use-service-account-credentials",
            "--feature-gates",
            "Foo=true",
            "--profiling=false",
            "--client-ca-file",
            "/etc/ca.pem",
            "--authorization-always-allow-paths=/healthz",
        ])
        .unwrap();
        assert_eq!(
            v.ignored_flags,
            [
                "use-service-account-credentials",
                "feature-gates",
                "profiling",
                "client-ca-file"
            ]
        );
    }

    #[test]
    fn unknown_flags_and_bad_values_are_errors() {
        assert!(parse(&["--cloud-provider=aws", "--no-such-flag"]).is_err());
        let err = parse(&["--cloud-provider=aws", "--node-monitor-period=5 seconds"]).unwrap_err();
        assert!(err.contains("node-monitor-period"), "{err}");
        let err =
            parse(&["--cloud-provider=aws", "--leader-elect-renew-deadline=20s"]).unwrap_err();
        assert!(err.contains("renew-deadline"), "{err}");
        let err = parse(&["--cloud-provider=aws", "--controllers=*,-bogus"]).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }

    #[test]
    fn cluster_cidr_is_checked_only_when_a_controller_uses_it() {
        // Unused: a stale value does not stop start-up.
        let v = parse(&[
            "--cloud-provider=aws",
            "--configure-cloud-routes=false",
            "--cluster-cidr=garbage",
        ])
        .unwrap();
        assert!(v.cluster_cidrs.is_none() && v.node_cidr_allocation.is_none());
        // Route controller alone with no --cluster-cidr: it starts idle.
        let v = parse(&["--cloud-provider=aws"]).unwrap();
        assert!(v.cluster_cidrs.is_none());
        // Route controller with a bad value: refused, naming the value.
        let err = parse(&["--cloud-provider=aws", "--cluster-cidr=10.0.0.0/33"]).unwrap_err();
        assert!(
            err.contains("--cluster-cidr") && err.contains("10.0.0.0/33"),
            "{err}"
        );
        // Node IPAM is off by default: the flag alone (kOps passes it to
        // the Go CCM too) asks for nothing, so nothing needs --cluster-cidr.
        let v = parse(&["--cloud-provider=aws", "--allocate-node-cidrs=true"]).unwrap();
        assert!(v.node_cidr_allocation.is_none());
        // IPAM, when named, needs it.
        let err = parse(&[
            "--cloud-provider=aws",
            "--allocate-node-cidrs=true",
            "--controllers=*,nodeipam",
        ])
        .unwrap_err();
        assert!(
            err.contains("--cluster-cidr") && err.contains("--allocate-node-cidrs"),
            "{err}"
        );
        // ...unless node IPAM is not selected.
        assert!(
            parse(&[
                "--cloud-provider=aws",
                "--allocate-node-cidrs=true",
                "--controllers=*,-nodeipam,-route"
            ])
            .is_ok()
        );
    }

    #[test]
    fn node_ipam_masks_are_validated_with_the_cluster_cidr() {
        let v = parse(&[
            "--cloud-provider=aws",
            "--allocate-node-cidrs=true",
            "--controllers=*,nodeipam",
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--node-cidr-mask-size-ipv6=60",
        ])
        .unwrap();
        let alloc = v.node_cidr_allocation.expect("IPAM runs");
        assert_eq!(
            alloc.ranges.iter().map(|r| r.node_mask).collect::<Vec<_>>(),
            [24, 60]
        );
        assert!(v.cluster_cidrs.expect("parsed").is_dual_stack());
        let err = parse(&[
            "--cloud-provider=aws",
            "--allocate-node-cidrs=true",
            "--controllers=*,nodeipam",
            "--cluster-cidr=10.244.0.0/16",
            "--node-cidr-mask-size=8",
        ])
        .unwrap_err();
        assert!(err.contains("10.244.0.0/16") && err.contains("/8"), "{err}");
        let err = parse(&[
            "--cloud-provider=aws",
            "--allocate-node-cidrs=true",
            "--controllers=*,nodeipam",
            "--cluster-cidr=10.0.0.0/16,10.1.0.0/16",
        ])
        .unwrap_err();
        assert!(err.contains("two IPv4"), "{err}");
    }

    #[test]
    fn the_tagging_controller_needs_tags_and_accepts_upstream_flags() {
        let err = parse(&["--cloud-provider=aws", "--controllers=*,tagging"]).unwrap_err();
        assert!(err.contains("--tags"), "{err}");
        let v = parse(&[
            "--cloud-provider=aws",
            "--controllers=*,tagging",
            "--tags=team=infra",
            "--resources=instance",
            "--tagging-controller-enable-batching",
            "--tagging-controller-concurrent-node-syncs=4",
        ])
        .unwrap();
        assert!(v.controllers.contains(&ControllerName::Tagging));
        let err = parse(&[
            "--cloud-provider=aws",
            "--controllers=*,tagging",
            "--tags=team=infra",
            "--resources=volume",
        ])
        .unwrap_err();
        assert!(err.contains("volume"), "{err}");
        // Off by default: no --tags needed.
        assert!(parse(&["--cloud-provider=aws"]).is_ok());
    }

    #[test]
    fn tags_parse_and_reject_bad_pairs() {
        let v = parse(&["--cloud-provider=aws", "--tags=team=infra, env=prod"]).unwrap();
        assert_eq!(
            v.tags,
            [
                ("team".into(), "infra".into()),
                ("env".into(), "prod".into())
            ]
        );
        assert!(
            parse(&["--cloud-provider=aws", "--tags=novalue"])
                .unwrap_err()
                .contains("novalue")
        );
        assert!(
            parse(&["--cloud-provider=aws", "--tags=aws:x=1"])
                .unwrap_err()
                .contains("reserved")
        );
    }
}
