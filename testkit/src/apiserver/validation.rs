//! Field validation as kube-apiserver does it for the kinds the sidecars
//! write: every failing field becomes one cause of a `422 Invalid` Status,
//! worded as apimachinery's `field.Error` (`<field>: <type>: <value>: <detail>`).
//!
//! The rules follow, per kind, the registry strategy's `Validate` /
//! `ValidateUpdate` in the Kubernetes source: `pkg/apis/core/validation`
//! (`ValidatePersistentVolumeClaim*`, `ValidatePersistentVolume*`,
//! `ValidateEventCreate/Update`), `pkg/apis/storage/validation`
//! (`ValidateVolumeAttachment*`, `ValidateStorageClassUpdate`,
//! `ValidateVolumeAttributesClassUpdate`) and apimachinery's object-meta
//! checks. Causes are listed in the order upstream appends them, repeats
//! included (several upstream validators run twice on an update).

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::gates::{FeatureGates, Gate};
use super::quantity::{self, Quantity};
use super::registry::{Kind, NameRule};

/// apimachinery's `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
    Duplicate,
}

impl ErrorType {
    /// The `reason` of the Status cause.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
            ErrorType::Duplicate => "FieldValueDuplicate",
        }
    }

    fn text(self) -> &'static str {
        match self {
            ErrorType::Required => "Required value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
            ErrorType::Duplicate => "Duplicate value",
        }
    }
}

/// The offending value, rendered as Go renders `field.Error.BadValue`.
#[derive(Debug, Clone, PartialEq)]
pub enum BadValue {
    /// A Go string: `%q`.
    Str(String),
    /// A Go integer: `%v`.
    Int(i128),
    /// Anything else: its JSON.
    Json(String),
}

impl BadValue {
    fn render(&self) -> String {
        match self {
            BadValue::Str(s) => go_quote(s),
            BadValue::Int(i) => i.to_string(),
            BadValue::Json(j) => j.clone(),
        }
    }

    fn json(v: &Value) -> Self {
        BadValue::Json(go_json(v))
    }
}

/// One failing field.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    pub value: Option<BadValue>,
    pub detail: String,
}

impl FieldError {
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorType::Required,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorType::Forbidden,
            field: field.into(),
            value: None,
            detail: detail.into(),
        }
    }

    pub fn invalid(field: impl Into<String>, value: BadValue, detail: impl Into<String>) -> Self {
        Self {
            kind: ErrorType::Invalid,
            field: field.into(),
            value: Some(value),
            detail: detail.into(),
        }
    }

    pub fn not_supported(field: impl Into<String>, value: BadValue, supported: &[&str]) -> Self {
        let detail = if supported.is_empty() {
            String::new()
        } else {
            let quoted: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
            format!("supported values: {}", quoted.join(", "))
        };
        Self {
            kind: ErrorType::NotSupported,
            field: field.into(),
            value: Some(value),
            detail,
        }
    }

    pub fn too_long(field: impl Into<String>, max: usize) -> Self {
        let unit = if max == 1 { "byte" } else { "bytes" };
        Self {
            kind: ErrorType::TooLong,
            field: field.into(),
            value: None,
            detail: format!("may not be more than {max} {unit}"),
        }
    }

    /// The cause message: the error without the field name.
    pub fn body(&self) -> String {
        let mut s = self.kind.text().to_string();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(&v.render());
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.body())
    }
}

/// Go's `%q` of a string (close enough for the values met here: printable
/// characters as they are, the usual escapes otherwise).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// JSON as Go's encoder writes it: compact, map keys sorted (serde_json's
/// map is ordered by key already).
fn go_json(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// `422 Invalid` with one cause per error; the message lists the distinct
/// errors as apimachinery's aggregate does.
pub fn invalid(kind: &Kind, name: &str, errs: &[FieldError]) -> ApiError {
    ApiError::invalid_causes(
        kind,
        name,
        &errs
            .iter()
            .map(|e| (e.kind.reason(), e.body(), e.field.clone()))
            .collect::<Vec<_>>(),
    )
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

fn str_or_empty<'a>(v: &'a Value, pointer: &str) -> &'a str {
    str_at(v, pointer).unwrap_or("")
}

fn present(v: &Value, pointer: &str) -> bool {
    v.pointer(pointer).is_some_and(|x| !x.is_null())
}

fn array<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn object<'a>(v: &'a Value, pointer: &str) -> Option<&'a Map<String, Value>> {
    v.pointer(pointer).and_then(Value::as_object)
}

/// Drops JSON nulls and empty lists and maps, which Go's semantic equality
/// treats like absent fields.
fn semantic(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter_map(|(k, x)| {
                    let x = semantic(x);
                    let empty = x.is_null()
                        || x.as_array().is_some_and(Vec::is_empty)
                        || x.as_object().is_some_and(Map::is_empty);
                    (!empty).then(|| (k.clone(), x))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(semantic).collect()),
        other => other.clone(),
    }
}

/// A short rendering of what differs between two JSON values, one line per
/// changed leaf (upstream prints a Go struct diff here).
fn json_diff(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                json_diff(&format!("{path}.{k}"), x, y, out);
            }
        }
        (a, b) if a != b => {
            if !a.is_null() {
                out.push(format!("- {path}: {}", go_json(a)));
            }
            if !b.is_null() {
                out.push(format!("+ {path}: {}", go_json(b)));
            }
        }
        _ => {}
    }
}

fn diff_text(path: &str, old: &Value, new: &Value) -> String {
    let mut lines = Vec::new();
    json_diff(path, &semantic(old), &semantic(new), &mut lines);
    lines.join("\n")
}

// ---------------------------------------------------------------------------
// Names (apimachinery/pkg/util/validation)

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

fn subdomain_pattern(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || *c == b'-')
                && !b.iter().any(u8::is_ascii_uppercase)
        })
}

/// `IsDNS1123Subdomain`.
pub fn dns1123_subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".into());
    }
    if !subdomain_pattern(s) {
        errs.push(DNS1123_SUBDOMAIN_MSG.into());
    }
    errs
}

/// `IsDNS1123Label`.
pub fn dns1123_label_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".into());
    }
    let b = s.as_bytes();
    let pattern = !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_digit() || c.is_ascii_lowercase() || *c == b'-');
    if !pattern {
        if subdomain_pattern(s) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(DNS1123_LABEL_MSG.into());
        }
    }
    errs
}

fn qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// `IsQualifiedName`.
pub fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".into());
            } else {
                for m in dns1123_subdomain_errors(prefix) {
                    errs.push(format!("prefix part {m}"));
                }
            }
            name
        }
        _ => {
            errs.push(format!("a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".into());
    }
    if !qualified_name_part(name) {
        errs.push(format!("name part {QUALIFIED_NAME_MSG}"));
    }
    errs
}

/// `IsValidLabelValue`.
pub fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".into());
    }
    if !s.is_empty() && !qualified_name_part(s) {
        errs.push(LABEL_VALUE_MSG.into());
    }
    errs
}

fn invalid_each(field: &str, value: &str, msgs: Vec<String>) -> Vec<FieldError> {
    msgs.into_iter()
        .map(|m| FieldError::invalid(field, BadValue::Str(value.to_string()), m))
        .collect()
}

// ---------------------------------------------------------------------------
// Object metadata

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn finalizers(obj: &Value) -> Vec<&str> {
    array(obj, "/metadata/finalizers")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

fn name_rule_errors(rule: NameRule, name: &str) -> Vec<String> {
    match rule {
        NameRule::Subdomain => dns1123_subdomain_errors(name),
        NameRule::Label => dns1123_label_errors(name),
        NameRule::PathSegment if name == "." || name == ".." => {
            vec![format!("may not be '{name}'")]
        }
        NameRule::PathSegment if name.contains('/') => vec!["may not contain '/'".into()],
        NameRule::PathSegment if name.contains('%') => vec!["may not contain '%'".into()],
        NameRule::PathSegment => Vec::new(),
    }
}

/// The parts of `ValidateObjectMeta` the server enforces: the name by the
/// kind's rule, labels, finalizer names.
pub fn object_meta(k: &Kind, obj: &Value, rule: NameRule) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = meta_str(obj, "name");
    if name.is_empty() {
        errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        ));
    } else {
        errs.extend(invalid_each(
            "metadata.name",
            name,
            name_rule_errors(rule, name),
        ));
    }
    errs.extend(labels(obj));
    for f in finalizers(obj) {
        errs.extend(invalid_each(
            "metadata.finalizers",
            f,
            qualified_name_errors(f),
        ));
    }
    if k.group.is_empty() {
        errs.extend(kube_finalizer_names(obj));
    }
    errs
}

/// Core kinds only: an unprefixed finalizer must be a standard one.
fn kube_finalizer_names(obj: &Value) -> Vec<FieldError> {
    finalizers(obj)
        .into_iter()
        .enumerate()
        .filter(|(_, f)| {
            !f.contains('/') && !matches!(*f, "kubernetes" | "orphan" | "foregroundDeletion")
        })
        .map(|(i, f)| {
            FieldError::invalid(
                format!("metadata.finalizers[{i}]"),
                BadValue::Str(f.into()),
                "name is neither a standard finalizer name nor is it fully qualified",
            )
        })
        .collect()
}

fn labels(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(labels) = object(obj, "/metadata/labels") {
        for (key, v) in labels {
            errs.extend(invalid_each(
                "metadata.labels",
                key,
                qualified_name_errors(key),
            ));
            let value = v.as_str().unwrap_or("");
            errs.extend(invalid_each(
                "metadata.labels",
                value,
                label_value_errors(value),
            ));
        }
    }
    errs
}

/// `ValidateObjectMetaAccessorUpdate`: no new finalizers on an object being
/// deleted, labels.
pub fn object_meta_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if present(old, "/metadata/deletionTimestamp") {
        let before = finalizers(old);
        let added: BTreeSet<&str> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let list: Vec<String> = added.iter().map(|f| go_quote(f)).collect();
            errs.push(FieldError::forbidden(
                "metadata.finalizers",
                format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    list.join(", ")
                ),
            ));
        }
    }
    errs.extend(labels(new));
    errs
}

/// The common checks every update gets before the kind's own
/// (`rest.BeforeUpdate`'s `validateCommonFields`).
fn common_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = labels(new);
    errs.extend(object_meta_update(new, old));
    errs
}

// ---------------------------------------------------------------------------
// Quantities: decoding (400) and value checks (422)

/// The quantity fields of the kinds whose decoding the server would fail on.
fn quantity_maps(k: &Kind) -> &'static [&'static str] {
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") => &[
            "/spec/resources/requests",
            "/spec/resources/limits",
            "/status/capacity",
            "/status/allocatedResources",
        ],
        ("", "PersistentVolume") => &["/spec/capacity"],
        _ => &[],
    }
}

fn quantity_fields(k: &Kind) -> &'static [&'static str] {
    match (k.group, k.kind) {
        ("storage.k8s.io", "CSIStorageCapacity") => &["/capacity", "/maximumVolumeSize"],
        _ => &[],
    }
}

/// Decodes every quantity of the object as kube-apiserver's conversion does (400 when one does
/// not parse) and stores it in Go's canonical form, as the real server writes it back: `1024Mi`
/// becomes `1Gi`, and a value beyond what int64 holds the largest int64.
pub fn canonicalize_quantities(k: &Kind, obj: &mut Value) -> Result<(), ApiError> {
    let fail = |e: quantity::QuantityError| {
        ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {e}",
            kind = k.kind,
            version = k.version
        ))
    };
    let canonical = |v: &mut Value| -> Result<(), ApiError> {
        if let Some(parsed) = quantity::from_json(v) {
            *v = Value::String(parsed.map_err(fail)?.canonical());
        }
        Ok(())
    };
    for map in quantity_maps(k) {
        if let Some(Value::Object(m)) = obj.pointer_mut(map) {
            for v in m.values_mut() {
                canonical(v)?;
            }
        }
    }
    for f in quantity_fields(k) {
        if let Some(v) = obj.pointer_mut(f) {
            canonical(v)?;
        }
    }
    Ok(())
}

/// Maps and lists the typed API drops when they are empty (`omitempty`): the real server keeps
/// no `{}` or `[]` there, so a patch that removes the last entry removes the field.
fn omitempty_collections(k: &Kind) -> &'static [&'static str] {
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") => &[
            "/metadata/annotations",
            "/metadata/labels",
            "/metadata/finalizers",
            "/status/conditions",
            "/status/capacity",
            "/status/allocatedResources",
            "/status/allocatedResourceStatuses",
            "/status/accessModes",
        ],
        _ => &[],
    }
}

/// Removes the empty `omitempty` collections of a typed object (see [`omitempty_collections`]).
pub fn drop_empty_collections(k: &Kind, obj: &mut Value) {
    for pointer in omitempty_collections(k) {
        let Some((parent, field)) = pointer.rsplit_once('/') else {
            continue;
        };
        let empty = obj.pointer(pointer).is_some_and(|v| {
            v.as_object().is_some_and(|m| m.is_empty())
                || v.as_array().is_some_and(|a| a.is_empty())
        });
        if empty && let Some(Value::Object(m)) = obj.pointer_mut(parent) {
            m.remove(field);
        }
    }
}

/// Keys whose values are `metav1.Time` or `metav1.MicroTime` in the typed API (wherever they
/// appear in an object: metadata, conditions, statuses, events, leases).
const TIME_KEYS: [&str; 16] = [
    "creationTimestamp",
    "deletionTimestamp",
    "lastTransitionTime",
    "lastProbeTime",
    "lastHeartbeatTime",
    "lastUpdateTime",
    "lastPhaseTransitionTime",
    "firstTimestamp",
    "lastTimestamp",
    "eventTime",
    "lastObservedTime",
    "acquireTime",
    "renewTime",
    "startTime",
    "startedAt",
    "finishedAt",
];

/// Refuses a time that kube-apiserver cannot decode (Go's `time.Parse` with RFC 3339): an empty
/// string included, which the typed API never stores.
pub fn check_times(k: &Kind, obj: &Value) -> Result<(), ApiError> {
    fn walk(v: &Value, path: &str, bad: &mut Option<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (key, value) in m {
                    let here = format!("{path}.{key}");
                    if TIME_KEYS.contains(&key.as_str())
                        && let Value::String(text) = value
                        && text.parse::<k8s_openapi::jiff::Timestamp>().is_err()
                    {
                        bad.get_or_insert((here.clone(), text.clone()));
                    }
                    walk(value, &here, bad);
                }
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}[{i}]"), bad);
                }
            }
            _ => {}
        }
    }
    if !k.group.is_empty() && !k.group.ends_with(".k8s.io") {
        // Custom resources keep what their schema allows.
        return Ok(());
    }
    let mut bad = None;
    walk(obj, "", &mut bad);
    match bad {
        Some((field, text)) => Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {kind}: {field}: parsing time {text:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse {text:?} as \"2006\"",
            kind = k.kind,
            version = k.version,
            field = field.trim_start_matches('.'),
        ))),
        None => Ok(()),
    }
}

fn quantity_at(v: &Value, pointer: &str) -> Option<Quantity> {
    v.pointer(pointer)
        .and_then(quantity::from_json)
        .and_then(Result::ok)
}

fn positive_quantity(field: &str, q: &Quantity) -> Vec<FieldError> {
    if q.signum() <= 0 {
        vec![FieldError::invalid(
            field,
            BadValue::Str(q.canonical()),
            "must be greater than zero",
        )]
    } else {
        Vec::new()
    }
}

fn basic_resource(field: &str, q: &Quantity) -> Vec<FieldError> {
    if q.value() < 0 {
        vec![FieldError::invalid(
            field,
            BadValue::Int(q.value()),
            "must be a valid resource quantity",
        )]
    } else {
        Vec::new()
    }
}

// ---------------------------------------------------------------------------
// PersistentVolumeClaim

const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

fn access_modes(spec: &Value, field: &str, required_detail: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let modes = array(spec, "/accessModes");
    if modes.is_empty() {
        errs.push(FieldError::required(field, required_detail));
    }
    let (mut rwop, mut other) = (false, false);
    for m in modes {
        let s = m.as_str().unwrap_or("");
        if !ACCESS_MODES.contains(&s) {
            errs.push(FieldError::not_supported(
                field,
                BadValue::Str(s.into()),
                ACCESS_MODES,
            ));
        } else if s == "ReadWriteOncePod" {
            rwop = true;
        } else {
            other = true;
        }
    }
    if rwop && other {
        errs.push(FieldError::forbidden(
            field,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
    errs
}

fn class_name(field: &str, name: &str) -> Vec<FieldError> {
    invalid_each(field, name, dns1123_subdomain_errors(name))
}

fn data_source(src: &Value, field: &str, allow_invalid_group: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if str_or_empty(src, "/name").is_empty() {
        errs.push(FieldError::required(format!("{field}.name"), ""));
    }
    let kind = str_or_empty(src, "/kind");
    if kind.is_empty() {
        errs.push(FieldError::required(format!("{field}.kind"), ""));
    }
    let group = str_or_empty(src, "/apiGroup");
    if group.is_empty() && kind != "PersistentVolumeClaim" {
        errs.push(FieldError::invalid(
            field,
            BadValue::Str(kind.into()),
            "must be 'PersistentVolumeClaim' when referencing the default apiGroup",
        ));
    }
    if !group.is_empty() && !allow_invalid_group {
        errs.extend(invalid_each(
            &format!("{field}.apiGroup"),
            group,
            dns1123_subdomain_errors(group),
        ));
    }
    errs
}

#[derive(Debug, Clone, Copy)]
struct ClaimOptions {
    allow_invalid_group: bool,
    volume_attributes_class: bool,
}

fn claim_options(gates: &FeatureGates, old: Option<&Value>) -> ClaimOptions {
    let mut o = ClaimOptions {
        allow_invalid_group: false,
        volume_attributes_class: gates.enabled(Gate::VolumeAttributesClass),
    };
    if let Some(old) = old {
        o.allow_invalid_group = present(old, "/spec/dataSource/apiGroup")
            || present(old, "/spec/dataSourceRef/apiGroup");
        if present(old, "/spec/volumeAttributesClassName") {
            o.volume_attributes_class = true;
        }
    }
    o
}

/// `ValidatePersistentVolumeClaimSpec`.
fn claim_spec(spec: &Value, opts: ClaimOptions) -> Vec<FieldError> {
    let mut errs = access_modes(
        spec,
        "spec.accessModes",
        "at least 1 access mode is required",
    );
    if let Some(sel) = spec.get("selector").filter(|s| !s.is_null()) {
        errs.extend(label_selector(sel, "spec.selector"));
    }
    let storage_field = "spec.resources[storage]";
    match spec.pointer("/resources/requests/storage") {
        None | Some(Value::Null) => errs.push(FieldError::required(storage_field, "")),
        Some(v) => {
            if let Some(Ok(q)) = quantity::from_json(v) {
                errs.extend(positive_quantity(storage_field, &q));
            }
        }
    }
    if let Some(class) = str_at(spec, "/storageClassName").filter(|c| !c.is_empty()) {
        errs.extend(class_name("spec.storageClassName", class));
    }
    if let Some(mode) = str_at(spec, "/volumeMode")
        && !VOLUME_MODES.contains(&mode)
    {
        errs.push(FieldError::not_supported(
            "spec.volumeMode",
            BadValue::Str(mode.into()),
            VOLUME_MODES,
        ));
    }
    let ds = spec.get("dataSource").filter(|v| v.is_object());
    let dsr = spec.get("dataSourceRef").filter(|v| v.is_object());
    if let Some(ds) = ds {
        errs.extend(data_source(ds, "spec.dataSource", opts.allow_invalid_group));
    }
    if let Some(dsr) = dsr {
        errs.extend(data_source(
            dsr,
            "spec.dataSourceRef",
            opts.allow_invalid_group,
        ));
        if let Some(ns) = str_at(dsr, "/namespace").filter(|n| !n.is_empty()) {
            errs.extend(invalid_each(
                "spec.dataSourceRef.namespace",
                ns,
                dns1123_label_errors(ns),
            ));
        }
    }
    // Upstream passes a field path as the value here, which renders as `{}`.
    let path_value = || BadValue::Json("{}".into());
    match (ds, dsr) {
        (Some(_), Some(r)) if !str_or_empty(r, "/namespace").is_empty() => {
            errs.push(FieldError::invalid(
                "spec",
                path_value(),
                "may not be specified when dataSourceRef.namespace is specified",
            ));
        }
        (Some(d), Some(r)) => {
            let same = d.get("apiGroup").filter(|g| !g.is_null())
                == r.get("apiGroup").filter(|g| !g.is_null())
                && d.get("kind") == r.get("kind")
                && d.get("name") == r.get("name");
            if !same {
                errs.push(FieldError::invalid(
                    "spec",
                    path_value(),
                    "must match dataSourceRef",
                ));
            }
        }
        _ => {}
    }
    if opts.volume_attributes_class
        && let Some(vac) = str_at(spec, "/volumeAttributesClassName").filter(|v| !v.is_empty())
    {
        errs.extend(class_name("spec.volumeAttributesClassName", vac));
    }
    errs
}

fn label_selector(sel: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (i, req) in array(sel, "/matchExpressions").iter().enumerate() {
        let path = format!("{field}.matchExpressions[{i}]");
        let op = str_or_empty(req, "/operator");
        let values = array(req, "/values");
        match op {
            "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
                format!("{path}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
                format!("{path}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => errs.push(FieldError::invalid(
                format!("{path}.operator"),
                BadValue::Str(other.into()),
                "not a valid selector operator",
            )),
        }
        let key = str_or_empty(req, "/key");
        errs.extend(invalid_each(
            &format!("{path}.key"),
            key,
            qualified_name_errors(key),
        ));
    }
    if let Some(m) = object(sel, "/matchLabels") {
        for (k, v) in m {
            errs.extend(invalid_each(
                &format!("{field}.matchLabels"),
                k,
                qualified_name_errors(k),
            ));
            let v = v.as_str().unwrap_or("");
            errs.extend(invalid_each(
                &format!("{field}.matchLabels"),
                v,
                label_value_errors(v),
            ));
        }
    }
    errs
}

/// `ValidatePersistentVolumeClaim`: metadata and spec.
fn claim(k: &Kind, obj: &Value, opts: ClaimOptions) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(claim_spec(obj.get("spec").unwrap_or(&Value::Null), opts));
    errs
}

/// The claim spec compared for immutability, quantities by value.
fn comparable_claim_spec(spec: &Value) -> Value {
    let mut s = semantic(spec);
    for map in ["requests", "limits"] {
        if let Some(Value::Object(m)) = s.pointer_mut(&format!("/resources/{map}")) {
            for v in m.values_mut() {
                if let Some(Ok(q)) = quantity::from_json(v) {
                    *v = json!(q.canonical());
                }
            }
        }
    }
    if let Value::Object(m) = &mut s
        && m.get("volumeName").and_then(Value::as_str) == Some("")
    {
        // A Go string, not a pointer: empty is the same as absent.
        m.remove("volumeName");
    }
    s
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    object(obj, "/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

/// `ValidatePersistentVolumeClaimUpdate`.
fn claim_update(
    k: &Kind,
    new: &Value,
    old: &Value,
    opts: ClaimOptions,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    errs.extend(claim(k, new, opts));
    let null = Value::Null;
    let new_spec = new.get("spec").unwrap_or(&null);
    let old_spec = old.get("spec").unwrap_or(&null);
    let mut new_clone = new_spec.clone();
    let mut old_clone = old_spec.clone();
    if !new_clone.is_object() {
        new_clone = json!({});
    }
    if !old_clone.is_object() {
        old_clone = json!({});
    }
    // The PV controller sets volumeName once.
    if str_or_empty(old_spec, "/volumeName").is_empty() {
        old_clone["volumeName"] = new_spec.get("volumeName").cloned().unwrap_or(Value::Null);
    }
    let old_ann = annotation(old, BETA_STORAGE_CLASS);
    let new_ann = annotation(new, BETA_STORAGE_CLASS);
    let old_sc = old_spec
        .get("storageClassName")
        .and_then(Value::as_str)
        .filter(|_| present(old_spec, "/storageClassName"));
    let new_sc = new_spec
        .get("storageClassName")
        .and_then(Value::as_str)
        .filter(|_| present(new_spec, "/storageClassName"));
    let upgrade_from_annotation = old_ann.is_some()
        && old_sc.is_none()
        && new_sc.is_some()
        && new_sc == old_ann
        && (new_ann.is_none() || new_ann == old_ann);
    if upgrade_from_annotation {
        new_clone["storageClassName"] = Value::Null;
    } else {
        if new_ann != old_ann {
            errs.push(FieldError::invalid(
                format!("metadata.annotations.{BETA_STORAGE_CLASS}"),
                BadValue::Str(new_ann.unwrap_or("").into()),
                "field is immutable",
            ));
        }
        if new_sc.is_some() && old_sc.is_none() && (old_ann.is_none() || new_sc == old_ann) {
            new_clone["storageClassName"] = old_clone
                .get("storageClassName")
                .cloned()
                .unwrap_or(Value::Null);
        }
    }
    let bound = str_or_empty(new, "/status/phase") == "Bound";
    if bound
        && new_clone
            .pointer("/resources/requests")
            .is_some_and(Value::is_object)
    {
        new_clone["resources"]["requests"]["storage"] = old_spec
            .pointer("/resources/requests/storage")
            .cloned()
            .unwrap_or(json!("0"));
    }
    if bound {
        new_clone["volumeAttributesClassName"] = old_clone
            .get("volumeAttributesClassName")
            .cloned()
            .unwrap_or(Value::Null);
    }
    let (a, b) = (
        comparable_claim_spec(&old_clone),
        comparable_claim_spec(&new_clone),
    );
    if a != b {
        errs.push(FieldError::forbidden(
            "spec",
            format!(
                "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n{}",
                diff_text("spec", &a, &b)
            ),
        ));
    }
    let zero = Quantity::parse("0").ok();
    let old_size = quantity_at(old_spec, "/resources/requests/storage").or(zero);
    let new_size = quantity_at(new_spec, "/resources/requests/storage").or(zero);
    let status_size = quantity_at(old, "/status/capacity/storage").or(zero);
    if new_size < old_size && new_size <= status_size {
        // RecoverVolumeExpansionFailure is locked on: shrinking is allowed down to status.capacity.
        errs.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    let new_mode = new_spec.get("volumeMode").filter(|v| !v.is_null());
    if new_mode != old_spec.get("volumeMode").filter(|v| !v.is_null()) {
        errs.push(FieldError::invalid(
            "volumeMode",
            BadValue::json(new_mode.unwrap_or(&Value::Null)),
            "field is immutable",
        ));
    }
    let new_vac = new_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    let old_vac = old_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    if new_vac != old_vac {
        if !gates.enabled(Gate::VolumeAttributesClass) {
            errs.push(FieldError::forbidden(
                "spec.volumeAttributesClassName",
                "update is forbidden when the VolumeAttributesClass feature gate is disabled",
            ));
        }
        if opts.volume_attributes_class && present(old, "/status/currentVolumeAttributesClassName")
        {
            match new_vac.and_then(Value::as_str) {
                None => errs.push(FieldError::forbidden(
                    "spec.volumeAttributesClassName",
                    "update to nil is forbidden when status.currentVolumeAttributesClassName is not nil",
                )),
                Some("") => errs.push(FieldError::forbidden(
                    "spec.volumeAttributesClassName",
                    "update to empty string is forbidden when status.currentVolumeAttributesClassName is not nil",
                )),
                Some(_) => {}
            }
        }
    }
    errs
}

const RESIZE_STATUSES: &[&str] = &[
    "ControllerResizeInProgress",
    "ControllerResizeInfeasible",
    "NodeResizeInProgress",
    "NodeResizeInfeasible",
    "NodeResizePending",
];

/// `ValidatePersistentVolumeClaimStatusUpdate` (the RecoverVolumeExpansionFailure
/// checks are always on: the gate is locked on in 1.34).
fn claim_status_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if array(new, "/spec/accessModes").is_empty() {
        errs.push(FieldError::required("Spec.accessModes", ""));
    }
    if let Some(cap) = object(new, "/status/capacity") {
        for (r, v) in cap {
            if let Some(Ok(q)) = quantity::from_json(v) {
                errs.extend(basic_resource(&format!("status.capacity[{r}]"), &q));
            }
        }
    }
    if let Some(statuses) = object(new, "/status/allocatedResourceStatuses") {
        for (r, v) in statuses {
            errs.extend(resource_key("status.allocatedResourceStatuses", r));
            if !RESIZE_STATUSES.contains(&v.as_str().unwrap_or("")) {
                errs.push(FieldError::not_supported(
                    "status.allocatedResourceStatuses",
                    BadValue::Str(r.clone()),
                    RESIZE_STATUSES,
                ));
            }
        }
    }
    if let Some(alloc) = object(new, "/status/allocatedResources") {
        for (r, v) in alloc {
            let key_errs = resource_key("status.allocatedResources", r);
            if !key_errs.is_empty() {
                errs.extend(key_errs);
                continue;
            }
            if let Some(Ok(q)) = quantity::from_json(v) {
                let field = format!("status.allocatedResources[{r}]");
                let basic = basic_resource(&field, &q);
                if basic.is_empty() && q.signum() < 0 {
                    errs.push(FieldError::invalid(
                        field,
                        BadValue::Str(q.canonical()),
                        "must be greater than or equal to 0",
                    ));
                }
                errs.extend(basic);
            }
        }
    }
    errs
}

fn resource_key(field: &str, key: &str) -> Vec<FieldError> {
    let errs = invalid_each(field, key, qualified_name_errors(key));
    if !errs.is_empty() {
        return errs;
    }
    let native = !key.contains('/') || key.starts_with("kubernetes.io/");
    if native && key != "storage" {
        return vec![FieldError::not_supported(
            field,
            BadValue::Str(key.into()),
            &["storage"],
        )];
    }
    Vec::new()
}

// ---------------------------------------------------------------------------
// PersistentVolume

/// The volume sources of a PV spec, in the order upstream checks them, with
/// the field name its "more than 1 volume type" error uses.
const PV_SOURCES: &[(&str, &str)] = &[
    ("hostPath", "hostPath"),
    ("gcePersistentDisk", "gcePersistentDisk"),
    ("awsElasticBlockStore", "awsElasticBlockStore"),
    ("glusterfs", "glusterfs"),
    ("flocker", "flocker"),
    ("nfs", "nfs"),
    ("rbd", "rbd"),
    ("quobyte", "quobyte"),
    ("cephfs", "cephFS"),
    ("iscsi", "iscsi"),
    ("cinder", "cinder"),
    ("fc", "fc"),
    ("flexVolume", "flexVolume"),
    ("azureFile", "azureFile"),
    ("vsphereVolume", "vsphereVolume"),
    ("photonPersistentDisk", "photonPersistentDisk"),
    ("portworxVolume", "portworxVolume"),
    ("azureDisk", "azureDisk"),
    ("scaleIO", "scaleIO"),
    ("local", "local"),
    ("storageos", "storageos"),
    ("csi", "csi"),
];

const RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];

fn no_backsteps(field: &str, path: &str) -> Vec<FieldError> {
    if path.split(['/', '\\']).any(|p| p == "..") {
        vec![FieldError::invalid(
            field,
            BadValue::Str(path.into()),
            "must not contain '..'",
        )]
    } else {
        Vec::new()
    }
}

fn csi_driver_name(field: &str, driver: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if driver.is_empty() {
        errs.push(FieldError::required(field, ""));
    }
    if driver.len() > 63 {
        errs.push(FieldError::too_long(field, 63));
    }
    errs.extend(invalid_each(
        field,
        driver,
        dns1123_subdomain_errors(&driver.to_lowercase()),
    ));
    errs
}

fn pv_secret_ref(field: &str, r: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let name = str_or_empty(r, "/name");
    if name.is_empty() {
        errs.push(FieldError::required(format!("{field}.name"), ""));
    } else {
        errs.extend(invalid_each(
            &format!("{field}.name"),
            name,
            dns1123_subdomain_errors(name),
        ));
    }
    let ns = str_or_empty(r, "/namespace");
    if ns.is_empty() {
        errs.push(FieldError::required(format!("{field}.namespace"), ""));
    } else {
        errs.extend(invalid_each(
            &format!("{field}.namespace"),
            ns,
            dns1123_label_errors(ns),
        ));
    }
    errs
}

fn csi_source(src: &Value, field: &str) -> Vec<FieldError> {
    let mut errs = csi_driver_name(&format!("{field}.driver"), str_or_empty(src, "/driver"));
    if str_or_empty(src, "/volumeHandle").is_empty() {
        errs.push(FieldError::required(format!("{field}.volumeHandle"), ""));
    }
    for r in [
        "controllerPublishSecretRef",
        "controllerExpandSecretRef",
        "nodePublishSecretRef",
        "nodeExpandSecretRef",
    ] {
        if let Some(v) = src.get(r).filter(|v| v.is_object()) {
            errs.extend(pv_secret_ref(&format!("{field}.{r}"), v));
        }
    }
    errs
}

const HOST_PATH_TYPES: &[&str] = &[
    "",
    "BlockDevice",
    "CharDevice",
    "Directory",
    "DirectoryOrCreate",
    "File",
    "FileOrCreate",
    "Socket",
];

fn node_selector_requirement(req: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let values = array(req, "/values");
    match str_or_empty(req, "/operator") {
        "In" | "NotIn" if values.is_empty() => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(FieldError::forbidden(
            format!("{path}.values"),
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if values.len() != 1 => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => {}
        other => errs.push(FieldError::invalid(
            format!("{path}.operator"),
            BadValue::Str(other.into()),
            "not a valid selector operator",
        )),
    }
    let key = str_or_empty(req, "/key");
    errs.extend(invalid_each(
        &format!("{path}.key"),
        key,
        qualified_name_errors(key),
    ));
    for (i, v) in values.iter().enumerate() {
        let v = v.as_str().unwrap_or("");
        errs.extend(invalid_each(
            &format!("{path}.values[{i}]"),
            v,
            label_value_errors(v),
        ));
    }
    errs
}

fn node_field_requirement(req: &Value, path: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let values = array(req, "/values");
    match str_or_empty(req, "/operator") {
        "In" | "NotIn" if values.len() != 1 => errs.push(FieldError::required(
            format!("{path}.values"),
            "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
        )),
        "In" | "NotIn" => {}
        other => errs.push(FieldError::invalid(
            format!("{path}.operator"),
            BadValue::Str(other.into()),
            "not a valid selector operator",
        )),
    }
    let key = str_or_empty(req, "/key");
    if key != "metadata.name" {
        errs.push(FieldError::invalid(
            format!("{path}.key"),
            BadValue::Str(key.into()),
            "not a valid field selector key",
        ));
    } else {
        for (i, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or("");
            errs.extend(invalid_each(
                &format!("{path}.values[{i}]"),
                v,
                dns1123_subdomain_errors(v),
            ));
        }
    }
    errs
}

/// `validateVolumeNodeAffinity`; also says whether one is set.
fn volume_node_affinity(na: &Value, field: &str) -> Vec<FieldError> {
    let Some(required) = na.get("required").filter(|r| r.is_object()) else {
        return vec![FieldError::required(
            format!("{field}.required"),
            "must specify required node constraints",
        )];
    };
    let terms_field = format!("{field}.required.nodeSelectorTerms");
    let terms = array(required, "/nodeSelectorTerms");
    if terms.is_empty() {
        return vec![FieldError::required(
            terms_field,
            "must have at least one node selector term",
        )];
    }
    let mut errs = Vec::new();
    for (i, term) in terms.iter().enumerate() {
        for (j, req) in array(term, "/matchExpressions").iter().enumerate() {
            errs.extend(node_selector_requirement(
                req,
                &format!("{terms_field}[{i}].matchExpressions[{j}]"),
            ));
        }
        for (j, req) in array(term, "/matchFields").iter().enumerate() {
            errs.extend(node_field_requirement(
                req,
                &format!("{terms_field}[{i}].matchFields[{j}]"),
            ));
        }
    }
    errs
}

/// `ValidatePersistentVolumeSpec` (not inline).
fn volume_spec(spec: &Value, vac_enabled: bool) -> Vec<FieldError> {
    let mut errs = access_modes(spec, "spec.accessModes", "");
    let capacity = object(spec, "/capacity");
    let cap_len = capacity.map_or(0, Map::len);
    if cap_len == 0 {
        errs.push(FieldError::required("spec.capacity", ""));
    }
    if capacity.is_none_or(|c| !c.contains_key("storage")) || cap_len > 1 {
        errs.push(FieldError::not_supported(
            "spec.capacity",
            BadValue::json(spec.get("capacity").unwrap_or(&Value::Null)),
            &["storage"],
        ));
    }
    if let Some(cap) = capacity {
        for (r, v) in cap {
            if let Some(Ok(q)) = quantity::from_json(v) {
                let f = format!("spec.capacity[{r}]");
                errs.extend(basic_resource(&f, &q));
                errs.extend(positive_quantity(&f, &q));
            }
        }
    }
    let policy = str_or_empty(spec, "/persistentVolumeReclaimPolicy");
    if !policy.is_empty() && !RECLAIM_POLICIES.contains(&policy) {
        errs.push(FieldError::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            BadValue::Str(policy.into()),
            RECLAIM_POLICIES,
        ));
    }
    let affinity = spec.get("nodeAffinity").filter(|v| v.is_object());
    if let Some(na) = affinity {
        errs.extend(volume_node_affinity(na, "spec.nodeAffinity"));
    }
    let mut sources = 0;
    for (key, name) in PV_SOURCES {
        let Some(src) = spec.get(*key).filter(|v| !v.is_null()) else {
            continue;
        };
        if sources > 0 && *key != "flexVolume" {
            errs.push(FieldError::forbidden(
                format!("spec.{name}"),
                "may not specify more than 1 volume type",
            ));
            continue;
        }
        sources += 1;
        match *key {
            "hostPath" => {
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.hostPath.path", ""));
                } else {
                    errs.extend(no_backsteps("spec.hostPath.path", p));
                    if let Some(t) = str_at(src, "/type")
                        && !HOST_PATH_TYPES.contains(&t)
                    {
                        errs.push(FieldError::not_supported(
                            "spec.hostPath.type",
                            BadValue::Str(t.into()),
                            HOST_PATH_TYPES,
                        ));
                    }
                }
            }
            "nfs" => {
                if str_or_empty(src, "/server").is_empty() {
                    errs.push(FieldError::required("spec.nfs.server", ""));
                }
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.nfs.path", ""));
                }
                if !p.starts_with('/') {
                    errs.push(FieldError::invalid(
                        "spec.nfs.path",
                        BadValue::Str(p.into()),
                        "must be an absolute path",
                    ));
                }
            }
            "local" => {
                let p = str_or_empty(src, "/path");
                if p.is_empty() {
                    errs.push(FieldError::required("spec.local.path", ""));
                } else {
                    errs.extend(no_backsteps("spec.local.path", p));
                }
                if affinity.is_none() {
                    errs.push(FieldError::required(
                        "spec.nodeAffinity",
                        "Local volume requires node affinity",
                    ));
                }
            }
            "csi" => errs.extend(csi_source(src, "spec.csi")),
            _ => {}
        }
    }
    if sources == 0 {
        errs.push(FieldError::required("spec", "must specify a volume type"));
    }
    if policy == "Recycle"
        && str_at(spec, "/hostPath/path").is_some_and(|p| p.trim_end_matches('/').is_empty())
    {
        errs.push(FieldError::forbidden(
            "spec.persistentVolumeReclaimPolicy",
            "may not be 'recycle' for a hostPath mount of '/'",
        ));
    }
    if let Some(class) = str_at(spec, "/storageClassName").filter(|c| !c.is_empty()) {
        errs.extend(class_name("spec.storageClassName", class));
    }
    if let Some(mode) = str_at(spec, "/volumeMode")
        && !VOLUME_MODES.contains(&mode)
    {
        errs.push(FieldError::not_supported(
            "spec.volumeMode",
            BadValue::Str(mode.into()),
            VOLUME_MODES,
        ));
    }
    if vac_enabled && let Some(vac) = str_at(spec, "/volumeAttributesClassName") {
        if vac.is_empty() {
            errs.push(FieldError::required(
                "spec.volumeAttributesClassName",
                "an empty string is disallowed",
            ));
        } else {
            errs.extend(class_name("spec.volumeAttributesClassName", vac));
        }
        if !present(spec, "/csi") {
            errs.push(FieldError::required(
                "spec.csi",
                "has to be specified when using volumeAttributesClassName",
            ));
        }
    }
    errs
}

fn volume_vac_enabled(gates: &FeatureGates, old: Option<&Value>) -> bool {
    gates.enabled(Gate::VolumeAttributesClass)
        || old.is_some_and(|o| present(o, "/spec/volumeAttributesClassName"))
}

/// `ValidatePersistentVolume`.
fn volume(k: &Kind, obj: &Value, vac_enabled: bool) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(volume_spec(
        obj.get("spec").unwrap_or(&Value::Null),
        vac_enabled,
    ));
    errs
}

/// The PV spec fields that hold its volume source (`PersistentVolumeSource`, inlined in v1).
fn volume_source(spec: &Value) -> Value {
    let mut out = Map::new();
    for (key, _) in PV_SOURCES {
        if let Some(v) = spec.get(*key) {
            out.insert((*key).to_string(), v.clone());
        }
    }
    semantic(&Value::Object(out))
}

const BETA_TO_GA_LABELS: &[(&str, &str)] = &[
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    (
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ),
];

/// Node affinity with beta topology keys of the old object mapped to the GA
/// keys where the new one uses them (the one change upstream allows).
fn affinity_equal(new: &Value, old: &Value) -> bool {
    let mut old = semantic(old);
    let new = semantic(new);
    if let (Some(old_terms), Some(new_terms)) = (
        old.pointer_mut("/required/nodeSelectorTerms")
            .and_then(Value::as_array_mut),
        new.pointer("/required/nodeSelectorTerms")
            .and_then(Value::as_array),
    ) {
        for (ot, nt) in old_terms.iter_mut().zip(new_terms) {
            let new_exprs = array(nt, "/matchExpressions");
            if let Some(old_exprs) = ot.get_mut("matchExpressions").and_then(Value::as_array_mut) {
                for (oe, ne) in old_exprs.iter_mut().zip(new_exprs) {
                    let (ok, nk) = (str_or_empty(oe, "/key"), str_or_empty(ne, "/key"));
                    if ok != nk && BETA_TO_GA_LABELS.contains(&(ok, nk)) {
                        oe["key"] = json!(nk);
                    }
                }
            }
        }
    }
    old == new
}

/// `ValidatePersistentVolumeUpdate` (after `ValidatePersistentVolume` of the new object).
fn volume_update(
    k: &Kind,
    new: &Value,
    old: &Value,
    vac_enabled: bool,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let mut errs = volume(k, new, vac_enabled);
    let null = Value::Null;
    let new_spec = new.get("spec").unwrap_or(&null);
    let old_spec = old.get("spec").unwrap_or(&null);
    let mut new_source = volume_source(new_spec);
    let old_source = volume_source(old_spec);
    // A controllerExpandSecretRef may be added to a CSI volume later.
    if present(old_spec, "/csi")
        && !present(old_spec, "/csi/controllerExpandSecretRef")
        && let Some(csi) = new_source.get_mut("csi").and_then(Value::as_object_mut)
    {
        csi.remove("controllerExpandSecretRef");
    }
    if new_source != old_source {
        errs.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            format!(
                "spec.persistentvolumesource is immutable after creation\n{}",
                diff_text("spec", &old_source, &new_source)
            ),
        ));
    }
    let new_mode = new_spec.get("volumeMode").filter(|v| !v.is_null());
    if new_mode != old_spec.get("volumeMode").filter(|v| !v.is_null()) {
        errs.push(FieldError::invalid(
            "volumeMode",
            BadValue::json(new_mode.unwrap_or(&Value::Null)),
            "field is immutable",
        ));
    }
    if let Some(old_na) = old_spec.get("nodeAffinity").filter(|v| !v.is_null()) {
        let new_na = new_spec.get("nodeAffinity").unwrap_or(&null);
        if !affinity_equal(new_na, old_na) {
            errs.push(FieldError::invalid(
                "nodeAffinity",
                BadValue::json(new_na),
                "field is immutable, except for updating from beta label to GA",
            ));
        }
    }
    let new_vac = new_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    let old_vac = old_spec
        .get("volumeAttributesClassName")
        .filter(|v| !v.is_null());
    if new_vac != old_vac {
        if !gates.enabled(Gate::VolumeAttributesClass) {
            errs.push(FieldError::forbidden(
                "spec.volumeAttributesClassName",
                "update is forbidden when the VolumeAttributesClass feature gate is disabled",
            ));
        }
        if vac_enabled && old_vac.is_some() && new_vac.is_none() {
            errs.push(FieldError::forbidden(
                "spec.volumeAttributesClassName",
                "update from non-nil value to nil is forbidden",
            ));
        }
    }
    errs
}

// ---------------------------------------------------------------------------
// VolumeAttachment

const MAX_ATTACHMENT_METADATA: usize = 256 * 1024;
const MAX_VOLUME_ERROR_MESSAGE: usize = 1024;

fn volume_error(e: Option<&Value>, field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(e) = e.filter(|e| e.is_object()) else {
        return errs;
    };
    if str_or_empty(e, "/message").len() > MAX_VOLUME_ERROR_MESSAGE {
        // Upstream reports the metadata limit here, not the message limit.
        errs.push(FieldError::too_long(
            format!("{field}.message"),
            MAX_ATTACHMENT_METADATA,
        ));
    }
    if let Some(code) = e.get("errorCode").and_then(Value::as_i64)
        && code < 0
    {
        errs.push(FieldError::invalid(
            format!("{field}.errorCode"),
            BadValue::Int(i128::from(code)),
            format!("must be between 0 and {}, inclusive", i32::MAX),
        ));
    }
    errs
}

/// `ValidateVolumeAttachment` and, on create, `ValidateVolumeAttachmentV1`.
fn volume_attachment(k: &Kind, obj: &Value, v1: bool) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    let null = Value::Null;
    let spec = obj.get("spec").unwrap_or(&null);
    if str_or_empty(spec, "/attacher").is_empty() {
        errs.push(FieldError::required("spec.attacher", ""));
    }
    let pv = spec
        .pointer("/source/persistentVolumeName")
        .filter(|v| !v.is_null());
    let inline = spec
        .pointer("/source/inlineVolumeSpec")
        .filter(|v| !v.is_null());
    let msg = "must specify exactly one of inlineVolumeSpec and persistentVolumeName";
    match (pv, inline) {
        (None, None) => errs.push(FieldError::required("spec.source", msg)),
        (Some(_), Some(_)) => errs.push(FieldError::forbidden("spec.source", msg)),
        (Some(p), None) => {
            if p.as_str().unwrap_or("").is_empty() {
                errs.push(FieldError::required(
                    "spec.source.persistentVolumeName",
                    "must specify non empty persistentVolumeName",
                ));
            }
        }
        (None, Some(_)) => {}
    }
    let node = str_or_empty(spec, "/nodeName");
    errs.extend(invalid_each(
        "spec.nodeName",
        node,
        dns1123_subdomain_errors(node),
    ));
    if let Some(md) = object(obj, "/status/attachmentMetadata") {
        let size: usize = md
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if size > MAX_ATTACHMENT_METADATA {
            errs.push(FieldError::too_long(
                "status.attachmentMetadata",
                MAX_ATTACHMENT_METADATA,
            ));
        }
    }
    errs.extend(volume_error(
        obj.pointer("/status/attachError"),
        "status.attachError",
    ));
    errs.extend(volume_error(
        obj.pointer("/status/detachError"),
        "status.detachError",
    ));
    if v1 {
        errs.extend(csi_driver_name(
            "spec.attacher",
            str_or_empty(spec, "/attacher"),
        ));
        if let Some(p) = pv.and_then(Value::as_str) {
            errs.extend(invalid_each(
                "spec.source.persistentVolumeName",
                p,
                dns1123_subdomain_errors(p),
            ));
        }
    }
    errs
}

/// The VolumeAttachment spec as the internal Go struct marshals to JSON
/// (field names without JSON tags), for the immutability message.
fn go_attachment_spec(spec: &Value) -> Value {
    let pv = spec.pointer("/source/persistentVolumeName").cloned();
    let inline = spec.pointer("/source/inlineVolumeSpec").cloned();
    json!({
        "Attacher": str_or_empty(spec, "/attacher"),
        "Source": {
            "PersistentVolumeName": pv.unwrap_or(Value::Null),
            "InlineVolumeSpec": inline.unwrap_or(Value::Null),
        },
        "NodeName": str_or_empty(spec, "/nodeName"),
    })
}

fn go_attachment_spec_text(spec: &Value) -> String {
    // Go keeps struct field order, not sorted keys.
    let v = go_attachment_spec(spec);
    format!(
        "{{\"Attacher\":{},\"Source\":{{\"PersistentVolumeName\":{},\"InlineVolumeSpec\":{}}},\"NodeName\":{}}}",
        go_json(&v["Attacher"]),
        go_json(&v["Source"]["PersistentVolumeName"]),
        go_json(&v["Source"]["InlineVolumeSpec"]),
        go_json(&v["NodeName"]),
    )
}

fn volume_attachment_update(k: &Kind, new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = volume_attachment(k, new, false);
    errs.extend(volume_attachment(k, new, false));
    let null = Value::Null;
    let (ns, os) = (
        new.get("spec").unwrap_or(&null),
        old.get("spec").unwrap_or(&null),
    );
    if semantic(ns) != semantic(os) {
        errs.push(FieldError::invalid(
            "spec",
            BadValue::Json(go_attachment_spec_text(ns)),
            "field is immutable",
        ));
    }
    errs
}

// ---------------------------------------------------------------------------
// StorageClass, VolumeAttributesClass

fn provisioner(field: &str, name: &str) -> Vec<FieldError> {
    if name.is_empty() {
        return vec![FieldError::required(field, "")];
    }
    let lower = name.to_lowercase();
    invalid_each(field, &lower, qualified_name_errors(&lower))
}

fn parameters(obj: &Value, allow_empty: bool) -> Vec<FieldError> {
    let params = object(obj, "/parameters");
    let mut errs = Vec::new();
    let len = params.map_or(0, Map::len);
    if len > 512 {
        return vec![FieldError::too_long("parameters", 512)];
    }
    let size: usize = params.map_or(0, |p| {
        p.iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum()
    });
    if params.is_some_and(|p| p.contains_key("")) {
        errs.push(FieldError::invalid(
            "parameters",
            BadValue::Str(String::new()),
            "field can not be empty.",
        ));
    }
    if size > 256 * 1024 {
        errs.push(FieldError::too_long("parameters", 256 * 1024));
    }
    if !allow_empty && len == 0 {
        errs.push(FieldError::required(
            "parameters",
            "must contain at least one key/value pair",
        ));
    }
    errs
}

/// `ValidateStorageClass` (allowedTopologies aside).
fn storage_class(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(provisioner(
        "provisioner",
        str_or_empty(obj, "/provisioner"),
    ));
    errs.extend(parameters(obj, true));
    let policy = str_or_empty(obj, "/reclaimPolicy");
    if !policy.is_empty() && policy != "Delete" && policy != "Retain" {
        errs.push(FieldError::not_supported(
            "reclaimPolicy",
            BadValue::Str(policy.into()),
            &["Delete", "Retain"],
        ));
    }
    match str_at(obj, "/volumeBindingMode") {
        None => errs.push(FieldError::required("volumeBindingMode", "")),
        Some("Immediate" | "WaitForFirstConsumer") => {}
        Some(other) => errs.push(FieldError::not_supported(
            "volumeBindingMode",
            BadValue::Str(other.into()),
            &["Immediate", "WaitForFirstConsumer"],
        )),
    }
    errs
}

/// `ValidateVolumeAttributesClass`.
fn volume_attributes_class(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    errs.extend(provisioner("driverName", str_or_empty(obj, "/driverName")));
    errs.extend(parameters(obj, false));
    errs
}

fn storage_class_update(new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if semantic(new.get("parameters").unwrap_or(&Value::Null))
        != semantic(old.get("parameters").unwrap_or(&Value::Null))
    {
        errs.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    if str_or_empty(new, "/provisioner") != str_or_empty(old, "/provisioner") {
        errs.push(FieldError::forbidden(
            "provisioner",
            "updates to provisioner are forbidden.",
        ));
    }
    if str_or_empty(new, "/reclaimPolicy") != str_or_empty(old, "/reclaimPolicy") {
        errs.push(FieldError::forbidden(
            "reclaimPolicy",
            "updates to reclaimPolicy are forbidden.",
        ));
    }
    let mode = str_or_empty(new, "/volumeBindingMode");
    if mode != str_or_empty(old, "/volumeBindingMode") {
        errs.push(FieldError::invalid(
            "volumeBindingMode",
            BadValue::Str(mode.into()),
            "field is immutable",
        ));
    }
    errs
}

fn volume_attributes_class_update(k: &Kind, new: &Value, old: &Value) -> Vec<FieldError> {
    let mut errs = object_meta_update(new, old);
    if str_or_empty(new, "/driverName") != str_or_empty(old, "/driverName") {
        errs.push(FieldError::forbidden(
            "driverName",
            "updates to driverName are forbidden.",
        ));
    }
    if semantic(new.get("parameters").unwrap_or(&Value::Null))
        != semantic(old.get("parameters").unwrap_or(&Value::Null))
    {
        errs.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    errs.extend(volume_attributes_class(k, new));
    errs
}

// ---------------------------------------------------------------------------
// Events

/// An Event in the shape of the internal type, whichever API wrote it.
struct EventView<'a> {
    namespace: &'a str,
    involved_namespace: &'a str,
    event_time: bool,
    reporting_controller: &'a str,
    reporting_instance: &'a str,
    action: &'a str,
    reason: &'a str,
    message: &'a str,
}

fn core_event(obj: &Value) -> EventView<'_> {
    EventView {
        namespace: meta_str(obj, "namespace"),
        involved_namespace: str_or_empty(obj, "/involvedObject/namespace"),
        event_time: present(obj, "/eventTime"),
        reporting_controller: str_or_empty(obj, "/reportingComponent"),
        reporting_instance: str_or_empty(obj, "/reportingInstance"),
        action: str_or_empty(obj, "/action"),
        reason: str_or_empty(obj, "/reason"),
        message: str_or_empty(obj, "/message"),
    }
}

fn events_v1_event(obj: &Value) -> EventView<'_> {
    EventView {
        namespace: meta_str(obj, "namespace"),
        involved_namespace: str_or_empty(obj, "/regarding/namespace"),
        event_time: present(obj, "/eventTime"),
        reporting_controller: str_or_empty(obj, "/reportingController"),
        reporting_instance: str_or_empty(obj, "/reportingInstance"),
        action: str_or_empty(obj, "/action"),
        reason: str_or_empty(obj, "/reason"),
        message: str_or_empty(obj, "/note"),
    }
}

/// `legacyValidateEvent`: the rules every Event passes, whichever API wrote it.
fn legacy_event(e: &EventView<'_>, reporting_field: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mismatch = || {
        FieldError::invalid(
            "involvedObject.namespace",
            BadValue::Str(e.involved_namespace.into()),
            "does not match event.namespace",
        )
    };
    if !e.event_time {
        let ok = if e.involved_namespace.is_empty() {
            e.namespace.is_empty() || e.namespace == "default"
        } else {
            e.namespace == e.involved_namespace
        };
        if !ok {
            errs.push(mismatch());
        }
    } else {
        if e.involved_namespace.is_empty()
            && e.namespace != "default"
            && e.namespace != "kube-system"
        {
            errs.push(mismatch());
        }
        if e.reporting_controller.is_empty() {
            errs.push(FieldError::required(reporting_field, ""));
        }
        errs.extend(invalid_each(
            reporting_field,
            e.reporting_controller,
            qualified_name_errors(e.reporting_controller),
        ));
        if e.reporting_instance.is_empty() {
            errs.push(FieldError::required("reportingInstance", ""));
        }
        if e.reporting_instance.len() > 128 {
            errs.push(FieldError::invalid(
                "reportingInstance",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.action.is_empty() {
            errs.push(FieldError::required("action", ""));
        }
        if e.action.len() > 128 {
            errs.push(FieldError::invalid(
                "action",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.reason.is_empty() {
            errs.push(FieldError::required("reason", ""));
        }
        if e.reason.len() > 128 {
            errs.push(FieldError::invalid(
                "reason",
                BadValue::Str(String::new()),
                "can have at most 128 characters",
            ));
        }
        if e.message.len() > 1024 {
            errs.push(FieldError::invalid(
                "message",
                BadValue::Str(String::new()),
                "can have at most 1024 characters",
            ));
        }
    }
    errs.extend(invalid_each(
        "namespace",
        e.namespace,
        dns1123_subdomain_errors(e.namespace),
    ));
    errs
}

/// The strict rules of events.k8s.io/v1 creations (`ValidateEventCreate`).
fn events_v1_strict(k: &Kind, obj: &Value) -> Vec<FieldError> {
    let mut errs = object_meta(k, obj, NameRule::Subdomain);
    if !present(obj, "/eventTime") {
        errs.push(FieldError::required("eventTime", ""));
    }
    let t = str_or_empty(obj, "/type");
    if t != "Normal" && t != "Warning" {
        errs.push(FieldError::invalid(
            "type",
            BadValue::Str(String::new()),
            format!("has invalid value: {t}"),
        ));
    }
    for (field, internal) in [
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
    ] {
        if present(obj, &format!("/{field}")) {
            errs.push(FieldError::invalid(
                internal,
                BadValue::Str(String::new()),
                "needs to be unset",
            ));
        }
    }
    if obj
        .get("deprecatedCount")
        .and_then(Value::as_i64)
        .is_some_and(|c| c != 0)
    {
        errs.push(FieldError::invalid(
            "count",
            BadValue::Str(String::new()),
            "needs to be unset",
        ));
    }
    if !str_or_empty(obj, "/deprecatedSource/component").is_empty()
        || !str_or_empty(obj, "/deprecatedSource/host").is_empty()
    {
        errs.push(FieldError::invalid(
            "source",
            BadValue::Str(String::new()),
            "needs to be unset",
        ));
    }
    errs
}

// ---------------------------------------------------------------------------
// Entry points

/// The `422` causes of a create, after admission and `PrepareForCreate`.
pub fn validate_create(k: &Kind, obj: &Value, gates: &FeatureGates) -> Vec<FieldError> {
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") => claim(k, obj, claim_options(gates, None)),
        ("", "PersistentVolume") => volume(k, obj, volume_vac_enabled(gates, None)),
        ("storage.k8s.io", "VolumeAttachment") => volume_attachment(k, obj, true),
        ("storage.k8s.io", "StorageClass") => storage_class(k, obj),
        ("storage.k8s.io", "VolumeAttributesClass") => volume_attributes_class(k, obj),
        ("", "Event") => {
            let mut errs = legacy_event(&core_event(obj), "reportingComponent");
            errs.extend(object_meta(k, obj, k.name_rule));
            errs
        }
        ("events.k8s.io", "Event") => {
            let mut errs = legacy_event(&events_v1_event(obj), "reportingController");
            errs.extend(events_v1_strict(k, obj));
            errs
        }
        _ => object_meta(k, obj, k.name_rule),
    }
}

/// The `422` causes of an update (main or status), after `PrepareForUpdate`.
pub fn validate_update(
    k: &Kind,
    new: &Value,
    old: &Value,
    status: bool,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    let mut errs = common_update(new, old);
    match (k.group, k.kind, status) {
        ("", "PersistentVolumeClaim", false) => {
            let opts = claim_options(gates, Some(old));
            errs.extend(claim(k, new, opts));
            errs.extend(claim_update(k, new, old, opts, gates));
        }
        ("", "PersistentVolumeClaim", true) => errs.extend(claim_status_update(new, old)),
        ("", "PersistentVolume", false) => {
            let vac = volume_vac_enabled(gates, Some(old));
            errs.extend(volume(k, new, vac));
            errs.extend(volume_update(k, new, old, vac, gates));
        }
        ("", "PersistentVolume", true) => errs.extend(object_meta_update(new, old)),
        ("storage.k8s.io", "VolumeAttachment", _) => {
            errs.extend(volume_attachment_update(k, new, old));
        }
        ("storage.k8s.io", "StorageClass", _) => {
            errs.extend(storage_class(k, new));
            errs.extend(storage_class_update(new, old));
        }
        ("storage.k8s.io", "VolumeAttributesClass", _) => {
            errs.extend(volume_attributes_class(k, new));
            errs.extend(volume_attributes_class_update(k, new, old));
        }
        ("", "Event", _) => errs.extend(legacy_event(&core_event(new), "reportingComponent")),
        ("events.k8s.io", "Event", _) => {
            errs.extend(legacy_event(&events_v1_event(new), "reportingController"));
            for f in [
                "regarding",
                "reason",
                "note",
                "type",
                "action",
                "related",
                "reportingController",
                "reportingInstance",
            ] {
                let (a, b) = (
                    new.get(f).filter(|v| !v.is_null()),
                    old.get(f).filter(|v| !v.is_null()),
                );
                if semantic(a.unwrap_or(&Value::Null)) != semantic(b.unwrap_or(&Value::Null)) {
                    let internal = match f {
                        "regarding" => "involvedObject",
                        "note" => "message",
                        other => other,
                    };
                    errs.push(FieldError::invalid(
                        internal,
                        BadValue::json(a.unwrap_or(&Value::Null)),
                        "field is immutable",
                    ));
                }
            }
        }
        _ => {}
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    fn kind(r: &Registry, plural: &str) -> Kind {
        r.get(r.core(plural).unwrap()).clone()
    }

    #[test]
    fn claim_storage_request_must_be_positive() {
        let r = Registry::builtin();
        let k = kind(&r, "persistentvolumeclaims");
        let pvc = json!({"metadata": {"name": "c", "namespace": "n"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "-1"}}}});
        let errs = validate_create(&k, &pvc, &FeatureGates::default());
        assert_eq!(errs.len(), 1);
        assert_eq!(
            errs[0].to_string(),
            "spec.resources[storage]: Invalid value: \"-1\": must be greater than zero"
        );
        let e = invalid(&k, "c", &errs);
        assert_eq!(
            e.message,
            "PersistentVolumeClaim \"c\" is invalid: spec.resources[storage]: Invalid value: \"-1\": must be greater than zero"
        );
        let none = json!({"metadata": {"name": "c"}, "spec": {}});
        let errs = validate_create(&k, &none, &FeatureGates::default());
        let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value"
            ]
        );
        let e = invalid(&k, "c", &errs);
        assert!(e.message.contains(": [spec.accessModes"), "{}", e.message);
    }

    #[test]
    fn claim_spec_is_immutable_but_volume_name_is_set_once() {
        let r = Registry::builtin();
        let k = kind(&r, "persistentvolumeclaims");
        let old = json!({"metadata": {"name": "c", "resourceVersion": "1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "storageClassName": "a"}});
        let mut bind = old.clone();
        bind["spec"]["volumeName"] = json!("pv");
        assert!(validate_update(&k, &bind, &old, false, &FeatureGates::default()).is_empty());
        let mut grow = old.clone();
        grow["spec"]["resources"]["requests"]["storage"] = json!("1024Mi");
        assert!(validate_update(&k, &grow, &old, false, &FeatureGates::default()).is_empty());
        let mut class = old.clone();
        class["spec"]["storageClassName"] = json!("b");
        let errs = validate_update(&k, &class, &old, false, &FeatureGates::default());
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec");
        assert_eq!(errs[0].kind, ErrorType::Forbidden);
        assert!(errs[0].detail.starts_with("spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims\n"));
    }

    #[test]
    fn volume_source_is_immutable() {
        let r = Registry::builtin();
        let k = kind(&r, "persistentvolumes");
        let old = json!({"metadata": {"name": "v"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"}, "csi": {"driver": "d.example.com", "volumeHandle": "h"}}});
        assert!(validate_create(&k, &old, &FeatureGates::default()).is_empty());
        let mut new = old.clone();
        new["spec"]["csi"]["volumeHandle"] = json!("other");
        let errs = validate_update(&k, &new, &old, false, &FeatureGates::default());
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.persistentvolumesource");
        let mut expand = old.clone();
        expand["spec"]["csi"]["controllerExpandSecretRef"] = json!({"name": "s", "namespace": "n"});
        assert!(validate_update(&k, &expand, &old, false, &FeatureGates::default()).is_empty());
        let none = json!({"metadata": {"name": "v"}, "spec": {}});
        let text: Vec<String> = validate_create(&k, &none, &FeatureGates::default())
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            text,
            [
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                "spec.capacity: Unsupported value: null: supported values: \"storage\"",
                "spec: Required value: must specify a volume type"
            ]
        );
    }

    #[test]
    fn events_must_be_in_their_objects_namespace() {
        let r = Registry::builtin();
        let k = kind(&r, "events");
        let ev = json!({"metadata": {"name": "e", "namespace": "ns"},
            "involvedObject": {"kind": "ConfigMap", "name": "c"}});
        let errs = validate_create(&k, &ev, &FeatureGates::default());
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["involvedObject.namespace: Invalid value: \"\": does not match event.namespace"]
        );
        let mut ok = ev.clone();
        ok["involvedObject"]["namespace"] = json!("ns");
        assert!(validate_create(&k, &ok, &FeatureGates::default()).is_empty());
        let mut default_ns = ev.clone();
        default_ns["metadata"]["namespace"] = json!("default");
        assert!(validate_create(&k, &default_ns, &FeatureGates::default()).is_empty());
    }

    #[test]
    fn attachment_spec_is_immutable() {
        let r = Registry::builtin();
        let id = r
            .lookup("storage.k8s.io", "v1", "volumeattachments")
            .unwrap();
        let k = r.get(id).clone();
        let old = json!({"metadata": {"name": "va"}, "spec": {"attacher": "d.example.com",
            "nodeName": "n", "source": {"persistentVolumeName": "pv"}}});
        assert!(validate_create(&k, &old, &FeatureGates::default()).is_empty());
        let mut new = old.clone();
        new["spec"]["nodeName"] = json!("m");
        let errs = validate_update(&k, &new, &old, false, &FeatureGates::default());
        assert_eq!(
            errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
            [
                "spec: Invalid value: {\"Attacher\":\"d.example.com\",\"Source\":{\"PersistentVolumeName\":\"pv\",\"InlineVolumeSpec\":null},\"NodeName\":\"m\"}: field is immutable"
            ]
        );
        assert_eq!(
            invalid(&k, "va", &errs).message.split(':').next(),
            Some("VolumeAttachment.storage.k8s.io \"va\" is invalid")
        );
    }
}
