//! The API behaviour the sidecars rely on, asserted through `TestCluster`:
//! in-process by default, against a real cluster when
//! `CSI_SIDECARS_TEST_KUBECONFIG` names a kubeconfig. What a real
//! kube-apiserver does is the reference; a test that needs in-process fault
//! injection prints why it skips on a real cluster.

mod apiserver_support;

use apiserver_support::{obj, raw};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::apiserver::TestCluster;

fn b64(s: &str) -> k8s_openapi::ByteString {
    k8s_openapi::ByteString(s.as_bytes().to_vec())
}

#[tokio::test]
async fn secret_string_data_is_merged_into_data_on_every_write() {
    let c = TestCluster::start().await.unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(c.client());
    let created = secrets
        .create(
            &PostParams::default(),
            &obj(json!({
                "metadata": {"name": "s"},
                "data": {"a": "b2xk", "b": "Yg=="},
                "stringData": {"a": "new", "c": "h\u{e9}"}
            })),
        )
        .await
        .unwrap();
    assert!(created.string_data.is_none(), "stringData is never stored");
    let data = created.data.clone().unwrap();
    assert_eq!(data["a"], b64("new"), "stringData wins over data");
    assert_eq!(data["b"], b64("b"));
    assert_eq!(data["c"], b64("h\u{e9}"), "the UTF-8 bytes");
    assert_eq!(created.type_.as_deref(), Some("Opaque"));

    let patched = secrets
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"b": "merge"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["b"], b64("merge"));
    assert!(patched.string_data.is_none());
    let patched = secrets
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Strategic(json!({"stringData": {"d": "strategic"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.as_ref().unwrap()["d"], b64("strategic"));
    assert!(patched.string_data.is_none());

    let mut replaced = patched.clone();
    replaced.string_data = Some([("e".to_string(), "update".to_string())].into());
    let replaced = secrets
        .replace("s", &PostParams::default(), &replaced)
        .await
        .unwrap();
    assert_eq!(replaced.data.as_ref().unwrap()["e"], b64("update"));
    assert!(replaced.string_data.is_none());
    let stored = secrets.get("s").await.unwrap();
    assert_eq!(stored.data, replaced.data);
    assert!(stored.string_data.is_none());

    let (code, body) = raw(
        &c.client(),
        "POST",
        &format!("/api/v1/namespaces/{}/secrets", c.namespace()),
        Some("application/json"),
        r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"bad"},"stringData":{"a/b":"x"}}"#,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
    c.cleanup().await.unwrap();
}
