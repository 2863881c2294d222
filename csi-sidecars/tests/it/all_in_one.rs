//! `csi-sidecars --controllers=*` run for real: one process provisions, attaches, expands,
//! snapshots and reports volume health, through one driver connection, with one list of each
//! kind it watches, its controllers' metrics on one endpoint and each controller's own Lease.
#![cfg(unix)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use testkit::apiserver::{Options, TestCluster, Verb};
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::{Condition, MockDriver, MockHandle};
use testkit::otlp::{Collector, parse_traceparent};
use testkit::process::CleanEnv;

const BIN: &str = env!("CARGO_BIN_EXE_csi-sidecars");
const WAIT: Duration = Duration::from_secs(60);
const PROBE: &str = "/csi.v1.Identity/Probe";

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
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

async fn create<K>(api: &Api<K>, object: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap()
}

/// Starts `command` (the binary, possibly wrapped) with `args`, dying with the test; its
/// standard error is kept when `stderr` asks for it.
fn start(
    mut command: tokio::process::Command,
    args: impl IntoIterator<Item = String>,
    stderr: Stdio,
) -> tokio::process::Child {
    command.args(args);
    testkit::process::spawn_sidecar(&mut command, stderr).unwrap()
}

/// This machine's host name, which the sidecars' leader election Events name.
fn host_name() -> String {
    let mut name = [0u8; 256];
    // SAFETY: the buffer is writable for the length given.
    let rc = unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) };
    assert_eq!(rc, 0, "gethostname");
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..end]).into_owned()
}

/// Checks the Event of the election won on the Lease `lease` as client-go's LeaseLock records
/// it, from the component csi-lib-utils names after the lock `lock`.
async fn assert_won_election_event(client: &kube::Client, ns: &str, lease: &str, lock: &str) {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let event = eventually(&format!("the LeaderElection Event on {lease}"), || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.involved_object.kind.as_deref() == Some("Lease")
                    && e.involved_object.name.as_deref() == Some(lease)
                    && e.reason.as_deref() == Some("LeaderElection")
            })
    })
    .await;
    let holder = Api::<Lease>::namespaced(client.clone(), ns)
        .get(lease)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert_eq!(
        event.message.as_deref(),
        Some(format!("{holder} became leader").as_str())
    );
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(
        event.source.and_then(|s| s.component),
        Some(format!("{lock}/{}", host_name()))
    );
}

/// Waits until the claim `name` is bound; its PV's name.
async fn bound(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    eventually("the claim bound", || async {
        let claim = claims.get(name).await.ok()?;
        (claim.status?.phase.as_deref() == Some("Bound")).then_some(claim.spec?.volume_name?)
    })
    .await
}

/// Creates the VolumeAttachment `name` of `pv` to `node` and waits until it is attached.
async fn attach(vas: &Api<VolumeAttachment>, name: &str, driver: &str, node: &str, pv: &str) {
    create(
        vas,
        json!({"metadata": {"name": name}, "spec": {"attacher": driver, "nodeName": node,
            "source": {"persistentVolumeName": pv}}}),
    )
    .await;
    eventually("the attachment", || async {
        vas.get(name)
            .await
            .ok()?
            .status
            .filter(|s| s.attached)
            .map(|_| ())
    })
    .await;
}

fn snapshot_api(
    client: &kube::Client,
    ns: Option<&str>,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    );
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

#[tokio::test]
async fn one_process_runs_every_controller_on_one_watch_per_kind() {
    let cluster = TestCluster::start_with(Options {
        pv_controller: true,
        snapshot_controller: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (driver, mock) = driver_for(&cluster, "aio", dir.path()).await;
    let port = free_port().unwrap();
    // Traced: each controller's operations are exported under its own name.
    let collector = Collector::start().await.unwrap();
    let mut command = tokio::process::Command::new(BIN);
    command
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.grpc_endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .env("OTEL_BSP_SCHEDULE_DELAY", "50");
    let mut child = start(
        command,
        [
            "--controllers=*,livenessprobe,health-monitor".to_string(),
            format!("--csi-address={}", mock.endpoint()),
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--leader-election".to_string(),
            format!("--leader-election-namespace={ns}"),
            "--retry-interval-start=100ms".to_string(),
            // Settings for one controller only.
            "--attacher-worker-threads=3".to_string(),
            "--health-monitor-list-volumes-interval=1s".to_string(),
        ],
        Stdio::null(),
    );

    // Each controller holds its own upstream Lease.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let sanitized = driver.replace('.', "-");
    for lease in [
        sanitized.clone(),
        format!("external-attacher-leader-{sanitized}"),
        format!("external-resizer-{sanitized}"),
        format!("external-snapshotter-leader-{sanitized}"),
        format!("external-health-monitor-leader-{sanitized}"),
    ] {
        eventually(&format!("the Lease {lease}"), || async {
            leases
                .get_opt(&lease)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
        })
        .await;
    }
    // Each election won is an Event on its Lease, from upstream's recorder, named after the
    // lock name (the Lease's name before sanitizing).
    for (lease, lock) in [
        (sanitized.clone(), driver.clone()),
        (
            format!("external-attacher-leader-{sanitized}"),
            format!("external-attacher-leader-{driver}"),
        ),
        (
            format!("external-resizer-{sanitized}"),
            format!("external-resizer-{sanitized}"),
        ),
        (
            format!("external-snapshotter-leader-{sanitized}"),
            format!("external-snapshotter-leader-{driver}"),
        ),
        (
            format!("external-health-monitor-leader-{sanitized}"),
            format!("external-health-monitor-leader-{driver}"),
        ),
    ] {
        assert_won_election_event(&client, &ns, &lease, &lock).await;
    }

    // Provisioner: a claim of an expandable class is bound.
    let class = cluster.cluster_name("aio");
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({"metadata": {"name": class}, "provisioner": driver, "allowVolumeExpansion": true}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    create(
        &claims,
        json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    let pv_name = bound(&claims, "data").await;

    // Attacher: the PV is attached to a node.
    let node = cluster.cluster_name("aio-node");
    create(
        &Api::<CSINode>::all(client.clone()),
        json!({"metadata": {"name": node}, "spec": {"drivers": [{"name": driver, "nodeID": "nid-1"}]}}),
    )
    .await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    attach(
        &vas,
        &cluster.cluster_name("aio-va"),
        &driver,
        &node,
        &pv_name,
    )
    .await;

    // Resizer: the claim grows.
    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    eventually("the volume expanded", || async {
        let pv = pvs.get(&pv_name).await.ok()?;
        (pv.spec?.capacity?.get("storage")?.0 == "2Gi").then_some(())
    })
    .await;

    // Snapshotter: a snapshot of the claim is ready.
    let snapshot_class = cluster.cluster_name("aio-snap");
    create(
        &snapshot_api(
            &client,
            None,
            "VolumeSnapshotClass",
            "volumesnapshotclasses",
        ),
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": snapshot_class}, "driver": driver, "deletionPolicy": "Delete"}),
    )
    .await;
    let snapshots = snapshot_api(&client, Some(&ns), "VolumeSnapshot", "volumesnapshots");
    create(
        &snapshots,
        json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": "snap"}, "spec": {"volumeSnapshotClassName": snapshot_class,
            "source": {"persistentVolumeClaimName": "data"}}}),
    )
    .await;
    eventually("the snapshot ready", || async {
        let snapshot = snapshots.get("snap").await.ok()?;
        (snapshot.data["status"]["readyToUse"] == true).then_some(())
    })
    .await;

    // Health monitor: the driver reports the volume abnormal, an Event on the claim says so.
    let handle = pvs
        .get(&pv_name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .unwrap();
    mock.update_state(|s| {
        s.set_condition(
            &handle,
            Some(Condition {
                abnormal: true,
                message: "no path".into(),
            }),
        )
    })
    .unwrap()
    .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("the abnormal volume's Event", || async {
        let list = events
            .list(&ListParams::default().fields("involvedObject.name=data"))
            .await
            .ok()?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("VolumeConditionAbnormal"))
            .then_some(())
    })
    .await;

    // One list of each kind several controllers watch, for the whole process.
    if let Some(counters) = cluster.counters() {
        for kind in [
            "persistentvolumes",
            "persistentvolumeclaims",
            "volumeattachments",
            "csinodes",
        ] {
            assert_eq!(counters.lists(kind), 1, "lists of {kind}");
        }
    }
    // Every controller's metrics on one endpoint, with upstream's names.
    let metrics = eventually("the metrics", || async {
        http_get(port, "/metrics").await.map(|(_, body)| body)
    })
    .await;
    for method in [
        "/csi.v1.Controller/CreateVolume",
        "/csi.v1.Controller/ControllerPublishVolume",
        "/csi.v1.Controller/ControllerExpandVolume",
        "/csi.v1.Controller/CreateSnapshot",
        "/csi.v1.Controller/ListVolumes",
    ] {
        assert!(metrics.contains(method), "{method} missing:\n{metrics}");
    }
    for queue in ["claims", "csi-attacher-va", "csi-snapshotter-content"] {
        assert!(
            metrics.contains(&format!("workqueue_adds_total{{name=\"{queue}\"}}")),
            "queue {queue} missing:\n{metrics}"
        );
    }
    let (status, body) = http_get(port, "/healthz/leader-election").await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body.lines().count(), 5, "a line per Lease: {body}");
    assert_eq!(
        mock.calls().count(PROBE),
        1,
        "one driver connection, probed once at start-up"
    );

    // The livenessprobe: a Probe of the driver per check, on the same endpoint.
    let (status, body) = http_get(port, "/healthz/livenessprobe").await.unwrap();
    assert_eq!((status, body.as_str()), (200, "ok"));
    assert_eq!(mock.calls().count(PROBE), 2);
    mock.faults().set_ready(false);
    let (status, body) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 500, "{body}");
    assert!(body.starts_with("livenessprobe: "), "{body}");
    mock.faults().set_ready(true);
    let (status, _) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 200);

    // One trace per operation, under the controller that made it, each CSI call the parent the
    // driver was told of.
    for (service, operation, call) in [
        (
            "csi-provisioner",
            "provision",
            "/csi.v1.Controller/CreateVolume",
        ),
        (
            "csi-attacher",
            "attach",
            "/csi.v1.Controller/ControllerPublishVolume",
        ),
        (
            "csi-resizer",
            "expand",
            "/csi.v1.Controller/ControllerExpandVolume",
        ),
        (
            "csi-snapshotter",
            "create snapshot",
            "/csi.v1.Controller/CreateSnapshot",
        ),
        (
            "csi-external-health-monitor-controller",
            "check volumes health",
            "/csi.v1.Controller/ListVolumes",
        ),
    ] {
        let told: Vec<(String, String)> = mock
            .calls()
            .of(call)
            .iter()
            .filter_map(|c| c.traceparent.as_deref().and_then(parse_traceparent))
            .collect();
        let found = collector
            .wait_for(WAIT, |spans| {
                spans
                    .iter()
                    .find(|root| {
                        root.name == operation
                            && root.service == service
                            && spans.iter().any(|s| {
                                s.trace_id == root.trace_id
                                    && s.name == call.trim_start_matches('/')
                                    && s.service == service
                                    && told.contains(&(s.trace_id.clone(), s.span_id.clone()))
                            })
                    })
                    .cloned()
            })
            .await;
        assert!(
            found.is_some(),
            "no {operation} trace of {service} holding its {call} (the driver was told {told:?}): {:#?}",
            collector.spans()
        );
    }

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    mock.shutdown().await.unwrap();
    cluster.cleanup().await.unwrap();
}

#[tokio::test]
async fn a_bad_all_in_one_command_line_exits_2_with_the_layout() {
    let output = std::process::Command::new(BIN)
        .clean_env()
        .args(["--controllers=attacher", "--volume-name-prefix=x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--volume-name-prefix"), "{stderr}");
    assert!(stderr.contains("--controllers=LIST"), "{stderr}");
}

/// The node pod's sidecars in one process: the registrar registers the driver with kubelet,
/// the livenessprobe probes it, each check on its own path of one endpoint.
#[tokio::test]
async fn one_process_registers_the_driver_and_probes_it_on_the_node() {
    let driver = "node.aio.csi.test";
    let dir = tempfile::tempdir().unwrap();
    let mock = MockDriver::builder()
        .driver_name(driver)
        .serve_unix(dir.path().join("csi.sock"))
        .await
        .unwrap();
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry).unwrap();
    let kubelet_path = format!("/var/lib/kubelet/plugins/{driver}/csi.sock");
    let port = free_port().unwrap();
    let mut child = start(
        tokio::process::Command::new(BIN),
        [
            "--controllers=node-driver-registrar,livenessprobe".to_string(),
            format!("--csi-address={}", mock.endpoint()),
            format!("--kubelet-registration-path={kubelet_path}"),
            format!("--plugin-registration-path={}", registry.display()),
            format!("--http-endpoint=127.0.0.1:{port}"),
            "--livenessprobe-probe-timeout=2s".to_string(),
        ],
        Stdio::null(),
    );

    // Kubelet finds the registration socket and registers the driver through it.
    let socket = registry.join(format!("{driver}-reg.sock"));
    eventually("the registration socket", || async {
        socket.exists().then_some(())
    })
    .await;
    let info = testkit::kubelet::register(&socket).await.unwrap();
    assert_eq!(
        (info.name.as_str(), info.endpoint.as_str()),
        (driver, kubelet_path.as_str())
    );

    // Both checks pass, together and alone.
    let (status, body) = eventually("both checks", || async {
        http_get(port, "/healthz")
            .await
            .filter(|(status, _)| *status == 200)
    })
    .await;
    assert_eq!(status, 200);
    assert_eq!(body, "node-driver-registrar: ok\nlivenessprobe: ok\n");
    // A driver that is not ready fails the livenessprobe's check only.
    mock.faults().set_ready(false);
    let (status, _) = http_get(port, "/healthz/livenessprobe").await.unwrap();
    assert_eq!(status, 500);
    let (status, _) = http_get(port, "/healthz/node-driver-registrar")
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, body) = http_get(port, "/healthz").await.unwrap();
    assert_eq!(status, 500, "{body}");
    mock.faults().set_ready(true);

    // The Probe calls are counted under the driver's name, as the single livenessprobe's.
    let metrics = eventually("the metrics", || async {
        http_get(port, "/metrics")
            .await
            .map(|(_, body)| body)
            .filter(|body| body.contains(PROBE))
    })
    .await;
    assert!(
        metrics.contains(&format!("driver_name=\"{driver}\"")),
        "{metrics}"
    );

    // SIGTERM: the registrar removes its socket (kubelet deregisters the driver), exit 0.
    let pid = i32::try_from(child.id().unwrap()).unwrap();
    // SAFETY: signalling the child this test spawned and still owns.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(exit.code(), Some(0));
    assert!(!socket.exists(), "the registration socket is removed");
    mock.shutdown().await.unwrap();
}

/// A Lease record held by `holder`, renewed now.
fn lease_record(name: &str, holder: &str) -> Lease {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 3,
            "acquireTime": now, "renewTime": now, "leaseTransitions": 0},
    }))
    .unwrap()
}

/// The all-in-one process with `--leader-election-consolidated` and short election periods.
fn consolidated(
    cluster: &TestCluster,
    mock: &MockHandle,
    controllers: &str,
) -> tokio::process::Child {
    start(
        tokio::process::Command::new(BIN),
        [
            format!("--controllers={controllers}"),
            format!("--csi-address={}", mock.endpoint()),
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            "--leader-election".to_string(),
            format!("--leader-election-namespace={}", cluster.namespace()),
            "--leader-election-consolidated".to_string(),
            "--leader-election-lease-duration=3s".to_string(),
            "--leader-election-renew-deadline=2s".to_string(),
            "--leader-election-retry-period=500ms".to_string(),
        ],
        Stdio::piped(),
    )
}

async fn driver_for(
    cluster: &TestCluster,
    name: &str,
    dir: &std::path::Path,
) -> (String, MockHandle) {
    let driver = if cluster.is_real() {
        format!("{}.{name}.csi.test", cluster.namespace())
    } else {
        format!("{name}.csi.test")
    };
    let mock = MockDriver::builder()
        .driver_name(driver.clone())
        .volume_condition(true)
        .serve_unix(dir.join("csi.sock"))
        .await
        .unwrap();
    (driver, mock)
}

/// KEP-4958's takeover: legacy Leases whose holders are gone are taken over, the consolidated
/// Lease is marked, the legacy ones released, and the controllers run under the one Lease.
#[tokio::test]
async fn a_consolidated_lease_takes_over_the_legacy_ones_whose_holders_are_gone() {
    let cluster = TestCluster::start_with(Options {
        pv_controller: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (driver, mock) = driver_for(&cluster, "takeover", dir.path()).await;
    let sanitized = driver.replace('.', "-");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    // The attacher's single sidecar led once and is gone: its record no longer changes.
    let legacy_attacher = format!("external-attacher-leader-{sanitized}");
    leases
        .create(
            &PostParams::default(),
            &lease_record(&legacy_attacher, "old-pod"),
        )
        .await
        .unwrap();

    let mut child = consolidated(&cluster, &mock, "provisioner,attacher");
    let consolidated_lease = format!("csi-sidecars-leader-{sanitized}");
    let holder = eventually("the consolidated Lease marked", || async {
        let lease = leases.get_opt(&consolidated_lease).await.ok()??;
        let marked = lease
            .metadata
            .annotations?
            .get("migration.csi.k8s.io/status")?
            == "completed";
        marked.then_some(lease.spec?.holder_identity?)
    })
    .await;
    assert!(!holder.is_empty());
    assert_won_election_event(
        &client,
        &ns,
        &consolidated_lease,
        &format!("csi-sidecars-leader-{driver}"),
    )
    .await;
    // Both legacy Leases were taken and then, after the mark, released: the provisioner's was
    // created for it.
    for name in [legacy_attacher.clone(), sanitized.clone()] {
        let spec = eventually(&format!("{name} released"), || async {
            let spec = leases.get(&name).await.ok()?.spec?;
            (spec.holder_identity.as_deref() == Some("")).then_some(spec)
        })
        .await;
        assert!(spec.lease_transitions.unwrap_or(0) >= 1, "{name} was taken");
    }

    // The controllers run under it.
    let class = cluster.cluster_name("takeover");
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({"metadata": {"name": class}, "provisioner": driver}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    create(
        &claims,
        json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    bound(&claims, "data").await;

    child.start_kill().unwrap();
    child.wait().await.unwrap();
    mock.shutdown().await.unwrap();
    cluster.cleanup().await.unwrap();
}

/// A single sidecar that still renews its Lease stops the takeover: nothing is taken, no
/// controller runs, the process exits 1 saying which Lease and holder.
#[tokio::test]
async fn a_consolidated_lease_refuses_while_a_single_sidecar_leads() {
    refuses_while_renewed_by("legacy-pod").await;
}

/// The same when the single sidecar has this process's identity (its host name): a container
/// of the same pod.
#[tokio::test]
async fn a_consolidated_lease_refuses_a_single_sidecar_of_the_same_pod() {
    refuses_while_renewed_by(&sidecar_kit::cluster::leader::default_identity()).await;
}

async fn refuses_while_renewed_by(legacy_holder: &str) {
    let cluster = TestCluster::start().await.unwrap();
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (driver, mock) = driver_for(&cluster, "refuse", dir.path()).await;
    let sanitized = driver.replace('.', "-");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let legacy_attacher = format!("external-attacher-leader-{sanitized}");
    leases
        .create(
            &PostParams::default(),
            &lease_record(&legacy_attacher, legacy_holder),
        )
        .await
        .unwrap();
    // The legacy leader renews every 500 ms.
    let renewing = {
        let (leases, name, holder) = (
            leases.clone(),
            legacy_attacher.clone(),
            legacy_holder.to_string(),
        );
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Ok(mut lease) = leases.get(&name).await {
                    lease.spec = lease_record(&name, &holder).spec;
                    let _ = leases.replace(&name, &PostParams::default(), &lease).await;
                }
            }
        })
    };

    let child = consolidated(&cluster, &mock, "provisioner,attacher");
    let output = tokio::time::timeout(WAIT, child.wait_with_output())
        .await
        .expect("the process exits")
        .unwrap();
    renewing.abort();
    assert_eq!(output.status.code(), Some(1));
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(
        log.contains(&legacy_attacher) && log.contains(legacy_holder),
        "the message names the Lease and its holder:\n{log}"
    );
    let spec = leases.get(&legacy_attacher).await.unwrap().spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(legacy_holder));
    assert!(
        leases.get_opt(&sanitized).await.unwrap().is_none(),
        "all or nothing: the provisioner's Lease is not taken"
    );
    let consolidated_lease = format!("csi-sidecars-leader-{sanitized}");
    let marked = leases
        .get_opt(&consolidated_lease)
        .await
        .unwrap()
        .and_then(|l| l.metadata.annotations)
        .is_some_and(|a| a.contains_key("migration.csi.k8s.io/status"));
    assert!(!marked);
    assert_eq!(
        mock.calls().count("/csi.v1.Controller/CreateVolume"),
        0,
        "no controller ran"
    );
    mock.shutdown().await.unwrap();
    cluster.cleanup().await.unwrap();
}

/// How many calls of `method` the series of `metrics` count.
fn calls_in(metrics: &str, method: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("csi_sidecar_operations_seconds_count{"))
        .filter(|l| l.contains(&format!("method_name=\"{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A rollout halfway through: a replica of the single attacher (the old pod) and an all-in-one
/// replica (the new pod) share the attacher's Lease. Only its holder attaches; the other takes
/// over when the holder dies.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_single_sidecar_and_an_all_in_one_replica_never_both_lead_a_controller() {
    let cluster = TestCluster::start_with(Options {
        pv_controller: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (driver, mock) = driver_for(&cluster, "rollout", dir.path()).await;
    let sanitized = driver.replace('.', "-");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder_of = |name: String| {
        let leases = leases.clone();
        async move { leases.get_opt(&name).await.ok()??.spec?.holder_identity }
    };
    let election = [
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--csi-address={}", mock.endpoint()),
        "--leader-election".to_string(),
        format!("--leader-election-namespace={ns}"),
        "--leader-election-lease-duration=3s".to_string(),
        "--leader-election-renew-deadline=2s".to_string(),
        "--leader-election-retry-period=500ms".to_string(),
    ];
    let spawn = |hostname: &str, first: &str, port: u16| {
        let args = std::iter::once(first.to_string())
            .chain(election.iter().cloned())
            .chain([format!("--http-endpoint=127.0.0.1:{port}")]);
        start(
            testkit::process::with_hostname(hostname, BIN),
            args,
            Stdio::null(),
        )
    };
    let attacher_lease = format!("external-attacher-leader-{sanitized}");

    // The old pod leads the attacher; the new one leads the provisioner, which nobody else runs.
    let (legacy_port, aio_port) = (free_port().unwrap(), free_port().unwrap());
    let mut legacy = spawn("legacy-0", "attacher", legacy_port);
    eventually("the single attacher leading", || async {
        (holder_of(attacher_lease.clone()).await? == "legacy-0").then_some(())
    })
    .await;
    let mut aio = spawn("aio-1", "--controllers=provisioner,attacher", aio_port);
    eventually("the all-in-one replica leading the provisioner", || async {
        (holder_of(sanitized.clone()).await? == "aio-1").then_some(())
    })
    .await;
    assert_eq!(
        holder_of(attacher_lease.clone()).await.as_deref(),
        Some("legacy-0")
    );

    // A claim provisioned by the new pod, attached by the old one only.
    let class = cluster.cluster_name("rollout");
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({"metadata": {"name": class}, "provisioner": driver}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let node = cluster.cluster_name("rollout-node");
    create(
        &Api::<CSINode>::all(client.clone()),
        json!({"metadata": {"name": node}, "spec": {"drivers": [{"name": driver, "nodeID": "nid-1"}]}}),
    )
    .await;
    let provision_and_attach = |claim: &'static str| {
        let (claims, vas, class, node, cluster, driver) = (
            claims.clone(),
            vas.clone(),
            class.clone(),
            node.clone(),
            &cluster,
            driver.clone(),
        );
        async move {
            create(
                &claims,
                json!({"metadata": {"name": claim}, "spec": {"accessModes": ["ReadWriteOnce"],
                    "storageClassName": class, "resources": {"requests": {"storage": "1Gi"}}}}),
            )
            .await;
            let pv = bound(&claims, claim).await;
            let va = cluster.cluster_name(&format!("rollout-{claim}"));
            attach(&vas, &va, &driver, &node, &pv).await;
        }
    };
    provision_and_attach("first").await;
    let publish = "/csi.v1.Controller/ControllerPublishVolume";
    let metrics_of = |port: u16| async move {
        http_get(port, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    };
    assert_eq!(calls_in(&metrics_of(legacy_port).await, publish), 1);
    assert_eq!(
        calls_in(&metrics_of(aio_port).await, publish),
        0,
        "the all-in-one attacher waits for its Lease"
    );

    // The old pod dies: the new one takes the attacher's Lease over and attaches.
    legacy.start_kill().unwrap();
    legacy.wait().await.unwrap();
    eventually("the all-in-one replica leading the attacher", || async {
        (holder_of(attacher_lease.clone()).await? == "aio-1").then_some(())
    })
    .await;
    provision_and_attach("second").await;
    assert_eq!(calls_in(&metrics_of(aio_port).await, publish), 1);

    aio.start_kill().unwrap();
    aio.wait().await.unwrap();
    mock.shutdown().await.unwrap();
    cluster.cleanup().await.unwrap();
}

/// A controller that loses its Lease ends the process even while another controller's worker
/// waits on a request the API server never answers: the others get a bounded drain, not the
/// time of their slowest call.
#[tokio::test]
async fn a_lost_lease_ends_the_process_within_the_renew_deadline_and_a_bounded_drain() {
    use testkit::apiserver::{Hang, RequestMatch};
    let cluster = TestCluster::start().await.unwrap();
    let Some(faults) = cluster.faults() else {
        eprintln!("skipped on a real cluster: it injects API server faults");
        return cluster.cleanup().await.unwrap();
    };
    let client = cluster.client();
    let ns = cluster.namespace().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (driver, mock) = driver_for(&cluster, "drain", dir.path()).await;
    let mut child = start(
        tokio::process::Command::new(BIN),
        [
            "--controllers=provisioner,attacher".to_string(),
            format!("--csi-address={}", mock.endpoint()),
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            "--leader-election".to_string(),
            format!("--leader-election-namespace={ns}"),
            "--leader-election-lease-duration=3s".to_string(),
            "--leader-election-renew-deadline=2s".to_string(),
            "--leader-election-retry-period=500ms".to_string(),
        ],
        Stdio::null(),
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let sanitized = driver.replace('.', "-");
    let attacher_lease = format!("external-attacher-leader-{sanitized}");
    for lease in [&sanitized, &attacher_lease] {
        eventually(&format!("the Lease {lease}"), || async {
            leases
                .get_opt(lease)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.spec?.holder_identity)
        })
        .await;
    }

    // An attacher worker waits on a status patch that is never answered.
    faults.hang_next(
        RequestMatch::new(Verb::Patch, "volumeattachments").subresource("status"),
        1,
        Hang::BeforeServing,
    );
    create(
        &Api::<CSINode>::all(client.clone()),
        json!({"metadata": {"name": "drain-node"}, "spec": {"drivers": [{"name": driver, "nodeID": "nid-1"}]}}),
    )
    .await;
    let pv = cluster.cluster_name("drain-pv");
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({"metadata": {"name": pv}, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": driver, "volumeHandle": "vol-1"}}}),
    )
    .await;
    create(
        &Api::<VolumeAttachment>::all(client.clone()),
        json!({"metadata": {"name": cluster.cluster_name("drain-va")}, "spec": {"attacher": driver,
            "nodeName": "drain-node", "source": {"persistentVolumeName": pv}}}),
    )
    .await;
    eventually("the hung status patch", || async {
        (faults.pending_hangs() == 0).then_some(())
    })
    .await;

    // The provisioner's Lease can no longer be renewed.
    faults.fail_next(
        RequestMatch::new(Verb::Update, "leases").name(&sanitized),
        u32::MAX,
        500,
    );
    let lost = Instant::now();
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the process exits")
        .unwrap();
    let took = lost.elapsed();
    assert_eq!(status.code(), Some(1));
    // Retry period + renew deadline + the drain, with room for a slow machine; well short of
    // the hung request's own deadline.
    assert!(took < Duration::from_secs(15), "exited after {took:?}");
    faults.clear();
    mock.shutdown().await.unwrap();
    cluster.cleanup().await.unwrap();
}
