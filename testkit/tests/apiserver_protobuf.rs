//! Protobuf request and response bodies, sent as client-go's typed clients
//! and kubectl's imperative commands send them.

mod apiserver_support;

use std::process::{Command, Stdio};

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use serde_json::json;
use testkit::apiserver::ApiServer;
use testkit::apiserver::protobuf::{self, MEDIA_TYPE};

/// What client-go's typed clients send: protobuf first, JSON as the fallback.
const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";

async fn send(
    server: &ApiServer,
    method: &str,
    uri: &str,
    content_type: &str,
    body: Vec<u8>,
) -> (u16, String, Vec<u8>) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", content_type)
        .header("accept", ACCEPT)
        .body(body.into())
        .unwrap();
    let resp = server.client().send(req).await.unwrap();
    let code = resp.status().as_u16();
    let ct = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (code, ct, bytes)
}

#[tokio::test]
async fn protobuf_create_get_list_and_delete() {
    let server = ApiServer::start().await.unwrap();
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "p", "labels": {"a": "1"}}, "data": {"k": "v"}});
    let (code, ct, body) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        protobuf::encode_object(&cm).unwrap(),
    )
    .await;
    assert_eq!((code, ct.as_str()), (201, MEDIA_TYPE));
    let created = protobuf::decode_object(&body).unwrap();
    assert_eq!(created["data"], json!({"k": "v"}));
    assert!(created["metadata"]["uid"].is_string());
    assert!(created["metadata"]["creationTimestamp"].is_string());

    // The same object through JSON.
    let stored = Api::<ConfigMap>::namespaced(server.client(), "default")
        .get("p")
        .await
        .unwrap();
    assert_eq!(
        stored.metadata.resource_version.as_deref(),
        created["metadata"]["resourceVersion"].as_str()
    );
    assert_eq!(stored.metadata.labels.unwrap()["a"], "1");
    assert_eq!(
        serde_json::to_value(&stored.metadata.creation_timestamp).unwrap(),
        created["metadata"]["creationTimestamp"]
    );

    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps/p",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    assert_eq!(protobuf::decode_object(&body).unwrap(), created);

    let (code, ct, body) = send(
        &server,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, MEDIA_TYPE));
    let (_, kind, _) = protobuf::unwrap_envelope(&body).unwrap();
    assert_eq!(kind, "ConfigMapList");

    // A kind without a protobuf encoding here is answered in JSON, which client-go accepts.
    let (code, ct, _) = send(
        &server,
        "GET",
        "/api/v1/persistentvolumes",
        "application/json",
        vec![],
    )
    .await;
    assert_eq!((code, ct.as_str()), (200, "application/json"));

    // Secrets: stringData sent as protobuf is merged into data like any other.
    let secret = protobuf::Secret {
        metadata: Some(protobuf::ObjectMeta {
            name: Some("s".into()),
            ..Default::default()
        }),
        string_data: [("k".to_string(), "v".to_string())].into(),
        ..Default::default()
    };
    let (code, _, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/secrets",
        MEDIA_TYPE,
        protobuf::wrap_envelope("v1", "Secret", prost::Message::encode_to_vec(&secret)),
    )
    .await;
    assert_eq!(code, 201);
    let s = Api::<Secret>::namespaced(server.client(), "default")
        .get("s")
        .await
        .unwrap();
    assert_eq!(s.data.unwrap()["k"].0, b"v");
    assert!(s.string_data.is_none());

    // DELETE with protobuf DeleteOptions and a failing precondition.
    let opts = protobuf::DeleteOptions {
        preconditions: Some(protobuf::Preconditions {
            uid: Some("not-the-uid".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let (code, _, _) = send(
        &server,
        "DELETE",
        "/api/v1/namespaces/default/configmaps/p",
        MEDIA_TYPE,
        protobuf::wrap_envelope("v1", "DeleteOptions", prost::Message::encode_to_vec(&opts)),
    )
    .await;
    assert_eq!(code, 409);

    // Garbage is a 400, an unknown kind a 415.
    let (code, _, _) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        MEDIA_TYPE,
        b"k8s\0\xff\xff".to_vec(),
    )
    .await;
    assert_eq!(code, 400);
    let (code, _, _) = send(
        &server,
        "POST",
        "/api/v1/persistentvolumes",
        MEDIA_TYPE,
        protobuf::wrap_envelope("v1", "PersistentVolume", vec![]),
    )
    .await;
    assert_eq!(code, 415);
}

fn kubectl(server: &ApiServer, args: &[&str]) -> Option<String> {
    let out = Command::new("kubectl")
        .env("KUBECONFIG", server.kubeconfig_path())
        .env("HOME", server.kubeconfig_path().parent().unwrap())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// kubectl's imperative commands send protobuf (`Content-Type:
/// application/vnd.kubernetes.protobuf`, checked with `-v=8`) and decode the
/// protobuf answer to print their result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_imperative_creates() {
    let server = ApiServer::start().await.unwrap();
    let Some(out) = kubectl(&server, &["create", "namespace", "made-by-kubectl"]) else {
        println!("skipped: kubectl is not installed");
        return;
    };
    assert_eq!(out.trim(), "namespace/made-by-kubectl created");
    let ns = Api::<Namespace>::all(server.client())
        .get("made-by-kubectl")
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));

    let out = kubectl(
        &server,
        &[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "made-by-kubectl",
            "--from-literal=user=admin",
        ],
    )
    .unwrap();
    assert_eq!(out.trim(), "secret/creds created");
    let s = Api::<Secret>::namespaced(server.client(), "made-by-kubectl")
        .get("creds")
        .await
        .unwrap();
    assert_eq!(s.data.unwrap()["user"].0, b"admin");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));

    let out = kubectl(
        &server,
        &[
            "create",
            "configmap",
            "settings",
            "-n",
            "made-by-kubectl",
            "--from-literal=a=b",
        ],
    )
    .unwrap();
    assert_eq!(out.trim(), "configmap/settings created");
    let cm = Api::<ConfigMap>::namespaced(server.client(), "made-by-kubectl")
        .get("settings")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap()["a"], "b");
    let out = kubectl(
        &server,
        &["delete", "configmap", "settings", "-n", "made-by-kubectl"],
    )
    .unwrap();
    assert_eq!(out.trim(), "configmap \"settings\" deleted");
}
