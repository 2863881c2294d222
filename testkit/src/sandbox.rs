//! The sandbox: the in-process API server and the mock driver, every sidecar binary that exists
//! running against them, and a StorageClass, a PVC and a VolumeAttachment to show them at work
//! (and, with csi-snapshot-metadata, the blocks changed between two snapshots of a block claim).

mod changed_blocks;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability, volume_capability};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass, VolumeAttachment};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::apiserver::{self, ApiServer};
use crate::kubelet;
use crate::mockdriver::{MockDriver, MockHandle};
use crate::process::CleanEnv;

pub const DRIVER: &str = "mock.csi.example.com";
pub const NODE: &str = "sandbox-node";
const NAMESPACE: &str = "default";
/// How long one step may wait for its outcome.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("API server: {0}")]
    ApiServer(#[from] apiserver::ApiServerError),
    #[error("mock driver: {0}")]
    Driver(#[from] crate::mockdriver::MockError),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Setup(String),
}

/// Outcome of one thing the sandbox shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok(String),
    Skipped(String),
    Failed(String),
}

#[derive(Clone, Debug)]
pub struct Step {
    pub name: &'static str,
    pub outcome: Outcome,
}

/// Where the sidecar binaries are and where to put sockets and logs.
#[derive(Clone, Debug, Default)]
pub struct SandboxOptions {
    pub bin_dir: PathBuf,
    pub work_dir: PathBuf,
    /// Where the started sidecars are kept: the caller's handle stops them even while
    /// [`start`] is still waiting for a step (e.g. on a signal).
    pub children: Children,
    /// Run the provisioner with capacity tracking and show its CSIStorageCapacity objects.
    pub capacity: bool,
}

/// The sidecar processes of a sandbox. Each dies with the sandbox process however that ends
/// ([`crate::process::die_with_parent`]); [`Children::stop`] stops them gracefully.
#[derive(Clone, Debug, Default)]
pub struct Children {
    running: Arc<Mutex<Vec<(&'static str, Child)>>>,
    /// Variables every sidecar gets (the collector of `sandbox --trace`).
    env: Arc<Vec<(String, String)>>,
}

impl Children {
    /// Children that all get the variables `env`.
    pub fn with_env(env: Vec<(String, String)>) -> Self {
        Self {
            running: Arc::default(),
            env: Arc::new(env),
        }
    }

    fn spawn(
        &self,
        name: &'static str,
        binary: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log_dir: &Path,
    ) -> Result<(), SandboxError> {
        let log = std::fs::File::create(log_dir.join(format!("{name}.log")))?;
        // Variables of the user's shell would send a sidecar elsewhere: the provisioner, as
        // upstream's, prefers $KUBECONFIG to --kubeconfig, and keeps its intent journal in
        // $POD_NAMESPACE.
        let child = crate::process::die_with_parent(
            Command::new(binary)
                .clean_env()
                .args(args)
                .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true),
        )
        .spawn()?;
        if let Some(pid) = child.id() {
            println!("started {name} (pid {pid})");
        }
        self.lock().push((name, child));
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(&'static str, Child)>> {
        // A panic while holding the lock leaves a plain Vec behind: still usable.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The process ids of the children still held.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.lock()
            .iter()
            .filter_map(|(name, child)| Some((*name, child.id()?)))
            .collect()
    }

    /// SIGTERM to every child, then waits for each (killing any still running after 10 s).
    pub async fn stop(&self) {
        let mut children = std::mem::take(&mut *self.lock());
        for (_, child) in &mut children {
            terminate(child);
        }
        for (name, child) in &mut children {
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                println!("{name} did not stop within 10 s; killing it");
                let _ = child.kill().await;
            }
        }
    }
}

/// A running sandbox; dropping it stops every process and server.
pub struct Sandbox {
    pub api: ApiServer,
    pub driver: MockHandle,
    pub steps: Vec<Step>,
    children: Children,
    work_dir: PathBuf,
    /// The sidecars started with a `/metrics` endpoint, by step name, and their HTTP ports.
    metrics: Vec<(&'static str, u16)>,
}

impl Sandbox {
    pub fn kubeconfig(&self) -> &Path {
        self.api.kubeconfig_path()
    }

    pub fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.steps
            .iter()
            .find(|s| s.name == name)
            .map(|s| &s.outcome)
    }

    /// The sidecars that serve `/metrics` (all but the node-driver-registrar, which has no
    /// metrics, as upstream), by step name, and their ports on 127.0.0.1.
    pub fn metrics_endpoints(&self) -> &[(&'static str, u16)] {
        &self.metrics
    }

    fn record(&mut self, name: &'static str, outcome: Outcome) {
        let (mark, text) = match &outcome {
            Outcome::Ok(t) => ("ok  ", t),
            Outcome::Skipped(t) => ("skip", t),
            Outcome::Failed(t) => ("FAIL", t),
        };
        println!("[{mark}] {name}: {text}");
        self.steps.push(Step { name, outcome });
    }

    /// Stops the sidecars gracefully (SIGTERM, then kill after 10 s).
    pub async fn stop(self) {
        self.children.stop().await;
    }

    fn spawn(
        &mut self,
        name: &'static str,
        binary: &Path,
        args: &[String],
    ) -> Result<(), SandboxError> {
        self.children.spawn(name, binary, args, &[], &self.work_dir)
    }
}

#[cfg(unix)]
fn terminate(child: &mut Child) {
    if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
        // SAFETY: sending a signal to a child process we own.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
}

#[cfg(not(unix))]
fn terminate(child: &mut Child) {
    let _ = child.start_kill();
}

/// A typed object from its JSON form.
fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, SandboxError> {
    serde_json::from_value(value).map_err(|e| SandboxError::Setup(e.to_string()))
}

/// Polls `check` until it yields a value or the step timeout passes.
async fn wait_for<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + STEP_TIMEOUT;
    while Instant::now() < deadline {
        if let Some(value) = check().await {
            return Some(value);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// Starts everything and shows each step; errors only for failures of the kit itself.
pub async fn start(options: &SandboxOptions) -> Result<Sandbox, SandboxError> {
    std::fs::create_dir_all(&options.work_dir)?;
    let api = ApiServer::start_with(apiserver::Options {
        pv_controller: true,
        snapshot_controller: true,
        ..Default::default()
    })
    .await?;
    let socket = options.work_dir.join("csi.sock");
    let driver = MockDriver::builder()
        .driver_name(DRIVER)
        .node_id(NODE)
        .volume_condition(true)
        // For csi-snapshot-metadata: the blocks written to a volume, listed per snapshot.
        .snapshot_metadata(true)
        .serve_unix(&socket)
        .await?;
    let mut sandbox = Sandbox {
        api,
        driver,
        steps: Vec::new(),
        children: options.children.clone(),
        work_dir: options.work_dir.clone(),
        metrics: Vec::new(),
    };
    sandbox.record(
        "api-server",
        Outcome::Ok(format!(
            "{} (kubeconfig {})",
            sandbox.api.url(),
            sandbox.kubeconfig().display()
        )),
    );
    sandbox.record(
        "mock-driver",
        Outcome::Ok(format!("{DRIVER} on {}", sandbox.driver.endpoint())),
    );

    create_node(&sandbox.api.client()).await?;
    let binary = |name: &str| built(&options.bin_dir, name);
    let endpoint = sandbox.driver.endpoint();

    // Every process first, so that all of them are up (and stoppable) before any step waits.
    let probe = spawn_livenessprobe(&mut sandbox, binary("livenessprobe"), &endpoint)?;
    let registrar = spawn_registrar(&mut sandbox, binary("csi-node-driver-registrar"), &endpoint)?;
    let bin_dir = &options.bin_dir;
    let attacher = spawn_controller(
        &mut sandbox,
        "external-attacher",
        "csi-attacher",
        bin_dir,
        &[],
    )?;
    let resizer = spawn_controller(
        &mut sandbox,
        "external-resizer",
        "csi-resizer",
        bin_dir,
        &[],
    )?;
    let snapshotter = spawn_controller(
        &mut sandbox,
        "external-snapshotter",
        "csi-snapshotter",
        bin_dir,
        &[],
    )?;
    // Checking the volumes every second.
    let monitor = spawn_controller(
        &mut sandbox,
        "external-health-monitor",
        "csi-external-health-monitor-controller",
        bin_dir,
        &["--list-volumes-interval=1s"],
    )?;
    let provisioner = spawn_provisioner(
        &mut sandbox,
        binary("csi-provisioner"),
        &endpoint,
        options.capacity,
    )?;
    let snapshot_metadata =
        changed_blocks::spawn(&mut sandbox, binary("csi-snapshot-metadata"), &endpoint)?;

    check_livenessprobe(&mut sandbox, probe).await;
    check_registrar(&mut sandbox, registrar).await;
    volumes(&mut sandbox, attacher, resizer, snapshotter, provisioner).await?;
    if let Some(port) = monitor {
        let outcome = match health(&sandbox, port).await {
            Ok(outcome) => outcome,
            Err(err) => Outcome::Failed(err.to_string()),
        };
        sandbox.record("external-health-monitor", outcome);
    }
    if let Some(server) = snapshot_metadata {
        let outcome = if snapshotter.is_none() {
            Outcome::Skipped("binary csi-snapshotter not built: no snapshots to compare".into())
        } else {
            match changed_blocks::show(&sandbox, &server, provisioner).await {
                Ok(outcome) => outcome,
                Err(err) => Outcome::Failed(err.to_string()),
            }
        };
        sandbox.record(changed_blocks::STEP, outcome);
    }
    if options.capacity && provisioner {
        let outcome = capacity(&sandbox).await?;
        sandbox.record("capacity", outcome);
    }

    println!();
    println!(
        "kubectl --kubeconfig {} get storageclass,pv,pvc,volumeattachments,csinodes,csistoragecapacities,leases -A",
        sandbox.kubeconfig().display()
    );
    println!("sidecar logs: {}", sandbox.work_dir.display());
    Ok(sandbox)
}

async fn create_node(client: &kube::Client) -> Result<(), SandboxError> {
    let node: Node = object(json!({"metadata": {"name": NODE}}))?;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    let csinode: CSINode = object(json!({
        "metadata": {"name": NODE},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE, "topologyKeys": []}]}
    }))?;
    Api::<CSINode>::all(client.clone())
        .create(&PostParams::default(), &csinode)
        .await?;
    Ok(())
}

/// Starts the livenessprobe; its HTTP port, or `None` when it is not built.
fn spawn_livenessprobe(
    sandbox: &mut Sandbox,
    binary: Option<PathBuf>,
    endpoint: &str,
) -> Result<Option<u16>, SandboxError> {
    let Some(binary) = binary else {
        sandbox.record(
            "livenessprobe",
            Outcome::Skipped("binary livenessprobe not built".into()),
        );
        return Ok(None);
    };
    let port = crate::measure::free_port()?;
    sandbox.spawn(
        "livenessprobe",
        &binary,
        &[
            format!("--csi-address={endpoint}"),
            format!("--http-endpoint=127.0.0.1:{port}"),
        ],
    )?;
    sandbox.metrics.push(("livenessprobe", port));
    Ok(Some(port))
}

async fn check_livenessprobe(sandbox: &mut Sandbox, port: Option<u16>) {
    let Some(port) = port else {
        return;
    };
    let answer = wait_for(|| async move {
        crate::measure::http_get(port, "/healthz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    let outcome = match answer {
        Some(_) => Outcome::Ok(format!(
            "/healthz ok at http://127.0.0.1:{port}/healthz, metrics at http://127.0.0.1:{port}/metrics"
        )),
        None => Outcome::Failed(format!(
            "/healthz on port {port} did not answer 200 within {STEP_TIMEOUT:?}"
        )),
    };
    sandbox.record("livenessprobe", outcome);
}

/// Starts the registrar; its registration socket and HTTP port, or `None` when it is not built.
fn spawn_registrar(
    sandbox: &mut Sandbox,
    binary: Option<PathBuf>,
    endpoint: &str,
) -> Result<Option<(PathBuf, u16)>, SandboxError> {
    let Some(binary) = binary else {
        sandbox.record(
            "node-driver-registrar",
            Outcome::Skipped("binary csi-node-driver-registrar not built".into()),
        );
        return Ok(None);
    };
    let registry = sandbox.work_dir.join("plugins_registry");
    std::fs::create_dir_all(&registry)?;
    let kubelet_path = format!("/var/lib/kubelet/plugins/{DRIVER}/csi.sock");
    let port = crate::measure::free_port()?;
    sandbox.spawn(
        "node-driver-registrar",
        &binary,
        &[
            format!("--csi-address={endpoint}"),
            format!("--kubelet-registration-path={kubelet_path}"),
            format!("--plugin-registration-path={}", registry.display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
        ],
    )?;
    Ok(Some((registry.join(format!("{DRIVER}-reg.sock")), port)))
}

async fn check_registrar(sandbox: &mut Sandbox, registrar: Option<(PathBuf, u16)>) {
    let Some((socket, port)) = registrar else {
        return;
    };
    let registered = wait_for(|| {
        let socket = socket.clone();
        async move { kubelet::register(&socket).await.ok() }
    })
    .await;
    let outcome = match registered {
        Some(info) => Outcome::Ok(format!(
            "kubelet registration of {} at {} (versions {:?}); /healthz at http://127.0.0.1:{port}/healthz",
            info.name, info.endpoint, info.supported_versions
        )),
        None => Outcome::Failed(format!(
            "no registration at {} within {STEP_TIMEOUT:?}",
            socket.display()
        )),
    };
    sandbox.record("node-driver-registrar", outcome);
}

/// The path of `binary` in `bin_dir`, if it is built.
fn built(bin_dir: &Path, binary: &str) -> Option<PathBuf> {
    let path = bin_dir.join(binary);
    path.is_file().then_some(path)
}

/// Starts the controller sidecar `binary` as a deployment runs it (leader election in the
/// sandbox's namespace), with `extra` flags, as step `step`; its HTTP port, or `None` when it
/// is not built.
fn spawn_controller(
    sandbox: &mut Sandbox,
    step: &'static str,
    binary: &str,
    bin_dir: &Path,
    extra: &[&str],
) -> Result<Option<u16>, SandboxError> {
    let Some(path) = built(bin_dir, binary) else {
        sandbox.record(step, Outcome::Skipped(format!("binary {binary} not built")));
        return Ok(None);
    };
    let endpoint = sandbox.driver.endpoint();
    let kubeconfig = sandbox.kubeconfig().display().to_string();
    let port = crate::measure::free_port()?;
    let mut args = vec![
        format!("--csi-address={endpoint}"),
        format!("--kubeconfig={kubeconfig}"),
        "--leader-election".into(),
        format!("--leader-election-namespace={NAMESPACE}"),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ];
    args.extend(extra.iter().map(|flag| flag.to_string()));
    sandbox.spawn(step, &path, &args)?;
    sandbox.metrics.push((step, port));
    Ok(Some(port))
}

/// The driver reports the claim's volume abnormal: the health monitor records a Warning on the
/// claim; healthy again, a Normal Event says so.
async fn health(sandbox: &Sandbox, monitor_port: u16) -> Result<Outcome, SandboxError> {
    let client = sandbox.api.client();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let Some(pv_name) = claims
        .get("sandbox-pvc")
        .await?
        .spec
        .and_then(|s| s.volume_name)
    else {
        return Ok(Outcome::Failed("PVC sandbox-pvc has no volume".into()));
    };
    let handle = pvs
        .get(&pv_name)
        .await?
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .unwrap_or_default();
    let set = |condition: Option<crate::mockdriver::Condition>| {
        sandbox
            .driver
            .update_state(|s| s.set_condition(&handle, condition))
            .map_err(|err| SandboxError::Setup(err.to_string()))?
            .map_err(|err| SandboxError::Setup(err.to_string()))
    };
    let message = "the mock driver lost the volume's backing store";
    set(Some(crate::mockdriver::Condition {
        abnormal: true,
        message: message.into(),
    }))?;
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client, NAMESPACE);
    let reported = |reason: &'static str| {
        let events = events.clone();
        wait_for(move || {
            let events = events.clone();
            async move {
                let list = events
                    .list(
                        &kube::api::ListParams::default().fields("involvedObject.name=sandbox-pvc"),
                    )
                    .await
                    .ok()?;
                list.items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some(reason))
                    .map(|e| e.message.unwrap_or_default())
            }
        })
    };
    if reported("VolumeConditionAbnormal").await.is_none() {
        return Ok(Outcome::Failed(format!(
            "no VolumeConditionAbnormal Event on PVC sandbox-pvc within {STEP_TIMEOUT:?}"
        )));
    }
    set(None)?;
    Ok(match reported("VolumeConditionNormal").await {
        Some(normal) => Outcome::Ok(format!(
            "volume {handle} reported abnormal by the driver: Warning VolumeConditionAbnormal \"{message}\" on PVC sandbox-pvc; healthy again: \"{normal}\"; metrics at http://127.0.0.1:{monitor_port}/metrics"
        )),
        None => Outcome::Failed(format!(
            "no VolumeConditionNormal Event on PVC sandbox-pvc within {STEP_TIMEOUT:?}"
        )),
    })
}

/// Asks for 2Gi instead of 1Gi: the resizer grows the volume and its PV, and the claim waits
/// for the node to grow the file system.
async fn expand(
    sandbox: &Sandbox,
    pv_name: &str,
    resizer_port: u16,
) -> Result<Outcome, SandboxError> {
    let client = sandbox.api.client();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let patch = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    claims
        .patch(
            "sandbox-pvc",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let pvs = Api::<PersistentVolume>::all(client);
    let grown = wait_for(|| {
        let (claims, pvs) = (claims.clone(), pvs.clone());
        async move {
            let pv = pvs.get(pv_name).await.ok()?;
            let capacity = pv.spec?.capacity?.get("storage")?.0.clone();
            let status = claims.get("sandbox-pvc").await.ok()?.status?;
            let state = status.allocated_resource_statuses?.get("storage")?.clone();
            (capacity == "2Gi").then_some(state)
        }
    })
    .await;
    Ok(match grown {
        Some(state) => Outcome::Ok(format!(
            "PVC sandbox-pvc asked for 2Gi: PV {pv_name} grown to 2Gi, the claim is {state} (the node grows the file system); metrics at http://127.0.0.1:{resizer_port}/metrics"
        )),
        None => Outcome::Failed(format!(
            "PV {pv_name} not grown to 2Gi within {STEP_TIMEOUT:?}"
        )),
    })
}

/// Starts the provisioner if it is built; whether it runs.
fn spawn_provisioner(
    sandbox: &mut Sandbox,
    binary: Option<PathBuf>,
    endpoint: &str,
    capacity: bool,
) -> Result<bool, SandboxError> {
    let Some(binary) = binary else {
        return Ok(false);
    };
    let kubeconfig = sandbox.kubeconfig().display().to_string();
    let port = crate::measure::free_port()?;
    let mut args = vec![
        format!("--csi-address={endpoint}"),
        format!("--kubeconfig={kubeconfig}"),
        format!("--http-endpoint=127.0.0.1:{port}"),
    ];
    let mut env = Vec::new();
    if capacity {
        args.extend([
            "--enable-capacity".to_string(),
            "--capacity-ownerref-level=-1".to_string(),
            "--capacity-poll-interval=10s".to_string(),
        ]);
        env.push(("NAMESPACE", NAMESPACE));
    }
    sandbox.children.spawn(
        "external-provisioner",
        &binary,
        &args,
        &env,
        &sandbox.work_dir.clone(),
    )?;
    sandbox.metrics.push(("external-provisioner", port));
    Ok(true)
}

async fn volumes(
    sandbox: &mut Sandbox,
    attacher_port: Option<u16>,
    resizer_port: Option<u16>,
    snapshotter_port: Option<u16>,
    provisioner: bool,
) -> Result<(), SandboxError> {
    let client = sandbox.api.client();
    let class: StorageClass = object(json!({
        "metadata": {"name": "sandbox"},
        "provisioner": DRIVER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "allowVolumeExpansion": true
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let claim: PersistentVolumeClaim = object(json!({
        "metadata": {"name": "sandbox-pvc", "namespace": NAMESPACE},
        "spec": {"storageClassName": "sandbox", "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE);
    let claim = claims.create(&PostParams::default(), &claim).await?;

    if !provisioner {
        sandbox.record(
            "external-provisioner",
            Outcome::Skipped(
                "binary csi-provisioner not built: creating the volume and its PV by hand".into(),
            ),
        );
        provision_by_hand(sandbox, &claim).await?;
    }
    let bound = wait_for(|| {
        let claims = claims.clone();
        async move {
            let claim = claims.get("sandbox-pvc").await.ok()?;
            let phase = claim.status.as_ref()?.phase.clone()?;
            (phase == "Bound")
                .then(|| claim.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    let Some(pv_name) = bound else {
        sandbox.record(
            "volume",
            Outcome::Failed(format!("PVC sandbox-pvc not bound within {STEP_TIMEOUT:?}")),
        );
        return Ok(());
    };
    sandbox.record(
        "volume",
        Outcome::Ok(format!("PVC {NAMESPACE}/sandbox-pvc bound to PV {pv_name}")),
    );
    if let Some(snapshotter_port) = snapshotter_port {
        let snapshot = match snapshot(sandbox, snapshotter_port).await {
            Ok(outcome) => outcome,
            Err(err) => Outcome::Failed(err.to_string()),
        };
        let ready = matches!(snapshot, Outcome::Ok(_));
        sandbox.record("external-snapshotter", snapshot);
        if ready && provisioner {
            let outcome = match restore(sandbox).await {
                Ok(outcome) => outcome,
                Err(err) => Outcome::Failed(err.to_string()),
            };
            sandbox.record("restore", outcome);
        }
    }
    if let Some(resizer_port) = resizer_port {
        let outcome = match expand(sandbox, &pv_name, resizer_port).await {
            Ok(outcome) => outcome,
            Err(err) => Outcome::Failed(err.to_string()),
        };
        sandbox.record("external-resizer", outcome);
    }

    let Some(attacher_port) = attacher_port else {
        return Ok(());
    };
    let attachment: VolumeAttachment = object(json!({
        "metadata": {"name": "sandbox-va"},
        "spec": {"attacher": DRIVER, "nodeName": NODE, "source": {"persistentVolumeName": pv_name}}
    }))?;
    let attachments = Api::<VolumeAttachment>::all(client);
    attachments
        .create(&PostParams::default(), &attachment)
        .await?;
    let attached = wait_for(|| {
        let attachments = attachments.clone();
        async move {
            let status = attachments.get("sandbox-va").await.ok()?.status?;
            status
                .attached
                .then(|| status.attachment_metadata.unwrap_or_default())
        }
    })
    .await;
    let outcome = match attached {
        Some(metadata) => Outcome::Ok(format!(
            "VolumeAttachment sandbox-va attached to {NODE} (metadata {metadata:?}); metrics at http://127.0.0.1:{attacher_port}/metrics"
        )),
        None => Outcome::Failed(format!(
            "VolumeAttachment sandbox-va not attached within {STEP_TIMEOUT:?}"
        )),
    };
    sandbox.record("external-attacher", outcome);
    Ok(())
}

/// A late-binding StorageClass, and the CSIStorageCapacity object the provisioner publishes
/// for it.
async fn capacity(sandbox: &Sandbox) -> Result<Outcome, SandboxError> {
    let client = sandbox.api.client();
    let class: StorageClass = object(json!({
        "metadata": {"name": "sandbox-late"},
        "provisioner": DRIVER,
        "volumeBindingMode": "WaitForFirstConsumer"
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let objects = Api::<CSIStorageCapacity>::namespaced(client, NAMESPACE);
    let published = wait_for(|| {
        let objects = objects.clone();
        async move {
            let list = objects.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|o| o.storage_class_name == "sandbox-late" && o.capacity.is_some())
        }
    })
    .await;
    Ok(match published {
        Some(object) => Outcome::Ok(format!(
            "CSIStorageCapacity {NAMESPACE}/{} for StorageClass sandbox-late: capacity {}",
            object.metadata.name.unwrap_or_default(),
            object.capacity.map(|q| q.0).unwrap_or_default()
        )),
        None => Outcome::Failed(format!(
            "no CSIStorageCapacity for StorageClass sandbox-late within {STEP_TIMEOUT:?}"
        )),
    })
}

fn snapshot_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

/// A VolumeSnapshot of sandbox-pvc: the test kit's snapshot-controller makes its content, the
/// snapshotter has the driver cut it, and the snapshot becomes ready to use.
async fn snapshot(sandbox: &Sandbox, snapshotter_port: u16) -> Result<Outcome, SandboxError> {
    let ready = cut_snapshot(sandbox, "sandbox-snapshot", "sandbox-pvc").await?;
    Ok(match ready {
        Some(content) => Outcome::Ok(format!(
            "VolumeSnapshot {NAMESPACE}/sandbox-snapshot of sandbox-pvc ready, content {content}; metrics at http://127.0.0.1:{snapshotter_port}/metrics"
        )),
        None => Outcome::Failed(format!(
            "VolumeSnapshot sandbox-snapshot not ready within {STEP_TIMEOUT:?}"
        )),
    })
}

/// The sandbox's VolumeSnapshotClass `sandbox` (of the mock driver), created unless it exists.
async fn snapshot_class(client: &kube::Client) -> Result<(), SandboxError> {
    let classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &snapshot_resource("VolumeSnapshotClass", "volumesnapshotclasses"),
    );
    let class = object(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": "sandbox"}, "driver": DRIVER, "deletionPolicy": "Delete"
    }))?;
    match classes.create(&PostParams::default(), &class).await {
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        created => created.map(drop).map_err(SandboxError::from),
    }
}

/// A VolumeSnapshot `name` of claim `claim` in class `sandbox`: the test kit's snapshot
/// controller makes its content, the snapshotter has the driver cut it. The name of its bound
/// content once it is ready to use, or `None` if it is not within the step timeout.
async fn cut_snapshot(
    sandbox: &Sandbox,
    name: &str,
    claim: &str,
) -> Result<Option<String>, SandboxError> {
    let client = sandbox.api.client();
    snapshot_class(&client).await?;
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        client,
        NAMESPACE,
        &snapshot_resource("VolumeSnapshot", "volumesnapshots"),
    );
    snapshots
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name},
                "spec": {"volumeSnapshotClassName": "sandbox",
                    "source": {"persistentVolumeClaimName": claim}}
            }))?,
        )
        .await?;
    Ok(wait_for(|| {
        let snapshots = snapshots.clone();
        async move {
            let snapshot = snapshots.get(name).await.ok()?;
            let status = snapshot.data.get("status")?;
            (status.get("readyToUse")? == true).then(|| {
                status
                    .get("boundVolumeSnapshotContentName")
                    .and_then(|c| c.as_str())
                    .unwrap_or_default()
                    .to_string()
            })
        }
    })
    .await)
}

/// Has the provisioner restore the ready snapshot into a new claim.
async fn restore(sandbox: &Sandbox) -> Result<Outcome, SandboxError> {
    let client = sandbox.api.client();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client, NAMESPACE);
    let claim: PersistentVolumeClaim = object(json!({
        "metadata": {"name": "sandbox-restore"},
        "spec": {"storageClassName": "sandbox", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "sandbox-snapshot"}}
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    let bound = wait_for(|| {
        let claims = claims.clone();
        async move {
            let claim = claims.get("sandbox-restore").await.ok()?;
            (claim.status?.phase.as_deref() == Some("Bound"))
                .then(|| claim.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    Ok(match bound {
        Some(volume) => Outcome::Ok(format!(
            "PVC {NAMESPACE}/sandbox-restore restored from VolumeSnapshot sandbox-snapshot into PV {volume}"
        )),
        None => Outcome::Failed(format!(
            "PVC sandbox-restore not restored from its snapshot within {STEP_TIMEOUT:?}"
        )),
    })
}

/// What the provisioner would do: CreateVolume on the driver (1Gi, of the claim's volume mode)
/// and a PV bound to the claim.
async fn provision_by_hand(
    sandbox: &Sandbox,
    claim: &PersistentVolumeClaim,
) -> Result<(), SandboxError> {
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let block = claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let name = format!("pvc-{uid}");
    let channel = crate::kubelet::dial_unix(sandbox.driver.socket_path())
        .await
        .map_err(|e| SandboxError::Setup(e.to_string()))?;
    let access_type = if block {
        volume_capability::AccessType::Block(volume_capability::BlockVolume::default())
    } else {
        volume_capability::AccessType::Mount(volume_capability::MountVolume::default())
    };
    let capability = VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    };
    let created = ControllerClient::new(channel)
        .create_volume(CreateVolumeRequest {
            name: name.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![capability],
            ..Default::default()
        })
        .await
        .map_err(|status| SandboxError::Setup(format!("CreateVolume: {status}")))?
        .into_inner();
    let volume = created
        .volume
        .ok_or_else(|| SandboxError::Setup("CreateVolume returned no volume".into()))?;
    let mut csi = json!({"driver": DRIVER, "volumeHandle": volume.volume_id});
    if !block {
        csi["fsType"] = json!("ext4");
    }
    let pv: PersistentVolume = object(json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "sandbox",
            "volumeMode": if block { "Block" } else { "Filesystem" },
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": NAMESPACE, "name": claim_name, "uid": uid},
            "csi": csi
        }
    }))?;
    Api::<PersistentVolume>::all(sandbox.api.client())
        .create(&PostParams::default(), &pv)
        .await?;
    Ok(())
}
