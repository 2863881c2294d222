//! No leaked snapshot: a CreateSnapshot whose content goes away before its answer is written
//! (force-deleted, or deleted while the snapshotter was down) gets its snapshot deleted, from
//! the intent journal after a restart.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sidecar_kit::workqueue::Backoff;
use testkit::mockdriver::MockDriver;
use tonic::Code;

/// Deletes the VolumeSnapshot, then takes the content's finalizer away (as an operator
/// force-deleting it would): the content is gone whatever the snapshotter does.
async fn force_delete(env: &Env, snapshot: &str, content: &str) {
    env.delete_snapshot(snapshot).await;
    env.content_until(content, "the content being deleted", |c| {
        c["metadata"]["deletionTimestamp"].is_string()
    })
    .await;
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    env.contents()
        .patch(content, &PatchParams::default(), &unfinalize)
        .await
        .unwrap();
    env.content_gone(content).await;
}

async fn journal_entries(env: &Env) -> usize {
    let api: Api<ConfigMap> = Api::namespaced(env.client(), env.ns());
    api.get_opt("snapshotter-journal")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .map_or(0, |d| d.len())
}

#[tokio::test]
async fn a_content_gone_during_its_create_snapshot_leaves_no_snapshot() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    env.mock.faults().hang(CREATE);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    eventually("the call at the driver", || async {
        (env.mock.calls().count(CREATE) >= 1).then_some(())
    })
    .await;
    assert_eq!(journal_entries(&env).await, 1, "recorded before the call");
    force_delete(&env, "snap", &name).await;
    env.mock.faults().release(CREATE);
    eventually("the orphan deleted", || async {
        (env.mock.calls().count(DELETE) == 1).then_some(())
    })
    .await;
    assert!(env.mock.state().snapshots.is_empty());
    eventually("the intent forgotten", || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_restart_deletes_the_snapshot_of_a_content_gone_meanwhile() {
    let mut env = Env::start(MockDriver::builder(), |c| {
        // No retry before the kill below.
        c.backoff = Backoff {
            start: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
    })
    .await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    // The driver cuts the snapshot but the answer is lost.
    env.mock
        .faults()
        .lose_answers(CREATE, 1, Code::DeadlineExceeded);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the lost answer reported", |c| {
        c["status"]["error"]["message"].is_string()
    })
    .await;
    assert_eq!(env.mock.state().snapshots.len(), 1);
    env.kill().await;
    force_delete(&env, "snap", &name).await;
    assert_eq!(
        env.mock.state().snapshots.len(),
        1,
        "nobody knows this snapshot now"
    );
    env.run();
    eventually("the orphan deleted after the restart", || async {
        env.mock.state().snapshots.is_empty().then_some(())
    })
    .await;
    eventually("the intent forgotten", || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
    assert_eq!(
        env.mock.calls().count(CREATE),
        2,
        "asked again to learn its id"
    );
    assert_eq!(env.mock.calls().count(DELETE), 1);
}

#[tokio::test]
async fn a_restart_lets_a_content_that_still_exists_carry_on() {
    let mut env = Env::start(MockDriver::builder(), |c| {
        c.backoff = Backoff {
            start: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
    })
    .await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    env.mock
        .faults()
        .lose_answers(CREATE, 1, Code::DeadlineExceeded);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the lost answer reported", |c| {
        c["status"]["error"]["message"].is_string()
    })
    .await;
    env.kill().await;
    env.run();
    let ready = env
        .content_until(&name, "the content ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    let snapshots = env.mock.state().snapshots;
    assert_eq!(snapshots.len(), 1);
    assert_eq!(
        ready["status"]["snapshotHandle"],
        snapshots.keys().next().unwrap().as_str()
    );
    eventually("the intent forgotten", || async {
        (journal_entries(&env).await == 0).then_some(())
    })
    .await;
}
