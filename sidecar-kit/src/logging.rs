//! Logging set-up: klog's `-v` verbosity mapped onto tracing levels.
//!
//! | `-v`  | what is logged                                            |
//! |-------|-----------------------------------------------------------|
//! | 0-1   | errors, warnings, info                                    |
//! | 2-4   | plus debug (per-object progress, like klog's V(2)..V(4))  |
//! | >= 5  | plus trace: every gRPC request and response, secrets stripped |
//!
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

/// Installs the global subscriber. Calling it twice keeps the first one (tests do that).
pub fn init(flags: &LoggingFlags) {
    let filter = LevelFilter::from_level(level_for_verbosity(flags.verbosity));
    let builder = tracing_subscriber::fmt()
        .with_max_level(filter)
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
}
