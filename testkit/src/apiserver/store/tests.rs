use super::*;

fn store() -> (Store, KindId, KindId, KindId) {
    let reg = Arc::new(Registry::builtin());
    let pvc = reg.core("persistentvolumeclaims").unwrap();
    let pv = reg.core("persistentvolumes").unwrap();
    let vs = reg
        .lookup("snapshot.storage.k8s.io", "v1", "volumesnapshots")
        .unwrap();
    (Store::new(reg, 100, 100), pvc, pv, vs)
}

fn pvc(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
}

fn pv_spec() -> Value {
    json!({"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
           "csi": {"driver": "d.example.com", "volumeHandle": "h"}})
}

#[test]
fn create_fills_system_fields_and_rejects_duplicates() {
    let (mut s, pvc_k, _, _) = store();
    let rv0 = s.resource_version();
    let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    assert_eq!(o["metadata"]["namespace"], "default");
    assert_eq!(resource_version_of(&o), rv0 + 1);
    assert_eq!(o["metadata"]["uid"].as_str().unwrap().len(), 36);
    assert_eq!(o["status"], json!({"phase": "Pending"}));
    assert!(o["metadata"].get("generation").is_none());
    let e = s.create(pvc_k, "default", pvc("a"), false).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
    let e = s.create(pvc_k, "nope", pvc("b"), false).unwrap_err();
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );
    let e = s
        .create(pvc_k, "default", pvc("#%123-invalid-name"), false)
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    let g = s
        .create(
            pvc_k,
            "default",
            json!({"metadata": {"generateName": "gen-"}, "spec": pvc("x")["spec"]}),
            false,
        )
        .unwrap();
    assert!(g["metadata"]["name"].as_str().unwrap().starts_with("gen-"));
    let e = s
        .create(
            pvc_k,
            "default",
            json!({"kind": "Pod", "metadata": {"name": "x"}}),
            false,
        )
        .unwrap_err();
    assert_eq!(e.code, 400);
}

#[test]
fn update_checks_resource_version_and_keeps_status() {
    let (mut s, pvc_k, _, _) = store();
    let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    let mut stale = (*o).clone();
    stale["spec"]["volumeName"] = json!("pv-1");
    stale["status"] = json!({"phase": "Bound"});
    let u = s
        .update(pvc_k, "default", "a", stale.clone(), Target::Main, false)
        .unwrap();
    assert_eq!(u["spec"]["volumeName"], "pv-1");
    assert_eq!(u["status"]["phase"], "Pending", "main writes ignore status");
    let e = s
        .update(pvc_k, "default", "a", stale.clone(), Target::Main, false)
        .unwrap_err();
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    let mut unconditional = stale.clone();
    unconditional["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    unconditional["metadata"]["labels"] = json!({"l": "v"});
    let u2 = s
        .update(
            pvc_k,
            "default",
            "a",
            unconditional.clone(),
            Target::Main,
            false,
        )
        .unwrap();
    assert_eq!(u2["metadata"]["labels"]["l"], "v");
    // volumeName is set once; after that the spec is immutable.
    unconditional["spec"]["volumeName"] = json!("pv-2");
    let e = s
        .update(pvc_k, "default", "a", unconditional, Target::Main, false)
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
    let mut st = (*u2).clone();
    st["status"] = json!({"phase": "Bound"});
    st["spec"]["volumeName"] = json!("ignored");
    let u3 = s
        .update(pvc_k, "default", "a", st, Target::Status, false)
        .unwrap();
    assert_eq!(u3["status"]["phase"], "Bound");
    assert_eq!(
        u3["spec"]["volumeName"], "pv-1",
        "status writes ignore the spec"
    );
    let same = s
        .update(pvc_k, "default", "a", (*u3).clone(), Target::Main, false)
        .unwrap();
    assert_eq!(
        resource_version_of(&same),
        resource_version_of(&u3),
        "no-op updates do not bump"
    );
}

#[test]
fn generation_tracks_spec_changes_for_kinds_that_have_it() {
    let (mut s, _, _, vs) = store();
    let o = s
        .create(vs, "default", json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "s"}, "spec": {"a": 1}, "status": {"x": 1}}), false)
        .unwrap();
    assert_eq!(o["metadata"]["generation"], 1);
    assert!(o.get("status").is_none(), "status is dropped on create");
    let mut m = (*o).clone();
    m["metadata"]["labels"] = json!({"l": "v"});
    let o = s
        .update(vs, "default", "s", m, Target::Main, false)
        .unwrap();
    assert_eq!(o["metadata"]["generation"], 1);
    let mut m = (*o).clone();
    m["spec"]["a"] = json!(2);
    let o = s
        .update(vs, "default", "s", m, Target::Main, false)
        .unwrap();
    assert_eq!(o["metadata"]["generation"], 2);
}

#[test]
fn finalizers_defer_deletion_until_removed() {
    let (mut s, _, pv, _) = store();
    s.create(
        pv,
        "",
        json!({"metadata": {"name": "pv", "finalizers": ["a/b"]}, "spec": pv_spec()}),
        false,
    )
    .unwrap();
    let Deleted::Pending(o) = s
        .delete(pv, "", "pv", &Preconditions::default(), false)
        .unwrap()
    else {
        panic!()
    };
    assert!(o["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(o["metadata"]["deletionGracePeriodSeconds"], 0);
    let Deleted::Pending(again) = s
        .delete(pv, "", "pv", &Preconditions::default(), false)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(resource_version_of(&again), resource_version_of(&o));
    let e = s
        .patch(
            pv,
            "",
            "pv",
            PatchType::Merge,
            &json!({"metadata": {"finalizers": ["a/b", "new"]}}),
            Target::Main,
            false,
        )
        .unwrap_err();
    assert_eq!(e.code, 422);
    let last = s
        .patch(
            pv,
            "",
            "pv",
            PatchType::Json,
            // Admission added kubernetes.io/pv-protection after a/b.
            &json!([{"op": "remove", "path": "/metadata/finalizers/1"},
                    {"op": "remove", "path": "/metadata/finalizers/0"}]),
            Target::Main,
            false,
        )
        .unwrap();
    assert_eq!(s.get(pv, "", "pv").unwrap_err().code, 404);
    // The response is the object as the patch left it, as a real server answers.
    assert_eq!(last["metadata"]["finalizers"], json!([]));
    assert!(last["metadata"]["deletionTimestamp"].is_string());
}

#[test]
fn delete_preconditions_conflict() {
    let (mut s, pvc_k, _, _) = store();
    s.create(pvc_k, "default", pvc("a"), false).unwrap();
    let pre = Preconditions {
        uid: Some("other".into()),
        resource_version: None,
    };
    assert_eq!(
        s.delete(pvc_k, "default", "a", &pre, false)
            .unwrap_err()
            .code,
        409
    );
    let pre = Preconditions {
        uid: None,
        resource_version: Some("1".into()),
    };
    assert_eq!(
        s.delete(pvc_k, "default", "a", &pre, false)
            .unwrap_err()
            .code,
        409
    );
    // The pvc-protection finalizer from admission keeps the claim.
    assert!(matches!(
        s.delete(pvc_k, "default", "a", &Preconditions::default(), false)
            .unwrap(),
        Deleted::Pending(_)
    ));
}

#[test]
fn list_pages_are_consistent_snapshots() {
    let (mut s, pvc_k, _, _) = store();
    for n in ["a", "b", "c"] {
        s.create(pvc_k, "default", pvc(n), false).unwrap();
    }
    let q = ListQuery {
        limit: Some(2),
        ..Default::default()
    };
    let p1 = s.list(pvc_k, &q).unwrap();
    assert_eq!(p1.items.len(), 2);
    assert_eq!(p1.remaining, Some(1));
    s.delete(pvc_k, "default", "c", &Preconditions::default(), false)
        .unwrap();
    s.create(pvc_k, "default", pvc("d"), false).unwrap();
    let q2 = ListQuery {
        limit: Some(2),
        continue_token: p1.continue_token.as_deref(),
        ..Default::default()
    };
    let p2 = s.list(pvc_k, &q2).unwrap();
    let names: Vec<_> = p2
        .items
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["c"], "the second page reads the state of the first");
    assert_eq!(p2.resource_version, p1.resource_version);
    assert!(p2.continue_token.is_none());
    s.compact();
    assert_eq!(s.list(pvc_k, &q2).unwrap_err().code, 410);
}

#[test]
fn list_filters_by_namespace_and_selectors() {
    let (mut s, pvc_k, _, _) = store();
    let mut o = pvc("a");
    o["metadata"]["labels"] = json!({"app": "x"});
    s.create(pvc_k, "default", o, false).unwrap();
    s.create(pvc_k, "kube-system", pvc("b"), false).unwrap();
    let all = s.list(pvc_k, &ListQuery::default()).unwrap();
    assert_eq!(all.items.len(), 2);
    let q = ListQuery {
        namespace: Some("kube-system"),
        ..Default::default()
    };
    assert_eq!(s.list(pvc_k, &q).unwrap().items.len(), 1);
    let q = ListQuery {
        labels: LabelSelector::parse("app=x").unwrap(),
        ..Default::default()
    };
    assert_eq!(s.list(pvc_k, &q).unwrap().items[0]["metadata"]["name"], "a");
    let q = ListQuery {
        resource_version: Some("999999"),
        ..Default::default()
    };
    assert_eq!(s.list(pvc_k, &q).unwrap_err().code, 504);
}

#[test]
fn watch_replays_history_and_expires_when_compacted() {
    let (mut s, _, _, _) = store();
    let pvc_k = s.registry().core("configmaps").unwrap();
    let pvc = |n: &str| json!({"metadata": {"name": n}});
    let a = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    let rv = resource_version_of(&a);
    s.create(pvc_k, "default", pvc("b"), false).unwrap();
    let w = s.watch(pvc_k, WatchFrom::After(rv)).unwrap();
    assert_eq!(w.initial.len(), 1);
    assert_eq!(w.initial[0].object["metadata"]["name"], "b");
    let mut live = s.watch(pvc_k, WatchFrom::Current).unwrap();
    assert_eq!(live.initial.len(), 2);
    s.delete(pvc_k, "default", "a", &Preconditions::default(), false)
        .unwrap();
    let ev = live.events.try_recv().unwrap();
    assert_eq!(ev.etype, EventType::Deleted);
    assert_eq!(resource_version_of(&ev.object), s.resource_version());
    s.compact();
    assert_eq!(s.watch(pvc_k, WatchFrom::After(rv)).unwrap_err().code, 410);
    s.close_watches(None);
    assert!(live.events.try_recv().is_err());
}

#[test]
fn deleting_a_namespace_deletes_its_content() {
    let (mut s, pvc_k, _, _) = store();
    let ns_k = s.registry().core("namespaces").unwrap();
    s.create(ns_k, "", json!({"metadata": {"name": "t"}}), false)
        .unwrap();
    s.create(
        pvc_k,
        "t",
        json!({"metadata": {"name": "a", "finalizers": ["x/y"]}, "spec": pvc("a")["spec"]}),
        false,
    )
    .unwrap();
    let Deleted::Pending(ns) = s
        .delete(ns_k, "", "t", &Preconditions::default(), false)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(ns["status"]["phase"], "Terminating");
    assert_eq!(s.create(pvc_k, "t", pvc("b"), false).unwrap_err().code, 403);
    s.patch(
        pvc_k,
        "t",
        "a",
        PatchType::Merge,
        &json!({"metadata": {"finalizers": null}}),
        Target::Main,
        false,
    )
    .unwrap();
    assert_eq!(s.get(ns_k, "", "t").unwrap_err().code, 404);
}

#[test]
fn history_window_is_bounded() {
    let reg = Arc::new(Registry::builtin());
    let pvc_k = reg.core("persistentvolumeclaims").unwrap();
    let mut s = Store::new(reg, 3, 10);
    for n in ["a", "b", "c", "d", "e"] {
        s.create(pvc_k, "default", pvc(n), false).unwrap();
    }
    let rv = s.resource_version();
    assert!(s.watch(pvc_k, WatchFrom::After(rv - 3)).is_ok());
    assert_eq!(
        s.watch(pvc_k, WatchFrom::After(rv - 4)).unwrap_err().code,
        410
    );
}

#[test]
fn strategic_patch_is_refused_for_custom_kinds() {
    let (mut s, _, _, vs) = store();
    s.create(vs, "default", json!({"metadata": {"name": "s"}}), false)
        .unwrap();
    let e = s
        .patch(
            vs,
            "default",
            "s",
            PatchType::Strategic,
            &json!({}),
            Target::Main,
            false,
        )
        .unwrap_err();
    assert_eq!(e.code, 415);
}

#[test]
fn secret_string_data_is_merged_into_data_and_dropped() {
    let (mut s, _, _, _) = store();
    let sk = s.registry().core("secrets").unwrap();
    let o = s
        .create(
            sk,
            "default",
            json!({"metadata": {"name": "s"}, "data": {"a": "b2xk", "b": "Yg=="}, "stringData": {"a": "new", "c": "h\u{e9}"}}),
            false,
        )
        .unwrap();
    assert!(o.get("stringData").is_none());
    assert_eq!(
        o["data"],
        json!({"a": "bmV3", "b": "Yg==", "c": "aMOp"}),
        "stringData wins, values are the UTF-8 bytes"
    );
    assert_eq!(o["type"], "Opaque");
    let o = s
        .patch(
            sk,
            "default",
            "s",
            PatchType::Merge,
            &json!({"stringData": {"b": "x"}}),
            Target::Main,
            false,
        )
        .unwrap();
    assert_eq!(o["data"]["b"], "eA==");
    assert!(o.get("stringData").is_none());
    let mut u = (*o).clone();
    u["stringData"] = json!({"d": ""});
    let o = s
        .update(sk, "default", "s", u, Target::Main, false)
        .unwrap();
    assert_eq!(o["data"]["d"], "");
    assert!(o.get("stringData").is_none());
    let e = s
        .create(
            sk,
            "default",
            json!({"metadata": {"name": "bad"}, "data": {"a": "not base64!"}}),
            false,
        )
        .unwrap_err();
    assert_eq!(e.code, 400);
    let e = s
        .create(
            sk,
            "default",
            json!({"metadata": {"name": "bad"}, "stringData": {"a/b": "x"}}),
            false,
        )
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
}

#[test]
fn storage_kinds_get_the_real_servers_defaults() {
    let (mut s, pvc_k, pv_k, _) = store();
    let sc = s
        .registry()
        .lookup("storage.k8s.io", "v1", "storageclasses")
        .unwrap();
    let o = s
        .create(
            sc,
            "",
            json!({"metadata": {"name": "c"}, "provisioner": "x"}),
            false,
        )
        .unwrap();
    assert_eq!(
        (o["reclaimPolicy"].as_str(), o["volumeBindingMode"].as_str()),
        (Some("Delete"), Some("Immediate"))
    );
    let o = s
        .create(
            pv_k,
            "",
            json!({"metadata": {"name": "v"}, "spec": pv_spec()}),
            false,
        )
        .unwrap();
    assert_eq!(o["spec"]["persistentVolumeReclaimPolicy"], "Retain");
    assert_eq!(o["spec"]["volumeMode"], "Filesystem");
    let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    assert_eq!(o["spec"]["volumeMode"], "Filesystem");
    let mut block = pvc("b");
    block["spec"]["volumeMode"] = json!("Block");
    let o = s.create(pvc_k, "default", block, false).unwrap();
    assert_eq!(o["spec"]["volumeMode"], "Block");
    // Updates are defaulted too: dropping the field does not remove it.
    let o = s
        .patch(
            pv_k,
            "",
            "v",
            PatchType::Merge,
            &json!({"spec": {"volumeMode": null}}),
            Target::Main,
            false,
        )
        .unwrap();
    assert_eq!(o["spec"]["volumeMode"], "Filesystem");
}

#[test]
fn default_storage_class_is_assigned() {
    let (mut s, pvc_k, _, _) = store();
    let sc = s
        .registry()
        .lookup("storage.k8s.io", "v1", "storageclasses")
        .unwrap();
    s.create(sc, "", json!({"metadata": {"name": "std", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "x"}), false).unwrap();
    let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    assert_eq!(o["spec"]["storageClassName"], "std");
    let mut explicit = pvc("b");
    explicit["spec"]["storageClassName"] = json!("");
    assert_eq!(
        s.create(pvc_k, "default", explicit, false).unwrap()["spec"]["storageClassName"],
        ""
    );
}

#[test]
fn claim_data_sources_are_normalized_like_upstream() {
    let (mut s, pvc_k, _, _) = store();
    let mut c = pvc("a");
    c["spec"]["dataSource"] = json!({"kind": "PersistentVolumeClaim", "name": "src"});
    let o = s.create(pvc_k, "default", c, false).unwrap();
    assert_eq!(
        o["spec"]["dataSourceRef"],
        json!({"apiGroup": null, "kind": "PersistentVolumeClaim", "name": "src"})
    );
    assert_eq!(o["spec"]["dataSource"]["apiGroup"], Value::Null);
    let mut c = pvc("b");
    c["spec"]["dataSource"] = json!({"apiGroup": "example.com", "kind": "Widget", "name": "w"});
    let o = s.create(pvc_k, "default", c, false).unwrap();
    assert!(o["spec"].get("dataSource").is_none() && o["spec"].get("dataSourceRef").is_none());
    let mut c = pvc("c");
    c["spec"]["dataSourceRef"] =
        json!({"kind": "PersistentVolumeClaim", "name": "src", "namespace": "x"});
    let o = s.create(pvc_k, "default", c.clone(), false).unwrap();
    assert!(
        o["spec"].get("dataSourceRef").is_none(),
        "CrossNamespaceVolumeDataSource is off"
    );
    s.set_feature_gates(FeatureGates::default().with(Gate::CrossNamespaceVolumeDataSource, true));
    c["metadata"]["name"] = json!("d");
    let o = s.create(pvc_k, "default", c, false).unwrap();
    assert_eq!(o["spec"]["dataSourceRef"]["namespace"], "x");
    assert!(o["spec"].get("dataSource").is_none());
}

#[test]
fn status_writes_keep_the_metadata_their_kind_says() {
    let (mut s, pvc_k, _, vs) = store();
    let o = s.create(pvc_k, "default", pvc("a"), false).unwrap();
    let mut st = (*o).clone();
    st["metadata"]["labels"] = json!({"from": "status"});
    st["status"] = json!({"phase": "Pending", "conditions": []});
    let u = s
        .update(pvc_k, "default", "a", st, Target::Status, false)
        .unwrap();
    assert_eq!(
        u["metadata"]["labels"]["from"], "status",
        "PVC: request metadata"
    );
    let va = s
        .registry()
        .lookup("storage.k8s.io", "v1", "volumeattachments")
        .unwrap();
    let o = s
        .create(va, "", json!({"metadata": {"name": "va", "labels": {"a": "1"}},
            "spec": {"attacher": "d.example.com", "nodeName": "n", "source": {"persistentVolumeName": "pv"}}}), false)
        .unwrap();
    let mut st = (*o).clone();
    st["metadata"]["labels"] = json!({"a": "2"});
    st["status"] = json!({"attached": true});
    let u = s.update(va, "", "va", st, Target::Status, false).unwrap();
    assert_eq!(u["metadata"]["labels"]["a"], "1", "VolumeAttachment: reset");
    assert_eq!(u["status"]["attached"], true);
    let o = s
        .create(
            vs,
            "default",
            json!({"metadata": {"name": "s"}, "spec": {}}),
            false,
        )
        .unwrap();
    let mut st = (*o).clone();
    st["metadata"]["annotations"] = json!({"x": "y"});
    st["status"] = json!({"readyToUse": true});
    let u = s
        .update(vs, "default", "s", st, Target::Status, false)
        .unwrap();
    assert!(
        u["metadata"].get("annotations").is_none(),
        "custom resources: status only"
    );
}

#[test]
fn gated_status_fields_are_dropped_unless_already_stored() {
    let (mut s, _, _, _) = store();
    let va = s
        .registry()
        .lookup("storage.k8s.io", "v1", "volumeattachments")
        .unwrap();
    let o = s
        .create(va, "", json!({"metadata": {"name": "va"},
            "spec": {"attacher": "d.example.com", "nodeName": "n", "source": {"persistentVolumeName": "pv"}}}), false)
        .unwrap();
    let with_code = |o: &Value| {
        let mut st = o.clone();
        st["status"] = json!({"attached": false, "attachError": {"message": "m", "errorCode": 3}});
        st
    };
    let u = s
        .update(va, "", "va", with_code(&o), Target::Status, false)
        .unwrap();
    assert!(u["status"]["attachError"].get("errorCode").is_none());
    s.set_feature_gates(FeatureGates::default().with(Gate::MutableCSINodeAllocatableCount, true));
    let u = s
        .update(va, "", "va", with_code(&u), Target::Status, false)
        .unwrap();
    assert_eq!(u["status"]["attachError"]["errorCode"], 3);
    // Off again: a code already stored is kept.
    s.set_feature_gates(FeatureGates::default());
    let mut st = (*u).clone();
    st["status"]["attachError"]["errorCode"] = json!(4);
    let u = s.update(va, "", "va", st, Target::Status, false).unwrap();
    assert_eq!(u["status"]["attachError"]["errorCode"], 4);
    // No unconditional updates of VolumeAttachments.
    let mut main = (*u).clone();
    main["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let e = s
        .update(va, "", "va", main, Target::Main, false)
        .unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
}
