//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics so a Go CCM and this one can even share a lock during a swap:
//!
//! * a candidate tries every retry period (with jitter) and takes the Lease
//!   when it is free, released, or not renewed for a lease duration *as seen
//!   on our own clock* (the holder's timestamps are never compared with ours,
//!   so clock skew cannot cause two leaders);
//! * the leader renews every retry period; if no renewal succeeds within the
//!   renew deadline it has lost, and the caller must stop acting at once;
//! * writes carry the resourceVersion they were based on, so two candidates
//!   racing for a free Lease cannot both win (one gets 409 Conflict);
//! * on shutdown the leader releases the Lease (empty holder, 1 s duration)
//!   so a successor does not wait out the full lease.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rand::Rng;
use tokio_util::sync::CancellationToken;

/// client-go's `leader_election_master_status{name}`, which the Go CCM
/// exposes: 1 while this replica leads the Lease `name`, else 0.
static MASTER_STATUS: LazyLock<Family<crate::metrics::Labels, Gauge>> = LazyLock::new(|| {
    crate::metrics::registered(
        "leader_election_master_status",
        "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
        Family::default(),
    )
});

fn set_master_status(name: &str, leading: bool) {
    MASTER_STATUS
        .get_or_create(&vec![("name", name.to_string())])
        .set(i64::from(leading));
}

#[derive(Debug, Clone)]
pub(crate) struct LeaderElectionConfig {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) identity: String,
    pub(crate) lease_duration: Duration,
    pub(crate) renew_deadline: Duration,
    pub(crate) retry_period: Duration,
}

/// `<hostname>_<uuid>`, as upstream builds its identity.
pub(crate) fn default_identity() -> String {
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// Shared view of leadership for health checks and metrics.
#[derive(Debug, Default)]
pub struct LeaderStatus {
    is_leader: AtomicBool,
    /// Milliseconds since `epoch` of the last successful renewal.
    last_renew_ms: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl LeaderStatus {
    fn epoch(&self) -> Instant {
        *self.epoch.get_or_init(Instant::now)
    }
    fn mark_renewed(&self) {
        let ms = self.epoch().elapsed().as_millis() as u64;
        self.last_renew_ms.store(ms, Ordering::Relaxed);
        self.is_leader.store(true, Ordering::Relaxed);
    }
    fn mark_follower(&self) {
        self.is_leader.store(false, Ordering::Relaxed);
    }
    pub(crate) fn is_leader(&self) -> bool {
        self.is_leader.load(Ordering::Relaxed)
    }
    /// How long ago the lease was last renewed, if we lead.
    pub(crate) fn since_last_renew(&self) -> Option<Duration> {
        self.is_leader().then(|| {
            let now = self.epoch().elapsed().as_millis() as u64;
            Duration::from_millis(now.saturating_sub(self.last_renew_ms.load(Ordering::Relaxed)))
        })
    }
}

/// Why leadership ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeadershipEnd {
    /// Shutdown was requested; the Lease has been released.
    Released,
    /// No renewal succeeded within the renew deadline.
    Lost,
}

/// What we last saw in the Lease and when (on our clock).
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    holder: String,
    renew_time: Option<Timestamp>,
    transitions: i32,
    duration_secs: i32,
}

impl Observed {
    /// What `spec` says; `duration_secs` when it names no duration.
    fn of(spec: &LeaseSpec, duration_secs: i32) -> Observed {
        Observed {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            duration_secs: spec.lease_duration_seconds.unwrap_or(duration_secs),
        }
    }
}

pub(crate) struct LeaderElector {
    api: Api<Lease>,
    config: LeaderElectionConfig,
    observed: Option<(Observed, Instant)>,
    /// What our last acquisition found and made of the Lease.
    acquired: Option<crate::target_record::Acquisition>,
    status: Arc<LeaderStatus>,
}

impl LeaderElector {
    pub(crate) fn new(client: Client, config: LeaderElectionConfig) -> LeaderElector {
        // A standby reports 0 from the start, as client-go does.
        set_master_status(&config.name, false);
        LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            config,
            observed: None,
            acquired: None,
            status: Arc::new(LeaderStatus::default()),
        }
    }

    /// What this elector says of its lease, for `/healthz` and the
    /// controllers' stop.
    pub(crate) fn status(&self) -> Arc<LeaderStatus> {
        self.status.clone()
    }

    /// The Lease's UID and transitions at our acquisition (before and
    /// after it), once we lead: the target record's trust rests on them.
    pub(crate) fn acquisition(&self) -> Option<crate::target_record::Acquisition> {
        self.acquired.clone()
    }

    fn jittered_retry(&self) -> Duration {
        // client-go jitters acquisition attempts by up to 20 % (JitterFactor 1.2).
        let jitter = rand::rng().random_range(0.0..0.2);
        self.config.retry_period.mul_f64(1.0 + jitter)
    }

    /// Blocks until this candidate holds the Lease (`true`) or shutdown is requested (`false`).
    pub(crate) async fn acquire(&mut self, shutdown: &CancellationToken) -> bool {
        tracing::info!(lease = %format!("{}/{}", self.config.namespace, self.config.name), identity = %self.config.identity, "attempting to acquire leader lease");
        loop {
            match self.try_acquire_or_renew().await {
                Ok(true) => {
                    tracing::info!(identity = %self.config.identity, "successfully acquired lease");
                    self.status.mark_renewed();
                    set_master_status(&self.config.name, true);
                    return true;
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "error retrieving or updating the leader lease; will retry")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(self.jittered_retry()) => {}
            }
        }
    }

    /// Renews the Lease until shutdown (then releases it) or until a renewal
    /// deadline is missed.
    pub(crate) async fn hold(&mut self, shutdown: &CancellationToken) -> LeadershipEnd {
        let mut last_renew = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.release().await;
                    set_master_status(&self.config.name, false);
                    return LeadershipEnd::Released;
                }
                _ = tokio::time::sleep(self.config.retry_period) => {}
            }
            let deadline = last_renew + self.config.renew_deadline;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(remaining, self.try_acquire_or_renew()).await;
            match attempt {
                Ok(Ok(true)) => {
                    last_renew = Instant::now();
                    self.status.mark_renewed();
                }
                Ok(Ok(false)) => tracing::warn!("leader lease is held by another candidate"),
                Ok(Err(e)) => tracing::warn!(error = %e, "failed to renew leader lease"),
                Err(_) => tracing::warn!("renewing the leader lease timed out"),
            }
            if last_renew.elapsed() >= self.config.renew_deadline {
                self.status.mark_follower();
                set_master_status(&self.config.name, false);
                tracing::error!(identity = %self.config.identity, renew_deadline = ?self.config.renew_deadline, "leader election lost: failed to renew lease before the renew deadline");
                return LeadershipEnd::Lost;
            }
        }
    }

    /// One round of client-go's tryAcquireOrRenew.
    async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let duration_secs = self.config.lease_duration.as_secs().max(1) as i32;
        let existing = self.api.get_opt(&self.config.name).await?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.config.identity.clone()),
                    lease_duration_seconds: Some(duration_secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => Ok(self.won(&created, Some(None))),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let observed = Observed::of(&spec, duration_secs);
        let observed_at = match &self.observed {
            Some((prev, at)) if *prev == observed => *at,
            _ => Instant::now(),
        };
        self.observed = Some((observed.clone(), observed_at));
        let held_by_me = observed.holder == self.config.identity;
        let expired = observed_at + Duration::from_secs(observed.duration_secs.max(0) as u64)
            <= Instant::now();
        if !observed.holder.is_empty() && !held_by_me && !expired {
            return Ok(false);
        }
        let (acquire_time, transitions) = if held_by_me {
            (
                spec.acquire_time.clone().unwrap_or(MicroTime(now)),
                observed.transitions,
            )
        } else {
            (MicroTime(now), observed.transitions + 1)
        };
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(duration_secs),
            acquire_time: Some(acquire_time),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..spec
        });
        // `replace` sends our resourceVersion: a concurrent writer makes it 409.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                let took = (!held_by_me).then_some(Some(observed.transitions));
                Ok(self.won(&updated, took))
            }
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// We hold `lease` as written; `took`: we took it from another holder
    /// (or created it: `Some(None)`), finding those transitions.
    fn won(&mut self, lease: &Lease, took: Option<Option<i32>>) -> bool {
        let spec = lease.spec.clone().unwrap_or_default();
        self.observed = Some((Observed::of(&spec, 0), Instant::now()));
        if let Some(before) = took {
            self.acquired = Some(acquisition(lease, before));
        }
        true
    }

    /// Gives the Lease up if we still hold it, so a successor can take over at once.
    pub(crate) async fn release(&mut self) {
        self.status.mark_follower();
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        let now = Timestamp::now();
        lease.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            ..spec
        });
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(identity = %self.config.identity, "released leader lease"),
            Err(e) => {
                tracing::warn!(error = %e, "failed to release leader lease; a successor will wait for it to expire")
            }
        }
    }
}

/// What an acquisition that wrote `lease` (finding `before` transitions;
/// `None`: it created the Lease) leaves.
fn acquisition(lease: &Lease, before: Option<i32>) -> crate::target_record::Acquisition {
    crate::target_record::Acquisition {
        lease_uid: lease.metadata.uid.clone().unwrap_or_default(),
        before,
        now: lease
            .spec
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0),
    }
}
