//! Attach and detach against the in-process API server and the mock driver over a unix socket.

use crate::common::*;
use csi_proto::methods::controller::{CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::apiserver::Verb;

#[tokio::test]
async fn attach_then_detach_at_the_write_floor() {
    let env = Env::start(mock(), |_| {}).await;
    if skip_on_real_cluster(&env, "it counts API requests") {
        return env.stop().await;
    }
    env.create_csinode("node-1", "nid-1").await;
    let handle = env.create_volume("vol-a").await;
    env.create_csi_pv("pv-a", &handle).await;
    let counters = env.counters();
    counters.reset();

    env.create_pv_va("va-a", "pv-a", "node-1").await;
    let va = env.wait_va("va-a", attached).await;
    let status = va.status.clone().unwrap();
    assert_eq!(
        status.attachment_metadata.unwrap()["devicePath"],
        format!("/dev/mock/{handle}")
    );
    assert!(status.attach_error.is_none());
    assert_eq!(finalizers(&va.metadata), [env.finalizer()]);
    assert_eq!(
        va.metadata.annotations.as_ref().unwrap()[NODE_ID_ANNOTATION],
        "nid-1"
    );
    let pv = env.pvs().get(&env.n("pv-a")).await.unwrap();
    assert_eq!(pv_finalizers(&pv.metadata), [env.finalizer()]);

    let publishes = requests(&env.mock, CONTROLLER_PUBLISH_VOLUME);
    assert_eq!(publishes.len(), 1);
    let request = &publishes[0];
    assert_eq!(request["volume_id"], handle.as_str());
    assert_eq!(request["node_id"], "nid-1");
    assert_eq!(
        request["volume_capability"]["access_mode"]["mode"],
        "SINGLE_NODE_WRITER"
    );
    assert_eq!(request["volume_capability"]["mount"]["fs_type"], "ext4");
    assert_eq!(
        request["volume_context"]["storage.kubernetes.io/csiProvisionerIdentity"],
        "test"
    );
    assert!(request.get("readonly").is_none());
    assert!(
        env.mock.state().volumes[&handle]
            .published
            .contains_key("nid-1")
    );

    // Three writes per first attach: PV finalizer, VA finalizer + annotation, status.
    assert_eq!(counters.writes() - 1, 3, "{:#?}", counters.snapshot());
    assert_eq!(counters.get(Verb::Patch, "persistentvolumes"), 1);
    assert_eq!(counters.get(Verb::Patch, "volumeattachments"), 1);
    assert_eq!(
        counters.get_subresource(Verb::Patch, "volumeattachments", Some("status")),
        1
    );

    counters.reset();
    env.delete_va("va-a").await;
    env.wait_va_gone("va-a").await;
    assert!(
        env.mock
            .calls()
            .wait_for_count(CONTROLLER_UNPUBLISH_VOLUME, 1, WAIT)
            .await
    );
    let unpublish = &requests(&env.mock, CONTROLLER_UNPUBLISH_VOLUME)[0];
    assert_eq!(unpublish["volume_id"], handle.as_str());
    assert_eq!(unpublish["node_id"], "nid-1");
    assert!(env.mock.state().volumes[&handle].published.is_empty());
    // One write per detach (besides the DELETE itself): the finalizer removal.
    assert_eq!(counters.get(Verb::Delete, "volumeattachments"), 1);
    assert_eq!(counters.writes() - 1, 1, "{:#?}", counters.snapshot());
    assert_eq!(
        counters.get_subresource(Verb::Patch, "volumeattachments", Some("status")),
        0
    );
    assert!(
        env.events_for("va-a").await.is_empty(),
        "no events on success"
    );
    env.stop().await;
}

#[tokio::test]
async fn detach_keeps_foreign_finalizers_and_clears_the_status() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let va = env.attached_volume(1).await;
    // Merged into the list, which keeps ours.
    let patch = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    env.vas()
        .patch(
            va.metadata.name.as_deref().unwrap(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();
    env.delete_va("va-1").await;
    let va = env
        .wait_va("va-1", |va| {
            finalizers(&va.metadata) == ["example.com/keep"] && !attached(va)
        })
        .await;
    let status = va.status.unwrap();
    assert!(status.attachment_metadata.is_none());
    assert!(status.detach_error.is_none());
    env.stop().await;
}

#[tokio::test]
async fn trivial_attacher_for_drivers_without_controller_publish() {
    for driver in [mock().publish_unpublish(false), mock().controller(false)] {
        let env = Env::start(driver, |_| {}).await;
        // No CSINode, no PV: none is needed.
        env.create_pv_va("va-t", "pv-missing", "node-1").await;
        let va = env.wait_va("va-t", attached).await;
        assert!(finalizers(&va.metadata).is_empty());
        assert!(va.metadata.annotations.is_none());
        assert_eq!(env.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 0);
        // Request counters exist in-process only.
        if let Some(counters) = env.cluster.counters() {
            assert_eq!(counters.get(Verb::Patch, "persistentvolumes"), 0);
        }
        // Deleting it needs no detach.
        env.delete_va("va-t").await;
        env.wait_va_gone("va-t").await;
        assert_eq!(env.mock.calls().count(CONTROLLER_UNPUBLISH_VOLUME), 0);
        env.stop().await;
    }
}

#[tokio::test]
async fn inline_volumes_attach_without_a_pv() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let handle = env.create_volume("inline").await;
    // Inline specs are Filesystem only: the API server refuses another volumeMode.
    let source = json!({"inlineVolumeSpec": {
        "accessModes": ["ReadWriteMany"],
        "csi": {"driver": env.driver, "volumeHandle": handle, "fsType": "xfs",
                "volumeAttributes": {"k": "v"}},
    }});
    env.create_va("va-inline", source, "node-1").await;
    env.wait_va("va-inline", attached).await;
    let request = &requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)[0];
    assert_eq!(request["volume_id"], handle.as_str());
    assert_eq!(
        request["volume_capability"]["access_mode"]["mode"],
        "MULTI_NODE_MULTI_WRITER"
    );
    assert_eq!(request["volume_capability"]["mount"]["fs_type"], "xfs");
    assert_eq!(request["volume_context"]["k"], "v");
    // Request counters exist in-process only.
    if let Some(counters) = env.cluster.counters() {
        assert_eq!(counters.get(Verb::Patch, "persistentvolumes"), 0);
    }

    env.delete_va("va-inline").await;
    env.wait_va_gone("va-inline").await;
    assert_eq!(env.mock.calls().count(CONTROLLER_UNPUBLISH_VOLUME), 1);
    env.stop().await;
}

#[tokio::test]
async fn block_volumes_are_published_with_a_block_capability() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let handle = env.create_volume("block").await;
    let mut spec = env.csi_pv_spec(&handle);
    spec["volumeMode"] = json!("Block");
    env.create_pv("pv-block", spec).await;
    env.create_pv_va("va-block", "pv-block", "node-1").await;
    env.wait_va("va-block", attached).await;
    let request = &requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)[0];
    assert!(
        request["volume_capability"].get("block").is_some(),
        "{request}"
    );
    assert!(
        request["volume_capability"].get("mount").is_none(),
        "{request}"
    );
    env.stop().await;
}

#[tokio::test]
async fn readonly_is_sent_only_with_publish_readonly() {
    for capable in [true, false] {
        let env = Env::start(mock().publish_readonly(capable), |_| {}).await;
        env.create_csinode("node-1", "nid-1").await;
        let handle = env.create_volume("ro").await;
        let mut spec = env.csi_pv_spec(&handle);
        spec["csi"]["readOnly"] = json!(true);
        spec["accessModes"] = json!(["ReadOnlyMany"]);
        env.create_pv("pv-ro", spec).await;
        env.create_pv_va("va-ro", "pv-ro", "node-1").await;
        env.wait_va("va-ro", attached).await;
        let request = &requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)[0];
        assert_eq!(request.get("readonly").is_some(), capable, "{request}");
        assert_eq!(
            request["volume_capability"]["access_mode"]["mode"],
            "MULTI_NODE_READER_ONLY"
        );
        env.stop().await;
    }
}

#[tokio::test]
async fn single_node_multi_writer_drivers_get_the_new_access_modes() {
    let env = Env::start(mock().single_node_multi_writer(true), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    for (n, mode, expected) in [
        (1, "ReadWriteOnce", "SINGLE_NODE_MULTI_WRITER"),
        (2, "ReadWriteOncePod", "SINGLE_NODE_SINGLE_WRITER"),
    ] {
        let handle = env.create_volume(&format!("snmw-{n}")).await;
        let mut spec = env.csi_pv_spec(&handle);
        spec["accessModes"] = json!([mode]);
        env.create_pv(&format!("pv-{n}"), spec).await;
        env.create_pv_va(&format!("va-{n}"), &format!("pv-{n}"), "node-1")
            .await;
        env.wait_va(&format!("va-{n}"), attached).await;
        let request = requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)
            .into_iter()
            .find(|r| r["volume_id"] == handle.as_str())
            .unwrap();
        assert_eq!(
            request["volume_capability"]["access_mode"]["mode"],
            expected
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn secrets_are_read_and_passed_but_never_logged() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "publish", "namespace": env.cluster.namespace()},
        // "hunter2", base64-encoded.
        "data": {"password": "aHVudGVyMg=="},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), env.cluster.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let handle = env.create_volume("sec").await;
    let mut spec = env.csi_pv_spec(&handle);
    spec["csi"]["controllerPublishSecretRef"] =
        json!({"name": "publish", "namespace": env.cluster.namespace()});
    env.create_pv("pv-s", spec).await;
    env.create_pv_va("va-s", "pv-s", "node-1").await;
    env.wait_va("va-s", attached).await;
    let request = &requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)[0];
    let text = request.to_string();
    assert!(text.contains("secrets"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    env.stop().await;
}

#[tokio::test]
async fn detach_falls_back_to_the_node_id_annotation() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;
    // The node's CSINode is gone (a test's CSINode has no owner, so nothing else deletes it).
    Api::<CSINode>::all(env.client())
        .delete(&env.n("node-1"), &DeleteParams::default())
        .await
        .unwrap();
    // Once an attach to that node fails for want of it, the attacher knows it is gone: the
    // detach below cannot have taken the node ID from the CSINode.
    let handle = env.create_volume("vol-2").await;
    env.create_csi_pv("pv-2", &handle).await;
    env.create_pv_va("va-2", "pv-2", "node-1").await;
    let missing = format!("csinode.storage.k8s.io \"{}\" not found", env.n("node-1"));
    env.wait_va("va-2", |va| {
        attach_error(va).is_some_and(|(m, _)| m == missing)
    })
    .await;
    env.delete_va("va-1").await;
    env.wait_va_gone("va-1").await;
    let unpublish = &requests(&env.mock, CONTROLLER_UNPUBLISH_VOLUME)[0];
    assert_eq!(unpublish["node_id"], "nid-1");
    env.stop().await;
}

#[tokio::test]
async fn pv_finalizer_lifecycle() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    env.attached_volume(1).await;
    // The PV is deleted while attached: our finalizer holds it.
    env.pvs()
        .delete(&env.n("pv-1"), &DeleteParams::default())
        .await
        .unwrap();
    env.wait_pv("pv-1", |pv| {
        pv.is_some_and(|pv| pv.metadata.deletion_timestamp.is_some())
    })
    .await;
    let pv = env.pvs().get(&env.n("pv-1")).await.unwrap();
    assert_eq!(pv_finalizers(&pv.metadata), [env.finalizer()]);
    // A new attachment of a PV being deleted is refused.
    env.create_csinode("node-2", "nid-2").await;
    env.create_pv_va("va-late", "pv-1", "node-2").await;
    let va = env
        .wait_va("va-late", |va| attach_error(va).is_some())
        .await;
    assert_eq!(
        attach_error(&va).unwrap().0,
        format!(
            "PersistentVolume \"{}\" is marked for deletion",
            env.n("pv-1")
        )
    );
    env.delete_va("va-late").await;
    env.wait_va_gone("va-late").await;
    assert!(env.pvs().get_opt(&env.n("pv-1")).await.unwrap().is_some());

    // The last attachment goes: the finalizer goes, and with it the PV.
    env.delete_va("va-1").await;
    env.wait_va_gone("va-1").await;
    env.wait_pv("pv-1", |pv| pv.is_none()).await;
    env.stop().await;
}

#[tokio::test]
async fn pv_finalizer_removal_keeps_other_finalizers() {
    let env = Env::start(mock(), |_| {}).await;
    env.create_csinode("node-1", "nid-1").await;
    let handle = env.create_volume("v").await;
    env.create_csi_pv("pv-k", &handle).await;
    // A finalizer of another controller, merged in without a resourceVersion: a real cluster's
    // pv-protection controller and binder write the PV concurrently.
    let keep = json!({"metadata": {"finalizers": ["example.com/keep"]}});
    env.pvs()
        .patch(
            &env.n("pv-k"),
            &PatchParams::default(),
            &Patch::Strategic(&keep),
        )
        .await
        .unwrap();
    env.create_pv_va("va-k", "pv-k", "node-1").await;
    env.wait_va("va-k", attached).await;
    let pv = env.pvs().get(&env.n("pv-k")).await.unwrap();
    let mut kept = pv_finalizers(&pv.metadata);
    kept.sort();
    assert_eq!(kept, ["example.com/keep".to_string(), env.finalizer()]);
    env.delete_va("va-k").await;
    env.wait_va_gone("va-k").await;
    env.pvs()
        .delete(&env.n("pv-k"), &DeleteParams::default())
        .await
        .unwrap();
    // Ours goes (pv-protection may go too, as the PV is unused); the other one stays.
    env.wait_pv("pv-k", |pv| {
        pv.is_some_and(|pv| pv_finalizers(&pv.metadata) == ["example.com/keep"])
    })
    .await;
    env.stop().await;
}
