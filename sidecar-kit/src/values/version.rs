//! An object's `resourceVersion`, held in the size of a number: kube-apiserver's are etcd
//! revisions, decimal numbers, which a `String` would hold in 24 bytes and an allocation of its
//! own in every cached object.

use std::fmt;

/// A `resourceVersion` as the API server wrote it. Opaque by the API's rules: compared only for
/// equality, except that two revisions tell which is older.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum ResourceVersion {
    /// None written.
    #[default]
    None,
    /// A decimal number written without leading zeros, as kube-apiserver writes etcd revisions.
    Revision(u64),
    /// Anything else, kept as written (boxed twice, so that the common case stays 16 bytes).
    Opaque(Box<String>),
}

impl ResourceVersion {
    /// `written` as held; an empty one is none.
    pub fn new(written: Option<&str>) -> Self {
        match written {
            None | Some("") => Self::None,
            Some(text) => match revision(text) {
                Some(number) => Self::Revision(number),
                None => Self::Opaque(Box::new(text.to_string())),
            },
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Self::None)
    }

    /// As an object's metadata holds it: `None` when none was written.
    pub fn to_option(&self) -> Option<String> {
        (!self.is_empty()).then(|| self.to_string())
    }

    /// Whether this is a revision older than `other`, one the cache has seen past: a watch
    /// event that arrives after a newer one was applied. Anything not two revisions is not.
    pub fn is_older_than(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Revision(mine), Self::Revision(theirs)) => mine < theirs,
            _ => false,
        }
    }
}

/// The number `text` writes, when it writes one exactly as the number prints (so that the text
/// comes back as it was).
fn revision(text: &str) -> Option<u64> {
    let canonical =
        text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    canonical.then(|| text.parse().ok()).flatten()
}

impl From<&str> for ResourceVersion {
    fn from(text: &str) -> Self {
        Self::new(Some(text))
    }
}

impl fmt::Display for ResourceVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None => Ok(()),
            Self::Revision(number) => write!(f, "{number}"),
            Self::Opaque(text) => f.write_str(text),
        }
    }
}

impl PartialEq<&str> for ResourceVersion {
    fn eq(&self, other: &&str) -> bool {
        *self == Self::new(Some(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_are_numbers_and_come_back_as_written() {
        for text in [
            "0",
            "1",
            "18446744073709551615",
            "0123",
            "+5",
            "12a",
            "18446744073709551616",
            " 7",
        ] {
            let held = ResourceVersion::from(text);
            assert_eq!(held.to_string(), text, "{text:?} comes back as written");
        }
        assert_eq!(ResourceVersion::from("42"), ResourceVersion::Revision(42));
        assert!(matches!(
            ResourceVersion::from("0042"),
            ResourceVersion::Opaque(_)
        ));
        assert_eq!(ResourceVersion::new(Some("")), ResourceVersion::None);
        assert_eq!(ResourceVersion::None.to_option(), None);
        assert_eq!(ResourceVersion::from("7").to_option().as_deref(), Some("7"));
        assert_eq!(std::mem::size_of::<ResourceVersion>(), 16);
    }

    #[test]
    fn only_two_revisions_are_ordered() {
        let (old, new) = (ResourceVersion::from("9"), ResourceVersion::from("10"));
        assert!(old.is_older_than(&new), "numbers, not text");
        assert!(!new.is_older_than(&old));
        assert!(!ResourceVersion::from("a").is_older_than(&new));
        assert!(!old.is_older_than(&ResourceVersion::from("b")));
        assert!(!ResourceVersion::None.is_older_than(&new));
    }
}
