//! Secrets never leave the driver's requests: the real `csi-snapshotter` binary at `-v=10`
//! (every gRPC request and response logged) cuts and deletes a snapshot whose class names a
//! snapshotter secret, through a failing CreateSnapshot, and no secret value (nor its base64)
//! appears in its log, in any Event, in its metrics, in the contents it writes or in its intent
//! journal, read while the cut is in flight.

#![cfg(unix)]

use std::process::Stdio;

use crate::common::*;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testkit::leaks::{self, distinctive_secret};
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::MockDriver;
use testkit::process::CleanEnv;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-snapshotter");

#[tokio::test]
async fn secrets_never_reach_logs_events_metrics_objects_or_the_journal() {
    // The in-process snapshotter is stopped at once: the binary does the work.
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.stop().await;
    let (user, password) = (distinctive_secret(), distinctive_secret());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "snap-creds"},
        "stringData": {"username": user, "password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    env.class(
        "class",
        "Delete",
        json!({"csi.storage.k8s.io/snapshotter-secret-name": "snap-creds",
               "csi.storage.k8s.io/snapshotter-secret-namespace": env.ns()}),
    )
    .await;
    env.bound_claim("data").await;

    let port = free_port().unwrap();
    let mut command = Command::new(BIN);
    command
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            format!("--leader-election-namespace={}", env.ns()),
            "--retry-interval-start=100ms".to_string(),
            "-v=10".to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    testkit::process::die_with_parent(&mut command);
    let mut child = command.spawn().unwrap();
    let mut pipe = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text).await;
        text
    });

    // The first CreateSnapshot waits at the driver, then fails; the second succeeds.
    env.mock.faults().hang(CREATE);
    env.mock.faults().fail_next(
        CREATE,
        1,
        Code::Internal,
        "the backend refused the snapshot",
    );
    let uid = env.snapshot("snap", "data", "class").await;
    let name = format!("snapcontent-{uid}");
    env.content_of(&uid).await;
    eventually("the CreateSnapshot at the driver", || async {
        (env.mock.calls().count(CREATE) >= 1).then_some(())
    })
    .await;
    let journal_name = format!(
        "{}-journal",
        external_snapshotter::model::lease_name(&env.driver)
    );
    let journal = Api::<Secret>::namespaced(env.client(), env.ns())
        .get(&journal_name)
        .await
        .unwrap();
    assert!(
        journal.data.as_ref().is_some_and(|d| d.contains_key(&name)),
        "the cut is recorded while in flight: {journal:?}"
    );
    env.mock.faults().release(CREATE);
    let ready = env
        .content_until(&name, "the content ready", |c| {
            c["status"]["readyToUse"] == true
        })
        .await;
    env.delete_snapshot("snap").await;
    env.content_gone(&name).await;
    for method in [CREATE, DELETE] {
        let calls = env.mock.calls().of(method);
        assert!(!calls.is_empty(), "{method} called");
        for call in &calls {
            assert!(
                call.carries_secret("username", &user)
                    && call.carries_secret("password", &password),
                "{method} #{} carried the secret",
                call.seq
            );
        }
    }

    let (status, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("CreateSnapshot"), "{metrics}");
    let events = eventually("the failed cut's Event", || async {
        let events = Api::<Event>::all(env.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        events
            .iter()
            .any(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("the backend refused the snapshot"))
            })
            .then_some(events)
    })
    .await;
    let new_events = Api::<k8s_openapi::api::events::v1::Event>::all(env.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let log = stderr.await.unwrap();
    assert!(
        log.contains(CREATE) && log.contains("***stripped***"),
        "-v=10 logs the requests, secrets stripped:\n{log}"
    );
    let values = [user, password];
    let mut hits = leaks::find("log", &log, &values);
    hits.extend(leaks::find("metrics", &metrics, &values));
    for event in &events {
        hits.extend(leaks::find_in("core Event", event, &values));
    }
    for event in &new_events {
        hits.extend(leaks::find_in("events.k8s.io Event", event, &values));
    }
    hits.extend(leaks::find_in("content", &ready, &values));
    hits.extend(leaks::find_in("journal", &journal, &values));
    assert!(
        hits.is_empty(),
        "secret values leaked:\n{}",
        hits.join("\n")
    );
}
