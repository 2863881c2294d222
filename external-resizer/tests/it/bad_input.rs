//! Bad input gets a clear Event and status, never a crash: missing secrets, sizes the API server
//! refuses, secrets reaching the driver and nothing else.

use crate::common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::mockdriver::MockDriver;

const EXPAND: &str = "/csi.v1.Controller/ControllerExpandVolume";

#[tokio::test]
async fn a_missing_expansion_secret_is_reported_and_the_expansion_resumes_once_it_exists() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    let secret_ref = json!({"spec": {"csi": {"controllerExpandSecretRef":
        {"name": "expand-creds", "namespace": env.ns()}}}});
    env.bound_claim_with("s", GI, true, json!({}), secret_ref)
        .await;
    env.request("s", "2Gi").await;
    let failed = eventually("the missing secret's Event", || async {
        env.events("s")
            .await
            .into_iter()
            .find(|(_, reason, _)| reason == "VolumeResizeFailed")
    })
    .await;
    assert_eq!(failed.0, "Warning");
    assert!(
        failed.2.contains(&format!(
            "error getting secret expand-creds in namespace {}",
            env.ns()
        )),
        "{}",
        failed.2
    );
    assert_eq!(
        env.mock.calls().count(EXPAND),
        0,
        "the driver is not called without its secret"
    );
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "expand-creds"},
        "stringData": {"token": "s3cr3t-value"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    env.claim_until("s", "the expansion", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    let calls = env.mock.calls().of(EXPAND);
    assert_eq!(calls.len(), 1);
    assert!(calls[0].carries_secret("token", "s3cr3t-value"));
    for (_, _, message) in env.events("s").await {
        assert!(!message.contains("s3cr3t-value"), "{message}");
    }
}

#[tokio::test]
async fn a_request_below_the_capacity_is_refused_by_the_api_server() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.bound_claim("small", 2 * GI, true, json!({})).await;
    let patch = json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}});
    let refused = env
        .claims()
        .patch("small", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a claim cannot ask for less than it has");
    match refused {
        kube::Error::Api(status) => assert_eq!(status.code, 422, "{status:?}"),
        other => panic!("{other}"),
    }
    assert_eq!(env.mock.calls().count(EXPAND), 0);
}
