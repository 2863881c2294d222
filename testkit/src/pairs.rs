//! Bound PVC+PV pairs, as a cluster running for a while holds them, for benchmarks that measure
//! sidecars with full caches.
//!
//! Each claim is made first, and its volume's claimRef then carries the UID the API server gave
//! it: a claimRef with any other UID names a claim that is gone, which makes the volume a
//! released one that the provisioner deletes.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

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
        let volume = format!("pvc-00000000-0000-0000-0000-{i:012}");
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
