//! `--handle-volume-inuse-error`: an expansion the driver refuses while the volume is in use
//! waits for the pods that use it, and resumes as soon as the last one is gone.

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use testkit::mockdriver::MockDriver;
use tonic::Code;

const EXPAND: &str = "/csi.v1.Controller/ControllerExpandVolume";

#[tokio::test]
async fn an_offline_only_expansion_waits_for_the_pod_and_resumes_when_it_goes() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.bound_claim("busy", GI, true, json!({})).await;
    let pods: Api<Pod> = Api::namespaced(env.client(), env.ns());
    let pod = json!({
        "metadata": {"name": "user"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "nodeName": env.n("nowhere"),
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "busy"}}]},
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    env.mock
        .faults()
        .fail_next(EXPAND, 1, Code::FailedPrecondition, "volume is in use");
    env.request("busy", "2Gi").await;
    let refused = eventually("the in-use Event", || async {
        env.events("busy")
            .await
            .into_iter()
            .find(|(_, _, message)| message.contains("only supports offline expansion"))
    })
    .await;
    assert_eq!(refused.1, "VolumeResizeFailed");
    assert_eq!(
        refused.2,
        format!(
            "Unable to expand {}/busy because CSI driver {} only supports offline expansion and volume is currently in-use",
            env.ns(),
            env.driver
        )
    );
    assert_eq!(
        env.mock.calls().count(EXPAND),
        1,
        "not retried while the pod runs"
    );
    pods.delete("user", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    env.claim_until("busy", "the expansion after the pod", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    assert_eq!(env.mock.calls().count(EXPAND), 2);
}
