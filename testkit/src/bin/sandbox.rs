//! `sandbox`: every sidecar against the test API server and the mock CSI driver, on this machine.

#[cfg(unix)]
use std::path::PathBuf;
#[cfg(unix)]
use std::time::Duration;

#[cfg(unix)]
use clap::Parser;
#[cfg(unix)]
use testkit::sandbox::{self, Outcome, SandboxOptions};

/// Runs the in-process Kubernetes API server and the mock CSI driver, starts every sidecar
/// binary of the workspace against them, creates a StorageClass, a PVC and a VolumeAttachment,
/// and shows what happens. Keeps running until Ctrl-C (or --duration).
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

#[cfg(not(unix))]
fn main() -> std::process::ExitCode {
    eprintln!("the sandbox needs unix sockets: run it on Linux");
    std::process::ExitCode::from(2)
}

#[cfg(unix)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
        let built = tokio::process::Command::new(cargo)
            .args(["build", "--workspace", "--bins"])
            .status()
            .await;
        if !built.is_ok_and(|status| status.success()) {
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
    let options = SandboxOptions {
        bin_dir,
        work_dir: work_dir.path().to_path_buf(),
    };
    let running = match sandbox::start(&options).await {
        Ok(running) => running,
        Err(err) => {
            eprintln!("sandbox failed: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let failed = running
        .steps
        .iter()
        .any(|s| matches!(s.outcome, Outcome::Failed(_)));
    match cli.duration {
        Some(duration) => {
            println!("running for {duration:?}");
            tokio::select! {
                _ = tokio::time::sleep(duration) => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        None => {
            println!("running; Ctrl-C stops the sandbox");
            let _ = tokio::signal::ctrl_c().await;
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
