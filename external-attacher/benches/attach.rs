//! Throughput, latency, memory, CPU and API writes of the real `csi-attacher` binary, against
//! the in-process API server and the mock driver at zero latency.
//!
//! `cargo bench -p external-attacher --bench attach`. Sizes can be changed with
//! `BENCH_VAS` (unlimited QPS, default 1000), `BENCH_VAS_DEFAULT_QPS` (default 300: at 5 QPS a
//! run is bound by the rate limit, not by the attacher) and `BENCH_STORM` (default 1000);
//! `BENCH_ONLY=unlimited|default|storm` runs one scenario, `BENCH_BIN` measures another build of
//! the binary, `BENCH_SMAPS=1` lists the largest resident mappings at idle, and
//! `BENCH_LOG=<file>` keeps the binary's log at `-v=5`.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_proto::methods::controller::CONTROLLER_UNPUBLISH_VOLUME;
use csi_proto::v1::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_proto::v1::{CreateVolumeRequest, VolumeCapability};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use sidecar_kit::driver::connection::{self, ConnectOptions, LossPolicy};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::process::metrics::CsiMetrics;
use testkit::apiserver::{ApiServer, Verb};
use testkit::measure::{clock_ticks, env_usize, percentile, usage};
use testkit::mockdriver::{MockDriver, MockHandle};
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-attacher");
const DRIVER: &str = "hostpath.csi.k8s.io";
const PARALLEL_CREATES: usize = 64;

async fn metrics_up(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let _ = stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await;
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body).await;
    body.contains("workqueue_depth{name=\"csi-attacher-va\"}")
}

/// When each VolumeAttachment was first seen attached, and when it was deleted.
#[derive(Default)]
struct Observed {
    attached: HashMap<String, Instant>,
    deleted: HashMap<String, Instant>,
}

fn observe(client: kube::Client) -> Arc<Mutex<Observed>> {
    let observed = Arc::new(Mutex::new(Observed::default()));
    let sink = observed.clone();
    tokio::spawn(async move {
        let stream = watcher(
            Api::<VolumeAttachment>::all(client),
            watcher::Config::default(),
        );
        futures::pin_mut!(stream);
        while let Ok(Some(event)) = stream.try_next().await {
            let now = Instant::now();
            let mut o = sink.lock().unwrap();
            match event {
                watcher::Event::Apply(va) | watcher::Event::InitApply(va)
                    if va.status.as_ref().is_some_and(|s| s.attached) =>
                {
                    let name = va.metadata.name.unwrap_or_default();
                    o.attached.entry(name).or_insert(now);
                }
                watcher::Event::Delete(va) => {
                    o.deleted.insert(va.metadata.name.unwrap_or_default(), now);
                }
                _ => {}
            }
        }
    });
    observed
}

struct Bench {
    api: ApiServer,
    mock: MockHandle,
    csi: CsiClient,
    _dir: tempfile::TempDir,
    observed: Arc<Mutex<Observed>>,
    ticks: f64,
}

impl Bench {
    async fn start() -> Self {
        let api = ApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mock = MockDriver::builder()
            .driver_name(DRIVER)
            .call_log_limit(0)
            .default_volume_size(1 << 20)
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        let connection = connection::connect(
            &mock.endpoint(),
            ConnectOptions {
                dial_timeout: Some(Duration::from_secs(5)),
                policy: LossPolicy::Reconnect,
            },
        )
        .await
        .unwrap();
        let csi = CsiClient::new(connection, CsiMetrics::new().unwrap());
        let csinode: CSINode = serde_json::from_value(json!({
            "metadata": {"name": "node-1"},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": "nid-1"}]},
        }))
        .unwrap();
        Api::<CSINode>::all(api.client())
            .create(&PostParams::default(), &csinode)
            .await
            .unwrap();
        let observed = observe(api.client());
        Self {
            api,
            mock,
            csi,
            _dir: dir,
            observed,
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
        // BENCH_BIN measures another build of the binary (e.g. other profile settings).
        let bin = std::env::var("BENCH_BIN").unwrap_or_else(|_| BIN.to_string());
        // BENCH_LOG keeps the binary's log (at -v=5) in that file.
        let stderr = match std::env::var("BENCH_LOG") {
            Ok(path) => {
                args.push("--v=5".into());
                Stdio::from(std::fs::File::create(path).unwrap())
            }
            Err(_) => Stdio::null(),
        };
        testkit::process::spawn_sidecar(Command::new(bin).args(args), stderr)
            .expect("the attacher starts")
    }

    /// Volumes in the driver and their PVs, named `{prefix}-{i}`.
    async fn volumes(&self, prefix: &str, count: usize) {
        let pvs: Api<PersistentVolume> = Api::all(self.api.client());
        futures::stream::iter(0..count)
            .map(|i| {
                let pvs = pvs.clone();
                let csi = self.csi.clone();
                async move {
                    let name = format!("{prefix}-{i}");
                    let request = CreateVolumeRequest {
                        name: name.clone(),
                        volume_capabilities: vec![VolumeCapability {
                            access_mode: Some(AccessMode {
                                mode: Mode::SingleNodeWriter as i32,
                            }),
                            access_type: Some(AccessType::Mount(MountVolume::default())),
                        }],
                        ..Default::default()
                    };
                    let id = csi
                        .create_volume(request, CallOptions::timeout(Duration::from_secs(10)))
                        .await
                        .unwrap()
                        .volume
                        .unwrap()
                        .volume_id;
                    let pv: PersistentVolume = serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                                 "csi": {"driver": DRIVER, "volumeHandle": id, "fsType": "ext4"}},
                    }))
                    .unwrap();
                    pvs.create(&PostParams::default(), &pv).await.unwrap();
                }
            })
            .buffer_unordered(PARALLEL_CREATES)
            .collect::<Vec<_>>()
            .await;
    }

    /// Creates VAs for the PVs `{prefix}-{i}`; returns their creation times.
    async fn create_vas(&self, prefix: &str, count: usize) -> HashMap<String, Instant> {
        let vas: Api<VolumeAttachment> = Api::all(self.api.client());
        futures::stream::iter(0..count)
            .map(|i| {
                let vas = vas.clone();
                async move {
                    let name = format!("va-{prefix}-{i}");
                    let va: VolumeAttachment = serde_json::from_value(json!({
                        "metadata": {"name": name},
                        "spec": {"attacher": DRIVER, "nodeName": "node-1",
                                 "source": {"persistentVolumeName": format!("{prefix}-{i}")}},
                    }))
                    .unwrap();
                    let at = Instant::now();
                    vas.create(&PostParams::default(), &va).await.unwrap();
                    (name, at)
                }
            })
            .buffer_unordered(PARALLEL_CREATES)
            .collect()
            .await
    }

    async fn delete_vas(&self, prefix: &str, count: usize) -> Instant {
        let vas: Api<VolumeAttachment> = Api::all(self.api.client());
        let started = Instant::now();
        futures::stream::iter(0..count)
            .map(|i| {
                let vas = vas.clone();
                async move {
                    vas.delete(&format!("va-{prefix}-{i}"), &DeleteParams::default())
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(PARALLEL_CREATES)
            .collect::<Vec<_>>()
            .await;
        started
    }

    /// Waits until every name is attached; returns the latencies (sorted) and the time of the last.
    async fn wait_attached(&self, created: &HashMap<String, Instant>) -> (Vec<Duration>, Instant) {
        loop {
            {
                let o = self.observed.lock().unwrap();
                if created.keys().all(|n| o.attached.contains_key(n)) {
                    let mut latencies: Vec<Duration> = created
                        .iter()
                        .map(|(n, at)| o.attached[n].saturating_duration_since(*at))
                        .collect();
                    latencies.sort();
                    let last = created.keys().map(|n| o.attached[n]).max().unwrap();
                    return (latencies, last);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_deleted(&self, prefix: &str, count: usize) -> Instant {
        let names: Vec<String> = (0..count).map(|i| format!("va-{prefix}-{i}")).collect();
        loop {
            {
                let o = self.observed.lock().unwrap();
                if names.iter().all(|n| o.deleted.contains_key(n)) {
                    return names.iter().map(|n| o.deleted[n]).max().unwrap();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Writes by the attacher: everything but the bench's own VolumeAttachment creates and
    /// deletes.
    fn attacher_writes(&self) -> u64 {
        let c = self.api.counters();
        c.writes()
            - c.get(Verb::Create, "volumeattachments")
            - c.get(Verb::Delete, "volumeattachments")
    }
}

async fn ready(child: &Child, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !metrics_up(port).await {
        assert!(Instant::now() < deadline, "csi-attacher did not start");
        assert!(child.id().is_some());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

async fn throughput_run(label: &str, count: usize, qps: &[&str]) {
    let bench = Bench::start().await;
    bench.volumes("pv", count).await;
    let port = testkit::measure::free_port().unwrap();
    let child = bench.spawn(port, qps);
    let pid = child.id().unwrap();
    ready(&child, port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = usage(pid, bench.ticks);
    if std::env::var_os("BENCH_SMAPS").is_some() {
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
        let mut current = String::new();
        for line in smaps.lines() {
            if line.contains('-') && !line.starts_with(|c: char| c.is_ascii_uppercase()) {
                current = line.to_string();
            } else if let Some(rss) = line.strip_prefix("Rss:") {
                let kib: u64 = rss
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse()
                    .unwrap_or(0);
                if kib >= 64 {
                    println!("{kib:>8} kB  {current}");
                }
            }
        }
    }

    bench.api.counters().reset();
    let before = usage(pid, bench.ticks);
    let started = Instant::now();
    let created = bench.create_vas("pv", count).await;
    let (latencies, last) = bench.wait_attached(&created).await;
    let attach_time = last.duration_since(started);
    let attached = usage(pid, bench.ticks);
    let writes_per_attach = bench.attacher_writes() as f64 / count as f64;

    bench.api.counters().reset();
    let deleted_from = bench.delete_vas("pv", count).await;
    let last = bench.wait_deleted("pv", count).await;
    let detach_time = last.duration_since(deleted_from);
    let detached = usage(pid, bench.ticks);
    let detach_writes = bench.attacher_writes() as f64 / count as f64;
    assert_eq!(
        bench.mock.calls().count(CONTROLLER_UNPUBLISH_VOLUME),
        count as u64
    );

    println!("== {label}: {count} VolumeAttachments ==");
    println!(
        "idle RSS after start-up {:.1} MiB (anonymous {:.1} MiB, file-backed {:.1} MiB)",
        idle.rss_kib as f64 / 1024.0,
        idle.anon_kib as f64 / 1024.0,
        idle.file_kib as f64 / 1024.0,
    );
    println!(
        "attach: {:.1}/s, latency p50 {} p99 {} max {}",
        count as f64 / attach_time.as_secs_f64(),
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap()),
    );
    println!(
        "detach: {:.1}/s ({} for all)",
        count as f64 / detach_time.as_secs_f64(),
        ms(detach_time)
    );
    println!("API writes per attach {writes_per_attach:.2}, per detach {detach_writes:.2}");
    println!(
        "CPU seconds: attach {:.2}, detach {:.2}; RSS after {:.1} MiB, peak {:.1} MiB",
        attached.cpu_seconds - before.cpu_seconds,
        detached.cpu_seconds - attached.cpu_seconds,
        detached.rss_kib as f64 / 1024.0,
        detached.peak_rss_kib as f64 / 1024.0,
    );
    drop(child);
}

/// Attach latency of new VolumeAttachments while a detach storm is queued.
async fn storm_run(storm: usize, attaches: usize) {
    let bench = Bench::start().await;
    bench.volumes("old", storm).await;
    bench.volumes("new", attaches).await;
    let port = testkit::measure::free_port().unwrap();
    let child = bench.spawn(port, &["--kube-api-qps=-1"]);
    ready(&child, port).await;
    let created = bench.create_vas("old", storm).await;
    bench.wait_attached(&created).await;

    // Every detach takes 100 ms in the driver: 10 workers need about `storm / 100` seconds.
    bench
        .mock
        .faults()
        .set_latency(CONTROLLER_UNPUBLISH_VOLUME, Duration::from_millis(100));
    let storm_started = bench.delete_vas("old", storm).await;
    let created = bench.create_vas("new", attaches).await;
    let (latencies, _) = bench.wait_attached(&created).await;
    let storm_end = bench.wait_deleted("old", storm).await;
    println!(
        "== attach during a detach storm: {storm} detaches of 100 ms queued, {attaches} attaches =="
    );
    println!(
        "attach latency p50 {} p99 {} max {}; the storm took {}",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99)),
        ms(*latencies.last().unwrap()),
        ms(storm_end.duration_since(storm_started)),
    );
    drop(child);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // BENCH_ONLY=unlimited|default|storm runs one scenario.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    runtime.block_on(async {
        if run("unlimited") {
            throughput_run(
                "unlimited QPS (--kube-api-qps=-1)",
                env_usize("BENCH_VAS", 1000),
                &["--kube-api-qps=-1"],
            )
            .await;
        }
        if run("default") {
            throughput_run(
                "default QPS 5, burst 10",
                env_usize("BENCH_VAS_DEFAULT_QPS", 300),
                &[],
            )
            .await;
        }
        if run("storm") {
            storm_run(env_usize("BENCH_STORM", 1000), 100).await;
        }
    });
}
