//! Capacity tracking (`--enable-capacity`) against the test cluster and the mock driver: the
//! objects and their fields, writes only on change, deletion when a class or a node goes away,
//! driver errors, adoption after a restart, owner references and the API version probe.

use std::time::Duration;

use crate::common::{DRIVER, Env, WAIT, cli, eventually, unique};
use csi_proto::methods::controller::GET_CAPACITY;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
use csi_proto::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability};
use external_provisioner::capacity::controller::{
    self as cap, Capacity, CapacityError, Environment, Settings,
};
use external_provisioner::capacity::{ApiVersion, DRIVER_NAME_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::csi::CallOptions;
use sidecar_kit::pipeline::workqueue::{Backoff, WorkQueueMetrics};
use testkit::apiserver::counters::Verb;
use testkit::apiserver::faults::RequestMatch;
use testkit::mockdriver::{Capabilities, MockDriver};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const KEY: &str = "topology.hostpath.csi/zone";
const GI: i64 = 1 << 30;

fn driver() -> MockDriver {
    MockDriver::builder()
        .driver_name(DRIVER)
        .capabilities(Capabilities {
            topology: true,
            ..Capabilities::default()
        })
        .topology_segment([(KEY, "a")])
        .topology_segment([(KEY, "b")])
        .total_capacity(100 * GI)
        .max_volume_size(10 * GI)
}

/// A Node in `zone` with the driver registered on it (topology key [`KEY`]).
async fn add_node(env: &Env, zone: &str) -> String {
    let name = env.unique(&format!("node-{zone}"));
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {KEY: zone}}})).unwrap();
    Api::<Node>::all(env.client())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let csinode: CSINode = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"drivers": [{"name": env.driver, "nodeID": name, "topologyKeys": [KEY]}]}}))
    .unwrap();
    Api::<CSINode>::all(env.client())
        .create(&PostParams::default(), &csinode)
        .await
        .unwrap();
    name
}

async fn remove_node(env: &Env, name: &str) {
    let _ = Api::<Node>::all(env.client())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<CSINode>::all(env.client())
        .delete(name, &DeleteParams::default())
        .await;
}

struct Running {
    capacity: Capacity,
    stop: CancellationToken,
    task: JoinHandle<()>,
    registry: prometheus::Registry,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("capacity controller stops")
            .unwrap();
    }

    fn gauge(&self, name: &str) -> Option<f64> {
        self.registry
            .gather()
            .into_iter()
            .find(|f| f.name() == name)
            .and_then(|f| f.get_metric().first().map(|m| m.get_gauge().get_value()))
    }

    fn counter_sum(&self, family: &str, queue: &str) -> f64 {
        self.registry
            .gather()
            .into_iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric().to_vec())
            .filter(|m| m.get_label().iter().any(|l| l.value() == queue))
            .map(|m| m.get_counter().get_value())
            .sum()
    }
}

async fn start(
    env: &Env,
    args: &[&str],
    environment: Environment,
) -> Result<Running, CapacityError> {
    start_with(env, args, environment, |s| s).await
}

async fn start_with(
    env: &Env,
    args: &[&str],
    environment: Environment,
    adjust: impl FnOnce(Settings) -> Settings,
) -> Result<Running, CapacityError> {
    let mut settings = adjust(Settings::from_cli(&cli(args), &env.driver));
    settings.backoff = Backoff {
        start: Duration::from_millis(50),
        max: Duration::from_millis(500),
    };
    let registry = prometheus::Registry::new();
    settings.wiring.queue_metrics = Some(WorkQueueMetrics::register(&registry).unwrap());
    let capacity = cap::prepare(
        settings,
        environment,
        env.client(),
        env.client(),
        env.csi.clone(),
        &registry,
    )
    .await?;
    let stop = CancellationToken::new();
    let task = {
        let capacity = capacity.clone();
        let stop = stop.clone();
        tokio::spawn(async move { capacity.run(stop).await })
    };
    Ok(Running {
        capacity,
        stop,
        task,
        registry,
    })
}

fn in_namespace(env: &Env) -> Environment {
    Environment {
        namespace: Some(env.namespace()),
        pod_name: None,
    }
}

fn objects_api(env: &Env) -> Api<CSIStorageCapacity> {
    Api::namespaced(env.client(), &env.namespace())
}

async fn objects(env: &Env) -> Vec<CSIStorageCapacity> {
    objects_api(env)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// Waits until exactly `n` objects exist and `check` holds for all of them.
async fn wait_objects(
    env: &Env,
    n: usize,
    what: &str,
    check: impl Fn(&CSIStorageCapacity) -> bool,
) -> Vec<CSIStorageCapacity> {
    eventually(what, || async {
        let list = objects(env).await;
        (list.len() == n && list.iter().all(&check)).then_some(list)
    })
    .await
}

fn zone_of(o: &CSIStorageCapacity) -> String {
    o.node_topology
        .as_ref()
        .and_then(|t| t.match_labels.as_ref())
        .and_then(|l| l.get(KEY).cloned())
        .unwrap_or_default()
}

fn capacity_of(o: &CSIStorageCapacity) -> String {
    o.capacity.as_ref().map(|q| q.0.clone()).unwrap_or_default()
}

/// Writes of CSIStorageCapacity objects seen by the in-process server.
fn writes(env: &Env) -> Option<u64> {
    let c = env.cluster.counters()?;
    Some(
        [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            .iter()
            .map(|v| c.total(*v, "csistoragecapacities"))
            .sum(),
    )
}

/// Waits until the driver has been asked `n` more times.
async fn wait_polls(env: &Env, n: u64) {
    let start = env.mock.calls().count(GET_CAPACITY);
    eventually(&format!("{n} more GetCapacity calls"), || async {
        (env.mock.calls().count(GET_CAPACITY) >= start + n).then_some(())
    })
    .await;
}

/// Takes `bytes` of the mock's pool with a volume.
async fn use_capacity(env: &Env, bytes: i64) {
    let cap = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    env.csi
        .create_volume(
            CreateVolumeRequest {
                name: unique("vol"),
                capacity_range: Some(CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap],
                ..Default::default()
            },
            CallOptions::timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
}

async fn late_class(env: &mut Env, parameters: Value) -> String {
    env.create_class(json!({"volumeBindingMode": "WaitForFirstConsumer", "parameters": parameters}))
        .await
}

#[tokio::test]
async fn objects_follow_classes_nodes_and_capacity() {
    let mut env = Env::without_controller(driver()).await;
    let node_a = add_node(&env, "a").await;
    let node_b = add_node(&env, "b").await;
    let class = late_class(
        &mut env,
        json!({"pool": "fast", "csi.storage.k8s.io/fstype": "ext4"}),
    )
    .await;
    let immediate = env
        .create_class(json!({"volumeBindingMode": "Immediate"}))
        .await;
    let running = start(
        &env,
        &[
            "--capacity-poll-interval=200ms",
            "--capacity-ownerref-level=-1",
        ],
        in_namespace(&env),
    )
    .await
    .unwrap();
    assert_eq!(running.capacity.api_version(), ApiVersion::V1);

    // One object per segment of the late-binding class, none for the immediate one.
    let list = wait_objects(&env, 2, "two objects", |o| capacity_of(o) == "100Gi").await;
    let mut zones: Vec<String> = list.iter().map(zone_of).collect();
    zones.sort();
    assert_eq!(zones, ["a", "b"]);
    for o in &list {
        let name = o.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("csisc-"), "{name}");
        assert_eq!(o.metadata.generate_name.as_deref(), Some("csisc-"));
        let labels = o.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get(DRIVER_NAME_LABEL), Some(&env.driver));
        assert_eq!(
            labels.get(MANAGED_BY_LABEL).map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(o.storage_class_name, class);
        assert_ne!(o.storage_class_name, immediate);
        assert_eq!(
            o.maximum_volume_size.as_ref().map(|q| q.0.as_str()),
            Some("10Gi")
        );
        assert!(o.metadata.owner_references.is_none(), "level -1: no owner");
    }
    // GetCapacity gets the class parameters as they are and the segment.
    let request: Value =
        serde_json::from_str(&env.mock.calls().of(GET_CAPACITY)[0].request).unwrap();
    assert_eq!(request["parameters"]["csi.storage.k8s.io/fstype"], "ext4");
    assert_eq!(request["parameters"]["pool"], "fast");
    assert!(request["accessible_topology"]["segments"][KEY].is_string());

    // Polls without change write nothing.
    if let Some(counters) = env.cluster.counters() {
        counters.reset();
        wait_polls(&env, 6).await;
        assert_eq!(writes(&env), Some(0), "polls without change write nothing");
    } else {
        eprintln!("write counts need the in-process API server; not checked on a real cluster");
    }
    assert_eq!(
        running.gauge("csistoragecapacities_desired_goal"),
        Some(2.0)
    );
    assert_eq!(
        running.gauge("csistoragecapacities_desired_current"),
        Some(2.0)
    );
    assert_eq!(running.gauge("csistoragecapacities_obsolete"), Some(0.0));

    // Less capacity: each object is written once.
    if let Some(counters) = env.cluster.counters() {
        counters.reset();
    }
    use_capacity(&env, 4 * GI).await;
    wait_objects(&env, 2, "capacity 96Gi", |o| capacity_of(o) == "96Gi").await;
    wait_polls(&env, 4).await;
    if let Some(c) = env.cluster.counters() {
        assert_eq!(c.total(Verb::Patch, "csistoragecapacities"), 2);
        assert_eq!(writes(&env), Some(2));
    }

    // A node goes: its segment's object goes.
    remove_node(&env, &node_b).await;
    wait_objects(&env, 1, "only zone a left", |o| zone_of(o) == "a").await;

    // The class goes: all of its objects go.
    Api::<StorageClass>::all(env.client())
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    wait_objects(&env, 0, "no object left", |_| true).await;
    assert_eq!(
        running.gauge("csistoragecapacities_desired_goal"),
        Some(0.0)
    );
    assert!(running.counter_sum("workqueue_adds_total", "csistoragecapacity") > 0.0);

    running.stop().await;
    remove_node(&env, &node_a).await;
    env.stop().await;
}

#[tokio::test]
async fn immediate_classes_with_the_flag() {
    let mut env = Env::without_controller(driver()).await;
    let node = add_node(&env, "a").await;
    let immediate = env
        .create_class(json!({"volumeBindingMode": "Immediate"}))
        .await;
    let running = start(
        &env,
        &[
            "--capacity-for-immediate-binding",
            "--capacity-ownerref-level=-1",
        ],
        in_namespace(&env),
    )
    .await
    .unwrap();
    let list = wait_objects(&env, 1, "the immediate class's object", |_| true).await;
    assert_eq!(list[0].storage_class_name, immediate);
    running.stop().await;
    remove_node(&env, &node).await;
    env.stop().await;
}

#[tokio::test]
async fn driver_errors_keep_objects_and_are_retried() {
    let mut env = Env::without_controller(driver()).await;
    let node = add_node(&env, "a").await;
    late_class(&mut env, json!({})).await;
    let running = start(
        &env,
        &[
            "--capacity-poll-interval=200ms",
            "--capacity-ownerref-level=-1",
        ],
        in_namespace(&env),
    )
    .await
    .unwrap();
    let before = wait_objects(&env, 1, "one object", |o| capacity_of(o) == "100Gi").await;

    env.mock
        .faults()
        .fail_always(GET_CAPACITY, Code::Internal, "pool offline");
    use_capacity(&env, GI).await;
    wait_polls(&env, 5).await;
    let during = objects(&env).await;
    assert_eq!(during.len(), 1, "a failing driver deletes nothing");
    assert_eq!(during[0].metadata.name, before[0].metadata.name);
    assert_eq!(capacity_of(&during[0]), "100Gi");
    assert!(running.counter_sum("workqueue_retries_total", "csistoragecapacity") > 0.0);

    env.mock.faults().clear_failures(GET_CAPACITY);
    let after = wait_objects(&env, 1, "the object updated", |o| capacity_of(o) == "99Gi").await;
    assert_eq!(after[0].metadata.name, before[0].metadata.name);

    running.stop().await;
    remove_node(&env, &node).await;
    env.stop().await;
}

#[tokio::test]
async fn restart_adopts_existing_objects() {
    let mut env = Env::without_controller(driver()).await;
    let node_a = add_node(&env, "a").await;
    let node_b = add_node(&env, "b").await;
    late_class(&mut env, json!({})).await;
    let args = [
        "--capacity-poll-interval=200ms",
        "--capacity-ownerref-level=-1",
    ];
    let first = start(&env, &args, in_namespace(&env)).await.unwrap();
    let before = wait_objects(&env, 2, "two objects", |_| true).await;
    first.stop().await;

    if let Some(c) = env.cluster.counters() {
        c.reset();
    }
    let second = start(&env, &args, in_namespace(&env)).await.unwrap();
    wait_polls(&env, 6).await;
    let after = objects(&env).await;
    let names = |l: &[CSIStorageCapacity]| {
        let mut n: Vec<_> = l.iter().map(|o| o.metadata.name.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&after), names(&before), "the same objects");
    let versions = |l: &[CSIStorageCapacity]| {
        let mut n: Vec<_> = l
            .iter()
            .map(|o| o.metadata.resource_version.clone())
            .collect();
        n.sort();
        n
    };
    assert_eq!(versions(&after), versions(&before), "not rewritten");
    if let Some(c) = env.cluster.counters() {
        // The one create is the start-up probe's invalid object, refused.
        assert_eq!(c.total(Verb::Create, "csistoragecapacities"), 1);
        assert_eq!(writes(&env), Some(1));
    }
    second.stop().await;
    remove_node(&env, &node_a).await;
    remove_node(&env, &node_b).await;
    env.stop().await;
}

/// A Deployment → ReplicaSet → Pod chain in the test namespace; returns the pod's name and the
/// UIDs of the pod, the ReplicaSet and the Deployment.
async fn owner_chain(env: &Env) -> (String, [String; 3]) {
    let ns = env.namespace();
    let create = |api_version: &str, kind: &str, plural: &str, body: Value| {
        let client = env.client();
        let ns = ns.clone();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let ar = kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(group, version, kind),
            plural,
        );
        async move {
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, &ns, &ar);
            let obj: kube::api::DynamicObject = serde_json::from_value(body).unwrap();
            api.create(&PostParams::default(), &obj)
                .await
                .unwrap()
                .metadata
                .uid
                .unwrap()
        }
    };
    let selector = json!({"matchLabels": {"app": "prov"}});
    let template = json!({"metadata": {"labels": {"app": "prov"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let dep = create(
        "apps/v1",
        "Deployment",
        "deployments",
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "prov"},
            "spec": {"selector": selector, "template": template}}),
    )
    .await;
    let rs = create(
        "apps/v1",
        "ReplicaSet",
        "replicasets",
        json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "prov-5d9",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "prov",
                "uid": dep, "controller": true}]},
            "spec": {"selector": selector, "template": template}}),
    )
    .await;
    let pod = create(
        "v1",
        "Pod",
        "pods",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prov-5d9-x",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "prov-5d9",
                "uid": rs, "controller": true}]},
            "spec": {"containers": [{"name": "c", "image": "i"}]}}),
    )
    .await;
    ("prov-5d9-x".to_string(), [pod, rs, dep])
}

#[tokio::test]
async fn owner_references_at_each_level() {
    let mut env = Env::without_controller(driver()).await;
    if env.cluster.is_real() {
        eprintln!("skipping: creates a Deployment chain that real controllers would act on");
        env.stop().await;
        return;
    }
    let (pod, [pod_uid, rs_uid, dep_uid]) = owner_chain(&env).await;
    let client = env.client();
    let ns = env.namespace();
    assert!(
        cap::owner_reference(&client, &ns, &pod, -1)
            .await
            .unwrap()
            .is_none()
    );
    let o = cap::owner_reference(&client, &ns, &pod, 0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.uid.as_str()),
        ("v1", "Pod", pod_uid.as_str())
    );
    let o = cap::owner_reference(&client, &ns, &pod, 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (o.kind.as_str(), o.name.as_str(), o.uid.as_str()),
        ("ReplicaSet", "prov-5d9", rs_uid.as_str())
    );
    let o = cap::owner_reference(&client, &ns, &pod, 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.uid.as_str()),
        ("apps/v1", "Deployment", dep_uid.as_str())
    );
    let err = cap::owner_reference(&client, &ns, &pod, 3)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("has no controlling owner"),
        "{err}"
    );

    // Missing environment: clear errors naming the variables.
    let err = start(&env, &[], Environment::default())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("NAMESPACE"), "{err}");
    let err = start(&env, &[], in_namespace(&env)).await.err().unwrap();
    assert!(err.to_string().contains("POD_NAME"), "{err}");

    // Level 2: the objects belong to the Deployment.
    let node = add_node(&env, "a").await;
    late_class(&mut env, json!({})).await;
    let running = start(
        &env,
        &["--capacity-ownerref-level=2"],
        Environment {
            namespace: Some(ns.clone()),
            pod_name: Some(pod.clone()),
        },
    )
    .await
    .unwrap();
    let list = wait_objects(&env, 1, "one object", |_| true).await;
    let owners = list[0].metadata.owner_references.clone().unwrap();
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].uid, dep_uid);
    assert_eq!(owners[0].kind, "Deployment");
    assert_eq!(owners[0].controller, Some(true));
    running.stop().await;
    remove_node(&env, &node).await;
    env.stop().await;
}

#[tokio::test]
async fn api_version_probe() {
    let env = Env::without_controller(driver()).await;
    let client = env.client();
    let ns = env.namespace();
    assert_eq!(
        cap::probe_api_version(&client, &ns).await.unwrap(),
        ApiVersion::V1
    );
    let Some(faults) = env.cluster.faults() else {
        eprintln!("skipping the v1beta1 fallback: it needs the in-process API server's faults");
        env.stop().await;
        return;
    };
    // A cluster without storage.k8s.io/v1 CSIStorageCapacity answers NotFound.
    faults.fail_next(
        RequestMatch::new(Verb::Create, "csistoragecapacities"),
        1,
        404,
    );
    assert_eq!(
        cap::probe_api_version(&client, &ns).await.unwrap(),
        ApiVersion::V1beta1
    );
    faults.fail_next(
        RequestMatch::new(Verb::Create, "csistoragecapacities"),
        1,
        403,
    );
    assert!(cap::probe_api_version(&client, &ns).await.is_err());
    env.stop().await;
}

#[tokio::test]
async fn distributed_provisioning_publishes_this_nodes_segment() {
    let mut env = Env::without_controller(driver()).await;
    let class = late_class(&mut env, json!({})).await;
    let zone: std::collections::BTreeMap<String, String> =
        [(KEY.to_string(), "b".to_string())].into();
    let running = start_with(
        &env,
        &["--capacity-ownerref-level=-1"],
        in_namespace(&env),
        |s| s.for_node("node-1", Some(&zone)),
    )
    .await
    .unwrap();
    // No Node or CSINode exists: the segment is the node's own.
    let list = wait_objects(&env, 1, "this node's object", |_| true).await;
    assert_eq!(zone_of(&list[0]), "b");
    assert_eq!(list[0].storage_class_name, class);
    let labels = list[0].metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get(MANAGED_BY_LABEL).map(String::as_str),
        Some("external-provisioner-node-1")
    );
    running.stop().await;
    env.stop().await;
}

#[tokio::test]
async fn provisioning_refreshes_the_capacity_of_its_segment() {
    let mut env = Env::without_controller(driver()).await;
    let node_a = add_node(&env, "a").await;
    let node_b = add_node(&env, "b").await;
    let class = late_class(&mut env, json!({})).await;
    // Polled once an hour: only the provisioning can make the capacity move in this test.
    let running = start(
        &env,
        &[
            "--capacity-poll-interval=1h",
            "--capacity-ownerref-level=-1",
        ],
        in_namespace(&env),
    )
    .await
    .unwrap();
    wait_objects(&env, 2, "both zones at 100Gi", |o| {
        capacity_of(o) == "100Gi"
    })
    .await;

    let mut config = env.config(&[]).await;
    config.capacity = Some(running.capacity.handle());
    env.launch(config);
    env.create_claim(
        "data",
        &class,
        json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node_a}}}),
    )
    .await;
    env.wait_bound("data").await;
    // The volume's zone is read again; the other zone waits for its poll.
    wait_objects(&env, 2, "zone a at 99Gi, zone b unchanged", |o| {
        capacity_of(o) == if zone_of(o) == "a" { "99Gi" } else { "100Gi" }
    })
    .await;
    running.stop().await;
    remove_node(&env, &node_a).await;
    remove_node(&env, &node_b).await;
    env.stop().await;
}
