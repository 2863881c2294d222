//! The mock's storage model as plain data, and the CSI semantics over it as
//! plain functions: no I/O, no gRPC types. Every function either changes
//! the state and returns what the RPC answers, or leaves it untouched and
//! returns a [`Rejection`] carrying the gRPC code the CSI spec asks for.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use tonic::Code;

use super::config::{MockConfig, Segment};

mod blocks;
mod rules;

pub use blocks::*;
pub use rules::*;

/// Why an RPC is refused: the status code and message to answer with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct Rejection {
    pub code: Code,
    pub message: String,
}

impl Rejection {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

fn reject<T>(code: Code, message: impl Into<String>) -> Result<T, Rejection> {
    Err(Rejection::new(code, message))
}

fn require(value: &str, field: &str) -> Result<(), Rejection> {
    if value.is_empty() {
        return reject(Code::InvalidArgument, format!("{field} is required"));
    }
    Ok(())
}

/// `VolumeCapability.AccessMode.Mode`, without UNKNOWN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AccessMode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
}

impl AccessMode {
    /// Whether a volume in this mode may be published to one node only.
    pub fn is_single_node(self) -> bool {
        matches!(
            self,
            Self::SingleNodeWriter
                | Self::SingleNodeReaderOnly
                | Self::SingleNodeSingleWriter
                | Self::SingleNodeMultiWriter
        )
    }

    /// Whether the mode needs the `SINGLE_NODE_MULTI_WRITER` capability.
    fn needs_single_node_multi_writer(self) -> bool {
        matches!(
            self,
            Self::SingleNodeSingleWriter | Self::SingleNodeMultiWriter
        )
    }
}

/// Block device or mounted filesystem.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessType {
    Block,
    Mount {
        fs_type: String,
        mount_flags: Vec<String>,
    },
}

/// A `VolumeCapability`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    pub access_mode: AccessMode,
    pub access_type: AccessType,
}

/// Where a new volume's content comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

/// A ControllerPublishVolume that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub readonly: bool,
    pub capability: Capability,
}

/// A NodeStageVolume that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    pub staging_target_path: String,
    pub capability: Capability,
}

/// A volume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    #[serde(default)]
    pub mutable_parameters: BTreeMap<String, String>,
    pub capabilities: Vec<Capability>,
    #[serde(default)]
    pub content_source: Option<ContentSource>,
    /// What CreateVolume answered as `volume_context`.
    #[serde(default)]
    pub volume_context: BTreeMap<String, String>,
    /// Segments the volume is accessible from (empty without topology).
    #[serde(default)]
    pub accessible_topology: Vec<Segment>,
    /// Controller publications by node id.
    #[serde(default)]
    pub published: BTreeMap<String, Publication>,
    /// Where this mock's node staged it.
    #[serde(default)]
    pub staged: Option<Staging>,
    /// This mock's node publications by target path.
    #[serde(default)]
    pub node_published: BTreeMap<String, Publication>,
    /// What ListVolumes and ControllerGetVolume report of its health (healthy when `None`).
    #[serde(default)]
    pub condition: Option<Condition>,
}

/// A volume's condition as the driver reports it (CSI `VolumeCondition`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Condition {
    pub abnormal: bool,
    pub message: String,
}

impl Volume {
    /// Whether `path` is where this node staged or published the volume.
    fn is_node_path(&self, path: &str) -> bool {
        self.node_published.contains_key(path)
            || self
                .staged
                .as_ref()
                .is_some_and(|s| s.staging_target_path == path)
    }
}

/// A snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    /// Creation time since the Unix epoch.
    pub creation_seconds: i64,
    pub creation_nanos: i32,
    /// Answers about this snapshot so far (see `MockConfig::snapshot_ready_after`).
    #[serde(default)]
    pub answers: u32,
    /// The group snapshot this snapshot was cut in (empty: cut alone).
    #[serde(default)]
    pub group_snapshot_id: String,
}

/// A group snapshot: one snapshot of each of its volumes, cut together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSnapshot {
    pub id: String,
    pub name: String,
    pub source_volume_ids: Vec<String>,
    /// The member snapshots, in the order of `source_volume_ids`.
    pub snapshot_ids: Vec<String>,
    pub creation_seconds: i64,
    pub creation_nanos: i32,
    /// Answers about this group so far (see `MockConfig::snapshot_ready_after`).
    pub answers: u32,
}

/// Everything the mock stores, keyed by id (ids sort in creation order up
/// to a million objects, which keeps listing stable and readable).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    pub volumes: BTreeMap<String, Volume>,
    #[serde(default)]
    pub snapshots: BTreeMap<String, Snapshot>,
    #[serde(default)]
    pub group_snapshots: BTreeMap<String, GroupSnapshot>,
    /// Sequence number of the last id handed out.
    #[serde(default)]
    pub last_id: u64,
    /// The written blocks of each volume that has any, by volume id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub volume_blocks: BTreeMap<String, Blocks>,
    /// The blocks each snapshot holds (its volume's when it was cut), by snapshot id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_blocks: BTreeMap<String, Blocks>,
    /// Number of the last write to blocks ([`State::write_blocks`]).
    #[serde(default)]
    pub last_write: u64,
}

/// What CreateVolume asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeRequest {
    pub name: String,
    pub required_bytes: i64,
    pub limit_bytes: i64,
    pub capabilities: Vec<Capability>,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    pub content_source: Option<ContentSource>,
    pub requisite: Vec<Segment>,
    pub preferred: Vec<Segment>,
}

/// A validated `CapacityRange` (0 = unset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Range64 {
    required: i64,
    limit: i64,
}

impl Range64 {
    fn new(required: i64, limit: i64) -> Result<Self, Rejection> {
        if required < 0 || limit < 0 {
            return reject(Code::InvalidArgument, "capacity range must not be negative");
        }
        if limit != 0 && limit < required {
            return reject(
                Code::OutOfRange,
                format!("limit_bytes {limit} is below required_bytes {required}"),
            );
        }
        Ok(Self { required, limit })
    }

    fn contains(self, size: i64) -> bool {
        size >= self.required && (self.limit == 0 || size <= self.limit)
    }
}

impl State {
    fn next_id(&mut self, prefix: &str) -> String {
        self.last_id += 1;
        format!("{prefix}-{:06}", self.last_id)
    }

    fn volume(&self, id: &str) -> Result<&Volume, Rejection> {
        self.volumes
            .get(id)
            .ok_or_else(|| Rejection::new(Code::NotFound, format!("volume {id} does not exist")))
    }

    fn volume_mut(&mut self, id: &str) -> Result<&mut Volume, Rejection> {
        self.volumes
            .get_mut(id)
            .ok_or_else(|| Rejection::new(Code::NotFound, format!("volume {id} does not exist")))
    }

    /// Looks up a volume; NOT_FOUND if it does not exist.
    pub fn get_volume(&self, id: &str) -> Result<&Volume, Rejection> {
        require(id, "volume_id")?;
        self.volume(id)
    }

    /// CreateVolume: idempotent by name.
    pub fn create_volume(
        &mut self,
        config: &MockConfig,
        req: VolumeRequest,
    ) -> Result<Volume, Rejection> {
        require(&req.name, "name")?;
        if req.capabilities.is_empty() {
            return reject(Code::InvalidArgument, "volume_capabilities are required");
        }
        check_capabilities(config, &req.capabilities)?;
        if !req.mutable_parameters.is_empty() && !config.capabilities.modify {
            return reject(
                Code::InvalidArgument,
                "mutable_parameters need the MODIFY_VOLUME capability",
            );
        }
        check_mutable_parameters(&req.mutable_parameters)?;
        let range = Range64::new(req.required_bytes, req.limit_bytes)?;

        if let Some(existing) = self.volumes.values().find(|v| v.name == req.name) {
            let compatible = range.contains(existing.capacity_bytes)
                && existing.parameters == req.parameters
                && existing.mutable_parameters == req.mutable_parameters
                && existing.content_source == req.content_source;
            if !compatible {
                return reject(
                    Code::AlreadyExists,
                    format!(
                        "volume {} named {:?} exists with incompatible capacity, parameters or source",
                        existing.id, req.name
                    ),
                );
            }
            return Ok(existing.clone());
        }

        let source_size = match &req.content_source {
            None => 0,
            Some(ContentSource::Snapshot(id)) => {
                if !config.capabilities.snapshots {
                    return reject(Code::InvalidArgument, "snapshot sources are not supported");
                }
                self.snapshots
                    .get(id)
                    .ok_or_else(|| {
                        Rejection::new(Code::NotFound, format!("snapshot {id} does not exist"))
                    })?
                    .size_bytes
            }
            Some(ContentSource::Volume(id)) => {
                if !config.capabilities.clone {
                    return reject(Code::InvalidArgument, "volume cloning is not supported");
                }
                self.volume(id)?.capacity_bytes
            }
        };

        let wanted = if range.required > 0 {
            range.required
        } else if range.limit > 0 {
            config.default_volume_size.min(range.limit)
        } else {
            config.default_volume_size
        };
        let size = wanted.max(source_size);
        if !range.contains(size) {
            return reject(
                Code::OutOfRange,
                format!(
                    "the source needs {size} bytes, above limit_bytes {}",
                    range.limit
                ),
            );
        }
        if size > maximum_volume_size(config) {
            return reject(
                Code::OutOfRange,
                format!(
                    "{size} bytes exceed the maximum volume size {}",
                    maximum_volume_size(config)
                ),
            );
        }
        let available = available_capacity(self, config);
        if size > available {
            return reject(
                Code::ResourceExhausted,
                format!("{size} bytes requested, {available} available"),
            );
        }
        let accessible_topology = if config.capabilities.topology {
            pick_topology(&config.topology, &req.requisite, &req.preferred)?
        } else {
            Vec::new()
        };

        let id = format!("{}{}", config.volume_id_prefix, self.next_id("vol"));
        let volume = Volume {
            id: id.clone(),
            volume_context: config
                .volume_context
                .iter()
                .map(|(k, v)| (k.clone(), v.replace("{id}", &id)))
                .collect(),
            name: req.name,
            capacity_bytes: size,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
            capabilities: req.capabilities,
            content_source: req.content_source,
            accessible_topology,
            published: BTreeMap::new(),
            staged: None,
            node_published: BTreeMap::new(),
            condition: None,
        };
        if let Some(source) = &volume.content_source {
            self.restore_blocks(source, &volume.id);
        }
        self.volumes.insert(volume.id.clone(), volume.clone());
        Ok(volume)
    }

    /// DeleteVolume: a missing volume is already deleted; one still in use
    /// is FAILED_PRECONDITION.
    pub fn delete_volume(&mut self, id: &str) -> Result<(), Rejection> {
        require(id, "volume_id")?;
        let Some(volume) = self.volumes.get(id) else {
            return Ok(());
        };
        if let Some(node) = volume.published.keys().next() {
            return reject(
                Code::FailedPrecondition,
                format!("volume {id} is still published to node {node}"),
            );
        }
        if volume.staged.is_some() || !volume.node_published.is_empty() {
            return reject(
                Code::FailedPrecondition,
                format!("volume {id} is still staged or published on the node"),
            );
        }
        self.volumes.remove(id);
        self.volume_blocks.remove(id);
        Ok(())
    }

    /// ControllerPublishVolume; returns the publish context.
    pub fn controller_publish(
        &mut self,
        config: &MockConfig,
        volume_id: &str,
        node_id: &str,
        publication: Publication,
    ) -> Result<BTreeMap<String, String>, Rejection> {
        require(volume_id, "volume_id")?;
        require(node_id, "node_id")?;
        if publication.readonly && !config.capabilities.publish_readonly {
            return reject(
                Code::InvalidArgument,
                "readonly needs the PUBLISH_READONLY capability",
            );
        }
        check_capabilities(config, std::slice::from_ref(&publication.capability))?;
        let volume = self.volume(volume_id)?;
        if config
            .known_nodes
            .as_ref()
            .is_some_and(|nodes| !nodes.contains(node_id))
        {
            return reject(Code::NotFound, format!("node {node_id} does not exist"));
        }
        if let Some(existing) = volume.published.get(node_id) {
            if *existing != publication {
                return reject(
                    Code::AlreadyExists,
                    format!(
                        "volume {volume_id} is published to node {node_id} with another capability or readonly flag"
                    ),
                );
            }
            return Ok(publish_context(volume_id));
        }
        let single_node = publication.capability.access_mode.is_single_node()
            || volume
                .published
                .values()
                .any(|p| p.capability.access_mode.is_single_node());
        if let Some(other) = volume.published.keys().next().filter(|_| single_node) {
            return reject(
                Code::FailedPrecondition,
                format!("volume {volume_id} is already published to node {other}"),
            );
        }
        if config.max_volumes_per_node > 0 {
            let on_node = self
                .volumes
                .values()
                .filter(|v| v.published.contains_key(node_id))
                .count();
            if i64::try_from(on_node).unwrap_or(i64::MAX) >= config.max_volumes_per_node {
                return reject(
                    Code::ResourceExhausted,
                    format!(
                        "node {node_id} already has the maximum of {} volumes",
                        config.max_volumes_per_node
                    ),
                );
            }
        }
        self.volume_mut(volume_id)?
            .published
            .insert(node_id.to_owned(), publication);
        Ok(publish_context(volume_id))
    }

    /// ControllerUnpublishVolume: from `node_id`, or from every node when
    /// it is empty. A volume that is gone or not published is done already.
    pub fn controller_unpublish(
        &mut self,
        volume_id: &str,
        node_id: &str,
    ) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        if let Some(volume) = self.volumes.get_mut(volume_id) {
            if node_id.is_empty() {
                volume.published.clear();
            } else {
                volume.published.remove(node_id);
            }
        }
        Ok(())
    }

    /// Sets what the driver reports of volume `id`'s health.
    pub fn set_condition(
        &mut self,
        id: &str,
        condition: Option<Condition>,
    ) -> Result<(), Rejection> {
        self.volume_mut(id)?.condition = condition;
        Ok(())
    }

    /// One page of ListVolumes and the next token.
    pub fn list_volumes(
        &self,
        max_entries: i32,
        starting_token: &str,
    ) -> Result<(Vec<&Volume>, String), Rejection> {
        let (range, next) = page(self.volumes.len(), max_entries, starting_token)?;
        let entries = self
            .volumes
            .values()
            .skip(range.start)
            .take(range.len())
            .collect();
        Ok((entries, next))
    }

    /// ControllerExpandVolume; returns the new size. Never shrinks.
    pub fn expand_volume(
        &mut self,
        config: &MockConfig,
        volume_id: &str,
        required_bytes: i64,
        limit_bytes: i64,
    ) -> Result<i64, Rejection> {
        require(volume_id, "volume_id")?;
        if required_bytes == 0 && limit_bytes == 0 {
            return reject(Code::InvalidArgument, "capacity_range is required");
        }
        let range = Range64::new(required_bytes, limit_bytes)?;
        let target = if range.required > 0 {
            range.required
        } else {
            range.limit
        };
        let available = available_capacity(self, config);
        let current = self.volume(volume_id)?.capacity_bytes;
        if target <= current {
            return Ok(current);
        }
        if target > maximum_volume_size(config) || target - current > available {
            return reject(
                Code::OutOfRange,
                format!("cannot grow volume {volume_id} to {target} bytes"),
            );
        }
        self.volume_mut(volume_id)?.capacity_bytes = target;
        Ok(target)
    }

    /// ControllerModifyVolume: merges the mutable parameters.
    pub fn modify_volume(
        &mut self,
        volume_id: &str,
        mutable_parameters: BTreeMap<String, String>,
    ) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        if mutable_parameters.is_empty() {
            return reject(Code::InvalidArgument, "mutable_parameters are required");
        }
        check_mutable_parameters(&mutable_parameters)?;
        self.volume_mut(volume_id)?
            .mutable_parameters
            .extend(mutable_parameters);
        Ok(())
    }

    /// CreateSnapshot: idempotent by name.
    pub fn create_snapshot(
        &mut self,
        name: &str,
        source_volume_id: &str,
        now: (i64, i32),
    ) -> Result<Snapshot, Rejection> {
        require(name, "name")?;
        require(source_volume_id, "source_volume_id")?;
        if let Some(existing) = self.snapshots.values_mut().find(|s| s.name == name) {
            if existing.source_volume_id != source_volume_id {
                return reject(
                    Code::AlreadyExists,
                    format!(
                        "snapshot {name:?} exists for volume {}",
                        existing.source_volume_id
                    ),
                );
            }
            existing.answers = existing.answers.saturating_add(1);
            return Ok(existing.clone());
        }
        let size_bytes = self.volume(source_volume_id)?.capacity_bytes;
        let snapshot = Snapshot {
            id: self.next_id("snap"),
            name: name.to_owned(),
            source_volume_id: source_volume_id.to_owned(),
            size_bytes,
            creation_seconds: now.0,
            creation_nanos: now.1,
            answers: 1,
            group_snapshot_id: String::new(),
        };
        self.cut_blocks(source_volume_id, &snapshot.id);
        self.snapshots.insert(snapshot.id.clone(), snapshot.clone());
        Ok(snapshot)
    }

    /// CreateVolumeGroupSnapshot: idempotent by name; one member snapshot per volume.
    pub fn create_group_snapshot(
        &mut self,
        name: &str,
        source_volume_ids: &[String],
        now: (i64, i32),
    ) -> Result<(GroupSnapshot, Vec<Snapshot>), Rejection> {
        require(name, "name")?;
        if source_volume_ids.is_empty() {
            return reject(Code::InvalidArgument, "source_volume_ids is empty");
        }
        if let Some(existing) = self.group_snapshots.values_mut().find(|g| g.name == name) {
            let mut asked = source_volume_ids.to_vec();
            let mut held = existing.source_volume_ids.clone();
            asked.sort();
            held.sort();
            if asked != held {
                return reject(
                    Code::AlreadyExists,
                    format!("group snapshot {name:?} exists for other volumes"),
                );
            }
            existing.answers = existing.answers.saturating_add(1);
            let group = existing.clone();
            return Ok(self.answer_group(group));
        }
        let mut sizes = Vec::with_capacity(source_volume_ids.len());
        for volume in source_volume_ids {
            sizes.push(self.volume(volume)?.capacity_bytes);
        }
        let id = self.next_id("group");
        let mut snapshot_ids = Vec::with_capacity(sizes.len());
        for (volume, size_bytes) in source_volume_ids.iter().zip(sizes) {
            let snapshot = Snapshot {
                id: self.next_id("snap"),
                name: format!("{name}-{volume}"),
                source_volume_id: volume.clone(),
                size_bytes,
                creation_seconds: now.0,
                creation_nanos: now.1,
                answers: 1,
                group_snapshot_id: id.clone(),
            };
            snapshot_ids.push(snapshot.id.clone());
            self.cut_blocks(volume, &snapshot.id);
            self.snapshots.insert(snapshot.id.clone(), snapshot);
        }
        let group = GroupSnapshot {
            id,
            name: name.to_owned(),
            source_volume_ids: source_volume_ids.to_vec(),
            snapshot_ids,
            creation_seconds: now.0,
            creation_nanos: now.1,
            answers: 1,
        };
        self.group_snapshots.insert(group.id.clone(), group.clone());
        let members = self.members(&group);
        Ok((group, members))
    }

    fn members(&self, group: &GroupSnapshot) -> Vec<Snapshot> {
        group
            .snapshot_ids
            .iter()
            .filter_map(|id| self.snapshots.get(id).cloned())
            .collect()
    }

    /// The group `id` whose members are exactly `snapshot_ids`, as the group calls require.
    fn group_of(&self, id: &str, snapshot_ids: &[String]) -> Result<&GroupSnapshot, Rejection> {
        require(id, "group_snapshot_id")?;
        let group = self.group_snapshots.get(id).ok_or_else(|| {
            Rejection::new(
                Code::NotFound,
                format!("group snapshot {id} does not exist"),
            )
        })?;
        let mut asked = snapshot_ids.to_vec();
        let mut held = group.snapshot_ids.clone();
        asked.sort();
        held.sort();
        if asked != held {
            return reject(
                Code::InvalidArgument,
                format!("snapshot_ids do not match the members of group snapshot {id}"),
            );
        }
        Ok(group)
    }

    /// GetVolumeGroupSnapshot: counts an answer about the group.
    pub fn get_group_snapshot(
        &mut self,
        id: &str,
        snapshot_ids: &[String],
    ) -> Result<(GroupSnapshot, Vec<Snapshot>), Rejection> {
        self.group_of(id, snapshot_ids)?;
        let group = self.group_snapshots.get_mut(id).ok_or_else(|| {
            Rejection::new(
                Code::NotFound,
                format!("group snapshot {id} does not exist"),
            )
        })?;
        group.answers = group.answers.saturating_add(1);
        let group = group.clone();
        Ok(self.answer_group(group))
    }

    /// An answer about a group is one about each member too.
    fn answer_group(&mut self, group: GroupSnapshot) -> (GroupSnapshot, Vec<Snapshot>) {
        for id in &group.snapshot_ids {
            self.answered(id);
        }
        let members = self.members(&group);
        (group, members)
    }

    /// DeleteVolumeGroupSnapshot: the group and its members; a missing group is already deleted.
    pub fn delete_group_snapshot(
        &mut self,
        id: &str,
        snapshot_ids: &[String],
    ) -> Result<(), Rejection> {
        require(id, "group_snapshot_id")?;
        if !self.group_snapshots.contains_key(id) {
            return Ok(());
        }
        let members = self.group_of(id, snapshot_ids)?.snapshot_ids.clone();
        for member in members {
            self.snapshots.remove(&member);
            self.snapshot_blocks.remove(&member);
        }
        self.group_snapshots.remove(id);
        Ok(())
    }

    /// Counts one more answer about the snapshot `id`, if it exists.
    pub fn answered(&mut self, id: &str) {
        if let Some(snapshot) = self.snapshots.get_mut(id) {
            snapshot.answers = snapshot.answers.saturating_add(1);
        }
    }

    /// DeleteSnapshot: a missing snapshot is already deleted; a group's member goes only with
    /// its group.
    pub fn delete_snapshot(&mut self, id: &str) -> Result<(), Rejection> {
        require(id, "snapshot_id")?;
        if let Some(group) = self
            .snapshots
            .get(id)
            .map(|s| s.group_snapshot_id.clone())
            .filter(|g| !g.is_empty())
        {
            return reject(
                Code::FailedPrecondition,
                format!("snapshot {id} belongs to group snapshot {group}"),
            );
        }
        self.snapshots.remove(id);
        self.snapshot_blocks.remove(id);
        Ok(())
    }

    /// GetSnapshot.
    pub fn get_snapshot(&self, id: &str) -> Result<&Snapshot, Rejection> {
        require(id, "snapshot_id")?;
        self.snapshots
            .get(id)
            .ok_or_else(|| Rejection::new(Code::NotFound, format!("snapshot {id} does not exist")))
    }

    /// One page of ListSnapshots, filtered by snapshot and source volume
    /// id when they are set.
    pub fn list_snapshots(
        &self,
        max_entries: i32,
        starting_token: &str,
        snapshot_id: &str,
        source_volume_id: &str,
    ) -> Result<(Vec<&Snapshot>, String), Rejection> {
        let matching: Vec<&Snapshot> = self
            .snapshots
            .values()
            .filter(|s| snapshot_id.is_empty() || s.id == snapshot_id)
            .filter(|s| source_volume_id.is_empty() || s.source_volume_id == source_volume_id)
            .collect();
        let (range, next) = page(matching.len(), max_entries, starting_token)?;
        Ok((matching[range].to_vec(), next))
    }

    /// NodeStageVolume.
    pub fn node_stage(
        &mut self,
        config: &MockConfig,
        volume_id: &str,
        staging_target_path: &str,
        capability: Capability,
    ) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        require(staging_target_path, "staging_target_path")?;
        check_capabilities(config, std::slice::from_ref(&capability))?;
        let volume = self.volume_mut(volume_id)?;
        let staging = Staging {
            staging_target_path: staging_target_path.to_owned(),
            capability,
        };
        match &volume.staged {
            Some(existing) if *existing == staging => Ok(()),
            Some(existing) => reject(
                Code::AlreadyExists,
                format!(
                    "volume {volume_id} is staged at {} with another capability or path",
                    existing.staging_target_path
                ),
            ),
            None => {
                volume.staged = Some(staging);
                Ok(())
            }
        }
    }

    /// NodeUnstageVolume: a volume not staged at that path is done already.
    pub fn node_unstage(
        &mut self,
        volume_id: &str,
        staging_target_path: &str,
    ) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        require(staging_target_path, "staging_target_path")?;
        let volume = self.volume_mut(volume_id)?;
        if volume
            .staged
            .as_ref()
            .is_some_and(|s| s.staging_target_path == staging_target_path)
        {
            volume.staged = None;
        }
        Ok(())
    }

    /// NodePublishVolume. With staging on, the volume must be staged at
    /// `staging_target_path` first.
    pub fn node_publish(
        &mut self,
        config: &MockConfig,
        volume_id: &str,
        staging_target_path: &str,
        target_path: &str,
        publication: Publication,
    ) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        require(target_path, "target_path")?;
        check_capabilities(config, std::slice::from_ref(&publication.capability))?;
        let volume = self.volume_mut(volume_id)?;
        if config.capabilities.node_stage {
            if staging_target_path.is_empty() {
                return reject(Code::FailedPrecondition, "staging_target_path is not set");
            }
            if volume
                .staged
                .as_ref()
                .is_none_or(|s| s.staging_target_path != staging_target_path)
            {
                return reject(
                    Code::FailedPrecondition,
                    format!("volume {volume_id} is not staged at {staging_target_path}"),
                );
            }
        }
        match volume.node_published.get(target_path) {
            Some(existing) if *existing == publication => Ok(()),
            Some(_) => reject(
                Code::AlreadyExists,
                format!(
                    "volume {volume_id} is published at {target_path} with another capability or readonly flag"
                ),
            ),
            None => {
                volume
                    .node_published
                    .insert(target_path.to_owned(), publication);
                Ok(())
            }
        }
    }

    /// NodeUnpublishVolume: a volume not published there is done already.
    pub fn node_unpublish(&mut self, volume_id: &str, target_path: &str) -> Result<(), Rejection> {
        require(volume_id, "volume_id")?;
        require(target_path, "target_path")?;
        self.volume_mut(volume_id)?
            .node_published
            .remove(target_path);
        Ok(())
    }

    /// The volume staged or published at `path`, for NodeGetVolumeStats and
    /// NodeExpandVolume.
    pub fn node_volume(&self, volume_id: &str, path: &str) -> Result<&Volume, Rejection> {
        require(volume_id, "volume_id")?;
        require(path, "volume_path")?;
        let volume = self.volume(volume_id)?;
        if !volume.is_node_path(path) {
            return reject(
                Code::NotFound,
                format!("volume {volume_id} is not staged or published at {path}"),
            );
        }
        Ok(volume)
    }

    /// NodeExpandVolume: the filesystem grows to the volume's size, which
    /// must already cover `required_bytes`.
    pub fn node_expand(
        &self,
        volume_id: &str,
        path: &str,
        required_bytes: i64,
    ) -> Result<i64, Rejection> {
        let volume = self.node_volume(volume_id, path)?;
        if required_bytes > volume.capacity_bytes {
            return reject(
                Code::OutOfRange,
                format!(
                    "volume {volume_id} has {} bytes, {required_bytes} requested",
                    volume.capacity_bytes
                ),
            );
        }
        Ok(volume.capacity_bytes)
    }
}

#[cfg(test)]
mod tests;
