//! The sidecar as a plug-in of the runtime, which greets the driver as upstream does; this adds
//! what is its own: the SNAPSHOT_METADATA_SERVICE check, the certificate, the TLS port, and the
//! server it runs instead of a controller.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::plugin_capability::service::Type as Service;
use http::StatusCode;
use kube::api::{Api, WatchParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use sidecar_kit::driver::identity;
use sidecar_kit::pipeline::{Change, Pipeline, lock};
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
use crate::server::{self, Shared, StreamLimits};
use crate::tls::{self, CertFiles, ConnectionLimits, Reloading};

/// The path of the readiness check, as upstream's.
pub const HEALTH_PATH: &str = "/health";
/// HTTP/2 keepalive, as grpc-go's server defaults: a ping after two hours without a frame, and
/// the connection closed when no answer comes within 20 seconds.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

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
            (setup.client()?, setup.client_limited(-1.0, 0)?),
            Arc::new(Mutex::new(Index::new(&host.driver))),
            cli.audience.clone(),
            StreamLimits {
                max_duration: cli.max_streaming_duration(),
                max_streams: cli.max_streams as usize,
            },
            ready.clone(),
            streams,
        ));
        let pipeline = Pipeline::with_watches(host.watches.clone());
        let connections = ConnectionLimits {
            max: cli.max_connections as usize,
            idle: tls::CONNECTION_IDLE,
        };
        let served = Served {
            shared,
            connections,
            files,
            resolver,
            tls,
            listener,
            pipeline,
            on_synced: Vec::new(),
        };
        Ok(setup.server(health_route(ready), move |stop| served.run(stop)))
    }
}

/// Everything the server runs with.
struct Served {
    shared: Arc<Shared>,
    connections: ConnectionLimits,
    files: CertFiles,
    resolver: Arc<Reloading>,
    tls: rustls::ServerConfig,
    listener: TcpListener,
    pipeline: Pipeline,
    /// What to do once the pipeline's watches have synced.
    on_synced: Vec<Box<dyn FnOnce() + Send>>,
}

impl Served {
    /// Serves until `stop`: NOT_SERVING until the watches have synced, then SERVING; on `stop`
    /// NOT_SERVING again, no new connection, and the streams in flight get [`STREAM_DRAIN`].
    async fn run(mut self, stop: CancellationToken) {
        let shared = self.shared.clone();
        self.watch(&stop).await;
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
        let incoming = tls::accept(self.listener, self.tls, self.connections, accepting.clone());
        let service = SnapshotMetadataServer::new(server::Service(shared.clone()))
            .max_decoding_message_size(crate::MAX_REQUEST_BYTES);
        let closing = accepting.clone();
        let mut serving = tokio::spawn(
            tonic::transport::Server::builder()
                .max_concurrent_streams(crate::MAX_STREAMS_PER_CONNECTION)
                .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
                .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
                .add_service(health)
                .add_service(service)
                .serve_with_incoming_shutdown(ReceiverStream::new(incoming), async move {
                    closing.cancelled().await
                }),
        );
        tokio::select! {
            synced = self.pipeline.wait_synced(&stop) => {
                if synced {
                    for synced in self.on_synced.drain(..) {
                        synced();
                    }
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
    /// driver's SnapshotMetadataService unless `--audience` names the audience. A kind the
    /// sidecar may not watch (upstream's ClusterRole grants only get and list on snapshots and
    /// contents, and nothing on classes) is read on each request instead, as upstream reads
    /// it, until a later try finds the watch allowed.
    async fn watch(&mut self, stop: &CancellationToken) {
        let client = self.shared.client.clone();
        let gauge = match LookupsGauge::register(&self.shared.metrics) {
            Ok(gauge) => Some(gauge),
            Err(err) => {
                tracing::warn!(error = %err, "cannot register csi_snapshot_metadata_lookups_only");
                None
            }
        };
        let index = self.shared.index.clone();
        let shared = self.shared.clone();
        self.watch_or_look_up(
            Api::<VolumeSnapshotClass>::all(client.clone()),
            move |change| lock(&index).class_event(change),
            move || shared.watched.classes.store(true, Ordering::Release),
            gauge.clone(),
            stop,
        )
        .await;
        let index = self.shared.index.clone();
        self.watch_or_look_up(
            Api::<VolumeSnapshot>::all(client.clone()),
            move |change| lock(&index).snapshot_event(change),
            || {},
            gauge.clone(),
            stop,
        )
        .await;
        let index = self.shared.index.clone();
        self.watch_or_look_up(
            Api::<VolumeSnapshotContent>::all(client.clone()),
            move |change| lock(&index).content_event(change),
            || {},
            gauge,
            stop,
        )
        .await;
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

    /// Watches `api`'s kind into the index when the API server allows it (`synced` once its
    /// first list is in); else says so, counts it in `gauge`, and tries again with backoff,
    /// watching from then on.
    async fn watch_or_look_up<K, F>(
        &mut self,
        api: Api<K>,
        apply: F,
        synced: impl FnOnce() + Send + 'static,
        gauge: Option<LookupsGauge>,
        stop: &CancellationToken,
    ) where
        K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
        K::DynamicType: Default,
        F: FnMut(Change<&K>) + Send + 'static,
    {
        let resource = K::plural(&K::DynamicType::default()).to_string();
        if may_watch(&api).await {
            self.pipeline.watch(api, watcher::Config::default(), apply);
            self.on_synced.push(Box::new(synced));
            return;
        }
        tracing::warn!(%resource, "the sidecar may not watch {resource} (RBAC): each request reads them from the API server instead; grant list and watch on them to serve from a cache");
        if let Some(gauge) = &gauge {
            gauge.set(&resource, true);
        }
        let hub = self.pipeline.hub();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut wait = WATCH_RETRY_FIRST;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                if may_watch(&api).await {
                    break;
                }
                wait = (wait * 2).min(WATCH_RETRY_MAX);
            }
            tracing::info!(%resource, "the sidecar may now watch {resource}: serving them from its cache once listed");
            let mut pipeline = Pipeline::with_watches(hub);
            pipeline.watch(api, watcher::Config::default(), apply);
            if pipeline.wait_synced(&stop).await {
                synced();
                if let Some(gauge) = &gauge {
                    gauge.set(&resource, false);
                }
                stop.cancelled().await;
            }
            drop(pipeline);
        });
    }
}

/// The first and the longest wait before asking again whether a kind may be watched.
const WATCH_RETRY_FIRST: Duration = Duration::from_secs(30);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(5 * 60);
/// The longest the question whether a kind may be watched is waited on.
const WATCH_PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the API server lets the sidecar watch `api`'s kind: only a 403 says no (any other
/// failure is the watch's to retry).
async fn may_watch<K>(api: &Api<K>) -> bool
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let params = WatchParams::default().timeout(1);
    !matches!(
        tokio::time::timeout(WATCH_PROBE_TIMEOUT, api.watch(&params, "0")).await,
        Ok(Err(kube::Error::Api(status))) if status.code == 403
    )
}

/// `csi_snapshot_metadata_lookups_only{resource}`: 1 while a kind is read from the API server
/// on each request because the sidecar may not watch it.
#[derive(Clone)]
struct LookupsGauge(prometheus::IntGaugeVec);

impl LookupsGauge {
    fn register(metrics: &sidecar_kit::process::metrics::CsiMetrics) -> prometheus::Result<Self> {
        let gauge = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "csi_snapshot_metadata_lookups_only",
                "1 while the sidecar may not watch the resource and reads it from the API server on each request",
            ),
            &["resource"],
        )?;
        metrics.registry().register(Box::new(gauge.clone()))?;
        Ok(Self(gauge))
    }

    fn set(&self, resource: &str, on: bool) {
        self.0.with_label_values(&[resource]).set(i64::from(on));
    }
}
