//! The client-to-server path of `h2_authority` (`rewrite::Rewriter`): client bytes are read,
//! header blocks decoded and re-encoded with literals, everything else handed on; driven as
//! `AuthorityFix` drives it, without sockets.
//!
//! The input builds a connection: the server's first SETTINGS, then client bytes (the preface or
//! not; header blocks of chosen HPACK representations framed in HEADERS, CONTINUATION, padding
//! and priority; blocks from an indexing encoder as grpc-go sends; any frame; raw bytes) read in
//! chunks of chosen sizes, with the server's later SETTINGS in between.
//!
//! Properties:
//! - nothing panics (nor a debug assertion: the re-encoded block is at most its list size);
//! - the list limit in force is the last SETTINGS_MAX_HEADER_LIST_SIZE the server sent, at
//!   once, or 16 KiB before any;
//! - one step adds at most `block_bound(limit)` bytes of output (see there; or a piece of the
//!   preface), so that the bytes the server reads are at most `K × the client's bytes` (see
//!   `K`);
//! - a second rewriter with a 1 MiB list limit, fed the same, agrees on every byte and every
//!   outcome until the first fails; when the first fails with `HeaderListTooLarge`, its limit is
//!   the one in force, its code COMPRESSION_ERROR, and the second either decoded the block to a
//!   list above that limit or failed inside the block too (decoding stopped earlier in the
//!   first); any other failure is the second's too; each block handed on has a list within the
//!   limit.
#![no_main]

use arbitrary::Arbitrary;
use h2_authority::frame;
use h2_authority::hpack::{self, Encoder, Header, HpackError};
use h2_authority::rewrite::{RewriteError, Rewriter, Step};
use libfuzzer_sys::fuzz_target;

/// The list limits the server may advertise. The largest bounds `K`; the others make the limit
/// bite with small inputs, and 32, 42 and 43 are the sizes of one empty literal, of `:authority`
/// or `:method: GET` from the static table, and of `:method: POST`: lists exactly at the limit.
const LIMITS: [u32; 9] = [0, 32, 42, 43, 64, 1000, 4096, 16 << 10, 64 << 10];
const MAX_LIMIT: usize = 64 << 10;
const _: () = assert!(LIMITS[LIMITS.len() - 1] as usize == MAX_LIMIT);
/// The second rewriter's limit: above every one of `LIMITS`, and what it may cost per block.
const ORACLE_LIMIT: u32 = 1 << 20;
/// Values built by repetition stay below this: they make table entries cheaply from small
/// inputs, which is what amplification needs, without making the second rewriter slow.
const MAX_REPEAT: usize = 8 << 10;

/// The most one re-encoded block can take, for a list limit `limit`: the block is at most the
/// list size (each field re-encoded in its name, value and at most 13 bytes, within the 32 it
/// counts for; "localhost" for a replaced `:authority` adds 9 at most), plus the 5 priority
/// bytes, in frames of at least 16 KiB, each with a 9-byte header.
const fn block_bound(limit: usize) -> usize {
    let payload = limit + 5;
    let frames = if payload.div_ceil(frame::DEFAULT_MAX_FRAME_SIZE) > 1 {
        payload.div_ceil(frame::DEFAULT_MAX_FRAME_SIZE)
    } else {
        1
    };
    payload + frames * frame::HEADER_LEN
}

/// Output per input byte. Every output byte is a client byte handed on (each at most once) or
/// part of a re-encoded block; each block consumed at least its HEADERS frame's 9-byte header,
/// which is not handed on. So out ≤ (in − 9·blocks) + blocks·B ≤ in·B/9 for B = the largest
/// `block_bound`, blocks being at most in/9: K = 65 586 / 9, rounded up, and no constant term.
/// (The per-block cap is what makes it linear: before it, one 16 KiB frame of one-byte
/// references to a 4 KiB entry gave 50 MB.)
const K: usize = block_bound(MAX_LIMIT).div_ceil(frame::HEADER_LEN);

#[derive(Arbitrary, Debug)]
struct Connection {
    /// The server's first SETTINGS, which h2 writes before it reads anything.
    server: Vec<Setting>,
    /// Whether the client starts with the preface (otherwise its bytes pass through).
    preface: bool,
    ops: Vec<Op>,
    /// Read sizes, taken in turn.
    reads: Vec<u16>,
}

#[derive(Arbitrary, Debug)]
enum Setting {
    HeaderTableSize(u16),
    MaxFrameSize(u32),
    MaxHeaderListSize(u8),
    Other(u16, u32),
}

#[derive(Arbitrary, Debug)]
enum Op {
    /// A header block of these representations.
    Block(Block, Vec<Field>),
    /// A header block as an indexing encoder with a 4 KiB table writes it (grpc-go does).
    Indexed(Block, Vec<(Text, Text)>),
    /// A header block of any bytes.
    RawBlock(Block, Vec<u8>),
    Frame {
        kind: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
    },
    SettingsAck,
    Raw(Vec<u8>),
    /// The server sends SETTINGS.
    ServerSettings(Vec<Setting>),
}

/// How a block is framed.
#[derive(Arbitrary, Debug)]
struct Block {
    stream: u8,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    padding: Option<u8>,
    /// Fragment sizes, taken in turn (the last one repeats).
    fragments: Vec<u16>,
    /// Leave END_HEADERS off the last frame.
    unfinished: bool,
}

#[derive(Arbitrary, Debug)]
enum Field {
    Indexed(u8),
    Literal(Indexing, Name, Text),
    /// A literal with incremental indexing, Huffman-coded where that is shorter.
    Huffman(Text, Text),
    SizeUpdate(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Indexing {
    Incremental,
    Without,
    Never,
}

#[derive(Arbitrary, Debug)]
enum Name {
    Index(u8),
    Literal(Text),
}

#[derive(Arbitrary, Debug)]
enum Text {
    Bytes(Vec<u8>),
    Repeat(u8, u16),
    Authority(AuthorityKind),
}

#[derive(Arbitrary, Debug)]
enum AuthorityKind {
    Path,
    Empty,
    Host,
}

impl Text {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Text::Bytes(bytes) => bytes.clone(),
            Text::Repeat(byte, len) => vec![*byte; usize::from(*len) % (MAX_REPEAT + 1)],
            Text::Authority(AuthorityKind::Path) => b"/var/lib/kubelet/plugins/x/csi.sock".to_vec(),
            Text::Authority(AuthorityKind::Empty) => Vec::new(),
            Text::Authority(AuthorityKind::Host) => b"localhost:443".to_vec(),
        }
    }
}

fn string(text: &[u8], out: &mut Vec<u8>) {
    hpack::integer(text.len(), 7, 0, out);
    out.extend_from_slice(text);
}

fn encode_fields(fields: &[Field]) -> Vec<u8> {
    let mut out = Vec::new();
    for field in fields {
        match field {
            Field::Indexed(index) => hpack::integer(usize::from(*index), 7, 0x80, &mut out),
            Field::Literal(indexing, name, value) => {
                let (prefix, pattern) = match indexing {
                    Indexing::Incremental => (6, 0x40),
                    Indexing::Without => (4, 0x00),
                    Indexing::Never => (4, 0x10),
                };
                match name {
                    Name::Index(index) => {
                        hpack::integer(usize::from(*index), prefix, pattern, &mut out)
                    }
                    Name::Literal(name) => {
                        hpack::integer(0, prefix, pattern, &mut out);
                        string(&name.bytes(), &mut out);
                    }
                }
                string(&value.bytes(), &mut out);
            }
            Field::Huffman(name, value) => {
                // A table of 0 in the encoder: the representation still asks the decoder to
                // index, and nothing here refers to the encoder's table.
                Encoder::indexing(0).encode(&[Header::new(name.bytes(), value.bytes())], &mut out);
            }
            Field::SizeUpdate(size) => hpack::integer(usize::from(*size), 5, 0x20, &mut out),
        }
    }
    out
}

fn frame_block(block: &Block, fragment: &[u8], out: &mut Vec<u8>) {
    let stream = 2 * u32::from(block.stream) + 1;
    let mut sizes = block
        .fragments
        .iter()
        .map(|&size| usize::from(size) % 16_000 + 1)
        .chain(std::iter::repeat(
            block
                .fragments
                .last()
                .map_or(16_000, |&size| usize::from(size) % 16_000 + 1),
        ));
    let mut rest = fragment;
    let mut first = true;
    loop {
        let size = sizes.next().unwrap_or(16_000).min(rest.len());
        let (piece, after) = rest.split_at(size);
        rest = after;
        let mut flags = 0;
        if rest.is_empty() && !block.unfinished {
            flags |= frame::END_HEADERS;
        }
        if first {
            let mut payload = Vec::new();
            if let Some(pad) = block.padding {
                flags |= frame::PADDED;
                payload.push(pad);
            }
            if let Some(priority) = block.priority {
                flags |= frame::PRIORITY;
                payload.extend_from_slice(&priority);
            }
            if block.end_stream {
                flags |= frame::END_STREAM;
            }
            payload.extend_from_slice(piece);
            payload.extend(std::iter::repeat_n(
                0,
                usize::from(block.padding.unwrap_or(0)),
            ));
            frame::write(out, frame::HEADERS, flags, stream, &payload);
            first = false;
        } else {
            frame::write(out, frame::CONTINUATION, flags, stream, piece);
        }
        if rest.is_empty() {
            return;
        }
    }
}

/// The entries the server sends, and those the second rewriter is told instead: the same but
/// for the list limit, so that both follow the same SETTINGS and acknowledgements.
fn settings(settings: &[Setting]) -> (Vec<(u16, u32)>, Vec<(u16, u32)>, Option<usize>) {
    let mut entries = Vec::new();
    let mut limit = None;
    for setting in settings {
        entries.push(match *setting {
            Setting::HeaderTableSize(size) => (frame::SETTINGS_HEADER_TABLE_SIZE, u32::from(size)),
            Setting::MaxFrameSize(size) => (frame::SETTINGS_MAX_FRAME_SIZE, size),
            Setting::MaxHeaderListSize(choice) => {
                let value = LIMITS[usize::from(choice) % LIMITS.len()];
                limit = Some(value as usize);
                (frame::SETTINGS_MAX_HEADER_LIST_SIZE, value)
            }
            // Another limit would not be one of `LIMITS`.
            Setting::Other(id, _) if id == frame::SETTINGS_MAX_HEADER_LIST_SIZE => continue,
            Setting::Other(id, value) => (id, value),
        });
    }
    let mut oracle: Vec<_> = entries
        .iter()
        .filter(|(id, _)| *id != frame::SETTINGS_MAX_HEADER_LIST_SIZE)
        .copied()
        .collect();
    oracle.push((frame::SETTINGS_MAX_HEADER_LIST_SIZE, ORACLE_LIMIT));
    (entries, oracle, limit)
}

enum Event {
    Client(Vec<u8>),
    Server(Vec<Setting>),
}

/// One unit of what `AuthorityFix::poll_read` does.
enum Unit {
    /// These bytes went to the server.
    Moved(Vec<u8>),
    /// A step that left this much output.
    Stepped(usize),
    Idle,
    Failed(RewriteError),
}

fn unit(rw: &mut Rewriter) -> Unit {
    if !rw.output.is_empty() {
        return Unit::Moved(rw.output.split().to_vec());
    }
    if rw.forward > 0 {
        let n = rw.forward.min(rw.input.len());
        if n == 0 {
            return Unit::Idle;
        }
        if rw.forward != usize::MAX {
            rw.forward -= n;
        }
        return Unit::Moved(rw.input.split_to(n).to_vec());
    }
    match rw.step() {
        Ok(Step::Progress) => Unit::Stepped(rw.output.len()),
        Ok(Step::NeedMore(_)) => Unit::Idle,
        Err(err) => Unit::Failed(err),
    }
}

struct Run {
    main: Rewriter,
    oracle: Rewriter,
    /// The list limit the server asked for last.
    limit: usize,
    read: usize,
    written: usize,
}

impl Run {
    /// Runs both rewriters until they need more input; false once the connection failed.
    fn pump(&mut self) -> bool {
        loop {
            assert_eq!(self.main.max_list_size(), self.limit);
            assert!(self.main.max_block_output() <= block_bound(self.limit));
            let (a, b) = (unit(&mut self.main), unit(&mut self.oracle));
            match (a, b) {
                (Unit::Moved(a), Unit::Moved(b)) => {
                    assert_eq!(a, b);
                    self.written += a.len();
                }
                (Unit::Stepped(a), Unit::Stepped(b)) => {
                    // A step writes a piece of the preface, a frame header, or a block.
                    let most = block_bound(self.limit).max(frame::PREFACE.len());
                    assert!(a <= most, "{a} bytes in one step, limit {}", self.limit);
                    // A block starts with HEADERS, which nothing else writes (nor is any byte
                    // of the preface HEADERS' type).
                    if self.main.output.get(3) == Some(&frame::HEADERS) {
                        assert!(self.main.last_list_size() <= self.limit);
                    }
                    assert_eq!(self.main.last_list_size(), self.oracle.last_list_size());
                    assert_eq!(a, b);
                }
                (Unit::Idle, Unit::Idle) => return true,
                (Unit::Failed(err), other) => {
                    self.failed(err, other);
                    return false;
                }
                (a, b) => panic!("the rewriters part: {} / {}", name(&a), name(&b)),
            }
        }
    }

    fn failed(&mut self, err: RewriteError, oracle: Unit) {
        match &err {
            RewriteError::Hpack(HpackError::HeaderListTooLarge { limit }) => {
                assert_eq!(*limit, self.limit);
                assert_eq!(err.code(), frame::COMPRESSION_ERROR);
                match oracle {
                    Unit::Stepped(_) => assert!(
                        self.oracle.last_list_size() > self.limit,
                        "refused a list of {} bytes, within {}",
                        self.oracle.last_list_size(),
                        self.limit
                    ),
                    Unit::Failed(RewriteError::Hpack(_)) => {}
                    other => panic!("the second rewriter: {}", name(&other)),
                }
            }
            _ => match oracle {
                Unit::Failed(other) => assert_eq!(err, other),
                other => panic!("{err} for one rewriter only, {}", name(&other)),
            },
        }
    }
}

fn name(unit: &Unit) -> String {
    match unit {
        Unit::Moved(bytes) => format!("moved {}", bytes.len()),
        Unit::Stepped(n) => format!("stepped to {n}"),
        Unit::Idle => "idle".into(),
        Unit::Failed(err) => format!("failed: {err}"),
    }
}

fuzz_target!(|connection: Connection| {
    let mut events = Vec::new();
    let mut client = Vec::new();
    if connection.preface {
        client.extend_from_slice(frame::PREFACE);
    }
    let mut encoder = Encoder::indexing(hpack::DEFAULT_TABLE_SIZE);
    for op in connection.ops {
        match op {
            Op::Block(block, fields) => frame_block(&block, &encode_fields(&fields), &mut client),
            Op::Indexed(block, fields) => {
                let headers: Vec<Header> = fields
                    .iter()
                    .map(|(name, value)| Header::new(name.bytes(), value.bytes()))
                    .collect();
                let mut bytes = Vec::new();
                encoder.encode(&headers, &mut bytes);
                frame_block(&block, &bytes, &mut client);
            }
            Op::RawBlock(block, bytes) => frame_block(&block, &bytes, &mut client),
            Op::Frame {
                kind,
                flags,
                stream,
                payload,
            } => frame::write(&mut client, kind, flags, stream, &payload),
            Op::SettingsAck => frame::write(&mut client, frame::SETTINGS, frame::ACK, 0, &[]),
            Op::Raw(bytes) => client.extend_from_slice(&bytes),
            Op::ServerSettings(settings) => {
                events.push(Event::Client(std::mem::take(&mut client)));
                events.push(Event::Server(settings));
            }
        }
    }
    events.push(Event::Client(client));

    let mut run = Run {
        main: Rewriter::default(),
        oracle: Rewriter::default(),
        limit: hpack::DEFAULT_MAX_LIST_SIZE,
        read: 0,
        written: 0,
    };
    let (entries, oracle, limit) = settings(&connection.server);
    run.main.settings_sent(entries);
    run.oracle.settings_sent(oracle);
    run.limit = limit.unwrap_or(run.limit);

    let mut reads = connection
        .reads
        .iter()
        .map(|&n| usize::from(n).max(1))
        .cycle();
    let mut alive = true;
    'events: for event in events {
        match event {
            Event::Client(bytes) => {
                let mut rest = &bytes[..];
                while !rest.is_empty() {
                    let n = reads.next().unwrap_or(rest.len()).min(rest.len());
                    run.main.input.extend_from_slice(&rest[..n]);
                    run.oracle.input.extend_from_slice(&rest[..n]);
                    run.read += n;
                    rest = &rest[n..];
                    if !run.pump() {
                        alive = false;
                        break 'events;
                    }
                }
            }
            Event::Server(settings_sent) => {
                let (entries, oracle, limit) = settings(&settings_sent);
                run.main.settings_sent(entries);
                run.oracle.settings_sent(oracle);
                run.limit = limit.unwrap_or(run.limit);
            }
        }
    }
    if alive {
        // The client hangs up: what is left goes on as it is.
        run.main.forward = usize::MAX;
        run.oracle.forward = usize::MAX;
        run.pump();
    }
    assert!(
        run.written <= K * run.read,
        "{} bytes out for {} in",
        run.written,
        run.read
    );
});
