//! The two kinds of content the snapshotter drives, VolumeSnapshotContents and
//! VolumeGroupSnapshotContents, and their one flow: a content synced (its plan carried out,
//! retried with backoff until done), a failure reported (Event and error status), the
//! content's status and metadata written, its being-created annotation removed.

use std::fmt::Debug;
use std::future::Future;

use csi_proto::v1::DeleteVolumeGroupSnapshotRequest;
use serde::de::DeserializeOwned;

use super::groups::{self, group_answer};
use super::*;
use crate::decide::GroupAnswer;
use crate::index::Shelved;
use crate::model::{ContentObject, GroupContent};

/// What the journal records of a create call before it is made.
pub(super) trait JournaledIntent: Clone + PartialEq + Serialize + Send + Sync {
    /// The name of what the call cuts, and of its source, as a mismatch names them.
    const PARTS: [&'static str; 2];
    /// The parameters `--extra-create-metadata` adds: the snapshot's (group's) name and
    /// namespace, then the content's name.
    const METADATA_KEYS: [&'static str; 3];
    fn content_uid(&self) -> &str;
    /// The UID of the VolumeSnapshot (VolumeGroupSnapshot) its content is bound to.
    fn source_uid(&self) -> &str;
    /// The name the call gives what it cuts.
    fn name(&self) -> &str;
    fn parameters(&self) -> &BTreeMap<String, String>;
    fn secret(&self) -> Option<&SecretRef>;
    /// The content's deletion policy is `Delete`.
    fn delete(&self) -> bool;
    /// The class its request was prepared from (not recorded before it was).
    fn class(&self) -> Option<&str>;
    /// It cuts from the same volume (volumes) as `other`.
    fn same_source(&self, other: &Self) -> bool;

    /// Its parts, by name, each with whether `now` (the request the content asks for now)
    /// agrees.
    fn agreement(&self, now: &Self) -> [(&'static str, bool); 5] {
        let [name, source] = Self::PARTS;
        [
            (name, self.name() == now.name()),
            (source, self.same_source(now)),
            ("parameters", self.parameters() == now.parameters()),
            ("secret reference", self.secret() == now.secret()),
            ("deletion policy", self.delete() == now.delete()),
        ]
    }
}

/// The accessors of [`JournaledIntent`]: both intents keep these fields under the same names.
macro_rules! intent_fields {
    () => {
        fn content_uid(&self) -> &str {
            &self.content_uid
        }
        fn name(&self) -> &str {
            &self.name
        }
        fn parameters(&self) -> &BTreeMap<String, String> {
            &self.parameters
        }
        fn secret(&self) -> Option<&SecretRef> {
            self.secret.as_ref()
        }
        fn delete(&self) -> bool {
            self.delete
        }
        fn class(&self) -> Option<&str> {
            self.class.as_deref()
        }
    };
}

impl JournaledIntent for Intent {
    const PARTS: [&'static str; 2] = ["snapshot name", "source volume"];
    const METADATA_KEYS: [&'static str; 3] = [
        decide::SNAPSHOT_NAME_KEY,
        decide::SNAPSHOT_NAMESPACE_KEY,
        decide::CONTENT_NAME_KEY,
    ];
    intent_fields!();

    fn source_uid(&self) -> &str {
        &self.snapshot_uid
    }

    fn same_source(&self, other: &Self) -> bool {
        self.source_volume == other.source_volume
    }
}

impl JournaledIntent for GroupIntent {
    const PARTS: [&'static str; 2] = ["group snapshot name", "source volumes"];
    const METADATA_KEYS: [&'static str; 3] = [
        decide::GROUP_NAME_KEY,
        decide::GROUP_NAMESPACE_KEY,
        decide::GROUP_CONTENT_NAME_KEY,
    ];
    intent_fields!();

    fn source_uid(&self) -> &str {
        &self.group_snapshot_uid
    }

    fn same_source(&self, other: &Self) -> bool {
        self.source_volumes == other.source_volumes
    }
}

/// What the controller keeps per kind of content.
pub(super) struct Lane<K: ContentKind> {
    api: Api<K::Object>,
    queue: WorkQueue<String>,
    /// The recorded intents by content name.
    pub(super) intents: Mutex<HashMap<String, K::Intent>>,
}

impl<K: ContentKind> Lane<K> {
    pub(super) fn new(client: &kube::Client, queue: WorkQueue<String>) -> Self {
        Self {
            api: Api::all(client.clone()),
            queue,
            intents: Mutex::new(HashMap::new()),
        }
    }
}

/// What tells a kind of content apart where the flows are one.
pub(super) trait ContentKind: Sized + 'static {
    type Object: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// The kind of its classes.
    type ClassObject: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    type Content: Shelved + ContentObject<Object = Self::Object> + Send + Sync;
    type Intent: JournaledIntent;
    /// What the create call cut, as the driver answered.
    type Cut: Send + Sync;
    /// What the create call cuts, in logs: "snapshot".
    const CUT: &'static str;
    /// The create call, in logs.
    const CREATE: &'static str;
    /// The annotation of a content whose create call may still be answered.
    const BEING_CREATED: &'static str;
    /// The annotation and the object, as the error of the annotation's removal names them.
    const BEING_CREATED_ON: &'static str;
    /// The reason of the Events about a failed deletion.
    const DELETE_ERROR: &'static str;

    fn lane(controller: &Controller) -> &Lane<Self>;
    /// A watch event of a content: the names to work on.
    fn apply(index: &mut Index, change: Change<&Self::Object>) -> Vec<String>;
    /// A watch event of a class.
    fn apply_class(index: &mut Index, change: Change<&Self::ClassObject>);
    /// The journal's key of the intent of content `name`.
    fn journal_key(name: &str) -> String;
    /// Carries out the content's plan; `Ok(true)` when it needs nothing more for now.
    fn step(
        controller: &Controller,
        content: &Self::Content,
        class: Option<&Class>,
    ) -> impl Future<Output = Result<bool, Failure>> + Send;
    /// The create call of `intent` again, idempotent by name: what it cut, `None` when the
    /// driver answered with nothing.
    fn find_cut(
        controller: &Controller,
        intent: &Self::Intent,
        secrets: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Option<Self::Cut>, Status>> + Send;
    fn delete_cut(
        controller: &Controller,
        cut: &Self::Cut,
        secrets: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), Status>> + Send;
    fn handle(cut: &Self::Cut) -> &str;
    /// The name the create call of `intent` must give what it cuts, derived from the UID it
    /// records (or why none can be).
    fn derived_name(
        controller: &Controller,
        intent: &Self::Intent,
    ) -> Result<Result<String, String>, Rejected>;
    /// The intent of the create call `content` asks for now.
    fn intent(
        controller: &Controller,
        content: &Self::Content,
        class: Option<&Class>,
    ) -> Result<Self::Intent, String>;
    /// What is kept of content `name` until it is done, let go.
    fn done(_controller: &Controller, _name: &str) {}
}

/// VolumeSnapshotContents.
pub(super) struct Snapshots;

impl ContentKind for Snapshots {
    type Object = VolumeSnapshotContent;
    type ClassObject = VolumeSnapshotClass;
    type Content = Content;
    type Intent = Intent;
    /// The snapshot's handle.
    type Cut = String;
    const CUT: &'static str = "snapshot";
    const CREATE: &'static str = "CreateSnapshot";
    const BEING_CREATED: &'static str = model::BEING_CREATED;
    const BEING_CREATED_ON: &'static str = "VolumeSnapshotBeingCreated annotation on the content";
    const DELETE_ERROR: &'static str = decide::DELETE_ERROR;

    fn lane(controller: &Controller) -> &Lane<Self> {
        &controller.contents
    }

    fn apply(index: &mut Index, change: Change<&VolumeSnapshotContent>) -> Vec<String> {
        index.content_event(change)
    }

    fn apply_class(index: &mut Index, change: Change<&VolumeSnapshotClass>) {
        index.class_event(change);
    }

    fn journal_key(name: &str) -> String {
        name.to_string()
    }

    async fn step(
        controller: &Controller,
        content: &Content,
        class: Option<&Class>,
    ) -> Result<bool, Failure> {
        controller.step(content, class).await
    }

    async fn find_cut(
        controller: &Controller,
        intent: &Intent,
        secrets: BTreeMap<String, String>,
    ) -> Result<Option<String>, Status> {
        let response = controller
            .csi
            .create_snapshot(intent.request(secrets), controller.options())
            .await?;
        Ok(response.snapshot.map(|s| s.snapshot_id))
    }

    async fn delete_cut(
        controller: &Controller,
        handle: &String,
        secrets: BTreeMap<String, String>,
    ) -> Result<(), Status> {
        let request = DeleteSnapshotRequest {
            snapshot_id: handle.clone(),
            secrets: secrets.into_iter().collect(),
        };
        controller
            .csi
            .delete_snapshot(request, controller.options())
            .await
            .map(drop)
    }

    fn handle(handle: &String) -> &str {
        handle
    }

    fn derived_name(
        controller: &Controller,
        intent: &Intent,
    ) -> Result<Result<String, String>, Rejected> {
        let naming = &controller.config.naming;
        Ok(decide::snapshot_name(
            &naming.prefix,
            &intent.snapshot_uid,
            naming.uuid_length,
        ))
    }

    fn intent(
        controller: &Controller,
        content: &Content,
        class: Option<&Class>,
    ) -> Result<Intent, String> {
        controller
            .create_input(content, class)
            .map(|(intent, _)| intent)
    }

    /// The count of driver calls until ready.
    fn done(controller: &Controller, name: &str) {
        lock(&controller.calls).remove(name);
    }
}

/// VolumeGroupSnapshotContents.
pub(super) struct Groups;

impl ContentKind for Groups {
    type Object = VolumeGroupSnapshotContent;
    type ClassObject = VolumeGroupSnapshotClass;
    type Content = GroupContent;
    type Intent = GroupIntent;
    type Cut = GroupAnswer;
    const CUT: &'static str = "group snapshot";
    const CREATE: &'static str = "CreateVolumeGroupSnapshot";
    const BEING_CREATED: &'static str = model::GROUP_BEING_CREATED;
    const BEING_CREATED_ON: &'static str =
        "VolumeGroupSnapshotBeingCreated annotation on the group snapshot content";
    const DELETE_ERROR: &'static str = decide::GROUP_DELETE_ERROR;

    fn lane(controller: &Controller) -> &Lane<Self> {
        &controller.group_contents
    }

    fn apply(index: &mut Index, change: Change<&VolumeGroupSnapshotContent>) -> Vec<String> {
        index.group_content_event(change)
    }

    fn apply_class(index: &mut Index, change: Change<&VolumeGroupSnapshotClass>) {
        index.group_class_event(change);
    }

    fn journal_key(name: &str) -> String {
        format!("{}{name}", groups::KEY_PREFIX)
    }

    async fn step(
        controller: &Controller,
        content: &GroupContent,
        class: Option<&Class>,
    ) -> Result<bool, Failure> {
        controller.group_step(content, class).await
    }

    async fn find_cut(
        controller: &Controller,
        intent: &GroupIntent,
        secrets: BTreeMap<String, String>,
    ) -> Result<Option<GroupAnswer>, Status> {
        let response = controller
            .csi
            .create_volume_group_snapshot(intent.request(secrets), controller.options())
            .await?;
        Ok(response.group_snapshot.map(group_answer))
    }

    async fn delete_cut(
        controller: &Controller,
        answer: &GroupAnswer,
        secrets: BTreeMap<String, String>,
    ) -> Result<(), Status> {
        let request = DeleteVolumeGroupSnapshotRequest {
            group_snapshot_id: answer.handle.clone(),
            snapshot_ids: answer
                .members
                .iter()
                .map(|m| m.snapshot_handle.clone())
                .collect(),
            secrets: secrets.into_iter().collect(),
        };
        controller
            .csi
            .delete_volume_group_snapshot(request, controller.options())
            .await
            .map(drop)
    }

    fn handle(answer: &GroupAnswer) -> &str {
        &answer.handle
    }

    fn derived_name(
        controller: &Controller,
        intent: &GroupIntent,
    ) -> Result<Result<String, String>, Rejected> {
        let naming = group_naming(controller)?;
        Ok(decide::group_snapshot_name(
            &naming.prefix,
            &intent.group_snapshot_uid,
            naming.uuid_length,
        ))
    }

    fn intent(
        controller: &Controller,
        content: &GroupContent,
        class: Option<&Class>,
    ) -> Result<GroupIntent, String> {
        let naming = group_naming(controller).map_err(|rejected| rejected.to_string())?;
        controller.group_input(content, class, naming)
    }
}

/// How group snapshots are named: `Unverifiable` with the gate off.
fn group_naming(controller: &Controller) -> Result<&GroupNaming, Rejected> {
    controller.config.groups.as_ref().ok_or_else(|| {
        Rejected::Unverifiable("group snapshots are off (the CSIVolumeGroupSnapshot gate)".into())
    })
}

/// The kind of `K`'s contents, in logs.
pub(super) fn kind_of<K: ContentKind>() -> &'static str {
    <K::Content as ContentObject>::KIND
}

impl Controller {
    /// Watches the contents of kind `K` (with `--node-deployment`, this node's only) and their
    /// classes.
    pub(super) fn watch<K: ContentKind>(self: &Arc<Self>, pipeline: &mut Pipeline) {
        let mut contents = watcher::Config::default();
        if let Some(node) = &self.config.node {
            contents = contents.labels(&format!("{}={node}", model::MANAGED_BY));
        }
        let me = self.clone();
        pipeline.watch(K::lane(self).api.clone(), contents, move |change| {
            let work = K::apply(&mut me.index(), change);
            for name in work {
                K::lane(&me).queue.add(name, 0);
            }
        });
        let me = self.clone();
        pipeline.watch(
            Api::<K::ClassObject>::all(self.client.clone()),
            watcher::Config::default(),
            move |change| K::apply_class(&mut me.index(), change),
        );
    }

    /// The workers of the contents of kind `K`.
    pub(super) fn workers<K: ContentKind>(self: &Arc<Self>, pipeline: &mut Pipeline) {
        let me = self.clone();
        pipeline.workers(&K::lane(self).queue, self.config.workers, move |item| {
            let me = me.clone();
            async move { me.sync::<K>(&item.key).await }
        });
    }

    /// Every content of kind `K` to its queue.
    pub(super) fn resync<K: ContentKind>(&self) {
        let names = self.index().names::<K::Content>();
        for name in names {
            K::lane(self).queue.add(name, 0);
        }
    }

    /// Takes up the recorded `intent` of content `name`: the worker carries it on.
    pub(super) fn adopt<K: ContentKind>(&self, name: &str, intent: K::Intent) {
        lock(&K::lane(self).intents).insert(name.to_string(), intent);
        K::lane(self).queue.add(name.to_string(), 0);
    }

    /// One content of kind `K`: what it needs next; retried with backoff until done.
    pub(super) async fn sync<K: ContentKind>(&self, name: &str) {
        let (view, settled) = {
            let index = self.index();
            (
                index.view::<K::Content>(name),
                index.is_settled::<K::Content>(name),
            )
        };
        let mut result = match view {
            Some((content, class)) => K::step(self, &content, class.as_ref()).await,
            None if settled => Ok(true),
            None => self.settle_gone::<K>(name).await.map(|()| true),
        };
        // The snapshotter's own writes do not come back as work: a content whose deletion
        // waited for its create call to be answered is deleted now (upstream re-queues on the
        // readiness it wrote itself, external-snapshotter #1388).
        if matches!(result, Ok(true)) {
            let now = self.index().view::<K::Content>(name);
            if let Some((content, class)) = now.filter(|(c, _)| decide::should_delete(c)) {
                result = K::step(self, &content, class.as_ref()).await;
            }
        }
        let queue = &K::lane(self).queue;
        let key = name.to_string();
        match result {
            Ok(true) => queue.forget(&key),
            Ok(false) => {
                let delay = queue.add_rate_limited(key, 0);
                tracing::debug!(kind = kind_of::<K>(), name, retry_in = ?delay, "{} not ready yet", K::CUT);
            }
            Err(failure) => {
                let delay = queue.add_rate_limited(key, 0);
                tracing::info!(kind = kind_of::<K>(), name, error = %failure.message, retry_in = ?delay, "content not done");
            }
        }
    }

    /// The failure's Event, and its status error when it has one (each message written once).
    pub(super) async fn report<K: ContentKind>(&self, content: &K::Content, failure: &Failure) {
        let Some((reason, message)) = &failure.event else {
            return;
        };
        self.events
            .record(content.object_ref(), EventType::Warning, reason, message);
        if !failure.status {
            return;
        }
        let name = content.name();
        let current = self.index().current::<K::Content>(name);
        let written = current.as_ref().unwrap_or(content).error_message();
        if let Some(patch) = decide::error_patch(written, message, &now())
            && let Err(err) = self.patch_status::<K>(name, &patch).await
        {
            let error = api_message(&err);
            tracing::info!(
                kind = K::Content::KIND,
                name,
                error,
                "cannot write the error status"
            );
        }
    }

    pub(super) async fn patch_status<K: ContentKind>(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K::Content, kube::Error> {
        let written = K::lane(self)
            .api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await?;
        let content = K::Content::project(&written);
        self.index().store(content.clone());
        Ok(content)
    }

    pub(super) async fn patch_metadata<K: ContentKind, P: Serialize + Debug>(
        &self,
        name: &str,
        patch: &Patch<P>,
    ) -> Result<K::Content, kube::Error> {
        let written = K::lane(self)
            .api
            .patch(name, &PatchParams::default(), patch)
            .await?;
        let content = K::Content::project(&written);
        self.index().store(content.clone());
        Ok(content)
    }

    pub(super) async fn remove_being_created<K: ContentKind>(
        &self,
        content: &K::Content,
    ) -> Result<K::Content, Failure> {
        if !content.being_created() {
            return Ok(content.clone());
        }
        let name = content.name();
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
