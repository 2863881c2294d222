//! Distributed provisioning (`--node-deployment`): one provisioner per node, each with the
//! node's own driver, racing for Immediate claims, provisioning late-binding claims of its node,
//! and deleting only the volumes of its node.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::common::{Env, WAIT, csi_client, eventually, mock, requests, unique};
use csi_proto::methods::controller::{CREATE_VOLUME, DELETE_VOLUME};
use external_provisioner::app;
use external_provisioner::journal::journal_name;
use external_provisioner::model::lease_name;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use std::process::Stdio;
use testkit::mockdriver::MockHandle;
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const NODE_KEY: &str = "topology.hostpath.csi/node";
const GIB: i64 = 1 << 30;

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");

/// A node: its driver and its provisioner process.
struct Node {
    name: String,
    mock: MockHandle,
    process: Child,
}

async fn start_node(env: &Env, name: &str, capacity: i64) -> Node {
    let mock = mock()
        .driver_name(env.driver.clone())
        .node_id(format!("id-{name}"))
        .topology_segment([(NODE_KEY, name)])
        .total_capacity(capacity)
        .serve_unix(env.dir.path().join(format!("{name}.sock")))
        .await
        .unwrap();
    let mut command = Command::new(BIN);
    command
        .clean_env()
        .arg(format!(
            "--kubeconfig={}",
            env.cluster.kubeconfig_path().display()
        ))
        .arg(format!("--csi-address={}", mock.socket_path().display()))
        .arg(format!("--leader-election-namespace={}", env.namespace()))
        .args([
            "--node-deployment",
            "--node-deployment-base-delay=50ms",
            "--node-deployment-max-delay=400ms",
            "--retry-interval-start=50ms",
            "--kube-api-qps=-1",
        ])
        .env("NODE_NAME", name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    testkit::process::die_with_parent(&mut command);
    Node {
        name: name.to_string(),
        mock,
        process: command.spawn().unwrap(),
    }
}

fn node_of(pv: &PersistentVolume) -> Option<String> {
    let terms = &pv
        .spec
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    let expression = terms.first()?.match_expressions.as_ref()?.first()?;
    (expression.key == NODE_KEY).then(|| expression.values.as_ref()?.first().cloned())?
}

#[tokio::test]
async fn nodes_race_for_immediate_claims_and_keep_to_their_own() {
    let mut env = Env::without_controller(mock()).await;
    // Room for every claim on each of the first two nodes, so that no claim is given back for
    // want of capacity and each is created exactly once.
    let nodes = vec![
        start_node(&env, &unique("n1"), 200 * GIB).await,
        start_node(&env, &unique("n2"), 200 * GIB).await,
        // Too small for any claim: it never takes one.
        start_node(&env, &unique("n3"), GIB / 2).await,
    ];
    let immediate = env.create_class(json!({})).await;
    let late = env
        .create_class(json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;

    const CLAIMS: usize = 100;
    let pvcs = env.pvcs();
    futures::stream::iter(0..CLAIMS)
        .map(|i| {
            let (pvcs, class) = (pvcs.clone(), immediate.clone());
            async move {
                let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": format!("c-{i}")},
                    "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}
                }))
                .unwrap();
                pvcs.create(&PostParams::default(), &pvc).await.unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    // A late-binding claim the scheduler put on the second node.
    env.create_claim(
        "late",
        &late,
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": nodes[1].name}}}),
    )
    .await;

    let deadline = std::time::Instant::now() + 4 * WAIT;
    let pvs = env.pvs();
    let bound = loop {
        let list = pvcs.list(&Default::default()).await.unwrap().items;
        let bound = list
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        if bound == CLAIMS + 1 {
            break list;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{bound} of {} claims bound",
            CLAIMS + 1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };

    // Each claim provisioned exactly once, by the node it selected, whose driver holds it.
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for claim in &bound {
        let selected =
            claim.metadata.annotations.as_ref().unwrap()["volume.kubernetes.io/selected-node"]
                .clone();
        let pv = pvs
            .get(claim.spec.as_ref().unwrap().volume_name.as_ref().unwrap())
            .await
            .unwrap();
        assert_eq!(node_of(&pv).as_deref(), Some(selected.as_str()));
        let node = nodes.iter().find(|n| n.name == selected).unwrap();
        let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
        assert!(
            node.mock.state().volumes.values().any(|v| v.id == handle),
            "the volume of {} is on {selected}",
            claim.metadata.name.as_deref().unwrap()
        );
        *per_node.entry(selected).or_default() += 1;
    }
    let created: usize = nodes
        .iter()
        .map(|n| requests(&n.mock, CREATE_VOLUME).len())
        .sum();
    assert_eq!(
        created,
        CLAIMS + 1,
        "one CreateVolume per claim: {per_node:?}"
    );
    let volumes: usize = nodes.iter().map(|n| n.mock.state().volumes.len()).sum();
    assert_eq!(volumes, CLAIMS + 1);
    assert!(
        !per_node.contains_key(&nodes[2].name),
        "the node without room took none: {per_node:?}"
    );
    // Each node records its intents in a journal of its own: a node's provisioner must never
    // take up what another node's began, with the wrong driver.
    let journals: kube::Api<Secret> = kube::Api::namespaced(env.client(), &env.namespace());
    for node in nodes.iter().filter(|n| per_node.contains_key(&n.name)) {
        let name = journal_name(&lease_name(&env.driver), Some(&node.name));
        assert!(
            journals.get_opt(&name).await.unwrap().is_some(),
            "{name} is missing"
        );
    }
    let late_claim = pvcs.get("late").await.unwrap();
    let late_pv = pvs
        .get(late_claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(node_of(&late_pv).as_deref(), Some(nodes[1].name.as_str()));

    // Deletion: each node deletes the volumes of its node only.
    futures::stream::iter(bound.iter().map(|c| c.metadata.name.clone().unwrap()))
        .map(|name| {
            let pvcs = pvcs.clone();
            async move { pvcs.delete(&name, &DeleteParams::default()).await.unwrap() }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    // The test's own PVs: a real cluster has others.
    let (pvs_left, driver) = (pvs.clone(), env.driver.clone());
    eventually("every PV deleted", || {
        let (pvs, driver) = (pvs_left.clone(), driver.clone());
        async move {
            let left = pvs.list(&Default::default()).await.unwrap().items;
            (!left.iter().any(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|csi| csi.driver == driver)
            }))
            .then_some(())
        }
    })
    .await;
    for node in &nodes {
        assert!(
            node.mock.state().volumes.is_empty(),
            "{} keeps volumes",
            node.name
        );
        let deleted: BTreeSet<String> = requests(&node.mock, DELETE_VOLUME)
            .iter()
            .map(|r| r["volume_id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            deleted.len(),
            per_node.get(&node.name).copied().unwrap_or(0),
            "{} deleted only its own volumes",
            node.name
        );
    }
    for mut node in nodes {
        node.process.start_kill().unwrap();
        tokio::time::timeout(WAIT, node.process.wait())
            .await
            .unwrap()
            .unwrap();
        node.mock.shutdown().await.unwrap();
    }
    env.stop().await;
}

#[tokio::test]
async fn node_deployment_reads_the_nodes_topology() {
    let env = Env::without_controller(mock()).await;
    let node = mock()
        .node_id("id-n1")
        .topology_segment([(NODE_KEY, "n1")])
        .serve_unix(env.dir.path().join("n1.sock"))
        .await
        .unwrap();
    let csi = csi_client(&node).await;
    let cli = crate::common::cli(&["--node-deployment"]);
    let mut config = env.config_for(&csi, &["--node-deployment"]).await;
    app::node_deployment(&cli, &csi, Some("n1".into()), &mut config)
        .await
        .unwrap();
    assert!(
        !config.watch_topology,
        "no Node and CSINode watches on nodes"
    );
    let policy = config.policy.node.unwrap();
    assert_eq!(policy.name, "n1");
    assert_eq!(
        policy.topology,
        Some([(NODE_KEY.to_string(), "n1".to_string())].into())
    );
    assert!(config.policy.identity.ends_with("-n1"));
    node.shutdown().await.unwrap();
    env.stop().await;
}

#[tokio::test]
async fn node_deployment_needs_the_node_name() {
    let env = Env::without_controller(mock()).await;
    let cli = crate::common::cli(&["--node-deployment"]);
    let mut config = env.config(&["--node-deployment"]).await;
    let err = app::node_deployment(&cli, &env.csi, None, &mut config)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "The NODE_NAME environment variable must be set when using --node-deployment."
    );
    env.stop().await;
}
