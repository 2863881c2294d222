//! The connections of a process to its API server, opened as client-go's transport opens them.
//!
//! Over TLS the server picks the protocol (ALPN). When it picks HTTP/2, every request and watch
//! of the process is a stream of one connection, as long as that connection may carry one more:
//! the server caps the streams of a connection (kube-apiserver: 100, SETTINGS_MAX_CONCURRENT_STREAMS),
//! and a request beyond the cap would wait inside the connection for a stream to end. A process
//! with 100 workers and a dozen watches would queue its requests behind its own watches, Lease
//! renewals among them. So a request that finds every connection full opens one more, as Go's
//! transport does, and a connection that carried no stream for [`Timings::idle`] is closed, so
//! the extra ones go away when the load ends.
//!
//! When the server picks HTTP/1.1 (or the URL is `http://`), hyper's pool serves the requests,
//! one connection per request in flight. hyper's own pool cannot do the above: it keeps one
//! HTTP/2 connection per host and queues on it whatever the server's cap.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::client::conn::http2;
use hyper_util::client::legacy::connect::Connection as _;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::Body;
use tokio::time::Instant;
use tower::{BoxError, Service, ServiceExt as _};

/// Streams assumed per connection until the server's SETTINGS say otherwise (what RFC 9113
/// recommends a server allows at least, and Go's transport assumes).
const ASSUMED_STREAMS: usize = 100;

/// Longest a dial may take, TLS included, whatever the kubeconfig's timeouts: requests that
/// need a new connection wait for the one dial under way.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// At most this many HTTP/2 connections: a server that allows very few streams (or none) is
/// not answered by an unbounded number of connections; beyond it requests share the least busy.
const MAX_CONNECTIONS: usize = 16;

/// The time settings of the connections.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// An HTTP/2 PING after this long without a frame (client-go's `ReadIdleTimeout`, 30 s).
    pub ping_interval: Duration,
    /// A connection whose PING is not answered within this is closed (client-go's
    /// `PingTimeout`, 15 s), failing its streams so that they are retried on a new one.
    pub ping_timeout: Duration,
    /// An HTTP/2 connection without a stream for this long is closed (client-go's
    /// `IdleConnTimeout`, 90 s).
    pub idle: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            ping_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(15),
            idle: Duration::from_secs(90),
        }
    }
}

/// HTTP/2 flow-control windows, client-go's (golang.org/x/net/http2's transport: 1 GiB for the
/// connection, 4 MiB per stream). hyper's defaults (5 MiB and 2 MiB) let three watches whose
/// events are not read yet take the whole connection window, stalling every other request on
/// the connection, Lease renewals included. A window is a permission, not a buffer: what a
/// stream receives is held only until it is read.
const H2_CONNECTION_WINDOW: u32 = 1 << 30;
const H2_STREAM_WINDOW: u32 = 4 << 20;

/// Opens a TLS (or TCP) connection to a URI.
pub trait Dial:
    Service<Uri, Response = Self::Io, Error = BoxError, Future: Send + Unpin>
    + Clone
    + Send
    + Sync
    + 'static
{
    type Io: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Unpin
        + Send
        + 'static;
}

impl<S, Io> Dial for S
where
    S: Service<Uri, Response = Io, Error = BoxError, Future: Send + Unpin>
        + Clone
        + Send
        + Sync
        + 'static,
    Io: hyper::rt::Read
        + hyper::rt::Write
        + hyper_util::client::legacy::connect::Connection
        + Unpin
        + Send
        + 'static,
{
    type Io = Io;
}

type Http1Pool<D> = hyper_util::client::legacy::Client<Predialed<D>, Body>;

/// A connection dialed to learn the server's protocol, which turned out HTTP/1.1: hyper's pool
/// takes it as the first one it would dial, so that finding out costs no connection.
type Parked<D> = Arc<Mutex<Option<<D as Dial>::Io>>>;

/// `D`, handing out the [`Parked`] connection first.
#[derive(Clone)]
pub struct Predialed<D: Dial> {
    dial: D,
    parked: Parked<D>,
}

impl<D: Dial> Service<Uri> for Predialed<D> {
    type Response = D::Io;
    type Error = BoxError;
    type Future = futures::future::Either<
        futures::future::Ready<Result<D::Io, BoxError>>,
        <D as Service<Uri>>::Future,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.dial.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let parked = self.parked.lock().ok().and_then(|mut p| p.take());
        match parked {
            Some(io) => futures::future::Either::Left(futures::future::ready(Ok(io))),
            None => futures::future::Either::Right(self.dial.call(uri)),
        }
    }
}

/// See the module's documentation.
pub struct Pool<D: Dial> {
    shared: Arc<Shared<D>>,
}

impl<D: Dial> Clone for Pool<D> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<D: Dial> {
    dial: D,
    http1: Http1Pool<D>,
    parked: Parked<D>,
    timings: Timings,
    state: Mutex<State>,
    /// One dial at a time: requests that find no room wait for it and then share what it opened.
    dialing: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// Whether the server speaks HTTP/2: unknown until a TLS connection has told.
    http2: Option<bool>,
    connections: Vec<Arc<Connection>>,
    reaping: bool,
}

/// One HTTP/2 connection: how to send on it, and what it carries.
struct Connection {
    sender: http2::SendRequest<Body>,
    /// Streams of ours open on it (a request until its answer's body ends or is dropped).
    streams: AtomicUsize,
    /// The server's current cap on its streams.
    cap: Arc<AtomicUsize>,
    closed: Arc<AtomicBool>,
    /// Since when it carries no stream.
    idle_since: Mutex<Option<Instant>>,
}

impl Connection {
    fn usable(&self) -> bool {
        !self.closed.load(Ordering::Acquire) && !self.sender.is_closed()
    }

    fn has_room(&self) -> bool {
        self.streams.load(Ordering::Acquire) < self.cap.load(Ordering::Acquire).max(1)
    }
}

/// A stream taken on a connection, given back when dropped.
struct Stream {
    connection: Arc<Connection>,
}

impl Stream {
    fn take(connection: &Arc<Connection>) -> Self {
        connection.streams.fetch_add(1, Ordering::AcqRel);
        Self {
            connection: connection.clone(),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.connection.streams.fetch_sub(1, Ordering::AcqRel) == 1
            && let Ok(mut since) = self.connection.idle_since.lock()
        {
            *since = Some(Instant::now());
        }
    }
}

/// The body of an answer, holding its stream until it ends.
pub struct Streamed {
    inner: Incoming,
    stream: Option<Stream>,
}

impl hyper::body::Body for Streamed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None | Some(Err(_))) = frame {
            self.stream = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<D: Dial> Pool<D> {
    /// A pool dialing with `dial`, its HTTP/1.1 connections kept as `http1` says.
    pub fn new(dial: D, http1: &hyper_util::client::legacy::Builder, timings: Timings) -> Self {
        let parked: Parked<D> = Arc::new(Mutex::new(None));
        let http1 = http1.build(Predialed {
            dial: dial.clone(),
            parked: parked.clone(),
        });
        Self {
            shared: Arc::new(Shared {
                dial,
                http1,
                parked,
                timings,
                state: Mutex::new(State::default()),
                dialing: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

/// Where a request goes.
enum Route {
    Http1,
    Http2(Stream),
}

impl<D: Dial> Shared<D> {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A stream on the first connection with room (the oldest first, so that the newer ones
    /// empty when the load drops), or `None` when a new connection is wanted.
    fn route(&self) -> Option<Route> {
        let mut state = self.state();
        match state.http2 {
            Some(false) => return Some(Route::Http1),
            None => return None,
            Some(true) => {}
        }
        state.connections.retain(|c| c.usable());
        if let Some(connection) = state.connections.iter().find(|c| c.has_room()) {
            return Some(Route::Http2(Stream::take(connection)));
        }
        if state.connections.len() >= MAX_CONNECTIONS {
            let least = state
                .connections
                .iter()
                .min_by_key(|c| c.streams.load(Ordering::Acquire))?;
            return Some(Route::Http2(Stream::take(least)));
        }
        None
    }

    /// Opens a connection for `uri` unless one with room appeared while waiting for the dial.
    async fn open(self: &Arc<Self>, uri: &Uri) -> Result<Route, BoxError> {
        let _dialing = self.dialing.lock().await;
        if let Some(route) = self.route() {
            return Ok(route);
        }
        let dial = self.dial.clone().oneshot(uri.clone());
        let io = tokio::time::timeout(DIAL_TIMEOUT, dial)
            .await
            .map_err(|_| format!("no connection to the API server within {DIAL_TIMEOUT:?}"))??;
        if !io.connected().is_negotiated_h2() {
            // The server chose HTTP/1.1: hyper's pool takes over, this connection first.
            if let Ok(mut parked) = self.parked.lock() {
                *parked = Some(io);
            }
            self.state().http2 = Some(false);
            return Ok(Route::Http1);
        }
        let timings = self.timings;
        let handshake = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .initial_max_send_streams(ASSUMED_STREAMS)
            .keep_alive_interval(timings.ping_interval)
            .keep_alive_timeout(timings.ping_timeout)
            .keep_alive_while_idle(true)
            .initial_connection_window_size(H2_CONNECTION_WINDOW)
            .initial_stream_window_size(H2_STREAM_WINDOW)
            .handshake::<_, Body>(io);
        let (sender, mut connection) = tokio::time::timeout(DIAL_TIMEOUT, handshake)
            .await
            .map_err(|_| {
                format!("no HTTP/2 handshake with the API server within {DIAL_TIMEOUT:?}")
            })??;
        let cap = Arc::new(AtomicUsize::new(ASSUMED_STREAMS));
        let closed = Arc::new(AtomicBool::new(false));
        let (seen_cap, seen_closed) = (cap.clone(), closed.clone());
        tokio::spawn(async move {
            let ended = std::future::poll_fn(|cx| {
                let polled = Pin::new(&mut connection).poll(cx);
                seen_cap.store(connection.current_max_send_streams(), Ordering::Release);
                polled
            })
            .await;
            seen_closed.store(true, Ordering::Release);
            if let Err(error) = ended {
                tracing::debug!(%error, "HTTP/2 connection to the API server ended");
            }
        });
        let connection = Arc::new(Connection {
            sender,
            streams: AtomicUsize::new(0),
            cap,
            closed,
            idle_since: Mutex::new(Some(Instant::now())),
        });
        let stream = Stream::take(&connection);
        let mut state = self.state();
        state.http2 = Some(true);
        state.connections.push(connection);
        tracing::debug!(
            connections = state.connections.len(),
            "opened an HTTP/2 connection to the API server"
        );
        if !state.reaping {
            state.reaping = true;
            tokio::spawn(reap(Arc::downgrade(self)));
        }
        Ok(Route::Http2(stream))
    }

    /// Drops the connections idle for [`Timings::idle`]; hyper closes a connection (GOAWAY)
    /// once its last sender is gone.
    fn close_idle(&self) {
        let idle = self.timings.idle;
        let mut state = self.state();
        state.connections.retain(|c| {
            let quiet = c.streams.load(Ordering::Acquire) == 0
                && c.idle_since
                    .lock()
                    .ok()
                    .and_then(|since| *since)
                    .is_some_and(|since| since.elapsed() >= idle);
            c.usable() && !quiet
        });
    }
}

/// Closes idle connections until the pool is dropped.
async fn reap<D: Dial>(shared: Weak<Shared<D>>) {
    let period = shared
        .upgrade()
        .map_or(Duration::from_secs(1), |s| s.timings.idle / 4)
        .max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(period).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.close_idle();
    }
}

impl<D: Dial> Service<Request<Body>> for Pool<D> {
    type Response = Response<Streamed>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Streamed>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move {
            let tls = request.uri().scheme() == Some(&http::uri::Scheme::HTTPS);
            // A request refused before it was sent (its connection closing) is tried once more.
            for _ in 0..2 {
                let route = match (tls, shared.route()) {
                    (false, _) => Route::Http1,
                    (true, Some(route)) => route,
                    (true, None) => shared.open(request.uri()).await?,
                };
                let stream = match route {
                    Route::Http1 => {
                        let answer = shared.http1.request(request).await?;
                        return Ok(answer.map(|inner| Streamed {
                            inner,
                            stream: None,
                        }));
                    }
                    Route::Http2(stream) => stream,
                };
                let mut sender = stream.connection.sender.clone();
                match sender.try_send_request(request).await {
                    Ok(answer) => {
                        return Ok(answer.map(|inner| Streamed {
                            inner,
                            stream: Some(stream),
                        }));
                    }
                    Err(mut refused) => match refused.take_message() {
                        Some(unsent) => {
                            stream.connection.closed.store(true, Ordering::Release);
                            request = unsent;
                        }
                        None => return Err(refused.into_error().into()),
                    },
                }
            }
            Err("the API server's connections closed before the request could be sent".into())
        })
    }
}
