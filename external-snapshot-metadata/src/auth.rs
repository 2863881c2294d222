//! Who the caller is (TokenReview) and whether they may read the namespace's VolumeSnapshots
//! (SubjectAccessReview), as upstream asks the API server; with a short, bounded cache of
//! TokenReview answers, as kube-apiserver's webhook token authenticator keeps, that never
//! outlives the token.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::decide::Refusal;
use crate::model::SNAPSHOT_GROUP;

/// How long an authenticated token is trusted without asking again (kube-apiserver's webhook
/// token cache keeps answers for 2 minutes; a backup stream needs less).
pub const TOKEN_TTL: Duration = Duration::from_secs(60);
/// Most tokens remembered at once: a client that sends many tokens evicts, never grows, the
/// cache.
pub const TOKEN_CACHE_CAPACITY: usize = 1024;

/// The caller, as TokenReview authenticated them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Answers remembered until a deadline each, by a digest of what they answer (a token itself
/// is never kept), at most [`CACHE_CAPACITY`] at once.
#[derive(Debug)]
pub struct Remembered<V> {
    entries: HashMap<[u8; 32], (V, Instant)>,
}

impl<V> Default for Remembered<V> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }
}

/// Most answers a cache holds: a client that sends many tokens evicts, never grows, it.
pub const CACHE_CAPACITY: usize = TOKEN_CACHE_CAPACITY;

/// The digest of `parts`, each ended by a NUL so that no two lists share one.
pub fn key(parts: &[&str]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part.as_bytes());
        context.update(&[0]);
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(context.finish().as_ref());
    key
}

impl<V: Clone> Remembered<V> {
    /// The answer remembered for `key`, if still fresh at `now`.
    pub fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<V> {
        match self.entries.get(key) {
            Some((value, until)) if now < *until => Some(value.clone()),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers `value` for `key` until `until`; the stalest answers make room.
    pub fn put(&mut self, key: [u8; 32], value: V, until: Instant, now: Instant) {
        if self.entries.len() >= CACHE_CAPACITY {
            self.entries.retain(|_, (_, until)| now < *until);
        }
        if self.entries.len() >= CACHE_CAPACITY {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, (_, until))| *until)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, until));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Authenticated users by token and audience.
pub type TokenCache = Remembered<User>;

/// Until when an authenticated token may be trusted without asking again: [`TOKEN_TTL`], or its
/// expiry (`expires`, read at `wall`) if sooner; `None` when it has expired.
pub fn token_until(now: Instant, wall: SystemTime, expires: Option<SystemTime>) -> Option<Instant> {
    let ttl = match expires {
        Some(expires) => expires.duration_since(wall).ok()?.min(TOKEN_TTL),
        None => TOKEN_TTL,
    };
    Some(now + ttl)
}

/// How long an access review's answer stands: kube-apiserver's webhook authorizer keeps
/// allowed answers 5 minutes and denied ones 30 seconds; a grant or a revocation here takes
/// effect within these.
pub const ALLOWED_TTL: Duration = Duration::from_secs(30);
pub const DENIED_TTL: Duration = Duration::from_secs(5);

/// Access review answers by user and namespace.
pub type AccessCache = Remembered<Result<(), Refusal>>;

/// The key of `user`'s access to `namespace`.
pub fn access_key(user: &User, namespace: &str) -> [u8; 32] {
    let mut parts: Vec<&str> = vec![&user.username, &user.uid, namespace];
    parts.extend(user.groups.iter().map(String::as_str));
    let extra: Vec<String> = user
        .extra
        .iter()
        .map(|(k, v)| format!("{k}={}", v.join(",")))
        .collect();
    parts.extend(extra.iter().map(String::as_str));
    key(&parts)
}

/// When a JWT says it expires (`exp`), read without checking its signature: only to keep the
/// cache from trusting it longer, never to trust it.
pub fn token_expiry(token: &str) -> Option<SystemTime> {
    let payload = token.split('.').nth(1)?;
    // Bounded: a payload this long is no ServiceAccount token.
    if payload.len() > 16 * 1024 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?.as_u64()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(exp))
}

/// Asks the API server who `token` is for `audience`: authenticated only if the answer says so
/// and echoes the audience.
pub async fn review_token(
    client: &kube::Client,
    token: &str,
    audience: &str,
) -> Result<User, Refusal> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: Some(vec![audience.to_string()]),
        },
        ..TokenReview::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|err| {
            Refusal::new(
                tonic::Code::Internal,
                format!("failed to authenticate user: {err}"),
            )
        })?;
    let status = answer.status.unwrap_or_default();
    let echoed = status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == audience));
    if status.authenticated != Some(true) || !echoed {
        return Err(Refusal::new(
            tonic::Code::Unauthenticated,
            "unauthenticated user",
        ));
    }
    let user = status.user.unwrap_or_default();
    Ok(User {
        username: user.username.unwrap_or_default(),
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

/// Asks the API server whether `user` may get VolumeSnapshots in `namespace`.
pub async fn authorize(client: &kube::Client, user: &User, namespace: &str) -> Result<(), Refusal> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: Some(user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: Some(user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("get".to_string()),
                group: Some(SNAPSHOT_GROUP.to_string()),
                version: Some("v1".to_string()),
                resource: Some("volumesnapshots".to_string()),
                namespace: Some(namespace.to_string()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|err| {
            Refusal::new(
                tonic::Code::Internal,
                format!("failed to authorize the user: {err}"),
            )
        })?;
    let status = answer.status.unwrap_or_default();
    if !status.allowed || status.denied == Some(true) {
        return Err(Refusal::new(
            tonic::Code::PermissionDenied,
            format!(
                "user does not have permissions to perform the operation: {}",
                status.reason.unwrap_or_default()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> User {
        User {
            username: name.to_string(),
            ..User::default()
        }
    }

    #[test]
    fn a_cached_token_expires_with_the_ttl_or_the_token() {
        let mut cache = TokenCache::default();
        let now = Instant::now();
        let wall = SystemTime::now();
        let until = token_until(now, wall, None).unwrap();
        cache.put(key(&["t", "aud"]), user("a"), until, now);
        assert_eq!(cache.get(&key(&["t", "aud"]), now), Some(user("a")));
        assert_eq!(cache.get(&key(&["t", "other"]), now), None);
        assert_eq!(cache.get(&key(&["t", "aud"]), now + TOKEN_TTL), None);

        let soon = wall + Duration::from_secs(5);
        assert_eq!(
            token_until(now, wall, Some(soon)),
            Some(now + Duration::from_secs(5))
        );
        assert_eq!(
            token_until(now, wall, Some(wall - Duration::from_secs(1))),
            None
        );
    }

    #[test]
    fn the_cache_never_grows_past_its_capacity() {
        let mut cache = TokenCache::default();
        let now = Instant::now();
        for i in 0..CACHE_CAPACITY + 10 {
            cache.put(key(&[&format!("t{i}")]), user("a"), now + TOKEN_TTL, now);
        }
        assert_eq!(cache.len(), CACHE_CAPACITY);
    }

    #[test]
    fn access_is_remembered_per_user_and_namespace() {
        let a = user("a");
        let mut grouped = user("a");
        grouped.groups.push("g".into());
        assert_ne!(access_key(&a, "ns"), access_key(&a, "other"));
        assert_ne!(access_key(&a, "ns"), access_key(&grouped, "ns"));
        assert_eq!(access_key(&a, "ns"), access_key(&user("a"), "ns"));
    }

    #[test]
    fn the_expiry_is_read_from_a_jwt_and_nothing_else() {
        let claims =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"exp":1700000000}"#);
        assert_eq!(
            token_expiry(&format!("h.{claims}.s")),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(token_expiry("opaque"), None);
        assert_eq!(token_expiry("h.!!!.s"), None);
    }
}
