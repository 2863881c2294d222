use serde_json::json;
use sidecar_kit::pipeline::views::View;

use super::*;
use crate::model::NEEDS;

fn pv(name: &str, driver: &str, handle: &str, phase: &str) -> Arc<PvView> {
    let object = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"csi": {"driver": driver, "volumeHandle": handle},
                 "claimRef": {"namespace": "ns", "name": format!("c-{name}"), "uid": format!("u-{name}")}},
        "status": {"phase": phase},
    }))
    .unwrap();
    Arc::new(PvView::of(&object, NEEDS))
}

fn claim(name: &str, volume: &str) -> Arc<ClaimView> {
    let object = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name, "uid": format!("u-{volume}"), "resourceVersion": "1"},
        "spec": {"volumeName": volume},
    }))
    .unwrap();
    Arc::new(ClaimView::of(&object, NEEDS))
}

fn warning(name: &str, uid: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": name},
        "involvedObject": {"uid": uid},
        "type": "Warning", "reason": ABNORMAL,
    }))
    .unwrap()
}

#[test]
fn a_volume_of_this_driver_is_checked_once_bound() {
    let mut index = Index::new("d");
    assert!(
        index
            .pv_event(Change::Apply(&pv("a", "other", "h", "Bound")))
            .is_empty()
    );
    assert_eq!(index.pv_count(), 0, "other drivers' volumes are not kept");
    assert!(
        index
            .pv_event(Change::Apply(&pv("a", "d", "h", "Pending")))
            .is_empty()
    );
    assert_eq!(
        index.pv_event(Change::Apply(&pv("a", "d", "h", "Bound"))),
        vec![Work::Volume("a".into())]
    );
    assert!(
        index
            .pv_event(Change::Apply(&pv("a", "d", "h", "Bound")))
            .is_empty(),
        "an update is not another check"
    );
    assert!(index.target("a").is_none(), "no claim cached yet");
    assert_eq!(
        index.claim_event(Change::Apply(&claim("c-a", "a"))),
        vec![Work::Volume("a".into())],
        "the claim's arrival brings its volume back to be checked"
    );
    assert!(
        index
            .claim_event(Change::Apply(&claim("c-a", "a")))
            .is_empty(),
        "a claim's update is not another check"
    );
    assert!(
        index
            .claim_event(Change::Apply(&claim("c-b", "b")))
            .is_empty(),
        "nor is a claim of a volume not cached"
    );
    let target = index.target("a").expect("a target");
    assert_eq!(target.claim.name(), "c-a");
    assert!(!target.warned);
    assert_eq!(index.pv_of_handle("h").as_deref(), Some("a"));
    index.pv_event(Change::Delete(&pv("a", "d", "h", "Bound")));
    assert!(index.pv_of_handle("h").is_none() && index.target("a").is_none());
}

#[test]
fn a_recovery_is_reported_while_a_warning_lasts() {
    let mut index = Index::new("d");
    index.pv_event(Change::Apply(&pv("a", "d", "h", "Bound")));
    index.claim_event(Change::Apply(&claim("c-a", "a")));
    index.event_event(Change::Apply(&warning("e1", "u-a")));
    index.event_event(Change::Apply(&warning("e2", "u-a")));
    let target = index.target("a").unwrap();
    assert!(target.warned && !target.recovered);
    index.set_recovered(&target.claim.uid, true);
    assert!(index.target("a").unwrap().recovered);
    index.event_event(Change::Delete(&warning("e1", "u-a")));
    assert!(index.target("a").unwrap().warned, "one Warning left");
    // The re-list does not list e2: gone, and with it the memory of the recovery.
    index.event_event(Change::Relist);
    index.event_event(Change::Relisted);
    let target = index.target("a").unwrap();
    assert!(!target.warned && !target.recovered);
    let normal: Event = serde_json::from_value(json!({
        "metadata": {"namespace": "ns", "name": "n"},
        "involvedObject": {"uid": "u-a"}, "type": "Normal", "reason": ABNORMAL,
    }))
    .unwrap();
    index.event_event(Change::Apply(&normal));
    assert!(!index.target("a").unwrap().warned, "only Warnings count");
}

#[test]
fn the_claims_on_a_node_are_those_of_this_drivers_bound_volumes() {
    let mut index = Index::new("d");
    index.pv_event(Change::Apply(&pv("a", "d", "h", "Bound")));
    index.pv_event(Change::Apply(&pv("b", "other", "h2", "Bound")));
    index.claim_event(Change::Apply(&claim("c-a", "a")));
    index.claim_event(Change::Apply(&claim("c-b", "b")));
    let pod = |name: &str, node: &str, claims: &[&str]| -> Pod {
        let volumes: Vec<_> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"namespace": "ns", "name": name},
            "spec": {"nodeName": node, "containers": [], "volumes": volumes},
        }))
        .unwrap()
    };
    index.pod_event(Change::Apply(&pod("p1", "n1", &["c-a", "c-b"])));
    index.pod_event(Change::Apply(&pod("p2", "n1", &["c-a"])));
    index.pod_event(Change::Apply(&pod("p3", "n2", &["c-a"])));
    index.pod_event(Change::Apply(&pod("p4", "n1", &[])));
    assert_eq!(index.pod_count(), 3, "a pod without claims is not kept");
    let on_n1 = index.claims_on_node("n1");
    assert_eq!(on_n1.len(), 1);
    assert_eq!(on_n1[0].0.name(), "c-a");
    assert_eq!(on_n1[0].1, vec!["p1".into(), "p2".into()] as Vec<Box<str>>);
    // Scheduled later: an update moves the pod (upstream keeps the first sight of a pod).
    index.pod_event(Change::Apply(&pod("p3", "n1", &["c-a"])));
    assert_eq!(index.claims_on_node("n1")[0].1.len(), 3);
}

#[test]
fn a_node_is_looked_at_when_its_health_changes_or_it_goes() {
    let mut index = Index::new("d");
    let node = |ready: &str| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": ready,
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    };
    assert_eq!(
        index.node_event(Change::Apply(&node("True"))),
        vec![Work::Node("n1".into())]
    );
    assert!(index.node_event(Change::Apply(&node("True"))).is_empty());
    assert_eq!(
        index.node_event(Change::Apply(&node("Unknown"))),
        vec![Work::Node("n1".into())]
    );
    assert!(matches!(
        index.node("n1"),
        Some(NodeHealth::NotReady { since: Some(_) })
    ));
    assert_eq!(
        index.node_event(Change::Delete(&node("Unknown"))),
        vec![Work::Node("n1".into())]
    );
    assert_eq!(index.node("n1"), None);
}
