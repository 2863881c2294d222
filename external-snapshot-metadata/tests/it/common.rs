//! Shared set-up: a CA and server certificates made per test, the mock driver with snapshot
//! metadata, the API server with tokens and access rules, the sidecar binary, and a TLS gRPC
//! client of the Kubernetes-facing API.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use csi_proto::v1 as csi;
use csi_proto::v1::controller_client::ControllerClient;
use external_snapshot_metadata::api::snapshot_metadata_client::SnapshotMetadataClient;
use external_snapshot_metadata::api::{
    GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest,
};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::json;
use testkit::apiserver::counters::Verb;
use testkit::apiserver::faults::RequestMatch;
use testkit::apiserver::{Access, ApiServer, Subject, TokenIdentity};
use testkit::measure::{free_port, http_get};
use testkit::mockdriver::{MockDriver, MockHandle};
pub use testkit::tls::Authority;
use tokio::net::TcpStream;
use tokio::process::Child;
use tonic::transport::{Channel, Endpoint, Uri};

pub const DRIVER: &str = "metadata.csi.test";
/// Where the backup application reads snapshots.
pub const NAMESPACE: &str = "backup";
pub const AUDIENCE: &str = "backup-audience";
/// The token of a backup application allowed to read the test namespace's snapshots.
pub const TOKEN: &str = "backup-token";
pub const WAIT: Duration = Duration::from_secs(30);
pub const BIN: &str = env!("CARGO_BIN_EXE_csi-snapshot-metadata");
/// The mock's block size.
pub const BLOCK: i64 = 4096;

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

/// Writes `cert` and `key` to `dir`'s certificate files, each replaced at once (written aside
/// and renamed), as a rotation swaps a mounted Secret's files.
pub fn install(dir: &Path, (cert, key): &(String, String)) {
    for (name, text) in [("tls.crt", cert), ("tls.key", key)] {
        let aside = dir.join(format!(".{name}.new"));
        std::fs::write(&aside, text).unwrap();
        std::fs::rename(&aside, dir.join(name)).unwrap();
    }
}

/// The chain a server presented.
pub type Presented = Arc<std::sync::Mutex<Vec<CertificateDer<'static>>>>;

/// Connects to `port` over TLS trusting only `ca`; the certificate the server presented.
pub async fn connect(
    port: u16,
    ca: CertificateDer<'static>,
) -> (SnapshotMetadataClient<Channel>, Presented) {
    let (channel, presented) = tls_channel(port, ca).await;
    (SnapshotMetadataClient::new(channel), presented)
}

/// A TLS channel to `port` trusting only `ca`, and the chain the server presented.
pub async fn tls_channel(port: u16, ca: CertificateDer<'static>) -> (Channel, Presented) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let presented = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = presented.clone();
    // Windows as a grpc-go client's (upstream's lister is one): h2's allowance for small DATA
    // frames left unread is half the connection window, which a client that stops reading
    // would otherwise use up on its own connection.
    let channel = Endpoint::from_static("http://127.0.0.1")
        .initial_stream_window_size(sidecar_kit::driver::connection::STREAM_WINDOW)
        .initial_connection_window_size(sidecar_kit::driver::connection::CONNECTION_WINDOW)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let connector = connector.clone();
            let seen = seen.clone();
            async move {
                let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
                // As gRPC clients do: no Nagle delay behind each small write.
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from("127.0.0.1").unwrap();
                let tls = connector.connect(name, tcp).await?;
                if let Some(chain) = tls.get_ref().1.peer_certificates() {
                    *seen.lock().unwrap() = chain.to_vec();
                }
                Ok::<_, std::io::Error>(TokioIo::new(tls))
            }
        }))
        .await
        .unwrap();
    (channel, presented)
}

/// Everything a test runs against.
pub struct Env {
    /// First, so that it is stopped before what it talks to (fields drop in order).
    pub sidecar: Child,
    /// The test kit's API server: the tests set its TokenReview and SubjectAccessReview answers.
    pub cluster: ApiServer,
    pub mock: MockHandle,
    pub authority: Authority,
    pub port: u16,
    pub http_port: u16,
    pub certs: tempfile::TempDir,
    _socket: tempfile::TempDir,
}

/// How the sidecar is started.
#[derive(Clone, Debug, Default)]
pub struct Start {
    /// `--audience`; `None`: from a SnapshotMetadataService the test creates.
    pub audience: Option<&'static str>,
    pub extra: Vec<String>,
    /// Another build of the sidecar (upstream's, in the benchmark) instead of this one.
    pub binary: Option<String>,
    /// Requests the API server refuses from the start: verb, resource and status code (403 as
    /// RBAC would).
    pub refused: Vec<(Verb, &'static str, u16)>,
    /// Variables of the sidecar's environment.
    pub env: Vec<(&'static str, String)>,
}

impl Env {
    pub async fn start(start: Start) -> Self {
        let cluster = ApiServer::start().await.unwrap();
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap();
        Api::<Namespace>::all(cluster.client())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
        let socket = tempfile::tempdir().unwrap();
        let mock = MockDriver::builder()
            .snapshot_metadata(true)
            .driver_name(DRIVER)
            .serve_unix(socket.path().join("csi.sock"))
            .await
            .unwrap();
        let reviews = cluster.reviews();
        reviews.add_token(
            TOKEN,
            TokenIdentity::service_account(NAMESPACE, "backup").audience(AUDIENCE),
        );
        reviews.allow(
            Subject::user(format!("system:serviceaccount:{NAMESPACE}:backup")),
            Access::new(
                "get",
                "snapshot.storage.k8s.io",
                "volumesnapshots",
                NAMESPACE,
            ),
        );
        for (verb, resource, code) in &start.refused {
            cluster
                .faults()
                .fail_next(RequestMatch::new(*verb, *resource), u32::MAX, *code);
        }
        let authority = Authority::new();
        let certs = tempfile::tempdir().unwrap();
        install(certs.path(), &authority.server("first"));
        let port = free_port().unwrap();
        let http_port = free_port().unwrap();
        let mut command =
            tokio::process::Command::new(start.binary.clone().unwrap_or_else(|| BIN.to_string()));
        command.args([
            format!("--csi-address={}", mock.endpoint()),
            format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            format!("--port={port}"),
            format!("--http-endpoint=127.0.0.1:{http_port}"),
            format!("--tls-cert={}", certs.path().join("tls.crt").display()),
            format!("--tls-key={}", certs.path().join("tls.key").display()),
            "--v=2".to_string(),
        ]);
        if let Some(audience) = start.audience {
            command.arg(format!("--audience={audience}"));
        }
        command.args(&start.extra);
        command.envs(
            start
                .env
                .iter()
                .map(|(name, value)| (*name, value.as_str())),
        );
        let sidecar = testkit::process::spawn_sidecar(&mut command, Stdio::inherit()).unwrap();
        let mut env = Self {
            cluster,
            mock,
            authority,
            sidecar,
            port,
            http_port,
            certs,
            _socket: socket,
        };
        if start.audience.is_some() {
            env.until_ready().await;
        }
        env
    }

    /// Waits for `/health` to answer 200, failing at once if the sidecar exits instead.
    pub async fn until_ready(&mut self) {
        let deadline = Instant::now() + WAIT;
        while !matches!(http_get(self.http_port, "/health").await, Some((200, _))) {
            if let Some(status) = self.sidecar.try_wait().unwrap() {
                panic!("the sidecar exited before it was ready: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the sidecar to be ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    pub fn ns(&self) -> &str {
        NAMESPACE
    }

    pub async fn connect(&self) -> SnapshotMetadataClient<Channel> {
        connect(self.port, self.authority.ca_der()).await.0
    }

    pub async fn channel(&self) -> Channel {
        tls_channel(self.port, self.authority.ca_der()).await.0
    }

    pub async fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics").await.unwrap().1
    }

    fn csi_channel(&self) -> Channel {
        let path: PathBuf = self.mock.socket_path().to_path_buf();
        Endpoint::from_static("http://csi").connect_with_connector_lazy(tower::service_fn(
            move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            },
        ))
    }

    /// A block volume of `bytes` on the mock, its id.
    pub async fn volume(&self, name: &str, bytes: i64) -> String {
        let mut controller = ControllerClient::new(self.csi_channel());
        let capability = csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Block(
                csi::volume_capability::BlockVolume {},
            )),
            access_mode: Some(csi::volume_capability::AccessMode {
                mode: csi::volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        };
        controller
            .create_volume(csi::CreateVolumeRequest {
                name: name.to_string(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![capability],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id
    }

    /// A snapshot of `volume` cut now on the mock, its handle.
    pub async fn cut(&self, name: &str, volume: &str) -> String {
        let mut controller = ControllerClient::new(self.csi_channel());
        controller
            .create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: volume.to_string(),
                name: name.to_string(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id
    }

    /// A ready VolumeSnapshot `name` bound to a ready content of `driver` with `handle`.
    pub async fn snapshot(&self, name: &str, handle: &str, driver: &str, class: Option<&str>) {
        let content = format!("content-{}-{name}", self.ns());
        let contents = self.dynamic("volumesnapshotcontents", None);
        Self::create(
            &contents,
            json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshotContent",
                    "metadata": {"name": content},
                    "spec": {
                        "driver": driver,
                        "deletionPolicy": "Delete",
                        "source": {"snapshotHandle": handle},
                        "volumeSnapshotRef": {"name": name, "namespace": self.ns()},
                    },
            }),
        )
        .await;
        contents
            .patch_status(
                &content,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"snapshotHandle": handle, "readyToUse": true}})),
            )
            .await
            .unwrap();
        let snapshots = self.dynamic("volumesnapshots", Some(self.ns()));
        let mut spec = json!({"source": {"volumeSnapshotContentName": content}});
        if let Some(class) = class {
            spec["volumeSnapshotClassName"] = json!(class);
        }
        Self::create(
            &snapshots,
            json!({
                "apiVersion": "snapshot.storage.k8s.io/v1",
                "kind": "VolumeSnapshot",
                "metadata": {"name": name, "namespace": self.ns()},
                "spec": spec,
            }),
        )
        .await;
        snapshots
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "boundVolumeSnapshotContentName": content, "readyToUse": true}})),
            )
            .await
            .unwrap();
    }

    /// The API of a snapshot or snapshot-metadata kind, as dynamic objects.
    pub fn dynamic(&self, plural: &str, namespace: Option<&str>) -> Api<DynamicObject> {
        let (group, version, kind) = match plural {
            "volumesnapshots" => ("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
            "volumesnapshotcontents" => ("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent"),
            "volumesnapshotclasses" => ("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass"),
            _ => ("cbt.storage.k8s.io", "v1beta1", "SnapshotMetadataService"),
        };
        let resource = ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: format!("{group}/{version}"),
            kind: kind.to_string(),
            plural: plural.to_string(),
        };
        match namespace {
            Some(ns) => Api::namespaced_with(self.client(), ns, &resource),
            None => Api::all_with(self.client(), &resource),
        }
    }

    /// Creates `object` (JSON) with `api`.
    pub async fn create(api: &Api<DynamicObject>, object: serde_json::Value) {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap();
    }

    /// An Allocated request for `snapshot` with the backup token.
    pub fn allocated(&self, snapshot: &str) -> GetMetadataAllocatedRequest {
        GetMetadataAllocatedRequest {
            security_token: TOKEN.to_string(),
            namespace: self.ns().to_string(),
            snapshot_name: snapshot.to_string(),
            starting_offset: 0,
            max_results: 0,
        }
    }

    /// A Delta request from `base` (a handle) to `target` with the backup token.
    pub fn delta(&self, base: &str, target: &str) -> GetMetadataDeltaRequest {
        GetMetadataDeltaRequest {
            security_token: TOKEN.to_string(),
            namespace: self.ns().to_string(),
            base_snapshot_id: base.to_string(),
            target_snapshot_name: target.to_string(),
            starting_offset: 0,
            max_results: 0,
        }
    }
}

/// Every message of an Allocated stream, or its error.
pub async fn all_allocated(
    client: &mut SnapshotMetadataClient<Channel>,
    request: GetMetadataAllocatedRequest,
) -> Result<Vec<GetMetadataAllocatedResponse>, tonic::Status> {
    let mut stream = client.get_metadata_allocated(request).await?.into_inner();
    let mut all = Vec::new();
    while let Some(message) = stream.message().await? {
        all.push(message);
    }
    Ok(all)
}

/// The `(offset, size)` pairs of messages.
pub fn ranges<'a>(
    messages: impl IntoIterator<Item = &'a Vec<external_snapshot_metadata::api::BlockMetadata>>,
) -> Vec<(i64, i64)> {
    messages
        .into_iter()
        .flatten()
        .map(|b| (b.byte_offset, b.size_bytes))
        .collect()
}

/// The sidecar with `--audience`, ready.
pub async fn ready() -> Env {
    Env::start(Start {
        audience: Some(AUDIENCE),
        ..Start::default()
    })
    .await
}

/// A VolumeSnapshot of a filled volume of `blocks` blocks.
pub async fn filled(env: &Env, name: &str, blocks: i64) {
    let volume = env.volume(&format!("vol-{name}"), blocks * BLOCK).await;
    env.mock.fill(&volume).unwrap();
    let handle = env.cut(&format!("snap-{name}"), &volume).await;
    env.snapshot(name, &handle, DRIVER, None).await;
}

/// The status an Allocated request ended with: its code and message.
pub async fn code_of(
    client: &mut external_snapshot_metadata::api::snapshot_metadata_client::SnapshotMetadataClient<
        tonic::transport::Channel,
    >,
    request: external_snapshot_metadata::api::GetMetadataAllocatedRequest,
) -> (tonic::Code, String) {
    let status = all_allocated(client, request).await.unwrap_err();
    (status.code(), status.message().to_string())
}
