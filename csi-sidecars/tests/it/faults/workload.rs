//! The seeded workload: claims created, attached, detached, grown, moved to another
//! VolumeAttributesClass, snapshotted and deleted, some deleted while still being provisioned,
//! snapshots deleted (some while being cut), group snapshots of a few claims taken and deleted
//! (their claims kept meanwhile), with a model of what should exist once everything
//! settles.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::json;
use testkit::rng::Rng;

use crate::faults::verdict::Expectation;

/// One claim of the workload: its attachment, if any, and its requested size in MiB.
struct Claim {
    name: String,
    attachment: Option<(String, String)>,
    mebibytes: u64,
    /// The kept VolumeGroupSnapshots it is a member of: it is not deleted while there are any.
    groups: Vec<String>,
}

/// Counts of what the workload did.
#[derive(Debug, Default)]
pub struct Operations {
    pub created: u64,
    pub deleted_while_creating: u64,
    pub deleted: u64,
    pub attached: u64,
    pub detached: u64,
    pub resized: u64,
    pub modified: u64,
    pub snapshotted: u64,
    pub snapshots_deleted: u64,
    pub group_snapshotted: u64,
    pub group_snapshots_deleted: u64,
}

impl Operations {
    pub fn total(&self) -> u64 {
        self.created
            + self.deleted_while_creating
            + self.deleted
            + self.attached
            + self.detached
            + self.resized
            + self.modified
            + self.snapshotted
            + self.snapshots_deleted
            + self.group_snapshotted
            + self.group_snapshots_deleted
    }
}

pub struct Workload {
    pvcs: Api<PersistentVolumeClaim>,
    vas: Api<VolumeAttachment>,
    volume_snapshots: Api<DynamicObject>,
    /// The VolumeSnapshotClass of the snapshots.
    snapshot_class: String,
    /// The VolumeSnapshots that are kept.
    snapshots: Vec<String>,
    group_snapshots: Api<DynamicObject>,
    /// The VolumeGroupSnapshotClass of the group snapshots.
    group_class: Option<String>,
    /// The VolumeGroupSnapshots that are kept.
    groups: Vec<String>,
    namespace: String,
    class: String,
    driver: String,
    /// Node names the attachments go to, with the driver's node ids.
    nodes: BTreeMap<String, String>,
    /// The VolumeAttributesClasses claims are moved between.
    classes: Vec<String>,
    claims: Vec<Claim>,
    next: u64,
    pub ops: Operations,
}

/// How long one request of the workload is retried (the API server may be unreachable).
const RETRY_FOR: Duration = Duration::from_secs(60);

/// Runs `request` until it succeeds or answers in a way `done` accepts as success.
async fn persist<T, F, Fut>(what: &str, done: impl Fn(&kube::Error) -> bool, mut request: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = Instant::now() + RETRY_FOR;
    loop {
        match request().await {
            Ok(_) => return,
            Err(e) if done(&e) => return,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "the workload could not {what} within {RETRY_FOR:?}: {e}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn code_is(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// The classes of the workload's snapshots and group snapshots (`None`: the cluster's
/// snapshot-controller does not handle group snapshots, and the workload takes none).
pub struct SnapshotClasses<'a> {
    pub single: &'a str,
    pub group: Option<&'a str>,
}

impl Workload {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        class: &str,
        driver: &str,
        nodes: BTreeMap<String, String>,
        classes: Vec<String>,
        snapshot_classes: SnapshotClasses<'_>,
    ) -> Self {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshot"),
            "volumesnapshots",
        );
        let group_resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("groupsnapshot.storage.k8s.io", "v1", "VolumeGroupSnapshot"),
            "volumegroupsnapshots",
        );
        Self {
            group_snapshots: Api::namespaced_with(client.clone(), namespace, &group_resource),
            group_class: snapshot_classes.group.map(str::to_string),
            groups: Vec::new(),
            pvcs: Api::namespaced(client.clone(), namespace),
            volume_snapshots: Api::namespaced_with(client.clone(), namespace, &resource),
            snapshot_class: snapshot_classes.single.to_string(),
            snapshots: Vec::new(),
            vas: Api::all(client),
            namespace: namespace.to_string(),
            class: class.to_string(),
            driver: driver.to_string(),
            nodes,
            classes,
            claims: Vec::new(),
            next: 0,
            ops: Operations::default(),
        }
    }

    /// One random operation.
    pub async fn step(&mut self, rng: &mut Rng) {
        match rng.below(100) {
            0..30 => self.create(rng).await,
            30..47 => self.attach(rng).await,
            47..59 => self.detach(rng).await,
            59..68 => self.resize(rng).await,
            68..74 => self.modify(rng).await,
            74..80 => self.snapshot(rng).await,
            80..84 => self.delete_snapshot(rng).await,
            84..89 if self.group_class.is_none() => self.snapshot(rng).await,
            84..87 => self.group_snapshot(rng).await,
            87..89 => self.delete_group_snapshot(rng).await,
            _ => self.delete(rng).await,
        }
    }

    async fn create(&mut self, rng: &mut Rng) {
        self.next += 1;
        let name = format!("claim-{}", self.next);
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": self.class,
                "resources": {"requests": {"storage": "1Mi"}},
            },
        }))
        .expect("a valid claim");
        let (pvcs, post) = (self.pvcs.clone(), PostParams::default());
        persist(
            "create a claim",
            |e| code_is(e, 409),
            || pvcs.create(&post, &claim),
        )
        .await;
        if rng.chance(10) {
            // Gone again while the provisioner may be creating its volume.
            tokio::time::sleep(Duration::from_millis(rng.below(50))).await;
            self.delete_claim(&name).await;
            self.ops.deleted_while_creating += 1;
        } else {
            self.claims.push(Claim {
                name,
                attachment: None,
                mebibytes: 1,
                groups: Vec::new(),
            });
            self.ops.created += 1;
        }
    }

    /// Attaches a bound claim that has no attachment to a random node.
    async fn attach(&mut self, rng: &mut Rng) {
        let free: Vec<usize> = (0..self.claims.len())
            .filter(|i| self.claims[*i].attachment.is_none())
            .collect();
        let Some(&index) = rng.pick(&free) else {
            return;
        };
        let Ok(pvc) = self.pvcs.get(&self.claims[index].name).await else {
            return;
        };
        let Some(pv) = pvc.spec.and_then(|s| s.volume_name) else {
            return; // Not bound yet; a later step may attach it.
        };
        let nodes: Vec<&String> = self.nodes.keys().collect();
        let Some(node) = rng.pick(&nodes).map(|n| n.to_string()) else {
            return;
        };
        self.next += 1;
        let name = format!(
            "{}-va-{}-{}",
            self.namespace, self.claims[index].name, self.next
        );
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "attacher": self.driver,
                "nodeName": node,
                "source": {"persistentVolumeName": pv},
            },
        }))
        .expect("a valid VolumeAttachment");
        let (vas, post) = (self.vas.clone(), PostParams::default());
        persist(
            "create a VolumeAttachment",
            |e| code_is(e, 409),
            || vas.create(&post, &va),
        )
        .await;
        self.claims[index].attachment = Some((name, node));
        self.ops.attached += 1;
    }

    /// A random claim that is bound (of a few picks): the API server refuses to grow or
    /// re-class others.
    async fn bound_claim(&self, rng: &mut Rng) -> Option<usize> {
        for _ in 0..4 {
            if self.claims.is_empty() {
                return None;
            }
            let index = rng.below(self.claims.len() as u64) as usize;
            let Ok(pvc) = self.pvcs.get(&self.claims[index].name).await else {
                continue;
            };
            if pvc.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                return Some(index);
            }
        }
        None
    }

    /// Asks for 1 to 3 MiB more for a random bound claim.
    async fn resize(&mut self, rng: &mut Rng) {
        let Some(index) = self.bound_claim(rng).await else {
            return;
        };
        let mebibytes = self.claims[index].mebibytes + rng.between(1, 3);
        let patch = Patch::Merge(
            json!({"spec": {"resources": {"requests": {"storage": format!("{mebibytes}Mi")}}}}),
        );
        let (pvcs, params, name) = (
            self.pvcs.clone(),
            PatchParams::default(),
            self.claims[index].name.clone(),
        );
        persist(
            "grow a claim",
            |_| false,
            || pvcs.patch(&name, &params, &patch),
        )
        .await;
        self.claims[index].mebibytes = mebibytes;
        self.ops.resized += 1;
    }

    /// Moves a random bound claim to one of the VolumeAttributesClasses.
    async fn modify(&mut self, rng: &mut Rng) {
        let Some(index) = self.bound_claim(rng).await else {
            return;
        };
        let Some(class) = rng.pick(&self.classes).cloned() else {
            return;
        };
        let patch = Patch::Merge(json!({"spec": {"volumeAttributesClassName": class}}));
        let (pvcs, params, name) = (
            self.pvcs.clone(),
            PatchParams::default(),
            self.claims[index].name.clone(),
        );
        persist(
            "change a claim's class",
            |_| false,
            || pvcs.patch(&name, &params, &patch),
        )
        .await;
        self.ops.modified += 1;
    }

    /// A VolumeSnapshot of a random bound claim; sometimes deleted again at once, while its
    /// snapshot may be being cut.
    async fn snapshot(&mut self, rng: &mut Rng) {
        let Some(index) = self.bound_claim(rng).await else {
            return;
        };
        self.next += 1;
        let name = format!("snap-{}", self.next);
        let snapshot: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name},
            "spec": {"volumeSnapshotClassName": self.snapshot_class,
                     "source": {"persistentVolumeClaimName": self.claims[index].name}},
        }))
        .expect("a valid VolumeSnapshot");
        let (api, post) = (self.volume_snapshots.clone(), PostParams::default());
        persist(
            "create a VolumeSnapshot",
            |e| code_is(e, 409),
            || api.create(&post, &snapshot),
        )
        .await;
        self.ops.snapshotted += 1;
        if rng.chance(15) {
            tokio::time::sleep(Duration::from_millis(rng.below(100))).await;
            self.delete_volume_snapshot(&name).await;
            self.ops.snapshots_deleted += 1;
        } else {
            // Kept: its claim may be deleted later, so its content must exist first (a snapshot
            // whose claim is gone before its snapshot-controller made its content can never be
            // ready; upstream's, throttled at 5 QPS, takes a while to make it).
            self.until_snapshot_bound(&name).await;
            self.snapshots.push(name);
        }
    }

    /// Waits (bounded) until the VolumeSnapshot names its content.
    async fn until_snapshot_bound(&self, name: &str) {
        let deadline = Instant::now() + RETRY_FOR;
        while Instant::now() < deadline {
            if let Ok(snapshot) = self.volume_snapshots.get(name).await
                && snapshot.data["status"]["boundVolumeSnapshotContentName"].is_string()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("VolumeSnapshot {name} was not bound to a content within {RETRY_FOR:?}");
    }

    async fn delete_snapshot(&mut self, rng: &mut Rng) {
        if self.snapshots.is_empty() {
            return;
        }
        let name = self
            .snapshots
            .swap_remove(rng.below(self.snapshots.len() as u64) as usize);
        self.delete_volume_snapshot(&name).await;
        self.ops.snapshots_deleted += 1;
    }

    /// A VolumeGroupSnapshot of one to three bound claims (labelled for its selector);
    /// sometimes deleted again at once, while it may be being cut.
    async fn group_snapshot(&mut self, rng: &mut Rng) {
        let Some(class) = self.group_class.clone() else {
            return;
        };
        let mut members = Vec::new();
        for _ in 0..3 {
            if let Some(index) = self.bound_claim(rng).await
                && !members.contains(&index)
            {
                members.push(index);
            }
        }
        if members.is_empty() {
            return;
        }
        self.next += 1;
        let name = format!("group-{}", self.next);
        for &index in &members {
            let patch = Patch::Merge(json!({"metadata": {"labels": {name.as_str(): "member"}}}));
            let (pvcs, params, claim) = (
                self.pvcs.clone(),
                PatchParams::default(),
                self.claims[index].name.clone(),
            );
            persist(
                "label a claim for a group snapshot",
                |_| false,
                || pvcs.patch(&claim, &params, &patch),
            )
            .await;
        }
        let group: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "groupsnapshot.storage.k8s.io/v1", "kind": "VolumeGroupSnapshot",
            "metadata": {"name": name},
            "spec": {"volumeGroupSnapshotClassName": class,
                     "source": {"selector": {"matchLabels": {name.as_str(): "member"}}}},
        }))
        .expect("a valid VolumeGroupSnapshot");
        let (api, post) = (self.group_snapshots.clone(), PostParams::default());
        persist(
            "create a VolumeGroupSnapshot",
            |e| code_is(e, 409),
            || api.create(&post, &group),
        )
        .await;
        self.ops.group_snapshotted += 1;
        if rng.chance(15) {
            // Deleted while it may be being cut, but only once bound (see `until_bound`): no
            // sidecar can see a content its snapshot-controller left behind.
            self.until_bound(&name).await;
            self.delete_volume_group_snapshot(&name).await;
            self.ops.group_snapshots_deleted += 1;
        } else {
            for &index in &members {
                self.claims[index].groups.push(name.clone());
            }
            self.groups.push(name);
        }
    }

    /// Waits until the group's status names its content and the group has its bound finalizer
    /// (bounded: the controller may be slow, never stopped by the faults, which hit the sidecars
    /// and the driver). Upstream's snapshot-controller leaves the content of a group deleted
    /// before that behind.
    async fn until_bound(&self, name: &str) {
        let deadline = Instant::now() + RETRY_FOR;
        while Instant::now() < deadline {
            if let Ok(group) = self.group_snapshots.get(name).await
                && group.data["status"]["boundVolumeGroupSnapshotContentName"].is_string()
                && group.metadata.finalizers.iter().flatten().any(|f| {
                    f == "groupsnapshot.storage.kubernetes.io/volumegroupsnapshot-bound-protection"
                })
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("VolumeGroupSnapshot {name} was not bound to a content within {RETRY_FOR:?}");
    }

    async fn delete_group_snapshot(&mut self, rng: &mut Rng) {
        if self.groups.is_empty() {
            return;
        }
        let name = self
            .groups
            .swap_remove(rng.below(self.groups.len() as u64) as usize);
        self.until_bound(&name).await;
        self.delete_volume_group_snapshot(&name).await;
        for claim in &mut self.claims {
            claim.groups.retain(|g| g != &name);
        }
        self.ops.group_snapshots_deleted += 1;
    }

    async fn delete_volume_group_snapshot(&self, name: &str) {
        let (api, params) = (self.group_snapshots.clone(), DeleteParams::default());
        persist(
            "delete a VolumeGroupSnapshot",
            |e| code_is(e, 404),
            || api.delete(name, &params),
        )
        .await;
    }

    async fn delete_volume_snapshot(&self, name: &str) {
        let (api, params) = (self.volume_snapshots.clone(), DeleteParams::default());
        persist(
            "delete a VolumeSnapshot",
            |e| code_is(e, 404),
            || api.delete(name, &params),
        )
        .await;
    }

    async fn detach(&mut self, rng: &mut Rng) {
        let attached: Vec<usize> = (0..self.claims.len())
            .filter(|i| self.claims[*i].attachment.is_some())
            .collect();
        let Some(&index) = rng.pick(&attached) else {
            return;
        };
        if let Some((va, _)) = self.claims[index].attachment.take() {
            self.delete_attachment(&va).await;
            self.ops.detached += 1;
        }
    }

    /// Deletes a claim (none a kept group snapshot holds); an attached one loses its attachment
    /// first, as when its pod is gone.
    async fn delete(&mut self, rng: &mut Rng) {
        let free: Vec<usize> = (0..self.claims.len())
            .filter(|i| self.claims[*i].groups.is_empty())
            .collect();
        let Some(&index) = rng.pick(&free) else {
            return;
        };
        let claim = self.claims.swap_remove(index);
        if let Some((va, _)) = claim.attachment {
            self.delete_attachment(&va).await;
            self.ops.detached += 1;
        }
        self.delete_claim(&claim.name).await;
        self.ops.deleted += 1;
    }

    async fn delete_claim(&self, name: &str) {
        let (pvcs, params) = (self.pvcs.clone(), DeleteParams::default());
        persist(
            "delete a claim",
            |e| code_is(e, 404),
            || pvcs.delete(name, &params),
        )
        .await;
    }

    async fn delete_attachment(&self, name: &str) {
        let (vas, params) = (self.vas.clone(), DeleteParams::default());
        persist(
            "delete a VolumeAttachment",
            |e| code_is(e, 404),
            || vas.delete(name, &params),
        )
        .await;
    }

    /// What should exist once everything has settled.
    pub fn expectation(&self) -> Expectation {
        Expectation {
            claims: self
                .claims
                .iter()
                .map(|c| format!("{}/{}", self.namespace, c.name))
                .collect(),
            attachments: self
                .claims
                .iter()
                .filter_map(|c| c.attachment.clone())
                .collect(),
            node_ids: self.nodes.clone(),
            snapshots: self
                .snapshots
                .iter()
                .map(|s| format!("{}/{s}", self.namespace))
                .collect(),
            groups: self
                .groups
                .iter()
                .map(|g| format!("{}/{g}", self.namespace))
                .collect(),
        }
    }

    pub fn driver(&self) -> &str {
        &self.driver
    }

    pub fn claims(&self) -> usize {
        self.claims.len()
    }
}
