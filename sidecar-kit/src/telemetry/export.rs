//! Sending finished spans to the collector, never in the way of the work: a span ends into a
//! bounded queue (full: dropped and counted), and a thread of its own batches and exports them,
//! each export bounded in time. Written here rather than taken from opentelemetry-otlp so that
//! drops are counted in our metrics, one request carries every controller of the all-in-one
//! process under its own service name, and the exporter shares the process's gRPC and HTTP
//! stacks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TraceId;
use opentelemetry::{Context, KeyValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::{Channel, Endpoint};

use super::config::{Protocol, TraceSettings};

/// Traces whose service is remembered for the all-in-one process (the oldest forgotten first):
/// more than the operations in flight and queued for export at once.
const REMEMBERED_TRACES: usize = 8192;
/// At most one log line per this long about failing exports.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Spans dropped, by why: `queue_full` (the collector is slower than the work) or
/// `export_failed` (the collector refused them or could not be reached in time).
#[derive(Debug, Default)]
pub struct Drops {
    pub queue_full: AtomicU64,
    pub export_failed: AtomicU64,
    pub exported: AtomicU64,
}

/// Which service each trace belongs to: in the all-in-one process every controller exports
/// under its own name, unless `OTEL_SERVICE_NAME` names them all. Bounded; a trace it forgot
/// goes out under the process's name.
#[derive(Debug)]
pub struct Services {
    default: String,
    /// The name was given (`OTEL_SERVICE_NAME`): it is every span's.
    given: bool,
    known: Mutex<Remembered>,
}

/// Each remembered trace's service, and the traces in the order they were remembered.
type Remembered = (HashMap<TraceId, Arc<str>>, VecDeque<TraceId>);

impl Services {
    pub fn new(default: String, given: bool) -> Self {
        Self {
            default,
            given,
            known: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    pub fn remember(&self, trace: TraceId, service: Arc<str>) {
        if self.given {
            return;
        }
        let Ok(mut known) = self.known.lock() else {
            return;
        };
        let (map, order) = &mut *known;
        if map.insert(trace, service).is_none() {
            order.push_back(trace);
            if order.len() > REMEMBERED_TRACES
                && let Some(old) = order.pop_front()
            {
                map.remove(&old);
            }
        }
    }

    /// Forgets `trace` (a pass that made no trace): its place goes to the traces exported.
    pub fn forget(&self, trace: TraceId) {
        if let Ok(mut known) = self.known.lock() {
            let (map, order) = &mut *known;
            // Just remembered: near the back.
            if map.remove(&trace).is_some()
                && let Some(at) = order.iter().rposition(|t| *t == trace)
            {
                order.remove(at);
            }
        }
    }

    fn of(&self, trace: TraceId) -> String {
        self.known
            .lock()
            .ok()
            .and_then(|known| known.0.get(&trace).map(|s| s.to_string()))
            .unwrap_or_else(|| self.default.clone())
    }
}

/// The span processor the tracer provider calls: hands each finished span to the queue.
#[derive(Debug)]
pub struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    drops: Arc<Drops>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if span.parent_span_id == opentelemetry::trace::SpanId::INVALID
            && span
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == super::operation::IDLE)
        {
            return;
        }
        if self.queue.try_send(span).is_err() {
            self.drops.queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Asks the export thread to send what it holds; [`Flusher::flush`] waits for it, bounded.
#[derive(Clone, Debug)]
pub struct Flusher {
    requests: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

impl Flusher {
    /// Sends every queued span, waiting at most `timeout`; false when it did not finish.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (done, finished) = oneshot::channel();
        if self.requests.send(done).is_err() {
            return false;
        }
        let deadline = Instant::now() + timeout;
        let mut finished = finished;
        loop {
            match finished.try_recv() {
                Ok(()) => return true,
                Err(oneshot::error::TryRecvError::Closed) => return false,
                Err(oneshot::error::TryRecvError::Empty) if Instant::now() >= deadline => {
                    return false;
                }
                Err(oneshot::error::TryRecvError::Empty) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
            }
        }
    }
}

/// Starts the export thread for `settings`.
pub fn start(
    settings: &TraceSettings,
    services: Arc<Services>,
    drops: Arc<Drops>,
) -> std::io::Result<(QueueProcessor, Flusher)> {
    let (queue, spans) = mpsc::channel(settings.batching.max_queue);
    let (requests, flushes) = mpsc::unbounded_channel();
    let settings = settings.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread_drops = drops.clone();
    std::thread::Builder::new()
        .name("span-export".to_string())
        .spawn(move || {
            runtime.block_on(async move {
                let sender = Sender::new(&settings);
                Batcher {
                    settings,
                    sender,
                    services,
                    drops: thread_drops,
                    last_failure_log: None,
                    failures_unlogged: 0,
                }
                .run(spans, flushes)
                .await
            })
        })?;
    Ok((QueueProcessor { queue, drops }, Flusher { requests }))
}

enum Sender {
    Grpc(TraceServiceClient<Channel>),
    Http {
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        url: http::Uri,
        /// `OTEL_EXPORTER_OTLP_TIMEOUT`, for the whole exchange: connecting, sending the
        /// batch and reading the answer.
        timeout: Duration,
    },
}

impl Sender {
    fn new(settings: &TraceSettings) -> Self {
        match settings.protocol {
            Protocol::Grpc => {
                let endpoint = Endpoint::from(settings.endpoint.clone())
                    .connect_timeout(settings.export_timeout)
                    .timeout(settings.export_timeout);
                Sender::Grpc(TraceServiceClient::new(endpoint.connect_lazy()))
            }
            Protocol::HttpProtobuf => {
                let mut connector = HttpConnector::new();
                connector.set_connect_timeout(Some(settings.export_timeout));
                connector.set_nodelay(true);
                Sender::Http {
                    client: Box::new(Client::builder(TokioExecutor::new()).build(connector)),
                    url: settings.endpoint.clone(),
                    timeout: settings.export_timeout,
                }
            }
        }
    }

    async fn send(&mut self, request: ExportTraceServiceRequest) -> Result<(), String> {
        match self {
            Sender::Grpc(client) => client
                .export(request)
                .await
                .map(|_| ())
                .map_err(|status| format!("{:?}: {}", status.code(), status.message())),
            Sender::Http {
                client,
                url,
                timeout,
            } => {
                let body = Full::new(Bytes::from(request.encode_to_vec()));
                let post = http::Request::post(url.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(body)
                    .map_err(|err| err.to_string())?;
                let exchange = async {
                    let answer = client.request(post).await.map_err(|err| err.to_string())?;
                    let status = answer.status();
                    // Read (and bound) the answer so that the connection is reused.
                    let _ = http_body_util::Limited::new(answer.into_body(), 64 << 10)
                        .collect()
                        .await;
                    if status.is_success() {
                        Ok(())
                    } else {
                        Err(format!("HTTP {status}"))
                    }
                };
                tokio::time::timeout(*timeout, exchange)
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "no answer in {timeout:?} (OTEL_EXPORTER_OTLP_TIMEOUT)"
                        ))
                    })
            }
        }
    }
}

struct Batcher {
    settings: TraceSettings,
    sender: Sender,
    services: Arc<Services>,
    drops: Arc<Drops>,
    last_failure_log: Option<Instant>,
    failures_unlogged: u64,
}

impl Batcher {
    async fn run(
        mut self,
        mut spans: mpsc::Receiver<SpanData>,
        mut flushes: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    ) {
        let max = self.settings.batching.max_batch;
        let mut batch = Vec::with_capacity(max);
        let mut due = tokio::time::Instant::now() + self.settings.batching.delay;
        loop {
            let room = max - batch.len();
            tokio::select! {
                received = spans.recv_many(&mut batch, room) => {
                    if received == 0 {
                        self.export(std::mem::take(&mut batch)).await;
                        return;
                    }
                    if batch.len() < max {
                        continue;
                    }
                }
                _ = tokio::time::sleep_until(due) => {}
                Some(done) = flushes.recv() => {
                    while let Ok(span) = spans.try_recv() {
                        batch.push(span);
                        if batch.len() == max {
                            self.export(std::mem::replace(&mut batch, Vec::with_capacity(max))).await;
                        }
                    }
                    self.export(std::mem::take(&mut batch)).await;
                    let _ = done.send(());
                }
            }
            if !batch.is_empty() {
                self.export(std::mem::replace(&mut batch, Vec::with_capacity(max)))
                    .await;
            }
            due = tokio::time::Instant::now() + self.settings.batching.delay;
        }
    }

    async fn export(&mut self, batch: Vec<SpanData>) {
        if batch.is_empty() {
            return;
        }
        let count = batch.len() as u64;
        let request = self.request(batch);
        let outcome =
            match tokio::time::timeout(self.settings.batching.timeout, self.sender.send(request))
                .await
            {
                Ok(outcome) => outcome,
                Err(_) => Err(format!("no answer in {:?}", self.settings.batching.timeout)),
            };
        match outcome {
            Ok(()) => {
                tracing::debug!(spans = count, "spans exported");
                self.drops.exported.fetch_add(count, Ordering::Relaxed);
            }
            Err(reason) => {
                self.drops.export_failed.fetch_add(count, Ordering::Relaxed);
                self.failures_unlogged += count;
                let quiet = self
                    .last_failure_log
                    .is_some_and(|at| at.elapsed() < FAILURE_LOG_EVERY);
                if !quiet {
                    tracing::warn!(
                        endpoint = %self.settings.endpoint,
                        spans = self.failures_unlogged,
                        error = %reason,
                        "cannot export spans; they are dropped"
                    );
                    self.last_failure_log = Some(Instant::now());
                    self.failures_unlogged = 0;
                }
            }
        }
    }

    /// One request for the batch, a resource per service.
    fn request(&self, batch: Vec<SpanData>) -> ExportTraceServiceRequest {
        let mut by_service: Vec<(String, Vec<SpanData>)> = Vec::new();
        for span in batch {
            let service = self.services.of(span.span_context.trace_id());
            match by_service.iter_mut().find(|(name, _)| *name == service) {
                Some((_, spans)) => spans.push(span),
                None => by_service.push((service, vec![span])),
            }
        }
        let resource_spans = by_service
            .into_iter()
            .flat_map(|(service, spans)| {
                let resource = self.resource(service);
                group_spans_by_resource_and_scope(
                    spans,
                    &ResourceAttributesWithSchema::from(&resource),
                )
            })
            .collect();
        ExportTraceServiceRequest { resource_spans }
    }

    fn resource(&self, service: String) -> Resource {
        let attributes = self
            .settings
            .resource
            .iter()
            .map(|(key, value)| KeyValue::new(key.clone(), value.clone()))
            .chain([
                KeyValue::new("service.name", service),
                KeyValue::new("service.version", crate::VERSION),
            ]);
        Resource::builder_empty()
            .with_attributes(attributes)
            .build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collector that takes the connection and the request and never answers holds one
    /// export for `OTEL_EXPORTER_OTLP_TIMEOUT`, not for the batch's whole timeout.
    #[tokio::test]
    async fn the_http_timeout_bounds_the_whole_export() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                held.push(connection);
            }
        });
        let endpoint = format!("http://127.0.0.1:{port}");
        let settings = crate::telemetry::config::resolve(None, |name| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
            "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("300".to_string()),
            _ => None,
        })
        .unwrap()
        .unwrap();
        let mut sender = Sender::new(&settings);
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(
            Duration::from_secs(5),
            sender.send(ExportTraceServiceRequest::default()),
        )
        .await
        .expect("the export bounded by OTEL_EXPORTER_OTLP_TIMEOUT");
        let took = started.elapsed();
        assert!(outcome.unwrap_err().contains("no answer"), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
        silent.abort();
    }
}
