//! Distinctive secret values and a search for them in captured output (logs, Events, metrics),
//! for tests that prove secrets never leave the driver's requests.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE};

/// A random 32-character lowercase alphanumeric value, different on every call and in every
/// process, so that finding it anywhere means it leaked from where it was put.
pub fn distinctive_secret() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut out = String::with_capacity(32);
    let mut round = 0u64;
    while out.len() < 32 {
        // Every RandomState has fresh random keys.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(nanos);
        hasher.write_u64(round);
        let mut bits = hasher.finish();
        for _ in 0..8 {
            if out.len() == 32 {
                break;
            }
            let index = usize::try_from(bits % ALPHABET.len() as u64).unwrap_or(0);
            out.push(char::from(ALPHABET[index]));
            bits /= ALPHABET.len() as u64;
        }
        round += 1;
    }
    out
}

/// The forms a secret value could take in captured text: itself and its base64 (standard and
/// URL-safe alphabet, as a Secret's `data` holds it).
pub fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![
        secret.to_owned(),
        STANDARD.encode(secret),
        URL_SAFE.encode(secret),
    ];
    forms.dedup();
    forms
}

/// Every place one of `secrets` (in any of its [`forms`]) occurs in `text`: one line per hit,
/// naming `what` was searched and the line it was found in (with the value itself masked, so
/// that a failing test does not print it again).
pub fn find(what: &str, text: &str, secrets: &[String]) -> Vec<String> {
    let mut hits = Vec::new();
    for secret in secrets {
        for form in forms(secret) {
            for (number, line) in text.lines().enumerate() {
                if line.contains(&form) {
                    hits.push(format!(
                        "{what} line {}: {}",
                        number + 1,
                        line.replace(&form, "<SECRET>")
                    ));
                }
            }
        }
    }
    hits
}

/// [`find`] in an object's JSON (an Event, a PV, …).
pub fn find_in<T: serde::Serialize>(what: &str, object: &T, secrets: &[String]) -> Vec<String> {
    match serde_json::to_string(object) {
        Ok(text) => find(what, &text, secrets),
        Err(err) => vec![format!("{what}: cannot be rendered as JSON: {err}")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_distinct_and_well_formed() {
        let a = distinctive_secret();
        let b = distinctive_secret();
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }

    #[test]
    fn finds_plain_and_base64_forms() {
        let secret = "hunter2hunter2hunter2hunter2abcd".to_string();
        let text = format!(
            "a clean line\nrequest secrets={secret}\ndata: {}\n",
            STANDARD.encode(&secret)
        );
        let hits = find("log", &text, std::slice::from_ref(&secret));
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert_eq!(hits[0], "log line 2: request secrets=<SECRET>");
        assert!(hits.iter().all(|h| !h.contains(&secret)));
        assert!(find("log", "a clean line", &[secret]).is_empty());
    }
}
