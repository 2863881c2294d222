//! Shared set-up of the health monitor tests: a `TestCluster` (the in-process API server with
//! its PV controller, or a real cluster when `CSI_SIDECARS_TEST_KUBECONFIG` is set), the mock
//! driver on a unix socket, reporting volume conditions, and the controller running in-process
//! against both. Every test's driver has a name of its own on a real cluster, and its PVs
//! carry the test namespace's prefix.

use std::future::Future;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use external_health_monitor::controller::{self, Config};
use external_health_monitor::{app, flags::Cli};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::{Options, TestCluster};
use testkit::mockdriver::{Condition, MockDriver, MockHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const DRIVER: &str = "health.csi.test";
pub const WAIT: Duration = Duration::from_secs(30);

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
    parse_from(["csi-external-health-monitor-controller"], FlagSyntax::Go).unwrap()
}

/// A mock driver that reports volume conditions; `list` picks ListVolumes over
/// ControllerGetVolume.
pub fn mock(list: bool) -> MockDriver {
    MockDriver::builder()
        .volume_condition(true)
        .list_volumes(list)
        .get_volume(true)
}

/// API server, mock driver and one health monitor.
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
    /// Starts everything, with short intervals; `adjust` may change the configuration.
    pub async fn start(mock: MockDriver, adjust: impl FnOnce(&mut Config)) -> Self {
        let cluster = TestCluster::start_with(Options {
            pv_controller: true,
            ..Options::default()
        })
        .await
        .unwrap();
        let driver = match cluster.is_real() {
            true => format!("{}.{DRIVER}", cluster.namespace()),
            false => DRIVER.to_string(),
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
        let mode = app::mode(&csi, cli.timeout).await.unwrap();
        let mut config = app::config(&cli, &driver, mode);
        config.monitor_interval = Duration::from_millis(200);
        config.list_volumes_interval = Duration::from_millis(200);
        adjust(&mut config);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(controller::run(
            config,
            cluster.client(),
            csi.clone(),
            shutdown.clone(),
        ));
        Self {
            cluster,
            driver,
            mock,
            csi,
            shutdown,
            task: Some(task),
            _dir: dir,
        }
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

    /// A volume in the driver, a PV of it and a claim `name` bound to it; the volume's handle.
    pub async fn bound_claim(&self, name: &str) -> String {
        let volume = self
            .csi
            .create_volume(
                CreateVolumeRequest {
                    name: format!("{}-{name}", self.ns()),
                    capacity_range: Some(csi_proto::v1::CapacityRange {
                        required_bytes: 1 << 30,
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![VolumeCapability {
                        access_type: Some(AccessType::Mount(MountVolume::default())),
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
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        let claim = self
            .claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": pv_name},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                     "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": self.driver, "volumeHandle": volume.volume_id},
                     "claimRef": {"namespace": self.ns(), "name": name,
                                  "uid": claim.metadata.uid}},
        }))
        .unwrap();
        Api::<PersistentVolume>::all(self.client())
            .create(&PostParams::default(), &pv)
            .await
            .unwrap();
        eventually("the claim bound", || async {
            let c = self.claims().get(name).await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await;
        volume.volume_id
    }

    /// Makes the driver report volume `handle` abnormal with `message`, or healthy (`None`).
    pub fn set_condition(&self, handle: &str, message: Option<&str>) {
        let condition = message.map(|m| Condition {
            abnormal: true,
            message: m.to_string(),
        });
        self.mock
            .update_state(|s| s.set_condition(handle, condition))
            .unwrap()
            .unwrap();
    }

    /// `(type, reason, message, count)` of the monitor's Events about claim `name`, oldest
    /// first.
    pub async fn events(&self, name: &str) -> Vec<(String, String, String, i32)> {
        let api: Api<Event> = Api::namespaced(self.client(), self.ns());
        let component = format!("csi-pv-monitor-controller-{}", self.driver);
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
                    e.count.unwrap_or(1),
                )
            })
            .collect()
    }

    /// Waits until the Events about claim `name` satisfy `check`.
    pub async fn events_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&[(String, String, String, i32)]) -> bool,
    ) -> Vec<(String, String, String, i32)> {
        eventually(what, || async {
            let events = self.events(name).await;
            check(&events).then_some(events)
        })
        .await
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
