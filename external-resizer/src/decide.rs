//! Pure decisions: whether a claim needs an expansion and to which size, which claim status
//! each step writes, how driver errors are classed, and the same for VolumeAttributesClass
//! changes. No I/O here.
//!
//! Claim status writes are strategic merge patches of the `status` subresource, as upstream's:
//! conditions merge by type, so a patch names only the conditions it sets or deletes and every
//! other condition of the claim stays as it is.

use std::time::Duration;

use serde_json::{Map, Value, json};
use tonic::Code;

use crate::model::{
    CONTROLLER_RESIZE_ERROR, Claim, FILE_SYSTEM_RESIZE_PENDING, MODIFY_VOLUME_ERROR,
    MODIFYING_VOLUME, NODE_EXPANSION_NOT_REQUIRED_ANNOTATION, PRE_RESIZE_CAPACITY_ANNOTATION, Pv,
    RESIZE_CONDITIONS, RESIZING, ResizeStatus, Size,
};

/// What the resizer is configured to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub driver: String,
    /// Gate `RecoverVolumeExpansionFailure`.
    pub recover: bool,
    /// Gate `AnnotateFsResize`.
    pub annotate_fs_resize: bool,
    /// The driver expands in the controller (ControllerExpandVolume); otherwise only its nodes
    /// do, and the controller step records the request without a call (upstream's "trivial
    /// resizer").
    pub controller_expansion: bool,
}

impl Policy {
    /// Whether this resizer expands `pv`, bound to `claim`: a CSI volume of this driver, or an
    /// in-tree volume migrated to it that kube-controller-manager handed to this driver.
    pub fn handles(&self, claim: &Claim, pv: &Pv) -> bool {
        let ours = !pv.in_tree || claim.resizer.as_deref() == Some(self.driver.as_str());
        ours && pv.bound_to(claim)
    }
}

/// A claim whose requested size is above its capacity, bound to a volume.
pub fn needs_resize(claim: &Claim) -> bool {
    if !claim.bound || claim.volume_name.is_none() {
        return false;
    }
    let capacity = claim.capacity.as_ref().map_or(0, |c| c.bytes);
    claim.request.as_ref().is_some_and(|r| r.bytes > capacity)
}

/// What the controller remembers of a claim beyond its objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// The last expansion failed with a final error: the user may now ask for another size,
    /// even a smaller one.
    pub final_error: bool,
    /// The last expansion was infeasible: the same size is tried again only after this.
    pub slow_retry: Option<Duration>,
}

/// The next step of an expansion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizePlan {
    /// Nothing to do (or the node's turn).
    Nothing,
    /// The same infeasible size again: wait before trying.
    Wait(Duration),
    /// Expand to `size`; `mark` is the status patch that records it first (none when the claim
    /// says so already).
    Expand { size: Size, mark: Option<Value> },
}

/// The size to expand to, per upstream's `expandAndRecover` (gate `RecoverVolumeExpansionFailure`
/// on): an expansion in flight is finished at the size it started with unless it failed for
/// good; a node step waits for the node; only then the user's current request counts.
fn recovery_size(policy: &Policy, claim: &Claim, pv: &Pv, memory: Memory) -> Option<Size> {
    let request = claim.request.clone()?;
    let allocated = claim.allocated.clone();
    let pv_bytes = pv.capacity.as_ref().map_or(0, |c| c.bytes);
    use ResizeStatus::*;
    if pv_bytes < request.bytes {
        match claim.resize_status {
            Some(NodeResizeInfeasible) => Some(allocated.unwrap_or(request)),
            Some(NodeResizePending | NodeResizeInProgress) => {
                let size = allocated.unwrap_or(request);
                // The volume has grown to that size already: the node finishes.
                (pv_bytes < size.bytes).then_some(size)
            }
            Some(ControllerResizeInProgress) if !memory.final_error => {
                Some(allocated.unwrap_or(request))
            }
            _ => Some(request),
        }
    } else {
        match claim.resize_status {
            Some(NodeResizePending | NodeResizeInProgress) => None,
            Some(NodeResizeInfeasible) => Some(match allocated {
                Some(size) if policy.controller_expansion => size,
                _ => request,
            }),
            Some(ControllerResizeInProgress | ControllerResizeInfeasible) => {
                Some(allocated.unwrap_or(request))
            }
            None => match allocated {
                Some(size) => Some(size),
                None if claim.has_true_condition(FILE_SYSTEM_RESIZE_PENDING) => None,
                None => Some(request),
            },
        }
    }
}

/// The next expansion step of `claim`, bound to `pv`, at time `now` (RFC 3339).
pub fn plan_resize(
    policy: &Policy,
    claim: &Claim,
    pv: &Pv,
    memory: Memory,
    now: &str,
) -> ResizePlan {
    if !needs_resize(claim) || !policy.handles(claim, pv) {
        return ResizePlan::Nothing;
    }
    if !policy.recover {
        return plan_legacy(claim, pv, now);
    }
    let Some(size) = recovery_size(policy, claim, pv, memory) else {
        return ResizePlan::Nothing;
    };
    let unchanged = claim
        .allocated
        .as_ref()
        .is_some_and(|a| a.bytes == size.bytes);
    if unchanged && let Some(wait) = memory.slow_retry {
        return ResizePlan::Wait(wait);
    }
    let mark = mark_in_progress(claim, &size, !unchanged, now);
    ResizePlan::Expand { size, mark }
}

/// Without `RecoverVolumeExpansionFailure`: always the request; a volume already that large
/// waits for the node when a file system resize is pending.
fn plan_legacy(claim: &Claim, pv: &Pv, now: &str) -> ResizePlan {
    let Some(request) = claim.request.clone() else {
        return ResizePlan::Nothing;
    };
    let pv_bytes = pv.capacity.as_ref().map_or(0, |c| c.bytes);
    if pv_bytes >= request.bytes && claim.has_true_condition(FILE_SYSTEM_RESIZE_PENDING) {
        return ResizePlan::Nothing;
    }
    let mut status = Map::new();
    let conditions = merge_conditions(claim, &[resizing(now)], false);
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    let mark = (!claim.has_true_condition(RESIZING) || conditions_to_drop(claim, &[RESIZING]))
        .then(|| claim_patch(claim, Some(status), None, true));
    ResizePlan::Expand {
        size: request,
        mark,
    }
}

fn resizing(now: &str) -> Value {
    json!({"type": RESIZING, "status": "True", "lastTransitionTime": now})
}

/// Whether setting the condition types `set` without keeping old resize conditions deletes any.
fn conditions_to_drop(claim: &Claim, set: &[&str]) -> bool {
    claim
        .conditions
        .iter()
        .any(|c| RESIZE_CONDITIONS.contains(&c.type_.as_str()) && !set.contains(&c.type_.as_str()))
}

/// Upstream's `MergeResizeConditionsOfPVC` as patch entries: `new` conditions set (by type);
/// unless `keep_old`, the claim's other resize conditions deleted.
fn merge_conditions(claim: &Claim, new: &[Value], keep_old: bool) -> Vec<Value> {
    let mut entries: Vec<Value> = new.to_vec();
    if !keep_old {
        for c in &claim.conditions {
            let set = new.iter().any(|n| n["type"] == c.type_.as_str());
            if RESIZE_CONDITIONS.contains(&c.type_.as_str()) && !set {
                entries.push(json!({"type": c.type_, "$patch": "delete"}));
            }
        }
    }
    entries
}

/// A strategic merge patch of the claim's status (and annotations), guarded by its
/// resourceVersion when `guarded`.
fn claim_patch(
    claim: &Claim,
    status: Option<Map<String, Value>>,
    annotations: Option<Value>,
    guarded: bool,
) -> Value {
    let mut metadata = Map::new();
    if guarded {
        metadata.insert("resourceVersion".into(), json!(claim.resource_version));
    }
    if let Some(annotations) = annotations {
        metadata.insert("annotations".into(), annotations);
    }
    let mut patch = Map::new();
    if !metadata.is_empty() {
        patch.insert("metadata".into(), Value::Object(metadata));
    }
    if let Some(mut status) = status {
        if let Some(Value::Array(entries)) = status.get("conditions") {
            let order = element_order(claim, entries);
            if !order.is_empty() {
                status.insert("$setElementOrder/conditions".into(), Value::Array(order));
            }
        }
        patch.insert("status".into(), Value::Object(status));
    }
    Value::Object(patch)
}

/// The conditions' order after a patch of `entries`, as a two-way merge patch of the whole
/// list states it (upstream's `CreateTwoWayMergePatch`): the claim's conditions where they are,
/// deleted ones left out, new ones appended. Without it the API server would put the patched
/// conditions first.
fn element_order(claim: &Claim, entries: &[Value]) -> Vec<Value> {
    let deleted = |t: &str| {
        entries
            .iter()
            .any(|e| e["type"] == t && e["$patch"] == "delete")
    };
    let mut order: Vec<&str> = claim
        .condition_order
        .iter()
        .map(String::as_str)
        .filter(|t| !deleted(t))
        .collect();
    for entry in entries.iter().filter(|e| e.get("$patch").is_none()) {
        if let Some(t) = entry["type"].as_str()
            && !order.contains(&t)
        {
            order.push(t);
        }
    }
    order.into_iter().map(|t| json!({ "type": t })).collect()
}

fn without_not_required(claim: &Claim) -> Option<Value> {
    claim
        .node_expansion_not_required
        .then(|| json!({ NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: null }))
}

/// `markControllerResizeInProgress`: the `Resizing` condition, the size in `allocatedResources`
/// and, for a new size, `ControllerResizeInProgress`. `None` when the claim shows all of it
/// already (a retry of the same size), which saves a write upstream makes on every attempt.
fn mark_in_progress(claim: &Claim, size: &Size, new_size: bool, now: &str) -> Option<Value> {
    let keep_old = !new_size;
    let drops = !keep_old && conditions_to_drop(claim, &[RESIZING]);
    let status_set =
        !new_size || claim.resize_status == Some(ResizeStatus::ControllerResizeInProgress);
    let allocated_set = claim
        .allocated
        .as_ref()
        .is_some_and(|a| a.bytes == size.bytes);
    if claim.has_true_condition(RESIZING)
        && !drops
        && status_set
        && allocated_set
        && !claim.node_expansion_not_required
    {
        return None;
    }
    let mut status = Map::new();
    let mut conditions = vec![];
    if !claim.has_true_condition(RESIZING) {
        conditions.push(resizing(now));
    }
    conditions.extend(
        merge_conditions(claim, &[], keep_old)
            .into_iter()
            .filter(|c| c["type"] != RESIZING),
    );
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    if new_size {
        status.insert(
            "allocatedResourceStatuses".into(),
            json!({"storage": ResizeStatus::ControllerResizeInProgress.as_str()}),
        );
    }
    status.insert(
        "allocatedResources".into(),
        json!({"storage": size.text.as_str()}),
    );
    Some(claim_patch(
        claim,
        Some(status),
        without_not_required(claim),
        true,
    ))
}

/// How a failed ControllerExpandVolume or ControllerModifyVolume is classed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The operation may still be going on in the driver: keep going to the same target.
    InProgress,
    /// The driver refused for good, but the request is not wrong as such.
    Final,
    /// The request cannot be done (InvalidArgument, OutOfRange, NotFound): marked infeasible,
    /// retried slowly unless the user changes it.
    Infeasible,
}

/// Upstream's `IsFinalError`/`IsInfeasibleError` for expansions. Unlike the provisioner,
/// ResourceExhausted counts as still in progress.
pub fn classify(code: Code) -> ErrorClass {
    match code {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unavailable
        | Code::ResourceExhausted
        | Code::Aborted => ErrorClass::InProgress,
        Code::InvalidArgument | Code::OutOfRange | Code::NotFound => ErrorClass::Infeasible,
        _ => ErrorClass::Final,
    }
}

/// The `ControllerResizeError` condition and, if infeasible, `ControllerResizeInfeasible`, after
/// a final failure. Not guarded by the resourceVersion: the failure must be recorded even when
/// the claim changed meanwhile. `None` for failures still in progress, which change nothing.
pub fn mark_failed(claim: &Claim, class: ErrorClass, error: &str, now: &str) -> Option<Value> {
    if class == ErrorClass::InProgress {
        return None;
    }
    let mut status = Map::new();
    status.insert(
        "conditions".into(),
        json!([{
            "type": CONTROLLER_RESIZE_ERROR,
            "status": "True",
            "lastTransitionTime": now,
            "message": format!("failed to expand pvc with {error}"),
        }]),
    );
    if class == ErrorClass::Infeasible {
        status.insert(
            "allocatedResourceStatuses".into(),
            json!({"storage": ResizeStatus::ControllerResizeInfeasible.as_str()}),
        );
    }
    Some(claim_patch(claim, Some(status), None, false))
}

/// The volume has its new size; the file system on it still has to grow on the node
/// (`markForPendingNodeExpansion`, or the legacy `markPVCAsFSResizeRequired`).
pub fn mark_node_pending(policy: &Policy, claim: &Claim, now: &str) -> Value {
    let pending = json!({
        "type": FILE_SYSTEM_RESIZE_PENDING,
        "status": "True",
        "lastTransitionTime": now,
        "message": "Waiting for user to (re-)start a pod to finish file system resize of volume on node.",
    });
    let mut status = Map::new();
    status.insert(
        "conditions".into(),
        Value::Array(merge_conditions(claim, &[pending], policy.recover)),
    );
    if policy.recover {
        status.insert(
            "allocatedResourceStatuses".into(),
            json!({"storage": ResizeStatus::NodeResizePending.as_str()}),
        );
        claim_patch(claim, Some(status), without_not_required(claim), true)
    } else {
        claim_patch(claim, Some(status), None, true)
    }
}

/// The expansion is done, no node step needed: the capacity, resize conditions and status
/// cleared, and (with recovery) kubelet told to skip its step.
pub fn mark_finished(policy: &Policy, claim: &Claim, size: &Size) -> Value {
    let mut status = Map::new();
    status.insert("capacity".into(), json!({"storage": size.text.as_str()}));
    let conditions = merge_conditions(claim, &[], false);
    if !conditions.is_empty() {
        status.insert("conditions".into(), Value::Array(conditions));
    }
    if policy.recover {
        if claim.resize_status.is_some() {
            status.insert("allocatedResourceStatuses".into(), json!({"storage": null}));
        }
        let annotation = (!claim.node_expansion_not_required)
            .then(|| json!({ NODE_EXPANSION_NOT_REQUIRED_ANNOTATION: "true" }));
        claim_patch(claim, Some(status), annotation, true)
    } else {
        claim_patch(claim, Some(status), None, true)
    }
}

/// The PV's new capacity, and with `AnnotateFsResize` the claim's capacity before it while the
/// node step is pending. Carries no resourceVersion, as upstream's. `None` when the PV shows it
/// all already (a retry after the claim's last write was lost), which upstream writes again.
pub fn pv_capacity_patch(
    policy: &Policy,
    pv: &Pv,
    claim: &Claim,
    size: &Size,
    node_step: bool,
) -> Option<Value> {
    let annotate = policy.annotate_fs_resize && node_step && !pv.pre_resize_capacity;
    if !annotate && pv.capacity.as_ref().is_some_and(|c| c.bytes == size.bytes) {
        return None;
    }
    let mut patch = json!({"spec": {"capacity": {"storage": size.text.as_str()}}});
    if annotate {
        let before = claim
            .capacity
            .as_ref()
            .map_or("0", |c| c.text.as_str())
            .to_string();
        patch["metadata"] = json!({"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: before}});
    }
    Some(patch)
}

/// With `AnnotateFsResize`, the pre-resize annotation goes once the claim has caught up with
/// the volume.
pub fn pre_resize_annotation_removal(policy: &Policy, claim: &Claim, pv: &Pv) -> Option<Value> {
    let caught_up = claim.capacity.as_ref().map_or(0, |c| c.bytes)
        >= pv.capacity.as_ref().map_or(0, |c| c.bytes);
    (policy.annotate_fs_resize && pv.pre_resize_capacity && caught_up)
        .then(|| json!({"metadata": {"annotations": {PRE_RESIZE_CAPACITY_ANNOTATION: null}}}))
}

/// The size a driver reported, or the size asked for when it reported none (0, which the CSI
/// spec does not allow; upstream would write it and loop on the PV's refusal).
pub fn reported_size(capacity_bytes: i64, asked: &Size) -> Size {
    if capacity_bytes > 0 {
        Size::from_bytes(capacity_bytes)
    } else {
        asked.clone()
    }
}

// --- VolumeAttributesClass modification ---

pub const PVC_NAME_KEY: &str = "csi.storage.k8s.io/pvc/name";
pub const PVC_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pvc/namespace";
pub const PV_NAME_KEY: &str = "csi.storage.k8s.io/pv/name";

/// What the modify step does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModifyPlan {
    Nothing,
    /// An infeasible target unchanged since: wait before trying it again.
    Wait(Duration),
    /// The user went back to no class: drop the `ModifyingVolume` condition.
    RollBack(Value),
    /// Call ControllerModifyVolume towards `target`; `mark` records it first.
    Modify {
        target: String,
        mark: Option<Value>,
        /// A new target (the `VolumeModify` event), not a retry of the previous one.
        fresh: bool,
    },
}

/// The next modify step (upstream's `modify`). `uncertain`: the last attempt failed in a way
/// that may still be going on in the driver, so its target is kept; `slow_retry`: the target
/// was infeasible, and may be retried after this.
pub fn plan_modify(
    claim: &Claim,
    pv: &Pv,
    driver: &str,
    uncertain: bool,
    slow_retry: Option<Duration>,
    now: &str,
) -> ModifyPlan {
    if !claim.bound || pv.in_tree || pv.driver != driver || !pv.bound_to(claim) {
        return ModifyPlan::Nothing;
    }
    let status = claim.modify_status.as_ref();
    let same_target =
        status.is_some_and(|s| s.target.is_some() && s.target.as_deref() == claim.class.as_deref());
    if same_target
        && status.is_some_and(|s| s.status == "Infeasible")
        && let Some(wait) = slow_retry
    {
        return ModifyPlan::Wait(wait);
    }
    if status.is_none() && claim.class == claim.current_class {
        return ModifyPlan::Nothing;
    }
    let in_progress = status.is_some_and(|s| s.status == "InProgress");
    let Some(class) = claim.class.clone() else {
        if in_progress {
            return keep_target(claim);
        }
        return match claim.condition(MODIFYING_VOLUME) {
            Some(_) => ModifyPlan::RollBack(claim_patch(
                claim,
                Some(conditions(vec![delete(MODIFYING_VOLUME)])),
                None,
                true,
            )),
            None => ModifyPlan::Nothing,
        };
    };
    if in_progress && uncertain {
        return keep_target(claim);
    }
    ModifyPlan::Modify {
        mark: Some(modify_status_patch(
            claim,
            "InProgress",
            Some(&class),
            None,
            now,
        )),
        target: class.to_string(),
        fresh: true,
    }
}

fn keep_target(claim: &Claim) -> ModifyPlan {
    match claim.modify_status.as_ref().and_then(|s| s.target.clone()) {
        Some(target) => ModifyPlan::Modify {
            target,
            mark: None,
            fresh: false,
        },
        None => ModifyPlan::Nothing,
    }
}

fn conditions(entries: Vec<Value>) -> Map<String, Value> {
    let mut status = Map::new();
    status.insert("conditions".into(), Value::Array(entries));
    status
}

fn delete(type_: &str) -> Value {
    json!({"type": type_, "$patch": "delete"})
}

/// A modify condition as upstream's `MergePVCConditions` writes it: probed now, its transition
/// time kept unless its status or reason changes.
fn modify_condition(claim: &Claim, type_: &str, reason: &str, message: &str, now: &str) -> Value {
    let transition = match claim.condition(type_) {
        Some(old)
            if old.status == "True"
                && old.reason == reason
                && !old.last_transition_time.is_empty() =>
        {
            old.last_transition_time.clone()
        }
        _ => now.to_string(),
    };
    let mut condition = json!({
        "type": type_,
        "status": "True",
        "lastProbeTime": now,
        "lastTransitionTime": transition,
        "message": message,
    });
    if !reason.is_empty() {
        condition["reason"] = json!(reason);
    }
    condition
}

/// `modifyVolumeStatus` set to `state`; for `InProgress` and `Infeasible` the `ModifyingVolume`
/// condition too, and after a failure (`error`: code and message) `ModifyVolumeError`. The
/// target becomes `target` when given, else stays.
pub fn modify_status_patch(
    claim: &Claim,
    state: &str,
    target: Option<&str>,
    error: Option<(Code, &str)>,
    now: &str,
) -> Value {
    let kept_target = claim
        .modify_status
        .as_ref()
        .and_then(|s| s.target.clone())
        .unwrap_or_default();
    let target_name = target.map(str::to_string).unwrap_or(kept_target);
    let mut modify = json!({"status": state});
    if target.is_some() || !target_name.is_empty() {
        modify["targetVolumeAttributesClassName"] = json!(target_name);
    }
    let mut status = Map::new();
    status.insert("modifyVolumeStatus".into(), modify);
    if state != "Pending" {
        let message = match error {
            None => format!("Modifying volume to {target_name:?} is in progress."),
            Some((code, _)) if classify(code) == ErrorClass::InProgress => {
                format!("Modifying volume to {target_name:?} is still in progress.")
            }
            Some(_) => format!("Modifying volume to {target_name:?} failed. Waiting for retry."),
        };
        let mut entries = vec![modify_condition(claim, MODIFYING_VOLUME, "", &message, now)];
        if let Some((code, text)) = error {
            entries.push(modify_condition(
                claim,
                MODIFY_VOLUME_ERROR,
                sidecar_kit::process::metrics::code_label(code),
                text,
                now,
            ));
        }
        status.insert("conditions".into(), Value::Array(entries));
    }
    claim_patch(claim, Some(status), None, true)
}

/// The state a failed modification leaves: only InvalidArgument is infeasible.
pub fn modify_failure_state(code: Code) -> &'static str {
    if code == Code::InvalidArgument {
        "Infeasible"
    } else {
        "InProgress"
    }
}

/// The modification is done: the claim's current class, no modify status or conditions. Not
/// guarded, as upstream's: the driver has done it, the claim must say so.
pub fn modify_done_patch(claim: &Claim, target: &str) -> Value {
    let mut status = conditions(
        [MODIFYING_VOLUME, MODIFY_VOLUME_ERROR]
            .into_iter()
            .filter(|t| claim.condition(t).is_some())
            .map(delete)
            .collect(),
    );
    if status["conditions"].as_array().is_some_and(Vec::is_empty) {
        status.remove("conditions");
    }
    status.insert("modifyVolumeStatus".into(), Value::Null);
    status.insert("currentVolumeAttributesClassName".into(), json!(target));
    claim_patch(claim, Some(status), None, false)
}

#[cfg(test)]
mod tests;
