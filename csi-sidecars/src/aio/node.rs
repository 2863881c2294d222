//! The node's sidecars in one process: the registrar and the livenessprobe, and the
//! livenessprobe beside the controllers.

use std::sync::Arc;

use livenessprobe::probe::Prober;
use node_driver_registrar::run::SharedHealth;
use sidecar_kit::process::http::{self, Check, HttpServer, Routes};
use sidecar_kit::runtime::host::{self, Controller};
use tokio_util::sync::CancellationToken;

use super::{AioError, Selection};
use crate::registry::{LIVENESSPROBE, REGISTRAR};

/// The registrar's configuration, with its warnings logged; its exec-probe mode has no place
/// in a process that runs.
pub(super) fn registrar_config(
    cli: &node_driver_registrar::config::Cli,
) -> Result<node_driver_registrar::config::Config, String> {
    use node_driver_registrar::config::{MODE_KUBELET_REGISTRATION_PROBE, Plan};
    match node_driver_registrar::config::plan(
        cli,
        sidecar_kit::driver::endpoint::Platform::current(),
    ) {
        Ok((Plan::Run(config), warnings)) => {
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            Ok(config)
        }
        Ok((Plan::Probe, _)) => Err(format!(
            "--mode={MODE_KUBELET_REGISTRATION_PROBE} exits at once and cannot run beside \
             other sidecars; probe /healthz/node-driver-registrar instead"
        )),
        Err(err) => Err(err.to_string()),
    }
}

/// The livenessprobe's check on the process's endpoint: the driver's Probe over a connection of
/// its own, which notices a replaced socket.
pub(super) fn liveness_check(
    cli: &livenessprobe::flags::Cli,
    metrics: &sidecar_kit::process::metrics::CsiMetrics,
) -> Result<(Arc<Prober>, Check), AioError> {
    let prober = Arc::new(
        Prober::new(&cli.csi.csi_address, cli.probe_timeout, metrics.clone())
            .map_err(|e| AioError::Prepare(LIVENESSPROBE, e.to_string()))?,
    );
    let checker = prober.clone();
    let check = http::check(move || {
        let checker = checker.clone();
        async move { checker.check().await.reply() }
    });
    Ok((prober, check))
}

/// The livenessprobe on its own port (`--health-port`), as the single sidecar, for a process
/// without `--http-endpoint`.
pub(super) fn liveness_on_own_port(cli: livenessprobe::flags::Cli) -> Controller {
    Controller::new(LIVENESSPROBE, None, move |token| async move {
        if let Err(err) = livenessprobe::server::run(&cli, token).await {
            tracing::error!(error = %err, "livenessprobe failed");
        }
    })
}

/// The node's sidecars: the registrar and the livenessprobe, each waiting for the driver on its
/// own (a driver restart is not theirs to exit for), both checks on `--http-endpoint`; without
/// it each serves as its single sidecar does.
pub(super) async fn serve(
    selection: Selection,
    shutdown: CancellationToken,
) -> Result<(), AioError> {
    let shared = !selection.http_endpoint.is_empty();
    let metrics = sidecar_kit::process::metrics::CsiMetrics::new()?;
    let mut checks = Vec::new();
    let mut parts = Vec::new();
    if let Some(mut config) = selection.registrar {
        let health = shared.then(SharedHealth::default);
        if let Some(health) = &health {
            config.http_endpoint = None;
            let health = health.clone();
            checks.push((
                REGISTRAR,
                http::check(move || {
                    let health = health.clone();
                    async move { health.reply().await }
                }),
            ));
        }
        parts.push(Controller::new(REGISTRAR, None, move |token| async move {
            match node_driver_registrar::run::run(config, health, token).await {
                Ok(exit) => {
                    if let Some(message) = exit.failure() {
                        tracing::error!("{message}");
                    }
                }
                Err(err) => tracing::error!(error = %err, "node-driver-registrar failed"),
            }
        }));
    }
    let mut metrics_path = None;
    if let Some(cli) = selection.livenessprobe {
        if shared {
            let (prober, check) = liveness_check(&cli, &metrics)?;
            checks.push((LIVENESSPROBE, check));
            metrics_path = Some(cli.http.metrics_path.clone());
            let metrics = metrics.clone();
            parts.push(Controller::new(
                LIVENESSPROBE,
                None,
                move |token| async move {
                    match livenessprobe::server::learn_driver(&prober, &metrics, &token).await {
                        Ok(Some(_)) => token.cancelled().await,
                        Ok(None) => {}
                        Err(err) => tracing::error!(error = %err, "livenessprobe failed"),
                    }
                },
            ));
        } else {
            parts.push(liveness_on_own_port(cli));
        }
    }
    if shared {
        let mut routes = Routes::new().health_checks(checks);
        if let Some(path) = &metrics_path {
            routes = routes.metrics(path, metrics);
        }
        HttpServer::spawn(&selection.http_endpoint, routes, shutdown.clone()).await?;
    }
    host::supervise(parts, shutdown).await?;
    Ok(())
}
