//! An in-process Kubernetes API server for tests: real HTTP on 127.0.0.1,
//! generic over the kinds in [`registry`], with fault injection, request
//! counters and an optional PV controller. See the crate README for what it
//! supports and what it does not.

pub mod cluster;
pub mod counters;
pub mod discovery;
pub mod error;
pub mod faults;
pub mod gates;
pub mod group_snapshot_controller;
mod http;
pub mod patch;
pub mod protection;
pub mod protobuf;
pub mod pv_controller;
pub mod quantity;
pub mod registry;
pub mod reviews;
pub mod selector;
pub mod snapshot_controller;
pub mod store;
pub mod validation;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use cluster::TestCluster;
pub use counters::{CounterKey, RequestCounters, Verb};
pub use error::ApiError;
pub use faults::{Faults, Hang, RequestMatch};
pub use gates::{FeatureGates, Gate};
pub use registry::Registry;
pub use reviews::{Access, Reviews, Subject, TokenIdentity};

use http::Shared;
use store::Store;

/// Failures starting the server or building a client for it.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("binding 127.0.0.1: {0}")]
    Bind(#[source] std::io::Error),
    #[error("writing the kubeconfig: {0}")]
    Kubeconfig(#[source] std::io::Error),
    #[error("building a kube client: {0}")]
    Client(#[from] kube::Error),
    #[error("invalid server URL: {0}")]
    Url(#[from] ::http::uri::InvalidUri),
    #[error("reading the kubeconfig: {0}")]
    KubeconfigLoad(#[from] kube::config::KubeconfigError),
    #[error("namespace setup on the real cluster: {0}")]
    Namespace(#[source] kube::Error),
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run the built-in PV controller (binding, phases, provisioner annotations).
    pub pv_controller: bool,
    /// Run the stand-in of external-snapshotter's snapshot-controller (contents for
    /// VolumeSnapshots, their finalizers, status copies, deletion); see [`snapshot_controller`].
    pub snapshot_controller: bool,
    /// Run the pv-protection, pvc-protection and vac-protection controllers of
    /// kube-controller-manager (on by default): without them the protection
    /// finalizers the API server adds keep deleted PVs and PVCs forever, as on
    /// a cluster whose controller manager is down.
    pub protection_controllers: bool,
    /// Feature gates (Kubernetes 1.34's defaults); see [`Options::feature_gate`].
    pub feature_gates: FeatureGates,
    /// Events kept for watches and list continuations; older resourceVersions get 410.
    pub history_limit: usize,
    /// How often watches that allow bookmarks get a BOOKMARK event.
    pub bookmark_interval: Duration,
    /// Events buffered per watch; a watch that falls further behind is closed.
    pub watch_buffer: usize,
    /// Serve HTTPS ([`crate::tls`]'s certificate), offering HTTP/2 with at most
    /// [`MAX_STREAMS`] streams a connection, as kube-apiserver serves; otherwise plain HTTP/1.1.
    pub tls: bool,
}

/// The streams an HTTP/2 connection may carry at once (kube-apiserver's
/// `--http2-max-streams-per-connection` default).
pub const MAX_STREAMS: u32 = 100;

impl Default for Options {
    fn default() -> Self {
        Self {
            pv_controller: false,
            snapshot_controller: false,
            protection_controllers: true,
            feature_gates: FeatureGates::default(),
            history_limit: 100_000,
            bookmark_interval: Duration::from_secs(1),
            watch_buffer: 100_000,
            tls: false,
        }
    }
}

impl Options {
    /// Turns a feature gate on or off, as `--feature-gates` on kube-apiserver
    /// and kube-controller-manager would.
    pub fn feature_gate(mut self, gate: Gate, enabled: bool) -> Self {
        self.feature_gates.set(gate, enabled);
        self
    }
}

/// A running in-process API server. Dropping it stops it.
pub struct ApiServer {
    addr: SocketAddr,
    url: String,
    snapshot_controller: bool,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    client: kube::Client,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("addr", &self.addr)
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts a server with default [`Options`].
    pub async fn start() -> Result<Self, ApiServerError> {
        Self::start_with(Options::default()).await
    }

    /// Starts a server on an ephemeral port of 127.0.0.1.
    pub async fn start_with(opts: Options) -> Result<Self, ApiServerError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(ApiServerError::Bind)?;
        let addr = listener.local_addr().map_err(ApiServerError::Bind)?;
        let registry = Arc::new(Registry::builtin());
        let mut store = Store::new(registry.clone(), opts.history_limit, opts.watch_buffer);
        store.set_feature_gates(opts.feature_gates);
        let store = Arc::new(Mutex::new(store));
        let shared = Arc::new(Shared {
            faults: Faults::new(store.clone()),
            store,
            registry,
            counters: RequestCounters::default(),
            bookmark_interval: opts.bookmark_interval,
            shutdown: CancellationToken::new(),
            address: addr.to_string(),
            tokens: Mutex::new(None),
            reviews: Reviews::default(),
        });
        let dir = tempfile::tempdir().map_err(ApiServerError::Kubeconfig)?;
        let kubeconfig = dir.path().join("kubeconfig");
        let scheme = if opts.tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&url)).map_err(ApiServerError::Kubeconfig)?;
        let own = kube::config::Kubeconfig::from_yaml(&kubeconfig_yaml(&url))?;
        let config =
            kube::Config::from_custom_kubeconfig(own, &kube::config::KubeConfigOptions::default())
                .await?;
        let client = kube::Client::try_from(config)?;
        let tracker = TaskTracker::new();
        let tls = opts.tls.then(|| {
            tokio_rustls::TlsAcceptor::from(crate::tls::server_config(&[b"h2", b"http/1.1"]))
        });
        tracker.spawn(accept_loop(listener, tls, shared.clone(), tracker.clone()));
        if opts.pv_controller {
            tracker.spawn(pv_controller::run(
                shared.store.clone(),
                shared.shutdown.clone(),
            ));
        }
        if opts.snapshot_controller {
            tracker.spawn(snapshot_controller::run(
                shared.store.clone(),
                shared.shutdown.clone(),
            ));
        }
        if opts.protection_controllers {
            tracker.spawn(protection::run(
                shared.store.clone(),
                shared.shutdown.clone(),
            ));
        }
        Ok(Self {
            addr,
            url,
            snapshot_controller: opts.snapshot_controller,
            shared,
            tracker,
            client,
            kubeconfig,
            _dir: dir,
        })
    }

    /// `http://127.0.0.1:PORT`, or `https://` with [`Options::tls`].
    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client for this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A kubeconfig for this server, written into the server's temp dir.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// Writes a kubeconfig for this server to `path`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, kubeconfig_yaml(&self.url()))
    }

    /// Authenticates requests by bearer token, as kube-apiserver with `--anonymous-auth=false`
    /// does: from now on only requests carrying one of `tokens` (or [`ADMIN_TOKEN`]) are
    /// served, the others answered 401 Unauthorized. `None` serves every request again.
    pub fn accept_tokens(&self, tokens: Option<&[&str]>) {
        *self
            .shared
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            tokens.map(|t| t.iter().map(|t| t.to_string()).collect());
    }

    /// Whether the stand-in of upstream's snapshot-controller runs ([`Options::snapshot_controller`]).
    pub fn runs_snapshot_controller(&self) -> bool {
        self.snapshot_controller
    }

    /// Fault injection handle.
    pub fn faults(&self) -> Faults {
        self.shared.faults.clone()
    }

    /// The tokens TokenReview authenticates and the rules SubjectAccessReview allows by.
    pub fn reviews(&self) -> Reviews {
        self.shared.reviews.clone()
    }

    /// Request counters.
    pub fn counters(&self) -> RequestCounters {
        self.shared.counters.clone()
    }

    /// The feature gates the server runs with.
    pub fn feature_gates(&self) -> FeatureGates {
        *self.shared.store().feature_gates()
    }

    /// Turns a feature gate on or off for the writes that follow (a real
    /// cluster needs its servers restarted with `--feature-gates`; prefer
    /// [`Options::feature_gate`] where the test starts the server). The
    /// protection controllers keep the gates they started with.
    pub fn set_feature_gate(&self, gate: Gate, enabled: bool) {
        let mut store = self.shared.store();
        let mut gates = *store.feature_gates();
        gates.set(gate, enabled);
        store.set_feature_gates(gates);
    }

    /// The newest resourceVersion in the store.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }

    /// Stops accepting, ends watches, lets in-flight requests finish, and waits for all tasks.
    pub async fn shutdown(self) {
        self.shared.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// The bearer token of the server's own client and kubeconfig, accepted even while
/// [`ApiServer::accept_tokens`] limits the others.
pub const ADMIN_TOKEN: &str = "testkit-admin";

/// A kubeconfig naming `server`, with [`ADMIN_TOKEN`].
pub fn kubeconfig_yaml(server: &str) -> String {
    kubeconfig_with_user(server, &format!("token: {ADMIN_TOKEN}"))
}

/// A kubeconfig naming `server` whose user reads its token from `token_file`, as a pod's
/// in-cluster configuration reads its projected service-account token.
pub fn kubeconfig_with_token_file(server: &str, token_file: &Path) -> String {
    kubeconfig_with_user(server, &format!("tokenFile: {}", token_file.display()))
}

/// A kubeconfig naming `server` and `user`; an `https://` server is trusted by [`crate::tls::CA`].
fn kubeconfig_with_user(server: &str, user: &str) -> String {
    use base64::Engine as _;
    let authority = if server.starts_with("https://") {
        format!(
            "\n    certificate-authority-data: {}",
            base64::engine::general_purpose::STANDARD.encode(crate::tls::CA)
        )
    } else {
        String::new()
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: testkit\n  cluster:\n    server: {server}{authority}\ncontexts:\n- name: testkit\n  context:\n    cluster: testkit\n    user: testkit\n    namespace: default\ncurrent-context: testkit\nusers:\n- name: testkit\n  user:\n    {user}\n"
    )
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
    tracker: TaskTracker,
) {
    loop {
        let stream = tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection");
                    continue;
                }
            },
        };
        let mut reachability = shared.faults.reachability();
        if *reachability.borrow_and_update() {
            // Unreachable: the client sees its connection closed before any response.
            drop(stream);
            continue;
        }
        // Small request/response exchanges: do not wait for Nagle.
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let tls = tls.clone();
        tracker.spawn(async move {
            match tls {
                None => serve(TokioIo::new(stream), shared, reachability).await,
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(TLS_HANDSHAKE, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => serve(TokioIo::new(stream), shared, reachability).await,
                        Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

/// How long a client may take over its TLS handshake.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);

/// Serves one connection, HTTP/1.1 or HTTP/2 (whichever the client speaks), until it closes,
/// the server stops or the faults make it unreachable.
async fn serve<I>(io: I, shared: Arc<Shared>, mut reachability: tokio::sync::watch::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let token = shared.shutdown.clone();
    let mut freezing = shared.faults.freezing();
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(http::handle(shared, req).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http2().max_concurrent_streams(MAX_STREAMS);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    loop {
        // While frozen the connection is not polled: what the client sends waits in
        // the socket, and nothing is answered.
        let frozen = *freezing.borrow_and_update();
        tokio::select! {
            _ = conn.as_mut(), if !frozen => break,
            _ = token.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
                break;
            }
            // Dropping the connection closes its socket with requests and watches open.
            _ = async { reachability.wait_for(|unreachable| *unreachable).await.map(|_| ()) } => break,
            changed = freezing.changed() => if changed.is_err() { break },
        }
    }
}
