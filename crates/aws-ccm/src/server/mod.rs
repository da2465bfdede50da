//! The HTTPS endpoint on `--bind-address:--secure-port`: `/healthz`,
//! `/livez`, `/readyz` and `/metrics` (Prometheus text).
//!
//! With `--tls-cert-file`/`--tls-private-key-file` it serves that pair and
//! follows it on disk; otherwise a self-signed certificate for the host name
//! is generated in memory at start-up, as upstream does when no certificate
//! is configured. `--tls-min-version`/`--tls-cipher-suites`: [`tls`].
//! Who may read what: [`auth`]. With `--service-admission-webhook`, also
//! the service admission check: [`admission`].

pub mod admission;
pub mod auth;
mod cache;
pub mod delegate;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum_server::tls_rustls::RustlsConfig;
use tokio_util::sync::CancellationToken;

pub use self::auth::{AllowPaths, Auth, AuthSettings};
pub use self::tls::{TlsFiles, TlsPolicy};

use crate::leader::LeaderStatus;

/// How long past a missed renewal /healthz still reports ok (upstream's
/// leader-election health adaptor uses 20 s).
const LEADER_HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// What the health endpoints look at: handles to state others set.
#[derive(Clone)]
pub struct Health {
    leader: Arc<LeaderStatus>,
    /// Set once the controllers' caches have synced (or when this replica is a standby).
    ready: Arc<AtomicBool>,
    lease_duration: Duration,
}

impl Health {
    /// `/healthz` follows `leader`'s renewals (given `lease_duration`),
    /// `/readyz` follows `ready`.
    pub fn new(
        leader: Arc<LeaderStatus>,
        ready: Arc<AtomicBool>,
        lease_duration: Duration,
    ) -> Self {
        Health {
            leader,
            ready,
            lease_duration,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("serving certificate: {0}")]
    Cert(#[from] tls::CertError),
    #[error("TLS configuration: {0}")]
    TlsConfig(String),
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("listening on {addr}: {error}")]
    Bind {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

/// How to serve: certificate, TLS policy, and who may read what.
pub struct ServeOptions {
    /// `--tls-cert-file`/`--tls-private-key-file`; self-signed when `None`.
    pub tls_files: Option<TlsFiles>,
    pub tls: TlsPolicy,
    /// `None` serves everyone (tests of the endpoints themselves).
    pub auth: Option<Arc<Auth>>,
    /// How often the certificate files are checked for a new pair.
    pub reload_interval: Duration,
    /// The service admission check, when `--service-admission-webhook`.
    pub admission: Option<Arc<admission::ServiceAdmission>>,
}

/// A running server; dropping the handle does not stop it, `shutdown` does.
pub struct RunningServer {
    pub local_addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
    /// Ends the certificate watcher.
    stop: CancellationToken,
}

impl RunningServer {
    pub async fn shutdown(self) {
        self.handle.graceful_shutdown(Some(Duration::from_secs(2)));
        let _ = self.task.await;
        self.stop.cancel();
    }
}

/// The routes; with `auth`, every request (unknown paths too, as upstream)
/// is authenticated and authorized first, but the admission check's
/// (kube-apiserver sends no credentials to a webhook).
pub(crate) fn router(
    health: Health,
    auth: Option<Arc<Auth>>,
    admission: Option<Arc<admission::ServiceAdmission>>,
) -> Router {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health);
    let app = match auth {
        Some(auth) => app.layer(axum::middleware::from_fn_with_state(auth, auth::guard)),
        None => app,
    };
    match admission {
        Some(admission) => app.merge(admission::router(admission)),
        None => app,
    }
}

async fn healthz(State(h): State<Health>) -> impl IntoResponse {
    match h.leader.since_last_renew() {
        Some(since) if since > h.lease_duration + LEADER_HEALTH_TOLERANCE => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "[-]leaderElection failed: lease not renewed for {since:?}\nhealthz check failed\n"
            ),
        ),
        _ => (StatusCode::OK, "ok".to_string()),
    }
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "[-]informer-sync: caches not synced yet\nreadyz check failed\n",
        )
    }
}

async fn metrics() -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::encode(),
    )
}

/// The certificate resolver and TLS configuration for `opts`.
fn tls_config(opts: &ServeOptions, stop: &CancellationToken) -> Result<RustlsConfig, ServerError> {
    let provider = Arc::new(opts.tls.provider());
    let certs = match &opts.tls_files {
        Some(files) => {
            tls::load_and_watch(files.clone(), provider, opts.reload_interval, stop.clone())?
        }
        None => {
            tls::ReloadingCert::fixed(tls::self_signed(&provider).map_err(ServerError::SelfSigned)?)
        }
    };
    let config = opts
        .tls
        .server_config(certs)
        .map_err(|e| ServerError::TlsConfig(e.to_string()))?;
    Ok(RustlsConfig::from_config(Arc::new(config)))
}

/// Binds and starts serving; returns once the socket is listening.
pub async fn start(
    addr: SocketAddr,
    opts: ServeOptions,
    health: Health,
) -> Result<RunningServer, ServerError> {
    let stop = CancellationToken::new();
    let config = tls_config(&opts, &stop)?;
    // Bind ourselves so a busy port is reported now, not from a background task.
    let bind_error = |error| ServerError::Bind { addr, error };
    let listener = std::net::TcpListener::bind(addr).map_err(bind_error)?;
    listener.set_nonblocking(true).map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let handle = axum_server::Handle::new();
    let mut server = axum_server::from_tcp_rustls(listener, config)
        .map_err(bind_error)?
        .handle(handle.clone());
    if opts.tls.http1_only {
        let builder = server.http_builder();
        *builder = builder.clone().http1_only();
    }
    let app = router(health, opts.auth, opts.admission);
    let task = tokio::spawn(async move {
        if let Err(e) = server.serve(app.into_make_service()).await {
            tracing::error!(error = %e, "health/metrics server stopped");
        }
    });
    tracing::info!(address = %local_addr, "serving securely on {local_addr}");
    Ok(RunningServer {
        local_addr,
        handle,
        task,
        stop,
    })
}
