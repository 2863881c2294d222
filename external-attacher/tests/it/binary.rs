//! The real `csi-attacher` binary: flags, start-up, HTTP, leader election and exit codes.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use csi_proto::methods::identity::GET_PLUGIN_INFO;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use testkit::measure::{free_port, http_get};
use testkit::process::CleanEnv;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-attacher");

async fn run_to_exit(args: &[&str]) -> (i32, String, String) {
    testkit::process::run_to_exit(BIN, args, WAIT).await
}

async fn wait_exit(child: &mut Child) -> i32 {
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exits in time")
        .unwrap()
        .code()
        .unwrap_or(-1)
}

/// A running binary whose stderr is collected as it is written (a full pipe would block it).
struct Running {
    child: Child,
    stderr: tokio::task::JoinHandle<String>,
}

fn spawn(args: &[String]) -> Running {
    let mut child = Command::new(BIN)
        .clean_env()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text).await;
        text
    });
    Running { child, stderr }
}

impl Running {
    /// Waits for the exit; returns the code and everything written to stderr.
    async fn exit(mut self) -> (i32, String) {
        let code = wait_exit(&mut self.child).await;
        (code, self.stderr.await.unwrap())
    }
}

fn sigterm(child: &Child) {
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .clean_env()
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn version_and_flag_errors_exit_like_upstream() {
    let (code, stdout, _) = run_to_exit(&["--version"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        stdout.trim(),
        format!("{BIN} {}", env!("CARGO_PKG_VERSION"))
    );

    for bad in [
        &["--no-such-flag"][..],
        &["--feature-gates=Bogus=true"],
        &["-timeout=15"],
        &["--leader-election", "false"],
    ] {
        let (code, _, stderr) = run_to_exit(bad).await;
        assert_eq!(code, 2, "{bad:?}: {stderr}");
    }

    let (code, _, stderr) = run_to_exit(&["--worker-threads=0"]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("option -worker-threads must be greater than zero"),
        "{stderr}"
    );

    let (code, _, stderr) = run_to_exit(&[
        "--http-endpoint=127.0.0.1:0",
        "--metrics-address=127.0.0.1:0",
    ])
    .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("only one of"), "{stderr}");
}

#[tokio::test]
async fn serves_metrics_and_leader_health_attaches_and_releases_the_lease_on_sigterm() {
    let env = Env::without_controller(mock()).await;
    let port = free_port().unwrap();
    let args: Vec<String> = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("-csi-address={}", env.mock.endpoint()),
        "-leader-election".into(),
        format!("--leader-election-namespace={}", env.cluster.namespace()),
        format!("--http-endpoint=127.0.0.1:{port}"),
        "--v=5".into(),
        "--kube-api-qps=-1".into(),
    ];
    let running = spawn(&args);
    let health = eventually("the leader health check", || async {
        http_get(port, "/healthz/leader-election")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(health.1, "ok");

    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;

    let lease = eventually("the Lease", || async {
        Api::<Lease>::namespaced(env.client(), env.cluster.namespace())
            .get_opt(&env.lease_name())
            .await
            .unwrap()
            .filter(|l| {
                l.spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.as_deref())
                    .is_some_and(|h| !h.is_empty())
            })
    })
    .await;
    assert!(lease.spec.unwrap().lease_transitions.is_some());

    let (status, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for line in [
        &format!(
            r#"csi_sidecar_operations_seconds_count{{driver_name="{}",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume"}} 1"#,
            env.driver
        ),
        r#"workqueue_adds_total{name="csi-attacher-va"}"#,
        r#"workqueue_adds_total{name="csi-attacher-pv"}"#,
        r#"workqueue_depth{name="csi-attacher-va"} 0"#,
        r#"workqueue_queue_duration_seconds_bucket{name="csi-attacher-va","#,
        r#"workqueue_work_duration_seconds_count{name="csi-attacher-va"}"#,
        r#"workqueue_lane_depth{lane="attach",name="csi-attacher-va"} 0"#,
        r#"workqueue_lane_oldest_item_age_seconds{lane="detach",name="csi-attacher-va"} 0"#,
        "process_start_time_seconds",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    let (status, _) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 404);

    sigterm(&running.child);
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("GRPC call"), "-v=5 logs the calls");
    assert!(
        !stderr.contains("FramedRead"),
        "transport crates stay quiet"
    );
    let lease = Api::<Lease>::namespaced(env.client(), env.cluster.namespace())
        .get(&env.lease_name())
        .await
        .unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.unwrap_or_default(),
        "",
        "released on graceful exit"
    );
    env.stop().await;
}

#[tokio::test]
async fn metrics_address_serves_metrics_only() {
    let env = Env::without_controller(mock()).await;
    let port = free_port().unwrap();
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", env.mock.endpoint()),
        format!("--metrics-address=127.0.0.1:{port}"),
        "--metrics-path=/m".into(),
    ]);
    let (_, body) = eventually("metrics", || async {
        http_get(port, "/m").await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(body.contains("csi_sidecar_operations_seconds"), "{body}");
    let (status, _) = http_get(port, "/healthz/leader-election").await.unwrap();
    assert_eq!(status, 404);
    sigterm(&running.child);
    assert_eq!(running.exit().await.0, 0);
    env.stop().await;
}

#[tokio::test]
async fn identity_failures_exit_1() {
    let driver = mock();
    driver
        .faults()
        .fail_always(GET_PLUGIN_INFO, Code::Internal, "no info");
    let env = Env::without_controller(driver).await;
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", env.mock.endpoint()),
    ]);
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("GetPluginInfo failed"), "{stderr}");
    env.stop().await;
}

/// A mock driver in a runtime of its own, so that stopping it drops its connections at once,
/// as a killed driver process does.
struct KillableDriver {
    endpoint: String,
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KillableDriver {
    fn start(driver: testkit::mockdriver::MockDriver, dir: &std::path::Path) -> Self {
        let socket = dir.join("killable.sock");
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let handle = driver.serve_unix(&socket).await.unwrap();
                ready_tx.send(handle.endpoint()).unwrap();
                let _ = killed.await;
                std::mem::forget(handle);
            });
            drop(runtime);
        });
        let endpoint = ready.recv().unwrap();
        Self {
            endpoint,
            kill: Some(kill),
            thread: Some(thread),
        }
    }

    async fn kill(mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            tokio::task::spawn_blocking(move || thread.join().unwrap())
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn a_killed_driver_ends_the_sidecar_with_exit_1() {
    let env = Env::without_controller(mock()).await;
    let driver = KillableDriver::start(env.mock(), env.dir.path());
    let port = free_port().unwrap();
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", driver.endpoint),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ]);
    eventually("the HTTP endpoint", || async {
        http_get(port, "/metrics").await.filter(|(s, _)| *s == 200)
    })
    .await;
    driver.kill().await;
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("Lost connection to CSI driver, exiting"),
        "{stderr}"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_gracefully_restarted_driver_ends_the_sidecar_at_its_next_call() {
    let env = Env::without_controller(mock()).await;
    let socket = env.dir.path().join("graceful.sock");
    let first = env.mock().serve_unix(&socket).await.unwrap();
    let port = free_port().unwrap();
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", first.endpoint()),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ]);
    eventually("the HTTP endpoint", || async {
        http_get(port, "/metrics").await.filter(|(s, _)| *s == 200)
    })
    .await;
    first.shutdown().await.unwrap();
    // The driver comes back, possibly with other capabilities: the sidecar must not carry on
    // with what it learnt from the old one.
    let second = env.mock().serve_unix(&socket).await.unwrap();
    env.create_csinode("node-1", "nid-1").await;
    env.create_csi_pv("pv-1", "vol-x").await;
    env.create_pv_va("va-1", "pv-1", "node-1").await;
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("Lost connection to CSI driver, exiting"),
        "{stderr}"
    );
    assert_eq!(
        second
            .calls()
            .count(csi_proto::methods::controller::CONTROLLER_PUBLISH_VOLUME),
        0
    );
    second.shutdown().await.unwrap();
    env.stop().await;
}

#[tokio::test]
async fn losing_leadership_exits_1() {
    use testkit::apiserver::{RequestMatch, Verb};
    let env = Env::without_controller(mock()).await;
    if skip_on_real_cluster(&env, "it injects API faults") {
        return env.stop().await;
    }
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", env.mock.endpoint()),
        "--leader-election".into(),
        "--leader-election-namespace=default".into(),
        "--leader-election-lease-duration=3s".into(),
        "--leader-election-renew-deadline=2s".into(),
        "--leader-election-retry-period=500ms".into(),
    ]);
    eventually("leadership", || async {
        Api::<Lease>::namespaced(env.client(), "default")
            .get_opt("external-attacher-leader-hostpath-csi-k8s-io")
            .await
            .unwrap()
    })
    .await;
    // The API server refuses every renewal from now on.
    env.api_faults()
        .fail_next(RequestMatch::new(Verb::Update, "leases"), u32::MAX, 500);
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("lost leadership"), "{stderr}");
    env.api_faults().clear();
    env.stop().await;
}

#[tokio::test]
async fn a_migration_target_labels_its_calls_migrated() {
    const EBS: &str = "ebs.csi.aws.com";
    let env =
        Env::without_controller(testkit::mockdriver::MockDriver::builder().driver_name(EBS)).await;
    if skip_on_real_cluster(&env, "the migration target's driver name is fixed") {
        return env.stop().await;
    }
    let port = free_port().unwrap();
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", env.mock.endpoint()),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ]);
    env.create_csinode_for("node-1", EBS, "i-1").await;
    let handle = env.create_volume("ebs-1").await;
    env.create_pv(
        "pv-1",
        serde_json::json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "awsElasticBlockStore": {"volumeID": format!("aws://us-east-1a/{handle}")}}),
    )
    .await;
    env.create_va_for(
        "va-1",
        EBS,
        serde_json::json!({"persistentVolumeName": "pv-1"}),
        "node-1",
    )
    .await;
    env.wait_va("va-1", attached).await;

    let (status, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    for line in [
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Controller/ControllerPublishVolume",migrated="true"} 1"#,
        // The probe after switching to the migrated label, as upstream probes after reconnecting.
        r#"csi_sidecar_operations_seconds_count{driver_name="ebs.csi.aws.com",grpc_status_code="OK",method_name="/csi.v1.Identity/Probe",migrated="false"} 1"#,
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    assert!(
        !metrics.contains("GetPluginInfo"),
        "calls before the switch are dropped, as upstream's new registry drops them"
    );
    sigterm(&running.child);
    assert_eq!(running.exit().await.0, 0);
    env.stop().await;
}

/// A VolumeAttachment status patch the API server accepts and never answers, on a connection
/// it keeps open: the attachment whose patch hung is attached within a minute all the same,
/// its patch retried on a new connection.
#[tokio::test]
async fn a_status_patch_that_is_never_answered_does_not_stop_attaching() {
    use testkit::apiserver::{Hang, RequestMatch, Verb};
    let env = Env::without_controller(mock()).await;
    if skip_on_real_cluster(&env, "it injects API faults") {
        return env.stop().await;
    }
    let running = spawn(&[
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--csi-address={}", env.mock.endpoint()),
    ]);
    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;
    env.api_faults().hang_next(
        RequestMatch::new(Verb::Patch, "volumeattachments").subresource("status"),
        1,
        Hang::BeforeServing,
    );
    let handle = env.create_volume("vol-2").await;
    env.create_csi_pv("pv-2", &handle).await;
    env.create_pv_va("va-2", "pv-2", "node-1").await;
    let faults = env.api_faults();
    eventually("the hung status patch", || async {
        (faults.pending_hangs() == 0).then_some(())
    })
    .await;
    env.wait_va_within("va-2", Duration::from_secs(60), attached)
        .await;
    env.attached_volume(3).await;
    sigterm(&running.child);
    let (code, stderr) = running.exit().await;
    assert_eq!(code, 0, "{stderr}");
    env.stop().await;
}

/// Upstream's attacher reads `--kubeconfig`, else the in-cluster configuration, and never
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
