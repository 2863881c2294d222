//! Bound PVC+PV pairs, as a cluster running for a while holds them, for benchmarks that measure
//! sidecars with full caches.
//!
//! Each claim is made first, and its volume's claimRef then carries the UID the API server gave
//! it: a claimRef with any other UID names a claim that is gone, which makes the volume a
//! released one that the provisioner deletes.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;

use crate::mockdriver::MockHandle;
use crate::mockdriver::state::{AccessMode, AccessType, Capability, Publication, Snapshot, Volume};

/// Requests at once while filling.
const PARALLEL: usize = 64;

/// What the pairs look like: every claim asks `class` of `driver` for 1 GiB, every volume was
/// provisioned by `driver` (with its finalizer and attributes, as the provisioner writes them).
#[derive(Clone, Copy, Debug)]
pub struct Pairs<'a> {
    pub driver: &'a str,
    pub class: &'a str,
    pub namespace: &'a str,
}

impl Pairs<'_> {
    /// Makes pairs `pair-{i}` for `0..count`; their volumes are named as the provisioner names
    /// them (`pvc-` and a UID's worth of characters), so that names cost what real ones do.
    pub async fn fill(&self, client: &kube::Client, count: usize) -> Result<(), kube::Error> {
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), self.namespace);
        let made: Vec<Result<(), kube::Error>> = futures::stream::iter(0..count)
            .map(|i| {
                let (pvs, pvcs) = (pvs.clone(), pvcs.clone());
                async move { self.make(&pvs, &pvcs, i).await }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        made.into_iter().collect()
    }

    async fn make(
        &self,
        pvs: &Api<PersistentVolume>,
        pvcs: &Api<PersistentVolumeClaim>,
        i: usize,
    ) -> Result<(), kube::Error> {
        let (driver, class) = (self.driver, self.class);
        let name = format!("pair-{i}");
        let volume = Self::volume_name(i);
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {
                "volume.kubernetes.io/storage-provisioner": driver,
                "pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                "volumeName": volume, "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .map_err(kube::Error::SerdeError)?;
        let claim = pvcs.create(&PostParams::default(), &claim).await?;
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": volume,
                "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
                "annotations": {"pv.kubernetes.io/provisioned-by": driver,
                    "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                    "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": class,
                "claimRef": {"kind": "PersistentVolumeClaim", "namespace": self.namespace,
                    "name": name, "uid": claim.metadata.uid},
                "csi": {"driver": driver, "volumeHandle": format!("vol-{i}"), "fsType": "ext4",
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                        format!("1700000000000-1-{driver}")}}}
        }))
        .map_err(kube::Error::SerdeError)?;
        pvs.create(&PostParams::default(), &pv).await?;
        Ok(())
    }

    /// Attaches the volumes of pairs `0..count`, as a cluster with that many volumes in use
    /// holds them: a VolumeAttachment `va-{i}` to node `node-{i % nodes}` (whose CSI node ID
    /// is `nid-{i % nodes}`) with the attacher's finalizer and `attached: true`, the attacher's
    /// finalizer on the volume, and the volume published to that node in `mock`.
    pub async fn attach(
        &self,
        client: &kube::Client,
        mock: &MockHandle,
        count: usize,
        nodes: usize,
    ) -> Result<(), kube::Error> {
        let finalizer = format!("external-attacher/{}", self.driver.replace('.', "-"));
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let nodes = nodes.max(1);
        let capability = Capability {
            access_mode: AccessMode::SingleNodeWriter,
            access_type: AccessType::Mount {
                fs_type: "ext4".to_string(),
                mount_flags: Vec::new(),
            },
        };
        mock.update_state(|state| {
            for i in 0..count {
                let handle = format!("vol-{i}");
                let volume = state
                    .volumes
                    .entry(handle.clone())
                    .or_insert_with(|| Volume {
                        id: handle.clone(),
                        name: handle,
                        capacity_bytes: 1 << 30,
                        ..Default::default()
                    });
                volume.published.insert(
                    format!("nid-{}", i % nodes),
                    Publication {
                        readonly: false,
                        capability: capability.clone(),
                    },
                );
            }
        })
        .map_err(|err| kube::Error::Service(err.to_string().into()))?;
        let made: Vec<Result<(), kube::Error>> = futures::stream::iter(0..count)
            .map(|i| {
                let (pvs, vas, finalizer) = (pvs.clone(), vas.clone(), finalizer.clone());
                async move {
                    let pv = Self::volume_name(i);
                    let finalizers = json!({"metadata": {"finalizers": [
                        "external-provisioner.volume.kubernetes.io/finalizer", finalizer]}});
                    pvs.patch(&pv, &PatchParams::default(), &Patch::Merge(&finalizers))
                        .await?;
                    let name = format!("va-{i}");
                    let va: VolumeAttachment = serde_json::from_value(json!({
                        "metadata": {"name": name, "finalizers": [finalizer],
                            "annotations": {"csi.alpha.kubernetes.io/node-id": format!("nid-{}", i % nodes)}},
                        "spec": {"attacher": self.driver, "nodeName": format!("node-{}", i % nodes),
                            "source": {"persistentVolumeName": pv}}
                    }))
                    .map_err(kube::Error::SerdeError)?;
                    vas.create(&PostParams::default(), &va).await?;
                    let status = json!({"status": {"attached": true}});
                    vas.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await?;
                    Ok(())
                }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        made.into_iter().collect()
    }

    /// Snapshots of the volumes of pairs `0..count`, as a cluster that keeps backups holds them:
    /// a ready VolumeSnapshotContent `content-{i}` of snapshot `snap-{i}` (which `mock` has),
    /// of `snapshot_class`, retained, and the VolumeSnapshot `snap-{i}` bound to it (the test
    /// kit's snapshot controller binds them).
    pub async fn snapshots(
        &self,
        client: &kube::Client,
        mock: &MockHandle,
        count: usize,
        snapshot_class: &str,
    ) -> Result<(), kube::Error> {
        let resource = |kind: &str, plural: &str| {
            ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
                plural,
            )
        };
        let contents: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
        );
        let snapshots: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            self.namespace,
            &resource("VolumeSnapshot", "volumesnapshots"),
        );
        const CUT_AT: i64 = 1_700_000_000;
        mock.update_state(|state| {
            for i in 0..count {
                let id = format!("snap-{i}");
                state.snapshots.insert(
                    id.clone(),
                    Snapshot {
                        id: id.clone(),
                        name: id,
                        source_volume_id: format!("vol-{i}"),
                        size_bytes: 1 << 30,
                        creation_seconds: CUT_AT,
                        creation_nanos: 0,
                        answers: 1,
                        group_snapshot_id: String::new(),
                    },
                );
            }
        })
        .map_err(|err| kube::Error::Service(err.to_string().into()))?;
        let made: Vec<Result<(), kube::Error>> = futures::stream::iter(0..count)
            .map(|i| {
                let (contents, snapshots) = (contents.clone(), snapshots.clone());
                async move {
                    let content = format!("content-{i}");
                    let snapshot = format!("snap-{i}");
                    let object: DynamicObject = serde_json::from_value(json!({
                        "apiVersion": "snapshot.storage.k8s.io/v1",
                        "kind": "VolumeSnapshotContent",
                        "metadata": {"name": content},
                        "spec": {"deletionPolicy": "Retain", "driver": self.driver,
                            "source": {"snapshotHandle": snapshot},
                            "volumeSnapshotClassName": snapshot_class,
                            "volumeSnapshotRef": {"kind": "VolumeSnapshot",
                                "name": snapshot, "namespace": self.namespace}}
                    }))
                    .map_err(kube::Error::SerdeError)?;
                    contents.create(&PostParams::default(), &object).await?;
                    let status = json!({"status": {"readyToUse": true, "snapshotHandle": snapshot,
                        "restoreSize": 1i64 << 30, "creationTime": CUT_AT * 1_000_000_000}});
                    contents
                        .patch_status(&content, &PatchParams::default(), &Patch::Merge(&status))
                        .await?;
                    let object: DynamicObject = serde_json::from_value(json!({
                        "apiVersion": "snapshot.storage.k8s.io/v1",
                        "kind": "VolumeSnapshot",
                        "metadata": {"name": snapshot},
                        "spec": {"volumeSnapshotClassName": snapshot_class,
                            "source": {"volumeSnapshotContentName": content}}
                    }))
                    .map_err(kube::Error::SerdeError)?;
                    snapshots.create(&PostParams::default(), &object).await?;
                    Ok(())
                }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        made.into_iter().collect()
    }

    /// The name of pair `i`'s volume, as the provisioner names volumes.
    fn volume_name(i: usize) -> String {
        format!("pvc-00000000-0000-0000-0000-{i:012}")
    }

    /// How many claims of the namespace and volumes are bound (the smaller count): the pairs
    /// made, and any claim provisioned since, while no sidecar released or deleted one.
    pub async fn bound(&self, client: &kube::Client) -> Result<usize, kube::Error> {
        let bound = |phase: Option<&str>| phase == Some("Bound");
        let volumes = Api::<PersistentVolume>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|pv| bound(pv.status.as_ref().and_then(|s| s.phase.as_deref())))
            .count();
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), self.namespace)
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|c| bound(c.status.as_ref().and_then(|s| s.phase.as_deref())))
            .count();
        Ok(volumes.min(claims))
    }
}
