//! The adapter on in-memory connections that deliver the client's bytes a few at a time.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use h2_authority::AuthorityFix;
use h2_authority::frame::{self, FrameHeader};
use h2_authority::hpack::{Decoder, Encoder, Header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The client's bytes, at most `chunk` per read and every other read not ready yet; what the
/// server writes is kept.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    chunk: usize,
    stall: bool,
    written: Vec<u8>,
}

impl Trickle {
    fn new(data: Vec<u8>, chunk: usize) -> Self {
        Self {
            data,
            at: 0,
            chunk,
            stall: false,
            written: Vec::new(),
        }
    }
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stall = !self.stall;
        if self.stall {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let n = self
            .chunk
            .min(buf.remaining())
            .min(self.data.len() - self.at);
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // One byte at a time, so that the SETTINGS watch sees every split.
        self.written.push(buf[0]);
        Poll::Ready(Ok(1))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn frame_bytes(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = FrameHeader {
        len: payload.len(),
        kind,
        flags,
        stream,
    }
    .encode()
    .to_vec();
    out.extend_from_slice(payload);
    out
}

fn settings(entries: &[(u16, u32)]) -> Vec<u8> {
    let payload: Vec<u8> = entries
        .iter()
        .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
        .collect();
    frame_bytes(frame::SETTINGS, 0, 0, &payload)
}

fn settings_ack() -> Vec<u8> {
    frame_bytes(frame::SETTINGS, frame::ACK, 0, &[])
}

/// The start of every connection: preface, SETTINGS, WINDOW_UPDATE, as grpc-go sends them.
fn client_start() -> Vec<u8> {
    let mut out = frame::PREFACE.to_vec();
    out.extend(settings(&[(0x2, 0)]));
    out.extend(frame_bytes(0x8, 0, 0, &0x3fff_0000u32.to_be_bytes()));
    out
}

fn grpc_request(path: &str, authority: &str) -> Vec<Header> {
    vec![
        Header::new(":method", "POST"),
        Header::new(":scheme", "http"),
        Header::new(":path", path),
        Header::new(":authority", authority),
        Header::new("content-type", "application/grpc"),
        Header::new("user-agent", "grpc-go/1.72.0"),
        Header::new("te", "trailers"),
    ]
}

const SOCKET: &str = "/var/lib/kubelet/plugins_registry/hostpath.csi.k8s.io-reg.sock";

fn with_authority(mut headers: Vec<Header>, authority: &str) -> Vec<Header> {
    for header in &mut headers {
        if header.name == b":authority" {
            header.value = authority.into();
        }
    }
    headers
}

/// Runs the adapter over `input` read `chunk` bytes at a time, with `server` written to it first.
async fn run(input: Vec<u8>, chunk: usize, server: &[u8]) -> io::Result<Vec<u8>> {
    let mut adapter = AuthorityFix::new(Trickle::new(input, chunk));
    adapter.write_all(server).await?;
    let mut out = Vec::new();
    adapter.read_to_end(&mut out).await?;
    assert_eq!(adapter.get_ref().written, server);
    Ok(out)
}

/// Runs the adapter over `input` that must fail: the error, and what the client got after
/// `server`'s bytes.
async fn run_failing(input: Vec<u8>, chunk: usize, server: &[u8]) -> (io::Error, Vec<u8>) {
    let mut adapter = AuthorityFix::new(Trickle::new(input, chunk));
    adapter.write_all(server).await.unwrap();
    let err = adapter.read_to_end(&mut Vec::new()).await.unwrap_err();
    // Every read after that fails alike.
    let again = adapter.read(&mut [0; 16]).await.unwrap_err();
    assert_eq!(again.to_string(), err.to_string());
    let written = &adapter.get_ref().written;
    assert_eq!(written[..server.len()], *server);
    (err, written[server.len()..].to_vec())
}

/// The code of the GOAWAY that is all of `bytes`, and its last stream.
fn goaway(bytes: &[u8]) -> (u32, u32) {
    let header = FrameHeader::parse(bytes[..9].try_into().unwrap());
    assert_eq!((header.kind, header.stream), (frame::GOAWAY, 0));
    assert_eq!(header.len, bytes.len() - 9);
    let field = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    (field(13), field(9))
}

/// The frames after the preface.
fn frames(mut bytes: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    assert_eq!(&bytes[..24], frame::PREFACE);
    bytes = &bytes[24..];
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = FrameHeader::parse(bytes[..9].try_into().unwrap());
        out.push((header, bytes[9..9 + header.len].to_vec()));
        bytes = &bytes[9 + header.len..];
    }
    out
}

/// The header blocks the server sees, decoded as h2 would, with their stream and END_STREAM.
fn server_view(frames: &[(FrameHeader, Vec<u8>)]) -> Vec<(u32, bool, Vec<Header>)> {
    let mut decoder = Decoder::default();
    decoder.set_max_list_size(usize::MAX);
    let mut blocks = Vec::new();
    let mut open: Option<(u32, bool, Vec<u8>)> = None;
    for (header, payload) in frames {
        match header.kind {
            frame::HEADERS => {
                assert!(open.is_none());
                let skip = if header.flags & frame::PRIORITY != 0 {
                    5
                } else {
                    0
                };
                assert_eq!(header.flags & frame::PADDED, 0);
                open = Some((
                    header.stream,
                    header.flags & frame::END_STREAM != 0,
                    payload[skip..].to_vec(),
                ));
            }
            frame::CONTINUATION => open.as_mut().unwrap().2.extend_from_slice(payload),
            _ => {
                assert!(open.is_none(), "a frame inside a header block");
                continue;
            }
        }
        assert!(header.len <= frame::DEFAULT_MAX_FRAME_SIZE);
        if header.flags & frame::END_HEADERS != 0 {
            let (stream, end, block) = open.take().unwrap();
            blocks.push((stream, end, decoder.decode(&block).unwrap()));
            // The server's table is never used.
            assert_eq!(decoder.table_size(), 0);
        }
    }
    assert!(open.is_none());
    blocks
}

fn encode(encoder: &mut Encoder, headers: &[Header]) -> Vec<u8> {
    let mut out = Vec::new();
    encoder.encode(headers, &mut out);
    out
}

#[tokio::test]
async fn path_authority_is_rewritten_and_the_rest_passes_through() {
    let mut encoder = Encoder::indexing(4096);
    let mut input = client_start();
    let start_len = input.len();
    let request = grpc_request("/pluginregistration.Registration/GetInfo", SOCKET);
    input.extend(frame_bytes(
        frame::HEADERS,
        frame::END_HEADERS,
        1,
        &encode(&mut encoder, &request),
    ));
    let message = [0u8, 0, 0, 0, 0];
    input.extend(frame_bytes(frame::DATA, frame::END_STREAM, 1, &message));
    input.extend(frame_bytes(0x6, 0, 0, b"pingpong"));

    for chunk in [1, 2, 7, 4096] {
        let out = run(input.clone(), chunk, &[]).await.unwrap();
        assert_eq!(out[..start_len], input[..start_len], "preface and settings");
        let frames = frames(&out);
        let blocks = server_view(&frames);
        assert_eq!(
            blocks,
            vec![(1, false, with_authority(request.clone(), "localhost"))]
        );
        let data = &frames[frames.len() - 2];
        assert_eq!(data.0.kind, frame::DATA);
        assert_eq!(data.0.flags, frame::END_STREAM);
        assert_eq!(data.1, message);
        assert_eq!(frames.last().unwrap().1, b"pingpong");
    }
}

#[tokio::test]
async fn indexed_fields_across_requests_and_trailers() {
    let mut encoder = Encoder::indexing(4096);
    let mut input = client_start();
    let mut expected = Vec::new();
    for (i, path) in [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/pluginregistration.Registration/GetInfo",
    ]
    .into_iter()
    .enumerate()
    {
        let stream = 1 + 2 * i as u32;
        let request = grpc_request(path, SOCKET);
        let block = encode(&mut encoder, &request);
        if i == 2 {
            // Everything comes from the dynamic table by now: one byte a field.
            assert_eq!(block.len(), request.len());
        }
        input.extend(frame_bytes(
            frame::HEADERS,
            frame::END_HEADERS,
            stream,
            &block,
        ));
        input.extend(frame_bytes(frame::DATA, 0, stream, b"\0\0\0\0\0"));
        let trailers = vec![Header::new("x-trailer", SOCKET)];
        input.extend(frame_bytes(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            stream,
            &encode(&mut encoder, &trailers),
        ));
        expected.push((stream, false, with_authority(request, "localhost")));
        expected.push((stream, true, trailers));
    }
    let out = run(input, 3, &[]).await.unwrap();
    assert_eq!(server_view(&frames(&out)), expected);
}

#[tokio::test]
async fn continuation_padding_and_priority() {
    let mut encoder = Encoder::indexing(4096);
    let request = grpc_request("/csi.v1.Identity/GetPluginInfo", "");
    let block = encode(&mut encoder, &request);
    let (first, rest) = block.split_at(10);
    // HEADERS: pad length 3, priority (exclusive, depends on 0, weight 16), 10 bytes, padding.
    let mut payload = vec![3, 0x80, 0, 0, 0, 15];
    payload.extend_from_slice(first);
    payload.extend_from_slice(&[0, 0, 0]);
    let mut input = client_start();
    input.extend(frame_bytes(
        frame::HEADERS,
        frame::PADDED | frame::PRIORITY | frame::END_STREAM,
        5,
        &payload,
    ));
    let mut pieces = rest.chunks(4).peekable();
    while let Some(piece) = pieces.next() {
        let flags = if pieces.peek().is_none() {
            frame::END_HEADERS
        } else {
            0
        };
        input.extend(frame_bytes(frame::CONTINUATION, flags, 5, piece));
    }
    let out = run(input, 1, &[]).await.unwrap();
    let frames = frames(&out);
    let (headers, payload) = frames
        .iter()
        .find(|(h, _)| h.kind == frame::HEADERS)
        .unwrap();
    assert_eq!(
        headers.flags,
        frame::PRIORITY | frame::END_STREAM | frame::END_HEADERS
    );
    assert_eq!(payload[..5], [0x80, 0, 0, 0, 15]);
    assert_eq!(
        server_view(&frames),
        vec![(5, true, with_authority(request, "localhost"))]
    );
}

#[tokio::test]
async fn valid_authorities_are_kept_and_others_replaced() {
    for (sent, seen) in [
        ("localhost", "localhost"),
        ("csi.example.com:443", "csi.example.com:443"),
        ("[::1]:8080", "[::1]:8080"),
        ("", "localhost"),
        (SOCKET, "localhost"),
        (r"\\.\pipe\csi", "localhost"),
        ("C:\\var\\lib\\kubelet\\reg.sock", "localhost"),
        ("two words", "localhost"),
    ] {
        let mut encoder = Encoder::indexing(4096);
        let mut input = client_start();
        let request = grpc_request("/x/y", sent);
        input.extend(frame_bytes(
            frame::HEADERS,
            frame::END_HEADERS | frame::END_STREAM,
            1,
            &encode(&mut encoder, &request),
        ));
        let out = run(input, 5, &[]).await.unwrap();
        assert_eq!(
            server_view(&frames(&out)),
            vec![(1, true, with_authority(request, seen))],
            "{sent:?}"
        );
    }
}

#[tokio::test]
async fn never_indexed_fields_stay_never_indexed() {
    let mut encoder = Encoder::indexing(4096);
    let mut request = grpc_request("/x/y", SOCKET);
    request.push(Header::sensitive("authorization", "Bearer secret"));
    let mut input = client_start();
    input.extend(frame_bytes(
        frame::HEADERS,
        frame::END_HEADERS,
        1,
        &encode(&mut encoder, &request),
    ));
    let out = run(input, 64, &[]).await.unwrap();
    let blocks = server_view(&frames(&out));
    let seen = blocks[0].2.last().unwrap();
    assert_eq!(seen, &Header::sensitive("authorization", "Bearer secret"));
}

#[tokio::test]
async fn table_size_updates_follow_the_server_settings() {
    // The client shrinks its table, then grows it to the 8192 the server advertised.
    let server = settings(&[(frame::SETTINGS_HEADER_TABLE_SIZE, 8192)]);
    let mut encoder = Encoder::indexing(4096);
    let mut input = client_start();
    input.extend(settings_ack());
    let mut expected = Vec::new();
    for (i, size) in [0, 8192, 100].into_iter().enumerate() {
        encoder.set_max_table_size(size);
        let stream = 1 + 2 * i as u32;
        let request = grpc_request("/x/y", SOCKET);
        for _ in 0..2 {
            let block = encode(&mut encoder, &request);
            input.extend(frame_bytes(
                frame::HEADERS,
                frame::END_HEADERS,
                stream,
                &block,
            ));
            expected.push((stream, false, with_authority(request.clone(), "localhost")));
        }
    }
    let out = run(input.clone(), 2, &server).await.unwrap();
    assert_eq!(server_view(&frames(&out)), expected);

    // Without the server's leave, 8192 is a decoding error that ends the connection.
    let err = run(input, 2, &[]).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains("above the advertised 4096"),
        "{err}"
    );
}

#[tokio::test]
async fn large_blocks_are_split_to_the_server_frame_size() {
    let mut encoder = Encoder::indexing(4096);
    let mut request = grpc_request("/x/y", SOCKET);
    // Huffman-codes to about 30 KiB, and to 40 KiB as a plain literal.
    request.push(Header::new("x-big", "z".repeat(40_000)));
    let block = encode(&mut encoder, &request);
    let mut input = client_start();
    let mut chunks = block
        .chunks(frame::DEFAULT_MAX_FRAME_SIZE)
        .enumerate()
        .peekable();
    while let Some((i, chunk)) = chunks.next() {
        let kind = if i == 0 {
            frame::HEADERS
        } else {
            frame::CONTINUATION
        };
        let flags = if chunks.peek().is_none() {
            frame::END_HEADERS
        } else {
            0
        };
        input.extend(frame_bytes(kind, flags, 1, chunk));
    }
    // 40 KiB is above the 16 KiB taken until the server says otherwise.
    let (err, _) = run_failing(input.clone(), 1000, &[]).await;
    assert!(err.to_string().contains("larger than 16384 bytes"), "{err}");
    let lists = settings(&[(frame::SETTINGS_MAX_HEADER_LIST_SIZE, 64 << 10)]);
    let out = run(input.clone(), 1000, &lists).await.unwrap();
    let frames = frames(&out);
    let continuations = frames
        .iter()
        .filter(|(h, _)| h.kind == frame::CONTINUATION)
        .count();
    assert_eq!(continuations, 2, "40 KiB in 16 KiB frames");
    let expected = vec![(1, false, with_authority(request.clone(), "localhost"))];
    assert_eq!(server_view(&frames), expected);

    // Once the client acknowledges a larger frame size, one frame does.
    let server = settings(&[
        (frame::SETTINGS_MAX_FRAME_SIZE, 1 << 20),
        (frame::SETTINGS_MAX_HEADER_LIST_SIZE, 64 << 10),
    ]);
    let mut acked = client_start();
    acked.extend(settings_ack());
    acked.extend_from_slice(&input[client_start().len()..]);
    let out = run(acked, 1000, &server).await.unwrap();
    let headers: Vec<_> = frames_after_preface_kinds(&out);
    assert_eq!(
        headers,
        vec![frame::SETTINGS, 0x8, frame::SETTINGS, frame::HEADERS]
    );
}

fn frames_after_preface_kinds(out: &[u8]) -> Vec<u8> {
    frames(out).iter().map(|(h, _)| h.kind).collect()
}

#[tokio::test]
async fn broken_clients_end_the_connection_with_an_error() {
    let mut encoder = Encoder::indexing(4096);
    let block = encode(&mut encoder, &grpc_request("/x/y", SOCKET));
    let cases: Vec<(&str, u32, Vec<u8>)> = vec![
        (
            "CONTINUATION without HEADERS",
            frame::PROTOCOL_ERROR,
            frame_bytes(frame::CONTINUATION, frame::END_HEADERS, 1, &block),
        ),
        (
            "interrupted",
            frame::PROTOCOL_ERROR,
            [
                frame_bytes(frame::HEADERS, 0, 1, &block[..5]),
                frame_bytes(frame::DATA, 0, 1, b"x"),
            ]
            .concat(),
        ),
        (
            "PUSH_PROMISE",
            frame::PROTOCOL_ERROR,
            frame_bytes(frame::PUSH_PROMISE, frame::END_HEADERS, 1, &[0, 0, 0, 2]),
        ),
        (
            "padding longer than the frame",
            frame::PROTOCOL_ERROR,
            frame_bytes(
                frame::HEADERS,
                frame::PADDED | frame::END_HEADERS,
                1,
                &[9, 0x82],
            ),
        ),
        (
            "HPACK",
            frame::COMPRESSION_ERROR,
            frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0xff]),
        ),
        (
            "header list too large",
            frame::COMPRESSION_ERROR,
            frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &[0x82; 400]),
        ),
        (
            "stream 0",
            frame::PROTOCOL_ERROR,
            frame_bytes(frame::HEADERS, frame::END_HEADERS, 0, &block),
        ),
        (
            "frame too large",
            frame::FRAME_SIZE_ERROR,
            frame_bytes(frame::HEADERS, frame::END_HEADERS, 1, &vec![0x82; 20_000]),
        ),
    ];
    // The server's SETTINGS first, as h2 writes them before it reads.
    let server = settings(&[(frame::SETTINGS_MAX_HEADER_LIST_SIZE, 16 << 10)]);
    for (what, code, frames) in cases {
        let mut input = client_start();
        // A request the server gets before the error: the GOAWAY's last stream.
        input.extend(frame_bytes(frame::HEADERS, frame::END_HEADERS, 7, &block));
        input.extend(frames);
        let (err, written) = run_failing(input.clone(), 3, &server).await;
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}");
        let rewrite_err = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<h2_authority::RewriteError>())
            .unwrap();
        assert_eq!(rewrite_err.code(), code, "{what}");
        assert_eq!(goaway(&written), (code, 7), "{what}");
        assert!(
            written.ends_with(rewrite_err.to_string().as_bytes()),
            "{what}: the error's text as debug data"
        );
        // Before the server's first frame there is no GOAWAY: it would come before SETTINGS.
        let (_, written) = run_failing(input, 3, &[]).await;
        assert!(written.is_empty(), "{what}");
    }
}

#[tokio::test]
async fn other_protocols_and_truncated_input_pass_through() {
    let http1 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    assert_eq!(run(http1.clone(), 1, &[]).await.unwrap(), http1);
    // A client that hangs up inside a header block: what it sent reaches the server.
    let mut input = client_start();
    input.extend(frame_bytes(
        frame::HEADERS,
        frame::END_HEADERS,
        1,
        &[0x82, 0x86],
    ));
    input.truncate(input.len() - 1);
    assert_eq!(run(input.clone(), 1, &[]).await.unwrap(), input);
    // Empty, and a preface cut short.
    assert!(run(Vec::new(), 1, &[]).await.unwrap().is_empty());
    assert_eq!(
        run(frame::PREFACE[..10].to_vec(), 1, &[]).await.unwrap(),
        &frame::PREFACE[..10]
    );
}
