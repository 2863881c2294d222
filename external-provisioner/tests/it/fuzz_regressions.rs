//! Replays the StorageClasses under `fuzz/regressions/class_parameters/` (the inputs the
//! fuzzer found problems with, written as StorageClass objects) through the provisioner's
//! request building: each must be answered, quickly, without a panic.

use std::time::{Duration, Instant};

use clap::Parser;
use external_provisioner::app;
use external_provisioner::decide::{Capabilities, Lookups, Policy, prepare};
use external_provisioner::flags::Cli;
use external_provisioner::model::{Claim, ClaimSpec, Class};
use external_provisioner::topology::NodeMaps;
use k8s_openapi::api::storage::v1::StorageClass;

/// The CSI driver that provisions for `provisioner` (itself, or the one replacing an in-tree
/// plugin).
fn driver_for(provisioner: &str) -> String {
    sidecar_kit::migration::csi_name_of(provisioner)
        .unwrap_or(provisioner)
        .to_string()
}

#[test]
fn storage_classes_the_fuzzer_found_are_answered_quickly() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/regressions/class_parameters"
    );
    let cli = Cli::parse_from(["csi-provisioner"]);
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let sc: StorageClass = serde_json::from_str(&text).unwrap();
        let class = Class::from_api(&sc);
        let driver = driver_for(&class.provisioner);
        let caps = Capabilities {
            controller_service: true,
            create_delete_volume: true,
            accessibility_constraints: true,
            ..Capabilities::default()
        };
        let policy = Policy {
            extra_create_metadata: true,
            ..app::config(&cli, &driver, caps, &format!("1-2-{driver}")).policy
        };
        let claim = Claim {
            uid: "1234-abcd".into(),
            namespace: "ns".into(),
            name: "claim".into(),
            resource_version: "1".into(),
            storage_class: Some(class.name.as_str().into()),
            request: Some("1Gi".into()),
            pending: Some(Box::new(ClaimSpec {
                access_modes: vec!["ReadWriteOnce".into()],
                ..ClaimSpec::default()
            })),
            ..Claim::default()
        };
        let started = Instant::now();
        let answer = prepare(
            &policy,
            &claim,
            &class,
            &NodeMaps::EMPTY,
            &Lookups::default(),
        );
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "{}: {took:?} for {:?}",
            path.display(),
            answer.map(|_| ())
        );
        replayed += 1;
    }
    assert!(replayed > 0, "no regression inputs in {dir}");
}
