//! The generated clients and servers talking over real unix sockets.
#![cfg(unix)]

use crate::common::{UnixServer, connect};
use csi_proto::methods;
use csi_proto::pluginregistration::registration_client::RegistrationClient;
use csi_proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use csi_proto::pluginregistration::{
    CSI_PLUGIN, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use csi_proto::v1::controller_client::ControllerClient;
use csi_proto::v1::controller_server::{Controller, ControllerServer};
use csi_proto::v1::group_controller_client::GroupControllerClient;
use csi_proto::v1::group_controller_server::{GroupController, GroupControllerServer};
use csi_proto::v1::identity_client::IdentityClient;
use csi_proto::v1::identity_server::{Identity, IdentityServer};
use csi_proto::v1::node_client::NodeClient;
use csi_proto::v1::node_server::{Node, NodeServer};
use csi_proto::v1::snapshot_metadata_client::SnapshotMetadataClient;
use csi_proto::v1::snapshot_metadata_server::{SnapshotMetadata, SnapshotMetadataServer};
use csi_proto::v1::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::codegen::http;
use tonic::{Code, Request, Response, Status};

struct TestIdentity;

#[tonic::async_trait]
impl Identity for TestIdentity {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: "hostpath.csi.k8s.io".into(),
            vendor_version: "v1.2.3".into(),
            manifest: HashMap::from([("commit".into(), "abc".into())]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = plugin_capability::Service {
            r#type: plugin_capability::service::Type::ControllerService.into(),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![PluginCapability {
                r#type: Some(plugin_capability::Type::Service(service)),
            }],
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse { ready: Some(false) }))
    }
}

#[tokio::test]
async fn identity_round_trip_over_unix_socket() {
    let server = UnixServer::start(|incoming, shutdown| {
        tonic::transport::Server::builder()
            .add_service(IdentityServer::new(TestIdentity))
            .serve_with_incoming_shutdown(incoming, shutdown)
    });
    let mut client = IdentityClient::new(connect(server.path.clone()).await);

    let info = client
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "hostpath.csi.k8s.io");
    assert_eq!(info.vendor_version, "v1.2.3");
    assert_eq!(info.manifest.get("commit").map(String::as_str), Some("abc"));

    let probe = client.probe(ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(false));

    let caps = client
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), 1);
    match &caps.capabilities[0].r#type {
        Some(plugin_capability::Type::Service(service)) => assert_eq!(
            service.r#type(),
            plugin_capability::service::Type::ControllerService
        ),
        other => panic!("unexpected capability {other:?}"),
    }

    server.stop().await;
}

struct TestRegistration {
    statuses: mpsc::UnboundedSender<RegistrationStatus>,
}

#[tonic::async_trait]
impl Registration for TestRegistration {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: CSI_PLUGIN.into(),
            name: "hostpath.csi.k8s.io".into(),
            endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock".into(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        self.statuses
            .send(request.into_inner())
            .map_err(|_| Status::internal("test receiver gone"))?;
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[tokio::test]
async fn registration_round_trip_over_unix_socket() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let server = UnixServer::start(|incoming, shutdown| {
        tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(TestRegistration { statuses: tx }))
            .serve_with_incoming_shutdown(incoming, shutdown)
    });
    // Plays kubelet's part.
    let mut kubelet = RegistrationClient::new(connect(server.path.clone()).await);

    let info = kubelet.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "hostpath.csi.k8s.io");
    assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/hostpath/csi.sock");
    assert_eq!(info.supported_versions, ["1.0.0"]);

    kubelet
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "no handler registered for plugin type".into(),
        })
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.plugin_registered);
    assert_eq!(status.error, "no handler registered for plugin type");

    server.stop().await;
}

/// Serves every service with the generated UNIMPLEMENTED defaults.
struct Unimplemented;

#[tonic::async_trait]
impl Identity for Unimplemented {}
#[tonic::async_trait]
impl Controller for Unimplemented {}
#[tonic::async_trait]
impl GroupController for Unimplemented {}
#[tonic::async_trait]
impl Node for Unimplemented {}
#[tonic::async_trait]
impl Registration for Unimplemented {}
#[tonic::async_trait]
impl SnapshotMetadata for Unimplemented {}

/// Asserts the call reached the server and was answered by a default stub.
fn unimplemented<T: std::fmt::Debug>(result: Result<T, Status>) {
    assert_eq!(result.unwrap_err().code(), Code::Unimplemented);
}

#[tokio::test]
async fn method_constants_match_the_paths_clients_send() {
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = {
        let seen = Arc::clone(&seen);
        tower::util::MapRequestLayer::new(move |req: http::Request<tonic::body::Body>| {
            seen.lock().unwrap().push(req.uri().path().to_owned());
            req
        })
    };
    let server = UnixServer::start(|incoming, shutdown| {
        tonic::transport::Server::builder()
            .layer(record)
            .add_service(IdentityServer::new(Unimplemented))
            .add_service(ControllerServer::new(Unimplemented))
            .add_service(GroupControllerServer::new(Unimplemented))
            .add_service(SnapshotMetadataServer::new(Unimplemented))
            .add_service(NodeServer::new(Unimplemented))
            .add_service(RegistrationServer::new(Unimplemented))
            .serve_with_incoming_shutdown(incoming, shutdown)
    });
    let channel = connect(server.path.clone()).await;
    let take = || std::mem::take(&mut *seen.lock().unwrap());

    let mut identity = IdentityClient::new(channel.clone());
    unimplemented(identity.get_plugin_info(GetPluginInfoRequest {}).await);
    unimplemented(
        identity
            .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
            .await,
    );
    unimplemented(identity.probe(ProbeRequest {}).await);
    assert_eq!(take(), methods::identity::ALL);

    let mut controller = ControllerClient::new(channel.clone());
    unimplemented(
        controller
            .create_volume(CreateVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .delete_volume(DeleteVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .controller_publish_volume(ControllerPublishVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .controller_unpublish_volume(ControllerUnpublishVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .validate_volume_capabilities(ValidateVolumeCapabilitiesRequest::default())
            .await,
    );
    unimplemented(controller.list_volumes(ListVolumesRequest::default()).await);
    unimplemented(controller.get_capacity(GetCapacityRequest::default()).await);
    unimplemented(
        controller
            .controller_get_capabilities(ControllerGetCapabilitiesRequest {})
            .await,
    );
    unimplemented(
        controller
            .create_snapshot(CreateSnapshotRequest::default())
            .await,
    );
    unimplemented(
        controller
            .delete_snapshot(DeleteSnapshotRequest::default())
            .await,
    );
    unimplemented(
        controller
            .list_snapshots(ListSnapshotsRequest::default())
            .await,
    );
    unimplemented(controller.get_snapshot(GetSnapshotRequest::default()).await);
    unimplemented(
        controller
            .controller_expand_volume(ControllerExpandVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .controller_get_volume(ControllerGetVolumeRequest::default())
            .await,
    );
    unimplemented(
        controller
            .controller_modify_volume(ControllerModifyVolumeRequest::default())
            .await,
    );
    assert_eq!(take(), methods::controller::ALL);
    assert_eq!(
        methods::controller::CREATE_VOLUME,
        "/csi.v1.Controller/CreateVolume"
    );

    let mut group = GroupControllerClient::new(channel.clone());
    unimplemented(
        group
            .group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
            .await,
    );
    unimplemented(
        group
            .create_volume_group_snapshot(CreateVolumeGroupSnapshotRequest::default())
            .await,
    );
    unimplemented(
        group
            .delete_volume_group_snapshot(DeleteVolumeGroupSnapshotRequest::default())
            .await,
    );
    unimplemented(
        group
            .get_volume_group_snapshot(GetVolumeGroupSnapshotRequest::default())
            .await,
    );
    assert_eq!(take(), methods::group_controller::ALL);

    let mut metadata = SnapshotMetadataClient::new(channel.clone());
    unimplemented(
        metadata
            .get_metadata_allocated(GetMetadataAllocatedRequest::default())
            .await,
    );
    unimplemented(
        metadata
            .get_metadata_delta(GetMetadataDeltaRequest::default())
            .await,
    );
    assert_eq!(take(), methods::snapshot_metadata::ALL);

    let mut node = NodeClient::new(channel.clone());
    unimplemented(
        node.node_stage_volume(NodeStageVolumeRequest::default())
            .await,
    );
    unimplemented(
        node.node_unstage_volume(NodeUnstageVolumeRequest::default())
            .await,
    );
    unimplemented(
        node.node_publish_volume(NodePublishVolumeRequest::default())
            .await,
    );
    unimplemented(
        node.node_unpublish_volume(NodeUnpublishVolumeRequest::default())
            .await,
    );
    unimplemented(
        node.node_get_volume_stats(NodeGetVolumeStatsRequest::default())
            .await,
    );
    unimplemented(
        node.node_expand_volume(NodeExpandVolumeRequest::default())
            .await,
    );
    unimplemented(
        node.node_get_capabilities(NodeGetCapabilitiesRequest {})
            .await,
    );
    unimplemented(node.node_get_info(NodeGetInfoRequest {}).await);
    assert_eq!(take(), methods::node::ALL);
    assert_eq!(methods::node::NODE_GET_INFO, "/csi.v1.Node/NodeGetInfo");

    let mut registration = RegistrationClient::new(channel);
    unimplemented(registration.get_info(InfoRequest {}).await);
    unimplemented(
        registration
            .notify_registration_status(RegistrationStatus::default())
            .await,
    );
    assert_eq!(take(), methods::registration::ALL);
    assert_eq!(
        methods::registration::GET_INFO,
        "/pluginregistration.Registration/GetInfo"
    );

    server.stop().await;
}

#[test]
fn method_constants_cover_every_service_in_the_descriptors() {
    let pool = csi_proto::descriptor_pool().unwrap();
    let from_descriptors: Vec<String> = pool
        .services()
        .flat_map(|service| {
            service
                .methods()
                .map(|method| format!("/{}/{}", service.full_name(), method.name()))
                .collect::<Vec<_>>()
        })
        .collect();
    let constants: Vec<&str> = [
        methods::identity::ALL,
        methods::controller::ALL,
        methods::group_controller::ALL,
        methods::snapshot_metadata::ALL,
        methods::node::ALL,
        methods::registration::ALL,
    ]
    .concat();
    assert_eq!(from_descriptors, constants);
    assert_eq!(methods::identity::PROBE, "/csi.v1.Identity/Probe");
    assert_eq!(methods::identity::SERVICE, "csi.v1.Identity");
    assert_eq!(
        methods::group_controller::GROUP_CONTROLLER_GET_CAPABILITIES,
        "/csi.v1.GroupController/GroupControllerGetCapabilities"
    );
}
