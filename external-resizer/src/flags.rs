//! Command-line flags: upstream csi-resizer's, in Go `flag` syntax, with its defaults.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{
    CommonFlags, feature_gate_pairs, parse_go_bool, parse_go_duration,
};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

/// The feature gates upstream accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Alpha, default off: the `volume.alpha.kubernetes.io/pre-resize-capacity` PV annotation
    /// while a node expansion is pending.
    pub annotate_fs_resize: bool,
    /// GA, default on: the `allocatedResources`/`allocatedResourceStatuses` state machine, with
    /// recovery from a failed expansion to a smaller size.
    pub recover_volume_expansion_failure: bool,
    /// GA, default on: VolumeAttributesClass changes through ControllerModifyVolume. `None`
    /// when not given: then it follows whether the API server serves
    /// `storage.k8s.io/v1` VolumeAttributesClasses.
    pub volume_attributes_class: Option<bool>,
    /// Alpha, default off: release the leader Lease on graceful shutdown (our kit does by
    /// default already, `--leader-election-release-on-exit`).
    pub release_leader_election_on_exit: bool,
    /// A gate this resizer does not know: refused after parsing (exit 1), as upstream sets the
    /// gates from the parsed map.
    pub unknown: Option<String>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            annotate_fs_resize: false,
            recover_volume_expansion_failure: true,
            volume_attributes_class: None,
            release_leader_election_on_exit: false,
            unknown: None,
        }
    }
}

/// Parses `--feature-gates` as component-base does: `Name=bool,Name2=bool`; malformed text is a
/// flag error, an unknown gate is kept for [`Cli::validate`]. `AllAlpha` and `AllBeta` set
/// every alpha (beta) gate.
pub fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for (name, value) in feature_gate_pairs(text)? {
        match name.as_str() {
            "AnnotateFsResize" => gates.annotate_fs_resize = value,
            "RecoverVolumeExpansionFailure" => gates.recover_volume_expansion_failure = value,
            "VolumeAttributesClass" => gates.volume_attributes_class = Some(value),
            "ReleaseLeaderElectionOnExit" => gates.release_leader_election_on_exit = value,
            "AllAlpha" => {
                gates.annotate_fs_resize = value;
                gates.release_leader_election_on_exit = value;
            }
            "AllBeta" => {}
            other => gates.unknown = Some(other.to_string()),
        }
    }
    Ok(gates)
}

/// CSI external-resizer: expands volumes whose claims ask for more storage, through the driver's
/// ControllerExpandVolume, and changes their VolumeAttributesClass through ControllerModifyVolume.
#[derive(Parser, Clone, Debug)]
#[command(name = "csi-resizer", disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonFlags,

    /// Address of the Kubernetes API server (overrides the kubeconfig's; only out of cluster)
    #[arg(long, default_value = "", value_name = "URL")]
    pub master: String,

    /// How often every claim is looked at again
    #[arg(long, default_value = "10m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync_period: Duration,

    /// Number of claims worked on at once
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub workers: usize,

    /// Add csi.storage.k8s.io/pvc/name, csi.storage.k8s.io/pvc/namespace and
    /// csi.storage.k8s.io/pv/name to the mutable parameters of ControllerModifyVolume
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub extra_modify_metadata: bool,

    /// Timeout of every call to the driver: each Probe attempt, the identity calls,
    /// ControllerExpandVolume and ControllerModifyVolume
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Initial retry interval of a failed expansion or modification; doubles on every failure
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed expansion or modification; also how long an
    /// infeasible request waits before it is tried again unchanged
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Do not retry an expansion the driver refused as in use (FailedPrecondition) while a
    /// running pod uses the claim; it is retried as soon as no running pod does
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub handle_volume_inuse_error: bool,

    /// Feature gates, as Name=true|false,...: AnnotateFsResize (alpha, default false),
    /// RecoverVolumeExpansionFailure (GA, default true), VolumeAttributesClass (GA, default true
    /// when the API server serves VolumeAttributesClasses), ReleaseLeaderElectionOnExit (alpha,
    /// default false)
    #[arg(long, default_value = "", value_parser = parse_feature_gates, value_name = "GATES")]
    pub feature_gates: FeatureGates,
}

/// Settings refused after parsing (exit code 1, as upstream's checks).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("unrecognized feature gate: {0}")]
    UnknownGate(String),
    #[error("option -workers must be greater than zero")]
    ZeroWorkers,
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
        if self.workers == 0 {
            return Err(InvalidFlags::ZeroWorkers);
        }
        Ok(())
    }

    /// Every call bounded by `--timeout`.
    fn greeting(&self) -> Greeting<'_> {
        Greeting::bounded_by(&self.common.csi.csi_address, self.timeout)
    }

    fn master(&self) -> &str {
        &self.master
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
            std::iter::once("csi-resizer").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    #[test]
    fn defaults_are_upstreams() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.resync_period, Duration::from_secs(600));
        assert_eq!(cli.workers, 10);
        assert!(!cli.extra_modify_metadata);
        assert_eq!(cli.timeout, Duration::from_secs(10));
        assert_eq!(cli.retry_interval_start, Duration::from_secs(1));
        assert_eq!(cli.retry_interval_max, Duration::from_secs(300));
        assert!(cli.handle_volume_inuse_error);
        assert_eq!(cli.feature_gates, FeatureGates::default());
        assert_eq!(cli.common.kube.kube_api_qps, 5.0);
        assert_eq!(cli.common.kube.kube_api_burst, 10);
        assert_eq!(cli.validate(), Ok(()));
    }

    #[test]
    fn go_syntax_and_gates() {
        let cli = parse(&[
            "-workers=3",
            "--handle-volume-inuse-error=false",
            "-extra-modify-metadata",
            "--timeout=1m30s",
            "--feature-gates=AnnotateFsResize=true,VolumeAttributesClass=false",
        ])
        .unwrap();
        assert_eq!(cli.workers, 3);
        assert!(!cli.handle_volume_inuse_error);
        assert!(cli.extra_modify_metadata);
        assert_eq!(cli.timeout, Duration::from_secs(90));
        assert!(cli.feature_gates.annotate_fs_resize);
        assert_eq!(cli.feature_gates.volume_attributes_class, Some(false));
        assert!(cli.feature_gates.recover_volume_expansion_failure);
        let unknown = parse(&["--feature-gates=Nope=true"]).unwrap();
        assert_eq!(
            unknown.validate(),
            Err(InvalidFlags::UnknownGate("Nope".into()))
        );
        assert!(parse(&["--feature-gates=Nope"]).is_err(), "malformed");
        assert!(
            parse(&["--worker-threads=3"]).is_err(),
            "not a resizer flag"
        );
    }

    #[test]
    fn refused_settings() {
        let zero = parse(&["--workers=0"]).unwrap();
        assert_eq!(zero.validate(), Err(InvalidFlags::ZeroWorkers));
    }
}
