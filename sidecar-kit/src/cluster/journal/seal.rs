//! Sealed journal entries: each entry carries an HMAC-SHA256 over where it lives (namespace,
//! journal, key) and what it says, made with a key that only the sidecar's ServiceAccount may
//! read (a Secret beside the journal, see [`super::keys`]). Whoever may write the ConfigMap but
//! cannot read that Secret cannot make an entry the sidecar will act on, nor move a genuine one
//! to another key or journal.
//!
//! An entry's value is `v1.<key id>.<mac>.<intent as JSON>`: the key id names which of the
//! sidecar's keys sealed it (the current one, or the one before the last rotation), the MAC is
//! base64url without padding.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;

/// The version tag every sealed entry starts with.
const VERSION: &str = "v1";
/// Length of a key in bytes (HMAC-SHA256's block-size-independent strength).
pub const KEY_LEN: usize = 32;

/// One key of the journal.
#[derive(Clone)]
pub struct Key {
    id: String,
    mac: hmac::Key,
}

impl Key {
    /// A key from its bytes; `None` unless it has exactly [`KEY_LEN`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != KEY_LEN {
            return None;
        }
        // The id tells the keys apart and reveals nothing of them: a digest's first bytes.
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let id = digest.as_ref()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Some(Self {
            id,
            mac: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        })
    }

    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

/// The keys an entry may be sealed with: the current one seals, both open.
#[derive(Clone, Debug)]
pub struct Keyring {
    pub current: Key,
    pub previous: Option<Key>,
}

/// Where an entry lives: it is sealed to that place and opens nowhere else.
#[derive(Clone, Copy, Debug)]
pub struct Place<'a> {
    pub namespace: &'a str,
    pub journal: &'a str,
    pub key: &'a str,
}

/// Why an entry does not open.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsealed {
    #[error("it carries no seal (written by hand, or by a version without sealed entries)")]
    Unsigned,
    #[error(
        "it is sealed with key {0:?}, which this sidecar no longer has (rotated out, or the key Secret was replaced)"
    )]
    UnknownKey(String),
    #[error("its seal does not match what it says: it was not written by this sidecar")]
    Forged,
}

fn message(place: Place<'_>, text: &str) -> Vec<u8> {
    // NUL never occurs in object names or in JSON text, so the parts cannot be shifted.
    let mut bytes = Vec::with_capacity(
        VERSION.len()
            + place.namespace.len()
            + place.journal.len()
            + place.key.len()
            + text.len()
            + 4,
    );
    for part in [VERSION, place.namespace, place.journal, place.key, text] {
        bytes.extend_from_slice(part.as_bytes());
        bytes.push(0);
    }
    bytes
}

/// `text` sealed with `key` for `place`.
pub fn seal(key: &Key, place: Place<'_>, text: &str) -> String {
    let tag = hmac::sign(&key.mac, &message(place, text));
    format!(
        "{VERSION}.{}.{}.{text}",
        key.id,
        URL_SAFE_NO_PAD.encode(tag.as_ref())
    )
}

/// The length of a text of `text_len` bytes once sealed.
pub const fn sealed_len(text_len: usize) -> usize {
    // The version, a key id of 12 hex digits, a SHA-256 MAC in unpadded base64 (43), three
    // dots.
    VERSION.len() + 12 + 43 + 3 + text_len
}

/// The parts of a sealed value: key id, MAC and text.
fn split(value: &str) -> Option<(&str, &str, &str)> {
    let rest = value.strip_prefix(VERSION)?.strip_prefix('.')?;
    let mut parts = rest.splitn(3, '.');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// The id of the key `value` says it is sealed with.
pub fn key_id(value: &str) -> Option<&str> {
    split(value).map(|(id, _, _)| id)
}

/// The text of `value` if one of `keys` sealed it for `place`.
pub fn open<'v>(keys: &Keyring, place: Place<'_>, value: &'v str) -> Result<&'v str, Unsealed> {
    let (id, tag, text) = split(value).ok_or(Unsealed::Unsigned)?;
    let key = [Some(&keys.current), keys.previous.as_ref()]
        .into_iter()
        .flatten()
        .find(|key| key.id == id)
        .ok_or_else(|| Unsealed::UnknownKey(id.chars().take(16).collect()))?;
    let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Unsealed::Forged)?;
    hmac::verify(&key.mac, &message(place, text), &tag).map_err(|_| Unsealed::Forged)?;
    Ok(text)
}

/// Whether `key` is a Kubernetes UID as the API server makes them (a UUID in its text form).
pub fn is_uid(key: &str) -> bool {
    let bytes = key.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> Key {
        Key::from_bytes(&[byte; KEY_LEN]).unwrap()
    }

    const PLACE: Place<'static> = Place {
        namespace: "csi",
        journal: "hostpath-journal",
        key: "0b5ae7e0-0000-4000-8000-00000000beef",
    };

    #[test]
    fn what_is_sealed_opens_with_the_current_or_the_previous_key() {
        let ring = Keyring {
            current: key(1),
            previous: Some(key(2)),
        };
        let sealed = seal(&ring.current, PLACE, r#"{"a":1}"#);
        assert_eq!(open(&ring, PLACE, &sealed), Ok(r#"{"a":1}"#));
        let old = seal(&key(2), PLACE, r#"{"a":2}"#);
        assert_eq!(open(&ring, PLACE, &old), Ok(r#"{"a":2}"#));
        assert_eq!(key_id(&old), Some(key(2).id()));
    }

    #[test]
    fn a_key_rotated_out_or_never_had_does_not_open() {
        let ring = Keyring {
            current: key(1),
            previous: Some(key(2)),
        };
        let ancient = seal(&key(3), PLACE, "{}");
        assert_eq!(
            open(&ring, PLACE, &ancient),
            Err(Unsealed::UnknownKey(key(3).id().to_string()))
        );
        assert_eq!(open(&ring, PLACE, "{}"), Err(Unsealed::Unsigned));
        assert_eq!(open(&ring, PLACE, "v1.x"), Err(Unsealed::Unsigned));
    }

    #[test]
    fn a_changed_text_place_or_seal_is_forged() {
        let ring = Keyring {
            current: key(1),
            previous: None,
        };
        let sealed = seal(&ring.current, PLACE, r#"{"volume":"pvc-1"}"#);
        let changed = sealed.replace("pvc-1", "pvc-2");
        assert_eq!(open(&ring, PLACE, &changed), Err(Unsealed::Forged));
        for moved in [
            Place {
                key: "0b5ae7e0-0000-4000-8000-00000000dead",
                ..PLACE
            },
            Place {
                journal: "other-journal",
                ..PLACE
            },
            Place {
                namespace: "other",
                ..PLACE
            },
        ] {
            assert_eq!(open(&ring, moved, &sealed), Err(Unsealed::Forged));
        }
        let id = ring.current.id().to_string();
        for tag in ["", "!!!", "AAAA"] {
            let bad = format!("v1.{id}.{tag}.{{}}");
            assert_eq!(open(&ring, PLACE, &bad), Err(Unsealed::Forged));
        }
        assert!(Key::from_bytes(&[0; 16]).is_none());
    }

    #[test]
    fn uids_are_uuids() {
        assert!(is_uid("0b5ae7e0-0000-4000-8000-00000000beef"));
        for bad in [
            "",
            "tenant-b-data",
            "0b5ae7e0-0000-4000-8000-00000000beef0",
            "0b5ae7e0_0000-4000-8000-00000000beef",
            "0b5ae7e0-0000-4000-8000-00000000beeg",
        ] {
            assert!(!is_uid(bad), "{bad}");
        }
    }
}
