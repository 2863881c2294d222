//! The registrar's life: learn the driver name, serve the registration socket until shutdown or
//! kubelet's rejection, keep the socket in place, and remove it on the way out.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sidecar_kit::process::http::{HttpError, HttpServer, Reply, Routes};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::driver::{self, DriverError};
use crate::health::{self, Health};
use crate::paths::{self, PathError};
use crate::server::Server;
use crate::service::{RegistrationService, plugin_info};
use crate::socket::{self, FileId, RegistrationListener, SocketError, SocketState};

/// How long in-flight calls (such as kubelet's NotifyRegistrationStatus) may take to finish once
/// the registrar stops.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How the registrar ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exit {
    /// SIGTERM/SIGINT: exit 0.
    Shutdown,
    /// Kubelet refused the registration: exit 1, and the container restart registers again.
    Rejected(String),
}

impl Exit {
    /// What to exit with: `None` for 0, otherwise the message to fail with (upstream's text).
    pub fn failure(&self) -> Option<String> {
        match self {
            Self::Shutdown => None,
            Self::Rejected(error) => Some(format!(
                "Registration process failed with error: {error}, restarting registration container."
            )),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("registration server stopped serving: {0}")]
    Serve(io::Error),
}

/// The registrar's `/healthz` check for a server that someone else runs (the all-in-one
/// process's endpoint); it answers as a missing socket until the registrar has made it.
#[derive(Clone, Default)]
pub struct SharedHealth(Arc<OnceLock<Checker>>);

impl SharedHealth {
    pub async fn reply(&self) -> Reply {
        match self.0.get() {
            Some(checker) => checker.reply().await,
            None => Health::SocketMissing.reply(),
        }
    }
}

/// Runs the registrar until `shutdown` is cancelled or kubelet rejects the registration;
/// `/healthz` is served on the configured endpoint, and answered through `shared` if given.
pub async fn run(
    config: Config,
    shared: Option<SharedHealth>,
    shutdown: CancellationToken,
) -> Result<Exit, RunError> {
    let Some(driver_name) = driver::wait_for_driver_name(
        &config.csi_address,
        config.timeout,
        config.driver_startup_timeout,
        &shutdown,
    )
    .await?
    else {
        return Ok(Exit::Shutdown);
    };
    tracing::info!(driver = %driver_name, "CSI driver name");
    let socket_path = paths::registration_socket_path(&config.registration_dir, &driver_name)?;

    let (service, mut rejections) =
        RegistrationService::new(plugin_info(&driver_name, &config.kubelet_registration_path));
    let server = Server::new(service);
    let mut socket = Socket::bind(&socket_path, &server)?;
    tracing::info!(path = %socket_path.display(), "registration socket is listening; waiting for kubelet");

    let http_stop = CancellationToken::new();
    let recheck = Arc::new(Notify::new());
    let checker = Checker {
        socket_path: Arc::new(socket_path.clone()),
        driver_name: driver_name.clone().into(),
        timeout: config.timeout,
        recheck: config.socket_check_interval.map(|_| recheck.clone()),
    };
    if let Some(shared) = shared {
        let _ = shared.0.set(checker.clone());
    }
    if let Some(address) = &config.http_endpoint {
        let routes = Routes::new().route("/healthz", move || {
            let checker = checker.clone();
            async move { checker.reply().await }
        });
        if let Err(err) = HttpServer::spawn(address, routes, http_stop.clone()).await {
            socket.stop(&socket_path);
            server.shutdown(DRAIN_TIMEOUT).await;
            return Err(err.into());
        }
    }

    let mut checks = config.socket_check_interval.map(|period| {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    let outcome = loop {
        tokio::select! {
            _ = shutdown.cancelled() => break Ok(Exit::Shutdown),
            Some(rejection) = rejections.recv() => break Ok(Exit::Rejected(rejection.error)),
            error = socket.failed() => {
                if checks.is_none() {
                    break Err(RunError::Serve(error));
                }
                tracing::warn!(path = %socket_path.display(), %error, "registration socket stopped accepting connections; re-creating it");
                socket.keep_or_recreate(&socket_path, &server);
            }
            _ = tick(&mut checks) => socket.keep_or_recreate(&socket_path, &server),
            _ = recheck.notified() => socket.keep_or_recreate(&socket_path, &server),
        }
    };

    http_stop.cancel();
    socket.stop(&socket_path);
    server.shutdown(DRAIN_TIMEOUT).await;
    outcome
}

async fn tick(checks: &mut Option<Interval>) {
    match checks {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// The `/healthz` check of the socket this registrar made.
#[derive(Clone)]
struct Checker {
    socket_path: Arc<PathBuf>,
    driver_name: Arc<str>,
    timeout: Duration,
    recheck: Option<Arc<Notify>>,
}

impl Checker {
    async fn reply(&self) -> Reply {
        let health = health::check(&self.socket_path, &self.driver_name, self.timeout).await;
        match &health {
            Health::Ok => tracing::trace!("health check succeeded"),
            Health::SocketMissing => {
                tracing::error!("health check failed: registration socket does not exist");
                // Re-create it now rather than at the next periodic check.
                if let Some(recheck) = &self.recheck {
                    recheck.notify_one();
                }
            }
            Health::Failed(error) => tracing::error!(%error, "health check failed"),
        }
        health.reply()
    }
}

/// The current registration socket and its accept loop.
struct Socket {
    /// The file we created; `None` after a failed re-creation, until the next one succeeds.
    id: Option<FileId>,
    accepting: Option<(CancellationToken, JoinHandle<io::Result<()>>)>,
    /// Said once per foreign file, so that a socket taken over by another instance does not
    /// flood the log.
    reported_replaced: bool,
}

impl Socket {
    fn bind(path: &Path, server: &Server) -> Result<Self, SocketError> {
        let mut socket = Self {
            id: None,
            accepting: None,
            reported_replaced: false,
        };
        socket.start(RegistrationListener::bind(path)?, server);
        Ok(socket)
    }

    fn start(&mut self, listener: RegistrationListener, server: &Server) {
        self.id = Some(listener.id());
        let stop = CancellationToken::new();
        let accepting = server.spawn_accept_loop(listener, stop.clone());
        self.accepting = Some((stop, accepting));
    }

    /// Resolves with the error when the accept loop fails; never while it runs or there is none.
    async fn failed(&mut self) -> io::Error {
        let Some((_, accepting)) = &mut self.accepting else {
            return std::future::pending().await;
        };
        let ended = accepting.await;
        self.accepting = None;
        match ended {
            Ok(Err(error)) => error,
            // The loop returns Ok only when asked to stop, which also takes it out of here.
            Ok(Ok(())) => io::Error::other("listener closed"),
            Err(panicked) => io::Error::other(panicked),
        }
    }

    /// Re-creates the socket when it is gone or no longer accepted on; leaves a file that is not
    /// ours alone.
    fn keep_or_recreate(&mut self, path: &Path, server: &Server) {
        let state = match self.id {
            Some(id) => socket::socket_state(path, id),
            None => Ok(SocketState::Missing),
        };
        match state {
            Ok(SocketState::Ours) if self.accepting.is_some() => return,
            Ok(SocketState::Ours) => {}
            Ok(SocketState::Missing) => {
                if self.id.is_some() {
                    tracing::warn!(path = %path.display(), "registration socket was deleted; re-creating it so that kubelet registers the driver again");
                }
            }
            Ok(SocketState::Replaced) => {
                if !self.reported_replaced {
                    tracing::warn!(path = %path.display(), "registration socket was replaced by another file; leaving it alone");
                    self.reported_replaced = true;
                }
                return;
            }
            Err(err) => {
                tracing::warn!(path = %path.display(), error = %err, "cannot check the registration socket");
                return;
            }
        }
        self.reported_replaced = false;
        self.stop_accepting();
        if let Some(id) = self.id.take() {
            // A socket nobody accepts on any more: replace it.
            let _ = socket::remove_if_ours(path, id);
        }
        match RegistrationListener::bind(path) {
            Ok(listener) => {
                self.start(listener, server);
                tracing::info!(path = %path.display(), "re-created the registration socket");
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot re-create the registration socket; trying again at the next check")
            }
        }
    }

    fn stop_accepting(&mut self) {
        if let Some((stop, _)) = self.accepting.take() {
            stop.cancel();
        }
    }

    /// Stops accepting and removes the socket if it is still ours, which makes kubelet
    /// deregister the driver.
    fn stop(&mut self, path: &Path) {
        self.stop_accepting();
        let Some(id) = self.id.take() else { return };
        match socket::remove_if_ours(path, id) {
            Ok(true) => tracing::info!(path = %path.display(), "removed the registration socket"),
            Ok(false) => {}
            Err(err) => {
                tracing::error!(path = %path.display(), error = %err, "cannot remove the registration socket")
            }
        }
    }
}
