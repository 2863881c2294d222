//! A list's body, cut into its items as its bytes arrive.
//!
//! A list of 100 000 claims is ~150 MB of JSON. Decoding it whole, as kube's client does, holds
//! the body and every decoded object at once (several hundred MiB) before the first object is
//! projected. [`ListBody`] only finds where each item begins and ends, so each can be decoded
//! and projected on its own while the rest is still on the wire: what is held is one item.
//!
//! It does not check that the JSON is valid: serde does, for every item and for the list's
//! metadata, which is all that is read. No streaming JSON crate hands out the raw bytes of an
//! array's elements from a body pushed in chunks, which is what lets serde decode each item
//! into the object type straight from one slice.

/// Replaces the value of `metadata.managedFields` in the object at `path` of `json` (the object
/// itself when `path` is empty) with `null`. No controller reads it, and it is half of a claim's
/// or a PV's bytes and most of the cost of decoding one. A JSON that is not as expected is left
/// as it is, for serde to judge.
pub fn drop_managed_fields(json: &mut Vec<u8>, path: &[&[u8]]) {
    let mut start = 0;
    for key in path
        .iter()
        .copied()
        .chain([&b"metadata"[..], b"managedFields"])
    {
        let Some(at) = value_of(&json[start..], key) else {
            return;
        };
        start += at;
    }
    if let Some(len) = Extent::default().end(&json[start..]) {
        json.splice(start..start + len, *b"null");
    }
}

/// Where the value of `key` starts in the JSON object that `json` starts with (after
/// whitespace). Only the values before it are read to their ends.
fn value_of(json: &[u8], key: &[u8]) -> Option<usize> {
    let skip_space = |mut i: usize| {
        while json.get(i).is_some_and(u8::is_ascii_whitespace) {
            i += 1;
        }
        i
    };
    let mut i = skip_space(0);
    if json.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    loop {
        i = skip_space(i);
        match json.get(i)? {
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let name = Extent::default().end(&json[i..])?;
        let this = &json[i + 1..i + name - 1];
        i = skip_space(i + name);
        if json.get(i) != Some(&b':') {
            return None;
        }
        i = skip_space(i + 1);
        if this == key {
            return Some(i);
        }
        i += Extent::default().end(&json[i..])?;
    }
}

/// A part of the list that was read whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Part<'a> {
    /// The list's `metadata` (its resourceVersion).
    Metadata(&'a [u8]),
    /// One element of `items`, for the caller to trim before decoding.
    Item(&'a mut Vec<u8>),
}

/// A list's body read chunk by chunk, in one encoding, and handed out a part at a time.
pub trait ListReader: Send {
    /// The next part found in `input`, which is advanced past it; `None` once `input` is used
    /// up without completing one (the rest of the part is in the next chunk).
    fn next<'s>(&'s mut self, input: &mut &[u8]) -> Result<Option<Part<'s>>, ListError>;

    /// Whether the body ended where the list does.
    fn finish(&self) -> Result<(), ListError>;
}

/// Why a body is not a list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListError {
    #[error("the body is not a JSON object")]
    NotAnObject,
    #[error("unexpected {0:?} in the list's body")]
    Unexpected(char),
    #[error("an item or key of the list is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the list's body ends before the list does")]
    Truncated,
    #[error("the body does not start as kube-apiserver's protobuf does")]
    NotProtobuf,
    #[error("the protobuf list is malformed: {0}")]
    Malformed(&'static str),
}

/// The longest key the list's object is read with; its keys are short words.
const MAX_KEY: usize = 64;

/// Where in the list's object the reader is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    Start,
    BeforeKey,
    InKey {
        escaped: bool,
    },
    BeforeColon,
    /// After the colon of a key other than `items`, before its value.
    BeforeValue {
        keep: bool,
    },
    /// After `"items":`, before its `[`.
    BeforeItems,
    BeforeItem,
    Item,
    /// The value of another key; kept if it is the metadata.
    Value {
        keep: bool,
    },
    Done,
}

/// One JSON value's extent, found byte by byte.
#[derive(Clone, Copy, Debug, Default)]
struct Extent {
    started: bool,
    /// Open objects and arrays; 0 in a bare string or scalar.
    depth: u32,
    in_string: bool,
    escaped: bool,
    scalar: bool,
}

enum Scanned {
    /// All of the input belongs to the value; it goes on.
    More,
    /// The value ends after this many bytes of the input.
    Ends(usize),
}

impl Extent {
    /// The length of the value `input` starts with, when it ends within `input`.
    fn end(mut self, input: &[u8]) -> Option<usize> {
        match self.scan(input) {
            Scanned::Ends(n) => Some(n),
            Scanned::More => None,
        }
    }

    fn scan(&mut self, input: &[u8]) -> Scanned {
        let n = input.len();
        let mut i = 0;
        while i < n {
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', &input[i..]) {
                    None => return Scanned::More,
                    Some(at) => i += at,
                }
                if input[i] == b'\\' {
                    self.escaped = true;
                } else {
                    self.in_string = false;
                    if self.depth == 0 {
                        return Scanned::Ends(i + 1);
                    }
                }
                i += 1;
                continue;
            }
            if !self.started {
                self.started = true;
                match input[i] {
                    b'{' | b'[' => self.depth = 1,
                    b'"' => self.in_string = true,
                    _ => self.scalar = true,
                }
                i += 1;
                continue;
            }
            if self.scalar {
                let b = input[i];
                if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                    return Scanned::Ends(i);
                }
                i += 1;
                continue;
            }
            while i < n && !STRUCTURE[usize::from(input[i])] {
                i += 1;
            }
            if i == n {
                return Scanned::More;
            }
            match input[i] {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                _ => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Scanned::Ends(i + 1);
                    }
                }
            }
            i += 1;
        }
        Scanned::More
    }
}

/// The bytes of `of`, as a table for a byte loop: between an object's structural bytes are
/// mostly short runs, found sooner by a plain loop than by a vectorized search set up for each.
const fn byte_set(of: &[u8]) -> [bool; 256] {
    let mut table = [false; 256];
    let mut i = 0;
    while i < of.len() {
        table[of[i] as usize] = true;
        i += 1;
    }
    table
}

/// What matters in an object or array outside its strings.
const STRUCTURE: [bool; 256] = byte_set(b"\"{}[]");

/// Reads a list's JSON body chunk by chunk and hands out its items one at a time.
#[derive(Debug)]
pub struct ListBody {
    at: At,
    key: Vec<u8>,
    value: Vec<u8>,
    extent: Extent,
    /// The most bytes one item (or the metadata) may have.
    limit: usize,
}

impl ListBody {
    /// A reader that refuses items longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            at: At::Start,
            key: Vec::new(),
            value: Vec::new(),
            extent: Extent::default(),
            limit,
        }
    }

    fn begin_value(&mut self) {
        self.value.clear();
        self.extent = Extent::default();
    }
}

impl ListReader for ListBody {
    fn next<'s>(&'s mut self, input: &mut &[u8]) -> Result<Option<Part<'s>>, ListError> {
        while let Some(&b) = input.first() {
            match self.at {
                At::Item | At::Value { .. } => {
                    let (taken, ends) = match self.extent.scan(input) {
                        Scanned::More => (input.len(), false),
                        Scanned::Ends(n) => (n, true),
                    };
                    if self.value.len() + taken > self.limit {
                        return Err(ListError::TooLarge(self.limit));
                    }
                    self.value.extend_from_slice(&input[..taken]);
                    *input = &input[taken..];
                    if !ends {
                        continue;
                    }
                    match self.at {
                        At::Item => {
                            self.at = At::BeforeItem;
                            return Ok(Some(Part::Item(&mut self.value)));
                        }
                        At::Value { keep: true } => {
                            self.at = At::BeforeKey;
                            return Ok(Some(Part::Metadata(&self.value)));
                        }
                        _ => self.at = At::BeforeKey,
                    }
                    continue;
                }
                At::InKey { escaped } => {
                    self.at = match b {
                        b'"' if !escaped => At::BeforeColon,
                        _ => {
                            if self.key.len() == MAX_KEY {
                                return Err(ListError::TooLarge(MAX_KEY));
                            }
                            self.key.push(b);
                            At::InKey {
                                escaped: !escaped && b == b'\\',
                            }
                        }
                    };
                    *input = &input[1..];
                    continue;
                }
                _ => {}
            }
            if b.is_ascii_whitespace() {
                *input = &input[1..];
                continue;
            }
            self.at = match (self.at, b) {
                (At::Start, b'{') => At::BeforeKey,
                (At::Start, _) => return Err(ListError::NotAnObject),
                (At::BeforeKey, b',') => At::BeforeKey,
                (At::BeforeKey, b'"') => {
                    self.key.clear();
                    At::InKey { escaped: false }
                }
                (At::BeforeKey, b'}') => At::Done,
                (At::BeforeColon, b':') if self.key == b"items" => At::BeforeItems,
                (At::BeforeColon, b':') => At::BeforeValue {
                    keep: self.key == b"metadata",
                },
                (At::BeforeValue { keep }, _) => {
                    self.begin_value();
                    self.at = At::Value { keep };
                    continue;
                }
                (At::BeforeItems, b'[') => At::BeforeItem,
                // `"items": null` is an empty list.
                (At::BeforeItems, _) => {
                    self.begin_value();
                    self.at = At::Value { keep: false };
                    continue;
                }
                (At::BeforeItem, b',') => At::BeforeItem,
                (At::BeforeItem, b']') => At::BeforeKey,
                (At::BeforeItem, _) => {
                    self.begin_value();
                    self.at = At::Item;
                    continue;
                }
                (_, b) => return Err(ListError::Unexpected(char::from(b))),
            };
            *input = &input[1..];
        }
        Ok(None)
    }

    fn finish(&self) -> Result<(), ListError> {
        match self.at {
            At::Done => Ok(()),
            _ => Err(ListError::Truncated),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part of `body` fed in chunks of `size` bytes, as owned text.
    fn parts(body: &str, size: usize) -> Result<Vec<(bool, String)>, ListError> {
        let mut list = ListBody::new(1 << 20);
        let mut found = Vec::new();
        for chunk in body.as_bytes().chunks(size) {
            let mut input = chunk;
            while let Some(part) = list.next(&mut input)? {
                found.push(match part {
                    Part::Metadata(m) => (false, String::from_utf8_lossy(m).into_owned()),
                    Part::Item(i) => (true, String::from_utf8_lossy(i).into_owned()),
                });
            }
            assert!(input.is_empty());
        }
        list.finish()?;
        Ok(found)
    }

    const LIST: &str = r#"{"kind":"PersistentVolumeClaimList","apiVersion":"v1",
        "metadata":{"resourceVersion":"42"},
        "items":[{"metadata":{"name":"a \"}]\\"},"spec":{"x":[1,{"y":"]"}]}},
                 {"metadata":{"name":"b"}} , 7, "s\"", null]}"#;

    #[test]
    fn items_and_metadata_come_out_whole_whatever_the_chunks() {
        let expected = vec![
            (false, r#"{"resourceVersion":"42"}"#.to_string()),
            (
                true,
                r#"{"metadata":{"name":"a \"}]\\"},"spec":{"x":[1,{"y":"]"}]}}"#.to_string(),
            ),
            (true, r#"{"metadata":{"name":"b"}}"#.to_string()),
            (true, "7".to_string()),
            (true, r#""s\"""#.to_string()),
            (true, "null".to_string()),
        ];
        for size in [1, 2, 3, 7, 64, LIST.len()] {
            assert_eq!(parts(LIST, size).unwrap(), expected, "chunks of {size}");
        }
    }

    /// As kube-apiserver writes a list for `?pretty=true`: whitespace after every colon. Found
    /// by the `list_body` fuzz target: the value after `"metadata": ` was read from the space.
    #[test]
    fn a_pretty_printed_list_reads_as_the_compact_one() {
        let compact: serde_json::Value = serde_json::from_str(LIST).unwrap();
        let pretty = serde_json::to_string_pretty(&compact).unwrap();
        // The metadata, then the items in order (serde writes the keys sorted, items first).
        let values = |body: &str, size| -> Vec<(bool, serde_json::Value)> {
            let mut found: Vec<(bool, serde_json::Value)> = parts(body, size)
                .unwrap()
                .into_iter()
                .map(|(item, text)| (item, serde_json::from_str(&text).unwrap()))
                .collect();
            found.sort_by_key(|(item, _)| *item);
            found
        };
        let expected = values(LIST, LIST.len());
        assert_eq!(expected.len(), 6);
        for size in [1, 2, 5, pretty.len()] {
            assert_eq!(values(&pretty, size), expected, "chunks of {size}");
        }
        assert_eq!(
            parts("{\"z\":\n{}, \"metadata\" :\t{} }", 3).unwrap(),
            vec![(false, "{}".to_string())]
        );
    }

    #[test]
    fn empty_and_null_items_are_empty_lists() {
        for body in [
            r#"{"metadata":{},"items":[]}"#,
            r#"{"items":null,"metadata":{}}"#,
        ] {
            assert_eq!(parts(body, 3).unwrap(), vec![(false, "{}".to_string())]);
        }
    }

    #[test]
    fn other_keys_are_skipped() {
        let body = r#"{"a":{"items":[1]},"b":"metadata","c":[{"d":1}],"e":-1.5e3,"items":[{}]}"#;
        assert_eq!(parts(body, 5).unwrap(), vec![(true, "{}".to_string())]);
    }

    #[test]
    fn a_body_that_is_no_list_or_ends_early_is_refused() {
        assert_eq!(parts("[1,2]", 4), Err(ListError::NotAnObject));
        assert_eq!(parts(r#"{"items":[{"a":1}"#, 4), Err(ListError::Truncated));
        assert_eq!(parts(r#"{"items":[{}]"#, 4), Err(ListError::Truncated));
        assert_eq!(parts(r#"{"items" 1}"#, 4), Err(ListError::Unexpected('1')));
        assert_eq!(
            parts(r#"{"items":[]} x"#, 4),
            Err(ListError::Unexpected('x'))
        );
    }

    #[test]
    fn an_item_over_the_limit_is_refused_before_it_is_held() {
        let mut list = ListBody::new(8);
        let mut input: &[u8] = br#"{"items":[{"a":"0123456789"}]}"#;
        assert_eq!(list.next(&mut input), Err(ListError::TooLarge(8)));
        let mut list = ListBody::new(8);
        let mut input: &[u8] = br#"{"items":[{"a":1}]}"#;
        assert_eq!(
            list.next(&mut input),
            Ok(Some(Part::Item(&mut br#"{"a":1}"#.to_vec())))
        );
    }

    #[test]
    fn managed_fields_are_read_as_null() {
        let drop = |json: &str, path: &[&[u8]]| {
            let mut bytes = json.as_bytes().to_vec();
            drop_managed_fields(&mut bytes, path);
            String::from_utf8(bytes).unwrap()
        };
        let item = r#"{"kind":"X", "metadata" : {"name":"a","x":{"managedFields":1},
            "managedFields" : [{"manager":"m","fieldsV1":{"f:a\"}":{}}}],"uid":"u"},"spec":{}}"#;
        let expected = r#"{"kind":"X", "metadata" : {"name":"a","x":{"managedFields":1},
            "managedFields" : null,"uid":"u"},"spec":{}}"#;
        assert_eq!(drop(item, &[]), expected);
        let event = format!(r#"{{"type":"ADDED","object":{item}}}"#);
        assert_eq!(
            drop(&event, &[b"object"]),
            format!(r#"{{"type":"ADDED","object":{expected}}}"#)
        );
        // Anything else is left as it is.
        for json in [
            r#"{"metadata":{"name":"a"}}"#,
            r#"{"metadata":"managedFields"}"#,
            r#"{"spec":{"managedFields":[]}}"#,
            r#"{"metadata":{"managedFields":[1,2"#,
            r#"[{"metadata":{"managedFields":[]}}]"#,
            "",
        ] {
            assert_eq!(drop(json, &[]), json);
        }
    }

    #[test]
    fn a_long_key_is_refused() {
        let body = format!(r#"{{"{}":1}}"#, "k".repeat(MAX_KEY + 1));
        assert_eq!(parts(&body, 16), Err(ListError::TooLarge(MAX_KEY)));
    }
}
