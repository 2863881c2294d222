//! Pure decisions: which contents are this driver's, what a content needs next, the names,
//! parameters and secrets of the driver calls, the status a driver answer leads to, and which
//! driver errors are final. No I/O; the controller carries the plans out.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use sidecar_kit::values::atom::{Atom, List};
use sidecar_kit::values::names::{self, SecretKeys};
use sidecar_kit::values::version::ResourceVersion;
use tonic::Code;

use crate::model::{
    self, Class, Content, ContentObject, ContentStatus, GroupContent, GroupContentStatus,
    SecretAnnotations, SecretRef, Settled, SnapshotInfo,
};

const PREFIX: &str = "csi.storage.k8s.io/";
pub const LIST_SECRET_NAME: &str = "csi.storage.k8s.io/snapshotter-list-secret-name";
pub const LIST_SECRET_NAMESPACE: &str = "csi.storage.k8s.io/snapshotter-list-secret-namespace";
/// The class keys the snapshotter (or the snapshot-controller) reads; never passed to the driver.
const RESERVED: [&str; 8] = [
    "csi.storage.k8s.io/snapshotter-secret-name",
    "csi.storage.k8s.io/snapshotter-secret-namespace",
    LIST_SECRET_NAME,
    LIST_SECRET_NAMESPACE,
    "csi.storage.k8s.io/group-snapshotter-get-secret-name",
    "csi.storage.k8s.io/group-snapshotter-get-secret-namespace",
    "csi.storage.k8s.io/group-snapshotter-secret-name",
    "csi.storage.k8s.io/group-snapshotter-secret-namespace",
];
pub const GROUP_GET_SECRET_NAME: &str = "csi.storage.k8s.io/group-snapshotter-get-secret-name";
pub const GROUP_GET_SECRET_NAMESPACE: &str =
    "csi.storage.k8s.io/group-snapshotter-get-secret-namespace";
pub const GROUP_NAME_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshot/name";
pub const GROUP_NAMESPACE_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshot/namespace";
pub const GROUP_CONTENT_NAME_KEY: &str = "csi.storage.k8s.io/volumegroupsnapshotcontent/name";
pub const SNAPSHOT_NAME_KEY: &str = "csi.storage.k8s.io/volumesnapshot/name";
pub const SNAPSHOT_NAMESPACE_KEY: &str = "csi.storage.k8s.io/volumesnapshot/namespace";
pub const CONTENT_NAME_KEY: &str = "csi.storage.k8s.io/volumesnapshotcontent/name";

/// Event reasons, as upstream's.
pub const CREATION_FAILED: &str = "SnapshotCreationFailed";
pub const CHECK_FAILED: &str = "SnapshotContentCheckandUpdateFailed";
pub const DELETE_ERROR: &str = "SnapshotDeleteError";
pub const GROUP_CREATION_FAILED: &str = "GroupSnapshotCreationFailed";
pub const GROUP_CHECK_FAILED: &str = "GroupSnapshotContentCheckandUpdateFailed";
pub const GROUP_DELETE_ERROR: &str = "GroupSnapshotDeleteError";

/// Whether the content is this driver's (upstream's `isDriverMatch`): it names a source, this
/// driver, and a class of this driver if its class exists.
pub fn driver_match(content: &impl ContentObject, class: Option<&Class>, driver: &str) -> bool {
    content.has_source() && content.driver() == driver && class.is_none_or(|c| c.driver == driver)
}

/// Whether a change of a content is one to act on (upstream's `ShouldEnqueueContentChange`):
/// not when only its status, its finalizers or the snapshotter's own annotation changed, except
/// that becoming ready is (a deletion requested while the snapshot was cut waits for it), and
/// so is a group member's first status.
/// Upstream also acts on every informer resync; ours come from the controller's resync timer.
pub fn should_enqueue(old: &Content, new: &Content) -> bool {
    if !old.ready() && new.ready() {
        return true;
    }
    // Readiness lost without this sidecar's write (the snapshot-controller rewrites a member's
    // status from its group's list while the group is not ready): read it again.
    if old.ready() && !new.ready() {
        return true;
    }
    // A group member's status is written by the snapshot-controller, not by this sidecar: once
    // it is there, a member not ready yet is to be read (upstream waits for the resync).
    if new.group_member && old.status.is_none() && new.status.is_some() {
        return true;
    }
    unchanging(old) != unchanging(new)
}

/// What of a content a change to act on compares: all but its version, its status, its
/// finalizers and the snapshotter's own annotation.
fn unchanging(content: &Content) -> Content {
    Content {
        resource_version: ResourceVersion::None,
        status: None,
        finalizers: List::default(),
        being_created: false,
        ..content.clone()
    }
}

/// The fingerprint of what [`should_enqueue`] compares.
pub fn change_key(content: &Content) -> u64 {
    model::keyed_hash(&unchanging(content))
}

/// Whether `content` needs nothing more until it changes: its snapshot cut and ready, no
/// deletion asked for, no create call to be answered. Its plan is [`Plan::Ready`] with
/// nothing left to do.
pub fn settled(content: &Content) -> bool {
    content.ready() && !content.deleting && !content.being_created
}

/// [`should_enqueue`] of a change from a content kept in its [`Settled`] form: it was ready,
/// so losing readiness is work, and so is any change of what [`should_enqueue`] compares.
pub fn should_enqueue_settled(old: &Settled, new: &Content) -> bool {
    !new.ready() || old.change != change_key(new)
}

/// Whether the content is to be deleted now (upstream's `shouldDelete`, and
/// `shouldDeleteGroupSnapshotContent` by the same rules): it is being deleted, and it is an
/// unbound pre-provisioned content, or its VolumeSnapshot (VolumeGroupSnapshot) is being
/// deleted and no create call is unanswered.
pub fn should_delete(content: &impl ContentObject) -> bool {
    if !content.deleting() {
        return false;
    }
    if content.pre_provisioned() && content.source_uid().is_empty() {
        return true;
    }
    !content.being_created() && content.being_deleted()
}

/// What a content needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// DeleteSnapshot of `handle` when given (deletion policy `Delete`, not a group member),
    /// then the finalizer goes.
    Delete { handle: Option<String> },
    /// CreateSnapshot: first for a dynamic content, and again to learn whether it is ready when
    /// the driver has no ListSnapshots (CreateSnapshot is idempotent), as upstream.
    Create,
    /// ListSnapshots of a pre-provisioned snapshot, of a group member's, or of a cut snapshot
    /// not ready yet when the driver lists snapshots: a read, where CreateSnapshot again would
    /// need the being-created annotation written and removed around every poll (and upstream's
    /// polls flood drivers with creation calls, external-snapshotter #223, #465, #624, #953).
    Check { handle: String },
    /// Ready: at most a leftover being-created annotation to remove.
    Ready,
    /// A group member the group's controller has not filled yet.
    Nothing,
}

/// What `content` needs next; `list_snapshots`: the driver has LIST_SNAPSHOTS.
pub fn plan(content: &Content, list_snapshots: bool) -> Plan {
    if should_delete(content) {
        let member = content
            .status
            .as_ref()
            .is_some_and(|s| s.volume_group_snapshot_handle.is_some());
        let handle = content
            .status
            .as_ref()
            .and_then(|s| s.snapshot_handle.as_deref().map(String::from))
            .filter(|_| content.deletion_policy == "Delete" && !member);
        return Plan::Delete { handle };
    }
    if content.volume_handle.is_some() && content.status.is_none() && !content.group_member {
        return Plan::Create;
    }
    if content.ready() {
        return Plan::Ready;
    }
    let status_handle = content.status.as_ref().and_then(|s| {
        s.volume_group_snapshot_handle
            .as_ref()
            .and(s.snapshot_handle.as_deref())
    });
    if let Some(handle) = content.snapshot_handle_source.as_deref().or(status_handle) {
        return Plan::Check {
            handle: handle.into(),
        };
    }
    let cut = content
        .status
        .as_ref()
        .and_then(|s| s.snapshot_handle.as_deref());
    if let Some(handle) = cut.filter(|_| list_snapshots && !content.group_member) {
        return Plan::Check {
            handle: handle.into(),
        };
    }
    if content.group_member {
        Plan::Nothing
    } else {
        Plan::Create
    }
}

/// The name of the snapshot asked of the driver: `<prefix>-<VolumeSnapshot UID>`.
pub fn snapshot_name(prefix: &str, snapshot_uid: &str, length: i32) -> Result<String, String> {
    if snapshot_uid.is_empty() {
        return Err("Corrupted snapshot object, it is missing UID".into());
    }
    Ok(sidecar_kit::values::names::uid_name(
        prefix,
        snapshot_uid,
        length,
    ))
}

/// The class parameters passed to CreateSnapshot: all but the reserved `csi.storage.k8s.io/`
/// keys; any other key of that prefix is refused, as upstream refuses it.
pub fn driver_parameters(
    params: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (key, value) in params {
        if key.starts_with(PREFIX) {
            if !RESERVED.contains(&key.as_str()) {
                return Err(format!(
                    "found unknown parameter key \"{key}\" with reserved namespace {PREFIX}"
                ));
            }
        } else {
            out.insert(key.clone(), value.clone());
        }
    }
    Ok(out)
}

/// The secret of CreateSnapshot and DeleteSnapshot, from the content's annotations.
pub fn content_secret(content: &Content) -> Result<Option<SecretRef>, String> {
    annotated_secret(&content.secret, "snapshot content", &content.name)
}

/// The secret of the group calls, from the group content's annotations.
pub fn group_secret(content: &GroupContent) -> Result<Option<SecretRef>, String> {
    annotated_secret(&content.secret, "group snapshot content", &content.name)
}

fn annotated_secret(
    secret: &SecretAnnotations,
    what: &str,
    name: &str,
) -> Result<Option<SecretRef>, String> {
    match secret {
        SecretAnnotations::None => Ok(None),
        SecretAnnotations::Given(given) if given.name.is_empty() || given.namespace.is_empty() => {
            Err(format!(
                "cannot retrieve secrets for {what} {name:?}, err: secret name or namespace not specified"
            ))
        }
        SecretAnnotations::Given(given) => Ok(Some(SecretRef::clone(given))),
    }
}

/// The secret of ListSnapshots, from the class's `snapshotter-list-secret-*` keys: templates
/// that may name only `${volumesnapshotcontent.name}`.
pub fn list_secret(
    params: &BTreeMap<String, String>,
    content_name: &str,
) -> Result<Option<SecretRef>, String> {
    class_secret(
        params,
        ("SnapshotterList", LIST_SECRET_NAME, LIST_SECRET_NAMESPACE),
        ("volumesnapshotcontent.name", content_name),
    )
}

/// The secret of GetVolumeGroupSnapshot, from the group class's
/// `group-snapshotter-get-secret-*` keys: templates that may name only
/// `${volumegroupsnapshotcontent.name}`.
pub fn group_get_secret(
    params: &BTreeMap<String, String>,
    content_name: &str,
) -> Result<Option<SecretRef>, String> {
    class_secret(
        params,
        (
            "GroupSnapshotterGet",
            GROUP_GET_SECRET_NAME,
            GROUP_GET_SECRET_NAMESPACE,
        ),
        ("volumegroupsnapshotcontent.name", content_name),
    )
}

/// A secret named by a class's pair of template keys `(what, name key, namespace key)`,
/// resolved with the one variable `(name, value)`.
fn class_secret(
    params: &BTreeMap<String, String>,
    (what, name, namespace): (&str, &str, &str),
    (variable, value): (&str, &str),
) -> Result<Option<SecretRef>, String> {
    let vars = BTreeMap::from([(variable.to_string(), value.to_string())]);
    let keys = SecretKeys {
        what,
        name,
        namespace,
    };
    Ok(
        names::class_secret(params, keys, &vars, &vars)?.map(|secret| SecretRef {
            namespace: secret.namespace,
            name: secret.name,
        }),
    )
}

/// What the driver said of a snapshot (CreateSnapshot or ListSnapshots).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub handle: String,
    pub ready: bool,
    /// Unix nanoseconds; 0 when the driver gave none (then the time of the answer is used).
    pub creation_ns: i64,
    pub size: i64,
    pub group_handle: String,
}

/// The status patch (JSON merge, status subresource) an answer leads to, or `None` when the
/// status already says it: upstream's `updateSnapshotContentStatus`, which fills what is
/// missing, follows `readyToUse`, and clears the error once ready.
pub fn status_patch(
    current: Option<&ContentStatus>,
    answer: &Answer,
    now_ns: i64,
) -> Option<Value> {
    let created = if answer.creation_ns == 0 {
        now_ns
    } else {
        answer.creation_ns
    };
    let mut status = serde_json::Map::new();
    match current {
        None => {
            status.insert("snapshotHandle".into(), json!(answer.handle));
            status.insert("readyToUse".into(), json!(answer.ready));
            status.insert("creationTime".into(), json!(created));
            if !answer.group_handle.is_empty() {
                status.insert(
                    "volumeGroupSnapshotHandle".into(),
                    json!(answer.group_handle),
                );
            }
            if answer.size > 0 {
                status.insert("restoreSize".into(), json!(answer.size));
            }
        }
        Some(current) => {
            if current.snapshot_handle.is_none() {
                status.insert("snapshotHandle".into(), json!(answer.handle));
            }
            if current.ready_to_use != Some(answer.ready) {
                status.insert("readyToUse".into(), json!(answer.ready));
                if answer.ready && current.error.is_some() {
                    status.insert("error".into(), Value::Null);
                }
            }
            if current.creation_time.is_none() {
                status.insert("creationTime".into(), json!(created));
            }
            if current.restore_size.is_none() && answer.size > 0 {
                status.insert("restoreSize".into(), json!(answer.size));
            }
            if current.volume_group_snapshot_handle.is_none() && !answer.group_handle.is_empty() {
                status.insert(
                    "volumeGroupSnapshotHandle".into(),
                    json!(answer.group_handle),
                );
            }
        }
    }
    (!status.is_empty()).then(|| json!({ "status": status }))
}

/// The error status patch, or `None` when the status's error (`current`) already carries this
/// message (upstream writes each message once; the Event is emitted every time).
pub fn error_patch(current: Option<&str>, message: &str, now: &str) -> Option<Value> {
    (current != Some(message)).then(
        || json!({"status": {"readyToUse": false, "error": {"time": now, "message": message}}}),
    )
}

/// The patch that forgets the snapshot once the driver deleted it.
pub fn cleared_status_patch() -> Value {
    json!({"status": {"snapshotHandle": null, "readyToUse": null, "creationTime": null, "restoreSize": null}})
}

/// The JSON patch that removes the snapshotter's finalizer, tested in place so that a list
/// another writer changed meanwhile is not overwritten.
pub fn finalizer_removal(content: &Content) -> Option<Value> {
    removal_of(&content.finalizers, model::FINALIZER)
}

/// The same for a group content's finalizer.
pub fn group_finalizer_removal(content: &GroupContent) -> Option<Value> {
    removal_of(&content.finalizers, model::GROUP_FINALIZER)
}

fn removal_of(finalizers: &[Atom], finalizer: &str) -> Option<Value> {
    let at = finalizers.iter().position(|f| f == finalizer)?;
    let path = format!("/metadata/finalizers/{at}");
    Some(json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path}
    ]))
}

/// Whether a CreateSnapshot error says for sure that no snapshot is being cut (upstream's
/// `isCSIFinalError`); the others keep the being-created annotation, which holds the content's
/// deletion until the driver answers.
pub fn is_final(code: Option<Code>) -> bool {
    match code {
        None => false,
        Some(code) => !matches!(
            code,
            Code::Cancelled
                | Code::DeadlineExceeded
                | Code::Unavailable
                | Code::ResourceExhausted
                | Code::Aborted
        ),
    }
}

// --- group snapshots ---

/// What a group content needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupPlan {
    /// DeleteVolumeGroupSnapshot of `handle` when given (policy `Delete`), then the finalizer
    /// goes. Its members are never deleted one by one.
    Delete {
        handle: Option<String>,
        snapshot_ids: Vec<String>,
    },
    /// CreateVolumeGroupSnapshot (idempotent by name).
    Create,
    /// GetVolumeGroupSnapshot: a pre-provisioned group, or a cut group not ready yet (upstream
    /// cuts it again, and in v8.6 stops asking until the next resync, external-snapshotter
    /// #1457).
    Check {
        handle: String,
        snapshot_ids: Vec<String>,
    },
    /// Ready: at most a leftover being-created annotation to remove.
    Ready,
}

pub fn group_plan(content: &GroupContent) -> GroupPlan {
    if should_delete(content) {
        let handle = content
            .status
            .as_ref()
            .and_then(|s| s.volume_group_snapshot_handle.clone())
            .filter(|_| content.deletion_policy == "Delete");
        return GroupPlan::Delete {
            handle,
            snapshot_ids: content.snapshot_ids(),
        };
    }
    if !content.volume_handles.is_empty() && content.status.is_none() {
        return GroupPlan::Create;
    }
    if content.ready() {
        return GroupPlan::Ready;
    }
    if let Some(source) = &content.pre_provisioned {
        return GroupPlan::Check {
            handle: source.volume_group_snapshot_handle.clone(),
            snapshot_ids: source.volume_snapshot_handles.clone(),
        };
    }
    let snapshot_ids = content.snapshot_ids();
    match content.handle() {
        Some(handle) if !snapshot_ids.is_empty() => GroupPlan::Check {
            handle,
            snapshot_ids,
        },
        _ => GroupPlan::Create,
    }
}

/// The name of the group snapshot asked of the driver: `<prefix>-<VolumeGroupSnapshot UID>`.
pub fn group_snapshot_name(prefix: &str, group_uid: &str, length: i32) -> Result<String, String> {
    if group_uid.is_empty() {
        return Err("group snapshot object is missing UID".into());
    }
    Ok(sidecar_kit::values::names::uid_name(
        prefix, group_uid, length,
    ))
}

/// What the driver said of a group snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupAnswer {
    pub handle: String,
    pub ready: bool,
    /// Unix nanoseconds; 0 when the driver gave none (then the time of the answer is used).
    pub creation_ns: i64,
    pub members: Vec<SnapshotInfo>,
}

/// A time as the API server writes a `metav1.Time`.
pub fn rfc3339(ns: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(ns))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

/// The status patch a group answer leads to, or `None` when the status already says it
/// (upstream's `updateGroupSnapshotContentStatus`: what is missing is filled, `readyToUse`
/// follows the driver; the member list is written when a member's readiness changed, where
/// upstream writes it once).
pub fn group_status_patch(
    current: Option<&GroupContentStatus>,
    answer: &GroupAnswer,
    now_ns: i64,
) -> Option<Value> {
    let created = rfc3339(if answer.creation_ns == 0 {
        now_ns
    } else {
        answer.creation_ns
    });
    let mut status = serde_json::Map::new();
    let empty = GroupContentStatus::default();
    let fresh = current.is_none();
    let current = current.unwrap_or(&empty);
    if current.volume_group_snapshot_handle.is_none() {
        status.insert("volumeGroupSnapshotHandle".into(), json!(answer.handle));
    }
    if fresh || current.ready_to_use != Some(answer.ready) {
        status.insert("readyToUse".into(), json!(answer.ready));
        if answer.ready && current.error.is_some() {
            status.insert("error".into(), Value::Null);
        }
    }
    if current.creation_time.is_none() {
        status.insert("creationTime".into(), json!(created));
    }
    if !answer.members.is_empty()
        && (current.volume_snapshot_info_list.is_empty()
            || readiness_changed(&current.volume_snapshot_info_list, &answer.members))
    {
        status.insert("volumeSnapshotInfoList".into(), json!(answer.members));
    }
    (!status.is_empty()).then(|| json!({ "status": status }))
}

/// Whether a member's readiness in `answer` is not what `written` says. Upstream writes the
/// member list once, so a group that was not ready at its first answer keeps members "not
/// ready" in it; the snapshot-controller copies them into the members' contents while the
/// group is not ready, and a member could stay not ready for good.
fn readiness_changed(written: &[SnapshotInfo], answer: &[SnapshotInfo]) -> bool {
    answer.iter().any(|member| {
        written
            .iter()
            .find(|w| w.snapshot_handle == member.snapshot_handle)
            .is_none_or(|w| w.ready_to_use != member.ready_to_use)
    })
}

/// The patch that forgets the group snapshot once the driver deleted it.
pub fn cleared_group_status_patch() -> Value {
    json!({"status": {"volumeGroupSnapshotHandle": null, "readyToUse": null, "creationTime": null, "error": null}})
}

#[cfg(test)]
mod tests;
