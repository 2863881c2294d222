//! The driver connection, identity helpers and CSI metrics against a real gRPC server on a
//! temporary unix socket.
#![cfg(unix)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse, plugin_capability,
};
use sidecar_kit::driver::connection::{ConnectError, ConnectOptions, LossPolicy, connect};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::driver::identity::{self, IdentityError};
use sidecar_kit::process::http::{HttpServer, Routes};
use sidecar_kit::process::metrics::CsiMetrics;
use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// An Identity service that answers Probe from a script (then "ready" forever).
#[derive(Clone, Default)]
struct ScriptedIdentity {
    name: String,
    probes: Arc<Mutex<VecDeque<Result<ProbeResponse, Status>>>>,
    probe_delay: Option<Duration>,
}

#[tonic::async_trait]
impl Identity for ScriptedIdentity {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "1.0.0".into(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = |t: plugin_capability::service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t as i32 },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(plugin_capability::service::Type::ControllerService),
                service(plugin_capability::service::Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        if let Some(delay) = self.probe_delay {
            tokio::time::sleep(delay).await;
        }
        let next = self.probes.lock().unwrap().pop_front();
        next.unwrap_or(Ok(ProbeResponse { ready: Some(true) }))
            .map(Response::new)
    }
}

/// A driver process stand-in: its own runtime on its own thread, so that stopping it drops every
/// connection at once, as a crashing or restarting driver does.
struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(path: &Path, service: ScriptedIdentity) -> Self {
        let _ = std::fs::remove_file(path);
        let std_listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = UnixListener::from_std(std_listener).unwrap();
                let serve = tonic::transport::Server::builder()
                    .add_service(IdentityServer::new(service))
                    .serve_with_incoming(UnixListenerStream::new(listener));
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task: the client sees EOF.
            drop(runtime);
        });
        Self {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .unwrap()
                .unwrap();
        }
    }
}

fn socket(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("csi.sock")
}

fn reconnecting() -> ConnectOptions {
    ConnectOptions {
        dial_timeout: Some(Duration::from_secs(5)),
        policy: LossPolicy::Reconnect,
    }
}

async fn client_for(path: &Path, options: ConnectOptions) -> CsiClient {
    let connection = connect(path.to_str().unwrap(), options).await.unwrap();
    CsiClient::new(connection, CsiMetrics::new().unwrap())
}

#[tokio::test]
async fn identity_calls_over_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let server = Server::start(
        &path,
        ScriptedIdentity {
            name: "d.example.com".into(),
            ..Default::default()
        },
    );
    let client = client_for(&path, reconnecting()).await;

    assert_eq!(
        identity::driver_name(&client, Some(Duration::from_secs(1)))
            .await
            .unwrap(),
        "d.example.com"
    );
    let caps = identity::plugin_capabilities(&client, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(caps.contains(&plugin_capability::service::Type::ControllerService));
    assert!(caps.contains(&plugin_capability::service::Type::VolumeAccessibilityConstraints));
    assert!(!caps.contains(&plugin_capability::service::Type::GroupControllerService));
    server.stop().await;
}

#[tokio::test]
async fn empty_driver_name_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let _server = Server::start(&path, ScriptedIdentity::default());
    let client = client_for(&path, reconnecting()).await;
    assert!(matches!(
        identity::driver_name(&client, None).await,
        Err(IdentityError::EmptyName)
    ));
}

#[tokio::test]
async fn probe_forever_waits_for_ready() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let script = ScriptedIdentity::default();
    script.probes.lock().unwrap().extend([
        Ok(ProbeResponse { ready: Some(false) }),
        Err(Status::deadline_exceeded("busy")),
        Ok(ProbeResponse { ready: None }),
    ]);
    let _server = Server::start(&path, script.clone());
    let client = client_for(&path, reconnecting()).await;

    identity::probe_forever(&client, Duration::from_secs(1), &CancellationToken::new())
        .await
        .unwrap();
    assert!(
        script.probes.lock().unwrap().is_empty(),
        "all three answers were consumed"
    );
}

#[tokio::test]
async fn probe_forever_fails_on_other_errors_and_stops_on_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let script = ScriptedIdentity::default();
    script
        .probes
        .lock()
        .unwrap()
        .push_back(Err(Status::failed_precondition("disk missing")));
    let _server = Server::start(&path, script.clone());
    let client = client_for(&path, reconnecting()).await;
    let err = identity::probe_forever(&client, Duration::from_secs(1), &CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("FailedPrecondition: disk missing"),
        "{err}"
    );

    script.probes.lock().unwrap().extend(std::iter::repeat_n(
        Ok(ProbeResponse { ready: Some(false) }),
        100,
    ));
    let cancel = CancellationToken::new();
    cancel.cancel();
    let err = identity::probe_forever(&client, Duration::from_secs(1), &cancel)
        .await
        .unwrap_err();
    assert!(matches!(err, IdentityError::Cancelled));
}

#[tokio::test]
async fn probe_attempt_timeout_is_deadline_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let _server = Server::start(
        &path,
        ScriptedIdentity {
            probe_delay: Some(Duration::from_secs(30)),
            ..Default::default()
        },
    );
    let client = client_for(&path, reconnecting()).await;
    let status = client
        .probe(CallOptions::timeout(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
}

#[tokio::test]
async fn dial_waits_for_the_driver_then_gives_up_when_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let bounded = ConnectOptions {
        dial_timeout: Some(Duration::from_millis(600)),
        policy: LossPolicy::Exit,
    };
    let err = connect(path.to_str().unwrap(), bounded)
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ConnectError::Timeout { .. }), "{err}");

    // A driver that comes up while we wait is found.
    let pending = tokio::spawn({
        let path = path.clone();
        async move { connect(path.to_str().unwrap(), reconnecting()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _server = Server::start(
        &path,
        ScriptedIdentity {
            name: "late".into(),
            ..Default::default()
        },
    );
    let connection = pending.await.unwrap().unwrap();
    let client = CsiClient::new(connection, CsiMetrics::new().unwrap());
    assert_eq!(identity::driver_name(&client, None).await.unwrap(), "late");
}

#[tokio::test]
async fn named_pipe_address_is_refused_off_windows() {
    let err = connect(r"\\.\pipe\csi", reconnecting())
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("only supported on Windows"),
        "{err}"
    );
}

#[tokio::test]
async fn loss_is_detected_and_reconnect_policy_redials() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let server = Server::start(
        &path,
        ScriptedIdentity {
            name: "first".into(),
            ..Default::default()
        },
    );
    let client = client_for(&path, reconnecting()).await;
    assert_eq!(identity::driver_name(&client, None).await.unwrap(), "first");

    server.stop().await;
    tokio::time::timeout(Duration::from_secs(10), client.connection().lost())
        .await
        .expect("loss noticed");
    assert_eq!(client.connection().losses(), 1);

    let _restarted = Server::start(
        &path,
        ScriptedIdentity {
            name: "second".into(),
            ..Default::default()
        },
    );
    assert_eq!(
        identity::driver_name(&client, Some(Duration::from_secs(5)))
            .await
            .unwrap(),
        "second"
    );
}

#[tokio::test]
async fn exit_policy_refuses_to_redial() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let server = Server::start(
        &path,
        ScriptedIdentity {
            name: "first".into(),
            ..Default::default()
        },
    );
    let options = ConnectOptions {
        dial_timeout: Some(Duration::from_secs(5)),
        policy: LossPolicy::Exit,
    };
    let client = client_for(&path, options).await;
    identity::driver_name(&client, None).await.unwrap();

    server.stop().await;
    tokio::time::timeout(Duration::from_secs(10), client.connection().lost())
        .await
        .expect("loss noticed");
    let _restarted = Server::start(
        &path,
        ScriptedIdentity {
            name: "second".into(),
            ..Default::default()
        },
    );
    // Cached capabilities may be stale: the connection must not silently come back.
    assert!(
        identity::driver_name(&client, Some(Duration::from_secs(2)))
            .await
            .is_err()
    );
}

#[tokio::test]
async fn metrics_have_upstream_names_labels_and_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let script = ScriptedIdentity {
        name: "d.example.com".into(),
        ..Default::default()
    };
    script
        .probes
        .lock()
        .unwrap()
        .extend([Err(Status::not_found("x")), Err(Status::unavailable("y"))]);
    let _server = Server::start(&path, script);
    let client = client_for(&path, reconnecting()).await;

    // Before GetPluginInfo answers, the driver is unknown.
    client
        .probe(CallOptions::timeout(Duration::from_secs(1)))
        .await
        .unwrap_err();
    let name = identity::driver_name(&client, None).await.unwrap();
    client.metrics().set_driver_name(&name);
    client
        .probe(CallOptions::timeout(Duration::from_secs(1)))
        .await
        .unwrap_err();
    client
        .probe(CallOptions::timeout(Duration::from_secs(1)))
        .await
        .unwrap();

    let shutdown = CancellationToken::new();
    let routes = Routes::new().metrics("/metrics", client.metrics().clone());
    let addr = HttpServer::spawn("127.0.0.1:0", routes, shutdown.clone())
        .await
        .unwrap();
    let body = http_get(addr, "/metrics").await;
    shutdown.cancel();

    let expect = [
        "# HELP csi_sidecar_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total",
        "# TYPE csi_sidecar_operations_seconds histogram",
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="NotFound",method_name="/csi.v1.Identity/Probe"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="unknown-driver",grpc_status_code="OK",method_name="/csi.v1.Identity/GetPluginInfo"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="d.example.com",grpc_status_code="Unavailable",method_name="/csi.v1.Identity/Probe"} 1"#,
        r#"csi_sidecar_operations_seconds_count{driver_name="d.example.com",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"} 1"#,
        "process_start_time_seconds",
    ];
    for line in expect {
        assert!(body.contains(line), "missing {line:?} in\n{body}");
    }
    let buckets: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("csi_sidecar_operations_seconds_bucket{driver_name=\"d.example.com\",grpc_status_code=\"OK\""))
        .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        buckets,
        [
            "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "15", "25", "50", "120", "300", "600",
            "+Inf"
        ]
    );
}

/// A minimal HTTP/1.1 GET over a raw TCP stream.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    response
}

/// Collects formatted log output for assertions.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn grpc_payloads_are_logged_at_v5_without_secrets() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket(&dir);
    let _server = Server::start(
        &path,
        ScriptedIdentity {
            name: "d".into(),
            ..Default::default()
        },
    );
    let client = client_for(&path, reconnecting()).await;

    let logs = LogBuffer::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(sidecar_kit::process::logging::level_for_verbosity(5))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let request = csi_proto::v1::ControllerPublishVolumeRequest {
        volume_id: "vol-1".into(),
        node_id: "node-1".into(),
        secrets: [("password".to_string(), "hunter2".to_string())].into(),
        ..Default::default()
    };
    // The stand-in serves no Controller: the call fails, but it is logged all the same.
    let status = client
        .controller_publish_volume(request, CallOptions::timeout(Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains("/csi.v1.Controller/ControllerPublishVolume"),
        "{text}"
    );
    assert!(text.contains("vol-1"), "{text}");
    assert!(text.contains("***stripped***"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    assert!(text.contains("Unimplemented"), "{text}");
}
