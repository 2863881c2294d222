//! The I/O edges: the watches feeding the index, the checks of the volumes against the driver
//! (paged ListVolumes, or ControllerGetVolume per volume), the node watcher, and the Events
//! they record.
//!
//! Each volume is checked once per interval: in ControllerGetVolume mode a volume is one key
//! of a work queue, re-added an interval after its check, so no two workers ever check the
//! same volume and `--worker-threads` bounds the calls in flight (upstream's workers can check
//! one volume at once, its #385). ListVolumes pages are handled as they arrive, not gathered.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::{ControllerGetVolumeRequest, ListVolumesRequest};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use sidecar_kit::cluster::events::{EventType, Recorder};
use sidecar_kit::driver::csi::{CallOptions, CsiClient, go_error};
use sidecar_kit::pipeline::views::{ClaimView, PvView};
use sidecar_kit::pipeline::workqueue::{Backoff, WorkQueue};
use sidecar_kit::pipeline::{Fed, Feeder, Pipeline, Wiring, lock};
use sidecar_kit::telemetry::operation;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::decide::{self, Mode, NodeStep, Report};
use crate::index::{Index, Target, Work};
use crate::model::{self, ABNORMAL, Abnormal, NEEDS, NODE_FAILED, NODE_RECOVERED, NORMAL};

/// Pages of one ListVolumes pass at most: a driver that hands out new page tokens forever would
/// otherwise keep the pass (and its set of tokens seen) growing.
const MAX_PAGES: usize = 100_000;

/// The field selector of the Events watch: only those a recovery is reported after.
pub const WARNINGS: &str = "type=Warning,reason=VolumeConditionAbnormal";

/// Everything the controller needs besides its clients.
#[derive(Clone)]
pub struct Config {
    pub driver: String,
    pub mode: Mode,
    /// Timeout of each ListVolumes page and each ControllerGetVolume.
    pub timeout: Duration,
    pub monitor_interval: Duration,
    pub list_volumes_interval: Duration,
    pub volume_list_add_interval: Duration,
    pub node_list_add_interval: Duration,
    pub workers: usize,
    pub node_watcher: bool,
    /// The watches and queue metrics, shared with the other controllers of the process.
    pub wiring: Wiring,
}

struct Controller {
    config: Config,
    client: kube::Client,
    csi: CsiClient,
    feed: Feeder<Index>,
    volumes: WorkQueue<Arc<str>>,
    nodes: WorkQueue<Arc<str>>,
    /// The nodes whose failure was reported (until they are Ready again).
    marked: Mutex<HashSet<Arc<str>>>,
    events: Recorder,
}

/// Runs the monitor until `shutdown` is cancelled; then stops taking work, lets the running
/// checks finish, and returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    csi: CsiClient,
    shutdown: CancellationToken,
) {
    // Nothing is retried with a backoff: checks come back after an interval.
    let backoff = Backoff {
        start: Duration::from_millis(5),
        max: Duration::from_secs(1000),
    };
    let queue = |name: &str| config.wiring.queue(name, &["default"], backoff);
    let controller = Arc::new(Controller {
        volumes: queue("csi-monitor-pv-queue"),
        nodes: queue("nodes"),
        feed: Feeder::new(Index::new(&config.driver), client.clone(), NEEDS),
        marked: Mutex::new(HashSet::new()),
        events: config.wiring.recorder(client.clone()),
        csi,
        client,
        config,
    });
    controller.run(shutdown).await;
}

impl Fed for Controller {
    type Index = Index;
    type Work = Work;

    fn feeder(&self) -> &Feeder<Index> {
        &self.feed
    }

    fn route(&self, work: Work) {
        match work {
            // In ListVolumes mode the periodic list checks every volume.
            Work::Volume(name) if self.config.mode == Mode::GetVolume => self.volumes.add(name, 0),
            Work::Volume(_) => {}
            Work::Node(name) => self.nodes.add(name, 0),
        }
    }
}

impl Controller {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.driver, mode = ?self.config.mode, "Starting CSI External PV Health Monitor Controller");
        let mut pipeline = self.config.wiring.pipeline();
        pipeline.feed_view::<_, PvView>(&self, Index::pv_event);
        pipeline.feed_view::<_, ClaimView>(&self, Index::claim_event);
        let me = self.clone();
        pipeline.watch(
            Api::<Event>::all(self.client.clone()),
            self.feed.watch_config().fields(WARNINGS),
            move |change| {
                me.index().event_event(change);
            },
        );
        if self.config.node_watcher {
            pipeline.feed::<Pod, _>(&self, Index::pod_event);
            pipeline.feed::<Node, _>(&self, Index::node_event);
        }
        pipeline
            .run(&shutdown, async |pipeline, stop| self.start(pipeline, stop))
            .await;
        tracing::info!("Shutting down CSI External PV Health Monitor Controller");
    }

    /// Once the caches synced: the checks of the volumes and, with the node watcher, of the
    /// nodes.
    fn start(self: &Arc<Self>, pipeline: &mut Pipeline, shutdown: CancellationToken) {
        {
            let index = self.index();
            tracing::info!(
                persistent_volumes = index.pv_count(),
                claims = index.claim_count(),
                pods_with_claims = index.pod_count(),
                nodes = index.node_count(),
                "caches synced"
            );
        }
        match self.config.mode {
            Mode::ListVolumes => {
                let me = self.clone();
                let stop = shutdown.clone();
                let service = pipeline.service().cloned();
                pipeline.spawn(async move {
                    loop {
                        let round = operation::round(service.as_ref(), "check volumes health");
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = me.check_listed().instrument(round) => {}
                        }
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep(me.config.list_volumes_interval) => {}
                        }
                    }
                });
            }
            Mode::GetVolume => {
                let me = self.clone();
                pipeline.workers(&self.volumes, self.config.workers, move |item| {
                    let me = me.clone();
                    async move { me.check_volume(&item.key).await }
                });
                self.add_volumes();
                let me = self.clone();
                pipeline.every(self.config.volume_list_add_interval, move || {
                    me.add_volumes()
                });
            }
        }
        if self.config.node_watcher {
            let me = self.clone();
            pipeline.workers(&self.nodes, 1, move |item| {
                let me = me.clone();
                async move { me.check_node(&item.key).await }
            });
            self.add_nodes();
            let me = self.clone();
            pipeline.every(self.config.node_list_add_interval, move || me.add_nodes());
        }
    }

    /// Every bound volume into the check queue (each is there once at most).
    fn add_volumes(&self) {
        let names = self.index().volume_names();
        tracing::debug!(
            volumes = names.len(),
            "adding the volumes to the check queue"
        );
        self.enqueue(names.into_iter().map(Work::Volume).collect());
    }

    fn add_nodes(&self) {
        let names = self.index().node_names();
        tracing::debug!(nodes = names.len(), "Resyncing Node watcher");
        self.enqueue(names.into_iter().map(Work::Node).collect());
    }

    fn options(&self) -> CallOptions {
        CallOptions::timeout(self.config.timeout)
    }

    /// One volume through ControllerGetVolume; checked again an interval later while it is
    /// bound. A volume not bound is dropped; it comes back when it is bound again.
    async fn check_volume(&self, name: &Arc<str>) {
        let Some(target) = self.index().target(name) else {
            tracing::debug!(pv = %name, "PV is gone or not bound: not checked");
            self.volumes.forget(name);
            return;
        };
        tracing::debug!(pv = %name, "Started PV processing");
        operation::describe(
            "check volume health",
            &[
                ("k8s.pv.name", name),
                ("k8s.namespace.name", &target.claim.namespace),
                ("k8s.pvc.name", target.claim.name()),
                ("k8s.pvc.uid", &target.claim.uid),
                ("csi.volume_id", target.pv.volume_handle()),
            ],
        );
        let request = ControllerGetVolumeRequest {
            volume_id: target.pv.volume_handle().to_string(),
        };
        if request.volume_id.is_empty() {
            tracing::error!(pv = %name, "volume handle in csi source is empty");
            return;
        }
        match self
            .csi
            .controller_get_volume(request, self.options())
            .await
        {
            Ok(response) => {
                let condition = response
                    .status
                    .as_ref()
                    .and_then(|s| s.volume_condition.as_ref());
                self.report(&target, Abnormal::of(condition).as_ref());
            }
            Err(status) => {
                tracing::error!(pv = %name, error = %go_error(&status), "Check controller volume status error");
            }
        }
        self.volumes
            .add_after(name.clone(), 0, self.config.monitor_interval);
    }

    /// One pass of ListVolumes, page by page; a volume the driver does not list is not
    /// reported, as upstream's. A token the driver gave before, or [`MAX_PAGES`] pages, end the
    /// pass (a driver that hands out pages forever would never let it end).
    async fn check_listed(&self) {
        let mut token = String::new();
        let mut tokens = HashSet::new();
        let mut listed = 0usize;
        loop {
            let request = ListVolumesRequest {
                max_entries: 0,
                starting_token: token.clone(),
            };
            let response = match self.csi.list_volumes(request, self.options()).await {
                Ok(response) => response,
                Err(status) => {
                    tracing::error!(error = %format!("failed to list volumes: {}", go_error(&status)), "Check controller volume status error");
                    return;
                }
            };
            listed += response.entries.len();
            for entry in &response.entries {
                let Some(volume) = entry.volume.as_ref() else {
                    continue;
                };
                let target = {
                    let index = self.index();
                    index
                        .pv_of_handle(&volume.volume_id)
                        .and_then(|name| index.target(&name))
                };
                if let Some(target) = target {
                    let condition = entry
                        .status
                        .as_ref()
                        .and_then(|s| s.volume_condition.as_ref());
                    self.report(&target, Abnormal::of(condition).as_ref());
                }
            }
            if response.next_token.is_empty() {
                break;
            }
            if !tokens.insert(response.next_token.clone()) {
                tracing::error!(token = %response.next_token, "ListVolumes returned a page token it returned before; the pass ends");
                break;
            }
            if tokens.len() >= MAX_PAGES {
                tracing::error!(
                    pages = MAX_PAGES,
                    "ListVolumes has not ended after this many pages; the pass ends"
                );
                break;
            }
            token = response.next_token;
        }
        tracing::debug!(volumes = listed, "ListVolumes pass done");
    }

    /// The Event a checked volume's claim deserves.
    fn report(&self, target: &Target, abnormal: Option<&Abnormal>) {
        let claim = model::claim_ref(&target.claim);
        match decide::report(abnormal, target.warned, target.recovered) {
            Some(Report::Abnormal(message)) => {
                tracing::info!(pv = %target.pv.name, claim = %target.claim.key, message, "volume condition abnormal");
                self.events
                    .record(claim, EventType::Warning, ABNORMAL, &message);
                self.index().set_recovered(&target.claim.uid, false);
            }
            Some(Report::Recovered) => {
                tracing::info!(pv = %target.pv.name, claim = %target.claim.key, "volume condition normal again");
                self.events
                    .record(claim, EventType::Normal, NORMAL, model::NORMAL_MESSAGE);
                self.index().set_recovered(&target.claim.uid, true);
            }
            None => {}
        }
    }

    /// One node: its pods' claims reported when it failed, and when it recovers.
    async fn check_node(&self, name: &Arc<str>) {
        let now = Timestamp::now().as_second();
        let health = self.index().node(name);
        let since = match health {
            Some(model::NodeHealth::NotReady { since }) => since.unwrap_or(now),
            _ => now,
        };
        let marked = lock(&self.marked).contains(name);
        match decide::node_step(health, since, now, marked) {
            NodeStep::Mark | NodeStep::MarkGone => {
                operation::describe("report node failure", &[("k8s.node.name", name)]);
                tracing::info!(node = %name, "Node is broken");
                for (claim, pods) in self.index().claims_on_node(name) {
                    let pods: Vec<&str> = pods.iter().map(|p| &**p).collect();
                    let message =
                        decide::node_failed_message(&pods, claim.name(), &claim.namespace, name);
                    self.events.record(
                        model::claim_ref(&claim),
                        EventType::Warning,
                        NODE_FAILED,
                        &message,
                    );
                }
                if health.is_some() {
                    lock(&self.marked).insert(name.clone());
                }
            }
            NodeStep::Clean => {
                tracing::info!(node = %name, "Node recovered");
                let message = decide::node_recovered_message(name);
                for (claim, _) in self.index().claims_on_node(name) {
                    self.events.record(
                        model::claim_ref(&claim),
                        EventType::Warning,
                        NODE_RECOVERED,
                        &message,
                    );
                }
                lock(&self.marked).remove(name);
            }
            NodeStep::Wait(after) => {
                tracing::debug!(node = %name, after = ?after, "Node is not ready, but less than 5 minutes");
                self.nodes.add_after(name.clone(), 0, after);
            }
            NodeStep::Nothing => {}
        }
    }
}
