//! Learning the driver's name at start-up.
//!
//! Upstream gives the driver 30 s to accept a connection and then one GetPluginInfo call; a driver
//! that is slower to start makes the registrar crash-loop. Here both the dial and GetPluginInfo are
//! retried, with logging, until one bound (`--driver-startup-timeout`) runs out.

use std::time::Duration;

use csi_proto::methods::identity::GET_PLUGIN_INFO;
use csi_proto::v1::GetPluginInfoRequest;
use csi_proto::v1::identity_client::IdentityClient;
use sidecar_kit::driver::connection::{
    self, ConnectError, ConnectOptions, DriverConnection, LossPolicy,
};
use sidecar_kit::driver::csi::{DEADLINE_MESSAGE, record_code, traced_call};
use sidecar_kit::process::metrics::code_label;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};
use tracing::Instrument;

/// Pause between GetPluginInfo attempts.
pub const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How often a continuing wait is logged.
pub const REPORT_PERIOD: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum NameError {
    #[error("GetPluginInfo failed: {code}: {message}", code = code_label(.0.code()), message = .0.message())]
    Call(Status),
    #[error("driver name is empty")]
    Empty,
}

#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("error connecting to CSI driver: {0}")]
    Connect(#[from] ConnectError),
    #[error("error retrieving CSI driver name: {0}")]
    Name(NameError),
    #[error("error retrieving CSI driver name: no answer within {waited:?}: {last}")]
    GaveUp { waited: Duration, last: NameError },
}

/// Whether a failed GetPluginInfo is worth another try.
pub fn is_retryable(error: &NameError) -> bool {
    match error {
        // A driver without an Identity service, or one that has no name, will not grow them.
        NameError::Call(status) => status.code() != Code::Unimplemented,
        NameError::Empty => false,
    }
}

/// One GetPluginInfo call, bounded by `timeout` (also sent to the driver as the deadline).
///
/// The registrar calls the driver once, so it goes without the kit's measured client: no
/// metrics are served, and GetPluginInfo carries no secrets to strip from the `-v=5` log.
pub async fn driver_name(
    connection: &DriverConnection,
    timeout: Duration,
) -> Result<String, NameError> {
    let mut request = tonic::Request::new(GetPluginInfoRequest {});
    request.set_timeout(timeout);
    let span = traced_call(GET_PLUGIN_INFO, connection.endpoint(), &mut request);
    tracing::trace!(method = GET_PLUGIN_INFO, "GRPC call");
    let started = Instant::now();
    let answer = tokio::time::timeout(
        timeout,
        IdentityClient::new(connection.channel())
            .get_plugin_info(request)
            .instrument(span.clone()),
    )
    .await
    .unwrap_or_else(|_| Err(Status::deadline_exceeded(DEADLINE_MESSAGE)))
    .map(tonic::Response::into_inner);
    record_code(
        &span,
        answer.as_ref().map_or_else(Status::code, |_| Code::Ok),
    );
    tracing::trace!(method = GET_PLUGIN_INFO, ?answer, "GRPC response");
    let info = answer.map_err(|status| match status.code() {
        // tonic reports its own deadline as Cancelled; the gRPC meaning is DeadlineExceeded.
        Code::Cancelled if started.elapsed() >= timeout => {
            NameError::Call(Status::deadline_exceeded(DEADLINE_MESSAGE))
        }
        _ => NameError::Call(status),
    })?;
    if info.name.is_empty() {
        return Err(NameError::Empty);
    }
    Ok(info.name)
}

/// Connects to the driver and returns its name, waiting up to `startup_timeout` for it to come up;
/// each GetPluginInfo is bounded by `call_timeout`. `None` when `shutdown` came first.
pub async fn wait_for_driver_name(
    address: &str,
    call_timeout: Duration,
    startup_timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<Option<String>, DriverError> {
    let started = Instant::now();
    let deadline = started + startup_timeout;
    tracing::debug!(address, "connecting to the CSI driver");
    let connecting = connection::connect(
        address,
        ConnectOptions {
            dial_timeout: Some(startup_timeout),
            policy: LossPolicy::Reconnect,
        },
    );
    // The connection is dropped on return: the registrar needs the driver only for its name.
    let connection = tokio::select! {
        _ = shutdown.cancelled() => return Ok(None),
        connected = connecting => connected?,
    };
    let mut next_report = Instant::now();
    loop {
        let error = match driver_name(&connection, call_timeout).await {
            Ok(name) => return Ok(Some(name)),
            Err(error) if !is_retryable(&error) => return Err(DriverError::Name(error)),
            Err(error) => error,
        };
        let now = Instant::now();
        if now + RETRY_PERIOD >= deadline {
            return Err(DriverError::GaveUp {
                waited: now.duration_since(started),
                last: error,
            });
        }
        if now >= next_report {
            tracing::info!(
                %error,
                remaining = ?deadline.duration_since(now),
                "CSI driver is not answering GetPluginInfo yet; retrying"
            );
            next_report = now + REPORT_PERIOD;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    #[test]
    fn retry_rules() {
        let call = NameError::Call;
        assert!(is_retryable(&call(Status::unavailable("starting"))));
        assert!(is_retryable(&call(Status::deadline_exceeded("slow"))));
        assert!(is_retryable(&call(Status::failed_precondition("init"))));
        assert!(!is_retryable(&call(Status::unimplemented("no identity"))));
        assert!(!is_retryable(&NameError::Empty));
    }

    #[tokio::test]
    async fn gives_up_after_the_bound_when_nothing_listens() {
        let dir = tempfile::tempdir().unwrap();
        let address = dir.path().join("absent.sock");
        let result = wait_for_driver_name(
            address.to_str().unwrap(),
            Duration::from_millis(100),
            Duration::from_millis(300),
            &CancellationToken::new(),
        )
        .await;
        assert!(
            matches!(
                result,
                Err(DriverError::Connect(ConnectError::Timeout { .. }))
            ),
            "{result:?}"
        );
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let address = dir.path().join("absent.sock");
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let result = wait_for_driver_name(
            address.to_str().unwrap(),
            Duration::from_millis(100),
            Duration::from_secs(60),
            &shutdown,
        )
        .await;
        assert!(matches!(result, Ok(None)), "{result:?}");
    }
}
