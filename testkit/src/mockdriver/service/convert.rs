//! Between the CSI messages and the plain state types.

use std::collections::{BTreeMap, HashMap};

use csi_proto::v1;
use csi_proto::v1::volume_capability::{self, access_mode::Mode};
use csi_proto::v1::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use tonic::Code;

use crate::mockdriver::config::Segment;
use crate::mockdriver::state::{
    AccessMode, AccessType, Capability, ContentSource, GroupSnapshot, Rejection, Snapshot, Volume,
};

pub(super) fn sorted(map: HashMap<String, String>) -> BTreeMap<String, String> {
    map.into_iter().collect()
}

pub(super) fn unsorted(map: &BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn access_mode(mode: i32) -> Option<AccessMode> {
    Some(match Mode::try_from(mode).ok()? {
        Mode::Unknown => return None,
        Mode::SingleNodeWriter => AccessMode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly => AccessMode::SingleNodeReaderOnly,
        Mode::MultiNodeReaderOnly => AccessMode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter => AccessMode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter => AccessMode::MultiNodeMultiWriter,
        Mode::SingleNodeSingleWriter => AccessMode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter => AccessMode::SingleNodeMultiWriter,
    })
}

/// A `VolumeCapability` with both its access mode and access type set.
pub(super) fn capability(cap: &v1::VolumeCapability) -> Result<Capability, Rejection> {
    let access_mode = cap
        .access_mode
        .and_then(|m| access_mode(m.mode))
        .ok_or_else(|| Rejection::new(Code::InvalidArgument, "access_mode is required"))?;
    let access_type = match &cap.access_type {
        Some(volume_capability::AccessType::Block(_)) => AccessType::Block,
        Some(volume_capability::AccessType::Mount(mount)) => AccessType::Mount {
            fs_type: mount.fs_type.clone(),
            mount_flags: mount.mount_flags.clone(),
        },
        None => {
            return Err(Rejection::new(
                Code::InvalidArgument,
                "access_type (block or mount) is required",
            ));
        }
    };
    Ok(Capability {
        access_mode,
        access_type,
    })
}

pub(super) fn required_capability(
    cap: Option<&v1::VolumeCapability>,
) -> Result<Capability, Rejection> {
    cap.ok_or_else(|| Rejection::new(Code::InvalidArgument, "volume_capability is required"))
        .and_then(capability)
}

pub(super) fn capabilities(caps: &[v1::VolumeCapability]) -> Result<Vec<Capability>, Rejection> {
    caps.iter().map(capability).collect()
}

pub(super) fn content_source(
    source: Option<v1::VolumeContentSource>,
) -> Result<Option<ContentSource>, Rejection> {
    let Some(source) = source else {
        return Ok(None);
    };
    match source.r#type {
        Some(SourceType::Snapshot(s)) => Ok(Some(ContentSource::Snapshot(s.snapshot_id))),
        Some(SourceType::Volume(v)) => Ok(Some(ContentSource::Volume(v.volume_id))),
        None => Err(Rejection::new(
            Code::InvalidArgument,
            "volume_content_source names neither a snapshot nor a volume",
        )),
    }
}

fn proto_source(source: &ContentSource) -> v1::VolumeContentSource {
    v1::VolumeContentSource {
        r#type: Some(match source {
            ContentSource::Snapshot(id) => SourceType::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            ContentSource::Volume(id) => SourceType::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
        }),
    }
}

pub(super) fn segments(topologies: Vec<v1::Topology>) -> Vec<Segment> {
    topologies.into_iter().map(|t| sorted(t.segments)).collect()
}

pub(super) fn topology(segment: &Segment) -> v1::Topology {
    v1::Topology {
        segments: unsorted(segment),
    }
}

pub(super) fn volume(volume: &Volume) -> v1::Volume {
    v1::Volume {
        capacity_bytes: volume.capacity_bytes,
        volume_id: volume.id.clone(),
        volume_context: volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        content_source: volume.content_source.as_ref().map(proto_source),
        accessible_topology: volume.accessible_topology.iter().map(topology).collect(),
    }
}

/// The snapshot as CSI describes it; ready once it has been answered about more than
/// `ready_after` times.
pub(super) fn snapshot(snapshot: &Snapshot, ready_after: u32) -> v1::Snapshot {
    v1::Snapshot {
        size_bytes: snapshot.size_bytes,
        snapshot_id: snapshot.id.clone(),
        source_volume_id: snapshot.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: snapshot.creation_seconds,
            nanos: snapshot.creation_nanos,
        }),
        ready_to_use: snapshot.answers > ready_after,
        group_snapshot_id: snapshot.group_snapshot_id.clone(),
    }
}

/// The group snapshot as CSI describes it, ready as its snapshots are.
pub(super) fn group_snapshot(
    group: &GroupSnapshot,
    members: &[Snapshot],
    ready_after: u32,
) -> v1::VolumeGroupSnapshot {
    v1::VolumeGroupSnapshot {
        group_snapshot_id: group.id.clone(),
        snapshots: members.iter().map(|m| snapshot(m, ready_after)).collect(),
        creation_time: Some(prost_types::Timestamp {
            seconds: group.creation_seconds,
            nanos: group.creation_nanos,
        }),
        ready_to_use: group.answers > ready_after,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proto_cap(
        mode: Mode,
        access_type: Option<volume_capability::AccessType>,
    ) -> v1::VolumeCapability {
        v1::VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type,
        }
    }

    #[test]
    fn capabilities_need_mode_and_type() {
        let block = Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        ));
        assert_eq!(
            capability(&proto_cap(Mode::MultiNodeMultiWriter, block.clone())).unwrap(),
            Capability {
                access_mode: AccessMode::MultiNodeMultiWriter,
                access_type: AccessType::Block
            }
        );
        for bad in [
            proto_cap(Mode::Unknown, block.clone()),
            proto_cap(Mode::SingleNodeWriter, None),
            v1::VolumeCapability {
                access_mode: Some(volume_capability::AccessMode { mode: 99 }),
                access_type: block,
            },
        ] {
            assert_eq!(capability(&bad).unwrap_err().code, Code::InvalidArgument);
        }
        assert!(required_capability(None).is_err());
    }

    #[test]
    fn known_access_modes_only() {
        assert!((1..=7).all(|mode| access_mode(mode).is_some()));
        assert_eq!(access_mode(0), None);
        assert_eq!(access_mode(8), None);
    }

    #[test]
    fn sources_round_trip() {
        for source in [
            ContentSource::Snapshot("snap-1".into()),
            ContentSource::Volume("vol-1".into()),
        ] {
            assert_eq!(
                content_source(Some(proto_source(&source))).unwrap(),
                Some(source)
            );
        }
        assert!(content_source(Some(v1::VolumeContentSource { r#type: None })).is_err());
        assert_eq!(content_source(None).unwrap(), None);
    }
}
