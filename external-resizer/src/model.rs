//! The fields of claims, PersistentVolumes, pods and VolumeAttributesClasses the resizer decides
//! from, projected out of the API objects so that the cache holds only these.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use sidecar_kit::pipeline::views::{self, ClaimView, Needs, PvView};
use sidecar_kit::values::atom::Atom;
use sidecar_kit::values::quantity;

/// What this controller reads of the process's shared views.
pub const NEEDS: Needs = Needs::CLAIM_REF
    .union(Needs::CAPABILITY)
    .union(Needs::EXPANSION);

/// Set on claims by kube-controller-manager's expand controller: which resizer expands them.
/// Only in-tree volumes migrated to CSI need it.
pub const STORAGE_RESIZER_ANNOTATION: &str = views::STORAGE_RESIZER;
/// Tells kubelet that no NodeExpandVolume is needed after the controller expansion.
pub const NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: &str = views::NODE_EXPANSION_NOT_REQUIRED;
/// The claim's capacity before an expansion that awaits the node (gate `AnnotateFsResize`).
pub const PRE_RESIZE_CAPACITY_ANNOTATION: &str = views::PRE_RESIZE_CAPACITY;
/// The Secret of ControllerModifyVolume, written on PVs by the provisioner.
pub const MODIFY_SECRET_NAME_ANNOTATION: &str = views::MODIFY_SECRET_NAME;
pub const MODIFY_SECRET_NAMESPACE_ANNOTATION: &str = views::MODIFY_SECRET_NAMESPACE;

/// Claim condition types of a resize; other conditions are never touched.
pub const RESIZING: &str = "Resizing";
pub const FILE_SYSTEM_RESIZE_PENDING: &str = "FileSystemResizePending";
pub const CONTROLLER_RESIZE_ERROR: &str = "ControllerResizeError";
pub const NODE_RESIZE_ERROR: &str = "NodeResizeError";
pub const RESIZE_CONDITIONS: [&str; 4] = [
    RESIZING,
    FILE_SYSTEM_RESIZE_PENDING,
    CONTROLLER_RESIZE_ERROR,
    NODE_RESIZE_ERROR,
];
/// Claim condition types of a VolumeAttributesClass change.
pub const MODIFYING_VOLUME: &str = "ModifyingVolume";
pub const MODIFY_VOLUME_ERROR: &str = "ModifyVolumeError";

/// The leader election Lease name, as upstream names it; also its lock name, which its Events
/// name (upstream sanitizes the driver's name before, so sanitizing again changes nothing).
pub fn lease_name(driver: &str) -> String {
    format!(
        "external-resizer-{}",
        sidecar_kit::cluster::leader::sanitize_name(driver)
    )
}

/// `allocatedResourceStatuses[storage]`: where an expansion stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeStatus {
    ControllerResizeInProgress,
    ControllerResizeInfeasible,
    NodeResizePending,
    NodeResizeInProgress,
    NodeResizeInfeasible,
}

impl ResizeStatus {
    pub const ALL: [Self; 5] = [
        Self::ControllerResizeInProgress,
        Self::ControllerResizeInfeasible,
        Self::NodeResizePending,
        Self::NodeResizeInProgress,
        Self::NodeResizeInfeasible,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControllerResizeInProgress => "ControllerResizeInProgress",
            Self::ControllerResizeInfeasible => "ControllerResizeInfeasible",
            Self::NodeResizePending => "NodeResizePending",
            Self::NodeResizeInProgress => "NodeResizeInProgress",
            Self::NodeResizeInfeasible => "NodeResizeInfeasible",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// A storage size: the quantity as written and its value in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Size {
    pub text: Atom,
    pub bytes: i128,
}

impl Size {
    /// `None` for a quantity that does not parse (the API server never stores one).
    pub fn parse(text: &str) -> Option<Self> {
        Some(Self {
            bytes: quantity::parse(text).ok()?,
            text: Atom::new(text),
        })
    }

    /// A byte count, written as upstream writes driver sizes (`resource.NewQuantity(n,
    /// BinarySI)`).
    pub fn from_bytes(bytes: i64) -> Self {
        Self {
            text: Atom::new(&quantity::format_binary(bytes)),
            bytes: i128::from(bytes),
        }
    }
}

/// A claim condition of the types the resizer writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339, as stored.
    pub last_transition_time: String,
}

impl Condition {
    fn is_ours(type_: &str) -> bool {
        RESIZE_CONDITIONS.contains(&type_)
            || type_ == MODIFYING_VOLUME
            || type_ == MODIFY_VOLUME_ERROR
    }
}

/// `status.modifyVolumeStatus`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModifyStatus {
    /// `Pending`, `InProgress` or `Infeasible`.
    pub status: String,
    pub target: Option<String>,
}

/// A PersistentVolumeClaim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub namespace: Atom,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub bound: bool,
    pub volume_name: Option<String>,
    pub request: Option<Size>,
    pub capacity: Option<Size>,
    pub allocated: Option<Size>,
    pub resize_status: Option<ResizeStatus>,
    /// Conditions of the types the resizer writes (others are left alone).
    pub conditions: Vec<Condition>,
    /// The types of all the claim's conditions, in their order: patches keep it.
    pub condition_order: Vec<String>,
    pub resizer: Option<Atom>,
    pub node_expansion_not_required: bool,
    pub class: Option<Atom>,
    pub current_class: Option<Atom>,
    pub modify_status: Option<Box<ModifyStatus>>,
}

impl Claim {
    pub fn from_api(pvc: &PersistentVolumeClaim) -> Self {
        Self::from_view(&ClaimView::from_api(pvc, NEEDS))
    }

    /// The resizer's projection of the process's shared view of a claim.
    pub fn from_view(view: &ClaimView) -> Self {
        let size = |text: &Option<Atom>| text.as_deref().and_then(Size::parse);
        // Views made for a process with a resizer have these; an empty set reads as a claim
        // without status.
        let fields = view.resize().unwrap_or_default();
        Self {
            namespace: view.namespace.clone(),
            name: view.name().to_string(),
            uid: view.uid.to_string(),
            resource_version: view.resource_version.to_string(),
            bound: view.phase == "Bound",
            volume_name: Some(view.volume_name.to_string()).filter(|n| !n.is_empty()),
            request: size(&view.request),
            capacity: size(&fields.capacity),
            allocated: size(&fields.allocated),
            resize_status: fields
                .resize_status
                .as_deref()
                .and_then(ResizeStatus::parse),
            conditions: fields
                .conditions
                .iter()
                .filter(|c| Condition::is_ours(&c.type_))
                .map(|c| Condition {
                    type_: c.type_.to_string(),
                    status: c.status.to_string(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                    last_transition_time: c.last_transition_time.clone(),
                })
                .collect(),
            condition_order: fields
                .conditions
                .iter()
                .map(|c| c.type_.to_string())
                .collect(),
            resizer: fields.annotation(STORAGE_RESIZER_ANNOTATION).map(Atom::new),
            node_expansion_not_required: fields
                .annotation(NODE_EXPANSION_NOT_REQUIRED_ANNOTATION)
                .is_some(),
            class: fields.attributes_class.clone(),
            current_class: fields.current_attributes_class.clone(),
            modify_status: fields.modify_status.as_ref().map(|m| {
                Box::new(ModifyStatus {
                    status: m.status.to_string(),
                    target: m.target.as_ref().map(Atom::to_string),
                })
            }),
        }
    }

    /// `namespace/name`, the queue key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    pub fn has_true_condition(&self, type_: &str) -> bool {
        self.condition(type_).is_some_and(|c| c.status == "True")
    }

    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(self.namespace.to_string()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: Some(self.resource_version.clone()).filter(|r| !r.is_empty()),
            ..Default::default()
        }
    }
}

pub use sidecar_kit::pipeline::views::SecretRef;

/// The claim a PV is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// A PersistentVolume of this driver (natively, or an in-tree volume migrated to it). Its CSI
/// fields are those of the translated spec for in-tree volumes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pv {
    pub name: String,
    pub resource_version: String,
    pub claim_ref: Option<ClaimRef>,
    pub capacity: Option<Size>,
    pub driver: Atom,
    pub volume_handle: String,
    pub fs_type: Atom,
    pub block: bool,
    pub access_modes: Vec<Atom>,
    pub mount_options: Vec<String>,
    // Boxed: most volumes have none, and every cached volume would carry the room for them.
    pub expand_secret: Option<Box<SecretRef>>,
    pub modify_secret: Option<Box<SecretRef>>,
    pub class: Option<Atom>,
    pub pre_resize_capacity: bool,
    /// An in-tree volume, seen through its CSI translation.
    pub in_tree: bool,
    /// Why an in-tree volume does not translate.
    pub translation_error: Option<String>,
}

impl Pv {
    /// The projection of a PV that `driver` serves, natively or through CSI migration; `None`
    /// for others, which the resizer never caches.
    pub fn from_api(pv: &PersistentVolume, driver: &str) -> Option<Self> {
        Self::from_view(&PvView::from_api(pv, NEEDS), driver)
    }

    /// [`from_api`](Self::from_api) out of the process's shared view of the PV.
    pub fn from_view(view: &PvView, driver: &str) -> Option<Self> {
        let migrates = view.in_tree.as_ref().filter(|t| t.driver == driver);
        let native = view.in_tree.is_none() && view.driver() == driver;
        if !native && migrates.is_none() {
            return None;
        }
        let csi = view.csi.as_ref();
        Some(Self {
            name: view.name.to_string(),
            resource_version: view.resource_version.to_string(),
            claim_ref: view.claim_ref.as_ref().map(|r| ClaimRef {
                namespace: r.namespace.to_string(),
                name: r.name.to_string(),
                uid: r.uid.to_string(),
            }),
            capacity: view.capacity.as_deref().and_then(Size::parse),
            driver: Atom::new(driver),
            volume_handle: view.volume_handle().to_string(),
            fs_type: csi.map(|c| c.fs_type.clone()).unwrap_or_default(),
            block: view.volume_mode.as_deref() == Some("Block"),
            access_modes: view.access_modes.to_vec(),
            mount_options: view.mount_options.iter().map(Atom::to_string).collect(),
            expand_secret: csi.and_then(|c| c.expand_secret.clone()),
            modify_secret: view
                .secret_annotations(
                    MODIFY_SECRET_NAME_ANNOTATION,
                    MODIFY_SECRET_NAMESPACE_ANNOTATION,
                )
                .map(Box::new),
            class: view.attributes_class.clone(),
            pre_resize_capacity: view.annotation(PRE_RESIZE_CAPACITY_ANNOTATION).is_some(),
            in_tree: migrates.is_some(),
            translation_error: migrates.and_then(|t| t.error.clone()),
        })
    }

    /// Whether the PV is bound to exactly this claim (namespace and UID).
    pub fn bound_to(&self, claim: &Claim) -> bool {
        self.claim_ref
            .as_ref()
            .is_some_and(|r| r.namespace == claim.namespace.as_str() && r.uid == claim.uid)
    }
}

/// A pod, as far as the in-use check needs it: the claims it mounts, whether it still runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaims {
    pub namespace: Atom,
    pub claims: Vec<String>,
    /// `Succeeded` or `Failed`: the pod no longer uses its volumes.
    pub terminated: bool,
}

impl PodClaims {
    /// `None` for pods that mount no claim, which are not cached.
    pub fn from_api(pod: &Pod) -> Option<Self> {
        let claims: Vec<String> = pod
            .spec
            .as_ref()?
            .volumes
            .iter()
            .flatten()
            .filter_map(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .collect();
        if claims.is_empty() {
            return None;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        Some(Self {
            namespace: Atom::new(pod.metadata.namespace.as_deref().unwrap_or_default()),
            claims,
            terminated: matches!(phase, Some("Succeeded" | "Failed")),
        })
    }
}

/// A VolumeAttributesClass: its driver and parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vac {
    pub name: String,
    pub driver: String,
    pub parameters: BTreeMap<String, String>,
}

impl Vac {
    pub fn from_api(vac: &VolumeAttributesClass) -> Self {
        Self {
            name: vac.metadata.name.clone().unwrap_or_default(),
            driver: vac.driver_name.clone(),
            parameters: vac.parameters.clone().unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(value: serde_json::Value) -> Claim {
        Claim::from_api(&serde_json::from_value(value).unwrap())
    }

    #[test]
    fn claims_project_what_a_resize_needs() {
        let c = claim(json!({
            "metadata": {"namespace": "ns", "name": "c", "uid": "u1", "resourceVersion": "7",
                "annotations": {"volume.kubernetes.io/storage-resizer": "d",
                                "volume.kubernetes.io/node-expansion-not-required": "true"}},
            "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "2Gi"}},
                     "volumeAttributesClassName": "gold"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "allocatedResources": {"storage": "2Gi"},
                       "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                       "conditions": [
                           {"type": "Resizing", "status": "True", "lastTransitionTime": "2026-01-02T03:04:05Z"},
                           {"type": "SomethingElse", "status": "True"}],
                       "currentVolumeAttributesClassName": "silver",
                       "modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "gold"}}
        }));
        assert_eq!(c.key(), "ns/c");
        assert!(c.bound);
        assert_eq!(c.volume_name.as_deref(), Some("pv-1"));
        assert_eq!(c.request.as_ref().unwrap().bytes, 2 << 30);
        assert_eq!(c.capacity.as_ref().unwrap().bytes, 1 << 30);
        assert_eq!(c.allocated.as_ref().unwrap().text.as_str(), "2Gi");
        assert_eq!(
            c.resize_status,
            Some(ResizeStatus::ControllerResizeInProgress)
        );
        assert_eq!(c.conditions.len(), 1, "only the resizer's condition types");
        assert!(c.has_true_condition(RESIZING));
        assert_eq!(c.resizer.as_deref(), Some("d"));
        assert!(c.node_expansion_not_required);
        assert_eq!(c.class.as_deref(), Some("gold"));
        assert_eq!(c.current_class.as_deref(), Some("silver"));
        assert_eq!(c.modify_status.unwrap().target.as_deref(), Some("gold"));
    }

    #[test]
    fn only_this_drivers_volumes_are_projected() {
        let pv = |csi: serde_json::Value| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pv", "annotations": {
                    "volume.kubernetes.io/controller-modify-secret-name": "s",
                    "volume.kubernetes.io/controller-modify-secret-namespace": "ns"}},
                "spec": {"capacity": {"storage": "1Gi"}, "csi": csi, "volumeMode": "Block",
                         "accessModes": ["ReadWriteOnce"],
                         "claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}}
            }))
            .unwrap()
        };
        let ours = pv(json!({"driver": "d", "volumeHandle": "h", "fsType": "ext4",
            "controllerExpandSecretRef": {"name": "e", "namespace": "ns"}}));
        let p = Pv::from_api(&ours, "d").unwrap();
        assert_eq!(p.volume_handle, "h");
        assert!(p.block);
        assert_eq!(p.expand_secret.unwrap().name, "e");
        assert_eq!(p.modify_secret.unwrap().name, "s");
        assert!(!p.in_tree);
        assert!(Pv::from_api(&pv(json!({"driver": "other", "volumeHandle": "h"})), "d").is_none());
    }

    #[test]
    fn in_tree_volumes_of_a_migrated_plugin_are_translated() {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": "1Gi"},
                     "awsElasticBlockStore": {"volumeID": "vol-1", "fsType": "xfs"},
                     "accessModes": ["ReadWriteOnce"]}
        }))
        .unwrap();
        let p = Pv::from_api(&pv, "ebs.csi.aws.com").unwrap();
        assert!(p.in_tree);
        assert_eq!(p.volume_handle, "vol-1");
        assert_eq!(p.fs_type, "xfs");
        assert!(Pv::from_api(&pv, "d").is_none());
    }

    #[test]
    fn pods_keep_only_their_claim_names() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "p"},
            "spec": {"containers": [], "volumes": [
                {"name": "a", "persistentVolumeClaim": {"claimName": "c"}},
                {"name": "b", "emptyDir": {}}]},
            "status": {"phase": "Succeeded"}
        }))
        .unwrap();
        let p = PodClaims::from_api(&pod).unwrap();
        assert_eq!(p.claims, ["c"]);
        assert!(p.terminated);
        let none: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "q"},
            "spec": {"containers": []}
        }))
        .unwrap();
        assert!(PodClaims::from_api(&none).is_none());
    }
}
