//! Command-line flags: upstream csi-provisioner's, in pflag (GNU) syntax, with its defaults.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{
    CommonFlags, feature_gate_pairs, parse_go_bool, parse_go_duration,
};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

/// The feature gates upstream accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// GA: topology-aware provisioning (still settable).
    pub topology: bool,
    /// Alpha, default off: `dataSourceRef.namespace`.
    pub cross_namespace_volume_data_source: bool,
    /// GA, default on: `spec.volumeAttributesClassName`. `None` when not given, so that start-up
    /// can turn it off on clusters without the v1 API, as upstream does.
    pub volume_attributes_class: Option<bool>,
    /// Alpha, default off: release the leader Lease on graceful shutdown.
    pub release_leader_election_on_exit: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            topology: true,
            cross_namespace_volume_data_source: false,
            volume_attributes_class: None,
            release_leader_election_on_exit: false,
        }
    }
}

/// Parses `--feature-gates` as component-base does: `Name=bool,Name2=bool`. Unknown gates are
/// errors; `AllAlpha` sets every alpha gate, `AllBeta` every beta gate (there are none).
pub fn parse_feature_gates(text: &str) -> Result<FeatureGates, String> {
    let mut gates = FeatureGates::default();
    for (name, value) in feature_gate_pairs(text)? {
        match name.as_str() {
            "Topology" => gates.topology = value,
            "CrossNamespaceVolumeDataSource" => gates.cross_namespace_volume_data_source = value,
            "VolumeAttributesClass" => gates.volume_attributes_class = Some(value),
            "ReleaseLeaderElectionOnExit" => gates.release_leader_election_on_exit = value,
            "AllAlpha" => {
                gates.cross_namespace_volume_data_source = value;
                gates.release_leader_election_on_exit = value;
            }
            "AllBeta" => {}
            other => return Err(format!("unrecognized feature gate: {other}")),
        }
    }
    Ok(gates)
}

/// CSI external-provisioner: provisions and deletes volumes for PersistentVolumeClaims through
/// the driver's CreateVolume and DeleteVolume, and writes their PersistentVolumes.
#[derive(Parser, Clone, Debug)]
#[command(name = "csi-provisioner", disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonFlags,

    /// Address of the Kubernetes API server (overrides the kubeconfig's; only out of cluster)
    #[arg(long, default_value = "", value_name = "URL")]
    pub master: String,

    /// Prefix of PersistentVolume names and of CreateVolume names
    #[arg(long, default_value = "pvc", value_name = "PREFIX")]
    pub volume_name_prefix: String,

    /// Length of the claim UID in volume names, without dashes (-1: the whole UID, with dashes)
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, value_name = "N")]
    pub volume_name_uuid_length: i32,

    /// Initial retry interval of a failed provisioning or deletion; doubles on every failure
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_start: Duration,

    /// Maximum retry interval of a failed provisioning or deletion, and the retry interval of
    /// claims the driver found infeasible (InvalidArgument)
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub retry_interval_max: Duration,

    /// Number of claim workers, and of volume (deletion) workers
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub worker_threads: usize,

    /// Number of workers of the cloning protection controller
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub cloning_protection_threads: usize,

    /// Period of the sweep for orphaned snapshot finalizers (0: disabled)
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Number of CSIStorageCapacity workers
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub capacity_threads: usize,

    /// Timeout of every CSI call (each Probe attempt, identity calls, CreateVolume, DeleteVolume,
    /// GetCapacity)
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// Late binding: pass only the selected node's topology to CreateVolume
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub strict_topology: bool,

    /// Immediate binding: pass the topology of the whole cluster to CreateVolume (false: none,
    /// unless the StorageClass has allowedTopologies)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub immediate_topology: bool,

    /// Add csi.storage.k8s.io/pvc/name, csi.storage.k8s.io/pvc/namespace and
    /// csi.storage.k8s.io/pv/name to the CreateVolume parameters
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// Serve /debug/pprof on the HTTP endpoint (a Go facility: answered with 404 here)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub enable_pprof: bool,

    /// Filesystem type of volumes whose StorageClass names none (not for block volumes)
    #[arg(long, default_value = "", value_name = "FSTYPE")]
    pub default_fstype: String,

    /// Client-side rate limit of the CSIStorageCapacity client (requests per second)
    #[arg(long, default_value_t = 1.0, value_name = "QPS")]
    pub kube_api_capacity_qps: f64,

    /// Burst of the CSIStorageCapacity client
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub kube_api_capacity_burst: u32,

    /// Publish CSIStorageCapacity objects
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub enable_capacity: bool,

    /// Also publish capacity for StorageClasses with Immediate binding
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub capacity_for_immediate_binding: bool,

    /// How often GetCapacity is called for each CSIStorageCapacity object
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub capacity_poll_interval: Duration,

    /// Owner of the CSIStorageCapacity objects, counted from the pod: -1 none, 0 the pod, 1 its
    /// StatefulSet, DaemonSet or ReplicaSet, 2 the Deployment
    #[arg(
        long,
        default_value_t = 1,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub capacity_ownerref_level: i32,

    /// Distributed provisioning: one provisioner per node ($NODE_NAME) provisions the volumes of
    /// its node
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub node_deployment: bool,

    /// With --node-deployment, also take claims with Immediate binding
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub node_deployment_immediate_binding: bool,

    /// With --node-deployment, the initial random delay before claiming an Immediate claim
    #[arg(long, default_value = "20s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_deployment_base_delay: Duration,

    /// With --node-deployment, the longest delay before claiming an Immediate claim
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_deployment_max_delay: Duration,

    /// Set readOnly in the PersistentVolume when the claim's only access mode is ReadOnlyMany
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub controller_publish_readonly: bool,

    /// Refuse snapshot restores that change the volume mode, unless the VolumeSnapshotContent
    /// allows it
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub prevent_volume_mode_conversion: bool,

    /// Feature gates, as Name=true|false,...: Topology (GA, true),
    /// CrossNamespaceVolumeDataSource (alpha, false), VolumeAttributesClass (GA, true; off when
    /// the cluster lacks storage.k8s.io/v1 VolumeAttributesClass), ReleaseLeaderElectionOnExit
    /// (alpha, false)
    #[arg(long, default_value = "", value_parser = parse_feature_gates, value_name = "GATES")]
    pub feature_gates: FeatureGates,

    /// Removed upstream: the driver name comes from GetPluginInfo (accepted and ignored)
    #[arg(long, hide = true, value_name = "NAME")]
    pub provisioner: Option<String>,

    /// Removed upstream: the driver connection is waited for without a limit (accepted and
    /// ignored)
    #[arg(long, hide = true, value_name = "DURATION")]
    pub connection_timeout: Option<String>,

    /// Removed upstream: replaced by --leader-election (accepted, and taken as it)
    #[arg(long, hide = true, num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_leader_election: Option<bool>,

    /// Removed upstream: Leases are the only lock (accepted and ignored)
    #[arg(long, hide = true, value_name = "TYPE")]
    pub leader_election_type: Option<String>,
}

/// Settings upstream refuses after parsing (it exits with code 1, not 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("--worker-threads must be greater than zero")]
    ZeroWorkers,
    #[error("volume name prefix cannot be of length 0")]
    EmptyPrefix,
    #[error("--volume-name-uuid-length must be -1 or between 1 and 32, not {0}")]
    UuidLength(i32),
    #[error("only one of --http-endpoint and --metrics-address can be set")]
    BothEndpoints,
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
        if self.volume_name_prefix.is_empty() {
            return Err(InvalidFlags::EmptyPrefix);
        }
        let uuid = self.volume_name_uuid_length;
        if uuid != -1 && !(1..=32).contains(&uuid) {
            return Err(InvalidFlags::UuidLength(uuid));
        }
        if !self.common.http.http_endpoint.is_empty()
            && !self.common.http.metrics_address.is_empty()
        {
            return Err(InvalidFlags::BothEndpoints);
        }
        Ok(())
    }

    /// Every call bounded by `--timeout`.
    fn greeting(&self) -> Greeting<'_> {
        Greeting::bounded_by(&self.common.csi.csi_address, self.timeout)
    }

    fn warn(&self) {
        for warning in self.removed_flag_warnings() {
            tracing::warn!("{warning}");
        }
    }

    fn master(&self) -> &str {
        &self.master
    }

    /// `--leader-election`, or the removed flag that meant it.
    fn leader_election(&self) -> bool {
        self.common.leader_election.leader_election || self.enable_leader_election == Some(true)
    }

    fn release_lease_on_exit(&self) -> bool {
        self.feature_gates.release_leader_election_on_exit
    }
}

impl Cli {
    /// The warnings for flags upstream removed; an old manifest keeps working.
    pub fn removed_flag_warnings(&self) -> Vec<&'static str> {
        let mut warnings = Vec::new();
        if self.provisioner.is_some() {
            warnings.push("--provisioner was removed: the driver name comes from the driver's GetPluginInfo; ignoring it");
        }
        if self.connection_timeout.is_some() {
            warnings.push("--connection-timeout was removed: the sidecar waits for the driver without a limit, logging while it waits; ignoring it");
        }
        if self.enable_leader_election.is_some() {
            warnings.push("--enable-leader-election was removed: use --leader-election; taking it as --leader-election");
        }
        if self.leader_election_type.is_some() {
            warnings.push(
                "--leader-election-type was removed: Leases are the only lock type; ignoring it",
            );
        }
        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("csi-provisioner").chain(args.iter().copied()),
            FlagSyntax::Gnu,
        )
    }

    #[test]
    fn defaults_match_upstream_code() {
        let cli = parse(&[]).unwrap();
        assert_eq!(
            cli.timeout,
            Duration::from_secs(10),
            "the code's 10s, not the README's 15s"
        );
        assert_eq!(cli.volume_name_prefix, "pvc");
        assert_eq!(cli.volume_name_uuid_length, -1);
        assert_eq!(cli.retry_interval_start, Duration::from_secs(1));
        assert_eq!(cli.retry_interval_max, Duration::from_secs(300));
        assert_eq!(cli.worker_threads, 100);
        assert_eq!(cli.cloning_protection_threads, 1);
        assert_eq!(cli.snapshot_orphan_sweep_interval, Duration::from_secs(300));
        assert_eq!(cli.capacity_threads, 1);
        assert!(!cli.strict_topology);
        assert!(cli.immediate_topology);
        assert!(!cli.extra_create_metadata);
        assert!(!cli.enable_pprof);
        assert_eq!(cli.default_fstype, "");
        assert_eq!(cli.kube_api_capacity_qps, 1.0);
        assert_eq!(cli.kube_api_capacity_burst, 5);
        assert!(!cli.enable_capacity);
        assert!(!cli.capacity_for_immediate_binding);
        assert_eq!(cli.capacity_poll_interval, Duration::from_secs(60));
        assert_eq!(cli.capacity_ownerref_level, 1);
        assert!(!cli.node_deployment);
        assert!(cli.node_deployment_immediate_binding);
        assert_eq!(cli.node_deployment_base_delay, Duration::from_secs(20));
        assert_eq!(cli.node_deployment_max_delay, Duration::from_secs(60));
        assert!(!cli.controller_publish_readonly);
        assert!(cli.prevent_volume_mode_conversion);
        assert_eq!(cli.feature_gates, FeatureGates::default());
        assert_eq!(cli.common.csi.csi_address, "/run/csi/socket");
        assert_eq!(cli.common.kube.kube_api_qps, 5.0);
        assert_eq!(cli.common.kube.kube_api_burst, 10);
        assert!(!cli.leader_election());
        assert!(cli.removed_flag_warnings().is_empty());
        assert_eq!(cli.validate(), Ok(()));
    }

    #[test]
    fn gnu_syntax_as_deployments_write_it() {
        let cli = parse(&[
            "--csi-address=$(ADDRESS)",
            "--leader-election",
            "--http-endpoint=:8080",
            "-v",
            "5",
            "--timeout",
            "30s",
            "--feature-gates=Topology=true,VolumeAttributesClass=false",
            "--extra-create-metadata",
            "--strict-topology=true",
            "--immediate-topology=false",
            "--volume-name-prefix=fooprefix",
            "--volume-name-uuid-length=10",
        ])
        .unwrap();
        assert_eq!(cli.common.logging.verbosity, 5);
        assert!(cli.leader_election());
        assert_eq!(cli.timeout, Duration::from_secs(30));
        assert_eq!(cli.feature_gates.volume_attributes_class, Some(false));
        assert!(cli.extra_create_metadata && cli.strict_topology && !cli.immediate_topology);
        assert_eq!(cli.volume_name_prefix, "fooprefix");
        assert_eq!(cli.volume_name_uuid_length, 10);
        assert_eq!(parse(&["-v=2"]).unwrap().common.logging.verbosity, 2);
    }

    #[test]
    fn removed_flags_are_accepted_with_a_warning() {
        let cli = parse(&[
            "--provisioner=hostpath.csi.k8s.io",
            "--connection-timeout=15s",
            "--enable-leader-election",
            "--leader-election-type=leases",
        ])
        .unwrap();
        assert_eq!(cli.removed_flag_warnings().len(), 4);
        assert!(
            cli.leader_election(),
            "the old flag still turns leader election on"
        );
        assert!(cli.removed_flag_warnings()[2].contains("use --leader-election"));
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--feature-gates=Unknown=true"]).is_err());
        assert!(parse(&["--feature-gates=Topology"]).is_err());
        assert!(parse(&["--timeout=15"]).is_err());
        assert!(parse(&["--worker-threads=-1"]).is_err());
        assert!(
            parse(&["--strict-topology", "false"]).is_err(),
            "pflag takes no separate bool value"
        );
        assert_eq!(
            parse(&["--worker-threads=0"]).unwrap().validate(),
            Err(InvalidFlags::ZeroWorkers)
        );
        assert_eq!(
            parse(&["--volume-name-prefix="]).unwrap().validate(),
            Err(InvalidFlags::EmptyPrefix)
        );
        assert_eq!(
            parse(&["--volume-name-uuid-length=40"]).unwrap().validate(),
            Err(InvalidFlags::UuidLength(40))
        );
        assert_eq!(
            parse(&["--http-endpoint=:8080", "--metrics-address=:8081"])
                .unwrap()
                .validate(),
            Err(InvalidFlags::BothEndpoints)
        );
    }

    #[test]
    fn feature_gate_table() {
        assert_eq!(parse_feature_gates(""), Ok(FeatureGates::default()));
        let all_alpha = parse_feature_gates("AllAlpha=true").unwrap();
        assert!(all_alpha.cross_namespace_volume_data_source);
        assert!(all_alpha.release_leader_election_on_exit);
        assert!(all_alpha.topology);
        assert!(!parse_feature_gates("Topology=false").unwrap().topology);
        assert_eq!(
            parse_feature_gates("unknown=true").unwrap_err(),
            "unrecognized feature gate: unknown"
        );
    }
}
