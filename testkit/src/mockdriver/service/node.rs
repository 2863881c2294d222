use std::fs;
use std::io;
use std::path::Path;

use csi_proto::methods::node as m;
use csi_proto::v1;
use csi_proto::v1::node_service_capability::{self, rpc};
use csi_proto::v1::volume_usage::Unit;
use tonic::{Request, Response, Status};

use super::convert;
use super::{Driver, MockService, offered};
use crate::mockdriver::state::{AccessType, Publication};

/// Creates what the spec has the SP create at a target path: a directory
/// for a mounted volume, a file for a block volume. The CO creates the
/// parent; when there is none (callers that only script RPCs with made-up
/// paths), there is nowhere to create it and nothing is done.
fn create_target(path: &Path, block: bool) -> io::Result<()> {
    if !path.parent().is_some_and(Path::is_dir) {
        return Ok(());
    }
    if block {
        // An existing file is kept as it is.
        return fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map(drop);
    }
    match fs::create_dir(path) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        result => result,
    }
}

/// Removes a target path as NodeUnpublishVolume must. Only an empty
/// directory or an empty regular file can be the mock's own (it never
/// writes into them); anything else is left alone rather than deleted.
fn remove_target(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    if meta.is_dir() && fs::read_dir(path)?.next().is_none() {
        fs::remove_dir(path)
    } else if meta.is_file() && meta.len() == 0 {
        fs::remove_file(path)
    } else {
        tracing::debug!(path = %path.display(), "target path has content; left in place");
        Ok(())
    }
}

impl Driver {
    fn node_stage_volume(
        &self,
        req: v1::NodeStageVolumeRequest,
    ) -> Result<v1::NodeStageVolumeResponse, Status> {
        offered(self.config.capabilities.node_stage, "NodeStageVolume")?;
        let capability = convert::required_capability(req.volume_capability.as_ref())?;
        self.store.update(|s| {
            Ok::<_, Status>(s.node_stage(
                &self.config,
                &req.volume_id,
                &req.staging_target_path,
                capability,
            )?)
        })?;
        Ok(v1::NodeStageVolumeResponse {})
    }

    fn node_unstage_volume(
        &self,
        req: v1::NodeUnstageVolumeRequest,
    ) -> Result<v1::NodeUnstageVolumeResponse, Status> {
        offered(self.config.capabilities.node_stage, "NodeUnstageVolume")?;
        self.store.update(|s| {
            Ok::<_, Status>(s.node_unstage(&req.volume_id, &req.staging_target_path)?)
        })?;
        Ok(v1::NodeUnstageVolumeResponse {})
    }

    fn node_publish_volume(
        &self,
        req: v1::NodePublishVolumeRequest,
    ) -> Result<v1::NodePublishVolumeResponse, Status> {
        let publication = Publication {
            readonly: req.readonly,
            capability: convert::required_capability(req.volume_capability.as_ref())?,
        };
        let block = publication.capability.access_type == AccessType::Block;
        // Under the store's lock, so the path and the state change together.
        self.store.update(|s| {
            let again = s
                .get_volume(&req.volume_id)
                .is_ok_and(|v| v.node_published.contains_key(&req.target_path));
            s.node_publish(
                &self.config,
                &req.volume_id,
                &req.staging_target_path,
                &req.target_path,
                publication,
            )?;
            if let Err(err) = create_target(Path::new(&req.target_path), block) {
                // Not published after all; a retry starts over.
                if !again && let Some(volume) = s.volumes.get_mut(&req.volume_id) {
                    volume.node_published.remove(&req.target_path);
                }
                return Err(Status::internal(format!(
                    "creating target path {}: {err}",
                    req.target_path
                )));
            }
            Ok::<_, Status>(())
        })?;
        Ok(v1::NodePublishVolumeResponse {})
    }

    fn node_unpublish_volume(
        &self,
        req: v1::NodeUnpublishVolumeRequest,
    ) -> Result<v1::NodeUnpublishVolumeResponse, Status> {
        self.store.update(|s| {
            // Only a path this mock published is touched on disk.
            let published = s
                .get_volume(&req.volume_id)
                .is_ok_and(|v| v.node_published.contains_key(&req.target_path));
            if published {
                remove_target(Path::new(&req.target_path)).map_err(|err| {
                    Status::internal(format!("removing target path {}: {err}", req.target_path))
                })?;
            }
            Ok::<_, Status>(s.node_unpublish(&req.volume_id, &req.target_path)?)
        })?;
        Ok(v1::NodeUnpublishVolumeResponse {})
    }

    fn node_get_volume_stats(
        &self,
        req: v1::NodeGetVolumeStatsRequest,
    ) -> Result<v1::NodeGetVolumeStatsResponse, Status> {
        let capacity = self.store.read(|s| {
            s.node_volume(&req.volume_id, &req.volume_path)
                .map(|v| v.capacity_bytes)
        })?;
        // Nothing is ever written to a mock volume.
        Ok(v1::NodeGetVolumeStatsResponse {
            usage: vec![v1::VolumeUsage {
                available: capacity,
                total: capacity,
                used: 0,
                unit: Unit::Bytes as i32,
            }],
            volume_condition: None,
        })
    }

    fn node_expand_volume(
        &self,
        req: v1::NodeExpandVolumeRequest,
    ) -> Result<v1::NodeExpandVolumeResponse, Status> {
        offered(self.config.capabilities.expand, "NodeExpandVolume")?;
        let required = req.capacity_range.unwrap_or_default().required_bytes;
        let capacity_bytes = self
            .store
            .read(|s| s.node_expand(&req.volume_id, &req.volume_path, required))?;
        Ok(v1::NodeExpandVolumeResponse { capacity_bytes })
    }

    fn node_get_capabilities(
        &self,
        _: v1::NodeGetCapabilitiesRequest,
    ) -> Result<v1::NodeGetCapabilitiesResponse, Status> {
        let caps = &self.config.capabilities;
        let offered = [
            (caps.node_stage, rpc::Type::StageUnstageVolume),
            (true, rpc::Type::GetVolumeStats),
            (caps.expand, rpc::Type::ExpandVolume),
            (
                caps.single_node_multi_writer,
                rpc::Type::SingleNodeMultiWriter,
            ),
        ];
        let capabilities = offered
            .into_iter()
            .filter(|(on, _)| *on)
            .map(|(_, kind)| v1::NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(
                    node_service_capability::Rpc {
                        r#type: kind as i32,
                    },
                )),
            })
            .collect();
        Ok(v1::NodeGetCapabilitiesResponse { capabilities })
    }

    fn node_get_info(&self, _: v1::NodeGetInfoRequest) -> Result<v1::NodeGetInfoResponse, Status> {
        Ok(v1::NodeGetInfoResponse {
            node_id: self.config.node_id.clone(),
            max_volumes_per_node: self.config.max_volumes_per_node,
            accessible_topology: self.config.node_segment().map(convert::topology),
        })
    }
}

#[tonic::async_trait]
impl v1::node_server::Node for MockService {
    async fn node_stage_volume(
        &self,
        request: Request<v1::NodeStageVolumeRequest>,
    ) -> Result<Response<v1::NodeStageVolumeResponse>, Status> {
        self.call(m::NODE_STAGE_VOLUME, request, Driver::node_stage_volume)
            .await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<v1::NodeUnstageVolumeRequest>,
    ) -> Result<Response<v1::NodeUnstageVolumeResponse>, Status> {
        self.call(m::NODE_UNSTAGE_VOLUME, request, Driver::node_unstage_volume)
            .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<v1::NodePublishVolumeRequest>,
    ) -> Result<Response<v1::NodePublishVolumeResponse>, Status> {
        self.call(m::NODE_PUBLISH_VOLUME, request, Driver::node_publish_volume)
            .await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<v1::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<v1::NodeUnpublishVolumeResponse>, Status> {
        self.call(
            m::NODE_UNPUBLISH_VOLUME,
            request,
            Driver::node_unpublish_volume,
        )
        .await
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<v1::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<v1::NodeGetVolumeStatsResponse>, Status> {
        self.call(
            m::NODE_GET_VOLUME_STATS,
            request,
            Driver::node_get_volume_stats,
        )
        .await
    }

    async fn node_expand_volume(
        &self,
        request: Request<v1::NodeExpandVolumeRequest>,
    ) -> Result<Response<v1::NodeExpandVolumeResponse>, Status> {
        self.call(m::NODE_EXPAND_VOLUME, request, Driver::node_expand_volume)
            .await
    }

    async fn node_get_capabilities(
        &self,
        request: Request<v1::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<v1::NodeGetCapabilitiesResponse>, Status> {
        self.call(
            m::NODE_GET_CAPABILITIES,
            request,
            Driver::node_get_capabilities,
        )
        .await
    }

    async fn node_get_info(
        &self,
        request: Request<v1::NodeGetInfoRequest>,
    ) -> Result<Response<v1::NodeGetInfoResponse>, Status> {
        self.call(m::NODE_GET_INFO, request, Driver::node_get_info)
            .await
    }
}
