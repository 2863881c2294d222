//! The provisioner as a plug-in of the sidecar runtime, which starts it as upstream does: what
//! it asks of the driver (its capabilities, its node with `--node-deployment`) and the API
//! server, and how it configures its controller and capacity tracking.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use csi_proto::v1::controller_service_capability::rpc::Type as Rpc;
use csi_proto::v1::plugin_capability::service::Type as Service;
use sidecar_kit::cluster::client::KubeconfigRule;
use sidecar_kit::driver::csi::{CallOptions, CsiClient};
use sidecar_kit::driver::identity::{self, IdentityError};
use sidecar_kit::pipeline::Wiring;
use sidecar_kit::pipeline::workqueue::Backoff;
use sidecar_kit::process::flags::FlagSyntax;
use sidecar_kit::process::http::{Reply, Routes};
use sidecar_kit::runtime::host::Controller;
use sidecar_kit::runtime::{PrepareError, RouteHook, Setup, Sidecar};

use crate::controller::{self, COMPONENT, Config};
use crate::decide::{Capabilities, NodePolicy, Policy};
use crate::flags::Cli;
use crate::metrics::ProvisionMetrics;
use crate::model;

/// Upstream's pprof handlers, answered 404 with `--enable-pprof`.
const PPROF_PATHS: [&str; 5] = [
    "/debug/pprof/",
    "/debug/pprof/cmdline",
    "/debug/pprof/profile",
    "/debug/pprof/symbol",
    "/debug/pprof/trace",
];
/// Period of the full resync of claims and volumes (upstream's library resyncs every 15 min).
pub const RESYNC: Duration = Duration::from_secs(15 * 60);

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("The NODE_NAME environment variable must be set when using --node-deployment.")]
    NoNodeName,
    #[error("Failed to get node info from CSI driver: {0}")]
    NodeInfo(tonic::Status),
}

/// Distributed provisioning (`--node-deployment`): this node's name from `NODE_NAME` and its
/// topology from the driver's `NodeGetInfo`; instead of watching Nodes and CSINodes, the
/// controller knows this node alone.
pub async fn node_deployment(
    cli: &Cli,
    csi: &CsiClient,
    node_name: Option<String>,
    config: &mut Config,
) -> Result<(), AppError> {
    let name = node_name
        .filter(|n| !n.is_empty())
        .ok_or(AppError::NoNodeName)?;
    let info = csi
        .node_get_info(CallOptions::timeout(cli.timeout))
        .await
        .map_err(AppError::NodeInfo)?;
    let topology = info
        .accessible_topology
        .map(|t| t.segments.into_iter().collect::<BTreeMap<_, _>>());
    tracing::info!(node = %name, node_id = %info.node_id, ?topology, "provisioning for this node only");
    config.policy.identity = format!("{}-{name}", config.policy.identity);
    config.watch_topology = false;
    config.policy.node = Some(NodePolicy {
        name,
        topology,
        immediate_binding: cli.node_deployment_immediate_binding,
    });
    Ok(())
}

/// Asks the driver for its capabilities, each call bounded by `timeout`.
pub async fn capabilities(
    csi: &CsiClient,
    timeout: Duration,
) -> Result<Capabilities, IdentityError> {
    let plugin = identity::plugin_capabilities(csi, timeout).await?;
    let mut caps = Capabilities {
        controller_service: plugin.contains(&Service::ControllerService),
        accessibility_constraints: plugin.contains(&Service::VolumeAccessibilityConstraints),
        ..Capabilities::default()
    };
    if caps.controller_service {
        let rpcs = identity::controller_capabilities(csi, timeout).await?;
        caps.create_delete_volume = rpcs.contains(&Rpc::CreateDeleteVolume);
        caps.create_delete_snapshot = rpcs.contains(&Rpc::CreateDeleteSnapshot);
        caps.clone_volume = rpcs.contains(&Rpc::CloneVolume);
        caps.modify_volume = rpcs.contains(&Rpc::ModifyVolume);
        caps.publish_unpublish = rpcs.contains(&Rpc::PublishUnpublishVolume);
        caps.single_node_multi_writer = rpcs.contains(&Rpc::SingleNodeMultiWriter);
    }
    Ok(caps)
}

/// The provisioner identity: `<unix ms>-<0..9999>-<driver>`, as upstream builds it.
pub fn identity_string(driver: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let random = (controller::random_unit() * 10_000.0) as u32 % 10_000;
    format!("{}-{random}-{driver}", now.as_millis())
}

/// The controller configuration for `driver` with `caps`, from the flags.
pub fn config(cli: &Cli, driver: &str, caps: Capabilities, identity: &str) -> Config {
    let topology = caps.accessibility_constraints && cli.feature_gates.topology;
    Config {
        policy: Policy {
            driver: driver.to_string(),
            identity: identity.to_string(),
            caps,
            topology,
            strict_topology: cli.strict_topology,
            immediate_topology: cli.immediate_topology,
            volume_name_prefix: cli.volume_name_prefix.clone(),
            volume_name_uuid_length: cli.volume_name_uuid_length,
            default_fstype: cli.default_fstype.clone(),
            extra_create_metadata: cli.extra_create_metadata,
            controller_publish_readonly: cli.controller_publish_readonly,
            prevent_volume_mode_conversion: cli.prevent_volume_mode_conversion,
            cross_namespace_sources: cli.feature_gates.cross_namespace_volume_data_source,
            attributes_classes: cli.feature_gates.volume_attributes_class.unwrap_or(true),
            // Set by `node_deployment` from the driver's answer.
            node: None,
        },
        timeout: cli.timeout,
        backoff: Backoff {
            start: cli.retry_interval_start,
            max: cli.retry_interval_max,
        },
        workers: cli.worker_threads,
        resync: RESYNC,
        watch_topology: topology,
        watch_attachments: caps.publish_unpublish,
        // Both depend on what the cluster serves: see `discover`.
        watch_snapshots: false,
        watch_grants: false,
        source_workers: cli.cloning_protection_threads,
        orphan_sweep: cli.snapshot_orphan_sweep_interval,
        owner_delay: (
            cli.node_deployment_base_delay,
            cli.node_deployment_max_delay,
        ),
        capacity: None,
        metrics: None,
        journal: None,
        event_client: None,
        journal_client: None,
        snapshot_client: None,
        wiring: Wiring::reporting(COMPONENT),
    }
}

/// Whether the cluster serves `kind` in `group_version` (`Err`: discovery failed).
async fn served(
    client: &kube::Client,
    group_version: &str,
    kind: &str,
) -> Result<bool, kube::Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.kind == kind)),
        Err(err) if sidecar_kit::cluster::client::api_code(&err) == Some(404) => Ok(false),
        Err(err) => Err(err),
    }
}

/// Adjusts the configuration to the APIs the cluster serves: the VolumeAttributesClass gate
/// turns itself off without the v1 API (unless set explicitly, as upstream), VolumeSnapshots
/// are watched when the driver restores snapshots and the API is served and listable, and
/// ReferenceGrants when cross-namespace sources are on.
pub async fn discover(cli: &Cli, client: &kube::Client, config: &mut Config) {
    if cli.feature_gates.volume_attributes_class.is_none() {
        match served(client, "storage.k8s.io/v1", "VolumeAttributesClass").await {
            Ok(false) => {
                tracing::info!(
                    "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass v1 API is not available"
                );
                config.policy.attributes_classes = false;
            }
            Ok(true) => {}
            Err(err) => {
                tracing::warn!(error = %err, "cannot discover the VolumeAttributesClass API; the gate stays on")
            }
        }
    }
    if config.policy.caps.create_delete_snapshot {
        let group_version = format!("{}/v1", model::SNAPSHOT_GROUP);
        config.watch_snapshots = match served(client, &group_version, "VolumeSnapshot").await {
            Ok(true) => {
                let snapshots = config.snapshot_client.as_ref().unwrap_or(client);
                let api: kube::Api<crate::sources::VolumeSnapshot> =
                    kube::Api::all(snapshots.clone());
                match api.list(&kube::api::ListParams::default().limit(1)).await {
                    Ok(_) => true,
                    Err(err) => {
                        tracing::info!(error = %sidecar_kit::cluster::client::api_message(&err), "cannot list VolumeSnapshots: restores read them one by one and orphaned finalizers are not swept");
                        false
                    }
                }
            }
            Ok(false) => {
                tracing::info!(
                    "the cluster serves no VolumeSnapshot API: restores from snapshots fail until it does"
                );
                false
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot discover the VolumeSnapshot API: restores read snapshots one by one");
                false
            }
        };
    }
    if config.policy.cross_namespace_sources {
        let group_version = format!("{}/v1beta1", crate::sources::GATEWAY_GROUP);
        config.watch_grants = match served(client, &group_version, "ReferenceGrant").await {
            Ok(true) => true,
            Ok(false) => {
                tracing::warn!(
                    "CrossNamespaceVolumeDataSource is on but the cluster serves no ReferenceGrant API: claims with a data source in another namespace are refused"
                );
                false
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot discover the ReferenceGrant API: claims with a data source in another namespace are refused");
                false
            }
        };
    }
}

/// The provisioner, a plug-in of the sidecar runtime.
pub struct Provisioner;

impl Sidecar for Provisioner {
    const NAME: &'static str = "provisioner";
    const BINARY: &'static str = "csi-provisioner";
    const SYNTAX: FlagSyntax = FlagSyntax::Gnu;
    const KUBECONFIG: KubeconfigRule = KubeconfigRule::EnvironmentFirst;
    type Cli = Cli;

    fn routes(cli: &Cli) -> RouteHook {
        pprof_routes(cli)
    }

    /// The driver's capabilities, the controller's configuration, clients, journal and Lease,
    /// with capacity tracking when asked.
    async fn prepare(cli: &Cli, setup: &Setup<'_>) -> Result<Controller, PrepareError> {
        let host = setup.host;
        let clients = setup.clients()?;
        let client = clients.main.clone();
        let csi = host.csi.clone();
        let driver = host.driver.clone();
        let caps = capabilities(&csi, cli.timeout).await?;
        let identity_string = identity_string(&driver);
        tracing::info!(identity = %identity_string, ?caps, "provisioner identity");
        let mut config = config(cli, &driver, caps, &identity_string);
        setup.share(&mut config.wiring);
        config.metrics = Some(ProvisionMetrics::register(host.metrics.registry())?);
        config.event_client = Some(clients.background);
        config.journal_client = Some(setup.journal_client()?);
        config.snapshot_client = Some(setup.client()?);
        if cli.node_deployment {
            node_deployment(cli, &csi, std::env::var("NODE_NAME").ok(), &mut config)
                .await
                .map_err(PrepareError::own)?;
        }
        discover(cli, &client, &mut config).await;
        config.journal = Some(setup.journal_location(
            &model::lease_name(&driver),
            config.policy.node.as_ref().map(|node| node.name.as_str()),
        ));

        // --enable-capacity: CSIStorageCapacity objects, through a client of their own limited by
        // --kube-api-capacity-qps/-burst (leader election keeps its own client and limits); run
        // beside the claims controller while leading. See capacity.rs.
        let capacity = if cli.enable_capacity {
            use crate::capacity::controller as cap;
            let cap_client =
                setup.client_limited(cli.kube_api_capacity_qps, cli.kube_api_capacity_burst)?;
            let mut settings = cap::Settings::from_cli(cli, &driver);
            settings.wiring = config.wiring.clone();
            if let Some(node) = &config.policy.node {
                settings = settings.for_node(&node.name, node.topology.as_ref());
            }
            let capacity = cap::prepare(
                settings,
                cap::Environment::from_env(),
                client.clone(),
                cap_client,
                csi.clone(),
                host.metrics.registry(),
            )
            .await
            .map_err(PrepareError::own)?;
            config.capacity = Some(capacity.handle());
            Some(capacity)
        } else {
            None
        };

        Ok(setup.controller(&model::lock_name(&driver), move |token| {
            crate::capacity::controller::beside(
                capacity,
                token.clone(),
                controller::run(config, client, csi, token),
            )
        })?)
    }
}

/// `--enable-pprof`: the Go profiler's paths answer 404 with a clear text.
pub fn pprof_routes(cli: &Cli) -> RouteHook {
    let pprof = cli.enable_pprof;
    if pprof {
        tracing::warn!(
            "--enable-pprof: /debug/pprof is a Go runtime facility; it answers 404 here"
        );
    }
    Box::new(move |mut routes: Routes| {
        if pprof {
            for path in PPROF_PATHS {
                routes = routes.route(path, || async {
                    Reply::text(
                        http::StatusCode::NOT_FOUND,
                        "pprof is a Go facility; this provisioner is not written in Go\n",
                    )
                });
            }
        }
        routes
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sidecar_kit::process::flags::{FlagSyntax, parse_from};

    fn cli(args: &[&str]) -> Cli {
        parse_from(
            std::iter::once("csi-provisioner").chain(args.iter().copied()),
            FlagSyntax::Gnu,
        )
        .unwrap()
    }

    #[test]
    fn identity_has_upstreams_shape() {
        let id = identity_string("hostpath.csi.k8s.io");
        let parts: Vec<&str> = id.splitn(3, '-').collect();
        assert!(parts[0].parse::<u64>().unwrap() > 1_600_000_000_000);
        assert!(parts[1].parse::<u32>().unwrap() < 10_000);
        assert_eq!(parts[2], "hostpath.csi.k8s.io");
    }

    #[test]
    fn config_from_flags_and_capabilities() {
        let caps = Capabilities {
            controller_service: true,
            accessibility_constraints: true,
            create_delete_volume: true,
            publish_unpublish: true,
            ..Capabilities::default()
        };
        let c = config(
            &cli(&["--strict-topology", "--worker-threads=7"]),
            "d",
            caps,
            "id",
        );
        assert!(c.policy.topology && c.watch_topology && c.watch_attachments);
        assert!(c.policy.strict_topology);
        assert_eq!(c.workers, 7);
        assert_eq!(c.timeout, Duration::from_secs(10));
        let no_gate = config(&cli(&["--feature-gates=Topology=false"]), "d", caps, "id");
        assert!(!no_gate.policy.topology && !no_gate.watch_topology);
        let plain = config(&cli(&[]), "d", Capabilities::default(), "id");
        assert!(!plain.watch_topology && !plain.watch_attachments);
    }
}
