//! The I/O edges: watches feeding the index, workers executing the plans of
//! [`decide`](crate::decide) against the API server and the driver, the ListVolumes reconciler
//! and the periodic resync.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::ListVolumesRequest;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use sidecar_kit::cluster::client::{api_code, api_message, secret_data};
use sidecar_kit::cluster::events::{EventType, Recorder};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::{Backoff, Item, WorkQueue};
use sidecar_kit::pipeline::{Fed, Feeder, Pipeline, Wiring, lock};
use sidecar_kit::telemetry;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::decide::{
    self, AttachPlan, DetachPlan, Phase, Policy, Problem, PvPatch, PvPlan, VaPlan,
};
use crate::index::{Index, Lane, PvLookup, Work};
use crate::model::{NEEDS, Pv, SecretRef, Va, VaSource};

/// Queue names, as upstream names them in the workqueue metrics.
pub const VA_QUEUE: &str = "csi-attacher-va";
pub const PV_QUEUE: &str = "csi-attacher-pv";
/// Reporting component of the Events.
pub const COMPONENT: &str = "csi-attacher";
/// A key that waited longer than this in its lane is logged (at most once per this period), so
/// that a backlog is visible.
const BACKLOG_WARNING: Duration = Duration::from_secs(30);
/// How often a ListVolumes pass restarts from the first page after ABORTED (invalid token).
const LIST_RESTARTS: u32 = 3;

/// Everything the controller needs besides its clients.
#[derive(Clone)]
pub struct Config {
    pub policy: Policy,
    /// Timeout of each ControllerPublish/Unpublish call and of each ListVolumes page.
    pub timeout: Duration,
    pub backoff: Backoff,
    /// Workers per queue.
    pub workers: usize,
    /// Period of the full resync (zero: none).
    pub resync: Duration,
    /// ListVolumes reconciliation, when the driver reports published nodes.
    pub reconcile: Option<Reconcile>,
    /// The watches and queue metrics, shared with the other controllers of the process.
    pub wiring: Wiring,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reconcile {
    pub period: Duration,
    /// `ListVolumesRequest.max_entries`.
    pub max_entries: i32,
}

/// Why an attach or detach failed.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Problem(#[from] Problem),
    #[error("failed to load secret \"{namespace}/{name}\": {message}")]
    Secret {
        namespace: String,
        name: String,
        message: String,
    },
    #[error("cannot get persistentvolume \"{name}\": {message}")]
    ReadPv { name: String, message: String },
    #[error("could not add PersistentVolume finalizer: {0}")]
    PvFinalizer(String),
    #[error("could not save VolumeAttachment: {0}")]
    SaveVa(String),
    #[error("rpc error: code = {} desc = {}", sidecar_kit::process::metrics::code_label(.0.code()), .0.message())]
    Csi(tonic::Status),
    #[error("failed to mark as attached: {0}")]
    MarkAttached(String),
    #[error("could not mark as detached: {0}")]
    MarkDetached(String),
}

impl Failure {
    fn code(&self) -> Option<i32> {
        match self {
            Self::Csi(status) => Some(i32::from(status.code())),
            _ => None,
        }
    }

    /// Whether the failure goes into the status. Upstream does not record a failed final status
    /// write: the volume is attached, only the report is missing, and the retry writes it.
    fn recorded(&self) -> bool {
        !matches!(self, Self::MarkAttached(_))
    }
}

struct Controller {
    config: Config,
    client: kube::Client,
    vas: Api<VolumeAttachment>,
    pvs: Api<PersistentVolume>,
    csi: CsiClient,
    feed: Feeder<Index>,
    va_queue: WorkQueue<Arc<str>>,
    pv_queue: WorkQueue<Arc<str>>,
    /// VolumeAttachments the reconciler found out of sync with the driver, with what the driver
    /// said (published or not): processed even when their status says there is nothing to do,
    /// unless the status has come to agree with the driver meanwhile.
    forced: Mutex<HashMap<Arc<str>, bool>>,
    events: Recorder,
    last_backlog_report: Mutex<Option<tokio::time::Instant>>,
}

/// Runs the attacher until `shutdown` is cancelled; then stops taking work, lets the running
/// operations finish, and returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    csi: CsiClient,
    shutdown: CancellationToken,
) {
    let controller = Arc::new(Controller {
        vas: Api::all(client.clone()),
        pvs: Api::all(client.clone()),
        csi,
        feed: Feeder::new(Index::new(&config.policy.driver), client.clone(), NEEDS),
        va_queue: config.wiring.queue(VA_QUEUE, &Lane::NAMES, config.backoff),
        pv_queue: config.wiring.queue(PV_QUEUE, &["default"], config.backoff),
        forced: Mutex::new(HashMap::new()),
        last_backlog_report: Mutex::new(None),
        events: config.wiring.recorder(client.clone()),
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
            Work::Va { name, lane } => self.va_queue.add(name, lane as usize),
            Work::Pv(name) => self.pv_queue.add(name, 0),
        }
    }
}

impl Controller {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.policy.driver, "starting CSI attacher");
        let mut pipeline = self.config.wiring.pipeline();
        pipeline.feed(&self, Index::va_event);
        pipeline.feed_view(&self, Index::pv_event);
        pipeline.feed(&self, Index::csinode_event);
        pipeline
            .run(&shutdown, async |pipeline, stop| self.start(pipeline, stop))
            .await;
        // Workers finished the operation they were in; the timers stopped at once.
        tracing::info!("CSI attacher stopped");
    }

    /// Once the caches synced: the workers, the reconciler and the resync.
    fn start(self: &Arc<Self>, pipeline: &mut Pipeline, shutdown: CancellationToken) {
        {
            let index = self.index();
            tracing::info!(
                volume_attachments = index.va_count(),
                persistent_volumes = index.pv_count(),
                "caches synced"
            );
        }
        let me = self.clone();
        pipeline.workers(&self.va_queue, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.va_work(item).await }
        });
        let me = self.clone();
        pipeline.workers(&self.pv_queue, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.sync_pv(&item.key).await }
        });
        if let Some(reconcile) = self.config.reconcile {
            pipeline.spawn(self.clone().reconciler(reconcile, shutdown));
        }
        pipeline.resync(self, self.config.resync, Index::resync);
    }

    fn backlog_report_due(&self) -> bool {
        let mut last = lock(&self.last_backlog_report);
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < BACKLOG_WARNING) {
            return false;
        }
        *last = Some(now);
        true
    }

    // --- VolumeAttachments ---

    async fn va_work(&self, item: Item<Arc<str>>) {
        if item.waited > BACKLOG_WARNING && self.backlog_report_due() {
            tracing::warn!(
                volume_attachment = %item.key,
                lane = Lane::NAMES[item.lane],
                waited = ?item.waited,
                queued = self.va_queue.len(),
                "VolumeAttachment waited long in the queue: the attacher is behind"
            );
        }
        self.sync_va(&item.key).await;
    }

    async fn sync_va(&self, name: &str) {
        let Some(view) = self.index().va_view(name) else {
            tracing::debug!(volume_attachment = name, "VolumeAttachment is gone");
            self.va_queue.forget(name);
            return;
        };
        let va = view.va;
        let forced = lock(&self.forced).remove(name);
        let force = forced.is_some_and(|published| va.attached != published);
        let lane = Lane::of(&va);
        let pv = match view.pv {
            PvLookup::NotNamed => None,
            PvLookup::Cached(pv) => Some(*pv),
            PvLookup::Uncached(pv) => match self.read_pv(&pv).await {
                Ok(pv) => pv,
                Err(failure) => {
                    self.failed(&va, lane, forced, Phase::from(lane), failure)
                        .await;
                    return;
                }
            },
        };
        let plan = decide::plan_va(&self.config.policy, &va, pv.as_ref(), &view.node, force);
        let operation = match &plan {
            VaPlan::Nothing => None,
            VaPlan::MarkAttached => Some("mark attached"),
            VaPlan::Attach(_) => Some("attach"),
            VaPlan::Detach(_) => Some("detach"),
            VaPlan::Fail(Phase::Detach, _) => Some("detach"),
            VaPlan::Fail(_, _) => Some("attach"),
        };
        if let Some(operation) = operation {
            let pv_name = match &va.source {
                VaSource::Pv(name) => name.as_str(),
                _ => "",
            };
            telemetry::operation::describe(
                operation,
                &[
                    ("k8s.volumeattachment.name", &va.name),
                    ("k8s.volumeattachment.uid", &va.uid),
                    ("k8s.pv.name", pv_name),
                    ("k8s.node.name", &va.node_name),
                ],
            );
        }
        let (phase, result) = match plan {
            VaPlan::Nothing => {
                tracing::trace!(volume_attachment = name, "nothing to do");
                (Phase::from(lane), Ok(()))
            }
            VaPlan::MarkAttached => (Phase::Attach, self.mark_attached(&va).await),
            VaPlan::Attach(plan) => (Phase::Attach, self.attach(&va, *plan).await),
            VaPlan::Detach(plan) => (Phase::Detach, self.detach(&va, *plan).await),
            VaPlan::Fail(phase, problem) => (phase, Err(Failure::Problem(problem))),
        };
        match result {
            Ok(()) => self.va_queue.forget(name),
            Err(failure) => self.failed(&va, lane, forced, phase, failure).await,
        }
    }

    async fn failed(
        &self,
        va: &Va,
        lane: Lane,
        forced: Option<bool>,
        phase: Phase,
        failure: Failure,
    ) {
        if let Some(published) = forced {
            // The retry must not skip the operation because the status looks right.
            lock(&self.forced)
                .entry(va.name.clone())
                .or_insert(published);
        }
        let message = failure.to_string();
        if failure.recorded() {
            self.record_error(va, phase, &message, failure.code()).await;
        }
        let delay = self
            .va_queue
            .add_rate_limited(va.name.clone(), lane as usize);
        tracing::info!(volume_attachment = %va.name, error = %message, retry_in = ?delay, "{} failed", match phase {
            Phase::Attach => "attach",
            Phase::Detach => "detach",
        });
    }

    async fn record_error(&self, va: &Va, phase: Phase, message: &str, code: Option<i32>) {
        let code = code.filter(|_| self.config.policy.error_codes);
        let patch = decide::error_status_patch(phase, message, code, Timestamp::now());
        match self
            .vas
            .patch_status(&va.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(updated) => self.index().store_va(&updated),
            Err(err) => {
                tracing::debug!(volume_attachment = %va.name, error = %err, "cannot save the error in the status")
            }
        }
        self.events.record(
            va.object_ref(),
            EventType::Warning,
            phase.failure_reason(),
            message,
        );
    }

    /// Reads a PV the cache does not hold: `None` if it does not exist.
    async fn read_pv(&self, name: &str) -> Result<Option<Pv>, Failure> {
        match self.pvs.get_opt(name).await {
            Ok(Some(pv)) => {
                self.index().store_pv(&pv);
                Ok(Some(Pv::from_api(&pv)))
            }
            Ok(None) => Ok(None),
            Err(err) => Err(Failure::ReadPv {
                name: name.to_string(),
                message: api_message(&err),
            }),
        }
    }

    async fn secrets(
        &self,
        reference: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, Failure> {
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        secret_data(&self.client, &reference.namespace, &reference.name)
            .await
            .map_err(|err| Failure::Secret {
                namespace: reference.namespace.clone(),
                name: reference.name.clone(),
                message: api_message(&err),
            })
    }

    /// Sends a strategic merge patch of the metadata; returns the object as written.
    async fn patch_va(&self, name: &str, patch: &serde_json::Value) -> Result<Va, kube::Error> {
        let updated = self
            .vas
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await?;
        self.index().store_va(&updated);
        Ok(Va::from_api(&updated))
    }

    async fn patch_va_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        let updated = self
            .vas
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        self.index().store_va(&updated);
        Ok(())
    }

    /// Sends a strategic merge patch of a PersistentVolume's finalizers. It carries no
    /// resourceVersion, so the PV's other writers cannot make it fail with a conflict.
    async fn patch_pv(&self, patch: &PvPatch) -> Result<(), kube::Error> {
        let updated = self
            .pvs
            .patch(
                &patch.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch.patch),
            )
            .await?;
        self.index().store_pv(&updated);
        Ok(())
    }

    async fn mark_attached(&self, va: &Va) -> Result<(), Failure> {
        match decide::attached_status_patch(va, &BTreeMap::new()) {
            Some(patch) => self
                .patch_va_status(&va.name, &patch)
                .await
                .map_err(|e| Failure::MarkAttached(api_message(&e))),
            None => Ok(()),
        }
    }

    async fn attach(&self, va: &Va, plan: AttachPlan) -> Result<(), Failure> {
        tracing::debug!(volume_attachment = %va.name, "attaching");
        let secrets = self.secrets(plan.secret.as_ref()).await?;
        if let Some(patch) = &plan.pv_finalizer {
            self.patch_pv(patch)
                .await
                .map_err(|e| Failure::PvFinalizer(api_message(&e)))?;
        }
        if let Some(patch) = &plan.va_metadata {
            self.patch_va(&va.name, patch)
                .await
                .map_err(|e| Failure::SaveVa(api_message(&e)))?;
        }
        let mut request = plan.request;
        request.secrets = secrets;
        let options = CallOptions {
            migrated: plan.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        let response = self
            .csi
            .controller_publish_volume(request, options)
            .await
            .map_err(Failure::Csi)?;
        tracing::debug!(volume_attachment = %va.name, "attached");
        let context: BTreeMap<String, String> = response.publish_context.into_iter().collect();
        let current = self
            .index()
            .va_view(&va.name)
            .map_or_else(|| va.clone(), |view| view.va);
        if let Some(patch) = decide::attached_status_patch(&current, &context) {
            self.patch_va_status(&va.name, &patch)
                .await
                .map_err(|e| Failure::MarkAttached(api_message(&e)))?;
        }
        Ok(())
    }

    async fn detach(&self, va: &Va, plan: DetachPlan) -> Result<(), Failure> {
        tracing::debug!(volume_attachment = %va.name, "detaching");
        let mut request = plan.request;
        request.secrets = self.secrets(plan.secret.as_ref()).await?;
        let options = CallOptions {
            migrated: plan.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        self.csi
            .controller_unpublish_volume(request, options)
            .await
            .map_err(Failure::Csi)?;
        tracing::debug!(volume_attachment = %va.name, "detached");
        let gone_is_fine = |err: kube::Error| match api_code(&err) {
            Some(404) => Ok(()),
            _ => Err(Failure::MarkDetached(api_message(&err))),
        };
        // The finalizer goes first: a VolumeAttachment being deleted without it counts as
        // detached, while `attached: false` with the finalizer would mean "maybe still attached"
        // and cost another ControllerUnpublish.
        let outlives = match self.patch_va(&va.name, &plan.remove_finalizer).await {
            Ok(updated) => decide::outlives_detach(&updated),
            Err(err) => return gone_is_fine(err),
        };
        if outlives {
            self.patch_va_status(&va.name, &decide::detached_status_patch())
                .await
                .or_else(gone_is_fine)?;
        }
        Ok(())
    }

    // --- PersistentVolumes ---

    async fn sync_pv(&self, name: &str) {
        let Some((pv, referenced)) = self.index().pv_view(name) else {
            self.pv_queue.forget(name);
            return;
        };
        let PvPlan::RemoveFinalizer(patch) = decide::plan_pv(&self.config.policy, &pv, referenced)
        else {
            self.pv_queue.forget(name);
            return;
        };
        telemetry::operation::describe("remove finalizer", &[("k8s.pv.name", name)]);
        match self.patch_pv(&patch).await {
            Ok(()) => {
                tracing::debug!(persistent_volume = name, "removed finalizer");
                self.pv_queue.forget(name);
            }
            Err(err) if api_code(&err) == Some(404) => self.pv_queue.forget(name),
            Err(err) => {
                let delay = self.pv_queue.add_rate_limited(name, 0);
                tracing::warn!(persistent_volume = name, error = %api_message(&err), retry_in = ?delay, "failed to remove finalizer from PersistentVolume");
            }
        }
    }

    // --- Periodic work ---

    async fn reconciler(self: Arc<Self>, reconcile: Reconcile, shutdown: CancellationToken) {
        loop {
            match self.published(reconcile.max_entries).await {
                Ok(published) => {
                    let found = self.index().out_of_sync(&published);
                    for item in found {
                        tracing::warn!(volume_attachment = %item.name, published = item.published, "attached status differs from the driver's ListVolumes; processing it again");
                        lock(&self.forced).insert(item.name.clone(), item.published);
                        self.va_queue.add(item.name, item.lane as usize);
                    }
                }
                Err(status) => tracing::warn!(
                    code = sidecar_kit::process::metrics::code_label(status.code()),
                    error = status.message(),
                    "failed to reconcile VolumeAttachments with ListVolumes"
                ),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(reconcile.period) => {}
            }
        }
    }

    /// Volume ID → published node IDs, over all ListVolumes pages; each page has its own
    /// timeout, and an invalid page token (ABORTED) restarts the listing.
    async fn published(
        &self,
        max_entries: i32,
    ) -> Result<HashMap<String, Vec<String>>, tonic::Status> {
        let mut published = HashMap::new();
        let mut token = String::new();
        let mut restarts = 0;
        loop {
            let request = ListVolumesRequest {
                max_entries,
                starting_token: token.clone(),
            };
            match self
                .csi
                .list_volumes(request, CallOptions::timeout(self.config.timeout))
                .await
            {
                Ok(page) => {
                    for entry in page.entries {
                        if let Some(volume) = entry.volume {
                            let nodes = entry
                                .status
                                .map(|s| s.published_node_ids)
                                .unwrap_or_default();
                            published.insert(volume.volume_id, nodes);
                        }
                    }
                    if page.next_token.is_empty() {
                        return Ok(published);
                    }
                    token = page.next_token;
                }
                Err(status)
                    if status.code() == Code::Aborted
                        && !token.is_empty()
                        && restarts < LIST_RESTARTS =>
                {
                    restarts += 1;
                    tracing::debug!(
                        error = status.message(),
                        "ListVolumes token rejected; listing again"
                    );
                    token.clear();
                    published.clear();
                }
                Err(status) => return Err(status),
            }
        }
    }
}

impl From<Lane> for Phase {
    fn from(lane: Lane) -> Self {
        match lane {
            Lane::Attach => Phase::Attach,
            Lane::Detach => Phase::Detach,
        }
    }
}
