//! Start-up and serving: wait for the driver, learn its name, then answer `/healthz` (and
//! metrics) until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;

use sidecar_kit::driver::connection::ConnectError;
use sidecar_kit::driver::endpoint::EndpointError;
use sidecar_kit::driver::identity::{self, IdentityError};
use sidecar_kit::process::http::{HttpError, HttpServer, Routes};
use sidecar_kit::process::metrics::{CsiMetrics, MetricsError};
use tokio_util::sync::CancellationToken;

use crate::flags::{Cli, DEFAULT_HEALTH_PORT, FlagError, HEALTHZ_PATH, ServePlan};
use crate::probe::Prober;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Flags(#[from] FlagError),
    #[error(transparent)]
    Address(#[from] EndpointError),
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("failed to establish connection to CSI driver: {0}")]
    Connect(#[from] ConnectError),
    #[error("failed to get CSI driver name: {0}")]
    DriverName(#[from] IdentityError),
    #[error(transparent)]
    Http(#[from] HttpError),
}

/// A started livenessprobe.
pub struct Running {
    pub driver_name: String,
    pub prober: Arc<Prober>,
    /// Where `/healthz` is served.
    pub health_address: SocketAddr,
    /// Where the separate metrics server (`--metrics-address`) listens.
    pub metrics_address: Option<SocketAddr>,
}

/// Starts serving; `Ok(None)` when `shutdown` came before the driver did.
pub async fn start(cli: &Cli, shutdown: &CancellationToken) -> Result<Option<Running>, RunError> {
    let plan = ServePlan::from_cli(cli)?;
    if cli.http.http_endpoint.is_empty() && cli.health_port != DEFAULT_HEALTH_PORT {
        tracing::warn!("--health-port is deprecated; use --http-endpoint");
    }
    if plan.metrics_server.is_some() {
        tracing::warn!("--metrics-address is deprecated; use --http-endpoint");
    }
    let metrics = CsiMetrics::new()?;
    let prober = Arc::new(Prober::new(
        &cli.csi.csi_address,
        cli.probe_timeout,
        metrics.clone(),
    )?);

    let Some(driver_name) = learn_driver(&prober, &metrics, shutdown).await? else {
        return Ok(None);
    };

    let metrics_address = match &plan.metrics_server {
        Some((address, path)) => {
            let routes = Routes::new().metrics(path, metrics.clone());
            Some(HttpServer::spawn(address, routes, shutdown.clone()).await?)
        }
        None => None,
    };
    let mut routes = Routes::new();
    if let Some(path) = &plan.metrics_with_health {
        routes = routes.metrics(path, metrics.clone());
    }
    let checker = prober.clone();
    routes = routes.route(HEALTHZ_PATH, move || {
        let checker = checker.clone();
        async move { checker.check().await.reply() }
    });
    let health_address = HttpServer::spawn(&plan.health_address, routes, shutdown.clone()).await?;

    Ok(Some(Running {
        driver_name,
        prober,
        health_address,
        metrics_address,
    }))
}

/// Waits for the driver through `prober`'s connection, learns its name and labels `metrics` with
/// it; `Ok(None)` when `shutdown` came first.
pub async fn learn_driver(
    prober: &Prober,
    metrics: &CsiMetrics,
    shutdown: &CancellationToken,
) -> Result<Option<String>, RunError> {
    // No time limit: a livenessprobe that gave up would only add a crash loop to a slow driver.
    tracing::info!(address = %prober.address(), "connecting to the CSI driver");
    let client = tokio::select! {
        _ = shutdown.cancelled() => return Ok(None),
        client = prober.connect(None) => client?,
    };
    tracing::info!("calling the CSI driver to discover the driver name");
    let driver_name = tokio::select! {
        _ = shutdown.cancelled() => return Ok(None),
        name = identity::driver_name(&client, None) => name?,
    };
    tracing::info!(driver = %driver_name, "CSI driver name");
    metrics.set_driver_name(&driver_name);
    Ok(Some(driver_name))
}

/// Starts and serves until `shutdown` is cancelled.
pub async fn run(cli: &Cli, shutdown: CancellationToken) -> Result<(), RunError> {
    if start(cli, &shutdown).await?.is_some() {
        shutdown.cancelled().await;
    }
    Ok(())
}
