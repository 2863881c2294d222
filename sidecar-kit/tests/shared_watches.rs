//! Watches shared by the controllers of one process: one watch per kind for all of them, each
//! controller sees every object, a controller that joins late gets a list of its own, and the
//! watch goes on for those that stay.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use sidecar_kit::pipeline::{Change, Pipeline};
use sidecar_kit::watches::WatchHub;
use testkit::apiserver::{Options, TestCluster, Verb};
use tokio_util::sync::CancellationToken;

type Seen = Arc<Mutex<BTreeSet<String>>>;

/// A pipeline of `hub` that keeps the names of the ConfigMaps it is told of.
fn subscriber(hub: &WatchHub, api: &Api<ConfigMap>) -> (Pipeline, Seen) {
    let seen: Seen = Arc::default();
    let mut pipeline = Pipeline::with_watches(hub.clone());
    let names = seen.clone();
    pipeline.watch(api.clone(), watcher::Config::default(), move |change| {
        let mut names = names.lock().unwrap();
        match change {
            Change::Apply(o) | Change::Listed(o) => {
                names.insert(o.metadata.name.clone().unwrap_or_default());
            }
            Change::Delete(o) => {
                names.remove(o.metadata.name.as_deref().unwrap_or_default());
            }
            Change::Relist | Change::Relisted => {}
        }
    });
    (pipeline, seen)
}

async fn create(api: &Api<ConfigMap>, name: &str) {
    let object = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

async fn until_seen(seen: &Seen, names: &[&str]) {
    let want: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !want.is_subset(&seen.lock().unwrap()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never saw {want:?}: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn controllers_of_one_process_share_one_watch_per_kind() {
    let cluster = TestCluster::start_with(Options::default()).await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), cluster.namespace());
    create(&api, "a").await;
    create(&api, "b").await;
    let shutdown = CancellationToken::new();
    let hub = WatchHub::shared();
    let (mut first, first_seen) = subscriber(&hub, &api);
    let (mut second, second_seen) = subscriber(&hub, &api);
    assert!(first.wait_synced(&shutdown).await && second.wait_synced(&shutdown).await);
    until_seen(&first_seen, &["a", "b"]).await;
    until_seen(&second_seen, &["a", "b"]).await;
    assert_eq!(hub.lists(), 1, "one watch for both");
    if let Some(counters) = cluster.counters() {
        assert_eq!(counters.get(Verb::List, "configmaps"), 1);
    }
    create(&api, "c").await;
    until_seen(&first_seen, &["c"]).await;
    until_seen(&second_seen, &["c"]).await;

    // A controller that starts later (it became leader later) gets a list of its own.
    let (mut late, late_seen) = subscriber(&hub, &api);
    assert!(late.wait_synced(&shutdown).await);
    until_seen(&late_seen, &["a", "b", "c"]).await;
    assert_eq!(hub.lists(), 2);

    // The watch goes on for the one that stays.
    first.stop().await;
    second.stop().await;
    create(&api, "d").await;
    until_seen(&late_seen, &["d"]).await;
    assert!(!first_seen.lock().unwrap().contains("d"));
    late.stop().await;

    // Once every subscriber left, a new one starts a new watch.
    let (mut again, again_seen) = subscriber(&hub, &api);
    assert!(again.wait_synced(&shutdown).await);
    until_seen(&again_seen, &["a", "b", "c", "d"]).await;
    assert_eq!(hub.lists(), 3);
    again.stop().await;
    cluster.cleanup().await.unwrap();
}
