//! Throughput, latency, API writes, CPU and memory of the real `csi-provisioner` binary, against
//! the in-process API server (with its PV controller) and the mock driver at zero latency.
//!
//! `cargo bench -p external-provisioner --bench provision`. `BENCH_CLAIMS` (default 1000) sets
//! the claims of the unlimited-QPS run, `BENCH_CLAIMS_DEFAULT_QPS` (default 200) those of the run
//! at the default QPS 5 / burst 10, `BENCH_PAIRS` (default 50000) the bound PVC+PV pairs of the
//! idle-memory run, `BENCH_SOURCE_CLAIMS` (default 1000) the clones of one claim and the
//! restores of one snapshot at the default QPS, `BENCH_SEGMENTS` (default 2000),
//! `BENCH_CAPACITY_POLL` (seconds, default 60) and `BENCH_CYCLES` (default 10) the capacity
//! tracking run; `BENCH_CLAIMS_PRODUCTION` (default 1000) those of the production run (QPS 100,
//! burst 200, 100 workers, over HTTPS and HTTP/2 with kube-apiserver's cap of 100 streams a
//! connection), compared with `benches/baseline.txt` (`BENCH_WRITE_BASELINE=1` rewrites it);
//! `BENCH_ONLY=production|unlimited|default|idle|sources|capacity` runs one scenario and
//! `BENCH_BIN` measures another build of the binary, `BENCH_TRACING_ENDPOINT` (an OTLP/HTTP
//! collector, e.g. the test kit's `otlp-collector` on `http://127.0.0.1:4318`) runs it with
//! every operation traced, or as `BENCH_TRACING_SAMPLER` samples (`always_off`: on, none
//! kept). `BENCH_ONLY=burst` (run only when asked)
//! follows the resident memory through a burst at the default QPS: `BENCH_CLAIMS_DEFAULT_QPS`
//! claims created, bound and deleted, then every 10 s for `BENCH_SETTLE` seconds (default 60);
//! `BENCH_HOLD` (seconds) keeps the process running afterwards, for a look at its `/proc`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use testkit::apiserver::{ApiServer, Options, Verb};
use testkit::measure::{
    Baseline, clock_ticks, env_usize, free_port, http_get, percentile, until_queues_empty,
    until_settled, usage,
};
use testkit::mockdriver::{MockDriver, MockHandle};
use testkit::pairs::Pairs;
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-provisioner");
const DRIVER: &str = "hostpath.csi.k8s.io";
const NAMESPACE: &str = "default";
const CLASS: &str = "bench";
const PARALLEL: usize = 64;
/// Longest wait for a phase of a run.
const WAIT_LIMIT: Duration = Duration::from_secs(600);

/// When each claim was first seen Bound, and when each PV disappeared.
#[derive(Default)]
struct Observed {
    bound: HashMap<String, Instant>,
    pv_gone: HashMap<String, Instant>,
}

fn observe(client: kube::Client) -> Arc<Mutex<Observed>> {
    let observed = Arc::new(Mutex::new(Observed::default()));
    let claims = observed.clone();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    tokio::spawn(async move {
        let stream = watcher(pvcs, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            if let watcher::Event::Apply(pvc) | watcher::Event::InitApply(pvc) = event
                && pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            {
                let name = pvc.metadata.name.unwrap_or_default();
                claims
                    .lock()
                    .unwrap()
                    .bound
                    .entry(name)
                    .or_insert_with(Instant::now);
            }
        }
    });
    let volumes = observed.clone();
    let pvs: Api<PersistentVolume> = Api::all(client);
    tokio::spawn(async move {
        let stream = watcher(pvs, watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            if let watcher::Event::Delete(pv) = event {
                let name = pv.metadata.name.unwrap_or_default();
                volumes.lock().unwrap().pv_gone.insert(name, Instant::now());
            }
        }
    });
    observed
}

struct Bench {
    api: ApiServer,
    mock: MockHandle,
    _dir: tempfile::TempDir,
    observed: Arc<Mutex<Observed>>,
    ticks: f64,
}

impl Bench {
    async fn start() -> Self {
        Self::start_with(MockDriver::builder().driver_name(DRIVER)).await
    }

    /// A bench whose API server speaks HTTPS and HTTP/2 with kube-apiserver's stream cap.
    async fn start_tls() -> Self {
        Self::start_over(MockDriver::builder().driver_name(DRIVER), true).await
    }

    async fn start_with(driver: MockDriver) -> Self {
        Self::start_over(driver, false).await
    }

    async fn start_over(driver: MockDriver, tls: bool) -> Self {
        // With the PV controller, as kube-controller-manager binds claims in a cluster.
        let api = ApiServer::start_with(Options {
            pv_controller: true,
            tls,
            ..Options::default()
        })
        .await
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mock = driver
            .call_log_limit(16)
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": CLASS}, "provisioner": DRIVER
        }))
        .unwrap();
        Api::<StorageClass>::all(api.client())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let observed = observe(api.client());
        Self {
            api,
            mock,
            _dir: dir,
            observed,
            ticks: clock_ticks(),
        }
    }

    fn spawn(&self, port: u16, extra: &[&str]) -> Child {
        self.spawn_with_env(port, extra, &[])
    }

    fn spawn_with_env(&self, port: u16, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let bin = std::env::var("BENCH_BIN").unwrap_or_else(|_| BIN.to_string());
        let mut command = Command::new(bin);
        // Every operation traced (or as BENCH_TRACING_SAMPLER says) and exported to the
        // collector there.
        if let Ok(endpoint) = std::env::var("BENCH_TRACING_ENDPOINT") {
            let sampler =
                std::env::var("BENCH_TRACING_SAMPLER").unwrap_or_else(|_| "always_on".to_string());
            command
                .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
                .env("OTEL_TRACES_SAMPLER", sampler);
        }
        testkit::process::die_with_parent(&mut command);
        command
            .clean_env()
            .arg(format!(
                "--kubeconfig={}",
                self.api.kubeconfig_path().display()
            ))
            .arg(format!("--csi-address={}", self.mock.endpoint()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"))
            .arg(format!("--leader-election-namespace={NAMESPACE}"))
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    }

    /// Creates `count` claims `{prefix}-{i}`; returns when each was created.
    async fn create_claims(&self, prefix: &str, count: usize) -> HashMap<String, Instant> {
        self.create_claims_from(prefix, count, None).await
    }

    /// Creates `count` claims `{prefix}-{i}` filled from `source` (a `dataSource`).
    async fn create_claims_from(
        &self,
        prefix: &str,
        count: usize,
        source: Option<serde_json::Value>,
    ) -> HashMap<String, Instant> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.api.client(), NAMESPACE);
        futures::stream::iter(0..count)
            .map(|i| {
                let pvcs = pvcs.clone();
                let source = source.clone();
                async move {
                    let name = format!("{prefix}-{i}");
                    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"storageClassName": CLASS, "accessModes": ["ReadWriteOnce"],
                                 "resources": {"requests": {"storage": "1Gi"}},
                                 "dataSource": source}
                    }))
                    .unwrap();
                    let at = Instant::now();
                    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
                    (name, at)
                }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await
    }

    async fn delete_claims(&self, prefix: &str, count: usize) {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.api.client(), NAMESPACE);
        futures::stream::iter(0..count)
            .map(|i| {
                let pvcs = pvcs.clone();
                async move {
                    pvcs.delete(&format!("{prefix}-{i}"), &DeleteParams::default())
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }

    async fn wait_bound(&self, created: &HashMap<String, Instant>) -> (Vec<Duration>, Instant) {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            assert!(
                Instant::now() < deadline,
                "claims not bound within {WAIT_LIMIT:?}"
            );
            {
                let observed = self.observed.lock().unwrap();
                if created.keys().all(|n| observed.bound.contains_key(n)) {
                    let mut latencies: Vec<Duration> = created
                        .iter()
                        .map(|(n, at)| observed.bound[n].duration_since(*at))
                        .collect();
                    latencies.sort();
                    let last = created
                        .keys()
                        .map(|n| observed.bound[n])
                        .max()
                        .unwrap_or_else(Instant::now);
                    return (latencies, last);
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn wait_pvs_gone(&self) -> Instant {
        let pvs: Api<PersistentVolume> = Api::all(self.api.client());
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            assert!(
                Instant::now() < deadline,
                "PVs not deleted within {WAIT_LIMIT:?}"
            );
            if pvs
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .is_empty()
            {
                return Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes by others than the bench itself: the provisioner's, by resource.
    fn writes(&self) -> (u64, String) {
        let c = self.api.counters();
        let mut parts = Vec::new();
        let mut total = 0;
        for (verb, resource) in [
            (Verb::Create, "persistentvolumes"),
            (Verb::Patch, "persistentvolumes"),
            (Verb::Delete, "persistentvolumes"),
            (Verb::Update, "persistentvolumeclaims"),
            (Verb::Create, "events"),
            (Verb::Patch, "events"),
            (Verb::Create, "configmaps"),
            (Verb::Update, "configmaps"),
            (Verb::Update, "volumesnapshots"),
        ] {
            let n = c.total(verb, resource);
            total += n;
            if n > 0 {
                parts.push(format!("{} {resource} {n}", verb.as_str()));
            }
        }
        (total, parts.join(", "))
    }
}

async fn ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Some((200, body)) = http_get(port, "/metrics").await
            && body.contains("workqueue_depth{name=\"claims\"}")
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the provisioner did not start");
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Where the production run's figures are kept.
const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/baseline.txt");

/// Every request the provisioner made, per claim, and the busiest kinds of them.
fn requests_per_claim(bench: &Bench, count: usize) -> (f64, String) {
    let requests = bench.api.counters().of_program("csi-provisioner");
    let total: u64 = requests.values().sum();
    let mut parts: Vec<(u64, String)> = requests
        .iter()
        .map(|(key, n)| {
            let resource = match &key.subresource {
                Some(sub) => format!("{}/{sub}", key.resource),
                None => key.resource.clone(),
            };
            (*n, format!("{} {resource} {n}", key.verb))
        })
        .collect();
    parts.sort_by_key(|part| std::cmp::Reverse(part.0));
    let detail: Vec<String> = parts.into_iter().map(|(_, part)| part).collect();
    (total as f64 / count as f64, detail.join(", "))
}

/// Compares the production run with [`BASELINE`] (`BENCH_WRITE_BASELINE=1` records it).
fn against_baseline(claims_per_second: f64, requests: f64) {
    let written = || {
        format!(
            "# The production run of the provision bench (`BENCH_ONLY=production cargo bench -p external-provisioner --bench provision`).\n\
             # A change that makes claims_per_second 10 % lower, or requests_per_claim higher, says so in its commit.\n\
             claims_per_second = {claims_per_second:.1}\nrequests_per_claim = {requests:.3}\n"
        )
    };
    let Some(baseline) = Baseline::write_or_read(BASELINE, written) else {
        return;
    };
    let value = |name: &str| baseline.value(name);
    let (Some(base_speed), Some(base_requests)) =
        (value("claims_per_second"), value("requests_per_claim"))
    else {
        println!("the baseline at {BASELINE} does not parse");
        return;
    };
    let ratio = claims_per_second / base_speed;
    println!(
        "against the baseline: ×{ratio:.2} claims/s ({base_speed:.1}), {requests:.3} requests per claim ({base_requests:.3})"
    );
    if ratio < 0.9 {
        println!("SLOWER: {:.0} % below the baseline", (1.0 - ratio) * 100.0);
    }
    if requests > base_requests * 1.01 {
        println!("MORE REQUESTS per claim than the baseline");
    }
}

async fn throughput_run(label: &str, count: usize, extra: &[&str]) {
    throughput_run_on(Bench::start().await, label, count, extra).await;
}

async fn throughput_run_on(bench: Bench, label: &str, count: usize, extra: &[&str]) {
    let port = free_port().unwrap();
    let child = bench.spawn(port, extra);
    let pid = child.id().unwrap();
    ready(port).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle = usage(pid, bench.ticks);
    bench.api.counters().reset();

    let start = Instant::now();
    let created = bench.create_claims("c", count).await;
    let (latencies, last) = bench.wait_bound(&created).await;
    let provision_time = last.duration_since(start);
    let after_provision = usage(pid, bench.ticks);
    let (writes, detail) = bench.writes();
    let (requests, request_detail) = requests_per_claim(&bench, count);
    // Let lone journal forgets and folded events settle before counting the deletions.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (settled, settled_detail) = bench.writes();

    bench.api.counters().reset();
    let delete_start = Instant::now();
    bench.delete_claims("c", count).await;
    let done = bench.wait_pvs_gone().await;
    let delete_time = done.duration_since(delete_start);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (delete_writes, delete_detail) = bench.writes();
    let end = usage(pid, bench.ticks);
    let volumes_left = bench.mock.state().volumes.len();

    let claims_per_second = count as f64 / provision_time.as_secs_f64();
    println!("## {label}: {count} claims");
    println!(
        "provision: {claims_per_second:.0} claims/s; claim→Bound p50 {} p99 {} max {}",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap_or(&Duration::ZERO))
    );
    println!(
        "API writes per provisioned volume: {:.3} when all were bound ({detail}); {:.3} settled ({settled_detail})",
        writes as f64 / count as f64,
        settled as f64 / count as f64
    );
    println!("API requests per provisioned volume: {requests:.3} ({request_detail})");
    println!(
        "delete: {:.0} volumes/s; API writes per deleted volume {:.3} ({delete_detail}); volumes left in the driver: {volumes_left}",
        count as f64 / delete_time.as_secs_f64(),
        delete_writes as f64 / count as f64
    );
    println!(
        "CPU: {:.2} s per 1000 provisions (incl. watch traffic), {:.2} s per 1000 provisions+deletions",
        (after_provision.cpu_seconds - idle.cpu_seconds) * 1000.0 / count as f64,
        (end.cpu_seconds - idle.cpu_seconds) * 1000.0 / count as f64
    );
    println!(
        "RSS: idle {} KiB, peak {} KiB, end {} KiB",
        idle.rss_kib, end.peak_rss_kib, end.rss_kib
    );
    if label.starts_with(PRODUCTION) {
        against_baseline(claims_per_second, requests);
    }
    drop(child);
}

/// The production run's label: the settings vendors deploy the provisioner with at scale.
const PRODUCTION: &str = "production";

/// Resident memory through a burst at the default QPS: `count` claims created, bound, deleted,
/// then the process left alone for `settle`.
async fn burst_run(count: usize, settle: Duration) {
    let bench = Bench::start().await;
    let port = free_port().unwrap();
    let child = bench.spawn(port, &[]);
    let pid = child.id().unwrap();
    ready(port).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let show = |label: &str, u: testkit::measure::Usage| {
        println!(
            "{label}: RSS {} KiB (anon {} KiB, file {} KiB), peak {} KiB",
            u.rss_kib, u.anon_kib, u.file_kib, u.peak_rss_kib
        )
    };
    let idle = usage(pid, bench.ticks);
    println!("## burst: {count} claims created and deleted at the default QPS, pid {pid}");
    show("idle", idle);
    let start = Instant::now();
    let created = bench.create_claims("c", count).await;
    bench.wait_bound(&created).await;
    show(
        &format!("bound after {:.1} s", start.elapsed().as_secs_f64()),
        usage(pid, bench.ticks),
    );
    bench.delete_claims("c", count).await;
    bench.wait_pvs_gone().await;
    show(
        &format!("deleted after {:.1} s", start.elapsed().as_secs_f64()),
        usage(pid, bench.ticks),
    );
    let done = Instant::now();
    while done.elapsed() < settle {
        tokio::time::sleep(Duration::from_secs(10)).await;
        show(
            &format!("{:.0} s after", done.elapsed().as_secs_f64()),
            usage(pid, bench.ticks),
        );
    }
    if let Ok(secs) = std::env::var("BENCH_HOLD") {
        println!("holding for {secs} s");
        tokio::time::sleep(Duration::from_secs(secs.parse().unwrap())).await;
    }
    drop(child);
}

/// Idle memory with `pairs` bound PVC+PV pairs of the driver in the caches.
async fn idle_run(pairs: usize) {
    let bench = Bench::start().await;
    let client = bench.api.client();
    let made = Pairs {
        driver: DRIVER,
        class: CLASS,
        namespace: NAMESPACE,
    };
    let fill = Instant::now();
    made.fill(&client, pairs).await.unwrap();
    let bound = || async { made.bound(&client).await.unwrap() };
    while bound().await < pairs {
        assert!(fill.elapsed() < WAIT_LIMIT, "the pairs are not bound");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let fill = fill.elapsed();

    // Baseline: the same binary with nothing to cache (another API server).
    let empty = Bench::start().await;
    let port = free_port().unwrap();
    let child = empty.spawn(port, &["--kube-api-qps=-1"]);
    ready(port).await;
    until_settled(&[child.id().unwrap()], WAIT_LIMIT).await;
    let baseline = usage(child.id().unwrap(), empty.ticks);
    drop(child);

    let port = free_port().unwrap();
    let child = bench.spawn(port, &["--kube-api-qps=-1"]);
    let pid = child.id().unwrap();
    let started = Instant::now();
    ready(port).await;
    // A marker claim is provisioned only after every cache has synced.
    let marker = bench.create_claims("marker", 1).await;
    bench.wait_bound(&marker).await;
    let synced = started.elapsed();
    // Idle: what start-up queued is worked off, and what it freed is given back.
    until_queues_empty(&[port], WAIT_LIMIT).await;
    until_settled(&[pid], WAIT_LIMIT).await;
    let loaded = usage(pid, bench.ticks);
    assert_eq!(
        bound().await,
        pairs + 1,
        "every pair and the marker still bound"
    );
    let per_pair = (loaded.rss_kib.saturating_sub(baseline.rss_kib)) as f64 * 1024.0 / pairs as f64;
    println!(
        "## idle with {pairs} bound PVC+PV pairs (filled in {:.1} s)",
        fill.as_secs_f64()
    );
    println!(
        "RSS: empty caches {} KiB; with the pairs {} KiB (anon {} KiB), peak {} KiB; {:.0} bytes per pair; start-up to a provisioned claim {:.1} s, {:.2} CPU s",
        baseline.rss_kib,
        loaded.rss_kib,
        loaded.anon_kib,
        loaded.peak_rss_kib,
        per_pair,
        synced.as_secs_f64(),
        loaded.cpu_seconds
    );
    drop(child);
}

/// A snapshot the mock driver holds, with its bound and ready VolumeSnapshot and content.
async fn ready_snapshot(bench: &Bench, name: &str) {
    bench
        .mock
        .update_state(|state| {
            state.snapshots.insert(
                name.to_string(),
                testkit::mockdriver::state::Snapshot {
                    id: name.to_string(),
                    name: name.to_string(),
                    source_volume_id: "gone".into(),
                    size_bytes: 1 << 30,
                    creation_seconds: 1,
                    creation_nanos: 0,
                    answers: 0,
                    group_snapshot_id: String::new(),
                },
            );
        })
        .unwrap();
    let resource = |kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
            plural,
        )
    };
    let snapshots: Api<DynamicObject> = Api::namespaced_with(
        bench.api.client(),
        NAMESPACE,
        &resource("VolumeSnapshot", "volumesnapshots"),
    );
    let contents: Api<DynamicObject> = Api::all_with(
        bench.api.client(),
        &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    let object = |v: serde_json::Value| -> DynamicObject { serde_json::from_value(v).unwrap() };
    let snapshot = snapshots
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": name}, "spec": {"source": {"volumeSnapshotContentName": name}}})),
        )
        .await
        .unwrap();
    contents
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                "metadata": {"name": name},
                "spec": {"driver": DRIVER, "deletionPolicy": "Delete", "source": {"snapshotHandle": name},
                    "volumeSnapshotRef": {"namespace": NAMESPACE, "name": name, "uid": snapshot.metadata.uid}}})),
        )
        .await
        .unwrap();
    let status = |v: serde_json::Value| Patch::Merge(json!({ "status": v }));
    contents
        .patch_status(
            name,
            &PatchParams::default(),
            &status(json!({"snapshotHandle": name, "readyToUse": true})),
        )
        .await
        .unwrap();
    snapshots
        .patch_status(
            name,
            &PatchParams::default(),
            &status(json!({"boundVolumeSnapshotContentName": name, "readyToUse": true, "restoreSize": "1Gi"})),
        )
        .await
        .unwrap();
}

/// A gauge or counter of the provisioner's `/metrics` (the first sample of `name{labels}`).
async fn metric(port: u16, series: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics").await?;
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Capacity tracking over `segments` nodes × 2 classes, polled every `poll`: API writes, queue
/// depth, RSS and time of each cycle when nothing changes.
async fn capacity_run(segments: usize, poll: Duration, cycles: usize) {
    let driver =
        MockDriver::builder()
            .driver_name(DRIVER)
            .capabilities(testkit::mockdriver::Capabilities {
                topology: true,
                ..Default::default()
            });
    let bench = Bench::start_with(driver).await;
    let client = bench.api.client();
    const KEY: &str = "topology.hostpath.csi/zone";
    for class in ["late-1", "late-2"] {
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class}, "provisioner": DRIVER,
            "volumeBindingMode": "WaitForFirstConsumer", "parameters": {"pool": class}
        }))
        .unwrap();
        Api::<StorageClass>::all(client.clone())
            .create(&PostParams::default(), &sc)
            .await
            .unwrap();
    }
    let fill = Instant::now();
    futures::stream::iter(0..segments)
        .map(|i| {
            let client = client.clone();
            async move {
                let name = format!("node-{i}");
                let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(
                    json!({"metadata": {"name": name, "labels": {KEY: format!("z{i}")}}}),
                )
                .unwrap();
                Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
                    .create(&PostParams::default(), &node)
                    .await
                    .unwrap();
                let csinode: k8s_openapi::api::storage::v1::CSINode =
                    serde_json::from_value(json!({"metadata": {"name": name},
                        "spec": {"drivers": [{"name": DRIVER, "nodeID": name, "topologyKeys": [KEY]}]}}))
                    .unwrap();
                Api::<k8s_openapi::api::storage::v1::CSINode>::all(client)
                    .create(&PostParams::default(), &csinode)
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
    println!(
        "## capacity tracking: {segments} segments × 2 classes, poll {poll:?} ({} nodes filled in {:.1} s)",
        segments,
        fill.elapsed().as_secs_f64()
    );
    let port = free_port().unwrap();
    let poll_flag = format!("--capacity-poll-interval={}s", poll.as_secs());
    let child = bench.spawn_with_env(
        port,
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            &poll_flag,
            "--kube-api-capacity-qps=200",
            "--kube-api-capacity-burst=200",
        ],
        &[("NAMESPACE", NAMESPACE)],
    );
    let pid = child.id().unwrap();
    ready(port).await;
    let goal = (segments * 2) as f64;
    let started = Instant::now();
    let deadline = Instant::now() + WAIT_LIMIT;
    while metric(port, "csistoragecapacities_desired_current").await != Some(goal) {
        assert!(
            Instant::now() < deadline,
            "objects not created within {WAIT_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "initial: {} objects created in {:.1} s",
        goal,
        started.elapsed().as_secs_f64()
    );
    let calls = |bench: &Bench| {
        bench
            .mock
            .calls()
            .count(csi_proto::methods::controller::GET_CAPACITY)
    };
    for cycle in 1..=cycles {
        bench.api.counters().reset();
        let start_calls = calls(&bench);
        // A cycle starts with the poll's first GetCapacity and ends with its last.
        let deadline = Instant::now() + poll * 3 + WAIT_LIMIT;
        while calls(&bench) == start_calls {
            assert!(Instant::now() < deadline, "no poll");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let began = Instant::now();
        let mut depth_max = 0.0f64;
        while calls(&bench) < start_calls + goal as u64 {
            assert!(Instant::now() < deadline, "poll did not finish");
            if let Some(depth) = metric(port, "workqueue_depth{name=\"csistoragecapacity\"}").await
            {
                depth_max = depth_max.max(depth);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let took = began.elapsed();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let writes: u64 = [Verb::Create, Verb::Update, Verb::Patch, Verb::Delete]
            .iter()
            .map(|v| bench.api.counters().total(*v, "csistoragecapacities"))
            .sum();
        let now = usage(pid, bench.ticks);
        println!(
            "cycle {cycle}: {} GetCapacity in {}, API writes {writes}, queue depth max {depth_max}, RSS {} KiB, CPU {:.2} s total",
            goal,
            ms(took),
            now.rss_kib,
            now.cpu_seconds
        );
    }
    drop(child);
}

/// Clones of one claim, then restores of one snapshot, at the default QPS: the protection
/// finalizers are written once per source.
async fn sources_run(count: usize) {
    let bench = Bench::start().await;
    let port = free_port().unwrap();
    let child = bench.spawn(port, &[]);
    let pid = child.id().unwrap();
    ready(port).await;
    let source = bench.create_claims("src", 1).await;
    bench.wait_bound(&source).await;
    ready_snapshot(&bench, "snap").await;
    for (label, prefix, data_source) in [
        (
            "clones of one claim",
            "clone",
            json!({"kind": "PersistentVolumeClaim", "name": "src-0"}),
        ),
        (
            "restores of one snapshot",
            "restore",
            json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}),
        ),
    ] {
        tokio::time::sleep(Duration::from_secs(3)).await;
        bench.api.counters().reset();
        let before = usage(pid, bench.ticks);
        let start = Instant::now();
        let created = bench
            .create_claims_from(prefix, count, Some(data_source))
            .await;
        let (latencies, last) = bench.wait_bound(&created).await;
        let elapsed = last.duration_since(start);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (writes, detail) = bench.writes();
        let after = usage(pid, bench.ticks);
        println!("## default QPS 5, burst 10: {count} {label}");
        println!(
            "provision: {:.1} claims/s; claim→Bound p50 {} p99 {}; API writes per volume {:.3} ({detail}); CPU {:.2} s per 1000; RSS {} KiB",
            count as f64 / elapsed.as_secs_f64(),
            ms(percentile(&latencies, 0.5)),
            ms(percentile(&latencies, 0.99)),
            writes as f64 / count as f64,
            (after.cpu_seconds - before.cpu_seconds) * 1000.0 / count as f64,
            after.rss_kib
        );
    }
    drop(child);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    runtime.block_on(async {
        if run("production") {
            throughput_run_on(
                Bench::start_tls().await,
                &format!("{PRODUCTION} (--kube-api-qps=100 --kube-api-burst=200 --worker-threads=100, HTTPS and HTTP/2 capped at 100 streams a connection)"),
                env_usize("BENCH_CLAIMS_PRODUCTION", 1000),
                &["--kube-api-qps=100", "--kube-api-burst=200", "--worker-threads=100"],
            )
            .await;
        }
        if run("unlimited") {
            throughput_run(
                "unlimited QPS (--kube-api-qps=-1)",
                env_usize("BENCH_CLAIMS", 1000),
                &["--kube-api-qps=-1"],
            )
            .await;
        }
        if run("default") {
            throughput_run(
                "default QPS 5, burst 10",
                env_usize("BENCH_CLAIMS_DEFAULT_QPS", 200),
                &[],
            )
            .await;
        }
        if only == "burst" {
            burst_run(
                env_usize("BENCH_CLAIMS_DEFAULT_QPS", 200),
                Duration::from_secs(env_usize("BENCH_SETTLE", 60) as u64),
            )
            .await;
        }
        if run("idle") {
            idle_run(env_usize("BENCH_PAIRS", 50_000)).await;
        }
        if run("sources") {
            sources_run(env_usize("BENCH_SOURCE_CLAIMS", 1000)).await;
        }
        if run("capacity") {
            capacity_run(
                env_usize("BENCH_SEGMENTS", 2000),
                Duration::from_secs(env_usize("BENCH_CAPACITY_POLL", 60) as u64),
                env_usize("BENCH_CYCLES", 10),
            )
            .await;
        }
    });
}
