//! A tiny EC2 query-protocol endpoint for unit tests of the client layer.
//!
//! It serves `DescribeInstances` (with the `instance-id`, `private-dns-name`,
//! `private-ip-address`, `tag-key`, `tag:<key>` and `instance-state-name`
//! filters, any other filter matching nothing, and `MaxResults`
//! pagination) and `DescribeAvailabilityZones` from an in-memory list, counts
//! requests per action, and can answer the next requests with scripted
//! faults. The real SDK talks to it over HTTP on 127.0.0.1, so the tests
//! exercise the SDK's parsing of AWS error bodies too. Integration tests use
//! moto behind the fault proxy instead.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpListener;

use super::SdkClients;

#[derive(Clone, Debug)]
pub(crate) struct StubInstance {
    id: String,
    private_dns: String,
    pub(crate) state: &'static str,
    tags: BTreeMap<String, String>,
}

impl StubInstance {
    /// The primary private address: the one an `ip-a-b-c-d…` name spells,
    /// else 10.0.0.1.
    fn private_ip(&self) -> String {
        let spelled = (self.private_dns.strip_prefix("ip-"))
            .and_then(|rest| rest.split('.').next())
            .map(|ip| ip.replace('-', "."))
            .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok());
        spelled.unwrap_or_else(|| "10.0.0.1".to_string())
    }

    pub(crate) fn running(id: &str, private_dns: &str) -> StubInstance {
        StubInstance {
            id: id.to_string(),
            private_dns: private_dns.to_string(),
            state: "running",
            tags: BTreeMap::new(),
        }
    }

    pub(crate) fn tagged(mut self, key: &str, value: &str) -> StubInstance {
        self.tags.insert(key.to_string(), value.to_string());
        self
    }
}

/// `n` running instances of cluster `demo`, `i-…0` to `i-…(n-1)`, 250 to a
/// private DNS block.
pub(crate) fn fleet(n: usize) -> Vec<StubInstance> {
    (0..n)
        .map(|i| {
            StubInstance::running(
                &format!("i-{i:017x}"),
                &format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
            )
            .tagged("kubernetes.io/cluster/demo", "owned")
        })
        .collect()
}

/// A scripted answer for the next request.
#[derive(Clone, Debug)]
pub(crate) enum Fault {
    /// An AWS error body with this status and code.
    Error { status: u16, code: &'static str },
    /// Wait this long before answering normally.
    Delay(Duration),
}

#[derive(Default)]
struct State {
    instances: Vec<StubInstance>,
    faults: VecDeque<Fault>,
    calls: HashMap<String, usize>,
    /// Filter values of each DescribeInstances call, in order.
    describe_filters: Vec<Vec<(String, Vec<String>)>>,
}

pub(crate) struct StubEc2 {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for StubEc2 {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl StubEc2 {
    pub(crate) async fn start(instances: Vec<StubInstance>) -> StubEc2 {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State {
            instances,
            ..State::default()
        }));
        let shared = state.clone();
        let server = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(state.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        StubEc2 {
            addr,
            state,
            server,
        }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SDK clients pointed at the stub, with SDK retries off.
    pub(crate) fn clients(&self) -> SdkClients {
        let config = aws_types::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(aws_types::region::Region::new("us-east-1"))
            .endpoint_url(self.endpoint())
            .credentials_provider(
                aws_credential_types::provider::SharedCredentialsProvider::new(
                    aws_credential_types::Credentials::new(
                        "AKIDTEST", "secret", None, None, "stub",
                    ),
                ),
            )
            .retry_config(aws_smithy_types::retry::RetryConfig::disabled())
            .build();
        SdkClients {
            ec2: aws_sdk_ec2::Client::new(&config),
            elb: aws_sdk_elasticloadbalancing::Client::new(&config),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::new(&config),
            sts: aws_sdk_sts::Client::new(&config),
            iam: aws_sdk_iam::Client::new(&config),
        }
    }

    pub(crate) fn push_faults(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state.lock().faults.extend(faults);
    }

    pub(crate) fn calls(&self, action: &str) -> usize {
        self.state.lock().calls.get(action).copied().unwrap_or(0)
    }

    pub(crate) fn describe_filters(&self) -> Vec<Vec<(String, Vec<String>)>> {
        self.state.lock().describe_filters.clone()
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let params: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let action = param("Action").unwrap_or_default();
    let fault = {
        let mut state = state.lock();
        *state.calls.entry(action.clone()).or_default() += 1;
        state.faults.pop_front()
    };
    match fault {
        Some(Fault::Error { status, code }) => return Ok(error(status, code)),
        Some(Fault::Delay(delay)) => tokio::time::sleep(delay).await,
        None => {}
    }
    let response = match action.as_str() {
        "DescribeInstances" => describe_instances(&state, &params),
        "DescribeAvailabilityZones" => xml(
            "<DescribeAvailabilityZonesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
             <requestId>req-1</requestId><availabilityZoneInfo>\
             <item><zoneName>us-east-1a</zoneName><zoneId>use1-az1</zoneId></item>\
             <item><zoneName>us-east-1b</zoneName><zoneId>use1-az2</zoneId></item>\
             </availabilityZoneInfo></DescribeAvailabilityZonesResponse>"
                .to_string(),
        ),
        _ => error(400, "InvalidAction"),
    };
    Ok(response)
}

fn filters(params: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut by_index: BTreeMap<u32, (String, BTreeMap<u32, String>)> = BTreeMap::new();
    for (key, value) in params {
        let parts: Vec<&str> = key.split('.').collect();
        match parts.as_slice() {
            ["Filter", n, "Name"] => {
                if let Ok(n) = n.parse() {
                    by_index.entry(n).or_default().0 = value.clone();
                }
            }
            ["Filter", n, "Value", m] => {
                if let (Ok(n), Ok(m)) = (n.parse(), m.parse()) {
                    by_index.entry(n).or_default().1.insert(m, value.clone());
                }
            }
            _ => {}
        }
    }
    by_index
        .into_values()
        .map(|(name, values)| (name, values.into_values().collect()))
        .collect()
}

fn matches(instance: &StubInstance, name: &str, values: &[String]) -> bool {
    match name {
        "instance-id" => values.contains(&instance.id),
        "private-dns-name" => values.contains(&instance.private_dns),
        "private-ip-address" => values.contains(&instance.private_ip()),
        "instance-state-name" => values.iter().any(|v| v == instance.state),
        "tag-key" => values.iter().any(|v| instance.tags.contains_key(v)),
        other => match other.strip_prefix("tag:") {
            Some(key) => instance.tags.get(key).is_some_and(|v| values.contains(v)),
            None => false,
        },
    }
}

fn describe_instances(state: &Mutex<State>, params: &[(String, String)]) -> Response<Full<Bytes>> {
    let filters = filters(params);
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let max_results: usize = param("MaxResults")
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX);
    let start: usize = param("NextToken").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut state = state.lock();
    state.describe_filters.push(filters.clone());
    let selected: Vec<StubInstance> = state
        .instances
        .iter()
        .filter(|i| {
            filters
                .iter()
                .all(|(name, values)| matches(i, name, values))
        })
        .cloned()
        .collect();
    let page: Vec<&StubInstance> = selected.iter().skip(start).take(max_results).collect();
    let next = (start + page.len() < selected.len()).then(|| (start + page.len()).to_string());
    let mut body = String::from(
        "<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">\
         <requestId>req-1</requestId><reservationSet>",
    );
    for instance in page {
        let tags: String = instance
            .tags
            .iter()
            .map(|(k, v)| format!("<item><key>{k}</key><value>{v}</value></item>"))
            .collect();
        body.push_str(&format!(
            "<item><reservationId>r-{id}</reservationId><instancesSet><item>\
             <instanceId>{id}</instanceId><privateDnsName>{dns}</privateDnsName>\
             <instanceState><code>16</code><name>{state}</name></instanceState>\
             <placement><availabilityZone>us-east-1a</availabilityZone></placement>\
             <privateIpAddress>{ip}</privateIpAddress>\
             <tagSet>{tags}</tagSet></item></instancesSet></item>",
            id = instance.id,
            dns = instance.private_dns,
            ip = instance.private_ip(),
            state = instance.state,
        ));
    }
    body.push_str("</reservationSet>");
    if let Some(next) = next {
        body.push_str(&format!("<nextToken>{next}</nextToken>"));
    }
    body.push_str("</DescribeInstancesResponse>");
    xml(body)
}

fn xml(body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(200)
        .header("content-type", "text/xml;charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}

fn error(status: u16, code: &str) -> Response<Full<Bytes>> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Response><Errors><Error><Code>{code}</Code>\
         <Message>stub says {code}</Message></Error></Errors><RequestID>stub-req-{status}</RequestID></Response>"
    );
    Response::builder()
        .status(status)
        .header("content-type", "text/xml;charset=UTF-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_default()
}
