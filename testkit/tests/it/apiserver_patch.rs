//! PATCH in its three formats, and the formats the server refuses.

use crate::apiserver_support::{obj, raw};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::apiserver::ApiServer;

async fn server_with_pv() -> (ApiServer, Api<PersistentVolume>) {
    let server = ApiServer::start().await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(server.client());
    let pv: PersistentVolume = obj(json!({
        "metadata": {"name": "pv", "labels": {"a": "1"}, "annotations": {"x/y": "1"}, "finalizers": ["kubernetes.io/pv-protection"]},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "csi": {"driver": "csi.example.com", "volumeHandle": "h"}}
    }));
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    (server, pvs)
}

#[tokio::test]
async fn merge_patch_sets_and_removes_fields() {
    let (_s, pvs) = server_with_pv().await;
    let p = pvs
        .patch("pv", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"a": null, "b": "2"}}, "spec": {"accessModes": ["ReadOnlyMany"]}})))
        .await
        .unwrap();
    assert_eq!(
        p.metadata.labels.unwrap(),
        [("b".to_string(), "2".to_string())].into()
    );
    assert_eq!(
        p.spec.unwrap().access_modes.unwrap(),
        vec!["ReadOnlyMany".to_string()]
    );
}

#[tokio::test]
async fn json_patch_with_test_ops_as_the_attacher_sends_them() {
    let (s, pvs) = server_with_pv().await;
    let current = pvs.get("pv").await.unwrap();
    let ops = json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": current.metadata.resource_version},
        {"op": "test", "path": "/metadata/finalizers", "value": ["kubernetes.io/pv-protection"]},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "external-attacher/csi-example-com"},
        {"op": "replace", "path": "/metadata/annotations/x~1y", "value": "2"}
    ]);
    let p = pvs
        .patch(
            "pv",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(ops.clone()).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        vec![
            "kubernetes.io/pv-protection",
            "external-attacher/csi-example-com"
        ]
    );
    assert_eq!(p.metadata.annotations.unwrap()["x/y"], "2");
    // The same patch again: the resourceVersion test now fails -> 422 Invalid, as upstream answers.
    let (code, status) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("application/json-patch+json"),
        &ops.to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["message"],
        "the server rejected our request due to an error in our request"
    );
    assert!(
        status["details"]["causes"][0]["message"]
            .as_str()
            .unwrap()
            .contains("test failed")
    );
    let (code, _) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("application/json-patch+json"),
        r#"[{"op":"remove","path":"/metadata/nothing"}]"#,
    )
    .await;
    assert_eq!(code, 422);
    let (code, status) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("application/json-patch+json"),
        r#"{"op":"add"}"#,
    )
    .await;
    assert_eq!((code, status["reason"].as_str()), (400, Some("BadRequest")));
}

#[tokio::test]
async fn strategic_merge_patch_merges_finalizers_and_keyed_lists() {
    let (s, pvs) = server_with_pv().await;
    let p = pvs
        .patch(
            "pv",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"finalizers": ["example.com/b"], "labels": {"c": "3"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        vec!["example.com/b", "kubernetes.io/pv-protection"]
    );
    assert_eq!(p.metadata.labels.unwrap().len(), 2);
    let p = pvs
        .patch(
            "pv",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/b"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.finalizers.unwrap(),
        vec!["kubernetes.io/pv-protection"]
    );
    let nodes: Api<CSINode> = Api::all(s.client());
    let node: CSINode = obj(
        json!({"metadata": {"name": "n1"}, "spec": {"drivers": [{"name": "a", "nodeID": "1"}]}}),
    );
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let n = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"drivers": [{"name": "b", "nodeID": "2"}]}})),
        )
        .await
        .unwrap();
    let names: Vec<String> = n.spec.drivers.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, ["b", "a"], "drivers merge by name");
    let n = nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"drivers": [{"name": "a", "$patch": "delete"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(n.spec.drivers.len(), 1);
    // A directive on a list this server does not merge is refused, never guessed.
    let (code, _) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("application/strategic-merge-patch+json"),
        r#"{"spec":{"$setElementOrder/accessModes":["ReadWriteOnce"]}}"#,
    )
    .await;
    assert_eq!(code, 415);
}

#[tokio::test]
async fn unsupported_patch_formats_get_415() {
    let (s, _pvs) = server_with_pv().await;
    let (code, status) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("application/apply-patch+yaml"),
        "metadata: {}",
    )
    .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    let (code, _) = raw(
        &s.client(),
        "PATCH",
        "/api/v1/persistentvolumes/pv",
        Some("text/plain"),
        "{}",
    )
    .await;
    assert_eq!(code, 415);
    let (code, _) = raw(
        &s.client(),
        "POST",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses",
        Some("application/json"),
        r#"{"metadata":{"name":"c"},"driver":"d","deletionPolicy":"Delete"}"#,
    )
    .await;
    assert_eq!(code, 201);
    let (code, _) = raw(
        &s.client(),
        "PATCH",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/c",
        Some("application/strategic-merge-patch+json"),
        "{}",
    )
    .await;
    assert_eq!(code, 415, "custom resources take no strategic merge patch");
    let (code, _) = raw(
        &s.client(),
        "PATCH",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/c",
        Some("application/merge-patch+json"),
        r#"{"metadata":{"labels":{"a":"b"}}}"#,
    )
    .await;
    assert_eq!(code, 200);
}
