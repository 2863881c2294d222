//! StorageClass parameters: the reserved `csi.storage.k8s.io/` keys split from the driver's
//! parameters, the filesystem type, the secret references, and the whole CreateVolume request
//! built from a class (including in-tree classes translated for CSI migration).
//!
//! Properties:
//! - the driver gets exactly the keys outside `csi.storage.k8s.io/`, with their values; an
//!   unknown reserved key is an error, a known one never reaches the driver;
//! - the filesystem type is the one key given (any case of the deprecated `fstype`), else the
//!   default; both keys given is an error;
//! - a CreateVolume request built from the class carries no secret values, no reserved key but
//!   the claim/PV metadata `--extra-create-metadata` asks for, and only valid secret names.
#![no_main]

use std::collections::BTreeMap;
use std::sync::LazyLock;

use arbitrary::Arbitrary;
use clap::Parser;
use external_provisioner::app;
use external_provisioner::decide::{Capabilities, Lookups, Policy, prepare};
use external_provisioner::flags::Cli;
use external_provisioner::model::{Claim, ClaimSpec, Class, SecretRef};
use external_provisioner::params::{self, PREFIX, driver_parameters, fs_type};
use external_provisioner::topology::NodeMaps;
use libfuzzer_sys::fuzz_target;

#[path = "../common/names.rs"]
mod names;
use names::{label_ok, subdomain_ok};

const KEYS: &[&str] = &[
    "csi.storage.k8s.io/fstype",
    "fstype",
    "FSType",
    "csi.storage.k8s.io/secret-name",
    "csi.storage.k8s.io/secret-namespace",
    "csi.storage.k8s.io/provisioner-secret-name",
    "csi.storage.k8s.io/provisioner-secret-namespace",
    "csi.storage.k8s.io/controller-publish-secret-name",
    "csi.storage.k8s.io/controller-publish-secret-namespace",
    "csi.storage.k8s.io/node-stage-secret-name",
    "csi.storage.k8s.io/node-stage-secret-namespace",
    "csi.storage.k8s.io/node-publish-secret-name",
    "csi.storage.k8s.io/node-publish-secret-namespace",
    "csi.storage.k8s.io/controller-expand-secret-name",
    "csi.storage.k8s.io/controller-expand-secret-namespace",
    "csi.storage.k8s.io/node-expand-secret-name",
    "csi.storage.k8s.io/node-expand-secret-namespace",
    "csi.storage.k8s.io/controller-modify-secret-name",
    "csi.storage.k8s.io/controller-modify-secret-namespace",
    "csiProvisionerSecretName",
    "csiProvisionerSecretNamespace",
    "csiNodeStageSecretName",
    "csiNodeStageSecretNamespace",
    "csi.storage.k8s.io/pvc/name",
    "type",
    // In-tree parameters that CSI migration translates.
    "zone",
    "zones",
    "replication-type",
    "iopsPerGB",
    "storageaccounttype",
    "skuname",
    "resourceGroup",
    "secretName",
    "secretNamespace",
    "availability",
    "datastore",
    "storagePolicyName",
    "diskformat",
    "hostFailuresToTolerate",
    "repl",
];

/// The in-tree provisioners and the CSI drivers that replace them.
const DRIVERS: &[(&str, &str)] = &[
    ("d", "d"),
    ("kubernetes.io/aws-ebs", "ebs.csi.aws.com"),
    ("kubernetes.io/gce-pd", "pd.csi.storage.gke.io"),
    ("kubernetes.io/azure-disk", "disk.csi.azure.com"),
    ("kubernetes.io/azure-file", "file.csi.azure.com"),
    ("kubernetes.io/cinder", "cinder.csi.openstack.org"),
    ("kubernetes.io/vsphere-volume", "csi.vsphere.vmware.com"),
    ("kubernetes.io/portworx-volume", "pxd.portworx.com"),
];

#[derive(Arbitrary, Debug)]
enum Key {
    Known(u8),
    Any(String),
}

#[derive(Arbitrary, Debug)]
struct Input {
    parameters: Vec<(Key, String)>,
    default_fstype: String,
    driver: u8,
    extra_create_metadata: bool,
    topology: bool,
    strict_topology: bool,
    allowed_topologies: Vec<Vec<(String, Vec<String>)>>,
    annotations: Vec<(String, String)>,
    claim_name: String,
    claim_namespace: String,
    block: bool,
}

fn check_secret(secret: &Option<SecretRef>) {
    if let Some(secret) = secret {
        assert!(label_ok(&secret.namespace), "{secret:?}");
        assert!(subdomain_ok(&secret.name), "{secret:?}");
    }
}

fn check_split(parameters: &BTreeMap<String, String>, default_fstype: &str) {
    let known = |key: &str| {
        key == params::FSTYPE_KEY
            || [
                &params::DEFAULT_SECRET,
                &params::PROVISIONER_SECRET,
                &params::CONTROLLER_PUBLISH_SECRET,
                &params::NODE_STAGE_SECRET,
                &params::NODE_PUBLISH_SECRET,
                &params::CONTROLLER_EXPAND_SECRET,
                &params::NODE_EXPAND_SECRET,
                &params::CONTROLLER_MODIFY_SECRET,
            ]
            .iter()
            .any(|kind| key == kind.name_key || key == kind.namespace_key)
    };
    let unknown_reserved = parameters
        .keys()
        .any(|key| key.starts_with(PREFIX) && !known(key));
    match driver_parameters(parameters) {
        Ok(driver) => {
            assert!(!unknown_reserved);
            let expected: BTreeMap<String, String> = parameters
                .iter()
                .filter(|(key, _)| !key.starts_with(PREFIX))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            assert_eq!(driver, expected);
        }
        Err(message) => {
            assert!(unknown_reserved, "{message}");
        }
    }

    let given: Vec<(&String, &String)> = parameters
        .iter()
        .filter(|(key, _)| key.eq_ignore_ascii_case("fstype") || *key == params::FSTYPE_KEY)
        .collect();
    match fs_type(parameters, default_fstype) {
        Ok((fs, deprecated)) => {
            assert!(given.len() <= 1);
            assert_eq!(
                deprecated,
                given
                    .iter()
                    .any(|(key, _)| key.eq_ignore_ascii_case("fstype"))
            );
            match given.first() {
                Some((_, value)) if !value.is_empty() => assert_eq!(&fs, *value),
                _ => assert_eq!(fs, default_fstype),
            }
        }
        Err(_) => assert!(given.len() > 1),
    }
    for key in params::deprecated_keys(parameters) {
        assert!(parameters.contains_key(key));
    }
}

/// Upstream's default flags.
static DEFAULT_FLAGS: LazyLock<Cli> = LazyLock::new(|| Cli::parse_from(["csi-provisioner"]));

fuzz_target!(|input: Input| {
    let parameters: BTreeMap<String, String> = input
        .parameters
        .into_iter()
        .map(|(key, value)| {
            let key = match key {
                Key::Known(i) => KEYS[usize::from(i) % KEYS.len()].to_string(),
                Key::Any(key) => key,
            };
            (key, value)
        })
        .collect();
    check_split(&parameters, &input.default_fstype);

    let (provisioner, driver) = DRIVERS[usize::from(input.driver) % DRIVERS.len()];
    let caps = Capabilities {
        controller_service: true,
        create_delete_volume: true,
        accessibility_constraints: input.topology,
        ..Capabilities::default()
    };
    let policy = Policy {
        strict_topology: input.strict_topology,
        default_fstype: input.default_fstype.clone(),
        extra_create_metadata: input.extra_create_metadata,
        ..app::config(&DEFAULT_FLAGS, driver, caps, &format!("1-2-{driver}")).policy
    };
    let class = Class {
        name: "fast".into(),
        uid: "sc-uid".into(),
        provisioner: provisioner.into(),
        parameters: parameters.clone(),
        reclaim_policy: "Delete".into(),
        mount_options: Vec::new(),
        wait_for_first_consumer: false,
        allowed_topologies: input.allowed_topologies,
    };
    let claim = Claim {
        uid: "1234-abcd".into(),
        namespace: input.claim_namespace.as_str().into(),
        name: input.claim_name.clone(),
        resource_version: "1".into(),
        storage_class: Some("fast".into()),
        request: Some("1Gi".into()),
        pending: Some(Box::new(ClaimSpec {
            annotations: input.annotations.into_iter().collect(),
            access_modes: vec!["ReadWriteOnce".into()],
            block: input.block,
            volume_mode: input.block.then(|| "Block".into()),
            ..ClaimSpec::default()
        })),
        ..Claim::default()
    };
    let Ok(prepared) = prepare(
        &policy,
        &claim,
        &class,
        &NodeMaps::EMPTY,
        &Lookups::default(),
    ) else {
        return;
    };
    let request = &prepared.request;
    assert!(request.secrets.is_empty());
    let metadata = [
        params::PVC_NAME_KEY,
        params::PVC_NAMESPACE_KEY,
        params::PV_NAME_KEY,
    ];
    for key in request.parameters.keys() {
        if key.starts_with(PREFIX) {
            assert!(
                input.extra_create_metadata && metadata.contains(&key.as_str()),
                "reserved key {key:?} reached the driver"
            );
        }
    }
    if input.extra_create_metadata {
        assert_eq!(
            request.parameters.get(params::PVC_NAME_KEY),
            Some(&input.claim_name)
        );
    }
    if provisioner == driver {
        // Not migrated: the driver sees the class's own parameters.
        for (key, value) in &parameters {
            if !key.starts_with(PREFIX) {
                assert_eq!(request.parameters.get(key), Some(value), "{key:?}");
            }
        }
    }
    check_secret(&prepared.provisioner_secret);
    let pv = &prepared.pv;
    for secret in [
        &pv.controller_publish_secret,
        &pv.node_stage_secret,
        &pv.node_publish_secret,
        &pv.controller_expand_secret,
        &pv.node_expand_secret,
        &pv.modify_secret,
        &pv.deletion_secret,
    ] {
        check_secret(secret);
    }
});
