//! Probing and measuring the sidecar processes that tests and benchmarks start: a free port,
//! a plain HTTP GET, `/proc` figures (resident memory, CPU time) and latency percentiles.

use std::time::Duration;

use crate::process::CleanEnv;

/// Where [`free_port`] looks: below every system's ephemeral range (Linux starts it at 32768,
/// Windows at 49152), so that no port the system hands out by itself (a `bind` to port 0, an
/// outgoing connection) takes the port between the check and the sidecar's own `bind`.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A TCP port on 127.0.0.1 that was free a moment ago; never the same one twice in a process,
/// and in each process from a different start.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(TEST_PORTS.end - TEST_PORTS.start);
    // The first call starts at an offset of this process's own, so that test binaries run side
    // by side rarely try the same ports.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut last = None;
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = TEST_PORTS.start + offset as u16;
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => return Ok(port),
            Err(error) => last = Some(error),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no test port is free")))
}

/// GET over HTTP/1.1 with `Connection: close`: the status code and body, or `None` while
/// nothing answers (bounded to 5 s).
pub async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
        .await
        .ok()?
        .ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// `/proc` figures of a process (Linux; zeros elsewhere).
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub rss_kib: u64,
    pub anon_kib: u64,
    pub file_kib: u64,
    pub peak_rss_kib: u64,
    pub cpu_seconds: f64,
}

/// A benchmark setting from the environment: `name` as a number, else `default`.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Clock ticks per second, for the CPU times of `/proc/<pid>/stat`.
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .clean_env()
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Resident memory and CPU time of `pid` now.
pub fn usage(pid: u32, ticks: f64) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Usage {
        rss_kib: field("VmRSS:"),
        anon_kib: field("RssAnon:"),
        file_kib: field("RssFile:"),
        peak_rss_kib: field("VmHWM:"),
        cpu_seconds: (tick(11) + tick(12)) / ticks,
    }
}

/// The usage of process `pid` once its resident set has changed by less than 256 KiB in each
/// of five seconds running (a cache that has listed everything and settled).
pub async fn steady_usage(pid: u32, ticks: f64) -> Usage {
    let mut last = usage(pid, ticks).rss_kib;
    let mut steady = 0;
    while steady < 5 {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = usage(pid, ticks).rss_kib;
        steady = if now.abs_diff(last) < 256 {
            steady + 1
        } else {
            0
        };
        last = now;
    }
    usage(pid, ticks)
}

/// Whether a sidecar's `/metrics` text shows no work queued or being worked on: every
/// `workqueue_depth` and `workqueue_unfinished_work_seconds` sample is zero.
pub fn queues_empty(metrics: &str) -> bool {
    !metrics.lines().any(|line| {
        (line.starts_with("workqueue_depth{")
            || line.starts_with("workqueue_unfinished_work_seconds{"))
            && line
                .rsplit_once(' ')
                .and_then(|(_, v)| v.parse::<f64>().ok())
                .is_none_or(|v| v != 0.0)
    })
}

/// Waits until the sidecars serving `/metrics` on `ports` all have empty queues (see
/// [`queues_empty`]); how long that took. Panics after `limit`.
pub async fn until_queues_empty(ports: &[u16], limit: Duration) -> Duration {
    let start = std::time::Instant::now();
    loop {
        let mut busy = Vec::new();
        for port in ports {
            match http_get(*port, "/metrics").await {
                Some((200, body)) if queues_empty(&body) => {}
                _ => busy.push(*port),
            }
        }
        if busy.is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "queues still busy after {limit:?} on ports {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long a resident set must not shrink to count as settled: longer than two periods of
/// the sidecars' check for memory to give back after a burst (10 s), so that a measurement is
/// not taken just before a trim.
pub const SETTLED_FOR: Duration = Duration::from_secs(25);

/// Waits until the summed resident set of `pids` has not shrunk by more than a few pages for
/// [`SETTLED_FOR`]. Panics after `limit`.
pub async fn until_settled(pids: &[u32], limit: Duration) {
    let rss = || {
        pids.iter()
            .map(|pid| usage(*pid, 100.0).rss_kib)
            .sum::<u64>()
    };
    let start = std::time::Instant::now();
    let mut lowest = rss();
    let mut since = std::time::Instant::now();
    while since.elapsed() < SETTLED_FOR {
        assert!(
            start.elapsed() < limit,
            "the resident set still shrinks after {limit:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = rss();
        // 256 KiB or less is a few pages touched or given back, not a trim.
        if now + 256 < lowest {
            since = std::time::Instant::now();
        }
        lowest = lowest.min(now);
    }
}

/// A benchmark's baseline file: `name = number` lines under `#` comments.
pub struct Baseline(String);

impl Baseline {
    /// With `BENCH_WRITE_BASELINE` set, writes `written()` to `path` and returns `None`;
    /// otherwise the baseline at `path`, if there is one. Says which on stdout.
    pub fn write_or_read(path: &str, written: impl FnOnce() -> String) -> Option<Self> {
        if std::env::var_os("BENCH_WRITE_BASELINE").is_some() {
            match std::fs::write(path, written()) {
                Ok(()) => println!("baseline written to {path}"),
                Err(err) => println!("cannot write the baseline to {path}: {err}"),
            }
            return None;
        }
        match std::fs::read_to_string(path) {
            Ok(text) => Some(Self(text)),
            Err(_) => {
                println!("no baseline at {path}");
                None
            }
        }
    }

    /// The number recorded as `name`.
    pub fn value(&self, name: &str) -> Option<f64> {
        self.0
            .lines()
            .filter(|line| !line.trim_start().starts_with('#'))
            .filter_map(|line| line.split_once('='))
            .find(|(key, _)| key.trim() == name)
            .and_then(|(_, value)| value.trim().parse().ok())
    }
}

/// The `p` quantile (0..=1) of sorted durations, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&d, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn baseline_values_by_name() {
        let baseline = Baseline("# a = 1\nidle_mib = 130.9\npairs=100000\n".to_string());
        assert_eq!(baseline.value("idle_mib"), Some(130.9));
        assert_eq!(baseline.value("pairs"), Some(100_000.0));
        assert_eq!(baseline.value("a"), None, "comments are not values");
    }

    #[test]
    fn queues_are_empty_when_every_depth_and_unfinished_work_is_zero() {
        let idle = "# HELP workqueue_depth Current depth\n\
                    workqueue_depth{name=\"claims\"} 0\n\
                    workqueue_unfinished_work_seconds{name=\"claims\"} 0\n\
                    workqueue_adds_total{name=\"claims\"} 7\n";
        assert!(queues_empty(idle));
        assert!(!queues_empty(&idle.replace(
            "depth{name=\"claims\"} 0",
            "depth{name=\"claims\"} 3"
        )));
        assert!(!queues_empty(&idle.replace(
            "seconds{name=\"claims\"} 0",
            "seconds{name=\"claims\"} 0.25"
        )));
        assert!(
            !queues_empty("workqueue_depth{name=\"claims\"} x"),
            "unreadable is busy"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_none() {
        let port = free_port().unwrap();
        assert!(http_get(port, "/").await.is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_usage_is_read() {
        let me = usage(std::process::id(), clock_ticks());
        assert!(me.rss_kib > 0 && me.peak_rss_kib >= me.rss_kib);
    }
}
