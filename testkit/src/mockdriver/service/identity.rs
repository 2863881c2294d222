use std::collections::HashMap;

use csi_proto::methods::identity as m;
use csi_proto::v1;
use csi_proto::v1::plugin_capability::{self, service, volume_expansion};
use tonic::{Request, Response, Status};

use super::{Driver, MockService};

fn service_cap(kind: service::Type) -> v1::PluginCapability {
    v1::PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service {
                r#type: kind as i32,
            },
        )),
    }
}

impl Driver {
    fn get_plugin_info(
        &self,
        _: v1::GetPluginInfoRequest,
    ) -> Result<v1::GetPluginInfoResponse, Status> {
        Ok(v1::GetPluginInfoResponse {
            name: self.config.driver_name.clone(),
            vendor_version: self.config.vendor_version.clone(),
            manifest: HashMap::new(),
        })
    }

    fn get_plugin_capabilities(
        &self,
        _: v1::GetPluginCapabilitiesRequest,
    ) -> Result<v1::GetPluginCapabilitiesResponse, Status> {
        let caps = &self.config.capabilities;
        let mut capabilities = Vec::new();
        if caps.controller {
            capabilities.push(service_cap(service::Type::ControllerService));
        }
        if caps.topology {
            capabilities.push(service_cap(service::Type::VolumeAccessibilityConstraints));
        }
        if caps.group_snapshots {
            capabilities.push(service_cap(service::Type::GroupControllerService));
        }
        if caps.snapshot_metadata {
            capabilities.push(service_cap(service::Type::SnapshotMetadataService));
        }
        if caps.expand {
            capabilities.push(v1::PluginCapability {
                r#type: Some(plugin_capability::Type::VolumeExpansion(
                    plugin_capability::VolumeExpansion {
                        r#type: volume_expansion::Type::Online as i32,
                    },
                )),
            });
        }
        Ok(v1::GetPluginCapabilitiesResponse { capabilities })
    }

    fn probe(&self, _: v1::ProbeRequest) -> Result<v1::ProbeResponse, Status> {
        Ok(v1::ProbeResponse {
            ready: Some(self.faults.is_ready()),
        })
    }
}

#[tonic::async_trait]
impl v1::identity_server::Identity for MockService {
    async fn get_plugin_info(
        &self,
        request: Request<v1::GetPluginInfoRequest>,
    ) -> Result<Response<v1::GetPluginInfoResponse>, Status> {
        self.call(m::GET_PLUGIN_INFO, request, Driver::get_plugin_info)
            .await
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<v1::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<v1::GetPluginCapabilitiesResponse>, Status> {
        self.call(
            m::GET_PLUGIN_CAPABILITIES,
            request,
            Driver::get_plugin_capabilities,
        )
        .await
    }

    async fn probe(
        &self,
        request: Request<v1::ProbeRequest>,
    ) -> Result<Response<v1::ProbeResponse>, Status> {
        self.call(m::PROBE, request, Driver::probe).await
    }
}
