//! OpenTelemetry tracing of the real binary: one trace per provisioning and deletion, handed on
//! to the driver and the API server, exported over OTLP/HTTP and OTLP/gRPC, logs joined to it;
//! a collector that hangs costs the provisioning nothing.

#![cfg(unix)]

use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use testkit::otlp::{Collector, ReceivedSpan, parse_traceparent};
use testkit::process::CleanEnv;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use crate::common::{Env, WAIT, mock};

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");
const CREATE: &str = "/csi.v1.Controller/CreateVolume";

fn spawn(env: &Env, extra: &[String], vars: &[(&str, String)]) -> Child {
    env.binary()
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Stops `child` with SIGTERM (spans still queued are flushed on a graceful stop) and returns
/// what it logged.
async fn stop(mut child: Child) -> String {
    let pid = child.id().unwrap().to_string();
    let sent = std::process::Command::new("kill")
        .clean_env()
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(sent.success());
    let mut stderr = child.stderr.take().unwrap();
    let mut logs = String::new();
    let _ = tokio::time::timeout(WAIT, stderr.read_to_string(&mut logs)).await;
    let _ = tokio::time::timeout(WAIT, child.wait()).await;
    logs
}

fn fast_export(collector_var: (&'static str, String)) -> Vec<(&'static str, String)> {
    vec![collector_var, ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string())]
}

/// The root of the trace an operation named `name` on `claim` made.
fn operation<'a>(spans: &'a [ReceivedSpan], name: &str, claim: &str) -> Option<&'a ReceivedSpan> {
    spans
        .iter()
        .find(|s| s.name == name && s.attribute("k8s.pvc.name") == Some(claim))
}

#[tokio::test]
async fn a_provisioning_is_one_trace_through_the_driver_and_the_api_server() {
    let collector = Collector::start().await.unwrap();
    let mut env = Env::without_controller(mock()).await;
    let child = spawn(
        &env,
        &[],
        &fast_export(("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint())),
    );
    let class = env.create_class(json!({})).await;
    env.create_claim("traced", &class, json!({})).await;
    let pv = env.wait_bound("traced").await;
    let pv_name = pv.metadata.name.clone().unwrap();

    let Some(root) = collector
        .wait_for(WAIT, |spans| {
            operation(spans, "provision", "traced").cloned()
        })
        .await
    else {
        let logs = stop(child).await;
        panic!(
            "no operation span for the provisioning; received {:#?}\n{logs}",
            collector.spans()
        );
    };
    assert_eq!(root.service, "csi-provisioner");
    assert_eq!(
        root.attribute("k8s.namespace.name"),
        Some(env.namespace().as_str())
    );
    assert_eq!(
        root.attribute("k8s.storageclass.name"),
        Some(class.as_str())
    );
    let trace = collector
        .wait_for(WAIT, |spans| {
            let trace: Vec<ReceivedSpan> = spans
                .iter()
                .filter(|s| s.trace_id == root.trace_id)
                .cloned()
                .collect();
            trace
                .iter()
                .any(|s| s.name == "create persistentvolumes")
                .then_some(trace)
        })
        .await
        .expect("the PV's creation in the provisioning's trace");

    // The CreateVolume span is the parent the driver was told of.
    let call = trace
        .iter()
        .find(|s| s.name == CREATE.trim_start_matches('/'))
        .expect("a CreateVolume span");
    assert_eq!(call.kind, 3, "a client span");
    assert_eq!(call.attribute("rpc.system"), Some("grpc"));
    assert_eq!(call.attribute("rpc.grpc.status_code"), Some("0"));
    assert_eq!(call.attribute("csi.name"), Some(pv_name.as_str()));
    let received = env.mock.calls().of(CREATE);
    let sent = received
        .iter()
        .rev()
        .find_map(|c| c.traceparent.as_deref().and_then(parse_traceparent))
        .expect("CreateVolume carried a traceparent");
    assert_eq!(sent, (root.trace_id.clone(), call.span_id.clone()));
    assert!(
        trace
            .iter()
            .any(|s| s.name == "queue wait" && s.parent_span_id == root.span_id)
    );

    // The API requests of the operation carry the trace, with spans of their own.
    let create_pv = trace
        .iter()
        .find(|s| s.name == "create persistentvolumes")
        .unwrap();
    assert_eq!(
        create_pv.attribute("http.response.status_code"),
        Some("201")
    );
    if let Some(counters) = env.cluster.counters() {
        let traced = counters.traced();
        assert!(
            traced
                .iter()
                .any(|(key, parent)| key.resource == "persistentvolumes"
                    && parse_traceparent(parent)
                        == Some((root.trace_id.clone(), create_pv.span_id.clone()))),
            "the API server saw the PV's creation under its span: {traced:?}"
        );
    }

    // The deletion is a trace of its own, named after the claim it served.
    env.delete_claim("traced").await;
    env.wait_pv_gone(&pv_name).await;
    let deletion = collector
        .wait_for(WAIT, |spans| operation(spans, "delete", "traced").cloned())
        .await
        .expect("the deletion's operation span");
    assert_ne!(deletion.trace_id, root.trace_id);
    let logs = stop(child).await;
    assert!(
        collector
            .wait_for(WAIT, |spans| spans
                .iter()
                .any(|s| s.trace_id == deletion.trace_id
                    && s.name == "csi.v1.Controller/DeleteVolume")
                .then_some(()))
            .await
            .is_some()
    );

    // A pass that found nothing to do is no operation and makes no trace.
    let idle: Vec<_> = collector
        .spans()
        .into_iter()
        .filter(|s| s.parent_span_id.is_empty() && s.name.ends_with(" default"))
        .collect();
    assert!(idle.is_empty(), "{idle:#?}");

    // Log lines written inside the operation name its trace.
    assert!(
        logs.lines()
            .any(|line| line.contains(&format!("trace_id={}", root.trace_id))),
        "{logs}"
    );
    for span in collector.spans() {
        for value in span.attributes.values() {
            assert!(!value.contains("secret-value"), "{span:?}");
        }
    }
    env.stop().await;
}

#[tokio::test]
async fn grpc_export_and_a_hanging_collector() {
    let collector = Collector::start().await.unwrap();
    let mut env = Env::without_controller(mock()).await;
    let vars = vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.grpc_endpoint()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".to_string()),
        ("OTEL_SERVICE_NAME", "provisioner-a".to_string()),
        ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string()),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "16".to_string()),
        ("OTEL_BSP_EXPORT_TIMEOUT", "500".to_string()),
    ];
    let port = testkit::measure::free_port().unwrap();
    let child = spawn(&env, &[format!("--http-endpoint=127.0.0.1:{port}")], &vars);
    let class = env.create_class(json!({})).await;
    env.create_claim("first", &class, json!({})).await;
    env.wait_bound("first").await;
    let root = collector
        .wait_for(WAIT, |spans| {
            operation(spans, "provision", "first").cloned()
        })
        .await
        .expect("spans over OTLP/gRPC");
    assert_eq!(root.service, "provisioner-a");

    // A collector that takes requests and never answers: provisioning goes on.
    collector.stall(true);
    let before = collector.spans().len();
    for n in 0..20 {
        env.create_claim(&format!("stalled-{n}"), &class, json!({}))
            .await;
    }
    for n in 0..20 {
        env.wait_bound_within(&format!("stalled-{n}"), Duration::from_secs(60))
            .await;
    }
    assert_eq!(
        collector.spans().len(),
        before,
        "nothing was taken while stalled"
    );
    let (_, metrics) = testkit::measure::http_get(port, "/metrics").await.unwrap();
    let dropped: u64 = metrics
        .lines()
        .filter(|line| {
            line.starts_with("csi_sidecar_tracing_spans_total{outcome=\"queue_full\"}")
                || line.starts_with("csi_sidecar_tracing_spans_total{outcome=\"export_failed\"}")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(
        dropped > 0,
        "the spans that did not fit were dropped and counted:\n{metrics}"
    );
    collector.stall(false);
    stop(child).await;
    env.stop().await;
}

#[tokio::test]
async fn a_tracing_configuration_that_cannot_be_used_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tracing.yaml");
    std::fs::write(
        &file,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nsamplingRatePerMillion: 1000001\n",
    )
    .unwrap();
    let flag = format!("--tracing-config-file={}", file.display());
    let (code, _, stderr) =
        testkit::process::run_to_exit(BIN, &["--csi-address=/nonexistent.sock", &flag], WAIT).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("samplingRatePerMillion must be between 0 and 1000000, not 1000001"),
        "{stderr}"
    );

    let missing = format!(
        "--tracing-config-file={}",
        dir.path().join("absent.yaml").display()
    );
    let (code, _, stderr) =
        testkit::process::run_to_exit(BIN, &["--csi-address=/nonexistent.sock", &missing], WAIT)
            .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--tracing-config-file"), "{stderr}");

    let output = tokio::time::timeout(
        WAIT,
        Command::new(BIN)
            .clean_env()
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift")
            .arg("--csi-address=/nonexistent.sock")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"thrift\": unknown protocol"),
        "{stderr}"
    );
}

#[tokio::test]
async fn an_operation_in_flight_at_sigterm_is_exported_whole() {
    let collector = Collector::start().await.unwrap();
    let mut env = Env::without_controller(mock()).await;
    env.mock.faults().hang(CREATE);
    let child = spawn(
        &env,
        &["--timeout=2s".to_string()],
        &fast_export(("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint())),
    );
    let class = env.create_class(json!({})).await;
    env.create_claim("held", &class, json!({})).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while env.mock.calls().of(CREATE).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no CreateVolume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The operation's children so far are held back until it ends: nothing of its trace has
    // been sent while it runs.
    assert!(
        !collector
            .spans()
            .iter()
            .any(|s| s.attribute("k8s.pvc.name") == Some("held"))
    );
    let logs = stop(child).await;
    let root = collector
        .wait_for(WAIT, |spans| operation(spans, "provision", "held").cloned())
        .await
        .unwrap_or_else(|| panic!("the provisioning in flight was exported\n{logs}"));
    // The stop waited for the call (its --timeout), so the operation ended as it would have:
    // failed, with its CreateVolume span and its children.
    assert_eq!(root.status_code, 2, "{root:#?}");
    let trace = collector.trace(&root.trace_id);
    let call = trace
        .iter()
        .find(|s| s.name == CREATE.trim_start_matches('/'))
        .expect("the CreateVolume span");
    assert_eq!(call.attribute("rpc.grpc.status_code"), Some("4"));
    assert!(trace.iter().any(|s| s.name == "queue wait"));
    env.mock.faults().release(CREATE);
    env.stop().await;
}
