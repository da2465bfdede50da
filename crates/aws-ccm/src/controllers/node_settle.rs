//! Letting a node change settle before backend-only syncs start.
//!
//! Nodes rarely change one at a time: an autoscaler replaces a batch, and
//! the new Nodes become backends over several seconds as the node
//! controller initializes them. A targets-only sync started at the first of
//! those changes registers the first new instance, and the next change
//! costs the same target group another register call. Registration calls
//! share one small AWS bucket (4 per second for the whole account), so
//! with hundreds of target groups every extra call is a quarter second of
//! everyone's convergence.
//!
//! So the service controller holds backend-only syncs while the node set
//! is still moving: until it has been quiet for [`NODE_SETTLE`], or for at
//! most [`NODE_SETTLE_MAX`] after the first change of the episode (a node
//! set that never stops changing still gets its targets moved). Full syncs
//! (a new or changed Service, a retry, a resync) are never held. Upstream's
//! service controller batches the same way, coarser: node changes are
//! handled by a loop that runs at most once per `nodeSyncPeriod` (100 s).

use std::time::Duration;

use tokio::time::Instant;

/// How long the node set must stay unchanged before backend-only syncs go.
pub const NODE_SETTLE: Duration = Duration::from_secs(2);
/// The longest backend-only syncs are held after an episode's first change.
pub const NODE_SETTLE_MAX: Duration = Duration::from_secs(10);

/// What the scans have seen of the node set's changes.
#[derive(Debug, Default)]
pub struct NodeSettle {
    generation: Option<u64>,
    /// When a scan last saw the generation move.
    changed_at: Option<Instant>,
    /// When the current episode of changes began (the first change after a
    /// quiet [`NODE_SETTLE`]).
    episode_start: Option<Instant>,
}

impl NodeSettle {
    /// Notes the node generation a scan sees at `now`, and says whether
    /// backend-only syncs may start. The first generation seen (start-up)
    /// holds nothing: every Service's first sync is a full one.
    pub fn observe(&mut self, generation: u64, now: Instant) -> bool {
        if self.generation != Some(generation) {
            if self.generation.is_some() {
                if self.quiet(now) {
                    self.episode_start = Some(now);
                }
                self.changed_at = Some(now);
            }
            self.generation = Some(generation);
        }
        self.quiet(now)
            || self
                .episode_start
                .is_some_and(|start| now.saturating_duration_since(start) >= NODE_SETTLE_MAX)
    }

    /// When held backend-only syncs may go without another change: `None`
    /// when nothing is held (the set is quiet).
    pub fn settles_at(&self, now: Instant) -> Option<Instant> {
        if self.quiet(now) {
            return None;
        }
        let quiet_at = self.changed_at.map(|at| at + NODE_SETTLE);
        let cap_at = self.episode_start.map(|start| start + NODE_SETTLE_MAX);
        quiet_at.into_iter().chain(cap_at).min()
    }

    fn quiet(&self, now: Instant) -> bool {
        self.changed_at
            .is_none_or(|at| now.saturating_duration_since(at) >= NODE_SETTLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn start_up_holds_nothing() {
        let t0 = Instant::now();
        let mut s = NodeSettle::default();
        assert!(s.observe(7, t0));
        assert!(s.observe(7, t0 + MS));
    }

    #[test]
    fn a_change_holds_backend_syncs_until_the_node_set_is_quiet() {
        let t0 = Instant::now();
        let mut s = NodeSettle::default();
        assert!(s.observe(1, t0));
        // Nodes join every 500 ms for 3 s: held all along.
        for i in 1..=6u64 {
            let at = t0 + 500 * MS * i as u32;
            assert!(!s.observe(1 + i, at), "held at change {i}");
        }
        let last = t0 + 3000 * MS;
        // The service controller sleeps until then, not a moment longer.
        assert_eq!(s.settles_at(last), Some(last + NODE_SETTLE));
        assert!(!s.observe(7, last + NODE_SETTLE - MS), "not yet quiet");
        assert!(s.observe(7, last + NODE_SETTLE), "quiet for NODE_SETTLE");
        assert_eq!(s.settles_at(last + NODE_SETTLE), None, "nothing held");
    }

    #[test]
    fn a_node_set_that_never_settles_is_held_at_most_the_cap() {
        let t0 = Instant::now();
        let mut s = NodeSettle::default();
        s.observe(0, t0);
        let mut generation = 0;
        let mut released_at = None;
        // A change every second, for 30 s.
        for sec in 1..=30u32 {
            generation += 1;
            let at = t0 + Duration::from_secs(sec.into());
            if s.observe(generation, at) && released_at.is_none() {
                released_at = Some(sec);
            }
            if released_at.is_none() {
                let wake = s.settles_at(at).expect("held");
                assert!(
                    wake > at && wake <= t0 + MS * 1000 + NODE_SETTLE_MAX,
                    "{sec} s"
                );
            }
            if let Some(first) = released_at {
                assert!(
                    s.observe(generation, at),
                    "stays released at {sec} s (from {first} s)"
                );
            }
        }
        // The episode began at 1 s; the cap releases it at 11 s.
        assert_eq!(released_at, Some(1 + NODE_SETTLE_MAX.as_secs() as u32));
    }

    #[test]
    fn a_new_episode_after_a_quiet_spell_is_held_again() {
        let t0 = Instant::now();
        let mut s = NodeSettle::default();
        s.observe(0, t0);
        assert!(!s.observe(1, t0 + MS));
        let later = t0 + Duration::from_secs(60);
        assert!(s.observe(1, later), "settled long ago");
        assert!(!s.observe(2, later + MS), "a new change is held again");
    }
}
