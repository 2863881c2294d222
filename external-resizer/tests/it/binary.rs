//! The real `csi-resizer` binary: its flags, and a start against the mock driver that
//! serves metrics with upstream's names and expands a claim.

use std::process::Stdio;

use crate::common::*;
use serde_json::json;
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_csi-resizer");

#[tokio::test]
async fn help_lists_every_upstream_flag_and_bad_flags_exit_2() {
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--help"], WAIT).await;
    assert_eq!(code, 0);
    for flag in [
        "--csi-address",
        "--kubeconfig",
        "--master",
        "--resync-period",
        "--workers",
        "--extra-modify-metadata",
        "--timeout",
        "--retry-interval-start",
        "--retry-interval-max",
        "--handle-volume-inuse-error",
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
    let (code, _, _) = testkit::process::run_to_exit(BIN, &["--worker-threads=2"], WAIT).await;
    assert_eq!(code, 2);
    let (code, _, stderr) =
        testkit::process::run_to_exit(BIN, &["--feature-gates=NoSuchGate=true"], WAIT).await;
    assert_eq!(code, 1, "set after parsing, as upstream's: {stderr}");
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--version"], WAIT).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn the_binary_expands_a_claim_and_serves_upstreams_metrics() {
    // The in-process resizer is stopped at once: the binary does the work.
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.stop().await;
    let port = free_port().unwrap();
    let mut child = Command::new(BIN)
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--handle-volume-inuse-error=false".to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    env.bound_claim("bin", GI, true, json!({})).await;
    env.request("bin", "2Gi").await;
    env.claim_until("bin", "the expansion", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    let metrics = eventually("the metrics", || async {
        http_get(port, "/metrics").await.map(|(_, body)| body)
    })
    .await;
    assert!(metrics.contains(&format!(
        "csi_sidecar_operations_seconds_count{{driver_name=\"{}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/ControllerExpandVolume\"}} 1",
        env.driver
    )), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "workqueue_adds_total{{name=\"{}-pvc\"}}",
            env.driver
        )),
        "{metrics}"
    );
    child.start_kill().unwrap();
}

/// Upstream's resizer reads `--kubeconfig`, else the in-cluster configuration, and never
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
