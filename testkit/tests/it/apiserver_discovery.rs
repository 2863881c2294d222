//! Discovery, Table rendering, content negotiation and the kubeconfig.

use crate::apiserver_support::{Lines, obj, raw, raw_accept};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::Discovery;
use kube::{Api, Client, Config};
use serde_json::json;
use testkit::apiserver::ApiServer;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

#[tokio::test]
async fn discovery_documents() {
    let server = ApiServer::start().await.unwrap();
    let c = server.client();
    let (code, api) = raw(&c, "GET", "/api", None, "").await;
    assert_eq!((code, api["versions"].clone()), (200, json!(["v1"])));
    let (_, apis) = raw(&c, "GET", "/apis", None, "").await;
    let groups: Vec<&str> = apis["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["name"].as_str().unwrap())
        .collect();
    for g in [
        "storage.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "snapshot.storage.k8s.io",
    ] {
        assert!(groups.contains(&g), "{g}");
    }
    let (_, core) = raw(&c, "GET", "/api/v1", None, "").await;
    let pvc = core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "persistentvolumeclaims")
        .unwrap();
    assert_eq!(
        (pvc["namespaced"].as_bool(), pvc["shortNames"].clone()),
        (Some(true), json!(["pvc"]))
    );
    let (_, version) = raw(&c, "GET", "/version", None, "").await;
    assert_eq!(version["major"], "1");
    assert_eq!(
        raw(&c, "GET", "/apis/nope.example.com/v1", None, "")
            .await
            .0,
        404
    );
    assert_eq!(raw(&c, "GET", "/api/v1/widgets", None, "").await.0, 404);
    let (_, oapi) = raw(&c, "GET", "/openapi/v3", None, "").await;
    let url = oapi["paths"]["apis/storage.k8s.io/v1"]["serverRelativeURL"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(raw(&c, "GET", &url, None, "").await.0, 200);
    // kube's own discovery walks the same documents.
    let discovery = Discovery::new(c).run().await.unwrap();
    assert!(
        discovery
            .groups()
            .any(|g| g.name() == "snapshot.storage.k8s.io")
    );
}

#[tokio::test]
async fn tables_for_get_list_and_watch() {
    let server = ApiServer::start().await.unwrap();
    let c = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "a"}})),
    )
    .await
    .unwrap();
    let (code, t) = raw_accept(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        Some(TABLE),
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(
        (t["kind"].as_str(), t["apiVersion"].as_str()),
        (Some("Table"), Some("meta.k8s.io/v1"))
    );
    let cols: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(cols, ["Name", "Age"]);
    assert_eq!(t["rows"][0]["cells"][0], "a");
    assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "a");
    let (_, one) = raw_accept(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps/a",
        None,
        Some(TABLE),
        "",
    )
    .await;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
    let mut w = Lines::open_accept(
        &c,
        "/api/v1/namespaces/default/configmaps?watch=1",
        Some(TABLE),
    )
    .await;
    let ev = w.next().await.unwrap();
    assert_eq!(
        (ev["type"].as_str(), ev["object"]["kind"].as_str()),
        (Some("ADDED"), Some("Table"))
    );
    assert_eq!(ev["object"]["rows"][0]["cells"][0], "a");
    // Protobuf only: served for the built-in kinds, 406 for custom resources
    // (which have no protobuf encoding, as on a real server).
    let (code, _) = raw_accept(
        &c,
        "GET",
        "/api/v1/persistentvolumes",
        None,
        Some("application/vnd.kubernetes.protobuf"),
        "",
    )
    .await;
    assert_eq!(code, 200);
    let (code, _) = raw_accept(
        &c,
        "GET",
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshots",
        None,
        Some("application/vnd.kubernetes.protobuf"),
        "",
    )
    .await;
    assert_eq!(code, 406);
}

#[tokio::test]
async fn kubeconfig_drives_a_kube_client() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    server.write_kubeconfig(&path).unwrap();
    for p in [path.as_path(), server.kubeconfig_path()] {
        let config = Config::from_custom_kubeconfig(
            Kubeconfig::read_from(p).unwrap(),
            &KubeConfigOptions::default(),
        )
        .await
        .unwrap();
        assert_eq!(config.cluster_url.to_string(), format!("{}/", server.url()));
        let client = Client::try_from(config).unwrap();
        let cms: Api<ConfigMap> = Api::default_namespaced(client);
        assert!(
            cms.list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
    }
    let (code, _) = raw(&server.client(), "GET", "/healthz", None, "").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn shutdown_ends_open_watches_and_stops_serving() {
    let server = ApiServer::start().await.unwrap();
    let client = server.client();
    let url = server.url();
    let mut w = Lines::open(&client, "/api/v1/configmaps?watch=1").await;
    server.shutdown().await;
    assert!(w.next().await.is_none());
    let addr = url.trim_start_matches("http://").to_string();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the port is closed"
    );
}
