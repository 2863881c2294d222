//! Command-line flags, as upstream's livenessprobe declares them (Go `flag` syntax), and the
//! HTTP servers they ask for.

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{
    CsiAddressFlag, HttpFlags, LoggingFlags, ProcessFlags, parse_go_duration,
};

/// The port `--health-port` defaults to.
pub const DEFAULT_HEALTH_PORT: &str = "9808";
/// The path kubelet's liveness check asks.
pub const HEALTHZ_PATH: &str = "/healthz";

/// livenessprobe: serves the CSI driver's Probe as an HTTP health check.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "livenessprobe",
    about,
    long_about = None,
    disable_version_flag = true,
    mut_arg("http_endpoint", |arg| arg.help(
        "TCP address (host:port, or :port for all interfaces) of the HTTP server for /healthz \
         and metrics; replaces --health-port. Empty: /healthz on --health-port, no metrics"
    )),
    mut_arg("metrics_address", |arg| arg.help(
        "(deprecated) TCP address of a separate metrics server, next to /healthz on \
         --health-port; exclusive with --http-endpoint"
    )),
)]
pub struct Cli {
    #[command(flatten)]
    pub csi: CsiAddressFlag,

    /// Time limit of one health check: reconnecting to the driver when needed and its Probe call
    #[arg(long, default_value = "3s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub probe_timeout: Duration,

    /// (deprecated) TCP port of the health check server on all IPv4 interfaces (0.0.0.0); cannot
    /// be set to another value together with --http-endpoint
    #[arg(long, default_value = DEFAULT_HEALTH_PORT, value_name = "PORT")]
    pub health_port: String,

    #[command(flatten)]
    pub http: HttpFlags,

    #[command(flatten)]
    pub process: ProcessFlags,

    #[command(flatten)]
    pub logging: LoggingFlags,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FlagError {
    #[error("only one of --health-port and --http-endpoint can be explicitly set")]
    HealthPortWithHttpEndpoint,
    #[error("only one of --metrics-address and --http-endpoint can be explicitly set")]
    MetricsAddressWithHttpEndpoint,
    #[error("invalid --health-port {0:?}: expected a port number from 0 to 65535")]
    HealthPort(String),
}

/// Which HTTP servers run and what each serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServePlan {
    /// Listen address (Go syntax) of the server with `/healthz`.
    pub health_address: String,
    /// Metrics path served next to `/healthz` (`--http-endpoint`).
    pub metrics_with_health: Option<String>,
    /// A separate metrics server (`--metrics-address`): its address and path.
    pub metrics_server: Option<(String, String)>,
}

impl ServePlan {
    /// Upstream's rules: `--http-endpoint` serves `/healthz` and metrics and excludes an explicit
    /// `--health-port` (any value but the default) and `--metrics-address`; without it `/healthz`
    /// listens on `0.0.0.0:<health-port>` and metrics only on `--metrics-address`, if given.
    pub fn from_cli(cli: &Cli) -> Result<Self, FlagError> {
        let http = &cli.http;
        if !http.http_endpoint.is_empty() {
            if cli.health_port != DEFAULT_HEALTH_PORT {
                return Err(FlagError::HealthPortWithHttpEndpoint);
            }
            if !http.metrics_address.is_empty() {
                return Err(FlagError::MetricsAddressWithHttpEndpoint);
            }
            return Ok(Self {
                health_address: http.http_endpoint.clone(),
                metrics_with_health: Some(http.metrics_path.clone()),
                metrics_server: None,
            });
        }
        let port: u16 = cli
            .health_port
            .parse()
            .map_err(|_| FlagError::HealthPort(cli.health_port.clone()))?;
        Ok(Self {
            health_address: format!("0.0.0.0:{port}"),
            metrics_with_health: None,
            metrics_server: (!http.metrics_address.is_empty())
                .then(|| (http.metrics_address.clone(), http.metrics_path.clone())),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("livenessprobe").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    #[test]
    fn defaults_match_upstream() {
        let c = cli(&[]).unwrap();
        assert_eq!(c.csi.csi_address, "/run/csi/socket");
        assert_eq!(c.probe_timeout, Duration::from_secs(3));
        assert_eq!(c.health_port, "9808");
        assert_eq!(c.http.http_endpoint, "");
        assert_eq!(c.http.metrics_address, "");
        assert_eq!(c.http.metrics_path, "/metrics");
        assert_eq!(c.logging.verbosity, 0);
        assert!(!c.process.version);
        assert!(!c.process.automaxprocs);
        assert_eq!(
            ServePlan::from_cli(&c).unwrap(),
            ServePlan {
                health_address: "0.0.0.0:9808".into(),
                metrics_with_health: None,
                metrics_server: None,
            }
        );
    }

    #[test]
    fn go_syntax_as_in_manifests() {
        let c = cli(&[
            "-csi-address=/csi/csi.sock",
            "-probe-timeout",
            "10s",
            "-health-port=9898",
            "-v=5",
            "--automaxprocs",
        ])
        .unwrap();
        assert_eq!(c.csi.csi_address, "/csi/csi.sock");
        assert_eq!(c.probe_timeout, Duration::from_secs(10));
        assert_eq!(c.logging.verbosity, 5);
        assert!(c.process.automaxprocs);
        assert_eq!(
            ServePlan::from_cli(&c).unwrap().health_address,
            "0.0.0.0:9898"
        );
    }

    #[test]
    fn http_endpoint_serves_both() {
        let c = cli(&["--http-endpoint=:9809", "--metrics-path=/m"]).unwrap();
        assert_eq!(
            ServePlan::from_cli(&c).unwrap(),
            ServePlan {
                health_address: ":9809".into(),
                metrics_with_health: Some("/m".into()),
                metrics_server: None,
            }
        );
        // The default port given explicitly is not "explicitly set", as upstream compares values.
        let c = cli(&["--http-endpoint=:9809", "--health-port=9808"]).unwrap();
        assert!(ServePlan::from_cli(&c).is_ok());
    }

    #[test]
    fn metrics_address_is_a_second_server() {
        let c = cli(&["--metrics-address=:8080"]).unwrap();
        assert_eq!(
            ServePlan::from_cli(&c).unwrap(),
            ServePlan {
                health_address: "0.0.0.0:9808".into(),
                metrics_with_health: None,
                metrics_server: Some((":8080".into(), "/metrics".into())),
            }
        );
    }

    #[test]
    fn conflicts_and_bad_values() {
        let plan = |args: &[&str]| ServePlan::from_cli(&cli(args).unwrap());
        assert_eq!(
            plan(&["--http-endpoint=:9809", "--health-port=9000"]),
            Err(FlagError::HealthPortWithHttpEndpoint)
        );
        assert_eq!(
            plan(&["--http-endpoint=:9809", "--metrics-address=:8080"]),
            Err(FlagError::MetricsAddressWithHttpEndpoint)
        );
        assert_eq!(
            plan(&["--health-port=http"]),
            Err(FlagError::HealthPort("http".into()))
        );
        for bad in [
            &["--probe-timeout=3"][..],
            &["--probe-timeout=-1s"],
            &["--probe-timeout=soon"],
            &["--version", "false"],
            &["--no-such-flag"],
        ] {
            assert!(cli(bad).is_err(), "{bad:?}");
        }
    }
}
