use super::*;
use crate::model::{ContentSpec, ContentStatus, SnapshotSpec, SnapshotStatus};

fn ask(method: Method) -> Ask {
    Ask {
        method,
        token: "t".into(),
        namespace: "ns".into(),
        snapshot: "snap".into(),
        base: (method == Method::Delta).then(|| "base-handle".into()),
        starting_offset: 0,
        max_results: 0,
    }
}

fn message(ask: Ask) -> String {
    validate(&ask).unwrap_err().message
}

#[test]
fn requests_are_checked_in_upstream_s_order_and_negative_numbers_refused() {
    assert_eq!(validate(&ask(Method::Allocated)), Ok(()));
    assert_eq!(validate(&ask(Method::Delta)), Ok(()));
    let all_empty = Ask {
        token: String::new(),
        namespace: String::new(),
        snapshot: String::new(),
        ..ask(Method::Allocated)
    };
    assert_eq!(message(all_empty.clone()), "securityToken is missing");
    assert_eq!(
        message(Ask {
            token: "t".into(),
            ..all_empty.clone()
        }),
        "namespace parameter cannot be empty"
    );
    assert_eq!(
        message(Ask {
            token: "t".into(),
            namespace: "n".into(),
            ..all_empty
        }),
        "snapshotName cannot be empty"
    );
    assert_eq!(
        message(Ask {
            base: Some(String::new()),
            snapshot: String::new(),
            ..ask(Method::Delta)
        }),
        "baseSnapshotId cannot be empty"
    );
    assert_eq!(
        message(Ask {
            snapshot: String::new(),
            ..ask(Method::Delta)
        }),
        "targetSnapshotName cannot be empty"
    );
    let negative = validate(&Ask {
        starting_offset: -1,
        ..ask(Method::Allocated)
    })
    .unwrap_err();
    assert_eq!(negative.code, Code::InvalidArgument);
    assert!(
        validate(&Ask {
            max_results: -1,
            ..ask(Method::Delta)
        })
        .is_err()
    );
}

#[test]
fn names_no_object_can_have_are_refused_without_being_echoed() {
    let huge = "x".repeat(1 << 20);
    for bad in [
        Ask {
            namespace: "Not_A_Label".into(),
            ..ask(Method::Allocated)
        },
        Ask {
            namespace: "n".repeat(64),
            ..ask(Method::Allocated)
        },
        Ask {
            snapshot: huge.clone(),
            ..ask(Method::Allocated)
        },
        Ask {
            snapshot: "snap/../other".into(),
            ..ask(Method::Delta)
        },
        Ask {
            base: Some(huge.clone()),
            ..ask(Method::Delta)
        },
    ] {
        let refusal = validate(&bad).unwrap_err();
        assert_eq!(refusal.code, Code::InvalidArgument);
        assert!(refusal.message.len() < 200, "{}", refusal.message);
    }
    assert_eq!(
        validate(&Ask {
            snapshot: "a.b-c".into(),
            base: Some("h".repeat(MAX_HANDLE_BYTES)),
            ..ask(Method::Delta)
        }),
        Ok(())
    );
}

fn snapshot(status: Option<SnapshotStatus>) -> VolumeSnapshot {
    VolumeSnapshot {
        status,
        spec: SnapshotSpec::default(),
        ..VolumeSnapshot::default()
    }
}

#[test]
fn a_snapshot_without_status_is_not_ready_rather_than_a_crash() {
    let refusal = bound_content(&snapshot(None), "s").unwrap_err();
    assert_eq!(refusal.code, Code::Unavailable);
    assert_eq!(
        refusal.message,
        "the VolumeSnapshot is not yet ready, name: s"
    );
    let unbound = snapshot(Some(SnapshotStatus {
        ready_to_use: Some(true),
        bound_volume_snapshot_content_name: None,
    }));
    assert_eq!(
        bound_content(&unbound, "s").unwrap_err().message,
        "boundVolumeSnapshotContentName is not set in VolumeSnapshot status, name: s"
    );
    let bound = snapshot(Some(SnapshotStatus {
        ready_to_use: Some(true),
        bound_volume_snapshot_content_name: Some("c".into()),
    }));
    assert_eq!(bound_content(&bound, "s"), Ok("c".to_string()));
}

#[test]
fn a_content_gives_its_handle_only_when_ready_and_of_the_driver() {
    let content = |driver: &str, ready: bool, handle: Option<&str>| VolumeSnapshotContent {
        spec: ContentSpec {
            driver: driver.into(),
        },
        status: Some(ContentStatus {
            ready_to_use: Some(ready),
            snapshot_handle: handle.map(str::to_string),
        }),
        ..VolumeSnapshotContent::default()
    };
    assert_eq!(
        snapshot_handle(&content("d", true, Some("h")), "c", "d", "s"),
        Ok("h".to_string())
    );
    let other = snapshot_handle(&content("x", true, Some("h")), "c", "d", "s").unwrap_err();
    assert_eq!(other.code, Code::InvalidArgument);
    assert_eq!(
        other.message,
        "VolumeSnapshot 's' does not belong to the CSI driver 'd'"
    );
    assert_eq!(
        snapshot_handle(&content("d", false, Some("h")), "c", "d", "s")
            .unwrap_err()
            .message,
        "the VolumeSnapshotContent is not yet ready, name: c"
    );
    assert_eq!(
        snapshot_handle(&content("d", true, None), "c", "d", "s")
            .unwrap_err()
            .message,
        "snapshotHandle is not set in VolumeSnapshotContent status, name: c"
    );
    let statusless = VolumeSnapshotContent::default();
    assert_eq!(
        snapshot_handle(&statusless, "c", "d", "s")
            .unwrap_err()
            .code,
        Code::Unavailable
    );
}

#[test]
fn a_missing_object_is_not_found_and_other_failures_unavailable() {
    let gone = read_refusal("VolumeSnapshot", "ns/s", &ReadError::NotFound);
    assert_eq!(gone.code, Code::NotFound);
    let other = read_refusal("VolumeSnapshot", "ns/s", &ReadError::Other("boom".into()));
    assert_eq!(other.code, Code::Unavailable);
    assert_eq!(other.message, "failed to get VolumeSnapshot 'ns/s': boom");
}

#[test]
fn the_class_is_the_snapshot_s_or_the_single_default() {
    let class = |default: bool| Class {
        is_default: default,
        parameters: BTreeMap::new(),
    };
    let mut classes = BTreeMap::from([("a".to_string(), class(false))]);
    assert_eq!(
        choose_class(Some("a"), &classes, "d"),
        Ok(Some(&class(false)))
    );
    assert_eq!(
        choose_class(Some("zz"), &classes, "d").unwrap_err().code,
        Code::Unavailable
    );
    assert_eq!(choose_class(None, &classes, "d"), Ok(None));
    classes.insert("b".into(), class(true));
    assert_eq!(choose_class(None, &classes, "d"), Ok(Some(&class(true))));
    classes.insert("c".into(), class(true));
    assert_eq!(
        choose_class(None, &classes, "d").unwrap_err().message,
        "multiple default VolumeSnapshotClasses are set for the CSI driver 'd'"
    );
}

#[test]
fn the_secret_templates_take_the_content_and_snapshot() {
    let class = Class {
        is_default: false,
        parameters: BTreeMap::from([
            (
                SECRET_NAME.to_string(),
                "${volumesnapshot.name}-key".to_string(),
            ),
            (
                SECRET_NAMESPACE.to_string(),
                "${volumesnapshot.namespace}".to_string(),
            ),
        ]),
    };
    let secret = snapshotter_secret(&class, "content-1", "ns", "snap").unwrap();
    assert_eq!(
        secret,
        Some(SecretName {
            namespace: "ns".into(),
            name: "snap-key".into()
        })
    );
    let mut bad = class.clone();
    bad.parameters.insert(
        SECRET_NAMESPACE.to_string(),
        "${volumesnapshot.name}".to_string(),
    );
    let refusal = snapshotter_secret(&bad, "c", "ns", "snap").unwrap_err();
    assert_eq!(refusal.code, Code::Unavailable);
    assert!(
        refusal
            .message
            .starts_with("invalid snapshotter secret parameters")
    );
}

fn fixed(blocks: &[(i64, i64)]) -> Batch {
    Batch {
        block_type: FIXED_LENGTH,
        capacity: 1 << 20,
        blocks: blocks.to_vec(),
    }
}

#[test]
fn a_stream_that_keeps_the_promises_is_relayed_and_split_to_max_results() {
    let mut check = StreamCheck::new(4096, 2);
    let out = check
        .take(fixed(&[(4096, 4096), (12288, 4096), (16384, 4096)]))
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].blocks, [(4096, 4096), (12288, 4096)]);
    assert_eq!(out[1].blocks, [(16384, 4096)]);
    assert!(check.take(fixed(&[(40960, 4096)])).is_ok());
    // The block holding the starting offset begins before it.
    assert!(
        StreamCheck::new(5000, 0)
            .take(fixed(&[(4096, 4096)]))
            .is_ok()
    );
}

#[test]
fn a_partial_last_block_reported_whole_is_relayed_and_noted_once() {
    // A volume of 2.5 blocks: the driver reports its last block whole, past the capacity.
    let capacity = 10240;
    let batch = |blocks: &[(i64, i64)]| Batch {
        capacity,
        ..fixed(blocks)
    };
    let mut check = StreamCheck::new(0, 0);
    assert!(check.take(batch(&[(0, 4096)])).is_ok());
    assert_eq!(check.past_capacity(), None);
    let out = check.take(batch(&[(4096, 4096), (8192, 4096)])).unwrap();
    assert_eq!(out[0].blocks, [(4096, 4096), (8192, 4096)]);
    assert_eq!(check.past_capacity(), Some((8192, 4096)));
    assert_eq!(check.past_capacity(), None, "noted once");
}

#[test]
fn a_stream_that_breaks_a_promise_is_stopped() {
    let broken = |batches: &[Batch], start: i64| {
        let mut check = StreamCheck::new(start, 0);
        batches
            .iter()
            .try_for_each(|b| check.take(b.clone()).map(drop))
    };
    assert!(
        broken(&[fixed(&[(8192, 4096), (4096, 4096)])], 0).is_err(),
        "descending"
    );
    assert!(
        broken(&[fixed(&[(0, 8192)]), fixed(&[(4096, 8192)])], 0).is_err(),
        "overlap"
    );
    assert!(
        broken(&[fixed(&[(0, 4096), (4096, 8192)])], 0).is_err(),
        "two sizes"
    );
    assert!(
        broken(&[fixed(&[(0, 4096)])], 8192).is_err(),
        "before the start"
    );
    assert!(
        broken(&[fixed(&[(i64::MAX - 100, 4096)])], 0).is_err(),
        "past every offset"
    );
    let other_type = Batch {
        block_type: VARIABLE_LENGTH,
        ..fixed(&[(8192, 4096)])
    };
    assert!(
        broken(&[fixed(&[(0, 4096)]), other_type], 0).is_err(),
        "type change"
    );
    let other_capacity = Batch {
        capacity: 1 << 21,
        ..fixed(&[(8192, 4096)])
    };
    assert!(
        broken(&[fixed(&[(0, 4096)]), other_capacity], 0).is_err(),
        "capacity change"
    );
    let unknown = Batch {
        block_type: 0,
        ..fixed(&[(0, 4096)])
    };
    assert!(broken(&[unknown], 0).is_err(), "unknown type");
    let variable = Batch {
        block_type: VARIABLE_LENGTH,
        ..fixed(&[(0, 4096), (8192, 65536)])
    };
    assert!(
        broken(&[variable], 0).is_ok(),
        "variable lengths may differ"
    );
}
