//! The real binary against the mock CSI driver and a fake kubelet plugin watcher.

use std::time::Duration;

use crate::common::kubelet::{Event, FakeKubelet, KubeletOptions, Verdict};
use crate::common::process::{Dirs, Registrar, base_args};
use crate::common::{DRIVER, start_driver};
use csi_proto::methods::identity::GET_PLUGIN_INFO;

const WAIT: Duration = Duration::from_secs(20);

fn kubelet_options() -> KubeletOptions {
    KubeletOptions {
        // The mock driver listens on a named pipe on Windows, which kubelet cannot dial.
        node_get_info: cfg!(unix),
        ..KubeletOptions::default()
    }
}

#[tokio::test]
async fn registers_with_kubelet_and_answers_its_monitor() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));

    let info = kubelet.registered(WAIT).await;
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, dirs.driver_socket().display().to_string());
    assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);

    // Kubelet >= 1.34 keeps calling GetInfo on fresh connections.
    for _ in 0..3 {
        kubelet
            .wait_for(WAIT, |e| matches!(e, Event::MonitorOk { .. }))
            .await;
    }
    registrar
        .wait_for_log("kubelet registered the driver", WAIT)
        .await;
    let get_info = registrar.wait_for_log("GetInfo from kubelet", WAIT).await;
    assert_eq!(get_info.field("name"), Some(DRIVER));
    assert_eq!(get_info.field("level"), Some("INFO"));
    assert_eq!(driver.calls().count(GET_PLUGIN_INFO), 1);
}

#[tokio::test]
async fn kubelets_calls_are_traced_and_their_json_log_lines_name_the_trace() {
    require_af_unix!();
    let collector = testkit::otlp::Collector::start().await.unwrap();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut registrar = Registrar::spawn_with_env(
        base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint()),
            ("OTEL_BSP_SCHEDULE_DELAY", "50".to_string()),
        ],
    );
    kubelet.registered(WAIT).await;
    let line = registrar.wait_for_log("GetInfo from kubelet", WAIT).await;
    let trace_id = line
        .field("trace_id")
        .expect("a trace_id field")
        .to_string();
    assert_eq!(trace_id.len(), 32, "{}", line.raw);
    let span_id = line.field("span_id").expect("a span_id field").to_string();
    let answer = collector
        .wait_for(WAIT, |spans| {
            spans
                .iter()
                .find(|s| s.trace_id == trace_id && s.span_id == span_id)
                .cloned()
        })
        .await
        .expect("the span the log line names");
    assert_eq!(answer.name, "pluginregistration.Registration/GetInfo");
    assert_eq!(answer.kind, 2, "a server span");
    assert_eq!(answer.service, "csi-node-driver-registrar");
    // The registrar's own call to the driver is a client span of its own trace.
    collector
        .wait_for(WAIT, |spans| {
            spans
                .iter()
                .any(|s| s.name == "csi.v1.Identity/GetPluginInfo" && s.kind == 3)
                .then_some(())
        })
        .await
        .expect("GetPluginInfo's span");
}

#[cfg(unix)]
#[tokio::test]
async fn registration_socket_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;

    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let _registrar = Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));
    kubelet.registered(WAIT).await;
    let mode = std::fs::metadata(dirs.registration_socket(DRIVER))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "socket mode {mode:o}");
}

#[tokio::test]
async fn rejection_by_kubelet_exits_1_and_removes_the_socket() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(
        &dirs.registry(),
        KubeletOptions {
            verdict: Verdict::Reject("driver is not allowed on this node".into()),
            ..kubelet_options()
        },
    );
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));

    let rejected = kubelet
        .wait_for(WAIT, |e| matches!(e, Event::Rejected { .. }))
        .await;
    // The registrar answers kubelet before it exits.
    assert!(matches!(
        rejected,
        Event::Rejected {
            delivered: true,
            ..
        }
    ));
    let status = registrar.wait_exit(WAIT).await;
    assert_eq!(status.code(), Some(1));
    let line = registrar
        .wait_for_log("kubelet rejected the registration", WAIT)
        .await;
    assert_eq!(
        line.field("error"),
        Some("driver is not allowed on this node")
    );
    assert!(registrar.logged("Registration process failed with error: driver is not allowed"));
    assert!(!dirs.registration_socket(DRIVER).exists());
}

#[cfg(unix)]
#[tokio::test]
async fn wrong_kubelet_registration_path_is_rejected_by_kubelet() {
    // Kubelet dials the registered endpoint for NodeGetInfo; a path where no driver listens
    // makes it reject the registration, and the registrar restarts.
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let wrong = dirs.root.path().join("plugins").join("elsewhere.sock");
    let mut registrar = Registrar::spawn(base_args(&dirs, &driver.endpoint(), &wrong));

    let rejected = kubelet
        .wait_for(WAIT, |e| matches!(e, Event::Rejected { .. }))
        .await;
    let Event::Rejected { error, .. } = rejected else {
        unreachable!()
    };
    assert!(
        error.contains("error updating CSI node") && error.contains("elsewhere.sock"),
        "{error}"
    );
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(1));
}

#[cfg(unix)]
async fn signal_removes_socket_and_exits_0(signal: i32) {
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));
    kubelet.registered(WAIT).await;

    registrar.signal(signal);
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(0));
    assert!(!dirs.registration_socket(DRIVER).exists());
    let gone = kubelet
        .wait_for(WAIT, |e| matches!(e, Event::Deregistered { .. }))
        .await;
    assert!(matches!(gone, Event::Deregistered { reason, .. } if reason == "socket removed"));
    assert!(registrar.logged("removed the registration socket"));
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_removes_the_socket_and_exits_0() {
    signal_removes_socket_and_exits_0(libc::SIGTERM).await;
}

#[cfg(unix)]
#[tokio::test]
async fn sigint_removes_the_socket_and_exits_0() {
    signal_removes_socket_and_exits_0(libc::SIGINT).await;
}

#[tokio::test]
async fn deleted_socket_is_recreated_and_registered_again() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    args.push("--socket-check-interval=200ms".into());
    let mut registrar = Registrar::spawn(args);
    kubelet.registered(WAIT).await;

    std::fs::remove_file(dirs.registration_socket(DRIVER)).unwrap();
    kubelet
        .wait_for(WAIT, |e| matches!(e, Event::Deregistered { .. }))
        .await;
    let info = kubelet.registered(WAIT).await;
    assert_eq!(info.name, DRIVER);
    registrar
        .wait_for_log("registration socket was deleted", WAIT)
        .await;
    registrar
        .wait_for_log("re-created the registration socket", WAIT)
        .await;
    // Served again for good: the monitor keeps getting answers.
    kubelet
        .wait_for(WAIT, |e| matches!(e, Event::MonitorOk { .. }))
        .await;
}

#[cfg(unix)]
#[tokio::test]
async fn a_socket_taken_over_by_another_instance_is_left_alone() {
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    args.push("--socket-check-interval=100ms".into());
    let mut registrar = Registrar::spawn(args);
    kubelet.registered(WAIT).await;

    // Another instance replaces the socket, as a surge pod of a rolling update would.
    let path = dirs.registration_socket(DRIVER);
    std::fs::remove_file(&path).unwrap();
    let _other = std::os::unix::net::UnixListener::bind(&path).unwrap();
    registrar
        .wait_for_log("replaced by another file", WAIT)
        .await;
    registrar.signal(libc::SIGTERM);
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(0));
    assert!(path.exists(), "the other instance's socket must stay");
}

#[cfg(unix)]
#[tokio::test]
async fn stale_socket_is_replaced_and_other_files_are_refused() {
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    let path = dirs.registration_socket(DRIVER);
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));
    kubelet.registered(WAIT).await;
    registrar.signal(libc::SIGTERM);
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(0));

    std::fs::write(&path, "not a socket").unwrap();
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(1));
    assert!(registrar.logged("exists and is not a socket"));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

#[cfg(unix)]
#[tokio::test]
async fn waits_for_a_driver_socket_that_appears_late() {
    let dirs = Dirs::new();
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let address = format!("unix://{}", dirs.driver_socket().display());
    let mut args = base_args(&dirs, &address, &dirs.driver_socket());
    args.push("-v=2".into());
    let mut registrar = Registrar::spawn(args);
    registrar
        .wait_for_log("connecting to the CSI driver", WAIT)
        .await;
    assert!(!dirs.driver_socket().exists());

    let _driver = start_driver(&dirs).await;
    assert_eq!(kubelet.registered(WAIT).await.name, DRIVER);
}

#[tokio::test]
async fn retries_get_plugin_info_while_the_driver_is_not_ready() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    driver
        .faults()
        .fail_next(GET_PLUGIN_INFO, 2, tonic::Code::Unavailable, "starting up");
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));

    assert_eq!(kubelet.registered(WAIT).await.name, DRIVER);
    assert_eq!(driver.calls().count(GET_PLUGIN_INFO), 3);
    let line = registrar
        .wait_for_log("not answering GetPluginInfo yet", WAIT)
        .await;
    assert!(line.raw.contains("starting up"), "{}", line.raw);
}

#[tokio::test]
async fn retries_get_plugin_info_that_exceeds_the_timeout() {
    require_af_unix!();
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    driver
        .faults()
        .set_latency(GET_PLUGIN_INFO, Duration::from_secs(3));
    let mut kubelet = FakeKubelet::start(&dirs.registry(), kubelet_options());
    let mut args = base_args(&dirs, &driver.endpoint(), &dirs.driver_socket());
    args.push("--timeout=300ms".into());
    let mut registrar = Registrar::spawn(args);

    assert!(
        driver
            .calls()
            .wait_for_count(GET_PLUGIN_INFO, 1, WAIT)
            .await
    );
    driver.faults().clear_latency(GET_PLUGIN_INFO);
    assert_eq!(kubelet.registered(WAIT).await.name, DRIVER);
    let line = registrar
        .wait_for_log("not answering GetPluginInfo yet", WAIT)
        .await;
    assert!(line.raw.contains("DeadlineExceeded"), "{}", line.raw);
}

#[tokio::test]
async fn gives_up_when_the_driver_never_comes() {
    let dirs = Dirs::new();
    let address = format!("unix://{}", dirs.driver_socket().display());
    let mut args = base_args(&dirs, &address, &dirs.driver_socket());
    args.push("--driver-startup-timeout=1s".into());
    let mut registrar = Registrar::spawn(args);
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(1));
    assert!(registrar.logged("error connecting to CSI driver"));
}

#[tokio::test]
async fn a_driver_without_get_plugin_info_fails_at_once() {
    let dirs = Dirs::new();
    let driver = start_driver(&dirs).await;
    driver
        .faults()
        .fail_always(GET_PLUGIN_INFO, tonic::Code::Unimplemented, "no identity");
    // The 2-minute default bound does not apply: waiting cannot help.
    let mut registrar =
        Registrar::spawn(base_args(&dirs, &driver.endpoint(), &dirs.driver_socket()));
    assert_eq!(registrar.wait_exit(WAIT).await.code(), Some(1));
    assert!(registrar.logged("error retrieving CSI driver name"));
    assert_eq!(driver.calls().count(GET_PLUGIN_INFO), 1);
}
