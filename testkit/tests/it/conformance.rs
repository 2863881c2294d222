//! The API behaviour the sidecars rely on, asserted through `TestCluster`:
//! in-process by default, against a real cluster when
//! `CSI_SIDECARS_TEST_KUBECONFIG` names a kubeconfig. What a real
//! kube-apiserver does is the reference; a test that needs in-process fault
//! injection prints why it skips on a real cluster.

use crate::apiserver_support::{Lines, eventually, obj, raw};
use std::time::Duration;

use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttributesClass};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::{Api, Error};
use serde_json::{Value, json};
use testkit::apiserver::gates::gate_from_metrics;
use testkit::apiserver::protection::{
    PV_PROTECTION_FINALIZER, PVC_PROTECTION_FINALIZER, VAC_PROTECTION_FINALIZER,
};
use testkit::apiserver::{Gate, Options, TestCluster};

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
    // On a real cluster the binder and pv-protection write the PV too: a version read before
    // one of their writes fails the guard, so take a fresh one until the patch applies.
    let mut rv = rv;
    let mut tries = 0;
    let p = loop {
        match pvs.patch(&name, &PatchParams::default(), &ops(&rv)).await {
            Ok(p) => break p,
            Err(kube::Error::Api(s)) if s.code == 422 && tries < 10 => {
                tries += 1;
                rv = pvs
                    .get(&name)
                    .await
                    .unwrap()
                    .metadata
                    .resource_version
                    .unwrap();
            }
            Err(e) => panic!("{e}"),
        }
    };
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

/// Main writes keep the stored status; status writes keep the stored spec.
/// Which metadata a status write may change is the kind's: the PVC and PV
/// status strategies only reset the spec (labels, annotations, finalizers of
/// the request are stored), the VolumeAttachment one resets the metadata too.
/// Times are decoded as Go's `time.Parse` does: an empty or malformed time is refused and
/// nothing is stored; the claim's conditions merge by type and an emptied map disappears.
#[tokio::test]
async fn claim_status_times_and_emptied_maps_are_as_the_typed_api_keeps_them() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let claim: PersistentVolumeClaim = obj(json!({
        "metadata": {"name": "timed"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }));
    pvcs.create(&PostParams::default(), &claim).await.unwrap();
    for bad in ["", "yesterday", "2026-13-01T00:00:00Z"] {
        let patch = json!({"status": {"conditions": [
            {"type": "Resizing", "status": "True", "lastTransitionTime": bad}]}});
        let refused = pvcs
            .patch_status("timed", &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .expect_err("a time that does not parse");
        let (code, _) = api_error(refused);
        assert!(code == 400 || code == 422, "{bad:?}: {code}");
    }
    let stored = pvcs.get("timed").await.unwrap();
    assert!(
        stored.status.unwrap().conditions.is_none(),
        "nothing stored"
    );
    let set = json!({"status": {
        "conditions": [
            {"type": "Resizing", "status": "True", "lastTransitionTime": "2026-11-25T10:00:00Z"},
            {"type": "FileSystemResizePending", "status": "True", "lastTransitionTime": "2026-11-25T10:00:01Z"}],
        "allocatedResourceStatuses": {"storage": "NodeResizePending"}}});
    pvcs.patch_status("timed", &PatchParams::default(), &Patch::Strategic(set))
        .await
        .unwrap();
    let clear = json!({"status": {
        "conditions": [{"type": "Resizing", "$patch": "delete"}],
        "allocatedResourceStatuses": {"storage": null}}});
    let written = pvcs
        .patch_status("timed", &PatchParams::default(), &Patch::Strategic(clear))
        .await
        .unwrap();
    let value = serde_json::to_value(&written).unwrap();
    let conditions: Vec<&str> = value["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["type"].as_str().unwrap())
        .collect();
    assert_eq!(conditions, ["FileSystemResizePending"], "merged by type");
    assert!(
        value["status"].get("allocatedResourceStatuses").is_none(),
        "an emptied map is dropped: {value:#}"
    );
}

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
    assert_eq!(
        p.metadata.labels.as_ref().unwrap()["a"],
        "2",
        "a PVC status write stores the request's labels"
    );

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
    st.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
    let u = vas
        .replace_status(&va_name, &PostParams::default(), &st)
        .await
        .unwrap();
    assert!(u.status.as_ref().unwrap().attached);
    assert_eq!(u.spec.node_name, c.cluster_name("node"));
    assert_eq!(
        u.metadata.labels.as_ref().unwrap()["a"],
        "1",
        "a VolumeAttachment status write keeps the stored labels"
    );
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
    // Labelled: a real cluster also publishes ConfigMaps into a new namespace.
    let a = cms
        .create(
            &PostParams::default(),
            &configmap("a", json!({"set": "replay"})),
        )
        .await
        .unwrap();
    let from = a.metadata.resource_version.clone().unwrap();
    cms.create(
        &PostParams::default(),
        &configmap("b", json!({"set": "replay"})),
    )
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
            "/api/v1/namespaces/{}/configmaps?watch=true&resourceVersion={from}&labelSelector=set%3Dreplay",
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
    cms.create(
        &PostParams::default(),
        &configmap("c", json!({"set": "replay"})),
    )
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
    // ADDED for each ConfigMap of the namespace (a real cluster's namespaces also
    // hold the ones its controllers publish), then the bookmark.
    let mut added = Vec::new();
    let bm = loop {
        let ev = w.next().await.unwrap();
        if ev["type"] != "ADDED" {
            break ev;
        }
        added.push(
            ev["object"]["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    };
    assert!(added.iter().any(|n| n == "a"), "{added:?}");
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
    // Every namespace of a real cluster also holds the ConfigMaps its
    // controllers publish (kube-root-ca.crt, ...): select only ours.
    for (n, l) in [
        ("one", json!({"set": "selectors", "app": "x", "tier": "a"})),
        ("two", json!({"set": "selectors", "app": "y"})),
        ("three", json!({"set": "selectors", "tier": "b"})),
    ] {
        cms.create(&PostParams::default(), &configmap(n, l))
            .await
            .unwrap();
    }
    let names = |lp: ListParams| {
        let cms = cms.clone();
        let lp = match lp.label_selector.as_deref() {
            Some(l) => lp.clone().labels(&format!("set=selectors,{l}")),
            None => lp.labels("set=selectors"),
        };
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
        .create(&PostParams::default(), &event("e1", "one", c.namespace()))
        .await
        .unwrap();
    events
        .create(&PostParams::default(), &event("e2", "two", c.namespace()))
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

/// A core Event about a ConfigMap of `namespace`, the Event's own namespace
/// (the API server refuses an Event whose involvedObject is elsewhere).
fn event(name: &str, about: &str, namespace: &str) -> Event {
    obj(json!({
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "name": about, "apiVersion": "v1", "namespace": namespace},
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
        .create(
            &PostParams::default(),
            &event("obj.17a", "obj", c.namespace()),
        )
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

/// The Status of a failed request.
fn status_of(e: Error) -> Status {
    match e {
        Error::Api(s) => *s,
        other => panic!("expected an API error, got {other}"),
    }
}

/// `(reason, field, message)` of each cause of a `422 Invalid`.
fn causes(s: &Status) -> Vec<(String, String, String)> {
    s.details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.reason.clone(), c.field.clone(), c.message.clone()))
                .collect()
        })
        .unwrap_or_default()
}

fn cause(reason: &str, field: &str, message: &str) -> (String, String, String) {
    (reason.into(), field.into(), message.into())
}

/// Whether a feature gate is on, read from the server's `kubernetes_feature_enabled`
/// gauges on `/metrics`; the Kubernetes 1.34 default when they cannot be read.
async fn gate_enabled(c: &TestCluster, gate: Gate) -> bool {
    let req = http::Request::get("/metrics")
        .body(Vec::new().into())
        .unwrap();
    let text = match c.client().send(req).await {
        Ok(resp) if resp.status().is_success() => {
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        _ => String::new(),
    };
    gate_from_metrics(&text, gate).unwrap_or_else(|| gate.default_enabled())
}

/// How long a real cluster's controllers may take to react (the in-process
/// ones react at once): longer than the suite's usual wait, as a busy
/// controller manager works through its queues.
const CONTROLLER_TIMEOUT: Duration = Duration::from_secs(30);

/// Polls `f` until it returns Some, failing after `timeout`.
async fn eventually_within<T, Fut: std::future::Future<Output = Option<T>>>(
    timeout: Duration,
    mut f: impl FnMut() -> Fut,
) -> T {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `get` finds nothing, as long as a controller may take.
async fn gone<T, F, Fut>(mut get: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    eventually_within(CONTROLLER_TIMEOUT, || {
        let fut = get();
        async move { fut.await.is_none().then_some(()) }
    })
    .await;
}

fn claim(name: &str, class: &str, storage: &str) -> PersistentVolumeClaim {
    obj(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                 "resources": {"requests": {"storage": storage}}}
    }))
}

/// A pod no scheduler or kubelet will act on: either bound to a node that
/// does not exist, or left to a scheduler that does not exist.
fn pod(name: &str, node: Option<&str>, scheduler: &str, volumes: Value) -> Pod {
    let mut spec = json!({
        "schedulerName": scheduler,
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                        "securityContext": {"allowPrivilegeEscalation": false,
                                            "capabilities": {"drop": ["ALL"]}}}],
        "volumes": volumes
    });
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    obj(json!({"metadata": {"name": name, "finalizers": ["example.com/hold"]}, "spec": spec}))
}

#[tokio::test]
async fn events_must_be_in_the_namespace_of_their_object() {
    let c = TestCluster::start().await.unwrap();
    let events: Api<Event> = Api::default_namespaced(c.client());
    let mut elsewhere = event("e-other", "obj", "kube-system");
    let e = events
        .create(&PostParams::default(), &elsewhere)
        .await
        .unwrap_err();
    let st = status_of(e);
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueInvalid",
            "involvedObject.namespace",
            "Invalid value: \"kube-system\": does not match event.namespace"
        )]
    );
    assert_eq!(
        st.message,
        "Event \"e-other\" is invalid: involvedObject.namespace: Invalid value: \"kube-system\": does not match event.namespace"
    );
    // Without a namespace the object would have to be in "default" (or be cluster-scoped).
    elsewhere.involved_object.namespace = None;
    let st = status_of(
        events
            .create(&PostParams::default(), &elsewhere)
            .await
            .unwrap_err(),
    );
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueInvalid",
            "involvedObject.namespace",
            "Invalid value: \"\": does not match event.namespace"
        )]
    );
    // The rule holds for updates too.
    let ok = events
        .create(
            &PostParams::default(),
            &event("e-here", "obj", c.namespace()),
        )
        .await
        .unwrap();
    assert_eq!(ok.involved_object.namespace.as_deref(), Some(c.namespace()));
    let e = events
        .patch(
            "e-here",
            &PatchParams::default(),
            &Patch::Merge(json!({"involvedObject": {"namespace": "kube-system"}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (422, "Invalid".into()));
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn quantities_are_stored_in_canonical_form() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    // Beyond int64 the value is clamped to the largest int64, written as a plain number.
    for (name, storage, stored) in [
        ("huge", "100Ei", "9223372036854775807"),
        ("mebi", "1024Mi", "1Gi"),
        ("half", "0.5Gi", "512Mi"),
        ("kilo", "1000k", "1M"),
    ] {
        let created = pvcs
            .create(&PostParams::default(), &claim(name, &class, storage))
            .await
            .unwrap();
        let requested = |pvc: &PersistentVolumeClaim| {
            pvc.spec
                .as_ref()
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .requests
                .as_ref()
                .unwrap()["storage"]
                .0
                .clone()
        };
        assert_eq!(requested(&created), stored, "{storage}");
        assert_eq!(
            requested(&pvcs.get(name).await.unwrap()),
            stored,
            "{storage}"
        );
    }
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn claims_are_validated_as_upstream() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    for (name, storage) in [("negative", "-1"), ("zero", "0"), ("neg-gi", "-1Gi")] {
        let st = status_of(
            pvcs.create(&PostParams::default(), &claim(name, &class, storage))
                .await
                .unwrap_err(),
        );
        assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
        let body = format!("Invalid value: \"{storage}\": must be greater than zero");
        assert_eq!(
            causes(&st),
            [cause("FieldValueInvalid", "spec.resources[storage]", &body)]
        );
        assert_eq!(
            st.message,
            format!("PersistentVolumeClaim \"{name}\" is invalid: spec.resources[storage]: {body}")
        );
        let d = st.details.as_ref().unwrap();
        assert_eq!(
            (d.kind.as_str(), d.name.as_str(), d.group.as_str()),
            ("PersistentVolumeClaim", name, "")
        );
    }
    // Every failing field is a cause; the message lists them in brackets.
    let (code, body) = raw(
        &c.client(),
        "POST",
        &format!(
            "/api/v1/namespaces/{}/persistentvolumeclaims",
            c.namespace()
        ),
        Some("application/json"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "empty"}, "spec": {"storageClassName": class}})
        .to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["details"]["causes"],
        json!([
            {"reason": "FieldValueRequired", "message": "Required value: at least 1 access mode is required", "field": "spec.accessModes"},
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.resources[storage]"}
        ])
    );
    assert_eq!(
        body["message"],
        "PersistentVolumeClaim \"empty\" is invalid: [spec.accessModes: Required value: at least 1 access mode is required, spec.resources[storage]: Required value]"
    );
    // A quantity Go cannot decode is a 400, before any validation.
    let (code, body) = raw(
        &c.client(),
        "POST",
        &format!("/api/v1/namespaces/{}/persistentvolumeclaims", c.namespace()),
        Some("application/json"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "lots"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "lots"}}}})
        .to_string(),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("quantities must match the regular expression"),
        "{body}"
    );
    let (code, body) = raw(
        &c.client(),
        "POST",
        &format!(
            "/api/v1/namespaces/{}/persistentvolumeclaims",
            c.namespace()
        ),
        Some("application/json"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "modes"},
                "spec": {"accessModes": ["ReadWriteOncePod", "ReadWriteOnce", "Sometimes"],
                         "volumeMode": "Tape", "resources": {"requests": {"storage": "1Gi"}}}})
        .to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["details"]["causes"],
        json!([
            {"reason": "FieldValueNotSupported", "message": "Unsupported value: \"Sometimes\": supported values: \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOnce\", \"ReadWriteOncePod\"", "field": "spec.accessModes"},
            {"reason": "FieldValueForbidden", "message": "Forbidden: may not use ReadWriteOncePod with other access modes", "field": "spec.accessModes"},
            {"reason": "FieldValueNotSupported", "message": "Unsupported value: \"Tape\": supported values: \"Block\", \"Filesystem\"", "field": "spec.volumeMode"}
        ])
    );

    // After creation the spec is immutable, but for volumeName set once.
    pvcs.create(&PostParams::default(), &claim("c", &class, "1Gi"))
        .await
        .unwrap();
    let immutable = "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";
    for change in [
        json!({"spec": {"storageClassName": c.cluster_name("other")}}),
        json!({"spec": {"accessModes": ["ReadWriteMany"]}}),
        // Pending claims cannot be resized either.
        json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}),
    ] {
        let st = status_of(
            pvcs.patch("c", &PatchParams::default(), &Patch::Merge(change.clone()))
                .await
                .unwrap_err(),
        );
        let got = causes(&st);
        assert_eq!(
            got.iter()
                .map(|(r, f, _)| (r.as_str(), f.as_str()))
                .collect::<Vec<_>>(),
            [("FieldValueForbidden", "spec")],
            "{change}"
        );
        assert!(got[0].2.starts_with(immutable), "{}", got[0].2);
    }
    let st = status_of(
        pvcs.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeMode": "Block"}})),
        )
        .await
        .unwrap_err(),
    );
    let fields: Vec<String> = causes(&st).into_iter().map(|(_, f, _)| f).collect();
    assert_eq!(fields, ["spec", "volumeMode"]);
    assert_eq!(
        causes(&st)[1],
        cause(
            "FieldValueInvalid",
            "volumeMode",
            "Invalid value: \"Block\": field is immutable"
        )
    );
    let volume = c.cluster_name("pv-a");
    let bound = pvcs
        .patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": volume}})),
        )
        .await
        .unwrap();
    assert_eq!(
        bound.spec.unwrap().volume_name.as_deref(),
        Some(volume.as_str())
    );
    let st = status_of(
        pvcs.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": c.cluster_name("pv-b")}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(causes(&st)[0].1, "spec");
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn volumes_are_validated_as_upstream() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("valid-pv");
    let mut zero = pv(&name, &class);
    zero.spec.as_mut().unwrap().capacity = Some(
        [(
            "storage".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
        )]
        .into(),
    );
    let st = status_of(pvs.create(&PostParams::default(), &zero).await.unwrap_err());
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueInvalid",
            "spec.capacity[storage]",
            "Invalid value: \"0\": must be greater than zero"
        )]
    );
    assert_eq!(
        st.message,
        format!(
            "PersistentVolume \"{name}\" is invalid: spec.capacity[storage]: Invalid value: \"0\": must be greater than zero"
        )
    );
    let (code, body) = raw(
        &c.client(),
        "POST",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Gi"}, "storageClassName": class}})
        .to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["details"]["causes"],
        json!([
            {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.accessModes"},
            {"reason": "FieldValueRequired", "message": "Required value: must specify a volume type", "field": "spec"}
        ])
    );
    let (code, body) = raw(
        &c.client(),
        "POST",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        &json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": class, "hostPath": {"path": "/tmp/x"},
                         "csi": {"driver": "conformance.example.com", "volumeHandle": "h"}}})
        .to_string(),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(
        body["details"]["causes"],
        json!([{"reason": "FieldValueForbidden", "message": "Forbidden: may not specify more than 1 volume type", "field": "spec.csi"}])
    );

    // The volume source is immutable; a controllerExpandSecretRef may be added, capacity may change.
    pvs.create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    let st = status_of(
        pvs.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"csi": {"volumeHandle": "other"}}})),
        )
        .await
        .unwrap_err(),
    );
    let got = causes(&st);
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("FieldValueForbidden", "spec.persistentvolumesource")
    );
    assert!(
        got[0]
            .2
            .starts_with("Forbidden: spec.persistentvolumesource is immutable after creation"),
        "{}",
        got[0].2
    );
    let p = pvs
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "capacity": {"storage": "2Gi"},
                "csi": {"controllerExpandSecretRef": {"name": "s", "namespace": c.namespace()}}
            }})),
        )
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert!(spec.csi.unwrap().controller_expand_secret_ref.is_some());
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

fn attachment(name: &str, node: &str, pv: &str) -> VolumeAttachment {
    obj(json!({
        "metadata": {"name": name},
        "spec": {"attacher": "conformance.example.com", "nodeName": node,
                 "source": {"persistentVolumeName": pv}}
    }))
}

#[tokio::test]
async fn attachments_are_validated_as_upstream() {
    let c = TestCluster::start().await.unwrap();
    let vas: Api<VolumeAttachment> = Api::all(c.client());
    let name = c.cluster_name("va");
    let node = c.cluster_name("node");
    let pv_name = c.cluster_name("pv");
    let created = vas
        .create(&PostParams::default(), &attachment(&name, &node, &pv_name))
        .await
        .unwrap();
    // The spec is immutable.
    let st = status_of(
        vas.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeName": "elsewhere"}})),
        )
        .await
        .unwrap_err(),
    );
    let body = format!(
        "Invalid value: {{\"Attacher\":\"conformance.example.com\",\"Source\":{{\"PersistentVolumeName\":\"{pv_name}\",\"InlineVolumeSpec\":null}},\"NodeName\":\"elsewhere\"}}: field is immutable"
    );
    assert_eq!(causes(&st), [cause("FieldValueInvalid", "spec", &body)]);
    assert_eq!(
        st.message,
        format!("VolumeAttachment.storage.k8s.io \"{name}\" is invalid: spec: {body}")
    );
    assert_eq!(st.details.as_ref().unwrap().group, "storage.k8s.io");
    // An update must name the resourceVersion it read (no unconditional updates).
    let mut unconditional = created.clone();
    unconditional.metadata.resource_version = None;
    unconditional.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    let st = status_of(
        vas.replace(&name, &PostParams::default(), &unconditional)
            .await
            .unwrap_err(),
    );
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueInvalid",
            "metadata.resourceVersion",
            "Invalid value: 0: must be specified for an update"
        )]
    );
    assert_eq!(
        st.message,
        format!(
            "volumeattachments.storage.k8s.io \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        )
    );
    // Error messages are limited to 1 KiB (the error names another limit, as upstream's does;
    // the status is validated twice on an update, so the cause is listed twice).
    let st = status_of(
        vas.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"attached": false,
                "attachError": {"message": "x".repeat(1025), "time": "2024-01-01T00:00:00Z"}}})),
        )
        .await
        .unwrap_err(),
    );
    let too_long = cause(
        "FieldValueTooLong",
        "status.attachError.message",
        "Too long: may not be more than 262144 bytes",
    );
    assert_eq!(causes(&st), [too_long.clone(), too_long]);
    assert_eq!(
        st.message,
        format!(
            "VolumeAttachment.storage.k8s.io \"{name}\" is invalid: status.attachError.message: Too long: may not be more than 262144 bytes"
        )
    );
    vas.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"attached": false,
            "attachError": {"message": "x".repeat(1024), "time": "2024-01-01T00:00:00Z"}}})),
    )
    .await
    .unwrap();
    vas.delete(&name, &DeleteParams::default()).await.unwrap();
    c.cleanup().await.unwrap();
}

/// VolumeAttachment error codes belong to MutableCSINodeAllocatableCount (beta, off by
/// default in 1.34): a server with the gate off drops them.
#[tokio::test]
async fn attachment_error_codes_follow_their_feature_gate() {
    let c = TestCluster::start().await.unwrap();
    let enabled = gate_enabled(&c, Gate::MutableCSINodeAllocatableCount).await;
    let vas: Api<VolumeAttachment> = Api::all(c.client());
    let name = c.cluster_name("va-code");
    vas.create(
        &PostParams::default(),
        &attachment(&name, &c.cluster_name("node"), &c.cluster_name("pv")),
    )
    .await
    .unwrap();
    let patch = Patch::Merge(json!({"status": {"attached": false,
        "attachError": {"message": "boom", "errorCode": 5},
        "detachError": {"message": "bang", "errorCode": 9}}}));
    let st = vas
        .patch_status(&name, &PatchParams::default(), &patch)
        .await
        .unwrap()
        .status
        .unwrap();
    let (attach, detach) = (st.attach_error.unwrap(), st.detach_error.unwrap());
    assert_eq!(attach.message.as_deref(), Some("boom"));
    assert_eq!(detach.message.as_deref(), Some("bang"));
    let want = |code: i32| enabled.then_some(code);
    assert_eq!(
        (attach.error_code, detach.error_code),
        (want(5), want(9)),
        "gate enabled: {enabled}"
    );
    vas.delete(&name, &DeleteParams::default()).await.unwrap();
    c.cleanup().await.unwrap();

    // In-process, a test can turn the gate on.
    let on = TestCluster::start_with(Options {
        pv_controller: true,
        ..Options::default().feature_gate(Gate::MutableCSINodeAllocatableCount, true)
    })
    .await
    .unwrap();
    if on.is_real() {
        return on.cleanup().await.unwrap();
    }
    assert!(gate_enabled(&on, Gate::MutableCSINodeAllocatableCount).await);
    let vas: Api<VolumeAttachment> = Api::all(on.client());
    vas.create(&PostParams::default(), &attachment("va", "node", "pv"))
        .await
        .unwrap();
    let st = vas
        .patch_status("va", &PatchParams::default(), &patch)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.attach_error.unwrap().error_code, Some(5));
    on.cleanup().await.unwrap();
}

/// What the API server does to a claim's data sources on create: a
/// cross-namespace dataSourceRef only with CrossNamespaceVolumeDataSource
/// (alpha, off), dataSource and dataSourceRef filled from each other, an
/// unknown kind in dataSource alone dropped.
#[tokio::test]
async fn claim_data_sources_are_normalized() {
    let c = TestCluster::start().await.unwrap();
    let cross = gate_enabled(&c, Gate::CrossNamespaceVolumeDataSource).await;
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let with = |name: &str, extra: Value| -> PersistentVolumeClaim {
        let mut v = serde_json::to_value(claim(name, &class, "1Gi")).unwrap();
        for (k, x) in extra.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        obj(v)
    };
    let spec_of = |p: PersistentVolumeClaim| p.spec.unwrap();

    let s = spec_of(
        pvcs.create(
            &PostParams::default(),
            &with(
                "from-claim",
                json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}),
            ),
        )
        .await
        .unwrap(),
    );
    let r = s.data_source_ref.expect("dataSourceRef filled in");
    assert_eq!(
        (r.kind.as_str(), r.name.as_str(), r.api_group.as_deref()),
        ("PersistentVolumeClaim", "src", None)
    );

    let s = spec_of(
        pvcs.create(
            &PostParams::default(),
            &with(
                "from-ref",
                json!({"dataSourceRef": {"apiGroup": "example.com", "kind": "Widget", "name": "w"}}),
            ),
        )
        .await
        .unwrap(),
    );
    let d = s.data_source.expect("dataSource filled in");
    assert_eq!(
        (d.kind.as_str(), d.name.as_str(), d.api_group.as_deref()),
        ("Widget", "w", Some("example.com"))
    );

    let s = spec_of(
        pvcs.create(
            &PostParams::default(),
            &with(
                "unknown",
                json!({"dataSource": {"apiGroup": "example.com", "kind": "Widget", "name": "w"}}),
            ),
        )
        .await
        .unwrap(),
    );
    assert!(s.data_source.is_none() && s.data_source_ref.is_none());

    let s = spec_of(
        pvcs.create(
            &PostParams::default(),
            &with(
                "cross",
                json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": "elsewhere"}}),
            ),
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        s.data_source_ref.is_some(),
        cross,
        "CrossNamespaceVolumeDataSource enabled: {cross}"
    );
    assert!(s.data_source.is_none());
    c.cleanup().await.unwrap();
}

#[tokio::test]
async fn protection_finalizers_are_added_on_create() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let created = pvcs
        .create(&PostParams::default(), &claim("c", &class, "1Gi"))
        .await
        .unwrap();
    assert_eq!(finalizers_of(&created.metadata), [PVC_PROTECTION_FINALIZER]);
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("fin-pv");
    let created = pvs
        .create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    assert_eq!(
        finalizers_of(&created.metadata),
        ["example.com/a", PV_PROTECTION_FINALIZER]
    );
    // Already present: not added twice.
    let mut again = pv(&c.cluster_name("fin-pv-2"), &class);
    again.metadata.finalizers = Some(vec![PV_PROTECTION_FINALIZER.into()]);
    let created2 = pvs.create(&PostParams::default(), &again).await.unwrap();
    assert_eq!(finalizers_of(&created2.metadata), [PV_PROTECTION_FINALIZER]);
    if gate_enabled(&c, Gate::VolumeAttributesClass).await {
        let vacs: Api<VolumeAttributesClass> = Api::all(c.client());
        let vac: VolumeAttributesClass = obj(json!({
            "metadata": {"name": c.cluster_name("vac")},
            "driverName": "conformance.example.com", "parameters": {"iops": "100"}
        }));
        let created = vacs.create(&PostParams::default(), &vac).await.unwrap();
        assert_eq!(finalizers_of(&created.metadata), [VAC_PROTECTION_FINALIZER]);
    }
    for n in [name, c.cluster_name("fin-pv-2")] {
        pvs.patch(
            &n,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        pvs.delete(&n, &DeleteParams::default()).await.unwrap();
    }
    c.cleanup().await.unwrap();
}

/// pv-protection keeps a deleted PV while it is Bound; once its claim is
/// gone (and the volume Released) the PV goes too.
#[tokio::test]
async fn pv_protection_keeps_a_bound_volume() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    // The volume first: the claim's creation then binds it at once (the other
    // way round, a real PV controller may wait for its periodic resync).
    let name = c.cluster_name("bound-pv");
    let mut volume = pv(&name, &class);
    volume.metadata.finalizers = None;
    volume.spec.as_mut().unwrap().claim_ref =
        Some(obj(json!({"namespace": c.namespace(), "name": "claim"})));
    pvs.create(&PostParams::default(), &volume).await.unwrap();
    pvcs.create(&PostParams::default(), &claim("claim", &class, "1Gi"))
        .await
        .unwrap();
    let phase = |p: &PersistentVolume| p.status.as_ref().and_then(|s| s.phase.clone());
    eventually_within(CONTROLLER_TIMEOUT, || {
        let pvs = pvs.clone();
        let name = name.clone();
        async move {
            let p = pvs.get(&name).await.unwrap();
            (phase(&p).as_deref() == Some("Bound")).then_some(())
        }
    })
    .await;
    let deleting = pvs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("kept by its finalizer");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = pvs.get(&name).await.unwrap();
    assert_eq!(phase(&still).as_deref(), Some("Bound"));
    assert_eq!(finalizers_of(&still.metadata), [PV_PROTECTION_FINALIZER]);

    // A bound claim may not shrink below its status capacity, and may only grow
    // when its StorageClass allows expansion (here: there is no such class).
    let st = status_of(
        pvcs.patch(
            "claim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "512Mi"}}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueForbidden",
            "spec.resources.requests.storage",
            "Forbidden: field can not be less than status.capacity"
        )]
    );
    let st = status_of(
        pvcs.patch(
            "claim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((st.code, st.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        st.message,
        "persistentvolumeclaims \"claim\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
    );

    pvcs.delete("claim", &DeleteParams::default())
        .await
        .unwrap();
    gone(|| {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("claim").await.unwrap() }
    })
    .await;
    // Released by the PV controller, then let go by pv-protection.
    gone(|| {
        let pvs = pvs.clone();
        let name = name.clone();
        async move { pvs.get_opt(&name).await.unwrap() }
    })
    .await;
    c.cleanup().await.unwrap();
}

/// pvc-protection keeps a deleted claim while a scheduled pod has a volume
/// naming it, also while that pod is shutting down; a generic ephemeral
/// volume's claim is released once its pod is shut down; unscheduled pods
/// do not count.
#[tokio::test]
async fn pvc_protection_waits_for_the_pods_using_the_claim() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let node = c.cluster_name("node");
    let nobody = c.cluster_name("no-scheduler");
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let pods: Api<Pod> = Api::default_namespaced(c.client());
    for n in ["data", "idle"] {
        pvcs.create(&PostParams::default(), &claim(n, &class, "1Gi"))
            .await
            .unwrap();
    }
    let template = json!({"spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                                   "resources": {"requests": {"storage": "1Gi"}}}});
    let user = pods
        .create(
            &PostParams::default(),
            &pod(
                "user",
                Some(&node),
                &nobody,
                json!([
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": template}}
                ]),
            ),
        )
        .await
        .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "waiting",
            None,
            &nobody,
            json!([{"name": "idle", "persistentVolumeClaim": {"claimName": "idle"}}]),
        ),
    )
    .await
    .unwrap();
    // The claim of the ephemeral volume, owned by the pod (a real cluster's
    // ephemeral volume controller may have created it already).
    let scratch: PersistentVolumeClaim = obj(json!({
        "metadata": {"name": "user-scratch", "ownerReferences": [{
            "apiVersion": "v1", "kind": "Pod", "name": "user",
            "uid": user.metadata.uid.clone().unwrap(), "controller": true, "blockOwnerDeletion": true}]},
        "spec": template["spec"]
    }));
    match pvcs.create(&PostParams::default(), &scratch).await {
        Ok(_) => {}
        Err(e) => assert_eq!(api_error(e), (409, "AlreadyExists".into())),
    }

    for n in ["data", "user-scratch", "idle"] {
        pvcs.delete(n, &DeleteParams::default()).await.unwrap();
    }
    // The unscheduled pod does not hold its claim.
    gone(|| {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("idle").await.unwrap() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in ["data", "user-scratch"] {
        let kept = pvcs.get(n).await.unwrap();
        assert!(kept.metadata.deletion_timestamp.is_some(), "{n}");
        assert_eq!(
            finalizers_of(&kept.metadata),
            [PVC_PROTECTION_FINALIZER],
            "{n}"
        );
    }
    // Force-deleted (grace period 0) but held by its finalizer: the pod is
    // shut down, which releases the ephemeral claim but not the named one.
    pods.delete("user", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(|| {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("user-scratch").await.unwrap() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pvcs.get_opt("data").await.unwrap().is_some());
    // The pod goes: the claim goes.
    for p in ["user", "waiting"] {
        pods.patch(
            p,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    }
    pods.delete("waiting", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    gone(|| {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("data").await.unwrap() }
    })
    .await;
    c.cleanup().await.unwrap();
}

/// vac-protection keeps a deleted VolumeAttributesClass while a claim or a
/// volume refers to it.
#[tokio::test]
async fn vac_protection_waits_for_claims_and_volumes() {
    let c = TestCluster::start().await.unwrap();
    if !gate_enabled(&c, Gate::VolumeAttributesClass).await {
        println!("VolumeAttributesClass is disabled on this server");
        return c.cleanup().await.unwrap();
    }
    let class = c.cluster_name("none");
    let vac_name = c.cluster_name("gold");
    let vacs: Api<VolumeAttributesClass> = Api::all(c.client());
    let vac: VolumeAttributesClass = obj(json!({
        "metadata": {"name": vac_name},
        "driverName": "conformance.example.com", "parameters": {"iops": "100"}
    }));
    vacs.create(&PostParams::default(), &vac).await.unwrap();
    // Its parameters and driver are immutable.
    let st = status_of(
        vacs.patch(
            &vac_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"parameters": {"iops": "200"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        causes(&st),
        [cause(
            "FieldValueForbidden",
            "parameters",
            "Forbidden: updates to parameters are forbidden."
        )]
    );
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client());
    let mut user = claim("user", &class, "1Gi");
    user.spec.as_mut().unwrap().volume_attributes_class_name = Some(vac_name.clone());
    pvcs.create(&PostParams::default(), &user).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let pv_name = c.cluster_name("gold-pv");
    let mut volume = pv(&pv_name, &class);
    volume.spec.as_mut().unwrap().volume_attributes_class_name = Some(vac_name.clone());
    pvs.create(&PostParams::default(), &volume).await.unwrap();

    vacs.delete(&vac_name, &DeleteParams::default())
        .await
        .unwrap();
    pvcs.delete("user", &DeleteParams::default()).await.unwrap();
    gone(|| {
        let pvcs = pvcs.clone();
        async move { pvcs.get_opt("user").await.unwrap() }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = vacs.get(&vac_name).await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some());
    assert_eq!(
        finalizers_of(&kept.metadata),
        [VAC_PROTECTION_FINALIZER],
        "the volume still uses it"
    );
    pvs.patch(
        &pv_name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    gone(|| {
        let pvs = pvs.clone();
        let n = pv_name.clone();
        async move { pvs.get_opt(&n).await.unwrap() }
    })
    .await;
    gone(|| {
        let vacs = vacs.clone();
        let n = vac_name.clone();
        async move { vacs.get_opt(&n).await.unwrap() }
    })
    .await;
    c.cleanup().await.unwrap();
}

/// A write from an older read loses against a protection controller's, as
/// against any other writer: the finalizer removal bumps the resourceVersion.
#[tokio::test]
async fn protection_controller_writes_conflict_with_stale_writers() {
    let c = TestCluster::start().await.unwrap();
    let class = c.cluster_name("none");
    let pvs: Api<PersistentVolume> = Api::all(c.client());
    let name = c.cluster_name("race-pv");
    // Held by a second finalizer after pv-protection lets go.
    pvs.create(&PostParams::default(), &pv(&name, &class))
        .await
        .unwrap();
    let deleting = pvs
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    let released = eventually(|| {
        let pvs = pvs.clone();
        let name = name.clone();
        async move {
            let p = pvs.get(&name).await.unwrap();
            (!has(&finalizers_of(&p.metadata), PV_PROTECTION_FINALIZER)).then_some(p)
        }
    })
    .await;
    assert_ne!(
        released.metadata.resource_version,
        deleting.metadata.resource_version
    );
    let mut stale = deleting.clone();
    stale.metadata.labels = Some([("late".to_string(), "1".to_string())].into());
    let e = pvs
        .replace(&name, &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(api_error(e), (409, "Conflict".into()));
    pvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    gone(|| {
        let pvs = pvs.clone();
        let n = name.clone();
        async move { pvs.get_opt(&n).await.unwrap() }
    })
    .await;
    c.cleanup().await.unwrap();
}
