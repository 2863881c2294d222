//! The I/O of capacity tracking: start-up (namespace, owner, API version), the watches of
//! StorageClasses, Nodes, CSINodes and our CSIStorageCapacity objects, the topology worker, the
//! poller, the workers asking the driver and writing objects, and the gauges.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::{GetCapacityRequest, Topology};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use sidecar_kit::cluster::client::{api_code, api_message};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::{Backoff, Item, WorkQueue};
use sidecar_kit::pipeline::{Change, Relist, Wiring, lock};
use tokio_util::sync::CancellationToken;

use super::{
    ApiVersion, CAPACITY_QUEUE, ClassView, DRIVER_NAME_LABEL, GROUP, KIND, Key, MANAGED_BY_LABEL,
    OwnerError, OwnerMeta, OwnerRef, PLURAL, PROBE_NAME, Plan, ProbeAnswer, ProbeError, Segment,
    Stored, TOPOLOGY_QUEUE, TopologyInputs, Tracker, TrackerConfig, Work, lookup_owner,
    probe_decision,
};
use crate::model;

#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("need NAMESPACE env variable for CSIStorageCapacity objects")]
    NoNamespace,
    #[error("need POD_NAME env variable to determine CSIStorageCapacity owner")]
    NoPodName,
    #[error("look up owner(s) of pod: {0}")]
    Owner(#[from] OwnerError),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error("cannot register the capacity metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// Why one work item failed (it is retried with backoff).
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("CSI GetCapacity for {key}: {status}")]
    GetCapacity { key: Key, status: tonic::Status },
    #[error("{verb} CSIStorageCapacity for {what}: {message}")]
    Write {
        verb: &'static str,
        what: String,
        message: String,
    },
}

/// The environment upstream reads: `NAMESPACE` (required) and `POD_NAME` (for the owner).
#[derive(Clone, Debug, Default)]
pub struct Environment {
    pub namespace: Option<String>,
    pub pod_name: Option<String>,
}

impl Environment {
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            namespace: var("NAMESPACE"),
            pod_name: var("POD_NAME"),
        }
    }
}

/// The flags of capacity tracking.
#[derive(Clone, Debug)]
pub struct Settings {
    pub driver: String,
    /// The managed-by label value ([`super::managed_by`]).
    pub managed_by: String,
    pub ownerref_level: i32,
    pub immediate: bool,
    pub poll_interval: Duration,
    /// Bound of each GetCapacity call (`--timeout`).
    pub timeout: Duration,
    pub workers: usize,
    pub backoff: Backoff,
    /// Distributed provisioning: this node's segment only (from NodeGetInfo), instead of the
    /// segments of Nodes and CSINodes.
    pub fixed_segment: Option<Segment>,
    /// The watches and queue metrics, shared with the claims controller (and the process's
    /// other controllers).
    pub wiring: Wiring,
}

impl Settings {
    pub fn from_cli(cli: &crate::flags::Cli, driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            managed_by: super::managed_by(None),
            ownerref_level: cli.capacity_ownerref_level,
            immediate: cli.capacity_for_immediate_binding,
            poll_interval: cli.capacity_poll_interval,
            timeout: cli.timeout,
            workers: cli.capacity_threads.max(1),
            backoff: Backoff {
                start: cli.retry_interval_start,
                max: cli.retry_interval_max,
            },
            fixed_segment: None,
            wiring: Wiring::default(),
        }
    }

    /// Distributed provisioning, as upstream: the managed-by label becomes
    /// `external-provisioner-<node>` (cut to 63 characters) and the only segment is the node's
    /// (`None`: the driver reports no topology; the empty segment).
    pub fn for_node(
        mut self,
        node: &str,
        topology: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Self {
        self.managed_by = super::managed_by(Some(node));
        self.fixed_segment = Some(topology.cloned().unwrap_or_default());
        self
    }
}

fn api_resource(version: ApiVersion) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, version.version(), KIND),
        PLURAL,
    )
}

/// Creates the invalid object `#%123-invalid-name` in `namespace`: refused as Invalid, the
/// cluster serves `storage.k8s.io/v1`; NotFound, only v1beta1.
pub async fn probe_api_version(
    client: &kube::Client,
    namespace: &str,
) -> Result<ApiVersion, ProbeError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource(ApiVersion::V1));
    let mut obj = DynamicObject::new(PROBE_NAME, &api_resource(ApiVersion::V1));
    obj.data = serde_json::json!({"storageClassName": "probe", "capacity": "0"});
    let answer = match api.create(&PostParams::default(), &obj).await {
        Ok(_) => ProbeAnswer::Created,
        Err(err) => match api_code(&err) {
            Some(code) => ProbeAnswer::Refused {
                code,
                message: api_message(&err),
            },
            None => ProbeAnswer::Failed(err.to_string()),
        },
    };
    let version = probe_decision(answer)?;
    tracing::info!("using the CSIStorageCapacity {} API", version.version());
    Ok(version)
}

/// Reads the owner reference of the objects: the pod `POD_NAME` in `namespace`, walked up
/// `level` controllers (see [`lookup_owner`]).
pub async fn owner_reference(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    level: i32,
) -> Result<Option<OwnerRef>, OwnerError> {
    lookup_owner(
        |api_version: String, kind: String, name: String| {
            let client = client.clone();
            let namespace = namespace.to_string();
            async move {
                let (group, version) = match api_version.split_once('/') {
                    Some((g, v)) => (g.to_string(), v.to_string()),
                    None => (String::new(), api_version.clone()),
                };
                let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
                let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &ar);
                let obj = api.get(&name).await.map_err(|e| api_message(&e))?;
                Ok(OwnerMeta {
                    uid: obj.metadata.uid.unwrap_or_default(),
                    owners: obj
                        .metadata
                        .owner_references
                        .unwrap_or_default()
                        .into_iter()
                        .map(|o| {
                            (
                                o.api_version,
                                o.kind,
                                o.name,
                                o.uid,
                                o.controller == Some(true),
                            )
                        })
                        .collect(),
                })
            }
        },
        namespace,
        ("v1", "Pod", pod),
        level,
    )
    .await
}

/// Capacity tracking, prepared at start-up; [`Capacity::run`] runs it while leading.
#[derive(Clone)]
pub struct Capacity {
    settings: Arc<Settings>,
    namespace: String,
    owner: Option<OwnerRef>,
    version: ApiVersion,
    /// Watches of classes, nodes and CSINodes.
    watch_client: kube::Client,
    /// Our objects: their watch and writes (`--kube-api-capacity-qps`/`-burst`).
    client: kube::Client,
    csi: CsiClient,
    handle: CapacityHandle,
}

/// Prepares capacity tracking as upstream does before leader election: `NAMESPACE`, the owner
/// from `POD_NAME`, the API version; registers the gauges into `registry`.
pub async fn prepare(
    settings: Settings,
    env: Environment,
    watch_client: kube::Client,
    client: kube::Client,
    csi: CsiClient,
    registry: &prometheus::Registry,
) -> Result<Capacity, CapacityError> {
    let namespace = env.namespace.ok_or(CapacityError::NoNamespace)?;
    let owner = if settings.ownerref_level >= 0 {
        let pod = env.pod_name.ok_or(CapacityError::NoPodName)?;
        let owner = owner_reference(&client, &namespace, &pod, settings.ownerref_level).await?;
        if let Some(o) = &owner {
            tracing::info!(api_version = %o.api_version, kind = %o.kind, name = %o.name, "owner of CSIStorageCapacity objects");
        }
        owner
    } else {
        None
    };
    let version = probe_api_version(&client, &namespace).await?;
    let handle = CapacityHandle::default();
    registry.register(Box::new(Gauges::new(handle.clone())?))?;
    Ok(Capacity {
        settings: Arc::new(settings),
        namespace,
        owner,
        version,
        watch_client,
        client,
        csi,
        handle,
    })
}

/// Asks capacity tracking to refresh objects soon, e.g. after a provision or a deletion. Does
/// nothing while capacity tracking is not running (not leading). Cheap to clone.
#[derive(Clone, Default)]
pub struct CapacityHandle {
    running: Arc<Mutex<Option<Arc<Running>>>>,
}

impl CapacityHandle {
    fn current(&self) -> Option<Arc<Running>> {
        lock(&self.running).clone()
    }

    /// Refreshes the objects of `class` in `segment`; `None` stands for any class or segment.
    /// Queued work is coalesced per object.
    pub fn refresh(&self, class: Option<&str>, segment: Option<&Segment>) {
        if let Some(running) = self.current() {
            let work = lock(&running.state).tracker.refresh(class, segment);
            running.enqueue(work);
        }
    }

    /// Desired, existing and obsolete objects (zeros while not running).
    pub fn counts(&self) -> super::Counts {
        self.current()
            .map(|r| lock(&r.state).tracker.counts())
            .unwrap_or_default()
    }
}

impl Capacity {
    pub fn handle(&self) -> CapacityHandle {
        self.handle.clone()
    }

    pub fn api_version(&self) -> ApiVersion {
        self.version
    }

    pub fn owner(&self) -> Option<&OwnerRef> {
        self.owner.as_ref()
    }

    /// Runs until `shutdown`: watches, then (once all have listed) workers and the poller.
    pub async fn run(&self, shutdown: CancellationToken) {
        let settings = self.settings.clone();
        let ar = api_resource(self.version);
        let running = Arc::new(Running {
            settings: settings.clone(),
            state: Mutex::new(State {
                tracker: Tracker::new(TrackerConfig {
                    driver: settings.driver.clone(),
                    managed_by: settings.managed_by.clone(),
                    immediate: settings.immediate,
                    owner: self.owner.clone(),
                    api_version: self.version,
                }),
                topology: TopologyInputs::default(),
                ready: false,
            }),
            queue: settings.wiring.queue(CAPACITY_QUEUE, &[], settings.backoff),
            topology: settings.wiring.queue(TOPOLOGY_QUEUE, &[], settings.backoff),
            api: Api::namespaced_with(self.client.clone(), &self.namespace, &ar),
            csi: self.csi.clone(),
            refreshed: AtomicU64::new(0),
        });
        *lock(&self.handle.running) = Some(running.clone());
        tracing::info!(namespace = %self.namespace, "starting capacity controller");

        let mut pipeline = settings.wiring.pipeline();
        let r = running.clone();
        let mut relist = Relist::default();
        pipeline.watch(
            Api::<StorageClass>::all(self.watch_client.clone()),
            watcher::Config::default(),
            move |change| r.on_class(change, &mut relist),
        );
        if settings.fixed_segment.is_none() {
            let r = running.clone();
            let mut relist = Relist::default();
            pipeline.watch(
                Api::<Node>::all(self.watch_client.clone()),
                watcher::Config::default(),
                move |change| r.on_node(change, &mut relist),
            );
            let r = running.clone();
            let mut relist = Relist::default();
            pipeline.watch(
                Api::<CSINode>::all(self.watch_client.clone()),
                watcher::Config::default(),
                move |change| r.on_csinode(change, &mut relist),
            );
        }
        // Our objects only, by label.
        let r = running.clone();
        let mut relist = Relist::default();
        pipeline.watch_kind(
            "CSIStorageCapacity".to_string(),
            running.api.clone(),
            watcher::Config::default().labels(&self.selector()),
            move |change| r.on_object(change, &mut relist),
        );

        pipeline
            .run(&shutdown, async |pipeline, shutdown| {
                running.start();
                let r = running.clone();
                pipeline.workers(&running.queue, settings.workers, move |item| {
                    let r = r.clone();
                    async move { r.process(item).await }
                });
                let r = running.clone();
                pipeline.workers(&running.topology, 1, move |_item: Item<()>| {
                    let r = r.clone();
                    async move { r.update_topology() }
                });
                pipeline.spawn(running.clone().poll(shutdown.clone()));
            })
            .await;
        *lock(&self.handle.running) = None;
        tracing::info!("capacity controller stopped");
    }

    fn selector(&self) -> String {
        format!(
            "{DRIVER_NAME_LABEL}={},{MANAGED_BY_LABEL}={}",
            self.settings.driver, self.settings.managed_by
        )
    }
}

/// Runs `main` and, when given, capacity tracking beside it until both end (`shutdown`).
pub async fn beside<F: Future<Output = ()>>(
    capacity: Option<Capacity>,
    shutdown: CancellationToken,
    main: F,
) {
    match capacity {
        Some(capacity) => {
            futures::join!(main, capacity.run(shutdown));
        }
        None => main.await,
    }
}

struct State {
    tracker: Tracker,
    topology: TopologyInputs,
    /// All watches have listed: changes now become work.
    ready: bool,
}

struct Running {
    settings: Arc<Settings>,
    state: Mutex<State>,
    queue: WorkQueue<Work>,
    topology: WorkQueue<()>,
    api: Api<DynamicObject>,
    csi: CsiClient,
    /// Objects refreshed since the last poll.
    refreshed: AtomicU64,
}

impl Running {
    fn enqueue(&self, work: Vec<Work>) {
        for w in work {
            self.queue.add(w, 0);
        }
    }

    /// Adds `work` if ready (before, the first full pass covers it).
    fn enqueue_if_ready(&self, state: &State, work: Vec<Work>) {
        if state.ready {
            self.enqueue(work);
        }
    }

    fn start(&self) {
        let work = {
            let mut state = lock(&self.state);
            let segments = match &self.settings.fixed_segment {
                Some(segment) => [segment.clone()].into(),
                None => state.topology.segments(),
            };
            state.tracker.set_segments(segments);
            state.ready = true;
            let counts = state.tracker.counts();
            tracing::info!(
                segments = state.tracker.segment_set().len(),
                classes = state.tracker.class_names().len(),
                desired = counts.goal,
                existing = counts.current,
                obsolete = counts.obsolete,
                "capacity controller synced"
            );
            state.tracker.all_work()
        };
        self.enqueue(work);
    }

    fn on_class(&self, change: Change<&StorageClass>, relist: &mut Relist) {
        let mut state = lock(&self.state);
        let work = match change {
            Change::Apply(sc) | Change::Listed(sc) => {
                let view = ClassView::from_api(sc);
                relist.saw(view.name.clone());
                state.tracker.set_class(&view)
            }
            Change::Delete(sc) => state
                .tracker
                .remove_class(sc.metadata.name.as_deref().unwrap_or_default()),
            Change::Relist => {
                relist.start();
                Vec::new()
            }
            Change::Relisted => {
                let known = state.tracker.class_names();
                let mut work = Vec::new();
                for gone in relist.finish(known.iter()) {
                    work.extend(state.tracker.remove_class(&gone));
                }
                work
            }
        };
        self.enqueue_if_ready(&state, work);
    }

    fn on_node(&self, change: Change<&Node>, relist: &mut Relist) {
        let mut state = lock(&self.state);
        let changed = match change {
            Change::Apply(node) | Change::Listed(node) => {
                let name = node.metadata.name.clone().unwrap_or_default();
                relist.saw(name.as_str());
                state.topology.set_node(&name, model::node_labels(node))
            }
            Change::Delete(node) => state
                .topology
                .remove_node(node.metadata.name.as_deref().unwrap_or_default()),
            Change::Relist => {
                relist.start();
                false
            }
            Change::Relisted => {
                let known = state.topology.node_names();
                let gone = relist.finish(known.iter());
                gone.iter()
                    .filter(|n| state.topology.remove_node(n))
                    .count()
                    > 0
            }
        };
        if changed && state.ready {
            self.topology.add((), 0);
        }
    }

    fn on_csinode(&self, change: Change<&CSINode>, relist: &mut Relist) {
        let mut state = lock(&self.state);
        let driver = self.settings.driver.clone();
        let changed = match change {
            Change::Apply(n) | Change::Listed(n) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                relist.saw(name.as_str());
                state
                    .topology
                    .set_csinode(&name, model::csinode_topology_keys(n, &driver))
            }
            Change::Delete(n) => state
                .topology
                .remove_csinode(n.metadata.name.as_deref().unwrap_or_default()),
            Change::Relist => {
                relist.start();
                false
            }
            Change::Relisted => {
                let known = state.topology.csinode_names();
                let gone = relist.finish(known.iter());
                gone.iter()
                    .filter(|n| state.topology.remove_csinode(n))
                    .count()
                    > 0
            }
        };
        if changed && state.ready {
            self.topology.add((), 0);
        }
    }

    /// Recomputes the segments (coalesced: one queue key for any number of node changes).
    fn update_topology(&self) {
        let mut state = lock(&self.state);
        let segments = state.topology.segments();
        let work = state.tracker.set_segments(segments);
        if !work.is_empty() {
            tracing::debug!(
                segments = state.tracker.segment_set().len(),
                work = work.len(),
                "topology changed"
            );
        }
        self.enqueue_if_ready(&state, work);
    }

    fn on_object(&self, change: Change<&DynamicObject>, relist: &mut Relist) {
        let mut state = lock(&self.state);
        let stored = |o: &DynamicObject| {
            Stored::from_object(o, &self.settings.driver, &self.settings.managed_by)
        };
        let work = match change {
            Change::Apply(o) | Change::Listed(o) => {
                let s = stored(o);
                relist.saw(s.name.as_str());
                state.tracker.object_applied(s)
            }
            Change::Delete(o) => state
                .tracker
                .object_deleted(o.metadata.name.as_deref().unwrap_or_default()),
            Change::Relist => {
                relist.start();
                Vec::new()
            }
            Change::Relisted => {
                let known = state.tracker.object_names();
                let mut work = Vec::new();
                for gone in relist.finish(known.iter()) {
                    work.extend(state.tracker.object_deleted(&gone));
                }
                work
            }
        };
        self.enqueue_if_ready(&state, work);
    }

    /// Every `--capacity-poll-interval`: every object again. A cycle still running at the next
    /// tick is reported with how far it got; its queued keys are not added twice.
    async fn poll(self: Arc<Self>, shutdown: CancellationToken) {
        let period = self.settings.poll_interval;
        let mut last_total = 0usize;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let refreshed = self.refreshed.swap(0, Ordering::Relaxed);
            let pending = self.queue.len();
            if pending > 0 && last_total > 0 {
                tracing::warn!(
                    refreshed,
                    of = last_total,
                    still_queued = pending,
                    interval = ?period,
                    "the previous capacity poll did not finish within --capacity-poll-interval; queued objects are not queued twice"
                );
            }
            let work = lock(&self.state).tracker.refresh(None, None);
            last_total = work.len();
            tracing::debug!(objects = last_total, "polling capacity");
            self.enqueue(work);
        }
    }

    async fn process(self: Arc<Self>, item: Item<Work>) {
        let result = match &item.key {
            Work::Sync(key) => self.sync(key).await,
            Work::Delete(name) => self.delete(name).await,
        };
        match result {
            Ok(()) => self.queue.forget(&item.key),
            Err(err) => {
                let failures = self.queue.failures(&item.key) + 1;
                let delay = self.queue.add_rate_limited(item.key.clone(), 0);
                tracing::warn!(error = %err, failures, retry_in = ?delay, "capacity work failed; retrying");
            }
        }
    }

    async fn sync(&self, key: &Key) -> Result<(), SyncError> {
        let Some(parameters) = ({
            let state = lock(&self.state);
            state
                .tracker
                .desired(key)
                .then(|| state.tracker.parameters(&key.class))
                .flatten()
        }) else {
            return Ok(());
        };
        self.refreshed.fetch_add(1, Ordering::Relaxed);
        // Upstream passes the class parameters as they are, reserved keys included.
        let request = GetCapacityRequest {
            parameters: parameters
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            accessible_topology: Some(Topology {
                segments: key
                    .segment
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            }),
            ..Default::default()
        };
        let answer = self
            .csi
            .get_capacity(request, CallOptions::timeout(self.settings.timeout))
            .await
            .map_err(|status| SyncError::GetCapacity {
                key: key.clone(),
                status,
            })?;
        let answer = super::Answer {
            available: answer.available_capacity,
            maximum: answer.maximum_volume_size,
        };
        let plan = lock(&self.state).tracker.plan(key, &answer);
        match plan {
            Plan::Skip | Plan::Unchanged => Ok(()),
            Plan::Create(body) => {
                let obj: DynamicObject =
                    serde_json::from_value(body).map_err(|e| SyncError::Write {
                        verb: "create",
                        what: key.to_string(),
                        message: e.to_string(),
                    })?;
                let created = self
                    .api
                    .create(&PostParams::default(), &obj)
                    .await
                    .map_err(|e| SyncError::Write {
                        verb: "create",
                        what: key.to_string(),
                        message: api_message(&e),
                    })?;
                let stored = self.stored(&created);
                tracing::debug!(name = %stored.name, %key, capacity = answer.available, "created CSIStorageCapacity");
                let mut state = lock(&self.state);
                let work = state.tracker.object_created(stored);
                self.enqueue(work);
                Ok(())
            }
            Plan::Update { name, patch } => {
                let base_rv = patch["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                match self
                    .api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(updated) => {
                        tracing::debug!(%name, %key, capacity = answer.available, "updated CSIStorageCapacity");
                        let stored = self.stored(&updated);
                        let work = lock(&self.state).tracker.object_written(stored, &base_rv);
                        self.enqueue(work);
                        Ok(())
                    }
                    Err(e) if api_code(&e) == Some(404) => {
                        // Gone meanwhile: forget it and create a new one.
                        let work = lock(&self.state).tracker.object_deleted(&name);
                        self.enqueue(work);
                        Ok(())
                    }
                    Err(e) => Err(SyncError::Write {
                        verb: "update",
                        what: format!("{key} ({name})"),
                        message: api_message(&e),
                    }),
                }
            }
        }
    }

    async fn delete(&self, name: &str) -> Result<(), SyncError> {
        if !lock(&self.state).tracker.is_obsolete(name) {
            return Ok(());
        }
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::debug!(%name, "deleted obsolete CSIStorageCapacity");
            }
            Err(e) if api_code(&e) == Some(404) => {}
            Err(e) => {
                return Err(SyncError::Write {
                    verb: "delete",
                    what: name.to_string(),
                    message: api_message(&e),
                });
            }
        }
        let work = lock(&self.state).tracker.object_deleted(name);
        self.enqueue(work);
        Ok(())
    }

    fn stored(&self, obj: &DynamicObject) -> Stored {
        Stored::from_object(obj, &self.settings.driver, &self.settings.managed_by)
    }
}

/// `csistoragecapacities_desired_goal`, `_desired_current` and `_obsolete`, computed when
/// scraped.
struct Gauges {
    handle: CapacityHandle,
    descs: Vec<Desc>,
}

const GAUGES: [(&str, &str); 3] = [
    (
        "csistoragecapacities_desired_goal",
        "Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
    ),
    (
        "csistoragecapacities_desired_current",
        "Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
    ),
    (
        "csistoragecapacities_obsolete",
        "Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.",
    ),
];

impl Gauges {
    fn new(handle: CapacityHandle) -> Result<Self, prometheus::Error> {
        let descs = GAUGES
            .iter()
            .map(|(name, help)| {
                Desc::new(
                    name.to_string(),
                    help.to_string(),
                    Vec::new(),
                    HashMap::new(),
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { handle, descs })
    }
}

impl Collector for Gauges {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counts = self.handle.counts();
        let values = [counts.goal, counts.current, counts.obsolete];
        GAUGES
            .iter()
            .zip(values)
            .filter_map(|((name, help), value)| {
                let gauge = prometheus::IntGauge::new(*name, *help).ok()?;
                gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
                Some(gauge.collect())
            })
            .flatten()
            .collect()
    }
}
