//! `/healthz` and metrics of an in-process livenessprobe against the mock CSI driver, over real
//! unix sockets and real HTTP.
#![cfg(unix)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::{Answer, DRIVER, cli, eventually, get, local, mock_at};
use csi_proto::methods::identity::{GET_PLUGIN_INFO, PROBE};
use livenessprobe::probe::NOT_READY;
use livenessprobe::server::{self, RunError, Running};
use sidecar_kit::process::metrics::code_label;
use tempfile::TempDir;
use testkit::mockdriver::MockHandle;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::Code;

struct Setup {
    _dir: TempDir,
    socket: PathBuf,
    mock: Option<MockHandle>,
    running: Running,
    shutdown: CancellationToken,
}

impl Setup {
    /// A mock driver and a livenessprobe serving on `--http-endpoint=127.0.0.1:0` plus `extra`.
    async fn new(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let mock = mock_at(&socket).await;
        let address = format!("--csi-address={}", socket.display());
        let mut args = vec![address.as_str(), "--http-endpoint=127.0.0.1:0"];
        args.extend_from_slice(extra);
        let shutdown = CancellationToken::new();
        let running = server::start(&cli(&args), &shutdown)
            .await
            .expect("livenessprobe starts")
            .expect("not cancelled");
        Self {
            _dir: dir,
            socket,
            mock: Some(mock),
            running,
            shutdown,
        }
    }

    fn mock(&self) -> &MockHandle {
        self.mock.as_ref().expect("mock running")
    }

    async fn healthz(&self) -> Answer {
        get(self.running.health_address, "/healthz").await
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn ok() -> Answer {
    Answer {
        status: 200,
        body: "ok".into(),
    }
}

fn failed(body: impl Into<String>) -> Answer {
    Answer {
        status: 500,
        body: body.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_and_not_ready() {
    let s = Setup::new(&[]).await;
    assert_eq!(s.running.driver_name, DRIVER);
    assert_eq!(s.healthz().await, ok());
    s.mock().faults().set_ready(false);
    assert_eq!(s.healthz().await, failed(NOT_READY));
    s.mock().faults().set_ready(true);
    assert_eq!(s.healthz().await, ok());
    // One connection, made at start-up, served every check.
    assert_eq!(s.running.prober.dials(), 1);
    assert_eq!(s.mock().calls().count(PROBE), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn driver_errors_are_reported_with_their_code() {
    let s = Setup::new(&[]).await;
    for code in [
        Code::Unavailable,
        Code::FailedPrecondition,
        Code::Internal,
        Code::Unknown,
        Code::ResourceExhausted,
        Code::NotFound,
        Code::Unimplemented,
    ] {
        s.mock().faults().fail_always(PROBE, code, "driver is sick");
        assert_eq!(
            s.healthz().await,
            failed(format!(
                "rpc error: code = {} desc = driver is sick",
                code_label(code)
            )),
            "{code:?}"
        );
        s.mock().faults().clear_failures(PROBE);
    }
    assert_eq!(s.healthz().await, ok());
    // An error the driver sent says nothing about the connection: no redial, no retry.
    assert_eq!(s.running.prober.dials(), 1);
    assert_eq!(s.mock().calls().count(PROBE), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_probe_fails_within_the_probe_timeout() {
    let s = Setup::new(&["--probe-timeout=300ms"]).await;
    s.mock().faults().hang(PROBE);
    let started = Instant::now();
    let answer = s.healthz().await;
    let took = started.elapsed();
    assert_eq!(
        answer,
        failed("rpc error: code = DeadlineExceeded desc = context deadline exceeded")
    );
    assert!(
        took >= Duration::from_millis(300),
        "answered after {took:?}"
    );
    assert!(
        took < Duration::from_millis(1300),
        "answered after {took:?}"
    );
    s.mock().faults().release(PROBE);
    assert_eq!(s.healthz().await, ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_share_one_connection() {
    let s = Setup::new(&[]).await;
    let mut checks = JoinSet::new();
    for _ in 0..100 {
        checks.spawn(get(s.running.health_address, "/healthz"));
    }
    let mut answered = 0;
    while let Some(answer) = checks.join_next().await {
        assert_eq!(answer.unwrap(), ok());
        answered += 1;
    }
    assert_eq!(answered, 100);
    assert_eq!(s.running.prober.dials(), 1);
    assert_eq!(s.mock().calls().count(PROBE), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_checks_do_not_queue_behind_each_other() {
    let s = Setup::new(&["--probe-timeout=400ms"]).await;
    s.mock().faults().hang(PROBE);
    let started = Instant::now();
    let mut checks = JoinSet::new();
    for _ in 0..20 {
        checks.spawn(get(s.running.health_address, "/healthz"));
    }
    while let Some(answer) = checks.join_next().await {
        let answer = answer.unwrap();
        assert_eq!(answer.status, 500);
        assert!(answer.body.contains("DeadlineExceeded"), "{}", answer.body);
    }
    // Serialised, 20 checks would take 8 s.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_socket_fails_until_a_driver_listens_again() {
    let s = Setup::new(&[]).await;
    assert_eq!(s.healthz().await, ok());
    // The driver keeps running on its deleted socket; the kubelet could not reach it.
    std::fs::remove_file(&s.socket).unwrap();
    assert_eq!(
        s.healthz().await,
        failed(format!(
            "CSI driver socket {} does not exist",
            s.socket.display()
        ))
    );
    s.mock().faults().set_ready(false);
    let second = mock_at(&s.socket).await;
    assert_eq!(s.healthz().await, ok());
    assert_eq!(second.calls().count(PROBE), 1);
    assert_eq!(s.running.prober.dials(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replaced_socket_is_redialed() {
    let s = Setup::new(&[]).await;
    assert_eq!(s.healthz().await, ok());
    // A second driver takes over the path while the first still serves its old socket.
    let second = mock_at(&s.socket).await;
    s.mock().faults().set_ready(false);
    assert_eq!(s.healthz().await, ok());
    assert_eq!(second.calls().count(PROBE), 1);
    assert_eq!(s.mock().calls().count(PROBE), 1);
    assert_eq!(s.running.prober.dials(), 2);
    // And the new connection is kept.
    assert_eq!(s.healthz().await, ok());
    assert_eq!(s.running.prober.dials(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_driver_is_answered_at_once() {
    let mut s = Setup::new(&[]).await;
    assert_eq!(s.healthz().await, ok());
    s.mock.take().unwrap().shutdown().await.unwrap();
    let gone = s.healthz().await;
    assert_eq!(gone.status, 500);
    assert!(gone.body.contains("does not exist"), "{}", gone.body);

    let restarted = mock_at(&s.socket).await;
    // The first check after the restart already reaches the new driver.
    assert_eq!(s.healthz().await, ok());
    assert_eq!(restarted.calls().count(PROBE), 1);
    assert_eq!(s.healthz().await, ok());
    assert_eq!(s.running.prober.dials(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_driver_with_stale_socket_fails_within_the_timeout() {
    let mut s = Setup::new(&["--probe-timeout=500ms"]).await;
    s.mock.take().unwrap().shutdown().await.unwrap();
    // A crash leaves the socket file behind with nobody listening.
    drop(std::os::unix::net::UnixListener::bind(&s.socket).unwrap());
    let started = Instant::now();
    let answer = s.healthz().await;
    assert_eq!(answer.status, 500);
    assert!(
        answer.body.starts_with(&format!(
            "cannot connect to the CSI driver at unix://{}: ",
            s.socket.display()
        )) && answer.body.contains("refused"),
        "{}",
        answer.body
    );
    assert!(started.elapsed() < Duration::from_millis(1500));

    std::fs::remove_file(&s.socket).unwrap();
    let _restarted = mock_at(&s.socket).await;
    assert_eq!(s.healthz().await, ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_on_the_http_endpoint() {
    let s = Setup::new(&[]).await;
    assert_eq!(s.healthz().await, ok());
    assert_eq!(s.healthz().await, ok());
    s.mock()
        .faults()
        .fail_next(PROBE, 1, Code::Internal, "broken disk");
    assert_eq!(s.healthz().await.status, 500);

    let metrics = get(s.running.health_address, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.body;
    for expected in [
        "# HELP csi_sidecar_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total",
        "# TYPE csi_sidecar_operations_seconds histogram",
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.k8s.io",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 2"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.k8s.io",grpc_status_code="Internal",method_name="/csi.v1.Identity/Probe"} 1"#,
        r#"csi_sidecar_operations_seconds_bucket{driver_name="hostpath.csi.k8s.io",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe",le="0.1"} 2"#,
        // The name is learnt from this very call, so it is recorded before the name is known.
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginInfo"} 1"#,
        "process_start_time_seconds",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_metrics_path() {
    let s = Setup::new(&["--metrics-path=/custom"]).await;
    assert_eq!(get(s.running.health_address, "/metrics").await.status, 404);
    let metrics = get(s.running.health_address, "/custom").await;
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("csi_sidecar_operations_seconds"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_port_and_separate_metrics_server() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mock = mock_at(&socket).await;
    let address = format!("--csi-address={}", socket.display());
    let shutdown = CancellationToken::new();
    let running = server::start(
        &cli(&[&address, "--health-port=0", "--metrics-address=127.0.0.1:0"]),
        &shutdown,
    )
    .await
    .unwrap()
    .unwrap();
    // --health-port listens on 0.0.0.0, as upstream.
    assert!(running.health_address.ip().is_unspecified());
    let health = local(running.health_address);
    assert_eq!(get(health, "/healthz").await, ok());
    assert_eq!(get(health, "/metrics").await.status, 404);

    let metrics_address = running.metrics_address.expect("metrics server");
    let metrics = get(metrics_address, "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains(
        r#"csi_sidecar_operations_seconds_count{driver_name="hostpath.csi.k8s.io",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#
    ), "{}", metrics.body);
    assert_eq!(get(metrics_address, "/healthz").await.status, 404);
    shutdown.cancel();
    drop(mock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_driver_that_starts_late() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let args = cli(&[
        &format!("--csi-address={}", socket.display()),
        "--http-endpoint=127.0.0.1:0",
    ]);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let mut starting = tokio::spawn(async move { server::start(&args, &token).await });
    // Still waiting after a while, rather than giving up.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut starting)
            .await
            .is_err()
    );
    let mock = mock_at(&socket).await;
    let running = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .expect("started once the driver came")
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(get(running.health_address, "/healthz").await, ok());
    assert_eq!(mock.calls().count(GET_PLUGIN_INFO), 1);
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_while_waiting_for_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let args = cli(&[&format!(
        "--csi-address={}",
        dir.path().join("csi.sock").display()
    )]);
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    let starting = tokio::spawn(async move { server::start(&args, &token).await });
    shutdown.cancel();
    let started = tokio::time::timeout(Duration::from_secs(5), starting)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(started, Ok(None)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_get_plugin_info_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mock = mock_at(&socket).await;
    mock.faults()
        .fail_always(GET_PLUGIN_INFO, Code::Internal, "no identity");
    let shutdown = CancellationToken::new();
    let result = server::start(
        &cli(&[&format!("--csi-address={}", socket.display())]),
        &shutdown,
    )
    .await;
    match result {
        Err(err @ RunError::DriverName(_)) => {
            assert!(err.to_string().contains("no identity"), "{err}")
        }
        other => panic!("expected a GetPluginInfo failure, got {:?}", other.err()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_after_shutdown_are_refused() {
    let s = Setup::new(&[]).await;
    let address = s.running.health_address;
    assert_eq!(get(address, "/healthz").await, ok());
    s.shutdown.cancel();
    eventually(
        Duration::from_secs(5),
        "the listener to close",
        || async move { tokio::net::TcpStream::connect(address).await.is_err() },
    )
    .await;
}
