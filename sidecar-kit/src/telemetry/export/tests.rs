//! The exporter against the test kit's collector, over real sockets: TLS, headers, gzip,
//! retries, partial success, hangs, request sizes, and spans that cannot join their trace.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::{SpanData, SpanProcessor};
use testkit::otlp::{Collector, Options, ServerTls};
use testkit::tls::Authority;

use super::{Drops, Flusher, QueueProcessor, Services};
use crate::telemetry::config::{TraceSettings, resolve};
use crate::telemetry::held::tests::span;

struct Exporter {
    processor: QueueProcessor,
    flusher: Flusher,
    drops: Arc<Drops>,
}

impl Exporter {
    fn start(settings: &TraceSettings) -> Self {
        let drops = Arc::new(Drops::default());
        let services = Arc::new(Services::new("test".to_string(), false));
        let (processor, flusher) =
            super::start(settings, services, drops.clone()).expect("the exporter starts");
        Self {
            processor,
            flusher,
            drops,
        }
    }

    /// Ends `spans` and waits until the exporter has sent (or given up on) them.
    async fn export(&self, spans: Vec<SpanData>) {
        for span in spans {
            self.processor.on_end(span);
        }
        let flusher = self.flusher.clone();
        let flushed = tokio::task::spawn_blocking(move || flusher.flush(Duration::from_secs(20)))
            .await
            .unwrap();
        assert!(flushed, "the flush finished");
    }

    fn count(&self, counter: fn(&Drops) -> &std::sync::atomic::AtomicU64) -> u64 {
        counter(&self.drops).load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn settings(pairs: &[(&str, &str)]) -> TraceSettings {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    resolve(None, move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    })
    .expect("valid settings")
    .expect("tracing on")
}

/// A root and its child, of trace `trace`.
fn operation(trace: u128) -> Vec<SpanData> {
    vec![span(trace, 2, 1, false), span(trace, 1, 0, false)]
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_a_required_header_and_gzip_over_both_protocols() {
    let authority = Authority::new();
    let (cert, key) = authority.server("collector.test");
    let client_authority = Authority::new();
    let (client_cert, client_key) = client_authority.client("csi-provisioner");
    let collector = Collector::start_with(Options {
        tls: Some(ServerTls {
            cert,
            key,
            client_ca: Some(client_authority.ca_pem()),
        }),
        required_header: Some(("x-api-key".to_string(), "s3cret value".to_string())),
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = write(dir.path(), "ca.pem", &authority.ca_pem());
    let client_cert = write(dir.path(), "client.pem", &client_cert);
    let client_key = write(dir.path(), "client.key", &client_key);
    for (trace, protocol, endpoint) in [
        (1, "grpc", collector.grpc_endpoint()),
        (2, "http/protobuf", collector.http_endpoint()),
    ] {
        assert!(endpoint.starts_with("https://"), "{endpoint}");
        let exporter = Exporter::start(&settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", &ca),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &client_cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &client_key),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret%20value"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
        ]));
        exporter.export(operation(trace)).await;
        assert_eq!(exporter.count(|d| &d.exported), 2, "{protocol}");
        let trace_id = format!("{trace:032x}");
        assert_eq!(collector.trace(&trace_id).len(), 2, "{protocol}");
    }
    assert_eq!(collector.compressed_requests(), 2);
    assert_eq!(collector.unauthenticated(), 0);

    // Without the header the collector refuses; without the client certificate the handshake
    // fails.
    let refused = [
        vec![
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &client_cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &client_key),
        ],
        vec![
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=s3cret%20value"),
        ],
    ];
    let attempts = collector.attempts();
    for extra in refused {
        let endpoint = collector.http_endpoint();
        let mut pairs = vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
        ];
        pairs.extend(extra);
        let exporter = Exporter::start(&settings(&pairs));
        exporter.export(operation(9)).await;
        assert_eq!(exporter.count(|d| &d.exported), 0);
        assert_eq!(exporter.count(|d| &d.export_failed), 2);
    }
    assert_eq!(collector.unauthenticated(), 1);
    // The handshake without a client certificate never reached the receiver.
    assert_eq!(collector.attempts(), attempts + 1);
    assert!(collector.trace(&format!("{:032x}", 9)).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_unavailable_twice_loses_no_span() {
    let collector = Collector::start().await.unwrap();
    for (trace, protocol, endpoint) in [
        (1, "grpc", collector.grpc_endpoint()),
        (2, "http/protobuf", collector.http_endpoint()),
    ] {
        collector.fail_next(2);
        let before = collector.attempts();
        let exporter = Exporter::start(&settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ]));
        exporter.export(operation(trace)).await;
        assert_eq!(exporter.count(|d| &d.exported), 2, "{protocol}");
        assert_eq!(exporter.count(|d| &d.retries), 2, "{protocol}");
        assert_eq!(collector.attempts() - before, 3, "{protocol}");
        assert_eq!(collector.trace(&format!("{trace:032x}")).len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_stays_unavailable_costs_one_timeout_per_batch() {
    let collector = Collector::start().await.unwrap();
    collector.fail_next(u64::MAX);
    let exporter = Exporter::start(&settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.http_endpoint()),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "1000"),
    ]));
    let started = std::time::Instant::now();
    exporter.export(operation(1)).await;
    let took = started.elapsed();
    assert_eq!(exporter.count(|d| &d.export_failed), 2);
    // Backed off (200 ms, doubling) despite the collector's `Retry-After: 0`.
    let retries = exporter.count(|d| &d.retries);
    assert!((2..=4).contains(&retries), "{retries}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_collector_holds_each_export_for_the_timeout_only() {
    let collector = Collector::start().await.unwrap();
    collector.stall(true);
    for protocol in ["grpc", "http/protobuf"] {
        let endpoint = match protocol {
            "grpc" => collector.grpc_endpoint(),
            _ => collector.http_endpoint(),
        };
        let exporter = Exporter::start(&settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
        ]));
        let started = std::time::Instant::now();
        exporter.export(operation(1)).await;
        let took = started.elapsed();
        assert_eq!(exporter.count(|d| &d.export_failed), 2, "{protocol}");
        assert!(took < Duration::from_secs(2), "{protocol}: {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_the_collector_refuses_are_counted_as_rejected() {
    let collector = Collector::start().await.unwrap();
    collector.reject_spans(1);
    for (protocol, endpoint) in [
        ("grpc", collector.grpc_endpoint()),
        ("http/protobuf", collector.http_endpoint()),
    ] {
        let exporter = Exporter::start(&settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
        ]));
        exporter.export(operation(1)).await;
        assert_eq!(exporter.count(|d| &d.exported), 1, "{protocol}");
        assert_eq!(exporter.count(|d| &d.rejected), 1, "{protocol}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_root_takes_its_children_along() {
    let collector = Collector::start().await.unwrap();
    let exporter = Exporter::start(&settings(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        &collector.http_endpoint(),
    )]));
    let mut idle = operation(5);
    idle[1]
        .attributes
        .push(KeyValue::new(crate::telemetry::operation::IDLE, true));
    let mut spans = idle;
    spans.extend(operation(6));
    // A child that ends after its idle root.
    spans.push(span(5, 3, 1, false));
    exporter.export(spans).await;
    assert_eq!(exporter.count(|d| &d.exported), 2);
    assert!(collector.trace(&format!("{:032x}", 5)).is_empty());
    assert_eq!(collector.trace(&format!("{:032x}", 6)).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_split_into_requests_a_collector_takes() {
    let collector = Collector::start().await.unwrap();
    let exporter = Exporter::start(&settings(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector.grpc_endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ]));
    // Eight roots of 1 MiB each: one batch, more than a 4 MiB gRPC receiver takes at once.
    let large = "x".repeat(1 << 20);
    let mut spans: Vec<SpanData> = (1..=8)
        .map(|trace| {
            let mut root = span(trace, 1, 0, false);
            root.attributes
                .push(KeyValue::new("payload", large.clone()));
            root
        })
        .collect();
    // And one larger than any request may be.
    let mut huge = span(9, 1, 0, false);
    huge.attributes
        .push(KeyValue::new("payload", "x".repeat(4 << 20)));
    spans.push(huge);
    exporter.export(spans).await;
    assert_eq!(exporter.count(|d| &d.exported), 8);
    assert_eq!(exporter.count(|d| &d.too_large), 1);
    assert_eq!(exporter.count(|d| &d.export_failed), 0);
    assert!(collector.requests() >= 3, "{}", collector.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_a_stop_interrupts_is_exported_once_with_its_children() {
    use crate::telemetry::operation;
    let collector = Collector::start().await.unwrap();
    let exporter = Exporter::start(&settings(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        &collector.http_endpoint(),
    )]));
    // An operation (trace 11, span 1) still open, one of its children already ended.
    let root = span(11, 1, 0, false);
    operation::open_for_test(root.span_context.clone(), "provision");
    exporter.processor.on_end(span(11, 2, 1, false));
    let interrupted = operation::interrupted();
    assert_eq!(interrupted.len(), 1);
    for span in interrupted {
        exporter.processor.end_interrupted(span);
    }
    exporter.export(Vec::new()).await;
    // The operation ends after all: its own span is not sent a second time.
    exporter.export(vec![root]).await;
    let trace = collector.trace(&format!("{:032x}", 11));
    assert_eq!(trace.len(), 2, "{trace:#?}");
    let exported = trace.iter().find(|s| s.parent_span_id.is_empty()).unwrap();
    assert_eq!(exported.name, "provision");
    assert_eq!(exported.attribute(operation::INTERRUPTED), Some("true"));
    assert_eq!(exported.status_code, 2);
}
