//! The health monitor as a plug-in of the sidecar runtime, which starts it as upstream does:
//! what it asks of the driver (the controller service, VOLUME_CONDITION with LIST_VOLUMES or
//! GET_VOLUME) and how it configures its controller.

use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::cluster::events::Reporter;
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::driver::identity::{self, IdentityError};
use sidecar_kit::process::flags::CommonFlags;
use sidecar_kit::runtime::host::{Controller, HostError};
use sidecar_kit::runtime::startup::Greeting;
use sidecar_kit::runtime::{Setup, Sidecar};

use crate::controller::{self, Config};
use crate::decide::{self, Mode, Unsupported};
use crate::flags::Cli;
use crate::model;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Flags(#[from] crate::flags::InvalidFlags),
    #[error(transparent)]
    Kube(#[from] sidecar_kit::cluster::client::KubeError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
}

/// How the driver can be monitored, from its capabilities.
pub async fn mode(csi: &CsiClient, timeout: std::time::Duration) -> Result<Mode, AppError> {
    let plugin = identity::plugin_capabilities(csi, timeout).await?;
    let controller_service = plugin.contains(&Service::ControllerService);
    let rpcs: Vec<_> = match controller_service {
        true => identity::controller_capabilities(csi, timeout)
            .await?
            .into_iter()
            .collect(),
        false => Vec::new(),
    };
    Ok(decide::mode(controller_service, &rpcs)?)
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
        queue_metrics: None,
        // Upstream's recorder names no host.
        reporter: Reporter {
            component: model::component(driver),
            instance: String::new(),
        },
        watches: sidecar_kit::pipeline::watches::WatchHub::default(),
    }
}

/// The health monitor, a plug-in of the sidecar runtime.
pub struct HealthMonitor;

impl Sidecar for HealthMonitor {
    const NAME: &'static str = "health-monitor";
    const BINARY: &'static str = "csi-external-health-monitor-controller";
    const VERSION: &'static str = env!("CARGO_PKG_VERSION");
    type Cli = Cli;
    type Error = AppError;

    fn common(cli: &Cli) -> &CommonFlags {
        &cli.common
    }

    /// Every call bounded by `--timeout` (upstream gives its five start-up calls one second
    /// in all).
    fn greeting(cli: &Cli) -> Greeting<'_> {
        Greeting::bounded_by(&cli.common.csi.csi_address, cli.timeout)
    }

    fn validate(cli: &Cli) -> Result<(), AppError> {
        Ok(cli.validate()?)
    }

    /// The driver's capabilities checked, the controller's configuration, client and Lease.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, AppError> {
        let host = setup.host;
        let mode = mode(&host.csi, cli.timeout).await?;
        tracing::info!(driver = %host.driver, ?mode, "the driver reports volume conditions");
        let client = setup.client()?;
        let mut config = config(cli, &host.driver, mode);
        config.queue_metrics = Some(host.queue_metrics.clone());
        config.watches = host.watches.clone();
        let election = setup.election(
            cli.common.leader_election.leader_election,
            &model::lease_name(&host.driver),
            false,
        )?;
        let csi = host.csi.clone();
        Ok(Controller::new(Self::NAME, election, move |token| {
            controller::run(config, client, csi, token)
        }))
    }
}
