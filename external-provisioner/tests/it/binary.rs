//! The real `csi-provisioner` binary: flags, start-up, HTTP, metrics and leader election.

#![cfg(unix)]

use std::process::Stdio;

use crate::common::{Env, WAIT, eventually, mock};
use external_provisioner::model::lease_name;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use serde_json::json;
use testkit::measure::{free_port, http_get};
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

async fn run_to_exit(args: &[&str]) -> (i32, String, String) {
    testkit::process::run_to_exit(BIN, args, WAIT).await
}

fn spawn(env: &Env, extra: &[String]) -> Child {
    env.binary()
        .arg(format!("--leader-election-namespace={}", env.namespace()))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn version_help_and_flag_errors() {
    let (code, stdout, _) = run_to_exit(&["--version"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        stdout.trim(),
        format!("{BIN} {}", env!("CARGO_PKG_VERSION"))
    );

    let (code, help, _) = run_to_exit(&["--help"]).await;
    assert_eq!(code, 0);
    for flag in [
        "--csi-address",
        "--kubeconfig",
        "--master",
        "--volume-name-prefix",
        "--volume-name-uuid-length",
        "--retry-interval-start",
        "--retry-interval-max",
        "--worker-threads",
        "--cloning-protection-threads",
        "--snapshot-orphan-sweep-interval",
        "--capacity-threads",
        "--timeout",
        "--strict-topology",
        "--immediate-topology",
        "--extra-create-metadata",
        "--enable-pprof",
        "--default-fstype",
        "--kube-api-qps",
        "--kube-api-burst",
        "--kube-api-capacity-qps",
        "--kube-api-capacity-burst",
        "--enable-capacity",
        "--capacity-for-immediate-binding",
        "--capacity-poll-interval",
        "--capacity-ownerref-level",
        "--node-deployment",
        "--node-deployment-immediate-binding",
        "--node-deployment-base-delay",
        "--node-deployment-max-delay",
        "--controller-publish-readonly",
        "--prevent-volume-mode-conversion",
        "--feature-gates",
        "--leader-election",
        "--leader-election-namespace",
        "--leader-election-lease-duration",
        "--leader-election-renew-deadline",
        "--leader-election-retry-period",
        "--leader-election-labels",
        "--http-endpoint",
        "--metrics-address",
        "--metrics-path",
        "--automaxprocs",
        "--logging-format",
        "--vmodule",
        "--version",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }

    for bad in [
        &["--no-such-flag"][..],
        &["--feature-gates=Bogus=true"],
        &["--timeout=15"],
        &["--strict-topology", "false"],
    ] {
        let (code, _, stderr) = run_to_exit(bad).await;
        assert_eq!(code, 2, "{bad:?}: {stderr}");
    }
    let (code, _, stderr) = run_to_exit(&["--worker-threads=0"]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("--worker-threads must be greater than zero"),
        "{stderr}"
    );

    // Removed flags are warned about, not refused: start-up goes on (and fails later here, on
    // the missing kubeconfig).
    let (code, _, stderr) = run_to_exit(&[
        "--provisioner=x",
        "--enable-leader-election",
        "--kubeconfig=/nonexistent/kubeconfig",
    ])
    .await;
    assert_eq!(code, 1);
    assert!(stderr.contains("--provisioner was removed"), "{stderr}");
    assert!(stderr.contains("use --leader-election"), "{stderr}");
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

#[tokio::test]
async fn provisions_and_serves_metrics() {
    let mut env = Env::without_controller(mock()).await;
    let port = free_port().unwrap();
    let mut child = spawn(
        &env,
        &[
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--enable-pprof".into(),
        ],
    );
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    let metrics = eventually("metrics with the provisioning counted", || async {
        let (status, body) = http_get(port, "/metrics").await?;
        (status == 200 && body.contains("controller_persistentvolumeclaim_provision_total"))
            .then_some(body)
    })
    .await;
    assert!(
        metrics.contains(&format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/CreateVolume\"}} 1",
            env.driver
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "controller_persistentvolumeclaim_provision_total{{class=\"{class}\",source=\"\"}} 1"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("workqueue_adds_total{name=\"claims\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("workqueue_depth{name=\"volumes\"}"),
        "{metrics}"
    );
    let (status, _) = http_get(port, "/debug/pprof/").await.unwrap();
    assert_eq!(status, 404);
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    env.stop().await;
}

#[tokio::test]
async fn leads_under_its_lease_and_releases_it_on_sigterm() {
    let mut env = Env::without_controller(mock()).await;
    let child = spawn(&env, &["--leader-election".to_string()]);
    let leases: Api<Lease> = Api::namespaced(env.client(), &env.namespace());
    eventually("the Lease named after the driver", || async {
        leases
            .get_opt(&lease_name(&env.driver))
            .await
            .unwrap()?
            .spec?
            .holder_identity
    })
    .await;
    let class = env.create_class(json!({})).await;
    env.create_claim("one", &class, json!({})).await;
    env.wait_bound("one").await;
    let pid = child.id().unwrap().to_string();
    assert!(
        std::process::Command::new("kill")
            .clean_env()
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let status = tokio::time::timeout(WAIT, wait(child)).await.unwrap();
    assert_eq!(status, Some(0), "a graceful stop");
    let lease = leases.get(&lease_name(&env.driver)).await.unwrap();
    assert_eq!(
        lease
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default(),
        "",
        "released"
    );
    env.stop().await;
}

async fn wait(mut child: Child) -> Option<i32> {
    child.wait().await.ok()?.code()
}

/// Requests the API server accepts and never answers, on connections it keeps open (as a
/// black-holed network leaves them): the journal's update, an Event and a PV create, one after
/// another. Each costs its claim one timed-out call, retried on a new connection: the claim
/// whose request hung and the claim after it are both provisioned within a minute.
#[tokio::test]
async fn requests_that_are_never_answered_do_not_stop_provisioning() {
    use testkit::apiserver::{Hang, RequestMatch, Verb};
    let mut env = Env::without_controller(mock()).await;
    let Some(faults) = env.cluster.faults() else {
        eprintln!("skipped on a real cluster: it injects API server faults");
        return env.stop().await;
    };
    let mut child = spawn(&env, &["--retry-interval-max=1s".to_string()]);
    let class = env.create_class(json!({})).await;
    env.create_claim("warm", &class, json!({})).await;
    env.wait_bound("warm").await;
    let journal = format!("{}-journal", lease_name(&env.driver));
    let limit = std::time::Duration::from_secs(60);
    for (n, (what, on, at)) in [
        (
            "the journal's update (written, never answered)",
            RequestMatch::new(Verb::Update, "secrets").name(&journal),
            Hang::AfterServing,
        ),
        (
            "an Event",
            RequestMatch::new(Verb::Create, "events"),
            Hang::BeforeServing,
        ),
        (
            "a PV create",
            RequestMatch::new(Verb::Create, "persistentvolumes"),
            Hang::BeforeServing,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        faults.hang_next(on, 1, at);
        let hung = format!("hung-{n}");
        env.create_claim(&hung, &class, json!({})).await;
        eventually(&format!("the hang of {what}"), || async {
            (faults.pending_hangs() == 0).then_some(())
        })
        .await;
        let next = format!("next-{n}");
        env.create_claim(&next, &class, json!({})).await;
        env.wait_bound_within(&hung, limit).await;
        env.wait_bound_within(&next, limit).await;
        env.wait_event(&next, "ProvisioningSucceeded", "").await;
    }
    assert_eq!(env.driver_volumes().len(), 7, "one volume per claim");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    env.stop().await;
}

/// One client of the attack: sends part of a request (a header of `padding` bytes, never
/// finished), then a byte every 200 ms until the server closes the connection; how long it was
/// kept open.
async fn hold_a_partial_request(port: u16, padding: usize) -> std::time::Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = std::time::Instant::now();
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return started.elapsed();
    };
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
        "a".repeat(padding)
    );
    let (mut reader, mut writer) = stream.split();
    let mut buffer = [0u8; 512];
    let closed = async {
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    let trickle = async {
        let _ = writer.write_all(head.as_bytes()).await;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let _ = writer.write_all(b"a").await;
        }
    };
    tokio::select! {
        _ = closed => {}
        _ = trickle => {}
    }
    started.elapsed()
}

/// Whoever reaches `--http-endpoint` (any pod, in most clusters) opens 300 connections, half of
/// them sending a 256 KiB header, half trickling one: every one is closed within the header
/// timeout (10 s), the process grows by less than 8 MiB, and the leader health check answers
/// throughout.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn slow_and_bloated_http_clients_cannot_exhaust_the_endpoint() {
    use std::time::{Duration, Instant};
    use testkit::measure::{clock_ticks, usage};
    let env = Env::without_controller(mock()).await;
    let port = free_port().unwrap();
    let mut child = spawn(
        &env,
        &[
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--leader-election".into(),
        ],
    );
    let pid = child.id().unwrap();
    eventually("the leader health check", || async {
        http_get(port, "/healthz/leader-election")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let ticks = clock_ticks();
    let before = usage(pid, ticks).rss_kib;
    let attackers: Vec<_> = (0..300)
        .map(|n| {
            let padding = if n % 2 == 0 { 256 * 1024 } else { 16 };
            tokio::spawn(hold_a_partial_request(port, padding))
        })
        .collect();
    let started = Instant::now();
    let mut peak = before;
    let mut probes = 0;
    while attackers.iter().any(|a| !a.is_finished()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "attack connections still open"
        );
        let probe = http_get(port, "/healthz/leader-election").await;
        assert_eq!(
            probe.map(|(status, _)| status),
            Some(200),
            "probe {probes} during the attack"
        );
        probes += 1;
        peak = peak.max(usage(pid, ticks).rss_kib);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for attacker in attackers {
        let held = attacker.await.unwrap();
        assert!(held < Duration::from_secs(15), "a connection held {held:?}");
    }
    let growth = peak.saturating_sub(before);
    eprintln!("RSS {before} KiB before, {peak} KiB at the peak; {probes} probes answered");
    assert!(growth < 8 * 1024, "RSS grew by {growth} KiB");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    env.stop().await;
}

/// Upstream's provisioner lets `$KUBECONFIG` win over `--kubeconfig`; so does this one, and its
/// help says so.
#[tokio::test]
async fn kubeconfig_from_the_environment_wins_over_the_flag() {
    use testkit::process::{KubeconfigRead::*, kubeconfig_reads};
    let reads = kubeconfig_reads(BIN, &["--csi-address=/nonexistent/csi.sock"]).await;
    assert_eq!(reads, [Environment, Environment, Flag]);
    let (_, help, _) = testkit::process::run_to_exit(BIN, &["--help"], WAIT).await;
    let rule = sidecar_kit::cluster::client::KubeconfigRule::EnvironmentFirst;
    assert!(help.contains(rule.help()), "{help}");
}

/// Replaces a token file as the kubelet does: a new file renamed over the old.
fn write_token(path: &std::path::Path, token: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, token).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// A projected service-account token rotated while the provisioner runs: the kubelet puts a
/// new file in place of the old, and the API server refuses the old token from then on. The
/// provisioner goes on leading and provisioning past its renew deadline, without a restart.
#[tokio::test]
async fn a_rotated_service_account_token_is_used_without_a_restart() {
    use std::time::{Duration, Instant};
    use testkit::apiserver::kubeconfig_with_token_file;
    let mut env = Env::without_controller(mock()).await;
    let Some(url) = env.cluster.server().map(|server| server.url()) else {
        eprintln!("skipped on a real cluster: it rotates the API server's tokens");
        return env.stop().await;
    };
    let accept = |env: &Env, tokens| {
        if let Some(server) = env.cluster.server() {
            server.accept_tokens(tokens);
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    write_token(&token, "sa-token-1");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_with_token_file(&url, &token)).unwrap();
    accept(&env, Some(&["sa-token-1"]));
    let mut command = Command::new(BIN);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--csi-address={}",
            env.mock.socket_path().display()
        ))
        .arg("--leader-election")
        .arg(format!("--leader-election-namespace={}", env.namespace()));
    let mut child = testkit::process::spawn_sidecar(&mut command, Stdio::null()).unwrap();
    let class = env.create_class(json!({})).await;
    env.create_claim("before", &class, json!({})).await;
    env.wait_bound("before").await;
    let leases: Api<Lease> = Api::namespaced(env.client(), &env.namespace());
    let holder = |lease: Lease| lease.spec?.holder_identity.filter(|h| !h.is_empty());
    let leader = holder(leases.get(&lease_name(&env.driver)).await.unwrap()).unwrap();

    write_token(&token, "sa-token-2");
    accept(&env, Some(&["sa-token-2"]));
    let rotated = Instant::now();
    env.create_claim("after", &class, json!({})).await;
    env.wait_bound("after").await;
    // Past the renew deadline (10 s): a provisioner refused that long would have lost its Lease.
    while rotated.elapsed() < Duration::from_secs(12) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let renewed = leases.get(&lease_name(&env.driver)).await.unwrap();
    let renew_time = renewed.spec.as_ref().and_then(|s| s.renew_time.clone());
    assert_eq!(holder(renewed), Some(leader), "still the leader");
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(renew_time.unwrap().0);
    assert!(
        age < k8s_openapi::jiff::SignedDuration::from_secs(10),
        "renewed {age:?} ago"
    );
    assert!(child.try_wait().unwrap().is_none(), "still running");
    accept(&env, None);
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    env.stop().await;
}
