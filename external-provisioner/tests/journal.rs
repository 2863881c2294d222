//! The intent journal: unanswered CreateVolume calls survive a crash of the provisioner and are
//! driven to a final state by the next one.

mod common;

use std::time::Duration;

use common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use external_provisioner::journal::{self, Location};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use serde_json::json;
use sidecar_kit::workqueue::Backoff;
use testkit::apiserver::counters::Verb;
use tonic::Code;

/// The journal's entries (claim UID → intent).
async fn entries(env: &Env) -> journal::Entries {
    Api::<ConfigMap>::namespaced(env.client(), &env.namespace())
        .get_opt("provisioner-journal")
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .unwrap_or_default()
}

/// Waits until the claim is gone for good, not merely being deleted (a real cluster holds it
/// until its pvc-protection finalizer goes): a provisioner that met it would finish its volume.
async fn wait_claim_gone(env: &Env, name: &str) {
    let pvcs = env.pvcs();
    eventually(&format!("claim {name} gone"), || {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt(name).await.unwrap().is_none().then_some(()) }
    })
    .await;
}

/// Provisioner A gets a lost answer for a CreateVolume that did create the volume, and crashes
/// before it repeats the call. Returns the claim's UID.
async fn crash_after_a_lost_answer(env: &mut Env, journal_on: bool) -> String {
    let mut config = env.config(&[]).await;
    if journal_on {
        config.journal = Some(env.journal_location());
    }
    // Retries far off, so that the crash comes first.
    config.backoff = Backoff {
        start: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    env.launch(config);
    env.mock
        .faults()
        .lose_answers(CREATE_VOLUME, 1, Code::DeadlineExceeded);
    let class = env.create_class(json!({})).await;
    let pvc = env.create_claim("data", &class, json!({})).await;
    let calls = env.mock.calls().clone();
    eventually("the CreateVolume whose answer is lost", || {
        let n = calls.count(CREATE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert_eq!(
        env.driver_volumes().len(),
        1,
        "the driver created the volume"
    );
    env.crash().await;
    pvc.metadata.uid.unwrap()
}

async fn restart_with_journal(env: &mut Env) {
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    env.launch(config);
}

#[tokio::test]
async fn a_crash_with_an_unanswered_create_and_a_deleted_claim_leaks_nothing() {
    let mut env = Env::without_controller(mock()).await;
    let uid = crash_after_a_lost_answer(&mut env, true).await;
    let recorded = entries(&env).await;
    let (intents, bad) = journal::decode::<journal::Intent>(&recorded);
    assert!(bad.is_empty());
    assert_eq!(intents.len(), 1, "the intent was recorded before the call");
    assert_eq!(intents[0].0, uid);
    assert_eq!(intents[0].1.prepared.request.name, format!("pvc-{uid}"));

    env.delete_claim("data").await;
    wait_claim_gone(&env, "data").await;
    restart_with_journal(&mut env).await;
    let calls = env.mock.calls().clone();
    eventually("the volume deleted by the next provisioner", || {
        let n = calls.count(DELETE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    assert!(env.driver_volumes().is_empty(), "no leaked volume");
    let creates = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(creates.len(), 2);
    assert_eq!(
        creates[0], creates[1],
        "the replay repeats the identical request"
    );
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn without_the_journal_the_same_crash_leaks_the_volume() {
    // Upstream's behaviour, and the proof that the test above can fail.
    let mut env = Env::without_controller(mock()).await;
    crash_after_a_lost_answer(&mut env, false).await;
    env.delete_claim("data").await;
    wait_claim_gone(&env, "data").await;
    let mut config = env.config(&[]).await;
    config.journal = None;
    env.launch(config);
    // The new provisioner has nothing to go on: the claim is gone and no PV names the volume.
    // Give it a claim to provision as a marker that it is running and has synced.
    let class = env.create_class(json!({})).await;
    env.create_claim("marker", &class, json!({})).await;
    env.wait_bound("marker").await;
    assert_eq!(env.driver_volumes().len(), 2, "the first volume leaked");
    env.stop().await;
}

#[tokio::test]
async fn a_crash_with_an_unanswered_create_and_a_live_claim_binds_it() {
    let mut env = Env::without_controller(mock()).await;
    crash_after_a_lost_answer(&mut env, true).await;
    restart_with_journal(&mut env).await;
    let pv = env.wait_bound("data").await;
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    assert_eq!(env.driver_volumes(), vec![handle], "exactly one volume");
    eventually("the intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn a_burst_costs_few_journal_writes() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(env.journal_location());
    config.workers = 50;
    env.launch(config);
    let class = env.create_class(json!({})).await;
    let claims = 100;
    // A burst: the claims of a StatefulSet scaled up at once, created concurrently.
    let creates = (0..claims).map(|i| {
        let env = &env;
        let class = class.clone();
        async move { env.create_claim(&format!("c{i}"), &class, json!({})).await }
    });
    futures::future::join_all(creates).await;
    for i in 0..claims {
        env.wait_bound(&format!("c{i}")).await;
    }
    eventually("every intent forgotten", || async {
        entries(&env).await.is_empty().then_some(())
    })
    .await;
    if let Some(counters) = env.cluster.counters() {
        let writes =
            counters.total(Verb::Create, "configmaps") + counters.total(Verb::Update, "configmaps");
        eprintln!("{writes} journal writes for {claims} claims");
        assert!(
            writes * 4 < claims,
            "{writes} journal writes for a burst of {claims} claims"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn a_journal_in_a_missing_namespace_turns_itself_off_and_provisioning_goes_on() {
    let mut env = Env::without_controller(mock()).await;
    let mut config = env.config(&[]).await;
    config.journal = Some(Location {
        namespace: format!("{}-missing", env.namespace()),
        name: "provisioner-journal".into(),
    });
    env.launch(config);
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    if let Some(counters) = env.cluster.counters() {
        assert_eq!(
            counters.total(Verb::Create, "configmaps"),
            1,
            "one refused create, then the journal is off"
        );
    }
    env.stop().await;
}
