//! Letting a burst of node changes settle before acting on it: the one
//! debounce of the controllers that follow the node set as a whole.
//!
//! Nodes rarely change one at a time: an autoscaler replaces a batch, and
//! the new Nodes become backends and get PodCIDRs over several seconds as
//! the node controller initializes them. Acting at the first change of such
//! a burst costs a second call at the next one. A [`Settle`] says when to
//! act: once the watched value has been quiet for its `quiet` time, or at
//! the latest `cap` after the first change of the episode (a value that
//! never stops changing is still acted on). The first value seen (start-up)
//! holds nothing.
//!
//! Its two users:
//! * The service controller holds backend-only syncs while the node set
//!   moves ([`Settle::NODE_SET`]: quiet 2 s, at most 10 s), as the settling
//!   rule of its [`super::keyed::Keyed`] queue. Registration
//!   calls share one small AWS bucket (4 per second for the whole account),
//!   so with hundreds of target groups every extra call is a quarter second
//!   of everyone's convergence. Full syncs (a new or changed Service, a
//!   retry, a resync) are never held. Upstream's service controller does not
//!   batch (k8s.io/cloud-provider v0.36 compares every load balancer at each
//!   queued node event; its `nodeSyncPeriod`, 100 s, is only the informer's
//!   resync, which starts no sync).
//! * The route controller reconciles once the nodes' routes fingerprint
//!   settles ([`Settle::ROUTES`]: quiet 500 ms, at most 3 s).
//!
//! Neither polls: the route controller sleeps until [`Settle::settles_at`]
//! or the next change, and samples the value when it wakes; the service
//! controller's queue holds each Service until its own burst of backend
//! moves settles by the same two figures. The route controller's one
//! reconcile covers every node, so it says so ([`Settle::acted`]) and a
//! stream of changes gets a reconcile every `cap`, not one per change.

use std::time::Duration;

use tokio::time::Instant;

/// What its user has seen of a value's changes, and when to act on it.
#[derive(Debug)]
pub(crate) struct Settle {
    /// How long the value must stay unchanged.
    quiet: Duration,
    /// The longest an episode of changes is held after its first change.
    cap: Duration,
    value: Option<u64>,
    /// When the value was last seen to move.
    changed_at: Option<Instant>,
    /// When the current episode of changes began (the first change after a
    /// quiet spell).
    episode_start: Option<Instant>,
}

impl Settle {
    /// The node set, for the service controller's backend-only syncs.
    pub(crate) const NODE_SET: (Duration, Duration) =
        (Duration::from_secs(2), Duration::from_secs(10));
    /// The nodes' routes, for the route controller's reconciles.
    pub(crate) const ROUTES: (Duration, Duration) =
        (Duration::from_millis(500), Duration::from_secs(3));
    /// Nothing held: node IPAM gives a joining node its CIDR at once.
    pub(crate) const AT_ONCE: (Duration, Duration) = (Duration::ZERO, Duration::ZERO);

    pub(crate) fn new((quiet, cap): (Duration, Duration)) -> Settle {
        Settle {
            quiet,
            cap,
            value: None,
            changed_at: None,
            episode_start: None,
        }
    }

    /// Notes the value seen at `now`, and says whether it has settled: what
    /// waits on it may go.
    pub(crate) fn observe(&mut self, value: u64, now: Instant) -> bool {
        if self.value != Some(value) {
            if self.value.is_some() {
                if self.quiet(now) || self.episode_start.is_none() {
                    self.episode_start = Some(now);
                }
                self.changed_at = Some(now);
            }
            self.value = Some(value);
        }
        self.quiet(now)
            || self
                .episode_start
                .is_some_and(|start| now.saturating_duration_since(start) >= self.cap)
    }

    /// What waited on the value has acted on all of it (the route
    /// controller's one reconcile covers every node): the next change
    /// begins a new episode, held again for up to `cap`, even while changes
    /// go on.
    pub(crate) fn acted(&mut self) {
        self.episode_start = None;
    }

    /// When the value settles without another change: `None` when it has
    /// (nothing is held).
    pub(crate) fn settles_at(&self, now: Instant) -> Option<Instant> {
        if self.quiet(now) {
            return None;
        }
        let quiet_at = self.changed_at.map(|at| at + self.quiet);
        let cap_at = self.episode_start.map(|start| start + self.cap);
        quiet_at.into_iter().chain(cap_at).min()
    }

    fn quiet(&self, now: Instant) -> bool {
        self.changed_at
            .is_none_or(|at| now.saturating_duration_since(at) >= self.quiet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_SETTLE: Duration = Settle::NODE_SET.0;
    const NODE_SETTLE_MAX: Duration = Settle::NODE_SET.1;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn start_up_holds_nothing() {
        let t0 = Instant::now();
        let mut s = Settle::new(Settle::NODE_SET);
        assert!(s.observe(7, t0));
        assert!(s.observe(7, t0 + MS));
    }

    #[test]
    fn a_change_holds_backend_syncs_until_the_node_set_is_quiet() {
        let t0 = Instant::now();
        let mut s = Settle::new(Settle::NODE_SET);
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
        let mut s = Settle::new(Settle::NODE_SET);
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
        let mut s = Settle::new(Settle::NODE_SET);
        s.observe(0, t0);
        assert!(!s.observe(1, t0 + MS));
        let later = t0 + Duration::from_secs(60);
        assert!(s.observe(1, later), "settled long ago");
        assert!(!s.observe(2, later + MS), "a new change is held again");
    }

    #[test]
    fn after_acting_a_stream_of_changes_is_released_once_per_cap() {
        let (_, cap) = Settle::ROUTES;
        let t0 = Instant::now();
        let mut acting = Settle::new(Settle::ROUTES);
        let mut not_acting = Settle::new(Settle::ROUTES);
        acting.observe(0, t0);
        not_acting.observe(0, t0);
        let (mut released, mut released_without_acting) = (Vec::new(), 0);
        // A change every 100 ms for 10 s, never quiet.
        for i in 1..=100u32 {
            let at = t0 + 100 * MS * i;
            if acting.observe(i.into(), at) {
                released.push(at - t0);
                acting.acted();
            } else {
                // A held change always has a wake-up ahead: never one
                // in the past, which would spin its user.
                assert!(acting.settles_at(at).expect("held") > at, "{i}");
            }
            if not_acting.observe(i.into(), at) {
                released_without_acting += 1;
            }
        }
        // Each episode begins at the first change after the last release
        // and is released `cap` later.
        let ms = |m: u64| Duration::from_millis(m);
        assert_eq!(released, vec![ms(3100), ms(6200), ms(9300)]);
        assert_eq!(cap, ms(3000));
        // Without `acted`, every change after the first cap goes at once
        // (the service controller's rule: it releases Service by Service).
        assert_eq!(released_without_acting, 100 - 30);
    }
}
