//! The snapshotter as a plug-in of the sidecar runtime, which starts it as upstream does: what
//! it asks of the driver (its capabilities, group snapshots) and how it configures its
//! controller.

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use sidecar_kit::driver::identity;
use sidecar_kit::pipeline::Wiring;
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, Setup, Sidecar};

use crate::controller::{self, COMPONENT, Config, GroupNaming, Naming, SnapshotMetrics};
use crate::flags::Cli;
use crate::model;
use csi_proto::v1::group_controller_service_capability::{
    Type as GroupCapability, rpc::Type as GroupRpc,
};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("CSI driver {0} does not support ControllerCreateSnapshot")]
    NoSnapshots(String),
}

/// The controller configuration for `driver`, from the flags.
pub fn config(cli: &Cli, driver: &str, list_snapshots: bool) -> Config {
    Config {
        driver: driver.to_string(),
        naming: Naming {
            prefix: cli.snapshot_name_prefix.clone(),
            uuid_length: cli.snapshot_name_uuid_length,
            extra_create_metadata: cli.extra_create_metadata,
        },
        timeout: cli.timeout,
        backoff: Backoff {
            start: cli.retry_interval_start,
            max: cli.retry_interval_max,
        },
        workers: cli.worker_threads,
        resync: cli.resync_period,
        list_snapshots,
        node: None,
        journal: None,
        snapshot_metrics: None,
        groups: cli
            .feature_gates
            .volume_group_snapshot
            .then(|| GroupNaming {
                prefix: cli.groupsnapshot_name_prefix.clone(),
                uuid_length: cli.groupsnapshot_name_uuid_length,
            }),
        wiring: Wiring::reporting(format!("{COMPONENT} {driver}")),
    }
}

/// Whether the driver offers group snapshots; as upstream, a failed or missing answer is only
/// logged (and the group contents are then left alone).
async fn group_snapshots_offered(
    csi: &sidecar_kit::driver::csi::CsiClient,
    timeout: std::time::Duration,
) -> bool {
    let answer = csi
        .group_controller_get_capabilities(sidecar_kit::driver::csi::CallOptions::timeout(timeout))
        .await;
    match answer {
        Ok(response) => {
            let offered = response.capabilities.iter().any(|cap| {
                matches!(&cap.r#type, Some(GroupCapability::Rpc(rpc))
                    if rpc.r#type == GroupRpc::CreateDeleteGetVolumeGroupSnapshot as i32)
            });
            if !offered {
                tracing::warn!(
                    "CSIVolumeGroupSnapshot is on, but the driver does not offer CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT: VolumeGroupSnapshotContents are left alone"
                );
            }
            offered
        }
        Err(status) => {
            tracing::error!(error = %sidecar_kit::driver::csi::go_error(&status), "GroupControllerGetCapabilities failed: VolumeGroupSnapshotContents are left alone");
            false
        }
    }
}

/// The snapshotter, a plug-in of the sidecar runtime.
pub struct Snapshotter;

impl Sidecar for Snapshotter {
    const NAME: &'static str = "snapshotter";
    const BINARY: &'static str = "csi-snapshotter";
    type Cli = Cli;

    /// The driver's capabilities checked, the controller's configuration, clients, journal
    /// and Lease.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let node = cli.node_name().map_err(PrepareError::own)?;
        let host = setup.host;
        let client = setup.client()?;
        let rpcs = identity::controller_capabilities(&host.csi, cli.timeout).await?;
        if !rpcs.contains(&Rpc::CreateDeleteSnapshot) {
            return Err(PrepareError::own(AppError::NoSnapshots(
                host.driver.clone(),
            )));
        }
        let list_snapshots = rpcs.contains(&Rpc::ListSnapshots);
        if !list_snapshots {
            tracing::info!(
                "the driver has no ListSnapshots: pre-provisioned snapshots count as ready, as upstream counts them"
            );
        }
        let mut config = config(cli, &host.driver, list_snapshots);
        if config.groups.is_some() && !group_snapshots_offered(&host.csi, cli.timeout).await {
            config.groups = None;
        }
        setup.share(&mut config.wiring);
        config.snapshot_metrics = Some(SnapshotMetrics::register(host.metrics.registry())?);
        config.journal =
            Some(setup.journal_location(&model::lease_name(&host.driver), node.as_deref()));
        config.node = node;
        let journal_client = setup.journal_client()?;
        let csi = host.csi.clone();
        Ok(
            setup.controller(&model::lock_name(&host.driver), move |token| {
                controller::run(config, client, journal_client, csi, token)
            })?,
        )
    }
}
