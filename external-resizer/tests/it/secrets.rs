//! Secrets never leave the driver's requests: the real `csi-resizer` binary at `-v=10` (every
//! gRPC request and response logged) expands a volume whose PV names an expansion secret,
//! through a failing ControllerExpandVolume, and no secret value (nor its base64) appears in
//! its log, in any Event, in its metrics or in the objects it writes.

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

const BIN: &str = env!("CARGO_BIN_EXE_csi-resizer");
const EXPAND: &str = "/csi.v1.Controller/ControllerExpandVolume";

#[tokio::test]
async fn secrets_never_reach_logs_events_metrics_or_objects() {
    // The in-process resizer is stopped at once: the binary does the work.
    let mut env = Env::start(MockDriver::builder(), |_| {}).await;
    env.stop().await;
    let (user, password) = (distinctive_secret(), distinctive_secret());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "expand-creds"},
        "stringData": {"username": user, "password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let secret_ref = json!({"spec": {"csi": {"controllerExpandSecretRef":
        {"name": "expand-creds", "namespace": env.ns()}}}});
    env.bound_claim_with("db", GI, true, json!({}), secret_ref)
        .await;

    let port = free_port().unwrap();
    let mut command = Command::new(BIN);
    command
        .clean_env()
        .args([
            format!("--csi-address={}", env.mock.endpoint()),
            format!("--kubeconfig={}", env.cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--handle-volume-inuse-error=false".to_string(),
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

    // The first expansion fails, the second succeeds; both carry the secret.
    env.mock
        .faults()
        .fail_next(EXPAND, 1, Code::Internal, "the backend refused to grow");
    env.request("db", "2Gi").await;
    env.claim_until("db", "the expansion", |c| {
        c["status"]["capacity"]["storage"] == "2Gi"
    })
    .await;
    let calls = env.mock.calls().of(EXPAND);
    assert_eq!(calls.len(), 2, "one failed call, one success");
    for call in &calls {
        assert!(
            call.carries_secret("username", &user) && call.carries_secret("password", &password),
            "ControllerExpandVolume #{} carried the secret",
            call.seq
        );
    }

    let (status, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("ControllerExpandVolume"), "{metrics}");
    let events = eventually("the failed expansion's Event", || async {
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
                    .is_some_and(|m| m.contains("the backend refused to grow"))
            })
            .then_some(events)
    })
    .await;
    let new_events = Api::<k8s_openapi::api::events::v1::Event>::all(env.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let claim = env.claim("db").await;
    let pv_name = claim["spec"]["volumeName"].as_str().unwrap().to_string();
    let pv = env.pv("db").await;
    assert_eq!(pv["metadata"]["name"], pv_name.as_str());

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let log = stderr.await.unwrap();
    assert!(
        log.contains(EXPAND) && log.contains("***stripped***"),
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
    hits.extend(leaks::find_in("PV", &pv, &values));
    hits.extend(leaks::find_in("claim", &claim, &values));
    assert!(
        hits.is_empty(),
        "secret values leaked:\n{}",
        hits.join("\n")
    );
}
