//! Where each node is in its initialization, as this process knows it:
//! what keeps a node from being looked up twice. When a node is tried
//! again is the queue's ([`crate::controllers::schedule::keyed`]); this
//! book only says whether a change of the node asks for a new attempt.

use std::collections::HashMap;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use kube::ResourceExt;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::identity::Lookup;

/// How long "initialized by us" vouches for a stale tainted copy.
const RECENTLY_INITIALIZED: Duration = Duration::from_secs(60);

enum Progress {
    /// An attempt with this lookup began (`None`: the providerID could not
    /// be parsed) and has not succeeded: it is in progress, or it failed
    /// and the queue retries it after its backoff.
    Tried(Option<Lookup>),
    /// Initialized by this process at `at`. The shared cache may still show
    /// the node tainted for a moment: a reconcile of that stale copy must
    /// not look the instance up again.
    Initialized { uid: Option<String>, at: Instant },
}

/// Per-node progress, shared by the trigger stage and the reconciles.
#[derive(Default)]
pub(crate) struct ProgressBook {
    nodes: Mutex<HashMap<String, Progress>>,
}

impl ProgressBook {
    /// Whether a change of this tainted node makes an attempt due: not
    /// when the last attempt used the same lookup, since that one is in
    /// progress or is retried by the queue after its backoff (other changes
    /// to the node do not make a failed lookup, or its Warning, come
    /// sooner). `lookup` is `None` when the providerID cannot be parsed.
    pub(crate) fn wants_attempt(&self, node: &str, lookup: Option<&Lookup>) -> bool {
        match self.nodes.lock().get(node) {
            Some(Progress::Tried(tried)) => tried.as_ref() != lookup,
            _ => true,
        }
    }

    /// Whether to look the instance of this tainted node up ahead of its
    /// reconcile: an attempt is due, and not for a node just initialized.
    pub(crate) fn wants_lookup(&self, node: &Node, lookup: &Lookup) -> bool {
        self.wants_attempt(&node.name_any(), Some(lookup)) && !self.recently_initialized(node)
    }

    /// This process initialized this very node (same UID) moments ago.
    pub(crate) fn recently_initialized(&self, node: &Node) -> bool {
        matches!(
            self.nodes.lock().get(&node.name_any()),
            Some(Progress::Initialized { uid, at })
                if uid == &node.metadata.uid && at.elapsed() < RECENTLY_INITIALIZED
        )
    }

    /// A reconcile begins an attempt on `node` by `lookup`.
    pub(crate) fn tried(&self, node: &str, lookup: Option<Lookup>) {
        (self.nodes.lock()).insert(node.to_string(), Progress::Tried(lookup));
    }

    /// `node` (as written by us) is initialized.
    pub(crate) fn succeeded(&self, node: &Node) {
        self.nodes.lock().insert(
            node.name_any(),
            Progress::Initialized {
                uid: node.metadata.uid.clone(),
                at: Instant::now(),
            },
        );
    }

    /// The node is gone, or initialized and seen so in the cache.
    pub(crate) fn forget(&self, node: &str) {
        self.nodes.lock().remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(name: &str, uid: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_change_asks_for_an_attempt_only_when_it_changes_the_lookup() {
        let book = ProgressBook::default();
        let (by_id, other) = (Lookup::ById("i-1".into()), Lookup::ById("i-2".into()));
        let n = node("n", "u1");
        assert!(book.wants_attempt("n", Some(&by_id)), "never tried");
        book.tried("n", Some(by_id.clone()));
        assert!(
            !book.wants_attempt("n", Some(&by_id)),
            "tried, retried by the queue"
        );
        assert!(!book.wants_lookup(&n, &by_id));
        // The node got another providerID: that is worth an attempt now.
        assert!(book.wants_attempt("n", Some(&other)));
        assert!(book.wants_lookup(&n, &other));
        // A providerID that cannot be parsed is tried once per backoff too.
        book.tried("n", None);
        assert!(!book.wants_attempt("n", None));
        assert!(book.wants_attempt("n", Some(&by_id)));
        book.forget("n");
        assert!(book.wants_attempt("n", None));
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_just_initialized_is_not_looked_up_again() {
        let book = ProgressBook::default();
        let key = Lookup::ById("i-1".into());
        let n = node("n", "u1");
        book.tried("n", Some(key.clone()));
        book.succeeded(&n);
        assert!(book.recently_initialized(&n));
        assert!(!book.wants_lookup(&n, &key));
        assert!(
            book.wants_attempt("n", Some(&key)),
            "a stale copy is reconciled"
        );
        // A new node of the same name is a different node.
        assert!(book.wants_lookup(&node("n", "u2"), &key));
        assert!(!book.recently_initialized(&node("n", "u2")));
        tokio::time::advance(RECENTLY_INITIALIZED).await;
        assert!(book.wants_lookup(&n, &key));
        book.forget("n");
        assert!(book.wants_lookup(&n, &key));
    }
}
