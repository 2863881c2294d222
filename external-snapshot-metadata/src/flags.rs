//! Command-line flags: upstream csi-snapshot-metadata v1.1.0's, in Go `flag` syntax, with its
//! defaults and its klog flags. It has no Lease and none of csi-lib-utils' standard flags; the
//! runtime reads what it needs of these through [`SidecarCli::complete`].

use std::time::Duration;

use clap::Parser;
use sidecar_kit::process::flags::{
    CommonFlags, CsiAddressFlag, KlogFlags, KubeFlags, parse_go_bool, parse_go_duration,
};
use sidecar_kit::runtime::SidecarCli;
use sidecar_kit::runtime::startup::Greeting;

/// The longest a stream may last by default, in minutes (also what zero or less means).
pub const DEFAULT_STREAMING_MINUTES: i64 = 10;
/// Streams in flight by default: each holds a driver stream and up to its share of the relay's
/// bytes, so that all of them fit the manifest's memory limit with room to spare.
pub const DEFAULT_MAX_STREAMS: u32 = 100;
/// Client connections open at once by default.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 100;

/// csi-snapshot-metadata: serves the Kubernetes SnapshotMetadata API (changed block tracking) to
/// backup applications over TLS, from the CSI driver's SnapshotMetadata service.
#[derive(Parser, Clone, Debug)]
#[command(name = "csi-snapshot-metadata", about, long_about = None, disable_version_flag = true)]
pub struct Cli {
    #[command(flatten)]
    pub csi: CsiAddressFlag,

    /// Time limit of the driver's identity calls (GetPluginInfo, Probe, GetPluginCapabilities);
    /// the streams are bounded by --max-streaming-duration-min
    #[arg(long, default_value = "1m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// TCP port of the TLS gRPC server, on all interfaces
    #[arg(long, default_value_t = 50051, value_name = "PORT")]
    pub port: i64,

    /// Certificate of the TLS server (PEM, with its chain); reloaded when the file changes
    #[arg(long, env = "TLS_CERT_PATH", default_value = "", value_name = "PATH")]
    pub tls_cert: String,

    /// Private key of the TLS server (PEM); reloaded when the file changes
    #[arg(long, env = "TLS_KEY_PATH", default_value = "", value_name = "PATH")]
    pub tls_key: String,

    /// Lowest TLS version accepted: VersionTLS12 or VersionTLS13 (empty: VersionTLS12)
    #[arg(long, default_value = "", value_name = "VERSION")]
    pub tls_min_version: String,

    /// Comma-separated TLS 1.2 cipher suites in Go's names (empty: every AEAD suite; TLS 1.3's
    /// are always on)
    #[arg(long, default_value = "", value_name = "SUITES")]
    pub tls_cipher_suites: String,

    /// Comma-separated key exchange curves in order of preference: X25519, CurveP256,
    /// CurveP384 (empty: all three, X25519 first)
    #[arg(long, default_value = "", value_name = "CURVES")]
    pub tls_curve_preferences: String,

    /// Audience the backup applications' tokens must be issued for; empty: the one of the
    /// SnapshotMetadataService object named after the driver
    #[arg(long, default_value = "", value_name = "AUDIENCE")]
    pub audience: String,

    /// The longest one stream may last, in minutes (zero or less: 10)
    #[arg(long, default_value_t = DEFAULT_STREAMING_MINUTES, allow_negative_numbers = true,
          value_name = "MINUTES")]
    pub max_streaming_duration_min: i64,

    /// Most SnapshotMetadata streams in flight, all connections together; a request past it
    /// is refused with ResourceExhausted (not in upstream's sidecar, which has no bound)
    #[arg(long, default_value_t = DEFAULT_MAX_STREAMS, value_parser = clap::value_parser!(u32).range(1..),
          value_name = "COUNT")]
    pub max_streams: u32,

    /// Most client connections open at once; a connection past it is closed at once (not in
    /// upstream's sidecar, which has no bound)
    #[arg(long, default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..),
          value_name = "COUNT")]
    pub max_connections: u32,

    #[command(flatten)]
    pub kube: KubeFlags,

    /// TCP address (host:port, or :port for all interfaces) of the HTTP server for /health and
    /// metrics
    #[arg(long, default_value = ":8080", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// HTTP path of the Prometheus metrics
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,

    /// Serve no metrics (the HTTP server still answers /health)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub disable_metrics: bool,

    /// Print the version and exit
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub version: bool,

    /// Trace requests to the OpenTelemetry collector a TracingConfiguration file names (as
    /// kube-apiserver's --tracing-config-file: its OTLP/gRPC endpoint and
    /// samplingRatePerMillion); the OTEL_* variables configure it too. Not an upstream flag
    #[arg(long, value_name = "PATH")]
    pub tracing_config_file: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub klog: KlogFlags,

    /// What the runtime reads, made of the flags above by `complete`.
    #[arg(skip = CommonFlags::defaults())]
    pub common: CommonFlags,
}

impl Cli {
    /// The longest one stream may last.
    pub fn max_streaming_duration(&self) -> Duration {
        let minutes = if self.max_streaming_duration_min > 0 {
            self.max_streaming_duration_min
        } else {
            DEFAULT_STREAMING_MINUTES
        };
        Duration::from_secs(minutes.unsigned_abs().saturating_mul(60))
    }

    /// The TLS versions, suites and curves the flags ask for.
    pub fn tls_settings(&self) -> Result<crate::tls::Settings, InvalidFlags> {
        crate::tls::Settings::from_flags(
            &self.tls_min_version,
            &self.tls_cipher_suites,
            &self.tls_curve_preferences,
        )
        .map_err(InvalidFlags::Tls)
    }

    /// The TLS port, checked.
    pub fn tls_port(&self) -> Result<u16, InvalidFlags> {
        u16::try_from(self.port)
            .ok()
            .filter(|port| *port > 0)
            .ok_or(InvalidFlags::Port(self.port))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InvalidFlags {
    #[error("missing --csi-address")]
    CsiAddress,
    #[error("--timeout must not be zero")]
    Timeout,
    #[error("invalid --port {0}: expected a port number from 1 to 65535")]
    Port(i64),
    #[error("missing TLSCertFile: give --tls-cert or $TLS_CERT_PATH (the server speaks TLS only)")]
    TlsCert,
    #[error("missing TLSKeyFile: give --tls-key or $TLS_KEY_PATH (the server speaks TLS only)")]
    TlsKey,
    #[error("{0}")]
    Tls(String),
}

impl SidecarCli for Cli {
    type Invalid = InvalidFlags;

    fn common(&self) -> &CommonFlags {
        &self.common
    }

    /// The runtime's view of these flags: no leader election, the HTTP endpoint always on, logs
    /// as klog's flags ask.
    fn complete(&mut self) {
        let common = &mut self.common;
        common.csi = self.csi.clone();
        common.kube = self.kube.clone();
        common.leader_election.leader_election = false;
        common.http.http_endpoint = self.http_endpoint.clone();
        common.http.metrics_address.clear();
        // An empty path matches no request: every request path starts with '/'.
        common.http.metrics_path = if self.disable_metrics {
            String::new()
        } else {
            self.metrics_path.clone()
        };
        common.process.version = self.version;
        common.logging = self.klog.logging();
        common.logging.tracing_config_file = self.tracing_config_file.clone();
    }

    /// Upstream's checks, in its order (exit code 1).
    fn validate(&self) -> Result<(), InvalidFlags> {
        if self.csi.csi_address.is_empty() {
            return Err(InvalidFlags::CsiAddress);
        }
        if self.timeout.is_zero() {
            return Err(InvalidFlags::Timeout);
        }
        self.tls_port()?;
        if self.tls_cert.is_empty() {
            return Err(InvalidFlags::TlsCert);
        }
        if self.tls_key.is_empty() {
            return Err(InvalidFlags::TlsKey);
        }
        self.tls_settings()?;
        Ok(())
    }

    /// Every identity call bounded by `--timeout`.
    fn greeting(&self) -> Greeting<'_> {
        Greeting::bounded_by(&self.csi.csi_address, self.timeout)
    }

    fn leader_election(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn parse(args: &[&str]) -> Cli {
        let mut cli: Cli = parse_from(
            std::iter::once("csi-snapshot-metadata").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
        .unwrap();
        cli.complete();
        cli
    }

    #[test]
    fn defaults_are_upstream_s() {
        let cli = parse(&["--tls-cert=c", "--tls-key=k"]);
        assert_eq!(cli.csi.csi_address, "/run/csi/socket");
        assert_eq!(cli.timeout, Duration::from_secs(60));
        assert_eq!(cli.tls_port(), Ok(50051));
        assert_eq!(cli.max_streaming_duration(), Duration::from_secs(600));
        assert_eq!(cli.kube.kube_api_qps, 5.0);
        assert_eq!(cli.kube.kube_api_burst, 10);
        assert_eq!(cli.common.http.http_endpoint, ":8080");
        assert_eq!(cli.common.http.metrics_path, "/metrics");
        assert!(!cli.common.leader_election.leader_election);
        assert_eq!(cli.validate(), Ok(()));
    }

    #[test]
    fn klog_flags_are_accepted_in_go_syntax() {
        let cli = parse(&[
            "-v=5",
            "-logtostderr=false",
            "-log_dir=/tmp",
            "-skip_headers",
            "-stderrthreshold=ERROR",
            "--tls-cert=c",
            "--tls-key=k",
        ]);
        assert_eq!(cli.common.logging.verbosity, 5);
        assert_eq!(cli.klog.log_dir, "/tmp");
        assert!(cli.klog.skip_headers);
    }

    #[test]
    fn tls_is_mandatory_and_the_port_checked() {
        assert_eq!(
            parse(&["--tls-key=k"]).validate(),
            Err(InvalidFlags::TlsCert)
        );
        assert_eq!(
            parse(&["--tls-cert=c"]).validate(),
            Err(InvalidFlags::TlsKey)
        );
        assert_eq!(
            parse(&["--tls-cert=c", "--tls-key=k", "--port=0"]).validate(),
            Err(InvalidFlags::Port(0))
        );
        assert_eq!(
            parse(&["--tls-cert=c", "--tls-key=k", "--port=70000"]).validate(),
            Err(InvalidFlags::Port(70000))
        );
    }

    #[test]
    fn disabled_metrics_serve_no_path_and_a_non_positive_duration_is_ten_minutes() {
        let cli = parse(&["--disable-metrics", "--max-streaming-duration-min=-3"]);
        assert_eq!(cli.common.http.metrics_path, "");
        assert_eq!(cli.max_streaming_duration(), Duration::from_secs(600));
    }
}
