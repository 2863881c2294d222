//! HTTP/2 frame layout (RFC 9113, 4.1) and the few constants the adapter needs.

pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const HEADER_LEN: usize = 9;
/// The smallest SETTINGS_MAX_FRAME_SIZE there can be, and its initial value.
pub const DEFAULT_MAX_FRAME_SIZE: usize = 16_384;
pub const MAX_MAX_FRAME_SIZE: usize = (1 << 24) - 1;

pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const SETTINGS: u8 = 0x4;
pub const PUSH_PROMISE: u8 = 0x5;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;

pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;
pub const PRIORITY: u8 = 0x20;

pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// Error codes (RFC 9113, 7).
pub const PROTOCOL_ERROR: u32 = 0x1;
pub const FRAME_SIZE_ERROR: u32 = 0x6;
pub const COMPRESSION_ERROR: u32 = 0x9;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: usize,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameHeader {
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Self {
        Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    /// The nine header bytes; `len` must be below 2^24.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let len = (self.len as u32).to_be_bytes();
        let stream = self.stream.to_be_bytes();
        [
            len[1], len[2], len[3], self.kind, self.flags, stream[0], stream[1], stream[2],
            stream[3],
        ]
    }
}

/// Appends a frame of `kind` with `payload` to `out`.
pub fn write(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let header = FrameHeader {
        len: payload.len(),
        kind,
        flags,
        stream,
    };
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
}

/// A GOAWAY frame (RFC 9113, 6.8) with `debug` as its debug data.
pub fn goaway(last_stream: u32, code: u32, debug: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        len: 8 + debug.len(),
        kind: GOAWAY,
        flags: 0,
        stream: 0,
    };
    let mut out = header.encode().to_vec();
    out.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(debug);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let header = FrameHeader {
            len: 0x01_02_03,
            kind: HEADERS,
            flags: END_HEADERS | END_STREAM,
            stream: 0x7fff_fffe,
        };
        assert_eq!(FrameHeader::parse(&header.encode()), header);
        // The reserved bit is ignored.
        let mut bytes = header.encode();
        bytes[5] |= 0x80;
        assert_eq!(FrameHeader::parse(&bytes), header);
    }
}
