//! Views of API objects shared by the controllers of one process: each holds the union of the
//! fields its controllers read (of PersistentVolumes and of PersistentVolumeClaims, in the
//! groups of [`Needs`]), is made once per watch event and
//! is pointed at by every controller's index, which projects its own model out of it when it
//! decides. A process of one controller holds the same view, so there is one code path.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeSpec,
    SecretReference,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::migration;
use crate::pipeline::protobuf::{Decoder, core_v1};
use crate::values::atom::{Atom, List};
use crate::values::version::ResourceVersion;

/// The groups of fields a view holds beyond those every reader needs: each controller declares
/// the groups it reads, and a process keeps the union of its controllers' groups, no more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs(u8);

impl Needs {
    pub const NONE: Self = Self(0);
    /// A PV's `spec.claimRef`.
    pub const CLAIM_REF: Self = Self(1);
    /// A PV's finalizers.
    pub const PV_FINALIZERS: Self = Self(1 << 1);
    /// What a volume capability is made of: a PV's access modes and mount options.
    pub const CAPABILITY: Self = Self(1 << 2);
    /// What publishing a volume reads: a PV's CSI volume attributes and publish Secret.
    pub const PUBLISH: Self = Self(1 << 3);
    /// What expanding and modifying a volume read: a PV's expansion and modification Secrets
    /// and pre-resize capacity, a claim's sizes, conditions and attributes classes.
    pub const EXPANSION: Self = Self(1 << 4);
    /// What provisioning and deleting a volume read: a PV's provisioner and deletion Secret
    /// annotations, the whole spec and annotations of a claim without a volume.
    pub const PROVISIONING: Self = Self(1 << 5);
    /// The annotation naming the CSI driver an in-tree PV was migrated to.
    pub const MIGRATED_TO: Self = Self(1 << 6);
    pub const ALL: Self = Self(0x7f);

    /// These and `other`, in a constant.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    pub fn bits(self) -> u8 {
        self.0
    }

    pub fn from_bits(bits: u8) -> Self {
        Self(bits & Self::ALL.0)
    }

    /// Whether any of `groups` is among these.
    pub fn any(self, groups: Self) -> bool {
        self.0 & groups.0 != 0
    }
}

impl std::ops::BitOr for Needs {
    type Output = Self;

    fn bitor(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// A projection of an API object that the controllers of one process share (see
/// [`Pipeline::watch_view`](crate::pipeline::Pipeline::watch_view)).
pub trait View: Send + Sync + 'static {
    type Object: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;

    /// The view of `object` with the fields `needs` read (others are left empty).
    fn of(object: &Self::Object, needs: Needs) -> Self;

    /// Reads an object of a protobuf list, for a kind kube-apiserver encodes in protobuf; it
    /// must hold every field [`of`](Self::of) reads. Lists of a kind without one are asked
    /// for in JSON.
    const PROTOBUF: Option<Decoder<Self::Object>> = None;
}

/// Annotation naming the provisioner that made a PV.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Annotations naming the Secret for DeleteVolume.
pub const DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
pub const DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// Annotations naming the Secret for ControllerModifyVolume.
pub const MODIFY_SECRET_NAME: &str = "volume.kubernetes.io/controller-modify-secret-name";
pub const MODIFY_SECRET_NAMESPACE: &str = "volume.kubernetes.io/controller-modify-secret-namespace";
/// Annotation the resizer leaves while an expansion of an in-tree volume is rolled back.
pub const PRE_RESIZE_CAPACITY: &str = "volume.alpha.kubernetes.io/pre-resize-capacity";

/// The PV annotations the controllers read, and which read them; the others are not kept.
const PV_ANNOTATIONS: [(&str, Needs); 7] = [
    (PROVISIONED_BY, Needs::PROVISIONING),
    (migration::MIGRATED_TO_ANNOTATION, Needs::MIGRATED_TO),
    (DELETION_SECRET_NAME, Needs::PROVISIONING),
    (DELETION_SECRET_NAMESPACE, Needs::PROVISIONING),
    (MODIFY_SECRET_NAME, Needs::EXPANSION),
    (MODIFY_SECRET_NAMESPACE, Needs::EXPANSION),
    (PRE_RESIZE_CAPACITY, Needs::EXPANSION),
];

/// Whether `key` is among `list`, for one of `needs`.
fn wanted(list: &[(&str, Needs)], key: &str, needs: Needs) -> bool {
    list.iter().any(|(k, by)| *k == key && needs.any(*by))
}

/// Reference to a Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl SecretRef {
    fn from_api(r: &SecretReference) -> Box<Self> {
        Box::new(Self {
            namespace: r.namespace.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
        })
    }
}

/// `spec.claimRef` of a PV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimRef {
    pub namespace: Atom,
    // Boxed strings: a cached view never grows, so the capacity field of a `String` is waste.
    pub name: Box<str>,
    pub uid: Box<str>,
}

/// `spec.csi` of a PV (of its CSI translation, for an in-tree volume).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsiView {
    pub driver: Atom,
    pub volume_handle: Box<str>,
    pub read_only: bool,
    pub fs_type: Atom,
    /// Only with [`Needs::PUBLISH`]. Interned, the whole list: the provisioner writes its identity
    /// into every volume it makes, so most volumes of a driver have the same.
    pub volume_attributes: List<(Atom, Atom)>,
    // Boxed: most volumes have none, and every cached volume would carry the room for them.
    pub publish_secret: Option<Box<SecretRef>>,
    pub expand_secret: Option<Box<SecretRef>>,
}

/// How an in-tree PV translates to CSI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InTree {
    /// The CSI driver that replaces its in-tree plugin.
    pub driver: Atom,
    /// Why the translation failed; the view then has no CSI source.
    pub error: Option<String>,
}

/// A PersistentVolume. The spec of an in-tree volume with a migration path is the translated
/// one, as the replacing CSI driver sees it. Fields that cost memory of their own are left
/// empty unless a controller that reads them runs (the [`Needs`] it was made with).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PvView {
    /// Shared with the keys of the indexes, queues and re-lists that name the PV.
    pub name: Arc<str>,
    pub resource_version: ResourceVersion,
    pub deleting: bool,
    // Interned lists: a cached view never grows, and most views' lists equal many others'.
    pub finalizers: List<Atom>,
    /// `status.phase`.
    pub phase: Atom,
    pub reclaim_policy: Atom,
    pub storage_class: Atom,
    pub attributes_class: Option<Atom>,
    /// `spec.capacity.storage` as written.
    pub capacity: Option<Atom>,
    pub claim_ref: Option<Box<ClaimRef>>,
    /// `spec.volumeMode` as written.
    pub volume_mode: Option<Atom>,
    pub access_modes: List<Atom>,
    pub mount_options: List<Atom>,
    pub csi: Option<CsiView>,
    // Boxed, as most volumes are not in-tree ones.
    pub in_tree: Option<Box<InTree>>,
    /// The annotations of [`PV_ANNOTATIONS`] the PV has.
    annotations: List<(Atom, Atom)>,
}

impl PvView {
    pub fn from_api(pv: &PersistentVolume, needs: Needs) -> Self {
        let meta = &pv.metadata;
        let spec = pv.spec.as_ref();
        let plugin = spec.and_then(migration::in_tree_plugin);
        let (translated, in_tree) = match plugin {
            None => (None, None),
            Some(plugin) => {
                let (translated, error) = match migration::translate_in_tree_pv(pv) {
                    Ok(translated) => (translated, None),
                    Err(err) => (None, Some(err.to_string())),
                };
                let driver = Atom::new(plugin.csi_driver);
                (translated, Some(Box::new(InTree { driver, error })))
            }
        };
        // What the driver sees: the translation of an in-tree volume, else the PV itself.
        let seen: Option<&PersistentVolumeSpec> =
            translated.as_ref().and_then(|t| t.spec.as_ref()).or(spec);
        let annotations = meta
            .annotations
            .iter()
            .flatten()
            .filter(|(key, _)| wanted(&PV_ANNOTATIONS, key, needs))
            .map(|(key, value)| (Atom::new(key), Atom::new(value)))
            .collect();
        Self {
            name: meta.name.as_deref().unwrap_or_default().into(),
            resource_version: ResourceVersion::new(meta.resource_version.as_deref()),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: match needs.any(Needs::PV_FINALIZERS) {
                true => meta.finalizers.iter().flatten().map(Atom::from).collect(),
                false => List::default(),
            },
            phase: Atom::from(
                pv.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or_default(),
            ),
            reclaim_policy: Atom::from(
                spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref())
                    .unwrap_or_default(),
            ),
            storage_class: Atom::from(
                spec.and_then(|s| s.storage_class_name.as_deref())
                    .unwrap_or_default(),
            ),
            attributes_class: spec
                .and_then(|s| s.volume_attributes_class_name.as_deref())
                .filter(|c| !c.is_empty())
                .map(Atom::new),
            capacity: spec
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .map(|q| Atom::new(&q.0)),
            claim_ref: spec
                .and_then(|s| s.claim_ref.as_ref())
                .filter(|_| needs.any(Needs::CLAIM_REF))
                .map(|r| {
                    Box::new(ClaimRef {
                        namespace: Atom::from(r.namespace.as_deref().unwrap_or_default()),
                        name: r.name.as_deref().unwrap_or_default().into(),
                        uid: r.uid.as_deref().unwrap_or_default().into(),
                    })
                }),
            volume_mode: spec.and_then(|s| s.volume_mode.as_deref()).map(Atom::from),
            access_modes: seen
                .iter()
                .filter(|_| needs.any(Needs::CAPABILITY))
                .flat_map(|s| s.access_modes.iter().flatten())
                .map(Atom::from)
                .collect(),
            mount_options: spec
                .filter(|_| needs.any(Needs::CAPABILITY))
                .into_iter()
                .flat_map(|s| s.mount_options.iter().flatten())
                .map(Atom::from)
                .collect(),
            csi: seen.and_then(|s| s.csi.as_ref()).map(|csi| CsiView {
                driver: Atom::new(&csi.driver),
                volume_handle: csi.volume_handle.as_str().into(),
                read_only: csi.read_only.unwrap_or(false),
                fs_type: Atom::new(csi.fs_type.as_deref().unwrap_or_default()),
                volume_attributes: csi
                    .volume_attributes
                    .iter()
                    .flatten()
                    .filter(|_| needs.any(Needs::PUBLISH))
                    .map(|(key, value)| (Atom::new(key), Atom::new(value)))
                    .collect(),
                publish_secret: csi
                    .controller_publish_secret_ref
                    .as_ref()
                    .filter(|_| needs.any(Needs::PUBLISH))
                    .map(SecretRef::from_api),
                expand_secret: csi
                    .controller_expand_secret_ref
                    .as_ref()
                    .filter(|_| needs.any(Needs::EXPANSION))
                    .map(SecretRef::from_api),
            }),
            in_tree,
            annotations,
        }
    }

    /// The value of annotation `key`, one of those a view keeps.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        debug_assert!(
            PV_ANNOTATIONS.iter().any(|(k, _)| *k == key),
            "{key} is not kept"
        );
        self.annotations
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, v)| v.as_str())
    }

    /// The Secret named by a pair of name and namespace annotations, when both are there.
    pub fn secret_annotations(&self, name: &str, namespace: &str) -> Option<SecretRef> {
        Some(SecretRef {
            name: self.annotation(name)?.to_string(),
            namespace: self.annotation(namespace)?.to_string(),
        })
    }

    /// The CSI driver that serves the volume, natively or through its translation; empty for an
    /// in-tree volume without one.
    pub fn driver(&self) -> &str {
        self.csi.as_ref().map_or("", |c| c.driver.as_str())
    }

    pub fn volume_handle(&self) -> &str {
        self.csi.as_ref().map_or("", |c| &*c.volume_handle)
    }
}

impl View for PvView {
    type Object = PersistentVolume;

    fn of(object: &PersistentVolume, needs: Needs) -> Self {
        Self::from_api(object, needs)
    }

    const PROTOBUF: Option<Decoder<PersistentVolume>> = Some(core_v1::persistent_volume);
}

/// Annotation naming the resizer a claim's expansion is for.
pub const STORAGE_RESIZER: &str = "volume.kubernetes.io/storage-resizer";
/// Annotation the resizer sets when the node has nothing to do after an expansion.
pub const NODE_EXPANSION_NOT_REQUIRED: &str = "volume.kubernetes.io/node-expansion-not-required";
/// The finalizer the provisioner puts on claims being cloned.
pub const CLONE_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
/// The annotation `kubectl apply` writes: the whole object again, read by no controller.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The annotations and finalizers of a bound claim that any controller reads.
const CLAIM_ANNOTATIONS: [&str; 2] = [STORAGE_RESIZER, NODE_EXPANSION_NOT_REQUIRED];
const CLAIM_FINALIZERS: [&str; 1] = [CLONE_FINALIZER];

/// A claim condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimCondition {
    pub type_: Atom,
    pub status: Atom,
    pub reason: String,
    pub message: String,
    /// RFC 3339, as stored.
    pub last_transition_time: String,
}

/// `status.modifyVolumeStatus`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModifyStatus {
    /// `Pending`, `InProgress` or `Infeasible`.
    pub status: Atom,
    pub target: Option<Atom>,
}

/// What provisioning reads of a claim without a volume: most claims are bound, and keep none
/// of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Unbound {
    pub spec: PersistentVolumeClaimSpec,
    /// All the annotations, but `kubectl apply`'s copy of the object.
    pub annotations: BTreeMap<String, String>,
}

/// What expanding and modifying a volume read of its claim ([`Needs::EXPANSION`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResizeFields {
    /// `status.capacity.storage`.
    pub capacity: Option<Atom>,
    /// `status.allocatedResources.storage`.
    pub allocated: Option<Atom>,
    /// `status.allocatedResourceStatuses.storage`.
    pub resize_status: Option<Atom>,
    pub conditions: Vec<ClaimCondition>,
    pub attributes_class: Option<Atom>,
    pub current_attributes_class: Option<Atom>,
    pub modify_status: Option<ModifyStatus>,
    /// The annotations of [`CLAIM_ANNOTATIONS`] the claim has.
    annotations: Vec<(Atom, Atom)>,
}

impl ResizeFields {
    fn from_api(pvc: &PersistentVolumeClaim) -> Self {
        let meta = &pvc.metadata;
        let status = pvc.status.as_ref();
        let class_name = |name: Option<&str>| name.filter(|c| !c.is_empty()).map(Atom::new);
        Self {
            capacity: storage(status.and_then(|s| s.capacity.as_ref())),
            allocated: storage(status.and_then(|s| s.allocated_resources.as_ref())),
            resize_status: status
                .and_then(|s| s.allocated_resource_statuses.as_ref())
                .and_then(|m| m.get("storage"))
                .map(|s| Atom::new(s)),
            conditions: status
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .map(|c| ClaimCondition {
                    type_: Atom::new(&c.type_),
                    status: Atom::new(&c.status),
                    reason: c.reason.clone().unwrap_or_default(),
                    message: c.message.clone().unwrap_or_default(),
                    last_transition_time: c
                        .last_transition_time
                        .as_ref()
                        .map(|t| t.0.to_string())
                        .unwrap_or_default(),
                })
                .collect(),
            attributes_class: class_name(
                pvc.spec
                    .as_ref()
                    .and_then(|s| s.volume_attributes_class_name.as_deref()),
            ),
            current_attributes_class: class_name(
                status.and_then(|s| s.current_volume_attributes_class_name.as_deref()),
            ),
            modify_status: status
                .and_then(|s| s.modify_volume_status.as_ref())
                .map(|m| ModifyStatus {
                    status: Atom::new(&m.status),
                    target: class_name(m.target_volume_attributes_class_name.as_deref()),
                }),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(key, _)| CLAIM_ANNOTATIONS.contains(&key.as_str()))
                .map(|(key, value)| (Atom::new(key), Atom::new(value)))
                .collect(),
        }
    }

    /// The fields of a claim whose status holds nothing expansion reads but a capacity
    /// written as `request` is.
    fn at_request(request: &Option<Atom>) -> Self {
        Self {
            capacity: request.clone(),
            ..Self::default()
        }
    }

    /// The value of annotation `key`, one of those kept.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        debug_assert!(CLAIM_ANNOTATIONS.contains(&key), "{key} is not kept");
        self.annotations
            .iter()
            .find(|(k, _)| k.as_str() == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The `storage` entry of a resource list, as written.
fn storage(map: Option<&BTreeMap<String, Quantity>>) -> Option<Atom> {
    map.and_then(|m| m.get("storage")).map(|q| Atom::new(&q.0))
}

/// A PersistentVolumeClaim. The groups of fields not every controller reads are boxed apart,
/// present only when made with their [`Needs`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimView {
    pub namespace: Atom,
    /// `namespace/name`: the claim's key in the caches and queues that name it so, which
    /// share it.
    pub key: Arc<str>,
    /// Shared with the keys of the indexes, queues and re-lists that name the claim by UID.
    pub uid: Arc<str>,
    pub resource_version: ResourceVersion,
    pub deleting: bool,
    /// The finalizers of [`CLAIM_FINALIZERS`] the claim has.
    pub finalizers: List<Atom>,
    /// `status.phase`.
    pub phase: Atom,
    /// Empty while unbound.
    pub volume_name: Box<str>,
    pub storage_class: Option<Atom>,
    /// `spec.resources.requests.storage`, as written.
    pub request: Option<Atom>,
    /// The expansion fields (see [`ClaimView::resize`]): absent when made without them, and
    /// when all a claim holds of them is a capacity as written in its request, as most bound
    /// claims do, which saves them a box of their own.
    resize: Option<Box<ResizeFields>>,
    /// Made with [`Needs::EXPANSION`]: an absent `resize` then stands for the capacity at the
    /// request.
    with_resize: bool,
    /// With [`Needs::PROVISIONING`], while the claim has no volume.
    pub unbound: Option<Box<Unbound>>,
}

impl ClaimView {
    pub fn from_api(pvc: &PersistentVolumeClaim, needs: Needs) -> Self {
        let meta = &pvc.metadata;
        let spec = pvc.spec.as_ref();
        let volume_name: Box<str> = spec
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or_default()
            .into();
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let request = storage(
            spec.and_then(|s| s.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        );
        let unbound = (volume_name.is_empty() && needs.any(Needs::PROVISIONING)).then(|| {
            let mut annotations = meta.annotations.clone().unwrap_or_default();
            annotations.remove(LAST_APPLIED);
            Box::new(Unbound {
                spec: spec.cloned().unwrap_or_default(),
                annotations,
            })
        });
        Self {
            namespace: Atom::new(namespace),
            key: format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default()).into(),
            uid: meta.uid.as_deref().unwrap_or_default().into(),
            resource_version: ResourceVersion::new(meta.resource_version.as_deref()),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta
                .finalizers
                .iter()
                .flatten()
                .filter(|f| CLAIM_FINALIZERS.contains(&f.as_str()))
                .map(Atom::from)
                .collect(),
            phase: Atom::new(
                pvc.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or_default(),
            ),
            volume_name,
            storage_class: spec
                .and_then(|s| s.storage_class_name.as_deref())
                .map(Atom::from),
            resize: needs
                .any(Needs::EXPANSION)
                .then(|| ResizeFields::from_api(pvc))
                .filter(|fields| *fields != ResizeFields::at_request(&request))
                .map(Box::new),
            with_resize: needs.any(Needs::EXPANSION),
            request,
            unbound,
        }
    }

    /// The expansion fields of the claim; `None` when the view was made without them.
    pub fn resize(&self) -> Option<Cow<'_, ResizeFields>> {
        match (&self.resize, self.with_resize) {
            (Some(fields), _) => Some(Cow::Borrowed(fields)),
            (None, true) => Some(Cow::Owned(ResizeFields::at_request(&self.request))),
            (None, false) => None,
        }
    }

    pub fn name(&self) -> &str {
        let namespace = self.namespace.len();
        self.key.get(namespace + 1..).unwrap_or_default()
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        debug_assert!(
            CLAIM_FINALIZERS.contains(&finalizer),
            "{finalizer} is not kept"
        );
        self.finalizers.iter().any(|f| f == finalizer)
    }
}

impl View for ClaimView {
    type Object = PersistentVolumeClaim;

    fn of(object: &PersistentVolumeClaim, needs: Needs) -> Self {
        Self::from_api(object, needs)
    }

    const PROTOBUF: Option<Decoder<PersistentVolumeClaim>> = Some(core_v1::persistent_volume_claim);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The groups a controller that provisions reads, and those of one that attaches and one
    /// that expands.
    const PROVISIONING: Needs = Needs::CLAIM_REF
        .union(Needs::PV_FINALIZERS)
        .union(Needs::PROVISIONING)
        .union(Needs::MIGRATED_TO);
    const ATTACHING: Needs = Needs::PV_FINALIZERS
        .union(Needs::CAPABILITY)
        .union(Needs::PUBLISH)
        .union(Needs::MIGRATED_TO);
    const EXPANDING: Needs = Needs::CLAIM_REF
        .union(Needs::CAPABILITY)
        .union(Needs::EXPANSION);

    fn pv(value: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(value).expect("a PV")
    }

    #[test]
    fn keeps_the_fields_and_annotations_controllers_read() {
        let view = PvView::from_api(
            &pv(json!({
                "metadata": {"name": "pv-1", "resourceVersion": "9", "finalizers": ["f"],
                             "annotations": {PROVISIONED_BY: "d", "unrelated": "x",
                                             DELETION_SECRET_NAME: "s",
                                             DELETION_SECRET_NAMESPACE: "ns"}},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "c",
                         "claimRef": {"namespace": "default", "name": "c-1", "uid": "u"},
                         "csi": {"driver": "d", "volumeHandle": "h", "fsType": "ext4",
                                 "controllerExpandSecretRef": {"name": "e", "namespace": "ens"}}},
                "status": {"phase": "Bound"},
            })),
            Needs::ALL,
        );
        assert_eq!(&*view.name, "pv-1");
        assert_eq!(view.driver(), "d");
        assert_eq!(view.volume_handle(), "h");
        assert_eq!(view.capacity.as_deref(), Some("1Gi"));
        assert_eq!(view.phase, "Bound");
        assert_eq!(view.claim_ref.as_ref().map(|r| &*r.uid), Some("u"));
        assert_eq!(view.annotation(PROVISIONED_BY), Some("d"));
        assert_eq!(
            view.annotations.len(),
            3,
            "the unrelated annotation is not kept"
        );
        assert_eq!(
            view.secret_annotations(DELETION_SECRET_NAME, DELETION_SECRET_NAMESPACE),
            Some(SecretRef {
                namespace: "ns".into(),
                name: "s".into()
            })
        );
        let csi = view.csi.as_ref().expect("a CSI source");
        assert_eq!(
            csi.expand_secret.as_ref().map(|s| s.name.as_str()),
            Some("e")
        );
        assert!(view.in_tree.is_none());
        assert!(!view.access_modes.is_empty());
    }

    #[test]
    fn a_view_keeps_only_what_its_controllers_read() {
        let pv = pv(json!({
            "metadata": {"name": "pv-1",
                         "annotations": {PROVISIONED_BY: "d", PRE_RESIZE_CAPACITY: "1Gi"}},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "claimRef": {"namespace": "default", "name": "c-1", "uid": "u"},
                     "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"a": "b"}}},
        }));
        let attacher = PvView::from_api(&pv, ATTACHING);
        assert!(attacher.claim_ref.is_none() && attacher.annotations.is_empty());
        let attributes = |v: &PvView| v.csi.as_ref().map(|c| c.volume_attributes.clone());
        assert_eq!(
            attributes(&attacher).as_deref(),
            Some(&[(Atom::new("a"), Atom::new("b"))][..])
        );
        let provisioner = PvView::from_api(&pv, PROVISIONING);
        assert!(provisioner.access_modes.is_empty());
        assert_eq!(attributes(&provisioner).as_deref(), Some(&[][..]));
        assert_eq!(provisioner.annotation(PROVISIONED_BY), Some("d"));
        assert_eq!(provisioner.annotations.len(), 1);
        let both = PvView::from_api(&pv, PROVISIONING | EXPANDING);
        assert_eq!(both.annotations.len(), 2);
        assert!(both.claim_ref.is_some());
        assert_eq!(provisioner.volume_handle(), both.volume_handle());
    }

    #[test]
    fn an_in_tree_volume_is_seen_through_its_translation() {
        let view = PvView::from_api(
            &pv(json!({
                "metadata": {"name": "pv-1", "labels": {
                    "topology.kubernetes.io/zone": "z1"}},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "gcePersistentDisk": {"pdName": "disk"}},
            })),
            Needs::ALL,
        );
        let in_tree = view.in_tree.as_ref().expect("in-tree");
        assert_eq!(in_tree.driver, "pd.csi.storage.gke.io");
        assert_eq!(in_tree.error, None);
        assert_eq!(view.driver(), "pd.csi.storage.gke.io");
        assert!(view.volume_handle().ends_with("/disks/disk"));
    }

    #[test]
    fn a_bound_claim_keeps_no_spec_and_only_the_annotations_read() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "c", "uid": "u", "resourceVersion": "3",
                         "finalizers": ["kubernetes.io/pvc-protection", CLONE_FINALIZER],
                         "annotations": {STORAGE_RESIZER: "d", "pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "conditions": [{"type": "Resizing", "status": "True"}]},
        }))
        .expect("a claim");
        let view = ClaimView::from_api(&pvc, Needs::ALL);
        assert_eq!((&*view.key, view.name(), &*view.uid), ("ns/c", "c", "u"));
        assert!(view.unbound.is_none());
        assert_eq!(&*view.finalizers, [CLONE_FINALIZER]);
        assert!(view.has_finalizer(CLONE_FINALIZER));
        assert_eq!(view.request.as_deref(), Some("2Gi"));
        let resize = view.resize().expect("the resizer's fields");
        assert_eq!(resize.annotation(STORAGE_RESIZER), Some("d"));
        assert_eq!(resize.annotations.len(), 1);
        assert_eq!(resize.capacity.as_deref(), Some("1Gi"));
        assert_eq!(resize.conditions[0].type_, "Resizing");
        let provisioner = ClaimView::from_api(&pvc, PROVISIONING);
        assert!(
            provisioner.resize().is_none(),
            "no resizer, no resizer fields"
        );
        assert_eq!(provisioner.request, view.request);
    }

    #[test]
    fn a_claim_at_its_requested_capacity_keeps_no_resizer_fields_of_its_own() {
        let claim = |capacity: &str| -> PersistentVolumeClaim {
            serde_json::from_value(json!({
                "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
                "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": "Bound", "capacity": {"storage": capacity},
                           "accessModes": ["ReadWriteOnce"]},
            }))
            .expect("a claim")
        };
        let at_request = ClaimView::from_api(&claim("1Gi"), Needs::ALL);
        assert!(at_request.resize.is_none(), "nothing boxed");
        let fields = at_request.resize().expect("the resizer's fields");
        assert_eq!(*fields, ResizeFields::at_request(&Some(Atom::new("1Gi"))));
        assert_eq!(fields.capacity.as_deref(), Some("1Gi"));
        // Written otherwise: the same size to a resizer's parser, but kept as written.
        let written_otherwise = ClaimView::from_api(&claim("1073741824"), Needs::ALL);
        let fields = written_otherwise.resize().expect("the resizer's fields");
        assert!(matches!(fields, Cow::Borrowed(_)), "boxed");
        assert_eq!(fields.capacity.as_deref(), Some("1073741824"));
        assert!(
            ClaimView::from_api(&claim("1Gi"), PROVISIONING)
                .resize()
                .is_none()
        );
    }

    #[test]
    fn an_unbound_claim_keeps_its_spec_and_annotations() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "c",
                         "annotations": {"a": "1", LAST_APPLIED: "{}"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "sc"},
        }))
        .expect("a claim");
        let view = ClaimView::from_api(&pvc, Needs::ALL);
        let unbound = view.unbound.as_ref().expect("unbound");
        assert_eq!(unbound.annotations.len(), 1, "last-applied is dropped");
        assert_eq!(unbound.spec.storage_class_name.as_deref(), Some("sc"));
        let resizer = ClaimView::from_api(&pvc, EXPANDING);
        assert!(resizer.unbound.is_none(), "no provisioner, no spec kept");
    }
}
