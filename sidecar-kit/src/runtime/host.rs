//! What the controllers of one process share, and how they run: one driver connection (greeted
//! and probed once), one metrics registry, one set of watches, one HTTP endpoint; each
//! controller under its own leader election (or none), stopping the process when one of them
//! ends before shutdown, as a single sidecar exits when it loses its Lease.
//!
//! A single sidecar is a host with one controller; the all-in-one binary is a host with several.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::client::Connections;
use crate::cluster::journal::JournalMetrics;
use crate::cluster::leader::{self, ElectionConfig, LeaderElector, LeaderMetrics};
use crate::driver::csi::CsiClient;
use crate::pipeline::leading::Leadership;
use crate::pipeline::watches::WatchHub;
use crate::pipeline::workqueue::WorkQueueMetrics;
use crate::process::http::{HttpError, HttpPlan, Routes};
use crate::process::metrics::{CsiMetrics, MetricsError, OperationsShape};
use crate::runtime::RouteHook;
use crate::runtime::consolidated;
use crate::runtime::startup::{self, Greeting, StartupError};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Metrics(#[from] MetricsError),
    #[error("cannot register metrics: {0}")]
    Registry(#[from] prometheus::Error),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    #[error(transparent)]
    Kube(#[from] crate::cluster::client::KubeError),
    #[error("the {0} controller stopped before the process was asked to")]
    Stopped(&'static str),
    #[error("a controller failed: {0}")]
    Panicked(String),
}

/// The process's share: the driver, its name, the registry's metrics, the watches.
#[derive(Clone)]
pub struct Host {
    pub csi: CsiClient,
    pub driver: String,
    pub metrics: CsiMetrics,
    pub queue_metrics: WorkQueueMetrics,
    pub journal_metrics: JournalMetrics,
    pub watches: WatchHub,
    /// The connections to the API server every client of the process shares.
    pub connections: Connections,
    leader_metrics: LeaderMetrics,
}

impl Host {
    /// Connects to the driver, waits for it and learns its name; `None` when `shutdown` came
    /// first. `watches` is a hub of its own for a single sidecar, a shared one for several;
    /// the connections to `kube`'s API server are the process's; its CSI calls are recorded in
    /// the histogram `operations`.
    pub async fn start(
        greeting: Greeting<'_>,
        operations: OperationsShape,
        watches: WatchHub,
        kube: &kube::Config,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, HostError> {
        let connections = Connections::new(kube)?;
        let metrics = CsiMetrics::with_shape(operations)?;
        crate::telemetry::register_metrics(metrics.registry())?;
        let Some(driver) = startup::greet_driver(greeting, &metrics, shutdown).await? else {
            return Ok(None);
        };
        Ok(Some(Self {
            csi: driver.csi,
            driver: driver.name,
            queue_metrics: WorkQueueMetrics::register(metrics.registry())?,
            journal_metrics: JournalMetrics::register(metrics.registry())?,
            leader_metrics: LeaderMetrics::register(metrics.registry())?,
            metrics,
            watches,
            connections,
        }))
    }
}

type Run = Box<dyn FnOnce(CancellationToken) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A controller ready to run.
pub struct Controller {
    /// The controller's name in logs and errors: "provisioner".
    pub name: &'static str,
    /// Its leader election: the client for the Lease and the settings; `None` runs it at once.
    pub election: Option<(kube::Client, ElectionConfig)>,
    run: Run,
    /// Routes it adds to the process's HTTP endpoint (a server sidecar's readiness).
    routes: Option<RouteHook>,
}

impl Controller {
    /// `run` runs the controller until the token it is given is cancelled.
    pub fn new<F, Fut>(
        name: &'static str,
        election: Option<(kube::Client, ElectionConfig)>,
        run: F,
    ) -> Self
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Self {
            name,
            election,
            run: Box::new(move |token| Box::pin(run(token))),
            routes: None,
        }
    }

    /// The controller with routes of its own on the HTTP endpoint.
    pub fn with_routes(self, routes: RouteHook) -> Self {
        Self {
            routes: Some(routes),
            ..self
        }
    }
}

/// KEP-4958's consolidated Lease: the controllers that elect a leader run under one election
/// on the Lease named after `lock` (with the first one's client and settings) instead of one
/// each.
/// The first time it is won, their own Leases are taken over (see [`consolidated`]); a single
/// sidecar still leading one of them stops the process with that message. Controllers without
/// an election are left as they are.
pub fn consolidate(controllers: Vec<Controller>, lock: &str) -> Vec<Controller> {
    let (electing, mut others): (Vec<Controller>, Vec<Controller>) =
        controllers.into_iter().partition(|c| c.election.is_some());
    let Some((client, first)) = electing.first().and_then(|c| c.election.clone()) else {
        return others;
    };
    let legacy: Vec<ElectionConfig> = electing
        .iter()
        .filter_map(|c| c.election.as_ref().map(|(_, config)| config.clone()))
        .collect();
    let config = ElectionConfig {
        lease_name: crate::cluster::leader::sanitize_name(lock),
        labels: consolidated::labels(&legacy),
        event_source: crate::cluster::leader::event_source(lock),
        ..first
    };
    let runs: Vec<Controller> = electing
        .into_iter()
        .map(|c| Controller {
            election: None,
            ..c
        })
        .collect();
    let election = (client.clone(), config.clone());
    others.push(Controller::new(CONSOLIDATED, Some(election), move |leading| async move {
        // A warm standby runs the controllers while it waits; they act once the single
        // sidecars' Leases are taken over as well.
        let mut won = Leadership::current();
        let (taken_over, leadership) = Leadership::gated();
        let stop = leading.child_token();
        let take_over = async {
            if !won.wait(&leading).await {
                return;
            }
            match consolidated::take_over(&client, &config, &legacy).await {
                Ok(()) => taken_over.open(),
                Err(err) => {
                    tracing::error!(error = %err, "cannot run the controllers under the consolidated Lease");
                    stop.cancel();
                }
            }
        };
        let controllers = async {
            if let Err(err) = leadership.scope(supervise(runs, stop.clone())).await {
                tracing::error!(error = %err, "a controller under the consolidated Lease stopped");
            }
        };
        futures::join!(take_over, controllers);
    }));
    others
}

/// The name of the controllers run under one consolidated Lease, in logs and errors.
pub const CONSOLIDATED: &str = "consolidated";

/// Serves HTTP (metrics, and the leader health of every controller that elects), then runs the
/// controllers until `shutdown`. A controller that ends first (its leadership lost, its task
/// failed) stops the others and the process with an error.
pub async fn run(
    host: &Host,
    http: &HttpPlan,
    metrics_path: &str,
    extra_routes: impl FnOnce(Routes) -> Routes,
    controllers: Vec<Controller>,
    shutdown: CancellationToken,
) -> Result<(), HostError> {
    let mut electors = Vec::with_capacity(controllers.len());
    let mut own_routes = Vec::new();
    for mut controller in controllers {
        own_routes.extend(controller.routes.take());
        let elector = controller.election.map(|(client, settings)| {
            LeaderElector::new(client, settings).with_metrics(host.leader_metrics.clone())
        });
        electors.push((controller.name, elector, controller.run));
    }
    let health = electors
        .iter()
        .filter_map(|(_, elector, _)| elector.as_ref().map(LeaderElector::health))
        .collect();
    let routes = move |routes: Routes| {
        own_routes
            .into_iter()
            .fold(extra_routes(routes), |routes, add| add(routes))
    };
    http.serve(metrics_path, &host.metrics, health, routes, &shutdown)
        .await?;
    run_all(electors, shutdown).await
}

/// Runs `controllers` until `shutdown`, as [`run`] does, for a process without a host: one
/// whose parts wait for the driver on their own and serve their own HTTP.
pub async fn supervise(
    controllers: Vec<Controller>,
    shutdown: CancellationToken,
) -> Result<(), HostError> {
    let electors = controllers
        .into_iter()
        .map(|c| {
            let elector = c
                .election
                .map(|(client, settings)| LeaderElector::new(client, settings));
            (c.name, elector, c.run)
        })
        .collect();
    run_all(electors, shutdown).await
}

/// How long the other controllers of a process get to stop once one of them has ended (its
/// Lease lost, its task failed) before the process ends without them. After a lost Lease
/// another replica may lead within the lease duration less the renew deadline (5 s by
/// default), so the rest must not go on working much longer than that: in-flight work is left
/// to the next leader (a create call to the intent journal).
pub const DRAIN: Duration = Duration::from_secs(5);

/// Runs a warm standby's controller at once, behind a gate that `elector` opens once it wins
/// the Lease (see [`crate::pipeline::leading`]); returns as [`LeaderElector::run`] does. A
/// controller that ends while it stands by ends the election too.
async fn stand_by(
    elector: LeaderElector,
    shutdown: CancellationToken,
    run: Run,
) -> Result<(), leader::LeaderError> {
    let (gate, leadership) = Leadership::gated();
    let watcher = leadership.clone();
    let stop = shutdown.child_token();
    let finished = CancellationToken::new();
    // Polled here rather than spawned, so that it ends with the election.
    let work = async {
        leadership.scope(run(stop.clone())).await;
        finished.cancel();
    };
    let (lead_stop, lead_finished) = (stop.clone(), finished.clone());
    let election = elector.run(shutdown, move |leading| async move {
        gate.open();
        tokio::select! {
            _ = leading.cancelled() => lead_stop.cancel(),
            _ = lead_finished.cancelled() => {}
        }
        lead_finished.cancelled().await;
    });
    tokio::pin!(work, election);
    let mut worked = false;
    let result = loop {
        tokio::select! {
            result = &mut election => break result,
            // Having led, the election ends once the work has, releasing the Lease.
            _ = &mut work, if !worked => {
                worked = true;
                if !watcher.leads() {
                    break Ok(());
                }
            }
        }
    };
    stop.cancel();
    if result.is_ok() && !worked {
        // In-flight work finishes; after a lost Lease the caller drains the rest instead.
        work.await;
    }
    result
}

/// Each controller stops with the process, or makes the process stop: once one ends first, the
/// others are stopped and given [`DRAIN`] before they are abandoned.
async fn run_all(
    electors: Vec<(&'static str, Option<LeaderElector>, Run)>,
    shutdown: CancellationToken,
) -> Result<(), HostError> {
    let stop = shutdown.child_token();
    let mut running = JoinSet::new();
    // Controllers run under a consolidated Lease wait for it as their parent does.
    let leadership = Leadership::current();
    for (name, elector, run) in electors {
        let token = stop.clone();
        running.spawn(leadership.clone().scope(async move {
            let result = match elector {
                Some(elector) if elector.warm_standby() => {
                    stand_by(elector, token, run).await.map_err(HostError::from)
                }
                Some(elector) => elector.run(token, run).await.map_err(HostError::from),
                None => {
                    run(token).await;
                    Ok(())
                }
            };
            (name, result)
        }));
    }
    let mut outcome = Ok(());
    let mut drain_until = None;
    loop {
        let next = running.join_next();
        let joined = match drain_until {
            None => next.await,
            Some(deadline) => match tokio::time::timeout_at(deadline, next).await {
                Ok(joined) => joined,
                Err(_) => {
                    tracing::error!(
                        controllers = running.len(),
                        drain = ?DRAIN,
                        "controllers still working after the drain; stopping without them"
                    );
                    running.abort_all();
                    break;
                }
            },
        };
        let Some(joined) = joined else { break };
        let (name, result) = match joined {
            Ok(done) => done,
            Err(err) => ("controller", Err(HostError::Panicked(err.to_string()))),
        };
        if outcome.is_ok() {
            match result {
                Err(err) => {
                    tracing::error!(controller = name, error = %err, "controller stopped; stopping the others");
                    outcome = Err(err);
                }
                Ok(()) if !shutdown.is_cancelled() => {
                    tracing::error!(controller = name, "controller stopped; stopping the others");
                    outcome = Err(HostError::Stopped(name));
                }
                Ok(()) => {}
            }
            if outcome.is_err() {
                stop.cancel();
                drain_until = Some(Instant::now() + DRAIN);
            }
        }
    }
    outcome
}
