use std::time::SystemTime;

use csi_proto::methods::controller as m;
use csi_proto::v1;
use csi_proto::v1::controller_service_capability::{self, rpc};
use csi_proto::v1::validate_volume_capabilities_response::Confirmed;
use csi_proto::v1::{
    controller_get_volume_response, list_snapshots_response, list_volumes_response,
};
use tonic::{Request, Response, Status};

use super::convert::{self, sorted, unsorted};
use super::{Driver, MockService, offered};
use crate::mockdriver::state::{
    self, AccessType, Publication, State, Volume, VolumeRequest, check_capabilities,
};

pub(super) fn now() -> (i64, i32) {
    let since_epoch = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
        // Below 10^9, so it fits.
        i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0),
    )
}

fn published_nodes(volume: &Volume) -> Vec<String> {
    volume.published.keys().cloned().collect()
}

/// The volume's condition, as a driver with `VOLUME_CONDITION` reports it.
fn condition(volume: &Volume, offered: bool) -> Option<v1::VolumeCondition> {
    offered.then(|| {
        let condition = volume.condition.clone().unwrap_or_default();
        v1::VolumeCondition {
            abnormal: condition.abnormal,
            message: condition.message,
        }
    })
}

impl Driver {
    /// Checks the controller service and, within it, one capability.
    fn controller(&self, on: bool, what: &str) -> Result<(), Status> {
        offered(
            self.config.capabilities.controller,
            "the controller service",
        )?;
        offered(on, what)
    }

    fn create_volume(
        &self,
        req: v1::CreateVolumeRequest,
    ) -> Result<v1::CreateVolumeResponse, Status> {
        self.controller(true, "CreateVolume")?;
        let range = req.capacity_range.unwrap_or_default();
        let requirement = req.accessibility_requirements.unwrap_or_default();
        let request = VolumeRequest {
            name: req.name,
            required_bytes: range.required_bytes,
            limit_bytes: range.limit_bytes,
            capabilities: convert::capabilities(&req.volume_capabilities)?,
            parameters: sorted(req.parameters),
            mutable_parameters: sorted(req.mutable_parameters),
            content_source: convert::content_source(req.volume_content_source)?,
            requisite: convert::segments(requirement.requisite),
            preferred: convert::segments(requirement.preferred),
        };
        let volume = self
            .store
            .update(|s| Ok::<_, Status>(s.create_volume(&self.config, request)?))?;
        Ok(v1::CreateVolumeResponse {
            volume: Some(convert::volume(&volume)),
        })
    }

    fn delete_volume(
        &self,
        req: v1::DeleteVolumeRequest,
    ) -> Result<v1::DeleteVolumeResponse, Status> {
        self.controller(true, "DeleteVolume")?;
        self.store
            .update(|s| Ok::<_, Status>(s.delete_volume(&req.volume_id)?))?;
        Ok(v1::DeleteVolumeResponse {})
    }

    fn controller_publish_volume(
        &self,
        req: v1::ControllerPublishVolumeRequest,
    ) -> Result<v1::ControllerPublishVolumeResponse, Status> {
        let caps = &self.config.capabilities;
        self.controller(caps.publish_unpublish, "ControllerPublishVolume")?;
        let publication = Publication {
            readonly: req.readonly,
            capability: convert::required_capability(req.volume_capability.as_ref())?,
        };
        let context = self.store.update(|s| {
            Ok::<_, Status>(s.controller_publish(
                &self.config,
                &req.volume_id,
                &req.node_id,
                publication,
            )?)
        })?;
        Ok(v1::ControllerPublishVolumeResponse {
            publish_context: unsorted(&context),
        })
    }

    fn controller_unpublish_volume(
        &self,
        req: v1::ControllerUnpublishVolumeRequest,
    ) -> Result<v1::ControllerUnpublishVolumeResponse, Status> {
        let caps = &self.config.capabilities;
        self.controller(caps.publish_unpublish, "ControllerUnpublishVolume")?;
        self.store
            .update(|s| Ok::<_, Status>(s.controller_unpublish(&req.volume_id, &req.node_id)?))?;
        Ok(v1::ControllerUnpublishVolumeResponse {})
    }

    fn validate_volume_capabilities(
        &self,
        req: v1::ValidateVolumeCapabilitiesRequest,
    ) -> Result<v1::ValidateVolumeCapabilitiesResponse, Status> {
        self.controller(true, "ValidateVolumeCapabilities")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities are required"));
        }
        let capabilities = convert::capabilities(&req.volume_capabilities)?;
        let parameters = self
            .store
            .read(|s| s.get_volume(&req.volume_id).map(|v| v.parameters.clone()))?;
        let refusal = if let Err(rejection) = check_capabilities(&self.config, &capabilities) {
            Some(rejection.message)
        } else if !req.parameters.is_empty() && sorted(req.parameters.clone()) != parameters {
            Some("the parameters differ from the volume's".to_owned())
        } else {
            None
        };
        Ok(match refusal {
            Some(message) => v1::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => v1::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        })
    }

    fn list_volumes(&self, req: v1::ListVolumesRequest) -> Result<v1::ListVolumesResponse, Status> {
        let caps = &self.config.capabilities;
        self.controller(caps.list_volumes, "ListVolumes")?;
        let with_nodes = caps.list_volumes_published_nodes;
        let with_condition = caps.volume_condition;
        self.store.read(|s| {
            let (volumes, next_token) = s.list_volumes(req.max_entries, &req.starting_token)?;
            let entries = volumes
                .into_iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(convert::volume(v)),
                    status: (with_nodes || with_condition).then(|| {
                        list_volumes_response::VolumeStatus {
                            published_node_ids: if with_nodes {
                                published_nodes(v)
                            } else {
                                Vec::new()
                            },
                            volume_condition: condition(v, with_condition),
                        }
                    }),
                })
                .collect();
            Ok(v1::ListVolumesResponse {
                entries,
                next_token,
            })
        })
    }

    fn get_capacity(&self, req: v1::GetCapacityRequest) -> Result<v1::GetCapacityResponse, Status> {
        self.controller(self.config.capabilities.get_capacity, "GetCapacity")?;
        let segment = req.accessible_topology.map(|t| convert::sorted(t.segments));
        let available = self
            .store
            .read(|s| state::capacity_for(s, &self.config, segment.as_ref()));
        Ok(v1::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(state::maximum_volume_size(&self.config)),
            minimum_volume_size: None,
        })
    }

    fn controller_get_capabilities(
        &self,
        _: v1::ControllerGetCapabilitiesRequest,
    ) -> Result<v1::ControllerGetCapabilitiesResponse, Status> {
        self.controller(true, "ControllerGetCapabilities")?;
        let caps = &self.config.capabilities;
        let offered = [
            (true, rpc::Type::CreateDeleteVolume),
            (caps.publish_unpublish, rpc::Type::PublishUnpublishVolume),
            (caps.list_volumes, rpc::Type::ListVolumes),
            (
                caps.list_volumes && caps.list_volumes_published_nodes,
                rpc::Type::ListVolumesPublishedNodes,
            ),
            (caps.get_capacity, rpc::Type::GetCapacity),
            (caps.snapshots, rpc::Type::CreateDeleteSnapshot),
            (caps.snapshots, rpc::Type::ListSnapshots),
            (caps.snapshots, rpc::Type::GetSnapshot),
            (caps.clone, rpc::Type::CloneVolume),
            (caps.publish_readonly, rpc::Type::PublishReadonly),
            (caps.expand, rpc::Type::ExpandVolume),
            (caps.get_volume, rpc::Type::GetVolume),
            (
                caps.single_node_multi_writer,
                rpc::Type::SingleNodeMultiWriter,
            ),
            (caps.modify, rpc::Type::ModifyVolume),
            (caps.volume_condition, rpc::Type::VolumeCondition),
        ];
        let capabilities = offered
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, kind)| v1::ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc {
                        r#type: kind as i32,
                    },
                )),
            })
            .collect();
        Ok(v1::ControllerGetCapabilitiesResponse { capabilities })
    }

    fn create_snapshot(
        &self,
        req: v1::CreateSnapshotRequest,
    ) -> Result<v1::CreateSnapshotResponse, Status> {
        self.controller(self.config.capabilities.snapshots, "CreateSnapshot")?;
        let snapshot = self.store.update(|s| {
            Ok::<_, Status>(s.create_snapshot(&req.name, &req.source_volume_id, now())?)
        })?;
        Ok(v1::CreateSnapshotResponse {
            snapshot: Some(convert::snapshot(
                &snapshot,
                self.config.snapshot_ready_after,
            )),
        })
    }

    fn delete_snapshot(
        &self,
        req: v1::DeleteSnapshotRequest,
    ) -> Result<v1::DeleteSnapshotResponse, Status> {
        self.controller(self.config.capabilities.snapshots, "DeleteSnapshot")?;
        self.store
            .update(|s| Ok::<_, Status>(s.delete_snapshot(&req.snapshot_id)?))?;
        Ok(v1::DeleteSnapshotResponse {})
    }

    fn list_snapshots(
        &self,
        req: v1::ListSnapshotsRequest,
    ) -> Result<v1::ListSnapshotsResponse, Status> {
        self.controller(self.config.capabilities.snapshots, "ListSnapshots")?;
        let ready_after = self.config.snapshot_ready_after;
        self.store.update(|s| {
            // Asking for one snapshot is asking whether it is ready yet.
            if !req.snapshot_id.is_empty() {
                s.answered(&req.snapshot_id);
            }
            let (snapshots, next_token) = s.list_snapshots(
                req.max_entries,
                &req.starting_token,
                &req.snapshot_id,
                &req.source_volume_id,
            )?;
            Ok(v1::ListSnapshotsResponse {
                entries: snapshots
                    .into_iter()
                    .map(|snap| list_snapshots_response::Entry {
                        snapshot: Some(convert::snapshot(snap, ready_after)),
                    })
                    .collect(),
                next_token,
            })
        })
    }

    fn get_snapshot(&self, req: v1::GetSnapshotRequest) -> Result<v1::GetSnapshotResponse, Status> {
        self.controller(self.config.capabilities.snapshots, "GetSnapshot")?;
        let snapshot = self.store.read(|s| {
            s.get_snapshot(&req.snapshot_id)
                .map(|snap| convert::snapshot(snap, self.config.snapshot_ready_after))
        })?;
        Ok(v1::GetSnapshotResponse {
            snapshot: Some(snapshot),
        })
    }

    fn controller_expand_volume(
        &self,
        req: v1::ControllerExpandVolumeRequest,
    ) -> Result<v1::ControllerExpandVolumeResponse, Status> {
        self.controller(self.config.capabilities.expand, "ControllerExpandVolume")?;
        let range = req.capacity_range.unwrap_or_default();
        let expand = |s: &mut State| {
            let capacity_bytes = s.expand_volume(
                &self.config,
                &req.volume_id,
                range.required_bytes,
                range.limit_bytes,
            )?;
            // A filesystem on the volume has to grow on the node too.
            let node_expansion_required = s
                .get_volume(&req.volume_id)?
                .capabilities
                .iter()
                .any(|c| matches!(c.access_type, AccessType::Mount { .. }));
            Ok::<_, Status>(v1::ControllerExpandVolumeResponse {
                capacity_bytes,
                node_expansion_required,
            })
        };
        self.store.update(expand)
    }

    fn controller_get_volume(
        &self,
        req: v1::ControllerGetVolumeRequest,
    ) -> Result<v1::ControllerGetVolumeResponse, Status> {
        self.controller(self.config.capabilities.get_volume, "ControllerGetVolume")?;
        self.store.read(|s| {
            let volume = s.get_volume(&req.volume_id)?;
            Ok(v1::ControllerGetVolumeResponse {
                volume: Some(convert::volume(volume)),
                status: Some(controller_get_volume_response::VolumeStatus {
                    published_node_ids: published_nodes(volume),
                    volume_condition: condition(volume, self.config.capabilities.volume_condition),
                }),
            })
        })
    }

    fn controller_modify_volume(
        &self,
        req: v1::ControllerModifyVolumeRequest,
    ) -> Result<v1::ControllerModifyVolumeResponse, Status> {
        self.controller(self.config.capabilities.modify, "ControllerModifyVolume")?;
        self.store.update(|s| {
            Ok::<_, Status>(s.modify_volume(&req.volume_id, sorted(req.mutable_parameters))?)
        })?;
        Ok(v1::ControllerModifyVolumeResponse {})
    }
}

#[tonic::async_trait]
impl v1::controller_server::Controller for MockService {
    async fn create_volume(
        &self,
        request: Request<v1::CreateVolumeRequest>,
    ) -> Result<Response<v1::CreateVolumeResponse>, Status> {
        self.call(m::CREATE_VOLUME, request, Driver::create_volume)
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<v1::DeleteVolumeRequest>,
    ) -> Result<Response<v1::DeleteVolumeResponse>, Status> {
        self.call(m::DELETE_VOLUME, request, Driver::delete_volume)
            .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<v1::ControllerPublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerPublishVolumeResponse>, Status> {
        self.call(
            m::CONTROLLER_PUBLISH_VOLUME,
            request,
            Driver::controller_publish_volume,
        )
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<v1::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<v1::ControllerUnpublishVolumeResponse>, Status> {
        self.call(
            m::CONTROLLER_UNPUBLISH_VOLUME,
            request,
            Driver::controller_unpublish_volume,
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<v1::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<v1::ValidateVolumeCapabilitiesResponse>, Status> {
        self.call(
            m::VALIDATE_VOLUME_CAPABILITIES,
            request,
            Driver::validate_volume_capabilities,
        )
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<v1::ListVolumesRequest>,
    ) -> Result<Response<v1::ListVolumesResponse>, Status> {
        self.call(m::LIST_VOLUMES, request, Driver::list_volumes)
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<v1::GetCapacityRequest>,
    ) -> Result<Response<v1::GetCapacityResponse>, Status> {
        self.call(m::GET_CAPACITY, request, Driver::get_capacity)
            .await
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<v1::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v1::ControllerGetCapabilitiesResponse>, Status> {
        self.call(
            m::CONTROLLER_GET_CAPABILITIES,
            request,
            Driver::controller_get_capabilities,
        )
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<v1::CreateSnapshotRequest>,
    ) -> Result<Response<v1::CreateSnapshotResponse>, Status> {
        self.call(m::CREATE_SNAPSHOT, request, Driver::create_snapshot)
            .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<v1::DeleteSnapshotRequest>,
    ) -> Result<Response<v1::DeleteSnapshotResponse>, Status> {
        self.call(m::DELETE_SNAPSHOT, request, Driver::delete_snapshot)
            .await
    }

    async fn list_snapshots(
        &self,
        request: Request<v1::ListSnapshotsRequest>,
    ) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        self.call(m::LIST_SNAPSHOTS, request, Driver::list_snapshots)
            .await
    }

    async fn get_snapshot(
        &self,
        request: Request<v1::GetSnapshotRequest>,
    ) -> Result<Response<v1::GetSnapshotResponse>, Status> {
        self.call(m::GET_SNAPSHOT, request, Driver::get_snapshot)
            .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<v1::ControllerExpandVolumeRequest>,
    ) -> Result<Response<v1::ControllerExpandVolumeResponse>, Status> {
        self.call(
            m::CONTROLLER_EXPAND_VOLUME,
            request,
            Driver::controller_expand_volume,
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<v1::ControllerGetVolumeRequest>,
    ) -> Result<Response<v1::ControllerGetVolumeResponse>, Status> {
        self.call(
            m::CONTROLLER_GET_VOLUME,
            request,
            Driver::controller_get_volume,
        )
        .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<v1::ControllerModifyVolumeRequest>,
    ) -> Result<Response<v1::ControllerModifyVolumeResponse>, Status> {
        self.call(
            m::CONTROLLER_MODIFY_VOLUME,
            request,
            Driver::controller_modify_volume,
        )
        .await
    }
}
