//! The I/O edges: watches feeding the index, workers executing the decisions of
//! [`decide`](crate::decide) against the API server and the driver, and the periodic resync.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use csi_proto::v1::DeleteVolumeRequest;
use either::Either;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::api::{ApiResource, DynamicObject};
use sidecar_kit::csi::{CallOptions, CsiClient};
use sidecar_kit::events::{EventType, Recorder, Reporter};
use sidecar_kit::kube::{api_code, api_message};
use sidecar_kit::pipeline::{Fed, Pipeline};
use sidecar_kit::shrink::ShrinkWhenSparse;
use sidecar_kit::views::Needs;
use sidecar_kit::workqueue::{Backoff, QueueConfig, WorkQueue, WorkQueueMetrics};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::decide::{
    self, Created, DeletionSecret, Failure, Lookups, Policy, Prepared, State, VolumePlan,
};
use crate::index::{Index, Work};
use crate::journal::{self, Intent, Journal, Location, Rejected};
use crate::metrics::ProvisionMetrics;
use crate::model::{self, Claim, Class, NEEDS, SecretRef, SourceKey, SourceKind};
use crate::sources::{
    self, AttributesClass, Content, ReferenceGrant, SourceError, VolumeSnapshot,
    VolumeSnapshotContent,
};

/// Queue names, as upstream names them in the workqueue metrics.
pub const CLAIM_QUEUE: &str = "claims";
pub const VOLUME_QUEUE: &str = "volumes";
/// The queue of data sources whose protection finalizer may be due for removal.
pub const SOURCE_QUEUE: &str = "sources";
/// Reporting component of the Events, as upstream's second recorder names it.
pub const COMPONENT: &str = "external-provisioner";
/// A claim backing off longer than this gets a Warning Event saying when it is retried.
const LONG_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait for a journal write. Longer than `--timeout`: under a busy rate limit the write
/// waits behind the other requests, and failing it would only send the claim to the back.
const JOURNAL_WAIT: Duration = Duration::from_secs(120);
/// How many VolumeSnapshotContents are remembered between restores.
const CONTENT_CACHE: usize = 1024;
/// DeleteVolume attempts to undo an unusable volume, within one `--timeout`.
const CLEANUP_ATTEMPTS: usize = 5;

/// Everything the controller needs besides its clients.
#[derive(Clone)]
pub struct Config {
    pub policy: Policy,
    /// Timeout of each CreateVolume and DeleteVolume.
    pub timeout: Duration,
    pub backoff: Backoff,
    /// Workers per queue.
    pub workers: usize,
    /// Period of the full resync (zero: none).
    pub resync: Duration,
    /// Watch Nodes and CSINodes (topology).
    pub watch_topology: bool,
    /// Watch VolumeAttachments (deletion waits for detach).
    pub watch_attachments: bool,
    /// Watch VolumeSnapshots (restores wait for them; orphaned finalizers are swept).
    pub watch_snapshots: bool,
    /// Watch ReferenceGrants (cross-namespace data sources).
    pub watch_grants: bool,
    /// Workers removing protection finalizers (`--cloning-protection-threads`).
    pub source_workers: usize,
    /// Period of the sweep for orphaned snapshot finalizers (zero: none).
    pub orphan_sweep: Duration,
    /// Distributed provisioning: the base and maximum delay before a node claims an Immediate
    /// claim (`--node-deployment-base-delay`, `--node-deployment-max-delay`).
    pub owner_delay: (Duration, Duration),
    /// Capacity tracking, told when provisioning or deletion may have changed a capacity.
    pub capacity: Option<crate::capacity::controller::CapacityHandle>,
    pub queue_metrics: Option<WorkQueueMetrics>,
    pub metrics: Option<ProvisionMetrics>,
    pub reporter: Reporter,
    /// Where unfinished CreateVolume calls are recorded (`None`: nowhere, as upstream).
    pub journal: Option<Location>,
    /// Client of the Events: one that only uses the rate-limit tokens the PV writes leave free
    /// (`None`: the main client).
    pub event_client: Option<kube::Client>,
    /// Client of the journal: one with a budget of its own, since each write gates CreateVolume
    /// calls whose PV writes then wait for the main budget (`None`: the main client).
    pub journal_client: Option<kube::Client>,
    /// The watches, shared with the other controllers of an all-in-one process.
    pub watches: sidecar_kit::watches::WatchHub,
}

/// A CreateVolume that has not been answered for sure: repeated with the identical request
/// until it has, even after its claim is gone.
#[derive(Clone, Debug)]
struct InFlight {
    claim: Claim,
    class: String,
    prepared: Prepared,
    /// The PV built from a successful answer whose creation failed: only the write is retried.
    pv: Option<Box<PersistentVolume>>,
    started: Instant,
    /// Recorded in the journal.
    journaled: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Controller {
    config: Config,
    client: kube::Client,
    pvs: Api<PersistentVolume>,
    csi: CsiClient,
    index: Mutex<Index>,
    claims: WorkQueue<Arc<str>>,
    volumes: WorkQueue<Arc<str>>,
    sources: WorkQueue<SourceKey>,
    in_flight: Mutex<HashMap<String, InFlight>>,
    /// Claims waiting for their data source to change, with the message they were told.
    waiting: Mutex<HashMap<String, String>>,
    /// Serialises the protection finalizer writes, so that each source is written once.
    protection: tokio::sync::Mutex<()>,
    /// Distributed provisioning: Immediate claims this node means to claim, by UID.
    owners: Mutex<HashMap<String, OwnerAttempt>>,
    /// VolumeSnapshotContents read for restores, with the snapshot resourceVersion they were
    /// read at: restores of an unchanged snapshot do not read its content again.
    contents: Mutex<HashMap<String, (String, Content)>>,
    /// One content read at a time, so that a burst of restores of one snapshot reads it once.
    content_reads: tokio::sync::Mutex<()>,
    /// Claims the driver found infeasible (InvalidArgument): the class UID then, and when.
    infeasible: Mutex<HashMap<String, (String, Instant)>>,
    events: Recorder,
    journal: Journal,
}

/// Runs the provisioner until `shutdown` is cancelled; then stops taking work, lets the running
/// operations finish, and returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    csi: CsiClient,
    shutdown: CancellationToken,
) {
    fn queue<K: Clone + Eq + std::hash::Hash + Send + 'static>(
        config: &Config,
        name: &str,
    ) -> WorkQueue<K> {
        WorkQueue::new(
            QueueConfig {
                name: name.to_string(),
                lanes: vec!["default".to_string()],
                backoff: config.backoff,
            },
            config.queue_metrics.as_ref(),
        )
    }
    let controller = Arc::new(Controller {
        pvs: Api::all(client.clone()),
        csi,
        index: Mutex::new(match &config.policy.node {
            Some(node) => {
                Index::for_node(&config.policy.driver, &node.name, node.topology.as_ref())
            }
            None => Index::new(&config.policy.driver),
        }),
        claims: queue(&config, CLAIM_QUEUE),
        volumes: queue(&config, VOLUME_QUEUE),
        sources: queue(&config, SOURCE_QUEUE),
        in_flight: Mutex::new(HashMap::new()),
        waiting: Mutex::new(HashMap::new()),
        protection: tokio::sync::Mutex::new(()),
        owners: Mutex::new(HashMap::new()),
        contents: Mutex::new(HashMap::new()),
        content_reads: tokio::sync::Mutex::new(()),
        infeasible: Mutex::new(HashMap::new()),
        events: Recorder::spawn(
            config
                .event_client
                .clone()
                .unwrap_or_else(|| client.clone()),
            config.reporter.clone(),
        ),
        journal: match &config.journal {
            Some(location) => Journal::start(
                config
                    .journal_client
                    .clone()
                    .unwrap_or_else(|| client.clone()),
                location.clone(),
                crate::journal::OWNER,
            ),
            None => Journal::off(crate::journal::OWNER),
        },
        client,
        config,
    });
    controller.run(shutdown).await;
}

impl Fed for Controller {
    type Index = Index;
    type Work = Work;

    fn client(&self) -> &kube::Client {
        &self.client
    }

    fn needs(&self) -> Needs {
        NEEDS
    }

    fn index(&self) -> MutexGuard<'_, Index> {
        lock(&self.index)
    }

    fn enqueue(&self, work: Vec<Work>) {
        for item in work {
            match item {
                Work::Claim(uid) => self.claims.add(uid, 0),
                Work::Volume(name) => self.volumes.add(name, 0),
                Work::Source(key) => self.sources.add(key, 0),
            }
        }
    }
}

impl Controller {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.policy.driver, "starting CSI provisioner");
        let mut pipeline = Pipeline::with_watches(self.config.watches.clone());
        pipeline.feed::<StorageClass, _>(&self, Index::class_event);
        let distributed = self.index().distributed();
        if distributed {
            pipeline.feed::<PersistentVolume, _>(&self, Index::node_volume_event);
        } else {
            pipeline.feed_view(&self, Index::volume_event);
        }
        pipeline.feed_view(&self, Index::claim_event);
        if self.config.watch_topology {
            pipeline.feed::<CSINode, _>(&self, Index::csinode_event);
            pipeline.feed::<Node, _>(&self, Index::node_event);
        }
        if self.config.watch_attachments {
            pipeline.feed::<VolumeAttachment, _>(&self, Index::attachment_event);
        }
        if self.config.watch_snapshots {
            pipeline.feed::<VolumeSnapshot, _>(&self, Index::snapshot_event);
        }
        if self.config.watch_grants {
            pipeline.feed::<ReferenceGrant, _>(&self, Index::grant_event);
        }
        if !pipeline.wait_synced(&shutdown).await {
            pipeline.stop().await;
            return;
        }
        {
            let index = self.index();
            tracing::info!(
                claims = index.claim_count(),
                persistent_volumes = index.volume_count(),
                "caches synced"
            );
        }
        self.replay_journal(&shutdown).await;
        let me = self.clone();
        pipeline.workers(&self.claims, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.sync_claim(&item.key).await }
        });
        let me = self.clone();
        pipeline.workers(&self.volumes, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.sync_volume(&item.key).await }
        });
        let me = self.clone();
        pipeline.workers(
            &self.sources,
            self.config.source_workers.max(1),
            move |item| {
                let me = me.clone();
                async move { me.sync_source(&item.key).await }
            },
        );
        let me = self.clone();
        pipeline.every(self.config.resync, move || {
            let work = me.index().resync();
            me.enqueue(work);
        });
        if self.config.watch_snapshots && !self.config.orphan_sweep.is_zero() {
            pipeline.spawn(self.clone().orphan_sweeper(shutdown.clone()));
        }
        shutdown.cancelled().await;
        pipeline.stop().await;
        let unanswered = lock(&self.in_flight).len();
        if unanswered > 0 {
            tracing::warn!(
                claims = unanswered,
                "stopping with CreateVolume calls not answered for sure; the next leader repeats them for claims that still exist"
            );
        }
        tracing::info!("CSI provisioner stopped");
    }

    /// Takes up the CreateVolume calls a previous leader (or this process before a restart) left
    /// unanswered: each is repeated with its recorded request before anything else happens to
    /// its claim.
    async fn replay_journal(&self, shutdown: &CancellationToken) {
        let mut delay = Duration::from_millis(200);
        let intents = loop {
            match self.journal.load::<Intent>().await {
                Ok(intents) => break intents,
                Err(err) => {
                    tracing::warn!(error = %err, retry_in = ?delay, "cannot read the intent journal; unfinished provisionings wait for it");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(self.config.backoff.max);
                }
            }
        };
        if intents.is_empty() {
            return;
        }
        tracing::info!(
            count = intents.len(),
            "taking up unfinished provisionings from the intent journal"
        );
        for (uid, intent) in intents {
            if let Err(rejected) = self.check_intent(&uid, &intent).await {
                self.reject_intent(&uid, &rejected);
                continue;
            }
            if self.index().has_volume(&intent.prepared.pv.name) {
                // The PV was written: the intent is done.
                self.journal.forget(&uid);
                continue;
            }
            lock(&self.in_flight).insert(
                uid.clone(),
                InFlight {
                    claim: intent.claim,
                    class: intent.class,
                    prepared: intent.prepared,
                    pv: None,
                    started: Instant::now(),
                    journaled: true,
                },
            );
            self.claims.add(uid, 0);
        }
    }

    /// Whether a recorded intent is one this provisioner would have recorded: see
    /// [`crate::journal`]. While its claim exists, the claim's request is prepared again
    /// (without topology, which follows the nodes) and must agree with the recorded one.
    async fn check_intent(&self, uid: &str, intent: &Intent) -> Result<(), Rejected> {
        journal::check_recorded(&self.config.policy, uid, intent)?;
        let Some(claim) = self.index().claim(uid) else {
            return Ok(());
        };
        let class_name = claim.storage_class.as_deref().unwrap_or_default();
        let Some(class) = self.index().class(class_name).cloned() else {
            return Err(Rejected::Unverifiable(format!(
                "storageclass.storage.k8s.io {class_name:?} not found"
            )));
        };
        let lookups = self.lookups(&claim, &class).await;
        let policy = Policy {
            topology: false,
            ..self.config.policy.clone()
        };
        let now = decide::prepare(&policy, &claim, &class, &*self.index(), &lookups)
            .map_err(|failure| Rejected::Unverifiable(failure.message))?;
        journal::check_against(intent, &claim, &class.name, &now)
    }

    /// Drops an entry of the journal that is not what this provisioner records, saying so in
    /// the log and in a Warning Event on the journal's ConfigMap.
    fn reject_intent(&self, uid: &str, rejected: &Rejected) {
        tracing::warn!(key = %uid, reason = %rejected, "dropping an intent journal entry this provisioner did not record; nothing is asked of the driver for it");
        if let Some(location) = &self.config.journal {
            self.events.record(
                location.object_ref(),
                EventType::Warning,
                journal::REJECTED_REASON,
                &format!(
                    "Dropped intent journal entry {uid:?}: {rejected}; nothing was asked of the driver for it"
                ),
            );
        }
        self.journal.forget(uid);
    }

    /// A CreateVolume is answered for sure and its outcome settled.
    fn finish(&self, uid: &str) {
        let mut in_flight = lock(&self.in_flight);
        if in_flight.remove(uid).is_some() {
            // Its entries are large (the whole request and PV): the table a burst of
            // provisionings grew (350 KiB for 200 claims) is given back once they are done.
            in_flight.shrink_when_sparse();
            drop(in_flight);
            self.journal.forget(uid);
        }
    }

    /// Upstream's orphan sweep: snapshots that still carry our finalizer although no claim
    /// waits for them (claims deleted while no provisioner was leading). Changes are handled as
    /// they are watched; the sweep catches what happened before.
    async fn orphan_sweeper(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let work = self.index().orphaned_snapshots();
            if !work.is_empty() {
                tracing::debug!(
                    snapshots = work.len(),
                    "sweeping orphaned snapshot finalizers"
                );
            }
            self.enqueue(work);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.config.orphan_sweep) => {}
            }
        }
    }

    // --- Claims ---

    async fn sync_claim(&self, uid: &str) {
        let key = uid.to_string();
        let in_flight = lock(&self.in_flight).get(uid).cloned();
        let flight = match in_flight {
            Some(flight) => flight,
            None => match self.start_claim(uid).await {
                Start::Go(flight) => *flight,
                Start::Stop => return,
                Start::Fail(claim, class, failure) => {
                    return self.claim_failed(&claim, &class, "", failure).await;
                }
            },
        };
        if !flight.journaled
            && let Err(message) = self.protect_source(&flight.claim).await
        {
            return self
                .flight_failed(&flight, Failure::new(State::NoChange, message))
                .await;
        }
        if let Some(pv) = flight.pv.clone() {
            return self.save_pv(flight, *pv).await;
        }
        let secrets = match self
            .secrets(flight.prepared.provisioner_secret.as_ref())
            .await
        {
            Ok(secrets) => secrets,
            Err(message) => {
                return self
                    .flight_failed(&flight, Failure::new(State::NoChange, message))
                    .await;
            }
        };
        let mut flight = flight;
        if !flight.journaled {
            let intent = Intent {
                claim: flight.claim.clone(),
                class: flight.class.clone(),
                prepared: flight.prepared.clone(),
            };
            let started = Instant::now();
            match tokio::time::timeout(JOURNAL_WAIT, self.journal.record(uid, &intent)).await {
                Ok(Ok(())) => {
                    flight.journaled = true;
                    let took = started.elapsed();
                    if took > self.config.timeout {
                        tracing::info!(claim = %flight.claim.key(), waited = ?took, "the journal write waited for its turn (API rate limit)");
                    }
                }
                Ok(Err(err)) => {
                    return self
                        .flight_failed(
                            &flight,
                            Failure::new(
                                State::NoChange,
                                format!("cannot record the provisioning intent: {err}"),
                            ),
                        )
                        .await;
                }
                Err(_) => {
                    return self
                        .flight_failed(&flight, Failure::new(State::NoChange, format!("cannot record the provisioning intent: the journal write took longer than {JOURNAL_WAIT:?}")))
                        .await;
                }
            }
        }
        lock(&self.in_flight).insert(key.clone(), flight.clone());
        let mut request = flight.prepared.request.clone();
        request.secrets = secrets.clone();
        tracing::debug!(claim = %flight.claim.key(), volume = %request.name, "calling CreateVolume");
        let options = CallOptions {
            migrated: flight.prepared.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        let answer = self.csi.create_volume(request, options).await;
        let volume = match answer {
            Ok(response) => response.volume,
            Err(status) => {
                let may_reschedule =
                    self.config.policy.topology && flight.claim.selected_node().is_some();
                let state = decide::classify(Some(status.code()), may_reschedule);
                if state != State::InBackground {
                    self.finish(uid);
                }
                let failure = Failure {
                    state,
                    message: sidecar_kit::csi::go_error(&status),
                    infeasible: status.code() == tonic::Code::InvalidArgument,
                };
                return self.flight_failed(&flight, failure).await;
            }
        };
        let Some(volume) = volume else {
            let failure = Failure::new(
                State::InBackground,
                "CreateVolume answered without a volume",
            );
            return self.flight_failed(&flight, failure).await;
        };
        if volume.volume_id.is_empty() {
            // A volume without an id can be neither written into a PV nor deleted: the driver
            // created something under the request's name, and repeating the identical request
            // (CreateVolume is idempotent by name) is how to learn its id.
            let failure = Failure::new(
                State::InBackground,
                "CreateVolume answered with an empty volume_id",
            );
            return self.flight_failed(&flight, failure).await;
        }
        // A claim being deleted only waits for its pvc-protection finalizer to go.
        let claim_gone = self.index().claim(uid).is_none_or(|c| c.deleting);
        if claim_gone {
            // Nobody will use the volume: delete it instead of writing a PV for the PV
            // controller to release and delete later.
            tracing::info!(claim = %flight.claim.key(), volume_id = %volume.volume_id, "claim deleted while its volume was being created; deleting the volume");
            match self.cleanup(&volume.volume_id, &secrets).await {
                Ok(()) => {
                    self.finish(uid);
                    self.claims.forget(&*key);
                }
                Err(status) => {
                    let failure = Failure::new(
                        State::InBackground,
                        format!(
                            "deleting the volume of a deleted claim failed: {}",
                            sidecar_kit::csi::go_error(&status)
                        ),
                    );
                    self.flight_failed(&flight, failure).await;
                }
            }
            return;
        }
        match decide::build_pv(&self.config.policy, &flight.prepared, &volume) {
            Created::Pv(pv) => {
                let mut flight = flight;
                flight.pv = Some(pv.clone());
                lock(&self.in_flight).insert(key, flight.clone());
                self.save_pv(flight, *pv).await;
            }
            Created::Undo {
                volume_id,
                message,
                reason,
            } => {
                let failure = match self.cleanup(&volume_id, &secrets).await {
                    Ok(()) => {
                        let state = reason.state_after_cleanup();
                        if state != State::InBackground {
                            self.finish(&key);
                        }
                        Failure::new(state, message)
                    }
                    Err(status) => Failure::new(
                        State::InBackground,
                        reason.orphaned(
                            &message,
                            &flight.prepared.request.name,
                            &sidecar_kit::csi::go_error(&status),
                        ),
                    ),
                };
                self.flight_failed(&flight, failure).await;
            }
        }
    }

    /// Decides about a claim not in flight.
    async fn start_claim(&self, uid: &str) -> Start {
        let (claim, class) = match self.select_claim(uid) {
            Selected::Provision(claim, class) => (*claim, class),
            Selected::Unowned(claim, class) => {
                self.try_to_own(&claim, &class).await;
                return Start::Stop;
            }
            Selected::Stop => return Start::Stop,
        };
        let lookups = self.lookups(&claim, &class).await;
        let prepared = {
            let index = self.index();
            decide::prepare(&self.config.policy, &claim, &class, &*index, &lookups)
        };
        self.events.record(
            claim.object_ref(),
            EventType::Normal,
            "Provisioning",
            &format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim.key()
            ),
        );
        match prepared {
            Ok(prepared) => Start::Go(Box::new(InFlight {
                claim,
                class: class.name.clone(),
                prepared,
                pv: None,
                started: Instant::now(),
                journaled: false,
            })),
            Err(failure) => Start::Fail(Box::new(claim), class.name.clone(), failure),
        }
    }

    /// The claim and its class, if the claim is one to provision now.
    fn select_claim(&self, uid: &str) -> Selected {
        let key = uid.to_string();
        let policy = &self.config.policy;
        let index = self.index();
        let Some(claim) = index.claim(uid) else {
            self.claims.forget(&*key);
            lock(&self.waiting).remove(uid);
            lock(&self.owners).remove(uid);
            self.events.forget_object(uid);
            return Selected::Stop;
        };
        let class_name = claim.storage_class.clone().unwrap_or_default();
        let class = index.class(&class_name).cloned();
        let name = decide::volume_name(
            &policy.volume_name_prefix,
            uid,
            policy.volume_name_uuid_length,
        )
        .unwrap_or_default();
        if let Err(skip) =
            decide::should_provision(policy, &claim, class.as_ref(), index.has_volume(&name))
        {
            drop(index);
            match (skip, class) {
                (decide::Skip::Unowned, Some(class)) => {
                    return Selected::Unowned(Box::new(claim), class);
                }
                (decide::Skip::NoClass, _) => {
                    tracing::info!(claim = %claim.key(), storage_class = %class_name, "StorageClass not found; waiting for it")
                }
                (skip, _) => {
                    tracing::trace!(claim = %claim.key(), reason = ?skip, "not provisioning")
                }
            }
            lock(&self.owners).remove(uid);
            self.claims.forget(&*key);
            return Selected::Stop;
        }
        let Some(class) = class else {
            return Selected::Stop;
        };
        if let Some((class_uid, at)) = lock(&self.infeasible).get(uid).cloned() {
            let wait = self.config.backoff.max.saturating_sub(at.elapsed());
            if class_uid == class.uid && !wait.is_zero() {
                drop(index);
                tracing::debug!(claim = %claim.key(), retry_in = ?wait, "infeasible claim waits before its next attempt");
                self.claims.add_after(key, 0, wait);
                return Selected::Stop;
            }
        }
        Selected::Provision(Box::new(claim), class)
    }

    // --- Distributed provisioning ---

    /// Tries to claim an Immediate claim for this node, as upstream's nodes race for them:
    /// after a delay growing with each try (jittered, so that the nodes do not all try at
    /// once), if the node has the capacity, by setting the claim's selected node. Another
    /// node that wins meanwhile is seen on the watch and ends the attempt.
    async fn try_to_own(&self, claim: &Claim, class: &Class) {
        let uid = claim.uid.clone();
        let (base, max) = self.config.owner_delay;
        let wait = {
            let mut owners = lock(&self.owners);
            let attempt = owners.entry(uid.clone()).or_default();
            let now = Instant::now();
            match attempt.due {
                None => {
                    let delay = decide::owner_delay(base, max, attempt.attempts, random_unit());
                    attempt.attempts = attempt.attempts.saturating_add(1);
                    attempt.due = Some(now + delay);
                    Some(delay)
                }
                Some(due) if due > now => Some(due - now),
                Some(_) => {
                    attempt.due = None;
                    None
                }
            }
        };
        if let Some(wait) = wait {
            tracing::debug!(claim = %claim.key(), delay = ?wait, "will try to claim it for this node");
            self.claims.add_after(uid, 0, wait);
            return;
        }
        match self.node_fits(claim, class).await {
            Fit::Never => {
                tracing::debug!(claim = %claim.key(), "its class's allowed topologies exclude this node");
                lock(&self.owners).remove(&uid);
                self.claims.forget(&*uid);
                return;
            }
            Fit::NotNow => {
                tracing::debug!(claim = %claim.key(), "not enough capacity on this node for now");
                self.claims.add(uid, 0);
                return;
            }
            Fit::Yes => {}
        }
        match self.select_this_node(claim).await {
            Ok(true) => {
                lock(&self.owners).remove(&uid);
                tracing::info!(claim = %claim.key(), "claimed for this node");
            }
            Ok(false) => {
                lock(&self.owners).remove(&uid);
                self.claims.forget(&*uid);
            }
            Err(err) if api_code(&err) == Some(409) => {
                tracing::debug!(claim = %claim.key(), "conflict while claiming it; trying again");
                self.claims.add(uid, 0);
            }
            Err(err) => {
                tracing::warn!(claim = %claim.key(), error = %api_message(&err), "selecting this node for the claim failed");
                self.claims.add(uid, 0);
            }
        }
    }

    /// Whether this node can take the claim: its class's allowed topologies must admit the node,
    /// and GetCapacity must report room for it in one of its segments. A check that cannot be
    /// made lets the node try, so that provisioning reports the problem (as upstream).
    async fn node_fits(&self, claim: &Claim, class: &Class) -> Fit {
        let policy = &self.config.policy;
        let Some(node) = &policy.node else {
            return Fit::Yes;
        };
        let mut here = claim.clone();
        if let Some(spec) = here.pending.as_mut() {
            spec.annotations
                .insert(model::ANN_SELECTED_NODE.into(), node.name.clone());
        }
        let prepared = {
            let index = self.index();
            if policy.topology && !class.allowed_topologies.is_empty() {
                let request = crate::topology::Request {
                    claim_name: &claim.name,
                    allowed: &class.allowed_topologies,
                    selected_node: Some(&node.name),
                    strict: policy.strict_topology,
                    immediate: policy.immediate_topology,
                };
                if crate::topology::requirements(request, &*index).is_err() {
                    return Fit::Never;
                }
            }
            decide::prepare(policy, &here, class, &*index, &Lookups::default())
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(failure) => {
                tracing::debug!(claim = %claim.key(), error = %failure.message, "cannot check capacity; claiming it anyway");
                return Fit::Yes;
            }
        };
        let requested = prepared
            .request
            .capacity_range
            .as_ref()
            .map_or(0, |r| r.required_bytes);
        if requested == 0 {
            return Fit::Yes;
        }
        let segments: Vec<Option<csi_proto::v1::Topology>> = match prepared
            .request
            .accessibility_requirements
            .as_ref()
            .filter(|r| !r.requisite.is_empty())
        {
            Some(requirement) => requirement.requisite.iter().cloned().map(Some).collect(),
            None => vec![None],
        };
        for segment in segments {
            let request = csi_proto::v1::GetCapacityRequest {
                volume_capabilities: prepared.request.volume_capabilities.clone(),
                parameters: prepared.request.parameters.clone(),
                accessible_topology: segment,
            };
            match self
                .csi
                .get_capacity(request, CallOptions::timeout(self.config.timeout))
                .await
            {
                Ok(answer) if answer.available_capacity >= requested => return Fit::Yes,
                Ok(_) => {}
                Err(status) => {
                    tracing::debug!(claim = %claim.key(), error = %sidecar_kit::csi::go_error(&status), "GetCapacity failed; claiming it anyway");
                    return Fit::Yes;
                }
            }
        }
        Fit::NotNow
    }

    /// Sets the claim's selected node to this node (an update, as upstream: a conflict means
    /// another node or writer was faster). `Ok(false)`: the claim is gone or another node's.
    async fn select_this_node(&self, claim: &Claim) -> Result<bool, kube::Error> {
        let Some(node) = &self.config.policy.node else {
            return Ok(false);
        };
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let Some(mut current) = api.get_opt(&claim.name).await? else {
            return Ok(false);
        };
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(false);
        }
        let annotations = current.metadata.annotations.get_or_insert_default();
        match annotations
            .get(model::ANN_SELECTED_NODE)
            .map(String::as_str)
        {
            Some(selected) if selected == node.name => return Ok(true),
            Some(selected) if !selected.is_empty() => return Ok(false),
            _ => {}
        }
        annotations.insert(model::ANN_SELECTED_NODE.into(), node.name.clone());
        let updated = api
            .replace(&claim.name, &PostParams::default(), &current)
            .await?;
        self.index().store_claim(&updated);
        Ok(true)
    }

    /// Looks up what preparing the claim needs besides the index: its data source (snapshots
    /// from the watch when there is one, their contents from the API server; claims and their
    /// PVs from the index), the ReferenceGrants of a source in another namespace, and its
    /// VolumeAttributesClass.
    async fn lookups(&self, claim: &Claim, class: &Class) -> Lookups {
        let policy = &self.config.policy;
        let mut lookups = Lookups::default();
        let Some(spec) = claim.pending.as_deref() else {
            return lookups;
        };
        if let Some(source) = &spec.data_source {
            if source.namespace.is_some() {
                let allowed = self
                    .index()
                    .grants_in(source.namespace_in(&claim.namespace))
                    .any(|g| g.allows(&claim.namespace, source));
                lookups.grant = Some(if allowed {
                    Ok(())
                } else {
                    Err(sources::not_granted(claim, source))
                });
            }
            match source.key(&claim.namespace) {
                Some((SourceKind::Snapshot, namespace, name))
                    if policy.caps.create_delete_snapshot =>
                {
                    lookups.source_watched = self.config.watch_snapshots;
                    lookups.content =
                        Some(self.restore_source(claim, class, &namespace, &name).await);
                }
                Some((SourceKind::Claim, namespace, name)) if policy.caps.clone_volume => {
                    lookups.source_watched = true;
                    let index = self.index();
                    let source = index.claim_named(&namespace, &name);
                    let pv = source
                        .as_ref()
                        .filter(|s| !s.volume_name.is_empty())
                        .and_then(|s| index.volume(&s.volume_name));
                    lookups.content = Some(sources::check_clone(
                        claim,
                        class,
                        &name,
                        source.as_ref(),
                        pv.as_ref(),
                    ));
                }
                _ => {}
            }
        }
        if let Some(name) = &spec.volume_attributes_class
            && policy.attributes_classes
            && policy.caps.modify_volume
        {
            let api: Api<VolumeAttributesClass> = Api::all(self.client.clone());
            lookups.attributes_class = Some(
                api.get(name)
                    .await
                    .map(|vac| AttributesClass::from_api(&vac))
                    .map_err(|e| api_message(&e)),
            );
        }
        lookups
    }

    /// The content source of a restore from snapshot `namespace/name`, or why not yet.
    async fn restore_source(
        &self,
        claim: &Claim,
        class: &Class,
        namespace: &str,
        name: &str,
    ) -> Result<csi_proto::v1::VolumeContentSource, SourceError> {
        let snapshot = if self.config.watch_snapshots {
            self.index().snapshot(namespace, name).cloned()
        } else {
            let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), namespace);
            match api.get_opt(name).await {
                Ok(found) => found.as_ref().map(sources::Snapshot::from_api),
                Err(err) => {
                    return Err(SourceError {
                        message: format!(
                            "error getting snapshot {name} from api server: {}",
                            api_message(&err)
                        ),
                        may_change: false,
                    });
                }
            }
        };
        let (snapshot, content_name) = sources::check_snapshot(name, snapshot.as_ref())?;
        let check = |content: &Content| {
            sources::check_content(
                claim,
                class,
                snapshot,
                content,
                self.config.policy.prevent_volume_mode_conversion,
            )
        };
        let cached = || {
            lock(&self.contents)
                .get(content_name)
                .filter(|(version, _)| *version == snapshot.resource_version)
                .map(|(_, content)| content.clone())
        };
        // A refusal is checked against a fresh read: the content may have changed (for example
        // an annotation allowing a volume mode change).
        if let Some(content) = cached()
            && let Ok(source) = check(&content)
        {
            return Ok(source);
        }
        let _one_read = self.content_reads.lock().await;
        if let Some(content) = cached()
            && let Ok(source) = check(&content)
        {
            return Ok(source);
        }
        let api: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let content = match api.get(content_name).await {
            Ok(content) => Content::from_api(&content),
            Err(err) => {
                tracing::info!(snapshot = %format!("{namespace}/{name}"), content = content_name, error = %api_message(&err), "cannot get the snapshot's content");
                return Err(SourceError {
                    message: format!(
                        "error getting snapshotcontent {content_name} for snapshot {name}"
                    ),
                    may_change: false,
                });
            }
        };
        if self.config.watch_snapshots {
            let mut contents = lock(&self.contents);
            if contents.len() >= CONTENT_CACHE {
                contents.clear();
            }
            contents.insert(
                content_name.to_string(),
                (snapshot.resource_version.clone(), content.clone()),
            );
        }
        check(&content)
    }

    async fn flight_failed(&self, flight: &InFlight, failure: Failure) {
        self.claim_failed(
            &flight.claim,
            &flight.class,
            &flight.prepared.source,
            failure,
        )
        .await;
    }

    async fn claim_failed(&self, claim: &Claim, class: &str, source: &str, failure: Failure) {
        let key = claim.uid.clone();
        // Upstream labels the failures of claims not prepared yet with `spec.dataSource`'s kind.
        let source = match source {
            "" => claim
                .pending
                .as_ref()
                .and_then(|p| p.data_source.as_ref())
                .filter(|s| !s.from_ref)
                .map_or("", |s| s.kind.as_str()),
            known => known,
        };
        if let Some(metrics) = &self.config.metrics {
            metrics.provision(class, source, Err(()));
        }
        // A failure may have been for want of room: the class's capacities are read again.
        if failure.state != State::NoChange {
            self.refresh_capacity(class, None);
        }
        match failure.state {
            State::Ignored => {
                tracing::debug!(claim = %claim.key(), reason = %failure.message, "not provisioning");
                if failure.message == decide::POPULATOR_MESSAGE {
                    self.events.record(
                        claim.object_ref(),
                        EventType::Normal,
                        "Provisioning",
                        &failure.message,
                    );
                }
                self.claims.forget(&*key);
                return;
            }
            State::Wait => {
                // The watch of the source requeues the claim when the source changes.
                let told = lock(&self.waiting).insert(key.clone(), failure.message.clone());
                if told.as_deref() != Some(failure.message.as_str()) {
                    tracing::info!(claim = %claim.key(), reason = %failure.message, "waiting for the data source");
                    self.events.record(
                        claim.object_ref(),
                        EventType::Warning,
                        "ProvisioningFailed",
                        &format!(
                            "{}; provisioning goes on when the data source changes",
                            failure.message
                        ),
                    );
                }
                self.claims.forget(&*key);
                return;
            }
            _ => {
                lock(&self.waiting).remove(&key);
            }
        }
        if failure.infeasible {
            lock(&self.infeasible).insert(key.clone(), (self.class_uid(class), Instant::now()));
            let message = format!(
                "Volume provisioning failed with infeasible error. Retries will be delayed. {}",
                failure.message
            );
            self.events.record(
                claim.object_ref(),
                EventType::Warning,
                "ProvisioningFailed",
                &message,
            );
            tracing::warn!(claim = %claim.key(), error = %failure.message, retry_in = ?self.config.backoff.max, "provisioning infeasible");
            self.claims.add_after(key, 0, self.config.backoff.max);
            return;
        }
        self.events.record(
            claim.object_ref(),
            EventType::Warning,
            "ProvisioningFailed",
            &failure.message,
        );
        if failure.state == State::Reschedule && claim.selected_node().is_some() {
            match self.reschedule(claim).await {
                Ok(()) => {
                    tracing::info!(claim = %claim.key(), error = %failure.message, "asked the scheduler for another node");
                    self.claims.forget(&*key);
                    return;
                }
                Err(err) => {
                    tracing::info!(claim = %claim.key(), error = %err, "Volume rescheduling failed")
                }
            }
        }
        let delay = self.claims.add_rate_limited(key, 0);
        tracing::info!(claim = %claim.key(), error = %failure.message, state = ?failure.state, retry_in = ?delay, "provisioning failed");
        if delay >= LONG_BACKOFF {
            let next = Timestamp::now()
                .checked_add(jiff_duration(delay))
                .unwrap_or_else(|_| Timestamp::now());
            self.events.record(
                claim.object_ref(),
                EventType::Warning,
                "ProvisioningBackoff",
                &format!(
                    "Provisioning keeps failing; next attempt at {next} (in {}s)",
                    delay.as_secs()
                ),
            );
        }
    }

    fn class_uid(&self, class: &str) -> String {
        self.index()
            .class(class)
            .map(|c| c.uid.clone())
            .unwrap_or_default()
    }

    /// Removes `volume.kubernetes.io/selected-node` so that the scheduler picks a node again
    /// (an update, as upstream's RBAC grants no patch on claims).
    async fn reschedule(&self, claim: &Claim) -> Result<(), String> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let mut current = api.get(&claim.name).await.map_err(|e| api_message(&e))?;
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(());
        }
        let annotations = current.metadata.annotations.get_or_insert_default();
        annotations.remove(model::ANN_SELECTED_NODE);
        annotations.remove(model::ANN_ALPHA_SELECTED_NODE);
        let updated = api
            .replace(&claim.name, &PostParams::default(), &current)
            .await
            .map_err(|e| api_message(&e))?;
        self.index().store_claim(&updated);
        Ok(())
    }

    /// Writes the PV of a created volume. A PV of that name with another volume handle means
    /// this volume is a second one (a create replayed after a delete): it is deleted again.
    async fn save_pv(&self, flight: InFlight, pv: PersistentVolume) {
        let key = flight.claim.uid.clone();
        let name = flight.prepared.pv.name.clone();
        let volume_id = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default();
        match self.pvs.create(&PostParams::default(), &pv).await {
            Ok(created) => {
                self.index().store_volume(&created, true);
            }
            Err(err) if api_code(&err) == Some(409) => match self.pvs.get_opt(&name).await {
                Ok(Some(existing)) if decide::same_volume(&existing, &volume_id) => {
                    self.index().store_volume(&existing, true);
                }
                Ok(Some(_)) => {
                    tracing::warn!(persistent_volume = %name, volume_id = %volume_id, "a PV of this name names another volume; deleting the volume just created");
                    let secrets = self
                        .secrets(flight.prepared.provisioner_secret.as_ref())
                        .await
                        .unwrap_or_default();
                    if let Err(status) = self.cleanup(&volume_id, &secrets).await {
                        let failure = Failure::new(
                            State::InBackground,
                            format!(
                                "deleting duplicate volume {volume_id} failed: {}",
                                sidecar_kit::csi::go_error(&status)
                            ),
                        );
                        return self.flight_failed(&flight, failure).await;
                    }
                    self.finish(&key);
                    self.claims.forget(&*key);
                    return;
                }
                Ok(None) | Err(_) => {
                    let failure = Failure::new(
                        State::InBackground,
                        format!(
                            "error saving persistentvolume {name}: {}",
                            api_message(&err)
                        ),
                    );
                    return self.flight_failed(&flight, failure).await;
                }
            },
            Err(err) => {
                let failure = Failure::new(
                    State::InBackground,
                    format!(
                        "error saving persistentvolume {name}: {}",
                        api_message(&err)
                    ),
                );
                return self.flight_failed(&flight, failure).await;
            }
        }
        self.finish(&key);
        lock(&self.infeasible).remove(&key);
        lock(&self.waiting).remove(&key);
        self.claims.forget(&*key);
        if let Some(metrics) = &self.config.metrics {
            metrics.provision(
                &flight.class,
                &flight.prepared.source,
                Ok(flight.started.elapsed()),
            );
        }
        self.refresh_capacity(
            &flight.class,
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
        );
        tracing::info!(claim = %flight.claim.key(), persistent_volume = %name, "provisioned");
        self.events.record(
            flight.claim.object_ref(),
            EventType::Normal,
            "ProvisioningSucceeded",
            &format!("Successfully provisioned volume {name}"),
        );
        // A provisioned claim gets no more of these Events: remembering them for folding would
        // only hold memory for every claim of a burst.
        self.events.forget_object(&flight.claim.uid);
    }

    /// DeleteVolume for a volume that must not stay: several attempts within one timeout.
    async fn cleanup(
        &self,
        volume_id: &str,
        secrets: &HashMap<String, String>,
    ) -> Result<(), tonic::Status> {
        let deadline = Instant::now() + self.config.timeout;
        let mut last = tonic::Status::deadline_exceeded(sidecar_kit::csi::DEADLINE_MESSAGE);
        for _ in 0..CLEANUP_ATTEMPTS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let request = DeleteVolumeRequest {
                volume_id: volume_id.to_string(),
                secrets: secrets.clone(),
            };
            match self
                .csi
                .delete_volume(request, CallOptions::timeout(left))
                .await
            {
                Ok(_) => return Ok(()),
                Err(status) => last = status,
            }
        }
        Err(last)
    }

    async fn secrets(
        &self,
        reference: Option<&SecretRef>,
    ) -> Result<HashMap<String, String>, String> {
        let Some(reference) = reference else {
            return Ok(HashMap::new());
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &reference.namespace);
        let secret = api.get(&reference.name).await.map_err(|err| {
            format!(
                "error getting secret {} in namespace {}: {}",
                reference.name,
                reference.namespace,
                api_message(&err)
            )
        })?;
        Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect())
    }

    /// Asks capacity tracking to read again the capacities a volume created or deleted in
    /// `affinity` may have changed: those of its segments, else (no topology) the class's, as
    /// upstream's provisioner does.
    fn refresh_capacity(
        &self,
        class: &str,
        affinity: Option<&k8s_openapi::api::core::v1::VolumeNodeAffinity>,
    ) {
        let Some(capacity) = &self.config.capacity else {
            return;
        };
        let segments = affinity
            .map(crate::capacity::affinity_segments)
            .unwrap_or_default();
        if segments.is_empty() {
            if !class.is_empty() {
                capacity.refresh(Some(class), None);
            }
            return;
        }
        for segment in &segments {
            capacity.refresh(None, Some(segment));
        }
    }

    // --- Data source protection ---

    /// Puts our protection finalizer on the claim's source before its volume is created from
    /// it, so that it is not deleted meanwhile. Each source is written once, whatever the
    /// number of claims filled from it.
    async fn protect_source(&self, claim: &Claim) -> Result<(), String> {
        let Some((kind, namespace, name)) = claim.source_key() else {
            return Ok(());
        };
        let _serial = self.protection.lock().await;
        match kind {
            SourceKind::Claim => {
                if self
                    .index()
                    .claim_named(&namespace, &name)
                    .is_some_and(|c| c.clone_protected)
                {
                    return Ok(());
                }
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.client.clone(), &namespace);
                let mut source = api.get(&name).await.map_err(|e| api_message(&e))?;
                let finalizers = source.metadata.finalizers.get_or_insert_default();
                if !finalizers.iter().any(|f| f == model::CLONE_FINALIZER) {
                    finalizers.push(model::CLONE_FINALIZER.to_string());
                    source = api
                        .replace(&name, &PostParams::default(), &source)
                        .await
                        .map_err(|e| api_message(&e))?;
                    tracing::info!(claim = %format!("{namespace}/{name}"), "added the cloning protection finalizer");
                }
                self.index().store_claim(&source);
                Ok(())
            }
            SourceKind::Snapshot => {
                if self.config.watch_snapshots
                    && self
                        .index()
                        .snapshot(&namespace, &name)
                        .is_some_and(|s| s.protected)
                {
                    return Ok(());
                }
                let api = self.snapshots_api(&namespace);
                let mut snapshot = api.get(&name).await.map_err(|e| api_message(&e))?;
                let finalizers = snapshot.metadata.finalizers.get_or_insert_default();
                if finalizers.iter().any(|f| f == model::SNAPSHOT_FINALIZER) {
                    return Ok(());
                }
                finalizers.push(model::SNAPSHOT_FINALIZER.to_string());
                match api.replace(&name, &PostParams::default(), &snapshot).await {
                    Ok(_) => {
                        tracing::info!(snapshot = %format!("{namespace}/{name}"), "added the restore protection finalizer");
                        Ok(())
                    }
                    Err(err) if api_code(&err) == Some(403) => {
                        tracing::debug!(snapshot = %format!("{namespace}/{name}"), error = %api_message(&err), "cannot add the restore protection finalizer (needs 'update' on volumesnapshots); provisioning goes on without it");
                        Ok(())
                    }
                    Err(err) => Err(api_message(&err)),
                }
            }
        }
    }

    fn snapshots_api(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            namespace,
            &ApiResource::erase::<VolumeSnapshot>(&()),
        )
    }

    /// Removes our protection finalizer from a source no claim without a volume names any
    /// more (a claim being cloned from only once it is being deleted, as upstream).
    async fn sync_source(&self, key: &SourceKey) {
        let result = {
            let _serial = self.protection.lock().await;
            self.release_source(key).await
        };
        match result {
            Ok(()) => self.sources.forget(key),
            Err(message) => {
                let delay = self.sources.add_rate_limited(key.clone(), 0);
                tracing::info!(source = ?key, error = %message, retry_in = ?delay, "failed to remove a protection finalizer");
            }
        }
    }

    async fn release_source(&self, key: &SourceKey) -> Result<(), String> {
        let (kind, namespace, name) = key;
        let label = format!("{namespace}/{name}");
        {
            let index = self.index();
            if index.source_in_use(key) {
                return Ok(());
            }
            let cached_protection = match kind {
                SourceKind::Claim => index
                    .claim_named(namespace, name)
                    .map(|c| c.deleting && c.clone_protected),
                SourceKind::Snapshot if self.config.watch_snapshots => {
                    index.snapshot(namespace, name).map(|s| s.protected)
                }
                SourceKind::Snapshot => Some(true),
            };
            if cached_protection != Some(true) {
                return Ok(());
            }
        }
        match kind {
            SourceKind::Claim => {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(self.client.clone(), namespace);
                let Some(mut claim) = api.get_opt(name).await.map_err(|e| api_message(&e))? else {
                    return Ok(());
                };
                let finalizers = claim.metadata.finalizers.get_or_insert_default();
                let before = finalizers.len();
                finalizers.retain(|f| f != model::CLONE_FINALIZER);
                if finalizers.len() == before {
                    return Ok(());
                }
                match api.replace(name, &PostParams::default(), &claim).await {
                    Ok(updated) => {
                        self.index().store_claim(&updated);
                        tracing::info!(claim = %label, "removed the cloning protection finalizer");
                        Ok(())
                    }
                    Err(err) if api_code(&err) == Some(404) => Ok(()),
                    Err(err) => Err(format!(
                        "failed to remove clone finalizer from PVC {name}: {}",
                        api_message(&err)
                    )),
                }
            }
            SourceKind::Snapshot => {
                let api = self.snapshots_api(namespace);
                let mut snapshot = match api.get_opt(name).await {
                    Ok(Some(snapshot)) => snapshot,
                    Ok(None) => return Ok(()),
                    Err(err) if api_code(&err) == Some(403) => {
                        tracing::debug!(snapshot = %label, error = %api_message(&err), "cannot read the snapshot to remove our finalizer");
                        return Ok(());
                    }
                    Err(err) => return Err(api_message(&err)),
                };
                let finalizers = snapshot.metadata.finalizers.get_or_insert_default();
                let before = finalizers.len();
                finalizers.retain(|f| f != model::SNAPSHOT_FINALIZER);
                if finalizers.len() == before {
                    return Ok(());
                }
                match api.replace(name, &PostParams::default(), &snapshot).await {
                    Ok(_) => {
                        tracing::info!(snapshot = %label, "removed the restore protection finalizer");
                        Ok(())
                    }
                    Err(err) if matches!(api_code(&err), Some(403 | 404)) => Ok(()),
                    Err(err) => Err(format!(
                        "failed to remove the restore protection finalizer from snapshot {label}: {}",
                        api_message(&err)
                    )),
                }
            }
        }
    }

    // --- Volumes ---

    async fn sync_volume(&self, name: &str) {
        let key = name.to_string();
        let (volume, plan) = {
            let index = self.index();
            let Some(volume) = index.volume(name) else {
                self.volumes.forget(&*key);
                return;
            };
            let attached = if self.config.watch_attachments {
                index.attached_to(name)
            } else {
                None
            };
            let class = index.class(&volume.storage_class);
            let plan =
                decide::plan_volume(&self.config.policy, &volume, class, attached.as_deref());
            (volume, plan)
        };
        let result = match plan {
            VolumePlan::Nothing => Ok(()),
            VolumePlan::AddFinalizer => self.patch_finalizers(&volume, true).await,
            VolumePlan::RemoveFinalizer => self.patch_finalizers(&volume, false).await,
            VolumePlan::Refuse(message) => {
                self.events.record(
                    volume.object_ref(),
                    EventType::Warning,
                    "VolumeFailedDelete",
                    &message,
                );
                Err(message)
            }
            VolumePlan::Delete(plan) => self.delete_volume(&volume, plan).await,
        };
        match result {
            Ok(()) => self.volumes.forget(&*key),
            Err(message) => {
                let delay = self.volumes.add_rate_limited(key, 0);
                tracing::info!(persistent_volume = name, error = %message, retry_in = ?delay, "volume sync failed");
            }
        }
    }

    async fn patch_finalizers(&self, volume: &model::Volume, add: bool) -> Result<(), String> {
        let patch = decide::finalizers_patch(add);
        match self
            .pvs
            .patch(
                &volume.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(updated) => {
                self.index().store_volume(&updated, false);
                Ok(())
            }
            Err(err) if api_code(&err) == Some(404) => Ok(()),
            Err(err) => Err(format!(
                "failed to modify finalizers on volume {}: {}",
                volume.name,
                api_message(&err)
            )),
        }
    }

    async fn delete_volume(
        &self,
        volume: &model::Volume,
        plan: decide::DeletePlan,
    ) -> Result<(), String> {
        let started = Instant::now();
        let secret = match plan.secret {
            DeletionSecret::None => None,
            DeletionSecret::Annotated(r) => Some(r),
            DeletionSecret::FromClass(Ok(r)) => r,
            DeletionSecret::FromClass(Err(message)) => {
                self.record_delete_failure(volume, &message);
                return Err(message);
            }
        };
        let secrets = match self.secrets(secret.as_ref()).await {
            Ok(secrets) => secrets,
            Err(message) => {
                // The secret may be gone already: delete without it, as upstream does.
                tracing::error!(persistent_volume = %volume.name, error = %message, "failed to get credentials for volume; deleting without them");
                HashMap::new()
            }
        };
        let mut request = plan.request;
        request.secrets = secrets;
        let options = CallOptions {
            migrated: plan.migrated,
            ..CallOptions::timeout(self.config.timeout)
        };
        if let Err(status) = self.csi.delete_volume(request, options).await {
            let message = sidecar_kit::csi::go_error(&status);
            self.record_delete_failure(volume, &message);
            return Err(message);
        }
        tracing::info!(persistent_volume = %volume.name, "volume deleted");
        // The deletion answers with the PV as it is now: deletionTimestamp set, finalizers
        // still on.
        match self
            .pvs
            .delete(&volume.name, &DeleteParams::default())
            .await
        {
            Ok(Either::Left(remaining)) => {
                self.refresh_capacity(
                    &volume.storage_class,
                    remaining
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_affinity.as_ref()),
                );
                self.index().store_volume(&remaining, false);
                let remaining = model::Volume::from_api(&remaining);
                if remaining.has_finalizer() {
                    self.patch_finalizers(&remaining, false).await?;
                }
            }
            Ok(Either::Right(_)) => {}
            Err(err) if api_code(&err) == Some(404) => {}
            Err(err) => {
                return Err(format!(
                    "failed to delete persistentvolume {}: {}",
                    volume.name,
                    api_message(&err)
                ));
            }
        }
        if let Some(metrics) = &self.config.metrics {
            metrics.delete(&volume.storage_class, Ok(started.elapsed()));
        }
        Ok(())
    }

    fn record_delete_failure(&self, volume: &model::Volume, message: &str) {
        if let Some(metrics) = &self.config.metrics {
            metrics.delete(&volume.storage_class, Err(()));
        }
        self.events.record(
            volume.object_ref(),
            EventType::Warning,
            "VolumeFailedDelete",
            message,
        );
    }
}

/// Distributed provisioning: the tries of this node to claim an Immediate claim.
#[derive(Debug, Default)]
struct OwnerAttempt {
    attempts: u32,
    /// When the next try is due (`None`: not scheduled).
    due: Option<Instant>,
}

/// Whether this node can take a claim.
enum Fit {
    Yes,
    NotNow,
    Never,
}

/// A random number in 0..1 (for jitter and identities; no cryptographic quality needed).
pub fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// What the claim selection found.
enum Selected {
    Provision(Box<Claim>, Class),
    /// Distributed provisioning: an Immediate claim this node may claim.
    Unowned(Box<Claim>, Class),
    Stop,
}

/// What to do with a claim that is not in flight.
enum Start {
    Go(Box<InFlight>),
    Stop,
    Fail(Box<Claim>, String, Failure),
}

fn jiff_duration(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}
