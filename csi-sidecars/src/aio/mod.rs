//! All in one (KEP-4958's layout): `csi-sidecars --controllers=provisioner,attacher,…` runs the
//! selected sidecars in one process. The command line is routed ([`route`]) to each selected
//! sidecar and parsed by the sidecar's own parser, so its checks and messages are the single
//! sidecar's; each keeps its own defaults. The controllers run on one host of the sidecar
//! runtime; the node's sidecars side by side ([`node`]).

mod node;
pub mod route;

use std::ffi::OsString;

use sidecar_kit::cluster::client::KubeconfigRule;
use sidecar_kit::pipeline::watches::WatchHub;
use sidecar_kit::process::http::HttpPlan;
use sidecar_kit::process::metrics::OperationsShape;
use sidecar_kit::runtime::Parsed as ControllerCli;
use sidecar_kit::runtime::host::{self, Host};
use tokio_util::sync::CancellationToken;

use crate::registry::{Kind, LIVENESSPROBE, REGISTRAR};
use route::CONSOLIDATED_FLAG;
pub use route::{Ctl, Plan, RouteError, help, route};

/// How the process finds its cluster. It has no upstream to follow: the flag its pod spec gives
/// wins over a `$KUBECONFIG` an image or a wrapper may bring, as in kubectl.
pub const KUBECONFIG: KubeconfigRule = KubeconfigRule::FlagFirst;

/// A selected sidecar's command line, parsed by its own parser.
enum Parsed {
    Controller(Box<dyn ControllerCli>),
    Livenessprobe(livenessprobe::flags::Cli),
    Registrar(node_driver_registrar::config::Cli),
}

impl Parsed {
    /// Parses as the single sidecar does, printing help or errors and exiting as it does.
    fn parse(ctl: Ctl, args: Vec<OsString>) -> Self {
        use sidecar_kit::process::flags::{FlagSyntax, parse_args};
        match ctl.kind() {
            Kind::Controller(plugin) => Parsed::Controller(plugin.parse(args)),
            Kind::Livenessprobe => Parsed::Livenessprobe(parse_args(args, FlagSyntax::Go)),
            Kind::Registrar => Parsed::Registrar(parse_args(args, FlagSyntax::Go)),
        }
    }

    fn process(&self) -> &sidecar_kit::process::flags::ProcessFlags {
        match self {
            Parsed::Controller(cli) => &cli.common().process,
            Parsed::Livenessprobe(cli) => &cli.process,
            Parsed::Registrar(cli) => &cli.process,
        }
    }

    fn logging(&self) -> &sidecar_kit::process::flags::LoggingFlags {
        match self {
            Parsed::Controller(cli) => &cli.common().logging,
            Parsed::Livenessprobe(cli) => &cli.logging,
            Parsed::Registrar(cli) => &cli.logging,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Parsed::Controller(cli) => cli.name(),
            Parsed::Livenessprobe(_) => LIVENESSPROBE,
            Parsed::Registrar(_) => REGISTRAR,
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Parsed::Controller(cli) => cli.validate(),
            Parsed::Livenessprobe(cli) => livenessprobe::flags::ServePlan::from_cli(cli)
                .map(drop)
                .map_err(|e| e.to_string()),
            Parsed::Registrar(cli) => node::registrar_config(cli).map(drop),
        }
    }
}

/// Parses and checks a sidecar's command line as the single sidecar does; the message on
/// failure.
pub fn check(ctl: Ctl, args: Vec<OsString>) -> Result<(), String> {
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};
    let text = |e: clap::Error| e.to_string();
    match ctl.kind() {
        Kind::Controller(plugin) => plugin.check(args),
        Kind::Livenessprobe => {
            Parsed::Livenessprobe(parse_from(args, FlagSyntax::Go).map_err(text)?).validate()
        }
        Kind::Registrar => {
            Parsed::Registrar(parse_from(args, FlagSyntax::Go).map_err(text)?).validate()
        }
    }
}

/// What runs in the process, validated.
struct Selection {
    controllers: Vec<Box<dyn ControllerCli>>,
    livenessprobe: Option<livenessprobe::flags::Cli>,
    registrar: Option<node_driver_registrar::config::Config>,
    /// The process's HTTP endpoint (`--http-endpoint`), empty for none.
    http_endpoint: String,
    consolidated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AioError {
    #[error(transparent)]
    Http(#[from] sidecar_kit::process::http::HttpError),
    #[error(transparent)]
    Kube(#[from] sidecar_kit::cluster::client::KubeError),
    #[error(transparent)]
    Host(#[from] sidecar_kit::runtime::host::HostError),
    #[error(transparent)]
    Metrics(#[from] sidecar_kit::process::metrics::MetricsError),
    #[error("{0}: {1}")]
    Prepare(&'static str, String),
}

/// Runs `csi-sidecars --controllers=…` (`args` without the program name) until it ends; exits
/// the process on errors: 2 for a command line the routing refuses, otherwise as the single
/// sidecars do.
pub fn main(args: Vec<String>) {
    let plan = match route(&args) {
        Ok(plan) => plan,
        Err(err) => {
            eprintln!("csi-sidecars: {err}\n\n{}", help());
            std::process::exit(2);
        }
    };
    let parsed: Vec<Parsed> = plan
        .controllers
        .into_iter()
        .map(|(ctl, args)| Parsed::parse(ctl, args))
        .collect();
    let Some(first) = parsed.first() else {
        return;
    };
    sidecar_kit::runtime::lifecycle::exit_if_version(first.process(), env!("CARGO_PKG_VERSION"));
    sidecar_kit::runtime::lifecycle::start_logging(first.logging(), "csi-sidecars");
    let process = first.process().clone();
    let mut selection = Selection {
        controllers: Vec::new(),
        livenessprobe: None,
        registrar: None,
        http_endpoint: String::new(),
        consolidated: plan.consolidated,
    };
    for sidecar in parsed {
        if let Err(err) = sidecar.validate() {
            sidecar_kit::runtime::lifecycle::fatal(&format!("{}: {err}", sidecar.name()));
        }
        match sidecar {
            Parsed::Controller(cli) => {
                cli.warn();
                selection.http_endpoint = cli.common().http.http_endpoint.clone();
                selection.controllers.push(cli);
            }
            Parsed::Livenessprobe(cli) => {
                selection.http_endpoint = cli.http.http_endpoint.clone();
                selection.livenessprobe = Some(cli);
            }
            Parsed::Registrar(cli) => {
                selection.http_endpoint = cli.http_endpoint.clone();
                match node::registrar_config(&cli) {
                    Ok(config) => selection.registrar = Some(config),
                    Err(err) => sidecar_kit::runtime::lifecycle::fatal(&err),
                }
            }
        }
    }
    sidecar_kit::runtime::startup::run(&process, |shutdown| async move {
        if selection.controllers.is_empty() {
            node::serve(selection, shutdown).await
        } else {
            serve(selection, shutdown).await
        }
    });
}

/// One host for every controller: the driver greeted once (with the longest of their
/// timeouts), one set of shared watches, one HTTP endpoint.
async fn serve(selection: Selection, shutdown: CancellationToken) -> Result<(), AioError> {
    let Some(first) = selection.controllers.first() else {
        return Ok(());
    };
    let common = first.common();
    let http = HttpPlan::from_flags(&common.http)?;
    let kube_config = sidecar_kit::cluster::client::load_config(&common.kube, KUBECONFIG).await?;
    let mut greeting = first.greeting();
    for controller in &selection.controllers[1..] {
        let other = controller.greeting();
        greeting.probe_timeout = greeting.probe_timeout.max(other.probe_timeout);
        greeting.identity_timeout = greeting.identity_timeout.max(other.identity_timeout);
        greeting.max_log_length = greeting.max_log_length.max(other.max_log_length);
    }
    let Some(host) = Host::start(
        greeting,
        OperationsShape::CSI_SIDECAR,
        WatchHub::shared(),
        &kube_config,
        &shutdown,
    )
    .await?
    else {
        return Ok(());
    };
    let mut names: Vec<&str> = selection.controllers.iter().map(|c| c.name()).collect();
    if selection.livenessprobe.is_some() {
        names.push(LIVENESSPROBE);
    }
    tracing::info!(sidecars = ?names, driver = %host.driver, "running in one process");
    let mut controllers = Vec::with_capacity(selection.controllers.len() + 1);
    for controller in &selection.controllers {
        controllers.push(
            controller
                .prepare(&host, &kube_config)
                .await
                .map_err(|e| AioError::Prepare(controller.name(), e))?,
        );
    }
    if selection.consolidated {
        if controllers.iter().any(|c| c.election.is_some()) {
            controllers = host::consolidate(
                controllers,
                &sidecar_kit::runtime::consolidated::lock_name(&host.driver),
            );
        } else {
            tracing::warn!("--{CONSOLIDATED_FLAG} has no effect without --leader-election");
        }
    }
    let mut checks = Vec::new();
    if let Some(cli) = selection.livenessprobe {
        if matches!(http, HttpPlan::Full(_)) {
            checks.push((LIVENESSPROBE, node::liveness_check(&cli, &host.metrics)?.1));
        } else {
            controllers.push(node::liveness_on_own_port(cli));
        }
    }
    let hooks: Vec<_> = selection.controllers.iter().map(|c| c.routes()).collect();
    host::run(
        &host,
        &http,
        &common.http.metrics_path,
        move |routes| {
            hooks
                .into_iter()
                .fold(routes.health_checks(checks), |routes, add| add(routes))
        },
        controllers,
        shutdown,
    )
    .await?;
    Ok(())
}
