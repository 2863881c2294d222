//! Watches shared by the controllers of one process: one watch per kind for all of them, each
//! controller sees every object, a controller that joins late gets a list of its own, and the
//! watch goes on for those that stay. A shared view holds what all its controllers read.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use sidecar_kit::pipeline::views::{Needs, PvView};
use sidecar_kit::pipeline::watches::{Start, WatchHub};
use sidecar_kit::pipeline::{Change, Pipeline};
use testkit::apiserver::{Faults, Hang, Options, RequestCounters, RequestMatch, TestCluster, Verb};
use tokio_util::sync::CancellationToken;

type Seen = Arc<Mutex<BTreeSet<String>>>;

/// A pipeline of `hub` that keeps the names of the ConfigMaps it is told of.
fn subscriber(hub: &WatchHub, api: &Api<ConfigMap>) -> (Pipeline, Seen) {
    let seen: Seen = Arc::default();
    let mut pipeline = Pipeline::with_watches(hub.clone());
    let names = seen.clone();
    // A re-list's names, which replace the ones seen before once it is complete.
    let mut listed = BTreeSet::new();
    pipeline.watch(api.clone(), watcher::Config::default(), move |change| {
        let mut names = names.lock().unwrap();
        let name = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
        match change {
            Change::Apply(o) => {
                names.insert(name(o));
            }
            Change::Delete(o) => {
                names.remove(&name(o));
            }
            Change::Relist => listed.clear(),
            Change::Listed(o) => {
                listed.insert(name(o));
            }
            Change::Relisted => *names = std::mem::take(&mut listed),
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
        assert_eq!(counters.lists("configmaps"), 1);
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

/// The views a pipeline of `hub` is handed, by name, for controllers that read `needs`.
fn view_subscriber(
    hub: &WatchHub,
    api: &Api<PersistentVolume>,
    needs: Needs,
) -> (Pipeline, Arc<Mutex<Vec<Arc<PvView>>>>) {
    let seen: Arc<Mutex<Vec<Arc<PvView>>>> = Arc::default();
    let mut pipeline = Pipeline::with_watches(hub.clone());
    let views = seen.clone();
    pipeline.watch_view(
        api.clone(),
        watcher::Config::default(),
        needs,
        Start::Awaited,
        move |change: Change<&Arc<PvView>>| {
            if let Change::Apply(view) | Change::Listed(view) = change {
                views.lock().unwrap().push(view.clone());
            }
        },
    );
    (pipeline, seen)
}

/// A retained CSI PV named `name`, bound to claim `c` of `namespace`.
fn pv(name: &str, namespace: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "claimRef": {"namespace": namespace, "name": "c", "uid": "u"},
                 "csi": {"driver": "views.csi.test", "volumeHandle": "h"}},
    }))
    .unwrap()
}

async fn until_viewed(
    seen: &Arc<Mutex<Vec<Arc<PvView>>>>,
    what: &str,
    test: impl Fn(&Arc<PvView>) -> bool,
) -> Arc<PvView> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(view) = seen.lock().unwrap().iter().rev().find(|v| test(v)) {
            return view.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "never saw {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_shared_view_holds_what_all_its_controllers_read() {
    let cluster = TestCluster::start_with(Options::default()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(cluster.client());
    let name = format!("{}-view", cluster.namespace());
    pvs.create(&PostParams::default(), &pv(&name, cluster.namespace()))
        .await
        .unwrap();
    let shutdown = CancellationToken::new();
    let hub = WatchHub::shared();
    let mine = |v: &Arc<PvView>| *v.name == *name;

    // A reader of claim refs alone: no access modes (it does not read them), its claim ref.
    let (mut claim_refs, claim_refs_seen) = view_subscriber(&hub, &pvs, Needs::CLAIM_REF);
    assert!(claim_refs.wait_synced(&shutdown).await);
    let alone = until_viewed(&claim_refs_seen, "the PV", mine).await;
    assert!(alone.access_modes.is_empty());
    assert!(alone.claim_ref.is_some());

    // A reader of access modes joins: the list that follows has both readers' fields, in one
    // view that both are handed.
    let (mut capabilities, capabilities_seen) = view_subscriber(&hub, &pvs, Needs::CAPABILITY);
    assert!(capabilities.wait_synced(&shutdown).await);
    let joined = until_viewed(&capabilities_seen, "the PV with both", |v| {
        mine(v) && !v.access_modes.is_empty() && v.claim_ref.is_some()
    })
    .await;
    let shared = until_viewed(&claim_refs_seen, "the PV again", |v| {
        mine(v) && Arc::ptr_eq(v, &joined)
    })
    .await;
    assert!(!shared.access_modes.is_empty());
    assert_eq!(hub.lists(), 2);

    claim_refs.stop().await;
    capabilities.stop().await;
    pvs.delete(&name, &Default::default()).await.unwrap();
    cluster.cleanup().await.unwrap();
}

/// On the test kit (`None` on a real cluster, whose watches cannot be ended on demand): its
/// faults and counters, and a subscriber to the ConfigMaps that has seen the one it made, `a`.
async fn subscribed_to_a(
    cluster: &TestCluster,
) -> Option<(Faults, RequestCounters, Api<ConfigMap>, Pipeline, Seen)> {
    let (Some(faults), Some(counters)) = (cluster.faults(), cluster.counters()) else {
        return None;
    };
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), cluster.namespace());
    create(&api, "a").await;
    let (mut pipeline, seen) = subscriber(&WatchHub::default(), &api);
    assert!(pipeline.wait_synced(&CancellationToken::new()).await);
    until_seen(&seen, &["a"]).await;
    Some((faults, counters, api, pipeline, seen))
}

/// A watch that ends (the server's timeout, a restart) or fails goes on from the last version
/// it saw: no list again, however many objects there are.
#[tokio::test]
async fn a_watch_that_ends_or_fails_goes_on_without_listing_again() {
    let cluster = TestCluster::start().await.unwrap();
    let Some((faults, counters, api, pipeline, seen)) = subscribed_to_a(&cluster).await else {
        return;
    };
    assert_eq!(counters.get(Verb::List, "configmaps"), 1);

    faults.close_watches(Some("configmaps"));
    create(&api, "b").await;
    until_seen(&seen, &["b"]).await;
    faults.fail_next(RequestMatch::new(Verb::Watch, "configmaps"), 1, 500);
    faults.close_watches(Some("configmaps"));
    create(&api, "c").await;
    until_seen(&seen, &["c"]).await;
    assert_eq!(faults.pending_failures(), 0, "the failed watch was retried");
    assert_eq!(counters.get(Verb::List, "configmaps"), 1);
    assert!(counters.get(Verb::Watch, "configmaps") >= 3);
    pipeline.stop().await;
    cluster.cleanup().await.unwrap();
}

/// A watch whose version the server no longer has (410 Gone, after a compaction) lists again,
/// and the objects deleted meanwhile are gone from the subscribers too.
#[tokio::test]
async fn a_watch_whose_version_is_gone_lists_again() {
    let cluster = TestCluster::start().await.unwrap();
    let Some((faults, counters, api, pipeline, seen)) = subscribed_to_a(&cluster).await else {
        return;
    };

    // While the watch is away: changes, then the history that held them is forgotten.
    faults.fail_next(RequestMatch::new(Verb::Watch, "configmaps"), u32::MAX, 503);
    faults.close_watches(Some("configmaps"));
    api.delete("a", &Default::default()).await.unwrap();
    create(&api, "b").await;
    faults.compact_history();
    faults.clear();
    until_seen(&seen, &["b"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.lock().unwrap().contains("a") {
        assert!(tokio::time::Instant::now() < deadline, "a is still seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counters.get(Verb::List, "configmaps"), 2);
    pipeline.stop().await;
    cluster.cleanup().await.unwrap();
}

/// The cluster's ConfigMaps (its namespace) and PVs, and the name of a PV created for the test.
async fn configmaps_and_a_pv(
    cluster: &TestCluster,
    suffix: &str,
) -> (Api<ConfigMap>, Api<PersistentVolume>, String) {
    let configmaps = Api::namespaced(cluster.client(), cluster.namespace());
    let pvs: Api<PersistentVolume> = Api::all(cluster.client());
    let name = format!("{}-{suffix}", cluster.namespace());
    pvs.create(&PostParams::default(), &pv(&name, cluster.namespace()))
        .await
        .unwrap();
    (configmaps, pvs, name)
}

/// Waits until a list of `resource` was asked for (answered or not).
async fn until_asked_to_list(counters: &RequestCounters, resource: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while counters.lists(resource) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no list of {resource}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A watch no work waits for (a provisioner's PVs) lists only once the awaited ones (its
/// claims) have listed, so that on a busy API server the list that holds work back does not
/// share it with a larger one; the work starts without it, and its objects come after.
#[tokio::test]
async fn a_list_no_work_waits_for_comes_after_the_awaited_ones() {
    let cluster = TestCluster::start().await.unwrap();
    let (Some(faults), Some(counters)) = (cluster.faults(), cluster.counters()) else {
        return;
    };
    let (configmaps, pvs, name) = configmaps_and_a_pv(&cluster, "behind").await;
    create(&configmaps, "a").await;
    let awaited_list = Duration::from_secs(2);
    faults.add_latency(RequestMatch::new(Verb::List, "configmaps"), awaited_list);

    // Subscribed in the provisioner's order: the one behind first, alone in its hub.
    let mut pipeline = Pipeline::with_watches(WatchHub::default());
    let seen: Arc<Mutex<Vec<Arc<PvView>>>> = Arc::default();
    let views = seen.clone();
    pipeline.watch_view(
        pvs.clone(),
        watcher::Config::default(),
        Needs::ALL,
        Start::Behind,
        move |change: Change<&Arc<PvView>>| {
            if let Change::Listed(view) = change {
                views.lock().unwrap().push(view.clone());
            }
        },
    );
    pipeline.watch(configmaps.clone(), watcher::Config::default(), |_| {});

    until_asked_to_list(&counters, "configmaps").await;
    let asked = tokio::time::Instant::now();
    // Half the awaited list's answer time: ten times the grace a list behind waits for the
    // subscriptions to settle.
    tokio::time::sleep(awaited_list / 2).await;
    assert_eq!(
        counters.lists("persistentvolumes"),
        0,
        "the PVs were listed while the awaited list was still unanswered"
    );
    assert!(pipeline.wait_synced(&CancellationToken::new()).await);
    assert!(asked.elapsed() >= awaited_list / 2);
    until_viewed(&seen, "the PV", |v| *v.name == *name).await;
    assert_eq!(counters.lists("persistentvolumes"), 1);
    faults.clear();
    pipeline.stop().await;
    pvs.delete(&name, &Default::default()).await.unwrap();
    cluster.cleanup().await.unwrap();
}

/// A watch behind that waits for the awaited lists lists at once when a subscriber that awaits
/// it joins (a controller of the same process that started later): that subscriber's own list
/// is one of those it waits for.
#[tokio::test]
async fn a_list_behind_lists_when_a_subscriber_that_awaits_it_joins() {
    let cluster = TestCluster::start().await.unwrap();
    let (Some(faults), Some(counters)) = (cluster.faults(), cluster.counters()) else {
        return;
    };
    let (configmaps, pvs, name) = configmaps_and_a_pv(&cluster, "joined").await;
    faults.hang_next(
        RequestMatch::new(Verb::List, "configmaps"),
        u32::MAX,
        Hang::BeforeServing,
    );
    let hub = WatchHub::default();
    let mut behind = Pipeline::with_watches(hub.clone());
    behind.watch_view(
        pvs.clone(),
        watcher::Config::default(),
        Needs::ALL,
        Start::Behind,
        |_: Change<&Arc<PvView>>| {},
    );
    behind.watch(configmaps.clone(), watcher::Config::default(), |_| {});
    until_asked_to_list(&counters, "configmaps").await;
    // Past the grace of the watch behind: it waits for the ConfigMaps, which never come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(counters.lists("persistentvolumes"), 0);

    let (mut joined, seen) = view_subscriber(&hub, &pvs, Needs::ALL);
    let synced = tokio::time::timeout(
        Duration::from_secs(10),
        joined.wait_synced(&CancellationToken::new()),
    )
    .await;
    assert_eq!(
        synced,
        Ok(true),
        "the joined subscriber waited for the list behind"
    );
    until_viewed(&seen, "the PV", |v| *v.name == *name).await;
    faults.clear();
    joined.stop().await;
    behind.stop().await;
    pvs.delete(&name, &Default::default()).await.unwrap();
    cluster.cleanup().await.unwrap();
}
