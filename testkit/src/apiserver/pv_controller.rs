//! A minimal PersistentVolume controller, doing what kube-controller-manager
//! does in the provisioning flows the sidecars take part in: announce the
//! external provisioner on claims, bind claims to the volumes whose claimRef
//! names them, and keep the phases of both. It runs in-process over the store
//! and reacts to store events.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::registry::KindId;
use super::store::{EventType, Store, Target, WatchEvent, WatchFrom, key_of, now_timestamp};

pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// Changes wanted on one object: a new object for a main write and/or a new `.status`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub object: Option<Value>,
    pub status: Option<Value>,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn annotation<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.pointer("/metadata/annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
}

fn set_annotation(obj: &mut Value, key: &str, value: &str) -> bool {
    if annotation(obj, key) == Some(value) {
        return false;
    }
    if !obj
        .pointer("/metadata/annotations")
        .is_some_and(Value::is_object)
    {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"][key] = json!(value);
    true
}

/// Whether the volume's claimRef names this claim (a claimRef without uid matches any incarnation).
pub fn claim_ref_matches(volume: &Value, claim: &Value) -> bool {
    let r = match volume.pointer("/spec/claimRef") {
        Some(r) if r.is_object() => r,
        _ => return false,
    };
    let uid = str_at(r, "/uid");
    str_at(r, "/namespace") == str_at(claim, "/metadata/namespace")
        && str_at(r, "/name") == str_at(claim, "/metadata/name")
        && (uid.is_empty() || uid == str_at(claim, "/metadata/uid"))
}

fn with_phase(obj: &Value, phase: &str, transition_time: bool) -> Option<Value> {
    if str_at(obj, "/status/phase") == phase {
        return None;
    }
    let mut status = obj
        .get("status")
        .filter(|s| s.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    status["phase"] = json!(phase);
    if transition_time {
        status["lastPhaseTransitionTime"] = json!(now_timestamp());
    }
    Some(status)
}

/// The claim status of a claim bound to `volume`.
fn bound_claim_status(claim: &Value, volume: &Value) -> Option<Value> {
    let mut status: Map<String, Value> = claim
        .get("status")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // The capacity is the volume's only when the claim becomes bound: later the two differ on
    // purpose while an expansion waits for the node (kube's `updateClaimStatus`).
    let becoming_bound = status.get("phase").and_then(Value::as_str) != Some("Bound");
    status.insert("phase".into(), json!("Bound"));
    for (field, from) in [
        ("capacity", "/spec/capacity"),
        ("accessModes", "/spec/accessModes"),
    ] {
        if field == "capacity" && !becoming_bound {
            continue;
        }
        match volume.pointer(from) {
            Some(v) => status.insert(field.into(), v.clone()),
            None => status.remove(field),
        };
    }
    let status = Value::Object(status);
    (claim.get("status") != Some(&status)).then_some(status)
}

/// The volume side of a binding: claimRef complete, phase Bound.
fn bind_volume(volume: &Value, claim: &Value) -> Plan {
    let mut plan = Plan::default();
    let r = volume.pointer("/spec/claimRef");
    if r.is_none_or(|r| str_at(r, "/uid").is_empty()) {
        let mut v = volume.clone();
        if r.is_none_or(Value::is_null) {
            set_annotation(&mut v, ANN_BOUND_BY_CONTROLLER, "yes");
        }
        v["spec"]["claimRef"] = json!({
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "namespace": str_at(claim, "/metadata/namespace"),
            "name": str_at(claim, "/metadata/name"),
            "uid": str_at(claim, "/metadata/uid"),
            "resourceVersion": str_at(claim, "/metadata/resourceVersion"),
        });
        plan.object = Some(v);
    }
    plan.status = with_phase(volume, "Bound", true);
    plan
}

/// Plans one claim. `volume` is the volume named by `spec.volumeName`, or for
/// an unbound claim the volume whose claimRef names it; `class` its StorageClass.
/// Returns the claim's plan and the volume's.
pub fn plan_claim(claim: &Value, volume: Option<&Value>, class: Option<&Value>) -> (Plan, Plan) {
    if claim
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return (Plan::default(), Plan::default());
    }
    let mut obj = claim.clone();
    let mut changed = false;
    let volume_name = str_at(claim, "/spec/volumeName");
    let bind_completed = annotation(claim, ANN_BIND_COMPLETED) == Some("yes");
    let (status, vplan) = match (volume_name.is_empty(), volume) {
        (true, Some(pv)) if claim_ref_matches(pv, claim) => {
            obj["spec"]["volumeName"] = json!(str_at(pv, "/metadata/name"));
            set_annotation(&mut obj, ANN_BIND_COMPLETED, "yes");
            set_annotation(&mut obj, ANN_BOUND_BY_CONTROLLER, "yes");
            changed = true;
            (bound_claim_status(claim, pv), bind_volume(pv, claim))
        }
        (true, _) => {
            if let Some(provisioner) = class
                .map(|c| str_at(c, "/provisioner"))
                .filter(|p| !p.is_empty() && !p.starts_with("kubernetes.io/"))
            {
                let wait = class
                    .is_some_and(|c| str_at(c, "/volumeBindingMode") == "WaitForFirstConsumer");
                if !wait || annotation(claim, ANN_SELECTED_NODE).is_some() {
                    changed |= set_annotation(&mut obj, ANN_STORAGE_PROVISIONER, provisioner);
                    changed |= set_annotation(&mut obj, ANN_BETA_STORAGE_PROVISIONER, provisioner);
                }
            }
            (with_phase(claim, "Pending", false), Plan::default())
        }
        (false, None) => (
            with_phase(
                claim,
                if bind_completed { "Lost" } else { "Pending" },
                false,
            ),
            Plan::default(),
        ),
        (false, Some(pv)) => {
            let free = pv.pointer("/spec/claimRef").is_none_or(Value::is_null);
            if free || claim_ref_matches(pv, claim) {
                changed |= set_annotation(&mut obj, ANN_BIND_COMPLETED, "yes");
                (bound_claim_status(claim, pv), bind_volume(pv, claim))
            } else {
                (
                    with_phase(
                        claim,
                        if bind_completed { "Lost" } else { "Pending" },
                        false,
                    ),
                    Plan::default(),
                )
            }
        }
    };
    (
        Plan {
            object: changed.then_some(obj),
            status,
        },
        vplan,
    )
}

/// Plans one volume; `claim` is the claim its claimRef names (by namespace/name), if it exists.
pub fn plan_volume(volume: &Value, claim: Option<&Value>) -> Plan {
    let Some(r) = volume.pointer("/spec/claimRef").filter(|r| r.is_object()) else {
        return Plan {
            object: None,
            status: with_phase(volume, "Available", true),
        };
    };
    let name = str_at(volume, "/metadata/name");
    match claim {
        Some(c) if claim_ref_matches(volume, c) => {
            let claim_volume = str_at(c, "/spec/volumeName");
            if claim_volume == name {
                bind_volume(volume, c)
            } else if claim_volume.is_empty() {
                // The claim's own sync binds it.
                Plan::default()
            } else if annotation(volume, ANN_BOUND_BY_CONTROLLER) == Some("yes") {
                // The claim went to another volume: undo our half of the binding.
                let mut v = volume.clone();
                if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("claimRef");
                }
                Plan {
                    object: Some(v),
                    status: with_phase(volume, "Available", true),
                }
            } else {
                Plan::default()
            }
        }
        _ if str_at(r, "/uid").is_empty() => Plan {
            object: None,
            status: with_phase(volume, "Available", true),
        },
        // The bound claim is gone (or was recreated with a new uid).
        _ if str_at(volume, "/status/phase") == "Failed" => Plan::default(),
        _ => Plan {
            object: None,
            status: with_phase(volume, "Released", true),
        },
    }
}

#[derive(Debug, Clone, Copy)]
struct Kinds {
    pvc: KindId,
    pv: KindId,
    sc: KindId,
}

fn apply(s: &mut Store, kind: KindId, key: &(String, String), plan: Plan) {
    if let Some(mut obj) = plan.object {
        if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
        }
        if let Err(e) = s.update(kind, &key.0, &key.1, obj, Target::Main, false) {
            tracing::debug!(error = %e, "pv controller write");
            return;
        }
    }
    if let Some(status) = plan.status
        && let Ok(current) = s.get(kind, &key.0, &key.1)
    {
        let mut obj = (*current).clone();
        obj["status"] = status;
        if let Err(e) = s.update(kind, &key.0, &key.1, obj, Target::Status, false) {
            tracing::debug!(error = %e, "pv controller status write");
        }
    }
}

/// The volumes whose claimRef names a claim, by the claim's namespace and name, fed by the
/// volumes' events: an unbound or deleted claim looks its volumes up here instead of scanning
/// every volume (with tens of thousands of volumes the scans made each claim event slow).
/// Entries can lag the store; candidates are checked against it.
#[derive(Debug, Default)]
struct ClaimRefs {
    volumes: HashMap<(String, String), BTreeSet<String>>,
    claim_of: HashMap<String, (String, String)>,
}

impl ClaimRefs {
    fn of_store(s: &Store, pv: KindId) -> Self {
        let mut refs = Self::default();
        for volume in s.all(pv) {
            refs.record(volume);
        }
        refs
    }

    fn record(&mut self, volume: &Value) {
        let name = str_at(volume, "/metadata/name");
        self.forget(name);
        let claim = (
            str_at(volume, "/spec/claimRef/namespace").to_string(),
            str_at(volume, "/spec/claimRef/name").to_string(),
        );
        if claim.1.is_empty() {
            return;
        }
        self.volumes
            .entry(claim.clone())
            .or_default()
            .insert(name.to_string());
        self.claim_of.insert(name.to_string(), claim);
    }

    fn forget(&mut self, volume: &str) {
        let Some(claim) = self.claim_of.remove(volume) else {
            return;
        };
        if let Some(names) = self.volumes.get_mut(&claim) {
            names.remove(volume);
            if names.is_empty() {
                self.volumes.remove(&claim);
            }
        }
    }

    fn naming(&self, ns: &str, name: &str) -> Vec<String> {
        self.volumes
            .get(&(ns.to_string(), name.to_string()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn sync_claim(s: &mut Store, k: Kinds, refs: &ClaimRefs, ns: &str, name: &str) {
    let Ok(claim) = s.get(k.pvc, ns, name) else {
        return;
    };
    let volume_name = str_at(&claim, "/spec/volumeName");
    let volume = if volume_name.is_empty() {
        refs.naming(ns, name)
            .iter()
            .filter_map(|v| s.get(k.pv, "", v).ok())
            .find(|pv| claim_ref_matches(pv, &claim))
    } else {
        s.get(k.pv, "", volume_name).ok()
    };
    let class_name = str_at(&claim, "/spec/storageClassName");
    let class = (!class_name.is_empty())
        .then(|| s.get(k.sc, "", class_name).ok())
        .flatten();
    let (cplan, vplan) = plan_claim(&claim, volume.as_deref(), class.as_deref());
    if let Some(pv) = &volume {
        apply(s, k.pv, &key_of(pv), vplan);
    }
    apply(s, k.pvc, &key_of(&claim), cplan);
}

fn sync_volume(s: &mut Store, k: Kinds, refs: &ClaimRefs, name: &str) {
    let Ok(volume) = s.get(k.pv, "", name) else {
        return;
    };
    let (ns, claim_name) = (
        str_at(&volume, "/spec/claimRef/namespace"),
        str_at(&volume, "/spec/claimRef/name"),
    );
    let claim = (!claim_name.is_empty())
        .then(|| s.get(k.pvc, ns, claim_name).ok())
        .flatten();
    apply(
        s,
        k.pv,
        &key_of(&volume),
        plan_volume(&volume, claim.as_deref()),
    );
    // A claim waiting for this volume: unbound, or naming it before it existed (the real
    // controller queues such a claim from the volume's sync as well).
    if let Some(c) = claim.filter(|c| {
        let named = str_at(c, "/spec/volumeName");
        named.is_empty() || (named == name && str_at(c, "/status/phase") != "Bound")
    }) {
        sync_claim(s, k, refs, ns, str_at(&c, "/metadata/name"));
    }
}

fn sync_all(s: &mut Store, k: Kinds, refs: &mut ClaimRefs) {
    *refs = ClaimRefs::of_store(s, k.pv);
    let claims: Vec<_> = s.all(k.pvc).map(|c| key_of(c)).collect();
    for (ns, name) in claims {
        sync_claim(s, k, refs, &ns, &name);
    }
    let volumes: Vec<_> = s.all(k.pv).map(|v| key_of(v).1).collect();
    for name in volumes {
        sync_volume(s, k, refs, &name);
    }
}

fn on_event(s: &mut Store, k: Kinds, refs: &mut ClaimRefs, ev: &WatchEvent) {
    let (ns, name) = key_of(&ev.object);
    if ev.kind == k.pvc {
        if ev.etype == EventType::Deleted {
            for v in refs.naming(&ns, &name) {
                if s.get(k.pv, "", &v)
                    .is_ok_and(|pv| claim_ref_matches(&pv, &ev.object))
                {
                    sync_volume(s, k, refs, &v);
                }
            }
        } else {
            sync_claim(s, k, refs, &ns, &name);
        }
    } else if ev.kind == k.pv {
        if ev.etype == EventType::Deleted {
            refs.forget(&name);
            let claim_ns = str_at(&ev.object, "/spec/claimRef/namespace").to_string();
            let claim = str_at(&ev.object, "/spec/claimRef/name").to_string();
            sync_claim(s, k, refs, &claim_ns, &claim);
        } else {
            refs.record(&ev.object);
            sync_volume(s, k, refs, &name);
        }
    } else {
        sync_all(s, k, refs);
    }
}

/// Runs the controller until `shutdown`; re-subscribes (with a full resync)
/// whenever its watches are closed.
pub(crate) async fn run(store: Arc<Mutex<Store>>, shutdown: CancellationToken) {
    let lock = || store.lock().unwrap_or_else(PoisonError::into_inner);
    let kinds = {
        let s = lock();
        let r = s.registry();
        match (
            r.core("persistentvolumeclaims"),
            r.core("persistentvolumes"),
            r.lookup("storage.k8s.io", "v1", "storageclasses"),
        ) {
            (Some(pvc), Some(pv), Some(sc)) => Kinds { pvc, pv, sc },
            _ => return,
        }
    };
    let mut refs = ClaimRefs::default();
    loop {
        let subscribed = {
            let mut s = lock();
            let subs = (
                s.watch(kinds.pvc, WatchFrom::Current),
                s.watch(kinds.pv, WatchFrom::Current),
                s.watch(kinds.sc, WatchFrom::Current),
            );
            sync_all(&mut s, kinds, &mut refs);
            subs
        };
        let (Ok(mut pvcs), Ok(mut pvs), Ok(mut scs)) = subscribed else {
            return;
        };
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = pvcs.events.recv() => ev,
                ev = pvs.events.recv() => ev,
                ev = scs.events.recv() => ev,
            };
            let Some(ev) = ev else { break };
            on_event(&mut lock(), kinds, &mut refs, &ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "5"}, "spec": {"storageClassName": "fast"}, "status": {"phase": "Pending"}})
    }

    fn class(provisioner: &str, mode: &str) -> Value {
        json!({"metadata": {"name": "fast"}, "provisioner": provisioner, "volumeBindingMode": mode})
    }

    #[test]
    fn announces_external_provisioners_only() {
        let (p, _) = plan_claim(&claim(), None, Some(&class("csi.example.com", "Immediate")));
        let obj = p.object.unwrap();
        assert_eq!(
            annotation(&obj, ANN_STORAGE_PROVISIONER),
            Some("csi.example.com")
        );
        assert_eq!(
            annotation(&obj, ANN_BETA_STORAGE_PROVISIONER),
            Some("csi.example.com")
        );
        let (p, _) = plan_claim(
            &claim(),
            None,
            Some(&class("kubernetes.io/no-provisioner", "Immediate")),
        );
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn wait_for_first_consumer_needs_a_selected_node() {
        let sc = class("csi.example.com", "WaitForFirstConsumer");
        assert_eq!(plan_claim(&claim(), None, Some(&sc)).0, Plan::default());
        let mut c = claim();
        c["metadata"]["annotations"] = json!({ANN_SELECTED_NODE: "node-1"});
        assert!(plan_claim(&c, None, Some(&sc)).0.object.is_some());
    }

    #[test]
    fn binds_claim_to_volume_naming_it() {
        let pv = json!({"metadata": {"name": "pv-1"}, "spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}, "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Pending"}});
        let (cp, vp) = plan_claim(&claim(), Some(&pv), None);
        let obj = cp.object.unwrap();
        assert_eq!(obj["spec"]["volumeName"], "pv-1");
        assert_eq!(annotation(&obj, ANN_BIND_COMPLETED), Some("yes"));
        assert_eq!(annotation(&obj, ANN_BOUND_BY_CONTROLLER), Some("yes"));
        let st = cp.status.unwrap();
        assert_eq!(st["phase"], "Bound");
        assert_eq!(st["capacity"]["storage"], "1Gi");
        assert!(vp.object.is_none(), "claimRef already complete");
        assert_eq!(vp.status.unwrap()["phase"], "Bound");
    }

    #[test]
    fn volume_phases_follow_their_claims() {
        let pv = json!({"metadata": {"name": "pv-1"}, "spec": {"claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}}, "status": {"phase": "Bound"}});
        assert_eq!(plan_volume(&pv, None).status.unwrap()["phase"], "Released");
        let mut other = claim();
        other["metadata"]["uid"] = json!("u2");
        assert_eq!(
            plan_volume(&pv, Some(&other)).status.unwrap()["phase"],
            "Released"
        );
        let free =
            json!({"metadata": {"name": "pv-2"}, "spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(
            plan_volume(&free, None).status.unwrap()["phase"],
            "Available"
        );
        let mut bound = claim();
        bound["spec"]["volumeName"] = json!("pv-1");
        assert_eq!(
            plan_volume(&pv, Some(&bound)),
            Plan::default(),
            "already Bound"
        );
        let mut lost = claim();
        lost["spec"]["volumeName"] = json!("gone");
        lost["metadata"]["annotations"] = json!({ANN_BIND_COMPLETED: "yes"});
        assert_eq!(
            plan_claim(&lost, None, None).0.status.unwrap()["phase"],
            "Lost"
        );
    }
}
