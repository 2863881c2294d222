//! The real `csi-external-health-monitor-controller` binary: its flags, its refusal of a driver
//! that cannot report volume conditions, and a start against the mock driver that reports an
//! abnormal volume, serves upstream's metrics and holds upstream's Lease.

use std::process::Stdio;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tokio::process::Command;

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_csi-external-health-monitor-controller");

#[tokio::test]
async fn help_lists_every_upstream_flag_and_bad_flags_exit_2() {
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--help"], WAIT).await;
    assert_eq!(code, 0);
    for flag in [
        "--csi-address",
        "--kubeconfig",
        "--monitor-interval",
        "--resync",
        "--timeout",
        "--list-volumes-interval",
        "--volume-list-add-interval",
        "--node-list-add-interval",
        "--worker-threads",
        "--enable-node-watcher",
        "--kube-api-qps",
        "--kube-api-burst",
        "--leader-election",
        "--leader-election-namespace",
        "--leader-election-lease-duration",
        "--leader-election-labels",
        "--http-endpoint",
        "--metrics-address",
        "--metrics-path",
        "--automaxprocs",
        "--version",
    ] {
        assert!(stdout.contains(flag), "{flag} missing from --help");
    }
    let (code, _, _) = testkit::process::run_to_exit(BIN, &["--workers=2"], WAIT).await;
    assert_eq!(code, 2);
    let (code, _, stderr) = testkit::process::run_to_exit(BIN, &["--worker-threads=0"], WAIT).await;
    assert_eq!(code, 1, "refused after parsing, as upstream's: {stderr}");
    assert!(
        stderr.contains("Option --worker-threads must be greater than zero"),
        "{stderr}"
    );
    let (code, stdout, _) = testkit::process::run_to_exit(BIN, &["--version"], WAIT).await;
    assert_eq!(code, 0);
    assert!(stdout.contains(env!("CARGO_PKG_VERSION")));
}

#[tokio::test]
async fn a_driver_without_volume_condition_is_refused_with_exit_1() {
    let mut env = Env::start(mock(true), |_| {}).await;
    env.stop().await;
    let dir = tempfile::tempdir().unwrap();
    let plain = MockDriver::builder()
        .volume_condition(false)
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let (code, _, stderr) = testkit::process::run_to_exit(
        BIN,
        &[
            &format!("--csi-address={}", plain.endpoint()),
            &format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
        ],
        WAIT,
    )
    .await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("does not implement VolumeCondition"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_binary_reports_an_abnormal_volume_serves_metrics_and_holds_its_lease() {
    // The in-process monitor is stopped at once: the binary does the work.
    let mut env = Env::start(mock(true), |_| {}).await;
    env.stop().await;
    let handle = env.bound_claim("bin").await;
    env.set_condition(&handle, Some("no path to the volume"));
    let port = free_port().unwrap();
    let mut child = Command::new(BIN)
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--leader-election".to_string(),
            format!("--leader-election-namespace={}", env.ns()),
            "--list-volumes-interval=1s".to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    env.events_until("bin", "the abnormal Event", |events| {
        events.iter().any(|(kind, reason, message, _)| {
            kind == "Warning"
                && reason == "VolumeConditionAbnormal"
                && message == "no path to the volume"
        })
    })
    .await;
    let metrics = eventually("the metrics", || async {
        http_get(port, "/metrics").await.map(|(_, body)| body)
    })
    .await;
    assert!(
        metrics.contains(&format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/ListVolumes\"}}",
            env.driver
        )),
        "{metrics}"
    );
    let (status, _) = http_get(port, "/healthz/leader-election").await.unwrap();
    assert_eq!(status, 200);
    let lease = format!(
        "external-health-monitor-leader-{}",
        env.driver.replace('.', "-")
    );
    let leases: Api<Lease> = Api::namespaced(env.client(), env.ns());
    assert!(leases.get(&lease).await.is_ok(), "Lease {lease}");
    child.start_kill().unwrap();
}

/// Upstream's health monitor reads `--kubeconfig`, else the in-cluster configuration, and never
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
