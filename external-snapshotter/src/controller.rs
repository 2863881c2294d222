//! The I/O edges: watches feeding the index, workers carrying out the plans of
//! [`decide`](crate::decide) against the API server and the driver, the intent journal, and the
//! periodic resync.
//!
//! Readiness is asked of the driver with a per-content backoff (the queue's, from
//! `--retry-interval-start` doubling to `--retry-interval-max`, reset once the snapshot is
//! ready), and at most half the workers ask at once, so creations and deletions always find a
//! worker while many snapshots are being cut.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use csi_proto::v1::{CreateSnapshotRequest, DeleteSnapshotRequest, ListSnapshotsRequest};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use sidecar_kit::cluster::client::{api_code, api_message};
use sidecar_kit::cluster::events::{EventType, Recorder};
use sidecar_kit::cluster::journal::{Journal, JournalClient, Location, Owner, Reporting};
use sidecar_kit::driver::csi::{CallOptions, CsiClient, go_error};
use sidecar_kit::pipeline::workqueue::{Backoff, WorkQueue};
use sidecar_kit::pipeline::{Change, Pipeline, Wiring, lock};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::decide::{self, Answer, Plan};
use crate::index::Index;
use crate::journal::{self, Rejected};
use crate::model::{
    self, Class, Content, SecretRef, VolumeGroupSnapshotClass, VolumeGroupSnapshotContent,
    VolumeSnapshotClass, VolumeSnapshotContent,
};

mod groups;
mod intents;
mod kinds;

use kinds::{Groups, Lane, Snapshots};

pub use groups::{GROUP_QUEUE, GroupIntent, GroupNaming, KEY_PREFIX as GROUP_KEY_PREFIX};

/// Reporting component of the Events, followed by the driver name (upstream's
/// `csi-snapshotter <driver>`).
pub const COMPONENT: &str = "csi-snapshotter";
/// The queue's name in the workqueue metrics, as upstream's.
pub const QUEUE: &str = "csi-snapshotter-content";

/// Longest wait for a journal write: it has a request budget of its own, so only an API server
/// that does not answer holds it this long, and failing it only retries the content later.
const JOURNAL_WAIT: Duration = Duration::from_secs(60);

/// How the snapshotter's journal speaks of itself.
pub const OWNER: Owner = Owner {
    sidecar: "the snapshotter",
    risk: "a restart during a CreateSnapshot whose content is deleted meanwhile may then leak a snapshot",
    key_form: journal::is_key,
    key_form_name: "a content name (a group content's after \"G_\")",
};

/// How snapshots are named and what CreateSnapshot is given.
#[derive(Clone, Debug)]
pub struct Naming {
    pub prefix: String,
    pub uuid_length: i32,
    pub extra_create_metadata: bool,
}

/// Everything the controller needs besides its clients.
#[derive(Clone)]
pub struct Config {
    pub driver: String,
    pub naming: Naming,
    /// Timeout of every driver call.
    pub timeout: Duration,
    pub backoff: Backoff,
    pub workers: usize,
    /// Period of the full resync (zero: none).
    pub resync: Duration,
    /// The driver has LIST_SNAPSHOTS; without it a pre-provisioned snapshot counts as ready, as
    /// upstream counts it.
    pub list_snapshots: bool,
    /// `--node-deployment`: only the contents labelled for this node.
    pub node: Option<String>,
    /// Where the intent journal lives (`None`: no journal, upstream's behaviour).
    pub journal: Option<Location>,
    pub snapshot_metrics: Option<SnapshotMetrics>,
    /// VolumeGroupSnapshotContents are handled (gate `CSIVolumeGroupSnapshot` on and a driver
    /// with the group controller service), named so.
    pub groups: Option<GroupNaming>,
    /// The watches and queue metrics, shared with the other controllers of the process.
    pub wiring: Wiring,
}

/// How many driver calls each snapshot took until it was ready.
#[derive(Clone)]
pub struct SnapshotMetrics {
    calls: prometheus::Histogram,
}

impl SnapshotMetrics {
    pub fn register(registry: &prometheus::Registry) -> Result<Self, prometheus::Error> {
        let calls = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "csi_snapshotter_driver_calls_per_snapshot",
                "CreateSnapshot and ListSnapshots calls this process made for a snapshot until the driver said it was ready",
            )
            .buckets(vec![1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0]),
        )?;
        registry.register(Box::new(calls.clone()))?;
        Ok(Self { calls })
    }
}

/// A CreateSnapshot this process asked before its answer was written to the content: what it
/// takes to ask again, or to delete the snapshot if the content is gone meanwhile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intent {
    pub content_uid: String,
    /// The VolumeSnapshot's UID, which [`Intent::name`] is derived from.
    #[serde(default)]
    pub snapshot_uid: String,
    pub name: String,
    pub source_volume: String,
    pub parameters: BTreeMap<String, String>,
    pub secret: Option<SecretRef>,
    /// The content's deletion policy is `Delete`.
    pub delete: bool,
    /// The VolumeSnapshotClass the request was prepared from: once the content is gone, what
    /// the class still gives (parameters, deletion policy) is checked against the record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

impl Intent {
    /// The CreateSnapshot call it stands for.
    fn request(&self, secrets: BTreeMap<String, String>) -> CreateSnapshotRequest {
        CreateSnapshotRequest {
            source_volume_id: self.source_volume.clone(),
            name: self.name.clone(),
            secrets: secrets.into_iter().collect(),
            parameters: self.parameters.clone().into_iter().collect(),
        }
    }
}

/// What the journal holds: a snapshot's intent under its content's name, or a group's under
/// `G_<group content name>` (no object name has an underscore or a capital).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum Recorded {
    Group(GroupIntent),
    Snapshot(Intent),
}

/// Why a step failed; the text is what status, Events and logs say.
#[derive(Debug)]
struct Failure {
    message: String,
    /// Event reason and text, when the failure gets one of its own.
    event: Option<(&'static str, String)>,
    /// Written to the content's `status.error` as well.
    status: bool,
}

impl Failure {
    fn quiet(message: String) -> Self {
        Self {
            message,
            event: None,
            status: false,
        }
    }
}

/// The current time as the API server stores times (RFC 3339, whole seconds).
fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn now_ns() -> i64 {
    i64::try_from(Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX)
}

struct Controller {
    config: Config,
    client: kube::Client,
    contents: Lane<Snapshots>,
    group_contents: Lane<Groups>,
    csi: CsiClient,
    index: Mutex<Index>,
    journal: Journal,
    /// Driver calls per content until ready.
    calls: Mutex<HashMap<String, u32>>,
    polls: Semaphore,
    events: Recorder,
}

/// Runs the snapshotter until `shutdown` is cancelled; then stops taking work, lets the running
/// operations finish, and returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    journal_client: JournalClient,
    csi: CsiClient,
    shutdown: CancellationToken,
) {
    let events = config.wiring.recorder(client.clone());
    let journal = match &config.journal {
        Some(location) => Journal::start(
            journal_client,
            location.clone(),
            OWNER,
            Reporting {
                events: events.clone(),
                metrics: config.wiring.journal_metrics.clone(),
            },
        ),
        None => Journal::off(),
    };
    let controller = Arc::new(Controller {
        contents: Lane::new(
            &client,
            config.wiring.queue(QUEUE, &["default"], config.backoff),
        ),
        group_contents: Lane::new(
            &client,
            config
                .wiring
                .queue(GROUP_QUEUE, &["default"], config.backoff),
        ),
        csi,
        index: Mutex::new(Index::new(&config.driver)),
        journal,
        calls: Mutex::new(HashMap::new()),
        polls: Semaphore::new(config.workers.div_ceil(2)),
        events,
        client,
        config,
    });
    controller.run(shutdown).await;
}

impl Controller {
    fn index(&self) -> MutexGuard<'_, Index> {
        lock(&self.index)
    }

    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.driver, "starting CSI snapshotter");
        let mut pipeline = self.config.wiring.pipeline();
        self.watch::<Snapshots>(&mut pipeline);
        if self.config.groups.is_some() {
            self.watch::<Groups>(&mut pipeline);
        }
        pipeline
            .run(&shutdown, async |pipeline, stop| {
                self.start(pipeline, stop).await
            })
            .await;
        self.journal.flush().await;
        tracing::info!("CSI snapshotter stopped");
    }

    /// Once the caches synced: the journal taken up, then the workers and the resync.
    async fn start(self: &Arc<Self>, pipeline: &mut Pipeline, shutdown: CancellationToken) {
        tracing::info!(contents = self.index().content_count(), "caches synced");
        self.take_up_journal(&shutdown).await;
        self.workers::<Snapshots>(pipeline);
        if self.config.groups.is_some() {
            self.workers::<Groups>(pipeline);
        }
        let me = self.clone();
        pipeline.every(self.config.resync, move || {
            me.resync::<Snapshots>();
            me.resync::<Groups>();
        });
    }

    /// Carries out the plan; `Ok(true)` when the content needs nothing more for now.
    async fn step(&self, content: &Content, class: Option<&Class>) -> Result<bool, Failure> {
        let plan = decide::plan(content, self.config.list_snapshots);
        tracing::debug!(content = %content.name, ?plan, "syncing content");
        let operation = match &plan {
            Plan::Delete { .. } => Some("delete snapshot"),
            Plan::Create => Some("create snapshot"),
            Plan::Check { .. } => Some("check snapshot"),
            Plan::Ready => Some("snapshot ready"),
            Plan::Nothing => None,
        };
        if let Some(operation) = operation {
            let snapshot = &content.snapshot_ref;
            sidecar_kit::telemetry::operation::describe(
                operation,
                &[
                    ("k8s.volumesnapshotcontent.name", &content.name),
                    ("k8s.namespace.name", &snapshot.namespace),
                    ("k8s.volumesnapshot.name", &snapshot.name),
                    ("k8s.volumesnapshot.uid", &snapshot.uid),
                ],
            );
        }
        let outcome = match plan {
            Plan::Delete { handle } => self.delete(content, handle).await.map(|()| true),
            Plan::Create => self.create(content, class).await,
            Plan::Check { handle } => self.check(content, class, &handle).await,
            Plan::Ready => self
                .remove_being_created::<Snapshots>(content)
                .await
                .map(|_| true),
            Plan::Nothing => Ok(true),
        };
        match outcome {
            Err(failure) => {
                self.report::<Snapshots>(content, &failure).await;
                Err(failure)
            }
            ok => ok,
        }
    }

    // --- writes ---

    async fn secret(
        &self,
        reference: Option<&SecretRef>,
    ) -> Result<BTreeMap<String, String>, String> {
        match reference {
            None => Ok(BTreeMap::new()),
            Some(r) => {
                sidecar_kit::cluster::client::fetch_secret(&self.client, &r.namespace, &r.name)
                    .await
            }
        }
    }

    fn options(&self) -> CallOptions {
        CallOptions::timeout(self.config.timeout)
    }

    fn count_call(&self, name: &str) {
        *lock(&self.calls).entry(name.to_string()).or_default() += 1;
    }

    fn ready_after_calls(&self, name: &str) {
        if let Some(calls) = lock(&self.calls).remove(name)
            && let Some(metrics) = &self.config.snapshot_metrics
        {
            metrics.calls.observe(f64::from(calls));
        }
    }

    // --- creation and readiness ---

    /// CreateSnapshot, for a new content or to learn whether its snapshot is ready.
    async fn create(&self, content: &Content, class: Option<&Class>) -> Result<bool, Failure> {
        let first = content.status.is_none();
        let (reason, prefix) = if first {
            (decide::CREATION_FAILED, "Failed to create snapshot")
        } else {
            (
                decide::CHECK_FAILED,
                "Failed to check and update snapshot content",
            )
        };
        let fail = |message: String| Failure {
            event: Some((reason, format!("{prefix}: {message}"))),
            message,
            status: true,
        };
        let _slot = if first {
            None
        } else {
            Some(self.poll_slot().await)
        };
        let input = self.create_input(content, class).map_err(|e| {
            fail(format!(
                "failed to get input parameters to create snapshot for content {}: {e:?}",
                content.name
            ))
        })?;
        let (intent, secret_ref) = input;
        let secrets = self.secret(secret_ref.as_ref()).await.map_err(|err| {
            tracing::error!(content = %content.name, error = %err, "Failed to get credentials for snapshot");
            let cause = format!("cannot get credentials for snapshot content {:?}", content.name);
            fail(format!(
                "failed to get input parameters to create snapshot for content {}: {cause:?}",
                content.name
            ))
        })?;
        let content = if content.being_created {
            content.clone()
        } else {
            let patch =
                serde_json::json!({"metadata": {"annotations": {model::BEING_CREATED: "yes"}}});
            self.patch_metadata::<Snapshots, _>(&content.name, &Patch::Merge(&patch))
                .await
                .map_err(|err| {
                    let cause = format!(
                        "snapshot controller failed to update {} on API server: {}",
                        content.name,
                        api_message(&err)
                    );
                    fail(format!(
                        "failed to add VolumeSnapshotBeingCreated annotation on the content {}: {cause:?}",
                        content.name
                    ))
                })?
        };
        // Until the content names the snapshot, only the journal knows it may exist. Once it
        // does (a poll of a cut snapshot), the content's finalizer keeps it.
        if content.handle().is_none() {
            self.record::<Snapshots>(&content.name, &intent)
                .await
                .map_err(fail)?;
        }
        let request = intent.request(secrets);
        self.count_call(&content.name);
        let answer = match self.csi.create_snapshot(request, self.options()).await {
            Ok(response) => response
                .snapshot
                .map(answer_of)
                .ok_or_else(|| Status::internal("CreateSnapshot answered without a snapshot")),
            Err(status) => Err(status),
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => {
                tracing::info!(content = %content.name, error = %go_error(&status), "CreateSnapshot failed");
                if decide::is_final(Some(status.code())) {
                    // Nothing is being cut: the content may be deleted, the intent is done.
                    self.remove_being_created::<Snapshots>(&content).await?;
                    self.forget::<Snapshots>(&content.name);
                }
                return Err(fail(format!(
                    "failed to take snapshot of the volume {}: {:?}",
                    intent.source_volume,
                    go_error(&status)
                )));
            }
        };
        tracing::debug!(content = %content.name, handle = %answer.handle, ready = answer.ready, "CreateSnapshot answered");
        let updated = match decide::status_patch(content.status.as_ref(), &answer, now_ns()) {
            None => content.clone(),
            Some(patch) => match self.patch_status::<Snapshots>(&content.name, &patch).await {
                Ok(updated) => updated,
                Err(err) if api_code(&err) == Some(404) => {
                    // The content went away while the driver cut the snapshot: nothing will
                    // ever name it.
                    self.discard::<Snapshots>(&content.name, &intent, &answer.handle)
                        .await?;
                    return Ok(true);
                }
                Err(err) => {
                    return Err(fail(format!(
                        "error updating status for volume snapshot content {}: snapshot controller failed to update {} on API server: {}",
                        content.name,
                        content.name,
                        api_message(&err)
                    )));
                }
            },
        };
        self.forget::<Snapshots>(&content.name);
        self.remove_being_created::<Snapshots>(&updated).await?;
        if answer.ready {
            self.ready_after_calls(&content.name);
        }
        Ok(answer.ready)
    }

    /// The request of a CreateSnapshot for `content`, and where its secret is.
    fn create_input(
        &self,
        content: &Content,
        class: Option<&Class>,
    ) -> Result<(Intent, Option<SecretRef>), String> {
        let class = match (&content.class, class) {
            (None, _) => {
                return Err(format!(
                    "failed to take snapshot {} without a snapshot class",
                    content.name
                ));
            }
            (Some(name), None) => {
                return Err(format!(
                    "volumesnapshotclass.snapshot.storage.k8s.io {name:?} not found"
                ));
            }
            (Some(_), Some(class)) => class,
        };
        let secret = decide::content_secret(content)?;
        let mut parameters = decide::driver_parameters(&class.parameters)
            .map_err(|e| format!("failed to remove CSI Parameters of prefixed keys: {e}"))?;
        let naming = &self.config.naming;
        if naming.extra_create_metadata {
            parameters.insert(
                decide::SNAPSHOT_NAME_KEY.into(),
                content.snapshot_ref.name.to_string(),
            );
            parameters.insert(
                decide::SNAPSHOT_NAMESPACE_KEY.into(),
                content.snapshot_ref.namespace.to_string(),
            );
            parameters.insert(decide::CONTENT_NAME_KEY.into(), content.name.to_string());
        }
        if content.snapshot_ref.uid.is_empty() {
            return Err(format!(
                "cannot create snapshot. Snapshot content {} not bound to a snapshot",
                content.name
            ));
        }
        let Some(source_volume) = content.volume_handle.as_deref().map(String::from) else {
            return Err(format!(
                "cannot create snapshot. Volume handle not found in snapshot content {}",
                content.name
            ));
        };
        let name = decide::snapshot_name(
            &naming.prefix,
            &content.snapshot_ref.uid,
            naming.uuid_length,
        )?;
        Ok((
            Intent {
                content_uid: content.uid.to_string(),
                snapshot_uid: content.snapshot_ref.uid.to_string(),
                name,
                source_volume,
                parameters,
                secret: secret.clone(),
                delete: content.deletion_policy == "Delete",
                class: Some(class.name.clone()),
            },
            secret,
        ))
    }

    /// ListSnapshots of a pre-provisioned snapshot or a group member's.
    async fn check(
        &self,
        content: &Content,
        class: Option<&Class>,
        handle: &str,
    ) -> Result<bool, Failure> {
        let fail = |message: String| Failure {
            event: Some((
                decide::CHECK_FAILED,
                format!("Failed to check and update snapshot content: {message}"),
            )),
            message,
            status: true,
        };
        let _slot = self.poll_slot().await;
        let member = content
            .status
            .as_ref()
            .is_some_and(|s| s.volume_group_snapshot_handle.is_some());
        let mut secret_ref = None;
        if let Some(class_name) = &content.class {
            let Some(class) = class else {
                return Err(fail(format!(
                    "failed to get snapshot class {class_name} for snapshot content {}: volumesnapshotclass.snapshot.storage.k8s.io {class_name:?} not found",
                    content.name
                )));
            };
            secret_ref = decide::list_secret(&class.parameters, &content.name).map_err(|e| {
                fail(format!(
                    "failed to get secret reference for snapshot content {}: {e}",
                    content.name
                ))
            })?;
        }
        if member {
            secret_ref = decide::content_secret(content).map_err(|e| {
                fail(format!(
                    "failed to get credentials from annotation for snapshot content {}: {e}",
                    content.name
                ))
            })?;
        }
        let secrets = self.secret(secret_ref.as_ref()).await.map_err(|e| {
            fail(format!(
                "failed to get credentials for snapshot content {}: {e}",
                content.name
            ))
        })?;
        let answer = if self.config.list_snapshots {
            self.count_call(&content.name);
            let request = ListSnapshotsRequest {
                snapshot_id: handle.to_string(),
                secrets: secrets.into_iter().collect(),
                ..Default::default()
            };
            let listed = self
                .csi
                .list_snapshots(request, self.options())
                .await
                .map_err(|status| {
                    fail(format!(
                        "failed to list snapshot for content {}: {:?}",
                        content.name,
                        go_error(&status)
                    ))
                })?;
            listed
                .entries
                .into_iter()
                .find_map(|e| e.snapshot)
                .map(answer_of)
                .ok_or_else(|| {
                    let cause = format!("can not find snapshot for snapshotID {handle}");
                    fail(format!(
                        "failed to list snapshot for content {}: {cause:?}",
                        content.name
                    ))
                })?
        } else {
            Answer {
                handle: handle.to_string(),
                ready: true,
                creation_ns: 0,
                size: 0,
                group_handle: String::new(),
            }
        };
        let answer = Answer {
            handle: handle.to_string(),
            ..answer
        };
        if let Some(patch) = decide::status_patch(content.status.as_ref(), &answer, now_ns()) {
            self.patch_status::<Snapshots>(&content.name, &patch)
                .await
                .map_err(|err| {
                    fail(format!(
                        "snapshot controller failed to update {} on API server: {}",
                        content.name,
                        api_message(&err)
                    ))
                })?;
        }
        if answer.ready {
            self.ready_after_calls(&content.name);
        }
        Ok(answer.ready)
    }

    async fn poll_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        // The semaphore is never closed: a failure to acquire only means no limit.
        self.polls.acquire().await.ok()
    }

    // --- deletion ---

    async fn delete(&self, content: &Content, handle: Option<String>) -> Result<(), Failure> {
        let error =
            |message: String, event: &str| Failure::deleting(decide::DELETE_ERROR, message, event);
        let mut content = content.clone();
        if let Some(handle) = handle {
            let secret_ref = decide::content_secret(&content)
                .map_err(|e| error(e, "Failed to get snapshot credentials"))?;
            let secrets = self.secret(secret_ref.as_ref()).await.map_err(|e| {
                error(
                    format!(
                        "failed to get input parameters to delete snapshot for content {}: {e:?}",
                        content.name
                    ),
                    "Failed to get snapshot credentials",
                )
            })?;
            let request = DeleteSnapshotRequest {
                snapshot_id: handle.clone(),
                secrets: secrets.into_iter().collect(),
            };
            self.csi
                .delete_snapshot(request, self.options())
                .await
                .map_err(|status| {
                    error(
                        format!(
                            "failed to delete snapshot {:?}, err: failed to delete snapshot content {}: {:?}",
                            content.name,
                            content.name,
                            go_error(&status)
                        ),
                        "Failed to delete snapshot",
                    )
                })?;
            tracing::info!(content = %content.name, %handle, "snapshot deleted");
            content = self
                .clear_status::<Snapshots>(&content.name, &decide::cleared_status_patch())
                .await?;
        }
        if let Some(patch) = decide::finalizer_removal(&content) {
            self.remove_finalizer::<Snapshots>(&content.name, patch)
                .await?;
            tracing::debug!(content = %content.name, "removed the protection finalizer");
        }
        self.events.forget_object(&content.uid);
        lock(&self.calls).remove(&*content.name);
        Ok(())
    }
}

fn answer_of(snapshot: csi_proto::v1::Snapshot) -> Answer {
    let creation_ns = snapshot.creation_time.map_or(0, |t| {
        t.seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos))
    });
    Answer {
        handle: snapshot.snapshot_id,
        ready: snapshot.ready_to_use,
        creation_ns,
        size: snapshot.size_bytes,
        group_handle: snapshot.group_snapshot_id,
    }
}
