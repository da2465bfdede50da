//! The service admission check against the API test server, which calls
//! validating webhooks as kube-apiserver does: a Service with a bad value
//! gets the CCM's warning at apply as a `Warning: 299` header and a good
//! one none; a down, slow or lying webhook never blocks a write under
//! `failurePolicy: Ignore` and refuses it under `Fail`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_ccm::cloud_config::CloudConfig;
use aws_ccm::leader::LeaderStatus;
use aws_ccm::provider::load_balancers::LoadBalancerSpec;
use aws_ccm::server::admission::{PATH, ServiceAdmission};
use aws_ccm::server::tls::{TlsFiles, TlsPolicy};
use aws_ccm::server::{AllowPaths, AuthSettings, Health, RunningServer, ServeOptions, delegate};
use ccm_testkit::apiserver::TestApiServer;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

const BAD_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";

/// A CA, and serving pairs it signs.
struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl Ca {
    fn new() -> Ca {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A pair for `names`, written as tls.crt and tls.key under `dir`.
    fn pair(&self, dir: &std::path::Path, names: &[&str]) -> TlsFiles {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let cert = rcgen::CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
        TlsFiles {
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }

    fn bundle(&self) -> String {
        base64(self.pem.as_bytes())
    }
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn health() -> Health {
    Health::new(
        Arc::new(LeaderStatus::default()),
        Arc::new(AtomicBool::new(true)),
        Duration::from_secs(15),
    )
}

/// The CCM's HTTPS endpoint with the admission check on, behind its real
/// delegated authentication (which the webhook path must not need).
async fn ccm_server(api: &TestApiServer, tls: TlsFiles) -> RunningServer {
    let settings = AuthSettings {
        always_allow_paths: AllowPaths::parse(&["/healthz".into()]).unwrap(),
        token_ttl: Duration::from_secs(10),
        allow_ttl: Duration::from_secs(10),
        deny_ttl: Duration::from_secs(10),
        authentication_kubeconfig: None,
        authorization_kubeconfig: None,
    };
    let auth = delegate::build(settings, &api.client().await.unwrap())
        .await
        .unwrap();
    let opts = ServeOptions {
        tls_files: Some(tls),
        tls: TlsPolicy::default(),
        auth: Some(auth),
        reload_interval: Duration::from_secs(60),
        admission: Some(Arc::new(ServiceAdmission {
            cloud: Arc::new(CloudConfig::default()),
        })),
    };
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    aws_ccm::server::start(addr, opts, health()).await.unwrap()
}

/// A ValidatingWebhookConfiguration for Services, as the chart renders it.
fn configuration(name: &str, client: Value, policy: &str, timeout: u64) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.services.aws-ccm.io"),
            "clientConfig": client,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                       "resources": ["services"], "scope": "Namespaced"}],
            "failurePolicy": policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": timeout,
        }]
    })
}

/// One raw request to the API test server: status, Warning headers, body.
async fn send(
    api: &TestApiServer,
    method: &str,
    path: &str,
    body: &Value,
) -> (u16, Vec<String>, Value) {
    let addr = api.url().trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let content = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", &addr)
        .header("content-type", content)
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        warnings,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    )
}

fn service(name: &str, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}], "selector": {"app": name}},
    })
}

const SERVICES: &str = "/api/v1/namespaces/default/services";
const CONFIGS: &str = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations";

fn header_of(text: &str) -> String {
    format!(
        "299 - \"{}\"",
        text.replace('\\', "\\\\").replace('"', "\\\"")
    )
}

fn reviews(result: &str) -> u64 {
    let text = aws_ccm::metrics::encode();
    let line = format!("aws_ccm_service_admission_reviews_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .map_or(0, |v| v.trim().parse().unwrap())
}

#[tokio::test]
async fn a_bad_service_is_warned_at_apply_with_the_ccms_words_and_a_good_one_is_not() {
    let api = TestApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let ccm = ccm_server(&api, ca.pair(dir.path(), &["127.0.0.1"])).await;
    let url = format!("https://127.0.0.1:{}{PATH}", ccm.local_addr.port());
    let vwc = configuration(
        "aws-ccm",
        json!({"url": url, "caBundle": ca.bundle()}),
        "Ignore",
        3,
    );
    assert_eq!(send(&api, "POST", CONFIGS, &vwc).await.0, 201);

    let (status, warnings, created) = send(
        &api,
        "POST",
        SERVICES,
        &service("bad", json!({BAD_INTERVAL: "often"})),
    )
    .await;
    assert_eq!(status, 201, "a warning never refuses: {created}");
    let svc = serde_json::from_value(created).unwrap();
    let expected: Vec<String> = LoadBalancerSpec::read_with(&svc, &CloudConfig::default())
        .findings(false)
        .into_iter()
        .map(|f| header_of(&f.message))
        .collect();
    assert_eq!(expected.len(), 1);
    assert_eq!(warnings, expected);
    assert!(
        warnings[0].contains("healthcheck-interval=\\\"often\\\""),
        "{warnings:?}"
    );

    // An update is reviewed too, and warned again while the value stays.
    let patch = json!({"metadata": {"labels": {"team": "web"}}});
    let (status, warnings, _) = send(&api, "PATCH", &format!("{SERVICES}/bad"), &patch).await;
    assert_eq!((status, warnings), (200, expected));

    let clean_before = reviews("clean");
    let (status, warnings, _) = send(&api, "POST", SERVICES, &service("good", json!({}))).await;
    assert_eq!((status, warnings), (201, vec![]));
    // The good Service was reviewed, not skipped.
    assert_eq!(reviews("clean"), clean_before + 1);
    ccm.shutdown().await;

    // The CCM down: the write goes through (failurePolicy Ignore).
    let (status, warnings, _) = send(
        &api,
        "POST",
        SERVICES,
        &service("while-down", json!({BAD_INTERVAL: "often"})),
    )
    .await;
    assert_eq!((status, warnings), (201, vec![]));
    api.shutdown().await;
}

/// A webhook that misbehaves as told, and counts the reviews it got.
#[derive(Clone, Default)]
struct Fake {
    seen: Arc<Mutex<Vec<Value>>>,
    calls: Arc<AtomicUsize>,
}

#[derive(Clone, Copy)]
enum Behaviour {
    WrongUid,
    Slow,
    Deny,
    Warn,
}

async fn fake_webhook(ca: &Ca, dir: &std::path::Path, behaviour: Behaviour) -> (SocketAddr, Fake) {
    let files = ca.pair(dir, &["webhook.default.svc", "127.0.0.1"]);
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&files.cert, &files.key)
        .await
        .unwrap();
    let fake = Fake::default();
    let state = fake.clone();
    let app = axum::Router::new().route(
        "/review",
        axum::routing::post(move |body: axum::body::Bytes| {
            let state = state.clone();
            async move {
                let review: Value = serde_json::from_slice(&body).unwrap();
                state.calls.fetch_add(1, Ordering::SeqCst);
                state.seen.lock().unwrap().push(review.clone());
                let uid = review["request"]["uid"].as_str().unwrap().to_string();
                let response = match behaviour {
                    Behaviour::WrongUid => json!({"uid": "not-the-request", "allowed": true}),
                    Behaviour::Slow => {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        json!({"uid": uid, "allowed": true})
                    }
                    Behaviour::Deny => json!({"uid": uid, "allowed": false, "warnings": ["denied, and said so"],
                                              "status": {"message": "no thanks"}}),
                    Behaviour::Warn => json!({"uid": uid, "allowed": true, "warnings": ["take care"]}),
                };
                axum::Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
            }
        }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let server = axum_server::from_tcp_rustls(listener, config).unwrap();
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    (addr, fake)
}

/// Creates the next of the Services `svc-1`, `svc-2`, ...
async fn create_next(api: &TestApiServer, made: &AtomicUsize) -> (u16, Vec<String>, Value) {
    let n = made.fetch_add(1, Ordering::SeqCst) + 1;
    send(
        api,
        "POST",
        SERVICES,
        &service(&format!("svc-{n}"), json!({})),
    )
    .await
}

/// A write refused under `failurePolicy: Fail` because the call failed
/// (500, as kube-apiserver), saying `why`.
fn refused_as_a_failed_call((status, _, body): (u16, Vec<String>, Value), why: &str) {
    assert_eq!(status, 500, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "{why} in {body}");
}

/// Replaces the one configuration with `vwc`.
async fn configure(api: &TestApiServer, vwc: &Value) {
    let name = vwc["metadata"]["name"].as_str().unwrap();
    let _ = send(api, "DELETE", &format!("{CONFIGS}/{name}"), &json!({})).await;
    let (status, _, body) = send(api, "POST", CONFIGS, vwc).await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn the_api_server_calls_webhooks_as_kube_apiserver_does() {
    let api = TestApiServer::start().await.unwrap();
    let (ca, other_ca) = (Ca::new(), Ca::new());
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let (warn, warned) = fake_webhook(&ca, dirs[0].path(), Behaviour::Warn).await;
    let (liar, lied) = fake_webhook(&ca, dirs[1].path(), Behaviour::WrongUid).await;
    let (slow, slowed) = fake_webhook(&ca, dirs[2].path(), Behaviour::Slow).await;
    let (deny, _) = fake_webhook(&ca, dirs[3].path(), Behaviour::Deny).await;
    let by_url = |addr: SocketAddr, bundle: String| json!({"url": format!("https://127.0.0.1:{}/review", addr.port()), "caBundle": bundle});
    let made = AtomicUsize::new(0);
    let create = |api| create_next(api, &made);

    // A service reference, reached at its registered address, with the
    // review kube-apiserver sends; the warning comes back as a header.
    api.route_service("default", "webhook", 443, warn);
    let by_service = json!({"service": {"namespace": "default", "name": "webhook", "path": "/review"}, "caBundle": ca.bundle()});
    configure(&api, &configuration("hooks", by_service, "Fail", 3)).await;
    let (status, warnings, _) = create(&api).await;
    assert_eq!((status, warnings), (201, vec![header_of("take care")]));
    let (status, _, _) = send(
        &api,
        "PATCH",
        &format!("{SERVICES}/svc-1"),
        &json!({"metadata": {"labels": {"a": "b"}}}),
    )
    .await;
    assert_eq!(status, 200);
    {
        let seen = warned.seen.lock().unwrap();
        let (created, updated) = (&seen[0]["request"], &seen[1]["request"]);
        assert_eq!(seen[0]["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(
            created["kind"],
            json!({"group": "", "version": "v1", "kind": "Service"})
        );
        assert_eq!(
            (&created["operation"], &created["namespace"]),
            (&json!("CREATE"), &json!("default"))
        );
        assert_eq!(created["object"]["metadata"]["name"], "svc-1");
        // The object reviewed is the one stored: defaulted, with its uid.
        assert_eq!(created["object"]["spec"]["ports"][0]["targetPort"], 80);
        assert!(created["oldObject"].is_null());
        assert_eq!(updated["operation"], "UPDATE");
        assert_eq!(
            updated["oldObject"]["metadata"]["uid"],
            updated["object"]["metadata"]["uid"]
        );
        assert_eq!(updated["object"]["metadata"]["labels"]["a"], "b");
        assert_ne!(created["uid"], updated["uid"]);
    }
    let (_, _, stored) = send(&api, "GET", &format!("{SERVICES}/svc-1"), &json!({})).await;
    let first_uid = warned.seen.lock().unwrap()[0]["request"]["object"]["metadata"]["uid"].clone();
    assert_eq!(stored["metadata"]["uid"], first_uid);

    // A certificate the caBundle does not vouch for fails the call.
    configure(
        &api,
        &configuration("hooks", by_url(warn, other_ca.bundle()), "Fail", 3),
    )
    .await;
    let calls = warned.calls.load(Ordering::SeqCst);
    refused_as_a_failed_call(create(&api).await, "failed calling webhook");
    assert_eq!(
        warned.calls.load(Ordering::SeqCst),
        calls,
        "no review went past TLS"
    );

    // A response for another request is refused as a failed call.
    configure(
        &api,
        &configuration("hooks", by_url(liar, ca.bundle()), "Fail", 3),
    )
    .await;
    refused_as_a_failed_call(create(&api).await, "expected response.uid=");
    configure(
        &api,
        &configuration("hooks", by_url(liar, ca.bundle()), "Ignore", 3),
    )
    .await;
    assert_eq!(create(&api).await.0, 201);
    assert_eq!(
        lied.calls.load(Ordering::SeqCst),
        2,
        "the lying webhook was called each time"
    );

    // A slow webhook: timeoutSeconds bounds the wait; Ignore lets the
    // write through, Fail refuses it.
    configure(
        &api,
        &configuration("hooks", by_url(slow, ca.bundle()), "Ignore", 1),
    )
    .await;
    let started = tokio::time::Instant::now();
    assert_eq!(create(&api).await.0, 201);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    configure(
        &api,
        &configuration("hooks", by_url(slow, ca.bundle()), "Fail", 1),
    )
    .await;
    refused_as_a_failed_call(create(&api).await, "context deadline exceeded");
    assert_eq!(slowed.calls.load(Ordering::SeqCst), 2);

    // A refusal, with its warnings.
    configure(
        &api,
        &configuration("hooks", by_url(deny, ca.bundle()), "Ignore", 3),
    )
    .await;
    let (status, warnings, body) = create(&api).await;
    assert_eq!(
        (status, warnings),
        (403, vec![header_of("denied, and said so")])
    );
    assert_eq!(
        body["message"],
        "admission webhook \"hooks.services.aws-ccm.io\" denied the request: no thanks"
    );

    // kube-apiserver's validation of the configuration itself.
    let mut bad = configuration("bad", by_url(warn, ca.bundle()), "Sometimes", 31);
    bad["webhooks"][0]
        .as_object_mut()
        .unwrap()
        .remove("sideEffects");
    let (status, _, body) = send(&api, "POST", CONFIGS, &bad).await;
    assert_eq!(status, 422, "{body}");
    let text = body["message"].as_str().unwrap();
    for field in ["sideEffects", "failurePolicy", "timeoutSeconds"] {
        assert!(
            text.contains(&format!("webhooks[0].{field}")),
            "{field} in {text}"
        );
    }
    api.shutdown().await;
}
