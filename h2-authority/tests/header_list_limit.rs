//! The amplification attack of a header block of one-byte references, over a unix socket, with
//! the process's allocations counted. One test in this binary, so that nothing else allocates
//! meanwhile. Only what the crate had before the list limit is used, so that the test also
//! runs (and fails) against the crate without it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use h2_authority::AuthorityFix;
use h2_authority::frame::{self, FrameHeader};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const GOAWAY: u8 = 0x7;
const COMPRESSION_ERROR: u32 = 0x9;
const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;
/// What hyper's server advertises, as the registrar's does.
const LIST_LIMIT: u32 = 16 << 10;
/// The block the adapter buffers at most (`rewrite::MAX_HEADER_BLOCK`).
const MAX_BLOCK: usize = 1 << 20;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Past this the allocator fails (the process aborts) instead of the machine swapping.
const CAP: usize = 1 << 30;

struct Counting;

impl Counting {
    fn grow(size: usize) -> bool {
        let now = CURRENT.fetch_add(size, Ordering::SeqCst) + size;
        if now > CAP {
            CURRENT.fetch_sub(size, Ordering::SeqCst);
            return false;
        }
        PEAK.fetch_max(now, Ordering::SeqCst);
        true
    }
}

// SAFETY: every call goes to `System` with the caller's arguments; only counting is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller's contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Counted as a new block beside the old one, as a moving realloc holds both.
        if !Self::grow(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: as the caller's contract.
        let moved = unsafe { System.realloc(ptr, layout, new_size) };
        let freed = if moved.is_null() {
            new_size
        } else {
            layout.size()
        };
        CURRENT.fetch_sub(freed, Ordering::SeqCst);
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        len: payload.len(),
        kind,
        flags,
        stream,
    };
    [&header.encode()[..], payload].concat()
}

/// An HPACK integer with a 7-bit prefix (RFC 7541, 5.1).
fn integer(value: usize, out: &mut Vec<u8>) {
    if value < 0x7f {
        out.push(value as u8);
        return;
    }
    out.push(0x7f);
    let mut rest = value - 0x7f;
    while rest >= 0x80 {
        out.push(0x80 | (rest & 0x7f) as u8);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// The issue's block: a 4 000-byte literal added to the dynamic table (4 035 bytes as an entry),
/// then `refs` one-byte references to it (index 62), each a whole copy once decoded.
fn attack_block(refs: usize) -> Vec<u8> {
    let mut block = vec![0x40, 3];
    block.extend_from_slice(b"x-a");
    integer(4000, &mut block);
    block.extend(std::iter::repeat_n(b'a', 4000));
    block.extend(std::iter::repeat_n(0xbe, refs));
    block
}

/// The client's bytes: preface, SETTINGS, then `block` on stream 1 in 16 KiB frames.
fn client_bytes(block: &[u8]) -> Vec<u8> {
    let mut out = frame::PREFACE.to_vec();
    out.extend(frame_bytes(frame::SETTINGS, 0, 0, &[]));
    let mut pieces = block.chunks(frame::DEFAULT_MAX_FRAME_SIZE).peekable();
    let mut kind = frame::HEADERS;
    while let Some(piece) = pieces.next() {
        let flags = if pieces.peek().is_none() {
            frame::END_HEADERS | frame::END_STREAM
        } else {
            0
        };
        out.extend(frame_bytes(kind, flags, 1, piece));
        kind = frame::CONTINUATION;
    }
    out
}

struct Outcome {
    /// What the server read through the adapter, or how that failed.
    server: std::io::Result<Vec<u8>>,
    /// What the client read back.
    client: Vec<u8>,
    /// The most the process held at once beyond what it held before, in bytes.
    peak: usize,
}

/// Serves one connection through the adapter, the server having sent SETTINGS with the
/// header list limit first as hyper does, while the client sends `input`.
async fn exchange(input: Vec<u8>) -> Outcome {
    let (client, server) = UnixStream::pair().unwrap();
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let served = tokio::spawn(async move {
        let mut adapter = AuthorityFix::new(server);
        let mut settings = SETTINGS_MAX_HEADER_LIST_SIZE.to_be_bytes().to_vec();
        settings.extend(LIST_LIMIT.to_be_bytes());
        adapter
            .write_all(&frame_bytes(frame::SETTINGS, 0, 0, &settings))
            .await
            .unwrap();
        let mut read = Vec::new();
        adapter.read_to_end(&mut read).await.map(|_| read)
        // The adapter, and the socket, go here: the client sees the end.
    });
    let (mut from_server, mut to_server) = client.into_split();
    let sent = tokio::spawn(async move {
        // The server may stop reading and close before all of it is written.
        let _ = to_server.write_all(&input).await;
        let _ = to_server.shutdown().await;
    });
    let mut client = Vec::new();
    from_server.read_to_end(&mut client).await.unwrap();
    let server = served.await.unwrap();
    sent.await.unwrap();
    Outcome {
        server,
        client,
        peak: PEAK.load(Ordering::SeqCst) - base,
    }
}

fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    let mut out = Vec::new();
    while bytes.len() >= frame::HEADER_LEN {
        let header = FrameHeader::parse(bytes[..frame::HEADER_LEN].try_into().unwrap());
        let end = frame::HEADER_LEN + header.len;
        out.push((header, bytes[frame::HEADER_LEN..end].to_vec()));
        bytes = &bytes[end..];
    }
    assert!(bytes.is_empty());
    out
}

fn assert_refused(outcome: &Outcome, what: &str) {
    let err = outcome.server.as_ref().expect_err(what);
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{what}: {err}");
    // The client gets the server's SETTINGS, then a GOAWAY(COMPRESSION_ERROR) naming no stream.
    let frames = frames(&outcome.client);
    assert_eq!(frames.len(), 2, "{what}: {frames:?}");
    let (header, payload) = &frames[1];
    assert_eq!((header.kind, header.stream), (GOAWAY, 0), "{what}");
    assert_eq!(payload[..4], 0u32.to_be_bytes(), "{what}: last stream");
    assert_eq!(
        payload[4..8],
        COMPRESSION_ERROR.to_be_bytes(),
        "{what}: error code"
    );
}

#[tokio::test]
async fn references_to_a_large_entry_are_refused_in_bounded_memory() {
    // Within the limit: the literal and two references (3 × 4 035 bytes) reach the server.
    let outcome = exchange(client_bytes(&attack_block(2))).await;
    let forwarded = outcome.server.expect("a list within the limit is served");
    let headers = frames(&forwarded[frame::PREFACE.len()..]);
    assert_eq!(headers[1].0.kind, frame::HEADERS);
    // Each field a plain literal: representation, name length, name, value length, value.
    assert_eq!(headers[1].1.len(), 3 * (1 + 1 + 3 + 3 + 4000));

    // The peak allowed: the encoded block (a vector grown by doubling holds up to twice its
    // length, and the old buffer while it moves), and 1 MiB for everything else (a frame of
    // input, the decoded list of at most 16 KiB, the runtime's tasks).
    let bound = 2 * MAX_BLOCK + (1 << 20);

    // One frame: the literal (4 008 bytes) and 12 376 references, which would decode to 50 MB.
    let one_frame = attack_block(frame::DEFAULT_MAX_FRAME_SIZE - 4008);
    assert_eq!(one_frame.len(), frame::DEFAULT_MAX_FRAME_SIZE);
    let outcome = exchange(client_bytes(&one_frame)).await;
    eprintln!("one frame: peak {} bytes", outcome.peak);
    assert!(
        outcome.peak < bound,
        "one frame: {} bytes at the peak",
        outcome.peak
    );
    assert_refused(&outcome, "one frame");

    // The issue's: 960 000 references in CONTINUATION frames, within the 1 MiB block limit.
    let issue = attack_block(960_000);
    assert!(issue.len() < MAX_BLOCK);
    let outcome = exchange(client_bytes(&issue)).await;
    eprintln!("960 000 references: peak {} bytes", outcome.peak);
    assert!(
        outcome.peak < bound,
        "960 000 references: {} bytes at the peak",
        outcome.peak
    );
    assert_refused(&outcome, "960 000 references");
}
