//! The HTTPS endpoint on `--bind-address:--secure-port`: `/healthz`,
//! `/livez`, `/readyz` and `/metrics` (Prometheus text).
//!
//! With `--tls-cert-file`/`--tls-private-key-file` it serves that pair;
//! otherwise a self-signed certificate for the host name is generated in
//! memory at start-up, as upstream does when no certificate is configured.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use axum_server::tls_rustls::RustlsConfig;

use crate::leader::LeaderStatus;

/// How long past a missed renewal /healthz still reports ok (upstream's
/// leader-election health adaptor uses 20 s).
const LEADER_HEALTH_TOLERANCE: Duration = Duration::from_secs(20);

/// What the health endpoints look at.
#[derive(Clone)]
pub struct Health {
    pub leader: Arc<LeaderStatus>,
    /// Set once the controllers' caches have synced (or when this replica is a standby).
    pub ready: Arc<AtomicBool>,
    pub lease_duration: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("reading TLS certificate {path}: {error}")]
    Tls {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(String),
    #[error("listening on {addr}: {error}")]
    Bind {
        addr: SocketAddr,
        error: std::io::Error,
    },
}

pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A running server; dropping the handle does not stop it, `shutdown` does.
pub struct RunningServer {
    pub local_addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    pub async fn shutdown(self) {
        self.handle.graceful_shutdown(Some(Duration::from_secs(2)));
        let _ = self.task.await;
    }
}

pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(health)
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

async fn tls_config(tls: Option<TlsFiles>) -> Result<RustlsConfig, ServerError> {
    if let Some(files) = tls {
        let cert = tokio::fs::read(&files.cert)
            .await
            .map_err(|source| ServerError::Tls {
                path: files.cert.clone(),
                error: source,
            })?;
        let key = tokio::fs::read(&files.key)
            .await
            .map_err(|source| ServerError::Tls {
                path: files.key.clone(),
                error: source,
            })?;
        return RustlsConfig::from_pem(cert, key)
            .await
            .map_err(|source| ServerError::Tls {
                path: files.cert,
                error: source,
            });
    }
    let host = gethostname::gethostname().to_string_lossy().into_owned();
    let names = vec![host, "localhost".to_string(), "127.0.0.1".to_string()];
    let cert = rcgen::generate_simple_self_signed(names)
        .map_err(|e| ServerError::SelfSigned(e.to_string()))?;
    RustlsConfig::from_pem(
        cert.cert.pem().into_bytes(),
        cert.signing_key.serialize_pem().into_bytes(),
    )
    .await
    .map_err(|e| ServerError::SelfSigned(e.to_string()))
}

/// Binds and starts serving; returns once the socket is listening.
pub async fn start(
    addr: SocketAddr,
    tls: Option<TlsFiles>,
    health: Health,
) -> Result<RunningServer, ServerError> {
    let config = tls_config(tls).await?;
    // Bind ourselves so a busy port is reported now, not from a background task.
    let listener = std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind {
        addr,
        error: source,
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| ServerError::Bind {
            addr,
            error: source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| ServerError::Bind {
        addr,
        error: source,
    })?;
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(listener, config)
        .map_err(|source| ServerError::Bind {
            addr,
            error: source,
        })?
        .handle(handle.clone());
    let app = router(health);
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
    })
}
