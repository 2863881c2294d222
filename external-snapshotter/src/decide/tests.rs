use super::*;
use crate::model::{BoundRef, GroupContentStatus, SnapshotError};

fn dynamic() -> Content {
    Content {
        name: "snapcontent-1".into(),
        uid: "c-uid".into(),
        resource_version: "1".into(),
        driver: "d".into(),
        deletion_policy: "Delete".into(),
        volume_handle: Some("vol-1".into()),
        class: Some("class".into()),
        snapshot_ref: BoundRef {
            name: "snap".into(),
            namespace: "ns".into(),
            uid: "vs-uid".into(),
        },
        finalizers: [Atom::new(model::FINALIZER)].into_iter().collect(),
        ..Default::default()
    }
}

fn status(handle: &str, ready: bool) -> ContentStatus {
    ContentStatus {
        snapshot_handle: Some(handle.into()),
        ready_to_use: Some(ready),
        creation_time: Some(5),
        ..Default::default()
    }
}

#[test]
fn contents_of_this_driver_only() {
    let content = dynamic();
    let class = |driver: &str| Class {
        name: "class".into(),
        driver: driver.into(),
        parameters: BTreeMap::new(),
        deletion_policy: "Delete".into(),
    };
    assert!(driver_match(&content, None, "d"));
    assert!(driver_match(&content, Some(&class("d")), "d"));
    assert!(!driver_match(&content, Some(&class("other")), "d"));
    assert!(!driver_match(&content, None, "other"));
    let sourceless = Content {
        volume_handle: None,
        ..dynamic()
    };
    assert!(!driver_match(&sourceless, None, "d"));
}

#[test]
fn what_each_content_needs() {
    assert_eq!(plan(&dynamic(), false), Plan::Create);
    let cut = Content {
        status: Some(status("h", false)),
        ..dynamic()
    };
    assert_eq!(
        plan(&cut, false),
        Plan::Create,
        "polled by CreateSnapshot without ListSnapshots"
    );
    assert_eq!(plan(&cut, true), Plan::Check { handle: "h".into() });
    let ready = Content {
        status: Some(status("h", true)),
        ..dynamic()
    };
    assert_eq!(plan(&ready, false), Plan::Ready);
    let pre = Content {
        volume_handle: None,
        snapshot_handle_source: Some("pre".into()),
        ..dynamic()
    };
    assert_eq!(
        plan(&pre, false),
        Plan::Check {
            handle: "pre".into()
        }
    );
    let member = Content {
        group_member: true,
        ..dynamic()
    };
    assert_eq!(plan(&member, false), Plan::Nothing);
    let filled_member = Content {
        status: Some(ContentStatus {
            volume_group_snapshot_handle: Some("g".into()),
            ..status("m", false)
        }),
        ..member.clone()
    };
    assert_eq!(
        plan(&filled_member, false),
        Plan::Check { handle: "m".into() }
    );
}

#[test]
fn deletion_waits_for_the_snapshot_controller_and_an_unanswered_create() {
    let deleting = Content {
        deleting: true,
        status: Some(status("h", true)),
        ..dynamic()
    };
    assert_eq!(
        plan(&deleting, false),
        Plan::Ready,
        "no being-deleted annotation yet"
    );
    let asked = Content {
        being_deleted: true,
        ..deleting.clone()
    };
    assert_eq!(
        plan(&asked, false),
        Plan::Delete {
            handle: Some("h".into())
        }
    );
    let creating = Content {
        being_created: true,
        ..asked.clone()
    };
    assert!(!should_delete(&creating));
    let retained = Content {
        deletion_policy: "Retain".into(),
        ..asked.clone()
    };
    assert_eq!(plan(&retained, false), Plan::Delete { handle: None });
    let member = Content {
        status: Some(ContentStatus {
            volume_group_snapshot_handle: Some("g".into()),
            ..status("h", true)
        }),
        ..asked.clone()
    };
    assert_eq!(
        plan(&member, false),
        Plan::Delete { handle: None },
        "the group deletes it"
    );
    let unbound_pre = Content {
        deleting: true,
        volume_handle: None,
        snapshot_handle_source: Some("pre".into()),
        snapshot_ref: BoundRef::default(),
        ..dynamic()
    };
    assert!(should_delete(&unbound_pre));
}

#[test]
fn changes_to_act_on() {
    let old = dynamic();
    assert!(!should_enqueue(&old, &old.clone()));
    let status_only = Content {
        resource_version: "2".into(),
        status: Some(status("h", false)),
        being_created: true,
        finalizers: List::default(),
        ..old.clone()
    };
    assert!(!should_enqueue(&old, &status_only));
    let ready = Content {
        resource_version: "3".into(),
        status: Some(status("h", true)),
        ..status_only.clone()
    };
    assert!(should_enqueue(&status_only, &ready));
    let deleted = Content {
        resource_version: "4".into(),
        deleting: true,
        ..old.clone()
    };
    assert!(should_enqueue(&old, &deleted));
    let mut annotated = old.clone();
    annotated.resource_version = "5".into();
    annotated.other_metadata = old.other_metadata.wrapping_add(1);
    assert!(should_enqueue(&old, &annotated));
    let member = Content {
        group_member: true,
        ..old.clone()
    };
    let filled = Content {
        resource_version: "6".into(),
        status: Some(status("h", false)),
        ..member.clone()
    };
    assert!(
        should_enqueue(&member, &filled),
        "a member's status comes from the snapshot-controller"
    );
    let ready_member = Content {
        resource_version: "7".into(),
        status: Some(status("h", true)),
        ..member.clone()
    };
    let reset = Content {
        resource_version: "8".into(),
        ..filled.clone()
    };
    assert!(
        should_enqueue(&ready_member, &reset),
        "readiness rewritten to false by the snapshot-controller is read again"
    );
}

#[test]
fn a_ready_content_settles_and_its_changes_are_told_as_from_the_full_one() {
    let ready = Content {
        status: Some(status("h", true)),
        ..dynamic()
    };
    assert!(settled(&ready) && plan(&ready, true) == Plan::Ready);
    for unsettled in [
        dynamic(),
        Content {
            status: Some(status("h", false)),
            ..dynamic()
        },
        Content {
            being_created: true,
            ..ready.clone()
        },
        Content {
            deleting: true,
            ..ready.clone()
        },
    ] {
        assert!(!settled(&unsettled), "{unsettled:?}");
    }
    let settled_form = Settled::of(&ready);
    let changes = [
        Content {
            resource_version: "2".into(),
            finalizers: List::default(),
            ..ready.clone()
        },
        Content {
            status: Some(status("other", true)),
            ..ready.clone()
        },
        Content {
            status: Some(status("h", false)),
            ..ready.clone()
        },
        Content {
            status: None,
            ..ready.clone()
        },
        Content {
            being_created: true,
            ..ready.clone()
        },
        Content {
            deleting: true,
            ..ready.clone()
        },
        Content {
            being_deleted: true,
            ..ready.clone()
        },
        Content {
            deletion_policy: "Retain".into(),
            ..ready.clone()
        },
        Content {
            other_metadata: ready.other_metadata.wrapping_add(1),
            ..ready.clone()
        },
        Content {
            class: Some("another".into()),
            ..ready.clone()
        },
        Content {
            group_member: true,
            ..ready.clone()
        },
    ];
    for new in changes {
        assert_eq!(
            should_enqueue_settled(&settled_form, &new),
            should_enqueue(&ready, &new),
            "{new:?}"
        );
    }
}

fn group_content() -> GroupContent {
    GroupContent {
        name: "groupsnapcontent-1".into(),
        uid: "gc-uid".into(),
        driver: "d".into(),
        deletion_policy: "Delete".into(),
        volume_handles: vec!["v1".into(), "v2".into()],
        class: Some("gclass".into()),
        group_ref: BoundRef {
            name: "g".into(),
            namespace: "ns".into(),
            uid: "g-uid".into(),
        },
        ..GroupContent::default()
    }
}

fn member(volume: &str, snapshot: &str, ready: bool) -> SnapshotInfo {
    SnapshotInfo {
        volume_handle: volume.into(),
        snapshot_handle: snapshot.into(),
        creation_time: Some(5),
        ready_to_use: Some(ready),
        restore_size: Some(1024),
    }
}

#[test]
fn what_each_group_content_needs() {
    let fresh = group_content();
    assert!(driver_match(&fresh, None, "d"));
    assert!(!driver_match(&fresh, None, "other"));
    let no_source = GroupContent {
        volume_handles: vec![],
        ..fresh.clone()
    };
    assert!(!driver_match(&no_source, None, "d"));
    assert_eq!(group_plan(&fresh), GroupPlan::Create);
    let cut = GroupContent {
        status: Some(GroupContentStatus {
            volume_group_snapshot_handle: Some("g1".into()),
            ready_to_use: Some(false),
            volume_snapshot_info_list: vec![member("v1", "s1", false), member("v2", "s2", false)],
            ..GroupContentStatus::default()
        }),
        ..fresh.clone()
    };
    assert_eq!(
        group_plan(&cut),
        GroupPlan::Check {
            handle: "g1".into(),
            snapshot_ids: vec!["s1".into(), "s2".into()]
        },
        "read, not cut again"
    );
    let errored = GroupContent {
        status: Some(GroupContentStatus {
            ready_to_use: Some(false),
            error: Some(SnapshotError::default()),
            ..GroupContentStatus::default()
        }),
        ..fresh.clone()
    };
    assert_eq!(group_plan(&errored), GroupPlan::Create);
    let waiting = GroupContent {
        deleting: true,
        being_deleted: true,
        being_created: true,
        ..cut.clone()
    };
    assert!(!should_delete(&waiting), "an unanswered call holds it");
    let deleting = GroupContent {
        being_created: false,
        ..waiting
    };
    assert_eq!(
        group_plan(&deleting),
        GroupPlan::Delete {
            handle: Some("g1".into()),
            snapshot_ids: vec!["s1".into(), "s2".into()]
        }
    );
    let retained = GroupContent {
        deletion_policy: "Retain".into(),
        ..deleting
    };
    assert!(matches!(
        group_plan(&retained),
        GroupPlan::Delete { handle: None, .. }
    ));
    let pre = GroupContent {
        volume_handles: vec![],
        pre_provisioned: Some(model::GroupSnapshotHandles {
            volume_group_snapshot_handle: "g2".into(),
            volume_snapshot_handles: vec!["s3".into()],
        }),
        ..fresh
    };
    assert_eq!(
        group_plan(&pre),
        GroupPlan::Check {
            handle: "g2".into(),
            snapshot_ids: vec!["s3".into()]
        }
    );
}

#[test]
fn group_status_follows_the_driver_as_upstream_writes_it() {
    let answer = GroupAnswer {
        handle: "g1".into(),
        ready: false,
        creation_ns: 1_700_000_000_000_000_000,
        members: vec![member("v1", "s1", false)],
    };
    let first = group_status_patch(None, &answer, 0).unwrap();
    assert_eq!(
        first,
        json!({"status": {"volumeGroupSnapshotHandle": "g1", "readyToUse": false,
            "creationTime": "2023-11-14T22:13:20Z",
            "volumeSnapshotInfoList": [{"volumeHandle": "v1", "snapshotHandle": "s1",
                "creationTime": 5, "readyToUse": false, "restoreSize": 1024}]}})
    );
    let written = GroupContentStatus {
        volume_group_snapshot_handle: Some("g1".into()),
        creation_time: Some("2023-11-14T22:13:20Z".into()),
        ready_to_use: Some(false),
        error: Some(SnapshotError::default()),
        volume_snapshot_info_list: answer.members.clone(),
    };
    assert_eq!(group_status_patch(Some(&written), &answer, 0), None);
    let ready = GroupAnswer {
        ready: true,
        members: vec![member("v1", "s1", true)],
        ..answer
    };
    assert_eq!(
        group_status_patch(Some(&written), &ready, 0),
        Some(json!({"status": {"readyToUse": true, "error": null,
            "volumeSnapshotInfoList": [{"volumeHandle": "v1", "snapshotHandle": "s1",
                "creationTime": 5, "readyToUse": true, "restoreSize": 1024}]}})),
        "the member list follows the members' readiness (upstream writes it once)"
    );
    let written_ready = GroupContentStatus {
        ready_to_use: Some(true),
        error: None,
        volume_snapshot_info_list: ready.members.clone(),
        ..written.clone()
    };
    assert_eq!(group_status_patch(Some(&written_ready), &ready, 0), None);
    assert_eq!(
        error_patch(
            written.error.as_ref().and_then(|e| e.message.as_deref()),
            "boom",
            "t"
        ),
        Some(json!({"status": {"readyToUse": false, "error": {"time": "t", "message": "boom"}}}))
    );
    assert_eq!(
        group_snapshot_name("groupsnapshot", "ab-cd", 3).unwrap(),
        "groupsnapshot-abc"
    );
    assert!(group_snapshot_name("groupsnapshot", "", -1).is_err());
}

#[test]
fn names_parameters_and_secrets_as_upstream() {
    assert_eq!(
        snapshot_name("snapshot", "0d6c2b8e-9f1a", -1).unwrap(),
        "snapshot-0d6c2b8e-9f1a"
    );
    assert_eq!(
        snapshot_name("s", "0d6c2b8e-9f1a", 10).unwrap(),
        "s-0d6c2b8e9f"
    );
    assert!(snapshot_name("s", "", -1).is_err());

    let params = BTreeMap::from([
        ("a".to_string(), "1".to_string()),
        (
            "csi.storage.k8s.io/snapshotter-secret-name".to_string(),
            "s".to_string(),
        ),
        (LIST_SECRET_NAME.to_string(), "l".to_string()),
    ]);
    assert_eq!(
        driver_parameters(&params).unwrap(),
        BTreeMap::from([("a".to_string(), "1".to_string())])
    );
    let unknown = BTreeMap::from([("csi.storage.k8s.io/fstype".to_string(), "x".to_string())]);
    assert_eq!(
        driver_parameters(&unknown).unwrap_err(),
        "found unknown parameter key \"csi.storage.k8s.io/fstype\" with reserved namespace csi.storage.k8s.io/"
    );

    let list = BTreeMap::from([
        (
            LIST_SECRET_NAME.to_string(),
            "${volumesnapshotcontent.name}-list".to_string(),
        ),
        (LIST_SECRET_NAMESPACE.to_string(), "secrets".to_string()),
    ]);
    assert_eq!(
        list_secret(&list, "snapcontent-1").unwrap(),
        Some(SecretRef {
            namespace: "secrets".into(),
            name: "snapcontent-1-list".into()
        })
    );
    let bad = BTreeMap::from([
        (
            LIST_SECRET_NAME.to_string(),
            "${volumesnapshot.name}".to_string(),
        ),
        (LIST_SECRET_NAMESPACE.to_string(), "secrets".to_string()),
    ]);
    assert_eq!(
        list_secret(&bad, "c").unwrap_err(),
        "error resolving value \"${volumesnapshot.name}\": invalid tokens: [\"volumesnapshot.name\"]"
    );
    let half = BTreeMap::from([(LIST_SECRET_NAME.to_string(), "s".to_string())]);
    assert!(
        list_secret(&half, "c")
            .unwrap_err()
            .contains("Both must be specified")
    );

    let mut content = dynamic();
    assert_eq!(content_secret(&content), Ok(None));
    content.secret = SecretAnnotations::Given(Box::new(SecretRef {
        name: String::new(),
        namespace: "ns".into(),
    }));
    assert!(
        content_secret(&content)
            .unwrap_err()
            .contains("secret name or namespace not specified")
    );
}

#[test]
fn status_follows_the_driver_as_upstream_writes_it() {
    let answer = Answer {
        handle: "h".into(),
        ready: false,
        creation_ns: 0,
        size: 0,
        group_handle: String::new(),
    };
    assert_eq!(
        status_patch(None, &answer, 42),
        Some(json!({"status": {"snapshotHandle": "h", "readyToUse": false, "creationTime": 42}}))
    );
    let written = status("h", false);
    assert_eq!(
        status_patch(Some(&written), &answer, 43),
        None,
        "nothing new"
    );
    let ready = Answer {
        ready: true,
        size: 1024,
        creation_ns: 7,
        ..answer.clone()
    };
    let failed = ContentStatus {
        error: Some(Box::new(SnapshotError {
            message: Some("boom".into()),
            time: None,
        })),
        ..written.clone()
    };
    assert_eq!(
        status_patch(Some(&failed), &ready, 44),
        Some(json!({"status": {"readyToUse": true, "error": null, "restoreSize": 1024}})),
        "creation time kept, error cleared"
    );
    assert_eq!(
        error_patch(
            failed.error.as_ref().and_then(|e| e.message.as_deref()),
            "boom",
            "t"
        ),
        None,
        "the same message is written once"
    );
    assert_eq!(
        error_patch(None, "other", "t"),
        Some(json!({"status": {"readyToUse": false, "error": {"time": "t", "message": "other"}}}))
    );
}

#[test]
fn the_finalizer_is_removed_in_place() {
    let mut content = dynamic();
    content.finalizers = ["a", model::FINALIZER].into_iter().map(Atom::new).collect();
    assert_eq!(
        finalizer_removal(&content),
        Some(json!([
            {"op": "test", "path": "/metadata/finalizers/1", "value": model::FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/1"}
        ]))
    );
    content.finalizers = [Atom::new("a")].into_iter().collect();
    assert_eq!(finalizer_removal(&content), None);
}

#[test]
fn final_errors_are_upstreams() {
    assert!(is_final(Some(Code::InvalidArgument)));
    assert!(is_final(Some(Code::Internal)));
    assert!(!is_final(Some(Code::DeadlineExceeded)));
    assert!(!is_final(Some(Code::Aborted)));
    assert!(!is_final(None), "no answer at all");
}
