//! All in one (KEP-4958's layout): `csi-sidecars --controllers=provisioner,attacher,…` runs the
//! selected controllers in one process. Flags shared by several controllers are given once; a
//! flag prefixed with a controller's name (`--attacher-timeout=30s`) is that controller's only
//! and wins over the shared one. Each controller keeps its own defaults; its command line is
//! routed here and parsed by the controller's own parser, so its checks and messages are the
//! single sidecar's.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::CommandFactory;
use sidecar_kit::host::{self, Controller, Host};
use sidecar_kit::http::HttpPlan;
use sidecar_kit::watches::WatchHub;
use tokio_util::sync::CancellationToken;

/// The controllers `--controllers` selects from, in KEP-4958's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ctl {
    Provisioner,
    Attacher,
    Resizer,
    Snapshotter,
}

impl Ctl {
    pub const ALL: [Ctl; 4] = [
        Ctl::Provisioner,
        Ctl::Attacher,
        Ctl::Resizer,
        Ctl::Snapshotter,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Ctl::Provisioner => "provisioner",
            Ctl::Attacher => "attacher",
            Ctl::Resizer => "resizer",
            Ctl::Snapshotter => "snapshotter",
        }
    }

    /// The program name its parser sees (its single binary's).
    pub fn binary(self) -> &'static str {
        match self {
            Ctl::Provisioner => "csi-provisioner",
            Ctl::Attacher => "csi-attacher",
            Ctl::Resizer => "csi-resizer",
            Ctl::Snapshotter => "csi-snapshotter",
        }
    }

    pub fn command(self) -> clap::Command {
        match self {
            Ctl::Provisioner => external_provisioner::flags::Cli::command(),
            Ctl::Attacher => external_attacher::flags::Cli::command(),
            Ctl::Resizer => external_resizer::flags::Cli::command(),
            Ctl::Snapshotter => external_snapshotter::flags::Cli::command(),
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
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("--controllers is required: a comma-separated list of {0}, or *")]
    NoControllers(String),
    #[error("--controllers: unknown controller {0:?} (known: {1})")]
    UnknownController(String, String),
    #[error(
        "--controllers: {0} runs beside the driver on each node; run it as `csi-sidecars {0} …`"
    )]
    NodeSidecar(String),
    #[error("flag provided but not defined by the selected controllers: --{0}")]
    UnknownFlag(String),
    #[error("flag needs an argument: --{0}")]
    MissingValue(String),
    #[error("--{0}: {1} is one for the whole process; give --{1} without a prefix")]
    ProcessWide(String, String),
    #[error("--feature-gates: {0} is not a gate of the selected controllers")]
    UnknownGate(String),
}

fn known() -> String {
    Ctl::ALL.map(Ctl::name).join(", ")
}

fn parse_controllers(list: &str) -> Result<Vec<Ctl>, RouteError> {
    let mut selected = BTreeSet::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "*" | "all" => selected.extend(Ctl::ALL),
            "node-driver-registrar" | "registrar" | "livenessprobe" => {
                return Err(RouteError::NodeSidecar(name.to_string()));
            }
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
    let mut shared: Vec<Vec<OsString>> = vec![Vec::new(); selected.len()];
    let mut own: Vec<Vec<OsString>> = vec![Vec::new(); selected.len()];
    for (name, value) in &flags {
        if name == "controllers" {
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
    Ok(Plan { controllers })
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
         Runs the listed controllers (provisioner, attacher, resizer, snapshotter; * for all) in\n\
         one process: one driver connection, one set of watches, one HTTP endpoint, each\n\
         controller under its own upstream Lease. A flag shared by several controllers is given\n\
         once; --<controller>-<flag> sets it for that controller only and wins. Each\n\
         controller keeps its own defaults (the timeouts differ).\n\n\
         Flags of every controller (process-wide ones cannot be prefixed):\n",
    );
    let common: BTreeSet<&String> = all[0]
        .iter()
        .filter(|f| all.iter().all(|set| set.contains(*f)))
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

/// A selected controller's command line, parsed by its own parser.
enum Parsed {
    Provisioner(external_provisioner::flags::Cli),
    Attacher(external_attacher::flags::Cli),
    Resizer(external_resizer::flags::Cli),
    Snapshotter(external_snapshotter::flags::Cli),
}

impl Parsed {
    fn try_parse(ctl: Ctl, args: Vec<OsString>) -> Result<Self, String> {
        use sidecar_kit::flags::{FlagSyntax, parse_from};
        let parsed = match ctl {
            Ctl::Provisioner => {
                Parsed::Provisioner(parse_from(args, FlagSyntax::Gnu).map_err(|e| e.to_string())?)
            }
            Ctl::Attacher => {
                Parsed::Attacher(parse_from(args, FlagSyntax::Go).map_err(|e| e.to_string())?)
            }
            Ctl::Resizer => {
                Parsed::Resizer(parse_from(args, FlagSyntax::Go).map_err(|e| e.to_string())?)
            }
            Ctl::Snapshotter => {
                Parsed::Snapshotter(parse_from(args, FlagSyntax::Go).map_err(|e| e.to_string())?)
            }
        };
        Ok(parsed)
    }

    /// Parses as the single sidecar does, printing help or errors and exiting as it does.
    fn parse(ctl: Ctl, args: Vec<OsString>) -> Self {
        use sidecar_kit::flags::{FlagSyntax, parse_args};
        match ctl {
            Ctl::Provisioner => Parsed::Provisioner(parse_args(args, FlagSyntax::Gnu)),
            Ctl::Attacher => Parsed::Attacher(parse_args(args, FlagSyntax::Go)),
            Ctl::Resizer => Parsed::Resizer(parse_args(args, FlagSyntax::Go)),
            Ctl::Snapshotter => Parsed::Snapshotter(parse_args(args, FlagSyntax::Go)),
        }
    }

    fn common(&self) -> &sidecar_kit::flags::CommonFlags {
        match self {
            Parsed::Provisioner(cli) => &cli.common,
            Parsed::Attacher(cli) => &cli.common,
            Parsed::Resizer(cli) => &cli.common,
            Parsed::Snapshotter(cli) => &cli.common,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Parsed::Provisioner(_) => Ctl::Provisioner.name(),
            Parsed::Attacher(_) => Ctl::Attacher.name(),
            Parsed::Resizer(_) => Ctl::Resizer.name(),
            Parsed::Snapshotter(_) => Ctl::Snapshotter.name(),
        }
    }

    fn validate(&self) -> Result<(), String> {
        match self {
            Parsed::Provisioner(cli) => cli.validate().map_err(|e| e.to_string()),
            Parsed::Attacher(cli) => cli.validate().map_err(|e| e.to_string()),
            Parsed::Resizer(cli) => cli.validate().map_err(|e| e.to_string()),
            Parsed::Snapshotter(cli) => cli.validate().map_err(|e| e.to_string()),
        }
    }

    fn greeting(&self) -> sidecar_kit::startup::Greeting<'_> {
        match self {
            Parsed::Provisioner(cli) => external_provisioner::app::greeting(cli),
            Parsed::Attacher(cli) => external_attacher::app::greeting(cli),
            Parsed::Resizer(cli) => external_resizer::app::greeting(cli),
            Parsed::Snapshotter(cli) => external_snapshotter::app::greeting(cli),
        }
    }

    async fn prepare(&self, host: &Host, kube_config: &kube::Config) -> Result<Controller, String> {
        match self {
            Parsed::Provisioner(cli) => external_provisioner::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
            Parsed::Attacher(cli) => external_attacher::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
            Parsed::Resizer(cli) => external_resizer::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
            Parsed::Snapshotter(cli) => external_snapshotter::app::prepare(cli, host, kube_config)
                .await
                .map_err(|e| e.to_string()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AioError {
    #[error(transparent)]
    Http(#[from] sidecar_kit::http::HttpError),
    #[error(transparent)]
    Kube(#[from] sidecar_kit::kube::KubeError),
    #[error(transparent)]
    Host(#[from] sidecar_kit::host::HostError),
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
    sidecar_kit::lifecycle::exit_if_version(&first.common().process, env!("CARGO_PKG_VERSION"));
    sidecar_kit::logging::init(&first.common().logging);
    for controller in &parsed {
        if let Err(err) = controller.validate() {
            sidecar_kit::lifecycle::fatal(&format!("{}: {err}", controller.name()));
        }
    }
    let process = first.common().process.clone();
    sidecar_kit::startup::run(&process, |shutdown| serve(parsed, shutdown));
}

/// One host for every controller: the driver greeted once (with the longest of their
/// timeouts), one set of shared watches, one HTTP endpoint.
async fn serve(parsed: Vec<Parsed>, shutdown: CancellationToken) -> Result<(), AioError> {
    let Some(first) = parsed.first() else {
        return Ok(());
    };
    let common = first.common();
    let http = HttpPlan::from_flags(&common.http)?;
    let kube_config = sidecar_kit::kube::load_config(&common.kube).await?;
    let mut greeting = first.greeting();
    for controller in &parsed[1..] {
        let other = controller.greeting();
        greeting.probe_timeout = greeting.probe_timeout.max(other.probe_timeout);
        greeting.identity_timeout = greeting.identity_timeout.max(other.identity_timeout);
        greeting.max_log_length = greeting.max_log_length.max(other.max_log_length);
    }
    let Some(host) = Host::start(greeting, WatchHub::shared(), &shutdown).await? else {
        return Ok(());
    };
    let names: Vec<&str> = parsed.iter().map(Parsed::name).collect();
    tracing::info!(controllers = ?names, driver = %host.driver, "running in one process");
    let mut controllers = Vec::with_capacity(parsed.len());
    for controller in &parsed {
        controllers.push(
            controller
                .prepare(&host, &kube_config)
                .await
                .map_err(|e| AioError::Prepare(controller.name(), e))?,
        );
    }
    let pprof = parsed.iter().find_map(|p| match p {
        Parsed::Provisioner(cli) => Some(external_provisioner::app::pprof_routes(cli)),
        _ => None,
    });
    host::run(
        &host,
        &http,
        &common.http.metrics_path,
        move |routes| match pprof {
            Some(add) => add(routes),
            None => routes,
        },
        controllers,
        shutdown,
    )
    .await?;
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
            plan(&["--controllers=livenessprobe"]),
            Err(RouteError::NodeSidecar("livenessprobe".into()))
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
    fn help_groups_the_flags() {
        let text = help();
        assert!(text.contains("  --csi-address\n"));
        assert!(text.contains("  --provisioner-volume-name-prefix\n"));
        assert!(text.contains("  --snapshotter-snapshot-name-prefix\n"));
    }
}
