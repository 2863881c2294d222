//! Secrets never leave the driver's requests: the real `csi-provisioner` binary at `-v=10` (every
//! gRPC request and response logged) provisions and deletes a volume whose class names secrets of
//! every kind, through a failing CreateVolume and a failing DeleteVolume, and no secret value (nor
//! its base64) appears in its log, in any Event, in its metrics, in the objects it writes or in
//! its intent journal, read while the first CreateVolume is in flight.

#![cfg(unix)]

use std::process::Stdio;

use crate::common::{Env, WAIT, eventually, mock, requests};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testkit::leaks::{self, distinctive_secret};
use testkit::measure::{free_port, http_get};
use testkit::process::CleanEnv;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

/// A Secret in `namespace` holding `username` and `password`.
async fn create_secret(env: &Env, name: &str, username: &str, password: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"username": username, "password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client(), &env.namespace())
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

#[tokio::test]
async fn secrets_never_reach_logs_events_metrics_or_objects() {
    let mut env = Env::without_controller(mock()).await;
    let ns = env.namespace();

    // Every kind of secret, each with values of its own.
    let kinds = [
        ("provisioner", "${pvc.name}-prov"),
        ("controller-publish", "cp"),
        ("node-stage", "${pvc.name}-stage"),
        ("node-publish", "${pvc.annotations['team']}-np"),
        ("controller-expand", "expand"),
    ];
    let claim = "db";
    let resolved = ["db-prov", "cp", "db-stage", "blue-np", "expand"];
    let mut values = Vec::new();
    for name in resolved {
        let (user, password) = (distinctive_secret(), distinctive_secret());
        create_secret(&env, name, &user, &password).await;
        values.push((user, password));
    }
    let all_values: Vec<String> = values
        .iter()
        .flat_map(|(u, p)| [u.clone(), p.clone()])
        .collect();
    let mut parameters = serde_json::Map::new();
    for (kind, template) in kinds {
        parameters.insert(
            format!("csi.storage.k8s.io/{kind}-secret-name"),
            json!(template),
        );
        parameters.insert(
            format!("csi.storage.k8s.io/{kind}-secret-namespace"),
            json!("${pvc.namespace}"),
        );
    }

    let port = free_port().unwrap();
    // Traced, every span kept: a trace must not leak what a log must not.
    let collector = testkit::otlp::Collector::start().await.unwrap();
    let mut command = Command::new(BIN);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.http_endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .clean_env()
        .arg(format!(
            "--kubeconfig={}",
            env.cluster.kubeconfig_path().display()
        ))
        .arg(format!(
            "--csi-address={}",
            env.mock.socket_path().display()
        ))
        .arg(format!("--http-endpoint=127.0.0.1:{port}"))
        .arg(format!("--leader-election-namespace={ns}"))
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

    // The first CreateVolume waits at the driver (its intent journaled), then fails; the second
    // succeeds.
    env.mock.faults().hang(CREATE_VOLUME);
    env.mock.faults().fail_next(
        CREATE_VOLUME,
        1,
        Code::Internal,
        "the backend refused the request",
    );
    let class = env.create_class(json!({"parameters": parameters})).await;
    let created = env
        .create_claim(
            claim,
            &class,
            json!({"metadata": {"annotations": {"team": "blue"}}}),
        )
        .await;
    let calls = env.mock.calls().clone();
    eventually("the CreateVolume at the driver", || {
        let n = calls.count(CREATE_VOLUME);
        async move { (n >= 1).then_some(()) }
    })
    .await;
    let journal = Api::<Secret>::namespaced(env.client(), &ns)
        .get(&format!(
            "{}-journal",
            external_provisioner::model::lease_name(&env.driver)
        ))
        .await
        .unwrap();
    let uid = created.metadata.uid.unwrap();
    assert!(
        journal.data.as_ref().is_some_and(|d| d.contains_key(&uid)),
        "the call is recorded while in flight: {journal:?}"
    );
    env.mock.faults().release(CREATE_VOLUME);
    let pv = env.wait_bound(claim).await;
    env.wait_event(
        claim,
        "ProvisioningFailed",
        "the backend refused the request",
    )
    .await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let csi = pv.spec.as_ref().unwrap().csi.as_ref().unwrap();
    let refs = [
        &csi.controller_publish_secret_ref,
        &csi.node_stage_secret_ref,
        &csi.node_publish_secret_ref,
        &csi.controller_expand_secret_ref,
    ];
    for (reference, expected) in refs.iter().zip(&resolved[1..]) {
        let reference = reference.as_ref().expect("a secret reference in the PV");
        assert_eq!(reference.name.as_deref(), Some(*expected));
        assert_eq!(reference.namespace.as_deref(), Some(ns.as_str()));
    }

    // The first DeleteVolume fails, the second succeeds.
    env.mock.faults().fail_next(
        DELETE_VOLUME,
        1,
        Code::Internal,
        "the backend is busy deleting",
    );
    env.delete_claim(claim).await;
    env.wait_pv_gone(&pv_name).await;
    assert!(env.driver_volumes().is_empty(), "the volume was deleted");

    // The flows carried the provisioner secret: every CreateVolume and DeleteVolume, failed
    // and successful, got both of its values.
    let (user, password) = &values[0];
    for method in [CREATE_VOLUME, DELETE_VOLUME] {
        let calls = env.mock.calls().of(method);
        assert_eq!(calls.len(), 2, "{method}: one failed call, one success");
        for call in &calls {
            assert!(
                call.carries_secret("username", user) && call.carries_secret("password", password),
                "{method} #{} carried the provisioner secret",
                call.seq
            );
        }
    }
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME)[0]["secrets"],
        "***stripped***"
    );

    // What a reader can see: metrics, Events (core and events.k8s.io, every namespace), the
    // PV and claim the provisioner wrote, and its log.
    let (status, metrics) = http_get(port, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(metrics.contains("DeleteVolume"), "{metrics}");
    let events = eventually("a VolumeFailedDelete event", || async {
        let events = Api::<Event>::all(env.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("VolumeFailedDelete")
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("the backend is busy deleting"))
            })
            .then_some(events)
    })
    .await;
    let new_events = Api::<k8s_openapi::api::events::v1::Event>::all(env.client())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    let claim_object = env.pvcs().get_opt(claim).await.unwrap();

    let spans = collector
        .wait_for(WAIT, |spans| {
            spans
                .iter()
                .any(|s| s.name == "csi.v1.Controller/DeleteVolume" && s.status_code == 0)
                .then(|| spans.to_vec())
        })
        .await
        .expect("the spans of the flows, the last DeleteVolume's included");
    assert!(
        spans.iter().any(|s| !s.events.is_empty()),
        "-v=10 log lines are span events too"
    );

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let log = stderr.await.unwrap();
    assert!(
        log.contains("/csi.v1.Controller/CreateVolume") && log.contains("***stripped***"),
        "-v=10 logs the requests, secrets stripped:\n{log}"
    );

    let mut hits = leaks::find("log", &log, &all_values);
    hits.extend(leaks::find("metrics", &metrics, &all_values));
    hits.extend(leaks::find("spans", &format!("{spans:?}"), &all_values));
    for event in &events {
        hits.extend(leaks::find_in("core Event", event, &all_values));
    }
    for event in &new_events {
        hits.extend(leaks::find_in("events.k8s.io Event", event, &all_values));
    }
    hits.extend(leaks::find_in("PV", &pv, &all_values));
    hits.extend(leaks::find_in("claim", &claim_object, &all_values));
    hits.extend(leaks::find_in("journal", &journal, &all_values));
    assert!(
        hits.is_empty(),
        "secret values leaked:\n{}",
        hits.join("\n")
    );
    env.stop().await;
}
