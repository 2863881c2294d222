//! Sending finished spans to the collector, never in the way of the work: a span ends into a
//! bounded queue (full: dropped and counted), and a thread of its own batches and exports them,
//! each export bounded in time. Written here rather than taken from opentelemetry-otlp so that
//! drops are counted in our metrics, one request carries every controller of the all-in-one
//! process under its own service name, and the exporter shares the process's gRPC and HTTP
//! stacks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::trace::TraceId;
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope as ProtoScope;
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as ProtoSpan};
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanProcessor};
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use super::config::TraceSettings;
use super::held::Held;
use super::transport::{Attempt, Sender, TransportError};

/// Traces whose service is remembered for the all-in-one process (the oldest forgotten first):
/// more than the operations in flight and queued for export at once.
const REMEMBERED_TRACES: usize = 8192;
/// At most one log line per this long about failing exports.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);

/// What became of finished spans, and how often an export was tried again.
#[derive(Debug, Default)]
pub struct Drops {
    pub exported: AtomicU64,
    /// The collector is slower than the work: the queue was full.
    pub queue_full: AtomicU64,
    /// The collector could not be reached in time, or refused the request.
    pub export_failed: AtomicU64,
    /// The collector took the request but not these spans (`partial_success`).
    pub rejected: AtomicU64,
    /// Larger alone than an export request may be.
    pub too_large: AtomicU64,
    /// Export attempts after the first of their batch.
    pub retries: AtomicU64,
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

/// The span processor the tracer provider calls: hands each finished span to the queue once
/// its trace's local root has ended (see [`Held`]).
#[derive(Clone, Debug)]
pub struct QueueProcessor {
    queue: mpsc::Sender<SpanData>,
    drops: Arc<Drops>,
    held: Arc<Mutex<Held>>,
}

impl QueueProcessor {
    fn enqueue(&self, spans: Vec<SpanData>) {
        for span in spans {
            if self.queue.try_send(span).is_err() {
                self.drops.queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() || super::operation::substituted(&span.span_context) {
            return;
        }
        self.accept(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

impl QueueProcessor {
    /// Takes the span a stop made for an operation it interrupted (see
    /// [`super::operation::interrupted`]).
    pub fn end_interrupted(&self, span: SpanData) {
        self.accept(span);
    }

    fn accept(&self, span: SpanData) {
        let idle_root = span.parent_span_id == opentelemetry::trace::SpanId::INVALID
            && span
                .attributes
                .iter()
                .any(|kv| kv.key.as_str() == super::operation::IDLE);
        let release = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finished(span, idle_root);
        self.enqueue(release.export);
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

/// Starts the export thread for `settings`; fails when its TLS files cannot be used.
pub fn start(
    settings: &TraceSettings,
    services: Arc<Services>,
    drops: Arc<Drops>,
) -> Result<(QueueProcessor, Flusher), TransportError> {
    let (queue, spans) = mpsc::channel(settings.batching.max_queue);
    let (requests, flushes) = mpsc::unbounded_channel();
    let settings = settings.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| TransportError::Tls(format!("cannot start the export thread: {err}")))?;
    // The gRPC channel's connection task is spawned on the export thread's runtime.
    let sender = {
        let _inside = runtime.enter();
        Sender::new(&settings)?
    };
    let processor = QueueProcessor {
        queue,
        drops: drops.clone(),
        held: Arc::new(Mutex::new(Held::new(settings.batching.max_queue))),
    };
    std::thread::Builder::new()
        .name("span-export".to_string())
        .spawn(move || {
            runtime.block_on(async move {
                Batcher::new(settings, sender, services, drops)
                    .run(spans, flushes)
                    .await
            })
        })
        .map_err(|err| TransportError::Tls(format!("cannot start the export thread: {err}")))?;
    Ok((processor, Flusher { requests }))
}

/// The first pause before an export is tried again, doubled after each failure up to
/// [`MAX_RETRY_PAUSE`], each spread by ±50 %; every attempt stays within the export's timeout.
const FIRST_RETRY_PAUSE: Duration = Duration::from_millis(200);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);
/// Largest export request, in bytes: below the 4 MiB a collector's gRPC receiver takes by
/// default, so that a batch of large spans (at -v=5 they carry many log lines) is sent in
/// several requests instead of being refused every time.
const MAX_REQUEST_BYTES: usize = 3 << 20;

struct Batcher {
    settings: TraceSettings,
    sender: Sender,
    services: Arc<Services>,
    drops: Arc<Drops>,
    last_failure_log: Option<Instant>,
    failures_unlogged: u64,
}

impl Batcher {
    fn new(
        settings: TraceSettings,
        sender: Sender,
        services: Arc<Services>,
        drops: Arc<Drops>,
    ) -> Self {
        Self {
            settings,
            sender,
            services,
            drops,
            last_failure_log: None,
            failures_unlogged: 0,
        }
    }

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
        let (requests, too_large) = self.requests(batch);
        if too_large > 0 {
            self.drops.too_large.fetch_add(too_large, Ordering::Relaxed);
            self.failed(
                too_large,
                &format!(
                    "a span is larger than an export request may be ({MAX_REQUEST_BYTES} bytes)"
                ),
            );
        }
        for (request, count) in requests {
            match self.deliver(&request).await {
                Ok((rejected, message)) => {
                    let rejected = rejected.min(count);
                    tracing::debug!(spans = count, rejected, "spans exported");
                    self.drops
                        .exported
                        .fetch_add(count - rejected, Ordering::Relaxed);
                    if rejected > 0 {
                        self.drops.rejected.fetch_add(rejected, Ordering::Relaxed);
                        self.failed(rejected, &format!("the collector rejected them: {message}"));
                    }
                }
                Err(reason) => {
                    self.drops.export_failed.fetch_add(count, Ordering::Relaxed);
                    self.failed(count, &reason);
                }
            }
        }
    }

    /// Sends `request`, again after a failure the specification retries, all within the
    /// export's timeout; the spans the collector rejected and why, or why none were taken.
    async fn deliver(
        &mut self,
        request: &ExportTraceServiceRequest,
    ) -> Result<(u64, String), String> {
        let bound = self
            .settings
            .export_timeout
            .min(self.settings.batching.timeout);
        let deadline = tokio::time::Instant::now() + bound;
        let mut pause = FIRST_RETRY_PAUSE;
        loop {
            let attempt = tokio::time::timeout_at(deadline, self.sender.send(request))
                .await
                .map_err(|_| format!("no answer in {bound:?} (OTEL_EXPORTER_OTLP_TIMEOUT)"))?;
            let (reason, after) = match attempt {
                Attempt::Taken { rejected, message } => return Ok((rejected, message)),
                Attempt::Failed(reason) => return Err(reason),
                Attempt::Retry { reason, after } => (reason, after),
            };
            // A collector's Retry-After is honoured, but never faster than the backoff: a
            // `Retry-After: 0` would otherwise spin until the timeout.
            let wait = crate::runtime::jittered(pause, 0.5, 1.5).max(after.unwrap_or_default());
            if tokio::time::Instant::now() + wait >= deadline {
                return Err(format!(
                    "{reason} (no time left within {bound:?} to try again)"
                ));
            }
            tokio::time::sleep(wait).await;
            self.drops.retries.fetch_add(1, Ordering::Relaxed);
            pause = (pause * 2).min(MAX_RETRY_PAUSE);
        }
    }

    /// Logs lost spans at most once per [`FAILURE_LOG_EVERY`], with how many since the last.
    fn failed(&mut self, spans: u64, reason: &str) {
        self.failures_unlogged += spans;
        if self
            .last_failure_log
            .is_some_and(|at| at.elapsed() < FAILURE_LOG_EVERY)
        {
            return;
        }
        tracing::warn!(
            endpoint = %self.settings.endpoint,
            spans = self.failures_unlogged,
            error = %reason,
            "cannot export spans; they are dropped"
        );
        self.last_failure_log = Some(Instant::now());
        self.failures_unlogged = 0;
    }

    /// Export requests for the batch, each at most [`MAX_REQUEST_BYTES`] and each with a
    /// resource per service, and how many spans were too large to send at all.
    fn requests(&self, batch: Vec<SpanData>) -> (Vec<(ExportTraceServiceRequest, u64)>, u64) {
        let mut by_service: Vec<(String, Vec<SpanData>)> = Vec::new();
        for span in batch {
            let service = self.services.of(span.span_context.trace_id());
            match by_service.iter_mut().find(|(name, _)| *name == service) {
                Some((_, spans)) => spans.push(span),
                None => by_service.push((service, vec![span])),
            }
        }
        let mut packer = Packer::default();
        for (service, spans) in by_service {
            let resource = ResourceAttributesWithSchema::from(&self.resource(service));
            let resource = ProtoResource {
                attributes: resource.attributes.0,
                ..Default::default()
            };
            for span in spans {
                let scope = span.instrumentation_scope.clone();
                packer.add(&resource, &scope, ProtoSpan::from(span));
            }
        }
        packer.finish()
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

/// Fills export requests with spans up to [`MAX_REQUEST_BYTES`] each.
#[derive(Default)]
struct Packer {
    done: Vec<(ExportTraceServiceRequest, u64)>,
    current: ExportTraceServiceRequest,
    bytes: usize,
    spans: u64,
    too_large: u64,
}

/// A field's tag and length prefix, on top of a message's own bytes.
const FIELD_OVERHEAD: usize = 8;

impl Packer {
    fn add(&mut self, resource: &ProtoResource, scope: &InstrumentationScope, span: ProtoSpan) {
        let size = span.encoded_len() + FIELD_OVERHEAD;
        let proto_scope = ProtoScope {
            name: scope.name().to_string(),
            version: scope.version().unwrap_or_default().to_string(),
            ..Default::default()
        };
        let group = resource.encoded_len() + proto_scope.encoded_len() + 4 * FIELD_OVERHEAD;
        if size + group > MAX_REQUEST_BYTES {
            self.too_large += 1;
            return;
        }
        let same_resource = self
            .current
            .resource_spans
            .last()
            .is_some_and(|last| last.resource.as_ref() == Some(resource));
        let same_scope = same_resource
            && self
                .current
                .resource_spans
                .last()
                .and_then(|last| last.scope_spans.last())
                .is_some_and(|last| last.scope.as_ref() == Some(&proto_scope));
        let mut added = size + if same_scope { 0 } else { group };
        if self.bytes + added > MAX_REQUEST_BYTES {
            self.seal();
            added = size + group;
        }
        let resources = &mut self.current.resource_spans;
        if resources
            .last()
            .is_none_or(|last| last.resource.as_ref() != Some(resource))
        {
            resources.push(ResourceSpans {
                resource: Some(resource.clone()),
                ..Default::default()
            });
        }
        let Some(last) = resources.last_mut() else {
            return;
        };
        if last
            .scope_spans
            .last()
            .is_none_or(|last| last.scope.as_ref() != Some(&proto_scope))
        {
            last.scope_spans.push(ScopeSpans {
                scope: Some(proto_scope),
                ..Default::default()
            });
        }
        if let Some(scope_spans) = last.scope_spans.last_mut() {
            scope_spans.spans.push(span);
            self.bytes += added;
            self.spans += 1;
        }
    }

    fn seal(&mut self) {
        if self.spans > 0 {
            self.done
                .push((std::mem::take(&mut self.current), self.spans));
        }
        self.current = ExportTraceServiceRequest::default();
        self.bytes = 0;
        self.spans = 0;
    }

    fn finish(mut self) -> (Vec<(ExportTraceServiceRequest, u64)>, u64) {
        self.seal();
        (self.done, self.too_large)
    }
}

#[cfg(test)]
mod tests;
