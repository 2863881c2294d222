//! The cache, fed by watch events: claims, this driver's PersistentVolumes, the claims each pod
//! mounts (no pod specs), and VolumeAttributesClasses. Each event returns the claims to work on.
//! No I/O here.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttributesClass;
use kube::ResourceExt;
use sidecar_kit::pipeline::views::{ClaimView, PvView};
use sidecar_kit::pipeline::viewtable::ViewTable;
use sidecar_kit::pipeline::{Change, Relist};
use sidecar_kit::values::shrink::ShrinkWhenSparse;

use crate::model::{Claim, NEEDS, PodClaims, Pv, Vac};

/// What the resizer looks at for a claim, as of one moment.
#[derive(Clone, Debug)]
pub struct View {
    pub claim: Claim,
    pub pv: Option<Pv>,
    /// Whether a pod that has not terminated mounts the claim.
    pub in_use: bool,
}

#[derive(Debug)]
pub struct Index {
    driver: String,
    /// Gate `RecoverVolumeExpansionFailure`: a smaller request is a change to act on too.
    recover: bool,
    /// The process's shared views of the claims, by `namespace/name`; the resizer's [`Claim`]
    /// is projected on reading.
    claims: ViewTable<ClaimView>,
    /// The process's shared views of this driver's PVs; the resizer's [`Pv`] is projected on
    /// reading.
    pvs: ViewTable<PvView>,
    pods: HashMap<String, PodClaims>,
    /// Running pods per claim key.
    users: HashMap<String, u32>,
    /// Claims whose last expansion the driver refused as in use (FailedPrecondition): not
    /// expanded while a running pod mounts them, and queued as soon as none does.
    in_use_refusals: HashSet<String>,
    classes: HashMap<String, Vac>,
    relist: Relists,
}

/// The re-list in progress of each watched kind.
#[derive(Debug, Default)]
struct Relists {
    claims: Relist,
    pvs: Relist,
    pods: Relist,
    classes: Relist,
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.name_any()
    )
}

impl Index {
    pub fn new(driver: &str, recover: bool) -> Self {
        Self {
            driver: driver.to_string(),
            recover,
            claims: ViewTable::new(|c| &c.key),
            pvs: ViewTable::new(|p| &p.name),
            pods: HashMap::new(),
            users: HashMap::new(),
            in_use_refusals: HashSet::new(),
            classes: HashMap::new(),
            relist: Relists::default(),
        }
    }

    pub fn claim_count(&self) -> usize {
        self.claims.len()
    }

    pub fn pv_count(&self) -> usize {
        self.pvs.len()
    }

    pub fn pod_count(&self) -> usize {
        self.pods.len()
    }

    /// Every cached claim, for the periodic resync.
    pub fn claim_keys(&self) -> Vec<Arc<str>> {
        self.claims.keys().cloned().collect()
    }

    pub fn view(&self, key: &str) -> Option<View> {
        let claim = Claim::from_view(self.claims.get(key)?);
        let pv = claim
            .volume_name
            .as_ref()
            .and_then(|name| self.pvs.get(name.as_str()))
            .and_then(|view| Pv::from_view(view, &self.driver));
        Some(View {
            in_use: self.users.get(key).is_some_and(|n| *n > 0),
            claim,
            pv,
        })
    }

    pub fn class(&self, name: &str) -> Option<Vac> {
        self.classes.get(name).cloned()
    }

    /// Whether a claim's expansion must wait for its pods: the driver refused it as in use and
    /// a running pod still mounts it.
    pub fn blocked_by_pods(&self, key: &str) -> bool {
        self.in_use_refusals.contains(key) && self.users.get(key).is_some_and(|n| *n > 0)
    }

    pub fn set_in_use_refusal(&mut self, key: &str, refused: bool) {
        if refused {
            self.in_use_refusals.insert(key.to_string());
        } else if self.in_use_refusals.remove(key) {
            self.in_use_refusals.shrink_when_sparse();
        }
    }

    /// Stores a claim as written by the resizer itself, so that the next step starts from it.
    pub fn store_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let view = ClaimView::from_api(pvc, NEEDS);
        self.claims.insert(Arc::new(view));
    }

    pub fn store_pv(&mut self, pv: &PersistentVolume) {
        let view = PvView::from_api(pv, NEEDS);
        if Pv::from_view(&view, &self.driver).is_some() {
            self.pvs.insert(Arc::new(view));
        }
    }

    /// Whether a change of a claim may need work (upstream's update filter, widened to binding,
    /// which upstream leaves to its resync).
    fn claim_changed(&self, old: &Claim, new: &Claim) -> bool {
        let bytes = |s: &Option<crate::model::Size>| s.as_ref().map(|s| s.bytes);
        let request_changed = if self.recover {
            bytes(&old.request) != bytes(&new.request)
        } else {
            bytes(&new.request) > bytes(&old.request)
        };
        request_changed
            || old.resizer != new.resizer
            || bytes(&new.capacity) > bytes(&old.capacity)
            || (self.recover && old.resize_status != new.resize_status)
            || (new.bound && !old.bound)
            || old.volume_name != new.volume_name
            || (new.bound && (old.class != new.class || new.modify_status.is_none()))
    }

    pub fn claim_event(&mut self, change: Change<&Arc<ClaimView>>) -> Vec<Arc<str>> {
        match change {
            Change::Apply(pvc) => self.apply_claim(pvc),
            Change::Listed(pvc) => {
                self.relist.claims.saw(pvc.key.clone());
                self.apply_claim(pvc)
            }
            Change::Delete(pvc) => {
                self.remove_claim(&pvc.key);
                vec![pvc.key.clone()]
            }
            Change::Relist => {
                self.relist.claims.start();
                vec![]
            }
            Change::Relisted => {
                let gone = self.relist.claims.finish(self.claims.keys());
                for key in &gone {
                    self.remove_claim(key);
                }
                gone
            }
        }
    }

    fn apply_claim(&mut self, view: &Arc<ClaimView>) -> Vec<Arc<str>> {
        let key = view.key.clone();
        let work = match self.claims.get(&key) {
            Some(old) if old.uid == view.uid => {
                self.claim_changed(&Claim::from_view(old), &Claim::from_view(view))
            }
            _ => true,
        };
        self.claims.insert(view.clone());
        if work { vec![key] } else { vec![] }
    }

    fn remove_claim(&mut self, key: &str) {
        self.claims.remove(key);
        self.claims.shrink_when_sparse();
        self.set_in_use_refusal(key, false);
    }

    /// The claim a PV is bound to, if it is cached: a PV that appears or grows may unblock it.
    fn claim_of(&self, pv: &Pv) -> Option<Arc<str>> {
        let r = pv.claim_ref.as_ref()?;
        let key = format!("{}/{}", r.namespace, r.name);
        Some(self.claims.get(&key)?.key.clone())
    }

    pub fn pv_event(&mut self, change: Change<&Arc<PvView>>) -> Vec<Arc<str>> {
        match change {
            Change::Apply(pv) => self.apply_pv(pv),
            Change::Listed(pv) => {
                self.relist.pvs.saw(pv.name.clone());
                self.apply_pv(pv)
            }
            Change::Delete(pv) => {
                self.remove_pv(&pv.name);
                vec![]
            }
            Change::Relist => {
                self.relist.pvs.start();
                vec![]
            }
            Change::Relisted => {
                for name in self.relist.pvs.finish(self.pvs.keys()) {
                    self.remove_pv(&name);
                }
                vec![]
            }
        }
    }

    fn apply_pv(&mut self, view: &Arc<PvView>) -> Vec<Arc<str>> {
        let Some(pv) = Pv::from_view(view, &self.driver) else {
            // No longer ours (or never was).
            self.remove_pv(&view.name);
            return vec![];
        };
        let work = match self.pvs.get(&view.name) {
            Some(old) => {
                old.capacity != view.capacity
                    || old.claim_ref != view.claim_ref
                    || old.attributes_class != view.attributes_class
            }
            None => true,
        };
        let claim = self.claim_of(&pv).filter(|_| work);
        self.pvs.insert(view.clone());
        claim.into_iter().collect()
    }

    fn remove_pv(&mut self, name: &str) {
        if self.pvs.remove(name).is_some() {
            self.pvs.shrink_when_sparse();
        }
    }

    fn count_users(&mut self, pod: &PodClaims, delta: i32) -> Vec<Arc<str>> {
        if pod.terminated {
            return vec![];
        }
        let mut freed = vec![];
        for claim in &pod.claims {
            let key = format!("{}/{claim}", pod.namespace);
            let count = self.users.entry(key.clone()).or_insert(0);
            *count = count.saturating_add_signed(delta);
            if *count == 0 {
                self.users.remove(&key);
                if self.in_use_refusals.contains(&key) {
                    freed.push(key.into());
                }
            }
        }
        freed
    }

    /// Pods only count while they run; a claim refused as in use is queued when its last
    /// running pod ends or goes.
    pub fn pod_event(&mut self, change: Change<&Pod>) -> Vec<Arc<str>> {
        match change {
            Change::Apply(pod) => self.apply_pod(pod),
            Change::Listed(pod) => {
                self.relist.pods.saw(pod_key(pod));
                self.apply_pod(pod)
            }
            Change::Delete(pod) => self.remove_pod(&pod_key(pod)),
            Change::Relist => {
                self.relist.pods.start();
                vec![]
            }
            Change::Relisted => {
                let gone = self.relist.pods.finish(self.pods.keys());
                gone.iter().flat_map(|key| self.remove_pod(key)).collect()
            }
        }
    }

    fn apply_pod(&mut self, pod: &Pod) -> Vec<Arc<str>> {
        let key = pod_key(pod);
        let new = PodClaims::from_api(pod);
        let old = match &new {
            Some(new) => self.pods.insert(key, new.clone()),
            None => self.pods.remove(&key),
        };
        if old == new {
            return vec![];
        }
        let mut freed = vec![];
        if let Some(new) = &new {
            freed.extend(self.count_users(new, 1));
        }
        if let Some(old) = &old {
            freed.extend(self.count_users(old, -1));
        }
        freed
    }

    fn remove_pod(&mut self, key: &str) -> Vec<Arc<str>> {
        let Some(old) = self.pods.remove(key) else {
            return vec![];
        };
        self.pods.shrink_when_sparse();
        let freed = self.count_users(&old, -1);
        self.users.shrink_when_sparse();
        freed
    }

    /// Classes change rarely; a claim waiting for a class that now exists is queued.
    pub fn class_event(&mut self, change: Change<&VolumeAttributesClass>) -> Vec<Arc<str>> {
        let name = match change {
            Change::Apply(vac) | Change::Listed(vac) => {
                let vac = Vac::from_api(vac);
                self.relist.classes.saw(vac.name.as_str());
                let name = vac.name.clone();
                self.classes.insert(name.clone(), vac);
                name
            }
            Change::Delete(vac) => {
                self.classes.remove(&vac.name_any());
                return vec![];
            }
            Change::Relist => {
                self.relist.classes.start();
                return vec![];
            }
            Change::Relisted => {
                for name in self.relist.classes.finish(self.classes.keys()) {
                    self.classes.remove(&name);
                }
                return vec![];
            }
        };
        self.claims
            .iter()
            .filter(|(_, c)| {
                c.resize().is_some_and(|r| {
                    r.attributes_class.as_deref() == Some(name.as_str())
                        && r.modify_status
                            .as_ref()
                            .is_some_and(|s| s.status == "Pending")
                })
            })
            .map(|(key, _)| key.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn view(pv: &PersistentVolume) -> Arc<PvView> {
        Arc::new(PvView::from_api(pv, NEEDS))
    }

    fn claim_view(pvc: &PersistentVolumeClaim) -> Arc<ClaimView> {
        Arc::new(ClaimView::from_api(pvc, NEEDS))
    }

    fn pvc(name: &str, request: &str, extra: serde_json::Value) -> PersistentVolumeClaim {
        let mut v = json!({
            "metadata": {"namespace": "ns", "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1"},
            "spec": {"volumeName": format!("pv-{name}"), "resources": {"requests": {"storage": request}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
        });
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            for (k, val) in e {
                o.insert(k.clone(), val.clone());
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn pod(name: &str, claim: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"containers": [], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn claims_are_queued_when_their_size_or_binding_changes_not_for_labels() {
        let with_class = json!({"status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
            "modifyVolumeStatus": {"status": "Pending", "targetVolumeAttributesClassName": "x"}}});
        for recover in [true, false] {
            let mut index = Index::new("d", recover);
            let c = pvc("c", "2Gi", with_class.clone());
            assert_eq!(
                index.claim_event(Change::Apply(&claim_view(&c))),
                [Arc::<str>::from("ns/c")],
                "new"
            );
            let mut labelled = c.clone();
            labelled.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
            labelled.metadata.resource_version = Some("2".into());
            assert!(
                index
                    .claim_event(Change::Apply(&claim_view(&labelled)))
                    .is_empty(),
                "labels"
            );
            let grown = pvc("c", "3Gi", with_class.clone());
            assert_eq!(
                index.claim_event(Change::Apply(&claim_view(&grown))),
                [Arc::<str>::from("ns/c")],
                "grown"
            );
            let shrunk = pvc("c", "2Gi", with_class.clone());
            assert_eq!(
                index.claim_event(Change::Apply(&claim_view(&shrunk))).len(),
                usize::from(recover),
                "a smaller request counts only with recovery"
            );
        }
        // Binding, and a bound claim without modify status (upstream's modify filter).
        let mut index = Index::new("d", true);
        let pending = pvc("c", "1Gi", json!({"status": {"phase": "Pending"}}));
        index.claim_event(Change::Apply(&claim_view(&pending)));
        assert!(
            index
                .claim_event(Change::Apply(&claim_view(&pending)))
                .is_empty()
        );
        assert_eq!(
            index.claim_event(Change::Apply(&claim_view(&pvc("c", "1Gi", json!({}))))),
            [Arc::<str>::from("ns/c")]
        );
    }

    #[test]
    fn a_claim_refused_as_in_use_is_queued_when_its_last_running_pod_ends() {
        let mut index = Index::new("d", true);
        index.claim_event(Change::Apply(&claim_view(&pvc("c", "2Gi", json!({})))));
        index.pod_event(Change::Apply(&pod("p1", "c", "Running")));
        index.pod_event(Change::Apply(&pod("p2", "c", "Running")));
        assert!(index.view("ns/c").unwrap().in_use);
        index.set_in_use_refusal("ns/c", true);
        assert!(index.blocked_by_pods("ns/c"));
        assert!(
            index
                .pod_event(Change::Apply(&pod("p1", "c", "Succeeded")))
                .is_empty()
        );
        assert!(index.blocked_by_pods("ns/c"), "p2 still runs");
        assert_eq!(
            index.pod_event(Change::Delete(&pod("p2", "c", "Running"))),
            [Arc::<str>::from("ns/c")]
        );
        assert!(!index.blocked_by_pods("ns/c"));
        assert!(!index.view("ns/c").unwrap().in_use);
        // Terminated pods never counted; deleting one changes nothing.
        assert!(
            index
                .pod_event(Change::Delete(&pod("p1", "c", "Succeeded")))
                .is_empty()
        );
        assert_eq!(index.pod_count(), 0);
    }

    #[test]
    fn only_this_drivers_volumes_are_kept_and_they_queue_their_claims() {
        let mut index = Index::new("d", true);
        index.claim_event(Change::Apply(&claim_view(&pvc("c", "2Gi", json!({})))));
        let pv = |driver: &str, size: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pv-c"},
                "spec": {"capacity": {"storage": size}, "csi": {"driver": driver, "volumeHandle": "h"},
                         "claimRef": {"namespace": "ns", "name": "c", "uid": "uid-c"}}
            }))
            .unwrap()
        };
        assert!(
            index
                .pv_event(Change::Apply(&view(&pv("other", "1Gi"))))
                .is_empty()
        );
        assert_eq!(index.pv_count(), 0);
        assert_eq!(
            index.pv_event(Change::Apply(&view(&pv("d", "1Gi")))),
            [Arc::<str>::from("ns/c")]
        );
        assert!(
            index
                .pv_event(Change::Apply(&view(&pv("d", "1Gi"))))
                .is_empty()
        );
        assert_eq!(
            index.pv_event(Change::Apply(&view(&pv("d", "2Gi")))),
            [Arc::<str>::from("ns/c")]
        );
        assert!(index.view("ns/c").unwrap().pv.is_some());
    }
}
