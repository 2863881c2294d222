//! The fields of VolumeAttachments, PersistentVolumes and CSINodes the attacher decides from,
//! projected out of the API objects so that the cache holds only these.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use sidecar_kit::migration;
use sidecar_kit::pipeline::views::{Needs, PvView};
use sidecar_kit::values::atom::{Atom, List};

/// What this controller reads of the process's shared views.
pub const NEEDS: Needs = Needs::PV_FINALIZERS
    .union(Needs::CAPABILITY)
    .union(Needs::PUBLISH)
    .union(Needs::MIGRATED_TO);

/// Annotation on the VolumeAttachment that remembers the node ID, for detaching after the
/// node's CSINode is gone.
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// The finalizer the attacher puts on VolumeAttachments and PersistentVolumes.
pub fn finalizer_name(driver: &str) -> String {
    format!(
        "external-attacher/{}",
        sidecar_kit::cluster::leader::sanitize_name(driver)
    )
}

/// The leader election lock name, as upstream's: its Lease's name before sanitizing, and what
/// its Events name.
pub fn lock_name(driver: &str) -> String {
    format!("external-attacher-leader-{driver}")
}

/// The leader election Lease name, as upstream names it.
pub fn lease_name(driver: &str) -> String {
    sidecar_kit::cluster::leader::sanitize_name(&lock_name(driver))
}

pub use sidecar_kit::pipeline::views::SecretRef;

/// `spec.csi` of a PersistentVolume (or of an inline volume spec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsiSource {
    pub driver: Atom,
    pub volume_handle: String,
    pub read_only: bool,
    pub fs_type: Atom,
    pub volume_attributes: BTreeMap<String, String>,
    // Boxed: most volumes have none, and every cached volume would carry the room for one.
    pub publish_secret: Option<Box<SecretRef>>,
}

/// The parts of a PersistentVolumeSpec that shape a ControllerPublishVolume call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeSpec {
    pub csi: Option<CsiSource>,
    pub access_modes: Vec<Atom>,
    pub block: bool,
    pub mount_options: Vec<String>,
}

/// A PersistentVolume. The spec of an in-tree volume with a migration path is the translated
/// one, as the replacing CSI driver sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pv {
    pub name: String,
    pub resource_version: String,
    pub deleting: bool,
    pub finalizers: List<Atom>,
    /// Annotation `pv.kubernetes.io/migrated-to`: the driver the PV controller migrated it to.
    pub migrated_to: Option<Atom>,
    pub spec: VolumeSpec,
    /// Set for in-tree volumes (CSI migration); boxed, as most volumes are not.
    pub in_tree: Option<Box<InTree>>,
}

/// How an in-tree PersistentVolume translates to CSI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InTree {
    /// The CSI driver that replaces its in-tree plugin.
    pub driver: String,
    /// Why the translation failed; the spec then has no CSI source.
    pub error: Option<String>,
}

/// What a VolumeAttachment attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VaSource {
    Pv(String),
    Inline(Box<VolumeSpec>),
    /// Both a PV name and an inline spec: invalid.
    Both,
    /// Neither: invalid.
    Neither,
}

/// A VolumeAttachment of this driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Va {
    /// Shared with the keys of the index's maps.
    pub name: Arc<str>,
    pub uid: String,
    pub resource_version: String,
    pub deleting: bool,
    pub finalizers: List<Atom>,
    pub node_id_annotation: Option<String>,
    pub attacher: Atom,
    pub node_name: Atom,
    pub source: VaSource,
    pub attached: bool,
    pub attachment_metadata: BTreeMap<String, String>,
    pub attach_error: bool,
    pub detach_error: bool,
}

impl Va {
    pub fn from_api(va: &VolumeAttachment) -> Self {
        let meta = &va.metadata;
        let source = &va.spec.source;
        let source = match (&source.persistent_volume_name, &source.inline_volume_spec) {
            (Some(_), Some(_)) => VaSource::Both,
            (Some(pv), None) => VaSource::Pv(pv.clone()),
            (None, Some(spec)) => VaSource::Inline(Box::new(VolumeSpec::from_api(spec))),
            (None, None) => VaSource::Neither,
        };
        let status = va.status.as_ref();
        Self {
            name: meta.name.as_deref().unwrap_or_default().into(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.iter().flatten().map(Atom::from).collect(),
            node_id_annotation: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_ID_ANNOTATION).cloned()),
            attacher: Atom::new(&va.spec.attacher),
            node_name: Atom::new(&va.spec.node_name),
            source,
            attached: status.is_some_and(|s| s.attached),
            attachment_metadata: status
                .and_then(|s| s.attachment_metadata.clone())
                .unwrap_or_default(),
            attach_error: status.is_some_and(|s| s.attach_error.is_some()),
            detach_error: status.is_some_and(|s| s.detach_error.is_some()),
        }
    }

    /// The PV this attachment names, if it names one.
    pub fn pv_name(&self) -> Option<&str> {
        match &self.source {
            VaSource::Pv(name) => Some(name),
            _ => None,
        }
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Equal apart from the resourceVersion and the error flags: upstream ignores updates that
    /// only record errors, so that its own error writes do not cut the retry backoff short.
    pub fn same_except_errors(&self, other: &Va) -> bool {
        let mask = |va: &Va| Va {
            resource_version: String::new(),
            attach_error: false,
            detach_error: false,
            ..va.clone()
        };
        mask(self) == mask(other)
    }

    /// Whether `newer` differs from this only by what the attacher itself writes before each
    /// attach: our finalizer and the node-id annotation added (besides the error flags). Its
    /// watch event may arrive before the write's answer is stored, and must not start another
    /// attempt ahead of the backoff either. A removal of either is a change.
    pub fn same_but_our_additions(&self, newer: &Va, finalizer: &str) -> bool {
        let mut masked = newer.clone();
        let ours = |va: &Va| va.finalizers.iter().any(|f| f == finalizer);
        if ours(newer) && !ours(self) {
            masked.finalizers = newer
                .finalizers
                .iter()
                .filter(|f| *f != finalizer)
                .cloned()
                .collect();
        }
        if self.node_id_annotation.is_none() {
            masked.node_id_annotation = None;
        }
        self.same_except_errors(&masked)
    }

    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(self.name.to_string()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: Some(self.resource_version.clone()).filter(|r| !r.is_empty()),
            ..Default::default()
        }
    }
}

impl CsiSource {
    fn from_api(csi: &CSIPersistentVolumeSource) -> Self {
        Self {
            driver: Atom::new(&csi.driver),
            volume_handle: csi.volume_handle.clone(),
            read_only: csi.read_only.unwrap_or(false),
            fs_type: Atom::new(csi.fs_type.as_deref().unwrap_or_default()),
            volume_attributes: csi.volume_attributes.clone().unwrap_or_default(),
            publish_secret: csi.controller_publish_secret_ref.as_ref().map(|r| {
                Box::new(SecretRef {
                    namespace: r.namespace.clone().unwrap_or_default(),
                    name: r.name.clone().unwrap_or_default(),
                })
            }),
        }
    }
}

impl VolumeSpec {
    pub fn from_api(spec: &PersistentVolumeSpec) -> Self {
        Self {
            csi: spec.csi.as_ref().map(CsiSource::from_api),
            access_modes: spec.access_modes.iter().flatten().map(Atom::from).collect(),
            block: spec.volume_mode.as_deref() == Some("Block"),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
        }
    }
}

impl Pv {
    pub fn from_api(pv: &PersistentVolume) -> Self {
        Self::from_view(&PvView::from_api(pv, NEEDS))
    }

    /// The attacher's projection of the process's shared view of a PV.
    pub fn from_view(view: &PvView) -> Self {
        let csi = view.csi.as_ref().map(|csi| CsiSource {
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.to_string(),
            read_only: csi.read_only,
            fs_type: csi.fs_type.clone(),
            volume_attributes: csi
                .volume_attributes
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
            publish_secret: csi.publish_secret.clone(),
        });
        Self {
            name: view.name.to_string(),
            resource_version: view.resource_version.to_string(),
            deleting: view.deleting,
            finalizers: view.finalizers.clone(),
            migrated_to: view
                .annotation(migration::MIGRATED_TO_ANNOTATION)
                .map(Atom::new),
            spec: VolumeSpec {
                csi,
                access_modes: view.access_modes.to_vec(),
                block: view.volume_mode.as_deref() == Some("Block"),
                mount_options: view.mount_options.iter().map(Atom::to_string).collect(),
            },
            in_tree: view.in_tree.as_ref().map(|t| {
                Box::new(InTree {
                    driver: t.driver.to_string(),
                    error: t.error.clone(),
                })
            }),
        }
    }

    /// An in-tree volume no longer (or not yet) migrated to `driver`: CSI migration of its
    /// plugin is off, so our finalizer must not hold it.
    pub fn migration_rolled_back(&self, driver: &str) -> bool {
        self.in_tree.is_some() && self.migrated_to.as_deref() != Some(driver)
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Whether the cache needs this PV: a CSI volume of the driver (translated from an in-tree
    /// one or not), or one carrying its finalizer.
    pub fn concerns(&self, driver: &str, finalizer: &str) -> bool {
        self.spec.csi.as_ref().is_some_and(|c| c.driver == driver)
            || self.in_tree.as_ref().is_some_and(|t| t.driver == driver)
            || self.has_finalizer(finalizer)
    }
}

/// The node ID `driver` registered in this CSINode, if it registered.
pub fn csinode_node_id(node: &CSINode, driver: &str) -> Option<String> {
    node.spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.node_id.clone())
}

/// Compares two resourceVersions; `None` when they are not both numbers (they are opaque to
/// clients, but every real API server uses etcd's increasing revision).
pub fn newer(candidate: &str, current: &str) -> Option<bool> {
    let candidate: u64 = candidate.parse().ok()?;
    let current: u64 = current.parse().ok()?;
    Some(candidate > current)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn va_json(extra: serde_json::Value) -> VolumeAttachment {
        let mut base = json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttachment",
            "metadata": {"name": "va-1", "uid": "u1", "resourceVersion": "7"},
            "spec": {"attacher": "hostpath.csi.k8s.io", "nodeName": "node-1",
                     "source": {"persistentVolumeName": "pv-1"}},
        });
        merge(&mut base, &extra);
        serde_json::from_value(base).unwrap()
    }

    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    #[test]
    fn names_match_upstream() {
        assert_eq!(
            finalizer_name("hostpath.csi.k8s.io"),
            "external-attacher/hostpath-csi-k8s-io"
        );
        assert_eq!(finalizer_name("drv_"), "external-attacher/drv-X");
        assert_eq!(
            lease_name("hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath-csi-k8s-io"
        );
        assert_eq!(
            lock_name("hostpath.csi.k8s.io"),
            "external-attacher-leader-hostpath.csi.k8s.io"
        );
    }

    #[test]
    fn va_projection() {
        let va = Va::from_api(&va_json(json!({
            "metadata": {"finalizers": ["a"], "deletionTimestamp": "2024-01-01T00:00:00Z",
                         "annotations": {NODE_ID_ANNOTATION: "n-1", "other": "x"}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"},
                       "attachError": {"message": "m"}},
        })));
        assert_eq!(&*va.name, "va-1");
        assert!(va.deleting);
        assert_eq!(&va.finalizers[..], [Atom::new("a")]);
        assert_eq!(va.node_id_annotation.as_deref(), Some("n-1"));
        assert_eq!(va.source, VaSource::Pv("pv-1".into()));
        assert!(va.attached && va.attach_error && !va.detach_error);
        assert_eq!(va.attachment_metadata["k"], "v");

        let both = Va::from_api(&va_json(
            json!({"spec": {"source": {"inlineVolumeSpec": {"csi": {"driver": "d", "volumeHandle": "h"}}}}}),
        ));
        assert_eq!(both.source, VaSource::Both);
    }

    #[test]
    fn error_only_changes_are_recognised() {
        let a = Va::from_api(&va_json(json!({})));
        let b = Va::from_api(&va_json(json!({"metadata": {"resourceVersion": "8"},
            "status": {"attached": false, "attachError": {"message": "m"}}})));
        assert!(a.same_except_errors(&b));
        let c = Va::from_api(&va_json(json!({"metadata": {"resourceVersion": "9"},
            "status": {"attached": true}})));
        assert!(!a.same_except_errors(&c));
    }

    #[test]
    fn our_own_additions_are_recognised() {
        let fin = "external-attacher/d";
        let a = Va::from_api(&va_json(json!({"metadata": {"finalizers": ["other"]}})));
        let ours = Va::from_api(&va_json(json!({"metadata": {"resourceVersion": "8",
            "finalizers": ["other", fin],
            "annotations": {"csi.alpha.kubernetes.io/node-id": "n1"}}})));
        assert!(a.same_but_our_additions(&ours, fin));
        // Our finalizer or the annotation taken away, or anything else, is a change.
        assert!(!ours.same_but_our_additions(&a, fin));
        let theirs = Va::from_api(&va_json(json!({"metadata": {"resourceVersion": "9",
            "finalizers": ["other", "example.com/x"]}})));
        assert!(!a.same_but_our_additions(&theirs, fin));
    }

    #[test]
    fn pv_projection_and_relevance() {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "resourceVersion": "3", "finalizers": ["kubernetes.io/pv-protection"]},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block", "mountOptions": ["ro"],
                     "csi": {"driver": "d", "volumeHandle": "h", "readOnly": true, "fsType": "ext4",
                             "volumeAttributes": {"a": "b"},
                             "controllerPublishSecretRef": {"name": "s", "namespace": "ns"}}},
        }))
        .unwrap();
        let pv = Pv::from_api(&pv);
        assert!(pv.spec.block);
        let csi = pv.spec.csi.as_ref().unwrap();
        assert_eq!(
            csi.publish_secret.as_deref(),
            Some(&SecretRef {
                namespace: "ns".into(),
                name: "s".into()
            })
        );
        assert!(csi.read_only);
        assert!(pv.concerns("d", "external-attacher/x"));
        assert!(!pv.concerns("other", "external-attacher/x"));
        assert!(pv.concerns("other", "kubernetes.io/pv-protection"));
    }

    #[test]
    fn in_tree_pvs_are_projected_translated() {
        let gce: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-gce", "labels": {"topology.kubernetes.io/zone": "europe-west1-b"},
                         "annotations": {"pv.kubernetes.io/migrated-to": "pd.csi.storage.gke.io"}},
            "spec": {"accessModes": ["ReadWriteMany"], "gcePersistentDisk": {"pdName": "d", "fsType": "ext4"}},
        }))
        .unwrap();
        let pv = Pv::from_api(&gce);
        let csi = pv.spec.csi.as_ref().unwrap();
        assert_eq!(csi.driver, "pd.csi.storage.gke.io");
        assert_eq!(
            csi.volume_handle,
            "projects/UNSPECIFIED/zones/europe-west1-b/disks/d"
        );
        assert_eq!(csi.fs_type, "ext4");
        assert_eq!(pv.spec.access_modes, ["ReadWriteOnce"]);
        assert_eq!(
            pv.in_tree.as_deref(),
            Some(&InTree {
                driver: "pd.csi.storage.gke.io".into(),
                error: None
            })
        );
        assert!(pv.concerns("pd.csi.storage.gke.io", "f"));
        assert!(!pv.migration_rolled_back("pd.csi.storage.gke.io"));
        assert!(pv.migration_rolled_back("other.example.com"));

        let broken: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-ebs"},
            "spec": {"awsElasticBlockStore": {"volumeID": "aws://z/disk"}},
        }))
        .unwrap();
        let pv = Pv::from_api(&broken);
        assert_eq!(pv.spec.csi, None);
        let in_tree = pv.in_tree.as_ref().unwrap();
        assert_eq!(in_tree.driver, "ebs.csi.aws.com");
        assert!(in_tree.error.as_deref().unwrap().contains("Invalid format"));
        assert!(pv.concerns("ebs.csi.aws.com", "f"));
        assert!(pv.migration_rolled_back("ebs.csi.aws.com"), "no annotation");

        let csi = Pv::from_api(
            &serde_json::from_value(json!({
                "metadata": {"name": "pv-csi"},
                "spec": {"csi": {"driver": "d", "volumeHandle": "h"}},
            }))
            .unwrap(),
        );
        assert_eq!(csi.in_tree, None);
        assert!(!csi.migration_rolled_back("d"));
    }

    #[test]
    fn resource_version_order() {
        assert_eq!(newer("10", "9"), Some(true));
        assert_eq!(newer("9", "9"), Some(false));
        assert_eq!(newer("x", "9"), None);
    }
}
