//! `TestCluster`: the in-process server, or a real cluster when
//! `CSI_SIDECARS_TEST_KUBECONFIG` names a kubeconfig. Either way each test
//! gets its own namespace, set as the client's default namespace.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;

use super::{ApiServer, ApiServerError, Faults, Options, RequestCounters};

/// Names a kubeconfig of a real cluster to run the tests against.
pub const KUBECONFIG_ENV: &str = "CSI_SIDECARS_TEST_KUBECONFIG";

/// A cluster for one test.
pub struct TestCluster {
    client: Client,
    namespace: String,
    kubeconfig: PathBuf,
    server: Option<ApiServer>,
    /// Still to delete on drop (real clusters only).
    cleanup_pending: bool,
}

fn unique_namespace() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("csi-test-{:x}-{nanos:08x}-{n}", std::process::id())
}

async fn client_for(kubeconfig: &Path, namespace: &str) -> Result<Client, ApiServerError> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    config.default_namespace = namespace.to_string();
    Ok(Client::try_from(config)?)
}

async fn create_namespace(client: &Client, name: &str) -> Result<(), ApiServerError> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))
        .map_err(|e| ApiServerError::Namespace(kube::Error::SerdeError(e)))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(ApiServerError::Namespace)?;
    Ok(())
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("namespace", &self.namespace)
            .field("kubeconfig", &self.kubeconfig)
            .field("real", &self.is_real())
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// A real cluster if [`KUBECONFIG_ENV`] is set, else an in-process server
    /// with the PV controller running (as kube-controller-manager would).
    pub async fn start() -> Result<Self, ApiServerError> {
        Self::start_with(Options {
            pv_controller: true,
            ..Options::default()
        })
        .await
    }

    /// Like [`TestCluster::start`]; `opts` apply to the in-process server only.
    pub async fn start_with(opts: Options) -> Result<Self, ApiServerError> {
        let namespace = unique_namespace();
        match std::env::var_os(KUBECONFIG_ENV).filter(|v| !v.is_empty()) {
            Some(path) => {
                let kubeconfig = PathBuf::from(path);
                let client = client_for(&kubeconfig, &namespace).await?;
                create_namespace(&client, &namespace).await?;
                Ok(Self {
                    client,
                    namespace,
                    kubeconfig,
                    server: None,
                    cleanup_pending: true,
                })
            }
            None => {
                let server = ApiServer::start_with(opts).await?;
                let kubeconfig = server.kubeconfig_path().to_path_buf();
                let client = client_for(&kubeconfig, &namespace).await?;
                create_namespace(&client, &namespace).await?;
                Ok(Self {
                    client,
                    namespace,
                    kubeconfig,
                    server: Some(server),
                    cleanup_pending: false,
                })
            }
        }
    }

    /// A client whose default namespace is [`TestCluster::namespace`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// This test's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The kubeconfig to hand to processes under test (its context's namespace
    /// is not the test namespace: pass the namespace explicitly).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    pub fn is_real(&self) -> bool {
        self.server.is_none()
    }

    /// A name for a cluster-scoped object that no other test uses: the test
    /// namespace's name, `-`, `base`. On a real cluster, `cleanup()` (or drop)
    /// deletes the cluster-scoped objects of the kinds in
    /// [`CLUSTER_SCOPED_CLEANUP`] whose names start with this prefix, and the
    /// PersistentVolumes and VolumeSnapshotContents that point into the test namespace,
    /// removing their finalizers first; then it removes the finalizers of the
    /// pods, claims, ConfigMaps and VolumeSnapshots left in the namespace and
    /// deletes it.
    pub fn cluster_name(&self, base: &str) -> String {
        format!("{}-{base}", self.namespace)
    }

    /// The in-process server, when not on a real cluster.
    pub fn server(&self) -> Option<&ApiServer> {
        self.server.as_ref()
    }

    /// Whether the cluster's snapshot-controller handles VolumeGroupSnapshots. In-process, the
    /// stand-in does whenever it runs. On a real cluster upstream's does only with
    /// `--feature-gates=CSIVolumeGroupSnapshot=true` (off by default), which no API tells: once
    /// per process a group snapshot naming a group content that does not exist is made in this
    /// test's namespace, and a controller that handles them writes its error into the status
    /// within seconds.
    pub async fn handles_group_snapshots(&self) -> bool {
        static HANDLED: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
        match &self.server {
            Some(server) => server.runs_snapshot_controller(),
            None => *HANDLED.get_or_init(|| self.group_snapshot_probe()).await,
        }
    }

    async fn group_snapshot_probe(&self) -> bool {
        use kube::api::GroupVersionKind;
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("groupsnapshot.storage.k8s.io", "v1", "VolumeGroupSnapshot"),
            "volumegroupsnapshots",
        );
        let groups: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &resource);
        let probe = json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
            "metadata": {"name": "group-snapshot-probe"},
            "spec": {"source": {"volumeGroupSnapshotContentName": self.cluster_name("no-such-group-content")}},
        });
        let Ok(probe) = serde_json::from_value::<DynamicObject>(probe) else {
            return false;
        };
        if groups.create(&PostParams::default(), &probe).await.is_err() {
            // No group snapshot API at all.
            return false;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let mut handled = false;
        while !handled && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            handled = groups
                .get("group-snapshot-probe")
                .await
                .is_ok_and(|g| g.data["status"]["error"].is_object());
        }
        let _ = groups
            .delete("group-snapshot-probe", &DeleteParams::default())
            .await;
        handled
    }

    pub fn faults(&self) -> Option<Faults> {
        self.server.as_ref().map(ApiServer::faults)
    }

    pub fn counters(&self) -> Option<RequestCounters> {
        self.server.as_ref().map(ApiServer::counters)
    }

    /// Deletes the test namespace (real cluster) or stops the server, and waits for it.
    pub async fn cleanup(mut self) -> Result<(), kube::Error> {
        if self.cleanup_pending {
            self.cleanup_pending = false;
            delete_cluster_scoped(&self.client, &self.namespace).await?;
            strip_namespaced_finalizers(&self.client, &self.namespace).await?;
            delete_namespace(&self.client, &self.namespace).await?;
        }
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        Ok(())
    }
}

/// `(group, version, kind, plural)` of the cluster-scoped kinds tests create
/// on a real cluster, deleted on cleanup when named by
/// [`TestCluster::cluster_name`].
pub const CLUSTER_SCOPED_CLEANUP: &[(&str, &str, &str, &str)] = &[
    (
        "storage.k8s.io",
        "v1",
        "VolumeAttachment",
        "volumeattachments",
    ),
    ("", "v1", "PersistentVolume", "persistentvolumes"),
    ("storage.k8s.io", "v1", "StorageClass", "storageclasses"),
    ("storage.k8s.io", "v1", "CSINode", "csinodes"),
    ("storage.k8s.io", "v1", "CSIDriver", "csidrivers"),
    (
        "storage.k8s.io",
        "v1",
        "VolumeAttributesClass",
        "volumeattributesclasses",
    ),
    ("", "v1", "Node", "nodes"),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshotClass",
        "volumesnapshotclasses",
    ),
    (
        "groupsnapshot.storage.k8s.io",
        "v1",
        "VolumeGroupSnapshotContent",
        "volumegroupsnapshotcontents",
    ),
    (
        "groupsnapshot.storage.k8s.io",
        "v1",
        "VolumeGroupSnapshotClass",
        "volumegroupsnapshotclasses",
    ),
];

/// `(group, version, kind, plural)` of the kinds whose objects in the test
/// namespace get their finalizers removed before the namespace is deleted,
/// so a test that failed half-way (leaving a pod, claim or snapshot held by a
/// finalizer) does not leave the namespace terminating forever.
const NAMESPACED_CLEANUP: &[(&str, &str, &str, &str)] = &[
    ("", "v1", "Pod", "pods"),
    ("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims"),
    ("", "v1", "ConfigMap", "configmaps"),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshot",
        "volumesnapshots",
    ),
    (
        "groupsnapshot.storage.k8s.io",
        "v1",
        "VolumeGroupSnapshot",
        "volumegroupsnapshots",
    ),
];

async fn strip_namespaced_finalizers(client: &Client, namespace: &str) -> Result<(), kube::Error> {
    for (group, version, kind, plural) in NAMESPACED_CLEANUP {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let ar = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => continue,
            Err(e) => return Err(e),
        };
        for o in list.items {
            let Some(name) = o.metadata.name.as_deref() else {
                continue;
            };
            if o.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
                continue;
            }
            let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            match api.patch(name, &PatchParams::default(), &unfinalize).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

async fn delete_cluster_scoped(client: &Client, namespace: &str) -> Result<(), kube::Error> {
    let prefix = format!("{namespace}-");
    for (group, version, kind, plural) in CLUSTER_SCOPED_CLEANUP {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let ar = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => continue,
            Err(e) => return Err(e),
        };
        for o in list.items {
            let Some(name) = o.metadata.name.as_deref() else {
                continue;
            };
            // PVs and snapshot contents also belong to the test when they point into its
            // namespace, whoever named them.
            let reference = match *plural {
                "persistentvolumes" => "/spec/claimRef/namespace",
                "volumesnapshotcontents" => "/spec/volumeSnapshotRef/namespace",
                "volumegroupsnapshotcontents" => "/spec/volumeGroupSnapshotRef/namespace",
                _ => "",
            };
            let referenced_here = !reference.is_empty()
                && o.data
                    .pointer(reference)
                    .and_then(serde_json::Value::as_str)
                    == Some(namespace);
            let ours = name.starts_with(&prefix) || referenced_here;
            if !ours {
                continue;
            }
            let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
            // Deleted first, then unfinalized: a controller that adds its finalizer to live
            // objects (the snapshot-controller to bound contents) no longer does once the
            // deletion is requested.
            for result in [
                api.delete(name, &DeleteParams::background())
                    .await
                    .map(|_| ()),
                api.patch(name, &PatchParams::default(), &unfinalize)
                    .await
                    .map(|_| ()),
            ] {
                match result {
                    Ok(()) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

async fn delete_namespace(client: &Client, name: &str) -> Result<(), kube::Error> {
    match Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if !self.cleanup_pending {
            return;
        }
        // Drop cannot await, and the test's runtime may be single-threaded:
        // delete from a helper thread with its own runtime and client.
        let (kubeconfig, namespace) = (self.kubeconfig.clone(), self.namespace.clone());
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let client = client_for(&kubeconfig, &namespace)
                    .await
                    .map_err(std::io::Error::other)?;
                delete_cluster_scoped(&client, &namespace)
                    .await
                    .map_err(std::io::Error::other)?;
                strip_namespaced_finalizers(&client, &namespace)
                    .await
                    .map_err(std::io::Error::other)?;
                delete_namespace(&client, &namespace)
                    .await
                    .map_err(std::io::Error::other)
            })
        });
        if let Ok(Err(e)) = cleanup.join() {
            tracing::warn!(error = %e, namespace = %self.namespace, "deleting the test namespace");
        }
    }
}
