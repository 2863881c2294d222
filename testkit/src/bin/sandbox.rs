//! `sandbox`: every sidecar against the test API server and the mock CSI driver, on this machine.

#[cfg(unix)]
use std::path::PathBuf;
#[cfg(unix)]
use std::time::Duration;

#[cfg(unix)]
use clap::Parser;
#[cfg(unix)]
use testkit::process::CleanEnv;
#[cfg(unix)]
use testkit::sandbox::{self, Outcome, SandboxOptions};

/// Runs the in-process Kubernetes API server and the mock CSI driver, starts every sidecar
/// binary of the workspace against them, creates a StorageClass, a PVC, snapshots and a
/// VolumeAttachment (and, when csi-snapshot-metadata is built, asks it for the blocks changed
/// between two snapshots), and shows what happens. Keeps running until Ctrl-C (or --duration).
#[cfg(unix)]
#[derive(Parser, Debug)]
#[command(name = "sandbox", version)]
struct Cli {
    /// Stop after this long (e.g. 30s, 5m) instead of waiting for Ctrl-C; exit 1 if a step failed
    #[arg(long, value_parser = humantime_like)]
    duration: Option<Duration>,

    /// Directory with the sidecar binaries (default: the directory of this binary)
    #[arg(long)]
    bin_dir: Option<PathBuf>,

    /// Do not run `cargo build --workspace --bins` first (only applies when started by cargo)
    #[arg(long)]
    no_build: bool,

    /// Run the provisioner with storage capacity tracking and show its CSIStorageCapacity
    /// objects (for a late-binding StorageClass)
    #[arg(long)]
    capacity: bool,

    /// Trace the sidecars (OpenTelemetry, to a collector inside the sandbox) and print each
    /// operation's spans as a waterfall: where its time went, in the sidecar, the driver and
    /// the API server
    #[arg(long)]
    trace: bool,
}

/// Parses `30s`, `5m`, `1h` or a number of seconds.
#[cfg(unix)]
fn humantime_like(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let seconds = match unit {
        "" | "s" => value,
        "m" => value * 60,
        "h" => value * 3600,
        _ => return Err(format!("invalid duration {text:?}: use s, m or h")),
    };
    Ok(Duration::from_secs(seconds))
}

/// Prints every operation's trace received so far, oldest first, as a waterfall.
#[cfg(unix)]
async fn print_traces(collector: &testkit::otlp::Collector) {
    // The spans of the last steps reach the collector within the export delay.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let spans = collector.spans();
    let mut roots: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty() && s.attributes.contains_key("csi.sidecar.queue"))
        .collect();
    roots.sort_by_key(|s| s.start_unix_nano);
    println!("\n== traces: {} operations", roots.len());
    for root in roots {
        let trace = collector.trace(&root.trace_id);
        println!("\n{} trace {}", root.name, root.trace_id);
        print!("{}", testkit::otlp::waterfall(&trace));
    }
}

#[cfg(not(unix))]
fn main() -> std::process::ExitCode {
    eprintln!("the sandbox needs unix sockets: run it on Linux");
    std::process::ExitCode::from(2)
}

/// SIGTERM, SIGINT and SIGHUP: each stops the sandbox and its sidecars.
#[cfg(unix)]
struct StopSignals([tokio::signal::unix::Signal; 3]);

#[cfg(unix)]
impl StopSignals {
    fn new() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self([
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
            signal(SignalKind::hangup())?,
        ]))
    }

    /// Waits for the next one; its name.
    async fn recv(&mut self) -> &'static str {
        let [term, int, hup] = &mut self.0;
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = hup.recv() => "SIGHUP",
        }
    }
}

#[cfg(unix)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Before any child exists, so that no signal finds the sandbox without its handlers.
    let mut signals = match StopSignals::new() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("cannot handle signals: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let bin_dir = match cli
        .bin_dir
        .clone()
        .or_else(|| std::env::current_exe().ok()?.parent().map(PathBuf::from))
    {
        Some(dir) => dir,
        None => {
            eprintln!("cannot tell where the sidecar binaries are; pass --bin-dir");
            return std::process::ExitCode::from(2);
        }
    };
    // Started by `cargo run`: build the sidecars first so that the sandbox runs the current code.
    if let Some(cargo) = std::env::var_os("CARGO").filter(|_| !cli.no_build) {
        println!("building the sidecar binaries...");
        let mut command = tokio::process::Command::new(cargo);
        command
            .clean_env()
            .args(["build", "--workspace", "--bins"])
            .kill_on_drop(true);
        let built = match testkit::process::die_with_parent(&mut command).spawn() {
            Ok(mut build) => tokio::select! {
                status = build.wait() => status.is_ok_and(|status| status.success()),
                signal = signals.recv() => {
                    println!("{signal}: stopping the build");
                    let _ = build.kill().await;
                    return std::process::ExitCode::FAILURE;
                }
            },
            Err(_) => false,
        };
        if !built {
            eprintln!("cargo build failed; sidecars that are not built are skipped");
        }
    }
    let work_dir = match tempfile::Builder::new().prefix("csi-sandbox-").tempdir() {
        Ok(dir) => dir,
        Err(err) => {
            eprintln!("cannot create a work directory: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let collector = if cli.trace {
        match testkit::otlp::Collector::start().await {
            Ok(collector) => Some(collector),
            Err(err) => {
                eprintln!("cannot start the trace collector: {err}");
                return std::process::ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let children = match &collector {
        Some(collector) => sandbox::Children::with_env(vec![
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_string(),
                collector.http_endpoint(),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY".to_string(), "200".to_string()),
        ]),
        None => sandbox::Children::default(),
    };
    let options = SandboxOptions {
        bin_dir,
        work_dir: work_dir.path().to_path_buf(),
        children,
        capacity: cli.capacity,
    };
    // A signal while the steps still wait stops the sidecars started so far.
    let started = tokio::select! {
        started = sandbox::start(&options) => started,
        signal = signals.recv() => {
            println!("{signal}: stopping");
            options.children.stop().await;
            return std::process::ExitCode::FAILURE;
        }
    };
    let running = match started {
        Ok(running) => running,
        Err(err) => {
            eprintln!("sandbox failed: {err}");
            options.children.stop().await;
            return std::process::ExitCode::FAILURE;
        }
    };
    let failed = running
        .steps
        .iter()
        .any(|s| matches!(s.outcome, Outcome::Failed(_)));
    if let Some(collector) = &collector {
        print_traces(collector).await;
    }
    match cli.duration {
        Some(duration) => {
            println!("running for {duration:?}");
            tokio::select! {
                _ = tokio::time::sleep(duration) => {}
                signal = signals.recv() => println!("{signal}"),
            }
        }
        None => {
            println!("running; Ctrl-C (or SIGTERM, SIGHUP) stops the sandbox");
            println!("{}", signals.recv().await);
        }
    }
    println!("stopping");
    running.stop().await;
    if failed {
        std::process::ExitCode::FAILURE
    } else {
        std::process::ExitCode::SUCCESS
    }
}
