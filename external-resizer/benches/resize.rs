//! Throughput, API writes, CPU and memory of the real `csi-resizer` binary, against the
//! in-process API server and the mock driver at zero latency.
//!
//! `cargo bench -p external-resizer --bench resize`. Scenarios (`BENCH_ONLY=` one of them):
//! - `unlimited`: `BENCH_EXPANSIONS` (default 1000) block claims grown at `--kube-api-qps=-1`;
//! - `default`: `BENCH_EXPANSIONS_DEFAULT_QPS` (default 1000) claims at the default QPS 5;
//! - `idle`: resident memory with `BENCH_CLAIMS` (default 50 000) bound claims and their PVs and
//!   `BENCH_PODS` (default 100 000) pods, half of them mounting a claim.
//!
//! Block volumes need no node step, so each expansion is the whole controller flow: the claim
//! marked in progress, ControllerExpandVolume, the PV's capacity, the claim finished. Its floor
//! is 3 API writes (2 claim status patches, 1 PV patch) and 2 Events.
//! `BENCH_BIN` measures another build of the binary.

use std::process::Stdio;
use std::time::{Duration, Instant};

use csi_proto::methods::controller::CONTROLLER_EXPAND_VOLUME;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::apiserver::{ApiServer, Verb};
use testkit::measure::{clock_ticks, env_usize, free_port, steady_usage, usage};
use testkit::mockdriver::{MockDriver, MockHandle};
use testkit::population::Population;
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-resizer");
const DRIVER: &str = "resizer.csi.bench";
const NS: &str = "default";
const PARALLEL: usize = 64;

struct Bench {
    api: ApiServer,
    mock: MockHandle,
    _dir: tempfile::TempDir,
    ticks: f64,
}

impl Bench {
    async fn start() -> Self {
        let api = ApiServer::start().await.unwrap();
        // kube-apiserver lets only claims of a class that allows expansion grow.
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "expandable"},
            "provisioner": DRIVER,
            "allowVolumeExpansion": true,
        }))
        .unwrap();
        Api::<StorageClass>::all(api.client())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mock = MockDriver::builder()
            .driver_name(DRIVER)
            .call_log_limit(0)
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        Self {
            api,
            mock,
            _dir: dir,
            ticks: clock_ticks(),
        }
    }

    fn spawn(&self, port: u16, extra: &[&str]) -> Child {
        let mut args = vec![
            format!("--kubeconfig={}", self.api.kubeconfig_path().display()),
            format!("--csi-address={}", self.mock.endpoint()),
            format!("--http-endpoint=127.0.0.1:{port}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let bin = std::env::var("BENCH_BIN").unwrap_or_else(|_| BIN.to_string());
        Command::new(bin)
            .clean_env()
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    fn population(&self) -> Population<'_> {
        Population {
            client: self.api.client(),
            namespace: NS,
            driver: DRIVER,
            class: "expandable",
        }
    }

    async fn bound_claims(&self, count: usize) {
        self.population().bound_claims(&self.mock, count).await;
    }

    async fn pods(&self, count: usize) {
        self.population().pods(count, "node-1").await;
    }

    async fn grow(&self, count: usize) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.api.client(), NS);
        let patch = json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}});
        futures::stream::iter(0..count)
            .map(|i| {
                let (claims, patch) = (claims.clone(), patch.clone());
                async move {
                    claims
                        .patch(
                            &format!("c-{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }

    /// Waits until every claim has its new capacity.
    async fn wait_grown(&self, count: usize) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.api.client(), NS);
        loop {
            let list = claims.list(&ListParams::default()).await.unwrap();
            let grown = list
                .items
                .iter()
                .filter(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .and_then(|c| c.get("storage"))
                        .is_some_and(|q| q.0 == "2Mi")
                })
                .count();
            if grown >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if let Some((_, body)) = testkit::measure::http_get(port, "/metrics").await
            && body.contains("workqueue_depth")
        {
            return;
        }
        assert!(Instant::now() < deadline, "csi-resizer did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn throughput_run(label: &str, count: usize, extra: &[&str]) {
    let bench = Bench::start().await;
    bench.bound_claims(count).await;
    let port = free_port().unwrap();
    let child = bench.spawn(port, extra);
    let pid = child.id().unwrap();
    ready(port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = usage(pid, bench.ticks);
    let counters = bench.api.counters();
    counters.reset();
    let started = Instant::now();
    bench.grow(count).await;
    bench.wait_grown(count).await;
    let took = started.elapsed();
    let done = usage(pid, bench.ticks);
    // The Events of the last expansions are written after them.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        bench.mock.calls().count(CONTROLLER_EXPAND_VOLUME),
        count as u64
    );
    let per = |n: u64| n as f64 / count as f64;
    let claim_status =
        counters.get_subresource(Verb::Patch, "persistentvolumeclaims", Some("status"));
    let pv_patches = counters.get(Verb::Patch, "persistentvolumes");
    let events = counters.total(Verb::Create, "events") + counters.total(Verb::Patch, "events");
    let bench_writes = counters.get(Verb::Patch, "persistentvolumeclaims");
    println!("== {label}: {count} expansions ==");
    println!(
        "{:.1} expansions/s ({:.1} s for all); CPU {:.2} s",
        count as f64 / took.as_secs_f64(),
        took.as_secs_f64(),
        done.cpu_seconds - idle.cpu_seconds
    );
    println!(
        "API writes per expansion: {:.2} claim status patches, {:.2} PV patches ({:.2} in all; floor 3), {:.2} Event writes (floor 2); other writes {}",
        per(claim_status),
        per(pv_patches),
        per(claim_status + pv_patches),
        per(events),
        counters.writes() - claim_status - pv_patches - events - bench_writes,
    );
    println!(
        "RSS idle {:.1} MiB with {count} claims, after {:.1} MiB, peak {:.1} MiB",
        mib(idle.rss_kib),
        mib(done.rss_kib),
        mib(done.peak_rss_kib)
    );
    drop(child);
}

/// How many claims the resizer's queue has taken in: every claim is queued once its cache has
/// listed it.
async fn queued(port: u16) -> u64 {
    let Some((_, body)) = testkit::measure::http_get(port, "/metrics").await else {
        return 0;
    };
    let series = format!("workqueue_adds_total{{name=\"{DRIVER}-pvc\"}}");
    body.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Resident memory of a resizer started on the current objects (`claims` of them), once its
/// caches have synced.
async fn resident(bench: &Bench, claims: usize) -> (testkit::measure::Usage, Duration) {
    let port = free_port().unwrap();
    let child = bench.spawn(port, &[]);
    let pid = child.id().unwrap();
    let started = Instant::now();
    ready(port).await;
    while queued(port).await < claims as u64 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "caches not synced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The pods' list ends after the claims': the resident set is steady once it has.
    let steady = steady_usage(pid, bench.ticks).await;
    (steady, started.elapsed())
}

async fn idle_run(claims: usize, pods: usize) {
    let bench = Bench::start().await;
    let (empty, _) = resident(&bench, 0).await;
    bench.bound_claims(claims).await;
    let (with_claims, claims_synced) = resident(&bench, claims).await;
    bench.pods(pods).await;
    let (with_pods, pods_synced) = resident(&bench, claims).await;
    let per = |more: u64, less: u64, n: usize| {
        (more.saturating_sub(less) * 1024) as f64 / n.max(1) as f64
    };
    println!(
        "== idle: {claims} bound claims with their PVs, then {pods} pods ({} mounting claims) ==",
        pods.div_ceil(2)
    );
    println!(
        "RSS empty {:.1} MiB; with the claims {:.1} MiB (steady after {:.1} s): {:.0} bytes per claim+PV pair; with the pods too {:.1} MiB (steady after {:.1} s): {:.0} bytes per pod; peak {:.1} MiB",
        mib(empty.rss_kib),
        mib(with_claims.rss_kib),
        claims_synced.as_secs_f64(),
        per(with_claims.anon_kib, empty.anon_kib, claims),
        mib(with_pods.rss_kib),
        pods_synced.as_secs_f64(),
        per(with_pods.anon_kib, with_claims.anon_kib, pods),
        mib(with_pods.peak_rss_kib),
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    runtime.block_on(async {
        if run("unlimited") {
            throughput_run(
                "unlimited QPS (--kube-api-qps=-1)",
                env_usize("BENCH_EXPANSIONS", 1000),
                &["--kube-api-qps=-1", "--handle-volume-inuse-error=false"],
            )
            .await;
        }
        if run("default") {
            throughput_run(
                "default QPS 5, burst 10",
                env_usize("BENCH_EXPANSIONS_DEFAULT_QPS", 1000),
                &[],
            )
            .await;
        }
        if run("idle") {
            idle_run(
                env_usize("BENCH_CLAIMS", 50_000),
                env_usize("BENCH_PODS", 100_000),
            )
            .await;
        }
    });
}
