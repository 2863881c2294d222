//! All in one (KEP-4958's layout): `csi-sidecars --controllers=provisioner,attacher,…` runs the
//! selected controllers in one process. Flags shared by several controllers are given once; a
//! flag prefixed with a controller's name (`--attacher-timeout=30s`) is that controller's only
//! and wins over the shared one. Each controller keeps its own defaults; its command line is
//! routed here and parsed by the controller's own parser, so its checks and messages are the
//! single sidecar's.

use std::collections::BTreeSet;
use std::ffi::OsString;

use std::sync::Arc;

use clap::CommandFactory;
use livenessprobe::probe::Prober;
use node_driver_registrar::run::SharedHealth;
use sidecar_kit::host::{self, Controller, Host};
use sidecar_kit::http::{self, Check, HttpPlan, HttpServer, Routes};
use sidecar_kit::watches::WatchHub;
use tokio_util::sync::CancellationToken;

/// What `--controllers` selects from, in KEP-4958's names: the four controllers of the
/// controller pod, and the node pod's registrar; the livenessprobe joins either.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ctl {
    Provisioner,
    Attacher,
    Resizer,
    Snapshotter,
    Livenessprobe,
    Registrar,
}

impl Ctl {
    /// The controllers, which `*` selects.
    pub const CONTROLLERS: [Ctl; 4] = [
        Ctl::Provisioner,
        Ctl::Attacher,
        Ctl::Resizer,
        Ctl::Snapshotter,
    ];

    pub const ALL: [Ctl; 6] = [
        Ctl::Provisioner,
        Ctl::Attacher,
        Ctl::Resizer,
        Ctl::Snapshotter,
        Ctl::Livenessprobe,
        Ctl::Registrar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Ctl::Provisioner => "provisioner",
            Ctl::Attacher => "attacher",
            Ctl::Resizer => "resizer",
            Ctl::Snapshotter => "snapshotter",
            Ctl::Livenessprobe => "livenessprobe",
            Ctl::Registrar => "node-driver-registrar",
        }
    }

    /// The program name its parser sees (its single binary's).
    pub fn binary(self) -> &'static str {
        match self {
            Ctl::Provisioner => "csi-provisioner",
            Ctl::Attacher => "csi-attacher",
            Ctl::Resizer => "csi-resizer",
            Ctl::Snapshotter => "csi-snapshotter",
            Ctl::Livenessprobe => "livenessprobe",
            Ctl::Registrar => "csi-node-driver-registrar",
        }
    }

    pub fn command(self) -> clap::Command {
        match self {
            Ctl::Provisioner => external_provisioner::flags::Cli::command(),
            Ctl::Attacher => external_attacher::flags::Cli::command(),
            Ctl::Resizer => external_resizer::flags::Cli::command(),
            Ctl::Snapshotter => external_snapshotter::flags::Cli::command(),
            Ctl::Livenessprobe => livenessprobe::flags::Cli::command(),
            Ctl::Registrar => node_driver_registrar::config::Cli::command(),
        }
    }

    /// Parses and checks a command line as the single sidecar does; the message on failure.
    pub fn check(self, args: &[OsString]) -> Result<(), String> {
        Parsed::try_parse(self, args.to_vec())?.validate()
    }

    fn named(name: &str) -> Option<Ctl> {
        Ctl::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Settings of the process as a whole: one driver, one API server, one HTTP endpoint, one log.
/// Given once, never per controller.
const PROCESS_FLAGS: [&str; 11] = [
    "csi-address",
    "kubeconfig",
    "http-endpoint",
    "metrics-address",
    "metrics-path",
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "automaxprocs",
    "version",
];

/// What `--controllers` and the flags ask for: each selected controller's command line.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub controllers: Vec<(Ctl, Vec<OsString>)>,
    /// `--leader-election-consolidated`: one Lease for the process.
    pub consolidated: bool,
}

/// The all-in-one process's own flag: one Lease for every controller, KEP-4958's.
const CONSOLIDATED_FLAG: &str = "leader-election-consolidated";

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("--controllers is required: a comma-separated list of {0}, or *")]
    NoControllers(String),
    #[error("--controllers: unknown controller {0:?} (known: {1})")]
    UnknownController(String, String),
    #[error(
        "--controllers: node-driver-registrar runs on every node and {0} in the controller pod; \
         run them in separate processes"
    )]
    NodeWithController(String),
    #[error("flag provided but not defined by the selected controllers: --{0}")]
    UnknownFlag(String),
    #[error("flag needs an argument: --{0}")]
    MissingValue(String),
    #[error("--{0}: {1} is one for the whole process; give --{1} without a prefix")]
    ProcessWide(String, String),
    #[error("--feature-gates: {0} is not a gate of the selected controllers")]
    UnknownGate(String),
    #[error("--{0}: {1:?} is not a boolean")]
    NotBoolean(String, String),
}

fn known() -> String {
    Ctl::ALL.map(Ctl::name).join(", ")
}

fn parse_controllers(list: &str) -> Result<Vec<Ctl>, RouteError> {
    let mut selected = BTreeSet::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "*" | "all" => selected.extend(Ctl::CONTROLLERS),
            name => match Ctl::named(name) {
                Some(ctl) => {
                    selected.insert(ctl);
                }
                None => return Err(RouteError::UnknownController(name.to_string(), known())),
            },
        }
    }
    if selected.is_empty() {
        return Err(RouteError::NoControllers(known()));
    }
    if selected.contains(&Ctl::Registrar)
        && let Some(controller) = selected.iter().find(|c| Ctl::CONTROLLERS.contains(c))
    {
        return Err(RouteError::NodeWithController(
            controller.name().to_string(),
        ));
    }
    Ok(selected.into_iter().collect())
}

/// Whether the controller's flag `name` takes the next word as its value when written without
/// `=` (booleans are declared with `require_equals`).
fn takes_value(command: &clap::Command, name: &str) -> Option<bool> {
    command
        .get_arguments()
        .find(|a| a.get_long() == Some(name))
        .map(|a| a.get_action().takes_values() && !a.is_require_equals_set())
}

/// Routes the command line (without the program name) to the selected controllers.
pub fn route(args: &[String]) -> Result<Plan, RouteError> {
    // Flags as (name, value), single-dash (Go) spellings accepted.
    let commands: Vec<(Ctl, clap::Command)> = Ctl::ALL.map(|c| (c, c.command())).into();
    let mut flags: Vec<(String, Option<String>)> = Vec::new();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let Some(text) = word.strip_prefix("--").or_else(|| word.strip_prefix('-')) else {
            return Err(RouteError::UnknownFlag(word.clone()));
        };
        let (name, value) = match text.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (text.to_string(), None),
        };
        let value = match value {
            Some(value) => Some(value),
            None if name == "controllers" => Some(
                words
                    .next()
                    .cloned()
                    .ok_or_else(|| RouteError::MissingValue(name.clone()))?,
            ),
            None => {
                // The flag's own declaration (of its controller, or of any that has it).
                let plain = Ctl::ALL
                    .into_iter()
                    .find_map(|c| name.strip_prefix(&format!("{}-", c.name())))
                    .filter(|rest| {
                        commands
                            .iter()
                            .any(|(_, cmd)| takes_value(cmd, rest).is_some())
                    })
                    .unwrap_or(&name);
                let takes = commands.iter().find_map(|(_, cmd)| takes_value(cmd, plain));
                if takes == Some(true) {
                    Some(
                        words
                            .next()
                            .cloned()
                            .ok_or_else(|| RouteError::MissingValue(name.clone()))?,
                    )
                } else {
                    None
                }
            }
        };
        flags.push((name, value));
    }
    let list = flags
        .iter()
        .rev()
        .find(|(name, _)| name == "controllers")
        .and_then(|(_, value)| value.clone())
        .ok_or_else(|| RouteError::NoControllers(known()))?;
    let selected = parse_controllers(&list)?;
    let knows = |ctl: Ctl, name: &str| {
        commands
            .iter()
            .any(|(c, cmd)| *c == ctl && cmd.get_arguments().any(|a| a.get_long() == Some(name)))
    };
    let render = |name: &str, value: &Option<String>| -> OsString {
        match value {
            Some(value) => format!("--{name}={value}").into(),
            None => format!("--{name}").into(),
        }
    };
    let mut consolidated = false;
    let mut shared: Vec<Vec<OsString>> = vec![Vec::new(); selected.len()];
    let mut own: Vec<Vec<OsString>> = vec![Vec::new(); selected.len()];
    for (name, value) in &flags {
        if name == "controllers" {
            continue;
        }
        if name == CONSOLIDATED_FLAG {
            consolidated = match value {
                None => true,
                Some(text) => sidecar_kit::flags::parse_go_bool(text)
                    .map_err(|_| RouteError::NotBoolean(name.clone(), text.clone()))?,
            };
            continue;
        }
        // A prefixed flag: one controller's setting.
        let prefixed = selected.iter().enumerate().find_map(|(i, ctl)| {
            name.strip_prefix(&format!("{}-", ctl.name()))
                .filter(|rest| knows(*ctl, rest))
                .map(|rest| (i, rest))
        });
        if let Some((i, rest)) = prefixed {
            if PROCESS_FLAGS.contains(&rest) {
                return Err(RouteError::ProcessWide(name.clone(), rest.to_string()));
            }
            own[i].push(render(rest, value));
            continue;
        }
        if name == "feature-gates" {
            route_gates(&selected, value.as_deref().unwrap_or(""), &mut shared)?;
            continue;
        }
        let mut taken = false;
        for (i, ctl) in selected.iter().enumerate() {
            if knows(*ctl, name) {
                shared[i].push(render(name, value));
                taken = true;
            }
        }
        if !taken {
            return Err(RouteError::UnknownFlag(name.clone()));
        }
    }
    let controllers = selected
        .into_iter()
        .zip(shared.into_iter().zip(own))
        .map(|(ctl, (shared, own))| {
            let mut args = vec![OsString::from(ctl.binary())];
            args.extend(shared);
            // Later occurrences win, as in the single sidecars.
            args.extend(own);
            (ctl, args)
        })
        .collect();
    Ok(Plan {
        controllers,
        consolidated,
    })
}

/// A shared `--feature-gates`: each controller gets the gates it knows (its own parser decides);
/// a gate no selected controller knows is refused.
fn route_gates(
    selected: &[Ctl],
    text: &str,
    shared: &mut [Vec<OsString>],
) -> Result<(), RouteError> {
    let mut per: Vec<Vec<&str>> = vec![Vec::new(); selected.len()];
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let gate = pair.split_once('=').map_or(pair, |(g, _)| g.trim());
        let mut known = false;
        for (i, ctl) in selected.iter().enumerate() {
            let probe = [
                OsString::from(ctl.binary()),
                OsString::from(format!("--feature-gates={pair}")),
            ];
            if ctl.check(&probe).is_ok() {
                per[i].push(pair);
                known = true;
            }
        }
        if !known {
            return Err(RouteError::UnknownGate(gate.to_string()));
        }
    }
    for (i, gates) in per.into_iter().enumerate() {
        if !gates.is_empty() {
            shared[i].push(format!("--feature-gates={}", gates.join(",")).into());
        }
    }
    Ok(())
}

/// `--help` in the all-in-one form: the flags shared by the selectable controllers, then each
/// controller's own with its prefix.
pub fn help() -> String {
    let commands: Vec<(Ctl, clap::Command)> = Ctl::ALL.map(|c| (c, c.command())).into();
    let longs = |cmd: &clap::Command| -> BTreeSet<String> {
        cmd.get_arguments()
            .filter_map(|a| a.get_long().map(String::from))
            .filter(|l| l != "help")
            .collect()
    };
    let all: Vec<BTreeSet<String>> = commands.iter().map(|(_, c)| longs(c)).collect();
    let mut text = String::from(
        "Usage: csi-sidecars --controllers=LIST [flags]\n\n\
         Runs the listed sidecars in one process. In the controller pod: provisioner,\n\
         attacher, resizer, snapshotter (* for these four) and livenessprobe; on nodes:\n\
         node-driver-registrar and livenessprobe. One driver connection, one set of watches,\n\
         each controller under its own upstream Lease, one HTTP endpoint (--http-endpoint):\n\
         metrics, /healthz/leader-election, /healthz/livenessprobe (the driver's Probe),\n\
         /healthz/node-driver-registrar (the registration socket) and /healthz (both).\n\
         A flag shared by several sidecars is given once; --<sidecar>-<flag> sets it for that\n\
         sidecar only and wins. Each keeps its own defaults (the timeouts differ).\n\
         --leader-election-consolidated: one Lease for the process instead of one per\n\
         controller; the single sidecars' Leases are taken over when it is first won.\n\n\
         Flags of every controller (process-wide ones cannot be prefixed):\n",
    );
    let controllers = &all[..Ctl::CONTROLLERS.len()];
    let common: BTreeSet<&String> = controllers[0]
        .iter()
        .filter(|f| controllers.iter().all(|set| set.contains(*f)))
        .collect();
    for flag in &common {
        text.push_str(&format!("  --{flag}\n"));
    }
    for ((ctl, _), flags) in commands.iter().zip(&all) {
        text.push_str(&format!(
            "\n{} (see `csi-sidecars {} --help`; shared ones also as --{}-FLAG):\n",
            ctl.name(),
            ctl.name(),
            ctl.name()
        ));
        for flag in flags.iter().filter(|f| !common.contains(f)) {
            text.push_str(&format!("  --{}-{flag}\n", ctl.name()));
        }
    }
    text
}

/// A selected sidecar's command line, parsed by its own parser.
enum Parsed {
    Controller(Box<ControllerCli>),
    Livenessprobe(livenessprobe::flags::Cli),
    Registrar(node_driver_registrar::config::Cli),
}

/// A selected controller's command line.
enum ControllerCli {
    Provisioner(external_provisioner::flags::Cli),
    Attacher(external_attacher::flags::Cli),
    Resizer(external_resizer::flags::Cli),
    Snapshotter(external_snapshotter::flags::Cli),
}

impl Parsed {
    fn try_parse(ctl: Ctl, args: Vec<OsString>) -> Result<Self, String> {
        use sidecar_kit::flags::{FlagSyntax, parse_from};
        let go = FlagSyntax::Go;
        let text = |e: clap::Error| e.to_string();
        let controller = match ctl {
            Ctl::Provisioner => {
                ControllerCli::Provisioner(parse_from(args, FlagSyntax::Gnu).map_err(text)?)
            }
            Ctl::Attacher => ControllerCli::Attacher(parse_from(args, go).map_err(text)?),
            Ctl::Resizer => ControllerCli::Resizer(parse_from(args, go).map_err(text)?),
            Ctl::Snapshotter => ControllerCli::Snapshotter(parse_from(args, go).map_err(text)?),
            Ctl::Livenessprobe => {
                return Ok(Parsed::Livenessprobe(parse_from(args, go).map_err(text)?));
            }
            Ctl::Registrar => return Ok(Parsed::Registrar(parse_from(args, go).map_err(text)?)),
        };
        Ok(Parsed::Controller(Box::new(controller)))
    }

    /// Parses as the single sidecar does, printing help or errors and exiting as it does.
    fn parse(ctl: Ctl, args: Vec<OsString>) -> Self {
        use sidecar_kit::flags::{FlagSyntax, parse_args};
        let go = FlagSyntax::Go;
        let controller = match ctl {
            Ctl::Provisioner => ControllerCli::Provisioner(parse_args(args, FlagSyntax::Gnu)),
            Ctl::Attacher => ControllerCli::Attacher(parse_args(args, go)),
            Ctl::Resizer => ControllerCli::Resizer(parse_args(args, go)),
            Ctl::Snapshotter => ControllerCli::Snapshotter(parse_args(args, go)),
            Ctl::Livenessprobe => return Parsed::Livenessprobe(parse_args(args, go)),
            Ctl::Registrar => return Parsed::Registrar(parse_args(args, go)),
        };
        Parsed::Controller(Box::new(controller))
    }

    fn process(&self) -> &sidecar_kit::flags::ProcessFlags {
        match self {
            Parsed::Controller(cli) => &cli.common().process,
            Parsed::Livenessprobe(cli) => &cli.process,
            Parsed::Registrar(cli) => &cli.process,
        }
    }

    fn logging(&self) -> &sidecar_kit::flags::LoggingFlags {
        match self {
            Parsed::Controller(cli) => &cli.common().logging,
            Parsed::Livenessprobe(cli) => &cli.logging,
            Parsed::Registrar(cli) => &cli.logging,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Parsed::Controller(cli) => cli.name(),
            Parsed::Livenessprobe(_) => Ctl::Livenessprobe.name(),
            Parsed::Registrar(_) => Ctl::Registrar.name(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Parsed::Controller(cli) => cli.validate(),
            Parsed::Livenessprobe(cli) => livenessprobe::flags::ServePlan::from_cli(cli)
                .map(drop)
                .map_err(|e| e.to_string()),
            Parsed::Registrar(cli) => registrar_config(cli).map(drop),
        }
    }
}

/// The registrar's configuration, with its warnings logged; its exec-probe mode has no place
/// in a process that runs.
fn registrar_config(
    cli: &node_driver_registrar::config::Cli,
) -> Result<node_driver_registrar::config::Config, String> {
    use node_driver_registrar::config::{MODE_KUBELET_REGISTRATION_PROBE, Plan};
    match node_driver_registrar::config::plan(cli, sidecar_kit::endpoint::Platform::current()) {
        Ok((Plan::Run(config), warnings)) => {
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            Ok(config)
        }
        Ok((Plan::Probe, _)) => Err(format!(
            "--mode={MODE_KUBELET_REGISTRATION_PROBE} exits at once and cannot run beside \
             other sidecars; probe /healthz/node-driver-registrar instead"
        )),
        Err(err) => Err(err.to_string()),
    }
}

impl ControllerCli {
    fn common(&self) -> &sidecar_kit::flags::CommonFlags {
        match self {
            ControllerCli::Provisioner(cli) => &cli.common,
            ControllerCli::Attacher(cli) => &cli.common,
            ControllerCli::Resizer(cli) => &cli.common,
            ControllerCli::Snapshotter(cli) => &cli.common,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            ControllerCli::Provisioner(_) => Ctl::Provisioner.name(),
            ControllerCli::Attacher(_) => Ctl::Attacher.name(),
            ControllerCli::Resizer(_) => Ctl::Resizer.name(),
            ControllerCli::Snapshotter(_) => Ctl::Snapshotter.name(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            ControllerCli::Provisioner(cli) => cli.validate().map_err(|e| e.to_string()),
            ControllerCli::Attacher(cli) => cli.validate().map_err(|e| e.to_string()),
            ControllerCli::Resizer(cli) => cli.validate().map_err(|e| e.to_string()),
            ControllerCli::Snapshotter(cli) => cli.validate().map_err(|e| e.to_string()),
        }
    }

    fn greeting(&self) -> sidecar_kit::startup::Greeting<'_> {
        match self {
            ControllerCli::Provisioner(cli) => external_provisioner::app::greeting(cli),
            ControllerCli::Attacher(cli) => external_attacher::app::greeting(cli),
            ControllerCli::Resizer(cli) => external_resizer::app::greeting(cli),
            ControllerCli::Snapshotter(cli) => external_snapshotter::app::greeting(cli),
        }
    }

    async fn prepare(&self, host: &Host, kube_config: &kube::Config) -> Result<Controller, String> {
        match self {
            ControllerCli::Provisioner(cli) => {
                external_provisioner::app::prepare(cli, host, kube_config)
                    .await
                    .map_err(|e| e.to_string())
            }
            ControllerCli::Attacher(cli) => external_attacher::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
            ControllerCli::Resizer(cli) => external_resizer::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
            ControllerCli::Snapshotter(cli) => {
                external_snapshotter::app::prepare(cli, host, kube_config)
                    .await
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// What runs in the process, validated.
struct Selection {
    controllers: Vec<ControllerCli>,
    livenessprobe: Option<livenessprobe::flags::Cli>,
    registrar: Option<node_driver_registrar::config::Config>,
    /// The process's HTTP endpoint (`--http-endpoint`), empty for none.
    http_endpoint: String,
    consolidated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum AioError {
    #[error(transparent)]
    Http(#[from] sidecar_kit::http::HttpError),
    #[error(transparent)]
    Kube(#[from] sidecar_kit::kube::KubeError),
    #[error(transparent)]
    Host(#[from] sidecar_kit::host::HostError),
    #[error(transparent)]
    Metrics(#[from] sidecar_kit::metrics::MetricsError),
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
    sidecar_kit::lifecycle::exit_if_version(first.process(), env!("CARGO_PKG_VERSION"));
    sidecar_kit::logging::init(first.logging());
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
            sidecar_kit::lifecycle::fatal(&format!("{}: {err}", sidecar.name()));
        }
        match sidecar {
            Parsed::Controller(cli) => {
                selection.http_endpoint = cli.common().http.http_endpoint.clone();
                selection.controllers.push(*cli);
            }
            Parsed::Livenessprobe(cli) => {
                selection.http_endpoint = cli.http.http_endpoint.clone();
                selection.livenessprobe = Some(cli);
            }
            Parsed::Registrar(cli) => {
                selection.http_endpoint = cli.http_endpoint.clone();
                match registrar_config(&cli) {
                    Ok(config) => selection.registrar = Some(config),
                    Err(err) => sidecar_kit::lifecycle::fatal(&err),
                }
            }
        }
    }
    sidecar_kit::startup::run(&process, |shutdown| async move {
        if selection.controllers.is_empty() {
            serve_node(selection, shutdown).await
        } else {
            serve(selection, shutdown).await
        }
    });
}

/// The livenessprobe's check on the process's endpoint: the driver's Probe over a connection of
/// its own, which notices a replaced socket.
fn liveness_check(
    cli: &livenessprobe::flags::Cli,
    metrics: &sidecar_kit::metrics::CsiMetrics,
) -> Result<(Arc<Prober>, Check), AioError> {
    let prober = Arc::new(
        Prober::new(&cli.csi.csi_address, cli.probe_timeout, metrics.clone())
            .map_err(|e| AioError::Prepare(Ctl::Livenessprobe.name(), e.to_string()))?,
    );
    let checker = prober.clone();
    let check = http::check(move || {
        let checker = checker.clone();
        async move { checker.check().await.reply() }
    });
    Ok((prober, check))
}

/// The livenessprobe on its own port (`--health-port`), as the single sidecar, for a process
/// without `--http-endpoint`.
fn liveness_on_own_port(cli: livenessprobe::flags::Cli) -> Controller {
    Controller::new(Ctl::Livenessprobe.name(), None, move |token| async move {
        if let Err(err) = livenessprobe::server::run(&cli, token).await {
            tracing::error!(error = %err, "livenessprobe failed");
        }
    })
}

/// One host for every controller: the driver greeted once (with the longest of their
/// timeouts), one set of shared watches, one HTTP endpoint.
async fn serve(selection: Selection, shutdown: CancellationToken) -> Result<(), AioError> {
    let Some(first) = selection.controllers.first() else {
        return Ok(());
    };
    let common = first.common();
    let http = HttpPlan::from_flags(&common.http)?;
    let kube_config =
        sidecar_kit::kube::load_config(&common.kube, sidecar_kit::kube::KubeconfigRule::FlagFirst)
            .await?;
    let mut greeting = first.greeting();
    for controller in &selection.controllers[1..] {
        let other = controller.greeting();
        greeting.probe_timeout = greeting.probe_timeout.max(other.probe_timeout);
        greeting.identity_timeout = greeting.identity_timeout.max(other.identity_timeout);
        greeting.max_log_length = greeting.max_log_length.max(other.max_log_length);
    }
    let Some(host) = Host::start(greeting, WatchHub::shared(), &kube_config, &shutdown).await?
    else {
        return Ok(());
    };
    let mut names: Vec<&str> = selection.controllers.iter().map(|c| c.name()).collect();
    if selection.livenessprobe.is_some() {
        names.push(Ctl::Livenessprobe.name());
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
                sidecar_kit::consolidated::lease_name(&host.driver),
            );
        } else {
            tracing::warn!("--{CONSOLIDATED_FLAG} has no effect without --leader-election");
        }
    }
    let mut checks = Vec::new();
    if let Some(cli) = selection.livenessprobe {
        if matches!(http, HttpPlan::Full(_)) {
            checks.push((
                Ctl::Livenessprobe.name(),
                liveness_check(&cli, &host.metrics)?.1,
            ));
        } else {
            controllers.push(liveness_on_own_port(cli));
        }
    }
    let pprof = selection.controllers.iter().find_map(|c| match c {
        ControllerCli::Provisioner(cli) => Some(external_provisioner::app::pprof_routes(cli)),
        _ => None,
    });
    host::run(
        &host,
        &http,
        &common.http.metrics_path,
        move |routes| {
            let routes = routes.health_checks(checks);
            match pprof {
                Some(add) => add(routes),
                None => routes,
            }
        },
        controllers,
        shutdown,
    )
    .await?;
    Ok(())
}

/// The node's sidecars: the registrar and the livenessprobe, each waiting for the driver on its
/// own (a driver restart is not theirs to exit for), both checks on `--http-endpoint`; without
/// it each serves as its single sidecar does.
async fn serve_node(selection: Selection, shutdown: CancellationToken) -> Result<(), AioError> {
    let shared = !selection.http_endpoint.is_empty();
    let metrics = sidecar_kit::metrics::CsiMetrics::new()?;
    let mut checks = Vec::new();
    let mut parts = Vec::new();
    if let Some(mut config) = selection.registrar {
        let health = shared.then(SharedHealth::default);
        if let Some(health) = &health {
            config.http_endpoint = None;
            let health = health.clone();
            checks.push((
                Ctl::Registrar.name(),
                http::check(move || {
                    let health = health.clone();
                    async move { health.reply().await }
                }),
            ));
        }
        parts.push(Controller::new(
            Ctl::Registrar.name(),
            None,
            move |token| async move {
                match node_driver_registrar::run::run(config, health, token).await {
                    Ok(exit) => {
                        if let Some(message) = exit.failure() {
                            tracing::error!("{message}");
                        }
                    }
                    Err(err) => tracing::error!(error = %err, "node-driver-registrar failed"),
                }
            },
        ));
    }
    let mut metrics_path = None;
    if let Some(cli) = selection.livenessprobe {
        if shared {
            let (prober, check) = liveness_check(&cli, &metrics)?;
            checks.push((Ctl::Livenessprobe.name(), check));
            metrics_path = Some(cli.http.metrics_path.clone());
            let metrics = metrics.clone();
            parts.push(Controller::new(
                Ctl::Livenessprobe.name(),
                None,
                move |token| async move {
                    match livenessprobe::server::learn_driver(&prober, &metrics, &token).await {
                        Ok(Some(_)) => token.cancelled().await,
                        Ok(None) => {}
                        Err(err) => tracing::error!(error = %err, "livenessprobe failed"),
                    }
                },
            ));
        } else {
            parts.push(liveness_on_own_port(cli));
        }
    }
    if shared {
        let mut routes = Routes::new().health_checks(checks);
        if let Some(path) = &metrics_path {
            routes = routes.metrics(path, metrics);
        }
        HttpServer::spawn(&selection.http_endpoint, routes, shutdown.clone()).await?;
    }
    host::supervise(parts, shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(args: &[&str]) -> Result<Plan, RouteError> {
        route(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    fn args_of(plan: &Plan, ctl: Ctl) -> Vec<String> {
        plan.controllers
            .iter()
            .find(|(c, _)| *c == ctl)
            .map(|(_, a)| a.iter().map(|a| a.to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn shared_flags_go_to_every_controller_that_has_them_and_prefixed_ones_win() {
        let p = plan(&[
            "--controllers=attacher,provisioner",
            "--csi-address=/csi/csi.sock",
            "--leader-election",
            "--timeout",
            "30s",
            "--attacher-timeout=45s",
            "--attacher-worker-threads=100",
            "--extra-create-metadata",
        ])
        .unwrap();
        assert_eq!(
            args_of(&p, Ctl::Attacher),
            [
                "csi-attacher",
                "--csi-address=/csi/csi.sock",
                "--leader-election",
                "--timeout=30s",
                "--timeout=45s",
                "--worker-threads=100"
            ]
        );
        assert_eq!(
            args_of(&p, Ctl::Provisioner),
            [
                "csi-provisioner",
                "--csi-address=/csi/csi.sock",
                "--leader-election",
                "--timeout=30s",
                "--extra-create-metadata"
            ]
        );
        for (ctl, args) in &p.controllers {
            assert_eq!(ctl.check(args), Ok(()), "{args:?}");
        }
    }

    #[test]
    fn all_is_every_controller_and_each_keeps_its_defaults() {
        let p = plan(&["--controllers=*"]).unwrap();
        assert_eq!(p.controllers.len(), 4);
        let p = plan(&["--controllers", "snapshotter,resizer"]).unwrap();
        assert_eq!(
            p.controllers.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [Ctl::Resizer, Ctl::Snapshotter]
        );
        assert_eq!(args_of(&p, Ctl::Snapshotter), ["csi-snapshotter"]);
    }

    #[test]
    fn feature_gates_are_split_by_who_knows_them() {
        let p = plan(&[
            "--controllers=provisioner,snapshotter",
            "--feature-gates=Topology=true,CSIVolumeGroupSnapshot=true",
        ])
        .unwrap();
        assert_eq!(
            args_of(&p, Ctl::Provisioner),
            ["csi-provisioner", "--feature-gates=Topology=true"]
        );
        assert_eq!(
            args_of(&p, Ctl::Snapshotter),
            [
                "csi-snapshotter",
                "--feature-gates=CSIVolumeGroupSnapshot=true"
            ]
        );
        assert_eq!(
            plan(&["--controllers=attacher", "--feature-gates=Nope=true"]),
            Err(RouteError::UnknownGate("Nope".into()))
        );
    }

    #[test]
    fn bad_command_lines_are_refused_clearly() {
        assert!(matches!(
            plan(&["--timeout=1s"]),
            Err(RouteError::NoControllers(_))
        ));
        assert!(matches!(
            plan(&["--controllers=health-monitor"]),
            Err(RouteError::UnknownController(..))
        ));
        assert_eq!(
            plan(&["--controllers=provisioner,node-driver-registrar"]),
            Err(RouteError::NodeWithController("provisioner".into()))
        );
        assert_eq!(
            plan(&["--controllers=attacher", "--volume-name-prefix=x"]),
            Err(RouteError::UnknownFlag("volume-name-prefix".into())),
            "a provisioner flag without the provisioner"
        );
        assert_eq!(
            plan(&["--controllers=attacher", "--attacher-http-endpoint=:8080"]),
            Err(RouteError::ProcessWide(
                "attacher-http-endpoint".into(),
                "http-endpoint".into()
            ))
        );
        assert_eq!(
            plan(&["--controllers=attacher", "--timeout"]),
            Err(RouteError::MissingValue("timeout".into()))
        );
    }

    #[test]
    fn node_sidecars_share_the_process_flags_and_keep_their_own() {
        let p = plan(&[
            "--controllers=node-driver-registrar,livenessprobe",
            "--csi-address=/csi/csi.sock",
            "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
            "--http-endpoint=:9809",
            "--livenessprobe-probe-timeout=5s",
            "--node-driver-registrar-timeout=2s",
        ])
        .unwrap();
        assert_eq!(
            args_of(&p, Ctl::Registrar),
            [
                "csi-node-driver-registrar",
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
                "--http-endpoint=:9809",
                "--timeout=2s"
            ]
        );
        assert_eq!(
            args_of(&p, Ctl::Livenessprobe),
            [
                "livenessprobe",
                "--csi-address=/csi/csi.sock",
                "--http-endpoint=:9809",
                "--probe-timeout=5s"
            ]
        );
        for (ctl, args) in &p.controllers {
            assert_eq!(ctl.check(args), Ok(()), "{args:?}");
        }
        let probe_mode = [
            OsString::from("csi-node-driver-registrar"),
            OsString::from("--kubelet-registration-path=/x/csi.sock"),
            OsString::from("--mode=kubelet-registration-probe"),
        ];
        assert!(Ctl::Registrar.check(&probe_mode).is_err());
        let p = plan(&["--controllers=*,livenessprobe"]).unwrap();
        assert_eq!(p.controllers.len(), 5);
    }

    #[test]
    fn the_consolidated_lease_is_the_process_s_own_flag() {
        let p = plan(&["--controllers=attacher", "--leader-election-consolidated"]).unwrap();
        assert!(p.consolidated);
        assert_eq!(args_of(&p, Ctl::Attacher), ["csi-attacher"]);
        let p = plan(&[
            "--controllers=attacher",
            "--leader-election-consolidated=false",
        ])
        .unwrap();
        assert!(!p.consolidated);
        assert!(matches!(
            plan(&[
                "--controllers=attacher",
                "--leader-election-consolidated=maybe"
            ]),
            Err(RouteError::NotBoolean(..))
        ));
    }

    #[test]
    fn help_groups_the_flags() {
        let text = help();
        assert!(text.contains("  --csi-address\n"));
        assert!(text.contains("  --provisioner-volume-name-prefix\n"));
        assert!(text.contains("  --snapshotter-snapshot-name-prefix\n"));
        assert!(text.contains("  --livenessprobe-probe-timeout\n"));
        assert!(text.contains("  --node-driver-registrar-kubelet-registration-path\n"));
    }
}
