//! The I/O edges: watches feeding the index, workers executing the decisions of
//! [`decide`](crate::decide) against the API server and the driver, and the periodic resync.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::DeleteVolumeRequest;
use either::Either;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{
    CSINode, StorageClass, VolumeAttachment, VolumeAttributesClass,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::api::{ApiResource, DynamicObject};
use sidecar_kit::cluster::client::{api_code, api_message};
use sidecar_kit::cluster::events::{EventType, Recorder};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::{Backoff, WorkQueue};
use sidecar_kit::pipeline::{Fed, Feeder, Pipeline, Wiring, lock};
use sidecar_kit::telemetry::operation;
use sidecar_kit::values::shrink::ShrinkWhenSparse;
use sidecar_kit::values::version::ResourceVersion;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::decide::{
    self, Created, DeletionSecret, Failure, Lookups, Policy, Prepared, State, VolumePlan,
};
use crate::index::{Index, Work};
use crate::journal::{self, Intent, Journal, JournalClient, Location, Rejected, Reporting};
use crate::metrics::ProvisionMetrics;
use crate::model::{self, Claim, Class, NEEDS, SecretRef, SourceKey, SourceKind};
use crate::sources::{
    self, AttributesClass, Content, ReferenceGrant, SourceError, VolumeSnapshot,
    VolumeSnapshotContent,
};

mod claims;
mod node;
mod protection;
mod volumes;

use node::OwnerAttempt;

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

/// How often what waits for the PVs' list (a clone, the journal's replay) looks again.
const VOLUMES_LISTED_POLL: Duration = Duration::from_millis(250);

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
    pub metrics: Option<ProvisionMetrics>,
    /// Where unfinished CreateVolume calls are recorded (`None`: nowhere, as upstream).
    pub journal: Option<Location>,
    /// Client of the Events: one that only uses the rate-limit tokens the PV writes leave free
    /// (`None`: the main client).
    pub event_client: Option<kube::Client>,
    /// Client of the journal, with a budget of its own, since each write gates CreateVolume
    /// calls whose PV writes then wait for the main budget (`None`: the main client, at the
    /// journal's largest budget).
    pub journal_client: Option<JournalClient>,
    /// Client of the VolumeSnapshot API (its watch, reads and finalizers): one with a rate
    /// limit of its own, as upstream's snapshot clientset has, so that they take no token from
    /// the PV writes (`None`: the main client).
    pub snapshot_client: Option<kube::Client>,
    /// The watches and queue metrics, shared with the other controllers of the process.
    pub wiring: Wiring,
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

struct Controller {
    config: Config,
    client: kube::Client,
    pvs: Api<PersistentVolume>,
    csi: CsiClient,
    feed: Feeder<Index>,
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
    contents: Mutex<HashMap<String, (ResourceVersion, Content)>>,
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
    let events = config.wiring.recorder(
        config
            .event_client
            .clone()
            .unwrap_or_else(|| client.clone()),
    );
    let controller = Arc::new(Controller {
        pvs: Api::all(client.clone()),
        csi,
        feed: Feeder::new(
            match &config.policy.node {
                Some(node) => {
                    Index::for_node(&config.policy.driver, &node.name, node.topology.as_ref())
                }
                None => Index::new(&config.policy.driver),
            },
            client.clone(),
            NEEDS,
        ),
        claims: config
            .wiring
            .queue(CLAIM_QUEUE, &["default"], config.backoff),
        volumes: config
            .wiring
            .queue(VOLUME_QUEUE, &["default"], config.backoff),
        sources: config
            .wiring
            .queue(SOURCE_QUEUE, &["default"], config.backoff),
        in_flight: Mutex::new(HashMap::new()),
        waiting: Mutex::new(HashMap::new()),
        protection: tokio::sync::Mutex::new(()),
        owners: Mutex::new(HashMap::new()),
        contents: Mutex::new(HashMap::new()),
        content_reads: tokio::sync::Mutex::new(()),
        infeasible: Mutex::new(HashMap::new()),
        journal: match &config.journal {
            Some(location) => Journal::start(
                config
                    .journal_client
                    .clone()
                    .unwrap_or_else(|| JournalClient {
                        client: client.clone(),
                        qps: journal::MAX_QPS,
                    }),
                location.clone(),
                crate::journal::OWNER,
                Reporting {
                    events: events.clone(),
                    metrics: config.wiring.journal_metrics.clone(),
                },
            ),
            None => Journal::off(),
        },
        events,
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
            Work::Claim(uid) => self.claims.add(uid, 0),
            Work::Volume(name) => self.volumes.add(name, 0),
            Work::Source(key) => self.sources.add(key, 0),
        }
    }
}

impl Controller {
    /// See [`Config::snapshot_client`].
    fn snapshot_client(&self) -> kube::Client {
        self.config
            .snapshot_client
            .clone()
            .unwrap_or_else(|| self.client.clone())
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.policy.driver, "starting CSI provisioner");
        let mut pipeline = self.config.wiring.pipeline();
        pipeline.feed::<StorageClass, _>(&self, Index::class_event);
        let distributed = self.index().distributed();
        if distributed {
            pipeline.feed::<PersistentVolume, _>(&self, Index::node_volume_event);
        } else {
            // Claims are worked on before the PVs are listed (see `Index::volumes_listed`):
            // a cold start with many PVs reaches its first provisioning sooner.
            pipeline.feed_view_behind(&self, Index::volume_event);
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
            pipeline.feed_through::<VolumeSnapshot, _>(
                &self,
                self.snapshot_client(),
                Index::snapshot_event,
            );
        }
        if self.config.watch_grants {
            pipeline.feed::<ReferenceGrant, _>(&self, Index::grant_event);
        }
        pipeline
            .run(&shutdown, async |pipeline, stop| {
                self.start(pipeline, stop).await
            })
            .await;
        let unanswered = lock(&self.in_flight).len();
        if unanswered > 0 {
            tracing::warn!(
                claims = unanswered,
                "stopping with CreateVolume calls not answered for sure; the next leader repeats them for claims that still exist"
            );
        }
        self.journal.flush().await;
        tracing::info!("CSI provisioner stopped");
    }

    /// Once the caches synced: the journal replayed, then the workers, the resync and the
    /// orphan sweep.
    async fn start(self: &Arc<Self>, pipeline: &mut Pipeline, shutdown: CancellationToken) {
        {
            let index = self.index();
            tracing::info!(
                claims = index.claim_count(),
                persistent_volumes = index.volume_count(),
                persistent_volumes_listed = index.volumes_listed(),
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
        pipeline.resync(self, self.config.resync, Index::resync);
        if self.config.watch_snapshots && !self.config.orphan_sweep.is_zero() {
            pipeline.spawn(self.clone().orphan_sweeper(shutdown));
        }
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
        // Whether an intent's PV was written, or its clone source's PV exists, is read from the
        // index: an unfinished provisioning waits for the PVs' list.
        if !self.index().volumes_listed() {
            tracing::info!(
                count = intents.len(),
                "unfinished provisionings wait for the PVs to be listed"
            );
            if !self.volumes_listed(shutdown).await {
                return;
            }
        }
        for (uid, intent) in intents {
            if self.index().has_volume(&intent.prepared.pv.name) {
                // The PV was written: the intent is done (its forget had not been written
                // when the last leader stopped). Nothing is asked of the driver, so there is
                // nothing to check.
                self.journal.forget(&uid);
                continue;
            }
            if let Err(rejected) = self.check_intent(&uid, &intent).await {
                self.journal
                    .drop_entry(&uid, rejected.reason(), &rejected.to_string());
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

    /// Waits until the PVs are listed, polling the index; `false` if `shutdown` came first.
    async fn volumes_listed(&self, shutdown: &CancellationToken) -> bool {
        while !self.index().volumes_listed() {
            tokio::select! {
                _ = shutdown.cancelled() => return false,
                _ = tokio::time::sleep(VOLUMES_LISTED_POLL) => {}
            }
        }
        true
    }

    /// Whether a sealed intent is still what this provisioner would record: see
    /// [`crate::journal`]. The claim's request is prepared again (without topology, which
    /// follows the nodes) from the live claim or, once it is gone, from the recorded one, and
    /// its live class, and must agree with the recorded one. Only a claim gone together with
    /// its class leaves nothing to prepare again: the seal vouches for the entry then.
    async fn check_intent(&self, uid: &str, intent: &Intent) -> Result<(), Rejected> {
        journal::check_recorded(&self.config.policy, uid, intent)?;
        let live = self.index().claim(uid);
        let claim = live.clone().unwrap_or_else(|| intent.claim.clone());
        let class_name = claim.storage_class.clone().unwrap_or_default();
        if live.is_some() && class_name != intent.class {
            return Err(Rejected::Class {
                recorded: intent.class.clone(),
                live: class_name.to_string(),
            });
        }
        let Some(class) = self.index().class(&intent.class).cloned() else {
            tracing::info!(key = %uid, storage_class = %intent.class, "the class of an unfinished provisioning is gone; its sealed request is repeated as recorded");
            return Ok(());
        };
        let lookups = self.lookups(&claim, &class).await;
        let policy = Policy {
            topology: false,
            ..self.config.policy.clone()
        };
        let now = decide::prepare(&policy, &claim, &class, &*self.index(), &lookups);
        match now {
            Ok(now) => {
                journal::check_against(intent, &claim, &class.name, &now)?;
                if live.is_none() || !self.config.policy.topology || claim.selected_node().is_none()
                {
                    return Ok(());
                }
                // A claim placed on a node: its volume must be asked for there.
                let placed = decide::prepare(
                    &self.config.policy,
                    &claim,
                    &class,
                    &*self.index(),
                    &lookups,
                )
                .map_err(|failure| Rejected::Unverifiable(failure.message))?;
                journal::check_topology(intent, &placed)
            }
            Err(failure) if live.is_none() => {
                // What the gone claim read (its data source, its attributes class) may be
                // gone too: every part that does not depend on them must still agree.
                let bare = journal::without_lookups(&claim);
                let now =
                    decide::prepare(&policy, &bare, &class, &*self.index(), &Default::default())
                        .map_err(|_| Rejected::Unverifiable(failure.message))?;
                journal::check_against_bare(intent, &claim, &class.name, &now)
            }
            Err(failure) => Err(Rejected::Unverifiable(failure.message)),
        }
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

fn jiff_duration(d: Duration) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::try_from(d).unwrap_or(k8s_openapi::jiff::SignedDuration::MAX)
}
