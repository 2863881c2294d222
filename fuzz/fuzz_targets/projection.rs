//! The projection of Kubernetes objects, as JSON, into the sidecars' models: claims, classes,
//! volumes (with the CSI translation of in-tree volumes), VolumeAttachments, CSINodes, Nodes and
//! pods.
//!
//! The first byte picks the kind; the rest is JSON. When it parses, it is merged into a valid
//! object of that kind (so that most inputs get past the required fields); when it does not,
//! it is still handed to the deserializer.
//!
//! Properties:
//! - a claim's projection survives its own serialization (the provisioner journals it); it has
//!   what provisioning needs exactly while it has no volume, without the last-applied
//!   annotation;
//! - the provisioner and the attacher read a PV alike: the same driver and volume handle
//!   (after translating an in-tree volume), the same in-tree verdict and translation error;
//! - a VolumeAttachment names the same PV and node for both sidecars, and equals itself but
//!   for errors;
//! - the resizer reads a PV as the provisioner does (driver, volume handle, in-tree verdict),
//!   a claim's sizes parse as the quantities they came from, and only pods that mount claims
//!   are kept;
//! - the snapshotter's plan for any VolumeSnapshotContent is total: a content to delete is
//!   planned for deletion, its finalizer removal exists exactly when it has the finalizer, and
//!   a content compared with itself is no change to act on; the same for a
//!   VolumeGroupSnapshotContent, and a cut group is read with its members' handles;
//! - projecting an object and projecting its JSON round trip give the same model.
#![no_main]

use external_attacher::model::{Pv, Va, csinode_node_id};
use external_provisioner::model::{
    Claim, Class, Volume, attachment_of, csinode_topology_keys, node_labels,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(target.entry(key).or_insert(Value::Null), value);
            }
        }
        (target, patch) => *target = patch,
    }
}

/// The object: the input merged into `base` when it is JSON, else the input as is.
fn object<T: DeserializeOwned>(base: Value, input: &[u8]) -> Option<T> {
    match serde_json::from_slice::<Value>(input) {
        Ok(patch) => {
            let mut merged = base;
            merge(&mut merged, patch);
            serde_json::from_value(merged).ok()
        }
        Err(_) => serde_json::from_slice(input).ok(),
    }
}

/// The object after a JSON round trip, as a watch would deliver it again.
fn again<T: Serialize + DeserializeOwned>(object: &T) -> T {
    let text = serde_json::to_string(object).expect("k8s objects serialize");
    serde_json::from_str(&text).expect("k8s objects read back what they write")
}

fn claim(input: &[u8]) {
    let base = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let Some(pvc) = object::<PersistentVolumeClaim>(base, input) else {
        return;
    };
    let claim = Claim::from_api(&pvc);
    assert_eq!(claim, Claim::from_api(&again(&pvc)));
    let journaled = serde_json::to_string(&claim).expect("claims serialize");
    let read: Claim = serde_json::from_str(&journaled).expect("claims read back");
    assert_eq!(read, claim);
    assert_eq!(claim.pending.is_some(), claim.volume_name.is_empty());
    if let Some(pending) = &claim.pending {
        assert!(!pending.annotations.contains_key(LAST_APPLIED));
    }
    let _ = claim.source_key();
    let _ = claim.provisioner();
    let _ = claim.selected_node();
    let _ = claim.object_ref();
}

fn class(input: &[u8]) {
    let base = json!({"metadata": {"name": "fast"}, "provisioner": "d"});
    let Some(sc) = object::<StorageClass>(base, input) else {
        return;
    };
    let class = Class::from_api(&sc);
    assert_eq!(class, Class::from_api(&again(&sc)));
    assert_eq!(class.provisioner, sc.provisioner);
    let terms: usize = sc
        .allowed_topologies
        .iter()
        .flatten()
        .map(|t| t.match_label_expressions.iter().flatten().count())
        .sum();
    assert_eq!(
        terms,
        class.allowed_topologies.iter().map(Vec::len).sum::<usize>()
    );
}

fn volume(input: &[u8]) {
    let base = json!({"metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "d", "volumeHandle": "h"}}});
    let Some(pv) = object::<PersistentVolume>(base, input) else {
        return;
    };
    let provisioner = Volume::from_api(&pv);
    let attacher = Pv::from_api(&pv);
    assert_eq!(provisioner, Volume::from_api(&again(&pv)));
    assert_eq!(attacher, Pv::from_api(&again(&pv)));
    let (driver, handle) = attacher
        .spec
        .csi
        .as_ref()
        .map(|c| (c.driver.as_str(), c.volume_handle.as_str()))
        .unwrap_or_default();
    assert_eq!(provisioner.driver.as_str(), driver);
    assert_eq!(provisioner.volume_handle, handle);
    assert_eq!(provisioner.migrated, attacher.in_tree.is_some());
    assert_eq!(
        provisioner.translation_error,
        attacher.in_tree.as_ref().and_then(|t| t.error.clone())
    );
    for driver in ["d", "ebs.csi.aws.com", "pd.csi.storage.gke.io"] {
        let _ = provisioner.owned_by(driver);
        let _ = attacher.concerns(driver, "f");
        let _ = attacher.migration_rolled_back(driver);
    }
}

fn resizer_claim(input: &[u8]) {
    let base = json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u"},
        "spec": {"volumeName": "pv", "resources": {"requests": {"storage": "2Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}});
    let Some(pvc) = object::<PersistentVolumeClaim>(base, input) else {
        return;
    };
    let claim = external_resizer::model::Claim::from_api(&pvc);
    assert_eq!(
        claim,
        external_resizer::model::Claim::from_api(&again(&pvc))
    );
    let _ = external_resizer::decide::needs_resize(&claim);
    let _ = claim.object_ref();
}

fn resizer_volume(input: &[u8]) {
    let base = json!({"metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "csi": {"driver": "d", "volumeHandle": "h"}}});
    let Some(pv) = object::<PersistentVolume>(base, input) else {
        return;
    };
    let provisioner = Volume::from_api(&pv);
    for driver in ["d", "ebs.csi.aws.com", "pd.csi.storage.gke.io"] {
        let Some(resizer) = external_resizer::model::Pv::from_api(&pv, driver) else {
            continue;
        };
        assert_eq!(
            Some(resizer.clone()),
            external_resizer::model::Pv::from_api(&again(&pv), driver)
        );
        // (A PV with both a CSI and an in-tree source, which the API server refuses, is native
        // to the resizer and migrated to the provisioner.)
        assert!(!resizer.in_tree || provisioner.migrated);
        if resizer.in_tree == provisioner.migrated && resizer.translation_error.is_none() {
            assert_eq!(resizer.volume_handle, provisioner.volume_handle);
        }
    }
}

fn pod(input: &[u8]) {
    let base = json!({"metadata": {"name": "p", "namespace": "ns"},
        "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}});
    let Some(pod) = object::<Pod>(base, input) else {
        return;
    };
    let mounts = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.persistent_volume_claim.is_some()));
    assert_eq!(
        external_resizer::model::PodClaims::from_api(&pod).is_some(),
        mounts
    );
}

fn attachment(input: &[u8]) {
    let base = json!({"metadata": {"name": "va"},
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}}});
    let Some(va) = object::<VolumeAttachment>(base, input) else {
        return;
    };
    let model = Va::from_api(&va);
    assert_eq!(model, Va::from_api(&again(&va)));
    assert!(model.same_except_errors(&model));
    if let Some(pv) = model.pv_name() {
        assert_eq!(
            attachment_of(&va),
            Some((pv.to_string(), model.node_name.to_string()))
        );
    }
    let _ = model.object_ref();
}

fn csinode(input: &[u8]) {
    let base = json!({"metadata": {"name": "n"},
        "spec": {"drivers": [{"name": "d", "nodeID": "id", "topologyKeys": ["zone"]}]}});
    let Some(node) = object::<CSINode>(base, input) else {
        return;
    };
    for driver in ["d", ""] {
        assert_eq!(
            csinode_topology_keys(&node, driver).is_some(),
            csinode_node_id(&node, driver).is_some()
        );
    }
}

fn node(input: &[u8]) {
    let base = json!({"metadata": {"name": "n", "labels": {"zone": "a"}}});
    let Some(node) = object::<Node>(base, input) else {
        return;
    };
    assert_eq!(
        node_labels(&node).len(),
        node.metadata.labels.as_ref().map_or(0, |l| l.len())
    );
}

fn snapshot_content(input: &[u8]) {
    use external_snapshotter::{decide, model};
    let base = json!({"metadata": {"name": "snapcontent-1", "uid": "u", "resourceVersion": "1"},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "source": {"volumeHandle": "v"},
            "volumeSnapshotRef": {"name": "s", "namespace": "ns", "uid": "vs"}}});
    let merged = match serde_json::from_slice::<Value>(input) {
        Ok(patch) => {
            let mut merged = base;
            merge(&mut merged, patch);
            merged
        }
        Err(_) => return,
    };
    let Ok(object) = serde_json::from_value::<model::VolumeSnapshotContent>(merged) else {
        return;
    };
    let content = model::Content::from_api(&object);
    let plan = decide::plan(&content, input.len() % 2 == 0);
    if decide::should_delete(&content) {
        assert!(matches!(plan, decide::Plan::Delete { .. }), "{plan:?}");
    }
    assert_eq!(
        decide::finalizer_removal(&content).is_some(),
        content.has_finalizer()
    );
    assert!(!decide::should_enqueue(&content, &content.clone()));
    if content.secret == model::SecretAnnotations::None {
        assert_eq!(decide::content_secret(&content), Ok(None));
    }
}

fn group_content(input: &[u8]) {
    use external_snapshotter::{decide, model};
    let base = json!({"metadata": {"name": "groupsnapcontent-1", "uid": "u", "resourceVersion": "1"},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "source": {"volumeHandles": ["v1", "v2"]},
            "volumeGroupSnapshotRef": {"name": "g", "namespace": "ns", "uid": "vgs"}}});
    let merged = match serde_json::from_slice::<Value>(input) {
        Ok(patch) => {
            let mut merged = base;
            merge(&mut merged, patch);
            merged
        }
        Err(_) => return,
    };
    let Ok(object) = serde_json::from_value::<model::VolumeGroupSnapshotContent>(merged) else {
        return;
    };
    let content = model::GroupContent::from_api(&object);
    let plan = decide::group_plan(&content);
    if decide::should_delete(&content) {
        assert!(matches!(plan, decide::GroupPlan::Delete { .. }), "{plan:?}");
    }
    if let decide::GroupPlan::Check { snapshot_ids, .. } = &plan
        && content.pre_provisioned.is_none()
    {
        assert!(
            !snapshot_ids.is_empty(),
            "a cut group is read with its members"
        );
    }
    assert_eq!(
        decide::group_finalizer_removal(&content).is_some(),
        content.has_finalizer()
    );
    if content.secret == model::SecretAnnotations::None {
        assert_eq!(decide::group_secret(&content), Ok(None));
    }
}

fn versions(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let (a, b) = text.split_once(' ').unwrap_or((&text, ""));
    if let (Some(ab), Some(ba)) = (
        external_attacher::model::newer(a, b),
        external_attacher::model::newer(b, a),
    ) {
        assert!(!(ab && ba), "{a:?} and {b:?} both newer");
    }
}

fuzz_target!(|data: &[u8]| {
    let [kind, input @ ..] = data else {
        return;
    };
    match kind % 12 {
        0 => claim(input),
        1 => class(input),
        2 => volume(input),
        3 => attachment(input),
        4 => csinode(input),
        5 => node(input),
        6 => resizer_claim(input),
        7 => resizer_volume(input),
        8 => pod(input),
        9 => snapshot_content(input),
        10 => group_content(input),
        _ => versions(input),
    }
});
