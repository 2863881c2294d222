//! WATCH: resourceVersion semantics, bookmarks, timeouts, selectors, 410.

use std::time::Duration;

use crate::apiserver_support::{Lines, obj};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use testkit::apiserver::{ApiServer, Options};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

async fn create(api: &Api<ConfigMap>, name: &str, labels: serde_json::Value) -> ConfigMap {
    api.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": name, "labels": labels}})),
    )
    .await
    .unwrap()
}

fn rv(cm: &ConfigMap) -> String {
    cm.metadata.resource_version.clone().unwrap()
}

#[tokio::test]
async fn watch_from_zero_lists_then_streams() {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({})).await;
    let mut w = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=1&resourceVersion=0"),
    )
    .await;
    assert_eq!(w.status, 200);
    let ev = w.next().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );
    let b = create(&cms, "b", json!({})).await;
    let ev = w.next().await.unwrap();
    assert_eq!(ev["type"], "ADDED");
    assert_eq!(ev["object"]["metadata"]["resourceVersion"], rv(&b));
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    let ev = w.next().await.unwrap();
    assert_eq!(ev["type"], "DELETED");
    assert!(
        ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > rv(&b).parse().unwrap()
    );
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_later_events_only() {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let a = create(&cms, "a", json!({})).await;
    create(&cms, "b", json!({})).await;
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    let mut w = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=true&resourceVersion={}", rv(&a)),
    )
    .await;
    let e1 = w.next().await.unwrap();
    let e2 = w.next().await.unwrap();
    assert_eq!(
        (
            e1["type"].as_str(),
            e1["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("b"))
    );
    assert_eq!(
        (
            e2["type"].as_str(),
            e2["object"]["metadata"]["name"].as_str()
        ),
        (Some("MODIFIED"), Some("a"))
    );
}

#[tokio::test]
async fn watch_older_than_history_gets_410_error_event() {
    let server = ApiServer::start_with(Options {
        history_limit: 2,
        ..Options::default()
    })
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let a = create(&cms, "a", json!({})).await;
    for n in ["b", "c", "d"] {
        create(&cms, n, json!({})).await;
    }
    let mut w = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=1&resourceVersion={}", rv(&a)),
    )
    .await;
    assert_eq!(w.status, 200);
    let ev = w.next().await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["kind"], "Status");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(w.next().await.is_none(), "the stream ends after the error");
}

#[tokio::test]
async fn bookmarks_and_timeout() {
    let server = ApiServer::start_with(Options {
        bookmark_interval: Duration::from_millis(100),
        ..Options::default()
    })
    .await
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({})).await;
    let mut w = Lines::open(
        &server.client(),
        &format!(
            "{CMS}?watch=1&allowWatchBookmarks=true&timeoutSeconds=1&resourceVersion={}",
            server.resource_version()
        ),
    )
    .await;
    let mut bookmarks = 0;
    while let Some(ev) = w.next().await {
        assert_eq!(ev["type"], "BOOKMARK");
        assert_eq!(ev["object"]["kind"], "ConfigMap");
        assert_eq!(
            ev["object"]["metadata"]["resourceVersion"],
            server.resource_version().to_string()
        );
        bookmarks += 1;
    }
    assert!(
        bookmarks >= 2,
        "periodic bookmarks, then the stream ends at the timeout ({bookmarks})"
    );
}

#[tokio::test]
async fn send_initial_events_ends_with_a_marked_bookmark() {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({})).await;
    let mut w = Lines::open(&server.client(), &format!("{CMS}?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan")).await;
    assert_eq!(w.next().await.unwrap()["type"], "ADDED");
    let bm = w.next().await.unwrap();
    assert_eq!(bm["type"], "BOOKMARK");
    assert_eq!(
        bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let bad = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=1&sendInitialEvents=true"),
    )
    .await;
    assert_eq!(bad.status, 422);
}

#[tokio::test]
async fn selectors_turn_transitions_into_added_and_deleted() {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({"app": "web"})).await;
    let mut w = Lines::open(
        &server.client(),
        &format!(
            "{CMS}?watch=1&labelSelector=app%3Dweb&resourceVersion={}",
            server.resource_version()
        ),
    )
    .await;
    create(&cms, "other", json!({"app": "db"})).await;
    let off = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
        )
        .await
        .unwrap();
    let ev = w.next_event().await.unwrap();
    assert_eq!(
        ev["type"], "DELETED",
        "leaving the selector reads as a deletion"
    );
    assert_eq!(
        ev["object"]["metadata"]["labels"]["app"], "web",
        "with the previous state"
    );
    assert_eq!(ev["object"]["metadata"]["resourceVersion"], rv(&off));
    cms.patch(
        "other",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    let ev = w.next_event().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("other"))
    );
    let mut by_name = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=1&fieldSelector=metadata.name%3Dother"),
    )
    .await;
    assert_eq!(
        by_name.next().await.unwrap()["object"]["metadata"]["name"],
        "other"
    );
    let bad = Lines::open(
        &server.client(),
        &format!("{CMS}?watch=1&fieldSelector=data.k%3Dv"),
    )
    .await;
    assert_eq!(bad.status, 400);
}

#[tokio::test]
async fn namespaced_watch_sees_only_its_namespace() {
    let server = ApiServer::start().await.unwrap();
    let mut w = Lines::open(&server.client(), &format!("{CMS}?watch=1")).await;
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "kube-system");
    create(&other, "x", json!({})).await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "y", json!({})).await;
    assert_eq!(w.next().await.unwrap()["object"]["metadata"]["name"], "y");
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_closed_watches() {
    let server = ApiServer::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    create(&cms, "a", json!({})).await;
    let stream = watcher(cms.clone(), watcher::Config::default().any_semantic());
    let mut stream = Box::pin(kube::runtime::WatchStreamExt::applied_objects(stream));
    let first = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("a"));
    server.faults().close_watches(Some("configmaps"));
    create(&cms, "b", json!({})).await;
    let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next.metadata.name.as_deref(), Some("b"));
}
