use super::*;
use crate::model::{Claim, Condition, ModifyStatus, Pv};
use serde_json::json;
use sidecar_kit::values::atom::Atom;

const NOW: &str = "2026-11-25T10:00:00Z";

fn policy() -> Policy {
    Policy {
        driver: "d".into(),
        recover: true,
        annotate_fs_resize: false,
        controller_expansion: true,
    }
}

fn claim(request: &str, capacity: &str) -> Claim {
    Claim::from_api(
        &serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": "c", "uid": "u", "resourceVersion": "5"},
            "spec": {"volumeName": "pv", "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": capacity}}
        }))
        .unwrap(),
    )
}

fn pv(capacity: &str) -> Pv {
    Pv::from_api(
        &serde_json::from_value(json!({
            "metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": capacity}, "csi": {"driver": "d", "volumeHandle": "h"},
                     "claimRef": {"namespace": "ns", "name": "c", "uid": "u"}}
        }))
        .unwrap(),
        "d",
    )
    .unwrap()
}

fn size(text: &str) -> Size {
    Size::parse(text).unwrap()
}

fn condition(type_: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        reason: String::new(),
        message: String::new(),
        last_transition_time: "2026-01-01T00:00:00Z".into(),
    }
}

fn expand_to(plan: ResizePlan) -> (String, Option<Value>) {
    match plan {
        ResizePlan::Expand { size, mark } => (size.text.to_string(), mark),
        other => panic!("expected an expansion, got {other:?}"),
    }
}

#[test]
fn a_grown_request_is_expanded_and_recorded_first() {
    let c = claim("2Gi", "1Gi");
    let (to, mark) = expand_to(plan_resize(
        &policy(),
        &c,
        &pv("1Gi"),
        Memory::default(),
        NOW,
    ));
    assert_eq!(to, "2Gi");
    assert_eq!(
        mark.unwrap(),
        json!({
            "metadata": {"resourceVersion": "5"},
            "status": {
                "conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": NOW}],
                "$setElementOrder/conditions": [{"type": "Resizing"}],
                "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                "allocatedResources": {"storage": "2Gi"}
            }
        })
    );
}

#[test]
fn nothing_for_unbound_smaller_or_foreign_claims() {
    let p = policy();
    let m = Memory::default();
    assert_eq!(
        plan_resize(&p, &claim("1Gi", "1Gi"), &pv("1Gi"), m, NOW),
        ResizePlan::Nothing
    );
    let mut unbound = claim("2Gi", "1Gi");
    unbound.bound = false;
    assert_eq!(
        plan_resize(&p, &unbound, &pv("1Gi"), m, NOW),
        ResizePlan::Nothing
    );
    let mut other_claim = claim("2Gi", "1Gi");
    other_claim.uid = "someone-else".into();
    assert_eq!(
        plan_resize(&p, &other_claim, &pv("1Gi"), m, NOW),
        ResizePlan::Nothing
    );
}

#[test]
fn an_expansion_in_flight_keeps_its_size_until_it_failed_for_good() {
    let mut c = claim("5Gi", "1Gi");
    c.allocated = Some(size("2Gi"));
    c.resize_status = Some(ResizeStatus::ControllerResizeInProgress);
    c.conditions.push(condition(RESIZING));
    let (to, mark) = expand_to(plan_resize(
        &policy(),
        &c,
        &pv("1Gi"),
        Memory::default(),
        NOW,
    ));
    assert_eq!(to, "2Gi", "an uncertain expansion is finished first");
    assert_eq!(mark, None, "the claim says so already: no write");
    let failed = Memory {
        final_error: true,
        slow_retry: None,
    };
    let (to, mark) = expand_to(plan_resize(&policy(), &c, &pv("1Gi"), failed, NOW));
    assert_eq!(
        to, "5Gi",
        "after a final error the user's new request counts"
    );
    assert_eq!(
        mark.unwrap()["status"]["allocatedResources"]["storage"],
        "5Gi"
    );
}

#[test]
fn an_infeasible_size_waits_unless_the_user_asks_for_another() {
    let mut c = claim("100Ti", "1Gi");
    c.allocated = Some(size("100Ti"));
    c.resize_status = Some(ResizeStatus::ControllerResizeInfeasible);
    let slow = Memory {
        final_error: true,
        slow_retry: Some(Duration::from_secs(200)),
    };
    assert_eq!(
        plan_resize(&policy(), &c, &pv("1Gi"), slow, NOW),
        ResizePlan::Wait(Duration::from_secs(200))
    );
    // Recovery: a smaller request, still above the capacity.
    c.request = Some(size("3Gi"));
    c.conditions.push(condition(CONTROLLER_RESIZE_ERROR));
    let (to, mark) = expand_to(plan_resize(&policy(), &c, &pv("1Gi"), slow, NOW));
    assert_eq!(to, "3Gi");
    let mark = mark.unwrap();
    assert_eq!(mark["status"]["allocatedResources"]["storage"], "3Gi");
    assert_eq!(
        mark["status"]["allocatedResourceStatuses"]["storage"],
        "ControllerResizeInProgress"
    );
    let conditions = mark["status"]["conditions"].as_array().unwrap();
    assert!(conditions.contains(&json!({"type": "ControllerResizeError", "$patch": "delete"})));
}

#[test]
fn the_node_step_is_left_to_the_node() {
    let mut c = claim("2Gi", "1Gi");
    c.allocated = Some(size("2Gi"));
    c.resize_status = Some(ResizeStatus::NodeResizePending);
    assert_eq!(
        plan_resize(&policy(), &c, &pv("2Gi"), Memory::default(), NOW),
        ResizePlan::Nothing
    );
    // The user asked for more meanwhile: the node finishes the previous size first.
    c.request = Some(size("3Gi"));
    assert_eq!(
        plan_resize(&policy(), &c, &pv("2Gi"), Memory::default(), NOW),
        ResizePlan::Nothing
    );
    // A node step that failed for good is redone by the controller at the allocated size.
    c.resize_status = Some(ResizeStatus::NodeResizeInfeasible);
    let (to, _) = expand_to(plan_resize(
        &policy(),
        &c,
        &pv("2Gi"),
        Memory::default(),
        NOW,
    ));
    assert_eq!(to, "2Gi");
}

#[test]
fn without_recovery_the_request_is_expanded_as_is() {
    let p = Policy {
        recover: false,
        ..policy()
    };
    let mut c = claim("3Gi", "1Gi");
    c.allocated = Some(size("2Gi"));
    let (to, mark) = expand_to(plan_resize(&p, &c, &pv("1Gi"), Memory::default(), NOW));
    assert_eq!(to, "3Gi");
    assert!(mark.unwrap()["status"].get("allocatedResources").is_none());
    c.conditions.push(condition(FILE_SYSTEM_RESIZE_PENDING));
    assert_eq!(
        plan_resize(&p, &c, &pv("3Gi"), Memory::default(), NOW),
        ResizePlan::Nothing
    );
}

#[test]
fn migrated_volumes_need_the_resizer_annotation() {
    let c = claim("2Gi", "1Gi");
    let mut p = pv("1Gi");
    p.in_tree = true;
    assert!(!policy().handles(&c, &p));
    let mut annotated = c.clone();
    annotated.resizer = Some("d".into());
    assert!(policy().handles(&annotated, &p));
}

#[test]
fn errors_are_classed_as_upstream_does() {
    for code in [
        Code::Cancelled,
        Code::DeadlineExceeded,
        Code::Unavailable,
        Code::ResourceExhausted,
        Code::Aborted,
    ] {
        assert_eq!(classify(code), ErrorClass::InProgress, "{code:?}");
    }
    for code in [Code::InvalidArgument, Code::OutOfRange, Code::NotFound] {
        assert_eq!(classify(code), ErrorClass::Infeasible, "{code:?}");
    }
    for code in [
        Code::Internal,
        Code::FailedPrecondition,
        Code::Unknown,
        Code::PermissionDenied,
    ] {
        assert_eq!(classify(code), ErrorClass::Final, "{code:?}");
    }
}

#[test]
fn failures_are_recorded_without_a_resource_version() {
    let c = claim("2Gi", "1Gi");
    assert_eq!(mark_failed(&c, ErrorClass::InProgress, "x", NOW), None);
    let final_ = mark_failed(
        &c,
        ErrorClass::Final,
        "rpc error: code = Internal desc = boom",
        NOW,
    )
    .unwrap();
    assert_eq!(
        final_,
        json!({"status": {"conditions": [{
            "type": "ControllerResizeError", "status": "True", "lastTransitionTime": NOW,
            "message": "failed to expand pvc with rpc error: code = Internal desc = boom"}],
            "$setElementOrder/conditions": [{"type": "ControllerResizeError"}]}})
    );
    let infeasible = mark_failed(&c, ErrorClass::Infeasible, "x", NOW).unwrap();
    assert_eq!(
        infeasible["status"]["allocatedResourceStatuses"]["storage"],
        "ControllerResizeInfeasible"
    );
}

#[test]
fn the_end_of_an_expansion_in_the_controller_and_on_the_node() {
    let mut c = claim("2Gi", "1Gi");
    c.allocated = Some(size("2Gi"));
    c.resize_status = Some(ResizeStatus::ControllerResizeInProgress);
    c.conditions.push(condition(RESIZING));
    assert_eq!(
        mark_finished(&policy(), &c, &size("2Gi")),
        json!({
            "metadata": {"resourceVersion": "5",
                         "annotations": {"volume.kubernetes.io/node-expansion-not-required": "true"}},
            "status": {
                "capacity": {"storage": "2Gi"},
                "conditions": [{"type": "Resizing", "$patch": "delete"}],
                "allocatedResourceStatuses": {"storage": null}
            }
        })
    );
    let pending = mark_node_pending(&policy(), &c, NOW);
    assert_eq!(
        pending["status"]["allocatedResourceStatuses"]["storage"],
        "NodeResizePending"
    );
    let conditions = pending["status"]["conditions"].as_array().unwrap();
    assert_eq!(conditions.len(), 1, "Resizing is kept");
    assert_eq!(conditions[0]["type"], "FileSystemResizePending");
    assert_eq!(
        conditions[0]["message"],
        "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
    );
}

#[test]
fn pv_capacity_and_the_pre_resize_annotation() {
    let c = claim("2Gi", "1Gi");
    let p = pv("1Gi");
    assert_eq!(
        pv_capacity_patch(&policy(), &p, &c, &size("2Gi"), true),
        Some(json!({"spec": {"capacity": {"storage": "2Gi"}}}))
    );
    assert_eq!(
        pv_capacity_patch(&policy(), &pv("2Gi"), &c, &size("2Gi"), true),
        None,
        "a PV with the size already is not written again"
    );
    let annotating = Policy {
        annotate_fs_resize: true,
        ..policy()
    };
    let patch = pv_capacity_patch(&annotating, &p, &c, &size("2Gi"), true).unwrap();
    assert_eq!(
        patch["metadata"]["annotations"]["volume.alpha.kubernetes.io/pre-resize-capacity"],
        "1Gi"
    );
    let mut annotated = pv("2Gi");
    annotated.pre_resize_capacity = true;
    assert_eq!(
        pre_resize_annotation_removal(&annotating, &c, &annotated),
        None,
        "the node has not caught up"
    );
    let caught_up = claim("2Gi", "2Gi");
    assert!(pre_resize_annotation_removal(&annotating, &caught_up, &annotated).is_some());
    assert_eq!(reported_size(0, &size("2Gi")), size("2Gi"));
    assert_eq!(reported_size(3 << 30, &size("2Gi")).text.as_str(), "3Gi");
}

fn classed(class: Option<&str>, current: Option<&str>, status: Option<(&str, &str)>) -> Claim {
    let mut c = claim("1Gi", "1Gi");
    c.class = class.map(Atom::new);
    c.current_class = current.map(Atom::new);
    c.modify_status = status.map(|(s, t)| {
        Box::new(ModifyStatus {
            status: s.into(),
            target: Some(t.into()),
        })
    });
    c
}

#[test]
fn class_changes_are_planned_as_upstream_does() {
    let p = pv("1Gi");
    assert_eq!(
        plan_modify(
            &classed(Some("a"), Some("a"), None),
            &p,
            "d",
            false,
            None,
            NOW
        ),
        ModifyPlan::Nothing
    );
    match plan_modify(
        &classed(Some("b"), Some("a"), None),
        &p,
        "d",
        false,
        None,
        NOW,
    ) {
        ModifyPlan::Modify {
            target,
            mark,
            fresh,
        } => {
            assert_eq!(target, "b");
            assert!(fresh);
            let mark = mark.unwrap();
            assert_eq!(
                mark["status"]["modifyVolumeStatus"],
                json!({"status": "InProgress", "targetVolumeAttributesClassName": "b"})
            );
            assert_eq!(
                mark["status"]["conditions"][0]["message"],
                "Modifying volume to \"b\" is in progress."
            );
        }
        other => panic!("{other:?}"),
    }
    // An uncertain attempt keeps its target even when the user moved on.
    let moved_on = classed(Some("c"), Some("a"), Some(("InProgress", "b")));
    match plan_modify(&moved_on, &p, "d", true, None, NOW) {
        ModifyPlan::Modify {
            target,
            mark,
            fresh,
        } => {
            assert_eq!((target.as_str(), mark, fresh), ("b", None, false));
        }
        other => panic!("{other:?}"),
    }
    // A final failure lets the new target win.
    assert!(matches!(
        plan_modify(&moved_on, &p, "d", false, None, NOW),
        ModifyPlan::Modify { fresh: true, .. }
    ));
    // Infeasible and unchanged: wait.
    let infeasible = classed(Some("b"), Some("a"), Some(("Infeasible", "b")));
    assert_eq!(
        plan_modify(
            &infeasible,
            &p,
            "d",
            false,
            Some(Duration::from_secs(9)),
            NOW
        ),
        ModifyPlan::Wait(Duration::from_secs(9))
    );
    // Rolled back to no class after an infeasible target: the condition goes.
    let mut rolled_back = classed(None, Some("a"), Some(("Infeasible", "b")));
    rolled_back.conditions.push(condition(MODIFYING_VOLUME));
    assert_eq!(
        plan_modify(&rolled_back, &p, "d", false, None, NOW),
        ModifyPlan::RollBack(json!({"metadata": {"resourceVersion": "5"},
            "status": {"conditions": [{"type": "ModifyingVolume", "$patch": "delete"}]}}))
    );
    // Not this driver's volume.
    assert_eq!(
        plan_modify(
            &classed(Some("b"), None, None),
            &p,
            "other",
            false,
            None,
            NOW
        ),
        ModifyPlan::Nothing
    );
}

#[test]
fn modify_failures_and_success_in_the_claim() {
    let c = classed(Some("b"), Some("a"), Some(("InProgress", "b")));
    let patch = modify_status_patch(
        &c,
        modify_failure_state(Code::InvalidArgument),
        None,
        Some((Code::InvalidArgument, "bad")),
        NOW,
    );
    assert_eq!(
        patch["status"]["modifyVolumeStatus"],
        json!({"status": "Infeasible", "targetVolumeAttributesClassName": "b"})
    );
    let conditions = patch["status"]["conditions"].as_array().unwrap();
    assert_eq!(
        conditions[0]["message"],
        "Modifying volume to \"b\" failed. Waiting for retry."
    );
    assert_eq!(conditions[1]["reason"], "InvalidArgument");
    assert_eq!(conditions[1]["message"], "bad");
    assert_eq!(modify_failure_state(Code::Internal), "InProgress");
    let still = modify_status_patch(
        &c,
        "InProgress",
        None,
        Some((Code::DeadlineExceeded, "slow")),
        NOW,
    );
    assert_eq!(
        still["status"]["conditions"][0]["message"],
        "Modifying volume to \"b\" is still in progress."
    );
    let mut erred = c.clone();
    erred.conditions.push(condition(MODIFYING_VOLUME));
    erred.conditions.push(condition(MODIFY_VOLUME_ERROR));
    assert_eq!(
        modify_done_patch(&erred, "b"),
        json!({"status": {
            "conditions": [{"type": "ModifyingVolume", "$patch": "delete"}, {"type": "ModifyVolumeError", "$patch": "delete"}],
            "modifyVolumeStatus": null,
            "currentVolumeAttributesClassName": "b"}})
    );
}

#[test]
fn patches_keep_the_order_of_the_claims_conditions() {
    let mut c = claim("2Gi", "1Gi");
    c.conditions.push(condition(RESIZING));
    c.condition_order = vec!["SomethingElse".into(), RESIZING.into()];
    c.resize_status = Some(ResizeStatus::ControllerResizeInProgress);
    let pending = mark_node_pending(&policy(), &c, NOW);
    assert_eq!(
        pending["status"]["$setElementOrder/conditions"],
        json!([{"type": "SomethingElse"}, {"type": "Resizing"}, {"type": "FileSystemResizePending"}])
    );
    let finished = mark_finished(&policy(), &c, &size("2Gi"));
    assert_eq!(
        finished["status"]["$setElementOrder/conditions"],
        json!([{"type": "SomethingElse"}]),
        "deleted conditions leave the order"
    );
    let mut alone = c.clone();
    alone.condition_order = vec![RESIZING.into()];
    let finished = mark_finished(&policy(), &alone, &size("2Gi"));
    assert!(
        finished["status"]
            .get("$setElementOrder/conditions")
            .is_none()
    );
}
