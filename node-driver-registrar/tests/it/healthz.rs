//! `/healthz` of the real binary in each of its states.

use std::time::Duration;

use crate::common::kubelet::{FakeKubelet, KubeletOptions};
use crate::common::process::{Dirs, Registrar, base_args, eventually, http_get};
use crate::common::{DRIVER, start_driver};

const WAIT: Duration = Duration::from_secs(20);

fn quiet_kubelet() -> KubeletOptions {
    KubeletOptions {
        // No monitor calls, so that the GetInfo calls in the log are countable.
        monitor_period: Duration::from_secs(3600),
        node_get_info: cfg!(unix),
        ..KubeletOptions::default()
    }
}

#[tokio::test]
async fn healthz_reports_ok_missing_and_broken_sockets() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), quiet_kubelet());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    // Without the periodic check a deleted socket stays deleted, as upstream.
    args.extend([
        "--http-endpoint=127.0.0.1:0".into(),
        "--socket-check-interval=0".into(),
    ]);
    let mut registrar = Registrar::spawn(args);
    let address = registrar.http_address().await;
    kubelet.registered(WAIT).await;

    assert_eq!(http_get(address, "/healthz").await, (200, "ok".into()));
    assert_eq!(http_get(address, "/healthz").await, (200, "ok".into()));

    let socket = dirs.registration_socket(DRIVER);
    std::fs::remove_file(&socket).unwrap();
    assert_eq!(
        http_get(address, "/healthz").await,
        (404, "registration socket does not exist".into())
    );
    // Everything before this line has been read: the self-checks were not logged as kubelet's.
    registrar.wait_for_log("health check failed", WAIT).await;
    let kubelet_calls = registrar
        .seen
        .iter()
        .filter(|l| l.message() == "GetInfo from kubelet")
        .count();
    assert_eq!(kubelet_calls, 1);

    std::fs::write(&socket, "").unwrap();
    let (status, body) = http_get(address, "/healthz").await;
    assert_eq!(status, 500);
    assert!(
        body.contains("error connecting to node-registrar socket"),
        "{body}"
    );

    assert_eq!(http_get(address, "/other").await.0, 404);
}

#[cfg(unix)]
#[tokio::test]
async fn healthz_fails_when_the_socket_answers_for_another_driver() {
    use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
    use csi_proto::pluginregistration::{InfoRequest, PluginInfo};

    struct Other;
    #[tonic::async_trait]
    impl Registration for Other {
        async fn get_info(
            &self,
            _: tonic::Request<InfoRequest>,
        ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
            Ok(tonic::Response::new(PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "other.csi.k8s.io".into(),
                endpoint: String::new(),
                supported_versions: vec!["1.0.0".into()],
            }))
        }
    }

    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), quiet_kubelet());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    args.extend([
        "--http-endpoint=127.0.0.1:0".into(),
        "--socket-check-interval=0".into(),
    ]);
    let mut registrar = Registrar::spawn(args);
    let address = registrar.http_address().await;
    kubelet.registered(WAIT).await;

    let socket = dirs.registration_socket(DRIVER);
    std::fs::remove_file(&socket).unwrap();
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Other))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    assert_eq!(
        http_get(address, "/healthz").await,
        (500, "invalid driver name other.csi.k8s.io".into())
    );
}

#[tokio::test]
async fn healthz_on_a_missing_socket_gets_it_recreated() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), quiet_kubelet());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    // Only the health check can trigger the re-creation within the test.
    args.extend([
        "--http-endpoint=127.0.0.1:0".into(),
        "--socket-check-interval=1h".into(),
    ]);
    let mut registrar = Registrar::spawn(args);
    let address = registrar.http_address().await;
    kubelet.registered(WAIT).await;

    let socket = dirs.registration_socket(DRIVER);
    std::fs::remove_file(&socket).unwrap();
    assert_eq!(http_get(address, "/healthz").await.0, 404);
    eventually(WAIT, "re-creation of the socket", || socket.exists()).await;
    assert_eq!(http_get(address, "/healthz").await, (200, "ok".into()));
    kubelet.registered(WAIT).await;
    registrar
        .wait_for_log("registration socket was deleted", WAIT)
        .await;
}

#[tokio::test]
async fn deprecated_health_port_serves_healthz_on_all_interfaces() {
    require_af_unix!();
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), quiet_kubelet());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    args.push(format!("--health-port={port}"));
    let mut registrar = Registrar::spawn(args);
    let address = registrar.http_address().await;
    assert_eq!(address.port(), port);
    assert!(address.ip().is_unspecified(), "{address}");
    kubelet.registered(WAIT).await;
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    assert_eq!(http_get(local, "/healthz").await, (200, "ok".into()));
    registrar
        .wait_for_log("--health-port is deprecated", WAIT)
        .await;
}
