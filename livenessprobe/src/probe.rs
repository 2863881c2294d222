//! The health check behind `/healthz`: one Probe call to the driver, bounded by
//! `--probe-timeout`, over a connection that is kept between checks.
//!
//! Upstream dials a fresh connection for every check so that a deleted socket is noticed. Here
//! the connection is reused, and each check first looks at the socket file: a missing file fails
//! the check, and a file that is not the one the connection was made to (replaced socket,
//! restarted driver) or a connection that was lost leads to a redial within the same time limit.
//! Checks share the connection without waiting for each other, except while one of them redials.

use std::error::Error as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::StatusCode;
use sidecar_kit::driver::connection::{ConnectError, ConnectOptions, LossPolicy, connect};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::driver::endpoint::{self, Endpoint, EndpointError};
use sidecar_kit::process::http::Reply;
use sidecar_kit::process::metrics::{CsiMetrics, code_label};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::Status;

use crate::socket::{FileId, SocketFile, socket_file};

/// Body of the answer when the driver says it is not ready (upstream's text).
pub const NOT_READY: &str = "driver responded but is not ready";

/// Outcome of one health check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// Probe answered with `ready` true or unset.
    Ready,
    /// Probe answered with `ready: false`.
    NotReady,
    /// No answer: the text says why.
    Failed(String),
}

impl Health {
    /// The HTTP answer upstream gives for this outcome.
    pub fn reply(&self) -> Reply {
        match self {
            Self::Ready => Reply::ok(),
            Self::NotReady => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, NOT_READY),
            Self::Failed(reason) => Reply::text(StatusCode::INTERNAL_SERVER_ERROR, reason.clone()),
        }
    }

    /// Classifies a Probe result: `ready` unset counts as ready, as the CSI spec says.
    pub fn from_probe(result: &Result<csi_proto::v1::ProbeResponse, Status>) -> Self {
        match result {
            Ok(response) if response.ready == Some(false) => Self::NotReady,
            Ok(_) => Self::Ready,
            Err(status) => Self::Failed(grpc_error_text(status)),
        }
    }
}

/// A gRPC error as gRPC-Go renders it, which is what upstream puts in the body.
pub fn grpc_error_text(status: &Status) -> String {
    format!(
        "rpc error: code = {} desc = {}",
        code_label(status.code()),
        status.message()
    )
}

/// Whether a connection dialed when the socket file was `dialed` can serve a check now that the
/// file is `now`.
pub fn reusable(dialed: Option<FileId>, broken: bool, now: SocketFile) -> bool {
    if broken {
        return false;
    }
    match now {
        SocketFile::Present(id) => dialed == Some(id),
        SocketFile::Missing => false,
        SocketFile::Untracked => true,
    }
}

/// One connection to the driver and what it was made to.
#[derive(Clone)]
struct Link {
    client: CsiClient,
    /// The socket file when dialed; `None` if it could not be told or changed during the dial.
    file: Option<FileId>,
    /// Set when a call failed in transport, so that the next check redials.
    failed: Arc<AtomicBool>,
}

impl Link {
    fn broken(&self) -> bool {
        self.failed.load(Ordering::Relaxed) || self.client.connection().losses() > 0
    }
}

/// Runs health checks against one driver endpoint. Share it behind an `Arc`.
pub struct Prober {
    address: String,
    endpoint: Endpoint,
    timeout: Duration,
    metrics: CsiMetrics,
    link: Mutex<Option<Link>>,
    dials: AtomicU64,
}

impl Prober {
    /// A prober for the driver at `address` (`--csi-address` syntax); it connects on first use.
    pub fn new(
        address: &str,
        timeout: Duration,
        metrics: CsiMetrics,
    ) -> Result<Self, EndpointError> {
        Ok(Self {
            address: address.to_string(),
            endpoint: endpoint::parse(address)?,
            timeout,
            metrics,
            link: Mutex::new(None),
            dials: AtomicU64::new(0),
        })
    }

    /// Connects, waiting for the driver at most `dial_timeout` (`None`: forever), and keeps the
    /// connection for the checks that follow.
    pub async fn connect(&self, dial_timeout: Option<Duration>) -> Result<CsiClient, ConnectError> {
        let mut link = self.link.lock().await;
        let fresh = self.dial(dial_timeout).await?;
        let client = fresh.client.clone();
        *link = Some(fresh);
        Ok(client)
    }

    /// The driver's address, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// How many connections have been made so far.
    pub fn dials(&self) -> u64 {
        self.dials.load(Ordering::Relaxed)
    }

    /// Runs one health check, bounded by the probe timeout as a whole.
    pub async fn check(&self) -> Health {
        let health = self.check_until(Instant::now() + self.timeout).await;
        match &health {
            Health::Ready => tracing::trace!("health check succeeded"),
            Health::NotReady => tracing::error!("driver responded but is not ready"),
            Health::Failed(reason) => tracing::error!(%reason, "health check failed"),
        }
        health
    }

    async fn check_until(&self, deadline: Instant) -> Health {
        let mut retried = false;
        loop {
            let link = match tokio::time::timeout_at(deadline, self.usable_link(deadline)).await {
                Ok(Ok(link)) => link,
                Ok(Err(health)) => return health,
                Err(_) => {
                    return Health::Failed(format!(
                        "timed out after {:?} connecting to the CSI driver at {}",
                        self.timeout, self.endpoint
                    ));
                }
            };
            tracing::trace!("sending probe request to the CSI driver");
            let remaining = deadline.saturating_duration_since(Instant::now());
            let result = link.client.probe(CallOptions::timeout(remaining)).await;
            if let Err(status) = &result
                && failed_in_transport(&link, status)
            {
                link.failed.store(true, Ordering::Relaxed);
                // The call may have raced with a driver restart: one more try on a fresh
                // connection answers for the driver that is there now.
                if !retried && Instant::now() < deadline {
                    retried = true;
                    tracing::debug!(error = %status, "probe failed in transport; reconnecting");
                    continue;
                }
            }
            return Health::from_probe(&result);
        }
    }

    /// The connection to use for a check, redialed if the socket changed or it was lost.
    async fn usable_link(&self, deadline: Instant) -> Result<Link, Health> {
        let file = socket_file(&self.endpoint);
        if file == SocketFile::Missing {
            // A connection to a deleted socket may still work, but the kubelet cannot reach that
            // driver any more; drop it unless a redial holds the lock.
            if let Ok(mut link) = self.link.try_lock() {
                *link = None;
            }
            let shown = match &self.endpoint {
                Endpoint::Unix(path) => path.display().to_string(),
                other => other.to_string(),
            };
            return Err(Health::Failed(format!(
                "CSI driver socket {shown} does not exist"
            )));
        }
        let mut link = self.link.lock().await;
        if let Some(current) = link.as_ref()
            && reusable(current.file, current.broken(), file)
        {
            return Ok(current.clone());
        }
        if link.take().is_some() {
            tracing::info!(endpoint = %self.endpoint, "CSI driver socket replaced or connection lost; reconnecting");
        }
        // Retrying stops a little before the deadline so that the answer names the last dial
        // error; the caller's deadline still cuts off a dial that hangs.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let fresh = self
            .dial(Some(remaining - remaining / 10))
            .await
            .map_err(|err| Health::Failed(dial_failure(&err)))?;
        *link = Some(fresh.clone());
        Ok(fresh)
    }

    async fn dial(&self, dial_timeout: Option<Duration>) -> Result<Link, ConnectError> {
        let before = socket_file(&self.endpoint);
        let connection = connect(
            &self.address,
            ConnectOptions {
                dial_timeout,
                policy: LossPolicy::Reconnect,
            },
        )
        .await?;
        // Only a file seen unchanged on both sides of the dial is known to be the one dialed.
        let file = match (before, socket_file(&self.endpoint)) {
            (SocketFile::Present(a), SocketFile::Present(b)) if a == b => Some(a),
            _ => None,
        };
        self.dials.fetch_add(1, Ordering::Relaxed);
        Ok(Link {
            client: CsiClient::new(connection, self.metrics.clone()),
            file,
            failed: Arc::new(AtomicBool::new(false)),
        })
    }
}

/// Errors made on our side of the connection carry their cause; statuses the driver sent do not.
fn failed_in_transport(link: &Link, status: &Status) -> bool {
    link.client.connection().losses() > 0 || status.source().is_some()
}

fn dial_failure(err: &ConnectError) -> String {
    match err {
        ConnectError::Timeout {
            endpoint,
            last_error,
            ..
        } => format!("cannot connect to the CSI driver at {endpoint}: {last_error}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::ProbeResponse;

    #[test]
    fn probe_outcomes() {
        assert_eq!(
            Health::from_probe(&Ok(ProbeResponse { ready: None })),
            Health::Ready
        );
        assert_eq!(
            Health::from_probe(&Ok(ProbeResponse { ready: Some(true) })),
            Health::Ready
        );
        assert_eq!(
            Health::from_probe(&Ok(ProbeResponse { ready: Some(false) })),
            Health::NotReady
        );
        assert_eq!(
            Health::from_probe(&Err(Status::failed_precondition("disk gone"))),
            Health::Failed("rpc error: code = FailedPrecondition desc = disk gone".into())
        );
    }

    #[test]
    fn replies() {
        assert_eq!(Health::Ready.reply(), Reply::ok());
        let not_ready = Health::NotReady.reply();
        assert_eq!(not_ready.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(not_ready.body, "driver responded but is not ready");
        let failed = Health::Failed("boom".into()).reply();
        assert_eq!(failed.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(failed.body, "boom");
    }

    #[test]
    fn go_error_text_uses_go_code_names() {
        assert_eq!(
            grpc_error_text(&Status::cancelled("stop")),
            "rpc error: code = Canceled desc = stop"
        );
        assert_eq!(
            grpc_error_text(&Status::deadline_exceeded("context deadline exceeded")),
            "rpc error: code = DeadlineExceeded desc = context deadline exceeded"
        );
    }

    #[test]
    fn reuse_rules() {
        let a = FileId::new(1, 10);
        let b = FileId::new(1, 11);
        assert!(reusable(Some(a), false, SocketFile::Present(a)));
        assert!(!reusable(Some(a), false, SocketFile::Present(b)));
        assert!(!reusable(None, false, SocketFile::Present(a)));
        assert!(!reusable(Some(a), true, SocketFile::Present(a)));
        assert!(!reusable(Some(a), false, SocketFile::Missing));
        assert!(reusable(None, false, SocketFile::Untracked));
        assert!(!reusable(None, true, SocketFile::Untracked));
    }
}
