//! The GroupController service: group snapshots, cut together and deleted together.

use csi_proto::methods::group_controller as m;
use csi_proto::v1;
use csi_proto::v1::group_controller_service_capability::{self, rpc};
use tonic::{Request, Response, Status};

use super::controller::now;
use super::{Driver, MockService, convert, offered};

impl Driver {
    fn group_offered(&self, what: &str) -> Result<(), Status> {
        offered(self.config.capabilities.group_snapshots, what)
    }

    fn group_controller_get_capabilities(
        &self,
        _: v1::GroupControllerGetCapabilitiesRequest,
    ) -> Result<v1::GroupControllerGetCapabilitiesResponse, Status> {
        self.group_offered("the group controller service")?;
        Ok(v1::GroupControllerGetCapabilitiesResponse {
            capabilities: vec![v1::GroupControllerServiceCapability {
                r#type: Some(group_controller_service_capability::Type::Rpc(
                    group_controller_service_capability::Rpc {
                        r#type: rpc::Type::CreateDeleteGetVolumeGroupSnapshot as i32,
                    },
                )),
            }],
        })
    }

    fn create_volume_group_snapshot(
        &self,
        req: v1::CreateVolumeGroupSnapshotRequest,
    ) -> Result<v1::CreateVolumeGroupSnapshotResponse, Status> {
        self.group_offered("CreateVolumeGroupSnapshot")?;
        let (group, members) = self.store.update(|s| {
            Ok::<_, Status>(s.create_group_snapshot(&req.name, &req.source_volume_ids, now())?)
        })?;
        Ok(v1::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(convert::group_snapshot(
                &group,
                &members,
                self.config.snapshot_ready_after,
            )),
        })
    }

    fn get_volume_group_snapshot(
        &self,
        req: v1::GetVolumeGroupSnapshotRequest,
    ) -> Result<v1::GetVolumeGroupSnapshotResponse, Status> {
        self.group_offered("GetVolumeGroupSnapshot")?;
        let (group, members) = self.store.update(|s| {
            Ok::<_, Status>(s.get_group_snapshot(&req.group_snapshot_id, &req.snapshot_ids)?)
        })?;
        Ok(v1::GetVolumeGroupSnapshotResponse {
            group_snapshot: Some(convert::group_snapshot(
                &group,
                &members,
                self.config.snapshot_ready_after,
            )),
        })
    }

    fn delete_volume_group_snapshot(
        &self,
        req: v1::DeleteVolumeGroupSnapshotRequest,
    ) -> Result<v1::DeleteVolumeGroupSnapshotResponse, Status> {
        self.group_offered("DeleteVolumeGroupSnapshot")?;
        self.store.update(|s| {
            Ok::<_, Status>(s.delete_group_snapshot(&req.group_snapshot_id, &req.snapshot_ids)?)
        })?;
        Ok(v1::DeleteVolumeGroupSnapshotResponse {})
    }
}

#[tonic::async_trait]
impl v1::group_controller_server::GroupController for MockService {
    async fn group_controller_get_capabilities(
        &self,
        request: Request<v1::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<v1::GroupControllerGetCapabilitiesResponse>, Status> {
        self.call(
            m::GROUP_CONTROLLER_GET_CAPABILITIES,
            request,
            Driver::group_controller_get_capabilities,
        )
        .await
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<v1::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<v1::CreateVolumeGroupSnapshotResponse>, Status> {
        self.call(
            m::CREATE_VOLUME_GROUP_SNAPSHOT,
            request,
            Driver::create_volume_group_snapshot,
        )
        .await
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<v1::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<v1::DeleteVolumeGroupSnapshotResponse>, Status> {
        self.call(
            m::DELETE_VOLUME_GROUP_SNAPSHOT,
            request,
            Driver::delete_volume_group_snapshot,
        )
        .await
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<v1::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<v1::GetVolumeGroupSnapshotResponse>, Status> {
        self.call(
            m::GET_VOLUME_GROUP_SNAPSHOT,
            request,
            Driver::get_volume_group_snapshot,
        )
        .await
    }
}
