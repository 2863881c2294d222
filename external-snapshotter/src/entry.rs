//! The command line of `csi-snapshotter`, shared by its binary and the multi-call binary.

use std::ffi::OsString;

use sidecar_kit::flags::{FlagSyntax, parse_args};
use sidecar_kit::{lifecycle, startup};

use crate::{app, flags::Cli};

/// Runs the sidecar with the command line `args` (the first item names the program) until it
/// ends; exits the process on errors, as the binary does.
pub fn main(args: impl IntoIterator<Item = OsString>) {
    let cli: Cli = parse_args(args, FlagSyntax::Go);
    lifecycle::exit_if_version(&cli.common.process, env!("CARGO_PKG_VERSION"));
    sidecar_kit::logging::init(&cli.common.logging);
    if let Err(err) = cli.validate() {
        lifecycle::fatal(&err.to_string());
    }
    let process = cli.common.process.clone();
    startup::run(&process, |shutdown| app::serve(cli, shutdown));
}
