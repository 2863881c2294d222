//! Shared strings for caches: the values that repeat across thousands of cached objects
//! (namespaces, phases, class and driver names, finalizers) are stored once and pointed at.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::ops::Deref;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

/// An interned string: cloning and comparing are cheap, and equal values share one allocation.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Atom(Arc<str>);

/// The interned values, and the size at which values no one holds any more are dropped.
struct Table {
    atoms: HashSet<Arc<str>>,
    prune_at: usize,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        atoms: HashSet::new(),
        prune_at: MIN_PRUNE,
    })
});
const MIN_PRUNE: usize = 1024;

impl Atom {
    pub fn new(text: &str) -> Self {
        if text.is_empty() {
            return Self::default();
        }
        let mut table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(existing) = table.atoms.get(text) {
            return Self(existing.clone());
        }
        // Values taken from user objects can be many and short-lived: forget the ones only
        // the table still holds, at sizes doubling from the last survivors.
        if table.atoms.len() >= table.prune_at {
            table.atoms.retain(|a| Arc::strong_count(a) > 1);
            table.prune_at = (table.atoms.len() * 2).max(MIN_PRUNE);
        }
        let atom: Arc<str> = Arc::from(text);
        table.atoms.insert(atom.clone());
        Self(atom)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for Atom {
    fn default() -> Self {
        static EMPTY: LazyLock<Arc<str>> = LazyLock::new(|| Arc::from(""));
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
        &*self.0 == other
    }
}

impl PartialEq<&str> for Atom {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Atom {
    fn eq(&self, other: &String) -> bool {
        &*self.0 == other.as_str()
    }
}

impl PartialEq<Atom> for String {
    fn eq(&self, other: &Atom) -> bool {
        self.as_str() == &*other.0
    }
}

impl PartialEq<Atom> for str {
    fn eq(&self, other: &Atom) -> bool {
        self == &*other.0
    }
}

impl fmt::Debug for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
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
        let table = TABLE.lock().unwrap();
        assert!(
            table.atoms.len() < 3 * MIN_PRUNE,
            "pruned: {}",
            table.atoms.len()
        );
        assert!(table.atoms.contains("kept-across-pruning"));
        drop(table);
        assert!(Arc::ptr_eq(&kept.0, &Atom::new("kept-across-pruning").0));
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
