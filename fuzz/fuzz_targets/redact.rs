//! The secret-free rendering of CSI messages for logs (`csi_proto::redact`).
//!
//! The first byte picks a message type of the CSI spec, the next one how the rest is used:
//! - as the encoded message itself: the rendering is JSON (or `<unprintable TYPE>`) and does
//!   not change when every secret field of the decoded message gets another value;
//! - as `arbitrary` choices building a message of that type whose secret fields hold strings
//!   starting with a marker no other field holds: the rendering is JSON, never contains the
//!   marker, does not change when the secrets change, and shows `***stripped***` when a
//!   secret was set.
#![no_main]

use std::collections::HashMap;
use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use csi_proto::prost::Message;
use csi_proto::prost_reflect::{
    DynamicMessage, FieldDescriptor, Kind, MapKey, MessageDescriptor, ReflectMessage, Value,
};
use csi_proto::redact::{STRIPPED, is_secret_field, sanitize_encoded};
use libfuzzer_sys::fuzz_target;

// `~` is in no base64 alphabet and JSON leaves it alone: only a secret string can render it
// after these letters.
const MARKER: &str = "SECRET~";
const MAX_DEPTH: usize = 5;

fn messages() -> &'static [MessageDescriptor] {
    static MESSAGES: OnceLock<Vec<MessageDescriptor>> = OnceLock::new();
    MESSAGES.get_or_init(|| {
        let pool = csi_proto::descriptor_pool().expect("embedded descriptors");
        pool.all_messages()
            .filter(|m| m.package_name() == "csi.v1" && !m.is_map_entry())
            .collect()
    })
}

fn is_secret(field: &FieldDescriptor) -> bool {
    is_secret_field(field.parent_message().full_name(), field.name())
}

fn string(u: &mut Unstructured, secret: bool) -> Result<String> {
    let text: String = u.arbitrary()?;
    Ok(if secret {
        format!("{MARKER}{text}")
    } else {
        text.replace(MARKER, "s")
    })
}

fn scalar(u: &mut Unstructured, kind: &Kind, secret: bool, depth: usize) -> Result<Value> {
    Ok(match kind {
        Kind::Double => Value::F64(u.arbitrary()?),
        Kind::Float => Value::F32(u.arbitrary()?),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(u.arbitrary()?),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(u.arbitrary()?),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(u.arbitrary()?),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(u.arbitrary()?),
        Kind::Bool => Value::Bool(u.arbitrary()?),
        Kind::String => Value::String(string(u, secret)?),
        Kind::Bytes => {
            let mut bytes: Vec<u8> = u.arbitrary()?;
            if secret {
                bytes.splice(0..0, MARKER.bytes());
            }
            Value::Bytes(bytes.into())
        }
        Kind::Enum(e) => {
            let values: Vec<i32> = e.values().map(|v| v.number()).collect();
            if u.arbitrary()? {
                Value::EnumNumber(*u.choose(&values)?)
            } else {
                Value::EnumNumber(u.arbitrary()?)
            }
        }
        Kind::Message(m) => Value::Message(message(u, m, secret, depth + 1)?),
    })
}

fn map_key(value: Value) -> MapKey {
    match value {
        Value::Bool(b) => MapKey::Bool(b),
        Value::I32(n) => MapKey::I32(n),
        Value::I64(n) => MapKey::I64(n),
        Value::U32(n) => MapKey::U32(n),
        Value::U64(n) => MapKey::U64(n),
        Value::String(s) => MapKey::String(s),
        // Map keys are integral, bool or string by the protobuf spec.
        _ => MapKey::Bool(false),
    }
}

fn message(
    u: &mut Unstructured,
    descriptor: &MessageDescriptor,
    secret: bool,
    depth: usize,
) -> Result<DynamicMessage> {
    let mut message = DynamicMessage::new(descriptor.clone());
    if depth > MAX_DEPTH {
        return Ok(message);
    }
    for field in descriptor.fields() {
        if !u.arbitrary::<bool>()? {
            continue;
        }
        let secret = secret || is_secret(&field);
        let kind = field.kind();
        let value = if field.is_map() {
            let entry = kind
                .as_message()
                .expect("a map field's kind is its entry")
                .clone();
            let key_kind = entry.map_entry_key_field().kind();
            let value_kind = entry.map_entry_value_field().kind();
            let mut map = HashMap::new();
            for _ in 0..u.int_in_range(0..=4)? {
                let key = map_key(scalar(u, &key_kind, secret, depth)?);
                map.insert(key, scalar(u, &value_kind, secret, depth)?);
            }
            Value::Map(map)
        } else if field.is_list() {
            let mut items = Vec::new();
            for _ in 0..u.int_in_range(0..=4)? {
                items.push(scalar(u, &kind, secret, depth)?);
            }
            Value::List(items)
        } else {
            scalar(u, &kind, secret, depth)?
        };
        message.set_field(&field, value);
    }
    Ok(message)
}

/// A value that is set (not the default) of the field's type.
fn other_value(kind: &Kind) -> Value {
    match kind {
        Kind::Double => Value::F64(1.0),
        Kind::Float => Value::F32(1.0),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => Value::I32(1),
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => Value::I64(1),
        Kind::Uint32 | Kind::Fixed32 => Value::U32(1),
        Kind::Uint64 | Kind::Fixed64 => Value::U64(1),
        Kind::Bool => Value::Bool(true),
        Kind::String => Value::String("x".into()),
        Kind::Bytes => Value::Bytes(b"x".to_vec().into()),
        Kind::Enum(_) => Value::EnumNumber(1),
        Kind::Message(m) => Value::Message(DynamicMessage::new(m.clone())),
    }
}

/// Replaces every set secret field by another set value; returns how many were replaced.
fn replace_secrets(message: &mut DynamicMessage) -> usize {
    let mut replaced = 0;
    for field in message.descriptor().fields() {
        if !message.has_field(&field) {
            continue;
        }
        if is_secret(&field) {
            let kind = field.kind();
            let value = if field.is_map() {
                let entry = kind.as_message().expect("a map field's kind is its entry");
                let key = map_key(other_value(&entry.map_entry_key_field().kind()));
                let value = other_value(&entry.map_entry_value_field().kind());
                Value::Map(HashMap::from([(key, value)]))
            } else if field.is_list() {
                Value::List(vec![other_value(&kind)])
            } else {
                other_value(&kind)
            };
            message.set_field(&field, value);
            replaced += 1;
            continue;
        }
        match message.get_field_mut(&field) {
            Value::Message(inner) => replaced += replace_secrets(inner),
            Value::List(items) => {
                for item in items {
                    if let Value::Message(inner) = item {
                        replaced += replace_secrets(inner);
                    }
                }
            }
            Value::Map(entries) => {
                for value in entries.values_mut() {
                    if let Value::Message(inner) = value {
                        replaced += replace_secrets(inner);
                    }
                }
            }
            _ => {}
        }
    }
    replaced
}

/// Renders the message, checks the rendering is JSON, and that it does not depend on the
/// secrets' values; returns it.
fn check(full_name: &str, encoded: &[u8]) -> String {
    let rendered = sanitize_encoded(full_name, encoded);
    if rendered == format!("<unprintable {full_name}>") {
        return rendered;
    }
    if let Err(err) = serde_json::from_str::<serde_json::Value>(&rendered) {
        panic!("not JSON ({err}): {rendered}");
    }
    let descriptor = messages()
        .iter()
        .find(|m| m.full_name() == full_name)
        .expect("the rendered type is one of the pool's");
    let Ok(mut decoded) = DynamicMessage::decode(descriptor.clone(), encoded) else {
        panic!("rendered what does not decode: {rendered}");
    };
    let replaced = replace_secrets(&mut decoded);
    let again = sanitize_encoded(full_name, &decoded.encode_to_vec());
    assert_eq!(rendered, again, "the rendering depends on secret values");
    // One way only: any other string may read `***stripped***` as well.
    assert!(
        replaced == 0 || rendered.contains(&format!("\"{STRIPPED}\"")),
        "{replaced} secret fields set: {rendered}"
    );
    rendered
}

fuzz_target!(|data: &[u8]| {
    let [pick, mode, rest @ ..] = data else {
        return;
    };
    let all = messages();
    let descriptor = &all[usize::from(*pick) % all.len()];
    let full_name = descriptor.full_name();
    if mode & 1 == 0 {
        check(full_name, rest);
        return;
    }
    let mut u = Unstructured::new(rest);
    let Ok(built) = message(&mut u, descriptor, false, 0) else {
        return;
    };
    let rendered = check(full_name, &built.encode_to_vec());
    assert!(!rendered.contains(MARKER), "a secret leaked: {rendered}");
});
