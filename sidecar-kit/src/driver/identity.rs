//! Identity-service helpers every sidecar runs at start-up.

use std::collections::BTreeSet;
use std::time::Duration;

use csi_proto::v1::{controller_service_capability, node_service_capability, plugin_capability};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::driver::csi::{CallOptions, CsiClient};
use crate::process::metrics::code_label;

/// How often [`probe_forever`] asks again.
pub const PROBE_PERIOD: Duration = Duration::from_secs(1);

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{call} failed: {code}: {message}", code = code_label(.status.code()), message = .status.message())]
    Call { call: &'static str, status: Status },
    #[error("driver name is empty")]
    EmptyName,
    #[error("cancelled while waiting for the CSI driver to become ready")]
    Cancelled,
    #[error(transparent)]
    Metrics(#[from] crate::process::metrics::MetricsError),
}

fn call_error(call: &'static str) -> impl FnOnce(Status) -> IdentityError {
    move |status| IdentityError::Call { call, status }
}

/// Plugin service capabilities, as a set.
pub type PluginCapabilities = BTreeSet<plugin_capability::service::Type>;
/// Controller RPC capabilities, as a set.
pub type ControllerCapabilities = BTreeSet<controller_service_capability::rpc::Type>;
pub type NodeCapabilities = BTreeSet<node_service_capability::rpc::Type>;

/// GetPluginInfo's driver name; an empty name is an error.
pub async fn driver_name(
    client: &CsiClient,
    timeout: Option<Duration>,
) -> Result<String, IdentityError> {
    let info = client
        .get_plugin_info(CallOptions {
            timeout,
            migrated: false,
        })
        .await
        .map_err(call_error("GetPluginInfo"))?;
    if info.name.is_empty() {
        return Err(IdentityError::EmptyName);
    }
    Ok(info.name)
}

pub async fn plugin_capabilities(
    client: &CsiClient,
    timeout: Duration,
) -> Result<PluginCapabilities, IdentityError> {
    let response = client
        .get_plugin_capabilities(CallOptions::timeout(timeout))
        .await
        .map_err(call_error("GetPluginCapabilities"))?;
    Ok(response
        .capabilities
        .iter()
        .filter_map(|cap| match &cap.r#type {
            Some(plugin_capability::Type::Service(service)) => {
                plugin_capability::service::Type::try_from(service.r#type).ok()
            }
            _ => None,
        })
        .collect())
}

pub async fn controller_capabilities(
    client: &CsiClient,
    timeout: Duration,
) -> Result<ControllerCapabilities, IdentityError> {
    let response = client
        .controller_get_capabilities(CallOptions::timeout(timeout))
        .await
        .map_err(call_error("ControllerGetCapabilities"))?;
    Ok(response
        .capabilities
        .iter()
        .filter_map(|cap| match &cap.r#type {
            Some(controller_service_capability::Type::Rpc(rpc)) => {
                controller_service_capability::rpc::Type::try_from(rpc.r#type).ok()
            }
            _ => None,
        })
        .collect())
}

/// NodeGetCapabilities: the node RPCs the driver implements.
pub async fn node_capabilities(
    client: &CsiClient,
    timeout: Duration,
) -> Result<NodeCapabilities, IdentityError> {
    let response = client
        .node_get_capabilities(CallOptions::timeout(timeout))
        .await
        .map_err(call_error("NodeGetCapabilities"))?;
    Ok(response
        .capabilities
        .iter()
        .filter_map(|cap| match &cap.r#type {
            Some(node_service_capability::Type::Rpc(rpc)) => {
                node_service_capability::rpc::Type::try_from(rpc.r#type).ok()
            }
            _ => None,
        })
        .collect())
}

/// What one Probe answer means for start-up.
#[derive(Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    Ready,
    /// Ask again: the driver is initialising or the attempt timed out.
    NotYet(String),
    /// Give up: any other error.
    Failed,
}

/// Upstream's rule: `ready` unset counts as ready; DeadlineExceeded and `ready=false` are retried;
/// every other error ends the wait.
pub fn probe_verdict(result: &Result<csi_proto::v1::ProbeResponse, Status>) -> ProbeVerdict {
    match result {
        Ok(response) if response.ready == Some(false) => {
            ProbeVerdict::NotYet("driver responded but is not ready".into())
        }
        Ok(_) => ProbeVerdict::Ready,
        Err(status) if status.code() == Code::DeadlineExceeded => {
            ProbeVerdict::NotYet(status.message().to_string())
        }
        Err(_) => ProbeVerdict::Failed,
    }
}

/// Probes every second until the driver is ready, each attempt bounded by `attempt_timeout`.
pub async fn probe_forever(
    client: &CsiClient,
    attempt_timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<(), IdentityError> {
    loop {
        let result = client.probe(CallOptions::timeout(attempt_timeout)).await;
        match probe_verdict(&result) {
            ProbeVerdict::Ready => {
                tracing::info!("CSI driver is ready");
                return Ok(());
            }
            ProbeVerdict::NotYet(reason) => tracing::info!(%reason, "CSI driver is not ready yet"),
            ProbeVerdict::Failed => {
                let status = result
                    .err()
                    .unwrap_or_else(|| Status::unknown("probe failed"));
                return Err(IdentityError::Call {
                    call: "Probe",
                    status,
                });
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Err(IdentityError::Cancelled),
            _ = tokio::time::sleep(PROBE_PERIOD) => {}
        }
    }
}

/// For a driver that replaces an in-tree volume plugin, adds the `migrated` label to the CSI
/// metrics and probes the driver again, as upstream does when it reconnects with that label (the
/// calls recorded before are dropped). Returns whether the driver is such a target.
pub async fn label_migration_metrics(
    client: &CsiClient,
    driver: &str,
    attempt_timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<bool, IdentityError> {
    if !crate::migration::is_migrated_csi_driver(driver) {
        return Ok(false);
    }
    client.metrics().enable_migration_label()?;
    tracing::info!(
        driver,
        "the driver replaces an in-tree volume plugin: CSI metrics carry the migrated label"
    );
    probe_forever(client, attempt_timeout, shutdown).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::ProbeResponse;

    #[test]
    fn verdicts() {
        assert_eq!(
            probe_verdict(&Ok(ProbeResponse { ready: None })),
            ProbeVerdict::Ready
        );
        assert_eq!(
            probe_verdict(&Ok(ProbeResponse { ready: Some(true) })),
            ProbeVerdict::Ready
        );
        assert!(matches!(
            probe_verdict(&Ok(ProbeResponse { ready: Some(false) })),
            ProbeVerdict::NotYet(_)
        ));
        assert!(matches!(
            probe_verdict(&Err(Status::deadline_exceeded("slow"))),
            ProbeVerdict::NotYet(_)
        ));
        assert_eq!(
            probe_verdict(&Err(Status::unavailable("gone"))),
            ProbeVerdict::Failed
        );
        assert_eq!(
            probe_verdict(&Err(Status::failed_precondition("broken"))),
            ProbeVerdict::Failed
        );
    }
}
