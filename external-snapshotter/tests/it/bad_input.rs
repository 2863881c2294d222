//! Bad input: a clear status error and Event for each, no crash, nothing asked of the driver
//! that it should not be asked, and the sidecar goes on with other contents.

use crate::common::*;
use serde_json::{Value, json};
use testkit::mockdriver::MockDriver;

/// A dynamic content made by hand (as an operator or another tool would), bound to a
/// VolumeSnapshot that does not exist.
async fn hand_made_content(env: &Env, name: &str, spec: Value) -> String {
    let name = env.n(name);
    let mut content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {"driver": env.driver, "deletionPolicy": "Delete",
                 "volumeSnapshotRef": {"name": format!("{name}-snap"), "namespace": env.ns(),
                                       "uid": "00000000-0000-0000-0000-000000000001"}},
    });
    for (key, value) in spec.as_object().unwrap() {
        content["spec"][key] = value.clone();
    }
    env.contents()
        .create(
            &Default::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
        .unwrap();
    name
}

/// The content's status error, once it is not that of a class the snapshotter has not seen
/// yet: on a real cluster the class's watch event may come after the content's, and that error
/// is retried.
async fn status_error(env: &Env, name: &str) -> String {
    let content = env
        .content_until(name, "the error in the status", |c| {
            c["status"]["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.contains("failed to get snapshot class"))
        })
        .await;
    content["status"]["error"]["message"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn event_with(env: &Env, name: &str, reason: &str) -> String {
    eventually("the Event", || async {
        env.events(name)
            .await
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, message)| message)
    })
    .await
}

#[tokio::test]
async fn a_dynamic_content_without_a_class() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    let name = hand_made_content(
        &env,
        "classless",
        json!({"source": {"volumeHandle": "vol-1"}}),
    )
    .await;
    let cause = format!(
        "failed to get input parameters to create snapshot for content {name}: \"failed to take snapshot {name} without a snapshot class\""
    );
    // The first failure's message, or a retry's (upstream's "check and update" wording, once a
    // status is written); the first failure's Event in any case.
    let written = status_error(&env, &name).await;
    assert!(written.ends_with(&cause), "{written}");
    assert_eq!(
        event_with(&env, &name, "SnapshotCreationFailed").await,
        format!("Failed to create snapshot: {cause}")
    );
    assert_eq!(env.mock.calls().count(CREATE), 0);
}

#[tokio::test]
async fn a_class_with_an_unknown_reserved_parameter() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class(
        "typo",
        "Delete",
        json!({"csi.storage.k8s.io/snapshoter-secret-name": "s"}),
    )
    .await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "typo").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let message = status_error(&env, &name).await;
    assert!(
        message.contains("found unknown parameter key \\\"csi.storage.k8s.io/snapshoter-secret-name\\\" with reserved namespace csi.storage.k8s.io/"),
        "{message}"
    );
    assert_eq!(env.mock.calls().count(CREATE), 0);
}

#[tokio::test]
async fn a_missing_secret() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class(
        "secret",
        "Delete",
        json!({"csi.storage.k8s.io/snapshotter-secret-name": "missing",
               "csi.storage.k8s.io/snapshotter-secret-namespace": env.ns()}),
    )
    .await;
    env.bound_claim("data").await;
    let uid = env.snapshot("snap", "data", "secret").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    let message = status_error(&env, &name).await;
    assert_eq!(
        message,
        format!(
            "Failed to create snapshot: failed to get input parameters to create snapshot for content {name}: \"cannot get credentials for snapshot content \\\"{name}\\\"\""
        )
    );
    assert_eq!(env.mock.calls().count(CREATE), 0);
    // Deleting it still works: there is nothing to delete in the driver.
    env.delete_snapshot("snap").await;
    env.content_gone(&name).await;
}

#[tokio::test]
async fn a_pre_provisioned_content_whose_handle_the_driver_does_not_know() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    let name = hand_made_content(
        &env,
        "unknown",
        json!({"source": {"snapshotHandle": "snap-nope"}}),
    )
    .await;
    let message = status_error(&env, &name).await;
    assert_eq!(
        message,
        format!(
            "Failed to check and update snapshot content: failed to list snapshot for content {name}: \"can not find snapshot for snapshotID snap-nope\""
        )
    );
    assert_eq!(
        event_with(&env, &name, "SnapshotContentCheckandUpdateFailed").await,
        message
    );
}

#[tokio::test]
async fn a_list_secret_template_naming_the_snapshot() {
    let env = Env::start(MockDriver::builder(), |_| {}).await;
    env.class(
        "listing",
        "Delete",
        json!({"csi.storage.k8s.io/snapshotter-list-secret-name": "${volumesnapshot.name}",
               "csi.storage.k8s.io/snapshotter-list-secret-namespace": env.ns()}),
    )
    .await;
    let name = hand_made_content(
        &env,
        "listed",
        json!({"source": {"snapshotHandle": "snap-1"}, "volumeSnapshotClassName": env.n("listing")}),
    )
    .await;
    let message = status_error(&env, &name).await;
    assert_eq!(
        message,
        format!(
            "Failed to check and update snapshot content: failed to get secret reference for snapshot content {name}: error resolving value \"${{volumesnapshot.name}}\": invalid tokens: [\"volumesnapshot.name\"]"
        )
    );
    assert_eq!(env.mock.calls().count(LIST), 0);
}
