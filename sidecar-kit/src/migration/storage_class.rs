//! StorageClasses of in-tree provisioners translated for the CSI driver that replaces them:
//! parameters renamed or dropped as the driver expects them, zone parameters turned into
//! allowed topologies, and zone topology moved to the driver's key.
//!
//! Parameter keys are compared lower-cased. Where two keys translate to the same one (`fsType`
//! and `fstype`, say), the one that sorts last wins; Kubernetes leaves that to map order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};

use super::{
    AZURE_DISK_TOPOLOGY_KEY, BETA_ZONE_LABEL, CINDER_TOPOLOGY_KEY, EBS_TOPOLOGY_KEY,
    GCE_TOPOLOGY_KEY, Kind, PORTWORX_AUTH_SECRET_NAME, PORTWORX_AUTH_SECRET_NAMESPACE,
    VSPHERE_ZONE_KEY, ZONE_LABEL, plugin_by_in_tree_name,
};

/// One requirement of an allowed-topology term: the node label `key` has one of `values`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyRequirement {
    pub key: String,
    pub values: Vec<String>,
}

/// A term of a StorageClass's `allowedTopologies`: all of its requirements hold.
pub type TopologyTerm = Vec<TopologyRequirement>;

/// What a StorageClass of an in-tree provisioner means to the replacing CSI driver.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TranslatedStorageClass {
    /// The class's provisioner: unchanged, except that Portworx classes name the CSI driver.
    pub provisioner: String,
    pub parameters: BTreeMap<String, String>,
    pub allowed_topologies: Vec<TopologyTerm>,
}

/// Why a StorageClass cannot be translated; the texts are Kubernetes' own.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageClassError {
    #[error("could not find in-tree storage class parameter translation logic for {0:?}")]
    UnknownPlugin(String),
    #[error("cannot simultaneously set allowed topologies and zone/zones parameters")]
    ZonesWithAllowedTopologies,
}

const CSI_FS_TYPE: &str = "csi.storage.k8s.io/fstype";
const EBS_IOPS_PER_GB: &str = "iopspergb";
const EBS_ALLOW_IOPS_INCREASE: &str = "allowautoiopspergbincrease";
const VSPHERE_STORAGE_POLICY: &str = "storagepolicyname";
const VSPHERE_MIGRATION: &str = "csimigration";
/// vSphere parameters the driver takes under `<name>-migrationparam`; all others are dropped.
const VSPHERE_MIGRATION_PARAMS: [&str; 8] = [
    "datastore",
    "diskformat",
    "hostfailurestotolerate",
    "forceprovisioning",
    "cachereservation",
    "diskstripes",
    "objectspacereservation",
    "iopslimit",
];
/// The CSI secrets a Portworx auth secret parameter stands for (`…-name` / `…-namespace`).
const PORTWORX_SECRETS: [&str; 6] = [
    "csi.storage.k8s.io/provisioner-secret",
    "csi.storage.k8s.io/controller-publish-secret",
    "csi.storage.k8s.io/node-publish-secret",
    "csi.storage.k8s.io/node-stage-secret",
    "csi.storage.k8s.io/controller-expand-secret",
    "csi.storage.k8s.io/node-expand-secret",
];

/// Translates the provisioner, parameters and allowed topologies of a StorageClass whose
/// provisioner is the in-tree plugin `in_tree_plugin` (upstream's
/// `TranslateInTreeStorageClassToCSI`).
pub fn translate_in_tree_storage_class(
    in_tree_plugin: &str,
    parameters: &BTreeMap<String, String>,
    allowed_topologies: &[TopologyTerm],
) -> Result<TranslatedStorageClass, StorageClassError> {
    let plugin = plugin_by_in_tree_name(in_tree_plugin)
        .ok_or_else(|| StorageClassError::UnknownPlugin(in_tree_plugin.to_string()))?;
    let mut translated = TranslatedStorageClass {
        provisioner: in_tree_plugin.to_string(),
        parameters: parameters.clone(),
        allowed_topologies: allowed_topologies.to_vec(),
    };
    match plugin.kind {
        Kind::AwsEbs => {
            (translated.parameters, translated.allowed_topologies) = zonal(
                parameters,
                allowed_topologies,
                Kind::AwsEbs,
                EBS_TOPOLOGY_KEY,
            )?;
        }
        Kind::GcePd => {
            (translated.parameters, translated.allowed_topologies) = zonal(
                parameters,
                allowed_topologies,
                Kind::GcePd,
                GCE_TOPOLOGY_KEY,
            )?;
        }
        Kind::AzureDisk => {
            let (parameters, mut topologies) = zonal(
                parameters,
                allowed_topologies,
                Kind::AzureDisk,
                AZURE_DISK_TOPOLOGY_KEY,
            )?;
            // Azure regions without zones have "fault domains" 0, 1, … in the zone label;
            // the driver's topology calls them "".
            let requirements = topologies
                .iter_mut()
                .flatten()
                .filter(|r| r.key == AZURE_DISK_TOPOLOGY_KEY);
            for requirement in requirements {
                for value in &mut requirement.values {
                    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
                        value.clear();
                    }
                }
            }
            translated.parameters = parameters;
            translated.allowed_topologies = topologies;
        }
        Kind::AzureFile => {}
        Kind::Cinder => {
            // Everything but fsType, "availability" included, is understood by the driver.
            translated.parameters = parameters
                .iter()
                .map(|(key, value)| match key.to_lowercase().as_str() {
                    "fstype" => (CSI_FS_TYPE.to_string(), value.clone()),
                    _ => (key.clone(), value.clone()),
                })
                .collect();
            translated.allowed_topologies =
                translate_allowed_topologies(allowed_topologies, CINDER_TOPOLOGY_KEY);
        }
        Kind::VSphere => {
            let mut translated_parameters = BTreeMap::new();
            for (key, value) in parameters {
                let key = key.to_lowercase();
                let new_key = if key == "fstype" {
                    CSI_FS_TYPE.to_string()
                } else if key == VSPHERE_STORAGE_POLICY {
                    key
                } else if VSPHERE_MIGRATION_PARAMS.contains(&key.as_str()) {
                    format!("{key}-migrationparam")
                } else {
                    // Not supported by the driver.
                    continue;
                };
                translated_parameters.insert(new_key, value.clone());
            }
            // Tells the driver to report the volume's path, which the in-tree PV needs.
            translated_parameters.insert(VSPHERE_MIGRATION.to_string(), "true".to_string());
            translated.parameters = translated_parameters;
            translated.allowed_topologies =
                translate_allowed_topologies(allowed_topologies, VSPHERE_ZONE_KEY);
        }
        Kind::Portworx => {
            let mut translated_parameters = BTreeMap::new();
            for (key, value) in parameters {
                let suffix = match key.to_lowercase().as_str() {
                    PORTWORX_AUTH_SECRET_NAME => "name",
                    PORTWORX_AUTH_SECRET_NAMESPACE => "namespace",
                    _ => {
                        translated_parameters.insert(key.clone(), value.clone());
                        continue;
                    }
                };
                for secret in PORTWORX_SECRETS {
                    translated_parameters.insert(format!("{secret}-{suffix}"), value.clone());
                }
            }
            translated.parameters = translated_parameters;
            translated.provisioner = plugin.csi_driver.to_string();
        }
    }
    Ok(translated)
}

/// The translation of the zonal block storage plugins (EBS, GCE PD, Azure Disk): `zone` or
/// `zones` parameters become the allowed topology, else zone terms move to `key`. Azure Disk
/// keeps `fsType` as it is; only EBS knows `iopsPerGB`.
fn zonal(
    parameters: &BTreeMap<String, String>,
    allowed_topologies: &[TopologyTerm],
    kind: Kind,
    key: &str,
) -> Result<(BTreeMap<String, String>, Vec<TopologyTerm>), StorageClassError> {
    let rename_fs_type = kind != Kind::AzureDisk;
    let mut translated = BTreeMap::new();
    let mut zones = None;
    for (name, value) in parameters {
        match name.to_lowercase().as_str() {
            "fstype" if rename_fs_type => {
                translated.insert(CSI_FS_TYPE.to_string(), value.clone());
            }
            "zone" => zones = Some(vec![value.clone()]),
            // Split as given: Kubernetes trims no spaces.
            "zones" => zones = Some(value.split(',').map(str::to_string).collect()),
            EBS_IOPS_PER_GB if kind == Kind::AwsEbs => {
                translated.insert(name.clone(), value.clone());
                translated.insert(EBS_ALLOW_IOPS_INCREASE.to_string(), "true".to_string());
            }
            _ => {
                translated.insert(name.clone(), value.clone());
            }
        }
    }
    let topologies = match zones {
        Some(_) if !allowed_topologies.is_empty() => {
            return Err(StorageClassError::ZonesWithAllowedTopologies);
        }
        Some(values) => vec![vec![TopologyRequirement {
            key: key.to_string(),
            values,
        }]],
        None => translate_allowed_topologies(allowed_topologies, key),
    };
    Ok((translated, topologies))
}

/// Zone requirements (GA or beta label) of allowed topologies moved to the driver's `key`;
/// other requirements are kept.
fn translate_allowed_topologies(terms: &[TopologyTerm], key: &str) -> Vec<TopologyTerm> {
    terms
        .iter()
        .map(|term| {
            term.iter()
                .map(|requirement| {
                    let mut requirement = requirement.clone();
                    if requirement.key == ZONE_LABEL || requirement.key == BETA_ZONE_LABEL {
                        requirement.key = key.to_string();
                    }
                    requirement
                })
                .collect()
        })
        .collect()
}

/// The allowed topologies of an API StorageClass in the form
/// [`translate_in_tree_storage_class`] takes.
pub fn topology_terms_from_api(terms: &[TopologySelectorTerm]) -> Vec<TopologyTerm> {
    terms
        .iter()
        .map(|term| {
            term.match_label_expressions
                .iter()
                .flatten()
                .map(|r| TopologyRequirement {
                    key: r.key.clone(),
                    values: r.values.clone(),
                })
                .collect()
        })
        .collect()
}

/// Translated allowed topologies back in the API's form.
pub fn topology_terms_to_api(terms: &[TopologyTerm]) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            match_label_expressions: (!term.is_empty()).then(|| {
                term.iter()
                    .map(|r| TopologySelectorLabelRequirement {
                        key: r.key.clone(),
                        values: r.values.clone(),
                    })
                    .collect()
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn term(requirements: &[(&str, &[&str])]) -> TopologyTerm {
        requirements
            .iter()
            .map(|(key, values)| TopologyRequirement {
                key: key.to_string(),
                values: values.iter().map(|v| v.to_string()).collect(),
            })
            .collect()
    }

    fn translate(
        plugin: &str,
        parameters: &[(&str, &str)],
        topologies: &[TopologyTerm],
    ) -> Result<TranslatedStorageClass, StorageClassError> {
        translate_in_tree_storage_class(plugin, &params(parameters), topologies)
    }

    const EBS: &str = "kubernetes.io/aws-ebs";
    const GCE: &str = "kubernetes.io/gce-pd";
    const AZURE_DISK: &str = "kubernetes.io/azure-disk";
    const AZURE_FILE: &str = "kubernetes.io/azure-file";
    const CINDER: &str = "kubernetes.io/cinder";
    const VSPHERE: &str = "kubernetes.io/vsphere-volume";
    const PORTWORX: &str = "kubernetes.io/portworx-volume";

    #[test]
    fn unknown_plugin() {
        assert_eq!(
            translate("example.com/nfs", &[], &[])
                .unwrap_err()
                .to_string(),
            "could not find in-tree storage class parameter translation logic for \"example.com/nfs\""
        );
        // Driver names are no in-tree plugin names.
        assert!(translate("ebs.csi.aws.com", &[], &[]).is_err());
    }

    #[test]
    fn aws_ebs() {
        let sc = translate(
            EBS,
            &[
                ("type", "io1"),
                ("fsType", "xfs"),
                ("iopsPerGB", "10"),
                ("Zone", "us-east-1a"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(sc.provisioner, EBS);
        assert_eq!(
            sc.parameters,
            params(&[
                ("type", "io1"),
                ("csi.storage.k8s.io/fstype", "xfs"),
                ("iopsPerGB", "10"),
                ("allowautoiopspergbincrease", "true"),
            ])
        );
        assert_eq!(
            sc.allowed_topologies,
            [term(&[("topology.ebs.csi.aws.com/zone", &["us-east-1a"])])]
        );
        // Zones are split on commas only, as Kubernetes splits them.
        let sc = translate(EBS, &[("zones", "us-east-1a, us-east-1b")], &[]).unwrap();
        assert_eq!(
            sc.allowed_topologies,
            [term(&[(
                "topology.ebs.csi.aws.com/zone",
                &["us-east-1a", " us-east-1b"]
            )])]
        );
        assert!(sc.parameters.is_empty());
        let allowed = [
            term(&[
                (BETA_ZONE_LABEL, &["us-east-1a"]),
                ("topology.kubernetes.io/region", &["us-east-1"]),
            ]),
            term(&[(ZONE_LABEL, &["us-east-1b", "us-east-1c"])]),
        ];
        let sc = translate(EBS, &[("type", "gp3")], &allowed).unwrap();
        assert_eq!(
            sc.allowed_topologies,
            [
                term(&[
                    ("topology.ebs.csi.aws.com/zone", &["us-east-1a"]),
                    ("topology.kubernetes.io/region", &["us-east-1"]),
                ]),
                term(&[(
                    "topology.ebs.csi.aws.com/zone",
                    &["us-east-1b", "us-east-1c"]
                )]),
            ]
        );
        for zone_key in ["zone", "zones", "ZONES"] {
            let error = translate(EBS, &[(zone_key, "us-east-1a")], &allowed).unwrap_err();
            assert_eq!(error, StorageClassError::ZonesWithAllowedTopologies);
            assert_eq!(
                error.to_string(),
                "cannot simultaneously set allowed topologies and zone/zones parameters"
            );
        }
    }

    #[test]
    fn gce_pd() {
        let sc = translate(
            GCE,
            &[
                ("type", "pd-ssd"),
                ("fstype", "ext4"),
                ("iopspergb", "5"),
                ("replication-type", "regional-pd"),
                ("zones", "us-central1-a,us-central1-b"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(sc.provisioner, GCE);
        assert_eq!(
            sc.parameters,
            params(&[
                ("type", "pd-ssd"),
                ("csi.storage.k8s.io/fstype", "ext4"),
                ("iopspergb", "5"),
                ("replication-type", "regional-pd"),
            ])
        );
        assert_eq!(
            sc.allowed_topologies,
            [term(&[(
                "topology.gke.io/zone",
                &["us-central1-a", "us-central1-b"]
            )])]
        );
        let allowed = [term(&[(ZONE_LABEL, &["us-central1-c"]), ("other", &["x"])])];
        let sc = translate(GCE, &[], &allowed).unwrap();
        assert_eq!(
            sc.allowed_topologies,
            [term(&[
                ("topology.gke.io/zone", &["us-central1-c"]),
                ("other", &["x"])
            ])]
        );
        assert_eq!(
            translate(GCE, &[("zone", "z")], &allowed),
            Err(StorageClassError::ZonesWithAllowedTopologies)
        );
    }

    #[test]
    fn azure_disk() {
        let sc = translate(
            AZURE_DISK,
            &[
                ("skuName", "Premium_LRS"),
                ("fsType", "xfs"),
                ("zones", "eastus-1,2"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(sc.provisioner, AZURE_DISK);
        // fsType keeps its name: the Azure Disk driver reads it as it is.
        assert_eq!(
            sc.parameters,
            params(&[("skuName", "Premium_LRS"), ("fsType", "xfs")])
        );
        assert_eq!(
            sc.allowed_topologies,
            [term(&[(
                "topology.disk.csi.azure.com/zone",
                &["eastus-1", ""]
            )])]
        );
        let allowed = [
            term(&[(BETA_ZONE_LABEL, &["0", "westus-1", "12a"])]),
            term(&[("topology.kubernetes.io/region", &["1"])]),
        ];
        let sc = translate(AZURE_DISK, &[], &allowed).unwrap();
        assert_eq!(
            sc.allowed_topologies,
            [
                term(&[("topology.disk.csi.azure.com/zone", &["", "westus-1", "12a"])]),
                term(&[("topology.kubernetes.io/region", &["1"])]),
            ]
        );
        assert_eq!(
            translate(AZURE_DISK, &[("zone", "1")], &allowed)
                .unwrap_err()
                .to_string(),
            "cannot simultaneously set allowed topologies and zone/zones parameters"
        );
    }

    #[test]
    fn azure_file_is_unchanged() {
        let parameters = [
            ("skuName", "Standard_LRS"),
            ("fsType", "ext4"),
            ("zone", "1"),
        ];
        let allowed = [term(&[(ZONE_LABEL, &["westus-1"])])];
        let sc = translate(AZURE_FILE, &parameters, &allowed).unwrap();
        assert_eq!(
            sc,
            TranslatedStorageClass {
                provisioner: AZURE_FILE.to_string(),
                parameters: params(&parameters),
                allowed_topologies: allowed.to_vec(),
            }
        );
    }

    #[test]
    fn cinder() {
        let allowed = [term(&[(BETA_ZONE_LABEL, &["nova"])])];
        let sc = translate(
            CINDER,
            &[
                ("FSType", "ext4"),
                ("availability", "nova"),
                ("type", "fast"),
            ],
            &allowed,
        )
        .unwrap();
        assert_eq!(sc.provisioner, CINDER);
        assert_eq!(
            sc.parameters,
            params(&[
                ("csi.storage.k8s.io/fstype", "ext4"),
                ("availability", "nova"),
                ("type", "fast"),
            ])
        );
        assert_eq!(
            sc.allowed_topologies,
            [term(&[(
                "topology.cinder.csi.openstack.org/zone",
                &["nova"]
            )])]
        );
        // Cinder has no zone parameters: nothing conflicts with allowed topologies.
        assert!(translate(CINDER, &[("zone", "nova")], &allowed).is_ok());
    }

    #[test]
    fn vsphere() {
        let sc = translate(
            VSPHERE,
            &[
                ("fstype", "ext3"),
                ("storagePolicyName", "gold"),
                ("datastore", "ds1"),
                ("diskformat", "thin"),
                ("hostFailuresToTolerate", "1"),
                ("forceProvisioning", "true"),
                ("cacheReservation", "20"),
                ("diskStripes", "2"),
                ("objectSpaceReservation", "30"),
                ("iopsLimit", "100"),
                ("vsanDatastoreName", "dropped"),
            ],
            &[term(&[
                (ZONE_LABEL, &["z1"]),
                ("topology.kubernetes.io/region", &["r1"]),
            ])],
        )
        .unwrap();
        assert_eq!(sc.provisioner, VSPHERE);
        assert_eq!(
            sc.parameters,
            params(&[
                ("csi.storage.k8s.io/fstype", "ext3"),
                ("storagepolicyname", "gold"),
                ("datastore-migrationparam", "ds1"),
                ("diskformat-migrationparam", "thin"),
                ("hostfailurestotolerate-migrationparam", "1"),
                ("forceprovisioning-migrationparam", "true"),
                ("cachereservation-migrationparam", "20"),
                ("diskstripes-migrationparam", "2"),
                ("objectspacereservation-migrationparam", "30"),
                ("iopslimit-migrationparam", "100"),
                ("csimigration", "true"),
            ])
        );
        assert_eq!(
            sc.allowed_topologies,
            [term(&[
                ("topology.csi.vmware.com/zone", &["z1"]),
                ("topology.kubernetes.io/region", &["r1"]),
            ])]
        );
        let empty = translate(VSPHERE, &[], &[]).unwrap();
        assert_eq!(empty.parameters, params(&[("csimigration", "true")]));
        assert!(empty.allowed_topologies.is_empty());
    }

    #[test]
    fn portworx() {
        let allowed = [term(&[(ZONE_LABEL, &["z1"])])];
        let sc = translate(
            PORTWORX,
            &[
                ("repl", "2"),
                ("openstorage.io/auth-secret-name", "px-secret"),
                ("OpenStorage.io/Auth-Secret-Namespace", "px-ns"),
            ],
            &allowed,
        )
        .unwrap();
        assert_eq!(sc.provisioner, "pxd.portworx.com");
        let mut expected = params(&[("repl", "2")]);
        for call in [
            "provisioner",
            "controller-publish",
            "node-publish",
            "node-stage",
            "controller-expand",
            "node-expand",
        ] {
            expected.insert(
                format!("csi.storage.k8s.io/{call}-secret-name"),
                "px-secret".to_string(),
            );
            expected.insert(
                format!("csi.storage.k8s.io/{call}-secret-namespace"),
                "px-ns".to_string(),
            );
        }
        assert_eq!(sc.parameters, expected);
        // Topology is left as it is.
        assert_eq!(sc.allowed_topologies, allowed);
    }

    #[test]
    fn api_topology_round_trip() {
        let api: Vec<TopologySelectorTerm> = serde_json::from_value(serde_json::json!([
            {"matchLabelExpressions": [{"key": ZONE_LABEL, "values": ["a", "b"]}]},
            {}
        ]))
        .unwrap();
        let terms = topology_terms_from_api(&api);
        assert_eq!(terms, [term(&[(ZONE_LABEL, &["a", "b"])]), vec![]]);
        assert_eq!(topology_terms_to_api(&terms), api);
    }
}
