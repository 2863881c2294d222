//! The sidecars of the binary, one line each. Routing, help, the multi-call dispatch and the
//! all-in-one start-up all go through [`REGISTRY`].

use std::ffi::OsString;
use std::fmt;

use clap::CommandFactory;
use sidecar_kit::runtime::{Plug, Plugin};

/// The node sidecars' names in `--controllers`, flag prefixes, health paths and logs.
pub const LIVENESSPROBE: &str = "livenessprobe";
pub const REGISTRAR: &str = "node-driver-registrar";

/// A sidecar of the binary.
pub struct Entry {
    kind: Kind,
    /// Names it answers to besides its binary's and its `--controllers` name.
    aliases: &'static [&'static str],
    /// Among the controllers `--controllers=*` selects: those every CSI controller pod can
    /// run. The health monitor is asked for by name, as it needs a driver that reports volume
    /// conditions, which most do not (it would stop the process at start).
    in_all: bool,
}

/// How a sidecar runs.
#[derive(Clone, Copy)]
pub enum Kind {
    /// A controller on the sidecar runtime.
    Controller(&'static dyn Plugin),
    /// The node sidecars are not on the runtime: they never talk to the API server, wait for
    /// the driver on their own (a driver restart is not theirs to exit for) and answer health
    /// checks rather than run controllers, so each keeps its own start-up.
    Livenessprobe,
    Registrar,
}

/// Every sidecar, in the order the all-in-one process starts them.
pub static REGISTRY: [Entry; 8] = [
    Entry::controller(
        &Plug::<external_provisioner::app::Provisioner>::new(),
        &["external-provisioner"],
    ),
    Entry::controller(
        &Plug::<external_attacher::app::Attacher>::new(),
        &["external-attacher"],
    ),
    Entry::controller(
        &Plug::<external_resizer::app::Resizer>::new(),
        &["external-resizer"],
    ),
    Entry::controller(
        &Plug::<external_snapshotter::app::Snapshotter>::new(),
        &["external-snapshotter"],
    ),
    Entry {
        in_all: false,
        ..Entry::controller(
            &Plug::<external_health_monitor::app::HealthMonitor>::new(),
            &[
                "external-health-monitor",
                "external-health-monitor-controller",
            ],
        )
    },
    // A server for backup applications, not a controller: asked for by name, as only drivers
    // with the SNAPSHOT_METADATA_SERVICE can run it.
    Entry {
        in_all: false,
        ..Entry::controller(
            &Plug::<external_snapshot_metadata::app::SnapshotMetadata>::new(),
            &["external-snapshot-metadata", "csi-snapshot-metadata"],
        )
    },
    Entry {
        kind: Kind::Livenessprobe,
        aliases: &[],
        in_all: false,
    },
    Entry {
        kind: Kind::Registrar,
        aliases: &["registrar"],
        in_all: false,
    },
];

impl Entry {
    const fn controller(plugin: &'static dyn Plugin, aliases: &'static [&'static str]) -> Self {
        Self {
            kind: Kind::Controller(plugin),
            aliases,
            in_all: true,
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Its name in `--controllers` (KEP-4958's) and in flag prefixes.
    pub fn name(&self) -> &'static str {
        match self.kind {
            Kind::Controller(plugin) => plugin.name(),
            Kind::Livenessprobe => LIVENESSPROBE,
            Kind::Registrar => REGISTRAR,
        }
    }

    /// Its own binary's name: the image entrypoint and the program name its parser sees.
    pub fn binary(&self) -> &'static str {
        match self.kind {
            Kind::Controller(plugin) => plugin.binary(),
            Kind::Livenessprobe => LIVENESSPROBE,
            Kind::Registrar => "csi-node-driver-registrar",
        }
    }

    /// The names it answers to: its binary's, its own, its aliases.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names = vec![self.binary()];
        for name in std::iter::once(self.name()).chain(self.aliases.iter().copied()) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    pub fn is_controller(&self) -> bool {
        matches!(self.kind, Kind::Controller(_))
    }

    /// Whether `--controllers=*` selects it.
    pub fn in_all(&self) -> bool {
        self.in_all
    }

    /// Its command line's declaration.
    pub fn command(&self) -> clap::Command {
        match self.kind {
            Kind::Controller(plugin) => plugin.command(),
            Kind::Livenessprobe => livenessprobe::flags::Cli::command(),
            Kind::Registrar => node_driver_registrar::config::Cli::command(),
        }
    }

    /// Runs it as its own binary with its command line (the first item names the program).
    pub fn run(&self, args: Vec<OsString>) {
        match self.kind {
            Kind::Controller(plugin) => plugin.main(args),
            Kind::Livenessprobe => livenessprobe::entry::main(args),
            Kind::Registrar => node_driver_registrar::entry::main(args),
        }
    }

    /// The sidecar answering to `name`.
    pub fn named(name: &str) -> Option<&'static Entry> {
        REGISTRY.iter().find(|e| e.names().contains(&name))
    }

    /// Its place in [`REGISTRY`].
    pub fn position(&self) -> usize {
        REGISTRY
            .iter()
            .position(|e| std::ptr::eq(e, self))
            .unwrap_or(usize::MAX)
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Entry {}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The entry named `name` in `--controllers`, for tests.
#[cfg(test)]
pub fn entry(name: &str) -> &'static Entry {
    REGISTRY
        .iter()
        .find(|e| e.name() == name)
        .unwrap_or_else(|| panic!("no sidecar {name}"))
}
