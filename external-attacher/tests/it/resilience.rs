//! The reconciler, leader election, restarts and broken watches.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use csi_proto::methods::controller::{CONTROLLER_PUBLISH_VOLUME, LIST_VOLUMES};
use external_attacher::controller::{self, Reconcile};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use sidecar_kit::cluster::leader::{ElectionConfig, LeaderElector};
use testkit::mockdriver::MockHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;

#[tokio::test]
async fn the_reconciler_repairs_an_attachment_the_driver_forgot() {
    let env = Env::start(mock(), |c| {
        c.reconcile = Some(Reconcile {
            period: Duration::from_millis(200),
            max_entries: 2,
        })
    })
    .await;
    env.create_csinode("node-1", "nid-1").await;
    for n in 1..=3 {
        env.attached_volume(n).await;
    }
    let forgotten = env
        .pvs()
        .get(&env.n("pv-2"))
        .await
        .unwrap()
        .spec
        .unwrap()
        .csi
        .unwrap()
        .volume_handle;
    // An invalid page token in the middle of a pass: the listing starts over.
    let lists = env.mock.calls().count(LIST_VOLUMES);
    env.mock
        .faults()
        .fail_nth(LIST_VOLUMES, lists + 2, Code::Aborted, "stale token");
    env.mock
        .update_state(|state| state.volumes.get_mut(&forgotten).unwrap().published.clear())
        .unwrap();
    eventually("the volume to be published again", || async {
        env.mock.state().volumes[&forgotten]
            .published
            .contains_key("nid-1")
            .then_some(())
    })
    .await;
    let publishes = requests(&env.mock, CONTROLLER_PUBLISH_VOLUME);
    let repeated: BTreeMap<String, usize> =
        publishes.iter().fold(BTreeMap::new(), |mut counts, r| {
            *counts
                .entry(r["volume_id"].as_str().unwrap().to_string())
                .or_default() += 1;
            counts
        });
    assert_eq!(repeated[&forgotten], 2, "{repeated:?}");
    assert_eq!(
        repeated.values().sum::<usize>(),
        4,
        "only the forgotten one again"
    );
    env.stop().await;
}

fn election(env: &Env, identity: &str) -> ElectionConfig {
    ElectionConfig {
        lease_name: env.lease_name(),
        namespace: env.cluster.namespace().into(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(250),
        labels: BTreeMap::new(),
        release_on_exit: false,
        event_source: format!("external-attacher-leader-{}/{identity}", env.driver),
        warm_standby: false,
    }
}

struct Candidate {
    mock: MockHandle,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn candidate(env: &Env, identity: &str) -> Candidate {
    let dir = tempfile::tempdir().unwrap();
    let mock = mock()
        .driver_name(env.driver.clone())
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let csi = csi_client(&mock).await;
    let config = test_config_for(&csi, &default_cli(), &env.driver).await;
    let elector = LeaderElector::new(env.client(), election(env, identity));
    let client = env.client();
    let task = tokio::spawn(async move {
        let _ = elector
            .run(CancellationToken::new(), |leading| {
                controller::run(config, client, csi, leading)
            })
            .await;
    });
    Candidate {
        mock,
        task,
        _dir: dir,
    }
}

async fn holder(env: &Env) -> Option<String> {
    Api::<Lease>::namespaced(env.client(), env.cluster.namespace())
        .get_opt(&env.lease_name())
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test]
async fn only_the_leader_attaches_and_another_replica_takes_over() {
    let env = Env::without_controller(mock()).await;
    env.create_csinode("node-1", "nid-1").await;
    let a = candidate(&env, "replica-a").await;
    let b = candidate(&env, "replica-b").await;
    let leader = eventually("a leader", || holder(&env)).await;
    let (leader, follower) = if leader == "replica-a" {
        (a, b)
    } else {
        (b, a)
    };

    // Both mocks know the same volumes under the same IDs.
    let mut handles = Vec::new();
    for name in ["one", "two"] {
        let mut ids = Vec::new();
        for mock in [&leader.mock, &follower.mock] {
            let id = create_volume(&csi_client(mock).await, name).await;
            ids.push(id);
        }
        assert_eq!(ids[0], ids[1]);
        handles.push(ids.remove(0));
    }
    env.create_csi_pv("pv-1", &handles[0]).await;
    env.create_pv_va("va-1", "pv-1", "node-1").await;
    env.wait_va("va-1", attached).await;
    assert_eq!(leader.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 1);
    assert_eq!(follower.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 0);

    // The leader crashes without releasing the Lease; the other takes over once it expires.
    let old = holder(&env).await;
    leader.task.abort();
    let _ = leader.task.await;
    eventually("a new leader", || async {
        holder(&env).await.filter(|h| Some(h) != old.as_ref())
    })
    .await;
    env.create_csi_pv("pv-2", &handles[1]).await;
    env.create_pv_va("va-2", "pv-2", "node-1").await;
    env.wait_va("va-2", attached).await;
    // The new leader publishes va-2; its reconciler also publishes va-1 again, since this
    // replica's driver never saw it.
    let published: Vec<String> = requests(&follower.mock, CONTROLLER_PUBLISH_VOLUME)
        .iter()
        .map(|r| r["volume_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(published.iter().filter(|v| **v == handles[1]).count(), 1);
    assert_eq!(leader.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 1);
    follower.task.abort();
    env.stop().await;
}

#[tokio::test]
async fn a_restart_in_the_middle_of_an_attach_ends_attached_once() {
    let mut env = Env::without_controller(mock()).await;
    let config = test_config_for(&env.csi, &default_cli(), &env.driver).await;
    env.create_csinode("node-1", "nid-1").await;
    env.mock.faults().hang(CONTROLLER_PUBLISH_VOLUME);
    let first = Replica::start(config.clone(), env.client(), env.csi.clone());
    let handle = env.create_volume("v").await;
    env.create_csi_pv("pv-r", &handle).await;
    env.create_pv_va("va-r", "pv-r", "node-1").await;
    assert!(
        env.mock
            .calls()
            .wait_for_count(CONTROLLER_PUBLISH_VOLUME, 1, WAIT)
            .await
    );
    first.kill().await;

    env.mock.faults().release(CONTROLLER_PUBLISH_VOLUME);
    env = env.with_controller(config);
    let va = env.wait_va("va-r", attached).await;
    assert_eq!(finalizers(&va.metadata), [env.finalizer()]);
    assert_eq!(
        va.metadata.annotations.as_ref().unwrap()[NODE_ID_ANNOTATION],
        "nid-1"
    );
    let pv = env.pvs().get(&env.n("pv-r")).await.unwrap();
    assert_eq!(pv_finalizers(&pv.metadata), [env.finalizer()]);
    assert!(
        env.mock.state().volumes[&handle]
            .published
            .contains_key("nid-1")
    );

    env.delete_va("va-r").await;
    env.wait_va_gone("va-r").await;
    assert!(env.mock.state().volumes[&handle].published.is_empty());
    env.stop().await;
}

#[tokio::test]
async fn closed_and_expired_watches_are_resumed() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;
    if skip_on_real_cluster(&env, "it closes watches and compacts the history") {
        return env.stop().await;
    }
    let faults = env.api_faults();
    faults.close_watches(None);
    env.attached_volume(2).await;
    // History lost: the watches must list again.
    faults.compact_history();
    faults.close_watches(None);
    env.attached_volume(3).await;
    env.delete_va("va-1").await;
    env.wait_va_gone("va-1").await;
    env.stop().await;
}
