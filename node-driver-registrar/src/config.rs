//! Command-line flags, in upstream's names, defaults and Go `flag` syntax, and their validation
//! into a [`Plan`].

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use sidecar_kit::driver::endpoint::{self, EndpointError, Platform};
use sidecar_kit::process::flags::{
    CsiAddressFlag, LoggingFlags, ProcessFlags, ValueError, parse_go_bool, parse_go_duration,
};

use crate::paths::{self, PathError};

/// Upstream's deprecated exec-probe mode, a no-op that succeeds.
pub const MODE_KUBELET_REGISTRATION_PROBE: &str = "kubelet-registration-probe";
/// Upstream's default mode: run as the long-lived registrar.
pub const MODE_REGISTRATION: &str = "registration";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "csi-node-driver-registrar",
    about = "Registers a CSI driver with the kubelet's plugin watcher: asks the driver for its name, \
             then serves <plugin-registration-path>/<driver>-reg.sock, which the kubelet finds and \
             calls to register the driver. Flags take one dash or two (-v=5, --v=5)."
)]
pub struct Cli {
    #[command(flatten)]
    pub csi: CsiAddressFlag,

    /// Path of the CSI driver socket on the host, as the kubelet dials it (required). Linux:
    /// /var/lib/kubelet/plugins/<driver>/csi.sock; Windows: C:\var\lib\kubelet\plugins\<driver>\csi.sock
    #[arg(long, default_value = "", value_name = "PATH")]
    pub kubelet_registration_path: String,

    /// Directory in which the registration socket <driver>-reg.sock is created (the kubelet's
    /// plugins_registry directory, usually mounted here)
    #[arg(long, default_value = "/registration", value_name = "DIR")]
    pub plugin_registration_path: String,

    /// Timeout of each GetPluginInfo call to the driver and of the /healthz self-check
    #[arg(long, default_value = "1s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub timeout: Duration,

    /// TCP address (host:port, or :port for all interfaces) of the HTTP server for /healthz;
    /// empty disables it. Only one of --health-port and --http-endpoint can be set
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// (deprecated) TCP port of the /healthz server on all interfaces, as :<port>; 0 or less
    /// disables it. Only one of --health-port and --http-endpoint can be set
    #[arg(
        long,
        default_value_t = 0,
        allow_negative_numbers = true,
        value_name = "PORT"
    )]
    pub health_port: i64,

    /// (deprecated) "registration" (the default) runs the registrar; "kubelet-registration-probe"
    /// exits 0 at once, for exec probes left over from older manifests
    #[arg(long, default_value = MODE_REGISTRATION, value_name = "MODE")]
    pub mode: String,

    /// Accepted for compatibility, no effect: there is no Go runtime to profile, so no
    /// /debug/pprof endpoints are served
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub enable_pprof: bool,

    /// (deprecated) Accepted and ignored, with a warning
    #[arg(long, default_value = "0", value_parser = parse_ignored_duration, value_name = "DURATION")]
    pub connection_timeout: Duration,

    /// How long to wait at start-up for the driver to come up and answer GetPluginInfo (retrying
    /// every second, logging every 10 s) before exiting with code 1
    #[arg(long, default_value = "2m", value_parser = parse_go_duration, value_name = "DURATION")]
    pub driver_startup_timeout: Duration,

    /// How often to check that the registration socket still exists; a deleted socket is
    /// re-created so that the kubelet registers the driver again. 0 disables the check
    #[arg(long, default_value = "5s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub socket_check_interval: Duration,

    #[command(flatten)]
    pub process: ProcessFlags,

    #[command(flatten)]
    pub logging: LoggingFlags,
}

/// Go's `flag.Duration` takes negative values; an ignored flag must not refuse them.
fn parse_ignored_duration(text: &str) -> Result<Duration, ValueError> {
    parse_go_duration(text.strip_prefix('-').unwrap_or(text))
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("kubelet-registration-path is a required parameter")]
    MissingKubeletRegistrationPath,
    #[error("only one of `--health-port` and `--http-endpoint` can be set")]
    BothHttpEndpoints,
    #[error(transparent)]
    KubeletRegistrationPath(#[from] PathError),
    #[error("--csi-address: {0}")]
    CsiAddress(#[from] EndpointError),
    #[error("--plugin-registration-path must not be empty")]
    EmptyRegistrationDir,
    #[error("--timeout must be more than zero")]
    ZeroTimeout,
    #[error("{0}")]
    HttpEndpoint(String),
}

/// Everything the registrar needs to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub csi_address: String,
    /// Returned to kubelet as `PluginInfo.endpoint`.
    pub kubelet_registration_path: String,
    pub registration_dir: PathBuf,
    pub timeout: Duration,
    /// Go listen address of the /healthz server.
    pub http_endpoint: Option<String>,
    pub driver_startup_timeout: Duration,
    /// `None`: a deleted socket is not re-created (upstream's behaviour).
    pub socket_check_interval: Option<Duration>,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `--mode=kubelet-registration-probe`: exit 0 at once.
    Probe,
    Run(Config),
}

/// Validates the flags, in upstream's order: the registration path is required even in probe
/// mode, and probe mode checks nothing else. Returns the plan and warnings to log.
pub fn plan(cli: &Cli, platform: Platform) -> Result<(Plan, Vec<String>), ConfigError> {
    if cli.kubelet_registration_path.is_empty() {
        return Err(ConfigError::MissingKubeletRegistrationPath);
    }
    let mut warnings = Vec::new();
    match cli.mode.as_str() {
        MODE_KUBELET_REGISTRATION_PROBE => return Ok((Plan::Probe, warnings)),
        MODE_REGISTRATION | "" => {}
        other => warnings.push(format!(
            "unknown --mode={other:?} ignored; running as the registrar (mode \"registration\")"
        )),
    }
    if cli.health_port > 0 && !cli.http_endpoint.is_empty() {
        return Err(ConfigError::BothHttpEndpoints);
    }
    paths::validate_kubelet_registration_path(&cli.kubelet_registration_path, platform)?;
    endpoint::parse_for(&cli.csi.csi_address, platform)?;
    if cli.plugin_registration_path.is_empty() {
        return Err(ConfigError::EmptyRegistrationDir);
    }
    if cli.timeout.is_zero() {
        return Err(ConfigError::ZeroTimeout);
    }
    let http_endpoint = if cli.health_port > 0 {
        warnings.push("--health-port is deprecated; use --http-endpoint".to_string());
        Some(format!(":{}", cli.health_port))
    } else if cli.http_endpoint.is_empty() {
        None
    } else {
        Some(cli.http_endpoint.clone())
    };
    if let Some(address) = &http_endpoint {
        sidecar_kit::process::http::listen_target(address)
            .map_err(|err| ConfigError::HttpEndpoint(err.to_string()))?;
    }
    if !cli.connection_timeout.is_zero() {
        warnings.push("--connection-timeout is deprecated and will have no effect".to_string());
    }
    if cli.enable_pprof {
        warnings
            .push("--enable-pprof has no effect: there is no Go runtime to profile".to_string());
    }
    Ok((
        Plan::Run(Config {
            csi_address: cli.csi.csi_address.clone(),
            kubelet_registration_path: cli.kubelet_registration_path.clone(),
            registration_dir: PathBuf::from(&cli.plugin_registration_path),
            timeout: cli.timeout,
            http_endpoint,
            driver_startup_timeout: cli.driver_startup_timeout,
            socket_check_interval: Some(cli.socket_check_interval).filter(|d| !d.is_zero()),
        }),
        warnings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn cli(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(
            std::iter::once("csi-node-driver-registrar").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    fn run_config(args: &[&str]) -> (Config, Vec<String>) {
        match plan(&cli(args).unwrap(), Platform::Unix).unwrap() {
            (Plan::Run(config), warnings) => (config, warnings),
            (other, _) => panic!("expected a run plan, got {other:?}"),
        }
    }

    const REG: &str = "--kubelet-registration-path=/var/lib/kubelet/plugins/d/csi.sock";

    #[test]
    fn defaults_match_upstream() {
        let parsed = cli(&[]).unwrap();
        assert_eq!(parsed.csi.csi_address, "/run/csi/socket");
        assert_eq!(parsed.plugin_registration_path, "/registration");
        assert_eq!(parsed.timeout, Duration::from_secs(1));
        assert_eq!(parsed.health_port, 0);
        assert_eq!(parsed.http_endpoint, "");
        assert_eq!(parsed.mode, "registration");
        assert!(!parsed.enable_pprof);
        assert_eq!(parsed.connection_timeout, Duration::ZERO);

        let (config, warnings) = run_config(&[REG]);
        assert_eq!(
            config,
            Config {
                csi_address: "/run/csi/socket".into(),
                kubelet_registration_path: "/var/lib/kubelet/plugins/d/csi.sock".into(),
                registration_dir: PathBuf::from("/registration"),
                timeout: Duration::from_secs(1),
                http_endpoint: None,
                driver_startup_timeout: Duration::from_secs(120),
                socket_check_interval: Some(Duration::from_secs(5)),
            }
        );
        assert!(warnings.is_empty());
    }

    #[test]
    fn go_syntax_command_lines() {
        let (config, _) = run_config(&[
            "-csi-address=/csi/csi.sock",
            "-kubelet-registration-path",
            "/var/lib/kubelet/plugins/d/csi.sock",
            "-v=5",
            "--timeout=3s",
            "--http-endpoint=:9809",
            "-plugin-registration-path=/reg",
            "--socket-check-interval=0",
        ]);
        assert_eq!(config.csi_address, "/csi/csi.sock");
        assert_eq!(config.timeout, Duration::from_secs(3));
        assert_eq!(config.http_endpoint.as_deref(), Some(":9809"));
        assert_eq!(config.registration_dir, PathBuf::from("/reg"));
        assert_eq!(config.socket_check_interval, None);
    }

    #[test]
    fn missing_registration_path_is_checked_first() {
        for args in [
            &[][..],
            &["--mode=kubelet-registration-probe"][..],
            &["--health-port=9809", "--http-endpoint=:9809"][..],
        ] {
            assert_eq!(
                plan(&cli(args).unwrap(), Platform::Unix),
                Err(ConfigError::MissingKubeletRegistrationPath),
                "{args:?}"
            );
        }
    }

    #[test]
    fn probe_mode_checks_nothing_else() {
        let parsed = cli(&[
            "--kubelet-registration-path=unix:///bad",
            "--mode=kubelet-registration-probe",
            "--health-port=1",
            "--http-endpoint=:2",
        ])
        .unwrap();
        assert_eq!(plan(&parsed, Platform::Unix).unwrap().0, Plan::Probe);
    }

    #[test]
    fn health_port() {
        let (config, warnings) = run_config(&[REG, "--health-port=9809"]);
        assert_eq!(config.http_endpoint.as_deref(), Some(":9809"));
        assert_eq!(warnings.len(), 1);
        for disabled in ["--health-port=0", "--health-port=-1"] {
            assert_eq!(run_config(&[REG, disabled]).0.http_endpoint, None);
        }
        // A disabled --health-port does not conflict with --http-endpoint.
        let (config, _) = run_config(&[REG, "--health-port=-1", "--http-endpoint=127.0.0.1:0"]);
        assert_eq!(config.http_endpoint.as_deref(), Some("127.0.0.1:0"));
        assert_eq!(
            plan(
                &cli(&[REG, "--health-port=9809", "--http-endpoint=:9809"]).unwrap(),
                Platform::Unix
            ),
            Err(ConfigError::BothHttpEndpoints)
        );
    }

    #[test]
    fn deprecated_flags_warn() {
        let (_, warnings) = run_config(&[
            REG,
            "--connection-timeout=-5s",
            "--enable-pprof",
            "--mode=other",
        ]);
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        let (_, warnings) = run_config(&[REG, "--connection-timeout=0s", "--enable-pprof=false"]);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn bad_values_are_flag_errors() {
        for args in [
            &["--timeout=1"][..],
            &["--timeout=-1s"][..],
            &["--connection-timeout=soon"][..],
            &["--driver-startup-timeout=x"][..],
            &["--health-port=http"][..],
            &["--enable-pprof", "true"][..],
            &["--no-such-flag"][..],
        ] {
            assert!(cli(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn invalid_values_are_config_errors() {
        let check = |args: &[&str], platform| plan(&cli(args).unwrap(), platform).map(|_| ());
        assert!(matches!(
            check(
                &["--kubelet-registration-path=unix:///x/csi.sock"],
                Platform::Unix
            ),
            Err(ConfigError::KubeletRegistrationPath(
                PathError::Scheme { .. }
            ))
        ));
        assert!(matches!(
            check(&[REG, "--csi-address=relative.sock"], Platform::Unix),
            Err(ConfigError::CsiAddress(_))
        ));
        assert_eq!(
            check(&[REG, "--plugin-registration-path="], Platform::Unix),
            Err(ConfigError::EmptyRegistrationDir)
        );
        assert_eq!(
            check(&[REG, "--timeout=0"], Platform::Unix),
            Err(ConfigError::ZeroTimeout)
        );
        for bad in [
            "--http-endpoint=9809",
            "--http-endpoint=:http",
            "--health-port=70000",
        ] {
            assert!(
                matches!(
                    check(&[REG, bad], Platform::Unix),
                    Err(ConfigError::HttpEndpoint(_))
                ),
                "{bad}"
            );
        }
        assert!(
            check(
                &[
                    r"--kubelet-registration-path=C:\var\lib\kubelet\plugins\d\csi.sock",
                    r"--csi-address=unix://C:\\csi\\csi.sock",
                    r"--plugin-registration-path=C:\var\lib\kubelet\plugins_registry\",
                ],
                Platform::Windows
            )
            .is_ok()
        );
        assert!(
            check(
                &[
                    r"--kubelet-registration-path=C:\var\lib\kubelet\plugins\d\csi.sock",
                    r"--csi-address=\\.\pipe\csi-driver",
                ],
                Platform::Windows
            )
            .is_ok()
        );
    }
}
