//! Node changes from the shared informer cache, without a second watch.
//!
//! The manager's node informer bumps a counter after each event it applies
//! to the shared store; [`node_changes`] wakes on it and diffs the store
//! against what it saw last (by UID and resourceVersion). Bursts fold into
//! one diff, the informer never waits for a controller, and a deletion
//! comes with the last state the controller saw (its providerID), which is
//! what the tagging controller needs to untag the instance.

use std::collections::HashMap;
use std::sync::Arc;

use crate::controllers::cached_node::Node;
use futures::Stream;
use kube::runtime::reflector::Store;
use tokio::sync::watch;

/// What changed since the last diff.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Nodes added or modified (the current state).
    pub applied: Vec<Arc<Node>>,
    /// Nodes removed (the last state seen), including a node replaced by a
    /// new one of the same name.
    pub deleted: Vec<Arc<Node>>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty() && self.deleted.is_empty()
    }
}

fn version(node: &Node) -> (Option<&str>, Option<&str>) {
    (
        node.metadata.uid.as_deref(),
        node.metadata.resource_version.as_deref(),
    )
}

/// Remembers the last state of every node, to diff snapshots.
#[derive(Default)]
pub struct StoreDiff {
    seen: HashMap<String, Arc<Node>>,
}

impl StoreDiff {
    /// The changes from the previous snapshot to `current`.
    pub fn diff(&mut self, current: Vec<Arc<Node>>) -> Changes {
        let mut changes = Changes::default();
        let mut next = HashMap::with_capacity(current.len());
        for node in current {
            let name = node.metadata.name.clone().unwrap_or_default();
            match self.seen.remove(&name) {
                Some(old) if version(&old) == version(&node) => {}
                Some(old) => {
                    if old.metadata.uid != node.metadata.uid {
                        changes.deleted.push(old);
                    }
                    changes.applied.push(node.clone());
                }
                None => changes.applied.push(node.clone()),
            }
            next.insert(name, node);
        }
        changes
            .deleted
            .extend(self.seen.drain().map(|(_, node)| node));
        self.seen = next;
        changes
    }
}

/// Every node once at the start, then what changed after each burst of
/// informer events. Ends when the informer is gone.
pub fn node_changes(
    store: Store<Node>,
    changed: watch::Receiver<u64>,
) -> impl Stream<Item = Changes> + Send + 'static {
    futures::stream::unfold(
        (store, changed, StoreDiff::default(), true),
        |(store, mut changed, mut diff, first)| async move {
            let mut first = first;
            loop {
                if !first && changed.changed().await.is_err() {
                    return None;
                }
                // Mark the current value seen before reading the store, so
                // an event landing during the diff wakes us again.
                changed.borrow_and_update();
                first = false;
                let changes = diff.diff(store.state());
                if !changes.is_empty() {
                    return Some((changes, (store, changed, diff, false)));
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(name: &str, uid: &str, rv: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    fn names(nodes: &[Arc<Node>]) -> Vec<String> {
        let mut n: Vec<String> = nodes
            .iter()
            .map(|n| {
                format!(
                    "{}@{}",
                    n.metadata.name.as_deref().unwrap_or_default(),
                    n.metadata.resource_version.as_deref().unwrap_or_default()
                )
            })
            .collect();
        n.sort();
        n
    }

    #[test]
    fn diffs_report_adds_updates_deletes_and_replacements() {
        let mut diff = StoreDiff::default();
        let first = diff.diff(vec![node("a", "u1", "1"), node("b", "u2", "2")]);
        assert_eq!(names(&first.applied), ["a@1", "b@2"]);
        assert!(first.deleted.is_empty());

        let same = diff.diff(vec![node("a", "u1", "1"), node("b", "u2", "2")]);
        assert!(same.is_empty());

        let next = diff.diff(vec![node("a", "u1", "3"), node("c", "u3", "4")]);
        assert_eq!(names(&next.applied), ["a@3", "c@4"]);
        assert_eq!(names(&next.deleted), ["b@2"], "the last state seen");

        // Same name, new UID: the old node was deleted.
        let replaced = diff.diff(vec![node("a", "u9", "5"), node("c", "u3", "4")]);
        assert_eq!(names(&replaced.applied), ["a@5"]);
        assert_eq!(names(&replaced.deleted), ["a@3"]);
    }
}
