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

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use sidecar_kit::pipeline::listing::{ListBody, Part};

const LIMIT: usize = 4096;

/// The parts of `body` read in chunks of `size`, and whether it was a complete list.
fn read(body: &[u8], size: usize) -> (Vec<(bool, Vec<u8>)>, bool) {
    let mut list = ListBody::new(LIMIT);
    let mut parts = Vec::new();
    for chunk in body.chunks(size) {
        let mut input = chunk;
        loop {
            match list.next(&mut input) {
                Ok(Some(part)) => parts.push(match part {
                    Part::Metadata(m) => (false, m.to_vec()),
                    Part::Item(i) => (true, i.clone()),
                }),
                Ok(None) => break,
                Err(_) => return (parts, false),
            }
        }
    }
    let complete = list.finish().is_ok();
    (parts, complete)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let size = usize::from(first % 64) + 1;
    let (parts, complete) = read(body, size);
    assert!(parts.iter().all(|(_, p)| p.len() <= LIMIT));
    assert_eq!((parts.clone(), complete), read(body, body.len().max(1)));

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
