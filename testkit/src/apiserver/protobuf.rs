//! The Kubernetes protobuf wire format: what client-go's typed clients and
//! kubectl's imperative commands send and accept as
//! `application/vnd.kubernetes.protobuf`.
//!
//! A body is the 4 magic bytes `k8s\0`, then a `runtime.Unknown` message
//! whose `raw` field holds the object's own message. The messages are our own
//! definitions in `testkit/proto/` (field names and numbers as published in
//! the API's protobuf schema), compiled at build time into a descriptor set.
//! Objects are converted generically, field by field, to and from the JSON
//! the store keeps: a JSON key is the proto field's name, with these special
//! messages:
//!
//! - `meta.v1.Time` ↔ an RFC 3339 string with second precision, `MicroTime`
//!   ↔ one with microseconds; an empty message is `null` (Go's zero time);
//! - `resource.Quantity` ↔ its string, `intstr.IntOrString` ↔ a number or a
//!   string;
//! - `runtime.RawExtension` and `meta.v1.FieldsV1` ↔ the embedded JSON;
//! - `bytes` ↔ base64 strings, maps ↔ objects;
//! - the `ExtraValue` of authentication and authorization (Go's `[]string`)
//!   ↔ an array of strings;
//! - fields marked `inline` in `go_json.proto` (Go's embedded structs, such
//!   as the volume source of a PersistentVolumeSpec) are merged into the
//!   enclosing JSON object;
//! - on decoding, the zero value of a field marked `omitempty` is dropped, as
//!   Go's JSON does (Go's marshalling writes every value field).
//!
//! Encoding writes the fields present in the JSON in field-number order and
//! map entries sorted by key, as Go's generated marshalling does; JSON keys
//! without a proto field are dropped (logged at debug level).

use std::collections::HashSet;
use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use k8s_openapi::jiff::Timestamp;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DynamicMessage, FieldDescriptor, Kind as FieldKind, MapKey, MessageDescriptor,
    ReflectMessage, Value as PValue,
};
use serde_json::{Map, Value, json};

/// The media type of the protobuf encoding.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The media type of a protobuf watch stream.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// `k8s` and the encoding style 0 (a `runtime.Unknown` follows).
pub const MAGIC: [u8; 4] = [0x6b, 0x38, 0x73, 0x00];

/// `(apiVersion, kind)` of the stored objects this module converts (their
/// `<kind>List` too). Custom resources have no protobuf encoding, as on a
/// real server.
pub const SUPPORTED: &[(&str, &str)] = &[
    ("v1", "Namespace"),
    ("v1", "Node"),
    ("v1", "PersistentVolume"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Secret"),
    ("v1", "Event"),
    ("v1", "Pod"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("storage.k8s.io/v1", "StorageClass"),
    ("storage.k8s.io/v1", "VolumeAttachment"),
    ("storage.k8s.io/v1", "CSINode"),
    ("storage.k8s.io/v1", "CSIDriver"),
    ("storage.k8s.io/v1", "CSIStorageCapacity"),
    ("storage.k8s.io/v1", "VolumeAttributesClass"),
    ("coordination.k8s.io/v1", "Lease"),
    ("events.k8s.io/v1", "Event"),
];

/// `(apiVersion, kind)` of the reviews the server answers without storing
/// them (no `<kind>List`): sent and answered in protobuf as the real server
/// does.
pub const REVIEWS: &[(&str, &str)] = &[
    ("authentication.k8s.io/v1", "TokenReview"),
    ("authorization.k8s.io/v1", "SubjectAccessReview"),
];

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";
const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";
const AUTHENTICATION_EXTRA: &str = "k8s.io.api.authentication.v1.ExtraValue";
const AUTHORIZATION_EXTRA: &str = "k8s.io.api.authorization.v1.ExtraValue";

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

/// The compiled definitions and what `go_json.proto` says about their fields.
struct Schema {
    pool: DescriptorPool,
    /// Full names of the fields whose zero value Go's JSON omits.
    omitempty: HashSet<String>,
    /// Full names of the fields embedded inline in the JSON.
    inline: HashSet<String>,
}

static DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/k8s_descriptor_set.bin"));

static SCHEMA: LazyLock<Result<Schema, String>> = LazyLock::new(|| {
    let pool = DescriptorPool::decode(DESCRIPTOR_SET).map_err(|e| e.to_string())?;
    let ext = |name: &str| {
        pool.get_extension_by_name(name)
            .ok_or_else(|| format!("extension {name} missing from the descriptor set"))
    };
    let (omit_ext, inline_ext) = (ext("gojson.omitempty")?, ext("gojson.inline")?);
    let mut omitempty = HashSet::new();
    let mut inline = HashSet::new();
    for m in pool.all_messages() {
        for f in m.fields() {
            let opts = f.options();
            if opts.get_extension(&omit_ext).as_bool() == Some(true) {
                omitempty.insert(f.full_name().to_string());
            }
            if opts.get_extension(&inline_ext).as_bool() == Some(true) {
                inline.insert(f.full_name().to_string());
            }
        }
    }
    Ok(Schema {
        pool,
        omitempty,
        inline,
    })
});

fn schema() -> Result<&'static Schema, ProtoError> {
    SCHEMA
        .as_ref()
        .map_err(|e| ProtoError::Encode(format!("the protobuf definitions did not load: {e}")))
}

/// Whether a media type (without parameters) is the protobuf encoding.
pub fn is_protobuf(media: &str) -> bool {
    media.trim().eq_ignore_ascii_case(MEDIA_TYPE)
}

/// Whether objects of this `apiVersion`/`kind` have a protobuf encoding here.
pub fn supported(api_version: &str, kind: &str) -> bool {
    SUPPORTED.contains(&(api_version, kind))
}

fn package_of(api_version: &str) -> Option<&'static str> {
    Some(match api_version {
        "v1" => "k8s.io.api.core.v1",
        "storage.k8s.io/v1" => "k8s.io.api.storage.v1",
        "coordination.k8s.io/v1" => "k8s.io.api.coordination.v1",
        "events.k8s.io/v1" => "k8s.io.api.events.v1",
        "authentication.k8s.io/v1" => "k8s.io.api.authentication.v1",
        "authorization.k8s.io/v1" => "k8s.io.api.authorization.v1",
        _ => return None,
    })
}

/// The message of a served kind, its list, a review, or the meta kinds a
/// client sends or receives (Status, DeleteOptions).
fn message_for(api_version: &str, kind: &str) -> Result<MessageDescriptor, ProtoError> {
    let unsupported = || ProtoError::Unsupported {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
    };
    let name = match (api_version, kind) {
        ("v1" | "meta.k8s.io/v1", "Status" | "DeleteOptions") => format!("{META}.{kind}"),
        _ if REVIEWS.contains(&(api_version, kind)) => format!(
            "{}.{kind}",
            package_of(api_version).ok_or_else(unsupported)?
        ),
        _ => {
            let item = kind.strip_suffix("List").unwrap_or(kind);
            if !supported(api_version, item) {
                return Err(unsupported());
            }
            format!(
                "{}.{kind}",
                package_of(api_version).ok_or_else(unsupported)?
            )
        }
    };
    schema()?
        .pool
        .get_message_by_name(&name)
        .ok_or_else(unsupported)
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

/// Decodes an enveloped object (a served kind, its list, a review, Status or
/// DeleteOptions) into the JSON the server works with.
pub fn decode_object(body: &[u8]) -> Result<Value, ProtoError> {
    let (api_version, kind, raw) = unwrap_envelope(body)?;
    decode_raw(&api_version, &kind, &raw)
}

/// Decodes the message bytes of an object of that type (what
/// [`unwrap_envelope`] returned) into the JSON the server works with.
pub fn decode_raw(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, ProtoError> {
    let desc = message_for(api_version, kind)?;
    let mut out = Map::new();
    out.insert("kind".into(), json!(kind));
    out.insert("apiVersion".into(), json!(api_version));
    let msg = DynamicMessage::decode(desc, raw).map_err(|e| ProtoError::Decode(e.to_string()))?;
    message_to_json(schema()?, &msg, &mut out)?;
    if !out.contains_key("metadata") && !kind.ends_with("List") && kind != "DeleteOptions" {
        // The real server always renders an object's metadata, even empty.
        out.insert("metadata".into(), json!({}));
    }
    Ok(Value::Object(out))
}

/// The message bytes of a JSON object of a supported kind (no envelope).
fn encode_raw(obj: &Value) -> Result<(String, String, Vec<u8>), ProtoError> {
    let api_version = str_at(obj, "apiVersion");
    let kind = str_at(obj, "kind");
    let desc = message_for(&api_version, &kind)?;
    let Value::Object(map) = obj else {
        return Err(ProtoError::Encode("not a JSON object".into()));
    };
    let mut raw = Vec::new();
    encode_message(schema()?, &desc, map, &mut raw);
    Ok((api_version, kind, raw))
}

/// Encodes a stored object, a review (or a Status), enveloped.
pub fn encode_object(obj: &Value) -> Result<Vec<u8>, ProtoError> {
    let (api_version, kind, raw) = encode_raw(obj)?;
    Ok(wrap_envelope(&api_version, &kind, raw))
}

/// Encodes a `meta.k8s.io/v1` Status (an error or a deletion's answer),
/// enveloped as the real server does: apiVersion `v1`, kind `Status`.
pub fn encode_status(status: &Value) -> Result<Vec<u8>, ProtoError> {
    let desc = message_for("v1", "Status")?;
    let Value::Object(map) = status else {
        return Err(ProtoError::Encode("a Status must be a JSON object".into()));
    };
    let mut raw = Vec::new();
    encode_message(schema()?, &desc, map, &mut raw);
    Ok(wrap_envelope("v1", "Status", raw))
}

/// Encodes a list of objects of one supported kind as `<kind>List`, enveloped.
pub fn encode_list(
    api_version: &str,
    kind: &str,
    items: &[&Value],
    meta: &Value,
) -> Result<Vec<u8>, ProtoError> {
    let list_kind = format!("{kind}List");
    let desc = message_for(api_version, &list_kind)?;
    let s = schema()?;
    let field = |name: &str| {
        desc.get_field_by_name(name)
            .ok_or_else(|| ProtoError::Encode(format!("{list_kind} has no field {name}")))
    };
    let (meta_field, items_field) = (field("metadata")?, field("items")?);
    let mut raw = Vec::new();
    if let (Value::Object(m), FieldKind::Message(md)) = (meta, meta_field.kind()) {
        let mut buf = Vec::new();
        encode_message(s, &md, m, &mut buf);
        put_len_delimited(&mut raw, meta_field.number(), &buf);
    }
    for item in items {
        let (_, _, bytes) = encode_raw(item)?;
        put_len_delimited(&mut raw, items_field.number(), &bytes);
    }
    Ok(wrap_envelope(api_version, &list_kind, raw))
}

/// DeleteOptions sent as protobuf, as the JSON the server reads.
pub fn decode_delete_options(body: &[u8]) -> Result<Value, ProtoError> {
    let (_, _, raw) = unwrap_envelope(body)?;
    let desc = message_for("v1", "DeleteOptions")?;
    let msg =
        DynamicMessage::decode(desc, &raw[..]).map_err(|e| ProtoError::Decode(e.to_string()))?;
    let mut out = Map::new();
    out.insert("kind".into(), json!("DeleteOptions"));
    out.insert("apiVersion".into(), json!("v1"));
    message_to_json(schema()?, &msg, &mut out)?;
    Ok(Value::Object(out))
}

/// One frame of a protobuf watch stream: a 4-byte big-endian length, then a
/// `meta.v1.WatchEvent` whose object holds the enveloped object (`object` is
/// what [`encode_object`] or [`encode_status`] returned).
pub fn watch_frame(event_type: &str, object: &[u8]) -> Bytes {
    let mut raw_ext = Vec::with_capacity(object.len() + 8);
    put_len_delimited(&mut raw_ext, 1, object);
    let mut event = Vec::with_capacity(raw_ext.len() + event_type.len() + 16);
    put_len_delimited(&mut event, 1, event_type.as_bytes());
    put_len_delimited(&mut event, 2, &raw_ext);
    let mut out = Vec::with_capacity(event.len() + 4);
    out.extend_from_slice(&u32::try_from(event.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&event);
    Bytes::from(out)
}

/// Splits one frame off a protobuf watch stream: `(type, enveloped object)`
/// and the rest of the stream, or `None` if the frame is not complete yet.
#[allow(clippy::type_complexity)]
pub fn read_watch_frame(stream: &[u8]) -> Result<Option<((String, Vec<u8>), &[u8])>, ProtoError> {
    let Some((len, rest)) = stream.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(*len) as usize;
    if rest.len() < len {
        return Ok(None);
    }
    let (frame, rest) = rest.split_at(len);
    let desc = schema()?
        .pool
        .get_message_by_name(&format!("{META}.WatchEvent"))
        .ok_or_else(|| ProtoError::Decode("no WatchEvent message".into()))?;
    let msg = DynamicMessage::decode(desc, frame).map_err(|e| ProtoError::Decode(e.to_string()))?;
    let etype = msg
        .get_field_by_name("type")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let raw = msg
        .get_field_by_name("object")
        .and_then(|v| {
            v.as_message()
                .and_then(|m| m.get_field_by_name("raw"))
                .and_then(|r| r.as_bytes().map(|b| b.to_vec()))
        })
        .unwrap_or_default();
    Ok(Some(((etype, raw), rest)))
}

fn str_at(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

// ---- encoding: JSON to wire bytes ----

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_tag(out: &mut Vec<u8>, number: u32, wire: u32) {
    put_varint(out, u64::from(number << 3 | wire));
}

fn put_len_delimited(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn skip(path: &FieldDescriptor, v: &Value, why: &str) {
    tracing::debug!(field = path.full_name(), value = %v, "protobuf encoding drops a field: {why}");
}

/// Encodes a JSON object as the message `desc`; keys without a field are dropped.
fn encode_message(
    s: &Schema,
    desc: &MessageDescriptor,
    obj: &Map<String, Value>,
    out: &mut Vec<u8>,
) {
    let mut inlined = Vec::new();
    for field in desc.fields() {
        if s.inline.contains(field.full_name()) {
            // An embedded Go struct: its fields are the enclosing object's. Go
            // writes it even when empty (it is a value, not a pointer).
            if let FieldKind::Message(md) = field.kind() {
                let mut buf = Vec::new();
                encode_message(s, &md, obj, &mut buf);
                put_len_delimited(out, field.number(), &buf);
                inlined.push(md);
            }
            continue;
        }
        let Some(v) = obj.get(field.name()).filter(|v| !v.is_null()) else {
            continue;
        };
        if field.is_map() {
            encode_map(s, &field, v, out);
        } else if field.is_list() {
            match v {
                Value::Array(items) => {
                    for item in items.iter().filter(|i| !i.is_null()) {
                        encode_value(s, &field, field.number(), &field.kind(), item, out);
                    }
                }
                other => skip(&field, other, "not an array"),
            }
        } else {
            encode_value(s, &field, field.number(), &field.kind(), v, out);
        }
    }
    if tracing::enabled!(tracing::Level::DEBUG) {
        for key in obj.keys() {
            let known = desc.get_field_by_name(key).is_some()
                || inlined.iter().any(|m| m.get_field_by_name(key).is_some())
                || ((key == "kind" || key == "apiVersion")
                    && desc.get_field_by_name("metadata").is_some());
            if !known {
                tracing::debug!(
                    message = desc.full_name(),
                    key,
                    "protobuf encoding drops a JSON key with no field"
                );
            }
        }
    }
}

fn encode_map(s: &Schema, field: &FieldDescriptor, v: &Value, out: &mut Vec<u8>) {
    let Value::Object(m) = v else {
        return skip(field, v, "not an object");
    };
    let FieldKind::Message(entry) = field.kind() else {
        return;
    };
    let (key_field, value_field) = (entry.map_entry_key_field(), entry.map_entry_value_field());
    let mut keys: Vec<&String> = m.keys().collect();
    keys.sort();
    for k in keys {
        let val = &m[k];
        let mut buf = Vec::new();
        put_len_delimited(&mut buf, key_field.number(), k.as_bytes());
        if !val.is_null() {
            encode_value(
                s,
                &value_field,
                value_field.number(),
                &value_field.kind(),
                val,
                &mut buf,
            );
        }
        put_len_delimited(out, field.number(), &buf);
    }
}

/// Writes one value of a field (an element of a list, or a map value).
fn encode_value(
    s: &Schema,
    field: &FieldDescriptor,
    number: u32,
    kind: &FieldKind,
    v: &Value,
    out: &mut Vec<u8>,
) {
    let int = || {
        v.as_i64()
            .or_else(|| v.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64))
    };
    match kind {
        FieldKind::String => match v.as_str() {
            Some(st) => put_len_delimited(out, number, st.as_bytes()),
            None => skip(field, v, "not a string"),
        },
        FieldKind::Bytes => match v.as_str().map(|st| STANDARD.decode(st)) {
            Some(Ok(b)) => put_len_delimited(out, number, &b),
            _ => skip(field, v, "not a base64 string"),
        },
        FieldKind::Bool => match v.as_bool() {
            Some(b) => {
                put_tag(out, number, VARINT);
                put_varint(out, u64::from(b));
            }
            None => skip(field, v, "not a boolean"),
        },
        FieldKind::Int32
        | FieldKind::Int64
        | FieldKind::Uint32
        | FieldKind::Uint64
        | FieldKind::Enum(_) => match int() {
            Some(i) => {
                put_tag(out, number, VARINT);
                put_varint(out, i as u64);
            }
            None => skip(field, v, "not an integer"),
        },
        FieldKind::Sint32 | FieldKind::Sint64 => match int() {
            Some(i) => {
                put_tag(out, number, VARINT);
                put_varint(out, ((i << 1) ^ (i >> 63)) as u64);
            }
            None => skip(field, v, "not an integer"),
        },
        FieldKind::Double => match v.as_f64() {
            Some(f) => {
                put_tag(out, number, FIXED64);
                out.extend_from_slice(&f.to_le_bytes());
            }
            None => skip(field, v, "not a number"),
        },
        FieldKind::Float => match v.as_f64() {
            Some(f) => {
                put_tag(out, number, FIXED32);
                out.extend_from_slice(&(f as f32).to_le_bytes());
            }
            None => skip(field, v, "not a number"),
        },
        FieldKind::Fixed32 | FieldKind::Sfixed32 => match int() {
            Some(i) => {
                put_tag(out, number, FIXED32);
                out.extend_from_slice(&(i as u32).to_le_bytes());
            }
            None => skip(field, v, "not an integer"),
        },
        FieldKind::Fixed64 | FieldKind::Sfixed64 => match int() {
            Some(i) => {
                put_tag(out, number, FIXED64);
                out.extend_from_slice(&(i as u64).to_le_bytes());
            }
            None => skip(field, v, "not an integer"),
        },
        FieldKind::Message(md) => {
            let mut buf = Vec::new();
            match special_to_wire(md.full_name(), v, &mut buf) {
                Some(Ok(())) => {}
                Some(Err(why)) => return skip(field, v, &why),
                None => match v {
                    Value::Object(m) => encode_message(s, md, m, &mut buf),
                    other => return skip(field, other, "not an object"),
                },
            }
            put_len_delimited(out, number, &buf);
        }
    }
}

/// The messages with a JSON form of their own; `None` for ordinary messages.
fn special_to_wire(name: &str, v: &Value, buf: &mut Vec<u8>) -> Option<Result<(), String>> {
    let timestamp = |micro: bool, buf: &mut Vec<u8>| -> Result<(), String> {
        let st = v.as_str().ok_or("a time must be a string")?;
        let ts: Timestamp = st.parse().map_err(|e| format!("time {st:?}: {e}"))?;
        // Go's Time keeps seconds only; MicroTime keeps microseconds. Both
        // fields are written, as Go's Timestamp marshalling does.
        let nanos = if micro {
            ts.subsec_nanosecond() / 1000 * 1000
        } else {
            0
        };
        put_tag(buf, 1, VARINT);
        put_varint(buf, ts.as_second() as u64);
        put_tag(buf, 2, VARINT);
        put_varint(buf, i64::from(nanos) as u64);
        Ok(())
    };
    Some(match name {
        TIME => timestamp(false, buf),
        MICRO_TIME => timestamp(true, buf),
        QUANTITY => match v {
            Value::String(q) => {
                put_len_delimited(buf, 1, q.as_bytes());
                Ok(())
            }
            Value::Number(n) => {
                put_len_delimited(buf, 1, n.to_string().as_bytes());
                Ok(())
            }
            _ => Err("a quantity must be a string or a number".into()),
        },
        INT_OR_STRING => {
            // Go writes all three fields of the value type.
            let (t, i, st) = match v {
                Value::String(st) => (1u64, 0i64, st.as_str()),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => (0, i, ""),
                    None => return Some(Err("not an integer".into())),
                },
                _ => return Some(Err("an int-or-string must be a number or a string".into())),
            };
            put_tag(buf, 1, VARINT);
            put_varint(buf, t);
            put_tag(buf, 2, VARINT);
            put_varint(buf, i as u64);
            put_len_delimited(buf, 3, st.as_bytes());
            Ok(())
        }
        RAW_EXTENSION | FIELDS_V1 => {
            put_len_delimited(buf, 1, v.to_string().as_bytes());
            Ok(())
        }
        AUTHENTICATION_EXTRA | AUTHORIZATION_EXTRA => match v.as_array() {
            // Go's generated marshalling writes each item as field 1.
            Some(items) if items.iter().all(Value::is_string) => {
                for item in items.iter().filter_map(Value::as_str) {
                    put_len_delimited(buf, 1, item.as_bytes());
                }
                Ok(())
            }
            _ => Err("an extra value must be an array of strings".into()),
        },
        _ => return None,
    })
}

// ---- decoding: a decoded message to JSON ----

fn message_to_json(
    s: &Schema,
    msg: &DynamicMessage,
    out: &mut Map<String, Value>,
) -> Result<(), ProtoError> {
    for (field, value) in msg.fields() {
        if s.inline.contains(field.full_name()) {
            if let Some(m) = value.as_message() {
                message_to_json(s, m, out)?;
            }
            continue;
        }
        if s.omitempty.contains(field.full_name()) && is_zero(value) {
            continue;
        }
        out.insert(
            field.name().to_string(),
            value_to_json(s, &field.kind(), value)?,
        );
    }
    if msg.unknown_fields().next().is_some() {
        tracing::debug!(
            message = msg.descriptor().full_name(),
            "protobuf decoding drops fields this server does not know"
        );
    }
    Ok(())
}

fn is_zero(v: &PValue) -> bool {
    match v {
        PValue::String(s) => s.is_empty(),
        PValue::Bool(b) => !b,
        PValue::I32(i) => *i == 0,
        PValue::I64(i) => *i == 0,
        PValue::U32(i) => *i == 0,
        PValue::U64(i) => *i == 0,
        PValue::Bytes(b) => b.is_empty(),
        _ => false,
    }
}

fn value_to_json(s: &Schema, kind: &FieldKind, v: &PValue) -> Result<Value, ProtoError> {
    Ok(match v {
        PValue::Bool(b) => json!(b),
        PValue::I32(i) => json!(i),
        PValue::I64(i) => json!(i),
        PValue::U32(i) => json!(i),
        PValue::U64(i) => json!(i),
        PValue::F32(f) => json!(f),
        PValue::F64(f) => json!(f),
        PValue::String(st) => json!(st),
        PValue::Bytes(b) => json!(STANDARD.encode(b)),
        PValue::EnumNumber(n) => json!(n),
        PValue::Message(m) => match special_to_json(m)? {
            Some(j) => j,
            None => {
                let mut o = Map::new();
                message_to_json(s, m, &mut o)?;
                Value::Object(o)
            }
        },
        PValue::List(items) => Value::Array(
            items
                .iter()
                .map(|i| value_to_json(s, kind, i))
                .collect::<Result<_, _>>()?,
        ),
        PValue::Map(entries) => {
            let value_kind = match kind {
                FieldKind::Message(entry) => entry.map_entry_value_field().kind(),
                other => other.clone(),
            };
            let mut o = Map::new();
            let mut sorted: Vec<(&MapKey, &PValue)> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            for (k, val) in sorted {
                let key = match k {
                    MapKey::String(st) => st.clone(),
                    other => format!("{other:?}"),
                };
                o.insert(key, value_to_json(s, &value_kind, val)?);
            }
            Value::Object(o)
        }
    })
}

fn special_to_json(m: &DynamicMessage) -> Result<Option<Value>, ProtoError> {
    let get = |name: &str| m.get_field_by_name(name).map(|v| v.into_owned());
    let has = |name: &str| {
        m.descriptor()
            .get_field_by_name(name)
            .is_some_and(|f| m.has_field(&f))
    };
    let name = m.descriptor().full_name().to_string();
    Ok(Some(match name.as_str() {
        TIME | MICRO_TIME => {
            if !has("seconds") && !has("nanos") {
                // Go's zero time: an empty message, `null` in JSON.
                return Ok(Some(Value::Null));
            }
            let secs = get("seconds").and_then(|v| v.as_i64()).unwrap_or(0);
            let nanos = get("nanos").and_then(|v| v.as_i32()).unwrap_or(0);
            let ts = Timestamp::from_second(secs)
                .map_err(|e| ProtoError::Decode(format!("time out of range: {e}")))?;
            let base = ts.strftime("%Y-%m-%dT%H:%M:%S").to_string();
            if name == MICRO_TIME {
                json!(format!("{base}.{:06}Z", nanos.clamp(0, 999_999_999) / 1000))
            } else {
                json!(format!("{base}Z"))
            }
        }
        QUANTITY => json!(
            get("string")
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| "0".into())
        ),
        INT_OR_STRING => {
            if get("type").and_then(|v| v.as_i64()) == Some(1) {
                json!(
                    get("strVal")
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                )
            } else {
                json!(get("intVal").and_then(|v| v.as_i32()).unwrap_or(0))
            }
        }
        RAW_EXTENSION | FIELDS_V1 => {
            let field = if name == FIELDS_V1 { "Raw" } else { "raw" };
            let raw = get(field)
                .and_then(|v| v.as_bytes().map(|b| b.to_vec()))
                .unwrap_or_default();
            if raw.is_empty() {
                Value::Null
            } else if raw.starts_with(&MAGIC) {
                decode_object(&raw)?
            } else {
                serde_json::from_slice(&raw)
                    .map_err(|e| ProtoError::Decode(format!("embedded object: {e}")))?
            }
        }
        AUTHENTICATION_EXTRA | AUTHORIZATION_EXTRA => {
            // A value left out reads as Go's empty, non-nil slice: `[]`.
            let items = get("items")
                .and_then(|v| {
                    v.as_list().map(|l| {
                        l.iter()
                            .filter_map(|i| i.as_str().map(str::to_string))
                            .collect::<Vec<_>>()
                    })
                })
                .unwrap_or_default();
            json!(items)
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests;
