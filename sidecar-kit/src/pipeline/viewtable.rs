//! A cache of shared views keyed by a name each view holds: the table holds the views alone (an
//! 8-byte pointer a slot), where a `HashMap<Arc<str>, Arc<V>>` holds the name beside each view
//! again (24 bytes a slot). At 50 000 volumes that is 2 MiB less for each controller's index of
//! them; every index of PVs and claims is one of these. A table may also find views by another
//! string they hold (a volume handle), which a map would copy.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use crate::values::shrink;

/// Views by the name `key` reads out of each (the table's own hash builder, as a `HashMap`'s,
/// since the names come from the API): a shared name (`K = Arc<str>`) or any string (`str`).
pub struct ViewTable<V, K: ?Sized = Arc<str>> {
    table: HashTable<Arc<V>>,
    hasher: RandomState,
    key: fn(&V) -> &K,
}

impl<V, K: ?Sized + Borrow<str>> ViewTable<V, K> {
    /// An empty table of views named by `key`.
    pub fn new(key: fn(&V) -> &K) -> Self {
        Self {
            table: HashTable::new(),
            hasher: RandomState::new(),
            key,
        }
    }

    fn hash(&self, name: &str) -> u64 {
        self.hasher.hash_one(name)
    }

    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<V>> {
        let key = self.key;
        self.table
            .find(self.hash(name), |v| key(v).borrow() == name)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Stores `view` under its name; the view it replaces, if any.
    pub fn insert(&mut self, view: Arc<V>) -> Option<Arc<V>> {
        let key = self.key;
        let hasher = &self.hasher;
        let name: &str = key(&view).borrow();
        let hash = hasher.hash_one(name);
        match self.table.find_mut(hash, |v| key(v).borrow() == name) {
            Some(stored) => Some(std::mem::replace(stored, view)),
            None => {
                self.table
                    .insert_unique(hash, view, |v| hasher.hash_one::<&str>(key(v).borrow()));
                None
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<Arc<V>> {
        let key = self.key;
        let hash = self.hash(name);
        self.table
            .find_entry(hash, |v| key(v).borrow() == name)
            .ok()
            .map(|entry| entry.remove().0)
    }

    /// The names of the views, each the view's own.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        let key = self.key;
        self.table.iter().map(move |v| key(v))
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<V>> {
        self.table.iter()
    }

    /// Views and their names, as a map's `iter` gives them.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &Arc<V>)> {
        let key = self.key;
        self.table.iter().map(move |v| (key(v), v))
    }

    /// Gives back the room a burst left once the table is mostly empty (see
    /// [`shrink::is_sparse`]).
    pub fn shrink_when_sparse(&mut self) {
        if shrink::is_sparse(self.table.len(), self.table.capacity(), size_of::<Arc<V>>()) {
            let (key, hasher) = (self.key, &self.hasher);
            self.table.shrink_to(self.table.len() * 2, |v| {
                hasher.hash_one::<&str>(key(v).borrow())
            });
        }
    }
}

impl<V: std::fmt::Debug, K: ?Sized + Borrow<str> + std::fmt::Debug> std::fmt::Debug
    for ViewTable<V, K>
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct View {
        name: Arc<str>,
        value: u32,
    }

    fn view(name: &str, value: u32) -> Arc<View> {
        Arc::new(View {
            name: name.into(),
            value,
        })
    }

    #[test]
    fn views_are_found_replaced_and_removed_by_their_own_name() {
        let mut table = ViewTable::new(|v: &View| &v.name);
        assert!(table.insert(view("a", 1)).is_none());
        assert!(table.insert(view("b", 2)).is_none());
        let replaced = table.insert(view("a", 3)).expect("a was there");
        assert_eq!(replaced.value, 1);
        assert_eq!(table.len(), 2);
        assert_eq!(table.get("a").map(|v| v.value), Some(3));
        assert!(table.contains_key("b") && !table.contains_key("c"));
        let stored = table.get("b").expect("b").clone();
        let key = table.keys().find(|k| &***k == "b").expect("b's name");
        assert!(Arc::ptr_eq(key, &stored.name), "the view's own name");
        assert_eq!(table.remove("b").map(|v| v.value), Some(2));
        assert!(table.remove("b").is_none());
        let mut names: Vec<&str> = table.iter().map(|(k, _)| &**k).collect();
        names.sort();
        assert_eq!(names, ["a"]);
    }

    #[test]
    fn a_table_emptied_after_a_burst_gives_its_room_back() {
        let mut table = ViewTable::new(|v: &View| &v.name);
        for i in 0..10_000 {
            table.insert(view(&format!("v{i}"), i));
        }
        let full = table.table.capacity();
        for i in 0..9_990 {
            table.remove(&format!("v{i}"));
        }
        table.shrink_when_sparse();
        assert!(table.table.capacity() < full / 100, "{full} kept");
        assert_eq!(table.get("v9995").map(|v| v.value), Some(9995));
    }
}
