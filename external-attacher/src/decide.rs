//! The attacher's decisions, as plain functions over cached objects: what to do with a
//! VolumeAttachment or a PersistentVolume, the exact CSI request, and the exact patches.
//! Nothing here performs I/O; the controller executes the plans.

use std::collections::{BTreeMap, HashMap};

use csi_proto::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use csi_proto::v1::{
    ControllerPublishVolumeRequest, ControllerUnpublishVolumeRequest, VolumeCapability,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::model::{CsiSource, NODE_ID_ANNOTATION, Pv, SecretRef, Va, VaSource, VolumeSpec};

/// What the driver can do and how it is configured, as far as decisions depend on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub driver: String,
    pub finalizer: String,
    /// The driver implements ControllerPublish/Unpublish; without it, attaching is trivial.
    pub publish_unpublish: bool,
    pub publish_readonly: bool,
    pub single_node_multi_writer: bool,
    /// `--default-fstype`.
    pub default_fstype: String,
    /// Record gRPC codes in `errorCode` (feature gate `MutableCSINodeAllocatableCount`).
    pub error_codes: bool,
}

/// The node ID of a VolumeAttachment's node, from its CSINode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLookup {
    Found(String),
    NoCsiNode,
    /// The CSINode exists but the driver is not registered in it.
    DriverMissing,
}

/// Attach or detach: which status field an error goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Attach,
    Detach,
}

impl Phase {
    pub fn status_field(self) -> &'static str {
        match self {
            Self::Attach => "attachError",
            Self::Detach => "detachError",
        }
    }

    /// Reason of the Warning event.
    pub fn failure_reason(self) -> &'static str {
        match self {
            Self::Attach => "AttachFailed",
            Self::Detach => "DetachFailed",
        }
    }
}

/// Why a VolumeAttachment cannot be processed, found without any I/O. The messages are
/// upstream's, since users and tools read them in the VolumeAttachment status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("persistentvolume \"{0}\" not found")]
    PvNotFound(String),
    #[error("PersistentVolume \"{0}\" is marked for deletion")]
    PvDeleting(String),
    #[error("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")]
    BothSources,
    #[error("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")]
    NoSource,
    #[error("inline volume spec contains nil CSI source")]
    InlineNotCsi,
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    #[error("failed to translate in tree pv to CSI: {0}")]
    Translation(String),
    #[error("{0}")]
    AccessModes(String),
    #[error("csinode.storage.k8s.io \"{0}\" not found")]
    NoCsiNode(String),
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode { node: String, driver: String },
}

/// A strategic merge patch of a PersistentVolume's finalizers.
#[derive(Clone, Debug, PartialEq)]
pub struct PvPatch {
    pub name: String,
    pub patch: Value,
}

/// What to do with one VolumeAttachment.
#[derive(Clone, Debug, PartialEq)]
pub enum VaPlan {
    /// Already in the desired state.
    Nothing,
    /// Driver without ControllerPublish: just report the volume attached.
    MarkAttached,
    Attach(Box<AttachPlan>),
    Detach(Box<DetachPlan>),
    Fail(Phase, Problem),
}

/// The steps of an attach, in order: PV finalizer, VA finalizer + node-id annotation,
/// ControllerPublishVolume (secrets filled in by the executor), then the status.
#[derive(Clone, Debug, PartialEq)]
pub struct AttachPlan {
    pub pv_finalizer: Option<PvPatch>,
    pub secret: Option<SecretRef>,
    /// Strategic merge patch of the VolumeAttachment's metadata.
    pub va_metadata: Option<Value>,
    pub request: ControllerPublishVolumeRequest,
    /// The volume is an in-tree one translated to CSI (the `migrated` metric label).
    pub migrated: bool,
}

/// The steps of a detach: ControllerUnpublishVolume, removal of the VA finalizer, and the status
/// reset when the VolumeAttachment outlives the finalizer removal ([`outlives_detach`]).
#[derive(Clone, Debug, PartialEq)]
pub struct DetachPlan {
    pub secret: Option<SecretRef>,
    pub request: ControllerUnpublishVolumeRequest,
    /// Strategic merge patch removing the finalizer.
    pub remove_finalizer: Value,
    /// The volume is an in-tree one translated to CSI (the `migrated` metric label).
    pub migrated: bool,
}

/// What to do with one PersistentVolume.
#[derive(Clone, Debug, PartialEq)]
pub enum PvPlan {
    Nothing,
    RemoveFinalizer(PvPatch),
}

/// Decides what to do with `va`. `pv` is the PersistentVolume it names (`None`: not found);
/// `node` is what its node's CSINode says; `force` is set by the reconciler when the driver
/// disagrees with the status.
pub fn plan_va(
    policy: &Policy,
    va: &Va,
    pv: Option<&Pv>,
    node: &NodeLookup,
    force: bool,
) -> VaPlan {
    if !policy.publish_unpublish {
        return if !va.attached && !va.deleting {
            VaPlan::MarkAttached
        } else {
            VaPlan::Nothing
        };
    }
    if va.deleting {
        plan_detach(policy, va, pv, node)
    } else {
        plan_attach(policy, va, pv, node, force)
    }
}

fn plan_attach(
    policy: &Policy,
    va: &Va,
    pv: Option<&Pv>,
    node: &NodeLookup,
    force: bool,
) -> VaPlan {
    if va.attached && !force {
        return VaPlan::Nothing;
    }
    let fail = |problem| VaPlan::Fail(Phase::Attach, problem);
    let (spec, pv) = match volume_spec(va, pv) {
        Ok(found) => found,
        Err(problem) => return fail(problem),
    };
    if let Some(pv) = pv
        && pv.deleting
    {
        return fail(Problem::PvDeleting(pv.name.clone()));
    }
    let csi = match csi_source(va, spec, pv) {
        Ok(csi) => csi,
        Err(problem) => return fail(problem),
    };
    let capability = match volume_capability(spec, csi, policy) {
        Ok(capability) => capability,
        Err(problem) => return fail(problem),
    };
    let node_id = match node_id(policy, va, node, false) {
        Ok(id) => id,
        Err(problem) => return fail(problem),
    };
    let pv_finalizer = pv
        .filter(|pv| !pv.has_finalizer(&policy.finalizer))
        .map(|pv| PvPatch {
            name: pv.name.clone(),
            patch: add_finalizer_patch(&policy.finalizer),
        });
    VaPlan::Attach(Box::new(AttachPlan {
        pv_finalizer,
        secret: csi.publish_secret.as_deref().cloned(),
        va_metadata: va_metadata_patch(va, &policy.finalizer, &node_id),
        request: ControllerPublishVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            node_id,
            volume_capability: Some(capability),
            // "CO MUST set this field to false if SP does not have the PUBLISH_READONLY
            // controller capability."
            readonly: csi.read_only && policy.publish_readonly,
            secrets: HashMap::new(),
            volume_context: csi
                .volume_attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        },
        migrated: migrated(pv),
    }))
}

fn plan_detach(policy: &Policy, va: &Va, pv: Option<&Pv>, node: &NodeLookup) -> VaPlan {
    // Our finalizer goes only after a successful unpublish: without it there is nothing to
    // detach, whatever an earlier reconciler pass saw.
    if !va.has_finalizer(&policy.finalizer) {
        return VaPlan::Nothing;
    }
    let fail = |problem| VaPlan::Fail(Phase::Detach, problem);
    let csi = match volume_spec(va, pv).and_then(|(spec, pv)| csi_source(va, spec, pv)) {
        Ok(csi) => csi,
        Err(problem) => return fail(problem),
    };
    let node_id = match node_id(policy, va, node, true) {
        Ok(id) => id,
        Err(problem) => return fail(problem),
    };
    VaPlan::Detach(Box::new(DetachPlan {
        secret: csi.publish_secret.as_deref().cloned(),
        request: ControllerUnpublishVolumeRequest {
            volume_id: csi.volume_handle.clone(),
            node_id,
            secrets: HashMap::new(),
        },
        remove_finalizer: remove_finalizer_patch(&policy.finalizer),
        migrated: migrated(pv),
    }))
}

/// The volume spec a VolumeAttachment refers to, and its PV if it names one.
fn volume_spec<'a>(
    va: &'a Va,
    pv: Option<&'a Pv>,
) -> Result<(&'a VolumeSpec, Option<&'a Pv>), Problem> {
    match &va.source {
        VaSource::Both => Err(Problem::BothSources),
        VaSource::Neither => Err(Problem::NoSource),
        VaSource::Inline(spec) => Ok((spec, None)),
        VaSource::Pv(name) => match pv {
            Some(pv) => Ok((&pv.spec, Some(pv))),
            None => Err(Problem::PvNotFound(name.clone())),
        },
    }
}

fn csi_source<'a>(
    va: &Va,
    spec: &'a VolumeSpec,
    pv: Option<&Pv>,
) -> Result<&'a CsiSource, Problem> {
    let translation_error = pv
        .and_then(|pv| pv.in_tree.as_ref())
        .and_then(|in_tree| in_tree.error.clone());
    match (&spec.csi, &va.source) {
        (Some(csi), _) => Ok(csi),
        (None, VaSource::Inline(_)) => Err(Problem::InlineNotCsi),
        (None, _) => Err(translation_error.map_or(Problem::NotCsi, Problem::Translation)),
    }
}

/// Whether the calls for this volume count as migrated: a PV translated from an in-tree source.
/// Inline specs never do, as upstream labels them.
fn migrated(pv: Option<&Pv>) -> bool {
    pv.is_some_and(|pv| pv.in_tree.is_some())
}

/// The node ID: from the CSINode, or when detaching from the annotation written at attach time
/// (the node or its driver may be gone, which must not block the detach).
fn node_id(
    policy: &Policy,
    va: &Va,
    node: &NodeLookup,
    detaching: bool,
) -> Result<String, Problem> {
    if let NodeLookup::Found(id) = node {
        return Ok(id.clone());
    }
    if detaching && let Some(id) = &va.node_id_annotation {
        return Ok(id.clone());
    }
    Err(match node {
        NodeLookup::DriverMissing => Problem::DriverNotOnNode {
            node: va.node_name.to_string(),
            driver: policy.driver.clone(),
        },
        _ => Problem::NoCsiNode(va.node_name.to_string()),
    })
}

/// Maps PV access modes to a CSI access mode, as csi-lib-utils' `ToCSIAccessMode` does.
pub fn csi_access_mode<S: AsRef<str>>(
    modes: &[S],
    single_node_multi_writer: bool,
) -> Result<Mode, Problem> {
    sidecar_kit::values::accessmodes::to_csi(modes, single_node_multi_writer)
        .map_err(Problem::AccessModes)
}

/// The VolumeCapability of a publish: block or mount (fsType, else `--default-fstype`; mount
/// options), with the mapped access mode.
pub fn volume_capability(
    spec: &VolumeSpec,
    csi: &CsiSource,
    policy: &Policy,
) -> Result<VolumeCapability, Problem> {
    let access_type = if spec.block {
        AccessType::Block(BlockVolume {})
    } else {
        let fs_type = if csi.fs_type.is_empty() {
            policy.default_fstype.clone()
        } else {
            csi.fs_type.to_string()
        };
        AccessType::Mount(MountVolume {
            fs_type,
            mount_flags: spec.mount_options.clone(),
            volume_mount_group: String::new(),
        })
    };
    let mode = csi_access_mode(&spec.access_modes, policy.single_node_multi_writer)?;
    Ok(VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(access_type),
    })
}

/// Strategic merge patch adding our finalizer and the node-id annotation, or `None` if both
/// are there. The finalizer is merged into the list the server holds (see
/// [`add_finalizer_patch`]).
pub fn va_metadata_patch(va: &Va, finalizer: &str, node_id: &str) -> Option<Value> {
    let mut metadata = serde_json::Map::new();
    if !va.has_finalizer(finalizer) {
        metadata.insert("finalizers".into(), json!([finalizer]));
    }
    if va.node_id_annotation.as_deref() != Some(node_id) {
        metadata.insert("annotations".into(), json!({ NODE_ID_ANNOTATION: node_id }));
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

/// Strategic merge patch adding `finalizer`. `metadata.finalizers` merges as a set, so the
/// server adds ours to the list it holds at that moment: the patch carries no resourceVersion
/// and no copy of the list, so it neither conflicts with concurrent writers (on PVs the
/// pv-protection controller and the binder) nor drops a finalizer they added meanwhile.
pub fn add_finalizer_patch(finalizer: &str) -> Value {
    json!({"metadata": {"finalizers": [finalizer]}})
}

/// Strategic merge patch removing `finalizer` from the list the server holds, whatever else it
/// contains (see [`add_finalizer_patch`]).
pub fn remove_finalizer_patch(finalizer: &str) -> Value {
    json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}})
}

/// Whether a VolumeAttachment, as the removal of our finalizer returned it, still exists, so
/// that its status is reset. Without finalizers that write deleted it, and a status write would
/// only fail. Decided from the write's response, not the cache: another controller may have
/// added or removed a finalizer meanwhile.
pub fn outlives_detach(va: &Va) -> bool {
    !(va.deleting && va.finalizers.is_empty())
}

/// The status patch after a successful publish, or `None` when the status already says so.
pub fn attached_status_patch(va: &Va, publish_context: &BTreeMap<String, String>) -> Option<Value> {
    if va.attached && !va.attach_error && va.attachment_metadata == *publish_context {
        return None;
    }
    let metadata = if publish_context.is_empty() {
        Value::Null
    } else {
        json!(publish_context)
    };
    Some(json!({"status": {"attached": true, "attachmentMetadata": metadata, "attachError": null}}))
}

/// The status patch after a successful unpublish.
pub fn detached_status_patch() -> Value {
    json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
}

/// The status patch recording a failure. Every field of the VolumeError is written, so that a
/// merge with an older error leaves nothing of it behind.
pub fn error_status_patch(phase: Phase, message: &str, code: Option<i32>, now: Timestamp) -> Value {
    let mut status = serde_json::Map::new();
    status.insert(
        phase.status_field().into(),
        json!({"message": message, "time": Time(now), "errorCode": code}),
    );
    json!({ "status": status })
}

/// What to do with a PersistentVolume whose events passed [`pv_needs_processing`]: remove our
/// finalizer once no VolumeAttachment names it, if the PV is being deleted or is an in-tree
/// volume whose migration to this driver was rolled back.
pub fn plan_pv(policy: &Policy, pv: &Pv, referenced: bool) -> PvPlan {
    if !finalizer_may_go(pv, &policy.driver) || referenced || !pv.has_finalizer(&policy.finalizer) {
        return PvPlan::Nothing;
    }
    PvPlan::RemoveFinalizer(PvPatch {
        name: pv.name.clone(),
        patch: remove_finalizer_patch(&policy.finalizer),
    })
}

/// Upstream's PV event filter: only PVs carrying our finalizer that may lose it need work.
pub fn pv_needs_processing(pv: &Pv, driver: &str, finalizer: &str) -> bool {
    finalizer_may_go(pv, driver) && pv.has_finalizer(finalizer)
}

fn finalizer_may_go(pv: &Pv, driver: &str) -> bool {
    pv.deleting || pv.migration_rolled_back(driver)
}

/// Whether the driver's view (`published`: volume ID → node IDs) disagrees with the status.
pub fn out_of_sync(
    attached: bool,
    volume_id: &str,
    node_id: &str,
    published: &HashMap<String, Vec<String>>,
) -> bool {
    let found = published
        .get(volume_id)
        .is_some_and(|nodes| nodes.iter().any(|n| n == node_id));
    attached != found
}

#[cfg(test)]
mod tests;
