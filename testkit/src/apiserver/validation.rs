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

mod cbt;
mod claims;
mod events;
mod storage;
mod volumes;

use cbt::*;
use claims::*;
use events::*;
use storage::*;
use volumes::*;

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
        ("cbt.storage.k8s.io", "SnapshotMetadataService") => {
            let mut errs = object_meta(k, obj, k.name_rule);
            errs.extend(snapshot_metadata_service(obj));
            errs
        }
        ("", "Secret" | "ConfigMap") => {
            let mut errs = object_meta(k, obj, k.name_rule);
            errs.extend(data_size(k, obj));
            errs
        }
        _ => object_meta(k, obj, k.name_rule),
    }
}

/// What a Secret or a ConfigMap may hold, as kube-apiserver counts it: a Secret's decoded
/// values, a ConfigMap's keys and values.
const MAX_DATA_BYTES: usize = 1024 * 1024;

fn data_size(k: &Kind, obj: &Value) -> Vec<FieldError> {
    use base64::Engine;
    let entries = |field: &str| {
        obj.get(field)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(key, value)| (key.len(), value.as_str().unwrap_or("")))
            .collect::<Vec<_>>()
    };
    let size: usize = if k.kind == "Secret" {
        entries("data")
            .into_iter()
            .map(|(_, value)| {
                base64::engine::general_purpose::STANDARD
                    .decode(value)
                    .map_or(value.len(), |bytes| bytes.len())
            })
            .sum()
    } else {
        ["data", "binaryData"]
            .into_iter()
            .flat_map(entries)
            .map(|(key, value)| key + value.len())
            .sum()
    };
    if size > MAX_DATA_BYTES {
        let field = if k.kind == "Secret" { "data" } else { "" };
        return vec![FieldError::too_long(field, MAX_DATA_BYTES)];
    }
    Vec::new()
}

/// A Secret or ConfigMap marked immutable keeps its data and the mark.
fn immutable_data(k: &Kind, new: &Value, old: &Value) -> Vec<FieldError> {
    if old.get("immutable").and_then(Value::as_bool) != Some(true) {
        return Vec::new();
    }
    const DETAIL: &str = "field is immutable when `immutable` is set";
    let mut errs = Vec::new();
    if new.get("immutable").and_then(Value::as_bool) != Some(true) {
        errs.push(FieldError::forbidden("immutable", DETAIL));
    }
    let fields: &[&str] = if k.kind == "Secret" {
        &["data"]
    } else {
        &["data", "binaryData"]
    };
    for field in fields {
        let empty = Value::Object(Default::default());
        let (a, b) = (
            new.get(*field).filter(|v| !v.is_null()).unwrap_or(&empty),
            old.get(*field).filter(|v| !v.is_null()).unwrap_or(&empty),
        );
        if a != b {
            errs.push(FieldError::forbidden(*field, DETAIL));
        }
    }
    errs
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
        ("cbt.storage.k8s.io", "SnapshotMetadataService", _) => {
            errs.extend(snapshot_metadata_service(new));
        }
        ("", "Secret" | "ConfigMap", _) => {
            errs.extend(data_size(k, new));
            errs.extend(immutable_data(k, new, old));
        }
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
mod tests;
