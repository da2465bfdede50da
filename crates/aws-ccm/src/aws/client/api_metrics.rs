//! Metrics of the AWS client layer, registered once in the global registry.
//!
//! The first three families keep the Go aws-cloud-controller-manager's names
//! and labels, so dashboards and alerts built for it keep working after the
//! swap; the `aws_ccm_*` families describe what the Go CCM cannot (limiter
//! waits, adaptive rates, batching).

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::operations::{Category, Operation};
use crate::metrics::Labels;

/// A monotonically increasing count exposed under its exact name.
///
/// prometheus-client appends `_total` to every `Counter`, but the Go CCM
/// exposes `cloudprovider_aws_api_request_errors` without it; alerts written
/// against that name must keep matching, so this one is exposed as an
/// `unknown`-typed sample with the plain name.
#[derive(Clone, Debug, Default)]
struct PlainCounter(Counter);

impl TypedMetric for PlainCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for PlainCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

struct ApiMetrics {
    request_duration: HistogramFamily,
    request_errors: Family<Labels, PlainCounter>,
    throttled: Family<Labels, Counter>,
    calls: Family<Labels, Counter>,
    batch_size: HistogramFamily,
    token_wait: HistogramFamily,
    rate: Family<Labels, Gauge<f64, AtomicU64>>,
    response_status: Family<Labels, Counter>,
}

static METRICS: LazyLock<ApiMetrics> = LazyLock::new(|| ApiMetrics {
    response_status: crate::metrics::registered(
        "cloudprovider_aws_api_response_status",
        "AWS API response status code counts (answers with HTTP status 400 or more; upstream's name)",
        Family::default(),
    ),
    request_duration: crate::metrics::registered(
        "cloudprovider_aws_api_request_duration_seconds",
        "Latency of AWS API requests that got an answer, per request",
        // 5 ms .. ~41 s: AWS answers in tens of milliseconds; the tail covers the
        // 30 s per-call timeout.
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.005, 2.0, 14))),
    ),
    request_errors: crate::metrics::registered(
        "cloudprovider_aws_api_request_errors",
        "AWS API calls that returned an error to their caller (after retries)",
        Family::default(),
    ),
    throttled: crate::metrics::registered(
        "cloudprovider_aws_api_throttled_requests",
        "AWS API requests answered with a throttling error",
        Family::default(),
    ),
    calls: crate::metrics::registered(
        "aws_ccm_api_calls",
        "AWS API requests sent, by operation and outcome (success, throttled, transient, not_found, fatal)",
        Family::default(),
    ),
    batch_size: crate::metrics::registered(
        "aws_ccm_api_coalesced_batch_size",
        "Keys served by one coalesced AWS call (instance IDs, private DNS names)",
        // 1 .. 1024 keys per coalesced call.
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(1.0, 2.0, 11))),
    ),
    token_wait: crate::metrics::registered(
        "aws_ccm_api_token_wait_seconds",
        "Time callers waited for a rate-limit token, per AWS throttle category",
        // 1 ms .. ~65 s: most acquisitions do not wait at all; under a backlog of
        // thousands of callers the slow buckets (0.2/s) make minute-long waits.
        Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 17))),
    ),
    rate: crate::metrics::registered(
        "aws_ccm_api_rate_limit",
        "Current client-side request rate limit per AWS throttle category, in requests per second \
         (drops on throttling, recovers over time)",
        Family::default(),
    ),
});

/// One answered request (success or an AWS error): its latency.
pub(crate) fn observe_request_duration(op: Operation, elapsed: Duration) {
    METRICS
        .request_duration
        .get_or_create(&vec![("request", op.metric_request_name())])
        .observe(elapsed.as_secs_f64());
}

/// One request sent, with its outcome label (`success` or an error class).
pub(crate) fn record_attempt(op: Operation, outcome: &str) {
    METRICS
        .calls
        .get_or_create(&vec![
            ("operation", op.qualified_name()),
            ("outcome", outcome.to_string()),
        ])
        .inc();
}

/// One answer with HTTP status 400 or more, as the Go CCM's deserialize
/// middleware counts it (DryRun answers included).
pub(crate) fn record_response_status(op: Operation, status: u16) {
    if status < 400 {
        return;
    }
    let service = match op.service() {
        super::operations::Service::Ec2 => "EC2",
        super::operations::Service::Elb => "Elastic Load Balancing",
        super::operations::Service::Elbv2 => "Elastic Load Balancing v2",
        super::operations::Service::Sts => "STS",
        super::operations::Service::Iam => "IAM",
    };
    // The Go CCM's labels: the Go SDK's service ID, the operation and the
    // HTTP status.
    METRICS
        .response_status
        .get_or_create(&vec![
            ("service", service.to_string()),
            ("operation", op.action().to_string()),
            ("status_code", status.to_string()),
        ])
        .inc();
}

/// One request answered with a throttling error.
pub(crate) fn record_throttled(op: Operation) {
    METRICS
        .throttled
        .get_or_create(&vec![("operation_name", op.action().to_string())])
        .inc();
}

/// One call that returned an error to its caller.
pub(crate) fn record_call_error(op: Operation) {
    METRICS
        .request_errors
        .get_or_create(&vec![("request", op.metric_request_name())])
        .0
        .inc();
}

pub(crate) fn observe_batch_size(kind: &str, keys: usize) {
    METRICS
        .batch_size
        .get_or_create(&vec![("kind", kind.to_string())])
        .observe(keys as f64);
}

pub(crate) fn observe_token_wait(category: Category, waited: Duration) {
    METRICS
        .token_wait
        .get_or_create(&vec![("category", category.as_str().to_string())])
        .observe(waited.as_secs_f64());
}

pub(crate) fn set_rate(category: Category, per_second: f64) {
    METRICS
        .rate
        .get_or_create(&vec![("category", category.as_str().to_string())])
        .set(per_second);
}

/// Forces registration, so the families appear in `/metrics` (empty) before
/// the first call.
pub(crate) fn init() {
    LazyLock::force(&METRICS);
}
