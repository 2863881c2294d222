//! Expansions end to end: the claim's status and conditions, the PV's capacity, the driver's
//! size and the Events, as upstream's resizer leaves them.

use crate::common::*;
use serde_json::json;
use testkit::mockdriver::MockDriver;
use tonic::Code;

const EXPAND: &str = "/csi.v1.Controller/ControllerExpandVolume";

#[tokio::test]
async fn a_block_volume_is_expanded_in_the_controller_alone() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    let handle = env.bound_claim("data", GI, true, json!({})).await;
    env.request("data", "2Gi").await;
    let claim = env
        .claim_until("data", "the claim's new capacity", |c| {
            c["status"]["capacity"]["storage"] == "2Gi"
        })
        .await;
    assert_eq!(claim["status"]["allocatedResources"]["storage"], "2Gi");
    assert!(
        claim["status"].get("allocatedResourceStatuses").is_none(),
        "{claim:#}"
    );
    assert!(condition(&claim, "Resizing").is_none(), "{claim:#}");
    assert_eq!(
        claim["metadata"]["annotations"]["volume.kubernetes.io/node-expansion-not-required"],
        "true"
    );
    assert_eq!(env.pv("data").await["spec"]["capacity"]["storage"], "2Gi");
    assert_eq!(env.driver_size(&handle), 2 * GI);
    eventually("the Events", || async {
        let reasons = env.event_reasons("data").await;
        (reasons == ["Resizing", "VolumeResizeSuccessful"]).then_some(())
    })
    .await;
    let events = env.events("data").await;
    assert_eq!(
        events[0].2,
        format!("External resizer is resizing volume {}", env.n("pv-data"))
    );
    assert_eq!(events[1].2, "Resize volume succeeded");
    assert_eq!(env.mock.calls().count(EXPAND), 1);
}

#[tokio::test]
async fn a_file_system_is_left_to_the_node() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    let handle = env.bound_claim("fs", GI, false, json!({})).await;
    env.request("fs", "3Gi").await;
    let claim = env
        .claim_until("fs", "the node step pending", |c| {
            c["status"]["allocatedResourceStatuses"]["storage"] == "NodeResizePending"
        })
        .await;
    assert_eq!(
        claim["status"]["capacity"]["storage"], "1Gi",
        "the node has not grown it yet"
    );
    assert_eq!(claim["status"]["allocatedResources"]["storage"], "3Gi");
    let pending = condition(&claim, "FileSystemResizePending").expect("the pending condition");
    assert_eq!(pending["status"], "True");
    assert_eq!(
        pending["message"],
        "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
    );
    assert_eq!(env.pv("fs").await["spec"]["capacity"]["storage"], "3Gi");
    assert_eq!(env.driver_size(&handle), 3 * GI);
    eventually("the Events", || async {
        let reasons = env.event_reasons("fs").await;
        (reasons == ["Resizing", "FileSystemResizeRequired"]).then_some(())
    })
    .await;
    assert_eq!(
        env.mock.calls().count(EXPAND),
        1,
        "no more calls while the node is due"
    );
}

#[tokio::test]
async fn an_infeasible_size_is_marked_and_a_smaller_request_recovers() {
    let mock = MockDriver::builder().max_volume_size(4 * GI);
    let env = Env::start(mock, |_| {}).await;
    let handle = env.bound_claim("big", GI, true, json!({})).await;
    env.request("big", "10Gi").await;
    let claim = env
        .claim_until("big", "the claim marked infeasible", |c| {
            c["status"]["allocatedResourceStatuses"]["storage"] == "ControllerResizeInfeasible"
        })
        .await;
    let error = condition(&claim, "ControllerResizeError").expect("the error condition");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.starts_with("failed to expand pvc with rpc error: code = OutOfRange desc = "),
        "{message}"
    );
    assert_eq!(claim["status"]["allocatedResources"]["storage"], "10Gi");
    let calls = env.mock.calls().count(EXPAND);
    // Recovery: the user lowers the request to what the driver can do.
    env.request("big", "3Gi").await;
    let claim = env
        .claim_until("big", "the recovered size", |c| {
            c["status"]["capacity"]["storage"] == "3Gi"
        })
        .await;
    assert!(
        condition(&claim, "ControllerResizeError").is_none(),
        "{claim:#}"
    );
    assert!(
        claim["status"].get("allocatedResourceStatuses").is_none(),
        "{claim:#}"
    );
    assert_eq!(claim["status"]["allocatedResources"]["storage"], "3Gi");
    assert_eq!(env.driver_size(&handle), 3 * GI);
    assert_eq!(env.mock.calls().count(EXPAND), calls + 1);
    let failed = eventually("a VolumeResizeFailed Event", || async {
        env.events("big")
            .await
            .into_iter()
            .find(|(_, reason, _)| reason == "VolumeResizeFailed")
    })
    .await;
    assert_eq!(failed.0, "Warning");
    assert!(
        failed.2.starts_with(&format!(
            "resize volume \"{}\" by resizer \"{}\" failed: rpc error: code = OutOfRange",
            env.n("pv-big"),
            env.driver
        )),
        "{}",
        failed.2
    );
}

#[tokio::test]
async fn an_uncertain_failure_is_retried_at_the_same_size_until_it_succeeds() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.mock
        .faults()
        .fail_next(EXPAND, 2, Code::DeadlineExceeded, "slow backend");
    let handle = env.bound_claim("slow", GI, true, json!({})).await;
    env.request("slow", "2Gi").await;
    env.claim_until("slow", "the expansion done", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    assert_eq!(env.mock.calls().count(EXPAND), 3);
    assert_eq!(env.driver_size(&handle), 2 * GI);
}

#[tokio::test]
async fn claims_of_other_drivers_and_unchanged_claims_are_left_alone() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.bound_claim("same", GI, true, json!({})).await;
    let before = env.claim("same").await;
    // A change the resizer does not act on, then one it does, on another claim: once that one
    // is done, the first was looked at too.
    let patch = json!({"metadata": {"labels": {"touched": "yes"}}});
    env.claims()
        .patch(
            "same",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    env.bound_claim("other", GI, true, json!({})).await;
    env.request("other", "2Gi").await;
    env.claim_until("other", "the other claim expanded", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    let after = env.claim("same").await;
    assert_eq!(after["status"], before["status"]);
    assert_eq!(env.mock.calls().count(EXPAND), 1);
}
