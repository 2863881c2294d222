//! Logging set-up: klog's `-v` verbosity mapped onto tracing levels.
//!
//! | `-v`  | what is logged                                            |
//! |-------|-----------------------------------------------------------|
//! | 0-1   | errors, warnings, info                                    |
//! | 2-4   | plus debug (per-object progress, like klog's V(2)..V(4))  |
//! | >= 5  | plus trace: every gRPC request and response, secrets stripped |
//!
//! HTTP/2 and TLS transport crates log at most at info, so `-v=5` shows the sidecar's own work.
//! Logs go to stderr, as klog's do, as text or as JSON lines (`--logging-format=json`).

use tracing::Level;
use tracing_subscriber::filter::LevelFilter;

use crate::flags::{LogFormat, LoggingFlags};

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

/// Installs the global subscriber. Calling it twice keeps the first one (tests do that).
pub fn init(flags: &LoggingFlags) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(directives(
            flags.verbosity,
        )))
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match flags.logging_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_ok() && !flags.vmodule.is_empty() {
        tracing::warn!(vmodule = %flags.vmodule, "--vmodule is accepted but not applied; the global -v level is used");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
