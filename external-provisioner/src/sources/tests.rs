use serde_json::json;

use super::*;

fn claim(spec: serde_json::Value) -> Claim {
    Claim::from_api(
        &serde_json::from_value(json!({
            "metadata": {"name": "restored", "namespace": "ns", "uid": "u-1"},
            "spec": spec
        }))
        .unwrap(),
    )
}

fn class() -> Class {
    Class {
        name: "fast".into(),
        provisioner: "d".into(),
        ..Class::default()
    }
}

fn snapshot() -> Snapshot {
    Snapshot {
        namespace: "ns".into(),
        name: "snap".into(),
        uid: "s-1".into(),
        resource_version: "1".into(),
        deleting: false,
        protected: false,
        bound_content: Some("content-1".into()),
        ready: true,
        restore_size: Some("1Gi".into()),
    }
}

fn content() -> Content {
    Content {
        name: "content-1".into(),
        driver: "d".into(),
        snapshot_ref: ("s-1".into(), "ns".into(), "snap".into()),
        handle: Some("snap-handle".into()),
        source_volume_mode: Some("Filesystem".into()),
        allow_mode_change: None,
    }
}

fn sized(size: &str, mode: Option<&str>) -> Claim {
    claim(json!({"storageClassName": "fast", "volumeMode": mode,
        "resources": {"requests": {"storage": size}}}))
}

fn restore_error(claim: &Claim, snapshot: &Snapshot, content: &Content) -> String {
    check_content(claim, &class(), snapshot, content, true)
        .unwrap_err()
        .message
}

#[test]
fn a_ready_snapshot_restores_from_its_handle() {
    let source = check_content(&sized("2Gi", None), &class(), &snapshot(), &content(), true);
    assert_eq!(
        source.unwrap().r#type,
        Some(Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-handle".into()
        }))
    );
}

#[test]
fn snapshot_checks_in_upstreams_order_and_words() {
    let missing = check_snapshot("snap", None).unwrap_err();
    assert_eq!(
        missing.message,
        "error getting snapshot snap from api server: volumesnapshots.snapshot.storage.k8s.io \"snap\" not found"
    );
    assert!(missing.may_change);
    let deleting = Snapshot {
        deleting: true,
        ..snapshot()
    };
    assert_eq!(
        check_snapshot("snap", Some(&deleting)).unwrap_err(),
        SourceError::fixed("snapshot snap is being deleted".into())
    );
    let held = Snapshot {
        protected: true,
        ..deleting
    };
    assert_eq!(
        check_snapshot("snap", Some(&held)).unwrap().1,
        "content-1",
        "a snapshot our finalizer holds can still be restored"
    );
    let unbound = Snapshot {
        bound_content: None,
        ..snapshot()
    };
    let err = check_snapshot("snap", Some(&unbound)).unwrap_err();
    assert_eq!(
        (err.message.as_str(), err.may_change),
        ("snapshot snap not bound", true)
    );

    let claim = sized("1Gi", None);
    let other = Content {
        snapshot_ref: ("s-2".into(), "ns".into(), "snap".into()),
        ..content()
    };
    assert_eq!(
        restore_error(&claim, &snapshot(), &other),
        "snapshotcontent content-1 for snapshot snap is bound to a different snapshot"
    );
    let foreign = Content {
        driver: "x".into(),
        ..content()
    };
    assert_eq!(
        restore_error(&claim, &snapshot(), &foreign),
        "snapshotcontent content-1 for snapshot snap is not handled by CSI driver of StorageClass fast"
    );
    let not_ready = Snapshot {
        ready: false,
        ..snapshot()
    };
    let err = check_content(&claim, &class(), &not_ready, &content(), true).unwrap_err();
    assert_eq!(
        (err.message.as_str(), err.may_change),
        ("snapshot snap is not Ready", true)
    );
    let no_handle = Content {
        handle: None,
        ..content()
    };
    assert_eq!(
        restore_error(&claim, &snapshot(), &no_handle),
        "snapshot handle snap is not available"
    );
    assert_eq!(
        restore_error(&sized("1Mi", None), &snapshot(), &content()),
        "requested volume size 1048576 is less than the size 1073741824 for the source snapshot snap"
    );
    let no_request = claim_without_request();
    assert_eq!(
        restore_error(&no_request, &snapshot(), &content()),
        "error getting capacity for PVC restored when creating snapshot snap"
    );
}

fn claim_without_request() -> Claim {
    claim(json!({"storageClassName": "fast"}))
}

#[test]
fn volume_mode_changes_need_the_contents_permission() {
    let block = sized("1Gi", Some("Block"));
    let prefix = "requested volume ns/restored modifies the mode of the source volume but does not have permission to do so.";
    assert_eq!(
        restore_error(&block, &snapshot(), &content()),
        format!(
            "{prefix} snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content-1"
        )
    );
    let refused = Content {
        allow_mode_change: Some("false".into()),
        ..content()
    };
    assert_eq!(
        restore_error(&block, &snapshot(), &refused),
        format!(
            "{prefix} snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content-1"
        )
    );
    let garbled = Content {
        allow_mode_change: Some("yes".into()),
        ..content()
    };
    assert_eq!(
        restore_error(&block, &snapshot(), &garbled),
        format!(
            "{prefix} failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value to boolean with error: strconv.ParseBool: parsing \"yes\": invalid syntax"
        )
    );
    let allowed = Content {
        allow_mode_change: Some("True".into()),
        ..content()
    };
    assert!(check_content(&block, &class(), &snapshot(), &allowed, true).is_ok());
    assert!(
        check_content(&block, &class(), &snapshot(), &content(), false).is_ok(),
        "--prevent-volume-mode-conversion=false allows it"
    );
    assert!(
        check_content(&sized("1Gi", None), &class(), &snapshot(), &content(), true).is_ok(),
        "a claim without a volume mode never converts"
    );
}

fn source_claim(extra: serde_json::Value) -> Claim {
    let mut value = json!({
        "metadata": {"name": "src", "namespace": "ns", "uid": "src-uid"},
        "spec": {"storageClassName": "fast", "volumeName": "pv-src",
            "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound"}
    });
    merge(&mut value, extra);
    Claim::from_api(&serde_json::from_value(value).unwrap())
}

fn source_pv(extra: serde_json::Value) -> Volume {
    let mut value = json!({
        "metadata": {"name": "pv-src"},
        "spec": {"csi": {"driver": "d", "volumeHandle": "vol-src"},
            "claimRef": {"namespace": "ns", "name": "src", "uid": "src-uid"}},
        "status": {"phase": "Bound"}
    });
    merge(&mut value, extra);
    Volume::from_api(&serde_json::from_value(value).unwrap())
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(base), serde_json::Value::Object(extra)) => {
            for (k, v) in extra {
                merge(base.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (base, extra) => *base = extra,
    }
}

fn clone_error(clone: &Claim, source: Option<&Claim>, pv: Option<&Volume>) -> String {
    check_clone(clone, &class(), "src", source, pv)
        .unwrap_err()
        .message
}

#[test]
fn a_bound_source_clones_from_its_volume() {
    let source = check_clone(
        &sized("1Gi", None),
        &class(),
        "src",
        Some(&source_claim(json!({}))),
        Some(&source_pv(json!({}))),
    );
    assert_eq!(
        source.unwrap().r#type,
        Some(Type::Volume(VolumeSource {
            volume_id: "vol-src".into()
        }))
    );
}

#[test]
fn clone_checks_in_upstreams_order_and_words() {
    let clone = sized("1Gi", None);
    let pv = source_pv(json!({}));
    let missing = check_clone(&clone, &class(), "src", None, None).unwrap_err();
    assert_eq!(
        missing.message,
        "error getting PVC src (namespace \"ns\") from api server: persistentvolumeclaim \"src\" not found"
    );
    assert!(missing.may_change);
    let pending = source_claim(json!({"status": {"phase": "Pending"}}));
    assert_eq!(
        clone_error(&clone, Some(&pending), Some(&pv)),
        "the PVC DataSource src must have a status of Bound.  Got {Pending}"
    );
    let deleting = source_claim(json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}));
    assert_eq!(
        clone_error(&clone, Some(&deleting), Some(&pv)),
        "the PVC DataSource src is currently being deleted"
    );
    let held = source_claim(
        json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z",
        "finalizers": [model::CLONE_FINALIZER]}}),
    );
    assert!(
        check_clone(&clone, &class(), "src", Some(&held), Some(&pv)).is_ok(),
        "a source our finalizer holds can still be cloned"
    );
    let classless = source_claim(json!({"spec": {"storageClassName": null}}));
    assert_eq!(
        clone_error(&clone, Some(&classless), Some(&pv)),
        "the source PVC (src) storageclass cannot be empty"
    );
    let clone_classless = claim(json!({"resources": {"requests": {"storage": "1Gi"}}}));
    assert_eq!(
        clone_error(&clone_classless, Some(&source_claim(json!({}))), Some(&pv)),
        "the requested PVC (restored) storageclass cannot be empty"
    );
    assert_eq!(
        clone_error(
            &sized("512Mi", None),
            Some(&source_claim(json!({}))),
            Some(&pv)
        ),
        "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824"
    );
    let unnamed = source_claim(json!({"spec": {"volumeName": null}}));
    assert_eq!(
        clone_error(&clone, Some(&unnamed), Some(&pv)),
        "volume name is empty in source PVC src"
    );
    let source = source_claim(json!({}));
    for bad in [
        None,
        Some(source_pv(json!({"spec": {"csi": {"driver": "x"}}}))),
        Some(source_pv(json!({"spec": {"claimRef": {"uid": "other"}}}))),
        Some(source_pv(json!({"spec": {"claimRef": {"name": "other"}}}))),
        Some(source_pv(json!({"status": {"phase": "Released"}}))),
    ] {
        assert_eq!(
            clone_error(&clone, Some(&source), bad.as_ref()),
            "claim in dataSource not bound or invalid",
            "{bad:?}"
        );
    }
}

#[test]
fn clones_keep_the_volume_mode() {
    let block_pv = source_pv(json!({"spec": {"volumeMode": "Block"}}));
    let fs_pv = source_pv(json!({"spec": {"volumeMode": "Filesystem"}}));
    let unset_pv = source_pv(json!({}));
    let source = source_claim(json!({}));
    let to_fs = "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem";
    let to_block = "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block";
    let cases = [
        (Some("Block"), &block_pv, None),
        (Some("Block"), &fs_pv, Some(to_block)),
        (Some("Block"), &unset_pv, Some(to_block)),
        (None, &unset_pv, None),
        (None, &block_pv, Some(to_fs)),
        (Some("Filesystem"), &fs_pv, None),
        (Some("Filesystem"), &unset_pv, None),
    ];
    for (mode, pv, expected) in cases {
        let result = check_clone(
            &sized("1Gi", mode),
            &class(),
            "src",
            Some(&source),
            Some(pv),
        );
        assert_eq!(
            result.err().map(|e| e.message),
            expected.map(String::from),
            "{mode:?} from {:?}",
            pv.volume_mode
        );
    }
}

#[test]
fn grants_match_upstreams_rules() {
    let grant = |from: serde_json::Value, to: serde_json::Value| {
        Grant::from_api(
            &serde_json::from_value(json!({
                "metadata": {"name": "g", "namespace": "src-ns"},
                "spec": {"from": from, "to": to}
            }))
            .unwrap(),
        )
    };
    let source = DataSource {
        api_group: "snapshot.storage.k8s.io".into(),
        kind: "VolumeSnapshot".into(),
        name: "snap".into(),
        namespace: Some("src-ns".into()),
        from_ref: true,
    };
    let from = json!([{"group": "", "kind": "PersistentVolumeClaim", "namespace": "ns"}]);
    let to_any = json!([{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}]);
    assert!(grant(from.clone(), to_any.clone()).allows("ns", &source));
    assert!(
        grant(
            from.clone(),
            json!([{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}])
        )
        .allows("ns", &source)
    );
    assert!(
        !grant(
            from.clone(),
            json!([{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "other"}])
        )
        .allows("ns", &source)
    );
    assert!(
        !grant(
            from.clone(),
            json!([{"group": "", "kind": "VolumeSnapshot"}])
        )
        .allows("ns", &source)
    );
    assert!(
        !grant(
            from.clone(),
            json!([{"group": "snapshot.storage.k8s.io", "kind": "Other"}])
        )
        .allows("ns", &source)
    );
    assert!(!grant(from.clone(), to_any.clone()).allows("elsewhere", &source));
    assert!(
        !grant(
            json!([{"group": "x", "kind": "PersistentVolumeClaim", "namespace": "ns"}]),
            to_any.clone()
        )
        .allows("ns", &source)
    );
    assert!(
        !grant(
            json!([{"group": "", "kind": "Pod", "namespace": "ns"}]),
            to_any.clone()
        )
        .allows("ns", &source)
    );
    assert!(!grant(json!([]), to_any).allows("ns", &source));
    let claim = claim(json!({}));
    assert_eq!(
        not_granted(&claim, &source),
        "accessing src-ns/snap of VolumeSnapshot dataSource from ns/restored isn't allowed"
    );
}

#[test]
fn projections_of_snapshots_and_contents() {
    let vs: VolumeSnapshot = serde_json::from_value(json!({
        "metadata": {"name": "snap", "namespace": "ns", "uid": "s-1", "resourceVersion": "4",
            "finalizers": [model::SNAPSHOT_FINALIZER, "other"]},
        "spec": {"source": {"persistentVolumeClaimName": "x"}},
        "status": {"boundVolumeSnapshotContentName": "content-1", "readyToUse": true, "restoreSize": "1Gi"}
    }))
    .unwrap();
    assert_eq!(
        Snapshot::from_api(&vs),
        Snapshot {
            protected: true,
            resource_version: "4".into(),
            ..snapshot()
        }
    );
    let vsc: VolumeSnapshotContent = serde_json::from_value(json!({
        "metadata": {"name": "content-1", "annotations": {ALLOW_VOLUME_MODE_CHANGE: "true"}},
        "spec": {"driver": "d", "deletionPolicy": "Delete", "sourceVolumeMode": "Filesystem",
            "volumeSnapshotRef": {"uid": "s-1", "namespace": "ns", "name": "snap"}},
        "status": {"snapshotHandle": "snap-handle", "readyToUse": true}
    }))
    .unwrap();
    assert_eq!(
        Content::from_api(&vsc),
        Content {
            allow_mode_change: Some("true".into()),
            ..content()
        }
    );
}
