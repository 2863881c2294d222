//! The convergence verdict: a pure judgement of one snapshot of the cluster and the driver
//! against what the workload asked for.

use std::collections::{BTreeMap, BTreeSet};

/// A volume the mock driver holds.
#[derive(Clone, Debug, Default)]
pub struct DriverVolume {
    pub id: String,
    /// Node ids it is controller-published to.
    pub published: BTreeSet<String>,
    pub capacity_bytes: i64,
}

#[derive(Clone, Debug, Default)]
pub struct PvView {
    pub name: String,
    /// The CSI volume handle, for PVs of the driver under test.
    pub handle: Option<String>,
    /// `namespace/name` of the claim it is bound to.
    pub claim: Option<String>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
    pub capacity_bytes: Option<i128>,
    /// `spec.volumeAttributesClassName`.
    pub class: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct PvcView {
    /// `namespace/name`.
    pub key: String,
    pub phase: String,
    pub volume: Option<String>,
    pub deleting: bool,
    pub request_bytes: Option<i128>,
    /// While the node's step of an expansion is due (`NodeResizePending`): the size the
    /// controller expanded to (`allocatedResources`). A larger request waits for the node, as
    /// upstream's resizer has it; there is no kubelet here.
    pub node_step_bytes: Option<i128>,
    /// What the claim's status says of an expansion in the controller: a resize condition
    /// (`Resizing`, `ControllerResizeError`) or `allocatedResourceStatuses[storage]` of the
    /// controller; `None` when the controller is done (the node may still have its step).
    pub resizing: Option<String>,
    /// `spec.volumeAttributesClassName` and `status.currentVolumeAttributesClassName`.
    pub class: Option<String>,
    pub current_class: Option<String>,
    /// `status.modifyVolumeStatus.status`, while a class change is not done.
    pub modifying: Option<String>,
}

#[derive(Clone, Debug, Default)]
pub struct VaView {
    pub name: String,
    pub pv: Option<String>,
    pub node: String,
    pub attached: bool,
    pub deleting: bool,
}

/// A VolumeSnapshotContent of the driver under test.
#[derive(Clone, Debug, Default)]
pub struct ContentView {
    pub name: String,
    /// `namespace/name` of its VolumeSnapshot.
    pub snapshot: String,
    /// `status.snapshotHandle`.
    pub handle: Option<String>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

/// A VolumeSnapshot of the test namespace.
#[derive(Clone, Debug, Default)]
pub struct VolumeSnapshotView {
    /// `namespace/name`.
    pub key: String,
    pub ready: bool,
    pub deleting: bool,
    /// `namespace/name` of the VolumeGroupSnapshot it is a member of.
    pub group: Option<String>,
}

/// A VolumeGroupSnapshotContent of the driver under test.
#[derive(Clone, Debug, Default)]
pub struct GroupContentView {
    pub name: String,
    /// `namespace/name` of its VolumeGroupSnapshot.
    pub group: String,
    /// `status.volumeGroupSnapshotHandle`.
    pub handle: Option<String>,
    pub deleting: bool,
    pub finalizers: Vec<String>,
}

/// What the cluster and the driver hold at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub driver: Vec<DriverVolume>,
    /// The ids of the snapshots the driver holds.
    pub driver_snapshots: Vec<String>,
    pub pvs: Vec<PvView>,
    pub pvcs: Vec<PvcView>,
    pub vas: Vec<VaView>,
    pub contents: Vec<ContentView>,
    pub volume_snapshots: Vec<VolumeSnapshotView>,
    /// The ids of the group snapshots the driver holds.
    pub driver_groups: Vec<String>,
    pub group_contents: Vec<GroupContentView>,
    /// The VolumeGroupSnapshots of the test namespace.
    pub groups: Vec<VolumeSnapshotView>,
}

/// What the workload wants once everything has settled.
#[derive(Clone, Debug, Default)]
pub struct Expectation {
    /// Claims (`namespace/name`) that exist and must be Bound.
    pub claims: BTreeSet<String>,
    /// VolumeAttachments that exist and must be attached: name → node name.
    pub attachments: BTreeMap<String, String>,
    /// Node name → the driver's node id.
    pub node_ids: BTreeMap<String, String>,
    /// VolumeSnapshots (`namespace/name`) that exist and must be ready to use.
    pub snapshots: BTreeSet<String>,
    /// VolumeGroupSnapshots (`namespace/name`) that exist and must be ready to use, each with
    /// its member snapshots.
    pub groups: BTreeSet<String>,
}

/// Everything that is not as it should be; all empty means converged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Volumes in the driver that no PV names.
    pub leaked: Vec<String>,
    /// PVs whose volume the driver does not have.
    pub orphaned: Vec<String>,
    /// Volume handles named by more than one PV.
    pub duplicated: Vec<String>,
    /// Claims that should be Bound and are not.
    pub pending: Vec<String>,
    /// Objects with a deletion timestamp that are still there.
    pub stuck: Vec<String>,
    /// Claims, PVs or VolumeAttachments that should be gone.
    pub unexpected: Vec<String>,
    /// VolumeAttachments whose attached state is not the driver's publish state, and
    /// publications no VolumeAttachment asks for.
    pub attach_mismatch: Vec<String>,
    /// Bound claims whose requested size is not the PV's and the driver's, that still show an
    /// expansion in the controller, or whose class is not the one asked for.
    pub resize_mismatch: Vec<String>,
    /// Snapshots in the driver that no VolumeSnapshotContent names, and group snapshots no
    /// VolumeGroupSnapshotContent names.
    pub leaked_snapshots: Vec<String>,
    /// Kept VolumeSnapshots that are not ready, contents whose snapshot the driver does not
    /// have, and handles named twice.
    pub snapshot_mismatch: Vec<String>,
}

impl Verdict {
    pub fn converged(&self) -> bool {
        *self == Verdict::default()
    }
}

/// Judges `snapshot` against `expected`.
pub fn judge(snapshot: &Snapshot, expected: &Expectation) -> Verdict {
    let mut verdict = Verdict::default();
    let driver: BTreeMap<&str, &DriverVolume> =
        snapshot.driver.iter().map(|v| (v.id.as_str(), v)).collect();
    let mut handles: BTreeMap<&str, Vec<&PvView>> = BTreeMap::new();
    for pv in &snapshot.pvs {
        if let Some(handle) = &pv.handle {
            handles.entry(handle).or_default().push(pv);
        }
    }
    for id in driver.keys() {
        if !handles.contains_key(id) {
            verdict.leaked.push(id.to_string());
        }
    }
    for (handle, pvs) in &handles {
        if !driver.contains_key(handle) {
            verdict
                .orphaned
                .extend(pvs.iter().map(|pv| format!("{} ({handle})", pv.name)));
        }
        if pvs.len() > 1 {
            verdict.duplicated.push(handle.to_string());
        }
    }
    let pvcs: BTreeMap<&str, &PvcView> =
        snapshot.pvcs.iter().map(|c| (c.key.as_str(), c)).collect();
    for claim in &expected.claims {
        match pvcs.get(claim.as_str()) {
            Some(pvc) if pvc.phase == "Bound" && pvc.volume.is_some() => {}
            Some(pvc) => verdict.pending.push(format!("{claim} ({})", pvc.phase)),
            None => verdict.pending.push(format!("{claim} (missing)")),
        }
    }
    for pvc in &snapshot.pvcs {
        if pvc.deleting {
            verdict.stuck.push(format!("claim {}", pvc.key));
        } else if !expected.claims.contains(&pvc.key) {
            verdict.unexpected.push(format!("claim {}", pvc.key));
        }
    }
    for pv in snapshot.pvs.iter().filter(|pv| pv.handle.is_some()) {
        if pv.deleting {
            verdict
                .stuck
                .push(format!("PV {} (finalizers {:?})", pv.name, pv.finalizers));
        } else if !pv
            .claim
            .as_ref()
            .is_some_and(|c| expected.claims.contains(c))
        {
            verdict
                .unexpected
                .push(format!("PV {} for {:?}", pv.name, pv.claim));
        }
    }
    let pv_handles: BTreeMap<&str, &str> = snapshot
        .pvs
        .iter()
        .filter_map(|pv| Some((pv.name.as_str(), pv.handle.as_deref()?)))
        .collect();
    let mut asked: BTreeSet<(&str, &str)> = BTreeSet::new();
    for va in &snapshot.vas {
        if va.deleting {
            verdict.stuck.push(format!("VolumeAttachment {}", va.name));
            continue;
        }
        if !expected.attachments.contains_key(&va.name) {
            verdict
                .unexpected
                .push(format!("VolumeAttachment {}", va.name));
            continue;
        }
        let handle = va.pv.as_deref().and_then(|pv| pv_handles.get(pv).copied());
        let node_id = expected.node_ids.get(&va.node).map(String::as_str);
        let published = match (handle, node_id) {
            (Some(handle), Some(node_id)) => {
                asked.insert((handle, node_id));
                driver
                    .get(handle)
                    .is_some_and(|v| v.published.contains(node_id))
            }
            _ => false,
        };
        if !va.attached || !published {
            verdict.attach_mismatch.push(format!(
                "VolumeAttachment {}: attached {}, published in the driver {published}",
                va.name, va.attached
            ));
        }
    }
    for name in expected.attachments.keys() {
        if !snapshot.vas.iter().any(|va| &va.name == name) {
            verdict
                .attach_mismatch
                .push(format!("VolumeAttachment {name} is missing"));
        }
    }
    let pvs: BTreeMap<&str, &PvView> = snapshot
        .pvs
        .iter()
        .map(|pv| (pv.name.as_str(), pv))
        .collect();
    for claim in &expected.claims {
        let Some(pvc) = pvcs.get(claim.as_str()) else {
            continue;
        };
        let Some(pv) = pvc.volume.as_deref().and_then(|name| pvs.get(name)) else {
            continue;
        };
        let request = pvc.node_step_bytes.or(pvc.request_bytes).unwrap_or(0);
        let driver_bytes = pv
            .handle
            .as_deref()
            .and_then(|h| driver.get(h))
            .map(|v| i128::from(v.capacity_bytes));
        if pv.capacity_bytes.unwrap_or(0) < request || driver_bytes.is_some_and(|b| b < request) {
            verdict.resize_mismatch.push(format!(
                "claim {claim} asks for {request} bytes: PV {} has {:?}, the driver {driver_bytes:?}",
                pv.name, pv.capacity_bytes
            ));
        }
        if let Some(state) = &pvc.resizing {
            verdict
                .resize_mismatch
                .push(format!("claim {claim} still shows {state}"));
        }
        if pvc.class.is_some() && (pvc.current_class != pvc.class || pv.class != pvc.class) {
            verdict.resize_mismatch.push(format!(
                "claim {claim} asks for class {:?}: current {:?}, PV {:?}, modify status {:?}",
                pvc.class, pvc.current_class, pv.class, pvc.modifying
            ));
        } else if let Some(modifying) = &pvc.modifying {
            verdict
                .resize_mismatch
                .push(format!("claim {claim} still {modifying}"));
        }
    }
    judge_snapshots(snapshot, expected, &mut verdict);
    for volume in &snapshot.driver {
        for node_id in &volume.published {
            if !asked.contains(&(volume.id.as_str(), node_id.as_str())) {
                verdict.attach_mismatch.push(format!(
                    "volume {} is published to {node_id} without a VolumeAttachment",
                    volume.id
                ));
            }
        }
    }
    verdict
}

/// The group snapshots, as the snapshots below: the driver's and the group contents' name each
/// other one to one, every kept group is ready, deleted ones are gone.
fn judge_groups(snapshot: &Snapshot, expected: &Expectation, verdict: &mut Verdict) {
    let mut named: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for content in &snapshot.group_contents {
        if content.deleting {
            verdict.stuck.push(format!(
                "VolumeGroupSnapshotContent {} (finalizers {:?})",
                content.name, content.finalizers
            ));
        }
        if let Some(handle) = &content.handle {
            named.entry(handle).or_default().push(&content.name);
        }
        if !expected.groups.contains(&content.group) && !content.deleting {
            verdict.unexpected.push(format!(
                "VolumeGroupSnapshotContent {} of {}",
                content.name, content.group
            ));
        }
    }
    let held: BTreeSet<&str> = snapshot.driver_groups.iter().map(String::as_str).collect();
    for id in &held {
        if !named.contains_key(id) {
            verdict.leaked_snapshots.push(format!("group {id}"));
        }
    }
    for (handle, contents) in &named {
        if !held.contains(handle) {
            verdict.snapshot_mismatch.push(format!(
                "{contents:?} name group {handle}, which the driver does not have"
            ));
        }
        if contents.len() > 1 {
            verdict
                .snapshot_mismatch
                .push(format!("group {handle} named by {contents:?}"));
        }
    }
    for key in &expected.groups {
        match snapshot.groups.iter().find(|g| &g.key == key) {
            Some(g) if g.ready => {}
            Some(_) => verdict
                .snapshot_mismatch
                .push(format!("VolumeGroupSnapshot {key} is not ready")),
            None => verdict
                .snapshot_mismatch
                .push(format!("VolumeGroupSnapshot {key} is missing")),
        }
    }
    for g in &snapshot.groups {
        if g.deleting {
            verdict.stuck.push(format!("VolumeGroupSnapshot {}", g.key));
        } else if !expected.groups.contains(&g.key) {
            verdict
                .unexpected
                .push(format!("VolumeGroupSnapshot {}", g.key));
        }
    }
}

/// The snapshots: the driver's and the contents' name each other one to one, nothing deleted
/// is held, every kept VolumeSnapshot is ready, and deleted ones are gone.
fn judge_snapshots(snapshot: &Snapshot, expected: &Expectation, verdict: &mut Verdict) {
    // The members of a kept group are kept with it.
    let mut expected_snapshots = expected.snapshots.clone();
    for s in &snapshot.volume_snapshots {
        if s.group
            .as_ref()
            .is_some_and(|g| expected.groups.contains(g))
        {
            expected_snapshots.insert(s.key.clone());
        }
    }
    let expected = &Expectation {
        snapshots: expected_snapshots,
        ..expected.clone()
    };
    judge_groups(snapshot, expected, verdict);
    let mut named: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for content in &snapshot.contents {
        if content.deleting {
            verdict.stuck.push(format!(
                "VolumeSnapshotContent {} (finalizers {:?})",
                content.name, content.finalizers
            ));
        }
        if let Some(handle) = &content.handle {
            named.entry(handle).or_default().push(&content.name);
        }
        if !expected.snapshots.contains(&content.snapshot) && !content.deleting {
            verdict.unexpected.push(format!(
                "VolumeSnapshotContent {} of {}",
                content.name, content.snapshot
            ));
        }
    }
    let held: BTreeSet<&str> = snapshot
        .driver_snapshots
        .iter()
        .map(String::as_str)
        .collect();
    for id in &held {
        if !named.contains_key(id) {
            verdict.leaked_snapshots.push(id.to_string());
        }
    }
    for (handle, contents) in &named {
        if !held.contains(handle) {
            verdict.snapshot_mismatch.push(format!(
                "{contents:?} name {handle}, which the driver does not have"
            ));
        }
        if contents.len() > 1 {
            verdict
                .snapshot_mismatch
                .push(format!("{handle} named by {contents:?}"));
        }
    }
    let snapshots: BTreeMap<&str, &VolumeSnapshotView> = snapshot
        .volume_snapshots
        .iter()
        .map(|s| (s.key.as_str(), s))
        .collect();
    for key in &expected.snapshots {
        match snapshots.get(key.as_str()) {
            Some(s) if s.ready => {}
            Some(_) => verdict
                .snapshot_mismatch
                .push(format!("VolumeSnapshot {key} is not ready")),
            None => verdict
                .snapshot_mismatch
                .push(format!("VolumeSnapshot {key} is missing")),
        }
    }
    for s in &snapshot.volume_snapshots {
        if s.deleting {
            verdict.stuck.push(format!("VolumeSnapshot {}", s.key));
        } else if !expected.snapshots.contains(&s.key) {
            verdict.unexpected.push(format!("VolumeSnapshot {}", s.key));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled() -> (Snapshot, Expectation) {
        let snapshot = Snapshot {
            driver: vec![
                DriverVolume {
                    id: "v1".into(),
                    published: ["n-1".to_string()].into(),
                    capacity_bytes: 1 << 20,
                },
                DriverVolume {
                    id: "v2".into(),
                    published: BTreeSet::new(),
                    capacity_bytes: 1 << 20,
                },
            ],
            pvs: vec![
                PvView {
                    name: "pv1".into(),
                    handle: Some("v1".into()),
                    claim: Some("ns/c1".into()),
                    capacity_bytes: Some(1 << 20),
                    ..PvView::default()
                },
                PvView {
                    name: "pv2".into(),
                    handle: Some("v2".into()),
                    claim: Some("ns/c2".into()),
                    capacity_bytes: Some(1 << 20),
                    ..PvView::default()
                },
            ],
            pvcs: ["c1", "c2"]
                .iter()
                .zip(["pv1", "pv2"])
                .map(|(c, pv)| PvcView {
                    key: format!("ns/{c}"),
                    phase: "Bound".into(),
                    volume: Some(pv.into()),
                    request_bytes: Some(1 << 20),
                    ..PvcView::default()
                })
                .collect(),
            vas: vec![VaView {
                name: "va1".into(),
                pv: Some("pv1".into()),
                node: "node-1".into(),
                attached: true,
                deleting: false,
            }],
            driver_snapshots: vec!["s1".into()],
            contents: vec![ContentView {
                name: "snapcontent-1".into(),
                snapshot: "ns/snap1".into(),
                handle: Some("s1".into()),
                ..ContentView::default()
            }],
            volume_snapshots: vec![
                VolumeSnapshotView {
                    key: "ns/snap1".into(),
                    ready: true,
                    ..VolumeSnapshotView::default()
                },
                VolumeSnapshotView {
                    key: "ns/member1".into(),
                    ready: true,
                    group: Some("ns/group1".into()),
                    ..VolumeSnapshotView::default()
                },
            ],
            driver_groups: vec!["g1".into()],
            group_contents: vec![GroupContentView {
                name: "groupsnapcontent-1".into(),
                group: "ns/group1".into(),
                handle: Some("g1".into()),
                ..GroupContentView::default()
            }],
            groups: vec![VolumeSnapshotView {
                key: "ns/group1".into(),
                ready: true,
                ..VolumeSnapshotView::default()
            }],
        };
        let expected = Expectation {
            claims: ["ns/c1".to_string(), "ns/c2".to_string()].into(),
            attachments: [("va1".to_string(), "node-1".to_string())].into(),
            node_ids: [("node-1".to_string(), "n-1".to_string())].into(),
            snapshots: ["ns/snap1".to_string()].into(),
            groups: ["ns/group1".to_string()].into(),
        };
        (snapshot, expected)
    }

    #[test]
    fn a_settled_snapshot_converges() {
        let (snapshot, expected) = settled();
        assert_eq!(judge(&snapshot, &expected), Verdict::default());
    }

    #[test]
    fn each_kind_of_divergence_is_named() {
        let (mut snapshot, expected) = settled();
        snapshot.driver.push(DriverVolume {
            id: "v3".into(),
            ..DriverVolume::default()
        });
        snapshot.driver[1].published.insert("n-1".into());
        snapshot.pvs.push(PvView {
            name: "pv4".into(),
            handle: Some("v4".into()),
            claim: Some("ns/gone".into()),
            deleting: true,
            finalizers: vec!["external-provisioner.volume.kubernetes.io/finalizer".into()],
            ..PvView::default()
        });
        snapshot.pvcs[1].phase = "Pending".into();
        snapshot.vas[0].attached = false;
        snapshot.vas.push(VaView {
            name: "va-old".into(),
            deleting: true,
            ..VaView::default()
        });
        let verdict = judge(&snapshot, &expected);
        assert_eq!(verdict.leaked, ["v3"]);
        assert_eq!(verdict.orphaned, ["pv4 (v4)"]);
        assert_eq!(verdict.pending, ["ns/c2 (Pending)"]);
        assert_eq!(verdict.stuck.len(), 2, "{:?}", verdict.stuck);
        assert_eq!(
            verdict.attach_mismatch.len(),
            2,
            "{:?}",
            verdict.attach_mismatch
        );
        assert!(!verdict.converged());
    }

    #[test]
    fn a_handle_on_two_pvs_and_leftovers_are_named() {
        let (mut snapshot, mut expected) = settled();
        snapshot.pvs[1].handle = Some("v1".into());
        expected.attachments.clear();
        expected.claims.remove("ns/c2");
        let verdict = judge(&snapshot, &expected);
        assert_eq!(verdict.duplicated, ["v1"]);
        assert_eq!(verdict.leaked, ["v2"]);
        assert!(verdict.unexpected.contains(&"claim ns/c2".to_string()));
        assert!(
            verdict
                .unexpected
                .contains(&"VolumeAttachment va1".to_string())
        );
        assert!(
            verdict
                .attach_mismatch
                .iter()
                .any(|m| m.contains("without a VolumeAttachment"))
        );
    }

    #[test]
    fn a_claim_whose_size_or_class_is_not_reached_is_named() {
        let (mut snapshot, expected) = settled();
        // Asked for 2 MiB: the PV has grown, the driver's volume has not.
        snapshot.pvcs[0].request_bytes = Some(2 << 20);
        snapshot.pvs[0].capacity_bytes = Some(2 << 20);
        snapshot.pvcs[1].resizing = Some("ControllerResizeInProgress".into());
        let verdict = judge(&snapshot, &expected);
        assert_eq!(
            verdict.resize_mismatch.len(),
            2,
            "{:?}",
            verdict.resize_mismatch
        );
        assert!(verdict.resize_mismatch[0].contains("ns/c1"));
        let (mut snapshot, expected) = settled();
        snapshot.pvcs[0].class = Some("gold".into());
        snapshot.pvcs[0].current_class = Some("gold".into());
        snapshot.pvs[0].class = Some("gold".into());
        assert!(
            judge(&snapshot, &expected).converged(),
            "the class is reached"
        );
        snapshot.pvs[0].class = None;
        assert_eq!(judge(&snapshot, &expected).resize_mismatch.len(), 1);
    }

    #[test]
    fn leaked_unready_and_stuck_snapshots_are_named() {
        let (mut snapshot, mut expected) = settled();
        snapshot.driver_snapshots.push("s-orphan".into());
        snapshot.volume_snapshots[0].ready = false;
        snapshot.contents.push(ContentView {
            name: "snapcontent-2".into(),
            snapshot: "ns/snap2".into(),
            handle: Some("s-gone".into()),
            deleting: true,
            finalizers: vec![
                "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection".into(),
            ],
        });
        expected.snapshots.insert("ns/snap3".into());
        let verdict = judge(&snapshot, &expected);
        assert_eq!(verdict.leaked_snapshots, ["s-orphan"]);
        assert_eq!(verdict.stuck.len(), 1, "{:?}", verdict.stuck);
        assert_eq!(
            verdict.snapshot_mismatch.len(),
            3,
            "not ready, missing, a handle the driver lacks: {:?}",
            verdict.snapshot_mismatch
        );
    }

    #[test]
    fn leaked_unready_and_leftover_groups_are_named() {
        let (mut snapshot, mut expected) = settled();
        snapshot.driver_groups.push("g-orphan".into());
        snapshot.groups[0].ready = false;
        expected.groups.insert("ns/group2".into());
        let verdict = judge(&snapshot, &expected);
        assert_eq!(verdict.leaked_snapshots, ["group g-orphan"]);
        assert_eq!(
            verdict.snapshot_mismatch.len(),
            2,
            "{:?}",
            verdict.snapshot_mismatch
        );
        let (snapshot, mut expected) = settled();
        expected.groups.clear();
        let verdict = judge(&snapshot, &expected);
        assert_eq!(
            verdict.unexpected.len(),
            3,
            "the group, its content and its member: {:?}",
            verdict.unexpected
        );
    }
}
