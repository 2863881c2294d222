//! A small seeded generator for randomized tests, so that a failing seed replays exactly.

/// xorshift64*: fast, good enough to pick faults and workloads, and the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is moved off, as xorshift would stay at 0 forever).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// True with `percent` per cent probability.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One element of `items`, or `None` when it is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            return None;
        }
        items.get(self.below(items.len() as u64) as usize)
    }
}

/// The seed in environment variable `var`, or a fresh one from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        })
}

/// A count in environment variable `var`, or `default`.
pub fn count_from_env(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_ranges_hold() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        let first: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let second: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(first, second);
        let mut c = Rng::new(43);
        assert_ne!(first, (0..100).map(|_| c.next_u64()).collect::<Vec<_>>());
        let mut r = Rng::new(7);
        for _ in 0..1000 {
            assert!((3..=5).contains(&r.between(3, 5)));
            assert!(r.below(4) < 4);
        }
        assert_eq!(Rng::new(0).next_u64(), Rng::new(1).next_u64());
        assert!(r.pick::<u8>(&[]).is_none());
        assert!(!r.chance(0) && r.chance(100));
    }
}
