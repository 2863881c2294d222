//! The runtime every sidecar that speaks to the API server runs on: the controllers, and the
//! server sidecar that answers backup applications (csi-snapshot-metadata, see
//! [`Setup::server`]). A sidecar is a plug-in: an [`impl Sidecar`]
//! names it, says how its command line reads and how it greets its driver, and `prepare`s its
//! controller from what the runtime hands it ([`Setup`]). The runtime owns the rest, in
//! upstream's order: parse → `--version` → logging → validate → HTTP plan → cluster
//! configuration → connect → Probe → the driver's name → prepare → serve HTTP → elect → run.
//!
//! [`main`] runs one sidecar as its own binary. The multi-call binary holds the same plug-ins
//! behind [`Plugin`] and runs several on one [`Host`].
//!
//! [`impl Sidecar`]: Sidecar

pub mod consolidated;
pub mod host;
pub mod lifecycle;
pub mod startup;

use std::ffi::OsString;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use clap::CommandFactory;
use tokio_util::sync::CancellationToken;

use crate::cluster::client::{Clients, KubeError, KubeconfigRule};
use crate::cluster::journal::{self, Location, journal_name};
use crate::cluster::leader::{self, ElectionConfig};
use crate::driver::identity::IdentityError;
use crate::pipeline::Wiring;
use crate::pipeline::watches::WatchHub;
use crate::process::flags::{CommonFlags, FlagSyntax, parse_with};
use crate::process::http::{HttpError, HttpPlan, Routes};
use crate::process::metrics::OperationsShape;
use crate::runtime::startup::Greeting;
use host::{Controller, Host, HostError};

/// `period` scaled by a factor between `low` and `high`, so that processes that started
/// together do not retry together. Not for anything secret: the clock's nanoseconds suffice.
pub(crate) fn jittered(period: Duration, low: f64, high: f64) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    period.mul_f64(low + (high - low) * (f64::from(nanos % 1000) / 1000.0))
}

/// Routes a sidecar adds to the process's HTTP endpoint.
pub type RouteHook = Box<dyn FnOnce(Routes) -> Routes + Send>;

/// A controller sidecar: what is its own about start-up. Everything else is the runtime's.
pub trait Sidecar: 'static {
    /// Its name in KEP-4958's `--controllers`, in flag prefixes, logs and errors: "attacher".
    const NAME: &'static str;
    /// Its binary's name, the program name its parser sees and its User-Agent's product.
    const BINARY: &'static str;
    /// The version `--version` prints and the User-Agent carries: the suite's, as every
    /// binary of it is released together.
    const VERSION: &'static str = crate::VERSION;
    /// How its command line is spelled.
    const SYNTAX: FlagSyntax = FlagSyntax::Go;
    /// Which of `--kubeconfig` and `$KUBECONFIG` wins, as its upstream decides.
    const KUBECONFIG: KubeconfigRule = KubeconfigRule::FlagOnly;
    /// The histogram its CSI calls are recorded in.
    const OPERATIONS: OperationsShape = OperationsShape::CSI_SIDECAR;

    /// Its command line: the flags every sidecar has, and how the runtime reads its own.
    type Cli: SidecarCli;

    /// The controller, ready to run: its capabilities learnt, its configuration, clients,
    /// journal and Lease.
    fn prepare(
        cli: &Self::Cli,
        setup: &Setup<'_>,
    ) -> impl Future<Output = Result<Controller, PrepareError>>;

    /// Routes of its own on the HTTP endpoint.
    fn routes(_cli: &Self::Cli) -> RouteHook {
        Box::new(|routes| routes)
    }
}

/// A controller sidecar's command line, as the runtime reads it before the sidecar prepares.
pub trait SidecarCli: clap::Parser + Send + Sync + 'static {
    /// Why the command line is refused after parsing (exit code 1, as upstream's checks).
    type Invalid: std::error::Error + Send + Sync + 'static;

    /// The flags every sidecar has: its own for a controller sidecar, what [`complete`] made of
    /// its own for one whose upstream has another set (a server sidecar without a Lease).
    ///
    /// [`complete`]: SidecarCli::complete
    fn common(&self) -> &CommonFlags;

    /// Completes the command line once parsed: a sidecar whose flags are not [`CommonFlags`]
    /// maps them onto the set the runtime reads.
    fn complete(&mut self) {}

    /// Checks the command line (and the environment it names) before anything starts.
    fn validate(&self) -> Result<(), Self::Invalid>;

    /// How the driver is greeted: the probe's and identity calls' timeouts.
    fn greeting(&self) -> Greeting<'_>;

    /// Logs what the command line deserves a warning for (removed flags).
    fn warn(&self) {}

    /// `--master`, for the sidecars that have it: the API server's URL instead of the
    /// configuration's.
    fn master(&self) -> &str {
        ""
    }

    /// Whether the controller elects a leader: `--leader-election`.
    fn leader_election(&self) -> bool {
        self.common().leader_election.leader_election
    }

    /// Whether the Lease is released on exit although `--leader-election-release-on-exit` is
    /// off (a feature gate of the sidecar's own).
    fn release_lease_on_exit(&self) -> bool {
        false
    }
}

/// Why a sidecar could not prepare its controller.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot register metrics: {0}")]
    Registry(#[from] prometheus::Error),
    /// A reason of the sidecar's own.
    #[error(transparent)]
    Sidecar(Box<dyn std::error::Error + Send + Sync>),
}

impl PrepareError {
    /// A failure of the sidecar's own.
    pub fn own(err: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Sidecar(Box::new(err))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
}

/// What a sidecar prepares its controller from: the process's [`Host`] (driver, metrics,
/// watches) and the cluster as the sidecar speaks to it (its User-Agent, its `--master`, its
/// `--kube-api-qps` and `--kube-api-burst`, its leader election flags).
pub struct Setup<'a> {
    pub host: &'a Host,
    kube_config: kube::Config,
    common: &'a CommonFlags,
    name: &'static str,
    binary: &'static str,
    elect: bool,
    release_lease_on_exit: bool,
}

impl<'a> Setup<'a> {
    /// The setup of `S` with `cli` on `host`, whose cluster is `kube_config`.
    pub fn new<S: Sidecar>(
        host: &'a Host,
        kube_config: &kube::Config,
        cli: &'a S::Cli,
    ) -> Result<Self, KubeError> {
        let mut kube_config =
            crate::cluster::client::as_program(kube_config, S::BINARY, S::VERSION);
        crate::cluster::client::override_master(&mut kube_config, cli.master())?;
        Ok(Self {
            host,
            kube_config,
            common: cli.common(),
            name: S::NAME,
            binary: S::BINARY,
            elect: cli.leader_election(),
            release_lease_on_exit: cli.release_lease_on_exit(),
        })
    }

    /// The cluster configuration, with the sidecar's User-Agent.
    pub fn kube_config(&self) -> &kube::Config {
        &self.kube_config
    }

    /// A client limited by `--kube-api-qps` and `--kube-api-burst`.
    pub fn client(&self) -> Result<kube::Client, KubeError> {
        let kube = &self.common.kube;
        self.client_limited(kube.kube_api_qps, kube.kube_api_burst)
    }

    /// A client with a rate limit of its own.
    pub fn client_limited(&self, qps: f64, burst: u32) -> Result<kube::Client, KubeError> {
        self.host.connections.client(&self.kube_config, qps, burst)
    }

    /// The work's client and the background one for Events, sharing `--kube-api-qps`'s limit.
    pub fn clients(&self) -> Result<Clients, KubeError> {
        let kube = &self.common.kube;
        self.host
            .connections
            .clients(&self.kube_config, kube.kube_api_qps, kube.kube_api_burst)
    }

    /// The intent journal's client, which the journal paces by its own budget
    /// ([`journal::qps_for`]).
    pub fn journal_client(&self) -> Result<journal::JournalClient, KubeError> {
        Ok(journal::JournalClient {
            client: self.client_limited(-1.0, 0)?,
            qps: journal::qps_for(self.common.kube.kube_api_qps),
        })
    }

    /// Where the journal of the Lease `lease` lives: beside the Lease, one per node with
    /// `node`.
    pub fn journal_location(&self, lease: &str, node: Option<&str>) -> Location {
        Location {
            namespace: leader::lease_namespace(
                &self.common.leader_election.leader_election_namespace,
            ),
            name: journal_name(lease, node),
            key_secret: journal::keys::secret_name(lease),
            lease: lease.to_string(),
        }
    }

    /// Puts the watches and work-queue metrics the process's controllers share into a
    /// controller's `wiring`, and this host's name (the leader election identity) into its
    /// Events unless they name none.
    pub fn share(&self, wiring: &mut Wiring) {
        wiring.watches = self.host.watches.clone();
        wiring.queue_metrics = Some(self.host.queue_metrics.clone());
        wiring.journal_metrics = Some(self.host.journal_metrics.clone());
        wiring.service = Some(Arc::from(self.binary));
        if wiring.names_host {
            wiring.reporter.instance = leader::default_identity();
        }
    }

    /// The sidecar's controller, which `run`s until the token it is given is cancelled, under
    /// the leader election of the Lease named after `lock` (sanitized, as upstream names its
    /// Lease after its lock name) when `--leader-election` asks: with a client of its own and the
    /// controller's budget (so that the controller's requests never throttle its renewals) and
    /// the settings of the leader election flags. The Lease is released on exit when
    /// `--leader-election-release-on-exit` or the sidecar asks.
    pub fn controller<F, Fut>(&self, lock: &str, run: F) -> Result<Controller, HostError>
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let election = if self.elect {
            let flags = &self.common.leader_election;
            let mut settings = ElectionConfig::from_flags(lock, flags)?;
            settings.release_on_exit =
                flags.leader_election_release_on_exit || self.release_lease_on_exit;
            Some((self.client()?, settings))
        } else {
            None
        };
        Ok(Controller::new(self.name, election, run))
    }

    /// A server sidecar's work: it answers peers rather than reconciling objects, so it elects
    /// no leader (every replica serves) and `run`s from the start until the token it is given
    /// is cancelled, with `routes` of its own on the HTTP endpoint.
    pub fn server<F, Fut>(&self, routes: RouteHook, run: F) -> Controller
    where
        F: FnOnce(CancellationToken) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Controller::new(self.name, None, run).with_routes(routes)
    }
}

/// `S`'s command line, its `--kubeconfig` help stating the rule `S` reads it by.
fn command<S: Sidecar>() -> clap::Command {
    // Not `mut_arg`, which would move the flag to the end of the help.
    S::Cli::command().mut_args(|arg| {
        if arg.get_id() == "kubeconfig" {
            arg.help(S::KUBECONFIG.help())
        } else {
            arg
        }
    })
}

/// Parses `args` as `S`'s binary does.
fn parse_from<S: Sidecar>(args: Vec<OsString>) -> Result<S::Cli, clap::Error> {
    let mut cli: S::Cli = parse_with(command::<S>(), args, S::SYNTAX)?;
    cli.complete();
    Ok(cli)
}

/// Parses `args` as `S`'s binary does, printing help or errors and exiting as it does.
fn parse_args<S: Sidecar>(args: Vec<OsString>) -> S::Cli {
    parse_from::<S>(args).unwrap_or_else(|err| err.exit())
}

/// Runs `S` as its own binary with the command line `args` (the first item names the program)
/// until it ends; exits the process on errors.
pub fn main<S: Sidecar>(args: impl IntoIterator<Item = OsString>) {
    let cli = parse_args::<S>(args.into_iter().collect());
    let common = cli.common();
    lifecycle::exit_if_version(&common.process, S::VERSION);
    lifecycle::start_logging(&common.logging, S::BINARY);
    cli.warn();
    if let Err(err) = cli.validate() {
        lifecycle::fatal(&err.to_string());
    }
    let process = common.process.clone();
    startup::run(&process, |shutdown| serve::<S>(cli, shutdown));
}

/// Runs `S` until a graceful shutdown (`Ok`) or a fatal error: its HTTP endpoint and cluster
/// from the flags, a host of its own, the one controller it prepares.
pub async fn serve<S: Sidecar>(
    cli: S::Cli,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError> {
    let common = cli.common();
    let plan = HttpPlan::from_flags(&common.http)?;
    let config = crate::cluster::client::load_config(&common.kube, S::KUBECONFIG).await?;
    let Some(host) = Host::start(
        cli.greeting(),
        S::OPERATIONS,
        WatchHub::default(),
        &config,
        &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    let setup = Setup::new::<S>(&host, &config, &cli)?;
    let controller = S::prepare(&cli, &setup).await?;
    host::run(
        &host,
        &plan,
        &common.http.metrics_path,
        S::routes(&cli),
        vec![controller],
        shutdown,
    )
    .await?;
    Ok(())
}

/// A controller sidecar as the multi-call binary holds it, whatever its command-line type.
pub trait Plugin: Sync {
    /// [`Sidecar::NAME`].
    fn name(&self) -> &'static str;
    /// [`Sidecar::BINARY`].
    fn binary(&self) -> &'static str;
    /// Its command line's declaration, for routing and help.
    fn command(&self) -> clap::Command;
    /// Runs it as its own binary would ([`main`]).
    fn main(&self, args: Vec<OsString>);
    /// Parses and checks `args` as its binary does; the message on failure.
    fn check(&self, args: Vec<OsString>) -> Result<(), String>;
    /// Parses `args` as its binary does, printing help or errors and exiting as it does.
    fn parse(&self, args: Vec<OsString>) -> Box<dyn Parsed>;
}

/// A plug-in's parsed command line.
pub trait Parsed {
    fn name(&self) -> &'static str;
    fn common(&self) -> &CommonFlags;
    fn warn(&self);
    fn validate(&self) -> Result<(), String>;
    fn greeting(&self) -> Greeting<'_>;
    /// [`Sidecar::prepare`] on `host`, whose cluster is `kube_config`.
    fn prepare<'a>(
        &'a self,
        host: &'a Host,
        kube_config: &'a kube::Config,
    ) -> Pin<Box<dyn Future<Output = Result<Controller, String>> + 'a>>;
    fn routes(&self) -> RouteHook;
}

/// The [`Plugin`] of `S`.
pub struct Plug<S>(PhantomData<fn() -> S>);

impl<S> Plug<S> {
    pub const fn new() -> Self {
        Self(PhantomData)
    }
}

impl<S> Default for Plug<S> {
    fn default() -> Self {
        Self::new()
    }
}

impl<S: Sidecar> Plugin for Plug<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn binary(&self) -> &'static str {
        S::BINARY
    }

    fn command(&self) -> clap::Command {
        command::<S>()
    }

    fn main(&self, args: Vec<OsString>) {
        main::<S>(args)
    }

    fn check(&self, args: Vec<OsString>) -> Result<(), String> {
        let cli = parse_from::<S>(args).map_err(|e| e.to_string())?;
        cli.validate().map_err(|e| e.to_string())
    }

    fn parse(&self, args: Vec<OsString>) -> Box<dyn Parsed> {
        Box::new(Cli::<S>(parse_args::<S>(args)))
    }
}

struct Cli<S: Sidecar>(S::Cli);

impl<S: Sidecar> Parsed for Cli<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn common(&self) -> &CommonFlags {
        self.0.common()
    }

    fn warn(&self) {
        self.0.warn()
    }

    fn validate(&self) -> Result<(), String> {
        self.0.validate().map_err(|e| e.to_string())
    }

    fn greeting(&self) -> Greeting<'_> {
        self.0.greeting()
    }

    fn prepare<'a>(
        &'a self,
        host: &'a Host,
        kube_config: &'a kube::Config,
    ) -> Pin<Box<dyn Future<Output = Result<Controller, String>> + 'a>> {
        Box::pin(async move {
            let setup = Setup::new::<S>(host, kube_config, &self.0).map_err(|e| e.to_string())?;
            S::prepare(&self.0, &setup).await.map_err(|e| e.to_string())
        })
    }

    fn routes(&self) -> RouteHook {
        S::routes(&self.0)
    }
}
