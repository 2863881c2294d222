//! Group snapshots (gate CSIVolumeGroupSnapshot): cut once for the claims a VolumeGroupSnapshot
//! selects, read until ready, the members checked, deleted together with their group; bad input
//! reported; nothing done with the gate off; no group leaked when its content goes away during
//! the call.

use std::collections::BTreeSet;

use crate::common::*;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testkit::mockdriver::MockDriver;

/// The members of the group `uid`: the VolumeSnapshots it owns, once there are `count`.
async fn members(env: &Env, group_uid: &str, count: usize) -> Vec<Value> {
    eventually("the group's member snapshots", || async {
        let list = env.snapshots().list(&ListParams::default()).await.ok()?;
        let members: Vec<Value> = list
            .items
            .into_iter()
            .map(|s| serde_json::to_value(s).unwrap())
            .filter(|s| {
                s["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|o| o["uid"] == group_uid))
            })
            .collect();
        (members.len() == count).then_some(members)
    })
    .await
}

async fn two_labelled_claims(env: &Env) -> BTreeSet<String> {
    let mut volumes = BTreeSet::new();
    for claim in ["a", "b"] {
        volumes.insert(env.bound_claim(claim).await);
        env.label_claim(claim, "db").await;
    }
    volumes
}

#[tokio::test]
async fn a_group_snapshot_is_cut_once_and_deleted_with_its_group() {
    let env = Env::start(MockDriver::default(), |c| {
        with_groups(c);
        c.naming.extra_create_metadata = true;
    })
    .await;
    if skip_without_group_snapshots(&env).await {
        return;
    }
    env.group_class("gclass", "Delete", json!({"consistency": "crash"}))
        .await;
    let volumes = two_labelled_claims(&env).await;
    let uid = env.group_snapshot("g", "db", "gclass").await;
    let name = format!("groupsnapcontent-{uid}");
    let content = env
        .group_content_until(&name, "the group content ready, its annotation gone", |c| {
            c["status"]["readyToUse"] == true
                && annotation(
                    c,
                    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-created",
                )
                .is_none()
        })
        .await;
    let state = env.mock.state();
    assert_eq!(state.group_snapshots.len(), 1);
    let group = state.group_snapshots.values().next().unwrap();
    assert_eq!(group.name, format!("groupsnapshot-{uid}"));
    let status = &content["status"];
    assert_eq!(status["volumeGroupSnapshotHandle"], group.id.as_str());
    assert!(status["creationTime"].is_string(), "a metav1.Time");
    let infos = status["volumeSnapshotInfoList"].as_array().unwrap();
    let listed: BTreeSet<String> = infos
        .iter()
        .map(|i| i["volumeHandle"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, volumes);
    assert!(
        infos
            .iter()
            .all(|i| i["restoreSize"] == GI && i["readyToUse"] == true)
    );
    assert_eq!(env.mock.calls().count(CREATE_GROUP), 1);
    let calls = env.mock.calls().of(CREATE_GROUP);
    let request: Value = serde_json::from_str(&calls[0].request).unwrap();
    assert_eq!(
        request["parameters"],
        json!({"consistency": "crash",
            "csi.storage.k8s.io/volumegroupsnapshot/name": "g",
            "csi.storage.k8s.io/volumegroupsnapshot/namespace": env.ns(),
            "csi.storage.k8s.io/volumegroupsnapshotcontent/name": name})
    );
    // The controller makes a snapshot of each member; the sidecar never cuts them alone.
    let members = members(&env, &uid, 2).await;
    for member in &members {
        let member_name = member["metadata"]["name"].as_str().unwrap();
        env.snapshot_until(member_name, "the member ready", |s| {
            s["status"]["readyToUse"] == true
        })
        .await;
    }
    assert_eq!(env.mock.calls().count(CREATE), 0);
    env.groups()
        .delete("g", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the group content gone", || async {
        matches!(
            env.group_contents().get(&name).await,
            Err(kube::Error::Api(s)) if s.code == 404
        )
        .then_some(())
    })
    .await;
    let state = env.mock.state();
    assert!(state.group_snapshots.is_empty() && state.snapshots.is_empty());
    assert_eq!(env.mock.calls().count(DELETE_GROUP), 1);
    assert_eq!(
        env.mock.calls().count(DELETE),
        0,
        "members go with their group"
    );
}

#[tokio::test]
async fn a_group_not_ready_at_once_is_read_until_it_is() {
    let env = Env::start(MockDriver::default().snapshot_ready_after(2), with_groups).await;
    if skip_without_group_snapshots(&env).await {
        return;
    }
    env.group_class("gclass", "Delete", json!({})).await;
    two_labelled_claims(&env).await;
    let uid = env.group_snapshot("g", "db", "gclass").await;
    let name = format!("groupsnapcontent-{uid}");
    let cut = env
        .group_content_until(&name, "the group cut", |c| {
            c["status"]["volumeGroupSnapshotHandle"].is_string()
        })
        .await;
    assert_ne!(cut["status"]["readyToUse"], true);
    let ready = env
        .group_content_until(&name, "the group ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    // The member list says so too: the snapshot-controller copies it into the members'
    // contents while the group is not ready.
    let listed = ready["status"]["volumeSnapshotInfoList"]
        .as_array()
        .unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|m| m["readyToUse"] == true), "{listed:?}");
    assert_eq!(
        (
            env.mock.calls().count(CREATE_GROUP),
            env.mock.calls().count(GET_GROUP)
        ),
        (1, 2),
        "cut once, then read"
    );
    // The members' contents were made from the list while it said "not ready"; each is read
    // until it is ready, whatever the snapshot-controller wrote into it meanwhile.
    for member in members(&env, &uid, 2).await {
        let member_name = member["metadata"]["name"].as_str().unwrap();
        env.snapshot_until(member_name, "the member ready", |s| {
            s["status"]["readyToUse"] == true
        })
        .await;
    }
    assert_eq!(env.mock.calls().count(CREATE), 0);
}

/// A group content as the snapshot-controller would make it for the group `uid`, bound to no
/// existing VolumeGroupSnapshot.
async fn group_content(env: &Env, name: &str, class: Option<&str>, volumes: &[String]) {
    let mut spec = json!({
        "driver": env.driver, "deletionPolicy": "Delete",
        "source": {"volumeHandles": volumes},
        "volumeGroupSnapshotRef": {"kind": "VolumeGroupSnapshot",
            "apiVersion": "groupsnapshot.storage.k8s.io/v1",
            "namespace": env.ns(), "name": "missing", "uid": format!("{name}-uid")},
    });
    if let Some(class) = class {
        spec["volumeGroupSnapshotClassName"] = json!(env.n(class));
    }
    let content = json!({
        "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent",
        "metadata": {"name": name}, "spec": spec,
    });
    env.group_contents()
        .create(
            &PostParams::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_group_content_without_a_class_gets_a_clear_error() {
    let env = Env::start(MockDriver::default(), with_groups).await;
    let volume = env.bound_claim("a").await;
    let name = env.n("groupsnapcontent-noclass");
    group_content(&env, &name, None, &[volume]).await;
    let expected = "without a group snapshot class";
    let content = env
        .group_content_until(&name, "the error in the status", |c| {
            c["status"]["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(expected))
        })
        .await;
    assert_eq!(content["status"]["readyToUse"], false);
    let events = eventually("the Event", || async {
        let events = env.events(&name).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events[0].0, "GroupSnapshotCreationFailed");
    assert!(events[0].1.starts_with("Failed to create group snapshot: "));
    assert_eq!(env.mock.calls().count(CREATE_GROUP), 0);
    env.group_contents()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_pre_provisioned_group_the_driver_does_not_know_gets_a_clear_error() {
    let env = Env::start(MockDriver::default(), with_groups).await;
    let name = env.n("groupsnapcontent-unknown");
    let content = json!({
        "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotContent",
        "metadata": {"name": name},
        "spec": {"driver": env.driver, "deletionPolicy": "Retain",
            "source": {"groupSnapshotHandles": {"volumeGroupSnapshotHandle": "group-nope",
                "volumeSnapshotHandles": ["snap-nope"]}},
            "volumeGroupSnapshotRef": {"kind": "VolumeGroupSnapshot",
                "apiVersion": "groupsnapshot.storage.k8s.io/v1",
                "namespace": env.ns(), "name": "missing", "uid": format!("{name}-uid")}},
    });
    env.group_contents()
        .create(
            &PostParams::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
    env.group_content_until(&name, "the error in the status", |c| {
        c["status"]["error"]["message"].as_str().is_some_and(|m| {
            m.contains("failed to list group snapshot") && m.contains("group-nope")
        })
    })
    .await;
    let events = eventually("the Event", || async {
        let events = env.events(&name).await;
        (!events.is_empty()).then_some(events)
    })
    .await;
    assert_eq!(events[0].0, "GroupSnapshotContentCheckandUpdateFailed");
    assert_eq!(env.mock.calls().count(CREATE_GROUP), 0);
    env.group_contents()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn with_the_gate_off_group_contents_are_left_alone() {
    let env = Env::start(MockDriver::default(), |_| {}).await;
    env.group_class("gclass", "Delete", json!({})).await;
    env.class("class", "Delete", json!({})).await;
    let volume = env.bound_claim("a").await;
    let name = env.n("groupsnapcontent-off");
    group_content(&env, &name, Some("gclass"), &[volume]).await;
    // A snapshot taken after it is done: the snapshotter has been running past the group
    // content's creation.
    let uid = env.snapshot("snap", "a", "class").await;
    env.content_until(&format!("snapcontent-{uid}"), "the snapshot ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    let content = serde_json::to_value(env.group_contents().get(&name).await.unwrap()).unwrap();
    assert!(content.get("status").is_none_or(Value::is_null));
    assert_eq!(env.mock.calls().count(CREATE_GROUP), 0);
    env.group_contents()
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_group_content_gone_during_its_call_leaves_no_group_snapshot() {
    let env = Env::start(MockDriver::builder(), with_groups).await;
    if skip_without_group_snapshots(&env).await {
        return;
    }
    env.group_class("gclass", "Delete", json!({})).await;
    two_labelled_claims(&env).await;
    env.mock.faults().hang(CREATE_GROUP);
    let uid = env.group_snapshot("g", "db", "gclass").await;
    let name = format!("groupsnapcontent-{uid}");
    eventually("the call at the driver", || async {
        (env.mock.calls().count(CREATE_GROUP) >= 1).then_some(())
    })
    .await;
    // Force-deleted: the group goes, then the content's finalizer is taken away.
    env.groups()
        .delete("g", &DeleteParams::default())
        .await
        .unwrap();
    env.group_content_until(&name, "the content being deleted", |c| {
        c["metadata"]["deletionTimestamp"].is_string()
    })
    .await;
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    env.group_contents()
        .patch(&name, &PatchParams::default(), &unfinalize)
        .await
        .unwrap();
    eventually("the group content gone", || async {
        matches!(
            env.group_contents().get(&name).await,
            Err(kube::Error::Api(s)) if s.code == 404
        )
        .then_some(())
    })
    .await;
    env.mock.faults().release(CREATE_GROUP);
    eventually("the orphan group deleted", || async {
        (env.mock.calls().count(DELETE_GROUP) == 1).then_some(())
    })
    .await;
    let state = env.mock.state();
    assert!(state.group_snapshots.is_empty() && state.snapshots.is_empty());
}

/// Forged group entries seeded while the snapshotter is down: one naming another group's
/// snapshot for a group content that does not exist, one recording the group UID a live group
/// content is bound to. Both are dropped with a Warning Event; the live group is untouched.
#[tokio::test]
async fn forged_group_journal_entries_are_dropped_and_never_reach_the_driver() {
    use k8s_openapi::api::core::v1::Event;
    let mut env = Env::start(MockDriver::builder(), with_groups).await;
    if skip_without_group_snapshots(&env).await {
        return;
    }
    env.group_class("gclass", "Delete", json!({})).await;
    let volumes: Vec<String> = two_labelled_claims(&env).await.into_iter().collect();
    let uid = env.group_snapshot("g", "db", "gclass").await;
    let name = format!("groupsnapcontent-{uid}");
    env.group_content_until(&name, "the group ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    env.kill().await;
    let intent = |group_uid: &str| {
        json!({"content_uid": "c0ffee00-0000-4000-8000-000000000001",
            "group_snapshot_uid": group_uid, "name": format!("groupsnapshot-{uid}"),
            "source_volumes": volumes, "parameters": {}, "secret": null, "delete": true})
        .to_string()
    };
    write_journal(
        &env,
        [
            (
                "G_groupsnapcontent-forged-name".to_string(),
                intent("c0ffee00-0000-4000-8000-000000000002"),
            ),
            ("G_groupsnapcontent-forged-owner".to_string(), intent(&uid)),
        ]
        .into(),
    )
    .await;
    env.run();
    let rejected = eventually("a Warning Event per forged entry", || async {
        let events = kube::Api::<Event>::namespaced(env.client(), env.ns())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let rejected: Vec<String> = events
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some("snapshotter-journal"))
            .filter(|e| e.reason.as_deref() == Some(sidecar_kit::cluster::journal::REJECTED_REASON))
            .filter_map(|e| e.message)
            .collect();
        (rejected.len() == 2).then_some(rejected)
    })
    .await;
    assert!(
        rejected
            .iter()
            .any(|m| m.contains("is not the one derived from the UID it records")),
        "{rejected:?}"
    );
    assert!(
        rejected
            .iter()
            .any(|m| m.contains(&format!("belongs to content {name:?}"))),
        "{rejected:?}"
    );
    assert_eq!(env.mock.calls().count(DELETE_GROUP), 0);
    assert_eq!(env.mock.state().group_snapshots.len(), 1, "untouched");
    env.stop().await;
}
