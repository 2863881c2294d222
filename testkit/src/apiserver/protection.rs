//! Storage object in-use protection, as a real cluster does it:
//!
//! - the API server's `StorageObjectInUseProtection` admission adds
//!   `kubernetes.io/pv-protection` to every PersistentVolume and
//!   `kubernetes.io/pvc-protection` to every PersistentVolumeClaim created
//!   (and `kubernetes.io/vac-protection` to VolumeAttributesClasses while the
//!   VolumeAttributesClass gate is on);
//! - kube-controller-manager's pv-protection, pvc-protection and
//!   vac-protection controllers remove the finalizer once deletion is
//!   requested and the object is unused, and add it to objects lacking it.
//!
//! The controllers run in-process over the store, react to its events and
//! write with the resourceVersion of the object they read, so a client
//! writing concurrently from an older read gets `409 Conflict` as on a real
//! cluster.

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::gates::{FeatureGates, Gate};
use super::registry::{Kind, KindId};
use super::store::{EventType, Store, Target, WatchEvent, WatchFrom, key_of};

pub const PV_PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
pub const VAC_PROTECTION_FINALIZER: &str = "kubernetes.io/vac-protection";

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(f)))
}

fn being_deleted(obj: &Value) -> bool {
    obj.pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// The finalizer the admission plugin adds to objects of this kind, if any.
pub fn finalizer_for(k: &Kind, gates: &FeatureGates) -> Option<&'static str> {
    match (k.group, k.kind) {
        ("", "PersistentVolume") => Some(PV_PROTECTION_FINALIZER),
        ("", "PersistentVolumeClaim") => Some(PVC_PROTECTION_FINALIZER),
        ("storage.k8s.io", "VolumeAttributesClass")
            if gates.enabled(Gate::VolumeAttributesClass) =>
        {
            Some(VAC_PROTECTION_FINALIZER)
        }
        _ => None,
    }
}

/// The admission plugin, on create: appends the protection finalizer unless present.
pub fn admit(k: &Kind, obj: &mut Value, gates: &FeatureGates) {
    let Some(f) = finalizer_for(k, gates) else {
        return;
    };
    if has_finalizer(obj, f) {
        return;
    }
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    match meta.get_mut("finalizers") {
        Some(Value::Array(list)) => list.push(json!(f)),
        _ => {
            meta.insert("finalizers".into(), json!([f]));
        }
    }
}

/// `NeedToAddFinalizer` / `IsDeletionCandidate` of the controllers'
/// protectionutil: the finalizer to add (true) or to remove (false).
fn wanted_change(obj: &Value, f: &str, in_use: impl FnOnce() -> bool) -> Option<bool> {
    let deleting = being_deleted(obj);
    let has = has_finalizer(obj, f);
    if deleting && has && !in_use() {
        return Some(false);
    }
    (!deleting && !has).then_some(true)
}

/// pv-protection: a PV is in use while its phase is Bound.
pub fn volume_in_use(pv: &Value) -> bool {
    str_at(pv, "/status/phase") == "Bound"
}

/// Whether a pod was shut down by the kubelet or force-deleted: deletion
/// requested with a zero grace period.
fn pod_is_shut_down(pod: &Value) -> bool {
    being_deleted(pod)
        && pod
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            == Some(0)
}

fn controlled_by(obj: &Value, owner: &Value) -> bool {
    let uid = str_at(owner, "/metadata/uid");
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .is_some_and(|refs| {
            refs.iter().any(|r| {
                r.get("controller").and_then(Value::as_bool) == Some(true)
                    && str_at(r, "/uid") == uid
            })
        })
}

/// pvc-protection's `podUsesPVC`: only scheduled pods count; a volume naming
/// the claim always does, a generic ephemeral volume only while the pod is
/// not shut down and only for the claim created for (controlled by) the pod.
pub fn pod_uses_claim(pod: &Value, claim: &Value) -> bool {
    if str_at(pod, "/spec/nodeName").is_empty()
        || str_at(pod, "/metadata/namespace") != str_at(claim, "/metadata/namespace")
    {
        return false;
    }
    let claim_name = str_at(claim, "/metadata/name");
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .is_some_and(|vols| {
            vols.iter().any(|v| {
                let named = v
                    .get("persistentVolumeClaim")
                    .is_some_and(|p| str_at(p, "/claimName") == claim_name);
                let ephemeral = v.get("ephemeral").is_some_and(|e| !e.is_null())
                    && !pod_is_shut_down(pod)
                    && format!("{}-{}", str_at(pod, "/metadata/name"), str_at(v, "/name"))
                        == claim_name
                    && controlled_by(claim, pod);
                named || ephemeral
            })
        })
}

/// The VolumeAttributesClasses a claim refers to (spec, current status, modification target).
fn claim_classes(claim: &Value) -> [&str; 3] {
    [
        str_at(claim, "/spec/volumeAttributesClassName"),
        str_at(claim, "/status/currentVolumeAttributesClassName"),
        str_at(
            claim,
            "/status/modifyVolumeStatus/targetVolumeAttributesClassName",
        ),
    ]
}

#[derive(Debug, Clone, Copy)]
struct Kinds {
    pv: KindId,
    pvc: KindId,
    pod: KindId,
    vac: Option<KindId>,
}

/// Writes the object with the finalizer added or removed, as the controllers'
/// `Update` with the object they read.
fn write(s: &mut Store, kind: KindId, obj: &Value, f: &str, add: bool) {
    let mut updated = obj.clone();
    let mut list: Vec<Value> = updated
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if add {
        list.push(json!(f));
    } else {
        list.retain(|x| x.as_str() != Some(f));
    }
    updated["metadata"]["finalizers"] = Value::Array(list);
    let (ns, name) = key_of(obj);
    if let Err(e) = s.update(kind, &ns, &name, updated, Target::Main, false) {
        tracing::debug!(error = %e, finalizer = f, "protection controller write");
    }
}

fn process_volume(s: &mut Store, k: Kinds, name: &str) {
    let Ok(pv) = s.get(k.pv, "", name) else {
        return;
    };
    if let Some(add) = wanted_change(&pv, PV_PROTECTION_FINALIZER, || volume_in_use(&pv)) {
        write(s, k.pv, &pv, PV_PROTECTION_FINALIZER, add);
    }
}

fn process_claim(s: &mut Store, k: Kinds, ns: &str, name: &str) {
    let Ok(claim) = s.get(k.pvc, ns, name) else {
        return;
    };
    let change = wanted_change(&claim, PVC_PROTECTION_FINALIZER, || {
        s.all(k.pod).any(|pod| pod_uses_claim(pod, &claim))
    });
    if let Some(add) = change {
        write(s, k.pvc, &claim, PVC_PROTECTION_FINALIZER, add);
    }
}

fn process_class(s: &mut Store, k: Kinds, vac: KindId, name: &str) {
    let Ok(class) = s.get(vac, "", name) else {
        return;
    };
    let change = wanted_change(&class, VAC_PROTECTION_FINALIZER, || {
        s.all(k.pv)
            .any(|pv| str_at(pv, "/spec/volumeAttributesClassName") == name)
            || s.all(k.pvc).any(|c| claim_classes(c).contains(&name))
    });
    if let Some(add) = change {
        write(s, vac, &class, VAC_PROTECTION_FINALIZER, add);
    }
}

fn process_deleting_classes(s: &mut Store, k: Kinds) {
    let Some(vac) = k.vac else {
        return;
    };
    let names: Vec<String> = s
        .all(vac)
        .filter(|c| being_deleted(c))
        .map(|c| key_of(c).1)
        .collect();
    for n in names {
        process_class(s, k, vac, &n);
    }
}

fn sync_all(s: &mut Store, k: Kinds) {
    let volumes: Vec<String> = s.all(k.pv).map(|v| key_of(v).1).collect();
    for v in volumes {
        process_volume(s, k, &v);
    }
    let claims: Vec<(String, String)> = s.all(k.pvc).map(|c| key_of(c)).collect();
    for (ns, name) in claims {
        process_claim(s, k, &ns, &name);
    }
    if let Some(vac) = k.vac {
        let classes: Vec<String> = s.all(vac).map(|c| key_of(c).1).collect();
        for c in classes {
            process_class(s, k, vac, &c);
        }
    }
}

fn on_event(s: &mut Store, k: Kinds, ev: &WatchEvent) {
    let (ns, name) = key_of(&ev.object);
    if ev.kind == k.pv {
        if ev.etype != EventType::Deleted {
            process_volume(s, k, &name);
        }
        process_deleting_classes(s, k);
    } else if ev.kind == k.pvc {
        if ev.etype != EventType::Deleted {
            process_claim(s, k, &ns, &name);
        }
        process_deleting_classes(s, k);
    } else if ev.kind == k.pod {
        // A pod going away or stopping may release the claims it mounts (only those: a scan
        // of every claim per pod event would make a cluster of many pods crawl).
        let pod_name = str_at(&ev.object, "/metadata/name");
        let mounted: Vec<String> = ev
            .object
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| match v.pointer("/persistentVolumeClaim/claimName") {
                Some(claim) => claim.as_str().map(str::to_string),
                // An ephemeral volume's claim is named after the pod and the volume.
                None => v
                    .get("ephemeral")
                    .filter(|e| !e.is_null())
                    .map(|_| format!("{pod_name}-{}", str_at(v, "/name"))),
            })
            .collect();
        let claims: Vec<String> = mounted
            .into_iter()
            .filter(|c| {
                s.get(k.pvc, &ns, c)
                    .is_ok_and(|claim| being_deleted(&claim))
            })
            .collect();
        for c in claims {
            process_claim(s, k, &ns, &c);
        }
    } else if Some(ev.kind) == k.vac
        && ev.etype != EventType::Deleted
        && let Some(vac) = k.vac
    {
        process_class(s, k, vac, &name);
    }
}

/// Runs the three controllers until `shutdown`; re-subscribes (with a full
/// resync) whenever their watches are closed.
pub(crate) async fn run(store: Arc<Mutex<Store>>, shutdown: CancellationToken) {
    let lock = || store.lock().unwrap_or_else(PoisonError::into_inner);
    let kinds = {
        let s = lock();
        let r = s.registry();
        let vac = r
            .lookup("storage.k8s.io", "v1", "volumeattributesclasses")
            .filter(|_| s.feature_gates().enabled(Gate::VolumeAttributesClass));
        match (
            r.core("persistentvolumes"),
            r.core("persistentvolumeclaims"),
            r.core("pods"),
        ) {
            (Some(pv), Some(pvc), Some(pod)) => Kinds { pv, pvc, pod, vac },
            _ => return,
        }
    };
    loop {
        let subscribed = {
            let mut s = lock();
            let subs = (
                s.watch(kinds.pv, WatchFrom::Current),
                s.watch(kinds.pvc, WatchFrom::Current),
                s.watch(kinds.pod, WatchFrom::Current),
                kinds.vac.map(|v| s.watch(v, WatchFrom::Current)),
            );
            sync_all(&mut s, kinds);
            subs
        };
        let (Ok(mut pvs), Ok(mut pvcs), Ok(mut pods), vacs) = subscribed else {
            return;
        };
        let mut vacs = match vacs {
            Some(Ok(w)) => Some(w),
            Some(Err(_)) => return,
            None => None,
        };
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = pvs.events.recv() => ev,
                ev = pvcs.events.recv() => ev,
                ev = pods.events.recv() => ev,
                ev = async {
                    match vacs.as_mut() {
                        Some(w) => w.events.recv().await,
                        None => std::future::pending().await,
                    }
                } => ev,
            };
            let Some(ev) = ev else { break };
            on_event(&mut lock(), kinds, &ev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim() -> Value {
        json!({"metadata": {"name": "c", "namespace": "ns", "uid": "cu"}})
    }

    fn pod(volumes: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "pu"},
               "spec": {"nodeName": "n", "volumes": volumes}})
    }

    #[test]
    fn only_scheduled_pods_use_claims() {
        let p = pod(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]));
        assert!(pod_uses_claim(&p, &claim()));
        let mut unscheduled = p.clone();
        unscheduled["spec"]
            .as_object_mut()
            .unwrap()
            .remove("nodeName");
        assert!(!pod_uses_claim(&unscheduled, &claim()));
        let mut elsewhere = p.clone();
        elsewhere["metadata"]["namespace"] = json!("other");
        assert!(!pod_uses_claim(&elsewhere, &claim()));
        // A shut-down pod still holds a claim it names.
        let mut down = p.clone();
        down["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        down["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        assert!(pod_uses_claim(&down, &claim()));
    }

    #[test]
    fn ephemeral_claims_count_while_the_owning_pod_runs() {
        let p = pod(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {}}}]));
        let mut c = json!({"metadata": {"name": "p-scratch", "namespace": "ns", "uid": "x"}});
        assert!(!pod_uses_claim(&p, &c), "not created for the pod");
        c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pu", "controller": true}]);
        assert!(pod_uses_claim(&p, &c));
        let mut down = p.clone();
        down["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
        down["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        assert!(!pod_uses_claim(&down, &c));
        let mut graceful = down.clone();
        graceful["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        assert!(pod_uses_claim(&graceful, &c));
    }

    #[test]
    fn finalizers_are_added_when_missing_and_removed_when_unused() {
        let live = json!({"metadata": {"name": "v"}});
        assert_eq!(
            wanted_change(&live, PV_PROTECTION_FINALIZER, || false),
            Some(true)
        );
        let deleting = json!({"metadata": {"name": "v", "deletionTimestamp": "t",
            "finalizers": [PV_PROTECTION_FINALIZER]}});
        assert_eq!(
            wanted_change(&deleting, PV_PROTECTION_FINALIZER, || true),
            None
        );
        assert_eq!(
            wanted_change(&deleting, PV_PROTECTION_FINALIZER, || false),
            Some(false)
        );
        let r = super::super::registry::Registry::builtin();
        let pv = r.get(r.core("persistentvolumes").unwrap());
        let mut obj = json!({"metadata": {"name": "v", "finalizers": ["a/b"]}});
        admit(pv, &mut obj, &FeatureGates::default());
        assert_eq!(
            obj["metadata"]["finalizers"],
            json!(["a/b", PV_PROTECTION_FINALIZER])
        );
        admit(pv, &mut obj, &FeatureGates::default());
        assert_eq!(obj["metadata"]["finalizers"].as_array().unwrap().len(), 2);
    }
}
