//! k8s.io/cloud-provider's service controller metrics, with upstream's
//! names (`controllers/service/metrics.go` at v0.36.0; no labels there
//! either), so dashboards built for the Go CCM keep working.
//!
//! One difference in what they measure: upstream updates the hosts of every
//! load balancer in one node-sync pass and times the pass; here each
//! Service is synced on its own, so `nodesync_latency_seconds` times one
//! Service's host update, as `update_loadbalancer_host_latency_seconds`.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Metric;

struct ServiceMetrics {
    syncs: Counter,
    node_sync_errors: Counter,
    node_sync_latency: Histogram,
    host_update_latency: Histogram,
}

/// Upstream's buckets: 1 s to 16,384 s.
fn buckets() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

static METRICS: LazyLock<ServiceMetrics> = LazyLock::new(|| ServiceMetrics {
    syncs: registered(
        "service_controller_loadbalancer_sync",
        "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
        Counter::default(),
    ),
    node_sync_errors: registered(
        "service_controller_nodesync_error",
        "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
        Counter::default(),
    ),
    node_sync_latency: registered(
        "service_controller_nodesync_latency_seconds",
        "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
        buckets(),
    ),
    host_update_latency: registered(
        "service_controller_update_loadbalancer_host_latency_seconds",
        "A metric measuring the latency for updating each load balancer hosts.",
        buckets(),
    ),
});

/// `metric`, registered under `name`.
fn registered<M: Metric + Clone>(name: &str, help: &str, metric: M) -> M {
    crate::metrics::register(name, help, metric.clone());
    metric
}

/// One load balancer ensure: `service_changed` false means a node (host)
/// update, as upstream's node sync.
pub(crate) fn ensured(service_changed: bool, elapsed: Duration, ok: bool) {
    let m = &*METRICS;
    m.syncs.inc();
    if !service_changed {
        m.host_update_latency.observe(elapsed.as_secs_f64());
        m.node_sync_latency.observe(elapsed.as_secs_f64());
        if !ok {
            m.node_sync_errors.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names_are_exposed() {
        ensured(true, Duration::from_millis(10), true);
        ensured(false, Duration::from_secs(3), false);
        let text = crate::metrics::encode();
        for needle in [
            "service_controller_loadbalancer_sync_total ",
            "service_controller_nodesync_error_total ",
            "service_controller_nodesync_latency_seconds_bucket{le=\"4.0\"}",
            "service_controller_update_loadbalancer_host_latency_seconds_count ",
        ] {
            assert!(text.contains(needle), "{needle} in {text}");
        }
    }
}
