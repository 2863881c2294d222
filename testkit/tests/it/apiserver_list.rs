//! LIST: selectors, paging, resourceVersion.

use crate::apiserver_support::{obj, raw, raw_tcp_get};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, PostParams, VersionMatch};
use kube::{Api, Error};
use serde_json::json;
use testkit::apiserver::ApiServer;

async fn seeded() -> (ApiServer, Api<ConfigMap>) {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for (name, labels) in [
        ("a", json!({"app": "web", "tier": "1"})),
        ("b", json!({"app": "db", "tier": "2"})),
        ("c", json!({"app": "web"})),
        ("d", json!({})),
    ] {
        cms.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": name, "labels": labels}})),
        )
        .await
        .unwrap();
    }
    (server, cms)
}

async fn names(api: &Api<ConfigMap>, lp: &ListParams) -> Vec<String> {
    api.list(lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| c.metadata.name.unwrap())
        .collect()
}

#[tokio::test]
async fn label_selector_operators() {
    let (_s, cms) = seeded().await;
    let sel = |s: &str| ListParams::default().labels(s);
    assert_eq!(names(&cms, &sel("app=web")).await, ["a", "c"]);
    assert_eq!(names(&cms, &sel("app==db")).await, ["b"]);
    assert_eq!(names(&cms, &sel("app!=web")).await, ["b", "d"]);
    assert_eq!(names(&cms, &sel("tier in (1,2)")).await, ["a", "b"]);
    assert_eq!(names(&cms, &sel("tier notin (1)")).await, ["b", "c", "d"]);
    assert_eq!(names(&cms, &sel("tier")).await, ["a", "b"]);
    assert_eq!(names(&cms, &sel("!tier")).await, ["c", "d"]);
    assert_eq!(names(&cms, &sel("app=web,!tier")).await, ["c"]);
    match cms.list(&sel("app in web")).await.unwrap_err() {
        Error::Api(s) => assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest")),
        e => panic!("{e}"),
    }
}

#[tokio::test]
async fn field_selectors_supported_and_unsupported() {
    let (s, cms) = seeded().await;
    assert_eq!(
        names(&cms, &ListParams::default().fields("metadata.name=b")).await,
        ["b"]
    );
    assert_eq!(
        names(
            &cms,
            &ListParams::default().fields("metadata.name!=b,metadata.namespace=default")
        )
        .await,
        ["a", "c", "d"]
    );
    match cms
        .list(&ListParams::default().fields("data.x=1"))
        .await
        .unwrap_err()
    {
        Error::Api(st) => {
            assert_eq!((st.code, st.reason.as_str()), (400, "BadRequest"));
            assert_eq!(st.message, "field label not supported: data.x");
        }
        e => panic!("{e}"),
    }
    let pods: Api<Pod> = Api::namespaced(s.client(), "default");
    pods.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": []}})),
    )
    .await
    .unwrap();
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=n1"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        pods.list(&ListParams::default().fields("spec.nodeName=n2"))
            .await
            .unwrap()
            .items
            .len(),
        0
    );
    let (code, _) = raw(
        &s.client(),
        "GET",
        "/apis/storage.k8s.io/v1/volumeattachments?fieldSelector=spec.attacher%3Dx",
        None,
        "",
    )
    .await;
    assert_eq!(
        code, 400,
        "the real server has no spec.attacher field selector"
    );
}

#[tokio::test]
async fn limit_and_continue_page_through_a_consistent_snapshot() {
    let (s, cms) = seeded().await;
    let first = cms.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    assert_eq!(first.metadata.remaining_item_count, Some(1));
    let token = first.metadata.continue_.clone().unwrap();
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "e"}})),
    )
    .await
    .unwrap();
    let second = cms
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    let rest: Vec<_> = second
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        rest,
        ["d"],
        "objects created after the first page are not in the snapshot"
    );
    assert_eq!(
        second.metadata.resource_version,
        first.metadata.resource_version
    );
    assert!(second.metadata.continue_.is_none());
    s.faults().compact_history();
    match cms
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap_err()
    {
        Error::Api(st) => assert_eq!((st.code, st.reason.as_str()), (410, "Expired")),
        e => panic!("{e}"),
    }
    let (code, _) = raw(
        &s.client(),
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=1&continue=garbage",
        None,
        "",
    )
    .await;
    assert_eq!(code, 400);
}

#[tokio::test]
async fn list_resource_version_semantics() {
    let (s, cms) = seeded().await;
    let before = cms.list(&ListParams::default()).await.unwrap();
    let rv = before.metadata.resource_version.clone().unwrap();
    assert_eq!(rv.parse::<u64>().unwrap(), s.resource_version());
    cms.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "z"}})),
    )
    .await
    .unwrap();
    let exact = cms
        .list(&ListParams::default().at(&rv).matching(VersionMatch::Exact))
        .await
        .unwrap();
    assert_eq!(exact.items.len(), 4, "Exact reads the old state");
    let newer = cms
        .list(
            &ListParams::default()
                .at(&rv)
                .matching(VersionMatch::NotOlderThan),
        )
        .await
        .unwrap();
    assert_eq!(newer.items.len(), 5);
    let any = cms.list(&ListParams::default().match_any()).await.unwrap();
    assert_eq!(any.items.len(), 5);
    let (code, status) = raw_tcp_get(s.addr(), "/api/v1/namespaces/default/configmaps?resourceVersion=99999&resourceVersionMatch=NotOlderThan").await;
    assert_eq!((code, status["reason"].as_str()), (504, Some("Timeout")));
}

#[tokio::test]
async fn list_across_namespaces_and_delete_collection() {
    let (s, _cms) = seeded().await;
    let other: Api<ConfigMap> = Api::namespaced(s.client(), "kube-system");
    other
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "x", "labels": {"app": "web"}}})),
        )
        .await
        .unwrap();
    let all: Api<ConfigMap> = Api::all(s.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        5
    );
    let (code, list) = raw(
        &s.client(),
        "DELETE",
        "/api/v1/namespaces/default/configmaps?labelSelector=app%3Dweb",
        None,
        "",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(list["kind"], "ConfigMapList");
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert_eq!(
        all.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
}
