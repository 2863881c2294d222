//! PersistentVolumes and PersistentVolumeClaims read from kube-apiserver's protobuf encoding into
//! the same objects their JSON gives, holding the fields the views and the in-tree migration
//! read (see [`views`](crate::pipeline::views)).
//!
//! The messages below declare only those fields, under the field numbers of Kubernetes'
//! `generated.proto`; prost skips every other field without allocating for it, which leaves out
//! `managedFields` (half of an object's bytes) and the volume sources no controller reads. A
//! field a view starts to read must be declared here too: the tests compare both encodings of
//! the same objects as kube-apiserver wrote them.
//!
//! Go writes a string, bool or number that is not a pointer to protobuf even when it is empty,
//! and leaves it out of JSON (`omitempty`); such fields are read back as absent when empty, so
//! that both encodings give equal objects. Pointer fields keep an empty value, as JSON does.
//!
//! Not with k8s-pb's messages: they declare every field, so every object's managedFields and
//! every field of its spec would be decoded, and all of Kubernetes' API groups compiled.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as api;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;

/// Why an object of a protobuf list cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error(transparent)]
    Decode(#[from] prost::DecodeError),
    #[error("a time of {0} seconds from 1970 is out of range")]
    Time(i64),
}

/// A PersistentVolume from its protobuf encoding.
pub fn persistent_volume(bytes: &[u8]) -> Result<api::PersistentVolume, ObjectError> {
    let pv = PersistentVolume::decode(bytes)?;
    Ok(api::PersistentVolume {
        metadata: pv.metadata.unwrap_or_default().into_api()?,
        spec: pv.spec.map(PersistentVolumeSpec::into_api),
        status: pv
            .status
            .map(PersistentVolumeStatus::into_api)
            .transpose()?,
    })
}

/// A PersistentVolumeClaim from its protobuf encoding.
pub fn persistent_volume_claim(bytes: &[u8]) -> Result<api::PersistentVolumeClaim, ObjectError> {
    let pvc = PersistentVolumeClaim::decode(bytes)?;
    Ok(api::PersistentVolumeClaim {
        metadata: pvc.metadata.unwrap_or_default().into_api()?,
        spec: pvc.spec.map(PersistentVolumeClaimSpec::into_api),
        status: pvc
            .status
            .map(PersistentVolumeClaimStatus::into_api)
            .transpose()?,
    })
}

/// A Go string with `omitempty`: absent when empty.
fn omitted(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// A Go bool with `omitempty`: absent when false.
fn flag(value: Option<bool>) -> Option<bool> {
    value.filter(|v| *v)
}

/// A Go number with `omitempty`: absent when 0.
fn number<N: Default + PartialEq>(value: Option<N>) -> Option<N> {
    value.filter(|v| *v != N::default())
}

/// A list or map with `omitempty`: absent when empty.
fn some<C: IntoIterator>(collection: C) -> Option<C>
where
    for<'a> &'a C: IntoIterator,
{
    let empty = (&collection).into_iter().next().is_none();
    (!empty).then_some(collection)
}

fn quantities(map: BTreeMap<String, Quantity>) -> Option<BTreeMap<String, ApiQuantity>> {
    some(map).map(|m| {
        m.into_iter()
            .map(|(k, q)| (k, ApiQuantity(q.string.unwrap_or_default())))
            .collect()
    })
}

/// `metav1.Time`: whole seconds (Kubernetes writes no nanoseconds); no seconds at all for Go's
/// zero time, which JSON writes as `null`.
#[derive(Clone, PartialEq, Message)]
struct Time {
    #[prost(int64, optional, tag = "1")]
    seconds: Option<i64>,
}

fn time(value: Option<Time>) -> Result<Option<meta::Time>, ObjectError> {
    match value.and_then(|t| t.seconds) {
        None => Ok(None),
        Some(seconds) => k8s_openapi::jiff::Timestamp::from_second(seconds)
            .map(|t| Some(meta::Time(t)))
            .map_err(|_| ObjectError::Time(seconds)),
    }
}

#[derive(Clone, PartialEq, Message)]
struct Quantity {
    #[prost(string, optional, tag = "1")]
    string: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(int64, optional, tag = "7")]
    generation: Option<i64>,
    #[prost(message, optional, tag = "8")]
    creation_timestamp: Option<Time>,
    #[prost(message, optional, tag = "9")]
    deletion_timestamp: Option<Time>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

impl ObjectMeta {
    fn into_api(self) -> Result<meta::ObjectMeta, ObjectError> {
        Ok(meta::ObjectMeta {
            name: omitted(self.name),
            generate_name: omitted(self.generate_name),
            namespace: omitted(self.namespace),
            uid: omitted(self.uid),
            resource_version: omitted(self.resource_version),
            generation: number(self.generation),
            creation_timestamp: time(self.creation_timestamp)?,
            deletion_timestamp: time(self.deletion_timestamp)?,
            labels: some(self.labels),
            annotations: some(self.annotations),
            finalizers: some(self.finalizers),
            ..meta::ObjectMeta::default()
        })
    }
}

#[derive(Clone, PartialEq, Message)]
struct SecretReference {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    namespace: Option<String>,
}

impl SecretReference {
    fn into_api(self) -> api::SecretReference {
        api::SecretReference {
            name: omitted(self.name),
            namespace: omitted(self.namespace),
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct ObjectReference {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "2")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(string, optional, tag = "7")]
    field_path: Option<String>,
}

impl ObjectReference {
    fn into_api(self) -> api::ObjectReference {
        api::ObjectReference {
            kind: omitted(self.kind),
            namespace: omitted(self.namespace),
            name: omitted(self.name),
            uid: omitted(self.uid),
            api_version: omitted(self.api_version),
            resource_version: omitted(self.resource_version),
            field_path: omitted(self.field_path),
        }
    }
}

/// `NodeSelectorRequirement` and `LabelSelectorRequirement`, which are the same message.
#[derive(Clone, PartialEq, Message)]
struct Requirement {
    #[prost(string, optional, tag = "1")]
    key: Option<String>,
    #[prost(string, optional, tag = "2")]
    operator: Option<String>,
    #[prost(string, repeated, tag = "3")]
    values: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeSelectorTerm {
    #[prost(message, repeated, tag = "1")]
    match_expressions: Vec<Requirement>,
    #[prost(message, repeated, tag = "2")]
    match_fields: Vec<Requirement>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeSelector {
    #[prost(message, repeated, tag = "1")]
    node_selector_terms: Vec<NodeSelectorTerm>,
}

#[derive(Clone, PartialEq, Message)]
struct VolumeNodeAffinity {
    #[prost(message, optional, tag = "1")]
    required: Option<NodeSelector>,
}

impl VolumeNodeAffinity {
    fn into_api(self) -> api::VolumeNodeAffinity {
        let requirements = |list: Vec<Requirement>| {
            some(list).map(|list| {
                list.into_iter()
                    .map(|r| api::NodeSelectorRequirement {
                        key: r.key.unwrap_or_default(),
                        operator: r.operator.unwrap_or_default(),
                        values: some(r.values),
                    })
                    .collect()
            })
        };
        api::VolumeNodeAffinity {
            required: self.required.map(|selector| api::NodeSelector {
                node_selector_terms: selector
                    .node_selector_terms
                    .into_iter()
                    .map(|term| api::NodeSelectorTerm {
                        match_expressions: requirements(term.match_expressions),
                        match_fields: requirements(term.match_fields),
                    })
                    .collect(),
            }),
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct CsiSource {
    #[prost(string, optional, tag = "1")]
    driver: Option<String>,
    #[prost(string, optional, tag = "2")]
    volume_handle: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    fs_type: Option<String>,
    #[prost(btree_map = "string, string", tag = "5")]
    volume_attributes: BTreeMap<String, String>,
    #[prost(message, optional, tag = "6")]
    controller_publish_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "7")]
    node_stage_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "8")]
    node_publish_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "9")]
    controller_expand_secret_ref: Option<SecretReference>,
    #[prost(message, optional, tag = "10")]
    node_expand_secret_ref: Option<SecretReference>,
}

impl CsiSource {
    fn into_api(self) -> api::CSIPersistentVolumeSource {
        api::CSIPersistentVolumeSource {
            driver: self.driver.unwrap_or_default(),
            volume_handle: self.volume_handle.unwrap_or_default(),
            read_only: flag(self.read_only),
            fs_type: omitted(self.fs_type),
            volume_attributes: some(self.volume_attributes),
            controller_publish_secret_ref: self
                .controller_publish_secret_ref
                .map(SecretReference::into_api),
            node_stage_secret_ref: self.node_stage_secret_ref.map(SecretReference::into_api),
            node_publish_secret_ref: self.node_publish_secret_ref.map(SecretReference::into_api),
            controller_expand_secret_ref: self
                .controller_expand_secret_ref
                .map(SecretReference::into_api),
            node_expand_secret_ref: self.node_expand_secret_ref.map(SecretReference::into_api),
        }
    }
}

/// The in-tree sources with a migration path (see [`migration`](crate::migration)).
#[derive(Clone, PartialEq, Message)]
struct AwsEbs {
    #[prost(string, optional, tag = "1")]
    volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(int32, optional, tag = "3")]
    partition: Option<i32>,
    #[prost(bool, optional, tag = "4")]
    read_only: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct GcePd {
    #[prost(string, optional, tag = "1")]
    pd_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(int32, optional, tag = "3")]
    partition: Option<i32>,
    #[prost(bool, optional, tag = "4")]
    read_only: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct AzureDisk {
    #[prost(string, optional, tag = "1")]
    disk_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    disk_uri: Option<String>,
    #[prost(string, optional, tag = "3")]
    caching_mode: Option<String>,
    #[prost(string, optional, tag = "4")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "5")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "6")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct AzureFile {
    #[prost(string, optional, tag = "1")]
    secret_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    share_name: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    secret_namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Cinder {
    #[prost(string, optional, tag = "1")]
    volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(message, optional, tag = "4")]
    secret_ref: Option<SecretReference>,
}

#[derive(Clone, PartialEq, Message)]
struct VSphere {
    #[prost(string, optional, tag = "1")]
    volume_path: Option<String>,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(string, optional, tag = "3")]
    storage_policy_name: Option<String>,
    #[prost(string, optional, tag = "4")]
    storage_policy_id: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Portworx {
    #[prost(string, optional, tag = "1")]
    volume_id: Option<String>,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
}

/// `PersistentVolumeSource`, which JSON inlines in the spec.
#[derive(Clone, PartialEq, Message)]
struct Source {
    #[prost(message, optional, tag = "1")]
    gce_persistent_disk: Option<GcePd>,
    #[prost(message, optional, tag = "2")]
    aws_elastic_block_store: Option<AwsEbs>,
    #[prost(message, optional, tag = "8")]
    cinder: Option<Cinder>,
    #[prost(message, optional, tag = "13")]
    azure_file: Option<AzureFile>,
    #[prost(message, optional, tag = "14")]
    vsphere_volume: Option<VSphere>,
    #[prost(message, optional, tag = "16")]
    azure_disk: Option<AzureDisk>,
    #[prost(message, optional, tag = "18")]
    portworx_volume: Option<Portworx>,
    #[prost(message, optional, tag = "22")]
    csi: Option<CsiSource>,
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeSpec {
    #[prost(btree_map = "string, message", tag = "1")]
    capacity: BTreeMap<String, Quantity>,
    #[prost(message, optional, tag = "2")]
    source: Option<Source>,
    #[prost(string, repeated, tag = "3")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "4")]
    claim_ref: Option<ObjectReference>,
    #[prost(string, optional, tag = "5")]
    persistent_volume_reclaim_policy: Option<String>,
    #[prost(string, optional, tag = "6")]
    storage_class_name: Option<String>,
    #[prost(string, repeated, tag = "7")]
    mount_options: Vec<String>,
    #[prost(string, optional, tag = "8")]
    volume_mode: Option<String>,
    #[prost(message, optional, tag = "9")]
    node_affinity: Option<VolumeNodeAffinity>,
    #[prost(string, optional, tag = "10")]
    volume_attributes_class_name: Option<String>,
}

impl PersistentVolumeSpec {
    fn into_api(self) -> api::PersistentVolumeSpec {
        let source = self.source.unwrap_or_default();
        api::PersistentVolumeSpec {
            capacity: quantities(self.capacity),
            access_modes: some(self.access_modes),
            claim_ref: self.claim_ref.map(ObjectReference::into_api),
            persistent_volume_reclaim_policy: omitted(self.persistent_volume_reclaim_policy),
            storage_class_name: omitted(self.storage_class_name),
            mount_options: some(self.mount_options),
            volume_mode: self.volume_mode,
            node_affinity: self.node_affinity.map(VolumeNodeAffinity::into_api),
            volume_attributes_class_name: self.volume_attributes_class_name,
            csi: source.csi.map(CsiSource::into_api),
            gce_persistent_disk: source.gce_persistent_disk.map(|s| {
                api::GCEPersistentDiskVolumeSource {
                    pd_name: s.pd_name.unwrap_or_default(),
                    fs_type: omitted(s.fs_type),
                    partition: number(s.partition),
                    read_only: flag(s.read_only),
                }
            }),
            aws_elastic_block_store: source.aws_elastic_block_store.map(|s| {
                api::AWSElasticBlockStoreVolumeSource {
                    volume_id: s.volume_id.unwrap_or_default(),
                    fs_type: omitted(s.fs_type),
                    partition: number(s.partition),
                    read_only: flag(s.read_only),
                }
            }),
            cinder: source.cinder.map(|s| api::CinderPersistentVolumeSource {
                volume_id: s.volume_id.unwrap_or_default(),
                fs_type: omitted(s.fs_type),
                read_only: flag(s.read_only),
                secret_ref: s.secret_ref.map(SecretReference::into_api),
            }),
            azure_file: source
                .azure_file
                .map(|s| api::AzureFilePersistentVolumeSource {
                    secret_name: s.secret_name.unwrap_or_default(),
                    share_name: s.share_name.unwrap_or_default(),
                    read_only: flag(s.read_only),
                    secret_namespace: s.secret_namespace,
                }),
            vsphere_volume: source
                .vsphere_volume
                .map(|s| api::VsphereVirtualDiskVolumeSource {
                    volume_path: s.volume_path.unwrap_or_default(),
                    fs_type: omitted(s.fs_type),
                    storage_policy_name: omitted(s.storage_policy_name),
                    storage_policy_id: omitted(s.storage_policy_id),
                }),
            azure_disk: source.azure_disk.map(|s| api::AzureDiskVolumeSource {
                disk_name: s.disk_name.unwrap_or_default(),
                disk_uri: s.disk_uri.unwrap_or_default(),
                caching_mode: s.caching_mode,
                fs_type: s.fs_type,
                read_only: s.read_only,
                kind: s.kind,
            }),
            portworx_volume: source.portworx_volume.map(|s| api::PortworxVolumeSource {
                volume_id: s.volume_id.unwrap_or_default(),
                fs_type: omitted(s.fs_type),
                read_only: flag(s.read_only),
            }),
            ..api::PersistentVolumeSpec::default()
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(string, optional, tag = "2")]
    message: Option<String>,
    #[prost(string, optional, tag = "3")]
    reason: Option<String>,
    #[prost(message, optional, tag = "4")]
    last_phase_transition_time: Option<Time>,
}

impl PersistentVolumeStatus {
    fn into_api(self) -> Result<api::PersistentVolumeStatus, ObjectError> {
        Ok(api::PersistentVolumeStatus {
            phase: omitted(self.phase),
            message: omitted(self.message),
            reason: omitted(self.reason),
            last_phase_transition_time: time(self.last_phase_transition_time)?,
        })
    }
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolume {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PersistentVolumeSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<PersistentVolumeStatus>,
}

#[derive(Clone, PartialEq, Message)]
struct LabelSelector {
    #[prost(btree_map = "string, string", tag = "1")]
    match_labels: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    match_expressions: Vec<Requirement>,
}

#[derive(Clone, PartialEq, Message)]
struct VolumeResourceRequirements {
    #[prost(btree_map = "string, message", tag = "1")]
    limits: BTreeMap<String, Quantity>,
    #[prost(btree_map = "string, message", tag = "2")]
    requests: BTreeMap<String, Quantity>,
}

/// `TypedLocalObjectReference` and `TypedObjectReference`, which only adds a namespace.
#[derive(Clone, PartialEq, Message)]
struct TypedReference {
    #[prost(string, optional, tag = "1")]
    api_group: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeClaimSpec {
    #[prost(string, repeated, tag = "1")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "2")]
    resources: Option<VolumeResourceRequirements>,
    #[prost(string, optional, tag = "3")]
    volume_name: Option<String>,
    #[prost(message, optional, tag = "4")]
    selector: Option<LabelSelector>,
    #[prost(string, optional, tag = "5")]
    storage_class_name: Option<String>,
    #[prost(string, optional, tag = "6")]
    volume_mode: Option<String>,
    #[prost(message, optional, tag = "7")]
    data_source: Option<TypedReference>,
    #[prost(message, optional, tag = "8")]
    data_source_ref: Option<TypedReference>,
    #[prost(string, optional, tag = "9")]
    volume_attributes_class_name: Option<String>,
}

impl PersistentVolumeClaimSpec {
    fn into_api(self) -> api::PersistentVolumeClaimSpec {
        api::PersistentVolumeClaimSpec {
            access_modes: some(self.access_modes),
            resources: self.resources.map(|r| api::VolumeResourceRequirements {
                limits: quantities(r.limits),
                requests: quantities(r.requests),
            }),
            volume_name: omitted(self.volume_name),
            selector: self.selector.map(|s| meta::LabelSelector {
                match_labels: some(s.match_labels),
                match_expressions: some(s.match_expressions).map(|list| {
                    list.into_iter()
                        .map(|r| meta::LabelSelectorRequirement {
                            key: r.key.unwrap_or_default(),
                            operator: r.operator.unwrap_or_default(),
                            values: some(r.values),
                        })
                        .collect()
                }),
            }),
            storage_class_name: self.storage_class_name,
            volume_mode: self.volume_mode,
            data_source: self.data_source.map(|r| api::TypedLocalObjectReference {
                api_group: r.api_group,
                kind: r.kind.unwrap_or_default(),
                name: r.name.unwrap_or_default(),
            }),
            data_source_ref: self.data_source_ref.map(|r| api::TypedObjectReference {
                api_group: r.api_group,
                kind: r.kind.unwrap_or_default(),
                name: r.name.unwrap_or_default(),
                namespace: r.namespace,
            }),
            volume_attributes_class_name: self.volume_attributes_class_name,
        }
    }
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeClaimCondition {
    #[prost(string, optional, tag = "1")]
    type_: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
    #[prost(message, optional, tag = "3")]
    last_probe_time: Option<Time>,
    #[prost(message, optional, tag = "4")]
    last_transition_time: Option<Time>,
    #[prost(string, optional, tag = "5")]
    reason: Option<String>,
    #[prost(string, optional, tag = "6")]
    message: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct ModifyVolumeStatus {
    #[prost(string, optional, tag = "1")]
    target_volume_attributes_class_name: Option<String>,
    #[prost(string, optional, tag = "2")]
    status: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeClaimStatus {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
    #[prost(string, repeated, tag = "2")]
    access_modes: Vec<String>,
    #[prost(btree_map = "string, message", tag = "3")]
    capacity: BTreeMap<String, Quantity>,
    #[prost(message, repeated, tag = "4")]
    conditions: Vec<PersistentVolumeClaimCondition>,
    #[prost(btree_map = "string, message", tag = "5")]
    allocated_resources: BTreeMap<String, Quantity>,
    #[prost(btree_map = "string, string", tag = "7")]
    allocated_resource_statuses: BTreeMap<String, String>,
    #[prost(string, optional, tag = "8")]
    current_volume_attributes_class_name: Option<String>,
    #[prost(message, optional, tag = "9")]
    modify_volume_status: Option<ModifyVolumeStatus>,
}

impl PersistentVolumeClaimStatus {
    fn into_api(self) -> Result<api::PersistentVolumeClaimStatus, ObjectError> {
        let conditions = self
            .conditions
            .into_iter()
            .map(|c| {
                Ok(api::PersistentVolumeClaimCondition {
                    type_: c.type_.unwrap_or_default(),
                    status: c.status.unwrap_or_default(),
                    last_probe_time: time(c.last_probe_time)?,
                    last_transition_time: time(c.last_transition_time)?,
                    reason: omitted(c.reason),
                    message: omitted(c.message),
                })
            })
            .collect::<Result<Vec<_>, ObjectError>>()?;
        Ok(api::PersistentVolumeClaimStatus {
            phase: omitted(self.phase),
            access_modes: some(self.access_modes),
            capacity: quantities(self.capacity),
            conditions: some(conditions),
            allocated_resources: quantities(self.allocated_resources),
            allocated_resource_statuses: some(self.allocated_resource_statuses),
            current_volume_attributes_class_name: self.current_volume_attributes_class_name,
            modify_volume_status: self.modify_volume_status.map(|m| api::ModifyVolumeStatus {
                target_volume_attributes_class_name: omitted(m.target_volume_attributes_class_name),
                status: m.status.unwrap_or_default(),
            }),
            ..api::PersistentVolumeClaimStatus::default()
        })
    }
}

#[derive(Clone, PartialEq, Message)]
struct PersistentVolumeClaim {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<PersistentVolumeClaimSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<PersistentVolumeClaimStatus>,
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use super::*;
    use crate::pipeline::listing::{ListBody, ListReader, Part, drop_managed_fields};
    use crate::pipeline::protobuf::{ProtobufList, list_version};
    use crate::pipeline::views::{ClaimView, Needs, PvView};

    // Two lists of the same objects (`testdata/objects.yaml`), as kube-apiserver v1.34 wrote
    // them in JSON and in protobuf.
    const PV_JSON: &[u8] = include_bytes!("testdata/pv-list.json");
    const PV_PROTOBUF: &[u8] = include_bytes!("testdata/pv-list.pb");
    const PVC_JSON: &[u8] = include_bytes!("testdata/pvc-list.json");
    const PVC_PROTOBUF: &[u8] = include_bytes!("testdata/pvc-list.pb");

    /// The list's resourceVersion and objects from `body` fed to `list` in chunks of `size`
    /// bytes, each item read with `decode`.
    fn read<K>(
        mut list: impl ListReader,
        body: &[u8],
        size: usize,
        decode: impl Fn(&mut Vec<u8>) -> K,
        version: fn(&[u8]) -> String,
    ) -> (String, Vec<K>) {
        let (mut listed_at, mut objects) = (String::new(), Vec::new());
        for chunk in body.chunks(size) {
            let mut input = chunk;
            while let Some(part) = list.next(&mut input).unwrap() {
                match part {
                    Part::Item(item) => objects.push(decode(item)),
                    Part::Metadata(meta) => listed_at = version(meta),
                }
            }
        }
        list.finish().unwrap();
        (listed_at, objects)
    }

    /// The objects of the JSON list, read as the lists of kinds without protobuf are, after
    /// checking that the protobuf list of the same objects, read in chunks of every size of
    /// `sizes`, gives the same version and the same objects but for what protobuf does not
    /// carry (`uncarried` clears it), and the same views (`view`, with every field any
    /// controller reads).
    fn both_encodings_alike<K, V>(
        (json, protobuf): (&[u8], &[u8]),
        sizes: &[usize],
        decode: fn(&[u8]) -> Result<K, ObjectError>,
        uncarried: fn(&mut K),
        view: fn(&K) -> V,
    ) -> Vec<K>
    where
        K: serde::de::DeserializeOwned + PartialEq + Debug,
        V: PartialEq + Debug,
    {
        let from_json = |item: &mut Vec<u8>| {
            drop_managed_fields(item, &[]);
            serde_json::from_slice::<K>(item).unwrap()
        };
        let json_version = |meta: &[u8]| {
            let meta: meta::ListMeta = serde_json::from_slice(meta).unwrap();
            meta.resource_version.unwrap()
        };
        let protobuf_version = |meta: &[u8]| list_version(meta).unwrap().unwrap();
        let (version, objects) = read(
            ListBody::new(1 << 20),
            json,
            json.len(),
            from_json,
            json_version,
        );
        let mut carried: Vec<K> = objects;
        let views: Vec<V> = carried.iter().map(view).collect();
        carried.iter_mut().for_each(uncarried);
        for &size in sizes {
            let (listed_at, read) = read(
                ProtobufList::new(1 << 20),
                protobuf,
                size,
                |item: &mut Vec<u8>| decode(item).unwrap(),
                protobuf_version,
            );
            assert_eq!(listed_at, version);
            assert_eq!(
                read.iter().map(view).collect::<Vec<_>>(),
                views,
                "chunks of {size}"
            );
            assert_eq!(read, carried, "chunks of {size}");
        }
        carried
    }

    /// What protobuf does not carry of an object's metadata.
    fn uncarried_meta(meta: &mut meta::ObjectMeta) {
        meta.managed_fields = None;
        meta.owner_references = None;
        meta.self_link = None;
        meta.deletion_grace_period_seconds = None;
    }

    #[test]
    fn volumes_read_from_protobuf_equal_those_read_from_json() {
        let pvs = both_encodings_alike(
            (PV_JSON, PV_PROTOBUF),
            &[1, 2, 3, 7, 64, 1000, PV_PROTOBUF.len()],
            persistent_volume,
            |pv| {
                uncarried_meta(&mut pv.metadata);
                // A source no controller reads.
                if let Some(spec) = pv.spec.as_mut() {
                    spec.nfs = None;
                }
            },
            |pv| PvView::from_api(pv, Needs::ALL),
        );
        // Each in-tree source with a migration path, a CSI one being deleted, an NFS one.
        assert_eq!(pvs.len(), 10);
        let spec = |name: &str| {
            let pv = pvs
                .iter()
                .find(|pv| pv.metadata.name.as_deref() == Some(name));
            pv.unwrap().spec.clone().unwrap()
        };
        let deleted = pvs
            .iter()
            .find(|pv| pv.metadata.deletion_timestamp.is_some());
        assert_eq!(deleted.unwrap().metadata.name.as_deref(), Some("pbfix-csi"));
        assert!(
            spec("pbfix-csi")
                .csi
                .unwrap()
                .node_expand_secret_ref
                .is_some()
        );
        assert!(spec("pbfix-azdisk").azure_disk.is_some());
        assert!(spec("pbfix-vsphere").vsphere_volume.is_some());
    }

    #[test]
    fn claims_read_from_protobuf_equal_those_read_from_json() {
        let claims = both_encodings_alike(
            (PVC_JSON, PVC_PROTOBUF),
            &[1, 5, 64, PVC_PROTOBUF.len()],
            persistent_volume_claim,
            |pvc| uncarried_meta(&mut pvc.metadata),
            |pvc| ClaimView::from_api(pvc, Needs::ALL),
        );
        assert_eq!(claims.len(), 4);
        let status = |name: &str| {
            let pvc = claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(name));
            pvc.unwrap().status.clone().unwrap()
        };
        assert!(status("minimal").modify_volume_status.is_some());
        assert_eq!(status("minimal").conditions.unwrap().len(), 2);
        let unbound = claims
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some("unbound"));
        let spec = unbound.unwrap().spec.clone().unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some(""));
        assert!(spec.selector.is_some() && spec.data_source_ref.is_some());
    }

    #[test]
    fn an_object_that_is_no_message_or_has_an_impossible_time_is_refused() {
        assert!(matches!(
            persistent_volume(b"\x0a\x05ab"),
            Err(ObjectError::Decode(_))
        ));
        let meta = ObjectMeta {
            deletion_timestamp: Some(Time {
                seconds: Some(i64::MAX),
            }),
            ..ObjectMeta::default()
        };
        let pvc = PersistentVolumeClaim {
            metadata: Some(meta),
            ..PersistentVolumeClaim::default()
        };
        assert!(matches!(
            persistent_volume_claim(&pvc.encode_to_vec()),
            Err(ObjectError::Time(i64::MAX))
        ));
    }
}
