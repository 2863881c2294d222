//! The allocated blocks of a 4 GiB block volume with every 4 KiB block allocated (1 Mi ranges)
//! streamed through the real `csi-snapshot-metadata` binary, from the mock driver, to a TLS
//! client, with the test kit's API server answering the reviews: blocks per second, peak
//! resident memory of the sidecar, and the API requests of a first and a repeated backup call.
//!
//! `cargo bench -p external-snapshot-metadata --bench allocated`. `BENCH_UPSTREAM` names another
//! build of the sidecar (upstream's csi-snapshot-metadata) to run the same way after ours, with
//! the same driver, client and API server; `BENCH_GIB` (default 4) sets the volume's size and
//! `BENCH_MAX_RESULTS` (default 0: as the driver sends them) the ranges a message (1 is what
//! upstream's lister asks with `-max-results 1`: a message, and a DATA frame, a block).

#[path = "../tests/it/common.rs"]
#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::*;
use serde_json::json;
use testkit::apiserver::counters::CounterKey;
use testkit::measure::{clock_ticks, env_usize, usage};

/// What one run measured.
struct Run {
    name: String,
    blocks: i64,
    messages: usize,
    seconds: f64,
    peak_rss_mib: f64,
    cpu_seconds: f64,
    first_call: BTreeMap<String, u64>,
    repeated_call: BTreeMap<String, u64>,
}

/// The requests made between two counter snapshots, by verb and resource.
fn made(
    before: &BTreeMap<CounterKey, u64>,
    after: &BTreeMap<CounterKey, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(key, count)| {
            let was = before.get(key).copied().unwrap_or(0);
            (*count > was).then(|| (format!("{} {}", key.verb, key.resource), count - was))
        })
        .collect()
}

async fn run(name: &str, binary: Option<String>, gib: i64, max_results: i32) -> Run {
    let env = Env::start(Start {
        audience: Some(AUDIENCE),
        binary,
        ..Start::default()
    })
    .await;
    // Upstream v1.1.0 reads the audience from the service object whatever --audience says, and
    // asks for the driver's default class even when the snapshot needs no secret.
    Env::create(
        &env.dynamic("snapshotmetadataservices", None),
        json!({
            "apiVersion": "cbt.storage.k8s.io/v1beta1",
            "kind": "SnapshotMetadataService",
            "metadata": {"name": DRIVER},
            "spec": {"address": "127.0.0.1:6443", "audience": AUDIENCE, "caCert": "Y2E="},
        }),
    )
    .await;
    Env::create(
        &env.dynamic("volumesnapshotclasses", None),
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": "default",
                         "annotations": {"snapshot.storage.kubernetes.io/is-default-class": "true"}},
            "driver": DRIVER,
            "deletionPolicy": "Delete",
        }),
    )
    .await;
    let volume = env.volume("full", gib << 30).await;
    env.mock.fill(&volume).unwrap();
    let handle = env.cut("snap-full", &volume).await;
    env.snapshot("full", &handle, DRIVER, None).await;
    let mut client = env.connect().await;

    let counters = env.cluster.counters();
    let before = counters.snapshot();
    let first = eventually("a first call to succeed", || {
        let mut client = client.clone();
        let request = env.allocated("full");
        async move { all_allocated(&mut client, request).await.ok() }
    })
    .await;
    let between = counters.snapshot();
    let first_call = made(&before, &between);

    let pid = env.sidecar.id().unwrap_or(0);
    let ticks = clock_ticks();
    let cpu_before = usage(pid, ticks).cpu_seconds;
    let started = Instant::now();
    let mut request = env.allocated("full");
    request.max_results = max_results;
    let messages = all_allocated(&mut client, request).await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    let repeated_call = made(&between, &counters.snapshot());
    let after = usage(pid, ticks);
    let blocks: i64 = messages.iter().map(|m| m.block_metadata.len() as i64).sum();
    assert_eq!(blocks, gib << 18, "every 4 KiB block of {gib} GiB");
    if max_results == 0 {
        assert_eq!(first.len(), messages.len());
    }
    Run {
        name: name.to_string(),
        blocks,
        messages: messages.len(),
        seconds,
        peak_rss_mib: after.peak_rss_kib as f64 / 1024.0,
        cpu_seconds: after.cpu_seconds - cpu_before,
        first_call,
        repeated_call,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let gib = env_usize("BENCH_GIB", 4) as i64;
    let max_results = i32::try_from(env_usize("BENCH_MAX_RESULTS", 0)).unwrap_or(i32::MAX);
    let mut runs = vec![runtime.block_on(run("ours", None, gib, max_results))];
    if let Ok(upstream) = std::env::var("BENCH_UPSTREAM") {
        runs.push(runtime.block_on(run("upstream", Some(upstream), gib, max_results)));
    }
    println!(
        "{:<9} {:>9} {:>8} {:>8} {:>11} {:>9} {:>8}  API requests: first call | repeated call",
        "sidecar", "blocks", "msgs", "seconds", "blocks/s", "peak MiB", "CPU s"
    );
    for run in &runs {
        println!(
            "{:<9} {:>9} {:>8} {:>8.2} {:>11.0} {:>9.1} {:>8.2}  {:?} | {:?}",
            run.name,
            run.blocks,
            run.messages,
            run.seconds,
            run.blocks as f64 / run.seconds,
            run.peak_rss_mib,
            run.cpu_seconds,
            run.first_call,
            run.repeated_call,
        );
    }
    if let [ours, upstream] = &runs[..] {
        println!(
            "ours/upstream: speed x{:.2}, peak memory x{:.2}",
            upstream.seconds / ours.seconds,
            ours.peak_rss_mib / upstream.peak_rss_mib
        );
    }
}
