//! Tags the load-balancer sweep read, kept for later sweeps.
//!
//! Tags are most of a sweep's calls (`DescribeTags` takes 20 resources a
//! call: 75 calls for 1,000 load balancers and 500 target groups, against 6
//! listing pages), and they change only when this CCM writes them (which
//! evicts the entry, see [`TagCache::evict`]) or when someone edits them by
//! hand. So a sweep reads the tags of load balancers and groups it has not
//! seen, and of those whose tags it read longer ago than their age limit:
//! between 40 % and 90 % of the resync period, fixed per resource, so
//! re-reads are spread over the period instead of all falling due at once
//! after an adoption. With the sweep serving 5 minutes at the default 1 h
//! period, a hand edit is therefore seen within one resync period, as drift
//! in attributes and listeners is.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::Duration;

use tokio::time::Instant;

use crate::aws::tags::Tags;

/// One resource's tags and when they were read.
struct Entry {
    tags: Tags,
    read_at: Instant,
    /// The load balancer whose writes may change them: itself, or the load
    /// balancer a target group is behind.
    owner: String,
}

/// Tags by resource (a classic ELB's name, an NLB's or a target group's
/// ARN: the forms never collide).
#[derive(Default)]
pub(crate) struct TagCache {
    entries: HashMap<String, Entry>,
}

/// A resource's age limit: between 40 % and 90 % of `period`, fixed by the
/// key.
fn age_limit(key: &str, period: Duration) -> Duration {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    let fraction = 0.4 + (h.finish() % 1000) as f64 / 2000.0;
    period.mul_f64(fraction)
}

impl TagCache {
    /// The cached tags of `key`, when read less than its age limit (under
    /// `period`) before `now`; `period` `None`: nothing is reused.
    pub(crate) fn fresh(&self, key: &str, period: Option<Duration>, now: Instant) -> Option<Tags> {
        let period = period?;
        let e = self.entries.get(key)?;
        (now.saturating_duration_since(e.read_at) < age_limit(key, period)).then(|| e.tags.clone())
    }

    /// Tags of `key` (whose writes come through load balancer `owner`) as
    /// read at `read_at`.
    pub(crate) fn store(&mut self, key: String, owner: &str, tags: Tags, read_at: Instant) {
        self.entries.insert(
            key,
            Entry {
                tags,
                read_at,
                owner: owner.to_string(),
            },
        );
    }

    /// Keeps only the resources a sweep listed (the rest were deleted).
    pub(crate) fn keep_only(&mut self, listed: &std::collections::HashSet<&str>) {
        self.entries.retain(|k, _| listed.contains(k.as_str()));
    }

    /// A write went to load balancer `owner`: its tags, and its groups',
    /// are read again by the next sweep.
    pub(crate) fn evict(&mut self, owner: &str) {
        self.entries.retain(|_, e| e.owner != owner);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn tags(v: &str) -> Tags {
        Tags::new(BTreeMap::from([("k".to_string(), v.to_string())]))
    }

    #[test]
    fn age_limits_lie_between_40_and_90_percent_of_the_period_and_differ() {
        let p = Duration::from_secs(3600);
        let limits: Vec<Duration> = (0..200).map(|i| age_limit(&format!("a{i}"), p)).collect();
        assert!(
            limits
                .iter()
                .all(|l| *l >= p.mul_f64(0.4) && *l < p.mul_f64(0.9)),
            "{limits:?}"
        );
        let distinct: std::collections::BTreeSet<_> = limits.iter().collect();
        assert!(distinct.len() > 150, "spread: {} distinct", distinct.len());
    }

    #[tokio::test(start_paused = true)]
    async fn tags_are_reused_until_their_age_limit_and_never_without_a_period() {
        let p = Duration::from_secs(3600);
        let mut cache = TagCache::default();
        cache.store("lb".into(), "lb", tags("1"), Instant::now());
        assert_eq!(cache.fresh("lb", Some(p), Instant::now()), Some(tags("1")));
        assert_eq!(cache.fresh("lb", None, Instant::now()), None);
        assert_eq!(cache.fresh("other", Some(p), Instant::now()), None);
        tokio::time::advance(age_limit("lb", p)).await;
        assert_eq!(cache.fresh("lb", Some(p), Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_evicts_the_load_balancer_and_its_groups_and_deleted_ones_go() {
        let p = Duration::from_secs(3600);
        let now = Instant::now();
        let mut cache = TagCache::default();
        cache.store("arn:lb/1".into(), "lb-1", tags("a"), now);
        cache.store("arn:tg/1".into(), "lb-1", tags("b"), now);
        cache.store("arn:lb/2".into(), "lb-2", tags("c"), now);
        cache.evict("lb-1");
        assert_eq!(cache.fresh("arn:lb/1", Some(p), now), None);
        assert_eq!(cache.fresh("arn:tg/1", Some(p), now), None);
        assert_eq!(cache.fresh("arn:lb/2", Some(p), now), Some(tags("c")));
        cache.keep_only(&std::collections::HashSet::new());
        assert_eq!(cache.len(), 0);
    }

    /// Sweeps every 5 minutes (the sweep's TTL at the default period) for
    /// two hours at a 1 h period, over 500 classic ELBs, 500 NLBs and
    /// their 500 groups, all read at an adoption: each resource is read
    /// again within one period of its last read, about 1.5 times an hour
    /// (not 12), which is about 130 `DescribeTags` calls an hour (20
    /// resources a call, per kind) instead of 900.
    #[tokio::test(start_paused = true)]
    async fn sweeps_every_five_minutes_read_each_resources_tags_about_once_an_hour() {
        let p = Duration::from_secs(3600);
        let kinds: Vec<Vec<String>> = ["clb", "nlb", "tg"]
            .iter()
            .map(|k| (0..500).map(|i| format!("{k}-{i}")).collect())
            .collect();
        let mut cache = TagCache::default();
        let start = Instant::now();
        let mut last_read: HashMap<String, Instant> = HashMap::new();
        let (mut reads, mut calls) = (0usize, 0usize);
        for sweep in 0..=24 {
            let now = Instant::now();
            let second_hour = now - start > p;
            for keys in &kinds {
                let mut stale = 0;
                for k in keys {
                    if cache.fresh(k, Some(p), now).is_some() {
                        continue;
                    }
                    if let Some(prev) = last_read.get(k) {
                        assert!(now - *prev <= p, "{k} stale for {:?}", now - *prev);
                    }
                    cache.store(k.clone(), k, tags("x"), now);
                    last_read.insert(k.clone(), now);
                    stale += 1;
                }
                if second_hour {
                    reads += stale;
                    calls += stale.div_ceil(20);
                }
            }
            if sweep < 24 {
                tokio::time::advance(Duration::from_secs(300)).await;
            }
        }
        // The second hour: the 12 sweeps from minute 65 to minute 120.
        let per_hour = reads as f64 / 1500.0;
        eprintln!("{per_hour:.2} reads per resource an hour, {calls} DescribeTags calls");
        assert!((1.0..=2.0).contains(&per_hour), "{per_hour}");
        assert!(calls <= 200, "{calls} DescribeTags calls an hour");
    }
}
