//! Data sources and the objects that go with them: VolumeSnapshots and their contents to
//! restore from, claims to clone from, ReferenceGrants that let a claim use a source in another
//! namespace, and VolumeAttributesClasses. Projections and the checks upstream makes before a
//! CreateVolume names a source, with its messages. No I/O.

use std::collections::BTreeMap;

use csi_proto::v1::VolumeContentSource;
use csi_proto::v1::volume_content_source::{SnapshotSource, Type, VolumeSource};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use sidecar_kit::values::version::ResourceVersion;

use crate::model::{self, Claim, Class, DataSource, Volume};

/// The annotation on a VolumeSnapshotContent that allows restoring it with another volume mode.
pub const ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// A `snapshot.storage.k8s.io/v1` VolumeSnapshot, as read: only the fields restores use.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct VolumeSnapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<SnapshotStatus>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    pub bound_volume_snapshot_content_name: Option<String>,
    pub ready_to_use: Option<bool>,
    pub restore_size: Option<Quantity>,
}

sidecar_kit::custom_resource!(
    VolumeSnapshot,
    k8s_openapi::NamespaceResourceScope,
    model::SNAPSHOT_GROUP,
    "v1",
    "VolumeSnapshot",
    "volumesnapshots"
);

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

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub volume_snapshot_ref: ObjectRef,
    pub source_volume_mode: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ObjectRef {
    pub uid: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContentStatus {
    pub snapshot_handle: Option<String>,
}

sidecar_kit::custom_resource!(
    VolumeSnapshotContent,
    k8s_openapi::ClusterResourceScope,
    model::SNAPSHOT_GROUP,
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents"
);

/// A `gateway.networking.k8s.io/v1beta1` ReferenceGrant, as read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ReferenceGrant {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: GrantSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct GrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    pub name: Option<String>,
}

sidecar_kit::custom_resource!(
    ReferenceGrant,
    k8s_openapi::NamespaceResourceScope,
    GATEWAY_GROUP,
    "v1beta1",
    "ReferenceGrant",
    "referencegrants"
);

/// What the index keeps of a VolumeSnapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: ResourceVersion,
    pub deleting: bool,
    /// Carries [`model::SNAPSHOT_FINALIZER`].
    pub protected: bool,
    pub bound_content: Option<String>,
    pub ready: bool,
    pub restore_size: Option<String>,
}

impl Snapshot {
    pub fn from_api(snapshot: &VolumeSnapshot) -> Self {
        let meta = &snapshot.metadata;
        let status = snapshot.status.as_ref();
        Self {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: ResourceVersion::new(meta.resource_version.as_deref()),
            deleting: meta.deletion_timestamp.is_some(),
            protected: meta
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == model::SNAPSHOT_FINALIZER),
            bound_content: status.and_then(|s| s.bound_volume_snapshot_content_name.clone()),
            ready: status.and_then(|s| s.ready_to_use) == Some(true),
            restore_size: status.and_then(|s| s.restore_size.as_ref().map(|q| q.0.clone())),
        }
    }
}

/// What a restore checks of a VolumeSnapshotContent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Content {
    pub name: String,
    pub driver: String,
    /// `spec.volumeSnapshotRef` uid, namespace and name.
    pub snapshot_ref: (String, String, String),
    pub handle: Option<String>,
    pub source_volume_mode: Option<String>,
    pub allow_mode_change: Option<String>,
}

impl Content {
    pub fn from_api(content: &VolumeSnapshotContent) -> Self {
        let r = &content.spec.volume_snapshot_ref;
        Self {
            name: content.metadata.name.clone().unwrap_or_default(),
            driver: content.spec.driver.clone(),
            snapshot_ref: (
                r.uid.clone().unwrap_or_default(),
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            ),
            handle: content
                .status
                .as_ref()
                .and_then(|s| s.snapshot_handle.clone()),
            source_volume_mode: content.spec.source_volume_mode.clone(),
            allow_mode_change: content
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ALLOW_VOLUME_MODE_CHANGE).cloned()),
        }
    }
}

/// What the index keeps of a ReferenceGrant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub namespace: String,
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

impl Grant {
    pub fn from_api(grant: &ReferenceGrant) -> Self {
        Self {
            namespace: grant.metadata.namespace.clone().unwrap_or_default(),
            from: grant.spec.from.clone(),
            to: grant.spec.to.clone(),
        }
    }

    /// Whether this grant lets claims of `claim_namespace` use `source` (in the grant's
    /// namespace): a `from` entry for claims of that namespace and a `to` entry for the source.
    pub fn allows(&self, claim_namespace: &str, source: &DataSource) -> bool {
        let from = self.from.iter().any(|f| {
            f.group.is_empty()
                && f.kind == "PersistentVolumeClaim"
                && f.namespace == claim_namespace
        });
        let to = self.to.iter().any(|t| {
            t.group == source.api_group
                && t.kind == source.kind
                && t.name
                    .as_deref()
                    .is_none_or(|n| n.is_empty() || n == source.name)
        });
        from && to
    }
}

/// Why a claim may not use a source in another namespace.
pub fn not_granted(claim: &Claim, source: &DataSource) -> String {
    format!(
        "accessing {}/{} of {} dataSource from {}/{} isn't allowed",
        source.namespace_in(&claim.namespace),
        source.name,
        source.kind,
        claim.namespace,
        claim.name
    )
}

/// A VolumeAttributesClass: the driver it is for and the parameters it sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttributesClass {
    pub name: String,
    pub driver: String,
    pub parameters: BTreeMap<String, String>,
}

impl AttributesClass {
    pub fn from_api(vac: &VolumeAttributesClass) -> Self {
        Self {
            name: vac.metadata.name.clone().unwrap_or_default(),
            driver: vac.driver_name.clone(),
            parameters: vac.parameters.clone().unwrap_or_default(),
        }
    }
}

/// Why a source cannot be used yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    pub message: String,
    /// The source may become usable by itself (it does not exist yet, is not bound or not
    /// ready): a watch on it can say when to try again.
    pub may_change: bool,
}

impl SourceError {
    fn fixed(message: String) -> Self {
        Self {
            message,
            may_change: false,
        }
    }

    fn changing(message: String) -> Self {
        Self {
            message,
            may_change: true,
        }
    }
}

/// The message a source error is reported with, as upstream wraps it.
pub fn wrap(source: &DataSource, message: &str) -> String {
    format!(
        "error getting handle for DataSource Type {} by Name {}: {message}",
        source.kind, source.name
    )
}

/// The first checks of a restore, on the VolumeSnapshot alone (`None`: it does not exist).
/// Returns the snapshot and the name of its content.
pub fn check_snapshot<'a>(
    name: &str,
    snapshot: Option<&'a Snapshot>,
) -> Result<(&'a Snapshot, &'a str), SourceError> {
    let Some(snapshot) = snapshot else {
        return Err(SourceError::changing(format!(
            "error getting snapshot {name} from api server: volumesnapshots.snapshot.storage.k8s.io \"{name}\" not found"
        )));
    };
    // A snapshot being deleted can still be restored while our finalizer holds it.
    if snapshot.deleting && !snapshot.protected {
        return Err(SourceError::fixed(format!(
            "snapshot {name} is being deleted"
        )));
    }
    match snapshot.bound_content.as_deref() {
        Some(content) => Ok((snapshot, content)),
        None => Err(SourceError::changing(format!("snapshot {name} not bound"))),
    }
}

/// The remaining checks of a restore, with the snapshot's content; the content source of the
/// CreateVolume request.
pub fn check_content(
    claim: &Claim,
    class: &Class,
    snapshot: &Snapshot,
    content: &Content,
    prevent_volume_mode_conversion: bool,
) -> Result<VolumeContentSource, SourceError> {
    let name = &snapshot.name;
    let content_name = &content.name;
    let (uid, namespace, ref_name) = &content.snapshot_ref;
    if *uid != snapshot.uid || *namespace != snapshot.namespace || ref_name != name {
        return Err(SourceError::fixed(format!(
            "snapshotcontent {content_name} for snapshot {name} is bound to a different snapshot"
        )));
    }
    if content.driver != class.provisioner {
        return Err(SourceError::fixed(format!(
            "snapshotcontent {content_name} for snapshot {name} is not handled by CSI driver of StorageClass {}",
            class.name
        )));
    }
    if !snapshot.ready {
        return Err(SourceError::changing(format!(
            "snapshot {name} is not Ready"
        )));
    }
    let Some(handle) = content.handle.clone() else {
        return Err(SourceError::changing(format!(
            "snapshot handle {name} is not available"
        )));
    };
    if let Some(restore_size) = &snapshot.restore_size {
        let restore = sidecar_kit::values::quantity::parse(restore_size).unwrap_or(0);
        let Some(requested) = claim.request.as_deref() else {
            return Err(SourceError::fixed(format!(
                "error getting capacity for PVC {} when creating snapshot {name}",
                claim.name
            )));
        };
        let requested = sidecar_kit::values::quantity::parse(requested).unwrap_or(0);
        if requested < restore {
            return Err(SourceError::fixed(format!(
                "requested volume size {requested} is less than the size {restore} for the source snapshot {name}"
            )));
        }
    }
    let claim_mode = claim
        .pending
        .as_ref()
        .and_then(|p| p.volume_mode.as_deref());
    if prevent_volume_mode_conversion
        && let (Some(source_mode), Some(claim_mode)) =
            (content.source_volume_mode.as_deref(), claim_mode)
        && source_mode != claim_mode
    {
        let denied = |why: String| {
            SourceError::fixed(format!(
                "requested volume {}/{} modifies the mode of the source volume but does not have permission to do so. {why}",
                claim.namespace, claim.name
            ))
        };
        match content.allow_mode_change.as_deref() {
            None => {
                return Err(denied(format!(
                    "{ALLOW_VOLUME_MODE_CHANGE} annotation is not present on snapshotcontent {content_name}"
                )));
            }
            Some(value) => match sidecar_kit::process::flags::parse_go_bool(value) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(denied(format!(
                        "{ALLOW_VOLUME_MODE_CHANGE} is set to false on snapshotcontent {content_name}"
                    )));
                }
                Err(_) => {
                    return Err(denied(format!(
                        "failed to convert {ALLOW_VOLUME_MODE_CHANGE} annotation value to boolean with error: strconv.ParseBool: parsing \"{value}\": invalid syntax"
                    )));
                }
            },
        }
    }
    Ok(VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: handle,
        })),
    })
}

/// The checks of a clone from claim `source_name` (`source`: the claim if it exists; `pv`: its
/// volume if the index holds it); the content source of the CreateVolume request.
pub fn check_clone(
    claim: &Claim,
    class: &Class,
    source_name: &str,
    source: Option<&Claim>,
    pv: Option<&Volume>,
) -> Result<VolumeContentSource, SourceError> {
    let Some(source) = source else {
        return Err(SourceError::changing(format!(
            "error getting PVC {source_name} (namespace \"{}\") from api server: persistentvolumeclaim \"{source_name}\" not found",
            claim.namespace
        )));
    };
    if source.phase != "Bound" {
        return Err(SourceError::changing(format!(
            "the PVC DataSource {source_name} must have a status of Bound.  Got {{{}}}",
            source.phase
        )));
    }
    // Unlike upstream, a source being deleted can still be cloned while our finalizer holds
    // it: its clones are what keeps it, so refusing them would keep it forever.
    if source.deleting && !source.clone_protected {
        return Err(SourceError::fixed(format!(
            "the PVC DataSource {source_name} is currently being deleted"
        )));
    }
    if source.storage_class.is_none() {
        return Err(SourceError::fixed(format!(
            "the source PVC ({source_name}) storageclass cannot be empty"
        )));
    }
    if claim.storage_class.is_none() {
        return Err(SourceError::fixed(format!(
            "the requested PVC ({}) storageclass cannot be empty",
            claim.name
        )));
    }
    let bytes = |q: Option<&str>| {
        q.and_then(|q| sidecar_kit::values::quantity::parse(q).ok())
            .unwrap_or(0)
    };
    let requested = bytes(claim.request.as_deref());
    let source_size = bytes(source.request.as_deref());
    if requested < source_size {
        return Err(SourceError::fixed(format!(
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_size}"
        )));
    }
    if source.volume_name.is_empty() {
        return Err(SourceError::fixed(format!(
            "volume name is empty in source PVC {source_name}"
        )));
    }
    let invalid = || SourceError::fixed("claim in dataSource not bound or invalid".into());
    let Some(pv) = pv else {
        return Err(invalid());
    };
    let bound_to_source = pv.claim_uid == source.uid
        && pv.claim.as_ref().is_some_and(|(namespace, name)| {
            *namespace == source.namespace && *name == source.name
        });
    if pv.driver != class.provisioner || !bound_to_source || pv.phase != "Bound" {
        return Err(invalid());
    }
    let claim_block = claim
        .pending
        .as_ref()
        .is_some_and(|p| p.volume_mode.as_deref() == Some("Block"));
    let source_mode = pv.volume_mode.as_deref();
    let mismatch = if claim_block {
        (source_mode != Some("Block")).then_some(("Filesystem", "Block"))
    } else {
        source_mode
            .filter(|m| *m != "Filesystem")
            .map(|_| ("Block", "Filesystem"))
    };
    if let Some((source_mode, claim_mode)) = mismatch {
        return Err(SourceError::fixed(format!(
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is {source_mode}, but new PVC requested {claim_mode}"
        )));
    }
    Ok(VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: pv.volume_handle.clone(),
        })),
    })
}

#[cfg(test)]
mod tests;
