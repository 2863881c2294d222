//! The client-to-server direction as plain logic on buffers: bytes read from the client go into
//! `input`; `step` moves them to `output` (frame headers, re-encoded header blocks) or leaves
//! `forward` payload bytes to be handed on untouched.

use std::collections::VecDeque;

use bytes::{Buf, BytesMut};

use crate::frame::{self, FrameHeader};
use crate::hpack::{Decoder, Encoder, HpackError};

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
    #[error("cannot decode a header block from the client: {0}")]
    Hpack(#[from] HpackError),
    #[error("header block from the client larger than {MAX_HEADER_BLOCK} bytes")]
    BlockTooLarge,
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

    /// The server sent a SETTINGS frame (not an acknowledgement) with these entries. The client
    /// may use larger values as soon as it reads them; smaller ones count once it acknowledges.
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
                    return Err(RewriteError::Protocol(
                        "frame larger than SETTINGS_MAX_FRAME_SIZE",
                    ));
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
        let mut headers = self.decoder.decode(&block.fragment)?;
        for header in &mut headers {
            if header.name == b":authority" && !is_valid_authority(&header.value) {
                header.value = REPLACEMENT_AUTHORITY.to_vec();
                self.rewritten += 1;
            }
        }
        let mut encoded = Vec::with_capacity(block.fragment.len() * 2);
        self.encoder.encode(&headers, &mut encoded);

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
}

impl SettingsWatch {
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
