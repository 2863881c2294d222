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

#[path = "parts.rs"]
mod parts;

use libfuzzer_sys::fuzz_target;
use prost::Message;
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

fuzz_target!(|data: &[u8]| {
    let Some((body, parts, complete)) =
        parts::read_checked(data, LIMIT, || ProtobufList::new(LIMIT))
    else {
        return;
    };
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
    let mut metadata = parts.iter().filter(|(item, _)| !*item).map(|(_, p)| p);
    assert_eq!(metadata.next_back(), list.metadata.as_ref());
});
