//! The resizer as a plug-in of the sidecar runtime, which starts it as upstream does: what it
//! asks of the driver and the API server (its capabilities, the VolumeAttributesClass API) and
//! how it configures its controller.

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1::node_service_capability::rpc::Type as NodeRpc;
use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::driver::csi::CsiClient;
use sidecar_kit::driver::identity;
use sidecar_kit::pipeline::Wiring;
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, Setup, Sidecar};

use crate::controller::{self, COMPONENT, Config};
use crate::decide::Policy;
use crate::flags::Cli;
use crate::model;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("the CSI driver does not provide the controller service")]
    NoControllerService,
    #[error("CSI driver neither supports controller resize nor modify volume")]
    NothingToDo,
}

/// What the driver can do for the resizer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// ControllerExpandVolume.
    pub controller_expansion: bool,
    /// No controller expansion but NodeExpandVolume: expansions are handed to the nodes.
    pub node_expansion: bool,
    pub modify: bool,
    pub single_node_multi_writer: bool,
}

impl Capabilities {
    pub fn resizes(&self) -> bool {
        self.controller_expansion || self.node_expansion
    }
}

/// Asks the driver for its capabilities as upstream does: the controller service is required;
/// NodeGetCapabilities is asked (on the same endpoint) only without controller expansion.
pub async fn capabilities(
    csi: &CsiClient,
    timeout: std::time::Duration,
) -> Result<Capabilities, PrepareError> {
    let plugin = identity::plugin_capabilities(csi, timeout).await?;
    if !plugin.contains(&Service::ControllerService) {
        return Err(PrepareError::own(AppError::NoControllerService));
    }
    let rpcs = identity::controller_capabilities(csi, timeout).await?;
    let controller_expansion = rpcs.contains(&Rpc::ExpandVolume);
    let node_expansion = !controller_expansion
        && identity::node_capabilities(csi, timeout)
            .await
            .is_ok_and(|node| node.contains(&NodeRpc::ExpandVolume));
    Ok(Capabilities {
        controller_expansion,
        node_expansion,
        modify: rpcs.contains(&Rpc::ModifyVolume),
        single_node_multi_writer: rpcs.contains(&Rpc::SingleNodeMultiWriter),
    })
}

/// Whether the API server serves `storage.k8s.io/v1` VolumeAttributesClasses; a failed lookup
/// counts as yes, as upstream's.
async fn serves_classes(client: &kube::Client) -> bool {
    match client.list_api_group_resources("storage.k8s.io/v1").await {
        Ok(list) => list
            .resources
            .iter()
            .any(|r| r.kind == "VolumeAttributesClass"),
        Err(err) => {
            tracing::error!(error = %err, "Failed to check VolumeAttributesClass V1 API availability");
            true
        }
    }
}

/// The controller configuration for `driver` with `caps`, from the flags.
pub fn config(cli: &Cli, driver: &str, caps: Capabilities, classes: bool) -> Config {
    Config {
        policy: Policy {
            driver: driver.to_string(),
            recover: cli.feature_gates.recover_volume_expansion_failure,
            annotate_fs_resize: cli.feature_gates.annotate_fs_resize,
            controller_expansion: caps.controller_expansion,
        },
        timeout: cli.timeout,
        backoff: Backoff {
            start: cli.retry_interval_start,
            max: cli.retry_interval_max,
        },
        workers: cli.workers,
        resync: cli.resync_period,
        handle_in_use: cli.handle_volume_inuse_error && caps.resizes(),
        modify: caps.modify && classes,
        extra_modify_metadata: cli.extra_modify_metadata,
        single_node_multi_writer: caps.single_node_multi_writer,
        wiring: Wiring::reporting(format!("{COMPONENT} {driver}")),
    }
}

/// The resizer, a plug-in of the sidecar runtime.
pub struct Resizer;

impl Sidecar for Resizer {
    const NAME: &'static str = "resizer";
    const BINARY: &'static str = "csi-resizer";
    type Cli = Cli;

    /// The VolumeAttributesClass API and the driver's capabilities checked, the controller's
    /// configuration, client and Lease.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let host = setup.host;
        let client = setup.client()?;
        let classes = match cli.feature_gates.volume_attributes_class {
            Some(on) => on,
            None => {
                let served = serves_classes(&client).await;
                if !served {
                    tracing::info!(
                        "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass v1 API is not available"
                    );
                }
                served
            }
        };
        let caps = capabilities(&host.csi, cli.timeout).await?;
        if !caps.resizes() {
            tracing::info!("the CSI driver does not support volume expansion");
        }
        if !caps.modify {
            tracing::info!("the CSI driver does not support ControllerModifyVolume");
        }
        if !(caps.resizes() || caps.modify && classes) {
            return Err(PrepareError::own(AppError::NothingToDo));
        }
        if caps.node_expansion {
            tracing::info!(
                "the driver expands volumes on nodes only: expansions are handed to kubelet without a driver call"
            );
        }
        let mut config = config(cli, &host.driver, caps, classes);
        setup.share(&mut config.wiring);
        let csi = host.csi.clone();
        Ok(
            setup.controller(&model::lease_name(&host.driver), move |token| {
                controller::run(config, client, csi, token)
            })?,
        )
    }
}
