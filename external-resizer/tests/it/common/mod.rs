//! Shared set-up of the resizer tests: a `TestCluster` (the in-process API server with its PV
//! controller, or a real cluster when `CSI_SIDECARS_TEST_KUBECONFIG` is set), the mock driver on
//! a unix socket, and the controller running in-process against both.
//!
//! Every test's driver has a name of its own on a real cluster, and its cluster-scoped objects
//! (PVs, the StorageClass, VolumeAttributesClasses) carry the test namespace's prefix, so that
//! tests and the cluster's own sidecars never act on each other's objects.

use std::future::Future;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::{
    AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use external_resizer::controller::{self, Config};
use external_resizer::{app, flags::Cli};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::{Options, TestCluster};
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const DRIVER: &str = "resizer.csi.test";
pub const WAIT: Duration = Duration::from_secs(30);
pub const GI: i64 = 1 << 30;

/// Polls `check` until it yields a value, failing the test after [`WAIT`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn default_cli() -> Cli {
    parse_from(["csi-resizer"], FlagSyntax::Go).unwrap()
}

/// API server, mock driver and one resizer.
pub struct Env {
    pub cluster: TestCluster,
    pub driver: String,
    pub mock: MockHandle,
    pub csi: CsiClient,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Env {
    /// Starts everything; `adjust` may change the controller's configuration.
    pub async fn start(mock: MockDriver, adjust: impl FnOnce(&mut Config)) -> Self {
        Self::start_as(None, mock, adjust).await
    }

    /// [`Env::start`] for a driver of a fixed name (`Some`), such as a CSI migration target,
    /// which concurrent tests on a real cluster would share.
    pub async fn start_as(
        fixed: Option<&str>,
        mock: MockDriver,
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let cluster = TestCluster::start_with(Options {
            pv_controller: true,
            ..Options::default()
        })
        .await
        .unwrap();
        let driver = match fixed {
            Some(name) => name.to_string(),
            None if cluster.is_real() => format!("{}.{DRIVER}", cluster.namespace()),
            None => DRIVER.to_string(),
        };
        let dir = tempfile::tempdir().unwrap();
        let mock = mock
            .driver_name(driver.clone())
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        let connection = connection::connect(
            &mock.endpoint(),
            ConnectOptions {
                dial_timeout: Some(Duration::from_secs(5)),
                policy: LossPolicy::Reconnect,
            },
        )
        .await
        .unwrap();
        let csi = CsiClient::new(connection, CsiMetrics::new().unwrap());
        let cli = default_cli();
        let caps = app::capabilities(&csi, cli.timeout).await.unwrap();
        let mut config = app::config(&cli, &driver, caps, true);
        config.backoff = Backoff {
            start: Duration::from_millis(50),
            max: Duration::from_secs(2),
        };
        adjust(&mut config);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller::run(
            config,
            cluster.client(),
            csi.clone(),
            shutdown.clone(),
        ));
        let env = Self {
            cluster,
            driver,
            mock,
            csi,
            shutdown,
            task: Some(task),
            _dir: dir,
        };
        env.create_class().await;
        env
    }

    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    pub fn ns(&self) -> &str {
        self.cluster.namespace()
    }

    /// A cluster-scoped name of this test.
    pub fn n(&self, base: &str) -> String {
        if self.cluster.is_real() {
            self.cluster.cluster_name(base)
        } else {
            base.to_string()
        }
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client(), self.ns())
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client())
    }

    /// The StorageClass of the tests' claims: expansion allowed (kube-apiserver refuses to
    /// grow claims of other classes), provisioned by nobody.
    async fn create_class(&self) {
        let class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": self.n("expandable")},
            "provisioner": format!("nobody.{}", self.driver),
            "allowVolumeExpansion": true,
        });
        let api: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(self.client());
        api.create(
            &PostParams::default(),
            &serde_json::from_value(class).unwrap(),
        )
        .await
        .unwrap();
    }

    /// A volume of `bytes` in the driver, a PV of it and a claim bound to it. `block` volumes
    /// need no node step after an expansion; file systems do.
    pub async fn bound_claim(&self, name: &str, bytes: i64, block: bool, extra: Value) -> String {
        self.bound_claim_with(name, bytes, block, extra, json!({}))
            .await
    }

    /// [`Env::bound_claim`] with `pv_extra` merged into the PV.
    pub async fn bound_claim_with(
        &self,
        name: &str,
        bytes: i64,
        block: bool,
        extra: Value,
        pv_extra: Value,
    ) -> String {
        let access_type = if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        };
        let volume = self
            .csi
            .create_volume(
                CreateVolumeRequest {
                    name: format!("{}-{name}", self.ns()),
                    capacity_range: Some(csi_proto::v1::CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![VolumeCapability {
                        access_type: Some(access_type),
                        access_mode: Some(AccessMode {
                            mode: Mode::SingleNodeWriter as i32,
                        }),
                    }],
                    ..Default::default()
                },
                CallOptions::timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap()
            .volume
            .unwrap();
        let pv_name = self.n(&format!("pv-{name}"));
        let mode = if block { "Block" } else { "Filesystem" };
        let size = sidecar_kit::values::quantity::format_binary(bytes);
        let mut claim = json!({
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode,
                     "storageClassName": self.n("expandable"), "volumeName": pv_name,
                     "resources": {"requests": {"storage": size}}},
        });
        merge(&mut claim, &extra);
        let claim: PersistentVolumeClaim = serde_json::from_value(claim).unwrap();
        let claim = self
            .claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
        let mut pv = json!({
            "metadata": {"name": pv_name},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": mode,
                     "capacity": {"storage": size},
                     "storageClassName": self.n("expandable"),
                     "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": self.driver, "volumeHandle": volume.volume_id},
                     "claimRef": {"namespace": self.ns(), "name": name,
                                  "uid": claim.metadata.uid}},
        });
        merge(&mut pv, &pv_extra);
        self.pvs()
            .create(&PostParams::default(), &serde_json::from_value(pv).unwrap())
            .await
            .unwrap();
        eventually("the claim bound", || async {
            let c = self.claims().get(name).await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await;
        volume.volume_id
    }

    /// Asks for `size` more storage (or less, for recovery).
    pub async fn request(&self, name: &str, size: &str) {
        let patch = json!({"spec": {"resources": {"requests": {"storage": size}}}});
        self.claims()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    pub async fn claim(&self, name: &str) -> Value {
        serde_json::to_value(self.claims().get(name).await.unwrap()).unwrap()
    }

    pub async fn pv(&self, name: &str) -> Value {
        serde_json::to_value(
            self.pvs()
                .get(&self.n(&format!("pv-{name}")))
                .await
                .unwrap(),
        )
        .unwrap()
    }

    /// The driver's size of a volume.
    pub fn driver_size(&self, handle: &str) -> i64 {
        self.mock.state().volumes[handle].capacity_bytes
    }

    /// Waits until the claim satisfies `check`.
    pub async fn claim_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(what, || async {
            let claim = self.claim(name).await;
            check(&claim).then_some(claim)
        })
        .await
    }

    /// `(type, reason, message)` of the resizer's Events about the claim, oldest first (on a
    /// real cluster kube-controller-manager's expand controller reports on the claim too).
    pub async fn events(&self, name: &str) -> Vec<(String, String, String)> {
        let api: Api<Event> = Api::namespaced(self.client(), self.ns());
        let component = format!("external-resizer {}", self.driver);
        let mut events: Vec<Event> = api
            .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(component.as_str())
            })
            .collect();
        events.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
        events
            .into_iter()
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect()
    }

    pub async fn event_reasons(&self, name: &str) -> Vec<String> {
        self.events(name)
            .await
            .into_iter()
            .map(|(_, r, _)| r)
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                merge(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// The condition of `type_` of a claim as JSON.
pub fn condition<'a>(claim: &'a Value, type_: &str) -> Option<&'a Value> {
    claim["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}
