//! Tracing on but not sampled costs a flag check: an operation whose trace is not sampled makes
//! no attribute, no child span and no request identifiers, and hands "not sampled" on to the
//! driver and the API server. A process of its own: tracing is started once per process.
#![cfg(unix)]

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use sidecar_kit::cluster::client::Connections;
use sidecar_kit::driver::connection::{ConnectOptions, connect};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::process::metrics::CsiMetrics;
use sidecar_kit::telemetry::{self, config, operation};
use testkit::apiserver::ApiServer;
use testkit::mockdriver::MockDriver;
use testkit::otlp::Collector;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const PROBE: &str = "/csi.v1.Identity/Probe";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsampled_operation_builds_nothing_and_says_so_downstream() {
    let collector = Collector::start().await.unwrap();
    let endpoint = collector.http_endpoint();
    let settings = config::resolve(None, |name| match name {
        "OTEL_EXPORTER_OTLP_ENDPOINT" => Some(endpoint.clone()),
        // kube-apiserver's default rate: no root is kept; a sampled caller's trace is.
        "OTEL_TRACES_SAMPLER" => Some("parentbased_always_off".to_string()),
        "OTEL_BSP_SCHEDULE_DELAY" => Some("50".to_string()),
        _ => None,
    })
    .unwrap()
    .unwrap();
    let tracer = telemetry::start(&settings, "test").unwrap();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer))
        .init();

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mock = MockDriver::builder().serve_unix(&socket).await.unwrap();
    let connection = connect(socket.to_str().unwrap(), ConnectOptions::default())
        .await
        .unwrap();
    let csi = CsiClient::new(connection, CsiMetrics::new().unwrap());
    let cluster = ApiServer::start().await.unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Connections::new(&config)
        .unwrap()
        .client(&config, -1.0, 1)
        .unwrap();
    let options = CallOptions {
        timeout: Some(Duration::from_secs(5)),
        migrated: false,
    };
    let operation_work = || {
        let csi = csi.clone();
        let client = client.clone();
        async move {
            operation::describe("provision", &[("k8s.pvc.name", "claim")]);
            csi.probe(options).await.unwrap();
            Api::<Namespace>::all(client)
                .list(&ListParams::default())
                .await
                .unwrap();
        }
    };

    let retries = operation::Retries::<String>::default();
    let pass = retries
        .begin(
            None,
            "claims",
            "default",
            &"key".to_string(),
            Duration::ZERO,
            0,
        )
        .expect("tracing is on");
    operation_work().instrument(pass.span.clone()).await;
    retries.finish(pass, 0);
    assert_eq!(telemetry::attribute_work(), 0);
    let told = mock.calls().of(PROBE).last().unwrap().traceparent.clone();
    assert!(
        told.as_deref().is_some_and(|t| t.ends_with("-00")),
        "the driver was told the trace is not sampled: {told:?}"
    );

    // The same work under a caller's sampled trace is traced, attributes and all.
    let caller = SpanContext::new(
        TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736u128),
        SpanId::from(0x00f0_67aa_0ba9_02b7u64),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    let span = tracing::info_span!("request");
    let _ = span.set_parent(Context::new().with_remote_span_context(caller));
    operation_work().instrument(span).await;
    assert!(telemetry::attribute_work() > 0);
    tokio::task::spawn_blocking(telemetry::flush).await.unwrap();
    let names: Vec<String> = collector
        .trace("4bf92f3577b34da6a3ce929d0e0e4736")
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "csi.v1.Identity/Probe")
            && names.iter().any(|n| n == "list namespaces"),
        "{names:?}"
    );
    assert_eq!(
        collector.spans().len(),
        names.len(),
        "nothing of the unsampled operation"
    );
}
