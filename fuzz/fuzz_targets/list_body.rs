//! The reading of a list's body in chunks, as the watches read 100 000 objects without holding
//! them all.
//!
//! The first byte picks the chunk size; the rest is the body.
//!
//! Properties:
//! - nothing panics and no part is longer than the limit;
//! - the parts found do not depend on where the chunks are cut;
//! - for a body that is a JSON object, every element of its `items` comes out as exactly the
//!   JSON of that element, in order, and its `metadata` as its `metadata`.
#![no_main]

#[path = "parts.rs"]
mod parts;

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sidecar_kit::pipeline::listing::ListBody;

const LIMIT: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let Some((body, parts, complete)) = parts::read_checked(data, LIMIT, || ListBody::new(LIMIT))
    else {
        return;
    };

    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    // Keys are read as written: escapes, repeated keys (the last one wins in serde) and the
    // word as a value make the reading differ from serde's.
    let written = |word: &[u8]| body.windows(word.len()).filter(|w| *w == word).count();
    if body.len() > LIMIT
        || body.contains(&b'\\')
        || written(b"\"items\"") > 1
        || written(b"\"metadata\"") > 1
        || object.keys().any(|k| k.len() > 64)
    {
        return;
    }
    assert!(complete, "a JSON object is a complete list");
    let items: Vec<Value> = parts
        .iter()
        .filter(|(item, _)| *item)
        .map(|(_, p)| serde_json::from_slice(p).expect("an item is one JSON value"))
        .collect();
    match object.get("items") {
        Some(Value::Array(expected)) => assert_eq!(&items, expected),
        _ => assert!(items.is_empty()),
    }
    let metadata: Vec<Value> = parts
        .iter()
        .filter(|(item, _)| !*item)
        .map(|(_, p)| serde_json::from_slice(p).expect("the metadata is one JSON value"))
        .collect();
    assert_eq!(metadata.last(), object.get("metadata"));
});
