//! The real `csi-provisioner` binary killed with SIGKILL at random moments while hundreds of
//! claims are created and deleted, some of them while the driver loses its answers: afterwards
//! the driver holds exactly the volumes that PVs name. Prints its seed; `CRASH_SEED` replays one
//! run, `CRASH_ROUNDS` makes it longer.

#![cfg(unix)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::Duration;

use crate::common::{Env, eventually, mock};
use csi_proto::methods::controller::CREATE_VOLUME;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;
use testkit::process::CleanEnv;
use testkit::rng::{Rng, count_from_env, seed_from_env};
use tokio::process::{Child, Command};
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

fn spawn(env: &Env) -> Child {
    let mut command = Command::new(BIN);
    command
        .clean_env()
        .arg(format!(
            "--kubeconfig={}",
            env.cluster.kubeconfig_path().display()
        ))
        .arg(format!(
            "--csi-address={}",
            env.mock.socket_path().display()
        ))
        .arg(format!("--leader-election-namespace={}", env.namespace()))
        .args([
            "--retry-interval-start=50ms",
            "--retry-interval-max=1s",
            "--timeout=2s",
            "--kube-api-qps=-1",
            "-v=2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    testkit::process::die_with_parent(&mut command);
    command.spawn().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_leaks_no_volume() {
    let seed = seed_from_env("CRASH_SEED");
    let rounds = count_from_env("CRASH_ROUNDS", 25);
    println!("crash seed {seed}, {rounds} rounds");
    let mut rng = Rng::new(seed);
    let mut env = Env::without_controller(mock()).await;
    let class = env.create_class(json!({})).await;
    let mut live: Vec<String> = Vec::new();
    let (mut created, mut deleted, mut kills, mut lost) = (0u64, 0u64, 0u64, 0u64);
    let mut child = spawn(&env);
    for round in 0..rounds {
        for _ in 0..(4 + rng.below(8)) {
            let name = format!("c{round}-{created}");
            env.create_claim(&name, &class, json!({})).await;
            live.push(name);
            created += 1;
        }
        if rng.below(2) == 0 {
            let k = 1 + rng.below(4);
            env.mock
                .faults()
                .lose_answers(CREATE_VOLUME, k, Code::DeadlineExceeded);
            lost += k;
        }
        // Delete some claims, pending or bound.
        for _ in 0..rng.below(live.len() as u64 / 2 + 1) {
            let victim = live.swap_remove(rng.below(live.len() as u64) as usize);
            env.delete_claim(&victim).await;
            deleted += 1;
        }
        tokio::time::sleep(Duration::from_millis(20 + rng.below(300))).await;
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        kills += 1;
        child = spawn(&env);
    }
    // Faults off: everything must converge.
    env.mock.faults().reset();
    let pvcs = env.pvcs();
    for name in &live {
        env.wait_bound(name).await;
    }
    let pvs = env.pvs();
    let class_name = class.clone();
    let expected = live.len();
    let (leaked, orphaned) = eventually("the driver's volumes and the PVs to match", || {
        let pvs = pvs.clone();
        let class_name = class_name.clone();
        let mock_volumes: BTreeSet<String> = env.driver_volumes_by_id().into_iter().collect();
        async move {
            let ours: Vec<PersistentVolume> = pvs
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.storage_class_name.as_deref())
                        == Some(class_name.as_str())
                })
                .collect();
            let mut by_handle: BTreeMap<String, usize> = BTreeMap::new();
            for pv in &ours {
                if let Some(csi) = pv.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                    *by_handle.entry(csi.volume_handle.clone()).or_default() += 1;
                }
            }
            let leaked: Vec<String> = mock_volumes
                .iter()
                .filter(|v| !by_handle.contains_key(*v))
                .cloned()
                .collect();
            let orphaned: Vec<String> = by_handle
                .keys()
                .filter(|h| !mock_volumes.contains(*h))
                .cloned()
                .collect();
            let duplicated = by_handle.values().any(|n| *n > 1);
            (leaked.is_empty() && orphaned.is_empty() && !duplicated && ours.len() == expected)
                .then_some((leaked, orphaned))
        }
    })
    .await;
    let remaining = pvcs.list(&ListParams::default()).await.unwrap().items.len();
    println!(
        "crash verdict: seed {seed}: {created} claims created, {deleted} deleted, {kills} kills, {lost} lost answers; {} volumes for {remaining} claims; leaked {}, orphaned PVs {}",
        env.driver_volumes().len(),
        leaked.len(),
        orphaned.len()
    );
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    for name in &live {
        let _ = pvcs.delete(name, &DeleteParams::default()).await;
    }
    env.stop().await;
}
