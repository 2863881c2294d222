//! The cache: watch events in, projected objects and the keys to work on out. No I/O.
//!
//! It keeps every claim (bound ones as bare identities), the PersistentVolumes this driver is
//! responsible for, StorageClasses, the driver's topology keys per CSINode, Node labels, and
//! which PV each VolumeAttachment names. Objects written by the controller are stored from the
//! write's response, and watch events older than what is stored are ignored.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::pipeline::views::{ClaimView, PvView};
use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::pipeline::{Change, Relist};
use sidecar_kit::values::atom::Atom;
use sidecar_kit::values::shrink::ShrinkWhenSparse;

use crate::model::{self, Claim, Class, NEEDS, SourceKey, SourceKind, Volume};
use crate::sources::{Grant, ReferenceGrant, Snapshot, VolumeSnapshot};
use crate::topology::ClusterTopology;

/// A key to process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// A claim, by UID (shared with the claim's view).
    Claim(Arc<str>),
    /// A PersistentVolume, by name (shared with the PV's view).
    Volume(Arc<str>),
    /// A data source whose protection finalizer may be due for removal.
    Source(SourceKey),
}

#[derive(Debug, Default)]
struct Relists {
    claims: Relist,
    volumes: Relist,
    classes: Relist,
    csinodes: Relist,
    nodes: Relist,
    attachments: Relist,
    snapshots: Relist,
    grants: Relist,
}

#[derive(Debug)]
pub struct Index {
    driver: String,
    /// Distributed provisioning: the driver's topology on this node; PVs not accessible from
    /// it belong to other nodes.
    node_topology: Option<BTreeMap<String, String>>,
    /// The process's shared views of the claims, by UID; the provisioner's [`Claim`] is
    /// projected on reading.
    claims: ViewTable<ClaimView>,
    /// The process's shared views of the driver's PVs; the provisioner's [`Volume`] is
    /// projected on reading.
    volumes: ViewTable<PvView>,
    /// Whether the PVs have been listed: claims are worked on before (the PVs' list comes
    /// after theirs), and what `volumes` lacks until then is asked of the API server.
    volumes_listed: bool,
    /// Distributed provisioning: the volumes of `volumes` not accessible from this node (none
    /// otherwise).
    off_node: HashSet<Arc<str>>,
    classes: HashMap<String, Class>,
    /// The driver's topology keys per CSINode (empty: the driver is not registered there).
    csinodes: HashMap<String, Vec<String>>,
    nodes: HashMap<String, BTreeMap<String, String>>,
    /// VolumeAttachment name → the PV it names.
    attachments: HashMap<Arc<str>, Arc<str>>,
    /// By PV: the VolumeAttachments naming it and their nodes. Every PV's sync asks whether it
    /// is attached: a scan of all attachments each time was quadratic at start-up (100 000
    /// PVs × 10 000 attachments).
    attachments_by_pv: HashMap<Arc<str>, Vec<Attachment>>,
    /// The claims without a volume that name each snapshot or claim as their data source.
    by_source: HashMap<SourceKey, BTreeSet<Arc<str>>>,
    /// VolumeSnapshots by namespace and name, when they are watched.
    snapshots: HashMap<(String, String), Snapshot>,
    /// ReferenceGrants by namespace and name, when they are watched.
    grants: HashMap<(String, String), Grant>,
    relists: Relists,
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// A VolumeAttachment's name and node.
type Attachment = (Arc<str>, Arc<str>);

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            node_topology: None,
            claims: ViewTable::new(|c| &c.uid),
            volumes: ViewTable::new(|v| &v.name),
            volumes_listed: false,
            off_node: HashSet::new(),
            classes: HashMap::new(),
            csinodes: HashMap::new(),
            nodes: HashMap::new(),
            attachments: HashMap::new(),
            attachments_by_pv: HashMap::new(),
            by_source: HashMap::new(),
            snapshots: HashMap::new(),
            grants: HashMap::new(),
            relists: Relists::default(),
        }
    }

    /// Distributed provisioning: instead of watching Nodes and CSINodes, the index knows this
    /// node alone, with the topology its driver reports (as upstream does with fixed objects).
    pub fn for_node(driver: &str, node: &str, topology: Option<&BTreeMap<String, String>>) -> Self {
        let mut index = Self::new(driver);
        let labels = topology.cloned().unwrap_or_default();
        index
            .csinodes
            .insert(node.to_string(), labels.keys().cloned().collect());
        index.nodes.insert(node.to_string(), labels);
        index.node_topology = topology.cloned();
        index
    }

    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    pub fn claim(&self, uid: &str) -> Option<Claim> {
        self.claims.get(uid).map(|view| Claim::from_view(view))
    }

    pub fn class(&self, name: &str) -> Option<&Class> {
        self.classes.get(name)
    }

    pub fn volume(&self, name: &str) -> Option<Volume> {
        self.volumes.get(name).map(|view| Volume {
            on_this_node: !self.off_node.contains(name),
            ..Volume::from_view(view)
        })
    }

    /// The node of a VolumeAttachment naming `pv`, if any (the first by name of the nodes).
    pub fn attached_to(&self, pv: &str) -> Option<String> {
        let attachments = self.attachments_by_pv.get(pv)?;
        attachments
            .iter()
            .map(|(_, node)| node)
            .min()
            .map(|node| node.to_string())
    }

    fn link_attachment(&mut self, name: &str, (pv, node): (String, String)) {
        self.unlink_attachment(name);
        let name: Arc<str> = name.into();
        let pv: Arc<str> = pv.into();
        self.attachments_by_pv
            .entry(pv.clone())
            .or_default()
            .push((name.clone(), node.into()));
        self.attachments.insert(name, pv);
    }

    /// Forgets the VolumeAttachment `name`; the PV it named.
    fn unlink_attachment(&mut self, name: &str) -> Option<Arc<str>> {
        let pv = self.attachments.remove(name)?;
        if let Some(on_pv) = self.attachments_by_pv.get_mut(&pv) {
            on_pv.retain(|(va, _)| &**va != name);
            if on_pv.is_empty() {
                self.attachments_by_pv.remove(&pv);
            }
        }
        Some(pv)
    }

    /// Claims without a volume, whatever their class.
    pub fn pending_claims(&self) -> impl Iterator<Item = Claim> + '_ {
        self.pending_views().map(|view| Claim::from_view(view))
    }

    fn pending_views(&self) -> impl Iterator<Item = &Arc<ClaimView>> {
        self.claims.values().filter(|c| c.unbound.is_some())
    }

    /// The claim `namespace/name`. Claims are kept by UID, so this looks through them all; it
    /// is asked only for the sources of clones.
    pub fn claim_named(&self, namespace: &str, name: &str) -> Option<Claim> {
        self.claims
            .values()
            .find(|c| c.name() == name && c.namespace == namespace)
            .map(|view| Claim::from_view(view))
    }

    /// Whether a claim without a volume still names `source` as its data source.
    pub fn source_in_use(&self, source: &SourceKey) -> bool {
        self.by_source.get(source).is_some_and(|c| !c.is_empty())
    }

    pub fn snapshot(&self, namespace: &str, name: &str) -> Option<&Snapshot> {
        self.snapshots
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// The ReferenceGrants of `namespace`.
    pub fn grants_in<'a>(&'a self, namespace: &'a str) -> impl Iterator<Item = &'a Grant> {
        self.grants
            .values()
            .filter(move |g| g.namespace == namespace)
    }

    /// Snapshots that carry our finalizer although no claim waits for them any more.
    pub fn orphaned_snapshots(&self) -> Vec<Work> {
        self.snapshots
            .values()
            .filter(|s| s.protected)
            .map(|s| {
                (
                    SourceKind::Snapshot,
                    Atom::from(s.namespace.as_str()),
                    s.name.clone(),
                )
            })
            .filter(|key| !self.source_in_use(key))
            .map(Work::Source)
            .collect()
    }

    /// Every key, for a periodic resync.
    pub fn resync(&self) -> Vec<Work> {
        self.pending_views()
            .map(|c| Work::Claim(c.uid.clone()))
            .chain(self.volumes.keys().map(|n| Work::Volume(n.clone())))
            .collect()
    }

    // --- Claims ---

    pub fn claim_event(&mut self, change: Change<&Arc<ClaimView>>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(pvc) => self.apply_claim(pvc, &mut work),
            Change::Delete(pvc) => {
                let uid = pvc.uid.clone();
                self.remove_claim(&uid, &mut work);
                work.push(Work::Claim(uid));
            }
            Change::Relist => self.relists.claims.start(),
            Change::Listed(pvc) => {
                self.relists.claims.saw(pvc.uid.clone());
                self.apply_claim(pvc, &mut work);
            }
            Change::Relisted => {
                for uid in self.relists.claims.finish(self.claims.keys()) {
                    self.remove_claim(&uid, &mut work);
                    work.push(Work::Claim(uid));
                }
            }
        }
        // Claims created and deleted in a burst leave their table behind.
        self.claims.shrink_when_sparse();
        work
    }

    fn apply_claim(&mut self, view: &Arc<ClaimView>, work: &mut Vec<Work>) {
        let old = self.claims.get(&view.uid);
        if let Some(old) = old
            && view.resource_version.is_older_than(&old.resource_version)
        {
            return;
        }
        let claim = Claim::from_view(view);
        let old = old.map(|old| Claim::from_view(old));
        let old = old.as_ref();
        let old_source = old.and_then(Claim::source_key);
        let new_source = claim.source_key();
        let source_state = |c: &Claim| {
            (
                c.phase.clone(),
                c.deleting,
                c.volume_name.clone(),
                c.storage_class.clone(),
                c.request.clone(),
            )
        };
        let changed_as_source = old.is_none_or(|old| source_state(old) != source_state(&claim));
        if old_source != new_source {
            if let Some(key) = old_source {
                self.unlink(&key, &claim.uid);
                work.push(Work::Source(key));
            }
            if let Some(key) = &new_source {
                self.by_source
                    .entry(key.clone())
                    .or_default()
                    .insert(view.uid.clone());
            }
        }
        let as_source = (
            SourceKind::Claim,
            claim.namespace.clone(),
            claim.name.clone(),
        );
        if changed_as_source {
            // Its clones may be able to go on (or must report why not).
            self.requeue_users(&as_source, work);
        }
        if claim.deleting && claim.clone_protected {
            work.push(Work::Source(as_source));
        }
        if claim.pending.is_some() {
            work.push(Work::Claim(view.uid.clone()));
        }
        self.claims.insert(view.clone());
    }

    fn remove_claim(&mut self, uid: &str, work: &mut Vec<Work>) {
        let Some(view) = self.claims.remove(uid) else {
            return;
        };
        let claim = Claim::from_view(&view);
        if let Some(key) = claim.source_key() {
            self.unlink(&key, uid);
            work.push(Work::Source(key));
        }
        self.requeue_users(
            &(
                SourceKind::Claim,
                claim.namespace.clone(),
                claim.name.clone(),
            ),
            work,
        );
    }

    fn unlink(&mut self, key: &SourceKey, uid: &str) {
        if let Some(users) = self.by_source.get_mut(key) {
            users.remove(uid);
            if users.is_empty() {
                self.by_source.remove(key);
            }
        }
    }

    /// Queues the claims that wait for `source`.
    fn requeue_users(&self, source: &SourceKey, work: &mut Vec<Work>) {
        if let Some(users) = self.by_source.get(source) {
            work.extend(users.iter().cloned().map(Work::Claim));
        }
    }

    /// Stores a claim the controller wrote.
    pub fn store_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let mut ignored = Vec::new();
        if self
            .claims
            .contains_key(pvc.metadata.uid.as_deref().unwrap_or_default())
        {
            self.apply_claim(&Arc::new(ClaimView::from_api(pvc, NEEDS)), &mut ignored);
        }
    }

    // --- PersistentVolumes ---

    pub fn volume_event(&mut self, change: Change<&Arc<PvView>>) -> Vec<Work> {
        self.volume_change(change.map(|view| (view.clone(), true)))
    }

    /// [`volume_event`](Self::volume_event) for distributed provisioning, which needs the PVs'
    /// node affinity: the shared views do not keep it, as no other controller reads it.
    pub fn node_volume_event(&mut self, change: Change<&PersistentVolume>) -> Vec<Work> {
        let change =
            change.map(|pv| (Arc::new(PvView::from_api(pv, NEEDS)), self.on_this_node(pv)));
        self.volume_change(change)
    }

    fn on_this_node(&self, pv: &PersistentVolume) -> bool {
        crate::topology::volume_is_accessible(
            pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()),
            self.node_topology.as_ref(),
        )
    }

    /// Whether PV events must come with the node affinity ([`node_volume_event`]).
    ///
    /// [`node_volume_event`]: Self::node_volume_event
    pub fn distributed(&self) -> bool {
        self.node_topology.is_some()
    }

    fn volume_change(&mut self, change: Change<(Arc<PvView>, bool)>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply((view, on_this_node)) => self.apply_volume(view, on_this_node, &mut work),
            Change::Delete((view, _)) => self.forget_volume(&view.name),
            Change::Relist => self.relists.volumes.start(),
            Change::Listed((view, on_this_node)) => {
                self.relists.volumes.saw(view.name.clone());
                self.apply_volume(view, on_this_node, &mut work);
            }
            Change::Relisted => {
                for name in self.relists.volumes.finish(self.volumes.keys()) {
                    self.forget_volume(&name);
                }
                self.volumes_listed = true;
            }
        }
        self.volumes.shrink_when_sparse();
        self.off_node.shrink_when_sparse();
        work
    }

    fn forget_volume(&mut self, name: &str) {
        self.volumes.remove(name);
        self.off_node.remove(name);
    }

    fn apply_volume(&mut self, view: Arc<PvView>, on_this_node: bool, work: &mut Vec<Work>) {
        let volume = Volume::from_view(&view);
        // The driver's own volumes: to delete, and to clone from.
        if !volume.owned_by(&self.driver) && volume.driver != self.driver {
            self.forget_volume(&view.name);
            return;
        }
        if let Some(old) = self.volumes.get(&view.name)
            && view.resource_version.is_older_than(&old.resource_version)
        {
            return;
        }
        work.push(Work::Volume(view.name.clone()));
        if on_this_node {
            self.off_node.remove(&view.name);
        } else {
            self.off_node.insert(view.name.clone());
        }
        self.volumes.insert(view);
    }

    /// Stores a PV the controller created or patched. A patch of a PV the cache no longer holds
    /// (deleted meanwhile) does not bring it back. A list running meanwhile may have been
    /// answered before the write: the PV counts as listed, not as gone at the list's end.
    pub fn store_volume(&mut self, pv: &PersistentVolume, created: bool) {
        let name = name_of(&pv.metadata);
        if created || self.volumes.contains_key(name.as_str()) {
            self.relists.volumes.saw(name.as_str());
            let mut ignored = Vec::new();
            let on_this_node = self.on_this_node(pv);
            self.apply_volume(
                Arc::new(PvView::from_api(pv, NEEDS)),
                on_this_node,
                &mut ignored,
            );
        }
    }

    /// Whether a PV of that name exists (of this driver).
    pub fn has_volume(&self, name: &str) -> bool {
        self.volumes.contains_key(name)
    }

    /// Whether the PVs have been listed: until then, a PV [`has_volume`](Self::has_volume)
    /// does not know of may exist.
    pub fn volumes_listed(&self) -> bool {
        self.volumes_listed
    }

    /// A PV of this driver that names volume `handle`, if any.
    pub fn volume_with_handle(&self, handle: &str) -> Option<Volume> {
        let name = self
            .volumes
            .values()
            .find(|view| view.volume_handle() == handle)?
            .name
            .clone();
        self.volume(&name)
    }

    // --- StorageClasses ---

    pub fn class_event(&mut self, change: Change<&StorageClass>) -> Vec<Work> {
        let mut changed = Vec::new();
        match change {
            Change::Apply(sc) | Change::Listed(sc) => {
                if matches!(change, Change::Listed(_)) {
                    self.relists.classes.saw(name_of(&sc.metadata));
                }
                let class = Class::from_api(sc);
                if self.classes.get(&class.name) != Some(&class) {
                    changed.push(class.name.clone());
                    self.classes.insert(class.name.clone(), class);
                }
            }
            Change::Delete(sc) => {
                let name = name_of(&sc.metadata);
                self.classes.remove(&name);
            }
            Change::Relist => self.relists.classes.start(),
            Change::Relisted => {
                for name in self.relists.classes.finish(self.classes.keys()) {
                    self.classes.remove(&name);
                }
            }
        }
        // Claims waiting for a class, or for a class fixed after an error, go again.
        self.pending_claims()
            .filter(|c| {
                c.storage_class
                    .as_deref()
                    .is_some_and(|sc| changed.iter().any(|name| name == sc))
            })
            .map(|c| Work::Claim(c.uid.into()))
            .collect()
    }

    // --- Topology ---

    pub fn csinode_event(&mut self, change: Change<&CSINode>) -> Vec<Work> {
        match change {
            Change::Apply(n) | Change::Listed(n) => {
                let name = name_of(&n.metadata);
                if matches!(change, Change::Listed(_)) {
                    self.relists.csinodes.saw(name.as_str());
                }
                let keys = model::csinode_topology_keys(n, &self.driver).unwrap_or_default();
                self.csinodes.insert(name, keys);
            }
            Change::Delete(n) => {
                self.csinodes.remove(&name_of(&n.metadata));
            }
            Change::Relist => self.relists.csinodes.start(),
            Change::Relisted => {
                for name in self.relists.csinodes.finish(self.csinodes.keys()) {
                    self.csinodes.remove(&name);
                }
            }
        }
        Vec::new()
    }

    pub fn node_event(&mut self, change: Change<&Node>) -> Vec<Work> {
        match change {
            Change::Apply(n) | Change::Listed(n) => {
                let name = name_of(&n.metadata);
                if matches!(change, Change::Listed(_)) {
                    self.relists.nodes.saw(name.as_str());
                }
                self.nodes.insert(name, model::node_labels(n));
            }
            Change::Delete(n) => {
                self.nodes.remove(&name_of(&n.metadata));
            }
            Change::Relist => self.relists.nodes.start(),
            Change::Relisted => {
                for name in self.relists.nodes.finish(self.nodes.keys()) {
                    self.nodes.remove(&name);
                }
            }
        }
        Vec::new()
    }

    // --- VolumeAttachments ---

    pub fn attachment_event(&mut self, change: Change<&VolumeAttachment>) -> Vec<Work> {
        let mut work = Vec::new();
        let detach = |index: &mut Self, name: &str, work: &mut Vec<Work>| {
            if let Some(pv) = index.unlink_attachment(name)
                && let Some(view) = index.volumes.get(&pv)
            {
                work.push(Work::Volume(view.name.clone()));
            }
        };
        match change {
            Change::Apply(va) | Change::Listed(va) => {
                let name = name_of(&va.metadata);
                if matches!(change, Change::Listed(_)) {
                    self.relists.attachments.saw(name.as_str());
                }
                match model::attachment_of(va) {
                    Some(link) => self.link_attachment(&name, link),
                    None => detach(self, &name, &mut work),
                }
            }
            Change::Delete(va) => detach(self, &name_of(&va.metadata), &mut work),
            Change::Relist => self.relists.attachments.start(),
            Change::Relisted => {
                for name in self.relists.attachments.finish(self.attachments.keys()) {
                    detach(self, &name, &mut work);
                }
            }
        }
        work
    }
}

impl Index {
    // --- VolumeSnapshots ---

    pub fn snapshot_event(&mut self, change: Change<&VolumeSnapshot>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(vs) | Change::Listed(vs) => {
                let snapshot = Snapshot::from_api(vs);
                let key = (snapshot.namespace.clone(), snapshot.name.clone());
                if matches!(change, Change::Listed(_)) {
                    self.relists.snapshots.saw(format!("{}/{}", key.0, key.1));
                }
                if let Some(old) = self.snapshots.get(&key)
                    && (snapshot
                        .resource_version
                        .is_older_than(&old.resource_version)
                        || *old == snapshot)
                {
                    return work;
                }
                let source = (
                    SourceKind::Snapshot,
                    Atom::from(key.0.as_str()),
                    key.1.clone(),
                );
                self.requeue_users(&source, &mut work);
                if snapshot.protected && !self.source_in_use(&source) {
                    work.push(Work::Source(source));
                }
                self.snapshots.insert(key, snapshot);
            }
            Change::Delete(vs) => {
                let snapshot = Snapshot::from_api(vs);
                self.forget_snapshot(&snapshot.namespace, &snapshot.name, &mut work);
            }
            Change::Relist => self.relists.snapshots.start(),
            Change::Relisted => {
                let known: Vec<String> = self
                    .snapshots
                    .keys()
                    .map(|(ns, name)| format!("{ns}/{name}"))
                    .collect();
                for gone in self.relists.snapshots.finish(known.iter()) {
                    if let Some((ns, name)) = gone.split_once('/') {
                        self.forget_snapshot(ns, name, &mut work);
                    }
                }
            }
        }
        work
    }

    fn forget_snapshot(&mut self, namespace: &str, name: &str, work: &mut Vec<Work>) {
        self.snapshots
            .remove(&(namespace.to_string(), name.to_string()));
        self.requeue_users(
            &(
                SourceKind::Snapshot,
                Atom::from(namespace),
                name.to_string(),
            ),
            work,
        );
    }

    // --- ReferenceGrants ---

    pub fn grant_event(&mut self, change: Change<&ReferenceGrant>) -> Vec<Work> {
        let mut namespaces = BTreeSet::new();
        match change {
            Change::Apply(rg) | Change::Listed(rg) => {
                let grant = Grant::from_api(rg);
                let key = (grant.namespace.clone(), name_of(&rg.metadata));
                if matches!(change, Change::Listed(_)) {
                    self.relists.grants.saw(format!("{}/{}", key.0, key.1));
                }
                if self.grants.get(&key) != Some(&grant) {
                    namespaces.insert(key.0.clone());
                    self.grants.insert(key, grant);
                }
            }
            Change::Delete(rg) => {
                let key = (
                    rg.metadata.namespace.clone().unwrap_or_default(),
                    name_of(&rg.metadata),
                );
                if self.grants.remove(&key).is_some() {
                    namespaces.insert(key.0);
                }
            }
            Change::Relist => self.relists.grants.start(),
            Change::Relisted => {
                let known: Vec<String> = self
                    .grants
                    .keys()
                    .map(|(ns, name)| format!("{ns}/{name}"))
                    .collect();
                for gone in self.relists.grants.finish(known.iter()) {
                    if let Some((ns, name)) = gone.split_once('/') {
                        self.grants.remove(&(ns.to_string(), name.to_string()));
                        namespaces.insert(ns.to_string());
                    }
                }
            }
        }
        // Claims using a source in a namespace whose grants changed go again.
        self.pending_claims()
            .filter(|c| {
                c.pending
                    .as_ref()
                    .and_then(|p| p.data_source.as_ref())
                    .and_then(|s| s.namespace.as_ref())
                    .is_some_and(|ns| namespaces.contains(ns))
            })
            .map(|c| Work::Claim(c.uid.into()))
            .collect()
    }
}

impl ClusterTopology for Index {
    fn keys_of(&self, node: &str) -> Option<Vec<String>> {
        self.csinodes.get(node).cloned()
    }

    fn labels_of(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.nodes.get(node)
    }

    fn any_keys(&self) -> Option<Vec<String>> {
        // Sorted, so that the choice does not depend on hashing.
        let mut names: Vec<&String> = self.csinodes.keys().collect();
        names.sort();
        names
            .into_iter()
            .map(|n| &self.csinodes[n])
            .find(|keys| !keys.is_empty())
            .cloned()
    }

    fn all_labels(&self) -> Box<dyn Iterator<Item = &BTreeMap<String, String>> + '_> {
        Box::new(self.nodes.values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pvc(uid: &str, rv: &str, volume: Option<&str>, class: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": format!("c-{uid}"), "namespace": "ns", "uid": uid, "resourceVersion": rv},
            "spec": {"storageClassName": class, "volumeName": volume}
        }))
        .unwrap()
    }

    fn view(pv: &PersistentVolume) -> Arc<PvView> {
        Arc::new(PvView::from_api(pv, NEEDS))
    }

    fn claim_view(pvc: &PersistentVolumeClaim) -> Arc<ClaimView> {
        Arc::new(ClaimView::from_api(pvc, NEEDS))
    }

    fn pv(name: &str, rv: &str, driver: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": rv,
                "annotations": {model::ANN_PROVISIONED_BY: driver}},
            "spec": {"csi": {"driver": driver, "volumeHandle": "h"}}
        }))
        .unwrap()
    }

    #[test]
    fn a_node_knows_which_of_its_driver_volumes_it_can_reach() {
        let topology: BTreeMap<String, String> = [("zone".to_string(), "a".to_string())].into();
        let mut index = Index::for_node("d", "n1", Some(&topology));
        let in_zone = |name: &str, rv: &str, zone: &str| -> PersistentVolume {
            let mut pv = pv(name, rv, "d");
            pv.spec.get_or_insert_default().node_affinity = serde_json::from_value(json!({
                "required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": [zone]}]}]}
            }))
            .unwrap();
            pv
        };
        index.node_volume_event(Change::Apply(&in_zone("here", "1", "a")));
        index.node_volume_event(Change::Apply(&in_zone("there", "1", "b")));
        let reach = |index: &Index, name: &str| index.volume(name).map(|v| v.on_this_node);
        assert_eq!(reach(&index, "here"), Some(true));
        assert_eq!(reach(&index, "there"), Some(false));
        index.node_volume_event(Change::Apply(&in_zone("there", "2", "a")));
        assert_eq!(reach(&index, "there"), Some(true), "moved into reach");
        index.node_volume_event(Change::Apply(&in_zone("there", "3", "b")));
        index.node_volume_event(Change::Delete(&in_zone("there", "4", "b")));
        assert_eq!(reach(&index, "there"), None);
        assert!(index.off_node.is_empty(), "forgotten with the volume");
    }

    #[test]
    fn pending_claims_are_work_and_bound_ones_are_not() {
        let mut index = Index::new("d");
        assert_eq!(
            index.claim_event(Change::Apply(&claim_view(&pvc("u1", "1", None, "fast")))),
            vec![Work::Claim("u1".into())]
        );
        assert!(
            index
                .claim_event(Change::Apply(&claim_view(&pvc(
                    "u2",
                    "1",
                    Some("pv"),
                    "fast"
                ))))
                .is_empty()
        );
        assert!(
            index
                .claim_event(Change::Apply(&claim_view(&pvc(
                    "u1",
                    "0",
                    Some("pv"),
                    "fast"
                ))))
                .is_empty()
        );
        assert!(
            index.claim("u1").unwrap().pending.is_some(),
            "a stale event is ignored"
        );
        assert_eq!(
            index.claim_event(Change::Delete(&claim_view(&pvc("u1", "2", None, "fast")))),
            vec![Work::Claim("u1".into())]
        );
        assert!(index.claim("u1").is_none());
    }

    #[test]
    fn relist_drops_claims_deleted_while_the_watch_was_down() {
        let mut index = Index::new("d");
        index.claim_event(Change::Apply(&claim_view(&pvc("u1", "1", None, "fast"))));
        index.claim_event(Change::Apply(&claim_view(&pvc("u2", "1", None, "fast"))));
        index.claim_event(Change::Relist);
        index.claim_event(Change::Listed(&claim_view(&pvc("u2", "2", None, "fast"))));
        let work = index.claim_event(Change::Relisted);
        assert_eq!(work, vec![Work::Claim("u1".into())]);
        assert_eq!(index.claim_count(), 1);
    }

    #[test]
    fn only_this_drivers_volumes_are_kept() {
        let mut index = Index::new("d");
        assert_eq!(
            index.volume_event(Change::Apply(&view(&pv("a", "1", "d")))),
            vec![Work::Volume("a".into())]
        );
        assert!(
            index
                .volume_event(Change::Apply(&view(&pv("b", "1", "other"))))
                .is_empty()
        );
        assert_eq!(index.volume_count(), 1);
        index.volume_event(Change::Delete(&view(&pv("a", "2", "d"))));
        index.store_volume(&pv("a", "3", "d"), false);
        assert!(
            !index.has_volume("a"),
            "a patch response does not resurrect a deleted PV"
        );
        index.store_volume(&pv("n", "3", "d"), true);
        assert!(index.has_volume("n"));
    }

    #[test]
    fn class_changes_requeue_their_pending_claims() {
        let mut index = Index::new("d");
        index.claim_event(Change::Apply(&claim_view(&pvc("u1", "1", None, "fast"))));
        index.claim_event(Change::Apply(&claim_view(&pvc("u2", "1", None, "slow"))));
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "fast"}, "provisioner": "d"
        }))
        .unwrap();
        assert_eq!(
            index.class_event(Change::Apply(&sc)),
            vec![Work::Claim("u1".into())]
        );
        assert!(
            index.class_event(Change::Apply(&sc)).is_empty(),
            "unchanged"
        );
    }

    #[test]
    fn attachments_block_and_release_deletion() {
        let mut index = Index::new("d");
        index.volume_event(Change::Apply(&view(&pv("a", "1", "d"))));
        let va: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": "va1"},
            "spec": {"attacher": "d", "nodeName": "n1", "source": {"persistentVolumeName": "a"}}
        }))
        .unwrap();
        index.attachment_event(Change::Apply(&va));
        assert_eq!(index.attached_to("a").as_deref(), Some("n1"));
        assert_eq!(
            index.attachment_event(Change::Delete(&va)),
            vec![Work::Volume("a".into())]
        );
        assert_eq!(index.attached_to("a"), None);
    }

    #[test]
    fn a_volume_attached_to_several_nodes_names_the_first_until_none_is_left() {
        let mut index = Index::new("d");
        index.volume_event(Change::Apply(&view(&pv("a", "1", "d"))));
        let va = |name: &str, node: &str| -> VolumeAttachment {
            serde_json::from_value(json!({
                "metadata": {"name": name},
                "spec": {"attacher": "d", "nodeName": node, "source": {"persistentVolumeName": "a"}}
            }))
            .unwrap()
        };
        index.attachment_event(Change::Apply(&va("va2", "n2")));
        index.attachment_event(Change::Apply(&va("va1", "n1")));
        assert_eq!(index.attached_to("a").as_deref(), Some("n1"));
        index.attachment_event(Change::Delete(&va("va1", "n1")));
        assert_eq!(index.attached_to("a").as_deref(), Some("n2"));
        index.attachment_event(Change::Delete(&va("va2", "n2")));
        assert_eq!(index.attached_to("a"), None);
        assert!(index.attachments_by_pv.is_empty());
    }
}
