//! The built-in PV controller: provisioner announcement, binding, phases.

use crate::apiserver_support::{eventually, obj};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::apiserver::{ApiServer, Options};

async fn setup(mode: &str) -> (ApiServer, Api<PersistentVolumeClaim>, Api<PersistentVolume>) {
    let server = ApiServer::start_with(Options {
        pv_controller: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let scs: Api<StorageClass> = Api::all(server.client());
    scs.create(&PostParams::default(), &obj(json!({"metadata": {"name": "fast"}, "provisioner": "csi.example.com", "volumeBindingMode": mode}))).await.unwrap();
    scs.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner"})),
    )
    .await
    .unwrap();
    let pvcs = Api::namespaced(server.client(), "default");
    let pvs = Api::all(server.client());
    (server, pvcs, pvs)
}

fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    obj(
        json!({"metadata": {"name": name}, "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
    )
}

fn ann(pvc: &PersistentVolumeClaim, key: &str) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key).cloned())
}

#[tokio::test]
async fn immediate_claims_get_the_provisioner_annotations() {
    let (_s, pvcs, _) = setup("Immediate").await;
    pvcs.create(&PostParams::default(), &claim("c", "fast"))
        .await
        .unwrap();
    let c = eventually(|| async {
        pvcs.get("c")
            .await
            .ok()
            .filter(|c| ann(c, "volume.kubernetes.io/storage-provisioner").is_some())
    })
    .await;
    assert_eq!(
        ann(&c, "volume.kubernetes.io/storage-provisioner").as_deref(),
        Some("csi.example.com")
    );
    assert_eq!(
        ann(&c, "volume.beta.kubernetes.io/storage-provisioner").as_deref(),
        Some("csi.example.com")
    );
    pvcs.create(&PostParams::default(), &claim("in-tree", "local"))
        .await
        .unwrap();
    // Once a later claim has been handled, the in-tree one has been too.
    pvcs.create(&PostParams::default(), &claim("marker", "fast"))
        .await
        .unwrap();
    eventually(|| async {
        pvcs.get("marker")
            .await
            .ok()
            .filter(|c| ann(c, "volume.kubernetes.io/storage-provisioner").is_some())
    })
    .await;
    assert!(
        ann(
            &pvcs.get("in-tree").await.unwrap(),
            "volume.kubernetes.io/storage-provisioner"
        )
        .is_none()
    );
}

#[tokio::test]
async fn wait_for_first_consumer_waits_for_the_selected_node() {
    let (_s, pvcs, _) = setup("WaitForFirstConsumer").await;
    pvcs.create(&PostParams::default(), &claim("c", "fast"))
        .await
        .unwrap();
    pvcs.create(&PostParams::default(), &claim("marker", "fast"))
        .await
        .unwrap();
    pvcs.patch(
        "marker",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "n1"}}}),
        ),
    )
    .await
    .unwrap();
    eventually(|| async {
        pvcs.get("marker")
            .await
            .ok()
            .filter(|c| ann(c, "volume.kubernetes.io/storage-provisioner").is_some())
    })
    .await;
    assert!(
        ann(
            &pvcs.get("c").await.unwrap(),
            "volume.kubernetes.io/storage-provisioner"
        )
        .is_none()
    );
}

#[tokio::test]
async fn binds_provisioned_volumes_and_releases_them() {
    let (_s, pvcs, pvs) = setup("Immediate").await;
    let c = pvcs
        .create(&PostParams::default(), &claim("c", "fast"))
        .await
        .unwrap();
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": "pvc-1", "annotations": {"pv.kubernetes.io/provisioned-by": "csi.example.com"}},
        "spec": {
            "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "persistentVolumeReclaimPolicy": "Delete",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c", "uid": c.metadata.uid},
            "csi": {"driver": "csi.example.com", "volumeHandle": "vol-1"}
        }
    }));
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let bound = eventually(|| async {
        pvcs.get("c")
            .await
            .ok()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
    })
    .await;
    assert_eq!(
        bound.spec.as_ref().unwrap().volume_name.as_deref(),
        Some("pvc-1")
    );
    assert_eq!(
        ann(&bound, "pv.kubernetes.io/bind-completed").as_deref(),
        Some("yes")
    );
    assert_eq!(
        ann(&bound, "pv.kubernetes.io/bound-by-controller").as_deref(),
        Some("yes")
    );
    assert_eq!(bound.status.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    let phase = |pv: &PersistentVolume| pv.status.as_ref().and_then(|s| s.phase.clone());
    eventually(|| async {
        pvs.get("pvc-1")
            .await
            .ok()
            .filter(|p| phase(p).as_deref() == Some("Bound"))
    })
    .await;
    pvcs.delete("c", &DeleteParams::default()).await.unwrap();
    eventually(|| async {
        pvs.get("pvc-1")
            .await
            .ok()
            .filter(|p| phase(p).as_deref() == Some("Released"))
    })
    .await;
}

#[tokio::test]
async fn unbound_volumes_become_available() {
    let (_s, _pvcs, pvs) = setup("Immediate").await;
    pvs.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "free"}, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "csi": {"driver": "d.example.com", "volumeHandle": "free"}}})),
    )
    .await
    .unwrap();
    eventually(|| async {
        pvs.get("free")
            .await
            .ok()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available"))
    })
    .await;
}
