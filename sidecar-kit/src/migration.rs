//! CSI migration: translations between Kubernetes' in-tree volume plugins (EBS, GCE PD, Azure
//! Disk, Azure File, Cinder, vSphere, Portworx) and the CSI drivers that replace them, as
//! Kubernetes' csi-translation-lib makes them.
//!
//! - [`translate_in_tree_pv`]: in-tree PersistentVolume → the PV the CSI driver sees (the
//!   external-attacher attaches migrated volumes with it).
//! - [`translate_in_tree_storage_class`]: an in-tree StorageClass's provisioner, parameters and
//!   allowed topologies → those the CSI driver understands (for provisioning claims of classes
//!   whose provisioner is an in-tree plugin).
//! - [`translate_csi_pv_to_in_tree`]: a PV the driver's CSI source describes → the in-tree PV
//!   that is written to the API for such claims.
//! - [`in_tree_name_of`] and [`csi_name_of`]: plugin and driver names; [`repair_volume_handle`]:
//!   GCE PD handles completed from a node ID.
//!
//! The results (volume handles, volume attributes, access modes, topology keys, labels) must be
//! exactly those of Kubernetes' own translation, because the driver, kube-controller-manager and
//! the kubelet all derive the same values independently and compare them.

mod storage_class;
mod to_in_tree;

pub use storage_class::{
    StorageClassError, TopologyRequirement, TopologyTerm, TranslatedStorageClass,
    topology_terms_from_api, topology_terms_to_api, translate_in_tree_storage_class,
};
pub use to_in_tree::{CsiToInTreeError, translate_csi_pv_to_in_tree};

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeSpec, SecretReference, VolumeNodeAffinity,
};

/// Annotation the PV controller puts on PersistentVolumes (and claims) handled by a CSI driver
/// through migration: its value is the driver's name.
pub const MIGRATED_TO_ANNOTATION: &str = "pv.kubernetes.io/migrated-to";

/// Zone labels of nodes and volumes, GA and deprecated beta.
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
const BETA_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
/// Separator of the zones of a multi-zone (regional) volume in a zone label.
const MULTI_ZONE_DELIMITER: &str = "__";

/// GCE PD handles carry the project, which the in-tree PV does not know.
const GCE_UNSPECIFIED: &str = "UNSPECIFIED";
const AZURE_FILE_RESOURCE_GROUP_ANNOTATION: &str = "kubernetes.io/azure-file-resource-group";
const AZURE_FILE_SECRET_PREFIX: &str = "azure-storage-account-";
const AZURE_FILE_SECRET_SUFFIX: &str = "-secret";
const AZURE_MANAGED_DISK: &str = "Managed";
const PORTWORX_AUTH_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const PORTWORX_AUTH_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";

/// The drivers' zone (and vSphere's region) topology keys.
const EBS_TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
const GCE_TOPOLOGY_KEY: &str = "topology.gke.io/zone";
const CINDER_TOPOLOGY_KEY: &str = "topology.cinder.csi.openstack.org/zone";
const AZURE_DISK_TOPOLOGY_KEY: &str = "topology.disk.csi.azure.com/zone";
const VSPHERE_ZONE_KEY: &str = "topology.csi.vmware.com/zone";
const VSPHERE_REGION_KEY: &str = "topology.csi.vmware.com/region";

/// An in-tree volume plugin and the CSI driver that replaces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InTreePlugin {
    pub in_tree_name: &'static str,
    pub csi_driver: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    VSphere,
    Portworx,
}

/// Every in-tree plugin with a migration path.
pub const IN_TREE_PLUGINS: [InTreePlugin; 7] = [
    InTreePlugin {
        in_tree_name: "kubernetes.io/aws-ebs",
        csi_driver: "ebs.csi.aws.com",
        kind: Kind::AwsEbs,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/gce-pd",
        csi_driver: "pd.csi.storage.gke.io",
        kind: Kind::GcePd,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/azure-disk",
        csi_driver: "disk.csi.azure.com",
        kind: Kind::AzureDisk,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/azure-file",
        csi_driver: "file.csi.azure.com",
        kind: Kind::AzureFile,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/cinder",
        csi_driver: "cinder.csi.openstack.org",
        kind: Kind::Cinder,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/vsphere-volume",
        csi_driver: "csi.vsphere.vmware.com",
        kind: Kind::VSphere,
    },
    InTreePlugin {
        in_tree_name: "kubernetes.io/portworx-volume",
        csi_driver: "pxd.portworx.com",
        kind: Kind::Portworx,
    },
];

/// Why an in-tree volume cannot be translated. The texts are Kubernetes' own, since they end up
/// in VolumeAttachment statuses and Events that users compare with the documentation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TranslationError {
    #[error("failed to translate Kubernetes ID to EBS Volume ID {0}")]
    EbsVolumeId(String),
    #[error("failed to get region from zones: {0}")]
    GceRegion(String),
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespace,
    #[error("volume handle has wrong number of elements; got {0}, wanted 6 or more")]
    VolumeHandleElements(usize),
    #[error("node handle has wrong number of elements; got {0}, wanted 6 or more")]
    NodeIdElements(usize),
    #[error("failed to get region from zone {zone}: {reason}")]
    GceNodeRegion { zone: String, reason: String },
    #[error("expected volume handle to have zones or regions regionality value, got: {0}")]
    GceRegionality(String),
    #[error("could not find In-Tree driver name for CSI plugin {0}")]
    NotMigrationTarget(String),
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
}

/// Whether `driver` replaces an in-tree plugin (upstream's `IsMigratedCSIDriverByName`).
pub fn is_migrated_csi_driver(driver: &str) -> bool {
    IN_TREE_PLUGINS.iter().any(|p| p.csi_driver == driver)
}

/// Whether `in_tree` names an in-tree plugin with a migration path
/// (upstream's `IsMigratableIntreePluginByName`).
pub fn is_migratable_in_tree_plugin(in_tree: &str) -> bool {
    plugin_by_in_tree_name(in_tree).is_some()
}

/// The in-tree plugin that `csi_driver` replaces (`kubernetes.io/aws-ebs` for
/// `ebs.csi.aws.com`); `None` for drivers that are no migration target.
pub fn in_tree_name_of(csi_driver: &str) -> Option<&'static str> {
    plugin_by_csi_driver(csi_driver).map(|p| p.in_tree_name)
}

/// The CSI driver that replaces the in-tree plugin `in_tree` (`ebs.csi.aws.com` for
/// `kubernetes.io/aws-ebs`); `None` for plugins without a migration path.
pub fn csi_name_of(in_tree: &str) -> Option<&'static str> {
    plugin_by_in_tree_name(in_tree).map(|p| p.csi_driver)
}

fn plugin_by_in_tree_name(in_tree: &str) -> Option<&'static InTreePlugin> {
    IN_TREE_PLUGINS.iter().find(|p| p.in_tree_name == in_tree)
}

fn plugin_by_csi_driver(csi_driver: &str) -> Option<&'static InTreePlugin> {
    IN_TREE_PLUGINS.iter().find(|p| p.csi_driver == csi_driver)
}

/// The in-tree plugin of a PV spec with an in-tree source that has a migration path.
pub fn in_tree_plugin(spec: &PersistentVolumeSpec) -> Option<&'static InTreePlugin> {
    let kind = if spec.aws_elastic_block_store.is_some() {
        Kind::AwsEbs
    } else if spec.gce_persistent_disk.is_some() {
        Kind::GcePd
    } else if spec.azure_disk.is_some() {
        Kind::AzureDisk
    } else if spec.azure_file.is_some() {
        Kind::AzureFile
    } else if spec.cinder.is_some() {
        Kind::Cinder
    } else if spec.vsphere_volume.is_some() {
        Kind::VSphere
    } else if spec.portworx_volume.is_some() {
        Kind::Portworx
    } else {
        return None;
    };
    IN_TREE_PLUGINS.iter().find(|p| p.kind == kind)
}

/// Translates a PV with an in-tree source into the PV the replacing CSI driver sees: a CSI
/// source instead of the in-tree one, zone topology under the driver's key, and (GCE PD) the
/// access modes the driver accepts. `Ok(None)` when the PV has no migratable in-tree source.
pub fn translate_in_tree_pv(
    pv: &PersistentVolume,
) -> Result<Option<PersistentVolume>, TranslationError> {
    let Some(spec) = pv.spec.as_ref() else {
        return Ok(None);
    };
    let Some(plugin) = in_tree_plugin(spec) else {
        return Ok(None);
    };
    let csi = csi_source(plugin, pv, spec)?;
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let mut translated = pv.clone();
    let spec = translated
        .spec
        .get_or_insert_with(PersistentVolumeSpec::default);
    match plugin.kind {
        Kind::AwsEbs => translate_topology(spec, &labels, EBS_TOPOLOGY_KEY),
        Kind::GcePd => {
            translate_topology(spec, &labels, GCE_TOPOLOGY_KEY);
            spec.access_modes = gce_access_modes(spec.access_modes.take());
        }
        Kind::Cinder => translate_topology(spec, &labels, CINDER_TOPOLOGY_KEY),
        Kind::VSphere => translate_vsphere_topology(spec, &labels),
        Kind::AzureDisk | Kind::AzureFile | Kind::Portworx => {}
    }
    spec.aws_elastic_block_store = None;
    spec.gce_persistent_disk = None;
    spec.azure_disk = None;
    spec.azure_file = None;
    spec.cinder = None;
    spec.vsphere_volume = None;
    spec.portworx_volume = None;
    spec.csi = Some(csi);
    Ok(Some(translated))
}

/// The handle a driver's ListVolumes reports for a migrated volume: GCE PD handles translated
/// from in-tree PVs lack the project (and maybe the zone), which the node ID supplies.
pub fn repair_volume_handle(
    driver: &str,
    volume_handle: &str,
    node_id: &str,
) -> Result<String, TranslationError> {
    let plugin = plugin_by_csi_driver(driver)
        .ok_or_else(|| TranslationError::NotMigrationTarget(driver.to_string()))?;
    if plugin.kind != Kind::GcePd {
        return Ok(volume_handle.to_string());
    }
    // projects/{project}/{zones|regions}/{location}/disks/{name}
    let volume: Vec<&str> = volume_handle.split('/').collect();
    if volume.len() < 6 {
        return Err(TranslationError::VolumeHandleElements(volume.len()));
    }
    if volume[1] != GCE_UNSPECIFIED {
        return Ok(volume_handle.to_string());
    }
    // projects/{project}/zones/{zone}/instances/{name}
    let node: Vec<&str> = node_id.split('/').collect();
    if node.len() < 6 {
        return Err(TranslationError::NodeIdElements(node.len()));
    }
    let (project, disk) = (node[1], volume[5]);
    match volume[2] {
        "zones" => {
            let zone = if volume[3] == GCE_UNSPECIFIED {
                node[3]
            } else {
                volume[3]
            };
            Ok(format!("projects/{project}/zones/{zone}/disks/{disk}"))
        }
        "regions" => {
            let region = if volume[3] == GCE_UNSPECIFIED {
                gce_region(&[node[3]]).map_err(|reason| TranslationError::GceNodeRegion {
                    zone: node[3].to_string(),
                    reason,
                })?
            } else {
                volume[3].to_string()
            };
            Ok(format!("projects/{project}/regions/{region}/disks/{disk}"))
        }
        other => Err(TranslationError::GceRegionality(other.to_string())),
    }
}

fn csi_source(
    plugin: &InTreePlugin,
    pv: &PersistentVolume,
    spec: &PersistentVolumeSpec,
) -> Result<CSIPersistentVolumeSource, TranslationError> {
    let mut csi = CSIPersistentVolumeSource {
        driver: plugin.csi_driver.to_string(),
        ..Default::default()
    };
    let mut attributes = BTreeMap::new();
    match plugin.kind {
        Kind::AwsEbs => {
            let ebs = spec.aws_elastic_block_store.clone().unwrap_or_default();
            csi.volume_handle =
                ebs_volume_id(&ebs.volume_id).map_err(TranslationError::EbsVolumeId)?;
            csi.read_only = ebs.read_only;
            csi.fs_type = ebs.fs_type;
            attributes.insert(
                "partition".to_string(),
                ebs.partition.unwrap_or(0).to_string(),
            );
        }
        Kind::GcePd => {
            let gce = spec.gce_persistent_disk.clone().unwrap_or_default();
            csi.volume_handle = gce_volume_id(pv, &gce.pd_name)?;
            csi.read_only = gce.read_only;
            csi.fs_type = gce.fs_type;
            let partition = gce.partition.filter(|p| *p != 0);
            attributes.insert(
                "partition".to_string(),
                partition.map(|p| p.to_string()).unwrap_or_default(),
            );
        }
        Kind::AzureDisk => {
            let disk = spec.azure_disk.clone().unwrap_or_default();
            // Only managed disks have a CSI driver; unmanaged (blob) disks cannot migrate.
            if let Some(kind) = disk
                .kind
                .filter(|k| !k.eq_ignore_ascii_case(AZURE_MANAGED_DISK))
            {
                return Err(TranslationError::AzureDiskKind(kind));
            }
            csi.volume_handle = disk.disk_uri;
            attributes.insert("kind".to_string(), AZURE_MANAGED_DISK.to_string());
            if let Some(mode) = disk.caching_mode {
                attributes.insert("cachingmode".to_string(), mode);
            }
            if let Some(fs_type) = disk.fs_type {
                attributes.insert("fstype".to_string(), fs_type.clone());
                csi.fs_type = Some(fs_type);
            }
            csi.read_only = disk.read_only;
        }
        Kind::AzureFile => {
            let file = spec.azure_file.clone().unwrap_or_default();
            let account = azure_storage_account(&file.secret_name)
                .unwrap_or(&file.secret_name)
                .to_string();
            let resource_group = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(AZURE_FILE_RESOURCE_GROUP_ANNOTATION))
                .cloned()
                .unwrap_or_default();
            // The secret is read when mounting; without a namespace of its own, the claim's.
            let namespace = match &file.secret_namespace {
                Some(namespace) => namespace.clone(),
                None => spec
                    .claim_ref
                    .as_ref()
                    .and_then(|c| c.namespace.clone())
                    .unwrap_or_default(),
            };
            if namespace.is_empty() {
                return Err(TranslationError::AzureFileSecretNamespace);
            }
            let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
            csi.volume_handle = format!(
                "{resource_group}#{account}#{}#{pv_name}#{namespace}",
                file.share_name
            );
            csi.node_stage_secret_ref = Some(SecretReference {
                name: Some(file.secret_name),
                namespace: Some(namespace),
            });
            csi.read_only = file.read_only;
            attributes.insert("sharename".to_string(), file.share_name);
        }
        Kind::Cinder => {
            let cinder = spec.cinder.clone().unwrap_or_default();
            csi.volume_handle = cinder.volume_id;
            csi.read_only = cinder.read_only;
            csi.fs_type = cinder.fs_type;
        }
        Kind::VSphere => {
            let vsphere = spec.vsphere_volume.clone().unwrap_or_default();
            csi.volume_handle = vsphere.volume_path;
            csi.fs_type = vsphere.fs_type;
            if let Some(policy) = vsphere.storage_policy_name.filter(|p| !p.is_empty()) {
                attributes.insert("storagepolicyname".to_string(), policy);
            }
        }
        Kind::Portworx => {
            // The in-tree translation does not carry readOnly over for Portworx.
            let portworx = spec.portworx_volume.clone().unwrap_or_default();
            csi.volume_handle = portworx.volume_id;
            csi.fs_type = portworx.fs_type;
            // Auth secret annotations (both needed) become the secrets of every CSI call.
            let annotations = pv.metadata.annotations.as_ref();
            let annotation = |key: &str| annotations.and_then(|a| a.get(key)).cloned();
            if let (Some(name), Some(namespace)) = (
                annotation(PORTWORX_AUTH_SECRET_NAME),
                annotation(PORTWORX_AUTH_SECRET_NAMESPACE),
            ) {
                let secret = Some(SecretReference {
                    name: Some(name),
                    namespace: Some(namespace),
                });
                csi.controller_publish_secret_ref = secret.clone();
                csi.node_stage_secret_ref = secret.clone();
                csi.node_publish_secret_ref = secret.clone();
                csi.controller_expand_secret_ref = secret.clone();
                csi.node_expand_secret_ref = secret;
            }
        }
    }
    csi.fs_type = csi.fs_type.filter(|f| !f.is_empty());
    csi.read_only = csi.read_only.filter(|r| *r);
    csi.volume_attributes = Some(attributes);
    Ok(csi)
}

/// The EBS volume ID of an in-tree volume ID: `aws://<zone>/<id>`, `aws:///<id>` or `<id>`.
fn ebs_volume_id(kubernetes_id: &str) -> Result<String, String> {
    let Some(rest) = kubernetes_id.strip_prefix("aws://") else {
        return Ok(kubernetes_id.to_string());
    };
    // Errors read as Go's URL parser words them.
    let invalid = |reason: String| {
        format!("Invalid disk name ({kubernetes_id}): parse {kubernetes_id:?}: {reason}")
    };
    if kubernetes_id.chars().any(|c| c.is_ascii_control()) {
        return Err(invalid(
            "net/url: invalid control character in URL".to_string(),
        ));
    }
    // The URL path: after the authority, before any query or fragment, percent-decoded.
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let path = rest.find('/').map_or("", |at| &rest[at..]);
    let path =
        percent_decode(path).map_err(|escape| invalid(format!("invalid URL escape {escape:?}")))?;
    let id = path.trim_matches('/');
    if id.starts_with("vol-") && !id.contains('/') {
        Ok(id.to_string())
    } else {
        Err(format!("Invalid format for AWS volume ({kubernetes_id})"))
    }
}

/// Percent-decodes `text`; the error is the first invalid escape.
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            decoded.push(bytes[i]);
            i += 1;
            continue;
        }
        let hex = bytes.get(i + 1..i + 3).and_then(|pair| {
            let pair = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(pair, 16).ok()
        });
        match hex {
            Some(byte) => decoded.push(byte),
            None => {
                let end = (i + 3).min(bytes.len());
                return Err(String::from_utf8_lossy(&bytes[i..end]).into_owned());
            }
        }
        i += 3;
    }
    Ok(String::from_utf8_lossy(&decoded).into_owned())
}

/// The GCE PD handle of an in-tree disk: zonal or regional from the PV's zone label, with the
/// project (and without a label, the zone) left for [`repair_volume_handle`].
fn gce_volume_id(pv: &PersistentVolume, pd_name: &str) -> Result<String, TranslationError> {
    let labels = pv.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map_or("", String::as_str);
    let mut zones_label = label(BETA_ZONE_LABEL);
    if zones_label.is_empty() {
        zones_label = label(ZONE_LABEL);
    }
    let zones: Vec<&str> = zones_label.split(MULTI_ZONE_DELIMITER).collect();
    Ok(match zones.as_slice() {
        [""] => format!("projects/{GCE_UNSPECIFIED}/zones/{GCE_UNSPECIFIED}/disks/{pd_name}"),
        [zone] => format!("projects/{GCE_UNSPECIFIED}/zones/{zone}/disks/{pd_name}"),
        _ => {
            let region = gce_region(&zones).map_err(TranslationError::GceRegion)?;
            format!("projects/{GCE_UNSPECIFIED}/regions/{region}/disks/{pd_name}")
        }
    })
}

/// The one region of GCE zones (`{locale}-{region}-{zone}`).
fn gce_region(zones: &[&str]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_string());
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        if parts.len() != 3 {
            return Err(format!(
                "zone in unexpected format, expected: {{locale}}-{{region}}-{{zone}}, got: {zone}"
            ));
        }
        regions.insert(parts[..2].join("-"));
    }
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {}",
            go_set(&regions)
        )),
    }
}

/// A set as Go prints one: `map[a:{} b:{}]`.
fn go_set(set: &BTreeSet<String>) -> String {
    let members: Vec<String> = set.iter().map(|m| format!("{m}:{{}}")).collect();
    format!("map[{}]", members.join(" "))
}

/// GCE PD never supported ReadWriteMany nor ReadOnlyMany together with ReadWriteOnce, but the
/// in-tree plugin accepted both and attached read-write to one node; the driver rejects them, so
/// such volumes are presented as ReadWriteOnce.
fn gce_access_modes(modes: Option<Vec<String>>) -> Option<Vec<String>> {
    let modes = modes?;
    if modes.is_empty() {
        return None;
    }
    let has = |mode: &str| modes.iter().any(|m| m == mode);
    let read_write_once = has("ReadWriteOnce") || has("ReadWriteMany");
    let mode = if !read_write_once && has("ReadOnlyMany") {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    };
    Some(vec![mode.to_string()])
}

/// The storage account in an Azure File secret name `azure-storage-account-<account>-secret`
/// (found anywhere in the name, the account as long as possible).
fn azure_storage_account(secret_name: &str) -> Option<&str> {
    let mut search_from = 0;
    while let Some(found) = secret_name[search_from..].find(AZURE_FILE_SECRET_PREFIX) {
        let start = search_from + found + AZURE_FILE_SECRET_PREFIX.len();
        if let Some(end) = secret_name[start..].rfind(AZURE_FILE_SECRET_SUFFIX)
            && end > 0
        {
            return Some(&secret_name[start..start + end]);
        }
        search_from += found + 1;
    }
    None
}

/// Moves the zone topology of an in-tree PV to the driver's topology key: the zone
/// requirements of its node affinity, or else the zones of its zone label; beta region
/// requirements become GA ones so that nodes with only GA labels still match.
fn translate_topology(
    spec: &mut PersistentVolumeSpec,
    labels: &BTreeMap<String, String>,
    csi_key: &str,
) {
    let (zone_label, region_label) = topology_labels(spec, labels);
    if !topology_values(spec, zone_label).is_empty() {
        replace_topology_key(spec, zone_label, csi_key);
    } else if let Some(zones) = labels.get(zone_label) {
        add_topology(spec, csi_key, zones.split(MULTI_ZONE_DELIMITER));
    }
    if region_label == BETA_REGION_LABEL && !topology_values(spec, region_label).is_empty() {
        replace_topology_key(spec, region_label, REGION_LABEL);
    }
}

/// vSphere's variant: zone and region both move to the driver's keys, and a label is taken
/// whole (not split into several zones).
fn translate_vsphere_topology(spec: &mut PersistentVolumeSpec, labels: &BTreeMap<String, String>) {
    let (zone_label, region_label) = topology_labels(spec, labels);
    for (label, csi_key) in [
        (zone_label, VSPHERE_ZONE_KEY),
        (region_label, VSPHERE_REGION_KEY),
    ] {
        if !topology_values(spec, label).is_empty() {
            replace_topology_key(spec, label, csi_key);
        } else if let Some(value) = labels.get(label) {
            add_topology(spec, csi_key, std::iter::once(value.as_str()));
        }
    }
}

/// Which zone and region labels the PV uses: GA or beta, from its node affinity first.
fn topology_labels(
    spec: &PersistentVolumeSpec,
    labels: &BTreeMap<String, String>,
) -> (&'static str, &'static str) {
    let in_affinity = |key: &str| match_expressions(spec).any(|r| r.key == key);
    if in_affinity(ZONE_LABEL) {
        (ZONE_LABEL, REGION_LABEL)
    } else if in_affinity(BETA_ZONE_LABEL) {
        (BETA_ZONE_LABEL, BETA_REGION_LABEL)
    } else if labels.contains_key(ZONE_LABEL) {
        (ZONE_LABEL, REGION_LABEL)
    } else if labels.contains_key(BETA_ZONE_LABEL) {
        (BETA_ZONE_LABEL, BETA_REGION_LABEL)
    } else {
        (ZONE_LABEL, REGION_LABEL)
    }
}

fn match_expressions(
    spec: &PersistentVolumeSpec,
) -> impl Iterator<Item = &NodeSelectorRequirement> {
    spec.node_affinity
        .iter()
        .filter_map(|a| a.required.as_ref())
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
}

/// The distinct values, sorted, of the node affinity requirements on `key`.
fn topology_values(spec: &PersistentVolumeSpec, key: &str) -> BTreeSet<String> {
    match_expressions(spec)
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten().cloned())
        .collect()
}

fn replace_topology_key(spec: &mut PersistentVolumeSpec, old: &str, new: &str) {
    let terms = spec
        .node_affinity
        .iter_mut()
        .filter_map(|a| a.required.as_mut())
        .flat_map(|r| r.node_selector_terms.iter_mut());
    for term in terms {
        for requirement in term.match_expressions.iter_mut().flatten() {
            if requirement.key == old {
                requirement.key = new.to_string();
            }
        }
    }
}

/// Requires `zones` under `key` in every node selector term (creating one if there is none).
fn add_topology<'a>(
    spec: &mut PersistentVolumeSpec,
    key: &str,
    zones: impl Iterator<Item = &'a str>,
) {
    let zones: BTreeSet<String> = zones
        .map(str::trim)
        .filter(|z| !z.is_empty())
        .map(str::to_string)
        .collect();
    if zones.is_empty() {
        return;
    }
    let affinity = spec
        .node_affinity
        .get_or_insert_with(VolumeNodeAffinity::default);
    let required = affinity.required.get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required
            .node_selector_terms
            .push(NodeSelectorTerm::default());
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".to_string(),
        values: Some(zones.into_iter().collect()),
    };
    for term in &mut required.node_selector_terms {
        term.match_expressions
            .get_or_insert_with(Vec::new)
            .push(requirement.clone());
    }
}

#[cfg(test)]
mod tests;
