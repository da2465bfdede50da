//! Scale benchmark: the release CCM binary against the Kubernetes API test
//! server and an AWS endpoint behind the fault proxy, which enforces AWS's
//! documented buckets at full size (`budget_fraction: Some(1.0)`) and adds a
//! latency to every call. Prints one table: scenario, figure, lower bound,
//! ratio, and whether a figure with a bound met it; the run fails after the
//! table when one did not, or a scenario failed.
//!
//! moto cannot hold thousands of instances (the `moto` scenario prints how
//! long it takes), so `join`, `steady` and `churn` keep their instances in the
//! in-repo simulator (`ccm_testkit::instance_sim`), which answers
//! DescribeInstances behind the same proxy; moto keeps the VPC, subnets,
//! security groups and load balancers. `routes` runs on moto alone (its
//! CreateRoute checks the instance).
//!
//! `make bench` (or `cargo bench --bench scale`). Pick and size with
//! environment variables:
//!
//! - `SCALE_SCENARIOS`: comma list of `moto,join,steady,failover,churn,routes,rules`
//!   (default: all). `steady` also prints the memory figures. `failover`
//!   needs `steady`'s world (seeding it twice would take minutes): it runs
//!   at the end of `steady`, and only when `steady` is listed too.
//! - `SCALE_NODES`: overrides every node count (e.g. `200` to iterate).
//! - `SCALE_SERVICES`: LoadBalancer Services in `steady` (default 1,000).
//! - `SCALE_CHURN_SERVICES`: NLB Services in `churn` (default 500).
//! - `SCALE_RULES_SERVICES`: comma list of NLB Service counts in `rules`
//!   (default `10,100,500`).
//! - `SCALE_RULES_MODES`: comma list of node-ingress modes in `rules`
//!   (`Cidr,LoadBalancerGroup,SharedBackendGroup`, the default: all).
//! - `SCALE_LATENCY_MS`: proxy latency per AWS call (default 50).
//! - `SCALE_STEADY_SECS`: real seconds of `steady` after adoption (default
//!   180 = 30 min at the default compression of 10).
//! - `SCALE_CCM_BINARY`: run another build of the CCM (before/after).
//! - `SCALE_NLB=0`: every `steady` Service is a Classic ELB (default: half
//!   are NLBs).
//!
//! - `SCALE_JSON`: where the machine-readable figures go (default
//!   `target/bench/scale.json` in the workspace).
//! - `SCALE_JOIN_TOPOLOGY`: comma list of `answered`, `5xx`, `throttled`,
//!   `hang`: after each `join`, the same join again as its own scenario
//!   (`join N, topology 5xx`). `answered`: every instance a `p4d.24xlarge`
//!   with three network-node layers, and a row counts the
//!   `DescribeInstanceTopology` calls until every node is labelled (bound
//!   one per 100 nodes, and one more). The others: `DescribeInstanceTopology`
//!   failing that way at the proxy (500 `InternalError`; throttled; held past
//!   the CCM's call timeout): the taints must come off in the same time (the
//!   question holds none), and a row counts the faulted questions (the fault
//!   must fire).
//!
//! Each scenario stops itself at a deadline and prints what it reached.
//!
//! In `steady`, 1 s after the measured CCM starts, one more CLB and one
//! more NLB Service are created and timed until their ingress has a
//! hostname. Their AWS writes are told apart by the proxy's recorded
//! parameters (their load balancer's name, ARN, security group, target
//! group or listener, read from moto afterwards) and counted in their own
//! row, so "mutating AWS calls while adopting" still counts only what
//! adopting the existing load balancers changed.
//!
//! `failover`: after `steady`'s window, a second CCM with the same arguments
//! (its own identity: host name and a random UUID) starts as a standby; once
//! its `/metrics` shows it a candidate (`leader_election_master_status` 0),
//! the leader is SIGKILLed (no Lease release). Timed from the kill: until
//! the Lease names another holder (and the standby's `/metrics` says it
//! leads), and until it has synced every Service once; counted: its
//! mutating calls (must be none), describes by action, throttled responses.
//!
//! The measured CCM runs with leader election on (as deployed: its Lease
//! renewals share the apiserver budget). So does the seeding CCM, setup
//! only, which is then stopped as a rolling update stops it (SIGTERM): it
//! releases the Lease, so the measured one takes it at once, straight from
//! the leader that wrote the target record (the record is trusted). Every
//! row names the apiserver QPS (`--kube-api-qps`) the CCM it measures ran with.
//!
//! Besides the table, the run writes its rows as JSON: a list of
//! `{scenario, figure, value, unit, bound, qps, text, bound_text, ok}` (`value`
//! and `bound` are numbers or null, the texts are the printed cells, `ok`
//! whether the value met its bound, null for a figure without one), from which
//! `scripts/bench-table.py` regenerates the figures table of `docs/scale.md`.

#[path = "../tests/common/sg_rules.rs"]
mod sg_rules;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use aws_ccm::controllers::service::current_hostname;
use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
use ccm_testkit::apiserver::TestApiServer;
use ccm_testkit::aws_proxy::{
    CallCounts, FaultKind, FaultProxy, FaultRule, InstanceTopology, ProxyConfig,
};
use ccm_testkit::instance_sim::{InstanceSim, LaunchTemplate};
use ccm_testkit::moto::Moto;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::{Child, Command};

const BINARY: &str = env!("CARGO_BIN_EXE_aws-cloud-controller-manager");
const CLUSTER_ID: &str = "scale";
const REGION: &str = "us-east-1";
const AZ: &str = "us-east-1a";
use ccm_testkit::moto::AMI;
const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const LAYER_1: &str = "topology.k8s.aws/network-node-layer-1";
/// Client-side apiserver budget the CCM is given in the join burst.
const KUBE_API_QPS: u32 = 200;
/// How far above a floor a time may be and still count as met: the
/// issue's 1.1 × AWS's registration floor for `churn`, and the same for the
/// join burst against its apiserver write floor.
const FLOOR_SLACK: f64 = 1.1;
/// The CCM's CPU time a joining node may cost (the figure, at
/// 1,000, 5,000 and 10,000 nodes).
const JOIN_CPU_PER_NODE: Duration = Duration::from_millis(2);
/// Periods are divided by this in `steady` to compress time.
const COMPRESSION: u32 = 10;
/// Nodes per node group in `steady`: each group has its own security group
/// (AWS allows 60 inbound rules per group, and every load balancer adds one
/// or two to each group it reaches) and each Service selects one group by a
/// `group` label, as Services pinned to an instance group do.
const NODES_PER_GROUP: usize = 50;
/// The same in `churn`: 500 NLBs over 40 groups of 25 is 12 or 13 per group.
const CHURN_GROUP: usize = 25;

fn main() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let cfg = Config::from_env();
    let mut table = Table::default();
    runtime.block_on(async {
        for scenario in cfg.scenarios.clone() {
            let started = Instant::now();
            table.qps = None;
            eprintln!("== {scenario} ...");
            let result = match scenario.as_str() {
                "moto" => moto_figures(&cfg, &mut table).await,
                "join" => {
                    let mut r = Ok(());
                    for n in cfg.sizes(&[1000, 5000, 10000]) {
                        r = r.and(join_burst(&cfg, n, None, &mut table).await);
                        for failure in &cfg.join_topology {
                            r = match topology_fault(failure) {
                                Ok(fault) => {
                                    r.and(join_burst(&cfg, n, Some(fault), &mut table).await)
                                }
                                Err(e) => Err(e),
                            };
                        }
                    }
                    r
                }
                "steady" => steady_state(&cfg, &mut table).await,
                // Runs at the end of `steady`, in its world.
                "failover" if cfg.scenarios.iter().any(|s| s == "steady") => Ok(()),
                "failover" => Err(anyhow::anyhow!(
                    "failover runs inside steady (it needs steady's adopted world): \
                     set SCALE_SCENARIOS=steady,failover"
                )),
                "churn" => churn(&cfg, &mut table).await,
                "routes" => routes(&cfg, cfg.sizes(&[1000])[0], &mut table).await,
                "rules" => rules(&cfg, &mut table).await,
                other => Err(anyhow::anyhow!("unknown scenario {other:?}")),
            };
            if let Err(e) = result {
                table.judged(&scenario, "FAILED", &format!("{e:#}"), "", None, false);
            }
            eprintln!("== {scenario} took {:.0?}", started.elapsed());
        }
    });
    table.qps = None;
    table.binary_size();
    table.print();
    let json = cfg.json.clone();
    table
        .write_json(&json)
        .with_context(|| format!("writing {}", json.display()))?;
    eprintln!("figures written to {}", json.display());
    // After the whole table: a figure past its bound, or a scenario that
    // failed, fails the run.
    anyhow::ensure!(
        table.all_ok(),
        "a figure missed its bound or a scenario failed (\"NO\" in the ok column)"
    );
    Ok(())
}

struct Config {
    scenarios: Vec<String>,
    nodes: Option<usize>,
    services: usize,
    latency: Duration,
    steady: Duration,
    nlb: bool,
    churn_services: usize,
    rules_services: Vec<usize>,
    /// `SCALE_RULES_MODES`: the node-ingress modes `rules` runs (empty: all).
    rules_modes: Vec<String>,
    json: PathBuf,
    /// `SCALE_JOIN_TOPOLOGY`: the failures a join is repeated with.
    join_topology: Vec<String>,
}

impl Config {
    fn from_env() -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let num = |k: &str| var(k).and_then(|v| v.parse::<u64>().ok());
        Config {
            scenarios: var("SCALE_SCENARIOS")
                .unwrap_or_else(|| "moto,join,steady,failover,churn,routes,rules".into())
                .split(',')
                .map(|s| s.trim().to_string())
                .collect(),
            nodes: num("SCALE_NODES").map(|n| n as usize),
            services: num("SCALE_SERVICES").unwrap_or(1000) as usize,
            latency: Duration::from_millis(num("SCALE_LATENCY_MS").unwrap_or(50)),
            steady: Duration::from_secs(num("SCALE_STEADY_SECS").unwrap_or(180)),
            nlb: var("SCALE_NLB").is_none_or(|v| v != "0"),
            churn_services: num("SCALE_CHURN_SERVICES").unwrap_or(500) as usize,
            rules_services: var("SCALE_RULES_SERVICES")
                .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
                .unwrap_or_else(|| vec![10, 100, 500]),
            rules_modes: var("SCALE_RULES_MODES")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default(),
            join_topology: var("SCALE_JOIN_TOPOLOGY")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
                .unwrap_or_default(),
            json: var("SCALE_JSON").map(PathBuf::from).unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/bench/scale.json")
            }),
        }
    }

    fn sizes(&self, defaults: &[usize]) -> Vec<usize> {
        match self.nodes {
            Some(n) => vec![n],
            None => defaults.to_vec(),
        }
    }

    fn proxy(&self) -> ProxyConfig {
        ProxyConfig {
            budget_fraction: Some(1.0),
            latency: self.latency,
            ..ProxyConfig::default()
        }
    }
}

#[derive(Default)]
struct Table {
    /// scenario, figure, value, bound, ratio, qps, ok.
    rows: Vec<[String; 7]>,
    /// `--kube-api-qps` of the CCM the next rows measure; `None` when no
    /// CCM is involved.
    qps: Option<f64>,
}

/// The units a figure's cell may carry after its number.
const UNITS: [&str; 4] = ["s", "ms", "MB", "min"];

/// A cell's leading number and its unit: `"12.3 s"` is (12.3, "s"),
/// `"5 (1 per 1,000 nodes)"` is (5, ""), a cell without a number is `None`.
fn measure(cell: &str) -> Option<(f64, String)> {
    let mut words = cell.split_whitespace();
    let number: f64 = words.next()?.replace(',', "").parse().ok()?;
    let unit = words
        .next()
        .filter(|w| UNITS.contains(w))
        .unwrap_or_default();
    Some((number, unit.to_string()))
}

/// The `--kube-api-qps` in `args`, else the CCM's default (20, as upstream).
fn qps_of(args: &[String]) -> f64 {
    args.iter()
        .find_map(|a| a.strip_prefix("--kube-api-qps=")?.parse().ok())
        .unwrap_or(20.0)
}

impl Table {
    /// A figure without a bound to judge it by.
    fn row(&mut self, scenario: &str, figure: &str, value: &str, bound: &str, ratio: Option<f64>) {
        self.push(scenario, figure, value, bound, ratio, None);
    }

    /// A figure with a bound, and whether the value keeps to it: computed
    /// from the value at each call site, never assumed.
    fn judged(
        &mut self,
        scenario: &str,
        figure: &str,
        value: &str,
        bound: &str,
        ratio: Option<f64>,
        ok: bool,
    ) {
        self.push(scenario, figure, value, bound, ratio, Some(ok));
    }

    fn push(
        &mut self,
        scenario: &str,
        figure: &str,
        value: &str,
        bound: &str,
        ratio: Option<f64>,
        ok: Option<bool>,
    ) {
        let ratio = ratio.map(|r| format!("{r:.2}")).unwrap_or_default();
        let qps = self.qps.map(|q| format!("{q}")).unwrap_or_default();
        let ok = match ok {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        eprintln!("   {scenario} | {figure} | {value} | {bound} | {ratio} | {qps} | {ok}");
        self.rows.push([
            scenario.into(),
            figure.into(),
            value.into(),
            bound.into(),
            ratio,
            qps,
            ok.into(),
        ]);
    }

    /// Whether every judged figure kept to its bound.
    fn all_ok(&self) -> bool {
        self.rows.iter().all(|r| r[6] != "NO")
    }

    /// The rows as JSON (see the header), to `path`.
    fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|[scenario, figure, value, bound, _, qps, ok]| {
                let measured = measure(value);
                json!({
                    "scenario": scenario,
                    "figure": figure,
                    "value": measured.as_ref().map(|m| m.0),
                    "unit": measured.map(|m| m.1).unwrap_or_default(),
                    "bound": measure(bound).map(|m| m.0),
                    "qps": qps.parse::<f64>().ok(),
                    "text": value,
                    "bound_text": bound,
                    "ok": (!ok.is_empty()).then_some(ok == "yes"),
                })
            })
            .collect();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, serde_json::to_string_pretty(&rows)? + "\n")?;
        Ok(())
    }

    fn binary_size(&mut self) {
        let size = std::fs::metadata(BINARY).map(|m| m.len()).unwrap_or(0);
        self.row(
            "memory",
            "release binary size",
            &format!("{:.1} MB", size as f64 / 1e6),
            "",
            None,
        );
    }

    fn print(&self) {
        let header = [
            "scenario",
            "figure",
            "value",
            "lower bound / goal",
            "ratio",
            "apiserver QPS",
            "ok",
        ];
        let mut widths = header.map(str::len);
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |cells: [&str; 7]| {
            let mut s = String::from("|");
            for (w, c) in widths.iter().zip(cells) {
                s.push_str(&format!(" {c:<w$} |"));
            }
            s
        };
        println!("{}", line(header));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        println!(
            "{}",
            line([
                &rule[0], &rule[1], &rule[2], &rule[3], &rule[4], &rule[5], &rule[6]
            ])
        );
        for r in &self.rows {
            println!(
                "{}",
                line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]])
            );
        }
    }
}

/// The servers of one scenario.
struct World {
    api: TestApiServer,
    moto: Moto,
    proxy: FaultProxy,
    ec2: aws_sdk_ec2::Client,
    subnet: String,
    vpc: String,
    node_group: String,
    latency: Duration,
    /// Instances of the scenarios that moto cannot hold (see `sim_launch`).
    sim: Arc<InstanceSim>,
    dir: tempfile::TempDir,
}

#[derive(Clone)]
struct Instance {
    id: String,
    dns: String,
}

impl World {
    async fn start(cfg: &Config) -> anyhow::Result<World> {
        let (api, moto) = tokio::try_join!(TestApiServer::start(), Moto::start())?;
        let proxy = FaultProxy::start(&moto.endpoint(), cfg.proxy()).await?;
        let ec2 = aws_sdk_ec2::Client::new(&moto.sdk_config().await);
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.0.0.0/16")
            .send()
            .await?
            .vpc
            .and_then(|v| v.vpc_id)
            .context("no VPC id")?;
        let subnet = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block("10.0.0.0/17")
            .availability_zone(AZ)
            .send()
            .await?
            .subnet
            .and_then(|s| s.subnet_id)
            .context("no subnet id")?;
        ec2.create_tags()
            .resources(&subnet)
            .tags(cluster_tag())
            .tags(
                Tag::builder()
                    .key("kubernetes.io/role/elb")
                    .value("1")
                    .build(),
            )
            .send()
            .await?;
        // Internet-facing load balancers need a subnet routed to a gateway,
        // and nodes a cluster security group.
        let igw = ec2
            .create_internet_gateway()
            .send()
            .await?
            .internet_gateway
            .and_then(|g| g.internet_gateway_id)
            .context("no internet gateway id")?;
        ec2.attach_internet_gateway()
            .vpc_id(&vpc)
            .internet_gateway_id(&igw)
            .send()
            .await?;
        let main_table = ec2
            .describe_route_tables()
            .filters(
                aws_sdk_ec2::types::Filter::builder()
                    .name("vpc-id")
                    .values(&vpc)
                    .build(),
            )
            .send()
            .await?
            .route_tables()
            .first()
            .and_then(|t| t.route_table_id().map(str::to_string))
            .context("no main route table")?;
        ec2.create_route()
            .route_table_id(&main_table)
            .destination_cidr_block("0.0.0.0/0")
            .gateway_id(&igw)
            .send()
            .await?;
        let node_group = security_group(&ec2, &vpc, "nodes").await?;
        let dir = tempfile::tempdir()?;
        api.write_kubeconfig(&dir.path().join("kubeconfig"))?;
        std::fs::write(
            dir.path().join("cloud.conf"),
            format!("[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n"),
        )?;
        Ok(World {
            api,
            moto,
            proxy,
            ec2,
            subnet,
            vpc,
            node_group,
            latency: cfg.latency,
            sim: InstanceSim::new(),
            dir,
        })
    }

    /// Launches `count` instances in the in-repo simulator, which from now
    /// on answers every DescribeInstances the proxy sees (moto keeps the
    /// rest): `per_group` instances share one cluster-tagged node security
    /// group, made in moto, as an instance group's nodes do (one group per
    /// `per_group` nodes keeps each under AWS's 60-rule quota). Returns each
    /// instance with its group's index.
    async fn sim_launch(
        &self,
        count: usize,
        per_group: usize,
    ) -> anyhow::Result<Vec<(Instance, usize)>> {
        self.sim_launch_typed(count, per_group, "m5.large").await
    }

    /// [`World::sim_launch`] with instances of another type.
    async fn sim_launch_typed(
        &self,
        count: usize,
        per_group: usize,
        instance_type: &str,
    ) -> anyhow::Result<Vec<(Instance, usize)>> {
        self.proxy.serve_locally(Some(self.sim.clone()));
        let groups = count.div_ceil(per_group).max(1);
        let mut group_ids = Vec::with_capacity(groups);
        for g in 0..groups {
            group_ids.push(self.security_group(&format!("nodes-g{g}")).await?);
        }
        let mut out = Vec::with_capacity(count);
        for (g, group_id) in group_ids.iter().enumerate() {
            let n = per_group.min(count - out.len());
            let template = LaunchTemplate {
                instance_type: instance_type.into(),
                ..self.sim_template(group_id, &format!("nodes-g{g}"))
            };
            for i in self.sim.launch(&template, n) {
                out.push((
                    Instance {
                        id: i.id,
                        dns: i.private_dns_name,
                    },
                    g,
                ));
            }
        }
        Ok(out)
    }

    fn sim_template(&self, group_id: &str, group_name: &str) -> LaunchTemplate {
        LaunchTemplate {
            instance_type: "m5.large".into(),
            availability_zone: AZ.into(),
            subnet_id: self.subnet.clone(),
            vpc_id: self.vpc.clone(),
            security_groups: vec![(group_id.to_string(), group_name.to_string())],
            tags: kops_instance_tags(group_id),
        }
    }

    async fn security_group(&self, name: &str) -> anyhow::Result<String> {
        security_group(&self.ec2, &self.vpc, name).await
    }

    /// Launches `count` cluster instances straight at moto (not counted).
    async fn launch(&self, count: usize) -> anyhow::Result<(Vec<Instance>, Duration)> {
        let start = Instant::now();
        let mut out = Vec::with_capacity(count);
        let mut left = count;
        while left > 0 {
            let batch = left.min(1000);
            let resp = self
                .ec2
                .run_instances()
                .image_id(AMI)
                .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                .min_count(batch as i32)
                .max_count(batch as i32)
                .subnet_id(&self.subnet)
                .security_group_ids(&self.node_group)
                .tag_specifications(
                    TagSpecification::builder()
                        .resource_type(ResourceType::Instance)
                        .tags(cluster_tag())
                        .build(),
                )
                .send()
                .await
                .context("RunInstances at moto")?;
            for i in resp.instances() {
                out.push(Instance {
                    id: i.instance_id().unwrap_or_default().to_string(),
                    dns: i.private_dns_name().unwrap_or_default().to_string(),
                });
            }
            left -= batch;
        }
        if out.len() != count {
            bail!("moto launched {} instances, not {count}", out.len());
        }
        Ok((out, start.elapsed()))
    }

    async fn nodes(&self) -> anyhow::Result<Api<Node>> {
        Ok(Api::all(self.api.client().await?))
    }

    /// Starts the CCM, its AWS calls through the proxy.
    async fn ccm(&self, extra: &[String]) -> anyhow::Result<Ccm> {
        let endpoint = self.proxy.endpoint();
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut args = vec![
            "--cloud-provider=aws".to_string(),
            format!(
                "--cloud-config={}",
                self.dir.path().join("cloud.conf").display()
            ),
            format!(
                "--kubeconfig={}",
                self.dir.path().join("kubeconfig").display()
            ),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            // The bench reads /metrics without a token.
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".into(),
        ];
        // Leader election on, as deployed, unless `extra` says otherwise.
        if !extra.iter().any(|a| a.starts_with("--leader-elect=")) {
            args.push("--leader-elect=true".into());
        }
        args.extend(extra.iter().cloned());
        let log = self.dir.path().join(format!("ccm-{port}.log"));
        let child = Command::new(ccm_binary())
            .args(&args)
            .env("RUST_LOG", "warn,aws_ccm=info")
            .env("AWS_ENDPOINT_URL", endpoint)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", ccm_binary()))?;
        Ok(Ccm {
            child,
            log,
            qps: qps_of(extra),
            addr: format!("127.0.0.1:{port}"),
        })
    }
}

struct Ccm {
    child: Child,
    log: PathBuf,
    /// Its `--kube-api-qps`.
    qps: f64,
    /// Its HTTPS endpoint, `host:port`.
    addr: String,
}

impl Ccm {
    /// The histogram `name` from its `/metrics`: (upper bound, cumulative
    /// count) per bucket, the count and the sum.
    async fn histogram(&self, name: &str) -> anyhow::Result<Histogram> {
        let (status, text) = ccm_testkit::tls::https_get(&self.addr, "/metrics", None).await?;
        if status != 200 {
            bail!("/metrics answered {status}: {text}");
        }
        let value = |line: &str, prefix: &str| -> Option<f64> {
            line.strip_prefix(prefix)?.trim().parse().ok()
        };
        let mut h = Histogram::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix(&format!("{name}_bucket{{le=\"")) {
                let (le, count) = rest.split_once("\"}").context("a bucket line")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse()?
                };
                h.buckets.push((le, count.trim().parse()?));
            } else if let Some(v) = value(line, &format!("{name}_count")) {
                h.count = v as u64;
            } else if let Some(v) = value(line, &format!("{name}_sum")) {
                h.sum = v;
            }
        }
        Ok(h)
    }

    /// Waits until its `/metrics` says it leads the CCM's Lease
    /// (`leading`), or that it is a candidate that does not.
    async fn wait_leading(&mut self, leading: bool, deadline: Duration) -> anyhow::Result<()> {
        let want = format!(
            "leader_election_master_status{{name=\"{LEASE_NAME}\"}} {}",
            u8::from(leading)
        );
        let start = Instant::now();
        loop {
            if let Ok((200, text)) = ccm_testkit::tls::https_get(&self.addr, "/metrics", None).await
                && text.lines().any(|l| l == want)
            {
                return Ok(());
            }
            if self.exited() {
                bail!(
                    "the CCM exited before its /metrics said {want:?}:\n{}",
                    self.log_tail()
                );
            }
            if start.elapsed() > deadline {
                bail!("no {want:?} in the CCM's /metrics after {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Peak resident set (VmHWM) in bytes.
    fn peak_rss(&self) -> Option<u64> {
        let pid = self.child.id()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    /// CPU time (user + system) the process has used so far, in seconds.
    fn cpu_seconds(&self) -> Option<f64> {
        let pid = self.child.id()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the parenthesised command name; utime and stime are
        // the 14th and 15th of the whole line, in clock ticks.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf only reads a system constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| ticks as f64 / hz as f64)
    }

    async fn wait_for_log(&mut self, needle: &str, deadline: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(needle) {
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                bail!("the CCM exited ({status}) before logging {needle:?}:\n{text}");
            }
            if start.elapsed() > deadline {
                bail!("no {needle:?} in the CCM log after {deadline:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Lines of the log containing `needle`.
    fn count_in_log(&self, needle: &str) -> usize {
        self.lines_with(&[needle]).len()
    }

    /// Lines of the log containing any of `needles`.
    fn lines_with(&self, needles: &[&str]) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| needles.iter().any(|n| l.contains(n)))
            .map(str::to_string)
            .collect()
    }

    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Ends the process with SIGKILL (tokio's `Child::kill`), ignoring
    /// errors: setup and end of a scenario.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM, as a rolling update: the CCM finishes, writes the rest of
    /// its target record and releases the Lease. Fails unless it exits
    /// within a minute.
    async fn terminate(mut self) -> anyhow::Result<()> {
        let pid = self.child.id().context("the CCM has already exited")?;
        // SAFETY: a signal to our own child's pid.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("the CCM did not exit within a minute of SIGTERM")??;
        if !status.success() {
            bail!(
                "the CCM exited with {status} after SIGTERM:\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    /// SIGKILL, as a node loss or an OOM kill: no shutdown, no Lease
    /// release. Fails unless SIGKILL is what ended it.
    async fn kill(mut self) -> anyhow::Result<()> {
        use std::os::unix::process::ExitStatusExt;
        if let Ok(Some(status)) = self.child.try_wait() {
            bail!("the CCM had already exited ({status}) before SIGKILL");
        }
        self.child.kill().await.context("SIGKILL to the CCM")?;
        let status = self.child.wait().await?;
        if status.signal() != Some(libc::SIGKILL) {
            bail!("the CCM ended with {status}, not by SIGKILL");
        }
        Ok(())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }
}

/// A histogram as `/metrics` serves it.
#[derive(Default)]
struct Histogram {
    buckets: Vec<(f64, u64)>,
    count: u64,
    sum: f64,
}

impl Histogram {
    /// The upper bound of the bucket holding quantile `q`.
    fn quantile_bound(&self, q: f64) -> f64 {
        let rank = (q * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= rank.max(1))
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

/// The CCM under test: `SCALE_CCM_BINARY` (e.g. an older build, for a
/// before/after figure) or this build's release binary.
fn ccm_binary() -> String {
    std::env::var("SCALE_CCM_BINARY").unwrap_or_else(|_| BINARY.to_string())
}

/// A cluster-tagged security group in moto.
async fn security_group(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    name: &str,
) -> anyhow::Result<String> {
    ec2.create_security_group()
        .group_name(name)
        .description(name)
        .vpc_id(vpc)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::SecurityGroup)
                .tags(cluster_tag())
                .build(),
        )
        .send()
        .await?
        .group_id
        .context("no security group id")
}

fn cluster_tag() -> Tag {
    Tag::builder()
        .key(format!("kubernetes.io/cluster/{CLUSTER_ID}"))
        .value("owned")
        .build()
}

/// Whether `action` (as the proxy counts it) changes anything: not a read,
/// and not a DryRun (the start-up permission self-check sends those; AWS
/// only answers whether the call would be allowed).
fn is_mutating(action: &str) -> bool {
    !["Describe", "List", "Get", "Search"]
        .iter()
        .any(|p| action.starts_with(p))
        && !action.ends_with("+DryRun")
}

fn mutating_calls(calls: &CallCounts) -> (u64, BTreeMap<String, u64>) {
    let mut by_action = BTreeMap::new();
    for (service, action, c) in calls.iter() {
        if is_mutating(action) && c.received > 0 && service != "sts" {
            by_action.insert(format!("{service}:{action}"), c.received);
        }
    }
    (by_action.values().sum(), by_action)
}

fn describe_calls(calls: &CallCounts, service: &str) -> u64 {
    calls
        .iter()
        .filter(|(s, a, _)| *s == service && a.starts_with("Describe"))
        .map(|(_, _, c)| c.received)
        .sum()
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The tags an instance launched by kOps through an autoscaling group
/// carries (the CCM keeps only the cluster tags).
fn kops_instance_tags(group: &str) -> BTreeMap<String, String> {
    let ig = format!("nodes-{group}");
    [
        (
            format!("kubernetes.io/cluster/{CLUSTER_ID}"),
            "owned".to_string(),
        ),
        ("KubernetesCluster".into(), CLUSTER_ID.to_string()),
        ("Name".into(), format!("{ig}.{CLUSTER_ID}")),
        ("k8s.io/role/node".into(), "1".into()),
        ("kops.k8s.io/instancegroup".into(), ig.clone()),
        (
            "aws:autoscaling:groupName".into(),
            format!("{ig}.{CLUSTER_ID}"),
        ),
        (
            "aws:ec2launchtemplate:id".into(),
            "lt-0a1b2c3d4e5f60718".into(),
        ),
        ("aws:ec2launchtemplate:version".into(), "3".into()),
        ("k8s.io/cluster-autoscaler/enabled".into(), "1".into()),
        (
            format!("k8s.io/cluster-autoscaler/{CLUSTER_ID}"),
            "1".into(),
        ),
        (
            "k8s.io/cluster-autoscaler/node-template/label/kops.k8s.io/instancegroup".into(),
            ig,
        ),
    ]
    .into_iter()
    .collect()
}

/// A Node as a kubelet on a kubeadm node registers it, with extra
/// spec/labels.
fn node_object(
    name: &str,
    spec: serde_json::Value,
    labels: &[(&str, &str)],
) -> anyhow::Result<Node> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("kubernetes.io/hostname".into(), name.into());
    // The labels and annotations a kubelet and kubeadm put on every Node.
    for (k, v) in [
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
    ] {
        l.insert(k.into(), v.into());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": l, "annotations": {
            "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": spec,
    }))
    .context("the bench built an invalid Node")
}

/// The status a kubelet reports, at its real size (about 10 KB of JSON, most
/// of it the 50-image list): the CCM caches every Node, so the bench's must
/// weigh what real ones do.
fn kubelet_status() -> serde_json::Value {
    let now = chrono::Utc::now().to_rfc3339();
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({"type": type_, "status": status, "reason": reason,
               "message": format!("kubelet reports {type_} {status}"),
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources = json!({"cpu": "2", "ephemeral-storage": "83873772Ki", "hugepages-1Gi": "0",
                           "hugepages-2Mi": "0", "memory": "7910660Ki", "pods": "29"});
    let images: Vec<serde_json::Value> = (0..50)
        .map(|i| {
            let digest = format!(
                "{:064x}",
                (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c834)
            );
            json!({"names": [format!("registry.example.com/team-{i}/service-{i}@sha256:{digest}"),
                             format!("registry.example.com/team-{i}/service-{i}:v1.{i}.0")],
                   "sizeBytes": 10_000_000 + i * 1_000_000})
        })
        .collect();
    json!({"status": {
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady"),
        ],
        "capacity": resources, "allocatable": resources,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"architecture": "amd64", "bootID": "0b6a3f2c-4d1e-4f8a-9c7b-2e5d8a1f3c6b",
                     "containerRuntimeVersion": "containerd://1.7.22", "kernelVersion": "6.1.112-122.189.amzn2023.x86_64",
                     "kubeProxyVersion": "", "kubeletVersion": "v1.31.2",
                     "machineID": "ec2a1b2c3d4e5f60718293a4b5c6d7e8", "operatingSystem": "linux",
                     "osImage": "Amazon Linux 2023.6.20241031", "systemUUID": "ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8"},
        "images": images,
    }})
}

/// Creates the nodes, 64 at a time, each followed by its kubelet's Ready
/// status: two writes per node.
async fn register(api: &Api<Node>, nodes: Vec<Node>) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(nodes)
        .map(|node| {
            let api = api.clone();
            async move {
                let name = node.metadata.name.clone().unwrap_or_default();
                api.create(&PostParams::default(), &node).await?;
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(kubelet_status()),
                )
                .await?;
                Ok(())
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(())
}

/// How long moto takes for what the scenarios need, straight (no proxy).
async fn moto_figures(cfg: &Config, table: &mut Table) -> anyhow::Result<()> {
    let n = cfg.sizes(&[5000])[0];
    let world = World::start(cfg).await?;
    let (_, launched) = world.launch(n).await?;
    table.row(
        "moto",
        &format!("RunInstances {n} (1,000 per call), straight to moto"),
        &secs(launched),
        "",
        None,
    );
    let start = Instant::now();
    let page = world
        .ec2
        .describe_instances()
        .max_results(1000)
        .send()
        .await?;
    let count: usize = page
        .reservations()
        .iter()
        .map(|r| r.instances().len())
        .sum();
    table.row(
        "moto",
        &format!("DescribeInstances page of {count} of {n}"),
        &secs(start.elapsed()),
        "",
        None,
    );
    Ok(())
}

/// Scenario 1: `n` tainted nodes register at once.
/// What recorded `DescribeInstances` calls asked for: pages of the cluster
/// sweep (a tag filter), lookups by instance ID, lookups by private DNS name.
fn describe_instances_kinds(calls: &[ccm_testkit::aws_proxy::RecordedCall]) -> String {
    let (mut by_id, mut by_name, mut names) = (0, 0, 0);
    for call in calls {
        if call.params.keys().any(|k| k.starts_with("InstanceId.")) {
            by_id += 1;
        } else if call.params.values().any(|v| v == "private-dns-name") {
            by_name += 1;
            names += call.params.keys().filter(|k| k.contains(".Value.")).count();
        }
    }
    let sweep = calls.len() - by_id - by_name;
    format!("{sweep} sweep pages, {by_id} by ID, {by_name} by name for {names} nodes")
}

/// A `SCALE_JOIN_TOPOLOGY` entry: its name and the fault rule (none for
/// `answered`).
fn topology_fault(failure: &str) -> anyhow::Result<(String, Option<FaultRule>)> {
    let kind = match failure {
        "answered" => return Ok((failure.to_string(), None)),
        "5xx" => FaultKind::ServerError(500),
        "throttled" => FaultKind::Throttle,
        // Past the CCM's call timeout (30 s) and the question's deadline.
        "hang" => FaultKind::Latency(Duration::from_secs(45)),
        other => {
            bail!("SCALE_JOIN_TOPOLOGY: unknown failure {other:?} (answered, 5xx, throttled, hang)")
        }
    };
    let rule = FaultRule::new(kind).for_action("DescribeInstanceTopology");
    Ok((failure.to_string(), Some(rule)))
}

async fn join_burst(
    cfg: &Config,
    n: usize,
    topology: Option<(String, Option<FaultRule>)>,
    table: &mut Table,
) -> anyhow::Result<()> {
    let scenario = match &topology {
        Some((failure, _)) => format!("join {n}, topology {failure}"),
        None => format!("join {n}"),
    };
    let answered = matches!(topology, Some((_, None)));
    let world = World::start(cfg).await?;
    if let Some((_, Some(rule))) = topology {
        world.proxy.set_faults(vec![rule]);
    }
    let instance_type = if answered { "p4d.24xlarge" } else { "m5.large" };
    let instances: Vec<Instance> = world
        .sim_launch_typed(n, n.max(1), instance_type)
        .await?
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    if answered {
        let layers = |i: usize| vec![format!("nn-top-{}", i % 2), format!("nn-bot-{i}")];
        world.proxy.set_instance_topology(
            (instances.iter().enumerate())
                .map(|(i, instance)| InstanceTopology {
                    instance_id: instance.id.clone(),
                    instance_type: instance_type.into(),
                    availability_zone: AZ.into(),
                    zone_id: "use1-az1".into(),
                    group_name: None,
                    network_nodes: layers(i),
                })
                .collect(),
        );
    }
    let api = world.nodes().await?;
    let mut ccm = world
        .ccm(&[
            "--controllers=cloud-node,cloud-node-lifecycle".into(),
            format!("--kube-api-qps={KUBE_API_QPS}"),
            format!("--kube-api-burst={KUBE_API_QPS}"),
        ])
        .await?;
    ccm.wait_for_log("cloud-node controller started", Duration::from_secs(60))
        .await?;
    table.qps = Some(ccm.qps);
    world.proxy.reset_counts();
    world.proxy.record_requests(true);
    world.api.reset_stats();

    let start = Instant::now();
    let nodes = instances
        .iter()
        .map(|i| {
            node_object(
                &i.dns,
                json!({"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]}),
                &[],
            )
        })
        .collect::<anyhow::Result<Vec<Node>>>()?;
    register(&api, nodes).await?;
    let registered = start.elapsed();
    let deadline = Duration::from_secs(60 + n as u64 / 10);
    let mut done = 0;
    while start.elapsed() < deadline {
        let list = api.list(&ListParams::default()).await?;
        done = list
            .items
            .iter()
            .filter(|node| {
                !node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED))
            })
            .count();
        if done == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = start.elapsed();
    // The labels follow the join: every node's, or the deadline.
    let mut labelled = 0;
    while answered && start.elapsed() < deadline {
        let list = api.list(&ListParams::default()).await?;
        labelled = (list.items.iter())
            .filter(|node| node.labels().contains_key(LAYER_1))
            .count();
        if labelled == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if scenario.contains("topology") && !answered {
        // The questions follow the initializations: show that the fault
        // fired, not merely that the taints came off before it could.
        let fired = Instant::now();
        while world
            .proxy
            .calls()
            .get("ec2", "DescribeInstanceTopology")
            .faulted
            == 0
            && fired.elapsed() < Duration::from_secs(30)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let calls = world.proxy.calls();
    let describe_kinds = describe_instances_kinds(&world.proxy.requests("DescribeInstances"));
    world.proxy.record_requests(false);
    let stats = world.api.stats();
    let peak = ccm.peak_rss();
    let cpu = ccm.cpu_seconds();
    if done < n {
        eprintln!("CCM log tail:\n{}", ccm.log_tail());
    }
    ccm.stop().await;

    // The CCM's writes per node, all through one client limiter: the
    // taint removal, the addresses (status) and the `Synced` event; then
    // the network-node labels where AWS lists a topology.
    const CCM_WRITES_PER_NODE: u64 = 3;
    let write_bound = (CCM_WRITES_PER_NODE * n as u64) as f64 / KUBE_API_QPS as f64;
    let writes_per_node = CCM_WRITES_PER_NODE + u64::from(answered);
    table.judged(
        &scenario,
        &format!(
            "time until every taint is removed ({done}/{n} done; registration took {})",
            secs(registered)
        ),
        &secs(elapsed),
        &format!(
            "{write_bound:.1} s ({CCM_WRITES_PER_NODE} writes/node at {KUBE_API_QPS} QPS: taint, addresses, Synced event)"
        ),
        Some(elapsed.as_secs_f64() / write_bound),
        done == n && elapsed.as_secs_f64() <= FLOOR_SLACK * write_bound,
    );
    let describes = calls.get("ec2", "DescribeInstances").received;
    let bound = n.div_ceil(1000) as u64;
    table.judged(
        &scenario,
        &format!("DescribeInstances calls ({describe_kinds})"),
        &describes.to_string(),
        &bound.to_string(),
        Some(describes as f64 / bound as f64),
        describes <= bound,
    );
    table.judged(
        &scenario,
        "throttled responses",
        &calls.throttled_total().to_string(),
        "0",
        None,
        calls.throttled_total() == 0,
    );
    let topology = calls.get("ec2", "DescribeInstanceTopology");
    if answered {
        let bound = n.div_ceil(100) as u64 + 1;
        table.judged(
            &scenario,
            &format!("DescribeInstanceTopology calls ({labelled}/{n} nodes labelled)"),
            &topology.received.to_string(),
            &format!("{bound} (1 per 100 nodes, and 1 more)"),
            Some(topology.received as f64 / bound as f64),
            labelled == n && topology.received <= bound,
        );
    } else if scenario.contains("topology") {
        table.judged(
            &scenario,
            "DescribeInstanceTopology calls faulted (of received)",
            &format!("{} ({})", topology.faulted, topology.received),
            "> 0 (the fault fired)",
            None,
            topology.faulted > 0,
        );
    }
    // The bench itself wrote one create and one status patch per node.
    let bench_writes = 2 * n as u64;
    let ccm_writes = (stats.writes("nodes") + stats.writes("nodes/status"))
        .saturating_sub(bench_writes)
        + stats.writes("events");
    let per_node = ccm_writes as f64 / n as f64;
    table.judged(
        &scenario,
        "CCM writes per node (nodes + nodes/status + events)",
        &format!("{per_node:.2}"),
        &writes_per_node.to_string(),
        Some(per_node / writes_per_node as f64),
        ccm_writes <= writes_per_node * n as u64,
    );
    if let Some(peak) = peak {
        table.row(
            &scenario,
            "CCM peak RSS (VmHWM)",
            &format!("{:.1} MB", peak as f64 / 1e6),
            "",
            None,
        );
    }
    if let Some(cpu) = cpu {
        let bound = n as f64 * JOIN_CPU_PER_NODE.as_secs_f64();
        table.judged(
            &scenario,
            "CCM CPU time, start-up to the last taint (user + system)",
            &format!("{cpu:.1} s"),
            &format!("{bound:.1} s ({JOIN_CPU_PER_NODE:?} a node)"),
            Some(cpu / bound),
            cpu <= bound,
        );
    }
    Ok(())
}

/// A `type: LoadBalancer` Service on port 80 whose backends are the nodes
/// labelled `group=g<group>`; an NLB when `nlb`.
fn lb_service(i: usize, group: usize, nlb: bool) -> anyhow::Result<Service> {
    let mut annotations = BTreeMap::from([(
        "service.beta.kubernetes.io/aws-load-balancer-target-node-labels".to_string(),
        format!("group=g{group}"),
    )]);
    if nlb {
        annotations.insert(
            "service.beta.kubernetes.io/aws-load-balancer-type".into(),
            "nlb".into(),
        );
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "annotations": annotations},
        "spec": {"type": "LoadBalancer", "selector": {"app": format!("a{i}")},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    }))?)
}

/// Registers initialized, Ready nodes for `instances`, labelled with their
/// group.
async fn register_initialized(
    api: &Api<Node>,
    instances: &[(Instance, usize)],
) -> anyhow::Result<()> {
    let nodes = instances
        .iter()
        .map(|(inst, group)| {
            node_object(
                &inst.dns,
                json!({"providerID": format!("aws:///{AZ}/{}", inst.id)}),
                &[("group", &format!("g{group}"))],
            )
        })
        .collect::<anyhow::Result<Vec<Node>>>()?;
    register(api, nodes).await
}

/// Services with an ingress hostname.
fn with_ingress(services: &[Service]) -> usize {
    services
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|st| st.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
        .count()
}

/// Creates `services` and lets a seeding CCM create every load balancer
/// (upstream names and tags) and set every node's addresses, with the proxy
/// enforcing nothing and adding no latency and an unlimited client budget:
/// the setup, not the figure. Prints how long it took.
async fn seed_load_balancers(
    world: &World,
    services: Vec<Service>,
    nodes: usize,
    scenario: &str,
    table: &mut Table,
) -> anyhow::Result<()> {
    let total = services.len();
    let svc_api: Api<Service> = Api::namespaced(world.api.client().await?, "default");
    let created: Vec<anyhow::Result<()>> = futures::stream::iter(services)
        .map(|svc| {
            let svc_api = svc_api.clone();
            async move {
                svc_api.create(&PostParams::default(), &svc).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;

    world.proxy.set_budget_fraction(None);
    world.proxy.set_latency(Duration::ZERO);
    let api = world.nodes().await?;
    let start = Instant::now();
    let mut seeder = world
        .ccm(&[
            "--controllers=cloud-node,service".into(),
            "--node-status-update-frequency=10s".into(),
            "--aws-api-budget-fraction=10".into(),
            "--concurrent-service-syncs=8".into(),
            "--kube-api-qps=500".into(),
            "--kube-api-burst=500".into(),
            // Leader election on: its graceful stop hands the Lease, and
            // the target record, straight to the measured CCM.
        ])
        .await?;
    table.qps = Some(seeder.qps);
    let deadline = Duration::from_secs(300 + total as u64 * 2);
    let mut ready = 0;
    let mut addressed = 0;
    while start.elapsed() < deadline {
        ready = with_ingress(&svc_api.list(&ListParams::default()).await?.items);
        // Nodes weigh ~10 KB each: list them only until all have addresses.
        if addressed < nodes {
            addressed = api
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|st| st.addresses.as_ref())
                        .is_some_and(|a| !a.is_empty())
                })
                .count();
        }
        if ready == total && addressed == nodes {
            break;
        }
        if seeder.exited() {
            bail!("the seeding CCM exited:\n{}", seeder.log_tail());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let tail = seeder.log_tail();
    for line in seeder.lines_with(&["WARN", "ERROR"]).iter().take(20) {
        eprintln!("   seeder: {line}");
    }
    seeder.terminate().await?;
    world.proxy.set_budget_fraction(Some(1.0));
    world.proxy.set_latency(world.latency);
    table.row(
        scenario,
        &format!(
            "setup: {ready}/{total} load balancers created by a seeding CCM (no budget, no latency)"
        ),
        &secs(start.elapsed()),
        "",
        None,
    );
    if ready < total {
        bail!("seeding created only {ready} of {total} load balancers; CCM log tail:\n{tail}");
    }
    Ok(())
}

/// What `adopt` measured.
struct Adoption {
    ccm: Ccm,
    /// Until every Service, the late ones too, had synced once.
    time: Duration,
    calls: CallCounts,
    /// The Services created [`LATE_AFTER`] after the CCM started.
    late: Vec<Late>,
    /// Mutating calls that name a late Service's load balancer, security
    /// group, target group or listener, by `service:action`.
    late_mutations: BTreeMap<String, u64>,
    /// Every other mutating call, by `service:action`: what adopting the
    /// existing load balancers changed (must be nothing).
    adopted_mutations: BTreeMap<String, u64>,
}

/// A Service created while the CCM adopts the others.
struct Late {
    name: String,
    nlb: bool,
    /// From its creation until its `status.loadBalancer.ingress` had a
    /// hostname; `None` if that did not happen before the deadline.
    hostname_after: Option<Duration>,
}

/// When the late Services are created, after the measured CCM starts.
const LATE_AFTER: Duration = Duration::from_secs(1);

/// Starts the measured CCM through the proxy, creates the `late` Services
/// (each with whether it is an NLB) [`LATE_AFTER`] later, and waits until it
/// has synced every one of `services` and the late ones once (adoption: each
/// existing one is ensured at start).
async fn adopt(
    world: &World,
    services: usize,
    args: &[String],
    late: Vec<(Service, bool)>,
) -> anyhow::Result<Adoption> {
    world.proxy.reset_counts();
    world.api.reset_stats();
    world.proxy.record_requests(true);
    let svc_api: Api<Service> = Api::namespaced(world.api.client().await?, "default");
    let start = Instant::now();
    let mut ccm = world.ccm(args).await?;
    // Each Service's first sync reads ~8 ELB/EC2 describes; the ELB
    // describe bucket refills at 10/s.
    let deadline = Duration::from_secs(300 + services as u64 * 2);
    let expected = services + late.len();
    let late_task = tokio::spawn(create_late(
        svc_api.clone(),
        late,
        start + LATE_AFTER,
        start + deadline,
    ));
    if let Err(e) = wait_ensured(&mut ccm, expected, start, deadline).await {
        late_task.abort();
        return Err(e);
    }
    let time = start.elapsed();
    let late = late_task.await.context("the late Services' task")??;
    let calls = world.proxy.calls();
    world.proxy.record_requests(false);
    eprintln!(
        "   adoption describe calls by action: {:?}",
        describes_by_action(&calls)
    );
    eprint_throttled("adoption", &calls);
    let tokens = late_tokens(world, &svc_api, &late).await?;
    let (adopted_mutations, late_mutations) = split_mutations(world, &calls, &tokens);
    Ok(Adoption {
        ccm,
        time,
        calls,
        late,
        late_mutations,
        adopted_mutations,
    })
}

/// Waits until `ccm` has logged [`ENSURED`] `expected` times.
async fn wait_ensured(
    ccm: &mut Ccm,
    expected: usize,
    start: Instant,
    deadline: Duration,
) -> anyhow::Result<()> {
    loop {
        let ensured = ccm.count_in_log(ENSURED);
        if ensured >= expected {
            return Ok(());
        }
        if ccm.exited() || start.elapsed() > deadline {
            bail!(
                "{ensured} of {expected} Services synced in {}; CCM log tail:\n{}",
                secs(start.elapsed()),
                ccm.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates `late` at `at`, then times each until its ingress has a
/// hostname (polled every 100 ms), giving up at `deadline`.
async fn create_late(
    api: Api<Service>,
    late: Vec<(Service, bool)>,
    at: Instant,
    deadline: Instant,
) -> anyhow::Result<Vec<Late>> {
    tokio::time::sleep_until(at.into()).await;
    let mut waiting = Vec::with_capacity(late.len());
    for (svc, nlb) in &late {
        let created = api.create(&PostParams::default(), svc).await?;
        waiting.push((
            created.metadata.name.unwrap_or_default(),
            *nlb,
            Instant::now(),
        ));
    }
    let mut out: Vec<Late> = Vec::with_capacity(waiting.len());
    while !waiting.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut still = Vec::with_capacity(waiting.len());
        for (name, nlb, created) in waiting {
            if current_hostname(&api.get(&name).await?).is_some() {
                let hostname_after = Some(created.elapsed());
                out.push(Late {
                    name,
                    nlb,
                    hostname_after,
                });
            } else {
                still.push((name, nlb, created));
            }
        }
        waiting = still;
    }
    out.extend(waiting.into_iter().map(|(name, nlb, _)| Late {
        name,
        nlb,
        hostname_after: None,
    }));
    Ok(out)
}

/// Strings that only the late Services' AWS calls carry, read straight from
/// moto (not counted): each one's load balancer name (upstream's `a` + UID),
/// and its security groups, ARN, target groups and listeners.
async fn late_tokens(
    world: &World,
    api: &Api<Service>,
    late: &[Late],
) -> anyhow::Result<Vec<String>> {
    let sdk = world.moto.sdk_config().await;
    let elb = aws_sdk_elasticloadbalancing::Client::new(&sdk);
    let elbv2 = aws_sdk_elasticloadbalancingv2::Client::new(&sdk);
    let mut tokens = Vec::new();
    for l in late.iter().filter(|l| l.hostname_after.is_some()) {
        let uid = api.get(&l.name).await?.metadata.uid.unwrap_or_default();
        let name = aws_ccm::aws::elb::load_balancer_name(&uid);
        if !l.nlb {
            let lbs = elb
                .describe_load_balancers()
                .load_balancer_names(&name)
                .send()
                .await?;
            for lb in lbs.load_balancer_descriptions() {
                tokens.extend(lb.security_groups().iter().cloned());
            }
        } else {
            let lbs = elbv2.describe_load_balancers().names(&name).send().await?;
            for lb in lbs.load_balancers() {
                tokens.extend(lb.security_groups().iter().cloned());
                let arn = lb.load_balancer_arn().unwrap_or_default();
                tokens.push(arn.to_string());
                let groups = elbv2
                    .describe_target_groups()
                    .load_balancer_arn(arn)
                    .send()
                    .await?;
                for g in groups.target_groups() {
                    tokens.extend(g.target_group_arn().map(str::to_string));
                    tokens.extend(g.target_group_name().map(str::to_string));
                }
                let listeners = elbv2
                    .describe_listeners()
                    .load_balancer_arn(arn)
                    .send()
                    .await?;
                tokens.extend(
                    listeners
                        .listeners()
                        .iter()
                        .filter_map(|li| li.listener_arn().map(str::to_string)),
                );
            }
        }
        tokens.push(name);
    }
    tokens.retain(|t| !t.is_empty());
    Ok(tokens)
}

/// The mutating calls in `calls` (from the proxy's recorded requests), split
/// into those for other Services and those whose parameters name one of
/// `tokens` (the late Services'). Prints the former's parameters: adoption
/// should have made none.
fn split_mutations(
    world: &World,
    calls: &CallCounts,
    tokens: &[String],
) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let mut adopted = BTreeMap::new();
    let mut late = BTreeMap::new();
    for key in mutating_calls(calls).1.keys() {
        let Some((service, action)) = key.split_once(':') else {
            continue;
        };
        let recorded = world.proxy.requests(action);
        let sent = recorded
            .iter()
            .filter(|c| c.service == service && c.params.get("DryRun").is_none_or(|v| v != "true"));
        for call in sent {
            let theirs = call
                .params
                .values()
                .any(|v| tokens.iter().any(|t| v.contains(t.as_str())));
            if !theirs {
                eprintln!("   adoption called {action}: {:?}", call.params);
            }
            let into = if theirs { &mut late } else { &mut adopted };
            *into.entry(key.clone()).or_insert(0) += 1;
        }
    }
    (adopted, late)
}

/// Describe calls that reached the proxy, by `service:action`.
fn describes_by_action(calls: &CallCounts) -> BTreeMap<String, u64> {
    calls
        .iter()
        .filter(|(_, a, c)| a.starts_with("Describe") && c.received > 0)
        .map(|(s, a, c)| (format!("{s}:{a}"), c.received))
        .collect()
}

/// Names each throttled action (the bound is 0: say which one missed it).
fn eprint_throttled(phase: &str, calls: &CallCounts) {
    let throttled: BTreeMap<String, u64> = calls
        .iter()
        .filter(|(_, _, c)| c.throttled > 0)
        .map(|(s, a, c)| (format!("{s}:{a}"), c.throttled))
        .collect();
    if !throttled.is_empty() {
        eprintln!("   {phase}: throttled responses by action: {throttled:?}");
    }
}

/// What the service controller logs after each successful sync.
const ENSURED: &str = "load balancer ensured";

/// Scenario 2 (and 5): nothing changes; count what the CCM still calls.
async fn steady_state(cfg: &Config, table: &mut Table) -> anyhow::Result<()> {
    let n = cfg.sizes(&[5000])[0];
    let services = cfg.services;
    let nlbs = if cfg.nlb { services / 2 } else { 0 };
    let scenario = format!("steady {n}n/{services}svc");
    let world = World::start(cfg).await?;
    let instances = world.sim_launch(n, NODES_PER_GROUP).await?;
    let groups = n.div_ceil(NODES_PER_GROUP).max(1);
    register_initialized(&world.nodes().await?, &instances).await?;
    let specs = (0..services)
        .map(|i| lb_service(i, i % groups, i % 2 == 1 && cfg.nlb))
        .collect::<anyhow::Result<Vec<_>>>()?;
    seed_load_balancers(&world, specs, n, &scenario, table).await?;

    // Measure: a fresh CCM through the proxy adopts them, then idles.
    let period = Duration::from_secs(300 / COMPRESSION as u64);
    let resync = Duration::from_secs(600 / COMPRESSION as u64);
    let args = vec![
        "--controllers=cloud-node,cloud-node-lifecycle,service".into(),
        format!("--node-status-update-frequency={}s", period.as_secs()),
        format!("--node-monitor-period={}ms", 5000 / COMPRESSION),
        format!("--service-resync-period={}s", resync.as_secs()),
        "--concurrent-service-syncs=8".into(),
        // The whole bucket, as if alone in the account (as in `routes`).
        "--aws-api-budget-fraction=1".into(),
    ];
    let late = late_services(services, groups, cfg.nlb)?;
    let adoption = adopt(&world, services, &args, late).await?;
    let total = services + adoption.late.len();
    let ccm = &adoption.ccm;
    table.qps = Some(ccm.qps);
    world.proxy.reset_counts();
    let synced_before = ccm.count_in_log(ENSURED);
    let cpu_before = ccm.cpu_seconds();
    let steady_start = Instant::now();
    tokio::time::sleep(cfg.steady).await;
    let steady = world.proxy.calls();
    let elapsed = steady_start.elapsed();
    let resyncs = ccm.count_in_log(ENSURED) - synced_before;
    let peak = ccm.peak_rss();
    let cpu = ccm.cpu_seconds().zip(cpu_before).map(|(a, b)| a - b);
    let writes = world.api.stats().total_writes();

    let (steady_mut, steady_by) = mutating_calls(&steady);
    table.row(
        &scenario,
        &format!(
            "Services: {} CLB, {nlbs} NLB, over {groups} node groups of {NODES_PER_GROUP}",
            services - nlbs
        ),
        "",
        "",
        None,
    );
    adoption_rows(&scenario, &adoption, table);
    table.judged(
        &scenario,
        &format!(
            "mutating AWS calls after adoption, {} (= {} min at 1/{COMPRESSION} periods) {steady_by:?}",
            secs(elapsed),
            elapsed.as_secs() * COMPRESSION as u64 / 60
        ),
        &steady_mut.to_string(),
        "0",
        None,
        steady_mut == 0,
    );
    let periods = elapsed.as_secs_f64() / period.as_secs_f64();
    eprintln!(
        "   steady describe calls by action: {:?}",
        describes_by_action(&steady)
    );
    eprint_throttled("steady", &steady);
    // The node path: DescribeInstances per node refresh period.
    let instances = steady.get("ec2", "DescribeInstances").received as f64 / periods;
    let goal = n.div_ceil(1000) as f64;
    table.judged(
        &scenario,
        &format!(
            "DescribeInstances calls per node refresh period ({} = 5 min / {COMPRESSION})",
            secs(period)
        ),
        &format!("{instances:.1}"),
        &format!("{goal:.0} (1 per 1,000 nodes)"),
        Some(instances / goal),
        instances <= goal,
    );
    // The service path: what one resync of an unchanged Service reads.
    let ec2_other =
        describe_calls(&steady, "ec2") - steady.get("ec2", "DescribeInstances").received;
    let elb = describe_calls(&steady, "elasticloadbalancing")
        + describe_calls(&steady, "elasticloadbalancingv2");
    let per = |calls: u64| calls as f64 / resyncs.max(1) as f64;
    let most_resyncs = total as f64 * elapsed.as_secs_f64() / resync.as_secs_f64();
    table.judged(
        &scenario,
        &format!(
            "Service resyncs in the window (--service-resync-period={}s = 10 min / {COMPRESSION})",
            resync.as_secs()
        ),
        &resyncs.to_string(),
        &format!("{most_resyncs:.0}"),
        None,
        resyncs as f64 <= most_resyncs.ceil(),
    );
    table.row(
        &scenario,
        &format!("ELB describe calls per Service resync ({elb} calls)"),
        &format!("{:.1}", per(elb)),
        "",
        None,
    );
    table.row(
        &scenario,
        &format!("other EC2 describe calls per Service resync ({ec2_other} calls)"),
        &format!("{:.2}", per(ec2_other)),
        "",
        None,
    );
    let throttled = adoption.calls.throttled_total() + steady.throttled_total();
    table.judged(
        &scenario,
        "throttled responses (adoption and after)",
        &throttled.to_string(),
        "0",
        None,
        throttled == 0,
    );
    table.row(
        &scenario,
        "apiserver writes (adoption and after)",
        &writes.to_string(),
        "",
        None,
    );
    if let Some(peak) = peak {
        table.judged(
            "memory",
            &format!("CCM peak RSS (VmHWM) in {scenario}"),
            &format!("{:.1} MB", peak as f64 / 1e6),
            "64 MB",
            Some(peak as f64 / 64e6),
            peak as f64 <= 64e6,
        );
    }
    if let Some(cpu) = cpu {
        table.row(
            &scenario,
            &format!(
                "CCM CPU time in the window after adoption ({:.0} s)",
                elapsed.as_secs_f64()
            ),
            &format!("{cpu:.1} s"),
            "",
            None,
        );
    }
    if !cfg.scenarios.iter().any(|s| s == "failover") {
        adoption.ccm.stop().await;
        return Ok(());
    }
    let takeover = format!("failover {n}n/{total}svc");
    if let Err(e) = failover(&world, adoption.ccm, &args, total, &takeover, table).await {
        table.judged(&takeover, "FAILED", &format!("{e:#}"), "", None, false);
    }
    Ok(())
}

/// The Services created 1 s into adoption: one CLB (backends: the first
/// node group) and, unless `SCALE_NLB=0`, one NLB (the second group, which
/// already holds NLB rules, so the shared MTU rule exists). Numbered after
/// the `services` adopted ones.
fn late_services(
    services: usize,
    groups: usize,
    nlb: bool,
) -> anyhow::Result<Vec<(Service, bool)>> {
    let mut late = vec![(lb_service(services, 0, false)?, false)];
    if nlb {
        late.push((lb_service(services + 1, 1 % groups, true)?, true));
    }
    Ok(late)
}

/// The adoption rows of `steady`: its time, the late Services' time to a
/// hostname, and the mutating calls, the late Services' apart.
fn adoption_rows(scenario: &str, adoption: &Adoption, table: &mut Table) {
    let calls = &adoption.calls;
    let late = adoption.late.len();
    table.judged(
        scenario,
        &format!(
            "adoption by a fresh CCM: time until every Service synced once ({} describe calls; \
             {late} of the Services created {} after start)",
            describe_calls(calls, "ec2")
                + describe_calls(calls, "elasticloadbalancing")
                + describe_calls(calls, "elasticloadbalancingv2"),
            secs(LATE_AFTER)
        ),
        &secs(adoption.time),
        "60 s",
        Some(adoption.time.as_secs_f64() / 60.0),
        adoption.time <= Duration::from_secs(60),
    );
    let elb = describe_calls(calls, "elasticloadbalancing")
        + describe_calls(calls, "elasticloadbalancingv2");
    table.judged(
        scenario,
        "adoption: ELB describe calls (CLB and ELBv2)",
        &elb.to_string(),
        "400",
        Some(elb as f64 / 400.0),
        elb <= 400,
    );
    for l in &adoption.late {
        let kind = if l.nlb { "NLB" } else { "CLB" };
        let (value, ratio) = match l.hostname_after {
            Some(d) => (secs(d), Some(d.as_secs_f64() / 15.0)),
            None => (format!("none after {}", secs(adoption.time)), None),
        };
        table.judged(
            scenario,
            &format!(
                "adoption: time for a Service created {} after start to get its hostname ({kind}, {})",
                secs(LATE_AFTER),
                l.name
            ),
            &value,
            "15 s",
            ratio,
            l.hostname_after
                .is_some_and(|d| d <= Duration::from_secs(15)),
        );
    }
    let adopted: u64 = adoption.adopted_mutations.values().sum();
    table.judged(
        scenario,
        &format!(
            "mutating AWS calls while adopting, the late Services' apart {:?}",
            adoption.adopted_mutations
        ),
        &adopted.to_string(),
        "0",
        None,
        adopted == 0,
    );
    let for_late: u64 = adoption.late_mutations.values().sum();
    table.row(
        scenario,
        &format!(
            "mutating AWS calls creating the {late} late Services ({})",
            by_action_text(&adoption.late_mutations)
        ),
        &for_late.to_string(),
        "",
        None,
    );
}

/// `{"A": 1, "B": 3}` as `B 3, A 1`: most calls first.
fn by_action_text(by_action: &BTreeMap<String, u64>) -> String {
    let mut pairs: Vec<(&String, &u64)> = by_action.iter().collect();
    pairs.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let text: Vec<String> = pairs.iter().map(|(a, n)| format!("{a} {n}")).collect();
    text.join(", ")
}

/// The CCM's Lease (its `--leader-elect-resource-*` defaults).
const LEASE_NAMESPACE: &str = "kube-system";
const LEASE_NAME: &str = "cloud-controller-manager";
/// The CCM's default `--leader-elect-retry-period`; acquisition attempts are
/// jittered by up to 20 %, as client-go's.
const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// `failover`, at the end of `steady`: a standby replica (same `args`, its
/// own identity) waits for the Lease, the `leader` is SIGKILLed, and the
/// standby is timed until it holds the Lease and until it has synced every
/// one of `services` once.
async fn failover(
    world: &World,
    leader: Ccm,
    args: &[String],
    services: usize,
    scenario: &str,
    table: &mut Table,
) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(world.api.client().await?, LEASE_NAMESPACE);
    let (holder, lease) = lease_holder(&leases).await?;
    let mut standby = world.ccm(args).await?;
    // A candidate, as its /metrics says (its elector is running), and not
    // the leader.
    standby.wait_leading(false, Duration::from_secs(60)).await?;
    world.proxy.reset_counts();
    let killed = Instant::now();
    leader.kill().await?;
    let (after_kill, _) = lease_holder(&leases).await?;
    if after_kill != holder {
        bail!("the Lease went from {holder:?} to {after_kill:?} before the standby took it");
    }
    // Taken: the Lease names another holder, and the standby says it leads.
    let taken_by = lease + Duration::from_secs(60);
    loop {
        let (now, _) = lease_holder(&leases).await?;
        if !now.is_empty() && now != holder {
            break;
        }
        if killed.elapsed() > taken_by {
            bail!("the Lease still names {now:?} {taken_by:?} after the SIGKILL");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acquired = killed.elapsed();
    standby.wait_leading(true, Duration::from_secs(10)).await?;
    let deadline = Duration::from_secs(300 + services as u64 * 2);
    wait_ensured(&mut standby, services, killed, deadline).await?;
    let synced = killed.elapsed();
    let calls = world.proxy.calls();
    standby.stop().await;
    failover_rows(scenario, lease, acquired, synced, &calls, table);
    Ok(())
}

/// The holder and duration of the CCM's Lease.
async fn lease_holder(leases: &Api<Lease>) -> anyhow::Result<(String, Duration)> {
    let spec = leases
        .get(LEASE_NAME)
        .await
        .with_context(|| format!("reading the Lease {LEASE_NAMESPACE}/{LEASE_NAME}"))?
        .spec
        .unwrap_or_default();
    let seconds = spec
        .lease_duration_seconds
        .with_context(|| format!("the Lease {LEASE_NAME} has no leaseDurationSeconds"))?;
    Ok((
        spec.holder_identity.unwrap_or_default(),
        Duration::from_secs(seconds.max(0) as u64),
    ))
}

/// The rows of `failover`: times from the SIGKILL, and the takeover's calls.
fn failover_rows(
    scenario: &str,
    lease: Duration,
    acquired: Duration,
    synced: Duration,
    calls: &CallCounts,
    table: &mut Table,
) {
    // The leader may renew just before the kill; the standby sees that
    // renewal up to one jittered retry later, and takes the Lease at the
    // first retry after it expired: two retries of up to 1.2 periods.
    let acquire_bound = lease + RETRY_PERIOD.mul_f64(2.0 * 1.2);
    table.judged(
        scenario,
        "standby holds the Lease, from the leader's SIGKILL",
        &secs(acquired),
        &format!(
            "{} (lease duration {} + 2 retry periods of {} with 20 % jitter)",
            secs(acquire_bound),
            secs(lease),
            secs(RETRY_PERIOD)
        ),
        Some(acquired.as_secs_f64() / acquire_bound.as_secs_f64()),
        acquired <= acquire_bound,
    );
    let sync_bound = lease + Duration::from_secs(60);
    table.judged(
        scenario,
        &format!(
            "time until the new leader has synced every Service once, from the SIGKILL \
             ({} after it took the Lease)",
            secs(synced.saturating_sub(acquired))
        ),
        &secs(synced),
        &format!(
            "{} (lease duration {} + 60 s)",
            secs(sync_bound),
            secs(lease)
        ),
        Some(synced.as_secs_f64() / sync_bound.as_secs_f64()),
        synced <= sync_bound,
    );
    let (mutating, by) = mutating_calls(calls);
    table.judged(
        scenario,
        &format!("mutating AWS calls during the takeover {by:?}"),
        &mutating.to_string(),
        "0",
        None,
        mutating == 0,
    );
    for (service, short) in [
        ("elasticloadbalancing", "CLB"),
        ("elasticloadbalancingv2", "ELBv2"),
        ("ec2", "EC2"),
    ] {
        let describes: BTreeMap<String, u64> = calls
            .iter()
            .filter(|(s, a, c)| *s == service && a.starts_with("Describe") && c.received > 0)
            .map(|(_, a, c)| (a.to_string(), c.received))
            .collect();
        table.row(
            scenario,
            &format!(
                "{short} describe calls during the takeover ({})",
                by_action_text(&describes)
            ),
            &describes.values().sum::<u64>().to_string(),
            "",
            None,
        );
    }
    table.judged(
        scenario,
        "throttled responses during the takeover",
        &calls.throttled_total().to_string(),
        "0",
        None,
        calls.throttled_total() == 0,
    );
}

/// Scenario 3: 100 nodes are replaced at once (instances terminated and
/// their Nodes deleted, as an autoscaler does, while as many new instances
/// join tainted) with NLB Services over every node group.
async fn churn(cfg: &Config, table: &mut Table) -> anyhow::Result<()> {
    let n = cfg.sizes(&[1000])[0];
    let services = cfg.churn_services;
    let replaced = 100.min(n / 2);
    let scenario = format!("churn {replaced} of {n}n/{services} NLB");
    let world = World::start(cfg).await?;
    let instances = world.sim_launch(n, CHURN_GROUP).await?;
    let groups = n.div_ceil(CHURN_GROUP).max(1);
    let api = world.nodes().await?;
    register_initialized(&api, &instances).await?;
    let specs = (0..services)
        .map(|i| lb_service(i, i % groups, true))
        .collect::<anyhow::Result<Vec<_>>>()?;
    seed_load_balancers(&world, specs, n, &scenario, table).await?;
    let adoption = adopt(
        &world,
        services,
        &[
            "--controllers=cloud-node,cloud-node-lifecycle,service".into(),
            "--concurrent-service-syncs=8".into(),
            "--aws-api-budget-fraction=1".into(),
        ],
        Vec::new(),
    )
    .await?;
    let mut ccm = adoption.ccm;
    table.qps = Some(ccm.qps);
    let adopt_by = adoption.adopted_mutations;
    let adopt_mut: u64 = adopt_by.values().sum();
    if adopt_mut > 0 {
        bail!("adoption made {adopt_mut} mutating calls: {adopt_by:?}");
    }

    // The replacement: every (n / replaced)-th node goes, and a new instance
    // in the same group takes its place.
    world.proxy.reset_counts();
    let ensured_before = ccm.count_in_log(ENSURED);
    let stride = n / replaced;
    let gone: Vec<&(Instance, usize)> = instances.iter().step_by(stride).take(replaced).collect();
    let mut members: Vec<BTreeSet<String>> = vec![BTreeSet::new(); groups];
    for (inst, g) in &instances {
        members[*g].insert(inst.id.clone());
    }
    let start = Instant::now();
    let mut joined = Vec::new();
    for (inst, g) in &gone {
        world.sim.set_state(&inst.id, "terminated");
        members[*g].remove(&inst.id);
        let (group_id, group_name) = world
            .sim
            .get(&inst.id)
            .and_then(|i| i.security_groups.first().cloned())
            .context("a simulated instance without a group")?;
        let new = world
            .sim
            .launch(&world.sim_template(&group_id, &group_name), 1)
            .remove(0);
        members[*g].insert(new.id.clone());
        joined.push(node_object(
            &new.private_dns_name,
            json!({"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]}),
            &[("group", &format!("g{g}"))],
        )?);
    }
    let deletes = futures::stream::iter(gone.iter().map(|(inst, _)| inst.dns.clone()))
        .map(|name| {
            let api = api.clone();
            async move {
                api.delete(&name, &Default::default()).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>();
    let (deleted, registered) = tokio::join!(deletes, register(&api, joined));
    deleted.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    registered?;

    // Done when every target group holds exactly its group's nodes.
    let elbv2 = aws_sdk_elasticloadbalancingv2::Client::new(&world.moto.sdk_config().await);
    let wanted: BTreeSet<BTreeSet<String>> = members.into_iter().collect();
    let mut pending = target_groups(&elbv2).await?;
    let total_groups = pending.len();
    let deadline = Duration::from_secs(300 + services as u64);
    while !pending.is_empty() && start.elapsed() < deadline {
        let mut still = Vec::new();
        for arn in pending {
            if !wanted.contains(&targets(&elbv2, &arn).await?) {
                still.push(arn);
            }
        }
        pending = still;
        if ccm.exited() {
            bail!("the CCM exited:\n{}", ccm.log_tail());
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    let elapsed = start.elapsed();
    let calls = world.proxy.calls();
    let syncs = ccm.count_in_log(ENSURED) - ensured_before;
    if !pending.is_empty() {
        eprintln!("CCM log tail:\n{}", ccm.log_tail());
    }
    let record_wait = ccm.histogram("aws_ccm_target_record_wait_seconds").await?;
    ccm.stop().await;

    let matched = total_groups - pending.len();
    // The goal is 60 s; AWS's registration bucket (20 burst, 4/s)
    // allows no less than (2 × groups − 20) / 4 s, and where that floor is
    // higher the bound is FLOOR_SLACK × the floor.
    let floor = (2.0 * total_groups as f64 - 20.0).max(0.0) / 4.0;
    let bound = (FLOOR_SLACK * floor).max(60.0);
    table.judged(
        &scenario,
        &format!("time until every target group matches its nodes ({matched}/{total_groups})"),
        &secs(elapsed),
        &format!("60 s (AWS floor {floor:.0} s; met within {bound:.0} s)"),
        Some(elapsed.as_secs_f64() / 60.0),
        pending.is_empty() && elapsed.as_secs_f64() <= bound,
    );
    let per_sync = |count: u64| count as f64 / (syncs.max(1) as f64);
    for action in ["RegisterTargets", "DeregisterTargets"] {
        let count = calls.get("elasticloadbalancingv2", action).received;
        table.row(
            &scenario,
            &format!("{action} calls per target group per sync ({count} calls, {syncs} syncs of {total_groups} groups)"),
            &format!("{:.2}", per_sync(count)),
            "1",
            Some(per_sync(count)),
        );
    }
    // The target record's cost on the write path: each sync that moves
    // targets first waits for its groups' entries to leave the ConfigMap.
    let ms = |s: f64| format!("{:.1} ms", s * 1000.0);
    let changes = record_wait.count;
    if changes == 0 {
        bail!("no target change waited on the target record: is it on?");
    }
    table.row(
        &scenario,
        &format!("target change's wait for the target record, mean of {changes} changes"),
        &ms(record_wait.sum / changes as f64),
        "",
        None,
    );
    table.row(
        &scenario,
        "target change's wait for the target record, p99 (bucket bound)",
        &ms(record_wait.quantile_bound(0.99)),
        "",
        None,
    );
    eprint_throttled("churn", &calls);
    let (mutating, by) = mutating_calls(&calls);
    table.row(
        &scenario,
        &format!("all mutating calls {by:?}"),
        &mutating.to_string(),
        &(2 * total_groups).to_string(),
        Some(mutating as f64 / (2 * total_groups) as f64),
    );
    table.row(
        &scenario,
        "throttled responses",
        &calls.throttled_total().to_string(),
        "0",
        None,
    );
    Ok(())
}

/// Every target group's ARN, straight from moto.
async fn target_groups(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut marker = None;
    loop {
        let page = elbv2
            .describe_target_groups()
            .page_size(400)
            .set_marker(marker)
            .send()
            .await?;
        out.extend(
            page.target_groups()
                .iter()
                .filter_map(|t| t.target_group_arn().map(str::to_string)),
        );
        marker = page.next_marker().map(str::to_string);
        if marker.is_none() {
            return Ok(out);
        }
    }
}

/// The registered targets of one group, straight from moto.
async fn targets(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> anyhow::Result<BTreeSet<String>> {
    Ok(elbv2
        .describe_target_health()
        .target_group_arn(arn)
        .send()
        .await?
        .target_health_descriptions()
        .iter()
        .filter_map(|d| d.target().and_then(|t| t.id()).map(str::to_string))
        .collect())
}

/// Scenario 4: one route per node under the EC2 mutating bucket.
async fn routes(cfg: &Config, n: usize, table: &mut Table) -> anyhow::Result<()> {
    let scenario = format!("routes {n}");
    let world = World::start(cfg).await?;
    let table_id = world
        .ec2
        .create_route_table()
        .vpc_id(&world.vpc)
        .tag_specifications(
            TagSpecification::builder()
                .resource_type(ResourceType::RouteTable)
                .tags(cluster_tag())
                .build(),
        )
        .send()
        .await?
        .route_table
        .and_then(|t| t.route_table_id)
        .context("no route table id")?;
    let (instances, _) = world.launch(n).await?;
    let api = world.nodes().await?;
    // 100.64.0.0/10 in /24s: clear of the VPC's 10.0.0.0/16.
    let nodes = instances
        .iter()
        .enumerate()
        .map(|(i, inst)| {
            let cidr = format!("100.{}.{}.0/24", 64 + i / 256, i % 256);
            node_object(
                &inst.dns,
                json!({"providerID": format!("aws:///{AZ}/{}", inst.id), "podCIDR": cidr, "podCIDRs": [cidr]}),
                &[],
            )
        })
        .collect::<anyhow::Result<Vec<Node>>>()?;
    register(&api, nodes).await?;
    let start = Instant::now();
    let ccm = world
        .ccm(&[
            "--controllers=route".into(),
            "--cluster-cidr=100.64.0.0/10".into(),
            "--route-reconciliation-period=2s".into(),
            format!("--route-table-limit={}", n + 100),
            // The whole bucket, as if the CCM were alone in the account.
            "--aws-api-budget-fraction=1".into(),
        ])
        .await?;
    table.qps = Some(ccm.qps);
    let deadline = Duration::from_secs(120 + n as u64 / 2);
    let mut have = 0;
    while start.elapsed() < deadline {
        let out = world
            .ec2
            .describe_route_tables()
            .route_table_ids(&table_id)
            .send()
            .await?;
        have = out
            .route_tables()
            .iter()
            .flat_map(|t| t.routes())
            .filter(|r| r.instance_id().is_some())
            .count();
        if have >= n {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let elapsed = start.elapsed();
    let calls = world.proxy.calls();
    if have < n {
        eprintln!("CCM log tail:\n{}", ccm.log_tail());
    }
    ccm.stop().await;
    let creates = calls.get("ec2", "CreateRoute").received;
    table.row(
        &scenario,
        "CreateRoute calls",
        &creates.to_string(),
        &n.to_string(),
        Some(creates as f64 / n as f64),
    );
    // Instances launch with the source/destination check on, and routing
    // Pod traffic to an instance needs it off: one ModifyInstanceAttribute
    // per instance, from the same mutating bucket as CreateRoute.
    let modifies = calls.get("ec2", "ModifyInstanceAttribute").received;
    table.row(
        &scenario,
        "ModifyInstanceAttribute calls (source/dest check off)",
        &modifies.to_string(),
        &n.to_string(),
        Some(modifies as f64 / n as f64),
    );
    let bound = (2 * n).saturating_sub(50) as f64 / 5.0;
    table.row(
        &scenario,
        &format!("time until {have}/{n} routes exist"),
        &secs(elapsed),
        &format!("{bound:.0} s ((2N-50)/5 s: 2N mutating calls, 50 burst, 5/s)"),
        (bound > 0.0).then(|| elapsed.as_secs_f64() / bound),
    );
    table.row(
        &scenario,
        "throttled responses",
        &calls.throttled_total().to_string(),
        "0",
        None,
    );
    let _: &Path = world.dir.path();
    Ok(())
}

/// AWS's default "Inbound rules per security group" quota (moto's too).
const RULE_QUOTA: usize = 60;

/// A node-ingress mode of `rules`: its name in the table, its cloud.conf
/// lines, and the inbound rules one node group needs for `n` one-port NLB
/// Services admitting clients from anywhere.
struct IngressMode {
    name: &'static str,
    conf: &'static str,
    needed: fn(usize) -> usize,
    /// Every NLB carries the one group the node group admits: the NLBs
    /// admitted are those carrying it.
    shared: bool,
}

const INGRESS_MODES: [IngressMode; 3] = [
    // The Go CCM's rules: a client rule per NLB (its health check shares
    // the traffic port, which the rule from anywhere covers) and one MTU
    // rule for the one source range.
    IngressMode {
        name: "Cidr (the Go CCM, before)",
        conf: "",
        needed: |n| n + 1,
        shared: false,
    },
    // One rule per NLB admitting its managed group.
    IngressMode {
        name: "LoadBalancerGroup",
        conf: "NLBSecurityGroupMode = Managed\nNLBNodeIngress = LoadBalancerGroup\n",
        needed: |n| n,
        shared: false,
    },
    // One rule admitting the cluster's shared backend group, which every
    // NLB carries.
    IngressMode {
        name: "SharedBackendGroup",
        conf: "NLBSecurityGroupMode = Managed\nNLBNodeIngress = SharedBackendGroup\n",
        needed: |_| 1,
        shared: true,
    },
];

/// Scenario `rules`: inbound rules per node security group with `n` NLB
/// Services all backed by one node (so by one node group), per node-ingress
/// mode, counted from AWS (`DescribeSecurityGroupRules` at moto) once the
/// CCM has synced every Service: each Service's NLB exists and the group
/// holds what it needs or the quota. Setup speed, not a figure: no budget,
/// no latency.
async fn rules(cfg: &Config, table: &mut Table) -> anyhow::Result<()> {
    let picked = |m: &IngressMode| {
        let word = m.name.split(' ').next().unwrap_or(m.name);
        cfg.rules_modes.is_empty() || cfg.rules_modes.iter().any(|w| w == word)
    };
    for mode in INGRESS_MODES.iter().filter(|m| picked(m)) {
        for &n in &cfg.rules_services {
            rules_in_mode(cfg, mode, n, table).await?;
        }
    }
    Ok(())
}

async fn rules_in_mode(
    cfg: &Config,
    mode: &IngressMode,
    n: usize,
    table: &mut Table,
) -> anyhow::Result<()> {
    let scenario = format!("rules {n} NLB");
    let world = World::start(cfg).await?;
    std::fs::write(
        world.dir.path().join("cloud.conf"),
        format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n{}",
            mode.conf
        ),
    )?;
    world.proxy.set_budget_fraction(None);
    world.proxy.set_latency(Duration::ZERO);
    let (instances, _) = world.launch(1).await?;
    let api = world.nodes().await?;
    let nodes = (instances.iter())
        .map(|i| {
            node_object(
                &i.dns,
                json!({"providerID": format!("aws:///{AZ}/{}", i.id)}),
                &[("group", "g0")],
            )
        })
        .collect::<anyhow::Result<Vec<Node>>>()?;
    register(&api, nodes).await?;
    let svc_api: Api<Service> = Api::namespaced(world.api.client().await?, "default");
    for i in 0..n {
        svc_api
            .create(&PostParams::default(), &lb_service(i, 0, true)?)
            .await?;
    }
    let before = sg_rules::inbound_rules(&world.ec2, &world.node_group)
        .await?
        .len();
    let needed = before + (mode.needed)(n);
    let want = needed.min(RULE_QUOTA);
    let elbv2 = aws_sdk_elasticloadbalancingv2::Client::new(&world.moto.sdk_config().await);
    let start = Instant::now();
    let mut ccm = world
        .ccm(&[
            "--controllers=service".into(),
            "--aws-api-budget-fraction=10".into(),
            "--concurrent-service-syncs=8".into(),
            "--kube-api-qps=500".into(),
            "--kube-api-burst=500".into(),
            "--leader-elect=false".into(),
        ])
        .await?;
    table.qps = Some(ccm.qps);
    let deadline = Duration::from_secs(120 + n as u64);
    let (mut lbs, mut held) = (0, Vec::new());
    while start.elapsed() < deadline {
        lbs = load_balancer_count(&elbv2).await?;
        held = sg_rules::inbound_rules(&world.ec2, &world.node_group).await?;
        if lbs == n && held.len() == want {
            break;
        }
        if ccm.exited() {
            bail!("the CCM exited:\n{}", ccm.log_tail());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    ccm.stop().await;
    let from_groups = held.iter().filter(|(s, _)| s.starts_with("sg-")).count();
    let admitted = if mode.shared {
        let sources: Vec<&str> = (held.iter())
            .filter(|(s, _)| s.starts_with("sg-"))
            .map(|(s, _)| s.as_str())
            .collect();
        match sources[..] {
            [group] => carrying(&elbv2, group).await?,
            _ => 0,
        }
    } else if from_groups > 0 {
        from_groups
    } else {
        // Every client rule and the MTU rule come from 0.0.0.0/0: the NLBs
        // admitted are the rules less the MTU rule.
        held.len().saturating_sub(before + 1)
    };
    table.judged(
        &scenario,
        &format!("rules per node group, {}", mode.name),
        &format!(
            "{} (needs {needed}; {admitted}/{n} NLBs admitted; quota {RULE_QUOTA})",
            held.len()
        ),
        &format!("{want} = min(needs, quota), {n} NLBs"),
        None,
        lbs == n && held.len() == want && (!mode.shared || admitted == n),
    );
    Ok(())
}

/// The load balancers moto holds that carry security group `group`.
async fn carrying(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
    group: &str,
) -> anyhow::Result<usize> {
    let mut count = 0;
    let mut marker = None;
    loop {
        let page = elbv2
            .describe_load_balancers()
            .page_size(400)
            .set_marker(marker)
            .send()
            .await?;
        count += (page.load_balancers().iter())
            .filter(|l| l.security_groups().iter().any(|g| g == group))
            .count();
        marker = page.next_marker().map(str::to_string);
        if marker.is_none() {
            return Ok(count);
        }
    }
}

/// The load balancers moto holds.
async fn load_balancer_count(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
) -> anyhow::Result<usize> {
    let mut count = 0;
    let mut marker = None;
    loop {
        let page = elbv2
            .describe_load_balancers()
            .page_size(400)
            .set_marker(marker)
            .send()
            .await?;
        count += page.load_balancers().len();
        marker = page.next_marker().map(str::to_string);
        if marker.is_none() {
            return Ok(count);
        }
    }
}
