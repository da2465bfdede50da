//! Nodes of another Region, reported once for the controllers that leave
//! them alone (the cloud-node controller an uninitialized one, the
//! lifecycle controller every one at each pass): a Warning on the Node and
//! a log line naming node, zone and Region when a Node is first seen so,
//! and the gauge `node_lifecycle_nodes_outside_region`. Which Nodes these are is
//! [`crate::ids::node_outside_region`]'s to say; this module only
//! remembers whom it told, process-wide, so the two controllers do not each
//! warn about the same Node.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};

use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use prometheus_client::metrics::gauge::Gauge;

use crate::controllers::cached_node::Node;
use crate::controllers::events::Events;
use crate::ids::OutsideRegion;

const EVENT_OUTSIDE_REGION: &str = "NodeOutsideRegion";

static GAUGE: LazyLock<Gauge> = LazyLock::new(|| {
    let gauge = Gauge::default();
    crate::metrics::register(
        "node_lifecycle_nodes_outside_region",
        "Nodes whose spec.providerID names a zone of another Region than this CCM's, left to that Region's CCM (every Node at the lifecycle controller's last pass, plus the uninitialized ones the cloud-node controller left since).",
        gauge.clone(),
    );
    gauge
});

/// The Nodes reported, by UID (the name when it has none), with the zone
/// they were reported in: a Node is reported again only when it is
/// replaced or its zone changes.
#[derive(Default)]
struct Book(Mutex<HashMap<String, String>>);

impl Book {
    /// Records one Node; true when it is to be reported.
    fn note(&self, key: String, zone: &str) -> bool {
        let mut seen = self.0.lock();
        let new = seen.insert(key, zone.to_string()).as_deref() != Some(zone);
        GAUGE.set(seen.len() as i64);
        new
    }

    /// Replaces the book with `now`, every such Node there is; returns the
    /// keys of those to report.
    fn replace(&self, now: HashMap<String, String>) -> HashSet<String> {
        let mut seen = self.0.lock();
        let report = (now.iter())
            .filter(|(k, zone)| seen.get(*k) != Some(zone))
            .map(|(k, _)| k.clone())
            .collect();
        *seen = now;
        GAUGE.set(seen.len() as i64);
        report
    }

    fn forget(&self, key: &str) {
        let mut seen = self.0.lock();
        seen.remove(key);
        GAUGE.set(seen.len() as i64);
    }
}

static BOOK: LazyLock<Book> = LazyLock::new(Book::default);

fn key(node: &Node) -> String {
    node.metadata.uid.clone().unwrap_or_else(|| node.name_any())
}

/// Registers the gauge, so `/metrics` shows 0 before any such Node.
pub(crate) fn register() {
    LazyLock::force(&GAUGE);
}

/// Reports `node` unless it was reported in the same zone already.
pub(crate) async fn report(events: &Events, node: &Node, outside: &OutsideRegion) {
    if BOOK.note(key(node), &outside.zone) {
        warn(events, node, outside).await;
    }
}

/// A pass over every Node: the book becomes `outside`, and each Node not
/// reported before (or in another zone) is reported.
pub(crate) async fn report_all(events: &Events, outside: &[(Arc<Node>, OutsideRegion)]) {
    let now = (outside.iter())
        .map(|(node, o)| (key(node), o.zone.clone()))
        .collect();
    let report = BOOK.replace(now);
    for (node, o) in outside.iter().filter(|(n, _)| report.contains(&key(n))) {
        warn(events, node, o).await;
    }
}

/// A deleted Node leaves the book (and the gauge).
pub(crate) fn forget(node: &Node) {
    BOOK.forget(&key(node));
}

async fn warn(events: &Events, node: &Node, outside: &OutsideRegion) {
    tracing::warn!(
        node = %outside.node,
        zone = %outside.zone,
        region = %outside.region,
        ccm_region = %outside.ours,
        "node is in another Region: not looked up, initialized, tainted or deleted here"
    );
    let note = format!(
        "{outside}. This CCM does not look its instance up, initialize, taint or delete it: \
         run a CCM with Region {} for it (a cluster spanning Regions runs one per Region).",
        outside.region
    );
    (events.warning(&node.object_ref(&()), EVENT_OUTSIDE_REGION, note)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_reported_once_per_zone_and_again_when_replaced() {
        let book = Book::default();
        assert!(book.note("uid-1".into(), "eu-west-1a"));
        assert!(!book.note("uid-1".into(), "eu-west-1a"), "once");
        assert!(book.note("uid-1".into(), "eu-west-1b"), "its zone changed");
        let now = HashMap::from([
            ("uid-1".to_string(), "eu-west-1b".to_string()),
            ("uid-2".to_string(), "eu-west-1a".to_string()),
        ]);
        let new = book.replace(now.clone());
        assert_eq!(
            new,
            HashSet::from(["uid-2".to_string()]),
            "only the new one"
        );
        assert!(
            book.replace(now).is_empty(),
            "a second pass reports nothing"
        );
        book.forget("uid-2");
        assert!(book.note("uid-2".into(), "eu-west-1a"), "a replaced Node");
        let left = HashMap::from([("uid-2".to_string(), "eu-west-1a".to_string())]);
        assert!(book.replace(left).is_empty());
        assert!(
            book.note("uid-1".into(), "eu-west-1b"),
            "gone from a pass, then back"
        );
    }
}
