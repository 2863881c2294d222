//! The cache: watch events in, projected objects and the keys to work on out. No I/O.
//!
//! It keeps the VolumeAttachments of this driver, the PersistentVolumes of this driver (or with
//! its finalizer), the driver's node ID of every CSINode, and which PV every VolumeAttachment
//! (of any driver) names. Objects written by the controller are stored from the write's response
//! ("write-through"), and watch events older than what is stored are ignored, so a worker never
//! acts on a state older than its own last write.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use sidecar_kit::migration;
use sidecar_kit::pipeline::views::PvView;
use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::values::version::ResourceVersion;

use crate::decide::{self, NodeLookup};
use crate::model::{self, NEEDS, Pv, Va, VaSource, csinode_node_id};

/// Lanes of the VolumeAttachment queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Lane {
    Attach = 0,
    Detach = 1,
}

impl Lane {
    pub const NAMES: [&'static str; 2] = ["attach", "detach"];

    pub fn of(va: &Va) -> Self {
        if va.deleting {
            Self::Detach
        } else {
            Self::Attach
        }
    }
}

/// A key to process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    Va { name: Arc<str>, lane: Lane },
    Pv(Arc<str>),
}

pub use sidecar_kit::pipeline::Change;
use sidecar_kit::pipeline::Relist;

/// A VolumeAttachment whose status disagrees with the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfSync {
    pub name: Arc<str>,
    pub lane: Lane,
    /// What the driver said: published to the node or not.
    pub published: bool,
}

/// How the PV of a VolumeAttachment was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PvLookup {
    /// The attachment names no PV.
    NotNamed,
    Cached(Box<Pv>),
    /// Not in the cache: not this driver's, or does not exist. The controller asks the API
    /// server, to tell the two apart in the error it reports.
    Uncached(String),
}

/// Everything a decision about one VolumeAttachment needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VaView {
    pub va: Va,
    pub pv: PvLookup,
    pub node: NodeLookup,
}

#[derive(Debug, Default)]
struct Relists {
    vas: Relist,
    pvs: Relist,
    nodes: Relist,
}

#[derive(Debug)]
pub struct Index {
    driver: String,
    finalizer: String,
    /// Names are shared, each held once for all the maps.
    vas: HashMap<Arc<str>, Va>,
    /// PV named by each VolumeAttachment of any driver.
    va_pvs: HashMap<Arc<str>, Arc<str>>,
    /// VolumeAttachments (of any driver) naming each PV.
    pv_refs: HashMap<Arc<str>, HashSet<Arc<str>>>,
    /// The process's shared views of the PVs; the attacher's [`Pv`] is projected on reading.
    pvs: ViewTable<PvView>,
    /// This driver's node ID in each CSINode (`None`: the driver is not registered there).
    nodes: HashMap<String, Option<String>>,
    relist: Relists,
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// Whether a change carrying `candidate` is older than (or the same as) what is stored.
fn stale(candidate: &str, stored: &str) -> bool {
    model::newer(candidate, stored) == Some(false)
}

/// [`stale`] for a cached view: the same version, or an older one.
fn stale_view(candidate: &ResourceVersion, stored: &ResourceVersion) -> bool {
    candidate == stored || candidate.is_older_than(stored)
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            finalizer: model::finalizer_name(driver),
            vas: HashMap::new(),
            va_pvs: HashMap::new(),
            pv_refs: HashMap::new(),
            pvs: ViewTable::new(|p| &p.name),
            nodes: HashMap::new(),
            relist: Relists::default(),
        }
    }

    pub fn va_count(&self) -> usize {
        self.vas.len()
    }

    pub fn pv_count(&self) -> usize {
        self.pvs.len()
    }

    // --- VolumeAttachments ---

    pub fn va_event(&mut self, change: Change<&VolumeAttachment>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(va) => self.apply_va(va, &mut work),
            Change::Delete(va) => self.remove_va(&name_of(&va.metadata), &mut work),
            Change::Relist => self.relist.vas.start(),
            Change::Listed(va) => {
                self.relist.vas.saw(name_of(&va.metadata));
                self.apply_va(va, &mut work);
            }
            Change::Relisted => {
                let known = self.va_pvs.keys().chain(self.vas.keys());
                for name in self.relist.vas.finish(known) {
                    self.remove_va(&name, &mut work);
                }
            }
        }
        work
    }

    fn apply_va(&mut self, api: &VolumeAttachment, work: &mut Vec<Work>) {
        let name = self.shared_va_name(&name_of(&api.metadata));
        self.link_pv(&name, api.spec.source.persistent_volume_name.as_deref());
        if api.spec.attacher != self.driver {
            return;
        }
        let va = Va {
            name: name.clone(),
            ..Va::from_api(api)
        };
        if let Some(old) = self.vas.get(&va.name) {
            if stale(&va.resource_version, &old.resource_version) {
                return;
            }
            // Only error fields changed, or our own finalizer and node-id annotation added:
            // most likely our own writes, which must not cut the backoff short.
            if old.same_but_our_additions(&va, &self.finalizer) {
                self.vas.insert(name, va);
                return;
            }
        }
        work.push(Work::Va {
            name: name.clone(),
            lane: Lane::of(&va),
        });
        self.vas.insert(name, va);
    }

    /// The name of VolumeAttachment `name` as the maps already hold it, else a new one.
    fn shared_va_name(&self, name: &str) -> Arc<str> {
        match self.va_pvs.get_key_value(name) {
            Some((shared, _)) => shared.clone(),
            None => match self.vas.get_key_value(name) {
                Some((shared, _)) => shared.clone(),
                None => name.into(),
            },
        }
    }

    fn link_pv(&mut self, va: &Arc<str>, pv: Option<&str>) {
        let old = match pv {
            Some(pv) => {
                let pv = match self.pv_refs.get_key_value(pv) {
                    Some((shared, _)) => shared.clone(),
                    None => pv.into(),
                };
                self.va_pvs.insert(va.clone(), pv)
            }
            None => self.va_pvs.remove(va),
        };
        if old.as_deref() == pv {
            return;
        }
        if let Some(old) = old {
            self.unref_pv(&old, va);
        }
        if let Some(pv) = self.va_pvs.get(va) {
            self.pv_refs
                .entry(pv.clone())
                .or_default()
                .insert(va.clone());
        }
    }

    fn unref_pv(&mut self, pv: &str, va: &str) {
        if let Some(refs) = self.pv_refs.get_mut(pv) {
            refs.remove(va);
            if refs.is_empty() {
                self.pv_refs.remove(pv);
            }
        }
    }

    fn remove_va(&mut self, name: &str, work: &mut Vec<Work>) {
        self.vas.remove(name);
        if let Some(pv) = self.va_pvs.remove(name) {
            self.unref_pv(&pv, name);
            // Its PV may be waiting for the last attachment to go to lose our finalizer.
            work.push(Work::Pv(pv));
        }
    }

    /// Stores a VolumeAttachment returned by a write, unless the cache already has a newer one.
    /// A write never brings back an attachment the watch reported deleted meanwhile, and one
    /// being deleted without finalizers is gone: the watch's DELETED event does the rest.
    pub fn store_va(&mut self, api: &VolumeAttachment) {
        let va = Va::from_api(api);
        let Some(old) = self.vas.get(&va.name) else {
            return;
        };
        if va.attacher != self.driver || stale(&va.resource_version, &old.resource_version) {
            return;
        }
        if va.deleting && va.finalizers.is_empty() {
            self.vas.remove(&va.name);
            return;
        }
        self.vas.insert(va.name.clone(), va);
    }

    // --- PersistentVolumes ---

    pub fn pv_event(&mut self, change: Change<&Arc<PvView>>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(pv) => self.apply_pv(pv, &mut work),
            Change::Delete(pv) => {
                self.pvs.remove(&pv.name);
            }
            Change::Relist => self.relist.pvs.start(),
            Change::Listed(pv) => {
                self.relist.pvs.saw(pv.name.clone());
                self.apply_pv(pv, &mut work);
            }
            Change::Relisted => {
                for name in self.relist.pvs.finish(self.pvs.keys()) {
                    self.pvs.remove(&name);
                }
            }
        }
        work
    }

    fn apply_pv(&mut self, view: &Arc<PvView>, work: &mut Vec<Work>) {
        let old = self.pvs.get(&view.name);
        if let Some(old) = old
            && stale_view(&view.resource_version, &old.resource_version)
        {
            return;
        }
        let pv = Pv::from_view(view);
        if !pv.concerns(&self.driver, &self.finalizer) {
            self.pvs.remove(&view.name);
            return;
        }
        // Compared on the views, what the attacher's spec is made of (in a shared view, a
        // change of what only other controllers read just retries waiting attachments).
        let changed_spec = old.is_none_or(|old| {
            old.csi != view.csi
                || old.access_modes != view.access_modes
                || old.volume_mode != view.volume_mode
                || old.mount_options != view.mount_options
                || old.in_tree != view.in_tree
        });
        if decide::pv_needs_processing(&pv, &self.driver, &self.finalizer) {
            work.push(Work::Pv(view.name.clone()));
        }
        if changed_spec {
            // Attachments that failed for want of this PV can go on now.
            work.extend(self.waiting_on_pv(&pv.name));
        }
        self.pvs.insert(view.clone());
    }

    fn waiting_on_pv(&self, pv: &str) -> Vec<Work> {
        self.pv_refs
            .get(pv)
            .into_iter()
            .flatten()
            .filter_map(|name| self.vas.get(name))
            .filter(|va| !va.attached && !va.deleting)
            .map(|va| Work::Va {
                name: va.name.clone(),
                lane: Lane::Attach,
            })
            .collect()
    }

    /// Stores a PersistentVolume returned by a write (or a read), unless a newer one is cached.
    pub fn store_pv(&mut self, api: &PersistentVolume) {
        let view = PvView::from_api(api, NEEDS);
        if let Some(old) = self.pvs.get(&view.name)
            && stale_view(&view.resource_version, &old.resource_version)
        {
            return;
        }
        let pv = Pv::from_view(&view);
        // Being deleted without finalizers: the write completed the deletion.
        let gone = pv.deleting && pv.finalizers.is_empty();
        if !gone && pv.concerns(&self.driver, &self.finalizer) {
            self.pvs.insert(Arc::new(view));
        } else {
            self.pvs.remove(&view.name);
        }
    }

    // --- CSINodes ---

    pub fn csinode_event(&mut self, change: Change<&CSINode>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(node) => self.apply_node(node, &mut work),
            Change::Delete(node) => {
                self.nodes.remove(&name_of(&node.metadata));
            }
            Change::Relist => self.relist.nodes.start(),
            Change::Listed(node) => {
                self.relist.nodes.saw(name_of(&node.metadata));
                self.apply_node(node, &mut work);
            }
            Change::Relisted => {
                for name in self.relist.nodes.finish(self.nodes.keys()) {
                    self.nodes.remove(&name);
                }
            }
        }
        work
    }

    fn apply_node(&mut self, node: &CSINode, work: &mut Vec<Work>) {
        let name = name_of(&node.metadata);
        let id = csinode_node_id(node, &self.driver);
        let changed = self.nodes.get(&name) != Some(&id);
        if changed && id.is_some() {
            // Attachments that failed because the driver had not registered on the node yet.
            work.extend(
                self.vas
                    .values()
                    .filter(|va| va.node_name == name && !va.attached && !va.deleting)
                    .map(|va| Work::Va {
                        name: va.name.clone(),
                        lane: Lane::Attach,
                    }),
            );
        }
        self.nodes.insert(name, id);
    }

    // --- Views for the workers ---

    pub fn node_lookup(&self, node: &str) -> NodeLookup {
        match self.nodes.get(node) {
            None => NodeLookup::NoCsiNode,
            Some(None) => NodeLookup::DriverMissing,
            Some(Some(id)) => NodeLookup::Found(id.clone()),
        }
    }

    pub fn va_view(&self, name: &str) -> Option<VaView> {
        let va = self.vas.get(name)?;
        let pv = match &va.source {
            VaSource::Pv(pv) => match self.pvs.get(pv.as_str()) {
                Some(cached) => PvLookup::Cached(Box::new(Pv::from_view(cached))),
                None => PvLookup::Uncached(pv.clone()),
            },
            _ => PvLookup::NotNamed,
        };
        Some(VaView {
            va: va.clone(),
            pv,
            node: self.node_lookup(&va.node_name),
        })
    }

    /// A PersistentVolume and whether any VolumeAttachment still names it.
    pub fn pv_view(&self, name: &str) -> Option<(Pv, bool)> {
        let pv = self.pvs.get(name)?;
        let referenced = self.pv_refs.get(name).is_some_and(|refs| !refs.is_empty());
        Some((Pv::from_view(pv), referenced))
    }

    /// Every key, as an informer resync delivers them.
    pub fn resync(&self) -> Vec<Work> {
        let vas = self.vas.values().map(|va| Work::Va {
            name: va.name.clone(),
            lane: Lane::of(va),
        });
        let pvs = self
            .pvs
            .values()
            .filter(|view| {
                let pv = Pv::from_view(view);
                decide::pv_needs_processing(&pv, &self.driver, &self.finalizer)
            })
            .map(|view| Work::Pv(view.name.clone()));
        vas.chain(pvs).collect()
    }

    /// VolumeAttachments whose `attached` status disagrees with the driver's published node IDs
    /// (`published`: volume ID → node IDs). Attachments whose volume or node ID is unknown are
    /// skipped, as upstream skips them, and so are deleted ones we already detached.
    pub fn out_of_sync(&self, published: &HashMap<String, Vec<String>>) -> Vec<OutOfSync> {
        let mut found = Vec::new();
        for va in self.vas.values() {
            if va.deleting && !va.has_finalizer(&self.finalizer) {
                continue;
            }
            let node_id = match (self.node_lookup(&va.node_name), &va.node_id_annotation) {
                (NodeLookup::Found(id), _) => id,
                (_, Some(id)) => id.clone(),
                _ => continue,
            };
            let (driver, handle, migrated) = match &va.source {
                VaSource::Pv(pv) => match self.pvs.get(pv.as_str()).and_then(|pv| {
                    let migrated = pv.in_tree.is_some();
                    pv.csi
                        .as_ref()
                        .map(|csi| (&*csi.driver, &*csi.volume_handle, migrated))
                }) {
                    Some(found) => found,
                    None => continue,
                },
                // Inline specs in VolumeAttachments come from migrated inline volumes.
                VaSource::Inline(spec) => match spec.csi.as_ref() {
                    Some(csi) => (
                        csi.driver.as_str(),
                        csi.volume_handle.as_str(),
                        migration::is_migrated_csi_driver(&csi.driver),
                    ),
                    None => continue,
                },
                _ => continue,
            };
            // A migrated volume's handle as the driver lists it; skipped if it cannot be known.
            let volume_id = if migrated {
                match migration::repair_volume_handle(driver, handle, &node_id) {
                    Ok(handle) => handle,
                    Err(_) => continue,
                }
            } else {
                handle.to_string()
            };
            if decide::out_of_sync(va.attached, &volume_id, &node_id, published) {
                found.push(OutOfSync {
                    name: va.name.clone(),
                    lane: Lane::of(va),
                    published: !va.attached,
                });
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DRIVER: &str = "hostpath.csi.k8s.io";
    const FINALIZER: &str = "external-attacher/hostpath-csi-k8s-io";

    fn va(name: &str, rv: &str, extra: serde_json::Value) -> VolumeAttachment {
        let mut base = json!({
            "metadata": {"name": name, "resourceVersion": rv},
            "spec": {"attacher": DRIVER, "nodeName": "node-1", "source": {"persistentVolumeName": "pv-1"}},
        });
        merge(&mut base, &extra);
        serde_json::from_value(base).unwrap()
    }

    fn pv(rv: &str, extra: serde_json::Value) -> PersistentVolume {
        let mut base = json!({
            "metadata": {"name": "pv-1", "resourceVersion": rv},
            "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": DRIVER, "volumeHandle": "vol-1"}},
        });
        merge(&mut base, &extra);
        serde_json::from_value(base).unwrap()
    }

    fn view(pv: &PersistentVolume) -> Arc<PvView> {
        Arc::new(PvView::from_api(pv, NEEDS))
    }

    fn csinode(name: &str, drivers: serde_json::Value) -> CSINode {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}))
            .unwrap()
    }

    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
            (t, p) => *t = p.clone(),
        }
    }

    #[test]
    fn reconciling_migrated_gce_volumes_compares_repaired_handles() {
        const GCE: &str = "pd.csi.storage.gke.io";
        let mut index = Index::new(GCE);
        let node = csinode(
            "node-1",
            json!([{"name": GCE, "nodeID": "projects/p-1/zones/us-central1-a/instances/vm-1"}]),
        );
        index.csinode_event(Change::Apply(&node));
        let in_tree: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "resourceVersion": "1"},
            "spec": {"accessModes": ["ReadWriteOnce"], "gcePersistentDisk": {"pdName": "disk-1"}},
        }))
        .unwrap();
        index.pv_event(Change::Apply(&view(&in_tree)));
        let attached = va(
            "va-1",
            "1",
            json!({"spec": {"attacher": GCE}, "status": {"attached": true}}),
        );
        index.va_event(Change::Apply(&attached));

        let listed: HashMap<String, Vec<String>> = [(
            "projects/p-1/zones/us-central1-a/disks/disk-1".to_string(),
            vec!["projects/p-1/zones/us-central1-a/instances/vm-1".to_string()],
        )]
        .into();
        assert_eq!(index.out_of_sync(&listed), []);
        let unpublished = HashMap::new();
        assert_eq!(
            index.out_of_sync(&unpublished),
            [OutOfSync {
                name: "va-1".into(),
                lane: Lane::Attach,
                published: false
            }]
        );
        // A node ID the handle cannot be repaired from: skipped, as upstream skips it.
        let node = csinode("node-1", json!([{"name": GCE, "nodeID": "vm-1"}]));
        index.csinode_event(Change::Apply(&node));
        assert_eq!(index.out_of_sync(&unpublished), []);
    }

    #[test]
    fn in_tree_pvs_whose_migration_was_rolled_back_are_queued() {
        const EBS: &str = "ebs.csi.aws.com";
        let mut index = Index::new(EBS);
        let finalizer = model::finalizer_name(EBS);
        let migrated = json!({"metadata": {"name": "pv-1", "resourceVersion": "1",
                "finalizers": [finalizer],
                "annotations": {"pv.kubernetes.io/migrated-to": EBS}},
            "spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}}});
        let migrated: PersistentVolume = serde_json::from_value(migrated).unwrap();
        assert_eq!(index.pv_event(Change::Apply(&view(&migrated))), []);
        assert_eq!(index.pv_count(), 1);
        let mut rolled_back = migrated.clone();
        rolled_back.metadata.resource_version = Some("2".into());
        rolled_back.metadata.annotations = None;
        assert_eq!(
            index.pv_event(Change::Apply(&view(&rolled_back))),
            [Work::Pv("pv-1".into())]
        );
        assert_eq!(index.resync(), [Work::Pv("pv-1".into())]);
    }

    fn attach(name: &str) -> Work {
        Work::Va {
            name: name.into(),
            lane: Lane::Attach,
        }
    }

    #[test]
    fn va_events_and_the_error_only_filter() {
        let mut index = Index::new(DRIVER);
        assert_eq!(
            index.va_event(Change::Apply(&va("a", "1", json!({})))),
            [attach("a")]
        );
        // Only an error was recorded: no work, but the cache follows.
        let errored = va(
            "a",
            "2",
            json!({"status": {"attached": false, "attachError": {"message": "x"}}}),
        );
        assert!(index.va_event(Change::Apply(&errored)).is_empty());
        assert!(index.va_view("a").unwrap().va.attach_error);
        // An older event is ignored entirely.
        assert!(
            index
                .va_event(Change::Apply(&va("a", "1", json!({}))))
                .is_empty()
        );
        assert!(index.va_view("a").unwrap().va.attach_error);
        // Deletion moves the key to the detach lane.
        let deleting = va(
            "a",
            "3",
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        );
        assert_eq!(
            index.va_event(Change::Apply(&deleting)),
            [Work::Va {
                name: "a".into(),
                lane: Lane::Detach
            }]
        );
        assert_eq!(
            index.va_event(Change::Delete(&deleting)),
            [Work::Pv("pv-1".into())]
        );
        assert!(index.va_view("a").is_none());
    }

    #[test]
    fn other_drivers_are_not_cached_but_their_pv_references_are() {
        let mut index = Index::new(DRIVER);
        index.pv_event(Change::Apply(&view(&pv("1", json!({})))));
        let other = va("o", "1", json!({"spec": {"attacher": "other.example.com"}}));
        assert!(index.va_event(Change::Apply(&other)).is_empty());
        assert!(index.va_view("o").is_none());
        assert!(
            index.pv_view("pv-1").unwrap().1,
            "referenced by another driver's VA"
        );
        assert_eq!(
            index.va_event(Change::Delete(&other)),
            [Work::Pv("pv-1".into())]
        );
        assert!(!index.pv_view("pv-1").unwrap().1);
    }

    #[test]
    fn write_through_wins_over_older_watch_events() {
        let mut index = Index::new(DRIVER);
        index.va_event(Change::Apply(&va("a", "5", json!({}))));
        index.store_va(&va("a", "7", json!({"status": {"attached": true}})));
        assert!(index.va_view("a").unwrap().va.attached);
        assert!(
            index
                .va_event(Change::Apply(&va("a", "6", json!({}))))
                .is_empty()
        );
        assert!(
            index
                .va_event(Change::Apply(&va(
                    "a",
                    "7",
                    json!({"status": {"attached": true}})
                )))
                .is_empty()
        );
        assert!(index.va_view("a").unwrap().va.attached);
    }

    #[test]
    fn writes_never_bring_back_deleted_objects() {
        let mut index = Index::new(DRIVER);
        let deleting = json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z",
                                           "finalizers": [FINALIZER]}});
        index.va_event(Change::Apply(&va("a", "5", deleting.clone())));
        // The finalizer removal's response arrives after the watch reported the deletion.
        let last = va(
            "a",
            "6",
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        );
        assert_eq!(
            index.va_event(Change::Delete(&last)),
            [Work::Pv("pv-1".into())]
        );
        index.store_va(&last);
        assert_eq!(index.va_view("a"), None);
        assert_eq!(index.va_count(), 0);

        // The other order: the response completes the deletion before the event.
        index.va_event(Change::Apply(&va("b", "5", deleting)));
        index.store_va(&va(
            "b",
            "6",
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        ));
        assert_eq!(index.va_view("b"), None);
        assert_eq!(
            index.va_event(Change::Delete(&va("b", "6", json!({})))),
            [Work::Pv("pv-1".into())],
            "the PV still learns that the attachment is gone"
        );

        index.pv_event(Change::Apply(&view(&pv(
            "1",
            json!({"metadata": {"finalizers": [FINALIZER]}}),
        ))));
        assert_eq!(index.pv_count(), 1);
        index.store_pv(&pv(
            "2",
            json!({"metadata": {"deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        ));
        assert_eq!(index.pv_count(), 0);
    }

    #[test]
    fn relist_removes_what_is_gone() {
        let mut index = Index::new(DRIVER);
        index.va_event(Change::Apply(&va("a", "1", json!({}))));
        index.va_event(Change::Apply(&va("b", "1", json!({}))));
        index.va_event(Change::Relist);
        assert!(
            index
                .va_event(Change::Listed(&va("a", "1", json!({}))))
                .is_empty()
        );
        assert_eq!(index.va_event(Change::Relisted), [Work::Pv("pv-1".into())]);
        assert!(index.va_view("b").is_none());
        assert!(index.va_view("a").is_some());
    }

    #[test]
    fn pv_events() {
        let mut index = Index::new(DRIVER);
        index.va_event(Change::Apply(&va("a", "1", json!({}))));
        // A VA waiting for its PV is queued when the PV shows up.
        assert_eq!(
            index.pv_event(Change::Apply(&view(&pv("1", json!({}))))),
            [attach("a")]
        );
        // Our finalizer on a PV being deleted asks for processing.
        let deleting = pv(
            "2",
            json!({"metadata": {"finalizers": [FINALIZER], "deletionTimestamp": "2024-01-01T00:00:00Z"}}),
        );
        assert_eq!(
            index.pv_event(Change::Apply(&view(&deleting))),
            [Work::Pv("pv-1".into())]
        );
        let (cached, referenced) = index.pv_view("pv-1").unwrap();
        assert!(cached.deleting && referenced);
        // PVs of other drivers are not kept.
        let other = pv(
            "3",
            json!({"spec": {"csi": {"driver": "other"}}, "metadata": {"finalizers": null, "deletionTimestamp": null}}),
        );
        assert!(index.pv_event(Change::Apply(&view(&other))).is_empty());
        assert!(index.pv_view("pv-1").is_none());
        assert_eq!(
            index.va_view("a").unwrap().pv,
            PvLookup::Uncached("pv-1".into())
        );
    }

    #[test]
    fn csinodes_and_lookups() {
        let mut index = Index::new(DRIVER);
        index.va_event(Change::Apply(&va("a", "1", json!({}))));
        assert_eq!(index.va_view("a").unwrap().node, NodeLookup::NoCsiNode);
        assert!(
            index
                .csinode_event(Change::Apply(&csinode(
                    "node-1",
                    json!([{"name": "other", "nodeID": "x"}])
                )))
                .is_empty()
        );
        assert_eq!(index.va_view("a").unwrap().node, NodeLookup::DriverMissing);
        // The driver registering on the node releases the waiting attachment.
        let registered = csinode("node-1", json!([{"name": DRIVER, "nodeID": "nid-1"}]));
        assert_eq!(
            index.csinode_event(Change::Apply(&registered)),
            [attach("a")]
        );
        assert!(index.csinode_event(Change::Apply(&registered)).is_empty());
        assert_eq!(
            index.va_view("a").unwrap().node,
            NodeLookup::Found("nid-1".into())
        );
        index.csinode_event(Change::Delete(&registered));
        assert_eq!(index.va_view("a").unwrap().node, NodeLookup::NoCsiNode);
    }

    #[test]
    fn resync_and_reconcile() {
        let mut index = Index::new(DRIVER);
        index.pv_event(Change::Apply(&view(&pv("1", json!({})))));
        index.csinode_event(Change::Apply(&csinode(
            "node-1",
            json!([{"name": DRIVER, "nodeID": "nid-1"}]),
        )));
        index.va_event(Change::Apply(&va(
            "a",
            "1",
            json!({"status": {"attached": true}}),
        )));
        index.va_event(Change::Apply(&va(
            "b",
            "1",
            json!({"spec": {"source": {"persistentVolumeName": "missing"}}}),
        )));
        let mut all = index.resync();
        all.sort_by_key(|w| format!("{w:?}"));
        assert_eq!(all, [attach("a"), attach("b")]);

        let published: HashMap<String, Vec<String>> = HashMap::new();
        assert_eq!(
            index.out_of_sync(&published),
            [OutOfSync {
                name: "a".into(),
                lane: Lane::Attach,
                published: false
            }],
            "b's volume is unknown"
        );
        let published: HashMap<String, Vec<String>> =
            [("vol-1".to_string(), vec!["nid-1".to_string()])].into();
        assert!(index.out_of_sync(&published).is_empty());
    }
}
