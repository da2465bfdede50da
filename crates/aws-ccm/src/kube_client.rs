//! The Kubernetes client: `--kubeconfig`, `--master`, in-cluster config, and
//! client-side QPS/burst limits (`--kube-api-qps`, `--kube-api-burst`) as
//! client-go applies them. kube-rs has no client-side limiter, so a small
//! tower layer backed by a governor token bucket provides it; another
//! records client-go's `rest_client_*` metrics.

use std::future::Future;
use std::num::NonZeroU32;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use tower::Service;
use tower::layer::{LayerFn, layer_fn};

#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeClientError {
    #[error("--kubeconfig {path}: {error}")]
    Kubeconfig {
        path: String,
        error: kube::config::KubeconfigError,
    },
    #[error("--master {value:?} is not a valid URL: {reason}")]
    Master { value: String, reason: String },
    #[error(
        "no Kubernetes configuration: not running in a pod and no --kubeconfig/KUBECONFIG given ({0})"
    )]
    Infer(kube::config::InferConfigError),
    #[error("building the Kubernetes client: {0}")]
    Build(kube::Error),
}

/// Loads client configuration the way upstream does: `--kubeconfig` if given,
/// else in-cluster, else `$KUBECONFIG`/`~/.kube/config`; `--master` overrides
/// the server address in any of them.
pub(crate) async fn load_config(
    kubeconfig: Option<&Path>,
    master: Option<&str>,
) -> Result<Config, KubeClientError> {
    let mut config = match (kubeconfig, master) {
        (Some(path), _) => {
            let err = |error| KubeClientError::Kubeconfig {
                path: path.display().to_string(),
                error,
            };
            let kc = Kubeconfig::read_from(path).map_err(err)?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(err)?
        }
        // --master alone: an unauthenticated client, as upstream allows for tests.
        (None, Some(url)) => Config::new(parse_master(url)?),
        (None, None) => Config::infer().await.map_err(KubeClientError::Infer)?,
    };
    if let Some(url) = master {
        config.cluster_url = parse_master(url)?;
    }
    Ok(config)
}

fn parse_master(value: &str) -> Result<http::Uri, KubeClientError> {
    let refused = |reason: String| KubeClientError::Master {
        value: value.to_string(),
        reason,
    };
    let uri: http::Uri = value
        .parse()
        .map_err(|e: http::uri::InvalidUri| refused(e.to_string()))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        return Err(refused(
            "expected scheme and host, e.g. https://10.0.0.1:6443".to_string(),
        ));
    }
    Ok(uri)
}

/// Builds a client that never exceeds `qps` requests per second on average,
/// with bursts up to `burst`. Watches count once, at connection time, as in client-go.
pub(crate) fn build_client(
    config: Config,
    qps: f32,
    burst: u32,
) -> Result<Client, KubeClientError> {
    let layer = qps_layer(qps, burst);
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let builder = ClientBuilder::try_from(config).map_err(KubeClientError::Build)?;
    Ok(builder
        .with_layer(&layer)
        .with_layer(&layer_fn(move |inner| RestMetricsService {
            inner,
            host: host.clone(),
        }))
        .build())
}

/// client-go's REST client metrics, with component-base's names, labels
/// and buckets (`metrics/prometheus/restclient`): every request counted by
/// status code, method and host, its latency (to the response head; a
/// watch's stream is not timed) by verb and host.
struct RestMetrics {
    requests: Family<crate::metrics::Labels, Counter>,
    duration: Family<crate::metrics::Labels, Histogram>,
}

static REST_METRICS: LazyLock<RestMetrics> = LazyLock::new(|| RestMetrics {
    requests: crate::metrics::registered(
        "rest_client_requests",
        "Number of HTTP requests, partitioned by status code, method, and host",
        Family::default(),
    ),
    duration: crate::metrics::registered(
        "rest_client_request_duration_seconds",
        "Request latency in seconds. Broken down by verb, and host",
        Family::new_with_constructor(|| {
            Histogram::new([
                0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
            ])
        }),
    ),
});

/// Records [`RestMetrics`] for each request to the API server at `host`.
#[derive(Clone)]
struct RestMetricsService<S> {
    inner: S,
    host: String,
}

impl<S, B, R> Service<http::Request<B>> for RestMetricsService<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = self.host.clone();
        let started = std::time::Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let out = response.await;
            let code = match &out {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            let m = &*REST_METRICS;
            m.duration
                .get_or_create(&vec![("verb", method.clone()), ("host", host.clone())])
                .observe(started.elapsed().as_secs_f64());
            m.requests
                .get_or_create(&vec![("code", code), ("method", method), ("host", host)])
                .inc();
            out
        })
    }
}

/// A tower layer that waits for a token before each request: `qps` per
/// second on average, bursts up to `burst`.
fn qps_layer<S>(qps: f32, burst: u32) -> LayerFn<impl Fn(S) -> QpsService<S>> {
    let burst = NonZeroU32::new(burst.max(1)).unwrap_or(NonZeroU32::MIN);
    // governor expresses rates as a replenish interval per token.
    let per_token = std::time::Duration::from_secs_f64(1.0 / f64::from(qps.max(0.001)));
    let quota = Quota::with_period(per_token)
        .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
        .allow_burst(burst);
    let limiter = Arc::new(RateLimiter::direct(quota));
    layer_fn(move |inner| QpsService {
        inner,
        limiter: limiter.clone(),
        waiting: None,
        permitted: false,
    })
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

struct QpsService<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    waiting: Option<Wait>,
    permitted: bool,
}

impl<S, Req> Service<Req> for QpsService<S>
where
    S: Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.permitted {
            let limiter = self.limiter.clone();
            let wait = self
                .waiting
                .get_or_insert_with(|| Box::pin(async move { limiter.until_ready().await }));
            match wait.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.waiting = None;
                    self.permitted = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        // Each permit pays for exactly one request.
        self.permitted = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::{Duration, Instant};
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn burst_passes_then_requests_are_paced_at_qps() {
        let layer = qps_layer(50.0, 5);
        let mut svc = layer.layer(tower::service_fn(|_: ()| async {
            Ok::<_, std::convert::Infallible>(())
        }));
        // The burst is ready at once: no wait at all, whatever the clock.
        for i in 0..5 {
            let ready = svc.ready().now_or_never();
            assert!(
                ready.is_some(),
                "request {i} of the burst had to wait for a token"
            );
            svc.call(()).await.unwrap();
        }
        let start = Instant::now();
        for _ in 0..5 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        // Five more tokens at 50/s take ~100 ms to accrue; never less than 80.
        assert!(
            start.elapsed() >= Duration::from_millis(80),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn master_must_be_a_url() {
        assert!(parse_master("https://10.0.0.1:6443").is_ok());
        let err = parse_master("10.0.0.1").unwrap_err().to_string();
        assert!(err.contains("10.0.0.1") && err.contains("scheme"), "{err}");
    }
}
