//! The client-to-server direction as plain logic on buffers: bytes read from the client go into
//! `input`; `step` moves them to `output` (frame headers, re-encoded header blocks) or leaves
//! `forward` payload bytes to be handed on untouched.
//!
//! What one `step` can add to `output` is bounded: a frame header, or one re-encoded header
//! block of at most [`Rewriter::max_block_output`] bytes. `input` holds at most one frame, and a
//! header block being collected at most [`MAX_HEADER_BLOCK`] bytes.

use std::collections::VecDeque;

use bytes::{Buf, BytesMut};

use crate::frame::{self, FrameHeader};
use crate::hpack::{self, Decoder, Encoder, HpackError};

/// The largest header block (all its fragments) buffered before giving up on the connection;
/// far above what any gRPC peer sends (grpc-go's default header list limit is 16 KiB).
pub const MAX_HEADER_BLOCK: usize = 1 << 20;

/// What replaces an `:authority` that is not a URI authority.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// The client broke the protocol in a way that ends the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewriteError {
    #[error("HTTP/2 protocol error from the client: {0}")]
    Protocol(&'static str),
    #[error("frame of {len} bytes from the client above SETTINGS_MAX_FRAME_SIZE {max}")]
    FrameTooLarge { len: usize, max: usize },
    #[error("cannot decode a header block from the client: {0}")]
    Hpack(#[from] HpackError),
    #[error("header block from the client larger than {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge,
}

impl RewriteError {
    /// The HTTP/2 error code of this connection error (RFC 9113, 7).
    pub fn code(&self) -> u32 {
        match self {
            Self::Protocol(_) => frame::PROTOCOL_ERROR,
            Self::FrameTooLarge { .. } => frame::FRAME_SIZE_ERROR,
            // A block not decoded to its end leaves the dynamic table out of step (RFC 9113,
            // 4.3): one refused for its size is no different.
            Self::Hpack(_) | Self::BlockTooLarge => frame::COMPRESSION_ERROR,
        }
    }
}

/// Whether h2 takes `value` as an `:authority` (it parses it the same way).
pub fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Something was done; call again.
    Progress,
    /// At least this many bytes must be in `input` before anything more can be done.
    NeedMore(usize),
}

#[derive(Debug)]
enum State {
    /// This many bytes of the client preface have been seen.
    Preface(usize),
    Frames,
}

/// A header block being collected from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

#[derive(Debug)]
pub struct Rewriter {
    state: State,
    /// Read from the client, not yet looked at.
    pub input: BytesMut,
    /// Ready for the server, ahead of any `forward` bytes.
    pub output: BytesMut,
    /// Bytes after `output` that go to the server as they are: the rest of the current frame's
    /// payload, or everything (`usize::MAX`) when the client does not speak HTTP/2.
    pub forward: usize,
    block: Option<Block>,
    decoder: Decoder,
    encoder: Encoder,
    /// SETTINGS frames the server sent that the client has not acknowledged yet, in order.
    unacknowledged: VecDeque<Vec<(u16, u32)>>,
    /// The server's SETTINGS_MAX_FRAME_SIZE in force: what re-encoded frames must fit.
    max_frame_size: usize,
    /// The largest SETTINGS_MAX_FRAME_SIZE advertised: what the client may already be using.
    accepted_frame_size: usize,
    rewritten: u64,
    /// The highest stream whose header block went to the server: a GOAWAY's last stream.
    last_stream: u32,
    /// The decoded size of the last header block that went to the server.
    last_list_size: usize,
}

impl Default for Rewriter {
    fn default() -> Self {
        Self {
            state: State::Preface(0),
            input: BytesMut::new(),
            output: BytesMut::new(),
            forward: 0,
            block: None,
            decoder: Decoder::default(),
            encoder: Encoder::plain(),
            unacknowledged: VecDeque::new(),
            max_frame_size: frame::DEFAULT_MAX_FRAME_SIZE,
            accepted_frame_size: frame::DEFAULT_MAX_FRAME_SIZE,
            rewritten: 0,
            last_stream: 0,
            last_list_size: 0,
        }
    }
}

impl Rewriter {
    /// How many `:authority` values have been replaced.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Whether the client's bytes are passed on without looking at them.
    pub fn passing_through(&self) -> bool {
        self.forward == usize::MAX
    }

    /// The highest stream whose header block went to the server.
    pub fn last_stream(&self) -> u32 {
        self.last_stream
    }

    /// The decoded size (RFC 9113, 6.5.2) of the last header block that went to the server.
    pub fn last_list_size(&self) -> usize {
        self.last_list_size
    }

    /// The largest decoded header list accepted: the server's SETTINGS_MAX_HEADER_LIST_SIZE, or
    /// [`hpack::DEFAULT_MAX_LIST_SIZE`] before it advertises one.
    pub fn max_list_size(&self) -> usize {
        self.decoder.max_list_size()
    }

    /// The most one header block can add to `output`. Each field is re-encoded in at most its
    /// name, its value and 13 bytes (a byte of representation and name index, two lengths of
    /// at most 6 bytes; "localhost" for an `:authority` adds at most 9 more), which is within
    /// the 32 bytes a field counts for in the list size: so the block is at most the list
    /// limit, plus the priority fields and a frame header per frame.
    pub fn max_block_output(&self) -> usize {
        let block = self.max_list_size().saturating_add(5);
        let frames = block.div_ceil(self.max_frame_size).max(1);
        block.saturating_add(frames.saturating_mul(frame::HEADER_LEN))
    }

    /// The server sent a SETTINGS frame (not an acknowledgement) with these entries. The client
    /// may use larger values as soon as it reads them; smaller ones count once it acknowledges.
    /// SETTINGS_MAX_HEADER_LIST_SIZE counts at once either way: it is advisory, the server
    /// holds the client to it from then on (h2 does), and no shared state depends on it.
    pub fn settings_sent(&mut self, entries: Vec<(u16, u32)>) {
        for &(id, value) in &entries {
            let value = value as usize;
            match id {
                frame::SETTINGS_HEADER_TABLE_SIZE if value > self.decoder.limit() => {
                    self.decoder.set_limit(value);
                }
                frame::SETTINGS_MAX_FRAME_SIZE if value <= frame::MAX_MAX_FRAME_SIZE => {
                    self.accepted_frame_size = self.accepted_frame_size.max(value);
                }
                frame::SETTINGS_MAX_HEADER_LIST_SIZE => self.decoder.set_max_list_size(value),
                _ => {}
            }
        }
        self.unacknowledged.push_back(entries);
    }

    fn settings_acknowledged(&mut self) {
        let Some(entries) = self.unacknowledged.pop_front() else {
            return;
        };
        for (id, value) in entries {
            let value = value as usize;
            match id {
                frame::SETTINGS_HEADER_TABLE_SIZE => self.decoder.set_limit(value),
                frame::SETTINGS_MAX_FRAME_SIZE
                    if (frame::DEFAULT_MAX_FRAME_SIZE..=frame::MAX_MAX_FRAME_SIZE)
                        .contains(&value) =>
                {
                    self.max_frame_size = value;
                }
                _ => {}
            }
        }
    }

    /// Looks at what is in `input`, once.
    pub fn step(&mut self) -> Result<Step, RewriteError> {
        if self.forward > 0 {
            // The caller hands those bytes on first.
            return Ok(Step::Progress);
        }
        match self.state {
            State::Preface(seen) => {
                let n = self.input.len().min(frame::PREFACE.len() - seen);
                if n == 0 {
                    return Ok(Step::NeedMore(1));
                }
                if self.input[..n] != frame::PREFACE[seen..seen + n] {
                    // Not HTTP/2 with prior knowledge: the server will say so.
                    self.forward = usize::MAX;
                    return Ok(Step::Progress);
                }
                self.output.extend_from_slice(&self.input.split_to(n));
                self.state = if seen + n == frame::PREFACE.len() {
                    State::Frames
                } else {
                    State::Preface(seen + n)
                };
                Ok(Step::Progress)
            }
            State::Frames => self.frame(),
        }
    }

    fn frame(&mut self) -> Result<Step, RewriteError> {
        let Some(bytes) = self.input.first_chunk::<{ frame::HEADER_LEN }>() else {
            return Ok(Step::NeedMore(frame::HEADER_LEN));
        };
        let header = FrameHeader::parse(bytes);
        if let Some(block) = &self.block
            && (header.kind != frame::CONTINUATION || header.stream != block.stream)
        {
            return Err(RewriteError::Protocol(
                "a header block is interrupted by another frame",
            ));
        }
        match header.kind {
            frame::HEADERS | frame::CONTINUATION => {
                if header.len > self.accepted_frame_size {
                    return Err(RewriteError::FrameTooLarge {
                        len: header.len,
                        max: self.accepted_frame_size,
                    });
                }
                let total = frame::HEADER_LEN + header.len;
                if self.input.len() < total {
                    return Ok(Step::NeedMore(total));
                }
                let mut frame = self.input.split_to(total);
                frame.advance(frame::HEADER_LEN);
                self.header_frame(header, &frame)?;
            }
            frame::PUSH_PROMISE => {
                return Err(RewriteError::Protocol("PUSH_PROMISE from a client"));
            }
            kind => {
                if kind == frame::SETTINGS && header.flags & frame::ACK != 0 {
                    self.settings_acknowledged();
                }
                self.output
                    .extend_from_slice(&self.input.split_to(frame::HEADER_LEN));
                self.forward = header.len;
            }
        }
        Ok(Step::Progress)
    }

    fn header_frame(&mut self, header: FrameHeader, payload: &[u8]) -> Result<(), RewriteError> {
        let fragment = if header.kind == frame::HEADERS {
            if header.stream == 0 {
                return Err(RewriteError::Protocol("HEADERS on stream 0"));
            }
            let mut rest = payload;
            let mut padding = 0;
            if header.flags & frame::PADDED != 0 {
                let (&pad, after) = rest.split_first().ok_or(RewriteError::Protocol(
                    "PADDED HEADERS without a pad length",
                ))?;
                padding = usize::from(pad);
                rest = after;
            }
            let mut priority = None;
            if header.flags & frame::PRIORITY != 0 {
                let (fields, after) = rest
                    .split_first_chunk::<5>()
                    .ok_or(RewriteError::Protocol("HEADERS too short for its priority"))?;
                priority = Some(*fields);
                rest = after;
            }
            if padding > rest.len() {
                return Err(RewriteError::Protocol(
                    "HEADERS padding longer than the frame",
                ));
            }
            self.block = Some(Block {
                stream: header.stream,
                end_stream: header.flags & frame::END_STREAM != 0,
                priority,
                fragment: Vec::new(),
            });
            &rest[..rest.len() - padding]
        } else {
            payload
        };
        let Some(block) = self.block.as_mut() else {
            return Err(RewriteError::Protocol("CONTINUATION without HEADERS"));
        };
        if block.fragment.len() + fragment.len() > MAX_HEADER_BLOCK {
            return Err(RewriteError::BlockTooLarge);
        }
        block.fragment.extend_from_slice(fragment);
        if header.flags & frame::END_HEADERS != 0 {
            self.finish_block()?;
        }
        Ok(())
    }

    /// Decodes a complete block, fixes its `:authority` and writes it out again without the
    /// dynamic table, so that the server's table stays empty whatever the client's holds.
    fn finish_block(&mut self) -> Result<(), RewriteError> {
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        // The decoder holds the list to the limit before it copies anything past it.
        let mut headers = self.decoder.decode(&block.fragment)?;
        let list_size = hpack::list_size(&headers);
        for header in &mut headers {
            if header.name == b":authority" && !is_valid_authority(&header.value) {
                header.value = REPLACEMENT_AUTHORITY.to_vec();
                self.rewritten += 1;
            }
        }
        let mut encoded = Vec::with_capacity(list_size);
        self.encoder.encode(&headers, &mut encoded);
        debug_assert!(encoded.len() <= list_size, "see max_block_output");
        self.last_stream = self.last_stream.max(block.stream);
        self.last_list_size = list_size;

        let priority: &[u8] = match &block.priority {
            Some(fields) => fields,
            None => &[],
        };
        let first_len = encoded.len().min(self.max_frame_size - priority.len());
        let (first, rest) = encoded.split_at(first_len);
        let mut flags = 0;
        if block.end_stream {
            flags |= frame::END_STREAM;
        }
        if !priority.is_empty() {
            flags |= frame::PRIORITY;
        }
        let mut chunks = rest.chunks(self.max_frame_size).peekable();
        if chunks.peek().is_none() {
            flags |= frame::END_HEADERS;
        }
        self.emit(frame::HEADERS, flags, block.stream, &[priority, first]);
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() {
                frame::END_HEADERS
            } else {
                0
            };
            self.emit(frame::CONTINUATION, flags, block.stream, &[chunk]);
        }
        Ok(())
    }

    fn emit(&mut self, kind: u8, flags: u8, stream: u32, parts: &[&[u8]]) {
        let len = parts.iter().map(|p| p.len()).sum();
        let header = FrameHeader {
            len,
            kind,
            flags,
            stream,
        };
        self.output.extend_from_slice(&header.encode());
        for part in parts {
            self.output.extend_from_slice(part);
        }
    }
}

/// Follows the server-to-client bytes just far enough to collect its SETTINGS frames, without
/// buffering anything else.
#[derive(Debug, Default)]
pub struct SettingsWatch {
    header: [u8; frame::HEADER_LEN],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    remaining: usize,
    /// The entries of the SETTINGS frame being read, if the current frame is one.
    settings: Option<Vec<(u16, u32)>>,
    entry: [u8; 6],
    entry_len: usize,
    /// Whether a whole frame header has been seen: the server's preface is done.
    started: bool,
}

impl SettingsWatch {
    /// Whether the server has sent its first frame header and is not inside a frame: a frame
    /// of ours can go to the client now without corrupting the server's.
    pub fn between_frames(&self) -> bool {
        self.started && self.header_len == 0 && self.remaining == 0
    }

    /// Looks at bytes the server wrote; `sent` gets the entries of each complete SETTINGS frame.
    pub fn feed(&mut self, mut bytes: &[u8], mut sent: impl FnMut(Vec<(u16, u32)>)) {
        while !bytes.is_empty() {
            if self.remaining == 0 {
                let n = bytes.len().min(frame::HEADER_LEN - self.header_len);
                self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
                self.header_len += n;
                bytes = &bytes[n..];
                if self.header_len < frame::HEADER_LEN {
                    return;
                }
                self.header_len = 0;
                self.started = true;
                let header = FrameHeader::parse(&self.header);
                self.remaining = header.len;
                self.entry_len = 0;
                self.settings = (header.kind == frame::SETTINGS && header.flags & frame::ACK == 0)
                    .then(Vec::new);
                if self.remaining == 0
                    && let Some(entries) = self.settings.take()
                {
                    sent(entries);
                }
                continue;
            }
            let n = bytes.len().min(self.remaining);
            if let Some(entries) = &mut self.settings {
                for &byte in &bytes[..n] {
                    self.entry[self.entry_len] = byte;
                    self.entry_len += 1;
                    if self.entry_len == self.entry.len() {
                        self.entry_len = 0;
                        let [a, b, c, d, e, f] = self.entry;
                        entries
                            .push((u16::from_be_bytes([a, b]), u32::from_be_bytes([c, d, e, f])));
                    }
                }
            }
            bytes = &bytes[n..];
            self.remaining -= n;
            if self.remaining == 0
                && let Some(entries) = self.settings.take()
            {
                sent(entries);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hpack::Header;

    fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let header = FrameHeader {
            len: payload.len(),
            kind,
            flags,
            stream,
        };
        [&header.encode()[..], payload].concat()
    }

    /// Runs `input` through, handing forwarded bytes on as the adapter does; the output, or the
    /// error with how much output came before it.
    fn drive(rewriter: &mut Rewriter, input: &[u8]) -> (Vec<u8>, Option<RewriteError>) {
        rewriter.input.extend_from_slice(input);
        let mut out = Vec::new();
        loop {
            out.extend_from_slice(&rewriter.output.split());
            if rewriter.forward > 0 {
                let n = rewriter.forward.min(rewriter.input.len());
                if n == 0 {
                    return (out, None);
                }
                out.extend_from_slice(&rewriter.input.split_to(n));
                rewriter.forward -= n;
                continue;
            }
            match rewriter.step() {
                Ok(Step::Progress) => {}
                Ok(Step::NeedMore(_)) => return (out, None),
                Err(err) => return (out, Some(err)),
            }
        }
    }

    /// A 4 000-byte value added to the table, then `refs` one-byte references to it.
    fn amplifying_block(refs: usize) -> Vec<u8> {
        let mut block = Vec::new();
        Encoder::indexing(4096).encode(&[Header::new("x-a", "a".repeat(4000))], &mut block);
        block.extend(std::iter::repeat_n(0xbe, refs));
        block
    }

    #[test]
    fn the_list_limit_follows_the_server_settings_at_once() {
        let mut rewriter = Rewriter::default();
        assert_eq!(rewriter.max_list_size(), hpack::DEFAULT_MAX_LIST_SIZE);
        rewriter.settings_sent(vec![(frame::SETTINGS_MAX_HEADER_LIST_SIZE, 1000)]);
        assert_eq!(rewriter.max_list_size(), 1000);
        rewriter.settings_sent(vec![(frame::SETTINGS_MAX_HEADER_LIST_SIZE, 1 << 20)]);
        assert_eq!(rewriter.max_list_size(), 1 << 20);
    }

    #[test]
    fn an_amplifying_block_is_a_compression_error_before_any_of_it_is_copied() {
        let block = amplifying_block(frame::DEFAULT_MAX_FRAME_SIZE - 4010);
        let mut input = frame::PREFACE.to_vec();
        input.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &block));
        for limit in [None, Some(4035 * 3), Some(100_000)] {
            let mut rewriter = Rewriter::default();
            if let Some(limit) = limit {
                rewriter.settings_sent(vec![(frame::SETTINGS_MAX_HEADER_LIST_SIZE, limit)]);
            }
            let (out, err) = drive(&mut rewriter, &input);
            let limit = limit.map_or(hpack::DEFAULT_MAX_LIST_SIZE, |l| l as usize);
            let err = err.expect("an error");
            assert_eq!(
                err,
                RewriteError::Hpack(HpackError::HeaderListTooLarge { limit })
            );
            assert_eq!(err.code(), frame::COMPRESSION_ERROR);
            // Nothing of the block reached the server.
            assert_eq!(out, frame::PREFACE);
            assert_eq!(rewriter.last_stream(), 0);
        }
    }

    #[test]
    fn re_encoded_blocks_stay_within_max_block_output() {
        // Fields whose re-encoding grows the most against what they count for: empty
        // `:authority` (one byte in, replaced by "localhost"), and literal names whose lengths
        // take several bytes.
        let mut block = vec![0x81; 200];
        let long_name = "n".repeat(20_000);
        Encoder::plain().encode(&[Header::new(long_name.as_str(), "")], &mut block);
        let list = 200 * (10 + 32) + 20_000 + 32;
        let mut input = frame::PREFACE.to_vec();
        let mut fragments = block.chunks(10_000).peekable();
        let mut kind = frame::HEADERS;
        while let Some(fragment) = fragments.next() {
            let flags = if fragments.peek().is_none() {
                frame::END_HEADERS | frame::END_STREAM
            } else {
                0
            };
            input.extend(frame_bytes(kind, flags, 3, fragment));
            kind = frame::CONTINUATION;
        }
        for (limit, fits) in [(list - 1, false), (list, true), (1 << 20, true)] {
            let mut rewriter = Rewriter::default();
            rewriter.settings_sent(vec![(frame::SETTINGS_MAX_HEADER_LIST_SIZE, limit as u32)]);
            let (out, err) = drive(&mut rewriter, &input);
            assert_eq!(err.is_none(), fits, "{limit}");
            if !fits {
                continue;
            }
            assert_eq!(rewriter.rewritten(), 200);
            assert_eq!(rewriter.last_list_size(), list);
            assert_eq!(rewriter.last_stream(), 3);
            let written = out.len() - frame::PREFACE.len();
            assert!(
                written <= rewriter.max_block_output(),
                "{written} for {limit}"
            );
            if limit == list {
                // Two frames of at most 16 KiB.
                assert_eq!(rewriter.max_block_output(), list + 5 + 2 * 9);
            }
        }
    }
}
