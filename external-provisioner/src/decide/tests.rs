use csi_proto::v1::volume_capability::access_mode::Mode;
use serde_json::json;

use super::*;
use crate::topology::NodeMaps;

/// The policy of upstream's default flags, for driver `d` with a controller that creates and
/// deletes volumes.
pub(crate) fn policy() -> Policy {
    let cli: crate::flags::Cli = clap::Parser::parse_from(["csi-provisioner"]);
    let caps = Capabilities {
        controller_service: true,
        create_delete_volume: true,
        ..Capabilities::default()
    };
    crate::app::config(&cli, "d", caps, "1-2-d").policy
}

pub(crate) fn claim(spec: serde_json::Value) -> Claim {
    Claim::from_api(
        &serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "1234-abcd", "resourceVersion": "3",
                "annotations": {model::ANN_STORAGE_PROVISIONER: "d"}},
            "spec": spec
        }))
        .unwrap(),
    )
}

pub(crate) fn class(params: &[(&str, &str)]) -> Class {
    Class {
        name: "fast".into(),
        uid: "sc-uid".into(),
        provisioner: "d".into(),
        parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        reclaim_policy: "Delete".into(),
        mount_options: vec!["noatime".into()],
        ..Class::default()
    }
}

/// Prepares a claim that needs neither the cluster's nodes nor any lookup.
pub(crate) fn prepare_alone(
    policy: &Policy,
    claim: &Claim,
    class: &Class,
) -> Result<Prepared, Failure> {
    prepare(policy, claim, class, &NodeMaps::EMPTY, &Lookups::default())
}

pub(crate) fn basic_claim() -> Claim {
    claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}),
    )
}

#[test]
fn volume_names() {
    assert_eq!(
        volume_name("pvc", "12-34-56", -1),
        Ok("pvc-12-34-56".into())
    );
    assert_eq!(volume_name("pv", "12-34-56", 4), Ok("pv-1234".into()));
    assert_eq!(volume_name("pv", "12-34", 40), Ok("pv-1234".into()));
    assert!(volume_name("", "1", -1).is_err());
    assert!(volume_name("p", "", -1).is_err());
}

#[test]
fn which_claims_are_ours() {
    let p = policy();
    let c = class(&[]);
    assert_eq!(
        should_provision(&p, &basic_claim(), Some(&c), false),
        Ok(())
    );
    assert_eq!(
        should_provision(&p, &basic_claim(), None, false),
        Err(Skip::NoClass)
    );
    assert_eq!(
        should_provision(&p, &basic_claim(), Some(&c), true),
        Err(Skip::VolumeExists)
    );
    let wffc = Class {
        wait_for_first_consumer: true,
        ..class(&[])
    };
    assert_eq!(
        should_provision(&p, &basic_claim(), Some(&wffc), false),
        Err(Skip::WaitingForNode)
    );
    let other = Policy {
        driver: "x".into(),
        ..policy()
    };
    assert_eq!(
        should_provision(&other, &basic_claim(), Some(&c), false),
        Err(Skip::NotOurs)
    );
}

#[test]
fn request_as_upstream_builds_it() {
    let p = Policy {
        extra_create_metadata: true,
        ..policy()
    };
    let c = class(&[
        ("type", "ssd"),
        ("csi.storage.k8s.io/fstype", "xfs"),
        ("csi.storage.k8s.io/provisioner-secret-name", "prov"),
        (
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        ),
        ("csi.storage.k8s.io/node-stage-secret-name", "stage"),
        (
            "csi.storage.k8s.io/node-stage-secret-namespace",
            "kube-system",
        ),
    ]);
    let prepared = prepare_alone(&p, &basic_claim(), &c).unwrap();
    let r = &prepared.request;
    assert_eq!(r.name, "pvc-1234-abcd");
    assert_eq!(r.capacity_range.as_ref().unwrap().required_bytes, 1 << 30);
    assert_eq!(r.capacity_range.as_ref().unwrap().limit_bytes, 0);
    assert_eq!(r.parameters.get("type").map(String::as_str), Some("ssd"));
    assert_eq!(
        r.parameters.get(params::PVC_NAME_KEY).map(String::as_str),
        Some("data")
    );
    assert_eq!(
        r.parameters.get(params::PV_NAME_KEY).map(String::as_str),
        Some("pvc-1234-abcd")
    );
    assert!(!r.parameters.contains_key("csi.storage.k8s.io/fstype"));
    assert!(
        r.secrets.is_empty(),
        "secret values are fetched at call time"
    );
    assert_eq!(r.volume_capabilities.len(), 1);
    let cap = &r.volume_capabilities[0];
    assert_eq!(
        cap.access_mode.as_ref().unwrap().mode,
        Mode::SingleNodeWriter as i32
    );
    match cap.access_type.as_ref().unwrap() {
        AccessType::Mount(m) => {
            assert_eq!(m.fs_type, "xfs");
            assert_eq!(m.mount_flags, vec!["noatime".to_string()]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        prepared.provisioner_secret,
        Some(SecretRef {
            namespace: "ns".into(),
            name: "prov".into()
        })
    );
    assert_eq!(
        prepared.pv.node_stage_secret.as_ref().unwrap().namespace,
        "kube-system"
    );
    assert!(r.accessibility_requirements.is_none(), "topology off");
}

#[test]
fn bad_claims_fail_with_clear_messages() {
    let p = policy();
    let selector = claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
        "selector": {"matchLabels": {"a": "b"}}, "resources": {"requests": {"storage": "1Gi"}}}),
    );
    let f = prepare_alone(&p, &selector, &class(&[])).unwrap_err();
    assert_eq!(
        (f.state, f.message.as_str()),
        (State::Finished, "claim Selector is not supported")
    );

    let unknown = prepare_alone(
        &p,
        &basic_claim(),
        &class(&[("csi.storage.k8s.io/bogus", "x")]),
    )
    .unwrap_err();
    assert!(
        unknown
            .message
            .contains("found unknown parameter key \"csi.storage.k8s.io/bogus\"")
    );

    let mode = claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadWriteSometimes"],
        "resources": {"requests": {"storage": "1Gi"}}}),
    );
    assert_eq!(
        prepare_alone(&p, &mode, &class(&[])).unwrap_err().message,
        "unsupported AccessMode combination: [ReadWriteSometimes]"
    );

    // kube-apiserver refuses these claims; a provisioner that meets one anyway says why.
    for (storage, message) in [
        ("-1", "invalid storage request \"-1\": negative"),
        (
            "1Zi",
            "invalid storage request: quantities must match the regular expression",
        ),
    ] {
        let bad = claim(
            json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": storage}}}),
        );
        let failure = prepare_alone(&p, &bad, &class(&[])).unwrap_err();
        assert!(failure.message.contains(message), "{}", failure.message);
    }

    let huge = claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "100Ei"}}}),
    );
    assert!(
        prepare_alone(&p, &huge, &class(&[]))
            .unwrap_err()
            .message
            .contains("larger than a volume can be")
    );

    let template = class(&[
        ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.nope}"),
        ("csi.storage.k8s.io/provisioner-secret-namespace", "ns"),
    ]);
    let f = prepare_alone(&p, &basic_claim(), &template).unwrap_err();
    assert_eq!(f.state, State::NoChange);
    assert!(f.message.contains("invalid tokens"), "{}", f.message);

    let no_create = Policy {
        caps: Capabilities {
            controller_service: true,
            ..Capabilities::default()
        },
        ..policy()
    };
    assert!(
        prepare_alone(&no_create, &basic_claim(), &class(&[]))
            .unwrap_err()
            .message
            .contains("CREATE_DELETE_VOLUME capability is not reported")
    );

    let populator = claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
        "dataSourceRef": {"apiGroup": "example.com", "kind": "Hello", "name": "h"},
        "resources": {"requests": {"storage": "1Gi"}}}),
    );
    let f = prepare_alone(&p, &populator, &class(&[])).unwrap_err();
    assert_eq!(
        (f.state, f.message.as_str()),
        (State::Ignored, POPULATOR_MESSAGE)
    );
}

#[test]
fn block_claims_get_block_capabilities() {
    let p = Policy {
        default_fstype: "ext4".into(),
        ..policy()
    };
    let block = claim(
        json!({"storageClassName": "fast", "accessModes": ["ReadOnlyMany"],
        "volumeMode": "Block", "resources": {"requests": {"storage": "10Mi"}}}),
    );
    let prepared = prepare_alone(&p, &block, &class(&[])).unwrap();
    let cap = &prepared.request.volume_capabilities[0];
    assert!(matches!(cap.access_type, Some(AccessType::Block(_))));
    assert_eq!(
        cap.access_mode.as_ref().unwrap().mode,
        Mode::MultiNodeReaderOnly as i32
    );
    let Created::Pv(pv) = build_pv(
        &p,
        &prepared,
        &CsiVolume {
            volume_id: "v".into(),
            ..Default::default()
        },
    ) else {
        panic!("no PV");
    };
    let spec = pv.spec.unwrap();
    assert_eq!(spec.csi.unwrap().fs_type, None, "no fsType on block PVs");
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
}

#[test]
fn pv_as_upstream_writes_it() {
    let p = Policy {
        topology: true,
        ..policy()
    };
    let without_topology = Policy {
        topology: false,
        ..p.clone()
    };
    let prepared = prepare_alone(&without_topology, &basic_claim(), &class(&[])).unwrap();
    let volume = CsiVolume {
        volume_id: "vol-1".into(),
        capacity_bytes: 2 << 30,
        volume_context: [("k".to_string(), "v".to_string())].into(),
        accessible_topology: vec![csi_proto::v1::Topology {
            segments: [("zone".to_string(), "a".to_string())].into(),
        }],
        ..Default::default()
    };
    let Created::Pv(pv) = build_pv(&p, &prepared, &volume) else {
        panic!("no PV")
    };
    let meta = &pv.metadata;
    assert_eq!(meta.name.as_deref(), Some("pvc-1234-abcd"));
    assert_eq!(
        meta.finalizers.as_ref().unwrap(),
        &vec![model::PV_FINALIZER.to_string()]
    );
    let ann = meta.annotations.as_ref().unwrap();
    assert_eq!(ann[model::ANN_PROVISIONED_BY], "d");
    assert_eq!(ann[model::ANN_DELETION_SECRET_NAME], "");
    assert_eq!(ann[model::ANN_DELETION_SECRET_NAMESPACE], "");
    let spec = pv.spec.as_ref().unwrap();
    assert_eq!(spec.capacity.as_ref().unwrap()["storage"].0, "2Gi");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    let claim_ref = spec.claim_ref.as_ref().unwrap();
    assert_eq!(claim_ref.uid.as_deref(), Some("1234-abcd"));
    assert_eq!(claim_ref.resource_version.as_deref(), Some("3"));
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(csi.volume_handle, "vol-1");
    let attrs = csi.volume_attributes.as_ref().unwrap();
    assert_eq!(attrs[model::PROVISIONER_ID_KEY], "1-2-d");
    assert_eq!(attrs["k"], "v");
    let terms = &spec
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms;
    assert_eq!(terms[0].match_expressions.as_ref().unwrap()[0].key, "zone");

    let small = CsiVolume {
        volume_id: "v".into(),
        capacity_bytes: 1,
        ..Default::default()
    };
    assert!(matches!(
        build_pv(&p, &prepared, &small),
        Created::Undo { .. }
    ));
    let unknown = CsiVolume {
        volume_id: "v".into(),
        capacity_bytes: 0,
        ..Default::default()
    };
    let Created::Pv(pv) = build_pv(&p, &prepared, &unknown) else {
        panic!()
    };
    assert_eq!(
        pv.spec.unwrap().capacity.unwrap()["storage"].0,
        "1Gi",
        "0 means the request"
    );
}

#[test]
fn error_classes() {
    use tonic::Code::*;
    for code in [Cancelled, DeadlineExceeded, Unavailable, Aborted] {
        assert_eq!(classify(Some(code), true), State::InBackground, "{code:?}");
    }
    assert_eq!(classify(None, false), State::InBackground);
    assert_eq!(classify(Some(ResourceExhausted), true), State::Reschedule);
    assert_eq!(classify(Some(ResourceExhausted), false), State::Finished);
    for code in [
        InvalidArgument,
        NotFound,
        AlreadyExists,
        OutOfRange,
        FailedPrecondition,
        Internal,
        Unimplemented,
        Unknown,
        PermissionDenied,
        DataLoss,
        Unauthenticated,
    ] {
        assert_eq!(classify(Some(code), true), State::Finished, "{code:?}");
    }
}

fn volume(value: serde_json::Value) -> Volume {
    Volume::from_api(&serde_json::from_value(value).unwrap())
}

#[test]
fn volume_plans() {
    let p = policy();
    let bound = volume(
        json!({"metadata": {"name": "pv", "annotations": {model::ANN_PROVISIONED_BY: "d"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "csi": {"driver": "d", "volumeHandle": "h"}},
        "status": {"phase": "Bound"}}),
    );
    assert_eq!(
        plan_volume(&p, &bound, None, None),
        VolumePlan::AddFinalizer
    );
    let retain = volume(
        json!({"metadata": {"name": "pv", "finalizers": [model::PV_FINALIZER], "annotations": {model::ANN_PROVISIONED_BY: "d"}},
        "spec": {"persistentVolumeReclaimPolicy": "Retain", "csi": {"driver": "d", "volumeHandle": "h"}},
        "status": {"phase": "Released"}}),
    );
    assert_eq!(
        plan_volume(&p, &retain, None, None),
        VolumePlan::RemoveFinalizer
    );
    let released = volume(
        json!({"metadata": {"name": "pv", "finalizers": [model::PV_FINALIZER],
            "annotations": {model::ANN_PROVISIONED_BY: "d", model::ANN_DELETION_SECRET_NAME: "s", model::ANN_DELETION_SECRET_NAMESPACE: "n"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "csi": {"driver": "d", "volumeHandle": "h"}},
        "status": {"phase": "Released"}}),
    );
    match plan_volume(&p, &released, None, None) {
        VolumePlan::Delete(plan) => {
            assert_eq!(plan.request.volume_id, "h");
            assert_eq!(
                plan.secret,
                DeletionSecret::Annotated(SecretRef {
                    namespace: "n".into(),
                    name: "s".into()
                })
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        plan_volume(&p, &released, None, Some("node-1")),
        VolumePlan::Refuse("persistentvolume pv is still attached to node node-1".into())
    );
    let gone_finalizer = volume(
        json!({"metadata": {"name": "pv", "deletionTimestamp": "2026-01-01T00:00:00Z", "annotations": {model::ANN_PROVISIONED_BY: "d"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "csi": {"driver": "d", "volumeHandle": "h"}},
        "status": {"phase": "Released"}}),
    );
    assert_eq!(
        plan_volume(&p, &gone_finalizer, None, None),
        VolumePlan::Nothing,
        "already deleted"
    );
    let not_ours = volume(
        json!({"metadata": {"name": "pv", "annotations": {model::ANN_PROVISIONED_BY: "x"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete"}, "status": {"phase": "Released"}}),
    );
    assert_eq!(plan_volume(&p, &not_ours, None, None), VolumePlan::Nothing);
    // Old PVs without the annotations: the secret comes from the class.
    let old = volume(
        json!({"metadata": {"name": "pv", "finalizers": [model::PV_FINALIZER], "annotations": {model::ANN_PROVISIONED_BY: "d"}},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast", "csi": {"driver": "d", "volumeHandle": "h"},
            "claimRef": {"namespace": "ns", "name": "data"}},
        "status": {"phase": "Released"}}),
    );
    let c = class(&[
        ("csi.storage.k8s.io/provisioner-secret-name", "${pvc.name}"),
        (
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        ),
    ]);
    match plan_volume(&p, &old, Some(&c), None) {
        VolumePlan::Delete(plan) => assert_eq!(
            plan.secret,
            DeletionSecret::FromClass(Ok(Some(SecretRef {
                namespace: "ns".into(),
                name: "data".into()
            })))
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn finalizer_patches_touch_only_our_entry_and_carry_no_version() {
    assert_eq!(
        finalizers_patch(true),
        json!({"metadata": {"finalizers": [model::PV_FINALIZER]}})
    );
    assert_eq!(
        finalizers_patch(false),
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [model::PV_FINALIZER]}})
    );
}

fn from_source(source: serde_json::Value, extra: serde_json::Value) -> Claim {
    let mut spec = json!({"storageClassName": "fast", "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}});
    for (k, v) in source
        .as_object()
        .unwrap()
        .iter()
        .chain(extra.as_object().unwrap())
    {
        spec[k] = v.clone();
    }
    claim(spec)
}

fn snapshot_source() -> serde_json::Value {
    json!({"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}})
}

fn all_caps() -> Policy {
    Policy {
        caps: Capabilities {
            controller_service: true,
            create_delete_volume: true,
            create_delete_snapshot: true,
            clone_volume: true,
            modify_volume: true,
            ..Capabilities::default()
        },
        ..policy()
    }
}

fn content(id: &str) -> VolumeContentSource {
    VolumeContentSource {
        r#type: Some(csi_proto::v1::volume_content_source::Type::Snapshot(
            csi_proto::v1::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    }
}

#[test]
fn data_sources_need_their_capability() {
    let restore = from_source(snapshot_source(), json!({}));
    let clone = from_source(
        json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}}),
        json!({}),
    );
    let vac = from_source(json!({}), json!({"volumeAttributesClassName": "gold"}));
    let p = policy();
    let message = |claim: &Claim| prepare_alone(&p, claim, &class(&[])).unwrap_err().message;
    assert_eq!(
        message(&restore),
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    );
    assert_eq!(
        message(&clone),
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    );
    assert_eq!(
        message(&vac),
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    );
    let gate_off = Policy {
        attributes_classes: false,
        ..policy()
    };
    let prepared = prepare_alone(&gate_off, &vac, &class(&[])).unwrap();
    assert!(prepared.request.mutable_parameters.is_empty());
    assert_eq!(
        prepared.pv.volume_attributes_class, None,
        "the gate off ignores the class"
    );
    let unnamed = from_source(
        json!({"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": ""}}),
        json!({}),
    );
    assert_eq!(message(&unnamed), "the PVC source not found for PVC data");
    let wrong_group = from_source(
        json!({"dataSource": {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "s"}}),
        json!({}),
    );
    assert_eq!(
        message(&wrong_group),
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com"
    );
}

#[test]
fn the_content_source_goes_into_the_request() {
    let p = all_caps();
    let restore = from_source(snapshot_source(), json!({}));
    let lookups = Lookups {
        content: Some(Ok(content("snap-1"))),
        source_watched: true,
        ..Lookups::default()
    };
    let prepared = prepare(&p, &restore, &class(&[]), &NodeMaps::EMPTY, &lookups).unwrap();
    assert_eq!(
        prepared.request.volume_content_source,
        Some(content("snap-1"))
    );
    assert_eq!(prepared.source, "VolumeSnapshot");
    // Only `spec.dataSource` labels the metrics, as upstream.
    let by_ref = from_source(
        json!({"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}),
        json!({}),
    );
    assert_eq!(
        prepare(&p, &by_ref, &class(&[]), &NodeMaps::EMPTY, &lookups)
            .unwrap()
            .source,
        ""
    );

    let answered = |content_source: Option<VolumeContentSource>| {
        build_pv(
            &p,
            &prepared,
            &CsiVolume {
                volume_id: "v".into(),
                content_source,
                ..Default::default()
            },
        )
    };
    assert!(matches!(answered(Some(content("snap-1"))), Created::Pv(_)));
    let Created::Undo {
        message, reason, ..
    } = answered(None)
    else {
        panic!("a volume not filled from its source is deleted again");
    };
    assert_eq!(
        (message.as_str(), reason),
        ("volume content source missing", UndoReason::ContentSource)
    );
    assert_eq!(
        reason.orphaned(&message, "pvc-1", "rpc error"),
        "volume content source missing. cleanup of volume pvc-1 failed, volume is orphaned: rpc error"
    );
    assert_eq!(
        UndoReason::Capacity.orphaned("small", "pvc-1", "e"),
        "small. Cleanup of volume pvc-1 failed, volume is orphaned: e"
    );
}

#[test]
fn unusable_sources_wait_only_when_watched() {
    let p = all_caps();
    let restore = from_source(snapshot_source(), json!({}));
    let failing = |may_change: bool, watched: bool| {
        let lookups = Lookups {
            content: Some(Err(SourceError {
                message: "snapshot snap is not Ready".into(),
                may_change,
            })),
            source_watched: watched,
            ..Lookups::default()
        };
        prepare(&p, &restore, &class(&[]), &NodeMaps::EMPTY, &lookups).unwrap_err()
    };
    let waiting = failing(true, true);
    assert_eq!(waiting.state, State::Wait);
    assert_eq!(
        waiting.message,
        "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshot snap is not Ready"
    );
    assert_eq!(failing(true, false).state, State::NoChange);
    assert_eq!(failing(false, true).state, State::NoChange);
}

#[test]
fn cross_namespace_sources_need_the_gate_and_a_grant() {
    let claim = from_source(
        json!({"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap", "namespace": "other"}}),
        json!({}),
    );
    let lookups = Lookups {
        content: Some(Ok(content("s"))),
        grant: Some(Err("not allowed".into())),
        ..Lookups::default()
    };
    let off = prepare(&all_caps(), &claim, &class(&[]), &NodeMaps::EMPTY, &lookups).unwrap_err();
    assert_eq!(
        (off.state, off.message.as_str()),
        (
            State::Finished,
            "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
        )
    );
    let on = Policy {
        cross_namespace_sources: true,
        ..all_caps()
    };
    let refused = prepare(&on, &claim, &class(&[]), &NodeMaps::EMPTY, &lookups).unwrap_err();
    assert_eq!(
        (refused.state, refused.message.as_str()),
        (State::Finished, "not allowed")
    );
    let granted = Lookups {
        grant: Some(Ok(())),
        ..lookups
    };
    assert!(prepare(&on, &claim, &class(&[]), &NodeMaps::EMPTY, &granted).is_ok());
}

#[test]
fn attributes_classes_give_mutable_parameters() {
    let p = all_caps();
    let claim = from_source(json!({}), json!({"volumeAttributesClassName": "gold"}));
    let with = |vac: Result<AttributesClass, String>| {
        prepare(
            &p,
            &claim,
            &class(&[("type", "ssd")]),
            &NodeMaps::EMPTY,
            &Lookups {
                attributes_class: Some(vac),
                ..Lookups::default()
            },
        )
    };
    let gold = AttributesClass {
        name: "gold".into(),
        driver: "d".into(),
        parameters: [("iops".to_string(), "3000".to_string())].into(),
    };
    let prepared = with(Ok(gold.clone())).unwrap();
    assert_eq!(prepared.request.mutable_parameters["iops"], "3000");
    assert_eq!(prepared.request.parameters["type"], "ssd");
    assert!(!prepared.request.parameters.contains_key("iops"));
    let Created::Pv(pv) = build_pv(
        &p,
        &prepared,
        &CsiVolume {
            volume_id: "v".into(),
            ..Default::default()
        },
    ) else {
        panic!("no PV");
    };
    assert_eq!(
        pv.spec.unwrap().volume_attributes_class_name.as_deref(),
        Some("gold")
    );
    let other = with(Ok(AttributesClass {
        driver: "x".into(),
        ..gold
    }))
    .unwrap_err();
    assert_eq!(
        (other.state, other.message.as_str()),
        (
            State::Finished,
            "VAC gold referenced in PVC is for driver x which does not match driver name d"
        )
    );
    let missing = with(Err(
        "volumeattributesclasses.storage.k8s.io \"gold\" not found".into(),
    ))
    .unwrap_err();
    assert_eq!(missing.state, State::NoChange);
}

#[test]
fn in_tree_classes_are_translated_for_their_driver() {
    let ebs = Policy {
        driver: "ebs.csi.aws.com".into(),
        ..policy()
    };
    let in_tree = Class {
        provisioner: "kubernetes.io/aws-ebs".into(),
        ..class(&[("fsType", "xfs"), ("type", "gp3")])
    };
    let translated = driver_class(&ebs, &in_tree).unwrap();
    assert!(translated.migrated);
    assert_eq!(
        translated.class.parameters["csi.storage.k8s.io/fstype"],
        "xfs"
    );
    assert_eq!(translated.class.provisioner, "kubernetes.io/aws-ebs");
    let csi = driver_class(&ebs, &class(&[("fsType", "xfs")])).unwrap();
    assert!(!csi.migrated);
    assert_eq!(csi.class, class(&[("fsType", "xfs")]));
    assert!(
        !driver_class(&policy(), &in_tree).unwrap().migrated,
        "only the replacing driver translates"
    );

    let claim = basic_claim();
    let prepared = prepare_alone(&ebs, &claim, &in_tree).unwrap();
    assert!(prepared.migrated);
    assert_eq!(prepared.pv.provisioned_by, "kubernetes.io/aws-ebs");
    let Created::Pv(pv) = build_pv(
        &ebs,
        &prepared,
        &CsiVolume {
            volume_id: "vol-1".into(),
            ..Default::default()
        },
    ) else {
        panic!("no PV");
    };
    let spec = pv.spec.unwrap();
    assert!(spec.csi.is_none());
    assert_eq!(spec.aws_elastic_block_store.unwrap().volume_id, "vol-1");
}

#[test]
fn in_tree_volumes_are_deleted_through_their_driver() {
    let ebs = Policy {
        driver: "ebs.csi.aws.com".into(),
        ..policy()
    };
    let volume = Volume::from_api(
        &serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "finalizers": [model::PV_FINALIZER],
                "annotations": {model::ANN_PROVISIONED_BY: "kubernetes.io/aws-ebs",
                    model::ANN_DELETION_SECRET_NAME: "", model::ANN_DELETION_SECRET_NAMESPACE: ""}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete",
                "awsElasticBlockStore": {"volumeID": "vol-1", "fsType": "ext4"}},
            "status": {"phase": "Released"}
        }))
        .unwrap(),
    );
    assert!(volume.owned_by("ebs.csi.aws.com"));
    let VolumePlan::Delete(plan) = plan_volume(&ebs, &volume, None, None) else {
        panic!("not deleted");
    };
    assert!(plan.migrated);
    assert_eq!(plan.request.volume_id, "vol-1");
}

#[test]
fn nodes_provision_only_their_claims() {
    let node = |immediate_binding| Policy {
        node: Some(NodePolicy {
            name: "n1".into(),
            topology: None,
            immediate_binding,
        }),
        ..policy()
    };
    let with_node = |selected: Option<&str>| {
        let mut claim = basic_claim();
        if let (Some(selected), Some(spec)) = (selected, claim.pending.as_mut()) {
            spec.annotations
                .insert(model::ANN_SELECTED_NODE.into(), selected.into());
        }
        claim
    };
    let immediate = class(&[]);
    let late = Class {
        wait_for_first_consumer: true,
        ..class(&[])
    };
    let p = node(true);
    assert_eq!(
        should_provision(&p, &with_node(Some("n1")), Some(&immediate), false),
        Ok(())
    );
    assert_eq!(
        should_provision(&p, &with_node(Some("n1")), Some(&late), false),
        Ok(())
    );
    assert_eq!(
        should_provision(&p, &with_node(Some("n2")), Some(&immediate), false),
        Err(Skip::OtherNode)
    );
    assert_eq!(
        should_provision(&p, &with_node(None), Some(&immediate), false),
        Err(Skip::Unowned)
    );
    assert_eq!(
        should_provision(&p, &with_node(None), Some(&late), false),
        Err(Skip::WaitingForNode)
    );
    assert_eq!(
        should_provision(&node(false), &with_node(None), Some(&immediate), false),
        Err(Skip::WaitingForNode),
        "--node-deployment-immediate-binding=false leaves Immediate claims alone"
    );
}

#[test]
fn claiming_delays_grow_with_jitter() {
    use std::time::Duration;
    let (base, max) = (Duration::from_secs(20), Duration::from_secs(60));
    assert_eq!(owner_delay(base, max, 0, 0.0), base);
    assert_eq!(owner_delay(base, max, 0, 1.0), Duration::ZERO);
    assert_eq!(owner_delay(base, max, 1, 0.0), Duration::from_secs(40));
    assert_eq!(owner_delay(base, max, 1, 0.5), Duration::from_secs(30));
    assert_eq!(owner_delay(base, max, 5, 0.0), max);
    assert_eq!(owner_delay(base, max, 100, 0.25), Duration::from_secs(55));
}

#[test]
fn nodes_leave_other_nodes_volumes_alone() {
    let volume = Volume {
        on_this_node: false,
        ..released_volume()
    };
    assert_eq!(
        plan_volume(&policy(), &volume, None, None),
        VolumePlan::Nothing
    );
    assert!(matches!(
        plan_volume(&policy(), &released_volume(), None, None),
        VolumePlan::Delete(_)
    ));
}

fn released_volume() -> Volume {
    Volume::from_api(
        &serde_json::from_value(json!({
            "metadata": {"name": "pv-1", "finalizers": [model::PV_FINALIZER],
                "annotations": {model::ANN_PROVISIONED_BY: "d",
                    model::ANN_DELETION_SECRET_NAME: "", model::ANN_DELETION_SECRET_NAMESPACE: ""}},
            "spec": {"persistentVolumeReclaimPolicy": "Delete",
                "csi": {"driver": "d", "volumeHandle": "vol-1"}},
            "status": {"phase": "Released"}
        }))
        .unwrap(),
    )
}
