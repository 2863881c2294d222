//! The fields of VolumeAttachments, PersistentVolumes and CSINodes the attacher decides from,
//! projected out of the API objects so that the cache holds only these.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};

/// Annotation on the VolumeAttachment that remembers the node ID, for detaching after the
/// node's CSINode is gone.
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";

/// The finalizer the attacher puts on VolumeAttachments and PersistentVolumes.
pub fn finalizer_name(driver: &str) -> String {
    format!(
        "external-attacher/{}",
        sidecar_kit::leader::sanitize_name(driver)
    )
}

/// The leader election Lease name, as upstream names it.
pub fn lease_name(driver: &str) -> String {
    sidecar_kit::leader::sanitize_name(&format!("external-attacher-leader-{driver}"))
}

/// Reference to a Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

/// `spec.csi` of a PersistentVolume (or of an inline volume spec).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsiSource {
    pub driver: String,
    pub volume_handle: String,
    pub read_only: bool,
    pub fs_type: String,
    pub volume_attributes: BTreeMap<String, String>,
    pub publish_secret: Option<SecretRef>,
}

/// The parts of a PersistentVolumeSpec that shape a ControllerPublishVolume call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeSpec {
    pub csi: Option<CsiSource>,
    pub access_modes: Vec<String>,
    pub block: bool,
    pub mount_options: Vec<String>,
}

/// A PersistentVolume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pv {
    pub name: String,
    pub resource_version: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub spec: VolumeSpec,
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
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub node_id_annotation: Option<String>,
    pub attacher: String,
    pub node_name: String,
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
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            node_id_annotation: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_ID_ANNOTATION).cloned()),
            attacher: va.spec.attacher.clone(),
            node_name: va.spec.node_name.clone(),
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

    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("storage.k8s.io/v1".into()),
            kind: Some("VolumeAttachment".into()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()).filter(|u| !u.is_empty()),
            resource_version: Some(self.resource_version.clone()).filter(|r| !r.is_empty()),
            ..Default::default()
        }
    }
}

impl CsiSource {
    fn from_api(csi: &CSIPersistentVolumeSource) -> Self {
        Self {
            driver: csi.driver.clone(),
            volume_handle: csi.volume_handle.clone(),
            read_only: csi.read_only.unwrap_or(false),
            fs_type: csi.fs_type.clone().unwrap_or_default(),
            volume_attributes: csi.volume_attributes.clone().unwrap_or_default(),
            publish_secret: csi
                .controller_publish_secret_ref
                .as_ref()
                .map(|r| SecretRef {
                    namespace: r.namespace.clone().unwrap_or_default(),
                    name: r.name.clone().unwrap_or_default(),
                }),
        }
    }
}

impl VolumeSpec {
    pub fn from_api(spec: &PersistentVolumeSpec) -> Self {
        Self {
            csi: spec.csi.as_ref().map(CsiSource::from_api),
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            block: spec.volume_mode.as_deref() == Some("Block"),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
        }
    }
}

impl Pv {
    pub fn from_api(pv: &PersistentVolume) -> Self {
        let meta = &pv.metadata;
        Self {
            name: meta.name.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone().unwrap_or_default(),
            deleting: meta.deletion_timestamp.is_some(),
            finalizers: meta.finalizers.clone().unwrap_or_default(),
            spec: pv
                .spec
                .as_ref()
                .map(VolumeSpec::from_api)
                .unwrap_or_default(),
        }
    }

    pub fn has_finalizer(&self, finalizer: &str) -> bool {
        self.finalizers.iter().any(|f| f == finalizer)
    }

    /// Whether the cache needs this PV: a CSI volume of the driver, or one carrying its finalizer.
    pub fn concerns(&self, driver: &str, finalizer: &str) -> bool {
        self.spec.csi.as_ref().is_some_and(|c| c.driver == driver) || self.has_finalizer(finalizer)
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
    }

    #[test]
    fn va_projection() {
        let va = Va::from_api(&va_json(json!({
            "metadata": {"finalizers": ["a"], "deletionTimestamp": "2024-01-01T00:00:00Z",
                         "annotations": {NODE_ID_ANNOTATION: "n-1", "other": "x"}},
            "status": {"attached": true, "attachmentMetadata": {"k": "v"},
                       "attachError": {"message": "m"}},
        })));
        assert_eq!(va.name, "va-1");
        assert!(va.deleting);
        assert_eq!(va.finalizers, ["a"]);
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
            csi.publish_secret,
            Some(SecretRef {
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
    fn resource_version_order() {
        assert_eq!(newer("10", "9"), Some(true));
        assert_eq!(newer("9", "9"), Some(false));
        assert_eq!(newer("x", "9"), None);
    }
}
