//! CSI migration: in-tree PersistentVolumes attached through the CSI driver that replaces their
//! plugin, against the in-process API server and a mock driver of that name.

use std::time::Duration;

use crate::common::*;
use csi_proto::methods::controller::{CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use sidecar_kit::driver::identity;
use testkit::mockdriver::MockDriver;
use tokio_util::sync::CancellationToken;

const EBS: &str = "ebs.csi.aws.com";
const EBS_FINALIZER: &str = "external-attacher/ebs-csi-aws-com";
const MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

/// API server, a mock named like the EBS driver with the migration metrics label on (as the
/// sidecar switches it at start-up), and the controller for that driver.
async fn ebs_env() -> Env {
    let env = Env::without_controller(MockDriver::builder().driver_name(EBS)).await;
    env.csi.metrics().set_driver_name(EBS);
    let labelled = identity::label_migration_metrics(
        &env.csi,
        EBS,
        Duration::from_secs(1),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(labelled, "EBS is a migration target");
    let config = test_config_for(&env.csi, &default_cli(), EBS).await;
    env.create_csinode_for("node-1", EBS, "i-0123").await;
    env.with_controller(config)
}

/// An in-tree EBS PV, migrated to the EBS driver by the PV controller.
fn ebs_pv_spec(volume_id: &str) -> Value {
    json!({
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "awsElasticBlockStore": {"volumeID": volume_id, "fsType": "xfs"},
    })
}

async fn create_ebs_pv(env: &Env, name: &str, volume_id: &str, migrated_to: Option<&str>) {
    env.create_pv(name, ebs_pv_spec(volume_id)).await;
    if let Some(driver) = migrated_to {
        annotate_pv(env, name, json!(driver)).await;
    }
}

async fn annotate_pv(env: &Env, name: &str, migrated_to: Value) {
    let patch = json!({"metadata": {"annotations": {MIGRATED_TO: migrated_to}}});
    env.pvs()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn metric_line(metrics: &str, method: &str, migrated: &str) -> Option<String> {
    let prefix = format!(
        "csi_sidecar_operations_seconds_count{{driver_name=\"{EBS}\",grpc_status_code=\"OK\",method_name=\"{method}\",migrated=\"{migrated}\"}} "
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
}

#[tokio::test]
async fn in_tree_volume_is_attached_and_detached_under_its_translated_handle() {
    let env = ebs_env().await;
    if skip_on_real_cluster(
        &env,
        "migration needs the fixed in-tree driver names, which concurrent tests would share",
    ) {
        return env.stop().await;
    }
    let handle = env.create_volume("ebs-1").await;
    assert!(handle.starts_with("vol-"), "{handle}");
    create_ebs_pv(
        &env,
        "pv-ebs",
        &format!("aws://us-east-1a/{handle}"),
        Some(EBS),
    )
    .await;
    env.create_va_for(
        "va-ebs",
        EBS,
        json!({"persistentVolumeName": "pv-ebs"}),
        "node-1",
    )
    .await;

    let va = env.wait_va("va-ebs", attached).await;
    assert_eq!(finalizers(&va.metadata), [EBS_FINALIZER]);
    let pv = env.pvs().get("pv-ebs").await.unwrap();
    assert_eq!(pv_finalizers(&pv.metadata), [EBS_FINALIZER]);
    let publish = &requests(&env.mock, CONTROLLER_PUBLISH_VOLUME)[0];
    assert_eq!(publish["volume_id"], handle.as_str());
    assert_eq!(publish["node_id"], "i-0123");
    assert_eq!(publish["volume_context"], json!({"partition": "0"}));
    assert_eq!(publish["volume_capability"]["mount"]["fs_type"], "xfs");
    assert_eq!(
        publish["volume_capability"]["access_mode"]["mode"],
        "SINGLE_NODE_WRITER"
    );

    env.delete_va("va-ebs").await;
    env.wait_va_gone("va-ebs").await;
    let unpublish = &requests(&env.mock, CONTROLLER_UNPUBLISH_VOLUME)[0];
    assert_eq!(unpublish["volume_id"], handle.as_str());
    assert_eq!(unpublish["node_id"], "i-0123");

    let metrics = env.csi.metrics().render().unwrap();
    for (method, migrated) in [
        ("/csi.v1.Controller/ControllerPublishVolume", "true"),
        ("/csi.v1.Controller/ControllerUnpublishVolume", "true"),
        ("/csi.v1.Identity/Probe", "false"),
        ("/csi.v1.Controller/ControllerGetCapabilities", "false"),
    ] {
        assert_eq!(
            metric_line(&metrics, method, migrated).as_deref(),
            Some("1"),
            "{method} migrated={migrated} in\n{metrics}"
        );
    }
    env.stop().await;
}

#[tokio::test]
async fn csi_volumes_of_a_migration_target_are_not_labelled_migrated() {
    let env = ebs_env().await;
    if skip_on_real_cluster(
        &env,
        "migration needs the fixed in-tree driver names, which concurrent tests would share",
    ) {
        return env.stop().await;
    }
    let handle = env.create_volume("csi-1").await;
    let mut spec = csi_pv_spec(&handle);
    spec["csi"]["driver"] = json!(EBS);
    env.create_pv("pv-csi", spec).await;
    env.create_va_for(
        "va-csi",
        EBS,
        json!({"persistentVolumeName": "pv-csi"}),
        "node-1",
    )
    .await;
    env.wait_va("va-csi", attached).await;
    let metrics = env.csi.metrics().render().unwrap();
    assert_eq!(
        metric_line(
            &metrics,
            "/csi.v1.Controller/ControllerPublishVolume",
            "false"
        )
        .as_deref(),
        Some("1"),
        "{metrics}"
    );
    assert_eq!(
        metric_line(
            &metrics,
            "/csi.v1.Controller/ControllerPublishVolume",
            "true"
        ),
        None
    );
    env.stop().await;
}

#[tokio::test]
async fn a_rolled_back_migration_releases_the_finalizer_once_no_attachment_needs_it() {
    let env = ebs_env().await;
    if skip_on_real_cluster(
        &env,
        "migration needs the fixed in-tree driver names, which concurrent tests would share",
    ) {
        return env.stop().await;
    }
    let handle = env.create_volume("ebs-2").await;
    create_ebs_pv(&env, "pv-back", &handle, Some(EBS)).await;
    create_ebs_pv(&env, "pv-still", &format!("aws:///{handle}"), Some(EBS)).await;
    env.create_va_for(
        "va-back",
        EBS,
        json!({"persistentVolumeName": "pv-back"}),
        "node-1",
    )
    .await;
    env.wait_va("va-back", attached).await;
    env.wait_pv("pv-back", |pv| {
        pv.is_some_and(|pv| pv_finalizers(&pv.metadata) == [EBS_FINALIZER])
    })
    .await;
    // Our finalizer on a PV still migrated to us, which no attachment names, stays.
    let patch = json!({"metadata": {"finalizers": [EBS_FINALIZER]}});
    env.pvs()
        .patch(
            "pv-still",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();

    // Migration is switched off: the PV controller drops the annotation. The attachment still
    // names the PV, so the finalizer stays until the attachment is gone.
    annotate_pv(&env, "pv-back", Value::Null).await;
    env.delete_va("va-back").await;
    env.wait_va_gone("va-back").await;
    env.wait_pv("pv-back", |pv| {
        pv.is_some_and(|pv| pv_finalizers(&pv.metadata).is_empty())
    })
    .await;
    let still = env.pvs().get("pv-still").await.unwrap();
    assert_eq!(pv_finalizers(&still.metadata), [EBS_FINALIZER]);
    assert_eq!(
        requests(&env.mock, CONTROLLER_UNPUBLISH_VOLUME).len(),
        1,
        "detached before the finalizer went"
    );
    env.stop().await;
}

#[tokio::test]
async fn an_untranslatable_in_tree_volume_is_reported_without_touching_the_pv() {
    let env = ebs_env().await;
    if skip_on_real_cluster(
        &env,
        "migration needs the fixed in-tree driver names, which concurrent tests would share",
    ) {
        return env.stop().await;
    }
    create_ebs_pv(&env, "pv-bad", "aws://us-east-1a/not-a-volume", Some(EBS)).await;
    env.create_va_for(
        "va-bad",
        EBS,
        json!({"persistentVolumeName": "pv-bad"}),
        "node-1",
    )
    .await;
    let message = "failed to translate in tree pv to CSI: failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://us-east-1a/not-a-volume)";
    env.wait_va("va-bad", |va| {
        attach_error(va).is_some_and(|(m, _)| m == message)
    })
    .await;
    env.wait_event("va-bad", "AttachFailed", "Invalid format for AWS volume")
        .await;
    let pv = env.pvs().get("pv-bad").await.unwrap();
    assert!(pv_finalizers(&pv.metadata).is_empty());
    assert_eq!(env.mock.calls().count(CONTROLLER_PUBLISH_VOLUME), 0);

    // Fixed by hand: a PV's source is immutable, so it is created again with a valid ID, and
    // the waiting attachment goes on.
    env.pvs()
        .delete("pv-bad", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_pv("pv-bad", |pv| pv.is_none()).await;
    let handle = env.create_volume("ebs-3").await;
    create_ebs_pv(&env, "pv-bad", &handle, Some(EBS)).await;
    env.wait_va("va-bad", attached).await;
    env.stop().await;
}
