//! Lets hyper/h2 servers accept requests whose HTTP/2 `:authority` is not a URI authority.
//!
//! grpc-go dials a unix socket given by its path (as kubelet's plugin watcher does) with the path
//! as `:authority`; other clients send an empty one. h2 answers such a request with
//! `RST_STREAM(PROTOCOL_ERROR)` and has no switch to accept it (hyperium/h2#487). [`AuthorityFix`]
//! wraps the server end of a connection and rewrites those header blocks on the way in, so that
//! the server sees `:authority: localhost`.
//!
//! It follows the client's frames, decodes every header block with an HPACK decoder that mirrors
//! the client's dynamic table, and writes each block out again with the static table and plain
//! literals only: the server's decoder is never told to index anything, so its table stays empty
//! and cannot drift from the client's. Never-indexed fields stay never-indexed. Everything else
//! (the preface, DATA and all other frames) passes through unchanged; payloads are copied from
//! the socket straight into the server's read buffer. The server's own SETTINGS are followed on
//! the way out for the header table size the client may use, the frame size the re-encoded
//! blocks must fit and the header list size it accepts.
//!
//! # Bounds
//!
//! A one-byte indexed field stands for a whole dynamic-table entry, so a small block can decode
//! to a huge list. Decoded header lists are held to the server's SETTINGS_MAX_HEADER_LIST_SIZE
//! (from the moment the server sends it: it is advisory, and h2 enforces it from then on),
//! counted as RFC 9113 (6.5.2) does (name, value and 32 bytes a field); until the server
//! advertises one, to 16 KiB ([`hpack::DEFAULT_MAX_LIST_SIZE`], what hyper's server advertises
//! by default). Decoding stops at the field that crosses the limit, before copying it. The
//! rewriter cannot skip the rest of such a block as the server would (RFC 9113, 10.5.1: a
//! server may answer 431 but must then still decode the whole block to keep the compression
//! context) without materializing it, and what it has not decoded leaves its table out of
//! step with the client's: so it is a connection error of type COMPRESSION_ERROR (RFC 9113,
//! 4.3). A block that h2 would have answered with 431 now ends the connection; a client that
//! keeps within the advertised limit never sees the difference. Re-encoded blocks are no larger
//! than the list limit plus frame headers ([`rewrite::Rewriter::max_block_output`]); an encoded
//! block is buffered up to [`rewrite::MAX_HEADER_BLOCK`].
//!
//! # Errors
//!
//! A client that breaks the protocol ends the connection: the server's read fails with
//! [`io::ErrorKind::InvalidData`] carrying a [`RewriteError`]. Before that the adapter sends the
//! client a GOAWAY with the error's code ([`RewriteError::code`]), the highest stream the server
//! was handed and the error's text, if the server is between frames of its own: not inside a
//! frame it has half written, nor before its first SETTINGS, which must come first.

pub mod frame;
pub mod hpack;
mod huffman;
pub mod rewrite;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub use rewrite::{RewriteError, is_valid_authority};
use rewrite::{Rewriter, SettingsWatch, Step};

/// How much is read from the client at a time when a frame header or header block is wanted.
const READ_CHUNK: usize = 8 * 1024;

/// The server end of an HTTP/2 connection, with client header blocks made acceptable to h2.
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    watch: SettingsWatch,
    eof: bool,
    /// The connection error every read returns once the client broke the protocol.
    failed: Option<RewriteError>,
    /// The GOAWAY telling the client so, and how much of it is written.
    goaway: Option<(Vec<u8>, usize)>,
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            watch: SettingsWatch::default(),
            eof: false,
            failed: None,
            goaway: None,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// How many `:authority` values have been replaced on this connection.
    pub fn rewritten(&self) -> u64 {
        self.rewriter.rewritten()
    }
}

// Writes too: a connection error is told to the client with a GOAWAY.
impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(err) = &this.failed {
            let err = err.clone();
            ready!(this.poll_goaway(cx));
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, err)));
        }
        let rw = &mut this.rewriter;
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !rw.output.is_empty() {
                let n = rw.output.len().min(buf.remaining());
                buf.put_slice(&rw.output[..n]);
                rw.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if rw.forward > 0 && !rw.input.is_empty() {
                let n = rw.forward.min(rw.input.len()).min(buf.remaining());
                buf.put_slice(&rw.input[..n]);
                rw.input.advance(n);
                consume(&mut rw.forward, n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if rw.forward > 0 {
                // Payload bytes go from the socket straight into the caller's buffer.
                let want = rw.forward.min(buf.remaining());
                let mut direct = ReadBuf::new(buf.initialize_unfilled_to(want));
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut direct))?;
                let n = direct.filled().len();
                buf.advance(n);
                consume(&mut rw.forward, n);
                this.eof = n == 0;
                return Poll::Ready(Ok(()));
            }
            let wanted = match rw.step() {
                Ok(Step::Progress) => continue,
                Ok(Step::NeedMore(wanted)) => wanted,
                Err(err) => {
                    if this.watch.between_frames() {
                        let debug = err.to_string();
                        let frame = frame::goaway(rw.last_stream(), err.code(), debug.as_bytes());
                        this.goaway = Some((frame, 0));
                    }
                    this.failed = Some(err.clone());
                    ready!(this.poll_goaway(cx));
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, err)));
                }
            };
            rw.input
                .reserve(wanted.saturating_sub(rw.input.len()).max(READ_CHUNK));
            let n = ready!(tokio_util::io::poll_read_buf(
                Pin::new(&mut this.inner),
                cx,
                &mut rw.input
            ))?;
            if n == 0 {
                // The client hung up, maybe in the middle of a frame: hand on what there is
                // and let the server make of it what it will.
                this.eof = true;
                rw.forward = usize::MAX;
            }
        }
    }
}

fn consume(forward: &mut usize, n: usize) {
    if *forward != usize::MAX {
        *forward -= n;
    }
}

impl<S: AsyncWrite + Unpin> AuthorityFix<S> {
    /// Finishes writing the GOAWAY, if there is one. Failing to is no worse than not sending it:
    /// the connection ends either way.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some((frame, written)) = &mut self.goaway else {
            return Poll::Ready(());
        };
        while *written < frame.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &frame[*written..])) {
                Ok(n) if n > 0 => *written += n,
                _ => break,
            }
        }
        let _ = ready!(Pin::new(&mut self.inner).poll_flush(cx));
        self.goaway = None;
        Poll::Ready(())
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Nothing of the server's goes between the GOAWAY's bytes.
        ready!(this.poll_goaway(cx));
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        this.watched(&[io::IoSlice::new(&buf[..n])]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_goaway(cx));
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        let written: Vec<io::IoSlice<'_>> = bufs
            .iter()
            .map_while(|slice| {
                (left > 0).then(|| {
                    let take = left.min(slice.len());
                    left -= take;
                    io::IoSlice::new(&slice[..take])
                })
            })
            .collect();
        this.watched(&written);
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_goaway(cx));
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_goaway(cx));
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S> AuthorityFix<S> {
    /// Follows what the server wrote for its SETTINGS.
    fn watched(&mut self, written: &[io::IoSlice<'_>]) {
        if self.rewriter.passing_through() {
            return;
        }
        let rewriter = &mut self.rewriter;
        for slice in written {
            self.watch
                .feed(slice, |entries| rewriter.settings_sent(entries));
        }
    }
}

#[cfg(feature = "tonic")]
impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for AuthorityFix<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
