//! The HTTPS endpoint against the API test server, in process: who may read
//! `/metrics`, caching of review answers, TLS versions, certificate reload.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, header};
use futures::future::BoxFuture;
use rustls::pki_types::ServerName;

use aws_ccm::leader::LeaderStatus;
use aws_ccm::server::auth::{
    AllowPaths, Auth, AuthSettings, Decision, Reviewer, UserInfo, Verdict,
};
use aws_ccm::server::tls::{TlsFiles, TlsPolicy};
use aws_ccm::server::{Health, RunningServer, ServeOptions, delegate, start};
use ccm_testkit::apiserver::{FailureRule, NonResourceGrant, Subject, TestApiServer, TokenUser};

fn health() -> Health {
    Health::new(
        Arc::new(LeaderStatus::default()),
        Arc::new(AtomicBool::new(true)),
        Duration::from_secs(15),
    )
}

fn settings(ttl: Duration) -> AuthSettings {
    AuthSettings {
        always_allow_paths: AllowPaths::parse(&[
            "/healthz".into(),
            "/readyz".into(),
            "/livez".into(),
        ])
        .unwrap(),
        token_ttl: ttl,
        allow_ttl: ttl,
        deny_ttl: ttl,
        authentication_kubeconfig: None,
        authorization_kubeconfig: None,
    }
}

fn serve_options(auth: Option<Arc<Auth>>) -> ServeOptions {
    ServeOptions {
        tls_files: None,
        tls: TlsPolicy::default(),
        auth,
        reload_interval: Duration::from_millis(50),
        admission: None,
    }
}

async fn start_local(opts: ServeOptions) -> RunningServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    start(addr, opts, health()).await.expect("server starts")
}

/// An API test server knowing two tokens: `reader` may get /metrics,
/// `nobody` may not.
async fn api_with_tokens() -> TestApiServer {
    let api = TestApiServer::start().await.unwrap();
    api.add_token(
        "reader-token",
        TokenUser::new("system:serviceaccount:monitoring:prometheus"),
    );
    api.add_token("nobody-token", TokenUser::new("nobody"));
    api.grant(NonResourceGrant::new(
        Subject::User("system:serviceaccount:monitoring:prometheus".into()),
        &["get"],
        &["/metrics"],
    ));
    api
}

/// One GET over a new TLS connection limited to `versions`.
async fn get(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> anyhow::Result<ccm_testkit::tls::Answer> {
    ccm_testkit::tls::https_get_with(&addr.to_string(), path, token, versions).await
}

const ANY_VERSION: &[&rustls::SupportedProtocolVersion] = rustls::ALL_VERSIONS;

async fn status(addr: SocketAddr, path: &str, token: Option<&str>) -> u16 {
    get(addr, path, token, ANY_VERSION).await.unwrap().status
}

/// The server with delegated authn/authz against `api`, caching for `ttl`.
async fn serve_with_auth(api: &TestApiServer, ttl: Duration) -> RunningServer {
    let auth = delegate::build(settings(ttl), &api.client().await.unwrap())
        .await
        .unwrap();
    start_local(serve_options(Some(auth))).await
}

#[tokio::test]
async fn metrics_needs_a_token_the_api_server_authorizes() {
    let api = api_with_tokens().await;
    let server = serve_with_auth(&api, Duration::from_secs(10)).await;
    let addr = server.local_addr;

    let anonymous = get(addr, "/metrics", None, ANY_VERSION).await.unwrap();
    assert_eq!(anonymous.status, 401, "{}", anonymous.body);
    assert!(
        anonymous.body.contains("\"reason\":\"Unauthorized\""),
        "{}",
        anonymous.body
    );
    let forbidden = get(addr, "/metrics", Some("nobody-token"), ANY_VERSION)
        .await
        .unwrap();
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert!(
        forbidden
            .body
            .contains("User \\\"nobody\\\" cannot get path \\\"/metrics\\\""),
        "{}",
        forbidden.body
    );
    let allowed = get(addr, "/metrics", Some("reader-token"), ANY_VERSION)
        .await
        .unwrap();
    assert_eq!(allowed.status, 200, "{}", allowed.body);
    assert!(
        allowed.body.trim_end().ends_with("# EOF"),
        "{}",
        allowed.body
    );
    assert_eq!(status(addr, "/metrics", Some("forged-token")).await, 401);

    // Health stays open without a token; a bad token is still refused, as upstream.
    for path in ["/healthz", "/readyz", "/livez"] {
        assert_eq!(status(addr, path, None).await, 200, "{path}");
    }
    assert_eq!(status(addr, "/healthz", Some("forged-token")).await, 401);
    // Unknown paths are authorized before routing: no probing without rights.
    assert_eq!(
        status(addr, "/debug/pprof", Some("nobody-token")).await,
        403
    );
    assert_eq!(
        status(addr, "/debug/pprof", Some("reader-token")).await,
        403
    );
    server.shutdown().await;
}

#[tokio::test]
async fn anonymous_access_follows_rbac_and_masters_skip_the_review() {
    let api = api_with_tokens().await;
    api.add_token(
        "admin-token",
        TokenUser::new("admin").group("system:masters"),
    );
    api.grant(NonResourceGrant::new(
        Subject::Group("system:unauthenticated".into()),
        &["get"],
        &["/metr*"],
    ));
    let server = serve_with_auth(&api, Duration::from_secs(3600)).await;
    assert_eq!(status(server.local_addr, "/metrics", None).await, 200);
    api.reset_stats();
    assert_eq!(
        status(server.local_addr, "/metrics", Some("admin-token")).await,
        200
    );
    let stats = api.stats();
    assert_eq!(stats.count("create", "tokenreviews"), 1);
    assert_eq!(stats.count("create", "subjectaccessreviews"), 0);
    server.shutdown().await;
}

#[tokio::test]
async fn review_answers_are_cached_so_a_scrape_does_not_call_the_api_server_again() {
    let api = api_with_tokens().await;
    // A TTL far longer than the test, so no wall-clock window is involved.
    let server = serve_with_auth(&api, Duration::from_secs(3600)).await;
    for _ in 0..3 {
        assert_eq!(
            status(server.local_addr, "/metrics", Some("reader-token")).await,
            200
        );
        assert_eq!(
            status(server.local_addr, "/metrics", Some("nobody-token")).await,
            403
        );
    }
    let stats = api.stats();
    assert_eq!(stats.count("create", "tokenreviews"), 2, "{stats:?}");
    assert_eq!(
        stats.count("create", "subjectaccessreviews"),
        2,
        "{stats:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn a_failing_access_review_is_500_and_not_cached() {
    let api = api_with_tokens().await;
    let server = serve_with_auth(&api, Duration::from_secs(3600)).await;
    api.inject_failure(FailureRule::new("create", "subjectaccessreviews", 500));
    assert_eq!(
        status(server.local_addr, "/metrics", Some("reader-token")).await,
        500
    );
    assert_eq!(
        status(server.local_addr, "/metrics", Some("reader-token")).await,
        200
    );
    server.shutdown().await;
}

/// Counts the questions; `allowed_user` is allowed everything.
struct Counting {
    tokens: AtomicUsize,
    access: AtomicUsize,
}

impl Reviewer for Counting {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Option<UserInfo>, String>> {
        self.tokens.fetch_add(1, Ordering::SeqCst);
        let user = (token == "good").then(|| UserInfo {
            username: "u".into(),
            ..Default::default()
        });
        Box::pin(async move { Ok(user) })
    }
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<Decision, String>> {
        self.access.fetch_add(1, Ordering::SeqCst);
        let allowed = user.username == "u";
        Box::pin(async move {
            Ok(Decision {
                allowed,
                reason: String::new(),
            })
        })
    }
}

#[tokio::test(start_paused = true)]
async fn review_caches_expire_after_their_ttls() {
    let reviewer = Arc::new(Counting {
        tokens: AtomicUsize::new(0),
        access: AtomicUsize::new(0),
    });
    let mut s = settings(Duration::from_secs(10));
    s.deny_ttl = Duration::from_secs(2);
    let auth = Auth::new(reviewer.clone(), s);
    let mut good = HeaderMap::new();
    good.insert(
        header::AUTHORIZATION,
        HeaderValue::from_static("Bearer good"),
    );
    let counts = || {
        (
            reviewer.tokens.load(Ordering::SeqCst),
            reviewer.access.load(Ordering::SeqCst),
        )
    };
    assert_eq!(
        auth.check(&Method::GET, "/metrics", &good).await,
        Verdict::Allow
    );
    assert_eq!(
        auth.check(&Method::GET, "/metrics", &HeaderMap::new())
            .await,
        Verdict::Unauthorized
    );
    assert_eq!(counts(), (1, 2));
    tokio::time::advance(Duration::from_secs(9)).await;
    auth.check(&Method::GET, "/metrics", &good).await;
    auth.check(&Method::GET, "/metrics", &HeaderMap::new())
        .await;
    // The allow (10 s) is still cached; the anonymous deny (2 s) is not.
    assert_eq!(counts(), (1, 3));
    tokio::time::advance(Duration::from_secs(1)).await;
    auth.check(&Method::GET, "/metrics", &good).await;
    assert_eq!(counts(), (2, 4));
}

#[tokio::test]
async fn tls_min_version_13_refuses_a_tls12_only_client() {
    let tls = TlsPolicy::parse("VersionTLS13", &[]).unwrap();
    let server = start_local(ServeOptions {
        tls,
        ..serve_options(None)
    })
    .await;
    let tls12 = get(
        server.local_addr,
        "/healthz",
        None,
        &[&rustls::version::TLS12],
    )
    .await;
    assert!(tls12.is_err(), "a TLS 1.2 client was served");
    let tls13 = get(
        server.local_addr,
        "/healthz",
        None,
        &[&rustls::version::TLS13],
    )
    .await;
    assert_eq!(tls13.unwrap().status, 200);
    server.shutdown().await;

    // The default still serves TLS 1.2.
    let server = start_local(serve_options(None)).await;
    let tls12 = get(
        server.local_addr,
        "/healthz",
        None,
        &[&rustls::version::TLS12],
    )
    .await;
    assert_eq!(tls12.unwrap().status, 200);
    server.shutdown().await;
}

fn write_pair(dir: &std::path::Path, name: &str) -> Vec<u8> {
    let cert = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
    std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.cert.pem()).unwrap();
    cert.cert.der().to_vec()
}

#[tokio::test]
async fn a_new_certificate_pair_on_disk_is_served_without_restart() {
    let dir = tempfile::tempdir().unwrap();
    let a = write_pair(dir.path(), "a.example");
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let server = start_local(ServeOptions {
        tls_files: Some(files),
        ..serve_options(None)
    })
    .await;
    let first = get(server.local_addr, "/healthz", None, ANY_VERSION)
        .await
        .unwrap();
    assert_eq!(first.peer_cert, a);
    let b = write_pair(dir.path(), "b.example");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let seen = get(server.local_addr, "/healthz", None, ANY_VERSION)
            .await
            .unwrap();
        if seen.peer_cert == b {
            break;
        }
        assert_eq!(seen.peer_cert, a, "neither pair served");
        assert!(
            tokio::time::Instant::now() < deadline,
            "pair B not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
}

/// The protocol ALPN settles on when a client offers `protocols`.
async fn negotiated(addr: SocketAddr, protocols: &[&[u8]]) -> anyhow::Result<Option<Vec<u8>>> {
    let mut config = ccm_testkit::tls::client_trusting_any_server(ANY_VERSION)?;
    config.alpn_protocols = protocols.iter().map(|p| p.to_vec()).collect();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
}

#[tokio::test]
async fn disable_http2_serving_offers_only_http1() {
    let server = start_local(serve_options(None)).await;
    assert_eq!(
        negotiated(server.local_addr, &[b"h2", b"http/1.1"])
            .await
            .unwrap(),
        Some(b"h2".to_vec()),
        "HTTP/2 is served by default, as upstream"
    );
    server.shutdown().await;

    let server = start_local(ServeOptions {
        tls: TlsPolicy {
            http1_only: true,
            ..TlsPolicy::default()
        },
        ..serve_options(None)
    })
    .await;
    assert_eq!(
        negotiated(server.local_addr, &[b"h2", b"http/1.1"])
            .await
            .unwrap(),
        Some(b"http/1.1".to_vec())
    );
    assert!(
        negotiated(server.local_addr, &[b"h2"]).await.is_err(),
        "an HTTP/2-only client is refused"
    );
    let plain = get(server.local_addr, "/healthz", None, ANY_VERSION).await;
    assert_eq!(plain.unwrap().status, 200);
    server.shutdown().await;
}
