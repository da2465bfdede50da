//! The NLB target record (`target_record.rs`) against the API test server:
//! what a successor trusts, removal before a change, a deposed leader,
//! flush at shutdown, a record deleted by hand.

use std::collections::BTreeSet;
use std::time::Duration;

use aws_ccm::target_record::{Acquisition, TargetRecord, digest, stamp_on};
use ccm_testkit::apiserver::{FailureRule, TestApiServer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

const NS: &str = "kube-system";
const NAME: &str = "cloud-controller-manager-targets";

fn acq(uid: &str, before: Option<i32>, now: i32) -> Acquisition {
    Acquisition {
        lease_uid: uid.into(),
        before,
        now,
    }
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// The ConfigMap as stored.
async fn stored(client: &Client) -> anyhow::Result<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    Ok(api.get(NAME).await?)
}

/// Waits (10 s at most) until the stored ConfigMap satisfies `ok`.
async fn stored_until(client: &Client, ok: impl Fn(&ConfigMap) -> bool) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if ok(&stored(client).await?) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the ConfigMap never got there"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn has(cm: &ConfigMap, key: &str) -> bool {
    cm.data.as_ref().is_some_and(|d| d.contains_key(key))
}

/// A record started as the Lease's first holder (it created the Lease),
/// holding group `k` with `d`, written.
async fn first_leader(client: &Client, k: &str, d: &str) -> anyhow::Result<TargetRecord> {
    let record = TargetRecord::default();
    assert_eq!(
        record
            .start(client.clone(), NS, NAME, &acq("u1", None, 0))
            .await?,
        0
    );
    record.record([(k.to_string(), d.to_string())]);
    stored_until(client, |cm| has(cm, k)).await?;
    Ok(record)
}

/// The Lease passed straight from the stamper (its transitions unchanged
/// when the successor took it): the successor trusts every entry and
/// stamps the record as its own.
#[tokio::test]
async fn a_successor_straight_from_the_stamper_trusts_its_entries() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let d = digest(80, &set(&["i-1"]));
    first_leader(&client, "tg.1", &d).await?;
    let next = TargetRecord::default();
    assert_eq!(
        next.start(client.clone(), NS, NAME, &acq("u1", Some(0), 1))
            .await?,
        1
    );
    assert!(next.trusts("tg.1", &d));
    assert!(!next.trusts("tg.1", &digest(80, &set(&["i-2"]))));
    assert_eq!(stamp_on(&stored(&client).await?).as_deref(), Some("u1/1"));
    Ok(())
}

/// Anyone in between (a transition the stamper did not make), a recreated
/// Lease (another UID) or a Lease created anew voids the record: nothing
/// is trusted and the entries are cleared.
#[tokio::test]
async fn a_holder_in_between_or_a_new_lease_voids_the_record() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let d = digest(80, &set(&["i-1"]));
    for (uid, before) in [("u1", Some(1)), ("u2", Some(0)), ("u1", None)] {
        first_leader(&client, "tg.1", &d).await?;
        let next = TargetRecord::default();
        let trusted = next
            .start(client.clone(), NS, NAME, &acq(uid, before, 5))
            .await?;
        assert_eq!(trusted, 0, "{uid} {before:?}");
        assert!(!next.trusts("tg.1", &d));
        assert!(
            !has(&stored(&client).await?, "tg.1"),
            "{uid} {before:?}: entries cleared"
        );
    }
    Ok(())
}

/// A target change waits until its group's entry is gone from the
/// ConfigMap: with the removal held 2 s by the API server, the entry is
/// gone when `before_change` returns.
#[tokio::test]
async fn an_entry_is_removed_before_its_group_changes() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let record = first_leader(&client, "tg.1", "d").await?;
    record.record([("tg.2".to_string(), "e".to_string())]);
    stored_until(&client, |cm| has(cm, "tg.2")).await?;
    server.inject_failure(FailureRule::slow(
        "update",
        "configmaps",
        Duration::from_secs(2),
    ));
    let (count, sum) = waits();
    record
        .before_change(&["tg.1".to_string()])
        .await
        .map_err(anyhow::Error::msg)?;
    let cm = stored(&client).await?;
    assert!(!has(&cm, "tg.1"), "removed before the change goes ahead");
    assert!(has(&cm, "tg.2"), "other groups keep theirs");
    assert!(!record.trusts("tg.1", "d"));
    // The wait is the record's cost on the write path, and is exported.
    let (count_after, sum_after) = waits();
    assert_eq!(count_after, count + 1, "one target change observed");
    assert!(
        sum_after - sum >= 2.0,
        "the held removal counted: {sum} -> {sum_after}"
    );
    // A group without an entry needs no write, and waits for none.
    let writes = server.stats().count("update", "configmaps");
    record
        .before_change(&["tg.3".to_string()])
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(server.stats().count("update", "configmaps"), writes);
    let (count_3, sum_3) = waits();
    assert_eq!(count_3, count_after + 1);
    assert!(sum_3 - sum_after < 1.0, "no wait: {sum_after} -> {sum_3}");
    // A sync that moves no target is no target change.
    record
        .before_change(&[])
        .await
        .map_err(anyhow::Error::msg)?;
    assert_eq!(waits().0, count_3);
    Ok(())
}

/// `aws_ccm_target_record_wait_seconds`' count and sum, from `/metrics`' text.
fn waits() -> (u64, f64) {
    let text = aws_ccm::metrics::encode();
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (
        value("aws_ccm_target_record_wait_seconds_count") as u64,
        value("aws_ccm_target_record_wait_seconds_sum"),
    )
}

/// A removal the API server refuses stops the change.
#[tokio::test]
async fn a_removal_that_fails_stops_the_change() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let record = first_leader(&client, "tg.1", "d").await?;
    server.inject_failure(FailureRule::new("update", "configmaps", 500).always());
    let refused = record.before_change(&["tg.1".to_string()]).await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(has(&stored(&client).await?, "tg.1"));
    Ok(())
}

/// When another leader has stamped the ConfigMap, this process's next
/// write meets a conflict, finds the stamp not its own and changes no
/// more targets.
#[tokio::test]
async fn another_leaders_stamp_stops_this_process() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let record = first_leader(&client, "tg.1", "d").await?;
    let other = TargetRecord::default();
    other
        .start(client.clone(), NS, NAME, &acq("u1", Some(0), 1))
        .await?;
    record.record([("tg.2".to_string(), "e".to_string())]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while record.before_change(&[]).await.is_ok() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "still changing targets"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cm = stored(&client).await?;
    assert_eq!(stamp_on(&cm).as_deref(), Some("u1/1"));
    assert!(!has(&cm, "tg.2"), "the deposed leader wrote nothing");
    Ok(())
}

/// At shutdown `flush` returns once what was recorded is written, so the
/// successor trusts every group; with the API server refusing, it gives
/// up after its bound.
#[tokio::test]
async fn flush_waits_for_what_was_recorded() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let record = first_leader(&client, "tg.1", "d").await?;
    server.inject_failure(FailureRule::slow(
        "update",
        "configmaps",
        Duration::from_secs(1),
    ));
    record.record([("tg.2".to_string(), "e".to_string())]);
    record.flush(Duration::from_secs(10)).await;
    assert!(
        has(&stored(&client).await?, "tg.2"),
        "written before flush returned"
    );

    server.inject_failure(FailureRule::new("update", "configmaps", 500).always());
    record.record([("tg.3".to_string(), "f".to_string())]);
    tokio::time::timeout(
        Duration::from_secs(5),
        record.flush(Duration::from_millis(300)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("flush outlived its bound"))?;
    assert!(!has(&stored(&client).await?, "tg.3"));
    Ok(())
}

/// A ConfigMap deleted under the leader (by hand) is created again, with
/// everything the leader holds, at its next write.
#[tokio::test]
async fn a_deleted_record_is_written_again() -> anyhow::Result<()> {
    let server = TestApiServer::start().await?;
    let client = server.client().await?;
    let record = first_leader(&client, "tg.1", "d").await?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    api.delete(NAME, &Default::default()).await?;
    record.record([("tg.2".to_string(), "e".to_string())]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(cm) = api.get_opt(NAME).await?
            && has(&cm, "tg.1")
            && has(&cm, "tg.2")
        {
            assert_eq!(stamp_on(&cm).as_deref(), Some("u1/0"));
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "not written again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        record.before_change(&[]).await,
        Ok(()),
        "still changing targets"
    );
    Ok(())
}
