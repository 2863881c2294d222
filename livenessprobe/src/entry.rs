//! The command line of `livenessprobe`, shared by its binary and the multi-call binary.

use std::ffi::OsString;

use crate::{VERSION, flags::Cli, server};
use sidecar_kit::process::flags::{FlagSyntax, parse_args};
use sidecar_kit::runtime::lifecycle;

/// Runs the sidecar with the command line `args` (the first item names the program) until it
/// ends; exits the process on errors, as the binary does.
pub fn main(args: impl IntoIterator<Item = OsString>) {
    let cli: Cli = parse_args(args, FlagSyntax::Go);
    lifecycle::exit_if_version(&cli.process, VERSION);
    lifecycle::start_logging(&cli.logging, "livenessprobe");
    // One thread is plenty for a health check every few seconds, and each worker thread would
    // add its own stack and malloc arena to the footprint; --automaxprocs has nothing to size.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => lifecycle::fatal(&format!("cannot start the runtime: {err}")),
    };
    let result = runtime.block_on(async {
        let shutdown = lifecycle::shutdown_token();
        server::run(&cli, shutdown).await
    });
    if let Err(err) = result {
        lifecycle::fatal(&err.to_string());
    }
    sidecar_kit::telemetry::flush();
}
