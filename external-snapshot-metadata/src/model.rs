//! The objects the sidecar reads, as read (only the fields it uses). No I/O.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// The API group of VolumeSnapshots, their contents and classes.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// The API group of SnapshotMetadataService.
pub const CBT_GROUP: &str = "cbt.storage.k8s.io";
/// Marks the VolumeSnapshotClass a driver's snapshots take when they name none.
pub const DEFAULT_CLASS: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// The class parameters naming the secret of the driver's snapshot calls (templates).
pub const SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
pub const SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";

/// A `snapshot.storage.k8s.io/v1` VolumeSnapshot, as read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VolumeSnapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SnapshotSpec,
    /// Absent until the snapshot-controller first writes it.
    #[serde(default)]
    pub status: Option<SnapshotStatus>,
}

sidecar_kit::custom_resource!(
    VolumeSnapshot,
    k8s_openapi::NamespaceResourceScope,
    SNAPSHOT_GROUP,
    "v1",
    "VolumeSnapshot",
    "volumesnapshots"
);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    pub volume_snapshot_class_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    pub bound_volume_snapshot_content_name: Option<String>,
    pub ready_to_use: Option<bool>,
}

/// A `snapshot.storage.k8s.io/v1` VolumeSnapshotContent, as read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VolumeSnapshotContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ContentSpec,
    #[serde(default)]
    pub status: Option<ContentStatus>,
}

sidecar_kit::custom_resource!(
    VolumeSnapshotContent,
    k8s_openapi::ClusterResourceScope,
    SNAPSHOT_GROUP,
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents"
);

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ContentSpec {
    #[serde(default)]
    pub driver: String,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentStatus {
    pub snapshot_handle: Option<String>,
    pub ready_to_use: Option<bool>,
}

/// A `snapshot.storage.k8s.io/v1` VolumeSnapshotClass, as read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VolumeSnapshotClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
}

sidecar_kit::custom_resource!(
    VolumeSnapshotClass,
    k8s_openapi::ClusterResourceScope,
    SNAPSHOT_GROUP,
    "v1",
    "VolumeSnapshotClass",
    "volumesnapshotclasses"
);

/// What the sidecar keeps of a VolumeSnapshotClass of its driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Class {
    pub is_default: bool,
    pub parameters: BTreeMap<String, String>,
}

impl Class {
    /// What is kept of `class` when it is one of `driver`'s.
    pub fn of_driver(class: &VolumeSnapshotClass, driver: &str) -> Option<Self> {
        (class.driver == driver).then(|| Self::from_api(class))
    }

    pub fn from_api(class: &VolumeSnapshotClass) -> Self {
        let is_default = class
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS))
            .is_some_and(|v| v == "true");
        Self {
            is_default,
            parameters: class.parameters.clone(),
        }
    }
}

/// A `cbt.storage.k8s.io/v1beta1` SnapshotMetadataService: where backup applications find a
/// driver's service, and the audience their tokens must carry. Named after the driver.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SnapshotMetadataService {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ServiceSpec,
}

sidecar_kit::custom_resource!(
    SnapshotMetadataService,
    k8s_openapi::ClusterResourceScope,
    CBT_GROUP,
    "v1beta1",
    "SnapshotMetadataService",
    "snapshotmetadataservices"
);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub audience: String,
}
