//! Command-line flags: upstream csi-external-health-monitor-controller's, in Go `flag` syntax,
//! with its defaults.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{CommonFlags, parse_go_bool, parse_go_duration};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

/// CSI external-health-monitor-controller: reports the volumes the driver finds abnormal, and
/// the claims of pods on failed nodes, as Events on the claims.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "csi-external-health-monitor-controller",
    disable_version_flag = true
)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonFlags,

    /// How often each volume is checked with ControllerGetVolume (drivers without
    /// LIST_VOLUMES), and how soon a node is looked at again
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub monitor_interval: Duration,

    /// Resync interval of the informers (accepted for compatibility: the periodic lists of
    /// --volume-list-add-interval and --node-list-add-interval do this work)
    #[arg(long, default_value = "10m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub resync: Duration,

    /// Timeout of each Probe attempt, of each ListVolumes page and of each ControllerGetVolume
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// How often ListVolumes is called to check the volumes' condition (drivers with
    /// LIST_VOLUMES)
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub list_volumes_interval: Duration,

    /// How often every volume of the driver is put in the check queue again (the queue holds
    /// each volume once)
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub volume_list_add_interval: Duration,

    /// How often every node is put in the node queue again (with --enable-node-watcher)
    #[arg(long, default_value = "5m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub node_list_add_interval: Duration,

    /// Number of ControllerGetVolume calls in flight at most
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub worker_threads: u32,

    /// Report the claims of pods on nodes that failed (NotReady for more than 5 minutes)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub enable_node_watcher: bool,
}

/// Settings upstream refuses after parsing (it exits with code 1, not 2).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("Option --worker-threads must be greater than zero")]
    ZeroWorkers,
    #[error("{0} must be greater than zero")]
    ZeroInterval(&'static str),
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
        // Upstream spins on a zero interval; a check loop without a pause is refused here.
        for (name, interval) in [
            ("--monitor-interval", self.monitor_interval),
            ("--list-volumes-interval", self.list_volumes_interval),
        ] {
            if interval.is_zero() {
                return Err(InvalidFlags::ZeroInterval(name));
            }
        }
        Ok(())
    }

    /// Every call bounded by `--timeout` (upstream gives its five start-up calls one second
    /// in all).
    fn greeting(&self) -> Greeting<'_> {
        Greeting::bounded_by(&self.common.csi.csi_address, self.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("csi-external-health-monitor-controller").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    #[test]
    fn defaults_match_upstream() {
        let cli = parse(&[]).unwrap();
        assert_eq!(cli.monitor_interval, Duration::from_secs(60));
        assert_eq!(cli.resync, Duration::from_secs(600));
        assert_eq!(cli.timeout, Duration::from_secs(15));
        assert_eq!(cli.list_volumes_interval, Duration::from_secs(300));
        assert_eq!(cli.volume_list_add_interval, Duration::from_secs(300));
        assert_eq!(cli.node_list_add_interval, Duration::from_secs(300));
        assert_eq!(cli.worker_threads, 10);
        assert!(!cli.enable_node_watcher);
        assert_eq!(cli.common.csi.csi_address, "/run/csi/socket");
        assert_eq!(cli.common.kube.kube_api_qps, 5.0);
        assert_eq!(cli.common.kube.kube_api_burst, 10);
        assert!(cli.validate().is_ok());
    }

    #[test]
    fn go_syntax_as_deployments_write_it() {
        let cli = parse(&[
            "--v=5",
            "--csi-address=$(ADDRESS)",
            "--leader-election",
            "--http-endpoint=:8080",
            "-monitor-interval",
            "30s",
            "--enable-node-watcher=true",
            "-worker-threads=3",
        ])
        .unwrap();
        assert_eq!(cli.common.logging.verbosity, 5);
        assert!(cli.common.leader_election.leader_election);
        assert_eq!(cli.monitor_interval, Duration::from_secs(30));
        assert!(cli.enable_node_watcher);
        assert_eq!(cli.worker_threads, 3);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--timeout=15"]).is_err());
        assert!(parse(&["--worker-threads=-1"]).is_err());
        assert!(parse(&["--enable-node-watcher=maybe"]).is_err());
        assert!(parse(&["--master=x"]).is_err(), "upstream has no --master");
        assert!(
            parse(&["--feature-gates=A=true"]).is_err(),
            "upstream has no --feature-gates"
        );
        assert_eq!(
            parse(&["--worker-threads=0"]).unwrap().validate(),
            Err(InvalidFlags::ZeroWorkers)
        );
        assert_eq!(
            parse(&["--list-volumes-interval=0s"]).unwrap().validate(),
            Err(InvalidFlags::ZeroInterval("--list-volumes-interval"))
        );
    }
}
