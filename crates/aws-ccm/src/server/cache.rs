//! A small map whose entries expire, bounded in size, on tokio's clock (so
//! tests move time with a paused runtime instead of waiting).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) struct TtlCache<K, V> {
    entries: parking_lot::Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub(super) fn new(capacity: usize) -> Self {
        TtlCache {
            entries: parking_lot::Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The value if it has not expired.
    pub(crate) fn get(&self, key: &K) -> Option<V> {
        let now = Instant::now();
        let mut entries = self.entries.lock();
        match entries.get(key) {
            Some((v, expires)) if *expires > now => Some(v.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Keeps `value` for `ttl`; a zero TTL keeps nothing. When full, expired
    /// entries go first, then the one closest to expiry.
    pub(crate) fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.entries.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity
                && let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ttl_cache_expires_and_stays_bounded() {
        let cache = TtlCache::new(2);
        cache.insert("a", 1, Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(cache.get(&"a"), Some(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&"a"), None);
        cache.insert("b", 2, Duration::from_secs(5));
        cache.insert("c", 3, Duration::from_secs(50));
        cache.insert("d", 4, Duration::from_secs(50));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"b"), None, "closest to expiry is evicted");
        assert_eq!((cache.get(&"c"), cache.get(&"d")), (Some(3), Some(4)));
        cache.insert("e", 5, Duration::ZERO);
        assert_eq!(cache.get(&"e"), None);
    }
}
