//! Every gRPC code of CreateVolume and DeleteVolume, and the cluster-side situations that block
//! or delay provisioning and deletion.

use crate::common::{Env, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use tonic::Code;

const CODES: [Code; 15] = [
    Code::Cancelled,
    Code::Unknown,
    Code::InvalidArgument,
    Code::DeadlineExceeded,
    Code::NotFound,
    Code::AlreadyExists,
    Code::PermissionDenied,
    Code::ResourceExhausted,
    Code::FailedPrecondition,
    Code::Aborted,
    Code::OutOfRange,
    Code::Unimplemented,
    Code::Internal,
    Code::Unavailable,
    Code::DataLoss,
];

#[tokio::test]
async fn every_create_volume_code_ends_in_a_bound_claim() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    for (i, code) in CODES.iter().enumerate() {
        let before = requests(&env.mock, CREATE_VOLUME).len();
        env.mock
            .faults()
            .fail_next(CREATE_VOLUME, 1, *code, format!("failure {i}"));
        let name = format!("c{i}");
        env.create_claim(&name, &class, json!({})).await;
        env.wait_bound(&name).await;
        let calls = requests(&env.mock, CREATE_VOLUME);
        assert_eq!(
            calls.len() - before,
            2,
            "{code:?}: one failure, one success"
        );
        assert_eq!(
            calls[before],
            calls[before + 1],
            "{code:?}: the retry is identical"
        );
        let reported = format!(
            "rpc error: code = {}",
            sidecar_kit::process::metrics::code_label(*code)
        );
        env.wait_event(&name, "ProvisioningFailed", &reported).await;
    }
    assert_eq!(
        env.driver_volumes().len(),
        CODES.len(),
        "one volume per claim"
    );
    env.stop().await;
}

#[tokio::test]
async fn every_delete_volume_code_is_retried_until_the_volume_is_gone() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    for (i, code) in CODES.iter().enumerate() {
        let name = format!("d{i}");
        env.create_claim(&name, &class, json!({})).await;
        let pv = env.wait_bound(&name).await.metadata.name.unwrap();
        env.mock
            .faults()
            .fail_next(DELETE_VOLUME, 1, *code, format!("failure {i}"));
        env.delete_claim(&name).await;
        env.wait_pv_gone(&pv).await;
        let namespace = env.namespace();
        let events = env.events_for("default", &pv).await;
        let any = events
            .iter()
            .chain(env.events_for(&namespace, &pv).await.iter())
            .any(|e| {
                e.reason.as_deref() == Some("VolumeFailedDelete")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains(&format!("failure {i}")))
            });
        assert!(any, "{code:?}: a VolumeFailedDelete event");
    }
    assert!(env.driver_volumes().is_empty());
    assert_eq!(requests(&env.mock, DELETE_VOLUME).len(), 2 * CODES.len());
    env.stop().await;
}

#[tokio::test]
async fn deletion_waits_for_detach() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    let pv = env.wait_bound("data").await.metadata.name.unwrap();
    let va_name = env.unique("va");
    let va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": va_name},
        "spec": {"attacher": env.driver, "nodeName": "node-1", "source": {"persistentVolumeName": pv}}
    }))
    .unwrap();
    let vas: Api<VolumeAttachment> = Api::all(env.client());
    vas.create(&PostParams::default(), &va).await.unwrap();
    env.delete_claim("data").await;
    let expected = format!("persistentvolume {pv} is still attached to node node-1");
    eventually("the refusal event", || async {
        env.events_for("default", &pv).await.into_iter().find(|e| {
            e.reason.as_deref() == Some("VolumeFailedDelete")
                && e.message.as_deref() == Some(expected.as_str())
        })
    })
    .await;
    assert!(requests(&env.mock, DELETE_VOLUME).is_empty());
    vas.delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    env.wait_pv_gone(&pv).await;
    assert!(env.driver_volumes().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn a_pv_deleted_by_hand_keeps_its_volume_until_released() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    let pv = env.wait_bound("data").await.metadata.name.unwrap();
    env.pvs()
        .delete(&pv, &DeleteParams::default())
        .await
        .unwrap();
    // The finalizer holds the PV (and the volume) while the claim uses it.
    let still = env.pvs().get(&pv).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    assert_eq!(env.driver_volumes().len(), 1);
    env.delete_claim("data").await;
    env.wait_pv_gone(&pv).await;
    assert!(env.driver_volumes().is_empty(), "the volume went with it");
    env.stop().await;
}

#[tokio::test]
async fn a_missing_storage_class_is_waited_for() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let name = env.unique("sc-later");
    env.create_claim("early", &name, json!({})).await;
    // The claim waits: the class is created afterwards and the claim is provisioned.
    env.classes.push(name.clone());
    let sc: k8s_openapi::api::storage::v1::StorageClass =
        serde_json::from_value(json!({"metadata": {"name": name}, "provisioner": env.driver}))
            .unwrap();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(env.client())
        .create(&PostParams::default(), &sc)
        .await
        .unwrap();
    env.wait_bound("early").await;
    env.stop().await;
}

#[tokio::test]
async fn a_huge_request_gets_a_clear_event() {
    let mut env = Env::start(mock(), &[], |_| {}).await;
    let class = env.create_class(json!({})).await;
    env.create_claim(
        "huge",
        &class,
        json!({"spec": {"resources": {"requests": {"storage": "100Ei"}}}}),
    )
    .await;
    // kube-apiserver stores a request beyond int64 as the largest int64: the driver is asked
    // for that much, and its refusal reaches the claim.
    let requested = env
        .pvcs()
        .get("huge")
        .await
        .unwrap()
        .spec
        .unwrap()
        .resources
        .unwrap();
    assert_eq!(
        requested.requests.unwrap()["storage"].0,
        i64::MAX.to_string()
    );
    env.wait_event(
        "huge",
        "ProvisioningFailed",
        &format!(
            "rpc error: code = OutOfRange desc = {} bytes exceed the maximum volume size",
            i64::MAX
        ),
    )
    .await;
    let creates = requests(&env.mock, CREATE_VOLUME);
    assert_eq!(
        creates[0]["capacity_range"]["required_bytes"],
        json!(i64::MAX)
    );
    env.stop().await;
}
