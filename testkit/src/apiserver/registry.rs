//! The kinds the server knows, as data: everything that differs between kinds
//! (scope, subresources, field selectors, status defaults) lives here so the
//! store and the HTTP edge stay generic.

use serde_json::{Value, json};

use super::patch::ListStrategy;

/// How `metadata.name` is validated for a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// RFC 1123 subdomain (most kinds).
    Subdomain,
    /// RFC 1123 label (namespaces).
    Label,
    /// Any name without `/` or `%` and not `.`/`..` (events, leases use path-segment names).
    PathSegment,
}

/// One served resource.
#[derive(Debug, Clone)]
pub struct Kind {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// Resource plural as it appears in URLs.
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether a `/status` subresource exists (status is then only writable through it).
    pub status_subresource: bool,
    pub short_names: &'static [&'static str],
    /// Field selector labels accepted besides `metadata.name` / `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
    /// Whether the real server maintains `metadata.generation` for this kind.
    pub tracks_generation: bool,
    /// Served from a CustomResourceDefinition upstream: no strategic merge patch,
    /// DELETE returns the object instead of a Status.
    pub custom: bool,
    pub name_rule: NameRule,
    /// Whether an update without a resourceVersion is allowed (the strategy's
    /// `AllowUnconditionalUpdate`); when not, it is `422 Invalid`.
    pub unconditional_update: bool,
    /// Which metadata of a `/status` write is kept.
    pub status_metadata: StatusMetadata,
}

/// What a write to the `/status` subresource may change in `metadata`,
/// besides `.status`, per the kind's status strategy `PrepareForUpdate`.
/// System fields (uid, creationTimestamp, deletionTimestamp, generation) are
/// always those of the stored object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusMetadata {
    /// Labels, annotations, finalizers and ownerReferences of the request
    /// are stored (PVs, PVCs, Namespaces, Nodes, ReplicaSets: their status
    /// strategies only reset the spec).
    FromRequest,
    /// As `FromRequest`, but ownerReferences stay (Pods).
    KeepOwnerReferences,
    /// As `FromRequest`, but labels stay (Deployments).
    KeepLabels,
    /// `metav1.ResetObjectMetaForStatus`: labels, annotations, finalizers and
    /// ownerReferences stay (VolumeAttachments).
    Reset,
    /// Everything but `.status` stays (custom resources).
    StatusOnly,
}

impl Kind {
    /// `v1` or `storage.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `persistentvolumeclaims` or `volumeattachments.storage.k8s.io`, as used in error messages.
    pub fn qualified_resource(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The status a freshly created object gets (the real server drops any status sent
    /// on create for kinds with a status subresource, then applies defaults).
    pub fn initial_status(&self) -> Option<Value> {
        match (self.group, self.kind) {
            ("", "PersistentVolume") | ("", "PersistentVolumeClaim") | ("", "Pod") => {
                Some(json!({"phase": "Pending"}))
            }
            ("", "Namespace") => Some(json!({"phase": "Active"})),
            _ => None,
        }
    }

    /// How a strategic merge patch combines the list at a dotted field path,
    /// following the `patchStrategy`/`patchMergeKey` tags of the upstream types.
    pub fn list_strategy(&self, path: &str) -> ListStrategy {
        use ListStrategy::{Atomic, MergeByKey, MergePrimitives};
        match path {
            "metadata.finalizers" => return MergePrimitives,
            "metadata.ownerReferences" => return MergeByKey("uid"),
            _ => {}
        }
        if !self.group.is_empty() {
            return match (self.kind, path) {
                ("CSINode", "spec.drivers") => MergeByKey("name"),
                _ => Atomic,
            };
        }
        match (self.kind, path) {
            ("Pod", p) => {
                let container = [
                    "spec.containers.",
                    "spec.initContainers.",
                    "spec.ephemeralContainers.",
                ]
                .iter()
                .find_map(|pre| p.strip_prefix(pre));
                match (p, container) {
                    (_, Some("ports")) => MergeByKey("containerPort"),
                    (_, Some("env")) => MergeByKey("name"),
                    (_, Some("volumeMounts")) => MergeByKey("mountPath"),
                    (_, Some("volumeDevices")) => MergeByKey("devicePath"),
                    (
                        "spec.volumes"
                        | "spec.containers"
                        | "spec.initContainers"
                        | "spec.ephemeralContainers"
                        | "spec.imagePullSecrets"
                        | "spec.resourceClaims"
                        | "spec.schedulingGates"
                        | "status.resourceClaimStatuses",
                        _,
                    ) => MergeByKey("name"),
                    ("spec.hostAliases" | "status.podIPs" | "status.hostIPs", _) => {
                        MergeByKey("ip")
                    }
                    ("spec.topologySpreadConstraints", _) => MergeByKey("topologyKey"),
                    ("status.conditions", _) => MergeByKey("type"),
                    _ => Atomic,
                }
            }
            ("Node", "spec.podCIDRs") => MergePrimitives,
            ("Node", "status.conditions" | "status.addresses") => MergeByKey("type"),
            ("PersistentVolumeClaim" | "Namespace", "status.conditions") => MergeByKey("type"),
            ("ServiceAccount", "secrets") => MergeByKey("name"),
            _ => Atomic,
        }
    }

    /// Whether this kind is a core/v1 resource of the given name.
    pub fn is_core(&self, kind: &str) -> bool {
        self.group.is_empty() && self.kind == kind
    }
}

const SUBDOMAIN: NameRule = NameRule::Subdomain;

#[allow(clippy::too_many_arguments)]
const fn k(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
    short_names: &'static [&'static str],
) -> Kind {
    Kind {
        group,
        version,
        plural,
        singular,
        kind,
        namespaced,
        status_subresource,
        short_names,
        field_selectors: &[],
        tracks_generation: false,
        custom: false,
        name_rule: SUBDOMAIN,
        unconditional_update: true,
        status_metadata: StatusMetadata::FromRequest,
    }
}

const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

const EVENTS_V1_FIELDS: &[&str] = &[
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "regarding.apiVersion",
    "regarding.resourceVersion",
    "regarding.fieldPath",
    "reason",
    "reportingController",
    "type",
];

const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];

/// The registry of served kinds.
#[derive(Debug, Clone)]
pub struct Registry {
    kinds: Vec<Kind>,
}

/// Index of a kind in the [`Registry`].
pub type KindId = usize;

impl Default for Registry {
    fn default() -> Self {
        Self::builtin()
    }
}

impl Registry {
    /// The kinds the CSI sidecars read and write, plus a few common core kinds.
    pub fn builtin() -> Self {
        let st = "storage.k8s.io";
        let snap = "snapshot.storage.k8s.io";
        let group_snap = "groupsnapshot.storage.k8s.io";
        let kinds = vec![
            Kind {
                name_rule: NameRule::Label,
                field_selectors: &["status.phase"],
                ..k(
                    "",
                    "v1",
                    "namespaces",
                    "namespace",
                    "Namespace",
                    false,
                    true,
                    &["ns"],
                )
            },
            Kind {
                field_selectors: &["spec.unschedulable"],
                ..k("", "v1", "nodes", "node", "Node", false, true, &["no"])
            },
            k(
                "",
                "v1",
                "persistentvolumes",
                "persistentvolume",
                "PersistentVolume",
                false,
                true,
                &["pv"],
            ),
            k(
                "",
                "v1",
                "persistentvolumeclaims",
                "persistentvolumeclaim",
                "PersistentVolumeClaim",
                true,
                true,
                &["pvc"],
            ),
            Kind {
                field_selectors: &["type"],
                ..k("", "v1", "secrets", "secret", "Secret", true, false, &[])
            },
            Kind {
                field_selectors: CORE_EVENT_FIELDS,
                name_rule: NameRule::PathSegment,
                ..k("", "v1", "events", "event", "Event", true, false, &["ev"])
            },
            Kind {
                field_selectors: POD_FIELDS,
                tracks_generation: true,
                status_metadata: StatusMetadata::KeepOwnerReferences,
                ..k("", "v1", "pods", "pod", "Pod", true, true, &["po"])
            },
            k(
                "",
                "v1",
                "serviceaccounts",
                "serviceaccount",
                "ServiceAccount",
                true,
                false,
                &["sa"],
            ),
            k(
                "",
                "v1",
                "configmaps",
                "configmap",
                "ConfigMap",
                true,
                false,
                &["cm"],
            ),
            k(
                st,
                "v1",
                "storageclasses",
                "storageclass",
                "StorageClass",
                false,
                false,
                &["sc"],
            ),
            Kind {
                unconditional_update: false,
                status_metadata: StatusMetadata::Reset,
                ..k(
                    st,
                    "v1",
                    "volumeattachments",
                    "volumeattachment",
                    "VolumeAttachment",
                    false,
                    true,
                    &[],
                )
            },
            Kind {
                unconditional_update: false,
                ..k(
                    st,
                    "v1",
                    "csinodes",
                    "csinode",
                    "CSINode",
                    false,
                    false,
                    &[],
                )
            },
            Kind {
                unconditional_update: false,
                ..k(
                    st,
                    "v1",
                    "csidrivers",
                    "csidriver",
                    "CSIDriver",
                    false,
                    false,
                    &[],
                )
            },
            Kind {
                unconditional_update: false,
                ..k(
                    st,
                    "v1",
                    "csistoragecapacities",
                    "csistoragecapacity",
                    "CSIStorageCapacity",
                    true,
                    false,
                    &[],
                )
            },
            k(
                st,
                "v1",
                "volumeattributesclasses",
                "volumeattributesclass",
                "VolumeAttributesClass",
                false,
                false,
                &["vac"],
            ),
            Kind {
                name_rule: NameRule::PathSegment,
                unconditional_update: false,
                ..k(
                    "coordination.k8s.io",
                    "v1",
                    "leases",
                    "lease",
                    "Lease",
                    true,
                    false,
                    &[],
                )
            },
            Kind {
                field_selectors: EVENTS_V1_FIELDS,
                name_rule: NameRule::PathSegment,
                ..k(
                    "events.k8s.io",
                    "v1",
                    "events",
                    "event",
                    "Event",
                    true,
                    false,
                    &["ev"],
                )
            },
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    snap,
                    "v1",
                    "volumesnapshots",
                    "volumesnapshot",
                    "VolumeSnapshot",
                    true,
                    true,
                    &["vs"],
                )
            },
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    snap,
                    "v1",
                    "volumesnapshotcontents",
                    "volumesnapshotcontent",
                    "VolumeSnapshotContent",
                    false,
                    true,
                    &["vsc", "vscs"],
                )
            },
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    snap,
                    "v1",
                    "volumesnapshotclasses",
                    "volumesnapshotclass",
                    "VolumeSnapshotClass",
                    false,
                    false,
                    &["vsclass", "vsclasses"],
                )
            },
            // Group snapshots (served as v1, as external-snapshotter v8.6's CRDs serve them).
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    group_snap,
                    "v1",
                    "volumegroupsnapshots",
                    "volumegroupsnapshot",
                    "VolumeGroupSnapshot",
                    true,
                    true,
                    &["vgs"],
                )
            },
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    group_snap,
                    "v1",
                    "volumegroupsnapshotcontents",
                    "volumegroupsnapshotcontent",
                    "VolumeGroupSnapshotContent",
                    false,
                    true,
                    &["vgsc", "vgscs"],
                )
            },
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    group_snap,
                    "v1",
                    "volumegroupsnapshotclasses",
                    "volumegroupsnapshotclass",
                    "VolumeGroupSnapshotClass",
                    false,
                    false,
                    &["vgsclass", "vgsclasses"],
                )
            },
            // The owners a pod is walked up through (the provisioner's capacity owner).
            Kind {
                tracks_generation: true,
                ..k(
                    "apps",
                    "v1",
                    "replicasets",
                    "replicaset",
                    "ReplicaSet",
                    true,
                    true,
                    &["rs"],
                )
            },
            Kind {
                tracks_generation: true,
                status_metadata: StatusMetadata::KeepLabels,
                ..k(
                    "apps",
                    "v1",
                    "deployments",
                    "deployment",
                    "Deployment",
                    true,
                    true,
                    &["deploy"],
                )
            },
            // KEP-3314's (changed block tracking): one per CSI driver, named after it, which
            // csi-snapshot-metadata reads its audience from.
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    "cbt.storage.k8s.io",
                    "v1beta1",
                    "snapshotmetadataservices",
                    "snapshotmetadataservice",
                    "SnapshotMetadataService",
                    false,
                    false,
                    &["sms"],
                )
            },
            // Gateway API's, which cross-namespace volume data sources are granted by.
            Kind {
                tracks_generation: true,
                custom: true,
                unconditional_update: false,
                status_metadata: StatusMetadata::StatusOnly,
                ..k(
                    "gateway.networking.k8s.io",
                    "v1beta1",
                    "referencegrants",
                    "referencegrant",
                    "ReferenceGrant",
                    true,
                    false,
                    &["refgrant"],
                )
            },
        ];
        Self { kinds }
    }

    pub fn kinds(&self) -> &[Kind] {
        &self.kinds
    }

    pub fn get(&self, id: KindId) -> &Kind {
        &self.kinds[id]
    }

    /// Finds the kind served at `group/version` under `plural`.
    pub fn lookup(&self, group: &str, version: &str, plural: &str) -> Option<KindId> {
        self.kinds
            .iter()
            .position(|k| k.group == group && k.version == version && k.plural == plural)
    }

    /// Finds a kind by `apiVersion` and `kind` as written in an object.
    pub fn lookup_kind(&self, api_version: &str, kind: &str) -> Option<KindId> {
        self.kinds
            .iter()
            .position(|k| k.kind == kind && k.api_version() == api_version)
    }

    /// The id of a core/v1 kind; the built-in registry always has the kinds the
    /// server itself needs (namespaces, PVs, PVCs, storage classes).
    pub fn core(&self, plural: &str) -> Option<KindId> {
        self.lookup("", "v1", plural)
    }

    /// Group names other than core, in registration order, each with its versions.
    pub fn groups(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for k in self.kinds.iter().filter(|k| !k.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == k.group) {
                Some((_, versions)) => {
                    if !versions.contains(&k.version) {
                        versions.push(k.version);
                    }
                }
                None => out.push((k.group, vec![k.version])),
            }
        }
        out
    }

    /// Kinds served under one group/version.
    pub fn in_group_version<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a Kind> + 'a {
        self.kinds
            .iter()
            .filter(move |k| k.group == group && k.version == version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookups_find_kinds_by_url_and_by_object_type() {
        let r = Registry::builtin();
        let va = r
            .lookup("storage.k8s.io", "v1", "volumeattachments")
            .unwrap();
        assert_eq!(r.get(va).kind, "VolumeAttachment");
        assert_eq!(
            r.lookup_kind("storage.k8s.io/v1", "VolumeAttachment"),
            Some(va)
        );
        assert!(r.lookup("", "v1", "volumeattachments").is_none());
        let core_ev = r.lookup_kind("v1", "Event").unwrap();
        let new_ev = r.lookup_kind("events.k8s.io/v1", "Event").unwrap();
        assert_ne!(core_ev, new_ev);
        assert_eq!(
            r.get(va).qualified_resource(),
            "volumeattachments.storage.k8s.io"
        );
    }

    #[test]
    fn groups_list_every_non_core_group_once() {
        let r = Registry::builtin();
        let groups: Vec<_> = r.groups().into_iter().map(|(g, _)| g).collect();
        assert_eq!(
            groups,
            vec![
                "storage.k8s.io",
                "coordination.k8s.io",
                "events.k8s.io",
                "snapshot.storage.k8s.io",
                "groupsnapshot.storage.k8s.io",
                "apps",
                "cbt.storage.k8s.io",
                "gateway.networking.k8s.io"
            ]
        );
    }
}
