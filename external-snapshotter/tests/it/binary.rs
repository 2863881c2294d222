//! The real `csi-snapshotter` binary: its flags, and a start against the mock driver that
//! serves metrics with upstream's names and cuts a snapshot.

use std::process::Stdio;

use crate::common::*;
use serde_json::json;
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_csi-snapshotter");

#[tokio::test]
async fn help_lists_every_upstream_flag_and_bad_flags_exit_2() {
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--help"], WAIT).await;
    assert_eq!(code, 0);
    for flag in [
        "--csi-address",
        "--kubeconfig",
        "--resync-period",
        "--snapshot-name-prefix",
        "--snapshot-name-uuid-length",
        "--worker-threads",
        "--timeout",
        "--extra-create-metadata",
        "--retry-interval-start",
        "--retry-interval-max",
        "--node-deployment",
        "--groupsnapshot-name-prefix",
        "--groupsnapshot-name-uuid-length",
        "--feature-gates",
        "--kube-api-qps",
        "--kube-api-burst",
        "--leader-election",
        "--leader-election-namespace",
        "--http-endpoint",
        "--metrics-address",
        "--metrics-path",
        "--version",
    ] {
        assert!(stdout.contains(flag), "{flag} missing from --help");
    }
    let (code, _, _) = testkit::process::run_to_exit(BIN, &["--workers=2"], WAIT).await;
    assert_eq!(code, 2, "the resizer's flag");
    let (code, _, stderr) =
        testkit::process::run_to_exit(BIN, &["--feature-gates=NoSuchGate=true"], WAIT).await;
    assert_eq!(code, 1, "set after parsing, as upstream's: {stderr}");
    let (code, _, stderr) =
        testkit::process::run_to_exit(BIN, &["--snapshot-name-uuid-length=40"], WAIT).await;
    assert_eq!(code, 1);
    assert!(stderr.contains("between 1 and 32"), "{stderr}");
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--version"], WAIT).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn the_binary_cuts_a_snapshot_and_serves_upstreams_metrics() {
    // The in-process snapshotter is stopped at once: the binary does the work.
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.stop().await;
    let port = free_port().unwrap();
    let mut child = Command::new(BIN)
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            // The journal lives in the Lease namespace: the test's, not `default`.
            format!("--leader-election-namespace={}", env.ns()),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    env.content_of(&uid).await;
    env.content_until(&format!("snapcontent-{uid}"), "the content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    // The worker records the calls it made once it has written the content ready.
    let metrics = eventually("the calls per snapshot recorded", || async {
        http_get(port, "/metrics")
            .await
            .map(|(_, body)| body)
            .filter(|body| body.contains("csi_snapshotter_driver_calls_per_snapshot_count 1"))
    })
    .await;
    assert!(metrics.contains(&format!(
        "csi_sidecar_operations_seconds_count{{driver_name=\"{}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/CreateSnapshot\"}} 1",
        env.driver
    )), "{metrics}");
    assert!(
        metrics.contains("workqueue_adds_total{name=\"csi-snapshotter-content\"}"),
        "{metrics}"
    );
    child.start_kill().unwrap();
}

/// Runs the binary with the group gate on against `env`'s driver.
fn spawn_with_groups(env: &Env, port: u16) -> tokio::process::Child {
    Command::new(BIN)
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            format!("--leader-election-namespace={}", env.ns()),
            "--feature-gates=CSIVolumeGroupSnapshot=true".to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn with_the_gate_the_binary_cuts_a_group_snapshot() {
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.stop().await;
    let port = free_port().unwrap();
    let mut child = spawn_with_groups(&env, port);
    env.group_class("gclass", "Delete", json!({})).await;
    env.bound_claim("a").await;
    env.label_claim("a", "db").await;
    let uid = env.group_snapshot("g", "db", "gclass").await;
    env.group_content_until(
        &format!("groupsnapcontent-{uid}"),
        "the group content ready",
        |c| c["status"]["readyToUse"] == true,
    )
    .await;
    let metrics = eventually("the metrics", || async {
        http_get(port, "/metrics").await.map(|(_, body)| body)
    })
    .await;
    assert!(
        metrics.contains("workqueue_adds_total{name=\"csi-snapshotter-groupsnapshotcontent\"}"),
        "{metrics}"
    );
    child.start_kill().unwrap();
}

#[tokio::test]
async fn a_driver_without_group_snapshots_gets_its_group_contents_left_alone() {
    let mut env = Env::start(MockDriver::builder().group_snapshots(false), |_| {}).await;
    env.stop().await;
    let port = free_port().unwrap();
    let mut child = spawn_with_groups(&env, port);
    env.group_class("gclass", "Delete", json!({})).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("a").await;
    env.label_claim("a", "db").await;
    let group_uid = env.group_snapshot("g", "db", "gclass").await;
    let group_content = format!("groupsnapcontent-{group_uid}");
    eventually("the group content", || async {
        env.group_contents().get(&group_content).await.ok()
    })
    .await;
    // A snapshot taken after it is cut: the binary has been running past the group content.
    let uid = env.snapshot("snap", "a", "class").await;
    env.content_of(&uid).await;
    env.content_until(&format!("snapcontent-{uid}"), "the snapshot ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    let content =
        serde_json::to_value(env.group_contents().get(&group_content).await.unwrap()).unwrap();
    assert!(content.get("status").is_none_or(serde_json::Value::is_null));
    assert_eq!(
        env.mock
            .calls()
            .count("/csi.v1.GroupController/GroupControllerGetCapabilities"),
        1,
        "asked once at start-up"
    );
    assert_eq!(env.mock.calls().count(CREATE_GROUP), 0);
    child.start_kill().unwrap();
}

/// Upstream's snapshotter reads `--kubeconfig`, else the in-cluster configuration, and never
/// `$KUBECONFIG`; so does this one, and its help says so.
#[tokio::test]
async fn kubeconfig_comes_from_the_flag_only() {
    use testkit::process::{KubeconfigRead::*, kubeconfig_reads};
    let reads = kubeconfig_reads(BIN, &["--csi-address=/nonexistent/csi.sock"]).await;
    assert_eq!(reads, [Flag, InCluster, Flag]);
    let (_, help, _) = testkit::process::run_to_exit(BIN, &["--help"], WAIT).await;
    let rule = sidecar_kit::cluster::client::KubeconfigRule::FlagOnly;
    assert!(help.contains(rule.help()), "{help}");
}
