//! A minimal snapshot-controller (external-snapshotter's cluster-wide common controller, which
//! stays upstream's in a real cluster), doing what it does around the sidecar in the flows the
//! tests take: for a VolumeSnapshot of a bound claim it puts `pvc-as-source-protection` on the
//! claim (kept while a snapshot of it is not ready, so the volume outlives its snapshots'
//! cutting) and creates the VolumeSnapshotContent `snapcontent-<uid>` (source volume handle,
//! class, deletion policy, driver, the deletion secret annotations resolved from the class),
//! binds pre-provisioned contents, adds the content's and the snapshot's finalizers, copies the
//! content's status to the snapshot, and on the snapshot's deletion marks the content
//! `volumesnapshot-being-deleted`, deletes it when its policy is Delete, and lets the snapshot go
//! once the content is gone.
//!
//! Group snapshots are in [`group_snapshot_controller`](super::group_snapshot_controller).
//! Left out: the default class by annotation, metrics and the snapshot's Events.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::group_snapshot_controller::{self as group, GroupKinds};
use super::registry::KindId;
use super::store::{EventType, Preconditions, Store, Target, WatchEvent, WatchFrom, key_of};

pub const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";
pub const BOUND_FINALIZER: &str = "snapshot.storage.kubernetes.io/volumesnapshot-bound-protection";
pub const AS_SOURCE_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshot-as-source-protection";
pub const PVC_FINALIZER: &str = "snapshot.storage.kubernetes.io/pvc-as-source-protection";
pub const BEING_DELETED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted";
pub const SECRET_NAME: &str = "snapshot.storage.kubernetes.io/deletion-secret-name";
pub const SECRET_NAMESPACE: &str = "snapshot.storage.kubernetes.io/deletion-secret-namespace";
const CLASS_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-secret-name";
const CLASS_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-secret-namespace";

#[derive(Clone, Copy)]
struct Kinds {
    snapshot: KindId,
    content: KindId,
    class: KindId,
    pvc: KindId,
    pv: KindId,
    groups: GroupKinds,
}

pub(super) fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

pub(super) fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(f)))
}

pub(super) fn being_deleted(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

pub(super) fn with_finalizers(obj: &Value, add: &[&str], remove: &[&str]) -> Option<Value> {
    let mut list: Vec<Value> = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let before = list.clone();
    list.retain(|f| !remove.iter().any(|r| f.as_str() == Some(r)));
    for f in add {
        if !list.iter().any(|x| x.as_str() == Some(f)) {
            list.push(json!(f));
        }
    }
    (list != before).then(|| {
        let mut changed = obj.clone();
        changed["metadata"]["finalizers"] = Value::Array(list);
        changed
    })
}

/// `${volumesnapshotcontent.name}`, `${volumesnapshot.namespace}`, `${volumesnapshot.name}`
/// in a secret template; `None` when it names anything else.
fn resolve(template: &str, content: &str, snapshot: &Value) -> Option<String> {
    let mut out = template
        .replace("${volumesnapshotcontent.name}", content)
        .replace(
            "${volumesnapshot.namespace}",
            str_at(snapshot, "/metadata/namespace"),
        )
        .replace("${volumesnapshot.name}", str_at(snapshot, "/metadata/name"));
    if out.contains('$') {
        return None;
    }
    out.shrink_to_fit();
    Some(out)
}

pub(super) fn update(s: &mut Store, kind: KindId, obj: Value, target: Target) {
    let (ns, name) = key_of(&obj);
    if let Err(e) = s.update(kind, &ns, &name, obj, target, false) {
        tracing::debug!(error = %e, "snapshot controller write");
    }
}

/// The snapshot's status from its content's, as the controller copies it.
fn status_from(content: &Value, current: Option<&Value>) -> Value {
    let mut status = current
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_else(Map::new);
    status.insert(
        "boundVolumeSnapshotContentName".into(),
        json!(str_at(content, "/metadata/name")),
    );
    let cs = content.get("status");
    let ready = cs
        .and_then(|s| s.get("readyToUse"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    status.insert("readyToUse".into(), json!(ready));
    if let Some(ns) = cs
        .and_then(|s| s.get("creationTime"))
        .and_then(Value::as_i64)
    {
        let time = k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns))
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_default();
        status.insert("creationTime".into(), json!(time));
    }
    if let Some(size) = cs
        .and_then(|s| s.get("restoreSize"))
        .and_then(Value::as_i64)
    {
        status.insert(
            "restoreSize".into(),
            json!(super::quantity::Quantity::binary(size).canonical()),
        );
    }
    match cs.and_then(|s| s.get("error")).filter(|e| !e.is_null()) {
        Some(error) => status.insert("error".into(), error.clone()),
        None => status.remove("error"),
    };
    Value::Object(status)
}

/// Removes the claim's `pvc-as-source-protection` once no snapshot of it is still unready.
fn release_claim(s: &mut Store, k: Kinds, ns: &str, claim: &str) {
    let Ok(pvc) = s.get(k.pvc, ns, claim) else {
        return;
    };
    if !has_finalizer(&pvc, PVC_FINALIZER) {
        return;
    }
    let in_use = s.all(k.snapshot).any(|snap| {
        str_at(snap, "/metadata/namespace") == ns
            && str_at(snap, "/spec/source/persistentVolumeClaimName") == claim
            && snap.pointer("/status/readyToUse") != Some(&json!(true))
    });
    if !in_use && let Some(changed) = with_finalizers(&pvc, &[], &[PVC_FINALIZER]) {
        update(s, k.pvc, changed, Target::Main);
    }
}

fn sync_snapshot(s: &mut Store, k: Kinds, ns: &str, name: &str) {
    let Ok(snapshot) = s.get(k.snapshot, ns, name) else {
        return;
    };
    let source_claim = str_at(&snapshot, "/spec/source/persistentVolumeClaimName").to_string();
    if !source_claim.is_empty() {
        release_claim(s, k, ns, &source_claim);
    }
    let uid = str_at(&snapshot, "/metadata/uid").to_string();
    let pre_provisioned = str_at(&snapshot, "/spec/source/volumeSnapshotContentName").to_string();
    // A group's member is bound to its content when it is created.
    let bound_to = str_at(&snapshot, "/status/boundVolumeSnapshotContentName").to_string();
    let dynamic = pre_provisioned.is_empty() && bound_to.is_empty();
    let content_name = if !pre_provisioned.is_empty() {
        pre_provisioned.clone()
    } else if !bound_to.is_empty() {
        bound_to
    } else {
        format!("snapcontent-{uid}")
    };
    let content = s.get(k.content, "", &content_name).ok();
    let bound_back = content.as_ref().is_some_and(|c| {
        str_at(c, "/spec/volumeSnapshotRef/namespace") == ns
            && str_at(c, "/spec/volumeSnapshotRef/name") == name
            && matches!(str_at(c, "/spec/volumeSnapshotRef/uid"), u if u.is_empty() || u == uid)
    });

    if being_deleted(&snapshot) {
        let content = content.filter(|_| bound_back);
        let delete_content = content
            .as_ref()
            .is_some_and(|c| str_at(c, "/spec/deletionPolicy") == "Delete");
        if let Some(content) = &content {
            if str_at(
                content,
                &format!("/metadata/annotations/{}", BEING_DELETED.replace('/', "~1")),
            ) != "yes"
            {
                let mut marked = (**content).clone();
                if !marked
                    .pointer("/metadata/annotations")
                    .is_some_and(Value::is_object)
                {
                    marked["metadata"]["annotations"] = json!({});
                }
                marked["metadata"]["annotations"][BEING_DELETED] = json!("yes");
                update(s, k.content, marked, Target::Main);
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
        let keep_bound = content.is_some() && delete_content;
        let remove: &[&str] = if keep_bound {
            &[AS_SOURCE_FINALIZER]
        } else {
            &[AS_SOURCE_FINALIZER, BOUND_FINALIZER]
        };
        if let Some(changed) = with_finalizers(&snapshot, &[], remove) {
            update(s, k.snapshot, changed, Target::Main);
        }
        return;
    }

    if let Some(changed) = with_finalizers(&snapshot, &[AS_SOURCE_FINALIZER, BOUND_FINALIZER], &[])
    {
        update(s, k.snapshot, changed, Target::Main);
    }
    let content = match content {
        Some(content) if bound_back => content,
        Some(_) => return,
        None if !dynamic => return,
        None => match create_content(s, k, &snapshot, &content_name) {
            Some(content) => content,
            None => return,
        },
    };
    if str_at(&content, "/spec/volumeSnapshotRef/uid").is_empty() {
        let mut bound = (*content).clone();
        bound["spec"]["volumeSnapshotRef"]["uid"] = json!(uid);
        update(s, k.content, bound, Target::Main);
    }
    let Ok(snapshot) = s.get(k.snapshot, ns, name) else {
        return;
    };
    let Ok(content) = s.get(k.content, "", &content_name) else {
        return;
    };
    let status = status_from(&content, snapshot.get("status"));
    if snapshot.get("status") != Some(&status) {
        let mut updated = (*snapshot).clone();
        updated["status"] = status;
        update(s, k.snapshot, updated, Target::Status);
    }
}

fn create_content(s: &mut Store, k: Kinds, snapshot: &Value, name: &str) -> Option<Arc<Value>> {
    let ns = str_at(snapshot, "/metadata/namespace");
    let class = s
        .get(
            k.class,
            "",
            str_at(snapshot, "/spec/volumeSnapshotClassName"),
        )
        .ok()?;
    let claim = s
        .get(
            k.pvc,
            ns,
            str_at(snapshot, "/spec/source/persistentVolumeClaimName"),
        )
        .ok()?;
    // The claim is held until the snapshot is cut; one being deleted is not snapshotted.
    if being_deleted(&claim) {
        return None;
    }
    if let Some(held) = with_finalizers(&claim, &[PVC_FINALIZER], &[]) {
        update(s, k.pvc, held, Target::Main);
    }
    let volume = s.get(k.pv, "", str_at(&claim, "/spec/volumeName")).ok()?;
    let handle = str_at(&volume, "/spec/csi/volumeHandle");
    if handle.is_empty() {
        return None;
    }
    let mut content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "volumeSnapshotRef": {
                "kind": "VolumeSnapshot", "apiVersion": "snapshot.storage.k8s.io/v1",
                "namespace": ns, "name": str_at(snapshot, "/metadata/name"),
                "uid": str_at(snapshot, "/metadata/uid"),
                "resourceVersion": str_at(snapshot, "/metadata/resourceVersion"),
            },
            "source": {"volumeHandle": handle},
            "volumeSnapshotClassName": str_at(&class, "/metadata/name"),
            "deletionPolicy": str_at(&class, "/deletionPolicy"),
            "driver": str_at(&class, "/driver"),
        }
    });
    if let Some(mode) = volume.pointer("/spec/volumeMode").filter(|m| !m.is_null()) {
        content["spec"]["sourceVolumeMode"] = mode.clone();
    }
    let params = class.get("parameters");
    let param = |key: &str| params.and_then(|p| p.get(key)).and_then(Value::as_str);
    if let (Some(name_t), Some(ns_t)) = (param(CLASS_SECRET_NAME), param(CLASS_SECRET_NAMESPACE)) {
        let (Some(secret), Some(secret_ns)) = (
            resolve(name_t, name, snapshot),
            resolve(ns_t, name, snapshot),
        ) else {
            return None;
        };
        content["metadata"]["annotations"] =
            json!({SECRET_NAME: secret, SECRET_NAMESPACE: secret_ns});
    }
    match s.create(k.content, "", content, false) {
        Ok(created) => Some(created),
        Err(e) => {
            tracing::debug!(error = %e, "snapshot controller content create");
            s.get(k.content, "", name).ok()
        }
    }
}

/// The content side: the finalizer of a bound content, and its snapshot's sync.
fn sync_content(s: &mut Store, k: Kinds, name: &str) {
    let Ok(content) = s.get(k.content, "", name) else {
        return;
    };
    if str_at(&content, "/spec/volumeSnapshotRef/uid").is_empty() {
        return;
    }
    if !being_deleted(&content)
        && !has_finalizer(&content, CONTENT_FINALIZER)
        && let Some(changed) = with_finalizers(&content, &[CONTENT_FINALIZER], &[])
    {
        update(s, k.content, changed, Target::Main);
    }
    let ns = str_at(&content, "/spec/volumeSnapshotRef/namespace").to_string();
    let snapshot = str_at(&content, "/spec/volumeSnapshotRef/name").to_string();
    sync_snapshot(s, k, &ns, &snapshot);
}

fn sync_all(s: &mut Store, k: Kinds) {
    group::sync_all(s, k.groups);
    let held: Vec<_> = s
        .all(k.pvc)
        .filter(|c| has_finalizer(c, PVC_FINALIZER))
        .map(|c| key_of(c))
        .collect();
    for (ns, claim) in held {
        release_claim(s, k, &ns, &claim);
    }
    let snapshots: Vec<_> = s.all(k.snapshot).map(|v| key_of(v)).collect();
    for (ns, name) in snapshots {
        sync_snapshot(s, k, &ns, &name);
    }
    let contents: Vec<_> = s.all(k.content).map(|v| key_of(v).1).collect();
    for name in contents {
        sync_content(s, k, &name);
    }
}

/// The VolumeSnapshots of each source claim, by namespace and claim: a claim's or volume's
/// event concerns those only, and a look through every snapshot for each such event made
/// a cluster with many snapshots slow to provision in (10 000 snapshots: seconds a claim).
#[derive(Default)]
struct BySource(HashMap<(String, String), BTreeSet<String>>);

impl BySource {
    fn of(s: &Store, k: Kinds) -> Self {
        let mut index = Self::default();
        for snapshot in s.all(k.snapshot) {
            index.saw(snapshot, true);
        }
        index
    }

    /// Notes `snapshot` (`present`) or its deletion.
    fn saw(&mut self, snapshot: &Value, present: bool) {
        let claim = str_at(snapshot, "/spec/source/persistentVolumeClaimName");
        if claim.is_empty() {
            return;
        }
        let (ns, name) = key_of(snapshot);
        let key = (ns, claim.to_string());
        if present {
            self.0.entry(key).or_default().insert(name);
        } else if let Some(names) = self.0.get_mut(&key) {
            names.remove(&name);
            if names.is_empty() {
                self.0.remove(&key);
            }
        }
    }

    fn snapshots_of(&self, ns: &str, claim: &str) -> Vec<String> {
        self.0
            .get(&(ns.to_string(), claim.to_string()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn on_event(s: &mut Store, k: Kinds, by_source: &mut BySource, ev: &WatchEvent) {
    if ev.kind == k.snapshot {
        by_source.saw(&ev.object, ev.etype != EventType::Deleted);
    }
    if group::on_event(s, k.groups, ev) {
        return;
    }
    let (ns, name) = key_of(&ev.object);
    if ev.kind == k.snapshot {
        if ev.etype == EventType::Deleted {
            let claim = str_at(&ev.object, "/spec/source/persistentVolumeClaimName").to_string();
            release_claim(s, k, &ns, &claim);
        } else {
            sync_snapshot(s, k, &ns, &name);
        }
    } else if ev.kind == k.content {
        let snapshot_ns = str_at(&ev.object, "/spec/volumeSnapshotRef/namespace").to_string();
        let snapshot = str_at(&ev.object, "/spec/volumeSnapshotRef/name").to_string();
        if ev.etype == EventType::Deleted {
            sync_snapshot(s, k, &snapshot_ns, &snapshot);
        } else {
            sync_content(s, k, &name);
        }
    } else if ev.kind == k.pvc || ev.kind == k.pv {
        // A claim or its volume concerns that claim's snapshots and the groups only: a full
        // sync per event would make filling a cluster quadratic.
        let (ns, claim) = if ev.kind == k.pvc {
            (ns, name)
        } else {
            (
                str_at(&ev.object, "/spec/claimRef/namespace").to_string(),
                str_at(&ev.object, "/spec/claimRef/name").to_string(),
            )
        };
        group::sync_all(s, k.groups);
        if !claim.is_empty() {
            release_claim(s, k, &ns, &claim);
            for name in by_source.snapshots_of(&ns, &claim) {
                sync_snapshot(s, k, &ns, &name);
            }
        }
    } else {
        sync_all(s, k);
    }
}

/// Runs the controller until `shutdown`; re-subscribes (with a full resync) whenever its
/// watches are closed.
pub(crate) async fn run(store: Arc<Mutex<Store>>, shutdown: CancellationToken) {
    let lock = || store.lock().unwrap_or_else(PoisonError::into_inner);
    let kinds = {
        let s = lock();
        let r = s.registry();
        let group = |plural| r.lookup("groupsnapshot.storage.k8s.io", "v1", plural);
        match (
            r.lookup("snapshot.storage.k8s.io", "v1", "volumesnapshots"),
            r.lookup("snapshot.storage.k8s.io", "v1", "volumesnapshotcontents"),
            r.lookup("snapshot.storage.k8s.io", "v1", "volumesnapshotclasses"),
            r.core("persistentvolumeclaims"),
            r.core("persistentvolumes"),
            (
                group("volumegroupsnapshots"),
                group("volumegroupsnapshotcontents"),
                group("volumegroupsnapshotclasses"),
            ),
        ) {
            (
                Some(snapshot),
                Some(content),
                Some(class),
                Some(pvc),
                Some(pv),
                (Some(group), Some(group_content), Some(group_class)),
            ) => Kinds {
                snapshot,
                content,
                class,
                pvc,
                pv,
                groups: GroupKinds {
                    group,
                    content: group_content,
                    class: group_class,
                    snapshot,
                    snapshot_content: content,
                    pvc,
                    pv,
                },
            },
            _ => return,
        }
    };
    loop {
        let subscribed = {
            let mut s = lock();
            let subs = (
                s.watch(kinds.snapshot, WatchFrom::Current),
                s.watch(kinds.content, WatchFrom::Current),
                s.watch(kinds.class, WatchFrom::Current),
                s.watch(kinds.pvc, WatchFrom::Current),
                s.watch(kinds.pv, WatchFrom::Current),
                s.watch(kinds.groups.group, WatchFrom::Current),
                s.watch(kinds.groups.content, WatchFrom::Current),
                s.watch(kinds.groups.class, WatchFrom::Current),
            );
            sync_all(&mut s, kinds);
            (subs, BySource::of(&s, kinds))
        };
        let (subscribed, mut by_source) = subscribed;
        let (
            Ok(mut snapshots),
            Ok(mut contents),
            Ok(mut classes),
            Ok(mut pvcs),
            Ok(mut pvs),
            Ok(mut groups),
            Ok(mut group_contents),
            Ok(mut group_classes),
        ) = subscribed
        else {
            return;
        };
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = snapshots.events.recv() => ev,
                ev = contents.events.recv() => ev,
                ev = classes.events.recv() => ev,
                ev = pvcs.events.recv() => ev,
                ev = pvs.events.recv() => ev,
                ev = groups.events.recv() => ev,
                ev = group_contents.events.recv() => ev,
                ev = group_classes.events.recv() => ev,
            };
            let Some(ev) = ev else { break };
            on_event(&mut lock(), kinds, &mut by_source, &ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_templates_take_the_snapshot_and_content_names() {
        let snapshot = json!({"metadata": {"name": "snap", "namespace": "ns"}});
        assert_eq!(
            resolve(
                "${volumesnapshot.namespace}-${volumesnapshot.name}",
                "c",
                &snapshot
            )
            .as_deref(),
            Some("ns-snap")
        );
        assert_eq!(
            resolve("${volumesnapshotcontent.name}", "c", &snapshot).as_deref(),
            Some("c")
        );
        assert_eq!(resolve("${pvc.name}", "c", &snapshot), None);
    }

    #[test]
    fn the_snapshot_status_follows_its_content() {
        let content = json!({"metadata": {"name": "c"}, "status": {"readyToUse": true,
            "creationTime": 1_700_000_000_000_000_000_i64, "restoreSize": 1024}});
        let status = status_from(&content, Some(&json!({"error": {"message": "old"}})));
        assert_eq!(
            status,
            json!({"boundVolumeSnapshotContentName": "c", "readyToUse": true,
                "creationTime": "2023-11-14T22:13:20Z", "restoreSize": "1Ki"})
        );
    }

    #[test]
    fn finalizers_are_added_and_removed_once() {
        let obj = json!({"metadata": {"finalizers": ["a"]}});
        let added = with_finalizers(&obj, &["b"], &[]).unwrap();
        assert_eq!(added["metadata"]["finalizers"], json!(["a", "b"]));
        assert!(with_finalizers(&added, &["b"], &[]).is_none());
        let removed = with_finalizers(&added, &[], &["a"]).unwrap();
        assert_eq!(removed["metadata"]["finalizers"], json!(["b"]));
    }
}
