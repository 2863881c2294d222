//! Label and field selectors, parsed from their query-string form and matched
//! against JSON objects.

use serde_json::Value;

use super::registry::Kind;

/// A parse failure; the HTTP edge turns it into `400 BadRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
    Gt(i64),
    Lt(i64),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<(String, LabelOp)>,
}

impl LabelSelector {
    /// Parses the `labelSelector` syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
    /// `a notin (x)`, `a`, `!a`, `a>1`, `a<1`, comma-separated.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_top_level(input) {
            let term = term.trim();
            if term.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(SelectorError(format!(
                    "unable to parse requirement: empty term in {input:?}"
                )));
            }
            reqs.push(parse_requirement(term)?);
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|(key, op)| match op {
            LabelOp::Eq(v) => get(key) == Some(v.as_str()),
            LabelOp::NotEq(v) => get(key) != Some(v.as_str()),
            LabelOp::In(vs) => get(key).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelOp::NotIn(vs) => get(key).is_none_or(|l| vs.iter().all(|v| v != l)),
            LabelOp::Exists => get(key).is_some(),
            LabelOp::NotExists => get(key).is_none(),
            LabelOp::Gt(n) => get(key)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l > *n),
            LabelOp::Lt(n) => get(key)
                .and_then(|l| l.parse::<i64>().ok())
                .is_some_and(|l| l < *n),
        })
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&input[start..]);
    out
}

fn parse_requirement(term: &str) -> Result<(String, LabelOp), SelectorError> {
    let err = |why: &str| SelectorError(format!("unable to parse requirement: {why}: {term:?}"));
    if let Some(key) = term.strip_prefix('!') {
        let key = key.trim();
        validate_label_key(key).map_err(|e| err(&e))?;
        return Ok((key.to_string(), LabelOp::NotExists));
    }
    let key_end = term
        .find(|c: char| c.is_whitespace() || matches!(c, '=' | '!' | '<' | '>' | '('))
        .unwrap_or(term.len());
    let key = &term[..key_end];
    validate_label_key(key).map_err(|e| err(&e))?;
    let rest = term[key_end..].trim_start();
    let op = if rest.is_empty() {
        LabelOp::Exists
    } else if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        LabelOp::Eq(value(v).map_err(|e| err(&e))?)
    } else if let Some(v) = rest.strip_prefix("!=") {
        LabelOp::NotEq(value(v).map_err(|e| err(&e))?)
    } else if let Some(v) = rest.strip_prefix('>') {
        LabelOp::Gt(
            v.trim()
                .parse()
                .map_err(|_| err("for 'gt', 'lt' operators, the value must be an integer"))?,
        )
    } else if let Some(v) = rest.strip_prefix('<') {
        LabelOp::Lt(
            v.trim()
                .parse()
                .map_err(|_| err("for 'gt', 'lt' operators, the value must be an integer"))?,
        )
    } else if let Some(v) = rest.strip_prefix("notin") {
        LabelOp::NotIn(value_set(v).map_err(|e| err(&e))?)
    } else if let Some(v) = rest.strip_prefix("in") {
        LabelOp::In(value_set(v).map_err(|e| err(&e))?)
    } else {
        return Err(err("unknown operator"));
    };
    Ok((key.to_string(), op))
}

fn value(v: &str) -> Result<String, String> {
    let v = v.trim();
    validate_label_value(v)?;
    Ok(v.to_string())
}

fn value_set(v: &str) -> Result<Vec<String>, String> {
    let inner = v
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or("expected a parenthesised value set")?;
    let vals: Vec<String> = inner.split(',').map(value).collect::<Result<_, _>>()?;
    if vals.iter().all(String::is_empty) && vals.len() == 1 {
        return Err("for 'in', 'notin' operators, values set can't be empty".into());
    }
    Ok(vals)
}

fn is_name_part(s: &str, max: usize) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Validates a qualified name (`prefix/name` or `name`) as used for label keys.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return Err(format!("prefix part of {key:?} must be a DNS subdomain"));
    }
    if !is_name_part(name, 63) {
        return Err(format!(
            "name part of {key:?} must consist of alphanumeric characters, '-', '_' or '.', start and end with an alphanumeric character, and be at most 63 characters"
        ));
    }
    Ok(())
}

fn validate_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || is_name_part(v, 63) {
        Ok(())
    } else {
        Err(format!(
            "invalid label value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        ))
    }
}

/// RFC 1123 label: lower-case alphanumerics and `-`, at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || *c == b'-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    field: String,
    value: String,
    negated: bool,
}

/// A parsed field selector, validated against the fields a kind supports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<FieldReq>,
}

impl FieldSelector {
    /// Parses `a=b,c!=d` and rejects fields the real server does not index for `kind`.
    pub fn parse(input: &str, kind: &Kind) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for term in split_unescaped(input, ',') {
            if term.is_empty() {
                continue;
            }
            let (field, value, negated) = if let Some((f, v)) = split_op(&term, "!=") {
                (f, v, true)
            } else if let Some((f, v)) = split_op(&term, "==") {
                (f, v, false)
            } else if let Some((f, v)) = split_op(&term, "=") {
                (f, v, false)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                )));
            };
            let field = field.trim().to_string();
            if !supports_field(kind, &field) {
                return Err(SelectorError(if kind.custom {
                    format!(
                        "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    )
                } else {
                    format!("field label not supported: {field}")
                }));
            }
            reqs.push(FieldReq {
                field,
                value: unescape(&value),
                negated,
            });
        }
        Ok(Self { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// The `metadata.name=X` value, if the selector pins a single name.
    pub fn pinned_name(&self) -> Option<&str> {
        self.reqs
            .iter()
            .find(|r| !r.negated && r.field == "metadata.name")
            .map(|r| r.value.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs
            .iter()
            .all(|r| (field_value(obj, &r.field) == r.value) != r.negated)
    }
}

fn supports_field(kind: &Kind, field: &str) -> bool {
    field == "metadata.name"
        || field == "metadata.namespace"
        || kind.field_selectors.contains(&field)
}

/// The string a field selector compares against: missing fields read as "".
fn field_value(obj: &Value, field: &str) -> String {
    // The core Event's `source` selector means the reporting component.
    let path = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut cur = obj;
    for part in path.split('.') {
        match cur.get(part) {
            Some(v) => cur = v,
            None => return String::new(),
        }
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn split_op(term: &str, op: &str) -> Option<(String, String)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        if term[i..].starts_with(op) {
            // `!=` must not be read as `=` preceded by a field ending in `!`.
            if op == "=" && (term[..i].ends_with('!') || term[i + 1..].starts_with('=')) {
                return None;
            }
            return Some((term[..i].to_string(), term[i + op.len()..].to_string()));
        }
    }
    None
}

fn split_unescaped(input: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in input.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

fn unescape(v: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in v.chars() {
        if escaped || c != '\\' {
            out.push(c);
            escaped = false;
        } else {
            escaped = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"attacher": "x", "nodeName": "n1"}, "type": "Opaque"})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "3"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m(""));
        assert!(m("app=web") && m("app==web") && !m("app=db"));
        assert!(m("app!=db") && !m("app!=web") && m("missing!=x"));
        assert!(m("app in (db, web)") && !m("app in (db)") && !m("missing in (x)"));
        assert!(m("app notin (db)") && !m("app notin (web,db)") && m("missing notin (x)"));
        assert!(m("app") && !m("missing") && m("!missing") && !m("!app"));
        assert!(m("tier>2") && !m("tier>3") && m("tier<4"));
        assert!(m("app=web,tier in (3),!gone"));
        assert!(!m("app=web,tier=4"));
        assert!(m("example.com/x notin (y)"));
    }

    #[test]
    fn label_syntax_errors() {
        for bad in [
            "app=(",
            "a b",
            "app in web",
            "-bad=x",
            "app=a b",
            "app in ()",
            "tier>x",
            ",",
        ] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn field_selectors_are_validated_per_kind() {
        let r = Registry::builtin();
        let secret = r.get(r.core("secrets").unwrap());
        let va = r.get(
            r.lookup("storage.k8s.io", "v1", "volumeattachments")
                .unwrap(),
        );
        let pod = r.get(r.core("pods").unwrap());
        let o = obj(json!({}));
        let m = |s: &str, k: &Kind| FieldSelector::parse(s, k).unwrap().matches(&o);
        assert!(m("metadata.name=a", secret) && !m("metadata.name!=a", secret));
        assert!(m("metadata.namespace==ns,type=Opaque", secret));
        assert!(m("spec.nodeName=n1", pod) && !m("spec.nodeName=n2", pod));
        assert!(m("status.phase=", pod), "missing fields compare as empty");
        let err = FieldSelector::parse("spec.attacher=x", va).unwrap_err();
        assert_eq!(err.0, "field label not supported: spec.attacher");
        assert!(FieldSelector::parse("spec.nodeName=n1", secret).is_err());
        assert!(FieldSelector::parse("nonsense", secret).is_err());
    }

    #[test]
    fn field_selector_escapes_and_pins() {
        let r = Registry::builtin();
        let secret = r.get(r.core("secrets").unwrap());
        let s = FieldSelector::parse(r"metadata.name=a\,b", secret).unwrap();
        assert_eq!(s.pinned_name(), Some("a,b"));
        assert!(s.matches(&json!({"metadata": {"name": "a,b"}})));
    }

    #[test]
    fn dns_names() {
        assert!(is_dns_subdomain("pvc-1.example") && !is_dns_subdomain("#%123-invalid-name"));
        assert!(is_dns_label("ns-1") && !is_dns_label("ns.1") && !is_dns_label("Ns"));
    }
}
