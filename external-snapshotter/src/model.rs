//! The objects the snapshotter reads, as read (only the fields it uses), and their projections:
//! what the index keeps of each VolumeSnapshotContent and VolumeSnapshotClass. No I/O.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use sidecar_kit::values::atom::{Atom, List};
use sidecar_kit::values::version::ResourceVersion;

pub const GROUP: &str = "snapshot.storage.k8s.io";

/// Set by the snapshotter before CreateSnapshot; removed once the driver answered for sure.
pub const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";
/// Set by the snapshot-controller once the VolumeSnapshot is being deleted.
pub const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
/// Where the secret of CreateSnapshot and DeleteSnapshot is (set by the snapshot-controller).
pub const SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
pub const SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
/// On the members of a group snapshot: their snapshot is the group's, never created alone.
pub const GROUP_HANDLE: &str = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle";
/// The finalizer that keeps a content until its snapshot is deleted.
pub const FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
/// With `--node-deployment`: the node whose snapshotter owns the content.
pub const MANAGED_BY: &str = "snapshot.storage.kubernetes.io/managed-by";

/// The API group of group snapshots (served as v1 since external-snapshotter v8.6).
pub const GROUP_API: &str = "groupsnapshot.storage.k8s.io";
/// Set by the snapshotter before CreateVolumeGroupSnapshot; removed once the driver answered.
pub const GROUP_BEING_CREATED: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created";
/// Set by the snapshot-controller once the VolumeGroupSnapshot is being deleted.
pub const GROUP_BEING_DELETED: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-deleted";
/// Where the secret of the group calls is (set by the snapshot-controller).
pub const GROUP_SECRET_NAME: &str = "groupsnapshot.storage.kubernetes.io/deletion-secret-name";
pub const GROUP_SECRET_NAMESPACE: &str =
    "groupsnapshot.storage.kubernetes.io/deletion-secret-namespace";
/// The finalizer that keeps a group content until its group snapshot is deleted.
pub const GROUP_FINALIZER: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshotcontent-bound-protection";

/// The leader election lock name, as upstream's: `external-snapshotter-leader-<driver>`, `/`
/// replaced; its Lease's name before sanitizing, and what its Events name.
pub fn lock_name(driver: &str) -> String {
    format!("external-snapshotter-leader-{}", driver.replace('/', "-"))
}

/// The name of the leader Lease, as upstream's.
pub fn lease_name(driver: &str) -> String {
    sidecar_kit::cluster::leader::sanitize_name(&lock_name(driver))
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
    GROUP,
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents"
);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub source: ContentSource,
    pub volume_snapshot_class_name: Option<String>,
    #[serde(default)]
    pub volume_snapshot_ref: ObjectRef,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentSource {
    pub volume_handle: Option<String>,
    pub snapshot_handle: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct ObjectRef {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

/// What a content is bound to (its VolumeSnapshot or VolumeGroupSnapshot), as cached.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct BoundRef {
    pub name: Box<str>,
    pub namespace: Atom,
    pub uid: Box<str>,
}

impl From<&ObjectRef> for BoundRef {
    fn from(object: &ObjectRef) -> Self {
        Self {
            name: object.name.as_str().into(),
            namespace: Atom::new(&object.namespace),
            uid: object.uid.as_str().into(),
        }
    }
}

/// The status the snapshotter writes (and the controller copies to the VolumeSnapshot). Read
/// and cached as it is: its strings boxed, its rare error behind a pointer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentStatus {
    pub snapshot_handle: Option<Box<str>>,
    pub ready_to_use: Option<bool>,
    /// Unix nanoseconds.
    pub creation_time: Option<i64>,
    /// Bytes.
    pub restore_size: Option<i64>,
    pub error: Option<Box<SnapshotError>>,
    pub volume_group_snapshot_handle: Option<Box<str>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
pub struct SnapshotError {
    pub message: Option<String>,
    pub time: Option<String>,
}

/// A `snapshot.storage.k8s.io/v1` VolumeSnapshotClass, as read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    #[serde(default)]
    pub deletion_policy: String,
}

sidecar_kit::custom_resource!(
    VolumeSnapshotClass,
    k8s_openapi::ClusterResourceScope,
    GROUP,
    "v1",
    "VolumeSnapshotClass",
    "volumesnapshotclasses"
);

/// Where a secret is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

/// The deletion-secret annotations of a content: absent, or both present (possibly empty; kept
/// apart, as most contents have none).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub enum SecretAnnotations {
    #[default]
    None,
    Given(Box<SecretRef>),
}

/// What the snapshotter keeps of a VolumeSnapshotContent: strings boxed, and those that repeat
/// across contents (driver, policy, class, namespace, finalizers) interned, as a cache of ten
/// thousands of them holds each field that many times.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Content {
    pub name: Box<str>,
    pub uid: Box<str>,
    pub resource_version: ResourceVersion,
    pub deleting: bool,
    pub finalizers: List<Atom>,
    pub being_created: bool,
    pub being_deleted: bool,
    pub group_member: bool,
    pub secret: SecretAnnotations,
    /// A fingerprint of the annotations and labels besides those the snapshotter writes itself:
    /// a change to them is a change to act on (the snapshot-controller's being-deleted
    /// annotation, a secret), and nothing else reads them, so their text is not kept.
    pub other_metadata: u64,
    pub driver: Atom,
    /// `Delete` or `Retain`.
    pub deletion_policy: Atom,
    pub volume_handle: Option<Box<str>>,
    pub snapshot_handle_source: Option<Box<str>>,
    pub class: Option<Atom>,
    pub snapshot_ref: BoundRef,
    pub status: Option<ContentStatus>,
}

/// A hasher keyed once per process: no object can be written to make its fingerprint equal
/// another's.
fn keyed_hasher() -> impl Hasher {
    static KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);
    KEYS.build_hasher()
}

/// `value` hashed with the process's key.
pub fn keyed_hash(value: &impl Hash) -> u64 {
    let mut hasher = keyed_hasher();
    value.hash(&mut hasher);
    hasher.finish()
}

/// The fingerprint of a content's annotations (but [`BEING_CREATED`]) and labels: equal
/// metadata, equal fingerprints (absent or empty alike).
fn metadata_fingerprint(meta: &ObjectMeta) -> u64 {
    let mut hasher = keyed_hasher();
    let annotations = meta.annotations.iter().flatten();
    for (key, value) in annotations.filter(|(key, _)| *key != BEING_CREATED) {
        ('a', key, value).hash(&mut hasher);
    }
    for (key, value) in meta.labels.iter().flatten() {
        ('l', key, value).hash(&mut hasher);
    }
    hasher.finish()
}

impl Content {
    pub fn from_api(object: &VolumeSnapshotContent) -> Self {
        let meta = &object.metadata;
        let annotations = meta.annotations.as_ref();
        let annotation = |key: &str| annotations.and_then(|a| a.get(key));
        let secret = secret_annotations(annotations, SECRET_NAME, SECRET_NAMESPACE);
        let other_metadata = metadata_fingerprint(meta);
        let spec = &object.spec;
        Self {
            name: boxed(meta.name.as_deref()),
            uid: boxed(meta.uid.as_deref()),
            resource_version: ResourceVersion::new(meta.resource_version.as_deref()),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.iter().flatten().map(Atom::from).collect(),
            being_created: annotation(BEING_CREATED).is_some(),
            being_deleted: annotation(BEING_DELETED).is_some(),
            group_member: annotation(GROUP_HANDLE).is_some(),
            secret,
            other_metadata,
            driver: Atom::new(&spec.driver),
            deletion_policy: Atom::new(&spec.deletion_policy),
            volume_handle: spec.source.volume_handle.as_deref().map(Box::from),
            snapshot_handle_source: spec.source.snapshot_handle.as_deref().map(Box::from),
            class: spec.volume_snapshot_class_name.as_deref().map(Atom::new),
            snapshot_ref: BoundRef::from(&spec.volume_snapshot_ref),
            status: object.status.clone(),
        }
    }

    pub fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.ready_to_use)
            .unwrap_or(false)
    }

    /// The handle of the snapshot in the driver: the status's, else a pre-provisioned source's.
    pub fn handle(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.snapshot_handle.as_deref())
            .or(self.snapshot_handle_source.as_deref())
    }

    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == FINALIZER)
    }
}

/// What the cache keeps of a content that needs nothing more until it changes (a cut snapshot,
/// ready): most contents, most of the time. The full projection is kept only while there is
/// work; this form is what tells a change that is work from one that is not, and what answers
/// whether a content holds a UID, is bound to a VolumeSnapshot or names a snapshot. Those
/// strings are kept as keyed hashes: 8 bytes each, where two different strings agree with a
/// chance of 2^-64 that no object can be written to raise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub name: Box<str>,
    /// Its resourceVersion, as [`revision_number`] reads it.
    pub revision: u64,
    /// The fingerprint of what a change to act on compares ([`crate::decide::change_key`]).
    pub change: u64,
    uid: u64,
    source_uid: u64,
    handle: u64,
    /// Its deletion policy keeps the snapshot once the content is deleted.
    pub retains: bool,
}

impl Settled {
    pub fn of(content: &Content) -> Self {
        Self {
            name: content.name.clone(),
            revision: revision_number(&content.resource_version),
            change: crate::decide::change_key(content),
            uid: keyed_hash(&content.uid()),
            source_uid: keyed_hash(&content.source_uid()),
            handle: keyed_hash(&content.handle()),
            retains: !content.deletes(),
        }
    }

    pub fn has_uid(&self, uid: &str) -> bool {
        self.uid == keyed_hash(&uid)
    }

    /// Whether it is bound to the VolumeSnapshot with UID `uid`.
    pub fn has_source_uid(&self, uid: &str) -> bool {
        self.source_uid == keyed_hash(&uid)
    }

    pub fn names_handle(&self, handle: &str) -> bool {
        self.handle == keyed_hash(&Some(handle))
    }
}

/// A resourceVersion as a number, as upstream compares them (0 when not a number).
pub fn revision_number(written: &ResourceVersion) -> u64 {
    match written {
        ResourceVersion::Revision(number) => *number,
        other => other.to_string().parse().unwrap_or(0),
    }
}

/// What the snapshotter reads alike of both kinds of content.
pub trait ContentObject: Sized {
    /// The API group of the kind.
    const API_GROUP: &'static str;
    const KIND: &'static str;
    /// The API object it is projected from.
    type Object;
    fn project(object: &Self::Object) -> Self;
    fn name(&self) -> &str;
    fn uid(&self) -> &str;
    fn resource_version(&self) -> &ResourceVersion;
    fn driver(&self) -> &str;
    /// Its deletion was asked for (it has a deletion timestamp).
    fn deleting(&self) -> bool;
    /// Its create call may still be answered.
    fn being_created(&self) -> bool;
    /// The snapshot-controller marked it: its VolumeSnapshot (VolumeGroupSnapshot) is being
    /// deleted.
    fn being_deleted(&self) -> bool;
    /// It stands for a snapshot (group) the driver already has.
    fn pre_provisioned(&self) -> bool;
    /// The name of its class, if it names one.
    fn class(&self) -> Option<&str>;
    /// The UID of the VolumeSnapshot (VolumeGroupSnapshot) it is bound to.
    fn source_uid(&self) -> &str;
    /// It names what it is cut from: a volume (volumes), or a pre-provisioned handle.
    fn has_source(&self) -> bool;
    /// The message of its status's error.
    fn error_message(&self) -> Option<&str>;
    /// Whether it names the snapshot (group) `handle` of the driver.
    fn names_handle(&self, handle: &str) -> bool;
    /// Whether its deletion policy deletes what it names.
    fn deletes(&self) -> bool;
    /// Its [`Settled`] form when it needs nothing more until it changes; the cache then keeps
    /// only that.
    fn settle(&self) -> Option<Settled> {
        None
    }

    /// The reference an Event about this content names.
    fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some(format!("{}/v1", Self::API_GROUP)),
            kind: Some(Self::KIND.into()),
            name: Some(self.name().into()),
            uid: Some(self.uid().into()),
            resource_version: self.resource_version().to_option(),
            ..Default::default()
        }
    }
}

/// The accessors of [`ContentObject`]: both kinds of content keep these fields under the same
/// names.
macro_rules! content_fields {
    () => {
        fn name(&self) -> &str {
            &self.name
        }
        fn uid(&self) -> &str {
            &self.uid
        }
        fn resource_version(&self) -> &ResourceVersion {
            &self.resource_version
        }
        fn driver(&self) -> &str {
            &self.driver
        }
        fn deleting(&self) -> bool {
            self.deleting
        }
        fn being_created(&self) -> bool {
            self.being_created
        }
        fn being_deleted(&self) -> bool {
            self.being_deleted
        }
        fn class(&self) -> Option<&str> {
            self.class.as_deref()
        }
        fn error_message(&self) -> Option<&str> {
            let error = self.status.as_ref()?.error.as_ref()?;
            error.message.as_deref()
        }
        fn deletes(&self) -> bool {
            self.deletion_policy == "Delete"
        }
        fn project(object: &Self::Object) -> Self {
            Self::from_api(object)
        }
    };
}

impl ContentObject for Content {
    const API_GROUP: &'static str = GROUP;
    const KIND: &'static str = "VolumeSnapshotContent";
    type Object = VolumeSnapshotContent;
    content_fields!();

    fn settle(&self) -> Option<Settled> {
        crate::decide::settled(self).then(|| Settled::of(self))
    }

    fn names_handle(&self, handle: &str) -> bool {
        self.handle() == Some(handle)
    }

    fn source_uid(&self) -> &str {
        &self.snapshot_ref.uid
    }

    fn has_source(&self) -> bool {
        self.volume_handle.is_some() || self.pre_provisioned()
    }

    fn pre_provisioned(&self) -> bool {
        self.snapshot_handle_source.is_some()
    }
}

impl ContentObject for GroupContent {
    const API_GROUP: &'static str = GROUP_API;
    const KIND: &'static str = "VolumeGroupSnapshotContent";
    type Object = VolumeGroupSnapshotContent;
    content_fields!();

    fn names_handle(&self, handle: &str) -> bool {
        self.handle().as_deref() == Some(handle)
    }

    fn source_uid(&self) -> &str {
        &self.group_ref.uid
    }

    fn has_source(&self) -> bool {
        !self.volume_handles.is_empty() || self.pre_provisioned()
    }

    fn pre_provisioned(&self) -> bool {
        self.pre_provisioned.is_some()
    }
}

/// What the snapshotter keeps of a VolumeSnapshotClass or a VolumeGroupSnapshotClass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    pub driver: String,
    pub parameters: BTreeMap<String, String>,
    /// What its dynamically made contents get as their deletion policy.
    pub deletion_policy: String,
}

impl Class {
    pub fn from_api(object: &VolumeSnapshotClass) -> Self {
        Self::of(
            &object.metadata,
            &object.driver,
            &object.parameters,
            &object.deletion_policy,
        )
    }

    pub fn from_group_api(object: &VolumeGroupSnapshotClass) -> Self {
        Self::of(
            &object.metadata,
            &object.driver,
            &object.parameters,
            &object.deletion_policy,
        )
    }

    fn of(
        meta: &ObjectMeta,
        driver: &str,
        parameters: &BTreeMap<String, String>,
        deletion_policy: &str,
    ) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            driver: driver.to_string(),
            parameters: parameters.clone(),
            deletion_policy: deletion_policy.to_string(),
        }
    }
}

/// A string of an object's metadata, boxed (empty when absent).
fn boxed(value: Option<&str>) -> Box<str> {
    value.unwrap_or_default().into()
}

fn secret_annotations(
    annotations: Option<&BTreeMap<String, String>>,
    name_key: &str,
    namespace_key: &str,
) -> SecretAnnotations {
    let annotation = |key: &str| annotations.and_then(|a| a.get(key));
    match (annotation(name_key), annotation(namespace_key)) {
        (Some(name), Some(namespace)) => SecretAnnotations::Given(Box::new(SecretRef {
            name: name.clone(),
            namespace: namespace.clone(),
        })),
        _ => SecretAnnotations::None,
    }
}

/// A `groupsnapshot.storage.k8s.io/v1` VolumeGroupSnapshotContent, as read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VolumeGroupSnapshotContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GroupContentSpec,
    #[serde(default)]
    pub status: Option<GroupContentStatus>,
}

sidecar_kit::custom_resource!(
    VolumeGroupSnapshotContent,
    k8s_openapi::ClusterResourceScope,
    GROUP_API,
    "v1",
    "VolumeGroupSnapshotContent",
    "volumegroupsnapshotcontents"
);

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub source: GroupContentSource,
    pub volume_group_snapshot_class_name: Option<String>,
    #[serde(default)]
    pub volume_group_snapshot_ref: ObjectRef,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupContentSource {
    #[serde(default)]
    pub volume_handles: Vec<String>,
    pub group_snapshot_handles: Option<GroupSnapshotHandles>,
}

/// A pre-provisioned group snapshot: its handle and its members' handles.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupSnapshotHandles {
    #[serde(default)]
    pub volume_group_snapshot_handle: String,
    #[serde(default)]
    pub volume_snapshot_handles: Vec<String>,
}

/// The status the snapshotter writes on a group content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupContentStatus {
    pub volume_group_snapshot_handle: Option<String>,
    /// RFC 3339 (a `metav1.Time`, unlike the nanoseconds of a snapshot content).
    pub creation_time: Option<String>,
    pub ready_to_use: Option<bool>,
    pub error: Option<SnapshotError>,
    #[serde(default)]
    pub volume_snapshot_info_list: Vec<SnapshotInfo>,
}

/// One member of a group snapshot, as the group content's status lists it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub volume_handle: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot_handle: String,
    /// Unix nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
}

/// A `groupsnapshot.storage.k8s.io/v1` VolumeGroupSnapshotClass, as read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroupSnapshotClass {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    #[serde(default)]
    pub deletion_policy: String,
}

sidecar_kit::custom_resource!(
    VolumeGroupSnapshotClass,
    k8s_openapi::ClusterResourceScope,
    GROUP_API,
    "v1",
    "VolumeGroupSnapshotClass",
    "volumegroupsnapshotclasses"
);

/// What the snapshotter keeps of a VolumeGroupSnapshotContent.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupContent {
    pub name: Box<str>,
    pub uid: Box<str>,
    pub resource_version: ResourceVersion,
    pub deleting: bool,
    pub finalizers: List<Atom>,
    pub being_created: bool,
    pub being_deleted: bool,
    pub secret: SecretAnnotations,
    pub driver: Atom,
    pub deletion_policy: Atom,
    pub volume_handles: Vec<String>,
    pub pre_provisioned: Option<GroupSnapshotHandles>,
    pub class: Option<Atom>,
    pub group_ref: BoundRef,
    pub status: Option<GroupContentStatus>,
}

impl GroupContent {
    pub fn from_api(object: &VolumeGroupSnapshotContent) -> Self {
        let meta = &object.metadata;
        let annotations = meta.annotations.as_ref();
        let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
        let spec = &object.spec;
        Self {
            name: boxed(meta.name.as_deref()),
            uid: boxed(meta.uid.as_deref()),
            resource_version: ResourceVersion::new(meta.resource_version.as_deref()),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.iter().flatten().map(Atom::from).collect(),
            being_created: has(GROUP_BEING_CREATED),
            being_deleted: has(GROUP_BEING_DELETED),
            secret: secret_annotations(annotations, GROUP_SECRET_NAME, GROUP_SECRET_NAMESPACE),
            driver: Atom::new(&spec.driver),
            deletion_policy: Atom::new(&spec.deletion_policy),
            volume_handles: spec.source.volume_handles.clone(),
            pre_provisioned: spec.source.group_snapshot_handles.clone(),
            class: spec
                .volume_group_snapshot_class_name
                .as_deref()
                .map(Atom::new),
            group_ref: BoundRef::from(&spec.volume_group_snapshot_ref),
            status: object.status.clone(),
        }
    }

    pub fn ready(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.ready_to_use)
            .unwrap_or(false)
    }

    /// The group's handle in the driver: the status's, else a pre-provisioned source's.
    pub fn handle(&self) -> Option<String> {
        self.status
            .as_ref()
            .and_then(|s| s.volume_group_snapshot_handle.clone())
            .or_else(|| {
                self.pre_provisioned
                    .as_ref()
                    .map(|p| p.volume_group_snapshot_handle.clone())
            })
    }

    /// The handles of the members: from the status, else a pre-provisioned source's.
    pub fn snapshot_ids(&self) -> Vec<String> {
        let listed: Vec<String> = self
            .status
            .iter()
            .flat_map(|s| &s.volume_snapshot_info_list)
            .map(|i| i.snapshot_handle.clone())
            .collect();
        if !listed.is_empty() {
            return listed;
        }
        self.pre_provisioned
            .as_ref()
            .map(|p| p.volume_snapshot_handles.clone())
            .unwrap_or_default()
    }

    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == GROUP_FINALIZER)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The index holds ten thousands of these: the fields that repeat are pointers to shared
    /// values, and the status is inline only because nearly every content has one.
    #[test]
    fn a_cached_content_stays_small() {
        assert!(size_of::<Content>() <= 256, "{} B", size_of::<Content>());
        // With its reference count, an allocation of mimalloc's 80-byte class.
        assert_eq!(size_of::<Settled>(), 64);
        assert_eq!(size_of::<SecretAnnotations>(), 8);
        assert_eq!(size_of::<Option<Atom>>(), 8);
    }

    #[test]
    fn a_content_is_projected_with_what_the_snapshotter_uses() {
        let object: VolumeSnapshotContent = serde_json::from_value(json!({
            "metadata": {"name": "snapcontent-1", "uid": "u1", "resourceVersion": "7",
                "deletionTimestamp": "2026-11-26T10:00:00Z",
                "finalizers": ["other", FINALIZER],
                "annotations": {BEING_CREATED: "yes", BEING_DELETED: "yes",
                    SECRET_NAME: "s", SECRET_NAMESPACE: "ns"},
                "labels": {MANAGED_BY: "node-1"}},
            "spec": {"driver": "d", "deletionPolicy": "Delete",
                "source": {"volumeHandle": "vol-1"}, "volumeSnapshotClassName": "c",
                "volumeSnapshotRef": {"name": "snap", "namespace": "ns", "uid": "vs-uid"}},
            "status": {"snapshotHandle": "h", "readyToUse": true, "creationTime": 5, "restoreSize": 1024}
        }))
        .unwrap();
        let content = Content::from_api(&object);
        assert!(content.deleting && content.being_created && content.being_deleted);
        assert!(content.has_finalizer() && content.ready());
        assert_eq!(content.handle(), Some("h"));
        assert_eq!(
            content.secret,
            SecretAnnotations::Given(Box::new(SecretRef {
                name: "s".into(),
                namespace: "ns".into()
            }))
        );
        assert_eq!(&*content.snapshot_ref.uid, "vs-uid");
        // The metadata's fingerprint follows every annotation and label but our own.
        let with = |change: &dyn Fn(&mut VolumeSnapshotContent)| {
            let mut changed = object.clone();
            change(&mut changed);
            Content::from_api(&changed).other_metadata
        };
        assert_eq!(
            with(&|o| {
                o.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .remove(BEING_CREATED);
            }),
            content.other_metadata
        );
        assert_ne!(
            with(&|o| {
                o.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .remove(BEING_DELETED);
            }),
            content.other_metadata
        );
        assert_ne!(
            with(&|o| {
                o.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert(MANAGED_BY.into(), "node-2".into());
            }),
            content.other_metadata
        );
        assert_ne!(
            with(&|o| {
                let value = o
                    .metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .remove(MANAGED_BY)
                    .unwrap();
                o.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(MANAGED_BY.into(), value);
            }),
            content.other_metadata,
            "a label is not an annotation"
        );
        assert_eq!(
            lease_name("hostpath.csi.k8s.io"),
            "external-snapshotter-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(
            lock_name("example.com/x"),
            "external-snapshotter-leader-example.com-x"
        );
    }
}
