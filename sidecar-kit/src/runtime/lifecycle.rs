//! Process lifecycle: one cancellation token for graceful shutdown, crash-only fatal exits that
//! leave a termination message for Kubernetes, `--version`, and runtime sizing.

use std::io::Write;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::process::flags::ProcessFlags;

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

/// Crash-only exit: logs `message`, leaves it in the termination log, exports the spans of
/// the operations it interrupts (bounded), exits with code 1.
pub fn fatal(message: &str) -> ! {
    tracing::error!("{message}");
    write_termination_message(Path::new(TERMINATION_LOG), message);
    crate::telemetry::flush();
    std::process::exit(1)
}

/// The line `--version` prints: `<argv0> <version>`, as upstream.
pub fn version_line(version: &str) -> String {
    let argv0 = std::env::args().next().unwrap_or_default();
    format!("{argv0} {version}")
}

/// Installs logging (and tracing, when asked for) for the process `service`; a tracing
/// configuration that cannot be used ends the process with its message.
pub fn start_logging(flags: &crate::process::flags::LoggingFlags, service: &str) {
    if let Err(err) = crate::process::logging::init(flags, service) {
        fatal(&err.to_string());
    }
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
    no_transparent_huge_pages();
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

/// How often the process is looked at for memory to return.
#[cfg(any(all(target_os = "linux", target_env = "gnu"), target_env = "musl"))]
const TRIM_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(all(target_os = "linux", target_env = "gnu"))]
use trim::return_memory_after_bursts;

/// mimalloc purges the pages a burst freed only once they have been free for a moment (10 ms)
/// and only when it is next called on a busy path, which a quiet process never reaches: what
/// start-up's lists freed would stay resident. A collection now and then purges what has
/// expired since; when nothing has, it costs a look at a clock.
#[cfg(target_env = "musl")]
async fn return_memory_after_bursts() {
    loop {
        tokio::time::sleep(TRIM_CHECK).await;
        // SAFETY: mi_collect only returns the allocator's own free memory.
        unsafe { libmimalloc_sys::mi_collect(false) };
    }
}

#[cfg(not(any(all(target_os = "linux", target_env = "gnu"), target_env = "musl")))]
async fn return_memory_after_bursts() {}

/// Handing the memory freed after a burst back to the system, which glibc's malloc does only
/// when asked.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod trim {
    /// Memory freed while resident since the last trim that makes a check trim.
    const SLACK: u64 = 256 << 10;
    /// Growth of the resident set between checks that still counts as not growing: a quiet
    /// process touches a few pages now and then (timers, watch bookmarks, Events still being
    /// written after a burst), which must not put the trim off.
    const NOISE: u64 = 64 << 10;

    /// One look at the process: its anonymous resident memory and the bytes the allocator has
    /// handed out.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) struct Sample {
        pub anon_resident: u64,
        pub in_use: u64,
    }

    impl Sample {
        /// Resident memory not in use: what the allocator holds free, and a constant rest
        /// (stacks, static data). Allocations whose pages were never touched can make the
        /// difference negative, which counts as none.
        pub fn slack(self) -> u64 {
            self.anon_resident.saturating_sub(self.in_use)
        }
    }

    /// When to trim: once at least [`SLACK`] has been freed while resident since the last
    /// trim, and the resident set is not growing (by more than [`NOISE`]).
    ///
    /// The resident set alone does not tell: the end of a burst frees memory without the
    /// resident set moving. What was freed shows as growth of the slack between two checks;
    /// only growth counts, since the slack also falls when allocations reuse free room in pages
    /// still partly in use, which no trim could have given back. Over-counting costs at most a
    /// trim that gives little back.
    #[derive(Debug, Default)]
    pub(super) struct Trimmer {
        last: Option<Sample>,
        /// Slack growth summed over the checks since the last trim.
        freed: u64,
    }

    impl Trimmer {
        /// Whether to trim, given the process `now`.
        pub fn due(&mut self, now: Sample) -> bool {
            // Before the first look, all the slack counts: what start-up (the first lists of
            // the caches) left free.
            let (last_slack, quiet) = match self.last.replace(now) {
                Some(last) => (
                    last.slack(),
                    now.anon_resident <= last.anon_resident.saturating_add(NOISE),
                ),
                None => (0, true),
            };
            self.freed = self
                .freed
                .saturating_add(now.slack().saturating_sub(last_slack));
            quiet && self.freed >= SLACK
        }

        /// A trim happened; `after` is the process right after it.
        pub fn trimmed(&mut self, after: Sample) {
            self.last = Some(after);
            self.freed = 0;
        }
    }

    /// glibc's malloc returns freed memory to the system only from the top of its heap, so
    /// after a burst (a few hundred claims at once) most of the burst's peak stays resident
    /// behind a few live allocations; `malloc_trim` hands the free pages in the middle back as
    /// well. A quiet sidecar is never woken for more than reading its own `statm` and the
    /// allocator's totals.
    pub(super) async fn return_memory_after_bursts() {
        let mut trimmer = Trimmer::default();
        loop {
            tokio::time::sleep(super::TRIM_CHECK).await;
            let Some(now) = sample() else {
                return;
            };
            if trimmer.due(now) {
                // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
                unsafe { libc::malloc_trim(0) };
                trimmer.trimmed(sample().unwrap_or(now));
            }
        }
    }

    pub(super) fn sample() -> Option<Sample> {
        // `mallinfo`, not `mallinfo2`, which needs glibc 2.33 to link: its `int` fields read as
        // unsigned are exact below 4 GiB, far beyond a sidecar's heap.
        // SAFETY: mallinfo only reads the allocator's statistics.
        let info = unsafe { libc::mallinfo() };
        let in_use = u64::from(info.uordblks as u32) + u64::from(info.hblkhd as u32);
        Some(Sample {
            anon_resident: anon_resident_bytes()?,
            in_use,
        })
    }

    /// Resident memory not backed by files (the binary's text is), from `/proc/self/statm`:
    /// resident minus shared pages.
    pub(super) fn anon_resident_bytes() -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let mut fields = statm.split_whitespace().skip(1);
        let resident: u64 = fields.next()?.parse().ok()?;
        let shared: u64 = fields.next()?.parse().ok()?;
        // SAFETY: sysconf only reads a system constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        Some(resident.saturating_sub(shared) * u64::try_from(page).ok()?)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn trims_when_a_burst_is_freed_not_while_it_grows() {
            const KIB: u64 = 1 << 10;
            let at = |anon_kib: u64, in_use_kib: u64| Sample {
                anon_resident: anon_kib * KIB,
                in_use: in_use_kib * KIB,
            };
            let mut trimmer = Trimmer::default();
            assert!(trimmer.due(at(4000, 3000)), "what start-up left");
            trimmer.trimmed(at(3500, 3000));
            assert!(!trimmer.due(at(3500, 3000)), "idle");
            assert!(!trimmer.due(at(4000, 3500)), "a burst begins");
            assert!(!trimmer.due(at(4000, 3500)), "nothing freed");
            assert!(!trimmer.due(at(10000, 6000)), "a burst is growing");
            assert!(trimmer.due(at(10000, 6000)), "growth paused with slack");
            trimmer.trimmed(at(9900, 6000));
            assert!(
                !trimmer.due(at(9900, 6000)),
                "a trim that gave little back is not repeated"
            );
            // Room in pages still partly in use is taken, then a little is freed: both
            // together leave the slack where it was, and what was freed is counted.
            assert!(!trimmer.due(at(9900, 6200)));
            assert!(!trimmer.due(at(9900, 6000)), "200 KiB freed");
            // The burst ends: its memory is freed, the resident set does not move; a few
            // pages touched meanwhile are no growth.
            assert!(trimmer.due(at(9940, 4000)));
            trimmer.trimmed(at(5000, 4000));
            assert!(!trimmer.due(at(5000, 4000)));
            assert!(!trimmer.due(at(5000, 4600)), "freed memory taken again");
            assert!(!trimmer.due(at(8000, 4000)), "growing");
            assert!(trimmer.due(at(8000, 4000)));
            // Allocations larger than the resident set (pages never touched) are no slack.
            assert_eq!(at(2, 5).slack(), 0);
        }

        #[test]
        fn trimming_returns_a_freed_burst() {
            // A burst of small allocations, most freed, a few kept: the heap cannot shrink from
            // its top, only malloc_trim gives the pages in between back.
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
            let peak = anon_resident_bytes().unwrap();
            let before = sample().unwrap();
            drop(burst);
            let freed = sample().unwrap();
            assert!(
                freed.slack() > before.slack() + 10_000_000,
                "freeing shows as slack: {before:?}, then {freed:?}"
            );
            // SAFETY: as in return_memory_after_bursts.
            unsafe { libc::malloc_trim(0) };
            let after = anon_resident_bytes().unwrap();
            assert!(
                after + 10_000_000 < peak,
                "peak {peak} B, after trimming {after} B"
            );
            assert_eq!(kept.len(), 20);
        }
    }
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

/// The static (musl) builds, which the images ship, allocate with mimalloc: musl's own malloc
/// holds about 40 % more resident memory for a sidecar's many small, long-lived allocations
/// (the caches' objects), and returns less of a burst. mimalloc gives freed pages back by
/// itself, shortly after they empty.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A host with transparent huge pages on `always` would back each touched 2 MiB stretch of a
/// heap with a huge page: several times the resident memory of a sidecar's sparse heap, for
/// nothing a sidecar's few lookups would gain.
#[cfg(target_os = "linux")]
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag of this process's memory map.
    let result = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if result != 0 {
        tracing::debug!("transparent huge pages stay as the host has them");
    }
}

#[cfg(not(target_os = "linux"))]
fn no_transparent_huge_pages() {}

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

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_are_turned_off() {
        no_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE only reads a flag of this process.
        let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(disabled, 1);
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
