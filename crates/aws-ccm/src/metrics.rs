//! One process-wide Prometheus registry, served as text at `/metrics`.
//!
//! Every module registers its metric families once (typically from a `LazyLock`)
//! through [`register`]; the HTTP server renders them with [`encode`].

use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::text;
use prometheus_client::registry::{Metric, Registry};

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| Mutex::new(Registry::default()));

mod process;

/// A metric's label pairs, exposed in this order.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// Registers the `process_*` and `kubernetes_build_info` collector, once.
pub(crate) fn register_process_collector() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        register_collector(Box::new(process::ProcessCollector));
    });
}

/// Registers a collector: families computed at each scrape.
pub(crate) fn register_collector(collector: Box<dyn prometheus_client::collector::Collector>) {
    let mut registry = REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    registry.register_collector(collector);
}

/// Registers a metric family under its full name (no prefix is added).
pub(crate) fn register(name: &str, help: &str, metric: impl Metric) {
    let mut registry = REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    registry.register(name, help, metric);
}

/// [`register`]s `metric` and returns it: a family is a handle, and the
/// one returned records into the one registered.
pub fn registered<M: Metric + Clone>(name: &str, help: &str, metric: M) -> M {
    register(name, help, metric.clone());
    metric
}

/// Renders every registered family in the Prometheus text exposition format.
pub fn encode() -> String {
    let registry = REGISTRY
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = text::encode(&mut out, &registry);
    out
}
