//! The `csi-mock-driver` binary as a child process: flags, serving,
//! persistence across process restarts and a clean exit on SIGTERM.

// Unix sockets and signals; Windows serves named pipes instead.
#![cfg(unix)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use crate::mockdriver_common::*;
use csi_proto::v1;
use testkit::process::CleanEnv;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

/// The mock as a child process; killed if a test fails before stopping it.
struct MockProcess {
    child: Child,
}

impl MockProcess {
    async fn start(socket: &Path, args: &[&str]) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
            .clean_env()
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let mut process = Self { child };
        if !wait_for_path(socket, WAIT).await {
            let status = process.child.try_wait().unwrap();
            panic!("the socket did not appear; process status {status:?}");
        }
        process
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("sh")
            .clean_env()
            .arg("-c")
            .arg(format!("kill -{signal} {}", self.child.id()))
            .status()
            .unwrap();
        assert!(status.success());
    }

    async fn wait(&mut self) -> ExitStatus {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mock did not exit"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGTERM, then expects exit code 0.
    async fn terminate(mut self) {
        self.signal("TERM");
        let status = self.wait().await;
        assert!(status.success(), "exit status {status:?}");
    }
}

impl Drop for MockProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[tokio::test]
async fn serves_flags_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let mock = MockProcess::start(
        &socket,
        &[
            "--name",
            "bin.csi.example.com",
            "--node-id",
            "node-7",
            "--max-volumes-per-node",
            "3",
            "--topology",
            "topology.example.com/zone=z1",
            "--fail",
            "CreateVolume=UNAVAILABLE:1",
            "-v",
        ],
    )
    .await;
    let mut clients = Clients::new(&socket).await;

    let probe = clients.identity.probe(v1::ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(true));
    let info = clients
        .identity
        .get_plugin_info(v1::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "bin.csi.example.com");
    let node = clients
        .node
        .node_get_info(v1::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (node.node_id.as_str(), node.max_volumes_per_node),
        ("node-7", 3)
    );
    assert_eq!(
        node.accessible_topology.unwrap().segments["topology.example.com/zone"],
        "z1"
    );
    assert_eq!(
        code(
            clients
                .controller
                .create_volume(create_request("pvc", 1))
                .await
        ),
        Code::Unavailable
    );
    let volume = clients
        .controller
        .create_volume(create_request("pvc", 1))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(volume.accessible_topology.len(), 1);

    mock.terminate().await;
    assert!(!socket.exists(), "socket removed on exit");
}

#[tokio::test]
async fn sigint_also_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let mut mock = MockProcess::start(&socket, &[]).await;
    mock.signal("INT");
    assert!(mock.wait().await.success());
    assert!(!socket.exists());
}

#[tokio::test]
async fn state_persists_across_process_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let state = dir.path().join("mock-state.json");
    let state_arg = state.to_str().unwrap();

    let mock = MockProcess::start(&socket, &["--state", state_arg]).await;
    let created = Clients::new(&socket)
        .await
        .controller
        .create_volume(create_request("pvc-persisted", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    mock.terminate().await;

    let mock = MockProcess::start(&socket, &["--state", state_arg]).await;
    let listed = Clients::new(&socket)
        .await
        .controller
        .list_volumes(v1::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = listed
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect();
    assert_eq!(ids, [created.volume_id]);
    mock.terminate().await;
}

#[tokio::test]
async fn readiness_latency_and_switch_flags() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let mock = MockProcess::start(
        &socket,
        &[
            "--not-ready",
            "--latency",
            "GetPluginInfo=1h",
            "--snapshots=false",
            "--controller",
            "true",
        ],
    )
    .await;
    let mut clients = Clients::new(&socket).await;
    let probe = clients.identity.probe(v1::ProbeRequest {}).await.unwrap();
    assert_eq!(probe.into_inner().ready, Some(false));
    let info = clients
        .identity
        .get_plugin_info(v1::GetPluginInfoRequest {});
    assert!(still_pending_after(Duration::from_millis(200), info).await);
    assert_eq!(
        code(
            clients
                .controller
                .list_snapshots(v1::ListSnapshotsRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    mock.terminate().await;
}

/// With `--known-node`, the mock's own node (what NodeGetInfo reports) can be
/// published to and any other node does not exist.
#[tokio::test]
async fn known_nodes_flag_makes_other_nodes_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let socket = socket_in(&dir);
    let mock = MockProcess::start(&socket, &["--known-node", "mock-node"]).await;
    let mut clients = Clients::new(&socket).await;
    let node_id = clients
        .node
        .node_get_info(v1::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_id;
    let volume_id = clients
        .controller
        .create_volume(create_request("pvc", 1 << 20))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    assert_eq!(
        code(
            clients
                .controller
                .controller_publish_volume(publish_request(&volume_id, "fake-node-id-1"))
                .await
        ),
        Code::NotFound
    );
    clients
        .controller
        .controller_publish_volume(publish_request(&volume_id, &node_id))
        .await
        .unwrap();
    mock.terminate().await;
}

#[test]
fn help_documents_every_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
        .clean_env()
        .arg("--help")
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--endpoint",
        "--name",
        "--vendor-version",
        "--node-id",
        "--max-volumes-per-node",
        "--known-node",
        "--topology",
        "--capacity",
        "--max-volume-size",
        "--default-volume-size",
        "--state",
        "--controller",
        "--publish-unpublish",
        "--list-volumes",
        "--list-volumes-published-nodes",
        "--get-capacity",
        "--clone",
        "--snapshots",
        "--expand",
        "--modify",
        "--get-volume",
        "--publish-readonly",
        "--single-node-multi-writer",
        "--accessibility-constraints",
        "--node-stage",
        "--latency",
        "--fail",
        "--not-ready",
        "--verbose",
    ] {
        assert!(help.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn bad_flags_are_refused() {
    for args in [
        &[
            "--endpoint",
            "unix:///tmp/x.sock",
            "--fail",
            "NoSuchMethod=ABORTED",
        ][..],
        &[
            "--endpoint",
            "unix:///tmp/x.sock",
            "--latency",
            "Probe=soon",
        ],
        &["--endpoint", r"\\.\pipe\mock"],
        &["--endpoint", "unix:///tmp/x.sock", "--capacity", "lots"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_csi-mock-driver"))
            .clean_env()
            .args(args)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{args:?} was accepted");
        assert!(!output.stderr.is_empty(), "{args:?} failed silently");
    }
}
