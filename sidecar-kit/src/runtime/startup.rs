//! The start-up every controller sidecar shares: the process entry (runtime, signals, crash-only
//! exit) and the driver hand-shake (connect, exit on loss, Probe until ready, the driver's name,
//! the `migrated` metrics label).

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::driver::connection::{self, ConnectOptions, LossPolicy};
use crate::driver::csi::CsiClient;
use crate::driver::identity::{self, IdentityError};
use crate::process::flags::ProcessFlags;
use crate::process::metrics::CsiMetrics;
use crate::runtime::lifecycle;

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Connect(#[from] connection::ConnectError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// Runs `serve` until it returns, on the runtime the process flags ask for, with a token that
/// SIGTERM and SIGINT cancel. An error ends the process through [`lifecycle::fatal`].
pub fn run<F, Fut, E>(flags: &ProcessFlags, serve: F)
where
    F: FnOnce(CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let runtime = match lifecycle::runtime(flags) {
        Ok(runtime) => runtime,
        Err(err) => lifecycle::fatal(&format!("cannot start the runtime: {err}")),
    };
    let result = runtime.block_on(async { serve(lifecycle::shutdown_token()).await });
    if let Err(err) = result {
        lifecycle::fatal(&err.to_string());
    }
    crate::telemetry::flush();
}

/// How the driver is greeted.
#[derive(Clone, Copy, Debug)]
pub struct Greeting<'a> {
    pub csi_address: &'a str,
    /// Timeout of each Probe attempt.
    pub probe_timeout: Duration,
    /// Timeout of GetPluginInfo.
    pub identity_timeout: Duration,
    /// Longest gRPC response logged (-1: no limit).
    pub max_log_length: i64,
}

impl<'a> Greeting<'a> {
    /// Every call bounded by one `timeout`, every response logged whole: how most sidecars
    /// greet their driver (with their `--timeout`).
    pub fn bounded_by(csi_address: &'a str, timeout: Duration) -> Self {
        Self {
            csi_address,
            probe_timeout: timeout,
            identity_timeout: timeout,
            max_log_length: -1,
        }
    }
}

/// A driver that answered: its client and its name.
pub struct Driver {
    pub csi: CsiClient,
    pub name: String,
}

/// Connects to the driver (the process exits when the connection is lost, as upstream's does),
/// waits until it is ready, learns its name and labels the CSI metrics with it. `None` when
/// `shutdown` came first.
pub async fn greet_driver(
    greeting: Greeting<'_>,
    metrics: &CsiMetrics,
    shutdown: &CancellationToken,
) -> Result<Option<Driver>, StartupError> {
    let connecting = connection::connect(
        greeting.csi_address,
        ConnectOptions {
            dial_timeout: Some(connection::DEFAULT_DIAL_TIMEOUT),
            policy: LossPolicy::Exit,
        },
    );
    // A stop while the driver is not up yet ends the wait for it, as a stop ends the probe.
    let connection = tokio::select! {
        _ = shutdown.cancelled() => return Ok(None),
        connected = connecting => connected?,
    };
    connection.exit_on_loss();
    let csi =
        CsiClient::new(connection, metrics.clone()).with_max_log_length(greeting.max_log_length);
    match identity::probe_forever(&csi, greeting.probe_timeout, shutdown).await {
        Err(IdentityError::Cancelled) => return Ok(None),
        other => other?,
    }
    let name = identity::driver_name(&csi, Some(greeting.identity_timeout)).await?;
    metrics.set_driver_name(&name);
    tracing::info!(driver = %name, "CSI driver name");
    match identity::label_migration_metrics(&csi, &name, greeting.probe_timeout, shutdown).await {
        Err(IdentityError::Cancelled) => return Ok(None),
        other => other?,
    };
    Ok(Some(Driver { csi, name }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stop_ends_the_wait_for_a_driver_that_is_not_up() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("nobody.sock");
        let address = socket.to_string_lossy().into_owned();
        let metrics = CsiMetrics::new().unwrap();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stop.cancel();
        });
        let started = std::time::Instant::now();
        let greeted = greet_driver(
            Greeting::bounded_by(&address, Duration::from_secs(1)),
            &metrics,
            &shutdown,
        )
        .await
        .unwrap();
        assert!(greeted.is_none());
        // Well before the dial's own bound (30 s).
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }
}
