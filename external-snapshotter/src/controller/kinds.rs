//! The two kinds of content the snapshotter drives, VolumeSnapshotContents and
//! VolumeGroupSnapshotContents, where their flows are one: a failure reported (Event and error
//! status), the content's status and metadata written, its being-created annotation removed.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::ObjectReference;
use serde::de::DeserializeOwned;

use super::*;
use crate::model::GroupContent;

/// What tells a kind of content apart where the flows are one.
pub(super) trait ContentKind {
    type Object: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug;
    type Content: Clone;
    /// The annotation of a content whose create call may still be answered.
    const BEING_CREATED: &'static str;
    /// The annotation and the object, as the error of the annotation's removal names them.
    const BEING_CREATED_ON: &'static str;
    /// The reason of the Events about a failed deletion.
    const DELETE_ERROR: &'static str;

    fn api(controller: &Controller) -> &Api<Self::Object>;
    fn store(index: &mut Index, object: &Self::Object);
    fn project(object: &Self::Object) -> Self::Content;
    /// The content as the index holds it now.
    fn current(index: &Index, name: &str) -> Option<Self::Content>;
    fn name(content: &Self::Content) -> &str;
    fn being_created(content: &Self::Content) -> bool;
    fn object_ref(content: &Self::Content) -> ObjectReference;
    /// The error status patch for `message`, `None` when the status already says it.
    fn error_patch(content: &Self::Content, message: &str, now: &str) -> Option<serde_json::Value>;
    /// Logs that the error status could not be written.
    fn log_error_status_failed(name: &str, error: &str);
}

/// VolumeSnapshotContents.
pub(super) struct Snapshots;

impl ContentKind for Snapshots {
    type Object = VolumeSnapshotContent;
    type Content = Content;
    const BEING_CREATED: &'static str = model::BEING_CREATED;
    const BEING_CREATED_ON: &'static str = "VolumeSnapshotBeingCreated annotation on the content";
    const DELETE_ERROR: &'static str = decide::DELETE_ERROR;

    fn api(controller: &Controller) -> &Api<VolumeSnapshotContent> {
        &controller.contents
    }

    fn store(index: &mut Index, object: &VolumeSnapshotContent) {
        index.store(object);
    }

    fn project(object: &VolumeSnapshotContent) -> Content {
        Content::from_api(object)
    }

    fn current(index: &Index, name: &str) -> Option<Content> {
        index.view(name).map(|(content, _)| content)
    }

    fn name(content: &Content) -> &str {
        &content.name
    }

    fn being_created(content: &Content) -> bool {
        content.being_created
    }

    fn object_ref(content: &Content) -> ObjectReference {
        content.object_ref()
    }

    fn error_patch(content: &Content, message: &str, now: &str) -> Option<serde_json::Value> {
        decide::error_patch(content.status.as_ref(), message, now)
    }

    fn log_error_status_failed(name: &str, error: &str) {
        tracing::info!(content = %name, error, "cannot write the error status");
    }
}

/// VolumeGroupSnapshotContents.
pub(super) struct Groups;

impl ContentKind for Groups {
    type Object = VolumeGroupSnapshotContent;
    type Content = GroupContent;
    const BEING_CREATED: &'static str = model::GROUP_BEING_CREATED;
    const BEING_CREATED_ON: &'static str =
        "VolumeGroupSnapshotBeingCreated annotation on the group snapshot content";
    const DELETE_ERROR: &'static str = decide::GROUP_DELETE_ERROR;

    fn api(controller: &Controller) -> &Api<VolumeGroupSnapshotContent> {
        &controller.group_contents
    }

    fn store(index: &mut Index, object: &VolumeGroupSnapshotContent) {
        index.group_store(object);
    }

    fn project(object: &VolumeGroupSnapshotContent) -> GroupContent {
        GroupContent::from_api(object)
    }

    fn current(index: &Index, name: &str) -> Option<GroupContent> {
        index.group_view(name).map(|(content, _)| content)
    }

    fn name(content: &GroupContent) -> &str {
        &content.name
    }

    fn being_created(content: &GroupContent) -> bool {
        content.being_created
    }

    fn object_ref(content: &GroupContent) -> ObjectReference {
        content.object_ref()
    }

    fn error_patch(content: &GroupContent, message: &str, now: &str) -> Option<serde_json::Value> {
        decide::group_error_patch(content.status.as_ref(), message, now)
    }

    fn log_error_status_failed(name: &str, error: &str) {
        tracing::info!(group_content = %name, error, "cannot write the error status");
    }
}

impl Controller {
    /// The failure's Event, and its status error when it has one (each message written once).
    pub(super) async fn report<K: ContentKind>(&self, content: &K::Content, failure: &Failure) {
        let Some((reason, message)) = &failure.event else {
            return;
        };
        self.events
            .record(K::object_ref(content), EventType::Warning, reason, message);
        if !failure.status {
            return;
        }
        let name = K::name(content);
        let current = K::current(&self.index(), name);
        let patch = K::error_patch(current.as_ref().unwrap_or(content), message, &now());
        if let Some(patch) = patch
            && let Err(err) = self.patch_status::<K>(name, &patch).await
        {
            K::log_error_status_failed(name, &api_message(&err));
        }
    }

    pub(super) async fn patch_status<K: ContentKind>(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K::Content, kube::Error> {
        let written = K::api(self)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        K::store(&mut self.index(), &written);
        Ok(K::project(&written))
    }

    pub(super) async fn patch_metadata<K: ContentKind, P: Serialize + Debug>(
        &self,
        name: &str,
        patch: &Patch<P>,
    ) -> Result<K::Content, kube::Error> {
        let written = K::api(self)
            .patch(name, &PatchParams::default(), patch)
            .await?;
        K::store(&mut self.index(), &written);
        Ok(K::project(&written))
    }

    pub(super) async fn remove_being_created<K: ContentKind>(
        &self,
        content: &K::Content,
    ) -> Result<K::Content, Failure> {
        if !K::being_created(content) {
            return Ok(content.clone());
        }
        let name = K::name(content);
        let patch = serde_json::json!({"metadata": {"annotations": {K::BEING_CREATED: null}}});
        self.patch_metadata::<K, _>(name, &Patch::Merge(&patch))
            .await
            .map_err(|err| {
                Failure::quiet(format!(
                    "failed to remove {} {name}: {}",
                    K::BEING_CREATED_ON,
                    api_message(&err)
                ))
            })
    }

    /// After the driver deleted what the content stood for: its status cleared with `patch`.
    pub(super) async fn clear_status<K: ContentKind>(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K::Content, Failure> {
        self.patch_status::<K>(name, patch).await.map_err(|err| {
            Failure::deleting(
                K::DELETE_ERROR,
                format!(
                    "snapshot controller failed to update {name} on API server: {}",
                    api_message(&err)
                ),
                "Failed to clear content status",
            )
        })
    }

    /// Our protection finalizer removed with `patch` (a JSON patch).
    pub(super) async fn remove_finalizer<K: ContentKind>(
        &self,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<(), Failure> {
        let patch = serde_json::from_value(patch).map_err(|e| Failure::quiet(e.to_string()))?;
        self.patch_metadata::<K, ()>(name, &Patch::Json(patch))
            .await
            .map_err(|err| {
                Failure::quiet(format!(
                    "snapshot controller failed to update {name} on API server: {}",
                    api_message(&err)
                ))
            })?;
        Ok(())
    }
}

impl Failure {
    /// A step of a deletion that failed, with its Event of `reason` (never its status).
    pub(super) fn deleting(reason: &'static str, message: String, event: &str) -> Self {
        Self {
            message,
            event: Some((reason, event.to_string())),
            status: false,
        }
    }
}
