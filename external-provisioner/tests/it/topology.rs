//! Topology end to end: Nodes and CSINodes in the cluster, a mock driver with zones, and each
//! binding mode.

use crate::common::{Env, eventually, mock, requests, unique};
use csi_proto::methods::controller::CREATE_VOLUME;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use tonic::Code;

struct Zones {
    key: String,
    nodes: Vec<String>,
}

/// Three nodes in zones a, b and c, with the driver registered on each; a fourth node in zone a
/// without the driver.
async fn make_zones(env: &Env, key: &str) -> Zones {
    let mut nodes = Vec::new();
    for (i, zone) in ["a", "b", "c", "a"].iter().enumerate() {
        let name = env.unique(&format!("node-{zone}"));
        let node: Node =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {key: zone}}}))
                .unwrap();
        Api::<Node>::all(env.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let drivers = if i < 3 {
            json!([{"name": env.driver, "nodeID": name, "topologyKeys": [key]}])
        } else {
            json!([])
        };
        let csinode: CSINode = serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}),
        )
        .unwrap();
        Api::<CSINode>::all(env.client())
            .create(&PostParams::default(), &csinode)
            .await
            .unwrap();
        nodes.push(name);
    }
    Zones {
        key: key.to_string(),
        nodes,
    }
}

impl Zones {
    async fn remove(&self, env: &Env) {
        for name in &self.nodes {
            let _ = Api::<Node>::all(env.client())
                .delete(name, &DeleteParams::default())
                .await;
            let _ = Api::<CSINode>::all(env.client())
                .delete(name, &DeleteParams::default())
                .await;
        }
    }
}

fn zones_of(list: &Value, key: &str) -> Vec<String> {
    list.as_array()
        .map(|segments| {
            segments
                .iter()
                .map(|s| s["segments"][key].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn affinity_zone(pv: &PersistentVolume) -> String {
    let terms = &pv
        .spec
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms;
    terms[0].match_expressions.as_ref().unwrap()[0]
        .values
        .as_ref()
        .unwrap()[0]
        .clone()
}

/// A mock driver with zones a, b and c, the provisioner, and the nodes.
async fn env_with_zones(args: &[&str]) -> (Env, Zones) {
    let key = format!("{}.example.com/zone", unique("z"));
    let driver = mock()
        .topology_segment([(key.clone(), "a")])
        .topology_segment([(key.clone(), "b")])
        .topology_segment([(key.clone(), "c")]);
    let env = Env::start(driver, args, |_| {}).await;
    let zones = make_zones(&env, &key).await;
    (env, zones)
}

#[tokio::test]
async fn immediate_binding_offers_every_zone_with_nodes() {
    let (mut env, zones) = env_with_zones(&[]).await;
    let class = env.create_class(json!({})).await;
    env.create_claim("data", &class, json!({})).await;
    env.wait_bound("data").await;
    let request = requests(&env.mock, CREATE_VOLUME).pop().unwrap();
    let requirements = &request["accessibility_requirements"];
    let mut requisite = zones_of(&requirements["requisite"], &zones.key);
    requisite.sort();
    assert_eq!(requisite, ["a", "b", "c"], "{request}");
    assert_eq!(zones_of(&requirements["preferred"], &zones.key).len(), 3);
    zones.remove(&env).await;
    env.stop().await;
}

async fn late_binding(args: &[&str]) -> (Env, Zones, Value, PersistentVolume) {
    let (mut env, zones) = env_with_zones(args).await;
    let class = env
        .create_class(json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let node_b = zones.nodes[1].clone();
    env.create_claim(
        "data",
        &class,
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node_b}}}),
    )
    .await;
    let pv = env.wait_bound("data").await;
    let request = requests(&env.mock, CREATE_VOLUME).pop().unwrap();
    (env, zones, request, pv)
}

#[tokio::test]
async fn late_binding_prefers_the_selected_nodes_zone() {
    let (env, zones, request, pv) = late_binding(&[]).await;
    let requirements = &request["accessibility_requirements"];
    let mut requisite = zones_of(&requirements["requisite"], &zones.key);
    requisite.sort();
    assert_eq!(requisite, ["a", "b", "c"]);
    assert_eq!(zones_of(&requirements["preferred"], &zones.key)[0], "b");
    assert_eq!(affinity_zone(&pv), "b");
    zones.remove(&env).await;
    env.stop().await;
}

#[tokio::test]
async fn strict_topology_asks_for_the_selected_nodes_zone_only() {
    let (env, zones, request, pv) = late_binding(&["--strict-topology"]).await;
    let requirements = &request["accessibility_requirements"];
    assert_eq!(zones_of(&requirements["requisite"], &zones.key), ["b"]);
    assert_eq!(zones_of(&requirements["preferred"], &zones.key), ["b"]);
    assert_eq!(affinity_zone(&pv), "b");
    zones.remove(&env).await;
    env.stop().await;
}

#[tokio::test]
async fn allowed_topologies_restrict_the_zones() {
    let (mut env, zones) = env_with_zones(&[]).await;
    let class = env
        .create_class(json!({"allowedTopologies": [{"matchLabelExpressions": [{"key": zones.key, "values": ["c"]}]}]}))
        .await;
    env.create_claim("data", &class, json!({})).await;
    let pv = env.wait_bound("data").await;
    let request = requests(&env.mock, CREATE_VOLUME).pop().unwrap();
    assert_eq!(
        zones_of(
            &request["accessibility_requirements"]["requisite"],
            &zones.key
        ),
        ["c"]
    );
    assert_eq!(affinity_zone(&pv), "c");
    zones.remove(&env).await;
    env.stop().await;
}

async fn wait_unselected(env: &Env, claim: &str) {
    let pvcs = env.pvcs();
    eventually("the selected node removed", || {
        let pvcs = pvcs.clone();
        let claim = claim.to_string();
        async move {
            let pvc = pvcs.get(&claim).await.unwrap();
            let annotations = pvc.metadata.annotations.unwrap_or_default();
            (!annotations.contains_key("volume.kubernetes.io/selected-node")).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_selected_node_without_csinode_is_rescheduled() {
    let (mut env, zones) = env_with_zones(&[]).await;
    let class = env
        .create_class(json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let ghost = unique("ghost-node");
    env.create_claim(
        "data",
        &class,
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": ghost}}}),
    )
    .await;
    env.wait_event("data", "ProvisioningFailed", "not found")
        .await;
    wait_unselected(&env, "data").await;
    assert!(requests(&env.mock, CREATE_VOLUME).is_empty());
    zones.remove(&env).await;
    env.stop().await;
}

#[tokio::test]
async fn resource_exhausted_on_the_selected_node_is_rescheduled() {
    let (mut env, zones) = env_with_zones(&[]).await;
    env.mock
        .faults()
        .fail_next(CREATE_VOLUME, 1, Code::ResourceExhausted, "zone b is full");
    let class = env
        .create_class(json!({"volumeBindingMode": "WaitForFirstConsumer"}))
        .await;
    let node_b = zones.nodes[1].clone();
    env.create_claim(
        "data",
        &class,
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node_b}}}),
    )
    .await;
    env.wait_event(
        "data",
        "ProvisioningFailed",
        "rpc error: code = ResourceExhausted desc = zone b is full",
    )
    .await;
    wait_unselected(&env, "data").await;
    assert_eq!(
        requests(&env.mock, CREATE_VOLUME).len(),
        1,
        "no retry until the scheduler picks a node again"
    );
    zones.remove(&env).await;
    env.stop().await;
}
