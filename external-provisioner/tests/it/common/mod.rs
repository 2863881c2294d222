//! Shared set-up of the provisioner tests: a cluster (the in-process API server with its PV
//! controller, or a real one through `CSI_SIDECARS_TEST_KUBECONFIG`), the mock driver on a unix
//! socket, and the controller running in-process against both.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use external_provisioner::app;
use external_provisioner::controller::{self, Config};
use external_provisioner::flags::Cli;
use external_provisioner::journal::Location;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::TestCluster;
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The name a mock given to [`Env`] is built with; the Env serves it under a name of the test's
/// own (see [`Env::driver`]).
pub const DRIVER: &str = "hostpath.csi.k8s.io";
pub const WAIT: Duration = Duration::from_secs(30);

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

pub fn cli(args: &[&str]) -> Cli {
    parse_from(
        std::iter::once("csi-provisioner").chain(args.iter().copied()),
        FlagSyntax::Gnu,
    )
    .unwrap()
}

/// A mock driver of [`DRIVER`] with its default capabilities.
pub fn mock() -> MockDriver {
    MockDriver::builder().driver_name(DRIVER)
}

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

/// A name unique across tests and runs, for cluster-scoped objects.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Cluster, mock driver and one in-process provisioner.
pub struct Env {
    pub cluster: TestCluster,
    /// The driver's name in this test: one of its own, since on a shared real cluster the
    /// provisioners of concurrent tests (and the cluster's own CSI sidecars) would otherwise
    /// all act on every test's claims.
    pub driver: String,
    pub mock: MockHandle,
    pub csi: CsiClient,
    pub shutdown: CancellationToken,
    pub task: Option<JoinHandle<()>>,
    pub classes: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub async fn start(
        driver: MockDriver,
        args: &[&str],
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let mut env = Self::without_controller(driver).await;
        let mut config = env.config(args).await;
        adjust(&mut config);
        env.launch(config);
        env
    }

    pub async fn without_controller(driver: MockDriver) -> Self {
        let cluster = TestCluster::start().await.unwrap();
        let (driver, name) = if driver.config().driver_name == DRIVER {
            let name = format!("{}.csi.test", cluster.namespace());
            (driver.driver_name(name.clone()), name)
        } else {
            let name = driver.config().driver_name.clone();
            (driver, name)
        };
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
            shutdown: CancellationToken::new(),
            task: None,
            classes: Vec::new(),
            dir,
        }
    }

    /// The configuration a deployment with `args` gets for the mock, with fast retries.
    pub async fn config(&self, args: &[&str]) -> Config {
        self.config_for(&self.csi, args).await
    }

    /// The configuration for the driver behind `csi`.
    pub async fn config_for(&self, csi: &CsiClient, args: &[&str]) -> Config {
        let cli = cli(args);
        let caps = app::capabilities(csi, Duration::from_secs(5))
            .await
            .unwrap();
        let mut config = app::config(&cli, &self.driver, caps, &self.identity());
        config.backoff = Backoff {
            start: Duration::from_millis(50),
            max: Duration::from_secs(2),
        };
        config.workers = 4;
        app::discover(&cli, &self.client(), &mut config).await;
        config
    }

    /// A name for a cluster-scoped object of this test: unique, and under the test namespace's
    /// prefix, so that the cluster's cleanup finds it even when the test fails half-way.
    pub fn unique(&self, base: &str) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        self.cluster
            .cluster_name(&format!("{base}-{}", N.fetch_add(1, Ordering::Relaxed)))
    }

    /// The provisioner identity the tests' controllers write.
    pub fn identity(&self) -> String {
        format!("1700000000000-42-{}", self.driver)
    }

    /// The journal location of the tests: in the test's namespace.
    pub fn journal_location(&self) -> Location {
        Location {
            namespace: self.namespace(),
            name: "provisioner-journal".into(),
            key_secret: "provisioner-journal-key".into(),
            lease: "provisioner".into(),
        }
    }

    /// The real binary, set to talk to this test's cluster and driver (and to nothing from the
    /// test's own environment); it dies with the test.
    pub fn binary(&self) -> tokio::process::Command {
        use testkit::process::CleanEnv;
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_csi-provisioner"));
        command
            .clean_env()
            .arg(format!(
                "--kubeconfig={}",
                self.cluster.kubeconfig_path().display()
            ))
            .arg(format!(
                "--csi-address={}",
                self.mock.socket_path().display()
            ))
            .kill_on_drop(true);
        testkit::process::die_with_parent(&mut command);
        command
    }

    /// Starts a controller.
    pub fn launch(&mut self, config: Config) {
        self.shutdown = CancellationToken::new();
        self.task = Some(tokio::spawn(controller::run(
            config,
            self.cluster.client(),
            self.csi.clone(),
            self.shutdown.clone(),
        )));
    }

    /// Stops the controller as SIGTERM does (a rolling update): it finishes what it runs.
    pub async fn stop_gracefully(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    /// Crashes the controller: its task is dropped wherever it is.
    pub async fn crash(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    pub fn namespace(&self) -> String {
        self.cluster.namespace().to_string()
    }

    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client(), self.cluster.namespace())
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client())
    }

    /// A StorageClass of the driver; returns its (unique) name.
    pub async fn create_class(&mut self, extra: Value) -> String {
        let name = self.unique("sc");
        let mut sc = json!({"metadata": {"name": name}, "provisioner": self.driver});
        merge(&mut sc, extra);
        let sc: StorageClass = serde_json::from_value(sc).unwrap();
        Api::<StorageClass>::all(self.client())
            .create(&PostParams::default(), &sc)
            .await
            .unwrap();
        self.classes.push(name.clone());
        name
    }

    pub async fn create_claim(
        &self,
        name: &str,
        class: &str,
        extra: Value,
    ) -> PersistentVolumeClaim {
        self.try_create_claim(name, class, extra).await.unwrap()
    }

    /// Like [`Env::create_claim`], with the API server's refusal returned.
    pub async fn try_create_claim(
        &self,
        name: &str,
        class: &str,
        extra: Value,
    ) -> Result<PersistentVolumeClaim, kube::Error> {
        let mut pvc = json!({
            "metadata": {"name": name},
            "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}
        });
        merge(&mut pvc, extra);
        let pvc: PersistentVolumeClaim = serde_json::from_value(pvc).unwrap();
        self.pvcs().create(&PostParams::default(), &pvc).await
    }

    pub async fn delete_claim(&self, name: &str) {
        self.pvcs()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    /// Waits until the claim is bound; returns its PV.
    pub async fn wait_bound(&self, claim: &str) -> PersistentVolume {
        self.wait_bound_within(claim, WAIT).await
    }

    /// Waits at most `limit` until the claim is bound; returns its PV.
    pub async fn wait_bound_within(&self, claim: &str, limit: Duration) -> PersistentVolume {
        let pvcs = self.pvcs();
        let pvs = self.pvs();
        eventually_within(&format!("claim {claim} bound"), limit, || {
            let (pvcs, pvs) = (pvcs.clone(), pvs.clone());
            let claim = claim.to_string();
            async move {
                let pvc = pvcs.get_opt(&claim).await.unwrap()?;
                let bound = pvc.status.as_ref()?.phase.as_deref() == Some("Bound");
                let volume = pvc.spec.as_ref()?.volume_name.clone()?;
                if !bound {
                    return None;
                }
                pvs.get_opt(&volume).await.unwrap()
            }
        })
        .await
    }

    pub async fn wait_pv_gone(&self, name: &str) {
        let pvs = self.pvs();
        eventually(&format!("PV {name} deleted"), || {
            let pvs = pvs.clone();
            let name = name.to_string();
            async move { pvs.get_opt(&name).await.unwrap().is_none().then_some(()) }
        })
        .await
    }

    /// Events about the claim or PV `name` in `namespace`.
    pub async fn events_for(&self, namespace: &str, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    pub async fn wait_event(&self, name: &str, reason: &str, message_part: &str) -> Event {
        let namespace = self.namespace();
        eventually(
            &format!("a {reason} event for {name} containing {message_part:?}"),
            || async {
                self.events_for(&namespace, name)
                    .await
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.contains(message_part))
                    })
            },
        )
        .await
    }

    /// Volumes the mock driver holds (by the key of its state).
    pub fn driver_volumes(&self) -> Vec<String> {
        self.mock.state().volumes.keys().cloned().collect()
    }

    /// IDs of the volumes the mock driver holds.
    pub fn driver_volumes_by_id(&self) -> Vec<String> {
        self.mock
            .state()
            .volumes
            .values()
            .map(|v| v.id.clone())
            .collect()
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
        for class in &self.classes {
            let _ = Api::<StorageClass>::all(self.client())
                .delete(class, &DeleteParams::default())
                .await;
        }
        self.mock.shutdown().await.unwrap();
        self.cluster.cleanup().await.unwrap();
    }
}

/// Merges `extra` into `base` (objects recursively, everything else replaced).
pub fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(base), Value::Object(extra)) => {
            for (k, v) in extra {
                merge(base.entry(k).or_insert(Value::Null), v);
            }
        }
        (base, extra) => *base = extra,
    }
}

/// The JSON of the kept calls of `method`.
pub fn requests(mock: &MockHandle, method: &str) -> Vec<Value> {
    mock.calls()
        .of(method)
        .into_iter()
        .map(|c| serde_json::from_str(&c.request).unwrap())
        .collect()
}
