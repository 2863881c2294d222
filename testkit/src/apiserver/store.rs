//! The object store: objects as JSON, one resourceVersion counter for all kinds
//! (like etcd's revision), an event history for watches, and the write
//! semantics of the real server (preconditions, finalizers, status subresource,
//! generation). No I/O: the HTTP edge and the PV controller call in under a lock.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::gates::{FeatureGates, Gate};
use super::patch::{PatchError, json_patch, merge_patch, strategic_merge_patch};
use super::protection;
use super::registry::{Kind, KindId, Registry, StatusMetadata};
use super::selector::{FieldSelector, LabelSelector};
use super::validation;

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type ObjKey = (String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and sent to watchers.
#[derive(Debug)]
pub struct WatchEvent {
    pub kind: KindId,
    pub etype: EventType,
    pub rv: u64,
    /// The object after the change; for deletions the last state, stamped with the deletion's resourceVersion.
    pub object: Arc<Value>,
    /// The object before the change (`None` for creations).
    pub prev: Option<Arc<Value>>,
    encoded: OnceLock<Bytes>,
    encoded_protobuf: OnceLock<Option<Bytes>>,
}

impl WatchEvent {
    fn new(
        kind: KindId,
        etype: EventType,
        rv: u64,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        Self {
            kind,
            etype,
            rv,
            object,
            prev,
            encoded: OnceLock::new(),
            encoded_protobuf: OnceLock::new(),
        }
    }

    /// The object serialized once and shared by every watcher.
    pub fn encoded_object(&self) -> &Bytes {
        self.encoded
            .get_or_init(|| Bytes::from(serde_json::to_vec(&*self.object).unwrap_or_default()))
    }

    /// The object in the protobuf envelope, encoded once and shared by every
    /// protobuf watcher; `None` for a kind without a protobuf encoding.
    pub fn encoded_protobuf(&self) -> Option<&Bytes> {
        self.encoded_protobuf
            .get_or_init(|| match super::protobuf::encode_object(&self.object) {
                Ok(b) => Some(Bytes::from(b)),
                Err(e) => {
                    tracing::warn!(rv = self.rv, "a watch event has no protobuf encoding: {e}");
                    None
                }
            })
            .as_ref()
    }
}

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

/// The three patch formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
}

/// DELETE preconditions.
#[derive(Debug, Clone, Default)]
pub struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// What a DELETE did.
#[derive(Debug, Clone)]
pub enum Deleted {
    /// The object is gone; this is its last state.
    Removed(Arc<Value>),
    /// Finalizers keep the object; it now carries a deletionTimestamp.
    Pending(Arc<Value>),
}

/// A LIST request, already parsed.
#[derive(Debug, Clone, Default)]
pub struct ListQuery<'a> {
    pub namespace: Option<&'a str>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<&'a str>,
    pub resource_version: Option<&'a str>,
    /// `resourceVersionMatch=Exact`.
    pub exact: bool,
}

/// One page of a LIST.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<u64>,
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFrom {
    /// Synthetic ADDED events for the current state, then live events.
    Current,
    /// Every event after this resourceVersion.
    After(u64),
}

/// A registered watch: the events to send first, then the live channel.
#[derive(Debug)]
pub struct WatchStart {
    pub initial: Vec<Arc<WatchEvent>>,
    pub events: mpsc::Receiver<Arc<WatchEvent>>,
    /// Live events at or below this resourceVersion are skipped.
    pub after: u64,
}

#[derive(Debug)]
struct Watcher {
    tx: mpsc::Sender<Arc<WatchEvent>>,
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

/// The in-memory object store.
#[derive(Debug)]
pub struct Store {
    registry: Arc<Registry>,
    objects: Vec<BTreeMap<ObjKey, Arc<Value>>>,
    rv: u64,
    history: VecDeque<Arc<WatchEvent>>,
    history_limit: usize,
    /// Every event with a resourceVersion above this is still in `history`.
    history_floor: u64,
    watchers: Vec<Vec<Watcher>>,
    watch_buffer: usize,
    rng: u64,
    gates: FeatureGates,
}

/// The current time as the RFC 3339 string Kubernetes uses (second precision).
pub fn now_timestamp() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    i64::try_from(secs)
        .ok()
        .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".into())
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object's `metadata.resourceVersion` as a number (0 when absent).
pub fn resource_version_of(obj: &Value) -> u64 {
    meta_str(obj, "resourceVersion").parse().unwrap_or(0)
}

/// The store key of an object.
pub fn key_of(obj: &Value) -> ObjKey {
    (
        meta_str(obj, "namespace").to_string(),
        meta_str(obj, "name").to_string(),
    )
}

fn finalizers(obj: &Value) -> Vec<&str> {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn being_deleted(obj: &Value) -> bool {
    meta(obj).is_some_and(|m| m.get("deletionTimestamp").is_some_and(|v| !v.is_null()))
}

/// The object without metadata and status: what `generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect()
}

fn encode_continue(rv: u64, key: &ObjKey) -> String {
    hex_encode(
        json!({"rv": rv, "start": [key.0, key.1]})
            .to_string()
            .as_bytes(),
    )
}

fn decode_continue(token: &str) -> Option<(u64, ObjKey)> {
    let v: Value = serde_json::from_slice(&hex_decode(token)?).ok()?;
    let rv = v.get("rv")?.as_u64()?;
    let start = v.get("start")?.as_array()?;
    Some((
        rv,
        (
            start.first()?.as_str()?.to_string(),
            start.get(1)?.as_str()?.to_string(),
        ),
    ))
}

/// Checks and fills `apiVersion`/`kind` of a request body.
fn check_type(k: &Kind, obj: &mut Value) -> Result<(), ApiError> {
    let Value::Object(m) = obj else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    let api_version = k.api_version();
    for (field, want) in [("apiVersion", api_version.as_str()), ("kind", k.kind)] {
        match m.get(field).and_then(Value::as_str) {
            None | Some("") => {
                m.insert(field.into(), json!(want));
            }
            Some(got) if got == want => {}
            Some(got) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({}) does not match the expected API version ({api_version}) or kind ({got}) does not match {}",
                    m.get("apiVersion").and_then(Value::as_str).unwrap_or(""),
                    k.kind
                )));
            }
        }
    }
    Ok(())
}

/// What the real server's v1-to-internal conversion and defaulting do to a
/// Secret on every write: `stringData` is merged into `data` (as the UTF-8
/// bytes, winning over `data` for the same key) and never stored, `data` must
/// be base64, and `type` defaults to `Opaque`.
pub fn normalize_secret(k: &Kind, obj: &mut Value) -> Result<(), ApiError> {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    let Value::Object(m) = obj else {
        return Ok(());
    };
    let string_data = m.remove("stringData");
    if let Some(data) = m.get("data").and_then(Value::as_object) {
        for (key, v) in data {
            let ok = v.as_str().is_some_and(|s| STANDARD.decode(s).is_ok()) || v.is_null();
            if !ok {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{key}"
                )));
            }
        }
    }
    match string_data {
        None | Some(Value::Null) => {}
        Some(Value::Object(sd)) if sd.is_empty() => {}
        Some(Value::Object(sd)) => {
            if !m.get("data").is_some_and(Value::is_object) {
                m.insert("data".into(), json!({}));
            }
            if let Some(Value::Object(data)) = m.get_mut("data") {
                for (key, v) in sd {
                    let Some(s) = v.as_str() else {
                        return Err(ApiError::bad_request(format!(
                            "Secret in version \"v1\" cannot be handled as a Secret: stringData.{key} must be a string"
                        )));
                    };
                    data.insert(key, json!(STANDARD.encode(s.as_bytes())));
                }
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "Secret in version \"v1\" cannot be handled as a Secret: stringData must be an object",
            ));
        }
    }
    if m.get("type")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        m.insert("type".into(), json!("Opaque"));
    }
    if let Some(data) = m.get("data").and_then(Value::as_object) {
        let name = m
            .get("metadata")
            .and_then(|md| md.get("name"))
            .and_then(Value::as_str)
            .unwrap_or("");
        for key in data.keys() {
            if !is_config_key(key) {
                return Err(ApiError::invalid(
                    k,
                    name,
                    &format!("data[{key}]"),
                    "FieldValueInvalid",
                    &format!(
                        "Invalid value: {key:?}: a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The defaulting the real server applies to every decoded object of the
/// storage kinds (SetDefaults_* of core/v1 and storage/v1).
pub fn apply_defaults(k: &Kind, obj: &mut Value) {
    // `section` is "" for top-level fields, else a top-level object such as "spec".
    fn default(obj: &mut Value, section: &str, field: &str, value: &str) {
        let Value::Object(root) = obj else {
            return;
        };
        let target = if section.is_empty() {
            root
        } else {
            match root.entry(section).or_insert_with(|| json!({})) {
                Value::Object(m) => m,
                _ => return,
            }
        };
        let missing = target
            .get(field)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""));
        if missing {
            target.insert(field.into(), json!(value));
        }
    }
    match (k.group, k.kind) {
        ("", "PersistentVolume") => {
            default(obj, "spec", "persistentVolumeReclaimPolicy", "Retain");
            default(obj, "spec", "volumeMode", "Filesystem");
        }
        ("", "PersistentVolumeClaim") => default(obj, "spec", "volumeMode", "Filesystem"),
        ("storage.k8s.io", "StorageClass") => {
            default(obj, "", "reclaimPolicy", "Delete");
            default(obj, "", "volumeBindingMode", "Immediate");
        }
        _ => {}
    }
}

/// Keys of Secret and ConfigMap data: `[-._a-zA-Z0-9]+`, at most 253 characters, not `.`/`..`.
fn is_config_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 253
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `PrepareForCreate`/`PrepareForUpdate` of the strategies that change what
/// is stored: fields of disabled feature gates are dropped unless the stored
/// object already has them, and a PVC's `dataSource`/`dataSourceRef` are
/// made consistent (pkg/api/persistentvolumeclaim/util.go,
/// pkg/api/persistentvolume/util.go, the CSIDriver strategy).
fn drop_disabled_spec_fields(k: &Kind, obj: &mut Value, old: Option<&Value>, gates: &FeatureGates) {
    let old_has =
        |pointer: &str| old.is_some_and(|o| o.pointer(pointer).is_some_and(|v| !v.is_null()));
    let remove = |obj: &mut Value, parent: &str, field: &str| {
        if let Some(Value::Object(m)) = obj.pointer_mut(parent) {
            m.remove(field);
        }
    };
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") => {
            if !gates.enabled(Gate::VolumeAttributesClass)
                && !old_has("/spec/volumeAttributesClassName")
            {
                remove(obj, "/spec", "volumeAttributesClassName");
            }
            let cross_namespace = obj
                .pointer("/spec/dataSourceRef/namespace")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if cross_namespace
                && !gates.enabled(Gate::CrossNamespaceVolumeDataSource)
                && !old_has("/spec/dataSourceRef")
            {
                remove(obj, "/spec", "dataSourceRef");
            }
            normalize_claim_data_sources(obj, old);
        }
        ("", "PersistentVolume")
            if !gates.enabled(Gate::VolumeAttributesClass)
                && !old_has("/spec/volumeAttributesClassName") =>
        {
            remove(obj, "/spec", "volumeAttributesClassName");
        }
        ("storage.k8s.io", "CSIDriver") => {
            if !gates.enabled(Gate::SELinuxMountReadWriteOncePod) && !old_has("/spec/seLinuxMount")
            {
                remove(obj, "/spec", "seLinuxMount");
            }
            if !gates.enabled(Gate::MutableCSINodeAllocatableCount)
                && !old_has("/spec/nodeAllocatableUpdatePeriodSeconds")
            {
                remove(obj, "/spec", "nodeAllocatableUpdatePeriodSeconds");
            }
        }
        _ => {}
    }
}

/// `EnforceDataSourceBackwardsCompatibility` then `NormalizeDataSources`:
/// without a `dataSourceRef`, a `dataSource` other than a PVC or a
/// VolumeSnapshot is dropped (unless the stored claim has a data source);
/// then each of the two is filled from the other when only one is set
/// (a cross-namespace `dataSourceRef` has no `dataSource` counterpart).
fn normalize_claim_data_sources(obj: &mut Value, old: Option<&Value>) {
    let set = |v: &Value, p: &str| v.pointer(p).is_some_and(Value::is_object);
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let old_in_use =
        old.is_some_and(|o| set(o, "/spec/dataSource") || set(o, "/spec/dataSourceRef"));
    let has = |spec: &Map<String, Value>, f: &str| spec.get(f).is_some_and(Value::is_object);
    if !old_in_use && !has(spec, "dataSourceRef") && has(spec, "dataSource") {
        let ds = &spec["dataSource"];
        let group = ds.get("apiGroup").and_then(Value::as_str).unwrap_or("");
        let kind = ds.get("kind").and_then(Value::as_str).unwrap_or("");
        let allowed = (kind == "PersistentVolumeClaim" && group.is_empty())
            || (kind == "VolumeSnapshot" && group == "snapshot.storage.k8s.io");
        if !allowed {
            spec.remove("dataSource");
        }
    }
    // Go writes the nil apiGroup pointer of these references as null.
    let copy = |from: &Value| {
        json!({
            "apiGroup": from.get("apiGroup").cloned().unwrap_or(Value::Null),
            "kind": from.get("kind").cloned().unwrap_or(json!("")),
            "name": from.get("name").cloned().unwrap_or(json!("")),
        })
    };
    match (has(spec, "dataSource"), has(spec, "dataSourceRef")) {
        (true, false) => {
            let r = copy(&spec["dataSource"]);
            spec.insert("dataSourceRef".into(), r);
        }
        (false, true) => {
            let namespaced = spec["dataSourceRef"]
                .get("namespace")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !namespaced {
                let d = copy(&spec["dataSourceRef"]);
                spec.insert("dataSource".into(), d);
            }
        }
        _ => {}
    }
    for f in ["dataSource", "dataSourceRef"] {
        if let Some(Value::Object(r)) = spec.get_mut(f) {
            r.entry("apiGroup").or_insert(Value::Null);
        }
    }
}

/// Status fields of disabled feature gates, dropped on status writes unless
/// the stored object has them (the PVC and VolumeAttachment status strategies).
fn drop_disabled_status_fields(k: &Kind, new: &mut Value, old: &Value, gates: &FeatureGates) {
    let old_has = |pointer: &str| old.pointer(pointer).is_some_and(|v| !v.is_null());
    let remove = |obj: &mut Value, parent: &str, field: &str| {
        if let Some(Value::Object(m)) = obj.pointer_mut(parent) {
            m.remove(field);
        }
    };
    match (k.group, k.kind) {
        ("", "PersistentVolumeClaim") if !gates.enabled(Gate::VolumeAttributesClass) => {
            for f in ["currentVolumeAttributesClassName", "modifyVolumeStatus"] {
                if !old_has(&format!("/status/{f}")) {
                    remove(new, "/status", f);
                }
            }
        }
        ("storage.k8s.io", "VolumeAttachment")
            if !gates.enabled(Gate::MutableCSINodeAllocatableCount) =>
        {
            for e in ["attachError", "detachError"] {
                if !old_has(&format!("/status/{e}/errorCode")) {
                    remove(new, &format!("/status/{e}"), "errorCode");
                }
            }
        }
        _ => {}
    }
}

/// The PV status strategy keeps `lastPhaseTransitionTime` while the phase
/// stays, and stamps it when the phase changes and the writer did not.
fn volume_phase_transition(new: &mut Value, old: &Value) {
    let phase = |v: &Value| {
        v.pointer("/status/phase")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let time = |v: &Value| {
        v.pointer("/status/lastPhaseTransitionTime")
            .filter(|t| !t.is_null())
            .cloned()
    };
    let (new_time, old_time) = (time(new), time(old));
    let stamp = if phase(new) == phase(old) {
        if new_time.is_some() {
            return;
        }
        old_time
    } else if new_time.is_none() || new_time == old_time {
        Some(json!(now_timestamp()))
    } else {
        return;
    };
    if let (Some(t), Some(Value::Object(st))) = (stamp, new.get_mut("status")) {
        st.insert("lastPhaseTransitionTime".into(), t);
    }
}

/// The metadata a `/status` write stores, per the kind's status strategy.
fn status_write(k: &Kind, old: &Value, new: &Value) -> Value {
    let mut out = old.clone();
    match new.get("status") {
        Some(st) if !st.is_null() => out["status"] = st.clone(),
        _ => {
            if let Value::Object(m) = &mut out {
                m.remove("status");
            }
        }
    }
    let request_fields: &[&str] = match k.status_metadata {
        StatusMetadata::StatusOnly | StatusMetadata::Reset => &[],
        StatusMetadata::FromRequest => &["labels", "annotations", "finalizers", "ownerReferences"],
        StatusMetadata::KeepOwnerReferences => &["labels", "annotations", "finalizers"],
        StatusMetadata::KeepLabels => &["annotations", "finalizers", "ownerReferences"],
    };
    let new_meta = meta(new).cloned().unwrap_or_default();
    let m = meta_mut(&mut out);
    for f in request_fields {
        match new_meta.get(*f) {
            Some(v) if !v.is_null() => m.insert((*f).to_string(), v.clone()),
            _ => m.remove(*f),
        };
    }
    out
}

/// Builds the object an update stores, applying the real server's rules:
/// preconditions, immutable system metadata, status subresource separation,
/// fields of disabled gates, generation, and the kind's validation.
fn prepare_update(
    k: &Kind,
    old: &Value,
    mut new: Value,
    target: Target,
    key: &ObjKey,
    gates: &FeatureGates,
) -> Result<Value, ApiError> {
    check_type(k, &mut new)?;
    if k.is_core("Secret") && target == Target::Main {
        normalize_secret(k, &mut new)?;
    }
    validation::canonicalize_quantities(k, &mut new)?;
    validation::check_times(k, &new)?;
    validation::drop_empty_collections(k, &mut new);
    if target == Target::Main {
        apply_defaults(k, &mut new);
    }
    let (ns, name) = key;
    let body_name = meta_str(&new, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_ns = meta_str(&new, "namespace");
    if k.namespaced && !body_ns.is_empty() && body_ns != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let rv = meta_str(&new, "resourceVersion");
    if rv.is_empty() && !k.unconditional_update {
        return Err(ApiError::resource_version_required(k, name));
    }
    if !rv.is_empty() && parse_rv(rv)? != resource_version_of(old) {
        return Err(ApiError::modified(k, name));
    }
    let uid = meta_str(&new, "uid");
    let old_uid = meta_str(old, "uid");
    if !uid.is_empty() && uid != old_uid {
        return Err(ApiError::conflict(
            k,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
            ),
        ));
    }
    if target == Target::Status {
        let mut out = status_write(k, old, &new);
        drop_disabled_status_fields(k, &mut out, old, gates);
        if k.is_core("PersistentVolume") {
            volume_phase_transition(&mut out, old);
        }
        let errs = validation::validate_update(k, &out, old, true, gates);
        if !errs.is_empty() {
            return Err(validation::invalid(k, name, &errs));
        }
        return Ok(out);
    }
    let old_meta = meta(old).cloned().unwrap_or_default();
    {
        let m = meta_mut(&mut new);
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            match old_meta.get(f) {
                Some(v) => m.insert(f.into(), v.clone()),
                None => m.remove(f),
            };
        }
        m.insert("name".into(), json!(name));
        if k.namespaced {
            m.insert("namespace".into(), json!(ns));
        } else {
            m.remove("namespace");
        }
        m.remove("managedFields");
        m.remove("selfLink");
    }
    if k.status_subresource {
        match old.get("status") {
            Some(s) => new["status"] = s.clone(),
            None => {
                if let Value::Object(m) = &mut new {
                    m.remove("status");
                }
            }
        }
    }
    drop_disabled_spec_fields(k, &mut new, Some(old), gates);
    if k.tracks_generation && spec_part(&new) != spec_part(old) {
        let generation = old_meta
            .get("generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
    }
    let errs = validation::validate_update(k, &new, old, false, gates);
    if !errs.is_empty() {
        return Err(validation::invalid(k, name, &errs));
    }
    Ok(new)
}

impl Store {
    /// An empty store holding the namespaces every cluster has.
    pub fn new(registry: Arc<Registry>, history_limit: usize, watch_buffer: usize) -> Self {
        let n = registry.kinds().len();
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1);
        let mut store = Self {
            objects: vec![BTreeMap::new(); n],
            watchers: (0..n).map(|_| Vec::new()).collect(),
            registry,
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            history_floor: 0,
            watch_buffer: watch_buffer.max(1),
            rng: seed | 1,
            gates: FeatureGates::default(),
        };
        if let Some(ns_kind) = store.registry.core("namespaces") {
            for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                // Creating the well-known namespaces into an empty store cannot fail.
                let _ = store.create(ns_kind, "", json!({"metadata": {"name": name}}), false);
            }
        }
        store
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The feature gates writes are handled with (1.34's defaults unless set).
    pub fn feature_gates(&self) -> &FeatureGates {
        &self.gates
    }

    pub fn set_feature_gates(&mut self, gates: FeatureGates) {
        self.gates = gates;
    }

    /// The newest resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    fn kind(&self, id: KindId) -> &Kind {
        self.registry.get(id)
    }

    fn next_random(&mut self) -> u64 {
        // splitmix64: good enough for UIDs and generated names in tests.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn new_uid(&mut self) -> String {
        let (a, b) = (self.next_random(), self.next_random());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            ((b >> 48) & 0x3fff) | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn generated_suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        (0..5)
            .map(|_| ALPHABET[(self.next_random() % ALPHABET.len() as u64) as usize] as char)
            .collect()
    }

    /// Reads one object.
    pub fn get(&self, kind: KindId, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.objects[kind]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(self.kind(kind), name))
    }

    /// All current objects of a kind, in key order.
    pub fn all(&self, kind: KindId) -> impl Iterator<Item = &Arc<Value>> {
        self.objects[kind].values()
    }

    /// The state of one kind at an older resourceVersion, rebuilt by undoing history.
    fn snapshot(&self, kind: KindId, at: u64) -> BTreeMap<ObjKey, Arc<Value>> {
        let mut m = self.objects[kind].clone();
        for ev in self.history.iter().rev().take_while(|e| e.rv > at) {
            if ev.kind != kind {
                continue;
            }
            let key = key_of(&ev.object);
            match &ev.prev {
                Some(p) => m.insert(key, p.clone()),
                None => m.remove(&key),
            };
        }
        m
    }

    /// LIST with selectors, paging and resourceVersion semantics.
    pub fn list(&self, kind: KindId, q: &ListQuery<'_>) -> Result<ListPage, ApiError> {
        let current = self.rv;
        let (at, start_after) = if let Some(token) = q.continue_token.filter(|t| !t.is_empty()) {
            let (rv, key) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            if rv < self.history_floor {
                return Err(ApiError::expired(CONTINUE_EXPIRED));
            }
            (rv, Some(key))
        } else {
            match q.resource_version.filter(|rv| !rv.is_empty() && *rv != "0") {
                None => (current, None),
                Some(rv) => {
                    let rv = parse_rv(rv)?;
                    if rv > current {
                        return Err(ApiError::too_large_resource_version(rv, current));
                    }
                    // Exact (explicitly, or implied by legacy paging) reads the old state.
                    if q.exact || q.limit.is_some() {
                        if rv < self.history_floor {
                            return Err(ApiError::expired(format!(
                                "too old resource version: {rv} ({})",
                                self.history_floor + 1
                            )));
                        }
                        (rv, None)
                    } else {
                        (current, None)
                    }
                }
            }
        };
        let source: Cow<'_, BTreeMap<ObjKey, Arc<Value>>> = if at < current {
            Cow::Owned(self.snapshot(kind, at))
        } else {
            Cow::Borrowed(&self.objects[kind])
        };
        let lower = match &start_after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        let filtered = !q.labels.is_empty() || !q.fields.is_empty();
        let mut matching = source
            .range((lower, Bound::Unbounded))
            .filter(|((ns, _), _)| q.namespace.is_none_or(|want| want == ns))
            .map(|(_, o)| o)
            .filter(|o| q.labels.matches(o) && q.fields.matches(o));
        let limit = q.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        let items: Vec<Arc<Value>> = matching.by_ref().take(limit).cloned().collect();
        let rest = matching.count() as u64;
        let (continue_token, remaining) = match items.last() {
            Some(last) if rest > 0 => (
                Some(encode_continue(at, &key_of(last))),
                (!filtered).then_some(rest),
            ),
            _ => (None, None),
        };
        Ok(ListPage {
            items,
            resource_version: at,
            continue_token,
            remaining,
        })
    }

    fn namespace_state(&self, ns: &str) -> Option<&Arc<Value>> {
        let nk = self.registry.core("namespaces")?;
        self.objects[nk].get(&(String::new(), ns.to_string()))
    }

    fn default_storage_class(&self) -> Option<String> {
        let sc = self
            .registry
            .lookup("storage.k8s.io", "v1", "storageclasses")?;
        self.objects[sc]
            .values()
            .filter(|o| {
                o.pointer("/metadata/annotations/storageclass.kubernetes.io~1is-default-class")
                    .and_then(Value::as_str)
                    == Some("true")
            })
            .max_by_key(|o| {
                (
                    meta_str(o, "creationTimestamp").to_string(),
                    resource_version_of(o),
                )
            })
            .map(|o| meta_str(o, "name").to_string())
    }

    /// The PersistentVolumeClaimResize admission (validating, after the
    /// strategy's validation): a claim may grow only when bound and when its
    /// StorageClass allows volume expansion.
    fn admit_claim_resize(&self, k: &Kind, old: &Value, new: &Value) -> Result<(), ApiError> {
        let size = |v: &Value| {
            v.pointer("/spec/resources/requests/storage")
                .and_then(super::quantity::from_json)
                .and_then(Result::ok)
        };
        let (Some(new_size), old_size) = (size(new), size(old)) else {
            return Ok(());
        };
        if old_size.is_some_and(|o| new_size <= o) || old_size.is_none() && new_size.is_zero() {
            return Ok(());
        }
        let name = meta_str(new, "name");
        if old.pointer("/status/phase").and_then(Value::as_str) != Some("Bound") {
            return Err(ApiError::forbidden(
                k,
                name,
                "Only bound persistent volume claims can be expanded",
            ));
        }
        // The beta annotation wins over spec.storageClassName, as GetPersistentVolumeClaimClass.
        let class = |v: &Value| {
            v.pointer("/metadata/annotations/volume.beta.kubernetes.io~1storage-class")
                .or_else(|| v.pointer("/spec/storageClassName"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let (new_class, old_class) = (class(new), class(old));
        let allowed = !new_class.is_empty()
            && new_class == old_class
            && self
                .registry
                .lookup("storage.k8s.io", "v1", "storageclasses")
                .and_then(|sc| self.objects[sc].get(&(String::new(), new_class.clone())))
                .and_then(|sc| sc.get("allowVolumeExpansion"))
                .and_then(Value::as_bool)
                == Some(true);
        if !allowed {
            return Err(ApiError::forbidden(
                k,
                name,
                "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
            ));
        }
        Ok(())
    }

    /// CREATE. `ns` is the namespace from the URL (ignored for cluster-scoped kinds).
    pub fn create(
        &mut self,
        kind: KindId,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        check_type(&k, &mut obj)?;
        if k.is_core("Secret") {
            normalize_secret(&k, &mut obj)?;
        }
        validation::canonicalize_quantities(&k, &mut obj)?;
        validation::check_times(&k, &obj)?;
        validation::drop_empty_collections(&k, &mut obj);
        apply_defaults(&k, &mut obj);
        let body_ns = meta_str(&obj, "namespace").to_string();
        if k.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let ns = if k.namespaced {
            ns.to_string()
        } else {
            String::new()
        };
        if k.namespaced {
            let ns_kind = self.registry.core("namespaces");
            match self.namespace_state(&ns) {
                None => {
                    let nk = ns_kind
                        .map(|id| self.kind(id).clone())
                        .unwrap_or_else(|| k.clone());
                    return Err(ApiError::not_found(&nk, &ns));
                }
                Some(n) if being_deleted(n) => {
                    return Err(ApiError::forbidden(
                        &k,
                        meta_str(&obj, "name"),
                        &format!(
                            "unable to create new content in namespace {ns} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let mut name = meta_str(&obj, "name").to_string();
        if name.is_empty() {
            let prefix = meta_str(&obj, "generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &k,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                ));
            }
            loop {
                name = format!("{prefix}{}", self.generated_suffix());
                if !self.objects[kind].contains_key(&(ns.clone(), name.clone())) {
                    break;
                }
            }
        }
        let uid = self.new_uid();
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), json!(name));
            if k.namespaced {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now_timestamp()));
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "generation",
            ] {
                m.remove(f);
            }
            if k.tracks_generation {
                m.insert("generation".into(), json!(1));
            }
        }
        if k.status_subresource {
            match k.initial_status() {
                Some(s) => obj["status"] = s,
                None => {
                    if let Value::Object(m) = &mut obj {
                        m.remove("status");
                    }
                }
            }
        }
        if k.is_core("Namespace") {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
        }
        if k.is_core("PersistentVolume")
            && let Some(Value::Object(st)) = obj.get_mut("status")
        {
            st.insert("lastPhaseTransitionTime".into(), json!(now_timestamp()));
        }
        // Mutating admission: DefaultStorageClass, StorageObjectInUseProtection.
        if k.is_core("PersistentVolumeClaim")
            && obj.pointer("/spec/storageClassName").is_none()
            && let Some(class) = self.default_storage_class()
        {
            obj["spec"]["storageClassName"] = json!(class);
        }
        protection::admit(&k, &mut obj, &self.gates);
        drop_disabled_spec_fields(&k, &mut obj, None, &self.gates);
        let errs = validation::validate_create(&k, &obj, &self.gates);
        if !errs.is_empty() {
            return Err(validation::invalid(&k, &name, &errs));
        }
        let key = (ns, name.clone());
        if self.objects[kind].contains_key(&key) {
            return Err(ApiError::already_exists(&k, &name));
        }
        if dry_run {
            return Ok(Arc::new(obj));
        }
        Ok(self.commit_put(kind, key, obj, EventType::Added))
    }

    /// UPDATE (PUT) of the object or its status.
    pub fn update(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        new: Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        let key = if k.namespaced {
            (ns.to_string(), name.to_string())
        } else {
            (String::new(), name.to_string())
        };
        let old = self.objects[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&k, name))?;
        let new = prepare_update(&k, &old, new, target, &key, &self.gates)?;
        if k.is_core("PersistentVolumeClaim") && target == Target::Main {
            self.admit_claim_resize(&k, &old, &new)?;
        }
        if new == *old {
            // The real server skips writes that change nothing: no new resourceVersion, no event.
            return Ok(old);
        }
        if dry_run {
            return Ok(Arc::new(new));
        }
        if being_deleted(&new) && finalizers(&new).is_empty() {
            // Removing the last finalizer completes the deletion; the response and the DELETED
            // event carry the object as this update left it, without finalizers.
            return Ok(self.commit_remove(kind, &key, Some(new)).unwrap_or(old));
        }
        Ok(self.commit_put(kind, key, new, EventType::Modified))
    }

    /// PATCH: applies the patch to the current object, then stores it as an update.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        target: Target,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let k = self.kind(kind).clone();
        let ns = if k.namespaced { ns } else { "" };
        let current = self.get(kind, ns, name)?;
        let mut doc = (*current).clone();
        let applied = match patch_type {
            PatchType::Merge => {
                if !patch.is_object() {
                    return Err(ApiError::bad_request(
                        "a JSON merge patch for an object must be a JSON object",
                    ));
                }
                merge_patch(&mut doc, patch);
                Ok(())
            }
            PatchType::Json => json_patch(&mut doc, patch),
            PatchType::Strategic if k.custom => {
                return Err(ApiError::unsupported_media_type(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                ));
            }
            PatchType::Strategic => strategic_merge_patch(&mut doc, patch, &|p| k.list_strategy(p)),
        };
        applied.map_err(|e| match e {
            PatchError::BadRequest(m) => ApiError::bad_request(m),
            PatchError::NotApplicable(m) => ApiError::patch_not_applicable(&m),
            PatchError::Unsupported(m) => ApiError::unsupported_media_type(m),
        })?;
        if !doc.is_object() {
            return Err(ApiError::bad_request(
                "the patched document is not a JSON object",
            ));
        }
        self.update(kind, ns, name, doc, target, dry_run)
    }

    /// DELETE with preconditions and finalizer handling. Deleting a namespace
    /// also deletes everything in it, as the namespace controller would.
    pub fn delete(
        &mut self,
        kind: KindId,
        ns: &str,
        name: &str,
        pre: &Preconditions,
        dry_run: bool,
    ) -> Result<Deleted, ApiError> {
        let k = self.kind(kind).clone();
        let key = if k.namespaced {
            (ns.to_string(), name.to_string())
        } else {
            (String::new(), name.to_string())
        };
        let old = self.objects[kind]
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&k, name))?;
        if let Some(uid) = pre.uid.as_deref().filter(|u| !u.is_empty())
            && uid != meta_str(&old, "uid")
        {
            return Err(ApiError::conflict(
                &k,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&old, "uid")
                ),
            ));
        }
        if let Some(rv) = pre.resource_version.as_deref().filter(|r| !r.is_empty())
            && rv != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(
                &k,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&old, "resourceVersion")
                ),
            ));
        }
        if dry_run {
            return Ok(if finalizers(&old).is_empty() && !k.is_core("Namespace") {
                Deleted::Removed(old)
            } else {
                Deleted::Pending(old)
            });
        }
        if k.is_core("Namespace") {
            return Ok(self.delete_namespace(kind, key, old));
        }
        Ok(self.delete_object(kind, key, old))
    }

    fn mark_deleted(obj: &Value) -> Value {
        let mut marked = obj.clone();
        let m = meta_mut(&mut marked);
        m.insert("deletionTimestamp".into(), json!(now_timestamp()));
        m.insert("deletionGracePeriodSeconds".into(), json!(0));
        if let Some(generation) = m
            .get("generation")
            .and_then(Value::as_i64)
            .filter(|g| *g > 0)
        {
            m.insert("generation".into(), json!(generation + 1));
        }
        marked
    }

    fn delete_object(&mut self, kind: KindId, key: ObjKey, old: Arc<Value>) -> Deleted {
        if finalizers(&old).is_empty() {
            return Deleted::Removed(self.commit_remove(kind, &key, None).unwrap_or(old));
        }
        if being_deleted(&old) {
            return Deleted::Pending(old);
        }
        let marked = Self::mark_deleted(&old);
        Deleted::Pending(self.commit_put(kind, key, marked, EventType::Modified))
    }

    fn delete_namespace(&mut self, kind: KindId, key: ObjKey, old: Arc<Value>) -> Deleted {
        let ns = key.1.clone();
        let mut current = old.clone();
        if !being_deleted(&old) {
            let mut marked = Self::mark_deleted(&old);
            marked["status"] = json!({"phase": "Terminating"});
            current = self.commit_put(kind, key.clone(), marked, EventType::Modified);
        }
        let namespaced: Vec<KindId> = (0..self.objects.len())
            .filter(|id| self.kind(*id).namespaced)
            .collect();
        for id in namespaced {
            let keys: Vec<(ObjKey, Arc<Value>)> = self.objects[id]
                .iter()
                .filter(|((n, _), _)| *n == ns)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (k, v) in keys {
                self.delete_object(id, k, v);
            }
        }
        // The last removal inside the namespace removes the namespace (see commit_remove).
        match self.objects[kind].get(&key) {
            Some(still) if self.namespace_is_empty(&ns) => {
                let still = still.clone();
                Deleted::Removed(self.commit_remove(kind, &key, None).unwrap_or(still))
            }
            Some(still) => Deleted::Pending(still.clone()),
            None => Deleted::Removed(current),
        }
    }

    fn namespace_is_empty(&self, ns: &str) -> bool {
        self.objects
            .iter()
            .enumerate()
            .filter(|(id, _)| self.kind(*id).namespaced)
            .all(|(_, objs)| !objs.keys().any(|(n, _)| n == ns))
    }

    fn commit_put(
        &mut self,
        kind: KindId,
        key: ObjKey,
        mut obj: Value,
        etype: EventType,
    ) -> Arc<Value> {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let obj = Arc::new(obj);
        let prev = self.objects[kind].insert(key, obj.clone());
        self.record(kind, etype, obj.clone(), prev);
        obj
    }

    /// Removes an object; its last state is `last`, or what was stored.
    fn commit_remove(
        &mut self,
        kind: KindId,
        key: &ObjKey,
        last: Option<Value>,
    ) -> Option<Arc<Value>> {
        let prev = self.objects[kind].remove(key)?;
        self.rv += 1;
        let mut gone = last.unwrap_or_else(|| (*prev).clone());
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let gone = Arc::new(gone);
        self.record(kind, EventType::Deleted, gone.clone(), Some(prev));
        if self.kind(kind).namespaced {
            let ns = &key.0;
            let terminating = self.namespace_state(ns).is_some_and(|n| being_deleted(n));
            if terminating
                && self.namespace_is_empty(ns)
                && let Some(nk) = self.registry.core("namespaces")
            {
                self.commit_remove(nk, &(String::new(), ns.clone()), None);
            }
        }
        Some(gone)
    }

    fn record(
        &mut self,
        kind: KindId,
        etype: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let ev = Arc::new(WatchEvent::new(kind, etype, self.rv, object, prev));
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.history_floor = old.rv;
            }
        }
        // A watcher that cannot keep up is closed, as the real server does; its
        // client re-watches from the last resourceVersion it saw.
        self.watchers[kind].retain(|w| w.tx.try_send(ev.clone()).is_ok());
    }

    /// Registers a watch on one kind.
    pub fn watch(&mut self, kind: KindId, from: WatchFrom) -> Result<WatchStart, ApiError> {
        let (initial, after) = match from {
            WatchFrom::Current => {
                let initial = self.objects[kind]
                    .values()
                    .map(|o| {
                        Arc::new(WatchEvent::new(
                            kind,
                            EventType::Added,
                            resource_version_of(o),
                            o.clone(),
                            None,
                        ))
                    })
                    .collect();
                (initial, self.rv)
            }
            WatchFrom::After(rv) => {
                if rv < self.history_floor {
                    return Err(ApiError::expired(format!(
                        "too old resource version: {rv} ({})",
                        self.history_floor + 1
                    )));
                }
                let initial = self
                    .history
                    .iter()
                    .filter(|e| e.rv > rv && e.kind == kind)
                    .cloned()
                    .collect();
                (initial, rv.max(self.rv))
            }
        };
        let (tx, events) = mpsc::channel(self.watch_buffer);
        self.watchers[kind].push(Watcher { tx });
        Ok(WatchStart {
            initial,
            events,
            after,
        })
    }

    /// Ends open watches (of one kind, or all): their streams finish after the buffered events.
    pub fn close_watches(&mut self, kind: Option<KindId>) {
        for (id, ws) in self.watchers.iter_mut().enumerate() {
            if kind.is_none_or(|k| k == id) {
                ws.clear();
            }
        }
    }

    /// Forgets the event history, as an etcd compaction does: watches and
    /// continue tokens from before now get `410 Gone`.
    pub fn compact(&mut self) {
        self.history.clear();
        self.history_floor = self.rv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (Store, KindId, KindId, KindId) {
        let reg = Arc::new(Registry::builtin());
        let pvc = reg.core("persistentvolumeclaims").unwrap();
        let pv = reg.core("persistentvolumes").unwrap();
        let vs = reg
            .lookup("snapshot.storage.k8s.io", "v1", "volumesnapshots")
            .unwrap();
        (Store::new(reg, 100, 100), pvc, pv, vs)
    }

    fn pvc(name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    }

    fn pv_spec() -> Value {
        json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
               "csi": {"driver": "d.example.com", "volumeHandle": "h"}})
    }

    #[test]
    fn create_fills_system_fields_and_rejects_duplicates() {
        let (mut s, pvc_k, _, _) = store();
        let rv0 = s.resource_version();
        let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        assert_eq!(o["metadata"]["namespace"], "default");
        assert_eq!(resource_version_of(&o), rv0 + 1);
        assert_eq!(o["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert_eq!(o["status"], json!({"phase": "Pending"}));
        assert!(o["metadata"].get("generation").is_none());
        let e = s.create(pvc_k, "default", pvc("a"), false).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        let e = s.create(pvc_k, "nope", pvc("b"), false).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (404, "namespaces \"nope\" not found")
        );
        let e = s
            .create(pvc_k, "default", pvc("#%123-invalid-name"), false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let g = s
            .create(
                pvc_k,
                "default",
                json!({"metadata": {"generateName": "gen-"}, "spec": pvc("x")["spec"]}),
                false,
            )
            .unwrap();
        assert!(g["metadata"]["name"].as_str().unwrap().starts_with("gen-"));
        let e = s
            .create(
                pvc_k,
                "default",
                json!({"kind": "Pod", "metadata": {"name": "x"}}),
                false,
            )
            .unwrap_err();
        assert_eq!(e.code, 400);
    }

    #[test]
    fn update_checks_resource_version_and_keeps_status() {
        let (mut s, pvc_k, _, _) = store();
        let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        let mut stale = (*o).clone();
        stale["spec"]["volumeName"] = json!("pv-1");
        stale["status"] = json!({"phase": "Bound"});
        let u = s
            .update(pvc_k, "default", "a", stale.clone(), Target::Main, false)
            .unwrap();
        assert_eq!(u["spec"]["volumeName"], "pv-1");
        assert_eq!(u["status"]["phase"], "Pending", "main writes ignore status");
        let e = s
            .update(pvc_k, "default", "a", stale.clone(), Target::Main, false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        let mut unconditional = stale.clone();
        unconditional["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        unconditional["metadata"]["labels"] = json!({"l": "v"});
        let u2 = s
            .update(
                pvc_k,
                "default",
                "a",
                unconditional.clone(),
                Target::Main,
                false,
            )
            .unwrap();
        assert_eq!(u2["metadata"]["labels"]["l"], "v");
        // volumeName is set once; after that the spec is immutable.
        unconditional["spec"]["volumeName"] = json!("pv-2");
        let e = s
            .update(pvc_k, "default", "a", unconditional, Target::Main, false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        let mut st = (*u2).clone();
        st["status"] = json!({"phase": "Bound"});
        st["spec"]["volumeName"] = json!("ignored");
        let u3 = s
            .update(pvc_k, "default", "a", st, Target::Status, false)
            .unwrap();
        assert_eq!(u3["status"]["phase"], "Bound");
        assert_eq!(
            u3["spec"]["volumeName"], "pv-1",
            "status writes ignore the spec"
        );
        let same = s
            .update(pvc_k, "default", "a", (*u3).clone(), Target::Main, false)
            .unwrap();
        assert_eq!(
            resource_version_of(&same),
            resource_version_of(&u3),
            "no-op updates do not bump"
        );
    }

    #[test]
    fn generation_tracks_spec_changes_for_kinds_that_have_it() {
        let (mut s, _, _, vs) = store();
        let o = s
            .create(vs, "default", json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "s"}, "spec": {"a": 1}, "status": {"x": 1}}), false)
            .unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        assert!(o.get("status").is_none(), "status is dropped on create");
        let mut m = (*o).clone();
        m["metadata"]["labels"] = json!({"l": "v"});
        let o = s
            .update(vs, "default", "s", m, Target::Main, false)
            .unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        let mut m = (*o).clone();
        m["spec"]["a"] = json!(2);
        let o = s
            .update(vs, "default", "s", m, Target::Main, false)
            .unwrap();
        assert_eq!(o["metadata"]["generation"], 2);
    }

    #[test]
    fn finalizers_defer_deletion_until_removed() {
        let (mut s, _, pv, _) = store();
        s.create(
            pv,
            "",
            json!({"metadata": {"name": "pv", "finalizers": ["a/b"]}, "spec": pv_spec()}),
            false,
        )
        .unwrap();
        let Deleted::Pending(o) = s
            .delete(pv, "", "pv", &Preconditions::default(), false)
            .unwrap()
        else {
            panic!()
        };
        assert!(o["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 0);
        let Deleted::Pending(again) = s
            .delete(pv, "", "pv", &Preconditions::default(), false)
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(resource_version_of(&again), resource_version_of(&o));
        let e = s
            .patch(
                pv,
                "",
                "pv",
                PatchType::Merge,
                &json!({"metadata": {"finalizers": ["a/b", "new"]}}),
                Target::Main,
                false,
            )
            .unwrap_err();
        assert_eq!(e.code, 422);
        let last = s
            .patch(
                pv,
                "",
                "pv",
                PatchType::Json,
                // Admission added kubernetes.io/pv-protection after a/b.
                &json!([{"op": "remove", "path": "/metadata/finalizers/1"},
                        {"op": "remove", "path": "/metadata/finalizers/0"}]),
                Target::Main,
                false,
            )
            .unwrap();
        assert_eq!(s.get(pv, "", "pv").unwrap_err().code, 404);
        // The response is the object as the patch left it, as a real server answers.
        assert_eq!(last["metadata"]["finalizers"], json!([]));
        assert!(last["metadata"]["deletionTimestamp"].is_string());
    }

    #[test]
    fn delete_preconditions_conflict() {
        let (mut s, pvc_k, _, _) = store();
        s.create(pvc_k, "default", pvc("a"), false).unwrap();
        let pre = Preconditions {
            uid: Some("other".into()),
            resource_version: None,
        };
        assert_eq!(
            s.delete(pvc_k, "default", "a", &pre, false)
                .unwrap_err()
                .code,
            409
        );
        let pre = Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        };
        assert_eq!(
            s.delete(pvc_k, "default", "a", &pre, false)
                .unwrap_err()
                .code,
            409
        );
        // The pvc-protection finalizer from admission keeps the claim.
        assert!(matches!(
            s.delete(pvc_k, "default", "a", &Preconditions::default(), false)
                .unwrap(),
            Deleted::Pending(_)
        ));
    }

    #[test]
    fn list_pages_are_consistent_snapshots() {
        let (mut s, pvc_k, _, _) = store();
        for n in ["a", "b", "c"] {
            s.create(pvc_k, "default", pvc(n), false).unwrap();
        }
        let q = ListQuery {
            limit: Some(2),
            ..Default::default()
        };
        let p1 = s.list(pvc_k, &q).unwrap();
        assert_eq!(p1.items.len(), 2);
        assert_eq!(p1.remaining, Some(1));
        s.delete(pvc_k, "default", "c", &Preconditions::default(), false)
            .unwrap();
        s.create(pvc_k, "default", pvc("d"), false).unwrap();
        let q2 = ListQuery {
            limit: Some(2),
            continue_token: p1.continue_token.as_deref(),
            ..Default::default()
        };
        let p2 = s.list(pvc_k, &q2).unwrap();
        let names: Vec<_> = p2
            .items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["c"], "the second page reads the state of the first");
        assert_eq!(p2.resource_version, p1.resource_version);
        assert!(p2.continue_token.is_none());
        s.compact();
        assert_eq!(s.list(pvc_k, &q2).unwrap_err().code, 410);
    }

    #[test]
    fn list_filters_by_namespace_and_selectors() {
        let (mut s, pvc_k, _, _) = store();
        let mut o = pvc("a");
        o["metadata"]["labels"] = json!({"app": "x"});
        s.create(pvc_k, "default", o, false).unwrap();
        s.create(pvc_k, "kube-system", pvc("b"), false).unwrap();
        let all = s.list(pvc_k, &ListQuery::default()).unwrap();
        assert_eq!(all.items.len(), 2);
        let q = ListQuery {
            namespace: Some("kube-system"),
            ..Default::default()
        };
        assert_eq!(s.list(pvc_k, &q).unwrap().items.len(), 1);
        let q = ListQuery {
            labels: LabelSelector::parse("app=x").unwrap(),
            ..Default::default()
        };
        assert_eq!(s.list(pvc_k, &q).unwrap().items[0]["metadata"]["name"], "a");
        let q = ListQuery {
            resource_version: Some("999999"),
            ..Default::default()
        };
        assert_eq!(s.list(pvc_k, &q).unwrap_err().code, 504);
    }

    #[test]
    fn watch_replays_history_and_expires_when_compacted() {
        let (mut s, _, _, _) = store();
        let pvc_k = s.registry().core("configmaps").unwrap();
        let pvc = |n: &str| json!({"metadata": {"name": n}});
        let a = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        let rv = resource_version_of(&a);
        s.create(pvc_k, "default", pvc("b"), false).unwrap();
        let w = s.watch(pvc_k, WatchFrom::After(rv)).unwrap();
        assert_eq!(w.initial.len(), 1);
        assert_eq!(w.initial[0].object["metadata"]["name"], "b");
        let mut live = s.watch(pvc_k, WatchFrom::Current).unwrap();
        assert_eq!(live.initial.len(), 2);
        s.delete(pvc_k, "default", "a", &Preconditions::default(), false)
            .unwrap();
        let ev = live.events.try_recv().unwrap();
        assert_eq!(ev.etype, EventType::Deleted);
        assert_eq!(resource_version_of(&ev.object), s.resource_version());
        s.compact();
        assert_eq!(s.watch(pvc_k, WatchFrom::After(rv)).unwrap_err().code, 410);
        s.close_watches(None);
        assert!(live.events.try_recv().is_err());
    }

    #[test]
    fn deleting_a_namespace_deletes_its_content() {
        let (mut s, pvc_k, _, _) = store();
        let ns_k = s.registry().core("namespaces").unwrap();
        s.create(ns_k, "", json!({"metadata": {"name": "t"}}), false)
            .unwrap();
        s.create(
            pvc_k,
            "t",
            json!({"metadata": {"name": "a", "finalizers": ["x/y"]}, "spec": pvc("a")["spec"]}),
            false,
        )
        .unwrap();
        let Deleted::Pending(ns) = s
            .delete(ns_k, "", "t", &Preconditions::default(), false)
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(ns["status"]["phase"], "Terminating");
        assert_eq!(s.create(pvc_k, "t", pvc("b"), false).unwrap_err().code, 403);
        s.patch(
            pvc_k,
            "t",
            "a",
            PatchType::Merge,
            &json!({"metadata": {"finalizers": null}}),
            Target::Main,
            false,
        )
        .unwrap();
        assert_eq!(s.get(ns_k, "", "t").unwrap_err().code, 404);
    }

    #[test]
    fn history_window_is_bounded() {
        let reg = Arc::new(Registry::builtin());
        let pvc_k = reg.core("persistentvolumeclaims").unwrap();
        let mut s = Store::new(reg, 3, 10);
        for n in ["a", "b", "c", "d", "e"] {
            s.create(pvc_k, "default", pvc(n), false).unwrap();
        }
        let rv = s.resource_version();
        assert!(s.watch(pvc_k, WatchFrom::After(rv - 3)).is_ok());
        assert_eq!(
            s.watch(pvc_k, WatchFrom::After(rv - 4)).unwrap_err().code,
            410
        );
    }

    #[test]
    fn strategic_patch_is_refused_for_custom_kinds() {
        let (mut s, _, _, vs) = store();
        s.create(vs, "default", json!({"metadata": {"name": "s"}}), false)
            .unwrap();
        let e = s
            .patch(
                vs,
                "default",
                "s",
                PatchType::Strategic,
                &json!({}),
                Target::Main,
                false,
            )
            .unwrap_err();
        assert_eq!(e.code, 415);
    }

    #[test]
    fn secret_string_data_is_merged_into_data_and_dropped() {
        let (mut s, _, _, _) = store();
        let sk = s.registry().core("secrets").unwrap();
        let o = s
            .create(
                sk,
                "default",
                json!({"metadata": {"name": "s"}, "data": {"a": "b2xk", "b": "Yg=="}, "stringData": {"a": "new", "c": "h\u{e9}"}}),
                false,
            )
            .unwrap();
        assert!(o.get("stringData").is_none());
        assert_eq!(
            o["data"],
            json!({"a": "bmV3", "b": "Yg==", "c": "aMOp"}),
            "stringData wins, values are the UTF-8 bytes"
        );
        assert_eq!(o["type"], "Opaque");
        let o = s
            .patch(
                sk,
                "default",
                "s",
                PatchType::Merge,
                &json!({"stringData": {"b": "x"}}),
                Target::Main,
                false,
            )
            .unwrap();
        assert_eq!(o["data"]["b"], "eA==");
        assert!(o.get("stringData").is_none());
        let mut u = (*o).clone();
        u["stringData"] = json!({"d": ""});
        let o = s
            .update(sk, "default", "s", u, Target::Main, false)
            .unwrap();
        assert_eq!(o["data"]["d"], "");
        assert!(o.get("stringData").is_none());
        let e = s
            .create(
                sk,
                "default",
                json!({"metadata": {"name": "bad"}, "data": {"a": "not base64!"}}),
                false,
            )
            .unwrap_err();
        assert_eq!(e.code, 400);
        let e = s
            .create(
                sk,
                "default",
                json!({"metadata": {"name": "bad"}, "stringData": {"a/b": "x"}}),
                false,
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
    }

    #[test]
    fn storage_kinds_get_the_real_servers_defaults() {
        let (mut s, pvc_k, pv_k, _) = store();
        let sc = s
            .registry()
            .lookup("storage.k8s.io", "v1", "storageclasses")
            .unwrap();
        let o = s
            .create(
                sc,
                "",
                json!({"metadata": {"name": "c"}, "provisioner": "x"}),
                false,
            )
            .unwrap();
        assert_eq!(
            (o["reclaimPolicy"].as_str(), o["volumeBindingMode"].as_str()),
            (Some("Delete"), Some("Immediate"))
        );
        let o = s
            .create(
                pv_k,
                "",
                json!({"metadata": {"name": "v"}, "spec": pv_spec()}),
                false,
            )
            .unwrap();
        assert_eq!(o["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(o["spec"]["volumeMode"], "Filesystem");
        let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        assert_eq!(o["spec"]["volumeMode"], "Filesystem");
        let mut block = pvc("b");
        block["spec"]["volumeMode"] = json!("Block");
        let o = s.create(pvc_k, "default", block, false).unwrap();
        assert_eq!(o["spec"]["volumeMode"], "Block");
        // Updates are defaulted too: dropping the field does not remove it.
        let o = s
            .patch(
                pv_k,
                "",
                "v",
                PatchType::Merge,
                &json!({"spec": {"volumeMode": null}}),
                Target::Main,
                false,
            )
            .unwrap();
        assert_eq!(o["spec"]["volumeMode"], "Filesystem");
    }

    #[test]
    fn default_storage_class_is_assigned() {
        let (mut s, pvc_k, _, _) = store();
        let sc = s
            .registry()
            .lookup("storage.k8s.io", "v1", "storageclasses")
            .unwrap();
        s.create(sc, "", json!({"metadata": {"name": "std", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "x"}), false).unwrap();
        let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        assert_eq!(o["spec"]["storageClassName"], "std");
        let mut explicit = pvc("b");
        explicit["spec"]["storageClassName"] = json!("");
        assert_eq!(
            s.create(pvc_k, "default", explicit, false).unwrap()["spec"]["storageClassName"],
            ""
        );
    }

    #[test]
    fn claim_data_sources_are_normalized_like_upstream() {
        let (mut s, pvc_k, _, _) = store();
        let mut c = pvc("a");
        c["spec"]["dataSource"] = json!({"kind": "PersistentVolumeClaim", "name": "src"});
        let o = s.create(pvc_k, "default", c, false).unwrap();
        assert_eq!(
            o["spec"]["dataSourceRef"],
            json!({"apiGroup": null, "kind": "PersistentVolumeClaim", "name": "src"})
        );
        assert_eq!(o["spec"]["dataSource"]["apiGroup"], Value::Null);
        let mut c = pvc("b");
        c["spec"]["dataSource"] = json!({"apiGroup": "example.com", "kind": "Widget", "name": "w"});
        let o = s.create(pvc_k, "default", c, false).unwrap();
        assert!(o["spec"].get("dataSource").is_none() && o["spec"].get("dataSourceRef").is_none());
        let mut c = pvc("c");
        c["spec"]["dataSourceRef"] =
            json!({"kind": "PersistentVolumeClaim", "name": "src", "namespace": "x"});
        let o = s.create(pvc_k, "default", c.clone(), false).unwrap();
        assert!(
            o["spec"].get("dataSourceRef").is_none(),
            "CrossNamespaceVolumeDataSource is off"
        );
        s.set_feature_gates(
            FeatureGates::default().with(Gate::CrossNamespaceVolumeDataSource, true),
        );
        c["metadata"]["name"] = json!("d");
        let o = s.create(pvc_k, "default", c, false).unwrap();
        assert_eq!(o["spec"]["dataSourceRef"]["namespace"], "x");
        assert!(o["spec"].get("dataSource").is_none());
    }

    #[test]
    fn status_writes_keep_the_metadata_their_kind_says() {
        let (mut s, pvc_k, _, vs) = store();
        let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
        let mut st = (*o).clone();
        st["metadata"]["labels"] = json!({"from": "status"});
        st["status"] = json!({"phase": "Pending", "conditions": []});
        let u = s
            .update(pvc_k, "default", "a", st, Target::Status, false)
            .unwrap();
        assert_eq!(
            u["metadata"]["labels"]["from"], "status",
            "PVC: request metadata"
        );
        let va = s
            .registry()
            .lookup("storage.k8s.io", "v1", "volumeattachments")
            .unwrap();
        let o = s
            .create(va, "", json!({"metadata": {"name": "va", "labels": {"a": "1"}},
                "spec": {"attacher": "d.example.com", "nodeName": "n", "source": {"persistentVolumeName": "pv"}}}), false)
            .unwrap();
        let mut st = (*o).clone();
        st["metadata"]["labels"] = json!({"a": "2"});
        st["status"] = json!({"attached": true});
        let u = s.update(va, "", "va", st, Target::Status, false).unwrap();
        assert_eq!(u["metadata"]["labels"]["a"], "1", "VolumeAttachment: reset");
        assert_eq!(u["status"]["attached"], true);
        let o = s
            .create(
                vs,
                "default",
                json!({"metadata": {"name": "s"}, "spec": {}}),
                false,
            )
            .unwrap();
        let mut st = (*o).clone();
        st["metadata"]["annotations"] = json!({"x": "y"});
        st["status"] = json!({"readyToUse": true});
        let u = s
            .update(vs, "default", "s", st, Target::Status, false)
            .unwrap();
        assert!(
            u["metadata"].get("annotations").is_none(),
            "custom resources: status only"
        );
    }

    #[test]
    fn gated_status_fields_are_dropped_unless_already_stored() {
        let (mut s, _, _, _) = store();
        let va = s
            .registry()
            .lookup("storage.k8s.io", "v1", "volumeattachments")
            .unwrap();
        let o = s
            .create(va, "", json!({"metadata": {"name": "va"},
                "spec": {"attacher": "d.example.com", "nodeName": "n", "source": {"persistentVolumeName": "pv"}}}), false)
            .unwrap();
        let with_code = |o: &Value| {
            let mut st = o.clone();
            st["status"] =
                json!({"attached": false, "attachError": {"message": "m", "errorCode": 3}});
            st
        };
        let u = s
            .update(va, "", "va", with_code(&o), Target::Status, false)
            .unwrap();
        assert!(u["status"]["attachError"].get("errorCode").is_none());
        s.set_feature_gates(
            FeatureGates::default().with(Gate::MutableCSINodeAllocatableCount, true),
        );
        let u = s
            .update(va, "", "va", with_code(&u), Target::Status, false)
            .unwrap();
        assert_eq!(u["status"]["attachError"]["errorCode"], 3);
        // Off again: a code already stored is kept.
        s.set_feature_gates(FeatureGates::default());
        let mut st = (*u).clone();
        st["status"]["attachError"]["errorCode"] = json!(4);
        let u = s.update(va, "", "va", st, Target::Status, false).unwrap();
        assert_eq!(u["status"]["attachError"]["errorCode"], 4);
        // No unconditional updates of VolumeAttachments.
        let mut main = (*u).clone();
        main["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        let e = s
            .update(va, "", "va", main, Target::Main, false)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
    }
}
