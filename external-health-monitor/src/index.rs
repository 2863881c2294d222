//! The cache, fed by watch events: this driver's PersistentVolumes (by name and by volume
//! handle), the claims, the claims with a Warning `VolumeConditionAbnormal` Event, and with the
//! node watcher the pods that mount claims and the nodes' health. Each event returns the work
//! it makes. No I/O.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use sidecar_kit::pipeline::views::{ClaimView, PvView};
use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::pipeline::{Change, Relist};
use sidecar_kit::values::shrink::ShrinkWhenSparse;

use crate::model::{ABNORMAL, NodeHealth, PodInfo};

/// What a watch event leaves to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// Check this PV (ControllerGetVolume mode).
    Volume(Arc<str>),
    /// Look at this node (node watcher).
    Node(Arc<str>),
}

/// A volume ready to be checked: bound, with its claim.
#[derive(Clone, Debug)]
pub struct Target {
    pub pv: Arc<PvView>,
    pub claim: Arc<ClaimView>,
    /// The claim has a Warning `VolumeConditionAbnormal` Event.
    pub warned: bool,
    /// Its recovery was reported since.
    pub recovered: bool,
}

/// The claims of the pods on one node, with those pods' names.
pub type ClaimsOnNode = Vec<(Arc<ClaimView>, Vec<Box<str>>)>;

#[derive(Debug, Default)]
struct Relists {
    pvs: Relist,
    claims: Relist,
    events: Relist,
    pods: Relist,
    nodes: Relist,
}

#[derive(Debug)]
pub struct Index {
    driver: String,
    /// This driver's CSI volumes (in-tree ones are not monitored, as upstream's).
    pvs: ViewTable<PvView>,
    /// The same by volume handle, for ListVolumes' entries.
    handles: ViewTable<PvView, str>,
    /// Claims by `namespace/name`.
    claims: ViewTable<ClaimView>,
    /// Warning `VolumeConditionAbnormal` Events by `namespace/name` → their claim's UID.
    warnings: HashMap<Arc<str>, Arc<str>>,
    /// How many of those Events each claim UID has.
    warned: HashMap<Arc<str>, u32>,
    /// Claim UIDs whose recovery was reported while their Warning Events last.
    recovered: HashSet<Arc<str>>,
    /// Pods that mount claims, by `namespace/name`.
    pods: HashMap<Arc<str>, PodInfo>,
    nodes: HashMap<Arc<str>, NodeHealth>,
    relist: Relists,
}

/// A change reduced to what the cache does with it.
enum Seen<'a, T> {
    Upsert(&'a T),
    Remove(&'a T),
    /// A re-list ended: these were not listed.
    Relisted,
    Nothing,
}

/// Keeps `relist`'s books for `change`, whose objects `key` names.
fn seen<'a, T>(
    relist: &mut Relist,
    change: Change<&'a T>,
    key: impl Fn(&T) -> Arc<str>,
) -> Seen<'a, T> {
    match change {
        Change::Apply(object) => Seen::Upsert(object),
        Change::Listed(object) => {
            relist.saw(key(object));
            Seen::Upsert(object)
        }
        Change::Delete(object) => Seen::Remove(object),
        Change::Relist => {
            relist.start();
            Seen::Nothing
        }
        Change::Relisted => Seen::Relisted,
    }
}

fn object_key(namespace: Option<&str>, name: Option<&str>) -> Arc<str> {
    format!(
        "{}/{}",
        namespace.unwrap_or_default(),
        name.unwrap_or_default()
    )
    .into()
}

fn pod_key(pod: &Pod) -> Arc<str> {
    object_key(
        pod.metadata.namespace.as_deref(),
        pod.metadata.name.as_deref(),
    )
}

fn event_key(event: &Event) -> Arc<str> {
    object_key(
        event.metadata.namespace.as_deref(),
        event.metadata.name.as_deref(),
    )
}

fn node_name(node: &Node) -> Arc<str> {
    node.metadata.name.as_deref().unwrap_or_default().into()
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            pvs: ViewTable::new(|pv| &pv.name),
            handles: ViewTable::new(PvView::volume_handle),
            claims: ViewTable::new(|claim| &claim.key),
            warnings: HashMap::new(),
            warned: HashMap::new(),
            recovered: HashSet::new(),
            pods: HashMap::new(),
            nodes: HashMap::new(),
            relist: Relists::default(),
        }
    }

    pub fn pv_count(&self) -> usize {
        self.pvs.len()
    }

    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn mine(&self, pv: &PvView) -> bool {
        pv.in_tree.is_none() && pv.csi.is_some() && pv.driver() == self.driver
    }

    /// A PV event: a volume of this driver that is new or just bound is to be checked.
    pub fn pv_event(&mut self, change: Change<&Arc<PvView>>) -> Vec<Work> {
        match seen(&mut self.relist.pvs, change, |pv| pv.name.clone()) {
            Seen::Upsert(pv) if self.mine(pv) => {
                let was_bound = self.pvs.get(&pv.name).map(|old| bound(old));
                if let Some(old) = self.pvs.insert(pv.clone())
                    && old.volume_handle() != pv.volume_handle()
                {
                    self.handles.remove(old.volume_handle());
                }
                self.handles.insert(pv.clone());
                match (was_bound, bound(pv)) {
                    (None | Some(false), true) => vec![Work::Volume(pv.name.clone())],
                    _ => Vec::new(),
                }
            }
            Seen::Upsert(pv) | Seen::Remove(pv) => {
                self.forget_pv(&pv.name);
                Vec::new()
            }
            Seen::Relisted => {
                for name in self.relist.pvs.finish(self.pvs.keys()) {
                    self.forget_pv(&name);
                }
                Vec::new()
            }
            Seen::Nothing => Vec::new(),
        }
    }

    fn forget_pv(&mut self, name: &str) {
        if let Some(old) = self.pvs.remove(name) {
            if self
                .handles
                .get(old.volume_handle())
                .is_some_and(|pv| *pv.name == *name)
            {
                self.handles.remove(old.volume_handle());
            }
            self.pvs.shrink_when_sparse();
            self.handles.shrink_when_sparse();
        }
    }

    /// A claim event. A claim new to the cache brings its bound volume to be checked: the
    /// volume's check, come before its claim's watch event, found no claim and dropped it.
    pub fn claim_event(&mut self, change: Change<&Arc<ClaimView>>) -> Vec<Work> {
        match seen(&mut self.relist.claims, change, |c| c.key.clone()) {
            Seen::Upsert(claim) => {
                if self.claims.insert(claim.clone()).is_none()
                    && let Some(pv) = self.pvs.get(&claim.volume_name).filter(|pv| bound(pv))
                {
                    return vec![Work::Volume(pv.name.clone())];
                }
            }
            Seen::Remove(claim) => {
                self.claims.remove(&claim.key);
                self.claims.shrink_when_sparse();
            }
            Seen::Relisted => {
                for key in self.relist.claims.finish(self.claims.keys()) {
                    self.claims.remove(&key);
                }
                self.claims.shrink_when_sparse();
            }
            Seen::Nothing => {}
        }
        Vec::new()
    }

    /// A Warning `VolumeConditionAbnormal` Event (the watch selects them; others are ignored).
    pub fn event_event(&mut self, change: Change<&Event>) -> Vec<Work> {
        match seen(&mut self.relist.events, change, event_key) {
            Seen::Upsert(event)
                if event.type_.as_deref() == Some("Warning")
                    && event.reason.as_deref() == Some(ABNORMAL) =>
            {
                let uid: Arc<str> = event
                    .involved_object
                    .uid
                    .as_deref()
                    .unwrap_or_default()
                    .into();
                if let Some(old) = self.warnings.insert(event_key(event), uid.clone()) {
                    self.unwarn(&old);
                }
                *self.warned.entry(uid).or_default() += 1;
            }
            Seen::Upsert(event) | Seen::Remove(event) => self.forget_event(&event_key(event)),
            Seen::Relisted => {
                for key in self.relist.events.finish(self.warnings.keys()) {
                    self.forget_event(&key);
                }
            }
            Seen::Nothing => {}
        }
        Vec::new()
    }

    fn forget_event(&mut self, key: &str) {
        if let Some(uid) = self.warnings.remove(key) {
            self.unwarn(&uid);
            self.warnings.shrink_when_sparse();
        }
    }

    fn unwarn(&mut self, uid: &Arc<str>) {
        if let Some(count) = self.warned.get_mut(uid) {
            *count -= 1;
            if *count == 0 {
                self.warned.remove(uid);
                // No Warning Event left: a later recovery is reported only after a new one.
                self.recovered.remove(uid);
            }
        }
    }

    /// A pod event; only pods that mount claims are kept.
    pub fn pod_event(&mut self, change: Change<&Pod>) -> Vec<Work> {
        match seen(&mut self.relist.pods, change, pod_key) {
            Seen::Upsert(pod) => {
                let info = PodInfo::from_api(pod);
                if info.claims.is_empty() {
                    self.pods.remove(&pod_key(pod));
                } else {
                    self.pods.insert(pod_key(pod), info);
                }
            }
            Seen::Remove(pod) => {
                self.pods.remove(&pod_key(pod));
                self.pods.shrink_when_sparse();
            }
            Seen::Relisted => {
                for key in self.relist.pods.finish(self.pods.keys()) {
                    self.pods.remove(&key);
                }
                self.pods.shrink_when_sparse();
            }
            Seen::Nothing => {}
        }
        Vec::new()
    }

    /// A node event: a node whose health changed, or that is gone, is to be looked at.
    pub fn node_event(&mut self, change: Change<&Node>) -> Vec<Work> {
        match seen(&mut self.relist.nodes, change, node_name) {
            Seen::Upsert(node) => {
                let name = node_name(node);
                let health = NodeHealth::from_api(node);
                match self.nodes.insert(name.clone(), health) {
                    Some(old) if old == health => Vec::new(),
                    _ => vec![Work::Node(name)],
                }
            }
            Seen::Remove(node) => {
                let name = node_name(node);
                self.nodes.remove(&name);
                vec![Work::Node(name)]
            }
            Seen::Relisted => {
                let gone = self.relist.nodes.finish(self.nodes.keys());
                for name in &gone {
                    self.nodes.remove(name);
                }
                gone.into_iter().map(Work::Node).collect()
            }
            Seen::Nothing => Vec::new(),
        }
    }

    /// The PV `name` ready to be checked: this driver's, bound, with its claim cached.
    pub fn target(&self, name: &str) -> Option<Target> {
        let pv = self.pvs.get(name).filter(|pv| bound(pv))?;
        let claim_ref = pv.claim_ref.as_ref()?;
        let key = format!("{}/{}", claim_ref.namespace, claim_ref.name);
        let claim = self.claims.get(key.as_str())?;
        Some(Target {
            pv: pv.clone(),
            claim: claim.clone(),
            warned: self.warned.contains_key(&claim.uid),
            recovered: self.recovered.contains(&claim.uid),
        })
    }

    /// The PV of the volume with handle `handle`, if it is this driver's.
    pub fn pv_of_handle(&self, handle: &str) -> Option<Arc<str>> {
        self.handles.get(handle).map(|pv| pv.name.clone())
    }

    /// The bound PVs of this driver, to be checked.
    pub fn volume_names(&self) -> Vec<Arc<str>> {
        self.pvs
            .values()
            .filter(|pv| bound(pv))
            .map(|pv| pv.name.clone())
            .collect()
    }

    /// Notes whether the recovery of the claim with `uid` was reported.
    pub fn set_recovered(&mut self, uid: &Arc<str>, recovered: bool) {
        if recovered && self.warned.contains_key(uid) {
            self.recovered.insert(uid.clone());
        } else {
            self.recovered.remove(uid);
        }
    }

    pub fn node(&self, name: &str) -> Option<NodeHealth> {
        self.nodes.get(name).copied()
    }

    pub fn node_names(&self) -> Vec<Arc<str>> {
        self.nodes.keys().cloned().collect()
    }

    /// The claims bound to this driver's volumes that pods on `node` mount, with those pods
    /// (sorted by name).
    pub fn claims_on_node(&self, node: &str) -> ClaimsOnNode {
        let mut by_claim: BTreeMap<String, Vec<Box<str>>> = BTreeMap::new();
        for pod in self.pods.values().filter(|p| p.node.as_str() == node) {
            for claim in pod.claims.iter() {
                by_claim
                    .entry(format!("{}/{claim}", pod.namespace))
                    .or_default()
                    .push(pod.name.clone());
            }
        }
        by_claim
            .into_iter()
            .filter_map(|(key, mut pods)| {
                pods.sort_unstable();
                let claim = self.claims.get(key.as_str())?;
                let pv = self.pvs.get(&claim.volume_name)?;
                bound(pv).then(|| (claim.clone(), pods))
            })
            .collect()
    }
}

fn bound(pv: &PvView) -> bool {
    pv.phase == "Bound" && !pv.deleting
}

#[cfg(test)]
mod tests;
