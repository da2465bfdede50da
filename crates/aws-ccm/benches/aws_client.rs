//! Benchmark of the AWS client layer against moto behind the fault proxy.
//!
//! Prints figures; asserts nothing about time. Run with
//! `cargo bench --bench aws_client` (needs moto: `scripts/install-moto.sh`).
//!
//! 1. Coalescing: calls per lookup for a burst of 1,000 concurrent
//!    single-instance lookups.
//! 2. Limiter waits: p50/p90/p99 of the time callers wait for a token when
//!    600 EC2 reads arrive at once at the default budget.
//! 3. Throttling: a 2,000-call CCM-like mix at the default client budget
//!    (half of AWS's) against a proxy enforcing 100 % and 50 % of AWS's
//!    buckets, and for contrast a client that assumes the whole budget.

#[path = "../tests/aws_client/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_ccm::aws::client::throttle::{AimdConfig, CategoryLimiter};
use aws_ccm::aws::{Category, ClientOptions};
use ccm_testkit::aws_proxy::ProxyConfig;
use support::{World, mixed_workload, percentile};

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        coalescing().await;
        limiter_waits().await;
        throttling().await;
    });
}

async fn coalescing() {
    let world = World::start(ProxyConfig::default()).await;
    let seeded = world.seed_instances(1000).await;
    let aws = world.client(ClientOptions::default()).await;
    let start = Instant::now();
    let results = futures::future::join_all(seeded.iter().map(|s| aws.instance_by_id(&s.id))).await;
    let elapsed = start.elapsed();
    let failures = results.iter().filter(|r| r.is_err()).count();
    let calls = world.proxy.calls().get("ec2", "DescribeInstances").received;
    println!("== coalescing: 1,000 concurrent instance_by_id lookups");
    println!(
        "   DescribeInstances calls: {calls}  ({:.4} calls per lookup)",
        calls as f64 / 1000.0
    );
    println!("   failed lookups: {failures}   wall time: {elapsed:.2?}");
    println!("   (without coalescing: 1,000 calls, 50 s of the default EC2 read budget)");
}

async fn limiter_waits() {
    println!(
        "== limiter waits: simultaneous EC2 reads at the default budget (burst 50, 10/s), limiter alone"
    );
    for burst in [50, 100, 600] {
        let limiter = Arc::new(CategoryLimiter::new(
            Category::Ec2NonMutating,
            0.5,
            AimdConfig::default(),
        ));
        let mut waits: Vec<Duration> = futures::future::join_all((0..burst).map(|_| {
            let limiter = limiter.clone();
            async move { limiter.acquire(None).await.unwrap_or_default() }
        }))
        .await;
        waits.sort();
        println!(
            "   {burst:>4} at once: wait p50 {:.2?}  p90 {:.2?}  p99 {:.2?}  max {:.2?}",
            percentile(&waits, 50),
            percentile(&waits, 90),
            percentile(&waits, 99),
            waits.last().copied().unwrap_or_default()
        );
    }
}

async fn throttling() {
    println!(
        "== throttling: 2,000-call CCM mix (80 % lookups by ID, 10 % by DNS, 10 % other reads/tags/ELB)"
    );
    for (proxy_fraction, client_fraction) in [(1.0, 0.5), (0.5, 0.5), (0.5, 1.0)] {
        let world = World::start(ProxyConfig {
            budget_fraction: Some(proxy_fraction),
            ..ProxyConfig::default()
        })
        .await;
        let seeded = world.seed_instances(400).await;
        let aws = world
            .client(ClientOptions {
                budget_fraction: client_fraction,
                ..ClientOptions::default()
            })
            .await;
        let report = mixed_workload(&aws, &seeded, 2000).await;
        let calls = world.proxy.calls();
        println!(
            "   proxy at {:>3.0} % of AWS, client at {:>3.0} %: sent {:>4}, throttled at proxy {:>3}, \
             errors to callers {} ({} throttling), wall {:.1?}, call latency p50 {:.2?} p99 {:.2?} \
             (lookups p50 {:.2?} p99 {:.2?}), EC2 read rate at the end {:.1}/s",
            proxy_fraction * 100.0,
            client_fraction * 100.0,
            calls.total_received(),
            calls.throttled_total(),
            report.errors.len(),
            report.throttling_errors,
            report.elapsed,
            percentile(&report.latencies, 50),
            percentile(&report.latencies, 99),
            percentile(&report.lookup_latencies, 50),
            percentile(&report.lookup_latencies, 99),
            aws.current_rate(Category::Ec2NonMutating),
        );
        let missing = world.unmapped_actions();
        if !missing.is_empty() {
            println!("   WARNING: actions missing from the operation table: {missing:?}");
        }
    }
}
