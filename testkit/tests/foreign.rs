//! Binaries built for another architecture, run under an emulator: each answers `--help`, and
//! the livenessprobe and the node-driver-registrar talk to the (native) mock driver and the
//! kubelet-like client over unix sockets, so that byte order cannot hide in the protocols.
//!
//! `scripts/linux-static.sh` builds the binaries and runs this test with `FOREIGN_BIN_DIR` (the
//! folder of the binaries) and `FOREIGN_RUNNER` (e.g. `qemu-s390x-static`); without them the
//! test says how to run it and passes.
#![cfg(unix)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use testkit::kubelet;
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tokio::process::Command;

const DRIVER: &str = "foreign.csi.example.com";

struct Foreign {
    dir: PathBuf,
    runner: String,
}

impl Foreign {
    fn from_env() -> Option<Self> {
        let dir = std::env::var_os("FOREIGN_BIN_DIR")?;
        let runner = std::env::var("FOREIGN_RUNNER").unwrap_or_default();
        Some(Self {
            dir: PathBuf::from(dir),
            runner,
        })
    }

    fn command(&self, binary: &str) -> Command {
        let path = self.dir.join(binary);
        assert!(path.is_file(), "{} was not built", path.display());
        let mut command = if self.runner.is_empty() {
            Command::new(&path)
        } else {
            let mut command = Command::new(&self.runner);
            command.arg(&path);
            command
        };
        command.clean_env().kill_on_drop(true);
        testkit::process::die_with_parent(&mut command);
        command
    }
}

fn skip() -> Option<Foreign> {
    let foreign = Foreign::from_env();
    if foreign.is_none() {
        println!(
            "skipped: run scripts/linux-static.sh to test the binaries of other architectures"
        );
    }
    foreign
}

#[tokio::test]
async fn every_binary_answers_help() {
    let Some(foreign) = skip() else { return };
    for (binary, flag) in [
        ("livenessprobe", "--probe-timeout"),
        ("csi-node-driver-registrar", "--kubelet-registration-path"),
        ("csi-attacher", "--worker-threads"),
        ("csi-resizer", "--handle-volume-inuse-error"),
        ("csi-snapshotter", "--snapshot-name-prefix"),
        ("csi-provisioner", "--volume-name-prefix"),
        (
            "csi-external-health-monitor-controller",
            "--list-volumes-interval",
        ),
        ("csi-sidecars", "livenessprobe"),
    ] {
        let mut command = foreign.command(binary);
        if binary != "csi-sidecars" {
            command.arg("--help");
        }
        let output = command.output().await.unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{binary}: {output:?}");
        assert!(
            stdout.contains(flag),
            "{binary} --help lacks {flag}:\n{stdout}"
        );
    }
}

#[tokio::test]
async fn the_livenessprobe_probes_the_driver() {
    let Some(foreign) = skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mock = MockDriver::builder()
        .driver_name(DRIVER)
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let port = free_port().unwrap();
    let mut probe = foreign
        .command("livenessprobe")
        .arg(format!("--csi-address={}", mock.socket_path().display()))
        .arg(format!("--http-endpoint=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Emulated start-up is slow: a generous bound.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((200, body)) = http_get(port, "/healthz").await {
            assert_eq!(body.trim(), "ok");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no /healthz from the emulated livenessprobe"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    mock.faults().set_ready(false);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, "/healthz").await.map(|(code, _)| code) != Some(500) {
        assert!(
            Instant::now() < deadline,
            "a driver not ready is not reported"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    probe.start_kill().unwrap();
    probe.wait().await.unwrap();
    mock.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_registrar_registers_the_driver() {
    let Some(foreign) = skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mock = MockDriver::builder()
        .driver_name(DRIVER)
        .node_id("node-1")
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let registration = dir.path().join("registry");
    std::fs::create_dir_all(&registration).unwrap();
    let mut registrar = foreign
        .command("csi-node-driver-registrar")
        .arg(format!("--csi-address={}", mock.socket_path().display()))
        .arg("--kubelet-registration-path=/var/lib/kubelet/plugins/foreign/csi.sock")
        .arg(format!(
            "--plugin-registration-path={}",
            registration.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = registration.join(format!("{DRIVER}-reg.sock"));
    let deadline = Instant::now() + Duration::from_secs(60);
    let info = loop {
        if socket.exists()
            && let Ok(info) = kubelet::register(&socket).await
        {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "the emulated registrar never answered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/foreign/csi.sock");
    registrar.start_kill().unwrap();
    registrar.wait().await.unwrap();
    mock.shutdown().await.unwrap();
}
