//! Kubernetes' name rules, as the fuzz targets check resolved secret references against them.

/// An RFC 1123 label as Kubernetes checks namespaces: at most 63 characters.
pub fn label_ok(s: &str) -> bool {
    s.len() <= 63 && subdomain_part_ok(s)
}

/// An RFC 1123 subdomain as Kubernetes checks object names (secrets among them).
pub fn subdomain_ok(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(subdomain_part_ok)
}

/// One dot-separated part of an RFC 1123 subdomain, as Kubernetes checks object names:
/// no length limit of its own, only the name's 253.
fn subdomain_part_ok(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
