//! The fault suite. Two replicas each of the provisioner, the attacher, the resizer and the
//! snapshotter and one all-in-one replica running all four on the same Leases (the real binary,
//! with leader election) run against the test kit's API server
//! (with its PV and snapshot controllers) and the mock driver while a seeded workload creates,
//! attaches, detaches, grows, re-classes, snapshots and deletes claims and deletes snapshots, and
//! faults are injected at
//! random moments: kill -9 of any replica (the suite restarts it, as the kubelet would), the
//! current leader killed in the middle of a batch, driver latency beyond `--timeout`, hung
//! calls, transient gRPC codes, volumes created but answered DeadlineExceeded, driver restarts
//! (socket gone and back), failed API writes (500, 409, 429 with Retry-After), closed watches,
//! compacted history (410) and the API server unreachable for seconds.
//!
//! Then, with faults off, everything must converge within a bounded time: the driver's volumes
//! and the PVs name each other one to one, every claim the workload keeps is Bound, nothing is
//! stuck with a finalizer, every VolumeAttachment's attached state is the driver's publish
//! state, every claim's requested size is the PV's and the driver's with no expansion left in
//! the controller, every claim's VolumeAttributesClass is its PV's and current, the driver's
//! snapshots and the VolumeSnapshotContents name each other one to one (no leaked snapshot),
//! every kept VolumeSnapshot is ready and every deleted one gone. Each run prints its seed and a
//! one-line verdict.
//!
//!   FAULT_SEED=N      replays a run
//!   FAULT_ROUNDS=N    rounds of operations and faults (default 40; a long run: 400)
//!   FAULT_CONVERGE=S  seconds allowed to converge (default 120)
//!   FAULT_KEEP=1      keeps the replicas' logs, the driver's state and the objects of a run that fails

#![cfg(target_os = "linux")]

mod driver;
mod replicas;
mod verdict;
mod workload;

use std::collections::BTreeMap;

use sidecar_kit::cluster::leader::sanitize_name;
use std::time::{Duration, Instant};

use csi_proto::methods::controller::{
    CONTROLLER_EXPAND_VOLUME, CONTROLLER_MODIFY_VOLUME, CONTROLLER_PUBLISH_VOLUME,
    CONTROLLER_UNPUBLISH_VOLUME, CREATE_SNAPSHOT, CREATE_VOLUME, DELETE_SNAPSHOT, DELETE_VOLUME,
};
use csi_proto::methods::group_controller::{
    CREATE_VOLUME_GROUP_SNAPSHOT, DELETE_VOLUME_GROUP_SNAPSHOT, GET_VOLUME_GROUP_SNAPSHOT,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use serde_json::json;
use testkit::apiserver::{ApiError, Faults as ApiFaults, Options, RequestMatch, TestCluster, Verb};
use testkit::rng::{Rng, count_from_env, seed_from_env};
use tonic::Code;

use driver::Driver;
use replicas::{Launch, Replica, Sidecar};
use verdict::{
    ContentView, DriverVolume, GroupContentView, PvView, PvcView, Snapshot, VaView,
    VolumeSnapshotView, judge,
};
use workload::{SnapshotClasses, Workload};

const DRIVER: &str = "faults.csi.example.com";
const NODES: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Kill,
    LeaderFailover,
    DriverLatency,
    DriverHang,
    DriverTransientCode,
    DriverLostAnswer,
    DriverRestart,
    ApiWriteError,
    ApiWatchClose,
    ApiCompaction,
    ApiUnreachable,
}

/// Something a fault undoes later.
enum Restore {
    Replica(usize),
    DriverUp,
    DriverLatency(&'static str),
    DriverRelease(&'static str),
}

const METHODS: [&str; 11] = [
    CREATE_VOLUME,
    DELETE_VOLUME,
    CONTROLLER_PUBLISH_VOLUME,
    CONTROLLER_UNPUBLISH_VOLUME,
    CONTROLLER_EXPAND_VOLUME,
    CONTROLLER_MODIFY_VOLUME,
    CREATE_SNAPSHOT,
    DELETE_SNAPSHOT,
    CREATE_VOLUME_GROUP_SNAPSHOT,
    GET_VOLUME_GROUP_SNAPSHOT,
    DELETE_VOLUME_GROUP_SNAPSHOT,
];

fn group_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("groupsnapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

/// The codes upstream's sidecars treat as "may still be in progress".
const TRANSIENT: [Code; 5] = [
    Code::Cancelled,
    Code::DeadlineExceeded,
    Code::Unavailable,
    Code::ResourceExhausted,
    Code::Aborted,
];

/// Writes the sidecars make (and the workload does not): where API failures are injected.
fn sidecar_writes() -> [RequestMatch; 10] {
    [
        RequestMatch::new(Verb::Patch, "volumesnapshotcontents"),
        RequestMatch::new(Verb::Update, "configmaps"),
        RequestMatch::new(Verb::Create, "persistentvolumes"),
        RequestMatch::new(Verb::Delete, "persistentvolumes"),
        RequestMatch::new(Verb::Patch, "persistentvolumes"),
        RequestMatch::new(Verb::Patch, "persistentvolumeclaims"),
        RequestMatch::new(Verb::Update, "persistentvolumeclaims"),
        RequestMatch::new(Verb::Patch, "volumeattachments"),
        RequestMatch::new(Verb::Update, "leases"),
        RequestMatch::new(Verb::Create, "events"),
    ]
}

struct Suite {
    rng: Rng,
    cluster: TestCluster,
    api: Option<ApiFaults>,
    driver: Driver,
    launch: Launch,
    replicas: Vec<Replica>,
    workload: Workload,
    restores: Vec<(Instant, Restore)>,
    faults: BTreeMap<Fault, u64>,
    kills: u64,
    /// The driver's name as Lease names carry it.
    lease_driver: String,
    _dir: tempfile::TempDir,
}

impl Suite {
    async fn start(seed: u64) -> Self {
        let cluster = TestCluster::start_with(Options {
            pv_controller: true,
            snapshot_controller: true,
            ..Options::default()
        })
        .await
        .expect("a test cluster");
        let client = cluster.client();
        let namespace = cluster.namespace().to_string();
        let driver_name = if cluster.is_real() {
            format!("{namespace}.{DRIVER}")
        } else {
            DRIVER.to_string()
        };
        let dir = tempfile::tempdir().expect("a temporary directory");
        let driver = Driver::start(&driver_name, dir.path()).await;
        let class = cluster.cluster_name("faults");
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class},
            "provisioner": driver_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": true,
        }))
        .expect("a valid StorageClass");
        Api::<StorageClass>::all(client.clone())
            .create(&PostParams::default(), &sc)
            .await
            .expect("the StorageClass is created");
        let mut classes = Vec::new();
        for (base, iops) in [("faults-gold", "3000"), ("faults-silver", "1000")] {
            let name = cluster.cluster_name(base);
            let vac: VolumeAttributesClass = serde_json::from_value(json!({
                "metadata": {"name": name},
                "driverName": driver_name,
                "parameters": {"iops": iops},
            }))
            .expect("a valid VolumeAttributesClass");
            Api::<VolumeAttributesClass>::all(client.clone())
                .create(&PostParams::default(), &vac)
                .await
                .expect("the VolumeAttributesClass is created");
            classes.push(name);
        }
        let snapshot_class = cluster.cluster_name("faults-snap");
        let class_object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": snapshot_class},
            "driver": driver_name, "deletionPolicy": "Delete",
        }))
        .expect("a valid VolumeSnapshotClass");
        Api::<DynamicObject>::all_with(
            client.clone(),
            &snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses"),
        )
        .create(&PostParams::default(), &class_object)
        .await
        .expect("the VolumeSnapshotClass is created");
        let group_class = cluster.cluster_name("faults-group");
        let class_object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass",
            "metadata": {"name": group_class},
            "driver": driver_name, "deletionPolicy": "Delete",
        }))
        .expect("a valid VolumeGroupSnapshotClass");
        Api::<DynamicObject>::all_with(
            client.clone(),
            &group_resource("VolumeGroupSnapshotClass", "volumegroupsnapshotclasses"),
        )
        .create(&PostParams::default(), &class_object)
        .await
        .expect("the VolumeGroupSnapshotClass is created");
        let mut nodes = BTreeMap::new();
        for i in 0..NODES {
            let node = cluster.cluster_name(&format!("node-{i}"));
            let csinode: CSINode = serde_json::from_value(json!({
                "metadata": {"name": node},
                "spec": {"drivers": [{"name": driver_name, "nodeID": format!("node-id-{i}")}]},
            }))
            .expect("a valid CSINode");
            Api::<CSINode>::all(client.clone())
                .create(&PostParams::default(), &csinode)
                .await
                .expect("the CSINode is created");
            nodes.insert(node, format!("node-id-{i}"));
        }
        let launch = Launch {
            kubeconfig: cluster.kubeconfig_path().to_owned(),
            csi_address: driver.endpoint(),
            namespace: namespace.clone(),
            log_dir: dir.path().to_owned(),
        };
        let mut replicas = vec![
            Replica::new(Sidecar::Provisioner, "csi-provisioner-a", &launch),
            Replica::new(Sidecar::Provisioner, "csi-provisioner-b", &launch),
            Replica::new(Sidecar::Attacher, "csi-attacher-a", &launch),
            Replica::new(Sidecar::Attacher, "csi-attacher-b", &launch),
            Replica::new(Sidecar::Resizer, "csi-resizer-a", &launch),
            Replica::new(Sidecar::Resizer, "csi-resizer-b", &launch),
            Replica::new(Sidecar::Snapshotter, "csi-snapshotter-a", &launch),
            Replica::new(Sidecar::Snapshotter, "csi-snapshotter-b", &launch),
            // kill -9 of it stops every controller at once.
            Replica::new(Sidecar::AllInOne, "csi-sidecars-c", &launch),
        ];
        for replica in &mut replicas {
            replica.start(&launch).expect("the sidecar starts");
        }
        let groups = cluster.handles_group_snapshots().await;
        if !groups {
            println!(
                "the cluster's snapshot-controller does not handle VolumeGroupSnapshots (start it \
                 with --feature-gates=CSIVolumeGroupSnapshot=true): no group snapshots this run"
            );
        }
        let workload = Workload::new(
            client,
            &namespace,
            &class,
            &driver_name,
            nodes,
            classes,
            SnapshotClasses {
                single: &snapshot_class,
                group: groups.then_some(group_class.as_str()),
            },
        );
        if cluster.is_real() {
            println!("on a real cluster: API faults are not injected");
        }
        Self {
            rng: Rng::new(seed),
            api: cluster.faults(),
            cluster,
            driver,
            launch,
            replicas,
            workload,
            restores: Vec::new(),
            faults: BTreeMap::new(),
            kills: 0,
            lease_driver: sanitize_name(&driver_name),
            _dir: dir,
        }
    }

    fn later(&mut self, low_ms: u64, high_ms: u64, restore: Restore) {
        let delay = Duration::from_millis(self.rng.between(low_ms, high_ms));
        self.restores.push((Instant::now() + delay, restore));
    }

    async fn kill(&mut self, index: usize) {
        self.replicas[index].kill().await;
        self.kills += 1;
        self.later(0, 1500, Restore::Replica(index));
    }

    /// The replica that holds `sidecar`'s Lease, if one does.
    async fn leader(&self, sidecar: Sidecar) -> Option<usize> {
        let leases: Api<Lease> = Api::namespaced(self.cluster.client(), self.cluster.namespace());
        let lease = sidecar.lease(&self.lease_driver);
        let holder = leases.get_opt(&lease).await.ok()??.spec?.holder_identity?;
        (0..self.replicas.len()).find(|i| {
            let r = &self.replicas[*i];
            r.sidecar.runs(sidecar) && r.is_running() && r.name == holder
        })
    }

    async fn inject(&mut self, fault: Fault) {
        let method = *self.rng.pick(&METHODS).unwrap_or(&CREATE_VOLUME);
        let injected = match fault {
            Fault::Kill => {
                let index = self.rng.below(self.replicas.len() as u64) as usize;
                self.kill(index).await;
                true
            }
            Fault::LeaderFailover => {
                let sidecar = match self.rng.below(4) {
                    0 => Sidecar::Provisioner,
                    1 => Sidecar::Attacher,
                    2 => Sidecar::Resizer,
                    _ => Sidecar::Snapshotter,
                };
                match self.leader(sidecar).await {
                    Some(index) => {
                        self.kill(index).await;
                        true
                    }
                    None => false,
                }
            }
            Fault::DriverLatency => match self.driver.faults() {
                Some(faults) => {
                    // Beyond the sidecars' --timeout of 2 s.
                    faults.set_latency(method, Duration::from_millis(self.rng.between(500, 3500)));
                    self.later(500, 3000, Restore::DriverLatency(method));
                    true
                }
                None => false,
            },
            Fault::DriverHang => match self.driver.faults() {
                Some(faults) => {
                    faults.hang(method);
                    self.later(200, 3000, Restore::DriverRelease(method));
                    true
                }
                None => false,
            },
            Fault::DriverTransientCode => {
                let code = *self.rng.pick(&TRANSIENT).unwrap_or(&Code::Unavailable);
                let times = self.rng.between(1, 3);
                match self.driver.faults() {
                    Some(faults) => {
                        faults.fail_next(method, times, code, "injected transient failure");
                        true
                    }
                    None => false,
                }
            }
            Fault::DriverLostAnswer => {
                let method = match self.rng.below(6) {
                    0 => CREATE_VOLUME,
                    1 => CONTROLLER_PUBLISH_VOLUME,
                    2 => CONTROLLER_EXPAND_VOLUME,
                    3 => CONTROLLER_MODIFY_VOLUME,
                    4 => CREATE_VOLUME_GROUP_SNAPSHOT,
                    _ => CREATE_SNAPSHOT,
                };
                let times = self.rng.between(1, 3);
                match self.driver.faults() {
                    Some(faults) => {
                        faults.lose_answers(method, times, Code::DeadlineExceeded);
                        true
                    }
                    None => false,
                }
            }
            Fault::DriverRestart => {
                if self.driver.is_up() {
                    self.driver.down().await;
                    self.later(200, 2000, Restore::DriverUp);
                    true
                } else {
                    false
                }
            }
            Fault::ApiWriteError => match &self.api {
                Some(api) => {
                    let writes = sidecar_writes();
                    let on = writes[self.rng.below(writes.len() as u64) as usize].clone();
                    let times = self.rng.between(1, 4) as u32;
                    let error = match self.rng.below(3) {
                        0 => ApiError::from_code(500, "injected internal error"),
                        1 => ApiError::from_code(409, "injected conflict"),
                        _ => ApiError::too_many_requests(1),
                    };
                    api.fail_next_with(on, times, error);
                    true
                }
                None => false,
            },
            Fault::ApiWatchClose => match &self.api {
                Some(api) => {
                    api.close_watches(None);
                    true
                }
                None => false,
            },
            Fault::ApiCompaction => match &self.api {
                Some(api) => {
                    api.compact_history();
                    api.close_watches(None);
                    true
                }
                None => false,
            },
            Fault::ApiUnreachable => match &self.api {
                Some(api) if !api.is_unreachable() => {
                    api.set_unreachable(true);
                    // On a timer of its own: the workload's next request waits for it.
                    let api = api.clone();
                    let outage = Duration::from_millis(self.rng.between(1000, 4000));
                    tokio::spawn(async move {
                        tokio::time::sleep(outage).await;
                        api.set_unreachable(false);
                    });
                    true
                }
                _ => false,
            },
        };
        if injected {
            *self.faults.entry(fault).or_default() += 1;
        }
    }

    async fn restore(&mut self, restore: Restore) {
        match restore {
            Restore::Replica(index) => {
                // A replica that cannot start is a failure of the suite's own set-up.
                self.replicas[index]
                    .start(&self.launch)
                    .expect("the sidecar starts again");
            }
            Restore::DriverUp => self.driver.up().await,
            Restore::DriverLatency(method) => {
                if let Some(faults) = self.driver.faults() {
                    faults.clear_latency(method);
                }
            }
            Restore::DriverRelease(method) => {
                if let Some(faults) = self.driver.faults() {
                    faults.release(method);
                }
            }
        }
    }

    /// Lets `duration` pass while undoing faults when due and restarting replicas that exited
    /// by themselves, as the kubelet restarts a container.
    async fn settle(&mut self, duration: Duration) {
        let until = Instant::now() + duration;
        loop {
            let now = Instant::now();
            let (due, pending): (Vec<_>, Vec<_>) =
                self.restores.drain(..).partition(|(at, _)| *at <= now);
            self.restores = pending;
            for (_, restore) in due {
                self.restore(restore).await;
            }
            for index in 0..self.replicas.len() {
                if self.replicas[index].reap() {
                    self.later(200, 1000, Restore::Replica(index));
                }
            }
            if now >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Undoes every fault at once: the state the sidecars must converge from.
    async fn all_clear(&mut self) {
        for (_, restore) in std::mem::take(&mut self.restores) {
            self.restore(restore).await;
        }
        if let Some(api) = &self.api {
            api.clear();
        }
        self.driver.up().await;
        if let Some(faults) = self.driver.faults() {
            faults.reset();
        }
        for replica in &mut self.replicas {
            replica.reap();
            replica.start(&self.launch).expect("the sidecar starts");
        }
    }

    /// Writes the run's objects as the API server has them, a JSON list per kind, into `dir`.
    async fn dump_objects(&self, dir: &std::path::Path) {
        let client = self.cluster.client();
        let core = |kind: &str, plural: &str, group: &str| {
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1", kind), plural)
        };
        let kinds = [
            (
                core("PersistentVolumeClaim", "persistentvolumeclaims", ""),
                true,
            ),
            (core("PersistentVolume", "persistentvolumes", ""), false),
            (
                core("VolumeAttachment", "volumeattachments", "storage.k8s.io"),
                false,
            ),
            (snapshot_resource("VolumeSnapshot", "volumesnapshots"), true),
            (
                snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents"),
                false,
            ),
            (
                group_resource("VolumeGroupSnapshot", "volumegroupsnapshots"),
                true,
            ),
            (
                group_resource("VolumeGroupSnapshotContent", "volumegroupsnapshotcontents"),
                false,
            ),
        ];
        for (resource, namespaced) in kinds {
            let api: Api<DynamicObject> = if namespaced {
                Api::namespaced_with(client.clone(), &self.launch.namespace, &resource)
            } else {
                Api::all_with(client.clone(), &resource)
            };
            let text = match api.list(&ListParams::default()).await {
                Ok(list) => serde_json::to_string_pretty(&list.items).unwrap_or_default(),
                Err(err) => format!("cannot list: {err}"),
            };
            let _ = std::fs::write(dir.join(format!("{}.json", resource.plural)), text);
        }
    }

    async fn snapshot(&self) -> Option<Snapshot> {
        let client = self.cluster.client();
        let driver = self
            .driver
            .state()
            .volumes
            .into_values()
            .map(|v| DriverVolume {
                id: v.id,
                published: v.published.into_keys().collect(),
                capacity_bytes: v.capacity_bytes,
            })
            .collect();
        let pvs = Api::<PersistentVolume>::all(client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .map(|c| c.driver.as_str())
                    == Some(self.launch_driver())
            })
            .map(|pv| {
                let spec = pv.spec.unwrap_or_default();
                PvView {
                    name: pv.metadata.name.unwrap_or_default(),
                    handle: spec.csi.map(|c| c.volume_handle),
                    claim: spec.claim_ref.map(|r| {
                        format!(
                            "{}/{}",
                            r.namespace.unwrap_or_default(),
                            r.name.unwrap_or_default()
                        )
                    }),
                    deleting: pv.metadata.deletion_timestamp.is_some(),
                    finalizers: pv.metadata.finalizers.unwrap_or_default(),
                    capacity_bytes: spec
                        .capacity
                        .as_ref()
                        .and_then(|c| c.get("storage"))
                        .and_then(|q| bytes(&q.0)),
                    class: spec.volume_attributes_class_name,
                }
            })
            .collect();
        let pvcs =
            Api::<PersistentVolumeClaim>::namespaced(client.clone(), self.cluster.namespace())
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .map(pvc_view)
                .collect();
        let vas = Api::<VolumeAttachment>::all(client.clone())
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|va| va.spec.attacher == self.launch_driver())
            .map(|va| VaView {
                name: va.metadata.name.unwrap_or_default(),
                pv: va.spec.source.persistent_volume_name,
                node: va.spec.node_name,
                attached: va.status.is_some_and(|s| s.attached),
                deleting: va.metadata.deletion_timestamp.is_some(),
            })
            .collect();
        let driver_snapshots = self.driver.state().snapshots.into_keys().collect();
        let contents = Api::<DynamicObject>::all_with(
            client.clone(),
            &snapshot_resource("VolumeSnapshotContent", "volumesnapshotcontents"),
        )
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["driver"] == self.launch_driver())
        .map(|c| {
            let text = |pointer: &str| c.data.pointer(pointer).and_then(|v| v.as_str());
            ContentView {
                snapshot: format!(
                    "{}/{}",
                    text("/spec/volumeSnapshotRef/namespace").unwrap_or_default(),
                    text("/spec/volumeSnapshotRef/name").unwrap_or_default()
                ),
                handle: text("/status/snapshotHandle").map(String::from),
                deleting: c.metadata.deletion_timestamp.is_some(),
                finalizers: c.metadata.finalizers.clone().unwrap_or_default(),
                name: c.metadata.name.unwrap_or_default(),
            }
        })
        .collect();
        let namespace = self.cluster.namespace();
        let view = |s: DynamicObject| {
            let group = s
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "VolumeGroupSnapshot")
                .map(|o| format!("{namespace}/{}", o.name));
            VolumeSnapshotView {
                key: format!(
                    "{}/{}",
                    s.metadata.namespace.clone().unwrap_or_default(),
                    s.metadata.name.clone().unwrap_or_default()
                ),
                ready: s.data.pointer("/status/readyToUse") == Some(&json!(true)),
                deleting: s.metadata.deletion_timestamp.is_some(),
                group,
            }
        };
        let volume_snapshots = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            namespace,
            &snapshot_resource("VolumeSnapshot", "volumesnapshots"),
        )
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .map(view)
        .collect();
        let groups = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            namespace,
            &group_resource("VolumeGroupSnapshot", "volumegroupsnapshots"),
        )
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .map(view)
        .collect();
        let group_contents = Api::<DynamicObject>::all_with(
            client,
            &group_resource("VolumeGroupSnapshotContent", "volumegroupsnapshotcontents"),
        )
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .filter(|c| c.data["spec"]["driver"] == self.launch_driver())
        .map(|c| {
            let text = |pointer: &str| c.data.pointer(pointer).and_then(|v| v.as_str());
            GroupContentView {
                group: format!(
                    "{}/{}",
                    text("/spec/volumeGroupSnapshotRef/namespace").unwrap_or_default(),
                    text("/spec/volumeGroupSnapshotRef/name").unwrap_or_default()
                ),
                handle: text("/status/volumeGroupSnapshotHandle").map(String::from),
                deleting: c.metadata.deletion_timestamp.is_some(),
                finalizers: c.metadata.finalizers.clone().unwrap_or_default(),
                name: c.metadata.name.unwrap_or_default(),
            }
        })
        .collect();
        Some(Snapshot {
            driver,
            driver_snapshots,
            pvs,
            pvcs,
            vas,
            contents,
            volume_snapshots,
            driver_groups: self.driver.state().group_snapshots.into_keys().collect(),
            group_contents,
            groups,
        })
    }

    fn launch_driver(&self) -> &str {
        self.workload.driver()
    }
}

/// A quantity in bytes (the API server stores canonical forms such as `3Mi`).
fn bytes(quantity: &str) -> Option<i128> {
    let (number, unit) = quantity
        .find(|c: char| !c.is_ascii_digit())
        .map_or((quantity, ""), |at| quantity.split_at(at));
    let scale: i128 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return None,
    };
    Some(number.parse::<i128>().ok()? * scale)
}

fn pvc_view(c: PersistentVolumeClaim) -> PvcView {
    let spec = c.spec.unwrap_or_default();
    let status = c.status.unwrap_or_default();
    let resize_status = status
        .allocated_resource_statuses
        .as_ref()
        .and_then(|s| s.get("storage"))
        .cloned();
    // Once the node's step is due (`NodeResizePending`), the controller's `Resizing` condition
    // stays until kubelet finishes, as upstream leaves it.
    let node_turn = resize_status
        .as_ref()
        .is_some_and(|s| s.starts_with("Node"));
    let in_controller = resize_status.filter(|s| s.starts_with("Controller"));
    let condition = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Resizing" || c.type_ == "ControllerResizeError")
        .filter(|_| !node_turn)
        .map(|c| format!("condition {}", c.type_));
    PvcView {
        key: format!(
            "{}/{}",
            c.metadata.namespace.unwrap_or_default(),
            c.metadata.name.unwrap_or_default()
        ),
        phase: status.phase.unwrap_or_default(),
        volume: spec.volume_name,
        deleting: c.metadata.deletion_timestamp.is_some(),
        request_bytes: spec
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").and_then(|q| bytes(&q.0))),
        node_step_bytes: status
            .allocated_resources
            .as_ref()
            .and_then(|a| a.get("storage"))
            .and_then(|q| bytes(&q.0))
            .filter(|_| node_turn),
        resizing: in_controller.or(condition),
        class: spec.volume_attributes_class_name,
        current_class: status.current_volume_attributes_class_name,
        modifying: status.modify_volume_status.map(|m| m.status),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_lose_nothing_and_everything_converges() {
    let seed = seed_from_env("FAULT_SEED");
    let rounds = count_from_env("FAULT_ROUNDS", 40);
    let converge = Duration::from_secs(count_from_env("FAULT_CONVERGE", 120));
    println!("fault suite: seed {seed}, {rounds} rounds (FAULT_SEED={seed} replays it)");
    let mut suite = Suite::start(seed).await;
    let faults = [
        Fault::Kill,
        Fault::DriverLatency,
        Fault::DriverHang,
        Fault::DriverTransientCode,
        Fault::DriverLostAnswer,
        Fault::DriverRestart,
        Fault::ApiWriteError,
        Fault::ApiWatchClose,
        Fault::ApiCompaction,
        Fault::ApiUnreachable,
    ];
    let started = Instant::now();
    for _ in 0..rounds {
        let batch = suite.rng.between(2, 6);
        for _ in 0..batch {
            let mut rng = suite.rng.clone();
            suite.workload.step(&mut rng).await;
            suite.rng = rng;
        }
        if suite.rng.chance(15) {
            // The batch is in flight: its leader goes.
            suite.inject(Fault::LeaderFailover).await;
        }
        for _ in 0..suite.rng.between(0, 2) {
            let fault = *suite.rng.pick(&faults).unwrap_or(&Fault::Kill);
            suite.inject(fault).await;
        }
        if suite.rng.chance(40) {
            suite.inject(Fault::Kill).await;
        }
        let pause = Duration::from_millis(suite.rng.between(100, 500));
        suite.settle(pause).await;
    }
    let workload_time = started.elapsed();
    suite.all_clear().await;
    let expected = suite.workload.expectation();
    let converging = Instant::now();
    let mut last = None;
    while converging.elapsed() < converge {
        suite.settle(Duration::from_millis(500)).await;
        if let Some(snapshot) = suite.snapshot().await {
            let verdict = judge(&snapshot, &expected);
            let done = verdict.converged();
            last = Some(verdict);
            if done {
                break;
            }
        }
    }
    let converged_in = converging.elapsed();
    let verdict = last.unwrap_or_default();
    let repeated = suite.driver.repeated_calls();
    let ops = &suite.workload.ops;
    let exits: usize = suite.replicas.iter().map(|r| r.exits.len()).sum();
    let fault_total: u64 = suite.faults.values().sum();
    println!(
        "fault verdict: seed {seed}: {} operations ({} claims created, {} deleted while creating, {} deleted, {} attached, {} detached, {} grown, {} re-classed, {} snapshotted, {} snapshots deleted, {} group snapshots, {} deleted) in {:.1} s; {fault_total} faults {:?}, {} kills, {exits} exits by the sidecars themselves; {} in {:.1} s: leaked {}, orphaned {}, duplicated {}, pending {}, stuck {}, unexpected {}, attach mismatches {}, size or class mismatches {}, leaked snapshots {}, snapshot mismatches {}; {} claims, {} volumes, {} snapshots and {} group snapshots held; CSI calls {} CreateVolume, {} ControllerPublishVolume, {} ControllerExpandVolume, {} ControllerModifyVolume, {} CreateSnapshot, {} DeleteSnapshot, {} CreateVolumeGroupSnapshot, {} DeleteVolumeGroupSnapshot, repeated {:?}",
        ops.total(),
        ops.created,
        ops.deleted_while_creating,
        ops.deleted,
        ops.attached,
        ops.detached,
        ops.resized,
        ops.modified,
        ops.snapshotted,
        ops.snapshots_deleted,
        ops.group_snapshotted,
        ops.group_snapshots_deleted,
        workload_time.as_secs_f64(),
        suite.faults,
        suite.kills,
        if verdict.converged() {
            "converged"
        } else {
            "NOT converged"
        },
        converged_in.as_secs_f64(),
        verdict.leaked.len(),
        verdict.orphaned.len(),
        verdict.duplicated.len(),
        verdict.pending.len(),
        verdict.stuck.len(),
        verdict.unexpected.len(),
        verdict.attach_mismatch.len(),
        verdict.resize_mismatch.len(),
        verdict.leaked_snapshots.len(),
        verdict.snapshot_mismatch.len(),
        suite.workload.claims(),
        suite.driver.state().volumes.len(),
        suite.driver.state().snapshots.len(),
        suite.driver.state().group_snapshots.len(),
        suite.driver.total_calls(CREATE_VOLUME),
        suite.driver.total_calls(CONTROLLER_PUBLISH_VOLUME),
        suite.driver.total_calls(CONTROLLER_EXPAND_VOLUME),
        suite.driver.total_calls(CONTROLLER_MODIFY_VOLUME),
        suite.driver.total_calls(CREATE_SNAPSHOT),
        suite.driver.total_calls(DELETE_SNAPSHOT),
        suite.driver.total_calls(CREATE_VOLUME_GROUP_SNAPSHOT),
        suite.driver.total_calls(DELETE_VOLUME_GROUP_SNAPSHOT),
        repeated,
    );
    for replica in &suite.replicas {
        if !replica.exits.is_empty() {
            println!("{} exited by itself: {:?}", replica.name, replica.exits);
        }
    }
    if !verdict.converged() {
        println!("{verdict:#?}");
        for replica in &suite.replicas {
            println!(
                "--- last lines of {} ({})\n{}",
                replica.name,
                replica.log().display(),
                replica.log_tail(40)
            );
        }
        if std::env::var_os("FAULT_KEEP").is_some() {
            // The replicas' whole logs and the driver's state, for a run that is hard to replay.
            let fresh = tempfile::tempdir().expect("a temporary directory");
            let kept = std::mem::replace(&mut suite._dir, fresh).keep();
            suite.dump_objects(&kept).await;
            println!("logs, driver state and objects kept in {}", kept.display());
        }
        panic!("seed {seed} did not converge within {converge:?}; FAULT_SEED={seed} replays it");
    }
    for replica in &mut suite.replicas {
        replica.kill().await;
    }
    suite.driver.stop().await;
    let _ = suite.cluster.cleanup().await;
}
