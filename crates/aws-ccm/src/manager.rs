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

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::aws::client::clients;
use crate::aws::client::door::Door;
use crate::aws::cluster_id::resolve_cluster_id;
use crate::aws::load_balancers::AwsLoadBalancers;
use crate::aws::{Aws, AwsClient};
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
    let c = connect_aws_described(&cloud, opts).await?;
    let (aws, cluster_id, region) = (c.aws, c.cluster_id, c.region);

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
    let leader = (elector.as_ref()).map_or(leader_status.clone(), |e| e.status());
    let health = Health::new(leader, ready.clone(), opts.leader_elect_lease_duration);
    let cloud = Arc::new(cloud);
    let http = start_http(&validated, &kube, health, &cloud).await?;
    let drain = drain_bound(opts);
    let validated = Arc::new(validated);
    let record = TargetRecord::default();
    let run_controllers = |stop: CancellationToken, acquired: Option<Acquisition>| {
        let env = controllers::Environment {
            kube: kube.clone(),
            provider: aws.clone(),
            cloud: cloud.clone(),
            options: validated.clone(),
            cluster_id: cluster_id.clone(),
            region: region.clone(),
            load_balancers: load_balancers(&aws, &cloud, &cluster_id, &validated.options, &record),
        };
        spawn_controllers(env, record_kube.clone(), acquired, ready.clone(), stop)
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
            let leading = elector.status();
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
    let Some(path) = opts
        .cloud_config
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty())
    else {
        tracing::info!("no --cloud-config given; using defaults and instance metadata");
        return Ok(CloudConfig::default());
    };
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
    Ok(cloud)
}

/// The one door to AWS, with the region and the cluster ID resolved and
/// where they came from (for `aws-ccm doctor`).
pub(crate) struct Connected {
    pub(crate) aws: Aws,
    pub(crate) cluster_id: String,
    pub(crate) region: String,
    /// How the region was found (cloud.conf, or instance metadata).
    pub(crate) region_from: String,
    /// How the cluster ID was found (cloud.conf, or a tag of this instance).
    pub(crate) cluster_id_from: String,
}

/// Connects to AWS: the region, the cluster ID and the one door, saying
/// where the region and the cluster ID came from.
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
    let mut settings = opts.aws_settings();
    // The sweep queries the legacy `KubernetesCluster` tag only for a
    // cluster identified by it alone. kOps puts both tags on every
    // instance, so querying both would read each instance twice.
    settings.instances.legacy_cluster_tag = identity.legacy_only;
    settings.instances.topology_pattern = cloud.supported_topology_instance_type_pattern.clone();
    settings.write_legacy_cluster_tag = identity.writes_legacy_tag;
    if identity.writes_legacy_tag {
        tracing::info!(cluster_id = %cluster_id, "the cluster is identified by the legacy KubernetesCluster tag (cloud.conf KubernetesClusterTag, or on this instance, as kOps tags it): what this CCM creates carries KubernetesCluster={cluster_id} too, as the Go CCM writes it");
    }
    let aws = Aws::with_door(
        sdk,
        cluster_id.clone(),
        opts.aws_client_options(),
        settings,
        door,
    );
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
    cloud: &Arc<CloudConfig>,
) -> anyhow::Result<Option<server::RunningServer>> {
    let opts = &validated.options;
    if opts.secure_port == 0 {
        if opts.service_admission_webhook {
            tracing::warn!(
                "--service-admission-webhook=true is not served: --secure-port=0 turns the HTTPS endpoint off"
            );
        }
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
        admission: opts.service_admission_webhook.then(|| {
            Arc::new(server::admission::ServiceAdmission {
                cloud: cloud.clone(),
            })
        }),
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
    aws: &Aws,
    cloud: &Arc<CloudConfig>,
    cluster_id: &str,
    opts: &crate::options::Options,
    record: &TargetRecord,
) -> AwsLoadBalancers {
    AwsLoadBalancers::new(
        aws.clone(),
        cloud.clone(),
        cluster_id.to_string(),
        opts.cluster_name.clone(),
    )
    .trusting_known_settings(opts.service_resync_period)
    .with_target_record(record.clone())
}

/// The controllers, once we lead (or without leader election): the
/// permission self-check beside them, and the target record started before
/// the first sync (no target changes while it starts).
fn spawn_controllers(
    env: controllers::Environment,
    record_kube: kube::Client,
    acquired: Option<Acquisition>,
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
        start_record(&env, record_kube, acquired).await;
        controllers::informers::run_all(env, ready, stop).await
    })
}

/// Starts `record` beside the Lease of `env`'s options, when `acquired`
/// decides whether its entries are trusted (`None`: no leader election, no
/// record); a failure leaves it off (every adoption then reads every target
/// group) with a warning naming the fix.
async fn start_record(
    env: &controllers::Environment,
    client: kube::Client,
    acquired: Option<Acquisition>,
) {
    let Some(acq) = &acquired else {
        tracing::info!(
            "no leader election: no target record; adoption reads every NLB target group"
        );
        return;
    };
    let opts = &env.options.options;
    let namespace = &opts.leader_elect_resource_namespace;
    let name = target_record::configmap_name(&opts.leader_elect_resource_name);
    if let Err(e) = env
        .load_balancers
        .target_record()
        .start(client, namespace, &name, acq)
        .await
    {
        tracing::warn!(error = %e, configmap = %format!("{namespace}/{name}"), "the target record is off: adoption reads every NLB target group; grant get, update and create on this ConfigMap (manifests/base/rbac.yaml) to turn it on");
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
