use super::*;
use serde_json::{Value, json};

fn pv(value: Value) -> PersistentVolume {
    let mut base = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"}, "spec": {"accessModes": ["ReadWriteOnce"]}});
    merge(&mut base, value);
    serde_json::from_value(base).unwrap()
}

fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p,
    }
}

fn translated(value: Value) -> PersistentVolume {
    translate_in_tree_pv(&pv(value)).unwrap().unwrap()
}

fn csi_json(value: Value) -> Value {
    serde_json::to_value(translated(value).spec.unwrap().csi.unwrap()).unwrap()
}

#[test]
fn plugins_and_drivers() {
    for plugin in IN_TREE_PLUGINS {
        assert!(is_migrated_csi_driver(plugin.csi_driver));
    }
    assert!(!is_migrated_csi_driver("hostpath.csi.k8s.io"));
    let csi = pv(json!({"spec": {"csi": {"driver": "d", "volumeHandle": "h"}}}));
    assert_eq!(in_tree_plugin(csi.spec.as_ref().unwrap()), None);
    assert_eq!(translate_in_tree_pv(&csi), Ok(None));
    let nfs = pv(json!({"spec": {"nfs": {"server": "s", "path": "/"}}}));
    assert_eq!(translate_in_tree_pv(&nfs), Ok(None));
}

#[test]
fn aws_ebs() {
    let value = csi_json(json!({"spec": {"awsElasticBlockStore":
        {"volumeID": "aws://us-east-1a/vol-0123", "fsType": "ext4", "readOnly": true}}}));
    assert_eq!(
        value,
        json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-0123", "fsType": "ext4",
               "readOnly": true, "volumeAttributes": {"partition": "0"}})
    );
    let cases = [
        ("vol-1", Ok("vol-1")),
        ("aws:///vol-2", Ok("vol-2")),
        ("aws://zone//vol-3/", Ok("vol-3")),
        ("aws://zone/vol-%34?x=1", Ok("vol-4")),
        (
            "aws://vol-5",
            Err("Invalid format for AWS volume (aws://vol-5)"),
        ),
        (
            "aws://z/a/vol-6",
            Err("Invalid format for AWS volume (aws://z/a/vol-6)"),
        ),
        (
            "aws://z/vol-%zz",
            Err(
                "Invalid disk name (aws://z/vol-%zz): parse \"aws://z/vol-%zz\": invalid URL escape \"%zz\"",
            ),
        ),
    ];
    for (id, expected) in cases {
        assert_eq!(
            ebs_volume_id(id).as_deref(),
            expected.map_err(str::to_string).as_deref(),
            "{id}"
        );
    }
    let error = translate_in_tree_pv(&pv(
        json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://z/bad", "partition": 2}}}),
    ));
    assert_eq!(
        error.unwrap_err().to_string(),
        "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://z/bad)"
    );
}

#[test]
fn ebs_topology_from_affinity_and_labels() {
    let from_affinity = translated(json!({"spec": {
        "awsElasticBlockStore": {"volumeID": "vol-1"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": BETA_ZONE_LABEL, "operator": "In", "values": ["us-east-1a"]},
            {"key": BETA_REGION_LABEL, "operator": "In", "values": ["us-east-1"]}]}]}}}}));
    assert_eq!(
        serde_json::to_value(from_affinity.spec.unwrap().node_affinity).unwrap(),
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In", "values": ["us-east-1a"]},
            {"key": REGION_LABEL, "operator": "In", "values": ["us-east-1"]}]}]}})
    );
    let from_labels = translated(json!({
        "metadata": {"labels": {ZONE_LABEL: "us-east-1b__us-east-1a__ "}},
        "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}}}));
    assert_eq!(
        serde_json::to_value(from_labels.spec.unwrap().node_affinity).unwrap(),
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.ebs.csi.aws.com/zone", "operator": "In",
             "values": ["us-east-1a", "us-east-1b"]}]}]}})
    );
}

#[test]
fn gce_pd_handles_partition_and_access_modes() {
    let zonal = csi_json(json!({
        "metadata": {"labels": {BETA_ZONE_LABEL: "us-central1-a", ZONE_LABEL: "ignored-x-y"}},
        "spec": {"gcePersistentDisk": {"pdName": "disk-1", "partition": 3}}}));
    assert_eq!(
        zonal,
        json!({"driver": "pd.csi.storage.gke.io",
               "volumeHandle": "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
               "volumeAttributes": {"partition": "3"}})
    );
    let regional = translated(json!({
        "metadata": {"labels": {ZONE_LABEL: "us-central1-a__us-central1-b"}},
        "spec": {"accessModes": ["ReadWriteMany", "ReadOnlyMany"],
                 "gcePersistentDisk": {"pdName": "disk-2", "readOnly": true}}}));
    let spec = regional.spec.unwrap();
    assert_eq!(
        spec.csi.as_ref().unwrap().volume_handle,
        "projects/UNSPECIFIED/regions/us-central1/disks/disk-2"
    );
    assert_eq!(
        spec.csi.unwrap().volume_attributes.unwrap()["partition"],
        ""
    );
    assert_eq!(spec.access_modes.unwrap(), ["ReadWriteOnce"]);
    let unlabelled = translated(json!({"spec": {"accessModes": ["ReadOnlyMany"],
        "gcePersistentDisk": {"pdName": "disk-3"}}}));
    let spec = unlabelled.spec.unwrap();
    assert_eq!(
        spec.csi.unwrap().volume_handle,
        "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/disk-3"
    );
    assert_eq!(spec.access_modes.unwrap(), ["ReadOnlyMany"]);
    for (labels, message) in [
        (
            "us-central1-a__europe-west1-b",
            "failed to get region from zones: multiple or no regions gotten from zones, got: map[europe-west1:{} us-central1:{}]",
        ),
        (
            "us-central1__us-central1-b",
            "failed to get region from zones: zone in unexpected format, expected: {locale}-{region}-{zone}, got: us-central1",
        ),
    ] {
        let error = translate_in_tree_pv(&pv(json!({"metadata": {"labels": {ZONE_LABEL: labels}},
            "spec": {"gcePersistentDisk": {"pdName": "d"}}})));
        assert_eq!(error.unwrap_err().to_string(), message);
    }
    assert_eq!(gce_access_modes(None), None);
    assert_eq!(
        gce_access_modes(Some(vec!["ReadWriteOncePod".into()])),
        Some(vec!["ReadWriteOnce".to_string()])
    );
}

#[test]
fn azure_disk() {
    let value = csi_json(json!({"spec": {"azureDisk": {"diskName": "d",
        "diskURI": "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/disks/d",
        "cachingMode": "ReadOnly", "fsType": "xfs", "kind": "Managed", "readOnly": false}}}));
    assert_eq!(
        value,
        json!({"driver": "disk.csi.azure.com", "fsType": "xfs",
               "volumeHandle": "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/disks/d",
               "volumeAttributes": {"kind": "Managed", "cachingmode": "ReadOnly",
                                    "fstype": "xfs"}})
    );
    let minimal = csi_json(
        json!({"spec": {"azureDisk": {"diskName": "d", "diskURI": "u",
        "kind": "managed", "readOnly": true}}}),
    );
    assert_eq!(
        minimal,
        json!({"driver": "disk.csi.azure.com", "volumeHandle": "u", "readOnly": true,
               "volumeAttributes": {"kind": "Managed"}})
    );
    for kind in ["Shared", "Dedicated"] {
        let error = translate_in_tree_pv(&pv(json!({"spec": {"azureDisk":
            {"diskName": "d", "diskURI": "https://a/vhds/d.vhd", "kind": kind}}})));
        assert_eq!(
            error.unwrap_err().to_string(),
            format!("kind({kind}) is not supported in csi migration")
        );
    }
}

#[test]
fn azure_file() {
    let value = csi_json(json!({
        "metadata": {"annotations": {AZURE_FILE_RESOURCE_GROUP_ANNOTATION: "rg"}},
        "spec": {"claimRef": {"namespace": "claims"},
                 "azureFile": {"secretName": "azure-storage-account-acct-1-secret",
                               "shareName": "share", "readOnly": true}}}));
    assert_eq!(
        value,
        json!({"driver": "file.csi.azure.com", "volumeHandle": "rg#acct-1#share#pv-1#claims",
               "readOnly": true, "volumeAttributes": {"sharename": "share"},
               "nodeStageSecretRef": {"name": "azure-storage-account-acct-1-secret",
                                      "namespace": "claims"}})
    );
    let own_namespace = csi_json(json!({"spec": {"azureFile": {"secretName": "plain",
        "shareName": "s", "secretNamespace": "ns"}}}));
    assert_eq!(own_namespace["volumeHandle"], "#plain#s#pv-1#ns");
    let error = translate_in_tree_pv(&pv(
        json!({"spec": {"azureFile": {"secretName": "x", "shareName": "s"}}}),
    ));
    assert_eq!(error, Err(TranslationError::AzureFileSecretNamespace));
    assert_eq!(
        azure_storage_account("azure-storage-account-a-secret-b-secret"),
        Some("a-secret-b")
    );
    assert_eq!(azure_storage_account("azure-storage-account--secret"), None);
    assert_eq!(
        azure_storage_account("x-azure-storage-account--secret-azure-storage-account-y-secret"),
        Some("-secret-azure-storage-account-y")
    );
}

#[test]
fn cinder_vsphere_portworx() {
    assert_eq!(
        csi_json(
            json!({"spec": {"cinder": {"volumeID": "c-1", "fsType": "ext4", "readOnly": true}}})
        ),
        json!({"driver": "cinder.csi.openstack.org", "volumeHandle": "c-1", "fsType": "ext4",
               "readOnly": true, "volumeAttributes": {}})
    );
    assert_eq!(
        csi_json(
            json!({"spec": {"vsphereVolume": {"volumePath": "[ds] vols/v.vmdk",
            "storagePolicyName": "gold"}}})
        ),
        json!({"driver": "csi.vsphere.vmware.com", "volumeHandle": "[ds] vols/v.vmdk",
               "volumeAttributes": {"storagepolicyname": "gold"}})
    );
    assert_eq!(
        csi_json(json!({"spec": {"portworxVolume": {"volumeID": "px-1", "readOnly": true}}})),
        json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "volumeAttributes": {}})
    );
    let cinder = translated(json!({"metadata": {"labels": {BETA_ZONE_LABEL: "nova"}},
        "spec": {"cinder": {"volumeID": "c-1"}}}));
    let terms = cinder
        .spec
        .unwrap()
        .node_affinity
        .unwrap()
        .required
        .unwrap();
    assert_eq!(
        terms.node_selector_terms[0]
            .match_expressions
            .as_ref()
            .unwrap()[0]
            .key,
        "topology.cinder.csi.openstack.org/zone"
    );
}

#[test]
fn vsphere_topology() {
    // Node affinity on the zone and region labels moves to the driver's keys.
    let from_affinity = translated(json!({"spec": {
        "vsphereVolume": {"volumePath": "[ds] v.vmdk"},
        "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": BETA_ZONE_LABEL, "operator": "In", "values": ["z1"]},
            {"key": BETA_REGION_LABEL, "operator": "In", "values": ["r1"]}]}]}}}}));
    assert_eq!(
        serde_json::to_value(from_affinity.spec.unwrap().node_affinity).unwrap(),
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.csi.vmware.com/zone", "operator": "In", "values": ["z1"]},
            {"key": "topology.csi.vmware.com/region", "operator": "In", "values": ["r1"]}]}]}})
    );
    // Labels are taken whole, not split into zones.
    let from_labels = translated(json!({
        "metadata": {"labels": {ZONE_LABEL: "z1__z2", REGION_LABEL: "r1"}},
        "spec": {"vsphereVolume": {"volumePath": "[ds] v.vmdk"}}}));
    assert_eq!(
        serde_json::to_value(from_labels.spec.unwrap().node_affinity).unwrap(),
        json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.csi.vmware.com/zone", "operator": "In", "values": ["z1__z2"]},
            {"key": "topology.csi.vmware.com/region", "operator": "In", "values": ["r1"]}]}]}})
    );
    let unlabelled = translated(json!({"spec": {"vsphereVolume": {"volumePath": "p"}}}));
    assert_eq!(unlabelled.spec.unwrap().node_affinity, None);
}

#[test]
fn portworx_auth_secrets() {
    let value = csi_json(json!({
        "metadata": {"annotations": {PORTWORX_AUTH_SECRET_NAME: "px",
                                     PORTWORX_AUTH_SECRET_NAMESPACE: "kube-system"}},
        "spec": {"portworxVolume": {"volumeID": "px-1", "fsType": "ext4"}}}));
    let secret = json!({"name": "px", "namespace": "kube-system"});
    assert_eq!(
        value,
        json!({"driver": "pxd.portworx.com", "volumeHandle": "px-1", "fsType": "ext4",
               "volumeAttributes": {}, "controllerPublishSecretRef": secret,
               "nodeStageSecretRef": secret, "nodePublishSecretRef": secret,
               "controllerExpandSecretRef": secret, "nodeExpandSecretRef": secret})
    );
    // Both annotations are needed.
    let value = csi_json(json!({
        "metadata": {"annotations": {PORTWORX_AUTH_SECRET_NAME: "px"}},
        "spec": {"portworxVolume": {"volumeID": "px-1"}}}));
    assert_eq!(value.get("nodeStageSecretRef"), None);
}

#[test]
fn plugin_names() {
    let pairs = [
        ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
        ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
        ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
        ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
        ("kubernetes.io/azure-file", "file.csi.azure.com"),
        ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
        ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
    ];
    for (in_tree, csi) in pairs {
        assert_eq!(csi_name_of(in_tree), Some(csi));
        assert_eq!(in_tree_name_of(csi), Some(in_tree));
        assert!(is_migratable_in_tree_plugin(in_tree));
        assert!(!is_migratable_in_tree_plugin(csi));
    }
    assert_eq!(csi_name_of("ebs.csi.aws.com"), None);
    assert_eq!(in_tree_name_of("kubernetes.io/aws-ebs"), None);
    assert_eq!(csi_name_of("kubernetes.io/nfs"), None);
    assert_eq!(in_tree_name_of("hostpath.csi.k8s.io"), None);
}

#[test]
fn repair_gce_handles_from_the_node_id() {
    let node = "projects/p-1/zones/us-central1-c/instances/vm-1";
    let cases = [
        (
            "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d",
            Ok("projects/p-1/zones/us-central1-c/disks/d"),
        ),
        (
            "projects/UNSPECIFIED/zones/us-central1-a/disks/d",
            Ok("projects/p-1/zones/us-central1-a/disks/d"),
        ),
        (
            "projects/UNSPECIFIED/regions/UNSPECIFIED/disks/d",
            Ok("projects/p-1/regions/us-central1/disks/d"),
        ),
        (
            "projects/UNSPECIFIED/regions/europe-west1/disks/d",
            Ok("projects/p-1/regions/europe-west1/disks/d"),
        ),
        (
            "projects/mine/zones/z/disks/d",
            Ok("projects/mine/zones/z/disks/d"),
        ),
        (
            "projects/UNSPECIFIED/disks/d",
            Err("volume handle has wrong number of elements; got 4, wanted 6 or more"),
        ),
        (
            "projects/UNSPECIFIED/places/x/disks/d",
            Err("expected volume handle to have zones or regions regionality value, got: places"),
        ),
    ];
    for (handle, expected) in cases {
        assert_eq!(
            repair_volume_handle("pd.csi.storage.gke.io", handle, node).map_err(|e| e.to_string()),
            expected.map(str::to_string).map_err(str::to_string),
            "{handle}"
        );
    }
    assert_eq!(
        repair_volume_handle(
            "pd.csi.storage.gke.io",
            "projects/UNSPECIFIED/zones/z/disks/d",
            "node-1"
        )
        .unwrap_err()
        .to_string(),
        "node handle has wrong number of elements; got 1, wanted 6 or more"
    );
    assert_eq!(
        repair_volume_handle("ebs.csi.aws.com", "vol-1", "i-1"),
        Ok("vol-1".to_string())
    );
    assert_eq!(
        repair_volume_handle("hostpath.csi.k8s.io", "h", "n")
            .unwrap_err()
            .to_string(),
        "could not find In-Tree driver name for CSI plugin hostpath.csi.k8s.io"
    );
}
