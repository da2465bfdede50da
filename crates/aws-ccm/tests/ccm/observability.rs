//! Issue 20, observability: every metric the Grafana dashboard and the
//! PrometheusRule alerts query is one the real binary exports.
//!
//! `scripts/check-observability.py used-metrics` renders the kustomize
//! component (`manifests/monitoring`) and the chart with its monitoring
//! templates on, parses each PromQL expression with a real parser and prints
//! the metric names each one selects. This test runs the binary with the
//! controllers whose families the dashboard shows, scrapes `/metrics`, and
//! fails naming every queried metric that is neither exported nor on the
//! explicit kube-state-metrics list below.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use ccm_testkit::aws_proxy::{FaultKind, FaultProxy, FaultRule, ProxyConfig};
use serde_json::json;

use crate::routes::{Cloud, nodes_api};
use crate::support::*;

/// Series the alerts take from kube-state-metrics or Prometheus itself,
/// because the binary cannot tell them: Nodes still carrying the
/// uninitialized taint (a Node the CCM never saw has no series of its
/// own) and the leader-election Lease (a cluster with no leader has no
/// CCM to say so).
const NOT_FROM_THE_BINARY: &[&str] = &[
    "kube_node_spec_taint",
    "kube_lease_owner",
    "kube_lease_renew_time",
    "up",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The project's virtualenv Python (`scripts/install-tools.sh` installs
/// promql-parser there), or `$PYTHON`.
fn python() -> PathBuf {
    std::env::var_os("PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/bin/python"))
}

/// One PromQL expression of the dashboard or an alert, as the script prints it.
#[derive(serde::Deserialize)]
struct Query {
    source: String,
    expr: String,
    metrics: Vec<String>,
}

fn queries() -> anyhow::Result<Vec<Query>> {
    let root = repo_root();
    let out = std::process::Command::new(python())
        .arg(root.join("scripts/check-observability.py"))
        .arg("used-metrics")
        .current_dir(&root)
        .output()
        .with_context(|| {
            format!(
                "running {} scripts/check-observability.py; run scripts/install-tools.sh \
                 (make tools) or set PYTHON",
                python().display()
            )
        })?;
    anyhow::ensure!(
        out.status.success(),
        "scripts/check-observability.py used-metrics failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("parsing the script's JSON")
}

/// Every sample name the exposition can carry, from its `# TYPE` lines:
/// a counter's `_total` (and `_created`), a histogram's `_bucket`, `_sum`
/// and `_count`, a gauge's or an untyped family's own name.
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(family), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "summary" => &["", "_sum", "_count", "_created"],
            _ => &[""],
        };
        for suffix in suffixes {
            names.insert(format!("{family}{suffix}"));
        }
    }
    names
}

/// Queried metrics neither exported nor allowed, with where each is used.
fn unknown(queries: &[Query], exported: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for q in queries {
        for m in &q.metrics {
            if !exported.contains(m) && !NOT_FROM_THE_BINARY.contains(&m.as_str()) {
                missing
                    .entry(m.clone())
                    .or_default()
                    .push(format!("{}: {}", q.source, q.expr));
            }
        }
    }
    missing
}

#[test]
fn exported_names_map_families_to_their_samples() {
    let text = "# TYPE a counter\n# TYPE b histogram\n# TYPE c gauge\n# TYPE d unknown\n";
    let names = exported_names(text);
    for want in ["a_total", "b_bucket", "b_sum", "b_count", "c", "d"] {
        assert!(names.contains(want), "{want} in {names:?}");
    }
    assert!(!names.contains("a"), "a counter's family name is no sample");
    assert!(
        !names.contains("b"),
        "a histogram's family name is no sample"
    );
    let q = vec![Query {
        source: "rule X".into(),
        expr: "rate(b[5m]) + e".into(),
        metrics: vec!["b".into(), "e".into(), "up".into()],
    }];
    let missing = unknown(&q, &names);
    assert_eq!(
        missing.keys().collect::<Vec<_>>(),
        ["b", "e"],
        "{missing:?}"
    );
}

#[tokio::test]
async fn every_metric_the_dashboard_and_alerts_query_is_exported() -> anyhow::Result<()> {
    let queries = queries()?;
    assert!(
        queries.iter().any(|q| q.source.contains("dashboard"))
            && queries.iter().any(|q| q.source.contains("alert")),
        "the script found no dashboard or no alert expressions"
    );

    // Families without a sample are left out of the exposition, so the run
    // has to make every one the dashboard and alerts read: a node to
    // initialize (node controller), CIDRs to give until the range runs out
    // (node IPAM: two /24s in a /23 for three nodes), a cluster-tagged table
    // to route into (route controller), one throttled DescribeRouteTables
    // (throttling families) and a CreateRoute AWS rejects (route change
    // errors, calls failing for good).
    let env = Env::start().await?;
    let cloud = Cloud::new(&env).await?;
    cloud.route_table(true).await?;
    let ids = cloud.instances(1).await?;
    let api = nodes_api(&env).await?;
    for (name, provider_id) in [
        ("n0", Some(format!("aws:///us-east-1a/{}", ids[0]))),
        ("n1", None),
        ("n2", None),
    ] {
        let mut spec = json!({
            "taints": [{
                "key": "node.cloudprovider.kubernetes.io/uninitialized",
                "value": "true",
                "effect": "NoSchedule",
            }],
        });
        if let Some(id) = provider_id {
            spec["providerID"] = json!(id);
        }
        let node = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "spec": spec,
        }))?;
        crate::routes::create(&api, node).await?;
    }
    let throttle_once = FaultRule {
        max_count: Some(1),
        ..FaultRule::new(FaultKind::Throttle).for_action("DescribeRouteTables")
    };
    let table_full = FaultRule::new(FaultKind::Error {
        status: 400,
        code: "RouteLimitExceeded".into(),
        message: "The maximum number of routes has been reached.".into(),
    })
    .for_action("CreateRoute")
    .real_calls_only();
    let proxy = FaultProxy::start(
        &env.moto.endpoint(),
        ProxyConfig {
            faults: vec![throttle_once, table_full],
            ..Default::default()
        },
    )
    .await?;
    let ccm = env
        .start_ccm_via(
            &proxy.endpoint(),
            &[
                "--controllers=cloud-node,route,nodeipam,service",
                "--allocate-node-cidrs=true",
                "--cluster-cidr=10.244.0.0/23",
                "--route-reconciliation-period=2s",
            ],
        )
        .await?;
    let addr = ccm.https_addr().await?;

    // The families appear as the controllers first use them: poll until
    // every queried one is there, then report the ones that never came.
    let last = std::sync::Mutex::new(BTreeMap::new());
    let done = eventually(
        "every queried metric on /metrics",
        Duration::from_secs(60),
        || async {
            let (status, body) = https_get(&addr, "/metrics").await.ok()?;
            if status != 200 {
                return None;
            }
            let missing = unknown(&queries, &exported_names(&body));
            let ok = missing.is_empty();
            *last.lock().unwrap_or_else(|p| p.into_inner()) = missing;
            ok.then_some(())
        },
    )
    .await;
    if done.is_err() {
        let mut report = String::new();
        let last = last.into_inner().unwrap_or_else(|p| p.into_inner());
        for (metric, uses) in &last {
            report.push_str(&format!("\n{metric} is not exported, used by:"));
            for u in uses {
                report.push_str(&format!("\n    {u}"));
            }
        }
        anyhow::bail!(
            "the dashboard or alerts query metrics the binary does not export \
             (fix the query, or add a kube-state-metrics name to NOT_FROM_THE_BINARY \
             only if it truly comes from there):{report}\nCCM logs:\n{}",
            ccm.logs()
        );
    }
    // The families every Go component serves, which Go CCM dashboards query.
    let families = [
        "rest_client_request_duration_seconds_bucket{le=\"0.005\",verb=\"GET\",host=\"127.0.0.1:",
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_start_time_seconds ",
        "kubernetes_build_info{major=\"0\",minor=\"1\"",
        "workqueue_adds_total{name=\"service\"} ",
        "workqueue_depth{name=\"service\"} ",
        "workqueue_work_duration_seconds_count{name=\"service\"} ",
        "workqueue_longest_running_processor_seconds{name=\"service\"} ",
        "workqueue_adds_total{name=\"Nodes\"} ",
        "workqueue_work_duration_seconds_count{name=\"Nodes\"} ",
        "workqueue_adds_total{name=\"Routes\"} ",
        "workqueue_work_duration_seconds_count{name=\"Routes\"} ",
    ];
    let body = metrics_with(&addr, &families, Duration::from_secs(30)).await?;
    assert!(
        body.lines().any(|l| l.starts_with(
            "rest_client_requests_total{code=\"200\",method=\"GET\",host=\"127.0.0.1:"
        )),
        "no counted GET on /metrics:\n{body}"
    );
    // The route controller's queue counts its reconciles (one at start).
    eventually(
        "a route reconcile in the Routes queue",
        Duration::from_secs(30),
        || async {
            let (_, body) = https_get(&addr, "/metrics").await.ok()?;
            let count = body.lines().find_map(|l| {
                l.strip_prefix("workqueue_work_duration_seconds_count{name=\"Routes\"} ")
            })?;
            (count.trim().parse::<f64>().ok()? >= 1.0).then_some(())
        },
    )
    .await?;
    env.finish().await
}
