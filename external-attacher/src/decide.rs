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
    sidecar_kit::accessmodes::to_csi(modes, single_node_multi_writer).map_err(Problem::AccessModes)
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
mod tests {
    use super::*;
    use crate::model::SecretRef;
    use sidecar_kit::atom::{Atom, List};

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const FINALIZER: &str = "external-attacher/hostpath-csi-k8s-io";

    /// `finalizers` and the attacher's own.
    fn with_ours(finalizers: &[Atom]) -> List<Atom> {
        finalizers
            .iter()
            .cloned()
            .chain([Atom::new(FINALIZER)])
            .collect()
    }

    fn policy() -> Policy {
        Policy {
            driver: "hostpath.csi.k8s.io".into(),
            finalizer: FINALIZER.into(),
            publish_unpublish: true,
            publish_readonly: false,
            single_node_multi_writer: false,
            default_fstype: String::new(),
            error_codes: true,
        }
    }

    fn spec() -> VolumeSpec {
        VolumeSpec {
            csi: Some(CsiSource {
                driver: "hostpath.csi.k8s.io".into(),
                volume_handle: "vol-1".into(),
                read_only: false,
                fs_type: sidecar_kit::atom::Atom::default(),
                volume_attributes: [("a".to_string(), "b".to_string())].into(),
                publish_secret: None,
            }),
            access_modes: vec!["ReadWriteOnce".into()],
            block: false,
            mount_options: vec![],
        }
    }

    fn pv() -> Pv {
        Pv {
            name: "pv-1".into(),
            resource_version: "5".into(),
            deleting: false,
            finalizers: List::default(),
            migrated_to: None,
            spec: spec(),
            in_tree: None,
        }
    }

    fn va() -> Va {
        Va {
            name: "va-1".into(),
            uid: "u".into(),
            resource_version: "9".into(),
            deleting: false,
            finalizers: List::default(),
            node_id_annotation: None,
            attacher: "hostpath.csi.k8s.io".into(),
            node_name: "node-1".into(),
            source: VaSource::Pv("pv-1".into()),
            attached: false,
            attachment_metadata: BTreeMap::new(),
            attach_error: false,
            detach_error: false,
        }
    }

    fn found() -> NodeLookup {
        NodeLookup::Found("nid-1".into())
    }

    fn attach_plan(plan: VaPlan) -> AttachPlan {
        match plan {
            VaPlan::Attach(plan) => *plan,
            other => panic!("expected an attach, got {other:?}"),
        }
    }

    fn detach_plan(plan: VaPlan) -> DetachPlan {
        match plan {
            VaPlan::Detach(plan) => *plan,
            other => panic!("expected a detach, got {other:?}"),
        }
    }

    #[test]
    fn first_attach_writes_pv_finalizer_va_metadata_then_publishes() {
        let plan = attach_plan(plan_va(&policy(), &va(), Some(&pv()), &found(), false));
        assert_eq!(
            plan.pv_finalizer,
            Some(PvPatch {
                name: "pv-1".into(),
                patch: json!({"metadata": {"finalizers": [FINALIZER]}}),
            })
        );
        assert_eq!(
            plan.va_metadata,
            Some(json!({"metadata": {"finalizers": [FINALIZER],
                "annotations": {"csi.alpha.kubernetes.io/node-id": "nid-1"}}}))
        );
        assert_eq!(plan.secret, None);
        let r = &plan.request;
        assert_eq!(
            (r.volume_id.as_str(), r.node_id.as_str()),
            ("vol-1", "nid-1")
        );
        assert!(!r.readonly);
        assert_eq!(r.volume_context["a"], "b");
        assert_eq!(
            r.volume_capability,
            Some(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32
                }),
                access_type: Some(AccessType::Mount(MountVolume {
                    fs_type: String::new(),
                    mount_flags: vec![],
                    volume_mount_group: String::new(),
                })),
            })
        );
    }

    #[test]
    fn repeated_attach_writes_nothing_already_present() {
        let mut va = va();
        va.finalizers = List::new(&[Atom::new("other"), Atom::new(FINALIZER)]);
        va.node_id_annotation = Some("nid-1".into());
        let mut pv = pv();
        pv.finalizers = List::new(&[Atom::new(FINALIZER)]);
        let plan = attach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
        assert_eq!(plan.pv_finalizer, None);
        assert_eq!(plan.va_metadata, None);

        // A changed node ID rewrites only the annotation.
        let plan = attach_plan(plan_va(
            &policy(),
            &va,
            Some(&pv),
            &NodeLookup::Found("nid-2".into()),
            false,
        ));
        assert_eq!(
            plan.va_metadata,
            Some(
                json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": "nid-2"}}})
            )
        );
    }

    #[test]
    fn finalizer_patches_name_only_ours_and_carry_no_resource_version() {
        // Whatever the cached PV or VA holds, the patches add or delete our finalizer alone:
        // the server merges them into its current list, so concurrent writers (pv-protection,
        // the binder) neither conflict with them nor lose their finalizers.
        let mut pv = pv();
        pv.finalizers = List::new(&[Atom::new("kubernetes.io/pv-protection")]);
        let mut va = va();
        va.finalizers = List::new(&[Atom::new("example.com/other")]);
        let plan = attach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
        assert_eq!(
            plan.pv_finalizer.unwrap().patch,
            json!({"metadata": {"finalizers": [FINALIZER]}})
        );
        assert_eq!(
            plan.va_metadata,
            Some(json!({"metadata": {"finalizers": [FINALIZER],
                "annotations": {"csi.alpha.kubernetes.io/node-id": "nid-1"}}}))
        );

        pv.finalizers = with_ours(&pv.finalizers);
        pv.deleting = true;
        let PvPlan::RemoveFinalizer(removal) = plan_pv(&policy(), &pv, false) else {
            panic!("expected a removal");
        };
        va.finalizers = with_ours(&va.finalizers);
        va.deleting = true;
        let detach = detach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
        for patch in [removal.patch, detach.remove_finalizer] {
            assert_eq!(
                patch,
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})
            );
        }
    }

    #[test]
    fn attached_volumes_are_left_alone_unless_forced() {
        let mut va = va();
        va.attached = true;
        assert_eq!(
            plan_va(&policy(), &va, Some(&pv()), &found(), false),
            VaPlan::Nothing
        );
        assert!(matches!(
            plan_va(&policy(), &va, Some(&pv()), &found(), true),
            VaPlan::Attach(_)
        ));
    }

    #[test]
    fn attach_problems_table() {
        let mut deleting_pv = pv();
        deleting_pv.deleting = true;
        let mut not_csi = pv();
        not_csi.spec.csi = None;
        let mut bad_modes = pv();
        bad_modes.spec.access_modes = vec!["ReadOnlyMany".into(), "ReadWriteOnce".into()];
        let mut both = va();
        both.source = VaSource::Both;
        let mut neither = va();
        neither.source = VaSource::Neither;
        let mut inline_not_csi = va();
        inline_not_csi.source = VaSource::Inline(Box::default());
        let cases: Vec<(Va, Option<Pv>, NodeLookup, &str)> = vec![
            (va(), None, found(), "persistentvolume \"pv-1\" not found"),
            (
                va(),
                Some(deleting_pv),
                found(),
                "PersistentVolume \"pv-1\" is marked for deletion",
            ),
            (
                va(),
                Some(not_csi),
                found(),
                "pv spec contained non-csi source that was not migrated",
            ),
            (
                va(),
                Some(bad_modes),
                found(),
                "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
            ),
            (
                both,
                Some(pv()),
                found(),
                "both InlineCSIVolumeSource and PersistentVolumeName specified in VA source",
            ),
            (
                neither,
                None,
                found(),
                "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source",
            ),
            (
                inline_not_csi,
                None,
                found(),
                "inline volume spec contains nil CSI source",
            ),
            (
                va(),
                Some(pv()),
                NodeLookup::NoCsiNode,
                "csinode.storage.k8s.io \"node-1\" not found",
            ),
            (
                va(),
                Some(pv()),
                NodeLookup::DriverMissing,
                "CSINode node-1 does not contain driver hostpath.csi.k8s.io",
            ),
        ];
        for (va, pv, node, message) in cases {
            match plan_va(&policy(), &va, pv.as_ref(), &node, false) {
                VaPlan::Fail(Phase::Attach, problem) => assert_eq!(problem.to_string(), message),
                other => panic!("{message}: got {other:?}"),
            }
        }
    }

    #[test]
    fn attach_ignores_the_annotation_fallback() {
        let mut va = va();
        va.node_id_annotation = Some("old".into());
        assert!(matches!(
            plan_va(&policy(), &va, Some(&pv()), &NodeLookup::NoCsiNode, false),
            VaPlan::Fail(Phase::Attach, Problem::NoCsiNode(_))
        ));
    }

    #[test]
    fn capability_block_fstype_and_mount_options() {
        let mut p = policy();
        p.default_fstype = "ext4".into();
        let mut s = spec();
        s.mount_options = vec!["noatime".into()];
        let csi = s.csi.clone().unwrap();
        let cap = volume_capability(&s, &csi, &p).unwrap();
        assert_eq!(
            cap.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }))
        );
        let mut csi_xfs = csi.clone();
        csi_xfs.fs_type = "xfs".into();
        let cap = volume_capability(&s, &csi_xfs, &p).unwrap();
        assert!(
            matches!(cap.access_type, Some(AccessType::Mount(MountVolume { ref fs_type, .. })) if fs_type == "xfs")
        );
        s.block = true;
        let cap = volume_capability(&s, &csi, &p).unwrap();
        assert_eq!(cap.access_type, Some(AccessType::Block(BlockVolume {})));
    }

    #[test]
    fn readonly_only_with_the_capability_and_secrets_and_inline() {
        let mut inline = spec();
        if let Some(csi) = inline.csi.as_mut() {
            csi.read_only = true;
            csi.publish_secret = Some(Box::new(SecretRef {
                namespace: "ns".into(),
                name: "s".into(),
            }));
        }
        let mut va = va();
        va.source = VaSource::Inline(Box::new(inline));
        let plan = attach_plan(plan_va(&policy(), &va, None, &found(), false));
        assert!(!plan.request.readonly);
        assert_eq!(plan.pv_finalizer, None, "inline volumes have no PV");
        assert_eq!(
            plan.secret,
            Some(SecretRef {
                namespace: "ns".into(),
                name: "s".into()
            })
        );
        let mut p = policy();
        p.publish_readonly = true;
        let plan = attach_plan(plan_va(&p, &va, None, &found(), false));
        assert!(plan.request.readonly);
    }

    #[test]
    fn detach_removes_the_last_finalizer_without_a_status_write() {
        let mut va = va();
        va.deleting = true;
        va.attached = true;
        va.finalizers = List::new(&[Atom::new(FINALIZER)]);
        let plan = detach_plan(plan_va(&policy(), &va, Some(&pv()), &found(), false));
        assert_eq!(plan.request.volume_id, "vol-1");
        assert_eq!(plan.request.node_id, "nid-1");
        assert_eq!(
            plan.remove_finalizer,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})
        );

        // The response of the removal decides: gone without finalizers, kept by others.
        va.finalizers = List::default();
        assert!(!outlives_detach(&va));
        va.finalizers = List::new(&[Atom::new("keep")]);
        assert!(outlives_detach(&va), "the object outlives our finalizer");
    }

    #[test]
    fn detach_table() {
        let mut deleting = va();
        deleting.deleting = true;
        // Without our finalizer there is nothing to detach, even when forced: it goes only
        // after a successful unpublish.
        assert_eq!(
            plan_va(&policy(), &deleting, Some(&pv()), &found(), false),
            VaPlan::Nothing
        );
        deleting.attached = true;
        assert_eq!(
            plan_va(&policy(), &deleting, Some(&pv()), &found(), true),
            VaPlan::Nothing
        );

        // The node ID falls back to the annotation when the CSINode or the driver is gone.
        deleting.finalizers = List::new(&[Atom::new(FINALIZER)]);
        deleting.node_id_annotation = Some("nid-old".into());
        for lookup in [NodeLookup::NoCsiNode, NodeLookup::DriverMissing] {
            let plan = detach_plan(plan_va(&policy(), &deleting, Some(&pv()), &lookup, false));
            assert_eq!(plan.request.node_id, "nid-old");
        }
        deleting.node_id_annotation = None;
        assert_eq!(
            plan_va(
                &policy(),
                &deleting,
                Some(&pv()),
                &NodeLookup::NoCsiNode,
                false
            ),
            VaPlan::Fail(Phase::Detach, Problem::NoCsiNode("node-1".into()))
        );
        // A deleting PV does not stop a detach; a missing one does.
        let mut deleting_pv = pv();
        deleting_pv.deleting = true;
        assert!(matches!(
            plan_va(&policy(), &deleting, Some(&deleting_pv), &found(), false),
            VaPlan::Detach(_)
        ));
        assert_eq!(
            plan_va(&policy(), &deleting, None, &found(), false),
            VaPlan::Fail(Phase::Detach, Problem::PvNotFound("pv-1".into()))
        );
    }

    #[test]
    fn trivial_driver_marks_attached_only() {
        let mut p = policy();
        p.publish_unpublish = false;
        assert_eq!(
            plan_va(&p, &va(), None, &NodeLookup::NoCsiNode, false),
            VaPlan::MarkAttached
        );
        let mut attached = va();
        attached.attached = true;
        assert_eq!(
            plan_va(&p, &attached, None, &found(), true),
            VaPlan::Nothing
        );
        let mut deleting = va();
        deleting.deleting = true;
        assert_eq!(
            plan_va(&p, &deleting, None, &found(), false),
            VaPlan::Nothing
        );
    }

    #[test]
    fn status_patches() {
        let context: BTreeMap<String, String> = [("dev".to_string(), "/dev/x".to_string())].into();
        assert_eq!(
            attached_status_patch(&va(), &context),
            Some(
                json!({"status": {"attached": true, "attachmentMetadata": {"dev": "/dev/x"}, "attachError": null}})
            )
        );
        assert_eq!(
            attached_status_patch(&va(), &BTreeMap::new()),
            Some(
                json!({"status": {"attached": true, "attachmentMetadata": null, "attachError": null}})
            )
        );
        let mut attached = va();
        attached.attached = true;
        attached.attachment_metadata = context.clone();
        assert_eq!(attached_status_patch(&attached, &context), None);
        attached.attach_error = true;
        assert!(attached_status_patch(&attached, &context).is_some());

        let now = Timestamp::from_second(1_700_000_000).unwrap();
        assert_eq!(
            error_status_patch(
                Phase::Attach,
                "rpc error: code = NotFound desc = x",
                Some(5),
                now
            ),
            json!({"status": {"attachError": {"message": "rpc error: code = NotFound desc = x",
                "time": "2023-11-14T22:13:20Z", "errorCode": 5}}})
        );
        assert_eq!(
            error_status_patch(Phase::Detach, "m", None, now),
            json!({"status": {"detachError": {"message": "m", "time": "2023-11-14T22:13:20Z", "errorCode": null}}})
        );
        assert_eq!(
            detached_status_patch(),
            json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
        );
    }

    #[test]
    fn pv_finalizer_removal() {
        let mut pv = pv();
        pv.finalizers = List::new(&[
            Atom::new("kubernetes.io/pv-protection"),
            Atom::new(FINALIZER),
        ]);
        assert_eq!(
            plan_pv(&policy(), &pv, false),
            PvPlan::Nothing,
            "not deleting"
        );
        assert!(!pv_needs_processing(&pv, DRIVER, FINALIZER));
        pv.deleting = true;
        assert!(pv_needs_processing(&pv, DRIVER, FINALIZER));
        assert_eq!(
            plan_pv(&policy(), &pv, true),
            PvPlan::Nothing,
            "still referenced"
        );
        assert_eq!(
            plan_pv(&policy(), &pv, false),
            PvPlan::RemoveFinalizer(PvPatch {
                name: "pv-1".into(),
                patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}}),
            })
        );
        pv.finalizers = List::new(&[Atom::new("other")]);
        assert_eq!(plan_pv(&policy(), &pv, false), PvPlan::Nothing);
    }

    fn in_tree_pv(extra: Value) -> Pv {
        let mut pv = json!({
            "metadata": {"name": "pv-1", "resourceVersion": "5",
                         "annotations": {"pv.kubernetes.io/migrated-to": DRIVER}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "cinder": {"volumeID": "c-1", "fsType": "xfs", "readOnly": true}},
        });
        if let (Value::Object(pv), Value::Object(extra)) = (&mut pv, extra) {
            pv.extend(extra);
        }
        Pv::from_api(&serde_json::from_value(pv).unwrap())
    }

    #[test]
    fn in_tree_volumes_attach_and_detach_translated_and_labelled_migrated() {
        let mut p = policy();
        p.publish_readonly = true;
        let pv = in_tree_pv(json!({}));
        let plan = attach_plan(plan_va(&p, &va(), Some(&pv), &found(), false));
        assert!(plan.migrated);
        assert_eq!(plan.request.volume_id, "c-1");
        assert!(plan.request.readonly);
        assert!(plan.request.volume_context.is_empty());
        assert!(
            matches!(plan.request.volume_capability.unwrap().access_type,
                Some(AccessType::Mount(MountVolume { ref fs_type, .. })) if fs_type == "xfs")
        );
        assert!(plan.pv_finalizer.is_some());

        let mut deleting = va();
        deleting.deleting = true;
        deleting.finalizers = List::new(&[Atom::new(FINALIZER)]);
        let plan = detach_plan(plan_va(&p, &deleting, Some(&pv), &found(), false));
        assert!(plan.migrated);
        assert_eq!(plan.request.volume_id, "c-1");

        let plan = attach_plan(plan_va(&p, &va(), Some(&self::pv()), &found(), false));
        assert!(!plan.migrated, "CSI volumes are not migrated");
    }

    #[test]
    fn untranslatable_in_tree_volumes_fail_with_the_translation_error() {
        let pv = in_tree_pv(json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://z/x"}}}));
        assert_eq!(
            plan_va(&policy(), &va(), Some(&pv), &found(), false),
            VaPlan::Fail(
                Phase::Attach,
                Problem::Translation(
                    "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://z/x)".into()
                )
            )
        );
    }

    #[test]
    fn rolled_back_migration_releases_the_pv_finalizer() {
        let mut rolled_back = in_tree_pv(json!({"metadata": {"name": "pv-1"}}));
        rolled_back.finalizers = List::new(&[Atom::new(FINALIZER)]);
        assert!(pv_needs_processing(&rolled_back, DRIVER, FINALIZER));
        assert!(matches!(
            plan_pv(&policy(), &rolled_back, false),
            PvPlan::RemoveFinalizer(_)
        ));
        assert_eq!(plan_pv(&policy(), &rolled_back, true), PvPlan::Nothing);

        let mut migrated = in_tree_pv(json!({}));
        migrated.finalizers = List::new(&[Atom::new(FINALIZER)]);
        assert!(!pv_needs_processing(&migrated, DRIVER, FINALIZER));
        assert_eq!(plan_pv(&policy(), &migrated, false), PvPlan::Nothing);

        let mut to_another = migrated.clone();
        to_another.migrated_to = Some("other.example.com".into());
        assert!(pv_needs_processing(&to_another, DRIVER, FINALIZER));
    }

    #[test]
    fn reconcile_rules() {
        let published: HashMap<String, Vec<String>> =
            [("vol-1".to_string(), vec!["n1".to_string()])].into();
        assert!(!out_of_sync(true, "vol-1", "n1", &published));
        assert!(out_of_sync(true, "vol-1", "n2", &published));
        assert!(out_of_sync(true, "vol-2", "n1", &published));
        assert!(out_of_sync(false, "vol-1", "n1", &published));
        assert!(!out_of_sync(false, "vol-2", "n1", &published));
    }
}
