//! Process lifecycle: one cancellation token for graceful shutdown, crash-only fatal exits that
//! leave a termination message for Kubernetes, `--version`, and runtime sizing.

use std::io::Write;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::flags::ProcessFlags;

/// Where Kubernetes reads a container's termination message from.
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// Returns a token that is cancelled on SIGTERM or SIGINT (on Windows: Ctrl-C, Ctrl-Break or
/// console close). Must be called inside a tokio runtime.
pub fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let signal = wait_for_signal().await;
        tracing::info!(signal, "shutting down");
        trigger.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        },
        _ => {
            tracing::warn!("cannot install signal handlers; only Ctrl-C stops the process");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

#[cfg(windows)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::windows;
    match (
        windows::ctrl_c(),
        windows::ctrl_break(),
        windows::ctrl_close(),
        windows::ctrl_shutdown(),
    ) {
        (Ok(mut c), Ok(mut b), Ok(mut close), Ok(mut shutdown)) => tokio::select! {
            _ = c.recv() => "CTRL_C",
            _ = b.recv() => "CTRL_BREAK",
            _ = close.recv() => "CTRL_CLOSE",
            _ = shutdown.recv() => "CTRL_SHUTDOWN",
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
            "CTRL_C"
        }
    }
}

/// Writes `message` to the termination log at `path` if that file can be opened for writing.
/// Returns whether it was written.
pub fn write_termination_message(path: &Path, message: &str) -> bool {
    match std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
    {
        Ok(mut file) => file.write_all(message.as_bytes()).is_ok(),
        Err(_) => false,
    }
}

/// Crash-only exit: logs `message`, leaves it in the termination log, exits with code 1.
pub fn fatal(message: &str) -> ! {
    tracing::error!("{message}");
    write_termination_message(Path::new(TERMINATION_LOG), message);
    std::process::exit(1)
}

/// The line `--version` prints: `<argv0> <version>`, as upstream.
pub fn version_line(version: &str) -> String {
    let argv0 = std::env::args().next().unwrap_or_default();
    format!("{argv0} {version}")
}

/// Handles `--version`: prints the version line and exits 0.
pub fn exit_if_version(flags: &ProcessFlags, version: &str) {
    if flags.version {
        println!("{}", version_line(version));
        std::process::exit(0);
    }
}

/// Builds the multi-threaded runtime. With `--automaxprocs`, the worker count follows the
/// container's cgroup CPU quota (rounded up, at least 1) instead of the host's core count.
pub fn runtime(flags: &ProcessFlags) -> std::io::Result<tokio::runtime::Runtime> {
    single_malloc_arena();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if flags.automaxprocs
        && let Some(cpus) = cgroup_cpu_limit(Path::new("/sys/fs/cgroup"))
    {
        builder.worker_threads(cpus);
    }
    let runtime = builder.build()?;
    runtime.spawn(return_memory_after_bursts());
    Ok(runtime)
}

/// How often the resident set is looked at for memory to return.
const TRIM_CHECK: std::time::Duration = std::time::Duration::from_secs(10);
/// Growth of the resident set since the last trim that makes the next check trim.
const TRIM_GROWTH: u64 = 1 << 20;

/// glibc's malloc returns freed memory to the system only from the top of its heap, so after a
/// burst (a few hundred claims at once) most of the burst's peak stays resident behind a few
/// live allocations. Once the resident set has grown since the last trim and then stopped
/// growing (the burst is over), `malloc_trim` hands the free pages in the middle back as well;
/// a quiet sidecar is never woken for more than reading its own `statm`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
async fn return_memory_after_bursts() {
    let mut after_trim: u64 = 0;
    let mut last = u64::MAX;
    loop {
        tokio::time::sleep(TRIM_CHECK).await;
        let Some(resident) = resident_bytes() else {
            return;
        };
        if resident > after_trim.saturating_add(TRIM_GROWTH) && resident <= last {
            // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
            unsafe { libc::malloc_trim(0) };
            after_trim = resident_bytes().unwrap_or(resident);
            last = after_trim;
        } else {
            after_trim = after_trim.min(resident);
            last = resident;
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
async fn return_memory_after_bursts() {}

/// The resident set from `/proc/self/statm` (pages, second field).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

/// glibc gives every thread that meets a locked arena an arena of its own, each holding on to
/// its freed memory; a sidecar allocates little and rarely, so one arena is enough and keeps the
/// resident set small. Must run before the runtime's threads start.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn single_malloc_arena() {
    // SAFETY: mallopt only changes allocator settings; called while the process has one thread.
    let applied = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    if applied != 1 {
        tracing::debug!("the allocator kept its arena limit");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn single_malloc_arena() {}

/// CPU limit of the cgroup mounted at `root` (v2 `cpu.max`, or v1 `cpu/cpu.cfs_quota_us`),
/// rounded up to whole CPUs; `None` when unlimited or unknown.
pub fn cgroup_cpu_limit(root: &Path) -> Option<usize> {
    let (quota, period) = if let Ok(text) = std::fs::read_to_string(root.join("cpu.max")) {
        let mut words = text.split_whitespace();
        let quota = words.next()?.parse::<f64>().ok()?;
        let period = words.next().unwrap_or("100000").parse::<f64>().ok()?;
        (quota, period)
    } else {
        let quota = read_number(&root.join("cpu/cpu.cfs_quota_us"))?;
        let period = read_number(&root.join("cpu/cpu.cfs_period_us"))?;
        (quota, period)
    };
    if quota <= 0.0 || period <= 0.0 {
        return None;
    }
    Some(((quota / period).ceil() as usize).max(1))
}

fn read_number(path: &Path) -> Option<f64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn trimming_returns_a_freed_burst() {
        // A burst of small allocations, most freed, a few kept: the heap cannot shrink from its
        // top, only malloc_trim gives the pages in between back.
        let mut kept = Vec::new();
        let burst: Vec<Vec<u8>> = (0..20_000)
            .map(|i| {
                let block = vec![1u8; 1000];
                if i % 1000 == 999 {
                    kept.push(block.clone());
                }
                block
            })
            .collect();
        let peak = resident_bytes().unwrap();
        drop(burst);
        // SAFETY: as in return_memory_after_bursts.
        unsafe { libc::malloc_trim(0) };
        let after = resident_bytes().unwrap();
        assert!(
            after + 10_000_000 < peak,
            "peak {peak} B, after trimming {after} B"
        );
        assert_eq!(kept.len(), 20);
    }

    #[test]
    fn cgroup_v2_limits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cpu.max"), "150000 100000\n").unwrap();
        assert_eq!(cgroup_cpu_limit(dir.path()), Some(2));
        std::fs::write(dir.path().join("cpu.max"), "max 100000\n").unwrap();
        assert_eq!(cgroup_cpu_limit(dir.path()), None);
        std::fs::write(dir.path().join("cpu.max"), "20000 100000\n").unwrap();
        assert_eq!(cgroup_cpu_limit(dir.path()), Some(1));
    }

    #[test]
    fn cgroup_v1_limits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("cpu")).unwrap();
        std::fs::write(dir.path().join("cpu/cpu.cfs_quota_us"), "-1\n").unwrap();
        std::fs::write(dir.path().join("cpu/cpu.cfs_period_us"), "100000\n").unwrap();
        assert_eq!(cgroup_cpu_limit(dir.path()), None);
        std::fs::write(dir.path().join("cpu/cpu.cfs_quota_us"), "300000\n").unwrap();
        assert_eq!(cgroup_cpu_limit(dir.path()), Some(3));
        assert_eq!(cgroup_cpu_limit(&dir.path().join("missing")), None);
    }

    #[test]
    fn termination_message_only_where_writable() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("termination-log");
        assert!(
            !write_termination_message(&log, "x"),
            "must not create the file"
        );
        std::fs::write(&log, "").unwrap();
        assert!(write_termination_message(
            &log,
            "Lost connection to CSI driver, exiting"
        ));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "Lost connection to CSI driver, exiting"
        );
    }
}
