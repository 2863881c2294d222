//! The controller pod's six sidecars of one driver (provisioner, attacher, resizer,
//! snapshotter, health monitor, livenessprobe) as six processes and as one all-in-one process
//! (`--controllers=*,health-monitor,livenessprobe`), each layout against an
//! API server of its own that holds `BENCH_PAIRS` (default 50000) bound PVC+PV pairs: lists and
//! watches at start-up, the time from start to the first claim provisioned (the claim waits for
//! the processes: a cold start), resident memory once every controller has done its first
//! operation, has worked off what start-up queued and has given back what it could (idle), then
//! the same after `BENCH_OPS` (default 1000) claims provisioned, attached, expanded and
//! snapshotted (at unlimited QPS, so that the run measures the processes, not the rate limit).
//! Every pair is still bound at the end. `BENCH_ATTACHMENTS` (default 0) of the pairs' volumes
//! are attached as a cluster in use holds them (a VolumeAttachment each, attached, published in
//! the mock driver), and `BENCH_SNAPSHOTS` (default 0) of them snapshotted (a ready, retained
//! content each and its bound VolumeSnapshot).
//!
//! `BENCH_FAILOVER=1` runs the all-in-one process under leader election with a warm standby
//! beside it (a host name of its own, in a UTS namespace: `unshare` must be able to make one),
//! kills the leader with SIGKILL and times the next claim's provisioning from the kill. The
//! all-in-one figures are compared with `benches/baseline.txt` when its population is the same
//! (`BENCH_WRITE_BASELINE=1` rewrites it).
//!
//! `cargo bench -p csi-sidecars --bench all_in_one`; `BENCH_ONLY=separate|aio` runs one layout.
//! `BENCH_BINS=$PWD/target/release` (after `cargo build --release --bins`) runs the six processes
//! from the single binaries, as six images would; without it they are the multi-call binary,
//! whose code pages then count in each process's RSS. `BENCH_WRAPPER` (e.g. `heaptrack -o
//! FILE`) starts the all-in-one process under a profiler; its figures are then the profiler's.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use testkit::apiserver::{ApiServer, Options, Verb};
use testkit::measure::{
    Baseline, Usage, clock_ticks, env_usize, free_port, http_get, until_queues_empty,
    until_settled, usage,
};
use testkit::mockdriver::{MockDriver, MockHandle};
use testkit::pairs::Pairs;
use testkit::process::CleanEnv;
use tokio::process::{Child, Command};

const BIN: &str = env!("CARGO_BIN_EXE_csi-sidecars");
const DRIVER: &str = "bench.csi.test";
const NAMESPACE: &str = "default";
const CLASS: &str = "bench";
const SNAPSHOT_CLASS: &str = "bench-snap";
const NODES: usize = 10;
const PAIRS: Pairs = Pairs {
    driver: DRIVER,
    class: CLASS,
    namespace: NAMESPACE,
};
const PARALLEL: usize = 64;
/// The leader election of the all-in-one process when `BENCH_FAILOVER` asks for a standby
/// (upstream's default Lease timings).
const ELECTION: [&str; 3] = [
    "--leader-election",
    "--leader-election-warm-standby",
    "--leader-election-namespace=default",
];
/// Longest wait for one phase.
const WAIT_LIMIT: Duration = Duration::from_secs(900);

fn snapshot_api(client: &kube::Client, kind: &str, plural: &str, ns: bool) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind),
        plural,
    );
    if ns {
        Api::namespaced_with(client.clone(), NAMESPACE, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

async fn create<K>(api: &Api<K>, object: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("created")
}

/// Polls `count` until it reaches `want`, at most [`WAIT_LIMIT`]; the time it took.
async fn until<F, Fut>(what: &str, want: usize, mut count: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = usize>,
{
    let start = Instant::now();
    loop {
        let n = count().await;
        if n >= want {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < WAIT_LIMIT,
            "{what}: {n} of {want} after {WAIT_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How a sidecar process is started besides its selection: extra flags, and a host name of its
/// own (`None`: the machine's).
#[derive(Default)]
struct Replica {
    args: Vec<String>,
    host: Option<String>,
}

/// One layout's world: an API server with the pairs, the classes and nodes, and the driver.
struct World {
    api: ApiServer,
    mock: MockHandle,
    _dir: tempfile::TempDir,
}

impl World {
    async fn start(pairs: usize, attachments: usize, snapshots: usize) -> (Self, Duration) {
        let api = ApiServer::start_with(Options {
            pv_controller: true,
            snapshot_controller: true,
            ..Options::default()
        })
        .await
        .expect("an API server");
        let dir = tempfile::tempdir().expect("a directory");
        let mock = MockDriver::builder()
            .driver_name(DRIVER)
            // The health monitor asks for volume conditions.
            .volume_condition(true)
            // Room for every operation's volume grown to 2 GiB (the default pool is smaller).
            .total_capacity(1 << 50)
            .call_log_limit(16)
            .serve_unix(dir.path().join("csi.sock"))
            .await
            .expect("the mock driver");
        let client = api.client();
        create(
            &Api::<StorageClass>::all(client.clone()),
            json!({"metadata": {"name": CLASS}, "provisioner": DRIVER, "allowVolumeExpansion": true}),
        )
        .await;
        create(
            &snapshot_api(&client, "VolumeSnapshotClass", "volumesnapshotclasses", false),
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
                "metadata": {"name": SNAPSHOT_CLASS}, "driver": DRIVER, "deletionPolicy": "Delete"}),
        )
        .await;
        for i in 0..NODES {
            create(
                &Api::<CSINode>::all(client.clone()),
                json!({"metadata": {"name": format!("node-{i}")},
                    "spec": {"drivers": [{"name": DRIVER, "nodeID": format!("nid-{i}")}]}}),
            )
            .await;
        }
        let fill = Instant::now();
        PAIRS.fill(&client, pairs).await.expect("the pairs made");
        let world = Self {
            api,
            mock,
            _dir: dir,
        };
        until("pairs bound", pairs, || world.bound_pairs()).await;
        PAIRS
            .attach(&world.api.client(), &world.mock, attachments, NODES)
            .await
            .expect("the volumes attached");
        PAIRS
            .snapshots(&world.api.client(), &world.mock, snapshots, SNAPSHOT_CLASS)
            .await
            .expect("the snapshots made");
        (world, fill.elapsed())
    }

    /// A claim of the class named `name`, labelled `bench=name`.
    async fn claim(&self, name: &str) {
        create(
            &Api::<PersistentVolumeClaim>::namespaced(self.api.client(), NAMESPACE),
            json!({"metadata": {"name": name, "labels": {"bench": name}}, "spec": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                "resources": {"requests": {"storage": "1Gi"}}}}),
        )
        .await;
    }

    /// When the claim `name` was first seen bound (polled every 20 ms, at most [`WAIT_LIMIT`]).
    async fn until_bound(&self, name: &str) -> Instant {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(self.api.client(), NAMESPACE);
        let start = Instant::now();
        loop {
            let claim = pvcs.get(name).await.expect("the claim read");
            if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                return Instant::now();
            }
            assert!(
                start.elapsed() < WAIT_LIMIT,
                "{name} not bound after {WAIT_LIMIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn bound_pairs(&self) -> usize {
        PAIRS
            .bound(&self.api.client())
            .await
            .expect("the pairs listed")
    }

    /// A sidecar process: `first` names the sidecar or the selection; every controller without
    /// a rate limit and without leader election.
    fn spawn(&self, first: &str, port: u16, replica: &Replica) -> Child {
        let single = match first {
            "provisioner" => Some("csi-provisioner"),
            "attacher" => Some("csi-attacher"),
            "resizer" => Some("csi-resizer"),
            "snapshotter" => Some("csi-snapshotter"),
            "livenessprobe" => Some("livenessprobe"),
            "external-health-monitor-controller" => Some("csi-external-health-monitor-controller"),
            _ => None,
        };
        let bins = std::env::var_os("BENCH_BINS").map(std::path::PathBuf::from);
        let (program, first_arg) = match (single, bins) {
            (Some(name), Some(dir)) => (dir.join(name), None),
            (Some(name), None) => (BIN.into(), Some(name)),
            (None, _) => (BIN.into(), Some(first)),
        };
        // A profiler in front of the all-in-one process (e.g. `heaptrack`), when asked for.
        let wrapper = std::env::var("BENCH_WRAPPER")
            .ok()
            .filter(|_| single.is_none());
        let mut words = wrapper.iter().flat_map(|w| w.split_whitespace());
        let mut command = match (&replica.host, words.next()) {
            // A replica of its own host name (its leader election identity), as a pod has:
            // in a UTS namespace of its own.
            (Some(host), _) => {
                let mut command = Command::new("unshare");
                command
                    .args(["-Uru", "sh", "-c", "hostname \"$0\" && exec \"$@\"", host])
                    .arg(program);
                command
            }
            (None, Some(wrapper)) => {
                let mut command = Command::new(wrapper);
                command.args(words).arg(program);
                command
            }
            (None, None) => Command::new(program),
        };
        command.args(first_arg).args(&replica.args);
        testkit::process::die_with_parent(&mut command);
        command
            .clean_env()
            .arg(format!("--csi-address={}", self.mock.endpoint()))
            .arg(format!("--http-endpoint=127.0.0.1:{port}"));
        if first != "livenessprobe" {
            command
                .arg(format!(
                    "--kubeconfig={}",
                    self.api.kubeconfig_path().display()
                ))
                .args(["--kube-api-qps=100000", "--kube-api-burst=100000"]);
        }
        command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the sidecar starts")
    }

    /// A sidecar process that serves HTTP; started again on another port when the one it was
    /// given was taken meanwhile.
    async fn spawn_serving(&self, first: &str, replica: &Replica) -> (Child, u16) {
        for _ in 0..5 {
            let port = free_port().expect("a port");
            let mut child = self.spawn(first, port, replica);
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                if http_get(port, "/metrics").await.is_some() {
                    return (child, port);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let _ = child.start_kill();
        }
        panic!("{first} does not start");
    }

    /// Claims `{prefix}-{i}` for `0..count`, then each attached, grown and snapshotted in turn;
    /// the time each stage took.
    async fn operate(&self, prefix: &str, count: usize) -> [Duration; 4] {
        let client = self.api.client();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let vas: Api<VolumeAttachment> = Api::all(client.clone());
        let snapshots = snapshot_api(&client, "VolumeSnapshot", "volumesnapshots", true);
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
        // Lists ask for this run's objects only, not the pairs.
        let mine = ListParams::default().labels(&format!("bench={prefix}"));
        let started = Instant::now();
        for_each(&names, |name| {
            let pvcs = pvcs.clone();
            async move {
                create(
                    &pvcs,
                    json!({"metadata": {"name": name, "labels": {"bench": prefix}}, "spec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                    "resources": {"requests": {"storage": "1Gi"}}}}),
                )
                .await;
            }
        })
        .await;
        let bound_pvs = || async {
            pvcs.list(&mine)
                .await
                .map(|l| {
                    l.items
                        .into_iter()
                        .filter(|c| {
                            c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                        })
                        .filter_map(|c| c.spec?.volume_name)
                        .collect::<Vec<_>>()
                })
                .expect("the claims listed")
        };
        until("claims bound", count, || async { bound_pvs().await.len() }).await;
        let provisioned = started.elapsed();

        let started = Instant::now();
        let volumes = bound_pvs().await;
        futures::stream::iter(volumes.into_iter().enumerate())
            .map(|(i, pv)| {
                let vas = vas.clone();
                let prefix = prefix.to_string();
                async move {
                    create(
                        &vas,
                        json!({"metadata": {"name": format!("{prefix}-va-{i}"),
                            "labels": {"bench": prefix}},
                        "spec": {"attacher": DRIVER, "nodeName": format!("node-{}", i % NODES),
                            "source": {"persistentVolumeName": pv}}}),
                    )
                    .await;
                }
            })
            .buffer_unordered(PARALLEL)
            .collect::<Vec<_>>()
            .await;
        until("attached", count, || async {
            vas.list(&mine)
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|v| v.status.as_ref().is_some_and(|s| s.attached))
                        .count()
                })
                .expect("the attachments listed")
        })
        .await;
        let attached = started.elapsed();

        let started = Instant::now();
        for_each(&names, |name| {
            let pvcs = pvcs.clone();
            async move {
                pvcs.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
                )
                .await
                .expect("the claim grows");
            }
        })
        .await;
        // PVs carry no labels: each is read until it has grown.
        let pending = std::sync::Mutex::new(bound_pvs().await);
        until("expanded", count, || async {
            let waiting: Vec<String> = pending.lock().map(|p| p.clone()).unwrap_or_default();
            let mut still = Vec::new();
            for name in waiting {
                let grown = pvs
                    .get(&name)
                    .await
                    .ok()
                    .and_then(|pv| Some(pv.spec?.capacity?.get("storage")?.0 == "2Gi"));
                if grown != Some(true) {
                    still.push(name);
                }
            }
            let left = still.len();
            if let Ok(mut p) = pending.lock() {
                *p = still;
            }
            count - left
        })
        .await;
        let expanded = started.elapsed();

        let started = Instant::now();
        for_each(&names, |name| {
            let snapshots = snapshots.clone();
            async move {
                create(
                    &snapshots,
                    json!({"apiVersion": "snapshot.storage.k8s.io/v1",
                    "kind": "VolumeSnapshot", "metadata": {"name": format!("{name}-snap"),
                        "labels": {"bench": prefix}},
                    "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS,
                        "source": {"persistentVolumeClaimName": name}}}),
                )
                .await;
            }
        })
        .await;
        until("snapshots ready", count, || async {
            snapshots
                .list(&mine)
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|s| s.data["status"]["readyToUse"] == true)
                        .count()
                })
                .expect("the snapshots listed")
        })
        .await;
        [provisioned, attached, expanded, started.elapsed()]
    }
}

/// Runs `f` for every name, [`PARALLEL`] at a time.
async fn for_each<F, Fut>(names: &[String], f: F)
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(names.to_vec())
        .map(f)
        .buffer_unordered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
}

/// The sum of the processes' usage (peak: the sum of each one's peak).
fn total(pids: &[u32], ticks: f64) -> Usage {
    pids.iter()
        .map(|pid| usage(*pid, ticks))
        .fold(Usage::default(), |a, u| Usage {
            rss_kib: a.rss_kib + u.rss_kib,
            anon_kib: a.anon_kib + u.anon_kib,
            file_kib: a.file_kib + u.file_kib,
            peak_rss_kib: a.peak_rss_kib + u.peak_rss_kib,
            cpu_seconds: a.cpu_seconds + u.cpu_seconds,
        })
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

async fn run(label: &str, sidecars: &[&str], pairs: usize, ops: usize) {
    let attachments = env_usize("BENCH_ATTACHMENTS", 0).min(pairs);
    let snapshots = env_usize("BENCH_SNAPSHOTS", 0).min(pairs);
    let (world, fill) = World::start(pairs, attachments, snapshots).await;
    let ticks = clock_ticks();
    let counters = world.api.counters();
    counters.reset();
    // A claim waits for the processes: the time to its volume is a cold start's.
    world.claim("cold").await;
    let failover = std::env::var_os("BENCH_FAILOVER").is_some() && sidecars.len() == 1;
    let leader = Replica {
        args: if failover {
            ELECTION.map(String::from).to_vec()
        } else {
            Vec::new()
        },
        host: None,
    };
    let started = Instant::now();
    let mut children = Vec::new();
    let mut ports = Vec::new();
    for sidecar in sidecars {
        let (child, port) = world.spawn_serving(sidecar, &leader).await;
        children.push(child);
        ports.push(port);
    }
    let pids: Vec<u32> = children.iter().filter_map(Child::id).collect();
    let cold_start = world.until_bound("cold").await - started;
    // Every controller has synced and worked once: one claim through every stage.
    world.operate("first", 1).await;
    let ready = started.elapsed();
    // The livenessprobe answers for the driver too.
    for (sidecar, port) in sidecars.iter().zip(&ports) {
        let path = match *sidecar {
            "livenessprobe" => "/healthz",
            all if all.starts_with("--controllers") => "/healthz/livenessprobe",
            _ => continue,
        };
        until("the driver's liveness", 1, || async {
            usize::from(matches!(http_get(*port, path).await, Some((200, _))))
        })
        .await;
    }
    let reads: u64 = counters
        .snapshot()
        .iter()
        .filter(|(k, _)| k.verb == Verb::List)
        .map(|(_, n)| n)
        .sum();
    let lists_by_resource: Vec<String> = counters
        .snapshot()
        .iter()
        .filter(|(k, _)| k.verb != Verb::Watch)
        .map(|(k, n)| format!("{:?} {} {n}", k.verb, k.resource))
        .collect();
    let watches: u64 = counters
        .snapshot()
        .iter()
        .filter(|(k, _)| k.verb == Verb::Watch)
        .map(|(_, n)| n)
        .sum();
    let drained = until_queues_empty(&ports, WAIT_LIMIT).await;
    until_settled(&pids, WAIT_LIMIT).await;
    let idle = total(&pids, ticks);
    let each = || -> Vec<String> {
        sidecars
            .iter()
            .zip(&pids)
            .map(|(sidecar, pid)| format!("{sidecar} {}", mib(usage(*pid, ticks).rss_kib)))
            .collect()
    };
    let each_idle = each();
    let stages = world.operate("op", ops).await;
    until_queues_empty(&ports, WAIT_LIMIT).await;
    until_settled(&pids, WAIT_LIMIT).await;
    let after = total(&pids, ticks);
    let each_after = each();
    let standby = match failover {
        true => Some(fail_over(&world, sidecars[0], &mut children[0]).await),
        false => None,
    };
    // Every pair is still bound, and so is every claim the run made.
    let bound = world.bound_pairs().await;
    assert_eq!(
        bound,
        pairs + 2 + ops + usize::from(failover),
        "bound pairs after the run"
    );
    println!(
        "## {label}: {} process(es), {pairs} pairs, {attachments} of them attached, {snapshots} snapshotted (filled in {:.0} s)",
        pids.len(),
        fill.as_secs_f64()
    );
    println!(
        "start-up to a claim provisioned, attached, grown and snapshotted: {:.1} s, to every queue empty: {:.1} s more; lists {reads}, watches {watches}; requests (the benchmark's own included): {}",
        ready.as_secs_f64(),
        drained.as_secs_f64(),
        lists_by_resource.join(", ")
    );
    println!(
        "RSS idle {} (anon {}, file {}); after {ops} of each operation {} (anon {}), peaks summed {}; CPU {:.1} s",
        mib(idle.rss_kib),
        mib(idle.anon_kib),
        mib(idle.file_kib),
        mib(after.rss_kib),
        mib(after.anon_kib),
        mib(after.peak_rss_kib),
        after.cpu_seconds
    );
    println!(
        "RSS of each, idle: {}; after: {}",
        each_idle.join(", "),
        each_after.join(", ")
    );
    println!(
        "{ops} provisioned {:.1} s, attached {:.1} s, expanded {:.1} s, snapshotted {:.1} s",
        stages[0].as_secs_f64(),
        stages[1].as_secs_f64(),
        stages[2].as_secs_f64(),
        stages[3].as_secs_f64()
    );
    println!(
        "cold start to the first claim bound: {:.2} s",
        cold_start.as_secs_f64()
    );
    if let Some(standby) = &standby {
        println!(
            "warm standby: RSS {} once synced; kill -9 of the leader to the next claim bound {:.2} s (Lease 15 s); lists after the kill: {}",
            mib(standby.rss_kib),
            standby.failover.as_secs_f64(),
            standby.lists_after
        );
    }
    if sidecars.len() == 1 {
        against_baseline(
            &Figures {
                pairs,
                attachments,
                snapshots,
                idle_mib: idle.rss_kib as f64 / 1024.0,
                peak_mib: after.peak_rss_kib as f64 / 1024.0,
                cold_start_s: cold_start.as_secs_f64(),
            },
            standby.as_ref().map(|s| s.failover.as_secs_f64()),
        );
    }
    for mut child in children {
        // A profiler's wrapper is asked to stop its program, so that it writes its report.
        if std::env::var_os("BENCH_WRAPPER").is_some()
            && let Some(pid) = child.id()
        {
            let _ = Command::new("pkill")
                .args(["-TERM", "-P", &pid.to_string()])
                .status()
                .await;
            let _ = tokio::time::timeout(Duration::from_secs(300), child.wait()).await;
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// A warm standby's figures.
struct Standby {
    rss_kib: u64,
    failover: Duration,
    /// Lists of claims and volumes after the leader's death.
    lists_after: u64,
}

/// Starts a warm standby of `selection` beside `leader` (which leads), waits for its caches to
/// sync, kills the leader with SIGKILL and times the next claim's provisioning from the kill.
/// The standby is stopped at the end.
async fn fail_over(world: &World, selection: &str, leader: &mut Child) -> Standby {
    let counters = world.api.counters();
    let claim_lists =
        || counters.lists("persistentvolumeclaims") + counters.lists("persistentvolumes");
    let before = claim_lists();
    let replica = Replica {
        args: ELECTION.map(String::from).to_vec(),
        host: Some("standby".to_string()),
    };
    let (mut standby, _) = world.spawn_serving(selection, &replica).await;
    let pid = standby.id().expect("the standby runs");
    // Synced: it has listed claims and volumes, and its memory has settled.
    until("the standby's lists", 2, || async {
        (claim_lists() - before) as usize
    })
    .await;
    until_settled(&[pid], WAIT_LIMIT).await;
    let rss_kib = usage(pid, clock_ticks()).rss_kib;
    let listed = claim_lists();
    let _ = leader.start_kill();
    let killed = Instant::now();
    let _ = leader.wait().await;
    world.claim("failover").await;
    let failover = world.until_bound("failover").await - killed;
    let lists_after = claim_lists() - listed;
    let _ = standby.start_kill();
    let _ = standby.wait().await;
    Standby {
        rss_kib,
        failover,
        lists_after,
    }
}

/// Where the figures of the all-in-one run are kept (`BENCH_WRITE_BASELINE=1` rewrites them).
const BASELINE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/baseline.txt");

/// The all-in-one run's figures, against a baseline of the same population.
struct Figures {
    pairs: usize,
    attachments: usize,
    snapshots: usize,
    idle_mib: f64,
    peak_mib: f64,
    cold_start_s: f64,
}

fn against_baseline(now: &Figures, failover_s: Option<f64>) {
    let population = format!(
        "pairs = {}\nattachments = {}\nsnapshots = {}\n",
        now.pairs, now.attachments, now.snapshots
    );
    let written = || {
        let failover = failover_s.map_or(String::new(), |f| format!("failover_s = {f:.2}\n"));
        format!(
            "# The all-in-one run of `BENCH_ONLY=aio BENCH_FAILOVER=1 cargo bench -p csi-sidecars --bench all_in_one`\n\
             # with this population. A change that makes idle_mib or peak_mib 10 % higher, or cold_start_s or\n\
             # failover_s 20 % longer, says so in its commit.\n\
             {population}idle_mib = {:.1}\npeak_mib = {:.1}\ncold_start_s = {:.2}\n{failover}",
            now.idle_mib, now.peak_mib, now.cold_start_s
        )
    };
    let Some(baseline) = Baseline::write_or_read(BASELINE, written) else {
        return;
    };
    let value = |name: &str| baseline.value(name);
    let same = [
        ("pairs", now.pairs),
        ("attachments", now.attachments),
        ("snapshots", now.snapshots),
    ]
    .iter()
    .all(|(name, n)| value(name) == Some(*n as f64));
    if !same {
        println!("the baseline at {BASELINE} is of another population");
        return;
    }
    let compare = |name: &str, now: f64, worse: f64| match value(name) {
        Some(base) => {
            let flag = if now > base * worse { "  WORSE" } else { "" };
            println!("against the baseline: {name} {now:.2} ({base:.2}){flag}");
        }
        None => println!("the baseline has no {name}"),
    };
    compare("idle_mib", now.idle_mib, 1.1);
    compare("peak_mib", now.peak_mib, 1.1);
    compare("cold_start_s", now.cold_start_s, 1.2);
    if let Some(failover) = failover_s {
        compare("failover_s", failover, 1.2);
    }
}

fn main() {
    let pairs = env_usize("BENCH_PAIRS", 50_000);
    let ops = env_usize("BENCH_OPS", 1000);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        if only.is_empty() || only == "separate" {
            run(
                "six processes",
                &[
                    "provisioner",
                    "attacher",
                    "resizer",
                    "snapshotter",
                    "external-health-monitor-controller",
                    "livenessprobe",
                ],
                pairs,
                ops,
            )
            .await;
        }
        if only.is_empty() || only == "aio" {
            run(
                "all in one",
                &["--controllers=*,health-monitor,livenessprobe"],
                pairs,
                ops,
            )
            .await;
        }
    });
}
