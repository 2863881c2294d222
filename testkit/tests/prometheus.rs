//! Prometheus against the sandbox: `promtool check metrics` on every sidecar's `/metrics`, then a
//! real Prometheus server scraping the sidecars, queried through its HTTP API.
//!
//! Needs `prometheus` and `promtool`: the `PROMETHEUS` and `PROMTOOL` environment variables name
//! them, or they are found in the `PATH`. `scripts/prometheus-test.sh` installs them, builds the
//! sidecars and runs this test with both variables set: then nothing may be missing. Without
//! the variables and the tools (plain `cargo test --workspace` on a fresh machine, which CI runs
//! before the script) the test says how to run it and passes.
#![cfg(unix)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use testkit::process::CleanEnv;
use testkit::sandbox::{self, Outcome, SandboxOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The sidecars with a `/metrics` endpoint (the node-driver-registrar has none, as upstream):
/// step name in the sandbox and binary.
const SCRAPED: [(&str, &str); 6] = [
    ("livenessprobe", "livenessprobe"),
    ("external-attacher", "csi-attacher"),
    ("external-resizer", "csi-resizer"),
    ("external-snapshotter", "csi-snapshotter"),
    ("external-provisioner", "csi-provisioner"),
    (
        "external-health-monitor",
        "csi-external-health-monitor-controller",
    ),
];

/// The sidecars that run workqueues (`workqueue_*{name=...}`).
const WITH_WORKQUEUES: [&str; 4] = [
    "external-attacher",
    "external-resizer",
    "external-snapshotter",
    "external-provisioner",
];

/// `promtool check metrics` complaints that upstream's metric names or HELP texts force on us,
/// as (metric name, text of the complaint). Metric names, label names and HELP texts are part
/// of the drop-in contract (dashboards and alerts query them), so these cannot be fixed here.
///
/// Empty: promtool 2.42 finds nothing to complain about in upstream's names
/// (`csi_sidecar_operations_seconds` is a histogram in a base unit, client-go's
/// `workqueue_*_total` are counters ending in `_total`, the gauges and histograms do not).
/// Anything promtool reports is therefore ours to fix.
const FORCED_BY_UPSTREAM: &[(&str, &str)] = &[];

/// How long Prometheus may take to start, scrape every target and answer the queries.
const WAIT: Duration = Duration::from_secs(60);

fn bin_dir() -> PathBuf {
    testkit::process::target_bin_dir().expect("the test binary is in target/<profile>/deps")
}

/// `$variable` if set, else `name` found in the `PATH`.
fn tool(variable: &str, name: &str) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(variable) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "{variable}={} does not exist",
            path.display()
        );
        return Some(path);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// GET `http://127.0.0.1:<port><path>` over HTTP/1.0 (so the body is never chunked): the status
/// code and body, or `None` when nothing answers within 10 s.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.ok()?;
        let response = String::from_utf8(response).ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, body.to_string()))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()
        .flatten()
}

/// Percent-encoding of a query parameter value.
fn encode(value: &str) -> String {
    let mut encoded = String::new();
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(byte as char);
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// The complaints of `promtool check metrics` about `exposition`, one per line, and whether it
/// could parse the input at all (a parse error is not a lint complaint).
async fn promtool_check(promtool: &Path, exposition: &str) -> (Vec<String>, Result<(), String>) {
    let mut child = Command::new(promtool)
        .clean_env()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(exposition.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("promtool check metrics did not finish within 30 s")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // Exit codes: 0 clean, 3 lint complaints (one "<metric> <text>" line each), else an error.
    match output.status.code() {
        Some(0) => (Vec::new(), Ok(())),
        Some(3) => (
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .map(String::from)
                .collect(),
            Ok(()),
        ),
        _ => (
            Vec::new(),
            Err(format!("promtool: {}: {}", output.status, text.trim())),
        ),
    }
}

fn forced_by_upstream(complaint: &str) -> bool {
    FORCED_BY_UPSTREAM.iter().any(|(metric, text)| {
        complaint
            .strip_prefix(metric)
            .is_some_and(|rest| rest.starts_with(' ') && rest.contains(text))
    })
}

/// The Prometheus server; killed (and its directory removed) when dropped, also on a panic.
struct Prometheus {
    port: u16,
    log: PathBuf,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` scraping every `(job, port)` at 127.0.0.1 each second.
    fn start(binary: &Path, targets: &[(&str, u16)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (job, port) in targets {
            let _ = write!(
                config,
                "  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
            );
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = testkit::measure::free_port().unwrap();
        let log = dir.path().join("prometheus.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = testkit::process::die_with_parent(
            Command::new(binary)
                .clean_env()
                .arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().unwrap())
                .stderr(log_file)
                .kill_on_drop(true),
        )
        .spawn()
        .unwrap();
        Self {
            port,
            log,
            _child: child,
            _dir: dir,
        }
    }

    /// GET on the HTTP API: the `data` of a `success` answer, or `None`.
    async fn api(&self, path: &str) -> Option<Value> {
        let (status, body) = http_get(self.port, path).await?;
        let answer: Value = serde_json::from_str(&body).ok()?;
        (status == 200 && answer["status"] == "success").then(|| answer["data"].clone())
    }

    /// The `job` labels of the series `query` returns.
    async fn jobs_of(&self, query: &str) -> BTreeSet<String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(query)))
            .await;
        data.and_then(|data| data["result"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|series| series["metric"]["job"].as_str().map(String::from))
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Polls `check` every 200 ms until it returns `Some` or [`WAIT`] passes.
async fn poll<T, F, Fut>(mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn prometheus_scrapes_every_sidecar() {
    // Run by the script (CI runs it after `cargo test --workspace`): nothing may be skipped.
    let required =
        std::env::var_os("PROMETHEUS").is_some() || std::env::var_os("PROMTOOL").is_some();
    let (Some(prometheus), Some(promtool)) = (
        tool("PROMETHEUS", "prometheus"),
        tool("PROMTOOL", "promtool"),
    ) else {
        assert!(
            !required,
            "PROMETHEUS and PROMTOOL must both name the tools (or leave both unset)"
        );
        println!(
            "skipped: prometheus and promtool are not installed; run `bash scripts/prometheus-test.sh` \
             (installs Debian's prometheus package, builds the sidecars, runs this test)"
        );
        return;
    };
    // The check can fail: promtool lints what it is given.
    let (complaints, parsed) =
        promtool_check(&promtool, "# TYPE sidecar_calls counter\nsidecar_calls 1\n").await;
    assert_eq!(parsed, Ok(()));
    assert!(
        complaints.len() >= 2 && !complaints.iter().any(|c| forced_by_upstream(c)),
        "promtool check metrics should complain about a counter without HELP and _total: {complaints:?}"
    );

    let bin_dir = bin_dir();
    let missing: Vec<&str> = SCRAPED
        .iter()
        .map(|(_, binary)| *binary)
        .filter(|binary| !bin_dir.join(binary).is_file())
        .collect();
    if !missing.is_empty() {
        assert!(
            !required && std::env::var_os("CI").is_none(),
            "sidecar binaries not built: {missing:?}; run cargo build --workspace --bins"
        );
        println!(
            "skipped: sidecar binaries not built: {missing:?}; run `bash scripts/prometheus-test.sh`"
        );
        return;
    }

    let work = tempfile::tempdir().unwrap();
    let options = SandboxOptions {
        bin_dir,
        work_dir: work.path().to_path_buf(),
        ..SandboxOptions::default()
    };
    let running = sandbox::start(&options).await.unwrap();
    // A built provisioner has no step of its own: it shows in "volume" (the claim is bound).
    for step in [
        "api-server",
        "mock-driver",
        "volume",
        "livenessprobe",
        "external-attacher",
        "external-resizer",
    ] {
        assert!(
            matches!(running.outcome(step), Some(Outcome::Ok(_))),
            "{step}: {:?}",
            running.outcome(step)
        );
    }
    let targets = running.metrics_endpoints().to_vec();
    let jobs: BTreeSet<String> = targets.iter().map(|(job, _)| job.to_string()).collect();
    assert_eq!(
        jobs,
        SCRAPED.iter().map(|(step, _)| step.to_string()).collect(),
        "the sandbox's metrics endpoints"
    );

    // promtool on each exposition, as a scraper sees it.
    let mut unexpected = Vec::new();
    for (job, port) in &targets {
        let (status, body) = http_get(*port, "/metrics")
            .await
            .unwrap_or_else(|| panic!("{job}: no answer on /metrics at port {port}"));
        assert_eq!(status, 200, "{job} /metrics: {body}");
        assert!(
            body.contains("# TYPE csi_sidecar_operations_seconds histogram"),
            "{job} /metrics lacks csi_sidecar_operations_seconds:\n{body}"
        );
        let (complaints, parsed) = promtool_check(&promtool, &body).await;
        if let Err(error) = parsed {
            panic!("{job} /metrics cannot be checked: {error}\n{body}");
        }
        for complaint in complaints {
            if forced_by_upstream(&complaint) {
                println!("{job}: {complaint} (forced by upstream's name)");
            } else {
                unexpected.push(format!("{job}: {complaint}"));
            }
        }
    }
    assert!(
        unexpected.is_empty(),
        "promtool check metrics complaints not forced by upstream's names:\n{}",
        unexpected.join("\n")
    );

    // A real Prometheus server scraping every sidecar.
    let started = Instant::now();
    let server = Prometheus::start(&prometheus, &targets);
    let up = poll(|| async {
        let data = server.api("/api/v1/targets?state=active").await?;
        let active = data["activeTargets"].as_array()?;
        let up: BTreeSet<String> = active
            .iter()
            .filter(|target| target["health"] == "up")
            .filter_map(|target| target["labels"]["job"].as_str().map(String::from))
            .collect();
        (up == jobs).then_some(())
    })
    .await;
    if up.is_none() {
        let targets = server
            .api("/api/v1/targets?state=active")
            .await
            .map(|data| {
                data["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|target| {
                        format!(
                            "{} {} health={} lastError={}",
                            target["labels"]["job"],
                            target["scrapeUrl"],
                            target["health"],
                            target["lastError"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_else(|| "the targets API did not answer".into());
        panic!(
            "not every target up within {WAIT:?}:\n{targets}\nprometheus log:\n{}",
            server.log()
        );
    }
    println!("every target up after {:?}", started.elapsed());

    // What a dashboard queries: every sidecar's CSI calls, the controllers' workqueues.
    let queries: [(&str, BTreeSet<String>); 4] = [
        ("csi_sidecar_operations_seconds_count", jobs.clone()),
        (
            "sum by (job) (rate(csi_sidecar_operations_seconds_bucket{le=\"+Inf\"}[1m]) >= 0)",
            jobs.clone(),
        ),
        (
            "workqueue_adds_total",
            WITH_WORKQUEUES.iter().map(|job| job.to_string()).collect(),
        ),
        (
            "workqueue_depth",
            WITH_WORKQUEUES.iter().map(|job| job.to_string()).collect(),
        ),
    ];
    for (query, expected) in queries {
        let found = poll(|| async {
            let found = server.jobs_of(query).await;
            expected.is_subset(&found).then_some(found)
        })
        .await;
        let found = match found {
            Some(found) => found,
            None => panic!(
                "{query}: series of {:?} expected within {WAIT:?}, got those of {:?}",
                expected,
                server.jobs_of(query).await
            ),
        };
        println!("{query}: series of {found:?}");
    }
    println!("queried after {:?}", started.elapsed());

    drop(server);
    running.stop().await;
}
