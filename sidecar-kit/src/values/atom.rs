//! Shared values for caches: the values that repeat across thousands of cached objects
//! (namespaces, phases, class and driver names, finalizers, and whole lists of them such as a
//! volume's attributes, which the provisioner writes alike into every volume it makes) are
//! stored once and pointed at.
//!
//! A value is held through a thin pointer (`Arc<Box<T>>`: 8 bytes, where an `Arc<str>` takes
//! 16): a cached PV holds a dozen of them, and the second indirection is paid only on reading,
//! while the allocation it costs is paid once per distinct value.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use hashbrown::HashTable;

/// An interned string: cloning and comparing are cheap, and equal values share one allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Atom(Arc<Box<str>>);

/// The interned values of one type, and the size at which values no one holds any more are
/// dropped. Hashed with a random key: the values come from API objects.
pub struct Interner<T: ?Sized> {
    values: HashTable<Arc<Box<T>>>,
    hasher: RandomState,
    prune_at: usize,
}

const MIN_PRUNE: usize = 1024;

impl<T: ?Sized + Eq + Hash> Interner<T> {
    fn new() -> Self {
        Self {
            values: HashTable::new(),
            hasher: RandomState::new(),
            prune_at: MIN_PRUNE,
        }
    }

    /// The stored value equal to `value`, stored first (as `make` makes it) if there is none.
    fn intern(&mut self, value: &T, make: impl FnOnce(&T) -> Box<T>) -> Arc<Box<T>> {
        let hasher = &self.hasher;
        let hash = hasher.hash_one(value);
        if let Some(existing) = self.values.find(hash, |v| ***v == *value) {
            return existing.clone();
        }
        // Values taken from user objects can be many and short-lived: forget the ones only
        // the table still holds, at sizes doubling from the last survivors.
        if self.values.len() >= self.prune_at {
            self.values.retain(|v| Arc::strong_count(v) > 1);
            self.prune_at = (self.values.len() * 2).max(MIN_PRUNE);
        }
        let stored = Arc::new(make(value));
        self.values
            .insert_unique(hash, stored.clone(), |v| hasher.hash_one(&***v));
        stored
    }

    #[cfg(test)]
    fn contains(&self, value: &T) -> bool {
        self.values
            .find(self.hasher.hash_one(value), |v| ***v == *value)
            .is_some()
    }
}

fn lock<T: ?Sized>(table: &Mutex<Interner<T>>) -> std::sync::MutexGuard<'_, Interner<T>> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A process-wide interner of one type.
type Table<T> = LazyLock<Mutex<Interner<T>>>;

static ATOMS: Table<str> = LazyLock::new(|| Mutex::new(Interner::new()));

impl Atom {
    pub fn new(text: &str) -> Self {
        if text.is_empty() {
            return Self::default();
        }
        Self(lock(&ATOMS).intern(text, |t| Box::from(t)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Atom {
    fn default() -> Self {
        static EMPTY: LazyLock<Arc<Box<str>>> = LazyLock::new(|| Arc::new(Box::from("")));
        Self(EMPTY.clone())
    }
}

impl Deref for Atom {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Atom {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Atom {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Atom {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<&String> for Atom {
    fn from(text: &String) -> Self {
        Self::new(text)
    }
}

impl From<String> for Atom {
    fn from(text: String) -> Self {
        Self::new(&text)
    }
}

impl PartialEq<str> for Atom {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Atom {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Atom {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Atom> for String {
    fn eq(&self, other: &Atom) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Atom> for str {
    fn eq(&self, other: &Atom) -> bool {
        self == other.as_str()
    }
}

impl fmt::Debug for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

impl serde::Serialize for Atom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Atom {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Self::new(&text))
    }
}

/// The values whose lists can be interned ([`List`]): each type keeps its own table.
pub trait Listed: Eq + Hash + Send + Sync + Sized + 'static {
    fn lists() -> &'static Mutex<Interner<[Self]>>;
}

impl Listed for Atom {
    fn lists() -> &'static Mutex<Interner<[Self]>> {
        static LISTS: Table<[Atom]> = LazyLock::new(|| Mutex::new(Interner::new()));
        &LISTS
    }
}

impl Listed for (Atom, Atom) {
    fn lists() -> &'static Mutex<Interner<[Self]>> {
        static LISTS: Table<[(Atom, Atom)]> = LazyLock::new(|| Mutex::new(Interner::new()));
        &LISTS
    }
}

/// An interned list (as a boxed slice, but equal lists share one allocation): a cached object's
/// finalizers, access modes, attributes or annotations are most often the same as thousands of
/// others', and a list of their own would cost each of them an allocation.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct List<T: Listed>(Arc<Box<[T]>>);

impl<T: Listed + Clone> List<T> {
    pub fn new(items: &[T]) -> Self {
        Self(lock(T::lists()).intern(items, |i| Box::from(i)))
    }
}

impl<T: Listed + Clone> Default for List<T> {
    fn default() -> Self {
        Self::new(&[])
    }
}

impl<T: Listed + Clone> FromIterator<T> for List<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Self {
        let items: Vec<T> = items.into_iter().collect();
        Self::new(&items)
    }
}

impl<T: Listed> Deref for List<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T: Listed + fmt::Debug> fmt::Debug for List<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_allocation() {
        let a = Atom::new("Bound-shared-test");
        let b = Atom::from(String::from("Bound-shared-test"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, "Bound-shared-test");
        assert_eq!(a.as_str(), "Bound-shared-test");
        assert_ne!(Atom::new("other-value"), a);
        assert_eq!(Atom::new(""), Atom::default());
        assert_eq!(size_of::<Atom>(), 8, "a thin pointer");
        assert_eq!(size_of::<Option<Atom>>(), 8);
        assert_eq!(size_of::<List<Atom>>(), 8);
    }

    #[test]
    fn values_no_one_holds_are_dropped() {
        for i in 0..(3 * MIN_PRUNE) {
            let _ = Atom::new(&format!("transient-{i}"));
        }
        let kept = Atom::new("kept-across-pruning");
        for i in 0..(3 * MIN_PRUNE) {
            let _ = Atom::new(&format!("transient-again-{i}"));
        }
        let table = lock(&ATOMS);
        assert!(
            table.values.len() < 3 * MIN_PRUNE,
            "pruned: {}",
            table.values.len()
        );
        assert!(table.contains("kept-across-pruning"));
        drop(table);
        assert!(Arc::ptr_eq(&kept.0, &Atom::new("kept-across-pruning").0));
    }

    #[test]
    fn equal_lists_share_one_allocation() {
        let pair = |k: &str, v: &str| (Atom::new(k), Atom::new(v));
        let a: List<(Atom, Atom)> = [pair("identity", "list-test-1")].into_iter().collect();
        let b = List::new(&[pair("identity", "list-test-1")]);
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(&a[..], &[pair("identity", "list-test-1")]);
        let other = List::new(&[pair("identity", "list-test-2")]);
        assert_ne!(a, other);
        let empty: List<Atom> = std::iter::empty().collect();
        assert!(empty.is_empty());
        assert!(Arc::ptr_eq(&empty.0, &List::<Atom>::default().0));
    }

    #[test]
    fn serde_round_trip() {
        let a = Atom::new("Delete");
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(text, "\"Delete\"");
        let back: Atom = serde_json::from_str(&text).unwrap();
        assert_eq!(back, a);
    }
}
