#[test]
fn segments_of_a_node_affinity() {
    let affinity: k8s_openapi::api::core::v1::VolumeNodeAffinity =
        serde_json::from_value(serde_json::json!({"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                  {"key": "rack", "operator": "In", "values": ["1"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["d"]}]}
        ]}}))
        .unwrap();
    let expected: Segment = [("rack", "1"), ("zone", "a")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(affinity_segments(&affinity), vec![expected]);
    assert!(affinity_segments(&Default::default()).is_empty());
}

use super::*;

const DRIVER: &str = "d.example.com";

fn seg(zone: &str) -> Segment {
    [("zone".to_string(), zone.to_string())].into()
}

fn class(name: &str, mode: Option<&str>) -> ClassView {
    ClassView {
        name: name.into(),
        provisioner: DRIVER.into(),
        binding_mode: mode.map(Into::into),
        parameters: [("p".to_string(), "1".to_string())].into(),
    }
}

fn tracker(owner: Option<OwnerRef>) -> Tracker {
    Tracker::new(TrackerConfig {
        driver: DRIVER.into(),
        managed_by: MANAGED_BY.into(),
        immediate: false,
        owner,
        api_version: ApiVersion::V1,
    })
}

fn key(class: &str, zone: &str) -> Key {
    Key {
        class: Arc::from(class),
        segment: Arc::new(seg(zone)),
    }
}

fn stored(name: &str, class: &str, zone: &str, capacity: i128) -> Stored {
    Stored {
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: "1".into(),
        managed: true,
        class: class.into(),
        segment: Some(seg(zone)),
        capacity: Some(capacity),
        maximum: None,
        owners: Vec::new(),
    }
}

#[test]
fn segments_as_upstream_finds_them() {
    let mut t = TopologyInputs::default();
    let labels = |zone: &str, rack: Option<&str>| {
        let mut l: BTreeMap<String, String> = [("zone".to_string(), zone.to_string())].into();
        if let Some(r) = rack {
            l.insert("rack".into(), r.into());
        }
        l
    };
    assert!(t.set_csinode("n1", Some(vec!["zone".into(), "rack".into()])));
    assert!(
        !t.set_csinode("n1", Some(vec!["rack".into(), "zone".into()])),
        "same keys"
    );
    t.set_node("n1", labels("a", Some("r1")));
    t.set_csinode("n2", Some(vec!["zone".into(), "rack".into()]));
    t.set_node("n2", labels("a", None)); // lacks a key: ignored
    t.set_csinode("n3", Some(vec!["zone".into(), "rack".into()])); // no Node: ignored
    t.set_node("n4", labels("b", Some("r1"))); // driver not registered: ignored
    t.set_csinode("n4", None);
    t.set_csinode("n5", Some(vec!["zone".into(), "rack".into()]));
    t.set_node("n5", labels("a", Some("r1"))); // same segment as n1
    let segments = t.segments();
    assert_eq!(segments.len(), 1);
    let only = segments.into_iter().next().unwrap();
    assert_eq!(only.get("zone").map(String::as_str), Some("a"));
    assert_eq!(only.get("rack").map(String::as_str), Some("r1"));
    // Registered without keys: the empty segment.
    let mut plain = TopologyInputs::default();
    plain.set_csinode("n1", Some(vec![]));
    plain.set_node("n1", BTreeMap::new());
    assert_eq!(plain.segments(), [Segment::new()].into());
}

#[test]
fn classes_tracked_as_upstream() {
    assert!(class("a", Some("WaitForFirstConsumer")).tracked(DRIVER, false));
    assert!(!class("a", Some("Immediate")).tracked(DRIVER, false));
    assert!(class("a", Some("Immediate")).tracked(DRIVER, true));
    assert!(
        class("a", None).tracked(DRIVER, false),
        "unset counts as late"
    );
    let mut other = class("a", None);
    other.provisioner = "other".into();
    assert!(!other.tracked(DRIVER, true));
}

#[test]
fn desired_set_and_diffs() {
    let mut t = tracker(None);
    assert!(
        t.set_segments([seg("a"), seg("b")].into()).is_empty(),
        "no class yet"
    );
    let work = t.set_class(&class("fast", Some("WaitForFirstConsumer")));
    assert_eq!(work.len(), 2);
    assert!(
        t.set_class(&class("fast", Some("WaitForFirstConsumer")))
            .is_empty(),
        "unchanged"
    );
    assert!(
        t.set_class(&class("imm", Some("Immediate"))).is_empty(),
        "not tracked"
    );
    assert_eq!(
        t.counts(),
        Counts {
            goal: 2,
            current: 0,
            obsolete: 0
        }
    );

    // Objects arrive: one per key, plus a duplicate and one of a foreign class.
    assert!(t.object_applied(stored("o1", "fast", "a", 10)).is_empty());
    assert!(t.object_applied(stored("o2", "fast", "b", 10)).is_empty());
    assert_eq!(
        t.object_applied(stored("dup", "fast", "a", 10)),
        vec![Work::Delete("dup".into())]
    );
    assert_eq!(
        t.object_applied(stored("old", "gone", "a", 10)),
        vec![Work::Delete("old".into())]
    );
    assert_eq!(
        t.counts(),
        Counts {
            goal: 2,
            current: 2,
            obsolete: 2
        }
    );

    // Same answer: nothing to write; another one: an update of that object only.
    let k = key("fast", "a");
    assert_eq!(
        t.plan(
            &k,
            &Answer {
                available: 10,
                maximum: None
            }
        ),
        Plan::Unchanged
    );
    match t.plan(
        &k,
        &Answer {
            available: 1 << 30,
            maximum: Some(5),
        },
    ) {
        Plan::Update { name, patch } => {
            assert_eq!(name, "o1");
            assert_eq!(patch["capacity"], "1Gi");
            assert_eq!(patch["maximumVolumeSize"], "5");
            assert_eq!(patch["metadata"]["resourceVersion"], "1");
        }
        other => panic!("{other:?}"),
    }

    // A segment goes: its objects are deleted; a class goes: all of its objects.
    assert_eq!(
        t.set_segments([seg("a")].into()),
        vec![Work::Delete("o2".into())]
    );
    assert!(t.is_obsolete("o2"));
    let mut gone = t.remove_class("fast");
    gone.sort_by_key(|w| format!("{w:?}"));
    // o2 is still there (its deletion is queued): named again, the queue coalesces it.
    assert_eq!(
        gone,
        vec![
            Work::Delete("dup".into()),
            Work::Delete("o1".into()),
            Work::Delete("o2".into())
        ]
    );
    assert_eq!(
        t.plan(
            &k,
            &Answer {
                available: 1,
                maximum: None
            }
        ),
        Plan::Skip
    );
}

#[test]
fn holder_deleted_means_recreate_or_duplicate_takes_over() {
    let mut t = tracker(None);
    t.set_segments([seg("a")].into());
    t.set_class(&class("fast", None));
    t.object_applied(stored("o1", "fast", "a", 10));
    t.object_applied(stored("o2", "fast", "a", 10));
    assert_eq!(t.object_deleted("o1"), vec![Work::Sync(key("fast", "a"))]);
    assert!(!t.is_obsolete("o2"), "the duplicate holds the key now");
    assert!(t.object_deleted("o2").len() == 1);
    match t.plan(
        &key("fast", "a"),
        &Answer {
            available: 1 << 40,
            maximum: Some(1 << 30),
        },
    ) {
        Plan::Create(body) => {
            assert_eq!(body["metadata"]["generateName"], GENERATE_NAME);
            assert_eq!(body["metadata"]["labels"][DRIVER_NAME_LABEL], DRIVER);
            assert_eq!(body["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
            assert_eq!(body["storageClassName"], "fast");
            assert_eq!(body["nodeTopology"]["matchLabels"]["zone"], "a");
            assert_eq!(body["capacity"], "1Ti");
            assert_eq!(body["maximumVolumeSize"], "1Gi");
            assert!(body["metadata"].get("ownerReferences").is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn owner_is_added_when_missing() {
    let owner = OwnerRef {
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: "p".into(),
        uid: "u1".into(),
    };
    let mut t = tracker(Some(owner.clone()));
    t.set_segments([seg("a")].into());
    t.set_class(&class("fast", None));
    t.object_applied(stored("o1", "fast", "a", 10));
    match t.plan(
        &key("fast", "a"),
        &Answer {
            available: 10,
            maximum: None,
        },
    ) {
        Plan::Update { patch, .. } => {
            assert_eq!(patch["metadata"]["ownerReferences"][0]["uid"], "u1");
        }
        other => panic!("{other:?}"),
    }
    let mut owned = stored("o1", "fast", "a", 10);
    owned.resource_version = "2".into();
    owned.owners = vec![owner.to_json()];
    t.object_applied(owned);
    assert_eq!(
        t.plan(
            &key("fast", "a"),
            &Answer {
                available: 10,
                maximum: None
            }
        ),
        Plan::Unchanged
    );
}

#[test]
fn own_writes_do_not_overwrite_newer_watch_state() {
    let mut t = tracker(None);
    t.set_segments([seg("a")].into());
    t.set_class(&class("fast", None));
    t.object_applied(stored("o1", "fast", "a", 10));
    let mut newer = stored("o1", "fast", "a", 30);
    newer.resource_version = "3".into();
    t.object_applied(newer);
    let mut ours = stored("o1", "fast", "a", 20);
    ours.resource_version = "2".into();
    t.object_written(ours, "1");
    assert_eq!(
        t.holder(&key("fast", "a")).map(|s| s.capacity),
        Some(Some(30))
    );
    // Created and already seen by the watch: kept as seen.
    assert!(t.object_created(stored("o1", "fast", "a", 99)).is_empty());
    assert_eq!(
        t.holder(&key("fast", "a")).map(|s| s.capacity),
        Some(Some(30))
    );
}

#[test]
fn foreign_label_means_forget_and_recreate() {
    let mut t = tracker(None);
    t.set_segments([seg("a")].into());
    t.set_class(&class("fast", None));
    t.object_applied(stored("o1", "fast", "a", 10));
    let mut foreign = stored("o1", "fast", "a", 10);
    foreign.managed = false;
    assert_eq!(
        t.object_applied(foreign),
        vec![Work::Sync(key("fast", "a"))]
    );
    assert!(!t.known("o1"));
}

#[test]
fn probe_as_upstream() {
    let refused = |code| ProbeAnswer::Refused {
        code,
        message: "m".into(),
    };
    assert_eq!(probe_decision(refused(404)), Ok(ApiVersion::V1beta1));
    assert_eq!(probe_decision(refused(422)), Ok(ApiVersion::V1));
    assert!(matches!(
        probe_decision(refused(403)),
        Err(ProbeError::Unexpected(_))
    ));
    assert_eq!(
        probe_decision(ProbeAnswer::Created),
        Err(ProbeError::Created)
    );
}

#[test]
fn managed_by_with_node() {
    assert_eq!(managed_by(None), "external-provisioner");
    assert_eq!(managed_by(Some("n1")), "external-provisioner-n1");
    let long = "n".repeat(60);
    let v = managed_by(Some(&long));
    assert!(v.len() <= 63, "{v}");
    let short_node = "node-with-a-rather-long-name-0123456789abcdef";
    let v = managed_by(Some(short_node));
    assert_eq!(v.len(), 63);
    assert!(v.ends_with(short_node) && v.starts_with("ext"), "{v}");
}

fn meta(uid: &str, owners: &[(&str, &str, &str, &str, bool)]) -> OwnerMeta {
    OwnerMeta {
        uid: uid.into(),
        owners: owners
            .iter()
            .map(|(a, k, n, u, c)| {
                (
                    a.to_string(),
                    k.to_string(),
                    n.to_string(),
                    u.to_string(),
                    *c,
                )
            })
            .collect(),
    }
}

async fn walk(levels: i32) -> (Result<Option<OwnerRef>, OwnerError>, Vec<String>) {
    let mut reads = Vec::new();
    let result = lookup_owner(
        |api: String, kind: String, name: String| {
            reads.push(format!("{api}/{kind}/{name}"));
            let answer = match (kind.as_str(), name.as_str()) {
                ("Pod", "p") => Ok(meta(
                    "pod-uid",
                    &[
                        ("v1", "Node", "x", "nx", false),
                        ("apps/v1", "ReplicaSet", "rs", "rs-uid", true),
                    ],
                )),
                ("ReplicaSet", "rs") => Ok(meta(
                    "rs-uid",
                    &[("apps/v1", "Deployment", "dep", "dep-uid", true)],
                )),
                ("Deployment", "dep") => Ok(meta("dep-uid", &[])),
                _ => Err("not found".to_string()),
            };
            async move { answer }
        },
        "ns",
        ("v1", "Pod", "p"),
        levels,
    )
    .await;
    (result, reads)
}

#[tokio::test]
async fn owner_walk_as_upstream() {
    let (r, reads) = walk(-1).await;
    assert!(r.unwrap().is_none() && reads.is_empty());
    let (r, _) = walk(0).await;
    assert_eq!(r.unwrap().unwrap().uid, "pod-uid");
    let (r, reads) = walk(1).await;
    let o = r.unwrap().unwrap();
    assert_eq!((o.kind.as_str(), o.uid.as_str()), ("ReplicaSet", "rs-uid"));
    assert_eq!(reads, vec!["v1/Pod/p"], "the owner itself is not read");
    let (r, reads) = walk(2).await;
    let o = r.unwrap().unwrap();
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.name.as_str()),
        ("apps/v1", "Deployment", "dep")
    );
    assert_eq!(reads.len(), 2);
    let (r, _) = walk(3).await;
    assert!(
        r.unwrap_err()
            .to_string()
            .contains("has no controlling owner, cannot unwind the ownership further")
    );
}
