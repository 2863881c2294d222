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
use sidecar_kit::cluster::client::TokenBucket;
use sidecar_kit::cluster::client::api_message;

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

/// The digest of `parts`, each preceded by its length so that no two lists share one.
pub fn key(parts: &[&str]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(&(part.len() as u64).to_le_bytes());
        context.update(part.as_bytes());
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

/// The key of `user`'s access to `namespace`: every list counted, so that no group can pass
/// for an extra value or the other way round.
pub fn access_key(user: &User, namespace: &str) -> [u8; 32] {
    let groups = user.groups.len().to_string();
    let extras = user.extra.len().to_string();
    let counts: Vec<String> = user.extra.values().map(|v| v.len().to_string()).collect();
    let mut parts: Vec<&str> = vec![&user.username, &user.uid, namespace, &groups];
    parts.extend(user.groups.iter().map(String::as_str));
    parts.push(&extras);
    for ((name, values), count) in user.extra.iter().zip(&counts) {
        parts.push(name);
        parts.push(count);
        parts.extend(values.iter().map(String::as_str));
    }
    key(&parts)
}

/// How long a token the API server did not authenticate is refused without asking again.
pub const FAILED_TTL: Duration = Duration::from_secs(10);

/// Tokens recently refused, by digest.
pub type FailedCache = Remembered<()>;

/// Reviews a second, and at once, for tokens shaped like a token for the audience (see
/// [`plausible`]), and for any other token: made-up tokens use up only their own share, so
/// they cannot starve a backup application's real one, nor the sidecar's other API requests.
pub const PLAUSIBLE_REVIEWS: (f64, u32) = (20.0, 40);
pub const OTHER_REVIEWS: (f64, u32) = (5.0, 10);
/// The longest a request waits for its review's turn; past it, ResourceExhausted.
pub const REVIEW_WAIT: Duration = Duration::from_secs(1);

/// Whether `token` looks like a token issued for `audience` and not expired at `wall`: a JWT
/// whose claims name the audience. Read without checking the signature: it only chooses the
/// budget a review comes out of, never whether the token is trusted.
pub fn plausible(token: &str, audience: &str, wall: SystemTime) -> bool {
    let Some(claims) = claims(token) else {
        return false;
    };
    let fresh = match claims.get("exp").and_then(serde_json::Value::as_u64) {
        Some(exp) => UNIX_EPOCH + Duration::from_secs(exp) > wall,
        None => true,
    };
    let names_audience = match claims.get("aud") {
        Some(serde_json::Value::String(aud)) => aud == audience,
        Some(serde_json::Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    fresh && names_audience
}

/// The budgets of the reviews the sidecar asks for.
#[derive(Debug)]
pub struct ReviewBudget {
    plausible: TokenBucket,
    other: TokenBucket,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        let bucket = |(qps, burst): (f64, u32)| {
            TokenBucket::new(qps, burst).unwrap_or_else(|| unreachable!("positive rates"))
        };
        Self {
            plausible: bucket(PLAUSIBLE_REVIEWS),
            other: bucket(OTHER_REVIEWS),
        }
    }
}

impl ReviewBudget {
    /// Waits for a review's turn from the plausible share or the other; ResourceExhausted at
    /// once when it would not come within [`REVIEW_WAIT`].
    pub async fn turn(&self, plausible: bool) -> Result<(), Refusal> {
        let bucket = if plausible {
            &self.plausible
        } else {
            &self.other
        };
        match bucket.reserve_within(REVIEW_WAIT) {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                Ok(())
            }
            None => Err(Refusal::new(
                tonic::Code::ResourceExhausted,
                "too many authentication requests; retry later",
            )),
        }
    }
}

/// A JWT's claims, read without checking its signature.
fn claims(token: &str) -> Option<serde_json::Value> {
    let mut parts = token.split('.');
    let (_, payload, _, None) = (parts.next()?, parts.next()?, parts.next()?, parts.next()) else {
        return None;
    };
    // Bounded: a payload this long is no ServiceAccount token.
    if payload.len() > 16 * 1024 {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// When a JWT says it expires (`exp`), read without checking its signature: only to keep the
/// cache from trusting it longer, never to trust it.
pub fn token_expiry(token: &str) -> Option<SystemTime> {
    let exp = claims(token)?.get("exp")?.as_u64()?;
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
                format!("failed to authenticate user: {}", api_message(&err)),
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
                format!("failed to authorize the user: {}", api_message(&err)),
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

        let mut as_group = user("a");
        as_group.groups.push("k=v".into());
        let mut as_extra = user("a");
        as_extra.extra.insert("k".into(), vec!["v".into()]);
        assert_ne!(access_key(&as_group, "ns"), access_key(&as_extra, "ns"));
        let mut two = user("a");
        two.extra.insert("k".into(), vec!["v".into(), "w".into()]);
        let mut joined = user("a");
        joined.extra.insert("k".into(), vec!["v,w".into()]);
        assert_ne!(access_key(&two, "ns"), access_key(&joined, "ns"));
        assert_ne!(key(&["ab", "c"]), key(&["a", "bc"]));
    }

    fn jwt(claims: &str) -> String {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        format!("eyJhbGciOiJSUzI1NiJ9.{payload}.signature")
    }

    #[test]
    fn a_token_is_plausible_only_as_a_fresh_jwt_for_the_audience() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert!(plausible(&jwt(r#"{"aud":["cbt"],"exp":2000}"#), "cbt", now));
        assert!(plausible(&jwt(r#"{"aud":"cbt"}"#), "cbt", now));
        assert!(!plausible(
            &jwt(r#"{"aud":["other"],"exp":2000}"#),
            "cbt",
            now
        ));
        assert!(!plausible(&jwt(r#"{"aud":["cbt"],"exp":500}"#), "cbt", now));
        assert!(!plausible(&jwt("not json"), "cbt", now));
        assert!(!plausible("opaque-token", "cbt", now));
        assert!(!plausible(
            &format!("{}.extra", jwt(r#"{"aud":"cbt"}"#)),
            "cbt",
            now
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn made_up_tokens_use_up_only_their_own_share_of_reviews() {
        let budget = ReviewBudget::default();
        let start = tokio::time::Instant::now();
        let flood = futures::future::join_all((0..100).map(|_| budget.turn(false)));
        let real = async {
            let turn = budget.turn(true).await;
            (turn, start.elapsed())
        };
        let (flood, (real, waited)) = tokio::join!(flood, real);
        let served = flood.iter().filter(|turn| turn.is_ok()).count();
        let (qps, burst) = OTHER_REVIEWS;
        // The burst at once, then the rate for at most REVIEW_WAIT.
        assert!(served <= burst as usize + (qps * REVIEW_WAIT.as_secs_f64()) as usize + 1);
        assert!(
            served < flood.len(),
            "a flood is refused once its share is spent"
        );
        assert!(flood.iter().all(|turn| match turn {
            Ok(()) => true,
            Err(refusal) => refusal.code == tonic::Code::ResourceExhausted,
        }));
        assert!(real.is_ok());
        assert_eq!(
            waited,
            Duration::ZERO,
            "a plausible token's turn is not taken"
        );
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
