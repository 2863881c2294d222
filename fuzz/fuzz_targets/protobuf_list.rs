//! The reading of a protobuf list's body in chunks, as the watches read claims and PVs from
//! kube-apiserver, and the decoding of its items.
//!
//! The first byte picks the chunk size; the rest is the body.
//!
//! Properties:
//! - nothing panics and no part is longer than the limit;
//! - the parts found do not depend on where the chunks are cut;
//! - a body read as a complete list is one that prost reads as an envelope whose `raw` is a
//!   list, with the same items in order and the same (last) metadata;
//! - decoding any item as a PV or a claim returns, without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use sidecar_kit::pipeline::listing::Part;
use sidecar_kit::pipeline::protobuf::core_v1::{persistent_volume, persistent_volume_claim};
use sidecar_kit::pipeline::protobuf::{MAGIC, ProtobufList};

const LIMIT: usize = 4096;

/// `runtime.Unknown`, as far as the list goes.
#[derive(Clone, PartialEq, Message)]
struct Envelope {
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
}

/// A list, with its parts left as bytes.
#[derive(Clone, PartialEq, Message)]
struct List {
    #[prost(bytes = "vec", optional, tag = "1")]
    metadata: Option<Vec<u8>>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    items: Vec<Vec<u8>>,
}

/// The parts of `body` read in chunks of `size`, and whether it was a complete list.
fn read(body: &[u8], size: usize) -> (Vec<(bool, Vec<u8>)>, bool) {
    let mut list = ProtobufList::new(LIMIT);
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
    for (_, part) in &parts {
        let _ = persistent_volume(part);
        let _ = persistent_volume_claim(part);
    }
    if !complete {
        return;
    }
    let envelope = Envelope::decode(&body[MAGIC.len()..]).expect("prost reads the envelope");
    let list = List::decode(&envelope.raw.expect("a list")[..]).expect("prost reads the list");
    let items: Vec<Vec<u8>> = parts
        .iter()
        .filter(|(item, _)| *item)
        .map(|(_, p)| p.clone())
        .collect();
    assert_eq!(items, list.items);
    let metadata = parts.iter().filter(|(item, _)| !*item).map(|(_, p)| p);
    assert_eq!(metadata.last(), list.metadata.as_ref());
});
