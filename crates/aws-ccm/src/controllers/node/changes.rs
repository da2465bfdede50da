//! Node changes from the shared informer cache, without a second watch.
//!
//! The manager's node informer publishes the name of each Node it has just
//! applied to the shared store, or deleted from it, on a [`Feed`] (a
//! bounded broadcast). [`node_changes`] reads the names of a burst, looks
//! each one up in the store and compares it with what it saw last (by UID
//! and resourceVersion): a burst costs the Nodes it touched, not the
//! cluster. A reader that falls behind the feed's bound, and every relist,
//! gets one whole-store diff instead, so nothing is missed and the informer
//! never waits for a controller. A deletion comes with the last state the
//! controller saw (its providerID), which is what the tagging controller
//! needs to untag the instance.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::controllers::cached_node::Node;
use futures::Stream;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};

/// What the informer touched: a Node's name, or `None` after a relist
/// (the whole store may have changed).
type Touched = Option<Arc<str>>;

/// The informer's side of the feed.
pub(crate) type Feed = broadcast::Sender<Touched>;

/// Names a reader may fall behind by before it diffs the whole store once
/// instead (a 5,000-node join, read promptly, stays well inside it).
pub(crate) const FEED_CAPACITY: usize = 4096;

/// What changed since the last diff.
#[derive(Clone, Debug, Default)]
pub(crate) struct Changes {
    /// Nodes added or modified (the current state).
    pub(crate) applied: Vec<Arc<Node>>,
    /// Nodes removed (the last state seen), including a node replaced by a
    /// new one of the same name.
    pub(crate) deleted: Vec<Arc<Node>>,
}

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
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
struct StoreDiff {
    seen: HashMap<String, Arc<Node>>,
}

impl StoreDiff {
    /// The changes from the previous snapshot to `current`, the whole store.
    pub(crate) fn diff(&mut self, current: Vec<Arc<Node>>) -> Changes {
        let mut changes = Changes::default();
        let mut gone = std::mem::take(&mut self.seen);
        for node in current {
            let name = node.metadata.name.clone().unwrap_or_default();
            let old = gone.remove(&name);
            self.step(name, old, Some(node), &mut changes);
        }
        changes.deleted.extend(gone.into_values());
        changes
    }

    /// The changes of the named nodes only, each as the store has it now.
    fn diff_named(
        &mut self,
        names: impl IntoIterator<Item = Arc<str>>,
        now: impl Fn(&str) -> Option<Arc<Node>>,
    ) -> Changes {
        let mut changes = Changes::default();
        for name in names {
            let old = self.seen.remove(&*name);
            self.step(name.to_string(), old, now(&name), &mut changes);
        }
        changes
    }

    /// One node: what it was (`old`, taken out of `seen`) and what it is.
    fn step(
        &mut self,
        name: String,
        old: Option<Arc<Node>>,
        now: Option<Arc<Node>>,
        changes: &mut Changes,
    ) {
        match (old, &now) {
            (Some(old), Some(node)) if version(&old) == version(node) => {}
            (Some(old), Some(node)) => {
                if old.metadata.uid != node.metadata.uid {
                    changes.deleted.push(old);
                }
                changes.applied.push(node.clone());
            }
            (None, Some(node)) => changes.applied.push(node.clone()),
            (Some(old), None) => changes.deleted.push(old),
            (None, None) => {}
        }
        if let Some(node) = now {
            self.seen.insert(name, node);
        }
    }
}

/// What one wake-up read from the feed.
#[derive(Default)]
struct Burst {
    names: BTreeSet<Arc<str>>,
    whole_store: bool,
    closed: bool,
}

impl Burst {
    fn add(&mut self, got: Result<Touched, RecvError>) {
        match got {
            Ok(Some(name)) => {
                self.names.insert(name);
            }
            Ok(None) | Err(RecvError::Lagged(_)) => self.whole_store = true,
            Err(RecvError::Closed) => self.closed = true,
        }
    }

    /// Waits for the first name, then takes what else is already queued.
    async fn read(feed: &mut broadcast::Receiver<Touched>) -> Self {
        let mut burst = Burst::default();
        burst.add(feed.recv().await);
        loop {
            match feed.try_recv() {
                Ok(touched) => burst.add(Ok(touched)),
                Err(TryRecvError::Lagged(n)) => burst.add(Err(RecvError::Lagged(n))),
                Err(TryRecvError::Empty) => return burst,
                Err(TryRecvError::Closed) => {
                    burst.closed = true;
                    return burst;
                }
            }
        }
    }
}

/// Every node once at the start, then what changed after each burst of
/// informer events. Ends when the informer is gone.
pub(crate) fn node_changes(
    store: Store<Node>,
    feed: &Feed,
) -> impl Stream<Item = Changes> + Send + 'static {
    // Subscribed before the first diff: a name published while it runs is
    // read again next time, never lost.
    let receiver = feed.subscribe();
    futures::stream::unfold(
        (store, receiver, StoreDiff::default(), true),
        |(store, mut feed, mut diff, first)| async move {
            let mut burst = Burst {
                whole_store: first,
                ..Burst::default()
            };
            loop {
                if !burst.whole_store && burst.names.is_empty() {
                    burst = Burst::read(&mut feed).await;
                }
                let changes = if burst.whole_store {
                    diff.diff(store.state())
                } else {
                    let names = std::mem::take(&mut burst.names);
                    diff.diff_named(names, |name| store.get(&ObjectRef::new(name)))
                };
                if burst.closed && changes.is_empty() {
                    return None;
                }
                burst = Burst::default();
                if !changes.is_empty() {
                    return Some((changes, (store, feed, diff, false)));
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

    #[test]
    fn named_diffs_report_the_named_nodes_as_whole_diffs_do() {
        let mut diff = StoreDiff::default();
        diff.diff(vec![node("a", "u1", "1"), node("b", "u2", "2")]);
        let store: HashMap<&str, Arc<Node>> = [
            ("a", node("a", "u9", "5")),
            ("b", node("b", "u2", "3")),
            ("c", node("c", "u3", "4")),
        ]
        .into();
        let now = |name: &str| store.get(name).cloned();

        // Only the named ones: b's new version is not looked at.
        let named = diff.diff_named(["a".into(), "c".into(), "gone".into()], now);
        assert_eq!(names(&named.applied), ["a@5", "c@4"]);
        assert_eq!(names(&named.deleted), ["a@1"], "a was replaced");
        let unchanged = diff.diff_named(["a".into(), "c".into()], now);
        assert!(unchanged.is_empty());

        let deleted = diff.diff_named(["b".into()], |_| None);
        assert_eq!(names(&deleted.deleted), ["b@2"], "the last state seen");
        // A whole diff after named ones knows what they saw.
        let whole = diff.diff(vec![node("a", "u9", "5"), node("c", "u3", "4")]);
        assert!(whole.is_empty(), "{whole:?}");
    }

    fn apply(writer: &mut kube::runtime::reflector::store::Writer<Node>, node: &Arc<Node>) {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(Node::clone(node)));
    }

    #[tokio::test]
    async fn a_burst_costs_the_nodes_it_names_and_a_lagging_reader_diffs_the_store() {
        use futures::StreamExt;
        let (store, mut writer) = kube::runtime::reflector::store::<Node>();
        apply(&mut writer, &node("a", "u1", "1"));
        apply(&mut writer, &node("b", "u2", "1"));
        let (feed, _) = broadcast::channel(2);
        let mut changes = Box::pin(node_changes(store, &feed));
        let first = changes.next().await.expect("the first diff");
        assert_eq!(names(&first.applied), ["a@1", "b@1"]);

        // b changes unnamed: a burst naming a reports a alone.
        apply(&mut writer, &node("a", "u1", "2"));
        apply(&mut writer, &node("b", "u2", "2"));
        feed.send(Some("a".into())).expect("a reader");
        let burst = changes.next().await.expect("a burst");
        assert_eq!(names(&burst.applied), ["a@2"]);

        // More names than the feed holds: one diff of the whole store.
        for rv in ["3", "4", "5"] {
            apply(&mut writer, &node("a", "u1", rv));
            feed.send(Some("a".into())).expect("a reader");
        }
        let lagged = changes.next().await.expect("a whole diff");
        assert_eq!(names(&lagged.applied), ["a@5", "b@2"]);

        // A relist is read whole too; a closed feed ends the stream.
        apply(&mut writer, &node("b", "u2", "6"));
        feed.send(None).expect("a reader");
        let relisted = changes.next().await.expect("a relist diff");
        assert_eq!(names(&relisted.applied), ["b@6"]);
        drop(feed);
        assert!(changes.next().await.is_none());
    }
}
