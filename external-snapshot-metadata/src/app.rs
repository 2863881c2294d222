//! The sidecar as a plug-in of the runtime, which greets the driver as upstream does; this adds
//! what is its own: the SNAPSHOT_METADATA_SERVICE check, the certificate, the TLS port, and the
//! server it runs instead of a controller.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::plugin_capability::service::Type as Service;
use http::StatusCode;
use kube::api::Api;
use kube::runtime::watcher;
use sidecar_kit::driver::identity;
use sidecar_kit::pipeline::{Pipeline, lock};
use sidecar_kit::process::http::{Reply, Routes};
use sidecar_kit::process::metrics::OperationsShape;
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, RouteHook, Setup, Sidecar};
use tokio::net::TcpListener;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::api::snapshot_metadata_server::SnapshotMetadataServer;
use crate::flags::Cli;
use crate::index::Index;
use crate::model::{
    SnapshotMetadataService, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
};
use crate::server::{self, Shared};
use crate::tls::{self, CertFiles, Reloading};

/// The path of the readiness check, as upstream's.
pub const HEALTH_PATH: &str = "/health";
/// How long streams in flight may go on once the process is asked to stop.
pub const STREAM_DRAIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("CSI driver {0} does not support the SNAPSHOT_METADATA_SERVICE")]
    NoService(String),
    #[error("cannot load the TLS certificate: {0}")]
    Certificate(#[from] tls::TlsError),
    #[error(transparent)]
    Flags(#[from] crate::flags::InvalidFlags),
    #[error("TLS settings refused: {0}")]
    Tls(String),
    #[error("cannot listen on port {port}: {source}")]
    Listen { port: u16, source: std::io::Error },
}

/// The sidecar, a plug-in of the runtime.
pub struct SnapshotMetadata;

/// The histogram upstream's metrics manager keeps for this sidecar.
pub const OPERATIONS: OperationsShape = OperationsShape {
    name: "snapshot_metadata_controller_operations_seconds",
    extra_labels: &["target_snapshot", "base_snapshot"],
};

/// Listens on every interface, IPv6 and IPv4 where the host has both.
async fn listen(port: u16) -> Result<TcpListener, AppError> {
    let both = SocketAddr::from((Ipv6Addr::UNSPECIFIED, port));
    match TcpListener::bind(both).await {
        Ok(listener) => Ok(listener),
        Err(_) => TcpListener::bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
            .await
            .map_err(|source| AppError::Listen { port, source }),
    }
}

/// `/health`: 200 `ok` while requests are served, else 503 `not ready`.
fn health_route(ready: Arc<AtomicBool>) -> RouteHook {
    Box::new(move |routes: Routes| {
        routes.route(HEALTH_PATH, move || {
            let serving = ready.load(Ordering::Acquire);
            async move {
                if serving {
                    Reply::ok()
                } else {
                    Reply::text(StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }
        })
    })
}

impl Sidecar for SnapshotMetadata {
    const NAME: &'static str = "snapshot-metadata";
    const BINARY: &'static str = "csi-snapshot-metadata";
    const OPERATIONS: OperationsShape = OPERATIONS;
    type Cli = Cli;

    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let host = setup.host;
        let services = identity::plugin_capabilities(&host.csi, cli.timeout).await?;
        if !services.contains(&Service::SnapshotMetadataService) {
            return Err(PrepareError::own(AppError::NoService(host.driver.clone())));
        }
        let files = CertFiles {
            cert: cli.tls_cert.clone().into(),
            key: cli.tls_key.clone().into(),
        };
        let certificate = files
            .load()
            .map_err(|e| PrepareError::own(AppError::from(e)))?;
        let port = cli
            .tls_port()
            .map_err(|e| PrepareError::own(AppError::from(e)))?;
        let settings = cli
            .tls_settings()
            .map_err(|e| PrepareError::own(AppError::from(e)))?;
        let resolver = Reloading::new(certificate);
        let tls = tls::server_config(resolver.clone(), &settings)
            .map_err(|e| PrepareError::own(AppError::Tls(e.to_string())))?;
        let listener = listen(port).await.map_err(PrepareError::own)?;
        tracing::info!(port, "TLS gRPC server listening");
        let ready = Arc::new(AtomicBool::new(false));
        let streams = CancellationToken::new();
        let shared = Arc::new(Shared::new(
            host.driver.clone(),
            host.csi.clone(),
            setup.client()?,
            Arc::new(Mutex::new(Index::new(&host.driver))),
            cli.audience.clone(),
            cli.max_streaming_duration(),
            ready.clone(),
            streams,
        ));
        let pipeline = Pipeline::with_watches(host.watches.clone());
        let served = Served {
            shared,
            files,
            resolver,
            tls,
            listener,
            pipeline,
        };
        Ok(setup.server(health_route(ready), move |stop| served.run(stop)))
    }
}

/// Everything the server runs with.
struct Served {
    shared: Arc<Shared>,
    files: CertFiles,
    resolver: Arc<Reloading>,
    tls: rustls::ServerConfig,
    listener: TcpListener,
    pipeline: Pipeline,
}

impl Served {
    /// Serves until `stop`: NOT_SERVING until the watches have synced, then SERVING; on `stop`
    /// NOT_SERVING again, no new connection, and the streams in flight get [`STREAM_DRAIN`].
    async fn run(mut self, stop: CancellationToken) {
        let shared = self.shared.clone();
        self.watch();
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        tokio::spawn(tls::reload(
            self.files.clone(),
            self.resolver.clone(),
            stop.clone(),
        ));
        let accepting = CancellationToken::new();
        let incoming = tls::accept(self.listener, self.tls, accepting.clone());
        let service = SnapshotMetadataServer::new(server::Service(shared.clone()))
            .max_decoding_message_size(crate::MAX_MESSAGE_BYTES);
        let closing = accepting.clone();
        let mut serving = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(service)
                .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async move {
                    closing.cancelled().await
                }),
        );
        tokio::select! {
            synced = self.pipeline.wait_synced(&stop) => {
                if synced {
                    shared.ready.store(true, Ordering::Release);
                    reporter.set_service_status("", tonic_health::ServingStatus::Serving).await;
                    tracing::info!(driver = %shared.driver, "serving SnapshotMetadata");
                }
            }
            ended = &mut serving => {
                tracing::error!(result = ?ended.map(|r| r.map_err(|e| e.to_string())), "the gRPC server stopped");
                return;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => {}
            ended = &mut serving => {
                tracing::error!(result = ?ended.map(|r| r.map_err(|e| e.to_string())), "the gRPC server stopped");
                return;
            }
        }
        shared.ready.store(false, Ordering::Release);
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        accepting.cancel();
        tracing::info!(drain = ?STREAM_DRAIN, "stopping: no new requests; streams in flight may finish");
        if tokio::time::timeout(STREAM_DRAIN, &mut serving)
            .await
            .is_err()
        {
            shared.streams.cancel();
            if tokio::time::timeout(Duration::from_secs(1), &mut serving)
                .await
                .is_err()
            {
                serving.abort();
            }
        }
        drop(self.pipeline);
    }

    /// Feeds the index: the driver's classes, the VolumeSnapshots and their contents, and the
    /// driver's SnapshotMetadataService unless `--audience` names the audience.
    fn watch(&mut self) {
        let client = self.shared.client.clone();
        let index = self.shared.index.clone();
        self.pipeline.watch(
            Api::<VolumeSnapshotClass>::all(client.clone()),
            watcher::Config::default(),
            move |change| lock(&index).class_event(change),
        );
        let index = self.shared.index.clone();
        self.pipeline.watch(
            Api::<VolumeSnapshot>::all(client.clone()),
            watcher::Config::default(),
            move |change| lock(&index).snapshot_event(change),
        );
        let index = self.shared.index.clone();
        self.pipeline.watch(
            Api::<VolumeSnapshotContent>::all(client.clone()),
            watcher::Config::default(),
            move |change| lock(&index).content_event(change),
        );
        if self.shared.audience.is_empty() {
            let index = self.shared.index.clone();
            let by_name =
                watcher::Config::default().fields(&format!("metadata.name={}", self.shared.driver));
            self.pipeline.watch(
                Api::<SnapshotMetadataService>::all(client),
                by_name,
                move |change| lock(&index).service_event(change),
            );
        }
    }
}
