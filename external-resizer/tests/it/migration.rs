//! CSI migration: an in-tree PV of a plugin whose replacement is this driver is expanded
//! through its CSI translation once kube-controller-manager has named the driver on the claim,
//! the in-tree PV gets the new capacity, and the call is labelled `migrated`.

use crate::common::*;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use sidecar_kit::driver::csi::CallOptions;
use testkit::mockdriver::MockDriver;

const EBS: &str = "ebs.csi.aws.com";
const EXPAND: &str = "/csi.v1.Controller/ControllerExpandVolume";

#[tokio::test]
async fn an_in_tree_volume_handed_to_this_driver_is_expanded_through_its_translation() {
    let env = Env::start_as(Some(EBS), MockDriver::builder(), |_| {}).await;
    if env.cluster.is_real() {
        println!("skipped on a real cluster: the migration target's name would be shared");
        return;
    }
    let volume = env
        .csi
        .create_volume(
            CreateVolumeRequest {
                name: "in-tree".into(),
                capacity_range: Some(csi_proto::v1::CapacityRange {
                    required_bytes: GI,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![VolumeCapability {
                    access_type: Some(AccessType::Mount(MountVolume::default())),
                    access_mode: Some(AccessMode {
                        mode: Mode::SingleNodeWriter as i32,
                    }),
                }],
                ..Default::default()
            },
            CallOptions::timeout(std::time::Duration::from_secs(5)),
        )
        .await
        .unwrap()
        .volume
        .unwrap();
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "legacy", "namespace": env.ns(),
                     "annotations": {"volume.kubernetes.io/storage-resizer": EBS}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": env.n("expandable"),
                 "volumeName": "pv-legacy", "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    let claim = env
        .claims()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "pv-legacy"},
        "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                 "storageClassName": env.n("expandable"),
                 "persistentVolumeReclaimPolicy": "Retain",
                 "awsElasticBlockStore": {"volumeID": format!("aws://us-east-1a/{}", volume.volume_id), "fsType": "ext4"},
                 "claimRef": {"namespace": env.ns(), "name": "legacy", "uid": claim.metadata.uid}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(env.client())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    env.claim_until("legacy", "the claim bound", |c| {
        c["status"]["phase"] == "Bound"
    })
    .await;
    let patch = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    env.claims()
        .patch("legacy", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.claim_until("legacy", "the node step pending", |c| {
        c["status"]["allocatedResourceStatuses"]["storage"] == "NodeResizePending"
    })
    .await;
    let pv = Api::<PersistentVolume>::all(env.client())
        .get("pv-legacy")
        .await
        .unwrap();
    let spec = pv.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert!(spec.csi.is_none(), "the PV stays in-tree");
    assert!(spec.aws_elastic_block_store.is_some());
    let calls = env.mock.calls().of(EXPAND);
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0].request.contains(&volume.volume_id),
        "the translated handle: {}",
        calls[0].request
    );
    assert!(calls[0].request.contains("ext4"), "{}", calls[0].request);
    assert_eq!(env.driver_size(&volume.volume_id), 2 * GI);
}
