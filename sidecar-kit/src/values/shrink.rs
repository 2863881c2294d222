//! Giving back the capacity a burst leaves in long-lived collections. A map that held a few
//! hundred entries in flight keeps their table after they are gone; that table stays resident
//! (and keeps the pages around it from being returned), so maps that bursts fill and then empty
//! shrink once they are mostly empty.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Room kept whatever the length: small tables cost little and would soon grow again.
const KEEP_BYTES: usize = 4096;

/// Whether a collection of `len` elements of `element_bytes` each, with room for `capacity`,
/// should give room back: when the room is worth it and at most a quarter is used. It then
/// keeps room for twice its length, so shrinking and the doubling of a growing collection
/// cannot alternate.
pub fn is_sparse(len: usize, capacity: usize, element_bytes: usize) -> bool {
    capacity.saturating_mul(element_bytes) > KEEP_BYTES && len <= capacity / 4
}

/// Shrinks a collection that is mostly empty (see [`is_sparse`]); cheap when it is not.
pub trait ShrinkWhenSparse {
    fn shrink_when_sparse(&mut self);
}

impl<K: Eq + Hash, V, S: BuildHasher> ShrinkWhenSparse for HashMap<K, V, S> {
    fn shrink_when_sparse(&mut self) {
        if is_sparse(self.len(), self.capacity(), size_of::<(K, V)>()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<T: Eq + Hash, S: BuildHasher> ShrinkWhenSparse for HashSet<T, S> {
    fn shrink_when_sparse(&mut self) {
        if is_sparse(self.len(), self.capacity(), size_of::<T>()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

impl<T> ShrinkWhenSparse for VecDeque<T> {
    fn shrink_when_sparse(&mut self) {
        if is_sparse(self.len(), self.capacity(), size_of::<T>()) {
            self.shrink_to(self.len() * 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_means_a_quarter_used_of_room_worth_giving_back() {
        assert!(!is_sparse(0, 64, 64), "4 KiB are kept");
        assert!(is_sparse(0, 65, 64));
        assert!(is_sparse(0, 4, 1400), "a few large entries are worth it");
        assert!(is_sparse(100, 400, 16));
        assert!(!is_sparse(101, 400, 16));
        assert!(!is_sparse(400, 400, 16));
        assert!(!is_sparse(0, 0, 16));
    }

    #[test]
    fn a_map_emptied_after_a_burst_gives_its_table_back() {
        let mut map: HashMap<u32, [u8; 64]> = (0..1000).map(|i| (i, [0; 64])).collect();
        let full = map.capacity();
        map.retain(|k, _| (*k as usize) <= full / 4);
        map.shrink_when_sparse();
        // (Tombstones of removed entries may cost the odd slot, never half the table.)
        assert!(map.capacity() > full / 2, "over a quarter used: kept");
        map.retain(|k, _| *k < 100);
        map.shrink_when_sparse();
        assert!(
            map.capacity() >= 200 && map.capacity() < full / 2,
            "room for twice the length: {}",
            map.capacity()
        );
        let shrunk = map.capacity();
        map.shrink_when_sparse();
        assert_eq!(map.capacity(), shrunk, "not shrunk again");
        map.clear();
        map.shrink_when_sparse();
        assert_eq!(map.capacity(), 0);
        assert_eq!(map.len(), 0);
    }

    #[test]
    fn sets_and_queues_shrink_alike() {
        let mut set: HashSet<u32> = (0..1000).collect();
        set.retain(|k| *k < 10);
        set.shrink_when_sparse();
        assert!(set.capacity() < 64, "{}", set.capacity());
        assert_eq!(set.len(), 10);
        let mut queue: VecDeque<u64> = (0..1000).collect();
        queue.drain(..990);
        queue.shrink_when_sparse();
        assert!(queue.capacity() < 64, "{}", queue.capacity());
        assert_eq!(
            queue.iter().copied().collect::<Vec<_>>(),
            (990..1000).collect::<Vec<_>>()
        );
    }
}
