//! Data sources end to end: restores from VolumeSnapshots, clones of claims, their protection
//! finalizers, volume populators and VolumeAttributesClasses, against the cluster and the mock
//! driver.

use crate::common::{Env, eventually, mock, requests, unique};
use csi_proto::methods::controller::CREATE_VOLUME;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch};
use kube::api::{PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::mockdriver::state::Snapshot as MockSnapshot;

const SNAPSHOT_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
const GIB: i64 = 1 << 30;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn snapshots(env: &Env) -> Api<DynamicObject> {
    Api::namespaced_with(
        env.client(),
        &env.namespace(),
        &resource("VolumeSnapshot", "volumesnapshots"),
    )
}

fn contents(env: &Env) -> Api<DynamicObject> {
    Api::all_with(
        env.client(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    )
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

/// A snapshot `name` the mock driver holds (of `bytes`), with its VolumeSnapshot and bound
/// content in the cluster; `ready` says whether the snapshot is ready to use. Returns the
/// content's name.
async fn snapshot(env: &Env, name: &str, bytes: i64, ready: bool, content_extra: Value) -> String {
    let handle = format!("snap-{name}");
    env.mock
        .update_state(|state| {
            state.snapshots.insert(
                handle.clone(),
                MockSnapshot {
                    id: handle.clone(),
                    name: name.to_string(),
                    source_volume_id: "gone".into(),
                    size_bytes: bytes,
                    creation_seconds: 1,
                    creation_nanos: 0,
                    answers: 0,
                    group_snapshot_id: String::new(),
                },
            );
        })
        .unwrap();
    let snapshot = snapshots(env)
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name},
                "spec": {"source": {"volumeSnapshotContentName": "x"}}
            })),
        )
        .await
        .unwrap();
    let content_name = env.unique("content");
    let mut content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {"driver": env.driver, "deletionPolicy": "Delete", "sourceVolumeMode": "Filesystem",
            "source": {"snapshotHandle": handle},
            "volumeSnapshotRef": {"namespace": env.namespace(), "name": name,
                "uid": snapshot.metadata.uid.clone().unwrap()}}
    });
    crate::common::merge(&mut content, content_extra);
    contents(env)
        .create(&PostParams::default(), &object(content))
        .await
        .unwrap();
    contents(env)
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"snapshotHandle": handle, "readyToUse": true}})),
        )
        .await
        .unwrap();
    set_snapshot_status(env, name, &content_name, ready, bytes).await;
    content_name
}

async fn set_snapshot_status(env: &Env, name: &str, content: &str, ready: bool, bytes: i64) {
    snapshots(env)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"boundVolumeSnapshotContentName": content,
                "readyToUse": ready, "restoreSize": bytes.to_string()}})),
        )
        .await
        .unwrap();
}

async fn finalizers(api: &Api<DynamicObject>, name: &str) -> Vec<String> {
    api.get(name)
        .await
        .unwrap()
        .metadata
        .finalizers
        .unwrap_or_default()
}

fn source(kind: &str, name: &str) -> Value {
    let group = (kind == "VolumeSnapshot").then_some("snapshot.storage.k8s.io");
    json!({"spec": {"dataSource": {"apiGroup": group, "kind": kind, "name": name}}})
}

async fn cleanup_contents(env: &Env, names: &[String]) {
    for name in names {
        let _ = contents(env).delete(name, &DeleteParams::default()).await;
    }
}

#[tokio::test]
async fn restores_a_snapshot_once_it_is_ready() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    if !served(&env, "snapshot.storage.k8s.io/v1", "VolumeSnapshot").await {
        return env.stop().await;
    }
    let class = env.create_class(json!({})).await;
    let content = snapshot(&env, "snap", GIB, false, json!({})).await;
    env.create_claim("restored", &class, source("VolumeSnapshot", "snap"))
        .await;
    let waiting = env
        .wait_event(
            "restored",
            "ProvisioningFailed",
            "snapshot snap is not Ready",
        )
        .await;
    assert_eq!(
        waiting.message.as_deref(),
        Some(
            "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshot snap is not Ready; provisioning goes on when the data source changes"
        )
    );
    assert!(requests(&env.mock, CREATE_VOLUME).is_empty());

    set_snapshot_status(&env, "snap", &content, true, GIB).await;
    let pv = env.wait_bound("restored").await;
    let created = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(created.len(), 1);
    assert_eq!(
        created[0]["volume_content_source"]["snapshot"]["snapshot_id"], "snap-snap",
        "{}",
        created[0]
    );
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "1Gi");
    let restore_failures: Vec<_> = env
        .events_for(&env.namespace(), "restored")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
        .collect();
    assert_eq!(restore_failures.len(), 1, "said once: {restore_failures:?}");
    assert_eq!(restore_failures[0].count.unwrap_or(1), 1);
    // The claim has its volume: nothing protects the snapshot any more.
    let api = snapshots(&env);
    eventually("the restore protection released", || {
        let api = api.clone();
        async move {
            (!finalizers(&api, "snap")
                .await
                .contains(&SNAPSHOT_FINALIZER.to_string()))
            .then_some(())
        }
    })
    .await;
    cleanup_contents(&env, &[content]).await;
    env.stop().await;
}

#[tokio::test]
async fn restores_refused_as_upstream_refuses_them() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    if !served(&env, "snapshot.storage.k8s.io/v1", "VolumeSnapshot").await {
        return env.stop().await;
    }
    let class = env.create_class(json!({})).await;
    let big = snapshot(&env, "big", 2 * GIB, true, json!({})).await;
    env.create_claim("small", &class, source("VolumeSnapshot", "big"))
        .await;
    env.wait_event(
        "small",
        "ProvisioningFailed",
        "requested volume size 1073741824 is less than the size 2147483648 for the source snapshot big",
    )
    .await;

    let foreign = snapshot(
        &env,
        "foreign",
        GIB,
        true,
        json!({"spec": {"driver": "other.csi.example.com"}}),
    )
    .await;
    env.create_claim("other-driver", &class, source("VolumeSnapshot", "foreign"))
        .await;
    env.wait_event(
        "other-driver",
        "ProvisioningFailed",
        &format!("snapshotcontent {foreign} for snapshot foreign is not handled by CSI driver of StorageClass {class}"),
    )
    .await;

    let mode = snapshot(&env, "fs", GIB, true, json!({})).await;
    let mut block = source("VolumeSnapshot", "fs");
    block["spec"]["volumeMode"] = json!("Block");
    env.create_claim("block", &class, block).await;
    env.wait_event(
        "block",
        "ProvisioningFailed",
        "annotation is not present on snapshotcontent",
    )
    .await;
    assert!(
        requests(&env.mock, CREATE_VOLUME).is_empty(),
        "no refused restore reached the driver"
    );
    // The content's owner allows the conversion: the restore goes on.
    contents(&env)
        .patch(
            &mode,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                "snapshot.storage.kubernetes.io/allow-volume-mode-change": "true"}}})),
        )
        .await
        .unwrap();
    env.wait_bound("block").await;

    env.create_claim("missing", &class, source("VolumeSnapshot", "nowhere"))
        .await;
    env.wait_event(
        "missing",
        "ProvisioningFailed",
        "error getting snapshot nowhere from api server",
    )
    .await;
    cleanup_contents(&env, &[big, foreign, mode]).await;
    env.stop().await;
}

#[tokio::test]
async fn restores_wait_without_the_capability() {
    let caps = testkit::mockdriver::Capabilities {
        snapshots: false,
        ..Default::default()
    };
    let mut env = Env::start(mock().capabilities(caps), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim("restored", &class, source("VolumeSnapshot", "snap"))
        .await;
    env.wait_event(
        "restored",
        "ProvisioningFailed",
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported",
    )
    .await;
    env.stop().await;
}

#[tokio::test]
async fn orphaned_snapshot_finalizers_are_swept() {
    let mut env = Env::without_controller(mock()).await;
    if !served(&env, "snapshot.storage.k8s.io/v1", "VolumeSnapshot").await {
        return env.stop().await;
    }
    let content = snapshot(&env, "orphan", GIB, true, json!({})).await;
    snapshots(&env)
        .patch(
            "orphan",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"finalizers": [SNAPSHOT_FINALIZER, "example.com/keep"]}}),
            ),
        )
        .await
        .unwrap();
    let config = env.config(&[]).await;
    assert!(config.watch_snapshots, "the test cluster serves snapshots");
    env.launch(config);
    let api = snapshots(&env);
    eventually("the orphaned finalizer swept", || {
        let api = api.clone();
        async move {
            // Only ours goes: others (and on a real cluster the snapshot controller's) stay.
            let left = finalizers(&api, "orphan").await;
            (!left.iter().any(|f| f == SNAPSHOT_FINALIZER)
                && left.iter().any(|f| f == "example.com/keep"))
            .then_some(())
        }
    })
    .await;
    cleanup_contents(&env, &[content]).await;
    env.stop().await;
}

#[tokio::test]
async fn clones_protect_their_source_until_they_have_volumes() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim("src", &class, json!({})).await;
    let source_pv = env.wait_bound("src").await;
    let source_handle = source_pv.spec.unwrap().csi.unwrap().volume_handle;

    // The clone's CreateVolume hangs: meanwhile the source is deleted.
    env.mock.faults().hang(CREATE_VOLUME);
    env.create_claim("clone", &class, source("PersistentVolumeClaim", "src"))
        .await;
    let pvcs = env.pvcs();
    eventually("the cloning protection on the source", || {
        let pvcs = pvcs.clone();
        async move {
            let src = pvcs.get("src").await.unwrap();
            src.metadata
                .finalizers
                .unwrap_or_default()
                .contains(&CLONE_FINALIZER.to_string())
                .then_some(())
        }
    })
    .await;
    env.delete_claim("src").await;
    let src = env.pvcs().get("src").await.unwrap();
    assert!(
        src.metadata.deletion_timestamp.is_some(),
        "the source waits for its clone"
    );
    env.mock.faults().release(CREATE_VOLUME);
    let clone_pv = env.wait_bound("clone").await;
    let created = requests(&env.mock, CREATE_VOLUME);
    let clone_request = created.last().unwrap();
    assert_eq!(
        clone_request["volume_content_source"]["volume"]["volume_id"],
        source_handle.as_str(),
        "{clone_request}"
    );
    assert!(clone_pv.spec.unwrap().csi.is_some());
    let pvcs = env.pvcs();
    eventually("the source gone once its clone has a volume", || {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("src").await.unwrap().is_none().then_some(()) }
    })
    .await;
    env.stop().await;
}

#[tokio::test]
async fn clones_refused_as_upstream_refuses_them() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim(
        "big",
        &class,
        json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}),
    )
    .await;
    env.wait_bound("big").await;
    env.create_claim("smaller", &class, source("PersistentVolumeClaim", "big"))
        .await;
    env.wait_event(
        "smaller",
        "ProvisioningFailed",
        "error getting handle for DataSource Type PersistentVolumeClaim by Name big: error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 1073741824 but source is 2147483648",
    )
    .await;
    env.create_claim("orphan", &class, source("PersistentVolumeClaim", "later"))
        .await;
    env.wait_event(
        "orphan",
        "ProvisioningFailed",
        "persistentvolumeclaim \"later\" not found",
    )
    .await;
    let before = requests(&env.mock, CREATE_VOLUME).len();
    // The source appears: the clone goes on by itself, told by the watch.
    env.create_claim("later", &class, json!({})).await;
    env.wait_bound("later").await;
    env.wait_bound("orphan").await;
    assert_eq!(requests(&env.mock, CREATE_VOLUME).len(), before + 2);
    env.stop().await;
}

#[tokio::test]
async fn populator_sources_are_left_to_their_populator() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim(
        "populated",
        &class,
        json!({"spec": {"dataSourceRef": {"apiGroup": "example.com", "kind": "Hello", "name": "h"}}}),
    )
    .await;
    env.wait_event(
        "populated",
        "Provisioning",
        "Assuming an external populator will provision the volume",
    )
    .await;
    assert!(requests(&env.mock, CREATE_VOLUME).is_empty());
    env.stop().await;
}

#[tokio::test]
async fn attributes_classes_become_mutable_parameters() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env
        .create_class(json!({"parameters": {"kind": "fast"}}))
        .await;
    let gold = env.unique("gold");
    let other = env.unique("other");
    let vacs: Api<k8s_openapi::api::storage::v1::VolumeAttributesClass> = Api::all(env.client());
    for (name, driver) in [
        (&gold, env.driver.as_str()),
        (&other, "other.csi.example.com"),
    ] {
        vacs.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": name}, "driverName": driver,
                "parameters": {"iops": "3000"}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    }
    env.create_claim(
        "tuned",
        &class,
        json!({"spec": {"volumeAttributesClassName": gold}}),
    )
    .await;
    let pv = env.wait_bound("tuned").await;
    assert_eq!(
        pv.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some(gold.as_str())
    );
    let created = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(created[0]["mutable_parameters"]["iops"], "3000");
    assert_eq!(created[0]["parameters"]["kind"], "fast");

    env.create_claim(
        "mismatch",
        &class,
        json!({"spec": {"volumeAttributesClassName": other}}),
    )
    .await;
    env.wait_event(
        "mismatch",
        "ProvisioningFailed",
        &format!(
            "VAC {other} referenced in PVC is for driver other.csi.example.com which does not match driver name {}",
            env.driver
        ),
    )
    .await;
    env.create_claim(
        "absent",
        &class,
        json!({"spec": {"volumeAttributesClassName": "no-such-class"}}),
    )
    .await;
    env.wait_event(
        "absent",
        "ProvisioningFailed",
        "\"no-such-class\" not found",
    )
    .await;
    for name in [&gold, &other] {
        let _ = vacs.delete(name, &DeleteParams::default()).await;
    }
    env.stop().await;
}

async fn served(env: &Env, group_version: &str, kind: &str) -> bool {
    let served = env
        .client()
        .list_api_group_resources(group_version)
        .await
        .is_ok_and(|list| list.resources.iter().any(|r| r.kind == kind));
    if !served {
        eprintln!("skipping: the cluster serves no {group_version} {kind}");
    }
    served
}

#[tokio::test]
async fn cross_namespace_sources_need_a_grant() {
    let mut env = Env::start(
        mock(),
        &["--feature-gates=CrossNamespaceVolumeDataSource=true"],
        |_| {},
    )
    .await;
    if !served(&env, "gateway.networking.k8s.io/v1beta1", "ReferenceGrant").await {
        return env.stop().await;
    }
    // The API server needs the gate too: without it, it drops a dataSourceRef with a namespace.
    if let Some(server) = env.cluster.server() {
        server.set_feature_gate(
            testkit::apiserver::Gate::CrossNamespaceVolumeDataSource,
            true,
        );
    }
    let class = env.create_class(json!({})).await;
    let other = unique("src-ns");
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(env.client());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": other}})).unwrap(),
        )
        .await
        .unwrap();
    let other_claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(env.client(), &other);
    other_claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "src"},
                "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually("the source bound", || {
        let other_claims = other_claims.clone();
        async move {
            let pvc = other_claims.get("src").await.unwrap();
            (pvc.status?.phase.as_deref() == Some("Bound")).then_some(())
        }
    })
    .await;
    let reference = json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": other}}});
    let borrowed = env.create_claim("borrowed", &class, reference).await;
    if borrowed.spec.and_then(|s| s.data_source_ref).is_none() {
        eprintln!("skipping: the API server's CrossNamespaceVolumeDataSource gate is off");
        return env.stop().await;
    }
    env.wait_event(
        "borrowed",
        "ProvisioningFailed",
        &format!(
            "accessing {other}/src of PersistentVolumeClaim dataSource from {}/borrowed isn't allowed",
            env.namespace()
        ),
    )
    .await;
    let grants: Api<DynamicObject> = Api::namespaced_with(
        env.client(),
        &other,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1beta1", "ReferenceGrant"),
            "referencegrants",
        ),
    );
    grants
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "gateway.networking.k8s.io/v1beta1", "kind": "ReferenceGrant",
                "metadata": {"name": "let-clone"},
                "spec": {"from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": env.namespace()}],
                    "to": [{"group": "", "kind": "PersistentVolumeClaim"}]}
            })),
        )
        .await
        .unwrap();
    // The grant is watched: the claim goes on without waiting for its backoff.
    env.wait_bound("borrowed").await;
    let created = requests(&env.mock, CREATE_VOLUME);
    assert!(
        created.last().unwrap()["volume_content_source"]["volume"]["volume_id"].is_string(),
        "{created:?}"
    );
    let _ = other_claims.delete("src", &DeleteParams::default()).await;
    let _ = namespaces.delete(&other, &DeleteParams::default()).await;
    env.stop().await;
}

#[tokio::test]
async fn cross_namespace_sources_are_refused_without_the_gate() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim(
        "borrowed",
        &class,
        json!({"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": "elsewhere"}}}),
    )
    .await;
    let stored = env.pvcs().get("borrowed").await.unwrap();
    if stored
        .spec
        .as_ref()
        .and_then(|s| s.data_source_ref.as_ref())
        .is_none()
    {
        // The API server's own gate is off (Kubernetes' default): it dropped the reference, and
        // the claim is an ordinary one.
        env.wait_bound("borrowed").await;
        assert!(
            requests(&env.mock, CREATE_VOLUME)[0]
                .get("volume_content_source")
                .is_none_or(|s| s.is_null())
        );
    } else {
        env.wait_event(
            "borrowed",
            "ProvisioningFailed",
            "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled",
        )
        .await;
    }
    env.stop().await;
}
