//! VolumeGroupSnapshotContents: CreateVolumeGroupSnapshot for a new group content,
//! GetVolumeGroupSnapshot until the group is ready (with the content's backoff, where upstream
//! cuts the group again or stops asking), DeleteVolumeGroupSnapshot with the group's policy;
//! intents journaled like a single snapshot's, so a group cut for a content that went away is
//! deleted.

use std::collections::BTreeMap;

use csi_proto::v1::{
    CreateVolumeGroupSnapshotRequest, DeleteVolumeGroupSnapshotRequest,
    GetVolumeGroupSnapshotRequest,
};
use kube::api::Patch;
use serde::{Deserialize, Serialize};
use sidecar_kit::cluster::client::{api_code, api_message};
use sidecar_kit::driver::csi::go_error;
use tonic::Status;

use super::{Controller, Failure, Groups, now_ns};
use crate::decide::{self, GroupAnswer, GroupPlan};
use crate::model::{self, Class, GroupContent, SecretRef, SnapshotInfo};

/// The group queue's name in the workqueue metrics, as upstream's.
pub const GROUP_QUEUE: &str = "csi-snapshotter-groupsnapshotcontent";
/// Journal keys of group intents start with this.
pub const KEY_PREFIX: &str = "G_";

/// How group snapshots are named: `--groupsnapshot-name-prefix`,
/// `--groupsnapshot-name-uuid-length`.
#[derive(Clone, Debug)]
pub struct GroupNaming {
    pub prefix: String,
    pub uuid_length: i32,
}

/// A CreateVolumeGroupSnapshot asked before its answer was written to the group content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupIntent {
    pub content_uid: String,
    /// The VolumeGroupSnapshot's UID, which [`GroupIntent::name`] is derived from.
    #[serde(default)]
    pub group_snapshot_uid: String,
    pub name: String,
    pub source_volumes: Vec<String>,
    pub parameters: BTreeMap<String, String>,
    pub secret: Option<SecretRef>,
    /// The group content's deletion policy is `Delete`.
    pub delete: bool,
    /// The VolumeGroupSnapshotClass the request was prepared from (see [`Intent::class`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
}

impl GroupIntent {
    /// The CreateVolumeGroupSnapshot call it stands for.
    pub(super) fn request(
        &self,
        secrets: BTreeMap<String, String>,
    ) -> CreateVolumeGroupSnapshotRequest {
        CreateVolumeGroupSnapshotRequest {
            name: self.name.clone(),
            source_volume_ids: self.source_volumes.clone(),
            secrets: secrets.into_iter().collect(),
            parameters: self.parameters.clone().into_iter().collect(),
        }
    }
}

pub(super) fn group_answer(group: csi_proto::v1::VolumeGroupSnapshot) -> GroupAnswer {
    let ns = |t: Option<prost_types::Timestamp>| {
        t.map(|t| {
            t.seconds
                .saturating_mul(1_000_000_000)
                .saturating_add(i64::from(t.nanos))
        })
    };
    GroupAnswer {
        handle: group.group_snapshot_id,
        ready: group.ready_to_use,
        creation_ns: ns(group.creation_time).unwrap_or(0),
        members: group
            .snapshots
            .into_iter()
            .map(|s| SnapshotInfo {
                volume_handle: s.source_volume_id,
                snapshot_handle: s.snapshot_id,
                creation_time: ns(s.creation_time),
                ready_to_use: Some(s.ready_to_use),
                restore_size: (s.size_bytes > 0).then_some(s.size_bytes),
            })
            .collect(),
    }
}

impl Controller {
    pub(super) async fn group_step(
        &self,
        content: &GroupContent,
        class: Option<&Class>,
    ) -> Result<bool, Failure> {
        let plan = decide::group_plan(content);
        tracing::debug!(group_content = %content.name, ?plan, "syncing group content");
        let operation = match &plan {
            GroupPlan::Delete { .. } => "delete group snapshot",
            GroupPlan::Create => "create group snapshot",
            GroupPlan::Check { .. } => "check group snapshot",
            GroupPlan::Ready => "group snapshot ready",
        };
        let group = &content.group_ref;
        sidecar_kit::telemetry::operation::describe(
            operation,
            &[
                ("k8s.volumegroupsnapshotcontent.name", &content.name),
                ("k8s.namespace.name", &group.namespace),
                ("k8s.volumegroupsnapshot.name", &group.name),
                ("k8s.volumegroupsnapshot.uid", &group.uid),
            ],
        );
        let outcome = match plan {
            GroupPlan::Delete {
                handle,
                snapshot_ids,
            } => self
                .delete_group(content, handle, snapshot_ids)
                .await
                .map(|()| true),
            GroupPlan::Create => self.create_group(content, class).await,
            GroupPlan::Check {
                handle,
                snapshot_ids,
            } => self.check_group(content, class, handle, snapshot_ids).await,
            GroupPlan::Ready => self
                .remove_being_created::<Groups>(content)
                .await
                .map(|_| true),
        };
        if let Err(failure) = &outcome {
            self.report::<Groups>(content, failure).await;
        }
        outcome
    }

    /// The request of a CreateVolumeGroupSnapshot for `content`.
    pub(super) fn group_input(
        &self,
        content: &GroupContent,
        class: Option<&Class>,
        naming: &GroupNaming,
    ) -> Result<GroupIntent, String> {
        let class = match (&content.class, class) {
            (None, _) => {
                return Err(format!(
                    "failed to take group snapshot {} without a group snapshot class",
                    content.name
                ));
            }
            (Some(name), None) => {
                return Err(format!(
                    "volumegroupsnapshotclass.groupsnapshot.storage.k8s.io {name:?} not found"
                ));
            }
            (Some(_), Some(class)) => class,
        };
        let secret = decide::group_secret(content)?;
        let mut parameters = decide::driver_parameters(&class.parameters)
            .map_err(|e| format!("failed to remove CSI Parameters of prefixed keys: {e}"))?;
        if self.config.naming.extra_create_metadata {
            let group = &content.group_ref;
            parameters.insert(decide::GROUP_NAME_KEY.into(), group.name.to_string());
            parameters.insert(
                decide::GROUP_NAMESPACE_KEY.into(),
                group.namespace.to_string(),
            );
            parameters.insert(
                decide::GROUP_CONTENT_NAME_KEY.into(),
                content.name.to_string(),
            );
        }
        if content.group_ref.uid.is_empty() {
            return Err(format!(
                "cannot create group snapshot. Group snapshot content {} not bound to a group snapshot",
                content.name
            ));
        }
        let name = decide::group_snapshot_name(
            &naming.prefix,
            &content.group_ref.uid,
            naming.uuid_length,
        )?;
        Ok(GroupIntent {
            content_uid: content.uid.to_string(),
            group_snapshot_uid: content.group_ref.uid.to_string(),
            name,
            source_volumes: content.volume_handles.clone(),
            parameters,
            secret,
            delete: content.deletion_policy == "Delete",
            class: Some(class.name.clone()),
        })
    }

    /// CreateVolumeGroupSnapshot of a new group content (or again, until the driver answers).
    async fn create_group(
        &self,
        content: &GroupContent,
        class: Option<&Class>,
    ) -> Result<bool, Failure> {
        let fail = |message: String| Failure {
            event: Some((
                decide::GROUP_CREATION_FAILED,
                format!("Failed to create group snapshot: {message}"),
            )),
            message,
            status: true,
        };
        let Some(naming) = &self.config.groups else {
            return Ok(true);
        };
        let intent = self.group_input(content, class, naming).map_err(|e| {
            fail(format!(
                "failed to get input parameters to create group snapshot for group snapshot content {}: {e:?}",
                content.name
            ))
        })?;
        let secrets = self.secret(intent.secret.as_ref()).await.map_err(|err| {
            tracing::error!(group_content = %content.name, error = %err, "Failed to get credentials for group snapshot");
            let cause = format!(
                "cannot get credentials for group snapshot content {:?}",
                content.name
            );
            fail(format!(
                "failed to get input parameters to create group snapshot for group snapshot content {}: {cause:?}",
                content.name
            ))
        })?;
        let content = if content.being_created {
            content.clone()
        } else {
            let patch = serde_json::json!({"metadata": {"annotations": {model::GROUP_BEING_CREATED: "yes"}}});
            self.patch_metadata::<Groups, _>(&content.name, &Patch::Merge(&patch))
                .await
                .map_err(|err| {
                    fail(format!(
                        "failed to add VolumeGroupSnapshotBeingCreated annotation on the group snapshot content {}: {:?}",
                        content.name,
                        api_message(&err)
                    ))
                })?
        };
        if content.handle().is_none() {
            self.record::<Groups>(&content.name, &intent)
                .await
                .map_err(fail)?;
        }
        let request = intent.request(secrets);
        let answer = match self
            .csi
            .create_volume_group_snapshot(request, self.options())
            .await
        {
            Ok(response) => response.group_snapshot.map(group_answer).ok_or_else(|| {
                Status::internal("CreateVolumeGroupSnapshot answered without a group snapshot")
            }),
            Err(status) => Err(status),
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(status) => {
                tracing::info!(group_content = %content.name, error = %go_error(&status), "CreateVolumeGroupSnapshot failed");
                if decide::is_final(Some(status.code())) {
                    self.remove_being_created::<Groups>(&content).await?;
                    self.forget::<Groups>(&content.name);
                }
                return Err(fail(format!(
                    "failed to take group snapshot of the volumes {:?}: {:?}",
                    intent.source_volumes,
                    go_error(&status)
                )));
            }
        };
        tracing::debug!(group_content = %content.name, handle = %answer.handle, ready = answer.ready, "CreateVolumeGroupSnapshot answered");
        let updated = match decide::group_status_patch(content.status.as_ref(), &answer, now_ns()) {
            None => content.clone(),
            Some(patch) => match self.patch_status::<Groups>(&content.name, &patch).await {
                Ok(updated) => updated,
                Err(err) if api_code(&err) == Some(404) => {
                    self.discard::<Groups>(&content.name, &intent, &answer)
                        .await?;
                    return Ok(true);
                }
                Err(err) => {
                    return Err(fail(format!(
                        "error updating status for volume group snapshot content {}: {}",
                        content.name,
                        api_message(&err)
                    )));
                }
            },
        };
        self.forget::<Groups>(&content.name);
        self.remove_being_created::<Groups>(&updated).await?;
        Ok(answer.ready)
    }

    /// GetVolumeGroupSnapshot of a pre-provisioned group or of a cut group not ready yet.
    async fn check_group(
        &self,
        content: &GroupContent,
        class: Option<&Class>,
        handle: String,
        snapshot_ids: Vec<String>,
    ) -> Result<bool, Failure> {
        let fail = |message: String| Failure {
            event: Some((
                decide::GROUP_CHECK_FAILED,
                format!("Failed to check and update group snapshot content: {message}"),
            )),
            message,
            status: true,
        };
        let _slot = self.poll_slot().await;
        let mut secret_ref = None;
        if let Some(class_name) = &content.class {
            let Some(class) = class else {
                return Err(fail(format!(
                    "failed to get group snapshot class {class_name} for group snapshot content {}: volumegroupsnapshotclass.groupsnapshot.storage.k8s.io {class_name:?} not found",
                    content.name
                )));
            };
            secret_ref =
                decide::group_get_secret(&class.parameters, &content.name).map_err(|e| {
                    fail(format!(
                        "failed to get secret reference for group snapshot content {}: {e}",
                        content.name
                    ))
                })?;
        }
        let secrets = self.secret(secret_ref.as_ref()).await.map_err(|e| {
            fail(format!(
                "failed to get credentials for group snapshot content {}: {e}",
                content.name
            ))
        })?;
        if snapshot_ids.is_empty() {
            return Err(fail(format!(
                "cannot list group snapshot {}. No snapshots found in the group snapshot content",
                content.name
            )));
        }
        let request = GetVolumeGroupSnapshotRequest {
            group_snapshot_id: handle.clone(),
            snapshot_ids,
            secrets: secrets.into_iter().collect(),
        };
        let group = self
            .csi
            .get_volume_group_snapshot(request, self.options())
            .await
            .and_then(|r| {
                r.group_snapshot.ok_or_else(|| {
                    Status::internal("GetVolumeGroupSnapshot answered without a group snapshot")
                })
            })
            .map_err(|status| {
                fail(format!(
                    "failed to list group snapshot for group snapshot content {}: {:?}",
                    content.name,
                    go_error(&status)
                ))
            })?;
        let mut answer = group_answer(group);
        answer.handle = handle;
        if content.pre_provisioned.is_some() {
            // Upstream lists no members for a pre-provisioned group.
            answer.members.clear();
        }
        if let Some(patch) = decide::group_status_patch(content.status.as_ref(), &answer, now_ns())
        {
            self.patch_status::<Groups>(&content.name, &patch)
                .await
                .map_err(|err| {
                    fail(format!(
                        "error updating status for volume group snapshot content {}: {}",
                        content.name,
                        api_message(&err)
                    ))
                })?;
        }
        Ok(answer.ready)
    }

    async fn delete_group(
        &self,
        content: &GroupContent,
        handle: Option<String>,
        snapshot_ids: Vec<String>,
    ) -> Result<(), Failure> {
        let error = |message: String, event: &str| {
            Failure::deleting(decide::GROUP_DELETE_ERROR, message, event)
        };
        let mut content = content.clone();
        if let Some(handle) = handle {
            let secret_ref = decide::group_secret(&content)
                .map_err(|e| error(e, "Failed to get snapshot credentials"))?;
            let secrets = self.secret(secret_ref.as_ref()).await.map_err(|e| {
                error(
                    format!(
                        "failed to get input parameters to delete group snapshot for group snapshot content {}: {e:?}",
                        content.name
                    ),
                    "Failed to get snapshot credentials",
                )
            })?;
            if snapshot_ids.is_empty() {
                return Err(error(
                    format!(
                        "cannot delete group snapshot content {}. No snapshots found in the group snapshot",
                        content.name
                    ),
                    "Failed to delete group snapshot",
                ));
            }
            let request = DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id: handle.clone(),
                snapshot_ids,
                secrets: secrets.into_iter().collect(),
            };
            self.csi
                .delete_volume_group_snapshot(request, self.options())
                .await
                .map_err(|status| {
                    error(
                        format!(
                            "failed to delete group snapshot {:?}, err: {:?}",
                            content.name,
                            go_error(&status)
                        ),
                        "Failed to delete group snapshot",
                    )
                })?;
            tracing::info!(group_content = %content.name, %handle, "group snapshot deleted");
            content = self
                .clear_status::<Groups>(&content.name, &decide::cleared_group_status_patch())
                .await?;
        }
        if let Some(patch) = decide::group_finalizer_removal(&content) {
            self.remove_finalizer::<Groups>(&content.name, patch)
                .await?;
            tracing::debug!(group_content = %content.name, "removed the protection finalizer");
        }
        self.events.forget_object(&content.uid);
        Ok(())
    }
}
