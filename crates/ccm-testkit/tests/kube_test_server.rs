//! Behaviour tests of the Kubernetes API test server, through kube-rs the
//! way the CCM talks to it, and through raw HTTP where kube-rs hides the
//! detail (watch event bodies, bookmarks, continue tokens).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use ccm_testkit::apiserver::{FailureRule, ServerOptions, TestApiServer};
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Event as CoreEvent, Namespace, Node, Pod, Service};
use k8s_openapi::api::events::v1::Event as EventsV1;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

async fn setup() -> anyhow::Result<(TestApiServer, Client)> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    Ok((server, client))
}

/// A client without kube's default retry layer, which by itself retries
/// 429, 503 and 504 answers up to 15 times: tests that want to see those
/// codes use this one.
fn no_retry_client(server: &TestApiServer) -> anyhow::Result<Client> {
    let mut config = kube::Config::new(server.url().parse()?);
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

fn node(name: &str) -> anyhow::Result<Node> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"app": "test"}},
        "spec": {"providerID": format!("aws:///us-east-1a/i-{name}")},
    }))?)
}

fn config_map(name: &str, data: Value) -> anyhow::Result<ConfigMap> {
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "data": data}),
    )?)
}

fn service(name: &str, ports: Value) -> anyhow::Result<Service> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "LoadBalancer", "ports": ports, "selector": {"app": name}},
    }))?)
}

/// The (code, reason, message) of a kube API error.
fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> anyhow::Result<(u16, String, String)> {
    match r {
        Err(kube::Error::Api(s)) => Ok((s.code, s.reason.clone(), s.message.clone())),
        other => Err(anyhow!("expected an API error, got {other:?}")),
    }
}

/// Sends a raw request; returns the status code and the body as JSON (or a string).
async fn raw(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> anyhow::Result<(u16, Value)> {
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req.body(kube::client::Body::from(body.to_vec()))?;
    let resp = client.send(req).await?;
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    Ok((code, v))
}

/// Reads newline-delimited watch events from a raw response body.
struct Events {
    body: kube::client::Body,
    buf: Vec<u8>,
}

impl Events {
    async fn open(client: &Client, uri: &str) -> anyhow::Result<(u16, Events)> {
        let req = http::Request::get(uri).body(kube::client::Body::empty())?;
        let resp = client.send(req).await?;
        Ok((
            resp.status().as_u16(),
            Events {
                body: resp.into_body(),
                buf: Vec::new(),
            },
        ))
    }

    /// The next event, or None at the end of the stream.
    async fn next(&mut self) -> anyhow::Result<Option<Value>> {
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Ok(Some(
                    serde_json::from_slice(&line).context("parsing a watch event")?,
                ));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    /// The next event within the deadline.
    async fn expect(&mut self) -> anyhow::Result<Value> {
        tokio::time::timeout(DEADLINE, self.next())
            .await
            .context("timed out waiting for a watch event")??
            .context("the watch ended early")
    }

    /// The next event that is not a bookmark.
    async fn expect_change(&mut self) -> anyhow::Result<Value> {
        loop {
            let ev = self.expect().await?;
            if ev["type"] != "BOOKMARK" {
                return Ok(ev);
            }
        }
    }
}

fn summary(ev: &Value) -> (String, String) {
    (
        ev["type"].as_str().unwrap_or_default().to_string(),
        ev["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[tokio::test]
async fn crud_fills_server_fields_and_returns_real_status_errors() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes.create(&PostParams::default(), &node("n1")?).await?;
    let meta = &created.metadata;
    ensure!(
        meta.uid.as_deref().is_some_and(|u| u.len() == 36),
        "uid: {:?}",
        meta.uid
    );
    ensure!(meta.creation_timestamp.is_some());
    ensure!(
        meta.resource_version
            .as_deref()
            .is_some_and(|rv| rv.parse::<u64>().is_ok())
    );
    ensure!(meta.generation == Some(1));

    let got = nodes.get("n1").await?;
    ensure!(got.metadata.uid == created.metadata.uid);
    ensure!(nodes.list(&ListParams::default()).await?.items.len() == 1);

    let (code, reason, message) = api_err(nodes.get("missing").await)?;
    ensure!((code, reason.as_str()) == (404, "NotFound"));
    ensure!(message == "nodes \"missing\" not found", "{message}");

    let (code, reason, message) =
        api_err(nodes.create(&PostParams::default(), &node("n1")?).await)?;
    ensure!(
        (code, reason.as_str(), message.as_str())
            == (409, "AlreadyExists", "nodes \"n1\" already exists")
    );

    // generateName picks a fresh name.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "cfg-"}}))?;
    let made = cms.create(&PostParams::default(), &generated).await?;
    ensure!(
        made.name_any().starts_with("cfg-") && made.name_any().len() == 9,
        "{}",
        made.name_any()
    );
    ensure!(
        made.metadata.generation.is_none(),
        "configmaps have no spec, so no generation"
    );

    // Update (PUT) and delete.
    let mut n1 = got;
    n1.spec.as_mut().context("spec")?.unschedulable = Some(true);
    let replaced = nodes.replace("n1", &PostParams::default(), &n1).await?;
    ensure!(replaced.metadata.generation == Some(2));
    ensure!(replaced.resource_version() != n1.resource_version());
    let deleted = nodes.delete("n1", &DeleteParams::default()).await?;
    // Nodes answer with a Status, as the real registry does.
    ensure!(deleted.is_right(), "{deleted:?}");
    ensure!(api_err(nodes.get("n1").await)?.0 == 404);

    // The raw Status body has the real shape.
    let (code, body) = raw(
        &client,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/x",
        None,
        b"",
    )
    .await?;
    ensure!(code == 404);
    ensure!(
        body == json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases.coordination.k8s.io \"x\" not found", "reason": "NotFound",
            "details": {"name": "x", "group": "coordination.k8s.io", "kind": "leases"}, "code": 404,
        }),
        "{body}"
    );
    Ok(())
}

#[tokio::test]
async fn namespaces_are_precreated_and_required() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    ensure!(
        names == ["default", "kube-node-lease", "kube-public", "kube-system"],
        "{names:?}"
    );

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let (code, reason, message) = api_err(
        cms.create(&PostParams::default(), &config_map("a", json!({}))?)
            .await,
    )?;
    ensure!(
        (code, reason.as_str(), message.as_str())
            == (404, "NotFound", "namespaces \"nope\" not found")
    );

    // Deleting a namespace takes its contents along.
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "tmp"}}))?;
    namespaces.create(&PostParams::default(), &ns).await?;
    let tmp: Api<ConfigMap> = Api::namespaced(client.clone(), "tmp");
    tmp.create(&PostParams::default(), &config_map("a", json!({}))?)
        .await?;
    namespaces.delete("tmp", &DeleteParams::default()).await?;
    ensure!(api_err(tmp.get("a").await)?.0 == 404);
    Ok(())
}

#[tokio::test]
async fn stale_resource_version_conflicts_and_generation_tracks_spec() -> anyhow::Result<()> {
    let (server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let first = nodes.create(&PostParams::default(), &node("n1")?).await?;
    let rv1: u64 = first.resource_version().context("rv")?.parse()?;

    // Metadata-only change: resourceVersion moves on, generation does not.
    let mut labelled = first.clone();
    labelled.labels_mut().insert("zone".into(), "a".into());
    let labelled = nodes
        .replace("n1", &PostParams::default(), &labelled)
        .await?;
    let rv2: u64 = labelled.resource_version().context("rv")?.parse()?;
    ensure!(rv2 > rv1);
    ensure!(labelled.metadata.generation == Some(1));

    // The old copy is stale now.
    let (code, reason, message) =
        api_err(nodes.replace("n1", &PostParams::default(), &first).await)?;
    ensure!((code, reason.as_str()) == (409, "Conflict"));
    ensure!(
        message
            == "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again",
        "{message}"
    );

    // A merge patch carrying a stale resourceVersion conflicts too.
    let stale = json!({"metadata": {"resourceVersion": rv1.to_string(), "labels": {"x": "y"}}});
    ensure!(
        api_err(
            nodes
                .patch("n1", &PatchParams::default(), &Patch::Merge(&stale))
                .await
        )?
        .0 == 409
    );
    // Conflicts are counted apart from the requests, by verb and resource.
    let stats = server.stats();
    ensure!(stats.conflicts("update", "nodes") == 1 && stats.conflicts("patch", "nodes") == 1);
    ensure!(stats.count("patch", "nodes") == 1 && stats.conflicts("create", "nodes") == 0);

    // A spec change bumps generation; a write that changes nothing is free.
    let spec = json!({"spec": {"unschedulable": true}});
    let patched = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&spec))
        .await?;
    ensure!(patched.metadata.generation == Some(2));
    let again = nodes
        .patch("n1", &PatchParams::default(), &Patch::Merge(&spec))
        .await?;
    ensure!(
        again.resource_version() == patched.resource_version(),
        "a no-op patch must not write"
    );
    Ok(())
}

#[tokio::test]
async fn list_label_and_field_selectors() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "front"})),
        ("b", json!({"app": "db", "tier": "back"})),
        ("c", json!({"app": "web"})),
    ] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
        cms.create(&PostParams::default(), &cm).await?;
    }
    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    };
    let cases = [
        ("app=web", vec!["a", "c"]),
        ("app==web", vec!["a", "c"]),
        ("app!=web", vec!["b"]),
        ("app in (db,cache)", vec!["b"]),
        ("app notin (db)", vec!["a", "c"]),
        ("tier", vec!["a", "b"]),
        ("!tier", vec!["c"]),
        ("app=web,tier=front", vec!["a"]),
    ];
    for (sel, want) in cases {
        let got = names(cms.list(&ListParams::default().labels(sel)).await?);
        ensure!(got == want, "{sel}: {got:?}");
    }
    let by_name = names(
        cms.list(&ListParams::default().fields("metadata.name=b"))
            .await?,
    );
    ensure!(by_name == ["b"], "{by_name:?}");
    let all_but = names(
        cms.list(&ListParams::default().fields("metadata.name!=b,metadata.namespace=default"))
            .await?,
    );
    ensure!(all_but == ["a", "c"], "{all_but:?}");

    let (code, reason, message) =
        api_err(cms.list(&ListParams::default().fields("data.x=1")).await)?;
    ensure!(
        (code, reason.as_str(), message.as_str())
            == (400, "BadRequest", "field label not supported: data.x")
    );
    ensure!(api_err(cms.list(&ListParams::default().labels("app in web")).await)?.0 == 400);

    // Pods by node, the CCM's usual field selector.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2")] {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}}),
        )?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    let on_n2: Vec<String> = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields("spec.nodeName=n2"))
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    ensure!(on_n2 == ["p2"], "{on_n2:?}");
    Ok(())
}

#[tokio::test]
async fn pagination_is_a_consistent_snapshot() -> anyhow::Result<()> {
    let (server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..1100 {
        nodes
            .create(&PostParams::default(), &node(&format!("n{i:04}"))?)
            .await?;
    }
    let first = nodes.list(&ListParams::default().limit(500)).await?;
    ensure!(first.items.len() == 500);
    ensure!(
        first.metadata.remaining_item_count == Some(600),
        "{:?}",
        first.metadata.remaining_item_count
    );
    let token = first.metadata.continue_.clone().context("continue token")?;
    let list_rv = first.metadata.resource_version.clone();

    // Changes after the first page do not leak into later pages.
    nodes
        .create(&PostParams::default(), &node("n9999")?)
        .await?;
    nodes.delete("n0999", &DeleteParams::default()).await?;

    let mut seen: Vec<String> = first.iter().map(ResourceExt::name_any).collect();
    let mut token = Some(token);
    while let Some(t) = token {
        let page = nodes
            .list(&ListParams::default().limit(500).continue_token(&t))
            .await?;
        ensure!(
            page.metadata.resource_version == list_rv,
            "every page reports the snapshot's resourceVersion"
        );
        seen.extend(page.iter().map(ResourceExt::name_any));
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
    }
    let expected: Vec<String> = (0..1100).map(|i| format!("n{i:04}")).collect();
    ensure!(
        seen == expected,
        "pages must cover the snapshot exactly once, in order"
    );

    // Interleaved paginations with different selectors keep their own snapshots.
    let paginate = |sel: &'static str| {
        let nodes = nodes.clone();
        async move {
            let mut names = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let mut lp = ListParams::default().limit(7).labels(sel);
                if let Some(t) = &token {
                    lp = lp.continue_token(t);
                }
                let page = nodes.list(&lp).await?;
                names.extend(page.iter().map(ResourceExt::name_any));
                token = page.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    return anyhow::Ok(names);
                }
            }
        }
    };
    let (all, none) = tokio::join!(paginate("app=test"), paginate("app!=test"));
    ensure!(all?.len() == 1100 && none?.is_empty());

    // A raw continue token after compaction is 410 Expired.
    let page = nodes.list(&ListParams::default().limit(10)).await?;
    server.compact();
    let t = page.metadata.continue_.context("continue")?;
    let (code, reason, _) = api_err(
        nodes
            .list(&ListParams::default().limit(10).continue_token(&t))
            .await,
    )?;
    ensure!((code, reason.as_str()) == (410, "Expired"));
    Ok(())
}

#[tokio::test]
async fn list_resource_version_semantics() -> anyhow::Result<()> {
    let (server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let a = cms
        .create(&PostParams::default(), &config_map("a", json!({"v": "1"}))?)
        .await?;
    let rv_a = a.resource_version().context("rv")?;
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "2"}})),
    )
    .await?;
    cms.create(&PostParams::default(), &config_map("b", json!({}))?)
        .await?;

    let exact = cms
        .list(
            &ListParams::default()
                .at(&rv_a)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await?;
    ensure!(exact.metadata.resource_version.as_deref() == Some(rv_a.as_str()));
    let data: Vec<Option<String>> = exact
        .iter()
        .map(|c| c.data.as_ref().and_then(|d| d.get("v").cloned()))
        .collect();
    ensure!(
        data == [Some("1".to_string())],
        "the exact list shows the old state: {data:?}"
    );

    let any = cms
        .list(
            &ListParams::default()
                .at("0")
                .matching(kube::api::VersionMatch::NotOlderThan),
        )
        .await?;
    ensure!(any.items.len() == 2);
    let not_older = cms
        .list(
            &ListParams::default()
                .at(&rv_a)
                .matching(kube::api::VersionMatch::NotOlderThan),
        )
        .await?;
    ensure!(not_older.items.len() == 2);

    let (code, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?resourceVersionMatch=Exact",
        None,
        b"",
    )
    .await?;
    ensure!(code == 400, "{body}");
    let (code, _) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/configmaps?resourceVersion=0&resourceVersionMatch=Exact",
        None,
        b"",
    )
    .await?;
    ensure!(code == 400);

    server.compact();
    let (code, reason, _) = api_err(
        cms.list(
            &ListParams::default()
                .at(&rv_a)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await,
    )?;
    ensure!((code, reason.as_str()) == (410, "Expired"));
    let future = (server.resource_version() + 1000).to_string();
    let cms: Api<ConfigMap> = Api::namespaced(no_retry_client(&server)?, "default");
    let (code, reason, message) = api_err(
        cms.list(
            &ListParams::default()
                .at(&future)
                .matching(kube::api::VersionMatch::Exact),
        )
        .await,
    )?;
    ensure!(
        (code, reason.as_str()) == (504, "Timeout")
            && message.starts_with("Too large resource version"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn raw_watch_replays_history_and_streams_live_changes() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let a = cms
        .create(&PostParams::default(), &config_map("a", json!({}))?)
        .await?;
    let rv_a = a.resource_version().context("rv")?;
    cms.create(&PostParams::default(), &config_map("b", json!({}))?)
        .await?;

    // RV 0: the current state as ADDED, then live changes.
    let (code, mut from_zero) = Events::open(
        &client,
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0",
    )
    .await?;
    ensure!(code == 200);
    ensure!(summary(&from_zero.expect().await?) == ("ADDED".into(), "a".into()));
    ensure!(summary(&from_zero.expect().await?) == ("ADDED".into(), "b".into()));

    // From a resourceVersion: only what happened after it.
    let (_, mut from_a) = Events::open(
        &client,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv_a}"),
    )
    .await?;
    ensure!(summary(&from_a.expect().await?) == ("ADDED".into(), "b".into()));

    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await?;
    cms.delete("b", &DeleteParams::default()).await?;
    for w in [&mut from_zero, &mut from_a] {
        let modified = w.expect().await?;
        ensure!(summary(&modified) == ("MODIFIED".into(), "a".into()));
        ensure!(modified["object"]["data"]["x"] == "1");
        let deleted = w.expect().await?;
        ensure!(summary(&deleted) == ("DELETED".into(), "b".into()));
        let del_rv: u64 = deleted["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .parse()?;
        ensure!(
            del_rv > 0,
            "a DELETED event carries the deletion's resourceVersion"
        );
    }

    // timeoutSeconds ends the stream.
    let (_, mut short) = Events::open(
        &client,
        "/api/v1/namespaces/default/configmaps?watch=true&timeoutSeconds=1&resourceVersion=0",
    )
    .await?;
    ensure!(summary(&short.expect().await?).0 == "ADDED");
    let end = tokio::time::timeout(DEADLINE, short.next())
        .await
        .context("the watch did not time out")??;
    ensure!(end.is_none(), "{end:?}");
    Ok(())
}

#[tokio::test]
async fn watch_from_compacted_version_gets_410_error_event() -> anyhow::Result<()> {
    let (server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let a = cms
        .create(&PostParams::default(), &config_map("a", json!({}))?)
        .await?;
    cms.create(&PostParams::default(), &config_map("b", json!({}))?)
        .await?;
    server.compact();
    let rv_a = a.resource_version().context("rv")?;
    let (code, mut events) = Events::open(
        &client,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv_a}"),
    )
    .await?;
    ensure!(
        code == 200,
        "the real server answers 200 and reports the error in the stream"
    );
    let ev = events.expect().await?;
    let floor = server.resource_version();
    ensure!(
        ev == json!({"type": "ERROR", "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {rv_a} ({floor})"), "reason": "Expired", "code": 410,
        }}),
        "{ev}"
    );
    ensure!(
        events.next().await?.is_none(),
        "the stream closes after the error"
    );

    // A small history ring expires old versions by itself.
    let small = TestApiServer::start_with(ServerOptions {
        history_size: 3,
        ..Default::default()
    })
    .await?;
    let small_client = small.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(small_client.clone(), "default");
    let first = cms
        .create(&PostParams::default(), &config_map("x0", json!({}))?)
        .await?;
    for i in 1..6 {
        cms.create(
            &PostParams::default(),
            &config_map(&format!("x{i}"), json!({}))?,
        )
        .await?;
    }
    let rv = first.resource_version().context("rv")?;
    let (_, mut events) = Events::open(
        &small_client,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"),
    )
    .await?;
    ensure!(events.expect().await?["object"]["code"] == 410);
    Ok(())
}

#[tokio::test]
async fn bookmarks_and_streaming_initial_events() -> anyhow::Result<()> {
    let server = TestApiServer::start_with(ServerOptions {
        bookmark_interval: Duration::from_millis(50),
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("n1")?).await?;
    let (_, mut events) = Events::open(
        &client,
        "/api/v1/nodes?watch=true&allowWatchBookmarks=true&resourceVersion=0",
    )
    .await?;
    ensure!(summary(&events.expect().await?) == ("ADDED".into(), "n1".into()));
    let bookmark = events.expect().await?;
    ensure!(bookmark["type"] == "BOOKMARK", "{bookmark}");
    ensure!(bookmark["object"]["kind"] == "Node" && bookmark["object"]["apiVersion"] == "v1");
    ensure!(
        bookmark["object"]["metadata"]["resourceVersion"] == server.resource_version().to_string()
    );

    // sendInitialEvents: the state, then a bookmark marking its end.
    let (code, mut streaming) = Events::open(
        &client,
        "/api/v1/nodes?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&resourceVersion=",
    )
    .await?;
    ensure!(code == 200);
    ensure!(summary(&streaming.expect().await?) == ("ADDED".into(), "n1".into()));
    let end = streaming.expect().await?;
    ensure!(
        end["type"] == "BOOKMARK"
            && end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true",
        "{end}"
    );
    let (code, _) = raw(
        &client,
        "GET",
        "/api/v1/nodes?watch=true&sendInitialEvents=true",
        None,
        b"",
    )
    .await?;
    ensure!(
        code == 400,
        "sendInitialEvents needs bookmarks and NotOlderThan"
    );

    // kube-runtime's streaming-list watcher works against it.
    let stream = watcher(nodes.clone(), watcher::Config::default().streaming_lists());
    let mut stream = Box::pin(stream);
    let mut names = Vec::new();
    loop {
        match tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .context("watcher stalled")??
        {
            Some(watcher::Event::InitApply(n)) => names.push(n.name_any()),
            Some(watcher::Event::InitDone) => break,
            _ => {}
        }
    }
    ensure!(names == ["n1"]);
    Ok(())
}

#[tokio::test]
async fn watch_selectors_turn_transitions_into_added_and_deleted() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let (_, mut events) = Events::open(
        &client,
        "/api/v1/namespaces/default/configmaps?watch=true&labelSelector=role%3Dx",
    )
    .await?;
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "a", "labels": {"role": "y"}}}))?;
    cms.create(&PostParams::default(), &cm).await?;
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"role": "x"}}})),
    )
    .await?;
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await?;
    let stop = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"role": "z"}}})),
        )
        .await?;
    let added = events.expect_change().await?;
    ensure!(summary(&added) == ("ADDED".into(), "a".into()), "{added}");
    ensure!(summary(&events.expect_change().await?) == ("MODIFIED".into(), "a".into()));
    let gone = events.expect_change().await?;
    ensure!(summary(&gone) == ("DELETED".into(), "a".into()));
    ensure!(
        gone["object"]["metadata"]["labels"]["role"] == "x",
        "the last matching state, as the real watch cache sends"
    );
    ensure!(
        gone["object"]["metadata"]["resourceVersion"].as_str()
            == stop.resource_version().as_deref()
    );
    Ok(())
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_410() -> anyhow::Result<()> {
    let (server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("a")?).await?;
    let mut stream = Box::pin(watcher(
        nodes.clone(),
        watcher::Config::default().disable_bookmarks(),
    ));
    let mut next = async || -> anyhow::Result<Result<watcher::Event<Node>, watcher::Error>> {
        tokio::time::timeout(DEADLINE, stream.next())
            .await
            .context("watcher stalled")?
            .context("watcher ended")
    };
    loop {
        if matches!(next().await?, Ok(watcher::Event::InitDone)) {
            break;
        }
    }
    nodes.create(&PostParams::default(), &node("b")?).await?;
    match next().await? {
        Ok(watcher::Event::Apply(n)) if n.name_any() == "b" => {}
        other => return Err(anyhow!("expected Apply(b), got {other:?}")),
    }
    // Move the history past the watcher's resourceVersion and cut its
    // connection: the re-watch gets 410 and the watcher relists.
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &config_map("bump", json!({}))?)
        .await?;
    server.compact();
    server.reset_stats();
    server.close_watches();
    match next().await? {
        Err(watcher::Error::WatchError(s)) if s.code == 410 && s.reason == "Expired" => {}
        other => return Err(anyhow!("expected a 410 watch error, got {other:?}")),
    }
    let mut relisted = Vec::new();
    loop {
        match next().await? {
            Ok(watcher::Event::InitApply(n)) => relisted.push(n.name_any()),
            Ok(watcher::Event::InitDone) => break,
            _ => {}
        }
    }
    ensure!(relisted == ["a", "b"], "{relisted:?}");
    ensure!(server.stats().count("list", "nodes") >= 1);
    // And it keeps watching.
    nodes.delete("a", &DeleteParams::default()).await?;
    loop {
        if let Ok(watcher::Event::Delete(n)) = next().await? {
            ensure!(n.name_any() == "a");
            break;
        }
    }
    Ok(())
}

#[tokio::test]
async fn merge_json_and_strategic_patches() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut n = node("n1")?;
    n.spec.as_mut().context("spec")?.taints = Some(serde_json::from_value(
        json!([{"key": "a", "effect": "NoSchedule"}]),
    )?);
    nodes.create(&PostParams::default(), &n).await?;

    // Merge patch on labels.
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": null, "new": "1"}}})),
        )
        .await?;
    ensure!(
        p.labels() == &BTreeMap::from([("new".to_string(), "1".to_string())]),
        "{:?}",
        p.labels()
    );

    // Strategic: taints replace, finalizers union (podCIDRs union too, but the
    // real validation lets a node set them only once).
    let smp = json!({
        "metadata": {"finalizers": ["f1"]},
        "spec": {"taints": [{"key": "b", "effect": "NoExecute"}], "podCIDRs": ["10.0.0.0/24"]},
    });
    nodes
        .patch("n1", &PatchParams::default(), &Patch::Strategic(smp))
        .await?;
    let p = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"finalizers": ["f2"]}, "spec": {"podCIDRs": ["10.0.0.0/24"]}}),
            ),
        )
        .await?;
    let taints: Vec<String> = p
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    ensure!(taints == ["b"], "{taints:?}");
    ensure!(p.finalizers() == ["f1", "f2"]);
    ensure!(p.spec.as_ref().and_then(|s| s.pod_cidrs.clone()) == Some(vec!["10.0.0.0/24".into()]));

    // Strategic on /status: addresses and conditions merge by type.
    let status = json!({"status": {
        "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "NetworkUnavailable", "status": "True"}],
    }});
    nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(status))
        .await?;
    let more = json!({"status": {
        "addresses": [{"type": "Hostname", "address": "ip-10-0-0-1"}],
        "conditions": [{"type": "NetworkUnavailable", "status": "False"}],
    }});
    let p = nodes
        .patch_status("n1", &PatchParams::default(), &Patch::Strategic(more))
        .await?;
    let st = p.status.context("status")?;
    let addrs: Vec<(String, String)> = st
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    ensure!(
        addrs
            == [
                ("InternalIP".into(), "10.0.0.1".into()),
                ("Hostname".into(), "ip-10-0-0-1".into())
            ],
        "{addrs:?}"
    );
    let conds: Vec<(String, String)> = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.status))
        .collect();
    ensure!(
        conds
            == [
                ("Ready".into(), "False".into()),
                ("NetworkUnavailable".into(), "False".into())
            ],
        "{conds:?}"
    );

    // JSON patch with a passing and a failing test op.
    let ok: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/spec/taints/0/key", "value": "b"},
        {"op": "remove", "path": "/spec/taints"},
    ]))?;
    let p = nodes
        .patch("n1", &PatchParams::default(), &Patch::Json::<()>(ok))
        .await?;
    ensure!(p.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none());
    let bad: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/metadata/name", "value": "other"}]),
    )?;
    ensure!(
        api_err(
            nodes
                .patch("n1", &PatchParams::default(), &Patch::Json::<()>(bad))
                .await
        )?
        .0 == 422
    );

    // Services: ports merge by port, ingress replaces.
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    svcs.create(
        &PostParams::default(),
        &service(
            "s",
            json!([{"name": "http", "port": 80}, {"name": "https", "port": 443}]),
        )?,
    )
    .await?;
    let p = svcs
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"ports": [{"port": 443, "name": "tls"}]}})),
        )
        .await?;
    let ports: Vec<(String, i32)> = p
        .spec
        .and_then(|s| s.ports)
        .unwrap_or_default()
        .into_iter()
        .map(|p| (p.name.unwrap_or_default(), p.port))
        .collect();
    ensure!(
        ports == [("http".into(), 80), ("tls".into(), 443)],
        "{ports:?}"
    );
    for host in ["a.elb", "b.elb"] {
        svcs.patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"loadBalancer": {"ingress": [{"hostname": host}]}}}),
            ),
        )
        .await?;
    }
    let ingress = svcs
        .get_status("s")
        .await?
        .status
        .and_then(|s| s.load_balancer)
        .and_then(|l| l.ingress)
        .unwrap_or_default();
    ensure!(ingress.len() == 1 && ingress[0].hostname.as_deref() == Some("b.elb"));

    // providerID and clusterIP only change from unset, as the real validation says.
    let moved = json!({"spec": {"providerID": "aws:///us-east-1b/i-other"}});
    let (code, reason, message) = api_err(
        nodes
            .patch("n1", &PatchParams::default(), &Patch::Merge(&moved))
            .await,
    )?;
    ensure!(
        (code, reason.as_str()) == (422, "Invalid") && message.contains("spec.providerID"),
        "{message}"
    );
    let ip = json!({"spec": {"clusterIP": "10.96.99.99"}});
    ensure!(
        api_err(
            svcs.patch("s", &PatchParams::default(), &Patch::Merge(&ip))
                .await
        )?
        .0 == 422
    );

    // Unknown patch media type.
    let (code, body) = raw(
        &client,
        "PATCH",
        "/api/v1/nodes/n1",
        Some("text/plain"),
        b"{}",
    )
    .await?;
    ensure!(code == 415, "{body}");
    Ok(())
}

#[tokio::test]
async fn server_side_apply_tracks_owners_and_conflicts() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let applied = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n1", "labels": {"a": "1", "b": "1"}},
        "spec": {"unschedulable": true},
    });
    // Apply creates a missing object.
    let n = nodes
        .patch("n1", &PatchParams::apply("mgr1"), &Patch::Apply(&applied))
        .await?;
    let mf = n.metadata.managed_fields.clone().unwrap_or_default();
    ensure!(
        mf.len() == 1
            && mf[0].manager.as_deref() == Some("mgr1")
            && mf[0].operation.as_deref() == Some("Apply")
    );
    let fields = serde_json::to_value(mf[0].fields_v1.clone())?;
    ensure!(
        fields
            == json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}, "f:spec": {"f:unschedulable": {}}}),
        "{fields}"
    );

    // Another manager applying a different value conflicts, naming the owner.
    let other = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"b": "2"}}});
    let (code, reason, message) = api_err(
        nodes
            .patch("n1", &PatchParams::apply("mgr2"), &Patch::Apply(&other))
            .await,
    )?;
    ensure!((code, reason.as_str()) == (409, "Conflict"));
    ensure!(
        message
            == "Apply failed with 1 conflict: conflict with \"mgr1\" using v1: .metadata.labels.b",
        "{message}"
    );

    // The same value is shared, not a conflict; force takes ownership.
    let same = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1"}}});
    nodes
        .patch("n1", &PatchParams::apply("mgr2"), &Patch::Apply(&same))
        .await?;
    let forced = nodes
        .patch(
            "n1",
            &PatchParams::apply("mgr2").force(),
            &Patch::Apply(&other),
        )
        .await?;
    ensure!(forced.labels().get("b").map(String::as_str) == Some("2"));
    // mgr2's config replaced: it no longer applies label a, but mgr1 still owns it.
    ensure!(forced.labels().get("a").map(String::as_str) == Some("1"));

    // mgr1 drops label b from its config: b is mgr2's now and stays; mgr1
    // drops spec.unschedulable: nobody else owns it, so it goes.
    let slim = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"a": "1"}}});
    let n = nodes
        .patch("n1", &PatchParams::apply("mgr1"), &Patch::Apply(&slim))
        .await?;
    ensure!(n.labels().get("b").map(String::as_str) == Some("2"));
    ensure!(
        n.spec.as_ref().and_then(|s| s.unschedulable).is_none(),
        "{:?}",
        n.spec
    );

    // Service ports are keyed by port and (defaulted) protocol.
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "name": "http"}]}});
    svcs.patch("web", &PatchParams::apply("svc-mgr"), &Patch::Apply(&svc))
        .await?;
    let again = svcs
        .patch("web", &PatchParams::apply("svc-mgr"), &Patch::Apply(&svc))
        .await?;
    let ports = again.spec.and_then(|s| s.ports).unwrap_or_default();
    ensure!(
        ports.len() == 1 && ports[0].node_port.is_some(),
        "{ports:?}"
    );

    // Apply to /status with keyed list items.
    let status = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
    let n = nodes
        .patch_status(
            "n1",
            &PatchParams::apply("kubelet").force(),
            &Patch::Apply(&status),
        )
        .await?;
    let entry = n
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("kubelet"))
        .context("kubelet entry")?;
    ensure!(entry.subresource.as_deref() == Some("status"));
    let fields = serde_json::to_value(entry.fields_v1)?;
    ensure!(
        fields
            == json!({"f:status": {"f:conditions": {"k:{\"type\":\"Ready\"}": {".": {}, "f:status": {}, "f:type": {}}}}}),
        "{fields}"
    );

    // Non-apply writes record Update entries for their field manager.
    let pp = PatchParams {
        field_manager: Some("labeller".into()),
        ..Default::default()
    };
    let n = nodes
        .patch(
            "n1",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"c": "3"}}})),
        )
        .await?;
    let upd = n
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|e| e.manager.as_deref() == Some("labeller"))
        .context("labeller")?;
    ensure!(upd.operation.as_deref() == Some("Update"));

    // `[]` keeps the managed fields, `[{}]` strips them, as documented upstream.
    let kept = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": []}})),
        )
        .await?;
    ensure!(kept.metadata.managed_fields.is_some_and(|m| !m.is_empty()));
    let reset = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"managedFields": [{}]}})),
        )
        .await?;
    ensure!(
        reset.metadata.managed_fields.is_none(),
        "{:?}",
        reset.metadata.managed_fields
    );

    // fieldManager is required; YAML bodies work.
    let yaml = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  k: v\n";
    let (code, body) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/y",
        Some("application/apply-patch+yaml"),
        yaml,
    )
    .await?;
    ensure!(code == 400, "{body}");
    let (code, body) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/y?fieldManager=yaml",
        Some("application/apply-patch+yaml"),
        yaml,
    )
    .await?;
    ensure!(code == 201 && body["data"]["k"] == "v", "{code} {body}");
    Ok(())
}

#[tokio::test]
async fn status_subresource_separates_spec_and_status() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    let created = svcs
        .create(
            &PostParams::default(),
            &service("s", json!([{"port": 80}]))?,
        )
        .await?;
    let spec = created.spec.clone().context("spec")?;
    let port = &spec.ports.clone().unwrap_or_default()[0];
    ensure!(
        port.node_port.is_some_and(|p| (30000..=32767).contains(&p)),
        "node ports are allocated: {port:?}"
    );
    ensure!(spec.cluster_ip.is_some());

    // A status write ignores the spec but keeps label changes (the real rule for built-in types).
    let mut s = created.clone();
    s.spec.as_mut().context("spec")?.type_ = Some("NodePort".into());
    s.labels_mut().insert("via".into(), "status".into());
    s.status = Some(serde_json::from_value(
        json!({"loadBalancer": {"ingress": [{"hostname": "lb.example"}]}}),
    )?);
    let after = svcs.replace_status("s", &PostParams::default(), &s).await?;
    ensure!(after.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"));
    ensure!(after.labels().get("via").map(String::as_str) == Some("status"));
    ensure!(
        after
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_some_and(|i| i.len() == 1)
    );

    // A main-resource write never changes status.
    let mut main = after.clone();
    main.status = None;
    main.spec.as_mut().context("spec")?.session_affinity = Some("ClientIP".into());
    let after_main = svcs.replace("s", &PostParams::default(), &main).await?;
    ensure!(after_main.status == after.status);
    ensure!(
        after_main
            .spec
            .as_ref()
            .and_then(|s| s.session_affinity.as_deref())
            == Some("ClientIP")
    );
    let st = svcs.get_status("s").await?;
    ensure!(st.status == after.status);

    // Nodes keep the status they are created with (the real node strategy allows it).
    let nodes: Api<Node> = Api::all(client.clone());
    let mut n = node("n1")?;
    n.status = Some(serde_json::from_value(
        json!({"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}),
    )?);
    let n = nodes.create(&PostParams::default(), &n).await?;
    ensure!(
        n.status
            .and_then(|s| s.addresses)
            .is_some_and(|a| a.len() == 1)
    );
    Ok(())
}

#[tokio::test]
async fn finalizers_hold_deletion_until_removed() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "f", "finalizers": ["example.com/hold"]}}),
    )?;
    let created = cms.create(&PostParams::default(), &cm).await?;
    let rv = created.resource_version().context("rv")?;
    let (_, mut events) = Events::open(
        &client,
        &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"),
    )
    .await?;

    // Wrong preconditions conflict.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("nope".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, _, message) = api_err(cms.delete("f", &dp).await)?;
    ensure!(
        code == 409 && message.contains("Precondition failed: UID in precondition: nope"),
        "{message}"
    );

    let deleting = cms.delete("f", &DeleteParams::default()).await?;
    let obj = deleting
        .left()
        .context("a held deletion answers with the object")?;
    ensure!(obj.metadata.deletion_timestamp.is_some());
    ensure!(obj.metadata.deletion_grace_period_seconds == Some(0));
    ensure!(summary(&events.expect().await?) == ("MODIFIED".into(), "f".into()));

    // No new finalizers on a deleting object.
    let add = json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}});
    let (code, reason, message) = api_err(
        cms.patch("f", &PatchParams::default(), &Patch::Merge(&add))
            .await,
    )?;
    ensure!((code, reason.as_str()) == (422, "Invalid"), "{message}");
    ensure!(
        message.contains("no new finalizers can be added if the object is being deleted"),
        "{message}"
    );

    // Removing the last finalizer deletes it.
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    ensure!(summary(&events.expect().await?) == ("DELETED".into(), "f".into()));
    ensure!(api_err(cms.get("f").await)?.0 == 404);

    // Services (like pods) answer an immediate delete with the object.
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    svcs.create(
        &PostParams::default(),
        &service("s", json!([{"port": 80}]))?,
    )
    .await?;
    ensure!(svcs.delete("s", &DeleteParams::default()).await?.is_left());
    Ok(())
}

#[tokio::test]
async fn leases_support_leader_election_races() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease = |holder: &str| -> anyhow::Result<Lease> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": "cloud-controller-manager"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15},
        }))?)
    };
    // Two candidates race to create: one wins.
    let (la, lb, pp) = (lease("a")?, lease("b")?, PostParams::default());
    let (a, b) = tokio::join!(leases.create(&pp, &la), leases.create(&pp, &lb));
    ensure!(a.is_ok() != b.is_ok(), "exactly one create wins");
    let loser = if a.is_ok() { b } else { a };
    ensure!(api_err(loser)?.1 == "AlreadyExists");

    // Both renew from the same read: one update wins, the other conflicts.
    let current = leases.get("cloud-controller-manager").await?;
    let mut x = current.clone();
    x.spec.as_mut().context("spec")?.holder_identity = Some("x".into());
    let mut y = current.clone();
    y.spec.as_mut().context("spec")?.holder_identity = Some("y".into());
    leases
        .replace("cloud-controller-manager", &PostParams::default(), &x)
        .await?;
    let (code, reason, _) = api_err(
        leases
            .replace("cloud-controller-manager", &PostParams::default(), &y)
            .await,
    )?;
    ensure!((code, reason.as_str()) == (409, "Conflict"));
    let now = leases.get("cloud-controller-manager").await?;
    ensure!(now.spec.and_then(|s| s.holder_identity).as_deref() == Some("x"));

    // Leases allow create-on-update (PUT of a missing lease creates it).
    let fresh = leases
        .replace(
            "other",
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "other"}}))?,
        )
        .await?;
    ensure!(fresh.metadata.uid.is_some());
    Ok(())
}

#[tokio::test]
async fn events_from_kube_recorder_and_core_events() -> anyhow::Result<()> {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes.create(&PostParams::default(), &node("n1")?).await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cloud-node-controller".into(),
            instance: None,
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Synced".into(),
        note: Some("node synced".into()),
        action: "Sync".into(),
        secondary: None,
    };
    let reference = n.object_ref(&());
    recorder.publish(&ev, &reference).await?;
    recorder.publish(&ev, &reference).await?;
    let events: Api<EventsV1> = Api::namespaced(client.clone(), "default");
    let found = events
        .list(&ListParams::default().fields("regarding.name=n1"))
        .await?;
    ensure!(found.items.len() == 1, "{:?}", found.items);
    ensure!(
        found.items[0].series.as_ref().map(|s| s.count) == Some(2),
        "the second publish patches the series"
    );
    ensure!(
        events
            .list(&ListParams::default().fields("regarding.name=other"))
            .await?
            .items
            .is_empty()
    );

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let ce: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "n1.1"},
        "involvedObject": {"kind": "Node", "name": "n1"},
        "reason": "Deleted", "message": "gone", "type": "Normal",
    }))?;
    core.create(&PostParams::default(), &ce).await?;
    core.patch(
        "n1.1",
        &PatchParams::default(),
        &Patch::Merge(json!({"count": 2})),
    )
    .await?;
    // The two APIs serve one storage, converted, as in the real server.
    let found = core
        .list(&ListParams::default().fields("involvedObject.name=n1,involvedObject.kind=Node"))
        .await?;
    let by_reason: BTreeMap<String, CoreEvent> = found
        .items
        .into_iter()
        .map(|e| (e.reason.clone().unwrap_or_default(), e))
        .collect();
    ensure!(by_reason.len() == 2, "{by_reason:?}");
    ensure!(by_reason.get("Deleted").and_then(|e| e.count) == Some(2));
    let synced = by_reason
        .get("Synced")
        .context("the recorder's event, seen as core/v1")?;
    ensure!(synced.message.as_deref() == Some("node synced"));
    ensure!(synced.reporting_component.as_deref() == Some("cloud-node-controller"));
    let as_v1 = events.get("n1.1").await?;
    ensure!(as_v1.note.as_deref() == Some("gone") && as_v1.deprecated_count == Some(2));
    ensure!(as_v1.regarding.and_then(|r| r.name).as_deref() == Some("n1"));
    // A merge patch through events.k8s.io uses its field names.
    let patched = events
        .patch(
            "n1.1",
            &PatchParams::default(),
            &Patch::Merge(json!({"note": "really gone"})),
        )
        .await?;
    ensure!(patched.note.as_deref() == Some("really gone"));
    ensure!(core.get("n1.1").await?.message.as_deref() == Some("really gone"));
    // Watches of the alias see its form too.
    let (_, mut watch) = Events::open(
        &client,
        "/apis/events.k8s.io/v1/namespaces/default/events?watch=true&fieldSelector=regarding.name%3Dn1",
    )
    .await?;
    let first = watch.expect_change().await?;
    ensure!(
        first["object"]["apiVersion"] == "events.k8s.io/v1"
            && first["object"].get("regarding").is_some(),
        "{first}"
    );
    Ok(())
}

#[tokio::test]
async fn discovery_and_version() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let info = client.apiserver_version().await?;
    ensure!(info.major == "1");
    let discovery = kube::Discovery::new(client.clone()).run().await?;
    let (lease, caps) = discovery
        .resolve_gvk(&kube::core::GroupVersionKind::gvk(
            "coordination.k8s.io",
            "v1",
            "Lease",
        ))
        .context("leases discovered")?;
    ensure!(lease.plural == "leases" && caps.scope == kube::discovery::Scope::Namespaced);
    ensure!(caps.supports_operation(kube::discovery::verbs::WATCH));
    let (node, caps) = discovery
        .resolve_gvk(&kube::core::GroupVersionKind::gvk("", "v1", "Node"))
        .context("nodes")?;
    ensure!(node.plural == "nodes" && caps.scope == kube::discovery::Scope::Cluster);
    ensure!(
        caps.subresources
            .iter()
            .any(|(r, _)| r.plural == "nodes/status" || r.plural == "status"),
        "{:?}",
        caps.subresources
    );
    for gvk in [
        ("events.k8s.io", "Event"),
        ("discovery.k8s.io", "EndpointSlice"),
        ("", "Endpoints"),
        ("", "Pod"),
    ] {
        ensure!(
            discovery
                .resolve_gvk(&kube::core::GroupVersionKind::gvk(gvk.0, "v1", gvk.1))
                .is_some(),
            "{gvk:?}"
        );
    }
    // Aggregated discovery (two requests) finds the same.
    let aggregated = kube::Discovery::new(client.clone())
        .run_aggregated()
        .await?;
    for gvk in [
        ("coordination.k8s.io", "Lease"),
        ("events.k8s.io", "Event"),
        ("", "Node"),
        ("", "Service"),
    ] {
        let gvk = kube::core::GroupVersionKind::gvk(gvk.0, "v1", gvk.1);
        ensure!(aggregated.resolve_gvk(&gvk).is_some(), "{gvk:?}");
    }
    Ok(())
}

#[tokio::test]
async fn injected_failures_and_request_stats() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = no_retry_client(&server)?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("n1")?).await?;
    server.reset_stats();
    server.inject_failure(FailureRule::new("patch", "nodes/status", 500).times(2));
    server.inject_failure(FailureRule::new("get", "nodes", 429).name("n1"));
    let patch = Patch::Merge(json!({"status": {"phase": "Running"}}));
    for _ in 0..2 {
        let (code, reason, _) = api_err(
            nodes
                .patch_status("n1", &PatchParams::default(), &patch)
                .await,
        )?;
        ensure!((code, reason.as_str()) == (500, "InternalError"));
    }
    nodes
        .patch_status("n1", &PatchParams::default(), &patch)
        .await?;
    // kube-apiserver's 429 is plain text, not a Status: kube-rs keeps the code.
    let (code, _, message) = api_err(nodes.get("n1").await)?;
    ensure!(
        code == 429 && message.starts_with("Too many requests"),
        "{message}"
    );
    nodes.get("n1").await?;
    let (code, _) = raw(&client, "GET", "/api/v1/nodes/n1", None, b"").await?;
    ensure!(code == 200);

    let stats = server.stats();
    ensure!(stats.count("patch", "nodes/status") == 3);
    ensure!(stats.count("get", "nodes") == 3);
    ensure!(stats.writes("nodes/status") == 3 && stats.writes("nodes") == 0);
    ensure!(stats.total_writes() == 3);
    server.reset_stats();
    ensure!(server.stats().total() == 0);

    // kube's default client retries 503 by itself: a short burst is invisible.
    let retrying: Api<Node> = Api::all(server.client().await?);
    server.inject_failure(FailureRule::new("get", "nodes", 503).times(2));
    retrying.get("n1").await?;
    ensure!(server.stats().count("get", "nodes") == 3);
    Ok(())
}

#[tokio::test]
async fn seed_yaml_and_kubeconfig() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    server
        .seed_yaml(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: seeded\n  resourceVersion: \"99\"\nstatus:\n  addresses:\n  - type: InternalIP\n    address: 10.1.2.3\n\
             ---\n\
             apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: apps\nspec:\n  type: LoadBalancer\n  ports:\n  - port: 80\n\
             ---\n\
             apiVersion: v1\nkind: Namespace\nmetadata:\n  name: apps\n\
             ---\n\
             apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n",
        )
        .await?;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path)?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    ensure!(config.cluster_url.to_string().trim_end_matches('/') == server.url());
    let client = Client::try_from(config)?;
    let n = Api::<Node>::all(client.clone()).get("seeded").await?;
    ensure!(
        n.status
            .and_then(|s| s.addresses)
            .is_some_and(|a| a[0].address == "10.1.2.3")
    );
    let svc = Api::<Service>::namespaced(client.clone(), "apps")
        .get("web")
        .await?;
    ensure!(
        svc.spec
            .and_then(|s| s.ports)
            .is_some_and(|p| p[0].node_port.is_some())
    );
    ensure!(
        server
            .seed_yaml("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n")
            .await
            .is_err(),
        "unserved kinds are an error"
    );
    Ok(())
}

#[tokio::test]
async fn metadata_only_requests() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.create(&PostParams::default(), &node("n1")?).await?;
    let list = nodes.list_metadata(&ListParams::default()).await?;
    ensure!(list.items.len() == 1 && list.items[0].metadata.name.as_deref() == Some("n1"));
    let one = nodes.get_metadata("n1").await?;
    ensure!(one.metadata.labels.is_some());
    let meta: Api<kube::core::PartialObjectMeta<Node>> = Api::all(client.clone());
    let mut stream = Box::pin(watcher(meta, watcher::Config::default()));
    loop {
        match tokio::time::timeout(DEADLINE, stream.try_next())
            .await
            .context("stalled")??
        {
            Some(watcher::Event::InitApply(m)) => ensure!(m.metadata.name.as_deref() == Some("n1")),
            Some(watcher::Event::InitDone) => break,
            _ => {}
        }
    }
    Ok(())
}

#[tokio::test]
async fn slow_watcher_does_not_block_writers() -> anyhow::Result<()> {
    let server = TestApiServer::start_with(ServerOptions {
        history_size: 32,
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // Opened and never read while ~19 MiB of changes happen: far more than
    // loopback socket buffers hold, so the server side falls behind.
    let (_, mut stalled) = Events::open(
        &client,
        "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=0",
    )
    .await?;
    let big = "x".repeat(64 * 1024);
    let writes = async {
        for i in 0..300 {
            cms.create(
                &PostParams::default(),
                &config_map(&format!("c{i}"), json!({"blob": big}))?,
            )
            .await?;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(120), writes)
        .await
        .context("writers were blocked")??;
    // The stalled watcher was dropped: it sees a prefix of the events, then the end.
    let mut seen = 0;
    while tokio::time::timeout(DEADLINE, stalled.next())
        .await
        .context("the dropped watch did not end")??
        .is_some()
    {
        seen += 1;
    }
    ensure!(
        seen < 300,
        "a watcher that fell behind is closed (saw {seen})"
    );
    Ok(())
}

#[tokio::test]
async fn many_nodes_list_and_watch() -> anyhow::Result<()> {
    let (_server, client) = setup().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut stream = Box::pin(watcher(nodes.clone(), watcher::Config::default()));
    loop {
        if let Ok(watcher::Event::InitDone) = tokio::time::timeout(DEADLINE, stream.next())
            .await?
            .context("ended")?
        {
            break;
        }
    }
    let creates = futures::stream::iter(0..2000)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .create(&PostParams::default(), &node(&format!("node-{i:05}"))?)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>();
    let ((), created) = tokio::join!(
        async {
            let mut applied = 0;
            while applied < 2000 {
                match tokio::time::timeout(Duration::from_secs(60), stream.next()).await {
                    Ok(Some(Ok(watcher::Event::Apply(_)))) => applied += 1,
                    Ok(Some(_)) => {}
                    _ => break,
                }
            }
            assert_eq!(applied, 2000, "the watcher saw every node");
        },
        creates
    );
    ensure!(created?.len() == 2000);
    let listed = nodes
        .list(&ListParams::default().labels("app=test"))
        .await?;
    ensure!(listed.items.len() == 2000);
    Ok(())
}

#[tokio::test]
async fn binary_serves_until_sigterm() -> anyhow::Result<()> {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir()?;
    let seed = dir.path().join("seed.yaml");
    std::fs::write(
        &seed,
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: from-seed\n",
    )?;
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kube-test-server"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--seed")
        .arg(&seed)
        .arg("--bookmark-interval")
        .arg("200ms")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(DEADLINE, lines.next_line())
        .await
        .context("no banner")??
        .context("no output")?;
    let url = line
        .strip_prefix("kube-test-server listening on ")
        .context("banner format")?
        .to_string();
    ensure!(url.starts_with("http://127.0.0.1:"), "{url}");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig)?,
        &Default::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    Api::<Node>::all(client).get("from-seed").await?;
    let pid = child.id().context("pid")?;
    let status = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()?;
    ensure!(status.success());
    let exit = tokio::time::timeout(DEADLINE, child.wait())
        .await
        .context("did not exit on SIGTERM")??;
    ensure!(exit.success(), "{exit:?}");
    Ok(())
}

#[tokio::test]
async fn shutdown_and_drop_stop_serving() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let (_, mut watch) = Events::open(&client, "/api/v1/nodes?watch=true").await?;
    let addr = server.url().trim_start_matches("http://").to_string();
    server.shutdown().await;
    let end = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .context("the watch outlived the server")?;
    ensure!(!matches!(end, Ok(Some(_))), "{end:?}");
    ensure!(
        tokio::net::TcpStream::connect(&addr).await.is_err(),
        "the port is closed after shutdown"
    );

    let dropped = TestApiServer::start().await?;
    let client = dropped.client().await?;
    let (_, mut watch) = Events::open(&client, "/api/v1/nodes?watch=true").await?;
    drop(dropped);
    let end = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .context("the watch outlived the dropped server")?;
    ensure!(!matches!(end, Ok(Some(_))), "{end:?}");
    Ok(())
}

// ---- a harsher world: faults, dropped watches, compaction, a lagging cache, RBAC ----

/// Sends a raw request; returns the status, the headers and the body text.
async fn raw_text(
    client: &Client,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: &[u8],
) -> anyhow::Result<(u16, http::HeaderMap, String)> {
    let mut req = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let resp = client
        .send(req.body(kube::client::Body::from(body.to_vec()))?)
        .await?;
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    let bytes = resp.into_body().collect().await?.to_bytes();
    Ok((code, headers, String::from_utf8_lossy(&bytes).into_owned()))
}

#[tokio::test]
async fn injected_faults_answer_as_kube_apiserver_does() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = no_retry_client(&server)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let n1 = nodes.create(&PostParams::default(), &node("n1")?).await?;

    // 409 on compare-and-swap writes only: a merge patch without a
    // resourceVersion passes, an update carrying one conflicts.
    server.inject_failure(
        FailureRule::new("*", "nodes", 409)
            .compare_and_swap()
            .always(),
    );
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await?;
    let fresh = nodes.get("n1").await?;
    let (code, reason, message) =
        api_err(nodes.replace("n1", &PostParams::default(), &fresh).await)?;
    ensure!((code, reason.as_str()) == (409, "Conflict"));
    ensure!(
        message
            == "Operation cannot be fulfilled on nodes \"n1\": the object has been modified; please apply your changes to the latest version and try again",
        "{message}"
    );
    let with_rv = Patch::Merge(
        json!({"metadata": {"resourceVersion": fresh.resource_version(), "labels": {"c": "d"}}}),
    );
    let (code, _, _) = api_err(nodes.patch("n1", &PatchParams::default(), &with_rv).await)?;
    ensure!(code == 409);
    server.clear_failures();
    ensure!(n1.resource_version() != fresh.resource_version());

    // 429: the priority-and-fairness rejection, plain text with Retry-After.
    server.inject_failure(FailureRule::new("list", "nodes", 429).retry_after(3));
    let (code, headers, body) = raw_text(&client, "GET", "/api/v1/nodes", None, b"").await?;
    ensure!(code == 429);
    ensure!(
        body == "Too many requests, please try again later.\n",
        "{body:?}"
    );
    ensure!(headers.get("retry-after").and_then(|v| v.to_str().ok()) == Some("3"));
    ensure!(
        headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/plain")),
        "{headers:?}"
    );

    // 500 and 503 as Status objects with kube-apiserver's reasons.
    server.inject_failure(FailureRule::new("get", "nodes", 500).message("etcd is down"));
    let (code, v) = raw(&client, "GET", "/api/v1/nodes/n1", None, b"").await?;
    ensure!(code == 500);
    ensure!(
        v["reason"] == "InternalError" && v["message"] == "Internal error occurred: etcd is down",
        "{v}"
    );
    ensure!(
        v["details"]["causes"][0]["message"] == "etcd is down",
        "{v}"
    );
    server.inject_failure(FailureRule::new("get", "nodes", 503));
    let (code, v) = raw(&client, "GET", "/api/v1/nodes/n1", None, b"").await?;
    ensure!(code == 503 && v["reason"] == "ServiceUnavailable", "{v}");

    // A slow answer is still an answer, after at least the delay.
    let delay = Duration::from_millis(200);
    server.inject_failure(FailureRule::slow("get", "nodes", delay));
    let started = tokio::time::Instant::now();
    let got = nodes.get("n1").await?;
    ensure!(started.elapsed() >= delay, "answered before the delay");
    ensure!(got.name_any() == "n1");
    Ok(())
}

#[tokio::test]
async fn watches_drop_on_a_timer_and_kube_watchers_resume() -> anyhow::Result<()> {
    let server = TestApiServer::start_with(ServerOptions {
        watch_drop_every: Some(Duration::from_millis(100)),
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let (code, mut events) = Events::open(&client, "/api/v1/nodes?watch=true").await?;
    ensure!(code == 200);
    // The stream ends by itself (no events: there are no nodes).
    let end = tokio::time::timeout(DEADLINE, events.next()).await;
    ensure!(
        matches!(end, Ok(Ok(None))),
        "the watch was not dropped: {end:?}"
    );
    let dropped = server.disruptions().watches_dropped;
    ensure!(dropped >= 1, "the drop was not counted: {dropped}");

    // kube's watcher re-watches and misses nothing.
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen = std::collections::BTreeSet::new();
    let stream = watcher(nodes.clone(), watcher::Config::default());
    futures::pin_mut!(stream);
    for i in 0..5 {
        nodes
            .create(&PostParams::default(), &node(&format!("w{i}"))?)
            .await?;
    }
    tokio::time::timeout(DEADLINE, async {
        while seen.len() < 5 {
            match stream.try_next().await? {
                Some(watcher::Event::Apply(n) | watcher::Event::InitApply(n)) => {
                    seen.insert(n.name_any());
                }
                Some(_) => {}
                None => anyhow::bail!("the watcher stream ended"),
            }
        }
        Ok(())
    })
    .await
    .context("the watcher did not see all five nodes")??;
    Ok(())
}

#[tokio::test]
async fn compaction_on_a_timer_makes_resumed_watches_get_410() -> anyhow::Result<()> {
    let server = TestApiServer::start_with(ServerOptions {
        compact_every: Some(Duration::from_millis(50)),
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let a = cms
        .create(&PostParams::default(), &config_map("a", json!({}))?)
        .await?;
    cms.create(&PostParams::default(), &config_map("b", json!({}))?)
        .await?;
    let rv_a = a.resource_version().context("rv")?;
    // Wait, with a deadline, for a compaction after `b`: then resuming
    // from `a` is too old.
    let started = tokio::time::Instant::now();
    loop {
        let (_, mut events) = Events::open(
            &client,
            &format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv_a}&timeoutSeconds=1"),
        )
        .await?;
        let ev = events.expect().await?;
        if ev["type"] == "ERROR" {
            ensure!(
                ev["object"]["code"] == 410 && ev["object"]["reason"] == "Expired",
                "{ev}"
            );
            let d = server.disruptions();
            ensure!(d.expired >= 1, "the 410 was not counted: {d:?}");
            break;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "no compaction within {DEADLINE:?}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_lagging_watch_cache_serves_old_state_but_quorum_reads_are_fresh() -> anyhow::Result<()> {
    // A lag no test outlives: whatever the machine's speed, the cache has
    // not caught up when the reads below run.
    let server = TestApiServer::start_with(ServerOptions {
        watch_cache_lag: Duration::from_secs(3600),
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let created = nodes.create(&PostParams::default(), &node("late")?).await?;
    let rv: u64 = created.resource_version().context("rv")?.parse()?;
    ensure!(
        nodes.get("late").await?.name_any() == "late",
        "a quorum get sees it"
    );
    ensure!(nodes.list(&ListParams::default()).await?.items.len() == 1);
    let cached = nodes.list(&ListParams::default().match_any()).await?;
    ensure!(
        cached.items.is_empty(),
        "resourceVersion=0 list saw the write"
    );
    let cached_rv: u64 = cached.metadata.resource_version.context("rv")?.parse()?;
    ensure!(
        cached_rv < rv,
        "the cache's version {cached_rv} is not behind {rv}"
    );
    let (code, _) = raw(
        &client,
        "GET",
        "/api/v1/nodes/late?resourceVersion=0",
        None,
        b"",
    )
    .await?;
    ensure!(code == 404);
    // Both cached reads missed the write; the quorum reads are not counted.
    let d = server.disruptions();
    ensure!(d.stale_reads == 2, "{d:?}");

    // A watch does not see it yet either: the first thing it sends is a
    // bookmark at the cache's version.
    let (_, mut events) = Events::open(
        &client,
        "/api/v1/nodes?watch=true&resourceVersion=0&allowWatchBookmarks=true",
    )
    .await?;
    let ev = events.expect().await?;
    ensure!(ev["type"] == "BOOKMARK", "{ev}");
    ensure!(
        ev["object"]["metadata"]["resourceVersion"].as_str()
            == Some(cached_rv.to_string().as_str()),
        "{ev}"
    );

    // With a short lag the event comes, and never before the lag.
    let lag = Duration::from_millis(300);
    let server = TestApiServer::start_with(ServerOptions {
        watch_cache_lag: lag,
        ..Default::default()
    })
    .await?;
    let client = server.client().await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let (_, mut events) = Events::open(
        &client,
        &format!(
            "/api/v1/nodes?watch=true&resourceVersion={}",
            server.resource_version()
        ),
    )
    .await?;
    let started = tokio::time::Instant::now();
    nodes.create(&PostParams::default(), &node("soon")?).await?;
    let ev = events.expect_change().await?;
    ensure!(summary(&ev) == ("ADDED".into(), "soon".into()), "{ev}");
    ensure!(started.elapsed() >= lag, "the event came before the lag");
    let d = server.disruptions();
    ensure!(d.lagged_events >= 1 && d.stale_reads == 0, "{d:?}");
    Ok(())
}

const CCM_SA_TOKEN: &str = "ccm-sa-token";
const CCM_USER: &str = "system:serviceaccount:kube-system:cloud-controller-manager";

async fn token_client(server: &TestApiServer, token: &str) -> anyhow::Result<Client> {
    let kc = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml_with_token(token))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(Client::try_from(config)?)
}

#[tokio::test]
async fn rbac_from_the_manifest_is_enforced_and_recorded() -> anyhow::Result<()> {
    let record = tempfile::tempdir()?;
    let policy = std::fs::read_to_string(ccm_testkit::repo_path("manifests/base/rbac.yaml"))?;
    let server = TestApiServer::start_with(ServerOptions {
        rbac_policy: Some(policy),
        record_dir: Some(record.path().to_path_buf()),
        ..Default::default()
    })
    .await?;
    server.add_token(
        CCM_SA_TOKEN,
        ccm_testkit::apiserver::TokenUser::service_account(
            "kube-system",
            "cloud-controller-manager",
        ),
    );
    let admin = server.client().await?;
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node("n1")?)
        .await?;
    let ccm = token_client(&server, CCM_SA_TOKEN).await?;
    let nodes: Api<Node> = Api::all(ccm.clone());
    ensure!(nodes.list(&ListParams::default()).await?.items.len() == 1);
    nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addresses": []}})),
        )
        .await?;
    // Not granted: Forbidden, with kube-apiserver's text.
    let cms: Api<ConfigMap> = Api::namespaced(ccm.clone(), "default");
    let (code, reason, message) = api_err(cms.list(&ListParams::default()).await)?;
    ensure!((code, reason.as_str()) == (403, "Forbidden"));
    ensure!(
        message
            == format!(
                "configmaps is forbidden: User \"{CCM_USER}\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
            ),
        "{message}"
    );
    let (code, _, message) = api_err(
        nodes
            .replace_status("n1", &PostParams::default(), &nodes.get("n1").await?)
            .await,
    )?;
    ensure!(code == 403, "{message}");
    ensure!(
        message
            == format!(
                "nodes \"n1\" is forbidden: User \"{CCM_USER}\" cannot update resource \"nodes/status\" in API group \"\" at the cluster scope"
            ),
        "{message}"
    );
    // The leader-election Role: only its Lease, only in kube-system.
    let leases: Api<Lease> = Api::namespaced(ccm.clone(), "kube-system");
    let lease: Lease =
        serde_json::from_value(json!({"metadata": {"name": "cloud-controller-manager"}}))?;
    leases.create(&PostParams::default(), &lease).await?;
    leases.get("cloud-controller-manager").await?;
    let (code, _, _) = api_err(leases.get("someone-else").await)?;
    ensure!(code == 403);
    // Discovery is every authenticated user's.
    ccm.apiserver_version().await?;
    // An unknown token is 401.
    let stranger: Api<Node> = Api::all(token_client(&server, "nope").await?);
    let (code, _, _) = api_err(stranger.list(&ListParams::default()).await)?;
    ensure!(code == 401);

    let mut lines = Vec::new();
    for entry in std::fs::read_dir(record.path())? {
        let text = std::fs::read_to_string(entry?.path())?;
        for line in text.lines() {
            lines.push(serde_json::from_str::<
                ccm_testkit::apiserver::rbac::RbacRecord,
            >(line)?);
        }
    }
    let find = |verb: &str, resource: &str, sub: &str| {
        lines
            .iter()
            .find(|r| r.verb == verb && r.resource == resource && r.subresource == sub)
            .cloned()
    };
    let patch = find("patch", "nodes", "status").context("patch nodes/status not recorded")?;
    ensure!(patch.allowed && patch.user == CCM_USER);
    ensure!(
        patch
            .granted_by
            .iter()
            .any(|g| g.role == "ClusterRole/system:cloud-controller-manager"),
        "{patch:?}"
    );
    let denied = find("list", "configmaps", "").context("the denied list not recorded")?;
    ensure!(!denied.allowed && denied.granted_by.is_empty() && denied.namespace == "default");
    Ok(())
}

/// Runs kubectl against the server; (success, stdout + stderr).
async fn kubectl(
    kubeconfig: &std::path::Path,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<(bool, String)> {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().context("spawning kubectl")?;
    if let Some(mut pipe) = child.stdin.take() {
        pipe.write_all(stdin.unwrap_or_default().as_bytes()).await?;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .context("kubectl did not finish within 60 s")??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status.success(), text))
}

#[tokio::test]
async fn kubectl_creates_applies_replaces_and_prints_tables() -> anyhow::Result<()> {
    if std::process::Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        println!("SKIPPED: kubectl is not on PATH (CI has it)");
        return Ok(());
    }
    let server = TestApiServer::start().await?;
    let dir = tempfile::tempdir()?;
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc)?;
    let svc = |name: &str, port: u16| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  type: LoadBalancer\n  selector:\n    app: {name}\n  ports:\n  - port: {port}\n    targetPort: 8080\n  loadBalancerSourceRanges: [10.0.0.0/8]\n"
        )
    };
    // Validation (fieldValidation found in /openapi/v3) is on: no --validate=false.
    let (ok, out) = kubectl(&kc, &["create", "-f", "-"], Some(&svc("web", 80))).await?;
    ensure!(ok && out.contains("service/web created"), "{out}");
    let (ok, out) = kubectl(&kc, &["apply", "-f", "-"], Some(&svc("api", 80))).await?;
    ensure!(ok && out.contains("service/api created"), "{out}");
    let (ok, out) = kubectl(&kc, &["apply", "-f", "-"], Some(&svc("api", 81))).await?;
    ensure!(ok && out.contains("service/api configured"), "{out}");
    let (ok, out) = kubectl(&kc, &["replace", "-f", "-"], Some(&svc("web", 82))).await?;
    ensure!(ok && out.contains("service/web replaced"), "{out}");

    // kubectl get prints kube-apiserver's columns, EXTERNAL-IP included.
    let services: Api<Service> = Api::namespaced(server.client().await?, "default");
    services
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"loadBalancer": {"ingress": [{"hostname": "web.elb.example"}]}}}),
            ),
        )
        .await?;
    let (ok, out) = kubectl(&kc, &["get", "svc"], None).await?;
    ensure!(ok, "{out}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header
            == [
                "NAME",
                "TYPE",
                "CLUSTER-IP",
                "EXTERNAL-IP",
                "PORT(S)",
                "AGE"
            ],
        "{out}"
    );
    let web = out
        .lines()
        .find(|l| l.starts_with("web "))
        .context("no web row")?;
    ensure!(
        web.contains("web.elb.example") && web.contains(":"),
        "{out}"
    );
    ensure!(
        out.lines()
            .any(|l| l.starts_with("api ") && l.contains("<pending>")),
        "{out}"
    );
    Api::<Node>::all(server.client().await?)
        .create(&PostParams::default(), &node("n1")?)
        .await?;
    let (ok, out) = kubectl(&kc, &["get", "nodes"], None).await?;
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        ok && header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{out}"
    );

    // Source ranges are validated as kube-apiserver does.
    let bad = svc("bad", 80).replace("10.0.0.0/8", "10.0.0.0/33");
    let (ok, out) = kubectl(&kc, &["create", "-f", "-"], Some(&bad)).await?;
    ensure!(
        !ok && out.contains("spec.LoadBalancerSourceRanges[0]: Invalid value: \"10.0.0.0/33\""),
        "{out}"
    );
    Ok(())
}

/// SelfSubjectAccessReview: answered for the requester from the enforced
/// RBAC rules (the CCM's service account: nodes yes, secrets no; a
/// resource name the rule lists, and only it), allowed for the test's own
/// requests, 422 for a spec with neither attribute kind.
#[tokio::test]
async fn self_subject_access_reviews_answer_from_the_enforced_rbac() -> anyhow::Result<()> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let policy = std::fs::read_to_string(ccm_testkit::repo_path("manifests/base/rbac.yaml"))?;
    let server = TestApiServer::start_with(ServerOptions {
        rbac_policy: Some(policy),
        ..Default::default()
    })
    .await?;
    server.add_token(
        CCM_SA_TOKEN,
        ccm_testkit::apiserver::TokenUser::service_account(
            "kube-system",
            "cloud-controller-manager",
        ),
    );
    let review = |verb: &str, resource: &str, namespace: Option<&str>, name: Option<&str>| {
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(verb.into()),
                    group: Some(
                        if resource == "leases" {
                            "coordination.k8s.io"
                        } else {
                            ""
                        }
                        .into(),
                    ),
                    resource: Some(resource.into()),
                    namespace: namespace.map(str::to_string),
                    name: name.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let ask = |client: Client, r: SelfSubjectAccessReview| async move {
        let api: Api<SelfSubjectAccessReview> = Api::all(client);
        let answer = api.create(&PostParams::default(), &r).await?;
        Ok::<bool, anyhow::Error>(answer.status.is_some_and(|s| s.allowed))
    };
    let ccm = token_client(&server, CCM_SA_TOKEN).await?;
    ensure!(ask(ccm.clone(), review("list", "nodes", None, None)).await?);
    ensure!(
        !ask(
            ccm.clone(),
            review("get", "secrets", Some("default"), Some("x"))
        )
        .await?
    );
    let lease = Some("cloud-controller-manager");
    ensure!(
        ask(
            ccm.clone(),
            review("update", "leases", Some("kube-system"), lease)
        )
        .await?
    );
    ensure!(
        !ask(
            ccm.clone(),
            review("update", "leases", Some("kube-system"), Some("other"))
        )
        .await?
    );
    ensure!(
        !ask(
            ccm.clone(),
            review("update", "leases", Some("default"), lease)
        )
        .await?
    );
    // The test's own client (no token) is cluster-admin.
    let admin = server.client().await?;
    ensure!(
        ask(
            admin.clone(),
            review("get", "secrets", Some("default"), Some("x"))
        )
        .await?
    );
    let (code, _, _) = api_err(
        Api::<SelfSubjectAccessReview>::all(ccm)
            .create(&PostParams::default(), &SelfSubjectAccessReview::default())
            .await,
    )?;
    ensure!(
        code == 422,
        "a spec without attributes is invalid, got {code}"
    );
    Ok(())
}
