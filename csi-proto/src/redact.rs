//! Renders protobuf messages as compact JSON for logs, with every field
//! that carries the `csi_secret` option (field option 1059) replaced by
//! [`STRIPPED`].
//!
//! Secret fields are found from the embedded descriptors, not from a list:
//! a field marked in the proto is redacted wherever the message appears,
//! nested, repeated, in a map value or in a oneof. Field names are the
//! proto names; fields at their default value are left out; enums print
//! as their value name. Unknown fields are never printed.

use prost_reflect::{DescriptorPool, DynamicMessage, Kind, MapKey, ReflectMessage, Value};
use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

/// What a secret field's value is replaced with.
pub const STRIPPED: &str = "***stripped***";

/// Number of the `csi_secret` extension of `google.protobuf.FieldOptions`.
pub const CSI_SECRET_OPTION: u32 = 1059;

/// Renders `msg` as compact JSON with secret fields stripped.
///
/// Never panics and never prints the raw message: a type missing from the
/// embedded descriptors renders as `<unprintable TYPE>`.
pub fn sanitize<M: prost::Message + prost::Name>(msg: &M) -> String {
    sanitize_encoded(&M::full_name(), &msg.encode_to_vec())
}

/// Like [`sanitize`], for an already encoded message of type `full_name`
/// (e.g. `csi.v1.CreateVolumeRequest`). Bytes that do not decode render
/// as `<unprintable TYPE>`.
pub fn sanitize_encoded(full_name: &str, encoded: &[u8]) -> String {
    match embedded() {
        Some(redactor) => redactor.sanitize_encoded(full_name, encoded),
        None => unprintable(full_name),
    }
}

/// Whether field `field_name` of message `message_full_name` carries the
/// `csi_secret` option. Unknown messages or fields are not secret.
pub fn is_secret_field(message_full_name: &str, field_name: &str) -> bool {
    embedded().is_some_and(|redactor| redactor.is_secret_field(message_full_name, field_name))
}

/// The top-level fields of a request that name what it acts on (`volume_id`, `snapshot_id`,
/// `node_id`, `name`, ...), with their values: what a trace of the call may show. Never a
/// secret field; empty for types missing from the embedded descriptors.
pub fn identifiers<M: prost::Message + prost::Name>(msg: &M) -> Vec<(&'static str, String)> {
    const NAMED: &[&str] = &[
        "name",
        "volume_id",
        "snapshot_id",
        "source_volume_id",
        "node_id",
        "group_snapshot_id",
        "base_snapshot_id",
        "target_snapshot_id",
    ];
    let Some(redactor) = embedded() else {
        return Vec::new();
    };
    let Some(descriptor) = redactor.pool.get_message_by_name(&M::full_name()) else {
        return Vec::new();
    };
    let Ok(message) = DynamicMessage::decode(descriptor, msg.encode_to_vec().as_slice()) else {
        return Vec::new();
    };
    NAMED
        .iter()
        .filter_map(|name| {
            let field = message.descriptor().get_field_by_name(name)?;
            if redactor.secret_fields.contains(field.full_name()) || !message.has_field(&field) {
                return None;
            }
            match message.get_field(&field).as_ref() {
                Value::String(value) => Some((*name, value.clone())),
                _ => None,
            }
        })
        .collect()
}

/// Displays a message through [`sanitize`], so log statements only pay
/// for rendering when the record is actually written.
pub struct Sanitized<'a, M>(pub &'a M);

impl<M: prost::Message + prost::Name> fmt::Display for Sanitized<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&sanitize(self.0))
    }
}

/// Secret-stripping renderer over any descriptor pool; the free functions
/// use one over the embedded descriptors.
#[derive(Debug, Clone)]
pub struct Redactor {
    pool: DescriptorPool,
    /// Full names (`package.Message.field`) of the secret fields.
    secret_fields: HashSet<String>,
}

impl Redactor {
    /// Indexes the fields of `pool` that carry the `csi_secret` option.
    pub fn new(pool: DescriptorPool) -> Self {
        let secret_fields = pool
            .all_messages()
            .flat_map(|message| message.fields().collect::<Vec<_>>())
            .filter(|field| {
                field.options().extensions().any(|(extension, value)| {
                    extension.number() == CSI_SECRET_OPTION && value.as_bool() == Some(true)
                })
            })
            .map(|field| field.full_name().to_owned())
            .collect();
        Redactor {
            pool,
            secret_fields,
        }
    }

    /// See [`sanitize_encoded`].
    pub fn sanitize_encoded(&self, full_name: &str, encoded: &[u8]) -> String {
        self.render(full_name, encoded)
            .unwrap_or_else(|| unprintable(full_name))
    }

    /// See [`is_secret_field`].
    pub fn is_secret_field(&self, message_full_name: &str, field_name: &str) -> bool {
        self.pool
            .get_message_by_name(message_full_name)
            .and_then(|message| message.get_field_by_name(field_name))
            .is_some_and(|field| self.secret_fields.contains(field.full_name()))
    }

    fn render(&self, full_name: &str, encoded: &[u8]) -> Option<String> {
        let descriptor = self.pool.get_message_by_name(full_name)?;
        let message = DynamicMessage::decode(descriptor, encoded).ok()?;
        let mut out = String::new();
        write_object(&mut out, &message, &self.secret_fields);
        Some(out)
    }
}

fn embedded() -> Option<&'static Redactor> {
    static EMBEDDED: OnceLock<Option<Redactor>> = OnceLock::new();
    EMBEDDED
        .get_or_init(|| crate::descriptor_pool().ok().cloned().map(Redactor::new))
        .as_ref()
}

fn unprintable(full_name: &str) -> String {
    format!("<unprintable {full_name}>")
}

fn write_object(out: &mut String, message: &DynamicMessage, secrets: &HashSet<String>) {
    out.push('{');
    let mut first = true;
    // Declaration order, like the Go structs the upstream output comes from.
    for field in message.descriptor().fields() {
        if !message.has_field(&field) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        write_string(out, field.name());
        out.push(':');
        if secrets.contains(field.full_name()) {
            write_string(out, STRIPPED);
        } else {
            write_value(out, &message.get_field(&field), &field.kind(), secrets);
        }
    }
    out.push('}');
}

/// `kind` is the element kind for lists and the entry kind for maps.
fn write_value(out: &mut String, value: &Value, kind: &Kind, secrets: &HashSet<String>) {
    match value {
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::I32(n) => out.push_str(&n.to_string()),
        Value::I64(n) => out.push_str(&n.to_string()),
        Value::U32(n) => out.push_str(&n.to_string()),
        Value::U64(n) => out.push_str(&n.to_string()),
        // f32 keeps its own shortest display ("0.1", not "0.100000001...").
        Value::F32(n) => write_float(out, f64::from(*n), &n.to_string()),
        Value::F64(n) => write_float(out, *n, &n.to_string()),
        Value::String(s) => write_string(out, s),
        Value::Bytes(bytes) => write_string(out, &base64(bytes)),
        Value::EnumNumber(number) => match kind.as_enum().and_then(|e| e.get_value(*number)) {
            Some(value) => write_string(out, value.name()),
            None => out.push_str(&number.to_string()),
        },
        Value::Message(message) => write_message(out, message, secrets),
        Value::List(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item, kind, secrets);
            }
            out.push(']');
        }
        Value::Map(entries) => {
            let value_kind = kind
                .as_message()
                .and_then(|entry| entry.get_field(2))
                .map(|field| field.kind());
            let mut sorted: Vec<_> = entries.iter().collect();
            sorted.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, value)) in sorted.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, &map_key(key));
                out.push(':');
                match &value_kind {
                    Some(value_kind) => write_value(out, value, value_kind, secrets),
                    None => out.push_str("null"),
                }
            }
            out.push('}');
        }
    }
}

/// Well-known wrappers (`google.protobuf.BoolValue`, ...) print as their
/// bare value, so `ready: false` reads `"ready":false`.
fn write_message(out: &mut String, message: &DynamicMessage, secrets: &HashSet<String>) {
    let descriptor = message.descriptor();
    let is_wrapper =
        descriptor.package_name() == "google.protobuf" && WRAPPERS.contains(&descriptor.name());
    match descriptor.get_field(1).filter(|_| is_wrapper) {
        Some(field) => write_value(out, &message.get_field(&field), &field.kind(), secrets),
        None => write_object(out, message, secrets),
    }
}

const WRAPPERS: [&str; 9] = [
    "DoubleValue",
    "FloatValue",
    "Int64Value",
    "UInt64Value",
    "Int32Value",
    "UInt32Value",
    "BoolValue",
    "StringValue",
    "BytesValue",
];

/// JSON has no NaN or infinities; print them as strings, as protobuf's
/// JSON mapping does.
fn write_float(out: &mut String, value: f64, display: &str) {
    if value.is_finite() {
        out.push_str(display);
    } else if value.is_nan() {
        write_string(out, "NaN");
    } else if value > 0.0 {
        write_string(out, "Infinity");
    } else {
        write_string(out, "-Infinity");
    }
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push_str(&serde_json::Value::from(s).to_string());
}

/// Standard base64 with padding, as Go and protobuf JSON print bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in cases {
            assert_eq!(base64(input.as_bytes()), expected, "input {input:?}");
        }
    }

    #[test]
    fn non_finite_floats_print_as_strings() {
        let render = |v: f64| {
            let mut out = String::new();
            write_value(&mut out, &Value::F64(v), &Kind::Double, &HashSet::new());
            out
        };
        assert_eq!(render(1.5), "1.5");
        assert_eq!(render(f64::NAN), "\"NaN\"");
        assert_eq!(render(f64::INFINITY), "\"Infinity\"");
        assert_eq!(render(f64::NEG_INFINITY), "\"-Infinity\"");
    }

    #[test]
    fn identifiers_name_the_object_and_never_a_secret() {
        let request = crate::v1::DeleteVolumeRequest {
            volume_id: "vol-1".to_string(),
            secrets: [("password".to_string(), "hunter2".to_string())].into(),
        };
        assert_eq!(
            identifiers(&request),
            vec![("volume_id", "vol-1".to_string())]
        );
        let create = crate::v1::CreateVolumeRequest {
            name: "pvc-1".to_string(),
            ..Default::default()
        };
        assert_eq!(identifiers(&create), vec![("name", "pvc-1".to_string())]);
    }
}
