//! Throughput, driver calls, API writes, CPU and memory of the real `csi-snapshotter` binary,
//! against the in-process API server and the mock driver at zero latency.
//!
//! `cargo bench -p external-snapshotter --bench snapshot`. Scenarios (`BENCH_ONLY=` one of them):
//! - `unlimited`: `BENCH_SNAPSHOTS` (default 1000) snapshots cut and deleted at
//!   `--kube-api-qps=-1`;
//! - `default`: `BENCH_SNAPSHOTS_DEFAULT_QPS` (default 1000) at the default QPS 5;
//! - `idle`: resident memory with `BENCH_CONTENTS` (default 50 000) ready contents cached.
//!
//! The bench plays the snapshot-controller: it creates each VolumeSnapshotContent bound to a
//! VolumeSnapshot (with the finalizer and a class), and deletes it as the controller does (the
//! `volumesnapshot-being-deleted` annotation, then DELETE). The mock driver says a snapshot is
//! not ready for its first `BENCH_NOT_READY` answers (default 3). Per snapshot the floor is one
//! CreateSnapshot and `BENCH_NOT_READY` ListSnapshots, 4 content writes to cut it (the
//! being-created annotation set and removed, the status when cut and when ready) and 2 to
//! delete it (the status cleared, the finalizer removed).
//! `BENCH_BIN` measures another build (upstream's `csi-snapshotter`).

use std::process::Stdio;
use std::time::{Duration, Instant};

use csi_proto::methods::controller::{CREATE_SNAPSHOT, DELETE_SNAPSHOT, LIST_SNAPSHOTS};
use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::json;
use testkit::apiserver::{ApiServer, Verb};
use testkit::measure::{clock_ticks, env_usize, free_port, steady_usage, usage};
use testkit::mockdriver::{MockDriver, MockHandle};
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-snapshotter");
const DRIVER: &str = "snapshotter.csi.bench";
const PARALLEL: usize = 64;

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    )
}

struct Bench {
    api: ApiServer,
    mock: MockHandle,
    contents: Api<DynamicObject>,
    _dir: tempfile::TempDir,
    ticks: f64,
}

impl Bench {
    async fn start(not_ready: u32) -> Self {
        let api = ApiServer::start().await.unwrap();
        let classes: Api<DynamicObject> = Api::all_with(
            api.client(),
            &resource("VolumeSnapshotClass", "volumesnapshotclasses"),
        );
        let class = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
            "metadata": {"name": "bench"}, "driver": DRIVER, "deletionPolicy": "Delete",
        });
        classes
            .create(
                &PostParams::default(),
                &serde_json::from_value(class).unwrap(),
            )
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mock = MockDriver::builder()
            .driver_name(DRIVER)
            .call_log_limit(0)
            .snapshot_ready_after(not_ready)
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .unwrap();
        // One source volume for every snapshot.
        mock.update_state(|s| {
            let volume = testkit::mockdriver::state::Volume {
                id: "vol-0".into(),
                name: "vol-0".into(),
                capacity_bytes: 1 << 20,
                ..Default::default()
            };
            s.volumes.insert("vol-0".into(), volume);
        })
        .unwrap();
        Self {
            contents: Api::all_with(
                api.client(),
                &resource("VolumeSnapshotContent", "volumesnapshotcontents"),
            ),
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
            "--leader-election-namespace=default".to_string(),
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

    /// `count` contents `c-{i}` as the snapshot-controller makes them; `ready` ones carry the
    /// status of a snapshot the driver has cut (for the idle scenario).
    async fn contents(&self, count: usize, ready: bool) {
        let contents = &self.contents;
        futures::stream::iter(0..count)
            .map(|i| async move {
                let content = json!({
                    "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                    "metadata": {"name": format!("c-{i}"),
                        "finalizers": ["snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"]},
                    "spec": {"driver": DRIVER, "deletionPolicy": "Delete",
                        "source": {"volumeHandle": "vol-0"}, "volumeSnapshotClassName": "bench",
                        "volumeSnapshotRef": {"kind": "VolumeSnapshot", "namespace": "default",
                            "name": format!("s-{i}"), "uid": format!("00000000-0000-0000-0000-{i:012}")}},
                });
                contents
                    .create(&PostParams::default(), &serde_json::from_value(content).unwrap())
                    .await
                    .unwrap();
                if ready {
                    let status = json!({"status": {"snapshotHandle": format!("snap-{i}"),
                        "readyToUse": true, "creationTime": 1_700_000_000_000_000_000_i64,
                        "restoreSize": 1 << 20}});
                    contents
                        .patch_status(&format!("c-{i}"), &PatchParams::default(), &Patch::Merge(&status))
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }

    /// Deletes every content as the snapshot-controller does once its VolumeSnapshot goes.
    async fn delete_all(&self, count: usize) {
        let contents = &self.contents;
        let annotate = json!({"metadata": {"annotations": {
            "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted": "yes"}}});
        futures::stream::iter(0..count)
            .map(|i| {
                let annotate = annotate.clone();
                async move {
                    let name = format!("c-{i}");
                    contents
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&annotate))
                        .await
                        .unwrap();
                    contents
                        .delete(&name, &DeleteParams::default())
                        .await
                        .unwrap();
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
    }

    async fn ready_count(&self) -> usize {
        let list = self.contents.list(&ListParams::default()).await.unwrap();
        list.items
            .iter()
            .filter(|c| c.data.pointer("/status/readyToUse") == Some(&json!(true)))
            .count()
    }

    async fn wait_ready(&self, count: usize) {
        while self.ready_count().await < count {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_gone(&self) {
        loop {
            let list = self.contents.list(&ListParams::default()).await.unwrap();
            if list.items.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn metrics(port: u16) -> Option<String> {
    testkit::measure::http_get(port, "/metrics")
        .await
        .map(|(_, body)| body)
}

async fn ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if metrics(port)
            .await
            .is_some_and(|body| body.contains("workqueue_depth"))
        {
            return;
        }
        assert!(Instant::now() < deadline, "csi-snapshotter did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many contents the queue has taken in: every content is queued once listed.
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

async fn throughput_run(label: &str, count: usize, not_ready: u32, extra: &[&str]) {
    let bench = Bench::start(not_ready).await;
    let port = free_port().unwrap();
    let child = bench.spawn(port, extra);
    let pid = child.id().unwrap();
    ready(port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = usage(pid, bench.ticks);
    let counters = bench.api.counters();
    counters.reset();
    let started = Instant::now();
    bench.contents(count, false).await;
    bench.wait_ready(count).await;
    let cut = started.elapsed();
    let after_cut = usage(pid, bench.ticks);
    let content_patches = counters.get(Verb::Patch, "volumesnapshotcontents");
    let status_patches =
        counters.get_subresource(Verb::Patch, "volumesnapshotcontents", Some("status"));
    let create_calls = bench.mock.calls().count(CREATE_SNAPSHOT);
    let list_calls = bench.mock.calls().count(LIST_SNAPSHOTS);
    let journal_writes =
        counters.total(Verb::Update, "configmaps") + counters.total(Verb::Create, "configmaps");
    counters.reset();
    let deleting = Instant::now();
    bench.delete_all(count).await;
    bench.wait_gone().await;
    let deleted = deleting.elapsed();
    let done = usage(pid, bench.ticks);
    let delete_patches = counters.get(Verb::Patch, "volumesnapshotcontents")
        + counters.get_subresource(Verb::Patch, "volumesnapshotcontents", Some("status"))
        - count as u64;
    let per = |n: u64| n as f64 / count as f64;
    println!("== {label}: {count} snapshots, ready after {not_ready} not-ready answers ==");
    println!(
        "cut and ready: {:.1} snapshots/s ({:.1} s); deleted: {:.1} snapshots/s ({:.1} s); CPU {:.2} s + {:.2} s",
        count as f64 / cut.as_secs_f64(),
        cut.as_secs_f64(),
        count as f64 / deleted.as_secs_f64(),
        deleted.as_secs_f64(),
        after_cut.cpu_seconds - idle.cpu_seconds,
        done.cpu_seconds - after_cut.cpu_seconds,
    );
    println!(
        "driver calls per snapshot: CreateSnapshot {:.2} (floor 1), ListSnapshots {:.2} (floor {not_ready}), DeleteSnapshot {:.2}; content writes per snapshot: {:.2} to cut (floor 4: {:.2} metadata, {:.2} status), {:.2} to delete (floor 2); journal writes {journal_writes}",
        per(create_calls),
        per(list_calls),
        per(bench.mock.calls().count(DELETE_SNAPSHOT)),
        per(content_patches + status_patches),
        per(content_patches),
        per(status_patches),
        per(delete_patches),
    );
    println!(
        "RSS idle {:.1} MiB, after cutting {:.1} MiB, after deleting {:.1} MiB, peak {:.1} MiB",
        mib(idle.rss_kib),
        mib(after_cut.rss_kib),
        mib(done.rss_kib),
        mib(done.peak_rss_kib)
    );
    assert!(
        bench.mock.state().snapshots.is_empty(),
        "every snapshot deleted"
    );
    drop(child);
}

async fn idle_run(count: usize) {
    let bench = Bench::start(0).await;
    let port = free_port().unwrap();
    let child = bench.spawn(port, &[]);
    let pid = child.id().unwrap();
    ready(port).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty = usage(pid, bench.ticks);
    drop(child);
    bench.contents(count, true).await;
    let counters = bench.api.counters();
    counters.reset();
    let port = free_port().unwrap();
    let child = bench.spawn(port, &[]);
    let pid = child.id().unwrap();
    let started = Instant::now();
    ready(port).await;
    // The watch goes on from the list once every listed content is in the cache (ready
    // contents are not queued: they need nothing).
    while counters.get(Verb::Watch, "volumesnapshotcontents") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "caches not synced"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cached = steady_usage(pid, bench.ticks).await;
    let synced = started.elapsed();
    println!("== idle: {count} ready contents ==");
    println!(
        "RSS empty {:.1} MiB; with the contents {:.1} MiB (steady after {:.1} s): {:.0} bytes per content; peak {:.1} MiB; driver calls {}",
        mib(empty.rss_kib),
        mib(cached.rss_kib),
        synced.as_secs_f64(),
        (cached.anon_kib.saturating_sub(empty.anon_kib) * 1024) as f64 / count.max(1) as f64,
        mib(cached.peak_rss_kib),
        bench.mock.calls().count(CREATE_SNAPSHOT),
    );
    drop(child);
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let run = |name: &str| only.is_empty() || only == name;
    let not_ready = env_usize("BENCH_NOT_READY", 3) as u32;
    runtime.block_on(async {
        if run("unlimited") {
            throughput_run(
                "unlimited QPS (--kube-api-qps=-1)",
                env_usize("BENCH_SNAPSHOTS", 1000),
                not_ready,
                &["--kube-api-qps=-1"],
            )
            .await;
        }
        if run("default") {
            throughput_run(
                "default QPS 5, burst 10",
                env_usize("BENCH_SNAPSHOTS_DEFAULT_QPS", 1000),
                not_ready,
                &[],
            )
            .await;
        }
        if run("idle") {
            idle_run(env_usize("BENCH_CONTENTS", 50_000)).await;
        }
    });
}
