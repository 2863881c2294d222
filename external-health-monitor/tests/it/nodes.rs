//! The node watcher: the claims of pods on a node that failed get `NodeFailed`, and
//! `NodeRecovered` when it is Ready again; a deleted node is a failed one (upstream's process
//! crashes on it).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::common::*;

fn ready(status: &str, minutes_ago: i64) -> serde_json::Value {
    let since = k8s_openapi::jiff::Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_mins(minutes_ago))
        .unwrap();
    json!({"status": {"conditions": [{"type": "Ready", "status": status,
        "reason": "Test", "lastHeartbeatTime": since.to_string(),
        "lastTransitionTime": since.to_string()}]}})
}

async fn node(env: &Env, name: &str) {
    let mut node = json!({"metadata": {"name": name}});
    node["status"] = ready("True", 0)["status"].clone();
    Api::<Node>::all(env.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(node).unwrap(),
        )
        .await
        .unwrap();
}

async fn set_ready(env: &Env, name: &str, status: &str, minutes_ago: i64) {
    Api::<Node>::all(env.client())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(&ready(status, minutes_ago)),
        )
        .await
        .unwrap();
}

async fn pod(env: &Env, name: &str, node: &str, claim: &str) {
    let pod = json!({
        "metadata": {"name": name, "namespace": env.ns()},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "none"}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
    });
    Api::<Pod>::namespaced(env.client(), env.ns())
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_failed_node_and_its_recovery_are_reported_on_the_claims_of_its_pods() {
    let mut env = Env::start(mock(true), |config| config.node_watcher = true).await;
    let (n1, n2) = (env.n("node-1"), env.n("node-2"));
    env.bound_claim("data").await;
    env.bound_claim("logs").await;
    node(&env, &n1).await;
    node(&env, &n2).await;
    pod(&env, "web-b", &n1, "data").await;
    pod(&env, "web-a", &n1, "data").await;
    pod(&env, "other", &n2, "logs").await;

    // NotReady for ten minutes: failed at once.
    set_ready(&env, &n1, "False", 10).await;
    let failed = format!(
        "Pods: [ web-a web-b ] consuming PVC: data in namespace: {} are now on a failed node: {n1}",
        env.ns()
    );
    env.events_until("data", "NodeFailed", |events| {
        events.iter().any(|(kind, reason, message, _)| {
            kind == "Warning" && reason == "NodeFailed" && *message == failed
        })
    })
    .await;
    set_ready(&env, &n1, "True", 0).await;
    let recovered = format!("Node: {n1} recovered");
    env.events_until("data", "NodeRecovered", |events| {
        events.iter().any(|(kind, reason, message, _)| {
            kind == "Warning" && reason == "NodeRecovered" && *message == recovered
        })
    })
    .await;
    assert!(env.events("logs").await.is_empty(), "node-2 did not fail");

    // A node deleted with its pods still there: their claims are reported, and the watcher
    // goes on.
    Api::<Node>::all(env.client())
        .delete(&n2, &DeleteParams::default())
        .await
        .unwrap();
    env.events_until("logs", "NodeFailed for the deleted node", |events| {
        events.iter().any(|(_, reason, message, _)| {
            reason == "NodeFailed" && message.ends_with(&format!("failed node: {n2}"))
        })
    })
    .await;
    let recoveries = env.events("data").await.len();
    set_ready(&env, &n1, "False", 10).await;
    env.events_until("data", "node-1 failing again", |events| {
        events.len() > recoveries
            || events
                .iter()
                .any(|(_, r, _, c)| r == "NodeFailed" && *c >= 2)
    })
    .await;
    env.stop().await;
    Api::<Node>::all(env.client())
        .delete(&n1, &DeleteParams::default())
        .await
        .unwrap();
}
