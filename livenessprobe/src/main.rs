use livenessprobe::{VERSION, flags::Cli, server};
use sidecar_kit::flags::{FlagSyntax, parse_env};
use sidecar_kit::{lifecycle, logging};

fn main() {
    let cli: Cli = parse_env(FlagSyntax::Go);
    lifecycle::exit_if_version(&cli.process, VERSION);
    logging::init(&cli.logging);
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
}
