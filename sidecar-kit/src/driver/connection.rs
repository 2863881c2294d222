//! The gRPC connection to the CSI driver.
//!
//! Dialing waits for the driver (bounded, 30 s by default, logging every 10 s), then keeps one
//! HTTP/2 connection. Every byte stream handed to gRPC is watched: when the driver closes it
//! (driver exit or restart) the connection is reported lost at once. What happens then is the
//! sidecar's policy: the controller sidecars exit, because the capabilities they cached may no
//! longer hold; the node sidecars let the channel redial on the next call.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint as TonicEndpoint, Uri};

use crate::driver::endpoint::{self, Endpoint, EndpointError};

/// Upstream's bound on the first dial.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a pending dial says it is still waiting.
pub const STILL_CONNECTING_INTERVAL: Duration = Duration::from_secs(10);
/// The message upstream writes before exiting on a lost connection.
pub const LOST_CONNECTION_MESSAGE: &str = "Lost connection to CSI driver, exiting";

/// What to do when an established connection breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossPolicy {
    /// Report the loss and let the sidecar exit (provisioner, attacher).
    Exit,
    /// Log and redial on the next call (registrar, livenessprobe).
    Reconnect,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Address(#[from] EndpointError),
    #[error("cannot connect to the CSI driver at {endpoint} within {timeout:?}: {last_error}")]
    Timeout {
        endpoint: String,
        timeout: Duration,
        last_error: String,
    },
    #[error("connection to the CSI driver at {endpoint} cancelled")]
    Cancelled { endpoint: String },
}

/// Settings of [`connect`].
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// `None` waits for the driver forever (livenessprobe's behaviour).
    pub dial_timeout: Option<Duration>,
    pub policy: LossPolicy,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            dial_timeout: Some(DEFAULT_DIAL_TIMEOUT),
            policy: LossPolicy::Exit,
        }
    }
}

/// An established connection to the driver.
#[derive(Clone)]
pub struct DriverConnection {
    channel: Channel,
    endpoint: Endpoint,
    lost: watch::Receiver<u64>,
}

struct LinkState {
    policy: LossPolicy,
    /// Bumped on every loss of an established stream.
    losses: watch::Sender<u64>,
    /// A live stream id, so that only the current stream's end counts as a loss.
    current: AtomicU64,
    next_id: AtomicU64,
    refuse_redial: AtomicBool,
}

impl DriverConnection {
    /// The channel for the generated CSI clients.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Resolves once the established connection has been lost (immediately if it already was).
    pub async fn lost(&self) {
        let mut lost = self.lost.clone();
        let _ = lost.wait_for(|losses| *losses > 0).await;
    }

    /// How many times an established connection has been lost.
    pub fn losses(&self) -> u64 {
        *self.lost.borrow()
    }

    /// For [`LossPolicy::Exit`]: spawns a task that exits the process, as upstream does, when
    /// the connection is lost.
    pub fn exit_on_loss(&self) {
        let connection = self.clone();
        tokio::spawn(async move {
            connection.lost().await;
            crate::runtime::lifecycle::fatal(LOST_CONNECTION_MESSAGE);
        });
    }
}

/// Connects to the driver at `address`, waiting for it to come up within the dial timeout.
pub async fn connect(
    address: &str,
    options: ConnectOptions,
) -> Result<DriverConnection, ConnectError> {
    let endpoint = endpoint::parse(address)?;
    let (losses, lost) = watch::channel(0);
    let state = Arc::new(LinkState {
        policy: options.policy,
        losses,
        current: AtomicU64::new(0),
        next_id: AtomicU64::new(1),
        refuse_redial: AtomicBool::new(false),
    });
    let started = Instant::now();
    let mut next_report = started + STILL_CONNECTING_INTERVAL;
    loop {
        let attempt = channel_for(&endpoint, state.clone()).await;
        match attempt {
            Ok(channel) => {
                tracing::debug!(%endpoint, "connected to the CSI driver");
                return Ok(DriverConnection {
                    channel,
                    endpoint,
                    lost,
                });
            }
            Err(err) => {
                // A dial whose handshake failed established nothing; the next is no redial.
                state.current.store(0, Ordering::SeqCst);
                let now = Instant::now();
                if let Some(limit) = options.dial_timeout
                    && now.duration_since(started) >= limit
                {
                    return Err(ConnectError::Timeout {
                        endpoint: endpoint.to_string(),
                        timeout: limit,
                        last_error: err,
                    });
                }
                if now >= next_report {
                    tracing::info!(%endpoint, error = %err, "still connecting to the CSI driver");
                    next_report = now + STILL_CONNECTING_INTERVAL;
                }
            }
        }
        // gRPC's reconnect backoff is capped at one second upstream too.
        let pause =
            Duration::from_millis(250).min(options.dial_timeout.map_or(Duration::MAX, |limit| {
                limit
                    .saturating_sub(started.elapsed())
                    .max(Duration::from_millis(10))
            }));
        tokio::time::sleep(pause).await;
    }
}

/// HTTP/2 flow-control windows of the driver connection, as grpc-go's: small per stream, so
/// that what a stream's reader leaves unread stays small, and large per connection, so that
/// one stalled stream never holds the others up. h2 also ends a connection that holds too many
/// small DATA frames unread (GOAWAY ENHANCE_YOUR_CALM, which the controller sidecars would
/// take for the driver gone); its allowance is half the connection window, and a stream's
/// window bounds what one stream may leave unread (grpc-go drivers send each message in a
/// frame of its own: a few dozen bytes for a block of SnapshotMetadata).
pub const STREAM_WINDOW: u32 = 64 * 1024;
pub const CONNECTION_WINDOW: u32 = 1 << 30;

async fn channel_for(endpoint: &Endpoint, state: Arc<LinkState>) -> Result<Channel, String> {
    // The URI is not dialed: the connector below decides where bytes go.
    let builder = TonicEndpoint::from_static("http://csi-driver.local")
        .connect_timeout(Duration::from_secs(5))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(false);
    let endpoint = endpoint.clone();
    let connector = tower::service_fn(move |_: Uri| {
        let endpoint = endpoint.clone();
        let state = state.clone();
        async move {
            if state.policy == LossPolicy::Exit && state.current.load(Ordering::SeqCst) != 0 {
                // A redial means the established connection is gone, even when it ended
                // without an EOF we saw (a driver's graceful stop: GOAWAY, then our side
                // closes). Upstream exits on the first reconnect; so do we.
                state.lose_for_good();
            }
            if state.refuse_redial.load(Ordering::SeqCst) {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    LOST_CONNECTION_MESSAGE,
                ));
            }
            let stream = dial(&endpoint).await?;
            let id = state.next_id.fetch_add(1, Ordering::SeqCst);
            state.current.store(id, Ordering::SeqCst);
            Ok::<_, io::Error>(TokioIo::new(Monitored {
                inner: stream,
                id,
                state,
                ended: false,
            }))
        }
    });
    builder
        .connect_with_connector(connector)
        .await
        .map_err(|err| {
            // Error chains often repeat their cause in their own text: add each cause once.
            let mut text = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(inner) = source {
                let cause = inner.to_string();
                if !text.contains(&cause) {
                    text = format!("{text}: {cause}");
                }
                source = inner.source();
            }
            text
        })
}

impl LinkState {
    fn stream_ended(&self, id: u64) {
        if self.current.load(Ordering::SeqCst) != id {
            return;
        }
        match self.policy {
            LossPolicy::Exit => self.lose_for_good(),
            LossPolicy::Reconnect => {
                tracing::warn!("lost connection to the CSI driver; reconnecting on the next call");
                self.losses.send_modify(|n| *n += 1);
            }
        }
    }

    /// [`LossPolicy::Exit`]: reports the loss once and refuses every redial.
    fn lose_for_good(&self) {
        if !self.refuse_redial.swap(true, Ordering::SeqCst) {
            tracing::error!("lost connection to the CSI driver");
            self.losses.send_modify(|n| *n += 1);
        }
    }
}

/// A byte stream to the driver, of whichever transport the endpoint uses.
pub trait DriverIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> DriverIo for T {}

/// Opens one byte stream to the driver.
pub async fn dial(endpoint: &Endpoint) -> io::Result<Box<dyn DriverIo>> {
    match endpoint {
        #[cfg(unix)]
        Endpoint::Unix(path) => Ok(Box::new(tokio::net::UnixStream::connect(path).await?)),
        #[cfg(windows)]
        Endpoint::Unix(path) => Ok(Box::new(crate::driver::windows::unix_connect(path).await?)),
        #[cfg(windows)]
        Endpoint::NamedPipe(name) => {
            Ok(Box::new(crate::driver::windows::pipe_connect(name).await?))
        }
        #[cfg(not(windows))]
        Endpoint::NamedPipe(name) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("named pipe {name} is only supported on Windows"),
        )),
        Endpoint::Tcp(addr) => {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(Box::new(stream))
        }
    }
}

/// Reports the end of the stream to the link state: an EOF or an error while reading, or an
/// error while writing. A driver killed while a request is being sent shows up as a failed
/// write (EPIPE) after which the connection is dropped without another read, so watching reads
/// alone would miss it until the next call.
struct Monitored {
    inner: Box<dyn DriverIo>,
    id: u64,
    state: Arc<LinkState>,
    ended: bool,
}

impl Monitored {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            self.state.stream_ended(self.id);
        }
    }
}

impl AsyncRead for Monitored {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &polled {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.end()
            }
            Poll::Ready(Err(_)) => self.end(),
            _ => {}
        }
        polled
    }
}

impl AsyncWrite for Monitored {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Err(_)) = &polled {
            self.end();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        if let Poll::Ready(Err(_)) = &polled {
            self.end();
        }
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Our own side closing is not a loss.
        self.ended = true;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A stream whose peer is gone: reads wait forever, writes and flushes fail with EPIPE.
    struct PeerGone;

    impl AsyncRead for PeerGone {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for PeerGone {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn monitored(
        policy: LossPolicy,
        inner: Box<dyn DriverIo>,
    ) -> (Monitored, watch::Receiver<u64>) {
        let (losses, lost) = watch::channel(0);
        let state = Arc::new(LinkState {
            policy,
            losses,
            current: AtomicU64::new(1),
            next_id: AtomicU64::new(2),
            refuse_redial: AtomicBool::new(false),
        });
        let stream = Monitored {
            inner,
            id: 1,
            state,
            ended: false,
        };
        (stream, lost)
    }

    #[tokio::test]
    async fn a_failed_write_is_a_loss() {
        for policy in [LossPolicy::Exit, LossPolicy::Reconnect] {
            let (mut stream, lost) = monitored(policy, Box::new(PeerGone));
            assert!(stream.write_all(b"request").await.is_err());
            assert_eq!(*lost.borrow(), 1, "{policy:?}");
            // The same stream failing again is the same loss.
            assert!(stream.flush().await.is_err());
            assert_eq!(*lost.borrow(), 1, "{policy:?}");
        }
        let (mut stream, lost) = monitored(LossPolicy::Exit, Box::new(PeerGone));
        assert!(stream.flush().await.is_err());
        assert_eq!(*lost.borrow(), 1);
    }

    #[tokio::test]
    async fn an_eof_is_a_loss_and_our_own_close_is_not() {
        let (ours, theirs) = tokio::io::duplex(64);
        let (mut stream, lost) = monitored(LossPolicy::Exit, Box::new(ours));
        drop(theirs);
        let mut buf = [0u8; 8];
        assert_eq!(stream.read(&mut buf).await.unwrap(), 0);
        assert_eq!(*lost.borrow(), 1);

        let (ours, _theirs) = tokio::io::duplex(64);
        let (mut stream, lost) = monitored(LossPolicy::Exit, Box::new(ours));
        stream.shutdown().await.unwrap();
        assert_eq!(*lost.borrow(), 0);
    }
}
