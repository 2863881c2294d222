//! The attacher as a plug-in of the sidecar runtime, which starts it as upstream does: what it
//! asks of the driver (its capabilities) and how it configures its controller.

use std::time::Duration;

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::driver::identity::{self, IdentityError};
use sidecar_kit::pipeline::Wiring;
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, Setup, Sidecar};

use crate::controller::{self, COMPONENT, Config, Reconcile};
use crate::decide::Policy;
use crate::flags::Cli;
use crate::model;

/// Timeout of the identity calls at start-up (upstream's `csiTimeout`).
pub const IDENTITY_TIMEOUT: Duration = Duration::from_secs(1);

/// What the driver can do, from GetPluginCapabilities and ControllerGetCapabilities.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub controller_service: bool,
    pub publish_unpublish: bool,
    pub publish_readonly: bool,
    pub list_volumes: bool,
    pub list_volumes_published_nodes: bool,
    pub single_node_multi_writer: bool,
}

impl Capabilities {
    /// Whether the attacher calls ControllerPublish at all; without it, attaching is trivial.
    pub fn publishes(&self) -> bool {
        self.controller_service && self.publish_unpublish
    }

    /// Whether the ListVolumes reconciler can run.
    pub fn reconciles(&self) -> bool {
        self.publishes() && self.list_volumes && self.list_volumes_published_nodes
    }
}

/// Asks the driver for its capabilities, each call bounded by [`IDENTITY_TIMEOUT`]. Controller
/// capabilities are asked only of drivers with the controller service.
pub async fn capabilities(csi: &CsiClient) -> Result<Capabilities, IdentityError> {
    let plugin = identity::plugin_capabilities(csi, IDENTITY_TIMEOUT).await?;
    if !plugin.contains(&Service::ControllerService) {
        return Ok(Capabilities::default());
    }
    let rpcs = identity::controller_capabilities(csi, IDENTITY_TIMEOUT).await?;
    Ok(Capabilities {
        controller_service: true,
        publish_unpublish: rpcs.contains(&Rpc::PublishUnpublishVolume),
        publish_readonly: rpcs.contains(&Rpc::PublishReadonly),
        list_volumes: rpcs.contains(&Rpc::ListVolumes),
        list_volumes_published_nodes: rpcs.contains(&Rpc::ListVolumesPublishedNodes),
        single_node_multi_writer: rpcs.contains(&Rpc::SingleNodeMultiWriter),
    })
}

/// The controller configuration for `driver` with `caps`, from the flags.
pub fn config(cli: &Cli, driver: &str, caps: Capabilities) -> Config {
    Config {
        policy: Policy {
            driver: driver.to_string(),
            finalizer: model::finalizer_name(driver),
            publish_unpublish: caps.publishes(),
            publish_readonly: caps.publish_readonly,
            single_node_multi_writer: caps.single_node_multi_writer,
            default_fstype: cli.default_fstype.clone(),
            error_codes: cli.feature_gates.mutable_csinode_allocatable_count,
        },
        timeout: cli.timeout,
        backoff: Backoff {
            start: cli.retry_interval_start,
            max: cli.retry_interval_max,
        },
        workers: cli.worker_threads,
        resync: cli.resync,
        reconcile: caps.reconciles().then_some(Reconcile {
            period: cli.reconcile_sync,
            max_entries: cli.max_entries,
        }),
        wiring: Wiring::reporting(COMPONENT),
    }
}

/// The attacher, a plug-in of the sidecar runtime.
pub struct Attacher;

impl Sidecar for Attacher {
    const NAME: &'static str = "attacher";
    const BINARY: &'static str = "csi-attacher";
    type Cli = Cli;

    /// The driver's capabilities, the controller's configuration, client and Lease.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let host = setup.host;
        let client = setup.client()?;
        let caps = capabilities(&host.csi).await?;
        if !caps.publishes() {
            tracing::info!(
                "the driver does not implement ControllerPublishVolume: VolumeAttachments are marked attached without calling it"
            );
        }
        let mut config = config(cli, &host.driver, caps);
        setup.share(&mut config.wiring);
        let csi = host.csi.clone();
        Ok(
            setup.controller(&model::lock_name(&host.driver), move |token| {
                controller::run(config, client, csi, token)
            })?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn cli(args: &[&str]) -> Cli {
        parse_from(
            std::iter::once("csi-attacher").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
        .unwrap()
    }

    #[test]
    fn capability_table() {
        let full = Capabilities {
            controller_service: true,
            publish_unpublish: true,
            publish_readonly: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            single_node_multi_writer: true,
        };
        assert!(full.publishes() && full.reconciles());
        let no_controller = Capabilities {
            controller_service: false,
            ..full
        };
        assert!(!no_controller.publishes() && !no_controller.reconciles());
        let no_published_nodes = Capabilities {
            list_volumes_published_nodes: false,
            ..full
        };
        assert!(no_published_nodes.publishes() && !no_published_nodes.reconciles());
        let no_publish = Capabilities {
            publish_unpublish: false,
            ..full
        };
        assert!(!no_publish.publishes() && !no_publish.reconciles());
    }

    #[test]
    fn config_from_flags_and_capabilities() {
        let caps = Capabilities {
            controller_service: true,
            publish_unpublish: true,
            publish_readonly: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            single_node_multi_writer: false,
        };
        let c = config(
            &cli(&[
                "--retry-interval-start=2s",
                "--max-entries=50",
                "--reconcile-sync=10m",
                "--default-fstype=xfs",
            ]),
            "hostpath.csi.k8s.io",
            caps,
        );
        assert_eq!(c.policy.finalizer, "external-attacher/hostpath-csi-k8s-io");
        assert!(c.policy.publish_unpublish && c.policy.publish_readonly);
        assert!(!c.policy.single_node_multi_writer);
        assert_eq!(c.policy.default_fstype, "xfs");
        assert!(c.policy.error_codes);
        assert_eq!(c.backoff.start, Duration::from_secs(2));
        assert_eq!(c.backoff.max, Duration::from_secs(300));
        assert_eq!(
            c.reconcile,
            Some(Reconcile {
                period: Duration::from_secs(600),
                max_entries: 50
            })
        );
        assert_eq!(c.workers, 10);
        assert_eq!(c.wiring.reporter.component, "csi-attacher");
        let trivial = config(&cli(&[]), "d", Capabilities::default());
        assert!(!trivial.policy.publish_unpublish);
        assert_eq!(trivial.reconcile, None);
    }
}
