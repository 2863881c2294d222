//! The command line of `node-driver-registrar`, shared by its binary and the multi-call binary.

use std::ffi::OsString;

use crate::config::{self, Cli, Plan};
use crate::run::run;
use sidecar_kit::driver::endpoint::Platform;
use sidecar_kit::process::flags::{self, FlagSyntax};
use sidecar_kit::runtime::lifecycle;

/// Runs the sidecar with the command line `args` (the first item names the program) until it
/// ends; exits the process on errors, as the binary does.
pub fn main(args: impl IntoIterator<Item = OsString>) {
    let cli: Cli = flags::parse_args(args, FlagSyntax::Go);
    lifecycle::exit_if_version(&cli.process, crate::VERSION);
    lifecycle::start_logging(&cli.logging, "csi-node-driver-registrar");
    let (plan, warnings) = match config::plan(&cli, Platform::current()) {
        Ok(planned) => planned,
        Err(err) => lifecycle::fatal(&err.to_string()),
    };
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    let config = match plan {
        Plan::Probe => {
            tracing::info!(
                "--mode=kubelet-registration-probe is deprecated and always succeeds; probe /healthz instead"
            );
            std::process::exit(0);
        }
        Plan::Run(config) => config,
    };
    tracing::info!(version = crate::VERSION, "starting node-driver-registrar");
    // One thread serves a handful of calls a minute; a multi-threaded runtime would only add
    // memory (--automaxprocs has nothing to size).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => lifecycle::fatal(&format!("cannot start the async runtime: {err}")),
    };
    let ended = runtime.block_on(async {
        let shutdown = lifecycle::shutdown_token();
        run(config, None, shutdown).await
    });
    match ended.map(|exit| exit.failure()) {
        Ok(None) => {
            sidecar_kit::telemetry::flush();
            std::process::exit(0)
        }
        Ok(Some(message)) => lifecycle::fatal(&message),
        Err(err) => lifecycle::fatal(&err.to_string()),
    }
}
