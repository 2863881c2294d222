//! The Kubernetes protobuf wire format for a few kinds: what client-go's typed
//! clients and kubectl's imperative commands send as
//! `application/vnd.kubernetes.protobuf`.
//!
//! A body is the 4 magic bytes `k8s\0`, then a `runtime.Unknown` message
//! whose `raw` field holds the object's own message. The messages below are
//! our own definitions of the upstream ones (field numbers as published in the
//! API's generated.proto); only the kinds in [`SUPPORTED`] are converted, to
//! and from the JSON the store keeps.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use prost::Message;
use serde_json::{Map, Value, json};

/// The media type of the protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// `k8s` and the encoding style 0 (a `runtime.Unknown` follows).
pub const MAGIC: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

/// `(apiVersion, kind)` of the objects this module converts.
pub const SUPPORTED: &[(&str, &str)] =
    &[("v1", "Namespace"), ("v1", "Secret"), ("v1", "ConfigMap")];

/// Why a protobuf body could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("the body does not start with the protobuf magic number")]
    Magic,
    #[error("decoding protobuf: {0}")]
    Decode(String),
    #[error("no protobuf encoding for {api_version}, Kind={kind} in this server")]
    Unsupported { api_version: String, kind: String },
    #[error("the object cannot be encoded: {0}")]
    Encode(String),
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    pub api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub kind: Option<String>,
}

/// `runtime.Unknown`, the envelope.
#[derive(Clone, PartialEq, Message)]
pub struct Unknown {
    #[prost(message, optional, tag = "1")]
    pub type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    pub content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub content_type: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Time {
    #[prost(int64, optional, tag = "1")]
    pub seconds: Option<i64>,
    #[prost(int32, optional, tag = "2")]
    pub nanos: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    pub kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    pub controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    pub block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
pub struct FieldsV1 {
    #[prost(bytes = "vec", optional, tag = "1")]
    pub raw: Option<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ManagedFieldsEntry {
    #[prost(string, optional, tag = "1")]
    pub manager: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub operation: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub api_version: Option<String>,
    #[prost(message, optional, tag = "4")]
    pub time: Option<Time>,
    #[prost(string, optional, tag = "6")]
    pub fields_type: Option<String>,
    #[prost(message, optional, tag = "7")]
    pub fields_v1: Option<FieldsV1>,
    #[prost(string, optional, tag = "8")]
    pub subresource: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    pub generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    pub creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<Time>,
    #[prost(int64, optional, tag = "10")]
    pub deletion_grace_period_seconds: Option<i64>,
    #[prost(btree_map = "string, string", tag = "11")]
    pub labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    pub owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
    #[prost(message, repeated, tag = "17")]
    pub managed_fields: Vec<ManagedFieldsEntry>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ListMeta {
    #[prost(string, optional, tag = "1")]
    pub self_link: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub r#continue: Option<String>,
    #[prost(int64, optional, tag = "4")]
    pub remaining_item_count: Option<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespaceCondition {
    #[prost(string, optional, tag = "1")]
    pub r#type: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub status: Option<String>,
    #[prost(message, optional, tag = "4")]
    pub last_transition_time: Option<Time>,
    #[prost(string, optional, tag = "5")]
    pub reason: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespaceSpec {
    #[prost(string, repeated, tag = "1")]
    pub finalizers: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamespaceStatus {
    #[prost(string, optional, tag = "1")]
    pub phase: Option<String>,
    #[prost(message, repeated, tag = "2")]
    pub conditions: Vec<NamespaceCondition>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Namespace {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    pub spec: Option<NamespaceSpec>,
    #[prost(message, optional, tag = "3")]
    pub status: Option<NamespaceStatus>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Secret {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, bytes", tag = "2")]
    pub data: BTreeMap<String, Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    pub r#type: Option<String>,
    #[prost(btree_map = "string, string", tag = "4")]
    pub string_data: BTreeMap<String, String>,
    #[prost(bool, optional, tag = "5")]
    pub immutable: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ConfigMap {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, string", tag = "2")]
    pub data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    pub binary_data: BTreeMap<String, Vec<u8>>,
    #[prost(bool, optional, tag = "4")]
    pub immutable: Option<bool>,
}

/// Any `<Kind>List`: list metadata and the items' own messages, kept encoded.
#[derive(Clone, PartialEq, Message)]
pub struct RawList {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    pub items: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Preconditions {
    #[prost(string, optional, tag = "1")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub resource_version: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct DeleteOptions {
    #[prost(int64, optional, tag = "1")]
    pub grace_period_seconds: Option<i64>,
    #[prost(message, optional, tag = "2")]
    pub preconditions: Option<Preconditions>,
    #[prost(bool, optional, tag = "3")]
    pub orphan_dependents: Option<bool>,
    #[prost(string, optional, tag = "4")]
    pub propagation_policy: Option<String>,
    #[prost(string, repeated, tag = "5")]
    pub dry_run: Vec<String>,
}

/// Whether a media type (without parameters) is the protobuf encoding.
pub fn is_protobuf(media: &str) -> bool {
    media.trim().eq_ignore_ascii_case(MEDIA_TYPE)
}

/// Whether objects of this `apiVersion`/`kind` have a protobuf encoding here.
pub fn supported(api_version: &str, kind: &str) -> bool {
    SUPPORTED.contains(&(api_version, kind))
}

/// Splits an enveloped body into its type and the object's message bytes.
pub fn unwrap_envelope(body: &[u8]) -> Result<(String, String, Vec<u8>), ProtoError> {
    let rest = body.strip_prefix(&MAGIC[..]).ok_or(ProtoError::Magic)?;
    let unknown = Unknown::decode(rest).map_err(|e| ProtoError::Decode(e.to_string()))?;
    let tm = unknown.type_meta.unwrap_or_default();
    Ok((
        tm.api_version.unwrap_or_default(),
        tm.kind.unwrap_or_default(),
        unknown.raw.unwrap_or_default(),
    ))
}

/// Wraps an object's message bytes in the envelope.
pub fn wrap_envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_string()),
            kind: Some(kind.to_string()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let mut out = MAGIC.to_vec();
    out.extend(unknown.encode_to_vec());
    out
}

/// Decodes an enveloped object into the JSON the server works with.
pub fn decode_object(body: &[u8]) -> Result<Value, ProtoError> {
    let (api_version, kind, raw) = unwrap_envelope(body)?;
    let err = |e: prost::DecodeError| ProtoError::Decode(e.to_string());
    let mut v = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace_to_json(&Namespace::decode(&raw[..]).map_err(err)?),
        ("v1", "Secret") => secret_to_json(&Secret::decode(&raw[..]).map_err(err)?),
        ("v1", "ConfigMap") => configmap_to_json(&ConfigMap::decode(&raw[..]).map_err(err)?),
        _ => return Err(ProtoError::Unsupported { api_version, kind }),
    };
    v["apiVersion"] = json!(api_version);
    v["kind"] = json!(kind);
    Ok(v)
}

/// The message bytes of a JSON object of a supported kind (no envelope).
fn encode_raw(obj: &Value) -> Result<(String, String, Vec<u8>), ProtoError> {
    let api_version = str_at(obj, "apiVersion").unwrap_or_default();
    let kind = str_at(obj, "kind").unwrap_or_default();
    let raw = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => namespace_from_json(obj)?.encode_to_vec(),
        ("v1", "Secret") => secret_from_json(obj)?.encode_to_vec(),
        ("v1", "ConfigMap") => configmap_from_json(obj)?.encode_to_vec(),
        _ => return Err(ProtoError::Unsupported { api_version, kind }),
    };
    Ok((api_version, kind, raw))
}

/// Encodes a stored object, enveloped.
pub fn encode_object(obj: &Value) -> Result<Vec<u8>, ProtoError> {
    let (api_version, kind, raw) = encode_raw(obj)?;
    Ok(wrap_envelope(&api_version, &kind, raw))
}

/// Encodes a list of objects of one supported kind as `<kind>List`, enveloped.
pub fn encode_list(
    api_version: &str,
    kind: &str,
    items: &[&Value],
    meta: &Value,
) -> Result<Vec<u8>, ProtoError> {
    if !supported(api_version, kind) {
        return Err(ProtoError::Unsupported {
            api_version: api_version.into(),
            kind: kind.into(),
        });
    }
    let mut raw_items = Vec::with_capacity(items.len());
    for item in items {
        raw_items.push(encode_raw(item)?.2);
    }
    let list = RawList {
        metadata: Some(ListMeta {
            self_link: None,
            resource_version: str_at(meta, "resourceVersion"),
            r#continue: str_at(meta, "continue"),
            remaining_item_count: meta.get("remainingItemCount").and_then(Value::as_i64),
        }),
        items: raw_items,
    };
    Ok(wrap_envelope(
        api_version,
        &format!("{kind}List"),
        list.encode_to_vec(),
    ))
}

/// DeleteOptions sent as protobuf, as the JSON the server reads.
pub fn decode_delete_options(body: &[u8]) -> Result<Value, ProtoError> {
    let (_, _, raw) = unwrap_envelope(body)?;
    let o = DeleteOptions::decode(&raw[..]).map_err(|e| ProtoError::Decode(e.to_string()))?;
    let mut v = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
    if let Some(p) = o.preconditions {
        let mut pre = Map::new();
        put_str(&mut pre, "uid", p.uid);
        put_str(&mut pre, "resourceVersion", p.resource_version);
        v["preconditions"] = Value::Object(pre);
    }
    if let Some(g) = o.grace_period_seconds {
        v["gracePeriodSeconds"] = json!(g);
    }
    if let Some(p) = o.propagation_policy {
        v["propagationPolicy"] = json!(p);
    }
    if !o.dry_run.is_empty() {
        v["dryRun"] = json!(o.dry_run);
    }
    Ok(v)
}

fn str_at(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_string)
}

fn put_str(m: &mut Map<String, Value>, key: &str, v: Option<String>) {
    if let Some(s) = v {
        m.insert(key.into(), json!(s));
    }
}

fn string_map(v: Option<&Value>) -> Result<BTreeMap<String, String>, ProtoError> {
    let Some(Value::Object(m)) = v else {
        return Ok(BTreeMap::new());
    };
    m.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) => Ok((k.clone(), s.to_string())),
            None => Err(ProtoError::Encode(format!("{k} is not a string"))),
        })
        .collect()
}

fn bytes_map(v: Option<&Value>) -> Result<BTreeMap<String, Vec<u8>>, ProtoError> {
    string_map(v)?
        .into_iter()
        .map(|(k, s)| {
            STANDARD
                .decode(s)
                .map(|b| (k.clone(), b))
                .map_err(|e| ProtoError::Encode(format!("{k}: {e}")))
        })
        .collect()
}

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn time_to_json(t: &Time) -> Value {
    let ts = k8s_openapi::jiff::Timestamp::new(t.seconds.unwrap_or(0), t.nanos.unwrap_or(0))
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    // Time has second precision on the wire in JSON; keep what the message holds.
    json!(ts.to_string())
}

fn time_from_json(v: Option<&Value>) -> Result<Option<Time>, ProtoError> {
    let Some(s) = v.and_then(Value::as_str) else {
        return Ok(None);
    };
    let ts: k8s_openapi::jiff::Timestamp = s
        .parse()
        .map_err(|e| ProtoError::Encode(format!("time {s:?}: {e}")))?;
    Ok(Some(Time {
        seconds: Some(ts.as_second()),
        nanos: Some(ts.subsec_nanosecond()),
    }))
}

fn meta_to_json(m: &ObjectMeta) -> Value {
    let mut o = Map::new();
    put_str(&mut o, "name", m.name.clone());
    put_str(&mut o, "generateName", m.generate_name.clone());
    put_str(&mut o, "namespace", m.namespace.clone());
    put_str(&mut o, "selfLink", m.self_link.clone());
    put_str(&mut o, "uid", m.uid.clone());
    put_str(&mut o, "resourceVersion", m.resource_version.clone());
    if let Some(g) = m.generation {
        o.insert("generation".into(), json!(g));
    }
    if let Some(t) = &m.creation_timestamp {
        o.insert("creationTimestamp".into(), time_to_json(t));
    }
    if let Some(t) = &m.deletion_timestamp {
        o.insert("deletionTimestamp".into(), time_to_json(t));
    }
    if let Some(g) = m.deletion_grace_period_seconds {
        o.insert("deletionGracePeriodSeconds".into(), json!(g));
    }
    if !m.labels.is_empty() {
        o.insert("labels".into(), json!(m.labels));
    }
    if !m.annotations.is_empty() {
        o.insert("annotations".into(), json!(m.annotations));
    }
    if !m.owner_references.is_empty() {
        let refs: Vec<Value> = m
            .owner_references
            .iter()
            .map(|r| {
                let mut o = Map::new();
                put_str(&mut o, "apiVersion", r.api_version.clone());
                put_str(&mut o, "kind", r.kind.clone());
                put_str(&mut o, "name", r.name.clone());
                put_str(&mut o, "uid", r.uid.clone());
                if let Some(c) = r.controller {
                    o.insert("controller".into(), json!(c));
                }
                if let Some(b) = r.block_owner_deletion {
                    o.insert("blockOwnerDeletion".into(), json!(b));
                }
                Value::Object(o)
            })
            .collect();
        o.insert("ownerReferences".into(), json!(refs));
    }
    if !m.finalizers.is_empty() {
        o.insert("finalizers".into(), json!(m.finalizers));
    }
    if !m.managed_fields.is_empty() {
        let entries: Vec<Value> = m
            .managed_fields
            .iter()
            .map(|e| {
                let mut o = Map::new();
                put_str(&mut o, "manager", e.manager.clone());
                put_str(&mut o, "operation", e.operation.clone());
                put_str(&mut o, "apiVersion", e.api_version.clone());
                if let Some(t) = &e.time {
                    o.insert("time".into(), time_to_json(t));
                }
                put_str(&mut o, "fieldsType", e.fields_type.clone());
                if let Some(raw) = e.fields_v1.as_ref().and_then(|f| f.raw.as_deref()) {
                    o.insert(
                        "fieldsV1".into(),
                        serde_json::from_slice(raw).unwrap_or(Value::Null),
                    );
                }
                put_str(&mut o, "subresource", e.subresource.clone());
                Value::Object(o)
            })
            .collect();
        o.insert("managedFields".into(), json!(entries));
    }
    Value::Object(o)
}

fn meta_from_json(v: Option<&Value>) -> Result<Option<ObjectMeta>, ProtoError> {
    let Some(m) = v.filter(|m| m.is_object()) else {
        return Ok(None);
    };
    let owner_references = m
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| OwnerReference {
                    api_version: str_at(r, "apiVersion"),
                    kind: str_at(r, "kind"),
                    name: str_at(r, "name"),
                    uid: str_at(r, "uid"),
                    controller: r.get("controller").and_then(Value::as_bool),
                    block_owner_deletion: r.get("blockOwnerDeletion").and_then(Value::as_bool),
                })
                .collect()
        })
        .unwrap_or_default();
    let mut managed_fields = Vec::new();
    for e in m
        .get("managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        managed_fields.push(ManagedFieldsEntry {
            manager: str_at(e, "manager"),
            operation: str_at(e, "operation"),
            api_version: str_at(e, "apiVersion"),
            time: time_from_json(e.get("time"))?,
            fields_type: str_at(e, "fieldsType"),
            fields_v1: e.get("fieldsV1").map(|f| FieldsV1 {
                raw: Some(f.to_string().into_bytes()),
            }),
            subresource: str_at(e, "subresource"),
        });
    }
    Ok(Some(ObjectMeta {
        name: str_at(m, "name"),
        generate_name: str_at(m, "generateName"),
        namespace: str_at(m, "namespace"),
        self_link: str_at(m, "selfLink"),
        uid: str_at(m, "uid"),
        resource_version: str_at(m, "resourceVersion"),
        generation: m.get("generation").and_then(Value::as_i64),
        creation_timestamp: time_from_json(m.get("creationTimestamp"))?,
        deletion_timestamp: time_from_json(m.get("deletionTimestamp"))?,
        deletion_grace_period_seconds: m.get("deletionGracePeriodSeconds").and_then(Value::as_i64),
        labels: string_map(m.get("labels"))?,
        annotations: string_map(m.get("annotations"))?,
        owner_references,
        finalizers: string_list(m.get("finalizers")),
        managed_fields,
    }))
}

fn with_meta(meta: &Option<ObjectMeta>) -> Map<String, Value> {
    let mut o = Map::new();
    // The real server always renders metadata, even empty.
    o.insert(
        "metadata".into(),
        meta.as_ref().map(meta_to_json).unwrap_or_else(|| json!({})),
    );
    o
}

fn namespace_to_json(n: &Namespace) -> Value {
    let mut o = with_meta(&n.metadata);
    if let Some(spec) = &n.spec {
        let mut s = Map::new();
        if !spec.finalizers.is_empty() {
            s.insert("finalizers".into(), json!(spec.finalizers));
        }
        o.insert("spec".into(), Value::Object(s));
    }
    if let Some(st) = &n.status {
        let mut s = Map::new();
        put_str(&mut s, "phase", st.phase.clone());
        if !st.conditions.is_empty() {
            let conds: Vec<Value> = st
                .conditions
                .iter()
                .map(|c| {
                    let mut o = Map::new();
                    put_str(&mut o, "type", c.r#type.clone());
                    put_str(&mut o, "status", c.status.clone());
                    if let Some(t) = &c.last_transition_time {
                        o.insert("lastTransitionTime".into(), time_to_json(t));
                    }
                    put_str(&mut o, "reason", c.reason.clone());
                    put_str(&mut o, "message", c.message.clone());
                    Value::Object(o)
                })
                .collect();
            s.insert("conditions".into(), json!(conds));
        }
        o.insert("status".into(), Value::Object(s));
    }
    Value::Object(o)
}

fn namespace_from_json(v: &Value) -> Result<Namespace, ProtoError> {
    let mut conditions = Vec::new();
    for c in v
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        conditions.push(NamespaceCondition {
            r#type: str_at(c, "type"),
            status: str_at(c, "status"),
            last_transition_time: time_from_json(c.get("lastTransitionTime"))?,
            reason: str_at(c, "reason"),
            message: str_at(c, "message"),
        });
    }
    Ok(Namespace {
        metadata: meta_from_json(v.get("metadata"))?,
        spec: v.get("spec").map(|s| NamespaceSpec {
            finalizers: string_list(s.get("finalizers")),
        }),
        status: v.get("status").map(|s| NamespaceStatus {
            phase: str_at(s, "phase"),
            conditions,
        }),
    })
}

fn secret_to_json(s: &Secret) -> Value {
    let mut o = with_meta(&s.metadata);
    if let Some(i) = s.immutable {
        o.insert("immutable".into(), json!(i));
    }
    if !s.data.is_empty() {
        let data: Map<String, Value> = s
            .data
            .iter()
            .map(|(k, b)| (k.clone(), json!(STANDARD.encode(b))))
            .collect();
        o.insert("data".into(), Value::Object(data));
    }
    if !s.string_data.is_empty() {
        o.insert("stringData".into(), json!(s.string_data));
    }
    put_str(&mut o, "type", s.r#type.clone());
    Value::Object(o)
}

fn secret_from_json(v: &Value) -> Result<Secret, ProtoError> {
    Ok(Secret {
        metadata: meta_from_json(v.get("metadata"))?,
        data: bytes_map(v.get("data"))?,
        r#type: str_at(v, "type"),
        string_data: string_map(v.get("stringData"))?,
        immutable: v.get("immutable").and_then(Value::as_bool),
    })
}

fn configmap_to_json(c: &ConfigMap) -> Value {
    let mut o = with_meta(&c.metadata);
    if let Some(i) = c.immutable {
        o.insert("immutable".into(), json!(i));
    }
    if !c.data.is_empty() {
        o.insert("data".into(), json!(c.data));
    }
    if !c.binary_data.is_empty() {
        let data: Map<String, Value> = c
            .binary_data
            .iter()
            .map(|(k, b)| (k.clone(), json!(STANDARD.encode(b))))
            .collect();
        o.insert("binaryData".into(), Value::Object(data));
    }
    Value::Object(o)
}

fn configmap_from_json(v: &Value) -> Result<ConfigMap, ProtoError> {
    Ok(ConfigMap {
        metadata: meta_from_json(v.get("metadata"))?,
        data: string_map(v.get("data"))?,
        binary_data: bytes_map(v.get("binaryData"))?,
        immutable: v.get("immutable").and_then(Value::as_bool),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(v: Value) {
        let bytes = encode_object(&v).unwrap();
        assert_eq!(&bytes[..4], b"k8s\0");
        assert_eq!(decode_object(&bytes).unwrap(), v);
    }

    #[test]
    fn objects_round_trip_between_json_and_protobuf() {
        let meta = json!({
            "name": "n", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
            "generation": 3, "creationTimestamp": "2024-01-02T03:04:05Z",
            "deletionTimestamp": "2024-01-02T03:04:06Z", "deletionGracePeriodSeconds": 0,
            "labels": {"a": "1"}, "annotations": {"b/c": "2"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u-2",
                                 "controller": true, "blockOwnerDeletion": false}],
            "finalizers": ["x/y"],
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                               "time": "2024-01-02T03:04:05Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:data": {}}}]
        });
        round_trip(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                          "data": {"k": "v"}, "binaryData": {"b": "AAEC"}, "immutable": true}),
        );
        round_trip(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                          "data": {"k": "aMOp"}, "type": "Opaque"}),
        );
        round_trip(json!({"apiVersion": "v1", "kind": "Namespace",
                          "metadata": {"name": "n", "generateName": "g-"},
                          "spec": {"finalizers": ["kubernetes"]},
                          "status": {"phase": "Terminating", "conditions": [
                              {"type": "NamespaceDeletionContentFailure", "status": "False",
                               "lastTransitionTime": "2024-01-02T03:04:05Z", "reason": "R", "message": "m"}]}}));
        round_trip(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}));
    }

    #[test]
    fn the_envelope_is_the_magic_and_a_runtime_unknown() {
        let bytes = wrap_envelope("v1", "ConfigMap", vec![1, 2, 3]);
        // Field 1 (typeMeta, length-delimited) right after the magic.
        assert_eq!(&bytes[..5], &[0x6b, 0x38, 0x73, 0x00, 0x0a]);
        let (api_version, kind, raw) = unwrap_envelope(&bytes).unwrap();
        assert_eq!(
            (api_version.as_str(), kind.as_str(), raw),
            ("v1", "ConfigMap", vec![1, 2, 3])
        );
        assert_eq!(unwrap_envelope(b"{}").unwrap_err(), ProtoError::Magic);
        let pod = wrap_envelope("v1", "Pod", vec![]);
        assert!(matches!(
            decode_object(&pod).unwrap_err(),
            ProtoError::Unsupported { .. }
        ));
        assert!(matches!(
            decode_object(&[0x6b, 0x38, 0x73, 0x00, 0xff]).unwrap_err(),
            ProtoError::Decode(_)
        ));
    }

    #[test]
    fn secret_string_data_and_bytes_survive_the_wire() {
        let s = Secret {
            metadata: Some(ObjectMeta {
                name: Some("s".into()),
                ..Default::default()
            }),
            data: [("bin".to_string(), vec![0, 255])].into(),
            string_data: [("text".to_string(), "h\u{e9}".to_string())].into(),
            ..Default::default()
        };
        let body = wrap_envelope("v1", "Secret", s.encode_to_vec());
        let v = decode_object(&body).unwrap();
        assert_eq!(v["data"]["bin"], "AP8=");
        assert_eq!(v["stringData"]["text"], "h\u{e9}");
        assert_eq!(v["kind"], "Secret");
    }

    #[test]
    fn lists_carry_list_metadata_and_item_messages() {
        let a = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}});
        let bytes = encode_list(
            "v1",
            "ConfigMap",
            &[&a],
            &json!({"resourceVersion": "7", "continue": "t", "remainingItemCount": 2}),
        )
        .unwrap();
        let (_, kind, raw) = unwrap_envelope(&bytes).unwrap();
        assert_eq!(kind, "ConfigMapList");
        let list = RawList::decode(&raw[..]).unwrap();
        let meta = list.metadata.unwrap();
        assert_eq!(meta.resource_version.as_deref(), Some("7"));
        assert_eq!(meta.r#continue.as_deref(), Some("t"));
        assert_eq!(meta.remaining_item_count, Some(2));
        let item = ConfigMap::decode(&list.items[0][..]).unwrap();
        assert_eq!(item.metadata.unwrap().name.as_deref(), Some("a"));
    }

    #[test]
    fn delete_options_become_json() {
        let o = DeleteOptions {
            preconditions: Some(Preconditions {
                uid: Some("u".into()),
                resource_version: None,
            }),
            dry_run: vec!["All".into()],
            ..Default::default()
        };
        let v = decode_delete_options(&wrap_envelope("v1", "DeleteOptions", o.encode_to_vec()))
            .unwrap();
        assert_eq!(v["preconditions"], json!({"uid": "u"}));
        assert_eq!(v["dryRun"], json!(["All"]));
    }
}
