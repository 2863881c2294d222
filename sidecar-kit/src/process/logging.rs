//! Logging set-up: klog's `-v` verbosity mapped onto tracing levels.
//!
//! | `-v`  | what is logged                                            |
//! |-------|-----------------------------------------------------------|
//! | 0-1   | errors, warnings, info                                    |
//! | 2-4   | plus debug (per-object progress, like klog's V(2)..V(4))  |
//! | >= 5  | plus trace: every gRPC request and response, secrets stripped |
//!
//! HTTP/2 and TLS transport crates log at most at info, so `-v=5` shows the sidecar's own work.
//! Logs go to stderr, as klog's do, as text or as JSON lines (`--logging-format=json`); with the
//! format's split stream (`--log-text-split-stream`, `--log-json-split-stream`) the less severe
//! messages go to stdout, as component-base splits them.

use std::io::{IsTerminal, Stderr, Stdout};

use tracing::{Level, Metadata};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::writer::EitherWriter;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

use crate::process::flags::{LogFormat, LoggingFlags};
use crate::telemetry::{self, TracingConfigError};

/// The tracing level that a klog verbosity enables.
pub fn level_for_verbosity(verbosity: u8) -> Level {
    match verbosity {
        0..=1 => Level::INFO,
        2..=4 => Level::DEBUG,
        _ => Level::TRACE,
    }
}

/// Transport crates whose debug and trace output (every HTTP/2 frame) would drown the sidecar's
/// own: they log at most at info, whatever `-v` says.
const QUIET_DEPENDENCIES: [&str; 7] = [
    "h2",
    "hyper",
    "hyper_util",
    "tower",
    "rustls",
    "want",
    "mio",
];

/// The filter directives for a klog verbosity.
pub fn directives(verbosity: u8) -> String {
    let level = LevelFilter::from_level(level_for_verbosity(verbosity));
    let mut directives = level.to_string().to_lowercase();
    for krate in QUIET_DEPENDENCIES {
        directives.push_str(&format!(",{krate}={}", level.min(LevelFilter::INFO)).to_lowercase());
    }
    directives
}

/// The filter of a klog verbosity: [`directives`] as a per-target level table. Unlike an
/// `EnvFilter` it needs no regular expressions, which keeps every sidecar's binary and resident
/// memory smaller.
pub fn filter(verbosity: u8) -> Targets {
    let level = LevelFilter::from_level(level_for_verbosity(verbosity));
    directives(verbosity)
        .parse()
        .unwrap_or_else(|_| Targets::new().with_default(level))
}

/// Where each message is written: stderr, or by severity to stderr and stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Streams {
    /// The least severe level written to stderr; `None`: everything is.
    stderr_from: Option<Level>,
}

impl Streams {
    fn new(flags: &LoggingFlags) -> Self {
        Self {
            stderr_from: flags.stderr_from(),
        }
    }

    /// Whether a message of `level` goes to stdout.
    fn goes_to_stdout(&self, level: &Level) -> bool {
        // More verbose levels compare greater.
        self.stderr_from.is_some_and(|least| *level > least)
    }

    /// Colour codes only for a person at a terminal, never in container logs: every stream
    /// written to must be one.
    fn ansi(&self) -> bool {
        std::io::stderr().is_terminal()
            && (self.stderr_from.is_none() || std::io::stdout().is_terminal())
    }
}

impl<'a> MakeWriter<'a> for Streams {
    type Writer = EitherWriter<Stderr, Stdout>;

    fn make_writer(&'a self) -> Self::Writer {
        EitherWriter::A(std::io::stderr())
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Self::Writer {
        if self.goes_to_stdout(meta.level()) {
            EitherWriter::B(std::io::stdout())
        } else {
            EitherWriter::A(std::io::stderr())
        }
    }
}

/// Installs the global subscriber, and with it the export of spans when tracing is asked for
/// (`--tracing-config-file` or the `OTEL_*` variables; `service` names the process to the
/// collector). Calling it twice keeps the first one (tests do that). A tracing configuration
/// that cannot be used is an error once logging works, for the caller to end the process with.
pub fn init(flags: &LoggingFlags, service: &str) -> Result<(), TracingConfigError> {
    let tracing = telemetry::settings(flags.tracing_config_file.as_deref());
    let tracer = match &tracing {
        Ok(Some(settings)) => Some(telemetry::start(settings, service)),
        _ => None,
    }
    .transpose();
    let (tracer, started) = match tracer {
        Ok(tracer) => (tracer, Ok(())),
        Err(err) => (None, Err(err)),
    };
    let spans = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_filter(filter(flags.verbosity))
    });
    let streams = Streams::new(flags);
    let ids = spans.is_some();
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(streams.ansi() && !ids)
        .with_writer(streams);
    let installed = match flags.logging_format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(spans)
            .with(
                layer
                    .event_format(WithTraceIds {
                        inner: tracing_subscriber::fmt::format().with_target(false),
                        json: false,
                        enabled: ids,
                    })
                    .with_filter(filter(flags.verbosity)),
            )
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(spans)
            .with(
                layer
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .event_format(WithTraceIds {
                        inner: tracing_subscriber::fmt::format()
                            .json()
                            .flatten_event(true)
                            .with_target(false),
                        json: true,
                        enabled: ids,
                    })
                    .with_filter(filter(flags.verbosity)),
            )
            .try_init(),
    };
    if installed.is_ok() && !flags.vmodule.is_empty() {
        tracing::warn!(vmodule = %flags.vmodule, "--vmodule is accepted but not applied; the global -v level is used");
    }
    tracing.map(|_| ())?;
    started
}

/// An event format that ends each line written inside a sampled span with its `trace_id` and
/// `span_id` (as fields of the JSON object in JSON), so that logs and traces join.
struct WithTraceIds<F> {
    inner: F,
    json: bool,
    enabled: bool,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let ids = if self.enabled {
            telemetry::current_ids()
        } else {
            None
        };
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let line = line.trim_end_matches('\n');
        if self.json {
            let open = line.strip_suffix('}').unwrap_or(line);
            let comma = if open.ends_with('{') { "" } else { "," };
            writeln!(
                writer,
                "{open}{comma}\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            )
        } else {
            writeln!(writer, "{line} trace_id={trace_id} span_id={span_id}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::flags::{FlagSyntax, parse_from};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        logging: LoggingFlags,
    }

    /// The levels that go to stdout with the command line `args`.
    fn on_stdout(args: &[&str]) -> Vec<Level> {
        let cli: Cli = parse_from(
            std::iter::once("bin").chain(args.iter().copied()),
            FlagSyntax::Go,
        )
        .unwrap();
        let streams = Streams::new(&cli.logging);
        [
            Level::ERROR,
            Level::WARN,
            Level::INFO,
            Level::DEBUG,
            Level::TRACE,
        ]
        .into_iter()
        .filter(|level| streams.goes_to_stdout(level))
        .collect()
    }

    #[test]
    fn split_streams_as_component_base() {
        const NONE: [Level; 0] = [];
        assert_eq!(on_stdout(&[]), NONE);
        assert_eq!(on_stdout(&["--logging-format=json"]), NONE);
        assert_eq!(
            on_stdout(&["--log-text-split-stream"]),
            [Level::INFO, Level::DEBUG, Level::TRACE]
        );
        assert_eq!(
            on_stdout(&["--logging-format=json", "--log-json-split-stream"]),
            [Level::WARN, Level::INFO, Level::DEBUG, Level::TRACE]
        );
        assert_eq!(
            on_stdout(&["--logging-format=json", "--log-text-split-stream"]),
            NONE
        );
    }

    #[test]
    fn verbosity_mapping() {
        assert_eq!(level_for_verbosity(0), Level::INFO);
        assert_eq!(level_for_verbosity(1), Level::INFO);
        assert_eq!(level_for_verbosity(2), Level::DEBUG);
        assert_eq!(level_for_verbosity(4), Level::DEBUG);
        assert_eq!(level_for_verbosity(5), Level::TRACE);
        assert_eq!(level_for_verbosity(10), Level::TRACE);
    }

    #[test]
    fn transport_crates_stay_quiet() {
        assert!(directives(0).starts_with("info,"));
        let v5 = directives(5);
        assert!(v5.starts_with("trace,"), "{v5}");
        assert!(
            v5.contains(",h2=info") && v5.contains(",hyper=info"),
            "{v5}"
        );
    }

    #[test]
    fn filter_levels_per_target() {
        let quiet = filter(0);
        assert!(quiet.would_enable("node_driver_registrar::run", &Level::INFO));
        assert!(!quiet.would_enable("node_driver_registrar::run", &Level::DEBUG));
        let debug = filter(2);
        assert!(debug.would_enable("external_attacher", &Level::DEBUG));
        assert!(!debug.would_enable("external_attacher", &Level::TRACE));
        let trace = filter(5);
        assert!(trace.would_enable("sidecar_kit::driver::csi", &Level::TRACE));
        for krate in QUIET_DEPENDENCIES {
            assert!(trace.would_enable(krate, &Level::INFO), "{krate}");
            assert!(!trace.would_enable(krate, &Level::DEBUG), "{krate}");
            assert!(
                !trace.would_enable(&format!("{krate}::proto::streams"), &Level::TRACE),
                "{krate}"
            );
        }
        assert_eq!(trace.default_level(), Some(LevelFilter::TRACE));
    }
}
