//! Routing `csi-sidecars --controllers=…`'s command line: which sidecars run, and each one's
//! command line for its own parser. Flags shared by several sidecars are given once; a flag
//! prefixed with a sidecar's name (`--attacher-timeout=30s`) is that sidecar's only and wins
//! over the shared one.

use std::collections::BTreeSet;
use std::ffi::OsString;

use crate::registry::{Entry, Kind, REGISTRY};

/// A sidecar `--controllers` selects.
pub type Ctl = &'static Entry;

/// Settings of the process as a whole: one driver, one API server, one HTTP endpoint, one log.
/// Given once, never per controller.
const PROCESS_FLAGS: [&str; 15] = [
    "csi-address",
    "kubeconfig",
    "http-endpoint",
    "metrics-address",
    "metrics-path",
    "v",
    "vmodule",
    "logging-format",
    "log-flush-frequency",
    "log-text-split-stream",
    "log-text-info-buffer-size",
    "log-json-split-stream",
    "log-json-info-buffer-size",
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
pub(super) const CONSOLIDATED_FLAG: &str = "leader-election-consolidated";

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
    REGISTRY
        .iter()
        .map(Entry::name)
        .collect::<Vec<_>>()
        .join(", ")
}

fn parse_controllers(list: &str) -> Result<Vec<Ctl>, RouteError> {
    // By place in the registry, which is the order they start in.
    let mut selected = BTreeSet::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "*" | "all" => {
                selected.extend(REGISTRY.iter().filter(|e| e.in_all()).map(Entry::position))
            }
            name => match REGISTRY.iter().find(|e| e.name() == name) {
                Some(ctl) => {
                    selected.insert(ctl.position());
                }
                None => return Err(RouteError::UnknownController(name.to_string(), known())),
            },
        }
    }
    if selected.is_empty() {
        return Err(RouteError::NoControllers(known()));
    }
    let selected: Vec<Ctl> = selected.into_iter().map(|i| &REGISTRY[i]).collect();
    if selected.iter().any(|e| matches!(e.kind(), Kind::Registrar))
        && let Some(controller) = selected.iter().find(|e| e.is_controller())
    {
        return Err(RouteError::NodeWithController(
            controller.name().to_string(),
        ));
    }
    Ok(selected)
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
    let commands: Vec<(Ctl, clap::Command)> = REGISTRY.iter().map(|c| (c, c.command())).collect();
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
                let plain = REGISTRY
                    .iter()
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
        commands.iter().any(|(c, cmd)| {
            std::ptr::eq(*c, ctl) && cmd.get_arguments().any(|a| a.get_long() == Some(name))
        })
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
                Some(text) => sidecar_kit::process::flags::parse_go_bool(text)
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
            if super::check(ctl, probe.to_vec()).is_ok() {
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
    let commands: Vec<(Ctl, clap::Command)> = REGISTRY.iter().map(|c| (c, c.command())).collect();
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
         attacher, resizer, snapshotter (* for these four), health-monitor (for drivers\n\
         that report volume conditions) and livenessprobe; on nodes:\n\
         node-driver-registrar and livenessprobe. One driver connection, one set of watches,\n\
         each controller under its own upstream Lease, one HTTP endpoint (--http-endpoint):\n\
         metrics, /healthz/leader-election, /healthz/livenessprobe (the driver's Probe),\n\
         /healthz/node-driver-registrar (the registration socket) and /healthz (both).\n\
         A flag shared by several sidecars is given once; --<sidecar>-<flag> sets it for that\n\
         sidecar only and wins. Each keeps its own defaults (the timeouts differ).\n\
         --leader-election-consolidated: one Lease for the process instead of one per\n\
         controller; the single sidecars' Leases are taken over when it is first won.\n",
    );
    text.push_str(&format!("--kubeconfig: {}.\n\n", super::KUBECONFIG.help()));
    text.push_str("Flags of every controller (process-wide ones cannot be prefixed):\n");
    let controllers: Vec<&BTreeSet<String>> = commands
        .iter()
        .zip(&all)
        .filter(|((entry, _), _)| entry.is_controller())
        .map(|(_, flags)| flags)
        .collect();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::entry;

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
            args_of(&p, entry("attacher")),
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
            args_of(&p, entry("provisioner")),
            [
                "csi-provisioner",
                "--csi-address=/csi/csi.sock",
                "--leader-election",
                "--timeout=30s",
                "--extra-create-metadata"
            ]
        );
        for (ctl, args) in &p.controllers {
            assert_eq!(super::super::check(ctl, args.clone()), Ok(()), "{args:?}");
        }
    }

    #[test]
    fn all_is_every_controller_and_each_keeps_its_defaults() {
        let p = plan(&["--controllers=*"]).unwrap();
        assert_eq!(p.controllers.len(), 4);
        let p = plan(&["--controllers", "snapshotter,resizer"]).unwrap();
        assert_eq!(
            p.controllers.iter().map(|(c, _)| *c).collect::<Vec<_>>(),
            [entry("resizer"), entry("snapshotter")]
        );
        assert_eq!(args_of(&p, entry("snapshotter")), ["csi-snapshotter"]);
    }

    #[test]
    fn feature_gates_are_split_by_who_knows_them() {
        let p = plan(&[
            "--controllers=provisioner,snapshotter",
            "--feature-gates=Topology=true,CSIVolumeGroupSnapshot=true",
        ])
        .unwrap();
        assert_eq!(
            args_of(&p, entry("provisioner")),
            ["csi-provisioner", "--feature-gates=Topology=true"]
        );
        assert_eq!(
            args_of(&p, entry("snapshotter")),
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
            plan(&["--controllers=volume-populator"]),
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
            args_of(&p, entry("node-driver-registrar")),
            [
                "csi-node-driver-registrar",
                "--csi-address=/csi/csi.sock",
                "--kubelet-registration-path=/var/lib/kubelet/plugins/x/csi.sock",
                "--http-endpoint=:9809",
                "--timeout=2s"
            ]
        );
        assert_eq!(
            args_of(&p, entry("livenessprobe")),
            [
                "livenessprobe",
                "--csi-address=/csi/csi.sock",
                "--http-endpoint=:9809",
                "--probe-timeout=5s"
            ]
        );
        for (ctl, args) in &p.controllers {
            assert_eq!(super::super::check(ctl, args.clone()), Ok(()), "{args:?}");
        }
        let probe_mode = [
            OsString::from("csi-node-driver-registrar"),
            OsString::from("--kubelet-registration-path=/x/csi.sock"),
            OsString::from("--mode=kubelet-registration-probe"),
        ];
        assert!(super::super::check(entry("node-driver-registrar"), probe_mode.to_vec()).is_err());
        let p = plan(&["--controllers=*,livenessprobe"]).unwrap();
        assert_eq!(p.controllers.len(), 5);
        let p = plan(&["--controllers=*,health-monitor"]).unwrap();
        assert_eq!(p.controllers.len(), 5);
    }

    #[test]
    fn logging_flags_are_the_process_s() {
        let p = plan(&[
            "--controllers=attacher,livenessprobe",
            "--log-text-split-stream",
            "--log-text-info-buffer-size",
            "64Ki",
            "--log-json-split-stream=false",
            "-log-json-info-buffer-size=0",
        ])
        .unwrap();
        for (ctl, args) in &p.controllers {
            assert_eq!(
                args[1..],
                [
                    "--log-text-split-stream",
                    "--log-text-info-buffer-size=64Ki",
                    "--log-json-split-stream=false",
                    "--log-json-info-buffer-size=0"
                ]
                .map(OsString::from),
                "{ctl:?}"
            );
            assert_eq!(super::super::check(ctl, args.clone()), Ok(()), "{args:?}");
        }
        assert_eq!(
            plan(&["--controllers=attacher", "--attacher-log-json-split-stream"]),
            Err(RouteError::ProcessWide(
                "attacher-log-json-split-stream".into(),
                "log-json-split-stream".into()
            ))
        );
    }

    #[test]
    fn the_consolidated_lease_is_the_process_s_own_flag() {
        let p = plan(&["--controllers=attacher", "--leader-election-consolidated"]).unwrap();
        assert!(p.consolidated);
        assert_eq!(args_of(&p, entry("attacher")), ["csi-attacher"]);
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
        assert!(text.contains(super::super::KUBECONFIG.help()));
    }
}
