//! The fields of PersistentVolumeClaims, PersistentVolumes, StorageClasses, Nodes, CSINodes and
//! VolumeAttachments the provisioner decides from, projected out of the API objects so that the
//! cache holds only these.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use sidecar_kit::migration;
use sidecar_kit::pipeline::views::{self, ClaimView, Needs, PvView};
use sidecar_kit::values::atom::Atom;

/// The reclaim policy under which a released volume is deleted (the default).
pub const RECLAIM_DELETE: &str = "Delete";

/// What this controller reads of the process's shared views.
pub const NEEDS: Needs = Needs::CLAIM_REF
    .union(Needs::PV_FINALIZERS)
    .union(Needs::PROVISIONING)
    .union(Needs::MIGRATED_TO);

pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_MIGRATED_TO: &str = migration::MIGRATED_TO_ANNOTATION;
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
pub const ANN_PROVISIONED_BY: &str = views::PROVISIONED_BY;
pub const ANN_DELETION_SECRET_NAME: &str = views::DELETION_SECRET_NAME;
pub const ANN_DELETION_SECRET_NAMESPACE: &str = views::DELETION_SECRET_NAMESPACE;
pub const ANN_MODIFY_SECRET_NAME: &str = views::MODIFY_SECRET_NAME;
pub const ANN_MODIFY_SECRET_NAMESPACE: &str = views::MODIFY_SECRET_NAMESPACE;
/// The finalizer on the PersistentVolumes of volumes to delete.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Volume attribute naming the provisioner instance that created the volume.
pub const PROVISIONER_ID_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

/// The leader election lock name, as upstream's: the driver name with `/` replaced; its Lease's
/// name before sanitizing, and what its Events name.
pub fn lock_name(driver: &str) -> String {
    driver.replace('/', "-")
}

/// The leader election Lease name, as upstream names it.
pub fn lease_name(driver: &str) -> String {
    sidecar_kit::cluster::leader::sanitize_name(&lock_name(driver))
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// The finalizer that keeps a claim being cloned from until its clones have their volumes.
pub const CLONE_FINALIZER: &str = views::CLONE_FINALIZER;
/// The finalizer that keeps a VolumeSnapshot being restored until its restores have volumes.
pub const SNAPSHOT_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// What a claim asks its volume to be filled from: `spec.dataSource` when set (it wins, as
/// upstream reads it), else `spec.dataSourceRef`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSource {
    pub api_group: String,
    pub kind: String,
    pub name: String,
    /// `dataSourceRef.namespace` (cross-namespace sources); `None` for the claim's namespace.
    pub namespace: Option<String>,
    /// Taken from `dataSourceRef` (`spec.dataSource` was unset).
    #[serde(default)]
    pub from_ref: bool,
}

/// What a data source is, for the provisioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SourceKind {
    /// A VolumeSnapshot to restore.
    Snapshot,
    /// A claim to clone.
    Claim,
}

/// A data source the index keeps track of: its kind, namespace and name.
pub type SourceKey = (SourceKind, Atom, String);

impl DataSource {
    /// The namespace the source lives in.
    pub fn namespace_in<'a>(&'a self, claim_namespace: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(claim_namespace)
    }

    /// The snapshot or claim this source names (`None`: a populator's kind, or a snapshot of
    /// another API group).
    pub fn key(&self, claim_namespace: &str) -> Option<SourceKey> {
        let kind = match self.kind.as_str() {
            "VolumeSnapshot" if self.api_group == SNAPSHOT_GROUP => SourceKind::Snapshot,
            "PersistentVolumeClaim" => SourceKind::Claim,
            _ => return None,
        };
        Some((
            kind,
            Atom::from(self.namespace_in(claim_namespace)),
            self.name.clone(),
        ))
    }
}

/// What provisioning needs of a claim that has no volume yet.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimSpec {
    pub annotations: BTreeMap<String, String>,
    pub access_modes: Vec<String>,
    pub block: bool,
    /// `volumeMode` as written (`None`: unset).
    pub volume_mode: Option<String>,
    pub has_selector: bool,
    pub data_source: Option<DataSource>,
    pub volume_attributes_class: Option<String>,
}

/// A PersistentVolumeClaim. Bound claims keep their identity and what a clone of them checks:
/// nothing is provisioned for them, and most claims in a cluster are bound.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub uid: String,
    pub namespace: Atom,
    pub name: String,
    pub resource_version: String,
    pub volume_name: String,
    /// `status.phase`.
    #[serde(default)]
    pub phase: Atom,
    #[serde(default)]
    pub deleting: bool,
    /// Carries [`CLONE_FINALIZER`].
    #[serde(default)]
    pub clone_protected: bool,
    pub storage_class: Option<Atom>,
    /// `resources.requests.storage` as written.
    pub request: Option<Atom>,
    /// Present while the claim has no volume.
    pub pending: Option<Box<ClaimSpec>>,
}

impl Claim {
    pub fn from_api(pvc: &PersistentVolumeClaim) -> Self {
        Self::from_view(&ClaimView::from_api(pvc, NEEDS))
    }

    /// The provisioner's projection of the process's shared view of a claim.
    pub fn from_view(view: &ClaimView) -> Self {
        let pending = view.unbound.as_ref().map(|unbound| {
            let spec = &unbound.spec;
            let data_source = spec
                .data_source
                .as_ref()
                .map(|r| DataSource {
                    api_group: r.api_group.clone().unwrap_or_default(),
                    kind: r.kind.clone(),
                    name: r.name.clone(),
                    namespace: None,
                    from_ref: false,
                })
                .or_else(|| {
                    spec.data_source_ref.as_ref().map(|r| DataSource {
                        api_group: r.api_group.clone().unwrap_or_default(),
                        kind: r.kind.clone(),
                        name: r.name.clone(),
                        namespace: r.namespace.clone().filter(|n| !n.is_empty()),
                        from_ref: true,
                    })
                });
            Box::new(ClaimSpec {
                annotations: unbound.annotations.clone(),
                access_modes: spec.access_modes.clone().unwrap_or_default(),
                block: spec.volume_mode.as_deref() == Some("Block"),
                volume_mode: spec.volume_mode.clone(),
                has_selector: spec.selector.is_some(),
                data_source,
                volume_attributes_class: spec
                    .volume_attributes_class_name
                    .clone()
                    .filter(|n| !n.is_empty()),
            })
        });
        Self {
            uid: view.uid.to_string(),
            namespace: view.namespace.clone(),
            name: view.name().to_string(),
            resource_version: view.resource_version.to_string(),
            volume_name: view.volume_name.to_string(),
            phase: view.phase.clone(),
            deleting: view.deleting,
            clone_protected: view.has_finalizer(CLONE_FINALIZER),
            storage_class: view.storage_class.clone(),
            request: view.request.clone(),
            pending,
        }
    }

    /// The snapshot or claim this claim's volume is to be filled from, while it has no volume.
    pub fn source_key(&self) -> Option<SourceKey> {
        self.pending
            .as_ref()?
            .data_source
            .as_ref()?
            .key(&self.namespace)
    }

    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.pending
            .as_ref()
            .and_then(|p| p.annotations.get(key))
            .map(String::as_str)
    }

    /// The provisioner the PV controller announced, from the GA annotation or the beta one.
    pub fn provisioner(&self) -> Option<&str> {
        self.annotation(ANN_STORAGE_PROVISIONER)
            .or_else(|| self.annotation(ANN_BETA_STORAGE_PROVISIONER))
    }

    /// The node the scheduler chose (late binding).
    pub fn selected_node(&self) -> Option<&str> {
        self.annotation(ANN_SELECTED_NODE)
            .or_else(|| self.annotation(ANN_ALPHA_SELECTED_NODE))
            .filter(|n| !n.is_empty())
    }

    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(self.namespace.to_string()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            resource_version: Some(self.resource_version.clone()),
            ..Default::default()
        }
    }
}

/// One `allowedTopologies` term: an AND of keys, each with an OR of values.
pub type TopologySelectorTerm = Vec<(String, Vec<String>)>;

/// A StorageClass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Class {
    pub name: String,
    pub uid: String,
    pub provisioner: String,
    pub parameters: BTreeMap<String, String>,
    /// `Delete` (the default), `Retain` or `Recycle`.
    pub reclaim_policy: String,
    pub mount_options: Vec<String>,
    pub wait_for_first_consumer: bool,
    pub allowed_topologies: Vec<TopologySelectorTerm>,
}

impl Class {
    pub fn from_api(sc: &StorageClass) -> Self {
        Self {
            name: name_of(&sc.metadata),
            uid: sc.metadata.uid.clone().unwrap_or_default(),
            provisioner: sc.provisioner.clone(),
            parameters: sc.parameters.clone().unwrap_or_default(),
            reclaim_policy: sc
                .reclaim_policy
                .clone()
                .unwrap_or_else(|| RECLAIM_DELETE.to_string()),
            mount_options: sc.mount_options.clone().unwrap_or_default(),
            wait_for_first_consumer: sc.volume_binding_mode.as_deref()
                == Some("WaitForFirstConsumer"),
            allowed_topologies: sc
                .allowed_topologies
                .iter()
                .flatten()
                .map(|term| {
                    term.match_label_expressions
                        .iter()
                        .flatten()
                        .map(|e| (e.key.clone(), e.values.clone()))
                        .collect()
                })
                .collect(),
        }
    }
}

/// A reference to a Secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

/// A PersistentVolume this provisioner is responsible for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub resource_version: String,
    pub deleting: bool,
    pub finalizers: Vec<Atom>,
    pub phase: Atom,
    pub reclaim_policy: Atom,
    pub storage_class: Atom,
    /// `spec.csi.driver` and `spec.csi.volumeHandle` (empty for in-tree volumes).
    pub driver: Atom,
    pub volume_handle: String,
    /// `claimRef` namespace and name.
    pub claim: Option<(Atom, String)>,
    pub claim_uid: String,
    /// The deletion secret annotations; `None` when they are absent.
    pub deletion_secret: Option<(String, String)>,
    pub provisioned_by: Option<Atom>,
    pub migrated_to: Option<Atom>,
    /// `spec.volumeMode` as written.
    pub volume_mode: Option<Atom>,
    /// An in-tree volume: `driver` and `volume_handle` are those of its CSI translation.
    pub migrated: bool,
    /// Why an in-tree volume of a migration target cannot be translated.
    pub translation_error: Option<String>,
    /// Accessible from this provisioner's node (always, but with distributed provisioning).
    pub on_this_node: bool,
}

impl Volume {
    pub fn from_api(pv: &PersistentVolume) -> Self {
        Self::from_view(&PvView::from_api(pv, NEEDS))
    }

    /// The provisioner's projection of the process's shared view of a PV. An in-tree volume of
    /// a plugin that has a CSI driver is seen as that driver's.
    pub fn from_view(view: &PvView) -> Self {
        let claim_ref = view.claim_ref.as_deref();
        Self {
            name: view.name.to_string(),
            resource_version: view.resource_version.to_string(),
            deleting: view.deleting,
            finalizers: view.finalizers.to_vec(),
            phase: view.phase.clone(),
            reclaim_policy: view.reclaim_policy.clone(),
            storage_class: view.storage_class.clone(),
            driver: view
                .csi
                .as_ref()
                .map(|c| c.driver.clone())
                .unwrap_or_default(),
            volume_handle: view.volume_handle().to_string(),
            claim: claim_ref.map(|r| (r.namespace.clone(), r.name.to_string())),
            claim_uid: claim_ref.map(|r| r.uid.to_string()).unwrap_or_default(),
            deletion_secret: view
                .secret_annotations(ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE)
                .map(|s| (s.namespace, s.name)),
            provisioned_by: view.annotation(ANN_PROVISIONED_BY).map(Atom::from),
            migrated_to: view.annotation(ANN_MIGRATED_TO).map(Atom::from),
            volume_mode: view.volume_mode.clone(),
            migrated: view.in_tree.is_some(),
            translation_error: view.in_tree.as_ref().and_then(|t| t.error.clone()),
            on_this_node: true,
        }
    }

    /// Whether `driver` is responsible for this PV: it provisioned it (or the PV was migrated
    /// to it), or it is a static CSI PV of the driver.
    pub fn owned_by(&self, driver: &str) -> bool {
        let in_tree = migration::in_tree_name_of(driver);
        match &self.provisioned_by {
            Some(by) => {
                by == driver
                    || Some(by.as_str()) == in_tree
                    || self.migrated_to.as_deref() == Some(driver)
            }
            None if !self.driver.is_empty() => self.driver == driver,
            None => self.migrated_to.as_deref() == Some(driver),
        }
    }

    pub fn has_finalizer(&self) -> bool {
        self.finalizers.iter().any(|f| f == PV_FINALIZER)
    }

    pub fn object_ref(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolume".into()),
            name: Some(self.name.clone()),
            resource_version: Some(self.resource_version.clone()),
            ..Default::default()
        }
    }
}

/// The topology keys `driver` registered in a CSINode (`None`: not registered there).
pub fn csinode_topology_keys(csinode: &CSINode, driver: &str) -> Option<Vec<String>> {
    csinode
        .spec
        .drivers
        .iter()
        .find(|d| d.name == driver)
        .map(|d| d.topology_keys.clone().unwrap_or_default())
}

/// The labels of a Node.
pub fn node_labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// The PV a VolumeAttachment names, and its node.
pub fn attachment_of(va: &VolumeAttachment) -> Option<(String, String)> {
    va.spec
        .source
        .persistent_volume_name
        .clone()
        .map(|pv| (pv, va.spec.node_name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sidecar_kit::pipeline::views::LAST_APPLIED;

    fn pvc(value: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn pending_claims_keep_what_provisioning_needs() {
        let claim = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                "annotations": {ANN_BETA_STORAGE_PROVISIONER: "d", ANN_SELECTED_NODE: "n1",
                    LAST_APPLIED: "{...}"}},
            "spec": {"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
                "volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}},
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}
        })));
        assert_eq!(claim.provisioner(), Some("d"));
        assert_eq!(claim.selected_node(), Some("n1"));
        let spec = claim.pending.as_ref().unwrap();
        assert!(spec.block);
        assert_eq!(claim.request.as_deref(), Some("1Gi"));
        assert!(!spec.annotations.contains_key(LAST_APPLIED));
        assert_eq!(spec.data_source.as_ref().unwrap().name, "src");
    }

    #[test]
    fn bound_claims_keep_only_their_identity() {
        let claim = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1",
                "annotations": {ANN_STORAGE_PROVISIONER: "d"}},
            "spec": {"volumeName": "pv-1", "storageClassName": "fast"}
        })));
        assert_eq!(claim.volume_name, "pv-1");
        assert!(claim.pending.is_none());
        assert_eq!(claim.provisioner(), None);
    }

    #[test]
    fn data_source_wins_over_data_source_ref() {
        let claim = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "a"},
                "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "a"}}
        })));
        let source = claim.pending.as_ref().unwrap().data_source.clone().unwrap();
        assert_eq!((source.name.as_str(), source.from_ref), ("a", false));
        assert_eq!(
            claim.source_key(),
            Some((SourceKind::Claim, "ns".into(), "a".into()))
        );
        let cross = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"dataSourceRef": {"apiGroup": SNAPSHOT_GROUP, "kind": "VolumeSnapshot", "name": "b", "namespace": "other"}}
        })));
        let source = cross.pending.as_ref().unwrap().data_source.clone().unwrap();
        assert!(source.from_ref);
        assert_eq!(
            cross.source_key(),
            Some((SourceKind::Snapshot, "other".into(), "b".into()))
        );
        let populated = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"dataSourceRef": {"apiGroup": "example.com", "kind": "Hello", "name": "h"}}
        })));
        assert_eq!(populated.source_key(), None);
    }

    #[test]
    fn claims_keep_what_a_clone_checks() {
        let claim = Claim::from_api(&pvc(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1",
                "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": [CLONE_FINALIZER]},
            "spec": {"volumeName": "pv-1", "storageClassName": "fast",
                "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"phase": "Bound"}
        })));
        assert_eq!(claim.phase, "Bound");
        assert!(claim.deleting && claim.clone_protected);
        assert_eq!(claim.storage_class.as_deref(), Some("fast"));
        assert_eq!(claim.request.as_deref(), Some("2Gi"));
        assert!(claim.pending.is_none());
    }

    #[test]
    fn volume_ownership_follows_upstream() {
        let pv = |value: serde_json::Value| -> Volume {
            Volume::from_api(&serde_json::from_value(value).unwrap())
        };
        let provisioned = pv(
            json!({"metadata": {"name": "p", "annotations": {ANN_PROVISIONED_BY: "d"}},
            "spec": {"csi": {"driver": "other", "volumeHandle": "h"}}}),
        );
        assert!(provisioned.owned_by("d"));
        assert!(!provisioned.owned_by("other"), "the annotation decides");
        let static_pv = pv(
            json!({"metadata": {"name": "p"}, "spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}),
        );
        assert!(static_pv.owned_by("d") && !static_pv.owned_by("x"));
        let migrated = pv(
            json!({"metadata": {"name": "p", "annotations": {ANN_PROVISIONED_BY: "kubernetes.io/gce-pd", ANN_MIGRATED_TO: "d"}}, "spec": {}}),
        );
        assert!(migrated.owned_by("d"));
        let deletion = pv(
            json!({"metadata": {"name": "p", "annotations": {ANN_DELETION_SECRET_NAME: "", ANN_DELETION_SECRET_NAMESPACE: ""}}}),
        );
        assert_eq!(
            deletion.deletion_secret,
            Some((String::new(), String::new()))
        );
    }

    #[test]
    fn lease_name_is_the_sanitized_driver_name() {
        assert_eq!(lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
        assert_eq!(lease_name("example.com/x"), "example-com-x");
        assert_eq!(lock_name("example.com/x"), "example.com-x");
    }
}
