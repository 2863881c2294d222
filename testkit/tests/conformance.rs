//! The API behaviour the sidecars rely on, asserted through `TestCluster`:
//! in-process by default, against a real cluster when
//! `CSI_SIDECARS_TEST_KUBECONFIG` names a kubeconfig. What a real
//! kube-apiserver does is the reference; a test that needs in-process fault
//! injection prints why it skips on a real cluster.

mod apiserver_support;

use apiserver_support::{Lines, eventually, obj, raw};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, PersistentVolume, PersistentVolumeClaim, Secret,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Error};
use serde_json::{Value, json};
use testkit::apiserver::TestCluster;

fn api_error(e: Error) -> (u16, String) {
    match e {
        Error::Api(s) => (s.code, s.reason),
        other => panic!("expected an API error, got {other}"),
    }
}

fn configmap(name: &str, labels: Value) -> ConfigMap {
    obj(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
}

/// A PV no real controller acts on: Retain, a class nobody provisions, no claim.
fn pv(name: &str, class: &str) -> PersistentVolume {
    obj(json!({
        "metadata": {"name": name, "finalizers": ["example.com/a"]},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": class,
            "csi": {"driver": "conformance.example.com", "volumeHandle": name}
        }
    }))
}

fn finalizers_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Vec<String> {
    m.finalizers.clone().unwrap_or_default()
}

fn has(list: &[String], item: &str) -> bool {
    list.iter().any(|f| f == item)
}

fn skip(what: &str) {
    println!("skipped on a real cluster: {what} needs the in-process server");
}

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

#[tokio::test]
async fn writes_with_a_stale_resource_version_conflict() {
    let c = TestCluster::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let first = cms
        .create(&PostParams::default(), &configmap("c", json!({})))
        .await
        .unwrap();
    let e = cms
        .create(&PostParams::default(), &configmap("c", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "AlreadyExists".into()));
    let mut next = first.clone();
    next.data = Some([("k".to_string(), "2".to_string())].into());
    let updated = cms
        .replace("c", &PostParams::default(), &next)
        .await
        .unwrap();
    assert_ne!(
        updated.metadata.resource_version,
        first.metadata.resource_version
    );
    let mut stale = first.clone();
    stale.data = Some([("k".to_string(), "3".to_string())].into());
    let e = cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));
    assert_eq!(cms.get("c").await.unwrap().data, updated.data);
    // Without a resourceVersion an update is unconditional.
    stale.metadata.resource_version = None;
    let forced = cms
        .replace("c", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(forced.data, stale.data);
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn patches_in_each_format() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("patch-pv");
    let created = pvs
        .create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    assert!(has(&finalizers_of(&created.metadata), "example.com/a"));

    // Merge patch: maps merge, null deletes, lists are replaced.
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1", "y": "2"}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.as_ref().unwrap().len(), 2);
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        p.metadata.labels.unwrap(),
        [("y".to_string(), "2".to_string())].into()
    );

    // Strategic merge: finalizers merge as a set; $deleteFromPrimitiveList removes one.
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["example.com/b"]}})),
        )
        .await
        .unwrap();
    let f = finalizers_of(&p.metadata);
    assert!(
        has(&f, "example.com/a") && has(&f, "example.com/b"),
        "{f:?}"
    );
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a"]}}),
            ),
        )
        .await
        .unwrap();
    let f = finalizers_of(&p.metadata);
    assert!(
        !has(&f, "example.com/a") && has(&f, "example.com/b"),
        "{f:?}"
    );

    // JSON patch guarded by `test` ops, as the attacher sends it.
    let rv = p.metadata.resource_version.clone().unwrap();
    let ops = |rv: &str| -> Patch<()> {
        Patch::Json(
            serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/c"}
            ]))
            .unwrap(),
        )
    };
    let p = pvs
        .patch(&name, &PatchParams::default(), &ops(&rv))
        .await
        .unwrap();
    assert!(has(&finalizers_of(&p.metadata), "example.com/c"));
    let e = pvs
        .patch(&name, &PatchParams::default(), &ops(&rv))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422, "a failed test op is 422");

    pvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    pvs.delete(&name, &DeleteParams::default()).await.unwrap();
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn finalizers_keep_a_deleted_object_until_removed() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("final-pv");
    pvs.create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    let deleting = pvs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("an object with finalizers is returned, not a Status");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let still = pvs.get(&name).await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // No new finalizers on an object being deleted.
    let e = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"finalizers": ["example.com/new"]}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 422);
    // The real server's pv-protection finalizer goes too once the PV is unused;
    // remove every finalizer, as the last remover would.
    pvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let pvs2 = pvs.clone();
    let n2 = name.clone();
    eventually(|| {
        let pvs = pvs2.clone();
        let n = n2.clone();
        async move { pvs.get_opt(&n).await.unwrap().is_none().then_some(()) }
    })
    .await;

    // Namespaced objects too.
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let mut cm = configmap("f", json!({}));
    cm.metadata.finalizers = Some(vec!["example.com/a".into()]);
    cms.create(&PostParams::default(), &cm).await.unwrap();
    cms.delete("f", &DeleteParams::default()).await.unwrap();
    assert!(
        cms.get("f")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    cms.patch(
        "f",
        &PatchParams::default(),
        &Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "remove", "path": "/metadata/finalizers/0"}]))
                .unwrap(),
        ),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("f").await.unwrap().is_none());
    c.cleanup().await.unwrap();
}

/// Main writes keep the stored status; status writes keep the stored spec and metadata.
#[tokio::test]
async fn status_subresource_separates_spec_and_status() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");

    // PersistentVolumeClaim (a class nobody provisions: it stays Pending).
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let claim: PersistentVolumeClaim = obj(json!({
        "metadata": {"name": "claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"}
    }));
    let created = pvcs.create(&PostParams::default(), &claim).await.unwrap();
    assert_eq!(
        created.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending"),
        "status sent on create is dropped"
    );
    let p = pvcs
        .patch(
            "claim",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "1"}}, "status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.as_ref().unwrap()["a"], "1");
    assert_ne!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Lost")
    );
    let p = pvcs
        .patch_status(
            "claim",
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"a": "2"}},
                "spec": {"storageClassName": "other"},
                "status": {"conditions": [{"type": "Resizing", "status": "True"}]}
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        p.status.as_ref().unwrap().conditions.as_ref().unwrap()[0].type_,
        "Resizing"
    );
    assert_eq!(
        p.spec.as_ref().unwrap().storage_class_name.as_deref(),
        Some(class.as_str())
    );
    assert_eq!(p.metadata.labels.as_ref().unwrap()["a"], "1");

    // PersistentVolume.
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("status-pv");
    pvs.create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Failed", "message": "main"}})),
        )
        .await
        .unwrap();
    assert_ne!(
        p.status.as_ref().and_then(|s| s.message.as_deref()),
        Some("main")
    );
    let p = pvs
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "spec": {"capacity": {"storage": "5Gi"}},
                "status": {"message": "via status"}
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        p.status.as_ref().and_then(|s| s.message.as_deref()),
        Some("via status")
    );
    assert_eq!(
        p.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"].0,
        "1Gi"
    );

    // VolumeAttachment, written the way the attacher writes it.
    let vas: Api<VolumeAttachment> = Api::all(c.client());
    let va_name = c.cluster_name("va");
    let va: VolumeAttachment = obj(json!({
        "metadata": {"name": va_name},
        "spec": {"attacher": "conformance.example.com", "nodeName": c.cluster_name("node"),
                 "source": {"persistentVolumeName": name}},
        "status": {"attached": true}
    }));
    let created = vas.create(&PostParams::default(), &va).await.unwrap();
    assert!(created.status.as_ref().is_none_or(|s| !s.attached));
    let mut main = created.clone();
    main.status = Some(obj(json!({"attached": true})));
    main.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    let u = vas
        .replace(&va_name, &PostParams::default(), &main)
        .await
        .unwrap();
    assert!(u.status.as_ref().is_none_or(|s| !s.attached));
    assert_eq!(u.metadata.labels.as_ref().unwrap()["a"], "1");
    let mut st = u.clone();
    st.status = Some(obj(
        json!({"attached": true, "attachmentMetadata": {"k": "v"}}),
    ));
    st.spec.node_name = "elsewhere".into();
    let u = vas
        .replace_status(&va_name, &PostParams::default(), &st)
        .await
        .unwrap();
    assert!(u.status.as_ref().unwrap().attached);
    assert_eq!(u.spec.node_name, c.cluster_name("node"));
    // A stale resourceVersion conflicts on the status subresource too.
    let e = vas
        .replace_status(&va_name, &PostParams::default(), &st)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));

    vas.delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
    pvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    pvs.delete(&name, &DeleteParams::default()).await.unwrap();
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn list_pages_with_limit_and_continue() {
    let c = TestCluster::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("page-{i}"), json!({"set": "paging"})),
        )
        .await
        .unwrap();
    }
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut first_rv = None;
    loop {
        let mut lp = ListParams::default().labels("set=paging").limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await.unwrap();
        assert!(page.items.len() <= 2);
        pages += 1;
        let rv = page.metadata.resource_version.clone();
        // Every page reads the snapshot of the first.
        assert_eq!(*first_rv.get_or_insert(rv.clone()), rv);
        names.extend(page.items.iter().filter_map(|o| o.metadata.name.clone()));
        if pages == 1 {
            // Created after the first page: not in this listing.
            cms.create(
                &PostParams::default(),
                &configmap("page-9", json!({"set": "paging"})),
            )
            .await
            .unwrap();
        }
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => token = Some(t),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(names, ["page-0", "page-1", "page-2", "page-3", "page-4"]);
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn expired_continue_tokens_and_resource_versions_are_410() {
    let c = TestCluster::start().await.unwrap();
    let Some(server) = c.server() else {
        skip("compacting the history");
        return c.cleanup().await.unwrap();
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    for i in 0..3 {
        cms.create(
            &PostParams::default(),
            &configmap(&format!("e-{i}"), json!({})),
        )
        .await
        .unwrap();
    }
    let page = cms.list(&ListParams::default().limit(1)).await.unwrap();
    let token = page.metadata.continue_.clone().unwrap();
    let old_rv = page.metadata.resource_version.clone().unwrap();
    cms.create(&PostParams::default(), &configmap("e-9", json!({})))
        .await
        .unwrap();
    server.faults().compact_history();
    let e = cms
        .list(&ListParams::default().limit(1).continue_token(&token))
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (410, "Expired".into()));
    let (code, body) = raw(
        &c.client(),
        "GET",
        &format!(
            "/api/v1/namespaces/{}/configmaps?resourceVersion={old_rv}&resourceVersionMatch=Exact",
            c.namespace()
        ),
        None,
        "",
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));
    // A watch from before the compaction: 200, then an ERROR event with a 410 Status.
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={old_rv}",
            c.namespace()
        ),
    )
    .await;
    assert_eq!(w.status, 200);
    let ev = w.next().await.unwrap();
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["code"], 410);
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn watch_from_a_resource_version_replays_later_events() {
    let c = TestCluster::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let a = cms
        .create(&PostParams::default(), &configmap("a", json!({})))
        .await
        .unwrap();
    let from = a.metadata.resource_version.clone().unwrap();
    cms.create(&PostParams::default(), &configmap("b", json!({})))
        .await
        .unwrap();
    cms.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "2"}})),
    )
    .await
    .unwrap();
    cms.delete("b", &DeleteParams::default()).await.unwrap();
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={from}",
            c.namespace()
        ),
    )
    .await;
    assert_eq!(w.status, 200);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let ev = w.next_event().await.unwrap();
        seen.push((
            ev["type"].as_str().unwrap().to_string(),
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        ));
    }
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(
        seen,
        [s("ADDED", "b"), s("MODIFIED", "a"), s("DELETED", "b")]
    );
    // A live event after the replay.
    cms.create(&PostParams::default(), &configmap("c", json!({})))
        .await
        .unwrap();
    let ev = w.next_event().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("c"))
    );
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn watches_send_bookmarks_when_asked() {
    let c = TestCluster::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let a = cms
        .create(&PostParams::default(), &configmap("a", json!({})))
        .await
        .unwrap();
    let rv: u64 = a.metadata.resource_version.unwrap().parse().unwrap();
    // Initial events end with a bookmark annotated k8s.io/initial-events-end.
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            c.namespace()
        ),
    )
    .await;
    let ev = w.next().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("a"))
    );
    let bm = w.next().await.unwrap();
    assert_eq!(bm["type"], "BOOKMARK");
    assert_eq!(
        bm["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let bm_rv: u64 = bm["object"]["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(bm_rv >= rv);
    drop(w);
    // A watch with a timeout gets a bookmark before it ends (the real server
    // sends one about two seconds before the deadline).
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=5",
            c.namespace()
        ),
    )
    .await;
    let mut bookmarks = 0;
    while let Some(ev) = w.next().await {
        if ev["type"] == "BOOKMARK" {
            bookmarks += 1;
            assert!(ev["object"]["metadata"]["resourceVersion"].is_string());
        }
    }
    assert!(bookmarks >= 1);
    // Without allowWatchBookmarks there are none.
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=2",
            c.namespace()
        ),
    )
    .await;
    while let Some(ev) = w.next().await {
        assert_ne!(ev["type"], "BOOKMARK");
    }
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn label_and_field_selectors_the_sidecars_use() {
    let c = TestCluster::start().await.unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    for (n, l) in [
        ("one", json!({"app": "x", "tier": "a"})),
        ("two", json!({"app": "y"})),
        ("three", json!({"tier": "b"})),
    ] {
        cms.create(&PostParams::default(), &configmap(n, l))
            .await
            .unwrap();
    }
    let names = |lp: ListParams| {
        let cms = cms.clone();
        async move {
            let mut v: Vec<String> = cms
                .list(&lp)
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .collect();
            v.sort();
            v
        }
    };
    assert_eq!(names(ListParams::default().labels("app=x")).await, ["one"]);
    assert_eq!(
        names(ListParams::default().labels("app in (x,y)")).await,
        ["one", "two"]
    );
    assert_eq!(
        names(ListParams::default().labels("app!=x")).await,
        ["three", "two"]
    );
    assert_eq!(
        names(ListParams::default().labels("tier")).await,
        ["one", "three"]
    );
    assert_eq!(names(ListParams::default().labels("!tier")).await, ["two"]);
    assert_eq!(
        names(ListParams::default().fields("metadata.name=two")).await,
        ["two"]
    );
    assert_eq!(
        names(ListParams::default().fields(&format!("metadata.namespace={}", c.namespace())))
            .await
            .len(),
        3
    );
    assert_eq!(
        names(
            ListParams::default()
                .fields("metadata.name!=two")
                .labels("app")
        )
        .await,
        ["one"]
    );
    // The leader elector watches its Lease by name.
    let mut w = Lines::open(
        &c.client(),
        &format!(
            "/api/v1/namespaces/{}/configmaps?watch=true&fieldSelector=metadata.name%3Dtwo",
            c.namespace()
        ),
    )
    .await;
    let ev = w.next_event().await.unwrap();
    assert_eq!(ev["object"]["metadata"]["name"], "two");
    cms.patch(
        "one",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "x"}})),
    )
    .await
    .unwrap();
    cms.patch(
        "two",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "x"}})),
    )
    .await
    .unwrap();
    let ev = w.next_event().await.unwrap();
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("MODIFIED"), Some("two"))
    );
    // Events by involved object, as `kubectl describe` and the tests look them up.
    let events: Api<Event> = Api::default_namespaced(c.client());
    events
        .create(&PostParams::default(), &event("e1", "one"))
        .await
        .unwrap();
    events
        .create(&PostParams::default(), &event("e2", "two"))
        .await
        .unwrap();
    let found = events
        .list(&ListParams::default().fields("involvedObject.name=two"))
        .await
        .unwrap();
    assert_eq!(found.items.len(), 1);
    assert_eq!(found.items[0].metadata.name.as_deref(), Some("e2"));
    // A field the server does not index is 400, as upstream (no spec.attacher on VolumeAttachments).
    let vas: Api<VolumeAttachment> = Api::all(c.client());
    let e = vas
        .list(&ListParams::default().fields("spec.attacher=x"))
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (400, "BadRequest".into()));
    c.cleanup().await.unwrap();
}

fn event(name: &str, about: &str) -> Event {
    obj(json!({
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": about, "apiVersion": "v1"},
        "reason": "Testing",
        "message": "first",
        "type": "Normal",
        "count": 1,
        "firstTimestamp": "2024-01-01T00:00:00Z",
        "lastTimestamp": "2024-01-01T00:00:00Z",
        "source": {"component": "conformance"}
    }))
}

#[tokio::test]
async fn core_events_are_created_and_patched_as_the_recorder_does() {
    let c = TestCluster::start().await.unwrap();
    let events: Api<Event> = Api::default_namespaced(c.client());
    let created = events
        .create(&PostParams::default(), &event("obj.17a", "obj"))
        .await
        .unwrap();
    assert_eq!(created.count, Some(1));
    assert_eq!(created.metadata.namespace.as_deref(), Some(c.namespace()));
    let patched = events
        .patch(
            "obj.17a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"count": 2, "lastTimestamp": "2024-01-01T00:01:00Z", "message": "second"}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(patched.count, Some(2));
    assert_eq!(patched.message.as_deref(), Some("second"));
    assert_eq!(patched.reason.as_deref(), Some("Testing"));
    let strategic = events
        .patch(
            "obj.17a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"count": 3})),
        )
        .await
        .unwrap();
    assert_eq!(strategic.count, Some(3));
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn leases_are_created_and_updated_with_a_resource_version() {
    let c = TestCluster::start().await.unwrap();
    let leases: Api<Lease> = Api::default_namespaced(c.client());
    let lease: Lease = obj(json!({
        "metadata": {"name": "lock"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15,
                 "acquireTime": "2024-01-01T00:00:00.000000Z",
                 "renewTime": "2024-01-01T00:00:00.000000Z", "leaseTransitions": 0}
    }));
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let e = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "AlreadyExists".into()));
    let mut renewed = created.clone();
    renewed.spec.as_mut().unwrap().renew_time = Some(obj(json!("2024-01-01T00:00:10.000000Z")));
    let renewed = leases
        .replace("lock", &PostParams::default(), &renewed)
        .await
        .unwrap();
    let spec = renewed.spec.as_ref().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    assert_eq!(
        spec.renew_time.as_ref().unwrap().0.as_second(),
        1_704_067_210,
        "MicroTime round-trips"
    );
    // A second candidate that read the first state loses the race.
    let mut takeover = created.clone();
    takeover.spec.as_mut().unwrap().holder_identity = Some("b".into());
    let e = leases
        .replace("lock", &PostParams::default(), &takeover)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));
    assert_eq!(
        leases
            .get("lock")
            .await
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("a")
    );
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn request_counters_and_faults_are_in_process_only() {
    let c = TestCluster::start().await.unwrap();
    let (Some(faults), Some(counters)) = (c.faults(), c.counters()) else {
        skip("fault injection and request counters");
        return c.cleanup().await.unwrap();
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(c.client());
    let before = counters.writes();
    faults.fail_next(
        testkit::apiserver::RequestMatch::new(testkit::apiserver::Verb::Create, "configmaps"),
        1,
        500,
    );
    let e = cms
        .create(&PostParams::default(), &configmap("x", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(e).0, 500);
    cms.create(&PostParams::default(), &configmap("x", json!({})))
        .await
        .unwrap();
    assert_eq!(counters.writes(), before + 2);
    c.cleanup().await.unwrap();
}
