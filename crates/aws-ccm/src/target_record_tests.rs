//! The record's pure parts and an unstarted record; what it does against
//! the API server is in `tests/in_process/target_record.rs`.

use super::*;

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

#[test]
fn keys_are_the_groups_name_and_id() {
    let arn = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/k8s-web-80/0123abcd";
    assert_eq!(key(arn).as_deref(), Some("k8s-web-80.0123abcd"));
    let lb = "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/net/a1/0123";
    assert_eq!(key(lb), None);
    assert_eq!(key("nonsense"), None);
}

#[test]
fn digests_differ_with_the_port_and_the_instances() {
    let d = digest(80, &set(&["i-1", "i-2"]));
    assert_eq!(d, digest(80, &set(&["i-2", "i-1"])));
    assert_ne!(d, digest(81, &set(&["i-1", "i-2"])));
    assert_ne!(d, digest(80, &set(&["i-1"])));
}

/// Without a started record nothing is trusted and nothing waits.
#[tokio::test]
async fn an_unstarted_record_trusts_nothing_and_never_waits() {
    let record = TargetRecord::default();
    record.record([("tg.1".to_string(), "d".to_string())]);
    assert!(!record.trusts("tg.1", "d"));
    assert_eq!(record.before_change(&["tg.1".to_string()]).await, Ok(()));
}

#[test]
fn only_a_later_leaders_stamp_is_newer() {
    assert!(newer("u1/3", "u1/2"));
    assert!(newer("u2/1", "u1/2"), "another Lease");
    assert!(newer("garbage", "u1/2"));
    assert!(!newer("u1/2", "u1/2"), "ours");
    assert!(!newer("u1/1", "u1/2"), "an earlier leader's late write");
}
