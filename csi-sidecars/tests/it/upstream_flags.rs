//! Each sidecar's flags against its upstream's, name for name: the long flags its `--help` lists
//! are those upstream's `-h` lists (`tests/fixtures/upstream-flags`, written by
//! `scripts/upstream-flags.sh`), plus the few of ours only, listed here with why.

use std::collections::BTreeSet;

use csi_sidecars::registry::REGISTRY;

/// Each upstream binary's flags, as its `-h` lists them; the versions are in the headers.
const UPSTREAM: [(&str, &str); 8] = [
    (
        "csi-provisioner",
        include_str!("../fixtures/upstream-flags/csi-provisioner.txt"),
    ),
    (
        "csi-attacher",
        include_str!("../fixtures/upstream-flags/csi-attacher.txt"),
    ),
    (
        "csi-resizer",
        include_str!("../fixtures/upstream-flags/csi-resizer.txt"),
    ),
    (
        "csi-snapshotter",
        include_str!("../fixtures/upstream-flags/csi-snapshotter.txt"),
    ),
    (
        "csi-external-health-monitor-controller",
        include_str!("../fixtures/upstream-flags/csi-external-health-monitor-controller.txt"),
    ),
    (
        "csi-node-driver-registrar",
        include_str!("../fixtures/upstream-flags/csi-node-driver-registrar.txt"),
    ),
    (
        "csi-snapshot-metadata",
        include_str!("../fixtures/upstream-flags/csi-snapshot-metadata.txt"),
    ),
    (
        "livenessprobe",
        include_str!("../fixtures/upstream-flags/livenessprobe.txt"),
    ),
];

/// Our flags upstream's binary lacks, and why.
const OURS_ONLY: [(&str, &str); 26] = [
    // Every controller releases its Lease on a graceful shutdown unless this says no (upstream:
    // the alpha gate ReleaseLeaderElectionOnExit, off by default).
    ("csi-provisioner", "leader-election-release-on-exit"),
    ("csi-attacher", "leader-election-release-on-exit"),
    ("csi-resizer", "leader-election-release-on-exit"),
    ("csi-snapshotter", "leader-election-release-on-exit"),
    (
        "csi-external-health-monitor-controller",
        "leader-election-release-on-exit",
    ),
    // A standby replica may keep its caches synced, so that a failover costs only the Lease.
    ("csi-provisioner", "leader-election-warm-standby"),
    ("csi-attacher", "leader-election-warm-standby"),
    ("csi-resizer", "leader-election-warm-standby"),
    ("csi-snapshotter", "leader-election-warm-standby"),
    (
        "csi-external-health-monitor-controller",
        "leader-election-warm-standby",
    ),
    // The registrar waits for a slow driver instead of crash-looping, and re-creates a
    // deleted registration socket.
    ("csi-node-driver-registrar", "driver-startup-timeout"),
    ("csi-node-driver-registrar", "socket-check-interval"),
    // Every binary of ours prints its version.
    ("livenessprobe", "version"),
    // The TLS settings upstream's main branch added after v1.1.0.
    ("csi-snapshot-metadata", "tls-min-version"),
    ("csi-snapshot-metadata", "tls-cipher-suites"),
    ("csi-snapshot-metadata", "tls-curve-preferences"),
    // Bounds on clients, which upstream's server does not have.
    ("csi-snapshot-metadata", "max-streams"),
    ("csi-snapshot-metadata", "max-connections"),
    // OpenTelemetry tracing, configured as kube-apiserver's (upstream's sidecars trace nothing).
    ("csi-provisioner", "tracing-config-file"),
    ("csi-attacher", "tracing-config-file"),
    ("csi-resizer", "tracing-config-file"),
    ("csi-snapshotter", "tracing-config-file"),
    (
        "csi-external-health-monitor-controller",
        "tracing-config-file",
    ),
    ("csi-node-driver-registrar", "tracing-config-file"),
    ("livenessprobe", "tracing-config-file"),
    ("csi-snapshot-metadata", "tracing-config-file"),
];

/// The names of a fixture: a line each, `#` starts a comment.
fn names(fixture: &str) -> BTreeSet<&str> {
    fixture
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

#[test]
fn each_sidecar_has_its_upstream_s_flags_and_only_the_listed_extras() {
    let mut problems = Vec::new();
    for entry in &REGISTRY {
        let binary = entry.binary();
        let Some((_, fixture)) = UPSTREAM.iter().find(|(name, _)| *name == binary) else {
            panic!("no upstream flags for {binary}");
        };
        let upstream = names(fixture);
        let command = entry.command();
        // What --help lists; Go's flag and pflag answer -h and --help without listing them.
        let ours: BTreeSet<&str> = command
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .filter_map(|arg| arg.get_long())
            .filter(|long| *long != "help")
            .collect();
        let extras: BTreeSet<&str> = OURS_ONLY
            .iter()
            .filter(|(of, _)| *of == binary)
            .map(|(_, flag)| *flag)
            .collect();
        let missing: Vec<_> = upstream.difference(&ours).collect();
        let unexpected: Vec<_> = ours
            .iter()
            .filter(|flag| !upstream.contains(*flag) && !extras.contains(*flag))
            .collect();
        // An extra upstream has gained, or one we no longer have, is listed for nothing.
        let stale: Vec<_> = extras
            .iter()
            .filter(|flag| upstream.contains(*flag) || !ours.contains(*flag))
            .collect();
        if !(missing.is_empty() && unexpected.is_empty() && stale.is_empty()) {
            problems.push(format!(
                "{binary}: upstream's missing here {missing:?}; ours unlisted {unexpected:?}; \
                 listed extras that are not {stale:?}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn fixtures_name_their_upstream_version() {
    for (binary, fixture) in UPSTREAM {
        let header = fixture.lines().next().unwrap_or_default();
        assert!(
            header.starts_with('#') && header.contains(binary) && header.contains(" v"),
            "{binary}: {header}"
        );
    }
}
