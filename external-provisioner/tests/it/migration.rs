//! CSI migration: a driver that replaces an in-tree plugin provisions and deletes the claims of
//! that plugin's StorageClasses, writing in-tree PersistentVolumes, as upstream does.

use std::time::Duration;

use crate::common::{Env, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use prometheus::Encoder;
use serde_json::json;
use sidecar_kit::driver::identity;
use tokio_util::sync::CancellationToken;

const EBS: &str = "ebs.csi.aws.com";
const IN_TREE: &str = "kubernetes.io/aws-ebs";

fn metrics_text(env: &Env) -> String {
    let mut text = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&env.csi.metrics().registry().gather(), &mut text)
        .unwrap();
    String::from_utf8(text).unwrap()
}

#[tokio::test]
async fn claims_of_an_in_tree_class_get_in_tree_volumes() {
    let mut env = Env::without_controller(crate::common::mock().driver_name(EBS)).await;
    env.csi.metrics().set_driver_name(EBS);
    assert!(
        identity::label_migration_metrics(
            &env.csi,
            EBS,
            Duration::from_secs(5),
            &CancellationToken::new()
        )
        .await
        .unwrap()
    );
    let mut config = env.config(&[]).await;
    config.policy.driver = EBS.into();
    env.launch(config);

    let class = env
        .create_class(json!({"provisioner": IN_TREE,
            "parameters": {"type": "gp3", "fsType": "xfs", "iopsPerGB": "10"}}))
        .await;
    env.create_claim(
        "legacy",
        &class,
        json!({"metadata": {"annotations": {"pv.kubernetes.io/migrated-to": EBS}}}),
    )
    .await;
    let pv = env.wait_bound("legacy").await;
    let created = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(created.len(), 1);
    let request = &created[0];
    assert_eq!(
        request["parameters"],
        json!({"type": "gp3", "iopsPerGB": "10", "allowautoiopspergbincrease": "true"}),
        "the in-tree parameters as the driver takes them"
    );
    assert_eq!(
        request["volume_capabilities"][0]["mount"]["fs_type"], "xfs",
        "{request}"
    );

    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["pv.kubernetes.io/provisioned-by"], IN_TREE);
    let spec = pv.spec.clone().unwrap();
    assert!(spec.csi.is_none(), "written as the in-tree volume");
    let ebs = spec.aws_elastic_block_store.unwrap();
    assert_eq!(ebs.fs_type.as_deref(), Some("xfs"));
    let volume_id = ebs.volume_id.clone();
    assert_eq!(env.driver_volumes_by_id(), vec![volume_id.clone()]);

    env.delete_claim("legacy").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    let deleted = requests(&env.mock, DELETE_VOLUME);
    assert_eq!(deleted.len(), 1);
    assert_eq!(deleted[0]["volume_id"], volume_id.as_str());
    assert!(env.driver_volumes().is_empty());

    let text = metrics_text(&env);
    for method in ["CreateVolume", "DeleteVolume"] {
        let series = format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{EBS}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/{method}\",migrated=\"true\"}} 1"
        );
        assert!(text.contains(&series), "{series} in\n{text}");
    }
    env.stop().await;
}

#[tokio::test]
async fn a_class_that_cannot_be_translated_fails_the_claim() {
    let mut env = Env::without_controller(crate::common::mock().driver_name(EBS)).await;
    let mut config = env.config(&[]).await;
    config.policy.driver = EBS.into();
    env.launch(config);
    let class = env
        .create_class(json!({"provisioner": IN_TREE, "parameters": {"zone": "z1"},
            "allowedTopologies": [{"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["z1"]}]}]}))
        .await;
    env.create_claim(
        "conflict",
        &class,
        json!({"metadata": {"annotations": {"pv.kubernetes.io/migrated-to": EBS}}}),
    )
    .await;
    env.wait_event(
        "conflict",
        "ProvisioningFailed",
        "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters",
    )
    .await;
    assert!(requests(&env.mock, CREATE_VOLUME).is_empty());
    env.stop().await;
}

/// Provisions and deletes a claim of `in_tree`'s class through `driver`, whose volume ids start
/// with `prefix`; `source` checks the in-tree source written into the PV against the handle.
async fn through_the_driver(
    driver: &str,
    in_tree: &str,
    prefix: &str,
    source: impl Fn(&k8s_openapi::api::core::v1::PersistentVolumeSpec, &str),
) {
    // vSphere's driver names the volume's file, from which the in-tree volume is written.
    let mock = crate::common::mock()
        .driver_name(driver)
        .volume_id_prefix(prefix)
        .volume_context([("initialvolumefilepath", "[datastore] fcd/{id}.vmdk")]);
    let mut env = Env::without_controller(mock).await;
    env.csi.metrics().set_driver_name(driver);
    identity::label_migration_metrics(
        &env.csi,
        driver,
        Duration::from_secs(5),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    let mut config = env.config(&[]).await;
    config.policy.driver = driver.into();
    env.launch(config);
    let class = env.create_class(json!({"provisioner": in_tree})).await;
    env.create_claim(
        "legacy",
        &class,
        json!({"metadata": {"annotations": {"pv.kubernetes.io/migrated-to": driver}}}),
    )
    .await;
    let pv = env.wait_bound("legacy").await;
    let handle = env.driver_volumes_by_id().pop().unwrap();
    assert!(handle.starts_with(prefix), "{handle}");
    let spec = pv.spec.clone().unwrap();
    assert!(
        spec.csi.is_none(),
        "{in_tree}: written as the in-tree volume"
    );
    source(&spec, &handle);
    assert_eq!(
        pv.metadata.annotations.unwrap()["pv.kubernetes.io/provisioned-by"],
        in_tree
    );

    env.delete_claim("legacy").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    let deleted = requests(&env.mock, DELETE_VOLUME);
    assert_eq!(deleted.len(), 1, "{in_tree}: deleted through the driver");
    let text = metrics_text(&env);
    for method in ["CreateVolume", "DeleteVolume"] {
        let series = format!(
            "csi_sidecar_operations_seconds_count{{driver_name=\"{driver}\",grpc_status_code=\"OK\",method_name=\"/csi.v1.Controller/{method}\",migrated=\"true\"}} 1"
        );
        assert!(text.contains(&series), "{series} in\n{text}");
    }
    env.stop().await;
}

#[tokio::test]
async fn gce_pd_classes_through_their_driver() {
    through_the_driver(
        "pd.csi.storage.gke.io",
        "kubernetes.io/gce-pd",
        "projects/p/zones/z1/disks/",
        |spec, handle| {
            let pd = spec.gce_persistent_disk.as_ref().unwrap();
            assert_eq!(Some(pd.pd_name.as_str()), handle.rsplit('/').next());
        },
    )
    .await;
}

#[tokio::test]
async fn azure_disk_classes_through_their_driver() {
    through_the_driver(
        "disk.csi.azure.com",
        "kubernetes.io/azure-disk",
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/",
        |spec, handle| {
            let disk = spec.azure_disk.as_ref().unwrap();
            assert_eq!(disk.disk_uri, handle);
            assert_eq!(Some(disk.disk_name.as_str()), handle.rsplit('/').next());
        },
    )
    .await;
}

#[tokio::test]
async fn azure_file_classes_through_their_driver() {
    through_the_driver(
        "file.csi.azure.com",
        "kubernetes.io/azure-file",
        "rg#account#",
        |spec, handle| {
            let file = spec.azure_file.as_ref().unwrap();
            assert_eq!(Some(file.share_name.as_str()), handle.rsplit('#').next());
        },
    )
    .await;
}

#[tokio::test]
async fn cinder_classes_through_their_driver() {
    through_the_driver(
        "cinder.csi.openstack.org",
        "kubernetes.io/cinder",
        "",
        |spec, handle| assert_eq!(spec.cinder.as_ref().unwrap().volume_id, handle),
    )
    .await;
}

#[tokio::test]
async fn vsphere_classes_through_their_driver() {
    through_the_driver(
        "csi.vsphere.vmware.com",
        "kubernetes.io/vsphere-volume",
        "",
        |spec, handle| {
            assert_eq!(
                spec.vsphere_volume.as_ref().unwrap().volume_path,
                format!("[datastore] fcd/{handle}.vmdk")
            )
        },
    )
    .await;
}

#[tokio::test]
async fn portworx_classes_through_their_driver() {
    through_the_driver(
        "pxd.portworx.com",
        "kubernetes.io/portworx-volume",
        "",
        |spec, handle| assert_eq!(spec.portworx_volume.as_ref().unwrap().volume_id, handle),
    )
    .await;
}
