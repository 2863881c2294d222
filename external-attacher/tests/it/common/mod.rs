//! Shared set-up of the attacher tests: a `TestCluster` (the in-process API server, or a real
//! cluster when `CSI_SIDECARS_TEST_KUBECONFIG` is set), the mock driver on a unix socket, and
//! the controller running in-process against both.
//!
//! On a real cluster every test gets a driver name of its own ([`test_driver_name`]): attachers
//! of one driver, be they concurrent tests or the cluster's own sidecars, would take each other's
//! VolumeAttachments. The helpers also prefix the names of the cluster-scoped objects they create
//! or read with the test namespace ([`Env::n`]), so that `TestCluster` cleans them up. In-process
//! names and the driver stay as written.

use std::future::Future;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use external_attacher::app;
use external_attacher::controller::{self, Config};
use external_attacher::flags::Cli;
use k8s_openapi::api::core::v1::{Event, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::{Gate, Options, RequestCounters, TestCluster};
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const DRIVER: &str = "hostpath.csi.k8s.io";
pub const NODE_ID_ANNOTATION: &str = "csi.alpha.kubernetes.io/node-id";
pub const WAIT: Duration = Duration::from_secs(20);

/// The driver name a test's attacher and mock use: `base` in-process; on a real cluster, for the
/// shared default [`DRIVER`], `<test namespace>.<DRIVER>`, unique per test and distinct from the
/// cluster's own driver of that name. Other names (the in-tree migration targets) stay: the
/// attacher recognises them by name, and their tests skip on real clusters.
pub fn test_driver_name(cluster: &TestCluster, base: &str) -> String {
    if !cluster.is_real() || base != DRIVER {
        return base.to_string();
    }
    let name = format!("{}.{DRIVER}", cluster.namespace());
    // A CSI driver name is at most 63 characters (CSINode and VolumeAttachment validation).
    assert!(name.len() <= 63, "driver name {name} is too long");
    name
}

/// Upstream's `SanitizeDriverName`: characters outside `[a-zA-Z0-9-]` become `-`, and a
/// trailing `-` gets an `X`.
pub fn sanitize(name: &str) -> String {
    let mut sanitized: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if sanitized.ends_with('-') {
        sanitized.push('X');
    }
    sanitized
}

/// Server options of the in-process API server that keep `errorCode` in VolumeAttachment
/// errors (feature gate `MutableCSINodeAllocatableCount`, off by default in Kubernetes 1.34).
pub fn error_code_options() -> Options {
    Options::default().feature_gate(Gate::MutableCSINodeAllocatableCount, true)
}

/// Polls `check` until it yields a value, failing the test after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, check).await
}

/// Polls `check` until it yields a value, failing the test after `limit`.
pub async fn eventually_within<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The flags of a default deployment.
pub fn default_cli() -> Cli {
    parse_from(["csi-attacher"], FlagSyntax::Go).unwrap()
}

/// A mock driver of [`DRIVER`] with its default capabilities.
pub fn mock() -> MockDriver {
    MockDriver::builder().driver_name(DRIVER)
}

/// One CSI client connected to a mock.
pub async fn csi_client(mock: &MockHandle) -> CsiClient {
    let connection = connection::connect(
        &mock.endpoint(),
        ConnectOptions {
            dial_timeout: Some(Duration::from_secs(5)),
            policy: LossPolicy::Reconnect,
        },
    )
    .await
    .unwrap();
    CsiClient::new(connection, CsiMetrics::new().unwrap())
}

/// The controller configuration a deployment with default flags gets for the mock of `driver`,
/// with fast retries for tests.
pub async fn test_config_for(csi: &CsiClient, cli: &Cli, driver: &str) -> Config {
    let caps = app::capabilities(csi).await.unwrap();
    let mut config = app::config(cli, driver, caps);
    config.backoff = Backoff {
        start: Duration::from_millis(50),
        max: Duration::from_secs(1),
    };
    config.workers = 4;
    config
}

/// A running in-process controller.
pub struct Replica {
    pub shutdown: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Replica {
    pub fn start(config: Config, client: kube::Client, csi: CsiClient) -> Self {
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller::run(config, client, csi, shutdown.clone()));
        Self { shutdown, task }
    }

    /// Graceful stop.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
    }

    /// Crash: the task is dropped wherever it is.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Prints why a test does not run on a real cluster; true when it should return.
pub fn skip_on_real_cluster(env: &Env, why: &str) -> bool {
    if env.cluster.is_real() {
        println!("skipped on a real cluster: {why}");
    }
    env.cluster.is_real()
}

/// API server, mock driver and one controller.
pub struct Env {
    pub cluster: TestCluster,
    /// The driver name the attacher handles (unique per test on a real cluster).
    pub driver: String,
    pub mock: MockHandle,
    pub csi: CsiClient,
    pub replica: Option<Replica>,
    pub dir: tempfile::TempDir,
}

impl Env {
    /// Starts everything with the default flags; `adjust` may change the configuration.
    pub async fn start(driver: MockDriver, adjust: impl FnOnce(&mut Config)) -> Self {
        Self::start_with(Options::default(), driver, adjust).await
    }

    /// [`Env::start`] with `options` for the in-process API server.
    pub async fn start_with(
        options: Options,
        driver: MockDriver,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let env = Self::without_controller_with(options, driver).await;
        let mut config = test_config_for(&env.csi, &default_cli(), &env.driver).await;
        adjust(&mut config);
        env.with_controller(config)
    }

    pub async fn without_controller(driver: MockDriver) -> Self {
        // No PV controller in-process: its writes would change the attacher's write counts.
        Self::without_controller_with(Options::default(), driver).await
    }

    pub async fn without_controller_with(options: Options, driver: MockDriver) -> Self {
        let cluster = TestCluster::start_with(options).await.unwrap();
        let name = test_driver_name(&cluster, &driver.config().driver_name);
        let driver = driver.driver_name(name.clone());
        let dir = tempfile::tempdir().unwrap();
        let mock = driver
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        let csi = csi_client(&mock).await;
        Self {
            cluster,
            driver: name,
            mock,
            csi,
            replica: None,
            dir,
        }
    }

    /// The name of a cluster-scoped object as this test creates it (see the module docs).
    pub fn n(&self, base: &str) -> String {
        if self.cluster.is_real() {
            self.cluster.cluster_name(base)
        } else {
            base.to_string()
        }
    }

    /// The attacher's finalizer for this test's driver, as upstream derives it.
    pub fn finalizer(&self) -> String {
        format!("external-attacher/{}", sanitize(&self.driver))
    }

    /// The Lease the attacher elects its leader with, as upstream derives it.
    pub fn lease_name(&self) -> String {
        sanitize(&format!("external-attacher-leader-{}", self.driver))
    }

    /// Another mock driver of this test's driver name.
    pub fn mock(&self) -> MockDriver {
        mock().driver_name(self.driver.clone())
    }

    /// Whether the API server keeps `status.attachError.errorCode` / `detachError.errorCode`,
    /// found out by writing one to a VolumeAttachment no attacher handles. A server whose
    /// `MutableCSINodeAllocatableCount` gate is off (the default of Kubernetes 1.34) drops the
    /// field from a status that did not have it; the attacher must work either way.
    pub async fn keeps_error_codes(&self) -> bool {
        let name = self.n("error-code-probe");
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": format!("probe.{}", self.driver), "nodeName": self.n("probe-node"),
                     "source": {"persistentVolumeName": self.n("probe-pv")}},
        }))
        .unwrap();
        self.vas()
            .create(&PostParams::default(), &va)
            .await
            .unwrap();
        let patch = json!({"status": {"attached": false,
            "attachError": {"message": "probe", "errorCode": 2}}});
        let written = self
            .vas()
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        self.vas()
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        attach_error(&written).expect("the probe's error").1 == Some(2)
    }

    /// Request counters (in-process only; see [`skip_on_real_cluster`]).
    pub fn counters(&self) -> RequestCounters {
        self.cluster
            .counters()
            .expect("request counters need the in-process server")
    }

    /// The in-process server's fault injection (see [`skip_on_real_cluster`]).
    pub fn api_faults(&self) -> testkit::apiserver::Faults {
        self.cluster
            .faults()
            .expect("API faults need the in-process server")
    }

    pub fn kubeconfig_path(&self) -> &std::path::Path {
        self.cluster.kubeconfig_path()
    }

    /// A CSI PV spec of this test's driver for `handle`, RWO filesystem.
    pub fn csi_pv_spec(&self, handle: &str) -> Value {
        let mut spec = csi_pv_spec(handle);
        spec["csi"]["driver"] = json!(self.driver);
        spec
    }

    pub fn with_controller(mut self, config: Config) -> Self {
        self.replica = Some(Replica::start(config, self.client(), self.csi.clone()));
        self
    }

    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    pub fn vas(&self) -> Api<VolumeAttachment> {
        Api::all(self.client())
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client())
    }

    pub async fn stop(mut self) {
        if let Some(replica) = self.replica.take() {
            replica.stop().await;
        }
        self.mock.shutdown().await.unwrap();
        self.cluster.cleanup().await.unwrap();
    }

    /// A volume in the mock driver; returns its ID.
    pub async fn create_volume(&self, name: &str) -> String {
        create_volume(&self.csi, name).await
    }

    pub async fn create_csinode(&self, node: &str, node_id: &str) {
        self.create_csinode_for(node, &self.driver, node_id).await
    }

    pub async fn create_csinode_for(&self, node: &str, driver: &str, node_id: &str) {
        let csinode: CSINode = serde_json::from_value(json!({
            "metadata": {"name": self.n(node)},
            "spec": {"drivers": [{"name": driver, "nodeID": node_id}]},
        }))
        .unwrap();
        Api::<CSINode>::all(self.client())
            .create(&PostParams::default(), &csinode)
            .await
            .unwrap();
    }

    pub async fn create_pv(&self, name: &str, spec: Value) -> PersistentVolume {
        let pv: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": self.n(name)}, "spec": spec}))
                .unwrap();
        self.pvs()
            .create(&PostParams::default(), &pv)
            .await
            .unwrap()
    }

    /// A CSI PV of the driver for `handle`, RWO filesystem.
    pub async fn create_csi_pv(&self, name: &str, handle: &str) -> PersistentVolume {
        self.create_pv(name, self.csi_pv_spec(handle)).await
    }

    pub async fn create_va(&self, name: &str, source: Value, node: &str) -> VolumeAttachment {
        self.create_va_for(name, &self.driver, source, node).await
    }

    pub async fn create_va_for(
        &self,
        name: &str,
        attacher: &str,
        source: Value,
        node: &str,
    ) -> VolumeAttachment {
        let mut source = source;
        if let Some(pv) = source.get("persistentVolumeName").and_then(Value::as_str) {
            source["persistentVolumeName"] = json!(self.n(pv));
        }
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": self.n(name)},
            "spec": {"attacher": attacher, "nodeName": self.n(node), "source": source},
        }))
        .unwrap();
        self.vas()
            .create(&PostParams::default(), &va)
            .await
            .unwrap()
    }

    pub async fn create_pv_va(&self, name: &str, pv: &str, node: &str) -> VolumeAttachment {
        self.create_va(name, json!({"persistentVolumeName": pv}), node)
            .await
    }

    /// Volume, PV, CSINode and VA; waits until attached.
    pub async fn attached_volume(&self, n: usize) -> VolumeAttachment {
        let handle = self.create_volume(&format!("vol-{n}")).await;
        self.create_csi_pv(&format!("pv-{n}"), &handle).await;
        self.create_pv_va(&format!("va-{n}"), &format!("pv-{n}"), "node-1")
            .await;
        self.wait_va(&format!("va-{n}"), attached).await
    }

    pub async fn delete_va(&self, name: &str) {
        self.vas()
            .delete(&self.n(name), &DeleteParams::default())
            .await
            .unwrap();
    }

    pub async fn wait_va(
        &self,
        name: &str,
        condition: impl Fn(&VolumeAttachment) -> bool,
    ) -> VolumeAttachment {
        self.wait_va_within(name, WAIT, condition).await
    }

    /// [`Env::wait_va`] for at most `limit`.
    pub async fn wait_va_within(
        &self,
        name: &str,
        limit: Duration,
        condition: impl Fn(&VolumeAttachment) -> bool,
    ) -> VolumeAttachment {
        let vas = self.vas();
        let name = &self.n(name);
        eventually_within(&format!("VolumeAttachment {name}"), limit, || {
            let vas = vas.clone();
            let name = name.to_string();
            let condition = &condition;
            async move { vas.get_opt(&name).await.unwrap().filter(|va| condition(va)) }
        })
        .await
    }

    pub async fn wait_va_gone(&self, name: &str) {
        let vas = self.vas();
        let name = &self.n(name);
        eventually(&format!("VolumeAttachment {name} to be deleted"), || {
            let vas = vas.clone();
            let name = name.to_string();
            async move { vas.get_opt(&name).await.unwrap().is_none().then_some(()) }
        })
        .await
    }

    pub async fn wait_pv(&self, name: &str, condition: impl Fn(Option<&PersistentVolume>) -> bool) {
        let pvs = self.pvs();
        let name = &self.n(name);
        eventually(&format!("PersistentVolume {name}"), || {
            let pvs = pvs.clone();
            let name = name.to_string();
            let condition = &condition;
            async move { condition(pvs.get_opt(&name).await.unwrap().as_ref()).then_some(()) }
        })
        .await
    }

    /// Events about the VolumeAttachment `name`.
    pub async fn events_for(&self, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client(), "default")
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(self.n(name).as_str()))
            .collect()
    }

    pub async fn wait_event(&self, name: &str, reason: &str, message_part: &str) -> Event {
        eventually(&format!("a {reason} event for {name}"), || async {
            self.events_for(name).await.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message
                        .as_deref()
                        .is_some_and(|m| m.contains(message_part))
            })
        })
        .await
    }
}

/// A volume in the driver behind `csi`; returns its ID.
pub async fn create_volume(csi: &CsiClient, name: &str) -> String {
    let request = CreateVolumeRequest {
        name: name.into(),
        volume_capabilities: vec![VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume::default())),
        }],
        ..Default::default()
    };
    csi.create_volume(request, CallOptions::timeout(Duration::from_secs(5)))
        .await
        .unwrap()
        .volume
        .unwrap()
        .volume_id
}

pub fn csi_pv_spec(handle: &str) -> Value {
    json!({
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "csi": {"driver": DRIVER, "volumeHandle": handle, "fsType": "ext4",
                "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "test"}},
    })
}

pub fn attached(va: &VolumeAttachment) -> bool {
    va.status.as_ref().is_some_and(|s| s.attached)
}

pub fn finalizers(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<String> {
    meta.finalizers.clone().unwrap_or_default()
}

/// A PV's finalizers without the one a real server's admission adds to every PV.
pub fn pv_finalizers(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<String> {
    finalizers(meta)
        .into_iter()
        .filter(|f| f != "kubernetes.io/pv-protection")
        .collect()
}

pub fn attach_error(va: &VolumeAttachment) -> Option<(String, Option<i32>)> {
    va.status
        .as_ref()
        .and_then(|s| s.attach_error.as_ref())
        .map(|e| (e.message.clone().unwrap_or_default(), e.error_code))
}

pub fn detach_error(va: &VolumeAttachment) -> Option<(String, Option<i32>)> {
    va.status
        .as_ref()
        .and_then(|s| s.detach_error.as_ref())
        .map(|e| (e.message.clone().unwrap_or_default(), e.error_code))
}

/// The JSON of the kept calls of `method`.
pub fn requests(mock: &MockHandle, method: &str) -> Vec<Value> {
    mock.calls()
        .of(method)
        .into_iter()
        .map(|c| serde_json::from_str(&c.request).unwrap())
        .collect()
}
