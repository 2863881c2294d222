//! Claims and PVs are listed in protobuf, as upstream's sidecars list them, and make the same
//! views as their JSON does.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use sidecar_kit::pipeline::views::{ClaimView, Needs, PvView, View};
use sidecar_kit::pipeline::watches::{Start, WatchHub};
use sidecar_kit::pipeline::{Change, Pipeline};
use testkit::apiserver::TestCluster;
use tokio_util::sync::CancellationToken;

type Listed<V> = Arc<Mutex<Vec<Arc<V>>>>;

/// A pipeline that keeps the views it is handed from lists of `api`'s objects with `label`.
fn lister<V: View>(api: &Api<V::Object>, label: &str) -> (Pipeline, Listed<V>)
where
    <V::Object as kube::Resource>::DynamicType: Default,
{
    let listed: Listed<V> = Arc::default();
    let mut pipeline = Pipeline::with_watches(WatchHub::default());
    let views = listed.clone();
    pipeline.watch_view(
        api.clone(),
        watcher::Config::default().labels(label),
        Needs::ALL,
        Start::Awaited,
        move |change: Change<&Arc<V>>| {
            if let Change::Listed(view) = change {
                views.lock().unwrap().push(view.clone());
            }
        },
    );
    (pipeline, listed)
}

#[tokio::test]
async fn claims_and_volumes_listed_in_protobuf_view_as_their_json_does() {
    let cluster = TestCluster::start().await.unwrap();
    let ns = cluster.namespace().to_string();
    let label = format!("protobuf-list={ns}");
    let labels = json!({"protobuf-list": ns});
    let pvs: Api<PersistentVolume> = Api::all(cluster.client());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), &ns);
    let (csi, in_tree) = (cluster.cluster_name("csi"), cluster.cluster_name("gce"));
    let objects = [
        json!({
            "metadata": {"name": csi, "labels": labels, "finalizers": ["example.com/hold"],
                         "annotations": {"pv.kubernetes.io/provisioned-by": "p.csi.test",
                                         "volume.kubernetes.io/provisioner-deletion-secret-name": "s",
                                         "volume.kubernetes.io/provisioner-deletion-secret-namespace": ns}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                     "mountOptions": ["ro"], "volumeMode": "Block",
                     "claimRef": {"namespace": ns, "name": "gone", "uid": "0b7d2b4e-0000-4000-8000-000000000001"},
                     "csi": {"driver": "p.csi.test", "volumeHandle": "h", "readOnly": true, "fsType": "xfs",
                             "volumeAttributes": {"a": "b"},
                             "controllerPublishSecretRef": {"name": "p", "namespace": ns},
                             "controllerExpandSecretRef": {"name": "e", "namespace": ns}}},
        }),
        json!({
            "metadata": {"name": in_tree, "labels": labels},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadOnlyMany"],
                     "gcePersistentDisk": {"pdName": "pd", "partition": 0, "readOnly": false},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]}]}}},
        }),
    ];
    for pv in objects {
        pvs.create(&PostParams::default(), &serde_json::from_value(pv).unwrap())
            .await
            .unwrap();
    }
    let claim = json!({
        "metadata": {"name": "c", "labels": labels,
                     "annotations": {"volume.kubernetes.io/storage-resizer": "p.csi.test", "a": ""}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "selector": {"matchLabels": {"tier": "db"},
                              "matchExpressions": [{"key": "env", "operator": "Exists"}]},
                 "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
                 "dataSource": {"kind": "PersistentVolumeClaim", "name": "other"}},
    });
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(claim).unwrap(),
        )
        .await
        .unwrap();

    // The volume controller moves new PVs on from Pending (the one bound to a claim that is
    // gone to Released); the lists are of the objects after it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for name in [&csi, &in_tree] {
        loop {
            let pv = pvs.get(name).await.unwrap();
            let phase = pv.status.and_then(|s| s.phase);
            if phase.is_some_and(|p| p != "Pending") {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} stays Pending"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let shutdown = CancellationToken::new();
    let (mut pv_lister, pv_views) = lister::<PvView>(&pvs, &label);
    let (mut claim_lister, claim_views) = lister::<ClaimView>(&claims, &label);
    let synced = tokio::time::timeout(Duration::from_secs(30), async {
        pv_lister.wait_synced(&shutdown).await && claim_lister.wait_synced(&shutdown).await
    });
    assert!(synced.await.unwrap());

    // The same objects read as JSON.
    for name in [&csi, &in_tree] {
        let json = PvView::from_api(&pvs.get(name).await.unwrap(), Needs::ALL);
        let listed = pv_views.lock().unwrap();
        let view = listed.iter().find(|v| *v.name == **name).expect("listed");
        assert_eq!(**view, json, "{name}");
    }
    let view = claim_views.lock().unwrap()[0].clone();
    let json = ClaimView::from_api(&claims.get("c").await.unwrap(), Needs::ALL);
    assert_eq!(*view, json);
    assert!(view.unbound.as_ref().unwrap().spec.selector.is_some());

    // The test kit answered in protobuf (a real cluster does for these kinds).
    if let Some(counters) = cluster.counters() {
        assert_eq!(counters.protobuf_lists("persistentvolumes"), 1);
        assert_eq!(counters.protobuf_lists("persistentvolumeclaims"), 1);
    }
    pv_lister.stop().await;
    claim_lister.stop().await;
    let mut held = pvs.get(&csi).await.unwrap();
    held.metadata.finalizers = None;
    pvs.replace(&csi, &PostParams::default(), &held)
        .await
        .unwrap();
    for name in [&csi, &in_tree] {
        pvs.delete(name, &DeleteParams::default()).await.unwrap();
    }
    cluster.cleanup().await.unwrap();
}
