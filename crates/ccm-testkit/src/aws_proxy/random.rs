//! The proxy's one source of randomness (which calls a probabilistic fault
//! hits), seeded so that a run can be replayed: the seed is chosen at random
//! unless given, and is printed by the binary and readable by tests.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

#[derive(Debug)]
pub(crate) struct Rolls {
    seed: Mutex<u64>,
    rng: Mutex<StdRng>,
}

impl Rolls {
    /// Seeded with `seed`, or with a random seed when `None`.
    pub(crate) fn new(seed: Option<u64>) -> Rolls {
        let seed = seed.unwrap_or_else(rand::random);
        Rolls {
            seed: Mutex::new(seed),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    /// Starts the sequence again from `seed`.
    pub(crate) fn reseed(&self, seed: u64) {
        *self.seed.lock() = seed;
        *self.rng.lock() = StdRng::seed_from_u64(seed);
    }

    pub(crate) fn seed(&self) -> u64 {
        *self.seed.lock()
    }

    /// The next number of the sequence, uniform in [0, 1).
    pub(crate) fn roll(&self) -> f64 {
        self.rng.lock().random::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_sequence() {
        let a = Rolls::new(Some(7));
        let b = Rolls::new(Some(7));
        let first: Vec<f64> = (0..8).map(|_| a.roll()).collect();
        let second: Vec<f64> = (0..8).map(|_| b.roll()).collect();
        assert_eq!(first, second);
        assert!(first.iter().all(|r| (0.0..1.0).contains(r)));
        a.reseed(7);
        assert_eq!(a.roll(), first[0]);
        assert_eq!(a.seed(), 7);
        let c = Rolls::new(Some(8));
        assert_ne!((0..8).map(|_| c.roll()).collect::<Vec<_>>(), first);
    }
}
