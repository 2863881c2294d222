//! Building a mock driver and serving it on a unix socket, an existing
//! listener or (on Windows) a named pipe.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use csi_proto::v1::controller_server::ControllerServer;
use csi_proto::v1::group_controller_server::GroupControllerServer;
use csi_proto::v1::identity_server::IdentityServer;
use csi_proto::v1::node_server::NodeServer;
use csi_proto::v1::snapshot_metadata_server::SnapshotMetadataServer;
use h2_authority::AuthorityFix;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::Router;

use super::config::{Capabilities, MockConfig, Segment};
use super::inject::{CallLog, Faults};
use super::service::{Driver, MockService};
use super::spec::Listen;
use super::state::{Rejection, State};
use super::store::{PersistError, Store};

/// Serving the mock failed.
#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error(transparent)]
    State(#[from] PersistError),
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} exists and is not a socket")]
    NotASocket(PathBuf),
    #[error("the listener has no socket path")]
    UnnamedListener,
    #[error("{0}")]
    Unsupported(&'static str),
    #[error("serving the mock CSI driver failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("the mock CSI driver task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("refused: {0}")]
    Refused(#[from] Rejection),
}

/// A mock CSI driver to be served: built from a [`MockConfig`] or with the
/// chained setters, then started with one of the `serve_*` methods.
///
/// The [`Faults`] script can be prepared before serving; the running
/// mock's handle shares it.
#[derive(Debug, Default)]
pub struct MockDriver {
    config: MockConfig,
    faults: Faults,
}

macro_rules! switches {
    ($($(#[$doc:meta])* $setter:ident => $field:ident;)*) => {
        $(
            $(#[$doc])*
            pub fn $setter(mut self, on: bool) -> Self {
                self.config.capabilities.$field = on;
                self
            }
        )*
    };
}

impl MockDriver {
    /// A mock with the default configuration.
    pub fn builder() -> Self {
        Self::default()
    }

    pub fn with_config(config: MockConfig) -> Self {
        Self {
            config,
            faults: Faults::default(),
        }
    }

    pub fn config(&self) -> &MockConfig {
        &self.config
    }

    /// The fault script the served mock will start with.
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    pub fn driver_name(mut self, name: impl Into<String>) -> Self {
        self.config.driver_name = name.into();
        self
    }

    pub fn vendor_version(mut self, version: impl Into<String>) -> Self {
        self.config.vendor_version = version.into();
        self
    }

    pub fn node_id(mut self, node_id: impl Into<String>) -> Self {
        self.config.node_id = node_id.into();
        self
    }

    /// 0 = unlimited.
    pub fn max_volumes_per_node(mut self, max: i64) -> Self {
        self.config.max_volumes_per_node = max;
        self
    }

    /// Only these node ids are accepted by ControllerPublishVolume.
    pub fn known_nodes<I, S>(mut self, nodes: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.config.known_nodes = Some(nodes.into_iter().map(Into::into).collect::<BTreeSet<_>>());
        self
    }

    /// Adds a segment volumes can be provisioned in (the first is this
    /// node's) and switches topology on.
    pub fn topology_segment<I, K, V>(mut self, segment: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.config.topology.push(
            segment
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect::<Segment>(),
        );
        self.config.capabilities.topology = true;
        self
    }

    pub fn capabilities(mut self, capabilities: Capabilities) -> Self {
        self.config.capabilities = capabilities;
        self
    }

    switches! {
        /// The controller service as a whole.
        controller => controller;
        /// `PUBLISH_UNPUBLISH_VOLUME`.
        publish_unpublish => publish_unpublish;
        /// `LIST_VOLUMES`.
        list_volumes => list_volumes;
        /// `LIST_VOLUMES_PUBLISHED_NODES`.
        list_volumes_published_nodes => list_volumes_published_nodes;
        /// `GET_CAPACITY`.
        get_capacity => get_capacity;
        /// `CLONE_VOLUME`.
        clone_volume => clone;
        /// Snapshot RPCs.
        snapshots => snapshots;
        /// The GroupController service (group snapshots).
        group_snapshots => group_snapshots;
        /// Controller and node volume expansion.
        expand => expand;
        /// `MODIFY_VOLUME`.
        modify => modify;
        /// `GET_VOLUME`.
        get_volume => get_volume;
        /// `PUBLISH_READONLY`.
        publish_readonly => publish_readonly;
        /// `SINGLE_NODE_MULTI_WRITER`.
        single_node_multi_writer => single_node_multi_writer;
        /// `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
        topology => topology;
        /// Node `STAGE_UNSTAGE_VOLUME`.
        node_stage => node_stage;
        /// Controller `VOLUME_CONDITION`.
        volume_condition => volume_condition;
        /// Plugin `SNAPSHOT_METADATA_SERVICE` and the SnapshotMetadata service.
        snapshot_metadata => snapshot_metadata;
    }

    pub fn total_capacity(mut self, bytes: i64) -> Self {
        self.config.total_capacity = bytes;
        self
    }

    pub fn max_volume_size(mut self, bytes: i64) -> Self {
        self.config.max_volume_size = Some(bytes);
        self
    }

    /// Snapshots say they are not ready for their first `answers` answers (CreateSnapshot of
    /// their name, ListSnapshots of their id).
    pub fn snapshot_ready_after(mut self, answers: u32) -> Self {
        self.config.snapshot_ready_after = answers;
        self
    }

    pub fn default_volume_size(mut self, bytes: i64) -> Self {
        self.config.default_volume_size = bytes;
        self
    }

    /// Keeps volumes and snapshots in `path` across restarts.
    pub fn state_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.state_file = Some(path.into());
        self
    }

    pub fn call_log_limit(mut self, limit: usize) -> Self {
        self.config.call_log_limit = limit;
        self
    }

    /// Sets the `volume_context` of every created volume (`{id}` in a value: the volume id).
    pub fn volume_context<I, K, V>(mut self, context: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        self.config.volume_context = context
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect();
        self
    }

    /// Puts `prefix` before every volume id.
    pub fn volume_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.volume_id_prefix = prefix.into();
        self
    }

    fn start(self) -> Result<(Arc<Driver>, Router), MockError> {
        let store = Store::open(self.config.state_file.clone())?;
        let driver = Arc::new(Driver {
            calls: CallLog::new(self.config.call_log_limit),
            config: self.config,
            store,
            faults: self.faults,
            shutdown: CancellationToken::new(),
        });
        let service = MockService::new(driver.clone());
        let router = Server::builder()
            .add_service(IdentityServer::new(service.clone()))
            .add_service(ControllerServer::new(service.clone()))
            .add_service(GroupControllerServer::new(service.clone()))
            .add_service(SnapshotMetadataServer::new(service.clone()))
            .add_service(NodeServer::new(service));
        Ok((driver, router))
    }

    /// Serves at `listen`, whichever kind of endpoint this platform has.
    pub async fn serve(self, listen: &Listen) -> Result<MockHandle, MockError> {
        match listen {
            #[cfg(unix)]
            Listen::Unix(path) => self.serve_unix(path).await,
            #[cfg(windows)]
            Listen::NamedPipe(name) => self.serve_named_pipe(name).await,
            #[cfg(not(unix))]
            Listen::Unix(_) => Err(MockError::Unsupported(
                "unix sockets are served on unix only; use \\\\.\\pipe\\NAME",
            )),
            #[cfg(not(windows))]
            Listen::NamedPipe(_) => Err(MockError::Unsupported(
                "named pipes are only supported on Windows",
            )),
        }
    }

    /// Binds a unix socket at `path` (replacing a stale socket there) and
    /// serves on it. The socket file is removed when the mock stops.
    #[cfg(unix)]
    pub async fn serve_unix(self, path: impl AsRef<Path>) -> Result<MockHandle, MockError> {
        use std::os::unix::fs::FileTypeExt;

        let path = path.as_ref();
        let listen_error = |source| MockError::Listen {
            path: path.to_owned(),
            source,
        };
        match tokio::fs::symlink_metadata(path).await {
            Ok(meta) if meta.file_type().is_socket() => {
                tokio::fs::remove_file(path).await.map_err(listen_error)?;
            }
            Ok(_) => return Err(MockError::NotASocket(path.to_owned())),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(listen_error(err)),
        }
        let listener = tokio::net::UnixListener::bind(path).map_err(listen_error)?;
        self.serve_listener(listener).await
    }

    /// Serves on a bound listener. Its socket file is removed when the
    /// mock stops.
    #[cfg(unix)]
    pub async fn serve_listener(
        self,
        listener: tokio::net::UnixListener,
    ) -> Result<MockHandle, MockError> {
        let path = listener
            .local_addr()
            .ok()
            .and_then(|addr| addr.as_pathname().map(Path::to_owned))
            .ok_or(MockError::UnnamedListener)?;
        let (driver, router) = self.start()?;
        let incoming = fix_authority(tokio_stream::wrappers::UnixListenerStream::new(listener));
        let stop = driver.shutdown.clone();
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await
        });
        Ok(MockHandle::new(driver, path.clone(), Some(path), task))
    }

    /// Serves on the named pipe `name` (`\\.\pipe\NAME`).
    #[cfg(windows)]
    pub async fn serve_named_pipe(self, name: &str) -> Result<MockHandle, MockError> {
        let incoming = pipe::incoming(name.to_owned()).map_err(|source| MockError::Listen {
            path: PathBuf::from(name),
            source,
        })?;
        let incoming = fix_authority(incoming);
        let (driver, router) = self.start()?;
        let stop = driver.shutdown.clone();
        let task = tokio::spawn(async move {
            router
                .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await
        });
        Ok(MockHandle::new(driver, PathBuf::from(name), None, task))
    }
}

/// Every connection through [`AuthorityFix`]: CSI clients written with grpc-go (kubelet among
/// them) may send the socket path or nothing as `:authority`, which h2 would reset.
fn fix_authority<S, E>(
    incoming: impl futures::Stream<Item = Result<S, E>>,
) -> impl futures::Stream<Item = Result<AuthorityFix<S>, E>> {
    futures::StreamExt::map(incoming, |accepted| accepted.map(AuthorityFix::new))
}

/// A running mock driver. Dropping it stops serving and removes the
/// socket file; [`shutdown`](Self::shutdown) also waits for the server.
pub struct MockHandle {
    driver: Arc<Driver>,
    address: PathBuf,
    /// The socket file to remove when stopping.
    socket_file: Option<PathBuf>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

impl MockHandle {
    fn new(
        driver: Arc<Driver>,
        address: PathBuf,
        socket_file: Option<PathBuf>,
        task: JoinHandle<Result<(), tonic::transport::Error>>,
    ) -> Self {
        Self {
            driver,
            address,
            socket_file,
            task: Some(task),
        }
    }

    /// The unix socket path (or the pipe name) the mock listens on.
    pub fn socket_path(&self) -> &Path {
        &self.address
    }

    /// The endpoint as a CSI address: `unix:///path` or `\\.\pipe\NAME`.
    pub fn endpoint(&self) -> String {
        if self.socket_file.is_some() {
            format!("unix://{}", self.address.display())
        } else {
            self.address.display().to_string()
        }
    }

    pub fn config(&self) -> &MockConfig {
        &self.driver.config
    }

    /// A copy of the current volumes, publications and snapshots.
    pub fn state(&self) -> State {
        self.driver.store.read(State::clone)
    }

    /// Changes the state behind the sidecars' back (e.g. a volume detached
    /// out of band), persisting it like an RPC would.
    pub fn update_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> Result<R, PersistError> {
        self.driver.store.update(|s| Ok(f(s)))
    }

    /// Gives the blocks `blocks` (4 KiB block indices) of volume `volume_id` new content, as
    /// a workload writing to it: snapshots cut later list them as allocated and as changed
    /// since snapshots cut earlier. See [`State::write_blocks`].
    pub fn write_blocks(
        &self,
        volume_id: &str,
        blocks: impl IntoIterator<Item = u64>,
    ) -> Result<(), MockError> {
        self.driver
            .store
            .update(|s| Ok::<_, MockError>(s.write_blocks(volume_id, blocks)?))
    }

    /// [`write_blocks`](Self::write_blocks) of a range of blocks, without listing them.
    pub fn write_range(&self, volume_id: &str, blocks: Range<u64>) -> Result<(), MockError> {
        self.driver
            .store
            .update(|s| Ok::<_, MockError>(s.write_range(volume_id, blocks)?))
    }

    /// Writes every block of volume `volume_id` (a 4 GiB volume is still one range).
    pub fn fill(&self, volume_id: &str) -> Result<(), MockError> {
        self.driver
            .store
            .update(|s| Ok::<_, MockError>(s.fill(volume_id)?))
    }

    /// The run-time fault script.
    pub fn faults(&self) -> &Faults {
        &self.driver.faults
    }

    /// The calls received so far.
    pub fn calls(&self) -> &CallLog {
        &self.driver.calls
    }

    /// Stops accepting, ends hung and delayed calls with UNAVAILABLE, waits
    /// for open connections to finish and removes the socket file.
    pub async fn shutdown(mut self) -> Result<(), MockError> {
        self.driver.shutdown.cancel();
        let served = match self.task.take() {
            Some(task) => task.await,
            None => Ok(Ok(())),
        };
        self.remove_socket();
        served??;
        Ok(())
    }

    fn remove_socket(&mut self) {
        if let Some(path) = self.socket_file.take() {
            // Already gone is fine: the goal is that it does not linger.
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.driver.shutdown.cancel();
        self.remove_socket();
    }
}

/// Named-pipe connections for tonic: a stream of connected pipe instances,
/// each new instance created before the previous one is handed out so a
/// client never finds the pipe missing.
#[cfg(windows)]
mod pipe {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use futures::Stream;
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::windows::named_pipe::{NamedPipeServer, ServerOptions};
    use tonic::transport::server::Connected;

    pub(super) struct PipeConnection(NamedPipeServer);

    impl Connected for PipeConnection {
        type ConnectInfo = ();

        fn connect_info(&self) -> Self::ConnectInfo {}
    }

    impl AsyncRead for PipeConnection {
        fn poll_read(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for PipeConnection {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_flush(cx)
        }

        fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
        }
    }

    pub(super) fn incoming(
        name: String,
    ) -> io::Result<impl Stream<Item = io::Result<PipeConnection>>> {
        // Not `first_pipe_instance`: a mock restarted under the same name
        // must not fail while the previous one is still closing its instance.
        let first = ServerOptions::new().create(&name)?;
        let state = (Some(first), name);
        Ok(futures::stream::unfold(
            state,
            |(server, name)| async move {
                let server = server?;
                let connected = server.connect().await.map(|()| PipeConnection(server));
                let next = ServerOptions::new().create(&name);
                if let Err(err) = &next {
                    tracing::error!(pipe = %name, "cannot create the next pipe instance: {err}");
                }
                Some((connected, (next.ok(), name)))
            },
        ))
    }
}
