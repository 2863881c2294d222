//! OpenTelemetry tracing: the process's `tracing` spans exported over OTLP, the trace handed on
//! to the driver (gRPC metadata) and the API server (HTTP headers) as W3C `traceparent`, and
//! every log line inside a span marked with its trace and span. Off unless `--tracing-config-file`
//! or an `OTEL_EXPORTER_OTLP_*ENDPOINT` variable asks for it; then [`start`] runs once, before
//! the first span.

pub mod config;
mod export;
mod held;
pub mod operation;
pub mod propagate;
mod transport;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::propagation::{TextMapCompositePropagator, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

pub use config::{TraceSettings, TracingConfigError};
use export::{Drops, Flusher, QueueProcessor, Services};

/// The name of the process's tracer: the instrumentation scope of every span.
const TRACER: &str = "csi-sidecars";

/// How long a graceful stop waits for the spans still queued to reach the collector.
const FLUSH_ON_STOP: Duration = Duration::from_secs(5);

/// The process's tracing once started.
struct Telemetry {
    /// Where a stop hands the spans of interrupted operations.
    processor: QueueProcessor,
    /// `OTEL_PROPAGATORS`' choice.
    propagator: TextMapCompositePropagator,
    services: Arc<Services>,
    drops: Arc<Drops>,
    flusher: Flusher,
    /// Kept for the life of the process: dropping the provider would stop its tracers.
    _provider: SdkTracerProvider,
}

static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

/// The settings from `--tracing-config-file` (its path, read here) and the process's
/// environment; `None`: tracing off.
pub fn settings(config_file: Option<&Path>) -> Result<Option<TraceSettings>, TracingConfigError> {
    let text = match config_file {
        Some(path) => {
            Some(
                std::fs::read_to_string(path).map_err(|err| TracingConfigError::File {
                    path: path.display().to_string(),
                    reason: err.to_string(),
                })?,
            )
        }
        None => None,
    };
    config::resolve(config_file.zip(text.as_deref()), |name| {
        std::env::var(name).ok()
    })
}

/// Starts the export and returns the tracer the logging layer turns spans into OTel spans
/// with; `service` names the process where `OTEL_SERVICE_NAME` does not. Once per process.
pub fn start(settings: &TraceSettings, service: &str) -> Result<Tracer, TracingConfigError> {
    let services = Arc::new(Services::new(
        settings
            .service_name
            .clone()
            .unwrap_or_else(|| service.to_string()),
        settings.service_name.is_some(),
    ));
    let drops = Arc::new(Drops::default());
    let (processor, flusher) = export::start(settings, services.clone(), drops.clone())
        .map_err(|err| TracingConfigError::Export(err.to_string()))?;
    let root = if settings.sampling.ratio >= 1.0 {
        Sampler::AlwaysOn
    } else if settings.sampling.ratio <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::TraceIdRatioBased(settings.sampling.ratio)
    };
    let sampler = if settings.sampling.parent_based {
        Sampler::ParentBased(Box::new(root))
    } else {
        root
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor.clone())
        .with_sampler(sampler)
        .build();
    let tracer = provider.tracer(TRACER);
    // The waits an operation records after the fact (queue, backoff) are made with it too.
    opentelemetry::global::set_tracer_provider(provider.clone());
    let mut propagators: Vec<Box<dyn TextMapPropagator + Send + Sync>> = Vec::new();
    if settings.propagators.trace_context {
        propagators.push(Box::new(TraceContextPropagator::new()));
    }
    if settings.propagators.baggage {
        propagators.push(Box::new(BaggagePropagator::new()));
    }
    let _ = TELEMETRY.set(Telemetry {
        processor,
        propagator: TextMapCompositePropagator::new(propagators),
        services,
        drops,
        flusher,
        _provider: provider,
    });
    Ok(tracer)
}

/// The propagators `OTEL_PROPAGATORS` chose; `None` when tracing is off.
fn propagator() -> Option<&'static TextMapCompositePropagator> {
    TELEMETRY.get().map(|telemetry| &telemetry.propagator)
}

/// Attribute work the kit did for spans (renderings, a CSI request's identifiers, child
/// spans): none is done for a span that is not sampled, which this count shows in tests and
/// benchmarks.
static ATTRIBUTE_WORK: AtomicU64 = AtomicU64::new(0);

/// How often the kit built attributes or child spans for a sampled span.
pub fn attribute_work() -> u64 {
    ATTRIBUTE_WORK.load(Ordering::Relaxed)
}

pub(crate) fn attribute_work_done() {
    ATTRIBUTE_WORK.fetch_add(1, Ordering::Relaxed);
}

/// Whether `span` is exported: it exists and was sampled. Under every sampler offered here a
/// child shares its parent's decision (parent-based, or decided by the trace id, or always the
/// same), so an unsampled parent spares its children every attribute.
pub fn sampled(span: &tracing::Span) -> bool {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    !span.is_none() && span.context().span().span_context().is_sampled()
}

/// Whether spans are exported: the kit makes its spans only then.
pub fn enabled() -> bool {
    TELEMETRY.get().is_some()
}

/// For a stop (graceful, after the runtime ended, or fatal): ends the spans of operations
/// still open, marked as interrupted, and sends what is queued, waiting at most
/// [`FLUSH_ON_STOP`].
pub fn flush() {
    let Some(telemetry) = TELEMETRY.get() else {
        return;
    };
    for span in operation::interrupted() {
        telemetry.processor.end_interrupted(span);
    }
    if !telemetry.flusher.flush(FLUSH_ON_STOP) {
        tracing::warn!(timeout = ?FLUSH_ON_STOP, "spans still queued at exit were not all exported");
    }
}

/// Exports the trace of `span` under `service` (the all-in-one process's controllers each
/// under their own).
pub fn attribute_to(span: &tracing::Span, service: &Arc<str>) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if let Some(telemetry) = TELEMETRY.get() {
        let trace = span.context().span().span_context().trace_id();
        telemetry.services.remember(trace, service.clone());
    }
}

/// Adds counts to `span` as attributes, where it is traced.
pub fn count_on(span: &tracing::Span, counts: &[(&'static str, u64)]) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if span.is_none() {
        return;
    }
    for (key, value) in counts {
        span.set_attribute(*key, i64::try_from(*value).unwrap_or(i64::MAX));
    }
}

/// Forgets which service `span`'s trace was exported under: it made no trace.
pub fn unattribute(span: &tracing::Span) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if let Some(telemetry) = TELEMETRY.get() {
        let trace = span.context().span().span_context().trace_id();
        telemetry.services.forget(trace);
    }
}

/// The trace and span ids of the current span, for log lines; `None` outside sampled spans.
pub fn current_ids() -> Option<(String, String)> {
    TELEMETRY.get()?;
    let context = opentelemetry::Context::current();
    let span = context.span();
    let span_context = span.span_context();
    // A span that is not sampled is never exported: its ids would lead nowhere.
    (span_context.is_valid() && span_context.is_sampled()).then(|| {
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    })
}

/// `csi_sidecar_tracing_spans_total{outcome}`: what became of finished spans, and
/// `csi_sidecar_tracing_export_retries_total`: export attempts after a retryable failure.
/// Registered where tracing is on.
pub fn register_metrics(registry: &prometheus::Registry) -> Result<(), prometheus::Error> {
    let Some(telemetry) = TELEMETRY.get() else {
        return Ok(());
    };
    registry.register(Box::new(SpanCounts::new(telemetry.drops.clone())?))
}

struct SpanCounts {
    drops: Arc<Drops>,
    spans: Desc,
    retries: Desc,
}

const SPANS_METRIC: &str = "csi_sidecar_tracing_spans_total";
const RETRIES_METRIC: &str = "csi_sidecar_tracing_export_retries_total";

impl SpanCounts {
    fn new(drops: Arc<Drops>) -> Result<Self, prometheus::Error> {
        let spans = Desc::new(
            SPANS_METRIC.to_string(),
            "Finished spans by outcome: exported, queue_full (dropped: the export queue was full), export_failed (dropped: the collector could not be reached in time or refused the request), rejected (the collector took the request but not these spans), too_large (larger alone than an export request may be).".to_string(),
            vec!["outcome".to_string()],
            Default::default(),
        )?;
        let retries = Desc::new(
            RETRIES_METRIC.to_string(),
            "Export attempts made again after a failure the OTLP specification retries (collector unavailable or overloaded).".to_string(),
            Vec::new(),
            Default::default(),
        )?;
        Ok(Self {
            drops,
            spans,
            retries,
        })
    }
}

impl Collector for SpanCounts {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.spans, &self.retries]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counter = prometheus::IntCounterVec::new(
            prometheus::Opts::new(SPANS_METRIC, self.spans.help.clone()),
            &["outcome"],
        );
        let retries = prometheus::IntCounter::new(RETRIES_METRIC, self.retries.help.clone());
        let (Ok(counter), Ok(retries)) = (counter, retries) else {
            return Vec::new();
        };
        for (outcome, value) in [
            ("exported", &self.drops.exported),
            ("queue_full", &self.drops.queue_full),
            ("export_failed", &self.drops.export_failed),
            ("rejected", &self.drops.rejected),
            ("too_large", &self.drops.too_large),
        ] {
            counter
                .with_label_values(&[outcome])
                .inc_by(value.load(Ordering::Relaxed));
        }
        retries.inc_by(self.drops.retries.load(Ordering::Relaxed));
        let mut families = counter.collect();
        families.extend(retries.collect());
        families
    }
}
