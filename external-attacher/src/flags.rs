//! Command-line flags: upstream csi-attacher's, in Go `flag` syntax, with its defaults.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{CommonFlags, feature_gate_pairs, parse_go_duration};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

use crate::app::IDENTITY_TIMEOUT;

/// The feature gates upstream accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Alpha, default off: release the leader Lease on graceful shutdown. Our kit releases it by
    /// default already (`--leader-election-release-on-exit`); the gate turns it on as well.
    pub release_leader_election_on_exit: bool,
    /// GA, default on: record the gRPC code in `errorCode` of attach/detach errors.
    pub mutable_csinode_allocatable_count: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            release_leader_election_on_exit: false,
            mutable_csinode_allocatable_count: true,
        }
    }
}

/// Parses `--feature-gates` as component-base does: `Name=bool,Name2=bool`. Unknown gates are
/// errors. `AllAlpha` and `AllBeta` set every alpha (beta) gate.
pub fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for (name, value) in feature_gate_pairs(text)? {
        match name.as_str() {
            "ReleaseLeaderElectionOnExit" | "AllAlpha" => {
                gates.release_leader_election_on_exit = value
            }
            "MutableCSINodeAllocatableCount" => gates.mutable_csinode_allocatable_count = value,
            "AllBeta" => {}
            other => return Err(format!("unrecognized feature gate: {other}")),
        }
    }
    Ok(gates)
}

/// CSI external-attacher: attaches and detaches CSI volumes as VolumeAttachments ask, through the
/// driver's ControllerPublishVolume and ControllerUnpublishVolume.
#[derive(Parser, Clone, Debug)]
#[command(name = "csi-attacher", disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonFlags,

    /// Resync interval of the informers: how often every object is processed again
    #[arg(long, default_value = "10m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync: Duration,

    /// Timeout of ControllerPublish, ControllerUnpublish, each Probe attempt and each ListVolumes
    /// page
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Initial retry interval of a failed attach or detach; doubles on every failure
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed attach or detach
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Number of VolumeAttachment workers, and of PersistentVolume workers
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub worker_threads: usize,

    /// Page size of ListVolumes (0: let the driver decide)
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub max_entries: i32,

    /// Filesystem type for volumes whose PersistentVolume names none
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Period of the reconciliation of VolumeAttachments with the driver's ListVolumes
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub reconcile_sync: Duration,

    /// Maximum length of logged gRPC responses (-1: no limit)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "N")]
    pub max_grpc_log_length: i64,

    /// Feature gates, as Name=true|false,...: ReleaseLeaderElectionOnExit (alpha, default
    /// false), MutableCSINodeAllocatableCount (GA, default true)
    #[arg(long, default_value = "", value_parser = parse_feature_gates, value_name = "GATES")]
    pub feature_gates: FeatureGates,
}

/// Settings upstream refuses after parsing (it exits with code 1, not 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("option -worker-threads must be greater than zero")]
    ZeroWorkers,
}

impl SidecarCli for Cli {
    type Invalid = InvalidFlags;

    fn common(&self) -> &CommonFlags {
        &self.common
    }

    fn validate(&self) -> Result<(), InvalidFlags> {
        if self.worker_threads == 0 {
            return Err(InvalidFlags::ZeroWorkers);
        }
        Ok(())
    }

    /// The probe bounded by `--timeout`, the identity calls by [`IDENTITY_TIMEOUT`].
    fn greeting(&self) -> Greeting<'_> {
        Greeting {
            csi_address: &self.common.csi.csi_address,
            probe_timeout: self.timeout,
            identity_timeout: IDENTITY_TIMEOUT,
            max_log_length: self.max_grpc_log_length,
        }
    }

    fn release_lease_on_exit(&self) -> bool {
        self.feature_gates.release_leader_election_on_exit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("csi-attacher").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    #[test]
    fn defaults_match_upstream() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.resync, Duration::from_secs(600));
        assert_eq!(cli.timeout, Duration::from_secs(15));
        assert_eq!(cli.retry_interval_start, Duration::from_secs(1));
        assert_eq!(cli.retry_interval_max, Duration::from_secs(300));
        assert_eq!(cli.worker_threads, 10);
        assert_eq!(cli.max_entries, 0);
        assert_eq!(cli.default_fstype, "");
        assert_eq!(cli.reconcile_sync, Duration::from_secs(60));
        assert_eq!(cli.max_grpc_log_length, -1);
        assert_eq!(cli.feature_gates, FeatureGates::default());
        assert_eq!(cli.common.csi.csi_address, "/run/csi/socket");
        assert_eq!(cli.common.kube.kube_api_qps, 5.0);
        assert_eq!(cli.common.kube.kube_api_burst, 10);
        assert!(cli.validate().is_ok());
    }

    #[test]
    fn go_syntax_as_deployments_write_it() {
        let cli = parse(&[
            "-v=5",
            "--csi-address=$(ADDRESS)",
            "-leader-election",
            "--http-endpoint=:8080",
            "-timeout",
            "1m",
            "--worker-threads=100",
            "-feature-gates=ReleaseLeaderElectionOnExit=true,MutableCSINodeAllocatableCount=false",
            "--max-grpc-log-length=-1",
            "--default-fstype=ext4",
        ])
        .unwrap();
        assert_eq!(cli.common.logging.verbosity, 5);
        assert!(cli.common.leader_election.leader_election);
        assert_eq!(cli.timeout, Duration::from_secs(60));
        assert_eq!(cli.worker_threads, 100);
        assert!(cli.feature_gates.release_leader_election_on_exit);
        assert!(!cli.feature_gates.mutable_csinode_allocatable_count);
        assert_eq!(cli.default_fstype, "ext4");
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--feature-gates=Unknown=true"]).is_err());
        assert!(parse(&["--feature-gates=ReleaseLeaderElectionOnExit"]).is_err());
        assert!(parse(&["--feature-gates=ReleaseLeaderElectionOnExit=maybe"]).is_err());
        assert!(parse(&["--timeout=15"]).is_err());
        assert!(parse(&["--worker-threads=-1"]).is_err());
        assert!(
            parse(&["--master=x"]).is_err(),
            "the attacher has no --master"
        );
        assert_eq!(
            parse(&["--worker-threads=0"]).unwrap().validate(),
            Err(InvalidFlags::ZeroWorkers)
        );
    }

    #[test]
    fn feature_gate_table() {
        assert_eq!(parse_feature_gates(""), Ok(FeatureGates::default()));
        assert_eq!(
            parse_feature_gates("AllAlpha=true"),
            Ok(FeatureGates {
                release_leader_election_on_exit: true,
                mutable_csinode_allocatable_count: true
            })
        );
        assert_eq!(
            parse_feature_gates("unknown=true").unwrap_err(),
            "unrecognized feature gate: unknown"
        );
    }
}
