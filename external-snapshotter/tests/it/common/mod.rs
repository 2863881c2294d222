//! Shared set-up of the snapshotter tests: a `TestCluster` (the in-process API server with its
//! PV controller and snapshot-controller stand-ins, or a real cluster with upstream's
//! snapshot-controller when `CSI_SIDECARS_TEST_KUBECONFIG` is set), the mock driver on a unix
//! socket, and the snapshotter running in-process against both.
//!
//! Every test's driver has a name of its own on a real cluster, and its cluster-scoped objects
//! (PVs, the VolumeSnapshotClasses) carry the test namespace's prefix, so that tests and the
//! cluster's own sidecars never act on each other's objects.

use std::future::Future;
use std::time::{Duration, Instant};

use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use external_snapshotter::controller::{self, Config};
use external_snapshotter::{app, flags::Cli};
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
use sidecar_kit::cluster::journal::{self, JournalClient, Location};
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::process::flags::{FlagSyntax, parse_from};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::{Options, TestCluster};
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const DRIVER: &str = "snapshotter.csi.test";
pub const WAIT: Duration = Duration::from_secs(30);
pub const GI: i64 = 1 << 30;
pub const CREATE: &str = "/csi.v1.Controller/CreateSnapshot";
pub const DELETE: &str = "/csi.v1.Controller/DeleteSnapshot";
pub const LIST: &str = "/csi.v1.Controller/ListSnapshots";
pub const CREATE_GROUP: &str = "/csi.v1.GroupController/CreateVolumeGroupSnapshot";
pub const GET_GROUP: &str = "/csi.v1.GroupController/GetVolumeGroupSnapshot";
pub const DELETE_GROUP: &str = "/csi.v1.GroupController/DeleteVolumeGroupSnapshot";

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
    parse_from(["csi-snapshotter"], FlagSyntax::Go).unwrap()
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

fn group_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("groupsnapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

/// Group snapshots on, with upstream's naming.
pub fn with_groups(config: &mut Config) {
    config.groups = Some(external_snapshotter::controller::GroupNaming {
        prefix: "groupsnapshot".into(),
        uuid_length: -1,
    });
}

/// API server, mock driver and one snapshotter.
pub struct Env {
    pub cluster: TestCluster,
    pub driver: String,
    pub mock: MockHandle,
    pub csi: CsiClient,
    config: Config,
    shutdown: CancellationToken,
    task: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Env {
    /// Starts everything; `adjust` may change the controller's configuration.
    pub async fn start(mock: MockDriver, adjust: impl FnOnce(&mut Config)) -> Self {
        let cluster = TestCluster::start_with(Options {
            pv_controller: true,
            snapshot_controller: true,
            ..Options::default()
        })
        .await
        .unwrap();
        let driver = if cluster.is_real() {
            format!("{}.{DRIVER}", cluster.namespace())
        } else {
            DRIVER.to_string()
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
        let mut config = app::config(&cli, &driver, true);
        config.backoff = Backoff {
            start: Duration::from_millis(50),
            max: Duration::from_secs(2),
        };
        config.timeout = Duration::from_secs(5);
        config.journal = Some(journal_location(cluster.namespace()));
        adjust(&mut config);
        let mut env = Self {
            cluster,
            driver,
            mock,
            csi,
            config,
            shutdown: CancellationToken::new(),
            task: None,
            _dir: dir,
        };
        env.run();
        env
    }

    /// Starts the snapshotter (again).
    pub fn run(&mut self) {
        self.shutdown = CancellationToken::new();
        self.task = Some(tokio::spawn(controller::run(
            self.config.clone(),
            self.cluster.client(),
            JournalClient {
                client: self.cluster.client(),
                qps: journal::MAX_QPS,
            },
            self.csi.clone(),
            self.shutdown.clone(),
        )));
    }

    /// Stops the snapshotter gracefully.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
        }
    }

    /// Kills the snapshotter in the middle of whatever it does (as kill -9 would: no
    /// operation finishes).
    pub async fn kill(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
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

    pub fn snapshots(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            self.ns(),
            &resource("VolumeSnapshot", "volumesnapshots"),
        )
    }

    pub fn contents(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client(),
            &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
        )
    }

    pub fn classes(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client(),
            &resource("VolumeSnapshotClass", "volumesnapshotclasses"),
        )
    }

    /// A VolumeSnapshotClass of this test's driver (named by [`Env::n`]).
    pub async fn class(&self, name: &str, policy: &str, parameters: Value) {
        let class = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": self.n(name)},
            "driver": self.driver, "deletionPolicy": policy, "parameters": parameters,
        });
        self.classes()
            .create(
                &PostParams::default(),
                &serde_json::from_value(class).unwrap(),
            )
            .await
            .unwrap();
    }

    /// A volume of 1 GiB in the driver, a PV of it and a claim bound to it; the volume id.
    pub async fn bound_claim(&self, name: &str) -> String {
        let volume = self
            .csi
            .create_volume(
                CreateVolumeRequest {
                    name: format!("{}-{name}", self.ns()),
                    capacity_range: Some(csi_proto::v1::CapacityRange {
                        required_bytes: GI,
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
        let claim = json!({
            "metadata": {"name": name, "namespace": self.ns()},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                     "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}},
        });
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), self.ns());
        let claim = claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim).unwrap(),
            )
            .await
            .unwrap();
        let pv = json!({
            "metadata": {"name": pv_name},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                     "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": self.driver, "volumeHandle": volume.volume_id},
                     "claimRef": {"namespace": self.ns(), "name": name,
                                  "uid": claim.metadata.uid}},
        });
        let pvs: Api<PersistentVolume> = Api::all(self.client());
        pvs.create(&PostParams::default(), &serde_json::from_value(pv).unwrap())
            .await
            .unwrap();
        eventually("the claim bound", || async {
            let c = claims.get(name).await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        })
        .await;
        volume.volume_id
    }

    /// A VolumeSnapshot of `claim` with the class `class` (named by [`Env::n`]); its UID.
    pub async fn snapshot(&self, name: &str, claim: &str, class: &str) -> String {
        let snapshot = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name},
            "spec": {"volumeSnapshotClassName": self.n(class),
                     "source": {"persistentVolumeClaimName": claim}},
        });
        let created = self
            .snapshots()
            .create(
                &PostParams::default(),
                &serde_json::from_value(snapshot).unwrap(),
            )
            .await
            .unwrap();
        created.metadata.uid.unwrap_or_default()
    }

    pub async fn delete_snapshot(&self, name: &str) {
        self.snapshots()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub fn groups(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client(),
            self.ns(),
            &group_resource("VolumeGroupSnapshot", "volumegroupsnapshots"),
        )
    }

    pub fn group_contents(&self) -> Api<DynamicObject> {
        Api::all_with(
            self.client(),
            &group_resource("VolumeGroupSnapshotContent", "volumegroupsnapshotcontents"),
        )
    }

    /// A VolumeGroupSnapshotClass of this test's driver (named by [`Env::n`]).
    pub async fn group_class(&self, name: &str, policy: &str, parameters: Value) {
        let class = json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshotClass",
            "metadata": {"name": self.n(name)},
            "driver": self.driver, "deletionPolicy": policy, "parameters": parameters,
        });
        Api::<DynamicObject>::all_with(
            self.client(),
            &group_resource("VolumeGroupSnapshotClass", "volumegroupsnapshotclasses"),
        )
        .create(
            &PostParams::default(),
            &serde_json::from_value(class).unwrap(),
        )
        .await
        .unwrap();
    }

    /// Labels the claim `name` with `group=<group>`, for a group snapshot to select it.
    pub async fn label_claim(&self, name: &str, group: &str) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), self.ns());
        let patch = Patch::Merge(json!({"metadata": {"labels": {"group": group}}}));
        claims
            .patch(name, &PatchParams::default(), &patch)
            .await
            .unwrap();
    }

    /// A VolumeGroupSnapshot of the claims labelled `group=<group>`; its UID.
    pub async fn group_snapshot(&self, name: &str, group: &str, class: &str) -> String {
        let snapshot = json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
            "metadata": {"name": name},
            "spec": {"volumeGroupSnapshotClassName": self.n(class),
                     "source": {"selector": {"matchLabels": {"group": group}}}},
        });
        let created = self
            .groups()
            .create(
                &PostParams::default(),
                &serde_json::from_value(snapshot).unwrap(),
            )
            .await
            .unwrap();
        created.metadata.uid.unwrap_or_default()
    }

    /// Waits until the group content satisfies `check`.
    pub async fn group_content_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(what, || async {
            let content = serde_json::to_value(self.group_contents().get(name).await.ok()?).ok()?;
            check(&content).then_some(content)
        })
        .await
    }

    /// The content of a dynamic snapshot, once the snapshot-controller made it.
    pub async fn content_of(&self, snapshot_uid: &str) -> Value {
        let name = format!("snapcontent-{snapshot_uid}");
        eventually("the snapshot's content", || async {
            self.contents().get(&name).await.ok().map(|c| c.data)
        })
        .await;
        self.content(&name).await
    }

    /// A content as JSON (metadata included).
    pub async fn content(&self, name: &str) -> Value {
        serde_json::to_value(self.contents().get(name).await.unwrap()).unwrap()
    }

    /// Waits until the content satisfies `check`.
    pub async fn content_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(what, || async {
            let content = serde_json::to_value(self.contents().get(name).await.ok()?).ok()?;
            check(&content).then_some(content)
        })
        .await
    }

    /// Waits until the snapshot satisfies `check`.
    pub async fn snapshot_until(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&Value) -> bool,
    ) -> Value {
        eventually(what, || async {
            let snapshot = serde_json::to_value(self.snapshots().get(name).await.ok()?).ok()?;
            check(&snapshot).then_some(snapshot)
        })
        .await
    }

    pub async fn content_gone(&self, name: &str) {
        eventually("the content gone", || async {
            matches!(
                self.contents().get(name).await,
                Err(kube::Error::Api(s)) if s.code == 404
            )
            .then_some(())
        })
        .await;
    }

    /// `(reason, message)` of the snapshotter's Events about the content `name`.
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        // Events of cluster-scoped objects live in `default`.
        let api: Api<Event> = Api::namespaced(self.client(), "default");
        let component = format!("csi-snapshotter {}", self.driver);
        api.list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(component.as_str())
            })
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub fn annotation<'a>(object: &'a Value, key: &str) -> Option<&'a str> {
    object["metadata"]["annotations"].get(key)?.as_str()
}

pub fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The keys the snapshotter seals its journal with.
pub async fn journal_keys(env: &Env) -> sidecar_kit::cluster::journal::seal::Keyring {
    use k8s_openapi::api::core::v1::Secret;
    let secret = Api::<Secret>::namespaced(env.client(), env.ns())
        .get("snapshotter-journal-key")
        .await
        .unwrap();
    sidecar_kit::cluster::journal::keys::keyring_of(&secret).expect("the key Secret holds a key")
}

/// `text` sealed with `key` as entry `entry` of the tests' journal.
pub fn seal_entry(
    env: &Env,
    key: &sidecar_kit::cluster::journal::seal::Key,
    entry: &str,
    text: &str,
) -> String {
    let location = journal_location(env.ns());
    sidecar_kit::cluster::journal::seal::seal(key, location.place(entry), text)
}

/// The text of entry `entry` of the journal, opened with the snapshotter's keys.
pub async fn journal_text(env: &Env, entry: &str) -> String {
    let keys = journal_keys(env).await;
    let value = journal_entries(env).await.remove(entry).unwrap();
    let location = journal_location(env.ns());
    sidecar_kit::cluster::journal::seal::open(&keys, location.place(entry), &value)
        .unwrap()
        .to_string()
}

/// Writes `data` into the snapshotter's journal, each entry sealed with its key, as whoever
/// holds that key (stolen, say) could.
pub async fn write_journal(env: &Env, data: std::collections::BTreeMap<String, String>) {
    let key = journal_keys(env).await.current;
    let sealed = data
        .into_iter()
        .map(|(entry, text)| {
            let value = seal_entry(env, &key, &entry, &text);
            (entry, value)
        })
        .collect();
    write_journal_as_is(env, sealed).await;
}

/// The tests' journal: in the test's namespace.
pub fn journal_location(namespace: &str) -> Location {
    Location {
        namespace: namespace.to_string(),
        name: "snapshotter-journal".into(),
        key_secret: "snapshotter-journal-key".into(),
        lease: "snapshotter".into(),
    }
}

/// The entries of the snapshotter's journal as stored (entry → sealed text).
pub async fn journal_entries(env: &Env) -> std::collections::BTreeMap<String, String> {
    use k8s_openapi::api::core::v1::Secret;
    Api::<Secret>::namespaced(env.client(), env.ns())
        .get_opt("snapshotter-journal")
        .await
        .unwrap()
        .map(|secret| sidecar_kit::cluster::journal::sealed_entries(&secret))
        .unwrap_or_default()
}

/// Replaces the data of the snapshotter's journal, creating it if needed (again on a conflict:
/// a killed snapshotter's journal writer may still be forgetting): what only someone who may
/// write the sidecar's Secrets can do.
pub async fn write_journal_as_is(env: &Env, data: std::collections::BTreeMap<String, String>) {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let journals: Api<Secret> = Api::namespaced(env.client(), env.ns());
    let bytes: std::collections::BTreeMap<String, ByteString> = data
        .iter()
        .map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())))
        .collect();
    eventually("the journal rewritten", || async {
        let existing = journals.get_opt("snapshotter-journal").await.unwrap();
        let written = match existing {
            Some(mut journal) => {
                journal.data = Some(bytes.clone());
                journals
                    .replace("snapshotter-journal", &PostParams::default(), &journal)
                    .await
            }
            None => {
                let journal = Secret {
                    metadata: kube::api::ObjectMeta {
                        name: Some("snapshotter-journal".into()),
                        ..Default::default()
                    },
                    data: Some(bytes.clone()),
                    ..Default::default()
                };
                journals.create(&PostParams::default(), &journal).await
            }
        };
        match written {
            Ok(_) => Some(()),
            Err(kube::Error::Api(status)) if status.code == 409 => None,
            Err(err) => panic!("{err}"),
        }
    })
    .await;
}

/// Whether a group-snapshot test must be skipped because the cluster's snapshot-controller does
/// not handle VolumeGroupSnapshots (its `CSIVolumeGroupSnapshot` gate is off by default); says so
/// when it must.
pub async fn skip_without_group_snapshots(env: &Env) -> bool {
    let handled = env.cluster.handles_group_snapshots().await;
    if !handled {
        eprintln!(
            "skipped: the cluster's snapshot-controller does not handle VolumeGroupSnapshots; \
             start it with --feature-gates=CSIVolumeGroupSnapshot=true"
        );
    }
    !handled
}
