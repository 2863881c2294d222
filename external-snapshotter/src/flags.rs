//! Command-line flags: upstream csi-snapshotter's, in Go `flag` syntax, with its defaults.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{
    CommonFlags, feature_gate_pairs, parse_go_bool, parse_go_duration,
};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

/// The feature gates upstream accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// Beta, default off: VolumeGroupSnapshotContents through the group controller service.
    pub volume_group_snapshot: bool,
    /// Alpha, default off: release the leader Lease on graceful shutdown (our kit does so with
    /// `--leader-election-release-on-exit` as well).
    pub release_leader_election_on_exit: bool,
    /// A gate this snapshotter does not know: refused after parsing (exit 1), as upstream sets
    /// the gates from the parsed map.
    pub unknown: Option<String>,
}

/// Parses `--feature-gates` as component-base does: `Name=bool,Name2=bool`; malformed text is a
/// flag error, an unknown gate is kept for [`Cli::validate`]. `AllAlpha` and `AllBeta` set every
/// alpha (beta) gate.
pub fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for (name, value) in feature_gate_pairs(text)? {
        match name.as_str() {
            "CSIVolumeGroupSnapshot" => gates.volume_group_snapshot = value,
            "ReleaseLeaderElectionOnExit" => gates.release_leader_election_on_exit = value,
            "AllAlpha" => gates.release_leader_election_on_exit = value,
            "AllBeta" => gates.volume_group_snapshot = value,
            other => gates.unknown = Some(other.to_string()),
        }
    }
    Ok(gates)
}

/// CSI external-snapshotter sidecar: creates, checks and deletes the snapshots that
/// VolumeSnapshotContents of this driver ask for, through the driver's CreateSnapshot,
/// ListSnapshots and DeleteSnapshot.
#[derive(Parser, Clone, Debug)]
#[command(name = "csi-snapshotter", disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonFlags,

    /// How often every content is looked at again
    #[arg(long, default_value = "15m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync_period: Duration,

    /// Prefix of the names of the snapshots asked of the driver: <prefix>-<VolumeSnapshot UID>
    #[arg(long, default_value = "snapshot", value_name = "PREFIX")]
    pub snapshot_name_prefix: String,

    /// Length of the VolumeSnapshot UID in snapshot names, without dashes (-1: the whole UID,
    /// with dashes)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "N")]
    pub snapshot_name_uuid_length: i32,

    /// Number of contents worked on at once (and as many group contents)
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub worker_threads: usize,

    /// Timeout of every call to the driver: each Probe attempt, the identity and capability
    /// calls, CreateSnapshot, ListSnapshots, DeleteSnapshot and the group calls
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Add csi.storage.k8s.io/volumesnapshot/name, csi.storage.k8s.io/volumesnapshot/namespace
    /// and csi.storage.k8s.io/volumesnapshotcontent/name to the parameters of CreateSnapshot
    /// (and the volumegroupsnapshot ones to CreateVolumeGroupSnapshot)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// Initial retry interval of a failed creation or deletion, and of the readiness check of a
    /// snapshot not ready yet; doubles on every try
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed creation or deletion and of the readiness check
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Run beside the driver on every node, for node-local volumes: only the contents labelled
    /// snapshot.storage.kubernetes.io/managed-by=$NODE_NAME (no leader election)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub node_deployment: bool,

    /// Prefix of the names of the group snapshots asked of the driver
    #[arg(long, default_value = "groupsnapshot", value_name = "PREFIX")]
    pub groupsnapshot_name_prefix: String,

    /// Length of the VolumeGroupSnapshot UID in group snapshot names, without dashes (-1: the
    /// whole UID, with dashes)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "N")]
    pub groupsnapshot_name_uuid_length: i32,

    /// Feature gates, as Name=true|false,...: CSIVolumeGroupSnapshot (beta, default false),
    /// ReleaseLeaderElectionOnExit (alpha, default false)
    #[arg(long, default_value = "", value_parser = parse_feature_gates, value_name = "GATES")]
    pub feature_gates: FeatureGates,
}

/// Settings refused after parsing (exit code 1, as upstream's checks).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("unrecognized feature gate: {0}")]
    UnknownGate(String),
    #[error("Snapshot name prefix cannot be of length 0")]
    EmptyPrefix,
    #[error("Group snapshot name prefix cannot be of length 0")]
    EmptyGroupPrefix,
    #[error("--{flag} must be -1 or between 1 and 32, not {value}")]
    UuidLength { flag: &'static str, value: i32 },
    #[error("option -worker-threads must be greater than zero")]
    ZeroWorkers,
    #[error("Leader election cannot happen when node-deployment is set to true")]
    NodeDeploymentWithLeaderElection,
    #[error("only one of --http-endpoint and --metrics-address can be set")]
    BothEndpoints,
    #[error("The NODE_NAME environment variable must be set when using --node-deployment.")]
    NoNodeName,
}

impl SidecarCli for Cli {
    type Invalid = InvalidFlags;

    fn common(&self) -> &CommonFlags {
        &self.common
    }

    fn validate(&self) -> Result<(), InvalidFlags> {
        if let Some(gate) = &self.feature_gates.unknown {
            return Err(InvalidFlags::UnknownGate(gate.clone()));
        }
        if self.node_deployment && self.common.leader_election.leader_election {
            return Err(InvalidFlags::NodeDeploymentWithLeaderElection);
        }
        if self.worker_threads == 0 {
            return Err(InvalidFlags::ZeroWorkers);
        }
        if self.snapshot_name_prefix.is_empty() {
            return Err(InvalidFlags::EmptyPrefix);
        }
        if self.feature_gates.volume_group_snapshot && self.groupsnapshot_name_prefix.is_empty() {
            return Err(InvalidFlags::EmptyGroupPrefix);
        }
        // Upstream slices the UID with the length unchecked: past 32 it panics on every
        // snapshot. Refused here, at start.
        for (flag, value) in [
            ("snapshot-name-uuid-length", self.snapshot_name_uuid_length),
            (
                "groupsnapshot-name-uuid-length",
                self.groupsnapshot_name_uuid_length,
            ),
        ] {
            if value != -1 && !(1..=32).contains(&value) {
                return Err(InvalidFlags::UuidLength { flag, value });
            }
        }
        if !self.common.http.http_endpoint.is_empty()
            && !self.common.http.metrics_address.is_empty()
        {
            return Err(InvalidFlags::BothEndpoints);
        }
        self.node_name().map(drop)
    }

    /// Every call bounded by `--timeout`.
    fn greeting(&self) -> Greeting<'_> {
        Greeting::bounded_by(&self.common.csi.csi_address, self.timeout)
    }

    fn release_lease_on_exit(&self) -> bool {
        self.feature_gates.release_leader_election_on_exit
    }
}

impl Cli {
    /// `NODE_NAME` with `--node-deployment`.
    pub fn node_name(&self) -> Result<Option<String>, InvalidFlags> {
        if !self.node_deployment {
            return Ok(None);
        }
        std::env::var("NODE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .map(Some)
            .ok_or(InvalidFlags::NoNodeName)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("csi-snapshotter").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    #[test]
    fn defaults_are_upstreams() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.resync_period, Duration::from_secs(900));
        assert_eq!(cli.snapshot_name_prefix, "snapshot");
        assert_eq!(cli.snapshot_name_uuid_length, -1);
        assert_eq!(cli.worker_threads, 10);
        assert_eq!(cli.timeout, Duration::from_secs(60));
        assert!(!cli.extra_create_metadata);
        assert_eq!(cli.retry_interval_start, Duration::from_secs(1));
        assert_eq!(cli.retry_interval_max, Duration::from_secs(300));
        assert!(!cli.node_deployment);
        assert_eq!(cli.groupsnapshot_name_prefix, "groupsnapshot");
        assert_eq!(cli.groupsnapshot_name_uuid_length, -1);
        assert_eq!(cli.feature_gates, FeatureGates::default());
        assert_eq!(cli.common.kube.kube_api_qps, 5.0);
        assert_eq!(cli.common.kube.kube_api_burst, 10);
        assert_eq!(cli.validate(), Ok(()));
    }

    #[test]
    fn go_syntax_and_gates() {
        let cli = parse(&[
            "-worker-threads=3",
            "--snapshot-name-uuid-length=8",
            "-extra-create-metadata",
            "--timeout=1m30s",
            "--feature-gates=CSIVolumeGroupSnapshot=true",
        ])
        .unwrap();
        assert_eq!(cli.worker_threads, 3);
        assert_eq!(cli.snapshot_name_uuid_length, 8);
        assert!(cli.extra_create_metadata);
        assert_eq!(cli.timeout, Duration::from_secs(90));
        assert!(cli.feature_gates.volume_group_snapshot);
        let unknown = parse(&["--feature-gates=Nope=true"]).unwrap();
        assert_eq!(
            unknown.validate(),
            Err(InvalidFlags::UnknownGate("Nope".into()))
        );
        assert!(parse(&["--feature-gates=Nope"]).is_err(), "malformed");
        assert!(parse(&["--workers=3"]).is_err(), "not a snapshotter flag");
        assert!(
            parse(&["--enable-volume-group-snapshots"]).is_err(),
            "removed upstream"
        );
    }

    #[test]
    fn refused_settings() {
        let refused = |args: &[&str]| parse(args).unwrap().validate().unwrap_err();
        assert_eq!(
            refused(&["--node-deployment", "--leader-election"]),
            InvalidFlags::NodeDeploymentWithLeaderElection
        );
        assert_eq!(
            refused(&["--snapshot-name-prefix="]),
            InvalidFlags::EmptyPrefix
        );
        assert_eq!(
            refused(&["--snapshot-name-uuid-length=33"]),
            InvalidFlags::UuidLength {
                flag: "snapshot-name-uuid-length",
                value: 33
            }
        );
        assert_eq!(refused(&["--worker-threads=0"]), InvalidFlags::ZeroWorkers);
        assert_eq!(
            refused(&[
                "--feature-gates=CSIVolumeGroupSnapshot=true",
                "--groupsnapshot-name-prefix="
            ]),
            InvalidFlags::EmptyGroupPrefix
        );
        let off = parse(&["--groupsnapshot-name-prefix="]).unwrap();
        assert_eq!(
            off.validate(),
            Ok(()),
            "without groups the prefix is unused"
        );
    }
}
