use super::*;
use crate::model::SecretRef;
use sidecar_kit::values::atom::{Atom, List};

const DRIVER: &str = "hostpath.csi.k8s.io";
const FINALIZER: &str = "external-attacher/hostpath-csi-k8s-io";

/// `finalizers` and the attacher's own.
fn with_ours(finalizers: &[Atom]) -> List<Atom> {
    finalizers
        .iter()
        .cloned()
        .chain([Atom::new(FINALIZER)])
        .collect()
}

fn policy() -> Policy {
    Policy {
        driver: "hostpath.csi.k8s.io".into(),
        finalizer: FINALIZER.into(),
        publish_unpublish: true,
        publish_readonly: false,
        single_node_multi_writer: false,
        default_fstype: String::new(),
        error_codes: true,
    }
}

fn spec() -> VolumeSpec {
    VolumeSpec {
        csi: Some(CsiSource {
            driver: "hostpath.csi.k8s.io".into(),
            volume_handle: "vol-1".into(),
            read_only: false,
            fs_type: sidecar_kit::values::atom::Atom::default(),
            volume_attributes: [("a".to_string(), "b".to_string())].into(),
            publish_secret: None,
        }),
        access_modes: vec!["ReadWriteOnce".into()],
        block: false,
        mount_options: vec![],
    }
}

fn pv() -> Pv {
    Pv {
        name: "pv-1".into(),
        resource_version: "5".into(),
        deleting: false,
        finalizers: List::default(),
        migrated_to: None,
        spec: spec(),
        in_tree: None,
    }
}

fn va() -> Va {
    Va {
        name: "va-1".into(),
        uid: "u".into(),
        resource_version: "9".into(),
        deleting: false,
        finalizers: List::default(),
        node_id_annotation: None,
        attacher: "hostpath.csi.k8s.io".into(),
        node_name: "node-1".into(),
        source: VaSource::Pv("pv-1".into()),
        attached: false,
        attachment_metadata: BTreeMap::new(),
        attach_error: false,
        detach_error: false,
    }
}

fn found() -> NodeLookup {
    NodeLookup::Found("nid-1".into())
}

fn attach_plan(plan: VaPlan) -> AttachPlan {
    match plan {
        VaPlan::Attach(plan) => *plan,
        other => panic!("expected an attach, got {other:?}"),
    }
}

fn detach_plan(plan: VaPlan) -> DetachPlan {
    match plan {
        VaPlan::Detach(plan) => *plan,
        other => panic!("expected a detach, got {other:?}"),
    }
}

#[test]
fn first_attach_writes_pv_finalizer_va_metadata_then_publishes() {
    let plan = attach_plan(plan_va(&policy(), &va(), Some(&pv()), &found(), false));
    assert_eq!(
        plan.pv_finalizer,
        Some(PvPatch {
            name: "pv-1".into(),
            patch: json!({"metadata": {"finalizers": [FINALIZER]}}),
        })
    );
    assert_eq!(
        plan.va_metadata,
        Some(json!({"metadata": {"finalizers": [FINALIZER],
            "annotations": {"csi.alpha.kubernetes.io/node-id": "nid-1"}}}))
    );
    assert_eq!(plan.secret, None);
    let r = &plan.request;
    assert_eq!(
        (r.volume_id.as_str(), r.node_id.as_str()),
        ("vol-1", "nid-1")
    );
    assert!(!r.readonly);
    assert_eq!(r.volume_context["a"], "b");
    assert_eq!(
        r.volume_capability,
        Some(VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: String::new(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            })),
        })
    );
}

#[test]
fn repeated_attach_writes_nothing_already_present() {
    let mut va = va();
    va.finalizers = List::new(&[Atom::new("other"), Atom::new(FINALIZER)]);
    va.node_id_annotation = Some("nid-1".into());
    let mut pv = pv();
    pv.finalizers = List::new(&[Atom::new(FINALIZER)]);
    let plan = attach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
    assert_eq!(plan.pv_finalizer, None);
    assert_eq!(plan.va_metadata, None);

    // A changed node ID rewrites only the annotation.
    let plan = attach_plan(plan_va(
        &policy(),
        &va,
        Some(&pv),
        &NodeLookup::Found("nid-2".into()),
        false,
    ));
    assert_eq!(
        plan.va_metadata,
        Some(json!({"metadata": {"annotations": {"csi.alpha.kubernetes.io/node-id": "nid-2"}}}))
    );
}

#[test]
fn finalizer_patches_name_only_ours_and_carry_no_resource_version() {
    // Whatever the cached PV or VA holds, the patches add or delete our finalizer alone:
    // the server merges them into its current list, so concurrent writers (pv-protection,
    // the binder) neither conflict with them nor lose their finalizers.
    let mut pv = pv();
    pv.finalizers = List::new(&[Atom::new("kubernetes.io/pv-protection")]);
    let mut va = va();
    va.finalizers = List::new(&[Atom::new("example.com/other")]);
    let plan = attach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
    assert_eq!(
        plan.pv_finalizer.unwrap().patch,
        json!({"metadata": {"finalizers": [FINALIZER]}})
    );
    assert_eq!(
        plan.va_metadata,
        Some(json!({"metadata": {"finalizers": [FINALIZER],
            "annotations": {"csi.alpha.kubernetes.io/node-id": "nid-1"}}}))
    );

    pv.finalizers = with_ours(&pv.finalizers);
    pv.deleting = true;
    let PvPlan::RemoveFinalizer(removal) = plan_pv(&policy(), &pv, false) else {
        panic!("expected a removal");
    };
    va.finalizers = with_ours(&va.finalizers);
    va.deleting = true;
    let detach = detach_plan(plan_va(&policy(), &va, Some(&pv), &found(), false));
    for patch in [removal.patch, detach.remove_finalizer] {
        assert_eq!(
            patch,
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})
        );
    }
}

#[test]
fn attached_volumes_are_left_alone_unless_forced() {
    let mut va = va();
    va.attached = true;
    assert_eq!(
        plan_va(&policy(), &va, Some(&pv()), &found(), false),
        VaPlan::Nothing
    );
    assert!(matches!(
        plan_va(&policy(), &va, Some(&pv()), &found(), true),
        VaPlan::Attach(_)
    ));
}

#[test]
fn attach_problems_table() {
    let mut deleting_pv = pv();
    deleting_pv.deleting = true;
    let mut not_csi = pv();
    not_csi.spec.csi = None;
    let mut bad_modes = pv();
    bad_modes.spec.access_modes = vec!["ReadOnlyMany".into(), "ReadWriteOnce".into()];
    let mut both = va();
    both.source = VaSource::Both;
    let mut neither = va();
    neither.source = VaSource::Neither;
    let mut inline_not_csi = va();
    inline_not_csi.source = VaSource::Inline(Box::default());
    let cases: Vec<(Va, Option<Pv>, NodeLookup, &str)> = vec![
        (va(), None, found(), "persistentvolume \"pv-1\" not found"),
        (
            va(),
            Some(deleting_pv),
            found(),
            "PersistentVolume \"pv-1\" is marked for deletion",
        ),
        (
            va(),
            Some(not_csi),
            found(),
            "pv spec contained non-csi source that was not migrated",
        ),
        (
            va(),
            Some(bad_modes),
            found(),
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
        ),
        (
            both,
            Some(pv()),
            found(),
            "both InlineCSIVolumeSource and PersistentVolumeName specified in VA source",
        ),
        (
            neither,
            None,
            found(),
            "neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source",
        ),
        (
            inline_not_csi,
            None,
            found(),
            "inline volume spec contains nil CSI source",
        ),
        (
            va(),
            Some(pv()),
            NodeLookup::NoCsiNode,
            "csinode.storage.k8s.io \"node-1\" not found",
        ),
        (
            va(),
            Some(pv()),
            NodeLookup::DriverMissing,
            "CSINode node-1 does not contain driver hostpath.csi.k8s.io",
        ),
    ];
    for (va, pv, node, message) in cases {
        match plan_va(&policy(), &va, pv.as_ref(), &node, false) {
            VaPlan::Fail(Phase::Attach, problem) => assert_eq!(problem.to_string(), message),
            other => panic!("{message}: got {other:?}"),
        }
    }
}

#[test]
fn attach_ignores_the_annotation_fallback() {
    let mut va = va();
    va.node_id_annotation = Some("old".into());
    assert!(matches!(
        plan_va(&policy(), &va, Some(&pv()), &NodeLookup::NoCsiNode, false),
        VaPlan::Fail(Phase::Attach, Problem::NoCsiNode(_))
    ));
}

#[test]
fn capability_block_fstype_and_mount_options() {
    let mut p = policy();
    p.default_fstype = "ext4".into();
    let mut s = spec();
    s.mount_options = vec!["noatime".into()];
    let csi = s.csi.clone().unwrap();
    let cap = volume_capability(&s, &csi, &p).unwrap();
    assert_eq!(
        cap.access_type,
        Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        }))
    );
    let mut csi_xfs = csi.clone();
    csi_xfs.fs_type = "xfs".into();
    let cap = volume_capability(&s, &csi_xfs, &p).unwrap();
    assert!(
        matches!(cap.access_type, Some(AccessType::Mount(MountVolume { ref fs_type, .. })) if fs_type == "xfs")
    );
    s.block = true;
    let cap = volume_capability(&s, &csi, &p).unwrap();
    assert_eq!(cap.access_type, Some(AccessType::Block(BlockVolume {})));
}

#[test]
fn readonly_only_with_the_capability_and_secrets_and_inline() {
    let mut inline = spec();
    if let Some(csi) = inline.csi.as_mut() {
        csi.read_only = true;
        csi.publish_secret = Some(Box::new(SecretRef {
            namespace: "ns".into(),
            name: "s".into(),
        }));
    }
    let mut va = va();
    va.source = VaSource::Inline(Box::new(inline));
    let plan = attach_plan(plan_va(&policy(), &va, None, &found(), false));
    assert!(!plan.request.readonly);
    assert_eq!(plan.pv_finalizer, None, "inline volumes have no PV");
    assert_eq!(
        plan.secret,
        Some(SecretRef {
            namespace: "ns".into(),
            name: "s".into()
        })
    );
    let mut p = policy();
    p.publish_readonly = true;
    let plan = attach_plan(plan_va(&p, &va, None, &found(), false));
    assert!(plan.request.readonly);
}

#[test]
fn detach_removes_the_last_finalizer_without_a_status_write() {
    let mut va = va();
    va.deleting = true;
    va.attached = true;
    va.finalizers = List::new(&[Atom::new(FINALIZER)]);
    let plan = detach_plan(plan_va(&policy(), &va, Some(&pv()), &found(), false));
    assert_eq!(plan.request.volume_id, "vol-1");
    assert_eq!(plan.request.node_id, "nid-1");
    assert_eq!(
        plan.remove_finalizer,
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}})
    );

    // The response of the removal decides: gone without finalizers, kept by others.
    va.finalizers = List::default();
    assert!(!outlives_detach(&va));
    va.finalizers = List::new(&[Atom::new("keep")]);
    assert!(outlives_detach(&va), "the object outlives our finalizer");
}

#[test]
fn detach_table() {
    let mut deleting = va();
    deleting.deleting = true;
    // Without our finalizer there is nothing to detach, even when forced: it goes only
    // after a successful unpublish.
    assert_eq!(
        plan_va(&policy(), &deleting, Some(&pv()), &found(), false),
        VaPlan::Nothing
    );
    deleting.attached = true;
    assert_eq!(
        plan_va(&policy(), &deleting, Some(&pv()), &found(), true),
        VaPlan::Nothing
    );

    // The node ID falls back to the annotation when the CSINode or the driver is gone.
    deleting.finalizers = List::new(&[Atom::new(FINALIZER)]);
    deleting.node_id_annotation = Some("nid-old".into());
    for lookup in [NodeLookup::NoCsiNode, NodeLookup::DriverMissing] {
        let plan = detach_plan(plan_va(&policy(), &deleting, Some(&pv()), &lookup, false));
        assert_eq!(plan.request.node_id, "nid-old");
    }
    deleting.node_id_annotation = None;
    assert_eq!(
        plan_va(
            &policy(),
            &deleting,
            Some(&pv()),
            &NodeLookup::NoCsiNode,
            false
        ),
        VaPlan::Fail(Phase::Detach, Problem::NoCsiNode("node-1".into()))
    );
    // A deleting PV does not stop a detach; a missing one does.
    let mut deleting_pv = pv();
    deleting_pv.deleting = true;
    assert!(matches!(
        plan_va(&policy(), &deleting, Some(&deleting_pv), &found(), false),
        VaPlan::Detach(_)
    ));
    assert_eq!(
        plan_va(&policy(), &deleting, None, &found(), false),
        VaPlan::Fail(Phase::Detach, Problem::PvNotFound("pv-1".into()))
    );
}

#[test]
fn trivial_driver_marks_attached_only() {
    let mut p = policy();
    p.publish_unpublish = false;
    assert_eq!(
        plan_va(&p, &va(), None, &NodeLookup::NoCsiNode, false),
        VaPlan::MarkAttached
    );
    let mut attached = va();
    attached.attached = true;
    assert_eq!(
        plan_va(&p, &attached, None, &found(), true),
        VaPlan::Nothing
    );
    let mut deleting = va();
    deleting.deleting = true;
    assert_eq!(
        plan_va(&p, &deleting, None, &found(), false),
        VaPlan::Nothing
    );
}

#[test]
fn status_patches() {
    let context: BTreeMap<String, String> = [("dev".to_string(), "/dev/x".to_string())].into();
    assert_eq!(
        attached_status_patch(&va(), &context),
        Some(
            json!({"status": {"attached": true, "attachmentMetadata": {"dev": "/dev/x"}, "attachError": null}})
        )
    );
    assert_eq!(
        attached_status_patch(&va(), &BTreeMap::new()),
        Some(
            json!({"status": {"attached": true, "attachmentMetadata": null, "attachError": null}})
        )
    );
    let mut attached = va();
    attached.attached = true;
    attached.attachment_metadata = context.clone();
    assert_eq!(attached_status_patch(&attached, &context), None);
    attached.attach_error = true;
    assert!(attached_status_patch(&attached, &context).is_some());

    let now = Timestamp::from_second(1_700_000_000).unwrap();
    assert_eq!(
        error_status_patch(
            Phase::Attach,
            "rpc error: code = NotFound desc = x",
            Some(5),
            now
        ),
        json!({"status": {"attachError": {"message": "rpc error: code = NotFound desc = x",
            "time": "2023-11-14T22:13:20Z", "errorCode": 5}}})
    );
    assert_eq!(
        error_status_patch(Phase::Detach, "m", None, now),
        json!({"status": {"detachError": {"message": "m", "time": "2023-11-14T22:13:20Z", "errorCode": null}}})
    );
    assert_eq!(
        detached_status_patch(),
        json!({"status": {"attached": false, "attachmentMetadata": null, "detachError": null}})
    );
}

#[test]
fn pv_finalizer_removal() {
    let mut pv = pv();
    pv.finalizers = List::new(&[
        Atom::new("kubernetes.io/pv-protection"),
        Atom::new(FINALIZER),
    ]);
    assert_eq!(
        plan_pv(&policy(), &pv, false),
        PvPlan::Nothing,
        "not deleting"
    );
    assert!(!pv_needs_processing(&pv, DRIVER, FINALIZER));
    pv.deleting = true;
    assert!(pv_needs_processing(&pv, DRIVER, FINALIZER));
    assert_eq!(
        plan_pv(&policy(), &pv, true),
        PvPlan::Nothing,
        "still referenced"
    );
    assert_eq!(
        plan_pv(&policy(), &pv, false),
        PvPlan::RemoveFinalizer(PvPatch {
            name: "pv-1".into(),
            patch: json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER]}}),
        })
    );
    pv.finalizers = List::new(&[Atom::new("other")]);
    assert_eq!(plan_pv(&policy(), &pv, false), PvPlan::Nothing);
}

fn in_tree_pv(extra: Value) -> Pv {
    let mut pv = json!({
        "metadata": {"name": "pv-1", "resourceVersion": "5",
                     "annotations": {"pv.kubernetes.io/migrated-to": DRIVER}},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "cinder": {"volumeID": "c-1", "fsType": "xfs", "readOnly": true}},
    });
    if let (Value::Object(pv), Value::Object(extra)) = (&mut pv, extra) {
        pv.extend(extra);
    }
    Pv::from_api(&serde_json::from_value(pv).unwrap())
}

#[test]
fn in_tree_volumes_attach_and_detach_translated_and_labelled_migrated() {
    let mut p = policy();
    p.publish_readonly = true;
    let pv = in_tree_pv(json!({}));
    let plan = attach_plan(plan_va(&p, &va(), Some(&pv), &found(), false));
    assert!(plan.migrated);
    assert_eq!(plan.request.volume_id, "c-1");
    assert!(plan.request.readonly);
    assert!(plan.request.volume_context.is_empty());
    assert!(
        matches!(plan.request.volume_capability.unwrap().access_type,
            Some(AccessType::Mount(MountVolume { ref fs_type, .. })) if fs_type == "xfs")
    );
    assert!(plan.pv_finalizer.is_some());

    let mut deleting = va();
    deleting.deleting = true;
    deleting.finalizers = List::new(&[Atom::new(FINALIZER)]);
    let plan = detach_plan(plan_va(&p, &deleting, Some(&pv), &found(), false));
    assert!(plan.migrated);
    assert_eq!(plan.request.volume_id, "c-1");

    let plan = attach_plan(plan_va(&p, &va(), Some(&self::pv()), &found(), false));
    assert!(!plan.migrated, "CSI volumes are not migrated");
}

#[test]
fn untranslatable_in_tree_volumes_fail_with_the_translation_error() {
    let pv = in_tree_pv(json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://z/x"}}}));
    assert_eq!(
        plan_va(&policy(), &va(), Some(&pv), &found(), false),
        VaPlan::Fail(
            Phase::Attach,
            Problem::Translation(
                "failed to translate Kubernetes ID to EBS Volume ID Invalid format for AWS volume (aws://z/x)".into()
            )
        )
    );
}

#[test]
fn rolled_back_migration_releases_the_pv_finalizer() {
    let mut rolled_back = in_tree_pv(json!({"metadata": {"name": "pv-1"}}));
    rolled_back.finalizers = List::new(&[Atom::new(FINALIZER)]);
    assert!(pv_needs_processing(&rolled_back, DRIVER, FINALIZER));
    assert!(matches!(
        plan_pv(&policy(), &rolled_back, false),
        PvPlan::RemoveFinalizer(_)
    ));
    assert_eq!(plan_pv(&policy(), &rolled_back, true), PvPlan::Nothing);

    let mut migrated = in_tree_pv(json!({}));
    migrated.finalizers = List::new(&[Atom::new(FINALIZER)]);
    assert!(!pv_needs_processing(&migrated, DRIVER, FINALIZER));
    assert_eq!(plan_pv(&policy(), &migrated, false), PvPlan::Nothing);

    let mut to_another = migrated.clone();
    to_another.migrated_to = Some("other.example.com".into());
    assert!(pv_needs_processing(&to_another, DRIVER, FINALIZER));
}

#[test]
fn reconcile_rules() {
    let published: HashMap<String, Vec<String>> =
        [("vol-1".to_string(), vec!["n1".to_string()])].into();
    assert!(!out_of_sync(true, "vol-1", "n1", &published));
    assert!(out_of_sync(true, "vol-1", "n2", &published));
    assert!(out_of_sync(true, "vol-2", "n1", &published));
    assert!(out_of_sync(false, "vol-1", "n1", &published));
    assert!(!out_of_sync(false, "vol-2", "n1", &published));
}
