//! Command-line flags shared by the sidecars, in the syntax the upstream binaries accept.
//!
//! Upstream's attacher, registrar and livenessprobe parse flags with Go's `flag` package, which
//! takes long options with one dash or two (`-csi-address=/x`, `--v=5`) and booleans only as
//! `--flag` or `--flag=false`. The provisioner uses pflag (GNU style). clap speaks GNU style, so
//! Go-style command lines are normalised before clap sees them.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, FromArgMatches};

/// Which upstream flag parser a sidecar imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagSyntax {
    /// Go's standard `flag` package: `-name`, `--name`, `-name=value`, `-name value`.
    Go,
    /// spf13/pflag: GNU style, `--name=value`, `--name value`, shorthand `-v 5`.
    Gnu,
}

/// Rewrites a command line so that clap accepts what the imitated upstream parser accepts.
///
/// Both upstream parsers give a flag that takes a value and is written without `=` the next
/// word as its value, whatever that word looks like (`--csi-address -x`); clap would take such a
/// word for an option, so the two words are joined into `--name=value`. Booleans (declared with
/// `require_equals`) never take the next word.
///
/// For [`FlagSyntax::Go`], every single-dash option (`-csi-address`, `-v=5`) also gains a second
/// dash, and `-h` becomes `--help`, as Go answers it with the usage. For [`FlagSyntax::Gnu`],
/// single-dash words are shorthands and left to clap. Rewriting stops at `--`. Positional words
/// are left alone: the sidecars take none, and clap reports them.
pub fn normalize_args<I, T>(args: I, syntax: FlagSyntax, command: &clap::Command) -> Vec<OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut args = args.into_iter().map(Into::into);
    let mut out: Vec<OsString> = args.next().into_iter().collect();
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let name = match (text.strip_prefix("--"), syntax) {
            (Some(rest), _) => rest,
            (None, FlagSyntax::Go) => match text.strip_prefix('-') {
                Some(rest)
                    if !rest.is_empty()
                        && !rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') =>
                {
                    rest
                }
                // A positional word or a bare number: left as is.
                _ => {
                    out.push(arg);
                    continue;
                }
            },
            // A pflag shorthand or a positional word: clap reads these as pflag does.
            (None, FlagSyntax::Gnu) => {
                out.push(arg);
                continue;
            }
        };
        // Go's flag package answers `-h` with the usage, as `-help`, unless a flag is named h.
        let name = if syntax == FlagSyntax::Go && name == "h" && long_arg(command, "h").is_none() {
            "help"
        } else {
            name
        };
        let mut flag = OsString::from(format!("--{name}"));
        // A value flag takes the next word, whatever it is; a boolean (`require_equals`) never.
        if !name.contains('=')
            && long_arg(command, name)
                .is_some_and(|arg| arg.get_action().takes_values() && !arg.is_require_equals_set())
            && let Some(value) = args.next()
        {
            flag.push("=");
            flag.push(value);
        }
        out.push(flag);
    }
    out
}

/// Flags whose occurrences accumulate upstream, being maps that each occurrence adds to
/// (component-base's `MapStringBool` for `--feature-gates`, csi-lib-utils' label map).
const ACCUMULATING_FLAGS: &[&str] = &["feature-gates", "leader-election-labels"];

/// Joins the repeated `--name=value` occurrences of an accumulating flag into one, with commas,
/// in order: the later keys override the earlier ones, as upstream's map flags do. Expects the
/// output of [`normalize_args`], where every such occurrence has its value after `=`.
fn merge_accumulating(mut args: Vec<OsString>) -> Vec<OsString> {
    for name in ACCUMULATING_FLAGS {
        let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
        let prefix = format!("--{name}=");
        // The first word names the program.
        let occurrences: Vec<(usize, String)> = args[..end]
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, a)| Some((i, a.to_str()?.strip_prefix(&prefix)?.to_string())))
            .collect();
        if occurrences.len() < 2 {
            continue;
        }
        let joined: Vec<&str> = occurrences
            .iter()
            .map(|(_, value)| value.as_str())
            .filter(|value| !value.is_empty())
            .collect();
        args[occurrences[0].0] = format!("{prefix}{}", joined.join(",")).into();
        for (i, _) in occurrences[1..].iter().rev() {
            args.remove(*i);
        }
    }
    args
}

/// The option of `command` spelled `--name`.
fn long_arg<'a>(command: &'a clap::Command, name: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(name))
}

/// Errors of the Go-compatible value parsers.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValueError {
    #[error("invalid duration {0:?}: expected a Go duration such as 300ms, 15s, 1m30s or 1h")]
    Duration(String),
    #[error("negative duration {0:?} is not allowed here")]
    NegativeDuration(String),
    #[error("invalid boolean {0:?}: expected true or false")]
    Bool(String),
    #[error("invalid label {0:?}: expected key:value")]
    Label(String),
    #[error("invalid size {0:?}: expected a quantity of bytes such as 0, 512, 1k, 2Ki or 3M")]
    Size(String),
}

/// Parses a Go `time.Duration` string (`1h2m3.5s`, `300ms`, `0`). Negative values are refused:
/// every duration flag of the sidecars is a period or a timeout.
pub fn parse_go_duration(text: &str) -> Result<Duration, ValueError> {
    let bad = || ValueError::Duration(text.to_string());
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') {
        return Err(ValueError::NegativeDuration(text.to_string()));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(bad());
    }
    let mut nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." {
            return Err(bad());
        }
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(bad()),
        };
        nanos += value * scale;
        rest = tail;
    }
    if !nanos.is_finite() || nanos > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Parses a boolean as Go's `strconv.ParseBool` does.
pub fn parse_go_bool(text: &str) -> Result<bool, ValueError> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(ValueError::Bool(text.to_string())),
    }
}

/// Parses a byte count written as a Kubernetes quantity (`512`, `1k`, `2Ki`, `3M`), as
/// component-base's buffer size flags read it; a negative count is refused.
pub fn parse_byte_size(text: &str) -> Result<u64, ValueError> {
    let bytes = crate::values::quantity::parse(text).map_err(|_| ValueError::Size(text.into()))?;
    u64::try_from(bytes).map_err(|_| ValueError::Size(text.into()))
}

/// Key/value pairs given as `k:v,k2:v2`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(pub Vec<(String, String)>);

/// Splits `--feature-gates` as component-base does: `Name=bool,Name2=bool`, with Go's boolean
/// syntax; each sidecar then applies the names it knows.
pub fn feature_gate_pairs(text: &str) -> Result<Vec<(String, bool)>, String> {
    let mut pairs = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("missing bool value for {pair}"))?;
        let (name, value) = (name.trim(), value.trim());
        let value = parse_go_bool(value).map_err(|_| {
            format!("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax")
        })?;
        pairs.push((name.to_string(), value));
    }
    Ok(pairs)
}

/// Parses `k:v,k2:v2` as upstream's `--leader-election-labels`.
pub fn parse_labels(text: &str) -> Result<Labels, ValueError> {
    if text.is_empty() {
        return Ok(Labels::default());
    }
    text.split(',')
        .map(|pair| {
            let (key, value) = pair
                .split_once(':')
                .ok_or_else(|| ValueError::Label(pair.to_string()))?;
            let key = key.trim();
            if key.is_empty() {
                return Err(ValueError::Label(pair.to_string()));
            }
            Ok((key.to_string(), value.trim().to_string()))
        })
        .collect::<Result<_, _>>()
        .map(Labels)
}

/// Output format of the logs, as `--logging-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logging flags registered by all four upstream sidecars (component-base logs options).
#[derive(Args, Clone, Debug)]
pub struct LoggingFlags {
    /// Log verbosity, as klog's -v: 0-1 info, 2-4 adds debug, 5 and more adds gRPC payloads (trace)
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,

    /// Per-module verbosity (accepted for compatibility; the global -v applies)
    #[arg(long, default_value = "", value_name = "PATTERN=N,...")]
    pub vmodule: String,

    /// Log format: text or json
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub logging_format: LogFormat,

    /// Maximum time between log flushes (accepted for compatibility; logs are written unbuffered)
    #[arg(long, default_value = "5s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub log_flush_frequency: Duration,

    /// In text format, write info and debug messages to stdout, warnings and errors to stderr
    /// (without it, all go to stderr)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub log_text_split_stream: bool,

    /// Buffer for info messages with --log-text-split-stream, in bytes as a quantity (512, 1k,
    /// 2Ki, 3M); accepted for compatibility, no effect: every message is written at once
    #[arg(long, default_value = "0", value_parser = parse_byte_size, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: u64,

    /// In JSON format, write errors to stderr and all other messages to stdout (without it, all
    /// go to stderr)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub log_json_split_stream: bool,

    /// Buffer for info messages with --log-json-split-stream, in bytes as a quantity (512, 1k,
    /// 2Ki, 3M); accepted for compatibility, no effect: every message is written at once
    #[arg(long, default_value = "0", value_parser = parse_byte_size, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: u64,

    /// OpenTelemetry tracing: a TracingConfiguration file as kube-apiserver takes (endpoint of an
    /// OTLP/gRPC collector, samplingRatePerMillion); the OTEL_* variables configure it too, the
    /// file winning where both speak. Off unless this or OTEL_EXPORTER_OTLP_ENDPOINT is set
    #[arg(long, value_name = "PATH")]
    pub tracing_config_file: Option<std::path::PathBuf>,
}

impl LoggingFlags {
    /// The least severe level still written to stderr when the format's split stream is on
    /// (everything less severe goes to stdout); `None`: one stream, stderr. Upstream's text
    /// format sends warnings with errors, its JSON format only errors (it has no warning level).
    pub fn stderr_from(&self) -> Option<tracing::Level> {
        match self.logging_format {
            LogFormat::Text => self.log_text_split_stream.then_some(tracing::Level::WARN),
            LogFormat::Json => self.log_json_split_stream.then_some(tracing::Level::ERROR),
        }
    }
}

/// The logging flags of a sidecar that registers klog's own (`klog.InitFlags`) instead of
/// component-base's: csi-snapshot-metadata. Logs always go to stderr, as with klog's
/// `-logtostderr` preset to true; the file and header flags are accepted so that a pod spec
/// written for upstream starts, and have no effect.
#[derive(Args, Clone, Debug)]
pub struct KlogFlags {
    /// Log verbosity: 0-1 info, 2-4 adds debug, 5 and more adds every relayed range (trace)
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: u8,

    /// Per-module verbosity (accepted for compatibility; the global -v applies)
    #[arg(long, default_value = "", value_name = "PATTERN=N,...")]
    pub vmodule: String,

    /// Log to stderr instead of files (accepted for compatibility; logs always go to stderr)
    #[arg(long = "logtostderr", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "true", value_parser = parse_go_bool)]
    pub logtostderr: bool,

    /// Log to stderr as well as to files (accepted for compatibility; no effect)
    #[arg(long = "alsologtostderr", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub alsologtostderr: bool,

    /// Severity from which file logs are copied to stderr (accepted for compatibility; no effect)
    #[arg(
        long = "alsologtostderrthreshold",
        default_value = "INFO",
        value_name = "SEVERITY"
    )]
    pub alsologtostderrthreshold: String,

    /// Severity from which logs go to stderr (accepted for compatibility; all go to stderr)
    #[arg(
        long = "stderrthreshold",
        default_value = "INFO",
        value_name = "SEVERITY"
    )]
    pub stderrthreshold: String,

    /// klog's old -stderrthreshold rule (accepted for compatibility; no effect)
    #[arg(long = "legacy_stderr_threshold_behavior", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub legacy_stderr_threshold_behavior: bool,

    /// Directory of log files (accepted for compatibility; logs go to stderr)
    #[arg(long = "log_dir", default_value = "", value_name = "DIR")]
    pub log_dir: String,

    /// Log file (accepted for compatibility; logs go to stderr)
    #[arg(long = "log_file", default_value = "", value_name = "FILE")]
    pub log_file: String,

    /// Largest log file in MB (accepted for compatibility; no files are written)
    #[arg(long = "log_file_max_size", default_value_t = 1800, value_name = "MB")]
    pub log_file_max_size: u64,

    /// Add the file's directory to the log header (accepted for compatibility; no effect)
    #[arg(long = "add_dir_header", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub add_dir_header: bool,

    /// Leave the header out of log lines (accepted for compatibility; no effect)
    #[arg(long = "skip_headers", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub skip_headers: bool,

    /// Leave the header out of log files (accepted for compatibility; no effect)
    #[arg(long = "skip_log_headers", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub skip_log_headers: bool,

    /// Write each line to its own severity's file only (accepted for compatibility; no effect)
    #[arg(long = "one_output", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", default_value = "false", value_parser = parse_go_bool)]
    pub one_output: bool,

    /// Emit a stack trace at file:line (accepted for compatibility; no effect)
    #[arg(
        long = "log_backtrace_at",
        default_value = "",
        value_name = "FILE:LINE"
    )]
    pub log_backtrace_at: String,
}

impl KlogFlags {
    /// The logging these flags ask for: text on stderr at `-v`.
    pub fn logging(&self) -> LoggingFlags {
        LoggingFlags {
            verbosity: self.verbosity,
            vmodule: self.vmodule.clone(),
            logging_format: LogFormat::Text,
            log_flush_frequency: Duration::from_secs(5),
            log_text_split_stream: false,
            log_text_info_buffer_size: 0,
            log_json_split_stream: false,
            log_json_info_buffer_size: 0,
            tracing_config_file: None,
        }
    }
}

/// Flags every sidecar has besides logging.
#[derive(Args, Clone, Debug)]
pub struct ProcessFlags {
    /// Print the version and exit
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub version: bool,

    /// Size the runtime's worker threads from the cgroup CPU quota (as GOMAXPROCS upstream)
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub automaxprocs: bool,
}

/// The CSI endpoint flag.
#[derive(Args, Clone, Debug)]
pub struct CsiAddressFlag {
    /// Address of the CSI driver socket: an absolute path, unix:///path, or on Windows
    /// unix://C:\\path or a named pipe \\.\pipe\name (npipe://./pipe/name)
    #[arg(long, default_value = "/run/csi/socket", value_name = "ADDRESS")]
    pub csi_address: String,
}

/// The metrics and health HTTP endpoint flags of the controller sidecars.
#[derive(Args, Clone, Debug)]
pub struct HttpFlags {
    /// TCP address (host:port, or :port for all interfaces) of the HTTP server for metrics and
    /// health checks; empty disables it
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub http_endpoint: String,

    /// (deprecated) TCP address of a metrics-only HTTP server; exclusive with --http-endpoint
    #[arg(long, default_value = "", value_name = "ADDRESS")]
    pub metrics_address: String,

    /// HTTP path of the Prometheus metrics
    #[arg(long, default_value = "/metrics", value_name = "PATH")]
    pub metrics_path: String,
}

/// Kubernetes client flags.
#[derive(Args, Clone, Debug)]
pub struct KubeFlags {
    // Its help is each binary's: which of it, $KUBECONFIG and the in-cluster configuration
    // wins is the binary's `KubeconfigRule`, which words the help.
    #[arg(long, default_value = "", value_name = "PATH")]
    pub kubeconfig: String,

    /// Client-side rate limit of Kubernetes API requests per second (negative: unlimited)
    #[arg(
        long,
        default_value_t = 5.0,
        allow_negative_numbers = true,
        value_name = "QPS"
    )]
    pub kube_api_qps: f64,

    /// Burst of Kubernetes API requests allowed above --kube-api-qps
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub kube_api_burst: u32,
}

/// Leader election flags (Lease in coordination.k8s.io/v1, compatible with client-go).
#[derive(Args, Clone, Debug)]
pub struct LeaderElectionFlags {
    /// Run only while holding the leader Lease
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub leader_election: bool,

    /// Namespace of the Lease; empty uses $POD_NAMESPACE, the service account's namespace,
    /// then "default"
    #[arg(long, default_value = "", value_name = "NAMESPACE")]
    pub leader_election_namespace: String,

    /// How long a Lease stays valid without renewal before others may take it
    #[arg(long, default_value = "15s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership (and exits)
    #[arg(long, default_value = "10s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_renew_deadline: Duration,

    /// Period between attempts to acquire or renew the Lease
    #[arg(long, default_value = "5s", value_parser = parse_go_duration, value_name = "DURATION")]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease by the leader, as key:value,key2:value2
    #[arg(long, default_value = "", value_parser = parse_labels, value_name = "K:V,...")]
    pub leader_election_labels: Labels,

    /// Release the Lease on graceful shutdown so that another replica takes over at once
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "true", value_parser = parse_go_bool)]
    pub leader_election_release_on_exit: bool,

    /// While another replica leads, watch and index everything (one watch per kind, as the
    /// leader does) and act only once the Lease is won, so that a failover costs the Lease and
    /// no list
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          default_value = "false", value_parser = parse_go_bool)]
    pub leader_election_warm_standby: bool,
}

/// The flags upstream's csi-lib-utils registers for the provisioner and the attacher.
#[derive(Args, Clone, Debug)]
pub struct CommonFlags {
    #[command(flatten)]
    pub csi: CsiAddressFlag,
    #[command(flatten)]
    pub kube: KubeFlags,
    #[command(flatten)]
    pub leader_election: LeaderElectionFlags,
    #[command(flatten)]
    pub http: HttpFlags,
    #[command(flatten)]
    pub process: ProcessFlags,
    #[command(flatten)]
    pub logging: LoggingFlags,
}

impl CommonFlags {
    /// Every flag at its default: what a sidecar with a flag set of its own starts from.
    pub fn defaults() -> Self {
        let command = Self::augment_args(clap::Command::new("defaults"));
        let matches = command.get_matches_from(["defaults"]);
        // Every field has a default value, so an empty command line always parses.
        Self::from_arg_matches(&matches).expect("the defaults of every flag parse")
    }
}

/// Parses a command line in the given syntax; errors and `--help` behave as clap's.
pub fn parse_from<P, I, T>(args: I, syntax: FlagSyntax) -> Result<P, clap::Error>
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    parse_with(P::command(), args, syntax)
}

/// [`parse_from`] with `command` as `P`'s declaration: `P::command()` with what the binary
/// words its own way (a help text).
pub fn parse_with<P, I, T>(
    command: clap::Command,
    args: I,
    syntax: FlagSyntax,
) -> Result<P, clap::Error>
where
    P: clap::FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    // Both upstream parsers let a repeated flag override the earlier occurrences.
    let mut command = command.args_override_self(true);
    let args = merge_accumulating(normalize_args(args, syntax, &command));
    let mut matches = command.try_get_matches_from_mut(args)?;
    P::from_arg_matches_mut(&mut matches).map_err(|err| err.format(&mut command))
}

/// Parses the process's own command line, printing help or errors and exiting as clap does
/// (exit code 2 for bad flags, as Go's flag package).
pub fn parse_env<P: clap::Parser>(syntax: FlagSyntax) -> P {
    parse_args(std::env::args_os(), syntax)
}

/// [`parse_env`] for a given command line (the first item names the program).
pub fn parse_args<P, I, T>(args: I, syntax: FlagSyntax) -> P
where
    P: clap::Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    match parse_from(args, syntax) {
        Ok(parsed) => parsed,
        Err(err) => err.exit(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct TestCli {
        #[command(flatten)]
        common: CommonFlags,
        #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
        timeout: Duration,
    }

    fn go(args: &[&str]) -> Result<TestCli, clap::Error> {
        parse_from(
            std::iter::once("bin").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
    }

    fn gnu(args: &[&str]) -> Result<TestCli, clap::Error> {
        parse_from(
            std::iter::once("bin").chain(args.iter().copied()),
            FlagSyntax::Gnu,
        )
    }

    #[test]
    fn normalization_table() {
        let cases: &[(&[&str], &[&str])] = &[
            (&["-csi-address=/x"], &["--csi-address=/x"]),
            (&["-v=5"], &["--v=5"]),
            (&["--v=5"], &["--v=5"]),
            (&["-v", "5"], &["--v=5"]),
            (&["-timeout", "3s"], &["--timeout=3s"]),
            (&["--timeout", "3s"], &["--timeout=3s"]),
            // Go takes the next word as the value, whatever it looks like.
            (&["-csi-address", "-x"], &["--csi-address=-x"]),
            (&["-csi-address", "--"], &["--csi-address=--"]),
            // A boolean never takes the next word; a flag clap does not know takes none either.
            (&["-leader-election", "x"], &["--leader-election", "x"]),
            (&["-no-such-flag", "x"], &["--no-such-flag", "x"]),
            (&["-timeout"], &["--timeout"]),
            (
                &["-leader-election", "--", "-x"],
                &["--leader-election", "--", "-x"],
            ),
            (&["pos", "-x"], &["pos", "--x"]),
            (&["-"], &["-"]),
            (&["-kube-api-qps", "-1"], &["--kube-api-qps=-1"]),
            (&["---x"], &["---x"]),
            (&["-h"], &["--help"]),
            (&["--h"], &["--help"]),
        ];
        let command = TestCli::command();
        for (input, expected) in cases {
            let got = normalize_args(
                std::iter::once("bin").chain(input.iter().copied()),
                FlagSyntax::Go,
                &command,
            );
            let got: Vec<_> = got[1..]
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            assert_eq!(&got, expected, "input {input:?}");
        }
    }

    #[test]
    fn go_syntax_table() {
        let cli = go(&[
            "-csi-address=/csi/csi.sock",
            "-v=5",
            "-leader-election",
            "-timeout",
            "1m30s",
        ])
        .unwrap();
        assert_eq!(cli.common.csi.csi_address, "/csi/csi.sock");
        assert_eq!(cli.common.logging.verbosity, 5);
        assert!(cli.common.leader_election.leader_election);
        assert_eq!(cli.timeout, Duration::from_secs(90));

        let cli = go(&["--csi-address", "/a", "--v", "2", "--leader-election=false"]).unwrap();
        assert_eq!(cli.common.csi.csi_address, "/a");
        assert_eq!(cli.common.logging.verbosity, 2);
        assert!(!cli.common.leader_election.leader_election);

        let cli = go(&[
            "--kube-api-qps=-1",
            "--kube-api-burst=3",
            "--leader-election-labels=a:b,c:d",
        ])
        .unwrap();
        assert_eq!(cli.common.kube.kube_api_qps, -1.0);
        assert_eq!(cli.common.kube.kube_api_burst, 3);
        assert_eq!(
            cli.common.leader_election.leader_election_labels.0,
            vec![("a".into(), "b".into()), ("c".into(), "d".into())]
        );
    }

    #[test]
    fn defaults_match_upstream() {
        let cli = go(&[]).unwrap();
        let c = &cli.common;
        assert_eq!(c.csi.csi_address, "/run/csi/socket");
        assert_eq!(c.kube.kube_api_qps, 5.0);
        assert_eq!(c.kube.kube_api_burst, 10);
        assert_eq!(
            c.leader_election.leader_election_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            c.leader_election.leader_election_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            c.leader_election.leader_election_retry_period,
            Duration::from_secs(5)
        );
        assert!(c.leader_election.leader_election_release_on_exit);
        assert_eq!(c.http.metrics_path, "/metrics");
        assert_eq!(c.http.http_endpoint, "");
        assert_eq!(c.logging.verbosity, 0);
        assert_eq!(c.logging.logging_format, LogFormat::Text);
        assert!(!c.process.version);
    }

    #[test]
    fn go_syntax_values_may_start_with_a_dash() {
        let cli = go(&["-csi-address", "-odd", "--http-endpoint", "-:8080"]).unwrap();
        assert_eq!(cli.common.csi.csi_address, "-odd");
        assert_eq!(cli.common.http.http_endpoint, "-:8080");
        let cli = go(&["-kube-api-qps", "-1"]).unwrap();
        assert_eq!(cli.common.kube.kube_api_qps, -1.0);
        // As in Go: a value flag at the end has no value.
        assert!(go(&["-csi-address"]).is_err());
    }

    #[test]
    fn a_repeated_flag_overrides_as_upstream() {
        for parse in [go, gnu] {
            let cli = parse(&["--v=2", "--timeout=1s", "--v=5", "--timeout", "2s"]).unwrap();
            assert_eq!(cli.common.logging.verbosity, 5);
            assert_eq!(cli.timeout, Duration::from_secs(2));
            let cli = parse(&["--leader-election", "--leader-election=false"]).unwrap();
            assert!(!cli.common.leader_election.leader_election);
        }
        let cli = go(&["-csi-address=/a", "--csi-address", "/b"]).unwrap();
        assert_eq!(cli.common.csi.csi_address, "/b");
    }

    #[test]
    fn repeated_map_flags_accumulate_as_upstream() {
        for parse in [go, gnu] {
            let cli = parse(&[
                "--leader-election-labels=a:1,b:2",
                "--v=3",
                "--leader-election-labels=",
                "--leader-election-labels",
                "c:3,a:4",
            ])
            .unwrap();
            assert_eq!(
                cli.common.leader_election.leader_election_labels.0,
                [("a", "1"), ("b", "2"), ("c", "3"), ("a", "4")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            );
        }
        let merged = merge_accumulating(
            [
                "bin",
                "--feature-gates=A=true",
                "--x",
                "--feature-gates=B=false",
                "--",
                "--feature-gates=C=true",
            ]
            .map(OsString::from)
            .to_vec(),
        );
        assert_eq!(
            merged,
            [
                "bin",
                "--feature-gates=A=true,B=false",
                "--x",
                "--",
                "--feature-gates=C=true"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn gnu_syntax_values_may_start_with_a_dash() {
        let cli = gnu(&["--csi-address", "-odd", "-v", "2"]).unwrap();
        assert_eq!(cli.common.csi.csi_address, "-odd");
        assert_eq!(cli.common.logging.verbosity, 2);
    }

    #[test]
    fn go_syntax_h_asks_for_help() {
        for h in ["-h", "--h", "-help", "--help"] {
            let err = go(&[h]).unwrap_err();
            assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp, "{h}");
        }
    }

    #[test]
    fn go_syntax_rejects_what_go_rejects() {
        // A bool takes its value only with '='; the stray word is an error, not silently "false".
        assert!(go(&["--leader-election", "false"]).is_err());
        assert!(go(&["--leader-election=maybe"]).is_err());
        assert!(go(&["--timeout=10"]).is_err());
        assert!(go(&["--timeout=-1s"]).is_err());
        assert!(go(&["--no-such-flag"]).is_err());
        assert!(go(&["--logging-format=xml"]).is_err());
        assert!(go(&["--leader-election-labels=novalue"]).is_err());
    }

    #[test]
    fn gnu_syntax_table() {
        let cli = gnu(&["--csi-address", "/b", "-v", "4", "--leader-election"]).unwrap();
        assert_eq!(cli.common.csi.csi_address, "/b");
        assert_eq!(cli.common.logging.verbosity, 4);
        assert!(cli.common.leader_election.leader_election);
        let cli = gnu(&["-v=3"]).unwrap();
        assert_eq!(cli.common.logging.verbosity, 3);
        // pflag has no single-dash long options.
        assert!(gnu(&["-csi-address=/x"]).is_err());
    }

    #[test]
    fn component_base_logging_flags() {
        let cli = go(&[]).unwrap();
        let logging = &cli.common.logging;
        assert!(!logging.log_text_split_stream && !logging.log_json_split_stream);
        assert_eq!(logging.log_text_info_buffer_size, 0);
        assert_eq!(logging.log_json_info_buffer_size, 0);
        assert_eq!(logging.stderr_from(), None);
        for parse in [go, gnu] {
            let cli = parse(&[
                "--log-text-split-stream",
                "--log-text-info-buffer-size",
                "64Ki",
                "--log-json-split-stream=true",
                "--log-json-info-buffer-size=1M",
            ])
            .unwrap();
            let logging = &cli.common.logging;
            assert!(logging.log_text_split_stream && logging.log_json_split_stream);
            assert_eq!(logging.log_text_info_buffer_size, 64 << 10);
            assert_eq!(logging.log_json_info_buffer_size, 1_000_000);
            assert_eq!(logging.stderr_from(), Some(tracing::Level::WARN));
        }
        let cli = go(&["-logging-format=json", "-log-json-split-stream"]).unwrap();
        assert_eq!(
            cli.common.logging.stderr_from(),
            Some(tracing::Level::ERROR)
        );
        // Each format splits on its own flag only.
        let cli = go(&["--logging-format=json", "--log-text-split-stream"]).unwrap();
        assert_eq!(cli.common.logging.stderr_from(), None);
        let cli = go(&["--log-text-split-stream=false"]).unwrap();
        assert_eq!(cli.common.logging.stderr_from(), None);
        // As Go: a boolean never takes the next word; quantities as Kubernetes reads them.
        for bad in [
            &["--log-text-split-stream", "true"][..],
            &["--log-json-split-stream=yes"],
            &["--log-text-info-buffer-size=1K"],
            &["--log-json-info-buffer-size=-1"],
            &["--log-json-info-buffer-size="],
            &["--log-text-info-buffer-size=64KB"],
        ] {
            assert!(go(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn byte_sizes() {
        for (text, bytes) in [
            ("0", 0),
            ("512", 512),
            ("1k", 1000),
            ("2Ki", 2048),
            ("3M", 3_000_000),
            ("5Mi", 5 << 20),
            ("1.5Ki", 1536),
            ("1e3", 1000),
        ] {
            assert_eq!(parse_byte_size(text), Ok(bytes), "{text}");
        }
        for bad in ["", "K", "1K", "1 Mi", "-1", "x"] {
            assert!(parse_byte_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_durations() {
        let ok: &[(&str, Duration)] = &[
            ("0", Duration::ZERO),
            ("15s", Duration::from_secs(15)),
            ("300ms", Duration::from_millis(300)),
            ("1h2m3s", Duration::from_secs(3723)),
            ("1.5s", Duration::from_millis(1500)),
            ("10us", Duration::from_micros(10)),
            ("7ns", Duration::from_nanos(7)),
            ("+2m", Duration::from_secs(120)),
        ];
        for (text, expected) in ok {
            assert_eq!(parse_go_duration(text), Ok(*expected), "{text}");
        }
        for bad in ["", "15", "s", "1x", "1.2.3s", ".s", "-5s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_bools() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true));
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false));
        }
        assert!(parse_go_bool("yes").is_err());
    }
}
