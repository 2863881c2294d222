//! The group part of the snapshot-controller stand-in (upstream's common controller with the
//! `CSIVolumeGroupSnapshot` gate on), in the flows the tests take: for a VolumeGroupSnapshot
//! it creates `groupsnapcontent-<uid>` with the handles of the bound claims its selector
//! picks (class, deletion policy, driver, the group deletion secret annotations resolved from
//! the class), adds the group's and the content's finalizers, and once the sidecar has filled
//! the content's status creates one bound VolumeSnapshot and VolumeSnapshotContent per member
//! (annotated with the group handle, their status written from the group's list), copies the
//! content's status to the group, and on the group's deletion marks the content
//! `volumegroupsnapshot-being-deleted`, deletes it when its policy is Delete, deletes the
//! members and lets the group go once its content is gone.
//!
//! Left out: pre-provisioned groups, the default class, Events and metrics.

use serde_json::{Value, json};

use super::registry::KindId;
use super::snapshot_controller::{
    SECRET_NAME, SECRET_NAMESPACE, being_deleted, str_at, update, with_finalizers,
};
use super::store::{EventType, Preconditions, Store, Target, WatchEvent, key_of};

pub const GROUP_FINALIZER: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-bound-protection";
pub const GROUP_CONTENT_FINALIZER: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshotcontent-bound-protection";
pub const IN_GROUP_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-in-group-protection";
pub const GROUP_BEING_DELETED: &str =
    "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-being-deleted";
pub const GROUP_SECRET_NAME: &str = "groupsnapshot.storage.kubernetes.io/deletion-secret-name";
pub const GROUP_SECRET_NAMESPACE: &str =
    "groupsnapshot.storage.kubernetes.io/deletion-secret-namespace";
pub const GROUP_HANDLE: &str = "groupsnapshot.storage.k8s.io/volumeGroupSnapshotHandle";
const CLASS_SECRET_NAME: &str = "csi.storage.k8s.io/group-snapshotter-secret-name";
const CLASS_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/group-snapshotter-secret-namespace";
const API_VERSION: &str = "groupsnapshot.storage.k8s.io/v1";

#[derive(Clone, Copy)]
pub(super) struct GroupKinds {
    pub group: KindId,
    pub content: KindId,
    pub class: KindId,
    pub snapshot: KindId,
    pub snapshot_content: KindId,
    pub pvc: KindId,
    pub pv: KindId,
}

/// `${volumegroupsnapshotcontent.name}`, `${volumegroupsnapshot.namespace}` and
/// `${volumegroupsnapshot.name}` in a secret template; `None` when it names anything else.
fn resolve(template: &str, content: &str, group: &Value) -> Option<String> {
    let out = template
        .replace("${volumegroupsnapshotcontent.name}", content)
        .replace(
            "${volumegroupsnapshot.namespace}",
            str_at(group, "/metadata/namespace"),
        )
        .replace(
            "${volumegroupsnapshot.name}",
            str_at(group, "/metadata/name"),
        );
    (!out.contains('$')).then_some(out)
}

fn matches_selector(claim: &Value, selector: Option<&Value>) -> bool {
    let Some(labels) = selector
        .and_then(|s| s.get("matchLabels"))
        .and_then(Value::as_object)
    else {
        return false;
    };
    labels.iter().all(|(key, value)| {
        claim.pointer(&format!("/metadata/labels/{}", key.replace('/', "~1"))) == Some(value)
    })
}

/// The members of a group: the VolumeSnapshots it owns.
fn members(s: &Store, k: GroupKinds, ns: &str, group_uid: &str) -> Vec<Value> {
    s.all(k.snapshot)
        .filter(|snap| {
            str_at(snap, "/metadata/namespace") == ns
                && snap
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .is_some_and(|owners| owners.iter().any(|o| str_at(o, "/uid") == group_uid))
        })
        .map(|snap| (**snap).clone())
        .collect()
}

pub(super) fn sync_group(s: &mut Store, k: GroupKinds, ns: &str, name: &str) {
    let Ok(group) = s.get(k.group, ns, name) else {
        return;
    };
    let uid = str_at(&group, "/metadata/uid").to_string();
    let content_name = format!("groupsnapcontent-{uid}");
    let content = s.get(k.content, "", &content_name).ok().filter(|c| {
        str_at(c, "/spec/volumeGroupSnapshotRef/namespace") == ns
            && str_at(c, "/spec/volumeGroupSnapshotRef/name") == name
            && str_at(c, "/spec/volumeGroupSnapshotRef/uid") == uid
    });

    if being_deleted(&group) {
        // Upstream finds the content of a group being deleted only through the group's status
        // (its fallback to `groupsnapcontent-<uid>` tests the address of a field against nil,
        // so it never runs): a group deleted before its status names its content leaves that
        // content behind, and so does this stand-in.
        let bound = str_at(&group, "/status/boundVolumeGroupSnapshotContentName") == content_name;
        let content = content.filter(|_| bound);
        let delete_content = content
            .as_ref()
            .is_some_and(|c| str_at(c, "/spec/deletionPolicy") == "Delete");
        if let Some(content) = &content {
            let marked = str_at(
                content,
                &format!(
                    "/metadata/annotations/{}",
                    GROUP_BEING_DELETED.replace('/', "~1")
                ),
            ) == "yes";
            if !marked {
                let mut changed = (**content).clone();
                if !changed
                    .pointer("/metadata/annotations")
                    .is_some_and(Value::is_object)
                {
                    changed["metadata"]["annotations"] = json!({});
                }
                changed["metadata"]["annotations"][GROUP_BEING_DELETED] = json!("yes");
                update(s, k.content, changed, Target::Main);
            }
            if delete_content && !being_deleted(content) {
                let _ = s.delete(
                    k.content,
                    "",
                    &content_name,
                    &Preconditions::default(),
                    false,
                );
            }
        }
        for member in members(s, k, ns, &uid) {
            let (_, member_name) = key_of(&member);
            if let Some(changed) = with_finalizers(&member, &[], &[IN_GROUP_FINALIZER]) {
                update(s, k.snapshot, changed, Target::Main);
            }
            if !being_deleted(&member) {
                let _ = s.delete(
                    k.snapshot,
                    ns,
                    &member_name,
                    &Preconditions::default(),
                    false,
                );
            }
        }
        let keep_bound = content.is_some() && delete_content;
        let remove: &[&str] = if keep_bound { &[] } else { &[GROUP_FINALIZER] };
        if let Some(changed) = with_finalizers(&group, &[], remove) {
            update(s, k.group, changed, Target::Main);
        }
        return;
    }

    let content = match content {
        Some(content) => content,
        None => {
            if s.get(k.content, "", &content_name).is_ok() {
                return;
            }
            match create_content(s, k, &group, &content_name) {
                Some(content) => content,
                None => return,
            }
        }
    };
    if !being_deleted(&content)
        && let Some(changed) = with_finalizers(&content, &[GROUP_CONTENT_FINALIZER], &[])
    {
        update(s, k.content, changed, Target::Main);
    }
    // As upstream, the group's finalizer comes once its content exists: a group deleted before
    // goes at once, and its content stays.
    if let Ok(group) = s.get(k.group, ns, name)
        && let Some(changed) = with_finalizers(&group, &[GROUP_FINALIZER], &[])
    {
        update(s, k.group, changed, Target::Main);
    }
    create_members(s, k, &group, &content);
    let Ok(group) = s.get(k.group, ns, name) else {
        return;
    };
    let Ok(content) = s.get(k.content, "", &content_name) else {
        return;
    };
    let cs = content.get("status");
    let mut status = group
        .get("status")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    status.insert(
        "boundVolumeGroupSnapshotContentName".into(),
        json!(content_name),
    );
    let ready = cs
        .and_then(|c| c.get("readyToUse"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    status.insert("readyToUse".into(), json!(ready));
    if let Some(time) = cs
        .and_then(|c| c.get("creationTime"))
        .filter(|t| !t.is_null())
    {
        status.insert("creationTime".into(), time.clone());
    }
    match cs.and_then(|c| c.get("error")).filter(|e| !e.is_null()) {
        Some(error) => status.insert("error".into(), error.clone()),
        None => status.remove("error"),
    };
    let status = Value::Object(status);
    if group.get("status") != Some(&status) {
        let mut updated = (*group).clone();
        updated["status"] = status;
        update(s, k.group, updated, Target::Status);
    }
}

fn create_content(
    s: &mut Store,
    k: GroupKinds,
    group: &Value,
    name: &str,
) -> Option<std::sync::Arc<Value>> {
    let ns = str_at(group, "/metadata/namespace");
    let class = s
        .get(
            k.class,
            "",
            str_at(group, "/spec/volumeGroupSnapshotClassName"),
        )
        .ok()?;
    let selector = group.pointer("/spec/source/selector");
    let mut handles = Vec::new();
    for claim in s.all(k.pvc) {
        if str_at(claim, "/metadata/namespace") != ns || !matches_selector(claim, selector) {
            continue;
        }
        let volume = str_at(claim, "/spec/volumeName");
        if volume.is_empty() {
            return None;
        }
        let handle = s
            .get(k.pv, "", volume)
            .ok()
            .map(|pv| str_at(&pv, "/spec/csi/volumeHandle").to_string())
            .filter(|h| !h.is_empty())?;
        handles.push(handle);
    }
    if handles.is_empty() {
        return None;
    }
    let mut content = json!({
        "apiVersion": API_VERSION, "kind": "VolumeGroupSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "volumeGroupSnapshotRef": {
                "kind": "VolumeGroupSnapshot", "apiVersion": API_VERSION,
                "namespace": ns, "name": str_at(group, "/metadata/name"),
                "uid": str_at(group, "/metadata/uid"),
                "resourceVersion": str_at(group, "/metadata/resourceVersion"),
            },
            "source": {"volumeHandles": handles},
            "volumeGroupSnapshotClassName": str_at(&class, "/metadata/name"),
            "deletionPolicy": str_at(&class, "/deletionPolicy"),
            "driver": str_at(&class, "/driver"),
        }
    });
    let params = class.get("parameters");
    let param = |key: &str| params.and_then(|p| p.get(key)).and_then(Value::as_str);
    if let (Some(name_t), Some(ns_t)) = (param(CLASS_SECRET_NAME), param(CLASS_SECRET_NAMESPACE)) {
        let (Some(secret), Some(secret_ns)) =
            (resolve(name_t, name, group), resolve(ns_t, name, group))
        else {
            return None;
        };
        content["metadata"]["annotations"] =
            json!({GROUP_SECRET_NAME: secret, GROUP_SECRET_NAMESPACE: secret_ns});
    }
    match s.create(k.content, "", content, false) {
        Ok(created) => Some(created),
        Err(e) => {
            tracing::debug!(error = %e, "snapshot controller group content create");
            s.get(k.content, "", name).ok()
        }
    }
}

/// One bound VolumeSnapshot and VolumeSnapshotContent per member the sidecar reported.
fn create_members(s: &mut Store, k: GroupKinds, group: &Value, content: &Value) {
    let group_handle = str_at(content, "/status/volumeGroupSnapshotHandle").to_string();
    let infos = content
        .pointer("/status/volumeSnapshotInfoList")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if group_handle.is_empty() || infos.is_empty() || being_deleted(content) {
        return;
    }
    let ns = str_at(group, "/metadata/namespace").to_string();
    let group_uid = str_at(group, "/metadata/uid").to_string();
    // As upstream, every sync of a group not ready yet writes each member content's status from
    // the group content's list again, whatever the member's sidecar wrote meanwhile.
    let group_ready = group.pointer("/status/readyToUse") == Some(&json!(true));
    let member_status = |info: &Value| {
        json!({
            "snapshotHandle": str_at(info, "/snapshotHandle"),
            "volumeGroupSnapshotHandle": group_handle,
            "creationTime": info.get("creationTime").cloned().unwrap_or(Value::Null),
            "restoreSize": info.get("restoreSize").cloned().unwrap_or(Value::Null),
            "readyToUse": info.get("readyToUse").cloned().unwrap_or(json!(false)),
        })
    };
    for (i, info) in infos.iter().enumerate() {
        let member_content = format!("snapcontent-{group_uid}-{i}");
        let member = format!("snapshot-{group_uid}-{i}");
        if let Ok(existing) = s.get(k.snapshot_content, "", &member_content) {
            let status = member_status(info);
            if !group_ready && existing.get("status") != Some(&status) {
                let mut rewritten = (*existing).clone();
                rewritten["status"] = status;
                update(s, k.snapshot_content, rewritten, Target::Status);
            }
            continue;
        }
        let volume_handle = str_at(info, "/volumeHandle");
        let pv = s
            .all(k.pv)
            .find(|pv| str_at(pv, "/spec/csi/volumeHandle") == volume_handle)
            .map(|pv| (**pv).clone());
        let claim = pv
            .as_ref()
            .map(|pv| str_at(pv, "/spec/claimRef/name").to_string())
            .unwrap_or_default();
        let snapshot = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": member, "namespace": ns,
                "finalizers": [IN_GROUP_FINALIZER],
                "ownerReferences": [{"apiVersion": API_VERSION, "kind": "VolumeGroupSnapshot",
                    "name": str_at(group, "/metadata/name"), "uid": group_uid}]},
            "spec": {"source": {"persistentVolumeClaimName": claim}},
        });
        let Ok(snapshot) = s.create(k.snapshot, &ns, snapshot, false) else {
            continue;
        };
        let mut annotations = json!({GROUP_HANDLE: group_handle});
        let secret = (
            content.pointer(&format!(
                "/metadata/annotations/{}",
                GROUP_SECRET_NAME.replace('/', "~1")
            )),
            content.pointer(&format!(
                "/metadata/annotations/{}",
                GROUP_SECRET_NAMESPACE.replace('/', "~1")
            )),
        );
        if let (Some(name), Some(namespace)) = secret {
            annotations[SECRET_NAME] = name.clone();
            annotations[SECRET_NAMESPACE] = namespace.clone();
        }
        let mut spec = json!({
            "volumeSnapshotRef": {"kind": "VolumeSnapshot", "name": member, "namespace": ns,
                "uid": str_at(&snapshot, "/metadata/uid")},
            "deletionPolicy": str_at(content, "/spec/deletionPolicy"),
            "driver": str_at(content, "/spec/driver"),
            "source": {"volumeHandle": volume_handle},
        });
        if let Some(mode) = pv.as_ref().and_then(|pv| pv.pointer("/spec/volumeMode")) {
            spec["sourceVolumeMode"] = mode.clone();
        }
        let created = s.create(
            k.snapshot_content,
            "",
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                "metadata": {"name": member_content, "annotations": annotations}, "spec": spec}),
            false,
        );
        let Ok(created) = created else {
            continue;
        };
        let mut with_status = (*created).clone();
        with_status["status"] = member_status(info);
        update(s, k.snapshot_content, with_status, Target::Status);
        let mut bound = (*snapshot).clone();
        bound["status"] = json!({"boundVolumeSnapshotContentName": member_content});
        update(s, k.snapshot, bound, Target::Status);
    }
}

pub(super) fn sync_all(s: &mut Store, k: GroupKinds) {
    let groups: Vec<_> = s.all(k.group).map(|v| key_of(v)).collect();
    for (ns, name) in groups {
        sync_group(s, k, &ns, &name);
    }
}

/// Handles an event of a group kind; `false` when the event is of another kind.
pub(super) fn on_event(s: &mut Store, k: GroupKinds, ev: &WatchEvent) -> bool {
    if ev.kind == k.group {
        if ev.etype != EventType::Deleted {
            let (ns, name) = key_of(&ev.object);
            sync_group(s, k, &ns, &name);
        }
    } else if ev.kind == k.content {
        let ns = str_at(&ev.object, "/spec/volumeGroupSnapshotRef/namespace").to_string();
        let name = str_at(&ev.object, "/spec/volumeGroupSnapshotRef/name").to_string();
        sync_group(s, k, &ns, &name);
    } else if ev.kind == k.class {
        sync_all(s, k);
    } else {
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_templates_take_the_group_and_content_names() {
        let group = json!({"metadata": {"name": "g", "namespace": "ns"}});
        assert_eq!(
            resolve("${volumegroupsnapshot.namespace}-${volumegroupsnapshot.name}-${volumegroupsnapshotcontent.name}", "c", &group)
                .as_deref(),
            Some("ns-g-c")
        );
        assert_eq!(resolve("${pvc.name}", "c", &group), None);
    }

    #[test]
    fn the_selector_picks_claims_by_label() {
        let claim = json!({"metadata": {"labels": {"app.kubernetes.io/name": "db"}}});
        let selector = json!({"matchLabels": {"app.kubernetes.io/name": "db"}});
        assert!(matches_selector(&claim, Some(&selector)));
        assert!(!matches_selector(
            &claim,
            Some(&json!({"matchLabels": {"app.kubernetes.io/name": "web"}}))
        ));
        assert!(!matches_selector(&claim, None));
    }
}
