//! Secrets never leave the driver's requests: the real `csi-attacher` binary at `-v=10` (every
//! gRPC request and response logged) attaches and detaches a PV whose `controllerPublishSecretRef`
//! names a Secret, through a failing ControllerPublishVolume and a failing
//! ControllerUnpublishVolume, and no secret value (nor its base64) appears in its log, in any
//! Event, in its metrics or in the VolumeAttachment it writes.

#![cfg(unix)]

use std::process::Stdio;

use crate::common::*;
use csi_proto::methods::controller::{CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testkit::leaks::{self, distinctive_secret};
use testkit::measure::{free_port, http_get};
use testkit::process::CleanEnv;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-attacher");

#[tokio::test]
async fn secrets_never_reach_logs_events_metrics_or_objects() {
    let env = Env::without_controller(mock()).await;
    let ns = env.cluster.namespace().to_string();
    let (user, password) = (distinctive_secret(), distinctive_secret());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "publish"},
        "stringData": {"username": user, "password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let values = [user.clone(), password.clone()];

    let port = free_port().unwrap();
    let mut command = Command::new(BIN);
    command
        .clean_env()
        .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
        .arg(format!("--csi-address={}", env.mock.endpoint()))
        .arg(format!("--http-endpoint=127.0.0.1:{port}"))
        .args([
            "-v=10",
            "--retry-interval-start=100ms",
            "--retry-interval-max=1s",
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

    env.create_csinode("node-1", "nid-1").await;
    let handle = env.create_volume("sec").await;
    let mut spec = env.csi_pv_spec(&handle);
    spec["csi"]["controllerPublishSecretRef"] = json!({"name": "publish", "namespace": ns});
    env.create_pv("pv-s", spec).await;
    env.mock.faults().fail_next(
        CONTROLLER_PUBLISH_VOLUME,
        1,
        Code::Internal,
        "the backend refused the attachment",
    );
    env.create_pv_va("va-s", "pv-s", "node-1").await;
    let va = env.wait_va("va-s", attached).await;
    env.wait_event("va-s", "AttachFailed", "the backend refused the attachment")
        .await;

    env.mock.faults().fail_next(
        CONTROLLER_UNPUBLISH_VOLUME,
        1,
        Code::Internal,
        "the backend is busy detaching",
    );
    env.delete_va("va-s").await;
    env.wait_va_gone("va-s").await;

    // The flows carried the secret: every publish and unpublish, failed or not, got both values.
    for method in [CONTROLLER_PUBLISH_VOLUME, CONTROLLER_UNPUBLISH_VOLUME] {
        let calls = env.mock.calls().of(method);
        assert_eq!(calls.len(), 2, "{method}: one failed call, one success");
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
    assert!(metrics.contains("ControllerUnpublishVolume"), "{metrics}");
    let events = eventually("a DetachFailed event", || async {
        let events = Api::<Event>::all(env.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("DetachFailed")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("the backend is busy detaching"))
            })
            .then_some(events)
    })
    .await;
    let new_events = Api::<k8s_openapi::api::events::v1::Event>::all(env.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let pv = env.pvs().get_opt(&env.n("pv-s")).await.unwrap();

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let log = stderr.await.unwrap();
    assert!(
        log.contains("/csi.v1.Controller/ControllerPublishVolume")
            && log.contains("***stripped***"),
        "-v=10 logs the requests, secrets stripped:\n{log}"
    );

    let mut hits = leaks::find("log", &log, &values);
    hits.extend(leaks::find("metrics", &metrics, &values));
    for event in &events {
        hits.extend(leaks::find_in("core Event", event, &values));
    }
    for event in &new_events {
        hits.extend(leaks::find_in("events.k8s.io Event", event, &values));
    }
    hits.extend(leaks::find_in("VolumeAttachment", &va, &values));
    hits.extend(leaks::find_in("PV", &pv, &values));
    assert!(
        hits.is_empty(),
        "secret values leaked:\n{}",
        hits.join("\n")
    );
    env.stop().await;
}
