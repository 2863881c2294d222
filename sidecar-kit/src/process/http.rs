//! The sidecars' HTTP endpoint: metrics and health checks on one small hyper server, bounded in
//! connections, time and memory (see [`Limits`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cluster::leader::LeaderHealth;
use crate::process::flags::HttpFlags;
use crate::process::metrics::CsiMetrics;

/// A plain-text answer of a handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn text(status: StatusCode, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn ok() -> Self {
        Self::text(StatusCode::OK, "ok")
    }
}

type BoxReply = Pin<Box<dyn Future<Output = Reply> + Send>>;
type Handler = Arc<dyn Fn() -> BoxReply + Send + Sync>;

/// A health check of [`Routes::health_checks`].
pub type Check = Handler;

/// The path of the health checks.
pub const HEALTH_PATH: &str = "/healthz";

/// A health check from an async function.
pub fn check<F, Fut>(answer: F) -> Check
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Reply> + Send + 'static,
{
    Arc::new(move || Box::pin(answer()) as BoxReply)
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("only one of --http-endpoint and --metrics-address can be set")]
    BothEndpoints,
    #[error("invalid listen address {address:?}: {reason}")]
    Address { address: String, reason: String },
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
}

/// Routes of one HTTP server, by exact path.
#[derive(Clone, Default)]
pub struct Routes {
    handlers: BTreeMap<String, Handler>,
}

impl Routes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `handler`'s reply on GET `path`.
    pub fn route<F, Fut>(mut self, path: &str, handler: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Reply> + Send + 'static,
    {
        self.handlers.insert(
            path.to_string(),
            Arc::new(move || Box::pin(handler()) as BoxReply),
        );
        self
    }

    /// Serves the registry of `metrics` on `path` in the Prometheus text format.
    pub fn metrics(self, path: &str, metrics: CsiMetrics) -> Self {
        self.route(path, move || {
            let metrics = metrics.clone();
            async move {
                match metrics.render() {
                    Ok(text) => Reply {
                        status: StatusCode::OK,
                        content_type: "text/plain; version=0.0.4; charset=utf-8",
                        body: text,
                    },
                    Err(err) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, err.to_string()),
                }
            }
        })
    }

    /// Serves each named check at `/healthz/<name>`, and all of them at `/healthz`: 200 when
    /// every one passes, else the first failure's status, with a line per check.
    pub fn health_checks(mut self, checks: Vec<(&'static str, Check)>) -> Self {
        if checks.is_empty() {
            return self;
        }
        for (name, check) in &checks {
            self.handlers
                .insert(format!("{HEALTH_PATH}/{name}"), check.clone());
        }
        let checks: Arc<[(&'static str, Check)]> = checks.into();
        self.route(HEALTH_PATH, move || {
            let checks = checks.clone();
            async move {
                let mut status = StatusCode::OK;
                let mut body = String::new();
                for (name, check) in checks.iter() {
                    let reply = check().await;
                    if status == StatusCode::OK && reply.status != StatusCode::OK {
                        status = reply.status;
                    }
                    body.push_str(&format!("{name}: {}\n", reply.body.trim_end()));
                }
                Reply::text(status, body)
            }
        })
    }

    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let reply = match (request.method(), self.handlers.get(request.uri().path())) {
            (&Method::GET | &Method::HEAD, Some(handler)) => handler().await,
            (_, Some(_)) => Reply::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
            (_, None) => Reply::text(StatusCode::NOT_FOUND, "404 page not found"),
        };
        let mut response = Response::new(Full::new(Bytes::from(reply.body)));
        *response.status_mut() = reply.status;
        if let Ok(value) = http::HeaderValue::from_str(reply.content_type) {
            response
                .headers_mut()
                .insert(http::header::CONTENT_TYPE, value);
        }
        response
    }
}

/// Turns a Go listen address (`:8080`, `host:port`, `[::1]:80`) into something to bind.
/// An empty host means all interfaces, as Go's `net.Listen` does.
pub fn listen_target(address: &str) -> Result<String, HttpError> {
    let bad = |reason: &str| HttpError::Address {
        address: address.to_string(),
        reason: reason.to_string(),
    };
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| bad("missing port"))?;
    port.parse::<u16>()
        .map_err(|_| bad("port must be a number from 0 to 65535"))?;
    if host.is_empty() {
        Ok(format!("[::]:{port}"))
    } else {
        Ok(address.to_string())
    }
}

/// The bounds of the HTTP endpoint: anybody who can reach the port (any pod, in most clusters)
/// can open connections, and none of them may cost the sidecar more than a few KiB or keep a
/// slot for long. The kubelet's probes and Prometheus send one small request and read a small
/// answer at once; nothing else is served.
#[derive(Clone, Copy, Debug)]
struct Limits {
    /// Connections open at once: room for a burst of a hundred probes at once. A new one beyond
    /// it closes an old one (see [`OpenConnections::admit`]), so that a probe is served however
    /// many connections someone else holds.
    connections: usize,
    /// Time to send a request's header, from the connection's start or from the end of the
    /// previous answer: the bound of a slow sender and of an idle kept-alive connection alike.
    header_read: Duration,
    /// The most a request's header may take, which is also the most buffered per connection
    /// while reading it (hyper's smallest buffer); a larger one is answered 431 and closed.
    request_bytes: usize,
    /// The longest a connection is kept, whatever it does (a client that reads its answer too
    /// slowly).
    lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 128,
            header_read: Duration::from_secs(10),
            request_bytes: 8 * 1024,
            lifetime: Duration::from_secs(60),
        }
    }
}

/// Header fields a request may have (a probe sends about five).
const MAX_HEADERS: usize = 32;

/// The connections being served, oldest first, each with the token that closes it and whether
/// it has sent a whole request yet.
#[derive(Default)]
struct OpenConnections {
    next: u64,
    open: BTreeMap<u64, (CancellationToken, Arc<AtomicBool>)>,
}

impl OpenConnections {
    /// Makes room for a new connection and registers it; its id, the token that closes it and
    /// the flag that it has sent a request. Beyond `limit`, the oldest connection that has not
    /// sent a whole request yet is closed (else the oldest of all): a client that asks and
    /// reads, as the kubelet and Prometheus do, keeps its slot.
    fn admit(
        &mut self,
        limit: usize,
        shutdown: &CancellationToken,
    ) -> (u64, CancellationToken, Arc<AtomicBool>) {
        while self.open.len() >= limit.max(1) {
            let silent = self
                .open
                .iter()
                .find(|(_, (_, asked))| !asked.load(Ordering::Relaxed))
                .map(|(id, _)| *id);
            let oldest = silent.or_else(|| self.open.keys().next().copied());
            if let Some((close, _)) = oldest.and_then(|id| self.open.remove(&id)) {
                tracing::debug!("HTTP connection limit reached; closing the oldest connection");
                close.cancel();
            }
        }
        let id = self.next;
        self.next += 1;
        let close = shutdown.child_token();
        let asked = Arc::new(AtomicBool::new(false));
        self.open.insert(id, (close.clone(), asked.clone()));
        (id, close, asked)
    }

    fn leave(&mut self, id: u64) {
        self.open.remove(&id);
    }
}

fn lock(open: &Mutex<OpenConnections>) -> std::sync::MutexGuard<'_, OpenConnections> {
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A server bound to its address, ready to serve.
pub struct HttpServer {
    listener: TcpListener,
    routes: Arc<Routes>,
}

impl HttpServer {
    /// Binds `address` (Go syntax). All-interfaces falls back to IPv4 where IPv6 is absent.
    pub async fn bind(address: &str, routes: Routes) -> Result<Self, HttpError> {
        let target = listen_target(address)?;
        let listener = match TcpListener::bind(&target).await {
            Ok(listener) => listener,
            Err(_) if target.starts_with("[::]:") => {
                let v4 = target.replacen("[::]", "0.0.0.0", 1);
                TcpListener::bind(&v4)
                    .await
                    .map_err(|source| HttpError::Listen {
                        address: address.to_string(),
                        source,
                    })?
            }
            Err(source) => {
                return Err(HttpError::Listen {
                    address: address.to_string(),
                    source,
                });
            }
        };
        Ok(Self {
            listener,
            routes: Arc::new(routes),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` is cancelled, within [`Limits`].
    pub async fn serve(self, shutdown: CancellationToken) {
        self.serve_within(Limits::default(), shutdown).await;
    }

    async fn serve_within(self, limits: Limits, shutdown: CancellationToken) {
        let open = Arc::new(Mutex::new(OpenConnections::default()));
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = self.listener.accept() => accepted,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "HTTP accept failed");
                    continue;
                }
            };
            let (id, close, asked) = lock(&open).admit(limits.connections, &shutdown);
            let routes = self.routes.clone();
            let open = open.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    asked.store(true, Ordering::Relaxed);
                    let routes = routes.clone();
                    async move { Ok::<_, Infallible>(routes.answer(request).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(limits.header_read)
                    .max_buf_size(limits.request_bytes)
                    .max_headers(MAX_HEADERS)
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = connection => {}
                    _ = close.cancelled() => {}
                    _ = tokio::time::sleep(limits.lifetime) => {}
                }
                lock(&open).leave(id);
            });
        }
    }

    /// Binds and serves in a background task; returns the bound address.
    pub async fn spawn(
        address: &str,
        routes: Routes,
        shutdown: CancellationToken,
    ) -> Result<SocketAddr, HttpError> {
        let server = Self::bind(address, routes).await?;
        let local = server.local_addr().map_err(|source| HttpError::Listen {
            address: address.to_string(),
            source,
        })?;
        tracing::info!(address = %local, "serving HTTP");
        tokio::spawn(server.serve(shutdown));
        Ok(local)
    }
}

/// Where the controller sidecars serve what, from `--http-endpoint` and `--metrics-address`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpPlan {
    /// No HTTP server.
    Disabled,
    /// `--http-endpoint`: metrics and health checks.
    Full(String),
    /// `--metrics-address` (deprecated): metrics only.
    MetricsOnly(String),
}

/// Path of the leader election health check of the controller sidecars.
pub const LEADER_HEALTH_PATH: &str = "/healthz/leader-election";

impl HttpPlan {
    /// Serves the controller sidecars' endpoint: metrics at `metrics_path`; on the full endpoint
    /// (`--http-endpoint`) also the leader health check of every election given and the routes
    /// `extra` adds. Returns once listening.
    pub async fn serve(
        &self,
        metrics_path: &str,
        metrics: &CsiMetrics,
        leader: Vec<LeaderHealth>,
        extra: impl FnOnce(Routes) -> Routes,
        shutdown: &CancellationToken,
    ) -> Result<(), HttpError> {
        let routes = Routes::new().metrics(metrics_path, metrics.clone());
        let (address, routes) = match self {
            Self::Disabled => return Ok(()),
            Self::MetricsOnly(address) => (address, routes),
            Self::Full(address) => {
                let mut routes = extra(routes);
                if !leader.is_empty() {
                    routes = routes.route(LEADER_HEALTH_PATH, move || {
                        let reply = LeaderHealth::check_all(&leader);
                        async move { reply }
                    });
                }
                (address, routes)
            }
        };
        HttpServer::spawn(address, routes, shutdown.clone()).await?;
        Ok(())
    }

    pub fn from_flags(flags: &HttpFlags) -> Result<Self, HttpError> {
        match (flags.http_endpoint.as_str(), flags.metrics_address.as_str()) {
            ("", "") => Ok(Self::Disabled),
            (endpoint, "") => Ok(Self::Full(endpoint.to_string())),
            ("", metrics) => {
                tracing::warn!("--metrics-address is deprecated; use --http-endpoint");
                Ok(Self::MetricsOnly(metrics.to_string()))
            }
            _ => Err(HttpError::BothEndpoints),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// A server on 127.0.0.1 with `limits`, answering `ok` on `/healthz`.
    async fn serve(limits: Limits) -> (SocketAddr, CancellationToken) {
        let routes = Routes::new().route(HEALTH_PATH, || async { Reply::ok() });
        let server = HttpServer::bind("127.0.0.1:0", routes).await.unwrap();
        let address = server.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(server.serve_within(limits, shutdown.clone()));
        (address, shutdown)
    }

    fn quick() -> Limits {
        Limits {
            connections: 4,
            header_read: Duration::from_millis(300),
            request_bytes: 8 * 1024,
            lifetime: Duration::from_secs(5),
        }
    }

    /// Reads until the server closes the connection; what it sent, or `None` if it was still
    /// open after `wait`.
    async fn until_closed(stream: &mut TcpStream, wait: Duration) -> Option<String> {
        let mut seen = Vec::new();
        let read = tokio::time::timeout(wait, async {
            let mut buffer = [0u8; 1024];
            loop {
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buffer[..n]),
                }
            }
        });
        read.await.ok()?;
        Some(String::from_utf8_lossy(&seen).into_owned())
    }

    async fn healthz(address: SocketAddr) -> String {
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        until_closed(&mut stream, Duration::from_secs(5))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_request_header_sent_too_slowly_closes_the_connection() {
        let (address, _shutdown) = serve(quick()).await;
        let mut slow = TcpStream::connect(address).await.unwrap();
        slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let seen = until_closed(&mut slow, Duration::from_secs(5)).await;
        assert!(seen.is_some(), "still open");
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert!(healthz(address).await.starts_with("HTTP/1.1 200"));
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed() {
        let (address, _shutdown) = serve(quick()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let seen = until_closed(&mut stream, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    }

    #[tokio::test]
    async fn a_request_header_past_the_limit_is_refused() {
        let (address, _shutdown) = serve(quick()).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        let padding = "a".repeat(64 * 1024);
        let request = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {padding}\r\n\r\n");
        // The server may close before everything is written.
        let _ = stream.write_all(request.as_bytes()).await;
        let seen = until_closed(&mut stream, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(seen.starts_with("HTTP/1.1 431"), "{seen}");
    }

    #[tokio::test]
    async fn past_the_connection_limit_a_silent_connection_makes_room_for_a_probe() {
        let limits = Limits {
            header_read: Duration::from_secs(30),
            ..quick()
        };
        let (address, _shutdown) = serve(limits).await;
        // The oldest connection asked and read its answer, and is kept alive.
        let mut client = TcpStream::connect(address).await.unwrap();
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = [0u8; 12];
        client.read_exact(&mut answer).await.unwrap();
        // The others never finish a request.
        let mut silent = Vec::new();
        for _ in 1..limits.connections {
            let mut stream = TcpStream::connect(address).await.unwrap();
            stream.write_all(b"GET /").await.unwrap();
            silent.push(stream);
        }
        assert!(healthz(address).await.starts_with("HTTP/1.1 200"));
        // The oldest silent connection made room; the client and the newer ones are open.
        let first = until_closed(&mut silent[0], Duration::from_secs(5)).await;
        assert_eq!(first.as_deref(), Some(""));
        for stream in [&mut client, &mut silent[limits.connections - 2]] {
            let open = until_closed(stream, Duration::from_millis(200)).await;
            assert_eq!(open, None, "closed");
        }
    }

    #[tokio::test]
    async fn no_connection_outlives_its_lifetime() {
        let limits = Limits {
            header_read: Duration::from_secs(30),
            lifetime: Duration::from_millis(300),
            ..quick()
        };
        let (address, _shutdown) = serve(limits).await;
        let mut stream = TcpStream::connect(address).await.unwrap();
        stream.write_all(b"GET /").await.unwrap();
        assert!(
            until_closed(&mut stream, Duration::from_secs(5))
                .await
                .is_some()
        );
    }

    #[test]
    fn listen_targets() {
        assert_eq!(listen_target(":8080").unwrap(), "[::]:8080");
        assert_eq!(listen_target("127.0.0.1:0").unwrap(), "127.0.0.1:0");
        assert_eq!(listen_target("[::1]:9808").unwrap(), "[::1]:9808");
        assert!(listen_target("8080").is_err());
        assert!(listen_target(":http").is_err());
        assert!(listen_target(":70000").is_err());
    }

    #[test]
    fn plan_from_flags() {
        let flags = |h: &str, m: &str| HttpFlags {
            http_endpoint: h.into(),
            metrics_address: m.into(),
            metrics_path: "/metrics".into(),
        };
        assert_eq!(
            HttpPlan::from_flags(&flags("", "")).unwrap(),
            HttpPlan::Disabled
        );
        assert_eq!(
            HttpPlan::from_flags(&flags(":8080", "")).unwrap(),
            HttpPlan::Full(":8080".into())
        );
        assert_eq!(
            HttpPlan::from_flags(&flags("", ":8081")).unwrap(),
            HttpPlan::MetricsOnly(":8081".into())
        );
        assert!(matches!(
            HttpPlan::from_flags(&flags(":8080", ":8081")),
            Err(HttpError::BothEndpoints)
        ));
    }
}
