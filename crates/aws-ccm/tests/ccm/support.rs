//! Starting the real binary against the test servers, and waiting on what it does.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use ccm_testkit::apiserver::rbac::RECORD_KUBE_ENV;
use ccm_testkit::apiserver::{NonResourceGrant, ServerOptions, Subject, TestApiServer, TokenUser};
use ccm_testkit::aws_proxy::{FaultProxy, ProxyConfig};
use ccm_testkit::moto::Moto;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub const BINARY: &str = env!("CARGO_BIN_EXE_aws-cloud-controller-manager");
pub const CLUSTER_ID: &str = "ccm-test";
pub const REGION: &str = "us-east-1";
/// A bearer token the API test server of [`Env`] accepts for a user that
/// may `get` `/metrics` (the CCM checks it with TokenReview and
/// SubjectAccessReview); [`https_get`] sends it.
pub const SCRAPE_TOKEN: &str = "ccm-test-metrics-scraper";
/// Who [`SCRAPE_TOKEN`] is.
pub const SCRAPER: &str = "system:serviceaccount:monitoring:prometheus";
/// The bearer token of the CCM's kubeconfig: the API test server takes it
/// for the service account `kube-system/cloud-controller-manager`, whose
/// requests it authorizes by `manifests/base/rbac.yaml` (403 otherwise).
pub const CCM_TOKEN: &str = "ccm-test-cloud-controller-manager";
/// The service account the CCM runs as.
pub const CCM_SERVICE_ACCOUNT: (&str, &str) = ("kube-system", "cloud-controller-manager");

/// The API test server every CCM test uses: RBAC of
/// `manifests/base/rbac.yaml` enforced on the CCM's service account, whose
/// requests are recorded for the RBAC coverage test when
/// `AWS_CCM_RECORD_KUBE_REQUESTS` names a directory.
/// `options` add other settings (watch drops, compaction, lag).
pub async fn api_server(options: ServerOptions) -> anyhow::Result<TestApiServer> {
    let path = ccm_testkit::repo_path("manifests/base/rbac.yaml");
    let policy =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let api = TestApiServer::start_with(ServerOptions {
        rbac_policy: Some(policy),
        record_dir: std::env::var_os(RECORD_KUBE_ENV)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from),
        ..options
    })
    .await?;
    api.add_token(
        CCM_TOKEN,
        TokenUser::service_account(CCM_SERVICE_ACCOUNT.0, CCM_SERVICE_ACCOUNT.1),
    );
    Ok(api)
}

/// Polls `check` until it returns `Some`, or fails after `deadline`.
pub async fn eventually<T, F, Fut>(
    what: &str,
    deadline: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if start.elapsed() > deadline {
            bail!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long [`Env::finish`] lets a running CCM finish what it is deleting.
pub const ORPHAN_AUDIT_PATIENCE: Duration = Duration::from_secs(30);

/// A port that was free a moment ago on 127.0.0.1, chosen below Linux's
/// ephemeral range (32768 and up by default): a port the kernel handed out
/// for the check was free again for the next outgoing connection of any
/// test, which took it before the CCM bound it (`Address already in use`,
/// seen with six tests on two cores). Two tests can still pick one port in
/// the same instant; [`Ccm::spawn`] starts again on another then.
pub fn free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::rng();
    loop {
        let port = rng.random_range(10_000..32_768);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// How many times [`Ccm::spawn`] starts the CCM on a fresh port when the
/// one it was given was taken.
const PORT_TRIES: usize = 5;

/// A Kubernetes API test server, moto, and the files the CCM reads.
pub struct Env {
    pub api: TestApiServer,
    pub moto: Moto,
    /// A pass-through proxy in front of moto that `start_ccm` sends the
    /// CCM's calls through, so the IAM coverage test sees them (it records
    /// when `AWS_CCM_RECORD_ACTIONS` is set).
    pub proxy: FaultProxy,
    /// A pass-through proxy in front of moto that no test breaks, for the
    /// tests' own library reads ([`aws_client`], the orphan audit): they
    /// get AWS's answers where the proxy corrects moto's (a target group's
    /// load balancer links), as `aws-ccm orphans` would on AWS.
    reads: FaultProxy,
    /// Holds the kubeconfig and cloud.conf; removed on drop.
    #[allow(dead_code)]
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub cloud_conf: PathBuf,
    /// The `--cluster-cidr` a CCM of this world was started with: the
    /// orphan audit of [`Env::finish`] then checks routes too.
    cluster_cidr: Mutex<Option<String>>,
}

impl Env {
    pub async fn start() -> anyhow::Result<Env> {
        Env::start_with_conf(&format!(
            "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\n"
        ))
        .await
    }

    pub async fn start_with_conf(cloud_conf: &str) -> anyhow::Result<Env> {
        Env::start_with(cloud_conf, ServerOptions::default()).await
    }

    /// [`Env::start_with_conf`] with an API test server of these settings.
    pub async fn start_with(cloud_conf: &str, api: ServerOptions) -> anyhow::Result<Env> {
        let (api, moto) = tokio::try_join!(api_server(api), Moto::start())?;
        api.add_token(SCRAPE_TOKEN, TokenUser::new(SCRAPER));
        api.grant(NonResourceGrant::new(
            Subject::User(SCRAPER.into()),
            &["get"],
            &["/metrics"],
        ));
        let proxy = FaultProxy::start(&moto.endpoint(), ProxyConfig::default()).await?;
        let reads = FaultProxy::start(&moto.endpoint(), ProxyConfig::default()).await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml_with_token(CCM_TOKEN))
            .with_context(|| format!("writing {}", kubeconfig.display()))?;
        let cloud_conf_path = dir.path().join("cloud.conf");
        std::fs::write(&cloud_conf_path, cloud_conf)?;
        Ok(Env {
            api,
            moto,
            proxy,
            reads,
            dir,
            kubeconfig,
            cloud_conf: cloud_conf_path,
            cluster_cidr: Mutex::new(None),
        })
    }

    /// The orphan audit every integration test ends with (issue 18;
    /// `scripts/check-orphan-audit.py` checks that each one does): what
    /// `aws-ccm orphans` (the library's `ops::orphans::find`) finds over
    /// the live Services and Nodes must be nothing. A CCM still at work
    /// may be finishing a deletion, so the audit waits up to
    /// [`ORPHAN_AUDIT_PATIENCE`] for the world to come to rest; a leak
    /// never does. Fails with each orphan's ID and how it was recognised.
    pub async fn finish(self) -> anyhow::Result<()> {
        let start = tokio::time::Instant::now();
        loop {
            let found = self.orphans().await?;
            if found.is_empty() {
                return Ok(());
            }
            if start.elapsed() > ORPHAN_AUDIT_PATIENCE {
                bail!(
                    "the orphan audit found resources of this cluster that belong to no live Service or Node: {found:#?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What `aws-ccm orphans` finds in this world, one line per orphan.
    /// Routes are audited when a CCM was started with `--cluster-cidr`.
    pub async fn orphans(&self) -> anyhow::Result<Vec<String>> {
        use aws_ccm::ops::orphans;
        let live = orphans::Live::read(&self.api.client().await?).await?;
        let cidr = self
            .cluster_cidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let routes = match cidr {
            Some(cidr) => Some(orphans::RouteScope {
                selector: aws_ccm::provider::routes::RouteTableSelector {
                    route_table_id: None,
                    vpc_id: None,
                    cluster_id: CLUSTER_ID.into(),
                },
                cluster_cidrs: aws_ccm::options::cidrs::ClusterCidrs::parse(&cidr, "test")?,
            }),
            None => None,
        };
        let scope = orphans::Scope {
            cluster_id: CLUSTER_ID.into(),
            routes,
        };
        Ok(orphans::find(&aws_client(self).await, &live, &scope)
            .await?
            .orphans
            .into_iter()
            .map(|o| format!("{} {}: {}", o.kind.as_str(), o.id, o.recognised))
            .collect())
    }

    /// SDK configuration for the tests' own calls (seeding, assertions):
    /// moto through the `reads` proxy, so reads meet AWS's answers.
    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        ccm_testkit::moto::test_sdk_config(&self.reads.endpoint()).await
    }

    /// The flags every test passes; timings shortened so tests finish quickly.
    pub fn base_args(&self) -> Vec<String> {
        vec![
            "--cloud-provider=aws".into(),
            format!("--cloud-config={}", self.cloud_conf.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            // 0 would disable the server (as upstream), so pick a free port.
            format!("--secure-port={}", free_port()),
            "--leader-elect-lease-duration=3s".into(),
            "--leader-elect-renew-deadline=2s".into(),
            "--leader-elect-retry-period=500ms".into(),
            // Each Service's resync slot falls at a point of the period set
            // by its UID: at the default hour, a test counting calls meets
            // one about once in a few hundred runs (a full ensure it did not
            // ask for). Tests of the resync give their own period; the later
            // flag wins, as with pflag.
            "--service-resync-period=87600h".into(),
        ]
    }

    pub fn aws_env(&self) -> Vec<(String, String)> {
        self.aws_env_for(&self.proxy.endpoint())
    }

    /// The AWS environment with another endpoint (e.g. a `FaultProxy` in
    /// front of moto).
    pub fn aws_env_for(&self, endpoint: &str) -> Vec<(String, String)> {
        vec![
            ("AWS_ENDPOINT_URL".into(), endpoint.to_string()),
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
        ]
    }

    /// Starts the CCM with AWS reached through the pass-through proxy.
    pub async fn start_ccm(&self, extra: &[&str]) -> anyhow::Result<Ccm> {
        self.start_ccm_via(&self.proxy.endpoint(), extra).await
    }

    /// A proxy to this environment's moto enforcing AWS's documented API
    /// rate buckets at full size.
    pub async fn full_budget_proxy(&self) -> anyhow::Result<FaultProxy> {
        let config = ProxyConfig {
            budget_fraction: Some(1.0),
            ..ProxyConfig::default()
        };
        FaultProxy::start(&self.moto.endpoint(), config).await
    }

    /// Starts the CCM behind a fault proxy of its own in front of moto, so
    /// its calls are counted (with their parameters) apart from the
    /// seeding's.
    pub async fn start_counted_ccm(&self, extra: &[&str]) -> anyhow::Result<(FaultProxy, Ccm)> {
        let proxy = FaultProxy::start(&self.moto.endpoint(), ProxyConfig::default()).await?;
        proxy.record_requests(true);
        let ccm = self.start_ccm_via(&proxy.endpoint(), extra).await?;
        Ok((proxy, ccm))
    }

    /// Starts the CCM with AWS calls sent to `endpoint` (e.g. a `FaultProxy`
    /// in front of moto, to count or break calls).
    pub async fn start_ccm_via(&self, endpoint: &str, extra: &[&str]) -> anyhow::Result<Ccm> {
        let mut args = self.base_args();
        args.extend(extra.iter().map(|s| s.to_string()));
        if let Some(cidr) = routes_cidr(extra) {
            *self.cluster_cidr.lock().unwrap_or_else(|p| p.into_inner()) = Some(cidr.to_string());
        }
        Ccm::spawn(&args, &self.aws_env_for(endpoint)).await
    }
}

/// The `--cluster-cidr` of a CCM whose route controller runs with these
/// flags (the `--controllers` default has it; `--configure-cloud-routes`
/// defaults to true).
fn routes_cidr<'a>(flags: &[&'a str]) -> Option<&'a str> {
    let value = |name: &str| flags.iter().rev().find_map(|f| f.strip_prefix(name));
    let routes_off = value("--configure-cloud-routes=") == Some("false");
    let route_controller = value("--controllers=").is_none_or(|list| {
        list.split(',')
            .any(|c| c == "route" || (c == "*" && !list.contains("-route")))
    });
    value("--cluster-cidr=").filter(|_| route_controller && !routes_off)
}

/// Appends every line `stream` yields to `sink`.
async fn collect_lines(stream: impl tokio::io::AsyncRead + Unpin, sink: Arc<Mutex<String>>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut buf = sink.lock().unwrap_or_else(|p| p.into_inner());
        buf.push_str(&line);
        buf.push('\n');
    }
}

/// The CCM as a child process, with its stderr and stdout collected for
/// assertions.
pub struct Ccm {
    child: Child,
    logs: Arc<Mutex<String>>,
    /// The tasks reading stderr and stdout; done once the pipes close.
    readers: Vec<tokio::task::JoinHandle<()>>,
}

impl Ccm {
    /// Starts the binary with `RUST_LOG=info,aws_ccm=debug` unless `env`
    /// sets it (an empty `RUST_LOG` counts as unset: `--v` decides). Its
    /// stderr and stdout both go to [`Ccm::logs`].
    ///
    /// With a `--secure-port` of its own (the last one given, not 0) it
    /// waits until the CCM serves on it, and starts it again on a fresh
    /// port when another process took that one first.
    pub async fn spawn(args: &[String], env: &[(String, String)]) -> anyhow::Result<Ccm> {
        let mut args = args.to_vec();
        for _ in 1..PORT_TRIES {
            let mut ccm = Ccm::start(&args, env)?;
            if !ccm.lost_its_port(&args).await? {
                return Ok(ccm);
            }
            let port = args
                .iter_mut()
                .rev()
                .find(|a| a.starts_with("--secure-port="));
            if let Some(flag) = port {
                *flag = format!("--secure-port={}", free_port());
            }
        }
        Ccm::start(&args, env)
    }

    /// Whether the CCM started with `args` exited because its HTTPS port
    /// was taken; false once it serves, or after 30 s either way.
    async fn lost_its_port(&mut self, args: &[String]) -> anyhow::Result<bool> {
        let port = args
            .iter()
            .rev()
            .find_map(|a| a.strip_prefix("--secure-port="));
        if port.is_none_or(|p| p == "0") {
            return Ok(false);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            if self.logs().contains("serving securely on ") {
                return Ok(false);
            }
            if self.child.try_wait()?.is_some() {
                self.wait_exit(Duration::from_secs(5)).await?;
                return Ok(self.logs().contains("Address already in use"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(false)
    }

    /// Starts the binary once (see [`Ccm::spawn`]).
    fn start(args: &[String], env: &[(String, String)]) -> anyhow::Result<Ccm> {
        let mut cmd = Command::new(BINARY);
        cmd.args(args)
            .env("RUST_LOG", "info,aws_ccm=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().with_context(|| format!("spawning {BINARY}"))?;
        let logs = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().context("no stderr")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let readers = vec![
            tokio::spawn(collect_lines(stderr, logs.clone())),
            tokio::spawn(collect_lines(stdout, logs.clone())),
        ];
        Ok(Ccm {
            child,
            logs,
            readers,
        })
    }

    pub fn logs(&self) -> String {
        self.logs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub async fn wait_for_log(&self, needle: &str, deadline: Duration) -> anyhow::Result<()> {
        eventually(
            &format!("log line containing {needle:?}"),
            deadline,
            || async { self.logs().contains(needle).then_some(()) },
        )
        .await
        .with_context(|| format!("logs so far:\n{}", self.logs()))
    }

    /// Waits until at least `n` Services' last sync finished in full, as
    /// the CCM's `/metrics` counts them (`aws_ccm_service_sync_state`,
    /// state `synced`): an outcome, not a log line.
    pub async fn wait_synced(&self, n: u64, deadline: Duration) -> anyhow::Result<()> {
        const SYNCED: &str = "aws_ccm_service_sync_state{state=\"synced\",error_class=\"none\"} ";
        let addr = self.https_addr().await?;
        eventually(&format!("{n} Service(s) synced"), deadline, || async {
            let (status, body) = https_get(&addr, "/metrics").await.ok()?;
            let synced: u64 = (body.lines().find_map(|l| l.strip_prefix(SYNCED)))?
                .trim()
                .parse()
                .ok()?;
            (status == 200 && synced >= n).then_some(())
        })
        .await
        .with_context(|| format!("logs so far:\n{}", self.logs()))
    }

    /// The address of the HTTPS server, from its start-up log line.
    pub async fn https_addr(&self) -> anyhow::Result<String> {
        self.wait_for_log("serving securely on ", Duration::from_secs(20))
            .await?;
        let logs = self.logs();
        let rest = logs
            .split("serving securely on ")
            .nth(1)
            .context("no address")?;
        Ok(rest
            .split_whitespace()
            .next()
            .context("no address")?
            .to_string())
    }

    pub fn pid(&self) -> Option<i32> {
        self.child.id().map(|p| p as i32)
    }

    pub fn signal(&self, signal: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: sending a signal to our own child process.
            unsafe {
                libc::kill(pid, signal);
            }
        }
    }

    /// Waits for the process to exit and for its output to be read to the
    /// end, so [`Ccm::logs`] then holds every line it wrote.
    pub async fn wait_exit(&mut self, deadline: Duration) -> anyhow::Result<ExitStatus> {
        let status = tokio::time::timeout(deadline, self.child.wait())
            .await
            .with_context(|| {
                format!(
                    "process did not exit within {deadline:?}; logs:\n{}",
                    self.logs()
                )
            })?
            .context("waiting for the process")?;
        for reader in self.readers.drain(..) {
            tokio::time::timeout(deadline, reader)
                .await
                .context("the process's output pipes did not close after it exited")?
                .context("reading the process's output")?;
        }
        Ok(status)
    }

    /// Runs the binary to completion (for start-up failures).
    pub async fn run_to_exit(
        args: &[String],
        env: &[(String, String)],
    ) -> anyhow::Result<(ExitStatus, String)> {
        let mut ccm = Ccm::spawn(args, env).await?;
        let status = ccm.wait_exit(Duration::from_secs(30)).await?;
        // Let the reader drain the pipe after exit.
        let logs = eventually("stderr to close", Duration::from_secs(5), || async {
            let l = ccm.logs();
            (!l.is_empty()).then_some(l)
        })
        .await
        .unwrap_or_default();
        Ok((status, logs))
    }
}

/// GET over HTTPS with [`SCRAPE_TOKEN`], accepting the CCM's self-signed certificate.
pub async fn https_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    https_get_as(addr, path, Some(SCRAPE_TOKEN)).await
}

/// GET over HTTPS with this bearer token, or none.
pub async fn https_get_as(
    addr: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    ccm_testkit::tls::https_get(addr, path, token).await
}

/// The CCM's `/metrics` once every needle is in it. A metric is recorded
/// after the write it measures returns, so a test that has seen the write
/// waits for the figure rather than reading it once.
pub async fn metrics_with(
    addr: &str,
    needles: &[&str],
    deadline: Duration,
) -> anyhow::Result<String> {
    let last = std::sync::Mutex::new(String::new());
    let found = eventually("metrics on /metrics", deadline, || async {
        let (status, body) = https_get(addr, "/metrics").await.ok()?;
        let done = status == 200 && needles.iter().all(|n| body.contains(n));
        *last.lock().unwrap_or_else(|p| p.into_inner()) = body.clone();
        done.then_some(body)
    })
    .await;
    found.map_err(|e| {
        let body = last.into_inner().unwrap_or_else(|p| p.into_inner());
        let missing: Vec<_> = needles.iter().filter(|n| !body.contains(**n)).collect();
        e.context(format!("missing {missing:?} in:\n{body}"))
    })
}

/// The `/metrics` line of a controller running in this process.
pub fn controller_running(name: &str) -> String {
    format!("aws_ccm_controller_running{{controller=\"{name}\"}} 1")
}

/// Waits until `ccm`'s `/metrics` says controller `name` (its canonical
/// name, `service-lb-controller`, ...) runs: from what it serves rather
/// than from its log.
pub async fn wait_controller_running(
    ccm: &Ccm,
    name: &str,
    deadline: Duration,
) -> anyhow::Result<String> {
    let addr = ccm.https_addr().await?;
    metrics_with(&addr, &[&controller_running(name)], deadline).await
}

/// Waits until `ccm`'s start-up permission self-check has run and returns
/// what `/metrics` says it found (`aws_ccm_iam_self_check_problems`: denied
/// writes plus missing actions).
pub async fn self_check_problems(ccm: &Ccm, deadline: Duration) -> anyhow::Result<u64> {
    const NAME: &str = "aws_ccm_iam_self_check_problems ";
    let addr = ccm.https_addr().await?;
    let body = metrics_with(&addr, &[NAME], deadline).await?;
    let value = body
        .lines()
        .find_map(|l| l.strip_prefix(NAME))
        .ok_or_else(|| anyhow::anyhow!("no {NAME}sample in {body}"))?;
    Ok(value.trim().parse()?)
}

/// Who holds the CCM's leader Lease, as the API server has it; `None`
/// while nobody does.
pub async fn lease_holder(env: &Env) -> Option<String> {
    let client = env.api.client().await.ok()?;
    let lease =
        kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client, "kube-system")
            .get_opt("cloud-controller-manager")
            .await
            .ok()??;
    lease.spec?.holder_identity.filter(|h| !h.is_empty())
}

/// Waits until `ccm`'s `/metrics` says it leads (`leading`), or that it is
/// a candidate that does not (its elector is running): whether a replica
/// leads, from what it serves rather than from its log.
pub async fn wait_leading(ccm: &Ccm, leading: bool, deadline: Duration) -> anyhow::Result<()> {
    let addr = ccm.https_addr().await?;
    let status = format!(
        "leader_election_master_status{{name=\"cloud-controller-manager\"}} {}",
        u8::from(leading)
    );
    metrics_with(&addr, &[&status], deadline).await.map(|_| ())
}

/// Tags for a resource created by test seeding (`TagSpecifications`).
pub fn tags(
    resource: aws_sdk_ec2::types::ResourceType,
    pairs: &[(&str, &str)],
) -> aws_sdk_ec2::types::TagSpecification {
    aws_sdk_ec2::types::TagSpecification::builder()
        .resource_type(resource)
        .set_tags(Some(
            pairs
                .iter()
                .map(|(k, v)| aws_sdk_ec2::types::Tag::builder().key(*k).value(*v).build())
                .collect(),
        ))
        .build()
}

/// What [`seed_cluster`] made in moto.
pub struct Seeded {
    pub conf: aws_config::SdkConfig,
    pub ec2: aws_sdk_ec2::Client,
    pub vpc: String,
    pub subnet: String,
    pub node_group: String,
    pub instances: Vec<String>,
}

impl Seeded {
    /// Launches `count` more cluster-tagged node instances.
    pub async fn launch(&self, count: i32) -> anyhow::Result<Vec<String>> {
        self.launch_in(&self.node_group, count).await
    }

    /// Another cluster-tagged node security group, named `name`.
    pub async fn node_group_named(&self, name: &str) -> anyhow::Result<String> {
        let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
        let group = self
            .ec2
            .create_security_group()
            .group_name(name)
            .description(name)
            .vpc_id(&self.vpc)
            .tag_specifications(tags(
                aws_sdk_ec2::types::ResourceType::SecurityGroup,
                &[(&cluster_tag, "owned")],
            ))
            .send()
            .await?;
        Ok(group.group_id().unwrap_or_default().to_string())
    }

    /// Launches `count` cluster-tagged node instances in security group `group`.
    pub async fn launch_in(&self, group: &str, count: i32) -> anyhow::Result<Vec<String>> {
        let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
        let run = self
            .ec2
            .run_instances()
            .image_id(ccm_testkit::moto::AMI)
            .min_count(count)
            .max_count(count)
            .subnet_id(&self.subnet)
            .security_group_ids(group)
            .tag_specifications(tags(
                aws_sdk_ec2::types::ResourceType::Instance,
                &[(&cluster_tag, "owned")],
            ))
            .send()
            .await?;
        Ok(run
            .instances()
            .iter()
            .map(|i| i.instance_id().unwrap().to_string())
            .collect())
    }
}

/// A VPC with one public subnet (10.0.1.0/24), a cluster-tagged node group
/// and `nodes` node instances.
pub async fn seed_cluster(env: &Env, nodes: i32) -> anyhow::Result<Seeded> {
    let conf = env.sdk_config().await;
    let ec2 = aws_sdk_ec2::Client::new(&conf);
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER_ID}");
    let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await?;
    let vpc_id = vpc.vpc().and_then(|v| v.vpc_id()).unwrap().to_string();
    let subnet = ec2
        .create_subnet()
        .vpc_id(&vpc_id)
        .cidr_block("10.0.1.0/24")
        .availability_zone("us-east-1a")
        .tag_specifications(tags(
            aws_sdk_ec2::types::ResourceType::Subnet,
            &[(&cluster_tag, "shared"), ("kubernetes.io/role/elb", "1")],
        ))
        .send()
        .await?;
    let subnet_id = subnet
        .subnet()
        .and_then(|s| s.subnet_id())
        .unwrap()
        .to_string();
    let igw = ec2.create_internet_gateway().send().await?;
    let igw_id = igw
        .internet_gateway()
        .and_then(|g| g.internet_gateway_id())
        .unwrap()
        .to_string();
    ec2.attach_internet_gateway()
        .vpc_id(&vpc_id)
        .internet_gateway_id(&igw_id)
        .send()
        .await?;
    let tables = ec2
        .describe_route_tables()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("vpc-id")
                .values(&vpc_id)
                .build(),
        )
        .send()
        .await?;
    let main = tables.route_tables()[0]
        .route_table_id()
        .unwrap()
        .to_string();
    ec2.create_route()
        .route_table_id(&main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw_id)
        .send()
        .await?;
    let mut seeded = Seeded {
        conf,
        ec2,
        vpc: vpc_id,
        subnet: subnet_id,
        node_group: String::new(),
        instances: Vec::new(),
    };
    seeded.node_group = seeded.node_group_named("nodes").await?;
    seeded.instances = seeded.launch(nodes).await?;
    Ok(seeded)
}

/// Mutating AWS calls `proxy` saw, by `service:action`, attempts counted:
/// what the Operation table calls mutating (`DryRun` permission checks,
/// counted as `Action+DryRun`, are not).
pub fn mutations(proxy: &FaultProxy) -> std::collections::BTreeMap<String, u64> {
    proxy
        .calls()
        .iter()
        .filter(|(service, action, c)| {
            c.received > 0
                && aws_ccm::aws::Operation::from_names(service, action)
                    .is_some_and(|op| op.is_mutating())
        })
        .map(|(service, action, c)| (format!("{service}:{action}"), c.received))
        .collect()
}

/// The library's AWS client (the one door) for moto, through a proxy that
/// answers as AWS does, for tests that call the library directly (e.g. the
/// orphan audit).
pub async fn aws_client(env: &Env) -> aws_ccm::aws::Aws {
    aws_client_via(env, &env.reads.endpoint()).await
}

/// The library's AWS client with its calls sent to `endpoint` (a proxy in
/// front of moto, to count them).
pub async fn aws_client_via(env: &Env, endpoint: &str) -> aws_ccm::aws::Aws {
    let config = env
        .moto
        .sdk_config()
        .await
        .to_builder()
        .endpoint_url(endpoint)
        .retry_config(aws_config::retry::RetryConfig::disabled())
        .build();
    aws_ccm::aws::Aws::new(
        aws_ccm::aws::SdkClients {
            ec2: aws_sdk_ec2::Client::new(&config),
            elb: aws_sdk_elasticloadbalancing::Client::new(&config),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&config),
            sts: aws_sdk_sts::Client::new(&config),
            iam: aws_sdk_iam::Client::new(&config),
        },
        CLUSTER_ID.into(),
        aws_ccm::aws::ClientOptions::default(),
        aws_ccm::aws::AwsSettings::default(),
    )
}

/// The NLB target groups whose registered targets (draining ones aside,
/// as the CCM reads them) are not `want`, each with what it holds.
pub async fn groups_not_holding(
    seeded: &Seeded,
    want: &std::collections::BTreeSet<String>,
) -> anyhow::Result<Vec<String>> {
    let v2 = aws_sdk_elasticloadbalancingv2::Client::new(&seeded.conf);
    let pages: Vec<_> = v2
        .describe_target_groups()
        .into_paginator()
        .send()
        .collect::<Result<Vec<_>, _>>()
        .await?;
    let mut wrong = Vec::new();
    for g in pages.iter().flat_map(|p| p.target_groups()) {
        let health = v2
            .describe_target_health()
            .target_group_arn(g.target_group_arn().unwrap_or_default())
            .send()
            .await?;
        let port = g.port().unwrap_or_default();
        let have = aws_ccm::aws::nlb::read::registered(health.target_health_descriptions(), port);
        if have != *want {
            wrong.push(format!(
                "{} holds {have:?}",
                g.target_group_name().unwrap_or_default()
            ));
        }
    }
    Ok(wrong)
}
