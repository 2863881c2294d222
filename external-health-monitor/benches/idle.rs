//! Resident memory of the real `csi-external-health-monitor-controller` binary with many
//! volumes and pods cached, against the in-process API server and the mock driver.
//!
//! `cargo bench -p external-health-monitor --bench idle`: `BENCH_CLAIMS` (default 50 000)
//! bound claims with their PVs, then `BENCH_PODS` (default 100 000) pods on one node, half of
//! them mounting a claim; the node watcher on. Each figure is taken once a ListVolumes pass has
//! run on the synced caches and the resident set has been steady for five seconds.
//! Per object: the growth of anonymous memory. `BENCH_BIN` measures another build, e.g.
//! upstream's, on the same objects.

use std::process::Stdio;
use std::time::{Duration, Instant};

use csi_proto::methods::controller::LIST_VOLUMES;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use serde_json::json;
use testkit::apiserver::ApiServer;
use testkit::measure::{Usage, clock_ticks, env_usize, free_port, steady_usage};
use testkit::mockdriver::{MockDriver, MockHandle};
use testkit::population::Population;
use testkit::process::CleanEnv;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_csi-external-health-monitor-controller");
const DRIVER: &str = "health.csi.bench";
const NS: &str = "default";
const NODE: &str = "node-1";

struct Bench {
    api: ApiServer,
    mock: MockHandle,
    _dir: tempfile::TempDir,
    ticks: f64,
}

impl Bench {
    async fn start() -> Self {
        let api = ApiServer::start().await.unwrap();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": NODE},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        Api::<Node>::all(api.client())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mock = MockDriver::builder()
            .driver_name(DRIVER)
            .volume_condition(true)
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

    fn population(&self) -> Population<'_> {
        Population {
            client: self.api.client(),
            namespace: NS,
            driver: DRIVER,
            class: "standard",
        }
    }

    /// The resident set of a monitor started on the current objects, once it has checked the
    /// volumes and its memory is steady; and how long that took.
    async fn resident(&self) -> (Usage, Duration) {
        let bin = std::env::var("BENCH_BIN").unwrap_or_else(|_| BIN.to_string());
        let port = free_port().unwrap();
        let child = Command::new(bin)
            .clean_env()
            .args([
                format!("--kubeconfig={}", self.api.kubeconfig_path().display()),
                format!("--csi-address={}", self.mock.endpoint()),
                format!("--http-endpoint=127.0.0.1:{port}"),
                "--enable-node-watcher".to_string(),
                "--list-volumes-interval=2s".to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let started = Instant::now();
        let passes = self.mock.calls().count(LIST_VOLUMES);
        while self.mock.calls().count(LIST_VOLUMES) <= passes {
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "no ListVolumes pass"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let measured = steady_usage(pid, self.ticks).await;
        let synced = started.elapsed();
        drop(child);
        (measured, synced)
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let claims = env_usize("BENCH_CLAIMS", 50_000);
    let pods = env_usize("BENCH_PODS", 100_000);
    runtime.block_on(async {
        let bench = Bench::start().await;
        let (empty, _) = bench.resident().await;
        bench.population().bound_claims(&bench.mock, claims).await;
        let (with_claims, claims_synced) = bench.resident().await;
        bench.population().pods(pods, NODE).await;
        let (with_pods, pods_synced) = bench.resident().await;
        let per = |more: u64, less: u64, n: usize| {
            (more.saturating_sub(less) * 1024) as f64 / n.max(1) as f64
        };
        println!(
            "== idle: {claims} bound claims with their PVs, then {pods} pods ({} mounting claims) ==",
            pods.div_ceil(2)
        );
        println!(
            "RSS empty {:.1} MiB; with the claims {:.1} MiB (checked and steady after {:.1} s): {:.0} bytes per claim+PV pair; with the pods too {:.1} MiB (after {:.1} s): {:.0} bytes per pod; peak {:.1} MiB",
            mib(empty.rss_kib),
            mib(with_claims.rss_kib),
            claims_synced.as_secs_f64(),
            per(with_claims.anon_kib, empty.anon_kib, claims),
            mib(with_pods.rss_kib),
            pods_synced.as_secs_f64(),
            per(with_pods.anon_kib, with_claims.anon_kib, pods),
            mib(with_pods.peak_rss_kib),
        );
    });
}
