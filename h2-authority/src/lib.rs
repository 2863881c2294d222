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
//! the way out for the header table size the client may use and the frame size the re-encoded
//! blocks must fit.

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
}

impl<S> AuthorityFix<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::default(),
            watch: SettingsWatch::default(),
            eof: false,
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

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
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

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
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
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
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
