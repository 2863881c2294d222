//! A gRPC client written at the HTTP/2 frame level that sends what grpc-go sends, for testing
//! servers against the real kubelet's behaviour rather than tonic's:
//!
//! * `:authority` is what grpc-go derives from the dial target; kubelet dials its plugin
//!   sockets by path, so that is the socket path (not a valid URI authority);
//! * the preface, then SETTINGS and a connection WINDOW_UPDATE, without waiting for the server;
//! * header fields in grpc-go's order, HPACK with incremental indexing of every field and
//!   Huffman-coded strings where shorter, so that later requests on a connection are mostly
//!   indexes into the dynamic table;
//! * optionally, header blocks cut into small CONTINUATION fragments.
//!
//! Calls are unary and one at a time; the server's SETTINGS and PINGs are acknowledged.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use h2_authority::frame::{self, FrameHeader};
use h2_authority::hpack::{self, Decoder, Encoder, Header};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const USER_AGENT: &str = "grpc-go/1.72.0";

const WINDOW_UPDATE: u8 = 0x8;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
/// grpc-go's connection window (it grows the 64 KiB default at once).
const CONNECTION_WINDOW: u32 = 1 << 24;

#[derive(Debug, thiserror::Error)]
pub enum GrpcGoError {
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("the server reset the stream: RST_STREAM error code {0:#x}")]
    Reset(u32),
    #[error("the server closed the connection: GOAWAY error code {0:#x}")]
    GoAway(u32),
    #[error("the server closed the connection")]
    Closed,
    #[error("cannot decode the server's headers: {0}")]
    Hpack(#[from] hpack::HpackError),
    #[error("protocol: {0}")]
    Protocol(String),
    #[error("gRPC status {code}: {message}")]
    Status { code: u32, message: String },
    #[error("cannot decode the response message: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("timed out")]
    Timeout,
}

/// How the client behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The `:authority` of every request.
    pub authority: String,
    /// Header blocks are cut into fragments of at most this many bytes, the first in HEADERS
    /// and the rest in CONTINUATION frames (grpc-go cuts at the server's frame size).
    pub fragment: usize,
    /// Sent as `grpc-timeout`, as grpc-go does for a call with a deadline.
    pub timeout: Option<Duration>,
}

impl Options {
    /// What kubelet's plugin watcher sends when it dials `socket`.
    pub fn kubelet(socket: &std::path::Path) -> Self {
        Self {
            authority: socket.display().to_string(),
            fragment: frame::DEFAULT_MAX_FRAME_SIZE,
            timeout: None,
        }
    }
}

/// A response as received.
#[derive(Debug, Default)]
pub struct Response {
    pub headers: Vec<Header>,
    /// The DATA payload: length-prefixed messages.
    pub body: Vec<u8>,
    /// The trailers; for a trailers-only response, the one header block.
    pub trailers: Vec<Header>,
}

impl Response {
    /// The value of the first field named `name` in the trailers.
    pub fn trailer(&self, name: &str) -> Option<&str> {
        self.trailers
            .iter()
            .find(|h| h.name == name.as_bytes())
            .and_then(|h| std::str::from_utf8(&h.value).ok())
    }

    /// The gRPC status code in the trailers.
    pub fn grpc_status(&self) -> Option<u32> {
        self.trailer("grpc-status")?.parse().ok()
    }

    /// The one message of a unary response.
    pub fn message(&self) -> Result<&[u8], GrpcGoError> {
        let (prefix, rest) = self
            .body
            .split_first_chunk::<5>()
            .ok_or_else(|| GrpcGoError::Protocol("no length-prefixed message".into()))?;
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if prefix[0] != 0 || rest.len() != len {
            return Err(GrpcGoError::Protocol(format!(
                "message prefix {prefix:?} does not match {} bytes",
                rest.len()
            )));
        }
        Ok(rest)
    }
}

pub struct Client<S> {
    io: S,
    options: Options,
    encoder: Encoder,
    decoder: Decoder,
    next_stream: u32,
    input: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Client<S> {
    /// Starts HTTP/2 on `io`: the preface, SETTINGS and a WINDOW_UPDATE, as grpc-go does.
    pub async fn handshake(mut io: S, options: Options) -> Result<Self, GrpcGoError> {
        let mut start = frame::PREFACE.to_vec();
        // grpc-go's SETTINGS: no push, and its default 16 MiB header list limit.
        let settings: [(u16, u32); 2] = [(0x2, 0), (0x6, 16 << 20)];
        let payload: Vec<u8> = settings
            .iter()
            .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
            .collect();
        frame::write(&mut start, frame::SETTINGS, 0, 0, &payload);
        frame::write(
            &mut start,
            WINDOW_UPDATE,
            0,
            0,
            &(CONNECTION_WINDOW - 65_535).to_be_bytes(),
        );
        io.write_all(&start).await?;
        Ok(Self {
            io,
            options,
            encoder: Encoder::indexing(hpack::DEFAULT_TABLE_SIZE),
            decoder: Decoder::default(),
            next_stream: 1,
            input: BytesMut::new(),
        })
    }

    /// A unary call: `request` out, the decoded response back, `grpc-status: 0` required.
    pub async fn unary<Req, Resp>(&mut self, path: &str, request: &Req) -> Result<Resp, GrpcGoError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let response = self.call(path, &request.encode_to_vec()).await?;
        match response.grpc_status() {
            Some(0) => Ok(Resp::decode(response.message()?)?),
            Some(code) => Err(GrpcGoError::Status {
                code,
                message: response.trailer("grpc-message").unwrap_or_default().into(),
            }),
            None => Err(GrpcGoError::Protocol(format!(
                "no grpc-status in the trailers {:?}",
                response.trailers
            ))),
        }
    }

    /// Sends one request message on a new stream and reads the whole response.
    pub async fn call(&mut self, path: &str, message: &[u8]) -> Result<Response, GrpcGoError> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let mut headers = vec![
            Header::new(":method", "POST"),
            Header::new(":scheme", "http"),
            Header::new(":path", path),
            Header::new(":authority", self.options.authority.as_str()),
            Header::new("content-type", "application/grpc"),
            Header::new("user-agent", USER_AGENT),
            Header::new("te", "trailers"),
        ];
        if let Some(timeout) = self.options.timeout {
            headers.push(Header::new(
                "grpc-timeout",
                format!("{}u", timeout.as_micros()),
            ));
        }
        let mut block = Vec::new();
        self.encoder.encode(&headers, &mut block);
        let mut out = Vec::new();
        let fragment = self.options.fragment.max(1);
        let mut pieces = block.chunks(fragment).peekable();
        let mut kind = frame::HEADERS;
        while let Some(piece) = pieces.next() {
            let flags = if pieces.peek().is_none() {
                frame::END_HEADERS
            } else {
                0
            };
            frame::write(&mut out, kind, flags, stream, piece);
            kind = frame::CONTINUATION;
        }
        let mut data = vec![0];
        data.extend_from_slice(&(message.len() as u32).to_be_bytes());
        data.extend_from_slice(message);
        frame::write(&mut out, frame::DATA, frame::END_STREAM, stream, &data);
        self.io.write_all(&out).await?;
        self.response(stream).await
    }

    async fn response(&mut self, stream: u32) -> Result<Response, GrpcGoError> {
        let mut response = Response::default();
        let mut block: Option<(u32, bool, Vec<u8>)> = None;
        loop {
            let (header, payload) = self.read_frame().await?;
            match header.kind {
                frame::HEADERS | frame::CONTINUATION => {
                    let fragment = if header.kind == frame::HEADERS {
                        block = Some((
                            header.stream,
                            header.flags & frame::END_STREAM != 0,
                            Vec::new(),
                        ));
                        headers_fragment(&header, &payload)?
                    } else {
                        &payload[..]
                    };
                    let (block_stream, end_stream, bytes) = block.as_mut().ok_or_else(|| {
                        GrpcGoError::Protocol("CONTINUATION without HEADERS".into())
                    })?;
                    bytes.extend_from_slice(fragment);
                    if header.flags & frame::END_HEADERS == 0 {
                        continue;
                    }
                    let (block_stream, end_stream) = (*block_stream, *end_stream);
                    let fields = self.decoder.decode(bytes)?;
                    block = None;
                    if block_stream != stream {
                        continue;
                    }
                    if response.headers.is_empty() && !end_stream {
                        response.headers = fields;
                    } else {
                        response.trailers = fields;
                    }
                    if end_stream {
                        return Ok(response);
                    }
                }
                frame::DATA if header.stream == stream => {
                    let data = data_payload(&header, &payload)?;
                    response.body.extend_from_slice(data);
                    if !payload.is_empty() {
                        // Give the window back, as grpc-go does for what it has read.
                        let increment = (payload.len() as u32).to_be_bytes();
                        let mut out = Vec::new();
                        frame::write(&mut out, WINDOW_UPDATE, 0, 0, &increment);
                        frame::write(&mut out, WINDOW_UPDATE, 0, stream, &increment);
                        self.io.write_all(&out).await?;
                    }
                    if header.flags & frame::END_STREAM != 0 {
                        return Ok(response);
                    }
                }
                frame::SETTINGS if header.flags & frame::ACK == 0 => {
                    let mut out = Vec::new();
                    frame::write(&mut out, frame::SETTINGS, frame::ACK, 0, &[]);
                    self.io.write_all(&out).await?;
                }
                PING if header.flags & frame::ACK == 0 => {
                    let mut out = Vec::new();
                    frame::write(&mut out, PING, frame::ACK, 0, &payload);
                    self.io.write_all(&out).await?;
                }
                RST_STREAM if header.stream == stream => {
                    return Err(GrpcGoError::Reset(code(&payload, 0)));
                }
                GOAWAY => return Err(GrpcGoError::GoAway(code(&payload, 4))),
                _ => {}
            }
        }
    }

    async fn read_frame(&mut self) -> Result<(FrameHeader, Vec<u8>), GrpcGoError> {
        loop {
            if let Some(bytes) = self.input.first_chunk::<{ frame::HEADER_LEN }>() {
                let header = FrameHeader::parse(bytes);
                if self.input.len() >= frame::HEADER_LEN + header.len {
                    self.input.advance(frame::HEADER_LEN);
                    let payload = self.input.split_to(header.len).to_vec();
                    return Ok((header, payload));
                }
            }
            self.input.reserve(16 * 1024);
            if self.io.read_buf(&mut self.input).await? == 0 {
                return Err(GrpcGoError::Closed);
            }
        }
    }

    /// The underlying connection.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.io
    }
}

fn code(payload: &[u8], at: usize) -> u32 {
    payload
        .get(at..at + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(u32::MAX)
}

/// The header block fragment of a HEADERS frame, without padding and priority.
fn headers_fragment<'a>(header: &FrameHeader, payload: &'a [u8]) -> Result<&'a [u8], GrpcGoError> {
    let mut rest = payload;
    let mut padding = 0;
    if header.flags & frame::PADDED != 0 {
        let (&pad, after) = rest
            .split_first()
            .ok_or_else(|| GrpcGoError::Protocol("empty PADDED frame".into()))?;
        padding = usize::from(pad);
        rest = after;
    }
    if header.flags & frame::PRIORITY != 0 {
        rest = rest
            .get(5..)
            .ok_or_else(|| GrpcGoError::Protocol("short PRIORITY".into()))?;
    }
    rest.get(..rest.len().saturating_sub(padding))
        .filter(|_| padding <= rest.len())
        .ok_or_else(|| GrpcGoError::Protocol("padding longer than the frame".into()))
}

fn data_payload<'a>(header: &FrameHeader, payload: &'a [u8]) -> Result<&'a [u8], GrpcGoError> {
    if header.flags & frame::PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or_else(|| GrpcGoError::Protocol("empty PADDED frame".into()))?;
    rest.get(..rest.len().saturating_sub(usize::from(pad)))
        .filter(|_| usize::from(pad) <= rest.len())
        .ok_or_else(|| GrpcGoError::Protocol("padding longer than the frame".into()))
}

/// Connects to the unix socket at `path` and starts HTTP/2 as kubelet's grpc-go client does.
#[cfg(unix)]
pub async fn dial_unix(
    path: &std::path::Path,
    options: Options,
) -> Result<Client<tokio::net::UnixStream>, GrpcGoError> {
    let stream = tokio::net::UnixStream::connect(path).await?;
    Client::handshake(stream, options).await
}

/// `future` with a deadline, its elapse as [`GrpcGoError::Timeout`].
pub async fn with_timeout<T>(
    timeout: Duration,
    future: impl std::future::Future<Output = Result<T, GrpcGoError>>,
) -> Result<T, GrpcGoError> {
    tokio::time::timeout(timeout, future)
        .await
        .unwrap_or(Err(GrpcGoError::Timeout))
}
