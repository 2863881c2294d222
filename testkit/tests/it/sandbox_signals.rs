//! The sandbox binary's sidecars stop with it: on SIGTERM, SIGINT and SIGHUP, and when it is
//! killed outright.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use testkit::process::{CleanEnv, die_with_parent, has_ended, wait_until};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const SIDECARS: [&str; 7] = [
    "livenessprobe",
    "csi-node-driver-registrar",
    "csi-attacher",
    "csi-resizer",
    "csi-snapshotter",
    "csi-provisioner",
    "csi-external-health-monitor-controller",
];

/// Stand-ins for the sidecar binaries: they run until killed and never answer, so the sandbox
/// is still waiting for its first step when the signal comes.
fn stand_ins(dir: &Path) {
    for name in SIDECARS {
        let path = dir.join(name);
        std::fs::write(&path, "#!/bin/sh\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Starts the sandbox and waits until it reports a pid for each sidecar.
async fn sandbox_with_children(bin_dir: &Path) -> (Child, Vec<u32>) {
    let mut child = die_with_parent(
        Command::new(env!("CARGO_BIN_EXE_sandbox"))
            .clean_env()
            .args(["--no-build", "--bin-dir"])
            .arg(bin_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true),
    )
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    let started = tokio::time::timeout(Duration::from_secs(60), async {
        while pids.len() < SIDECARS.len() {
            let line = lines.next_line().await.unwrap().expect("the sandbox runs");
            if let Some(pid) = line
                .strip_prefix("started ")
                .and_then(|rest| rest.split_once("(pid "))
                .and_then(|(_, pid)| pid.strip_suffix(')'))
            {
                pids.push(pid.parse().unwrap());
            }
        }
    })
    .await;
    assert!(started.is_ok(), "the sandbox reported {pids:?} only");
    // Keep reading so that the sandbox never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    assert!(pids.iter().all(|&pid| !has_ended(pid)));
    (child, pids)
}

fn all_ended(pids: &[u32]) -> bool {
    wait_until(Duration::from_secs(20), || {
        pids.iter().all(|&pid| has_ended(pid))
    })
}

#[tokio::test]
async fn sidecars_stop_when_the_sandbox_is_told_to_stop() {
    let bin_dir = tempfile::tempdir().unwrap();
    stand_ins(bin_dir.path());
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let (mut sandbox, pids) = sandbox_with_children(bin_dir.path()).await;
        let pid = sandbox.id().unwrap() as libc::pid_t;
        // SAFETY: kill has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let exited = tokio::time::timeout(Duration::from_secs(30), sandbox.wait()).await;
        assert!(
            exited.is_ok(),
            "the sandbox did not exit on signal {signal}"
        );
        assert!(
            all_ended(&pids),
            "signal {signal}: children {pids:?} outlived the sandbox"
        );
    }
}

#[tokio::test]
async fn sidecars_die_with_a_killed_sandbox() {
    let bin_dir = tempfile::tempdir().unwrap();
    stand_ins(bin_dir.path());
    let (mut sandbox, pids) = sandbox_with_children(bin_dir.path()).await;
    sandbox.kill().await.unwrap();
    assert!(
        all_ended(&pids),
        "children {pids:?} outlived the killed sandbox"
    );
}
