//! The cache: watch events in, projected objects and the keys to work on out. No I/O.
//!
//! It keeps every claim (bound ones as bare identities), the PersistentVolumes this driver is
//! responsible for, StorageClasses, the driver's topology keys per CSINode, Node labels, and
//! which PV each VolumeAttachment names. Objects written by the controller are stored from the
//! write's response, and watch events older than what is stored are ignored.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use sidecar_kit::pipeline::{Change, Relist};

use crate::model::{self, Claim, Class, Volume};
use crate::topology::ClusterTopology;

/// A key to process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Work {
    /// A claim, by UID.
    Claim(String),
    /// A PersistentVolume, by name.
    Volume(String),
}

#[derive(Debug, Default)]
struct Relists {
    claims: Relist,
    volumes: Relist,
    classes: Relist,
    csinodes: Relist,
    nodes: Relist,
    attachments: Relist,
}

#[derive(Debug)]
pub struct Index {
    driver: String,
    claims: HashMap<String, Claim>,
    volumes: HashMap<String, Volume>,
    classes: HashMap<String, Class>,
    /// The driver's topology keys per CSINode (empty: the driver is not registered there).
    csinodes: HashMap<String, Vec<String>>,
    nodes: HashMap<String, BTreeMap<String, String>>,
    /// VolumeAttachment name → (PV name, node name).
    attachments: HashMap<String, (String, String)>,
    relists: Relists,
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// Whether `candidate` is older than `stored` (both resourceVersions of one object).
fn stale(candidate: &str, stored: &str) -> bool {
    match (candidate.parse::<u64>(), stored.parse::<u64>()) {
        (Ok(c), Ok(s)) => c < s,
        _ => false,
    }
}

impl Index {
    pub fn new(driver: &str) -> Self {
        Self {
            driver: driver.to_string(),
            claims: HashMap::new(),
            volumes: HashMap::new(),
            classes: HashMap::new(),
            csinodes: HashMap::new(),
            nodes: HashMap::new(),
            attachments: HashMap::new(),
            relists: Relists::default(),
        }
    }

    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    pub fn volume_count(&self) -> usize {
        self.volumes.len()
    }

    pub fn claim(&self, uid: &str) -> Option<&Claim> {
        self.claims.get(uid)
    }

    pub fn class(&self, name: &str) -> Option<&Class> {
        self.classes.get(name)
    }

    pub fn volume(&self, name: &str) -> Option<&Volume> {
        self.volumes.get(name)
    }

    /// The node of a VolumeAttachment naming `pv`, if any.
    pub fn attached_to(&self, pv: &str) -> Option<String> {
        self.attachments
            .values()
            .filter(|(name, _)| name == pv)
            .map(|(_, node)| node.clone())
            .min()
    }

    /// Claims without a volume, whatever their class.
    pub fn pending_claims(&self) -> impl Iterator<Item = &Claim> {
        self.claims.values().filter(|c| c.pending.is_some())
    }

    /// Every key, for a periodic resync.
    pub fn resync(&self) -> Vec<Work> {
        self.pending_claims()
            .map(|c| Work::Claim(c.uid.clone()))
            .chain(self.volumes.keys().map(|n| Work::Volume(n.clone())))
            .collect()
    }

    // --- Claims ---

    pub fn claim_event(&mut self, change: Change<&PersistentVolumeClaim>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(pvc) => self.apply_claim(pvc, &mut work),
            Change::Delete(pvc) => {
                let uid = pvc.metadata.uid.clone().unwrap_or_default();
                self.claims.remove(&uid);
                work.push(Work::Claim(uid));
            }
            Change::Relist => self.relists.claims.start(),
            Change::Listed(pvc) => {
                self.relists
                    .claims
                    .saw(pvc.metadata.uid.as_deref().unwrap_or_default());
                self.apply_claim(pvc, &mut work);
            }
            Change::Relisted => {
                for uid in self.relists.claims.finish(self.claims.keys()) {
                    self.claims.remove(&uid);
                    work.push(Work::Claim(uid));
                }
            }
        }
        work
    }

    fn apply_claim(&mut self, pvc: &PersistentVolumeClaim, work: &mut Vec<Work>) {
        let claim = Claim::from_api(pvc);
        if let Some(old) = self.claims.get(&claim.uid)
            && stale(&claim.resource_version, &old.resource_version)
        {
            return;
        }
        if claim.pending.is_some() {
            work.push(Work::Claim(claim.uid.clone()));
        }
        self.claims.insert(claim.uid.clone(), claim);
    }

    /// Stores a claim the controller wrote.
    pub fn store_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let mut ignored = Vec::new();
        if self
            .claims
            .contains_key(pvc.metadata.uid.as_deref().unwrap_or_default())
        {
            self.apply_claim(pvc, &mut ignored);
        }
    }

    // --- PersistentVolumes ---

    pub fn volume_event(&mut self, change: Change<&PersistentVolume>) -> Vec<Work> {
        let mut work = Vec::new();
        match change {
            Change::Apply(pv) => self.apply_volume(pv, &mut work),
            Change::Delete(pv) => {
                self.volumes.remove(&name_of(&pv.metadata));
            }
            Change::Relist => self.relists.volumes.start(),
            Change::Listed(pv) => {
                self.relists.volumes.saw(&name_of(&pv.metadata));
                self.apply_volume(pv, &mut work);
            }
            Change::Relisted => {
                for name in self.relists.volumes.finish(self.volumes.keys()) {
                    self.volumes.remove(&name);
                }
            }
        }
        work
    }

    fn apply_volume(&mut self, pv: &PersistentVolume, work: &mut Vec<Work>) {
        let volume = Volume::from_api(pv);
        if !volume.owned_by(&self.driver) {
            self.volumes.remove(&volume.name);
            return;
        }
        if let Some(old) = self.volumes.get(&volume.name)
            && stale(&volume.resource_version, &old.resource_version)
        {
            return;
        }
        work.push(Work::Volume(volume.name.clone()));
        self.volumes.insert(volume.name.clone(), volume);
    }

    /// Stores a PV the controller created or patched. A patch of a PV the cache no longer holds
    /// (deleted meanwhile) does not bring it back.
    pub fn store_volume(&mut self, pv: &PersistentVolume, created: bool) {
        let name = name_of(&pv.metadata);
        if created || self.volumes.contains_key(&name) {
            let mut ignored = Vec::new();
            self.apply_volume(pv, &mut ignored);
        }
    }

    /// Whether a PV of that name exists (of this driver).
    pub fn has_volume(&self, name: &str) -> bool {
        self.volumes.contains_key(name)
    }

    // --- StorageClasses ---

    pub fn class_event(&mut self, change: Change<&StorageClass>) -> Vec<Work> {
        let mut changed = Vec::new();
        match change {
            Change::Apply(sc) | Change::Listed(sc) => {
                if matches!(change, Change::Listed(_)) {
                    self.relists.classes.saw(&name_of(&sc.metadata));
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
                c.pending
                    .as_ref()
                    .and_then(|p| p.storage_class.as_ref())
                    .is_some_and(|sc| changed.contains(sc))
            })
            .map(|c| Work::Claim(c.uid.clone()))
            .collect()
    }

    // --- Topology ---

    pub fn csinode_event(&mut self, change: Change<&CSINode>) -> Vec<Work> {
        match change {
            Change::Apply(n) | Change::Listed(n) => {
                let name = name_of(&n.metadata);
                if matches!(change, Change::Listed(_)) {
                    self.relists.csinodes.saw(&name);
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
                    self.relists.nodes.saw(&name);
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
            if let Some((pv, _)) = index.attachments.remove(name)
                && index.volumes.contains_key(&pv)
            {
                work.push(Work::Volume(pv));
            }
        };
        match change {
            Change::Apply(va) | Change::Listed(va) => {
                let name = name_of(&va.metadata);
                if matches!(change, Change::Listed(_)) {
                    self.relists.attachments.saw(&name);
                }
                match model::attachment_of(va) {
                    Some(link) => {
                        self.attachments.insert(name, link);
                    }
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

    fn pv(name: &str, rv: &str, driver: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": rv,
                "annotations": {model::ANN_PROVISIONED_BY: driver}},
            "spec": {"csi": {"driver": driver, "volumeHandle": "h"}}
        }))
        .unwrap()
    }

    #[test]
    fn pending_claims_are_work_and_bound_ones_are_not() {
        let mut index = Index::new("d");
        assert_eq!(
            index.claim_event(Change::Apply(&pvc("u1", "1", None, "fast"))),
            vec![Work::Claim("u1".into())]
        );
        assert!(
            index
                .claim_event(Change::Apply(&pvc("u2", "1", Some("pv"), "fast")))
                .is_empty()
        );
        assert!(
            index
                .claim_event(Change::Apply(&pvc("u1", "0", Some("pv"), "fast")))
                .is_empty()
        );
        assert!(
            index.claim("u1").unwrap().pending.is_some(),
            "a stale event is ignored"
        );
        assert_eq!(
            index.claim_event(Change::Delete(&pvc("u1", "2", None, "fast"))),
            vec![Work::Claim("u1".into())]
        );
        assert!(index.claim("u1").is_none());
    }

    #[test]
    fn relist_drops_claims_deleted_while_the_watch_was_down() {
        let mut index = Index::new("d");
        index.claim_event(Change::Apply(&pvc("u1", "1", None, "fast")));
        index.claim_event(Change::Apply(&pvc("u2", "1", None, "fast")));
        index.claim_event(Change::Relist);
        index.claim_event(Change::Listed(&pvc("u2", "2", None, "fast")));
        let work = index.claim_event(Change::Relisted);
        assert_eq!(work, vec![Work::Claim("u1".into())]);
        assert_eq!(index.claim_count(), 1);
    }

    #[test]
    fn only_this_drivers_volumes_are_kept() {
        let mut index = Index::new("d");
        assert_eq!(
            index.volume_event(Change::Apply(&pv("a", "1", "d"))),
            vec![Work::Volume("a".into())]
        );
        assert!(
            index
                .volume_event(Change::Apply(&pv("b", "1", "other")))
                .is_empty()
        );
        assert_eq!(index.volume_count(), 1);
        index.volume_event(Change::Delete(&pv("a", "2", "d")));
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
        index.claim_event(Change::Apply(&pvc("u1", "1", None, "fast")));
        index.claim_event(Change::Apply(&pvc("u2", "1", None, "slow")));
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
        index.volume_event(Change::Apply(&pv("a", "1", "d")));
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
}
