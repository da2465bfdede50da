//! Credentials (issue 16): no secret reaches the log at any verbosity, and
//! cloud.conf's `RoleARN` is assumed through the client layer, once, and
//! signs the CCM's calls.
//!
//! The CCM is pointed at a [`Sniffer`] in front of the fault proxy: it sees
//! each request's signing access key and the credentials STS returns, which
//! neither moto nor the proxy keep.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use ccm_testkit::aws_proxy::{FaultKind, FaultRule};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::support::*;

const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";

/// One request the sniffer passed on.
#[derive(Clone, Debug)]
struct Seen {
    action: String,
    /// The access key in the SigV4 `Authorization` header (None: unsigned).
    access_key: Option<String>,
    user_agent: String,
    /// The SDK's `amz-sdk-request` header: `attempt=N; max=M`.
    sdk_request: String,
    status: u16,
    response: String,
}

/// Credentials an STS answer carried.
#[derive(Clone, Debug)]
struct StsCredentials {
    access_key: String,
    secret_key: String,
    session_token: String,
}

impl Seen {
    fn credentials(&self) -> Option<StsCredentials> {
        Some(StsCredentials {
            access_key: xml_text(&self.response, "AccessKeyId")?,
            secret_key: xml_text(&self.response, "SecretAccessKey")?,
            session_token: xml_text(&self.response, "SessionToken")?,
        })
    }
}

fn xml_text(xml: &str, element: &str) -> Option<String> {
    let open = format!("<{element}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&format!("</{element}>"))?;
    Some(xml[start..start + len].to_string())
}

/// A pass-through HTTP forwarder that notes what it forwards.
struct Sniffer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for Sniffer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Sniffer {
    async fn start(upstream: String) -> anyhow::Result<Sniffer> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (client, log, upstream) = (client.clone(), log.clone(), upstream.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        forward(client.clone(), upstream.clone(), log.clone(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Sniffer { addr, seen, task })
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self, action: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .filter(|s| s.action == action)
            .cloned()
            .collect()
    }

    fn all(&self) -> Vec<Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn forward(
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: String,
    log: Arc<Mutex<Vec<Seen>>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let form = |text: &str| {
        form_urlencoded::parse(text.as_bytes())
            .find(|(k, _)| k == "Action")
            .map(|(_, v)| v.into_owned())
    };
    let action = form(&String::from_utf8_lossy(&body))
        .or_else(|| form(parts.uri.query().unwrap_or_default()))
        .unwrap_or_default();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let access_key = header("authorization")
        .split("Credential=")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .map(str::to_string);
    let user_agent = format!("{} {}", header("user-agent"), header("x-amz-user-agent"));
    let sdk_request = header("amz-sdk-request");
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = match format!("{upstream}{path}").parse() {
        Ok(uri) => uri,
        Err(_) => return Ok(status_only(StatusCode::BAD_REQUEST)),
    };
    let Ok(answer) = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
    else {
        return Ok(status_only(StatusCode::BAD_GATEWAY));
    };
    let (parts, body) = answer.into_parts();
    let body = body.collect().await?.to_bytes();
    log.lock().unwrap_or_else(|p| p.into_inner()).push(Seen {
        action,
        access_key,
        user_agent,
        sdk_request,
        status: parts.status.as_u16(),
        response: String::from_utf8_lossy(&body).into_owned(),
    });
    Ok(Response::from_parts(parts, Full::new(body)))
}

fn status_only(status: StatusCode) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    response
}

/// One cluster instance in moto and its node, registered as a kubelet with
/// `--cloud-provider=external` does; returns the node API and name.
async fn register_node_with_instance(env: &Env) -> anyhow::Result<(Api<Node>, String)> {
    let seeded = seed_cluster(env, 1).await?;
    let id = seeded.instances[0].clone();
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-1"},
        "spec": {
            "providerID": format!("aws:///us-east-1a/{id}"),
            "taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}],
        },
    }))?;
    let api = Api::<Node>::all(env.api.client().await?);
    api.create(&PostParams::default(), &node)
        .await
        .context("creating node-1")?;
    Ok((api, "node-1".to_string()))
}

/// Waits until the CCM initialized the node: it called EC2 successfully.
async fn wait_initialized(api: &Api<Node>, name: &str, ccm: &Ccm) -> anyhow::Result<()> {
    eventually("node initialized", Duration::from_secs(60), || async {
        let node = api.get_opt(name).await.ok().flatten()?;
        let tainted = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == UNINITIALIZED));
        (!tainted).then_some(())
    })
    .await
    .with_context(|| format!("CCM logs:\n{}", tail(&ccm.logs(), 60)))
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The AWS environment of a pod with IRSA: no static keys, a role and a
/// web-identity token file; every endpoint at `endpoint`.
fn irsa_env(endpoint: &str, token_file: &std::path::Path) -> Vec<(String, String)> {
    [
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/irsa-ccm"),
        ("AWS_ROLE_SESSION_NAME", "ccm-test"),
        (
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            &token_file.display().to_string(),
        ),
        // Blank keys count as absent; no profile files to fall back on.
        ("AWS_ACCESS_KEY_ID", ""),
        ("AWS_SECRET_ACCESS_KEY", ""),
        ("AWS_SESSION_TOKEN", ""),
        ("AWS_CONFIG_FILE", "/nonexistent/aws-config"),
        (
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws-credentials",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Runs the CCM with IRSA at the highest verbosity (`extra_env` picks how)
/// until it initialized a node with the web-identity credentials, then
/// looks for the token and the credentials STS returned in its output.
async fn no_secret_in_the_log(flags: &[&str], rust_log: &str) -> anyhow::Result<()> {
    let env = Env::start().await?;
    let sniffer = Sniffer::start(env.proxy.endpoint()).await?;
    let token = format!("web-identity-{}", uuid::Uuid::new_v4().simple());
    let token_file = env.dir.path().join("token");
    std::fs::write(&token_file, &token)?;
    let (nodes, name) = register_node_with_instance(&env).await?;

    let mut args = env.base_args();
    args.extend(flags.iter().map(|f| f.to_string()));
    let mut aws_env = irsa_env(&sniffer.endpoint(), &token_file);
    aws_env.push(("RUST_LOG".into(), rust_log.into()));
    // The SDK redacts bodies at trace unless these are set; an operator
    // debugging may set them, and a later SDK may log more by default. The
    // cap must hold either way, and with them this test can fail.
    aws_env.push(("LOG_SENSITIVE_BODIES".into(), "true".into()));
    aws_env.push(("LOG_SIGNABLE_BODY".into(), "true".into()));
    let ccm = Ccm::spawn(&args, &aws_env).await?;
    wait_initialized(&nodes, &name, &ccm).await?;

    let assumed = sniffer.seen("AssumeRoleWithWebIdentity");
    let issued = assumed
        .iter()
        .find_map(Seen::credentials)
        .with_context(|| format!("no credentials from STS: {assumed:?}"))?;
    // The web-identity STS client retries (the SDK's standard retries: it
    // is not behind the door, and retries are off for the service clients).
    assert!(
        assumed.iter().all(|s| s.sdk_request.contains("max=3")),
        "AssumeRoleWithWebIdentity may be retried: {assumed:?}"
    );
    let ec2_keys: Vec<_> = sniffer
        .all()
        .into_iter()
        .filter(|s| s.action.starts_with("Describe"))
        .map(|s| s.access_key)
        .collect();
    assert!(
        !ec2_keys.is_empty()
            && ec2_keys
                .iter()
                .all(|k| k.as_ref() == Some(&issued.access_key)),
        "the CCM's EC2 calls are signed with the web-identity credentials {}: {ec2_keys:?}",
        issued.access_key
    );

    let logs = ccm.logs();
    assert!(
        logs.contains("TRACE"),
        "the CCM logged at trace (else this test proves nothing): {}",
        tail(&logs, 20)
    );
    let secrets = [
        ("web-identity token", &token),
        ("secret access key", &issued.secret_key),
        ("session token", &issued.session_token),
    ];
    let redact = |line: &str| {
        secrets.iter().fold(line.to_string(), |l, (_, s)| {
            l.replace(s.as_str(), "<REDACTED>")
        })
    };
    for (what, secret) in secrets {
        if let Some(line) = logs.lines().find(|l| l.contains(secret.as_str())) {
            panic!(
                "the {what} is in the log ({} bytes of log); the line, redacted, starts: {}",
                logs.len(),
                redact(line).chars().take(300).collect::<String>()
            );
        }
    }
    Ok(())
}

#[tokio::test]
async fn no_secret_reaches_the_log_at_v10() -> anyhow::Result<()> {
    // An empty RUST_LOG is unset: --v decides.
    no_secret_in_the_log(&["--v=10"], "").await
}

#[tokio::test]
async fn no_secret_reaches_the_log_with_rust_log_trace() -> anyhow::Result<()> {
    no_secret_in_the_log(&["--v=0"], "trace,aws_smithy_runtime=trace,aws_sigv4=trace").await
}

#[tokio::test]
async fn role_arn_is_assumed_once_through_the_door_and_signs_the_calls() -> anyhow::Result<()> {
    let role = "arn:aws:iam::123456789012:role/x";
    let env = Env::start_with_conf(&format!(
        "[Global]\nRegion = {REGION}\nKubernetesClusterID = {CLUSTER_ID}\nRoleARN = {role}\n"
    ))
    .await?;
    // The operator renders the role's policy with `--assume-role` (the IAM
    // test evaluates this proxy's recorded requests that way).
    env.proxy.set_iam_policy_options(&["--assume-role", role]);
    let sniffer = Sniffer::start(env.proxy.endpoint()).await?;
    // STS throttles the first two AssumeRole calls: the door must retry.
    env.proxy.set_faults(vec![
        FaultRule::new(FaultKind::Throttle)
            .for_service("sts")
            .for_action("AssumeRole")
            .at_most(2),
    ]);
    let (nodes, name) = register_node_with_instance(&env).await?;
    let ccm = env.start_ccm_via(&sniffer.endpoint(), &[]).await?;
    wait_initialized(&nodes, &name, &ccm).await?;

    // Signed with the base (static) keys, marked as the CCM's, throttled
    // twice and then answered.
    let assume = sniffer.seen("AssumeRole");
    let statuses: Vec<u16> = assume.iter().map(|s| s.status).collect();
    assert_eq!(statuses, [400, 400, 200], "two throttled, then one success");
    for call in &assume {
        assert_eq!(call.access_key.as_deref(), Some("testing"), "{call:?}");
        assert!(call.user_agent.contains("app/aws-ccm"), "{call:?}");
    }
    let issued = assume[2].credentials().context("AssumeRole credentials")?;
    assert!(issued.access_key.starts_with("ASIA"), "{issued:?}");

    // Every EC2 call is signed with the assumed role's key; STS was asked
    // once for all of them.
    let ec2: Vec<Seen> = sniffer
        .all()
        .into_iter()
        .filter(|s| !s.action.is_empty() && s.action != "AssumeRole")
        .collect();
    assert!(
        ec2.len() >= 2,
        "several EC2 calls share one AssumeRole: {ec2:?}"
    );
    let by_key: BTreeMap<Option<String>, usize> = ec2.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(s.access_key.clone()).or_default() += 1;
        m
    });
    assert_eq!(
        by_key.keys().collect::<Vec<_>>(),
        [&Some(issued.access_key.clone())],
        "EC2 calls signed with the assumed credentials only"
    );
    let counted = env.proxy.calls().get("sts", "AssumeRole");
    assert_eq!((counted.received, counted.faulted), (3, 2), "{counted:?}");

    // The door counted the operation.
    let addr = ccm.https_addr().await?;
    let needles = [
        "aws_ccm_api_calls_total{operation=\"sts:AssumeRole\",outcome=\"throttled\"} 2",
        "aws_ccm_api_calls_total{operation=\"sts:AssumeRole\",outcome=\"success\"} 1",
        "cloudprovider_aws_api_request_duration_seconds_count{request=\"sts_assume_role\"} 3",
        "cloudprovider_aws_api_throttled_requests_total{operation_name=\"AssumeRole\"} 2",
    ];
    metrics_with(&addr, &needles, Duration::from_secs(30)).await?;
    env.finish().await
}
