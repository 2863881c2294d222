//! An OpenTelemetry collector for tests: OTLP over gRPC and over HTTP (protobuf) on 127.0.0.1,
//! keeping every span it receives with its service, so that tests assert what a binary
//! exported. It can serve TLS (asking for a client certificate), require a header, take gzip
//! bodies, and misbehave as collectors do: stall, answer UNAVAILABLE for a while, or refuse
//! part of a request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;

/// Largest export request accepted over HTTP.
const MAX_BODY: usize = 16 << 20;

/// One received span, its ids in hex as W3C `traceparent` writes them.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    /// The `service.name` of its resource.
    pub service: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's span kind: 2 server, 3 client, 1 internal.
    pub kind: i32,
    /// Attributes rendered as strings.
    pub attributes: BTreeMap<String, String>,
    pub start_unix_nano: u64,
    pub end_unix_nano: u64,
    /// OTLP's status code: 0 unset, 1 ok, 2 error.
    pub status_code: i32,
    /// Its events (log lines written inside it), each its name and attributes rendered.
    pub events: Vec<String>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_unix_nano.saturating_sub(self.start_unix_nano))
    }
}

/// How the collector listens, fixed when it starts.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub tls: Option<ServerTls>,
    /// A header every export must carry, name and value: without it the collector answers
    /// UNAUTHENTICATED (gRPC) or 401 (HTTP).
    pub required_header: Option<(String, String)>,
}

/// TLS on both receivers.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// The server's certificate chain and key, PEM.
    pub cert: String,
    pub key: String,
    /// With a CA (PEM), a client certificate it signed is required.
    pub client_ca: Option<String>,
}

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    requests: Mutex<u64>,
    /// While set, requests are held unanswered.
    stalled: AtomicBool,
    /// Every export request that reached a receiver, answered or not.
    attempts: AtomicU64,
    /// Requests to answer UNAVAILABLE (gRPC) or 503 (HTTP) before taking any again.
    failing: AtomicU64,
    /// Spans of each request taken to refuse in its `partial_success`.
    rejecting: AtomicU64,
    /// Requests whose body came gzip-compressed.
    compressed: AtomicU64,
    /// Requests refused for a missing or wrong header.
    unauthenticated: AtomicU64,
    required_header: Option<(String, String)>,
}

/// What the collector does with an export request.
enum Verdict {
    Take,
    Unauthenticated,
    Unavailable,
}

impl Shared {
    fn judge(&self, header: Option<&[u8]>) -> Verdict {
        self.attempts.fetch_add(1, Ordering::Relaxed);
        if let Some((_, value)) = &self.required_header
            && header != Some(value.as_bytes())
        {
            self.unauthenticated.fetch_add(1, Ordering::Relaxed);
            return Verdict::Unauthenticated;
        }
        let failing = self
            .failing
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        if failing.is_ok() {
            return Verdict::Unavailable;
        }
        Verdict::Take
    }

    /// Keeps the spans of `request`; the answer, with the spans refused if asked to.
    fn take(&self, request: ExportTraceServiceRequest) -> ExportTraceServiceResponse {
        let total: usize = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .map(|s| s.spans.len())
            .sum();
        let rejected = self.rejecting.load(Ordering::Relaxed).min(total as u64);
        let mut keep = total - rejected as usize;
        *self.requests.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        let mut spans = self.spans.lock().unwrap_or_else(PoisonError::into_inner);
        for resource_spans in request.resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref())
                .and_then(|v| v.value.as_ref())
                .map(render)
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    if keep == 0 {
                        break;
                    }
                    keep -= 1;
                    spans.push(ReceivedSpan {
                        service: service.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name,
                        kind: span.kind,
                        attributes: span
                            .attributes
                            .iter()
                            .filter_map(|kv| {
                                let value = kv.value.as_ref()?.value.as_ref()?;
                                Some((kv.key.clone(), render(value)))
                            })
                            .collect(),
                        start_unix_nano: span.start_time_unix_nano,
                        end_unix_nano: span.end_time_unix_nano,
                        status_code: span.status.map(|s| s.code).unwrap_or_default(),
                        events: span
                            .events
                            .iter()
                            .map(|event| {
                                let attributes: Vec<String> = event
                                    .attributes
                                    .iter()
                                    .filter_map(|kv| {
                                        let value = kv.value.as_ref()?.value.as_ref()?;
                                        Some(format!("{}={}", kv.key, render(value)))
                                    })
                                    .collect();
                                format!("{} {}", event.name, attributes.join(" "))
                            })
                            .collect(),
                    });
                }
            }
        }
        ExportTraceServiceResponse {
            partial_success: (rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: rejected as i64,
                error_message: "refused by the test collector".to_string(),
            }),
        }
    }
}

fn render(value: &Value) -> String {
    match value {
        Value::StringValue(s) => s.clone(),
        Value::BoolValue(b) => b.to_string(),
        Value::IntValue(i) => i.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The collector; stops when dropped.
pub struct Collector {
    shared: Arc<Shared>,
    grpc: SocketAddr,
    http: SocketAddr,
    tls: bool,
    stop: CancellationToken,
    stalled_tx: watch::Sender<bool>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

struct Grpc {
    shared: Arc<Shared>,
    stalled: watch::Receiver<bool>,
}

#[tonic::async_trait]
impl TraceService for Grpc {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut stalled = self.stalled.clone();
        let _ = stalled.wait_for(|stalled| !stalled).await;
        let header = self
            .shared
            .required_header
            .as_ref()
            .and_then(|(name, _)| request.metadata().get(name.as_str()))
            .map(|value| value.as_bytes().to_vec());
        if request.metadata().get("grpc-encoding").is_some() {
            self.shared.compressed.fetch_add(1, Ordering::Relaxed);
        }
        match self.shared.judge(header.as_deref()) {
            Verdict::Take => Ok(tonic::Response::new(self.shared.take(request.into_inner()))),
            Verdict::Unauthenticated => Err(tonic::Status::unauthenticated("no API key")),
            Verdict::Unavailable => Err(tonic::Status::unavailable("restarting")),
        }
    }
}

/// A connection a receiver accepted, in plain text or TLS.
trait Io: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Io for T {}

impl Collector {
    /// Listens on two free ports of 127.0.0.1: OTLP/gRPC and OTLP/HTTP.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(0, 0, Options::default()).await
    }

    /// Listens on two free ports with `options`.
    pub async fn start_with(options: Options) -> std::io::Result<Self> {
        Self::start_on(0, 0, options).await
    }

    /// Listens on 127.0.0.1's `grpc_port` (OTLP/gRPC) and `http_port` (OTLP/HTTP) with
    /// `options`; 0 picks a free port.
    pub async fn start_on(
        grpc_port: u16,
        http_port: u16,
        options: Options,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            required_header: options.required_header.clone(),
            ..Shared::default()
        });
        let stop = CancellationToken::new();
        let (stalled_tx, stalled_rx) = watch::channel(false);
        let tls = options.tls.as_ref().map(acceptor).transpose()?;

        let grpc_listener = TcpListener::bind(("127.0.0.1", grpc_port)).await?;
        let grpc = grpc_listener.local_addr()?;
        let service = TraceServiceServer::new(Grpc {
            shared: shared.clone(),
            stalled: stalled_rx.clone(),
        })
        .accept_compressed(CompressionEncoding::Gzip);
        let service = hyper_util::service::TowerToHyperService::new(service);
        tokio::spawn(serve(grpc_listener, tls.clone(), stop.clone(), move || {
            service.clone()
        }));

        let http_listener = TcpListener::bind(("127.0.0.1", http_port)).await?;
        let http = http_listener.local_addr()?;
        let http_shared = shared.clone();
        tokio::spawn(serve(http_listener, tls, stop.clone(), move || {
            let shared = http_shared.clone();
            let stalled = stalled_rx.clone();
            service_fn(move |request: http::Request<hyper::body::Incoming>| {
                let shared = shared.clone();
                let mut stalled = stalled.clone();
                async move {
                    let _ = stalled.wait_for(|stalled| !stalled).await;
                    http_export(&shared, request).await
                }
            })
        }));
        Ok(Self {
            shared,
            grpc,
            http,
            tls: options.tls.is_some(),
            stop,
            stalled_tx,
        })
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// `http://127.0.0.1:PORT` of the gRPC receiver (`https://` with TLS).
    pub fn grpc_endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.grpc)
    }

    /// `host:port` of the gRPC receiver, as kube-apiserver's tracing file names it.
    pub fn grpc_address(&self) -> String {
        self.grpc.to_string()
    }

    /// `http://127.0.0.1:PORT` of the HTTP receiver (`https://` with TLS; spans are posted to
    /// `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("{}://{}", self.scheme(), self.http)
    }

    /// Holds every request unanswered (`true`) or answers again.
    pub fn stall(&self, stalled: bool) {
        self.shared.stalled.store(stalled, Ordering::Relaxed);
        self.stalled_tx.send_replace(stalled);
    }

    /// Answers the next `requests` export requests UNAVAILABLE (gRPC) or 503 (HTTP), as a
    /// collector that is restarting does.
    pub fn fail_next(&self, requests: u64) {
        self.shared.failing.store(requests, Ordering::Relaxed);
    }

    /// Takes only part of each request from now on, refusing `spans` of its spans in the
    /// answer's `partial_success`.
    pub fn reject_spans(&self, spans: u64) {
        self.shared.rejecting.store(spans, Ordering::Relaxed);
    }

    /// Export requests that reached a receiver, whatever the answer.
    pub fn attempts(&self) -> u64 {
        self.shared.attempts.load(Ordering::Relaxed)
    }

    /// Export requests that came gzip-compressed.
    pub fn compressed_requests(&self) -> u64 {
        self.shared.compressed.load(Ordering::Relaxed)
    }

    /// Export requests refused for the header [`Options::required_header`] names.
    pub fn unauthenticated(&self) -> u64 {
        self.shared.unauthenticated.load(Ordering::Relaxed)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Export requests taken so far.
    pub fn requests(&self) -> u64 {
        *self
            .shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The spans of `trace_id`.
    pub fn trace(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        self.spans()
            .into_iter()
            .filter(|span| span.trace_id == trace_id)
            .collect()
    }

    /// Waits until `found` picks something from the spans received; `None` after `limit`.
    pub async fn wait_for<T>(
        &self,
        limit: Duration,
        mut found: impl FnMut(&[ReceivedSpan]) -> Option<T>,
    ) -> Option<T> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(value) = found(&self.spans()) {
                return Some(value);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn acceptor(tls: &ServerTls) -> std::io::Result<tokio_rustls::TlsAcceptor> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_string());
    let chain = CertificateDer::pem_slice_iter(tls.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad("the server certificate is not PEM"))?;
    let key = PrivateKeyDer::from_pem_slice(tls.key.as_bytes())
        .map_err(|_| bad("the server key is not PEM"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|_| bad("no TLS versions"))?;
    let builder = match &tls.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots
                    .add(cert.map_err(|_| bad("the client CA is not PEM"))?)
                    .map_err(|_| bad("the client CA is not a certificate"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|_| bad("no client verifier"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|_| bad("the certificate does not match its key"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serves each connection `listener` accepts with a service `make` makes, over TLS when
/// `tls` is given, until `stop`.
async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: CancellationToken,
    make: impl Fn() -> S + Send + 'static,
) where
    S: hyper::service::Service<http::Request<hyper::body::Incoming>, Response = http::Response<B>>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else { continue };
        let service = make();
        let tls = tls.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let io: Box<dyn Io> = match tls {
                None => Box::new(stream),
                Some(tls) => match tls.accept(stream).await {
                    Ok(stream) => Box::new(stream),
                    Err(_) => return,
                },
            };
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let connection = builder.serve_connection(TokioIo::new(io), service);
            tokio::select! {
                _ = connection => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// One OTLP/HTTP request: its body read (gunzipped when it says so), judged and taken.
async fn http_export(
    shared: &Shared,
    request: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, http::Error> {
    let answer = |status: http::StatusCode, body: Bytes| {
        http::Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/x-protobuf")
            .body(Full::new(body))
    };
    if request.uri().path() != "/v1/traces" {
        return answer(http::StatusCode::NOT_FOUND, Bytes::new());
    }
    let gzipped = request
        .headers()
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|value| value.as_bytes() == b"gzip");
    let header = shared
        .required_header
        .as_ref()
        .and_then(|(name, _)| request.headers().get(name.as_str()))
        .map(|value| value.as_bytes().to_vec());
    match shared.judge(header.as_deref()) {
        Verdict::Take => {}
        Verdict::Unauthenticated => return answer(http::StatusCode::UNAUTHORIZED, Bytes::new()),
        Verdict::Unavailable => {
            return http::Response::builder()
                .status(http::StatusCode::SERVICE_UNAVAILABLE)
                .header(http::header::RETRY_AFTER, "0")
                .body(Full::new(Bytes::new()));
        }
    }
    let Ok(body) = Limited::new(request.into_body(), MAX_BODY).collect().await else {
        return answer(http::StatusCode::PAYLOAD_TOO_LARGE, Bytes::new());
    };
    let mut body = body.to_bytes();
    if gzipped {
        shared.compressed.fetch_add(1, Ordering::Relaxed);
        let mut plain = Vec::new();
        let read = std::io::Read::read_to_end(
            &mut std::io::Read::take(flate2::read::GzDecoder::new(&body[..]), MAX_BODY as u64),
            &mut plain,
        );
        if read.is_err() {
            return answer(http::StatusCode::BAD_REQUEST, Bytes::new());
        }
        body = Bytes::from(plain);
    }
    match ExportTraceServiceRequest::decode(body) {
        Ok(export) => answer(
            http::StatusCode::OK,
            Bytes::from(shared.take(export).encode_to_vec()),
        ),
        Err(_) => answer(http::StatusCode::BAD_REQUEST, Bytes::new()),
    }
}

/// The trace and parent span ids of a W3C `traceparent` (`00-<trace>-<span>-<flags>`).
pub fn parse_traceparent(value: &str) -> Option<(String, String)> {
    let mut parts = value.split('-');
    let version = parts.next()?;
    let trace = parts.next()?;
    let span = parts.next()?;
    let _flags = parts.next()?;
    (version == "00" && trace.len() == 32 && span.len() == 16)
        .then(|| (trace.to_string(), span.to_string()))
}

/// Renders a trace as a waterfall: one line per span, indented under its parent, with its
/// offset from the trace's start and its duration.
pub fn waterfall(spans: &[ReceivedSpan]) -> String {
    let Some(start) = spans.iter().map(|s| s.start_unix_nano).min() else {
        return String::new();
    };
    let mut out = String::new();
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut roots: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty() || !ids.contains(s.parent_span_id.as_str()))
        .collect();
    roots.sort_by_key(|s| s.start_unix_nano);
    for root in roots {
        draw(&mut out, spans, root, start, 0);
    }
    out
}

fn draw(out: &mut String, spans: &[ReceivedSpan], span: &ReceivedSpan, start: u64, depth: usize) {
    let offset = Duration::from_nanos(span.start_unix_nano.saturating_sub(start));
    let detail = [
        "csi.volume_id",
        "csi.name",
        "rpc.grpc.status_code",
        "http.response.status_code",
        "csi.snapshot_metadata.blocks",
        "csi.sidecar.interrupted",
    ]
    .iter()
    .filter_map(|key| span.attribute(key).map(|v| format!(" {key}={v}")))
    .collect::<String>();
    out.push_str(&format!(
        "{:>9.1} ms {:>9.1} ms  {}{} [{}]{}\n",
        offset.as_secs_f64() * 1000.0,
        span.duration().as_secs_f64() * 1000.0,
        "  ".repeat(depth),
        span.name,
        span.service,
        detail
    ));
    let mut children: Vec<&ReceivedSpan> = spans
        .iter()
        .filter(|s| s.parent_span_id == span.span_id)
        .collect();
    children.sort_by_key(|s| s.start_unix_nano);
    for child in children {
        draw(out, spans, child, start, depth + 1);
    }
}
