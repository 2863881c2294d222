use super::*;
use crate::mockdriver::config::Capabilities;

fn config() -> MockConfig {
    MockConfig {
        total_capacity: 100,
        default_volume_size: 10,
        ..MockConfig::default()
    }
}

fn cap(mode: AccessMode) -> Capability {
    Capability {
        access_mode: mode,
        access_type: AccessType::Mount {
            fs_type: "ext4".into(),
            mount_flags: vec![],
        },
    }
}

fn request(name: &str, required: i64) -> VolumeRequest {
    VolumeRequest {
        name: name.into(),
        required_bytes: required,
        capabilities: vec![cap(AccessMode::SingleNodeWriter)],
        ..VolumeRequest::default()
    }
}

fn segment(zone: &str) -> Segment {
    Segment::from([("zone".into(), zone.into())])
}

fn publication(mode: AccessMode) -> Publication {
    Publication {
        readonly: false,
        capability: cap(mode),
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, Rejection>) -> Code {
    result.unwrap_err().code
}

#[test]
fn create_is_idempotent_by_name() {
    let mut state = State::default();
    let first = state.create_volume(&config(), request("a", 20)).unwrap();
    let again = state.create_volume(&config(), request("a", 20)).unwrap();
    assert_eq!(first, again);
    assert_eq!(state.volumes.len(), 1);
    let other = state.create_volume(&config(), request("b", 20)).unwrap();
    assert_ne!(first.id, other.id);
}

#[test]
fn create_with_incompatible_arguments_is_already_exists() {
    let mut state = State::default();
    state.create_volume(&config(), request("a", 20)).unwrap();
    assert_eq!(
        code(state.create_volume(&config(), request("a", 30))),
        Code::AlreadyExists
    );
    let mut params = request("a", 20);
    params.parameters.insert("k".into(), "v".into());
    assert_eq!(
        code(state.create_volume(&config(), params)),
        Code::AlreadyExists
    );
}

#[test]
fn create_validates_arguments() {
    let mut state = State::default();
    assert_eq!(
        code(state.create_volume(&config(), request("", 1))),
        Code::InvalidArgument
    );
    let mut no_caps = request("a", 1);
    no_caps.capabilities.clear();
    assert_eq!(
        code(state.create_volume(&config(), no_caps)),
        Code::InvalidArgument
    );
    let snmw = VolumeRequest {
        capabilities: vec![cap(AccessMode::SingleNodeMultiWriter)],
        ..request("a", 1)
    };
    assert_eq!(
        code(state.create_volume(&config(), snmw.clone())),
        Code::InvalidArgument
    );
    let mut with_cap = config();
    with_cap.capabilities.single_node_multi_writer = true;
    state.create_volume(&with_cap, snmw).unwrap();
}

#[test]
fn create_refuses_unsupported_mutable_parameters() {
    let mut state = State::default();
    let mut supported = request("a", 1);
    supported.mutable_parameters = BTreeMap::from([
        ("iops".to_owned(), "3000".to_owned()),
        ("throughput".to_owned(), "125".to_owned()),
    ]);
    state.create_volume(&config(), supported).unwrap();
    let mut unsupported = request("b", 1);
    unsupported
        .mutable_parameters
        .insert("XXX_FakeKey".to_owned(), "XXX_FakeValue".to_owned());
    assert_eq!(
        code(state.create_volume(&config(), unsupported)),
        Code::InvalidArgument
    );
    assert_eq!(state.volumes.len(), 1);
}

#[test]
fn create_honours_capacity_range() {
    let mut state = State::default();
    let mut cfg = config();
    assert_eq!(
        state
            .create_volume(&cfg, request("default", 0))
            .unwrap()
            .capacity_bytes,
        10
    );
    let limited = VolumeRequest {
        limit_bytes: 4,
        ..request("limited", 0)
    };
    assert_eq!(
        state.create_volume(&cfg, limited).unwrap().capacity_bytes,
        4
    );
    let inverted = VolumeRequest {
        limit_bytes: 4,
        ..request("inverted", 5)
    };
    assert_eq!(code(state.create_volume(&cfg, inverted)), Code::OutOfRange);
    cfg.max_volume_size = Some(50);
    assert_eq!(
        code(state.create_volume(&cfg, request("huge", 51))),
        Code::OutOfRange
    );
    assert_eq!(
        code(state.create_volume(&cfg, request("neg", -1))),
        Code::InvalidArgument
    );
    // 14 of 100 bytes used.
    state.create_volume(&cfg, request("big", 50)).unwrap();
    assert_eq!(
        code(state.create_volume(&cfg, request("full", 40))),
        Code::ResourceExhausted
    );
    assert_eq!(available_capacity(&state, &cfg), 36);
}

#[test]
fn content_sources() {
    let mut state = State::default();
    let mut cfg = config();
    let source = state.create_volume(&cfg, request("src", 20)).unwrap();
    let snap = state.create_snapshot("s", &source.id, (1, 2)).unwrap();

    let from_snap = VolumeRequest {
        content_source: Some(ContentSource::Snapshot(snap.id.clone())),
        ..request("from-snap", 5)
    };
    // The volume is at least as large as its source.
    assert_eq!(
        state.create_volume(&cfg, from_snap).unwrap().capacity_bytes,
        20
    );
    let missing = VolumeRequest {
        content_source: Some(ContentSource::Volume("vol-nope".into())),
        ..request("clone", 5)
    };
    assert_eq!(
        code(state.create_volume(&cfg, missing.clone())),
        Code::NotFound
    );
    let too_small = VolumeRequest {
        limit_bytes: 10,
        content_source: Some(ContentSource::Volume(source.id.clone())),
        ..request("small", 5)
    };
    assert_eq!(code(state.create_volume(&cfg, too_small)), Code::OutOfRange);

    cfg.capabilities.clone = false;
    cfg.capabilities.snapshots = false;
    assert_eq!(
        code(state.create_volume(&cfg, missing)),
        Code::InvalidArgument
    );
    let snap_source = VolumeRequest {
        content_source: Some(ContentSource::Snapshot(snap.id)),
        ..request("snap-off", 5)
    };
    assert_eq!(
        code(state.create_volume(&cfg, snap_source)),
        Code::InvalidArgument
    );
}

#[test]
fn topology_selection() {
    let served = [segment("z1"), segment("z2")];
    assert_eq!(
        pick_topology(&served, &[segment("z2"), segment("z1")], &[segment("z1")]).unwrap(),
        vec![segment("z1")]
    );
    assert_eq!(
        pick_topology(&served, &[segment("z9"), segment("z2")], &[]).unwrap(),
        vec![segment("z2")]
    );
    assert_eq!(
        pick_topology(&served, &[], &[]).unwrap(),
        vec![segment("z1")]
    );
    assert_eq!(
        pick_topology(&served, &[], &[segment("z9")]).unwrap(),
        vec![segment("z1")]
    );
    assert_eq!(
        code(pick_topology(&served, &[segment("z9")], &[])),
        Code::ResourceExhausted
    );
    assert_eq!(
        pick_topology(&[], &[segment("z9")], &[]).unwrap(),
        vec![segment("z9")]
    );
    assert!(pick_topology(&[], &[], &[]).unwrap().is_empty());
}

#[test]
fn topology_only_with_the_switch() {
    let mut state = State::default();
    let mut cfg = config();
    cfg.topology = vec![segment("z1")];
    let req = VolumeRequest {
        requisite: vec![segment("z9")],
        ..request("a", 1)
    };
    let plain = state.create_volume(&cfg, req.clone()).unwrap();
    assert!(plain.accessible_topology.is_empty());
    cfg.capabilities.topology = true;
    let req = VolumeRequest {
        name: "b".into(),
        ..req
    };
    assert_eq!(
        code(state.create_volume(&cfg, req)),
        Code::ResourceExhausted
    );
    assert_eq!(capacity_for(&state, &cfg, Some(&segment("z9"))), 0);
    assert_eq!(capacity_for(&state, &cfg, Some(&segment("z1"))), 99);
    assert_eq!(capacity_for(&state, &cfg, None), 99);
}

#[test]
fn delete_is_idempotent_and_refuses_volumes_in_use() {
    let mut state = State::default();
    let cfg = config();
    let vol = state.create_volume(&cfg, request("a", 1)).unwrap();
    state
        .controller_publish(
            &cfg,
            &vol.id,
            "n1",
            publication(AccessMode::SingleNodeWriter),
        )
        .unwrap();
    assert_eq!(code(state.delete_volume(&vol.id)), Code::FailedPrecondition);
    state.controller_unpublish(&vol.id, "").unwrap();
    state.delete_volume(&vol.id).unwrap();
    state.delete_volume(&vol.id).unwrap();
    assert_eq!(code(state.delete_volume("")), Code::InvalidArgument);
    assert!(state.volumes.is_empty());
}

#[test]
fn publish_semantics() {
    let mut state = State::default();
    let mut cfg = config();
    cfg.known_nodes = Some(["n1".to_owned(), "n2".to_owned()].into());
    cfg.max_volumes_per_node = 1;
    let a = state.create_volume(&cfg, request("a", 1)).unwrap();
    let b = state.create_volume(&cfg, request("b", 1)).unwrap();
    let rwo = publication(AccessMode::SingleNodeWriter);

    let context = state
        .controller_publish(&cfg, &a.id, "n1", rwo.clone())
        .unwrap();
    assert_eq!(context["devicePath"], format!("/dev/mock/{}", a.id));
    // Idempotent.
    assert_eq!(
        state
            .controller_publish(&cfg, &a.id, "n1", rwo.clone())
            .unwrap(),
        context
    );
    let readonly = Publication {
        readonly: true,
        ..rwo.clone()
    };
    assert_eq!(
        code(state.controller_publish(&cfg, &a.id, "n1", readonly)),
        Code::AlreadyExists
    );
    let err = state
        .controller_publish(&cfg, &a.id, "n2", rwo.clone())
        .unwrap_err();
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(err.message.contains("n1"), "{}", err.message);
    assert_eq!(
        code(state.controller_publish(&cfg, "vol-x", "n1", rwo.clone())),
        Code::NotFound
    );
    assert_eq!(
        code(state.controller_publish(&cfg, &a.id, "n3", rwo.clone())),
        Code::NotFound
    );
    assert_eq!(
        code(state.controller_publish(&cfg, &b.id, "n1", rwo.clone())),
        Code::ResourceExhausted
    );
    assert_eq!(
        code(state.controller_publish(&cfg, &b.id, "", rwo.clone())),
        Code::InvalidArgument
    );

    state.controller_unpublish(&a.id, "n1").unwrap();
    state.controller_unpublish(&a.id, "n1").unwrap();
    state.controller_unpublish("vol-gone", "n1").unwrap();
    assert!(state.volumes[&a.id].published.is_empty());
}

#[test]
fn multi_node_volumes_publish_everywhere() {
    let mut state = State::default();
    let cfg = config();
    let a = state.create_volume(&cfg, request("a", 1)).unwrap();
    let rwx = publication(AccessMode::MultiNodeMultiWriter);
    state
        .controller_publish(&cfg, &a.id, "n1", rwx.clone())
        .unwrap();
    state.controller_publish(&cfg, &a.id, "n2", rwx).unwrap();
    assert_eq!(
        state.volumes[&a.id].published.keys().collect::<Vec<_>>(),
        ["n1", "n2"]
    );
    let readonly = Publication {
        readonly: true,
        ..publication(AccessMode::MultiNodeReaderOnly)
    };
    let mut no_ro = cfg.clone();
    no_ro.capabilities.publish_readonly = false;
    assert_eq!(
        code(state.controller_publish(&no_ro, &a.id, "n3", readonly)),
        Code::InvalidArgument
    );
}

#[test]
fn paging() {
    assert_eq!(page(5, 2, "").unwrap(), (0..2, "2".to_owned()));
    assert_eq!(page(5, 2, "4").unwrap(), (4..5, String::new()));
    assert_eq!(page(5, 0, "3").unwrap(), (3..5, String::new()));
    assert_eq!(page(0, 0, "").unwrap(), (0..0, String::new()));
    assert_eq!(code(page(5, 2, "6")), Code::Aborted);
    assert_eq!(code(page(5, 2, "x")), Code::Aborted);
    assert_eq!(code(page(5, -1, "")), Code::InvalidArgument);
}

#[test]
fn list_volumes_walks_all_pages() {
    let mut state = State::default();
    let cfg = config();
    for i in 0..5 {
        state
            .create_volume(&cfg, request(&format!("v{i}"), 1))
            .unwrap();
    }
    let mut token = String::new();
    let mut names = Vec::new();
    loop {
        let (entries, next) = state.list_volumes(2, &token).unwrap();
        names.extend(entries.iter().map(|v| v.name.clone()));
        if next.is_empty() {
            break;
        }
        token = next;
    }
    assert_eq!(names, ["v0", "v1", "v2", "v3", "v4"]);
}

#[test]
fn expand_and_modify() {
    let mut state = State::default();
    let mut cfg = config();
    cfg.max_volume_size = Some(50);
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    assert_eq!(state.expand_volume(&cfg, &a.id, 20, 0).unwrap(), 20);
    assert_eq!(state.expand_volume(&cfg, &a.id, 15, 0).unwrap(), 20);
    assert_eq!(
        code(state.expand_volume(&cfg, &a.id, 60, 0)),
        Code::OutOfRange
    );
    assert_eq!(
        code(state.expand_volume(&cfg, &a.id, 0, 0)),
        Code::InvalidArgument
    );
    assert_eq!(
        code(state.expand_volume(&cfg, "vol-x", 30, 0)),
        Code::NotFound
    );

    let params = BTreeMap::from([("iops".to_owned(), "100".to_owned())]);
    state.modify_volume(&a.id, params.clone()).unwrap();
    assert_eq!(state.volumes[&a.id].mutable_parameters, params);
    let throughput = BTreeMap::from([("throughput".to_owned(), "125".to_owned())]);
    state.modify_volume(&a.id, throughput).unwrap();
    assert_eq!(state.volumes[&a.id].mutable_parameters.len(), 2, "merged");
    assert_eq!(
        code(state.modify_volume(&a.id, BTreeMap::new())),
        Code::InvalidArgument
    );
    // One unsupported key refuses the whole change.
    let unsupported = BTreeMap::from([
        ("iops".to_owned(), "200".to_owned()),
        ("XXX_FakeKey".to_owned(), "x".to_owned()),
    ]);
    assert_eq!(
        code(state.modify_volume(&a.id, unsupported)),
        Code::InvalidArgument
    );
    assert_eq!(state.volumes[&a.id].mutable_parameters["iops"], "100");
    assert_eq!(code(state.modify_volume("vol-x", params)), Code::NotFound);
}

#[test]
fn group_snapshots() {
    let mut state = State::default();
    let cfg = config();
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    let b = state.create_volume(&cfg, request("b", 20)).unwrap();
    let volumes = vec![a.id.clone(), b.id.clone()];
    let (group, members) = state.create_group_snapshot("g", &volumes, (5, 0)).unwrap();
    assert_eq!(members.len(), 2);
    assert_eq!(
        group.snapshot_ids,
        vec![members[0].id.clone(), members[1].id.clone()]
    );
    assert!(members.iter().all(|m| m.group_snapshot_id == group.id));
    assert_eq!(members[1].source_volume_id, b.id);
    let reversed = vec![b.id.clone(), a.id.clone()];
    let (again, _) = state.create_group_snapshot("g", &reversed, (6, 0)).unwrap();
    assert_eq!(
        (again.id.clone(), again.answers),
        (group.id.clone(), 2),
        "idempotent by name"
    );
    assert_eq!(
        code(state.create_group_snapshot("g", &volumes[..1], (6, 0))),
        Code::AlreadyExists
    );
    assert_eq!(
        code(state.delete_snapshot(&members[0].id)),
        Code::FailedPrecondition,
        "a member goes only with its group"
    );
    assert_eq!(
        code(state.get_group_snapshot(&group.id, &group.snapshot_ids[..1])),
        Code::InvalidArgument
    );
    let (got, got_members) = state
        .get_group_snapshot(&group.id, &group.snapshot_ids)
        .unwrap();
    assert_eq!(got.answers, 3);
    assert!(got_members.iter().all(|m| m.answers == 3));
    state
        .delete_group_snapshot(&group.id, &group.snapshot_ids)
        .unwrap();
    assert!(state.snapshots.is_empty() && state.group_snapshots.is_empty());
    state.delete_group_snapshot(&group.id, &[]).unwrap();
}

#[test]
fn snapshots() {
    let mut state = State::default();
    let cfg = config();
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    let b = state.create_volume(&cfg, request("b", 10)).unwrap();
    let s1 = state.create_snapshot("s1", &a.id, (5, 0)).unwrap();
    assert_eq!(s1.answers, 1);
    let again = state.create_snapshot("s1", &a.id, (6, 0)).unwrap();
    assert_eq!(again.answers, 2, "each answer about it is counted");
    assert_eq!(
        Snapshot {
            answers: 1,
            ..again.clone()
        },
        s1,
        "the same snapshot, its time kept"
    );
    let s1 = again;
    assert_eq!(
        code(state.create_snapshot("s1", &b.id, (6, 0))),
        Code::AlreadyExists
    );
    assert_eq!(
        code(state.create_snapshot("s2", "vol-x", (6, 0))),
        Code::NotFound
    );
    assert_eq!(
        code(state.create_snapshot("", &a.id, (6, 0))),
        Code::InvalidArgument
    );
    state.create_snapshot("s2", &b.id, (6, 0)).unwrap();

    let (all, next) = state.list_snapshots(0, "", "", "").unwrap();
    assert_eq!((all.len(), next.as_str()), (2, ""));
    let (of_b, _) = state.list_snapshots(0, "", "", &b.id).unwrap();
    assert_eq!(of_b[0].name, "s2");
    let (by_id, _) = state.list_snapshots(0, "", &s1.id, "").unwrap();
    assert_eq!(by_id, [&s1]);
    assert_eq!(state.get_snapshot(&s1.id).unwrap(), &s1);

    state.delete_snapshot(&s1.id).unwrap();
    state.delete_snapshot(&s1.id).unwrap();
    assert_eq!(code(state.get_snapshot(&s1.id)), Code::NotFound);
}

#[test]
fn node_lifecycle() {
    let mut state = State::default();
    let cfg = config();
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    let rwo = publication(AccessMode::SingleNodeWriter);

    assert_eq!(
        code(state.node_publish(&cfg, &a.id, "/stage", "/target", rwo.clone())),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(state.node_publish(&cfg, &a.id, "", "/target", rwo.clone())),
        Code::FailedPrecondition
    );
    state
        .node_stage(&cfg, &a.id, "/stage", rwo.capability.clone())
        .unwrap();
    state
        .node_stage(&cfg, &a.id, "/stage", rwo.capability.clone())
        .unwrap();
    assert_eq!(
        code(state.node_stage(&cfg, &a.id, "/other", rwo.capability.clone())),
        Code::AlreadyExists
    );
    state
        .node_publish(&cfg, &a.id, "/stage", "/target", rwo.clone())
        .unwrap();
    state
        .node_publish(&cfg, &a.id, "/stage", "/target", rwo.clone())
        .unwrap();
    let readonly = Publication {
        readonly: true,
        ..rwo.clone()
    };
    assert_eq!(
        code(state.node_publish(&cfg, &a.id, "/stage", "/target", readonly)),
        Code::AlreadyExists
    );
    assert_eq!(state.node_volume(&a.id, "/target").unwrap().id, a.id);
    assert_eq!(code(state.node_volume(&a.id, "/nowhere")), Code::NotFound);
    assert_eq!(state.node_expand(&a.id, "/target", 5).unwrap(), 10);
    assert_eq!(
        code(state.node_expand(&a.id, "/target", 11)),
        Code::OutOfRange
    );
    assert_eq!(code(state.delete_volume(&a.id)), Code::FailedPrecondition);

    state.node_unpublish(&a.id, "/target").unwrap();
    state.node_unpublish(&a.id, "/target").unwrap();
    state.node_unstage(&a.id, "/stage").unwrap();
    state.node_unstage(&a.id, "/stage").unwrap();
    assert_eq!(code(state.node_unstage("vol-x", "/stage")), Code::NotFound);
    state.delete_volume(&a.id).unwrap();
}

#[test]
fn node_publish_without_staging() {
    let mut state = State::default();
    let mut cfg = config();
    cfg.capabilities = Capabilities {
        node_stage: false,
        ..Capabilities::default()
    };
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    state
        .node_publish(
            &cfg,
            &a.id,
            "",
            "/target",
            publication(AccessMode::SingleNodeWriter),
        )
        .unwrap();
    assert_eq!(
        code(state.node_publish(
            &cfg,
            "vol-x",
            "",
            "/t",
            publication(AccessMode::SingleNodeWriter)
        )),
        Code::NotFound
    );
}

#[test]
fn state_round_trips_through_json() {
    let mut state = State::default();
    let cfg = config();
    let a = state.create_volume(&cfg, request("a", 10)).unwrap();
    state
        .controller_publish(&cfg, &a.id, "n1", publication(AccessMode::SingleNodeWriter))
        .unwrap();
    state.create_snapshot("s", &a.id, (1, 2)).unwrap();
    let json = serde_json::to_string(&state).unwrap();
    let back: State = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
}
