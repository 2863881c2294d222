//! No leaked snapshot: a CreateSnapshot whose content goes away before its answer is written
//! (force-deleted, or deleted while the snapshotter was down) gets its snapshot deleted, from
//! the intent journal after a restart.

use std::time::Duration;

use crate::common::*;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use sidecar_kit::pipeline::workqueue::Backoff;
use testkit::mockdriver::MockDriver;
use tonic::Code;

/// Deletes the VolumeSnapshot, then takes the content's finalizer away (as an operator
/// force-deleting it would): the content is gone whatever the snapshotter does.
async fn force_delete(env: &Env, snapshot: &str, content: &str) {
    env.delete_snapshot(snapshot).await;
    unfinalize(env, content).await;
}

/// Takes the finalizers away from a content being deleted, and waits until it is gone.
async fn unfinalize(env: &Env, content: &str) {
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

/// A snapshotter that does not retry a failed call within a test's time.
async fn without_retries() -> Env {
    Env::start(MockDriver::builder(), |c| {
        c.backoff = Backoff {
            start: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
    })
    .await
}

/// The messages of the `count` Warning Events that dropped journal entries, once all are there.
async fn rejected_entries(env: &Env, count: usize) -> Vec<String> {
    use k8s_openapi::api::core::v1::Event;
    eventually("a Warning Event per forged entry", || async {
        let rejected: Vec<String> = Api::<Event>::namespaced(env.client(), env.ns())
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("snapshotter-journal"))
            .filter(|e| e.reason.as_deref() == Some(sidecar_kit::cluster::journal::REJECTED_REASON))
            .filter_map(|e| e.message)
            .collect();
        (rejected.len() == count).then_some(rejected)
    })
    .await
}

async fn journal_entries(env: &Env) -> usize {
    crate::common::journal_entries(env).await.len()
}

/// The sealed entry recorded for content `name`, once it is there.
async fn recorded_entry(env: &Env, name: &str) -> String {
    eventually("the intent recorded", || async {
        crate::common::journal_entries(env).await.remove(name)
    })
    .await
}

/// Waits until the journal holds no entry: `what` did that.
async fn journal_emptied(env: &Env, what: &str) {
    eventually(what, || async {
        (journal_entries(env).await == 0).then_some(())
    })
    .await;
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
    journal_emptied(&env, "the intent forgotten").await;
}

#[tokio::test]
async fn a_restart_deletes_the_snapshot_of_a_content_gone_meanwhile() {
    // No retry before the kill below.
    let mut env = without_retries().await;
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
    journal_emptied(&env, "the intent forgotten").await;
    assert_eq!(
        env.mock.calls().count(CREATE),
        2,
        "asked again to learn its id"
    );
    assert_eq!(env.mock.calls().count(DELETE), 1);
}

#[tokio::test]
async fn a_restart_lets_a_content_that_still_exists_carry_on() {
    let mut env = without_retries().await;
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
    journal_emptied(&env, "the intent forgotten").await;
}

/// Entries forged while the snapshotter is down. Without its key: one unsealed and one under a
/// made-up seal, both naming another content's snapshot for a content that is gone. With its
/// key (stolen, say), behind which every entry is still checked: one naming another content's
/// snapshot for a content that does not exist, one recording the VolumeSnapshot UID another
/// content is bound to, and one giving a live content's genuine intent the credentials of
/// another tenant. Each is dropped with a Warning Event on the journal, and the driver sees
/// none of them: the other snapshot is untouched, nothing is deleted, and no call carries the
/// other tenant's secret.
#[tokio::test]
async fn forged_journal_entries_are_dropped_and_never_reach_the_driver() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::PostParams;
    use testkit::leaks::distinctive_secret;

    let mut env = without_retries().await;
    let ns = env.ns().to_string();
    let stolen = distinctive_secret();
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "tenant-b-admin"}, "stringData": {"password": stolen}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    env.class("class", "Delete", json!({})).await;
    let volume = env.bound_claim("data").await;
    // Another tenant's snapshot, ready, its content live.
    let victim_uid = env.snapshot("victim", "data", "class").await;
    let victim_content = format!("snapcontent-{victim_uid}");
    env.content_of(&victim_uid).await;
    env.content_until(&victim_content, "the other snapshot ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    // A genuine intent of a live content: the answer to its CreateSnapshot is lost.
    env.mock
        .faults()
        .lose_answers(CREATE, 1, Code::DeadlineExceeded);
    let live_uid = env.snapshot("live", "data", "class").await;
    let live_content = format!("snapcontent-{live_uid}");
    env.content_of(&live_uid).await;
    env.content_until(&live_content, "the lost answer reported", |c| {
        c["status"]["error"]["message"].is_string()
    })
    .await;
    env.kill().await;

    let mut genuine: serde_json::Value =
        serde_json::from_str(&journal_text(&env, &live_content).await).unwrap();
    assert_eq!(genuine["snapshot_uid"], live_uid.as_str());
    let mut forged = std::collections::BTreeMap::new();
    let intent = |content_uid: &str, snapshot_uid: &str, name: &str| {
        json!({"content_uid": content_uid, "snapshot_uid": snapshot_uid, "name": name,
            "source_volume": volume, "parameters": {}, "secret": null, "delete": true})
        .to_string()
    };
    // The other tenant's snapshot, by name, for a content that does not exist.
    forged.insert(
        "snapcontent-forged-name".to_string(),
        intent(
            "c0ffee00-0000-4000-8000-000000000001",
            "c0ffee00-0000-4000-8000-000000000002",
            &format!("snapshot-{victim_uid}"),
        ),
    );
    // The VolumeSnapshot UID the other tenant's content is bound to, named consistently.
    forged.insert(
        "snapcontent-forged-owner".to_string(),
        intent(
            "c0ffee00-0000-4000-8000-000000000003",
            &victim_uid,
            &format!("snapshot-{victim_uid}"),
        ),
    );
    // The live content's intent with another tenant's credentials.
    genuine["secret"] = json!({"namespace": ns, "name": "tenant-b-admin"});
    forged.insert(live_content.clone(), genuine.to_string());
    let key = journal_keys(&env).await.current;
    let mut forged: std::collections::BTreeMap<String, String> = forged
        .into_iter()
        .map(|(entry, text)| {
            let value = seal_entry(&env, &key, &entry, &text);
            (entry, value)
        })
        .collect();
    // Without the key: the other tenant's snapshot, unsealed and under a made-up seal that
    // names the real key.
    let victim_intent = intent(
        "c0ffee00-0000-4000-8000-000000000004",
        "c0ffee00-0000-4000-8000-000000000005",
        &format!("snapshot-{victim_uid}"),
    );
    forged.insert("snapcontent-unsealed".into(), victim_intent.clone());
    let made_up = sidecar_kit::cluster::journal::seal::Key::from_bytes(&[7; 32]).unwrap();
    let fake = seal_entry(&env, &made_up, "snapcontent-made-up", &victim_intent).replacen(
        made_up.id(),
        key.id(),
        1,
    );
    forged.insert("snapcontent-made-up".into(), fake);
    write_journal_as_is(&env, forged).await;

    let creates_before = env.mock.calls().count(CREATE);
    env.run();
    env.content_until(&live_content, "the live content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    journal_emptied(&env, "every forged entry dropped").await;
    let rejected = rejected_entries(&env, 5).await;
    for part in [
        "is not the one derived from the UID it records",
        &format!("belongs to content {victim_content:?}"),
        "secret reference",
        "\"snapcontent-unsealed\" (forged)",
        "\"snapcontent-made-up\" (forged)",
    ] {
        assert!(
            rejected.iter().any(|m| m.contains(part)),
            "no Event says {part:?}: {rejected:?}"
        );
    }
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");
    let victim_handle = env.content(&victim_content).await["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        env.mock.state().snapshots.contains_key(&victim_handle),
        "the other tenant's snapshot is untouched"
    );
    let calls = env.mock.calls().of(CREATE);
    assert_eq!(
        calls.len() as u64,
        creates_before + 1,
        "the live content asked once more, nothing else"
    );
    for call in &calls {
        assert!(
            !call.carries_secret("password", &stolen),
            "the other tenant's secret reached the driver"
        );
    }
    env.stop().await;
}

/// With the key stolen, entries for contents that are gone are still held to what their
/// classes give: one asks to delete a snapshot its class retains (an administrator deleted the
/// VolumeSnapshot and its Retain content to keep the data), one gives a CreateSnapshot
/// parameters its class does not. Both are dropped with a Warning; the retained snapshot stays
/// and no call carries the forged parameters.
#[tokio::test]
async fn a_stolen_key_cannot_delete_a_retained_snapshot_of_a_gone_content() {
    use kube::api::DeleteParams;

    let mut env = without_retries().await;
    env.class("kept", "Retain", json!({"tier": "gold"})).await;
    let volume = env.bound_claim("data").await;
    let uid = env.snapshot("precious", "data", "kept").await;
    let content = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let ready = env
        .content_until(&content, "the snapshot ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    let handle = ready["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    env.kill().await;
    // The administrator keeps the data: the VolumeSnapshot and its content deleted, the
    // snapshot retained in the driver, named by nothing.
    env.delete_snapshot("precious").await;
    env.contents()
        .delete(&content, &DeleteParams::default())
        .await
        .unwrap();
    unfinalize(&env, &content).await;
    assert!(env.mock.state().snapshots.contains_key(&handle));

    let key = journal_keys(&env).await.current;
    let intent = |content_uid: &str, snapshot_uid: &str, parameters: serde_json::Value| {
        json!({"content_uid": content_uid, "snapshot_uid": snapshot_uid,
            "name": format!("snapshot-{snapshot_uid}"), "source_volume": volume,
            "parameters": parameters, "secret": null, "delete": true, "class": env.n("kept")})
        .to_string()
    };
    let entries = [
        (
            content.clone(),
            intent(
                "c0ffee00-0000-4000-8000-000000000011",
                &uid,
                json!({"tier": "gold"}),
            ),
        ),
        (
            "snapcontent-forged-parameters".to_string(),
            intent(
                "c0ffee00-0000-4000-8000-000000000012",
                "c0ffee00-0000-4000-8000-000000000013",
                json!({"tier": "gold", "replicate-to": "attacker"}),
            ),
        ),
    ];
    let forged = entries
        .into_iter()
        .map(|(entry, text)| {
            let value = seal_entry(&env, &key, &entry, &text);
            (entry, value)
        })
        .collect();
    write_journal_as_is(&env, forged).await;
    let creates_before = env.mock.calls().count(CREATE);
    env.run();
    let rejected = rejected_entries(&env, 2).await;
    for part in ["deletion policy", "parameters"] {
        assert!(
            rejected.iter().any(|m| m.contains(part)),
            "no Event says {part:?}: {rejected:?}"
        );
    }
    journal_emptied(&env, "both entries dropped").await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");
    assert_eq!(
        env.mock.calls().count(CREATE),
        creates_before,
        "nothing asked"
    );
    assert!(
        env.mock.state().snapshots.contains_key(&handle),
        "the retained snapshot is kept"
    );
    env.stop().await;
}

/// The replay for snapshots: a genuine entry captured while its CreateSnapshot went unanswered;
/// later its content is patched to Retain (as backup tools do) and deleted, the snapshot kept in
/// the driver. Written back into the ConfigMap journal of earlier versions, as whoever may
/// write ConfigMaps can: reported (legacy), never acted on. Then the snapshot is taken in by a
/// pre-provisioned content and the entry written into the journal itself: a content names the
/// snapshot, which is kept. Nothing is deleted.
#[tokio::test]
async fn a_replayed_entry_never_deletes_a_retained_snapshot() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{DeleteParams, PostParams};
    let mut env = without_retries().await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    env.mock
        .faults()
        .lose_answers(CREATE, 1, Code::DeadlineExceeded);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let captured = recorded_entry(&env, &name).await;
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
    let handle = ready["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    let retain = Patch::Merge(json!({"spec": {"deletionPolicy": "Retain"}}));
    env.contents()
        .patch(&name, &PatchParams::default(), &retain)
        .await
        .unwrap();
    env.delete_snapshot("snap").await;
    env.contents()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    env.content_gone(&name).await;
    journal_emptied(&env, "the intent forgotten").await;
    env.kill().await;
    assert!(env.mock.state().snapshots.contains_key(&handle));

    let legacy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "snapshotter-journal"},
        "data": {name.clone(): captured.clone()},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &legacy)
        .await
        .unwrap();
    env.run();
    let rejected = rejected_entries(&env, 1).await;
    assert!(rejected[0].contains("(legacy)"), "{rejected:?}");
    // A snapshot cut after the journal was taken up: the snapshotter is at work.
    let marker = env.snapshot("marker", "data", "class").await;
    env.content_until(&format!("snapcontent-{marker}"), "the marker ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");

    // Taken in by a pre-provisioned content, and the entry replayed into the journal.
    env.kill().await;
    let home = env.n("rehomed");
    let content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": home},
        "spec": {"driver": env.driver, "deletionPolicy": "Retain",
                 "source": {"snapshotHandle": handle},
                 "volumeSnapshotRef": {"name": "adopted", "namespace": env.ns()}},
    });
    env.contents()
        .create(
            &Default::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
    write_journal_as_is(&env, [(name.clone(), captured)].into()).await;
    env.run();
    journal_emptied(&env, "the replayed intent settled").await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");
    assert!(
        env.mock.state().snapshots.contains_key(&handle),
        "the snapshot a content names is kept"
    );
    env.stop().await;
}

/// A content patched to Retain while its CreateSnapshot is unanswered (as backup tools patch
/// contents before they delete them), then deleted: the snapshot the call cut is kept, as the
/// content asked when it went, though the recorded intent said Delete.
#[tokio::test]
async fn a_content_retained_before_it_went_keeps_its_snapshot() {
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
    let retain = Patch::Merge(json!({"spec": {"deletionPolicy": "Retain"}}));
    env.contents()
        .patch(&name, &PatchParams::default(), &retain)
        .await
        .unwrap();
    // A Retain content outlives its VolumeSnapshot: it is deleted by hand, its finalizer
    // taken away.
    env.delete_snapshot("snap").await;
    env.contents()
        .delete(&name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    unfinalize(&env, &name).await;
    env.mock.faults().release(CREATE);
    journal_emptied(&env, "the intent forgotten").await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");
    assert_eq!(env.mock.state().snapshots.len(), 1, "the snapshot is kept");
}

/// A genuine entry of a content that is ready by now (its removal lost, say, with the process
/// that wrote it): the call was answered, so the entry is forgotten, neither carried on nor
/// dropped as a forgery, and the driver is not called for it.
#[tokio::test]
async fn an_entry_of_a_content_ready_by_now_is_forgotten() {
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    env.mock.faults().hang(CREATE);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let captured = recorded_entry(&env, &name).await;
    env.mock.faults().release(CREATE);
    env.content_until(&name, "the content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    journal_emptied(&env, "the intent forgotten").await;
    env.kill().await;
    write_journal_as_is(&env, [(name.clone(), captured)].into()).await;
    env.run();
    journal_emptied(&env, "the entry of the ready content forgotten").await;
    // A snapshot cut after the journal was taken up: the snapshotter is at work.
    let marker = env.snapshot("marker", "data", "class").await;
    env.content_until(&format!("snapcontent-{marker}"), "the marker ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    assert!(rejected_entries(&env, 0).await.is_empty(), "not a forgery");
    assert_eq!(
        env.mock.calls().count(CREATE),
        2,
        "snap and marker, once each"
    );
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing deleted");
    env.stop().await;
}
