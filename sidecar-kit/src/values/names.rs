//! Names as upstream builds and checks them: templates with `${...}` variables, RFC 1123 names,
//! and the short hash that keeps derived names unique and stable.

use std::collections::{BTreeMap, BTreeSet};

/// FNV-1a (32 bit) as eight hex digits.
pub fn fnv32a(s: &str) -> String {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in s.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    format!("{hash:08x}")
}

/// `<prefix>-<uid>` (`length` < 0), or `<prefix>-` and the first `length` characters of the UID
/// without its dashes: how upstream names the volumes and snapshots it asks drivers for.
pub fn uid_name(prefix: &str, uid: &str, length: i32) -> String {
    if length < 0 {
        return format!("{prefix}-{uid}");
    }
    let cut: String = uid
        .chars()
        .filter(|c| *c != '-')
        .take(length as usize)
        .collect();
    format!("{prefix}-{cut}")
}

/// Expands `${var}` and `$var` as Go's `os.Expand` does; every unknown variable is an error
/// listing them all, sorted, as upstream's `invalid tokens: ["a" "b"]`.
pub fn resolve_template(
    template: &str,
    params: &BTreeMap<String, String>,
) -> Result<String, String> {
    let mut out = String::new();
    let mut missing = BTreeSet::new();
    let mut lookup = |name: &str, out: &mut String| match params.get(name) {
        Some(value) => out.push_str(value),
        None => {
            missing.insert(name.to_string());
        }
    };
    let bytes = template.as_bytes();
    let mut i = 0;
    let mut start = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' || i + 1 >= bytes.len() {
            i += 1;
            continue;
        }
        out.push_str(&template[start..i]);
        let rest = &template[i + 1..];
        let (name, consumed) = shell_name(rest);
        match name {
            // A bad `${...}` is dropped, as os.Expand drops it.
            ShellName::Bad => {}
            ShellName::Empty => out.push('$'),
            ShellName::Name(name) => lookup(name, &mut out),
        }
        i += 1 + consumed;
        start = i;
    }
    out.push_str(&template[start..]);
    if missing.is_empty() {
        Ok(out)
    } else {
        let list: Vec<String> = missing.iter().map(|m| format!("{m:?}")).collect();
        Err(format!("invalid tokens: [{}]", list.join(" ")))
    }
}

enum ShellName<'a> {
    Name(&'a str),
    /// `$` followed by nothing usable: kept as `$` when it consumed nothing.
    Empty,
    Bad,
}

/// The variable name after a `$` and how many bytes it takes, following os.Expand's
/// `getShellName`.
fn shell_name(s: &str) -> (ShellName<'_>, usize) {
    let bytes = s.as_bytes();
    if bytes[0] == b'{' {
        if bytes.len() > 2 && is_special(bytes[1]) && bytes[2] == b'}' {
            return (ShellName::Name(&s[1..2]), 3);
        }
        for (i, &b) in bytes.iter().enumerate().skip(1) {
            if b == b'}' {
                if i == 1 {
                    return (ShellName::Bad, 2);
                }
                return (ShellName::Name(&s[1..i]), i + 1);
            }
        }
        return (ShellName::Bad, 1);
    }
    if is_special(bytes[0]) {
        return (ShellName::Name(&s[0..1]), 1);
    }
    let len = bytes
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    if len == 0 {
        (ShellName::Empty, 0)
    } else {
        (ShellName::Name(&s[..len]), len)
    }
}

fn is_special(b: u8) -> bool {
    matches!(
        b,
        b'*' | b'#' | b'$' | b'@' | b'!' | b'?' | b'-' | b'0'..=b'9'
    )
}

/// A secret's place, resolved from a class's templates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretName {
    pub namespace: String,
    pub name: String,
}

/// The template keys of one secret in a class's parameters.
#[derive(Clone, Copy, Debug)]
pub struct SecretKeys<'a> {
    /// How upstream's messages name the secret: "SnapshotterList".
    pub what: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
}

/// The secret a class's pair of template keys names, as upstream's `GetSecretReference`
/// resolves it: both keys or neither, each non-empty; the namespace template expanded with
/// `namespace_vars`, the name template with `name_vars`, each result a valid name.
pub fn class_secret(
    params: &BTreeMap<String, String>,
    keys: SecretKeys<'_>,
    namespace_vars: &BTreeMap<String, String>,
    name_vars: &BTreeMap<String, String>,
) -> Result<Option<SecretName>, String> {
    let what = keys.what;
    let (name_template, namespace_template) = match (
        params.get(keys.name),
        params.get(keys.namespace),
    ) {
        (None, None) => return Ok(None),
        (Some(n), Some(ns)) if !n.is_empty() && !ns.is_empty() => (n, ns),
        (Some(_), Some(_)) => {
            return Err(format!(
                "failed to get name and namespace template from params: {what} secrets specified in parameters but value of either namespace or name is empty"
            ));
        }
        _ => {
            return Err(format!(
                "failed to get name and namespace template from params: either name and namespace for {what} secrets specified, Both must be specified"
            ));
        }
    };
    let namespace = resolve_template(namespace_template, namespace_vars)
        .map_err(|e| format!("error resolving value {namespace_template:?}: {e}"))?;
    if !is_dns1123_label(&namespace) {
        return Err(if &namespace != namespace_template {
            format!(
                "{namespace_template:?} resolved to {namespace:?} which is not a valid namespace name"
            )
        } else {
            format!("{namespace_template:?} is not a valid namespace name")
        });
    }
    let name = resolve_template(name_template, name_vars)
        .map_err(|e| format!("error resolving value {name_template:?}: {e}"))?;
    if !is_dns1123_subdomain(&name) {
        return Err(if &name != name_template {
            format!("{name_template:?} resolved to {name:?} which is not a valid secret name")
        } else {
            format!("{name_template:?} is not a valid secret name")
        });
    }
    Ok(Some(SecretName { namespace, name }))
}

/// RFC 1123 label: at most 63 lowercase alphanumerics or `-`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn uid_names() {
        let uid = "0d6c2b8e-9f1a-4c3b-8e2d-1a2b3c4d5e6f";
        assert_eq!(uid_name("pvc", uid, -1), format!("pvc-{uid}"));
        assert_eq!(uid_name("snapshot", uid, 8), "snapshot-0d6c2b8e");
        assert_eq!(uid_name("s", uid, 12), "s-0d6c2b8e9f1a");
    }

    #[test]
    fn templates_expand_as_os_expand() {
        let p = params(&[("a", "1"), ("pv.name", "v")]);
        assert_eq!(resolve_template("x-${a}-$a", &p), Ok("x-1-1".into()));
        assert_eq!(resolve_template("${pv.name}", &p), Ok("v".into()));
        assert_eq!(resolve_template("cost$", &p), Ok("cost$".into()));
        assert_eq!(
            resolve_template("a$-b", &p).unwrap_err(),
            "invalid tokens: [\"-\"]"
        );
        assert_eq!(
            resolve_template("${z}${y}", &p).unwrap_err(),
            "invalid tokens: [\"y\" \"z\"]"
        );
        assert_eq!(resolve_template("x${}y", &p), Ok("xy".into()));
        assert_eq!(resolve_template("$ x", &p), Ok("$ x".into()));
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("kube-system"));
        assert!(!is_dns1123_label("Kube"));
        assert!(!is_dns1123_label("-a"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("my.secret-1"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(""));
    }
}
