//! What the mock driver is: its identity, capability switches, limits and
//! where its state lives. Fixed for the lifetime of one served instance.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// A topology segment: label key → value, e.g.
/// `topology.example.com/zone=z1`.
pub type Segment = BTreeMap<String, String>;

/// Default `GetPluginInfo.name`.
pub const DEFAULT_DRIVER_NAME: &str = "mock.csi.example.com";
/// Default `NodeGetInfo.node_id`.
pub const DEFAULT_NODE_ID: &str = "mock-node";
/// Default size of the storage pool (1 TiB).
pub const DEFAULT_TOTAL_CAPACITY: i64 = 1 << 40;
/// Size of a volume whose request names no capacity (1 GiB).
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;
/// How many received calls the call log keeps by default.
pub const DEFAULT_CALL_LOG_LIMIT: usize = 10_000;

/// The mock driver's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MockConfig {
    /// `GetPluginInfo.name`.
    pub driver_name: String,
    /// `GetPluginInfo.vendor_version`.
    pub vendor_version: String,
    /// `NodeGetInfo.node_id`.
    pub node_id: String,
    /// `NodeGetInfo.max_volumes_per_node`, also enforced by
    /// ControllerPublishVolume for every node (0 = unlimited).
    pub max_volumes_per_node: i64,
    /// Node ids ControllerPublishVolume accepts; `None` accepts any.
    pub known_nodes: Option<BTreeSet<String>>,
    /// Segments volumes can be provisioned in, when the topology switch is
    /// on. The first one is this node's (`NodeGetInfo.accessible_topology`).
    /// Empty: any segment a request asks for is accepted.
    pub topology: Vec<Segment>,
    /// Which optional services and RPCs are offered.
    pub capabilities: Capabilities,
    /// Size of the storage pool all volumes are carved from.
    pub total_capacity: i64,
    /// Largest volume (`GetCapacity.maximum_volume_size`); `None`: the pool.
    pub max_volume_size: Option<i64>,
    /// Size of a volume whose request sets neither required nor limit bytes.
    pub default_volume_size: i64,
    /// JSON file that holds the volumes and snapshots across restarts;
    /// `None` keeps them in memory only.
    pub state_file: Option<PathBuf>,
    /// How many of the most recent calls the call log keeps (counters are
    /// always kept); 0 records none, which spares rendering requests.
    pub call_log_limit: usize,
    /// Put before every volume id, for drivers whose ids have a shape of their own (e.g.
    /// `projects/p/zones/z/disks/` for a GCE PD stand-in).
    pub volume_id_prefix: String,
    /// How many answers about a snapshot (CreateSnapshot of its name, ListSnapshots of its id)
    /// say it is not ready yet before it is: a driver that uploads its snapshots.
    pub snapshot_ready_after: u32,
    /// The `volume_context` of every created volume; `{id}` in a value stands for the
    /// volume's id (e.g. vSphere's `initialvolumefilepath`).
    pub volume_context: BTreeMap<String, String>,
}

impl Default for MockConfig {
    fn default() -> Self {
        Self {
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            node_id: DEFAULT_NODE_ID.to_owned(),
            max_volumes_per_node: 0,
            known_nodes: None,
            topology: Vec::new(),
            capabilities: Capabilities::default(),
            total_capacity: DEFAULT_TOTAL_CAPACITY,
            max_volume_size: None,
            default_volume_size: DEFAULT_VOLUME_SIZE,
            state_file: None,
            call_log_limit: DEFAULT_CALL_LOG_LIMIT,
            volume_id_prefix: String::new(),
            snapshot_ready_after: 0,
            volume_context: BTreeMap::new(),
        }
    }
}

impl MockConfig {
    /// The segment this node is in, reported by NodeGetInfo.
    pub fn node_segment(&self) -> Option<&Segment> {
        self.capabilities
            .topology
            .then(|| self.topology.first())
            .flatten()
    }
}

/// Capability switches. An RPC whose switch is off answers UNIMPLEMENTED,
/// and the matching capability is not advertised.
///
/// The default is a full-featured driver without topology and without the
/// SINGLE_NODE_*_WRITER access modes (which change how sidecars map
/// Kubernetes access modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Controller service (plugin `CONTROLLER_SERVICE`, `CREATE_DELETE_VOLUME`).
    /// Off: every Controller RPC is UNIMPLEMENTED.
    pub controller: bool,
    /// `PUBLISH_UNPUBLISH_VOLUME`.
    pub publish_unpublish: bool,
    /// `LIST_VOLUMES`.
    pub list_volumes: bool,
    /// `LIST_VOLUMES_PUBLISHED_NODES` (ListVolumes fills `published_node_ids`).
    pub list_volumes_published_nodes: bool,
    /// `GET_CAPACITY`.
    pub get_capacity: bool,
    /// `CLONE_VOLUME`.
    pub clone: bool,
    /// `CREATE_DELETE_SNAPSHOT`, `LIST_SNAPSHOTS`, `GET_SNAPSHOT`.
    pub snapshots: bool,
    /// Plugin `GROUP_CONTROLLER_SERVICE` with `CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT`.
    pub group_snapshots: bool,
    /// Controller and node `EXPAND_VOLUME`, plugin `VolumeExpansion.ONLINE`.
    pub expand: bool,
    /// `MODIFY_VOLUME` (and `mutable_parameters` in CreateVolume).
    pub modify: bool,
    /// `GET_VOLUME` (ControllerGetVolume).
    pub get_volume: bool,
    /// `PUBLISH_READONLY`.
    pub publish_readonly: bool,
    /// Controller and node `SINGLE_NODE_MULTI_WRITER`: the access modes
    /// SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER.
    pub single_node_multi_writer: bool,
    /// Plugin `VOLUME_ACCESSIBILITY_CONSTRAINTS`.
    pub topology: bool,
    /// Node `STAGE_UNSTAGE_VOLUME`.
    pub node_stage: bool,
    /// Controller `VOLUME_CONDITION`: ListVolumes and ControllerGetVolume report each volume's
    /// condition (see `Volume::condition`).
    pub volume_condition: bool,
    /// Plugin `SNAPSHOT_METADATA_SERVICE`: the SnapshotMetadata service lists the allocated and
    /// changed blocks of snapshots (see [`state::Blocks`](super::state::Blocks)). Off by default,
    /// as hostpath's `--enable-snapshot-metadata`.
    pub snapshot_metadata: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            controller: true,
            publish_unpublish: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            get_capacity: true,
            clone: true,
            snapshots: true,
            group_snapshots: true,
            expand: true,
            modify: true,
            get_volume: true,
            publish_readonly: true,
            single_node_multi_writer: false,
            topology: false,
            node_stage: true,
            volume_condition: false,
            snapshot_metadata: false,
        }
    }
}

impl Capabilities {
    /// Every switch on.
    pub const fn all() -> Self {
        Self {
            controller: true,
            publish_unpublish: true,
            list_volumes: true,
            list_volumes_published_nodes: true,
            get_capacity: true,
            clone: true,
            snapshots: true,
            group_snapshots: true,
            expand: true,
            modify: true,
            get_volume: true,
            publish_readonly: true,
            single_node_multi_writer: true,
            topology: true,
            node_stage: true,
            volume_condition: true,
            snapshot_metadata: true,
        }
    }

    /// Every switch off: Identity and a Node service without staging.
    pub const fn none() -> Self {
        Self {
            controller: false,
            publish_unpublish: false,
            list_volumes: false,
            list_volumes_published_nodes: false,
            get_capacity: false,
            clone: false,
            snapshots: false,
            group_snapshots: false,
            expand: false,
            modify: false,
            get_volume: false,
            publish_readonly: false,
            single_node_multi_writer: false,
            topology: false,
            node_stage: false,
            volume_condition: false,
            snapshot_metadata: false,
        }
    }
}
