//! The health monitor as a plug-in of the sidecar runtime, which starts it as upstream does:
//! what it asks of the driver (the controller service, VOLUME_CONDITION with LIST_VOLUMES or
//! GET_VOLUME) and how it configures its controller.

use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::driver::identity;
use sidecar_kit::pipeline::Wiring;
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, Setup, Sidecar};

use crate::controller::{self, Config};
use crate::decide::{self, Mode, Unsupported};
use crate::flags::Cli;
use crate::model;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
}

/// How the driver can be monitored, from its capabilities.
pub async fn mode(csi: &CsiClient, timeout: std::time::Duration) -> Result<Mode, PrepareError> {
    let plugin = identity::plugin_capabilities(csi, timeout).await?;
    let controller_service = plugin.contains(&Service::ControllerService);
    let rpcs: Vec<_> = match controller_service {
        true => identity::controller_capabilities(csi, timeout)
            .await?
            .into_iter()
            .collect(),
        false => Vec::new(),
    };
    decide::mode(controller_service, &rpcs).map_err(|err| PrepareError::own(AppError::from(err)))
}

/// The controller configuration for `driver` in `mode`, from the flags.
pub fn config(cli: &Cli, driver: &str, mode: Mode) -> Config {
    Config {
        driver: driver.to_string(),
        mode,
        timeout: cli.timeout,
        monitor_interval: cli.monitor_interval,
        list_volumes_interval: cli.list_volumes_interval,
        volume_list_add_interval: cli.volume_list_add_interval,
        node_list_add_interval: cli.node_list_add_interval,
        workers: usize::try_from(cli.worker_threads).unwrap_or(usize::MAX),
        node_watcher: cli.enable_node_watcher,
        // Upstream's recorder names no host.
        wiring: Wiring::nameless(model::component(driver)),
    }
}

/// The health monitor, a plug-in of the sidecar runtime.
pub struct HealthMonitor;

impl Sidecar for HealthMonitor {
    const NAME: &'static str = "health-monitor";
    const BINARY: &'static str = "csi-external-health-monitor-controller";
    type Cli = Cli;

    /// The driver's capabilities checked, the controller's configuration, client and Lease.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let host = setup.host;
        let mode = mode(&host.csi, cli.timeout).await?;
        tracing::info!(driver = %host.driver, ?mode, "the driver reports volume conditions");
        let client = setup.client()?;
        let mut config = config(cli, &host.driver, mode);
        setup.share(&mut config.wiring);
        let csi = host.csi.clone();
        Ok(
            setup.controller(&model::lock_name(&host.driver), move |token| {
                controller::run(config, client, csi, token)
            })?,
        )
    }
}
