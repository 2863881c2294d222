//! `csi-mock-driver`: the scriptable mock CSI driver of the test kit as a
//! process, for sidecar end-to-end tests, benchmarks and the sandbox.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgAction, Parser};
use testkit::mockdriver::MockDriver;
use testkit::mockdriver::config::{
    Capabilities, DEFAULT_DRIVER_NAME, DEFAULT_NODE_ID, MockConfig, Segment,
};
use testkit::mockdriver::spec::{
    FailRule, LatencyRule, Listen, parse_bytes, parse_endpoint, parse_segment,
};
use tracing_subscriber::EnvFilter;

/// A mock CSI driver (Identity, Controller, Node) with in-memory or
/// file-backed volumes, capability switches and fault injection.
///
/// Methods are CSI method names (CreateVolume) or full paths
/// (/csi.v1.Controller/CreateVolume). On SIGTERM or SIGINT the socket is
/// removed and the process exits 0.
#[derive(Debug, Parser)]
#[command(name = "csi-mock-driver", version)]
struct Args {
    /// Where to listen: unix:///path/csi.sock, a socket path, or
    /// \\.\pipe\NAME on Windows.
    #[arg(long, env = "CSI_ENDPOINT", value_parser = parse_endpoint)]
    endpoint: Listen,

    /// Driver name reported by GetPluginInfo.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    name: String,

    /// Vendor version reported by GetPluginInfo.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    vendor_version: String,

    /// Node id reported by NodeGetInfo.
    #[arg(long, default_value = DEFAULT_NODE_ID)]
    node_id: String,

    /// Volumes per node, reported by NodeGetInfo and enforced by
    /// ControllerPublishVolume (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,

    /// A node id ControllerPublishVolume accepts (repeatable); without
    /// any, every node id is accepted.
    #[arg(long = "known-node", value_name = "NODE_ID")]
    known_nodes: Vec<String>,

    /// A topology segment KEY=VALUE[,KEY=VALUE...] volumes can be
    /// provisioned in (repeatable; the first is this node's). Switches
    /// topology on.
    #[arg(long, value_name = "SEGMENT", value_parser = parse_segment)]
    topology: Vec<Segment>,

    /// Size of the storage pool (bytes, or with a suffix: Ki, Mi, Gi, Ti,
    /// k, M, G, T).
    #[arg(long, value_parser = parse_bytes, default_value = "1Ti")]
    capacity: i64,

    /// Largest volume (GetCapacity.maximum_volume_size); default: the pool.
    #[arg(long, value_parser = parse_bytes)]
    max_volume_size: Option<i64>,

    /// Size of volumes whose request names no capacity.
    #[arg(long, value_parser = parse_bytes, default_value = "1Gi")]
    default_volume_size: i64,

    /// JSON file keeping volumes and snapshots across restarts, rewritten
    /// atomically on every change.
    #[arg(long, value_name = "PATH")]
    state: Option<PathBuf>,

    /// Offer the controller service at all.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().controller)]
    controller: bool,

    /// Offer ControllerPublishVolume / ControllerUnpublishVolume.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().publish_unpublish)]
    publish_unpublish: bool,

    /// Offer ListVolumes.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().list_volumes)]
    list_volumes: bool,

    /// Report published node ids in ListVolumes.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().list_volumes_published_nodes)]
    list_volumes_published_nodes: bool,

    /// Offer GetCapacity.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().get_capacity)]
    get_capacity: bool,

    /// Offer volume cloning.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().clone)]
    clone: bool,

    /// Offer snapshots.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().snapshots)]
    snapshots: bool,

    /// Offer group snapshots (the GroupController service).
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().group_snapshots)]
    group_snapshots: bool,

    /// Offer controller and node volume expansion.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().expand)]
    expand: bool,

    /// Offer ControllerModifyVolume and mutable parameters.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().modify)]
    modify: bool,

    /// Offer ControllerGetVolume.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().get_volume)]
    get_volume: bool,

    /// Offer readonly ControllerPublishVolume.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().publish_readonly)]
    publish_readonly: bool,

    /// Offer the SINGLE_NODE_SINGLE_WRITER and SINGLE_NODE_MULTI_WRITER
    /// access modes.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().single_node_multi_writer)]
    single_node_multi_writer: bool,

    /// Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS (on whenever --topology
    /// is given).
    #[arg(long = "accessibility-constraints", action = ArgAction::Set, default_value_t = Capabilities::default().topology)]
    accessibility_constraints: bool,

    /// Offer NodeStageVolume / NodeUnstageVolume.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().node_stage)]
    node_stage: bool,

    /// VOLUME_CONDITION: ListVolumes and ControllerGetVolume report each volume's health
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().volume_condition)]
    volume_condition: bool,

    /// Offer the SnapshotMetadata service (plugin SNAPSHOT_METADATA_SERVICE); volumes have no
    /// written blocks in a process, so snapshots list none.
    #[arg(long, action = ArgAction::Set, default_value_t = Capabilities::default().snapshot_metadata)]
    snapshot_metadata: bool,

    /// Delay calls of METHOD by DURATION (e.g. CreateVolume=250ms; METHOD
    /// `*` for every method). Repeatable.
    #[arg(long, value_name = "METHOD=DURATION", value_parser = LatencyRule::parse)]
    latency: Vec<LatencyRule>,

    /// Fail calls of METHOD with status CODE (name or number): the first N
    /// calls, or every call without N (e.g. CreateVolume=UNAVAILABLE:3,
    /// Probe=FAILED_PRECONDITION). Repeatable.
    #[arg(long, value_name = "METHOD=CODE[:N]", value_parser = FailRule::parse)]
    fail: Vec<FailRule>,

    /// Answer Probe with ready=false.
    #[arg(long)]
    not_ready: bool,

    /// Put PREFIX before every volume id (ids shaped as a real driver's, e.g.
    /// projects/p/zones/z/disks/).
    #[arg(long, value_name = "PREFIX", default_value = "")]
    volume_id_prefix: String,

    /// Snapshots say they are not ready for their first N answers (CreateSnapshot of their
    /// name, ListSnapshots of their id), as a driver that uploads them.
    #[arg(long, value_name = "N", default_value_t = 0)]
    snapshot_ready_after: u32,

    /// More logging: -v logs every call (secrets stripped), -vv everything.
    /// RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count)]
    verbose: u8,
}

impl Args {
    fn config(&self) -> MockConfig {
        MockConfig {
            driver_name: self.name.clone(),
            vendor_version: self.vendor_version.clone(),
            node_id: self.node_id.clone(),
            max_volumes_per_node: self.max_volumes_per_node,
            known_nodes: (!self.known_nodes.is_empty())
                .then(|| self.known_nodes.iter().cloned().collect()),
            topology: self.topology.clone(),
            capabilities: Capabilities {
                controller: self.controller,
                publish_unpublish: self.publish_unpublish,
                list_volumes: self.list_volumes,
                list_volumes_published_nodes: self.list_volumes_published_nodes,
                get_capacity: self.get_capacity,
                clone: self.clone,
                snapshots: self.snapshots,
                group_snapshots: self.group_snapshots,
                expand: self.expand,
                modify: self.modify,
                get_volume: self.get_volume,
                publish_readonly: self.publish_readonly,
                single_node_multi_writer: self.single_node_multi_writer,
                topology: self.accessibility_constraints || !self.topology.is_empty(),
                node_stage: self.node_stage,
                volume_condition: self.volume_condition,
                snapshot_metadata: self.snapshot_metadata,
            },
            total_capacity: self.capacity,
            max_volume_size: self.max_volume_size,
            default_volume_size: self.default_volume_size,
            state_file: self.state.clone(),
            // Nobody reads the log of a process; -v logs calls instead.
            call_log_limit: 0,
            volume_id_prefix: self.volume_id_prefix.clone(),
            snapshot_ready_after: self.snapshot_ready_after,
            volume_context: Default::default(),
        }
    }
}

/// Registers for SIGTERM and SIGINT now; the future ends on either.
#[cfg(unix)]
fn on_termination() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// Registers for Ctrl-C now; the future ends on it.
#[cfg(windows)]
fn on_termination() -> std::io::Result<impl Future<Output = ()>> {
    let mut ctrl_c = tokio::signal::windows::ctrl_c()?;
    Ok(async move {
        ctrl_c.recv().await;
    })
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let driver = MockDriver::with_config(args.config());
    for rule in &args.latency {
        rule.apply(driver.faults());
    }
    for rule in &args.fail {
        rule.apply(driver.faults());
    }
    driver.faults().set_ready(!args.not_ready);
    // Registered before serving, so a signal sent as soon as the socket
    // appears is not missed.
    let stop = on_termination()?;
    let mock = driver.serve(&args.endpoint).await?;
    tracing::info!(
        endpoint = %mock.endpoint(),
        driver = %args.name,
        node = %args.node_id,
        "serving"
    );
    stop.await;
    tracing::info!("signal received, shutting down");
    mock.shutdown().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let level = match args.verbose {
        0 => "info",
        1 => "info,testkit=debug",
        _ => "debug,testkit=trace",
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level)),
        )
        .init();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            ExitCode::FAILURE
        }
    }
}
