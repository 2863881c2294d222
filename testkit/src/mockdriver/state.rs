//! The mock's storage model as plain data, and the CSI semantics over it as
//! plain functions: no I/O, no gRPC types. Every function either changes
//! the state and returns what the RPC answers, or leaves it untouched and
//! returns a [`Rejection`] carrying the gRPC code the CSI spec asks for.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use tonic::Code;

use super::config::{MockConfig, Segment};

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

/// Bytes not taken by any volume.
pub fn available_capacity(state: &State, config: &MockConfig) -> i64 {
    let used: i64 = state.volumes.values().map(|v| v.capacity_bytes).sum();
    (config.total_capacity - used).max(0)
}

/// What GetCapacity reports for `segment`: the free bytes of the pool, or 0
/// for a segment the driver does not serve.
pub fn capacity_for(state: &State, config: &MockConfig, segment: Option<&Segment>) -> i64 {
    let foreign = config.capabilities.topology
        && !config.topology.is_empty()
        && segment.is_some_and(|s| !s.is_empty() && !config.topology.contains(s));
    if foreign {
        0
    } else {
        available_capacity(state, config)
    }
}

/// Largest volume the driver would create now.
pub fn maximum_volume_size(config: &MockConfig) -> i64 {
    config
        .max_volume_size
        .unwrap_or(config.total_capacity)
        .min(config.total_capacity)
}

/// Refuses access modes the driver does not offer.
pub fn check_capabilities(config: &MockConfig, caps: &[Capability]) -> Result<(), Rejection> {
    if let Some(cap) = caps.iter().find(|c| {
        c.access_mode.needs_single_node_multi_writer()
            && !config.capabilities.single_node_multi_writer
    }) {
        return reject(
            Code::InvalidArgument,
            format!(
                "access mode {:?} needs the SINGLE_NODE_MULTI_WRITER capability",
                cap.access_mode
            ),
        );
    }
    Ok(())
}

/// Chooses where a new volume is accessible from: the first preferred, then
/// the first requisite segment the driver serves; without requirements the
/// driver's first segment.
pub fn pick_topology(
    available: &[Segment],
    requisite: &[Segment],
    preferred: &[Segment],
) -> Result<Vec<Segment>, Rejection> {
    let served = |s: &&Segment| available.is_empty() || available.contains(s);
    if let Some(segment) = preferred.iter().chain(requisite).find(served) {
        return Ok(vec![segment.clone()]);
    }
    if !requisite.is_empty() {
        return reject(
            Code::ResourceExhausted,
            "none of the requisite topology segments is served by this driver",
        );
    }
    Ok(available.first().cloned().into_iter().collect())
}

/// The page `[start, end)` of `total` items that `starting_token` and
/// `max_entries` select, and the token of the next page ("" at the end).
/// Tokens are offsets; one that is not an offset within the list is
/// ABORTED, as the spec asks for an invalid `starting_token`.
pub fn page(
    total: usize,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Range<usize>, String), Rejection> {
    let Ok(max_entries) = usize::try_from(max_entries) else {
        return reject(Code::InvalidArgument, "max_entries must not be negative");
    };
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(start) if start <= total => start,
            _ => {
                return reject(
                    Code::Aborted,
                    format!("invalid starting_token {starting_token:?}"),
                );
            }
        }
    };
    let end = if max_entries == 0 {
        total
    } else {
        total.min(start.saturating_add(max_entries))
    };
    let next = if end < total {
        end.to_string()
    } else {
        String::new()
    };
    Ok((start..end, next))
}

/// The mutable parameters (VolumeAttributesClass keys) the mock supports, in
/// CreateVolume and ControllerModifyVolume; any value is accepted. The spec
/// asks for INVALID_ARGUMENT on any other key.
pub const MUTABLE_PARAMETERS: [&str; 2] = ["iops", "throughput"];

/// Refuses mutable parameters the mock does not support.
pub fn check_mutable_parameters(parameters: &BTreeMap<String, String>) -> Result<(), Rejection> {
    let unsupported: Vec<&str> = parameters
        .keys()
        .map(String::as_str)
        .filter(|key| !MUTABLE_PARAMETERS.contains(key))
        .collect();
    if !unsupported.is_empty() {
        return reject(
            Code::InvalidArgument,
            format!(
                "unsupported mutable parameters {unsupported:?}; supported: {MUTABLE_PARAMETERS:?}"
            ),
        );
    }
    Ok(())
}

/// `ControllerPublishVolume.publish_context` of a volume.
pub fn publish_context(volume_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("devicePath".to_owned(), format!("/dev/mock/{volume_id}"))])
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
        };
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
mod tests {
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
}
