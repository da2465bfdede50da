//! Where each node is in its initialization, as this process knows it:
//! what keeps a node from being looked up twice, and its retry backoff.

use std::collections::HashMap;
use std::time::Duration;

use crate::controllers::cached_node::Node;
use kube::ResourceExt;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::identity::Lookup;
use crate::backoff::Backoff;

/// Backoff of a node whose initialization failed: 1 s, 2 s, 4 s ... 5 min.
const RETRY: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
/// How long "initialized by us" vouches for a stale tainted copy.
const RECENTLY_INITIALIZED: Duration = Duration::from_secs(60);

enum Progress {
    /// A reconcile is initializing it; `attempts` failed before.
    Initializing { attempts: u32 },
    /// Initialized by this process at `at`. The shared cache may still show
    /// the node tainted for a moment: a reconcile of that stale copy must
    /// not look the instance up again.
    Initialized { uid: Option<String>, at: Instant },
    /// Failed `attempts` times; the next attempt is due at `retry_at`
    /// unless the node changes what it is looked up by (`None`: its
    /// providerID could not be parsed).
    Failed {
        attempts: u32,
        retry_at: Instant,
        lookup: Option<Lookup>,
    },
}

/// The failed attempts of `node` so far (none once it is initialized).
fn attempts(nodes: &HashMap<String, Progress>, node: &str) -> u32 {
    match nodes.get(node) {
        Some(Progress::Failed { attempts, .. } | Progress::Initializing { attempts }) => *attempts,
        _ => 0,
    }
}

/// Per-node progress, shared by the trigger stage and the reconciles.
#[derive(Default)]
pub(crate) struct ProgressBook {
    nodes: Mutex<HashMap<String, Progress>>,
}

impl ProgressBook {
    /// Whether a lookup for this tainted node should start now: not while
    /// one is being used, not for a node just initialized, not in backoff.
    pub fn wants_lookup(&self, node: &Node, lookup: &Lookup) -> bool {
        let now = Instant::now();
        match self.nodes.lock().get(&node.name_any()) {
            None => true,
            Some(Progress::Initializing { .. }) => false,
            Some(Progress::Initialized { uid, at }) => {
                !(uid == &node.metadata.uid && now.duration_since(*at) < RECENTLY_INITIALIZED)
            }
            Some(Progress::Failed {
                retry_at,
                lookup: failed,
                ..
            }) => *retry_at <= now || failed.as_ref() != Some(lookup),
        }
    }

    /// Time left before the node may be tried again with `lookup`.
    pub fn backoff_left(&self, node: &str, lookup: Option<&Lookup>) -> Option<Duration> {
        let now = Instant::now();
        match self.nodes.lock().get(node) {
            Some(Progress::Failed {
                retry_at,
                lookup: failed,
                ..
            }) if *retry_at > now && failed.as_ref() == lookup => Some(*retry_at - now),
            _ => None,
        }
    }

    /// This process initialized this very node (same UID) moments ago.
    pub fn recently_initialized(&self, node: &Node) -> bool {
        matches!(
            self.nodes.lock().get(&node.name_any()),
            Some(Progress::Initialized { uid, at })
                if uid == &node.metadata.uid && at.elapsed() < RECENTLY_INITIALIZED
        )
    }

    /// A reconcile starts initializing `node`.
    pub fn start(&self, node: &str) {
        let mut nodes = self.nodes.lock();
        let attempts = attempts(&nodes, node);
        nodes.insert(node.to_string(), Progress::Initializing { attempts });
    }

    /// `node` (as written by us) is initialized.
    pub fn succeeded(&self, node: &Node) {
        self.nodes.lock().insert(
            node.name_any(),
            Progress::Initialized {
                uid: node.metadata.uid.clone(),
                at: Instant::now(),
            },
        );
    }

    /// Records a failure; returns the backoff before the next attempt.
    pub fn failed(&self, node: &str, lookup: Option<Lookup>) -> Duration {
        let mut nodes = self.nodes.lock();
        let attempts = attempts(&nodes, node) + 1;
        let delay = RETRY.after(attempts);
        nodes.insert(
            node.to_string(),
            Progress::Failed {
                attempts,
                retry_at: Instant::now() + delay,
                lookup,
            },
        );
        delay
    }

    /// The node is gone, or initialized and seen so in the cache.
    pub fn forget(&self, node: &str) {
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

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_exponentially_up_to_five_minutes() {
        let book = ProgressBook::default();
        let key = Lookup::ById("i-1".into());
        let n = node("n", "u1");
        let mut delays = Vec::new();
        for _ in 0..12 {
            book.start("n");
            assert!(!book.wants_lookup(&n, &key), "busy");
            delays.push(book.failed("n", Some(key.clone())).as_secs());
            assert!(!book.wants_lookup(&n, &key), "backing off");
            assert!(book.backoff_left("n", Some(&key)).is_some());
            // A different lookup (the node got a providerID) is not held back.
            assert!(book.wants_lookup(&n, &Lookup::ById("i-2".into())));
            assert_eq!(
                book.backoff_left("n", Some(&Lookup::ById("i-2".into()))),
                None
            );
            tokio::time::advance(RETRY.cap).await;
            assert!(book.wants_lookup(&n, &key), "due again");
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_just_initialized_is_not_looked_up_again() {
        let book = ProgressBook::default();
        let key = Lookup::ById("i-1".into());
        let n = node("n", "u1");
        book.start("n");
        book.succeeded(&n);
        assert!(book.recently_initialized(&n));
        assert!(!book.wants_lookup(&n, &key));
        // A new node of the same name is a different node.
        assert!(book.wants_lookup(&node("n", "u2"), &key));
        assert!(!book.recently_initialized(&node("n", "u2")));
        tokio::time::advance(RECENTLY_INITIALIZED).await;
        assert!(book.wants_lookup(&n, &key));
        book.forget("n");
        assert!(book.wants_lookup(&n, &key));
    }
}
