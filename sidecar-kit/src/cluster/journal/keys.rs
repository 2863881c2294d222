//! The journal's sealing keys, kept in a Secret beside the journal that only the sidecar's
//! ServiceAccount may read (`<lease>-journal-key`). The sidecar fills it: an empty or missing
//! Secret gets a fresh random key. Keys are rotated after [`ROTATION`]: the current key becomes
//! the previous one, which still opens entries until the next rotation, and every journal write
//! seals what it carries over with the new key, so a genuine entry outlives any number of
//! rotations while a key that leaked stops opening anything two rotations later.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use ring::rand::{SecureRandom, SystemRandom};

use super::seal::{KEY_LEN, Key, Keyring};
use crate::cluster::client::api_message;

/// How long a key seals before it is rotated.
pub const ROTATION: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long the keys read are used before they are read again (another replica may have
/// rotated them).
const REREAD: Duration = Duration::from_secs(3600);
/// Data fields of the Secret.
pub const CURRENT: &str = "key";
pub const PREVIOUS: &str = "previous-key";
pub const ROTATED_AT: &str = "rotated-at";
/// Writes that lose a race with another replica are tried again this often.
const ATTEMPTS: usize = 5;

/// The name of the key Secret of the journals of the Lease `lease` (one for all nodes'
/// journals with distributed provisioning: each entry is sealed to its own journal).
pub fn secret_name(lease: &str) -> String {
    format!("{lease}-journal-key")
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{0}")]
    Forbidden(String),
    #[error("cannot read or write the journal's key Secret {name}: {message}")]
    Api { name: String, message: String },
    #[error("cannot make a journal key: no random source")]
    Random,
}

/// The key Secret as read: the keys it holds and whether they are due for a rotation.
#[derive(Debug)]
struct Read {
    keys: Option<Keyring>,
    rotated_at: Option<Timestamp>,
}

/// The keys a key Secret holds (`None`: it holds no valid current key).
pub fn keyring_of(secret: &Secret) -> Option<Keyring> {
    read(secret).keys
}

fn read(secret: &Secret) -> Read {
    let data = secret.data.as_ref();
    let field = |name: &str| data.and_then(|d| d.get(name)).map(|b| b.0.as_slice());
    let current = field(CURRENT).and_then(Key::from_bytes);
    let previous = field(PREVIOUS).and_then(Key::from_bytes);
    let rotated_at = field(ROTATED_AT)
        .and_then(|b| std::str::from_utf8(b).ok())
        .and_then(|s| s.parse::<Timestamp>().ok());
    Read {
        keys: current.map(|current| Keyring { current, previous }),
        rotated_at,
    }
}

/// Whether keys last rotated at `rotated_at` (`None`: unknown) are due at `now`.
fn due(rotated_at: Option<Timestamp>, now: Timestamp) -> bool {
    let Some(at) = rotated_at else { return true };
    let age = now.duration_since(at);
    // A time well in the future (a clock set back) also asks for a new key: its age is
    // unknown. Replicas' clocks differ a little, which must not make them rotate in turn.
    age < -SignedDuration::from_hours(1)
        || age >= SignedDuration::try_from(ROTATION).unwrap_or(SignedDuration::MAX)
}

fn fresh_key(random: &SystemRandom) -> Result<Vec<u8>, KeyError> {
    let mut bytes = vec![0u8; KEY_LEN];
    random.fill(&mut bytes).map_err(|_| KeyError::Random)?;
    Ok(bytes)
}

/// The Secret's data after a rotation from `secret`: a new current key, the old current one as
/// previous (a missing or damaged one is not kept).
fn rotated(secret: &Secret, new_key: Vec<u8>, now: Timestamp) -> Secret {
    let mut next = secret.clone();
    let old = secret
        .data
        .as_ref()
        .and_then(|d| d.get(CURRENT))
        .filter(|b| Key::from_bytes(&b.0).is_some())
        .cloned();
    let data = next.data.get_or_insert_default();
    data.clear();
    data.insert(CURRENT.into(), ByteString(new_key));
    if let Some(old) = old {
        data.insert(PREVIOUS.into(), old);
    }
    data.insert(ROTATED_AT.into(), ByteString(now.to_string().into_bytes()));
    next.string_data = None;
    next.type_ = Some("Opaque".into());
    next
}

/// Reads, creates and rotates the journal's keys.
pub struct KeyStore {
    api: Api<Secret>,
    name: String,
    random: SystemRandom,
    cached: tokio::sync::Mutex<Option<(Keyring, tokio::time::Instant)>>,
}

impl KeyStore {
    pub fn new(api: Api<Secret>, name: String) -> Self {
        Self {
            api,
            name,
            random: SystemRandom::new(),
            cached: tokio::sync::Mutex::new(None),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The keys, read at most [`REREAD`] ago; made or rotated when missing or due.
    pub async fn keyring(&self) -> Result<Keyring, KeyError> {
        let mut cached = self.cached.lock().await;
        if let Some((keys, at)) = cached.as_ref()
            && at.elapsed() < REREAD
        {
            return Ok(keys.clone());
        }
        let keys = self.read_or_rotate().await?;
        *cached = Some((keys.clone(), tokio::time::Instant::now()));
        Ok(keys)
    }

    /// The keys as the API server has them, after a rotation if one is due.
    async fn read_or_rotate(&self) -> Result<Keyring, KeyError> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let found = self
                .api
                .get_opt(&self.name)
                .await
                .map_err(|e| self.error(&e))?;
            let now = Timestamp::now();
            let secret = match found {
                Some(secret) => {
                    let read = read(&secret);
                    if let Some(keys) = read.keys
                        && !due(read.rotated_at, now)
                    {
                        return Ok(keys);
                    }
                    secret
                }
                None => Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            };
            let next = rotated(&secret, fresh_key(&self.random)?, now);
            let written = if secret.metadata.resource_version.is_none() {
                self.api.create(&PostParams::default(), &next).await
            } else {
                self.api
                    .replace(&self.name, &PostParams::default(), &next)
                    .await
            };
            match written {
                Ok(written) => {
                    tracing::info!(secret = %self.name, "made a new intent journal key");
                    if let Some(keys) = read(&written).keys {
                        return Ok(keys);
                    }
                    last = "the key written was not read back".into();
                }
                // Another replica wrote it first: read what it wrote.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    last = status.message;
                }
                Err(err) => return Err(self.error(&err)),
            }
        }
        Err(KeyError::Api {
            name: self.name.clone(),
            message: last,
        })
    }

    fn error(&self, err: &kube::Error) -> KeyError {
        match err {
            kube::Error::Api(status) if matches!(status.code, 403 | 404) => {
                // 404 on a create: the namespace is missing.
                KeyError::Forbidden(format!(
                    "journal key Secret {}: {}",
                    self.name, status.message
                ))
            }
            err => KeyError::Api {
                name: self.name.clone(),
                message: api_message(err),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, Vec<u8>)]) -> Secret {
        Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.clone())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_rotation_keeps_the_old_key_as_previous_and_drops_the_one_before() {
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let before = secret(&[
            (CURRENT, vec![1; KEY_LEN]),
            (PREVIOUS, vec![2; KEY_LEN]),
            (ROTATED_AT, b"2026-10-01T00:00:00Z".to_vec()),
        ]);
        let after = rotated(&before, vec![3; KEY_LEN], now);
        let keys = read(&after).keys.unwrap();
        assert_eq!(
            keys.current.id(),
            Key::from_bytes(&[3; KEY_LEN]).unwrap().id()
        );
        assert_eq!(
            keys.previous.unwrap().id(),
            Key::from_bytes(&[1; KEY_LEN]).unwrap().id()
        );
        assert_eq!(read(&after).rotated_at, Some(now));
        // A damaged current key is not carried over as the previous one.
        let damaged = rotated(&secret(&[(CURRENT, vec![1; 3])]), vec![3; KEY_LEN], now);
        assert!(read(&damaged).keys.unwrap().previous.is_none());
    }

    #[test]
    fn keys_are_due_when_old_undated_or_dated_ahead() {
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let at = |s: &str| Some(s.parse::<Timestamp>().unwrap());
        assert!(!due(at("2026-11-20T00:00:00Z"), now));
        assert!(due(at("2026-10-01T00:00:00Z"), now));
        assert!(due(at("2027-01-01T00:00:00Z"), now));
        assert!(!due(at("2026-12-01T00:10:00Z"), now));
        assert!(due(None, now));
        // Unreadable fields read as missing ones.
        let odd = read(&secret(&[
            (CURRENT, vec![1; KEY_LEN]),
            (ROTATED_AT, b"soon".to_vec()),
        ]));
        assert!(odd.keys.is_some() && odd.rotated_at.is_none());
    }
}
