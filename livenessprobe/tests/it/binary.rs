//! The real `livenessprobe` binary: flags, exit codes, `--version`, serving, waiting for a late
//! driver and graceful shutdown.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{Answer, DRIVER, get, mock_at};
use csi_proto::methods::identity::GET_PLUGIN_INFO;
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_livenessprobe");
const LIMIT: Duration = Duration::from_secs(15);

/// Runs the binary to completion (it must not wait for a driver).
fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .clean_env()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("livenessprobe {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A running livenessprobe whose JSON log lines are collected.
struct Running {
    child: Child,
    log: Arc<Mutex<Vec<serde_json::Value>>>,
}

impl Running {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .clean_env()
            .args(args)
            .arg("--logging-format=json")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(entry) = serde_json::from_str(&line) {
                    sink.lock().unwrap().push(entry);
                }
            }
        });
        Self { child, log }
    }

    /// Waits for a log entry with `message` and returns it.
    async fn logged(&self, message: &str) -> serde_json::Value {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(entry) = self
                .log
                .lock()
                .unwrap()
                .iter()
                .find(|entry| entry["message"] == message)
            {
                return entry.clone();
            }
            assert!(Instant::now() < deadline, "never logged {message:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The address the HTTP server reports once it serves.
    async fn http_address(&self) -> SocketAddr {
        let entry = self.logged("serving HTTP").await;
        entry["address"].as_str().unwrap().parse().unwrap()
    }

    fn terminate(&self) {
        let status = Command::new("kill")
            .clean_env()
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    async fn exit_status(&mut self) -> ExitStatus {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "livenessprobe did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn csi_address(path: &Path) -> String {
    format!("--csi-address={}", path.display())
}

#[test]
fn version() {
    let out = run(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout, format!("{BIN} v{}\n", env!("CARGO_PKG_VERSION")));
    // Go syntax works too.
    assert_eq!(run(&["-version"]).status.code(), Some(0));
}

#[test]
fn help_lists_every_flag_with_its_default() {
    let out = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "--csi-address <ADDRESS>",
        "[default: /run/csi/socket]",
        "--probe-timeout <DURATION>",
        "[default: 3s]",
        "--health-port <PORT>",
        "[default: 9808]",
        "--http-endpoint <ADDRESS>",
        "--metrics-address <ADDRESS>",
        "--metrics-path <PATH>",
        "[default: /metrics]",
        "--v <LEVEL>",
        "--vmodule",
        "--logging-format",
        "[default: text]",
        "--version",
        "--automaxprocs",
    ] {
        assert!(help.contains(expected), "missing {expected:?} in\n{help}");
    }
}

#[test]
fn conflicting_and_bad_flags() {
    let dir = tempfile::tempdir().unwrap();
    // No driver: a run that got past the flags would wait for it forever.
    let address = csi_address(&dir.path().join("csi.sock"));
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--health-port=9000", "--http-endpoint=127.0.0.1:0"],
            1,
            "only one of --health-port and --http-endpoint can be explicitly set",
        ),
        (
            &["-metrics-address=127.0.0.1:0", "-http-endpoint=127.0.0.1:0"],
            1,
            "only one of --metrics-address and --http-endpoint can be explicitly set",
        ),
        (&["--health-port=http"], 1, "invalid --health-port"),
        (&["--probe-timeout=3"], 2, "invalid duration"),
        (&["-probe-timeout", "soon"], 2, "invalid duration"),
        (&["--probe-timeout=-1s"], 2, "negative duration"),
        (&["--no-such-flag"], 2, "no-such-flag"),
        (&["--logging-format=xml"], 2, "xml"),
    ];
    for (args, code, message) in cases {
        let mut all = vec![address.as_str()];
        all.extend_from_slice(args);
        let out = run(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // The default port given explicitly is not a conflict (as upstream compares values): that
    // run waits for its driver, so it is covered in-process.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_health_and_metrics_then_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mock = mock_at(&socket).await;
    let mut probe = Running::spawn(&[&csi_address(&socket), "--http-endpoint=127.0.0.1:0"]);
    let address = probe.http_address().await;
    assert_eq!(
        get(address, "/healthz").await,
        Answer {
            status: 200,
            body: "ok".into()
        }
    );
    let metrics = get(address, "/metrics").await;
    assert!(
        metrics.body.contains(&format!(
            r#"csi_sidecar_operations_seconds_count{{driver_name="{DRIVER}",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe"}} 1"#
        )),
        "{}",
        metrics.body
    );
    std::fs::remove_file(&socket).unwrap();
    let gone = get(address, "/healthz").await;
    assert_eq!(gone.status, 500);
    assert!(gone.body.contains("does not exist"), "{}", gone.body);

    probe.terminate();
    assert_eq!(probe.exit_status().await.code(), Some(0));
    drop(mock);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_a_late_driver() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut probe = Running::spawn(&[&csi_address(&socket), "--http-endpoint=127.0.0.1:0"]);
    probe.logged("connecting to the CSI driver").await;
    assert!(probe.child.try_wait().unwrap().is_none());
    let _mock = mock_at(&socket).await;
    let address = probe.http_address().await;
    assert_eq!(get(address, "/healthz").await.status, 200);
    let named = probe.logged("CSI driver name").await;
    assert_eq!(named["driver"], DRIVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_waiting_for_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let mut probe = Running::spawn(&[&csi_address(&dir.path().join("csi.sock"))]);
    probe.logged("connecting to the CSI driver").await;
    probe.terminate();
    assert_eq!(probe.exit_status().await.code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_plugin_info_failure_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mock = MockDriver::builder().serve_unix(&socket).await.unwrap();
    mock.faults()
        .fail_always(GET_PLUGIN_INFO, Code::Unimplemented, "not here");
    let mut probe = Running::spawn(&[&csi_address(&socket)]);
    assert_eq!(probe.exit_status().await.code(), Some(1));
    let entry = probe
        .logged("failed to get CSI driver name: GetPluginInfo failed: Unimplemented: not here")
        .await;
    assert_eq!(entry["level"], "ERROR");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprecated_health_port_listens_on_all_ipv4_interfaces() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let _mock = mock_at(&socket).await;
    let probe = Running::spawn(&[&csi_address(&socket), "-health-port=0"]);
    let address = probe.http_address().await;
    assert!(
        address.ip().is_unspecified() && address.is_ipv4(),
        "{address}"
    );
    let local = crate::common::local(address);
    assert_eq!(get(local, "/healthz").await.status, 200);
    // Without --http-endpoint upstream serves no metrics.
    assert_eq!(get(local, "/metrics").await.status, 404);
    probe
        .logged("--health-port is deprecated; use --http-endpoint")
        .await;
}

/// Open file descriptors of a process.
#[cfg(target_os = "linux")]
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redials_do_not_leak_connections() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let mut drivers = vec![mock_at(&socket).await];
    let probe = Running::spawn(&[&csi_address(&socket), "--http-endpoint=127.0.0.1:0"]);
    let address = probe.http_address().await;
    assert_eq!(get(address, "/healthz").await.status, 200);
    let pid = probe.child.id();
    let baseline = open_fds(pid);
    for _ in 0..5 {
        // Each new driver takes over the path; the old ones keep serving their orphaned sockets,
        // so only the livenessprobe can close its connections to them.
        drivers.push(mock_at(&socket).await);
        assert_eq!(get(address, "/healthz").await.status, 200);
    }
    crate::common::eventually(LIMIT, "old connections to be closed", || async {
        open_fds(pid) <= baseline
    })
    .await;
    let newest = drivers.last().unwrap();
    assert_eq!(newest.calls().count(csi_proto::methods::identity::PROBE), 1);
}
