//! PersistentVolumes with the CSI source of a migration target translated back to the in-tree
//! source of the plugin it replaces (upstream's `TranslateCSIPVToInTree`): what a provisioner
//! writes to the API for claims of a StorageClass whose provisioner is an in-tree plugin.
//!
//! Zone topology under the driver's key moves to the zone label the PV already uses (GA unless
//! it only has the beta one), EBS and GCE PD terms get the region of their zones, and the PV gets
//! zone (and region) labels it lacks.

use std::collections::{BTreeMap, BTreeSet};
use std::num::IntErrorKind;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, NodeSelectorRequirement,
    PersistentVolume, PersistentVolumeSpec, PortworxVolumeSource, VsphereVirtualDiskVolumeSource,
};

use super::{
    AZURE_FILE_RESOURCE_GROUP_ANNOTATION, AZURE_FILE_SECRET_PREFIX, AZURE_FILE_SECRET_SUFFIX,
    AZURE_MANAGED_DISK, CINDER_TOPOLOGY_KEY, EBS_TOPOLOGY_KEY, GCE_TOPOLOGY_KEY, Kind,
    MULTI_ZONE_DELIMITER, VSPHERE_REGION_KEY, VSPHERE_ZONE_KEY, gce_region, go_set,
    plugin_by_csi_driver, replace_topology_key, topology_labels, topology_values,
};

/// Why a CSI PersistentVolume cannot be translated; the texts are Kubernetes' own, except that
/// topology errors name the PV instead of printing all of it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsiToInTreeError {
    #[error("CSI persistent volume was nil")]
    NotCsi,
    #[error("could not find in-tree plugin translation logic for {0}")]
    UnknownDriver(String),
    #[error("failed to convert partition {value} to integer: {reason}")]
    EbsPartition { value: String, reason: String },
    #[error("Failed to convert partition {value} to integer: {reason}")]
    GcePartition { value: String, reason: String },
    #[error("failed to get id components.Got: {0}, wanted 6 components or more. ")]
    GceVolumeId(usize),
    #[error("could not get disk name from {uri}, correct format: {format}")]
    AzureDiskName { uri: String, format: &'static str },
    #[error("error parsing volume id: {0:?}, should at least contain two #")]
    AzureFileVolumeId(String),
    #[error(
        "failed to translate topology. PV:{pv}. Error:Failed to handle region topology. error: {reason}"
    )]
    Region { pv: String, reason: String },
}

/// Volume attributes the drivers set (or that the in-tree translation set).
const PARTITION: &str = "partition";
const AZURE_DISK_CACHING_MODE: &str = "cachingmode";
const AZURE_DISK_FS_TYPE: &str = "fstype";
const AZURE_FILE_SHARE_NAME: &str = "sharename";
const AZURE_FILE_SECRET_NAME: &str = "secretname";
const AZURE_FILE_SECRET_NAMESPACE: &str = "secretnamespace";
const AZURE_FILE_DEFAULT_SECRET_NAMESPACE: &str = "default";
/// The vSphere driver reports the disk's path here when a class asked for `csimigration`.
const VSPHERE_VOLUME_PATH: &str = "initialvolumefilepath";

/// The forms of Azure disk URIs, in Go regular expression syntax as upstream's errors print them.
const AZURE_MANAGED_DISK_FORMAT: &str =
    ".*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)";
const AZURE_UNMANAGED_DISK_FORMAT: &str = "http(?:.*)://(?:.*)/vhds/(.+)";

type RegionParser = fn(&[&str]) -> Result<String, String>;

/// Translates a PV whose CSI source names a migration target into the PV of the in-tree plugin:
/// the CSI source (and its volume attributes) replaced by the in-tree source, zone topology
/// under Kubernetes' labels.
pub fn translate_csi_pv_to_in_tree(
    pv: &PersistentVolume,
) -> Result<PersistentVolume, CsiToInTreeError> {
    let csi = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.csi.clone())
        .ok_or(CsiToInTreeError::NotCsi)?;
    let plugin = plugin_by_csi_driver(&csi.driver)
        .ok_or_else(|| CsiToInTreeError::UnknownDriver(csi.driver.clone()))?;
    let attributes = csi.volume_attributes.unwrap_or_default();
    // Go's zero values are omitted from the API objects.
    let fs_type = csi.fs_type.filter(|f| !f.is_empty());
    let read_only = csi.read_only.filter(|r| *r);
    let handle = csi.volume_handle;
    let mut translated = pv.clone();
    match plugin.kind {
        Kind::AwsEbs => {
            let partition = match attributes.get(PARTITION) {
                Some(value) => go_atoi(value).map_err(|reason| CsiToInTreeError::EbsPartition {
                    value: value.clone(),
                    reason,
                })?,
                None => 0,
            };
            topology_to_in_tree(&mut translated, EBS_TOPOLOGY_KEY, Some(aws_region))?;
            spec(&mut translated).aws_elastic_block_store =
                Some(AWSElasticBlockStoreVolumeSource {
                    volume_id: handle,
                    fs_type,
                    read_only,
                    partition: (partition != 0).then_some(partition),
                });
        }
        Kind::GcePd => {
            // projects/{project}/{zones|regions}/{location}/disks/{name}
            let elements: Vec<&str> = handle.split('/').collect();
            let pd_name = elements
                .get(5)
                .ok_or(CsiToInTreeError::GceVolumeId(elements.len()))?
                .to_string();
            let partition = match attributes.get(PARTITION).filter(|p| !p.is_empty()) {
                Some(value) => go_atoi(value).map_err(|reason| CsiToInTreeError::GcePartition {
                    value: value.clone(),
                    reason,
                })?,
                None => 0,
            };
            topology_to_in_tree(&mut translated, GCE_TOPOLOGY_KEY, Some(gce_region))?;
            spec(&mut translated).gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                pd_name,
                fs_type,
                read_only,
                partition: (partition != 0).then_some(partition),
            });
        }
        Kind::AzureDisk => {
            let disk_name = azure_disk_name(&handle)?;
            let mut disk = AzureDiskVolumeSource {
                disk_name,
                disk_uri: handle,
                // Pointers upstream: set even when empty or false.
                fs_type: Some(fs_type.unwrap_or_default()),
                read_only: Some(read_only.unwrap_or_default()),
                kind: Some(AZURE_MANAGED_DISK.to_string()),
                caching_mode: None,
            };
            for (key, value) in &attributes {
                match key.to_lowercase().as_str() {
                    AZURE_DISK_CACHING_MODE if !value.is_empty() => {
                        disk.caching_mode = Some(value.clone());
                    }
                    AZURE_DISK_FS_TYPE if !value.is_empty() => disk.fs_type = Some(value.clone()),
                    _ => {}
                }
            }
            spec(&mut translated).azure_disk = Some(disk);
        }
        Kind::AzureFile => {
            let mut file = AzureFilePersistentVolumeSource {
                read_only,
                ..Default::default()
            };
            for (key, value) in &attributes {
                match key.to_lowercase().as_str() {
                    AZURE_FILE_SHARE_NAME => file.share_name = value.clone(),
                    AZURE_FILE_SECRET_NAME => file.secret_name = value.clone(),
                    AZURE_FILE_SECRET_NAMESPACE => file.secret_namespace = Some(value.clone()),
                    _ => {}
                }
            }
            if let Some(secret) = csi
                .node_stage_secret_ref
                .filter(|s| s.name.as_deref().is_some_and(|n| !n.is_empty()))
            {
                file.secret_name = secret.name.unwrap_or_default();
                file.secret_namespace = Some(secret.namespace.unwrap_or_default());
            }
            // {resource group}#{account}#{share}[#…]
            let mut resource_group = String::new();
            if file.share_name.is_empty() || file.secret_name.is_empty() {
                let elements: Vec<&str> = handle.split('#').collect();
                let [group, account, share, ..] = elements[..] else {
                    return Err(CsiToInTreeError::AzureFileVolumeId(handle));
                };
                if file.share_name.is_empty() {
                    file.share_name = share.to_string();
                }
                if file.secret_name.is_empty() {
                    file.secret_name =
                        format!("{AZURE_FILE_SECRET_PREFIX}{account}{AZURE_FILE_SECRET_SUFFIX}");
                }
                resource_group = group.to_string();
            }
            file.secret_namespace
                .get_or_insert_with(|| AZURE_FILE_DEFAULT_SECRET_NAMESPACE.to_string());
            if !resource_group.is_empty() {
                translated
                    .metadata
                    .annotations
                    .get_or_insert_with(BTreeMap::new)
                    .insert(
                        AZURE_FILE_RESOURCE_GROUP_ANNOTATION.to_string(),
                        resource_group,
                    );
            }
            spec(&mut translated).azure_file = Some(file);
        }
        Kind::Cinder => {
            // The region of a Cinder zone cannot be told.
            topology_to_in_tree(&mut translated, CINDER_TOPOLOGY_KEY, None)?;
            spec(&mut translated).cinder = Some(CinderPersistentVolumeSource {
                volume_id: handle,
                fs_type,
                read_only,
                secret_ref: None,
            });
        }
        Kind::VSphere => {
            vsphere_topology_to_in_tree(&mut translated);
            spec(&mut translated).vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
                volume_path: attributes
                    .get(VSPHERE_VOLUME_PATH)
                    .cloned()
                    .unwrap_or_default(),
                fs_type,
                ..Default::default()
            });
        }
        Kind::Portworx => {
            spec(&mut translated).portworx_volume = Some(PortworxVolumeSource {
                volume_id: handle,
                fs_type,
                read_only,
            });
        }
    }
    spec(&mut translated).csi = None;
    Ok(translated)
}

fn spec(pv: &mut PersistentVolume) -> &mut PersistentVolumeSpec {
    pv.spec.get_or_insert_with(PersistentVolumeSpec::default)
}

/// Go's `strconv.Atoi` (an `int` truncated to 32 bits as upstream truncates it), with its error.
fn go_atoi(text: &str) -> Result<i32, String> {
    match text.parse::<i64>() {
        Ok(value) => Ok(value as i32),
        Err(error) => {
            let reason = match error.kind() {
                IntErrorKind::PosOverflow | IntErrorKind::NegOverflow => "value out of range",
                _ => "invalid syntax",
            };
            Err(format!("strconv.Atoi: parsing {text:?}: {reason}"))
        }
    }
}

/// Moves node affinity on the driver's zone key to the PV's zone label, adds the region of
/// its zones to every term without one (when the region can be told) and labels the PV with
/// its zones (`z1__z2`) and its one region, unless it has those labels already.
fn topology_to_in_tree(
    pv: &mut PersistentVolume,
    csi_key: &str,
    region_of: Option<RegionParser>,
) -> Result<(), CsiToInTreeError> {
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let spec = spec(pv);
    let (zone_label, _) = topology_labels(spec, &labels);
    replace_topology_key(spec, csi_key, zone_label);
    let mut new_labels = Vec::new();
    if let Some(region_of) = region_of {
        let region =
            add_regions(spec, &labels, region_of).map_err(|reason| CsiToInTreeError::Region {
                pv: pv_name,
                reason,
            })?;
        new_labels.extend(region);
    }
    let zones = topology_values(spec, zone_label);
    if !zones.is_empty() {
        let zones: Vec<String> = zones.into_iter().collect();
        new_labels.push((zone_label, zones.join(MULTI_ZONE_DELIMITER)));
    }
    set_missing_labels(pv, new_labels);
    Ok(())
}

/// Adds to every node selector term without a region requirement one on the region of its
/// zones. Returns the region label to set when all terms agree on one region.
fn add_regions(
    spec: &mut PersistentVolumeSpec,
    labels: &BTreeMap<String, String>,
    region_of: RegionParser,
) -> Result<Option<(&'static str, String)>, String> {
    let (zone_label, region_label) = topology_labels(spec, labels);
    let Some(terms) = spec
        .node_affinity
        .as_mut()
        .and_then(|a| a.required.as_mut())
        .map(|r| &mut r.node_selector_terms)
        .filter(|terms| !terms.is_empty())
    else {
        return Ok(None);
    };
    for term in terms.iter_mut() {
        let expressions = term.match_expressions.get_or_insert_with(Vec::new);
        let mut zones = Vec::new();
        let mut has_region = false;
        for requirement in expressions.iter() {
            if requirement.key == region_label {
                has_region = true;
                break;
            }
            if requirement.key == zone_label {
                zones.extend(requirement.values.iter().flatten().map(String::as_str));
            }
        }
        if has_region {
            continue;
        }
        let region = region_of(&zones)?;
        expressions.push(NodeSelectorRequirement {
            key: region_label.to_string(),
            operator: "In".to_string(),
            values: Some(vec![region]),
        });
    }
    let regions = topology_values(spec, region_label);
    Ok(match regions.len() {
        1 => regions.into_iter().next().map(|r| (region_label, r)),
        _ => None,
    })
}

/// vSphere's variant: zone and region keys of the driver both move to Kubernetes' labels, and
/// the labels get the first (sorted) zone and region.
fn vsphere_topology_to_in_tree(pv: &mut PersistentVolume) {
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    let spec = spec(pv);
    let (zone_label, region_label) = topology_labels(spec, &labels);
    replace_topology_key(spec, VSPHERE_ZONE_KEY, zone_label);
    replace_topology_key(spec, VSPHERE_REGION_KEY, region_label);
    let new_labels: Vec<(&str, String)> = [zone_label, region_label]
        .into_iter()
        .filter_map(|label| {
            let first = topology_values(spec, label).into_iter().next()?;
            Some((label, first))
        })
        .collect();
    set_missing_labels(pv, new_labels);
}

fn set_missing_labels(pv: &mut PersistentVolume, new_labels: Vec<(&str, String)>) {
    if new_labels.is_empty() {
        return;
    }
    let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (key, value) in new_labels {
        labels.entry(key.to_string()).or_insert(value);
    }
}

/// The one region of AWS zones: `us-east-1a` (and `us-gov-west-1a`) → `us-east-1`, local and
/// wavelength zones (`us-west-2-lax-1a`, `us-east-1-wl1-bos-wlz-1`) → their first three parts.
fn aws_region(zones: &[&str]) -> Result<String, String> {
    if zones.is_empty() {
        return Err("no zones specified".to_string());
    }
    let mut regions = BTreeSet::new();
    for zone in zones {
        let parts: Vec<&str> = zone.split('-').collect();
        let last = parts.last().copied().unwrap_or_default();
        if (parts.len() == 3 || parts.len() == 4) && last.len() == 2 {
            let mut region = parts[..parts.len() - 1].join("-");
            region.push('-');
            region.push_str(&String::from_utf8_lossy(&last.as_bytes()[..1]));
            regions.insert(region);
        } else if parts.len() == 5 || parts.len() == 7 {
            regions.insert(parts[..3].join("-"));
        } else {
            return Err(format!(
                "Unexpected zone format: {zone} is not a valid AWS zone"
            ));
        }
    }
    match regions.len() {
        1 => Ok(regions.into_iter().next().unwrap_or_default()),
        _ => Err(format!(
            "multiple or no regions gotten from zones, got: {}",
            go_set(&regions)
        )),
    }
}

/// The disk name in an Azure disk URI, found as upstream's regular expressions find it:
/// after the last `/providers/Microsoft.Compute/disks/` (managed disks) or `/vhds/` (URLs of
/// unmanaged disks) that follows the other parts of the form.
fn azure_disk_name(uri: &str) -> Result<String, CsiToInTreeError> {
    let unmanaged = uri.len() > 4 && uri.as_bytes()[..4].eq_ignore_ascii_case(b"http");
    let (format, markers): (&'static str, &[&str]) = if unmanaged {
        (AZURE_UNMANAGED_DISK_FORMAT, &["http", "://", "/vhds/"])
    } else {
        (
            AZURE_MANAGED_DISK_FORMAT,
            &[
                "/subscriptions/",
                "/resourceGroups/",
                "/providers/Microsoft.Compute/disks/",
            ],
        )
    };
    // `.` matches no line break: the first line that has the form holds the match.
    uri.split('\n')
        .find_map(|line| capture_after_markers(line, markers))
        .map(str::to_string)
        .ok_or_else(|| CsiToInTreeError::AzureDiskName {
            uri: uri.to_string(),
            format,
        })
}

/// What `m1.*m2.*…mn(.+)` captures in `line` (`.` in a marker matches any character): the
/// rest of the line after the last `mn` that follows the earliest `m1`, `m2`, … in order.
fn capture_after_markers<'a>(line: &'a str, markers: &[&str]) -> Option<&'a str> {
    let (last, leading) = markers.split_last()?;
    let mut from = 0;
    for marker in leading {
        let at = line
            .char_indices()
            .map(|(i, _)| i)
            .filter(|i| *i >= from)
            .find_map(|i| marker_end(line, i, marker))?;
        from = at;
    }
    line.char_indices()
        .rev()
        .map(|(i, _)| i)
        .take_while(|i| *i >= from)
        .filter_map(|i| marker_end(line, i, last))
        .find(|end| *end < line.len())
        .map(|end| &line[end..])
}

/// Where `marker` ends if it occurs in `line` at byte `at`; `.` in it matches any character.
fn marker_end(line: &str, at: usize, marker: &str) -> Option<usize> {
    let mut rest = line[at..].char_indices();
    let mut end = at;
    for expected in marker.chars() {
        let (i, found) = rest.next()?;
        if expected != '.' && expected != found {
            return None;
        }
        end = at + i + found.len_utf8();
    }
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::super::translate_in_tree_pv;
    use super::*;
    use serde_json::{Value, json};

    fn pv(value: Value) -> PersistentVolume {
        let mut base = json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
        if let (Value::Object(base), Value::Object(value)) = (&mut base, value) {
            for (key, value) in value {
                match (base.get_mut(&key), value) {
                    (Some(Value::Object(inner)), Value::Object(value)) => inner.extend(value),
                    (_, value) => {
                        base.insert(key, value);
                    }
                }
            }
        }
        serde_json::from_value(base).unwrap()
    }

    fn to_in_tree(value: Value) -> Value {
        serde_json::to_value(translate_csi_pv_to_in_tree(&pv(value)).unwrap()).unwrap()
    }

    fn error(value: Value) -> String {
        translate_csi_pv_to_in_tree(&pv(value))
            .unwrap_err()
            .to_string()
    }

    fn affinity(requirements: Value) -> Value {
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": requirements}]}})
    }

    #[test]
    fn not_csi_or_not_migrated() {
        assert_eq!(
            error(json!({"spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}}})),
            "CSI persistent volume was nil"
        );
        let no_spec = PersistentVolume::default();
        assert_eq!(
            translate_csi_pv_to_in_tree(&no_spec),
            Err(CsiToInTreeError::NotCsi)
        );
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h"}}})),
            "could not find in-tree plugin translation logic for hostpath.csi.k8s.io"
        );
    }

    #[test]
    fn aws_ebs() {
        let value = to_in_tree(json!({"spec": {
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "ext4",
                    "readOnly": true, "volumeAttributes": {"partition": "2",
                    "storage.kubernetes.io/csiProvisionerIdentity": "x"}},
            "nodeAffinity": affinity(json!([{"key": "topology.ebs.csi.aws.com/zone",
                "operator": "In", "values": ["us-east-1b", "us-east-1a"]}]))}}));
        assert_eq!(
            value["spec"],
            json!({"accessModes": ["ReadWriteOnce"],
                "awsElasticBlockStore": {"volumeID": "vol-1", "fsType": "ext4",
                                         "readOnly": true, "partition": 2},
                "nodeAffinity": affinity(json!([
                    {"key": ZONE_LABEL, "operator": "In", "values": ["us-east-1b", "us-east-1a"]},
                    {"key": REGION_LABEL, "operator": "In", "values": ["us-east-1"]}]))})
        );
        assert_eq!(
            value["metadata"]["labels"],
            json!({ZONE_LABEL: "us-east-1a__us-east-1b", REGION_LABEL: "us-east-1"})
        );
        // Partition "0" and no topology: nothing but the source.
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "ebs.csi.aws.com",
            "volumeHandle": "vol-2", "volumeAttributes": {"partition": "0"}}}}));
        assert_eq!(
            value["spec"]["awsElasticBlockStore"],
            json!({"volumeID": "vol-2"})
        );
        assert_eq!(value["metadata"].get("labels"), None);
        for (partition, message) in [
            (
                "x",
                "failed to convert partition x to integer: strconv.Atoi: parsing \"x\": invalid syntax",
            ),
            (
                "",
                "failed to convert partition  to integer: strconv.Atoi: parsing \"\": invalid syntax",
            ),
            (
                "99999999999999999999",
                "failed to convert partition 99999999999999999999 to integer: strconv.Atoi: parsing \"99999999999999999999\": value out of range",
            ),
        ] {
            assert_eq!(
                error(json!({"spec": {"csi": {"driver": "ebs.csi.aws.com",
                    "volumeHandle": "vol-1", "volumeAttributes": {"partition": partition}}}})),
                message
            );
        }
    }

    #[test]
    fn ebs_beta_labels_and_existing_regions() {
        // A PV that uses the beta zone label keeps using it; a term with a region keeps it.
        let value = to_in_tree(json!({
            "metadata": {"labels": {BETA_ZONE_LABEL: "mine"}},
            "spec": {"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In",
                             "values": ["us-west-2-lax-1a"]}]},
                        {"matchExpressions": [
                            {"key": BETA_REGION_LABEL, "operator": "In", "values": ["r"]},
                            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In",
                             "values": ["bad"]}]}]}}}}));
        assert_eq!(
            value["spec"]["nodeAffinity"],
            json!({"required": {"nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": BETA_ZONE_LABEL, "operator": "In", "values": ["us-west-2-lax-1a"]},
                    {"key": BETA_REGION_LABEL, "operator": "In", "values": ["us-west-2"]}]},
                {"matchExpressions": [
                    {"key": BETA_REGION_LABEL, "operator": "In", "values": ["r"]},
                    {"key": BETA_ZONE_LABEL, "operator": "In", "values": ["bad"]}]}]}})
        );
        // Two regions: no region label; the zone label was there already.
        assert_eq!(
            value["metadata"]["labels"],
            json!({BETA_ZONE_LABEL: "mine"})
        );
        assert_eq!(
            aws_region(&["us-gov-west-1a", "us-gov-west-1b"]),
            Ok("us-gov-west-1".to_string())
        );
        assert_eq!(
            aws_region(&["us-east-1-wl1-bos-wlz-1"]),
            Ok("us-east-1".to_string())
        );
    }

    #[test]
    fn ebs_region_errors() {
        let with_zones = |zones: Value| {
            error(json!({"spec": {
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                "nodeAffinity": affinity(json!([{"key": "topology.ebs.csi.aws.com/zone",
                    "operator": "In", "values": zones}]))}}))
        };
        assert_eq!(
            with_zones(json!(["us-east-1"])),
            "failed to translate topology. PV:pv-1. Error:Failed to handle region topology. error: Unexpected zone format: us-east-1 is not a valid AWS zone"
        );
        assert_eq!(
            with_zones(json!(["us-east-1a", "eu-west-1a"])),
            "failed to translate topology. PV:pv-1. Error:Failed to handle region topology. error: multiple or no regions gotten from zones, got: map[eu-west-1:{} us-east-1:{}]"
        );
        // A term without zones has no region to tell.
        assert_eq!(
            error(json!({"spec": {
                "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                "nodeAffinity": affinity(json!([{"key": "other", "operator": "In",
                    "values": ["x"]}]))}})),
            "failed to translate topology. PV:pv-1. Error:Failed to handle region topology. error: no zones specified"
        );
    }

    #[test]
    fn gce_pd() {
        let value = to_in_tree(json!({"spec": {
            "csi": {"driver": "pd.csi.storage.gke.io", "fsType": "ext4",
                    "volumeHandle": "projects/p/regions/us-central1/disks/disk-1",
                    "volumeAttributes": {"partition": ""}},
            "nodeAffinity": affinity(json!([{"key": "topology.gke.io/zone", "operator": "In",
                "values": ["us-central1-a", "us-central1-b"]}]))}}));
        assert_eq!(
            value["spec"]["gcePersistentDisk"],
            json!({"pdName": "disk-1", "fsType": "ext4"})
        );
        assert_eq!(value["spec"].get("csi"), None);
        assert_eq!(
            value["spec"]["nodeAffinity"],
            affinity(json!([
                {"key": ZONE_LABEL, "operator": "In", "values": ["us-central1-a", "us-central1-b"]},
                {"key": REGION_LABEL, "operator": "In", "values": ["us-central1"]}]))
        );
        assert_eq!(
            value["metadata"]["labels"],
            json!({ZONE_LABEL: "us-central1-a__us-central1-b", REGION_LABEL: "us-central1"})
        );
        // The disk name is the sixth element, whatever follows.
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "pd.csi.storage.gke.io",
            "volumeHandle": "projects/p/zones/z/disks/d/extra", "readOnly": true,
            "volumeAttributes": {"partition": "1"}}}}));
        assert_eq!(
            value["spec"]["gcePersistentDisk"],
            json!({"pdName": "d", "partition": 1, "readOnly": true})
        );
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "pd.csi.storage.gke.io",
                "volumeHandle": "projects/p/zones/z/disks"}}})),
            "failed to get id components.Got: 5, wanted 6 components or more. "
        );
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "pd.csi.storage.gke.io",
                "volumeHandle": "projects/p/zones/z/disks/d",
                "volumeAttributes": {"partition": "one"}}}})),
            "Failed to convert partition one to integer: strconv.Atoi: parsing \"one\": invalid syntax"
        );
        assert_eq!(
            error(json!({"spec": {
                "csi": {"driver": "pd.csi.storage.gke.io", "volumeHandle": "projects/p/zones/z/disks/d"},
                "nodeAffinity": affinity(json!([{"key": "topology.gke.io/zone",
                    "operator": "In", "values": ["zone-a"]}]))}})),
            "failed to translate topology. PV:pv-1. Error:Failed to handle region topology. error: zone in unexpected format, expected: {locale}-{region}-{zone}, got: zone-a"
        );
    }

    #[test]
    fn azure_disk() {
        let uri = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/disk-1";
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "disk.csi.azure.com",
            "volumeHandle": uri, "fsType": "ext4",
            "volumeAttributes": {"cachingMode": "ReadOnly", "FSTYPE": "xfs", "skuname": "x"}}}}));
        assert_eq!(
            value["spec"]["azureDisk"],
            json!({"diskName": "disk-1", "diskURI": uri, "fsType": "xfs", "readOnly": false,
                   "kind": "Managed", "cachingMode": "ReadOnly"})
        );
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "disk.csi.azure.com",
            "volumeHandle": "https://account.blob.core.windows.net/vhds/disk-2.vhd",
            "readOnly": true, "volumeAttributes": {"cachingmode": ""}}}}));
        assert_eq!(
            value["spec"]["azureDisk"],
            json!({"diskName": "disk-2.vhd",
                   "diskURI": "https://account.blob.core.windows.net/vhds/disk-2.vhd",
                   "fsType": "", "readOnly": true, "kind": "Managed"})
        );
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "disk.csi.azure.com",
                "volumeHandle": "disk-3"}}})),
            "could not get disk name from disk-3, correct format: .*/subscriptions/(?:.*)/resourceGroups/(?:.*)/providers/Microsoft.Compute/disks/(.+)"
        );
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "disk.csi.azure.com",
                "volumeHandle": "https://account/disks/d"}}})),
            "could not get disk name from https://account/disks/d, correct format: http(?:.*)://(?:.*)/vhds/(.+)"
        );
        let name = |uri: &str| azure_disk_name(uri).ok();
        assert_eq!(
            name("x/subscriptions/a/resourceGroups/b/providers/MicrosoftXCompute/disks/d/disks/e"),
            Some("d/disks/e".to_string())
        );
        assert_eq!(
            name(
                "/subscriptions/a/resourceGroups/b/providers/Microsoft.Compute/disks/d/providers/Microsoft.Compute/disks/e"
            ),
            Some("e".to_string())
        );
        assert_eq!(
            name("/resourceGroups/b/subscriptions/a/providers/Microsoft.Compute/disks/d"),
            None
        );
        assert_eq!(
            name("/subscriptions/a/resourceGroups/b/providers/Microsoft.Compute/disks/"),
            None
        );
        assert_eq!(
            name("HTTPS://x/vhds/a\nhttp://y/vhds/b/vhds/c"),
            Some("c".to_string())
        );
    }

    #[test]
    fn azure_file() {
        // The secret of the node stage reference wins over attributes.
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "file.csi.azure.com",
            "volumeHandle": "rg#acct#share#pv-1#ns", "readOnly": true,
            "volumeAttributes": {"shareName": "s1", "secretName": "attr", "secretNamespace": "a"},
            "nodeStageSecretRef": {"name": "ref", "namespace": "refs"}}}}));
        assert_eq!(
            value["spec"]["azureFile"],
            json!({"shareName": "s1", "secretName": "ref", "secretNamespace": "refs",
                   "readOnly": true})
        );
        assert_eq!(value["metadata"].get("annotations"), None);
        // From the handle: share, secret of the account, resource group annotation.
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "file.csi.azure.com",
            "volumeHandle": "rg#acct#share"}}}));
        assert_eq!(
            value["spec"]["azureFile"],
            json!({"shareName": "share", "secretName": "azure-storage-account-acct-secret",
                   "secretNamespace": "default"})
        );
        assert_eq!(
            value["metadata"]["annotations"],
            json!({"kubernetes.io/azure-file-resource-group": "rg"})
        );
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "file.csi.azure.com",
            "volumeHandle": "#acct#share", "volumeAttributes": {"sharename": "s"},
            "nodeStageSecretRef": {"name": ""}}}}));
        assert_eq!(
            value["spec"]["azureFile"],
            json!({"shareName": "s", "secretName": "azure-storage-account-acct-secret",
                   "secretNamespace": "default"})
        );
        assert_eq!(value["metadata"].get("annotations"), None);
        assert_eq!(
            error(json!({"spec": {"csi": {"driver": "file.csi.azure.com",
                "volumeHandle": "rg#acct"}}})),
            "error parsing volume id: \"rg#acct\", should at least contain two #"
        );
    }

    #[test]
    fn cinder() {
        let value = to_in_tree(json!({"spec": {
            "csi": {"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1",
                    "fsType": "ext4", "readOnly": false},
            "nodeAffinity": affinity(json!([{"key": "topology.cinder.csi.openstack.org/zone",
                "operator": "In", "values": ["nova"]}]))}}));
        assert_eq!(
            value["spec"]["cinder"],
            json!({"volumeID": "c-1", "fsType": "ext4"})
        );
        // No region: it cannot be told from a Cinder zone.
        assert_eq!(
            value["spec"]["nodeAffinity"],
            affinity(json!([{"key": ZONE_LABEL, "operator": "In", "values": ["nova"]}]))
        );
        assert_eq!(value["metadata"]["labels"], json!({ZONE_LABEL: "nova"}));
    }

    #[test]
    fn vsphere() {
        let value = to_in_tree(json!({"spec": {
            "csi": {"driver": "csi.vsphere.vmware.com", "volumeHandle": "uuid-1",
                    "fsType": "ext4", "volumeAttributes": {
                        "initialvolumefilepath": "[ds] kubevols/v.vmdk",
                        "storagepolicyname": "gold"}},
            "nodeAffinity": affinity(json!([
                {"key": "topology.csi.vmware.com/zone", "operator": "In", "values": ["z2", "z1"]},
                {"key": "topology.csi.vmware.com/region", "operator": "In", "values": ["r1"]}]))}}));
        assert_eq!(
            value["spec"]["vsphereVolume"],
            json!({"volumePath": "[ds] kubevols/v.vmdk", "fsType": "ext4"})
        );
        assert_eq!(
            value["spec"]["nodeAffinity"],
            affinity(json!([
                {"key": ZONE_LABEL, "operator": "In", "values": ["z2", "z1"]},
                {"key": REGION_LABEL, "operator": "In", "values": ["r1"]}]))
        );
        assert_eq!(
            value["metadata"]["labels"],
            json!({ZONE_LABEL: "z1", REGION_LABEL: "r1"})
        );
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "csi.vsphere.vmware.com",
            "volumeHandle": "uuid-2"}}}));
        assert_eq!(value["spec"]["vsphereVolume"], json!({"volumePath": ""}));
    }

    #[test]
    fn portworx() {
        let value = to_in_tree(json!({"spec": {"csi": {"driver": "pxd.portworx.com",
            "volumeHandle": "px-1", "fsType": "ext4", "readOnly": true,
            "nodeStageSecretRef": {"name": "s", "namespace": "n"},
            "volumeAttributes": {"repl": "2"}}}}));
        assert_eq!(
            value["spec"],
            json!({"accessModes": ["ReadWriteOnce"],
                   "portworxVolume": {"volumeID": "px-1", "fsType": "ext4", "readOnly": true}})
        );
    }

    /// In-tree PV → CSI → in-tree gives the in-tree source back.
    #[test]
    fn round_trips() {
        let sources = [
            json!({"awsElasticBlockStore": {"volumeID": "vol-1", "fsType": "ext4",
                   "partition": 3, "readOnly": true}}),
            json!({"gcePersistentDisk": {"pdName": "disk-1", "fsType": "xfs", "partition": 1,
                   "readOnly": true}}),
            json!({"azureDisk": {"diskName": "d",
                   "diskURI": "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/disks/d",
                   "cachingMode": "ReadWrite", "fsType": "ext4", "kind": "Managed",
                   "readOnly": false}}),
            json!({"azureFile": {"secretName": "azure-storage-account-a-secret",
                   "secretNamespace": "ns", "shareName": "share", "readOnly": true}}),
            json!({"cinder": {"volumeID": "c-1", "fsType": "ext4", "readOnly": true}}),
            json!({"portworxVolume": {"volumeID": "px-1", "fsType": "ext4"}}),
        ];
        for source in sources {
            let mut spec = source.clone();
            spec["nodeAffinity"] = affinity(json!([{"key": ZONE_LABEL, "operator": "In",
                "values": ["us-east-1a"]}]));
            let in_tree = pv(json!({"metadata": {"labels": {ZONE_LABEL: "us-east-1a"}},
                "spec": spec}));
            let csi = translate_in_tree_pv(&in_tree).unwrap().unwrap();
            let back = serde_json::to_value(translate_csi_pv_to_in_tree(&csi).unwrap()).unwrap();
            let (name, fields) = source.as_object().unwrap().iter().next().unwrap();
            assert_eq!(&back["spec"][name], fields, "{name}");
            assert_eq!(back["spec"].get("csi"), None);
            assert_eq!(
                back["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"]
                    [0],
                json!({"key": ZONE_LABEL, "operator": "In", "values": ["us-east-1a"]}),
                "{name}"
            );
            assert_eq!(back["metadata"]["labels"][ZONE_LABEL], "us-east-1a");
        }
        // vSphere: the driver reports the path in an attribute; the policy does not come back.
        let in_tree = pv(
            json!({"spec": {"vsphereVolume": {"volumePath": "[ds] v.vmdk",
            "fsType": "ext4", "storagePolicyName": "gold"}}}),
        );
        let mut csi = translate_in_tree_pv(&in_tree).unwrap().unwrap();
        let source = csi.spec.as_mut().unwrap().csi.as_mut().unwrap();
        let path = source.volume_handle.clone();
        source
            .volume_attributes
            .get_or_insert_with(BTreeMap::new)
            .insert(VSPHERE_VOLUME_PATH.to_string(), path);
        let back = translate_csi_pv_to_in_tree(&csi).unwrap();
        assert_eq!(
            serde_json::to_value(back.spec.unwrap().vsphere_volume).unwrap(),
            json!({"volumePath": "[ds] v.vmdk", "fsType": "ext4"})
        );
    }

    const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
    const REGION_LABEL: &str = "topology.kubernetes.io/region";
    const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
    const BETA_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
}
