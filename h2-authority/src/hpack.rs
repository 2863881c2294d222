//! HPACK (RFC 7541): a decoder that mirrors a peer's dynamic table, and an encoder that either
//! never touches the dynamic table (what the adapter forwards) or indexes every field as
//! grpc-go's encoder does (what the test clients send).

use std::collections::VecDeque;

use crate::huffman;

/// The dynamic table size both ends start with (SETTINGS_HEADER_TABLE_SIZE's initial value).
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// The bound on a decoded header list until told otherwise. HTTP/2 sets no initial
/// SETTINGS_MAX_HEADER_LIST_SIZE, but a decoder without one turns a one-byte reference into a
/// copy of a whole table entry: 16 KiB is what hyper's server (so tonic's) advertises by default.
pub const DEFAULT_MAX_LIST_SIZE: usize = 16 * 1024;

/// What a field costs beyond its name and value, in a dynamic table (RFC 7541, 4.1) and in a
/// header list (RFC 9113, 6.5.2) alike.
pub const FIELD_OVERHEAD: usize = 32;

/// A header block that cannot be decoded. Each is a COMPRESSION_ERROR in HTTP/2 terms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("the header block ends inside a field")]
    Truncated,
    #[error("an integer does not fit in 32 bits")]
    IntegerOverflow,
    #[error("invalid Huffman-coded string")]
    Huffman,
    #[error("index {0} is not in the header table")]
    BadIndex(usize),
    #[error("dynamic table size update to {size} above the advertised {limit}")]
    TableSizeAboveLimit { size: usize, limit: usize },
    #[error("dynamic table size update after a header field")]
    LateTableSizeUpdate,
    /// Decoding stopped there, so the dynamic table may have fallen out of step with the peer's:
    /// the block cannot be skipped, only the connection ended.
    #[error("decoded header list larger than {limit} bytes (SETTINGS_MAX_HEADER_LIST_SIZE)")]
    HeaderListTooLarge { limit: usize },
}

/// One header field as sent, with whether it was marked never to be indexed (sensitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    pub sensitive: bool,
}

impl Header {
    pub fn new(name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            sensitive: false,
        }
    }

    /// A field to be sent as a never-indexed literal.
    pub fn sensitive(name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            sensitive: true,
            ..Self::new(name, value)
        }
    }

    /// The size the field takes in a dynamic table (RFC 7541, 4.1).
    pub fn table_size(&self) -> usize {
        entry_size(&self.name, &self.value)
    }
}

fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + FIELD_OVERHEAD
}

/// The size of a header list as SETTINGS_MAX_HEADER_LIST_SIZE counts it (RFC 9113, 6.5.2).
pub fn list_size(headers: &[Header]) -> usize {
    headers.iter().map(Header::table_size).sum()
}

/// RFC 7541, Appendix A.
const STATIC_TABLE: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// How a field matches the static table: its full 1-based index, or that of its name.
fn static_match(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let mut by_name = None;
    for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
        if n.as_bytes() == name {
            if v.as_bytes() == value {
                return (Some(i + 1), Some(i + 1));
            }
            by_name.get_or_insert(i + 1);
        }
    }
    (None, by_name)
}

/// The dynamic table: newest entry first, so entry `i` has index `62 + i`.
#[derive(Debug, Default)]
struct DynamicTable {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    fn new(max_size: usize) -> Self {
        Self {
            max_size,
            ..Self::default()
        }
    }

    fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }

    fn evict_to(&mut self, size: usize) {
        while self.size > size {
            match self.entries.pop_back() {
                Some((name, value)) => self.size -= entry_size(&name, &value),
                None => break,
            }
        }
    }

    /// Adds an entry, evicting old ones; one larger than the table empties it (RFC 7541, 4.4).
    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = entry_size(&name, &value);
        if size > self.max_size {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - size);
        self.size += size;
        self.entries.push_front((name, value));
    }

    fn position(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut by_name = None;
        for (i, (n, v)) in self.entries.iter().enumerate() {
            if n == name {
                if v == value {
                    return (Some(i), Some(i));
                }
                by_name.get_or_insert(i);
            }
        }
        (None, by_name)
    }
}

/// Decodes header blocks, keeping the dynamic table in step with the peer's encoder.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// The largest table size the peer may ask for: our SETTINGS_HEADER_TABLE_SIZE.
    limit: usize,
    /// The largest header list decoded: our SETTINGS_MAX_HEADER_LIST_SIZE.
    max_list_size: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new(DEFAULT_TABLE_SIZE)
    }
}

impl Decoder {
    /// A decoder whose table starts at `limit`, the advertised SETTINGS_HEADER_TABLE_SIZE, and
    /// whose header lists are held to [`DEFAULT_MAX_LIST_SIZE`].
    pub fn new(limit: usize) -> Self {
        Self {
            table: DynamicTable::new(limit),
            limit,
            max_list_size: DEFAULT_MAX_LIST_SIZE,
        }
    }

    /// Changes the bound on decoded header lists.
    pub fn set_max_list_size(&mut self, max_list_size: usize) {
        self.max_list_size = max_list_size;
    }

    pub fn max_list_size(&self) -> usize {
        self.max_list_size
    }

    /// Changes the bound for the peer's table size updates.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The dynamic table's current maximum size, as last set by the peer.
    pub fn max_table_size(&self) -> usize {
        self.table.max_size
    }

    /// The dynamic table's current size.
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Decodes one complete header block. A list larger than the maximum is an error as soon as
    /// the field that crosses it is seen, before that field is copied: a one-byte reference to a
    /// 4 KiB entry must not cost 4 KiB past the bound.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Header>, HpackError> {
        let mut input = Input { bytes: block };
        let mut headers = Vec::new();
        // What the list may still grow by.
        let mut room = self.max_list_size;
        while let Some(&first) = input.bytes.first() {
            if first & 0x80 != 0 {
                let index = input.integer(7)?;
                let (name, value) = self.entry(index)?;
                room = room
                    .checked_sub(entry_size(name, value))
                    .ok_or(self.too_large())?;
                headers.push(Header::new(name, value));
            } else if first & 0xc0 == 0x40 {
                let header = self.literal(&mut input, 6, false, room)?;
                room -= header.table_size();
                self.table.insert(header.name.clone(), header.value.clone());
                headers.push(header);
            } else if first & 0xe0 == 0x20 {
                if !headers.is_empty() {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let size = input.integer(5)?;
                if size > self.limit {
                    return Err(HpackError::TableSizeAboveLimit {
                        size,
                        limit: self.limit,
                    });
                }
                self.table.set_max_size(size);
            } else {
                // 0001xxxx never indexed, 0000xxxx without indexing.
                let sensitive = first & 0x10 != 0;
                let header = self.literal(&mut input, 4, sensitive, room)?;
                room -= header.table_size();
                headers.push(header);
            }
        }
        Ok(headers)
    }

    fn too_large(&self) -> HpackError {
        HpackError::HeaderListTooLarge {
            limit: self.max_list_size,
        }
    }

    /// A literal field whose size is at most `room`.
    fn literal(
        &self,
        input: &mut Input<'_>,
        prefix: u8,
        sensitive: bool,
        room: usize,
    ) -> Result<Header, HpackError> {
        let index = input.integer(prefix)?;
        let room = room.checked_sub(FIELD_OVERHEAD).ok_or(self.too_large())?;
        let name = if index == 0 {
            input.string(room)?.ok_or(self.too_large())?
        } else {
            let name = self.entry(index)?.0;
            if name.len() > room {
                return Err(self.too_large());
            }
            name.to_vec()
        };
        let value = input.string(room - name.len())?.ok_or(self.too_large())?;
        Ok(Header {
            name,
            value,
            sensitive,
        })
    }

    /// The name and value at `index`, without copying them.
    fn entry(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        if index == 0 {
            return Err(HpackError::BadIndex(0));
        }
        if let Some((name, value)) = STATIC_TABLE.get(index - 1) {
            return Ok((name.as_bytes(), value.as_bytes()));
        }
        self.table
            .entries
            .get(index - 1 - STATIC_TABLE.len())
            .map(|(name, value)| (&name[..], &value[..]))
            .ok_or(HpackError::BadIndex(index))
    }
}

struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn byte(&mut self) -> Result<u8, HpackError> {
        let (&first, rest) = self.bytes.split_first().ok_or(HpackError::Truncated)?;
        self.bytes = rest;
        Ok(first)
    }

    /// An integer with an `prefix`-bit prefix (RFC 7541, 5.1), at most `u32::MAX`.
    fn integer(&mut self, prefix: u8) -> Result<usize, HpackError> {
        let mask = (1u8 << prefix) - 1;
        let mut value = u64::from(self.byte()? & mask);
        if value < u64::from(mask) {
            return Ok(value as usize);
        }
        let mut shift = 0;
        loop {
            let byte = self.byte()?;
            value += u64::from(byte & 0x7f) << shift;
            if value > u64::from(u32::MAX) {
                return Err(HpackError::IntegerOverflow);
            }
            if byte & 0x80 == 0 {
                return Ok(value as usize);
            }
            shift += 7;
            if shift > 28 {
                return Err(HpackError::IntegerOverflow);
            }
        }
    }

    /// A string literal, or `None` if it is longer than `max_len` bytes; nothing past that is
    /// allocated.
    fn string(&mut self, max_len: usize) -> Result<Option<Vec<u8>>, HpackError> {
        let huffman_coded = self.bytes.first().is_some_and(|b| b & 0x80 != 0);
        let len = self.integer(7)?;
        if len > self.bytes.len() {
            return Err(HpackError::Truncated);
        }
        let (raw, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        if !huffman_coded {
            return Ok((len <= max_len).then(|| raw.to_vec()));
        }
        // No code is shorter than 5 bits.
        let mut out = Vec::with_capacity(max_len.min(len.saturating_mul(8) / 5));
        match huffman::decode(raw, &mut out, max_len) {
            Ok(()) => Ok(Some(out)),
            Err(huffman::DecodeError::TooLong) => Ok(None),
            Err(huffman::DecodeError::Invalid) => Err(HpackError::Huffman),
        }
    }
}

/// Encodes header blocks.
#[derive(Debug)]
pub struct Encoder {
    table: DynamicTable,
    /// Index fields in the dynamic table and Huffman-code strings that get shorter.
    compress: bool,
    /// A table size change still to be announced at the start of the next block.
    size_update: Option<usize>,
}

impl Encoder {
    /// Uses only the static table and plain strings, so the peer's dynamic table never changes
    /// whatever it was told before: the adapter's re-encoding.
    pub fn plain() -> Self {
        Self {
            table: DynamicTable::new(0),
            compress: false,
            size_update: None,
        }
    }

    /// Indexes every field that is not sensitive and Huffman-codes strings where that is
    /// shorter, as grpc-go's encoder does; the table starts at `max_size`.
    pub fn indexing(max_size: usize) -> Self {
        Self {
            table: DynamicTable::new(max_size),
            compress: true,
            size_update: None,
        }
    }

    /// Changes the dynamic table size, announced at the start of the next block.
    pub fn set_max_table_size(&mut self, size: usize) {
        self.table.set_max_size(size);
        self.size_update = Some(size);
    }

    pub fn encode(&mut self, headers: &[Header], out: &mut Vec<u8>) {
        if let Some(size) = self.size_update.take() {
            integer(size, 5, 0x20, out);
        }
        for header in headers {
            self.field(header, out);
        }
    }

    fn field(&mut self, header: &Header, out: &mut Vec<u8>) {
        let (name, value) = (&header.name[..], &header.value[..]);
        let (static_full, static_name) = static_match(name, value);
        let (dynamic_full, dynamic_name) = if self.compress {
            self.table.position(name, value)
        } else {
            (None, None)
        };
        let dynamic_index = |i: usize| STATIC_TABLE.len() + 1 + i;
        if !header.sensitive
            && let Some(index) = static_full.or(dynamic_full.map(dynamic_index))
        {
            integer(index, 7, 0x80, out);
            return;
        }
        let name_index = static_name.or(dynamic_name.map(dynamic_index));
        let (prefix, pattern) = if header.sensitive {
            (4, 0x10)
        } else if self.compress {
            (6, 0x40)
        } else {
            (4, 0x00)
        };
        match name_index {
            Some(index) => integer(index, prefix, pattern, out),
            None => {
                integer(0, prefix, pattern, out);
                self.string(name, out);
            }
        }
        self.string(value, out);
        if pattern == 0x40 {
            self.table.insert(name.to_vec(), value.to_vec());
        }
    }

    fn string(&self, text: &[u8], out: &mut Vec<u8>) {
        let coded_len = huffman::encoded_len(text);
        if self.compress && coded_len < text.len() {
            integer(coded_len, 7, 0x80, out);
            huffman::encode(text, out);
        } else {
            integer(text.len(), 7, 0x00, out);
            out.extend_from_slice(text);
        }
    }
}

/// Appends `value` as an integer with a `prefix`-bit prefix, the high bits set to `pattern`
/// (RFC 7541, 5.1).
pub fn integer(value: usize, prefix: u8, pattern: u8, out: &mut Vec<u8>) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(pattern | value as u8);
        return;
    }
    out.push(pattern | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
            .collect()
    }

    fn fields(pairs: &[(&str, &str)]) -> Vec<Header> {
        pairs.iter().map(|(n, v)| Header::new(*n, *v)).collect()
    }

    fn request_1() -> Vec<Header> {
        fields(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ])
    }

    fn request_2() -> Vec<Header> {
        let mut headers = request_1();
        headers.push(Header::new("cache-control", "no-cache"));
        headers
    }

    fn request_3() -> Vec<Header> {
        fields(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ])
    }

    /// RFC 7541 C.3 (plain strings) and C.4 (Huffman): three requests on one connection.
    #[test]
    fn rfc7541_c3_and_c4_requests() {
        let plain = [
            "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
            "8286 84be 5808 6e6f 2d63 6163 6865",
            "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
        ];
        let huffman = [
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            "8286 84be 5886 a8eb 1064 9cbf",
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
        ];
        let expected = [request_1(), request_2(), request_3()];
        let sizes = [57, 110, 164];
        for blocks in [plain, huffman] {
            let mut decoder = Decoder::default();
            for ((block, headers), size) in blocks.iter().zip(&expected).zip(sizes) {
                assert_eq!(&decoder.decode(&hex(block)).unwrap(), headers);
                assert_eq!(decoder.table_size(), size);
            }
        }
        // Our indexing encoder produces the Huffman blocks byte for byte.
        let mut encoder = Encoder::indexing(DEFAULT_TABLE_SIZE);
        for (block, headers) in huffman.iter().zip(&expected) {
            let mut out = Vec::new();
            encoder.encode(headers, &mut out);
            assert_eq!(out, hex(block));
        }
    }

    /// RFC 7541 C.5: responses with a 256-byte table, so that entries are evicted.
    #[test]
    fn rfc7541_c5_eviction() {
        let mut decoder = Decoder::new(256);
        let first = hex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 \
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70 \
             6c65 2e63 6f6d",
        );
        let date = "Mon, 21 Oct 2013 20:13:21 GMT";
        let mut expected = fields(&[
            (":status", "302"),
            ("cache-control", "private"),
            ("date", date),
            ("location", "https://www.example.com"),
        ]);
        assert_eq!(decoder.decode(&first).unwrap(), expected);
        assert_eq!(decoder.table_size(), 222);
        // ":status: 307" is added and evicts ":status: 302"; the rest are indexed.
        expected[0] = Header::new(":status", "307");
        assert_eq!(
            decoder.decode(&hex("4803 3330 37c1 c0bf")).unwrap(),
            expected
        );
        assert_eq!(decoder.table_size(), 222);
        assert_eq!(decoder.entry(62).unwrap().1, b"307");
        assert_eq!(decoder.entry(65).unwrap().1, b"private");
        assert_eq!(decoder.entry(66), Err(HpackError::BadIndex(66)));
    }

    #[test]
    fn table_size_updates_within_the_limit() {
        let mut decoder = Decoder::default();
        decoder
            .decode(&hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d"))
            .unwrap();
        assert_eq!(decoder.table_size(), 57);
        // Size update to 0 empties the table, then back to 4096 (0x3f e1 1f).
        let headers = decoder.decode(&hex("20 3fe11f 82")).unwrap();
        assert_eq!(headers, fields(&[(":method", "GET")]));
        assert_eq!(decoder.table_size(), 0);
        assert_eq!(decoder.max_table_size(), 4096);
        assert_eq!(decoder.decode(&hex("be")), Err(HpackError::BadIndex(62)));
        // Above the advertised limit, or after a field: errors.
        assert_eq!(
            decoder.decode(&hex("3fe13f")),
            Err(HpackError::TableSizeAboveLimit {
                size: 8192,
                limit: 4096
            })
        );
        assert_eq!(
            decoder.decode(&hex("82 20")),
            Err(HpackError::LateTableSizeUpdate)
        );
        // A larger limit, once advertised, may be used.
        decoder.set_limit(8192);
        decoder.decode(&hex("3fe13f")).unwrap();
        assert_eq!(decoder.max_table_size(), 8192);

        let mut encoder = Encoder::indexing(4096);
        encoder.set_max_table_size(100);
        let mut out = Vec::new();
        encoder.encode(&request_1(), &mut out);
        let mut decoder = Decoder::default();
        assert_eq!(decoder.decode(&out).unwrap(), request_1());
        assert_eq!(decoder.max_table_size(), 100);
    }

    #[test]
    fn never_indexed_stays_never_indexed() {
        let headers = vec![
            Header::sensitive("authorization", "secret"),
            Header::sensitive("x-token", "t"),
            Header::new("x-plain", "p"),
        ];
        for mut encoder in [Encoder::plain(), Encoder::indexing(4096)] {
            let mut out = Vec::new();
            encoder.encode(&headers, &mut out);
            // Literal never indexed with the static name 23 (0x1f 0x08), then a new name.
            assert_eq!(&out[..2], &[0x1f, 0x08]);
            let mut decoder = Decoder::default();
            assert_eq!(decoder.decode(&out).unwrap(), headers);
            let indexed = if encoder.compress { 32 + 8 } else { 0 };
            assert_eq!(decoder.table_size(), indexed);
        }
    }

    #[test]
    fn plain_encoding_leaves_the_table_alone() {
        let mut encoder = Encoder::plain();
        let mut decoder = Decoder::default();
        for _ in 0..3 {
            let mut out = Vec::new();
            encoder.encode(&request_3(), &mut out);
            assert_eq!(decoder.decode(&out).unwrap(), request_3());
            assert_eq!(decoder.table_size(), 0);
        }
        let mut out = Vec::new();
        encoder.encode(&fields(&[(":method", "GET"), ("x", "y")]), &mut out);
        assert_eq!(out, hex("82 00 0178 0179"));
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut decoder = Decoder::default();
        for block in [
            "80",              // index 0
            "ff",              // integer cut short
            "ff ffffffffff7f", // integer overflow
            "41 05 6162",      // string longer than the block
            "41 83 ffffff",    // Huffman EOS
            "40",              // literal without a name
            "0f",              // integer continuation missing
        ] {
            assert!(decoder.decode(&hex(block)).is_err(), "{block}");
        }
        // Every prefix of a valid block either decodes or fails; none panics.
        let block = hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf");
        for end in 0..block.len() {
            let _ = Decoder::default().decode(&block[..end]);
        }
    }

    /// A literal with incremental indexing of a 4 KiB value, then `refs` one-byte references to
    /// it: the amplification the list limit is for.
    fn amplifying_block(refs: usize) -> (Vec<u8>, Header) {
        let big = Header::new("x-a", "a".repeat(4000));
        let mut block = vec![0x40];
        Encoder::plain().string(&big.name, &mut block);
        Encoder::plain().string(&big.value, &mut block);
        block.extend(std::iter::repeat_n(0xbe, refs));
        (block, big)
    }

    #[test]
    fn header_lists_stop_at_the_limit() {
        let (block, big) = amplifying_block(1_000);
        let entry = big.table_size();
        assert_eq!(entry, 4035);
        let mut decoder = Decoder::default();
        assert_eq!(decoder.max_list_size(), DEFAULT_MAX_LIST_SIZE);
        assert_eq!(
            decoder.decode(&block),
            Err(HpackError::HeaderListTooLarge { limit: 16_384 })
        );

        // Exactly at the limit is fine, one byte less is not: the literal and three references.
        let (block, _) = amplifying_block(3);
        for (limit, ok) in [(4 * entry, true), (4 * entry - 1, false)] {
            let mut decoder = Decoder::default();
            decoder.set_max_list_size(limit);
            match decoder.decode(&block) {
                Ok(headers) => {
                    assert!(ok);
                    assert_eq!(headers, vec![big.clone(); 4]);
                    assert_eq!(list_size(&headers), limit);
                }
                Err(err) => {
                    assert!(!ok);
                    assert_eq!(err, HpackError::HeaderListTooLarge { limit });
                }
            }
        }

        // Literals are measured before they are copied, names and values, plain or Huffman.
        let long = "v".repeat(100);
        let mut plain = Vec::new();
        Encoder::plain().encode(&[Header::new("x-long", long.as_str())], &mut plain);
        let mut coded = Vec::new();
        Encoder::indexing(0).encode(&[Header::new(long.as_str(), "x-long")], &mut coded);
        for block in [plain, coded] {
            let mut decoder = Decoder::default();
            decoder.set_max_list_size(32 + 6 + 99);
            assert_eq!(
                decoder.decode(&block),
                Err(HpackError::HeaderListTooLarge { limit: 137 })
            );
            decoder.set_max_list_size(32 + 6 + 100);
            assert_eq!(list_size(&decoder.decode(&block).unwrap()), 138);
        }
        // A field counts 32 even when empty: the smallest list of one field is 32.
        let mut decoder = Decoder::default();
        decoder.set_max_list_size(31);
        assert!(decoder.decode(&hex("00 00 00")).is_err());
        decoder.set_max_list_size(32);
        assert_eq!(
            decoder.decode(&hex("00 00 00")).unwrap(),
            fields(&[("", "")])
        );
    }

    #[test]
    fn string_capacity_stays_within_the_limit() {
        // 1 000 Huffman-coded bytes of '0' (5 bits each) would decode to 1 600: the buffer is
        // sized for what the limit lets through, not for what the coding could hold.
        let value = vec![b'0'; 1600];
        let mut block = Vec::new();
        Encoder::indexing(0).string(&value, &mut block);
        assert_eq!(block.len(), 3 + 1000);
        let mut input = Input { bytes: &block };
        assert_eq!(input.string(100), Ok(None));
        let mut input = Input { bytes: &block };
        let out = input.string(1600).unwrap().unwrap();
        assert!(out == value && out.capacity() == 1600);
        let mut input = Input { bytes: &block };
        assert_eq!(input.string(1599), Ok(None));
    }

    #[test]
    fn integers_round_trip() {
        for prefix in 1..=7u8 {
            for value in [
                0,
                1,
                30,
                31,
                127,
                128,
                255,
                256,
                1337,
                65535,
                u32::MAX as usize,
            ] {
                let mut out = Vec::new();
                integer(value, prefix, 0, &mut out);
                let mut input = Input { bytes: &out };
                assert_eq!(input.integer(prefix).unwrap(), value, "{value} / {prefix}");
                assert!(input.bytes.is_empty());
            }
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        integer(1337, 5, 0, &mut out);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
    }
}
