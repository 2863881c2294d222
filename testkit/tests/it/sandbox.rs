//! The sandbox, for a bounded time: every sidecar binary that is built must reach its end state,
//! also when started from a shell whose environment points at another cluster.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use testkit::apiserver::ApiServer;
use testkit::sandbox::{self, Outcome, SandboxOptions};

fn bin_dir() -> PathBuf {
    testkit::process::target_bin_dir().expect("the test binary is in target/<profile>/deps")
}

/// Asserts that every step reached its end state; `outcome` gives a step's outcome by name.
fn assert_end_state(bin_dir: &Path, outcome: impl Fn(&str) -> Option<Outcome>) {
    for step in ["api-server", "mock-driver", "volume"] {
        let got = outcome(step);
        assert!(matches!(got, Some(Outcome::Ok(_))), "{step}: {got:?}");
    }
    // CI builds the whole workspace, so there every sidecar must run; a partial build skips some.
    let require_all = std::env::var_os("CI").is_some();
    for (step, binaries) in [
        ("livenessprobe", &["livenessprobe"][..]),
        ("node-driver-registrar", &["csi-node-driver-registrar"]),
        ("external-attacher", &["csi-attacher"]),
        // The resizer grows the claim's volume.
        ("external-resizer", &["csi-resizer"]),
        // The snapshotter cuts a snapshot of it...
        ("external-snapshotter", &["csi-snapshotter"]),
        // ...which the provisioner restores into a new claim.
        ("restore", &["csi-provisioner", "csi-snapshotter"]),
        // The driver reports the claim's volume abnormal, then healthy again.
        (
            "external-health-monitor",
            &["csi-external-health-monitor-controller"],
        ),
        // With capacity tracking: the CSIStorageCapacity of a late-binding class.
        ("capacity", &["csi-provisioner"]),
        // Two snapshots of a block claim: csi-snapshot-metadata lists, to a backup client over
        // TLS, the blocks written between them and those allocated in the second, as written.
        (
            "changed blocks",
            &["csi-snapshot-metadata", "csi-snapshotter"],
        ),
    ] {
        let built = binaries.iter().all(|b| bin_dir.join(b).is_file());
        let binary = binaries.join(" and ");
        match outcome(step) {
            Some(Outcome::Ok(_)) => {}
            Some(Outcome::Skipped(why)) if !built && !require_all => {
                println!("{step} skipped: {why}")
            }
            None if !built && !require_all => println!("{step} skipped: {binary} not built"),
            other => panic!("{step}: {other:?} (binary built: {built})"),
        }
    }
}

#[tokio::test]
async fn sandbox_reaches_its_end_state() {
    let work = tempfile::tempdir().unwrap();
    let options = SandboxOptions {
        bin_dir: bin_dir(),
        work_dir: work.path().to_path_buf(),
        capacity: true,
        ..SandboxOptions::default()
    };
    let running = sandbox::start(&options).await.unwrap();
    assert_end_state(&options.bin_dir, |step| running.outcome(step).cloned());
    running.stop().await;
}

/// The steps the sandbox binary printed (`[ok  ] name: text`, `[skip] ...`, `[FAIL] ...`).
fn printed_steps(stdout: &str) -> Vec<(String, Outcome)> {
    stdout
        .lines()
        .filter_map(|line| {
            let (mark, rest) = line.strip_prefix('[')?.split_once("] ")?;
            let (name, text) = rest.split_once(": ")?;
            let text = text.to_string();
            let outcome = match mark.trim_end() {
                "ok" => Outcome::Ok(text),
                "skip" => Outcome::Skipped(text),
                "FAIL" => Outcome::Failed(text),
                _ => return None,
            };
            Some((name.to_string(), outcome))
        })
        .collect()
}

/// A shell set up for the user's own cluster: `KUBECONFIG` names it (here a second server, so
/// that any request reaching it is seen), and the namespace and node variables a sidecar reads
/// name things the sandbox does not have. The sandbox binary must still run every sidecar
/// against its own server, and nothing may reach the other one.
#[tokio::test]
async fn the_sandbox_ignores_the_callers_cluster_environment() {
    let elsewhere = ApiServer::start().await.unwrap();
    let bin_dir = bin_dir();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_sandbox"));
    command
        .args(["--no-build", "--capacity", "--duration=1s", "--bin-dir"])
        .arg(&bin_dir)
        .env("KUBECONFIG", elsewhere.kubeconfig_path())
        .env("POD_NAMESPACE", "not-the-sandbox")
        .env("NAMESPACE", "not-the-sandbox")
        .env("NODE_NAME", "not-the-sandbox-node")
        .env("POD_NAME", "not-the-sandbox-pod")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    testkit::process::die_with_parent(&mut command);
    let output = tokio::time::timeout(
        Duration::from_secs(300),
        command.spawn().unwrap().wait_with_output(),
    )
    .await
    .expect("the sandbox stops within 300 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    // Shown when an assertion fails.
    println!(
        "sandbox {}\nstdout:\n{stdout}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let steps = printed_steps(&stdout);
    assert_end_state(&bin_dir, |step| {
        steps
            .iter()
            .find(|(name, _)| name == step)
            .map(|(_, outcome)| outcome.clone())
    });
    assert!(output.status.success(), "the sandbox failed");
    let reached = elsewhere.counters().snapshot();
    assert!(
        reached.is_empty(),
        "requests reached the cluster of $KUBECONFIG: {reached:?}"
    );
}
