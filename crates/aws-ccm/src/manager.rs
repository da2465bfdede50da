//! Start-up and lifetime of the process: configuration, clients, the health
//! server, leader election, the controllers, and an orderly shutdown.
//!
//! Shutdown order matters: on SIGTERM the controllers stop first, then every
//! change to AWS is refused at the door, *then* the Lease is released, so a
//! successor never acts while we still do. If the Lease is lost (not renewed
//! before the renew deadline) the door refuses every change at once, the
//! calls already sent are given until a successor could take the Lease to
//! be answered, and the process exits non-zero without waiting for the
//! controllers. The Lease is renewed through an API client of its own.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::aws::AwsClient;
use crate::aws::client::clients::{self, SdkClients};
use crate::aws::client::door::Door;
use crate::aws::load_balancers::AwsLoadBalancers;
use crate::aws::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG};
use crate::cloud_config::{CloudConfig, region_of_zone};
use crate::controllers;
use crate::kube_client;
use crate::leader::{self, LeaderElectionConfig, LeaderElector, LeaderStatus, LeadershipEnd};
use crate::options::Validated;
use crate::server::{self, Health, ServeOptions, TlsFiles};
use crate::target_record::{self, Acquisition, TargetRecord};

/// Longest we wait for controllers to finish after being told to stop.
const CONTROLLER_STOP_GRACE: Duration = Duration::from_secs(10);

pub async fn run(validated: Validated) -> anyhow::Result<ExitCode> {
    let opts = &validated.options;
    crate::metrics::register_process_collector();
    if !validated.ignored_flags.is_empty() {
        tracing::info!(flags = ?validated.ignored_flags, "accepted upstream flags that this implementation does not act on");
    }
    let cloud = load_cloud_config(opts)?;
    let (aws, cluster_id, region) = connect_aws(&cloud, opts).await?;

    let kube_config =
        kube_client::load_config(opts.kubeconfig.as_deref(), opts.master.as_deref()).await?;
    // The Lease and the target record have clients of their own: renewals,
    // and a target change waiting for its entry's removal, never queue
    // behind controller traffic (events) in the QPS limiter.
    let client = |c| kube_client::build_client(c, opts.kube_api_qps, opts.kube_api_burst);
    let (lease_kube, record_kube) = (client(kube_config.clone())?, client(kube_config.clone())?);
    let kube = client(kube_config)?;

    let leader_status = Arc::new(LeaderStatus::default());
    let ready = Arc::new(AtomicBool::new(false));
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());

    let mut elector = opts.leader_elect.then(|| leader_elector(lease_kube, opts));
    let health = Health {
        leader: elector
            .as_ref()
            .map_or(leader_status.clone(), |e| e.status.clone()),
        ready: ready.clone(),
        lease_duration: opts.leader_elect_lease_duration,
    };
    let http = start_http(&validated, &kube, health).await?;
    let drain = drain_bound(opts);
    let cloud = Arc::new(cloud);
    let validated = Arc::new(validated);
    let record = TargetRecord::default();
    let run_controllers = |stop: CancellationToken, acquired: Option<Acquisition>| {
        let env = controllers::Environment {
            kube: kube.clone(),
            aws: aws.clone(),
            cloud: cloud.clone(),
            options: validated.clone(),
            cluster_id: cluster_id.clone(),
            region: region.clone(),
            load_balancers: load_balancers(&aws, &cloud, &cluster_id, &validated.options, &record),
        };
        let start = RecordStart::new(record_kube.clone(), &validated.options, acquired);
        spawn_controllers(env, start, ready.clone(), stop)
    };

    let exit = match elector.as_mut() {
        None => {
            let stop = shutdown.child_token();
            let task = run_controllers(stop.clone(), None);
            shutdown.cancelled().await;
            stop_controllers(task).await;
            ExitCode::SUCCESS
        }
        Some(elector) => {
            let leading = elector.status.clone();
            let stop_aws = || async {
                stop_aws_changes(&aws, drain).await;
                // Shutting down (not lost): the last entries, for the successor.
                if leading.is_leader() {
                    record.flush(Duration::from_secs(5)).await;
                }
            };
            lead(elector, &ready, &shutdown, run_controllers, stop_aws).await
        }
    };
    if let Some(http) = http {
        http.shutdown().await;
    }
    tracing::info!("shut down");
    Ok(exit)
}

/// cloud.conf from `--cloud-config`, or the defaults without it.
pub(crate) fn load_cloud_config(opts: &crate::options::Options) -> anyhow::Result<CloudConfig> {
    Ok(
        match opts
            .cloud_config
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            Some(path) => {
                let cloud = CloudConfig::load(path)?;
                for line in &cloud.tolerated {
                    tracing::warn!(path = %path.display(), "cloud config: {line}");
                }
                for r in &cloud.shared_probe_refusals {
                    tracing::warn!(path = %path.display(), key = r.key, value = %r.value, "cloud config: [Global] {} = {:?} is taken as the Go CCM takes it, which fails every health check through the shared probe: each load balancer probed that way is kept in upkeep (its backends and node rules follow the nodes, nothing else changes) until it is fixed; allowed: {}", r.key, r.value, r.allowed);
                }
                for r in &cloud.nlb_refusals {
                    tracing::warn!(path = %path.display(), key = r.key, value = %r.value, "cloud config: [Global] {} = {:?} is taken as the Go CCM takes it, which fails every NLB sync on it: each NLB is kept in upkeep (its targets and node rules follow the nodes, nothing else changes) until it is fixed; allowed: {}", r.key, r.value, r.allowed);
                }
                cloud
            }
            None => {
                tracing::info!("no --cloud-config given; using defaults and instance metadata");
                CloudConfig::default()
            }
        },
    )
}

/// The one door to AWS, with the region and the cluster ID resolved.
pub(crate) async fn connect_aws(
    cloud: &CloudConfig,
    opts: &crate::options::Options,
) -> anyhow::Result<(AwsClient, String, String)> {
    let c = connect_aws_described(cloud, opts).await?;
    Ok((c.aws, c.cluster_id, c.region))
}

/// [`connect_aws`]'s result, with where the region and the cluster ID came
/// from (for `aws-ccm doctor`).
pub(crate) struct Connected {
    pub aws: AwsClient,
    pub cluster_id: String,
    pub region: String,
    /// How the region was found (cloud.conf, or instance metadata).
    pub region_from: String,
    /// How the cluster ID was found (cloud.conf, or a tag of this instance).
    pub cluster_id_from: String,
}

/// [`connect_aws`], saying where the region and the cluster ID came from.
pub(crate) async fn connect_aws_described(
    cloud: &CloudConfig,
    opts: &crate::options::Options,
) -> anyhow::Result<Connected> {
    let (region, region_from) = match cloud.region() {
        Some(r) => (r, region_source(cloud)),
        None => (
            clients::imds::region(cloud.imds_endpoint()).await.map_err(|e| {
                anyhow::anyhow!("cannot determine the AWS region: set Region in the [Global] section of cloud.conf, or run on EC2 with the instance metadata service reachable ({e})")
            })?,
            "the instance metadata service (no Region or Zone in cloud.conf)".to_string(),
        ),
    };
    let base = clients::base_config(&region).await;
    // One door for the whole process: the RoleARN credentials provider
    // inside the SDK clients sends STS AssumeRole through it too.
    let door = Door::new(&opts.aws_client_options());
    let sdk = clients::build(&base, cloud, &region, &door);
    let (identity, cluster_id_from) =
        resolve_cluster_id(cloud, &sdk, &door, opts, opts.allow_untagged_cloud).await?;
    let cluster_id = identity.id.clone();
    let mut client_options = opts.aws_client_options();
    // The sweep queries the legacy `KubernetesCluster` tag only for a
    // cluster identified by it alone. kOps puts both tags on every
    // instance, so querying both would read each instance twice.
    client_options.legacy_cluster_tag = identity.legacy_only;
    client_options.write_legacy_cluster_tag = identity.writes_legacy_tag;
    client_options.topology_pattern = cloud.supported_topology_instance_type_pattern.clone();
    if identity.writes_legacy_tag {
        tracing::info!(cluster_id = %cluster_id, "the cluster is identified by the legacy KubernetesCluster tag (cloud.conf KubernetesClusterTag, or on this instance, as kOps tags it): what this CCM creates carries KubernetesCluster={cluster_id} too, as the Go CCM writes it");
    }
    let aws = AwsClient::with_door(sdk, cluster_id.clone(), client_options, door);
    tracing::info!(region = %region, cluster_id = %cluster_id, "AWS cloud provider configured");
    Ok(Connected {
        aws,
        cluster_id,
        region,
        region_from,
        cluster_id_from,
    })
}

/// Which cloud.conf key gave the region (`Zone` wins over `Region`).
fn region_source(cloud: &CloudConfig) -> String {
    match cloud
        .zone
        .as_deref()
        .filter(|z| region_of_zone(z).is_some())
    {
        Some(zone) => format!("cloud.conf Zone = {zone}"),
        None => "cloud.conf Region".to_string(),
    }
}

/// The HTTPS health and metrics server, unless `--secure-port=0`.
async fn start_http(
    validated: &Validated,
    kube: &kube::Client,
    health: Health,
) -> anyhow::Result<Option<server::RunningServer>> {
    let opts = &validated.options;
    if opts.secure_port == 0 {
        return Ok(None);
    }
    let tls_files = opts
        .tls_cert_file
        .clone()
        .zip(opts.tls_private_key_file.clone())
        .map(|(cert, key)| TlsFiles { cert, key });
    let auth = server::delegate::build(validated.auth.clone(), kube).await?;
    let serve = ServeOptions {
        tls_files,
        tls: validated.tls.clone(),
        auth: Some(auth),
        reload_interval: server::tls::RELOAD_INTERVAL,
    };
    Ok(Some(
        server::start(
            SocketAddr::new(opts.bind_address, opts.secure_port),
            serve,
            health,
        )
        .await?,
    ))
}

/// The Lease elector for `--leader-elect`.
fn leader_elector(kube: kube::Client, opts: &crate::options::Options) -> LeaderElector {
    LeaderElector::new(
        kube,
        LeaderElectionConfig {
            namespace: opts.leader_elect_resource_namespace.clone(),
            name: opts.leader_elect_resource_name.clone(),
            identity: leader::default_identity(),
            lease_duration: opts.leader_elect_lease_duration,
            renew_deadline: opts.leader_elect_renew_deadline,
            retry_period: opts.leader_elect_retry_period,
        },
    )
}

/// With leader election: ready as a standby until the Lease is ours, then
/// the controllers until shutdown (controllers first, then the Lease) or
/// until the Lease is lost (exit non-zero).
async fn lead<Stop: Future<Output = ()>>(
    elector: &mut LeaderElector,
    ready: &AtomicBool,
    shutdown: &CancellationToken,
    run_controllers: impl Fn(CancellationToken, Option<Acquisition>) -> tokio::task::JoinHandle<()>,
    stop_aws: impl Fn() -> Stop,
) -> ExitCode {
    // A standby replica serves health and is ready: it has nothing to sync.
    ready.store(true, Ordering::Relaxed);
    if !elector.acquire(shutdown).await {
        ExitCode::SUCCESS
    } else {
        ready.store(false, Ordering::Relaxed);
        let controllers_stop = CancellationToken::new();
        let lease_stop = CancellationToken::new();
        let task = run_controllers(controllers_stop.clone(), elector.acquisition());
        let hold = elector.hold(&lease_stop);
        tokio::pin!(hold);
        tokio::select! {
            end = &mut hold => {
                // Lost: no change to AWS from here on, then exit non-zero
                // at once; the controllers' work in progress is abandoned
                // (the successor re-reads everything).
                stop_aws().await;
                controllers_stop.cancel();
                task.abort();
                debug_assert_eq!(end, LeadershipEnd::Lost);
                tracing::error!("leaderelection lost; exiting so that another replica can lead");
                ExitCode::FAILURE
            }
            _ = shutdown.cancelled() => {
                controllers_stop.cancel();
                stop_controllers(task).await;
                // A controller past its grace makes no change after the
                // Lease is released.
                stop_aws().await;
                lease_stop.cancel();
                match hold.await {
                    LeadershipEnd::Released => ExitCode::SUCCESS,
                    LeadershipEnd::Lost => ExitCode::FAILURE,
                }
            }
        }
    }
}

/// The load balancers the controllers sync: known settings trusted until
/// each Service's resync slot, and the target `record` (which shutdown
/// flushes).
fn load_balancers(
    aws: &AwsClient,
    cloud: &Arc<CloudConfig>,
    cluster_id: &str,
    opts: &crate::options::Options,
    record: &TargetRecord,
) -> AwsLoadBalancers {
    let lbs = AwsLoadBalancers::new(
        aws.clone(),
        cloud.clone(),
        cluster_id.to_string(),
        opts.cluster_name.clone(),
    );
    AwsLoadBalancers {
        record: record.clone(),
        ..lbs.trusting_known_settings(opts.service_resync_period)
    }
}

/// The controllers, once we lead (or without leader election): the
/// permission self-check beside them, and the target record started before
/// the first sync (no target changes while it starts).
fn spawn_controllers(
    env: controllers::Environment,
    record: RecordStart,
    ready: Arc<AtomicBool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // A standby writes nothing; the self-check consults the same registry
    // as the controllers, which never wait for it.
    let check = tokio::spawn(controllers::permission_check::run(env.clone()));
    let check_stop = stop.clone();
    tokio::spawn(async move {
        check_stop.cancelled().await;
        check.abort();
    });
    tokio::spawn(async move {
        record.start(&env.load_balancers.record).await;
        controllers::informers::run_all(env, ready, stop).await
    })
}

/// Where the target record lives, and the acquisition that decides whether
/// its entries are trusted (`None`: no leader election, no record).
struct RecordStart {
    client: kube::Client,
    namespace: String,
    name: String,
    acquired: Option<Acquisition>,
}

impl RecordStart {
    /// Beside the Lease of `opts`.
    fn new(
        client: kube::Client,
        opts: &crate::options::Options,
        acquired: Option<Acquisition>,
    ) -> RecordStart {
        RecordStart {
            client,
            namespace: opts.leader_elect_resource_namespace.clone(),
            name: target_record::configmap_name(&opts.leader_elect_resource_name),
            acquired,
        }
    }

    /// Starts `record`; a failure leaves it off (every adoption then reads
    /// every target group) with a warning naming the fix.
    async fn start(self, record: &TargetRecord) {
        let Some(acq) = &self.acquired else {
            tracing::info!(
                "no leader election: no target record; adoption reads every NLB target group"
            );
            return;
        };
        if let Err(e) = record
            .start(self.client, &self.namespace, &self.name, acq)
            .await
        {
            tracing::warn!(error = %e, configmap = %format!("{}/{}", self.namespace, self.name), "the target record is off: adoption reads every NLB target group; grant get, update and create on this ConfigMap (manifests/base/rbac.yaml) to turn it on");
        }
    }
}

/// How long AWS calls already sent get to be answered once we cannot prove
/// we lead: a successor may take the Lease after lease duration minus
/// renew deadline.
fn drain_bound(opts: &crate::options::Options) -> Duration {
    opts.leader_elect_lease_duration
        .saturating_sub(opts.leader_elect_renew_deadline)
}

/// Refuses every further change to AWS and waits (at most `drain`) for
/// those already sent to be answered.
async fn stop_aws_changes(aws: &AwsClient, drain: Duration) {
    let unanswered = aws.stop_mutations(drain).await;
    if unanswered > 0 {
        tracing::error!(
            unanswered,
            "AWS changes still unanswered after stopping all changes"
        );
    }
    tracing::info!("stopped all changes to AWS");
}

async fn stop_controllers(task: tokio::task::JoinHandle<()>) {
    if tokio::time::timeout(CONTROLLER_STOP_GRACE, task)
        .await
        .is_err()
    {
        tracing::warn!(grace = ?CONTROLLER_STOP_GRACE, "controllers did not stop in time");
    }
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("received SIGTERM; shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("received SIGINT; shutting down"),
        }
        shutdown.cancel();
    });
}

/// The cluster ID: from cloud.conf, else from this instance's tags (found
/// through the instance metadata service), else empty when
/// `--allow-untagged-cloud` is set. The flag says whether it came from the
/// legacy `KubernetesCluster` tag (or `KubernetesClusterTag`); the text says
/// where the ID was found.
async fn resolve_cluster_id(
    cloud: &CloudConfig,
    sdk: &SdkClients,
    door: &Arc<Door>,
    opts: &crate::options::Options,
    allow_untagged: bool,
) -> anyhow::Result<(ClusterIdentity, String)> {
    if let Some(id) = cloud.cluster_id() {
        let key = if cloud.kubernetes_cluster_id.is_some() {
            "KubernetesClusterID"
        } else {
            "KubernetesClusterTag"
        };
        let identity = ClusterIdentity {
            id: id.to_string(),
            writes_legacy_tag: cloud.uses_legacy_tag(),
            legacy_only: cloud.cluster_id_is_legacy(),
        };
        return Ok((identity, format!("cloud.conf [Global] {key}")));
    }
    let discovered = async {
        let instance_id = clients::imds::instance_id(cloud.imds_endpoint())
            .await
            .map_err(anyhow::Error::msg)?;
        // The cluster ID is not known yet, so this one lookup goes through a
        // bootstrap client that owns no cluster resources.
        let bootstrap = AwsClient::with_door(
            sdk.clone(),
            String::new(),
            opts.aws_client_options(),
            door.clone(),
        );
        let instance = bootstrap
            .instance_by_id(&instance_id)
            .await
            .with_context(|| format!("looking up this instance {instance_id}"))?;
        Ok::<_, anyhow::Error>(instance)
    }
    .await;
    let discovered = match discovered {
        // Contradicting tags stop start-up even with --allow-untagged-cloud,
        // as upstream's init does.
        Ok(instance) => Ok(cluster_id_from_tags(instance.tags.iter())
            .map_err(anyhow::Error::msg)?
            .map(|found| {
                let tag = if found.writes_legacy_tag {
                    format!("{LEGACY_CLUSTER_TAG}={}", found.id)
                } else {
                    format!("{CLUSTER_TAG_PREFIX}{}", found.id)
                };
                let from = format!("the tag {tag} of this instance {}", instance.id);
                (found, from)
            })),
        Err(e) => Err(e),
    };
    match discovered {
        Ok(Some(found)) => Ok(found),
        Ok(None) | Err(_) if allow_untagged => {
            tracing::warn!("no cluster ID in cloud.conf or on this instance; running untagged (--allow-untagged-cloud) — resources cannot be attributed to this cluster");
            let identity = ClusterIdentity {
                id: String::new(),
                writes_legacy_tag: false,
                legacy_only: false,
            };
            Ok((identity, "none: --allow-untagged-cloud".to_string()))
        }
        Ok(None) => anyhow::bail!(
            "no cluster ID: set KubernetesClusterID in the [Global] section of cloud.conf, or tag this instance kubernetes.io/cluster/<cluster-id>=owned (or pass --allow-untagged-cloud)"
        ),
        Err(e) => Err(e.context(
            "no cluster ID in cloud.conf and it could not be read from this instance's tags: set KubernetesClusterID in the [Global] section of cloud.conf (or pass --allow-untagged-cloud)",
        )),
    }
}

/// How the cluster is identified, as the Go CCM's `awsTagging` decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterIdentity {
    pub id: String,
    /// Upstream's `usesLegacyTags`: cloud.conf `KubernetesClusterTag`, or a
    /// `KubernetesCluster` tag on this instance (kOps puts it next to
    /// `kubernetes.io/cluster/<id>` on every instance). What this CCM
    /// creates then also carries `KubernetesCluster=<id>`.
    pub writes_legacy_tag: bool,
    /// Only the legacy tag identifies the cluster (no
    /// `kubernetes.io/cluster/<id>` seen): the instance sweep also queries
    /// the legacy tag.
    pub legacy_only: bool,
}

/// Upstream's rule (`findClusterIDs` and `awsTagging.init`): the legacy
/// `KubernetesCluster=<id>` tag, when present, gives the ID and turns on
/// the legacy tag; `kubernetes.io/cluster/<id>` otherwise. Two different
/// IDs, or two `kubernetes.io/cluster/` tags, are an error naming both.
pub fn cluster_id_from_tags<'a>(
    tags: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Option<ClusterIdentity>, String> {
    let mut legacy: Option<&str> = None;
    let mut current: Option<&str> = None;
    for (key, value) in tags {
        if let Some(id) = key.strip_prefix(CLUSTER_TAG_PREFIX) {
            if let Some(first) = current.filter(|first| *first != id) {
                return Err(format!(
                    "this instance carries two cluster tags, {CLUSTER_TAG_PREFIX}{first} and {CLUSTER_TAG_PREFIX}{id}; remove the wrong one or set KubernetesClusterID in the [Global] section of cloud.conf"
                ));
            }
            current = Some(id).filter(|id| !id.is_empty());
        }
        if key == LEGACY_CLUSTER_TAG && !value.is_empty() {
            legacy = Some(value);
        }
    }
    Ok(match (legacy, current) {
        (Some(old), Some(new)) if old != new => {
            return Err(format!(
                "this instance's cluster tags do not match: {LEGACY_CLUSTER_TAG}={old} and {CLUSTER_TAG_PREFIX}{new}; make them name one cluster or set KubernetesClusterID in the [Global] section of cloud.conf"
            ));
        }
        (Some(old), current) => Some(ClusterIdentity {
            id: old.to_string(),
            writes_legacy_tag: true,
            legacy_only: current.is_none(),
        }),
        (None, Some(new)) => Some(ClusterIdentity {
            id: new.to_string(),
            writes_legacy_tag: false,
            legacy_only: false,
        }),
        (None, None) => None,
    })
}

/// Reads a cloud.conf path for error messages in main.
pub fn describe_config_path(path: Option<&Path>) -> String {
    path.map_or_else(|| "(none)".to_string(), |p| p.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(id: &str, writes_legacy_tag: bool, legacy_only: bool) -> ClusterIdentity {
        ClusterIdentity {
            id: id.into(),
            writes_legacy_tag,
            legacy_only,
        }
    }

    #[test]
    fn cluster_id_from_instance_tags_follows_upstream() {
        // kOps: both tags, one name. The legacy tag turns on writing it.
        let kops = [
            ("KubernetesCluster", "k.example.com"),
            ("kubernetes.io/cluster/k.example.com", "owned"),
            ("Name", "x"),
        ];
        assert_eq!(
            cluster_id_from_tags(kops.iter().copied()),
            Ok(Some(identity("k.example.com", true, false)))
        );
        let tags = [("KubernetesCluster", "old")];
        assert_eq!(
            cluster_id_from_tags(tags.iter().copied()),
            Ok(Some(identity("old", true, true)))
        );
        let tags = [("kubernetes.io/cluster/new", "owned")];
        assert_eq!(
            cluster_id_from_tags(tags.iter().copied()),
            Ok(Some(identity("new", false, false)))
        );
        assert_eq!(
            cluster_id_from_tags([("Name", "x")].iter().copied()),
            Ok(None)
        );
    }

    #[test]
    fn contradicting_cluster_tags_are_refused_naming_both() {
        let tags = [
            ("KubernetesCluster", "old"),
            ("kubernetes.io/cluster/new", "owned"),
        ];
        let err = cluster_id_from_tags(tags.iter().copied()).unwrap_err();
        assert!(
            err.contains("KubernetesCluster=old") && err.contains("kubernetes.io/cluster/new"),
            "{err}"
        );
        let tags = [
            ("kubernetes.io/cluster/a", "owned"),
            ("kubernetes.io/cluster/b", "shared"),
        ];
        let err = cluster_id_from_tags(tags.iter().copied()).unwrap_err();
        assert!(
            err.contains("kubernetes.io/cluster/a") && err.contains("kubernetes.io/cluster/b"),
            "{err}"
        );
    }
}
