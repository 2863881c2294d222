//! Driver errors: written to the content's status and an Event as upstream words them, retried
//! with backoff; an unanswered CreateSnapshot holds the content's deletion until it is answered.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use testkit::mockdriver::MockDriver;
use tonic::Code;

const BEING_CREATED: &str = "snapshot.storage.kubernetes.io/volumesnapshot-being-created";

#[tokio::test]
async fn a_final_error_is_reported_and_the_retry_succeeds() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.mock
        .faults()
        .fail_always(CREATE, Code::InvalidArgument, "bad volume");
    env.class("class", "Delete", json!({})).await;
    let volume = env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let cause = format!(
        "failed to take snapshot of the volume {volume}: \"rpc error: code = InvalidArgument desc = bad volume\""
    );
    let message = format!("Failed to create snapshot: {cause}");
    let failed = env
        .content_until(&name, "the error in the status", |c| {
            c["status"]["error"]["message"].is_string()
        })
        .await;
    // The first failure's message, or a retry's, which comes with a status already written
    // (upstream's "check and update" wording then).
    let written = failed["status"]["error"]["message"].as_str().unwrap();
    assert!(written.ends_with(&cause), "{written}");
    assert_eq!(failed["status"]["readyToUse"], false);
    eventually("a retry", || async {
        (env.mock.calls().count(CREATE) >= 2).then_some(())
    })
    .await;
    env.mock.faults().clear_failures(CREATE);
    let ready = env
        .content_until(&name, "the content ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    assert!(
        ready["status"].get("error").is_none(),
        "cleared once ready: {ready}"
    );
    assert_eq!(env.mock.state().snapshots.len(), 1);
    let events = eventually("the Events", || async {
        let events = env.events(&name).await;
        (events.len() >= 2).then_some(events)
    })
    .await;
    assert!(
        events.contains(&("SnapshotCreationFailed".into(), message.clone())),
        "{events:?}"
    );
    // The second failure came with a status already written: upstream's other reason.
    assert!(
        events.iter().any(
            |(reason, text)| reason == "SnapshotContentCheckandUpdateFailed"
                && text.starts_with(
                    "Failed to check and update snapshot content: failed to take snapshot"
                )
        ),
        "{events:?}"
    );
}

#[tokio::test]
async fn an_unanswered_create_holds_the_deletion_until_the_driver_answers() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    env.mock.faults().hang(CREATE);
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the being-created annotation", |c| {
        annotation(c, BEING_CREATED) == Some("yes")
    })
    .await;
    eventually("the call at the driver", || async {
        (env.mock.calls().count(CREATE) >= 1).then_some(())
    })
    .await;
    env.delete_snapshot("snap").await;
    env.content_until(&name, "the content marked for deletion", |c| {
        annotation(
            c,
            "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted",
        ) == Some("yes")
            && c["metadata"]["deletionTimestamp"].is_string()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "nothing to delete yet");
    assert!(
        env.contents().get(&name).await.is_ok(),
        "kept by its finalizer"
    );
    env.mock.faults().release(CREATE);
    env.content_gone(&name).await;
    assert!(env.mock.state().snapshots.is_empty());
    assert_eq!(env.mock.calls().count(DELETE), 1);
}

#[tokio::test]
async fn a_timeout_is_not_final_and_keeps_the_annotation() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.mock
        .faults()
        .fail_next(CREATE, 1, Code::DeadlineExceeded, "slow backend");
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let failed = env
        .content_until(&name, "the error in the status", |c| {
            c["status"]["error"]["message"].is_string()
        })
        .await;
    assert_eq!(annotation(&failed, BEING_CREATED), Some("yes"));
    let ready = env
        .content_until(&name, "the content ready, annotation gone", |c| {
            c["status"]["readyToUse"] == true && annotation(c, BEING_CREATED).is_none()
        })
        .await;
    assert!(ready["status"]["snapshotHandle"].is_string());
}

#[tokio::test]
async fn a_failed_delete_is_reported_and_retried() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the content ready", |c| {
        c["status"]["readyToUse"] == true
    })
    .await;
    env.mock
        .faults()
        .fail_next(DELETE, 2, Code::Internal, "backend busy");
    env.delete_snapshot("snap").await;
    env.content_gone(&name).await;
    assert_eq!(env.mock.calls().count(DELETE), 3);
    assert!(env.mock.state().snapshots.is_empty());
    let events = env.events(&name).await;
    assert!(
        events.contains(&(
            "SnapshotDeleteError".into(),
            "Failed to delete snapshot".into()
        )),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_snapshot_the_driver_refuses_can_be_deleted() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.mock
        .faults()
        .fail_always(CREATE, Code::InvalidArgument, "bad volume");
    env.class("class", "Delete", json!({})).await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    env.content_until(&name, "the error in the status", |c| {
        c["status"]["error"]["message"].is_string()
    })
    .await;
    // A final error says nothing is being cut: the content is not held for an answer.
    env.delete_snapshot("snap").await;
    env.content_gone(&name).await;
    assert_eq!(env.mock.calls().count(DELETE), 0, "no snapshot was made");
    assert!(env.mock.state().snapshots.is_empty());
}
