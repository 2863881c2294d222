//! Objects in bulk, for the benchmarks that measure a sidecar's memory with many of them
//! cached: bound claims with their PVs and driver volumes, pods mounting them.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::mockdriver::MockHandle;
use crate::mockdriver::state::Volume;

/// Requests in flight while populating.
const PARALLEL: usize = 64;

/// Where the objects go.
pub struct Population<'a> {
    pub client: kube::Client,
    pub namespace: &'a str,
    /// The driver of the PVs.
    pub driver: &'a str,
    /// The StorageClass of the claims and PVs.
    pub class: &'a str,
}

impl Population<'_> {
    /// `count` bound block claims `c-{i}` of 1Mi with their PVs `pv-{i}`, as the binder leaves
    /// them, each of a volume `vol-{i}` that `mock` has.
    pub async fn bound_claims(&self, mock: &MockHandle, count: usize) {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), self.namespace);
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        futures::stream::iter(0..count)
            .map(|i| {
                let (claims, pvs) = (claims.clone(), pvs.clone());
                async move {
                    let handle = format!("vol-{i}");
                    mock.update_state(|s| {
                        let volume = Volume {
                            id: handle.clone(),
                            name: handle.clone(),
                            capacity_bytes: 1 << 20,
                            ..Default::default()
                        };
                        s.volumes.insert(handle.clone(), volume);
                    })
                    .expect("the mock's state is written");
                    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                        "metadata": {"name": format!("c-{i}")},
                        "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                                 "storageClassName": self.class,
                                 "volumeName": format!("pv-{i}"),
                                 "resources": {"requests": {"storage": "1Mi"}}},
                    }))
                    .expect("a claim");
                    let claim = claims
                        .create(&PostParams::default(), &claim)
                        .await
                        .expect("the claim is created");
                    let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                                   "capacity": {"storage": "1Mi"}}});
                    claims
                        .patch_status(
                            &format!("c-{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(&status),
                        )
                        .await
                        .expect("the claim is bound");
                    let pv: PersistentVolume = serde_json::from_value(json!({
                        "metadata": {"name": format!("pv-{i}")},
                        "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                                 "volumeMode": "Block", "storageClassName": self.class,
                                 "csi": {"driver": self.driver, "volumeHandle": handle},
                                 "claimRef": {"namespace": self.namespace, "name": format!("c-{i}"),
                                              "uid": claim.metadata.uid}},
                        "status": {"phase": "Bound"},
                    }))
                    .expect("a PV");
                    let pv = pvs
                        .create(&PostParams::default(), &pv)
                        .await
                        .expect("the PV is created");
                    let status = json!({"status": {"phase": "Bound"}});
                    pvs.patch_status(
                        pv.metadata.name.as_deref().unwrap_or_default(),
                        &PatchParams::default(),
                        &Patch::Merge(&status),
                    )
                    .await
                    .expect("the PV is bound");
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }

    /// `count` pods on `node`, every other one mounting claim `c-{i / 2}`.
    pub async fn pods(&self, count: usize, node: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), self.namespace);
        futures::stream::iter(0..count)
            .map(|i| {
                let pods = pods.clone();
                async move {
                    let volumes = if i % 2 == 0 {
                        json!([{"name": "data", "persistentVolumeClaim": {"claimName": format!("c-{}", i / 2)}}])
                    } else {
                        json!([{"name": "scratch", "emptyDir": {}}])
                    };
                    let pod: Pod = serde_json::from_value(json!({
                        "metadata": {"name": format!("p-{i}"), "labels": {"app": "bench"}},
                        "spec": {"nodeName": node, "volumes": volumes,
                                 "containers": [{"name": "app", "image": "registry.example/app:1.0",
                                                 "args": ["--serve", "--port=8080"],
                                                 "env": [{"name": "MODE", "value": "production"}]}]},
                    }))
                    .expect("a pod");
                    pods.create(&PostParams::default(), &pod)
                        .await
                        .expect("the pod is created");
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }
}
