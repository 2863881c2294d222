//! Reading a list's body in chunks, for the targets of the list readers.

use sidecar_kit::pipeline::listing::{ListReader, Part};

/// What a reader found in a body: whether each part is an item, and its bytes.
pub type Parts = Vec<(bool, Vec<u8>)>;

/// The parts `reader` finds in `body` read in chunks of `size`, and whether the body was a
/// complete list.
fn read(mut reader: impl ListReader, body: &[u8], size: usize) -> (Parts, bool) {
    let mut parts = Vec::new();
    for chunk in body.chunks(size) {
        let mut input = chunk;
        loop {
            match reader.next(&mut input) {
                Ok(Some(part)) => parts.push(match part {
                    Part::Metadata(m) => (false, m.to_vec()),
                    Part::Item(i) => (true, i.clone()),
                }),
                Ok(None) => break,
                Err(_) => return (parts, false),
            }
        }
    }
    let complete = reader.finish().is_ok();
    (parts, complete)
}

/// The body of `data`, whose first byte picks the chunk size (1 to 64), its parts as a reader
/// that `new` makes finds them, and whether it was a complete list; checked on the way: no part
/// is longer than `limit`, and the parts do not depend on where the chunks are cut.
pub fn read_checked<R: ListReader>(
    data: &[u8],
    limit: usize,
    new: impl Fn() -> R,
) -> Option<(&[u8], Parts, bool)> {
    let (&first, body) = data.split_first()?;
    let size = usize::from(first % 64) + 1;
    let (parts, complete) = read(new(), body, size);
    assert!(parts.iter().all(|(_, p)| p.len() <= limit));
    assert_eq!(
        (parts.clone(), complete),
        read(new(), body, body.len().max(1))
    );
    Some((body, parts, complete))
}
