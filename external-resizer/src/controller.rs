//! The I/O edges: watches feeding the index, workers carrying out the plans of
//! [`decide`](crate::decide) against the API server and the driver, and the periodic resync.
//!
//! One queue and one worker per claim at a time for both the expansion and the
//! VolumeAttributesClass change: the two never write the same claim at once, so neither loses
//! a write to the other's conflict (upstream runs them in two controllers that do, #458).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::{
    ControllerExpandVolumeRequest, ControllerModifyVolumeRequest, VolumeCapability,
    volume_capability,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use sidecar_kit::cluster::client::{api_code, api_message};
use sidecar_kit::cluster::events::{EventType, Recorder};
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::pipeline::workqueue::{Backoff, WorkQueue};
use sidecar_kit::pipeline::{Fed, Feeder, Pipeline, Wiring, lock};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::decide::{self, ErrorClass, Memory, ModifyPlan, Policy, ResizePlan};
use crate::index::{Index, View};
use crate::model::{Claim, NEEDS, Pv, SecretRef, Size};

/// Reporting component of the Events, followed by the driver name (upstream's
/// `external-resizer <driver>`).
pub const COMPONENT: &str = "external-resizer";

/// Everything the controller needs besides its clients.
#[derive(Clone)]
pub struct Config {
    pub policy: Policy,
    /// Timeout of ControllerExpandVolume and ControllerModifyVolume.
    pub timeout: Duration,
    pub backoff: Backoff,
    pub workers: usize,
    /// Period of the full resync (zero: none).
    pub resync: Duration,
    /// `--handle-volume-inuse-error`: watch which claims running pods mount.
    pub handle_in_use: bool,
    /// The driver implements ControllerModifyVolume and the VolumeAttributesClass gate is on.
    pub modify: bool,
    /// `--extra-modify-metadata`.
    pub extra_modify_metadata: bool,
    /// The driver has SINGLE_NODE_MULTI_WRITER (access modes in expansion requests).
    pub single_node_multi_writer: bool,
    /// The watches and queue metrics, shared with the other controllers of the process.
    pub wiring: Wiring,
}

/// The queue name, as upstream's (`<driver>-pvc`), in the workqueue metrics.
pub fn queue_name(driver: &str) -> String {
    format!("{driver}-pvc")
}

/// Why a step failed; the text is what Events and logs say.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("PV {pv:?} bound to pvc {claim:?} not found")]
    PvMissing { pv: String, claim: String },
    #[error("marking pvc {claim:?} as resizing failed: {message}")]
    Mark {
        claim: String,
        message: String,
        conflict: bool,
    },
    #[error(
        "Unable to expand {claim} because CSI driver {driver} only supports offline expansion and volume is currently in-use"
    )]
    InUse { claim: String, driver: String },
    #[error("resize volume {pv:?} by resizer {driver:?} failed: {message}")]
    Resize {
        pv: String,
        driver: String,
        message: String,
    },
    #[error("{0}")]
    Status(String),
    #[error("VAC {0:?} does not exist.")]
    ClassMissing(String),
    #[error("{0}")]
    Modify(String),
}

impl Failure {
    fn conflict(&self) -> bool {
        matches!(self, Self::Mark { conflict: true, .. })
    }
}

/// What a step leaves to do.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    Done,
    After(Duration),
}

/// The per-claim memory of past attempts, which the objects do not show.
#[derive(Debug, Default)]
struct Memo {
    final_error: bool,
    slow_until: Option<Instant>,
    modify_uncertain: bool,
    modify_slow_until: Option<Instant>,
}

fn remaining(until: Option<Instant>) -> Option<Duration> {
    let left = until?.checked_duration_since(Instant::now())?;
    (!left.is_zero()).then_some(left)
}

struct Controller {
    config: Config,
    client: kube::Client,
    pvs: Api<PersistentVolume>,
    csi: CsiClient,
    feed: Feeder<Index>,
    queue: WorkQueue<Arc<str>>,
    memos: Mutex<HashMap<String, Memo>>,
    events: Recorder,
}

/// Runs the resizer until `shutdown` is cancelled; then stops taking work, lets the running
/// operations finish, and returns.
pub async fn run(
    config: Config,
    client: kube::Client,
    csi: CsiClient,
    shutdown: CancellationToken,
) {
    let queue = config.wiring.queue(
        queue_name(&config.policy.driver),
        &["default"],
        config.backoff,
    );
    let controller = Arc::new(Controller {
        pvs: Api::all(client.clone()),
        csi,
        feed: Feeder::new(
            Index::new(&config.policy.driver, config.policy.recover),
            client.clone(),
            NEEDS,
        ),
        queue,
        memos: Mutex::new(HashMap::new()),
        events: config.wiring.recorder(client.clone()),
        client,
        config,
    });
    controller.run(shutdown).await;
}

/// The current time as the API server stores condition times (RFC 3339, whole seconds).
fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl Fed for Controller {
    type Index = Index;
    type Work = Arc<str>;

    fn feeder(&self) -> &Feeder<Index> {
        &self.feed
    }

    fn route(&self, key: Arc<str>) {
        self.queue.add(key, 0);
    }
}

impl Controller {
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        tracing::info!(driver = %self.config.policy.driver, "starting CSI resizer");
        let mut pipeline = self.config.wiring.pipeline();
        pipeline.feed_view(&self, Index::claim_event);
        pipeline.feed_view(&self, Index::pv_event);
        if self.config.handle_in_use {
            pipeline.feed(&self, Index::pod_event);
        }
        if self.config.modify {
            pipeline.feed(&self, Index::class_event);
        }
        pipeline
            .run(&shutdown, async |pipeline, _| self.start(pipeline))
            .await;
        tracing::info!("CSI resizer stopped");
    }

    /// Once the caches synced: the workers and the resync.
    fn start(self: &Arc<Self>, pipeline: &mut Pipeline) {
        {
            let index = self.index();
            tracing::info!(
                claims = index.claim_count(),
                persistent_volumes = index.pv_count(),
                pods_with_claims = index.pod_count(),
                "caches synced"
            );
        }
        let me = self.clone();
        pipeline.workers(&self.queue, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.sync(&item.key).await }
        });
        pipeline.resync(self, self.config.resync, Index::claim_keys);
    }

    fn memo<T>(&self, key: &str, f: impl FnOnce(&mut Memo) -> T) -> T {
        let mut memos = lock(&self.memos);
        let result = f(memos.entry(key.to_string()).or_default());
        if memos.get(key).is_some_and(|m| {
            !m.final_error
                && m.slow_until.is_none()
                && !m.modify_uncertain
                && m.modify_slow_until.is_none()
        }) {
            memos.remove(key);
        }
        result
    }

    /// One claim: its expansion, then its class change; retried with backoff if either failed.
    async fn sync(&self, key: &str) {
        let Some(view) = self.index().view(key) else {
            tracing::debug!(claim = key, "claim is gone");
            lock(&self.memos).remove(key);
            self.queue.forget(key);
            return;
        };
        let resized = self.resize(key, &view).await;
        // The class change starts from what the expansion wrote.
        let view = self.index().view(key).unwrap_or(view);
        let modified = if self.config.modify {
            self.modify(key, &view).await
        } else {
            Ok(Next::Done)
        };
        let mut after: Option<Duration> = None;
        let mut failed = false;
        for result in [resized, modified] {
            match result {
                Ok(Next::Done) => {}
                Ok(Next::After(delay)) => after = Some(after.map_or(delay, |a| a.min(delay))),
                Err(failure) => {
                    failed = true;
                    tracing::info!(claim = key, error = %failure, "claim not done");
                }
            }
        }
        let key: Arc<str> = key.into();
        if failed {
            let delay = self.queue.add_rate_limited(key.clone(), 0);
            tracing::debug!(claim = %key, retry_in = ?delay, "retrying");
        } else {
            self.queue.forget(&key);
            if let Some(delay) = after {
                self.queue.add_after(key, 0, delay);
            }
        }
    }

    fn event(&self, claim: &Claim, kind: EventType, reason: &str, message: &str) {
        self.events
            .record(claim.object_ref(), kind, reason, message);
    }

    /// A strategic merge patch of the claim's status subresource; the written claim goes into
    /// the index.
    async fn patch_claim(
        &self,
        claim: &Claim,
        patch: &serde_json::Value,
    ) -> Result<Claim, kube::Error> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let written = api
            .patch_status(
                &claim.name,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await?;
        self.index().store_claim(&written);
        Ok(Claim::from_api(&written))
    }

    async fn patch_pv(&self, name: &str, patch: &serde_json::Value) -> Result<(), kube::Error> {
        let written = self
            .pvs
            .patch(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await?;
        self.index().store_pv(&written);
        Ok(())
    }

    async fn secrets(
        &self,
        reference: Option<&SecretRef>,
    ) -> Result<BTreeMap<String, String>, String> {
        let Some(reference) = reference else {
            return Ok(BTreeMap::new());
        };
        sidecar_kit::cluster::client::fetch_secret(
            &self.client,
            &reference.namespace,
            &reference.name,
        )
        .await
    }

    // --- expansion ---

    async fn resize(&self, key: &str, view: &View) -> Result<Next, Failure> {
        let claim = &view.claim;
        let Some(pv) = &view.pv else {
            return match &claim.volume_name {
                Some(pv) if decide::needs_resize(claim) => Err(Failure::PvMissing {
                    pv: pv.clone(),
                    claim: key.to_string(),
                }),
                _ => Ok(Next::Done),
            };
        };
        let policy = &self.config.policy;
        if let Some(patch) = decide::pre_resize_annotation_removal(policy, claim, pv)
            && let Err(err) = self.patch_pv(&pv.name, &patch).await
        {
            return Err(Failure::Status(format!(
                "failed removing annotation {} from pv {:?}: {}",
                crate::model::PRE_RESIZE_CAPACITY_ANNOTATION,
                pv.name,
                api_message(&err)
            )));
        }
        let memory = self.memo(key, |m| Memory {
            final_error: m.final_error,
            slow_retry: remaining(m.slow_until),
        });
        let (size, mark) = match decide::plan_resize(policy, claim, pv, memory, &now()) {
            ResizePlan::Nothing => return Ok(Next::Done),
            ResizePlan::Wait(delay) => {
                tracing::debug!(
                    claim = key,
                    ?delay,
                    "expansion was infeasible; waiting before the same size again"
                );
                return Ok(Next::After(delay));
            }
            ResizePlan::Expand { size, mark } => (size, mark),
        };
        describe("expand", claim, &pv.name);
        let claim = match mark {
            Some(patch) => self
                .patch_claim(claim, &patch)
                .await
                .map_err(|err| Failure::Mark {
                    claim: key.to_string(),
                    message: api_message(&err),
                    conflict: api_code(&err) == Some(409),
                })?,
            None => claim.clone(),
        };
        if self.config.handle_in_use && self.index().blocked_by_pods(key) {
            let failure = Failure::InUse {
                claim: key.to_string(),
                driver: policy.driver.clone(),
            };
            self.event(
                &claim,
                EventType::Warning,
                "VolumeResizeFailed",
                &failure.to_string(),
            );
            return Err(failure);
        }
        self.event(
            &claim,
            EventType::Normal,
            "Resizing",
            &format!("External resizer is resizing volume {}", pv.name),
        );
        self.index().set_in_use_refusal(key, false);
        let result = self.expand(key, &claim, pv, &size).await;
        if let Err(failure) = &result
            && !failure.conflict()
        {
            self.event(
                &claim,
                EventType::Warning,
                "VolumeResizeFailed",
                &failure.to_string(),
            );
        }
        result
    }

    /// The driver call and what follows it.
    async fn expand(
        &self,
        key: &str,
        claim: &Claim,
        pv: &Pv,
        size: &Size,
    ) -> Result<Next, Failure> {
        let policy = &self.config.policy;
        let failed = |message: String| Failure::Resize {
            pv: pv.name.clone(),
            driver: policy.driver.clone(),
            message,
        };
        let (reported, node_step) = if policy.controller_expansion {
            match self.call_expand(pv, size).await {
                Ok(answer) => answer,
                Err(Ok(status)) => {
                    let message = sidecar_kit::driver::csi::go_error(&status);
                    self.expansion_failed(key, claim, status.code(), &message)
                        .await
                        .map_err(|e| {
                            failed(format!("{message}; recording it in the claim failed: {e}"))
                        })?;
                    return Err(failed(message));
                }
                Err(Err(message)) => return Err(failed(message)),
            }
        } else {
            (size.clone(), true)
        };
        self.memo(key, |m| {
            m.final_error = false;
            m.slow_until = None;
        });
        if let Some(patch) = decide::pv_capacity_patch(policy, pv, claim, &reported, node_step) {
            self.patch_pv(&pv.name, &patch).await.map_err(|err| {
                Failure::Status(format!(
                    "error updating pv {:?} by resizer: updating capacity of PV {:?} to {} failed: {}",
                    pv.name,
                    pv.name,
                    reported.text,
                    api_message(&err)
                ))
            })?;
        }
        if node_step {
            let patch = decide::mark_node_pending(policy, claim, &now());
            self.patch_claim(claim, &patch)
                .await
                .map_err(|err| Failure::Mark {
                    claim: key.to_string(),
                    message: format!(
                        "mark PVC as node expansion required failed: {}",
                        api_message(&err)
                    ),
                    conflict: api_code(&err) == Some(409),
                })?;
            self.event(
                claim,
                EventType::Normal,
                "FileSystemResizeRequired",
                "Require file system resize of volume on node",
            );
        } else {
            let patch = decide::mark_finished(policy, claim, &reported);
            self.patch_claim(claim, &patch)
                .await
                .map_err(|err| Failure::Mark {
                    claim: key.to_string(),
                    message: format!("mark PVC as resize finished failed: {}", api_message(&err)),
                    conflict: api_code(&err) == Some(409),
                })?;
            self.event(
                claim,
                EventType::Normal,
                "VolumeResizeSuccessful",
                "Resize volume succeeded",
            );
        }
        tracing::info!(claim = key, pv = %pv.name, size = %reported.text, node_step, "volume expanded");
        Ok(Next::Done)
    }

    /// Records a refused expansion: in the memory (final errors allow another size, infeasible
    /// ones wait) and in the claim.
    async fn expansion_failed(
        &self,
        key: &str,
        claim: &Claim,
        code: Code,
        message: &str,
    ) -> Result<(), String> {
        let class = decide::classify(code);
        if code == Code::FailedPrecondition && self.config.handle_in_use {
            self.index().set_in_use_refusal(key, true);
        }
        let slow = self.config.backoff.max;
        self.memo(key, |m| match class {
            ErrorClass::InProgress => {
                m.final_error = false;
                m.slow_until = None;
            }
            ErrorClass::Final => {
                m.final_error = true;
                m.slow_until = None;
            }
            ErrorClass::Infeasible => {
                m.final_error = true;
                m.slow_until = Some(Instant::now() + slow);
            }
        });
        if !self.config.policy.recover {
            return Ok(());
        }
        match decide::mark_failed(claim, class, message, &now()) {
            Some(patch) => self
                .patch_claim(claim, &patch)
                .await
                .map(drop)
                .map_err(|e| api_message(&e)),
            None => Ok(()),
        }
    }

    /// ControllerExpandVolume: `Err(Ok(status))` when the driver answered with an error,
    /// `Err(Err(message))` when the request could not be made.
    async fn call_expand(
        &self,
        pv: &Pv,
        size: &Size,
    ) -> Result<(Size, bool), Result<Status, String>> {
        if let Some(error) = &pv.translation_error {
            return Err(Err(format!(
                "failed to translate persistent volume: {error}"
            )));
        }
        if pv.volume_handle.is_empty() {
            return Err(Err("empty volume handle".to_string()));
        }
        let secrets = self
            .secrets(pv.expand_secret.as_deref())
            .await
            .map_err(Err)?;
        let capability =
            volume_capability(pv, self.config.single_node_multi_writer).map_err(|e| {
                Err(format!(
                    "failed to get capabilities of volume {} with {e}",
                    pv.name
                ))
            })?;
        let required_bytes = i64::try_from(size.bytes).unwrap_or(i64::MAX);
        let request = ControllerExpandVolumeRequest {
            volume_id: pv.volume_handle.clone(),
            capacity_range: Some(csi_proto::v1::CapacityRange {
                required_bytes,
                limit_bytes: 0,
            }),
            secrets: secrets.into_iter().collect(),
            volume_capability: Some(capability),
        };
        let options = CallOptions {
            timeout: Some(self.config.timeout),
            migrated: pv.in_tree,
        };
        let answer = self
            .csi
            .controller_expand_volume(request, options)
            .await
            .map_err(Ok)?;
        if answer.capacity_bytes <= 0 {
            tracing::warn!(pv = %pv.name, "the driver reported no capacity after the expansion; recording the size asked for");
        }
        Ok((
            decide::reported_size(answer.capacity_bytes, size),
            answer.node_expansion_required,
        ))
    }

    // --- VolumeAttributesClass ---

    async fn modify(&self, key: &str, view: &View) -> Result<Next, Failure> {
        let Some(pv) = &view.pv else {
            return Ok(Next::Done);
        };
        let claim = &view.claim;
        let (uncertain, slow) = self.memo(key, |m| {
            let same_target = claim.modify_status.as_ref().is_some_and(|s| {
                s.target.is_some() && s.target.as_deref() == claim.class.as_deref()
            });
            if !same_target {
                m.modify_slow_until = None;
            }
            (m.modify_uncertain, remaining(m.modify_slow_until))
        });
        let driver = &self.config.policy.driver;
        match decide::plan_modify(claim, pv, driver, uncertain, slow, &now()) {
            ModifyPlan::Nothing => Ok(Next::Done),
            ModifyPlan::Wait(delay) => Ok(Next::After(delay)),
            ModifyPlan::RollBack(patch) => {
                describe("cancel class change", claim, &pv.name);
                self.event(
                    claim,
                    EventType::Normal,
                    "VolumeModifyCanceled",
                    "Cancelled modify.",
                );
                self.patch_claim(claim, &patch)
                    .await
                    .map(|_| Next::Done)
                    .map_err(|err| Failure::Modify(api_message(&err)))
            }
            ModifyPlan::Modify {
                target,
                mark,
                fresh,
            } => {
                describe("change class", claim, &pv.name);
                self.modify_to(key, claim, pv, &target, mark, fresh).await
            }
        }
    }

    async fn modify_to(
        &self,
        key: &str,
        claim: &Claim,
        pv: &Pv,
        target: &str,
        mark: Option<serde_json::Value>,
        fresh: bool,
    ) -> Result<Next, Failure> {
        let driver = &self.config.policy.driver;
        let Some(class) = self.index().class(target) else {
            let failure = Failure::ClassMissing(target.to_string());
            self.event(
                claim,
                EventType::Warning,
                "VolumeModifyFailed",
                &failure.to_string(),
            );
            if fresh {
                let patch = decide::modify_status_patch(claim, "Pending", None, None, &now());
                self.patch_claim(claim, &patch)
                    .await
                    .map_err(|e| Failure::Modify(api_message(&e)))?;
            }
            return Err(failure);
        };
        if !class.driver.is_empty() && class.driver != *driver {
            // Upstream hands the parameters to the driver anyway; they are another driver's.
            let message = format!(
                "VolumeAttributesClass {target:?} is for driver {:?}, not {driver:?}",
                class.driver
            );
            let patch = decide::modify_status_patch(
                claim,
                "Infeasible",
                Some(target),
                Some((Code::InvalidArgument, &message)),
                &now(),
            );
            self.patch_claim(claim, &patch)
                .await
                .map_err(|e| Failure::Modify(api_message(&e)))?;
            let slow = self.config.backoff.max;
            self.memo(key, |m| m.modify_slow_until = Some(Instant::now() + slow));
            self.event(claim, EventType::Warning, "VolumeModifyFailed", &message);
            return Err(Failure::Modify(message));
        }
        let claim = match mark {
            Some(patch) => {
                let written = self.patch_claim(claim, &patch).await.map_err(|e| {
                    Failure::Modify(format!(
                        "mark PVC {:?} as modify volume failed, errored with: {}",
                        claim.name,
                        api_message(&e)
                    ))
                })?;
                self.event(
                    &written,
                    EventType::Normal,
                    "VolumeModify",
                    &format!(
                        "external resizer is modifying volume {} with vac {target}",
                        claim.name
                    ),
                );
                written
            }
            None => claim.clone(),
        };
        let mut parameters = class.parameters.clone();
        if self.config.extra_modify_metadata {
            parameters.insert(decide::PVC_NAME_KEY.into(), claim.name.clone());
            parameters.insert(
                decide::PVC_NAMESPACE_KEY.into(),
                claim.namespace.to_string(),
            );
            parameters.insert(decide::PV_NAME_KEY.into(), pv.name.clone());
        }
        let secrets = self
            .secrets(pv.modify_secret.as_deref().or(pv.expand_secret.as_deref()))
            .await
            .map_err(Failure::Modify)?;
        let request = ControllerModifyVolumeRequest {
            volume_id: pv.volume_handle.clone(),
            secrets: secrets.into_iter().collect(),
            mutable_parameters: parameters.into_iter().collect(),
        };
        let answer = self
            .csi
            .controller_modify_volume(request, CallOptions::timeout(self.config.timeout))
            .await;
        match answer {
            Ok(_) => {
                self.memo(key, |m| {
                    m.modify_uncertain = false;
                    m.modify_slow_until = None;
                });
                let pv_patch = serde_json::json!({"spec": {"volumeAttributesClassName": target}});
                self.patch_pv(&pv.name, &pv_patch).await.map_err(|e| {
                    Failure::Modify(format!("update pv.Spec.VolumeAttributesClassName for PVC {:?} failed, errored with: {}", claim.name, api_message(&e)))
                })?;
                self.patch_claim(&claim, &decide::modify_done_patch(&claim, target))
                    .await
                    .map_err(|e| {
                        Failure::Modify(format!(
                            "mark PVC {:?} as ModifyVolumeCompleted failed, errored with: {}",
                            claim.name,
                            api_message(&e)
                        ))
                    })?;
                self.event(
                    &claim,
                    EventType::Normal,
                    "VolumeModifySuccessful",
                    &format!(
                        "external resizer modified volume {} with vac {target} successfully",
                        claim.name
                    ),
                );
                tracing::info!(claim = key, class = target, "volume modified");
                Ok(Next::Done)
            }
            Err(status) => {
                let code = status.code();
                let mut message = sidecar_kit::driver::csi::go_error(&status);
                let state = if decide::classify(code) == ErrorClass::InProgress {
                    message.push_str(&format!(". Still modifying to VAC {target}"));
                    self.memo(key, |m| m.modify_uncertain = true);
                    "InProgress"
                } else {
                    self.memo(key, |m| m.modify_uncertain = false);
                    decide::modify_failure_state(code)
                };
                let patch = decide::modify_status_patch(
                    &claim,
                    state,
                    None,
                    Some((code, status.message())),
                    &now(),
                );
                self.patch_claim(&claim, &patch).await.map_err(|e| {
                    Failure::Modify(format!(
                        "mark PVC {:?} as modify volume failed, errored with: {}",
                        claim.name,
                        api_message(&e)
                    ))
                })?;
                if state == "Infeasible" {
                    let slow = self.config.backoff.max;
                    self.memo(key, |m| m.modify_slow_until = Some(Instant::now() + slow));
                }
                self.event(&claim, EventType::Warning, "VolumeModifyFailed", &message);
                Err(Failure::Modify(message))
            }
        }
    }
}

/// The capability of an expansion request: block or mount (file system type, mount options)
/// with the access mode of the PV's modes.
fn volume_capability(pv: &Pv, single_node_multi_writer: bool) -> Result<VolumeCapability, String> {
    let access_type = if pv.block {
        volume_capability::AccessType::Block(volume_capability::BlockVolume {})
    } else {
        volume_capability::AccessType::Mount(volume_capability::MountVolume {
            fs_type: pv.fs_type.to_string(),
            mount_flags: pv.mount_options.clone(),
            volume_mount_group: String::new(),
        })
    };
    let mode =
        sidecar_kit::values::accessmodes::to_csi(&pv.access_modes, single_node_multi_writer)?;
    Ok(VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    })
}

/// Names the current pass's operation on `claim` and its volume `pv`, for its trace.
fn describe(operation: &str, claim: &Claim, pv: &str) {
    sidecar_kit::telemetry::operation::describe(
        operation,
        &[
            ("k8s.namespace.name", &claim.namespace),
            ("k8s.pvc.name", &claim.name),
            ("k8s.pvc.uid", &claim.uid),
            ("k8s.pv.name", pv),
        ],
    );
}
