//! The life of a snapshot: cut when its VolumeSnapshot asks, polled until ready, deleted with
//! its VolumeSnapshot; pre-provisioned snapshots checked by ListSnapshots.

use crate::common::*;
use serde_json::json;
use testkit::mockdriver::MockDriver;

#[tokio::test]
async fn a_snapshot_is_cut_once_and_its_content_says_so() {
    let env = Env::start(MockDriver::default(), |c| {
        c.naming.extra_create_metadata = true
    })
    .await;
    env.class("class", "Delete", json!({"type": "fast"})).await;
    let volume = env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    // The status is written first, then the being-created annotation goes (upstream's order).
    let content = env
        .content_until(&name, "the content ready, its annotation gone", |c| {
            c["status"]["readyToUse"] == true
                && annotation(
                    c,
                    "snapshot.storage.kubernetes.io/volumesnapshot-being-created",
                )
                .is_none()
        })
        .await;
    let snapshots = env.mock.state().snapshots;
    assert_eq!(snapshots.len(), 1);
    let (handle, snapshot) = snapshots.iter().next().unwrap();
    assert_eq!(snapshot.name, format!("snapshot-{uid}"));
    assert_eq!(snapshot.source_volume_id, volume);
    let status = &content["status"];
    assert_eq!(status["snapshotHandle"], handle.as_str());
    assert_eq!(status["restoreSize"], GI);
    let created = snapshot.creation_seconds * 1_000_000_000 + i64::from(snapshot.creation_nanos);
    assert_eq!(
        status["creationTime"], created,
        "the driver's time, in nanoseconds"
    );
    assert!(status.get("error").is_none());
    let calls = env.mock.calls().of(CREATE);
    assert_eq!(calls.len(), 1, "ready at once: one call");
    let request: serde_json::Value = serde_json::from_str(&calls[0].request).unwrap();
    assert_eq!(
        request["parameters"],
        json!({"type": "fast",
            "csi.storage.k8s.io/volumesnapshot/name": "snap",
            "csi.storage.k8s.io/volumesnapshot/namespace": env.ns(),
            "csi.storage.k8s.io/volumesnapshotcontent/name": name})
    );
    env.snapshot_until("snap", "the VolumeSnapshot ready", |s| {
        s["status"]["readyToUse"] == true && s["status"]["restoreSize"] == "1Gi"
    })
    .await;
}

/// Cuts a snapshot the driver says is ready at its fourth answer; the driver calls and the
/// content writes it took.
async fn cut_slowly(list_snapshots: bool) -> (Env, u64, u64) {
    let metrics = prometheus::Registry::new();
    let snapshot_metrics =
        external_snapshotter::controller::SnapshotMetrics::register(&metrics).unwrap();
    let env = Env::start(MockDriver::default().snapshot_ready_after(3), |c| {
        c.snapshot_metrics = Some(snapshot_metrics);
        c.list_snapshots = list_snapshots;
    })
    .await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let cut = env
        .content_until(&name, "the content cut, not ready", |c| {
            c["status"]["snapshotHandle"].is_string()
        })
        .await;
    assert_ne!(cut["status"]["readyToUse"], true);
    env.content_until(&name, "the content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    assert_eq!(
        env.mock.state().snapshots.len(),
        1,
        "CreateSnapshot is idempotent"
    );
    // Observed once the ready status is written.
    let histogram = eventually("the calls observed", || async {
        let families = metrics.gather();
        let calls = families
            .iter()
            .find(|f| f.name() == "csi_snapshotter_driver_calls_per_snapshot")?;
        let histogram = calls.get_metric()[0].get_histogram().clone();
        (histogram.get_sample_count() == 1).then_some(histogram)
    })
    .await;
    assert_eq!(
        histogram.get_sample_sum(),
        4.0,
        "three answers said not ready"
    );
    let (create, list) = (env.mock.calls().count(CREATE), env.mock.calls().count(LIST));
    (env, create, list)
}

#[tokio::test]
async fn a_snapshot_not_ready_at_once_is_listed_until_it_is() {
    let (_env, create, list) = cut_slowly(true).await;
    assert_eq!((create, list), (1, 3), "cut once, then read");
}

#[tokio::test]
async fn without_list_snapshots_readiness_is_asked_by_create_snapshot_as_upstream() {
    let (_env, create, list) = cut_slowly(false).await;
    assert_eq!((create, list), (4, 0));
}

#[tokio::test]
async fn deleting_the_volume_snapshot_deletes_the_snapshot() {
    let env = Env::start(MockDriver::default(), |_| {}).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let ready = env
        .content_until(&name, "the content ready with its finalizer", |c| {
            c["status"]["readyToUse"] == true
                && finalizers(c)
                    .iter()
                    .any(|f| f.ends_with("volumesnapshotcontent-bound-protection"))
        })
        .await;
    let handle = ready["status"]["snapshotHandle"]
        .as_str()
        .unwrap()
        .to_string();
    env.delete_snapshot("snap").await;
    env.content_gone(&name).await;
    eventually("the VolumeSnapshot gone", || async {
        env.snapshots().get("snap").await.is_err().then_some(())
    })
    .await;
    assert!(env.mock.state().snapshots.is_empty());
    let deletes = env.mock.calls().of(DELETE);
    assert_eq!(deletes.len(), 1);
    assert!(
        deletes[0].request.contains(&handle),
        "{}",
        deletes[0].request
    );
}

#[tokio::test]
async fn a_retained_snapshot_stays_in_the_driver() {
    let env = Env::start(MockDriver::default(), |_| {}).await;
    env.class("class", "Retain", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    env.delete_snapshot("snap").await;
    eventually("the VolumeSnapshot gone", || async {
        env.snapshots().get("snap").await.is_err().then_some(())
    })
    .await;
    // The content stays (Retain); deleting it by hand lets it go without a driver call.
    env.contents()
        .delete(&name, &Default::default())
        .await
        .unwrap();
    env.content_gone(&name).await;
    assert_eq!(env.mock.calls().count(DELETE), 0);
    assert_eq!(env.mock.state().snapshots.len(), 1);
}

#[tokio::test]
async fn a_pre_provisioned_snapshot_is_checked_with_list_snapshots() {
    // Its creation below is the snapshot's first answer; the first ListSnapshots its second.
    let env = Env::start(MockDriver::default().snapshot_ready_after(2), |_| {}).await;
    let volume = env.bound_claim("data").await;
    let handle = env
        .mock
        .update_state(|s| {
            s.create_snapshot("imported", &volume, (1_700_000_000, 5))
                .unwrap()
                .id
        })
        .unwrap();
    let content_name = env.n("imported");
    let content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {"driver": env.driver, "deletionPolicy": "Delete",
                 "source": {"snapshotHandle": handle},
                 "volumeSnapshotRef": {"name": "imported", "namespace": env.ns()}},
    });
    env.contents()
        .create(
            &Default::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
    let snapshot = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": "imported"},
        "spec": {"source": {"volumeSnapshotContentName": content_name}},
    });
    env.snapshots()
        .create(
            &Default::default(),
            &serde_json::from_value(snapshot).unwrap(),
        )
        .await
        .unwrap();
    let content = env
        .content_until(&content_name, "the content ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    assert_eq!(content["status"]["snapshotHandle"], handle.as_str());
    assert_eq!(content["status"]["restoreSize"], GI);
    assert_eq!(
        content["status"]["creationTime"],
        1_700_000_000_000_000_005_i64
    );
    assert_eq!(env.mock.calls().count(CREATE), 0);
    assert_eq!(
        env.mock.calls().count(LIST),
        2,
        "not ready once, then ready"
    );
    env.snapshot_until("imported", "the VolumeSnapshot ready", |s| {
        s["status"]["readyToUse"] == true
    })
    .await;
    env.delete_snapshot("imported").await;
    env.content_gone(&content_name).await;
    assert!(env.mock.state().snapshots.is_empty(), "policy Delete");
}

#[tokio::test]
async fn contents_of_other_drivers_are_left_alone() {
    let env = Env::start(MockDriver::default(), |_| {}).await;
    let content_name = env.n("foreign");
    let content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {"driver": format!("other.{}", env.driver), "deletionPolicy": "Delete",
                 "source": {"volumeHandle": "vol-x"},
                 "volumeSnapshotRef": {"name": "x", "namespace": env.ns(), "uid": "u"}},
    });
    env.contents()
        .create(
            &Default::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
    // A content of ours created after it is done: the foreign one was seen before.
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    env.content_of(&uid).await;
    env.content_until(&format!("snapcontent-{uid}"), "ours ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    let foreign = env.content(&content_name).await;
    assert!(
        foreign.get("status").is_none_or(|s| s.is_null()),
        "{foreign}"
    );
    assert_eq!(
        annotation(
            &foreign,
            "snapshot.storage.kubernetes.io/volumesnapshot-being-created"
        ),
        None
    );
    assert_eq!(env.mock.calls().count(CREATE), 1);
}
