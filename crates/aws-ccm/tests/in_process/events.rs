//! The event recorder (`controllers/events.rs`) against the API test
//! server: publishing does not wait for the write, a full queue drops what
//! does not fit, and repeats fold into one series.

use std::time::Duration;

use aws_ccm::controllers::events::{Events, MAX_QUEUED};
use ccm_testkit::apiserver::TestApiServer;
use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::{Api, Client};

/// An API test server whose first event create is held `hold`, its
/// client, and a service-controller recorder on it.
async fn held_server(hold: Duration) -> anyhow::Result<(TestApiServer, Client, Events)> {
    let server = TestApiServer::start().await?;
    server.inject_failure(
        ccm_testkit::apiserver::FailureRule::slow("create", "events", hold).times(1),
    );
    let client = server.client().await?;
    let events = Events::new(client.clone(), "service-controller");
    Ok((server, client, events))
}

/// A reference to Service `default/name`.
fn service_ref(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some("default".into()),
        name: Some(name.into()),
        ..ObjectReference::default()
    }
}

/// Publishing does not wait for the apiserver: with the event's create
/// held 10 s by the server, the call has returned and nothing is stored
/// yet (had it waited, the event would be); `flushed` then waits for it.
#[tokio::test]
async fn publishing_does_not_wait_for_the_write() -> anyhow::Result<()> {
    let (server, client, events) = held_server(Duration::from_secs(10)).await?;
    let svc = service_ref("web");
    let api: Api<Event> = Api::namespaced(client, "default");
    events
        .normal(&svc, "EnsuringLoadBalancer", "Ensuring load balancer")
        .await;
    events
        .normal(&svc, "EnsuredLoadBalancer", "Ensured load balancer")
        .await;
    assert!(api.list(&Default::default()).await?.items.is_empty());
    events.flushed().await;
    let reasons: Vec<_> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert_eq!(reasons, ["EnsuringLoadBalancer", "EnsuredLoadBalancer"]);
    server.shutdown().await;
    Ok(())
}

/// While the writer is held by a slow write, the queue takes
/// [`MAX_QUEUED`] events and drops the rest: the series written after
/// the flush counts only the events that fit.
#[tokio::test]
async fn a_full_queue_drops_what_does_not_fit() -> anyhow::Result<()> {
    let (server, client, events) = held_server(Duration::from_secs(5)).await?;
    let svc = service_ref;
    let api: Api<Event> = Api::namespaced(client, "default");
    events
        .normal(&svc("held"), "EnsuringLoadBalancer", "held")
        .await;
    // The writer takes the held event once it runs; wait until the
    // server has its create, so the queue is empty again.
    let seen = || server.stats().count("create", "events");
    for _ in 0..500 {
        if seen() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen(), 1, "the held create reached the server");
    for i in 0..MAX_QUEUED + 5 {
        events
            .warning(&svc("busy"), "Busy", format!("try {i}"))
            .await;
    }
    events.flushed().await;
    let busy = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Busy"))
        .expect("the Busy series");
    assert_eq!(busy.count, Some(MAX_QUEUED as i32), "5 dropped");
    server.shutdown().await;
    Ok(())
}

/// Against the API test server: the first event is created (core/v1), a
/// repeat patches its count, another reason or object is its own event, and
/// a series whose event the apiserver dropped starts a new one.
#[tokio::test]
async fn repeats_fold_into_a_series_on_the_apiserver() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let events = Events::new(client.clone(), "cloud-node-controller");
    let node = |name: &str| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        uid: Some(format!("uid-{name}")),
        ..ObjectReference::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let list = || async { anyhow::Ok(api.list(&Default::default()).await?.items) };

    events.warning(&node("n1"), "Failed", "first try").await;
    events.warning(&node("n1"), "Failed", "second try").await;
    events.warning(&node("n1"), "Failed", "third try").await;
    events.normal(&node("n1"), "Synced", "ok").await;
    events.warning(&node("n2"), "Failed", "first try").await;
    events.flushed().await;
    let all = list().await?;
    assert_eq!(all.len(), 3, "{all:?}");
    let n1_failed = all
        .iter()
        .find(|e| {
            e.reason.as_deref() == Some("Failed") && e.involved_object.name.as_deref() == Some("n1")
        })
        .expect("n1's Failed event");
    assert_eq!(n1_failed.count, Some(3));
    assert_eq!(n1_failed.message.as_deref(), Some("first try"));
    assert_eq!(n1_failed.type_.as_deref(), Some("Warning"));
    assert_eq!(
        n1_failed.reporting_component.as_deref(),
        Some("cloud-node-controller")
    );
    assert_eq!(
        n1_failed
            .source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("cloud-node-controller")
    );
    assert!(
        all.iter()
            .filter(|e| e.reason.as_deref() != Some("Failed")
                || e.involved_object.name.as_deref() != Some("n1"))
            .all(|e| e.count == Some(1))
    );
    // The same events through events.k8s.io/v1 (one storage).
    let v1: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, "default");
    let seen = v1.list(&Default::default()).await?.items;
    assert!(
        seen.iter()
            .any(|e| e.note.as_deref() == Some("first try") && e.deprecated_count == Some(3)),
        "{seen:?}"
    );

    // The apiserver drops the event (its TTL): the next repeat creates.
    let name = n1_failed.metadata.name.clone().expect("name");
    api.delete(&name, &Default::default()).await?;
    events.warning(&node("n1"), "Failed", "after the TTL").await;
    events.flushed().await;
    let all = list().await?;
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(
        all.iter()
            .any(|e| e.message.as_deref() == Some("after the TTL"))
    );
    server.shutdown().await;
    Ok(())
}
