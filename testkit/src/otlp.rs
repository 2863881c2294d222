//! An OpenTelemetry collector for tests: OTLP over gRPC and over HTTP (protobuf) on 127.0.0.1,
//! keeping every span it receives with its service, so that tests assert what a binary
//! exported. It can also stall, answering nothing, as a collector that hangs does.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
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
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

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

#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    requests: Mutex<u64>,
    /// While set, requests are held unanswered.
    stalled: AtomicBool,
}

impl Shared {
    fn take(&self, request: ExportTraceServiceRequest) {
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
        self.shared.take(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Listens on two free ports of 127.0.0.1: OTLP/gRPC and OTLP/HTTP.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_on(0, 0).await
    }

    /// Listens on 127.0.0.1's `grpc_port` (OTLP/gRPC) and `http_port` (OTLP/HTTP); 0 picks a
    /// free one.
    pub async fn start_on(grpc_port: u16, http_port: u16) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let stop = CancellationToken::new();
        let (stalled_tx, stalled_rx) = watch::channel(false);

        let grpc_listener = TcpListener::bind(("127.0.0.1", grpc_port)).await?;
        let grpc = grpc_listener.local_addr()?;
        let service = TraceServiceServer::new(Grpc {
            shared: shared.clone(),
            stalled: stalled_rx.clone(),
        });
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(grpc_listener);
        let grpc_stop = stop.clone();
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, grpc_stop.cancelled())
                .await;
        });

        let http_listener = TcpListener::bind(("127.0.0.1", http_port)).await?;
        let http = http_listener.local_addr()?;
        let http_shared = shared.clone();
        let http_stop = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = http_stop.cancelled() => return,
                    accepted = http_listener.accept() => accepted,
                };
                let Ok((stream, _)) = accepted else { continue };
                let shared = http_shared.clone();
                let stalled = stalled_rx.clone();
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let shared = shared.clone();
                            let mut stalled = stalled.clone();
                            async move {
                                let _ = stalled.wait_for(|stalled| !stalled).await;
                                let status = if request.uri().path() != "/v1/traces" {
                                    http::StatusCode::NOT_FOUND
                                } else {
                                    match Limited::new(request.into_body(), MAX_BODY)
                                        .collect()
                                        .await
                                    {
                                        Ok(body) => {
                                            match ExportTraceServiceRequest::decode(body.to_bytes())
                                            {
                                                Ok(export) => {
                                                    shared.take(export);
                                                    http::StatusCode::OK
                                                }
                                                Err(_) => http::StatusCode::BAD_REQUEST,
                                            }
                                        }
                                        Err(_) => http::StatusCode::PAYLOAD_TOO_LARGE,
                                    }
                                };
                                let body = Full::new(Bytes::from(
                                    ExportTraceServiceResponse::default().encode_to_vec(),
                                ));
                                http::Response::builder()
                                    .status(status)
                                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                                    .body(body)
                            }
                        });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            shared,
            grpc,
            http,
            stop,
            stalled_tx,
        })
    }

    /// `http://127.0.0.1:PORT` of the gRPC receiver.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// `host:port` of the gRPC receiver, as kube-apiserver's tracing file names it.
    pub fn grpc_address(&self) -> String {
        self.grpc.to_string()
    }

    /// `http://127.0.0.1:PORT` of the HTTP receiver (spans are posted to `/v1/traces`).
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http)
    }

    /// Holds every request unanswered (`true`) or answers again.
    pub fn stall(&self, stalled: bool) {
        self.shared.stalled.store(stalled, Ordering::Relaxed);
        self.stalled_tx.send_replace(stalled);
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Export requests received so far.
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
